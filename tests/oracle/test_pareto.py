#!/usr/bin/env python3
"""`kittykv analyze pareto` end to end, at a tiny context (two methods):

  - --help lists its options (--kv LIST, --points, --from-eval, --json);
  - a run writes pareto.csv / pareto.json (and pareto.png when gnuplot is
    there), prints the JSON on stdout's last line with --json, and its
    numbers are kittykv eval's for the same specs and tokens (the same
    kkv_eval_run), bit for bit through --from-eval;
  - the frontier marks exactly the non-dominated kittykv points, and each
    external point names the lowest-KL kittykv method at no more bits
    (recomputed here from the CSV);
  - a bad --points file is one line naming file:line, exit 1, nothing
    written; --points on another subcommand is a usage error (exit 2).

Needs only the model: exit 77 (skip) without it unless KKV_REQUIRE_ORACLE is
set (to anything but 0).
"""
import csv
import json
import math
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

    p = run("analyze", "pareto", "--help")
    want = ["--kv LIST", "--points FILE", "--from-eval FILES", "--json", "--score-from",
            "-o, --out", "-c, --ctx-size"]
    missing = [w for w in want if w not in p.stdout]
    check(p.returncode == 0 and not missing, f"analyze pareto --help (missing {missing})")

    # 160 tokens, scoring from 64: one key page (sink 32 + 128) is quantized
    specs = "kivi-k2v2:group=32,kitty:group=32"
    common = ["-m", model, "-f", text, "--ctx", "160", "--score-from", "64", "-t", "2"]
    with tempfile.TemporaryDirectory() as tmp:
        pts = os.path.join(tmp, "points.csv")
        with open(pts, "w") as f:
            f.write("label,bits_per_element,kld_mean,kld_p99,top1,ppl\n"
                    "# another tool's points\n"
                    "low,2.0,0.5\n"
                    "mid,12.0,0.0001,0.01,0.99,20\n"
                    "high,40,1.0\n")
        out = os.path.join(tmp, "a")
        p = run("analyze", "pareto", *common, "--kv", specs, "--points", pts, "--out", out,
                "--json")
        if not check(p.returncode == 0, f"pareto run (rc {p.returncode}: "
                                        f"{p.stderr.strip()[-300:]!r})"):
            return 1
        j = json.loads(p.stdout.strip().splitlines()[-1])
        with open(os.path.join(out, "pareto.json")) as f:
            check(json.loads(f.read()) == j, "--json prints pareto.json's object")
        with open(os.path.join(out, "pareto.csv")) as f:
            rows = list(csv.DictReader(f))
        own = [r for r in rows if r["source"] == "kittykv"]
        ext = [r for r in rows if r["source"] == "external"]
        check(sorted(r["label"] for r in own) == sorted(specs.split(",")) and len(ext) == 3,
              f"CSV: one row per spec and per external point ({len(own)} + {len(ext)})")
        bits = [float(r["bits_per_element"]) for r in own]
        check(bits == sorted(bits), "CSV rows sorted by bits/element")
        for r in own:
            b, k = float(r["bits_per_element"]), float(r["kld_mean"])
            dominated = any(float(s["bits_per_element"]) <= b and float(s["kld_mean"]) <= k
                            and (float(s["bits_per_element"]) < b or float(s["kld_mean"]) < k)
                            for s in own if s is not r)
            check(r["frontier"] == ("0" if dominated else "1"),
                  f"frontier flag of {r['label']} ({b:.3f} bits, KL {k:.5f})")
        for e in j["external"]:
            cand = [q for q in j["points"] if q["bits_per_element"] <= e["bits_per_element"]]
            best = min(cand, key=lambda q: (q["kld_mean"], q["bits_per_element"]), default=None)
            got = e["best_kittykv"]
            ok = (best is None and got is None) or (
                best is not None and got is not None and got["spec"] == best["spec"]
                and e["kittykv_lower_kl"] == (best["kld_mean"] < e["kld_mean"]))
            check(ok, f"external {e['label']}: best kittykv within its bits is "
                      f"{got and got['spec']}")
        mid = [e for e in j["external"] if e["label"] == "mid"][0]
        check(mid["top1"] == 0.99 and mid["ppl"] == 20 and mid["kld_p99"] == 0.01,
              "optional columns of --points are read")
        png = os.path.join(out, "pareto.png")
        if os.path.exists(png):
            with open(png, "rb") as f:
                check(f.read(8) == b"\x89PNG\r\n\x1a\n", "pareto.png is a PNG")
        else:
            print("note: no pareto.png (gnuplot missing?)")

        # the same numbers as kittykv eval, and --from-eval reproduces the files
        e = run("eval", *common, "--chunk", "64", "--kv", specs, "--json")
        check(e.returncode == 0, f"eval ran (rc {e.returncode})")
        ej = json.loads(e.stdout.strip().splitlines()[-1])
        by = {m["name"]: m for m in ej["methods"]}
        same = all(math.isclose(by[q["spec"]]["kld_mean"], q["kld_mean"], rel_tol=1e-9)
                   and math.isclose(by[q["spec"]]["bits_per_element"], q["bits_per_element"],
                                    rel_tol=1e-9) for q in j["points"])
        check(same, "pareto's KL and bits/element equal kittykv eval's")
        saved = os.path.join(tmp, "eval.out")
        with open(saved, "w") as f:
            f.write(e.stdout)
        out2 = os.path.join(tmp, "b")
        p = run("analyze", "pareto", "--from-eval", saved, "--points", pts, "--out", out2,
                "-m", os.path.join(tmp, "no-such-model.gguf"))
        ok = p.returncode == 0
        if ok:
            for name in ("pareto.csv", "pareto.json"):
                with open(os.path.join(out, name)) as f1, open(os.path.join(out2, name)) as f2:
                    ok = ok and f1.read() == f2.read()
        check(ok, f"--from-eval (no model) writes the same CSV and JSON (rc {p.returncode})")

        # two saved runs of the same tokens join; a method in both is refused
        parts = []
        for i, m in enumerate(ej["methods"]):
            part = dict(ej, methods=[m])
            parts.append(os.path.join(tmp, f"part{i}.json"))
            with open(parts[-1], "w") as f:
                f.write(json.dumps(part) + "\n")
        out4 = os.path.join(tmp, "d")
        p = run("analyze", "pareto", "--from-eval", ",".join(parts), "--points", pts,
                "--out", out4)
        ok = p.returncode == 0
        if ok:
            with open(os.path.join(out, "pareto.csv")) as f1, \
                    open(os.path.join(out4, "pareto.csv")) as f2:
                ok = f1.read() == f2.read()
        check(ok, f"--from-eval A,B joins two runs into the same CSV (rc {p.returncode})")
        p = run("analyze", "pareto", "--from-eval", f"{saved},{parts[0]}", "--out", out4)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        check(p.returncode == 1 and len(lines) == 1 and "two runs" in lines[0],
              f"a method in two --from-eval runs is refused ({p.stderr.strip()[:160]!r})")

        # bad input: one line, nothing written
        bad = os.path.join(tmp, "bad.csv")
        with open(bad, "w") as f:
            f.write("q4_0,4.5,0.02\nq8_0,eight,0.001\n")
        out3 = os.path.join(tmp, "c")
        p = run("analyze", "pareto", "--from-eval", saved, "--points", bad, "--out", out3)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        check(p.returncode == 1 and len(lines) == 1 and "bad.csv:2" in lines[0]
              and not os.path.exists(os.path.join(out3, "pareto.csv")),
              f"bad --points: exit 1, one line naming file:line ({p.stderr.strip()[:160]!r})")
        p = run("analyze", "pareto", "--from-eval", os.path.join(tmp, "missing.json"),
                "--out", out3)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        check(p.returncode == 1 and len(lines) == 1 and "missing.json" in lines[0],
              f"missing --from-eval file: exit 1, one line ({p.stderr.strip()[:160]!r})")
        p = run("analyze", "heatmap", "--points", pts, "--out", out3)
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        check(p.returncode == 2 and len(lines) == 1 and "pareto" in lines[0],
              f"--points on analyze heatmap is a usage error ({p.stderr.strip()[:160]!r})")

    print(f"{len(failures)} failure(s)" if failures else "all pareto checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
