/* Byte-level BPE (GPT-2 style) over the GGUF vocabulary.
 *
 * Pipeline of kkv_tok_encode:
 *   1. with `special`, split out exact matches of control/user-defined token
 *      texts (leftmost, then longest);
 *   2. split the rest into maximal valid UTF-8 runs; every byte that is not
 *      part of a valid sequence (overlong, surrogate, truncated, > U+10FFFF)
 *      becomes its own chunk: its byte token. PCRE2 then only ever sees
 *      valid UTF-8, so it runs with PCRE2_NO_UTF_CHECK (checking once per match
 *      call would make long texts quadratic);
 *   3. pre-tokenize each run with the regex chain of tokenizer.ggml.pre (each
 *      regex splits every piece of the previous one into matches and the gaps
 *      between them, as HF's Split(behavior=Isolated) does);
 *   4. BPE each chunk from its bytes: repeatedly merge the adjacent pair with
 *      the lowest merge rank, leftmost first on ties (a heap with lazy
 *      invalidation, O(n log n) per chunk).
 * Bytes the vocabulary has no token for (SmolLM2 lacks C0, C1, F5..FF, but
 * also 04, 06, 13, 14, 16, 1D, F1, F2) are replaced by the tokens of U+FFFD:
 * a lone invalid byte, or the whole character it belongs to. Nothing is
 * dropped and no control token is inserted; such text does not round-trip.
 *
 * Token texts in the vocabulary spell bytes with the GPT-2 alphabet (byte ->
 * code point, e.g. ' ' -> U+0120 'Ġ'). Pieces returned by kkv_tok_piece are
 * raw bytes; control and user-defined tokens return their text verbatim
 * (e.g. "<|im_end|>"), so that decode(encode(x, special=1)) == x. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/tokenizer.h"

#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "kittykv_model.h"
#include "model/tokenizer_spm.h"

/* ------------------------------------------------------------ byte alphabet */

/* Bytes that are printable Latin-1 stand for themselves; the other 68 are
 * numbered from U+0100 up, in byte order. */
static int byte_is_self(unsigned b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* The 68 others are 0..32, 127..160 and 173, numbered from U+0100 in order. */
uint32_t kkv_tok_byte_to_cp(uint8_t b) {
    if (byte_is_self(b)) return b;
    if (b <= 32) return 256u + b;
    if (b <= 160) return 256u + 33 + (b - 127u);
    return 256u + 67; /* 173, the soft hyphen */
}

int kkv_tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_self(cp) ? (int)cp : -1;
    if (cp < 256 + 33) return (int)(cp - 256);
    if (cp < 256 + 67) return (int)(cp - 256 - 33 + 127);
    return cp == 256 + 67 ? 173 : -1;
}

/* ------------------------------------------------------------ UTF-8 */

/* Sequences are validated by kkv_utf8_valid_len (utf8.c): no overlongs,
 * surrogates or > U+10FFFF, the same rules as PCRE2's check. */
static size_t utf8_seq(const uint8_t *p, size_t n) { return kkv_utf8_valid_len(p, n); }

/* Decodes one valid sequence of length len. */
static uint32_t utf8_cp(const uint8_t *p, size_t len) {
    if (len == 1) return p[0];
    uint32_t cp = p[0] & (0x7F >> len);
    for (size_t i = 1; i < len; i++) cp = (cp << 6) | (p[i] & 0x3F);
    return cp;
}

/* ------------------------------------------------------------ pre-tokenizers */

#define RE_GPT2                                                                \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RE_LLAMA3                                                              \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"   \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"        \
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_DIGIT "\\p{N}"

#define MAX_RE 2

typedef struct pre_def {
    const char *name;
    const char *re[MAX_RE]; /* applied in order; NULL ends the chain */
    int ignore_merges;      /* a chunk that is a whole token is emitted as is */
} pre_def;

/* Names as llama.cpp's converter writes them to tokenizer.ggml.pre. The
 * smollm/starcoder family is HF's Sequence[Digits(individual_digits),
 * ByteLevel(use_regex)]; llama3 and qwen2 are Split(regex) + ByteLevel. */
static const pre_def pre_defs[] = {
    {"default", {RE_GPT2, NULL}, 0},
    {"gpt2", {RE_GPT2, NULL}, 0},
    {"smollm", {RE_DIGIT, RE_GPT2}, 0},
    {"starcoder", {RE_DIGIT, RE_GPT2}, 0},
    {"refact", {RE_DIGIT, RE_GPT2}, 0},
    {"llama3", {RE_LLAMA3, NULL}, 1},
    {"llama-bpe", {RE_LLAMA3, NULL}, 1},
    {"qwen2", {RE_QWEN2, NULL}, 0},
};
#define N_PRE ((int)(sizeof pre_defs / sizeof pre_defs[0]))

