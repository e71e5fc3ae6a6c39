/* The NEON weight kernels (aarch64), built twice: weights_neon.c for every
 * aarch64 CPU, weights_dotprod_neon.c with the dot-product extension
 * (KKV_WT_SDOT: one sdot where the base set takes two widening multiplies
 * and two pairwise adds). Both give the scalar kernels' bits.
 *
 * Design: the x86 row-block kernels' (weights_rows_impl.h). Eight weight rows
 * at once, one int32 lane per row, two 128-bit registers for the eight
 * lanes: bytes 4i..4i+3 of row r sit in lane r of code register i, and four
 * bytes of an x block, broadcast to every lane, are dotted with them, which
 * leaves the exact integer block sum of each row in its lane. Packed weights
 * (kkv_wt_pack, groups of eight) are already in that order, so the code
 * registers are plain loads; rows side by side (Q4_0, Q4_1, Q8_0 unpacked)
 * are gathered four bytes at a time.
 *
 * Arithmetic, per row, is the scalar reference's (weights.c sdot_row_q):
 * block by block acc += (d_w * d_x) * (float)sumi; Q4_1 and Q5_1 add
 * accm += m_w * s_x, Q4_K and Q5_K subtract accm -= (dmin_w * d_x) * mins;
 * then acc + accm. Each operation is its own instruction, rounded once (the
 * build has -ffp-contract=off), and the integer sums are exact: every code
 * fits a signed byte (Q4 0..15, Q5 0..31, Q6_K 0..63, Q8_0 -128..127) and
 * every x is -127..127, so a pair of products is at most 32512 in the int16
 * stage of the base set. tests/test_weights.c compares bytes. */
#include <arm_neon.h>
#include <string.h>

#include "core/cpu.h"
#include "model/weights.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the NEON weight kernels read the blocks' little-endian fields as native words"
#endif

#define AI static inline __attribute__((always_inline))

/* Eight int32 / fp32 lanes: rows 0..3 in a, rows 4..7 in b. */
typedef struct { int8x16_t a, b; } nw_i8;
typedef struct { int32x4_t a, b; } nw_i32;
typedef struct { float32x4_t a, b; } nw_f32;

/* acc + the four products of the bytes of each int32 lane of c and xb. */
AI int32x4_t dot4(int32x4_t acc, int8x16_t c, int8x16_t xb) {
#ifdef KKV_WT_SDOT
    return vdotq_s32(acc, c, xb);
#else
    int16x8_t lo = vmull_s8(vget_low_s8(c), vget_low_s8(xb));
    int16x8_t hi = vmull_high_s8(c, xb);
    return vpadalq_s16(acc, vpaddq_s16(lo, hi)); /* pairs <= 2 * 128 * 127 */
#endif
}

AI nw_i32 dot8(nw_i32 acc, nw_i8 c, int8x16_t xb) { return (nw_i32){dot4(acc.a, c.a, xb), dot4(acc.b, c.b, xb)}; }

