/* Per-head rotations of keys/values inside the cache (rotate.c). */
#ifndef KKV_CACHE_ROTATE_H
#define KKV_CACHE_ROTATE_H

#include <stdint.h>

#include "kittykv.h"

/* *out: a new [D][D] orthogonal matrix (row-major; stored = R x), or NULL for
 * KKV_ROT_NONE. Hadamard needs D a power of 2 (kkv_method_check says so).
 * The caller frees it. */
kkv_status kkv_rot_make(float **out, kkv_rot kind, int D, uint64_t seed);
/* y [D] = R x / y [D] = R^T x (y and x distinct). */
void kkv_rot_apply(float *y, const float *R, const float *x, int D);
void kkv_rot_apply_t(float *y, const float *R, const float *x, int D);
/* Each of the n rows of x [n][D] replaced by R^T row (back to the model's space). */
void kkv_rot_back_rows(float *x, const float *R, int n, int D);

#endif
