/* AVX-512 tables. The page kernels are the integer-domain ones of
 * attn_int_impl.h: with vpdpbusd where the CPU has AVX-512 VNNI, else the
 * AVX2 ones (every AVX-512 CPU runs AVX2 code: the 8-bit key kernel of
 * attn_qkbyte_avx2.c, the value kernel of attn_int_avx2.c). The former
 * AVX-512 float qk_page was 3x slower than the integer kernel on Zen 4 and
 * is gone. Results agree with
 * the scalar reference within the bounds of kernels.h; flush bytes are
 * identical (the AVX2 codecs). qk_f16 / pv_f16 are the 512-bit ones of
 * attn_f16_avx512.c, bit-identical to AVX2's. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attn_simd.h"
#include "kernels/avx2_util.h"

/* The softmax's exponential (kkv_exp_soft of core/exp_poly.h;
 * kkv_exp_soft8x4 of core/exp_poly_avx2.h) on 16 lanes, operation for
 * operation with the same last step (n << 23 from the rounding sum's bits
 * added to y's exponent field), so every lane gets the bits the 8-lane
 * version gives it. A copy rather
 * than two 8-lane calls: the softmax's exponentials are half its time per
 * block. */
AI __m512 exp_neg16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(KKV_EXP_MIN));
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(KKV_EXP_LOG2E), _mm512_set1_ps(KKV_EXP_ROUNDER));
    __m512 n = _mm512_sub_ps(t, _mm512_set1_ps(KKV_EXP_ROUNDER));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(KKV_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(KKV_EXP_LN2_LO), r);
    __m512 y = _mm512_set1_ps(kkv_exp_minimax5[0]);
    for (int k = 1; k < 6; k++) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kkv_exp_minimax5[k]));
    __m512i e = _mm512_slli_epi32(_mm512_castps_si512(t), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(y), e));
}

/* kkv_avx512_softmax where n is a multiple of 16 (every page, every whole
 * fp16 block) for K heads side by side, K a constant at each call (1..4) so
 * that the loops over the heads unroll and their maxima and sums stay in
 * registers. Each head's maximum, exponentials and sum chain are computed as
 * in the one-head loop below, in the same order, so the bits are the same;
 * what changes is that the heads' chains overlap. One head at a time, each
 * head's exponentials waited for its max pass and reduction (~60 cycles of
 * latency) and its sum chain: 3 heads x 128 tokens took 120 ns hot on the
 * Intel Xeon guest of docs/RESULTS.md (family 6 model 167; a harness without
 * the state reset), 84 side by side. */
AI void softmax_heads(float *sc, float *ml, float *acc, const int K, int n, int D, float inv) {
    __m512 vinv = _mm512_set1_ps(inv), vm[4], vs[4], vmx[4];
    float mx[4];
    _Pragma("GCC unroll 4") for (int r = 0; r < K; r++) {
        vm[r] = _mm512_set1_ps(-INFINITY);
        vs[r] = _mm512_setzero_ps();
    }
    for (int t = 0; t < n; t += 16)
        _Pragma("GCC unroll 4") for (int r = 0; r < K; r++)
            vm[r] = _mm512_max_ps(vm[r], _mm512_loadu_ps(sc + (size_t)r * n + t));
    _Pragma("GCC unroll 4") for (int r = 0; r < K; r++) {
        float m = _mm512_reduce_max_ps(vm[r]) * inv;
        mx[r] = ml[2 * r] > m ? ml[2 * r] : m;
        vmx[r] = _mm512_set1_ps(mx[r]);
    }
    for (int t = 0; t < n; t += 16)
        _Pragma("GCC unroll 4") for (int r = 0; r < K; r++) {
            float *p = sc + (size_t)r * n + t;
            __m512 e = exp_neg16(_mm512_fmsub_ps(_mm512_loadu_ps(p), vinv, vmx[r]));
            _mm512_storeu_ps(p, e);
            vs[r] = _mm512_add_ps(vs[r], e);
        }
    _Pragma("GCC unroll 4") for (int r = 0; r < K; r++) {
        float sum = hsum(_mm256_add_ps(_mm512_castps512_ps256(vs[r]), _mm512_extractf32x8_ps(vs[r], 1)));
        softmax_close(acc + (size_t)r * D, ml + 2 * r, D, ml[2 * r], mx[r], sum);
    }
}

