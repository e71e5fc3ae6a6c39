/* Asymmetric min/max group quantization (spec section 3). */
#include "quant/quant.h"

#include "core/fp16.h"

kkv_qparams kkv_qparams_of(float mn, float mx, int bits) {
    kkv_qparams p;
    float maxq = (float)((1 << bits) - 1);
    p.mn16 = kkv_f16_store(mn);
    p.scale16 = kkv_f16_store((mx - mn) / maxq);
    p.mn = kkv_f16_to_f32(p.mn16);
    p.scale = kkv_f16_to_f32(p.scale16);
    return p;
}

kkv_key_layout kkv_key_layout_of(int D, int G, int nb) {
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

kkv_value_layout kkv_value_layout_of(int D, int G, int bits) {
    kkv_value_layout l;
    l.codes = 0;
    l.scale = (size_t)G * (size_t)D * (size_t)bits / 8;
    l.mn = l.scale + 2 * (size_t)G;
    l.bytes = l.mn + 2 * (size_t)G;
    return l;
}

size_t kkv_key_page_bytes(int head_dim, int group, int n_boost) {
    if (head_dim <= 0 || group <= 0 || n_boost < 0 || n_boost > head_dim) return 0;
    return kkv_key_layout_of(head_dim, group, n_boost).bytes;
}

size_t kkv_value_page_bytes(int head_dim, int group, int bits) {
    if (head_dim <= 0 || group <= 0 || (bits != 2 && bits != 4)) return 0;
    return kkv_value_layout_of(head_dim, group, bits).bytes;
}
