/*
 * kittykv_eval.h -- fidelity evaluation: several KV cache methods run in
 * lock-step over the same tokens, each compared with an fp16 cache at every
 * scored position (perplexity, KL divergence mean/p99/max, top-1 agreement),
 * the distribution statistics behind it, and pool sizing. Link `kittykv-eval`
 * (pkg-config kittykv-eval, CMake kittykv::eval); it depends on the model and
 * core libraries. What `kittykv eval` prints comes from one kkv_eval_run().
 *
 * Tutorial (a complete program; tests/install/ builds and runs it with the
 * default model's path as argv[1])
 * --------
 *     #include <stdio.h>
 *     #include <stdlib.h>
 *     #include <string.h>
 *     #include <kittykv_eval.h>
 *
 *     int main(int argc, char **argv) {
 *         if (argc < 2) return 2;
 *         kkv_model *m;
 *         if (kkv_model_load(&m, argv[1], 0) != KKV_OK) return 1;
 *         const char *text = "A cache holds the keys and values of many sequences "
 *                            "for every layer and head of one model.";
 *         int32_t *toks;
 *         int n;
 *         if (kkv_tokenize_alloc(m, &toks, &n, text, strlen(text), 1, 0) != KKV_OK) return 1;
 *         const char *specs[] = {"kivi-k2v2:group=8:window=4", "kitty:group=8:sink=2:window=4"};
 *         kkv_eval_config cfg = kkv_eval_defaults();
 *         cfg.n_tokens = n;
 *         cfg.score_from = 4;
 *         kkv_eval_result res[2];
 *         if (kkv_eval_run(res, NULL, m, toks, &cfg, specs, 2) != KKV_OK) {
 *             fprintf(stderr, "kittykv: %s\n", kkv_last_error());
 *             return 1;
 *         }
 *         for (int i = 0; i < 2; i++)
 *             printf("%-32s KL %.4f  top-1 %.3f  %.2f bits/element\n", res[i].spec,
 *                    res[i].kld_mean, res[i].top1, res[i].mem.bits_per_element);
 *         kkv_eval_results_free(res, 2);
 *         free(toks);
 *         kkv_model_free(m);
 *         return 0;
 *     }
 */
#ifndef KITTYKV_EVAL_H
#define KITTYKV_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "kittykv.h"
#include "kittykv_model.h"

KKV_BEGIN_DECLS

/* ---------------------------------------------------------------- lock-step eval */

/* Progress of a run: done of total decode steps, seconds since scoring began.
 * Called from the calling thread, at least once at the start and at the end. */
typedef void (*kkv_eval_progress_fn)(void *user, long done, long total, double seconds);

typedef struct kkv_eval_config {
    int            n_tokens;   /* tokens used (>= score_from + 1)               */
    int            score_from; /* P: tokens prefilled before scoring, >= 1      */
    int            chunk;      /* tokens per forward call while scoring, >= 1   */
    int            n_threads;  /* attention threads of each cache (0: caller)   */
    kkv_threadpool *pool;      /* or: every cache borrows this pool (and then
                                  n_threads is ignored); NULL: their own       */
    int            keep_kld;   /* keep the per-position KL arrays in results    */
    const uint8_t *ranks;      /* [n_layers][n_kv_heads][head_dim] channel
                                  rankings for select=oracle specs, or NULL
                                  (borrowed for the call)                       */
    kkv_eval_progress_fn progress; /* or NULL                                   */
    void          *progress_user;
} kkv_eval_config;

/* n_tokens 0 (set it), score_from 1, chunk 64, n_threads 0, no KL arrays. */
kkv_eval_config kkv_eval_defaults(void);

/* What one method scored. */
typedef struct kkv_eval_result {
    char       spec[128];  /* the method spec as given                           */
    kkv_method method;     /* as parsed                                          */
    long       scored;     /* predictions compared                               */
    double     nll_sum;    /* sum of -log p(next token)                          */
    double     ppl;        /* exp(nll_sum / scored)                              */
    double     dppl_pct;   /* 100 * (ppl / ppl_fp16 - 1)                         */
    double     kld_mean, kld_p99, kld_max; /* KL(p_fp16 || p_method), nats       */
    double     top1;       /* share of positions whose argmax equals fp16's      */
    double     seconds;    /* wall time spent in this method's forward passes    */
    kkv_mem    mem;        /* the cache at the end (kkv_seq_mem)                 */
    double    *kld;        /* [scored] per-position KL when keep_kld, owned by
                              the result (kkv_eval_results_free); else NULL      */
} kkv_eval_result;

