/* AVX2 + FMA + F16C kernels. (The table's qk_page / pv_page are the integer
 * ones of attn_qkbyte_avx2.c (with attn_qkwide_avx2.c) and attn_int_avx2.c;
 * the float page kernels here are their fallback for inputs the integer path
 * cannot represent.) Attention works in the code domain of spec
 * section 7: per key page the channel scales fold into the query and the
 * per-channel minimums into one constant per query head; per value page the
 * token scales fold into the probabilities and the minimums into one constant
 * added to every channel. Every decoded code vector serves all query heads of
 * a GQA group. The flush codecs do the scalar codecs' float operations in the
 * same order (vectorised across channels, never across the summed tokens), so
 * their pages are byte-identical. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attn_simd.h"
#include "kernels/avx2_util.h"
#include "core/fp16.h"
#include "quant/quant.h"

/* Query heads handled together: their accumulators must fit in 16 registers. */
#define RB_MAX 3

/* ---------------------------------------------------------------- helpers */

AI __m256 ld8h(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)p));
}
/* 4 halves; lanes 4..7 are 0. */
AI __m256 ld4h(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)p));
}
AI uint32_t ld32(const uint8_t *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}
/* n < 4 bytes, zero-extended (the mask lets compilers see the bound) */
AI uint32_t ld32_part(const uint8_t *p, int n) {
    uint32_t w = 0;
    memcpy(&w, p, (size_t)(n & 3));
    return w;
}
AI float hmin(__m256 a) {
    __m128 x = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_min_ps(x, _mm_movehl_ps(x, x));
    x = _mm_min_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
/* vhaddps as two shuffles and an add, in its operand order ([a1+a0, a3+a2,
 * b1+b0, b3+b2] per 128-bit lane), so the same bits. On a Zen 3 the
 * instruction itself was the slower form: qk_f16 5.5-5.8 -> 5.1-5.4 ns per
 * token (3 heads, test_kernels --bench-f16), where hsum4's three of them per
 * head and 4 tokens competed with the FMAs. */
AI __m256 hadd_ps(__m256 a, __m256 b) {
    return _mm256_add_ps(_mm256_shuffle_ps(a, b, 0xDD), _mm256_shuffle_ps(a, b, 0x88));
}
/* [sum a0, sum a1, sum a2, sum a3] */
AI __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = hadd_ps(hadd_ps(a0, a1), hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* fp16 [n] (n a multiple of 4) to fp32; F16C rounds exactly as kkv_f16_to_f32. */
static void widen(float *dst, const uint16_t *src, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8h(src + i));
    for (; i < n; i += 4)
        _mm_storeu_ps(dst + i, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)(src + i))));
}

/* ---------------------------------------------------------------- q . k, fp16 */

/* RB query heads x TB (1 or 4) tokens. qp: [RB][Dp] zero-padded queries.
 * s: [RB][ld] scores of the TB tokens. */
AI void qk_f16_tile(float *s, size_t ld, const float *qp, int Dp, const uint16_t *k, int D,
                    int RB, int TB) {
    __m256 acc[RB_MAX][4];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < TB; i++) acc[r][i] = _mm256_setzero_ps();
    /* One key vector live at a time: RB*TB accumulators + RB queries + 1 key
     * = 16 registers at RB 3, TB 4. With all TB keys live (17) one
     * accumulator went to the stack, and its store-to-load round trip per
     * step set the loop's pace (Zen 3: 7.5 -> 5.5 ns per token with three
     * heads, test_kernels --bench-f16). Same operations, same order. */
    for (int j = 0; j < D; j += 8) {
        __m256 qv[RB_MAX];
        for (int r = 0; r < RB; r++) qv[r] = _mm256_loadu_ps(qp + (size_t)r * Dp + j);
        for (int i = 0; i < TB; i++) {
            /* the last 4 channels of D % 8 == 4: the padded query lanes are 0 */
            __m256 kv = j + 8 <= D ? ld8h(k + (size_t)i * D + j) : ld4h(k + (size_t)i * D + j);
            for (int r = 0; r < RB; r++) acc[r][i] = _mm256_fmadd_ps(qv[r], kv, acc[r][i]);
        }
    }
    for (int r = 0; r < RB; r++) {
        if (TB == 4) _mm_storeu_ps(s + (size_t)r * ld, hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
        else s[(size_t)r * ld] = hsum(acc[r][0]);
    }
}

AI void qk_f16_rb(float *s, size_t ld, const float *qp, int Dp, const uint16_t *k, int n, int D,
                  int RB, const void *pf) {
    int t = 0;
    for (; t + 4 <= n; t += 4) {
        pf_rows(pf, t, t + 4, D);
        qk_f16_tile(s + t, ld, qp, Dp, k + (size_t)t * D, D, RB, 4);
    }
    pf_rows(pf, t, n, D);
    for (; t < n; t++) qk_f16_tile(s + t, ld, qp, Dp, k + (size_t)t * D, D, RB, 1);
}

