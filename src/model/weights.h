/* Weight types (the ggml block formats) and the matmul on them. Weights stay
 * in their quantized blocks; rows are dequantized/dotted on the fly. */
#ifndef KKV_MODEL_WEIGHTS_H
#define KKV_MODEL_WEIGHTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/threads.h"
#include "kittykv_model.h"

/* ggml type ids this build can compute with. */
enum {
    KKV_WT_F32 = 0, KKV_WT_F16 = 1, KKV_WT_Q4_0 = 2, KKV_WT_Q4_1 = 3,
    KKV_WT_Q5_0 = 6, KKV_WT_Q5_1 = 7, KKV_WT_Q8_0 = 8,
    KKV_WT_Q2_K = 10, KKV_WT_Q3_K = 11, KKV_WT_Q4_K = 12, KKV_WT_Q5_K = 13,
    KKV_WT_Q6_K = 14, KKV_WT_BF16 = 30,
};

/* A 2-D weight matrix in the mapping: rows x cols, row-major, type blocks. */
typedef struct kkv_weight {
    uint32_t    type;
    int64_t     rows;      /* output features */
    int64_t     cols;      /* input features (ne[0]) */
    size_t      row_bytes;
    const void *data;      /* [rows][row_bytes] */
    /* NULL, or the same blocks in kkv_wt_pack's layout for groups of
     * pack_rows rows (borrowed; the matmul reads these where its kernels
     * take that group size) */
    const void *packed;    /* [ceil(rows/pack_rows)][cols/32][pack_rows rows' block, field by field] */
    int         pack_rows; /* 8 or 16 when packed */
} kkv_weight;

/* 1 if type is one of the above. */
int    kkv_wt_supported(uint32_t type);
/* Elements per block and bytes per block of a ggml type (0 if unknown: also
 * covers types the reader must size but we cannot compute with). */
int    kkv_wt_block_elems(uint32_t type);
size_t kkv_wt_block_bytes(uint32_t type);
const char *kkv_wt_name(uint32_t type);

/* out: [cols] = row `row` of w as fp32. */
void kkv_wt_dequant_row(float *out, const kkv_weight *w, int64_t row);


/* Bytes of one row of `cols` elements of a ggml type, in *out. KKV_ERR_UNSUPPORTED
 * for an unknown type, KKV_ERR_FORMAT if cols <= 0 or not a whole number of
 * blocks, or the size overflows. */
kkv_status kkv_wt_row_size(size_t *out, uint32_t type, int64_t cols);

/* Builds a weight view of a 2-D tensor (rows = ne[1], cols = ne[0]); a 1-D
 * tensor is one row. The view borrows t->data. KKV_ERR_UNSUPPORTED if the type
 * cannot be computed with, KKV_ERR_FORMAT if the tensor has more than two
 * non-unit dimensions or its byte size does not match. */
struct kkv_gguf_tensor;
kkv_status kkv_weight_from_tensor(kkv_weight *out, const struct kkv_gguf_tensor *t);

/* Which kernels kkv_matmul_ex uses. AUTO picks the best this CPU runs. */
typedef enum kkv_wt_impl {
    KKV_WT_IMPL_AUTO = 0, KKV_WT_IMPL_SCALAR = 1, KKV_WT_IMPL_AVX2 = 2,
    /* Exact activations: every weight row is dequantized to fp32 and dotted
     * with the fp32 x in double precision, with no Q8 rounding of x. Slow;
     * for checking the engine against an independent full-precision
     * reference, where Q8 rounding (a step function) makes trajectories
     * drift apart. */
    KKV_WT_IMPL_F32 = 3,
    /* aarch64: the NEON kernels (with sdot where the CPU has the dot-product
     * extension); the scalar kernels' bits. */
    KKV_WT_IMPL_NEON = 4,
} kkv_wt_impl;

