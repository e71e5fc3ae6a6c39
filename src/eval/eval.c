/* The lock-step evaluation engine behind kittykv_eval.h: every method runs the
 * same tokens with its own cache, and each scored position is compared with
 * the fp16 cache's distribution. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"
#include "kittykv_eval.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

kkv_eval_config kkv_eval_defaults(void) {
    kkv_eval_config c;
    memset(&c, 0, sizeof c);
    c.score_from = 1;
    c.chunk = 64;
    return c;
}

/* ------------------------------------------------------------ caches */

kkv_status kkv_eval_pool_bytes(size_t *out, const kkv_cache_config *base, int n_tokens) {
    if (!out || !base) return kkv_fail(KKV_ERR_INVALID_ARG, "pool_bytes: NULL argument");
    if (n_tokens < 0) return kkv_fail(KKV_ERR_INVALID_ARG, "pool_bytes: n_tokens %d < 0", n_tokens);
    kkv_cache_config cfg = *base;
    const kkv_method *mt = &cfg.method;
    /* A bound that surely fits: every token plus every staging area in fp16,
     * twice over; the pool reserves address space lazily, so it costs nothing. */
    double per_tok = 2.0 * 2.0 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim;
    double bound = 2.0 * per_tok * ((double)n_tokens + 2.0 * mt->sink + 4.0 * mt->group +
                                    mt->window + 64.0);
    cfg.pool_bytes = (size_t)bound;
    cfg.max_tokens = n_tokens;
    cfg.n_threads = 1;
    if (cfg.method.select == KKV_SELECT_EXPLICIT) cfg.method.select = KKV_SELECT_MAGNITUDE;
    kkv_cache *probe;
    kkv_status s = kkv_cache_create(&probe, &cfg);
    if (s != KKV_OK) return s;
    int seq;
    s = kkv_seq_add(probe, &seq);
    if (s == KKV_OK) s = kkv_seq_reserve(probe, seq, n_tokens);
    kkv_mem mem;
    if (s == KKV_OK) s = kkv_seq_mem(probe, &mem, seq);
    if (s == KKV_OK) *out = (size_t)mem.capacity;
    kkv_cache_free(probe);
    return s;
}

kkv_status kkv_eval_cache_create(kkv_cache **out, int *seq, const kkv_model *m,
                                 const kkv_method *method, int n_tokens, int n_threads,
                                 const uint8_t *ranks) {
    if (!out || !seq || !m || !method)
        return kkv_fail(KKV_ERR_INVALID_ARG, "eval cache: NULL argument");
    *out = NULL;
    kkv_cache_config cfg = kkv_model_cache_config(m, method, 0);
    cfg.max_tokens = n_tokens;
    cfg.n_threads = n_threads;
    kkv_status s = kkv_eval_pool_bytes(&cfg.pool_bytes, &cfg, n_tokens);
    if (s != KKV_OK) return s;
    kkv_cache *c;
    s = kkv_cache_create(&c, &cfg);
    if (s != KKV_OK) return s;
    if (method->select == KKV_SELECT_EXPLICIT && !method->fp16 && ranks) {
        const int D = cfg.head_dim;
        for (int l = 0; l < cfg.n_layers && s == KKV_OK; l++)
            for (int h = 0; h < cfg.n_kv_heads && s == KKV_OK; h++)
                s = kkv_cache_set_rank(c, l, h,
                                       ranks + ((size_t)l * cfg.n_kv_heads + h) * (size_t)D);
    }
    if (s == KKV_OK) s = kkv_seq_add(c, seq);
    if (s == KKV_OK) s = kkv_seq_reserve(c, *seq, n_tokens);
    if (s != KKV_OK) {
        kkv_cache_free(c);
        return s;
    }
    *out = c;
    return KKV_OK;
}

kkv_status kkv_eval_tokenize_file(int32_t **tokens, int *n, const kkv_model *m,
                                  const char *path) {
    if (!tokens || !n || !m || !path)
        return kkv_fail(KKV_ERR_INVALID_ARG, "tokenize_file: NULL argument");
    *tokens = NULL;
    *n = 0;
    size_t len = 0;
    char *text;
    KKV_TRY(kkv_file_read(&text, &len, path, KKV_EVAL_MAX_TEXT_BYTES));
    kkv_status s = kkv_tokenize_alloc(m, tokens, n, text, len, 1, 0);
    free(text);
    if (s != KKV_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", kkv_last_error());
        return kkv_fail(s, "tokenizing '%s': %s", path, msg);
    }
    return KKV_OK;
}

