/* Softmax attention of one query head in double precision over read-back K/V,
 * the reference that test_plus.c and test_budget.c hold the cache's
 * attention to. Aborts on out of memory: tests only. */
#ifndef KKV_TU_REF_ATTEND_H
#define KKV_TU_REF_ATTEND_H

#include <math.h>
#include <stdlib.h>

/* o [D] = softmax(q . k_t / sqrt(D)) . v_t over t < n; q [D], k and v [n][D]. */
static inline void tu_ref_attend(double *o, const float *q, const float *k, const float *v, int n,
                                 int D) {
    double mx = -INFINITY, *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s), l = 0.0;
    if (!s) abort();
    for (int t = 0; t < n; t++) {
        double d = 0.0;
        for (int j = 0; j < D; j++) d += (double)q[j] * k[(size_t)t * D + j];
        s[t] = d / sqrt((double)D);
        mx = s[t] > mx ? s[t] : mx;
    }
    for (int j = 0; j < D; j++) o[j] = 0.0;
    for (int t = 0; t < n; t++) {
        double p = exp(s[t] - mx);
        l += p;
        for (int j = 0; j < D; j++) o[j] += p * v[(size_t)t * D + j];
    }
    for (int j = 0; j < D; j++) o[j] /= l;
    free(s);
}

#endif
