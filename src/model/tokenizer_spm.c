/* SentencePiece BPE over the GGUF vocabulary (tokenizer.ggml.model "llama").
 *
 * It follows SentencePiece's own BPE encoder with the identity normalizer
 * (what Gemma ships), so that a sentencepiece model built from the same
 * pieces, scores and types gives the same ids (tests/oracle):
 *   1. escape: every ' ' becomes U+2581 ("▁"); with add_space_prefix one more
 *      goes in front of a non-empty text (SentencePiece's add_dummy_prefix;
 *      with `special`, control tokens at the very start stay in front of it,
 *      so that a text beginning with <bos> gets the prefix on its first word);
 *   2. split out special tokens, leftmost then longest, matched in the escaped
 *      text against their escaped texts: user-defined ones always (in
 *      SentencePiece they are pieces that are never split or merged), control
 *      and unknown ones only with `special` (SentencePiece never matches them:
 *      their text is ordinary text then);
 *   3. every fragment in between: symbols are its UTF-8 characters (a byte
 *      that is not part of valid UTF-8 is a symbol of its own); repeatedly
 *      merge the adjacent pair whose concatenation is a piece (a normal,
 *      user-defined or unused token) of the highest score, leftmost on ties.
 *      A max-heap of candidate pairs with lazy invalidation: O(n log n);
 *   4. each symbol gives its piece's id; a merged unused piece is split back
 *      into the two symbols it came from (SentencePiece's resegmentation); a
 *      symbol that is no piece becomes the <0xNN> tokens of its bytes (byte
 *      fallback), or <unk> (runs of them as one) if a byte has no token.
 * Where this differs from SentencePiece on purpose: invalid UTF-8 is kept
 * (SentencePiece's normalizer turns each bad byte into U+FFFD first), so every
 * text round-trips through byte fallback.
 *
 * Pieces (kkv_spm_piece) are raw bytes: U+2581 back to ' ', <0xNN> to the
 * byte; control and unknown tokens give their text verbatim, so that
 * decode(encode(x, special=1)) == x. */
#include "model/tokenizer_spm.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "kittykv_model.h"
#include "model/tokenizer.h"

#define SPACE_MARK "\xE2\x96\x81" /* U+2581, SentencePiece's escaped space */

typedef struct span {
    uint32_t off, len; /* into an arena */
} span;

/* A slot of a text -> id map; the hash is kept so that a probe rarely has to
 * touch the token text (most probes during merging are misses). */
typedef struct slot {
    uint32_t hash;
    int32_t  id; /* -1: free */
} slot;

/* A trie of the special tokens' escaped texts (first child, next sibling). */
typedef struct trie_node {
    int32_t child, sibling; /* node index, -1 none */
    int32_t id;             /* token ending here, -1 none */
    uint8_t byte;
} trie_node;

struct kkv_spm {
    int      n_vocab;
    char    *text_arena;  /* [sum of text lengths] GGUF token texts */
    span    *text;        /* [n_vocab] */
    char    *piece_arena; /* [<= sum of text lengths] raw bytes of each token */
    span    *piece;       /* [n_vocab] */
    float   *score;       /* [n_vocab] tokenizer.ggml.scores */
    int8_t  *type;        /* [n_vocab] KKV_TOKTYPE_* */
    slot    *all;         /* [mask + 1] open addressing text -> id, every token */
    slot    *mrg;         /* [mask + 1] text -> id of the pieces a merge may make */
    uint32_t mask;
    int32_t  byte_id[256]; /* <0xNN> token of each byte, -1 if the vocabulary lacks it */
    int32_t  unk;          /* -1 if none */
    int      add_space;    /* tokenizer.ggml.add_space_prefix */
    int      has_unused;   /* some piece is of type UNUSED: keep the merge tree */
    trie_node *trie;       /* [n_trie] node 0 is the root */
    int32_t    n_trie;
};

/* Elementary steps (heap operations, trie steps) for complexity tests. */
static _Thread_local uint64_t work_count;
uint64_t kkv_spm_work(void) { return work_count; }

static uint32_t hash_bytes(const char *p, size_t n) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 16777619u;
    return h;
}

