/*
 * kittykv.h -- the core library: a 2-bit paged KV cache with channel-wise
 * precision boost (Kitty), the KIVI baselines, fused decode attention over the
 * quantized pages, and exact accounting. No model, no tokenizer, no regex
 * library: link `kittykv` (pkg-config kittykv, CMake kittykv::kittykv).
 * The GGUF engine is kittykv_model.h, evaluation kittykv_eval.h, kernel choice
 * and thread pools kittykv_cpu.h. docs/FORMAT.md describes the page format and
 * the token lifecycle this code follows.
 *
 * Tutorial (a complete program; tests/install/ builds and runs it)
 * --------
 * A cache holds the keys and values of many sequences for every layer and KV
 * head of one model shape, quantized by one method. Pages of G tokens come from
 * a pool whose byte budget is fixed when the cache is created.
 *
 *     #include <stdio.h>
 *     #include <kittykv.h>
 *
 *     int main(void) {
 *         kkv_method m;                                // "kitty": S=32 G=128 R=128
 *         if (kkv_method_parse(&m, "kitty:alpha=0.25") != KKV_OK) return 1;
 *         kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 64,
 *                                 .pool_bytes = 8u << 20, .method = m};
 *         kkv_cache *c;
 *         if (kkv_cache_create(&c, &cfg) != KKV_OK) {
 *             fprintf(stderr, "kittykv: %s\n", kkv_last_error());
 *             return 1;
 *         }
 *         int seq;
 *         if (kkv_seq_add(c, &seq) != KKV_OK) return 1;
 *         float k[64], v[64], q[64], out[64];          // one KV head, D = 64
 *         for (int t = 0; t < 300; t++) {
 *             for (int j = 0; j < 64; j++) {
 *                 k[j] = (float)((t * 7 + j * 13) % 17) - 8.0f;  // post-RoPE key
 *                 v[j] = (float)((t * 5 + j * 3) % 11) - 5.0f;
 *                 q[j] = (float)(j % 5) - 2.0f;
 *             }
 *             if (kkv_append(c, seq, 0, k, v) != KKV_OK ||   // stage the token
 *                 kkv_attend(c, out, seq, 0, q, 1) != KKV_OK || // fused attention
 *                 kkv_flush(c, seq, 0) != KKV_OK) {             // full page -> 2-bit
 *                 fprintf(stderr, "kittykv: %s\n", kkv_last_error());
 *                 return 1;
 *             }
 *         }
 *         kkv_mem mem;                                 // exact bytes, by component
 *         kkv_seq_mem(c, &mem, seq);
 *         printf("%d tokens, %.2f bits/element\n", kkv_seq_len(c, seq, 0),
 *                mem.bits_per_element);
 *         kkv_cache_free(c);                           // frees every sequence
 *         return 0;
 *     }
 *
 * With a model (kittykv_model.h), kkv_model_forward() does all of this for
 * every layer.
 *
 * Conventions
 * -----------
 * - Every function that can fail returns kkv_status; on failure it changes no
 *   state that the caller can observe, and kkv_last_error() holds a one-line
 *   message (thread-local, valid until the next failing call on that thread;
 *   read it only after a failure). The one exception is a forward pass that
 *   fails midway; see kkv_model_forward().
 * - KKV_ERR_NOMEM: any call that allocates may return it, with the state
 *   unchanged as above; the handle stays usable (tests/test_failalloc.c fails
 *   every allocation of create, add, reserve, append, attend, flush, load and
 *   forward in turn and checks this, and that nothing leaks).
 * - NULL: every function that returns kkv_status checks its pointers and
 *   returns KKV_ERR_INVALID_ARG for a NULL handle or a NULL required pointer
 *   (KKV_ERR_NOT_FOUND is for a sequence id that names nothing). Functions that
 *   return a value are NULL-safe with a neutral answer: kkv_cache_get_config()
 *   NULL, kkv_cache_get_kernel() KKV_KERNEL_AUTO, kkv_cache_free_bytes() 0,
 *   kkv_seq_len() -1, kkv_method_boost() 0, kkv_model_get_info() and
 *   kkv_model_cache_config() all zeros; void calls ignore a NULL handle.
 * - Untrusted input (GGUF files, text) is bounds- and overflow-checked: a bad
 *   file is KKV_ERR_FORMAT or KKV_ERR_IO with a message, never a crash or a
 *   hang (a FIFO or device as a model path fails at once). Bytes from a file
 *   that appear in a message are escaped (\xNN).
 * - The library never prints and never exits.
 * - Output arguments come first. Every create or load function has a free, and
 *   free(NULL) is a no-op.
 * - Buffers are described by shape comments: [rows][cols], row-major, fp32
 *   unless said otherwise. Ownership: the caller owns what it passes in; the
 *   library keeps no pointer to a caller's buffer after a call returns, unless
 *   the comment says "borrowed".
 * - Non-finite input (NaN, +-Inf) in keys, values or queries is rejected with
 *   KKV_ERR_NONFINITE and nothing is stored. Finite values beyond the fp16
 *   range are clamped to +-65504 when they are stored in fp16.
 * - Determinism: the same inputs give bit-identical outputs whatever the thread
 *   count and however a prompt is split into chunks.
 * - Threads: a cache or model uses its own worker threads inside a call, but one
 *   cache (or model) must not be called from two threads at once. Distinct
 *   caches and models are independent. Exception: kkv_tokenize() and
 *   kkv_token_piece() only read the model and may run on several threads at
 *   once (not during kkv_model_load/free). kkv_last_error() is per thread.
 */