void kkv_avx2_qk_f16(float *s, const float *q, int n_rep, const uint16_t *k, int n, int D,
                     const void *pf) {
    float qp[RB_MAX][KKV_MAX_HEAD_DIM + 8]; /* [RB][Dp] */
    int Dp = (D + 7) & ~7;
    for (int r0 = 0; r0 < n_rep; r0 += RB_MAX) {
        int rb = n_rep - r0 < RB_MAX ? n_rep - r0 : RB_MAX;
        for (int r = 0; r < rb; r++) {
            memcpy(qp[r], q + (size_t)(r0 + r) * D, (size_t)D * sizeof(float));
            for (int j = D; j < Dp; j++) qp[r][j] = 0.0f;
        }
        float *sr = s + (size_t)r0 * n;
        const void *f = r0 == 0 ? pf : NULL; /* the first pass over the rows prefetches */
        if (rb == 3) qk_f16_rb(sr, (size_t)n, qp[0], KKV_MAX_HEAD_DIM + 8, k, n, D, 3, f);
        else if (rb == 2) qk_f16_rb(sr, (size_t)n, qp[0], KKV_MAX_HEAD_DIM + 8, k, n, D, 2, f);
        else qk_f16_rb(sr, (size_t)n, qp[0], KKV_MAX_HEAD_DIM + 8, k, n, D, 1, f);
    }
}

/* ---------------------------------------------------------------- p . v, fp16 */

/* Channels [j, j + 8*NV) of RB query heads over n tokens. ap: [RB][ldA]
 * padded accumulators. The last vector may hold only 4 real channels. */
AI void pv_f16_tile(float *ap, int ldA, const float *p, size_t ldp, const uint16_t *v, int n,
                    int D, int j, int NV, int half, int RB, const void *pf) {
    __m256 acc[RB_MAX][4];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NV; i++) acc[r][i] = _mm256_loadu_ps(ap + (size_t)r * ldA + j + 8 * i);
    for (int t = 0; t < n; t++) {
        pf_rows(pf, t, t + 1, D);
        const uint16_t *row = v + (size_t)t * D + j;
        /* one value vector live at a time (see qk_f16_tile: 16 registers, no
         * spilled accumulator; Zen 3: 9.2 -> 4.4 ns per token, three heads) */
        __m256 b[RB_MAX];
        for (int r = 0; r < RB; r++) b[r] = _mm256_broadcast_ss(p + (size_t)r * ldp + t);
        for (int i = 0; i < NV; i++) {
            __m256 x = (half && i == NV - 1) ? ld4h(row + 8 * i) : ld8h(row + 8 * i);
            for (int r = 0; r < RB; r++) acc[r][i] = _mm256_fmadd_ps(b[r], x, acc[r][i]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NV; i++) _mm256_storeu_ps(ap + (size_t)r * ldA + j + 8 * i, acc[r][i]);
}

/* pf: prefetched during the first channel tile only. */
AI void pv_f16_rb(float *ap, int ldA, const float *p, size_t ldp, const uint16_t *v, int n,
                  int D, int RB, const void *pf) {
    int j = 0;
    for (; j + 32 <= D; j += 32, pf = NULL) pv_f16_tile(ap, ldA, p, ldp, v, n, D, j, 4, 0, RB, pf);
    int left = D - j; /* 0..28, a multiple of 4 */
    if (left == 0) return;
    int nv = (left + 7) / 8, half = left % 8 != 0;
    if (nv == 1) pv_f16_tile(ap, ldA, p, ldp, v, n, D, j, 1, half, RB, pf);
    else if (nv == 2) pv_f16_tile(ap, ldA, p, ldp, v, n, D, j, 2, half, RB, pf);
    else if (nv == 3) pv_f16_tile(ap, ldA, p, ldp, v, n, D, j, 3, half, RB, pf);
    else pv_f16_tile(ap, ldA, p, ldp, v, n, D, j, 4, half, RB, pf);
}

void kkv_avx2_pv_f16(float *acc, const float *p, int n_rep, const uint16_t *v, int n, int D,
                     const void *pf) {
    enum { LDA = KKV_MAX_HEAD_DIM + 8 };
    float ap[RB_MAX][LDA]; /* [RB][Dp] padded accumulators */
    for (int r0 = 0; r0 < n_rep; r0 += RB_MAX) {
        int rb = n_rep - r0 < RB_MAX ? n_rep - r0 : RB_MAX;
        for (int r = 0; r < rb; r++) {
            memcpy(ap[r], acc + (size_t)(r0 + r) * D, (size_t)D * sizeof(float));
            for (int j = D; j < LDA; j++) ap[r][j] = 0.0f;
        }
        const float *pr = p + (size_t)r0 * n;
        const void *f = r0 == 0 ? pf : NULL;
        if (rb == 3) pv_f16_rb(ap[0], LDA, pr, (size_t)n, v, n, D, 3, f);
        else if (rb == 2) pv_f16_rb(ap[0], LDA, pr, (size_t)n, v, n, D, 2, f);
        else pv_f16_rb(ap[0], LDA, pr, (size_t)n, v, n, D, 1, f);
        for (int r = 0; r < rb; r++) memcpy(acc + (size_t)(r0 + r) * D, ap[r], (size_t)D * sizeof(float));
    }
}

/* ---------------------------------------------------------------- q . k, key page */

/* 16 tokens of one 2-bit row word w (token i at bits 2i) as two float vectors. */
AI void dec16(__m256 *f0, __m256 *f1, __m256i x) {
    const __m256i sh0 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i sh1 = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    const __m256i m3 = _mm256_set1_epi32(3);
    *f0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(x, sh0), m3));
    *f1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(x, sh1), m3));
}
/* The same with a high plane: code = lo | hi << 2. */
AI void dec16_hi(__m256 *f0, __m256 *f1, __m256i x, __m256i y) {
    const __m256i sh0 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i sh1 = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    const __m256i m3 = _mm256_set1_epi32(3);
    __m256i a = _mm256_and_si256(_mm256_srlv_epi32(x, sh0), m3);
    __m256i b = _mm256_and_si256(_mm256_srlv_epi32(x, sh1), m3);
    a = _mm256_or_si256(a, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(y, sh0), m3), 2));
    b = _mm256_or_si256(b, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(y, sh1), m3), 2));
    *f0 = _mm256_cvtepi32_ps(a);
    *f1 = _mm256_cvtepi32_ps(b);
}

