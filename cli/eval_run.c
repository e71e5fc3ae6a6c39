#include "eval_run.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kld.h"
#include "sample.h"
#include "util.h"

/* ------------------------------------------------------------ specs */

static int parse_u64(uint64_t *out, const char *s) {
    char *end;
    errno = 0;
    if (!*s || *s == '-') return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || errno) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_int(int *out, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) return -1;
    *out = (int)v;
    return 0;
}

int eval_spec_parse(eval_spec *out, const char *text, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    size_t len = strlen(text);
    if (len == 0 || len >= sizeof out->name) {
        snprintf(err, errlen, "method spec '%s' is empty or longer than %zu characters", text,
                 sizeof out->name - 1);
        return -1;
    }
    memcpy(out->name, text, len + 1);
    char buf[sizeof out->name]; /* a mutable copy to cut at ':' */
    memcpy(buf, text, len + 1);
    char *save = NULL;
    char *base = strtok_r(buf, ":", &save);
    if (!base || kkv_method_from_name(&out->method, base) != KKV_OK) {
        snprintf(err, errlen, "unknown method '%s' in spec '%s' (kittykv --help lists them)",
                 base ? base : "", text);
        return -1;
    }
    out->is_ref = !strcmp(text, "fp16");
    for (char *kv = strtok_r(NULL, ":", &save); kv; kv = strtok_r(NULL, ":", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) {
            snprintf(err, errlen, "spec '%s': '%s' is not key=value", text, kv);
            return -1;
        }
        *eq = 0;
        const char *key = kv, *val = eq + 1;
        kkv_method *m = &out->method;
        int bad = 0;
        if (!strcmp(key, "alpha")) {
            char *end;
            errno = 0;
            double a = strtod(val, &end);
            bad = !*val || *end || errno || !(a >= 0.0 && a <= 1.0);
            m->alpha = (float)a;
        } else if (!strcmp(key, "select")) {
            if (!strcmp(val, "magnitude")) m->select = KKV_SELECT_MAGNITUDE;
            else if (!strcmp(val, "variance")) m->select = KKV_SELECT_VARIANCE;
            else if (!strcmp(val, "random")) m->select = KKV_SELECT_RANDOM;
            else if (!strcmp(val, "oracle")) m->select = KKV_SELECT_EXPLICIT;
            else bad = 1;
        } else if (!strcmp(key, "seed")) {
            bad = parse_u64(&m->seed, val);
        } else if (!strcmp(key, "sink")) {
            bad = parse_int(&m->sink, val, 0, 1 << 20);
        } else if (!strcmp(key, "group")) {
            bad = parse_int(&m->group, val, 4, 4096);
        } else if (!strcmp(key, "window")) {
            bad = parse_int(&m->window, val, 0, 1 << 20);
        } else if (!strcmp(key, "vbits")) {
            bad = parse_int(&m->value_bits, val, 2, 4) || m->value_bits == 3;
        } else if (!strcmp(key, "eager")) {
            bad = parse_int(&m->eager_values, val, 0, 1);
        } else {
            snprintf(err, errlen, "spec '%s': unknown key '%s' (alpha, select, seed, sink, "
                     "group, window, vbits, eager)", text, key);
            return -1;
        }
        if (bad) {
            snprintf(err, errlen, "spec '%s': bad value '%s' for %s", text, val, key);
            return -1;
        }
    }
    if (out->method.fp16 && out->method.select == KKV_SELECT_EXPLICIT) {
        snprintf(err, errlen, "spec '%s': fp16 has no channel selection", text);
        return -1;
    }
    return 0;
}

int eval_spec_list(eval_spec *out, int cap, const char *list, char *err, size_t errlen) {
    int n = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        char one[sizeof out->name];
        if (len == 0 || len >= sizeof one) {
            snprintf(err, errlen, "bad method list '%s'", list);
            return -1;
        }
        if (n >= cap) {
            snprintf(err, errlen, "too many methods (at most %d)", cap);
            return -1;
        }
        memcpy(one, p, len);
        one[len] = 0;
        if (eval_spec_parse(&out[n], one, err, errlen)) return -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(out[i].name, one)) {
                snprintf(err, errlen, "method '%s' is listed twice", one);
                return -1;
            }
        n++;
        p += len;
        if (*p == ',') p++;
    }
    if (n == 0) snprintf(err, errlen, "empty method list");
    return n ? n : -1;
}

/* ------------------------------------------------------------ caches */

