/* The AVX2 weight kernels (compiled with -mavx2 -mfma -mf16c; the body is
 * weights_avx2_impl.h). */
#define KKV_WT_TABLE kkv_wt_kernels_avx2
#include "model/weights_avx2_impl.h"

typedef int kkv_weights_avx2_unit_; /* ISO C forbids an empty unit off x86 */
