/*
 * kittykv_model.h -- the GGUF engine: model load (mmap, weights in their
 * quantized blocks), tokenizer, forward pass through a kittykv cache, ragged
 * batch decode, sampling and detokenizing. Link `kittykv-model` (pkg-config
 * kittykv-model, CMake kittykv::model); it depends on the core library.
 *
 * Tutorial (a complete program; tests/install/ builds and runs it with the
 * default model's path as argv[1])
 * --------
 *     #include <stdio.h>
 *     #include <stdlib.h>
 *     #include <string.h>
 *     #include <kittykv_model.h>
 *
 *     int main(int argc, char **argv) {
 *         if (argc < 2) return 2;
 *         kkv_model *m;
 *         if (kkv_model_load(&m, argv[1], 0) != KKV_OK) {
 *             fprintf(stderr, "kittykv: %s\n", kkv_last_error());
 *             return 1;
 *         }
 *         kkv_model_info info;
 *         kkv_model_get_info(m, &info);
 *         kkv_method kitty;
 *         kkv_method_parse(&kitty, "kitty");
 *         kkv_cache_config cfg = kkv_model_cache_config(m, &kitty, 64u << 20);
 *         kkv_cache *c;
 *         int seq, n;
 *         int32_t *toks;                          // malloc'd by the library
 *         const char *text = "The capital of France is";
 *         if (kkv_cache_create(&c, &cfg) != KKV_OK || kkv_seq_add(c, &seq) != KKV_OK ||
 *             kkv_tokenize_alloc(m, &toks, &n, text, strlen(text), 1, 0) != KKV_OK)
 *             return 1;
 *         float *logits = malloc(sizeof(float) * (size_t)info.n_vocab);  // [n_vocab]
 *         kkv_status s = kkv_model_forward(m, c, logits, seq, toks, n, 0);
 *         for (int i = 0; s == KKV_OK && i < 8; i++) {       // 8 greedy tokens
 *             int32_t next = kkv_argmax(logits, info.n_vocab);
 *             char piece[64];
 *             size_t len;
 *             if (kkv_token_piece(m, piece, sizeof piece, &len, next) == KKV_OK)
 *                 fwrite(piece, 1, len, stdout);
 *             s = kkv_model_forward(m, c, logits, seq, &next, 1, 0);
 *         }
 *         printf("\n");
 *         free(logits);
 *         free(toks);
 *         kkv_cache_free(c);
 *         kkv_model_free(m);
 *         return s == KKV_OK ? 0 : 1;
 *     }
 */
#ifndef KITTYKV_MODEL_H
#define KITTYKV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kittykv.h"
#include "kittykv_cpu.h"

KKV_BEGIN_DECLS

/* ---------------------------------------------------------------- model */

typedef struct kkv_model kkv_model;

typedef struct kkv_model_info {
    char  arch[32];      /* general.architecture, e.g. "llama"       */
    char  name[128];     /* general.name, may be ""                  */
    int   n_layers;
    int   n_embd;
    int   n_heads;
    int   n_kv_heads;
    int   head_dim;
    int   n_ff;
    int   n_vocab;
    int   n_ctx_train;
    float rope_theta;
    float rms_eps;
    int   bos;           /* token ids, -1 if none */
    int   eos;
    int   eot;           /* end of turn (<|im_end|>), -1 if none */
    uint64_t weight_bytes;
    /* RoPE layout: which dims of a head rotate together. 0: adjacent pairs
     * (2i, 2i+1) (llama: llama.cpp's converter permutes Q/K rows so);
     * 1: NeoX halves (i, i + rope_dims/2) (qwen2, qwen3). Pair i turns by
     * pos * theta^(-2i/rope_dims), divided by any rope scaling. */
    int   rope_neox;
    int   rope_dims;     /* dims of each head that rotate (<= head_dim) */
    /* Sliding-window attention (gemma3): the windowed ("local") layers attend
     * to their newest sliding_window tokens only, the token itself included;
     * kkv_model_layer_window() says which layers. 0: every layer is global. */
    int   sliding_window;
    float rope_theta_swa; /* RoPE base of the windowed layers (= rope_theta without) */
} kkv_model_info;

