/* Integer-domain page kernels for NEON: the 2- and 4-bit codes are
 * multiplied as bytes by an integer query (keys) or integer probabilities
 * (values) with widening multiply-accumulates, never widened to floats one
 * by one as the float kernels of attn_neon.c do.
 *
 * The algebra is the AVX2 tables' (attn_qkbyte_avx2.c, attn_qkwide_avx2.c,
 * attn_int_impl.h); see those headers for the derivation:
 *  - keys: per page and head, f_j = q_j scale_j rounded on one step
 *    d = max_j |f_j| / QMAX (QMAX 127 where n_boost <= D / 2, else the 16-bit
 *    kernel's kkv_qk_wide_qmax of int_fold.h), the constant sum_j q_j mn_j plus the
 *    centring term kept in float; s_t = fma(I_t, d, cst), I_t the exact
 *    integer sum of x_j times the token's codes;
 *  - values: per block of 128 tokens and head, w_t = p_t scale_t rounded to
 *    uint8 on e = max w / 255; acc_j += (ap_j + mt), ap_j summing e * I_j per
 *    block, I_j the exact integer sum of the weights times the codes.
 * Every float operation of the folds and of the scores' assembly is the
 * AVX2 kernels' own, lane for lane and in their order (their 8-lane vectors
 * are pairs of NEON quads here, their horizontal sums and maxima taken in
 * the same tree), and the integer sums are exact on both. So on every page
 * the integer path takes, this kernel's scores and outputs are the AVX2
 * tables' bits: a kitty cache attends to the same numbers on an ARM server
 * and on an x86 one. tests/test_kernels.c pins the hash of both tables'
 * page outputs to one constant, and holds this kernel to the bound of
 * kernels.h (its AVX2 8-bit kernel's).
 *
 * Inputs the integer path cannot represent (a non-finite folded query, a
 * query whose largest |f| is below 1e-30 but not 0, a negative or
 * non-finite probability) go to the float kernels of attn_neon.c, which
 * give the scalar reference's bits.
 *
 * Why these instructions: base AArch64 (no sdot needed) has vmlal_s8 /
 * vmlal_u8, 8 byte products summed into int16 lanes per instruction, against
 * 4 float products per FMA after five conversions per 16 codes. The int16
 * sums are widened to int32 before they could overflow (a running bound from
 * the query's or the weights' size). Not timed: this project has no ARM
 * hardware (CI runs these kernels under qemu-user); sdot / udot versions
 * belong where they can be measured. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "kernels/int_fold.h"
#include "kernels/kernels.h"
#include "kernels/neon_lanes.h"
#include "quant/quant.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "attn_int_neon.c reads the pages' little-endian fp16 scales as native halves"
#endif

#define KB 16     /* row bytes a chunk: 64 tokens of a key row, 64 or 32 channels of a value row */
#define RBK 3     /* key heads a pass: 3 x 2 phases x 2 int16 halves = 12 accumulators */
#define RBV 4     /* value heads a pass (the AVX2 kernels' RBI) */
#define VBLK 128  /* value tokens per weight step, as the AVX2 kernels */
#define WX (2 * KKV_MAX_HEAD_DIM + 8) /* x of the D channels, the nb ranks, zeros to a multiple of 8 */

/* KB row bytes from p (n of them, 1..KB), zero-extended. */
AI uint8x16_t row16(const uint8_t *p, int n) {
    if (n == KB) return vld1q_u8(p);
    uint8_t b[KB] = {0};
    memcpy(b, p, (size_t)n);
    return vld1q_u8(b);
}

/* ------------------------------------------------------------------ keys */

/* What a key page gives every head: scales and zero points as fp32, where
 * its planes lie, and the channel of each high-plane rank (the lowest
 * channel that claims it; -1 for none, whose weight is 0). */
typedef struct key_view {
    float          scale[KKV_MAX_HEAD_DIM], mn[KKV_MAX_HEAD_DIM]; /* [D] */
    int16_t        rch[KKV_MAX_HEAD_DIM];                         /* [nb] */
    const uint8_t *idx, *lo, *hi; /* [D] ranks, [D][G/4] and [nb][G/4] code rows */
} key_view;

