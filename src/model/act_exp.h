/* The gated activations' exponential and their per-value forms, shared by
 * the scalar reference (ops.c) and the AVX2 variant (ops_avx2.c) so that
 * they agree bit for bit. They use the project's e^x (core/exp_poly.h), not
 * libm's expf and tanhf, whose results differ between libm versions and
 * which cannot be vectorized to the same bits: one call per value was
 * ~3.7 us per layer of a SmolLM2 decode step.
 *
 * Here e^x is +inf above 88 (so silu(g) of g < -88 is -0, as with libm) and
 * NaN for a NaN x; elsewhere it is kkv_exp_poly. */
#ifndef KKV_MODEL_ACT_EXP_H
#define KKV_MODEL_ACT_EXP_H

#include <math.h>

#include "core/exp_poly.h"

#define KKV_ACT_EXP_MAX 88.0f
#define KKV_ACT_SQRT_2_PI 0.7978845608028654f /* GeGLU's sqrt(2 / pi) */
#define KKV_ACT_GELU_C 0.044715f

static inline float kkv_act_exp(float x) {
    if (x != x) return x; /* NaN: no float-to-int conversion of it below */
    if (x > KKV_ACT_EXP_MAX) return INFINITY;
    return kkv_exp_poly(x);
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
