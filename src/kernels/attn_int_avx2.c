/* Integer-domain AVX2 page kernels (vpmaddubsw, int16 sums widened to int32);
 * the body and its error bounds are in attn_int_impl.h. */
#define KKV_INT_QK kkv_avx2i_qk_page
#define KKV_INT_PV kkv_avx2i_pv_page
#define KKV_INT_QK_PLAN_BYTES kkv_avx2i_qk_plan_bytes
#define KKV_INT_QK_PLAN kkv_avx2i_qk_plan
#define KKV_INT_QK_RUN kkv_avx2i_qk_page_plan
#include "kernels/attn_int_impl.h"
