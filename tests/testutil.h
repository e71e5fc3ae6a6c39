/* Tiny shared helpers for the C tests: non-fatal CHECK with file:line, a
 * summary line "N passed, M failed" and the exit code, and a deterministic
 * PRNG (splitmix64) so every run sees the same data on every machine.
 *
 *     int main(void) {
 *         tu_rng r = tu_rng_make(42);
 *         CHECK(1 + 1 == 2, "arithmetic broke: %d", 1 + 1);
 *         return tu_summary();    // 0 if nothing failed, 1 otherwise
 *     }
 *
 * Return TU_SKIP (77) from main to tell CTest a test was skipped. */
#ifndef KKV_TESTUTIL_H
#define KKV_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "kittykv.h"

#define TU_SKIP 77

/* [0] passed, [1] failed; one pair per test executable. */
static inline int *tu_counts(void) {
    static int n[2];
    return n;
}

/* Records cond; on failure prints file:line, the condition and a printf-style
 * message (a format string is required), then carries on. */
#define CHECK(cond, ...)                                                            \
    do {                                                                            \
        if (cond) {                                                                 \
            tu_counts()[0]++;                                                       \
        } else {                                                                    \
            tu_counts()[1]++;                                                       \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                           \
            fputc('\n', stderr);                                                    \
        }                                                                           \
    } while (0)

/* True if some CHECK has failed so far (to stop a loop from flooding stderr). */
static inline int tu_failed(void) { return tu_counts()[1] != 0; }

/* Prints "N passed, M failed" on stdout; the exit code for main(). */
static inline int tu_summary(void) {
    printf("%d passed, %d failed\n", tu_counts()[0], tu_counts()[1]);
    fflush(stdout);
    return tu_counts()[1] ? 1 : 0;
}

/* The library's splitmix64 (kkv_rng_next): identical everywhere. */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;

static inline tu_rng tu_rng_make(uint64_t seed) {
    tu_rng r = {seed};
    return r;
}

static inline uint64_t tu_u64(tu_rng *r) { return kkv_rng_next(&r->s); }

/* Uniform integer in [0, n), n > 0 (modulo bias is irrelevant for tests). */
static inline int tu_int(tu_rng *r, int n) { return (int)(tu_u64(r) % (uint64_t)n); }

/* Uniform float in [-1, 1), a multiple of 2^-23. */
static inline float tu_uniform(tu_rng *r) {
    return (float)((int64_t)(tu_u64(r) >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}

/* Standard normal (Box-Muller, computed in double). */
static inline float tu_normal(tu_rng *r) {
    double u1 = ((double)(tu_u64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    double u2 = (double)(tu_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

#endif