#ifndef KITTYKV_H
#define KITTYKV_H

#include <stddef.h>
#include <stdint.h>

/* Every public header wraps its declarations in KKV_BEGIN_DECLS/END_DECLS:
 * C linkage for C++, and default visibility, so that the shared libraries
 * (built with hidden visibility) export exactly the public declarations. */
#if defined(__GNUC__) && !defined(KKV_NO_VISIBILITY)
#define KKV_VISIBILITY_PUSH_ _Pragma("GCC visibility push(default)")
#define KKV_VISIBILITY_POP_  _Pragma("GCC visibility pop")
#else
#define KKV_VISIBILITY_PUSH_
#define KKV_VISIBILITY_POP_
#endif
#ifdef __cplusplus
#define KKV_BEGIN_DECLS extern "C" { KKV_VISIBILITY_PUSH_
#define KKV_END_DECLS   KKV_VISIBILITY_POP_ }
#else
#define KKV_BEGIN_DECLS KKV_VISIBILITY_PUSH_
#define KKV_END_DECLS   KKV_VISIBILITY_POP_
#endif

KKV_BEGIN_DECLS

#define KKV_VERSION_MAJOR 0
#define KKV_VERSION_MINOR 1
#define KKV_VERSION_PATCH 0
/* Version of the page format of docs/FORMAT.md section 2. */
#define KKV_PAGE_FORMAT_VERSION 1

#define KKV_MAX_HEAD_DIM 256

/* ---------------------------------------------------------------- status */

typedef enum kkv_status {
    KKV_OK              = 0,
    KKV_ERR_INVALID_ARG = 1,  /* a parameter is out of range or inconsistent  */
    KKV_ERR_NOMEM       = 2,  /* malloc failed                                */
    KKV_ERR_POOL_FULL   = 3,  /* the page pool cannot take another page      */
    KKV_ERR_IO          = 4,  /* a file could not be opened/read/mapped       */
    KKV_ERR_FORMAT      = 5,  /* a file is malformed or truncated             */
    KKV_ERR_UNSUPPORTED = 6,  /* valid input this build does not handle       */
    KKV_ERR_NONFINITE   = 7,  /* NaN or Inf in keys, values or queries        */
    KKV_ERR_NOT_FOUND   = 8,  /* no such sequence, tensor, key or file        */
    KKV_ERR_CTX_FULL    = 9,  /* the sequence would exceed its context limit  */
} kkv_status;

/* A constant English name for a status ("ok", "pool full", ...). Never NULL. */
const char *kkv_status_str(kkv_status s);

/* The message of the last failure on this thread (never NULL, may be ""). */
const char *kkv_last_error(void);

