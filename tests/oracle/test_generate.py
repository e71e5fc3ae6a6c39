#!/usr/bin/env python3
"""`kittykv generate --compare`: one process, one cache per listed method.

  - --help documents --compare;
  - fp16,fp16: both continuations identical and equal to a plain
    `generate --kv fp16 --temp 0` run; the table shows full agreement,
    16 bits/element and bytes/fp16 = 1;
  - fp16,kitty on a prompt long enough for key pages (> S + G tokens): both
    sections and both table rows, kitty below 16 bits/element and below fp16's
    KV bytes, agreement counts within the token counts;
  - usage errors (exit 2): --temp > 0, --kv with --compare, an unknown method.

Needs only the model: exit 77 (skip) without it unless KKV_REQUIRE_ORACLE is
set (to anything but 0).
"""
import argparse
import os
import re
import subprocess
import sys

SENTENCE = ("A lighthouse keeper on a small northern island kept a careful log of every "
            "ship that passed, and in winter the storms came from the west. ")
N_GEN = 12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()
    model = os.environ.get("KKV_MODEL") or os.path.join(
        a.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        if os.environ.get("KKV_REQUIRE_ORACLE", "") not in ("", "0"):
            print(f"FAIL: no model at {model} (KKV_REQUIRE_ORACLE is set)")
            return 1
        print(f"skip: no model at {model}")
        return 77

    failures = []

    def check(ok, msg):
        print(("ok   " if ok else "FAIL ") + msg)
        if not ok:
            failures.append(msg)

    def gen(*args):
        return subprocess.run([a.kittykv, "generate", "-m", model, "-t", "2", *args],
                              capture_output=True, text=True)

    def sections(out):
        """{label: [continuation, ...]} and the table rows {method: [fields]}."""
        parts = re.split(r"^=== (\S+) ===\n", out, flags=re.M)
        texts = {}
        for label, body in zip(parts[1::2], parts[2::2]):
            texts.setdefault(label, []).append(body.split("\nmodel: ")[0].rstrip("\n"))
        rows = {}
        table = out[out.find("\nmethod "):] if "\nmethod " in out else ""
        for line in table.splitlines()[2:]:
            f = line.split()
            if len(f) == 9:
                rows.setdefault(f[0], []).append(f)
        return texts, rows

    h = subprocess.run([a.kittykv, "generate", "--help"], capture_output=True, text=True)
    check(h.returncode == 0 and "--compare LIST" in h.stdout, "--help documents --compare")

    # fp16 against itself, and against a plain run
    prompt = SENTENCE
    p = gen("--compare", "fp16,fp16", "-p", prompt, "-n", str(N_GEN))
    check(p.returncode == 0, f"--compare fp16,fp16 exits 0 ({p.stderr.strip()[:200]})")
    print(p.stdout)
    texts, rows = sections(p.stdout)
    check(len(texts.get("fp16", [])) == 2, "two labelled fp16 continuations")
    check(len(set(texts.get("fp16", []))) == 1, "the two fp16 continuations are identical")
    single = gen("--kv", "fp16", "--temp", "0", "-p", prompt, "-n", str(N_GEN))
    check(single.returncode == 0 and texts.get("fp16", [None])[0] == single.stdout.rstrip("\n"),
          "--compare's fp16 text equals a plain --kv fp16 run")
    fr = rows.get("fp16", [])
    check(len(fr) == 2, "table has two fp16 rows")
    for f in fr:
        n = int(re.match(r"\d+", f[1]).group(0)) + ("+eot" in f[1])
        check(f[2] == f[3] == f"{n}/{n}", f"full agreement {f[2]} {f[3]} of {n} tokens")
        check(f[5] == "16.000" and f[6] == "1.000", f"fp16 row: bits/elem {f[5]}, "
              f"bytes/fp16 {f[6]}")
        check(float(f[7]) > 0 and (n < 2 or float(f[8]) > 0), "prefill and decode rates > 0")

    # fp16 vs kitty with key pages in play (S + G = 160 tokens)
    prompt = SENTENCE * 8
    p = gen("--compare", "fp16,kitty", "-p", prompt, "-n", str(N_GEN))
    check(p.returncode == 0, f"--compare fp16,kitty exits 0 ({p.stderr.strip()[:200]})")
    print(p.stdout)
    texts, rows = sections(p.stdout)
    check(len(texts.get("fp16", [])) == 1 and len(texts.get("kitty", [])) == 1,
          "one labelled continuation per method")
    check(all(t.strip() for v in texts.values() for t in v), "continuations are not empty")
    if len(rows.get("fp16", [])) == 1 and len(rows.get("kitty", [])) == 1:
        f16, kit = rows["fp16"][0], rows["kitty"][0]
        check(int(kit[4]) < int(f16[4]), f"kitty KV bytes {kit[4]} < fp16 {f16[4]}")
        check(float(kit[5]) < 16.0, f"kitty bits/element {kit[5]} < 16")
        check(abs(float(kit[6]) - int(kit[4]) / int(f16[4])) < 0.01,
              f"kitty bytes/fp16 {kit[6]} = its bytes / fp16's (same token count)")
        lead, lt = map(int, kit[2].split("/"))
        same, st = map(int, kit[3].split("/"))
        check(lt == st and 0 <= lead <= same <= st, f"agreement {kit[2]} {kit[3]} consistent")
    else:
        check(False, "table has one fp16 row and one kitty row")

    # usage errors
    for args, what in ((["--compare", "fp16,kitty", "--temp", "0.7"], "--temp > 0"),
                       (["--compare", "fp16,kitty", "--kv", "kitty"], "--kv"),
                       (["--compare", "fp16,nosuch"], "unknown method")):
        p = gen(*args, "-p", "hi", "-n", "2")
        check(p.returncode == 2 and p.stderr.strip() and not p.stdout,
              f"{what} with --compare is a usage error: {p.stderr.strip()[:120]}")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
