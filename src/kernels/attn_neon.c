/* NEON kernels for aarch64, where Advanced SIMD is part of the base
 * instruction set (no runtime check). The fp16-run primitives and the
 * float page kernels compute what the scalar reference (attn_scalar.c)
 * computes, operation for operation and in the same order for every output,
 * only several outputs at a time: q.k across 4 or 16 tokens, p.v across 4 or
 * 16 channels. Products and sums stay separate instructions, as the
 * reference rounds each product before adding it (the build has
 * -ffp-contract=off), so qk_f16, pv_f16 and the float page kernels give the
 * scalar kernels' bits (tests/test_kernels.c compares bytes). The table's
 * page kernels are the integer-domain ones of attn_int_neon.c (the AVX2
 * tables' bits); the float ones here take the pages they cannot represent.
 * The softmax takes kkv_exp_soft on 4 lanes (core/exp_poly_neon.h) where
 * the reference calls libm's expf: it agrees with it to rounding, the
 * contract of kernels.h. The flush codecs are the scalar ones.
 *
 * Not here yet: FMA forms of the fp16 kernels; they change rounding and
 * only pay where they can be timed on ARM hardware, which this project's
 * machines are not (CI runs these kernels under qemu-user). */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "core/exp_poly_neon.h"
#include "core/fp16.h"
#include "quant/quant.h"

#define AI static inline __attribute__((always_inline))

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "attn_neon.c reads the pages' little-endian fp16 scales as native halves"
#endif

/* 4 fp16 at p to fp32 (exact, as kkv_f16_to_f32 for every non-NaN). */
AI float32x4_t f16x4(const uint16_t *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* n (a multiple of 4) fp16 stored at p, any alignment, to fp32. */
AI void f16_bytes(float *dst, const uint8_t *p, int n) {
    for (int i = 0; i < n; i += 4) {
        uint16_t h[4];
        memcpy(h, p + 2 * (size_t)i, sizeof h);
        vst1q_f32(dst + i, f16x4(h));
    }
}

/* Columns of the 4x4 block of rows a, b, c, d: c0 = (a0, b0, c0, d0), ... */
AI void transpose4(float32x4_t *a, float32x4_t *b, float32x4_t *c, float32x4_t *d) {
    float32x4_t t0 = vtrn1q_f32(*a, *b), t1 = vtrn2q_f32(*a, *b);
    float32x4_t t2 = vtrn1q_f32(*c, *d), t3 = vtrn2q_f32(*c, *d);
    *a = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    *b = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    *c = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    *d = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

/* Sixteen codes of `bits` (2 or 4) bits, packed from the low bits up as the
 * pages store them, from the 4 or 8 bytes at p: lane i is code i. */
AI uint8x16_t codes16(const uint8_t *p, int bits) {
    static const uint8_t idx2[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
    static const uint8_t idx4[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
    static const int8_t sh2[16] = {0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6};
    static const int8_t sh4[16] = {0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4, 0, -4};
    uint64_t w = 0;
    memcpy(&w, p, bits == 2 ? 4 : 8);
    uint8x16_t b = vqtbl1q_u8(vreinterpretq_u8_u64(vdupq_n_u64(w)), vld1q_u8(bits == 2 ? idx2 : idx4));
    b = vshlq_u8(b, vld1q_s8(bits == 2 ? sh2 : sh4)); /* negative counts shift right */
    return vandq_u8(b, vdupq_n_u8((uint8_t)((1 << bits) - 1)));
}

/* The 16 codes of c as 4 vectors of fp32. */
AI void widen16(float32x4_t f[4], uint8x16_t c) {
    uint16x8_t lo = vmovl_u8(vget_low_u8(c)), hi = vmovl_u8(vget_high_u8(c));
    f[0] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo)));
    f[1] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo)));
    f[2] = vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi)));
    f[3] = vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)));
}

/* x + a * b, the product rounded first (the reference's `x += a * b`). */
AI float32x4_t mul_add(float32x4_t x, float32x4_t a, float b) { return vaddq_f32(x, vmulq_n_f32(a, b)); }

/* ---------------------------------------------------------------- fp16 runs */

/* s [n_rep][n] over keys k [n][D]: 4 tokens a step, their rows transposed 4
 * channels at a time so that each lane sums its token's products in channel
 * order, as the reference does; up to 4 heads a pass share the conversions. */