/* Loads a GGUF model (mmap). n_threads: threads for matmuls (0: all cores).
 * Architectures: llama (incl. Llama 3 rope_freqs / linear rope scaling),
 * qwen2 (QKV biases, NeoX RoPE), qwen3 (per-head Q/K RMSNorm, NeoX RoPE),
 * gemma3 (QK-norm, post-norms, GeGLU, embedding scale, sliding-window layers
 * with their own RoPE base; the norms as llama.cpp's converter stores them,
 * Gemma's 1 + w already added).
 * KKV_ERR_IO (not found, unreadable, not a regular file: a FIFO fails at
 * once), KKV_ERR_FORMAT (malformed GGUF, inconsistent shapes, a tokenizer
 * vocabulary whose size is not token_embd's row count), KKV_ERR_UNSUPPORTED
 * (architecture, tensor type or rope scaling, named). Every message names the
 * path once; on success kkv_last_error() is "". Free with kkv_model_free; the
 * model owns the mapping, and nothing it returns outlives it. */
kkv_status kkv_model_load(kkv_model **out, const char *path, int n_threads);
/* Loads only the vocabulary of a GGUF (no weights: tokenize, token pieces and
 * detokenize work, forward calls fail with KKV_ERR_INVALID_ARG). pre names a
 * pre-tokenizer to use instead of the file's tokenizer.ggml.pre (NULL: the
 * file's; kkv_pretokenizer_names() lists them; a SentencePiece vocabulary
 * has none, so pre must be NULL there). Free with kkv_model_free. */
kkv_status kkv_model_load_vocab(kkv_model **out, const char *path, const char *pre);
void       kkv_model_free(kkv_model *m);
/* Copies the model's shape into *out (zeros for a NULL model). */
void       kkv_model_get_info(const kkv_model *m, kkv_model_info *out);
/* Runs the model's matmuls on tp (borrowed; it must outlive the model or the
 * next call), or on the model's own pool again with tp = NULL. */
kkv_status kkv_model_set_threadpool(kkv_model *m, kkv_threadpool *tp);
/* exact = 1: matmuls dequantize each weight row and take the fp32
 * activations as they are, instead of rounding them to 8-bit blocks (the fast
 * default, as ggml does). Slower; for checking against a full-precision
 * reference, where the rounding's step function makes trajectories drift. */
kkv_status kkv_model_set_exact_matmul(kkv_model *m, int exact);

/* Observer of the attention inputs, for analysis tools: called for every token
 * and layer of every forward pass, after RoPE and before the token's K/V enter
 * the cache, in layer order and token order within a layer. q: [n_heads][D],
 * k, v: [n_kv_heads][D]; valid only during the call. pos is the token's
 * position in its sequence. */
typedef void (*kkv_qkv_hook)(void *user, int seq, int layer, int64_t pos, const float *q,
                             const float *k, const float *v);
/* Installs (fn) or removes (NULL) the hook. */
void kkv_model_set_qkv_hook(kkv_model *m, kkv_qkv_hook fn, void *user);

/* A 64-bit fingerprint of the model's weights (XXH3 over every tensor's name,
 * type, shape and bytes, computed once by kkv_model_load: ~10 ms per 100 MB),
 * never 0 for a loaded model (0 for a vocabulary-only one or NULL).
 * kkv_seq_save()/kkv_seq_load() callers use it to refuse states of another
 * model. */
uint64_t kkv_model_fingerprint(const kkv_model *m);

/* Bytes of weight matrices one decode step streams from memory: every
 * layer's Q, K, V, output and feed-forward projections and the output
 * (vocabulary) matrix, as the matmuls read them. The embedding row and the
 * norm and bias vectors are left out (under 0.2% for SmolLM2 and Gemma 3).
 * Divided by a step's time it is the bandwidth the weights alone demand, the
 * roofline of decode at short context. 0 for a vocabulary-only model or NULL. */
uint64_t kkv_model_decode_bytes(const kkv_model *m);

/* The parts of a forward pass that kkv_model_profile times (numbers are
 * stable; new parts are added at the end). */
