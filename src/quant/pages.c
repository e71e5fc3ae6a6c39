/* Scalar reference codecs of the key and value pages (docs/FORMAT.md section 2). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "core/status.h"
#include "quant/quant.h"

void kkv_key_encode_ref(uint8_t *page, const float *k, int D, int G, int nb,
                        const uint8_t *order) {
    kkv_key_encode_clip_ref(page, k, D, G, nb, order, 0);
}

void kkv_key_encode_clip_ref(uint8_t *page, const float *k, int D, int G, int nb,
                             const uint8_t *order, int clip) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    size_t row = (size_t)G / 4;
    memset(page, 0, L.bytes);
    uint8_t *idx = page + L.idx;
    memset(idx, nb, (size_t)D);
    for (int r = 0; r < nb; r++) idx[order[r]] = (uint8_t)r;
    for (int j = 0; j < D; j++) {
        float mn, mx;
        kkv_channel_range(k, D, G, j, &mn, &mx);
        int boosted = idx[j] < nb;
        int maxq = boosted ? 15 : 3;
        kkv_qparams p = clip ? kkv_qparams_search(k + j, (size_t)D, G, mn, mx, boosted ? 4 : 2)
                             : kkv_qparams_of(mn, mx, boosted ? 4 : 2);
        kkv_st16(page + L.scale + 2 * (size_t)j, p.scale16);
        kkv_st16(page + L.mn + 2 * (size_t)j, p.mn16);
        uint8_t *lo = page + L.lo + (size_t)j * row;
        uint8_t *hi = boosted ? page + L.hi + (size_t)idx[j] * row : NULL;
        for (int t = 0; t < G; t++) {
            uint8_t q = kkv_quant_code(k[(size_t)t * D + j], &p, maxq);
            lo[t / 4] |= (uint8_t)((q & 3) << (2 * (t % 4)));
            if (hi) hi[t / 4] |= (uint8_t)((q >> 2) << (2 * (t % 4)));
        }
    }
}

void kkv_key_decode_ref(float *k, const uint8_t *page, int D, int G, int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    size_t row = (size_t)G / 4;
    const uint8_t *idx = page + L.idx;
    for (int j = 0; j < D; j++) {
        float scale = kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * (size_t)j));
        float mn = kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * (size_t)j));
        const uint8_t *lo = page + L.lo + (size_t)j * row;
        const uint8_t *hi = idx[j] < nb ? page + L.hi + (size_t)idx[j] * row : NULL;
        for (int t = 0; t < G; t++) {
            int q = (lo[t / 4] >> (2 * (t % 4))) & 3;
            if (hi) q |= ((hi[t / 4] >> (2 * (t % 4))) & 3) << 2;
            k[(size_t)t * D + j] = (float)q * scale + mn;
        }
    }
}

void kkv_key8_encode_ref(uint8_t *page, const float *k, int D, int G) {
    kkv_key8_layout L = kkv_key8_layout_of(D, G);
    for (int j = 0; j < D; j++) {
        float mn, mx;
        kkv_channel_range(k, D, G, j, &mn, &mx);
        kkv_qparams p = kkv_qparams_of(mn, mx, 8);
        kkv_st16(page + L.scale + 2 * (size_t)j, p.scale16);
        kkv_st16(page + L.mn + 2 * (size_t)j, p.mn16);
        uint8_t *codes = page + L.codes + (size_t)j * G; /* [G] */
        for (int t = 0; t < G; t++) codes[t] = kkv_quant_code(k[(size_t)t * D + j], &p, 255);
    }
}

void kkv_key8_decode_ref(float *k, const uint8_t *page, int D, int G) {
    kkv_key8_layout L = kkv_key8_layout_of(D, G);
    for (int j = 0; j < D; j++) {
        float scale = kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * (size_t)j));
        float mn = kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * (size_t)j));
        const uint8_t *codes = page + L.codes + (size_t)j * G;
        for (int t = 0; t < G; t++) k[(size_t)t * D + j] = (float)codes[t] * scale + mn;
    }
}

void kkv_value_row_encode_ref(uint8_t *page, int t, const float *x, int D, int G, int bits) {
    kkv_value_row_encode_clip_ref(page, t, x, D, G, bits, 0);
}