/* Runs fp16 and every spec (kkv_method_parse syntax) over tokens [n_tokens] in
 * lock-step: each spec gets its own cache and sequence; the first score_from
 * tokens are prefilled, every later token goes through kkv_model_forward in
 * chunks of `chunk` tokens. The forward pass attends token by token to the
 * cache as stored, so every chunk size gives bit-identical logits; chunk 1 is
 * plain decode. Scored predictions: the logits after token i
 * (score_from-1 <= i <= n-2) against token i+1, so scored = n_tokens -
 * score_from. A spec of exactly "fp16" is reported from the reference run.
 * res: [n_specs], filled; release with kkv_eval_results_free. ref (may be
 * NULL) gets the fp16 reference's own result. */
kkv_status kkv_eval_run(kkv_eval_result *res, kkv_eval_result *ref, kkv_model *m,
                        const int32_t *tokens, const kkv_eval_config *cfg,
                        const char *const *specs, int n_specs);

/* Frees the kld arrays of res [n]. NULL is a no-op. */
void kkv_eval_results_free(kkv_eval_result *res, int n);

/* ---------------------------------------------------------------- sizing */

/* Pool bytes that hold exactly n_tokens of one sequence with cfg's shape and
 * method (measured on a throw-away cache, so it follows the cache's layout). */
kkv_status kkv_eval_pool_bytes(size_t *out, const kkv_cache_config *cfg, int n_tokens);

/* Creates a cache for the model and method sized for n_tokens of one
 * sequence, with that sequence added (*seq) and its pages reserved. ranks as
 * in kkv_eval_config (used when the method selects KKV_SELECT_EXPLICIT).
 * Free with kkv_cache_free. */
kkv_status kkv_eval_cache_create(kkv_cache **out, int *seq, const kkv_model *m,
                                 const kkv_method *method, int n_tokens, int n_threads,
                                 const uint8_t *ranks);

/* ---------------------------------------------------------------- texts */

/* Largest text file kkv_eval_tokenize_file reads (256 MiB). */
#define KKV_EVAL_MAX_TEXT_BYTES ((size_t)1 << 28)

/* Tokenizes a whole text file (BOS if the model wants one; special-token text
 * stays plain text): *tokens gets a malloc'd [*n] array the caller frees.
 * The file is read by kkv_file_read() with KKV_EVAL_MAX_TEXT_BYTES as the cap:
 * KKV_ERR_IO (with strerror; a directory), KKV_ERR_INVALID_ARG (larger than
 * the cap: /dev/zero fails fast). */
kkv_status kkv_eval_tokenize_file(int32_t **tokens, int *n, const kkv_model *m,
                                  const char *path);

/* ---------------------------------------------------------------- files */

/* Reads the whole of path into a malloc'd buffer with a NUL after the data
 * (*out, freed by the caller with free(); *len = bytes without the NUL).
 * Pipes, FIFOs and character devices are read until EOF but never beyond
 * max_bytes. KKV_ERR_IO (cannot open: strerror; a directory; a read error),
 * KKV_ERR_INVALID_ARG (more than max_bytes; NULL), KKV_ERR_NOMEM. On failure
 * *out is NULL. Every message names the path (escaped) once. */
kkv_status kkv_file_read(char **out, size_t *len, const char *path, size_t max_bytes);

/* Where the [rows][cols] float32 data of a tensor file image buf [len] lies:
 * a NumPy .npy ('\x93NUMPY' magic; '<f4', C order, 2-D, cols checked against
 * the header) or raw little-endian rows (len a multiple of 4 * cols). Every
 * size is checked for overflow and against len, so on success
 * *rows * cols * 4 == len - *data_off and the data is buf + *data_off.
 * KKV_ERR_FORMAT with the reason, KKV_ERR_INVALID_ARG (cols < 1, NULL);
 * `name` (may be NULL) labels the messages. */
