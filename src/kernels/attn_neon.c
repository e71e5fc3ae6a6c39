/* NEON kernels for aarch64, where Advanced SIMD is part of the base
 * instruction set (no runtime check).
 *
 * The fp16-run primitives and the softmax compute what the AVX2 table's
 * (attn_avx2.c) compute, lane for lane: the same fused multiply-adds per
 * lane, the same reductions in the same trees (neon_lanes.h holds its 8-lane
 * vectors as pairs of quads), the same exponential (kkv_exp_soft, whose
 * 4-lane form gives the scalar form's bits, as the AVX2 one does). With the
 * integer page kernels of attn_int_neon.c (the AVX2 tables' bits too), a
 * cache attends to the same bytes on an ARM machine as on an x86 one with
 * AVX2 or AVX-512: test_golden checks the AVX2 output hashes on aarch64.
 * Like the AVX2 kernels they agree with the scalar reference to rounding
 * (the contract of kernels.h), not bit for bit.
 *
 * The float page kernels here, which take the pages the integer ones cannot
 * represent, compute the scalar reference's products and sums in its order
 * (products and sums stay separate instructions; the build has
 * -ffp-contract=off), so they give its bits. The flush codecs are the scalar
 * ones. Nothing here has been timed on ARM hardware, which this project's
 * machines are not (CI runs these kernels under qemu-user). */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"
#include "kernels/neon_lanes.h"
#include "core/exp_poly_neon.h"
#include "quant/quant.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "attn_neon.c reads the pages' little-endian fp16 scales as native halves"
#endif

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

/* [sum a0, sum a1, sum a2, sum a3] of four 8-lane sums, attn_avx2.c's
 * hsum4: vhaddps per 128-bit half ([x0+x1, x2+x3, y0+y1, y2+y3], vpaddq's
 * pairs), twice, then the two halves added. */
AI float32x4_t hsum4(const f8 *a) {
    float32x4_t l = vpaddq_f32(vpaddq_f32(a[0].lo, a[1].lo), vpaddq_f32(a[2].lo, a[3].lo));
    float32x4_t h = vpaddq_f32(vpaddq_f32(a[0].hi, a[1].hi), vpaddq_f32(a[2].hi, a[3].hi));
    return vaddq_f32(l, h);
}

/* Tokens t .. t + 3 of NR (1 or 2) heads: per head and token an 8-lane
 * sum of q_j k_j by fused multiply-adds over j in steps of 8 (the last 4
 * channels of D % 8 == 4 add nothing to lanes 4-7, as attn_avx2.c's
 * zero-padded query), then hsum4. Always inlined with a constant NR, so
 * the 16 accumulators stay in registers (with a variable count GCC kept
 * them on the stack: ~25% more instructions a call). */
AI void qk_f16_tile4(float *s, int n, const float *qr, const uint16_t *k, int t, int D, int NR) {
    f8 acc[2][4];
    for (int i = 0; i < NR; i++)
        for (int u = 0; u < 4; u++) acc[i][u].lo = acc[i][u].hi = vdupq_n_f32(0.0f);
    for (int j = 0; j + 8 <= D; j += 8) {
        float32x4_t ql[2], qh[2]; /* the heads' 8 query lanes, loaded once for 4 tokens */
        for (int i = 0; i < NR; i++) ql[i] = vld1q_f32(qr + (size_t)i * D + j), qh[i] = vld1q_f32(qr + (size_t)i * D + j + 4);
        for (int u = 0; u < 4; u++) {
            const uint16_t *row = k + (size_t)(t + u) * D + j;
            float32x4_t klo = f16x4(row), khi = f16x4(row + 4);
            for (int i = 0; i < NR; i++) {
                acc[i][u].lo = vfmaq_f32(acc[i][u].lo, ql[i], klo);
                acc[i][u].hi = vfmaq_f32(acc[i][u].hi, qh[i], khi);
            }
        }
    }
    if (D % 8) { /* the last 4 channels: lanes 0-3 only */
        int j = D - 4;
        for (int u = 0; u < 4; u++) {
            float32x4_t klo = f16x4(k + (size_t)(t + u) * D + j);
            for (int i = 0; i < NR; i++) acc[i][u].lo = vfmaq_f32(acc[i][u].lo, vld1q_f32(qr + (size_t)i * D + j), klo);
        }
    }
    for (int i = 0; i < NR; i++) vst1q_f32(s + (size_t)i * n + t, hsum4(acc[i]));
}

