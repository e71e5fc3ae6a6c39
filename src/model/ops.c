/* Scalar reference versions of the elementwise ops of the forward pass. A
 * vectorized variant may replace one only if it returns identical bits. */
#include "model/ops.h"

#include "core/cpu.h"
#include "model/act_exp.h"

#include <math.h>

void kkv_op_rmsnorm(float *out, const float *x, const float *w, int n, float eps) {
    /* double keeps the norm independent of n-dependent fp32 rounding drift
     * (each square is exact in double). Four chains, element i in chain
     * i % 4, added as (0 + 1) + (2 + 3): one chain of n dependent adds was
     * ~0.7 us per norm of SmolLM2's 576 values, on the calling thread while
     * the pool waited (~45 us of a ~2.2 ms decode step at depth 0). */
    double s4[4] = {0.0, 0.0, 0.0, 0.0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) s4[k] += (double)x[i + k] * (double)x[i + k];
    for (int k = 0; i < n; i++, k++) s4[k] += (double)x[i] * (double)x[i];
    double ss = (s4[0] + s4[1]) + (s4[2] + s4[3]);
    float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    for (int j = 0; j < n; j++) out[j] = x[j] * r * w[j];
}

void kkv_op_rope_freqs(double *inv_freq, int rope_dims, float base) {
    for (int i = 0; i < rope_dims / 2; i++)
        inv_freq[i] = pow((double)base, -2.0 * (double)i / (double)rope_dims);
}

void kkv_op_rope_table(float *cs, float *sn, const double *inv_freq, int n_pairs,
                       int64_t pos) {
    for (int i = 0; i < n_pairs; i++) {
        double a = (double)pos * inv_freq[i];
        cs[i] = (float)cos(a);
        sn[i] = (float)sin(a);
    }
}

void kkv_op_rope(float *x, int n_heads, int head_dim, const float *cs, const float *sn,
                 int n_pairs) {
    for (int h = 0; h < n_heads; h++) {
        float *r = x + (long)h * head_dim; /* [head_dim] */
        for (int i = 0; i < n_pairs; i++) {
            float a = r[2 * i], b = r[2 * i + 1];
            r[2 * i] = a * cs[i] - b * sn[i];
            r[2 * i + 1] = a * sn[i] + b * cs[i];
        }
    }
}

void kkv_op_rope_neox(float *x, int n_heads, int head_dim, const float *cs, const float *sn,
                      int n_pairs) {
    for (int h = 0; h < n_heads; h++) {
        float *r = x + (long)h * head_dim; /* [head_dim] */
        for (int i = 0; i < n_pairs; i++) {
            float a = r[i], b = r[i + n_pairs];
            r[i] = a * cs[i] - b * sn[i];
            r[i + n_pairs] = a * sn[i] + b * cs[i];
        }
    }
}

void kkv_op_swiglu(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = kkv_act_swiglu1(g[i], u[i]);
}

void kkv_op_geglu(float *g, const float *u, int n) {
    for (int i = 0; i < n; i++) g[i] = kkv_act_geglu1(g[i], u[i]);
}

kkv_act_fn kkv_op_act(int gemma) {
#if defined(__x86_64__)
    if (kkv_cpu_get()->avx2) return gemma ? kkv_op_geglu_avx2 : kkv_op_swiglu_avx2;
#endif
    return gemma ? kkv_op_geglu : kkv_op_swiglu;
}
