/* Runtime choice of the kernel table by CPU features (kkv_cpu_get(), which
 * KKV_CPU=scalar|avx2|avxvnni|avx512 can cap; on aarch64 the NEON table, which KKV_CPU=scalar caps). A kernel kind names an
 * instruction-set level; within it the VNNI page kernels are taken where the
 * CPU has them (bit-identical results, only faster). */
#include <stddef.h>

#include "kernels/kernels.h"
#include "core/cpu.h"

const kkv_ops *kkv_ops_get(kkv_kernel k) {
    switch (k) {
    case KKV_KERNEL_SCALAR: return &kkv_ops_scalar;
    case KKV_KERNEL_AUTO: return kkv_ops_get(kkv_kernel_best());
#if defined(__x86_64__)
    case KKV_KERNEL_AVX2: {
        const kkv_cpu *cpu = kkv_cpu_get();
        return !cpu->avx2 ? NULL : cpu->avxvnni ? &kkv_ops_avx2vnni : &kkv_ops_avx2;
    }
    case KKV_KERNEL_AVX512: {
        const kkv_cpu *cpu = kkv_cpu_get();
        return !cpu->avx512 ? NULL
               : cpu->vbmi  ? &kkv_ops_avx512vbmi
               : cpu->vnni  ? &kkv_ops_avx512vnni
                            : &kkv_ops_avx512;
    }
#endif
#if defined(__aarch64__)
    case KKV_KERNEL_NEON: return kkv_cpu_get()->neon ? &kkv_ops_neon : NULL;
#endif
    default: return NULL;
    }
}

kkv_kernel kkv_kernel_best(void) {
#if defined(__x86_64__)
    const kkv_cpu *cpu = kkv_cpu_get();
    if (cpu->avx512) return KKV_KERNEL_AVX512;
    if (cpu->avx2) return KKV_KERNEL_AVX2;
#endif
#if defined(__aarch64__)
    if (kkv_cpu_get()->neon) return KKV_KERNEL_NEON;
#endif
    return KKV_KERNEL_SCALAR;
}

const char *kkv_kernel_name(kkv_kernel k) {
    switch (k) {
    case KKV_KERNEL_AUTO: return "auto";
    case KKV_KERNEL_SCALAR: return "scalar";
    case KKV_KERNEL_AVX2: return "avx2";
    case KKV_KERNEL_AVX512: return "avx512";
    case KKV_KERNEL_NEON: return "neon";
    }
    return "unknown";
}
