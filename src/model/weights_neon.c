/* The NEON weight kernels for every aarch64 CPU (Advanced SIMD is part of
 * the base set; the body is weights_neon_impl.h). */
#define KKV_WT_TABLE kkv_wt_kernels_neon
#include "model/weights_neon_impl.h"