typedef enum kkv_model_part {
    KKV_PART_QKV = 0,       /* attention norm, Q/K/V projections, biases, QK norms, RoPE */
    KKV_PART_ATTENTION = 1, /* the cache: append, attend, flush */
    KKV_PART_OUT_PROJ = 2,  /* attention output projection, post-norm, residual */
    KKV_PART_FFN = 3,       /* FFN norm, gate/up, activation, down, post-norm, residual */
    KKV_PART_HEAD = 4,      /* output norm and the vocabulary projection */
    KKV_PART_OTHER = 5,     /* embedding rows, RoPE tables, argument checks, reservation */
    KKV_PART_COUNT = 6
} kkv_model_part;

/* enable 1: start timing the parts of m's forward passes (kkv_model_forward,
 * kkv_model_decode_batch) from zero; 0: stop (the totals stay readable).
 * Off by default; while on, a pass reads the monotonic clock ~5 times per
 * layer (well under 1% of a SmolLM2 step). For benchmarks and tuning; the
 * pass computes the same bits either way. */
kkv_status kkv_model_profile(kkv_model *m, int enable);
/* Wall seconds spent in each part since profiling last started, summed over
 * the passes timed: seconds [n] gets parts 0..n-1 (n is the caller's
 * KKV_PART_COUNT, so a library with more parts never writes past it; parts
 * this library lacks read 0); *passes: how many passes (may be NULL). The
 * parts add up to the passes' wall time. Zeros when profiling never started.
 * KKV_ERR_INVALID_ARG for NULL m or seconds, or n < 0. */
kkv_status kkv_model_profile_get(const kkv_model *m, double *seconds, int n, int64_t *passes);
/* A short name of a part ("qkv", "attention", "out_proj", "ffn", "head",
 * "other"), or "?" for a number outside 0..KKV_PART_COUNT-1. Static. */
const char *kkv_model_part_name(int part);

/* The sliding window of one layer in tokens (0: global attention, or no such
 * layer or model). kkv_model_cache_config() passes every layer's to the cache. */
int kkv_model_layer_window(const kkv_model *m, int layer);

/* For tests and experiments: window > 0 replaces the sliding window of every
 * windowed layer (the model is then not the one it was trained as; a short
 * window lets a short run exercise the windowed path). Caches must be made
 * after it (kkv_model_cache_config). KKV_ERR_INVALID_ARG for window < 1 or a
 * model without windowed layers. */
kkv_status kkv_model_set_sliding_window(kkv_model *m, int window);

/* A cache config with the model's shape, the method and the budget, and the
 * model's per-layer windows (layer_window points into the model: valid while
 * it lives; the cache copies it at kkv_cache_create). */
kkv_cache_config kkv_model_cache_config(const kkv_model *m, const kkv_method *method,
                                        size_t pool_bytes);

/* Runs n tokens of one sequence through the model, appending their K/V to
 * every layer of the cache (each token attends to the cache as stored, exactly
 * as n single-token calls would). logits: [n][n_vocab] if all_logits, else
 * [n_vocab] for the last token; may be NULL. Before touching the cache it
 * reserves every page the n tokens need: KKV_ERR_POOL_FULL, KKV_ERR_CTX_FULL
 * and bad arguments (n < 1, a token outside the vocabulary, a cache of
 * another shape) leave it as it was.
 * Failing midway -- KKV_ERR_NONFINITE (an activation overflowed to Inf/NaN)
 * or KKV_ERR_NOMEM for scratch memory -- cannot be undone once pages were
 * quantized, so the contract is: if no layer of the sequence changed, it is as
 * it was; otherwise some layers hold some of the n tokens and the sequence is
 * marked failed: kkv_append/attend/flush/reserve and further forward passes
 * on it return KKV_ERR_INVALID_ARG ("... free it") until kkv_seq_free(). The
 * way back is kkv_seq_free(), kkv_seq_add() and the tokens again. */
kkv_status kkv_model_forward(kkv_model *m, kkv_cache *c, float *logits, int seq,
                             const int32_t *tokens, int n, int all_logits);

/* One decode step for a ragged batch: token tokens[i] is appended to sequence
 * seqs[i] (all distinct). logits: [n][n_vocab]. All or nothing for the pool;
 * a failure midway marks every sequence it changed, as kkv_model_forward(). */
