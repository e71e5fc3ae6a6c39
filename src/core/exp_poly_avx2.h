/* kkv_exp_poly and kkv_exp_soft (core/exp_poly.h) on 8 lanes, operation for
 * operation but the last (an exact product either way), so every lane gets
 * the scalar forms' bits for x <= 88. Include only from files compiled with -mavx2
 * -mfma. A NaN lane comes out as e^-87.3 (the
 * clamp's max returns its second operand): callers that can see NaN handle
 * it themselves. */
#ifndef KKV_CORE_EXP_POLY_AVX2_H
#define KKV_CORE_EXP_POLY_AVX2_H

#include <immintrin.h>

#include "core/exp_poly.h"

static inline __attribute__((always_inline)) __m256 kkv_exp_poly8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(KKV_EXP_MIN));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(KKV_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(KKV_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(KKV_EXP_LN2_LO), r);
    __m256 y = _mm256_set1_ps(kkv_exp_taylor[0]);
    for (int k = 1; k < 7; k++) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kkv_exp_taylor[k]));
    /* y 2^n as n added to y's exponent field: y is in [0.70, 1.42] (|r| <=
     * ln2 / 2), n in [-126, 127], and y >= 1 where n = -126 (the clamp), so
     * the field stays in 1..254 and the sum is the normal float y 2^n, the
     * scalar form's exact product, without a multiply (the softmax's
     * exponentials are bound by the FMA pipes) */
    __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(y), e));
}

/* kkv_exp_soft (core/exp_poly.h, the SIMD softmaxes' exponential) on four
 * vectors of 8 lanes at once, in place, operation for operation but the
 * last: 2^n is added to y's exponent field as the rounding sum's low bits
 * shifted left by 23 (the sum is 1.5 * 2^23 + n, and 1.5 * 2^23 << 23
 * wraps to 0), the same exact y 2^n. The vectors go step by step side by
 * side: four independent chains in program order, so a core with a small FP scheduler sees work for
 * its pipes while each chain waits out its ~50-cycle latency (eight were
 * slower on a family-23 EPYC: their registers spill). An array rather than
 * four pointers: the pointer form compiled into a softmax loop ~8% slower
 * there (300 vs 325-334 ns for 3 heads x 128 tokens). */
static inline __attribute__((always_inline)) void kkv_exp_soft8x4(__m256 v[4]) {
    __m256 t[4], n[4], r[4], y[4];
    for (int i = 0; i < 4; i++) v[i] = _mm256_max_ps(v[i], _mm256_set1_ps(KKV_EXP_MIN));
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_fmadd_ps(v[i], _mm256_set1_ps(KKV_EXP_LOG2E), _mm256_set1_ps(KKV_EXP_ROUNDER));
    for (int i = 0; i < 4; i++) n[i] = _mm256_sub_ps(t[i], _mm256_set1_ps(KKV_EXP_ROUNDER));
    for (int i = 0; i < 4; i++) r[i] = _mm256_fnmadd_ps(n[i], _mm256_set1_ps(KKV_EXP_LN2_HI), v[i]);
    for (int i = 0; i < 4; i++) r[i] = _mm256_fnmadd_ps(n[i], _mm256_set1_ps(KKV_EXP_LN2_LO), r[i]);
    for (int i = 0; i < 4; i++) y[i] = _mm256_set1_ps(kkv_exp_minimax5[0]);
    for (int k = 1; k < 6; k++)
        for (int i = 0; i < 4; i++) y[i] = _mm256_fmadd_ps(y[i], r[i], _mm256_set1_ps(kkv_exp_minimax5[k]));
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_castsi256_ps(
            _mm256_add_epi32(_mm256_castps_si256(y[i]), _mm256_slli_epi32(_mm256_castps_si256(t[i]), 23)));
}

#endif