/* ------------------------------------------------------------ the run */

/* One method's live state during a run. */
typedef struct lane {
    kkv_cache  *cache;
    int         seq;
    kkv_eval_result r;
    long        top1_hits;
} lane;

/* Scratch shared by all lanes, for one chunk of C positions. */
typedef struct scratch {
    float  *logits;  /* [C][V] the current lane's logits        */
    float  *ref_log; /* [C][V] fp16 logits of the chunk         */
    double *ref_lp;  /* [C][V] fp16 log-softmax                 */
    double *ref_p;   /* [C][V] exp(ref_lp)                      */
    int    *ref_top; /* [C] fp16 argmax                         */
    double *lq;      /* [V] a lane's log-softmax of one row     */
} scratch;

static void scratch_free(scratch *s) {
    free(s->logits);
    free(s->ref_log);
    free(s->ref_lp);
    free(s->ref_p);
    free(s->ref_top);
    free(s->lq);
}

static int scratch_alloc(scratch *s, int C, int V) {
    size_t cv = (size_t)C * (size_t)V;
    s->logits = malloc(cv * sizeof *s->logits);
    s->ref_log = malloc(cv * sizeof *s->ref_log);
    s->ref_lp = malloc(cv * sizeof *s->ref_lp);
    s->ref_p = malloc(cv * sizeof *s->ref_p);
    s->ref_top = malloc((size_t)C * sizeof *s->ref_top);
    s->lq = malloc((size_t)V * sizeof *s->lq);
    return s->logits && s->ref_log && s->ref_lp && s->ref_p && s->ref_top && s->lq ? 0 : -1;
}

/* Forward pass of tokens [n] for one lane; logits of every token (all = 1) or
 * the last one into out. */
static kkv_status lane_forward(lane *ln, kkv_model *m, float *out, const int32_t *tok, int n,
                               int all, const char *name) {
    double t0 = now_s();
    kkv_status s = kkv_model_forward(m, ln->cache, out, ln->seq, tok, n, all);
    ln->r.seconds += now_s() - t0;
    if (s != KKV_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", kkv_last_error());
        return kkv_fail(s, "%s: forward pass: %s", name, msg);
    }
    return KKV_OK;
}

/* Scores rows [n][V] of logits against the fp16 rows of the chunk; next: the
 * true next tokens [n]. ref_lane: the lane is fp16 itself (no KL needed). */
static void lane_score(lane *ln, const scratch *sc, const float *logits, const int32_t *next,
                       int n, int V, int is_ref_lane) {
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * V;
        const double *lp = sc->ref_lp + (size_t)i * V;
        long k = ln->r.scored++;
        if (is_ref_lane) {
            ln->r.nll_sum -= lp[next[i]];
            ln->top1_hits++;
            continue;
        }
        kkv_log_softmax(sc->lq, row, V);
        ln->r.nll_sum -= sc->lq[next[i]];
        if (ln->r.kld) ln->r.kld[k] = kkv_kl(sc->ref_p + (size_t)i * V, lp, sc->lq, V);
        ln->top1_hits += kkv_argmax(row, V) == sc->ref_top[i];
    }
}

/* The fp16 rows of a chunk: log-softmax, probabilities, argmax. */
static void ref_prepare(scratch *sc, int n, int V) {
    for (int i = 0; i < n; i++) {
        const float *row = sc->ref_log + (size_t)i * V;
        double *lp = sc->ref_lp + (size_t)i * V, *p = sc->ref_p + (size_t)i * V;
        kkv_log_softmax(lp, row, V);
        for (int v = 0; v < V; v++) p[v] = exp(lp[v]);
        sc->ref_top[i] = kkv_argmax(row, V);
    }
}

static void finish(kkv_eval_result *r, long hits, double ref_ppl, int have_kld) {
    r->ppl = r->scored ? exp(r->nll_sum / (double)r->scored) : 0.0;
    r->dppl_pct = ref_ppl > 0 ? 100.0 * (r->ppl / ref_ppl - 1.0) : 0.0;
    r->top1 = r->scored ? (double)hits / (double)r->scored : 0.0;
    r->kld_mean = r->kld_p99 = r->kld_max = 0.0;
    if (!have_kld || !r->kld || !r->scored) return;
    double sum = 0.0, mx = r->kld[0];
    for (long i = 0; i < r->scored; i++) {
        sum += r->kld[i];
        if (r->kld[i] > mx) mx = r->kld[i];
    }
    r->kld_mean = sum / (double)r->scored;
    r->kld_max = mx;
    double *tmp = malloc((size_t)r->scored * sizeof *tmp); /* [scored] sorted copy */
    if (tmp) {
        memcpy(tmp, r->kld, (size_t)r->scored * sizeof *tmp);
        r->kld_p99 = kkv_percentile(tmp, r->scored, 99.0);
        free(tmp);
    } else {
        r->kld_p99 = NAN;
    }
}

