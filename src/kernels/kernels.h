/* Kernel table behind kkv_attend() and kkv_flush(): pure functions over page
 * views (pointers to one page in the format of docs/FORMAT.md section 2) and
 * fp16 runs; they know nothing of caches or sequences. The online-softmax glue
 * (src/cache/attend.c) is shared; a kernel variant supplies these primitives. Each variant
 * is tested against the scalar one (tests/test_kernels.c).
 *
 * Numerical contract (tests/test_kernels.c checks each bound):
 *  - qk_f16, pv_f16, softmax of a SIMD variant agree with the scalar ones to
 *    float rounding (they may fold scales, use FMA and reorder sums):
 *    |simd - scalar| <= 1e-5 * sum |terms|;
 *  - qk_page, pv_page of a SIMD variant work in the integer domain and
 *    differ from the scalar ones by one quantization step of the folded
 *    query / probabilities. The value kernels (attn_int_impl.h: AVX2, VNNI
 *    and VBMI builds; attn_int_neon.c on aarch64) all give the same bits. The key kernels: the AVX2
 *    tables' (attn_qkbyte_avx2.c, 8 bits, which hands pages with more
 *    than D / 2 boosted channels to attn_qkwide_avx2.c, 16 bits), the
 *    VBMI table's (attn_qkwide_vbmi_avx512.c: the AVX2 8-bit kernel's bits,
 *    and 15 bits on the pages with more than D / 2 boosted) and the int8 ones of
 *    attn_int_impl.h (the AVX-512 VNNI table's; their AVX2 and AVX-VNNI
 *    builds stay tested); the NEON table's (attn_int_neon.c) gives the AVX2
 *    tables' bits, the 8-bit query and the 16-bit one on the same pages:
 *      qk_page: |s_t - ref| <= sum_j d_g(j)/2 * |c_tj - maxq_j/2| + rounding,
 *        int8: d_g = max_{j in group g} |q_j scale_j| / 127, channel groups
 *        by key range scale_j * maxq_j (within 4x, 16x of the page's
 *        largest, rest); the wide VBMI kernel: one group,
 *        d = max_j |q_j scale_j| / 32639; the AVX2 16-bit kernel: one group,
 *        d = max_j |q_j scale_j| / min(32767, (2^31 - 1) / (64 (3D + 12 nb)));
 *        the AVX2 8-bit kernel: one group, d = max_j |q_j scale_j| / 127;
 *      pv_page: |acc_j - ref| <= sum_blocks e/2 * sum_t |c_tj - maxq/2| + rounding,
 *        e = max_t p_t scale_t / 255 per block of 128 tokens;
 *    inputs outside the integer path (non-finite folded query, negative or
 *    non-finite probabilities) take float kernels that agree to rounding;
 *  - every primitive is a pure function of its inputs (no state, no
 *    dependence on the thread or on how work is split), so attention stays
 *    bit-identical for any thread count and any prompt chunking;
 *  - the flush primitives write bytes identical to the scalar codecs. */
#ifndef KKV_KERNELS_KERNELS_H
#define KKV_KERNELS_KERNELS_H

#include <stdint.h>

#include "kittykv.h"
#include "kittykv_cpu.h"

