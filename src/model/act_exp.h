/* e^x of the gated activations (SwiGLU's sigmoid, GeGLU's tanh written as a
 * sigmoid), defined here once so that the scalar reference (ops.c) and the
 * AVX2 variant (ops_avx2.c) take the same IEEE operations in the same order
 * and agree bit for bit. It replaced libm's expf and tanhf, whose results
 * differ between libm versions and which cannot be vectorized to the same
 * bits: one call per value was ~3.7 us per layer of a SmolLM2 decode step.
 *
 * x above 88 gives +inf (so silu(g) of g < -88 is -0, as with libm); below,
 * x is clamped at -87.3 (e^x stays a normal float); n = round(x log2 e),
 * r = x - n ln 2 in two steps (Cody-Waite, |r| <= ln2/2), e^r by its
 * degree-6 Taylor polynomial in Horner order (truncation < 1.2e-7 relative),
 * times 2^n built from n's bits. A NaN x returns NaN. Every
 * multiply-add is an explicit fmaf: the build compiles with
 * -ffp-contract=off, so nothing else is fused. */
#ifndef KKV_MODEL_ACT_EXP_H
#define KKV_MODEL_ACT_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define KKV_ACT_EXP_MAX 88.0f
#define KKV_ACT_EXP_MIN -87.3f
#define KKV_ACT_LOG2E 1.44269504f
#define KKV_ACT_LN2_HI 0.693359375f /* ln 2 = HI + LO; n * HI is exact */
#define KKV_ACT_LN2_LO -2.12194440e-4f
#define KKV_ACT_SQRT_2_PI 0.7978845608028654f /* GeGLU's sqrt(2 / pi) */
#define KKV_ACT_GELU_C 0.044715f

/* 1/6!, 1/5!, ..., 1/1!, 1/0! */
static const float kkv_act_taylor[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f,
                                        0.5f,          1.0f,          1.0f};

static inline float kkv_act_exp(float x) {
    if (x != x) return x; /* NaN: no float-to-int conversion of it below */
    if (x > KKV_ACT_EXP_MAX) return INFINITY;
    x = x < KKV_ACT_EXP_MIN ? KKV_ACT_EXP_MIN : x;
    float n = rintf(x * KKV_ACT_LOG2E); /* -126 .. 127 */
    float r = fmaf(-n, KKV_ACT_LN2_HI, x);
    r = fmaf(-n, KKV_ACT_LN2_LO, r);
    float y = kkv_act_taylor[0];
    for (int k = 1; k < 7; k++) y = fmaf(y, r, kkv_act_taylor[k]);
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return y * s; /* exact: y 2^n is a normal float */
}

/* silu(g) * u = g / (1 + e^-g) * u */
static inline float kkv_act_swiglu1(float g, float u) {
    return g / (1.0f + kkv_act_exp(-g)) * u;
}

/* GeGLU's tanh approximation, 0.5 x (1 + tanh z) with
 * z = sqrt(2/pi) (x + 0.044715 x^3), written as x / (1 + e^(-2z)) (the same
 * function: 0.5 (1 + tanh z) is the logistic function of 2z), times u. */
static inline float kkv_act_geglu1(float x, float u) {
    float z = KKV_ACT_SQRT_2_PI * (x + KKV_ACT_GELU_C * (x * x * x));
    return x / (1.0f + kkv_act_exp(-2.0f * z)) * u;
}

#endif