kkv_status kkv_model_decode_batch(kkv_model *m, kkv_cache *c, float *logits,
                                  const int *seqs, const int32_t *tokens, int n);

/* Tokenizes UTF-8 text (byte-level BPE or SentencePiece, as the GGUF's
 * tokenizer.ggml.model says). add_bos: prepend BOS when the model has one and
 * wants it. special: parse special-token text such as "<|im_start|>" into
 * their ids (SentencePiece's user-defined tokens always are, as there).
 * tokens: [cap]; *n_out gets the count; KKV_ERR_INVALID_ARG if cap is too small
 * (*n_out then holds the count needed). */
kkv_status kkv_tokenize(const kkv_model *m, int32_t *tokens, int cap, int *n_out,
                        const char *text, size_t len, int add_bos, int special);
/* The raw bytes of one token (not NUL-terminated): buf [cap]; *n_out = length. */
kkv_status kkv_token_piece(const kkv_model *m, char *buf, size_t cap, size_t *n_out,
                           int32_t token);

/* Tokenizes like kkv_tokenize into a buffer it allocates: *tokens gets a
 * malloc'd [*n_out] array the caller frees with free() (never NULL on success,
 * even for an empty text). */
kkv_status kkv_tokenize_alloc(const kkv_model *m, int32_t **tokens, int *n_out,
                              const char *text, size_t len, int add_bos, int special);

/* The UTF-8 text of tokens [n] (the concatenated raw pieces; byte sequences
 * that are not valid UTF-8 become U+FFFD). buf [cap]; *n_out = bytes written
 * (or needed, with KKV_ERR_INVALID_ARG when cap is too small). Not
 * NUL-terminated. Ids outside the vocabulary: KKV_ERR_INVALID_ARG. */
kkv_status kkv_detokenize(const kkv_model *m, char *buf, size_t cap, size_t *n_out,
                          const int32_t *tokens, int n);

/* The pre-tokenizer names this build knows, NULL-terminated. */
const char *const *kkv_pretokenizer_names(void);

/* ---- chat templates ----
 * The model's tokenizer.chat_template is recognised as one of a few families
 * (no Jinja is run) and applied by code with the model's own special tokens:
 *   chatml   <|im_start|>ROLE\nCONTENT<|im_end|>\n ... (SmolLM2, Qwen); a default
 *            system message written into the model's template is kept
 *   llama3   <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>
 *   gemma    <start_of_turn>ROLE\nCONTENT<end_of_turn>\n, assistant -> model,
 *            a system message prefixed to the first turn (Gemma 3)
 *   llama2   [INST] <<SYS>>\nSYSTEM\n<</SYS>>\n\nUSER [/INST] ANSWER </s><s>[INST] ...
 *   mistral  [INST] USER [/INST]ANSWER</s>[INST] ...; a system message is
 *            prefixed to the first turn with a blank line
 * The text omits the leading BOS: tokenize it with add_bos = 1, special = 1. */
typedef struct kkv_chat_msg {
    const char *role;    /* "system", "user" or "assistant" */
    const char *content; /* UTF-8, NUL-terminated */
} kkv_chat_msg;

/* The family names above, NULL-terminated (static storage). */
const char *const *kkv_chat_template_names(void);

/* *name = the family of the model's own template (static storage).
 * KKV_ERR_NOT_FOUND if the file has no tokenizer.chat_template,
 * KKV_ERR_UNSUPPORTED if it is none of the known families. */
kkv_status kkv_chat_template_detect(const kkv_model *m, const char **name);

/* Formats msgs[0..n) as a prompt, plus the assistant's opening when
 * add_generation_prompt. template_name: a family name, or NULL for the
 * model's own (as kkv_chat_template_detect). buf: [cap]; *len = the text's
 * length without the NUL, set even when it does not fit (then
 * KKV_ERR_INVALID_ARG and buf untouched). Other errors: an unknown name, an
 * unrecognised or missing model template, a role other than the three (or
 * "system" past the first message where the family has no place for it), a
 * family whose special tokens the vocabulary lacks. The result borrows
 * nothing; buf is the caller's. Works on a kkv_model_load_vocab model too. */
