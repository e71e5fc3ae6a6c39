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

/* t_{0.975, df} for df = 1..31 (checked against a numerical integral of the
 * t density: each tail within 0.01% of 0.025). */
static const double T975[31] = {12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060,
                                2.2622,  2.2281, 2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199,
                                2.1098,  2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639,
                                2.0595,  2.0555, 2.0518, 2.0484, 2.0452, 2.0423, 2.0395};

double kkv_mean_ci95(const double *x, long n) {
    if (!x || n < 2) return NAN;
    enum { B_MAX = 32 };
    long B = n < B_MAX ? n : B_MAX;
    double mb[B_MAX], sum = 0.0;
    for (long b = 0; b < B; b++) { /* batch b: positions [b n / B, (b + 1) n / B) */
        long lo = b * n / B, hi = (b + 1) * n / B;
        double s = 0.0;
        for (long i = lo; i < hi; i++) {
            if (!isfinite(x[i])) return NAN;
            s += x[i];
        }
        mb[b] = s / (double)(hi - lo);
        sum += mb[b];
    }
    double mean = sum / (double)B, ss = 0.0;
    for (long b = 0; b < B; b++) ss += (mb[b] - mean) * (mb[b] - mean);
    return T975[B - 2] * sqrt(ss / (double)(B - 1) / (double)B);
}