kkv_status eval_pool_bytes(size_t *out, const kkv_cache_config *base, int n_tokens) {
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

kkv_status eval_cache_new(kkv_cache **out, int *seq, const kkv_model *m,
                          const kkv_method *method, int n_tokens, int n_threads,
                          const uint8_t *ranks) {
    *out = NULL;
    kkv_cache_config cfg = kkv_model_cache_config(m, method, 0);
    cfg.max_tokens = n_tokens;
    cfg.n_threads = n_threads;
    kkv_status s = eval_pool_bytes(&cfg.pool_bytes, &cfg, n_tokens);
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

int eval_tokenize_file(int32_t **tokens, int *n, const kkv_model *m, const char *path,
                       char *err, size_t errlen) {
    *tokens = NULL;
    *n = 0;
    size_t len;
    char *text = cli_read_file(path, &len);
    if (!text) {
        snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        return 1;
    }
    if (len > (size_t)1 << 28) {
        free(text);
        snprintf(err, errlen, "'%s' is larger than 256 MiB", path);
        return 1;
    }
    int cap = (int)len + 8, got = 0;
    kkv_status s = KKV_ERR_NOMEM;
    for (int tries = 0; tries < 2; tries++) {
        free(*tokens);
        *tokens = malloc((size_t)cap * sizeof **tokens);
        if (!*tokens) break;
        s = kkv_tokenize(m, *tokens, cap, &got, text, len, 1, 0);
        if (s != KKV_ERR_INVALID_ARG || got <= cap) break;
        cap = got;
    }
    free(text);
    if (s != KKV_OK) {
        snprintf(err, errlen, "tokenizing '%s': %s", path,
                 *kkv_last_error() ? kkv_last_error() : "out of memory");
        free(*tokens);
        *tokens = NULL;
        return 1;
    }
    *n = got;
    return 0;
}

/* ------------------------------------------------------------ the run */

/* One method's live state during a run. */
typedef struct lane {
    kkv_cache  *cache;
    int         seq;
    eval_result r;
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
static int lane_forward(lane *ln, kkv_model *m, float *out, const int32_t *tok, int n,
                        int all, char *err, size_t errlen, const char *name) {
    double t0 = cli_now();
    kkv_status s = kkv_model_forward(m, ln->cache, out, ln->seq, tok, n, all);
    ln->r.seconds += cli_now() - t0;
    if (s != KKV_OK) {
        snprintf(err, errlen, "%s: forward pass: %s", name, kkv_last_error());
        return 1;
    }
    return 0;
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
        kld_log_softmax(sc->lq, row, V);
        ln->r.nll_sum -= sc->lq[next[i]];
        if (ln->r.kld) ln->r.kld[k] = kld_kl(sc->ref_p + (size_t)i * V, lp, sc->lq, V);
        ln->top1_hits += cli_argmax(row, V) == sc->ref_top[i];
    }
}

/* The fp16 rows of a chunk: log-softmax, probabilities, argmax. */
static void ref_prepare(scratch *sc, int n, int V) {
    for (int i = 0; i < n; i++) {
        const float *row = sc->ref_log + (size_t)i * V;
        double *lp = sc->ref_lp + (size_t)i * V, *p = sc->ref_p + (size_t)i * V;
        kld_log_softmax(lp, row, V);
        for (int v = 0; v < V; v++) p[v] = exp(lp[v]);
        sc->ref_top[i] = cli_argmax(row, V);
    }
}

static void finish(eval_result *r, long hits, double ref_ppl, int have_kld) {
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
        r->kld_p99 = kld_percentile(tmp, r->scored, 99.0);
        free(tmp);
    } else {
        r->kld_p99 = NAN;
    }
}

int eval_run(eval_result *res, eval_result *ref, kkv_model *m, const int32_t *tokens,
             const eval_config *cfg, const eval_spec *specs, int n_specs, char *err,
             size_t errlen) {
    const int N = cfg->n_tokens, P = cfg->score_from, C = cfg->chunk;
    if (P < 1 || N < P + 1 || C < 1 || n_specs < 0) {
        snprintf(err, errlen, "need 1 <= score_from < n_tokens and chunk >= 1 (got %d, %d, %d)",
                 P, N, C);
        return 1;
    }
    kkv_model_info info;
    kkv_model_get_info(m, &info);
    const int V = info.n_vocab;
    const long M = (long)N - P;
    for (int i = 0; i < n_specs; i++) {
        if (kkv_method_check(&specs[i].method, info.head_dim) != KKV_OK) {
            snprintf(err, errlen, "%s: %s", specs[i].name, kkv_last_error());
            return 1;
        }
        if (specs[i].method.select == KKV_SELECT_EXPLICIT && !cfg->ranks) {
            snprintf(err, errlen, "%s: select=oracle needs channel rankings (only `kittykv "
                     "analyze ablation` computes them)", specs[i].name);
            return 1;
        }
    }

    /* lane 0 is the fp16 reference; lane 1+i runs specs[i] unless it is the
     * reference itself. */
    lane *lanes = calloc((size_t)n_specs + 1, sizeof *lanes);
    scratch sc;
    memset(&sc, 0, sizeof sc);
    int rc = 1;
    if (!lanes || scratch_alloc(&sc, C, V)) {
        snprintf(err, errlen, "out of memory (chunk %d x vocab %d)", C, V);
        goto done;
    }
    kkv_method fp16;
    kkv_method_from_name(&fp16, "fp16");
    for (int i = 0; i <= n_specs; i++) {
        const kkv_method *mt = i ? &specs[i - 1].method : &fp16;
        const char *name = i ? specs[i - 1].name : "fp16";
        if (i && specs[i - 1].is_ref) continue;
        if (eval_cache_new(&lanes[i].cache, &lanes[i].seq, m, mt, N, cfg->n_threads,
                           cfg->ranks) != KKV_OK) {
            snprintf(err, errlen, "%s: creating the cache: %s", name, kkv_last_error());
            goto done;
        }
        if (i) { /* the statistics need every position's KL */
            lanes[i].r.kld = malloc((size_t)M * sizeof *lanes[i].r.kld);
            if (!lanes[i].r.kld) {
                snprintf(err, errlen, "out of memory");
                goto done;
            }
        }
    }

    double t0 = cli_now();
    const char *label = cfg->label ? cfg->label : "eval";
    /* Prefill: the logits after token P-1 are the first scored prediction. */
    for (int i = 0; i <= n_specs; i++) {
        if (!lanes[i].cache) continue;
        float *out = i ? sc.logits : sc.ref_log;
        if (lane_forward(&lanes[i], m, out, tokens, P, 0, err, errlen,
                         i ? specs[i - 1].name : "fp16"))
            goto done;
        if (i == 0) {
            ref_prepare(&sc, 1, V);
            lane_score(&lanes[0], &sc, sc.ref_log, tokens + P, 1, V, 1);
        } else {
            lane_score(&lanes[i], &sc, sc.logits, tokens + P, 1, V, 0);
        }
    }
    /* the rate and ETA count decode steps only, from here */
    t0 = cli_now();
    cli_progress(label, 0, M - 1, 0.0);
    /* Scoring: feed tokens P..N-2; the logits after token j predict j+1. */
    for (int j = P; j < N - 1;) {
        int n = N - 1 - j < C ? N - 1 - j : C;
        for (int i = 0; i <= n_specs; i++) {
            if (!lanes[i].cache) continue;
            float *out = i ? sc.logits : sc.ref_log;
            if (lane_forward(&lanes[i], m, out, tokens + j, n, 1, err, errlen,
                             i ? specs[i - 1].name : "fp16"))
                goto done;
            if (i == 0) {
                ref_prepare(&sc, n, V);
                lane_score(&lanes[0], &sc, sc.ref_log, tokens + j + 1, n, V, 1);
            } else {
                lane_score(&lanes[i], &sc, sc.logits, tokens + j + 1, n, V, 0);
            }
        }
        j += n;
        cli_progress(label, (long)j - P, M - 1, cli_now() - t0);
    }

    finish(&lanes[0].r, lanes[0].top1_hits, 0.0, 0);
    const double ref_ppl = lanes[0].r.ppl;
    lanes[0].r.dppl_pct = 0.0;
    if (kkv_seq_mem(lanes[0].cache, &lanes[0].r.mem, lanes[0].seq) != KKV_OK) {
        snprintf(err, errlen, "fp16: memory report: %s", kkv_last_error());
        goto done;
    }
    for (int i = 1; i <= n_specs; i++) {
        if (!lanes[i].cache) {
            lanes[i].r = lanes[0].r; /* "fp16" is the reference: KL 0, top-1 1 */
            lanes[i].r.kld = NULL;
            continue;
        }
        finish(&lanes[i].r, lanes[i].top1_hits, ref_ppl, 1);
        if (kkv_seq_mem(lanes[i].cache, &lanes[i].r.mem, lanes[i].seq) != KKV_OK) {
            snprintf(err, errlen, "%s: memory report: %s", specs[i - 1].name, kkv_last_error());
            goto done;
        }
    }
    for (int i = 1; i <= n_specs; i++) {
        res[i - 1] = lanes[i].r;
        if (!cfg->keep_kld) {
            free(res[i - 1].kld);
            res[i - 1].kld = NULL;
        }
        lanes[i].r.kld = NULL;
    }
    if (ref) *ref = lanes[0].r;
    rc = 0;
done:
    if (lanes)
        for (int i = 0; i <= n_specs; i++) {
            free(lanes[i].r.kld);
            kkv_cache_free(lanes[i].cache);
        }
    free(lanes);
    scratch_free(&sc);
    return rc;
}

void eval_results_free(eval_result *res, int n) {
    if (!res) return;
    for (int i = 0; i < n; i++) {
        free(res[i].kld);
        res[i].kld = NULL;
    }
}