/* out: [n][rows] = x @ w^T, x: [n][cols], with the kernels impl selects.
 * Threads split rows; each output element is computed the same way whatever n
 * or the thread count. KKV_ERR_UNSUPPORTED if impl cannot run on this
 * CPU/build or w->type is not computable, KKV_ERR_INVALID_ARG for an
 * inconsistent w (cols not a whole number of blocks, row_bytes wrong) or n < 0,
 * KKV_ERR_NOMEM if the activation scratch cannot be allocated (out unchanged).
 *
 * Arithmetic (the scalar kernels are the reference definition):
 *  - F32/F16/BF16: the fp32 dot product of the row and x.
 *  - every other type: x is first quantized to kkv_q8x blocks of 32
 *    (see kkv_q8x_quantize); each block contributes (d_w * d_x) * sumi, with
 *    sumi the exact integer dot product of the quants (K-quants: the integer
 *    sub-block scales folded in); Q4_1/Q5_1 add m_w * s_x per block, and
 *    Q2_K/Q4_K/Q5_K subtract (dmin_w * d_x) * (integer sub-block mins times
 *    the sums of x's quants over each sub-block).
 *  The scalar kernels add the block terms in order. For Q4_0, Q4_1, Q5_0,
 *  Q5_1, Q8_0, Q4_K, Q5_K and Q6_K the SIMD kernels do the same (8 or 16 rows
 *  at once, one per lane; rows of the last five that are not packed one row
 *  at a time, each block's integer sum first) and give the scalar bits; for
 *  the other types (Q2_K, Q3_K) they keep 8 fp32 lanes per row and
 *  add them at the end, so SIMD and scalar agree to within about 1e-6 *
 *  sum|terms| (tests hold them to 2e-5 relative to sum|terms|).
 *  Within one impl each output depends only on (its row, its x vector): not
 *  on n, the thread count, or where the row falls in a task. */
kkv_status kkv_matmul_ex(kkv_tp *tp, float *out, const kkv_weight *w, const float *x,
                         int n, kkv_wt_impl impl);

/* Up to KKV_MM_MULTI matmuls of the same x in one pool job: out[i] = x @
 * w[i]^T, each exactly as kkv_matmul_ex would compute it. x is quantized once
 * and the pool synchronises once (Q/K/V, gate/up of a decode step are
 * microseconds each; a pool job per weight cost as much as the work).
 * Weights with different column counts, or the F32 impl, run one by one. */
#define KKV_MM_MULTI 4
kkv_status kkv_matmul_multi(kkv_tp *tp, int nw, float *const *out, const kkv_weight *const *w,
                            const float *x, int n, kkv_wt_impl impl);

/* Packed weights. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K rows in groups of R (8 or 16, the
 * lanes of the row-block kernel that reads them): for each group and column
 * block, the group's R copies of that block field by field, so that the
 * kernel loads what it would otherwise transpose. A field at offset f of a
 * row's block (width 2: an fp16 scale; else a run of code or scale bytes, a
 * multiple of 4) is at R * f of the packed block: fp16 of row r at + 2 r,
 * bytes 4i..4i+3 of a run of row r at + 4 R i + 4 r. (A K-quant's block is
 * its 256-value super-block.) Q5's fifth bits (qh, 4 bytes per row) are at R * f too but
 * transposed: byte 4 r + k, bit g is the fifth bit of value 4 g + k of row
 * r (so the kernel shifts each into place with one 16-bit shift per code
 * register). The packed block has the size of R blocks, so row r (a
 * multiple of R) starts at r * row_bytes; a last group of fewer rows repeats
 * its first row. Why: transposing R rows' blocks in registers cost as many
 * instructions per block as the dot products of several x vectors, and R
 * rows side by side are R streams where the packed group is one (measured
 * in docs/RESULTS.md). */
/* Bytes of w packed in groups of R in *out; 0 if its type has no packed
 * layout (or rows is 0). KKV_ERR_INVALID_ARG for R not 8 or 16,
 * KKV_ERR_NOMEM if the size overflows. */
kkv_status kkv_wt_packed_size(size_t *out, const kkv_weight *w, int R);
/* dst: [kkv_wt_packed_size] = w's blocks packed in groups of R (w->data is
 * read; w->packed is ignored). KKV_ERR_UNSUPPORTED for a type without a
 * packed layout, KKV_ERR_INVALID_ARG for R not 8 or 16. */
kkv_status kkv_wt_pack(void *dst, const kkv_weight *w, int R);
/* The group size the matmul kernels of this CPU (KKV_WT_IMPL_AUTO) read
 * packed weights in; 0 where they read none or the environment says
 * KKV_WT_PACK=0. */
int kkv_wt_pack_rows(void);

/* One activation block: 32 values as d * q. s = d * (sum of q) (for Q4_1's
 * offset term), isum = sum of q, isum16 = sum of q[0..15] (for Q2_K's
 * 16-value sub-block mins). 48 bytes so q stays 16-byte aligned. */
typedef struct kkv_q8x {
    float   d;
    float   s;
    int32_t isum;
    int32_t isum16;
    int8_t  q[32];
} kkv_q8x;

/* dst: [cols/32] blocks = x [cols] quantized with round-to-nearest-even of
 * x / d, d = max|x| / 127 (d = 0 for an all-zero block; a non-finite block
 * gets d = NaN so the result propagates it). cols must be a multiple of 32. */
void kkv_q8x_quantize(kkv_q8x *dst, const float *x, int64_t cols);

