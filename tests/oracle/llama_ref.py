#!/usr/bin/env python3
"""Reference Llama forward pass in numpy, reading the same GGUF as kittykv.

Independent of the C code: tensors come from the `gguf` package (GGUFReader;
Q4_1 and Q8_0 blocks are decoded here exactly in float64 and cross-checked
against gguf.quants.dequantize, other types use gguf's decoder), attention is
plain softmax over a numpy KV cache. Weights are dequantized once to float64
and everything runs in float64.

Two switches make the reference compute what kittykv computes where that is a
defined format choice, not an accident of arithmetic (both off = the model's
full-precision forward pass):
  act_q8   each matmul input row is first quantized to int8 blocks of 32, as
           kittykv's kkv_q8x_quantize does before its integer dot products:
           in float32, d = max|x| / 127, inv = 1 / d (0 when d = 0),
           q = round-half-even(x * inv) clamped to [-127, 127]; the matmul then
           sees d * q. (The engine also folds Q4_1's offset as m * (d * sum q),
           the same value.) Only weights stored in block formats get this;
           F32/F16 weights see the exact input.
  kv_fp16  K (after RoPE) and V are stored rounded to fp16 (via float32, round
           to nearest even) and widened back exactly on read, as in kittykv's
           fp16 cache; the query and all attention arithmetic stay wide.
What remains between the two is fp32 summation order in the engine. With
kv_fp16 that difference is not ~1e-7 at the logits: an fp32-ulp change of a K
or V element moves it across an fp16 rounding boundary now and then (a 1e-3
relative step), so two runs that differ only in summation order end ~1e-4 *
max|logit| apart (test_forward.py measures and bounds this).
kittykv's exact mode (kkv_model_set_exact_matmul) has no activation rounding:
compare it with act_q8 off.

RoPE is the "normal" (GPT-J style) pairing for llama: llama.cpp's converter
permutes the Q/K rows of Llama checkpoints so that dims (2i, 2i+1) form a
rotation pair with angle pos * base^(-2i/rope_dims). qwen2 and qwen3 use the
NeoX pairing (i, i + rope_dims/2), as llama.cpp's llama_model_rope_type says.
Rope scaling: a rope_freqs.weight tensor (Llama 3: pair i's angle divided by
factor i) and/or {arch}.rope.scaling.type = linear (angle / factor).

Architectures: llama; qwen2 (adds blk.N.attn_{q,k,v}.bias after the
projections); qwen3 (blk.N.attn_{q,k}_norm.weight: RMSNorm of each head of Q
and K, eps as the block norms, before RoPE); gemma3, written from the Gemma 3
paper / HF modelling description rather than from any engine:
  - token embeddings times sqrt(n_embd); output tied to them;
  - QK-norm as qwen3, NeoX RoPE; RoPE base gemma3.rope.freq_base (1e6) on
    global layers and gemma3.rope.freq_base_swa (default 1e4, Gemma's
    rope_local_base_freq) on local ones;
  - local ("sliding") layers: every layer but each 6th (l % 6 != 5); a query
    at position i sees keys j with i - W < j <= i, W = attention.sliding_window;
  - attention scale 1/sqrt(query_pre_attn_scalar) = 1/sqrt(head_dim);
  - x += rmsnorm(attn(rmsnorm(x) * attn_norm)) * post_attention_norm, then
    x += rmsnorm(ffn(rmsnorm(x) * ffn_norm)) * post_ffw_norm, with
    ffn(h) = down(gelu_tanh(gate h) * up h);
  - the GGUF norm weights already hold Gemma's (1 + w): llama.cpp's converter
    adds the 1, so they are used as they are (checked: with the 1 added again
    the model no longer continues text sensibly).
The window can be overridden (window=) to exercise it at a short context.

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


def _f16(b):
    """[n][2] uint8 little-endian fp16 -> [n][1] float64 (exact)."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float64)


def dequantize64(data, ttype):
    """Exact float64 values of a tensor's blocks (flat), or None when this
    module has no decoder of its own for the type."""
    Q = gguf.GGMLQuantizationType
    if ttype == Q.Q4_1:  # 20 bytes: d fp16, m fp16, 16 bytes of nibbles
        b = np.asarray(data, dtype=np.uint8).reshape(-1, 20)
        qs = b[:, 4:]
        q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float64)  # [nb][32]
        return (_f16(b[:, 0:2]) * q + _f16(b[:, 2:4])).reshape(-1)
    if ttype == Q.Q8_0:  # 34 bytes: d fp16, 32 int8
        b = np.asarray(data, dtype=np.uint8).reshape(-1, 34)
        q = np.ascontiguousarray(b[:, 2:]).view(np.int8).astype(np.float64)
        return (_f16(b[:, 0:2]) * q).reshape(-1)
    return None


