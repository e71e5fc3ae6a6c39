/* Temperature / top-p sampling. Top-p sorts only the tokens that can be in
 * the nucleus: any token with probability below (1 - top_p) / n_vocab cannot
 * be needed, because all such tokens together hold less than 1 - top_p, so the
 * rest already reach top_p. The result equals a full sort's. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>

void cli_sampler_init(cli_sampler *s, float temp, float top_p, uint64_t seed) {
    s->temp = temp;
    s->top_p = top_p;
    s->state = seed;
    s->prob = NULL;
    s->idx = NULL;
    s->cap = 0;
}

void cli_sampler_free(cli_sampler *s) {
    if (!s) return;
    free(s->prob);
    free(s->idx);
    s->prob = NULL;
    s->idx = NULL;
    s->cap = 0;
}

double cli_sampler_uniform(cli_sampler *s) {
    /* splitmix64: tiny, well mixed, and fully determined by the seed. */
    uint64_t z = (s->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t cli_argmax(const float *logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (logits[i] > logits[best] || (isnan(logits[best]) && !isnan(logits[i]))) best = i;
    return best;
}

/* Descending probability, ties to the lower id: a total order, so qsort's
 * instability cannot change the result. */
static const float *g_prob;
static int by_prob_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_prob[i] != g_prob[j]) return g_prob[i] > g_prob[j] ? -1 : 1;
    return (i > j) - (i < j);
}

int32_t cli_sample(cli_sampler *s, const float *logits, int n_vocab) {
    int32_t best = cli_argmax(logits, n_vocab);
    if (s->temp <= 0.0f) return best;
    if (s->cap < n_vocab) {
        float *p = realloc(s->prob, (size_t)n_vocab * sizeof *p);
        if (p) s->prob = p;
        int32_t *ix = realloc(s->idx, (size_t)n_vocab * sizeof *ix);
        if (ix) s->idx = ix;
        if (!p || !ix) return -1;
        s->cap = n_vocab;
    }
    float *prob = s->prob; /* [n_vocab] */
    double sum = 0.0, mx = logits[best];
    for (int i = 0; i < n_vocab; i++) {
        double e = isnan(logits[i]) ? 0.0 : exp(((double)logits[i] - mx) / s->temp);
        prob[i] = (float)e;
        sum += e;
    }
    for (int i = 0; i < n_vocab; i++) prob[i] = (float)(prob[i] / sum);

    int n = 0;
    int32_t *idx = s->idx; /* [n] candidate ids */
    if (s->top_p >= 1.0f) {
        for (int i = 0; i < n_vocab; i++) idx[n++] = i;
    } else {
        float floor_p = (1.0f - s->top_p) / (float)n_vocab;
        double kept = 0.0;
        for (int i = 0; i < n_vocab; i++)
            if (prob[i] >= floor_p) idx[n++] = i, kept += prob[i];
        if (kept < s->top_p) { /* float rounding at the edge: take everything */
            n = 0;
            for (int i = 0; i < n_vocab; i++) idx[n++] = i;
        }
        g_prob = prob;
        qsort(idx, (size_t)n, sizeof *idx, by_prob_desc);
        double c = 0.0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            c += prob[idx[i]];
            if (c >= s->top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
    }
    double total = 0.0;
    for (int i = 0; i < n; i++) total += prob[idx[i]];
    double u = cli_sampler_uniform(s) * total, c = 0.0;
    for (int i = 0; i < n; i++) {
        c += prob[idx[i]];
        if (u < c) return idx[i];
    }
    return idx[n - 1];
}
