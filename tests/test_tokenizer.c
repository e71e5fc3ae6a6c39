/* Tokenizer tests: the GPT-2 byte alphabet, BPE on small synthetic GGUF
 * vocabularies built in memory (merge priority, leftmost ties, longest special
 * match, error paths), the CLI's streaming UTF-8 assembler, and on the real
 * model: known ids, encode->decode round trips (UTF-8, emoji, CJK, invalid
 * bytes), special tokens, buffer sizes, speed and thread safety.
 *
 * The real-model part is skipped (exit 77 after the rest ran) when the model
 * file is absent, unless KKV_REQUIRE_MODEL=1. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "testutil.h"

/* The CLI's assembler is not in the library; the test compiles it in. */
#include "kittykv_model.h"

#ifndef KKV_SOURCE_DIR
#define KKV_SOURCE_DIR "."
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ byte alphabet */

static void test_byte_alphabet(void) {
    int seen[324] = {0};
    for (int b = 0; b < 256; b++) {
        uint32_t cp = kkv_tok_byte_to_cp((uint8_t)b);
        CHECK(cp < 324, "byte %d -> U+%04X out of range", b, (unsigned)cp);
        if (cp >= 324) continue;
        CHECK(!seen[cp], "byte %d -> U+%04X used twice", b, (unsigned)cp);
        seen[cp] = 1;
        CHECK(kkv_tok_cp_to_byte(cp) == b, "U+%04X -> %d, want %d", (unsigned)cp,
              kkv_tok_cp_to_byte(cp), b);
    }
    CHECK(kkv_tok_byte_to_cp(' ') == 0x120, "space -> U+%04X, want U+0120 'G-dot'",
          (unsigned)kkv_tok_byte_to_cp(' '));
    CHECK(kkv_tok_byte_to_cp('\n') == 0x10A, "newline -> U+%04X", (unsigned)kkv_tok_byte_to_cp('\n'));
    CHECK(kkv_tok_byte_to_cp('A') == 'A', "A maps to itself");
    CHECK(kkv_tok_byte_to_cp(0xAD) == 0x143, "soft hyphen -> U+%04X", (unsigned)kkv_tok_byte_to_cp(0xAD));
    CHECK(kkv_tok_cp_to_byte(' ') == -1, "U+0020 is not in the alphabet");
    CHECK(kkv_tok_cp_to_byte(324) == -1, "U+0144 is not in the alphabet");
    CHECK(kkv_tok_cp_to_byte(0x1F600) == -1, "emoji is not in the alphabet");
}

/* ------------------------------------------------------------ UTF-8 assembler */

/* Feeds s in pieces of `step` bytes (0: random sizes); returns the output. */
static size_t stream_all(char *out, const char *s, size_t n, size_t step, tu_rng *r) {
    kkv_utf8_stream st;
    kkv_utf8_stream_init(&st);
    size_t w = 0;
    for (size_t i = 0; i < n;) {
        size_t k = step ? step : (size_t)tu_int(r, 6);
        if (k > n - i) k = n - i;
        w += kkv_utf8_stream_feed(&st, out + w, s + i, k);
        i += k;
    }
    return w + kkv_utf8_stream_flush(&st, out + w);
}

static int count_fffd(const char *s, size_t n) {
    int c = 0;
    for (size_t i = 0; i + 3 <= n; i++) c += !memcmp(s + i, "\xEF\xBF\xBD", 3);
    return c;
}

static int all_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t l = kkv_utf8_valid_len((const unsigned char *)s + i, n - i);
        if (!l) return 0;
        i += l;
    }
    return 1;
}

static void test_utf8_stream(void) {
    static const char valid[] = "plain ASCII, caf\xC3\xA9, \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E, "
                                "\xF0\x9F\x98\x80\xF0\x9F\x91\x8D, \xF4\x8F\xBF\xBF end";
    size_t n = sizeof valid - 1;
    char out[KKV_UTF8_STREAM_BOUND(sizeof valid)];
    tu_rng r = tu_rng_make(7);
    for (size_t step = 0; step <= 3; step++) {
        size_t w = stream_all(out, valid, n, step, &r);
        CHECK(w == n && !memcmp(out, valid, n), "valid text changed (step %zu)", step);
    }

    /* Byte by byte: nothing of a multi-byte character comes out early. */
    kkv_utf8_stream st;
    kkv_utf8_stream_init(&st);
    const char *emoji = "\xF0\x9F\x98\x80";
    for (int i = 0; i < 3; i++)
        CHECK(kkv_utf8_stream_feed(&st, out, emoji + i, 1) == 0, "partial emoji emitted at byte %d", i);
    CHECK(kkv_utf8_stream_feed(&st, out, emoji + 3, 1) == 4 && !memcmp(out, emoji, 4),
          "emoji not emitted whole");
    CHECK(kkv_utf8_stream_flush(&st, out) == 0, "flush of an empty stream wrote bytes");

    /* Ill-formed input: one U+FFFD per maximal subpart, then valid again. */
    static const struct {
        const char *in;
        int fffd;
        const char *tail; /* the valid bytes that must survive */
    } bad[] = {
        {"\x80", 1, ""},             {"\xFF" "A", 1, "A"},
        {"\xC3" "A", 1, "A"},        {"\xE0\x80" "A", 2, "A"},
        {"\xED\xA0\x80", 3, ""},     {"\xF0\x9F\x98" "A", 1, "A"},
        {"\xF4\x90\x80\x80", 4, ""}, {"\xC0\xAF", 2, ""},
        {"\xE6\x97", 1, ""},         {"A\xF0\x9F", 1, "A"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t bn = strlen(bad[i].in);
        for (size_t step = 0; step <= 1; step++) {
            size_t w = stream_all(out, bad[i].in, bn, step, &r);
            CHECK(count_fffd(out, w) == bad[i].fffd && all_valid(out, w) &&
                      w == 3 * (size_t)bad[i].fffd + strlen(bad[i].tail),
                  "case %zu: %d U+FFFD in %zu bytes, want %d", i, count_fffd(out, w), w,
                  bad[i].fffd);
        }
    }

    /* Random bytes: the output is valid UTF-8, within the bound, and the
     * split into pieces does not matter. */
    char in[64], o1[KKV_UTF8_STREAM_BOUND(64)], o2[KKV_UTF8_STREAM_BOUND(64)];
    for (int it = 0; it < 2000 && !tu_failed(); it++) {
        size_t m = (size_t)tu_int(&r, 64);
        for (size_t i = 0; i < m; i++) {
            int c = tu_int(&r, 4);
            in[i] = (char)(c == 0 ? tu_int(&r, 128) : c == 1 ? 0x80 + tu_int(&r, 64)
                                                             : 0xC0 + tu_int(&r, 64));
        }
        size_t w1 = stream_all(o1, in, m, 1, &r), w2 = stream_all(o2, in, m, 0, &r);
        CHECK(all_valid(o1, w1) && w1 <= KKV_UTF8_STREAM_BOUND(m), "invalid output at iteration %d", it);
        CHECK(w1 == w2 && !memcmp(o1, o2, w1), "output depends on the piece sizes (iteration %d)", it);
    }
}

/* ------------------------------------------------------------ synthetic GGUF */

typedef struct buf {
    uint8_t *p;
    size_t   n, cap;
} buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = 2 * (b->n + n) + 256;
        b->p = realloc(b->p, b->cap);
        if (!b->p) abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s, size_t n) {
    put_u64(b, n);
    put(b, s, n);
}
static void put_key(buf *b, const char *k, uint32_t type) {
    put_str(b, k, strlen(k));
    put_u32(b, type);
}

