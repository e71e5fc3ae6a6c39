/* Integer-domain AVX2 kernels for quantized pages: the dots run on the 2/4-bit
 * codes as bytes with vpmaddubsw, never widened to floats. The page format is
 * the documented one (docs/FORMAT.md section 2); these kernels read it as it is.
 *
 * Keys (q . k). k_tj = c_tj * scale_j + mn_j, so
 *   s_t = sum_j (q_j scale_j) c_tj + sum_j q_j mn_j.
 * Per page and query head the folded query f_j = q_j * scale_j is quantized to
 * int8 (round to nearest even) with one step per channel group,
 * d_g = max_{j in g} |f_j| / 127; groups split the channels by key range
 * (scale_j * maxq_j within 4x, 16x of the page's largest, or less), so that
 * one outlier channel does not coarsen every other channel's query. The
 * constant is kept in float. Channels go in pairs: the code bytes of channels a, b for the
 * same token are interleaved (vpunpck*bw) and vpmaddubsw gives c_a f_a + c_b f_b
 * in int16 for 16 tokens at once; int16 sums are widened to int32 before they
 * can overflow (a bound from the codes' widths, fixed per page). Tokens come
 * out of a 2-bit plane in the order 4i + k (shift k), and are put back in
 * order by a 4x8 transpose when the scores are stored.
 * The integer sum is taken on the codes as stored; a per-head constant moves
 * it to codes centred on maxq/2, so the rounding error of f_j multiplies
 * c - maxq/2 rather than c:
 *   Error: |s_int - s_exact| <= sum_j d_g(j)/2 * |c_tj - maxq_j/2|  (+ float rounding).
 *
 * Values (p . v). v_tj = c_tj * scale_t + mn_t, so
 *   acc_j += sum_t (p_t scale_t) c_tj + sum_t p_t mn_t.
 * Per block of <= 128 tokens and head the folded probabilities w_t = p_t scale_t
 * (>= 0) are quantized to uint8 with one step e = max w / 255; token pairs are
 * interleaved and vpmaddubsw multiplies weights (unsigned) by codes (signed).
 *   Error (codes centred likewise):
 *     |acc_int - acc_exact| <= e/2 * sum_t |c_tj - maxq/2|  (+ float rounding).
 *
 * Both are pure functions of the page and the query / probabilities, so the
 * results stay bit-identical for any thread count. Inputs the integer path
 * cannot represent (a non-finite folded value, a negative probability) take
 * the float kernels of attn_avx2.c instead.
 *
 * Which tables use them: every table's value kernel is one of these builds;
 * the int8 key kernel is the AVX-512 VNNI table's (the AVX2 tables take the
 * 8-bit key kernel of attn_qkbyte_avx2.c, the VBMI table its own 15-bit one;
 * the AVX2 and AVX-VNNI builds of the int8 key kernel stay tested).
 *
 * VNNI. This file is the body of four kernel pairs: AVX2 (attn_int_avx2.c),
 * AVX-512 VNNI (attn_vnni_avx512.c), AVX-VNNI (attn_vnni_avxvnni.c) and AVX-512
 * VBMI + VNNI (attn_vbmi_avx512.c, KKV_INT_VBMI: 512-bit, see its section). With
 * KKV_INT_DPBUSD defined (the includer's vpdpbusd intrinsic) the code bytes
 * go in quads instead of pairs (four channels of a token, or four tokens of a
 * channel, per dword) and vpdpbusd adds u8 x s8 quads straight into int32:
 * no int16 stage, no widening, one instruction where vpmaddubsw needed an add
 * and a periodic spill. Every integer sum is exact in both variants (the
 * int16 path widens before it could overflow), so the VNNI kernels give
 * results bit-identical to the AVX2 integer ones; only speed differs. The
 * AVX2 value kernel (pv_quads) lays the codes out as the VNNI one does,
 * four tokens to a dword, and emulates vpdpbusd with vpmaddubsw into int16
 * sums widened by vpmaddwd.
 *
 * The includer defines KKV_INT_QK (and the plan names KKV_INT_QK_PLAN_BYTES,
 * KKV_INT_QK_PLAN, KKV_INT_QK_RUN) and KKV_INT_PV, the names of the kernels;
 * or KKV_INT_NO_QK for a value kernel only (the VBMI build). Include only
 * from files compiled with -mavx2 -mfma -mf16c. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attn_simd.h"
#include "kernels/avx2_util.h"
#include "core/fp16.h"
#include "quant/quant.h"

/* Query heads per pass: two int16 accumulators each, all in registers. */
#define RBI 4
/* Value tokens per quantization block (bounds the weight scratch). */
#define VBLK 128

#ifndef KKV_INT_NO_QK /* keys only */
/* A zero row: the high plane of a plain channel paired with a boosted one,
 * and both planes of the padding channel. Rows are at most 4096/4 bytes. */
static const uint8_t zrow[1024 + 32];
#endif

/* n (1..32) bytes, zero-extended to 32. */
AI __m256i ld256_part(const uint8_t *p, int n) {
    if (n >= 32) return _mm256_loadu_si256((const __m256i *)(const void *)p);
    uint8_t b[32] = {0};
    memcpy(b, p, (size_t)(n & 31));
    return _mm256_loadu_si256((const __m256i *)(const void *)b);
}
/* n (1..16) bytes, zero-extended to 16. */
AI __m128i ld128_part(const uint8_t *p, int n) {
    if (n >= 16) return _mm_loadu_si128((const __m128i *)(const void *)p);
    uint8_t b[16] = {0};
    memcpy(b, p, (size_t)(n & 15));
    return _mm_loadu_si128((const __m128i *)(const void *)b);
}

/* int16 -> int32 widening add of one accumulator into 16 int32 (two 8-lane
 * halves at dst and dst + off). */
AI void widen_add(int32_t *dst, int off, __m256i a) {
    __m256i l = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a));
    __m256i h = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a, 1));
    __m256i *d0 = (__m256i *)(void *)dst, *d1 = (__m256i *)(void *)(dst + off);
    _mm256_storeu_si256(d0, _mm256_add_epi32(_mm256_loadu_si256(d0), l));
    _mm256_storeu_si256(d1, _mm256_add_epi32(_mm256_loadu_si256(d1), h));
}

/* The same, storing instead of adding (the first sum into a slot). */
AI void widen_store(int32_t *dst, int off, __m256i a) {
    _mm256_storeu_si256((__m256i *)(void *)dst, _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a)));
    _mm256_storeu_si256((__m256i *)(void *)(dst + off), _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a, 1)));
}

#ifndef KKV_INT_NO_QK /* the VBMI build has its own key kernel (attn_qkwide_vbmi_avx512.c) */
/* ================================================================ keys */

/* Channel groups of a key page, by key range r_j = scale_j * maxq_j against
 * the page's largest R: group g holds 4^-g R < r_j <= 4^(1-g) R (the last
 * group takes the rest). Each group has its own int8 step per head, so an
 * outlier channel does not coarsen the query of every other channel. */
#define KGROUPS 3
#define KPAIRS (KKV_MAX_HEAD_DIM / 2 + 3 * KGROUPS) /* even: VNNI reads weight pairs as int32 */


/* Pairs of channels of one page, group by group; inside a group plain pairs,
 * then pairs with a high plane (a plain channel there reads the zero row as
 * its high plane), a padding channel where a group's count is odd. */
typedef struct kpairs {
    int            n;
    const uint8_t *lo[KPAIRS][2];
    const uint8_t *hi[KPAIRS][2];
    int16_t        ch[KPAIRS][2]; /* channel, -1 = padding */
    uint8_t        has_hi[KPAIRS];
    uint8_t        grp[KPAIRS];
    uint8_t        flush[KPAIRS]; /* widen int16 sums before this pair */
    uint8_t        first[KPAIRS]; /* this pair starts its group (its first widening stores) */
    int            gmask;         /* groups present, bit g */
    uint8_t        cgrp[KKV_MAX_HEAD_DIM + 1]; /* group of each channel (padding: any) */
} kpairs;