/* s [n_rep][n] over keys k [n][D], attn_avx2.c's qk_f16: qk_f16_tile4 for
 * 4 tokens at a time, one 8-lane sum and hsum8 for each of the last 1..3.
 * Two heads a pass. */
static void qk_f16(float *s, const float *q, int n_rep, const uint16_t *k, int n, int D,
                   const void *pf) {
    (void)pf; /* a hint the x86 kernels take; ARM cores prefetch rows by themselves */
    for (int r0 = 0; r0 < n_rep; r0 += 2) {
        int nr = n_rep - r0 < 2 ? n_rep - r0 : 2;
        const float *qr = q + (size_t)r0 * D;
        float *sr = s + (size_t)r0 * n;
        int t = 0;
        for (; t + 4 <= n; t += 4) {
            if (nr == 2) qk_f16_tile4(sr, n, qr, k, t, D, 2);
            else qk_f16_tile4(sr, n, qr, k, t, D, 1);
        }
        for (; t < n; t++) /* the last 1..3 tokens: one 8-lane sum each */
            for (int i = 0; i < nr; i++) {
                f8 a = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
                const uint16_t *row = k + (size_t)t * D;
                for (int j = 0; j < D; j += 8) {
                    a.lo = vfmaq_f32(a.lo, vld1q_f32(qr + (size_t)i * D + j), f16x4(row + j));
                    if (j + 8 <= D) a.hi = vfmaq_f32(a.hi, vld1q_f32(qr + (size_t)i * D + j + 4), f16x4(row + j + 4));
                }
                sr[(size_t)i * n + t] = hsum8(a);
            }
    }
}

/* Channels [j, j + 4 NV) of NR heads (both constants: the accumulators
 * stay in registers) over the n tokens: acc = fma(p_t, v_tj, acc) token by
 * token, attn_avx2.c's pv_f16 per lane. */
AI void pv_f16_tile(float *acc, const float *p, const uint16_t *v, int n, int D, int j, int NR, int NV) {
    float32x4_t a[4][4];
    for (int i = 0; i < NR; i++)
        for (int c = 0; c < NV; c++) a[i][c] = vld1q_f32(acc + (size_t)i * D + j + 4 * c);
    for (int t = 0; t < n; t++) {
        const uint16_t *row = v + (size_t)t * D + j;
        float32x4_t x[4];
        for (int c = 0; c < NV; c++) x[c] = f16x4(row + 4 * c);
        for (int i = 0; i < NR; i++) {
            float w = p[(size_t)i * n + t];
            for (int c = 0; c < NV; c++) a[i][c] = vfmaq_n_f32(a[i][c], x[c], w);
        }
    }
    for (int i = 0; i < NR; i++)
        for (int c = 0; c < NV; c++) vst1q_f32(acc + (size_t)i * D + j + 4 * c, a[i][c]);
}

AI void pv_f16_heads(float *acc, const float *p, const uint16_t *v, int n, int D, int NR) {
    int j = 0;
    for (; j + 16 <= D; j += 16) pv_f16_tile(acc, p, v, n, D, j, NR, 4);
    for (; j < D; j += 4) pv_f16_tile(acc, p, v, n, D, j, NR, 1); /* D is a multiple of 4 */
}

/* acc [n_rep][D] += p [n_rep][n] x v [n][D]: 16 (then 4) channels of up to
 * 4 heads in registers while the tokens go by. */
