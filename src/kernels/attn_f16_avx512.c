/* 512-bit fp16 attention (qk_f16 / pv_f16 of the AVX-512 tables): the AVX2
 * kernels' arithmetic lane for lane, so every score and output has the AVX2
 * table's bits (test_kernels checks it bit for bit, and test_golden relies on
 * it: the fp16 cache and every window and sink read through these).
 *
 * Why that is possible:
 *  - q . k: the AVX2 tile sums one token's channels j, j+8, j+16, ... into
 *    lane j % 8 of a ymm and reduces 4 tokens with hadd trees. Here a zmm
 *    holds two tokens' 8-channel slices side by side ([t | t+1]), so each lane
 *    sees the same FMA chain, and a 512-bit hadd (shuffle + add, per 128-bit
 *    lane, operands in vhaddps' order) rebuilds the same tree for 8 tokens.
 *  - p . v: each output channel is one FMA chain over the tokens in order; a
 *    zmm of 16 channels runs 16 such chains, the same ones.
 * Half the FMAs, converts and reductions of the AVX2 kernels; the measured
 * gain is in docs/RESULTS.md. Token counts that are not a multiple of 8 end
 * in the AVX2 kernel (its 4-token and 1-token trees). */
#include <immintrin.h>
#include <string.h>

#include "kernels/attn_simd.h"
#include "kernels/avx2_util.h"

/* Query heads per pass: 4 x 4 accumulators + 4 key vectors stay in registers. */
#define RB16 4
/* A query's 8-channel slices, each duplicated into both 256-bit halves. */
#define QD_MAX (KKV_MAX_HEAD_DIM / 8 * 16)

/* 8 halves of row a and 8 of row b (4 each, rest 0, when half) as [a | b] fp32. */
AI __m512 ld_pair(const uint16_t *a, const uint16_t *b, int half) {
    __m128i x, y;
    if (half) {
        x = _mm_loadl_epi64((const __m128i *)(const void *)a);
        y = _mm_loadl_epi64((const __m128i *)(const void *)b);
    } else {
        x = _mm_loadu_si128((const __m128i *)(const void *)a);
        y = _mm_loadu_si128((const __m128i *)(const void *)b);
    }
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(x), y, 1));
}

/* vhaddps on each 128-bit lane: [x1+x0, x3+x2, y1+y0, y3+y2] (its operand order). */
AI __m512 hadd512(__m512 x, __m512 y) {
    return _mm512_add_ps(_mm512_shuffle_ps(x, y, 0xDD), _mm512_shuffle_ps(x, y, 0x88));
}

/* Scores of 8 tokens for RB heads. qd: [RB][nc][16] duplicated query slices,
 * nc = ceil(D / 8); s: [RB][ld], the 8 scores land at s[r * ld + 0..7]. */
AI void qk8(float *s, size_t ld, const float *qd, int nc, const uint16_t *k, int D, int RB) {
    __m512 acc[RB16][4];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < 4; i++) acc[r][i] = _mm512_setzero_ps();
    for (int c = 0; c < nc; c++) {
        int half = 8 * c + 8 > D;
        const uint16_t *row = k + 8 * c;
        __m512 kv[4];
        for (int i = 0; i < 4; i++) kv[i] = ld_pair(row + (size_t)(2 * i) * D, row + (size_t)(2 * i + 1) * D, half);
        for (int r = 0; r < RB; r++) {
            __m512 qv = _mm512_loadu_ps(qd + ((size_t)r * nc + c) * 16);
            for (int i = 0; i < 4; i++) acc[r][i] = _mm512_fmadd_ps(qv, kv[i], acc[r][i]);
        }
    }
    /* acc[i] = [t2i | t2i+1]; the AVX2 tree per token is
     * ((x1+x0)+(x3+x2)) + ((x5+x4)+(x7+x6)) */
    const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int r = 0; r < RB; r++) {
        __m512 h = hadd512(hadd512(acc[r][0], acc[r][1]), hadd512(acc[r][2], acc[r][3]));
        /* 128-bit lanes [t0 t2 t4 t6](0..3) [t0 t2 t4 t6](4..7) [t1 ..](0..3) [t1 ..](4..7) */
        h = _mm512_add_ps(h, _mm512_shuffle_f32x4(h, h, _MM_SHUFFLE(2, 3, 0, 1)));
        _mm256_storeu_ps(s + (size_t)r * ld, _mm512_castps512_ps256(_mm512_permutexvar_ps(order, h)));
    }
}

