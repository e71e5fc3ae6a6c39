/* AVX2 + FMA variants of the gated activations: act_exp.h's operations on 8
 * lanes, in the same order, so every value gets the scalar reference's bits
 * (tests/test_model.c checks it); the tail goes through the scalar ones. */
#include <immintrin.h>
#include <math.h>

#include "core/exp_poly_avx2.h"
#include "model/act_exp.h"
#include "model/ops.h"

/* kkv_act_exp on 8 lanes: the shared exponential of x clamped at 88, +inf
 * above. A NaN lane gives some number here (kkv_exp_poly8's note); the
 * activation then divides the NaN input itself, which gives the scalar
 * reference's NaN bits (the test checks it). */
static inline __m256 exp8(__m256 x) {
    __m256 e = kkv_exp_poly8(_mm256_min_ps(x, _mm256_set1_ps(KKV_ACT_EXP_MAX)));
    __m256 big = _mm256_cmp_ps(x, _mm256_set1_ps(KKV_ACT_EXP_MAX), _CMP_GT_OQ); /* false for NaN */
    return _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), big);
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