static void kpairs_of(kpairs *P, const uint8_t *page, const kkv_key_layout *L, const int32_t *cg,
                      int D, int G, int nb) {
    size_t row = (size_t)G / 4;
    const uint8_t *idx = page + L->idx;
    for (int j = 0; j < D; j++) P->cgrp[j] = (uint8_t)cg[j];
    P->cgrp[D] = 0;
    P->n = 0;
    P->gmask = 0;
    int plain[KGROUPS][KKV_MAX_HEAD_DIM], boost[KGROUPS][KKV_MAX_HEAD_DIM], np[KGROUPS] = {0},
        nbst[KGROUPS] = {0};
    for (int j = 0; j < D; j++) {
        int g = P->cgrp[j];
        if (idx[j] < nb) boost[g][nbst[g]++] = j;
        else plain[g][np[g]++] = j;
    }
    for (int g = 0; g < KGROUPS; g++) {
        if (np[g] + nbst[g] == 0) continue;
        P->gmask |= 1 << g;
        int list[KKV_MAX_HEAD_DIM + 2], nl = 0, n0 = P->n;
        for (int i = 0; i + 1 < np[g]; i += 2, P->n++) {
            for (int e = 0; e < 2; e++) {
                P->ch[P->n][e] = (int16_t)plain[g][i + e];
                P->lo[P->n][e] = page + L->lo + (size_t)plain[g][i + e] * row;
                P->hi[P->n][e] = zrow;
            }
            P->has_hi[P->n] = 0;
            P->grp[P->n] = (uint8_t)g;
        }
        if (np[g] % 2) list[nl++] = plain[g][np[g] - 1];
        for (int i = 0; i < nbst[g]; i++) list[nl++] = boost[g][i];
        if (nl % 2) list[nl++] = -1;
        for (int i = 0; i < nl; i += 2, P->n++) {
            for (int e = 0; e < 2; e++) {
                int j = list[i + e];
                P->ch[P->n][e] = (int16_t)j;
                P->lo[P->n][e] = j < 0 ? zrow : page + L->lo + (size_t)j * row;
                P->hi[P->n][e] = j >= 0 && idx[j] < nb ? page + L->hi + (size_t)idx[j] * row : zrow;
            }
            P->has_hi[P->n] = 1;
            P->grp[P->n] = (uint8_t)g;
        }
#ifdef KKV_INT_DPBUSD
        if ((P->n - n0) % 2) { /* quads: an even pair count per group, padded by a zero pair */
            P->ch[P->n][0] = P->ch[P->n][1] = -1;
            P->lo[P->n][0] = P->lo[P->n][1] = P->hi[P->n][0] = P->hi[P->n][1] = zrow;
            P->has_hi[P->n] = 0;
            P->grp[P->n] = (uint8_t)g;
            P->n++;
        }
#endif
        for (int p = n0; p < P->n; p++) P->first[p] = p == n0;
    }
#ifndef KKV_INT_DPBUSD /* int32 sums from the start: no widening schedule */
    /* |int16 sum| <= 127 * sum of the pairs' largest codes: widen before
     * 32767, and at every group change */
    int run = 0;
    for (int p = 0; p < P->n; p++) {
        int b = 0;
        for (int e = 0; e < 2; e++) {
            int j = P->ch[p][e];
            b += j < 0 ? 0 : idx[j] < nb ? 127 * 15 : 127 * 3;
        }
        P->flush[p] = p > 0 && (run + b > 32767 || P->grp[p] != P->grp[p - 1]);
        if (P->flush[p]) run = 0;
        run += b;
    }
#endif
}

/* Code bytes of one channel for tokens 4i + k of a 32-byte chunk. */
AI __m256i kcodes(__m256i lo, int k) {
    return _mm256_and_si256(_mm256_srli_epi16(lo, 2 * k), _mm256_set1_epi8(3));
}
AI __m256i kcodes_hi(__m256i lo, __m256i hi, int k) {
    __m256i h = _mm256_and_si256(_mm256_srli_epi16(hi, 2 * k), _mm256_set1_epi8(3));
    return _mm256_or_si256(kcodes(lo, k), _mm256_slli_epi16(h, 2));
}

/* Integer dots of RB heads over one chunk (nbytes row bytes, 4 * nbytes
 * tokens) and one plane shift k, added into a32: [RB][KGROUPS][4][32] int32
 * as [head][group][k][i] for token 4i + k. w: [RB][pairs] int16 weight pairs. */
AI void qk_int_plane(int32_t *a32, const int16_t *w, int ldw, const kpairs *P, size_t off,
                     int nbytes, int k, int RB) {
    __m256i acc[RBI][2];
    for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    int first = 1; /* the current group has not been widened yet */
    for (int p = 0; p < P->n; p++) {
        if (P->flush[p]) {
            int st = first; /* the group's first widening stores, later ones add */
            first = P->first[p];
            for (int r = 0; r < RB; r++) {
                int32_t *d = a32 + (((size_t)r * KGROUPS + P->grp[p - 1]) * 4 + (size_t)k) * 32;
                if (st) {
                    widen_store(d, 16, acc[r][0]);
                    widen_store(d + 8, 16, acc[r][1]);
                } else {
                    widen_add(d, 16, acc[r][0]);
                    widen_add(d + 8, 16, acc[r][1]);
                }
                acc[r][0] = acc[r][1] = _mm256_setzero_si256();
            }
        }
        __m256i x0, x1;
        if (!P->has_hi[p]) {
            x0 = kcodes(ld256_part(P->lo[p][0] + off, nbytes), k);
            x1 = kcodes(ld256_part(P->lo[p][1] + off, nbytes), k);
        } else {
            x0 = kcodes_hi(ld256_part(P->lo[p][0] + off, nbytes), ld256_part(P->hi[p][0] + off, nbytes), k);
            x1 = kcodes_hi(ld256_part(P->lo[p][1] + off, nbytes), ld256_part(P->hi[p][1] + off, nbytes), k);
        }
        /* lanes: a = tokens i 0..7 | 16..23, b = 8..15 | 24..31 */
        __m256i a = _mm256_unpacklo_epi8(x0, x1), b = _mm256_unpackhi_epi8(x0, x1);
        for (int r = 0; r < RB; r++) {
            __m256i wv = _mm256_set1_epi16(w[(size_t)r * ldw + p]);
            acc[r][0] = _mm256_add_epi16(acc[r][0], _mm256_maddubs_epi16(a, wv));
            acc[r][1] = _mm256_add_epi16(acc[r][1], _mm256_maddubs_epi16(b, wv));
        }
    }
    if (P->n == 0) return;
    for (int r = 0; r < RB; r++) {
        int32_t *d = a32 + (((size_t)r * KGROUPS + P->grp[P->n - 1]) * 4 + (size_t)k) * 32;
        if (first) {
            widen_store(d, 16, acc[r][0]);
            widen_store(d + 8, 16, acc[r][1]);
        } else {
            widen_add(d, 16, acc[r][0]);
            widen_add(d + 8, 16, acc[r][1]);
        }
    }
}

#ifdef KKV_INT_DPBUSD
/* qk_int_plane with vpdpbusd: consecutive pairs of a group make a quad of
 * channels (kpairs_of pads a group with an odd pair count with a zero pair of
 * weight 0); int32 accumulators, stored once per group. Same a32 contents as
 * qk_int_plane (exact integer sums). */
/* Code bytes of pair p for plane k: x[0], x[1] (its two channels). */
AI void pair_codes(__m256i *x, const kpairs *P, int p, size_t off, int nbytes, int k) {
    if (!P->has_hi[p]) {
        x[0] = kcodes(ld256_part(P->lo[p][0] + off, nbytes), k);
        x[1] = kcodes(ld256_part(P->lo[p][1] + off, nbytes), k);
    } else {
        x[0] = kcodes_hi(ld256_part(P->lo[p][0] + off, nbytes), ld256_part(P->hi[p][0] + off, nbytes), k);
        x[1] = kcodes_hi(ld256_part(P->lo[p][1] + off, nbytes), ld256_part(P->hi[p][1] + off, nbytes), k);
    }
}