static int same_text(const kkv_spm *s, int32_t id, const char *p, size_t n) {
    return s->text[id].len == n && !memcmp(s->text_arena + s->text[id].off, p, n);
}

static int32_t map_get(const kkv_spm *s, const slot *map, const char *p, size_t n) {
    uint32_t h = hash_bytes(p, n);
    for (uint32_t i = h & s->mask;; i = (i + 1) & s->mask) {
        if (map[i].id < 0) return -1;
        if (map[i].hash == h && same_text(s, map[i].id, p, n)) return map[i].id;
    }
}

/* Inserts id unless a token of the same text is there (the first one wins). */
static void map_put(kkv_spm *s, slot *map, int32_t id) {
    const char *p = s->text_arena + s->text[id].off;
    size_t n = s->text[id].len;
    uint32_t h = hash_bytes(p, n);
    for (uint32_t i = h & s->mask;; i = (i + 1) & s->mask) {
        if (map[i].id < 0) {
            map[i] = (slot){h, id};
            return;
        }
        if (map[i].hash == h && same_text(s, map[i].id, p, n)) return;
    }
}

void kkv_spm_free(kkv_spm *s) {
    if (!s) return;
    free(s->text_arena);
    free(s->text);
    free(s->piece_arena);
    free(s->piece);
    free(s->score);
    free(s->type);
    free(s->all);
    free(s->mrg);
    free(s->trie);
    free(s);
}

