/* AVX2 + FMA variants of the gated activations: act_exp.h's operations on 8
 * lanes, in the same order, so every value gets the scalar reference's bits
 * (tests/test_model.c checks it); the tail goes through the scalar ones. */
#include <immintrin.h>
#include <math.h>

#include "model/act_exp.h"
#include "model/ops.h"

static inline __m256 exp8(__m256 x0) {
    /* NaN lanes: the clamps keep them NaN (min/max return the second operand,
     * x, when it is NaN), and so does everything after; the activation then
     * divides a NaN, which gives the scalar reference's NaN */
    __m256 x = _mm256_min_ps(_mm256_set1_ps(KKV_ACT_EXP_MAX), x0);
    x = _mm256_max_ps(_mm256_set1_ps(KKV_ACT_EXP_MIN), x);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(KKV_ACT_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(KKV_ACT_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(KKV_ACT_LN2_LO), r);
    __m256 y = _mm256_set1_ps(kkv_act_taylor[0]);
    for (int k = 1; k < 7; k++) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kkv_act_taylor[k]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 big = _mm256_cmp_ps(x0, _mm256_set1_ps(KKV_ACT_EXP_MAX), _CMP_GT_OQ); /* false for NaN */
    return _mm256_blendv_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), _mm256_set1_ps(INFINITY), big);
}

void kkv_op_swiglu_avx2(float *g, const float *u, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 e = exp8(_mm256_xor_ps(x, neg)); /* -g, as the scalar negation */
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = kkv_act_swiglu1(g[i], u[i]);
}

void kkv_op_geglu_avx2(float *g, const float *u, int n) {
    const __m256 one = _mm256_set1_ps(1.0f), c = _mm256_set1_ps(KKV_ACT_SQRT_2_PI),
                 k = _mm256_set1_ps(KKV_ACT_GELU_C), m2 = _mm256_set1_ps(-2.0f);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
        __m256 z = _mm256_mul_ps(c, _mm256_add_ps(x, _mm256_mul_ps(k, x3)));
        __m256 e = exp8(_mm256_mul_ps(m2, z));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) g[i] = kkv_act_geglu1(g[i], u[i]);
}
