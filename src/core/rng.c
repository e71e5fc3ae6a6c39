/* Public face of the one PRNG (core/rng.h). */
#include "core/rng.h"

uint64_t kkv_rng_next(uint64_t *state) {
    return kkv_splitmix_fin(*state += KKV_GOLDEN_GAMMA);
}

double kkv_rng_uniform(uint64_t *state) {
    return (double)(kkv_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}