static void pv_f16(float *acc, const float *p, int n_rep, const uint16_t *v, int n, int D,
                   const void *pf) {
    (void)pf;
    for (int r0 = 0; r0 < n_rep; r0 += 4) {
        int nr = n_rep - r0 < 4 ? n_rep - r0 : 4;
        float *ar = acc + (size_t)r0 * D;
        const float *pr = p + (size_t)r0 * n;
        if (nr == 4) pv_f16_heads(ar, pr, v, n, D, 4);
        else if (nr == 3) pv_f16_heads(ar, pr, v, n, D, 3);
        else if (nr == 2) pv_f16_heads(ar, pr, v, n, D, 2);
        else pv_f16_heads(ar, pr, v, n, D, 1);
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
    f16_row(scale, page + L.scale, D);
    f16_row(mn, page + L.mn, D);
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
        f16_row(scale, page + L.scale + 2 * (size_t)t0, nt);
        f16_row(mn, page + L.mn + 2 * (size_t)t0, nt);
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

/* One head's s [n] = e^(s inv - mx), returning their sum: attn_avx2.c's
 * exp_scores lane for lane. 32 scores a step as four 8-lane vectors, the
 * last 1..31 through a zero-padded copy with the pad lanes zeroed after the
 * exponential; vectors 0 and 2 of a step go into one 8-lane chain, 1 and 3
 * into the other, and the sum is hsum8 of the two chains added. */
static float exp_scores(float *s, int n, float inv, float mx) {
    float32x4_t vinv = vdupq_n_f32(inv), vneg = vdupq_n_f32(-mx);
    f8 c0 = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}, c1 = c0;
    for (int t = 0; t < n; t += 32) {
        float tmp[32];
        int k = n - t;
        float *p = s + t;
        if (k < 32) {
            memset(tmp, 0, sizeof tmp);
            memcpy(tmp, p, (size_t)k * sizeof(float));
            p = tmp;
        }
        float32x4_t e[8];
        for (int i = 0; i < 8; i++) e[i] = kkv_exp_soft4(vfmaq_f32(vneg, vld1q_f32(p + 4 * i), vinv));
        if (k < 32) /* lanes past the scores: +0, as the AVX2 mask leaves them */
            for (int i = 0; i < 8; i++) {
                static const uint32_t iota[4] = {0, 1, 2, 3};
                uint32x4_t lane = vaddq_u32(vld1q_u32(iota), vdupq_n_u32(4u * (uint32_t)i));
                e[i] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e[i]), vcltq_u32(lane, vdupq_n_u32((uint32_t)k))));
            }
        for (int i = 0; i < 8; i++) vst1q_f32(p + 4 * i, e[i]);
        if (k < 32) memcpy(s + t, tmp, (size_t)k * sizeof(float));
        c0.lo = vaddq_f32(c0.lo, e[0]), c0.hi = vaddq_f32(c0.hi, e[1]);
        c1.lo = vaddq_f32(c1.lo, e[2]), c1.hi = vaddq_f32(c1.hi, e[3]);
        c0.lo = vaddq_f32(c0.lo, e[4]), c0.hi = vaddq_f32(c0.hi, e[5]);
        c1.lo = vaddq_f32(c1.lo, e[6]), c1.hi = vaddq_f32(c1.hi, e[7]);
    }
    f8 sum = {vaddq_f32(c0.lo, c1.lo), vaddq_f32(c0.hi, c1.hi)};
    return hsum8(sum);
}

/* attn_avx2.c's softmax: the raw maximum by 8-lane maxps, then the tail,
 * scaled once; the exponentials of exp_scores; the rescale of acc skipped
 * when the running max held (softmax_close of avx2_util.h). */
static void softmax(float *sc, float *ml, float *acc, int n_rep, int n, int D, float inv) {
    for (int r = 0; r < n_rep; r++) {
        float *s = sc + (size_t)r * n, *a = acc + (size_t)r * D;
        float m_old = ml[2 * r];
        f8 vm = {vdupq_n_f32(-INFINITY), vdupq_n_f32(-INFINITY)};
        int t = 0;
        for (; t + 8 <= n; t += 8) vm.lo = vmax_x86(vm.lo, vld1q_f32(s + t)), vm.hi = vmax_x86(vm.hi, vld1q_f32(s + t + 4));
        float raw = hmax8(vm);
        for (; t < n; t++) raw = s[t] > raw ? s[t] : raw;
        float mx = raw * inv;
        mx = m_old > mx ? m_old : mx;
        float total = exp_scores(s, n, inv, mx);
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
