/* Token sampling (kittykv_model.h). Everything lives in the handle, so two
 * samplers never share state. Top-p sorts only the tokens that can be in the
 * nucleus: a token with probability below (1 - top_p) / n_vocab cannot be
 * needed, because all such tokens together hold less than 1 - top_p, so the
 * rest already reach top_p. The result equals a full sort's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/status.h"
#include "kittykv_model.h"

struct kkv_sampler {
    kkv_sampler_params p;
    uint64_t state;   /* splitmix64 state */
    float   *prob;    /* [cap] */
    int32_t *idx;     /* [cap] candidate ids */
    int32_t *tmp;     /* [cap] merge-sort scratch */
    int      cap;
    int32_t *hist;    /* [repeat_last_n] ring of accepted tokens */
    int      n_hist, hist_pos;
};

kkv_sampler_params kkv_sampler_defaults(void) {
    kkv_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temp = 0.8f;
    p.top_p = 0.95f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    return p;
}

kkv_status kkv_sampler_create(kkv_sampler **out, const kkv_sampler_params *p) {
    if (!out || !p) return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: NULL argument");
    *out = NULL;
    if (!(p->temp >= 0.0f && p->temp <= 1e6f))
        return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: temperature %g must be in [0, 1e6]",
                        (double)p->temp);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: top_p %g must be in (0, 1]",
                        (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p < 1.0f))
        return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: min_p %g must be in [0, 1)",
                        (double)p->min_p);
    if (p->top_k < 0)
        return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: top_k %d is negative", p->top_k);
    if (!(p->repeat_penalty >= 1.0f && p->repeat_penalty <= 100.0f))
        return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: repeat_penalty %g must be in [1, 100]",
                        (double)p->repeat_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > (1 << 20))
        return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: repeat_last_n %d must be in 0..1048576",
                        p->repeat_last_n);
    kkv_sampler *s = calloc(1, sizeof *s);
    if (!s) return kkv_fail(KKV_ERR_NOMEM, "sampler: out of memory");
    s->p = *p;
    if (p->repeat_penalty > 1.0f && p->repeat_last_n > 0) {
        s->hist = malloc((size_t)p->repeat_last_n * sizeof *s->hist);
        if (!s->hist) {
            free(s);
            return kkv_fail(KKV_ERR_NOMEM, "sampler: out of memory");
        }
    }
    s->state = p->seed;
    *out = s;
    return KKV_OK;
}

void kkv_sampler_free(kkv_sampler *s) {
    if (!s) return;
    free(s->prob);
    free(s->idx);
    free(s->tmp);
    free(s->hist);
    free(s);
}

void kkv_sampler_reset(kkv_sampler *s, uint64_t seed) {
    if (!s) return;
    s->state = seed;
    s->n_hist = s->hist_pos = 0;
}

kkv_status kkv_sampler_accept(kkv_sampler *s, int32_t token) {
    if (!s) return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: NULL sampler");
    if (!s->hist) return KKV_OK;
    s->hist[s->hist_pos] = token;
    s->hist_pos = (s->hist_pos + 1) % s->p.repeat_last_n;
    if (s->n_hist < s->p.repeat_last_n) s->n_hist++;
    return KKV_OK;
}

int32_t kkv_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best] || (isnan(x[best]) && !isnan(x[i]))) best = i;
    return best;
}

/* Descending probability, ties to the lower id: a total order, so the result
 * does not depend on the sort. Stable merge sort of idx [n] with tmp [n]. */
static int before(const float *prob, int32_t i, int32_t j) {
    if (prob[i] != prob[j]) return prob[i] > prob[j];
    return i < j;
}