/* ---------------------------------------------------------------- random */

/* The library's one pseudo-random generator, splitmix64: advances *state and
 * returns 64 random bits. Any seed is fine (0 included). */
uint64_t kkv_rng_next(uint64_t *state);
/* A uniform double in [0, 1) (53 bits) from the same generator. */
double   kkv_rng_uniform(uint64_t *state);

/* ---------------------------------------------------------------- methods */

/* How the boosted key channels of a page are chosen (docs/FORMAT.md section 1). */
typedef enum kkv_select {
    KKV_SELECT_MAGNITUDE = 0, /* top mean |k| over the page (Kitty default)      */
    KKV_SELECT_VARIANCE  = 1, /* top variance over the page (MLX adaptation)     */
    KKV_SELECT_RANDOM    = 2, /* seeded; depends on (seed, layer, head, page)    */
    KKV_SELECT_EXPLICIT  = 3, /* a fixed ranking per (layer, head) given with
                                 kkv_cache_set_rank(); "oracle" analyses use it  */
    KKV_SELECT_RANGE     = 4, /* top (max - min)^2 over the page: what boosting a
                                 channel saves in squared error                 */
} kkv_select;

/* A rotation applied per head inside the cache (docs/FORMAT.md section 5). */
typedef enum kkv_rot {
    KKV_ROT_NONE     = 0,
    KKV_ROT_HADAMARD = 1, /* Walsh-Hadamard / sqrt(D); D must be a power of 2  */
    KKV_ROT_RANDOM   = 2, /* a random orthogonal matrix seeded by `seed`       */
} kkv_rot;

/* Where a layer's boosted key channels go (docs/FORMAT.md section 5). The
 * total stays round(alpha*D) * n_kv_heads per layer and page either way. */
typedef enum kkv_budget {
    KKV_BUDGET_NONE = 0, /* round(alpha*D) per head and page (the paper)          */
    KKV_BUDGET_HEAD = 1, /* pooled over a layer's heads for the same G tokens and
                            given to the best channels by the select score        */
    KKV_BUDGET_ERR  = 2, /* the same, ranked by the measured squared-error cut of
                            4 bits over 2 (with clip=1, of the clipped ranges)    */
} kkv_budget;

/* A quantization method. Keys: per channel in groups of `group` tokens, 2 bits,
 * round(alpha*D) channels per page boosted to 4 bits (alpha = 1: 4-bit keys),
 * or 8 bits with key_bits = 8. Values: per token, value_bits bits. fp16 = 1
 * stores every token in fp16. */
typedef struct kkv_method {
    int        fp16;       /* 1: no quantization (reference and memory baseline)  */
    int        sink;       /* S: first tokens kept fp16, keys and values           */
    int        group;      /* G: page size in tokens, multiple of 4, 4..4096       */
    int        window;     /* R: recent values kept fp16                           */
    float      alpha;      /* boost fraction of key channels, in [0, 1]            */
    int        value_bits; /* 2, 4 or 8                                            */
    kkv_select select;
    uint64_t   seed;       /* for KKV_SELECT_RANDOM                                */
    int        eager_values; /* 1: a value is quantized into its page the moment it
                              leaves the R-value window (a value's group is its own
                              token, so no value Q-buffer is kept); attention then
                              sees up to G older values quantized that the paper's
                              lifecycle keeps in fp16. 0 for every named method. */
    /* Beyond the paper (docs/FORMAT.md section 5); 0 in the paper's methods. */
    int        pairs;      /* 1: boost whole RoPE pairs, ranked by the sum of
                              their two channels' scores (the cache's rope layout) */
    kkv_rot    key_rot;    /* keys are stored rotated; queries rotated alike      */
    kkv_rot    value_rot;  /* values stored rotated; outputs rotated back         */
    int        clip;       /* 1: each key channel's range searched for the least
                              squared error instead of min/max                    */
    int        value_clip; /* 1: the same for each value token's range            */
    kkv_budget budget;     /* boost budget pooled over a layer's heads, or not    */
    /* sink_int8: the sink's K and V are stored as int8 rows, one fp16 absmax
     * scale per token vector (docs/FORMAT.md section 5; kkv_mem.sink_int8).
     * window_int8, a fidelity study (stored and counted fp16): the window's
     * values are rounded through the same int8 code before they are stored. */
    int        sink_int8;
    int        window_int8;
    /* Key code width: 2 (or 0, read as 2) is the page format above, whose
     * boosted channels take 4 bits; 8 stores every channel in 8 bits (the
     * 8-bit key page of docs/FORMAT.md section 2) and needs alpha = 0. */
    int        key_bits;
} kkv_method;

