#!/usr/bin/env python3
"""Oracle test of kittykv's SentencePiece tokenizer against `sentencepiece`.

The reference is built independently of the C code: a sentencepiece
ModelProto (model_type BPE, byte_fallback) from the GGUF's tokens, scores and
token types (read by a small GGUF metadata reader here), with Gemma's normalizer (identity:
no NFKC, no extra-whitespace removal, spaces escaped to U+2581, dummy prefix
as tokenizer.ggml.add_space_prefix says). Two adjustments undo what the GGUF
converter did to the original tokenizer.model: user-defined pieces get their
U+2581 back (the converter spelled them with plain spaces), and the piece of
tokenizer.ggml.unknown_token_id is UNKNOWN again (the GGUF marks it CONTROL;
sentencepiece needs exactly one).

Checked, through the Python package (ctypes over the built libraries):
  * token ids equal for a few hundred strings: lines and paragraphs of
    data/handbook.txt and data/licenses.txt plus edge cases (spaces, tabs,
    newlines, emoji, CJK, combining marks, the special tokens' texts), with
    special-token parsing off (sentencepiece never matches control tokens:
    their text is plain text) and on (the reference then splits at the control
    tokens' texts itself);
  * detokenize(tokenize(s)) == s wherever sentencepiece also round-trips, and
    for invalid UTF-8 (which kittykv keeps through byte fallback, where
    sentencepiece's normalizer substitutes U+FFFD);
  * BOS as tokenizer.ggml.add_bos_token says; `kittykv tokenize -m MODEL -p`
    on the CLI; the Gemma chat template gives <start_of_turn>user\\n ...
    <end_of_turn>\\n<start_of_turn>model\\n with the special ids;
  * the whole handbook (~1 MB) in one call equals sentencepiece's ids and
    round-trips; the time it took is printed (ctypes call included).

Exit 77 (skip) when the model or packages are missing, unless
KKV_REQUIRE_ORACLE=1.
"""
import argparse
import os
import random
import struct
import subprocess
import sys
import tempfile
import time


def skip(msg):
    if os.environ.get("KKV_REQUIRE_ORACLE") == "1":
        print("FAIL (KKV_REQUIRE_ORACLE=1): " + msg)
        sys.exit(1)
    print("SKIP: " + msg)
    sys.exit(77)


try:
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as sp_pb2
except ImportError as e:
    spm = None
    IMPORT_ERROR = str(e)

SPACE = "\u2581"


# GGUF metadata value types and the struct format of the fixed-size ones.
GGUF_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
GGUF_STRING, GGUF_ARRAY = 8, 9


def read_metadata(path):
    """The GGUF key/value section as a dict (arrays as lists). A small reader
    of its own: gguf.GGUFReader builds an object per vocabulary entry and
    takes a minute on a loaded machine; this stops before the tensor infos."""
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        _, _, n_kv = struct.unpack_from("<IQQ", head, 4)
        data = f.read(64 << 20)  # the vocabulary of a 262K model is ~5 MB
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        pos += n
        return data[pos - n:pos].decode("utf-8")

    def value(t):
        nonlocal pos
        if t == GGUF_STRING:
            return string()
        if t == GGUF_ARRAY:
            et, n = take("I"), take("Q")
            if et == GGUF_STRING:
                return [string() for _ in range(n)]
            fmt = "<%d%s" % (n, GGUF_FMT[et])
            v = list(struct.unpack_from(fmt, data, pos))
            pos += struct.calcsize(fmt)
            return v
        return take(GGUF_FMT[t])

    meta = {}
    for _ in range(n_kv):
        k = string()
        t = take("I")
        if k == "tokenizer.ggml.add_space_prefix" and t == 7:
            meta["@add_space_prefix_at"] = 24 + pos
        meta[k] = value(t)
    meta["@kv_end"] = 24 + pos
    return meta


