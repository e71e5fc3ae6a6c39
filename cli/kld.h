/* Distribution statistics shared by eval and the analyses: log-softmax and
 * KL divergence in double precision, and percentiles. */
#ifndef KKV_CLI_KLD_H
#define KKV_CLI_KLD_H

/* out[v] = x[v] - logsumexp(x), computed in double. out: [n], x: [n], n >= 1.
 * Two calls on equal x give bit-equal out, which is what makes KL(p || p)
 * exactly 0 for a method that reproduces the reference bit for bit. */
void kld_log_softmax(double *out, const float *x, int n);

/* KL(p || q) = sum_v p_v (logp_v - logq_v) in double. p: [n] = exp(logp)
 * (precomputed once per reference row), logp, logq: [n]. Terms with p_v = 0
 * count 0. Not clamped: rounding may leave a tiny negative value. */
double kld_kl(const double *p, const double *logp, const double *logq, int n);

/* The pct-th percentile (0..100) of v by the nearest-rank rule:
 * sorted[ceil(pct/100 * n) - 1]. Sorts v [n] in place. 0 for n = 0. */
double kld_percentile(double *v, long n, double pct);

#endif