/* Fills *out with the named method: "fp16", "kivi-k2v2", "kivi-k2v2s",
 * "kivi-k4v2s", "kivi-k2v4s", "kivi-k4v4", "kitty", "kitty-pro", the
 * calibration-free methods beyond the paper "kitty-plus", "kitty-plus-pro",
 * and "kivi-k8v8" (8-bit keys and values, no fp16 sink or window).
 * KKV_ERR_NOT_FOUND for any other name, KKV_ERR_INVALID_ARG for NULL. */
kkv_status kkv_method_from_name(kkv_method *out, const char *name);

/* The names above, NULL-terminated, in a fixed order (fp16 first). */
const char *const *kkv_method_names(void);

/* Parses a method spec: a name from kkv_method_names(), optionally followed by
 * ':key=value' overrides, e.g. "kitty:alpha=0.5:select=random:seed=3".
 * Keys: alpha=F (0..1), select=magnitude|variance|random|oracle, seed=N,
 * sink=N, group=N, window=N, vbits=2|4|8, kbits=2|8, eager=0|1, select=range,
 * pairs=0|1, rot=none|hadamard|random, vrot=none|hadamard|random, clip=0|1,
 * vclip=0|1, budget=none|head|err, sink8=0|1, win8=0|1.
 * select=oracle is KKV_SELECT_EXPLICIT
 * (the caller supplies rankings with kkv_cache_set_rank). A spec that sets
 * what its method would ignore is rejected: fp16 takes only group (its page
 * size), select/pairs need 0 < alpha < 1, seed needs select=random or a
 * random rotation, pairs cannot be combined with a key rotation (a rotation
 * mixes the rotary pairs), budget needs 0 < alpha < 1 and select magnitude,
 * variance or range, sink8 needs sink > 0 and win8 window > 0, kbits=8 needs
 * alpha = 0 and no clip, vbits=8 no vclip (the range search is for 2 and 4 bits).
 * KKV_ERR_NOT_FOUND for an unknown name, KKV_ERR_INVALID_ARG otherwise. */
kkv_status kkv_method_parse(kkv_method *out, const char *spec);

/* Writes the canonical spec of m into buf [cap] (NUL-terminated): the named
 * method it equals, or the closest name and the overrides that differ, so
 * kkv_method_parse(kkv_method_format(m)) == m. *n_out (may be NULL) gets the
 * length; KKV_ERR_INVALID_ARG if cap is too small. */
kkv_status kkv_method_format(char *buf, size_t cap, size_t *n_out, const kkv_method *m);

/* Checks a method against a head dimension; KKV_ERR_INVALID_ARG with a message
 * saying which field is wrong. head_dim must be a multiple of 4 in 4..256. */
kkv_status kkv_method_check(const kkv_method *m, int head_dim);

/* Number of boosted key channels: round(alpha * head_dim) with halves rounded
 * up (alpha 0.125, D 20: 3), 0..head_dim; 0 for NULL or a negative head_dim. */
int kkv_method_boost(const kkv_method *m, int head_dim);

/* ---------------------------------------------------------------- page format */
/* The page format of docs/FORMAT.md section 2, for tools, tests and save/load.
 * Key page, bytes in this order:
 *   lo    [D][G/4]        2-bit codes, low bits, token t at bits 2*(t%4)
 *   hi    [n_boost][G/4]  high 2 bits of boosted channels, row r = rank r
 *   idx   [D]             row of channel j in hi, or n_boost if not boosted
 *   scale [D] fp16, mn [D] fp16   (little-endian IEEE half)
 * 8-bit key page (key_bits = 8; no boost):
 *   codes [D][G]          one byte per code, channel-major like lo
 *   scale [D] fp16, mn [D] fp16
 * Value page (bits = 2, 4 or 8):
 *   codes [G][D*bits/8]   channel c at bits bits*(c % (8/bits))
 *   scale [G] fp16, mn [G] fp16
 * The byte counts are 0 for a shape or width these do not define.
 */
