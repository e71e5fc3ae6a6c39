/* Key page scores with an 8-bit query on AVX2 (vpmaddubsw): the AVX2 table's
 * key kernel for pages whose keys are mostly 2-bit, n_boost <= D / 2
 * (kivi-k2*, kitty, kitty-pro, kitty-plus). Pages with more boosted
 * channels (4-bit keys; some heads of kitty-plus-pro's pooled budget) go to
 * the 16-bit kernel (attn_qkwide_avx2.c), whose finer query keeps the
 * rounding of 4-bit codes small.
 *
 * Why 8 bits. The 16-bit kernel multiplies a channel pair of 2-bit codes
 * (as int16 words) by (x_a, x_b) with vpmaddwd: 8 tokens per instruction and
 * an int32 add. vpmaddubsw multiplies the code bytes themselves (unsigned)
 * by int8 weights and sums each pair into int16: 16 tokens per instruction,
 * an int16 add, and half the unpacking. AVX2 has no instruction that does
 * this with a wider query.
 *
 * Exactness. Codes are extracted to 0..3 (shift and mask per phase), so a
 * pair's sum is at most 2 * 3 * 127 = 762 and 32 pairs (64 channels) stay
 * exact in int16 (<= 24384); each block of 32 pairs is then widened to
 * int32. A boosted channel's high plane (the code's bits 2-3, rows ranked
 * by idx) is summed the same way and shifted left by 2 when widened; or,
 * when the query's own bound allows (byte_rows_fused), as 4 * code in the
 * same int16 block as the low planes. So the integer sums are exact: the
 * only rounding is the query's.
 *
 * Error (the tests' bound, the 16-bit kernel's with another step):
 *   |s_t - exact| <= d/2 * sum_j |c_tj - maxq_j/2| (+ float rounding),
 *   d = max_j |q_j scale_j| / 127.
 * Against the keys' own rounding this is small: a code's error moves s_t by
 * f_j (k_tj - decoded)/scale_j, RMS |f_j| / sqrt(12) per channel, at least
 * M / 3.5 for the channel of the largest |f_j| = M, while the query step
 * adds ~d sqrt(sum_j (c_tj - maxq_j/2)^2 / 12), ~M / 49 RMS for 64 channels
 * of 2-bit codes. test_kernels --score-error measures both: 2-9% of the
 * keys' error in RMS, under 1% of its variance (docs/RESULTS.md).
 *
 * Non-finite f, or a head whose largest |f| is below 1e-30 but not 0, falls
 * back to the float kernel (kkv_avx2_qk_page). Pure function of its inputs:
 * bit-identical for any thread count. */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attn_simd.h"
#include "kernels/qkfold_avx2.h"

#define RBB 3      /* query heads per pass: 3 x 2 phases of int16 accumulators */
#define BLK 32     /* channel pairs per int16 block: 32 x 762 <= 32767 */
#define LDW (WX / 2 + 8) /* pair weights per head, with room for the last 8 written */
#define QMAX8 127  /* the query's largest |x|: a vpmaddubsw weight is int8 */
_Static_assert(RBB <= QK_RB_MAX, "fold_query folds at most QK_RB_MAX heads");

/* a [16] int32 += the 16 int16 lanes of b, shifted left by sh; or = them
 * (set: the first block of a pass, which saves zeroing a and reading it). */
AI void widen_add(int32_t *a, __m256i b, int sh, int set) {
    __m256i lo = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(b));
    __m256i hi = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(b, 1));
    if (sh) lo = _mm256_slli_epi32(lo, sh), hi = _mm256_slli_epi32(hi, sh);
    __m256i *d0 = (__m256i *)(void *)a, *d1 = (__m256i *)(void *)(a + 8);
    if (!set) lo = _mm256_add_epi32(lo, _mm256_load_si256(d0)), hi = _mm256_add_epi32(hi, _mm256_load_si256(d1));
    _mm256_store_si256(d0, lo);
    _mm256_store_si256(d1, hi);
}