static void sort_desc(int32_t *idx, int32_t *tmp, int n, const float *prob) {
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int a = lo, b = mid, k = lo;
            while (a < mid && b < hi) tmp[k++] = before(prob, idx[b], idx[a]) ? idx[b++] : idx[a++];
            while (a < mid) tmp[k++] = idx[a++];
            while (b < hi) tmp[k++] = idx[b++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

static int grow(kkv_sampler *s, int n) {
    if (s->cap >= n) return 0;
    float *p = realloc(s->prob, (size_t)n * sizeof *p);
    if (p) s->prob = p;
    int32_t *ix = realloc(s->idx, (size_t)n * sizeof *ix);
    if (ix) s->idx = ix;
    int32_t *t = realloc(s->tmp, (size_t)n * sizeof *t);
    if (t) s->tmp = t;
    if (!p || !ix || !t) return -1;
    s->cap = n;
    return 0;
}

/* llama.cpp's rule: a seen token's logit is divided by the penalty when
 * positive and multiplied when negative. Applied to a copy in prob. */
static const float *penalized(kkv_sampler *s, const float *logits, int n_vocab) {
    if (!s->hist || !s->n_hist) return logits;
    memcpy(s->prob, logits, (size_t)n_vocab * sizeof *logits);
    for (int i = 0; i < s->n_hist; i++) {
        int32_t t = s->hist[i];
        if (t < 0 || t >= n_vocab) continue;
        int dup = 0; /* penalize each distinct token once */
        for (int j = 0; j < i && !dup; j++) dup = s->hist[j] == t;
        if (dup) continue;
        float *l = &s->prob[t];
        *l = *l > 0.0f ? *l / s->p.repeat_penalty : *l * s->p.repeat_penalty;
    }
    return s->prob;
}

kkv_status kkv_sampler_sample(kkv_sampler *s, int32_t *token, const float *logits,
                              int n_vocab) {
    if (!s || !token || !logits || n_vocab < 1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "sampler: NULL argument or empty vocabulary");
    if (grow(s, n_vocab)) return kkv_fail(KKV_ERR_NOMEM, "sampler: out of memory");
    float *pen = NULL; /* [n_vocab] penalized logits, kept apart from prob */
    const float *lg = logits;
    if (s->hist && s->n_hist) {
        pen = malloc((size_t)n_vocab * sizeof *pen);
        if (!pen) return kkv_fail(KKV_ERR_NOMEM, "sampler: out of memory");
        memcpy(pen, penalized(s, logits, n_vocab), (size_t)n_vocab * sizeof *pen);
        lg = pen;
    }
    int32_t best = kkv_argmax(lg, n_vocab);
    if (s->p.temp <= 0.0f) {
        free(pen);
        *token = best;
        return KKV_OK;
    }
    float *prob = s->prob; /* [n_vocab] */
    double sum = 0.0, mx = lg[best];
    for (int i = 0; i < n_vocab; i++) {
        double e = isnan(lg[i]) ? 0.0 : exp(((double)lg[i] - mx) / s->p.temp);
        prob[i] = (float)e;
        sum += e;
    }
    free(pen);
    for (int i = 0; i < n_vocab; i++) prob[i] = (float)(prob[i] / sum);

    int n = 0;
    int32_t *idx = s->idx; /* [n] candidate ids */
    /* min-p: relative to the most likely token (prob[best] is the top). */
    float floor_min = s->p.min_p > 0.0f ? s->p.min_p * prob[best] : 0.0f;
    if (s->p.top_p >= 1.0f && s->p.top_k == 0) {
        for (int i = 0; i < n_vocab; i++)
            if (prob[i] >= floor_min) idx[n++] = i;
    } else {
        float floor_p = s->p.top_p < 1.0f ? (1.0f - s->p.top_p) / (float)n_vocab : 0.0f;
        if (floor_min > floor_p) floor_p = floor_min;
        double kept = 0.0;
        for (int i = 0; i < n_vocab; i++)
            if (prob[i] >= floor_p) idx[n++] = i, kept += prob[i];
        if (kept < s->p.top_p && floor_min == 0.0f) { /* rounding at the edge: take all */
            n = 0;
            for (int i = 0; i < n_vocab; i++) idx[n++] = i;
        }
        sort_desc(idx, s->tmp, n, prob);
        if (s->p.top_k > 0 && n > s->p.top_k) n = s->p.top_k;
        if (s->p.top_p < 1.0f) {
            double c = 0.0;
            int keep = n;
            for (int i = 0; i < n; i++) {
                c += prob[idx[i]];
                if (c >= s->p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            n = keep;
        }
    }
    if (n == 0) { /* cannot happen (best passes every cut), but stay defined */
        *token = best;
        return KKV_OK;
    }
    double total = 0.0;
    for (int i = 0; i < n; i++) total += prob[idx[i]];
    double u = kkv_rng_uniform(&s->state) * total, c = 0.0;
    for (int i = 0; i < n; i++) {
        c += prob[idx[i]];
        if (u < c) {
            *token = idx[i];
            return KKV_OK;
        }
    }
    *token = idx[n - 1];
    return KKV_OK;
}
