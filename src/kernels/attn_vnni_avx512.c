/* Integer-domain page kernels with AVX-512 VNNI: vpdpbusd on 256-bit
 * registers (AVX512VL encoding; Zen 4 splits 512-bit operations into two
 * 256-bit halves anyway, and 256 bits keep one body for AVX-VNNI too). Run
 * only where kkv_cpu_get()->vnni; results bit-identical to attn_int_avx2.c
 * (attn_int_impl.h says why). */
#define KKV_INT_DPBUSD(acc, u8, s8) _mm256_dpbusd_epi32(acc, u8, s8)
#define KKV_INT_QK kkv_vnni512_qk_page
#define KKV_INT_PV kkv_vnni512_pv_page
#define KKV_INT_QK_PLAN_BYTES kkv_vnni512_qk_plan_bytes
#define KKV_INT_QK_PLAN kkv_vnni512_qk_plan
#define KKV_INT_QK_RUN kkv_vnni512_qk_page_plan
#include "kernels/attn_int_impl.h"
