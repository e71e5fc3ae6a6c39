/* kkv_wt_pack: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K rows rearranged into
 * the packed layout of weights.h (the blocks of R rows, field by field; the
 * fifth bits of Q5 transposed). Plain C: the layout is the same on every
 * CPU, only the kernels that read it differ. */
#include <stdint.h>
#include <string.h>

#include "core/status.h"
#include "model/weights.h"

/* The fields of one row's block, by offset: fp16 scales (2 bytes), runs of
 * bytes taken 4 at a time (codes; the K-quants' scale bytes), and Q5's 32 fifth
 * bits (4 bytes; -1: none). Together they cover the block. */
typedef struct pack_fields {
    int n_f16, n_runs;
    int f16[2];
    int run[3][2]; /* [run]: offset, length (a multiple of 4) */
    int qh;
} pack_fields;

static int fields_of(pack_fields *F, uint32_t type) {
    switch (type) {
    case KKV_WT_Q4_0: *F = (pack_fields){1, 1, {0, 0}, {{2, 16}}, -1}; return 1;
    case KKV_WT_Q4_1: *F = (pack_fields){2, 1, {0, 2}, {{4, 16}}, -1}; return 1;
    case KKV_WT_Q5_0: *F = (pack_fields){1, 1, {0, 0}, {{6, 16}}, 2}; return 1;
    case KKV_WT_Q5_1: *F = (pack_fields){2, 1, {0, 2}, {{8, 16}}, 4}; return 1;
    case KKV_WT_Q8_0: *F = (pack_fields){1, 1, {0, 0}, {{2, 32}}, -1}; return 1;
    case KKV_WT_Q4_K: *F = (pack_fields){2, 2, {0, 2}, {{4, 12}, {16, 128}}, -1}; return 1;
    case KKV_WT_Q5_K: *F = (pack_fields){2, 3, {0, 2}, {{4, 12}, {16, 32}, {48, 128}}, -1}; return 1;
    case KKV_WT_Q6_K: *F = (pack_fields){1, 3, {208, 0}, {{0, 128}, {128, 64}, {192, 16}}, -1}; return 1;
    default: return 0;
    }
}

/* Q5's fifth bits of row r (qh, bit i: value i) in the order the kernels
 * want them: byte 4r + k, bit g = the fifth bit of value 4g + k. The kernel's
 * register g (g < 4: low nibbles, values 4g..; g >= 4: high nibbles, values
 * 16 + 4(g - 4)..) holds value 4g + k in byte k of row r's lane, so one
 * shift and mask of these bytes puts each value's bit 4 in place. */
static void pack_qh(uint8_t *dst, const uint8_t *qh) {
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int k = 0; k < 4; k++) {
        unsigned byte = 0;
        for (int g = 0; g < 8; g++) byte |= ((h >> (4 * g + k)) & 1u) << g;
        dst[k] = (uint8_t)byte;
    }
}

static kkv_status check_r(int R) {
    if (R != 8 && R != 16) return kkv_fail(KKV_ERR_INVALID_ARG, "pack: groups of %d rows (8 or 16)", R);
    return KKV_OK;
}

kkv_status kkv_wt_packed_size(size_t *out, const kkv_weight *w, int R) {
    pack_fields F;
    *out = 0;
    KKV_TRY(check_r(R));
    if (!fields_of(&F, w->type) || w->rows <= 0) return KKV_OK;
    uint64_t groups = ((uint64_t)w->rows + (uint64_t)R - 1) / (uint64_t)R;
    uint64_t group_bytes = (uint64_t)w->row_bytes * (uint64_t)R;
    if (group_bytes / (uint64_t)R != w->row_bytes || groups > SIZE_MAX / group_bytes)
        return kkv_fail(KKV_ERR_NOMEM, "pack: %s weight of %lld rows is too large", kkv_wt_name(w->type),
                        (long long)w->rows);
    *out = (size_t)(groups * group_bytes);
    return KKV_OK;
}

kkv_status kkv_wt_pack(void *dst, const kkv_weight *w, int R) {
    pack_fields F;
    KKV_TRY(check_r(R));
    if (!fields_of(&F, w->type))
        return kkv_fail(KKV_ERR_UNSUPPORTED, "pack: no packed layout for type %s (%u)",
                        kkv_wt_name(w->type) ? kkv_wt_name(w->type) : "?", w->type);
    const size_t bb = kkv_wt_block_bytes(w->type), nb = (size_t)(w->cols / kkv_wt_block_elems(w->type));
    const uint8_t *src = w->data;
    const size_t Rz = (size_t)R;
    uint8_t *out = dst; /* [groups][nb][R * bb] */
    for (int64_t g0 = 0; g0 < w->rows; g0 += R) {
        for (size_t b = 0; b < nb; b++, out += Rz * bb) {
            for (int r = 0; r < R; r++) {
                int64_t row = g0 + r < w->rows ? g0 + r : g0; /* a short group repeats its first row */
                const uint8_t *blk = src + (size_t)row * w->row_bytes + b * bb;
                for (int f = 0; f < F.n_f16; f++)
                    memcpy(out + Rz * (size_t)F.f16[f] + 2 * (size_t)r, blk + F.f16[f], 2);
                for (int f = 0; f < F.n_runs; f++)
                    for (int i = 0; i < F.run[f][1] / 4; i++)
                        memcpy(out + Rz * (size_t)F.run[f][0] + 4 * Rz * (size_t)i + 4 * (size_t)r,
                               blk + F.run[f][0] + 4 * i, 4);
                if (F.qh >= 0) pack_qh(out + Rz * (size_t)F.qh + 4 * (size_t)r, blk + F.qh);
            }
        }
    }
    return KKV_OK;
}