def quantize_q8(x):
    """x [n][cols] -> float64 d * q, the activation rounding of kittykv's
    kkv_q8x_quantize (see the module docstring). cols % 32 == 0."""
    xb = np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1, 32)
    d = np.abs(xb).max(axis=2, keepdims=True) / np.float32(127.0)  # float32
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv), -127, 127)  # float32 product, ties to even
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def round_fp16(x):
    """The fp16 cache's storage rounding: float32 first (the engine's K/V are
    float32), then nearest-even fp16, widened back exactly."""
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float64)


class LlamaRef:
    """A Llama model held as float64 numpy arrays, with a simple KV cache."""

    def __init__(self, path, act_q8=False, kv_fp16=False, window=None):
        """act_q8, kv_fp16: emulate kittykv's activation and fp16-cache
        rounding (module docstring); may be changed between resets.
        window: gemma3's sliding window instead of the file's."""
        self.act_q8 = act_q8
        self.kv_fp16 = kv_fp16
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch not in ("llama", "qwen2", "qwen3", "gemma3"):
            raise ValueError(f"unsupported architecture {arch!r}")
        self.arch = arch
        self.gemma = arch == "gemma3"
        self.neox = arch in ("qwen2", "qwen3", "gemma3")
        p = arch + "."
        self.n_layers = int(_field(r, p + "block_count"))
        self.n_embd = int(_field(r, p + "embedding_length"))
        self.n_ff = int(_field(r, p + "feed_forward_length"))
        self.n_heads = int(_field(r, p + "attention.head_count"))
        self.n_kv = int(_field(r, p + "attention.head_count_kv", self.n_heads))
        self.base = float(_field(r, p + "rope.freq_base", 10000.0))
        self.eps = float(_field(r, p + "attention.layer_norm_rms_epsilon"))
        self.head_dim = int(_field(r, p + "attention.key_length", self.n_embd // self.n_heads))
        self.rope_dims = int(_field(r, p + "rope.dimension_count", self.head_dim))
        stype = _field(r, p + "rope.scaling.type", "none")
        if stype not in ("none", "linear"):
            raise ValueError(f"rope scaling {stype!r}")
        self.rope_linear = float(_field(r, p + "rope.scaling.factor", 1.0)) if stype == "linear" else 1.0
        self.base_swa = float(_field(r, p + "rope.freq_base_swa", 10000.0))
        self.window = int(window or _field(r, p + "attention.sliding_window", 0) or 0)
        self.eos = _field(r, "tokenizer.ggml.eos_token_id")
        # the vocabulary is read when first used (text helpers only): Gemma's
        # 262144 strings take a minute of Python on a busy machine
        self._reader = r

        t = {}
        qnames = set()  # tensors stored in block formats
        # ids of the (long-lived) matmul operands whose weights are block formats
        self._quantized = set()
        plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        self.max_decode_dev = 0.0  # max |own decoder - gguf's| / max|w| seen
        for ten in r.tensors:
            w = dequantize64(ten.data, ten.tensor_type)
            if w is None:
                w = gguf_quants.dequantize(ten.data, ten.tensor_type).astype(np.float64)
            elif ten.name in ("token_embd.weight", "blk.0.attn_q.weight"):
                # gguf rounds d*q+m to float32: agree to that, or a decoder is wrong
                g = gguf_quants.dequantize(ten.data, ten.tensor_type).reshape(-1)
                dev = float(np.abs(w - g).max() / max(np.abs(w).max(), 1e-30))
                self.max_decode_dev = max(self.max_decode_dev, dev)
                if dev > 1e-6:
                    raise ValueError(f"{ten.name}: own decoder differs from gguf's by {dev}")
            # numpy order: [ne[1]][ne[0]] = [rows (out)][cols (in)]
            shape = [int(x) for x in reversed(ten.shape.tolist())]
            t[ten.name] = w.reshape(shape)
            if ten.tensor_type not in plain:
                qnames.add(ten.name)
        self.embd = t["token_embd.weight"]  # [vocab][n_embd]
        out_name = "output.weight" if "output.weight" in t else "token_embd.weight"
        if out_name == "token_embd.weight" and self.gemma:
            # a view, not a copy: Gemma's 262144-token table is 1.3 GB in float64
            self.out_t = self.embd.T
            if out_name in qnames:
                self._quantized.add(id(self.out_t))
        else:
            self.out_t = self._transposed(t[out_name], out_name in qnames)  # [n_embd][vocab]
        self.out_norm = t["output_norm.weight"]
        self.layers = []
        for i in range(self.n_layers):
            g = lambda n: t[f"blk.{i}.{n}.weight"]  # noqa: E731
            # matmul weights kept transposed, [in][out], so x @ w needs no copy
            tr = lambda n: self._transposed(t[f"blk.{i}.{n}.weight"],  # noqa: E731
                                            f"blk.{i}.{n}.weight" in qnames)
            opt = lambda n: t.get(f"blk.{i}.{n}")  # noqa: E731
            self.layers.append(dict(
                attn_norm=g("attn_norm"), wq=tr("attn_q"), wk=tr("attn_k"),
                wv=tr("attn_v"), wo=tr("attn_output"), ffn_norm=g("ffn_norm"),
                gate=tr("ffn_gate"), up=tr("ffn_up"), down=tr("ffn_down"),
                bq=opt("attn_q.bias"), bk=opt("attn_k.bias"), bv=opt("attn_v.bias"),
                q_norm=opt("attn_q_norm.weight"), k_norm=opt("attn_k_norm.weight"),
                post_attn_norm=opt("post_attention_norm.weight"),
                post_ffn_norm=opt("post_ffw_norm.weight"),
                local=self.gemma and i % 6 != 5))
        rope_ff = t.get("rope_freqs.weight")
        del t
        self.n_vocab = self.embd.shape[0]
        half = self.rope_dims // 2
        self.inv_freq = self.base ** (-2.0 * np.arange(half, dtype=np.float64) / self.rope_dims)
        self.inv_freq /= self.rope_linear
        if rope_ff is not None:
            self.inv_freq /= np.asarray(rope_ff, dtype=np.float64).reshape(-1)
        # local layers: their own base, unscaled
        self.inv_freq_swa = self.base_swa ** (-2.0 * np.arange(half, dtype=np.float64) /
                                              self.rope_dims)
        self.reset()

    @property
    def tokens(self):
        if not hasattr(self, "_tokens"):
            self._tokens = _field(self._reader, "tokenizer.ggml.tokens")
        return self._tokens

    @property
    def merges(self):
        if not hasattr(self, "_merges"):
            self._merges = _field(self._reader, "tokenizer.ggml.merges")
        return self._merges

    def piece(self, i):
        """The text of one token without reading the whole vocabulary."""
        if hasattr(self, "_tokens"):
            return self._tokens[i]
        f = self._reader.fields["tokenizer.ggml.tokens"]
        return bytes(f.parts[f.data[i]]).decode("utf-8")

    def _transposed(self, w, quantized):
        wt = np.ascontiguousarray(w.T)
        if quantized:
            self._quantized.add(id(wt))
        return wt

    def reset(self):
        """Empties the KV cache: k[l], v[l] are [T][n_kv][head_dim] float64."""
        self.k = [np.zeros((0, self.n_kv, self.head_dim)) for _ in range(self.n_layers)]
        self.v = [np.zeros((0, self.n_kv, self.head_dim)) for _ in range(self.n_layers)]

    @property
    def pos(self):
        return self.k[0].shape[0]

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _mm(self, x, wt):
        """x [n][in] @ wt [in][out], the input rounded as kittykv does when
        act_q8 and wt is stored in a block format."""
        if self.act_q8 and id(wt) in self._quantized:
            x = quantize_q8(x)
        return x @ wt

    def _rope(self, x, pos, inv_freq=None):
        """x: [n][heads][head_dim], pos: [n]; rotates pairs (2i, 2i+1) in place."""
        half = self.rope_dims // 2
        f = self.inv_freq if inv_freq is None else inv_freq
        ang = pos[:, None].astype(np.float64) * f[None, :]  # [n][half]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if self.neox:  # pairs (i, i + half)
            ia, ib = slice(0, half), slice(half, 2 * half)
        else:          # pairs (2i, 2i + 1)
            ia, ib = slice(0, 2 * half, 2), slice(1, 2 * half, 2)
        a = x[..., ia].copy()
        b = x[..., ib].copy()
        x[..., ia] = a * c - b * s
        x[..., ib] = a * s + b * c
        return x

    def forward(self, ids, last_only=False):
        """Appends ids to the cache; returns logits [n][n_vocab] (float64), or
        only the last position's, [1][n_vocab], if last_only."""
        ids = np.asarray(ids, dtype=np.int64)
        n, p0 = len(ids), self.pos
        pos = np.arange(p0, p0 + n)
        hd, nh, nkv = self.head_dim, self.n_heads, self.n_kv
        grp = nh // nkv
        x = self.embd[ids].astype(np.float64)  # [n][n_embd]
        if self.gemma:
            x = x * np.sqrt(float(self.n_embd))
        # causal mask over [n][p0 + n]; local layers also hide keys W or more back
        mask = np.arange(p0 + n)[None, :] > pos[:, None]
        if self.window:
            far = np.arange(p0 + n)[None, :] <= pos[:, None] - self.window
            mask_local = mask | far
        for li, L in enumerate(self.layers):
            xn = self._rms(x, L["attn_norm"])
            q, k, v = self._mm(xn, L["wq"]), self._mm(xn, L["wk"]), self._mm(xn, L["wv"])
            if L["bq"] is not None:
                q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
            q, k, v = q.reshape(n, nh, hd), k.reshape(n, nkv, hd), v.reshape(n, nkv, hd)
            if L["q_norm"] is not None:
                q, k = self._rms(q, L["q_norm"]), self._rms(k, L["k_norm"])
            fr = self.inv_freq_swa if L["local"] else None
            q, k = self._rope(q, pos, fr), self._rope(k, pos, fr)
            if self.kv_fp16:
                k, v = round_fp16(k), round_fp16(v)
            self.k[li] = np.concatenate([self.k[li], k])
            self.v[li] = np.concatenate([self.v[li], v])
            K, V = self.k[li], self.v[li]  # [T][nkv][hd]
            att = np.empty((n, nh, hd))
            for h in range(nh):
                kv = h // grp
                sc = q[:, h, :] @ K[:, kv, :].T / np.sqrt(hd)  # [n][T]
                sc[mask_local if L["local"] else mask] = -np.inf
                sc -= sc.max(axis=1, keepdims=True)
                pr = np.exp(sc)
                pr /= pr.sum(axis=1, keepdims=True)
                att[:, h, :] = pr @ V[:, kv, :]
            o = self._mm(att.reshape(n, nh * hd), L["wo"])
            if L["post_attn_norm"] is not None:
                o = self._rms(o, L["post_attn_norm"])
            x = x + o
            xn = self._rms(x, L["ffn_norm"])
            g = self._mm(xn, L["gate"])
            u = self._mm(xn, L["up"])
            if self.gemma:  # GeGLU, tanh approximation
                act = 0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g ** 3)))
            else:
                act = g / (1.0 + np.exp(-g))
            o = self._mm(act * u, L["down"])
            if L["post_ffn_norm"] is not None:
                o = self._rms(o, L["post_ffn_norm"])
            x = x + o
        if last_only:
            x = x[-1:]
        return self._mm(self._rms(x, self.out_norm), self.out_t)

    def greedy(self, prompt_ids, n_new, stop=(), step_logits=None):
        """Prefills prompt_ids, then greedily decodes n_new tokens (argmax,
        ties to the lowest id), stopping after a token in stop.
        Returns (generated ids, logits of the last prompt position); if
        step_logits is a list, the logits each token was chosen from are
        appended to it."""
        last = self.forward(prompt_ids, last_only=True)[-1]
        out = []
        lg = last
        while len(out) < n_new:
            nxt = int(np.argmax(lg))
            if step_logits is not None:
                step_logits.append(lg)
            out.append(nxt)
            if nxt in stop or len(out) == n_new:
                break
            lg = self.forward([nxt], last_only=True)[-1]
        return out, last

    # ---- text helpers (only for the standalone sanity check)
    def detok(self, ids):
        """GPT-2 byte-level decoding of token strings (SentencePiece pieces,
        U+2581 for spaces and <0xNN> bytes, for gemma3)."""
        if self.gemma:
            out = bytearray()
            for i in ids:
                p = self.piece(i)
                if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
                    out.append(int(p[3:5], 16))
                else:
                    out += p.replace("\u2581", " ").encode()
            return out.decode("utf-8", errors="replace")
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
            s = self.piece(i)
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