/* The codes of phases k0 and k0 + 1 of a row pair for half u of a chunk:
 * rows ra and ra + rowb byte-interleaved (the second 0 where !two), then
 * (V >> 2k) & 3; x4: 4 * code, (V >> (2k - 2)) & 12, for the high plane's
 * ranks (the same operation count; bits that cross a byte edge land outside
 * the mask). */
AI void pair_codes(__m256i *X0, __m256i *X1, const uint8_t *ra, size_t rowb, int two, size_t c, int nbytes,
                   int u, int k0, int x4) {
    __m256i x0 = row32(ra, c, nbytes);
    __m256i x1 = two ? row32(ra + rowb, c, nbytes) : _mm256_setzero_si256();
    __m256i V = u ? _mm256_unpackhi_epi8(x0, x1) : _mm256_unpacklo_epi8(x0, x1);
    if (x4) {
        __m256i m12 = _mm256_set1_epi8(12);
        *X0 = _mm256_and_si256(k0 ? _mm256_srli_epi16(V, 2 * k0 - 2) : _mm256_slli_epi16(V, 2), m12);
        *X1 = _mm256_and_si256(k0 ? _mm256_srli_epi16(V, 2 * k0) : V, m12);
    } else {
        __m256i m3 = _mm256_set1_epi8(3);
        *X0 = _mm256_and_si256(k0 ? _mm256_srli_epi16(V, 2 * k0) : V, m3);
        *X1 = _mm256_and_si256(_mm256_srli_epi16(V, 2 * k0 + 2), m3);
    }
}

/* One channel-row pair of a key pass: the codes of its two phases, X0 and
 * X1, times the pair's weights at wp (head r at wp + r ldw) into the int16
 * sums b00..b21 of the enclosing function, for RB heads. Macros rather than
 * functions so the six sums stay named registers, as the loops need. */
#define BYTE_ROWS_STEP(X0, X1, wp)                                     \
    do {                                                              \
        __m256i w0 = _mm256_set1_epi32(ld32(wp));                     \
        add16_into(&b00, _mm256_maddubs_epi16(X0, w0));               \
        add16_into(&b01, _mm256_maddubs_epi16(X1, w0));               \
        if (RB > 1) {                                                 \
            __m256i w1 = _mm256_set1_epi32(ld32((wp) + ldw));         \
            add16_into(&b10, _mm256_maddubs_epi16(X0, w1));           \
            add16_into(&b11, _mm256_maddubs_epi16(X1, w1));           \
        }                                                             \
        if (RB > 2) {                                                 \
            __m256i w2 = _mm256_set1_epi32(ld32((wp) + 2 * ldw));     \
            add16_into(&b20, _mm256_maddubs_epi16(X0, w2));           \
            add16_into(&b21, _mm256_maddubs_epi16(X1, w2));           \
        }                                                             \
    } while (0)
/* The six sums of a block widened into a32 [head][phase k0, k0 + 1],
 * shifted left by sh, stored (set) or added. */
#define BYTE_ROWS_WIDEN(sh, set)                                                                  \
    do {                                                                                         \
        widen_add(a32[0][k0], b00, sh, set), widen_add(a32[0][k0 + 1], b01, sh, set);             \
        if (RB > 1) widen_add(a32[1][k0], b10, sh, set), widen_add(a32[1][k0 + 1], b11, sh, set); \
        if (RB > 2) widen_add(a32[2][k0], b20, sh, set), widen_add(a32[2][k0 + 1], b21, sh, set); \
    } while (0)