/* Channel lists of a key page: plain 2-bit channels, and boosted ones with
 * their high-plane row. */
typedef struct chans {
    int     n_lo, n_hi;
    uint8_t lo[KKV_MAX_HEAD_DIM]; /* [n_lo] channel */
    uint8_t hi[KKV_MAX_HEAD_DIM]; /* [n_hi] channel */
    uint8_t hr[KKV_MAX_HEAD_DIM]; /* [n_hi] row in the hi plane */
} chans;

/* Scores of 16 tokens starting at byte b of each row (nbytes = 4, or 1..3 at
 * the page end) for RB query heads. qs: [RB][ldq] folded queries. */
AI void qk_page_blk(float *s, size_t ld, int ntok, const float *qs, int ldq, const uint8_t *lo,
                    const uint8_t *hi, size_t row, int b, int nbytes, const chans *C,
                    const float *cst, int RB) {
    __m256 acc[RB_MAX][2];
    for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int i = 0; i < C->n_lo; i++) {
        int j = C->lo[i];
        const uint8_t *pl = lo + (size_t)j * row + b;
        __m256 f0, f1;
        dec16(&f0, &f1, _mm256_set1_epi32((int)(nbytes == 4 ? ld32(pl) : ld32_part(pl, nbytes))));
        for (int r = 0; r < RB; r++) {
            __m256 w = _mm256_broadcast_ss(qs + (size_t)r * ldq + j);
            acc[r][0] = _mm256_fmadd_ps(w, f0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(w, f1, acc[r][1]);
        }
    }
    for (int i = 0; i < C->n_hi; i++) {
        int j = C->hi[i];
        const uint8_t *pl = lo + (size_t)j * row + b, *ph = hi + (size_t)C->hr[i] * row + b;
        __m256 f0, f1;
        __m256i x = _mm256_set1_epi32((int)(nbytes == 4 ? ld32(pl) : ld32_part(pl, nbytes)));
        __m256i y = _mm256_set1_epi32((int)(nbytes == 4 ? ld32(ph) : ld32_part(ph, nbytes)));
        dec16_hi(&f0, &f1, x, y);
        for (int r = 0; r < RB; r++) {
            __m256 w = _mm256_broadcast_ss(qs + (size_t)r * ldq + j);
            acc[r][0] = _mm256_fmadd_ps(w, f0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(w, f1, acc[r][1]);
        }
    }
    for (int r = 0; r < RB; r++) {
        __m256 c = _mm256_set1_ps(cst[r]);
        __m256 s0 = _mm256_add_ps(acc[r][0], c), s1 = _mm256_add_ps(acc[r][1], c);
        if (ntok == 16) {
            _mm256_storeu_ps(s + (size_t)r * ld, s0);
            _mm256_storeu_ps(s + (size_t)r * ld + 8, s1);
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, s0);
            _mm256_storeu_ps(tmp + 8, s1);
            memcpy(s + (size_t)r * ld, tmp, (size_t)ntok * sizeof(float));
        }
    }
}

AI void qk_page_rb(float *s, const float *qs, int ldq, int G, const uint8_t *lo, const uint8_t *hi,
                   const chans *C, const float *cst, int RB) {
    size_t row = (size_t)G / 4;
    int t = 0;
    for (; t + 16 <= G; t += 16)
        qk_page_blk(s + t, (size_t)G, 16, qs, ldq, lo, hi, row, t / 4, 4, C, cst, RB);
    if (t < G) qk_page_blk(s + t, (size_t)G, G - t, qs, ldq, lo, hi, row, t / 4, (G - t) / 4, C, cst, RB);
}

/* fp16 [n] of a page (n a multiple of 4) to fp32. */
static void page_f16(float *dst, const uint8_t *src, int n) {
    widen(dst, (const uint16_t *)(const void *)src, (size_t)n); /* unaligned loads */
}

