/* AVX-512 tables. The page kernels are the integer-domain ones of
 * attn_int_impl.h: with vpdpbusd where the CPU has AVX-512 VNNI, else the
 * AVX2 build of them (every AVX-512 CPU runs AVX2 code). The former AVX-512 float qk_page was
 * 3x slower than the integer kernel on Zen 4 and is gone. Results agree with
 * the scalar reference within the bounds of kernels.h; flush bytes are
 * identical (the AVX2 codecs). */
#include "kernels/attn_simd.h"

const kkv_ops kkv_ops_avx512 = {
    .kind = KKV_KERNEL_AVX512,
    .qk_f16 = kkv_avx2_qk_f16,
    .qk_page = kkv_avx2i_qk_page,
    .pv_f16 = kkv_avx2_pv_f16,
    .pv_page = kkv_avx2i_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx2_softmax,
};

/* The same with the VNNI page kernels (dispatch picks it where cpu->vnni). */
const kkv_ops kkv_ops_avx512vnni = {
    .kind = KKV_KERNEL_AVX512,
    .qk_f16 = kkv_avx2_qk_f16,
    .qk_page = kkv_vnni512_qk_page,
    .pv_f16 = kkv_avx2_pv_f16,
    .pv_page = kkv_vnni512_pv_page,
    .key_encode = kkv_avx2_key_encode,
    .value_encode = kkv_avx2_value_encode,
    .softmax = kkv_avx2_softmax,
};