AI void qk_vnni_plane(int32_t *a32, const int16_t *w, int ldw, const kpairs *P, size_t off,
                      int nbytes, int k, int RB) {
    __m256i acc[RBI][4];
    for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm256_setzero_si256();
    for (int p = 0; p < P->n; p += 2) { /* kpairs_of gave every group an even pair count */
        __m256i x[4];
        pair_codes(x, P, p, off, nbytes, k);
        pair_codes(x + 2, P, p + 1, off, nbytes, k);
        /* 16-bit lanes: a, c = tokens i 0..7 | 16..23, b, d = 8..15 | 24..31;
         * dwords: q0 = i 0..3 | 16..19, q1 = 4..7 | 20..23, q2 = 8..11 |
         * 24..27, q3 = 12..15 | 28..31 */
        __m256i a = _mm256_unpacklo_epi8(x[0], x[1]), b = _mm256_unpackhi_epi8(x[0], x[1]);
        __m256i c = _mm256_unpacklo_epi8(x[2], x[3]), d = _mm256_unpackhi_epi8(x[2], x[3]);
        __m256i q0 = _mm256_unpacklo_epi16(a, c), q1 = _mm256_unpackhi_epi16(a, c);
        __m256i q2 = _mm256_unpacklo_epi16(b, d), q3 = _mm256_unpackhi_epi16(b, d);
        for (int r = 0; r < RB; r++) {
            int32_t w4; /* the weight pairs of p and p + 1: four int8 */
            memcpy(&w4, w + (size_t)r * ldw + p, 4);
            __m256i wv = _mm256_set1_epi32(w4);
            acc[r][0] = KKV_INT_DPBUSD(acc[r][0], q0, wv);
            acc[r][1] = KKV_INT_DPBUSD(acc[r][1], q1, wv);
            acc[r][2] = KKV_INT_DPBUSD(acc[r][2], q2, wv);
            acc[r][3] = KKV_INT_DPBUSD(acc[r][3], q3, wv);
        }
        if (p + 2 < P->n && P->grp[p + 2] == P->grp[p]) continue;
        int g = P->grp[p]; /* the group ends here: store its sums in token order */
        for (int r = 0; r < RB; r++) {
            __m256i *dst = (__m256i *)(void *)(a32 + (((size_t)r * KGROUPS + (size_t)g) * 4 + (size_t)k) * 32);
            _mm256_storeu_si256(dst, _mm256_permute2x128_si256(acc[r][0], acc[r][1], 0x20));
            _mm256_storeu_si256(dst + 1, _mm256_permute2x128_si256(acc[r][2], acc[r][3], 0x20));
            _mm256_storeu_si256(dst + 2, _mm256_permute2x128_si256(acc[r][0], acc[r][1], 0x31));
            _mm256_storeu_si256(dst + 3, _mm256_permute2x128_si256(acc[r][2], acc[r][3], 0x31));
            acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm256_setzero_si256();
        }
    }
}
#define QK_PLANE qk_vnni_plane
#else
#define QK_PLANE qk_int_plane
#endif

/* s[t] = sum_g d[g] * a32[g] + cst for the ntok (<= 128) tokens of a chunk.
 * a32: [KGROUPS][4][32] as [group][k][i] for token 4i + k; d: [KGROUPS]. */
AI void qk_int_store(float *s, const int32_t *a32, const float *d, float cst, int gmask, int ntok) {
    __m256 vc = _mm256_set1_ps(cst);
    float tmp[128];
    float *o = ntok == 128 ? s : tmp;
    for (int ib = 0; ib < 4; ib++) {
        __m256 v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = vc;
            for (int g = 0; g < KGROUPS; g++)
                if (gmask >> g & 1) v[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(const void *)(a32 + (g * 4 + k) * 32 + ib * 8))),
                                       _mm256_set1_ps(d[g]), v[k]);
        }
        __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
        __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
        __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        float *ob = o + ib * 32; /* tokens 4i + k for i in 8ib .. 8ib + 7 */
        _mm256_storeu_ps(ob, _mm256_permute2f128_ps(u0, u1, 0x20));
        _mm256_storeu_ps(ob + 8, _mm256_permute2f128_ps(u2, u3, 0x20));
        _mm256_storeu_ps(ob + 16, _mm256_permute2f128_ps(u0, u1, 0x31));
        _mm256_storeu_ps(ob + 24, _mm256_permute2f128_ps(u2, u3, 0x31));
    }
    if (o == tmp) memcpy(s, tmp, (size_t)ntok * sizeof(float));
}

AI void qk_int_rb(float *s, const int16_t *w, int ldw, const float *d, const float *cst,
                  const kpairs *P, int G, int RB) {
    int rowb = G / 4;
    for (int c = 0; c < rowb; c += 32) {
        int nbytes = rowb - c < 32 ? rowb - c : 32;
        int32_t a32[RBI * KGROUPS * 4 * 32]; /* [RB][group][k][i], groups of P->gmask written */
        for (int k = 0; k < 4; k++) QK_PLANE(a32, w, ldw, P, (size_t)c, nbytes, k, RB);
        for (int r = 0; r < RB; r++)
            qk_int_store(s + (size_t)r * G + 4 * c, a32 + (size_t)r * KGROUPS * 128, d + r * KGROUPS, cst[r], P->gmask, 4 * nbytes);
    }
}



/* Largest code mq and channel group cg32 of every channel of a key page
 * ([D], written 8 at a time: D + 4 entries are touched). Groups by key range
 * r_j = scale_j * mq_j: 0 within 4x of the largest range, 1 within 16x, 2
 * the rest. */
AI void key_groups(float *mq, int32_t *cg32, const float *scale, const uint8_t *idx, int D, int nb) {
    float range[KKV_MAX_HEAD_DIM + 8];
    __m256 rm = _mm256_setzero_ps();
    for (int j = 0; j < D; j += 8) {
        __m256i m = lanes(D - j < 8 ? 4 : 8);
        uint64_t ib = 0;
        memcpy(&ib, idx + j, D - j < 8 ? 4 : 8);
        __m256i iv = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ib));
        __m256 boosted = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nb), iv));
        __m256 mv = _mm256_blendv_ps(_mm256_set1_ps(3.0f), _mm256_set1_ps(15.0f), boosted);
        __m256 rv = _mm256_and_ps(_mm256_mul_ps(_mm256_maskload_ps(scale + j, m), mv), _mm256_castsi256_ps(m));
        _mm256_storeu_ps(mq + j, mv);
        _mm256_storeu_ps(range + j, rv);
        rm = _mm256_max_ps(rm, rv);
    }
    float rmax = hmax(rm);
    __m256 t1 = _mm256_set1_ps(rmax * 0.25f), t2 = _mm256_set1_ps(rmax * 0.0625f);
    for (int j = 0; j < D; j += 8) {
        __m256 rv = _mm256_loadu_ps(range + j);
        __m256i g1 = _mm256_castps_si256(_mm256_cmp_ps(rv, t1, _CMP_LE_OQ));
        __m256i g2 = _mm256_castps_si256(_mm256_cmp_ps(rv, t2, _CMP_LE_OQ));
        _mm256_storeu_si256((__m256i *)(void *)(cg32 + j), _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_add_epi32(g1, g2)));
    }
}

/* A key page's plan: what the kernel derives from the page bytes besides the
 * codes, kept so a caller can compute it once per page and keep it beside
 * the page (it is never part of the page format: it is derivable). Bytes:
 *   [0] pairs n, [1] group mask, [2, 2 + 2n) the pairs' channels,
 *   [2 + 2n, 2 + 3n) pair flags (PL_*), then [D] channel groups.
 * Position-independent (channel numbers, not addresses): a plan serves the
 * page's bytes wherever they lie. */
enum { PL_HI = 1, PL_GRP = 2 /* 2 bits */, PL_FLUSH = 8, PL_FIRST = 16, PL_PAD0 = 32, PL_PAD1 = 64 };
/* What scoring a key page needs from the page alone: its channel groups
 * (mq, cg32 [D]) and its pair list P. */
static inline void key_page_setup(kpairs *P, float *mq, int32_t *cg32, const uint8_t *page,
                                  const kkv_key_layout *L, int D, int G, int nb) {
    float scale[KKV_MAX_HEAD_DIM + 8] = {0}; /* [D]; zeroed for gcc's -Wmaybe-uninitialized */
    f16_row(scale, page + L->scale, D);
    key_groups(mq, cg32, scale, page + L->idx, D, nb);
    kpairs_of(P, page, L, cg32, D, G, nb);
}

#define QK_PLAN_BYTES(D) (2 + 3 * ((D) / 2 + 3 * KGROUPS + 1) + (D))

