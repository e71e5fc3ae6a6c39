/* The project's own e^x, one definition for every place that needs the same
 * bits on every CPU: kkv_exp_poly for the gated activations (model/act_exp.h,
 * scalar; model/ops_avx2.c, 8 lanes), and kkv_exp_soft (below) for the SIMD
 * attention softmaxes (kernels/avx2_util.h, 8 lanes; attn_avx512.c, 16).
 *
 * x is clamped below at -87.3 (e^x is then still a normal float),
 * n = round(x log2 e), r = x - n ln 2 in two steps (Cody-Waite,
 * |r| <= ln2 / 2), e^r by its degree-6 Taylor polynomial in Horner order
 * (truncation < 1.2e-7 relative), times 2^n built from n's bits. Valid for
 * x <= 88 (2^n stays below 2^128); callers clamp or handle larger x.
 *
 * kkv_exp_poly is the scalar form, operation for operation the 8-lane
 * kkv_exp_poly8 of core/exp_poly_avx2.h but for the last step, which the
 * wide forms take as n added to y's exponent field (8 lanes) or vscalefps
 * (16): the same exact y 2^n (tests/test_exp_avx2.c compares every float
 * near the domain's ends and a walk over the rest). Every multiply-add an
 * explicit fmaf (the build compiles with -ffp-contract=off, so nothing else
 * is fused). No intrinsics here: any file may include it. */
#ifndef KKV_CORE_EXP_POLY_H
#define KKV_CORE_EXP_POLY_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define KKV_EXP_LOG2E 1.44269504f
#define KKV_EXP_LN2_HI 0.693359375f     /* ln 2 = HI + LO; n * HI is exact */
#define KKV_EXP_LN2_LO -2.12194440e-4f
#define KKV_EXP_MIN -87.3f
/* e^r = sum r^k / k!, k = 6 down to 0, in Horner order: the one list every
 * width steps through. */
static const float kkv_exp_taylor[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f,
                                        0.5f,          1.0f,          1.0f};

/* The steps both exponentials share, given the clamped x and its integer
 * n = round(x log2 e) in -126 .. 127: r = x - n ln 2 in two steps
 * (Cody-Waite, |r| <= ln2 / 2), e^r by the polynomial c [deg + 1] in Horner
 * order, times 2^n built from n's bits (exact: y 2^n is a normal float). */
static inline float kkv_exp_finish(float x, float n, const float *c, int deg) {
    float r = fmaf(-n, KKV_EXP_LN2_HI, x);
    r = fmaf(-n, KKV_EXP_LN2_LO, r);
    float y = c[0];
    for (int k = 1; k <= deg; k++) y = fmaf(y, r, c[k]);
    int32_t e = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &e, sizeof s);
    return y * s;
}

/* e^x for finite or -inf x <= 88 (not NaN: the caller handles it). */
static inline float kkv_exp_poly(float x) {
    x = x < KKV_EXP_MIN ? KKV_EXP_MIN : x;
    return kkv_exp_finish(x, rintf(x * KKV_EXP_LOG2E), kkv_exp_taylor, 6);
}

/* The softmax's e^x (kernels/avx2_util.h, 8 lanes; attn_avx512.c, 16),
 * two operations a vector cheaper than kkv_exp_poly at the same accuracy:
 * n = round(x log2 e) by one fused multiply-add with 1.5 * 2^23 (the sum's
 * unit is 1, so it rounds x log2 e to the nearest integer, ties to even,
 * in one step instead of a multiply and a round), and e^r on
 * |r| <= ln2 / 2 by a degree-5 minimax polynomial (Remez on relative error,
 * 7.5e-8 before its coefficients are rounded to float) instead of the
 * degree-6 Taylor one: five FMAs instead of six. The 8-lane forms then take
 * 2^n from the sum's own low bits (n << 23) instead of converting n.
 * Relative error against e^x in double <= 2.5e-7 on the softmax's domain
 * [-87.3, 0] (tests/test_exp_avx2.c measures it: 2.01e-7 here), against
 * ~1.2e-7 for kkv_exp_poly; the attention's scores carry far more (the
 * page kernels round the query to 8 bits). Clamped below at -87.3 as
 * kkv_exp_poly (the same argument for y >= 1 where n = -126 holds: n is
 * -126 only for x <= -86.99, where r >= 0.03). Valid for x <= 88. The
 * scalar form is the tests' oracle: the wide forms give its bits. */
#define KKV_EXP_ROUNDER 12582912.0f /* 1.5 * 2^23 */
static const float kkv_exp_minimax5[6] = {0.0082976548f, 0.0419153832f, 0.166675746f,
                                          0.499988943f,  0.999999702f,  1.00000012f};

static inline float kkv_exp_soft(float x) {
    x = x < KKV_EXP_MIN ? KKV_EXP_MIN : x;
    float n = fmaf(x, KKV_EXP_LOG2E, KKV_EXP_ROUNDER) - KKV_EXP_ROUNDER;
    return kkv_exp_finish(x, n, kkv_exp_minimax5, 5);
}

#endif