kkv_status kkv_tensor_parse(int64_t *rows, size_t *data_off, const void *buf, size_t len,
                            int cols, const char *name);

/* ---------------------------------------------------------------- passkey */

/* Passkey retrieval: a 5-digit key hidden at a chosen depth of a synthetic
 * haystack (filler sentences) inside SmolLM2's ChatML template; the assistant
 * turn starts with "The pass key is", and a trial passes when the greedy
 * answer (at most KKV_PASSKEY_ANSWER_TOKENS tokens, stopping at end of turn)
 * contains the key. Every method sees exactly the same token ids. */
#define KKV_PASSKEY_ANSWER_TOKENS 8
#define KKV_PASSKEY_ANSWER_BYTES  256

typedef struct kkv_passkey_config {
    const int   *lengths;   /* [n_lengths] prompt lengths in tokens (borrowed) */
    int          n_lengths;
    const float *depths;    /* [n_depths] needle depths in [0, 1] (borrowed)   */
    int          n_depths;
    int          trials;    /* keys per (method, length, depth), >= 1         */
    uint64_t     seed;      /* of the keys                                    */
    int          n_threads; /* attention threads of each cache (0: caller)    */
    kkv_threadpool *pool;   /* or: the cache borrows this pool; NULL: its own */
    kkv_eval_progress_fn progress; /* per trial, or NULL                       */
    void        *progress_user;
} kkv_passkey_config;

/* Lengths 1024..8192, depths 0.1/0.5/0.9, 3 trials, seed 1 (static arrays). */
kkv_passkey_config kkv_passkey_defaults(void);

typedef struct kkv_passkey_cell {
    int     tokens;            /* prompt length built, in tokens               */
    int     trials, correct;
    double  accuracy;          /* correct / trials                             */
    double  ci_lo, ci_hi;      /* 95% Wilson score interval of the accuracy    */
    int    *keys;              /* [trials] the keys, owned                     */
    char  (*answers)[KKV_PASSKEY_ANSWER_BYTES]; /* [trials] answers, owned     */
} kkv_passkey_cell;

/* Runs every spec over every (length, depth, trial). cells:
 * [n_specs][n_lengths][n_depths], filled; free their arrays with
 * kkv_passkey_cells_free (a failed run frees them itself). */
kkv_status kkv_passkey_run(kkv_passkey_cell *cells, kkv_model *m, const kkv_passkey_config *cfg,
                           const char *const *specs, int n_specs);
void       kkv_passkey_cells_free(kkv_passkey_cell *cells, size_t n);
/* The filler sentence and the needle's printf format (for help texts). */
void       kkv_passkey_texts(const char **filler, const char **needle);

/* ---------------------------------------------------------------- statistics */

/* out[v] = x[v] - logsumexp(x), in double. out: [n], x: [n], n >= 1. Two calls
 * on equal x give bit-equal out, which is what makes KL(p || p) exactly 0. */
void   kkv_log_softmax(double *out, const float *x, int n);
/* KL(p || q) = sum_v p_v (logp_v - logq_v) in double. p: [n] = exp(logp),
 * logp, logq: [n]. Terms with p_v = 0 count 0. Not clamped. */
double kkv_kl(const double *p, const double *logp, const double *logq, int n);
/* The pct-th percentile (0..100) of v [n] by the nearest-rank rule
 * (sorted[ceil(pct/100 * n) - 1]); sorts v in place. 0 for n = 0. */
double kkv_percentile(double *v, long n, double pct);
/* Half-width of a 95% confidence interval for the mean of x [n], by batch
 * means: x cut into B = min(32, n) runs of consecutive values (n / B each,
 * give or take one), t_{0.975, B-1} * sd(run means) / sqrt(B). Neighbouring
 * positions of a text are correlated, so the per-position standard error
 * would be too narrow; runs of ~100 positions absorb most of that. NaN when
 * x is NULL, n < 2 or some x is not finite. Reads x only. */
double kkv_mean_ci95(const double *x, long n);

KKV_END_DECLS
#endif /* KITTYKV_EVAL_H */