static void kqk_plan_of(uint8_t *plan, const uint8_t *page, int D, int G, int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    float mq[KKV_MAX_HEAD_DIM + 8];
    int32_t cg32[KKV_MAX_HEAD_DIM + 8];
    kpairs P;
    key_page_setup(&P, mq, cg32, page, &L, D, G, nb);
    uint8_t *ch = plan + 2, *fl = ch + 2 * P.n, *cg = fl + P.n;
    plan[0] = (uint8_t)P.n;
    plan[1] = (uint8_t)P.gmask;
    for (int p = 0; p < P.n; p++) {
#ifdef KKV_INT_DPBUSD
        P.flush[p] = 0; /* no widening schedule: kpairs_of leaves it unset */
#endif
        ch[2 * p] = (uint8_t)(P.ch[p][0] < 0 ? 0 : P.ch[p][0]);
        ch[2 * p + 1] = (uint8_t)(P.ch[p][1] < 0 ? 0 : P.ch[p][1]);
        fl[p] = (uint8_t)(P.has_hi[p] * PL_HI | P.grp[p] * PL_GRP | P.flush[p] * PL_FLUSH | P.first[p] * PL_FIRST |
                          (P.ch[p][0] < 0) * PL_PAD0 | (P.ch[p][1] < 0) * PL_PAD1);
    }
    for (int j = 0; j < D; j++) cg[j] = (uint8_t)cg32[j];
}

/* The pair list, largest codes and groups of a page from its plan: the
 * same values kpairs_of() and key_groups() give. */
static void kpairs_bind(kpairs *P, float *mq, int32_t *cg32, const uint8_t *plan,
                        const uint8_t *page, const kkv_key_layout *L, int D, int G, int nb) {
    size_t row = (size_t)G / 4;
    const uint8_t *idx = page + L->idx;
    int n = plan[0];
    const uint8_t *ch = plan + 2, *fl = ch + 2 * n, *cg = fl + n;
    P->n = n;
    P->gmask = plan[1];
    for (int p = 0; p < n; p++) {
        int f = fl[p];
        for (int e = 0; e < 2; e++) {
            int j = ch[2 * p + e], pad = f >> (5 + e) & 1;
            P->ch[p][e] = (int16_t)(pad ? -1 : j);
            P->lo[p][e] = pad ? zrow : page + L->lo + (size_t)j * row;
            P->hi[p][e] = !pad && (f & PL_HI) && idx[j] < nb ? page + L->hi + (size_t)idx[j] * row : zrow;
        }
        P->has_hi[p] = (uint8_t)(f & PL_HI);
        P->grp[p] = (uint8_t)(f >> 1 & 3);
        P->flush[p] = (uint8_t)(f >> 3 & 1);
        P->first[p] = (uint8_t)(f >> 4 & 1);
    }
    for (int j = 0; j < D; j += 8) {
        __m256i m = lanes(D - j < 8 ? 4 : 8);
        uint64_t ib = 0, gb = 0;
        memcpy(&ib, idx + j, D - j < 8 ? 4 : 8);
        memcpy(&gb, cg + j, D - j < 8 ? 4 : 8);
        __m256i iv = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ib));
        __m256 boosted = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nb), iv));
        _mm256_storeu_ps(mq + j, _mm256_blendv_ps(_mm256_set1_ps(3.0f), _mm256_set1_ps(15.0f), boosted));
        _mm256_storeu_si256((__m256i *)(void *)(cg32 + j), _mm256_and_si256(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)gb)), m));
    }
}

/* The int8 step d[g] of each channel group from its largest |folded query|
 * gm[g], and its inverse (0 for an empty or all-zero group). One place for
 * both fold_queries builds, which must give the same bits. */
static inline void group_steps(float *d, float *ginv, const float *gm) {
    for (int g = 0; g < KGROUPS; g++) {
        d[g] = gm[g] / 127.0f;
        ginv[g] = gm[g] > 0.0f ? 127.0f / gm[g] : 0.0f;
    }
}

/* fold_query for RB heads in one pass over the channels (the page's scale,
 * zero points, groups loaded once): per head the same lane operations in the
 * same order, so the same bits. qi: [RB][KKV_MAX_HEAD_DIM + 8]; d:
 * [RB][KGROUPS]; cst: [RB]. Returns 0 when some f_j of some head is not
 * finite, or a group's largest |f_j| is below 1e-30 but not 0. */
static int fold_queries(int32_t (*qi)[KKV_MAX_HEAD_DIM + 8], float *d, float *cst, const float *q,
                        int RB, const float *scale, const float *mn, const float *mq,
                        const int32_t *cg32, int gmask, int D) {
    float f[RBI][KKV_MAX_HEAD_DIM + 8], fa[RBI][KKV_MAX_HEAD_DIM + 8]; /* [RB][D] folded query, |.| */
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 c[RBI], bad = _mm256_setzero_ps();
    for (int r = 0; r < RB; r++) c[r] = _mm256_setzero_ps();
    for (int j = 0; j < D; j += 8) {
        __m256i m = lanes(D - j < 8 ? 4 : 8);
        __m256 sv = _mm256_maskload_ps(scale + j, m), nv = _mm256_maskload_ps(mn + j, m);
        for (int r = 0; r < RB; r++) {
            __m256 qv = _mm256_maskload_ps(q + (size_t)r * D + j, m);
            __m256 fv = _mm256_mul_ps(qv, sv);
            _mm256_storeu_ps(f[r] + j, fv);
            _mm256_storeu_ps(fa[r] + j, _mm256_and_ps(fv, absm));
            c[r] = _mm256_fmadd_ps(qv, nv, c[r]);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(fv, fv), _mm256_setzero_ps(), _CMP_NEQ_UQ));
        }
    }
    if (_mm256_movemask_ps(bad)) return 0; /* inf or NaN */
    __m256 mx[RBI][KGROUPS];
    for (int r = 0; r < RB; r++)
        for (int g = 0; g < KGROUPS; g++) mx[r][g] = _mm256_setzero_ps();
    for (int j = 0; j < D; j += 8) { /* max is exact: any order gives the same bits */
        __m256i m = lanes(D - j < 8 ? 4 : 8);
        __m256i cv = _mm256_maskload_epi32(cg32 + j, m);
        __m256 in[KGROUPS];
        for (int g = 0; g < KGROUPS; g++)
            in[g] = _mm256_castsi256_ps(_mm256_and_si256(_mm256_cmpeq_epi32(cv, _mm256_set1_epi32(g)), m));
        for (int r = 0; r < RB; r++) {
            __m256 av = _mm256_maskload_ps(fa[r] + j, m);
            for (int g = 0; g < KGROUPS; g++) mx[r][g] = _mm256_max_ps(mx[r][g], _mm256_and_ps(av, in[g]));
        }
    }
    __m256 tinv[RBI], td[RBI];
    for (int r = 0; r < RB; r++) {
        float gm[KGROUPS] = {0}, ginv[KGROUPS], *dr = d + r * KGROUPS;
        for (int g = 0; g < KGROUPS; g++) {
            if (gmask >> g & 1) gm[g] = hmax(mx[r][g]);
            if (fold_too_small(gm[g])) return 0; /* the float kernel takes the page */
        }
        group_steps(dr, ginv, gm);
        tinv[r] = _mm256_setr_ps(ginv[0], ginv[1], ginv[2], 0, 0, 0, 0, 0);
        td[r] = _mm256_setr_ps(dr[0], dr[1], dr[2], 0, 0, 0, 0, 0);
    }
    __m256 corr[RBI];
    for (int r = 0; r < RB; r++) corr[r] = _mm256_setzero_ps();
    for (int j = 0; j < D; j += 8) {
        __m256i m = lanes(D - j < 8 ? 4 : 8);
        __m256i gv = _mm256_loadu_si256((const __m256i *)(const void *)(cg32 + j));
        __m256 mqv = _mm256_maskload_ps(mq + j, m), mf = _mm256_castsi256_ps(m);
        for (int r = 0; r < RB; r++) {
            __m256 fv = _mm256_maskload_ps(f[r] + j, m);
            __m256 gi = _mm256_and_ps(_mm256_permutevar8x32_ps(tinv[r], gv), mf);
            __m256 gd = _mm256_and_ps(_mm256_permutevar8x32_ps(td[r], gv), mf);
            __m256i x = _mm256_cvtps_epi32(_mm256_mul_ps(fv, gi)); /* |x| <= 127 */
            _mm256_storeu_si256((__m256i *)(void *)(qi[r] + j), x);
            __m256 err = _mm256_fnmadd_ps(gd, _mm256_cvtepi32_ps(x), fv);
            corr[r] = _mm256_fmadd_ps(err, mqv, corr[r]);
        }
    }
    for (int r = 0; r < RB; r++) cst[r] = hsum(c[r]) + 0.5f * hsum(corr[r]);
    return 1;
}


