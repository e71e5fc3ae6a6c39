/* Asymmetric min/max group quantization (docs/FORMAT.md section 1). */
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

size_t kkv_key_page_bytes(int head_dim, int group, int n_boost) {
    if (head_dim <= 0 || group <= 0 || n_boost < 0 || n_boost > head_dim) return 0;
    return kkv_key_layout_of(head_dim, group, n_boost).bytes;
}

size_t kkv_key8_page_bytes(int head_dim, int group) {
    if (head_dim <= 0 || group <= 0) return 0;
    return kkv_key8_layout_of(head_dim, group).bytes;
}

size_t kkv_method_key_page_bytes(const kkv_method *m, int head_dim, int n_boost) {
    if (!m || head_dim <= 0 || m->group <= 0) return 0;
    if (m->fp16) return (size_t)m->group * (size_t)head_dim * 2;
    if (m->key_bits == 8) return kkv_key8_page_bytes(head_dim, m->group);
    return kkv_key_page_bytes(head_dim, m->group, n_boost);
}

size_t kkv_value_page_bytes(int head_dim, int group, int bits) {
    if (head_dim <= 0 || group <= 0 || (bits != 2 && bits != 4 && bits != 8)) return 0;
    return kkv_value_layout_of(head_dim, group, bits).bytes;
}
