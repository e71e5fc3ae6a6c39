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

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#if defined(__x86_64__)
#include <immintrin.h>

#define TGT __attribute__((target("avx2,fma,f16c"), noinline))
#define N_ITER 20000000L
#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/* Cycles per second: 4 dependent adds an iteration, one cycle each. */
static double clock_hz(void) {
    long n = 400000000L, x = 0;
    double t0 = now();
    __asm__ volatile("1: add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tsub $4, %1\n\tjnz 1b"
                     : "+r"(x), "+r"(n));
    return 400000000.0 / (now() - t0);
}

/* Each returns seconds per instruction. The chains start from run-time
 * values and the asm barriers keep the compiler from merging or hoisting
 * them (identical chains would otherwise be computed once). */
TGT static double fma_tput(float seed) {
    __m256 w = _mm256_set1_ps(0.999f);
#define D_F(i) __m256 f##i = _mm256_set1_ps(seed + (float)(i));
    REP12(D_F)
    double t0 = now();
    for (long it = 0; it < N_ITER; it++) {
#define S_F(i) f##i = _mm256_fmadd_ps(f##i, w, w);
        REP12(S_F)
        __asm__ volatile("" : "+x"(w));
    }
    double t = now() - t0;
#define U_F(i) __asm__ volatile("" : : "x"(f##i));
    REP12(U_F)
    return t / (double)N_ITER / 12.0;
}

TGT static double fma_latency(float seed) {
    __m256 f = _mm256_set1_ps(seed), w = _mm256_set1_ps(0.999f);
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

TGT static double maddubs_tput(int seed) {
    __m256i w = _mm256_set1_epi8((char)seed);
#define D_M(i) __m256i m##i = _mm256_set1_epi8((char)(seed + (i)));
    REP12(D_M)
    double t0 = now();
    for (long it = 0; it < N_ITER; it++) {
#define S_M(i) m##i = _mm256_maddubs_epi16(m##i, w);
        REP12(S_M)
        __asm__ volatile("" : "+x"(w));
    }
    double t = now() - t0;
#define U_M(i) __asm__ volatile("" : : "x"(m##i));
    REP12(U_M)
    return t / (double)N_ITER / 12.0;
}

TGT static double shuffle_tput(int seed) {
    __m256i w = _mm256_set1_epi8((char)(seed & 15));
    REP12(D_M)
    double t0 = now();
    for (long it = 0; it < N_ITER; it++) {
#define S_S(i) m##i = _mm256_shuffle_epi8(m##i, w);
        REP12(S_S)
        __asm__ volatile("" : "+x"(w));
    }
    double t = now() - t0;
    REP12(U_M)
    return t / (double)N_ITER / 12.0;
}

/* vcvtph2ps from a register, each result added into its own chain (the add
 * runs on other pipes on every AMD and Intel core the kernels target). */
TGT static double cvt_tput(float seed) {
    __m128i h = _mm_set1_epi16(0x3c00);
    REP12(D_F)
    double t0 = now();
    for (long it = 0; it < N_ITER; it++) {
#define S_C(i) f##i = _mm256_add_ps(f##i, _mm256_cvtph_ps(h));
        REP12(S_C)
        __asm__ volatile("" : "+x"(h));
    }
    double t = now() - t0;
    REP12(U_F)
    return t / (double)N_ITER / 12.0;
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
    float seed = (float)argc; /* not a constant the compiler could fold */
    double hz = clock_hz();
    double c_fma = fma_tput(seed) * hz, c_lat = fma_latency(seed) * hz, c_mad = maddubs_tput(argc) * hz;
    double c_shuf = shuffle_tput(argc) * hz, c_cvt = cvt_tput(seed) * hz;
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
