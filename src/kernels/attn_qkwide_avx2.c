/* Key page scores with a 16-bit query on AVX2 (vpmaddwd): the AVX2 tables'
 * key kernel for pages with more than D / 2 boosted channels, which the
 * 8-bit kernel (attn_qkbyte_avx2.c, every other page) hands to it: their
 * 4-bit codes multiply a coarse query's rounding by up to 7.5.
 *
 * s_t = sum_j q_j k_tj with k_tj = c_tj * scale_j + mn_j, so
 *   s_t = sum_j f_j c_tj + sum_j q_j mn_j,   f_j = q_j * scale_j.
 * Per page and query head f is rounded to integers x_j on ONE step
 *   d = max_j |f_j| / QMAX,  QMAX = kkv_qk_wide_qmax(D, nb) (int_fold.h; 32767 for
 * every shape the engines use), and vpmaddwd multiplies channel pairs of
 * codes (as int16) by (x_a, x_b) into exact int32 sums. The VBMI kernel's
 * design (attn_qkwide_vbmi_avx512.c) on the instruction AVX2 has: no channel
 * groups, pair lists or int16 overflow schedule, which were most of the int8
 * kernel's time (attn_int_impl.h: ~1.15-1.2 us per page hot on a Zen 3,
 * against ~0.6 here; docs/RESULTS.md, "Back on a Zen 3").
 *
 * Phases without shifts. Byte i of a 2-bit row holds tokens 4i .. 4i + 3 at
 * bits 2k. A code masked in place, c & (3 << 2k), is 4^k c, so the phase-k
 * sums are 4^k times the true ones, exactly; the float step d 4^-k undoes it
 * with the same bits (scaling by a power of two commutes with rounding). The
 * high plane of a boosted channel (the code's bits 2-3) is shifted left by 2
 * once per row instead. The bound keeping every int32 sum exact:
 *   |sum| <= QMAX * 64 * (3 D + 12 nb) <= 2^31 - 1.
 *
 * Error (the tests' bound): codes are centred on maxq/2 through the per-head
 * constant, so |s_t - exact| <= d/2 * sum_j |c_tj - maxq_j/2| (+ float
 * rounding). A non-finite f, or a head whose largest |f| is below 1e-30
 * (not 0; fold_too_small), falls back to the float kernel
 * (kkv_avx2_qk_page). Pure function of its inputs: bit-identical for any
 * thread count. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attn_simd.h"
#include "kernels/qkfold_avx2.h"

#define RBW 3 /* query heads per pass (two phases each: 6 accumulators of the 16 ymm) */
_Static_assert(RBW <= QK_RB_MAX, "fold_query folds at most QK_RB_MAX heads");



/* The int16 code words (a_i, b_i) of rows a, b for the 8 row bytes of
 * quarter v of a 32-byte chunk: v 0: i 0..3 | 16..19, 1: 4..7 | 20..23,
 * 2: 8..11 | 24..27, 3: 12..15 | 28..31 (low | high 128-bit lane). */
AI __m256i pair_words(__m256i ra, __m256i rb, int v) {
    __m256i u = v < 2 ? _mm256_unpacklo_epi8(ra, rb) : _mm256_unpackhi_epi8(ra, rb);
    return v & 1 ? _mm256_unpackhi_epi8(u, _mm256_setzero_si256()) : _mm256_unpacklo_epi8(u, _mm256_setzero_si256());
}

/* Phases k0, k0 + 1 of pair words V (high: a high plane's, codes count 4x)
 * into a00 .. a21 ([head][phase]); mk0, mk1: the phases' masks; wp: [RB]
 * (ldw apart) the pair's weights (x_a, x_b), broadcast to every dword by
 * vpbroadcastd from memory (a 32-byte broadcast table per page measured 7%
 * slower: 108 more stores and loads per page). The
 * empty asm statements pin the weights and masks in registers: without them
 * GCC folded each into every vpmaddwd / vpand as a memory operand, ten loads
 * per pair where five are needed, and the loop ran at ~2 vector operations
 * per cycle instead of ~3.5 (Zen 3: 1.0 -> 0.75 us per page). */
