/* The AVX2 primitives, shared with the AVX-512 table (an AVX-512 CPU runs
 * AVX2 code too), so attn_avx512.c replaces only what it widens. Signatures
 * and contracts are those of kkv_ops in kernels.h. */
#ifndef KKV_ATTN_ATTN_SIMD_H
#define KKV_ATTN_ATTN_SIMD_H

#include "kernels/kernels.h"

/* Calls body (an always-inlined key kernel taking qk_page's arguments) with
 * the engines' shapes as constants where the call has one of them (SmolLM2:
 * D 64, 3 query heads per KV head; Gemma 3: D 256 with 4; 128-token pages),
 * so the compiler unrolls its loops for them; else with the sizes as given. */
#define KKV_QK_ENGINE_SHAPES(body, s, q, n_rep, page, D, G, nb)                          \
    do {                                                                                  \
        if ((G) == 128 && (D) == 64 && (n_rep) == 3) body(s, q, 3, page, 64, 128, nb);   \
        else if ((G) == 128 && (D) == 256 && (n_rep) == 4) body(s, q, 4, page, 256, 128, nb); \
        else body(s, q, n_rep, page, D, G, nb);                                           \
    } while (0)

#if defined(__x86_64__)
void kkv_avx2_qk_f16(float *s, const float *q, int n_rep, const uint16_t *k, int n, int D,
                     const void *pf);
void kkv_avx2_qk_page(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                      int nb);
void kkv_avx2_pv_f16(float *acc, const float *p, int n_rep, const uint16_t *v, int n, int D,
                     const void *pf);
void kkv_avx2_pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                      int bits);
void kkv_avx2_key_encode(uint8_t *page, float *tmp, const uint16_t *k, int D, int G, int nb,
                         kkv_select sel, uint64_t seed, uint64_t page_no, const uint8_t *rank);
void kkv_avx2_value_encode(uint8_t *page, float *tmp, const uint16_t *v, int D, int G,
                           int bits);
/* Integer-domain page kernels (attn_int_avx2.c); same signatures as
 * qk_page / pv_page, contract in kernels.h. */
void kkv_avx2i_qk_page(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                       int nb);
void kkv_avx2i_pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                       int bits);
/* The same with vpdpbusd (attn_vnni_avx512.c, attn_vnni_avxvnni.c): run only
 * where the CPU has AVX-512 VNNI / AVX-VNNI; bit-identical to kkv_avx2i_*. */
void kkv_vnni512_qk_page(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                         int nb);
void kkv_vnni512_pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                         int bits);
void kkv_vbmi512_pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                         int bits);
/* Key scores with a 15-bit query on one step per page and head
 * (attn_qkwide_vbmi_avx512.c; where the CPU has AVX-512 VBMI + VNNI). Its
 * own error bound (d = max |q_j scale_j| / 32639), not the int8 kernels' bits. */
void kkv_vbmi512_qk_wide(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                         int nb);
/* Key scores with an 8-bit query (attn_qkwide_vbmi_avx512.c; AVX-512 VBMI +
 * VNNI): the VBMI table's key kernel. Bit-identical to kkv_avx2_qk_byte on
 * pages with n_boost <= D / 2; the others go to kkv_vbmi512_qk_wide. */
void kkv_vbmi512_qk_byte(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                         int nb);
/* Key scores with a 16-bit query on one step per page and head, vpmaddwd
 * (attn_qkwide_avx2.c; the AVX2 table's key kernel). Its own error bound
 * (d = max |q_j scale_j| / kkv_qk_wide_qmax(D, nb), kernels/int_fold.h). */
void kkv_avx2_qk_wide(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                      int nb);
/* Key scores with an 8-bit query on one step per page and head, vpmaddubsw
 * (attn_qkbyte_avx2.c; the AVX2 tables' key kernel). Its error bound:
 * d = max |q_j scale_j| / 127. Pages with n_boost > D / 2 go to
 * kkv_avx2_qk_wide (and its bound). */
void kkv_avx2_qk_byte(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                      int nb);
void kkv_avxvnni_qk_page(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                         int nb);
void kkv_avxvnni_pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                         int bits);
/* The key kernel in two steps (attn_int_impl.h). plan: what depends only on
 * the page bytes (pair list, channel groups), written into plan_bytes(D)
 * caller-owned bytes; position-independent, so it serves the page's bytes
 * wherever they lie. page_plan: qk_page given that plan, bit-identical to
 * qk_page. */
#define KKV_QK_PLAN_DECL(pre)                                                                     \
    size_t kkv_##pre##_qk_plan_bytes(int D);                                                      \
    void   kkv_##pre##_qk_plan(uint8_t *plan, const uint8_t *page, int D, int G, int nb);         \
    void   kkv_##pre##_qk_page_plan(float *s, const float *q, int n_rep, const uint8_t *page,     \
                                    const uint8_t *plan, int D, int G, int nb);
KKV_QK_PLAN_DECL(avx2i)
KKV_QK_PLAN_DECL(vnni512)
KKV_QK_PLAN_DECL(avxvnni)
void kkv_avx2_softmax(float *s, float *ml, float *acc, int n_rep, int n, int D, float inv);
/* 512-bit qk_f16 / pv_f16 (attn_f16_avx512.c): bit-identical to kkv_avx2_*. */
void kkv_avx512_qk_f16(float *s, const float *q, int n_rep, const uint16_t *k, int n, int D,
                       const void *pf);
void kkv_avx512_pv_f16(float *acc, const float *p, int n_rep, const uint16_t *v, int n, int D,
                       const void *pf);
#endif

#endif
