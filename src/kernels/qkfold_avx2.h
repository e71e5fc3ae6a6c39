/* The query fold shared by the AVX2 integer key kernels (the 16-bit one,
 * attn_qkwide_avx2.c, and the 8-bit one, attn_qkbyte_avx2.c): per page and
 * query head, f_j = q_j scale_j rounded to integers on one step
 * d = max_j |f_j| / qmax, the constant sum_j q_j mn_j plus the centring term,
 * and the high-plane ranks' channels; and the row loads both kernels use.
 * Include only from -mavx2 files. */
#ifndef KKV_KERNELS_QKFOLD_AVX2_H
#define KKV_KERNELS_QKFOLD_AVX2_H

#include <immintrin.h>
#include <string.h>

#include "kernels/avx2_util.h"
#include "quant/quant.h"

/* The int32 at p (a pair of int16 weights), through memcpy: no aliasing. */
AI int32_t ld32(const int32_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

#define QK_RB_MAX 3 /* the most query heads a kernel folds at once */
/* int16 weights of one head: the D channels, then the nb high-plane ranks
 * (the x of the channel each belongs to), an odd nb padded with a 0 */
#define WX (2 * KKV_MAX_HEAD_DIM + 2)

/* rch[k] = the channel whose high plane is row k (-1: none claims it, its
 * weight is 0 as in the scalar reference, which never reads such a row). */
AI void rank_channels(int16_t *rch, const uint8_t *idx, int D, int nb) {
    if (D <= 64 && nb <= 16) { /* one compare per rank over the index bytes, no branch on the data */
        /* the index bytes, then 0xFF (no rank) to 64; the copy's size is
         * bounded where GCC's object-size check sees it: built with
         * --coverage at -O0 it flagged this dead branch's D = 256 instances */
        uint8_t ib[64];
        memset(ib, 0xFF, sizeof ib);
        memcpy(ib, idx, D < 64 ? (size_t)D : sizeof ib);
        __m256i i0 = _mm256_loadu_si256((const __m256i *)(const void *)ib);
        __m256i i1 = _mm256_loadu_si256((const __m256i *)(const void *)(ib + 32));
        for (int k = 0; k < nb; k++) {
            __m256i kv = _mm256_set1_epi8((char)k);
            uint64_t m = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(i0, kv)) |
                         (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(i1, kv)) << 32;
            rch[k] = m ? (int16_t)__builtin_ctzll(m) : (int16_t)-1;
        }
        return;
    }
    kkv_rank_owners(rch, idx, D, nb);
}

/* What a key page gives every query head: its scales and zero points as
 * f32, where its planes lie, and the channel of each high-plane rank. */
typedef struct qk_page_view {
    float          scale[KKV_MAX_HEAD_DIM], mn[KKV_MAX_HEAD_DIM]; /* [D] */
    int16_t        rch[KKV_MAX_HEAD_DIM];                         /* [nb] */
    const uint8_t *idx, *lo, *hi; /* in the page: [D] ranks, [D][G/4] and [nb][G/4] code rows */
} qk_page_view;

AI void qk_page_view_of(qk_page_view *P, const uint8_t *page, int D, int G, int nb) {
    kkv_key_layout L = key_page_f32(P->scale, P->mn, page, D, G, nb);
    P->idx = page + L.idx, P->lo = page + L.lo, P->hi = page + L.hi;
    rank_channels(P->rch, P->idx, D, nb);
}

/* Integer query of RB (<= QK_RB_MAX) heads on one step per head, |x| <=
 * qmax: x[r][j] = rint(f_j / d[r]) for the D channels, then x of the
 * channel of each high rank at D + k. d[r]: the step; cst[r]: sum q mn plus
 * the centring term. Returns 0 when some f is not finite. */
