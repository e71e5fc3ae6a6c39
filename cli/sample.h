/* Next-token sampling for the CLI: greedy at temperature 0, otherwise
 * temperature + top-p (nucleus) with a seeded PRNG, so a (seed, logits)
 * sequence always gives the same tokens. */
#ifndef KKV_CLI_SAMPLE_H
#define KKV_CLI_SAMPLE_H

#include <stdint.h>

typedef struct cli_sampler {
    float    temp;  /* 0: greedy (argmax, ties to the lowest id) */
    float    top_p; /* in (0, 1]; 1 keeps the whole distribution */
    uint64_t state; /* PRNG state (splitmix64) */
    /* scratch, grown on demand and owned: */
    float   *prob;  /* [cap] */
    int32_t *idx;   /* [cap] */
    int      cap;
} cli_sampler;

/* Sets up a sampler; nothing is allocated until the first sample. */
void cli_sampler_init(cli_sampler *s, float temp, float top_p, uint64_t seed);
void cli_sampler_free(cli_sampler *s);

/* Picks a token from logits [n_vocab] (not modified). -1 only if memory for
 * the scratch buffers cannot be had. */
int32_t cli_sample(cli_sampler *s, const float *logits, int n_vocab);

/* Index of the largest logit, ties to the lowest index. logits: [n], n >= 1. */
int32_t cli_argmax(const float *logits, int n);

/* Uniform double in [0, 1) from the sampler's PRNG. */
double cli_sampler_uniform(cli_sampler *s);

#endif
