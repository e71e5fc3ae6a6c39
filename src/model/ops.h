/* Scalar elementwise helpers of the Llama forward pass: RMSNorm, rotary
 * position embedding (normal, non-NeoX pairing), SwiGLU gate, softmax.
 * Each works on one row at a time and its result depends only on that row,
 * which keeps the forward pass independent of batch and chunk size. */
#ifndef KKV_MODEL_OPS_H
#define KKV_MODEL_OPS_H

#include <stdint.h>

#include "kittykv_model.h"

/* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]. out, x, w: [n]; out may be x.
 * The sum of squares is accumulated in double, in four chains (element i in
 * chain i % 4, added as (0 + 1) + (2 + 3)). */
void kkv_op_rmsnorm(float *out, const float *x, const float *w, int n, float eps);

/* Rotation table of one position: cs[i] = cos(pos * inv_freq[i]),
 * sn[i] = sin(...), i < n_pairs, with inv_freq[i] = base^(-2i / rope_dims)
 * (computed by kkv_op_rope_freqs). Angles are evaluated in double.
 * cs, sn: [n_pairs]; inv_freq: [n_pairs]. */
void kkv_op_rope_table(float *cs, float *sn, const double *inv_freq, int n_pairs,
                       int64_t pos);
/* inv_freq: [rope_dims / 2], inv_freq[i] = base^(-2i / rope_dims). */
void kkv_op_rope_freqs(double *inv_freq, int rope_dims, float base);

/* Rotates the first 2*n_pairs dims of every head in place, pairs (2i, 2i+1):
 *   (a, b) -> (a cos - b sin, a sin + b cos).
 * x: [n_heads][head_dim]; cs, sn: [n_pairs] from kkv_op_rope_table. */
void kkv_op_rope(float *x, int n_heads, int head_dim, const float *cs, const float *sn,
                 int n_pairs);

/* The NeoX pairing (Qwen2/Qwen3 and other HF-layout models): pairs
 * (i, i + n_pairs) of every head, same rotation as kkv_op_rope. */
void kkv_op_rope_neox(float *x, int n_heads, int head_dim, const float *cs, const float *sn,
                      int n_pairs);

/* g[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u. g, u: [n]. exp is
 * act_exp.h's, not libm's: the scalar reference of the AVX2 variant. */
void kkv_op_swiglu(float *g, const float *u, int n);

/* g[i] = gelu(g[i]) * u[i] with the tanh approximation (Gemma's GeGLU):
 * gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed as
 * x / (1 + exp(-2 sqrt(2/pi) (...))) with act_exp.h's exp. g, u: [n]. */
void kkv_op_geglu(float *g, const float *u, int n);

/* The same on 8 lanes (AVX2 + FMA; x86-64 only), bit-identical to the above. */
void kkv_op_swiglu_avx2(float *g, const float *u, int n);
void kkv_op_geglu_avx2(float *g, const float *u, int n);

/* The fastest activation this CPU runs (KKV_CPU caps it), SwiGLU or with
 * gemma GeGLU: every choice gives the scalar reference's bits. */
typedef void (*kkv_act_fn)(float *g, const float *u, int n);
kkv_act_fn kkv_op_act(int gemma);

#endif