def vocab_copy(path, out, add_space_prefix):
    """A vocabulary-only GGUF (no tensors) with add_space_prefix set, to test
    the prefix rule the model file does not use."""
    md = read_metadata(path)
    at = md.get("@add_space_prefix_at")
    if at is None:
        return False
    with open(path, "rb") as f:
        b = bytearray(f.read(md["@kv_end"]))
    struct.pack_into("<Q", b, 8, 0)  # no tensors
    b[at] = 1 if add_space_prefix else 0
    with open(out, "wb") as f:
        f.write(b)
    return True


def read_vocab(path):
    md = read_metadata(path)
    g = lambda k: md.get("tokenizer.ggml." + k)  # noqa: E731
    meta = {k: g(k) for k in ("model", "bos_token_id", "eos_token_id", "unknown_token_id",
                              "padding_token_id", "add_bos_token", "add_space_prefix")}
    if not all(isinstance(g(k), list) for k in ("tokens", "scores", "token_type")):
        raise ValueError(f"{path}: tokens, scores or token_type missing")
    return g("tokens"), g("scores"), g("token_type"), meta


def build_reference(toks, scores, types, meta):
    m = sp_pb2.ModelProto()
    ts = m.trainer_spec
    ts.model_type = sp_pb2.TrainerSpec.BPE
    ts.vocab_size = len(toks)
    ts.byte_fallback = True
    unk = meta["unknown_token_id"]
    ts.unk_id = unk if unk is not None else 0
    ts.bos_id = meta["bos_token_id"] if meta["bos_token_id"] is not None else -1
    ts.eos_id = meta["eos_token_id"] if meta["eos_token_id"] is not None else -1
    ts.pad_id = meta["padding_token_id"] if meta["padding_token_id"] is not None else -1
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = bool(meta["add_space_prefix"]) if meta["add_space_prefix"] is not None \
        else True
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    T = sp_pb2.ModelProto.SentencePiece
    for i, (t, s, ty) in enumerate(zip(toks, scores, types)):
        p = m.pieces.add()
        p.piece = t.replace(" ", SPACE) if ty == 4 else t
        p.score = s
        p.type = T.UNKNOWN if i == unk else ty
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


def test_strings(source_dir):
    rng = random.Random(4321)
    out = []
    for name, n_lines, n_par in (("handbook.txt", 170, 6), ("licenses.txt", 90, 4)):
        path = os.path.join(source_dir, "data", name)
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        nonempty = [ln for ln in lines if ln.strip()]
        out += nonempty[::max(1, len(nonempty) // n_lines)][:n_lines]
        step = max(1, len(lines) // n_par)
        out += ["\n".join(lines[i:i + 9]) for i in range(0, len(lines), step)][:n_par]
    out += ["", " ", "  ", "   ", "    ", " " * 40, "\t", "\t\t", "\t \t", "\n", "\n\n", "\n" * 40,
            "\r\n", " \n ", "a ", "a  ", "a   b", " a", "  a", "   leading", "trailing   ",
            "a\tb", "a\t\tb", "a \t b", "a\n\nb", "a \n b", "x\u00a0y", "x\u3000y", "x\u200by",
            "end \n", "  12  34  ", "multiple   inner    spaces", "\u2581", "a\u2581b",
            "\u2581\u2581x", " \u2581 "]
    out += ["café", "naïve façade", "Ångström", "Ελληνικά", "Русский текст", "עברית",
            "العربية", "हिन्दी", "日本語のテキスト", "中文字符测试", "한국어", "ไทย", "😀",
            "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "I ❤️ NY", "e\u0301", "a\u0300\u0301b", "ﬁ ligature",
            "Straße", "𝒜𝓁𝓅𝒽𝒶", "\U0001F600x\U0001F600", "\ufeffBOM", "\ufffd", "\u0000nul",
            "\U0010FFFF", "\U000E0001 tag", "\u0378 unassigned", "Z\u0351\u0352\u0353algo"]
    out += ["int main(void) { return 0; }", "for (i = 0; i < n; i++) {\n\tx[i] += 1;\n}",
            "def f(x):\n    return x ** 2  # square\n", "$ ls -la | grep foo",
            "0xDEADBEEF 3.14159 1,000,000", "2024-05-17T12:34:56Z", "Hello, world!",
            "it's don't we're", "<div class=\"a\">hi</div>", "<table><tr><td>1</td></tr></table>",
            "<unused0>", "[multimodal]", "<0x41>", "<s>", "</s>"]
    pool = ("abcXYZ  \t\n0123456789.,;:'!?-_()[]{}<>\"/\\|@#$%^&*+=~`"
            "éüßñÅΩжשع日本中한😀👍\u0301\u00a0\u3000½٣\u2581")
    for _ in range(60):
        out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 40))))
    return out