static kkv_status need_arr(const kkv_gguf *g, const char *key, kkv_gguf_type want, int n_vocab,
                           const void **data) {
    kkv_gguf_type et;
    uint64_t n;
    kkv_status st = kkv_gguf_get_arr(g, key, &et, data, &n);
    if (st == KKV_ERR_NOT_FOUND)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer: the SentencePiece vocabulary has no '%s'", key);
    if (st != KKV_OK) return st == KKV_ERR_NOMEM ? st : KKV_ERR_FORMAT;
    if (n != (uint64_t)n_vocab)
        return kkv_fail(KKV_ERR_FORMAT, "%s has %llu entries, tokens %d", key,
                        (unsigned long long)n, n_vocab);
    int ok = et == want || (want == KKV_GGUF_I32 && et == KKV_GGUF_U32);
    if (!ok)
        return kkv_fail(KKV_ERR_FORMAT, "%s: element type %d, want %s", key, (int)et,
                        want == KKV_GGUF_F32 ? "float32" : "int32");
    return KKV_OK;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The byte a token text "<0xHH>" stands for, or -1. */
static int byte_token_value(const char *p, size_t n) {
    if (n != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
    int hi = hex_digit(p[3]), lo = hex_digit(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static kkv_status load_arrays(kkv_spm *s, const kkv_gguf *g, const kkv_gguf_str *toks) {
    const void *sc, *ty;
    KKV_TRY(need_arr(g, "tokenizer.ggml.scores", KKV_GGUF_F32, s->n_vocab, &sc));
    KKV_TRY(need_arr(g, "tokenizer.ggml.token_type", KKV_GGUF_I32, s->n_vocab, &ty));
    for (int i = 0; i < s->n_vocab; i++) {
        float f;
        int32_t v;
        memcpy(&f, (const char *)sc + 4 * (size_t)i, 4);
        memcpy(&v, (const char *)ty + 4 * (size_t)i, 4);
        if (!isfinite(f))
            return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.scores[%d] is not a finite number", i);
        if (v < KKV_TOKTYPE_NORMAL || v > KKV_TOKTYPE_BYTE)
            return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.token_type[%d] = %d is not a token type "
                            "(1..6)", i, (int)v);
        if (v == KKV_TOKTYPE_BYTE && byte_token_value(toks[i].ptr, toks[i].len) < 0) {
            char shown[40];
            return kkv_fail(KKV_ERR_FORMAT, "token %d is a byte token but reads '%s', not <0xHH>", i,
                            kkv_printable(shown, sizeof shown, toks[i].ptr, toks[i].len));
        }
        s->score[i] = f;
        s->type[i] = (int8_t)v;
    }
    return KKV_OK;
}

/* Raw bytes of token i into the piece arena at *off. */
static void make_piece(kkv_spm *s, int i, uint32_t *off) {
    const char *p = s->text_arena + s->text[i].off;
    uint32_t n = s->text[i].len, q = *off;
    int t = s->type[i];
    if (t == KKV_TOKTYPE_BYTE) s->piece_arena[q++] = (char)byte_token_value(p, n);
    else if (t == KKV_TOKTYPE_CONTROL || t == KKV_TOKTYPE_UNKNOWN) {
        memcpy(s->piece_arena + q, p, n);
        q += n;
    } else {
        for (uint32_t k = 0; k < n;) {
            if (n - k >= 3 && !memcmp(p + k, SPACE_MARK, 3)) {
                s->piece_arena[q++] = ' ';
                k += 3;
            } else s->piece_arena[q++] = p[k++];
        }
    }
    s->piece[i] = (span){*off, q - *off};
    *off = q;
}

static kkv_status load_texts(kkv_spm *s, const kkv_gguf_str *toks) {
    uint64_t total = 0;
    for (int i = 0; i < s->n_vocab; i++) total += toks[i].len;
    if (total >= UINT32_MAX / 2)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.tokens: %llu bytes of text is too much",
                        (unsigned long long)total);
    uint32_t sz = 16;
    while (sz < 2 * (uint64_t)s->n_vocab) sz <<= 1; /* load factor <= 1/2 */
    s->text_arena = malloc(total + 1);
    s->piece_arena = malloc(total + 1); /* a piece is never longer than its text */
    s->text = malloc((size_t)s->n_vocab * sizeof *s->text);
    s->piece = malloc((size_t)s->n_vocab * sizeof *s->piece);
    s->all = malloc((size_t)sz * sizeof *s->all);
    s->mrg = malloc((size_t)sz * sizeof *s->mrg);
    if (!s->text_arena || !s->piece_arena || !s->text || !s->piece || !s->all || !s->mrg)
        return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory for %d tokens", s->n_vocab);
    s->mask = sz - 1;
    memset(s->all, 0xFF, (size_t)sz * sizeof *s->all);
    memset(s->mrg, 0xFF, (size_t)sz * sizeof *s->mrg);
    uint32_t off = 0;
    for (int i = 0; i < s->n_vocab; i++) {
        uint32_t n = (uint32_t)toks[i].len;
        if (n) memcpy(s->text_arena + off, toks[i].ptr, n);
        s->text[i] = (span){off, n};
        off += n;
    }
    off = 0;
    for (int i = 0; i < s->n_vocab; i++) {
        int t = s->type[i];
        make_piece(s, i, &off);
        map_put(s, s->all, i);
        if (t == KKV_TOKTYPE_NORMAL || t == KKV_TOKTYPE_USER || t == KKV_TOKTYPE_UNUSED)
            map_put(s, s->mrg, i);
        s->has_unused |= t == KKV_TOKTYPE_UNUSED;
        if (t == KKV_TOKTYPE_BYTE) {
            int b = (uint8_t)s->piece_arena[s->piece[i].off];
            if (s->byte_id[b] < 0) s->byte_id[b] = i;
        }
    }
    return KKV_OK;
}

static int is_special(int type) {
    return type == KKV_TOKTYPE_CONTROL || type == KKV_TOKTYPE_USER || type == KKV_TOKTYPE_UNKNOWN;
}

/* Child of node with byte b, or -1. */
static int32_t trie_find(const kkv_spm *s, int32_t node, uint8_t b) {
    for (int32_t c = s->trie[node].child; c >= 0; c = s->trie[c].sibling)
        if (s->trie[c].byte == b) return c;
    return -1;
}

/* Child of node with byte b, created if absent. */
static int32_t trie_child(kkv_spm *s, int32_t node, uint8_t b) {
    int32_t c = trie_find(s, node, b);
    if (c >= 0) return c;
    c = s->n_trie++;
    s->trie[c] = (trie_node){-1, s->trie[node].child, -1, b};
    s->trie[node].child = c;
    return c;
}

/* The trie of special texts, escaped as input text is (' ' -> U+2581), so
 * Gemma's user-defined space runs match runs of spaces. Node count is bounded
 * by the escaped bytes, so the build is linear in them (times the fan-out). */
static kkv_status build_trie(kkv_spm *s) {
    uint64_t nodes = 1;
    for (int i = 0; i < s->n_vocab; i++)
        if (is_special(s->type[i])) nodes += 3 * (uint64_t)s->text[i].len;
    if (nodes >= INT32_MAX / 2) return kkv_fail(KKV_ERR_FORMAT, "tokenizer: special tokens too long");
    s->trie = malloc((size_t)nodes * sizeof *s->trie);
    if (!s->trie) return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory");
    s->trie[0] = (trie_node){-1, -1, -1, 0};
    s->n_trie = 1;
    for (int i = 0; i < s->n_vocab; i++) {
        if (!is_special(s->type[i]) || !s->text[i].len) continue;
        const uint8_t *p = (const uint8_t *)s->text_arena + s->text[i].off;
        int32_t node = 0;
        for (uint32_t k = 0; k < s->text[i].len; k++) {
            if (p[k] == ' ')
                for (int j = 0; j < 3; j++) node = trie_child(s, node, (uint8_t)SPACE_MARK[j]);
            else node = trie_child(s, node, p[k]);
        }
        if (s->trie[node].id < 0) s->trie[node].id = i; /* the first of equal texts wins */
    }
    return KKV_OK;
}

kkv_status kkv_spm_from_gguf(kkv_spm **out, const kkv_gguf *g) {
    if (!out || !g) return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_spm_from_gguf: NULL argument");
    *out = NULL;
    const kkv_gguf_str *toks;
    uint64_t n;
    kkv_status st = kkv_gguf_get_str_arr(g, "tokenizer.ggml.tokens", &toks, &n);
    if (st == KKV_ERR_NOT_FOUND)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer: the file has no 'tokenizer.ggml.tokens'");
    if (st != KKV_OK) return st == KKV_ERR_NOMEM ? st : KKV_ERR_FORMAT;
    if (n == 0 || n > INT32_MAX / 4)
        return kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries",
                        (unsigned long long)n);
    kkv_spm *s = calloc(1, sizeof *s);
    if (!s) return kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory");
    s->n_vocab = (int)n;
    memset(s->byte_id, 0xFF, sizeof s->byte_id);
    s->score = malloc((size_t)n * sizeof *s->score);
    s->type = malloc((size_t)n);
    st = s->score && s->type ? KKV_OK : kkv_fail(KKV_ERR_NOMEM, "tokenizer: out of memory");
    if (st == KKV_OK) st = load_arrays(s, g, toks);
    if (st == KKV_OK) st = load_texts(s, toks);
    if (st == KKV_OK) st = build_trie(s);

    int64_t v = -1;
    kkv_status su = st == KKV_OK ? kkv_gguf_get_i64(g, "tokenizer.ggml.unknown_token_id", &v) : st;
    if (st == KKV_OK && su == KKV_OK && (v < 0 || v >= s->n_vocab))
        st = kkv_fail(KKV_ERR_FORMAT, "tokenizer.ggml.unknown_token_id = %lld is not a token id",
                      (long long)v);
    else if (st == KKV_OK && su != KKV_OK && su != KKV_ERR_NOT_FOUND) st = KKV_ERR_FORMAT;
    s->unk = su == KKV_OK ? (int32_t)v : -1;
    for (int i = 0; st == KKV_OK && s->unk < 0 && i < s->n_vocab; i++)
        if (s->type[i] == KKV_TOKTYPE_UNKNOWN) s->unk = i;

    /* llama.cpp's default for this model type is to add the prefix. */
    int sp = 1;
    kkv_status sb = st == KKV_OK ? kkv_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &sp) : st;
    if (st == KKV_OK && sb != KKV_OK && sb != KKV_ERR_NOT_FOUND) st = KKV_ERR_FORMAT;
    s->add_space = sb == KKV_OK ? sp : 1;

    if (st != KKV_OK) {
        kkv_spm_free(s);
        return st;
    }
    kkv_clear_error(); /* the optional lookups above leave messages */
    *out = s;
    return KKV_OK;
}

