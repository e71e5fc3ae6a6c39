/* Small AVX2 helpers shared by the float (attn_avx2.c) and integer-domain
 * (attn_int_avx2.c) kernels. Include only from files compiled with -mavx2. */
#ifndef KKV_KERNELS_AVX2_UTIL_H
#define KKV_KERNELS_AVX2_UTIL_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "core/exp_poly_avx2.h"
#include "kernels/int_fold.h"
#include "quant/quant.h"

#define AI static inline __attribute__((always_inline))

/* Lane mask of the first n (4 or 8) lanes, for a D that is a multiple of 4. */
AI __m256i lanes(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* The first n (4 or 8) floats at p, zero above: a plain load when n is 8
 * (with the engines' constant shapes the compiler drops the branch; a
 * vmaskmovps with an all-ones mask is still the slower instruction). */
AI __m256 load_n(const float *p, int n) {
    return n == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(n));
}

/* a += b in 16-bit lanes, in a's own register: the accumulators of the
 * integer page kernels' inner loops. GCC 12 otherwise summed into b's register
 * and copied the result back, a vmovdqa per accumulator and iteration (6 of
 * the value kernel's 30 loop instructions, 4-5 of the key kernel's 28; an
 * empty asm that pinned the key sums to registers had not stopped it). Clang
 * adds in place by itself. On a Zen 3: qk_page -3% and pv_page -2% hot
 * (test_kernels --bench-pages), kitty attention at 16K -4.7% (RESULTS.md,
 * twelfth session). Same sums, same bits. */
AI void add16_into(__m256i *a, __m256i b) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpaddw %1, %0, %0" : "+x"(*a) : "x"(b));
#else
    *a = _mm256_add_epi16(*a, b);
#endif
}

#if defined(__AVX512VNNI__)
/* a += the u8 x s8 quad products of u and s (vpdpbusd), in a's own
 * register, for the same reason as add16_into: GCC 12 summed into a copy
 * and moved it back, 12 vmovdqa in a 6-vpdpbusd iteration of the VBMI key
 * and value kernels. */
AI void dp512_into(__m512i *a, __m512i u, __m512i s) {
#if defined(__GNUC__) && !defined(__clang__)
    __asm__("vpdpbusd %2, %1, %0" : "+v"(*a) : "v"(u), "v"(s));
#else
    *a = _mm512_dpbusd_epi32(*a, u, s);
#endif
}
#endif

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

/* int_fold.h's threshold, under the name the AVX2 kernels use. */
AI int fold_too_small(float m) { return kkv_fold_too_small(m); }

/* A key page's layout, and its per-channel steps and minimums as floats
 * (scale, mn: [D] each), which every key kernel starts from. */
AI kkv_key_layout key_page_f32(float *scale, float *mn, const uint8_t *page, int D, int G, int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    f16_row(scale, page + L.scale, D);
    f16_row(mn, page + L.mn, D);
    return L;
}

#endif