/* Copies the current message so a new one can quote it. */
static kkv_status fail_with(kkv_status s, const char *what, const char *name) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", kkv_last_error());
    return kkv_fail(s, "%s: %s: %s", name, what, msg);
}

kkv_status kkv_eval_run(kkv_eval_result *res, kkv_eval_result *ref, kkv_model *m,
                        const int32_t *tokens, const kkv_eval_config *cfg,
                        const char *const *specs, int n_specs) {
    if (!m || !tokens || !cfg || n_specs < 0 || (n_specs && (!res || !specs)))
        return kkv_fail(KKV_ERR_INVALID_ARG, "eval: NULL argument or negative spec count");
    const int N = cfg->n_tokens, P = cfg->score_from, C = cfg->chunk;
    if (P < 1 || N < P + 1 || C < 1)
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "eval: need 1 <= score_from < n_tokens and chunk >= 1 (got %d, %d, %d)",
                        P, N, C);
    kkv_model_info info;
    kkv_model_get_info(m, &info);
    const int V = info.n_vocab;
    const long M = (long)N - P;
    kkv_eval_result *parsed = calloc((size_t)n_specs + 1, sizeof *parsed); /* [n_specs] */
    if (!parsed) return kkv_fail(KKV_ERR_NOMEM, "eval: out of memory");
    for (int i = 0; i < n_specs; i++) {
        kkv_status s = KKV_OK;
        if (!specs[i] || strlen(specs[i]) >= sizeof parsed[i].spec)
            s = kkv_fail(KKV_ERR_INVALID_ARG, "eval: method spec %d is NULL or too long", i);
        if (s == KKV_OK) {
            memcpy(parsed[i].spec, specs[i], strlen(specs[i]) + 1);
            s = kkv_method_parse(&parsed[i].method, specs[i]);
        }
        if (s == KKV_OK && kkv_method_check(&parsed[i].method, info.head_dim) != KKV_OK)
            s = fail_with(KKV_ERR_INVALID_ARG, "method", specs[i]);
        if (s == KKV_OK && parsed[i].method.select == KKV_SELECT_EXPLICIT && !cfg->ranks)
            s = kkv_fail(KKV_ERR_INVALID_ARG, "%s: select=oracle needs channel rankings (only "
                         "`kittykv analyze ablation` computes them)", specs[i]);
        for (int j = 0; s == KKV_OK && j < i; j++)
            if (!strcmp(specs[j], specs[i]))
                s = kkv_fail(KKV_ERR_INVALID_ARG, "eval: method '%s' is listed twice", specs[i]);
        if (s != KKV_OK) {
            free(parsed);
            return s;
        }
    }

    /* lane 0 is the fp16 reference; lane 1+i runs specs[i] unless it is the
     * reference itself. */
    lane *lanes = calloc((size_t)n_specs + 1, sizeof *lanes); /* [n_specs + 1] */
    scratch sc;
    memset(&sc, 0, sizeof sc);
    kkv_status st = KKV_OK;
    if (!lanes || scratch_alloc(&sc, C, V)) {
        st = kkv_fail(KKV_ERR_NOMEM, "eval: out of memory (chunk %d x vocab %d)", C, V);
        goto done;
    }
    kkv_method fp16;
    kkv_method_from_name(&fp16, "fp16");
    for (int i = 0; i <= n_specs; i++) {
        const kkv_method *mt = i ? &parsed[i - 1].method : &fp16;
        const char *name = i ? specs[i - 1] : "fp16";
        if (i && !strcmp(specs[i - 1], "fp16")) continue;
        st = kkv_eval_cache_create(&lanes[i].cache, &lanes[i].seq, m, mt, N,
                                   cfg->pool ? 1 : cfg->n_threads, cfg->ranks);
        if (st == KKV_OK && cfg->pool) st = kkv_cache_set_threadpool(lanes[i].cache, cfg->pool);
        if (st != KKV_OK) {
            st = fail_with(st, "creating the cache", name);
            goto done;
        }
        if (i) { /* the statistics need every position's KL */
            lanes[i].r.kld = malloc((size_t)M * sizeof *lanes[i].r.kld); /* [M] */
            if (!lanes[i].r.kld) {
                st = kkv_fail(KKV_ERR_NOMEM, "eval: out of memory");
                goto done;
            }
        }
    }

    double t0;
    /* Prefill: the logits after token P-1 are the first scored prediction. */
    for (int i = 0; i <= n_specs; i++) {
        if (!lanes[i].cache) continue;
        float *out = i ? sc.logits : sc.ref_log;
        st = lane_forward(&lanes[i], m, out, tokens, P, 0, i ? specs[i - 1] : "fp16");
        if (st != KKV_OK) goto done;
        if (i == 0) {
            ref_prepare(&sc, 1, V);
            lane_score(&lanes[0], &sc, sc.ref_log, tokens + P, 1, V, 1);
        } else {
            lane_score(&lanes[i], &sc, sc.logits, tokens + P, 1, V, 0);
        }
    }
    /* the rate and ETA count decode steps only, from here */
    t0 = now_s();
    if (cfg->progress) cfg->progress(cfg->progress_user, 0, M - 1, 0.0);
    /* Scoring: feed tokens P..N-2; the logits after token j predict j+1. */
    for (int j = P; j < N - 1;) {
        int n = N - 1 - j < C ? N - 1 - j : C;
        for (int i = 0; i <= n_specs; i++) {
            if (!lanes[i].cache) continue;
            float *out = i ? sc.logits : sc.ref_log;
            st = lane_forward(&lanes[i], m, out, tokens + j, n, 1, i ? specs[i - 1] : "fp16");
            if (st != KKV_OK) goto done;
            if (i == 0) {
                ref_prepare(&sc, n, V);
                lane_score(&lanes[0], &sc, sc.ref_log, tokens + j + 1, n, V, 1);
            } else {
                lane_score(&lanes[i], &sc, sc.logits, tokens + j + 1, n, V, 0);
            }
        }
        j += n;
        if (cfg->progress) cfg->progress(cfg->progress_user, (long)j - P, M - 1, now_s() - t0);
    }

    finish(&lanes[0].r, lanes[0].top1_hits, 0.0, 0);
    const double ref_ppl = lanes[0].r.ppl;
    lanes[0].r.dppl_pct = 0.0;
    memcpy(lanes[0].r.spec, "fp16", 5);
    lanes[0].r.method = fp16;
    if ((st = kkv_seq_mem(lanes[0].cache, &lanes[0].r.mem, lanes[0].seq)) != KKV_OK) {
        st = fail_with(st, "memory report", "fp16");
        goto done;
    }
    for (int i = 1; i <= n_specs; i++) {
        if (!lanes[i].cache) {
            lanes[i].r = lanes[0].r; /* "fp16" is the reference: KL 0, top-1 1 */
            lanes[i].r.kld = NULL;
            if (cfg->keep_kld) { /* its per-position KL: 0 everywhere */
                lanes[i].r.kld = calloc((size_t)M, sizeof *lanes[i].r.kld); /* [M] */
                if (!lanes[i].r.kld) {
                    st = kkv_fail(KKV_ERR_NOMEM, "eval: out of memory");
                    goto done;
                }
            }
            continue;
        }
        finish(&lanes[i].r, lanes[i].top1_hits, ref_ppl, 1);
        if ((st = kkv_seq_mem(lanes[i].cache, &lanes[i].r.mem, lanes[i].seq)) != KKV_OK) {
            st = fail_with(st, "memory report", specs[i - 1]);
            goto done;
        }
    }
    for (int i = 1; i <= n_specs; i++) {
        res[i - 1] = lanes[i].r;
        memcpy(res[i - 1].spec, parsed[i - 1].spec, sizeof res[i - 1].spec);
        res[i - 1].method = parsed[i - 1].method;
        if (!cfg->keep_kld) {
            free(res[i - 1].kld);
            res[i - 1].kld = NULL;
        }
        lanes[i].r.kld = NULL;
    }
    if (ref) *ref = lanes[0].r;
done:
    if (lanes)
        for (int i = 0; i <= n_specs; i++) {
            free(lanes[i].r.kld);
            kkv_cache_free(lanes[i].cache);
        }
    free(lanes);
    free(parsed);
    scratch_free(&sc);
    return st;
}

void kkv_eval_results_free(kkv_eval_result *res, int n) {
    if (!res) return;
    for (int i = 0; i < n; i++) {
        free(res[i].kld);
        res[i].kld = NULL;
    }
}
