/* Small AVX2 helpers shared by the float (attn_avx2.c) and integer-domain
 * (attn_int_avx2.c) kernels. Include only from files compiled with -mavx2. */
#ifndef KKV_KERNELS_AVX2_UTIL_H
#define KKV_KERNELS_AVX2_UTIL_H

#include <immintrin.h>

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

#endif