/* Bytes 4i..4i+3 of an x block in every lane. */
AI int8x16_t x4(const kkv_q8x *x, int i) {
    int32_t v;
    memcpy(&v, x->q + 4 * i, 4);
    return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

/* Where a block's fields come from: a packed group (g: its first block; a
 * field at offset f of a row's block is at 8 f, then four bytes per row) or
 * eight row pointers (rp). `packed` is a constant in each copy. */
typedef struct nw_src {
    const uint8_t *g;
    const uint8_t *const *rp;
} nw_src;

/* Register i of the field at offset off: bytes off + 4i.. of row r in lane r. */
AI nw_i8 ld_g(nw_src s, const int packed, size_t off, int i) {
    if (packed) {
        const uint8_t *p = s.g + 8 * off + 32 * (size_t)i;
        return (nw_i8){vreinterpretq_s8_u8(vld1q_u8(p)), vreinterpretq_s8_u8(vld1q_u8(p + 16))};
    }
    uint32_t w[8];
    for (int r = 0; r < 8; r++) memcpy(&w[r], s.rp[r] + off + 4 * (size_t)i, 4);
    return (nw_i8){vreinterpretq_s8_u32(vld1q_u32(w)), vreinterpretq_s8_u32(vld1q_u32(w + 4))};
}

/* The fp16 at offset off of each row, as fp32 (exact). */
AI nw_f32 ld_h(nw_src s, const int packed, size_t off) {
    uint16_t h[8];
    if (packed) memcpy(h, s.g + 8 * off, sizeof h);
    else
        for (int r = 0; r < 8; r++) memcpy(&h[r], s.rp[r] + off, 2);
    float16x8_t v = vreinterpretq_f16_u16(vld1q_u16(h));
    return (nw_f32){vcvt_f32_f16(vget_low_f16(v)), vcvt_high_f32_f16(v)};
}

AI nw_i8 and8(nw_i8 v, int8x16_t m) { return (nw_i8){vandq_s8(v.a, m), vandq_s8(v.b, m)}; }
AI nw_i8 or8(nw_i8 u, nw_i8 v) { return (nw_i8){vorrq_s8(u.a, v.a), vorrq_s8(u.b, v.b)}; }
/* Each byte shifted by n bits as unsigned: left for n > 0, right for n < 0
 * (per byte, so no bit crosses into a neighbour). */
AI nw_i8 shl8(nw_i8 v, int n) {
    const int8x16_t k = vdupq_n_s8((int8_t)n);
    return (nw_i8){vreinterpretq_s8_u8(vshlq_u8(vreinterpretq_u8_s8(v.a), k)),
                   vreinterpretq_s8_u8(vshlq_u8(vreinterpretq_u8_s8(v.b), k))};
}
/* Byte k (0..3) of each int32 lane, zero- (sgn 0) or sign-extended. */
AI nw_i32 byte_of(nw_i8 v, int k, int sgn) {
    if (sgn) {
        const int32x4_t l = vdupq_n_s32(24 - 8 * k), r = vdupq_n_s32(-24);
        return (nw_i32){vshlq_s32(vshlq_s32(vreinterpretq_s32_s8(v.a), l), r),
                        vshlq_s32(vshlq_s32(vreinterpretq_s32_s8(v.b), l), r)};
    }
    const int32x4_t r = vdupq_n_s32(-8 * k), m = vdupq_n_s32(0xff);
    return (nw_i32){vandq_s32(vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s8(v.a), r)), m),
                    vandq_s32(vreinterpretq_s32_u32(vshlq_u32(vreinterpretq_u32_s8(v.b), r)), m)};
}

AI nw_i32 add32(nw_i32 u, nw_i32 v) { return (nw_i32){vaddq_s32(u.a, v.a), vaddq_s32(u.b, v.b)}; }
AI nw_i32 sub32(nw_i32 u, int32_t k) { return (nw_i32){vsubq_s32(u.a, vdupq_n_s32(k)), vsubq_s32(u.b, vdupq_n_s32(k))}; }
AI nw_i32 mul32(nw_i32 u, nw_i32 v) { return (nw_i32){vmulq_s32(u.a, v.a), vmulq_s32(u.b, v.b)}; }
AI nw_i32 zero32(void) { return (nw_i32){vdupq_n_s32(0), vdupq_n_s32(0)}; }

/* acc + (d_w * d_x) * (float)s, lane by lane, each operation rounded once. */
AI nw_f32 add_block(nw_f32 acc, nw_f32 dw, float dx, nw_i32 s) {
    const float32x4_t d = vdupq_n_f32(dx);
    return (nw_f32){vaddq_f32(acc.a, vmulq_f32(vmulq_f32(dw.a, d), vcvtq_f32_s32(s.a))),
                    vaddq_f32(acc.b, vmulq_f32(vmulq_f32(dw.b, d), vcvtq_f32_s32(s.b)))};
}