static const char *const pre_names[N_PRE + 1] = {
    "default", "gpt2", "smollm", "starcoder", "refact", "llama3", "llama-bpe", "qwen2", NULL,
};

const char *const *kkv_tok_pre_names(void) {
    return pre_names;
}

/* ------------------------------------------------------------ the tokenizer */

typedef struct span {
    uint32_t off, len; /* into an arena */
} span;

typedef struct pair_slot {
    uint64_t key;  /* (left id << 32) | right id; PAIR_EMPTY if free */
    int32_t  rank; /* position in tokenizer.ggml.merges */
    int32_t  id;   /* the merged token */
} pair_slot;
#define PAIR_EMPTY UINT64_MAX

struct kkv_tok {
    int      n_vocab;
    char    *text_arena;  /* [sum of text lengths] GGUF token texts */
    span    *text;        /* [n_vocab] */
    char    *piece_arena; /* [sum of piece lengths] raw bytes of each token */
    span    *piece;       /* [n_vocab] */
    int8_t  *type;        /* [n_vocab] KKV_TOKTYPE_* */
    int32_t *tmap;        /* [tmap_mask + 1] open addressing text -> id, -1 free */
    uint32_t tmap_mask;
    pair_slot *pmap;      /* [pmap_mask + 1] open addressing (left, right) -> merge */
    uint32_t   pmap_mask;
    int32_t  byte_id[256]; /* token of each single byte, -1 if the vocab lacks it */
    int32_t  bos, eos, eot;
    int      wants_bos;
    int32_t *special;      /* [n_special] control/user tokens, longest text first */
    int      n_special;
    uint8_t  special_first[256]; /* 1 if some special text starts with this byte */
    const pre_def *pre;
    pcre2_code *re[MAX_RE]; /* [n_re] */
    int         n_re;
    kkv_spm    *spm; /* a SentencePiece vocabulary: everything above but the ids unused */
};

static uint32_t hash_bytes(const char *p, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}

static uint32_t hash_pair(uint64_t key) {
    return (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 32);
}

static int32_t tmap_get(const kkv_tok *t, const char *s, size_t n) {
    for (uint32_t i = hash_bytes(s, n) & t->tmap_mask;; i = (i + 1) & t->tmap_mask) {
        int32_t id = t->tmap[i];
        if (id < 0) return -1;
        if (t->text[id].len == n && !memcmp(t->text_arena + t->text[id].off, s, n)) return id;
    }
}

static const pair_slot *pmap_get(const kkv_tok *t, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint32_t i = hash_pair(key) & t->pmap_mask;; i = (i + 1) & t->pmap_mask) {
        const pair_slot *s = &t->pmap[i];
        if (s->key == key) return s;
        if (s->key == PAIR_EMPTY) return NULL;
    }
}

/* Smallest power of two >= 2n (load factor <= 1/2), at least 16. */
static uint32_t table_size(uint64_t n) {
    uint32_t sz = 16;
    while (sz < 2 * n) sz <<= 1;
    return sz;
}

void kkv_tok_free(kkv_tok *t) {
    if (!t) return;
    for (int i = 0; i < t->n_re; i++) pcre2_code_free(t->re[i]);
    free(t->text_arena);
    free(t->text);
    free(t->piece_arena);
    free(t->piece);
    free(t->type);
    free(t->tmap);
    free(t->pmap);
    free(t->special);
    kkv_spm_free(t->spm);
    free(t);
}

/* A required or typed metadata lookup that failed: the gguf getter's message
 * already names the key and the problem; a missing key gets its own. */
static kkv_status meta_fail(kkv_status s, const char *key) {
    if (s == KKV_ERR_NOT_FOUND)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer: the file has no '%s'", key);
    return s == KKV_ERR_NOMEM ? s : KKV_ERR_FORMAT;
}

/* Reads an optional token id; -1 if absent. */
static kkv_status read_id(const kkv_gguf *g, const char *key, int n_vocab, int32_t *out) {
    int64_t v;
    kkv_status s = kkv_gguf_get_i64(g, key, &v);
    if (s == KKV_ERR_NOT_FOUND) {
        *out = -1;
        return KKV_OK;
    }
    if (s != KKV_OK) return meta_fail(s, key);
    if (v < 0 || v >= n_vocab)
        return kkv_fail(KKV_ERR_FORMAT, "%s = %lld is not a token id (vocabulary of %d)", key,
                        (long long)v, n_vocab);
    *out = (int32_t)v;
    return KKV_OK;
}