size_t kkv_key_page_bytes(int head_dim, int group, int n_boost);
size_t kkv_key8_page_bytes(int head_dim, int group);
size_t kkv_value_page_bytes(int head_dim, int group, int bits);
/* Bytes of one key page of method m (its group as G) with n_boost boosted
 * channels: kkv_key_page_bytes(), or kkv_key8_page_bytes() with key_bits 8,
 * or G * D fp16 for the fp16 method (n_boost is ignored by the last two).
 * 0 for NULL or a shape the formats do not define. */
size_t kkv_method_key_page_bytes(const kkv_method *m, int head_dim, int n_boost);

/* Quantizes G keys of one head into one key page.
 * dst: kkv_key_page_bytes() bytes. k: [G][D]. rank: [D] channel ranking, used
 * only with KKV_SELECT_EXPLICIT (rank[0] = most important channel), else NULL.
 * `page` and `seed` seed KKV_SELECT_RANDOM. Keys are first rounded to fp16. */
kkv_status kkv_key_page_encode(void *dst, const float *k, int head_dim, int group,
                               int n_boost, kkv_select sel, uint64_t seed,
                               uint64_t page, const uint8_t *rank);
/* out: [G][D], the keys as attention sees them. */
kkv_status kkv_key_page_decode(float *out, const void *src, int head_dim, int group,
                               int n_boost);
/* The same for an 8-bit key page. dst: kkv_key8_page_bytes() bytes, k: [G][D]
 * (rounded to fp16 first, as the cache does), out: [G][D]. */
kkv_status kkv_key8_page_encode(void *dst, const float *k, int head_dim, int group);
kkv_status kkv_key8_page_decode(float *out, const void *src, int head_dim, int group);
/* Quantizes G values of one head. dst: kkv_value_page_bytes(). v: [G][D]. */
kkv_status kkv_value_page_encode(void *dst, const float *v, int head_dim, int group,
                                 int bits);
/* out: [G][D]. */
kkv_status kkv_value_page_decode(float *out, const void *src, int head_dim, int group,
                                 int bits);

/* ---------------------------------------------------------------- cache */

typedef struct kkv_cache kkv_cache;

typedef struct kkv_cache_config {
    int        n_layers;   /* >= 1                                              */
    int        n_kv_heads; /* >= 1                                              */
    int        head_dim;   /* multiple of 4, 4..256                             */
    size_t     pool_bytes; /* budget for pages and per-sequence fp16 staging     */
    int        max_seqs;   /* 0: 256                                            */
    int        max_tokens; /* per sequence; 0: unlimited                        */
    int        n_threads;  /* attention worker threads; 0 or 1: caller's thread */
    kkv_method method;
    /* RoPE layout of the keys, for method.pairs (kkv_model_cache_config sets
     * it from the model's architecture): channel i's rotary partner is i ^ 1
     * (rope_neox 0: llama.cpp's normal rope, adjacent pairs) or i +- rope_dims/2
     * (rope_neox 1: NeoX halves). rope_dims: rotated channels, even, 0 = all;
     * channels past it are not rotated and count as pairs of one. */
    int        rope_neox;
    int        rope_dims;
    /* Sliding-window layers (Gemma 3's local layers): layer_window[l] > 0 makes
     * layer l attend to its newest layer_window[l] tokens only (the one just
     * appended included); 0 = all tokens. NULL: no layer has a window.
     * [n_layers], borrowed: kkv_cache_create copies it (the config the cache
     * returns points at its copy). What falls wholly before a layer's window
     * goes back to the pool as the sequence grows: each page of G tokens once
     * its key and value pages are written and all its tokens are out (the S
     * sink tokens stay stored, unattended; docs/FORMAT.md section 3);
     * kkv_seq_read() gives zeros for released tokens. */
    const int *layer_window;
} kkv_cache_config;