void kkv_avx2_qk_page(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                      int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    const uint8_t *idx = page + L.idx;
    float scale[KKV_MAX_HEAD_DIM], mn[KKV_MAX_HEAD_DIM]; /* [D] */
    float qs[RB_MAX][KKV_MAX_HEAD_DIM];                  /* [RB][D] q * scale */
    float cst[RB_MAX];                                   /* sum_j q_j * mn_j */
    chans C;
    page_f16(scale, page + L.scale, D);
    page_f16(mn, page + L.mn, D);
    C.n_lo = C.n_hi = 0;
    for (int j = 0; j < D; j++) {
        if (idx[j] < nb) {
            C.hi[C.n_hi] = (uint8_t)j;
            C.hr[C.n_hi++] = idx[j];
        } else {
            C.lo[C.n_lo++] = (uint8_t)j;
        }
    }
    for (int r0 = 0; r0 < n_rep; r0 += RB_MAX) {
        int rb = n_rep - r0 < RB_MAX ? n_rep - r0 : RB_MAX;
        for (int r = 0; r < rb; r++) {
            const float *qr = q + (size_t)(r0 + r) * D;
            __m256 c = _mm256_setzero_ps();
            int j = 0;
            for (; j + 8 <= D; j += 8) {
                __m256 qv = _mm256_loadu_ps(qr + j);
                _mm256_storeu_ps(qs[r] + j, _mm256_mul_ps(qv, _mm256_loadu_ps(scale + j)));
                c = _mm256_fmadd_ps(qv, _mm256_loadu_ps(mn + j), c);
            }
            float ct = hsum(c);
            for (; j < D; j++) {
                qs[r][j] = qr[j] * scale[j];
                ct += qr[j] * mn[j];
            }
            cst[r] = ct;
        }
        float *sr = s + (size_t)r0 * G;
        const uint8_t *lo = page + L.lo, *hi = page + L.hi;
        if (rb == 3) qk_page_rb(sr, qs[0], KKV_MAX_HEAD_DIM, G, lo, hi, &C, cst, 3);
        else if (rb == 2) qk_page_rb(sr, qs[0], KKV_MAX_HEAD_DIM, G, lo, hi, &C, cst, 2);
        else qk_page_rb(sr, qs[0], KKV_MAX_HEAD_DIM, G, lo, hi, &C, cst, 1);
    }
}

/* ---------------------------------------------------------------- p . v, value page */

/* 16 channels of one token from the 32-bit word at their codes: 2-bit codes
 * (one word), or 4-bit codes (words x, y: channels 0..7, 8..15). */
AI void dec16_v4(__m256 *f0, __m256 *f1, __m256i x, __m256i y) {
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i m15 = _mm256_set1_epi32(15);
    *f0 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(x, sh), m15));
    *f1 = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srlv_epi32(y, sh), m15));
}

/* Channels [j, j+16) of RB query heads over n tokens. w: [RB][ldw] folded
 * probabilities p * scale. codes: the page's code rows (rb bytes each). cb:
 * bytes of these 16 channels present in a row (bits 2: 4, bits 4: 8; less at
 * the row end). ap: [RB][ldA] padded accumulators. */