static kkv_status load_types(kkv_tok *t, const kkv_gguf *g) {
    kkv_gguf_type et;
    const void *data;
    uint64_t n;
    kkv_status s = kkv_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &data, &n);
    if (s == KKV_ERR_NOT_FOUND) { /* all normal: a plain BPE vocabulary */
        memset(t->type, KKV_TOKTYPE_NORMAL, (size_t)t->n_vocab);
        return KKV_OK;
    }
    if (s != KKV_OK) return meta_fail(s, "tokenizer.ggml.token_type");
    if (n != (uint64_t)t->n_vocab)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.token_type has %llu entries, tokens %d",
                        (unsigned long long)n, t->n_vocab);
    if (et != KKV_GGUF_I32 && et != KKV_GGUF_U32)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.token_type: element type %d, want int32",
                        (int)et);
    for (int i = 0; i < t->n_vocab; i++) {
        int32_t v;
        memcpy(&v, (const char *)data + 4 * (size_t)i, 4);
        /* Unknown types behave as normal tokens rather than failing the model. */
        t->type[i] = (int8_t)(v >= 1 && v <= 6 ? v : KKV_TOKTYPE_NORMAL);
    }
    return KKV_OK;
}

/* Copies the token texts, builds the text map and the raw-byte pieces. */
static kkv_status load_vocab(kkv_tok *t, const kkv_gguf_str *toks) {
    uint64_t total = 0;
    for (int i = 0; i < t->n_vocab; i++) total += toks[i].len;
    if (total >= UINT32_MAX / 2)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.tokens: %llu bytes of text is too much",
                        (unsigned long long)total);
    t->text_arena = malloc(total + 1);
    t->piece_arena = malloc(total + 1); /* a piece is never longer than its text */
    t->text = malloc((size_t)t->n_vocab * sizeof *t->text);
    t->piece = malloc((size_t)t->n_vocab * sizeof *t->piece);
    uint32_t tsz = table_size((uint64_t)t->n_vocab);
    t->tmap = malloc((size_t)tsz * sizeof *t->tmap);
    if (!t->text_arena || !t->piece_arena || !t->text || !t->piece || !t->tmap)
        return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory for %d tokens", t->n_vocab);
    t->tmap_mask = tsz - 1;
    memset(t->tmap, 0xFF, (size_t)tsz * sizeof *t->tmap);

    uint32_t toff = 0, poff = 0;
    for (int i = 0; i < t->n_vocab; i++) {
        const uint8_t *s = (const uint8_t *)toks[i].ptr;
        uint32_t n = (uint32_t)toks[i].len;
        if (n) memcpy(t->text_arena + toff, s, n);
        t->text[i] = (span){toff, n};
        toff += n;

        /* Raw bytes: byte-level decode for ordinary tokens. Control/user tokens
         * (and any text outside the byte alphabet) stand for their own text. */
        int decoded = 0;
        if (t->type[i] != KKV_TOKTYPE_CONTROL && t->type[i] != KKV_TOKTYPE_USER) {
            uint32_t q = poff;
            size_t k = 0;
            while (k < n) {
                size_t l = utf8_seq(s + k, n - k);
                int b = l ? kkv_tok_cp_to_byte(utf8_cp(s + k, l)) : -1;
                if (b < 0) break;
                t->piece_arena[q++] = (char)b;
                k += l;
            }
            if (k == n) {
                t->piece[i] = (span){poff, q - poff};
                poff = q;
                decoded = 1;
            }
        }
        if (!decoded) {
            if (n) memcpy(t->piece_arena + poff, s, n);
            t->piece[i] = (span){poff, n};
            poff += n;
        }

        /* First id wins for duplicate texts. */
        if (tmap_get(t, (const char *)s, n) < 0) {
            uint32_t h = hash_bytes((const char *)s, n) & t->tmap_mask;
            while (t->tmap[h] >= 0) h = (h + 1) & t->tmap_mask;
            t->tmap[h] = i;
        }
    }

    for (unsigned b = 0; b < 256; b++) {
        char u[2];
        uint32_t cp = kkv_tok_byte_to_cp((uint8_t)b);
        size_t ul = 1;
        if (cp < 0x80) u[0] = (char)cp;
        else {
            u[0] = (char)(0xC0 | (cp >> 6));
            u[1] = (char)(0x80 | (cp & 0x3F));
            ul = 2;
        }
        t->byte_id[b] = tmap_get(t, u, ul);
    }
    return KKV_OK;
}

