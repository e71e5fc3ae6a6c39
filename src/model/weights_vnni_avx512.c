/* The AVX2 weight kernels with AVX-512 VNNI's 256-bit vpdpbusd (compiled
 * with AVX-512 F/BW/VL/DQ/VNNI; run where kkv_cpu_get()->vnni). One vpdpbusd
 * replaces vpmaddubsw + vpmaddwd for every 4-bit, 5-bit and 8-bit block,
 * with bit-identical results (weights_avx2_impl.h says why). */
#define KKV_WT_TABLE  kkv_wt_kernels_vnni
#define KKV_WT_DPBUSD _mm256_dpbusd_epi32
#define KKV_WT_ZMM    1 /* and the sixteen-row 512-bit kernels */
#include "model/weights_avx2_impl.h"

typedef int kkv_weights_vnni_avx512_unit_; /* ISO C forbids an empty unit off x86 */
