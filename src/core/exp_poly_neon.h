/* kkv_exp_soft (core/exp_poly.h, the softmax's e^x) on 4 NEON lanes,
 * operation for operation but the last: 2^n is added to y's exponent field
 * as the rounding sum's low bits shifted left by 23, the same exact y 2^n as
 * the AVX2 form (core/exp_poly_avx2.h says why the field cannot overflow).
 * Every lane gets the scalar form's bits for x <= 88. Include only where
 * <arm_neon.h> exists (aarch64). The clamp is vmaxnm, which returns the
 * number when one operand is NaN, so a NaN lane comes out as e^-87.3, as on
 * AVX2: callers that can see NaN handle it themselves (the softmax's
 * maximum ignores NaN the same way). */
#ifndef KKV_CORE_EXP_POLY_NEON_H
#define KKV_CORE_EXP_POLY_NEON_H

#include <arm_neon.h>

#include "core/exp_poly.h"

static inline __attribute__((always_inline)) float32x4_t kkv_exp_soft4(float32x4_t x) {
    x = vmaxnmq_f32(x, vdupq_n_f32(KKV_EXP_MIN));
    /* t = fma(x, log2e, 1.5 * 2^23): its unit is 1, so n = t - 1.5 * 2^23
     * is round(x log2 e), ties to even, and t's low bits hold n */
    float32x4_t t = vfmaq_f32(vdupq_n_f32(KKV_EXP_ROUNDER), x, vdupq_n_f32(KKV_EXP_LOG2E));
    float32x4_t n = vsubq_f32(t, vdupq_n_f32(KKV_EXP_ROUNDER));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(KKV_EXP_LN2_HI)); /* fmaf(-n, HI, x) */
    r = vfmsq_f32(r, n, vdupq_n_f32(KKV_EXP_LN2_LO));
    float32x4_t y = vdupq_n_f32(kkv_exp_minimax5[0]);
    for (int k = 1; k < 6; k++) y = vfmaq_f32(vdupq_n_f32(kkv_exp_minimax5[k]), y, r);
    int32x4_t e = vshlq_n_s32(vreinterpretq_s32_f32(t), 23);
    return vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(y), e));
}

#endif
