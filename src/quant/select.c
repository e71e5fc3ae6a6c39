/* Boost channel selection (docs/FORMAT.md section 1): rank the D channels of a key page
 * by an importance score; the top n_boost get 4 bits. */
#include <math.h>
#include <string.h>

#include "core/rng.h"
#include "quant/quant.h"

void kkv_order_channels(uint8_t *order, const float *score, int D) {
    /* D <= 256, so an insertion sort is cheap next to the G*D scoring pass */
    for (int j = 0; j < D; j++) {
        int i = j;
        while (i > 0 && score[order[i - 1]] < score[j]) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = (uint8_t)j;
    }
}

/* score [D] of the deterministic signals: magnitude, variance, range. */
void kkv_score_channels(float *score, const float *k, int D, int G, kkv_select sel) {
    if (sel == KKV_SELECT_RANGE) {
        /* (max - min)^2: boosting channel j cuts its min/max squared error by
         * that times (1/9 - 1/225)/12 for evenly spread data */
        for (int j = 0; j < D; j++) {
            float mn, mx;
            kkv_channel_range(k, D, G, j, &mn, &mx);
            score[j] = (mx - mn) * (mx - mn);
        }
    } else if (sel == KKV_SELECT_VARIANCE) {
        /* Two passes in fp32, tokens in order: the oracle sums the same way. */
        float sum[KKV_MAX_HEAD_DIM] = {0}, dev[KKV_MAX_HEAD_DIM] = {0};
        for (int t = 0; t < G; t++)
            for (int j = 0; j < D; j++) sum[j] += k[(size_t)t * D + j];
        for (int j = 0; j < D; j++) sum[j] /= (float)G;
        for (int t = 0; t < G; t++)
            for (int j = 0; j < D; j++) {
                float d = k[(size_t)t * D + j] - sum[j];
                dev[j] += d * d;
            }
        for (int j = 0; j < D; j++) score[j] = dev[j];
    } else {
        /* magnitude: sum_t |k| (the mean up to the common factor 1/G) */
        float sum[KKV_MAX_HEAD_DIM] = {0};
        for (int t = 0; t < G; t++)
            for (int j = 0; j < D; j++) sum[j] += fabsf(k[(size_t)t * D + j]);
        for (int j = 0; j < D; j++) score[j] = sum[j];
    }
}

void kkv_rank_channels(uint8_t *order, const float *k, int D, int G, kkv_select sel,
                       uint64_t seed, uint64_t page, const uint8_t *explicit_rank) {
    float score[KKV_MAX_HEAD_DIM]; /* [D] */
    if (sel == KKV_SELECT_EXPLICIT) {
        for (int j = 0; j < D; j++) order[j] = explicit_rank ? explicit_rank[j] : (uint8_t)j;
        return;
    }
    if (sel == KKV_SELECT_RANDOM) {
        uint64_t s = kkv_mix64(seed, page);
        /* 24 random bits: exact in a float; ties go to the lower index */
        for (int j = 0; j < D; j++) score[j] = (float)(kkv_mix64(s, (uint64_t)j) >> 40);
    } else {
        kkv_score_channels(score, k, D, G, sel);
    }
    kkv_order_channels(order, score, D);
}

/* RoPE rotates channel j together with its partner, so an outlier in one is
 * half the time in the other: the pair is boosted as a unit. */
void kkv_rank_pairs(uint8_t *order, const float *k, int D, int G, kkv_select sel, int neox,
                    int rope_dims) {
    /* [D] channel, [n_pairs] pair; pscore zeroed only because GCC at -O2
     * cannot see that the sort reads just the np entries written */
    float score[KKV_MAX_HEAD_DIM], pscore[KKV_MAX_HEAD_DIM] = {0};
    uint8_t first[KKV_MAX_HEAD_DIM], second[KKV_MAX_HEAD_DIM], porder[KKV_MAX_HEAD_DIM];
    kkv_score_channels(score, k, D, G, sel);
    int R = rope_dims > 0 && rope_dims <= D ? rope_dims & ~1 : D, half = R / 2, np = 0;
    for (int j = 0; j < R; j++) {
        int mate = neox ? (j < half ? j + half : j - half) : (j ^ 1);
        if (mate < j) continue; /* each pair once, from its lower channel */
        int hi = score[mate] > score[j]; /* ties keep the lower channel first */
        first[np] = (uint8_t)(hi ? mate : j);
        second[np] = (uint8_t)(hi ? j : mate);
        pscore[np++] = score[j] + score[mate];
    }
    for (int j = R; j < D; j++) { /* unrotated channels: pairs of one */
        first[np] = second[np] = (uint8_t)j;
        pscore[np++] = 2.0f * score[j];
    }
    kkv_order_channels(porder, pscore, np);
    int n = 0;
    for (int i = 0; i < np; i++) {
        int p = porder[i];
        order[n++] = first[p];
        if (second[p] != first[p]) order[n++] = second[p];
    }
}
