/* Where the parts of a key page and a value page start (docs/FORMAT.md
 * section 2). The one definition of the page layout: C code and the CUDA
 * kernel (src/cuda/attn.cu) both include it, so it is plain inline C with no
 * dependency on the rest of the library. */
#ifndef KKV_QUANT_LAYOUT_H
#define KKV_QUANT_LAYOUT_H

#include <stddef.h>

#if defined(__CUDACC__)
#define KKV_HD __host__ __device__
#else
#define KKV_HD
#endif

/* Offsets in bytes from the page start. */
typedef struct kkv_key_layout {
    size_t lo;    /* [D][G/4]  */
    size_t hi;    /* [nb][G/4] */
    size_t idx;   /* [D]       */
    size_t scale; /* [D] fp16  */
    size_t mn;    /* [D] fp16  */
    size_t bytes; /* whole page */
} kkv_key_layout;

/* The 8-bit key page (key_bits = 8): no boost, one byte per code. */
typedef struct kkv_key8_layout {
    size_t codes; /* [D][G]   */
    size_t scale; /* [D] fp16 */
    size_t mn;    /* [D] fp16 */
    size_t bytes;
} kkv_key8_layout;

typedef struct kkv_value_layout {
    size_t codes; /* [G][D*bits/8] */
    size_t scale; /* [G] fp16      */
    size_t mn;    /* [G] fp16      */
    size_t bytes;
} kkv_value_layout;

static inline KKV_HD kkv_key_layout kkv_key_layout_of(int D, int G, int nb) {
    kkv_key_layout l;
    size_t row = (size_t)G / 4;
    l.lo = 0;
    l.hi = l.lo + (size_t)D * row;
    l.idx = l.hi + (size_t)nb * row;
    l.scale = l.idx + (size_t)D;
    l.mn = l.scale + 2 * (size_t)D;
    l.bytes = l.mn + 2 * (size_t)D;
    return l;
}

static inline KKV_HD kkv_key8_layout kkv_key8_layout_of(int D, int G) {
    kkv_key8_layout l;
    l.codes = 0;
    l.scale = (size_t)D * (size_t)G;
    l.mn = l.scale + 2 * (size_t)D;
    l.bytes = l.mn + 2 * (size_t)D;
    return l;
}

static inline KKV_HD kkv_value_layout kkv_value_layout_of(int D, int G, int bits) {
    kkv_value_layout l;
    l.codes = 0;
    l.scale = (size_t)G * (size_t)D * (size_t)bits / 8;
    l.mn = l.scale + 2 * (size_t)G;
    l.bytes = l.mn + 2 * (size_t)G;
    return l;
}

#endif