static kkv_status load_merges(kkv_tok *t, const kkv_gguf *g) {
    const kkv_gguf_str *m;
    uint64_t n;
    kkv_status s = kkv_gguf_get_str_arr(g, "tokenizer.ggml.merges", &m, &n);
    if (s != KKV_OK)
        return meta_fail(s, "tokenizer.ggml.merges");
    if (n > INT32_MAX / 4)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.merges: %llu entries is too many",
                        (unsigned long long)n);
    uint32_t sz = table_size(n);
    t->pmap = malloc((size_t)sz * sizeof *t->pmap);
    if (!t->pmap) return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory for merges");
    t->pmap_mask = sz - 1;
    for (uint32_t i = 0; i < sz; i++) t->pmap[i].key = PAIR_EMPTY;

    char *buf = NULL; /* [cap] "ab" of the merge "a b" */
    size_t cap = 0;
    for (uint64_t r = 0; r < n; r++) {
        const char *p = m[r].ptr;
        size_t len = (size_t)m[r].len;
        /* The separator is the first space after the first character: token
         * texts of a byte-level vocabulary spell ' ' as U+0120. */
        const char *sp = len > 1 ? memchr(p + 1, ' ', len - 1) : NULL;
        if (!sp) {
            free(buf);
            char shown[80];
            return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.merges[%llu] has no space: '%s'",
                            (unsigned long long)r, kkv_printable(shown, sizeof shown, p, len));
        }
        size_t la = (size_t)(sp - p), lb = len - la - 1;
        if (la + lb > cap) {
            free(buf);
            cap = 2 * (la + lb);
            buf = malloc(cap);
            if (!buf) return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory for merges");
        }
        memcpy(buf, p, la);
        memcpy(buf + la, sp + 1, lb);
        int32_t a = tmap_get(t, p, la), b = tmap_get(t, sp + 1, lb), ab = tmap_get(t, buf, la + lb);
        /* A merge whose parts or result are not tokens can never apply: skip
         * it rather than reject the model. */
        if (a < 0 || b < 0 || ab < 0) continue;
        uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
        uint32_t h = hash_pair(key) & t->pmap_mask;
        while (t->pmap[h].key != PAIR_EMPTY && t->pmap[h].key != key) h = (h + 1) & t->pmap_mask;
        if (t->pmap[h].key == key) continue; /* a repeated pair keeps its first rank */
        t->pmap[h] = (pair_slot){key, (int32_t)r, ab};
    }
    free(buf);
    return KKV_OK;
}

/* Longer text first (so the longest match wins), then lower id. */
static int cmp_special(const kkv_tok *t, int32_t x, int32_t y) {
    if (t->text[x].len != t->text[y].len) return t->text[x].len > t->text[y].len ? -1 : 1;
    return x < y ? -1 : x > y;
}

static kkv_status load_specials(kkv_tok *t) {
    int n = 0;
    for (int i = 0; i < t->n_vocab; i++)
        n += (t->type[i] == KKV_TOKTYPE_CONTROL || t->type[i] == KKV_TOKTYPE_USER) &&
             t->text[i].len > 0;
    t->special = malloc((size_t)(n ? n : 1) * sizeof *t->special);
    if (!t->special) return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory");
    n = 0;
    for (int i = 0; i < t->n_vocab; i++)
        if ((t->type[i] == KKV_TOKTYPE_CONTROL || t->type[i] == KKV_TOKTYPE_USER) &&
            t->text[i].len > 0) {
            t->special[n++] = i;
            t->special_first[(uint8_t)t->text_arena[t->text[i].off]] = 1;
        }
    t->n_special = n;
    /* Insertion sort: the list is short and this keeps it reentrant. */
    for (int i = 1; i < n; i++) {
        int32_t v = t->special[i];
        int j = i;
        while (j > 0 && cmp_special(t, t->special[j - 1], v) > 0) {
            t->special[j] = t->special[j - 1];
            j--;
        }
        t->special[j] = v;
    }
    return KKV_OK;
}

static kkv_status compile_pre(kkv_tok *t) {
    for (int i = 0; i < MAX_RE && t->pre->re[i]; i++) {
        int err;
        PCRE2_SIZE off;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)t->pre->re[i], PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
        if (!re) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(err, msg, sizeof msg);
            return kkv_fail(KKV_ERR_UNSUPPORTED, "pre-tokenizer '%s': PCRE2 cannot compile its regex: %s",
                            t->pre->name, (const char *)msg);
        }
        /* JIT is an optional speed-up: without it pcre2_match interprets. */
        (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        t->re[t->n_re++] = re;
    }
    return KKV_OK;
}

/* The special ids and the BOS default, shared by both tokenizer kinds. */
static kkv_status read_ids(kkv_tok *t, const kkv_gguf *g) {
    KKV_TRY(read_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos));
    KKV_TRY(read_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos));
    KKV_TRY(read_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot));
    if (t->eot < 0) {
        static const char *const eot_names[] = {"<|im_end|>", "<|eot_id|>", "<end_of_turn>",
                                                "<|end|>", "<|end_of_turn|>"};
        for (size_t i = 0; i < sizeof eot_names / sizeof eot_names[0] && t->eot < 0; i++)
            t->eot = kkv_tok_find(t, eot_names[i]);
    }
    int wb = 0;
    kkv_status s = kkv_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &wb);
    if (s != KKV_OK && s != KKV_ERR_NOT_FOUND)
        return meta_fail(s, "tokenizer.ggml.add_bos_token");
    t->wants_bos = s == KKV_OK && wb;
    return KKV_OK;
}

