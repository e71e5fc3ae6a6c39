/* Eight weight rows at once for Q4_0, Q4_1 and Q8_0, and for Q5_0, Q5_1,
 * Q4_K, Q5_K and Q6_K packed (part of
 * weights_avx2_impl.h; built in each of its three kernel sets), and sixteen
 * in the AVX-512 VNNI set (KKV_WT_ZMM, below). One body for both widths:
 * weights_rows_body.h.
 *
 * Why. The one-row kernel keeps 8 fp32 lanes per (row, x vector) and pays a
 * convert, a multiply and an FMA for every 32-value block and x vector; in a
 * batch those float operations outnumber the integer dots. Here one int32
 * lane is one row: a block of eight rows is transposed in registers (four
 * bytes of each row per lane), each x vector's block is broadcast four bytes
 * at a time, and eight u8 x s8 quad dots leave the exact integer block sum
 * of all eight rows in one register. The float work per block and x vector
 * is then one convert and a few multiplies and adds for eight rows.
 *
 * Arithmetic: per row, exactly the scalar reference's (weights.c
 * sdot_row_q): block by block, acc += (d_w * d_x) * (float)sumi and, for
 * Q4_1 and Q5_1, accm += m_w * s_x (Q4_K: accm -= (dmin_w * d_x) * mins),
 * then acc + accm, each operation rounded once as
 * there (the build has -ffp-contract=off). So these kernels give the scalar
 * kernels' bits, whatever the row's neighbours, the batch or the threads.
 *
 * Integer sums: Q4_1's codes are 0..15, dotted as unsigned. Q4_0's are
 * c - 8 with c 0..15: the sum of c * x minus 8 * (sum of x). Q8_0's are
 * signed: with vpdpbusd (no int16 stage) w + 128 as unsigned, minus 128 *
 * (sum of x); with vpmaddubsw that could saturate int16, so there |w| against
 * x with w's sign. All exact in int32. */

/* A block of eight rows: row pointers (a tail repeats one row; the extra
 * lanes are computed and dropped). */
#define WT_ROWS KKV_WT_ROWS

/* acc + the four u8 x s8 products of each int32 lane. */
static inline __m256i dpb(__m256i acc, __m256i u, __m256i s) {
#ifdef KKV_WT_DPBUSD
    return KKV_WT_DPBUSD(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

static inline int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline short ld16(const uint8_t *p) {
    short v;
    memcpy(&v, p, 2);
    return v;
}

/* 16 bytes at a (rows 0..3) and b (rows 4..7) as one register. */
static inline __m256i ld_pair(const uint8_t *a, const uint8_t *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)a)),
                                   _mm_loadu_si128((const __m128i *)(const void *)b), 1);
}

/* The 16 bytes at offset off of each of the eight rows, transposed: t[i]
 * holds bytes 4i..4i+3 of row r in int32 lane r. */
static inline void rows_16(__m256i t[4], const uint8_t *const *rp, size_t off) {
    __m256i a0 = ld_pair(rp[0] + off, rp[4] + off), a1 = ld_pair(rp[1] + off, rp[5] + off);
    __m256i a2 = ld_pair(rp[2] + off, rp[6] + off), a3 = ld_pair(rp[3] + off, rp[7] + off);
    __m256i u0 = _mm256_unpacklo_epi32(a0, a1), u1 = _mm256_unpackhi_epi32(a0, a1);
    __m256i u2 = _mm256_unpacklo_epi32(a2, a3), u3 = _mm256_unpackhi_epi32(a2, a3);
    t[0] = _mm256_unpacklo_epi64(u0, u2);
    t[1] = _mm256_unpackhi_epi64(u0, u2);
    t[2] = _mm256_unpacklo_epi64(u1, u3);
    t[3] = _mm256_unpackhi_epi64(u1, u3);
}

/* One fp16 at offset off of each row, as 8 fp32 lanes. */
static inline __m256 rows_f16(const uint8_t *const *rp, size_t off) {
    __m128i h = _mm_setr_epi16(ld16(rp[0] + off), ld16(rp[1] + off), ld16(rp[2] + off), ld16(rp[3] + off),
                               ld16(rp[4] + off), ld16(rp[5] + off), ld16(rp[6] + off), ld16(rp[7] + off));
    return _mm256_cvtph_ps(h);
}