/* Phases k0 and k0 + 1 of pairs [0, np) (np >= 1) of rows (pair p: rows 2p and
 * 2p + 1, rowb apart; `odd`: one row alone, its pair's second row 0) for half u of
 * a 32-byte chunk (u 0: row bytes 0-7 | 16-23, u 1: 8-15 | 24-31) and RB
 * heads, each block of BLK pairs summed in int16, then widened, shifted left
 * by sh and added to a32 [head][phase k0, k0 + 1][lanes of bytes 8u.. | 16 + 8u..]
 * (first: the pass's first call, whose first block stores instead: qk_page
 * -3.5% hot on a Zen 3 against zeroing a32 and adding to it).
 * wv: [head][pair] the pair's weight bytes
 * (x_a, x_b, x_a, x_b), ldw apart. Two phases per pass: 6 int16
 * accumulators, the codes of both phases, the mask and a weight fit the 16
 * ymm registers; the int32 sums stay in memory (one widening per block). */
AI void byte_rows(int32_t (*a32)[4][16], const uint8_t *rows, size_t rowb, int np, int odd,
                  const int32_t *wv, size_t ldw, size_t c, int nbytes, int u, int k0, int sh, int first,
                  int RB) {
    int p0 = 0;
    do { /* np >= 1: at least one block, so a first call always sets a32 */
        int p1 = np - p0 < BLK ? np : p0 + BLK;
        __m256i b00 = _mm256_setzero_si256(), b01 = b00, b10 = b00, b11 = b00, b20 = b00, b21 = b00;
        for (int p = p0; p < p1; p++) {
            __m256i X0, X1;
            pair_codes(&X0, &X1, rows + (size_t)(2 * p) * rowb, rowb, !odd, c, nbytes, u, k0, 0);
            BYTE_ROWS_STEP(X0, X1, wv + p);
        }
        BYTE_ROWS_WIDEN(sh, first && p0 == 0);
        p0 = p1;
    } while (p0 < np);
}

/* byte_rows for every pair of a pass in one int16 block: the D / 2 channel
 * pairs, then the high plane's rank pairs with their codes taken as 4 * c
 * (pair_codes' x4), so they add into the same sums. Used when the query's own bound says one block cannot
 * overflow (qk_byte8: sum_j 3 |x_j| + sum_k 12 |x_rank k| <= 32767, nearly
 * every real page); it saves the high plane's separate block and its 12
 * widenings a pass (a kitty page, 3 heads, on a family-23 EPYC: qk_page
 * 1,267-1,332 -> 1,178-1,196 ns hot, alternated builds). The integer sums are
 * exact either way, so the scores are the two-block path's bits. */
AI void byte_rows_fused(int32_t (*a32)[4][16], const uint8_t *lo, const uint8_t *hi, size_t rowb, int D,
                        int nb, const int32_t *wv, size_t ldw, size_t c, int nbytes, int u, int k0, int RB) {
    __m256i b00 = _mm256_setzero_si256(), b01 = b00, b10 = b00, b11 = b00, b20 = b00, b21 = b00;
    __m256i X0, X1;
    for (int p = 0; p < D / 2; p++) {
        pair_codes(&X0, &X1, lo + (size_t)(2 * p) * rowb, rowb, 1, c, nbytes, u, k0, 0);
        BYTE_ROWS_STEP(X0, X1, wv + p);
    }
    for (int p = 0; 2 * p < nb; p++) { /* an odd nb's last rank alone, its partner row 0 */
        pair_codes(&X0, &X1, hi + (size_t)(2 * p) * rowb, rowb, 2 * p + 1 < nb, c, nbytes, u, k0, 1);
        BYTE_ROWS_STEP(X0, X1, wv + D / 2 + p);
    }
    BYTE_ROWS_WIDEN(0, 1);
}
#undef BYTE_ROWS_STEP
#undef BYTE_ROWS_WIDEN

/* Tokens 4i .. 4i + 31 of 8 row bytes i from their phases' scores P0..P3
 * (token 4i + k: lane i of Pk): a 4 x 8 transpose, stored to out, the first
 * n of them. */
