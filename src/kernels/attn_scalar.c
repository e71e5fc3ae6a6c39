/* Scalar reference kernels: the oracle every SIMD variant is tested against.
 * They decode each element as q * scale + mn, exactly as the page codecs do. */
#include <math.h>

#include "kernels/kernels.h"
#include "core/fp16.h"
#include "quant/quant.h"

static void qk_f16(float *s, const float *q, int n_rep, const uint16_t *k, int n, int D,
                   const void *pf) {
    (void)pf; /* the reference takes no hints */
    for (int r = 0; r < n_rep; r++)
        for (int t = 0; t < n; t++) {
            float dot = 0.0f;
            for (int j = 0; j < D; j++)
                dot += q[(size_t)r * D + j] * kkv_f16_to_f32(k[(size_t)t * D + j]);
            s[(size_t)r * n + t] = dot;
        }
}

static void qk_page(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G,
                    int nb) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    const uint8_t *idx = page + L.idx;
    for (int i = 0; i < n_rep * G; i++) s[i] = 0.0f;
    for (int j = 0; j < D; j++) {
        float scale = kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * (size_t)j));
        float mn = kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * (size_t)j));
        const uint8_t *lo = page + L.lo + (size_t)j * (G / 4);
        const uint8_t *hi = idx[j] < nb ? page + L.hi + (size_t)idx[j] * (G / 4) : NULL;
        for (int t = 0; t < G; t++) {
            int code = (lo[t / 4] >> (2 * (t % 4))) & 3;
            if (hi) code |= ((hi[t / 4] >> (2 * (t % 4))) & 3) << 2;
            float k = (float)code * scale + mn;
            for (int r = 0; r < n_rep; r++) s[(size_t)r * G + t] += q[(size_t)r * D + j] * k;
        }
    }
}

static void pv_f16(float *acc, const float *p, int n_rep, const uint16_t *v, int n, int D,
                   const void *pf) {
    (void)pf;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < D; j++) {
            float x = kkv_f16_to_f32(v[(size_t)t * D + j]);
            for (int r = 0; r < n_rep; r++) acc[(size_t)r * D + j] += p[(size_t)r * n + t] * x;
        }
}

static void pv_page(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G,
                    int bits) {
    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
    int per_byte = 8 / bits, maxq = (1 << bits) - 1;
    size_t row = (size_t)D * bits / 8;
    for (int t = 0; t < G; t++) {
        float scale = kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * (size_t)t));
        float mn = kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * (size_t)t));
        const uint8_t *codes = page + L.codes + (size_t)t * row;
        for (int j = 0; j < D; j++) {
            int code = (codes[j / per_byte] >> (bits * (j % per_byte))) & maxq;
            float x = (float)code * scale + mn;
            for (int r = 0; r < n_rep; r++) acc[(size_t)r * D + j] += p[(size_t)r * G + t] * x;
        }
    }
}

static void widen(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = kkv_f16_to_f32(src[i]);
}

void kkv_scalar_key_encode(uint8_t *page, float *tmp, const uint16_t *k, int D, int G, int nb,
                           kkv_select sel, uint64_t seed, uint64_t page_no, const uint8_t *rank) {
    uint8_t order[KKV_MAX_HEAD_DIM];
    widen(tmp, k, (size_t)G * D);
    kkv_rank_channels(order, tmp, D, G, sel, seed, page_no, rank);
    kkv_key_encode_ref(page, tmp, D, G, nb, order);
}

void kkv_scalar_value_encode(uint8_t *page, float *tmp, const uint16_t *v, int D, int G, int bits) {
    widen(tmp, v, (size_t)G * D);
    kkv_value_encode_ref(page, tmp, D, G, bits);
}

static void softmax(float *sc, float *ml, float *acc, int n_rep, int n, int D, float inv) {
    for (int r = 0; r < n_rep; r++) {
        float *a = acc + (size_t)r * D, *m = ml + 2 * r, *l = m + 1;
        float *s = sc + (size_t)r * n;
        float mx = *m;
        for (int t = 0; t < n; t++) {
            s[t] *= inv;
            mx = s[t] > mx ? s[t] : mx;
        }
        float corr = expf(*m - mx); /* 0 on the first block, where *m = -inf */
        float sum = 0.0f;
        for (int t = 0; t < n; t++) {
            s[t] = expf(s[t] - mx);
            sum += s[t];
        }
        for (int j = 0; j < D; j++) a[j] *= corr;
        *l = *l * corr + sum;
        *m = mx;
    }
}

const kkv_ops kkv_ops_scalar = {
    .kind = KKV_KERNEL_SCALAR,
    .qk_f16 = qk_f16,
    .qk_page = qk_page,
    .pv_f16 = pv_f16,
    .pv_page = pv_page,
    .key_encode = kkv_scalar_key_encode,
    .value_encode = kkv_scalar_value_encode,
    .softmax = softmax,
};