typedef struct kkv_ops {
    kkv_kernel kind;
    /* s: [n_rep][n] raw dots q . k_t (unscaled). q: [n_rep][D], k: [n][D] fp16.
     * pf: NULL, or n * D fp16 of the next chunk this thread will read (the
     * block's values), prefetched a row per row read: a hint, never read, so
     * it cannot change a result (fp16 streams 16x more bytes than it can keep
     * in L1, and a whole-page prefetch up front evicts the rows in use). */
    void (*qk_f16)(float *s, const float *q, int n_rep, const uint16_t *k, int n, int D,
                   const void *pf);
    /* s: [n_rep][G] over one key page (format of kittykv.h). */
    void (*qk_page)(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                    int nb);
    /* acc: [n_rep][D] += sum_t p[r][t] * v_t. p: [n_rep][n], v: [n][D] fp16.
     * pf: NULL or n * D fp16 to prefetch as qk_f16's (the next page's keys). */
    void (*pv_f16)(float *acc, const float *p, int n_rep, const uint16_t *v, int n, int D,
                   const void *pf);
    /* acc: [n_rep][D] += sum_t p[r][t] * v_t over one value page. p: [n_rep][G]. */
    void (*pv_page)(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                    int bits);
    /* Page flush: k, v [G][D] fp16; tmp: [G][D] scratch. Must write bytes
     * identical to the scalar codecs. */
    void (*key_encode)(uint8_t *page, float *tmp, const uint16_t *k, int D, int G, int nb,
                       kkv_select sel, uint64_t seed, uint64_t page_no, const uint8_t *rank);
    void (*value_encode)(uint8_t *page, float *tmp, const uint16_t *v, int D, int G, int bits);
    /* Online-softmax step of one block for n_rep query heads. s: [n_rep][n] raw
     * dots in, unnormalised probabilities exp(s*inv - m_new) out. ml: [n_rep][2]
     * running (max, sum), updated. acc: [n_rep][D] partial outputs, rescaled by
     * exp(m_old - m_new). The running max starts at -INFINITY. inv > 0 (the
     * SIMD kernels take the raw maximum and scale it once). */
    void (*softmax)(float *s, float *ml, float *acc, int n_rep, int n, int D, float inv);
} kkv_ops;

/* 8-bit pages (attn_page8.c), the same for every table: s [n_rep][G] over an
 * 8-bit key page, acc [n_rep][D] += p [n_rep][G] x an 8-bit value page. */
void kkv_qk_page8(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G);
void kkv_pv_page8(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G);
/* int8 sink rows (rows [n][D + 2] bytes, FORMAT.md section 5): s [n_rep][n],
 * acc [n_rep][D] += p [n_rep][n] x the rows. */
void kkv_qk_rows8(float *s, const float *q, int n_rep, const uint8_t *rows, int n, int D);
void kkv_pv_rows8(float *acc, const float *p, int n_rep, const uint8_t *rows, int n, int D);

/* The table of a kernel kind; NULL if this CPU/build lacks it. */
const kkv_ops *kkv_ops_get(kkv_kernel k);

extern const kkv_ops kkv_ops_scalar;
/* The scalar flush codecs, which the NEON table shares. */
void kkv_scalar_key_encode(uint8_t *page, float *tmp, const uint16_t *k, int D, int G, int nb,
                           kkv_select sel, uint64_t seed, uint64_t page_no, const uint8_t *rank);
void kkv_scalar_value_encode(uint8_t *page, float *tmp, const uint16_t *v, int D, int G, int bits);
#if defined(__x86_64__)
extern const kkv_ops kkv_ops_avx2;
extern const kkv_ops kkv_ops_avx2vnni;   /* AVX2 + AVX-VNNI page kernels */
extern const kkv_ops kkv_ops_avx512;
extern const kkv_ops kkv_ops_avx512vnni; /* AVX-512 + VNNI page kernels */
extern const kkv_ops kkv_ops_avx512vbmi; /* AVX-512 VBMI + VNNI (512-bit) page kernels */
#endif
#if defined(__aarch64__)
extern const kkv_ops kkv_ops_neon; /* attn_neon.c, with the page kernels of attn_int_neon.c */
/* attn_int_neon.c: the integer-domain page kernels (the AVX2 tables' bits) */
void kkv_neon_qk_page(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb);
void kkv_neon_pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G, int bits);
/* attn_neon.c: the float page kernels they fall back to (the scalar kernels' bits) */
void kkv_neon_qk_page_f32(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb);
void kkv_neon_pv_page_f32(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G, int bits);
#endif

#endif
