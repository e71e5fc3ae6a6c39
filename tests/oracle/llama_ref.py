#!/usr/bin/env python3
"""Reference Llama forward pass in numpy, reading the same GGUF as kittykv.

Independent of the C code: weights come from the `gguf` package
(GGUFReader + gguf.quants.dequantize), attention is plain full-precision
softmax over an unquantized numpy KV cache. Weights are dequantized once to
float32; matmuls run in float32, norms, RoPE angles, attention and softmax in
float64.

RoPE is the "normal" (GPT-J style) pairing: llama.cpp's converter permutes the
Q/K rows of Llama checkpoints so that dims (2i, 2i+1) form a rotation pair
with angle pos * base^(-2i/rope_dims).

Usage as a script (sanity check that the model talks):
    llama_ref.py MODEL.gguf --chat "What is the capital of France?" -n 40
    llama_ref.py MODEL.gguf --ids 1,2,3 -n 8
"""
import argparse
import sys
import time

import numpy as np

try:
    import gguf
    from gguf import quants as gguf_quants
except ImportError:  # the caller decides whether a missing package is a skip
    gguf = None


CHATML = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
          "Hugging Face<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n"
          "<|im_start|>assistant\n")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    if f.types and f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0] for i in f.data]
    return f.parts[f.data[0]][0]