def special_strings(controls):
    out = []
    for s in controls:
        out += [s, "a" + s + "b", " " + s + " ", s + s, s + "\n" + s, "x " + s + "1", s[:-1],
                "<" + s, s + ">"]
    return out


def ref_special(sp, text, controls):
    """sentencepiece with control-token texts split out first (leftmost, longest)."""
    ids_of = dict(controls)
    lens = sorted({len(c) for c, _ in controls}, reverse=True)
    firsts = {c[0] for c, _ in controls}
    ids, i, start = [], 0, 0
    while i < len(text):
        hit = None
        if text[i] in firsts:
            hit = next((text[i:i + n] for n in lens if text[i:i + n] in ids_of), None)
        if hit is None:
            i += 1
            continue
        if i > start:
            ids += sp.encode(text[start:i])
        ids.append(ids_of[hit])
        i += len(hit)
        start = i
    if start < len(text):
        ids += sp.encode(text[start:])
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    model = os.environ.get("KKV_SPM_MODEL") or os.path.join(
        args.source_dir, "models", "gemma-3-270m-q4_k_m.gguf")
    if spm is None:
        skip("python packages missing: " + IMPORT_ERROR)
    if not os.path.exists(model):
        skip("model not found: " + model)
    os.environ.setdefault("KITTYKV_LIB_DIR", os.path.dirname(os.path.abspath(args.kittykv)))
    sys.path.insert(0, os.path.join(args.source_dir, "python"))
    import kittykv

    t0 = time.time()
    toks, scores, types, meta = read_vocab(model)
    if meta["model"] != "llama":
        skip(f"{model} is not a SentencePiece vocabulary ({meta['model']})")
    sp = build_reference(toks, scores, types, meta)
    m = kittykv.Model(model, vocab_only=True)
    print(f"vocabulary of {len(toks)} read and reference built in {time.time() - t0:.1f} s")
    failures = 0

    def check(cond, msg):
        nonlocal failures
        if not cond:
            failures += 1
            print("FAIL: " + msg)

    def kk(text, special=False, add_bos=False):
        return [int(x) for x in m.tokenize(text, add_bos=add_bos, special=special)]

    def raw(ids):
        return b"".join(m.token_piece(i) for i in ids)

    strings = test_strings(args.source_dir)
    controls = [(t, i) for i, (t, ty) in enumerate(zip(toks, types)) if ty in (2, 3) and t]
    named = [c for c in controls if c[0] in ("<bos>", "<eos>", "<start_of_turn>",
                                              "<end_of_turn>", "<pad>", "<mask>", "<unused7>")]
    sstrings = special_strings([c[0] for c in named])
    total = equal = 0
    for special_on in (False, True):
        cases = strings + sstrings
        bad = []
        for s in cases:
            got = kk(s, special_on)
            want = ref_special(sp, s, controls) if special_on else sp.encode(s)
            if got != want:
                bad.append((s, got, want))
        total += len(cases)
        equal += len(cases) - len(bad)
        failures += len(bad)
        print(f"special={int(special_on)}: {len(cases) - len(bad)}/{len(cases)} equal")
        for s, got, want in bad[:5]:
            print(f"  MISMATCH {s!r}\n    kittykv       {got}\n    sentencepiece {want}")

    # Round trips, wherever sentencepiece round-trips too.
    rt = rt_bad = 0
    for s in strings + sstrings:
        if sp.decode(sp.encode(s)) != s:
            continue
        rt += 1
        for special_on in (False, True):
            if raw(kk(s, special_on)) != s.encode("utf-8"):
                rt_bad += 1
                print(f"FAIL: round trip of {s!r} (special={int(special_on)})")
                break
    failures += rt_bad
    print(f"round trip: {rt - rt_bad}/{rt} strings (those sentencepiece round-trips)")

    # Invalid UTF-8: bytes come back through byte fallback.
    for b in (b"ok\xff\xfe\xc3(\xed\xa0\x80\xf4\x90\x80\x80 end", b"\x80", b"a\xc3", b"\xe2\x96",
              b"\xf0\x9f\x98 x", b" \xff "):
        ids = [int(x) for x in m.tokenize(b, add_bos=False)]
        check(raw(ids) == b, f"invalid UTF-8 {b!r} does not round-trip: {ids}")
        check(all(0 <= i < len(toks) for i in ids), f"ids out of range for {b!r}")

    # BOS per tokenizer.ggml.add_bos_token.
    bos = meta["bos_token_id"]
    want_bos = [bos] if meta["add_bos_token"] else []
    check(kk("Hello", add_bos=True) == want_bos + sp.encode("Hello"), "BOS handling")
    check(kk("", add_bos=True) == want_bos and kk("") == [], "empty text")

    # The CLI.
    p = subprocess.run([args.kittykv, "tokenize", "-m", model, "-p", "Hello world  again"],
                       capture_output=True, text=True, timeout=120)
    got = [int(x) for x in p.stdout.split()] if p.returncode == 0 else None
    check(got == want_bos + sp.encode("Hello world  again"),
          f"kittykv tokenize -p: rc {p.returncode}, {got}, {p.stderr.strip()}")

    # The Gemma chat template with this tokenizer.
    sot, eot = toks.index("<start_of_turn>"), toks.index("<end_of_turn>")
    p = subprocess.run([args.kittykv, "tokenize", "-m", model, "--chat-template", "gemma", "-p",
                        "What is Debian?"], capture_output=True, text=True, timeout=120)
    got = [int(x) for x in p.stdout.split()] if p.returncode == 0 else None
    want = (want_bos + [sot] + sp.encode("user\nWhat is Debian?") + [eot] + sp.encode("\n")
            + [sot] + sp.encode("model\n"))
    check(got == want, f"gemma chat template: rc {p.returncode}\n    kittykv {got}\n"
          f"    want    {want}\n    {p.stderr.strip()}")

    # The whole handbook in one call (and the speed, for the record).
    hb = os.path.join(args.source_dir, "data", "handbook.txt")
    if os.path.exists(hb):
        with open(hb, encoding="utf-8") as f:
            text = f.read()
        t0 = time.time()
        got = kk(text)
        dt = time.time() - t0
        ref_all = sp.encode(text)
        if got != ref_all:
            k = next((i for i in range(min(len(got), len(ref_all))) if got[i] != ref_all[i]),
                     min(len(got), len(ref_all)))
            check(False, f"whole handbook: {len(got)} tokens, sentencepiece {len(ref_all)}, "
                  f"first difference at token {k}")
        check(raw(got) == text.encode("utf-8"), "whole handbook does not round-trip")
        print(f"handbook: {len(text.encode())} bytes -> {len(got)} tokens in {dt:.2f} s "
              f"({len(got) / dt:.0f} tokens/s, through ctypes)")

    m.close()

    # The space prefix (Gemma has none): the same vocabulary with
    # add_space_prefix flipped, against sentencepiece's add_dummy_prefix.
    with tempfile.TemporaryDirectory() as d:
        flipped = not meta["add_space_prefix"]
        path = os.path.join(d, "vocab.gguf")
        if vocab_copy(model, path, flipped):
            sp2 = build_reference(toks, scores, types, dict(meta, add_space_prefix=flipped))
            m2 = kittykv.Model(path, vocab_only=True)
            bad = [s for s in strings if [int(x) for x in m2.tokenize(s, add_bos=False)]
                   != sp2.encode(s)]
            m2.close()
            total += len(strings)
            equal += len(strings) - len(bad)
            failures += len(bad)
            print(f"add_space_prefix={int(flipped)}: {len(strings) - len(bad)}/{len(strings)} equal")
            for s in bad[:5]:
                print(f"  MISMATCH {s!r}")
    print(f"agreement: {equal}/{total} strings equal token ids; {failures} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