/* Creates an empty cache. The pool's memory is reserved, not touched. */
kkv_status kkv_cache_create(kkv_cache **out, const kkv_cache_config *cfg);
void       kkv_cache_free(kkv_cache *c);
/* The configuration the cache was created with (owned by the cache, valid
 * until kkv_cache_free; NULL for a NULL cache). */
const kkv_cache_config *kkv_cache_get_config(const kkv_cache *c);

/* Adds an empty sequence; *seq gets its id (the lowest free one). It takes
 * nothing from the pool yet: its fp16 staging (sink, key Q-buffer, value
 * window and Q-buffer) grows with it in chunks of 16 tokens per part, from the
 * pool budget, and shrinks when a flush empties a Q-buffer. KKV_ERR_POOL_FULL
 * if all max_seqs ids are in use. The sequence lives until kkv_seq_free(). */
kkv_status kkv_seq_add(kkv_cache *c, int *seq);
/* Frees a sequence and returns its staging and credit to the pool, and each
 * page and sink whose last user it was. */
kkv_status kkv_seq_free(kkv_cache *c, int seq);
/* Marks a sequence whose layers a multi-layer writer left inconsistent (a
 * forward pass that failed midway; kkv_model_forward calls it): from now on
 * kkv_append, kkv_attend, kkv_flush and kkv_seq_reserve on it return
 * KKV_ERR_INVALID_ARG ("... free it"); reads and kkv_seq_free still work.
 * KKV_ERR_NOT_FOUND if there is no such sequence. */
kkv_status kkv_seq_mark_failed(kkv_cache *c, int seq);
/* Tokens appended to layer `layer` of the sequence (-1 if no such sequence,
 * layer or cache). */
int        kkv_seq_len(const kkv_cache *c, int seq, int layer);

/* Takes from the pool now exactly what appending n_tokens more tokens to every
 * layer (append -> flush each) can need at its peak: staging and new pages.
 * The bytes become the sequence's credit, so those appends and flushes never
 * meet KKV_ERR_POOL_FULL; the credit stays while the reservation runs (staging
 * a flush frees pays for the next pages) and what is left goes back to the
 * pool once every layer has the reserved length. All or nothing:
 * KKV_ERR_POOL_FULL leaves the cache exactly as it was. Without a reservation
 * kkv_append() and kkv_flush() take from the pool on demand and give staging
 * back as soon as a flush frees it. */
kkv_status kkv_seq_reserve(kkv_cache *c, int seq, int n_tokens);

/* Adds a sequence (*child, the lowest free id) that holds exactly what
 * `parent` holds, so it continues exactly as the parent would (bit-identical
 * attention and logits). Pages whose keys and values are all written, and the
 * fp16 sink once it is full, are shared (reference-counted, never copied:
 * they never change once written); the key and value tails and the at most
 * ceil((R + G) / G) pages per layer still being written are copied. Either
 * sequence then grows on its own; a page or sink goes back to the pool when
 * its last user is freed. The child holds no credit beyond its staging.
 * KKV_ERR_POOL_FULL (or NOMEM) leaves everything as it was. For a prefix
 * cache: keep the prefix as a sequence, fork it per request. */
kkv_status kkv_seq_fork(kkv_cache *c, int *child, int parent);

/* ---------------------------------------------------------------- save / load */
/* A saved sequence (docs/STATE_FORMAT.md): versioned and self-describing
 * (method, shape, model fingerprint, token ids), the pages in the format
 * above and the fp16 parts, checksummed with XXH3-64. About as large as the
 * sequence's bytes in memory. */
#define KKV_STATE_FORMAT_VERSION 1

typedef struct kkv_state_meta {
    uint64_t       model_fingerprint; /* kkv_model_fingerprint(), or 0 without a model */
    const int32_t *tokens;            /* [n_tokens] the ids the sequence holds, or NULL */
    int            n_tokens;          /* 0.. */
} kkv_state_meta;