static void key_view_of(key_view *V, const uint8_t *page, int D, int G, int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    f16_row(V->scale, page + L.scale, D);
    f16_row(V->mn, page + L.mn, D);
    V->idx = page + L.idx, V->lo = page + L.lo, V->hi = page + L.hi;
    kkv_rank_owners(V->rch, V->idx, D, nb);
}

/* One head's integer query (qkfold_avx2.h's fold_query for one head, lane
 * for lane): x[j] = rint(f_j / d) for the D channels, then the x of each
 * rank's channel at D + k, zeros from D + nb to a multiple of 8; *d the
 * step, *cst the constant.
 * Returns 0 when some f is not finite or the step would not be normal. */
static int fold_head(int16_t *x, float *d, float *cst, const float *q, const key_view *V, int D, int nb,
                     float qmax) {
    f8 mx = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    uint32x4_t bad = vdupq_n_u32(0);
    for (int j = 0; j < D; j += 8) {
        int n = D - j < 8 ? 4 : 8;
        f8 qv = load8(q + j, n), sv = load8(V->scale + j, n);
        float32x4_t f0 = vmulq_f32(qv.lo, sv.lo), f1 = vmulq_f32(qv.hi, sv.hi);
        /* f - f is NaN for inf and NaN */
        bad = vorrq_u32(bad, vmvnq_u32(vceqq_f32(vsubq_f32(f0, f0), vdupq_n_f32(0.0f))));
        bad = vorrq_u32(bad, vmvnq_u32(vceqq_f32(vsubq_f32(f1, f1), vdupq_n_f32(0.0f))));
        mx.lo = vmax_x86(mx.lo, vabsq_f32(f0)), mx.hi = vmax_x86(mx.hi, vabsq_f32(f1));
    }
    if (vmaxvq_u32(bad)) return 0;
    float M = hmax8(mx);
    if (kkv_fold_too_small(M)) return 0; /* the float kernel takes the page */
    *d = M / qmax;
    float32x4_t vinv = vdupq_n_f32(M > 0.0f ? qmax / M : 0.0f), vd = vdupq_n_f32(*d);
    f8 c = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}, corr = c;
    for (int j = 0; j < D; j += 8) {
        int n = D - j < 8 ? 4 : 8;
        f8 qv = load8(q + j, n), sv = load8(V->scale + j, n), nv = load8(V->mn + j, n);
        /* maxq / 2 per channel: 7.5 where idx < nb (boosted), else 1.5; 0 past D */
        uint8_t ib[8] = {0};
        memcpy(ib, V->idx + j, (size_t)n);
        uint8x8_t bst = nb > 255 ? vdup_n_u8(0xFF) : vclt_u8(vld1_u8(ib), vdup_n_u8((uint8_t)nb));
        int16x8_t b16 = vmovl_s8(vreinterpret_s8_u8(bst)); /* 0 or -1 per lane */
        float32x4_t half[2];
        for (int h = 0; h < 2; h++) {
            uint32x4_t bm = vreinterpretq_u32_s32(vmovl_s16(h ? vget_high_s16(b16) : vget_low_s16(b16)));
            half[h] = 4 * h < n ? vbslq_f32(bm, vdupq_n_f32(7.5f), vdupq_n_f32(1.5f)) : vdupq_n_f32(0.0f);
        }
        float32x4_t qq[2] = {qv.lo, qv.hi}, ss[2] = {sv.lo, sv.hi}, nn[2] = {nv.lo, nv.hi};
        float32x4_t *cc[2] = {&c.lo, &c.hi}, *rr[2] = {&corr.lo, &corr.hi};
        for (int h = 0; h < 2; h++) {
            float32x4_t fv = vmulq_f32(qq[h], ss[h]);
            int32x4_t xi = vcvtnq_s32_f32(vmulq_f32(fv, vinv)); /* |x| <= qmax, ties to even */
            *cc[h] = vfmaq_f32(*cc[h], qq[h], nn[h]);
            *rr[h] = vfmaq_f32(*rr[h], vfmsq_f32(fv, vd, vcvtq_f32_s32(xi)), half[h]);
            if (4 * h < n) vst1_s16(x + j + 4 * h, vmovn_s32(xi));
        }
    }
    *cst = hsum8(c) + hsum8(corr);
    for (int k = 0; k < nb; k++) x[D + k] = V->rch[k] < 0 ? 0 : x[V->rch[k]];
    for (int k = D + nb; k < ((D + nb + 8) & ~7); k++) x[k] = 0; /* whole groups of 8 for the weight pass */
    return 1;
}

