/* Runtime choice of the kernel table by CPU features. */
#include <stddef.h>

#include "attn/attn.h"
#include "core/cpu.h"

const kkv_ops *kkv_ops_get(kkv_kernel k) {
    switch (k) {
    case KKV_KERNEL_SCALAR: return &kkv_ops_scalar;
    case KKV_KERNEL_AUTO: return kkv_ops_get(kkv_kernel_best());
    default: return NULL;
    }
}

kkv_kernel kkv_kernel_best(void) { return KKV_KERNEL_SCALAR; }

const char *kkv_kernel_name(kkv_kernel k) {
    switch (k) {
    case KKV_KERNEL_AUTO: return "auto";
    case KKV_KERNEL_SCALAR: return "scalar";
    case KKV_KERNEL_AVX2: return "avx2";
    case KKV_KERNEL_AVX512: return "avx512";
    }
    return "unknown";
}
