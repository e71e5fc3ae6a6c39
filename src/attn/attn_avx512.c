/* AVX-512 table. Only the primitive that gains most from 16-lane vectors is
 * widened here: qk_page decodes 16 tokens of a 2-bit row with one shift (one
 * 32-bit word per channel). Everything else runs the AVX2 code, which every
 * AVX-512 CPU also executes; results agree with the scalar reference to float
 * rounding and flush bytes are identical (the AVX2 codecs). */
#include <immintrin.h>
#include <string.h>

#include "attn/attn_simd.h"
#include "quant/quant.h"

#define RB_MAX 4

static inline uint32_t ld32_part(const uint8_t *p, int n) {
    uint32_t w = 0;
    memcpy(&w, p, (size_t)n);
    return w;
}

/* Scores of 16 tokens (4 row bytes, fewer at the page end) for rb <= RB_MAX
 * query heads. qs: [rb][ldq] query * scale. */
static void qk_blk16(float *s, size_t ld, int ntok, const float *qs, int ldq, int rb,
                     const uint8_t *lo, const uint8_t *hi, const uint8_t *idx, int D, int nb,
                     size_t row, int b, int nbytes, const float *cst) {
    const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i m3 = _mm512_set1_epi32(3);
    __m512 acc[RB_MAX];
    for (int r = 0; r < RB_MAX; r++) acc[r] = _mm512_setzero_ps();
    for (int j = 0; j < D; j++) {
        __m512i x = _mm512_set1_epi32((int)ld32_part(lo + (size_t)j * row + b, nbytes));
        __m512i c = _mm512_and_si512(_mm512_srlv_epi32(x, sh), m3);
        if (idx[j] < nb) {
            __m512i y = _mm512_set1_epi32((int)ld32_part(hi + (size_t)idx[j] * row + b, nbytes));
            c = _mm512_or_si512(c, _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(y, sh), m3), 2));
        }
        __m512 f = _mm512_cvtepi32_ps(c);
        for (int r = 0; r < rb; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qs[(size_t)r * ldq + j]), f, acc[r]);
    }
    __mmask16 keep = (__mmask16)((1u << ntok) - 1u);
    for (int r = 0; r < rb; r++)
        _mm512_mask_storeu_ps(s + (size_t)r * ld, keep, _mm512_add_ps(acc[r], _mm512_set1_ps(cst[r])));
}

void kkv_avx512_qk_page_f32(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                    int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    const uint8_t *idx = page + L.idx;
    size_t row = (size_t)G / 4;
    float qs[RB_MAX][KKV_MAX_HEAD_DIM]; /* [rb][D] q * scale */
    float cst[RB_MAX];                  /* sum_j q_j * mn_j */
    for (int r0 = 0; r0 < n_rep; r0 += RB_MAX) {
        int rb = n_rep - r0 < RB_MAX ? n_rep - r0 : RB_MAX;
        for (int r = 0; r < rb; r++) {
            const float *qr = q + (size_t)(r0 + r) * D;
            float c = 0.0f;
            for (int j = 0; j < D; j++) {
                float sc = _cvtsh_ss(kkv_ld16(page + L.scale + 2 * (size_t)j));
                float mn = _cvtsh_ss(kkv_ld16(page + L.mn + 2 * (size_t)j));
                qs[r][j] = qr[j] * sc;
                c += qr[j] * mn;
            }
            cst[r] = c;
        }
        for (int t = 0; t < G; t += 16) {
            int ntok = G - t < 16 ? G - t : 16;
            qk_blk16(s + (size_t)r0 * G + t, (size_t)G, ntok, qs[0], KKV_MAX_HEAD_DIM, rb,
                     page + L.lo, page + L.hi, idx, D, nb, row, t / 4, ntok / 4, cst);
        }
    }
}

const kkv_ops kkv_ops_avx512 = {
    .kind = KKV_KERNEL_AVX512,
    .qk_f16 = kkv_avx2_qk_f16,
    .qk_page = kkv_avx2i_qk_page,
    .pv_f16 = kkv_avx2_pv_f16,
    .pv_page = kkv_avx2i_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx2_softmax,
};
