/* The 8-lane exponentials of core/exp_poly_avx2.h against their scalar
 * forms, bit for bit: kkv_exp_poly8 (the activations') against kkv_exp_poly,
 * and kkv_exp_soft8x4 (four vectors at once; the SIMD softmaxes') against
 * kkv_exp_soft, over the whole domain x <= 88: -inf and the clamped range,
 * every float near the clamp (where n = -126 and the result's exponent field
 * is smallest) and near 88 (n = 127, the largest), and a strided walk over
 * every other float in between, both signs. The 8-lane forms build y 2^n by
 * adding n to y's exponent field where the scalar ones multiply; this is the
 * check that the two are the same operation on this domain. Then kkv_exp_soft's accuracy
 * against exp in double on the softmax's domain [-87.3, 0]: relative error
 * <= 2.5e-7 (core/exp_poly.h derives it), every 7th float.
 *
 * Built with -mavx2 -mfma on x86-64 (tests/CMakeLists.txt); skipped (77)
 * where the CPU, or KKV_CPU, has no AVX2, and elsewhere. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "testutil.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#include "core/cpu.h"
#include "core/exp_poly.h"
#include "core/exp_poly_avx2.h"

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Mismatches over xs [8] of kkv_exp_poly8 against kkv_exp_poly, and of
 * kkv_exp_soft8x4 (xs in each of its four positions beside other
 * arguments) against kkv_exp_soft; the first is reported. */
static int compare8(const float *xs, int *reported) {
    static const char *name[5] = {"kkv_exp_poly8", "kkv_exp_soft8x4 (0)", "kkv_exp_soft8x4 (1)",
                                  "kkv_exp_soft8x4 (2)", "kkv_exp_soft8x4 (3)"};
    float v[5][8];
    __m256 x = _mm256_loadu_ps(xs), r = _mm256_permute_ps(x, 0x1B); /* lanes reversed in each half */
    __m256 q[4] = {x, r, x, r};
    _mm256_storeu_ps(v[0], kkv_exp_poly8(x));
    kkv_exp_soft8x4(q);
    _mm256_storeu_ps(v[1], q[0]), _mm256_storeu_ps(v[3], q[2]);
    q[0] = r, q[1] = x, q[2] = r, q[3] = x;
    kkv_exp_soft8x4(q);
    _mm256_storeu_ps(v[2], q[1]), _mm256_storeu_ps(v[4], q[3]);
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        float ref[2] = {kkv_exp_poly(xs[i]), kkv_exp_soft(xs[i])};
        for (int f = 0; f < 5; f++) {
            float s = ref[f > 0];
            if (bits_of(s) != bits_of(v[f][i])) {
                if (!(*reported)++)
                    fprintf(stderr, "  exp(%.9g): %s %.9g (0x%08x), scalar %.9g (0x%08x)\n", (double)xs[i],
                            name[f], (double)v[f][i], (unsigned)bits_of(v[f][i]), (double)s,
                            (unsigned)bits_of(s));
                bad++;
            }
        }
    }
    return bad;
}

/* Every stride-th float from `from` out to `to` (same sign, |from| <= |to|:
 * bit patterns in increasing order); returns the mismatches. */
static long sweep(float from, float to, uint32_t stride, long *count, int *reported) {
    uint32_t a = bits_of(from), b = bits_of(to);
    float xs[8];
    int k = 0;
    long bad = 0;
    for (uint64_t u = a; u <= b; u += stride) {
        xs[k++] = float_of((uint32_t)u);
        if (k == 8) bad += compare8(xs, reported), k = 0;
        (*count)++;
    }
    for (; k > 0 && k < 8; k++) xs[k] = xs[0]; /* pad a last partial vector */
    if (k == 8) bad += compare8(xs, reported);
    return bad;
}

int main(void) {
    if (!kkv_cpu_get()->avx2) {
        printf("no AVX2 on this CPU (or KKV_CPU): skipped\n");
        return TU_SKIP;
    }
    long count = 0, bad = 0;
    int reported = 0;
    float edge[8] = {-INFINITY, -1e30f, -100.0f, -87.3f, -0.0f, 0.0f, 1e-30f, 88.0f};
    bad += compare8(edge, &reported);
    count += 8;
    /* -87.4 .. -86.5: the clamp and n = -126 / -125, every float */
    bad += sweep(-86.5f, -87.4f, 1, &count, &reported);
    /* 87.5 .. 88: n = 127, every float */
    bad += sweep(87.5f, 88.0f, 1, &count, &reported);
    /* the rest, both signs, every 11th float (tiny magnitudes included) */
    bad += sweep(0.0f, 88.0f, 11, &count, &reported);
    bad += sweep(-0.0f, -87.4f, 11, &count, &reported);
    CHECK(bad == 0, "an 8-lane exponential differs from its scalar form: %ld lane results of %ld arguments "
                    "(first above)", bad, count);
    printf("exp: %ld arguments, 5 results each (kkv_exp_poly8, kkv_exp_soft8x4 in its four positions), "
           "%ld differ\n", count, bad);
    /* kkv_exp_soft against e^x in double on [-87.3, 0] */
    double worst = 0.0;
    float at = 0.0f;
    for (uint32_t u = bits_of(-0.0f); u <= bits_of(KKV_EXP_MIN); u += 7) {
        float xv = float_of(u);
        double ex = exp((double)xv), rel = fabs((double)kkv_exp_soft(xv) - ex) / ex;
        if (rel > worst) worst = rel, at = xv;
    }
    CHECK(worst <= 2.5e-7, "kkv_exp_soft: relative error %.3g at x = %.9g, above 2.5e-7", worst, (double)at);
    printf("kkv_exp_soft: largest relative error %.3g (at x = %.9g) on [-87.3, 0]\n", worst, (double)at);
    return tu_summary();
}
#else
int main(void) {
    printf("not an x86-64 AVX2 build: skipped\n");
    return TU_SKIP;
}
#endif
