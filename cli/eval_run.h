/* The fidelity engine behind `kittykv eval` and the analyses: method specs,
 * and a lock-step run of several KV cache methods over the same tokens, each
 * compared with an fp16 cache at every scored position. */
#ifndef KKV_CLI_EVAL_RUN_H
#define KKV_CLI_EVAL_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "kittykv.h"

/* A method spec: a method name, optionally followed by ':key=value' overrides:
 *   alpha=F (0..1), select=magnitude|variance|random|oracle, seed=N,
 *   sink=N, group=N, window=N, vbits=2|4
 * e.g. "kitty:alpha=0.5:select=random:seed=3". select=oracle means
 * KKV_SELECT_EXPLICIT with a ranking the caller supplies. */
typedef struct eval_spec {
    char       name[128]; /* the spec text as given (shown in tables)        */
    kkv_method method;
    int        is_ref;    /* exactly "fp16": reported from the reference run */
} eval_spec;

/* Parses one spec. 0 on success, else -1 with a one-line reason in err. */
int eval_spec_parse(eval_spec *out, const char *text, char *err, size_t errlen);

/* Parses a comma-separated list of specs into out [cap]: the count, or -1
 * with a reason in err. */
int eval_spec_list(eval_spec *out, int cap, const char *list, char *err, size_t errlen);

/* What one method scored. */
typedef struct eval_result {
    long     scored;     /* predictions compared                              */
    double   nll_sum;    /* sum of -log p(next token)                          */
    double   ppl;        /* exp(nll_sum / scored)                              */
    double   dppl_pct;   /* 100 * (ppl / ppl_fp16 - 1)                         */
    double   kld_mean, kld_p99, kld_max; /* KL(p_fp16 || p_method), nats       */
    double   top1;       /* share of positions whose argmax equals fp16's      */
    double   seconds;    /* wall time spent in this method's forward passes    */
    kkv_mem  mem;        /* the cache at the end (kkv_seq_mem)                 */
    double  *kld;        /* [scored] per-position KL, owned; NULL for is_ref   */
} eval_result;

typedef struct eval_config {
    int            n_tokens;   /* tokens used (>= score_from + 1)               */
    int            score_from; /* P: tokens prefilled before scoring, >= 1      */
    int            chunk;      /* tokens per forward call while scoring, >= 1   */
    int            n_threads;  /* attention threads of each cache (0: caller)   */
    int            keep_kld;   /* keep the per-position KL arrays in results    */
    const uint8_t *ranks;      /* [n_layers][n_kv_heads][head_dim] channel
                                  rankings for select=oracle specs, or NULL     */
    const char    *label;      /* progress bar label                            */
} eval_config;

/* Runs fp16 and every spec over tokens [n_tokens] in lock-step: each spec gets
 * its own cache and sequence; the first score_from tokens are prefilled, every
 * later token goes through kkv_model_forward in chunks of `chunk` tokens. The
 * forward pass attends token by token to the cache as stored, so every chunk
 * size gives bit-identical logits (spec section 6.5); chunk 1 is plain decode.
 * Scored predictions: the logits after token i (score_from-1 <= i <= n-2)
 * against token i+1, so scored = n_tokens - score_from.
 * res: [n_specs], filled; release with eval_results_free. ref (may be NULL)
 * gets the fp16 reference's own result. Returns 0, or 1 with a message in err. */
int eval_run(eval_result *res, eval_result *ref, kkv_model *m, const int32_t *tokens,
             const eval_config *cfg, const eval_spec *specs, int n_specs, char *err,
             size_t errlen);

/* Frees the kld arrays of res [n]. NULL is a no-op. */
void eval_results_free(eval_result *res, int n);

/* Pool bytes that hold exactly n_tokens of one sequence with cfg's method:
 * measured on a throw-away cache, so it follows the cache's own layout. */
kkv_status eval_pool_bytes(size_t *out, const kkv_cache_config *cfg, int n_tokens);

/* Creates a cache for the model and method, sized for n_tokens of one
 * sequence, with one sequence added (*seq). ranks as in eval_config (used when
 * the method selects KKV_SELECT_EXPLICIT). */
kkv_status eval_cache_new(kkv_cache **out, int *seq, const kkv_model *m,
                          const kkv_method *method, int n_tokens, int n_threads,
                          const uint8_t *ranks);

/* Tokenizes a whole text file (BOS if the model wants one, special-token text
 * left as plain text): *tokens malloc'd
 * [*n]. Returns 0, or 1 with a message in err. */
int eval_tokenize_file(int32_t **tokens, int *n, const kkv_model *m, const char *path,
                       char *err, size_t errlen);

#endif
