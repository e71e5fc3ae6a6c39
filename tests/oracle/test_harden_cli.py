#!/usr/bin/env python3
"""CLI regressions of the hardening issue (11), each fails on the old code:

  1. quantize --keys on a .npy whose shape makes rows*cols*4 wrap: a clean
     error (exit 1, "2^64"), no crash;
  3. -m naming a FIFO: fails at once instead of blocking in open();
  4. tokenize -f /dev/zero, generate -p @/dev/zero, eval -f /dev/zero: fail
     fast with a "limit" message instead of reading until memory runs out;
  7. generate --ids-out into a missing directory: exit status 1;
 10. a directory is reported as a directory; an empty --prompt-ids has its
     own message; the model path is printed once.

The model is needed for generate/eval: exit 77 (skip) without it unless
KKV_REQUIRE_ORACLE is set (to anything but 0).
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()
    model = os.environ.get("KKV_MODEL") or os.path.join(
        a.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    have_model = os.path.exists(model)
    if not have_model and os.environ.get("KKV_REQUIRE_ORACLE", "") not in ("", "0"):
        print(f"FAIL: no model at {model} (KKV_REQUIRE_ORACLE is set)")
        return 1

    failures = []

    def check(ok, msg):
        print(("ok   " if ok else "FAIL ") + msg)
        if not ok:
            failures.append(msg)

    def run(*args, timeout=60):
        try:
            return subprocess.run([a.kittykv, *args], capture_output=True, text=True,
                                  timeout=timeout, errors="replace")
        except subprocess.TimeoutExpired:
            return None

    tmp = tempfile.mkdtemp(prefix="kkv_harden_cli_")

    # 1: the probe's .npy
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (72057594037927937, 64), }"
    pad = (64 - (10 + len(hdr) + 1) % 64) % 64
    hdr = hdr + " " * pad + "\n"
    npy = os.path.join(tmp, "x.npy")
    with open(npy, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() +
                b"\0" * 256)
    r = run("quantize", "--method", "kitty", "--head-dim", "64", "--keys", npy)
    check(r is not None and r.returncode == 1 and "2^64" in r.stderr,
          f"quantize wrapping .npy: rc {r and r.returncode}, {r and r.stderr.strip()!r}")

    # 3: a FIFO as the model
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    r = run("tokenize", "-m", fifo, "-p", "hi", timeout=20)
    check(r is not None and r.returncode == 1 and "FIFO" in r.stderr,
          f"-m FIFO: {'timed out' if r is None else repr(r.stderr.strip())}")

    # 10: a directory, the path once
    r = run("tokenize", "-m", tmp, "-p", "hi")
    check(r is not None and r.returncode == 1 and "directory" in r.stderr and
          r.stderr.count(tmp) == 1, f"-m DIR: {r and r.stderr.strip()!r}")
    missing = os.path.join(tmp, "missing.gguf")
    r = run("tokenize", "-m", missing, "-p", "hi")
    check(r is not None and r.returncode == 1 and r.stderr.count(missing) == 1 and
          "No such file" in r.stderr, f"-m missing: {r and r.stderr.strip()!r}")

    if have_model:
        # 4: unbounded text inputs (each must fail quickly, well within the timeout)
        for args in (["tokenize", "-m", model, "-f", "/dev/zero"],
                     ["generate", "-m", model, "-t", "1", "-n", "1", "-p", "@/dev/zero"],
                     ["eval", "-m", model, "-t", "1", "-f", "/dev/zero", "--ctx", "64",
                      "--score-from", "32", "--methods", "kitty"]):
            r = run(*args, timeout=120)
            check(r is not None and r.returncode != 0 and "limit" in r.stderr,
                  f"{args[0]} /dev/zero: {'timed out' if r is None else repr(r.stderr.strip())}")
        r = run("tokenize", "-m", model, "-f", tmp)
        check(r is not None and r.returncode == 1 and "directory" in r.stderr,
              f"tokenize -f DIR: {r and r.stderr.strip()!r}")

        # 7: --ids-out that cannot be written
        r = run("generate", "-m", model, "-t", "1", "-n", "2", "-p", "Hello",
                "--ids-out", os.path.join(tmp, "nonexistent", "x"))
        check(r is not None and r.returncode == 1 and "cannot write" in r.stderr,
              f"--ids-out /nonexistent: rc {r and r.returncode}")
        ids = os.path.join(tmp, "ids.txt")
        r = run("generate", "-m", model, "-t", "1", "-n", "2", "-p", "Hello", "--ids-out", ids)
        check(r is not None and r.returncode == 0 and os.path.getsize(ids) > 0,
              f"--ids-out FILE: rc {r and r.returncode}")

        # 10: an empty --prompt-ids
        r = run("generate", "-m", model, "-t", "1", "-n", "2", "--prompt-ids", "")
        check(r is not None and r.returncode == 2 and "empty" in r.stderr and
              "NULL" not in r.stderr, f"--prompt-ids '': {r and r.stderr.strip()!r}")
    else:
        print(f"note: no model at {model}: generate/eval checks skipped")

    for n in os.listdir(tmp):
        p = os.path.join(tmp, n)
        if os.path.isfile(p) or n == "fifo":
            os.unlink(p)
    os.rmdir(tmp)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
