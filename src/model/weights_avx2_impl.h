/* AVX2 dot kernels for kkv_matmul_ex, one body built three ways (included
 * by weights_avx2.c, weights_vnni_avx512.c and weights_vnni_avxvnni.c, each
 * compiled for its level and run only where kkv_cpu_get() has it). Q4_0, Q4_1
 * and Q8_0 take eight rows at once (sixteen in the AVX-512 VNNI build, for
 * batches) with the scalar kernels' arithmetic (weights_rows_impl.h), and so
 * do Q5_0, Q5_1, Q4_K, Q5_K and Q6_K packed (the one-row kernel keeps that
 * arithmetic for them). The other types: the scalar arithmetic except the
 * order of the fp32 additions: each (weight block, activation block) product
 * is exact in int32, scaled by d_w * d_x and added into 8 fp32 lanes that are
 * summed at the end. Every output uses the same instruction sequence whatever
 * nx is, so grouping never changes a result.
 *
 * The includer defines KKV_WT_TABLE (the kernel table's name) and, for the
 * VNNI builds, KKV_WT_DPBUSD(acc, u, s) (vpdpbusd: acc + the four u8 x s8
 * products of each int32 lane). Without it, a lane's four products are
 * vpmaddubsw pairs widened by vpmaddwd. Both are exact for every code these
 * kernels feed them (no pair sum reaches int16 saturation: |u| <= 128, |s| <=
 * 127), so all three builds give bit-identical results. */
#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>
#include <string.h>

#include "core/cpu.h"
#include "model/weights.h"

/* The sum of the four u8 x s8 products of each 4-byte lane, as int32 (exact:
 * see the top of the file). */
static inline __m256i dot4_u8s8(__m256i u, __m256i s) {
#ifdef KKV_WT_DPBUSD
    return KKV_WT_DPBUSD(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

/* The sum of 8 int32 lanes (exact while it fits, as every block sum here does). */
static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Fixed-order sum of 8 lanes: (l+h) halves, then pairs, then the last two. */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 32 nibbles of 16 bytes as 32 unsigned bytes: low nibbles first. */
static inline __m256i unpack_nibbles(const uint8_t *p) {
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_set1_epi8(0x0f);
    __m128i lo = _mm_and_si128(v, m);
    __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    return _mm256_set_m128i(hi, lo);
}

/* Pairwise int8 products summed to 8 int32 lanes; w signed. */
static inline __m256i dot_signed(__m256i w, __m256i x, __m256i pair_weights) {
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return _mm256_madd_epi16(p, pair_weights);
}

/* Q6_K activation block k (0..7) of a super-block: the 32 quants minus 32. */
static inline __m256i q6k_block(const uint8_t *b, int k) {
    int half = k >> 2, quarter = k & 3;
    __m256i ql = _mm256_loadu_si256((const __m256i *)(b + half * 64 + (quarter & 1) * 32));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + half * 32));
    __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    ql = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128((quarter & 2) * 2)), m4);
    qh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * quarter)), m2);
    __m256i q = _mm256_or_si256(ql, _mm256_slli_epi16(qh, 4));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(32));
}

/* Q5_0/Q5_1: 32 unsigned 5-bit quants of a block (qh then qs). */
static inline __m256i q5_block(const uint8_t *qh, const uint8_t *qs) {
    uint32_t h;
    memcpy(&h, qh, 4);
    /* byte i takes bit i of h: spread byte i/8 of h over bytes 8(i/8)..+7 (every
     * lane holds h, so the in-lane shuffle reaches all four), then test bit i%8 */
    __m256i hv = _mm256_set1_epi32((int)h);
    __m256i shuf = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0);
    __m256i bytes = _mm256_shuffle_epi8(hv, shuf);
    __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit), _mm256_set1_epi8(16));
    return _mm256_or_si256(unpack_nibbles(qs), hi);
}

/* Q2_K activation block k: 32 unsigned 2-bit quants. */
static inline __m256i q2k_block(const uint8_t *b, int k) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * (k >> 2)));
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (k & 3))), _mm256_set1_epi8(3));
}

/* Q3_K activation block k: 32 signed quants -4..3. */
static inline __m256i q3k_block(const uint8_t *b, int k) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * (k >> 2)));
    __m256i lo = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * (k & 3))), _mm256_set1_epi8(3));
    __m256i hm = _mm256_loadu_si256((const __m256i *)b);
    __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(k)), _mm256_set1_epi8(1));
    return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hb, 2)), _mm256_set1_epi8(4));
}

/* Q4_K / Q5_K sub-block k: 32 unsigned quants (qs at offset qs_off; Q5_K's
 * fifth bit is bit k of qh[l] at offset 16). */
