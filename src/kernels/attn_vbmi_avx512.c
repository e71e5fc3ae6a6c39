/* Integer-domain value kernel with AVX-512 VBMI + VNNI: 512-bit vpdpbusd on
 * token quads that one vpermb per row chunk builds (attn_int_impl.h,
 * KKV_INT_VBMI). Run only where kkv_cpu_get()->vbmi; results bit-identical to
 * attn_int_avx2.c, since every integer sum is exact. The VBMI table has its
 * own key kernels (attn_qkwide_vbmi_avx512.c), so this build leaves the int8
 * key kernels out (KKV_INT_NO_QK). */
#define KKV_INT_DPBUSD(acc, u8, s8) _mm256_dpbusd_epi32(acc, u8, s8)
#define KKV_INT_VBMI 1
#define KKV_INT_NO_QK 1
#define KKV_INT_PV kkv_vbmi512_pv_page
#include "kernels/attn_int_impl.h"
