#!/usr/bin/env python3
"""`kittykv generate --save-state / --load-state` (issue 13).

For kitty and kitty with eager values, on a prompt longer than S + 2G tokens
(so the saved state holds key and value pages):
  - run N tokens uninterrupted; run K tokens with --save-state, then
    --load-state with N - K more: the ids are the uninterrupted run's;
  - -n 0 --save-state (prompt only), then --load-state --prompt-ids MORE:
    the ids equal one run whose prompt is PROMPT + MORE;
  - the state file is about the bytes the sequence holds (well under fp16);
  - a flipped byte, a truncated file, another --kv method: one line on
    stderr, non-zero exit, nothing generated.
Needs only the model: exit 77 (skip) without it unless KKV_REQUIRE_ORACLE is set.
"""
import argparse
import atexit
import os
import re
import shutil
import subprocess
import sys
import tempfile

N, K = 14, 6


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

    tmp = tempfile.mkdtemp(prefix="kkv_oracle_state_")
    atexit.register(shutil.rmtree, tmp, True)  # removed however the test ends

    def gen(*args):
        ids = os.path.join(tmp, "ids")
        if os.path.exists(ids):
            os.remove(ids)
        r = subprocess.run([a.kittykv, "generate", "-m", model, "-t", "2", "-c", "1024",
                            "--ids-out", ids, *args], capture_output=True, text=True)
        out = open(ids).read().strip() if os.path.exists(ids) else None
        return r, [int(x) for x in out.split(",")] if out else ([] if out is not None else None)

    prompt = [1] + [(i * 7919) % 40000 + 17 for i in range(330)]
    more = [504, 1300, 282, 9018, 30]
    pid = lambda ids: ",".join(str(x) for x in ids)
    for kv in ("kitty", "kitty:eager"):
        method = ["--kv", "kitty" if kv == "kitty" else "kitty:eager=1"]
        r, full = gen(*method, "--prompt-ids", pid(prompt), "-n", str(N))
        check(r.returncode == 0 and len(full) == N, f"{kv}: uninterrupted run of {N} tokens")
        st = os.path.join(tmp, "s.kkv")
        r1, first = gen(*method, "--prompt-ids", pid(prompt), "-n", str(K), "--save-state", st)
        r2, rest = gen(*method, "--load-state", st, "-n", str(N - K))
        check(r1.returncode == 0 and r2.returncode == 0 and first + rest == full,
              f"{kv}: {K} tokens, save, load, {N - K} more == uninterrupted "
              f"({first} + {rest} vs {full}) {r2.stderr.strip()[-200:]}")
        size = os.path.getsize(st)
        m = re.search(r"KV cache: (\d+) tokens, (\d+) bytes", r1.stderr)
        held = int(m.group(2)) if m else 0
        fp16 = int(m.group(1)) * 30 * 3 * 64 * 2 * 2 if m else 0
        check(m and held <= size <= held + 4096 + 4 * (len(prompt) + K) and size < 0.6 * fp16,
              f"{kv}: state {size} bytes, the sequence holds {held}, fp16 would be {fp16}")

        r3, _ = gen(*method, "--prompt-ids", pid(prompt), "-n", "0", "--save-state", st)
        r4, cont = gen(*method, "--load-state", st, "--prompt-ids", pid(more), "-n", "8")
        r5, ref = gen(*method, "--prompt-ids", pid(prompt + more), "-n", "8")
        if kv != "kitty":
            r6, plain = gen("--kv", "kitty", "--load-state", st, "-n", "3")
            check(r6.returncode != 0 and "another method" in r6.stderr,
                  "an eager state refused by a cache without eager values")
        check(r3.returncode == 0 and r4.returncode == 0 and cont == ref and len(ref) == 8,
              f"{kv}: prompt-only state + MORE == one run of PROMPT + MORE ({cont} vs {ref})")

        data = open(st, "rb").read()
        for what, bad in (("flipped byte", data[:500] + bytes([data[500] ^ 4]) + data[501:]),
                          ("truncated", data[:-100])):
            p = os.path.join(tmp, "bad.kkv")
            open(p, "wb").write(bad)
            r, ids = gen(*method, "--load-state", p, "-n", "3")
            lines = r.stderr.strip().splitlines()
            check(r.returncode != 0 and ids is None and len(lines) == 1 and "seq_load" in lines[0],
                  f"{kv}: {what} file refused in one line: {r.stderr.strip()!r}")
        other = ["--kv", "kitty-pro" if kv == "kitty" else "kitty-pro:eager=1"]
        r, ids = gen(*other, "--load-state", st, "-n", "3")
        check(r.returncode != 0 and "another method" in r.stderr, f"{kv}: another --kv refused")
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
