/* What this CPU's vector units sustain, measured: the core clock (a chain of
 * dependent integer adds, one cycle each on every x86-64), then cycles per
 * 256-bit instruction for the operations the AVX2 attention kernels are made
 * of, each over 12 independent chains so that latency does not set the pace,
 * and the floors they put under those kernels.
 *
 *     bench_vector_pipes [--json]
 *
 * Why. Under a hypervisor the CPUID brand and family can be a generic model
 * ("AMD EPYC", family 23, model 1 is QEMU's EPYC model whatever the host),
 * and the kernels' speed depends on how wide the host's vector pipes are:
 * one 256-bit FMA a cycle (first-generation Zen, which splits 256-bit
 * operations in two) or two (Zen 2 and later, Intel). This says which, in a
 * second. Not a test: the machine is shared, so figures move by ~5%.
 *
 * Floors. The AVX2 key kernel for a kitty page (D 64, G 128, 8 boosted
 * channels, 3 query heads) issues 36 channel pairs x 24 vpmaddubsw, the value
 * kernel 768; the fp16 kernels spend 24 FMAs and 8 conversions a token per
 * direction for 3 heads. Public headers only, like every benchmark. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kittykv_cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define TGT __attribute__((target("avx2,fma,f16c"), noinline))
#define N_ITER 20000000L

/* Cycles per second: 4 dependent adds an iteration, one cycle each. The
 * addend is a register: Intel cores since Golden Cove fold chains of adds of
 * an immediate at rename, several a cycle (a 2-vCPU Xeon, family 6 model
 * 167, read 13.9 GHz with `add $1`, 3.2-3.4 with a register, as imul's
 * 3-cycle latency gives). */
static double clock_hz(void) {
    long n = 400000000L, x = 0, one = 1;
    double t0 = now();
    __asm__ volatile("1: add %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tadd %2, %0\n\tsub $4, %1\n\tjnz 1b"
                     : "+r"(x), "+r"(n)
                     : "r"(one));
    return 400000000.0 / (now() - t0);
}

/* A throughput probe, seconds per instruction: 12 chains of type T, chain
 * i starting at C_INIT (which sees i and seed, a run-time value, so no two
 * chains are alike and none can be merged or folded), each advanced by STEP
 * (which sees c[i] and w) every iteration. w, the operand the chains share,
 * goes through an empty asm each iteration so nothing is hoisted out of the
 * loop. The 12-step loop is unrolled and the array kept in registers by the
 * compiler at -O2 and above (the figures match the hand-unrolled form's). */
#define TPUT_PROBE(name, T, WT, W_INIT, C_INIT, STEP)                     \
    TGT static double name(int seed) {                                    \
        WT w = W_INIT;                                                    \
        T c[12];                                                          \
        for (int i = 0; i < 12; i++) c[i] = C_INIT;                       \
        double t0 = now();                                                \
        for (long it = 0; it < N_ITER; it++) {                            \
            for (int i = 0; i < 12; i++) c[i] = STEP;                     \
            __asm__ volatile("" : "+x"(w));                               \
        }                                                                 \
        double t = now() - t0;                                            \
        for (int i = 0; i < 12; i++) __asm__ volatile("" : : "x"(c[i]));  \
        return t / (double)N_ITER / 12.0;                                 \
    }

TPUT_PROBE(fma_tput, __m256, __m256, _mm256_set1_ps(0.999f), _mm256_set1_ps((float)(seed + i)),
           _mm256_fmadd_ps(c[i], w, w))
TPUT_PROBE(maddubs_tput, __m256i, __m256i, _mm256_set1_epi8((char)seed), _mm256_set1_epi8((char)(seed + i)),
           _mm256_maddubs_epi16(c[i], w))
TPUT_PROBE(shuffle_tput, __m256i, __m256i, _mm256_set1_epi8((char)(seed & 15)),
           _mm256_set1_epi8((char)(seed + i)), _mm256_shuffle_epi8(c[i], w))
/* vcvtph2ps from a register, each result added into its own chain (the add
 * runs on other pipes on every AMD and Intel core the kernels target) */
TPUT_PROBE(cvt_tput, __m256, __m128i, _mm_set1_epi16(0x3c00), _mm256_set1_ps((float)(seed + i)),
           _mm256_add_ps(c[i], _mm256_cvtph_ps(w)))

TGT static double fma_latency(int seed) {
    __m256 f = _mm256_set1_ps((float)seed), w = _mm256_set1_ps(0.999f);
    double t0 = now();
    for (long it = 0; it < N_ITER; it++) {
        f = _mm256_fmadd_ps(f, w, w);
        f = _mm256_fmadd_ps(f, w, w);
        f = _mm256_fmadd_ps(f, w, w);
        f = _mm256_fmadd_ps(f, w, w);
    }
    double t = now() - t0;
    __asm__ volatile("" : : "x"(f));
    return t / (double)N_ITER / 4.0;
}

/* The fp16 q.k tile of the AVX2 kernel, hot in L1: 3 heads x 4 tokens,
 * D 64, one key vector converted and used by three FMAs. Seconds a token;
 * the same tile on fp32 keys beside it says what the conversions cost. */