AI void phases_to_tokens(float *out, __m256 P0, __m256 P1, __m256 P2, __m256 P3, int n) {
    __m256 t0 = _mm256_unpacklo_ps(P0, P1), t1 = _mm256_unpackhi_ps(P0, P1);
    __m256 t2 = _mm256_unpacklo_ps(P2, P3), t3 = _mm256_unpackhi_ps(P2, P3);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE); /* bytes 0, 1 | 4, 5 */
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE); /* 2, 3 | 6, 7 */
    __m256 o[4] = {_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u2, u3, 0x20),
                   _mm256_permute2f128_ps(u0, u1, 0x31), _mm256_permute2f128_ps(u2, u3, 0x31)};
    if (n >= 32) {
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(out + 8 * i, o[i]);
        return;
    }
    float tmp[32];
    for (int i = 0; i < 4; i++) _mm256_storeu_ps(tmp + 8 * i, o[i]);
    memcpy(out, tmp, (size_t)n * sizeof *out);
}

/* Half u, phases k0 and k0 + 1 of one chunk for RB heads: their integer
 * sums into a32 [head][phase][lanes: bytes 8u..8u+7, 16+8u..16+8u+7]. */
AI void byte_pass(int32_t (*a32)[4][16], const int32_t *wv, size_t ldw, const uint8_t *lo, const uint8_t *hi,
                  size_t rowb, int D, int nb, size_t c, int nbytes, int u, int k0, int fused, int RB) {
    if (fused) {
        byte_rows_fused(a32, lo, hi, rowb, D, nb, wv, ldw, c, nbytes, u, k0, RB);
        return;
    }
    byte_rows(a32, lo, rowb, D / 2, 0, wv, ldw, c, nbytes, u, k0, 0, 1, RB); /* D >= 4: sets a32 */
    /* an odd nb's last row as a pair of its own: a test for it inside the
     * loop made GCC keep four of the accumulators on the stack */
    if (nb > 1) byte_rows(a32, hi, rowb, nb / 2, 0, wv + D / 2, ldw, c, nbytes, u, k0, 2, 0, RB);
    if (nb & 1) byte_rows(a32, hi + (size_t)(nb - 1) * rowb, rowb, 1, 1, wv + D / 2 + nb / 2, ldw, c, nbytes, u, k0, 2, 0, RB);
}

/* One 32-byte chunk (128 tokens) of RB heads: per half, both phase pairs,
 * then the scores d a + cst of the four phases interleaved into token order
 * at s (row stride G) straight from the integer sums (through a float
 * buffer of all four halves and phases, they took ~96 more memory
 * operations a page). lo: [D][rowb] rows, hi: [nb][rowb]; wv: [RB][ldw]
 * pair weights (the D / 2 channel pairs, then the high ranks' pairs). */
AI void byte_chunk(float *s, int G, const int32_t *wv, size_t ldw, const float *d, const float *cst,
                   const uint8_t *lo, const uint8_t *hi, int D, int nb, size_t c, int nbytes, int fused, int RB) {
    size_t rowb = (size_t)G / 4;
    int ntok = 4 * nbytes;
    for (int u = 0; u < 2 && 8 * u < nbytes; u++) {
        _Alignas(32) int32_t a32[RBB][4][16]; /* [head][phase][lanes: bytes 8u..8u+7, 16+8u..16+8u+7] */
        byte_pass(a32, wv, ldw, lo, hi, rowb, D, nb, c, nbytes, u, 0, fused, RB);
        /* phases 0-1 to memory now: GCC kept some in registers through the
         * next pass, whose loop then copied two accumulators in and out of
         * the registers it had left (29 instructions a pair, not 24) */
        __asm__ volatile("" : : "r"(a32) : "memory");
        byte_pass(a32, wv, ldw, lo, hi, rowb, D, nb, c, nbytes, u, 2, fused, RB);
        for (int r = 0; r < RB; r++) {
            __m256 vd = _mm256_set1_ps(d[r]), vc = _mm256_set1_ps(cst[r]);
            for (int h = 0; h < 2; h++) {
                int g = 16 * h + 8 * u; /* the first row byte of these lanes */
                if (4 * g >= ntok) break;
                __m256 P[4];
                for (int k = 0; k < 4; k++)
                    P[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_load_si256((const __m256i *)(const void *)(a32[r][k] + 8 * h))), vd, vc);
                phases_to_tokens(s + (size_t)r * G + 4 * c + 4 * g, P[0], P[1], P[2], P[3], ntok - 4 * g);
            }
        }
    }
}