/* Scores of RB heads for one chunk (row bytes c .. c + nbytes - 1, tokens
 * 4c .. 4(c + nbytes) - 1) from their int32 sums a32 [head][phase][byte]:
 * token 4 (c + i) + k is byte i of phase k, interleaved back by vst4q. */
AI void key_scores(float *s, int G, int32_t (*a32)[4][KB], const float *d, const float *cst, int c, int nbytes,
                   int RB) {
    for (int r = 0; r < RB; r++) {
        float32x4_t vd = vdupq_n_f32(d[r]), vc = vdupq_n_f32(cst[r]);
        float *out = s + (size_t)r * G + 4 * (size_t)c;
        for (int g = 0; g < nbytes; g += 4) {
            float32x4x4_t v;
            v.val[0] = vfmaq_f32(vc, vcvtq_f32_s32(vld1q_s32(a32[r][0] + g)), vd);
            v.val[1] = vfmaq_f32(vc, vcvtq_f32_s32(vld1q_s32(a32[r][1] + g)), vd);
            v.val[2] = vfmaq_f32(vc, vcvtq_f32_s32(vld1q_s32(a32[r][2] + g)), vd);
            v.val[3] = vfmaq_f32(vc, vcvtq_f32_s32(vld1q_s32(a32[r][3] + g)), vd);
            if (nbytes - g >= 4) {
                vst4q_f32(out + 4 * g, v);
            } else { /* the last 1..3 bytes of a partial chunk */
                float tmp[16];
                vst4q_f32(tmp, v);
                memcpy(out + 4 * g, tmp, (size_t)(4 * (nbytes - g)) * sizeof *tmp);
            }
        }
    }
}

/* int32 a [16] += the int16 lanes of lo (bytes 0-7) and hi (bytes 8-15). */
AI void widen_into(int32_t *a, int16x8_t lo, int16x8_t hi) {
    vst1q_s32(a, vaddw_s16(vld1q_s32(a), vget_low_s16(lo)));
    vst1q_s32(a + 4, vaddw_high_s16(vld1q_s32(a + 4), lo));
    vst1q_s32(a + 8, vaddw_s16(vld1q_s32(a + 8), vget_low_s16(hi)));
    vst1q_s32(a + 12, vaddw_high_s16(vld1q_s32(a + 12), hi));
}

/* Rows [0, n) of a plane (rows rowb apart, from row byte c on) into the
 * int16 sums acc [head][phase k0, k0 + 1][bytes 0-7, 8-15] of RB heads:
 * each row's codes of the two phases (x4: a high plane's, taken as 4 c)
 * times the head's int8 weight w8 [head][w0 + i], by vmlal_s8. full: KB
 * bytes a row (a plain load), else nbytes zero-extended. Always inlined with
 * constant k0, x4, full and RB, so the loop carries no branch. */