/* Scores of n_rep heads over a key page, given its pair list P, largest
 * codes mq and groups cg32 (from the page, or from its plan). */
static void qk_scores(float *s, const float *q, int n_rep, const uint8_t *page, const kpairs *P,
                      const float *mq, const int32_t *cg32, int D, int G, int nb) {
    float scale[KKV_MAX_HEAD_DIM + 8], mn[KKV_MAX_HEAD_DIM + 8]; /* [D] */
    key_page_f32(scale, mn, page, D, G, nb);
    for (int r0 = 0; r0 < n_rep; r0 += RBI) {
        int rb = n_rep - r0 < RBI ? n_rep - r0 : RBI;
        int16_t w[RBI][KPAIRS]; /* [RB][pair] (qi_a, qi_b) bytes */
        float d[RBI * KGROUPS], cst[RBI];
        int32_t qi[RBI][KKV_MAX_HEAD_DIM + 8];
        if (!fold_queries(qi, d, cst, q + (size_t)r0 * D, rb, scale, mn, mq, cg32, P->gmask, D)) {
            kkv_avx2_qk_page(s, q, n_rep, page, D, G, nb);
            return;
        }
        for (int r = 0; r < rb; r++) {
            qi[r][D] = 0; /* padding channel */
            for (int p = 0; p < P->n; p++) {
                int a = P->ch[p][0] < 0 ? D : P->ch[p][0], b = P->ch[p][1] < 0 ? D : P->ch[p][1];
                w[r][p] = (int16_t)(uint16_t)((uint8_t)(int8_t)qi[r][a] | (unsigned)(uint8_t)(int8_t)qi[r][b] << 8);
            }
        }
        float *sr = s + (size_t)r0 * G;
        const int ldw = KPAIRS;
        if (rb == 4) qk_int_rb(sr, w[0], ldw, d, cst, P, G, 4);
        else if (rb == 3) qk_int_rb(sr, w[0], ldw, d, cst, P, G, 3);
        else if (rb == 2) qk_int_rb(sr, w[0], ldw, d, cst, P, G, 2);
        else qk_int_rb(sr, w[0], ldw, d, cst, P, G, 1);
    }
}

size_t KKV_INT_QK_PLAN_BYTES(int D) { return QK_PLAN_BYTES(D); }

void KKV_INT_QK_PLAN(uint8_t *plan, const uint8_t *page, int D, int G, int nb) {
    kqk_plan_of(plan, page, D, G, nb);
}

void KKV_INT_QK_RUN(float *s, const float *q, int n_rep, const uint8_t *page, const uint8_t *plan,
                    int D, int G, int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    float mq[KKV_MAX_HEAD_DIM + 8];
    int32_t cg32[KKV_MAX_HEAD_DIM + 8];
    kpairs P;
    kpairs_bind(&P, mq, cg32, plan, page, &L, D, G, nb);
    qk_scores(s, q, n_rep, page, &P, mq, cg32, D, G, nb);
}

void KKV_INT_QK(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    float mq[KKV_MAX_HEAD_DIM + 8];
    int32_t cg32[KKV_MAX_HEAD_DIM + 8];
    kpairs P;
    key_page_setup(&P, mq, cg32, page, &L, D, G, nb);
    qk_scores(s, q, n_rep, page, &P, mq, cg32, D, G, nb);
}
#endif /* KKV_INT_NO_QK */

/* ================================================================ values */

#ifdef KKV_INT_VBMI
/* vpermb indices of a token quad: output byte 4i + r is row r's byte i
 * (four 16-byte rows). */
#define TX4(i) (i), 16 + (i), 32 + (i), 48 + (i)
static const uint8_t tok_ix[64] = {TX4(0), TX4(1), TX4(2),  TX4(3),  TX4(4),  TX4(5),  TX4(6),  TX4(7),
                                   TX4(8), TX4(9), TX4(10), TX4(11), TX4(12), TX4(13), TX4(14), TX4(15)};
#endif

#ifdef KKV_INT_DPBUSD
/* Integer sums of RB heads for one plane shift k of a 16-byte column chunk
 * (cb bytes present) with vpdpbusd: four tokens of a channel per dword,
 * tokens t..t+3 in the low lane and t+4..t+7 in the high one (zero weights
 * past n); the lanes are summed at the end. wq: [RB][n + 8] weight bytes
 * (ldwv apart). Writes a32 [RB][per][16] at plane k: [head][k][i], the
 * exact sum over the n tokens of w_t times the code of byte i at shift k. */
AI void pv_vnni_plane(int32_t *a32, int per, const uint8_t *wq, size_t ldwv, const uint8_t *codes,
                      size_t rowb, int n, int cb, int bits, int k, int RB) {
    const __m256i mask = _mm256_set1_epi8((char)((1 << bits) - 1));
    const __m256i bcast = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m128i shift = _mm_cvtsi32_si128(bits * k);
    __m256i acc[RBI][4];
    for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm256_setzero_si256();
    for (int t = 0; t < n; t += 8) {
        const uint8_t *row = codes + (size_t)t * rowb;
        __m256i R[4];
        for (int i = 0; i < 4; i++) {
            __m128i lo = ld128_part(row + (size_t)i * rowb, cb);
            __m128i hi = t + 4 < n ? ld128_part(row + (size_t)(4 + i) * rowb, cb) : _mm_setzero_si128();
            R[i] = _mm256_and_si256(_mm256_srl_epi16(_mm256_set_m128i(hi, lo), shift), mask);
        }
        /* dwords: channel bytes i 0..3, 4..7, 8..11, 12..15, tokens in order */
        __m256i a = _mm256_unpacklo_epi8(R[0], R[1]), b = _mm256_unpackhi_epi8(R[0], R[1]);
        __m256i c = _mm256_unpacklo_epi8(R[2], R[3]), d = _mm256_unpackhi_epi8(R[2], R[3]);
        __m256i qv[4] = {_mm256_unpacklo_epi16(a, c), _mm256_unpackhi_epi16(a, c),
                         _mm256_unpacklo_epi16(b, d), _mm256_unpackhi_epi16(b, d)};
        for (int r = 0; r < RB; r++) {
            __m256i w8 = _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(const void *)(wq + (size_t)r * ldwv + (size_t)t)));
            __m256i wv = _mm256_permutevar8x32_epi32(w8, bcast);
            for (int i = 0; i < 4; i++) acc[r][i] = KKV_INT_DPBUSD(acc[r][i], wv, qv[i]);
        }
    }
    for (int r = 0; r < RB; r++) {
        int32_t *dst = a32 + ((size_t)r * per + (size_t)k) * 16;
        for (int i = 0; i < 4; i++)
            _mm_storeu_si128((__m128i *)(void *)(dst + 4 * i),
                             _mm_add_epi32(_mm256_castsi256_si128(acc[r][i]), _mm256_extracti128_si256(acc[r][i], 1)));
    }
}
#endif

/* ap[r][ch] += e[r] * I for the channels of one column chunk: byte i, plane k
 * is channel base + per * i + k. a32: [RB][per][16]. */
AI void pv_int_store(float *ap, int ldA, const int32_t *a32, const float *e, int base, int per,
                     int nch, int RB) {
    for (int r = 0; r < RB; r++) {
        const int32_t *s = a32 + (size_t)r * per * 16;
        float *o = ap + (size_t)r * ldA + base;
        if (per == 4 && nch == 64) { /* 4x16 transpose, as in qk_int_store */
            __m256 vd = _mm256_set1_ps(e[r]);
            for (int ib = 0; ib < 2; ib++) {
                __m256 v[4];
                for (int k = 0; k < 4; k++)
                    v[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(const void *)(s + k * 16 + ib * 8))), vd);
                __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
                __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
                __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
                __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
                float *ob = o + ib * 32;
                __m256 o0 = _mm256_permute2f128_ps(u0, u1, 0x20), o1 = _mm256_permute2f128_ps(u2, u3, 0x20);
                __m256 o2 = _mm256_permute2f128_ps(u0, u1, 0x31), o3 = _mm256_permute2f128_ps(u2, u3, 0x31);
                _mm256_storeu_ps(ob, _mm256_add_ps(_mm256_loadu_ps(ob), o0));
                _mm256_storeu_ps(ob + 8, _mm256_add_ps(_mm256_loadu_ps(ob + 8), o1));
                _mm256_storeu_ps(ob + 16, _mm256_add_ps(_mm256_loadu_ps(ob + 16), o2));
                _mm256_storeu_ps(ob + 24, _mm256_add_ps(_mm256_loadu_ps(ob + 24), o3));
            }
        } else {
            for (int c = 0; c < nch; c++) o[c] += e[r] * (float)s[(c % per) * 16 + c / per];
        }
    }
}