/* A small byte-level vocabulary: two control tokens where one's text is a
 * prefix of the other's, the 256 byte tokens (except `drop_byte`), and the
 * tokens of the merges "b c", "a b", "ab c", "a a", "Ġ d", "Ġd e", "1 2" (in
 * that priority). Options break it in one way each. */
typedef struct fake_opts {
    const char *model;    /* tokenizer.ggml.model */
    const char *pre;      /* NULL: key absent */
    int         drop_byte; /* -1: all bytes present */
    int         bad_types; /* token_type with one entry too few */
    int64_t     bos;      /* bos_token_id */
    int         no_tokens;
} fake_opts;

static const char *const fake_merges[] = {"b c", "a b", "ab c", "a a", "\xC4\xA0 d", "\304\240d e", "1 2"};
static const char *const fake_merged[] = {"bc", "ab", "abc", "aa", "\304\240d", "\304\240de", "12"};
#define N_FAKE_MERGES 7

static buf fake_gguf(const fake_opts *o) {
    char texts[256][3];
    const char *tok[2 + 256 + N_FAKE_MERGES];
    int type[2 + 256 + N_FAKE_MERGES];
    int n = 0;
    tok[n] = "<|x|>";
    type[n++] = KKV_TOKTYPE_CONTROL;
    tok[n] = "<|x|>y";
    type[n++] = KKV_TOKTYPE_CONTROL;
    for (int b = 0; b < 256; b++) {
        if (b == o->drop_byte) continue;
        uint32_t cp = kkv_tok_byte_to_cp((uint8_t)b);
        if (cp < 0x80) {
            texts[b][0] = (char)cp;
            texts[b][1] = 0;
        } else {
            texts[b][0] = (char)(0xC0 | (cp >> 6));
            texts[b][1] = (char)(0x80 | (cp & 0x3F));
            texts[b][2] = 0;
        }
        tok[n] = texts[b];
        type[n++] = KKV_TOKTYPE_NORMAL;
    }
    for (int i = 0; i < N_FAKE_MERGES; i++) {
        tok[n] = fake_merged[i];
        type[n++] = KKV_TOKTYPE_NORMAL;
    }

    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0); /* tensors */
    put_u64(&b, (o->pre ? 6 : 5) - (o->no_tokens ? 1 : 0));
    put_key(&b, "tokenizer.ggml.model", KKV_GGUF_STRING);
    put_str(&b, o->model, strlen(o->model));
    if (o->pre) {
        put_key(&b, "tokenizer.ggml.pre", KKV_GGUF_STRING);
        put_str(&b, o->pre, strlen(o->pre));
    }
    if (!o->no_tokens) {
        put_key(&b, "tokenizer.ggml.tokens", KKV_GGUF_ARRAY);
        put_u32(&b, KKV_GGUF_STRING);
        put_u64(&b, (uint64_t)n);
        for (int i = 0; i < n; i++) put_str(&b, tok[i], strlen(tok[i]));
    }
    put_key(&b, "tokenizer.ggml.token_type", KKV_GGUF_ARRAY);
    put_u32(&b, KKV_GGUF_I32);
    int nt = n - (o->bad_types ? 1 : 0);
    put_u64(&b, (uint64_t)nt);
    for (int i = 0; i < nt; i++) put_u32(&b, (uint32_t)type[i]);
    put_key(&b, "tokenizer.ggml.merges", KKV_GGUF_ARRAY);
    put_u32(&b, KKV_GGUF_STRING);
    put_u64(&b, N_FAKE_MERGES);
    for (int i = 0; i < N_FAKE_MERGES; i++) put_str(&b, fake_merges[i], strlen(fake_merges[i]));
    put_key(&b, "tokenizer.ggml.bos_token_id", KKV_GGUF_I64);
    put(&b, &o->bos, 8);
    return b;
}

/* Builds a tokenizer from a synthetic file; returns the status. */
static kkv_status fake_tok(kkv_tok **t, const fake_opts *o) {
    buf b = fake_gguf(o);
    kkv_gguf *g = NULL;
    *t = NULL;
    kkv_status s = kkv_gguf_parse(&g, b.p, b.n);
    CHECK(s == KKV_OK, "synthetic GGUF does not parse: %s", kkv_last_error());
    if (s == KKV_OK) s = kkv_tok_from_gguf(t, g);
    kkv_gguf_close(g); /* the tokenizer must not keep pointers into the file */
    memset(b.p, 0, b.n);
    free(b.p);
    return s;
}

/* Encodes s and compares with the texts of the expected tokens. */
static void expect_tokens(const kkv_tok *t, const char *s, int special, const char *const *want,
                          int n_want) {
    int32_t ids[64];
    int n = -1;
    kkv_status st = kkv_tok_encode(t, ids, 64, &n, s, strlen(s), 1, special);
    int ok = st == KKV_OK && n == n_want;
    for (int i = 0; ok && i < n; i++) ok = ids[i] == kkv_tok_find(t, want[i]);
    CHECK(ok, "'%s' (special=%d): status %d, %d tokens, want %d", s, special, (int)st, n, n_want);
}