static void qk_f16(float *s, const float *q, int n_rep, const uint16_t *k, int n, int D,
                   const void *pf) {
    (void)pf; /* a hint the x86 kernels take; ARM cores prefetch rows by themselves */
    int t = 0;
    for (; t + 4 <= n; t += 4)
        for (int r0 = 0; r0 < n_rep; r0 += 4) {
            int nr = n_rep - r0 < 4 ? n_rep - r0 : 4;
            float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            const uint16_t *row = k + (size_t)t * D;
            for (int j = 0; j < D; j += 4) {
                float32x4_t c0 = f16x4(row + j), c1 = f16x4(row + D + j);
                float32x4_t c2 = f16x4(row + 2 * (size_t)D + j), c3 = f16x4(row + 3 * (size_t)D + j);
                transpose4(&c0, &c1, &c2, &c3);
                for (int i = 0; i < nr; i++) {
                    const float *qq = q + (size_t)(r0 + i) * D + j;
                    acc[i] = mul_add(acc[i], c0, qq[0]);
                    acc[i] = mul_add(acc[i], c1, qq[1]);
                    acc[i] = mul_add(acc[i], c2, qq[2]);
                    acc[i] = mul_add(acc[i], c3, qq[3]);
                }
            }
            for (int i = 0; i < nr; i++) vst1q_f32(s + (size_t)(r0 + i) * n + t, acc[i]);
        }
    for (; t < n; t++) /* the last 1..3 tokens as the reference */
        for (int r = 0; r < n_rep; r++) {
            float dot = 0.0f;
            for (int j = 0; j < D; j++) dot += q[(size_t)r * D + j] * kkv_f16_to_f32(k[(size_t)t * D + j]);
            s[(size_t)r * n + t] = dot;
        }
}

/* acc [n_rep][D] += p [n_rep][n] x v [n][D]: 16 (then 4) channels of up to
 * 4 heads held in registers while the tokens go by in order. */
static void pv_f16(float *acc, const float *p, int n_rep, const uint16_t *v, int n, int D,
                   const void *pf) {
    (void)pf;
    for (int r0 = 0; r0 < n_rep; r0 += 4) {
        int nr = n_rep - r0 < 4 ? n_rep - r0 : 4;
        int j = 0;
        for (; j + 16 <= D; j += 16) {
            float32x4_t a[4][4];
            for (int i = 0; i < nr; i++)
                for (int c = 0; c < 4; c++) a[i][c] = vld1q_f32(acc + (size_t)(r0 + i) * D + j + 4 * c);
            for (int t = 0; t < n; t++) {
                const uint16_t *row = v + (size_t)t * D + j;
                float32x4_t x[4] = {f16x4(row), f16x4(row + 4), f16x4(row + 8), f16x4(row + 12)};
                for (int i = 0; i < nr; i++) {
                    float w = p[(size_t)(r0 + i) * n + t];
                    for (int c = 0; c < 4; c++) a[i][c] = mul_add(a[i][c], x[c], w);
                }
            }
            for (int i = 0; i < nr; i++)
                for (int c = 0; c < 4; c++) vst1q_f32(acc + (size_t)(r0 + i) * D + j + 4 * c, a[i][c]);
        }
        for (; j < D; j += 4) { /* D is a multiple of 4 */
            float32x4_t a[4];
            for (int i = 0; i < nr; i++) a[i] = vld1q_f32(acc + (size_t)(r0 + i) * D + j);
            for (int t = 0; t < n; t++) {
                float32x4_t x = f16x4(v + (size_t)t * D + j);
                for (int i = 0; i < nr; i++) a[i] = mul_add(a[i], x, p[(size_t)(r0 + i) * n + t]);
            }
            for (int i = 0; i < nr; i++) vst1q_f32(acc + (size_t)(r0 + i) * D + j, a[i]);
        }
    }
}

/* ---------------------------------------------------------------- quantized pages */

/* s [n_rep][G] over one key page: 16 tokens a step; per channel in order,
 * the 16 keys code * scale + mn (as the page codec decodes them), then each
 * head's product added. */