static inline __m256i q45k_block(const uint8_t *b, int k, int five) {
    const uint8_t *qs = b + (five ? 48 : 16) + 32 * (k >> 1);
    __m256i v = _mm256_loadu_si256((const __m256i *)qs);
    __m256i q = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (k & 1))), _mm256_set1_epi8(15));
    if (five) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(b + 16));
        h = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(k)), _mm256_set1_epi8(1));
        q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
    }
    return q;
}

/* Same packing as weights.c's k4_scale_min. */
static inline void k4_scale_min(const uint8_t *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
        *min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
}

/* Same as weights.c's q3k_scale. */
static inline int q3k_scale(const uint8_t *blk, int s) {
    const uint8_t *sc = blk + 96;
    int lo = s < 8 ? (sc[s] & 15) : (sc[s - 8] >> 4);
    int hi = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

/* (d_w * d_x) in 8 lanes: the lane-wise product of the broadcast d_w and a
 * broadcast load of d_x, the same fp32 product as the scalar d * x->d, in one
 * multiply per column instead of a scalar multiply and a broadcast (the
 * per-column work is what a batch repeats). */
static inline __m256 scale_of(__m256 dv, const kkv_q8x *x) {
    return _mm256_mul_ps(dv, _mm256_broadcast_ss(&x->d));
}

/* acc[j] += (d_w * d_x_j) * (w . x_j) over the nx columns of block b, for
 * signed weights with a 16-bit scale per half block (Q3_K): the pair sums
 * are weighted by the scales before the int32 sum; always_inline like its
 * caller. */
static inline __attribute__((always_inline)) void cols_scaled(__m256 *acc, __m256i w, __m256i scales,
                                                              __m256 dv, const kkv_q8x *const *xq,
                                                              int64_t b, const int nx) {
    for (int j = 0; j < nx; j++) {
        const kkv_q8x *x = &xq[j][b];
        __m256i s = dot_signed(w, _mm256_loadu_si256((const __m256i *)x->q), scales);
        acc[j] = _mm256_fmadd_ps(scale_of(dv, x), _mm256_cvtepi32_ps(s), acc[j]);
    }
}

#include "model/weights_rows_impl.h"

/* One weight row against nx activation vectors; always_inline so each nx
 * gets its own unrolled copy. Q4_0, Q4_1 and Q8_0 go through the eight-row
 * kernel (avx2_dot_q), so a row has the same bits alone or in a block. The
 * types the packed kernels also read (Q5, Q4_K, Q5_K, Q6_K) take the scalar
 * arithmetic here (each block's integer sum first, then accs += (d_w * d_x)
 * * sum in block order: `exact`), so they give the same bits packed or not;
 * the others keep 8 fp32 lanes summed at the end. */
static inline __attribute__((always_inline)) void dot_q_nx(float *res, uint32_t type, const uint8_t *row,
                                                           int64_t cols, const kkv_q8x *const *xq,
                                                           const int nx) {
    __m256 acc[KKV_WT_NX];
    float accs[KKV_WT_NX], accm[KKV_WT_NX];
    for (int j = 0; j < nx; j++) {
        acc[j] = _mm256_setzero_ps();
        accs[j] = accm[j] = 0.0f;
    }
    int exact = 0; /* 1: the result is accs + accm, as the scalar code adds it */
    int64_t nb = cols / 32;
    switch (type) {
    case KKV_WT_Q6_K:
        exact = 1;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *wb = row + 210 * (b / 8);
            int k = (int)(b % 8);
            const int8_t *sc = (const int8_t *)(wb + 192);
            __m256i w = q6k_block(wb, k);
            /* pair sums 0..7 come from values 0..15 (scale 2k), 8..15 from 16..31 */
            __m256i scales = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
            float d = f16_at(wb + 208);
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                int32_t si = hsum_epi32(dot_signed(w, _mm256_loadu_si256((const __m256i *)x->q), scales));
                accs[j] += (d * x->d) * (float)si;
            }
        }
        break;
    case KKV_WT_Q5_0:
    case KKV_WT_Q5_1: {
        const int one = type == KKV_WT_Q5_1;
        const size_t bb = one ? 24 : 22;
        exact = 1;
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *wb = row + bb * (size_t)b;
            __m256i w = one ? q5_block(wb + 4, wb + 8) : q5_block(wb + 2, wb + 6); /* codes 0..31 */
            float d = f16_at(wb), m = one ? f16_at(wb + 2) : 0.0f;
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                int32_t sumi = hsum_epi32(dot4_u8s8(w, _mm256_loadu_si256((const __m256i *)x->q)));
                if (!one) sumi -= 16 * x->isum;
                accs[j] += (d * x->d) * (float)sumi;
                if (one) accm[j] += m * x->s;
            }
        }
        break;
    }
    case KKV_WT_Q2_K:
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *wb = row + 84 * (b / 8);
            int k = (int)(b % 8);
            __m256i w = q2k_block(wb, k);
            int sc0 = wb[2 * k] & 15, sc1 = wb[2 * k + 1] & 15;
            int m0 = wb[2 * k] >> 4, m1 = wb[2 * k + 1] >> 4;
            __m256i scales = _mm256_set_m128i(_mm_set1_epi16((short)sc1), _mm_set1_epi16((short)sc0));
            float d = f16_at(wb + 80), dmin = f16_at(wb + 82);
            const __m256 dv = _mm256_set1_ps(d);
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                __m256i p = _mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i *)x->q));
                __m256i s = _mm256_madd_epi16(p, scales);
                acc[j] = _mm256_fmadd_ps(scale_of(dv, x), _mm256_cvtepi32_ps(s), acc[j]);
                int32_t mins = m0 * x->isum16 + m1 * (x->isum - x->isum16);
                accm[j] -= (dmin * x->d) * (float)mins;
            }
        }
        break;
    case KKV_WT_Q3_K:
        /* scales decoded once per super-block; the products are those of
         * the per-block definition, so nothing but speed changes */
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *wb = row + 110 * sb;
            short scl[16];
            for (int s = 0; s < 16; s++) scl[s] = (short)q3k_scale(wb, s);
            float d = f16_at(wb + 108);
            const __m256 dv = _mm256_set1_ps(d);
            for (int k = 0; k < 8; k++) {
                int64_t b = 8 * sb + k;
                __m256i w = q3k_block(wb, k);
                __m256i scales = _mm256_set_m128i(_mm_set1_epi16(scl[2 * k + 1]), _mm_set1_epi16(scl[2 * k]));
                cols_scaled(acc, w, scales, dv, xq, b, nx);
            }
        }
        break;
    case KKV_WT_Q4_K:
    case KKV_WT_Q5_K: {
        const int five = type == KKV_WT_Q5_K;
        exact = 1;
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const uint8_t *wb = row + (five ? 176 : 144) * (size_t)sb;
            float d = f16_at(wb), dmin = f16_at(wb + 2);
            for (int k = 0; k < 8; k++) {
                int sc, mn;
                k4_scale_min(wb + 4, k, &sc, &mn);
                __m256i w = q45k_block(wb, k, five);
                for (int j = 0; j < nx; j++) {
                    const kkv_q8x *x = &xq[j][8 * sb + k];
                    int32_t si = sc * hsum_epi32(dot4_u8s8(w, _mm256_loadu_si256((const __m256i *)x->q)));
                    accs[j] += (d * x->d) * (float)si;
                    accm[j] -= (dmin * x->d) * (float)(mn * x->isum);
                }
            }
        }
        break;
    }
    default: break;
    }
    for (int j = 0; j < nx; j++) res[j] = (exact ? accs[j] : hsum8(acc[j])) + accm[j];
}

