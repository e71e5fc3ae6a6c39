#!/usr/bin/env python3
"""The model loader's refusals: GGUF files that parse but describe a model
kittykv must not run, each refused by `kittykv generate` with a one-line
error that names what is wrong, and nothing else printed.

Each case is one of test_archs.py's small random-weight models (written with
the `gguf` package) with one thing changed: a metadata key missing, out of
range or of the wrong type; head counts, key/value lengths or RoPE
dimensions that do not fit together; a vocabulary size that disagrees with
the embedding; a norm with a NaN; a tensor missing, of the wrong shape, of a
type the engine cannot compute with, or cut short; per-head Q/K norms where
the architecture has none, or only one of them; a RoPE frequency factor that
is not positive. A control (the unchanged model) must run, so a refusal
cannot come from a broken writer.

Exit 77 (skip) when numpy/gguf is missing, unless KKV_REQUIRE_ORACLE is set.
"""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cli_check import Cli  # noqa: E402
from test_archs import skip_or_fail, write_model  # noqa: E402


def set_meta(w, key, value=None, kind="uint32"):
    """Replaces (or, value None, deletes) a metadata key of writer w."""
    for kv in w.kv_data:
        kv.pop(key, None)
    if value is not None:
        getattr(w, "add_" + kind)(key, value)


def main():
    a = Cli()
    try:
        import numpy as np
        import gguf
        import gguf.quants  # noqa: F401
    except ImportError as e:
        skip_or_fail(f"python package missing: {e}")
    GT = gguf.GGMLQuantizationType

    check = a.check

    def run(path):
        return a.run("generate", "-m", path, "-t", "1", "-n", "1", "--prompt-ids", "1,2,3")

    def nan_at(i):
        def f(arr):
            arr = arr.copy()
            arr.flat[i] = np.nan
            return arr
        return f

    def only(target, fn):
        """edit: fn(arr) for tensor `target`, the others as written."""
        return lambda name, arr: fn(arr) if name == target else arr

    def iq4_nl(arr):  # same shape, as bytes of a type the engine has no kernel for
        rows, cols = arr.shape
        return np.zeros((rows, cols // 32 * 18), np.uint8), GT.IQ4_NL

    # (name, arch, write_model keyword arguments, words the error must contain)
    cases = [
        ("missing head count", "llama", dict(hook=lambda w: set_meta(w, "llama.attention.head_count")),
         ["missing metadata key", "llama.attention.head_count"]),
        ("zero layers", "llama", dict(hook=lambda w: set_meta(w, "llama.block_count", 0)),
         ["llama.block_count", "out of range"]),
        ("rms epsilon as an integer", "llama",
         dict(hook=lambda w: set_meta(w, "llama.attention.layer_norm_rms_epsilon", 1)),
         ["layer_norm_rms_epsilon", "not a float"]),
        ("negative rms epsilon", "llama",
         dict(hook=lambda w: set_meta(w, "llama.attention.layer_norm_rms_epsilon", -1e-6, "float32")),
         ["layer_norm_rms_epsilon", "must be positive"]),
        ("query heads not a multiple of KV heads", "llama", dict(dims=dict(NKV=3)),
         ["4 query heads", "multiple of 3"]),
        ("embedding not divisible by the heads", "llama", dict(dims=dict(NH=6)),
         ["embedding 64", "6 heads"]),
        ("value length differs from key length", "llama",
         dict(hook=lambda w: (set_meta(w, "llama.attention.key_length", 16),
                              set_meta(w, "llama.attention.value_length", 32))),
         ["value length 32", "key length"]),
        ("head dimension beyond the cache's", "llama",
         dict(hook=lambda w: (set_meta(w, "llama.attention.key_length", 512),
                              set_meta(w, "llama.attention.value_length", 512))),
         ["head dimension 512"]),
        ("odd rope dimension count", "llama", dict(hook=lambda w: set_meta(w, "llama.rope.dimension_count", 15)),
         ["odd rope dimension count 15"]),
        ("vocabulary size disagrees with the embedding", "llama",
         dict(hook=lambda w: set_meta(w, "llama.vocab_size", 999)), ["llama.vocab_size 999"]),
        ("NaN in a norm", "llama", dict(edit=only("blk.1.ffn_norm.weight", nan_at(3))),
         ["blk.1.ffn_norm.weight", "non-finite"]),
        ("missing tensor", "llama", dict(edit=lambda n, x: None if n == "blk.1.attn_v.weight" else x),
         ["missing tensor", "blk.1.attn_v.weight"]),
        ("tensor of the wrong shape", "llama",
         dict(edit=only("blk.0.attn_k.weight", lambda x: np.zeros((64, 64), np.float16))),
         ["blk.0.attn_k.weight", "shape"]),
        ("tensor of a type without kernels (IQ4_NL)", "llama",
         dict(edit=only("blk.0.attn_q.weight", iq4_nl)), ["blk.0.attn_q.weight", "cannot compute"]),
        ("per-head Q/K norms in a llama model", "llama",
         dict(hook=lambda w: [w.add_tensor(f"blk.{i}.attn_{t}_norm.weight", np.ones(16, np.float32))
                              for i in range(2) for t in "qk"]),
         ["attn_q_norm", "'llama'"]),
        ("only a K norm in a qwen3 layer", "qwen3",
         dict(edit=lambda n, x: None if n == "blk.0.attn_q_norm.weight" else x),
         ["layer 0", "only one of"]),
        ("no Q/K norms in a qwen3 model", "qwen3",
         dict(edit=lambda n, x: None if n.endswith(("attn_q_norm.weight", "attn_k_norm.weight")) else x),
         ["missing tensor", "attn_q_norm"]),
        ("a RoPE frequency factor that is not positive", "llama3",
         dict(edit=only("rope_freqs.weight", lambda x: np.where(np.arange(x.size) == 2, -1.0, x).astype(np.float32))),
         ["rope_freqs.weight[2]", "not positive"]),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        rng_seed = 11
        ctrl = os.path.join(tmp, "control.gguf")
        write_model(ctrl, "llama", np.random.default_rng(rng_seed), np, gguf)
        p = run(ctrl)
        check(p.returncode == 0, f"control: the unchanged model runs ({p.stderr.strip()[-200:]!r})")
        for name, arch, kw, words in cases:
            path = os.path.join(tmp, name.replace(" ", "_").replace("/", "_") + ".gguf")
            try:
                write_model(path, arch, np.random.default_rng(rng_seed), np, gguf, **kw)
            except Exception as e:  # a writer that cannot express the case is a test bug
                check(False, f"{name}: writing the file failed: {e!r}")
                continue
            p = run(path)
            msg = p.stderr.strip()
            ok = (p.returncode != 0 and msg.count("\n") == 0 and all(w in msg for w in words)
                  and p.stdout == "")
            check(ok, f"{name}: exit {p.returncode}, {msg!r}")
        # a file cut short: the GGUF parser's refusal, not a crash
        data = open(ctrl, "rb").read()
        for cut in (len(data) - 1, len(data) - 4096, len(data) // 2):
            short = os.path.join(tmp, f"short_{cut}.gguf")
            open(short, "wb").write(data[:cut])
            p = run(short)
            msg = p.stderr.strip()
            check(p.returncode != 0 and msg.count("\n") == 0 and msg != "",
                  f"cut to {cut} of {len(data)} bytes: exit {p.returncode}, {msg!r}")

    return a.summary()


if __name__ == "__main__":
    sys.exit(main())
