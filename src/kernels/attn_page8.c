/* Attention over 8-bit pages (key_bits / value_bits 8, docs/FORMAT.md
 * section 2) and int8 sink rows (section 5). One implementation serves every kernel table: it is its own
 * scalar reference, tested against double-precision sums over the decoded
 * pages (tests/test_kernels.c). The inner loops run along the page's rows
 * (tokens for keys, channels for values) with every sum in a fixed order, so
 * a compiler may vectorize them without changing a bit. */
#include "kernels/kernels.h"
#include "core/fp16.h"
#include "quant/quant.h"

void kkv_qk_page8(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G) {
    kkv_key8_layout L = kkv_key8_layout_of(D, G);
    for (int r = 0; r < n_rep; r++) {
        const float *qr = q + (size_t)r * D;
        float *sr = s + (size_t)r * G; /* [G] */
        /* q . (c * scale + mn) = sum_j (q_j scale_j) c_tj + sum_j q_j mn_j */
        float bias = 0.0f;
        for (int j = 0; j < D; j++)
            bias += qr[j] * kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * (size_t)j));
        for (int t = 0; t < G; t++) sr[t] = 0.0f;
        for (int j = 0; j < D; j++) {
            float w = qr[j] * kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * (size_t)j));
            const uint8_t *codes = page + L.codes + (size_t)j * G; /* [G] */
            for (int t = 0; t < G; t++) sr[t] += w * (float)codes[t];
        }
        for (int t = 0; t < G; t++) sr[t] += bias;
    }
}

void kkv_pv_page8(float *acc, const float *p, int n_rep, const uint8_t *page, int D, int G) {
    kkv_value_layout L = kkv_value_layout_of(D, G, 8);
    for (int r = 0; r < n_rep; r++) {
        float *ar = acc + (size_t)r * D; /* [D] */
        for (int t = 0; t < G; t++) {
            float pt = p[(size_t)r * G + t];
            float w = pt * kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * (size_t)t));
            float b = pt * kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * (size_t)t));
            const uint8_t *codes = page + L.codes + (size_t)t * D; /* [D] */
            for (int j = 0; j < D; j++) ar[j] += w * (float)codes[j] + b;
        }
    }
}

/* int8 sink rows (sink_int8): row t is D int8 codes and an fp16 scale, rows
 * D + 2 bytes apart. q . k_t = scale_t * sum_j q_j c_tj, summed over j in
 * order; p . v adds (p_t scale_t) c_tj to each channel. */
void kkv_qk_rows8(float *s, const float *q, int n_rep, const uint8_t *rows, int n, int D) {
    size_t stride = (size_t)D + 2;
    for (int r = 0; r < n_rep; r++)
        for (int t = 0; t < n; t++) {
            const uint8_t *row = rows + (size_t)t * stride;
            float dot = 0.0f;
            for (int j = 0; j < D; j++) dot += q[(size_t)r * D + j] * (float)(int8_t)row[j];
            s[(size_t)r * n + t] = dot * kkv_f16_to_f32(kkv_ld16(row + D));
        }
}

void kkv_pv_rows8(float *acc, const float *p, int n_rep, const uint8_t *rows, int n, int D) {
    size_t stride = (size_t)D + 2;
    for (int r = 0; r < n_rep; r++) {
        float *ar = acc + (size_t)r * D; /* [D] */
        for (int t = 0; t < n; t++) {
            const uint8_t *row = rows + (size_t)t * stride;
            float w = p[(size_t)r * n + t] * kkv_f16_to_f32(kkv_ld16(row + D));
            for (int j = 0; j < D; j++) ar[j] += w * (float)(int8_t)row[j];
        }
    }
}