/* Always inlined: the entry point calls it with the engines' shapes as constants. */
AI void qk_byte8(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    qk_page_view P;
    qk_page_view_of(&P, page, D, G, nb);
    size_t rowb = (size_t)G / 4;
    int npair = D / 2 + (nb + 1) / 2;
    for (int r0 = 0; r0 < n_rep; r0 += RBB) {
        int rb = n_rep - r0 < RBB ? n_rep - r0 : RBB;
        float d[RBB], cst[RBB];
        int16_t x[RBB][WX]; /* [head][D channels, the high ranks, zeros: 2 npair + 16 <= 400 <= WX] */
        if (!fold_query(x, d, cst, q + (size_t)r0 * D, rb, &P, D, nb, (float)QMAX8)) {
            kkv_avx2_qk_page(s, q, n_rep, page, D, G, nb);
            return;
        }
        int32_t wv[RBB][LDW]; /* [head][pair] bytes (x_a, x_b, x_a, x_b) */
        for (int r = 0; r < rb; r++) { /* 16 channels -> 8 pairs at a time */
            _mm256_storeu_si256((__m256i *)(void *)(x[r] + 2 * npair), _mm256_setzero_si256());
            for (int p = 0; p < npair; p += 8) {
                __m128i b = _mm_packs_epi16(_mm_loadu_si128((const __m128i *)(const void *)(x[r] + 2 * p)),
                                            _mm_loadu_si128((const __m128i *)(const void *)(x[r] + 2 * p + 8)));
                _mm_storeu_si128((__m128i *)(void *)(wv[r] + p), _mm_unpacklo_epi16(b, b));
                _mm_storeu_si128((__m128i *)(void *)(wv[r] + p + 4), _mm_unpackhi_epi16(b, b));
            }
        }
        /* one int16 block per pass when no partial sum can pass 32767:
         * codes <= 3 on the D channels, 4 * code <= 12 on the high ranks */
        int fused = 1;
        for (int r = 0; r < rb; r++) {
            int32_t bound = 0;
            for (int j = 0; j < D; j++) bound += 3 * abs(x[r][j]);
            for (int k = 0; k < nb; k++) bound += 12 * abs(x[r][D + k]);
            fused &= bound <= 32767;
        }
        float *sr = s + (size_t)r0 * G;
        for (size_t c = 0; c < rowb; c += 32) {
            int nbytes = rowb - c < 32 ? (int)(rowb - c) : 32;
            if (rb == 3) byte_chunk(sr, G, wv[0], LDW, d, cst, P.lo, P.hi, D, nb, c, nbytes, fused, 3);
            else if (rb == 2) byte_chunk(sr, G, wv[0], LDW, d, cst, P.lo, P.hi, D, nb, c, nbytes, fused, 2);
            else byte_chunk(sr, G, wv[0], LDW, d, cst, P.lo, P.hi, D, nb, c, nbytes, fused, 1);
        }
    }
}

void kkv_avx2_qk_byte(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    if (2 * nb > D) { /* mostly 4-bit keys: the 16-bit query */
        kkv_avx2_qk_wide(s, q, n_rep, page, D, G, nb);
        return;
    }
    KKV_QK_ENGINE_SHAPES(qk_byte8, s, q, n_rep, page, D, G, nb);
}