void kkv_avx512_qk_f16(float *s, const float *q, int n_rep, const uint16_t *k, int n, int D,
                       const void *pf) {
    int n8 = n & ~7, nc = (D + 7) / 8;
    if (n8 > 0) {
        float qd[RB16 * QD_MAX]; /* [RB][nc][16] */
        for (int r0 = 0; r0 < n_rep; r0 += RB16) {
            int rb = n_rep - r0 < RB16 ? n_rep - r0 : RB16;
            for (int r = 0; r < rb; r++)
                for (int c = 0; c < nc; c++) { /* a last half slice: lanes 4..7 of each half 0 */
                    const float *src = q + (size_t)(r0 + r) * D + 8 * c;
                    __m256 x = 8 * c + 8 > D ? _mm256_maskz_loadu_ps(0x0F, src) : _mm256_loadu_ps(src);
                    _mm512_storeu_ps(qd + ((size_t)r * nc + c) * 16, _mm512_broadcast_f32x8(x));
                }
            float *sr = s + (size_t)r0 * n;
            const void *f = r0 == 0 ? pf : NULL; /* the first pass over the rows prefetches */
            for (int t = 0; t < n8; t += 8) {
                pf_rows(f, t, t + 8, D);
                const uint16_t *kt = k + (size_t)t * D;
                if (rb == 4) qk8(sr + t, (size_t)n, qd, nc, kt, D, 4);
                else if (rb == 3) qk8(sr + t, (size_t)n, qd, nc, kt, D, 3);
                else if (rb == 2) qk8(sr + t, (size_t)n, qd, nc, kt, D, 2);
                else qk8(sr + t, (size_t)n, qd, nc, kt, D, 1);
            }
        }
    }
    if (n8 < n) { /* 1..7 tokens: the AVX2 trees (a 4-token one, then singles) */
        int m = n - n8;
        float tail[8 * 64]; /* [rb][m]: up to 64 heads per call, m <= 7 */
        for (int r0 = 0; r0 < n_rep; r0 += 64) {
            int rb = n_rep - r0 < 64 ? n_rep - r0 : 64;
            const void *f = pf && r0 == 0 ? (const uint16_t *)pf + (size_t)n8 * D : NULL;
            kkv_avx2_qk_f16(tail, q + (size_t)r0 * D, rb, k + (size_t)n8 * D, m, D, f);
            for (int r = 0; r < rb; r++)
                memcpy(s + (size_t)(r0 + r) * n + n8, tail + (size_t)r * m, (size_t)m * sizeof *s);
        }
    }
}

/* Channels [j, j + 16 NV) of RB heads over n tokens; w: valid channels of the
 * last vector (1..16, a multiple of 4). acc: [RB][D] read and written in place. */
AI void pv16(float *acc, int D, const float *p, size_t ldp, const uint16_t *v, int n, int j, int NV,
             int w, int RB, const void *pf) {
    __mmask16 mk = (__mmask16)((1u << w) - 1u);
    __m512 a[RB16][4];
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NV; i++) {
            const float *src = acc + (size_t)r * D + j + 16 * i;
            a[r][i] = i == NV - 1 ? _mm512_maskz_loadu_ps(mk, src) : _mm512_loadu_ps(src);
        }
    for (int t = 0; t < n; t++) {
        pf_rows(pf, t, t + 1, D);
        const uint16_t *row = v + (size_t)t * D + j;
        __m512 x[4];
        for (int i = 0; i < NV; i++) {
            const void *src = row + 16 * i;
            x[i] = _mm512_cvtph_ps(i == NV - 1 ? _mm256_maskz_loadu_epi16(mk, src)
                                                : _mm256_loadu_si256((const __m256i *)src));
        }
        for (int r = 0; r < RB; r++) {
            __m512 b = _mm512_set1_ps(p[(size_t)r * ldp + t]);
            for (int i = 0; i < NV; i++) a[r][i] = _mm512_fmadd_ps(b, x[i], a[r][i]);
        }
    }
    for (int r = 0; r < RB; r++)
        for (int i = 0; i < NV; i++) {
            float *dst = acc + (size_t)r * D + j + 16 * i;
            if (i == NV - 1) _mm512_mask_storeu_ps(dst, mk, a[r][i]);
            else _mm512_storeu_ps(dst, a[r][i]);
        }
}

AI void pv16_rb(float *acc, int D, const float *p, size_t ldp, const uint16_t *v, int n, int RB,
                const void *pf) {
    int j = 0;
    for (; j + 64 <= D; j += 64, pf = NULL) pv16(acc, D, p, ldp, v, n, j, 4, 16, RB, pf);
    int left = D - j; /* 0..60, a multiple of 4 */
    if (left == 0) return;
    int nv = (left + 15) / 16, w = left - 16 * (nv - 1);
    if (nv == 1) pv16(acc, D, p, ldp, v, n, j, 1, w, RB, pf);
    else if (nv == 2) pv16(acc, D, p, ldp, v, n, j, 2, w, RB, pf);
    else if (nv == 3) pv16(acc, D, p, ldp, v, n, j, 3, w, RB, pf);
    else pv16(acc, D, p, ldp, v, n, j, 4, w, RB, pf);
}

void kkv_avx512_pv_f16(float *acc, const float *p, int n_rep, const uint16_t *v, int n, int D,
                       const void *pf) {
    for (int r0 = 0; r0 < n_rep; r0 += RB16) {
        int rb = n_rep - r0 < RB16 ? n_rep - r0 : RB16;
        float *ar = acc + (size_t)r0 * D;
        const float *pr = p + (size_t)r0 * n;
        const void *f = r0 == 0 ? pf : NULL;
        if (rb == 4) pv16_rb(ar, D, pr, (size_t)n, v, n, 4, f);
        else if (rb == 3) pv16_rb(ar, D, pr, (size_t)n, v, n, 3, f);
        else if (rb == 2) pv16_rb(ar, D, pr, (size_t)n, v, n, 2, f);
        else pv16_rb(ar, D, pr, (size_t)n, v, n, 1, f);
    }
}
