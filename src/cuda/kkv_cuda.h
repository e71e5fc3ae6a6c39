/* Optional CUDA backend: fused decode attention over Kitty pages on the GPU.
 *
 * Scope: the quantized page range of one (sequence, layer), all KV heads, in
 * the page format of kittykv.h (key pages in the 2-bit boosted format, not
 * key_bits 8; value pages of 2, 4 or 8 bits), stored contiguously on the device:
 *   kpages: [n_pages][n_kv][kpage_bytes]   vpages: [n_pages][n_kv][vpage_bytes]
 * It returns partial softmax states (max, sum, unnormalised output) per query
 * head and page split, which merge with the fp16 parts (sink, Q-buffers,
 * window) the same way src/cache/attend.c merges its work units.
 *
 * Status: compiled by CI with nvcc; not yet run on a GPU (no device in CI). */
#ifndef KKV_CUDA_H
#define KKV_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kkv_cuda_pages {
    const uint8_t *kpages; /* device: [n_pages][n_kv][kpage_bytes] */
    const uint8_t *vpages; /* device: [n_pages][n_kv][vpage_bytes] */
    int n_pages, n_kv, head_dim, group, n_boost, value_bits;
} kkv_cuda_pages;

/* q: device [n_q][D]. part_acc: device [n_kv * n_rep][n_split][D],
 * part_ml: device [n_kv * n_rep][n_split][2] (max, sum). n_rep = n_q / n_kv,
 * at most 8; head_dim at most 256; group a multiple of 4 up to 1024.
 * Returns 0 on launch success, else the cudaError_t value. */
int kkv_cuda_attend_pages(float *part_acc, float *part_ml, const kkv_cuda_pages *pages,
                          const float *q, int n_q, int n_split, void *stream);

/* Merges the partial states: out: device [n_q][D]. */
int kkv_cuda_merge(float *out, const float *part_acc, const float *part_ml, int n_q, int D,
                   int n_split, void *stream);

#ifdef __cplusplus
}
#endif
#endif