AI void rows8(int16x8_t (*acc)[2][2], const int8_t (*w8)[WX], const uint8_t *rows, size_t rowb, int w0, int n,
              int k0, int x4, int full, int nbytes, int RB) {
    const uint8x16_t m3 = vdupq_n_u8(3);
    for (int i = 0; i < n; i++) {
        const uint8_t *p = rows + (size_t)i * rowb;
        uint8x16_t B = full ? vld1q_u8(p) : row16(p, nbytes);
        uint8x16_t X0 = vandq_u8(k0 ? vshrq_n_u8(B, 4) : B, m3);
        uint8x16_t X1 = vandq_u8(k0 ? vshrq_n_u8(B, 6) : vshrq_n_u8(B, 2), m3);
        if (x4) X0 = vshlq_n_u8(X0, 2), X1 = vshlq_n_u8(X1, 2);
        int8x16_t Y0 = vreinterpretq_s8_u8(X0), Y1 = vreinterpretq_s8_u8(X1);
        for (int r = 0; r < RB; r++) {
            int8x16_t w = vld1q_dup_s8(&w8[r][w0 + i]);
            acc[r][0][0] = vmlal_s8(acc[r][0][0], vget_low_s8(Y0), vget_low_s8(w));
            acc[r][0][1] = vmlal_high_s8(acc[r][0][1], Y0, w);
            acc[r][1][0] = vmlal_s8(acc[r][1][0], vget_low_s8(Y1), vget_low_s8(w));
            acc[r][1][1] = vmlal_high_s8(acc[r][1][1], Y1, w);
        }
    }
}

/* Phases k0 and k0 + 1 of one chunk for RB heads with an int8 query: the
 * rows of each segment [seg[i], seg[i + 1]) (row D + k is rank k's high
 * plane) summed in int16, then widened into a32 [head][phase][byte]. The
 * segments end where the next row could take a sum past int16 (the bound
 * sum of 3 |x| over channel rows and 12 |x| over rank rows, the largest
 * head's: key_segments). */
AI void pass8(int32_t (*a32)[4][KB], const int8_t (*w8)[WX], const key_view *V, size_t rowb, int D,
              const int *seg, int nseg, int c, int nbytes, int k0, int full, int RB) {
    for (int g = 0; g < nseg; g++) {
        int16x8_t acc[RBK][2][2];
        for (int r = 0; r < RB; r++)
            for (int e = 0; e < 2; e++) acc[r][e][0] = acc[r][e][1] = vdupq_n_s16(0);
        int b = seg[g], e = seg[g + 1];
        if (b < D) /* channel rows */
            rows8(acc, w8, V->lo + (size_t)b * rowb + c, rowb, b, (e < D ? e : D) - b, k0, 0, full, nbytes, RB);
        if (e > D) { /* rank rows */
            int hb = b > D ? b : D;
            rows8(acc, w8, V->hi + (size_t)(hb - D) * rowb + c, rowb, hb, e - hb, k0, 1, full, nbytes, RB);
        }
        for (int r = 0; r < RB; r++)
            for (int h = 0; h < 2; h++) widen_into(a32[r][k0 + h], acc[r][h][0], acc[r][h][1]);
    }
}

/* One chunk of RB heads with an int8 query: both phase pairs into a32. */
AI void key_chunk8(int32_t (*a32)[4][KB], const int8_t (*w8)[WX], const key_view *V, size_t rowb, int D,
                   const int *seg, int nseg, int c, int nbytes, int RB) {
    memset(a32, 0, sizeof(int32_t) * 4 * KB * (size_t)RB);
    if (nbytes == KB) {
        pass8(a32, w8, V, rowb, D, seg, nseg, c, nbytes, 0, 1, RB);
        pass8(a32, w8, V, rowb, D, seg, nseg, c, nbytes, 2, 1, RB);
    } else {
        pass8(a32, w8, V, rowb, D, seg, nseg, c, nbytes, 0, 0, RB);
        pass8(a32, w8, V, rowb, D, seg, nseg, c, nbytes, 2, 0, RB);
    }
}

/* The int16 segments of rows [0, nrow) for key_chunk8: seg [0] = 0, then
 * each row where the running bound (3 wmax over channel rows, 12 wmax over
 * rank rows) would pass 32767, then nrow; returns their count. */
static int key_segments(int *seg, const int16_t *wmax, int D, int nrow) {
    int n = 0, budget = 0;
    seg[0] = 0;
    for (int row = 0; row < nrow; row++) {
        int step = (row >= D ? 12 : 3) * wmax[row];
        if (budget + step > 32767) seg[++n] = row, budget = 0;
        budget += step;
    }
    seg[++n] = nrow;
    return n;
}

/* One chunk of one head with a 16-bit query (pages with n_boost > D / 2):
 * codes widened to int16, multiplied into int32 sums by vmlal_n_s16; the
 * bound of wide_qmax keeps every sum exact. */