/* The eight-row kernel: rows_q_nx (weights_rows_body.h on 256-bit registers). */
#define RW_FN       rows_q_nx
#define RW_ROWS_T   rows_16
#define RW_ROWS_F16 rows_f16
#include "model/weights_rows_ymm.h"
#include "model/weights_rows_body.h"

/* fn(res, type, rows, nb, xq, NX, pf, pf_end) with nx (1..8) as the constant
 * NX, so that each count gets its own unrolled copy. */
#define ROWS_NX_SWITCH(fn)                                          \
    switch (nx) {                                                   \
    case 1: fn(res, type, rows, nb, xq, 1, pf, pf_end); break;      \
    case 2: fn(res, type, rows, nb, xq, 2, pf, pf_end); break;      \
    case 3: fn(res, type, rows, nb, xq, 3, pf, pf_end); break;      \
    case 4: fn(res, type, rows, nb, xq, 4, pf, pf_end); break;      \
    case 5: fn(res, type, rows, nb, xq, 5, pf, pf_end); break;      \
    case 6: fn(res, type, rows, nb, xq, 6, pf, pf_end); break;      \
    case 7: fn(res, type, rows, nb, xq, 7, pf, pf_end); break;      \
    default: fn(res, type, rows, nb, xq, 8, pf, pf_end); break;     \
    }

#ifndef KKV_WT_ZMM /* the 512-bit build reads groups of sixteen (below) */
/* The same kernel on weights packed in groups of eight (kkv_wt_pack, R = 8):
 * the block's fields are already transposed, so the four code registers
 * and the eight scales are plain loads. rp[0] = the group's first block;
 * off is the field's offset in one row's block, as for rows_16. */
static inline void pk8_16(__m256i t[4], const uint8_t *const *rp, size_t off) {
    for (int i = 0; i < 4; i++)
        t[i] = _mm256_loadu_si256((const __m256i *)(const void *)(rp[0] + WT_ROWS * off + 32 * (size_t)i));
}

static inline __m256 pk8_f16(const uint8_t *const *rp, size_t off) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(rp[0] + WT_ROWS * off)));
}

/* Register i of a packed field at offset off read 4 bytes at a time: bytes
 * 4i..4i+3 of row r in lane r (Q5's transposed fifth bits: i = 0). */
static inline __m256i pk8_g(const uint8_t *const *rp, size_t off, int i) {
    return _mm256_loadu_si256((const __m256i *)(const void *)(rp[0] + WT_ROWS * off + 32 * (size_t)i));
}

#define RW_FN       pk8_q_nx
#define RW_ROWS_T   pk8_16
#define RW_ROWS_F16 pk8_f16
#define RW_ROWS_G   pk8_g
#include "model/weights_rows_ymm.h"
#include "model/weights_rows_body.h"
#endif

/* Types the row-block kernels read as rows side by side, and packed. */
static int rows_covers(uint32_t type) {
    return type == KKV_WT_Q4_0 || type == KKV_WT_Q4_1 || type == KKV_WT_Q8_0;
}
static int pack_covers(uint32_t type) {
    return rows_covers(type) || type == KKV_WT_Q5_0 || type == KKV_WT_Q5_1 || type == KKV_WT_Q4_K ||
           type == KKV_WT_Q5_K || type == KKV_WT_Q6_K;
}

/* A table entry `name` (the dot_q_rows signature) running kernel body fn:
 * 0 for a type covers() refuses, 1 without work for nx == 0 (the question
 * alone). */
#define ROWS_ENTRY(name, fn, covers)                                                                 \
    static int name(float *res, uint32_t type, const uint8_t *const *rows, int64_t cols,           \
                    const kkv_q8x *const *xq, int nx, const uint8_t *pf, const uint8_t *pf_end) { \
        if (!covers(type)) return 0;                                                               \
        if (nx == 0) return 1;                                                                     \
        int64_t nb = cols / 32;                                                                    \
        ROWS_NX_SWITCH(fn);                                                                        \
        return 1;                                                                                  \
    }

