"""The preamble the CLI oracle scripts share: their two arguments, the model
(or the skip/fail rule without it), a check() that records failures and a
run() of the kittykv binary, and summary() for the exit code."""
import argparse
import os
import subprocess


def model_or_exit_code(source_dir):
    """(model path, None) if the model is there, else (path, exit code): 77
    (skip), or 1 when KKV_REQUIRE_ORACLE is set to anything but 0."""
    model = os.environ.get("KKV_MODEL") or os.path.join(
        source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.exists(model):
        return model, None
    if os.environ.get("KKV_REQUIRE_ORACLE", "") not in ("", "0"):
        print(f"FAIL: no model at {model} (KKV_REQUIRE_ORACLE is set)")
        return model, 1
    print(f"skip: no model at {model}")
    return model, 77


class Cli:
    """Parses --kittykv/--source-dir; check(ok, msg) prints and records,
    run(*args) runs the binary with captured text output."""

    def __init__(self):
        ap = argparse.ArgumentParser()
        ap.add_argument("--kittykv", required=True)
        ap.add_argument("--source-dir", required=True)
        a = ap.parse_args()
        self.kittykv, self.source_dir = a.kittykv, a.source_dir
        self.failures = []

    def check(self, ok, msg):
        print(("ok   " if ok else "FAIL ") + msg)
        if not ok:
            self.failures.append(msg)
        return ok

    def run(self, *args):
        return subprocess.run([self.kittykv, *args], capture_output=True, text=True,
                              errors="replace")

    def summary(self):
        """Prints the outcome; the exit code (1 if any check failed)."""
        if self.failures:
            print(f"{len(self.failures)} check(s) failed")
            return 1
        print("all checks passed")
        return 0