AI void pv_page_blk(float *ap, int ldA, const float *w, int ldw, const uint8_t *codes, size_t rb,
                    int n, int j, int cb, int bits, int RB) {
    __m256 acc[RB_MAX][2];
    for (int r = 0; r < RB; r++) {
        acc[r][0] = _mm256_loadu_ps(ap + (size_t)r * ldA + j);
        acc[r][1] = _mm256_loadu_ps(ap + (size_t)r * ldA + j + 8);
    }
    size_t off = (size_t)j * (size_t)bits / 8;
    for (int t = 0; t < n; t++) {
        const uint8_t *pc = codes + (size_t)t * rb + off;
        __m256 f0, f1;
        if (bits == 2) {
            dec16(&f0, &f1, _mm256_set1_epi32((int)(cb == 4 ? ld32(pc) : ld32_part(pc, cb))));
        } else {
            uint32_t a, b = 0;
            if (cb == 8) {
                a = ld32(pc);
                b = ld32(pc + 4);
            } else if (cb >= 4) {
                a = ld32(pc);
                if (cb > 4) b = ld32_part(pc + 4, cb - 4);
            } else {
                a = ld32_part(pc, cb);
            }
            dec16_v4(&f0, &f1, _mm256_set1_epi32((int)a), _mm256_set1_epi32((int)b));
        }
        for (int r = 0; r < RB; r++) {
            __m256 bw = _mm256_broadcast_ss(w + (size_t)r * ldw + t);
            acc[r][0] = _mm256_fmadd_ps(bw, f0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(bw, f1, acc[r][1]);
        }
    }
    for (int r = 0; r < RB; r++) {
        _mm256_storeu_ps(ap + (size_t)r * ldA + j, acc[r][0]);
        _mm256_storeu_ps(ap + (size_t)r * ldA + j + 8, acc[r][1]);
    }
}

AI void pv_page_rb(float *ap, int ldA, const float *w, int ldw, const uint8_t *codes, int n,
                   int D, int bits, int RB) {
    size_t rb = (size_t)D * (size_t)bits / 8;
    int full = bits == 2 ? 4 : 8;
    int j = 0;
    for (; j + 16 <= D; j += 16) pv_page_blk(ap, ldA, w, ldw, codes, rb, n, j, full, bits, RB);
    if (j < D) pv_page_blk(ap, ldA, w, ldw, codes, rb, n, j, (D - j) * bits / 8, bits, RB);
}

/* Tokens of a value page processed per pass, bounding the folded-probability
 * scratch. */
#define PV_CHUNK 128

void kkv_avx2_pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                      int bits) {
    enum { LDA = KKV_MAX_HEAD_DIM + 16 };
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    size_t rowb = (size_t)D * (size_t)bits / 8;
    float ap[RB_MAX][LDA];         /* [RB][Dp] padded accumulators */
    float w[RB_MAX][PV_CHUNK];     /* [RB][chunk] p * scale */
    float sc[PV_CHUNK], mn[PV_CHUNK];
    for (int r0 = 0; r0 < n_rep; r0 += RB_MAX) {
        int rbn = n_rep - r0 < RB_MAX ? n_rep - r0 : RB_MAX;
        __m256 mt[RB_MAX]; /* sum_t p_t * mn_t, per head */
        for (int r = 0; r < rbn; r++) {
            memcpy(ap[r], acc + (size_t)(r0 + r) * D, (size_t)D * sizeof(float));
            for (int j = D; j < LDA; j++) ap[r][j] = 0.0f;
            mt[r] = _mm256_setzero_ps();
        }
        for (int t0 = 0; t0 < G; t0 += PV_CHUNK) {
            int n = G - t0 < PV_CHUNK ? G - t0 : PV_CHUNK; /* a multiple of 4 */
            page_f16(sc, page + L.scale + 2 * (size_t)t0, n);
            page_f16(mn, page + L.mn + 2 * (size_t)t0, n);
            int n8 = (n + 7) & ~7;
            for (int t = n; t < n8; t++) sc[t] = mn[t] = 0.0f;
            for (int r = 0; r < rbn; r++) {
                const float *pr = p + (size_t)(r0 + r) * G + t0;
                int t = 0;
                for (; t + 8 <= n; t += 8) {
                    __m256 pv = _mm256_loadu_ps(pr + t);
                    _mm256_storeu_ps(w[r] + t, _mm256_mul_ps(pv, _mm256_loadu_ps(sc + t)));
                    mt[r] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(mn + t), mt[r]);
                }
                if (t < n) { /* 4 left */
                    __m128 pv = _mm_loadu_ps(pr + t);
                    _mm_storeu_ps(w[r] + t, _mm_mul_ps(pv, _mm_loadu_ps(sc + t)));
                    mt[r] = _mm256_fmadd_ps(_mm256_insertf128_ps(_mm256_setzero_ps(), pv, 0), _mm256_loadu_ps(mn + t), mt[r]);
                }
            }
            const uint8_t *codes = page + L.codes + (size_t)t0 * rowb;
            if (rbn == 3) pv_page_rb(ap[0], LDA, w[0], PV_CHUNK, codes, n, D, bits, 3);
            else if (rbn == 2) pv_page_rb(ap[0], LDA, w[0], PV_CHUNK, codes, n, D, bits, 2);
            else pv_page_rb(ap[0], LDA, w[0], PV_CHUNK, codes, n, D, bits, 1);
        }
        for (int r = 0; r < rbn; r++) {
            __m256 m = _mm256_set1_ps(hsum(mt[r]));
            float *ar = acc + (size_t)(r0 + r) * D;
            int j = 0;
            for (; j + 8 <= D; j += 8) _mm256_storeu_ps(ar + j, _mm256_add_ps(_mm256_loadu_ps(ap[r] + j), m));
            for (; j < D; j++) ar[j] = ap[r][j] + _mm256_cvtss_f32(m);
        }
    }
}

/* ---------------------------------------------------------------- online softmax */

/* One head's s [n] = e^(s inv - mx), returning their sum: 32 scores a
 * step, four vectors' exponentials side by side (kkv_exp_soft8x4); the
 * last 1..31 through a zero-padded copy with the pad lanes masked off, so
 * that its vectors join the same chains (adding +0 changes no sum).
 * Vector t / 8 goes into chain (t / 8) % 2, two named registers: a chain
 * picked by index kept both on the stack, and each add waited for the
 * store of the one before it (~2.5x slower on a Zen 3). */
static float exp_scores(float *s, int n, __m256 vinv, float mx) {
    __m256 vmx = _mm256_set1_ps(mx), vs0 = _mm256_setzero_ps(), vs1 = _mm256_setzero_ps();
    for (int t = 0; t < n; t += 32) {
        _Alignas(32) float tmp[32];
        int k = n - t;
        float *p = s + t;
        if (k < 32) {
            memset(tmp, 0, sizeof tmp);
            memcpy(tmp, p, (size_t)k * sizeof(float));
            p = tmp;
        }
        __m256 e[4];
        for (int i = 0; i < 4; i++) e[i] = _mm256_fmsub_ps(_mm256_loadu_ps(p + 8 * i), vinv, vmx);
        kkv_exp_soft8x4(e);
        if (k < 32)
            for (int i = 0; i < 4; i++) e[i] = _mm256_and_ps(e[i], _mm256_castsi256_ps(lanes(k - 8 * i)));
        for (int i = 0; i < 4; i++) _mm256_storeu_ps(p + 8 * i, e[i]);
        if (k < 32) memcpy(s + t, tmp, (size_t)k * sizeof(float));
        vs0 = _mm256_add_ps(vs0, e[0]);
        vs1 = _mm256_add_ps(vs1, e[1]);
        vs0 = _mm256_add_ps(vs0, e[2]);
        vs1 = _mm256_add_ps(vs1, e[3]);
    }
    return hsum(_mm256_add_ps(vs0, vs1));
}