static kkv_status build(kkv_tok *t, const kkv_gguf *g, const char *pre) {
    kkv_gguf_str model;
    kkv_status s = kkv_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (s == KKV_ERR_NOT_FOUND) return kkv_fail(KKV_ERR_FORMAT, "no tokenizer.ggml.model in the file");
    if (s != KKV_OK) return meta_fail(s, "tokenizer.ggml.model");
    if (kkv_gguf_str_eq(model, "llama")) { /* SentencePiece: tokenizer_spm.c */
        if (pre)
            return kkv_fail(KKV_ERR_UNSUPPORTED, "pre-tokenizer '%s': a SentencePiece vocabulary "
                            "has no pre-tokenizer to override", pre);
        KKV_TRY(kkv_spm_from_gguf(&t->spm, g));
        t->n_vocab = kkv_spm_n_vocab(t->spm);
        return read_ids(t, g);
    }
    if (!kkv_gguf_str_eq(model, "gpt2")) {
        char shown[64];
        return kkv_fail(KKV_ERR_UNSUPPORTED,
                        "tokenizer model '%s' is not supported (byte-level BPE 'gpt2' and "
                        "SentencePiece 'llama' are)",
                        kkv_printable(shown, sizeof shown, model.ptr, model.len));
    }

    kkv_gguf_str pre_s = {"default", 7};
    if (pre) pre_s = (kkv_gguf_str){pre, strlen(pre)};
    else {
        s = kkv_gguf_get_str(g, "tokenizer.ggml.pre", &pre_s);
        if (s == KKV_ERR_NOT_FOUND) pre_s = (kkv_gguf_str){"default", 7};
        else if (s != KKV_OK) return meta_fail(s, "tokenizer.ggml.pre");
    }
    for (int i = 0; i < N_PRE && !t->pre; i++)
        if (kkv_gguf_str_eq(pre_s, pre_defs[i].name)) t->pre = &pre_defs[i];
    if (!t->pre) {
        char known[160] = "";
        for (int i = 0; i < N_PRE; i++) {
            size_t k = strlen(known);
            snprintf(known + k, sizeof known - k, "%s%s", i ? " " : "", pre_defs[i].name);
        }
        char shown[64];
        return kkv_fail(KKV_ERR_UNSUPPORTED, "pre-tokenizer '%s' is not supported (known: %s)",
                        kkv_printable(shown, sizeof shown, pre_s.ptr, pre_s.len), known);
    }

    const kkv_gguf_str *toks;
    uint64_t n;
    s = kkv_gguf_get_str_arr(g, "tokenizer.ggml.tokens", &toks, &n);
    if (s != KKV_OK) return meta_fail(s, "tokenizer.ggml.tokens");
    if (n == 0 || n > INT32_MAX / 4)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries",
                        (unsigned long long)n);
    t->n_vocab = (int)n;
    t->type = malloc((size_t)n);
    if (!t->type) return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory");
    KKV_TRY(load_types(t, g));
    KKV_TRY(load_vocab(t, toks));
    KKV_TRY(load_merges(t, g));
    KKV_TRY(load_specials(t));
    KKV_TRY(read_ids(t, g));
    return compile_pre(t);
}

kkv_status kkv_tok_from_gguf_pre(kkv_tok **out, const kkv_gguf *g, const char *pre) {
    if (!out || !g) return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tok_from_gguf: NULL argument");
    kkv_tok *t = calloc(1, sizeof *t);
    if (!t) return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory");
    kkv_status s = build(t, g, pre);
    if (s != KKV_OK) {
        kkv_tok_free(t);
        return s;
    }
    *out = t;
    return KKV_OK;
}

kkv_status kkv_tok_from_gguf(kkv_tok **out, const kkv_gguf *g) {
    return kkv_tok_from_gguf_pre(out, g, NULL);
}

int     kkv_tok_n_vocab(const kkv_tok *t) { return t ? t->n_vocab : 0; }
int32_t kkv_tok_bos(const kkv_tok *t) { return t ? t->bos : -1; }
int32_t kkv_tok_eos(const kkv_tok *t) { return t ? t->eos : -1; }
int32_t kkv_tok_eot(const kkv_tok *t) { return t ? t->eot : -1; }
int     kkv_tok_wants_bos(const kkv_tok *t) { return t ? t->wants_bos : 0; }
const char *kkv_tok_pre_name(const kkv_tok *t) {
    return !t ? "" : t->spm ? "none (SentencePiece)" : t->pre->name;
}

int kkv_tok_type(const kkv_tok *t, int32_t token) {
    if (t && t->spm) return kkv_spm_type(t->spm, token);
    if (!t || token < 0 || token >= t->n_vocab) return -1;
    return t->type[token];
}