int kkv_spm_n_vocab(const kkv_spm *s) { return s ? s->n_vocab : 0; }

int kkv_spm_type(const kkv_spm *s, int32_t token) {
    if (!s || token < 0 || token >= s->n_vocab) return -1;
    return s->type[token];
}

int32_t kkv_spm_find(const kkv_spm *s, const char *text, size_t n) {
    if (!s || (!text && n)) return -1;
    return map_get(s, s->all, text ? text : "", n);
}

void kkv_spm_piece(const kkv_spm *s, int32_t token, const char **p, size_t *n) {
    span sp = s->piece[token];
    *p = s->piece_arena + sp.off;
    *n = sp.len;
}

/* ------------------------------------------------------------ encoding */

/* A candidate merge of the symbols left and right (adjacent when queued). It
 * is stale once either symbol changed: their lengths no longer add to size. */
typedef struct bigram {
    float    score;
    int32_t  left, right;
    uint32_t size;
} bigram;

typedef struct symbol {
    uint32_t off, len; /* into the fragment; len 0 once merged into its left */
    int32_t  prv, nxt; /* live neighbours, -1 / n_sym at the ends */
    int32_t  node;     /* merge-tree node (vocabularies with unused pieces) */
} symbol;

typedef struct tnode {
    uint32_t off, len; /* text in the fragment */
    int32_t  kid[2];   /* -1 for a character */
} tnode;