#ifdef KKV_INT_DPBUSD
AI void pv_int_rb(float *ap, int ldA, const uint8_t *wv, size_t ldwv, const float *e,
                  const uint8_t *codes, int n, int D, int bits, int RB) {
    int per = 8 / bits;
    size_t rowb = (size_t)D * (size_t)bits / 8;
    for (int c = 0; c < (int)rowb; c += 16) {
        int cb = (int)rowb - c < 16 ? (int)rowb - c : 16;
        int32_t a32[RBI * 4 * 16]; /* [RB][k][i] */
        memset(a32, 0, sizeof a32);
        for (int k = 0; k < per; k++)
            pv_vnni_plane(a32, per, wv, ldwv, codes + c, rowb, n, cb, bits, k, RB);
        pv_int_store(ap, ldA, a32, e, c * per, per, cb * per, RB);
    }
}
#else
/* The same sums on AVX2 without VNNI. Per 16-byte column chunk the rows
 * are transposed once into dwords of four tokens of one code byte (t..t+3
 * in the low lane, t+4..t+7 in the high one), T [groups of 8 tokens][4];
 * then for each quarter v of the chunk (code bytes 4v..4v+3) and two plane
 * shifts at a time, vpmaddubsw multiplies the uint8 weights of four tokens by
 * their codes into int16 sums of two tokens, added in int16 while they
 * cannot overflow (gflush groups) and widened by vpmaddwd with ones. Same
 * exact integer sums as the VNNI kernels, so the same a32 and output bits.
 * Registers: 2 shifts x RB heads accumulators, the weights of RB heads and
 * three code vectors, 12 for 3 heads. The former AVX2 kernel (int16 pairs of
 * tokens per plane, reloading and re-interleaving the rows for every plane
 * and widening through the stack) took ~0.70-0.75 us per page hot on a Zen 3
 * (D 64, 3 heads); this one ~0.41. */
AI void pv_quads(float *ap, int ldA, const uint8_t *wq, size_t ldwv, const float *e,
                 const uint8_t *codes, int n, int D, int bits, int RB) {
    const int per = 8 / bits, ng = (n + 7) / 8;
    const size_t rowb = (size_t)D * (size_t)bits / 8;
    const __m256i mask = _mm256_set1_epi8((char)((1 << bits) - 1)), ones = _mm256_set1_epi16(1);
    /* |int16 lane| grows by <= 2 * 255 * maxq per group of 8 tokens */
    const int gflush = 32767 / (2 * 255 * ((1 << bits) - 1));
    __m256i W[RBI][VBLK / 8]; /* [head][group]: w_t..w_t+3 in every low dword, w_t+4..w_t+7 high */
    const __m256i bcast = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    for (int r = 0; r < RB; r++)
        for (int g = 0; g < ng; g++) /* wq has 8 zero bytes past n */
            W[r][g] = _mm256_permutevar8x32_epi32(
                _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(const void *)(wq + (size_t)r * ldwv + 8 * (size_t)g))), bcast);
    for (size_t c = 0; c < rowb; c += 16) {
        int cb = rowb - c < 16 ? (int)(rowb - c) : 16;
        __m256i T[VBLK / 8][4]; /* [group][v]: dword i = code byte 4v + i of 4 tokens */
        for (int g = 0; g < ng; g++) {
            const uint8_t *row = codes + (size_t)(8 * g) * rowb + c;
            __m256i R[4];
            for (int i = 0; i < 4; i++) {
                __m128i lo = ld128_part(row + (size_t)i * rowb, cb);
                __m128i hi = 8 * g + 4 < n ? ld128_part(row + (size_t)(4 + i) * rowb, cb) : _mm_setzero_si128();
                R[i] = _mm256_set_m128i(hi, lo);
            }
            __m256i a = _mm256_unpacklo_epi8(R[0], R[1]), b = _mm256_unpackhi_epi8(R[0], R[1]);
            __m256i cc = _mm256_unpacklo_epi8(R[2], R[3]), d = _mm256_unpackhi_epi8(R[2], R[3]);
            T[g][0] = _mm256_unpacklo_epi16(a, cc);
            T[g][1] = _mm256_unpackhi_epi16(a, cc);
            T[g][2] = _mm256_unpacklo_epi16(b, d);
            T[g][3] = _mm256_unpackhi_epi16(b, d);
        }
        int32_t a32[RBI * 4 * 16]; /* [RB][k][i]; bytes i >= cb are never read */
        for (int v = 0; v < 4 && 4 * v < cb; v++)
            for (int k0 = 0; k0 < per; k0 += 2) {
                __m256i s16[RBI][2], s32[RBI][2];
                for (int r = 0; r < RB; r++)
                    s16[r][0] = s16[r][1] = s32[r][0] = s32[r][1] = _mm256_setzero_si256();
                for (int g = 0; g < ng; g++) {
                    __m256i X = T[g][v];
                    __m256i x0 = _mm256_and_si256(k0 ? _mm256_srli_epi16(X, bits * k0) : X, mask);
                    __m256i x1 = _mm256_and_si256(_mm256_srli_epi16(X, bits * (k0 + 1)), mask);
                    for (int r = 0; r < RB; r++) {
                        add16_into(&s16[r][0], _mm256_maddubs_epi16(W[r][g], x0));
                        add16_into(&s16[r][1], _mm256_maddubs_epi16(W[r][g], x1));
                    }
                    if ((g + 1) % gflush == 0 && g + 1 < ng)
                        for (int r = 0; r < RB; r++)
                            for (int h = 0; h < 2; h++) {
                                s32[r][h] = _mm256_add_epi32(s32[r][h], _mm256_madd_epi16(s16[r][h], ones));
                                s16[r][h] = _mm256_setzero_si256();
                            }
                }
                for (int r = 0; r < RB; r++)
                    for (int h = 0; h < 2; h++) {
                        __m256i t = _mm256_add_epi32(s32[r][h], _mm256_madd_epi16(s16[r][h], ones));
                        __m128i q = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
                        _mm_storeu_si128((__m128i *)(void *)(a32 + ((size_t)r * per + (size_t)(k0 + h)) * 16 + 4 * v), q);
                    }
            }
        pv_int_store(ap, ldA, a32, e, (int)c * per, per, cb * per, RB);
    }
}
#endif

#ifdef KKV_INT_VBMI
/* Plane k of 2-bit code quads Q, times s_k: planes 1 and 2 are masked in
 * place (Q & 12: s_1 = 4; Q & 48: s_2 = 16) and plane 3 shifted by 4, not 6
 * ((Q >> 4) & 12: s_3 = 4), so only one of the four needs a shift. Each byte
 * stays <= 48, a valid signed vpdpbusd operand, and the int32 sums are s_k
 * times the plane's, shifted back exactly at the end: the same a32. */
AI __m512i plane2_scaled(__m512i Q, int k) {
    static const char m[4] = {3, 12, 48, 12};
    return _mm512_and_si512(k == 3 ? _mm512_srli_epi32(Q, 4) : Q, _mm512_set1_epi8(m[k]));
}

/* pv_int_rb with AVX-512 VBMI + VNNI: four token rows of a 16-byte column
 * chunk (one 64-byte load when a row is 16 bytes) are transposed by one vpermb
 * into dwords of four tokens per code byte; each plane k is (quad >> bits k)
 * & mask (2-bit planes: plane2_scaled), and one 512-bit vpdpbusd per plane and
 * head adds four tokens of 16 channels. Rows are loaded and moved once for all
 * planes. Same exact sums as pv_vnni_plane, so the same a32 and the same
 * output bits. */