static void test_synthetic(void) {
    fake_opts base = {"gpt2", "smollm", -1, 0, 0, 0};
    kkv_tok *t;
    kkv_status s = fake_tok(&t, &base);
    CHECK(s == KKV_OK, "synthetic tokenizer: %s", kkv_last_error());
    if (s != KKV_OK) return;
    CHECK(kkv_tok_n_vocab(t) == 2 + 256 + N_FAKE_MERGES, "n_vocab %d", kkv_tok_n_vocab(t));
    CHECK(kkv_tok_bos(t) == 0 && kkv_tok_eos(t) == -1 && kkv_tok_eot(t) == -1 && !kkv_tok_wants_bos(t),
          "ids: bos %d eos %d eot %d wants %d", kkv_tok_bos(t), kkv_tok_eos(t), kkv_tok_eot(t),
          kkv_tok_wants_bos(t));
    CHECK(!strcmp(kkv_tok_pre_name(t), "smollm"), "pre %s", kkv_tok_pre_name(t));

    /* "b c" outranks "a b": abc -> a|bc, and then "a bc" is no merge. */
    expect_tokens(t, "abc", 0, (const char *const[]){"a", "bc"}, 2);
    expect_tokens(t, "ab", 0, (const char *const[]){"ab"}, 1);
    expect_tokens(t, "abab", 0, (const char *const[]){"ab", "ab"}, 2);
    /* Ties go to the leftmost pair. */
    expect_tokens(t, "aaa", 0, (const char *const[]){"aa", "a"}, 2);
    expect_tokens(t, "aaaaa", 0, (const char *const[]){"aa", "aa", "a"}, 3);
    /* Merges chain across the byte alphabet: " de" -> "Ġd" then "Ġde". */
    expect_tokens(t, "c de", 0, (const char *const[]){"c", "\304\240de"}, 2);
    /* Digits are split one by one before the GPT-2 regex. */
    expect_tokens(t, "a 12", 0, (const char *const[]){"a", "\xC4\xA0", "1", "2"}, 4);
    /* Special tokens: longest first, only with special; else plain text. */
    expect_tokens(t, "a<|x|>yb", 1, (const char *const[]){"a", "<|x|>y", "b"}, 3);
    expect_tokens(t, "<|x|>z", 1, (const char *const[]){"<|x|>", "z"}, 2);
    expect_tokens(t, "<|x|", 1, (const char *const[]){"<", "|", "x", "|"}, 4);
    expect_tokens(t, "<|x|>", 0, (const char *const[]){"<", "|", "x", "|", ">"}, 5);
    size_t pl = 0;
    char piece[16];
    CHECK(kkv_tok_piece(t, piece, sizeof piece, &pl, 1) == KKV_OK && pl == 6 && !memcmp(piece, "<|x|>y", 6),
          "control token piece is its text");
    kkv_tok_free(t);

    /* No pre-tokenizer key: the GPT-2 default, digits stay together. */
    fake_opts o = base;
    o.pre = NULL;
    s = fake_tok(&t, &o);
    CHECK(s == KKV_OK && !strcmp(kkv_tok_pre_name(t), "default"), "missing pre: %s", kkv_last_error());
    if (s == KKV_OK) {
        int32_t ids[8];
        int n = 0;
        CHECK(kkv_tok_encode(t, ids, 8, &n, "a 12", 4, 0, 0) == KKV_OK && n == 3 &&
                  ids[2] == kkv_tok_find(t, "12"),
              "gpt2 pre: ' 12' is one chunk and 1 2 merge, got %d tokens", n);
    }
    kkv_tok_free(t);

    /* A vocabulary without byte 'z': z becomes U+FFFD (its three byte tokens
     * here), and the chunk merges on either side of it. */
    o = base;
    o.drop_byte = 'z';
    s = fake_tok(&t, &o);
    CHECK(s == KKV_OK, "vocab without 'z': %s", kkv_last_error());
    if (s == KKV_OK)
        expect_tokens(t, "abzab", 0,
                      (const char *const[]){"ab", "\xC3\xAF", "\xC2\xBF", "\xC2\xBD", "ab"}, 5);
    kkv_tok_free(t);
    /* Without U+FFFD's bytes either: a clear error, no crash. */
    o.drop_byte = 0xBD;
    s = fake_tok(&t, &o);
    CHECK(s == KKV_OK, "vocab without 0xBD: %s", kkv_last_error());
    if (s == KKV_OK) {
        int32_t ids[8];
        int n = 0;
        s = kkv_tok_encode(t, ids, 8, &n, "a\xBD", 2, 0, 0);
        CHECK(s == KKV_ERR_UNSUPPORTED && strstr(kkv_last_error(), "0xbd"),
              "missing byte token: status %d '%s'", (int)s, kkv_last_error());
    }
    kkv_tok_free(t);

    /* Every advertised pre-tokenizer builds and reports its name. */
    int n_pre = 0;
    for (const char *const *nm = kkv_tok_pre_names(); *nm; nm++, n_pre++) {
        o = base;
        o.pre = *nm;
        s = fake_tok(&t, &o);
        CHECK(s == KKV_OK && !strcmp(kkv_tok_pre_name(t), *nm), "pre '%s': %s", *nm, kkv_last_error());
        kkv_tok_free(t);
    }
    CHECK(n_pre == 8, "%d pre-tokenizers listed", n_pre);

    /* Rejected files. */
    static const struct {
        fake_opts o;
        kkv_status want;
        const char *what;
    } rej[] = {
        {{"llama", "smollm", -1, 0, 0, 0}, KKV_ERR_FORMAT, "SentencePiece model without scores"},
        {{"bert", "smollm", -1, 0, 0, 0}, KKV_ERR_UNSUPPORTED, "WordPiece model"},
        {{"gpt2", "klingon", -1, 0, 0, 0}, KKV_ERR_UNSUPPORTED, "unknown pre-tokenizer"},
        {{"gpt2", "smollm", -1, 1, 0, 0}, KKV_ERR_FORMAT, "token_type shorter than tokens"},
        {{"gpt2", "smollm", -1, 0, 100000, 0}, KKV_ERR_FORMAT, "bos id out of range"},
        {{"gpt2", "smollm", -1, 0, -1, 0}, KKV_ERR_FORMAT, "negative bos id"},
        {{"gpt2", "smollm", -1, 0, 0, 1}, KKV_ERR_FORMAT, "no tokens"},
    };
    for (size_t i = 0; i < sizeof rej / sizeof rej[0]; i++) {
        s = fake_tok(&t, &rej[i].o);
        CHECK(s == rej[i].want && t == NULL && kkv_last_error()[0],
              "%s: status %d (want %d), message '%s'", rej[i].what, (int)s, (int)rej[i].want,
              kkv_last_error());
        kkv_tok_free(t);
    }
    kkv_tok_free(NULL);
}

/* ------------------------------------------------------------ SentencePiece */

/* A small SentencePiece vocabulary (tokenizer.ggml.model = llama). Scores
 * decide the merges: "bc" and "cd" (-0.5) beat "ab" (-1); "xy" is unused
 * (merged, then split back), "xyz" is built on it. "  " is user-defined with
 * plain spaces, as the GGUF converter writes Gemma's space runs. */
