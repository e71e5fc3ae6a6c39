/* Softmax attention of one query head in double precision over read-back K/V,
 * with the fp32 error bound a kernel's output may differ by: the reference that
 * test_attn.c, test_window.c, test_plus.c and test_budget.c hold the cache's
 * attention to. Aborts on out of memory: tests only. */
#ifndef KKV_TU_REF_ATTEND_H
#define KKV_TU_REF_ATTEND_H

#include <math.h>
#include <stdlib.h>

#define U32 (1.0 / 16777216.0) /* unit roundoff of fp32, 2^-24 */

/* Reference: out[h][j] = sum_t p_t v_t[j] / sum_t p_t, p_t = exp(s_t - max s),
 * s_t = q_h . k_t / sqrt(D), all in double over the fp32 inputs. Also returns
 * the tolerance each output may differ by in fp32 (see tol_of).
 * k, v: [n][D] of the KV head; q: [D]; out, tol: [D] (tol may be NULL). */
static inline void tu_ref_attend(double *out, double *tol, const float *q, const float *k,
                                 const float *v, int n, int D) {
    double *s = malloc((size_t)(n > 0 ? n : 1) * sizeof *s); /* [n] */
    if (!s) abort();
    double mx = -INFINITY, amax = 0, vmax = 0, isd = 1.0 / sqrt((double)D);
    for (int t = 0; t < n; t++) {
        double dot = 0, adot = 0;
        for (int j = 0; j < D; j++) {
            dot += (double)q[j] * k[(size_t)t * D + j];
            adot += fabs((double)q[j] * k[(size_t)t * D + j]);
        }
        s[t] = dot * isd;
        mx = s[t] > mx ? s[t] : mx;
        amax = adot * isd > amax ? adot * isd : amax;
    }
    double l = 0;
    for (int j = 0; j < D; j++) out[j] = 0;
    for (int t = 0; t < n; t++) {
        double p = exp(s[t] - mx);
        l += p;
        for (int j = 0; j < D; j++) {
            out[j] += p * v[(size_t)t * D + j];
            vmax = fabs(v[(size_t)t * D + j]) > vmax ? fabs(v[(size_t)t * D + j]) : vmax;
        }
    }
    for (int j = 0; j < D; j++) out[j] /= l;
    /* Tolerance: a first-order worst-case bound on fp32 evaluation error.
     * - score s_t: a D-term fp32 dot product (|error| <= D u sum_j |q_j k_tj|)
     *   times 1/sqrt(D) (2 more roundings): <= (D + 2) u A, A = max_t
     *   sum_j |q_j k_tj| / sqrt(D); s_t - max adds <= 2 u A; expf adds ~2 u
     *   relative. So every weight p_t carries a relative error
     *   e_p <= (D + 4) u A + 2 u.
     * - out = sum p v / sum p: relative weight errors move out by at most
     *   2 e_p max|v| (numerator and denominator).
     * - the sums over n tokens in fp32, with online-softmax rescaling per
     *   block and the merge of partial results: <= (n + 2 n/4 + 8) u max|v|
     *   (blocks are >= 4 tokens long except the sink/tail, bounded by 8).
     * Doubled for second-order terms and slack. This is loose next to the
     * typical error (the test prints the worst observed ratio) but a wrong
     * token, head, scale or missing page moves the output by O(|v|) >> tol. */
    double ep = (D + 4) * U32 * amax + 2 * U32;
    double t = 2.0 * vmax * (2 * ep + (n + n / 2.0 + 8) * U32);
    if (tol)
        for (int j = 0; j < D; j++) tol[j] = t;
    free(s);
}

#endif