kkv_status kkv_chat_format(const kkv_model *m, char *buf, size_t cap, size_t *len,
                           const kkv_chat_msg *msgs, int n, int add_generation_prompt,
                           const char *template_name);

/* ---------------------------------------------------------------- UTF-8 */

/* Streaming UTF-8 assembly for printing token pieces as they are generated: a
 * piece may end inside a multi-byte character, so bytes are held until their
 * sequence completes. Output is always valid UTF-8: each maximal ill-formed
 * subpart (Unicode's "substitution of maximal subparts") becomes one U+FFFD.
 * A plain struct: no allocation, nothing to free. */
typedef struct kkv_utf8_stream {
    unsigned char pend[4]; /* [n_pend] bytes of an incomplete sequence */
    int           n_pend;
    int           need;    /* total length of the pending sequence */
} kkv_utf8_stream;

/* Worst-case output bytes of one feed of n bytes (or of a flush, n = 0). */
#define KKV_UTF8_STREAM_BOUND(n) (3 * ((n) + 4))

void   kkv_utf8_stream_init(kkv_utf8_stream *s);
/* Feeds n bytes; writes the complete sequences they finish to out, which must
 * hold KKV_UTF8_STREAM_BOUND(n) bytes; returns the bytes written. */
size_t kkv_utf8_stream_feed(kkv_utf8_stream *s, char *out, const char *in, size_t n);
/* Ends the stream: a held incomplete sequence becomes U+FFFD. out: [3].
 * Returns the bytes written (0 or 3); the stream is empty again. */
size_t kkv_utf8_stream_flush(kkv_utf8_stream *s, char *out);
/* Length (1..4) of the valid UTF-8 sequence at p[0..n), or 0 if invalid or
 * truncated. */
size_t kkv_utf8_valid_len(const unsigned char *p, size_t n);

/* ---------------------------------------------------------------- sampling */

/* Next-token sampling, reentrant (all state in the handle) and deterministic:
 * the same (params, seed, logits) sequence gives the same tokens.
 * Order: repeat penalty over the last repeat_last_n accepted tokens, then
 * temperature; top-k, top-p (nucleus), min-p cut the candidates; a seeded
 * splitmix64 draw picks one. temp 0 is greedy (argmax, ties to the lower id). */
typedef struct kkv_sampler_params {
    float    temp;           /* >= 0; 0: greedy                          */
    int      top_k;          /* >= 0; 0: off                             */
    float    top_p;          /* (0, 1]; 1: off                           */
    float    min_p;          /* [0, 1); 0: off (relative to the top p)   */
    float    repeat_penalty; /* >= 1 ... 1: off (llama.cpp's rule)       */
    int      repeat_last_n;  /* >= 0 tokens of history for the penalty   */
    uint64_t seed;
} kkv_sampler_params;

typedef struct kkv_sampler kkv_sampler;

/* temp 0.8, top_k 0, top_p 0.95, min_p 0, repeat_penalty 1, last_n 64, seed 0. */
kkv_sampler_params kkv_sampler_defaults(void);
/* KKV_ERR_INVALID_ARG for a parameter out of range. Free with kkv_sampler_free. */
kkv_status kkv_sampler_create(kkv_sampler **out, const kkv_sampler_params *p);
void       kkv_sampler_free(kkv_sampler *s);
/* Picks a token from logits [n_vocab] (not modified) into *token. */
kkv_status kkv_sampler_sample(kkv_sampler *s, int32_t *token, const float *logits,
                              int n_vocab);
/* Records a token in the history the repeat penalty looks at (the prompt's
 * tokens, then each generated one). */
kkv_status kkv_sampler_accept(kkv_sampler *s, int32_t token);
/* Forgets the history and restarts the PRNG from seed. */
void       kkv_sampler_reset(kkv_sampler *s, uint64_t seed);

/* Index of the largest value of x [n], n >= 1; ties and NaN go to the lower
 * index (a NaN is never chosen over a number). */
int32_t kkv_argmax(const float *x, int n);

KKV_END_DECLS
#endif /* KITTYKV_MODEL_H */