void kkv_neon_qk_page_f32(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                          int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    const uint8_t *idx = page + L.idx;
    float scale[KKV_MAX_HEAD_DIM], mn[KKV_MAX_HEAD_DIM]; // [D] each
    f16_bytes(scale, page + L.scale, D);
    f16_bytes(mn, page + L.mn, D);
    const size_t row = (size_t)G / 4;
    int t = 0;
    for (; t + 16 <= G; t += 16)
        for (int r0 = 0; r0 < n_rep; r0 += 4) {
            int nr = n_rep - r0 < 4 ? n_rep - r0 : 4;
            float32x4_t a[4][4];
            for (int i = 0; i < nr; i++)
                for (int c = 0; c < 4; c++) a[i][c] = vdupq_n_f32(0);
            for (int j = 0; j < D; j++) {
                uint8x16_t code = codes16(page + L.lo + (size_t)j * row + t / 4, 2);
                if (idx[j] < nb)
                    code = vorrq_u8(code, vshlq_n_u8(codes16(page + L.hi + (size_t)idx[j] * row + t / 4, 2), 2));
                float32x4_t kv[4];
                widen16(kv, code);
                for (int c = 0; c < 4; c++) kv[c] = vaddq_f32(vmulq_n_f32(kv[c], scale[j]), vdupq_n_f32(mn[j]));
                for (int i = 0; i < nr; i++) {
                    float w = q[(size_t)(r0 + i) * D + j];
                    for (int c = 0; c < 4; c++) a[i][c] = mul_add(a[i][c], kv[c], w);
                }
            }
            for (int i = 0; i < nr; i++)
                for (int c = 0; c < 4; c++) vst1q_f32(s + (size_t)(r0 + i) * G + t + 4 * c, a[i][c]);
        }
    for (; t < G; t++) /* the last 4..12 tokens as the reference */
        for (int r = 0; r < n_rep; r++) {
            float dot = 0.0f;
            for (int j = 0; j < D; j++) {
                int code = (page[L.lo + (size_t)j * row + t / 4] >> (2 * (t % 4))) & 3;
                if (idx[j] < nb) code |= ((page[L.hi + (size_t)idx[j] * row + t / 4] >> (2 * (t % 4))) & 3) << 2;
                dot += q[(size_t)r * D + j] * ((float)code * scale[j] + mn[j]);
            }
            s[(size_t)r * G + t] = dot;
        }
}

/* acc [n_rep][D] += p [n_rep][G] x one value page (2 or 4 bits; the
 * reference's loop for any other width): 16 channels of up to 4 heads in
 * registers while the tokens go by in order, each token's values
 * code * scale_t + mn_t as the codec decodes them. The tokens come in chunks
 * whose scales are widened once, not once per 16 channels; every output
 * still sums its tokens in order. */
void kkv_neon_pv_page_f32(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                          int bits) {
    enum { TC = 64 }; /* tokens a chunk */
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    const size_t row = (size_t)D * bits / 8;
    const int vec = bits == 2 || bits == 4 ? D / 16 * 16 : 0; /* channels done 16 at a time */
    const int per_byte = 8 / bits, maxq = (1 << bits) - 1;
    for (int t0 = 0; t0 < G; t0 += TC) {
        int nt = G - t0 < TC ? G - t0 : TC; /* a multiple of 4, as G */
        float scale[TC], mn[TC];            // [nt] each
        f16_bytes(scale, page + L.scale + 2 * (size_t)t0, nt);
        f16_bytes(mn, page + L.mn + 2 * (size_t)t0, nt);
        for (int r0 = 0; r0 < n_rep; r0 += 4) {
            int nr = n_rep - r0 < 4 ? n_rep - r0 : 4;
            for (int j = 0; j < vec; j += 16) {
                float32x4_t a[4][4];
                for (int i = 0; i < nr; i++)
                    for (int c = 0; c < 4; c++) a[i][c] = vld1q_f32(acc + (size_t)(r0 + i) * D + j + 4 * c);
                for (int u = 0; u < nt; u++) {
                    const uint8_t *codes = page + L.codes + (size_t)(t0 + u) * row + (size_t)j * bits / 8;
                    float32x4_t x[4];
                    widen16(x, codes16(codes, bits));
                    for (int c = 0; c < 4; c++) x[c] = vaddq_f32(vmulq_n_f32(x[c], scale[u]), vdupq_n_f32(mn[u]));
                    for (int i = 0; i < nr; i++) {
                        float w = p[(size_t)(r0 + i) * G + t0 + u];
                        for (int c = 0; c < 4; c++) a[i][c] = mul_add(a[i][c], x[c], w);
                    }
                }
                for (int i = 0; i < nr; i++)
                    for (int c = 0; c < 4; c++) vst1q_f32(acc + (size_t)(r0 + i) * D + j + 4 * c, a[i][c]);
            }
        }
        for (int u = 0; u < nt; u++) { /* the last channels as the reference */
            const uint8_t *codes = page + L.codes + (size_t)(t0 + u) * row;
            for (int j = vec; j < D; j++) {
                float x = (float)((codes[j / per_byte] >> (bits * (j % per_byte))) & maxq) * scale[u] + mn[u];
                for (int r = 0; r < n_rep; r++) acc[(size_t)r * D + j] += p[(size_t)r * G + t0 + u] * x;
            }
        }
    }
}

