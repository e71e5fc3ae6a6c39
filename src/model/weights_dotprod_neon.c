/* The NEON weight kernels with the dot-product extension's sdot (compiled
 * with -march=armv8.2-a+dotprod; run where kkv_cpu_get()->dotprod). The same
 * integer sums, so the bits of weights_neon.c and of the scalar kernels. */
#define KKV_WT_TABLE kkv_wt_kernels_neon_dotprod
#define KKV_WT_SDOT  1
#include "model/weights_neon_impl.h"