int32_t kkv_tok_find(const kkv_tok *t, const char *text) {
    if (!t || !text) return -1;
    if (t->spm) return kkv_spm_find(t->spm, text, strlen(text));
    return tmap_get(t, text, strlen(text));
}

kkv_status kkv_tok_piece(const kkv_tok *t, char *buf, size_t cap, size_t *n_out,
                         int32_t token) {
    if (!t || !n_out || (!buf && cap > 0))
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_token_piece: NULL argument");
    if (token < 0 || token >= t->n_vocab)
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_token_piece: token %d is not in 0..%d",
                        (int)token, t->n_vocab - 1);
    const char *src = NULL;
    size_t len = 0;
    if (t->spm) kkv_spm_piece(t->spm, token, &src, &len);
    else {
        src = t->piece_arena + t->piece[token].off;
        len = t->piece[token].len;
    }
    if (cap < len) {
        *n_out = len;
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_token_piece: buffer of %zu bytes, token %d needs %zu",
                        cap, (int)token, len);
    }
    if (len) memcpy(buf, src, len);
    *n_out = len;
    return KKV_OK;
}

/* ------------------------------------------------------------ encoding */

/* Elementary encoding steps on this thread (heap operations, regex calls,
 * special-token probes): tests bound complexity by this, not by a clock. */
static _Thread_local uint64_t work_count;
uint64_t kkv_tok_work(void) { return work_count + kkv_spm_work(); }

typedef struct enc {
    const kkv_tok *t;
    pcre2_match_data *md;
    int32_t *out;     /* [cap_out] ids so far */
    size_t   n_out, cap_out;
    int32_t *sym;     /* [cap_sym] token of the symbol starting at byte i, -1 if merged away */
    int32_t *nxt;     /* [cap_sym] next live symbol, n at the end */
    int32_t *prv;     /* [cap_sym] previous live symbol, -1 at the start */
    size_t   cap_sym;
    uint64_t *heap;   /* [3 * cap_sym] min-heap of (rank << 32 | left byte offset):
                         lowest rank first, then leftmost; may hold stale pairs */
    size_t    n_heap;
    char     *mapped; /* [2 * cap_sym] a chunk in the vocabulary's alphabet */
} enc;

static kkv_status push(enc *e, int32_t id) {
    if (e->n_out == e->cap_out) {
        size_t nc = e->cap_out ? 2 * e->cap_out : 256;
        int32_t *p = realloc(e->out, nc * sizeof *p);
        if (!p) return kkv_fail(KKV_ERR_NOMEM, "kkv_tokenize: out of memory");
        e->out = p;
        e->cap_out = nc;
    }
    e->out[e->n_out++] = id;
    return KKV_OK;
}