/* The raw maxima of K heads' scores (K a constant where inlined, 1..4),
 * their chains side by side. One head at a time, each head's exponentials
 * waited for its own max chain and reduction; with the maxima of up to four
 * heads found first, the softmax of 3 heads x 128 tokens went from 205 to
 * 177 ns hot (the AVX2 table on an Intel Xeon, KKV_CPU=avx2). The maximum
 * is exact in any order, so the bits are the same. */
AI void raw_max_heads(float *raw, const float *sc, const int K, int n) {
    __m256 vm[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < K; r++) vm[r] = _mm256_set1_ps(-INFINITY);
    int t = 0;
    for (; t + 8 <= n; t += 8)
        _Pragma("GCC unroll 4") for (int r = 0; r < K; r++)
            vm[r] = _mm256_max_ps(vm[r], _mm256_loadu_ps(sc + (size_t)r * n + t));
    _Pragma("GCC unroll 4") for (int r = 0; r < K; r++) {
        const float *s = sc + (size_t)r * n;
        raw[r] = hmax(vm[r]);
        for (int u = t; u < n; u++) raw[r] = s[u] > raw[r] ? s[u] : raw[r];
    }
}

/* The scaling by inv (> 0) is fused into the exponent's argument,
 * x = fmsub(s, inv, m): the first pass only finds the raw maximum, and
 * round(max s * inv) = max round(s * inv) since rounding is monotone, so the
 * running max is the unfused form's. The sum runs as two chains, even and
 * odd vectors (the AVX-512 kernel's low and high halves), which halves its
 * latency. With the exponential's degree-6 polynomial (was 7; now
 * kkv_exp_soft's degree 5) the AVX-512 softmax of
 * a 128-token block for 3 heads went from ~105 to ~88 ns (Zen 5). The fused
 * argument is also the more accurate one: s * inv - m rounded once, where the
 * unfused form lost up to ulp(s * inv) / 2 to cancellation. The rescale of
 * acc, skipped when the max held, is softmax_close (avx2_util.h).
 * Four vectors' exponentials go step by step side by side (kkv_exp_soft8x4,
 * the same bits): on a family-23 EPYC (one 256-bit FMA a cycle) the softmax
 * of 128 tokens for 3 heads went from 511-547 to 437-480 ns hot
 * (test_kernels --bench-pages, alternated builds), where two vectors a
 * step left the FMA pipes waiting on each exponential's ~60-cycle chain.
 * The exponential is kkv_exp_soft (core/exp_poly.h), two operations a
 * vector fewer than the activations' kkv_exp_poly at the same accuracy:
 * on the same EPYC the softmax of 3 heads x 128 tokens went from ~340 to
 * ~300 ns as a loop in a harness, but only 4-5% in the library, where the
 * same loop's speed moved by +-10% with where the code landed (builds that
 * differed elsewhere). */
void kkv_avx2_softmax(float *sc, float *ml, float *acc, int n_rep, int n, int D, float inv) {
    __m256 vinv = _mm256_set1_ps(inv);
    for (int r0 = 0; r0 < n_rep; r0 += 4) {
        float raw[4];
        int k = n_rep - r0 < 4 ? n_rep - r0 : 4;
        const float *s0 = sc + (size_t)r0 * n;
        switch (k) {
        case 4: raw_max_heads(raw, s0, 4, n); break;
        case 3: raw_max_heads(raw, s0, 3, n); break;
        case 2: raw_max_heads(raw, s0, 2, n); break;
        default: raw_max_heads(raw, s0, 1, n); break;
        }
        for (int r = r0; r < r0 + k; r++) {
            float m_old = ml[2 * r], mx = raw[r - r0] * inv;
            mx = m_old > mx ? m_old : mx;
            softmax_close(acc + (size_t)r * D, ml + 2 * r, D, m_old, mx, exp_scores(sc + (size_t)r * n, n, vinv, mx));
        }
    }
}

/* ---------------------------------------------------------------- page flush */

/* Low byte of each int32 lane, as 8 bytes. */
AI void lane_bytes(uint8_t *dst, __m256i v) {
    __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(v, v), _mm256_setzero_si256());
    uint32_t lo = (uint32_t)_mm256_cvtsi256_si32(b), hi = (uint32_t)_mm256_extract_epi32(b, 4);
    memcpy(dst, &lo, 4);
    memcpy(dst + 4, &hi, 4);
}

/* kkv_quant_code() on 8 lanes: x, mn, scale as the scalar codec sees them;
 * maxq per lane. Same division, same +0.5, same clamps. */
