#!/usr/bin/env python3
"""kittykv's forward pass against the numpy reference (llama_ref.py).

The reference runs in float64 with kv_fp16 (K and V rounded to fp16 on
store, as kittykv's fp16 cache does) and nothing else emulated.

  (a) the 64-token prompt's ids come from `kittykv tokenize`, and
      `generate -p TEXT` must see the same ids;
  (b) exact mode (`generate --exact-matmul --kv fp16`: fp32 activations in
      every matmul): the last prompt position's logits match the reference's
      to max |diff| <= MAX_REL_DIFF_EXACT * max |logit|, same top-1;
  (c) exact mode, 32 greedy tokens, free-running in both kittykv and the
      reference: identical ids;
  (d) default mode (`generate --kv fp16`, activations rounded to 8-bit
      blocks as users run it): the same logits within loose bounds, KL <
      MAX_KL, same top-1, max |diff| < MAX_REL_DIFF_Q8 * max |logit|.

Why the exact-mode bound is not ~1e-6: the fp16 cache rounds every K/V
element, and an fp32-ulp difference upstream moves an element across an fp16
rounding boundary now and then (a 1e-3 relative step). That is a noise floor,
not an error: perturbing the reference's embeddings by 1e-7 relative (about
one fp32 ulp) moved its own logits by 0.9e-4 .. 4.1e-4 * max|logit| over 18
random draws (median 2e-4); without the fp16 rounding the same perturbation
moves them by ~4e-8 relative. kittykv measured 1.7e-4 (max|diff| 0.0036 of
max|logit| 21.3; 2.4e-4 with KKV_CPU=scalar attention). MAX_REL_DIFF_EXACT
= 5e-4 is ~3x that, above every noise draw, and half the 1e-3 target; a
systematic error (a wrong RoPE angle, eps or mask) shows up far above it.
The greedy check is exact: the reference's smallest top-2 margin over the 32
steps is 0.0096 logits (step 16), while the 1e-7 perturbations changed that
margin by at most 0.0018, so the ids do not depend on summation order.

Why default mode cannot be tight: rounding activations to int8 blocks is a
step function; a one-ulp difference flips a rounding now and then, and within
a few layers two runs carry independent int8 noise as large as the
difference from the full-precision model (llama_ref's act_q8 switch emulates
the rounding exactly per matmul, and still ends no closer).

Exit 77 (skip) when the model or numpy/gguf is missing, unless
KKV_REQUIRE_ORACLE is set (to anything but 0).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Exactly N_PROMPT tokens with the SmolLM2 tokenizer (checked below).
PROMPT = (
    "A lighthouse keeper on a small northern island kept a careful log of every ship "
    "that passed. In winter the storms came from the west, and the lamp had to be "
    "trimmed twice a night. One cold evening in late November, a small fishing boat "
    "appeared without any lights, drifting slowly toward the black rocks, and the keeper"
)
N_PROMPT = 64
N_GEN = 32
MAX_REL_DIFF_EXACT = 5e-4  # exact mode: max |logit diff| / max |logit| (see above)
MAX_KL = 0.02              # default mode: KL(reference || kittykv)
MAX_REL_DIFF_Q8 = 0.08     # default mode: max |logit diff| / max |logit|


def skip_or_fail(msg):
    if os.environ.get("KKV_REQUIRE_ORACLE", "") not in ("", "0"):
        print(f"FAIL: {msg} (KKV_REQUIRE_ORACLE is set)")
        sys.exit(1)
    print(f"skip: {msg}")
    sys.exit(77)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print("command failed:", " ".join(cmd), "\n", p.stderr[-2000:])
        sys.exit(1)
    return p


def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def compare_logits(c_logits, r_logits):
    """(max |diff|, max |reference logit|, KL(reference || kittykv))."""
    diff = float(np.abs(c_logits - r_logits).max())
    scale = float(np.abs(r_logits).max())
    pr, pc = softmax(r_logits), softmax(c_logits)
    kl = float(np.sum(pr * (np.log(pr + 1e-300) - np.log(pc + 1e-300))))
    return diff, scale, kl


def read_ids(path):
    return [int(x) for x in open(path).read().strip().split(",") if x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", required=True)
    a = ap.parse_args()
    t_start = time.time()
    model = os.environ.get("KKV_MODEL") or os.path.join(
        a.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        skip_or_fail(f"no model at {model}")
    global np
    try:
        import numpy as np
        import llama_ref
        if llama_ref.gguf is None:
            raise ImportError("gguf")
    except ImportError as e:
        skip_or_fail(f"python package missing: {e}")

    failures = []

    def check(ok, msg):
        print(("ok   " if ok else "FAIL ") + msg)
        if not ok:
            failures.append(msg)

    # (a) token ids: the engine's tokenizer is tested against HF's elsewhere
    # (test_tokenizer.py); here it must just give the prompt it is meant to.
    p = run([a.kittykv, "tokenize", "-m", model, "-p", PROMPT])
    ids = [int(x) for x in p.stdout.split()]
    print(f"prompt: {len(ids)} tokens via kittykv tokenize")
    check(len(ids) == N_PROMPT, f"prompt is {N_PROMPT} tokens")
    if not ids:
        sys.exit(1)

    with tempfile.TemporaryDirectory() as tmp:
        def path(name):
            return os.path.join(tmp, name)
        base = [a.kittykv, "generate", "-m", model, "--kv", "fp16", "--temp", "0",
                "-n", str(N_GEN), "-t", "2"]
        prompt_ids = ["--prompt-ids", ",".join(map(str, ids))]
        # Exact mode is the slow run (scalar double dot products): it goes in
        # the background while the reference loads and decodes.
        t0 = time.time()
        exact_cmd = base + ["--exact-matmul"] + prompt_ids + [
            "--logits-out", path("lx.bin"), "--ids-out", path("ix.txt")]
        exact = subprocess.Popen(exact_cmd, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        try:
            run(base + prompt_ids + ["--logits-out", path("lq.bin"), "--ids-out",
                                     path("iq.txt")])
            run(base + ["-p", PROMPT, "--ids-out", path("iq2.txt")])
            q_logits = np.fromfile(path("lq.bin"), dtype=np.float32).astype(np.float64)
            q_gen = read_ids(path("iq.txt"))
            check(read_ids(path("iq2.txt")) == q_gen,
                  "generate -p TEXT gives the same tokens as --prompt-ids")

            t1 = time.time()
            ref = llama_ref.LlamaRef(model, kv_fp16=True)
            t_load = time.time() - t1
            print(f"reference loaded in {t_load:.1f}s (own Q4_1/Q8_0 decoders vs gguf's: "
                  f"max rel dev {ref.max_decode_dev:.1e})")
            stop = {t for t in (ref.eos, 2) if t is not None}
            t1 = time.time()
            steps = []  # [len(r_gen)][n_vocab] the logits each token was chosen from
            r_gen, r_logits = ref.greedy(ids, N_GEN, stop=stop, step_logits=steps)
            t_ref = time.time() - t1
        finally:
            _, err = exact.communicate()
        t_engine = time.time() - t0
        if exact.returncode != 0:
            print("command failed:", " ".join(exact_cmd), "\n", err[-2000:])
            sys.exit(1)
        x_logits = np.fromfile(path("lx.bin"), dtype=np.float32).astype(np.float64)
        x_gen = read_ids(path("ix.txt"))

    for label, lg in (("exact", x_logits), ("default", q_logits)):
        check(lg.shape == (ref.n_vocab,),
              f"{label}: logit count {lg.shape[0]} == n_vocab {ref.n_vocab}")
        if lg.shape != (ref.n_vocab,):
            sys.exit(1)
        check(bool(np.all(np.isfinite(lg))), f"{label}: kittykv logits are finite")

    def report(label, c_logits):
        diff, scale, kl = compare_logits(c_logits, r_logits)
        print(f"{label} mode: logits max|diff| {diff:.2e}, max|logit| {scale:.3f}, "
              f"relative {diff / scale:.2e}, KL {kl:.2e}")
        rt, ct = int(np.argmax(r_logits)), int(np.argmax(c_logits))
        check(rt == ct, f"{label}: top-1 reference {rt} == kittykv {ct}")
        return diff, scale, kl

    # (b) exact mode, prompt logits
    diff, scale, _ = report("exact", x_logits)
    check(diff <= MAX_REL_DIFF_EXACT * scale, f"exact: max|diff| {diff:.2e} <= "
          f"{MAX_REL_DIFF_EXACT} * max|logit| ({MAX_REL_DIFF_EXACT * scale:.2e})")

    # (c) exact mode, free-running greedy
    margins = [float(np.diff(np.sort(lg)[-2:])[0]) for lg in steps]
    i_min = int(np.argmin(margins))
    print(f"reference greedy: {len(r_gen)} tokens, smallest top-2 margin "
          f"{margins[i_min]:.4f} at step {i_min}")
    same = 0
    while same < min(len(r_gen), len(x_gen)) and r_gen[same] == x_gen[same]:
        same += 1
    if same < min(len(r_gen), len(x_gen)):
        lg = steps[same]
        print(f"  diverged at step {same}: reference {r_gen[same]}, kittykv {x_gen[same]}, "
              f"reference's margin {lg[r_gen[same]] - lg[x_gen[same]]:.2e}")
    print("  kittykv  :", ref.detok(x_gen).replace("\n", "\\n"))
    print("  reference:", ref.detok(r_gen).replace("\n", "\\n"))
    check(x_gen == r_gen, f"exact: {len(x_gen)} greedy ids identical to the reference's "
          f"{len(r_gen)} ({same} leading ids agree)")
    check(len(r_gen) == N_GEN or r_gen[-1] in stop, f"reference generated {len(r_gen)}")

    # (d) default mode: the loose bounds the int8 activation rounding allows
    diff, scale, kl = report("default", q_logits)
    check(kl < MAX_KL, f"default: KL {kl:.2e} < {MAX_KL}")
    check(diff < MAX_REL_DIFF_Q8 * scale, f"default: max|diff| {diff:.4f} < "
          f"{MAX_REL_DIFF_Q8} * max|logit| ({MAX_REL_DIFF_Q8 * scale:.3f})")
    lead = 0
    while lead < min(len(q_gen), len(r_gen)) and q_gen[lead] == r_gen[lead]:
        lead += 1
    print(f"default mode greedy (reported, not checked): {lead} of {len(r_gen)} leading "
          f"ids agree with the reference")

    print(f"times: engine runs {t_engine:.1f}s (exact in parallel with the reference), "
          f"reference load {t_load:.1f}s, reference greedy {t_ref:.1f}s, total "
          f"{time.time() - t_start:.1f}s")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