static void avx2_dot_q(float *res, uint32_t type, const void *row, int64_t cols,
                       const kkv_q8x *const *xq, int nx) {
    if (rows_covers(type)) {
        const uint8_t *rp[WT_ROWS];
        for (int r = 0; r < WT_ROWS; r++) rp[r] = row;
        float r8[WT_ROWS * KKV_WT_NX];
        avx2_dot_q_rows(r8, type, rp, cols, xq, nx, NULL, NULL);
        for (int j = 0; j < nx; j++) res[j] = r8[WT_ROWS * j];
        return;
    }
    switch (nx) {
    case 1: dot_q_nx(res, type, row, cols, xq, 1); break;
    case 2: dot_q_nx(res, type, row, cols, xq, 2); break;
    case 3: dot_q_nx(res, type, row, cols, xq, 3); break;
    case 4: dot_q_nx(res, type, row, cols, xq, 4); break;
    case 5: dot_q_nx(res, type, row, cols, xq, 5); break;
    case 6: dot_q_nx(res, type, row, cols, xq, 6); break;
    case 7: dot_q_nx(res, type, row, cols, xq, 7); break;
    default: dot_q_nx(res, type, row, cols, xq, 8); break;
    }
}

static inline __m256 load8_w(uint32_t type, const uint8_t *row, int64_t i) {
    if (type == KKV_WT_F32) return _mm256_loadu_ps((const float *)(const void *)(row + 4 * i));
    if (type == KKV_WT_BF16) {
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(row + 2 * i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    }
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i)));
}

static inline float load1_w(uint32_t type, const uint8_t *row, int64_t i) {
    if (type == KKV_WT_F32) {
        float w;
        memcpy(&w, row + 4 * i, 4);
        return w;
    }
    if (type == KKV_WT_BF16) {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float w;
        memcpy(&w, &u, 4);
        return w;
    }
    return f16_at(row + 2 * i);
}