void kkv_value_row_encode_clip_ref(uint8_t *page, int t, const float *x, int D, int G, int bits,
                                   int clip) {
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    size_t row = (size_t)D * (size_t)bits / 8;
    int per_byte = 8 / bits, maxq = (1 << bits) - 1;
    float mn = x[0], mx = x[0];
    for (int c = 1; c < D; c++) {
        mn = x[c] < mn ? x[c] : mn;
        mx = x[c] > mx ? x[c] : mx;
    }
    kkv_qparams p = clip ? kkv_qparams_search(x, 1, D, mn, mx, bits) : kkv_qparams_of(mn, mx, bits);
    kkv_st16(page + L.scale + 2 * (size_t)t, p.scale16);
    kkv_st16(page + L.mn + 2 * (size_t)t, p.mn16);
    uint8_t *codes = page + L.codes + (size_t)t * row;
    memset(codes, 0, row);
    for (int c = 0; c < D; c++) {
        uint8_t q = kkv_quant_code(x[c], &p, maxq);
        codes[c / per_byte] |= (uint8_t)(q << (bits * (c % per_byte)));
    }
}

/* A value's group is its own token: the page is its G rows encoded one by one. */
void kkv_value_encode_ref(uint8_t *page, const float *v, int D, int G, int bits) {
    for (int t = 0; t < G; t++) kkv_value_row_encode_ref(page, t, v + (size_t)t * D, D, G, bits);
}

void kkv_value_row_decode_ref(float *x, const uint8_t *page, int t, int D, int G, int bits) {
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    size_t row = (size_t)D * (size_t)bits / 8;
    int per_byte = 8 / bits, maxq = (1 << bits) - 1;
    float scale = kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * (size_t)t));
    float mn = kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * (size_t)t));
    const uint8_t *codes = page + L.codes + (size_t)t * row;
    for (int c = 0; c < D; c++) {
        int q = (codes[c / per_byte] >> (bits * (c % per_byte))) & maxq;
        x[c] = (float)q * scale + mn;
    }
}

void kkv_value_decode_ref(float *v, const uint8_t *page, int D, int G, int bits) {
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    size_t row = (size_t)D * (size_t)bits / 8;
    int per_byte = 8 / bits, maxq = (1 << bits) - 1;
    for (int t = 0; t < G; t++) {
        float scale = kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * (size_t)t));
        float mn = kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * (size_t)t));
        const uint8_t *codes = page + L.codes + (size_t)t * row;
        for (int c = 0; c < D; c++) {
            int q = (codes[c / per_byte] >> (bits * (c % per_byte))) & maxq;
            v[(size_t)t * D + c] = (float)q * scale + mn;
        }
    }
}

/* ---- public wrappers: validate, round to fp16 as the cache does, encode */

static kkv_status check_shape(int D, int G, const char *what) {
    if (D < 4 || D > KKV_MAX_HEAD_DIM || D % 4)
        return kkv_fail(KKV_ERR_INVALID_ARG, "%s: head_dim %d must be a multiple of 4 in 4..%d",
                        what, D, KKV_MAX_HEAD_DIM);
    if (G < 4 || G > 4096 || G % 4)
        return kkv_fail(KKV_ERR_INVALID_ARG, "%s: group %d must be a multiple of 4 in 4..4096",
                        what, G);
    return KKV_OK;
}

/* Copies x into y rounded through fp16; KKV_ERR_NONFINITE on NaN/Inf. */
static kkv_status round_f16(float *y, const float *x, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            return kkv_fail(KKV_ERR_NONFINITE, "%s: non-finite input at element %zu", what, i);
        y[i] = kkv_f16_round(x[i]);
    }
    return KKV_OK;
}