/* ---------------------------------------------------------------- online softmax */

/* The AVX2 softmax's steps (attn_avx2.c says why each is so): the raw
 * maximum first (vmaxnm, which skips NaN as the reference's compare does),
 * scaled once; the scores' exponentials of fma(s, inv, -mx) in four
 * chains of 4 lanes, the last 1..3 by the scalar kkv_exp_soft (the same
 * bits); acc rescaled only when the maximum moved. */
static void softmax(float *sc, float *ml, float *acc, int n_rep, int n, int D, float inv) {
    for (int r = 0; r < n_rep; r++) {
        float *s = sc + (size_t)r * n, *a = acc + (size_t)r * D;
        float m_old = ml[2 * r];
        float32x4_t vm = vdupq_n_f32(-INFINITY);
        int t = 0;
        for (; t + 4 <= n; t += 4) vm = vmaxnmq_f32(vm, vld1q_f32(s + t));
        float raw = vmaxnmvq_f32(vm);
        for (; t < n; t++) raw = s[t] > raw ? s[t] : raw;
        float mx = raw * inv;
        mx = m_old > mx ? m_old : mx;
        float32x4_t vinv = vdupq_n_f32(inv), vneg = vdupq_n_f32(-mx);
        float32x4_t sum[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
        t = 0;
        for (; t + 16 <= n; t += 16)
            for (int c = 0; c < 4; c++) {
                float32x4_t e = kkv_exp_soft4(vfmaq_f32(vneg, vld1q_f32(s + t + 4 * c), vinv));
                vst1q_f32(s + t + 4 * c, e);
                sum[c] = vaddq_f32(sum[c], e);
            }
        for (; t + 4 <= n; t += 4) {
            float32x4_t e = kkv_exp_soft4(vfmaq_f32(vneg, vld1q_f32(s + t), vinv));
            vst1q_f32(s + t, e);
            sum[0] = vaddq_f32(sum[0], e);
        }
        float total = vaddvq_f32(vaddq_f32(vaddq_f32(sum[0], sum[1]), vaddq_f32(sum[2], sum[3])));
        for (; t < n; t++) {
            float x = fmaf(s[t], inv, -mx);
            s[t] = kkv_exp_soft(x == x ? x : KKV_EXP_MIN); /* NaN as the vector lanes take it */
            total += s[t];
        }
        if (mx == m_old && fabsf(mx) < INFINITY) { /* the maximum held: acc stays as it is */
            ml[2 * r + 1] += total;
            continue;
        }
        float corr = expf(m_old - mx); /* 0 on the first block, where m_old = -inf */
        float32x4_t vc = vdupq_n_f32(corr);
        for (int j = 0; j < D; j += 4) vst1q_f32(a + j, vmulq_f32(vld1q_f32(a + j), vc));
        ml[2 * r + 1] = ml[2 * r + 1] * corr + total;
        ml[2 * r] = mx;
    }
}

const kkv_ops kkv_ops_neon = {
    .kind = KKV_KERNEL_NEON,
    .qk_f16 = qk_f16,
    .qk_page = kkv_neon_qk_page, /* attn_int_neon.c */
    .pv_f16 = pv_f16,
    .pv_page = kkv_neon_pv_page,
    .key_encode = kkv_scalar_key_encode,
    .value_encode = kkv_scalar_value_encode,
    .softmax = softmax,
};