AI int fold_query(int16_t (*x)[WX], float *d, float *cst, const float *q, int RB, const qk_page_view *P,
                  int D, int nb, float qmax) {
    const float *scale = P->scale, *mn = P->mn;
    const uint8_t *idx = P->idx;
    const int16_t *rch = P->rch;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 mx[QK_RB_MAX], bad = _mm256_setzero_ps();
    for (int r = 0; r < RB; r++) mx[r] = _mm256_setzero_ps();
    for (int j = 0; j < D; j += 8) {
        int n = D - j < 8 ? 4 : 8;
        __m256 sv = load_n(scale + j, n);
        for (int r = 0; r < RB; r++) {
            __m256 fv = _mm256_mul_ps(load_n(q + (size_t)r * D + j, n), sv);
            bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(fv, fv), _mm256_setzero_ps(), _CMP_NEQ_UQ));
            mx[r] = _mm256_max_ps(mx[r], _mm256_and_ps(fv, absm));
        }
    }
    if (_mm256_movemask_ps(bad)) return 0; /* inf or NaN */
    __m256 vinv[QK_RB_MAX], vd[QK_RB_MAX], c[QK_RB_MAX], corr[QK_RB_MAX];
    for (int r = 0; r < RB; r++) {
        float M = hmax(mx[r]);
        if (fold_too_small(M)) return 0; /* the float kernel takes the page */
        d[r] = M / qmax;
        vinv[r] = _mm256_set1_ps(M > 0.0f ? qmax / M : 0.0f);
        vd[r] = _mm256_set1_ps(d[r]);
        c[r] = corr[r] = _mm256_setzero_ps();
    }
    for (int j = 0; j < D; j += 8) {
        int n = D - j < 8 ? 4 : 8;
        __m256i m = lanes(n);
        __m256 sv = load_n(scale + j, n), nv = load_n(mn + j, n);
        uint64_t ib = 0;
        memcpy(&ib, idx + j, (size_t)n);
        __m256i iv = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)ib));
        __m256 boosted = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nb), iv));
        __m256 half = _mm256_and_ps(_mm256_blendv_ps(_mm256_set1_ps(1.5f), _mm256_set1_ps(7.5f), boosted),
                                    _mm256_castsi256_ps(m));
        for (int r = 0; r < RB; r++) {
            __m256 qv = load_n(q + (size_t)r * D + j, n), fv = _mm256_mul_ps(qv, sv);
            __m256i xi = _mm256_cvtps_epi32(_mm256_mul_ps(fv, vinv[r])); /* |x| <= QMAX */
            c[r] = _mm256_fmadd_ps(qv, nv, c[r]);
            corr[r] = _mm256_fmadd_ps(_mm256_fnmadd_ps(vd[r], _mm256_cvtepi32_ps(xi), fv), half, corr[r]);
            /* packs works per 128-bit lane: x0..3 x0..3 | x4..7 x4..7 */
            __m128i x16 = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packs_epi32(xi, xi), 0x08));
            if (n == 8) _mm_storeu_si128((__m128i *)(void *)(x[r] + j), x16);
            else _mm_storel_epi64((__m128i *)(void *)(x[r] + j), x16);
        }
    }
    for (int r = 0; r < RB; r++) {
        cst[r] = hsum(c[r]) + hsum(corr[r]);
        for (int k = 0; k < nb; k++) x[r][D + k] = rch[k] < 0 ? 0 : x[r][rch[k]];
        x[r][D + nb] = 0; /* the pad of an odd nb */
    }
    return 1;
}

/* Row bytes [c, c + nbytes) of a row, zero-extended to 32. */
AI __m256i row32(const uint8_t *row, size_t c, int nbytes) {
    if (nbytes == 32) return _mm256_loadu_si256((const __m256i *)(const void *)(row + c));
    uint8_t tmp[32] = {0};
    memcpy(tmp, row + c, (size_t)nbytes);
    return _mm256_loadu_si256((const __m256i *)(const void *)tmp);
}

#endif