#define SPM_SP "\xE2\x96\x81" /* U+2581 */
static const struct {
    const char *text;
    float score;
    int type;
} spm_base[] = {
    {"<unk>", 0, KKV_TOKTYPE_UNKNOWN}, {"<s>", 0, KKV_TOKTYPE_CONTROL},
    {"</s>", 0, KKV_TOKTYPE_CONTROL}, {"<ctl>", 0, KKV_TOKTYPE_CONTROL},
    {"<ctl>x", 0, KKV_TOKTYPE_CONTROL}, {"<u>", 0, KKV_TOKTYPE_USER},
    {"  ", 0, KKV_TOKTYPE_USER}, {"a", -10, 1}, {"b", -10, 1}, {"c", -10, 1}, {"d", -10, 1},
    {"x", -10, 1}, {"y", -10, 1}, {"z", -10, 1}, {SPM_SP, -10, 1}, {"ab", -1, 1},
    {"bc", -0.5f, 1}, {"cd", -0.5f, 1}, {SPM_SP "a", -3, 1}, {"xy", 0, KKV_TOKTYPE_UNUSED},
    {"xyz", -0.1f, 1}, {"\xC3\xA9", -10, 1}, /* é */
};
#define N_SPM_BASE ((int)(sizeof spm_base / sizeof spm_base[0]))

typedef struct spm_opts {
    int add_space;  /* -1: key absent */
    int drop_byte;  /* -1: all 256 byte tokens */
    int no_scores, short_scores, int_scores, nan_score;
    int no_types, bad_type, bad_byte_text;
    int add_bos;
} spm_opts;

static buf spm_gguf(const spm_opts *o) {
    char bytes[256][8];
    const char *tok[N_SPM_BASE + 256];
    float score[N_SPM_BASE + 256];
    int type[N_SPM_BASE + 256], n = 0;
    for (int i = 0; i < N_SPM_BASE; i++, n++) {
        tok[n] = spm_base[i].text;
        score[n] = spm_base[i].score;
        type[n] = spm_base[i].type;
    }
    for (int b = 0; b < 256; b++) {
        if (b == o->drop_byte) continue;
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tok[n] = bytes[b];
        score[n] = 0;
        type[n++] = KKV_TOKTYPE_BYTE;
    }
    if (o->bad_byte_text) tok[n - 1] = "<0xZZ>";
    if (o->bad_type) type[3] = 9;
    if (o->nan_score) score[7] = NAN;

    buf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0);
    put_u64(&b, 6 + (o->add_space >= 0) - o->no_scores - o->no_types);
    put_key(&b, "tokenizer.ggml.model", KKV_GGUF_STRING);
    put_str(&b, "llama", 5);
    put_key(&b, "tokenizer.ggml.tokens", KKV_GGUF_ARRAY);
    put_u32(&b, KKV_GGUF_STRING);
    put_u64(&b, (uint64_t)n);
    for (int i = 0; i < n; i++) put_str(&b, tok[i], strlen(tok[i]));
    if (!o->no_scores) {
        put_key(&b, "tokenizer.ggml.scores", KKV_GGUF_ARRAY);
        put_u32(&b, o->int_scores ? KKV_GGUF_I32 : KKV_GGUF_F32);
        int ns = n - o->short_scores;
        put_u64(&b, (uint64_t)ns);
        for (int i = 0; i < ns; i++) {
            uint32_t u;
            memcpy(&u, &score[i], 4);
            put_u32(&b, o->int_scores ? (uint32_t)(int32_t)score[i] : u);
        }
    }
    if (!o->no_types) {
        put_key(&b, "tokenizer.ggml.token_type", KKV_GGUF_ARRAY);
        put_u32(&b, KKV_GGUF_I32);
        put_u64(&b, (uint64_t)n);
        for (int i = 0; i < n; i++) put_u32(&b, (uint32_t)type[i]);
    }
    put_key(&b, "tokenizer.ggml.bos_token_id", KKV_GGUF_U32);
    put_u32(&b, 1);
    put_key(&b, "tokenizer.ggml.add_bos_token", KKV_GGUF_BOOL);
    put(&b, &(uint8_t){(uint8_t)o->add_bos}, 1);
    if (o->add_space >= 0) {
        put_key(&b, "tokenizer.ggml.add_space_prefix", KKV_GGUF_BOOL);
        put(&b, &(uint8_t){(uint8_t)o->add_space}, 1);
    }
    return b;
}

static kkv_status spm_tok(kkv_tok **t, const spm_opts *o) {
    buf b = spm_gguf(o);
    kkv_gguf *g = NULL;
    *t = NULL;
    kkv_status s = kkv_gguf_parse(&g, b.p, b.n);
    CHECK(s == KKV_OK, "synthetic SPM GGUF does not parse: %s", kkv_last_error());
    if (s == KKV_OK) s = kkv_tok_from_gguf(t, g);
    kkv_gguf_close(g); /* the tokenizer must not keep pointers into the file */
    memset(b.p, 0, b.n);
    free(b.p);
    return s;
}

/* Encodes s (no BOS) and compares with the expected token texts. */
static void spm_expect(const kkv_tok *t, const char *s, int special, const char *const *want,
                       int n_want) {
    int32_t ids[64];
    int n = -1;
    kkv_status st = kkv_tok_encode(t, ids, 64, &n, s, strlen(s), 0, special);
    int ok = st == KKV_OK && n == n_want;
    for (int i = 0; ok && i < n; i++) ok = ids[i] == kkv_tok_find(t, want[i]);
    CHECK(ok, "SPM '%s' (special=%d): status %d, %d tokens (want %d), first id %d", s, special,
          (int)st, n, n_want, n > 0 ? ids[0] : -1);
}

static long spm_decode(const kkv_tok *t, char *out, size_t cap, const int32_t *ids, int n) {
    size_t w = 0;
    for (int i = 0; i < n; i++) {
        size_t l = 0;
        if (kkv_tok_piece(t, out + w, cap - w, &l, ids[i]) != KKV_OK) return -1;
        w += l;
    }
    return (long)w;
}

