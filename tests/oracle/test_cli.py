#!/usr/bin/env python3
"""The kittykv CLI's one option parser (tools/kittykv/opts.c), end to end:

  - every subcommand's --help exits 0 and lists its options (generated from
    the same table that parses them), aliases included;
  - --opt=value and --opt value give the same run; aliases (--ctx for
    --ctx-size, --methods for --kv, --method for --kv) give the same run;
  - usage errors exit 2 with exactly one stderr line naming the command and
    the option: unknown option, missing value, out-of-range value, a stray
    positional argument, -t 1000, --kv fp16 --alpha 0.5 (fp16 has no alpha);
  - generate --kv kitty:alpha=0.25 runs that spec; seeded sampling (temp,
    top-k, top-p, min-p, repeat penalty) is reproducible;
  - analyze --out onto a file fails before loading anything; generate
    --ids-out into a missing folder exits 1.

Needs only the model: exit 77 (skip) without it unless KKV_REQUIRE_ORACLE is
set (to anything but 0).
"""
import json
import os
import sys
import tempfile

from cli_check import Cli, model_or_exit_code


def main():
    a = Cli()
    model, code = model_or_exit_code(a.source_dir)
    if code is not None:
        return code
    text = os.path.join(a.source_dir, "data", "handbook.txt")
    check, run, failures = a.check, a.run, a.failures

    # ---- help lists every option, from the table
    helps = {
        ("generate",): ["-m, --model", "-p, --prompt", "-f, --file", "-n, --n-predict",
                        "-c, --ctx-size", "--ctx", "-t, --threads", "-s, --seed", "--temp",
                        "--top-k", "--top-p", "--min-p", "--repeat-penalty", "--kv SPEC",
                        "--compare LIST", "--alpha", "--kv-budget", "--chat", "-h, --help"],
        ("eval",): ["-m, --model", "-f, --file", "-c, --ctx-size", "--ctx", "--score-from",
                    "--kv LIST", "--methods", "--chunk", "-t, --threads", "--json"],
        ("passkey",): ["-m, --model", "--lengths", "--depths", "--kv LIST", "--methods",
                       "--trials", "-s, --seed", "-t, --threads", "--json"],
        ("tokenize",): ["-m, --model", "-p, --prompt", "-f, --file", "--special", "--no-bos",
                        "--pieces", "--lines", "--pre", "--stats"],
        ("quantize",): ["--kv SPEC", "--method", "--head-dim", "--keys", "--values", "--alpha",
                        "--select", "-s, --seed", "--sink", "--group", "--window", "--out-keys",
                        "--out-values", "--out-pages", "--json"],
        ("bench", "attention"): ["-m, --model", "-c, --ctx-size", "--kv LIST", "--methods",
                                 "-t, --threads", "--kernel", "--reps", "--bw-mb", "--scaling",
                                 "--json"],
        ("bench", "decode"): ["-m, --model", "--depth", "--kv LIST", "-n, --n-predict", "--batch",
                              "-t, --threads", "--kernel", "--scaling", "--parts", "--json"],
        ("bench", "flush"): ["-m, --model", "--kv SPEC", "--method", "-n, --n-predict",
                             "-t, --threads", "--kernel", "--no-baseline", "--json"],
        ("bench", "serve"): ["-m, --model", "-c, --ctx-size", "--kv LIST", "--kv-budget",
                             "-n, --n-predict", "--max-batch", "-t, --threads", "--json"],
        ("serve",): ["-m, --model", "--host", "--port", "--kv SPEC", "--kv-budget",
                     "-c, --ctx-size", "-t, --threads", "--api-key", "--parallel", "--queue",
                     "--queue-timeout", "--chunk", "--body-limit", "--chat-template"],
    }
    for sub in ("heatmap", "sensitivity", "ablation", "stability", "layers"):
        helps[("analyze", sub)] = ["-m, --model", "-f, --file", "-o, --out", "-c, --ctx-size",
                                   "--ctx", "--layer", "--kv SPEC", "--method", "--score-from",
                                   "--chunk", "--alphas", "--selects", "--calib-from",
                                   "--positions", "-t, --threads"]
    for cmd, want in helps.items():
        p = run(*cmd, "--help")
        missing = [w for w in want if w not in p.stdout]
        check(p.returncode == 0 and p.stdout.startswith("usage: kittykv " + " ".join(cmd))
              and not missing, f"{' '.join(cmd)} --help lists its options (missing {missing})")

    # ---- usage errors: exit 2, one line, naming command and option
    def usage_error(args, cmd, opt, what):
        p = run(*args)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        check(p.returncode == 2 and len(lines) == 1 and f"kittykv {cmd}" in lines[0]
              and opt in lines[0] and not p.stdout,
              f"{what}: exit 2, one line naming '{cmd}' and '{opt}' "
              f"(rc {p.returncode}: {p.stderr.strip()[:160]!r})")

    g = ["generate", "-m", model, "-p", "hi"]
    for cmd in (("generate",), ("eval",), ("passkey",), ("tokenize",), ("quantize",),
                ("analyze", "heatmap"), ("bench", "decode"), ("serve",)):
        name = " ".join(cmd)
        usage_error([*cmd, "--bogus"], name, "--bogus", f"{name} --bogus")
        usage_error([*cmd, "--bogus=3"], name, "--bogus", f"{name} --bogus=3")
    usage_error([*g, "-n"], "generate", "-n", "missing value")
    usage_error([*g, "--n-predict=x"], "generate", "--n-predict", "non-numeric value")
    usage_error([*g, "-n", "-1"], "generate", "-n", "negative -n")
    usage_error([*g, "--top-k", "-1"], "generate", "--top-k", "negative --top-k")
    usage_error([*g, "--min-p", "1.5"], "generate", "--min-p", "--min-p out of range")
    usage_error([*g, "--repeat-penalty", "0.5"], "generate", "--repeat-penalty",
                "--repeat-penalty below 1")
    usage_error([*g, "--chat=yes"], "generate", "--chat", "a flag with a value")
    usage_error([*g, "stray"], "generate", "stray", "a positional argument")
    usage_error(["eval", "--ctx", "1"], "eval", "--ctx", "--ctx out of range")
    usage_error(["eval", "--kv", "kitty,,fp16"], "eval", "--kv", "empty list entry")
    for cmd in (["generate", "-p", "hi"], ["eval"], ["passkey"], ["analyze", "layers"],
                ["bench", "decode"]):
        name = " ".join(c for c in cmd if not c.startswith("-") and c != "hi")
        usage_error([*cmd, "-t", "1000"], name, "-t", f"{name} -t 1000 is refused")
        usage_error([*cmd, "--threads=0"], name, "--threads", f"{name} --threads=0 is refused")
    usage_error([*g, "--kv", "fp16", "--alpha", "0.5"], "generate", "alpha",
                "generate --kv fp16 --alpha 0.5 (fp16 has no alpha)")
    usage_error([*g, "--kv", "kitty:alpha=0.5", "--alpha", "0.25"], "generate", "alpha",
                "alpha given twice (spec and --alpha)")
    usage_error([*g, "--kv", "kitty:"], "generate", "--kv", "generate --kv kitty:")
    usage_error([*g, "--kv", "fp16:seed=3"], "generate", "--kv", "generate --kv fp16:seed=3")
    with tempfile.TemporaryDirectory() as tmp:
        keys = os.path.join(tmp, "k.raw")
        with open(keys, "wb") as f:
            f.write(b"\0" * (64 * 4 * 8))
        usage_error(["quantize", "--kv", "fp16", "--alpha", "0.5", "--head-dim", "64", "--keys",
                     keys], "quantize", "alpha", "quantize --kv fp16 --alpha 0.5")
        usage_error(["quantize", "--method", "kitty", "--seed", "3", "--head-dim", "64",
                     "--keys", keys], "quantize", "seed", "quantize --seed without select=random")
        p = run("quantize", "--kv=kitty:alpha=0.25", "--head-dim=64", "--keys", keys, "--json")
        ok = p.returncode == 0
        if ok:
            j = json.loads(p.stdout.strip().splitlines()[-1])
            ok = abs(j["alpha"] - 0.25) < 1e-6 and j["n_boost"] == 16
        check(ok, f"quantize --kv=kitty:alpha=0.25 --head-dim=64 (rc {p.returncode}, "
                  f"{p.stderr.strip()[:160]!r})")

        # ---- analyze checks its outputs before loading anything
        afile = os.path.join(tmp, "afile")
        open(afile, "w").close()
        p = run("analyze", "heatmap", "-m", os.path.join(tmp, "no-such-model.gguf"),
                "--out", afile)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        check(p.returncode == 1 and len(lines) == 1 and "not a folder" in lines[0],
              f"analyze --out onto a file fails first, in one line: {p.stderr.strip()[:160]!r}")
        p = run(*g, "-n", "2", "-t", "2", "--ids-out", os.path.join(tmp, "nodir", "ids"))
        check(p.returncode == 1 and "cannot write" in p.stderr,
              f"generate --ids-out into a missing folder exits 1 (rc {p.returncode})")

        # ---- --x=v, --x v and aliases give the same run
        def ids(*args):
            out = os.path.join(tmp, "ids.txt")
            if os.path.exists(out):
                os.remove(out)
            p = run("generate", "-m", model, "--ids-out", out, *args)
            if p.returncode != 0:
                return f"rc {p.returncode}: {p.stderr.strip()[:200]}"
            with open(out) as f:
                return f.read().strip()
        prompt = "The lighthouse keeper wrote in his log that"
        base = ids("-p", prompt, "-n", "6", "-c", "64", "--kv", "kitty", "-t", "2")
        check("," in base, f"generate -n 6 ran: {base[:80]}")
        for args, what in (
                (["--prompt=" + prompt, "--n-predict=6", "--ctx-size=64", "--kv=kitty",
                  "--threads=2"], "--x=v forms"),
                (["--prompt", prompt, "--n-predict", "6", "--ctx", "64", "--kv", "kitty",
                  "--threads", "2"], "long names and the --ctx alias"),
                (["-p" + prompt, "-n6", "-c64", "-t2"], "-xVALUE short forms, default --kv")):
            check(ids(*args) == base, f"generate with {what} = the same ids")
        spec = run("generate", "-m", model, "-p", prompt, "-n", "4", "-t", "2", "--kv",
                   "kitty:alpha=0.25")
        check(spec.returncode == 0 and "kv: kitty:alpha=0.25  alpha: 0.25" in spec.stderr,
              f"generate --kv kitty:alpha=0.25 runs that spec: {spec.stderr.strip()[-200:]!r}")
        alpha = run("generate", "-m", model, "-p", prompt, "-n", "4", "-t", "2", "--kv",
                    "kitty", "--alpha", "0.25")
        check(alpha.returncode == 0 and "alpha: 0.25" in alpha.stderr
              and alpha.stdout == spec.stdout, "--kv kitty --alpha 0.25 = --kv kitty:alpha=0.25")
        samp = ["-p", prompt, "-n", "8", "-c", "64", "-t", "2", "--temp", "0.9", "--top-k",
                "40", "--top-p", "0.9", "--min-p", "0.02", "--repeat-penalty", "1.2", "-s", "7"]
        s1, s2 = ids(*samp), ids(*samp)
        check("," in s1 and s1 == s2, f"seeded sampling is reproducible: {s1[:60]} / {s2[:60]}")
        s3 = ids(*samp[:-1], "11")
        check("," in s3, "sampling with another seed runs")

    # ---- eval: --kv LIST is --methods LIST; --x=v
    def ev(*args):
        p = run("eval", "-m", model, "-f", text, "--score-from", "64", "--chunk", "64", "-t",
                "2", "--json", *args)
        if p.returncode != 0:
            return f"rc {p.returncode}: {p.stderr.strip()[:200]}"
        j = json.loads(p.stdout.strip().splitlines()[-1])
        return [(m["name"], m["kld_mean"], m["ppl"]) for m in j["methods"]]
    e1 = ev("--ctx", "128", "--methods", "kitty:alpha=0.25")
    e2 = ev("--ctx-size=128", "--kv=kitty:alpha=0.25")
    check(isinstance(e1, list) and e1 == e2, f"eval --kv=LIST --ctx-size=N = --methods LIST "
          f"--ctx N: {e1} / {e2}")

    # ---- tokenize: long names and --x=v
    t1 = run("tokenize", "-m", model, "-p", "Hello, world")
    t2 = run("tokenize", "--model=" + model, "--prompt=Hello, world")
    check(t1.returncode == 0 and t1.stdout == t2.stdout and t1.stdout.strip(),
          "tokenize --model=M --prompt=T = -m M -p T")

    # ---- more threads than cores: runs, with a warning
    cores = os.cpu_count() or 1
    if cores < 256:
        p = run(*g, "-n", "1", "-t", str(cores + 1))
        check(p.returncode == 0 and "warning" in p.stderr,
              f"-t {cores + 1} on {cores} cores runs with a warning")

    return a.summary()


if __name__ == "__main__":
    sys.exit(main())