AI void key_chunk16(int32_t (*a32)[KB], const int16_t *x, const key_view *V, size_t rowb, int D, int nb, int c,
                    int nbytes) {
    int32x4_t acc[4][4];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++) acc[k][i] = vdupq_n_s32(0);
    for (int row = 0; row < D + nb; row++) {
        int high = row >= D;
        const uint8_t *p = (high ? V->hi + (size_t)(row - D) * rowb : V->lo + (size_t)row * rowb) + c;
        uint8x16_t B = row16(p, nbytes);
        int16_t w = x[row];
        for (int k = 0; k < 4; k++) {
            uint8x16_t X = vandq_u8(vshlq_u8(B, vdupq_n_s8((int8_t)(-2 * k))), vdupq_n_u8(3));
            if (high) X = vshlq_n_u8(X, 2);
            int16x8_t lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(X)));
            int16x8_t hi = vreinterpretq_s16_u16(vmovl_high_u8(X));
            acc[k][0] = vmlal_n_s16(acc[k][0], vget_low_s16(lo), w);
            acc[k][1] = vmlal_high_n_s16(acc[k][1], lo, w);
            acc[k][2] = vmlal_n_s16(acc[k][2], vget_low_s16(hi), w);
            acc[k][3] = vmlal_high_n_s16(acc[k][3], hi, w);
        }
    }
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 4; i++) vst1q_s32(a32[k] + 4 * i, acc[k][i]);
}

void kkv_neon_qk_page(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    key_view V;
    key_view_of(&V, page, D, G, nb);
    size_t rowb = (size_t)G / 4;
    int wide = 2 * nb > D; /* mostly 4-bit keys: the 16-bit query, as the AVX2 tables */
    float qmax = wide ? (float)kkv_qk_wide_qmax(D, nb) : 127.0f;
    for (int r0 = 0; r0 < n_rep; r0 += RBK) {
        int rb = n_rep - r0 < RBK ? n_rep - r0 : RBK;
        int16_t x[RBK][WX]; /* [head][D channels, nb ranks, zeros to a multiple of 8] */
        float d[RBK], cst[RBK];
        for (int r = 0; r < rb; r++)
            if (!fold_head(x[r], &d[r], &cst[r], q + (size_t)(r0 + r) * D, &V, D, nb, qmax)) {
                kkv_neon_qk_page_f32(s, q, n_rep, page, D, G, nb);
                return;
            }
        float *sr = s + (size_t)r0 * G;
        _Alignas(16) int32_t a32[RBK][4][KB]; /* [head][phase][row byte of the chunk] */
        if (wide) {
            for (size_t c = 0; c < rowb; c += KB) {
                int nbytes = rowb - c < KB ? (int)(rowb - c) : KB;
                for (int r = 0; r < rb; r++) key_chunk16(a32[r], x[r], &V, rowb, D, nb, (int)c, nbytes);
                key_scores(sr, G, a32, d, cst, (int)c, nbytes, rb);
            }
            continue;
        }
        int8_t w8[RBK][WX]; /* [head][row] */
        int16_t wmax[WX];   /* [row] the largest |x| of the rb heads */
        for (int row = 0; row < D + nb; row += 8) { /* x is zero-padded to a multiple of 8 */
            int16x8_t m = vdupq_n_s16(0);
            for (int r = 0; r < rb; r++) {
                int16x8_t v = vld1q_s16(x[r] + row);
                m = vmaxq_s16(m, vabsq_s16(v));
                vst1_s8(w8[r] + row, vmovn_s16(v)); /* |x| <= 127 */
            }
            vst1q_s16(wmax + row, m);
        }
        int seg[WX + 1]; /* [nseg + 1] row bounds */
        int nseg = key_segments(seg, wmax, D, D + nb);
        const int8_t(*w)[WX] = (const int8_t(*)[WX])w8;
        for (size_t c = 0; c < rowb; c += KB) {
            int nbytes = rowb - c < KB ? (int)(rowb - c) : KB;
            if (rb == 3) key_chunk8(a32, w, &V, rowb, D, seg, nseg, (int)c, nbytes, 3);
            else if (rb == 2) key_chunk8(a32, w, &V, rowb, D, seg, nseg, (int)c, nbytes, 2);
            else key_chunk8(a32, w, &V, rowb, D, seg, nseg, (int)c, nbytes, 1);
            key_scores(sr, G, a32, d, cst, (int)c, nbytes, rb);
        }
    }
}

