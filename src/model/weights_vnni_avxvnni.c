/* The AVX2 weight kernels with AVX-VNNI's VEX vpdpbusd (compiled with
 * -mavxvnni; run where kkv_cpu_get()->avxvnni and AVX-512 VNNI is absent).
 * Bit-identical to the AVX2 kernels (weights_avx2_impl.h says why). */
#define KKV_WT_TABLE  kkv_wt_kernels_avxvnni
#define KKV_WT_DPBUSD _mm256_dpbusd_avx_epi32
#include "model/weights_avx2_impl.h"

typedef int kkv_weights_vnni_avxvnni_unit_; /* ISO C forbids an empty unit off x86 */