static void test_spm(void) {
    spm_opts base = {0, -1, 0, 0, 0, 0, 0, 0, 0, 1};
    kkv_tok *t;
    kkv_status s = spm_tok(&t, &base);
    CHECK(s == KKV_OK, "synthetic SPM tokenizer: %s", kkv_last_error());
    if (s != KKV_OK) return;
    CHECK(kkv_tok_n_vocab(t) == N_SPM_BASE + 256, "SPM n_vocab %d", kkv_tok_n_vocab(t));
    CHECK(kkv_tok_bos(t) == 1 && kkv_tok_wants_bos(t) && kkv_tok_type(t, 5) == KKV_TOKTYPE_USER,
          "SPM bos %d wants %d", kkv_tok_bos(t), kkv_tok_wants_bos(t));

    /* Highest score first: abc -> a|bc although "ab" is a piece; ties leftmost. */
    spm_expect(t, "abc", 0, (const char *const[]){"a", "bc"}, 2);
    spm_expect(t, "ab", 0, (const char *const[]){"ab"}, 1);
    spm_expect(t, "bcd", 0, (const char *const[]){"bc", "d"}, 2);
    spm_expect(t, "abcd", 0, (const char *const[]){"a", "bc", "d"}, 3);
    /* Spaces are U+2581 and merge with what follows. */
    spm_expect(t, "a a", 0, (const char *const[]){"a", SPM_SP "a"}, 2);
    spm_expect(t, " b", 0, (const char *const[]){SPM_SP, "b"}, 2);
    /* A user-defined token always matches, spaces included; control tokens
     * only with special, longest first; otherwise they are text. */
    spm_expect(t, "a  b", 0, (const char *const[]){"a", "  ", "b"}, 3);
    spm_expect(t, "a   b", 0, (const char *const[]){"a", "  ", SPM_SP, "b"}, 4);
    spm_expect(t, "a<u>b", 0, (const char *const[]){"a", "<u>", "b"}, 3);
    spm_expect(t, "<ctl>xy", 1, (const char *const[]){"<ctl>x", "y"}, 2);
    spm_expect(t, "<ctl>", 1, (const char *const[]){"<ctl>"}, 1);
    spm_expect(t, "<s>", 0, (const char *const[]){"<0x3C>", "<0x73>", "<0x3E>"}, 3);
    spm_expect(t, "<s>", 1, (const char *const[]){"<s>"}, 1);
    /* An unused piece is split back into its halves; a piece built on it stays. */
    spm_expect(t, "xy", 0, (const char *const[]){"x", "y"}, 2);
    spm_expect(t, "xyz", 0, (const char *const[]){"xyz"}, 1);
    /* Byte fallback: characters that are no piece, and invalid UTF-8. */
    spm_expect(t, "\xC3\xA8", 0, (const char *const[]){"<0xC3>", "<0xA8>"}, 2);
    spm_expect(t, "\xC3\xA9", 0, (const char *const[]){"\xC3\xA9"}, 1);
    spm_expect(t, "a\xFF", 0, (const char *const[]){"a", "<0xFF>"}, 2);
    spm_expect(t, "", 0, NULL, 0);

    /* BOS, and pieces: U+2581 is a space, byte tokens their byte, control
     * tokens their text. */
    int32_t ids[64];
    int n = 0;
    CHECK(kkv_tok_encode(t, ids, 64, &n, "a", 1, 1, 0) == KKV_OK && n == 2 && ids[0] == 1,
          "SPM BOS: %d tokens, first %d", n, n ? ids[0] : -1);
    char out[512];
    int32_t pid[3] = {kkv_tok_find(t, SPM_SP "a"), kkv_tok_find(t, "<0x41>"), kkv_tok_find(t, "<s>")};
    long w = spm_decode(t, out, sizeof out, pid, 3);
    CHECK(w == 6 && !memcmp(out, " aA<s>", 6), "SPM pieces: %ld bytes '%.*s'", w, (int)(w > 0 ? w : 0),
          out);

    /* Round trips of random text (no U+2581, which decodes as a space), with
     * and without special parsing, and a too-small buffer reports the count. */
    static const char *const alpha[] = {"a", "b", "c", "x", "y", "z", " ", "  ", "\t", "\n", "<",
                                        ">", "<s>", "<ctl>", "<u>", "\xC3\xA9", "\xC3\xA8", "\xFF",
                                        "\xE2\x96", "\xF0\x9F\x98\x80"};
    tu_rng r = tu_rng_make(99);
    int rt_ok = 1;
    for (int it = 0; it < 300 && rt_ok; it++) {
        char text[256];
        size_t len = 0;
        int k = (int)(tu_u64(&r) % 30);
        for (int j = 0; j < k; j++) {
            const char *a = alpha[tu_u64(&r) % (sizeof alpha / sizeof alpha[0])];
            memcpy(text + len, a, strlen(a));
            len += strlen(a);
        }
        for (int sp = 0; sp < 2 && rt_ok; sp++) {
            n = 0;
            kkv_status st = kkv_tok_encode(t, ids, 64, &n, text, len, 0, sp);
            long dl = st == KKV_OK ? spm_decode(t, out, sizeof out, ids, n) : -1;
            rt_ok = dl == (long)len && !memcmp(out, text, len);
            int need = -1;
            if (rt_ok && n > 0)
                rt_ok = kkv_tok_encode(t, ids, n - 1, &need, text, len, 0, sp) ==
                            KKV_ERR_INVALID_ARG && need == n;
            CHECK(rt_ok, "SPM round trip %d (special=%d): status %d, %ld of %zu bytes", it, sp,
                  (int)st, dl, len);
        }
    }

    /* Work grows linearly with the text, even for runs of specials' prefixes. */
    size_t big = 1 << 15;
    char *txt = malloc(2 * big);
    int32_t *many = malloc(2 * big * sizeof *many);
    if (txt && many) {
        static const char unit[] = "ab <ct  xy\xC3\xA9<";
        for (size_t i = 0; i < 2 * big; i++) txt[i] = unit[i % (sizeof unit - 1)];
        uint64_t w0 = kkv_tok_work();
        kkv_status s1 = kkv_tok_encode(t, many, (int)(2 * big), &n, txt, big, 0, 1);
        uint64_t w1 = kkv_tok_work();
        kkv_status s2 = kkv_tok_encode(t, many, (int)(2 * big), &n, txt, 2 * big, 0, 1);
        uint64_t w2 = kkv_tok_work();
        double ratio = (double)(w2 - w1) / (double)(w1 - w0 ? w1 - w0 : 1);
        CHECK(s1 == KKV_OK && s2 == KKV_OK && ratio < 2.5, "SPM work ratio %.2f for twice the text",
              ratio);
    }
    free(txt);
    free(many);
    kkv_tok_free(t);

    /* The space prefix: before the text, after leading control tokens. */
    spm_opts o = base;
    o.add_space = 1;
    s = spm_tok(&t, &o);
    CHECK(s == KKV_OK, "SPM with add_space_prefix: %s", kkv_last_error());
    if (s == KKV_OK) {
        spm_expect(t, "a", 0, (const char *const[]){SPM_SP "a"}, 1);
        spm_expect(t, "<s>a", 1, (const char *const[]){"<s>", SPM_SP "a"}, 2);
        spm_expect(t, " a", 0, (const char *const[]){"  ", "a"}, 2);
        spm_expect(t, "<u>", 0, (const char *const[]){SPM_SP, "<u>"}, 2);
    }
    kkv_tok_free(t);
    o.add_space = -1; /* absent: llama.cpp's default, on */
    s = spm_tok(&t, &o);
    if (s == KKV_OK) spm_expect(t, "a", 0, (const char *const[]){SPM_SP "a"}, 1);
    kkv_tok_free(t);

    /* Without the byte token of 0xC3: <unk>, one per run of unknown characters. */
    o = base;
    o.drop_byte = 0xC3;
    s = spm_tok(&t, &o);
    CHECK(s == KKV_OK, "SPM without <0xC3>: %s", kkv_last_error());
    if (s == KKV_OK) spm_expect(t, "a\xC3\xA8\xC3\xA8" "b", 0, (const char *const[]){"a", "<unk>", "b"}, 3);
    kkv_tok_free(t);

    /* A pre-tokenizer override makes no sense here. */
    buf b = spm_gguf(&base);
    kkv_gguf *g = NULL;
    if (kkv_gguf_parse(&g, b.p, b.n) == KKV_OK) {
        t = NULL;
        s = kkv_tok_from_gguf_pre(&t, g, "gpt2");
        CHECK(s == KKV_ERR_UNSUPPORTED && !t, "SPM with --pre: status %d", (int)s);
        kkv_tok_free(t);
    }
    kkv_gguf_close(g);
    free(b.p);

    /* Malformed vocabularies fail at load with a one-line message. */
    static const struct {
        int field;
        const char *what, *says;
    } bad[] = {
        {0, "no scores", "tokenizer.ggml.scores"}, {1, "scores one short", "entries"},
        {2, "int32 scores", "element type"},     {3, "NaN score", "scores[7]"},
        {4, "no token types", "token_type"},     {5, "token type 9", "token_type[3]"},
        {6, "byte token <0xZZ>", "<0xHH>"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o = base;
        int *f[] = {&o.no_scores, &o.short_scores, &o.int_scores, &o.nan_score,
                    &o.no_types,  &o.bad_type,     &o.bad_byte_text};
        *f[bad[i].field] = 1;
        s = spm_tok(&t, &o);
        const char *msg = kkv_last_error();
        CHECK(s == KKV_ERR_FORMAT && !t && strstr(msg, bad[i].says) && !strchr(msg, '\n'),
              "SPM %s: status %d, message '%s'", bad[i].what, (int)s, msg);
        kkv_tok_free(t);
    }
}

/* The Gemma 3 vocabulary, when present: ids that sentencepiece gives (see
 * tests/oracle/test_tokenizer_spm.py) and the chat template's specials. */
static void test_gemma(void) {
    const char *path = KKV_SOURCE_DIR "/models/gemma-3-270m-q4_k_m.gguf";
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("%s not found: skipping the Gemma tokenizer checks\n", path);
        return;
    }
    fclose(f);
    kkv_gguf *g = NULL;
    kkv_tok *t = NULL;
    kkv_status s = kkv_gguf_open(&g, path);
    if (s == KKV_OK) s = kkv_tok_from_gguf(&t, g);
    kkv_gguf_close(g);
    CHECK(s == KKV_OK, "loading %s: %s", path, kkv_last_error());
    if (s != KKV_OK) return;
    CHECK(kkv_tok_n_vocab(t) == 262144 && kkv_tok_bos(t) == 2 && kkv_tok_eos(t) == 1 &&
              kkv_tok_eot(t) == 106 && kkv_tok_wants_bos(t),
          "gemma ids: n %d bos %d eos %d eot %d", kkv_tok_n_vocab(t), kkv_tok_bos(t), kkv_tok_eos(t),
          kkv_tok_eot(t));
    static const char text[] = "<start_of_turn>user\nHello world, this is  a test.<end_of_turn>\n";
    static const int32_t want[] = {2, 105, 2364, 107, 9259, 1902, 236764, 672, 563, 138, 236746,
                                   1594, 236761, 106, 107};
    int32_t ids[64];
    int n = 0;
    s = kkv_tok_encode(t, ids, 64, &n, text, sizeof text - 1, 1, 1);
    int ok = s == KKV_OK && n == (int)(sizeof want / sizeof want[0]);
    for (int i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    CHECK(ok, "gemma chat text: status %d, %d tokens", (int)s, n);
    kkv_tok_free(t);
}

/* ------------------------------------------------------------ real model */

/* Decodes ids into out (cap bytes); returns the length or -1. */
static long decode(const kkv_tok *t, char *out, size_t cap, const int32_t *ids, int n) {
    size_t w = 0;
    for (int i = 0; i < n; i++) {
        size_t pl = 0;
        if (kkv_tok_piece(t, out + w, cap - w, &pl, ids[i]) != KKV_OK) return -1;
        w += pl;
    }
    return (long)w;
}

/* encode -> decode gives back s (with special=0 and special=1). */
static void round_trip(const kkv_tok *t, const char *s, size_t n, const char *want, size_t wn) {
    int cap = (int)n + 2;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    char *out = malloc(4 * n + 16);
    for (int special = 0; special <= 1 && ids && out; special++) {
        int k = -1;
        kkv_status st = kkv_tok_encode(t, ids, cap, &k, s, n, 1, special);
        long w = st == KKV_OK ? decode(t, out, 4 * n + 16, ids, k) : -1;
        CHECK(w == (long)wn && !memcmp(out, want, wn), "round trip of %zu bytes '%.40s' (special %d): %ld bytes, status %d",
              n, s, special, w, (int)st);
    }
    free(ids);
    free(out);
}

typedef struct thread_job {
    const kkv_tok *t;
    const char    *text;
    size_t         len;
    int32_t       *ids; /* [len + 1] */
    int            n;
    kkv_status     st;
} thread_job;

static void *thread_encode(void *arg) {
    thread_job *j = arg;
    j->st = kkv_tok_encode(j->t, j->ids, (int)j->len + 1, &j->n, j->text, j->len, 0, 0);
    return NULL;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) *len = (size_t)sz;
    return p;
}

