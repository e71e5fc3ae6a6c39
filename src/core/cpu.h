/* Runtime CPU feature detection for kernel dispatch. */
#ifndef KKV_CORE_CPU_H
#define KKV_CORE_CPU_H

#include "core/export.h"

typedef struct kkv_cpu {
    int avx2;   /* AVX2 + FMA + F16C                  */
    int avx512; /* AVX-512 F + BW + VL + DQ            */
    int vnni;   /* AVX-512 VNNI                       */
    int avxvnni; /* AVX-VNNI (VEX vpdpbusd) + AVX2     */
    int vbmi;   /* AVX-512 VBMI + VBMI2 (vpermb, vpcompressb) + VNNI */
    int wt_pf_l2; /* weight-stream prefetch into L2 (prefetcht2), else non-temporal */
    int neon;   /* aarch64 Advanced SIMD (always there on aarch64) */
    int dotprod; /* aarch64 dot-product extension (sdot; Armv8.2+, HWCAP_ASIMDDP) */
} kkv_cpu;

/* Features of this CPU that this build can use; computed once. */
KKV_LAYER_API const kkv_cpu *kkv_cpu_get(void);

#endif
