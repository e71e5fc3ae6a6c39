/* kkv_mean_ci95 (kittykv_eval.h): the batch-means interval of a mean, on
 * values whose answer is known by hand, and its refusals.
 *   {1, 2, 3, 4}: four batches of one, mean 2.5, sd sqrt(5/3),
 *     t_{0.975,3} = 3.1824: 3.1824 * sqrt(5/3) / 2 = 2.054240;
 *   64 values, x_i = i % 2: 32 batches of two, every batch mean 0.5: 0;
 *   64 values, x_i = (i / 2) % 2: batch means 0, 1, 0, 1, ...: sd
 *     sqrt(32 / 4 / 31) = 0.508001, t_{0.975,31} = 2.0395, / sqrt(32):
 *     0.183157;
 *   a constant: 0; n < 2, NULL, NaN or inf inside: NaN. */
#include <math.h>
#include <stdlib.h>

#include "kittykv_eval.h"
#include "testutil.h"

int main(void) {
    double a[4] = {1, 2, 3, 4};
    double h = kkv_mean_ci95(a, 4);
    CHECK(fabs(h - 3.1824 * sqrt(5.0 / 3.0) / 2.0) < 1e-12, "{1,2,3,4}: %.9g", h);
    double x[64], y[64], c[64];
    for (int i = 0; i < 64; i++) x[i] = i % 2, y[i] = (i / 2) % 2, c[i] = 0.125;
    CHECK(kkv_mean_ci95(x, 64) == 0.0, "alternating within batches: %.9g", kkv_mean_ci95(x, 64));
    h = kkv_mean_ci95(y, 64);
    CHECK(fabs(h - 2.0395 * sqrt(32.0 / 4.0 / 31.0) / sqrt(32.0)) < 1e-12, "alternating batches: %.9g", h);
    CHECK(kkv_mean_ci95(c, 64) == 0.0, "constant: %.9g", kkv_mean_ci95(c, 64));
    /* 1000 values: 32 batches of 31 or 32, the interval shrinks like 1/sqrt(n) */
    double *big = malloc(4000 * sizeof *big);
    CHECK(big != NULL, "malloc");
    if (big) {
        unsigned s = 1;
        for (int i = 0; i < 4000; i++) {
            s = s * 1103515245u + 12345u;
            big[i] = (double)(s >> 16 & 0x7fff) / 32768.0;
        }
        double h1 = kkv_mean_ci95(big, 1000), h4 = kkv_mean_ci95(big, 4000);
        /* uniform [0, 1): sd 0.2887, so about 2.04 * 0.2887 / sqrt(n) */
        CHECK(h1 > 0.5 * 0.0186 && h1 < 2.0 * 0.0186, "1000 uniforms: %.9g", h1);
        CHECK(h4 > 0.25 * h1 && h4 < 0.75 * h1, "4000 vs 1000 uniforms: %.9g vs %.9g", h4, h1);
        free(big);
    }
    CHECK(isnan(kkv_mean_ci95(a, 1)), "n = 1 must be NaN");
    CHECK(isnan(kkv_mean_ci95(a, 0)), "n = 0 must be NaN");
    CHECK(isnan(kkv_mean_ci95(NULL, 4)), "NULL must be NaN");
    a[2] = NAN;
    CHECK(isnan(kkv_mean_ci95(a, 4)), "a NaN value must give NaN");
    a[2] = INFINITY;
    CHECK(isnan(kkv_mean_ci95(a, 4)), "an infinite value must give NaN");
    return tu_summary();
}
