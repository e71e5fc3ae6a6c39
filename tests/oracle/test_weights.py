#!/usr/bin/env python3
"""Oracle test for the weight formats: the gguf PyPI package (an independent
implementation of the ggml block layouts) against kittykv.

1. block size table of every ggml type both know;
2. dequantization of real tensors of the default model, one or more of each
   type it holds (Q8_0, Q4_1, F32), compared element by element;
3. dequantization of random blocks of every type kittykv computes with
   (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K),
   compared element by element;
4. kkv_matmul on real tensors against numpy's dequant(W) @ x, within the
   bound the Q8 activation quantization allows;
5. the same (dequantization and matmul) on a small GGUF file written here
   with one tensor of every computable type: gguf.quants.quantize where it
   can quantize the type (BF16, Q5_0, Q5_1, ...), hand-built random blocks
   for the K-quants it can only dequantize.

kittykv is driven through the test_weights executable's tool modes
(--dump/--dequant/--matmul/--sizes), found in <build>/tests/. Exits 77 (skip)
when numpy, gguf or the model is missing, unless KKV_REQUIRE_ORACLE=1.
"""
import argparse
import atexit
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77


def skip(why):
    if os.environ.get("KKV_REQUIRE_ORACLE") == "1":
        print(f"FAIL: {why} (KKV_REQUIRE_ORACLE=1)")
        sys.exit(1)
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def rand_blocks(rng, qt, nblk):
    """Random blocks of a K-quant or Q5 type: random quant/scale bytes, with
    the fp16 super-block scales set to sane values (random bytes there would
    give Inf/NaN or absurd magnitudes)."""
    import numpy as np
    from gguf import GGMLQuantizationType as GT, GGML_QUANT_SIZES

    def f16(lo, hi):
        return np.asarray(rng.uniform(lo, hi, nblk), dtype=np.float16).view(np.uint8).reshape(nblk, 2)

    bb = GGML_QUANT_SIZES[qt][1]
    raw = rng.integers(0, 256, size=(nblk, bb), dtype=np.uint8)
    if qt == GT.Q5_0:
        raw[:, 0:2] = f16(-0.1, 0.1)
    elif qt == GT.Q5_1:
        raw[:, 0:2] = f16(0, 0.05)
        raw[:, 2:4] = f16(-1, 0)
    elif qt == GT.Q2_K:
        raw[:, 80:82] = f16(0, 0.02)
        raw[:, 82:84] = f16(0, 0.02)
    elif qt == GT.Q3_K:
        raw[:, 108:110] = f16(-0.01, 0.01)
    elif qt in (GT.Q4_K, GT.Q5_K):
        raw[:, 0:2] = f16(0, 0.005)
        raw[:, 2:4] = f16(0, 0.01)
    elif qt == GT.Q6_K:
        raw[:, 208:210] = f16(-0.005, 0.005)
    else:
        raise ValueError(qt)
    return raw