static void heap_sift_down(uint64_t *h, size_t n, size_t i) {
    uint64_t v = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

static void heap_push(enc *e, uint64_t v) {
    work_count++;
    size_t i = e->n_heap++;
    while (i > 0 && v < e->heap[(i - 1) / 2]) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = v;
}

static uint64_t heap_pop(enc *e) {
    work_count++;
    uint64_t top = e->heap[0];
    e->heap[0] = e->heap[--e->n_heap];
    if (e->n_heap) heap_sift_down(e->heap, e->n_heap, 0);
    return top;
}

static uint64_t heap_key(int32_t rank, int32_t left) {
    return (uint64_t)(uint32_t)rank << 32 | (uint32_t)left;
}

/* Queues the pair starting at symbol l, if it is a merge. */
static void queue_pair(enc *e, int32_t l, int32_t r) {
    const pair_slot *m = pmap_get(e->t, e->sym[l], e->sym[r]);
    if (m) heap_push(e, heap_key(m->rank, l));
}

/* BPE of bytes that all have a byte token. A heap entry records only (rank,
 * left); it is still current if the merge of that rank applies at left now,
 * since a rank names exactly one pair. */
static kkv_status bpe_run(enc *e, const uint8_t *p, size_t n) {
    const kkv_tok *t = e->t;
    if (n == 0) return KKV_OK;
    if (n == 1) return push(e, t->byte_id[p[0]]);
    if (n > (size_t)INT32_MAX / 4)
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: a %zu-byte chunk is too long", n);
    if (n > e->cap_sym) {
        size_t nc = n > 2 * e->cap_sym ? n : 2 * e->cap_sym;
        free(e->sym);
        free(e->nxt);
        free(e->prv);
        free(e->heap);
        free(e->mapped);
        e->sym = malloc(nc * sizeof *e->sym);
        e->nxt = malloc(nc * sizeof *e->nxt);
        e->prv = malloc(nc * sizeof *e->prv);
        e->heap = malloc(3 * nc * sizeof *e->heap); /* n-1 initial + <= 2 per merge */
        e->mapped = malloc(2 * nc);
        e->cap_sym = e->sym && e->nxt && e->prv && e->heap && e->mapped ? nc : 0;
        if (!e->cap_sym) return kkv_fail(KKV_ERR_NOMEM, "kkv_tokenize: out of memory");
    }
    if (t->pre->ignore_merges) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t cp = kkv_tok_byte_to_cp(p[i]);
            if (cp < 0x80) e->mapped[m++] = (char)cp;
            else {
                e->mapped[m++] = (char)(0xC0 | (cp >> 6));
                e->mapped[m++] = (char)(0x80 | (cp & 0x3F));
            }
        }
        int32_t id = tmap_get(t, e->mapped, m);
        if (id >= 0 && t->type[id] != KKV_TOKTYPE_CONTROL && t->type[id] != KKV_TOKTYPE_USER)
            return push(e, id);
    }
    int32_t nn = (int32_t)n;
    for (int32_t i = 0; i < nn; i++) {
        e->sym[i] = t->byte_id[p[i]];
        e->nxt[i] = i + 1;
        e->prv[i] = i - 1;
    }
    e->n_heap = 0;
    for (int32_t i = 0; i + 1 < nn; i++) {
        const pair_slot *m = pmap_get(t, e->sym[i], e->sym[i + 1]);
        if (m) e->heap[e->n_heap++] = heap_key(m->rank, i);
    }
    work_count += (uint64_t)nn; /* the heap is built in O(n) */
    for (size_t i = e->n_heap / 2; i-- > 0;) heap_sift_down(e->heap, e->n_heap, i);
    while (e->n_heap) {
        uint64_t h = heap_pop(e);
        int32_t l = (int32_t)(uint32_t)h, r = e->nxt[l];
        if (e->sym[l] < 0 || r >= nn) continue;
        const pair_slot *m = pmap_get(t, e->sym[l], e->sym[r]);
        if (!m || m->rank != (int32_t)(h >> 32)) continue;
        e->sym[l] = m->id;
        e->sym[r] = -1;
        e->nxt[l] = e->nxt[r];
        if (e->nxt[r] < nn) e->prv[e->nxt[r]] = l;
        if (e->prv[l] >= 0) queue_pair(e, e->prv[l], l);
        if (e->nxt[l] < nn) queue_pair(e, l, e->nxt[l]);
    }
    for (int32_t i = 0; i < nn; i = e->nxt[i]) KKV_TRY(push(e, e->sym[i]));
    return KKV_OK;
}

/* The tokens of U+FFFD, which stand for bytes the vocabulary has no token
 * for: vocabularies trained on UTF-8 text often lack the bytes that never
 * occur in it (C0, C1, F5..FF) and some rare ones (SmolLM2: 0x04, 0xF1...). */
static kkv_status replacement(enc *e, uint8_t missing) {
    static const uint8_t fffd[3] = {0xEF, 0xBF, 0xBD};
    for (int i = 0; i < 3; i++)
        if (e->t->byte_id[fffd[i]] < 0)
            return kkv_fail(KKV_ERR_UNSUPPORTED,
                            "kkv_tokenize: the vocabulary has no token for byte 0x%02x, nor for "
                            "U+FFFD to stand in for it", missing);
    return bpe_run(e, fffd, 3);
}

/* BPE of one pre-tokenized chunk. A character with a byte that has no token
 * becomes U+FFFD, and the chunk is merged as pieces on either side of it. */
static kkv_status bpe(enc *e, const uint8_t *p, size_t n) {
    const int32_t *bid = e->t->byte_id;
    size_t i = 0;
    while (i < n && bid[p[i]] >= 0) i++;
    if (i == n) return bpe_run(e, p, n);
    size_t start = 0;
    for (i = 0; i < n;) {
        size_t l = utf8_seq(p + i, n - i), k;
        if (l == 0) l = 1; /* chunks are valid UTF-8; this only guards the loop */
        for (k = 0; k < l && bid[p[i + k]] >= 0; k++) {}
        if (k < l) {
            KKV_TRY(bpe_run(e, p + start, i - start));
            KKV_TRY(replacement(e, p[i + k]));
            start = i + l;
        }
        i += l;
    }
    return bpe_run(e, p + start, n - start);
}

/* Splits p[0..n) (valid UTF-8) with regex `level` into matches and the gaps
 * between them; each piece goes to the next regex, or to BPE after the last. */
