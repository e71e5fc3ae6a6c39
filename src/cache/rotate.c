/* Per-head rotations of keys and values inside the cache (docs/FORMAT.md
 * section 5). An orthogonal R keeps q.k exact when both are rotated
 * (Rq . Rk = q . k), and sum_t p_t (R v_t) = R out, so one R^T per head after
 * the weighted sum restores the output. Every sum runs in a fixed order, so
 * results do not depend on threads or chunking. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/rotate.h"
#include "core/rng.h"
#include "core/status.h"

/* Sylvester's construction: H[i][j] = (-1)^popcount(i & j) / sqrt(D). */
static void hadamard(float *R, int D) {
    float s = (float)(1.0 / sqrt((double)D));
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++)
            R[(size_t)i * D + j] = (__builtin_popcount((unsigned)(i & j)) & 1) ? -s : s;
}

/* A standard normal from two uniforms (Box-Muller). */
static double gauss(uint64_t *st) {
    double u = kkv_rng_uniform(st), v = kkv_rng_uniform(st);
    return sqrt(-2.0 * log(1.0 - u)) * cos(6.283185307179586 * v);
}

/* Gaussian rows made orthonormal by modified Gram-Schmidt, twice (in double):
 * the rows of a Gaussian matrix are independent with probability 1, and the
 * result is a random orthogonal matrix. */
static kkv_status random_orthogonal(float *R, int D, uint64_t seed) {
    double *a = malloc((size_t)D * D * sizeof *a); /* [D][D] */
    if (!a) return kkv_fail(KKV_ERR_NOMEM, "rotation: out of memory");
    uint64_t st = seed;
    for (size_t i = 0; i < (size_t)D * D; i++) a[i] = gauss(&st);
    for (int i = 0; i < D; i++) {
        double *r = a + (size_t)i * D;
        for (int pass = 0; pass < 2; pass++)
            for (int p = 0; p < i; p++) {
                const double *b = a + (size_t)p * D;
                double d = 0.0;
                for (int j = 0; j < D; j++) d += r[j] * b[j];
                for (int j = 0; j < D; j++) r[j] -= d * b[j];
            }
        double n = 0.0;
        for (int j = 0; j < D; j++) n += r[j] * r[j];
        n = 1.0 / sqrt(n);
        for (int j = 0; j < D; j++) r[j] *= n;
    }
    for (size_t i = 0; i < (size_t)D * D; i++) R[i] = (float)a[i];
    free(a);
    return KKV_OK;
}

kkv_status kkv_rot_make(float **out, kkv_rot kind, int D, uint64_t seed) {
    *out = NULL;
    if (kind == KKV_ROT_NONE) return KKV_OK;
    float *R = malloc((size_t)D * D * sizeof *R);
    if (!R) return kkv_fail(KKV_ERR_NOMEM, "rotation: out of memory");
    kkv_status s = KKV_OK;
    if (kind == KKV_ROT_HADAMARD) hadamard(R, D);
    else s = random_orthogonal(R, D, seed);
    if (s != KKV_OK) {
        free(R);
        return s;
    }
    *out = R;
    return KKV_OK;
}

void kkv_rot_apply(float *y, const float *R, const float *x, int D) {
    for (int i = 0; i < D; i++) {
        const float *r = R + (size_t)i * D;
        float s = 0.0f;
        for (int j = 0; j < D; j++) s += r[j] * x[j];
        y[i] = s;
    }
}

void kkv_rot_apply_t(float *y, const float *R, const float *x, int D) {
    for (int j = 0; j < D; j++) y[j] = 0.0f;
    for (int i = 0; i < D; i++) {
        const float *r = R + (size_t)i * D;
        for (int j = 0; j < D; j++) y[j] += r[j] * x[i];
    }
}

void kkv_rot_back_rows(float *x, const float *R, int n, int D) {
    float tmp[KKV_MAX_HEAD_DIM]; /* [D] */
    for (int t = 0; t < n; t++) {
        float *row = x + (size_t)t * D;
        kkv_rot_apply_t(tmp, R, row, D);
        memcpy(row, tmp, (size_t)D * sizeof *tmp);
    }
}