#define PAIR_MADD(V, wp, high)                                                                     \
    do {                                                                                           \
        __m256i V_ = (high) ? _mm256_slli_epi16((V), 2) : (V);                                     \
        __asm__("" : "+x"(mk0), "+x"(mk1));                                                        \
        __m256i X0_ = _mm256_and_si256(V_, mk0), X1_ = _mm256_and_si256(V_, mk1);                  \
        __m256i w0_ = _mm256_set1_epi32(ld32((wp)));                                                     \
        __asm__("" : "+x"(w0_));                                                                   \
        a00 = _mm256_add_epi32(a00, _mm256_madd_epi16(X0_, w0_));                                  \
        a01 = _mm256_add_epi32(a01, _mm256_madd_epi16(X1_, w0_));                                  \
        if (RB > 1) {                                                                              \
            __m256i w1_ = _mm256_set1_epi32(ld32((wp) + ldw));                                           \
            __asm__("" : "+x"(w1_));                                                               \
            a10 = _mm256_add_epi32(a10, _mm256_madd_epi16(X0_, w1_));                              \
            a11 = _mm256_add_epi32(a11, _mm256_madd_epi16(X1_, w1_));                              \
        }                                                                                          \
        if (RB > 2) {                                                                              \
            __m256i w2_ = _mm256_set1_epi32(ld32((wp) + 2 * ldw));                                       \
            __asm__("" : "+x"(w2_));                                                               \
            a20 = _mm256_add_epi32(a20, _mm256_madd_epi16(X0_, w2_));                              \
            a21 = _mm256_add_epi32(a21, _mm256_madd_epi16(X1_, w2_));                              \
        }                                                                                          \
    } while (0)

/* Scores of RB heads for quarter v of one chunk (row bytes c.., nbytes of
 * them), phases k0 and k0 + 1, stored at s (row stride G; tokens past
 * 4 nbytes not written). lo: [D][rowb] rows, hi: [nb][rowb]; wv: [RB][ldw]
 * pair weights as int32. Two phases per pass: all four would hold 12 accumulators
 * for 3 heads, and with the codes, weights and masks that spilled (slower
 * than decoding each row twice). */
AI void wide_quarter(float *s, int G, const int32_t *wv, size_t ldw, const float *d, const float *cst,
                     const uint8_t *lo, const uint8_t *hi, int D, int nb, size_t c, int nbytes, int v,
                     int k0, int RB) {
    size_t rowb = (size_t)G / 4;
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
    __m256i mk0 = _mm256_set1_epi16((short)(3 << 2 * k0)), mk1 = _mm256_set1_epi16((short)(3 << 2 * (k0 + 1)));
    for (int p = 0; p < D / 2; p++) {
        const uint8_t *ra = lo + (size_t)(2 * p) * rowb;
        __m256i V = pair_words(row32(ra, c, nbytes), row32(ra + rowb, c, nbytes), v);
        PAIR_MADD(V, wv + p, 0);
    }
    mk0 = _mm256_slli_epi16(mk0, 2), mk1 = _mm256_slli_epi16(mk1, 2); /* high planes: codes << 2 */
    for (int k = 0; k < nb; k += 2) {
        const uint8_t *ra = hi + (size_t)k * rowb;
        __m256i rb = k + 1 < nb ? row32(ra + rowb, c, nbytes) : _mm256_setzero_si256(); /* an odd nb's pad */
        __m256i V = pair_words(row32(ra, c, nbytes), rb, v);
        PAIR_MADD(V, wv + D / 2 + k / 2, 1);
    }
    /* lane j of phase k0 + e: row byte i = 4v + j (j < 4) or 16 + 4v + j - 4,
     * token 4i + k0 + e. d 4^-k is exact, so the phase's 4^k goes with the
     * same bits. */
    const __m256i acc[RBW][2] = {{a00, a01}, {a10, a11}, {a20, a21}};
    int ntok = 4 * nbytes;
    for (int r = 0; r < RB; r++) {
        __m256 vc = _mm256_set1_ps(cst[r]);
        __m256 f0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][0]), _mm256_set1_ps(d[r] * (1.0f / (float)(1 << 2 * k0))), vc);
        __m256 f1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][1]), _mm256_set1_ps(d[r] * (1.0f / (float)(1 << 2 * (k0 + 1)))), vc);
        /* (k0, k0 + 1) of row bytes 4v, 4v + 1 | 16 + ..., then 4v + 2, 4v + 3 */
        __m256 pr[2] = {_mm256_unpacklo_ps(f0, f1), _mm256_unpackhi_ps(f0, f1)};
        float *sr = s + (size_t)r * G + k0;
        for (int h = 0; h < 2; h++)
            for (int m = 0; m < 4; m++) {
                int t = 4 * (16 * h + 4 * v + m);
                if (t >= ntok) continue;
                __m128 x = h ? _mm256_extractf128_ps(pr[m >> 1], 1) : _mm256_castps256_ps128(pr[m >> 1]);
                if (m & 1) _mm_storeh_pi((__m64 *)(void *)(sr + t), x);
                else _mm_storel_pi((__m64 *)(void *)(sr + t), x);
            }
    }
}

