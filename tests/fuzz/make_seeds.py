#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (committed; rerun to refresh):
tests/fuzz/corpus_gguf/tiny_llama.seed (a complete 1-layer llama with a
byte-level vocabulary, F32 weights), corpus_tensor, corpus_method_spec and
corpus_tokenizer. Needs numpy and gguf (the venv of scripts/setup.sh)."""
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_llama(path):
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    E, H, KV, D, F, L = 16, 2, 1, 8, 32, 1
    alpha = byte_alphabet()
    toks = [alpha[b] for b in range(256)]
    merges = []
    for a, b in (("h", "e"), ("l", "l"), ("he", "ll"), (alpha[32], "w"), ("o", "r")):
        merges.append(f"{a} {b}")
        toks.append(a + b)
    toks += ["<|im_start|>", "<|im_end|>"]
    types = [1] * (len(toks) - 2) + [3, 3]
    V = len(toks)
    w.add_block_count(L)
    w.add_context_length(64)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(V - 2)
    w.add_eos_token_id(V - 1)
    rng = np.random.default_rng(1)

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    t("token_embd.weight", V, E)
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    for l in range(L):
        t(f"blk.{l}.attn_q.weight", H * D, E)
        t(f"blk.{l}.attn_k.weight", KV * D, E)
        t(f"blk.{l}.attn_v.weight", KV * D, E)
        t(f"blk.{l}.attn_output.weight", E, H * D)
        t(f"blk.{l}.ffn_gate.weight", F, E)
        t(f"blk.{l}.ffn_up.weight", F, E)
        t(f"blk.{l}.ffn_down.weight", E, F)
        w.add_tensor(f"blk.{l}.attn_norm.weight", np.ones(E, np.float32))
        w.add_tensor(f"blk.{l}.ffn_norm.weight", np.ones(E, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_spm(path):
    """A vocabulary-only GGUF with a small SentencePiece vocabulary (model
    "llama"): control, unknown, user-defined (a space run, a newline, a tag),
    unused and byte tokens, and scored pieces, for fuzz_tokenizer's SPM path."""
    import gguf
    w = gguf.GGUFWriter(path, "llama")
    sp = "\u2581"
    toks = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>", "  ", "\n", "<u>"]
    types = [2, 3, 3, 3, 3, 4, 4, 4]
    scores = [0.0] * len(toks)
    toks += ["<0x%02X>" % b for b in range(256)]
    types += [6] * 256
    scores += [0.0] * 256
    pieces = [sp, "a", "b", "e", "h", "l", "o", "r", "t", "w", "x", "y", "\u00e9", "\u65e5",
              sp + "t", "he", sp + "the", "ll", "llo", "he" + "llo", sp + "w", "or", sp + "wor",
              "ld", sp + "world", sp + sp, "ab", "ba", "xyz"]
    for i, pc in enumerate(pieces):
        toks.append(pc)
        types.append(1)
        scores.append(-float(i))
    toks.append("xy")  # unused: merged, then split back
    types.append(5)
    scores.append(0.5)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def npy(shape_text, data):
    d = "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % shape_text
    pad = (64 - (10 + len(d) + 1) % 64) % 64
    d = d + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + data


def write(dir_, name, data):
    os.makedirs(os.path.join(HERE, dir_), exist_ok=True)
    with open(os.path.join(HERE, dir_, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def main():
    tiny_llama(os.path.join(HERE, "corpus_gguf", "tiny_llama.seed"))
    cols = lambda c: struct.pack("<H", c - 1)
    write("corpus_tensor", "npy_4x8.seed", cols(8) + npy("(4, 8)", bytes(4 * 8 * 4)))
    write("corpus_tensor", "npy_wrap.seed", cols(64) + npy("(72057594037927937, 64)", bytes(256)))
    write("corpus_tensor", "npy_empty.seed", cols(3) + npy("(0, 3)", b""))
    write("corpus_tensor", "raw_2x4.seed", cols(4) + bytes(32))
    specs = ["kitty", "fp16", "kivi-k2v2", "kitty-pro:alpha=0.5",
             "kitty:alpha=0.5:select=random:seed=3", "kitty:select=variance:sink=0:group=64",
             "kivi-k4v2s:window=32:vbits=4", "kitty:select=oracle", "fp16:group=64",
             "kitty:alpha=1e-9:seed=18446744073709551615", "kitty:"]
    for i, s in enumerate(specs):
        write("corpus_method_spec", f"spec{i}.seed", s)
    texts = [b"\x00Hello, world! How are you?", b"\x40<|im_start|>user\nhi<|im_end|>\n",
             b"\x81   spaces\t\ttabs\n\n\nnewlines", "\x02Gr\u00fc\u00dfe, \u65e5\u672c\u8a9e "
             "\U0001F600 caf\u00e9".encode(), b"\x03\xff\xfe invalid \xc3 utf-8 \xe2\x82",
             b"\x04 123456789 3.14159 x=y+z; // code", b"\x05\x04\xf1 missing bytes",
             b"\x46<|im_end|><|im_end|><|im_start|"]
    for i, t in enumerate(texts):
        write("corpus_tokenizer", f"text{i}.seed", t)
    spm_seeds()


def spm_seeds():
    """The SPM vocabulary and texts for it: byte 0 picks tokenizer 8 or 9 (the
    SPM ones when the SmolLM2 model is there: 8 BPE pre-tokenizers first)."""
    tiny_spm(os.path.join(HERE, "corpus_gguf", "tiny_spm.seed"))
    texts = [b"\x08hello world  the   wor\nld", b"\x48<s><start_of_turn>user\nhi<end_of_turn>\n",
             b"\x09 \xe2\x96\x81 xyz xy \xc3\xa9\xe6\x97\xa5 \xff\xfe\xc3", b"\x88<u>  <u>\t\t",
             b"\x49<start_of_turn<end_of_turn>><s", b"\x08" + b"ab" * 200 + b" " * 50]
    for i, t in enumerate(texts):
        write("corpus_tokenizer", f"spm{i}.seed", t)


if __name__ == "__main__":
    sys.exit(main())