kkv_status kkv_key_page_encode(void *dst, const float *k, int head_dim, int group,
                               int n_boost, kkv_select sel, uint64_t seed, uint64_t page,
                               const uint8_t *rank) {
    KKV_TRY(check_shape(head_dim, group, "key page"));
    if (!dst || !k || n_boost < 0 || n_boost > head_dim)
        return kkv_fail(KKV_ERR_INVALID_ARG, "key page: bad buffer or n_boost %d", n_boost);
    if (sel == KKV_SELECT_EXPLICIT && !rank)
        return kkv_fail(KKV_ERR_INVALID_ARG, "key page: explicit selection needs a rank");
    size_t n = (size_t)group * (size_t)head_dim;
    float *tmp = malloc(n * sizeof *tmp); /* [G][D] */
    if (!tmp) return kkv_fail(KKV_ERR_NOMEM, "key page: out of memory");
    kkv_status s = round_f16(tmp, k, n, "key page");
    if (s == KKV_OK) {
        uint8_t order[KKV_MAX_HEAD_DIM];
        kkv_rank_channels(order, tmp, head_dim, group, sel, seed, page, rank);
        kkv_key_encode_ref(dst, tmp, head_dim, group, n_boost, order);
    }
    free(tmp);
    return s;
}

kkv_status kkv_key_page_decode(float *out, const void *src, int head_dim, int group,
                               int n_boost) {
    KKV_TRY(check_shape(head_dim, group, "key page"));
    if (!out || !src || n_boost < 0 || n_boost > head_dim)
        return kkv_fail(KKV_ERR_INVALID_ARG, "key page: bad buffer or n_boost %d", n_boost);
    const uint8_t *idx = (const uint8_t *)src + kkv_key_layout_of(head_dim, group, n_boost).idx;
    for (int j = 0; j < head_dim; j++)
        if (idx[j] > n_boost)
            return kkv_fail(KKV_ERR_FORMAT, "key page: idx[%d] = %d exceeds n_boost %d", j,
                            idx[j], n_boost);
    kkv_key_decode_ref(out, src, head_dim, group, n_boost);
    return KKV_OK;
}

kkv_status kkv_key8_page_encode(void *dst, const float *k, int head_dim, int group) {
    KKV_TRY(check_shape(head_dim, group, "8-bit key page"));
    if (!dst || !k) return kkv_fail(KKV_ERR_INVALID_ARG, "8-bit key page: NULL buffer");
    size_t n = (size_t)group * (size_t)head_dim;
    float *tmp = malloc(n * sizeof *tmp); /* [G][D] */
    if (!tmp) return kkv_fail(KKV_ERR_NOMEM, "8-bit key page: out of memory");
    kkv_status s = round_f16(tmp, k, n, "8-bit key page");
    if (s == KKV_OK) kkv_key8_encode_ref(dst, tmp, head_dim, group);
    free(tmp);
    return s;
}

kkv_status kkv_key8_page_decode(float *out, const void *src, int head_dim, int group) {
    KKV_TRY(check_shape(head_dim, group, "8-bit key page"));
    if (!out || !src) return kkv_fail(KKV_ERR_INVALID_ARG, "8-bit key page: NULL buffer");
    kkv_key8_decode_ref(out, src, head_dim, group);
    return KKV_OK;
}

static int value_bits_ok(int bits) { return bits == 2 || bits == 4 || bits == 8; }

kkv_status kkv_value_page_encode(void *dst, const float *v, int head_dim, int group,
                                 int bits) {
    KKV_TRY(check_shape(head_dim, group, "value page"));
    if (!dst || !v || !value_bits_ok(bits))
        return kkv_fail(KKV_ERR_INVALID_ARG, "value page: bad buffer or bits %d", bits);
    size_t n = (size_t)group * (size_t)head_dim;
    float *tmp = malloc(n * sizeof *tmp); /* [G][D] */
    if (!tmp) return kkv_fail(KKV_ERR_NOMEM, "value page: out of memory");
    kkv_status s = round_f16(tmp, v, n, "value page");
    if (s == KKV_OK) kkv_value_encode_ref(dst, tmp, head_dim, group, bits);
    free(tmp);
    return s;
}

kkv_status kkv_value_page_decode(float *out, const void *src, int head_dim, int group,
                                 int bits) {
    KKV_TRY(check_shape(head_dim, group, "value page"));
    if (!out || !src || !value_bits_ok(bits))
        return kkv_fail(KKV_ERR_INVALID_ARG, "value page: bad buffer or bits %d", bits);
    kkv_value_decode_ref(out, src, head_dim, group, bits);
    return KKV_OK;
}
