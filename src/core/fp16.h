/* IEEE binary16 <-> binary32 conversions, portable and bit-exact (round to
 * nearest even), so every kernel stores identical bytes. The SIMD kernels use
 * F16C, which rounds the same way; tests hold them to these functions. */
#ifndef KKV_CORE_FP16_H
#define KKV_CORE_FP16_H

#include <stdint.h>
#include <string.h>

#define KKV_F16_MAX 65504.0f

static inline float kkv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        /* zero or subnormal: mant * 2^-24 is exact in fp32 */
        float f = (float)mant * 5.9604644775390625e-8f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

/* Round to nearest even; overflow gives +-Inf, NaN stays NaN (quiet). */
static inline uint16_t kkv_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    uint16_t o;
    if (u >= 0x47800000u) { /* >= 65536, Inf or NaN */
        o = (u > 0x7f800000u) ? 0x7e00u : 0x7c00u;
    } else if (u < 0x38800000u) { /* below 2^-14: subnormal or zero */
        /* Adding 0.5 lands the value's subnormal bits in the low mantissa of
         * the sum, rounded to nearest even by the FPU itself. */
        float a, magic = 0.5f;
        uint32_t mb;
        memcpy(&a, &u, 4);
        a += magic;
        memcpy(&mb, &a, 4);
        o = (uint16_t)(mb - 0x3f000000u);
    } else {
        uint32_t odd = (u >> 13) & 1u;
        u += 0xc8000fffu + odd; /* rebias exponent (-112 << 23), round */
        o = (uint16_t)(u >> 13);
    }
    return (uint16_t)(o | sign);
}

/* The storage conversion: finite values beyond the fp16 range clamp to
 * +-65504 instead of becoming Inf (inputs are checked finite before this). */
static inline uint16_t kkv_f16_store(float f) {
    if (f > KKV_F16_MAX) f = KKV_F16_MAX;
    if (f < -KKV_F16_MAX) f = -KKV_F16_MAX;
    return kkv_f32_to_f16(f);
}

/* The value a float becomes when stored in fp16 and read back. */
static inline float kkv_f16_round(float f) { return kkv_f16_to_f32(kkv_f16_store(f)); }

#endif