AI __m256i quant8(__m256 x, __m256 mn, __m256 scale, __m256 maxq) {
    __m256 y = _mm256_add_ps(_mm256_div_ps(_mm256_sub_ps(x, mn), scale), _mm256_set1_ps(0.5f));
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_GE_OQ),
                              _mm256_cmp_ps(scale, _mm256_setzero_ps(), _CMP_NEQ_OQ));
    y = _mm256_min_ps(y, maxq); /* y >= maxq gives maxq; NaN lanes are masked below */
    y = _mm256_and_ps(y, ok);
    return _mm256_cvttps_epi32(y);
}

/* Magnitude or variance scores of the D channels of k: [G][D], summed over
 * tokens in order per channel exactly like select.c. */
static void rank_simd(uint8_t *order, const float *k, int D, int G, kkv_select sel) {
    float sum[KKV_MAX_HEAD_DIM + 8] = {0}, dev[KKV_MAX_HEAD_DIM + 8] = {0};
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int j = 0; j < D; j += 8) {
        __m256i m = lanes(D - j < 8 ? 4 : 8);
        __m256 acc = _mm256_setzero_ps();
        for (int t = 0; t < G; t++) {
            __m256 x = _mm256_maskload_ps(k + (size_t)t * D + j, m);
            acc = _mm256_add_ps(acc, sel == KKV_SELECT_VARIANCE ? x : _mm256_and_ps(x, abs_mask));
        }
        if (sel == KKV_SELECT_VARIANCE) {
            __m256 mean = _mm256_div_ps(acc, _mm256_set1_ps((float)G));
            __m256 d2 = _mm256_setzero_ps();
            for (int t = 0; t < G; t++) {
                __m256 d = _mm256_sub_ps(_mm256_maskload_ps(k + (size_t)t * D + j, m), mean);
                d2 = _mm256_add_ps(d2, _mm256_mul_ps(d, d));
            }
            _mm256_storeu_ps(dev + j, d2);
        } else {
            _mm256_storeu_ps(sum + j, acc);
        }
    }
    kkv_order_channels(order, sel == KKV_SELECT_VARIANCE ? dev : sum, D);
}

void kkv_avx2_key_encode(uint8_t *page, float *tmp, const uint16_t *k, int D, int G, int nb,
                         kkv_select sel, uint64_t seed, uint64_t page_no, const uint8_t *rank) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    size_t row = (size_t)G / 4;
    uint8_t order[KKV_MAX_HEAD_DIM];
    widen(tmp, k, (size_t)G * D); /* [G][D] */
    if (sel == KKV_SELECT_MAGNITUDE || sel == KKV_SELECT_VARIANCE) rank_simd(order, tmp, D, G, sel);
    else kkv_rank_channels(order, tmp, D, G, sel, seed, page_no, rank);

    memset(page, 0, L.bytes);
    uint8_t *idx = page + L.idx;
    memset(idx, nb, (size_t)D);
    for (int r = 0; r < nb; r++) idx[order[r]] = (uint8_t)r;

    /* per-channel min/max: tokens in order, min_ps(x, m) keeps m on ties
     * (signed zeros) exactly like the scalar x < m ? x : m */
    float mnv[KKV_MAX_HEAD_DIM + 8], scv[KKV_MAX_HEAD_DIM + 8], mq[KKV_MAX_HEAD_DIM + 8];
    for (int j = 0; j < D; j += 8) {
        __m256i m = lanes(D - j < 8 ? 4 : 8);
        __m256 lo = _mm256_maskload_ps(tmp + j, m), hi = lo;
        for (int t = 1; t < G; t++) {
            __m256 x = _mm256_maskload_ps(tmp + (size_t)t * D + j, m);
            lo = _mm256_min_ps(x, lo);
            hi = _mm256_max_ps(x, hi);
        }
        float a[8], b[8];
        _mm256_storeu_ps(a, lo);
        _mm256_storeu_ps(b, hi);
        for (int i = 0; i < 8 && j + i < D; i++) {
            int c = j + i, boosted = idx[c] < nb;
            kkv_qparams p = kkv_qparams_of(a[i], b[i], boosted ? 4 : 2);
            kkv_st16(page + L.scale + 2 * (size_t)c, p.scale16);
            kkv_st16(page + L.mn + 2 * (size_t)c, p.mn16);
            mnv[c] = p.mn;
            scv[c] = p.scale;
            mq[c] = boosted ? 15.0f : 3.0f;
        }
    }
    for (int c = D; c < D + 8; c++) mnv[c] = scv[c] = mq[c] = 0.0f;

    uint8_t lob[KKV_MAX_HEAD_DIM + 8], hib[KKV_MAX_HEAD_DIM + 8]; /* [D] one byte per channel */
    uint8_t *plo = page + L.lo, *phi = page + L.hi;
    for (int t = 0; t < G; t += 4) {
        for (int j = 0; j < D; j += 8) {
            __m256i m = lanes(D - j < 8 ? 4 : 8);
            __m256 vm = _mm256_loadu_ps(mnv + j), vs = _mm256_loadu_ps(scv + j);
            __m256 vq = _mm256_loadu_ps(mq + j);
            __m256i l = _mm256_setzero_si256(), h = _mm256_setzero_si256();
            for (int i = 0; i < 4; i++) {
                __m256i q = quant8(_mm256_maskload_ps(tmp + (size_t)(t + i) * D + j, m), vm, vs, vq);
                l = _mm256_or_si256(l, _mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(3)), 2 * i));
                h = _mm256_or_si256(h, _mm256_slli_epi32(_mm256_srli_epi32(q, 2), 2 * i));
            }
            lane_bytes(lob + j, l);
            lane_bytes(hib + j, h);
        }
        for (int c = 0; c < D; c++) {
            plo[(size_t)c * row + t / 4] = lob[c];
            if (idx[c] < nb) phi[(size_t)idx[c] * row + t / 4] = hib[c];
        }
    }
}