/* Bytes without a byte token in SmolLM2's vocabulary. */
static int lacks_token(uint8_t b) {
    return b == 0x04 || b == 0x06 || b == 0x13 || b == 0x14 || b == 0x16 || b == 0x1D ||
           b == 0xC0 || b == 0xC1 || b == 0xF1 || b == 0xF2 || b >= 0xF5;
}

static void test_model(const kkv_tok *t) {
    CHECK(kkv_tok_n_vocab(t) == 49152, "n_vocab %d", kkv_tok_n_vocab(t));
    CHECK(kkv_tok_bos(t) == 1 && kkv_tok_eos(t) == 2 && kkv_tok_eot(t) == 2, "bos %d eos %d eot %d",
          kkv_tok_bos(t), kkv_tok_eos(t), kkv_tok_eot(t));
    CHECK(!kkv_tok_wants_bos(t), "SmolLM2 does not add BOS");
    CHECK(!strcmp(kkv_tok_pre_name(t), "smollm"), "pre %s", kkv_tok_pre_name(t));
    CHECK(kkv_tok_find(t, "<|im_start|>") == 1 && kkv_tok_find(t, "<|im_end|>") == 2 &&
              kkv_tok_find(t, "<|endoftext|>") == 0 && kkv_tok_find(t, "no such token") == -1 &&
              kkv_tok_find(t, NULL) == -1,
          "kkv_tok_find");
    CHECK(kkv_tok_type(t, 1) == KKV_TOKTYPE_CONTROL && kkv_tok_type(t, 100) == KKV_TOKTYPE_NORMAL &&
              kkv_tok_type(t, -1) == -1 && kkv_tok_type(t, 49152) == -1,
          "kkv_tok_type");

    /* Ids cross-checked with HF tokenizers (tests/oracle/test_tokenizer.py). */
    int32_t ids[64];
    int n = 0;
    const char *hw = "Hello world 123 <|im_end|>";
    kkv_status st = kkv_tok_encode(t, ids, 64, &n, hw, strlen(hw), 1, 1);
    const int32_t want[] = {19556, 905, 216, 33, 34, 35, 216, 2};
    CHECK(st == KKV_OK && n == 8 && !memcmp(ids, want, sizeof want), "'%s': %d tokens", hw, n);
    st = kkv_tok_encode(t, ids, 64, &n, hw, strlen(hw), 1, 0);
    int has_special = 0;
    for (int i = 0; i < n; i++) has_special |= ids[i] < 17;
    CHECK(st == KKV_OK && n > 8 && !has_special, "special text without `special` is plain text");

    /* Chat template pieces. */
    const char *chat = "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n";
    st = kkv_tok_encode(t, ids, 64, &n, chat, strlen(chat), 1, 1);
    int c1 = 0, c2 = 0;
    for (int i = 0; i < n; i++) {
        c1 += ids[i] == 1;
        c2 += ids[i] == 2;
    }
    CHECK(st == KKV_OK && ids[0] == 1 && c1 == 2 && c2 == 1, "chat: %d tokens, %d im_start, %d im_end",
          n, c1, c2);

    /* Buffer sizes. */
    n = -1;
    st = kkv_tok_encode(t, ids, 1, &n, "Hello world", 11, 1, 0);
    CHECK(st == KKV_ERR_INVALID_ARG && n == 2, "cap 1: status %d, n_out %d (want 2)", (int)st, n);
    n = -1;
    st = kkv_tok_encode(t, NULL, 0, &n, "Hello world", 11, 1, 0);
    CHECK(st == KKV_ERR_INVALID_ARG && n == 2, "cap 0: status %d, n_out %d", (int)st, n);
    st = kkv_tok_encode(t, ids, 2, &n, "Hello world", 11, 1, 0);
    CHECK(st == KKV_OK && n == 2, "exact cap");
    st = kkv_tok_encode(t, NULL, 0, &n, NULL, 0, 1, 1);
    CHECK(st == KKV_OK && n == 0, "empty text: status %d n %d", (int)st, n);
    CHECK(kkv_tok_encode(t, ids, -1, &n, "a", 1, 0, 0) == KKV_ERR_INVALID_ARG, "negative cap");
    CHECK(kkv_tok_encode(t, ids, 4, NULL, "a", 1, 0, 0) == KKV_ERR_INVALID_ARG, "NULL n_out");
    CHECK(kkv_tok_encode(t, ids, 4, &n, NULL, 3, 0, 0) == KKV_ERR_INVALID_ARG, "NULL text");
    char piece[64];
    size_t pl = 0;
    st = kkv_tok_piece(t, piece, sizeof piece, &pl, 905);
    CHECK(st == KKV_OK && pl == 6 && !memcmp(piece, " world", 6), "piece of 905: '%.*s'", (int)pl, piece);
    pl = 0;
    st = kkv_tok_piece(t, piece, 3, &pl, 905);
    CHECK(st == KKV_ERR_INVALID_ARG && pl == 6, "piece cap 3: status %d, n_out %zu", (int)st, pl);
    CHECK(kkv_tok_piece(t, piece, 64, &pl, -1) == KKV_ERR_INVALID_ARG &&
              kkv_tok_piece(t, piece, 64, &pl, 49152) == KKV_ERR_INVALID_ARG,
          "invalid token ids");
    st = kkv_tok_piece(t, piece, sizeof piece, &pl, 2);
    CHECK(st == KKV_OK && pl == 10 && !memcmp(piece, "<|im_end|>", 10), "control piece is its text");

    /* Every single byte comes back, except those without a token in this
     * vocabulary (checked with the gguf package), which become U+FFFD. */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        round_trip(t, &c, 1, lacks_token((uint8_t)b) ? "\xEF\xBF\xBD" : &c,
                   lacks_token((uint8_t)b) ? 3 : 1);
    }

    static const char *const texts[] = {
        "The quick brown fox jumps over the lazy dog.",
        "  leading and trailing spaces   ",
        "tabs\tand\nnewlines\r\n\n\n   \t",
        "It's, we'll, they've, I'm, you'd, DON'T",
        "numbers 0 12 345 6789 3.14159 1e-10 0xFF",
        "caf\xC3\xA9 na\xC3\xAFve \xC3\x85ngstr\xC3\xB6m Stra\xC3\x9F" "e",
        "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 "
        "\xE4\xB8\xAD\xE6\x96\x87 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",
        "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9"
        "\xE2\x80\x8D\xF0\x9F\x91\xA7",
        "int main(void) { return x->y[3] != 0 && z; } // comment",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n",
        "<|im_start<|im_end|>|>",
        "\xD7\xA2\xD7\x91\xD7\xA8\xD7\x99\xD7\xAA \xD8\xA7\xD9\x84\xD8\xB9\xD8\xB1\xD8\xA8\xD9\x8A\xD8\xA9",
        "U+0000 inside: a\0b",
        "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        size_t l = strlen(texts[i]) + (strstr(texts[i], "U+0000") ? 2 : 0);
        round_trip(t, texts[i], l, texts[i], l);
    }

    /* Invalid UTF-8 mixed with text (all these bytes have tokens): exact. */
    static const char inv[] = "ok\x80\xBF \xC3(\xE2\x82 \xED\xA0\x80 \xF0\x9F\x98 \xF4\x90\x80\x80 end\xC3";
    round_trip(t, inv, sizeof inv - 1, inv, sizeof inv - 1);

    /* Random bytes: never fails; decode equals the input where every valid
     * character or invalid byte with a byte lacking a token is U+FFFD. */
    tu_rng r = tu_rng_make(99);
    char in[96], want_s[3 * 96];
    for (int it = 0; it < 400 && !tu_failed(); it++) {
        size_t m = (size_t)tu_int(&r, 96), wn = 0;
        for (size_t i = 0; i < m; i++) {
            int k = tu_int(&r, 4);
            in[i] = (char)(k == 0 ? ' ' : k == 1 ? 0x80 + tu_int(&r, 64) : tu_int(&r, 256));
        }
        for (size_t i = 0; i < m;) {
            size_t l = kkv_utf8_valid_len((const unsigned char *)in + i, m - i), bad = 0;
            if (l == 0) l = 1;
            for (size_t k = 0; k < l; k++) bad |= lacks_token((uint8_t)in[i + k]);
            if (bad) {
                memcpy(want_s + wn, "\xEF\xBF\xBD", 3);
                wn += 3;
            } else {
                memcpy(want_s + wn, in + i, l);
                wn += l;
            }
            i += l;
        }
        round_trip(t, in, m, want_s, wn);
    }
    /* A valid character with a missing byte (U+44444, lead byte F1). */
    round_trip(t, "ab\xF1\x84\x91\x84" "cd", 8, "ab\xEF\xBF\xBD" "cd", 7);

    /* Streaming decode of generated pieces, byte by byte: the assembled output
     * is exactly the text and never holds a partial character. */
    const char *uni = texts[7];
    st = kkv_tok_encode(t, ids, 64, &n, uni, strlen(uni), 0, 0);
    kkv_utf8_stream us;
    kkv_utf8_stream_init(&us);
    char acc[256];
    size_t an = 0;
    int partial = 0;
    for (int i = 0; st == KKV_OK && i < n; i++) {
        kkv_tok_piece(t, piece, sizeof piece, &pl, ids[i]);
        for (size_t k = 0; k < pl; k++) {
            an += kkv_utf8_stream_feed(&us, acc + an, piece + k, 1);
            partial |= !all_valid(acc, an);
        }
    }
    an += kkv_utf8_stream_flush(&us, acc + an);
    CHECK(st == KKV_OK && an == strlen(uni) && !memcmp(acc, uni, an) && !partial,
          "streamed pieces: %zu bytes, partial %d", an, partial);

    /* Long runs: one huge chunk each for the regex and the merge loop. The
     * cost must grow linearly: 8x the text may take at most 10x the work
     * (counted steps, not a clock, so a loaded machine cannot fail it). */
    size_t big = 1 << 20;
    char *run = malloc(big);
    int32_t *rid = malloc((big + 1) * sizeof *rid);
    const char fill[] = {' ', 'a', '\n', '7', '!'};
    for (size_t f = 0; run && rid && f < sizeof fill; f++) {
        memset(run, fill[f], big);
        uint64_t w0 = kkv_tok_work();
        st = kkv_tok_encode(t, rid, (int)big + 1, &n, run, big / 8, 0, 0);
        uint64_t w_small = kkv_tok_work() - w0;
        w0 = kkv_tok_work();
        if (st == KKV_OK) st = kkv_tok_encode(t, rid, (int)big + 1, &n, run, big, 0, 0);
        uint64_t w_big = kkv_tok_work() - w0;
        long w = -1;
        if (st == KKV_OK) {
            char *back = malloc(big);
            w = back ? decode(t, back, big, rid, n) : -1;
            if (w == (long)big && memcmp(back, run, big)) w = -2;
            free(back);
        }
        CHECK(st == KKV_OK && w == (long)big && w_big <= 10 * (w_small + 16),
              "1 MiB of '%c': status %d, work %llu for 1 MiB vs %llu for 128 KiB, decode %ld",
              fill[f] == '\n' ? 'N' : fill[f], (int)st, (unsigned long long)w_big,
              (unsigned long long)w_small, w);
    }
    free(run);
    free(rid);

    /* Work on real prose (bounded per byte), and the same ids from two
     * threads at once. The time is printed for information only. */
    size_t hlen = 0;
    char *hb = read_all(KKV_SOURCE_DIR "/data/handbook.txt", &hlen);
    if (!hb) {
        printf("note: data/handbook.txt not found, speed test skipped\n");
        return;
    }
    int32_t *h0 = malloc((hlen + 1) * sizeof *h0);
    int hn = 0;
    double t0 = now_s();
    uint64_t hw0 = kkv_tok_work();
    st = h0 ? kkv_tok_encode(t, h0, (int)hlen + 1, &hn, hb, hlen, 0, 0) : KKV_ERR_NOMEM;
    uint64_t hwork = kkv_tok_work() - hw0;
    double dt = now_s() - t0;
    printf("handbook.txt: %zu bytes -> %d tokens in %.3f s (%.2f MB/s), %.2f steps/byte\n", hlen,
           hn, dt, (double)hlen / dt / 1e6, (double)hwork / (double)hlen);
    CHECK(st == KKV_OK && hwork <= 8 * (uint64_t)hlen, "handbook: status %d, %llu steps for %zu bytes",
          (int)st, (unsigned long long)hwork, hlen);
    thread_job jobs[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = (thread_job){t, hb, hlen, malloc((hlen + 1) * sizeof(int32_t)), 0, KKV_ERR_NOMEM};
        if (jobs[i].ids) pthread_create(&th[i], NULL, thread_encode, &jobs[i]);
    }
    for (int i = 0; i < 2; i++) {
        if (jobs[i].ids) pthread_join(th[i], NULL);
        CHECK(jobs[i].st == KKV_OK && jobs[i].n == hn && h0 &&
                  !memcmp(jobs[i].ids, h0, (size_t)hn * sizeof *h0),
              "thread %d: status %d, %d tokens (want %d)", i, (int)jobs[i].st, jobs[i].n, hn);
        free(jobs[i].ids);
    }
    free(h0);
    free(hb);
}

int main(void) {
    test_byte_alphabet();
    test_utf8_stream();
    test_synthetic();
    test_spm();
    test_gemma();

    const char *path = getenv("KKV_MODEL");
    if (!path || !*path) path = KKV_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *req = getenv("KKV_REQUIRE_MODEL");
    FILE *f = fopen(path, "rb");
    if (!f) {
        int required = req && !strcmp(req, "1");
        printf("model %s not found%s\n", path, required ? " (KKV_REQUIRE_MODEL=1)" : ": skipping its tests");
        CHECK(!required, "model required but missing");
        int rc = tu_summary();
        return rc ? rc : TU_SKIP;
    }
    fclose(f);
    kkv_gguf *g = NULL;
    kkv_tok *t = NULL;
    kkv_status s = kkv_gguf_open(&g, path);
    if (s == KKV_OK) s = kkv_tok_from_gguf(&t, g);
    kkv_gguf_close(g);
    CHECK(s == KKV_OK, "loading %s: %s", path, kkv_last_error());
    if (s == KKV_OK) test_model(t);
    kkv_tok_free(t);
    return tu_summary();
}