class LlamaRef:
    """A Llama model held as float32 numpy arrays, with a simple KV cache."""

    def __init__(self, path, act_q8=False):
        """act_q8: round matmul inputs to int8 blocks of 32 (scale amax/127,
        round half to even) before multiplying by a quantized weight, as
        llama.cpp-style integer dot kernels do; False keeps them exact."""
        self.act_q8 = act_q8
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch != "llama":
            raise ValueError(f"unsupported architecture {arch!r}")
        p = "llama."
        self.n_layers = int(_field(r, p + "block_count"))
        self.n_embd = int(_field(r, p + "embedding_length"))
        self.n_ff = int(_field(r, p + "feed_forward_length"))
        self.n_heads = int(_field(r, p + "attention.head_count"))
        self.n_kv = int(_field(r, p + "attention.head_count_kv", self.n_heads))
        self.base = float(_field(r, p + "rope.freq_base", 10000.0))
        self.eps = float(_field(r, p + "attention.layer_norm_rms_epsilon"))
        self.head_dim = int(_field(r, p + "attention.key_length", self.n_embd // self.n_heads))
        self.rope_dims = int(_field(r, p + "rope.dimension_count", self.head_dim))
        self.eos = _field(r, "tokenizer.ggml.eos_token_id")
        self.tokens = _field(r, "tokenizer.ggml.tokens")
        self.merges = _field(r, "tokenizer.ggml.merges")

        t = {}
        self._quantized = set()  # ids of weight arrays stored in block formats
        plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        for ten in r.tensors:
            w = gguf_quants.dequantize(ten.data, ten.tensor_type).astype(np.float32)
            # numpy order: [ne[1]][ne[0]] = [rows (out)][cols (in)]
            shape = [int(x) for x in reversed(ten.shape.tolist())]
            t[ten.name] = w.reshape(shape)
            if ten.tensor_type not in plain:
                self._quantized.add(id(t[ten.name]))
        self.embd = t["token_embd.weight"]  # [vocab][n_embd]
        self.out = t.get("output.weight", self.embd)
        self.out_norm = t["output_norm.weight"].astype(np.float64)
        self.layers = []
        for i in range(self.n_layers):
            g = lambda n: t[f"blk.{i}.{n}.weight"]  # noqa: E731
            self.layers.append(dict(
                attn_norm=g("attn_norm").astype(np.float64), wq=g("attn_q"), wk=g("attn_k"),
                wv=g("attn_v"), wo=g("attn_output"), ffn_norm=g("ffn_norm").astype(np.float64),
                gate=g("ffn_gate"), up=g("ffn_up"), down=g("ffn_down")))
        self.n_vocab = self.embd.shape[0]
        half = self.rope_dims // 2
        self.inv_freq = self.base ** (-2.0 * np.arange(half, dtype=np.float64) / self.rope_dims)
        self.reset()

    def reset(self):
        """Empties the KV cache: k[l], v[l] are [T][n_kv][head_dim] float64."""
        self.k = [np.zeros((0, self.n_kv, self.head_dim)) for _ in range(self.n_layers)]
        self.v = [np.zeros((0, self.n_kv, self.head_dim)) for _ in range(self.n_layers)]

    @property
    def pos(self):
        return self.k[0].shape[0]

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _mm(self, x, w):
        if self.act_q8 and id(w) in self._quantized:
            xb = x.astype(np.float32).reshape(x.shape[0], -1, 32)
            d = np.abs(xb).max(axis=2, keepdims=True) / np.float32(127.0)
            inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), 0).astype(np.float32)
            q = np.clip(np.rint(xb * inv), -127, 127)
            x = (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)
            return x @ w.T.astype(np.float64)
        return (x.astype(np.float32) @ w.T).astype(np.float64)

    def _rope(self, x, pos):
        """x: [n][heads][head_dim], pos: [n]; rotates pairs (2i, 2i+1) in place."""
        half = self.rope_dims // 2
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # [n][half]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        a = x[..., 0:2 * half:2].copy()
        b = x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2] = a * c - b * s
        x[..., 1:2 * half:2] = a * s + b * c
        return x

    def forward(self, ids):
        """Appends ids to the cache; returns logits [n][n_vocab] (float64)."""
        ids = np.asarray(ids, dtype=np.int64)
        n, p0 = len(ids), self.pos
        pos = np.arange(p0, p0 + n)
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        grp = nh // nkv
        x = self.embd[ids].astype(np.float64)  # [n][n_embd]
        # causal mask over [n][p0 + n]
        mask = np.arange(p0 + n)[None, :] > pos[:, None]
        for li, L in enumerate(self.layers):
            xn = self._rms(x, L["attn_norm"])
            q = self._rope(self._mm(xn, L["wq"]).reshape(n, nh, hd), pos)
            k = self._rope(self._mm(xn, L["wk"]).reshape(n, nkv, hd), pos)
            v = self._mm(xn, L["wv"]).reshape(n, nkv, hd)
            self.k[li] = np.concatenate([self.k[li], k])
            self.v[li] = np.concatenate([self.v[li], v])
            K, V = self.k[li], self.v[li]  # [T][nkv][hd]
            att = np.empty((n, nh, hd))
            for h in range(nh):
                kv = h // grp
                sc = q[:, h, :] @ K[:, kv, :].T / np.sqrt(hd)  # [n][T]
                sc[mask] = -np.inf
                sc -= sc.max(axis=1, keepdims=True)
                pr = np.exp(sc)
                pr /= pr.sum(axis=1, keepdims=True)
                att[:, h, :] = pr @ V[:, kv, :]
            x = x + self._mm(att.reshape(n, nh * hd), L["wo"])
            xn = self._rms(x, L["ffn_norm"])
            g = self._mm(xn, L["gate"])
            u = self._mm(xn, L["up"])
            x = x + self._mm(g / (1.0 + np.exp(-g)) * u, L["down"])
        return self._mm(self._rms(x, self.out_norm), self.out)

    def greedy(self, prompt_ids, n_new, stop=()):
        """Prefills prompt_ids, then greedily decodes n_new tokens.
        Returns (generated ids, logits of the last prompt position)."""
        logits = self.forward(prompt_ids)
        last = logits[-1]
        out = []
        nxt = int(np.argmax(last))
        for _ in range(n_new):
            out.append(nxt)
            if nxt in stop:
                break
            if len(out) == n_new:
                break
            nxt = int(np.argmax(self.forward([nxt])[-1]))
        return out, last

    # ---- text helpers (only for the standalone sanity check)
    def detok(self, ids):
        """GPT-2 byte-level decoding of token strings."""
        bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + \
            list(range(0xAE, 0x100))
        cs = bs[:]
        n = 0
        for b in range(256):
            if b not in bs:
                bs.append(b)
                cs.append(256 + n)
                n += 1
        inv = {chr(c): b for b, c in zip(bs, cs)}
        out = bytearray()
        for i in ids:
            s = self.tokens[i]
            if s.startswith("<|") and s.endswith("|>"):
                out += s.encode()
            else:
                out += bytes(inv.get(ch, ord("?")) for ch in s)
        return out.decode("utf-8", errors="replace")

    def hf_tokenizer(self):
        """A `tokenizers` BPE built from the GGUF vocabulary (digits split,
        byte-level), good enough to encode a test prompt by hand."""
        from tokenizers import Tokenizer, models, pre_tokenizers, decoders
        vocab = {s: i for i, s in enumerate(self.tokens)}
        merges = [tuple(m.split(" ", 1)) for m in self.merges]
        tk = Tokenizer(models.BPE(vocab, merges))
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        tk.decoder = decoders.ByteLevel()
        tk.add_special_tokens([s for s in self.tokens[:17] if s.startswith("<")])
        return tk


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--ids", help="comma-separated prompt token ids")
    g.add_argument("--chat", help="prompt text, wrapped in ChatML")
    g.add_argument("--text", help="raw prompt text")
    ap.add_argument("-n", type=int, default=32)
    a = ap.parse_args()
    if gguf is None:
        sys.exit("llama_ref.py: the gguf package is missing")
    t0 = time.time()
    m = LlamaRef(a.model)
    print(f"loaded in {time.time() - t0:.1f}s", file=sys.stderr)
    if a.ids:
        ids = [int(x) for x in a.ids.split(",")]
    else:
        text = CHATML.format(prompt=a.chat) if a.chat else a.text
        ids = m.hf_tokenizer().encode(text).ids
    t0 = time.time()
    stop = {m.eos, 2}
    out, _ = m.greedy(ids, a.n, stop=stop)
    print(f"{len(ids)} prompt + {len(out)} generated in {time.time() - t0:.1f}s",
          file=sys.stderr)
    print("ids:", ",".join(map(str, out)), file=sys.stderr)
    print(m.detok(out))


if __name__ == "__main__":
    main()
