/* Group quantization and the page codecs of docs/FORMAT.md sections 1-2 (scalar
 * reference). Pages are byte arrays in the public format of kittykv.h; the
 * offsets below locate each part. */
#ifndef KKV_QUANT_QUANT_H
#define KKV_QUANT_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kittykv.h"
#include "quant/layout.h"


/* Min/max quantization parameters of a group, per docs/FORMAT.md section 1: the fp16
 * scale and min, and the fp32 values they widen to. */
typedef struct kkv_qparams {
    uint16_t scale16, mn16;
    float    scale, mn; /* widened stored values */
} kkv_qparams;

kkv_qparams kkv_qparams_of(float mn, float mx, int bits);

/* Clipped range (clip.c): of the ranges [mn + a*d, mx - b*d] on a grid of d =
 * (mx - mn) / (bits == 2 ? 16 : 64), a, b = 0..7, a + b <= 10, the one whose
 * stored fp16 parameters give the least squared error over the n numbers
 * x[i * stride] (ties to the smaller a, then b: min/max wins a tie). mn, mx:
 * their min and max. Values outside the range clamp to its ends. */
kkv_qparams kkv_qparams_search(const float *x, size_t stride, int n, float mn, float mx,
                               int bits);

/* Pair-aware ranking (select.c): channels scored as kkv_rank_channels would
 * (sel = magnitude, variance or range), a RoPE pair scored by the sum of its
 * two, pairs ranked (ties to the lower first channel) and both channels of a
 * pair emitted together, the higher-scored first. Partner of channel j < rope_dims:
 * j ^ 1 (neox 0) or j +- rope_dims/2 (neox 1); channels >= rope_dims are
 * pairs of one, scored twice their own score. order: [D]. */
void kkv_rank_pairs(uint8_t *order, const float *k, int D, int G, kkv_select sel, int neox,
                    int rope_dims);

/* The code of x: clamp(floor((x - mn) / scale + 0.5), 0, 2^bits - 1), or 0 when
 * scale is 0. x must be finite. */
static inline uint8_t kkv_quant_code(float x, const kkv_qparams *p, int maxq) {
    if (p->scale == 0.0f) return 0;
    float y = (x - p->mn) / p->scale + 0.5f;
    /* clamp in float first: converting an out-of-range float to int is UB */
    if (!(y >= 0.0f)) return 0;
    if (y >= (float)maxq) return (uint8_t)maxq;
    return (uint8_t)(int)y; /* y >= 0: truncation is floor */
}

/* Min and max of channel j over the G tokens of k [G][D]. */
static inline void kkv_channel_range(const float *k, int D, int G, int j, float *mn, float *mx) {
    float lo = k[j], hi = k[j];
    for (int t = 1; t < G; t++) {
        float x = k[(size_t)t * D + j];
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    *mn = lo, *mx = hi;
}

/* Channel ranking for boost selection. order: [D] out, channels from most to
 * least important. k: [G][D] (fp16-exact floats). Ties go to the lower index. */
void kkv_rank_channels(uint8_t *order, const float *k, int D, int G, kkv_select sel,
                       uint64_t seed, uint64_t page, const uint8_t *explicit_rank);

/* score [D] of channel ranking sel = magnitude, variance or range over k
 * [G][D] (what kkv_rank_channels sorts by). */
void kkv_score_channels(float *score, const float *k, int D, int G, kkv_select sel);

/* Pooled boost budget (budget.c). kkv_boost_gain: score [D] = squared error
 * over the page of channel j at 2 bits minus at 4 bits (ranges as the codec
 * picks them: clipped when clip = 1). kkv_budget_alloc: given score [H][D]
 * (larger = boost first), gives `total` boosted channels to the channels of
 * all H heads greedily by score per channel, whole RoPE pairs (pairs = 1, the
 * map of kkv_rank_pairs, a pair valued at the mean of its two) while they fit,
 * ties to the lower head, then the lower channel. Out: nb [H] per head (sum =
 * total), order [H][D] per head, boosted channels first in the order taken,
 * then the rest ascending. -1 (nothing written) on a bad shape. */
#define KKV_MAX_BUDGET_HEADS 32
void kkv_boost_gain(float *score, const float *k, int D, int G, int clip);
int  kkv_budget_alloc(uint8_t *order, int *nb, const float *score, int H, int D, int total,
                      int pairs, int neox, int rope_dims);

/* order: [D] channels sorted by score [D], descending, ties to the lower
 * index. Every kernel ranks through this, so their pages agree. */
void kkv_order_channels(uint8_t *order, const float *score, int D);


/* Scalar page codecs. k, v: [G][D] fp16-exact floats (already rounded). */
void kkv_key_encode_ref(uint8_t *page, const float *k, int D, int G, int nb,
                        const uint8_t *order);
void kkv_key_decode_ref(float *k, const uint8_t *page, int D, int G, int nb);
/* 8-bit key page: per channel min/max over the G tokens, codes 0..255. */
void kkv_key8_encode_ref(uint8_t *page, const float *k, int D, int G);
void kkv_key8_decode_ref(float *k, const uint8_t *page, int D, int G);
void kkv_value_encode_ref(uint8_t *page, const float *v, int D, int G, int bits);
void kkv_value_decode_ref(float *v, const uint8_t *page, int D, int G, int bits);
/* Row t of a value page alone (the page's other rows are left as they are):
 * encode x [D] / decode into x [D]. The whole-page codecs are these per row. */
void kkv_value_row_encode_ref(uint8_t *page, int t, const float *x, int D, int G, int bits);
/* The same codecs with clip = 1: ranges from kkv_qparams_search (clip = 0 is
 * the plain codec). The page format is unchanged. */
void kkv_key_encode_clip_ref(uint8_t *page, const float *k, int D, int G, int nb,
                             const uint8_t *order, int clip);
void kkv_value_row_encode_clip_ref(uint8_t *page, int t, const float *x, int D, int G, int bits,
                                   int clip);
void kkv_value_row_decode_ref(float *x, const uint8_t *page, int t, int D, int G, int bits);

/* int8 sink rows (row8.c): row [D + 2] bytes = D int8 codes, then the fp16
 * scale amax / 127 of the fp16-rounded x [D]; x' = code * scale. */
void kkv_row8_encode(uint8_t *row, const float *x, int D);
void kkv_row8_decode(float *x, const uint8_t *row, int D);

/* Little-endian fp16 load/store at any alignment. */
static inline uint16_t kkv_ld16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline void kkv_st16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

#endif