TGT static double f16_tile(int f16) {
    static _Alignas(32) uint16_t kh[4 * 64];
    static _Alignas(32) float kf[4 * 64], q[3 * 64];
    for (int i = 0; i < 4 * 64; i++) kh[i] = 0x3c00, kf[i] = 1.0f;
    for (int i = 0; i < 3 * 64; i++) q[i] = 1e-3f;
    long n = N_ITER / 8;
    __m256 a[12];
    for (int i = 0; i < 12; i++) a[i] = _mm256_setzero_ps();
    double t0 = now();
    for (long it = 0; it < n; it++) {
        for (int j = 0; j < 64; j += 8) {
            __m256 q0 = _mm256_load_ps(q + j), q1 = _mm256_load_ps(q + 64 + j), q2 = _mm256_load_ps(q + 128 + j);
            for (int tk = 0; tk < 4; tk++) {
                __m256 k = f16 ? _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(const void *)(kh + tk * 64 + j)))
                               : _mm256_load_ps(kf + tk * 64 + j);
                a[3 * tk] = _mm256_fmadd_ps(q0, k, a[3 * tk]);
                a[3 * tk + 1] = _mm256_fmadd_ps(q1, k, a[3 * tk + 1]);
                a[3 * tk + 2] = _mm256_fmadd_ps(q2, k, a[3 * tk + 2]);
            }
        }
        __asm__ volatile("" : : : "memory");
    }
    double t = now() - t0;
    for (int i = 0; i < 12; i++) __asm__ volatile("" : : "x"(a[i]));
    return t / (double)n / 4.0;
}

int main(int argc, char **argv) {
    int json = argc > 1 && strcmp(argv[1], "--json") == 0;
    if (argc > 1 && !json) {
        fprintf(stderr, "usage: bench_vector_pipes [--json]\n");
        return 2;
    }
    /* the library's AVX2 level needs AVX2, FMA and F16C (and KKV_CPU=scalar skips) */
    if (kkv_kernel_best() == KKV_KERNEL_SCALAR) {
        printf("bench_vector_pipes: no AVX2+FMA+F16C here (or KKV_CPU=scalar); nothing to measure\n");
        return 0;
    }
    int seed = argc; /* not a constant the compiler could fold */
    double hz = clock_hz();
    double c_fma = fma_tput(seed) * hz, c_lat = fma_latency(seed) * hz, c_mad = maddubs_tput(seed) * hz;
    double c_shuf = shuffle_tput(seed) * hz, c_cvt = cvt_tput(seed) * hz;
    double c_t16 = f16_tile(1) * hz, c_t32 = f16_tile(0) * hz;
    /* floors of the AVX2 page kernels and the fp16 kernels, from the counts above */
    double qk_floor = 36 * 24 * c_mad / hz * 1e9, pv_floor = 768 * c_mad / hz * 1e9;
    const char *width = c_fma > 0.75 ? "one 256-bit FMA a cycle: 128-bit FMA units (first-generation Zen class)"
                                     : "two 256-bit FMAs a cycle: 256-bit FMA units";
    if (json) {
        printf("{\"cpu\": \"%s\", \"clock_ghz\": %.3f, \"fma_cycles\": %.3f, \"fma_latency_cycles\": %.2f, "
               "\"vpmaddubsw_cycles\": %.3f, \"vpshufb_cycles\": %.3f, \"vcvtph2ps_cycles\": %.3f, "
               "\"f16_tile_cycles_per_token\": %.2f, \"f32_tile_cycles_per_token\": %.2f, "
               "\"qk_page_floor_ns\": %.1f, \"pv_page_floor_ns\": %.1f}\n",
               kkv_cpu_name(), hz * 1e-9, c_fma, c_lat, c_mad, c_shuf, c_cvt, c_t16, c_t32, qk_floor, pv_floor);
        return 0;
    }
    printf("cpu: %s\nclock: %.2f GHz (dependent integer adds)\n\n", kkv_cpu_name(), hz * 1e-9);
    printf("%-34s %10s\n", "256-bit instruction, 12 chains", "cycles");
    printf("%-34s %10.2f\n", "vfmadd231ps", c_fma);
    printf("%-34s %10.2f\n", "vfmadd231ps latency (one chain)", c_lat);
    printf("%-34s %10.2f\n", "vpmaddubsw", c_mad);
    printf("%-34s %10.2f\n", "vpshufb", c_shuf);
    printf("%-34s %10.2f\n", "vcvtph2ps (+ vaddps)", c_cvt);
    printf("\n%-34s %10s\n", "fp16 q.k tile, 3 heads, D 64", "cycles/token");
    printf("%-34s %10.2f\n", "fp16 keys (8 conversions, 24 FMAs)", c_t16);
    printf("%-34s %10.2f\n", "fp32 keys (24 FMAs)", c_t32);
    printf("\n%s\n", width);
    printf("floor of the AVX2 kitty page kernels (vpmaddubsw alone): q.k %.0f ns, p.v %.0f ns a page\n", qk_floor,
           pv_floor);
    return 0;
}

#else
int main(void) {
    printf("bench_vector_pipes: x86-64 only (cpu: %s)\n", kkv_cpu_name());
    return 0;
}
#endif