typedef struct enc {
    const kkv_spm *s;
    int32_t *out;   /* [cap_out] ids so far */
    size_t   n_out, cap_out;
    int      last_unk; /* the last id came from a symbol that is no piece and became <unk> */
    symbol  *sym;   /* [cap_sym] */
    tnode   *tree;  /* [2 * cap_sym] if the vocabulary has unused pieces */
    int32_t *stack; /* [2 * cap_sym] resegmentation work list */
    size_t   cap_sym;
    bigram  *heap;  /* [cap_heap] */
    size_t   n_heap, cap_heap;
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
    e->last_unk = 0;
    return KKV_OK;
}

/* Whether a goes before b: higher score, then the leftmost. */
static int better(const bigram *a, const bigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void sift_down(bigram *h, size_t n, size_t i) {
    bigram v = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && better(&h[c + 1], &h[c])) c++;
        if (!better(&h[c], &v)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

static void sift_up(bigram *h, size_t i) {
    bigram v = h[i];
    while (i > 0 && better(&v, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

/* Queues the pair (l, r) if their concatenation is a piece. heapify: append
 * only (the caller builds the heap once afterwards). */
static kkv_status try_pair(enc *e, const char *base, int32_t l, int32_t r, int32_t n_sym,
                           int heapify) {
    if (l < 0 || r >= n_sym) return KKV_OK;
    const symbol *a = &e->sym[l], *b = &e->sym[r];
    work_count++;
    int32_t id = map_get(e->s, e->s->mrg, base + a->off, a->len + b->len);
    if (id < 0) return KKV_OK;
    if (e->n_heap == e->cap_heap) {
        size_t nc = e->cap_heap ? 2 * e->cap_heap : 256;
        bigram *p = realloc(e->heap, nc * sizeof *p);
        if (!p) return kkv_fail(KKV_ERR_NOMEM, "kkv_tokenize: out of memory");
        e->heap = p;
        e->cap_heap = nc;
    }
    e->heap[e->n_heap] = (bigram){e->s->score[id], l, r, a->len + b->len};
    if (!heapify) sift_up(e->heap, e->n_heap);
    e->n_heap++;
    return KKV_OK;
}

/* Text that is no piece (one character): its byte tokens, else <unk>. */
static kkv_status fallback(enc *e, const uint8_t *p, size_t n) {
    const kkv_spm *s = e->s;
    size_t k = 0;
    while (k < n && s->byte_id[p[k]] >= 0) k++;
    if (k == n) {
        for (k = 0; k < n; k++) KKV_TRY(push(e, s->byte_id[p[k]]));
        return KKV_OK;
    }
    if (s->unk < 0)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "kkv_tokenize: the vocabulary has no token for byte "
                        "0x%02x and no <unk> to stand in for it", p[k]);
    if (e->last_unk) return KKV_OK; /* a run of unknown characters is one <unk> */
    KKV_TRY(push(e, s->unk));
    e->last_unk = 1;
    return KKV_OK;
}

/* Emits the tokens of merge-tree node root: a piece that is not unused (or a
 * character) as itself, an unused merged piece as its two halves. */
static kkv_status resegment(enc *e, const char *base, int32_t root) {
    const kkv_spm *s = e->s;
    size_t top = 0;
    e->stack[top++] = root;
    while (top) {
        const tnode *t = &e->tree[e->stack[--top]];
        work_count++;
        int32_t id = map_get(s, s->mrg, base + t->off, t->len);
        if (id >= 0 && (s->type[id] != KKV_TOKTYPE_UNUSED || t->kid[0] < 0)) KKV_TRY(push(e, id));
        else if (t->kid[0] < 0) KKV_TRY(fallback(e, (const uint8_t *)base + t->off, t->len));
        else {
            e->stack[top++] = t->kid[1];
            e->stack[top++] = t->kid[0];
        }
    }
    return KKV_OK;
}

static kkv_status grow_symbols(enc *e, size_t n) {
    if (n <= e->cap_sym) return KKV_OK;
    size_t nc = n > 2 * e->cap_sym ? n : 2 * e->cap_sym;
    free(e->sym);
    free(e->tree);
    free(e->stack);
    e->tree = NULL;
    e->stack = NULL;
    e->sym = malloc(nc * sizeof *e->sym);
    int ok = e->sym != NULL;
    if (ok && e->s->has_unused) {
        e->tree = malloc(2 * nc * sizeof *e->tree);
        e->stack = malloc(2 * nc * sizeof *e->stack);
        ok = e->tree && e->stack;
    }
    e->cap_sym = ok ? nc : 0;
    return ok ? KKV_OK : kkv_fail(KKV_ERR_NOMEM, "kkv_tokenize: out of memory");
}

/* BPE of one fragment of escaped text (no special tokens in it). */
static kkv_status encode_fragment(enc *e, const char *base, size_t n) {
    const kkv_spm *s = e->s;
    if (n == 0) return KKV_OK;
    if (n > (size_t)INT32_MAX / 4)
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: a %zu-byte fragment is too long", n);
    KKV_TRY(grow_symbols(e, n));
    int32_t n_sym = 0;
    for (size_t i = 0; i < n;) {
        size_t l = kkv_utf8_valid_len((const unsigned char *)base + i, n - i);
        if (l == 0) l = 1; /* a byte outside valid UTF-8: a symbol of its own */
        e->sym[n_sym] = (symbol){(uint32_t)i, (uint32_t)l, n_sym - 1, n_sym + 1, n_sym};
        if (e->tree) e->tree[n_sym] = (tnode){(uint32_t)i, (uint32_t)l, {-1, -1}};
        n_sym++;
        i += l;
    }
    int32_t n_node = n_sym;
    e->n_heap = 0;
    for (int32_t i = 1; i < n_sym; i++) KKV_TRY(try_pair(e, base, i - 1, i, n_sym, 1));
    for (size_t i = e->n_heap / 2; i-- > 0;) sift_down(e->heap, e->n_heap, i);
    while (e->n_heap) {
        work_count++;
        bigram b = e->heap[0];
        e->heap[0] = e->heap[--e->n_heap];
        if (e->n_heap) sift_down(e->heap, e->n_heap, 0);
        symbol *l = &e->sym[b.left], *r = &e->sym[b.right];
        if (!l->len || !r->len || l->len + r->len != b.size) continue;
        l->len += r->len;
        r->len = 0;
        l->nxt = r->nxt;
        if (r->nxt < n_sym) e->sym[r->nxt].prv = b.left;
        if (e->tree) {
            e->tree[n_node] = (tnode){l->off, l->len, {l->node, r->node}};
            l->node = n_node++;
        }
        KKV_TRY(try_pair(e, base, l->prv, b.left, n_sym, 0));
        KKV_TRY(try_pair(e, base, b.left, l->nxt, n_sym, 0));
    }
    for (int32_t i = 0; i < n_sym; i = e->sym[i].nxt) {
        const symbol *y = &e->sym[i];
        int32_t id = map_get(s, s->mrg, base + y->off, y->len);
        if (id >= 0 && s->type[id] == KKV_TOKTYPE_UNUSED && e->tree && y->node >= n_sym)
            KKV_TRY(resegment(e, base, y->node));
        else if (id >= 0) KKV_TRY(push(e, id));
        else KKV_TRY(fallback(e, (const uint8_t *)base + y->off, y->len));
    }
    return KKV_OK;
}

/* Longest special token (allowed by `special`) that starts at p[0..n), or -1;
 * *len gets its length. */
static int32_t match_special(const kkv_spm *s, const uint8_t *p, size_t n, int special,
                             size_t *len) {
    int32_t node = 0, best = -1;
    for (size_t k = 0; k < n; k++) {
        work_count++;
        node = trie_find(s, node, p[k]);
        if (node < 0) break;
        int32_t id = s->trie[node].id;
        if (id >= 0 && (special || s->type[id] == KKV_TOKTYPE_USER)) {
            best = id;
            *len = k + 1;
        }
    }
    return best;
}

/* Escaped text esc [n]: fragments between special tokens, leftmost-longest. */
static kkv_status encode_escaped(enc *e, const char *esc, size_t n, int special) {
    const kkv_spm *s = e->s;
    const uint8_t *p = (const uint8_t *)esc;
    size_t start = 0;
    for (size_t i = 0; i < n;) {
        size_t ml = 0;
        int32_t id = s->trie[0].child >= 0 ? match_special(s, p + i, n - i, special, &ml) : -1;
        if (id < 0) {
            size_t l = kkv_utf8_valid_len(p + i, n - i);
            i += l ? l : 1;
            continue;
        }
        KKV_TRY(encode_fragment(e, esc + start, i - start));
        KKV_TRY(push(e, id));
        i += ml;
        start = i;
    }
    return encode_fragment(e, esc + start, n - start);
}

/* The control tokens that open the escaped text esc [n] (with `special`):
 * they go out before the space prefix. Returns the bytes they take. */
static kkv_status leading_controls(enc *e, const char *esc, size_t n, size_t *lead) {
    *lead = 0;
    while (*lead < n) {
        size_t ml = 0;
        int32_t id = match_special(e->s, (const uint8_t *)esc + *lead, n - *lead, 1, &ml);
        if (id < 0 || e->s->type[id] == KKV_TOKTYPE_USER) break;
        KKV_TRY(push(e, id));
        *lead += ml;
    }
    return KKV_OK;
}

kkv_status kkv_spm_encode(const kkv_spm *s, int32_t **ids, size_t *n, const char *text,
                          size_t len, int32_t bos, int special) {
    if (!s || !ids || !n || (!text && len))
        return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: NULL argument");
    *ids = NULL;
    *n = 0;
    if (len > (SIZE_MAX - 4) / 3) return kkv_fail(KKV_ERR_INVALID_ARG, "kkv_tokenize: text too long");
    enc e = {0};
    e.s = s;
    kkv_status st = KKV_OK;
    /* [3 + <= 3 * len] room for the prefix, then the text with every ' ' as U+2581 */
    char *buf = malloc(3 * len + 4), *esc = buf ? buf + 3 : NULL;
    if (!buf) st = kkv_fail(KKV_ERR_NOMEM, "kkv_tokenize: out of memory");
    size_t m = 0;
    for (size_t i = 0; buf && i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + m, SPACE_MARK, 3);
            m += 3;
        } else esc[m++] = text[i];
    }
    if (st == KKV_OK && bos >= 0) st = push(&e, bos);
    size_t lead = 0;
    if (st == KKV_OK && s->add_space && special) st = leading_controls(&e, esc, m, &lead);
    if (st == KKV_OK && s->add_space && lead < m) { /* the prefix, where the consumed bytes were */
        memcpy(esc + lead - 3, SPACE_MARK, 3);
        st = encode_escaped(&e, esc + lead - 3, m - lead + 3, special);
    } else if (st == KKV_OK) st = encode_escaped(&e, esc + lead, m - lead, special);
    free(buf);
    free(e.sym);
    free(e.tree);
    free(e.stack);
    free(e.heap);
    if (st != KKV_OK) {
        free(e.out);
        return st;
    }
    *ids = e.out;
    *n = e.n_out;
    return KKV_OK;
}