/* Internal kernel table (one per impl): dot products of one weight row with
 * nx <= KKV_WT_NX activation vectors. res[j] = row . x_j. A batch decodes
 * each weight block once per group of KKV_WT_NX columns (8: 5% more tok/s
 * at batch 10 than 4 with the one-row kernels, whose one ymm accumulator per
 * column fits the 16 registers; the row-block kernels keep two per column,
 * which fit the 32 of the AVX-512 VNNI build and spill a few in the AVX2
 * build, not measured on an AVX2-only CPU). */
#define KKV_WT_NX 8

/* One line of the weight stream's software prefetch, into L2 where pf_l2
 * (kkv_cpu's wt_pf_l2, read once per call), else non-temporal: weights.c
 * says why the hint depends on the CPU. The hint must be a constant, hence
 * the branch, which goes the same way for the whole run. */
#define KKV_WT_PF(p, pf_l2)                                                                        \
    do {                                                                                           \
        if (pf_l2) __builtin_prefetch((p), 0, 1);                                                  \
        else __builtin_prefetch((p), 0, 0);                                                        \
    } while (0)
typedef struct kkv_wt_kernels {
    /* quantized types: xq[j] points to [cols/32] blocks */
    void (*dot_q)(float *res, uint32_t type, const void *row, int64_t cols,
                  const kkv_q8x *const *xq, int nx);
    /* F32/F16: xf[j] points to [cols] floats */
    void (*dot_f)(float *res, uint32_t type, const void *row, int64_t cols,
                  const float *const *xf, int nx);
    /* kkv_q8x_quantize, byte for byte (the SIMD tables vectorize it) */
    void (*quantize)(kkv_q8x *dst, const float *x, int64_t cols);
    /* KKV_WT_ROWS rows at once: res[j * KKV_WT_ROWS + r] = rows[r] . x_j,
     * nx <= KKV_WT_NX (a tail block repeats a row pointer). Returns 0, doing
     * nothing, for a type it does not cover (then dot_q row by row); nx == 0
     * only asks. [pf, pf_end) is prefetched on the way (speed only; may be
     * empty). NULL in the scalar table. Covered types give the scalar
     * kernels' bits. */
    int (*dot_q_rows)(float *res, uint32_t type, const uint8_t *const *rows, int64_t cols,
                      const kkv_q8x *const *xq, int nx, const uint8_t *pf, const uint8_t *pf_end);
    /* The same for KKV_WT_ROWS16 rows (res[j * KKV_WT_ROWS16 + r]), where the
     * table has 512-bit registers; NULL elsewhere. Same bits. */
    int (*dot_q_rows16)(float *res, uint32_t type, const uint8_t *const *rows, int64_t cols,
                        const kkv_q8x *const *xq, int nx, const uint8_t *pf, const uint8_t *pf_end);
    /* The same on one packed group of pack_rows rows, rows[0] its first
     * block (res[j * pack_rows + r]); NULL in the scalar table. Same bits. */
    int (*dot_q_pack)(float *res, uint32_t type, const uint8_t *const *rows, int64_t cols,
                      const kkv_q8x *const *xq, int nx, const uint8_t *pf, const uint8_t *pf_end);
    int pack_rows; /* the group size dot_q_pack reads (its register's lanes), 0 without */
} kkv_wt_kernels;
#define KKV_WT_ROWS 8
#define KKV_WT_ROWS16 16

extern const kkv_wt_kernels kkv_wt_kernels_scalar;
/* The scalar table's dot_q and dot_f (the NEON tables take them for what
 * their row kernels do not cover). */
void kkv_wt_scalar_dot_q(float *res, uint32_t type, const void *row, int64_t cols, const kkv_q8x *const *xq,
                         int nx);
void kkv_wt_scalar_dot_f(float *res, uint32_t type, const void *row, int64_t cols, const float *const *xf,
                         int nx);
#if defined(__x86_64__) || defined(__i386__)
extern const kkv_wt_kernels kkv_wt_kernels_avx2;
/* The AVX2 kernels with vpdpbusd (AVX-512 VNNI / AVX-VNNI): bit-identical. */
extern const kkv_wt_kernels kkv_wt_kernels_vnni;
extern const kkv_wt_kernels kkv_wt_kernels_avxvnni;
#endif
#if defined(__aarch64__)
/* NEON (weights_neon_impl.h): the scalar kernels' bits for Q4_0, Q4_1, Q8_0
 * rows side by side and for every packed type; the dotprod build is the same
 * with sdot. */
extern const kkv_wt_kernels kkv_wt_kernels_neon;
extern const kkv_wt_kernels kkv_wt_kernels_neon_dotprod;
#endif

#endif
