/* Distribution statistics of the evaluation, in double precision. */
#include "kittykv_eval.h"

#include <math.h>
#include <stdlib.h>

void kkv_log_softmax(double *out, const float *x, int n) {
    double mx = (double)x[0];
    for (int i = 1; i < n; i++)
        if ((double)x[i] > mx) mx = (double)x[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += exp((double)x[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++) out[i] = (double)x[i] - lse;
}

double kkv_kl(const double *p, const double *logp, const double *logq, int n) {
    double kl = 0.0;
    for (int i = 0; i < n; i++)
        if (p[i] > 0.0) kl += p[i] * (logp[i] - logq[i]);
    return kl;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double kkv_percentile(double *v, long n, double pct) {
    if (n <= 0) return 0.0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    long k = (long)ceil(pct / 100.0 * (double)n);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}