AI void pv_vbmi_chunks(float *ap, int ldA, const uint8_t *wq, size_t ldwv, const float *e,
                       const uint8_t *codes, int n, int D, int bits, int per, int RB) {
    size_t rowb = (size_t)D * (size_t)bits / 8;
    const __m512i ixt = _mm512_loadu_si512(tok_ix), mask = _mm512_set1_epi8((char)((1 << bits) - 1));
    for (size_t c = 0; c < rowb; c += 16) {
        int cb = (int)(rowb - c < 16 ? rowb - c : 16);
        __mmask16 m = (__mmask16)(cb == 16 ? 0xFFFFu : (1u << cb) - 1);
        __m512i acc[RBI][4];
        for (int r = 0; r < RB; r++)
            for (int k = 0; k < per; k++) acc[r][k] = _mm512_setzero_si512();
        for (int t = 0; t < n; t += 4) {
            const uint8_t *row = codes + (size_t)t * rowb + c;
            __m512i z;
            if (rowb == 16) z = _mm512_loadu_si512(row);
            else {
                z = _mm512_castsi128_si512(_mm_maskz_loadu_epi8(m, row));
                z = _mm512_inserti32x4(z, _mm_maskz_loadu_epi8(m, row + rowb), 1);
                z = _mm512_inserti32x4(z, _mm_maskz_loadu_epi8(m, row + 2 * rowb), 2);
                z = _mm512_inserti32x4(z, _mm_maskz_loadu_epi8(m, row + 3 * rowb), 3);
            }
            __m512i Q = _mm512_permutexvar_epi8(ixt, z);
            __m512i wv[RBI];
            for (int r = 0; r < RB; r++) {
                int32_t x;
                memcpy(&x, wq + (size_t)r * ldwv + (size_t)t, 4);
                wv[r] = _mm512_set1_epi32(x);
            }
            for (int k = 0; k < per; k++) {
                __m512i x = bits == 2 ? plane2_scaled(Q, k) : _mm512_and_si512(k ? _mm512_srli_epi32(Q, bits * k) : Q, mask);
                for (int r = 0; r < RB; r++) dp512_into(&acc[r][k], wv[r], x);
            }
        }
        int32_t a32[RBI * 4 * 16]; /* [RB][k][i] */
        for (int r = 0; r < RB; r++)
            for (int k = 0; k < per; k++) {
                __m512i a = acc[r][k];
                if (bits == 2 && k) a = _mm512_srai_epi32(a, k == 2 ? 4 : 2); /* exact: a multiple of s_k */
                _mm512_storeu_si512(a32 + ((size_t)r * per + (size_t)k) * 16, a);
            }
        pv_int_store(ap, ldA, a32, e, (int)c * per, per, cb * per, RB);
    }
}

AI void pv_vbmi_rb(float *ap, int ldA, const uint8_t *wq, size_t ldwv, const float *e,
                   const uint8_t *codes, int n, int D, int bits, int RB) {
    if (bits == 2) pv_vbmi_chunks(ap, ldA, wq, ldwv, e, codes, n, D, 2, 4, RB);
    else pv_vbmi_chunks(ap, ldA, wq, ldwv, e, codes, n, D, 4, 2, RB);
}
#define PV_RB pv_vbmi_rb
#elif defined(KKV_INT_DPBUSD)
#define PV_RB pv_int_rb
#else
#define PV_RB pv_quads
#endif

#ifndef KKV_INT_VBMI /* the VBMI build has fold_probs_512 */
/* Folded uint8 probabilities of RB heads over a block of n (<= VBLK, a
 * multiple of 4) tokens: w_t = p_t * scale_t, step e = max w / 255,
 * wq = rne(w / e); mt += sum p_t mn_t + maxq/2 * sum_t (w_t - e wq_t) (the
 * centring). p: [RB][ldp]; wq: [RB][ldw] rows of the n weight bytes, then 8
 * zero bytes; e, mt: [RB]. The heads go in lockstep, so the page's scales
 * and zero points are loaded once and the heads' dependency chains overlap;
 * each head's lane operations and sums are in the same order as one head
 * alone. Returns 0 when some w_t is not in [0, 3.4e38] (NaN included):
 * probs_ok's test, on the same products. Always inlined, so that the
 * engines' constant shapes reach its loops (pv_page -1.5 to -2% on a Zen 3
 * against a static function). */
AI int fold_probs(uint8_t *wq, size_t ldw, float *e, float *mt, const float *p, size_t ldp,
                  const float *sc, const float *mn, int n, int bits, int RB) {
    float w[RBI][VBLK + 8];
    __m256 m[RBI], amax[RBI], corr[RBI], inv[RBI], ve[RBI], bad = _mm256_setzero_ps();
    for (int r = 0; r < RB; r++) m[r] = amax[r] = corr[r] = _mm256_setzero_ps();
    for (int t = 0; t < n; t += 8) {
        int nl = n - t < 8 ? 4 : 8;
        __m256 sv = load_n(sc + t, nl), nv = load_n(mn + t, nl);
        for (int r = 0; r < RB; r++) {
            __m256 pv = load_n(p + (size_t)r * ldp + t, nl);
            __m256 wv8 = _mm256_mul_ps(pv, sv);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(wv8, _mm256_setzero_ps(), _CMP_NGE_UQ));
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(wv8, _mm256_set1_ps(3.4e38f), _CMP_NLE_UQ));
            _mm256_storeu_ps(w[r] + t, wv8);
            m[r] = _mm256_fmadd_ps(pv, nv, m[r]);
            amax[r] = _mm256_max_ps(amax[r], wv8);
        }
    }
    for (int r = 0; r < RB; r++) {
        float am = hmax(amax[r]);
        inv[r] = _mm256_set1_ps(am > 0.0f ? 255.0f / am : 0.0f);
        ve[r] = _mm256_set1_ps(am / 255.0f);
        e[r] = am / 255.0f;
    }
    for (int t = 0; t < n; t += 8) {
        int nl = n - t < 8 ? 4 : 8;
        for (int r = 0; r < RB; r++) {
            __m256 wv8 = load_n(w[r] + t, nl);
            __m256i x = _mm256_cvtps_epi32(_mm256_mul_ps(wv8, inv[r])); /* 0..255 */
            corr[r] = _mm256_add_ps(corr[r], _mm256_fnmadd_ps(ve[r], _mm256_cvtepi32_ps(x), wv8));
            /* 8 bytes in token order through 128-bit packs, stored from the
             * vector register (not two dwords through general registers) */
            __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
            __m128i b = _mm_packus_epi16(w16, w16);
            uint8_t *dst = wq + (size_t)r * ldw + t;
            if (n - t >= 8) _mm_storel_epi64((__m128i *)(void *)dst, b);
            else _mm_storeu_si32(dst, b);
        }
    }
    for (int r = 0; r < RB; r++) {
        memset(wq + (size_t)r * ldw + n, 0, 8); /* the kernels read whole groups of 8 */
        mt[r] += hsum(m[r]) + 0.5f * (float)((1 << bits) - 1) * hsum(corr[r]);
    }
    return !_mm256_movemask_ps(bad);
}

#endif
#ifdef KKV_INT_VBMI
/* fold_probs 16 tokens at a time for RB heads in one pass (the page's
 * scales and zero points loaded once; the heads' dependency chains run side
 * by side instead of one after the other): per head the same lane
 * operations, and the two sums (zero points, centring) still run as 8-lane
 * chains in fold_probs' order (the low half of each 16, then the high half),
 * so the same bits. p: [RB][ldp]; wq: [RB][ldw] rows of n + 8 weight bytes,
 * as the VNNI planes read them; e, mt: [RB]. Returns 0 as fold_probs does,
 * for any head. */
