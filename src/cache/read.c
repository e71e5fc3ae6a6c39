/* Reading the cache back as attention sees it (tests, tools, analysis). */
#include <string.h>

#include "cache/cache.h"
#include "cache/rotate.h"
#include "core/fp16.h"
#include "core/status.h"
#include "quant/quant.h"

static void widen_rows(float *dst, const uint16_t *src, int n, int D) {
    for (size_t i = 0; i < (size_t)n * D; i++) dst[i] = kkv_f16_to_f32(src[i]);
}

/* The sink's n rows as floats: fp16 rows, or int8 rows with sink_int8. */
static void sink_rows(const kkv_cache *c, float *dst, const uint16_t *src, int n) {
    if (!c->sink8) {
        widen_rows(dst, src, n, c->D);
        return;
    }
    for (int t = 0; t < n; t++)
        kkv_row8_decode(dst + (size_t)t * c->D, (const uint8_t *)(src + (size_t)t * c->srow), c->D);
}

kkv_status kkv_seq_read(const kkv_cache *c, float *k, float *v, int seq, int layer, int head) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_read: NULL cache");
    const kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "seq_read: no sequence %d", seq);
    if (layer < 0 || layer >= c->L || head < 0 || head >= c->H)
        return kkv_fail(KKV_ERR_INVALID_ARG, "seq_read: bad layer %d / head %d", layer, head);
    kkv_counts n = kkv_counts_of(c, s, layer);
    int D = c->D, G = c->G;
    size_t row = (size_t)D;
    /* tokens a windowed layer released read as zeros */
    if (k) {
        float *o = k;
        if (n.sink_held) sink_rows(c, o, kkv_sink_k(c, s, layer, head), n.sink);
        else memset(o, 0, (size_t)n.sink * row * sizeof *o);
        o += n.sink * row;
        for (int p = 0; p < n.kp; p++, o += (size_t)G * row) {
            if (p < n.drop) {
                memset(o, 0, (size_t)G * row * sizeof *o);
                continue;
            }
            const uint8_t *pg = kkv_kpage_ptr(c, s, p, layer, head);
            if (c->fp16) widen_rows(o, (const uint16_t *)(const void *)pg, G, D);
            else if (c->kbits == 8) kkv_key8_decode_ref(o, pg, D, G);
            else kkv_key_decode_ref(o, pg, D, G, kkv_kpage_nb(c, s, p, layer, head));
        }
        widen_rows(o, kkv_ktail(c, s, layer, head), n.ktail, D);
        if (c->krot) kkv_rot_back_rows(k, c->krot, n.len, D); /* stored rotated */
    }
    if (v) {
        float *o = v;
        if (n.sink_held) sink_rows(c, o, kkv_sink_v(c, s, layer, head), n.sink);
        else memset(o, 0, (size_t)n.sink * row * sizeof *o);
        o += n.sink * row;
        for (int p = 0; p < n.vp; p++, o += (size_t)G * row) {
            if (p < n.drop) {
                memset(o, 0, (size_t)G * row * sizeof *o);
                continue;
            }
            const uint8_t *pg = kkv_vpage_ptr(c, s, p, layer, head);
            if (c->fp16) widen_rows(o, (const uint16_t *)(const void *)pg, G, D);
            else kkv_value_decode_ref(o, pg, D, G, c->vbits);
        }
        for (int t = 0; t < n.vq % G; t++, o += row) { /* eager: a partial page */
            const uint8_t *pg = kkv_vpage_ptr(c, s, n.vp, layer, head);
            if (c->fp16) widen_rows(o, (const uint16_t *)(const void *)pg + (size_t)t * D, 1, D);
            else kkv_value_row_decode_ref(o, pg, t, D, G, c->vbits);
        }
        widen_rows(o, kkv_vtail(c, s, layer, head), n.vtail, D);
        if (c->vrot) kkv_rot_back_rows(v, c->vrot, n.len, D);
    }
    return KKV_OK;
}

kkv_status kkv_seq_key_page(const kkv_cache *c, void *dst, size_t dst_bytes, int seq,
                            int layer, int head, int page) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "key_page: NULL cache");
    const kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "key_page: no sequence %d", seq);
    if (layer < 0 || layer >= c->L || head < 0 || head >= c->H || page < 0 ||
        page >= s->ly[layer].kp)
        return kkv_fail(KKV_ERR_INVALID_ARG, "key_page: no page %d at layer %d head %d", page,
                        layer, head);
    if (page < kkv_counts_of(c, s, layer).drop)
        return kkv_fail(KKV_ERR_NOT_FOUND, "key_page: page %d of layer %d was released (before "
                        "the layer's window)", page, layer);
    size_t bytes = !c->bmode ? c->kpage
                             : kkv_key_page_bytes(c->D, c->G, kkv_kpage_nb(c, s, page, layer, head));
    if (!dst || dst_bytes < bytes)
        return kkv_fail(KKV_ERR_INVALID_ARG, "key_page: buffer of %zu bytes, page has %zu",
                        dst_bytes, bytes);
    memcpy(dst, kkv_kpage_ptr(c, s, page, layer, head), bytes);
    return KKV_OK;
}

int kkv_seq_key_page_boost(const kkv_cache *c, int seq, int layer, int head, int page) {
    const kkv_seq *s = c ? kkv_seq_get(c, seq) : NULL;
    if (!s || layer < 0 || layer >= c->L || head < 0 || head >= c->H || page < 0 ||
        page >= s->ly[layer].kp || page < kkv_counts_of(c, s, layer).drop)
        return -1;
    return c->fp16 ? 0 : kkv_kpage_nb(c, s, page, layer, head);
}

kkv_status kkv_seq_get_info(const kkv_cache *c, kkv_seq_info *out, int seq, int layer) {
    if (!c || !out) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_info: NULL argument");
    const kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "seq_info: no sequence %d", seq);
    if (layer < 0 || layer >= c->L)
        return kkv_fail(KKV_ERR_INVALID_ARG, "seq_info: layer %d outside 0..%d", layer, c->L - 1);
    kkv_counts n = kkv_counts_of(c, s, layer);
    out->len = n.len;
    out->sink = n.sink;
    out->key_pages = n.kp;
    out->value_pages = n.vp;
    out->key_buffer = n.ktail;
    out->value_tail = n.vtail;
    return KKV_OK;
}
