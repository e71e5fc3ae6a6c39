/* AVX-512 tables. The page kernels are the integer-domain ones of
 * attn_int_impl.h: with vpdpbusd where the CPU has AVX-512 VNNI, else the
 * AVX2 build of them (every AVX-512 CPU runs AVX2 code). The former AVX-512 float qk_page was
 * 3x slower than the integer kernel on Zen 4 and is gone. Results agree with
 * the scalar reference within the bounds of kernels.h; flush bytes are
 * identical (the AVX2 codecs). qk_f16 / pv_f16 are the 512-bit ones of
 * attn_f16_avx512.c, bit-identical to AVX2's. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attn_simd.h"
#include "kernels/avx2_util.h"

/* exp(x) for x <= 0 on 16 lanes: exp_neg of attn_avx2.c operation for
 * operation, so every lane gets the bits the 8-lane version gives it. */
AI __m512 exp_neg16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.0f / 5040.0f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 720.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}

/* kkv_avx2_softmax with the scaling and the exponentials on 16 lanes. The
 * running sum stays the 8-lane chain of the AVX2 version, fed the low then
 * the high half of each 16 (its order), and the maximum is exact, so the
 * results are bit-identical to kkv_avx2_softmax for finite scores. */
static void kkv_avx512_softmax(float *sc, float *ml, float *acc, int n_rep, int n, int D, float inv) {
    __m512 vinv = _mm512_set1_ps(inv);
    for (int r = 0; r < n_rep; r++) {
        float *s = sc + (size_t)r * n, *a = acc + (size_t)r * D;
        float m_old = ml[2 * r];
        __m512 vm = _mm512_set1_ps(m_old);
        int n8 = n / 8 * 8, t = 0;
        /* whole vectors load and store unmasked: a masked store does not
         * forward to the loads after it (here, the next pass and the value
         * kernel), which then wait for it to reach the cache */
        for (; t + 16 <= n8; t += 16) {
            __m512 x = _mm512_mul_ps(_mm512_loadu_ps(s + t), vinv);
            _mm512_storeu_ps(s + t, x);
            vm = _mm512_max_ps(vm, x);
        }
        if (t < n8) { /* 8 left */
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(0x00FF, s + t), vinv);
            _mm512_mask_storeu_ps(s + t, 0x00FF, x);
            vm = _mm512_mask_max_ps(vm, 0x00FF, vm, x);
        }
        float mx = _mm512_reduce_max_ps(vm);
        for (t = n8; t < n; t++) {
            s[t] *= inv;
            mx = s[t] > mx ? s[t] : mx;
        }
        float corr = expf(m_old - mx); /* 0 on the first block, where m_old = -inf */
        __m512 vmx = _mm512_set1_ps(mx);
        __m256 vs = _mm256_setzero_ps();
        for (t = 0; t + 16 <= n8; t += 16) {
            __m512 e = exp_neg16(_mm512_sub_ps(_mm512_loadu_ps(s + t), vmx));
            _mm512_storeu_ps(s + t, e);
            vs = _mm256_add_ps(vs, _mm512_castps512_ps256(e));
            vs = _mm256_add_ps(vs, _mm512_extractf32x8_ps(e, 1));
        }
        if (t < n8) { /* 8 left */
            __m512 e = exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(0x00FF, s + t), vmx));
            _mm512_mask_storeu_ps(s + t, 0x00FF, e);
            vs = _mm256_add_ps(vs, _mm512_castps512_ps256(e));
        }
        if (n8 < n) { /* 1..7 left, pad lanes masked off */
            __mmask16 k = (__mmask16)((1u << (n - n8)) - 1);
            __m512 e = _mm512_maskz_mov_ps(k, exp_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + n8), vmx)));
            _mm512_mask_storeu_ps(s + n8, k, e);
            vs = _mm256_add_ps(vs, _mm512_castps512_ps256(e));
        }
        float sum = hsum(vs);
        __m512 vc = _mm512_set1_ps(corr);
        int j = 0;
        for (; j + 16 <= D; j += 16) _mm512_storeu_ps(a + j, _mm512_mul_ps(_mm512_loadu_ps(a + j), vc));
        for (; j < D; j++) a[j] *= corr;
        ml[2 * r + 1] = ml[2 * r + 1] * corr + sum;
        ml[2 * r] = mx;
    }
}

const kkv_ops kkv_ops_avx512 = {
    .kind = KKV_KERNEL_AVX512,
    .qk_f16 = kkv_avx512_qk_f16,
    .qk_page = kkv_avx2i_qk_page,
    .pv_f16 = kkv_avx512_pv_f16,
    .pv_page = kkv_avx2i_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx512_softmax,
};

/* The same with the 512-bit VBMI + VNNI page kernels (where cpu->vbmi). */
const kkv_ops kkv_ops_avx512vbmi = {
    .kind = KKV_KERNEL_AVX512,
    .qk_f16 = kkv_avx512_qk_f16,
    .qk_page = kkv_vbmi512_qk_wide,
    .pv_f16 = kkv_avx512_pv_f16,
    .pv_page = kkv_vbmi512_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx512_softmax,
};

/* The same with the VNNI page kernels (dispatch picks it where cpu->vnni). */
const kkv_ops kkv_ops_avx512vnni = {
    .kind = KKV_KERNEL_AVX512,
    .qk_f16 = kkv_avx512_qk_f16,
    .qk_page = kkv_vnni512_qk_page,
    .pv_f16 = kkv_avx512_pv_f16,
    .pv_page = kkv_vnni512_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx512_softmax,
};