/* ---------------------------------------------------------------- values */

/* 1 when every p_t * scale_t of the page is finite and >= 0 (the AVX2
 * probs_ok: not (0 <= w <= 3.4e38), NaN included, is refused). */
static int probs_ok(const float *p, int n_rep, const uint8_t *scale16, int G) {
    for (int t0 = 0; t0 < G; t0 += VBLK) {
        int n = G - t0 < VBLK ? G - t0 : VBLK;
        float sc[VBLK];
        f16_row(sc, scale16 + 2 * (size_t)t0, n);
        for (int r = 0; r < n_rep; r++)
            for (int t = 0; t < n; t++) {
                float w = p[(size_t)r * G + t0 + t] * sc[t];
                if (!(w >= 0.0f && w <= 3.4e38f)) return 0;
            }
    }
    return 1;
}

/* One head's folded uint8 probabilities over a block of n (a multiple of 4,
 * <= VBLK) tokens, attn_int_impl.h's fold_probs lane for lane: w_t = p_t
 * scale_t, e = max w / 255, wq_t = rint(w_t / e); *mt += sum p_t mn_t +
 * maxq / 2 * sum_t (w_t - e wq_t). Returns 0 when some w_t is not in
 * [0, 3.4e38]. */
static int fold_probs(uint8_t *wq, float *e, float *mt, const float *p, const float *sc, const float *mn, int n,
                      int bits) {
    float w[VBLK + 8]; /* [n rounded up to 8] */
    f8 m = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)}, amax = m, corr = m;
    int ok = 1;
    for (int t = 0; t < n; t += 8) {
        int nl = n - t < 8 ? 4 : 8;
        f8 pv = load8(p + t, nl), sv = load8(sc + t, nl), nv = load8(mn + t, nl);
        float32x4_t w0 = vmulq_f32(pv.lo, sv.lo), w1 = vmulq_f32(pv.hi, sv.hi);
        uint32x4_t good = vandq_u32(vandq_u32(vcgeq_f32(w0, vdupq_n_f32(0.0f)), vcleq_f32(w0, vdupq_n_f32(3.4e38f))),
                                    vandq_u32(vcgeq_f32(w1, vdupq_n_f32(0.0f)), vcleq_f32(w1, vdupq_n_f32(3.4e38f))));
        ok &= vminvq_u32(good) != 0;
        vst1q_f32(w + t, w0), vst1q_f32(w + t + 4, w1);
        m.lo = vfmaq_f32(m.lo, pv.lo, nv.lo), m.hi = vfmaq_f32(m.hi, pv.hi, nv.hi);
        amax.lo = vmax_x86(amax.lo, w0), amax.hi = vmax_x86(amax.hi, w1);
    }
    float am = hmax8(amax);
    float32x4_t inv = vdupq_n_f32(am > 0.0f ? 255.0f / am : 0.0f), ve = vdupq_n_f32(am / 255.0f);
    *e = am / 255.0f;
    for (int t = 0; t < n; t += 8) {
        int nl = n - t < 8 ? 4 : 8;
        float32x4_t wv[2] = {vld1q_f32(w + t), nl == 8 ? vld1q_f32(w + t + 4) : vdupq_n_f32(0.0f)};
        float32x4_t *cc[2] = {&corr.lo, &corr.hi};
        uint16_t x16[8];
        for (int h = 0; h < 2; h++) {
            int32x4_t x = vcvtnq_s32_f32(vmulq_f32(wv[h], inv)); /* 0..255 */
            *cc[h] = vaddq_f32(*cc[h], vfmsq_f32(wv[h], ve, vcvtq_f32_s32(x)));
            vst1_u16(x16 + 4 * h, vqmovun_s32(x));
        }
        for (int l = 0; l < nl; l++) wq[t + l] = (uint8_t)(x16[l] > 255 ? 255 : x16[l]);
    }
    memset(wq + n, 0, 8);
    *mt += hsum8(m) + 0.5f * (float)((1 << bits) - 1) * hsum8(corr);
    return ok;
}