static kkv_status pre_split(enc *e, int level, const char *p, size_t n) {
    const kkv_tok *t = e->t;
    if (level >= t->n_re || level >= MAX_RE) return bpe(e, (const uint8_t *)p, n);
    size_t off = 0, gap = 0;
    while (off < n) {
        work_count++;
        int rc = pcre2_match(t->re[level], (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(t->re[level], (PCRE2_SPTR)p, n, off, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             e->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[160];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: pre-tokenizer regex failed: %s",
                            (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t s = ov[0], end = ov[1];
        if (s < off || end < s || end > n)
            return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: pre-tokenizer regex gave a bad match");
        if (end == s) { /* empty match: step over one character, it joins the gap */
            off = s + utf8_seq((const uint8_t *)p + s, n - s);
            continue;
        }
        if (s > gap) KKV_TRY(pre_split(e, level + 1, p + gap, s - gap));
        KKV_TRY(pre_split(e, level + 1, p + s, end - s));
        off = gap = end;
    }
    if (gap < n) KKV_TRY(pre_split(e, level + 1, p + gap, n - gap));
    return KKV_OK;
}

/* A byte that is not part of valid UTF-8: its byte token, or U+FFFD. */
static kkv_status invalid_byte(enc *e, uint8_t b) {
    if (e->t->byte_id[b] >= 0) return push(e, e->t->byte_id[b]);
    return replacement(e, b);
}

/* Text without special tokens: valid UTF-8 runs go through the pre-tokenizer,
 * every invalid byte is a chunk of its own (see invalid_byte). */
static kkv_status encode_plain(enc *e, const uint8_t *p, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t start = i, l;
        while (i < n && (l = utf8_seq(p + i, n - i)) > 0) i += l;
        if (i > start) KKV_TRY(pre_split(e, 0, (const char *)p + start, i - start));
        if (i < n) KKV_TRY(invalid_byte(e, p[i++]));
    }
    return KKV_OK;
}

/* Leftmost, then longest special-token match in p[from..n): [*ms, *me) its
 * bounds and *id its token, or *ms = *me = n and *id = -1 if there is none. */
static void find_special(const kkv_tok *t, const uint8_t *p, size_t n, size_t from, size_t *ms,
                         size_t *me, int32_t *id) {
    for (size_t i = from; i < n; i++) {
        if (!t->special_first[p[i]]) continue;
        for (int k = 0; k < t->n_special; k++) {
            work_count++;
            span s = t->text[t->special[k]];
            if (s.len <= n - i && !memcmp(p + i, t->text_arena + s.off, s.len)) {
                *ms = i;
                *me = i + s.len;
                *id = t->special[k];
                return;
            }
        }
    }
    *ms = *me = n;
    *id = -1;
}

/* Hands n ids over to the caller's tokens [cap] (kkv_tokenize's contract). */
static kkv_status deliver(const int32_t *ids, size_t n, int32_t *tokens, int cap, int *n_out) {
    if (n > INT_MAX)
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: %zu tokens do not fit an int", n);
    *n_out = (int)n;
    if (n > (size_t)cap)
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: room for %d tokens, %zu needed", cap, n);
    if (n) memcpy(tokens, ids, n * sizeof *tokens);
    return KKV_OK;
}

static kkv_status encode_spm(const kkv_tok *t, int32_t *tokens, int cap, int *n_out,
                             const char *text, size_t len, int add_bos, int special) {
    int32_t *ids = NULL;
    size_t n = 0;
    int32_t bos = add_bos && t->wants_bos ? t->bos : -1;
    kkv_status s = kkv_spm_encode(t->spm, &ids, &n, text, len, bos, special);
    if (s == KKV_OK) s = deliver(ids, n, tokens, cap, n_out);
    free(ids);
    return s;
}

kkv_status kkv_tok_encode(const kkv_tok *t, int32_t *tokens, int cap, int *n_out,
                          const char *text, size_t len, int add_bos, int special) {
    if (!t || !n_out || cap < 0 || (!tokens && cap > 0) || (!text && len > 0))
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: NULL or negative argument");
    if (t->spm) return encode_spm(t, tokens, cap, n_out, text, len, add_bos, special);
    enc e = {0};
    e.t = t;
    e.md = pcre2_match_data_create(1, NULL);
    kkv_status s = e.md ? KKV_OK : kkv_fail(KKV_ERR_NOMEM, "kkv_tokenize: out of memory");
    if (s == KKV_OK && add_bos && t->wants_bos && t->bos >= 0) s = push(&e, t->bos);
    const uint8_t *p = (const uint8_t *)text;
    size_t pos = 0;
    while (s == KKV_OK && pos < len) {
        size_t ms = len, me = len;
        int32_t sid = -1;
        if (special && t->n_special) find_special(t, p, len, pos, &ms, &me, &sid);
        s = encode_plain(&e, p + pos, ms - pos);
        if (s == KKV_OK && sid >= 0) s = push(&e, sid);
        pos = me;
    }
    if (s == KKV_OK) s = deliver(e.out, e.n_out, tokens, cap, n_out);
    pcre2_match_data_free(e.md);
    free(e.out);
    free(e.sym);
    free(e.nxt);
    free(e.prv);
    free(e.heap);
    free(e.mapped);
    return s;
}