AI int fold_probs_512(uint8_t *wq, size_t ldw, float *e, float *mt, const float *p, size_t ldp,
                      const float *sc, const float *mn, int n, int bits, int RB) {
    float w[RBI][VBLK + 16];
    __m256 m[RBI], corr[RBI];
    __m512 amax[RBI];
    __mmask16 bad = 0;
    for (int r = 0; r < RB; r++) {
        m[r] = corr[r] = _mm256_setzero_ps();
        amax[r] = _mm512_setzero_ps();
    }
    for (int t = 0; t < n; t += 16) {
        __mmask16 k = (__mmask16)(n - t >= 16 ? 0xFFFFu : (1u << (n - t)) - 1);
        __m512 sv = _mm512_maskz_loadu_ps(k, sc + t), mv = _mm512_maskz_loadu_ps(k, mn + t);
        for (int r = 0; r < RB; r++) {
            __m512 pv = _mm512_maskz_loadu_ps(k, p + (size_t)r * ldp + t);
            __m512 wv = _mm512_mul_ps(pv, sv);
            bad |= _mm512_cmp_ps_mask(wv, _mm512_setzero_ps(), _CMP_NGE_UQ) |
                   _mm512_cmp_ps_mask(wv, _mm512_set1_ps(3.4e38f), _CMP_NLE_UQ);
            _mm512_storeu_ps(w[r] + t, wv);
            m[r] = _mm256_fmadd_ps(_mm512_castps512_ps256(pv), _mm512_castps512_ps256(mv), m[r]);
            if (n - t > 8)
                m[r] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(pv, 1), _mm512_extractf32x8_ps(mv, 1), m[r]);
            amax[r] = _mm512_max_ps(amax[r], wv);
        }
    }
    __m512 inv[RBI], ve[RBI];
    for (int r = 0; r < RB; r++) {
        float am = _mm512_reduce_max_ps(amax[r]);
        inv[r] = _mm512_set1_ps(am > 0.0f ? 255.0f / am : 0.0f);
        ve[r] = _mm512_set1_ps(am / 255.0f);
        e[r] = am / 255.0f;
    }
    for (int t = 0; t < n; t += 16) {
        __mmask16 k = (__mmask16)(n - t >= 16 ? 0xFFFFu : (1u << (n - t)) - 1);
        for (int r = 0; r < RB; r++) {
            __m512 wv = _mm512_loadu_ps(w[r] + t);
            __m512i x = _mm512_cvtps_epi32(_mm512_mul_ps(wv, inv[r])); /* 0..255 */
            __m512 err = _mm512_maskz_mov_ps(k, _mm512_fnmadd_ps(ve[r], _mm512_cvtepi32_ps(x), wv));
            corr[r] = _mm256_add_ps(corr[r], _mm512_castps512_ps256(err));
            if (n - t > 8) corr[r] = _mm256_add_ps(corr[r], _mm512_extractf32x8_ps(err, 1));
            /* whole 16-byte stores (lanes past n are 0; wq has the room): the
             * kernel's 4-byte weight loads forward from them, not from masked ones */
            _mm_storeu_si128((__m128i *)(void *)(wq + (size_t)r * ldw + t), _mm512_cvtusepi32_epi8(x));
        }
    }
    for (int r = 0; r < RB; r++) {
        memset(wq + (size_t)r * ldw + n, 0, 8);
        mt[r] += hsum(m[r]) + 0.5f * (float)((1 << bits) - 1) * hsum(corr[r]);
    }
    return !bad;
}
#endif

/* 1 when every p_t * scale_t of the page is finite and >= 0. */
AI int probs_ok(const float *p, int n_rep, const uint8_t *scale16, int G) {
    __m256 bad = _mm256_setzero_ps();
    for (int t0 = 0; t0 < G; t0 += VBLK) {
        int n = G - t0 < VBLK ? G - t0 : VBLK;
        float sc[VBLK];
        f16_row(sc, scale16 + 2 * (size_t)t0, n);
        for (int r = 0; r < n_rep; r++)
            for (int t = 0; t < n; t += 8) {
                __m256i k = lanes(n - t < 8 ? 4 : 8);
                __m256 w = _mm256_mul_ps(_mm256_maskload_ps(p + (size_t)r * G + t0 + t, k), _mm256_maskload_ps(sc + t, k));
                /* not (0 <= w <= FLT_MAX), NaN included */
                bad = _mm256_or_ps(bad, _mm256_cmp_ps(w, _mm256_setzero_ps(), _CMP_NGE_UQ));
                bad = _mm256_or_ps(bad, _mm256_cmp_ps(w, _mm256_set1_ps(3.4e38f), _CMP_NLE_UQ));
            }
    }
    return !_mm256_movemask_ps(bad);
}

/* Always inlined: KKV_INT_PV calls it with the engines' shapes as constants. */
AI void pv_page_body(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G, int bits) {
    enum { LDA = KKV_MAX_HEAD_DIM };
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    size_t rowb = (size_t)D * (size_t)bits / 8;
    float sc[VBLK], mn[VBLK];
    /* One head group and one token block (the engines' shapes): the folds
     * check the probabilities before anything is added to acc. Otherwise a
     * pass over the page checks them first. */
    int folds_check = n_rep <= RBI && G <= VBLK;
    if (!folds_check && !probs_ok(p, n_rep, page + L.scale, G)) {
        kkv_avx2_pv_page(acc, p, n_rep, page, D, G, bits);
        return;
    }
    for (int r0 = 0; r0 < n_rep; r0 += RBI) {
        int rb = n_rep - r0 < RBI ? n_rep - r0 : RBI;
        float ap[RBI][LDA];            /* [RB][D] integer part, scaled */
        float mt[RBI] = {0};           /* per head constant: zero points and centring */
        uint8_t wv[RBI][VBLK / 4][32]; /* [RB][quad] weight vectors */
        for (int r = 0; r < rb; r++) /* vector stores: memset became rep stosq, ~30 cycles each on Zen 3 */
            for (int j = 0; j < D; j += 4) _mm_storeu_ps(ap[r] + j, _mm_setzero_ps());
        for (int t0 = 0; t0 < G; t0 += VBLK) {
            int n = G - t0 < VBLK ? G - t0 : VBLK; /* a multiple of 4 */
            f16_row(sc, page + L.scale + 2 * (size_t)t0, n);
            f16_row(mn, page + L.mn + 2 * (size_t)t0, n);
            float e[RBI];
            const float *pb = p + (size_t)r0 * G + t0;
#ifdef KKV_INT_VBMI
            int ok = fold_probs_512(wv[0][0], sizeof wv[0], e, mt, pb, (size_t)G, sc, mn, n, bits, rb);
#else
            int ok = fold_probs(wv[0][0], sizeof wv[0], e, mt, pb, (size_t)G, sc, mn, n, bits, rb);
#endif
            if (!ok && folds_check) { /* nothing added to acc yet */
                kkv_avx2_pv_page(acc, p, n_rep, page, D, G, bits);
                return;
            }
            const uint8_t *codes = page + L.codes + (size_t)t0 * rowb;
            size_t ldwv = sizeof wv[0];
            if (rb == 4) PV_RB(ap[0], LDA, wv[0][0], ldwv, e, codes, n, D, bits, 4);
            else if (rb == 3) PV_RB(ap[0], LDA, wv[0][0], ldwv, e, codes, n, D, bits, 3);
            else if (rb == 2) PV_RB(ap[0], LDA, wv[0][0], ldwv, e, codes, n, D, bits, 2);
            else PV_RB(ap[0], LDA, wv[0][0], ldwv, e, codes, n, D, bits, 1);
        }
        for (int r = 0; r < rb; r++) {
            float *ar = acc + (size_t)(r0 + r) * D;
            __m256 vm = _mm256_set1_ps(mt[r]);
            int j = 0;
            for (; j + 8 <= D; j += 8)
                _mm256_storeu_ps(ar + j, _mm256_add_ps(_mm256_loadu_ps(ar + j), _mm256_add_ps(_mm256_loadu_ps(ap[r] + j), vm)));
            if (j < D) /* 4 left */
                _mm_storeu_ps(ar + j, _mm_add_ps(_mm_loadu_ps(ar + j), _mm_add_ps(_mm_loadu_ps(ap[r] + j), _mm256_castps256_ps128(vm))));
        }
    }
}

void KKV_INT_PV(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G, int bits) {
    /* constant-size copies for the engines' shapes (SmolLM2, Gemma 3) */
    if (G == 128 && bits == 2 && D == 64 && n_rep == 3) pv_page_body(acc, p, 3, page, 64, 128, 2);
    else if (G == 128 && bits == 2 && D == 256 && n_rep == 4) pv_page_body(acc, p, 4, page, 256, 128, 2);
    else pv_page_body(acc, p, n_rep, page, D, G, bits);
}
