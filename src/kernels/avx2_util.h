/* Small AVX2 helpers shared by the float (attn_avx2.c) and integer-domain
 * (attn_int_avx2.c) kernels. Include only from files compiled with -mavx2. */
#ifndef KKV_KERNELS_AVX2_UTIL_H
#define KKV_KERNELS_AVX2_UTIL_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define AI static inline __attribute__((always_inline))

/* Lane mask of the first n (4 or 8) lanes, for a D that is a multiple of 4. */
AI __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* Horizontal sum and maximum of 8 floats. */
AI float hsum(__m256 a) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}
AI float hmax(__m256 a) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
}

/* The softmax's e^x for x <= 0, shared by the AVX2 and AVX-512 kernels so
 * their lanes agree bit for bit: clamped below at -87.3 (e^x is then still a
 * normal float), n = round(x log2 e), r = x - n ln 2 in two steps
 * (Cody-Waite, |r| <= ln2 / 2), e^r by its degree-6 Taylor polynomial
 * (truncation < 1.2e-7 relative), times 2^n. */
#define KKV_EXP_LOG2E 1.44269504f
#define KKV_EXP_LN2_HI 0.693359375f     /* ln 2 = HI + LO; n * HI is exact */
#define KKV_EXP_LN2_LO -2.12194440e-4f
#define KKV_EXP_MIN -87.3f
/* e^r = sum r^k / k!, k = 6 down to 0, in Horner order: the one list both
 * widths step through. */
static const float kkv_exp_taylor[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f,
                                        0.5f,          1.0f,          1.0f};

AI __m256 exp_neg(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(KKV_EXP_MIN));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(KKV_EXP_LOG2E)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(KKV_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(KKV_EXP_LN2_LO), r);
    __m256 y = _mm256_set1_ps(kkv_exp_taylor[0]);
    for (int k = 1; k < 7; k++) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kkv_exp_taylor[k]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e)); /* exact: y 2^n is a normal float */
}

/* The end of one head's online-softmax step, shared by the AVX2 and AVX-512
 * softmaxes: the accumulator a [D] rescaled by e^(m_old - mx), the running
 * (max, sum) ml [2] updated with this block's sum. When the block left the
 * running max where it was (most blocks of a long context) the factor is
 * e^0 = 1 and the rescale is skipped, for the same bits: the expf call and
 * the pass over a were ~17 ns of each ~100 ns block in a 16K decode. Not at
 * +-inf, where e^(inf - inf) is NaN in the scalar reference too. */
AI void softmax_close(float *a, float *ml, int D, float m_old, float mx, float sum) {
    if (mx == m_old && fabsf(mx) < INFINITY) {
        ml[1] += sum;
        return;
    }
    float corr = expf(m_old - mx); /* 0 on the first block, where m_old = -inf */
    __m256 vc = _mm256_set1_ps(corr);
    int j = 0;
    for (; j + 8 <= D; j += 8) _mm256_storeu_ps(a + j, _mm256_mul_ps(_mm256_loadu_ps(a + j), vc));
    for (; j < D; j++) a[j] *= corr;
    ml[1] = ml[1] * corr + sum;
    ml[0] = mx;
}

/* Prefetch hint for the rows [t0, t1) of the fp16 chunk pf ([n][D]): to L2
 * (prefetcht2), at the pace the kernel reads its own rows, so the next chunk
 * is in flight while this one is computed. Measured on Zen 4 with pages 2.9 MB
 * apart: t2 beat t0 and NTA, and one whole-page burst up front was slower
 * than no prefetch at all (it evicts the rows in use from the 32 KB L1). */
AI void pf_rows(const void *pf, int t0, int t1, int D) {
    if (!pf) return;
    const char *b = (const char *)pf + (size_t)t0 * D * 2, *e = (const char *)pf + (size_t)t1 * D * 2;
    for (; b < e; b += 64) __builtin_prefetch(b, 0, 1);
}

/* fp16 [n] (n a multiple of 4) of a page to fp32 (needs -mf16c). */
AI void f16_row(float *dst, const uint8_t *src, int n) {
    int i = 0;
#ifdef __AVX512F__ /* whole 64-byte stores: the 512-bit kernels' loads forward from them */
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(src + 2 * i))));
#endif
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i))));
    for (; i < n; i += 4)
        _mm_storeu_ps(dst + i, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)(src + 2 * i))));
}

#endif