/* The dot of code registers c[0..n) with x's groups g0.., exact. Two chains. */
AI nw_i32 dot_codes(const nw_i8 *c, const kkv_q8x *x, int g0, int n) {
    nw_i32 s0 = zero32(), s1 = zero32();
    for (int i = 0; i < n; i += 2) {
        s0 = dot8(s0, c[i], x4(x, g0 + i));
        s1 = dot8(s1, c[i + 1], x4(x, g0 + i + 1));
    }
    return add32(s0, s1);
}

/* res[j * 8 + r] = row r . x_j for the eight rows of src and nx (1..8) x
 * vectors, nb blocks of 32 values. [pf, pf_end) is prefetched a few lines
 * per block on the way (speed only). */
AI void nw_rows(float *res, uint32_t type, nw_src src, const int packed, int64_t nb,
                const kkv_q8x *const *xq, const int nx, const uint8_t *pf, const uint8_t *pf_end) {
    const int64_t pf_lines = pf < pf_end ? (pf_end - pf + 63) / 64 : 0;
    const int64_t pf_per = nb > 0 ? (pf_lines + nb - 1) / nb : 0;
    const int pf_l2 = kkv_cpu_get()->wt_pf_l2;
    nw_f32 acc[KKV_WT_NX], accm[KKV_WT_NX];
    for (int j = 0; j < nx; j++) acc[j] = accm[j] = (nw_f32){vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    const int8x16_t m4 = vdupq_n_s8(0x0f), m16 = vdupq_n_s8(0x10);
    /* Q5 and the K-quants only packed (their fifth bits are transposed
     * there): `packed &&` keeps them out of the unpacked copies, whose types
     * nw_rows_covers limits to Q4_0, Q4_1 and Q8_0 */
    const int q5 = packed && (type == KKV_WT_Q5_0 || type == KKV_WT_Q5_1);
    if (type == KKV_WT_Q4_0 || type == KKV_WT_Q4_1 || q5) {
        /* Q4: fp16 d, [fp16 m], 16 code bytes (values 4i.. in the low
         * nibbles of register i, 16 + 4i.. in the high). Q5 adds the fifth
         * bits, packed transposed (kkv_wt_pack): bit g of byte k of a lane of
         * h is the fifth bit of value 4g + k, so one per-byte shift by 4 - g
         * and a mask put it at bit 4 of register g's byte k. */
        const int five = q5;
        const int one = type == KKV_WT_Q4_1 || type == KKV_WT_Q5_1;
        const size_t bb = five ? (one ? 24 : 22) : (one ? 20 : 18);
        const size_t qoff = five ? (one ? 8 : 6) : (one ? 4 : 2), hoff = one ? 4 : 2;
        const int32_t off = five ? 16 : 8; /* codes are value + off */
        for (int64_t b = 0; b < nb; b++) {
            for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
            const size_t o = bb * (size_t)b;
            const nw_f32 dw = ld_h(src, packed, o);
            nw_i8 c[8]; /* values 4i.. (i < 4), 16 + 4(i - 4).. */
            for (int i = 0; i < 4; i++) {
                const nw_i8 t = ld_g(src, packed, o + qoff, i);
                c[i] = and8(t, m4);
                c[4 + i] = shl8(t, -4);
            }
            if (five) {
                const nw_i8 h = ld_g(src, packed, o + hoff, 0);
                for (int g = 0; g < 8; g++) c[g] = or8(c[g], and8(shl8(h, 4 - g), m16));
            }
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                nw_i32 s = add32(dot_codes(c, x, 0, 4), dot_codes(c + 4, x, 4, 4));
                if (!one) s = sub32(s, off * x->isum);
                acc[j] = add_block(acc[j], dw, x->d, s);
            }
            if (one) {
                const nw_f32 mw = ld_h(src, packed, o + 2);
                for (int j = 0; j < nx; j++) {
                    const float32x4_t sx = vdupq_n_f32(xq[j][b].s);
                    accm[j].a = vaddq_f32(accm[j].a, vmulq_f32(mw.a, sx));
                    accm[j].b = vaddq_f32(accm[j].b, vmulq_f32(mw.b, sx));
                }
            }
        }
    } else if (type == KKV_WT_Q8_0) {
        for (int64_t b = 0; b < nb; b++) {
            for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
            const size_t o = 34 * (size_t)b;
            const nw_f32 dw = ld_h(src, packed, o);
            nw_i8 c[8];
            for (int i = 0; i < 8; i++) c[i] = ld_g(src, packed, o + 2, i);
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                acc[j] = add_block(acc[j], dw, x->d, dot_codes(c, x, 0, 8));
            }
        }
    } else if (packed && (type == KKV_WT_Q4_K || type == KKV_WT_Q5_K)) {
        /* Super-blocks of 256 values: fp16 d, dmin, 12 bytes of six-bit
         * scales and mins (weights.c k4_scale_min), [Q5_K: 32 bytes qh, bit
         * k of byte l the fifth bit of sub-block k's value l], 128 code bytes
         * (sub-blocks 2p and 2p + 1 in the low and high nibbles of bytes
         * 32p..). Per sub-block, as the scalar code: sumi = scale *
         * (codes . x), acc += (d * d_x) * sumi, accm -= (dmin * d_x) *
         * (min * isum) (the last product exact, < 2^18). */
        const int five = type == KKV_WT_Q5_K;
        const size_t bb = five ? 176 : 144, qoff = five ? 48 : 16;
        const int8x16_t m6 = vdupq_n_s8(0x3f), m30 = vdupq_n_s8(0x30);
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const size_t o = bb * (size_t)sb;
            const nw_f32 dw = ld_h(src, packed, o), dmw = ld_h(src, packed, o + 2);
            const nw_i8 s0 = ld_g(src, packed, o + 4, 0), s1 = ld_g(src, packed, o + 4, 1);
            const nw_i8 s2 = ld_g(src, packed, o + 4, 2);
            /* byte k of each lane: scale and min of sub-block k (lo), 4 + k (hi) */
            const nw_i8 sc_lo = and8(s0, m6), mn_lo = and8(s1, m6);
            const nw_i8 sc_hi = or8(and8(s2, m4), and8(shl8(s0, -2), m30));
            const nw_i8 mn_hi = or8(shl8(s2, -4), and8(shl8(s1, -2), m30));
            for (int p = 0; p < 4; p++) {
                for (int64_t i = 0; i < 2 * pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
                nw_i8 t[8];
                for (int i = 0; i < 8; i++) t[i] = ld_g(src, packed, o + qoff + 32 * (size_t)p, i);
                for (int e = 0; e < 2; e++) {
                    const int k = 2 * p + e;
                    const nw_i32 sc = byte_of(k < 4 ? sc_lo : sc_hi, k & 3, 0);
                    const nw_i32 mn = byte_of(k < 4 ? mn_lo : mn_hi, k & 3, 0);
                    nw_i8 c[8];
                    for (int i = 0; i < 8; i++) {
                        c[i] = e ? shl8(t[i], -4) : and8(t[i], m4);
                        if (five) c[i] = or8(c[i], and8(shl8(ld_g(src, packed, o + 16, i), 4 - k), m16));
                    }
                    for (int j = 0; j < nx; j++) {
                        const kkv_q8x *x = &xq[j][8 * sb + k];
                        const nw_i32 s = mul32(dot_codes(c, x, 0, 8), sc);
                        acc[j] = add_block(acc[j], dw, x->d, s);
                        const nw_i32 mi = mul32(mn, (nw_i32){vdupq_n_s32(x->isum), vdupq_n_s32(x->isum)});
                        const float32x4_t dx = vdupq_n_f32(x->d);
                        accm[j].a = vsubq_f32(accm[j].a, vmulq_f32(vmulq_f32(dmw.a, dx), vcvtq_f32_s32(mi.a)));
                        accm[j].b = vsubq_f32(accm[j].b, vmulq_f32(vmulq_f32(dmw.b, dx), vcvtq_f32_s32(mi.b)));
                    }
                }
            }
        }
    } else if (packed && type == KKV_WT_Q6_K) {
        /* Super-blocks of 256 values (210 bytes): ql[128], qh[64], 16 int8
         * scales, fp16 d. Block k (half h = k / 4, quarter q = k % 4): the
         * low (q < 2) or high nibbles of ql[64 h + 32 (q % 2) ..] with bits
         * 2q, 2q + 1 of qh[32 h ..] above them: codes 0..63 for values
         * code - 32. As the scalar code: sumi = sc[2k] (codes . x over values
         * 0..15 - 32 isum16) + sc[2k + 1] (... over 16..31 - 32 (isum -
         * isum16)), exact. */
        const int8x16_t m30 = vdupq_n_s8(0x30);
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const size_t o = 210 * (size_t)sb;
            const nw_f32 dw = ld_h(src, packed, o + 208);
            for (int k = 0; k < 8; k++) {
                for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
                const int h = k >> 2, q = k & 3;
                nw_i8 c[8];
                for (int i = 0; i < 8; i++) {
                    const nw_i8 l = ld_g(src, packed, o + 64 * (size_t)h + 32 * (size_t)(q & 1), i);
                    const nw_i8 u = ld_g(src, packed, o + 128 + 32 * (size_t)h, i);
                    c[i] = or8(q & 2 ? shl8(l, -4) : and8(l, m4), and8(shl8(u, 4 - 2 * q), m30));
                }
                /* int8 scales 2k, 2k + 1: bytes 2 (k % 2), + 1 of register k / 2 */
                const nw_i8 v = ld_g(src, packed, o + 192, k >> 1);
                const nw_i32 sc0 = byte_of(v, 2 * (k & 1), 1), sc1 = byte_of(v, 2 * (k & 1) + 1, 1);
                for (int j = 0; j < nx; j++) {
                    const kkv_q8x *x = &xq[j][8 * sb + k];
                    const nw_i32 s0 = sub32(dot_codes(c, x, 0, 4), 32 * x->isum16);
                    const nw_i32 s1 = sub32(dot_codes(c + 4, x, 4, 4), 32 * (x->isum - x->isum16));
                    acc[j] = add_block(acc[j], dw, x->d, add32(mul32(sc0, s0), mul32(sc1, s1)));
                }
            }
        }
    }
    for (int j = 0; j < nx; j++) {
        vst1q_f32(res + 8 * j, vaddq_f32(acc[j].a, accm[j].a));
        vst1q_f32(res + 8 * j + 4, vaddq_f32(acc[j].b, accm[j].b));
    }
}