/* Writes sequence seq into buf [cap]; *n_out = the bytes it takes. With buf
 * NULL only *n_out is set; a too-small cap is KKV_ERR_INVALID_ARG (*n_out set).
 * meta may be NULL (no tokens, fingerprint 0). */
kkv_status kkv_seq_save(const kkv_cache *c, void *buf, size_t cap, size_t *n_out, int seq,
                        const kkv_state_meta *meta);
/* The same into a file (written whole, then renamed into place). */
kkv_status kkv_seq_save_file(const kkv_cache *c, const char *path, int seq,
                             const kkv_state_meta *meta);
/* Adds a sequence (*seq, lowest free id) from a saved state in buf [n]. The
 * state must have this cache's method, shape and the given model fingerprint.
 * tokens [tokens_cap] receives the saved token ids, *n_tokens their count (may
 * be NULL when none are wanted); a too-small tokens_cap is KKV_ERR_INVALID_ARG
 * with *n_tokens set and nothing added. Any corruption (truncation, a flipped
 * byte, another method, shape, model or a future version) is KKV_ERR_FORMAT
 * with a one-line reason; KKV_ERR_POOL_FULL if it does not fit. On any error
 * the cache is exactly as it was. The loaded sequence holds no reservation. */
kkv_status kkv_seq_load(kkv_cache *c, int *seq, const void *buf, size_t n,
                        uint64_t model_fingerprint, int32_t *tokens, int tokens_cap,
                        int *n_tokens);
/* The same from a file; KKV_ERR_IO if it cannot be read. */
kkv_status kkv_seq_load_file(kkv_cache *c, int *seq, const char *path,
                             uint64_t model_fingerprint, int32_t *tokens, int tokens_cap,
                             int *n_tokens);

/* Appends one token's key and value for one layer, all KV heads.
 * k, v: [n_kv_heads][head_dim]; k is post-RoPE. */
kkv_status kkv_append(kkv_cache *c, int seq, int layer, const float *k, const float *v);

/* Quantizes any full key Q-buffer / value Q-buffer of (seq, layer) into pages.
 * Call after kkv_attend() of the step (docs/FORMAT.md section 3). The page
 * comes from the staging the flush frees (or the sequence's credit); only
 * where a page is larger than that staging (tiny groups) and nothing was
 * reserved can it meet KKV_ERR_POOL_FULL, leaving everything as it was. */
kkv_status kkv_flush(kkv_cache *c, int seq, int layer);

/* Decode attention of n_q query heads over everything cached for (seq, layer):
 * softmax(q . k / sqrt(D)) v, fused, reading pages directly.
 * out: [n_q][D], q: [n_q][D]. n_q must be a multiple of n_kv_heads; query head h
 * uses KV head h / (n_q / n_kv_heads). */
kkv_status kkv_attend(kkv_cache *c, float *out, int seq, int layer, const float *q,
                      int n_q);

/* kkv_attend of one layer for n sequences at once (a decode step's batch), in
 * one parallel pass: every sequence's work shares the threads, so short ones
 * do not leave a thread idle. seqs: [n] (may repeat); q, out: [n][n_q][D],
 * row block i for seqs[i]. Each block is bit-identical to kkv_attend's for its
 * sequence. Reads the cache only; keeps no pointer to out, q or seqs. On an
 * error (message from the first failing check) out is unspecified. */
kkv_status kkv_attend_batch(kkv_cache *c, float *out, const int *seqs, int n, int layer,
                            const float *q, int n_q);

/* Sets the channel ranking for KKV_SELECT_EXPLICIT. rank: [D], a permutation of
 * 0..D-1, most important first. */
kkv_status kkv_cache_set_rank(kkv_cache *c, int layer, int head, const uint8_t *rank);

/* Reads back the keys and values of (seq, layer, head) exactly as attention sees
 * them (fp16 parts widened, pages dequantized). k, v: [n][D] with
 * n = kkv_seq_len(); either may be NULL. For tests and analysis tools. */
kkv_status kkv_seq_read(const kkv_cache *c, float *k, float *v, int seq, int layer,
                        int head);