/* kkv_avx2_softmax on 16 lanes: the same fused argument fmsub(s, inv, m),
 * the exact maximum, and the sum's two chains as the low (even 8-lane
 * vectors) and high (odd) halves of one register, added at the end as AVX2
 * adds its two; so the results are bit-identical to kkv_avx2_softmax for
 * finite scores. Blocks of a multiple of 16 go to softmax_heads, four
 * heads at a time. */
static void kkv_avx512_softmax(float *sc, float *ml, float *acc, int n_rep, int n, int D, float inv) {
    if (n % 16 == 0) {
        int r = 0;
        for (; r + 4 <= n_rep; r += 4) softmax_heads(sc + (size_t)r * n, ml + 2 * r, acc + (size_t)r * D, 4, n, D, inv);
        float *s = sc + (size_t)r * n, *m = ml + 2 * r, *a = acc + (size_t)r * D;
        switch (n_rep - r) {
        case 3: softmax_heads(s, m, a, 3, n, D, inv); break;
        case 2: softmax_heads(s, m, a, 2, n, D, inv); break;
        case 1: softmax_heads(s, m, a, 1, n, D, inv); break;
        default: break;
        }
        return;
    }
    __m512 vinv = _mm512_set1_ps(inv);
    for (int r = 0; r < n_rep; r++) {
        float *s = sc + (size_t)r * n, *a = acc + (size_t)r * D;
        float m_old = ml[2 * r];
        __m512 vm = _mm512_set1_ps(-INFINITY);
        int n8 = n / 8 * 8, t = 0;
        for (; t + 16 <= n8; t += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + t));
        if (t < n8) vm = _mm512_mask_max_ps(vm, 0x00FF, vm, _mm512_maskz_loadu_ps(0x00FF, s + t)); /* 8 left */
        float raw = _mm512_reduce_max_ps(vm);
        for (t = n8; t < n; t++) raw = s[t] > raw ? s[t] : raw;
        float mx = raw * inv;
        mx = m_old > mx ? m_old : mx;
        __m512 vmx = _mm512_set1_ps(mx), vs = _mm512_setzero_ps();
        /* whole vectors load and store unmasked: a masked store does not
         * forward to the loads after it (the value kernel's), which then wait
         * for it to reach the cache */
        for (t = 0; t + 16 <= n8; t += 16) {
            __m512 e = exp_neg16(_mm512_fmsub_ps(_mm512_loadu_ps(s + t), vinv, vmx));
            _mm512_storeu_ps(s + t, e);
            vs = _mm512_add_ps(vs, e);
        }
        if (t < n8) { /* 8 left: an even vector, the low chain */
            __m512 e = _mm512_maskz_mov_ps(0x00FF, exp_neg16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(0x00FF, s + t), vinv, vmx)));
            _mm512_mask_storeu_ps(s + t, 0x00FF, e);
            vs = _mm512_add_ps(vs, e);
        }
        if (n8 < n) { /* 1..7 left, pad lanes masked off; vector n8 / 8's chain */
            __mmask16 k = (__mmask16)((1u << (n - n8)) - 1);
            __m512 e = _mm512_maskz_mov_ps(k, exp_neg16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(k, s + n8), vinv, vmx)));
            _mm512_mask_storeu_ps(s + n8, k, e);
            if (n8 & 8) e = _mm512_shuffle_f32x4(e, e, 0x4E); /* odd: into the high half */
            vs = _mm512_add_ps(vs, e);
        }
        /* the two chains added as AVX2 adds its two; the rescale is the shared one */
        float sum = hsum(_mm256_add_ps(_mm512_castps512_ps256(vs), _mm512_extractf32x8_ps(vs, 1)));
        softmax_close(a, ml + 2 * r, D, m_old, mx, sum);
    }
}

const kkv_ops kkv_ops_avx512 = {
    .kind = KKV_KERNEL_AVX512,
    .qk_f16 = kkv_avx512_qk_f16,
    .qk_page = kkv_avx2_qk_byte,
    .pv_f16 = kkv_avx512_pv_f16,
    .pv_page = kkv_avx2i_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx512_softmax,
};

/* The same with the 512-bit VBMI + VNNI page kernels (where cpu->vbmi): its
 * key kernel gives the AVX2 table's bits on pages with n_boost <= D / 2. */
const kkv_ops kkv_ops_avx512vbmi = {
    .kind = KKV_KERNEL_AVX512,
    .qk_f16 = kkv_avx512_qk_f16,
    .qk_page = kkv_vbmi512_qk_byte,
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
