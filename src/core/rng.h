/* The library's one pseudo-random generator: splitmix64 (Steele, Lea and
 * Flood), tiny, well mixed and fully determined by its seed. The public
 * kkv_rng_next / kkv_rng_uniform (kittykv.h) step a state; kkv_mix64 hashes
 * words for seeded channel selection. */
#ifndef KKV_CORE_RNG_H
#define KKV_CORE_RNG_H

#include <stdint.h>

#include "kittykv.h"

/* The splitmix64 output function. */
static inline uint64_t kkv_splitmix_fin(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define KKV_GOLDEN_GAMMA 0x9e3779b97f4a7c15ull

/* A 64-bit hash of two words: page and channel seeds of KKV_SELECT_RANDOM. */
static inline uint64_t kkv_mix64(uint64_t a, uint64_t b) {
    return kkv_splitmix_fin(a + KKV_GOLDEN_GAMMA * (b + 1));
}

#endif