/* Where the tokens of one layer of a sequence are (docs/FORMAT.md section 3). */
typedef struct kkv_seq_info {
    int len;         /* tokens appended to the layer                     */
    int sink;        /* of which in the fp16 sink                        */
    int key_pages;   /* key pages written (G tokens each)                */
    int value_pages; /* value pages written                              */
    int key_buffer;  /* keys in the fp16 key Q-buffer                    */
    int value_tail;  /* values in fp16 after the value pages (Q-buffer +
                        window)                                          */
} kkv_seq_info;

kkv_status kkv_seq_get_info(const kkv_cache *c, kkv_seq_info *out, int seq, int layer);

/* Copies the key page `page` of (seq, layer, head) in the format above. Its
 * n_boost is kkv_seq_key_page_boost(); dst_bytes must be at least
 * kkv_key_page_bytes(D, G, that), or kkv_key8_page_bytes(D, G) for a method
 * with key_bits 8. */
kkv_status kkv_seq_key_page(const kkv_cache *c, void *dst, size_t dst_bytes, int seq,
                            int layer, int head, int page);

/* Boosted channels of that key page: kkv_method_boost() for every page unless
 * the method pools its budget (budget=head|err), where each page has its own,
 * 0..D, summing to kkv_method_boost() * n_kv_heads over the heads. -1 (and
 * nothing else) when there is no such page. Reads only. */
int kkv_seq_key_page_boost(const kkv_cache *c, int seq, int layer, int head, int page);

/* ---------------------------------------------------------------- accounting */

/* Bytes actually stored, by component. No estimates. */
typedef struct kkv_mem {
    uint64_t key_lo;      /* key pages: low 2-bit plane (key_bits 8: the codes)  */
    uint64_t key_hi;      /* key pages: high 2-bit plane of boosted channels     */
    uint64_t key_idx;     /* key pages: boost index                             */
    uint64_t key_meta;    /* key pages: fp16 scale + min                        */
    uint64_t value_codes; /* value pages: codes                                 */
    uint64_t value_meta;  /* value pages: fp16 scale + min                      */
    uint64_t fp16;        /* fp16 tokens held: sink, Q-buffers, window (and all
                             pages of the fp16 method)                          */
    uint64_t total;       /* sum of the above                                   */
    uint64_t capacity;    /* bytes the pool gave the sequence: its pages and sink,
                             shared or not, plus its staging and the credit it
                             holds for its next pages (see kkv_seq_reserve)     */
    uint64_t tokens;      /* tokens held, summed over sequences (per layer)     */
    double   bits_per_element; /* 8*total / (2 * tokens * layers * kv_heads * D) */
    uint64_t shared;      /* of capacity: page and sink bytes other sequences
                             also hold (forks); the pool-wide figure counts each
                             once                                               */
    uint64_t used;        /* pool: bytes handed out, shared pages once (capacity
                             minus kkv_cache_free_bytes); sequence: = capacity  */
    uint64_t sink_int8;   /* int8 sink rows (sink_int8): codes + fp16 scales; in
                             total, after the fields above it                   */
} kkv_mem;

kkv_status kkv_seq_mem(const kkv_cache *c, kkv_mem *out, int seq);
/* The whole pool: every sequence, and capacity = the pool budget. */
kkv_status kkv_cache_mem(const kkv_cache *c, kkv_mem *out);
/* Several sequences together (seqs: [n], distinct ids): a page two of them
 * share counts once, as kkv_cache_mem counts it for all; capacity = used =
 * the bytes they hold between them; shared = of those, page bytes some
 * sequence (in the set or not) also holds. A server's prefix cache reports
 * its entries' bytes with it. Writes *out only; KKV_ERR_NOT_FOUND for an id
 * that is not a live sequence, KKV_ERR_INVALID_ARG for one listed twice. */
kkv_status kkv_seqs_mem(const kkv_cache *c, kkv_mem *out, const int *seqs, int n);
/* Bytes the pool still has free (0 for NULL). */
uint64_t   kkv_cache_free_bytes(const kkv_cache *c);

KKV_END_DECLS
#endif /* KITTYKV_H */