/* F32/F16: two 8-lane accumulators over 16-value steps, one 8-value step,
 * then the scalar tail, in that fixed order. */
static void avx2_dot_f(float *res, uint32_t type, const void *rowv, int64_t cols,
                       const float *const *xf, int nx) {
    const uint8_t *row = rowv;
    for (int j = 0; j < nx; j++) {
        const float *x = xf[j];
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= cols; i += 16) {
            a0 = _mm256_fmadd_ps(load8_w(type, row, i), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(load8_w(type, row, i + 8), _mm256_loadu_ps(x + i + 8), a1);
        }
        if (i + 8 <= cols) {
            a0 = _mm256_fmadd_ps(load8_w(type, row, i), _mm256_loadu_ps(x + i), a0);
            i += 8;
        }
        float acc = hsum8(_mm256_add_ps(a0, a1));
        for (; i < cols; i++) acc += load1_w(type, row, i) * x[i];
        res[j] = acc;
    }
}

/* kkv_q8x_quantize with 8 lanes, byte for byte: the lane operations are the
 * scalar code's (|v| and max are exact, d and 1 / d are computed as there, q
 * = v * id rounded with the same 1.5 * 2^23 addition and clamped; the integer
 * sums are exact). A block whose scale is not a normal float (an all-zero,
 * tiny or non-finite block: 1 / d may overflow there) goes to the scalar
 * code, so the vector path only sees |v * id| <= 127 (+ rounding). */
static void avx2_quantize(kkv_q8x *dst, const float *x, int64_t cols) {
    const __m256 sign = _mm256_set1_ps(-0.0f), magic = _mm256_set1_ps(12582912.0f);
    const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
    for (int64_t b = 0; b < cols / 32; b++) {
        const float *v = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
        __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        /* NaN anywhere: max_ps may drop it, so test the lanes directly */
        __m256 unord = _mm256_or_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q), _mm256_cmp_ps(v2, v3, _CMP_UNORD_Q));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        float d = amax / 127.0f;
        if (_mm256_movemask_ps(unord) || !(amax <= 3.4028234663852886e38f) || !(d >= 1.17549435e-38f)) {
            kkv_q8x_quantize(&dst[b], v, 32); /* the scalar definition */
            continue;
        }
        const __m256 id = _mm256_set1_ps(1.0f / d);
        __m256i q[4];
        const __m256 vs[4] = {v0, v1, v2, v3};
        for (int i = 0; i < 4; i++) {
            __m256 t = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(vs[i], id), magic), magic);
            t = _mm256_max_ps(_mm256_min_ps(t, lim), nlim);
            q[i] = _mm256_cvtps_epi32(t); /* t is integral: exact */
        }
        /* int32 -> int8 in order: the packs work per 128-bit lane, the
         * permute puts the four 8-byte groups back in element order */
        __m256i w01 = _mm256_packs_epi32(q[0], q[1]), w23 = _mm256_packs_epi32(q[2], q[3]);
        __m256i bytes = _mm256_packs_epi16(w01, w23);
        bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        kkv_q8x *o = &dst[b];
        _mm256_storeu_si256((__m256i *)(void *)o->q, bytes);
        __m256i s01 = _mm256_add_epi32(q[0], q[1]), s23 = _mm256_add_epi32(q[2], q[3]);
        __m128i a = _mm_add_epi32(_mm256_castsi256_si128(s01), _mm256_extracti128_si256(s01, 1));
        a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0x4e));
        a = _mm_add_epi32(a, _mm_shuffle_epi32(a, 0xb1));
        __m128i c = _mm_add_epi32(_mm256_castsi256_si128(s23), _mm256_extracti128_si256(s23, 1));
        c = _mm_add_epi32(c, _mm_shuffle_epi32(c, 0x4e));
        c = _mm_add_epi32(c, _mm_shuffle_epi32(c, 0xb1));
        int32_t sum16 = _mm_cvtsi128_si32(a), sum = sum16 + _mm_cvtsi128_si32(c);
        o->d = d;
        o->isum = sum;
        o->isum16 = sum16;
        o->s = d * (float)sum;
    }
}

#ifdef KKV_WT_ZMM
#define WT_ROWS16_FN zmm_dot_q_rows16
#define WT_PACK_FN   zmm_dot_q_pack16
#define WT_PACK_ROWS KKV_WT_ROWS16
#else
#define WT_ROWS16_FN NULL
#define WT_PACK_FN   avx2_dot_q_pack8
#define WT_PACK_ROWS KKV_WT_ROWS
#endif
const kkv_wt_kernels KKV_WT_TABLE = {avx2_dot_q, avx2_dot_f,   avx2_quantize, avx2_dot_q_rows,
                                     WT_ROWS16_FN, WT_PACK_FN, WT_PACK_ROWS};

#endif
