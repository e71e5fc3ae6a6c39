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
    kkv_order_channels(order, score, D);
}