/* One 32-byte chunk: every quarter and phase pair, as constants. */
AI void wide_chunk(float *s, int G, const int32_t *wv, size_t ldw, const float *d, const float *cst,
                   const uint8_t *lo, const uint8_t *hi, int D, int nb, size_t c, int nbytes, int RB) {
#define KKV_WQ(v)                                                                               \
    if (4 * (v) < nbytes) { /* row bytes 4v.. (and 16 + 4v..): none past nbytes otherwise */    \
        wide_quarter(s, G, wv, ldw, d, cst, lo, hi, D, nb, c, nbytes, v, 0, RB);                \
        wide_quarter(s, G, wv, ldw, d, cst, lo, hi, D, nb, c, nbytes, v, 2, RB);                \
    }
    KKV_WQ(0) KKV_WQ(1) KKV_WQ(2) KKV_WQ(3)
#undef KKV_WQ
}

AI void wide_rb(float *s, int G, const int32_t *wv, size_t ldw, const float *d, const float *cst,
                const uint8_t *lo, const uint8_t *hi, int D, int nb, int RB) {
    size_t rowb = (size_t)G / 4;
    for (size_t c = 0; c < rowb; c += 32)
        wide_chunk(s + 4 * c, G, wv, ldw, d, cst, lo, hi, D, nb, c, rowb - c < 32 ? (int)(rowb - c) : 32, RB);
}

/* Always inlined: the entry point calls it with the engines' shapes as constants. */
AI void qk_wide16(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    qk_page_view P;
    qk_page_view_of(&P, page, D, G, nb);
    float qmax = (float)kkv_qk_wide_qmax(D, nb);
    for (int r0 = 0; r0 < n_rep; r0 += RBW) {
        int rb = n_rep - r0 < RBW ? n_rep - r0 : RBW;
        float d[RBW], cst[RBW];
        int16_t x[RBW][WX]; /* [head][D channels, then the high ranks] */
        if (!fold_query(x, d, cst, q + (size_t)r0 * D, rb, &P, D, nb, qmax)) {
            kkv_avx2_qk_page(s, q, n_rep, page, D, G, nb);
            return;
        }
        const int32_t *wv = (const int32_t *)(const void *)x[0]; /* [head][pair] (x_a, x_b), WX / 2 apart */
        float *sr = s + (size_t)r0 * G;
        const size_t ldw = WX / 2;
        if (rb == 3) wide_rb(sr, G, wv, ldw, d, cst, P.lo, P.hi, D, nb, 3);
        else if (rb == 2) wide_rb(sr, G, wv, ldw, d, cst, P.lo, P.hi, D, nb, 2);
        else wide_rb(sr, G, wv, ldw, d, cst, P.lo, P.hi, D, nb, 1);
    }
}

void kkv_avx2_qk_wide(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    KKV_QK_ENGINE_SHAPES(qk_wide16, s, q, n_rep, page, D, G, nb);
}