def write_types_gguf(path, rng, np, gguf, quants):
    """A GGUF with one [rows][512] tensor per computable type; returns names."""
    GT = gguf.GGMLQuantizationType
    w = gguf.GGUFWriter(path, "llama")
    rows, cols = 24, 512
    names = []
    for qt in (GT.F16, GT.BF16, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0,
               GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K):
        name = f"w.{qt.name.lower()}"
        be, bb = gguf.GGML_QUANT_SIZES[qt]
        try:
            # the package's own quantizer where it has one (it raises for
            # types it can only dequantize)
            vals = rng.normal(0, 0.05, size=(rows, cols)).astype(np.float32)
            raw = quants.quantize(vals, qt)
        except NotImplementedError:
            raw = rand_blocks(rng, qt, rows * cols // be).reshape(rows, cols // be * bb)
        w.add_tensor(name, raw, raw_dtype=qt)
        names.append(name)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True, help="path of the kittykv CLI binary")
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()

    try:
        import numpy as np
        import gguf
        from gguf import quants
    except ImportError as e:  # pragma: no cover
        skip(f"python packages missing: {e}")

    model = args.model or os.path.join(args.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        skip(f"model {model} absent")
    tool = os.path.join(os.path.dirname(os.path.abspath(args.kittykv)), "tests", "test_weights")
    if not os.path.exists(tool):
        print(f"FAIL: {tool} not built")
        return 1

    failures = []

    def check(cond, msg):
        if not cond:
            failures.append(msg)
            print("FAIL:", msg)

    def run(*a):
        r = subprocess.run([tool, *a], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(a)} failed: {r.stderr.strip()}")
        return r.stdout

    tmp = tempfile.mkdtemp(prefix="kkv_oracle_w_")
    atexit.register(shutil.rmtree, tmp, True)  # removed however the test ends

    # 1. block sizes
    kkv_sizes = {}
    for line in run("--sizes").splitlines():
        tid, name, be, bb = line.split()
        kkv_sizes[int(tid)] = (int(be), int(bb))
    compared = 0
    for qt, (be, bb) in gguf.GGML_QUANT_SIZES.items():
        tid = int(qt.value)
        if tid == 9:
            # Q8_1: gguf-py still lists the old fp32 d/s layout (40 bytes);
            # ggml's block_q8_1 is fp16 d/s (36). Never stored in model files.
            continue
        if tid not in kkv_sizes:
            continue  # a type this build does not know: the reader refuses it
        check(kkv_sizes[tid] == (be, bb), f"block size of {qt.name}: kkv {kkv_sizes[tid]} gguf {(be, bb)}")
        compared += 1
    check(compared >= 30, f"only {compared} types compared")
    print(f"block sizes: {compared} types agree")

    # 2. real tensors
    reader = gguf.GGUFReader(model)
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(t.tensor_type.name, []).append(t)
    print("model tensor types:", {k: len(v) for k, v in by_type.items()})
    chosen = []
    for tname, ts in sorted(by_type.items()):
        # first, last and a middle one of each type
        picks = {0, len(ts) // 2, len(ts) - 1}
        chosen += [ts[i] for i in sorted(picks)]
    for t in chosen:
        ref = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        out = os.path.join(tmp, "dump.f32")
        run("--dump", model, t.name, out)
        got = np.fromfile(out, dtype=np.float32)
        ok = got.shape == ref.shape
        check(ok, f"{t.name}: kkv {got.shape} values, gguf {ref.shape}")
        if ok:
            diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
            tol = 1e-6 * np.abs(ref).max() + 1e-12
            exact = int((got == ref).sum())
            check(diff.max() <= tol,
                  f"{t.name} ({t.tensor_type.name}): max |diff| {diff.max():.3g} > {tol:.3g}")
            print(f"dequant {t.name:28s} {t.tensor_type.name:5s} {got.size:9d} values, "
                  f"max |diff| {diff.max():.3g}, bit-exact {exact}/{got.size}")

    # 3. random blocks of every computable type
    rng = np.random.default_rng(1234)
    GT = gguf.GGMLQuantizationType

    def f16_bytes(vals):
        return np.asarray(vals, dtype=np.float16).view(np.uint8).reshape(len(vals), 2)

    nblk = 64
    cases = {}
    raw = rng.integers(0, 256, size=(nblk, 18), dtype=np.uint8)
    raw[:, 0:2] = f16_bytes(rng.uniform(-0.1, 0.1, nblk))
    cases[GT.Q4_0] = raw
    raw = rng.integers(0, 256, size=(nblk, 20), dtype=np.uint8)
    raw[:, 0:2] = f16_bytes(rng.uniform(0, 0.1, nblk))
    raw[:, 2:4] = f16_bytes(rng.uniform(-1, 0, nblk))
    cases[GT.Q4_1] = raw
    raw = rng.integers(0, 256, size=(nblk, 34), dtype=np.uint8)
    raw[:, 0:2] = f16_bytes(rng.uniform(-0.1, 0.1, nblk))
    cases[GT.Q8_0] = raw
    raw = rng.integers(0, 256, size=(nblk, 210), dtype=np.uint8)
    raw[:, 208:210] = f16_bytes(rng.uniform(-0.01, 0.01, nblk))
    cases[GT.Q6_K] = raw
    cases[GT.F16] = f16_bytes(rng.normal(0, 1, 256)).reshape(1, -1)
    cases[GT.BF16] = quants.quantize(rng.normal(0, 1, 256).astype(np.float32), GT.BF16).reshape(1, -1)
    for qt in (GT.Q5_0, GT.Q5_1, GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K):
        cases[qt] = rand_blocks(rng, qt, nblk)
    for qt, raw in cases.items():
        inp, out = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.f32")
        raw.tofile(inp)
        run("--dequant", str(int(qt.value)), inp, out)
        got = np.fromfile(out, dtype=np.float32)
        ref = quants.dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
        ok = got.shape == ref.shape
        check(ok, f"random {qt.name}: shapes {got.shape} vs {ref.shape}")
        if ok:
            diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
            tol = 1e-6 * np.abs(ref).max() + 1e-12
            check(diff.max() <= tol, f"random {qt.name}: max |diff| {diff.max():.3g} > {tol:.3g}")
            print(f"dequant random {qt.name:5s} {got.size:6d} values, max |diff| {diff.max():.3g}, "
                  f"bit-exact {int((got == ref).sum())}/{got.size}")

    # 4. matmul against numpy, within the activation quantization bound;
    # 5. a small GGUF holding one tensor of each computable type
    small = os.path.join(tmp, "types.gguf")
    small_names = write_types_gguf(small, rng, np, gguf, quants)
    small_reader = gguf.GGUFReader(small)
    for t in small_reader.tensors:
        ref = quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        out = os.path.join(tmp, "dump.f32")
        run("--dump", small, t.name, out)
        got = np.fromfile(out, dtype=np.float32)
        ok = got.shape == ref.shape
        check(ok, f"{t.name}: kkv {got.shape} values, gguf {ref.shape}")
        if ok:
            exact = int((got.view(np.uint32) == ref.view(np.uint32)).sum())
            check(exact == got.size, f"{t.name} ({t.tensor_type.name}): {got.size - exact} values not bit-exact")
            print(f"dequant {t.name:28s} {t.tensor_type.name:5s} {got.size:9d} values, "
                  f"bit-exact {exact}/{got.size}")
    jobs = [(model, reader, n) for n in ["blk.0.attn_q.weight", "blk.0.ffn_down.weight", "token_embd.weight"]]
    jobs += [(small, small_reader, n) for n in small_names]
    for path, rdr, name in jobs:
        t = next((t for t in rdr.tensors if t.name == name), None)
        if t is None:
            continue
        W = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        W = W.reshape(-1, int(t.shape[0]))  # [rows][cols]
        rows, cols = W.shape
        n = 3
        x = rng.normal(0, 1, size=(n, cols)).astype(np.float32)
        x[1, 5] = 30.0  # an outlier block
        xp, op = os.path.join(tmp, "x.f32"), os.path.join(tmp, "o.f32")
        x.tofile(xp)
        run("--matmul", path, name, xp, str(n), op)
        got = np.fromfile(op, dtype=np.float32).reshape(n, rows).astype(np.float64)
        ref = x.astype(np.float64) @ W.T
        # |error| <= sum over 32-blocks of (d_x / 2) * sum|w| (rounding of x to
        # Q8) plus fp32 accumulation error
        xb = np.abs(x.astype(np.float64)).reshape(n, cols // 32, 32)
        dx = xb.max(axis=2) / 127.0  # [n][blocks]
        wabs = np.abs(W).reshape(rows, cols // 32, 32).sum(axis=2)  # [rows][blocks]
        bound = (dx / 2) @ wabs.T * 1.01 + 1e-5 * (np.abs(x.astype(np.float64)) @ np.abs(W).T) + 1e-6
        err = np.abs(got - ref)
        worst = float((err / bound).max())
        check(worst <= 1.0, f"matmul {name}: error exceeds the quantization bound (ratio {worst:.3f})")
        rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        check(rel < 0.02, f"matmul {name}: relative error {rel:.3g}")
        print(f"matmul {name:24s} {t.tensor_type.name:5s} {rows}x{cols} n={n}: rel err {rel:.2e}, "
              f"worst err/bound {worst:.3f}")

    if failures:
        print(f"{len(failures)} failure(s)")
        return 1
    print("oracle test_weights: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
