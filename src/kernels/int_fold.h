/* The rules every integer key kernel shares, whatever its instruction set
 * (the AVX2, AVX-512 and NEON folds): when a head's query is too small to
 * fold, the 16-bit query's range, and which channel each high-plane rank
 * belongs to. One definition, so the x86 and ARM kernels take the same
 * steps and hand the same pages to their float kernels. */
#ifndef KKV_KERNELS_INT_FOLD_H
#define KKV_KERNELS_INT_FOLD_H

#include <stdint.h>
#include <string.h>

#include "kittykv.h"

/* 1 when m, the largest |q_j scale_j| of a head (or channel group), is too
 * small for an integer key kernel's fold: QMAX / m (or 127 / m) would be
 * infinite or the step subnormal, so the page goes to the float kernel. 0 is
 * fine (every weight is 0). The one threshold of all the integer key kernels. */
static inline int kkv_fold_too_small(float m) { return m > 0.0f && m < 1e-30f; }

/* The 16-bit key query's range for a page of D channels, nb boosted: the
 * largest step count that keeps every sum, |sum| <= QMAX * 64 * (3 D + 12 nb),
 * within int32 (32767 for every shape the engines use). */
static inline int kkv_qk_wide_qmax(int D, int nb) {
    long long lim = 2147483647LL / (64LL * (3LL * D + 12LL * nb));
    return lim < 32767 ? (int)lim : 32767;
}

/* rch [nb]: the channel whose high plane is rank k's row, the lowest j with
 * idx[j] == k; -1 where no channel claims it (its weight is then 0, as in the
 * scalar reference, which never reads such a row). idx: [D] the page's ranks. */
static inline void kkv_rank_owners(int16_t *rch, const uint8_t *idx, int D, int nb) {
    int16_t tmp[KKV_MAX_HEAD_DIM + 1]; /* [nb + 1]: the last takes the channels with no rank */
    for (int k = 0; k < nb; k++) tmp[k] = -1;
    for (int j = D - 1; j >= 0; j--) tmp[idx[j] < nb ? idx[j] : nb] = (int16_t)j; /* the lowest wins */
    memcpy(rch, tmp, (size_t)nb * sizeof *rch);
}

#endif
