/* Range search for group quantization (clip=1, docs/FORMAT.md section 5).
 * With 4 levels, min/max over 128 Gaussian-like numbers spends the levels on
 * the tails: the step is ~1.7 sigma, while the least-squares 4-level uniform
 * quantizer uses ~1.0 sigma and clamps the tails, about half the squared
 * error. The search measures this per group on the data itself. */
#include "quant/quant.h"

static double sq_err(const float *x, size_t stride, int n, const kkv_qparams *p, int maxq) {
    double e = 0.0;
    for (int i = 0; i < n; i++) {
        float v = x[(size_t)i * stride];
        float d = v - ((float)kkv_quant_code(v, p, maxq) * p->scale + p->mn);
        e += (double)d * d;
    }
    return e;
}

kkv_qparams kkv_qparams_search(const float *x, size_t stride, int n, float mn, float mx,
                               int bits) {
    int maxq = (1 << bits) - 1;
    kkv_qparams best = kkv_qparams_of(mn, mx, bits);
    if (!(mx > mn)) return best;
    double best_e = sq_err(x, stride, n, &best, maxq);
    float d = (mx - mn) / (bits == 2 ? 16.0f : 64.0f);
    for (int a = 0; a <= 7; a++)
        for (int b = 0; b <= 7 && a + b <= 10; b++) {
            if (!a && !b) continue;
            kkv_qparams p = kkv_qparams_of(mn + (float)a * d, mx - (float)b * d, bits);
            double e = sq_err(x, stride, n, &p, maxq);
            if (e < best_e) best_e = e, best = p;
        }
    return best;
}