ROWS_ENTRY(avx2_dot_q_rows, rows_q_nx, rows_covers)

#ifndef KKV_WT_ZMM
ROWS_ENTRY(avx2_dot_q_pack8, pk8_q_nx, pack_covers)
#endif

#ifdef KKV_WT_ZMM
/* ---- sixteen rows per register (AVX-512 VNNI builds) ----
 * The same kernel with one int32 / fp32 lane per row of sixteen: every lane
 * does exactly what a lane of the eight-row kernel does (so the same bits),
 * and each broadcast of an x block, each scale product and each convert
 * serves sixteen rows instead of eight: a batch's matmuls run 1.35x faster
 * (Q4_1 / Q8_0, 8-16 x vectors). A single x vector streams sixteen rows side
 * by side from DRAM, which measured 30% slower than eight, so the driver
 * takes these from MM_ROWS16_MIN_N vectors up (weights.c). A tail block
 * repeats a row. */

/* 16 bytes at a, b, c, d as the four 128-bit lanes of one register. */
static inline __m512i ld_quad(const uint8_t *a, const uint8_t *b, const uint8_t *c, const uint8_t *d) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)a));
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(const void *)b), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(const void *)c), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128((const __m128i *)(const void *)d), 3);
}

/* rows_16 for sixteen rows: t[i] holds bytes 4i..4i+3 of row r in lane r. */
static inline void rows16_16(__m512i t[4], const uint8_t *const *rp, size_t off) {
    __m512i a[4];
    for (int m = 0; m < 4; m++) a[m] = ld_quad(rp[m] + off, rp[m + 4] + off, rp[m + 8] + off, rp[m + 12] + off);
    __m512i u0 = _mm512_unpacklo_epi32(a[0], a[1]), u1 = _mm512_unpackhi_epi32(a[0], a[1]);
    __m512i u2 = _mm512_unpacklo_epi32(a[2], a[3]), u3 = _mm512_unpackhi_epi32(a[2], a[3]);
    t[0] = _mm512_unpacklo_epi64(u0, u2);
    t[1] = _mm512_unpackhi_epi64(u0, u2);
    t[2] = _mm512_unpacklo_epi64(u1, u3);
    t[3] = _mm512_unpackhi_epi64(u1, u3);
}

/* One fp16 at offset off of each of the sixteen rows, as 16 fp32 lanes. */
static inline __m512 rows16_f16(const uint8_t *const *rp, size_t off) {
    short h[16];
    for (int r = 0; r < 16; r++) h[r] = ld16(rp[r] + off);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)h));
}

#define RW_FN       rows16_q_nx
#define RW_ROWS_T   rows16_16
#define RW_ROWS_F16 rows16_f16
#include "model/weights_rows_zmm.h"
#include "model/weights_rows_body.h"

/* The sixteen-row kernel on weights packed in groups of sixteen (rows[0]:
 * the group's first block; kkv_wt_pack, R = 16). */
static inline void pk16_16(__m512i t[4], const uint8_t *const *rp, size_t off) {
    for (int i = 0; i < 4; i++) t[i] = _mm512_loadu_si512(rp[0] + KKV_WT_ROWS16 * off + 64 * (size_t)i);
}

static inline __m512 pk16_f16(const uint8_t *const *rp, size_t off) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(rp[0] + KKV_WT_ROWS16 * off)));
}

static inline __m512i pk16_g(const uint8_t *const *rp, size_t off, int i) {
    return _mm512_loadu_si512(rp[0] + KKV_WT_ROWS16 * off + 64 * (size_t)i);
}

#define RW_FN       pk16_q_nx
#define RW_ROWS_T   pk16_16
#define RW_ROWS_F16 pk16_f16
#define RW_ROWS_G   pk16_g
#include "model/weights_rows_zmm.h"
#include "model/weights_rows_body.h"

ROWS_ENTRY(zmm_dot_q_pack16, pk16_q_nx, pack_covers)

ROWS_ENTRY(zmm_dot_q_rows16, rows16_q_nx, rows_covers)
#endif