/* nw_rows with nx (1..8) a constant in each copy, so its loops unroll. */
#define NW_NX_SWITCH(src, packed)                                                                  \
    switch (nx) {                                                                                  \
    case 1: nw_rows(res, type, src, packed, nb, xq, 1, pf, pf_end); break;                         \
    case 2: nw_rows(res, type, src, packed, nb, xq, 2, pf, pf_end); break;                         \
    case 3: nw_rows(res, type, src, packed, nb, xq, 3, pf, pf_end); break;                         \
    case 4: nw_rows(res, type, src, packed, nb, xq, 4, pf, pf_end); break;                         \
    case 5: nw_rows(res, type, src, packed, nb, xq, 5, pf, pf_end); break;                         \
    case 6: nw_rows(res, type, src, packed, nb, xq, 6, pf, pf_end); break;                         \
    case 7: nw_rows(res, type, src, packed, nb, xq, 7, pf, pf_end); break;                         \
    default: nw_rows(res, type, src, packed, nb, xq, 8, pf, pf_end); break;                       \
    }

/* Q5 and the K-quants need the packed layout (the transposed fifth bits). */
static int nw_rows_covers(uint32_t type) {
    return type == KKV_WT_Q4_0 || type == KKV_WT_Q4_1 || type == KKV_WT_Q8_0;
}
static int nw_pack_covers(uint32_t type) {
    return nw_rows_covers(type) || type == KKV_WT_Q5_0 || type == KKV_WT_Q5_1 || type == KKV_WT_Q4_K ||
           type == KKV_WT_Q5_K || type == KKV_WT_Q6_K;
}

