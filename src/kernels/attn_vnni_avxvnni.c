/* Integer-domain page kernels with AVX-VNNI (the VEX-encoded 256-bit
 * vpdpbusd of CPUs with AVX-VNNI but maybe no AVX-512: Alder Lake and later,
 * Zen 5). Run only where kkv_cpu_get()->avxvnni; results bit-identical to
 * attn_int_avx2.c (attn_int_impl.h says why). */
#define KKV_INT_DPBUSD(acc, u8, s8) _mm256_dpbusd_avx_epi32(acc, u8, s8)
#define KKV_INT_QK kkv_avxvnni_qk_page
#define KKV_INT_PV kkv_avxvnni_pv_page
#define KKV_INT_QK_PLAN_BYTES kkv_avxvnni_qk_plan_bytes
#define KKV_INT_QK_PLAN kkv_avxvnni_qk_plan
#define KKV_INT_QK_RUN kkv_avxvnni_qk_page_plan
#include "kernels/attn_int_impl.h"
