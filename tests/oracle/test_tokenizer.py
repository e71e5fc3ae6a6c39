#!/usr/bin/env python3
"""Oracle test of the kittykv tokenizer against HF `tokenizers`.

The reference tokenizer is built independently of the C code: vocabulary and
merges come from the GGUF (read with the `gguf` package), the model is
tokenizers' BPE, and the pre-tokenizer is the one of the HF tokenizer.json of
each pre-tokenizer family:
  smollm: Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]
  gpt2:   ByteLevel(use_regex=True)
  llama3: Split(Regex(llama3 pattern), isolated) + ByteLevel(use_regex=False),
          BPE(ignore_merges=True)
  qwen2:  Split(Regex(qwen2 pattern), isolated) + ByteLevel(use_regex=False)
The model's own pre-tokenizer runs without --pre (and without --no-bos: the
default BOS handling must match HF too); the others run with --pre on the same
vocabulary. Every string is compared for exact id equality, with and without
--special. Many strings go through one CLI call (tokenize --lines).

Exit 77 (skip) when the model or packages are missing, unless
KKV_REQUIRE_ORACLE=1.
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile


def skip(msg):
    if os.environ.get("KKV_REQUIRE_ORACLE") == "1":
        print("FAIL (KKV_REQUIRE_ORACLE=1): " + msg)
        sys.exit(1)
    print("SKIP: " + msg)
    sys.exit(77)


try:
    import gguf
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
except ImportError as e:  # the caller decides whether a missing package is a skip
    gguf = None
    IMPORT_ERROR = str(e)

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        return None
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [int(f.parts[i][0]) for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0]


def read_vocab(path):
    """(tokens, types, merges, pre) from the GGUF; GGUFReader is slow, read once."""
    r = gguf.GGUFReader(path)
    return (field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.token_type"),
            [tuple(m.split(" ", 1)) for m in field(r, "tokenizer.ggml.merges")],
            field(r, "tokenizer.ggml.pre"))


def build_reference(vocab_data, pre):
    tokens, types, merges, _ = vocab_data
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=(pre == "llama3")))
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pat = LLAMA3_RE if pre == "llama3" else QWEN2_RE
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    special = [t for t, ty in zip(tokens, types) if ty in (3, 4) and t]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    return tok, special


def test_strings(source_dir):
    rng = random.Random(1234)
    out = []
    # Prose: every 40th non-empty handbook line, plus a few whole paragraphs.
    hb = os.path.join(source_dir, "data", "handbook.txt")
    if os.path.exists(hb):
        with open(hb, encoding="utf-8") as f:
            lines = [ln.rstrip("\n") for ln in f]
        nonempty = [ln for ln in lines if ln.strip()]
        out += nonempty[::max(1, len(nonempty) // 150)][:150]
        out += ["\n".join(lines[i:i + 12]) for i in range(0, min(len(lines), 600), 120)]
    # Numbers and digit runs.
    out += ["0", "7", "42", "123456789", "3.14159", "1,000,000", "-17", "+1e-5", "x1y22z333",
            "v2.0.1", "1st 2nd 3rd 4th", "2024-05-17T12:34:56Z", "0xDEADBEEF", "$1,234.56",
            "  12  34  ", "1 2 3", "١٢٣ ٤٥٦", "½ ¾ ² ³", "Ⅻ ⅻ", "𝟙𝟚𝟛", "٣ apples",
            "In 2023, 45 people paid $12.50 each.", "call 555-0199 at 9:30am", "a1b2c3",
            "page 7 of 10", "(1) first (2) second", "the 1990s and 2000s", " 0", "  00",
            "x = 1000000 * 3", "IPv4 192.168.0.1", "100%", "#42", "3rd-party v10.2"]
    # Code.
    out += ["int main(void) { return 0; }", "for (int i = 0; i < n; i++) {\n\tx[i] += 1;\n}",
            "def f(x):\n    return x ** 2  # square\n", "if a != b && c >= d || !e:",
            "#include <stdio.h>\n", "std::vector<int> v{1, 2, 3};", "a->b->c", "x = {'k': [1, 2]}",
            "SELECT * FROM t WHERE id = 5;", "<div class=\"a\">hi</div>", "$ ls -la | grep foo",
            "    indented\n        more\n", "@decorator\nclass A(B):\n    pass"]
    # Whitespace runs.
    out += [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "a ", "a  ", "a   b", " a",
            "  a", "a\tb", "a\t\tb", "a \t b", "a\n\nb", "a \n b", "trailing   ", "   leading",
            "x\u00a0y", "x\u2003y", "x\u3000y", "x\u180ey", "x\u0085y", "x\u2028y", "x\u200by",
            "\u00a0\u00a0", "a\u00a0 b", " \u3000 x", "\x0b\x0c", "end \n"]
    # Unicode letters, accents, CJK, emoji, combining marks.
    out += ["café", "naïve façade", "Ångström", "Ελληνικά", "Русский текст", "עברית",
            "العربية", "हिन्दी", "日本語のテキスト", "中文字符测试", "한국어", "ไทย",
            "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "I ❤️ NY", "e\u0301", "a\u0300\u0301b",
            "ﬁ ligature", "Straße", "ǅ ǈ", "𝒜𝓁𝓅𝒽𝒶", "\U0001F600x\U0001F600", "ZWJ\u200dZ",
            "\ufeffBOM", "\ufffd", "\u0000nul", "tab\u0009end"]
    # Punctuation runs and contractions.
    out += ["!!!", "?!?!", "...", "---", "***", "((()))", "\"quoted\"", "'single'", "«»", "—–",
            "it's", "don't", "we're", "they've", "I'm", "you'll", "he'd", "IT'S", "DON'T",
            "'s", " 's", "''s", "x's'", "rock'n'roll", "'ll'll", "O'Neil's",
            "Hello, world!", "a.b,c;d:e", "#hashtag @user", "¿Qué? ¡Sí!", "~!@#$%^&*()_+"]
    # Random mixes from a pool of every character class above.
    pool = ("abcXYZ  \t\n0123456789.,;:'!?-_()[]{}<>\"/\\|@#$%^&*+=~`"
            "éüßñÅΩжשع日本中한😀👍\u0301\u00a0\u3000½٣")
    for _ in range(120):
        n = rng.randint(1, 40)
        out.append("".join(rng.choice(pool) for _ in range(n)))
    return out


def special_strings(special):
    sp = special[:6] if special else []
    out = []
    for s in sp:
        out += [s, "a" + s + "b", " " + s + " ", s + s, s + "\n" + s, "x " + s + "1",
                s[:-1], "<" + s, s + ">"]
    if len(sp) >= 3:
        out.append(f"{sp[1]}system\nYou are helpful.{sp[2]}\n{sp[1]}user\nHi 123{sp[2]}\n")
    return out


def escape(s):
    b = s.encode("utf-8")
    return (b.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r"))


def run_cli(kittykv, model, strings, extra):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        for s in strings:
            f.write(escape(s) + b"\n")
        name = f.name
    try:
        p = subprocess.run([kittykv, "tokenize", "-m", model, "-f", name, "--lines"] + extra,
                           capture_output=True, timeout=600)
    finally:
        os.unlink(name)
    if p.returncode != 0:
        raise RuntimeError(f"kittykv tokenize {' '.join(extra)} failed ({p.returncode}): "
                           + p.stderr.decode(errors="replace"))
    lines = p.stdout.decode().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) != len(strings):
        raise RuntimeError(f"got {len(lines)} output lines for {len(strings)} strings")
    return [[int(x) for x in ln.split()] for ln in lines]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kittykv", required=True)
    ap.add_argument("--source-dir", required=True)
    args = ap.parse_args()
    model = os.environ.get("KKV_MODEL") or os.path.join(
        args.source_dir, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    if gguf is None:
        skip("python packages missing: " + IMPORT_ERROR)
    if not os.path.exists(model):
        skip("model not found: " + model)

    strings = test_strings(args.source_dir)
    failures = 0
    total = 0
    vocab_data = read_vocab(model)
    model_pre = vocab_data[3]
    _, special = build_reference(vocab_data, "smollm")
    sstrings = special_strings(special)
    if model_pre != "smollm":
        print(f"note: the model's pre-tokenizer is '{model_pre}', the oracle models 'smollm'")
    for pre in ["smollm", "gpt2", "llama3", "qwen2"]:
        ref, _ = build_reference(vocab_data, pre)
        # Only the model's own pre-tokenizer runs with the model's BOS default.
        extra = [] if pre == model_pre else ["--pre", pre, "--no-bos"]
        for special_on in (False, True):
            ref.encode_special_tokens = not special_on
            cases = strings + sstrings
            flags = extra + (["--special"] if special_on else [])
            got = run_cli(args.kittykv, model, cases, flags)
            want = [e.ids for e in ref.encode_batch(cases, add_special_tokens=False)]
            bad = [i for i in range(len(cases)) if got[i] != want[i]]
            total += len(cases)
            failures += len(bad)
            print(f"pre={pre:7s} special={int(special_on)}: {len(cases) - len(bad)}/{len(cases)} equal")
            for i in bad[:5]:
                print(f"  MISMATCH {cases[i]!r}\n    kittykv {got[i]}\n    tokenizers {want[i]}")
    # Invalid UTF-8 cannot go through tokenizers: it must not crash and must
    # come back byte for byte (checked by the C tests); here only that the CLI
    # copes with it.
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(b"ok\\xff\\xfe\\xc3(\\xed\\xa0\\x80\\xf4\\x90\\x80\\x80 end\n")
        name = f.name
    try:
        p = subprocess.run([args.kittykv, "tokenize", "-m", model, "-f", name, "--lines"],
                           capture_output=True, timeout=60)
    finally:
        os.unlink(name)
    total += 1
    if p.returncode != 0 or len(p.stdout.split()) < 10:
        failures += 1
        print("invalid UTF-8 line failed:", p.returncode, p.stdout, p.stderr)
    print(f"{total - failures}/{total} strings equal")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
