/* The AVX2 kernels' 8-lane arithmetic on NEON, for the aarch64 kernels that
 * give the AVX2 tables' bits (attn_neon.c, attn_int_neon.c): an 8-lane
 * vector as a pair of quads, avx2_util.h's horizontal sum and maximum in
 * their trees, maxps' operand rule, and exact fp16 loads. Lane-wise IEEE
 * operations (add, multiply, fused multiply-add, round to nearest even) are
 * the same on both; only the reductions' order and the NaN and signed-zero
 * rules of max need copying. Include only where <arm_neon.h> exists. */
#ifndef KKV_KERNELS_NEON_LANES_H
#define KKV_KERNELS_NEON_LANES_H

#include <arm_neon.h>
#include <stdint.h>
#include <string.h>

#ifndef AI
#define AI static inline __attribute__((always_inline))
#endif

/* An 8-lane AVX2 vector as two quads: lanes 0-3 and 4-7. */
typedef struct f8 {
    float32x4_t lo, hi;
} f8;

/* maxps on one lane: a > b ? a : b (b when equal or unordered). */
AI float max_x86(float a, float b) { return a > b ? a : b; }
AI float32x4_t vmax_x86(float32x4_t a, float32x4_t b) { return vbslq_f32(vcgtq_f32(a, b), a, b); }

/* avx2_util.h's hsum: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). */
AI float hsum8(f8 a) {
    float32x4_t x = vaddq_f32(a.lo, a.hi);
    return (vgetq_lane_f32(x, 0) + vgetq_lane_f32(x, 2)) + (vgetq_lane_f32(x, 1) + vgetq_lane_f32(x, 3));
}

/* avx2_util.h's hmax, in its order and with maxps' operand rule. */
AI float hmax8(f8 a) {
    float32x4_t x = vmax_x86(a.lo, a.hi);
    float m0 = max_x86(vgetq_lane_f32(x, 0), vgetq_lane_f32(x, 2));
    float m1 = max_x86(vgetq_lane_f32(x, 1), vgetq_lane_f32(x, 3));
    return max_x86(m0, m1);
}

/* n (4 or 8) floats at p, zero-filled to 8 lanes (avx2_util.h's load_n). */
AI f8 load8(const float *p, int n) {
    f8 v = {vld1q_f32(p), n == 8 ? vld1q_f32(p + 4) : vdupq_n_f32(0.0f)};
    return v;
}

/* 4 fp16 at p to fp32 (exact, as kkv_f16_to_f32 and F16C for every non-NaN). */
AI float32x4_t f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* n (a multiple of 4) fp16 stored at p, any alignment, to fp32. */
AI void f16_row(float *dst, const uint8_t *p, int n) {
    for (int i = 0; i < n; i += 4) {
        uint16_t h[4];
        memcpy(h, p + 2 * (size_t)i, sizeof h);
        vst1q_f32(dst + i, f16x4(h));
    }
}

#endif