/* uint32 a [16] += the uint16 lanes of lo (bytes 0-7) and hi (bytes 8-15). */
AI void widen_into_u(uint32_t *a, uint16x8_t lo, uint16x8_t hi) {
    vst1q_u32(a, vaddw_u16(vld1q_u32(a), vget_low_u16(lo)));
    vst1q_u32(a + 4, vaddw_high_u16(vld1q_u32(a + 4), lo));
    vst1q_u32(a + 8, vaddw_u16(vld1q_u32(a + 8), vget_low_u16(hi)));
    vst1q_u32(a + 12, vaddw_high_u16(vld1q_u32(a + 12), hi));
}

/* ap [RB][ldA] += e * I over one chunk of a block: row bytes c .. c + cb - 1
 * of the n token rows (stride rowb); byte i, phase k is channel per (c + i)
 * + k. Per phase pair, each token's codes times its weight (wq [RB][ldw])
 * are summed into uint16 lanes by vmlal_u8 and widened every `blk` tokens
 * (a 2-bit sum grows by at most 255 x 3, a 4-bit one by 255 x 15). */
AI void value_chunk(float *ap, int ldA, const uint8_t *wq, size_t ldw, const float *e, const uint8_t *codes,
                    size_t rowb, int n, int c, int cb, int bits, int RB) {
    int per = 8 / bits, blk = bits == 2 ? 64 : 16;
    uint8x16_t mask = vdupq_n_u8((uint8_t)((1 << bits) - 1));
    _Alignas(16) uint32_t a32[RBV][4][KB]; /* [head][phase][byte] */
    memset(a32, 0, sizeof a32);
    for (int k0 = 0; k0 < per; k0 += 2) {
        for (int t0 = 0; t0 < n; t0 += blk) {
            int t1 = n - t0 < blk ? n : t0 + blk;
            uint16x8_t acc[RBV][2][2];
            for (int r = 0; r < RB; r++)
                for (int h = 0; h < 2; h++) acc[r][h][0] = acc[r][h][1] = vdupq_n_u16(0);
            for (int t = t0; t < t1; t++) {
                uint8x16_t B = row16(codes + (size_t)t * rowb + c, cb);
                uint8x16_t X0 = vandq_u8(vshlq_u8(B, vdupq_n_s8((int8_t)(-bits * k0))), mask);
                uint8x16_t X1 = vandq_u8(vshlq_u8(B, vdupq_n_s8((int8_t)(-bits * (k0 + 1)))), mask);
                for (int r = 0; r < RB; r++) {
                    uint8x16_t w = vdupq_n_u8(wq[(size_t)r * ldw + t]);
                    acc[r][0][0] = vmlal_u8(acc[r][0][0], vget_low_u8(X0), vget_low_u8(w));
                    acc[r][0][1] = vmlal_high_u8(acc[r][0][1], X0, w);
                    acc[r][1][0] = vmlal_u8(acc[r][1][0], vget_low_u8(X1), vget_low_u8(w));
                    acc[r][1][1] = vmlal_high_u8(acc[r][1][1], X1, w);
                }
            }
            for (int r = 0; r < RB; r++)
                for (int h = 0; h < 2; h++) widen_into_u(a32[r][k0 + h], acc[r][h][0], acc[r][h][1]);
        }
    }
    for (int r = 0; r < RB; r++) {
        float *o = ap + (size_t)r * ldA + (size_t)per * c;
        float32x4_t ve = vdupq_n_f32(e[r]);
        int i = 0;
        if (per == 4)
            for (; i + 4 <= cb; i += 4) { /* channels 4i + k: vld4 / vst4 put phases back in order */
                float32x4x4_t v = vld4q_f32(o + 4 * i);
                for (int k = 0; k < 4; k++)
                    v.val[k] = vaddq_f32(v.val[k], vmulq_f32(vcvtq_f32_u32(vld1q_u32(a32[r][k] + i)), ve));
                vst4q_f32(o + 4 * i, v);
            }
        else
            for (; i + 4 <= cb; i += 4) {
                float32x4x2_t v = vld2q_f32(o + 2 * i);
                for (int k = 0; k < 2; k++)
                    v.val[k] = vaddq_f32(v.val[k], vmulq_f32(vcvtq_f32_u32(vld1q_u32(a32[r][k] + i)), ve));
                vst2q_f32(o + 2 * i, v);
            }
        for (; i < cb; i++) /* the last 1..3 bytes */
            for (int k = 0; k < per; k++) o[per * i + k] += e[r] * (float)a32[r][k][i];
    }
}

