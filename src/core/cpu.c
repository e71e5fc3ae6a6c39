/* Runtime CPU feature detection from cpuid and xgetbv: a feature counts only
 * when the CPU has it and the OS saves the registers it needs. */
#include "core/cpu.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kittykv_cpu.h"

/* kkv_cpu_name's line: brand (<= 48 bytes), family and model, feature list */
static char cpu_line[160];

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>

static unsigned long long xgetbv0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

static int is_intel(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
    return b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e; /* "GenuineIntel" */
}

static void detect(kkv_cpu *cpu) {
    unsigned int a, b, c, d;
    /* The weight matmuls' prefetch hint (model/weights.c says what was
     * measured): on an Intel Xeon with AVX-512 prefetchnta stalled the
     * stream on the fill buffers and ran 3.5x slower than the L2 hint; on
     * Zen 3 the L2 hint cost one thread 11% and the non-temporal one was
     * best. Only speed depends on it. */
    cpu->wt_pf_l2 = is_intel();
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx) return;
    unsigned long long xcr0 = xgetbv0();
    int ymm_ok = (xcr0 & 0x6) == 0x6;     /* SSE + AVX state */
    int zmm_ok = (xcr0 & 0xe6) == 0xe6;   /* + opmask, ZMM_Hi256, Hi16_ZMM */
    if (!ymm_ok || __get_cpuid_max(0, NULL) < 7) return;
    __cpuid_count(7, 0, a, b, c, d);
    int avx2 = (b >> 5) & 1;
    int avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1, avx512bw = (b >> 30) & 1,
        avx512vl = (b >> 31) & 1, vnni = (c >> 11) & 1, vbmi = (c >> 1) & 1, vbmi2 = (c >> 6) & 1;
    cpu->avx2 = avx2 && fma && f16c;
    cpu->avx512 = cpu->avx2 && zmm_ok && avx512f && avx512dq && avx512bw && avx512vl;
    cpu->vnni = cpu->avx512 && vnni;
    cpu->vbmi = cpu->vnni && vbmi && vbmi2;
    unsigned int max7 = a; /* subleaves of leaf 7 */
    if (max7 >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        cpu->avxvnni = cpu->avx2 && ((a >> 4) & 1);
    }
}
/* This CPU's name into name [nn] (the brand string of leaves 0x80000002-4
 * without its padding) and "family F, model M" into fm [nf] (the display
 * family and model of leaf 1, extended fields added as the vendors document
 * them). */
static void describe(char *name, size_t nn, char *fm, size_t nf) {
    unsigned int r[12] = {0}, a, b, c, d;
    char brand[49] = "";
    if (__get_cpuid(0x80000000u, &a, &b, &c, &d) && a >= 0x80000004u) {
        for (unsigned int i = 0; i < 3; i++)
            __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        memcpy(brand, r, 48);
    }
    char *s = brand, *e = brand + strlen(brand);
    while (*s == ' ') s++;
    while (e > s && e[-1] == ' ') *--e = 0;
    snprintf(name, nn, "%s", *s ? s : "x86-64");
    if (!__get_cpuid(1, &a, &b, &c, &d)) return;
    unsigned int base = (a >> 8) & 0xF, family = base, model = (a >> 4) & 0xF;
    if (base == 0xF) family += (a >> 20) & 0xFF;
    if (base == 0x6 || base == 0xF) model |= ((a >> 16) & 0xF) << 4;
    snprintf(fm, nf, "family %u, model %u", family, model);
}
#else
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
/* HWCAP_ASIMDDP of <asm/hwcap.h>, which older C libraries do not define */
#define KKV_HWCAP_ASIMDDP (1ul << 20)
#endif
static void detect(kkv_cpu *cpu) {
#if defined(__aarch64__)
    cpu->neon = 1; /* part of the aarch64 base instruction set */
#if defined(__linux__)
    cpu->dotprod = (getauxval(AT_HWCAP) & KKV_HWCAP_ASIMDDP) != 0; /* the kernel says */
#endif /* elsewhere no sdot: the base NEON kernels give the same bits */
#else
    (void)cpu;
#endif
}
static void describe(char *name, size_t nn, char *fm, size_t nf) {
    (void)fm, (void)nf; /* no family and model off x86 */
#if defined(__aarch64__)
    snprintf(name, nn, "aarch64");
#else
    snprintf(name, nn, "unknown CPU");
#endif
}
#endif

/* cpu_line, "name (family F, model M; kernels: ...)", from describe() and
 * the features left after the KKV_CPU cap. */
static void name_line(const kkv_cpu *f) {
    char name[64], fm[48] = "";
    describe(name, sizeof name, fm, sizeof fm);
    snprintf(cpu_line, sizeof cpu_line, "%s (%s%skernels: %s%s%s%s%s)", name, fm, *fm ? "; " : "",
             f->avx512 ? "avx512" : f->avx2 ? "avx2" : f->neon ? "neon" : "scalar", f->vnni ? " vnni" : "", f->vbmi ? " vbmi" : "",
             f->avxvnni ? " avx-vnni" : "", f->dotprod ? " dotprod" : "");
}

static kkv_cpu cpu_features;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

/* KKV_CPU caps the detected level, so one machine can exercise every
 * dispatch path (tests and benchmarks use it): scalar (on aarch64 too); avx2 (no VNNI of any
 * kind); avxvnni (AVX2 + AVX-VNNI, no AVX-512); avx512vnni (AVX-512 with VNNI,
 * without VBMI: the 256-bit VNNI kernels); avx512 (AVX-512 without
 * VNNI); neon (aarch64 without the dot-product extension). Other values
 * leave what the CPU has. */
static void apply_cap(const char *cap) {
    if (strcmp(cap, "scalar") == 0)
        cpu_features.avx2 = cpu_features.avx512 = cpu_features.vnni = cpu_features.avxvnni =
            cpu_features.neon = cpu_features.dotprod = 0;
    if (strcmp(cap, "neon") == 0) cpu_features.dotprod = 0;
    if (strcmp(cap, "avx2") == 0)
        cpu_features.avx512 = cpu_features.vnni = cpu_features.avxvnni = 0;
    if (strcmp(cap, "avxvnni") == 0) cpu_features.avx512 = cpu_features.vnni = 0;
    if (strcmp(cap, "avx512") == 0) cpu_features.vnni = 0;
    if (!cpu_features.vnni || strcmp(cap, "avx512vnni") == 0) cpu_features.vbmi = 0;
}

static void init(void) {
    detect(&cpu_features);
    /* KKV_WT_PF=l2|nta overrides the weight-stream prefetch hint (to measure
     * one against the other on a new CPU) */
    const char *pf = getenv("KKV_WT_PF");
    if (pf && strcmp(pf, "l2") == 0) cpu_features.wt_pf_l2 = 1;
    if (pf && strcmp(pf, "nta") == 0) cpu_features.wt_pf_l2 = 0;
    const char *cap = getenv("KKV_CPU");
    if (cap) apply_cap(cap);
    name_line(&cpu_features); /* after the cap: the line names what may run */
}

const kkv_cpu *kkv_cpu_get(void) {
    pthread_once(&cpu_once, init);
    return &cpu_features;
}

const char *kkv_cpu_name(void) {
    kkv_cpu_get();
    return cpu_line;
}