/* Bytes of 8 codes packed along channels: 2 bits (2 bytes) or 4 bits (4). */
AI void pack8(uint8_t *dst, __m256i q, int bits) {
    if (bits == 2) {
        __m256i v = _mm256_sllv_epi32(q, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
        v = _mm256_hadd_epi32(v, v);
        v = _mm256_hadd_epi32(v, v); /* lane 0: channels 0..3, lane 4: 4..7 */
        dst[0] = (uint8_t)_mm256_cvtsi256_si32(v);
        dst[1] = (uint8_t)_mm256_extract_epi32(v, 4);
    } else {
        __m256i v = _mm256_sllv_epi32(q, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
        v = _mm256_hadd_epi32(v, v); /* lanes 0,1: bytes 0,1; lanes 4,5: bytes 2,3 */
        dst[0] = (uint8_t)_mm256_cvtsi256_si32(v);
        dst[1] = (uint8_t)_mm256_extract_epi32(v, 1);
        dst[2] = (uint8_t)_mm256_extract_epi32(v, 4);
        dst[3] = (uint8_t)_mm256_extract_epi32(v, 5);
    }
}

void kkv_avx2_value_encode(uint8_t *page, float *tmp, const uint16_t *v, int D, int G,
                           int bits) {
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    size_t row = (size_t)D * (size_t)bits / 8;
    __m256 maxq = _mm256_set1_ps((float)((1 << bits) - 1));
    widen(tmp, v, (size_t)G * D); /* [G][D] */
    memset(page, 0, L.bytes);
    for (int t = 0; t < G; t++) {
        const float *x = tmp + (size_t)t * D;
        __m256 first = _mm256_set1_ps(x[0]), lo = first, hi = first;
        for (int j = 0; j < D; j += 8) {
            __m256i m = lanes(D - j < 8 ? 4 : 8);
            __m256 y = _mm256_blendv_ps(first, _mm256_maskload_ps(x + j, m), _mm256_castsi256_ps(m));
            lo = _mm256_min_ps(y, lo);
            hi = _mm256_max_ps(y, hi);
        }
        float mn = hmin(lo), mx = hmax(hi);
        /* A zero extreme may be +0 or -0 depending on which came first: take
         * the scalar codec's pick (the first in channel order). */
        if (mn == 0.0f || mx == 0.0f) {
            mn = mx = x[0];
            for (int c = 1; c < D; c++) {
                mn = x[c] < mn ? x[c] : mn;
                mx = x[c] > mx ? x[c] : mx;
            }
        }
        kkv_qparams p = kkv_qparams_of(mn, mx, bits);
        kkv_st16(page + L.scale + 2 * (size_t)t, p.scale16);
        kkv_st16(page + L.mn + 2 * (size_t)t, p.mn16);
        __m256 vm = _mm256_set1_ps(p.mn), vs = _mm256_set1_ps(p.scale);
        uint8_t *codes = page + L.codes + (size_t)t * row;
        for (int j = 0; j < D; j += 8) {
            int n = D - j < 8 ? 4 : 8;
            __m256i q = quant8(_mm256_maskload_ps(x + j, lanes(n)), vm, vs, maxq);
            uint8_t b[4];
            pack8(b, q, bits);
            memcpy(codes + (size_t)j * bits / 8, b, (size_t)n * bits / 8);
        }
    }
}

const kkv_ops kkv_ops_avx2 = {
    .kind = KKV_KERNEL_AVX2,
    .qk_f16 = kkv_avx2_qk_f16,
    .qk_page = kkv_avx2_qk_byte,
    .pv_f16 = kkv_avx2_pv_f16,
    .pv_page = kkv_avx2i_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx2_softmax,
};

/* The AVX2 table with the AVX-VNNI value kernel (dispatch picks it where
 * cpu->avxvnni); results bit-identical to kkv_ops_avx2. (The int8 AVX-VNNI
 * key kernel, kkv_avxvnni_qk_page, stays tested but unused: the 8-bit key
 * kernel needs none of its channel groups.) */
const kkv_ops kkv_ops_avx2vnni = {
    .kind = KKV_KERNEL_AVX2,
    .qk_f16 = kkv_avx2_qk_f16,
    .qk_page = kkv_avx2_qk_byte,
    .pv_f16 = kkv_avx2_pv_f16,
    .pv_page = kkv_avxvnni_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx2_softmax,
};