void kkv_neon_pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G, int bits) {
    if (bits != 2 && bits != 4) {
        kkv_neon_pv_page_f32(acc, p, n_rep, page, D, G, bits);
        return;
    }
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    size_t rowb = (size_t)D * (size_t)bits / 8;
    /* one head group and one block: the folds check the probabilities before
     * anything is added to acc; otherwise a pass over the page first */
    int folds_check = n_rep <= RBV && G <= VBLK;
    if (!folds_check && !probs_ok(p, n_rep, page + L.scale, G)) {
        kkv_neon_pv_page_f32(acc, p, n_rep, page, D, G, bits);
        return;
    }
    for (int r0 = 0; r0 < n_rep; r0 += RBV) {
        int rb = n_rep - r0 < RBV ? n_rep - r0 : RBV;
        float ap[RBV][KKV_MAX_HEAD_DIM]; /* [head][D] the integer part, scaled */
        float mt[RBV] = {0};             /* [head] zero points and centring */
        uint8_t wq[RBV][VBLK + 8];       /* [head][token] weights, 8 zero bytes after the block */
        memset(ap, 0, sizeof ap);
        for (int t0 = 0; t0 < G; t0 += VBLK) {
            int n = G - t0 < VBLK ? G - t0 : VBLK;
            float sc[VBLK], mn[VBLK]; /* [n] */
            f16_row(sc, page + L.scale + 2 * (size_t)t0, n);
            f16_row(mn, page + L.mn + 2 * (size_t)t0, n);
            float e[RBV];
            int ok = 1;
            for (int r = 0; r < rb; r++)
                ok &= fold_probs(wq[r], &e[r], &mt[r], p + (size_t)(r0 + r) * G + t0, sc, mn, n, bits);
            if (!ok) { /* folds_check: nothing added to acc yet */
                kkv_neon_pv_page_f32(acc, p, n_rep, page, D, G, bits);
                return;
            }
            const uint8_t *codes = page + L.codes + (size_t)t0 * rowb;
            for (size_t c = 0; c < rowb; c += KB) {
                int cb = rowb - c < KB ? (int)(rowb - c) : KB;
                if (rb == 4) value_chunk(ap[0], KKV_MAX_HEAD_DIM, wq[0], sizeof wq[0], e, codes, rowb, n, (int)c, cb, bits, 4);
                else if (rb == 3) value_chunk(ap[0], KKV_MAX_HEAD_DIM, wq[0], sizeof wq[0], e, codes, rowb, n, (int)c, cb, bits, 3);
                else if (rb == 2) value_chunk(ap[0], KKV_MAX_HEAD_DIM, wq[0], sizeof wq[0], e, codes, rowb, n, (int)c, cb, bits, 2);
                else value_chunk(ap[0], KKV_MAX_HEAD_DIM, wq[0], sizeof wq[0], e, codes, rowb, n, (int)c, cb, bits, 1);
            }
        }
        for (int r = 0; r < rb; r++) {
            float *ar = acc + (size_t)(r0 + r) * D;
            float32x4_t vm = vdupq_n_f32(mt[r]);
            for (int j = 0; j < D; j += 4)
                vst1q_f32(ar + j, vaddq_f32(vld1q_f32(ar + j), vaddq_f32(vld1q_f32(ap[r] + j), vm)));
        }
    }
}