static int nw_dot_q_rows(float *res, uint32_t type, const uint8_t *const *rows, int64_t cols,
                         const kkv_q8x *const *xq, int nx, const uint8_t *pf, const uint8_t *pf_end) {
    if (!nw_rows_covers(type)) return 0;
    if (nx == 0) return 1;
    const int64_t nb = cols / 32;
    const nw_src src = {NULL, rows};
    NW_NX_SWITCH(src, 0);
    return 1;
}

static int nw_dot_q_pack8(float *res, uint32_t type, const uint8_t *const *rows, int64_t cols,
                          const kkv_q8x *const *xq, int nx, const uint8_t *pf, const uint8_t *pf_end) {
    if (!nw_pack_covers(type)) return 0;
    if (nx == 0) return 1;
    const int64_t nb = cols / 32;
    const nw_src src = {rows[0], NULL};
    NW_NX_SWITCH(src, 1);
    return 1;
}

/* kkv_q8x_quantize, byte for byte: the same maximum, the same d and 1 / d,
 * the same product x * (1 / d) rounded half to even (vcvtnq saturates where
 * the scalar clamp would, and sends NaN to 0 as the scalar code does), the
 * same integer sums. */
static void nw_quantize(kkv_q8x *dst, const float *x, int64_t cols) {
    const float32x4_t big = vdupq_n_f32(3.4028234663852886e38f);
    for (int64_t b = 0; b < cols / 32; b++) {
        const float *v = x + 32 * b;
        kkv_q8x *o = &dst[b];
        float32x4_t xv[8], amax = vdupq_n_f32(0.0f);
        uint32x4_t ok = vdupq_n_u32(~0u);
        for (int i = 0; i < 8; i++) {
            xv[i] = vld1q_f32(v + 4 * i);
            const float32x4_t a = vabsq_f32(xv[i]);
            ok = vandq_u32(ok, vcleq_f32(a, big)); /* false for Inf and NaN */
            amax = vmaxq_f32(amax, a);
        }
        if (vminvq_u32(ok) == 0) { /* Inf or NaN: the scalar definition's NaN block */
            kkv_q8x_quantize(o, v, 32);
            continue;
        }
        const float d = vmaxvq_f32(amax) / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const float32x4_t idv = vdupq_n_f32(id);
        const int32x4_t lim = vdupq_n_s32(127), nlim = vdupq_n_s32(-127);
        int16x8_t h[4];
        for (int i = 0; i < 4; i++) {
            int32x4_t q0 = vcvtnq_s32_f32(vmulq_f32(xv[2 * i], idv));
            int32x4_t q1 = vcvtnq_s32_f32(vmulq_f32(xv[2 * i + 1], idv));
            q0 = vmaxq_s32(vminq_s32(q0, lim), nlim);
            q1 = vmaxq_s32(vminq_s32(q1, lim), nlim);
            h[i] = vcombine_s16(vmovn_s32(q0), vmovn_s32(q1));
        }
        const int8x16_t lo = vcombine_s8(vmovn_s16(h[0]), vmovn_s16(h[1]));
        const int8x16_t hi = vcombine_s8(vmovn_s16(h[2]), vmovn_s16(h[3]));
        vst1q_s8(o->q, lo);
        vst1q_s8(o->q + 16, hi);
        const int32_t sum16 = vaddlvq_s8(lo);
        const int32_t sum = sum16 + vaddlvq_s8(hi);
        o->d = d;
        o->isum = sum;
        o->isum16 = sum16;
        o->s = d * (float)sum;
    }
}

const kkv_wt_kernels KKV_WT_TABLE = {kkv_wt_scalar_dot_q, kkv_wt_scalar_dot_f, nw_quantize, nw_dot_q_rows, NULL,
                                     nw_dot_q_pack8, 8};
