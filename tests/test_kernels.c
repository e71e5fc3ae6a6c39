/* Every kernel table this CPU runs (scalar always, AVX2 / AVX-512 / their
 * VNNI page kernels when present, NEON on aarch64) against the scalar
 * reference, primitive by primitive, then end to end through kkv_attend();
 * and the AVX2 and NEON tables against one pinned hash of their outputs,
 * which both architectures must give (test_page_hash).
 *
 * Tolerances. The SIMD fp16 primitives and the softmax fold scales, use FMA
 * and reorder sums, so they differ from the scalar ones by rounding only.
 * Each output is compared relative to its magnitude scale M = sum |terms|
 * (computed in double): |simd - scalar| <= 1e-5 * M (fp32 sums of <= 256
 * terms stay within a few 2^-24 * M in practice).
 *
 * The SIMD page primitives work in the integer domain (attn_int_impl.h,
 * attn_qkbyte_avx2.c, attn_qkwide_avx2.c, attn_int_neon.c), so
 * their error is set by a quantization step, derived here from the inputs:
 *   qk_page: the folded query f_j = q_j * scale_j is rounded to int8 with
 *     step d_g = max_{j in g} |f_j| / 127 per channel group g (groups by key
 *     range scale_j * maxq_j: within 4x of the page's largest, 16x, the
 *     rest), each code multiplies an error <= d_g/2:
 *     |s_t - ref_t| <= sum_j d_g(j)/2 * |c_tj - maxq_j/2| + 1e-5 * M (the
 *     kernel centres the codes through a per-page constant); the wide key
 *     kernel of the VBMI table rounds f to 15 bits on one step per head,
 *     d = max_j |f_j| / 32639, and is held to the same sum with that d (the
 *     table's entry, its 8-bit kernel, gives the AVX2 8-bit kernel's bits on
 *     pages with n_boost <= D / 2 and hands it the others); the
 *     AVX2 16-bit key kernel likewise with d = max_j |f_j| / QMAX,
 *     QMAX = min(32767, floor((2^31 - 1) / (64 (3D + 12 nb)))), and the
 *     AVX2 table's 8-bit key kernel with d = max_j |f_j| / 127 (pages with
 *     n_boost <= D / 2; it hands the others to the 16-bit kernel);
 *   pv_page: the folded probabilities w_t = p_t * scale_t are rounded to
 *     uint8 with step e = max_t w_t / 255 per block of 128 tokens:
 *     |acc_j - ref_j| <= sum_blocks e/2 * sum_t |c_tj - maxq/2| + 1e-5 * M.
 * The float page kernels they fall back to (non-finite or negative inputs)
 * are tested at 1e-5 * M. The flush primitives must write IDENTICAL bytes.
 * End to end, kkv_attend() must equal softmax attention in double over
 * kkv_seq_read() to rel 1e-4 of the probability-weighted magnitude of the
 * values for the scalar kernel, the SIMD kernels must agree with the scalar
 * one to TOL_E2E_INT of it (the logit error x = d/2 * sum_j |c - maxq/2| /
 * sqrt(D) moves the softmax weights by factors within exp(+-2x), plus the
 * value error; here the keys' two 12x channels set the 8-bit key kernel's
 * step d = max |f| / 127, and the worst output moved by 0.10 of the
 * magnitude; each kernel's own bound is checked per primitive above),
 * and 1 vs 2 threads must be bit-identical.
 *
 *     test_kernels [--quick | --bench-plan | --bench-pages [NB] | --bench-f16 | --score-error]
 *     (--quick: fewer cases, for an emulator; or time the planned key
 *     kernel, the best table's page kernels, or the fp16 kernels AVX2 vs
 *     AVX-512; measure the AVX2 key kernels' score error; no tests) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "kernels/attn_simd.h"
#if defined(__aarch64__)
#include "core/exp_poly_neon.h"
#endif
#include "core/bigmem.h"
#include "core/cpu.h"
#include "core/fp16.h"
#include "quant/quant.h"
#include "testutil.h"

#define TOL_PRIM 1e-5
#define TOL_REF 1e-4
#define TOL_E2E_INT 0.15

static const int Ds[] = {4, 12, 64, 128, 256};
static const int Gs[] = {4, 12, 100, 128, 260}; /* 100, 260: a partial chunk, and chunks after the first */
/* the value kernels also over pages of several 128-token blocks and a tail */
static const int Gs_pv[] = {4, 12, 128, 260};
static const int REPS[] = {1, 2, 3, 4, 8};
#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* fp16 data: normal values times `amp`, a few outlier channels (x16). */
static void rand_f16(tu_rng *r, uint16_t *dst, int n, int D, float amp) {
    int o1 = tu_int(r, D), o2 = tu_int(r, D);
    for (int i = 0; i < n; i++) {
        int j = i % D;
        float x = tu_normal(r) * amp * ((j == o1 || j == o2) ? 16.0f : 1.0f);
        dst[i] = kkv_f16_store(x);
    }
}

static void rand_f32(tu_rng *r, float *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = tu_normal(r);
}

/* Special fp16 inputs for the flush: signed zeros, constant rows/channels,
 * extremes, subnormals. kind 0: random. */
static void special_f16(tu_rng *r, uint16_t *x, int G, int D, int kind) {
    rand_f16(r, x, G * D, D, 1.0f);
    for (int t = 0; t < G; t++)
        for (int j = 0; j < D; j++) {
            uint16_t *p = x + (size_t)t * D + j;
            switch (kind) {
            case 1: *p = (tu_int(r, 2) ? 0x8000u : 0x0000u); break;         /* +-0 only */
            case 2: if (j % 3 == 0) *p = 0x3c00u; break;                     /* constant channels */
            case 3: if (tu_int(r, 4) == 0) *p = tu_int(r, 2) ? 0x7bffu : 0xfbffu; break; /* +-65504 */
            case 4: *p = (uint16_t)((tu_int(r, 2) ? 0x8000u : 0) | (unsigned)tu_int(r, 4)); break; /* subnormals */
            case 5: if (t % 2) *p = (uint16_t)(*p ^ 0x8000u); if (j % 2 && tu_int(r, 3) == 0) *p = 0x8000u; break;
            default: break;
            }
        }
}

/* ------------------------------------------------------------ primitives */

typedef struct cmp_stats {
    double worst; /* max |a - b| / M seen */
} cmp_stats;

/* --quick (scripts/test.sh, under qemu-user, ~100x slower than the host):
 * only the tables other than the scalar one (and not the 8-bit pages, the
 * same C for every table), every primitive on fewer boosted-channel counts, end to end on one method of each page kind at one
 * head dimension and 300 tokens. The host's own run covers the rest. */
static int quick;

/* Under --quick, where a step takes seconds to tens of seconds: which step
 * ended, and when. */
static void quick_done(const char *table, const char *what) {
    if (quick) printf("  %s %s done (%.1f s of CPU)\n", table, what, (double)clock() / CLOCKS_PER_SEC);
}

static int close_to(float a, float b, double mag, cmp_stats *st) {
    double e = fabs((double)a - (double)b);
    double rel = mag > 0 ? e / mag : e;
    if (rel > st->worst) st->worst = rel;
    return e <= TOL_PRIM * mag + 1e-30;
}

static void test_qk_f16(const kkv_ops *k, tu_rng *r, cmp_stats *st) {
    for (int di = 0; di < NELEM(Ds); di++)
        for (int ri = 0; ri < NELEM(REPS); ri++) {
            int D = Ds[di], R = REPS[ri], N = 128;
            uint16_t *kv = xmalloc((size_t)N * D * 2);
            float *q = xmalloc((size_t)R * D * 4), *s0 = xmalloc((size_t)R * N * 4);
            float *s1 = xmalloc((size_t)R * N * 4);
            rand_f16(r, kv, N * D, D, 1.0f);
            rand_f32(r, q, R * D);
            for (int n = 1; n <= N && !tu_failed(); n += (n < 20 ? 1 : 7)) {
                kkv_ops_scalar.qk_f16(s0, q, R, kv, n, D, NULL);
                k->qk_f16(s1, q, R, kv, n, D, kv);
                int bad = 0;
                for (int i = 0; i < R * n; i++) {
                    int rr = i / n, t = i % n;
                    double mag = 0;
                    for (int j = 0; j < D; j++)
                        mag += fabs((double)q[rr * D + j] * kkv_f16_to_f32(kv[t * D + j]));
                    bad += !close_to(s1[i], s0[i], mag, st);
                }
                CHECK(!bad, "%s qk_f16 D=%d n_rep=%d n=%d: %d scores off", kkv_kernel_name(k->kind), D, R, n, bad);
                /* the prefetch hint is never read: the same bits without it */
                k->qk_f16(s0, q, R, kv, n, D, NULL);
                CHECK(memcmp(s0, s1, (size_t)R * n * 4) == 0, "%s qk_f16 D=%d n_rep=%d n=%d: prefetch hint changed scores",
                      kkv_kernel_name(k->kind), D, R, n);
            }
            free(kv), free(q), free(s0), free(s1);
        }
}

static void test_pv_f16(const kkv_ops *k, tu_rng *r, cmp_stats *st) {
    for (int di = 0; di < NELEM(Ds); di++)
        for (int ri = 0; ri < NELEM(REPS); ri++) {
            int D = Ds[di], R = REPS[ri], N = 128;
            uint16_t *v = xmalloc((size_t)N * D * 2);
            float *p = xmalloc((size_t)R * N * 4), *a0 = xmalloc((size_t)R * D * 4);
            float *a1 = xmalloc((size_t)R * D * 4), *a_in = xmalloc((size_t)R * D * 4);
            rand_f16(r, v, N * D, D, 1.0f);
            rand_f32(r, a_in, R * D);
            for (int n = 1; n <= N && !tu_failed(); n += (n < 20 ? 1 : 7)) {
                for (int i = 0; i < R * n; i++) p[i] = fabsf(tu_uniform(r));
                memcpy(a0, a_in, (size_t)R * D * 4);
                memcpy(a1, a_in, (size_t)R * D * 4);
                kkv_ops_scalar.pv_f16(a0, p, R, v, n, D, NULL);
                k->pv_f16(a1, p, R, v, n, D, v);
                int bad = 0;
                for (int i = 0; i < R * D; i++) {
                    int rr = i / D, j = i % D;
                    double mag = fabs(a_in[i]);
                    for (int t = 0; t < n; t++) mag += p[rr * n + t] * fabs(kkv_f16_to_f32(v[t * D + j]));
                    bad += !close_to(a1[i], a0[i], mag, st);
                }
                CHECK(!bad, "%s pv_f16 D=%d n_rep=%d n=%d: %d outputs off", kkv_kernel_name(k->kind), D, R, n, bad);
                memcpy(a0, a_in, (size_t)R * D * 4);
                k->pv_f16(a0, p, R, v, n, D, NULL);
                CHECK(memcmp(a0, a1, (size_t)R * D * 4) == 0, "%s pv_f16 D=%d n_rep=%d n=%d: prefetch hint changed outputs",
                      kkv_kernel_name(k->kind), D, R, n);
            }
            free(v), free(p), free(a0), free(a1), free(a_in);
        }
}

typedef void (*qk_page_fn)(float *, const float *, int, const uint8_t *, int, int, int);
typedef void (*pv_page_fn)(float *, const float *, int, const uint8_t *, int, int, int);

/* Codes of a key page (channel j, token t) and a value page (token t, channel j). */
static int key_code(const uint8_t *page, const kkv_key_layout *L, int G, int nb, int j, int t) {
    const uint8_t *idx = page + L->idx;
    int c = (page[L->lo + (size_t)j * (G / 4) + t / 4] >> (2 * (t % 4))) & 3;
    if (idx[j] < nb) c |= ((page[L->hi + (size_t)idx[j] * (G / 4) + t / 4] >> (2 * (t % 4))) & 3) << 2;
    return c;
}
static int value_code(const uint8_t *page, const kkv_value_layout *L, int D, int bits, int t, int j) {
    int per = 8 / bits;
    return (page[L->codes + (size_t)t * D * bits / 8 + j / per] >> (bits * (j % per))) & ((1 << bits) - 1);
}

/* Worst error / allowed error of the integer page kernels, over all checks. */
static double worst_int_ratio;

/* Compares fn against the scalar qk_page on one page; is_int: allow the
 * integer-domain bound of the header comment (1: the int8 kernels' channel
 * groups; 2: the wide kernel's one step d = max |f| / 32639 per head; 3: the
 * AVX2 16-bit kernel's d = max |f| / min(32767, (2^31 - 1) / (64 (3D + 12nb)));
 * 4: the AVX2 8-bit kernel's d = max |f| / 127 where n_boost <= D / 2, the
 * 16-bit kernel's step on the other pages, which it hands to that kernel;
 * 5: the VBMI 8-bit kernel's, the same d, and the wide kernel's step on the
 * pages it hands to that one). */
static int check_qk_page(qk_page_fn fn, int is_int, const float *q, int R, const uint8_t *page,
                         const float *kd, int D, int G, int nb, float *s0, float *s1, cmp_stats *st) {
    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
    kkv_ops_scalar.qk_page(s0, q, R, page, D, G, nb);
    fn(s1, q, R, page, D, G, nb);
    int bad = 0;
    for (int rr = 0; rr < R; rr++) {
        /* int8 step of the folded query per channel group: groups by key range
         * scale * maxq within (1/4, 1], (1/16, 1/4], the rest, of the largest */
        double dg[3] = {0, 0, 0}, fmx = 0;
        int grp[KKV_MAX_HEAD_DIM];
        float rmax = 0.0f;
        for (int j = 0; j < D; j++) {
            float rg = kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * j)) * (page[L.idx + j] < nb ? 15.0f : 3.0f);
            rmax = rg > rmax ? rg : rmax;
        }
        for (int j = 0; j < D; j++) {
            float sc = kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * j));
            float rg = sc * (page[L.idx + j] < nb ? 15.0f : 3.0f);
            grp[j] = rg > rmax * 0.25f ? 0 : rg > rmax * 0.0625f ? 1 : 2;
            float f = q[rr * D + j] * sc;
            dg[grp[j]] = fmax(dg[grp[j]], fabs((double)f) / 127.0);
            fmx = fmax(fmx, fabs((double)f));
        }
        if (is_int == 2) { /* the wide kernel: one step for all channels, 15 bits */
            dg[0] = fmx / 32639.0;
            for (int j = 0; j < D; j++) grp[j] = 0;
        }
        if (is_int == 3 || (is_int == 4 && 2 * nb > D)) { /* the AVX2 16-bit kernel: one step, int32 sums kept exact */
            double lim = floor(2147483647.0 / (64.0 * (3.0 * D + 12.0 * nb)));
            dg[0] = fmx / fmin(32767.0, lim);
            for (int j = 0; j < D; j++) grp[j] = 0;
        } else if (is_int == 5 && 2 * nb > D) { /* the VBMI 8-bit kernel hands these to the wide one */
            dg[0] = fmx / 32639.0;
            for (int j = 0; j < D; j++) grp[j] = 0;
        } else if (is_int == 4 || is_int == 5) { /* the 8-bit kernels: one step, int8 weights */
            dg[0] = fmx / 127.0;
            for (int j = 0; j < D; j++) grp[j] = 0;
        }
        for (int t = 0; t < G; t++) {
            double mag = 0, csum = 0;
            for (int j = 0; j < D; j++) {
                double mn = fabs(kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * j)));
                mag += fabs((double)q[rr * D + j]) * (fabs((double)kd[t * D + j]) + mn);
                csum += dg[grp[j]] * fabs(key_code(page, &L, G, nb, j, t) - (page[L.idx + j] < nb ? 7.5 : 1.5));
            }
            float a = s1[rr * G + t], b = s0[rr * G + t];
            if (!is_int) {
                bad += !close_to(a, b, mag, st);
                continue;
            }
            double tol = 0.5 * csum + TOL_PRIM * mag + 1e-30, e = fabs((double)a - b);
            worst_int_ratio = fmax(worst_int_ratio, e / tol);
            bad += !(e <= tol);
        }
    }
    return bad;
}

static void test_qk_page(const char *name, qk_page_fn fn, int is_int, tu_rng *r, cmp_stats *st) {
    for (int di = 0; di < NELEM(Ds); di++)
        for (int gi = 0; gi < NELEM(Gs); gi++) {
            int D = Ds[di], G = Gs[gi];
            float *x = xmalloc((size_t)G * D * 4), *kd = xmalloc((size_t)G * D * 4);
            float *q = xmalloc((size_t)8 * D * 4);
            float *s0 = xmalloc((size_t)8 * G * 4), *s1 = xmalloc((size_t)8 * G * 4);
            uint8_t *page = xmalloc(kkv_key_page_bytes(D, G, D));
            /* every n_boost for small D; a spread for large D keeps it fast */
            int nb_step = quick ? (D >= 8 ? D / 8 : 1) : D <= 64 ? 1 : 5;
            for (int nb = 0; nb <= D && !tu_failed(); nb += nb_step) {
                int R = REPS[tu_int(r, NELEM(REPS))];
                for (int i = 0; i < G * D; i++)
                    x[i] = tu_normal(r) * ((i % D) % 7 == 3 ? 10.0f : 1.0f);
                rand_f32(r, q, R * D);
                kkv_key_page_encode(page, x, D, G, nb, KKV_SELECT_RANDOM, 7, (uint64_t)nb, NULL);
                kkv_key_page_decode(kd, page, D, G, nb);
                int bad = check_qk_page(fn, is_int, q, R, page, kd, D, G, nb, s0, s1, st);
                CHECK(!bad, "%s qk_page D=%d G=%d nb=%d n_rep=%d: %d scores off", name, D, G, nb, R, bad);
            }
            /* every n_rep at a mid boost (and at all-boosted), n_rep 1..8 */
            for (int R = 1; R <= 8; R++) {
                int nb = R == 7 ? D : D / 8;
                rand_f32(r, q, R * D);
                if (R == 5) q[3 % D] = 0.0f, memset(q, 0, (size_t)D * 4); /* an all-zero head */
                for (int i = 0; i < G * D; i++) x[i] = tu_normal(r);
                kkv_key_page_encode(page, x, D, G, nb, KKV_SELECT_MAGNITUDE, 0, 0, NULL);
                kkv_key_page_decode(kd, page, D, G, nb);
                int bad = check_qk_page(fn, is_int, q, R, page, kd, D, G, nb, s0, s1, st);
                CHECK(!bad, "%s qk_page D=%d G=%d n_rep=%d: %d scores off", name, D, G, R, bad);
            }
            free(x), free(kd), free(q), free(s0), free(s1), free(page);
        }
}

static void test_pv_page(const char *name, pv_page_fn fn, int is_int, tu_rng *r, cmp_stats *st) {
    for (int di = 0; di < NELEM(Ds); di++)
        for (int gi = 0; gi < NELEM(Gs_pv); gi++)
            for (int bits = 2; bits <= 4; bits += 2)
                for (int R = 1; R <= 8 && !tu_failed(); R++) {
                    int D = Ds[di], G = Gs_pv[gi];
                    float *x = xmalloc((size_t)G * D * 4), *vd = xmalloc((size_t)G * D * 4);
                    float *p = xmalloc((size_t)R * G * 4), *a_in = xmalloc((size_t)R * D * 4);
                    float *a0 = xmalloc((size_t)R * D * 4), *a1 = xmalloc((size_t)R * D * 4);
                    uint8_t *page = xmalloc(kkv_value_page_bytes(D, G, bits));
                    for (int i = 0; i < G * D; i++) x[i] = tu_normal(r) + 0.5f * (float)((i / D) % 5);
                    kkv_value_page_encode(page, x, D, G, bits);
                    kkv_value_page_decode(vd, page, D, G, bits);
                    kkv_value_layout L = kkv_value_layout_of(D, G, bits);
                    /* softmax-like: a few large probabilities, many small, some zero */
                    for (int i = 0; i < R * G; i++) {
                        float u = fabsf(tu_uniform(r));
                        p[i] = (i % 11 == 0) ? 0.0f : (i % 5 == 0) ? u : u * u * u * 0.01f;
                    }
                    rand_f32(r, a_in, R * D);
                    memcpy(a0, a_in, (size_t)R * D * 4);
                    memcpy(a1, a_in, (size_t)R * D * 4);
                    kkv_ops_scalar.pv_page(a0, p, R, page, D, G, bits);
                    fn(a1, p, R, page, D, G, bits);
                    int bad = 0;
                    for (int rr = 0; rr < R; rr++) {
                        double e[4096 / 128] = {0}; /* uint8 step per block of 128 tokens */
                        for (int t = 0; t < G; t++) {
                            float w = p[rr * G + t] * kkv_f16_to_f32(kkv_ld16(page + L.scale + 2 * t));
                            e[t / 128] = fmax(e[t / 128], (double)w / 255.0);
                        }
                        for (int j = 0; j < D; j++) {
                            int i = rr * D + j;
                            double mag = fabs(a_in[i]), csum = 0;
                            for (int t = 0; t < G; t++) {
                                double mn = fabs(kkv_f16_to_f32(kkv_ld16(page + L.mn + 2 * t)));
                                mag += p[rr * G + t] * (fabs((double)vd[t * D + j]) + mn);
                                csum += 0.5 * e[t / 128] * fabs(value_code(page, &L, D, bits, t, j) - 0.5 * ((1 << bits) - 1));
                            }
                            if (!is_int) {
                                bad += !close_to(a1[i], a0[i], mag, st);
                                continue;
                            }
                            double tol = csum + TOL_PRIM * mag + 1e-30, err = fabs((double)a1[i] - a0[i]);
                            worst_int_ratio = fmax(worst_int_ratio, err / tol);
                            bad += !(err <= tol);
                        }
                    }
                    CHECK(!bad, "%s pv_page D=%d G=%d bits=%d n_rep=%d: %d outputs off", name, D, G, bits, R, bad);
                    free(x), free(vd), free(p), free(a_in), free(a0), free(a1), free(page);
                }
}

static void test_softmax(const kkv_ops *k, tu_rng *r, cmp_stats *st) {
    int D = 64;
    for (int ri = 0; ri < NELEM(REPS); ri++)
        for (int n = 1; n <= 128 && !tu_failed(); n += (n < 20 ? 1 : 9)) {
            int R = REPS[ri];
            float s0[8 * 128], s1[8 * 128], ml0[16], ml1[16], a0[8 * 64], a1[8 * 64];
            for (int step = 0; step < 3; step++) {
                for (int i = 0; i < R * n; i++) s0[i] = s1[i] = tu_normal(r) * 30.0f;
                if (step == 0) {
                    for (int i = 0; i < R; i++) {
                        ml0[2 * i] = ml1[2 * i] = -INFINITY;
                        ml0[2 * i + 1] = ml1[2 * i + 1] = 0.0f;
                    }
                    for (int i = 0; i < R * D; i++) a0[i] = a1[i] = 0.0f;
                } else {
                    for (int i = 0; i < R * D; i++) a1[i] = a0[i] = tu_normal(r);
                    for (int i = 0; i < 2 * R; i++) ml1[i] = ml0[i];
                }
                /* the AVX-512 softmax must give the AVX2 one's bits
                 * (attn_avx512.c says why they agree) */
#if defined(__x86_64__)
                int vs_avx2 = k->softmax != kkv_ops_avx2.softmax && k->softmax != kkv_ops_scalar.softmax;
#else
                int vs_avx2 = 0;
#endif
                const size_t ns = (size_t)R * n * 4, na = (size_t)R * D * 4, nm = (size_t)R * 2 * 4;
                float s2[8 * 128], ml2[16], a2[8 * 64];
                if (vs_avx2) memcpy(s2, s1, ns), memcpy(ml2, ml1, nm), memcpy(a2, a1, na);
                kkv_ops_scalar.softmax(s0, ml0, a0, R, n, D, 0.125f);
                k->softmax(s1, ml1, a1, R, n, D, 0.125f);
#if defined(__x86_64__)
                if (vs_avx2) {
                    kkv_ops_avx2.softmax(s2, ml2, a2, R, n, D, 0.125f);
                    CHECK(memcmp(s1, s2, ns) == 0 && memcmp(a1, a2, na) == 0 && memcmp(ml1, ml2, nm) == 0,
                          "%s softmax n_rep=%d n=%d step %d: not the AVX2 softmax's bits", kkv_kernel_name(k->kind), R, n, step);
                }
#endif
                int bad = 0;
                for (int i = 0; i < R * n; i++) bad += !close_to(s1[i], s0[i], 1.0, st);
                for (int i = 0; i < R * D; i++) bad += !close_to(a1[i], a0[i], fabs(a0[i]) + 1e-30, st);
                for (int i = 0; i < R; i++) {
                    bad += ml1[2 * i] != ml0[2 * i];
                    bad += !close_to(ml1[2 * i + 1], ml0[2 * i + 1], fabs(ml0[2 * i + 1]), st);
                }
                CHECK(!bad, "%s softmax n_rep=%d n=%d step %d: %d values off", kkv_kernel_name(k->kind), R, n, step, bad);
            }
        }
}

/* The running max held and the running max infinite. When a block's max stays
 * below the running one the SIMD softmaxes skip the rescale by e^0 = 1: acc
 * must come back bit for bit, the max unchanged and the sum l + this block's
 * sum. At a running max of +inf the scalar reference's e^(inf - inf) is NaN,
 * and every table must give the same NaN state, not skip it. */
static void test_softmax_held(const kkv_ops *k, tu_rng *r) {
    enum { D = 64, N = 37 };
    for (int R = 1; R <= 8 && !tu_failed(); R++) {
        float s0[8 * N], s1[8 * N], ml0[16], ml1[16], a0[8 * D], a1[8 * D], a_in[8 * D];
        for (int i = 0; i < R * N; i++) s0[i] = s1[i] = tu_normal(r) * 4.0f;
        for (int i = 0; i < R * D; i++) a_in[i] = a0[i] = a1[i] = tu_normal(r);
        for (int i = 0; i < R; i++) ml0[2 * i] = 50.0f, ml0[2 * i + 1] = 2.5f; /* above every s * 0.125 */
        memcpy(ml1, ml0, sizeof ml0);
        k->softmax(s1, ml1, a1, R, N, D, 0.125f);
        for (int i = 0; i < R; i++) {
            float ml2[2] = {50.0f, 0.0f}, a2[D], s2[N];
            memcpy(s2, s0 + (size_t)i * N, sizeof s2);
            memcpy(a2, a_in + (size_t)i * D, sizeof a2);
            k->softmax(s2, ml2, a2, 1, N, D, 0.125f); /* the same head from l = 0 */
            CHECK(ml1[2 * i] == 50.0f && ml1[2 * i + 1] == 2.5f + ml2[1] &&
                      memcmp(a1 + (size_t)i * D, a_in + (size_t)i * D, D * sizeof(float)) == 0,
                  "%s softmax n_rep=%d head %d: held max changed acc or the state", kkv_kernel_name(k->kind), R, i);
        }
        for (int i = 0; i < R; i++) ml0[2 * i] = ml1[2 * i] = INFINITY, ml0[2 * i + 1] = ml1[2 * i + 1] = 1.0f;
        memcpy(a0, a_in, sizeof a0), memcpy(a1, a_in, sizeof a1), memcpy(s1, s0, sizeof s1);
        kkv_ops_scalar.softmax(s0, ml0, a0, R, N, D, 0.125f);
        k->softmax(s1, ml1, a1, R, N, D, 0.125f);
        int same = 1;
        for (int i = 0; i < R * D; i++) same &= isnan(a0[i]) == isnan(a1[i]);
        for (int i = 0; i < 2 * R; i++) same &= isnan(ml0[i]) == isnan(ml1[i]) && (isnan(ml0[i]) || ml0[i] == ml1[i]);
        CHECK(same && isnan(a1[0]), "%s softmax n_rep=%d: running max +inf differs from the scalar reference",
              kkv_kernel_name(k->kind), R);
    }
}

static const kkv_select SELS[] = {KKV_SELECT_MAGNITUDE, KKV_SELECT_VARIANCE, KKV_SELECT_RANDOM,
                                  KKV_SELECT_EXPLICIT};

static void test_encode(const kkv_ops *k, tu_rng *r) {
    if (k != &kkv_ops_scalar && k->key_encode == kkv_ops_scalar.key_encode &&
        k->value_encode == kkv_ops_scalar.value_encode)
        return; /* the scalar codecs themselves (the NEON table's) */
    for (int di = 0; di < NELEM(Ds); di++)
        for (int gi = 0; gi < NELEM(Gs); gi++) {
            int D = Ds[di], G = Gs[gi];
            uint16_t *x = xmalloc((size_t)G * D * 2);
            float *tmp = xmalloc((size_t)G * D * 4);
            size_t kb = kkv_key_page_bytes(D, G, D), vb = kkv_value_page_bytes(D, G, 4);
            uint8_t *p0 = xmalloc(kb > vb ? kb : vb), *p1 = xmalloc(kb > vb ? kb : vb);
            uint8_t rank[KKV_MAX_HEAD_DIM];
            for (int j = 0; j < D; j++) rank[j] = (uint8_t)(D - 1 - j);
            for (int nb = 0; nb <= D && !tu_failed(); nb += (D <= 64 ? 1 : 3)) {
                int kind = tu_int(r, 6);
                kkv_select sel = SELS[nb % 4];
                special_f16(r, x, G, D, kind);
                memset(p0, 0xAA, kb);
                memset(p1, 0x55, kb);
                size_t bytes = kkv_key_page_bytes(D, G, nb);
                kkv_ops_scalar.key_encode(p0, tmp, x, D, G, nb, sel, 11, (uint64_t)nb, rank);
                k->key_encode(p1, tmp, x, D, G, nb, sel, 11, (uint64_t)nb, rank);
                CHECK(memcmp(p0, p1, bytes) == 0, "%s key_encode D=%d G=%d nb=%d sel=%d kind=%d: bytes differ",
                      kkv_kernel_name(k->kind), D, G, nb, (int)sel, kind);
            }
            for (int kind = 0; kind < 6; kind++)
                for (int bits = 2; bits <= 4; bits += 2) {
                    special_f16(r, x, G, D, kind);
                    size_t bytes = kkv_value_page_bytes(D, G, bits);
                    memset(p0, 0xAA, bytes);
                    memset(p1, 0x55, bytes);
                    kkv_ops_scalar.value_encode(p0, tmp, x, D, G, bits);
                    k->value_encode(p1, tmp, x, D, G, bits);
                    CHECK(memcmp(p0, p1, bytes) == 0, "%s value_encode D=%d G=%d bits=%d kind=%d: bytes differ",
                          kkv_kernel_name(k->kind), D, G, bits, kind);
                }
            free(x), free(tmp), free(p0), free(p1);
        }
}

/* ------------------------------------------------------------ end to end */

/* softmax(q . k / sqrt(D)) v in double over n tokens. out: [D]; *mag gets
 * sum p |v| / sum p per channel (max over channels). */
static void ref_attend(double *out, double *mag, const float *q, const float *K, const float *V,
                       int n, int D) {
    double *s = xmalloc((size_t)n * sizeof *s), mx = -INFINITY, l = 0;
    for (int t = 0; t < n; t++) {
        double d = 0;
        for (int j = 0; j < D; j++) d += (double)q[j] * K[(size_t)t * D + j];
        s[t] = d / sqrt((double)D);
        mx = s[t] > mx ? s[t] : mx;
    }
    for (int t = 0; t < n; t++) l += (s[t] = exp(s[t] - mx));
    *mag = 0;
    for (int j = 0; j < D; j++) {
        double o = 0, m = 0;
        for (int t = 0; t < n; t++) {
            o += s[t] * V[(size_t)t * D + j];
            m += s[t] * fabs(V[(size_t)t * D + j]);
        }
        out[j] = o / l;
        *mag = m / l > *mag ? m / l : *mag;
    }
    free(s);
}

static kkv_cache *make_cache(const char *name, int H, int D, int threads) {
    kkv_method m;
    if (kkv_method_from_name(&m, name) != KKV_OK) return NULL;
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = H, .head_dim = D,
                            .pool_bytes = 64u << 20, .n_threads = threads, .method = m};
    kkv_cache *c = NULL;
    if (kkv_cache_create(&c, &cfg) != KKV_OK) return NULL;
    return c;
}

/* fast: the table compared with the scalar one (SCALAR where the CPU has no
 * other); its page kernels work in the integer domain where it is AVX2. */
static void test_end_to_end(kkv_kernel fast, double *worst_ref, double *worst_k) {
    int have_fast = fast != KKV_KERNEL_SCALAR;
    static const int ratios[] = {1, 3, 4, 8}, dims[] = {64, 128};
    const char *const *names = kkv_method_names();
    tu_rng r = tu_rng_make(2024);
    static const char *const quick_names[] = {"fp16", "kivi-k2v2", "kitty", "kivi-k4v4", "kitty-plus-pro", NULL};
    if (quick) names = quick_names;
    for (int mi = 0; names[mi]; mi++)
        for (int ri = 0; ri < 4; ri++)
            for (int di = 0; di < (quick ? 1 : 2) && !tu_failed(); di++) {
                int H = 2, n_rep = ratios[ri], D = dims[di], nq = H * n_rep;
                kkv_cache *c1 = make_cache(names[mi], H, D, 1), *c2 = make_cache(names[mi], H, D, 2);
                kkv_cache *cs = make_cache(names[mi], H, D, 1); /* scalar flush from the start */
                CHECK(c1 && c2 && cs, "cache create %s: %s", names[mi], kkv_last_error());
                if (!c1 || !c2 || !cs) return;
                kkv_cache_set_kernel(cs, KKV_KERNEL_SCALAR);
                if (have_fast) {
                    kkv_cache_set_kernel(c1, fast);
                    kkv_cache_set_kernel(c2, fast);
                }
                int s1, s2, s3;
                kkv_seq_add(c1, &s1);
                kkv_seq_add(c2, &s2);
                kkv_seq_add(cs, &s3);
                const kkv_method *m = &kkv_cache_get_config(c1)->method;
                int S = m->sink, G = m->group, R = m->window;
                int n_max = quick ? 300 : 1000; /* quick: past sink + window + one page */
                int checks[] = {S > 0 ? S : 1, S + G, S + G + 1, S + R + G, S + R + G + 5, n_max};
                float *k = xmalloc((size_t)H * D * 4), *v = xmalloc((size_t)H * D * 4);
                float *q = xmalloc((size_t)nq * D * 4), *o1 = xmalloc((size_t)nq * D * 4);
                float *o2 = xmalloc((size_t)nq * D * 4), *os = xmalloc((size_t)nq * D * 4);
                float *K = xmalloc((size_t)n_max * D * 4), *V = xmalloc((size_t)n_max * D * 4);
                double *ref = xmalloc((size_t)D * sizeof *ref);
                int ci = 0;
                for (int t = 1; t <= n_max; t++) {
                    for (int h = 0; h < H; h++)
                        for (int j = 0; j < D; j++) {
                            float amp = (j == 5 || j == D - 3) ? 12.0f : 1.0f; /* outlier channels */
                            k[h * D + j] = tu_normal(&r) * amp;
                            v[h * D + j] = tu_normal(&r);
                        }
                    kkv_append(c1, s1, 0, k, v);
                    kkv_append(c2, s2, 0, k, v);
                    kkv_append(cs, s3, 0, k, v);
                    while (ci < 6 && checks[ci] < t) ci++;
                    if (ci < 6 && checks[ci] == t) {
                        rand_f32(&r, q, nq * D);
                        kkv_attend(c1, o1, s1, 0, q, nq);
                        kkv_attend(c2, o2, s2, 0, q, nq);
                        CHECK(memcmp(o1, o2, (size_t)nq * D * 4) == 0,
                              "%s n_rep=%d D=%d len=%d: 1 vs 2 threads differ", names[mi], n_rep, D, t);
                        kkv_cache_set_kernel(c1, KKV_KERNEL_SCALAR);
                        kkv_cache_set_kernel(c2, KKV_KERNEL_SCALAR);
                        kkv_attend(c1, os, s1, 0, q, nq);
                        kkv_attend(c2, o2, s2, 0, q, nq);
                        CHECK(memcmp(os, o2, (size_t)nq * D * 4) == 0,
                              "%s n_rep=%d D=%d len=%d: scalar 1 vs 2 threads differ", names[mi], n_rep, D, t);
                        if (have_fast) {
                            kkv_cache_set_kernel(c1, fast);
                            kkv_cache_set_kernel(c2, fast);
                        }
                        for (int h = 0; h < H; h++) {
                            kkv_seq_read(c1, K, V, s1, 0, h);
                            for (int rr = 0; rr < n_rep; rr++) {
                                int qi = h * n_rep + rr;
                                double mag;
                                ref_attend(ref, &mag, q + (size_t)qi * D, K, V, t, D);
                                int bad_ref = 0, bad_k = 0;
                                for (int j = 0; j < D; j++) {
                                    double e1 = fabs(o1[qi * D + j] - ref[j]) / mag;
                                    double e2 = fabs((double)o1[qi * D + j] - os[qi * D + j]) / mag;
                                    double e3 = fabs(os[qi * D + j] - ref[j]) / mag;
                                    *worst_ref = fmax(*worst_ref, e3);
                                    *worst_k = fmax(*worst_k, e2);
                                    double tol_k = (fast == KKV_KERNEL_AVX2 || fast == KKV_KERNEL_NEON) && !m->fp16 ? TOL_E2E_INT : TOL_PRIM;
                                    bad_ref += e1 > TOL_REF + tol_k || e3 > TOL_REF;
                                    bad_k += e2 > tol_k;
                                }
                                CHECK(!bad_ref, "%s n_rep=%d D=%d len=%d head %d: %d channels off the double reference",
                                      names[mi], n_rep, D, t, qi, bad_ref);
                                CHECK(!bad_k, "%s n_rep=%d D=%d len=%d head %d: %d channels differ %s vs scalar",
                                      names[mi], n_rep, D, t, qi, bad_k, kkv_kernel_name(fast));
                            }
                        }
                    }
                    kkv_flush(c1, s1, 0);
                    kkv_flush(c2, s2, 0);
                    kkv_flush(cs, s3, 0);
                }
                /* pages written by the SIMD flush are the scalar flush's bytes */
                if (!m->fp16) {
                    /* a pooled budget (kitty-plus-pro) sizes each page by its own n_boost */
                    size_t cap = kkv_method_key_page_bytes(m, D, D);
                    uint8_t *pa = xmalloc(cap), *pb = xmalloc(cap);
                    int np = (n_max - S) / G, same = 1;
                    for (int p = 0; p < np; p++)
                        for (int h = 0; h < H; h++) {
                            int nba = kkv_seq_key_page_boost(c1, s1, 0, h, p);
                            size_t kb = kkv_method_key_page_bytes(m, D, nba);
                            same &= nba == kkv_seq_key_page_boost(cs, s3, 0, h, p);
                            same &= kkv_seq_key_page(c1, pa, cap, s1, 0, h, p) == KKV_OK;
                            same &= kkv_seq_key_page(cs, pb, cap, s3, 0, h, p) == KKV_OK;
                            same &= memcmp(pa, pb, kb) == 0;
                        }
                    float *V2 = xmalloc((size_t)n_max * D * 4);
                    for (int h = 0; h < H; h++) {
                        kkv_seq_read(c1, NULL, V, s1, 0, h);
                        kkv_seq_read(cs, NULL, V2, s3, 0, h);
                        same &= memcmp(V, V2, (size_t)n_max * D * 4) == 0;
                    }
                    CHECK(same, "%s n_rep=%d D=%d: SIMD-flushed pages differ from scalar-flushed", names[mi], n_rep, D);
                    free(pa), free(pb), free(V2);
                }
                free(k), free(v), free(q), free(o1), free(o2), free(os), free(K), free(V), free(ref);
                kkv_cache_free(c1);
                kkv_cache_free(c2);
                kkv_cache_free(cs);
                quick_done(names[mi], "end to end");
            }
}

#if defined(__x86_64__)
/* One block through kkv_avx2_softmax and the AVX-512 one, the first block
 * of a sequence (rep 0) or a later one: the same bytes out, or a failure. */
static void softmax512_case(tu_rng *r, int n, int R, int rep) {
    const kkv_ops *o = kkv_ops_get(KKV_KERNEL_AVX512);
    static float s0[8 * 300], s1[8 * 300], a0[8 * 256], a1[8 * 256], m0[16], m1[16];
    int D = Ds[tu_int(r, NELEM(Ds))];
    for (int i = 0; i < R * n; i++) s0[i] = 8.0f * tu_normal(r);
    for (int i = 0; i < R * D; i++) a0[i] = tu_normal(r);
    for (int i = 0; i < R; i++) {
        m0[2 * i] = rep ? 3.0f * tu_normal(r) : -INFINITY;
        m0[2 * i + 1] = rep ? fabsf(tu_normal(r)) : 0.0f;
    }
    memcpy(s1, s0, sizeof s0), memcpy(a1, a0, sizeof a0), memcpy(m1, m0, sizeof m0);
    kkv_avx2_softmax(s0, m0, a0, R, n, D, 0.125f);
    o->softmax(s1, m1, a1, R, n, D, 0.125f);
    CHECK(memcmp(s0, s1, (size_t)R * n * 4) == 0 && memcmp(a0, a1, (size_t)R * D * 4) == 0 &&
              memcmp(m0, m1, (size_t)R * 2 * 4) == 0,
          "avx512 softmax n=%d n_rep=%d D=%d: not bit-identical to avx2", n, R, D);
}

/* The AVX-512 softmax (16-lane exponentials, the 8-lane sum chain) gives
 * exactly kkv_avx2_softmax's bytes: block lengths 1..300 (every tail) with
 * head counts 1..8 at random, D 4..256; then every head count for lengths
 * that take its heads-side-by-side path (multiples of 16: groups of four
 * heads and each remainder). */
static void test_softmax512_exact(tu_rng *r) {
    static const int n16[] = {16, 128, 256};
    int n_cmp = 0;
    for (int n = 1; n <= 300 && !tu_failed(); n += (n < 40 ? 1 : 13))
        for (int rep = 0; rep < 2; rep++, n_cmp++) softmax512_case(r, n, 1 + tu_int(r, 8), rep);
    for (int i = 0; i < NELEM(n16) && !tu_failed(); i++)
        for (int R = 1; R <= 8; R++)
            for (int rep = 0; rep < 2; rep++, n_cmp++) softmax512_case(r, n16[i], R, rep);
    printf("kernel avx512 softmax: %d blocks bit-identical to avx2\n", n_cmp);
}

/* The 512-bit fp16 kernels give the AVX2 ones' bits (attn_f16_avx512.c):
 * every D that is a multiple of 4 up to 68 and a few to 256 (8-channel tails,
 * 16-channel tails), n_rep 1..9 (the 4-head passes and their remainders),
 * token counts across the 8-token groups and their 4/1-token tails, values of
 * mixed sign and size, accumulators carried in. */
static void test_f16_512_exact(tu_rng *r) {
    static const int Dx[] = {4, 8, 12, 16, 20, 24, 28, 32, 36, 44, 52, 60, 64, 68, 100, 128, 132, 252, 256};
    enum { NMAX = 140, RMAX = 9 };
    const kkv_ops *o = kkv_ops_get(KKV_KERNEL_AVX512);
    int n_cmp = 0;
    for (int di = 0; di < NELEM(Dx) && !tu_failed(); di++) {
        int D = Dx[di];
        uint16_t *kv = xmalloc((size_t)NMAX * D * 2);
        float *q = xmalloc((size_t)RMAX * D * 4), *p = xmalloc((size_t)RMAX * NMAX * 4);
        float *s0 = xmalloc((size_t)RMAX * NMAX * 4), *s1 = xmalloc((size_t)RMAX * NMAX * 4);
        float *a0 = xmalloc((size_t)RMAX * D * 4), *a1 = xmalloc((size_t)RMAX * D * 4);
        rand_f16(r, kv, NMAX * D, D, 4.0f);
        for (int i = 0; i < RMAX * D; i++) q[i] = 3.0f * tu_normal(r);
        for (int i = 0; i < RMAX * NMAX; i++) p[i] = fabsf(tu_normal(r));
        for (int R = 1; R <= RMAX && !tu_failed(); R++)
            for (int n = 1; n <= NMAX; n += (n < 34 ? 1 : 9)) {
                kkv_avx2_qk_f16(s0, q, R, kv, n, D, NULL);
                o->qk_f16(s1, q, R, kv, n, D, kv);
                CHECK(memcmp(s0, s1, (size_t)R * n * 4) == 0, "avx512 qk_f16 D=%d n_rep=%d n=%d: not bit-identical to avx2",
                      D, R, n);
                for (int i = 0; i < R * D; i++) a0[i] = a1[i] = tu_normal(r);
                kkv_avx2_pv_f16(a0, p, R, kv, n, D, NULL);
                o->pv_f16(a1, p, R, kv, n, D, kv);
                CHECK(memcmp(a0, a1, (size_t)R * D * 4) == 0, "avx512 pv_f16 D=%d n_rep=%d n=%d: not bit-identical to avx2",
                      D, R, n);
                n_cmp++;
            }
        free(kv), free(q), free(p), free(s0), free(s1), free(a0), free(a1);
    }
    printf("kernel avx512 qk_f16/pv_f16: %d shapes bit-identical to avx2\n", n_cmp);
}
#endif

#if defined(__x86_64__)
/* A VNNI page-kernel pair gives exactly the AVX2 integer kernels' bytes (both
 * sum the codes exactly in integers; attn_int_impl.h): every D, G, n_boost
 * spread, n_rep 1..8, bit width, and a page tail of G = 12 (a half quad).
 * qk NULL: a build with a value kernel only (VBMI). */
static void test_vnni_exact(const char *name, qk_page_fn qk, pv_page_fn pv, tu_rng *r) {
    static const int Gx[] = {4, 12, 20, 128, 256};
    int n_cmp = 0;
    for (int di = 0; di < NELEM(Ds); di++)
        for (int gi = 0; gi < NELEM(Gx); gi++) {
            int D = Ds[di], G = Gx[gi];
            float *x = xmalloc((size_t)G * D * 4), *q = xmalloc((size_t)8 * D * 4);
            float *p = xmalloc((size_t)8 * G * 4);
            float *s0 = xmalloc((size_t)8 * G * 4), *s1 = xmalloc((size_t)8 * G * 4);
            float *a0 = xmalloc((size_t)8 * D * 4), *a1 = xmalloc((size_t)8 * D * 4);
            uint8_t *kp = xmalloc(kkv_key_page_bytes(D, G, D));
            uint8_t *vp = xmalloc(kkv_value_page_bytes(D, G, 4));
            for (int nb = 0; qk && nb <= D && !tu_failed(); nb += (D <= 12 ? 1 : D / 8 + 1)) {
                for (int i = 0; i < G * D; i++)
                    x[i] = tu_normal(r) * ((i % D) % 5 == 2 ? 20.0f : (i % D) % 7 == 3 ? 0.05f : 1.0f);
                kkv_key_page_encode(kp, x, D, G, nb, KKV_SELECT_RANDOM, 3, (uint64_t)nb, NULL);
                /* a random head count, and 3 and 4: the shapes with their own
                 * constant-size copy (D 64 / 256 at G 128) */
                for (int t = 0; t < 3; t++) {
                    int R = t == 0 ? 1 + tu_int(r, 8) : t + 2;
                    rand_f32(r, q, R * D);
                    kkv_avx2i_qk_page(s0, q, R, kp, D, G, nb);
                    qk(s1, q, R, kp, D, G, nb);
                    CHECK(memcmp(s0, s1, (size_t)R * G * 4) == 0, "%s qk_page D=%d G=%d nb=%d n_rep=%d: not bit-identical to avx2", name, D, G, nb, R);
                    n_cmp++;
                }
            }
            for (int bits = 2; bits <= 4 && !tu_failed(); bits += 2)
                for (int R = 1; R <= 8; R++) {
                    for (int i = 0; i < G * D; i++) x[i] = tu_normal(r) + 0.3f * (float)((i / D) % 7);
                    kkv_value_page_encode(vp, x, D, G, bits);
                    for (int i = 0; i < R * G; i++) {
                        float u = fabsf(tu_uniform(r));
                        p[i] = (i % 13 == 0) ? 0.0f : (i % 3 == 0) ? u : u * u * 0.02f;
                    }
                    rand_f32(r, a0, R * D);
                    memcpy(a1, a0, (size_t)R * D * 4);
                    kkv_avx2i_pv_page(a0, p, R, vp, D, G, bits);
                    pv(a1, p, R, vp, D, G, bits);
                    CHECK(memcmp(a0, a1, (size_t)R * D * 4) == 0, "%s pv_page D=%d G=%d bits=%d n_rep=%d: not bit-identical to avx2", name, D, G, bits, R);
                    n_cmp++;
                }
            free(x), free(q), free(p), free(s0), free(s1), free(a0), free(a1), free(kp), free(vp);
        }
    printf("kernel %s: %d page calls bit-identical to the avx2 integer kernels\n", name, n_cmp);
}
#endif

/* The AVX2 8-bit key kernel sums every pair of a pass in one int16 block
 * when the query's bound sum_j 3 |x_j| + sum_k 12 |x_rank k| is <= 32767,
 * and in two (channel pairs, then high ranks) otherwise; the NEON one
 * (attn_int_neon.c) widens its int16 sums wherever the running bound would
 * pass 32767 (one segment here, or two and three). Pages where every
 * code is 0 or its largest value and queries where every |x| is 127 (each
 * channel's q times its scale the same) put the int16 sums at that bound:
 * D 64 with 5 boosted channels just under it (one block, sums up to 32004),
 * with 8 over it (two blocks), D 256 over it too, D 12 (a partial chunk)
 * under it; all heads positive
 * (sums at the bound) and alternating signs. Scores within the derived
 * bound of the scalar reference either way. */
static void test_byte_blocks(const char *name, qk_page_fn fn, tu_rng *r) {
    /* D, G, heads, n_boost, one block */
    static const int shapes[][5] = {{64, 128, 3, 5, 1}, {64, 128, 3, 8, 0}, {256, 128, 4, 32, 0}, {12, 20, 2, 3, 1}};
    cmp_stats st = {0};
    int n_cmp = 0;
    for (int si = 0; si < NELEM(shapes) && !tu_failed(); si++) {
        int D = shapes[si][0], G = shapes[si][1], R = shapes[si][2], nb = shapes[si][3];
        int one_block = 127 * (3 * D + 12 * nb) <= 32767;
        CHECK(one_block == shapes[si][4], "byte blocks D=%d nb=%d: not the block count this case is for", D, nb);
        float *x = xmalloc((size_t)G * D * 4), *kd = xmalloc((size_t)G * D * 4), *q = xmalloc((size_t)R * D * 4);
        float *s0 = xmalloc((size_t)R * G * 4), *s1 = xmalloc((size_t)R * G * 4);
        uint8_t *page = xmalloc(kkv_key_page_bytes(D, G, nb));
        for (int t = 0; t < G; t++) /* every channel -1 / +1: codes 0 or maxq, one range */
            for (int j = 0; j < D; j++) x[(size_t)t * D + j] = (t + (t % 3 == 0) * j) % 2 ? 1.0f : -1.0f;
        kkv_key_page_encode(page, x, D, G, nb, KKV_SELECT_MAGNITUDE, 0, 0, NULL);
        kkv_key_page_decode(kd, page, D, G, nb);
        kkv_key_layout L = kkv_key_layout_of(D, G, nb);
        for (int sign = 0; sign < 2; sign++) {
            for (int h = 0; h < R; h++)
                for (int j = 0; j < D; j++) /* q scale the same on every channel: 4-bit scales are 1/5 */
                    q[(size_t)h * D + j] = (page[L.idx + j] < nb ? 5.0f : 1.0f) * (sign && j % 2 ? -1.0f : 1.0f);
            int bad = check_qk_page(fn, 4, q, R, page, kd, D, G, nb, s0, s1, &st);
            CHECK(!bad, "%s byte qk_page D=%d nb=%d (%s), %s signs: %d scores off", name, D, nb,
                  one_block ? "one block" : "two blocks", sign ? "alternating" : "equal", bad);
            n_cmp++;
        }
        free(x), free(kd), free(q), free(s0), free(s1), free(page);
    }
    (void)r;
    printf("kernel %s byte qk_page: %d pages at the int16 block bound within the derived bound\n", name, n_cmp);
}

/* Inputs the integer path cannot represent (an infinite query, a negative,
 * NaN or infinite probability) take exactly the float kernels' result, and
 * nothing of the integer pass is left in acc: the shapes with their own
 * constant-size copies (D 64 / 3 heads, D 256 / 4), more heads than one pass
 * (the bad value in the second pass), pages longer than one token block. */
static void test_fallback_exact(const char *name, qk_page_fn qk, pv_page_fn pv, qk_page_fn qk_float,
                                pv_page_fn pv_float, tu_rng *r) {
    static const int shapes[][3] = {{64, 128, 3}, {256, 128, 4}, {64, 128, 6}, {12, 256, 2}, {64, 256, 5}};
    int n_cmp = 0;
    for (int si = 0; si < NELEM(shapes) && !tu_failed(); si++) {
        int D = shapes[si][0], G = shapes[si][1], R = shapes[si][2], nb = D / 8;
        float *x = xmalloc((size_t)G * D * 4), *q = xmalloc((size_t)R * D * 4), *p = xmalloc((size_t)R * G * 4);
        float *s0 = xmalloc((size_t)R * G * 4), *s1 = xmalloc((size_t)R * G * 4);
        float *a0 = xmalloc((size_t)R * D * 4), *a1 = xmalloc((size_t)R * D * 4);
        uint8_t *kp = xmalloc(kkv_key_page_bytes(D, G, nb)), *vp = xmalloc(kkv_value_page_bytes(D, G, 2));
        for (int i = 0; i < G * D; i++) x[i] = tu_normal(r);
        kkv_key_page_encode(kp, x, D, G, nb, KKV_SELECT_MAGNITUDE, 0, 0, NULL);
        kkv_value_page_encode(vp, x, D, G, 2);
        for (int i = 0; i < R * D; i++) q[i] = tu_normal(r);
        q[(size_t)(R - 1) * D + D / 2] = INFINITY;
        qk_float(s0, q, R, kp, D, G, nb);
        qk(s1, q, R, kp, D, G, nb);
        CHECK(memcmp(s0, s1, (size_t)R * G * 4) == 0, "%s qk_page D=%d G=%d n_rep=%d, an infinite query: not the float kernel's result", name, D, G, R);
        { /* a head of tiny queries: a step that would not be a normal float */
            for (int j = 0; j < D; j++) q[(size_t)(R - 1) * D + j] = 1e-36f * (float)(j % 5 - 2);
            qk_float(s0, q, R, kp, D, G, nb);
            qk(s1, q, R, kp, D, G, nb);
            CHECK(memcmp(s0, s1, (size_t)R * G * 4) == 0, "%s qk_page D=%d G=%d n_rep=%d, a tiny query: not the float kernel's result", name, D, G, R);
        }
        static const float bad[3] = {-0.5f, NAN, INFINITY};
        for (int b = 0; b < 3; b++) {
            for (int i = 0; i < R * G; i++) p[i] = fabsf(tu_uniform(r));
            p[(size_t)(b == 1 ? 0 : R - 1) * G + G - 3] = bad[b];
            rand_f32(r, a0, R * D);
            memcpy(a1, a0, (size_t)R * D * 4);
            pv_float(a0, p, R, vp, D, G, 2);
            pv(a1, p, R, vp, D, G, 2);
            CHECK(memcmp(a0, a1, (size_t)R * D * 4) == 0, "%s pv_page D=%d G=%d n_rep=%d, probability %g: not the float kernel's result", name, D, G, R, (double)bad[b]);
            n_cmp += 2;
        }
        free(x), free(q), free(p), free(s0), free(s1), free(a0), free(a1), free(kp), free(vp);
    }
    printf("kernel %s: %d non-representable page calls equal to the float kernels\n", name, n_cmp);
}

/* Two machine-independent hashes: of what the integer page kernels of the
 * AVX2 tables (attn_qkbyte_avx2.c, attn_qkwide_avx2.c, attn_int_impl.h) and
 * of the NEON table (attn_int_neon.c) compute, and of what their fp16-run
 * kernels and softmaxes (attn_avx2.c, attn_neon.c) compute. Each pair takes
 * the same folds, steps, fused multiply-adds and reduction trees, and exact
 * integer sums, so an x86 and an ARM machine must both give PAGE_INT_HASH
 * and F16_HASH. The pages and inputs come from tu_uniform and exact float
 * operations only (no libm), the same bytes on every machine; shapes cover D
 * 4..256, partial and later chunks, n_boost 0..D on both sides of D / 2 (the
 * 8-bit and the 16-bit query), head counts 1..8, 2- and 4-bit values, zero
 * probabilities, runs of 1..260 tokens, and softmax blocks that move the
 * running maximum and blocks that leave it. */
#define PAGE_INT_HASH 0x426aaef305eb4beeull
#define F16_HASH 0x601973f9d6b117f6ull
static uint64_t fnv_bytes(uint64_t h, const void *p, size_t n) { /* FNV-1a 64 */
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)p)[i]) * 0x100000001b3ull;
    return h;
}
static void test_page_hash(const char *name, const kkv_ops *k) {
    static const int shapes[][4] = { /* D, G, n_boost, heads */
        {4, 4, 0, 1},      {4, 12, 1, 3},     {4, 12, 3, 2},      {12, 100, 2, 4},   {12, 100, 7, 1},
        {20, 128, 5, 3},   {36, 260, 9, 8},   {36, 68, 20, 5},    {64, 128, 0, 3},   {64, 128, 8, 3},
        {64, 128, 32, 4},  {64, 128, 33, 3},  {64, 128, 64, 2},   {64, 260, 16, 6},  {128, 128, 16, 7},
        {128, 100, 70, 3}, {256, 128, 32, 4}, {256, 128, 200, 1}, {256, 260, 0, 2}};
    tu_rng r = tu_rng_make(4242);
    uint64_t h = 0xcbf29ce484222325ull;
    long n_out = 0;
    for (int si = 0; si < NELEM(shapes); si++) {
        int D = shapes[si][0], G = shapes[si][1], nb = shapes[si][2], R = shapes[si][3];
        float *x = xmalloc((size_t)G * D * 4), *q = xmalloc((size_t)R * D * 4), *p = xmalloc((size_t)R * G * 4);
        float *out = xmalloc((size_t)R * (G > D ? G : D) * 4);
        uint8_t *kp = xmalloc(kkv_key_page_bytes(D, G, nb)), *vp = xmalloc(kkv_value_page_bytes(D, G, 4));
        for (int i = 0; i < G * D; i++) /* an outlier channel and a near-dead one */
            x[i] = tu_uniform(&r) * ((i % D) % 7 == 3 ? 8.0f : (i % D) % 11 == 5 ? 0.015625f : 1.0f);
        for (int i = 0; i < R * D; i++) q[i] = 2.0f * tu_uniform(&r);
        kkv_key_page_encode(kp, x, D, G, nb, KKV_SELECT_MAGNITUDE, 0, 0, NULL);
        k->qk_page(out, q, R, kp, D, G, nb);
        h = fnv_bytes(h, out, (size_t)R * G * 4);
        n_out += (long)R * G;
        for (int bits = 2; bits <= 4; bits += 2) {
            kkv_value_page_encode(vp, x, D, G, bits);
            for (int i = 0; i < R * G; i++) p[i] = i % 9 == 4 ? 0.0f : fabsf(tu_uniform(&r));
            for (int i = 0; i < R * D; i++) out[i] = tu_uniform(&r);
            k->pv_page(out, p, R, vp, D, G, bits);
            h = fnv_bytes(h, out, (size_t)R * D * 4);
            n_out += (long)R * D;
        }
        free(x), free(q), free(p), free(out), free(kp), free(vp);
    }
    uint64_t hf = 0xcbf29ce484222325ull;
    static const int runs[][3] = {{4, 1, 1}, {12, 3, 2}, {20, 7, 3}, {36, 31, 4}, {64, 128, 3}, {64, 33, 8},
                                  {128, 100, 5}, {256, 260, 4}, {256, 3, 1}};
    for (int si = 0; si < NELEM(runs); si++) {
        int D = runs[si][0], n = runs[si][1], R = runs[si][2];
        uint16_t *kv = xmalloc((size_t)n * D * 2), *vv = xmalloc((size_t)n * D * 2);
        float *q = xmalloc((size_t)R * D * 4), *s = xmalloc((size_t)R * n * 4), *acc = xmalloc((size_t)R * D * 4);
        float ml[16];
        for (int i = 0; i < n * D; i++) kv[i] = kkv_f16_store(4.0f * tu_uniform(&r)), vv[i] = kkv_f16_store(tu_uniform(&r));
        for (int i = 0; i < R * D; i++) q[i] = tu_uniform(&r), acc[i] = 0.0f;
        for (int b = 0; b < 2; b++) { /* a first block, then one whose scores stay below the running max */
            k->qk_f16(s, q, R, kv, n, D, NULL);
            hf = fnv_bytes(hf, s, (size_t)R * n * 4);
            if (b == 0)
                for (int rr = 0; rr < R; rr++) ml[2 * rr] = -INFINITY, ml[2 * rr + 1] = 0.0f;
            else
                for (int rr = 0; rr < R; rr++) ml[2 * rr] += rr % 2 ? 0.0f : 3.0f; /* odd heads: the max holds */
            k->softmax(s, ml, acc, R, n, D, 0.125f);
            hf = fnv_bytes(fnv_bytes(hf, s, (size_t)R * n * 4), ml, (size_t)R * 8);
            k->pv_f16(acc, s, R, vv, n, D, NULL);
            hf = fnv_bytes(hf, acc, (size_t)R * D * 4);
            for (int i = 0; i < R * D; i++) q[i] *= 0.5f;
        }
        free(kv), free(vv), free(q), free(s), free(acc);
    }
    printf("kernel %s: integer page kernels' hash %016llx over %ld outputs (pinned: %016llx)\n", name,
           (unsigned long long)h, n_out, (unsigned long long)PAGE_INT_HASH);
    printf("kernel %s: fp16 kernels' and softmax's hash %016llx (pinned: %016llx)\n", name,
           (unsigned long long)hf, (unsigned long long)F16_HASH);
    CHECK(hf == F16_HASH, "%s: the fp16 kernels' or the softmax's outputs are not the pinned ones (x86 AVX2 and "
          "aarch64 NEON must agree bit for bit)", name);
    CHECK(h == PAGE_INT_HASH, "%s: the integer page kernels' outputs are not the pinned ones (x86 AVX2 and "
          "aarch64 NEON must agree bit for bit)", name);
}

#if defined(__x86_64__)
/* The VBMI table's key kernel gives, bit for bit, the AVX2 8-bit kernel's
 * scores on pages with n_boost <= D / 2 (the same fold and step, exact
 * integer sums, the same float step) and the VBMI wide kernel's on the
 * rest: every D, G (partial and later chunks), every n_boost for small D,
 * head counts 1..8 and the constant-size shapes, keys with outlier and
 * near-dead channels, and damaged pages where two channels claim one rank
 * and another rank has none. */
static void test_vbmi_byte_exact(tu_rng *r) {
    int n_cmp = 0;
    for (int di = 0; di < NELEM(Ds); di++)
        for (int gi = 0; gi < NELEM(Gs); gi++) {
            int D = Ds[di], G = Gs[gi];
            float *x = xmalloc((size_t)G * D * 4), *q = xmalloc((size_t)8 * D * 4);
            float *s0 = xmalloc((size_t)8 * G * 4), *s1 = xmalloc((size_t)8 * G * 4);
            uint8_t *kp = xmalloc(kkv_key_page_bytes(D, G, D));
            for (int nb = 0; nb <= D && !tu_failed(); nb += (D <= 64 ? 1 : 7)) {
                for (int i = 0; i < G * D; i++)
                    x[i] = tu_normal(r) * ((i % D) % 5 == 2 ? 20.0f : (i % D) % 7 == 3 ? 0.05f : 1.0f);
                kkv_key_page_encode(kp, x, D, G, nb, KKV_SELECT_RANDOM, 5, (uint64_t)nb, NULL);
                if (nb >= 2 && nb % 3 == 0) { /* damaged: the channel of rank 1 claims rank 0 too, rank 1 none */
                    kkv_key_layout L = kkv_key_layout_of(D, G, nb);
                    for (int j = 0; j < D; j++)
                        if (kp[L.idx + j] == 1) kp[L.idx + j] = 0;
                }
                for (int t = 0; t < 3; t++) {
                    int R = t == 0 ? 1 + tu_int(r, 8) : t + 2;
                    rand_f32(r, q, R * D);
                    if (2 * nb <= D) kkv_avx2_qk_byte(s0, q, R, kp, D, G, nb);
                    else kkv_vbmi512_qk_wide(s0, q, R, kp, D, G, nb);
                    kkv_vbmi512_qk_byte(s1, q, R, kp, D, G, nb);
                    CHECK(memcmp(s0, s1, (size_t)R * G * 4) == 0,
                          "avx512-vbmi byte qk_page D=%d G=%d nb=%d n_rep=%d: not bit-identical to %s", D, G, nb, R,
                          2 * nb <= D ? "avx2 byte" : "vbmi wide");
                    n_cmp++;
                }
            }
            free(x), free(q), free(s0), free(s1), free(kp);
        }
    printf("kernel avx512-vbmi byte qk_page: %d page calls bit-identical to avx2 byte / vbmi wide\n", n_cmp);
}
#endif

#if defined(__x86_64__)
typedef size_t (*plan_bytes_fn)(int);
typedef void (*plan_fn)(uint8_t *, const uint8_t *, int, int, int);
typedef void (*plan_run_fn)(float *, const float *, int, const uint8_t *, const uint8_t *, int, int, int);

/* The key kernel with a plan kept beside the page (built from a copy of the
 * page at another address) gives exactly qk_page's bytes: every D, G,
 * n_boost spread, n_rep 1..8, key-range spreads that fill all channel groups. */
static void test_plan_exact(const char *name, qk_page_fn qk, plan_bytes_fn pb, plan_fn pl,
                            plan_run_fn run, tu_rng *r) {
    static const int Gx[] = {4, 12, 20, 128, 256};
    int n_cmp = 0;
    uint8_t *plan = xmalloc(pb(256));
    for (int di = 0; di < NELEM(Ds); di++)
        for (int gi = 0; gi < NELEM(Gx); gi++) {
            int D = Ds[di], G = Gx[gi];
            float *x = xmalloc((size_t)G * D * 4), *q = xmalloc((size_t)8 * D * 4);
            float *s0 = xmalloc((size_t)8 * G * 4), *s1 = xmalloc((size_t)8 * G * 4);
            size_t kb = kkv_key_page_bytes(D, G, D);
            uint8_t *kp = xmalloc(kb), *kc = xmalloc(kb);
            for (int nb = 0; nb <= D && !tu_failed(); nb += (D <= 12 ? 1 : D / 8 + 1))
                for (int R = 1; R <= 8; R += (nb % 2 ? 3 : 2)) {
                    for (int i = 0; i < G * D; i++)
                        x[i] = tu_normal(r) * ((i % D) % 5 == 2 ? 20.0f : (i % D) % 7 == 3 ? 0.05f : 1.0f);
                    rand_f32(r, q, R * D);
                    kkv_key_page_encode(kp, x, D, G, nb, KKV_SELECT_RANDOM, 3, (uint64_t)nb, NULL);
                    memcpy(kc, kp, kb);
                    memset(plan, 0xA5, pb(D));
                    pl(plan, kc, D, G, nb);
                    memset(kc, 0xA5, kb); /* the plan must not point into the copy */
                    qk(s0, q, R, kp, D, G, nb);
                    run(s1, q, R, kp, plan, D, G, nb);
                    CHECK(memcmp(s0, s1, (size_t)R * G * 4) == 0, "%s planned qk_page D=%d G=%d nb=%d n_rep=%d: not bit-identical", name, D, G, nb, R);
                    n_cmp++;
                }
            free(x), free(q), free(s0), free(s1), free(kp), free(kc);
        }
    free(plan);
    printf("kernel %s: %d planned key-page calls bit-identical to qk_page\n", name, n_cmp);
}
#endif

#if defined(__x86_64__)
/* test_kernels --bench-plan: CPU ns per key page (D 64, G 128, n_boost 8,
 * 3 query heads, the VNNI kernel where the CPU has it) of qk_page, of the
 * planned kernel with plans built beforehand, and of the plan alone; hot (one
 * page) and in place (4096 pages 16 KB apart, the next page and its plan
 * prefetched). Ratios within one run; not a test. */
static int bench_plan(void) {
    enum { D = 64, G = 128, NB = 8, R = 3, NP = 4096, ITERS = 200000 };
    const kkv_cpu *cpu = kkv_cpu_get();
    if (!cpu->avx2) return 77;
    qk_page_fn qk = cpu->vnni ? kkv_vnni512_qk_page : kkv_avx2i_qk_page;
    size_t (*pb)(int) = cpu->vnni ? kkv_vnni512_qk_plan_bytes : kkv_avx2i_qk_plan_bytes;
    void (*pl)(uint8_t *, const uint8_t *, int, int, int) = cpu->vnni ? kkv_vnni512_qk_plan : kkv_avx2i_qk_plan;
    void (*run)(float *, const float *, int, const uint8_t *, const uint8_t *, int, int, int) =
        cpu->vnni ? kkv_vnni512_qk_page_plan : kkv_avx2i_qk_page_plan;
    size_t stride = 16384, pbytes = pb(D), kb = kkv_key_page_bytes(D, G, NB);
    uint8_t *pool = xmalloc(stride * NP), *plans = xmalloc(pbytes * NP); /* [NP] pages, [NP] plans */
    static float x[G * D], q[R * D], s[R * G];
    tu_rng r = tu_rng_make(5);
    for (int p = 0; p < NP; p++) {
        for (int i = 0; i < G * D; i++) x[i] = tu_normal(&r) * ((i % D) % 5 == 2 ? 4.0f : 1.0f);
        kkv_key_page_encode(pool + (size_t)p * stride, x, D, G, NB, KKV_SELECT_MAGNITUDE, 0, 0, NULL);
        pl(plans + pbytes * p, pool + (size_t)p * stride, D, G, NB);
    }
    rand_f32(&r, q, R * D);
    static const char *nm[] = {"qk_page", "planned", "plan only"};
    printf("key page D %d G %d n_boost %d, %d heads, %s: page %zu B, plan %zu B (%.1f%%)\n", D, G, NB, R,
           cpu->vnni ? "avx512-vnni" : "avx2-int", kb, pbytes, 100.0 * (double)pbytes / (double)kb);
    for (int round = 0; round < 3; round++)
        for (int mode = 0; mode < 2; mode++)
            for (int k = 0; k < 3; k++) {
                clock_t c0 = clock();
                for (int it = 0; it < ITERS; it++) {
                    size_t p = mode ? ((unsigned)it * 2654435761u) % NP : 0;
                    const uint8_t *pg = pool + p * stride;
                    if (mode) {
                        size_t nx = ((unsigned)(it + 1) * 2654435761u) % NP;
                        for (size_t o = 0; o < kb; o += 64) __builtin_prefetch(pool + nx * stride + o, 0, 1);
                        if (k) for (size_t o = 0; o < pbytes; o += 64) __builtin_prefetch(plans + pbytes * nx + o, 0, 1);
                    }
                    if (k == 0) qk(s, q, R, pg, D, G, NB);
                    else if (k == 1) run(s, q, R, pg, plans + pbytes * p, D, G, NB);
                    else pl(plans + pbytes * p, pg, D, G, NB);
                }
                double ns = 1e9 * (double)(clock() - c0) / CLOCKS_PER_SEC / ITERS;
                printf("round %d %-8s %-10s %7.1f cpu ns/page\n", round, mode ? "in place" : "hot", nm[k], ns);
            }
    free(pool), free(plans);
    return 0;
}
#endif

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One page pair as kkv_attend runs it (keys, softmax, values; the value
 * page vo bytes after the key page), the pair at nx (laid out the same)
 * prefetched in three bursts between the kernels when nx is not NULL. */
static void pair_step(const kkv_ops *ops, float *s, float *ml, float *acc, const float *q, const uint8_t *pg,
                      const uint8_t *nx, size_t kb, size_t vb, size_t vo, int nb) {
    enum { D = 64, G = 128, R = 3 };
    size_t kl = (kb + 63) / 64, nl = kl + (vb + 63) / 64, per = (nl + 2) / 3, i = 0;
#define PF_BURST                                                                      \
    for (size_t e = i + per < nl ? i + per : nl; nx && i < e; i++)                    \
    __builtin_prefetch(i < kl ? nx + 64 * i : nx + vo + 64 * (i - kl), 0, 1)
    PF_BURST;
    ops->qk_page(s, q, R, pg, D, G, nb);
    PF_BURST;
    ops->softmax(s, ml, acc, R, G, D, 0.125f);
    PF_BURST;
    ops->pv_page(acc, s, R, pg + vo, D, G, 2);
#undef PF_BURST
}

/* The same kernels walking a pool laid out as the engine's: one slot per
 * (page, layer), slots of one layer LAYERS apart, each slot the H heads'
 * pairs side by side (a 32K context of SmolLM2 shapes: 256 pages a head,
 * 30 layers, 3 heads, 119 MB on huge pages). Orders: the engine's (a head's
 * pages in turn, 466 KB apart), the heads of a slot in turn, and address
 * order; each with the burst prefetch and without. bench_page_stream
 * (bench/) models the same question with a calibrated scalar consumer,
 * which found address order much cheaper to feed; these rows answer it with
 * the real kernels. Wall ns per pair, medians of 5 interleaved rounds. */
static void bench_walks(const kkv_ops *ops, const uint8_t *pair, size_t kb, size_t vb, const float *q, int nb) {
    enum { D = 64, G = 128, R = 3, H = 3, LAYERS = 30, P = 256, ROUNDS = 5, N_WALKS = 7 };
    size_t pb = kb + vb, slot = H * pb, bytes = (size_t)P * LAYERS * slot, n = (size_t)P * LAYERS * H;
    uint8_t *pool = kkv_big_alloc(bytes);                   /* [P][LAYERS] slots of [H] pairs */
    const uint8_t **ord = xmalloc(3 * n * sizeof *ord);     /* [3 orders][n] pair addresses */
    static float s[R * G], ml[R * 2], acc[R * D];
    if (!pool) {
        printf("walks: no memory for a %zu MB pool\n", bytes >> 20);
        free(ord);
        return;
    }
    for (size_t o = 0; o < bytes; o += pb) memcpy(pool + o, pair, pb);
    size_t k = 0;
    for (int l = 0; l < LAYERS; l++) /* the engine: per layer, per head, its pages */
        for (int h = 0; h < H; h++)
            for (int p = 0; p < P; p++) ord[k++] = pool + ((size_t)p * LAYERS + (size_t)l) * slot + (size_t)h * pb;
    for (int l = 0; l < LAYERS; l++) /* per layer, per page, the heads of its slot */
        for (int p = 0; p < P; p++)
            for (int h = 0; h < H; h++) ord[k++] = pool + ((size_t)p * LAYERS + (size_t)l) * slot + (size_t)h * pb;
    for (size_t i = 0; i < n; i++) ord[k++] = pool + i * pb; /* address order */
    static const char *nm[N_WALKS] = {"hot (one pair)", "engine order", "heads of a slot", "address order",
                                      "engine, no prefetch", "slot heads, no pf", "address, no pf"};
    double t[N_WALKS][ROUNDS];
    for (int rd = 0; rd < ROUNDS; rd++)
        for (int w = 0; w < N_WALKS; w++) {
            const uint8_t **o = w == 0 ? NULL : ord + (size_t)((w - 1) % 3) * n;
            int pf = w < 4;
            size_t m = w == 0 ? n / 8 : n;
            for (int h = 0; h < R; h++) ml[2 * h] = -INFINITY, ml[2 * h + 1] = 0.0f;
            memset(acc, 0, sizeof acc);
            double t0 = wall_now();
            for (size_t i = 0; i < m; i++) {
                const uint8_t *pg = o ? o[i] : pool, *nx = o ? o[i + 1 < m ? i + 1 : i] : pool;
                pair_step(ops, s, ml, acc, q, pg, pf ? nx : NULL, kb, vb, kb, nb);
            }
            t[w][rd] = 1e9 * (wall_now() - t0) / (double)m;
        }
    printf("walks over a %zu MB pool of the engine's layout (%d pages a head, %d layers, %d heads):\n", bytes >> 20,
           P, LAYERS, H);
    for (int w = 0; w < N_WALKS; w++) {
        double *v = t[w];
        for (int a = 0; a < ROUNDS; a++)
            for (int b = a + 1; b < ROUNDS; b++)
                if (v[b] < v[a]) {
                    double z = v[a];
                    v[a] = v[b], v[b] = z;
                }
        printf("  %-20s %7.1f ns/pair (range %.1f-%.1f)\n", nm[w], v[ROUNDS / 2], v[0], v[ROUNDS - 1]);
    }
    kkv_big_free(pool, bytes);
    free(ord);
}

/* test_kernels --bench-pages [NB]: CPU ns of the best table's page kernels
 * on the engines' decode shape (D 64, G 128, 3 query heads, NB boosted
 * channels, default 8 = kitty; 16 = kitty-pro): qk_page, softmax and pv_page
 * (2-bit values) hot on one page, then a page pair (keys, softmax, values)
 * in place over NP pairs 32 KB apart, visited in a scrambled order with the
 * next pair prefetched as kkv_attend does (three bursts, attend.c says
 * why); then bench_walks. Ratios within one run; not a test. */
static int bench_pages(int nb) {
    enum { D = 64, G = 128, R = 3, NP = 8192, ITERS = 200000 };
    const kkv_ops *ops = kkv_ops_get(KKV_KERNEL_AUTO);
    size_t stride = 32768, kb = kkv_key_page_bytes(D, G, nb), vb = kkv_value_page_bytes(D, G, 2);
    uint8_t *pool = xmalloc(stride * NP); /* [NP] slots: key page, then value page */
    static float x[G * D], q[R * D], s[R * G], s0[R * G], ml[R * 2], acc[R * D];
    tu_rng r = tu_rng_make(5);
    for (int p = 0; p < NP; p++) {
        for (int i = 0; i < G * D; i++) x[i] = tu_normal(&r) * ((i % D) % 5 == 2 ? 4.0f : 1.0f);
        kkv_key_page_encode(pool + (size_t)p * stride, x, D, G, nb, KKV_SELECT_MAGNITUDE, 0, 0, NULL);
        for (int i = 0; i < G * D; i++) x[i] = tu_normal(&r);
        kkv_value_page_encode(pool + (size_t)p * stride + 16384, x, D, G, 2);
    }
    rand_f32(&r, q, R * D);
    for (int i = 0; i < R * G; i++) s0[i] = 0.01f * (float)(i % 97);
    printf("page kernels of table %s, D %d G %d n_boost %d, %d heads: key page %zu B, value page %zu B\n",
           kkv_kernel_name(ops->kind), D, G, nb, R, kb, vb);
    static const char *nm[] = {"qk_page", "softmax", "pv_page", "pair"};
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < 3; k++) {
            clock_t c0 = clock();
            for (int it = 0; it < ITERS; it++) {
                if (k == 0) ops->qk_page(s, q, R, pool, D, G, nb);
                else if (k == 1) {
                    memcpy(s, s0, sizeof s);
                    for (int h = 0; h < R; h++) ml[2 * h] = -INFINITY, ml[2 * h + 1] = 0.0f;
                    ops->softmax(s, ml, acc, R, G, D, 0.125f);
                } else ops->pv_page(acc, s, R, pool + 16384, D, G, 2);
            }
            double ns = 1e9 * (double)(clock() - c0) / CLOCKS_PER_SEC / ITERS;
            printf("round %d hot      %-8s %7.1f cpu ns/page%s\n", round, nm[k], ns, k == 1 ? " (with its reset)" : "");
        }
#if defined(__x86_64__)
        if (ops->qk_page == kkv_vbmi512_qk_byte) { /* the 15-bit kernel it replaced, for the ratio */
            clock_t c0 = clock();
            for (int it = 0; it < ITERS; it++) kkv_vbmi512_qk_wide(s, q, R, pool, D, G, nb);
            double ns = 1e9 * (double)(clock() - c0) / CLOCKS_PER_SEC / ITERS;
            printf("round %d hot      %-8s %7.1f cpu ns/page (the VBMI 15-bit kernel)\n", round, "qk_wide", ns);
        }
#endif
        for (int h = 0; h < R; h++) ml[2 * h] = -INFINITY, ml[2 * h + 1] = 0.0f;
        memset(acc, 0, sizeof acc);
        clock_t c0 = clock();
        for (int it = 0; it < ITERS; it++) {
            size_t p = ((unsigned)it * 2654435761u) % NP, nx = ((unsigned)(it + 1) * 2654435761u) % NP;
            pair_step(ops, s, ml, acc, q, pool + p * stride, pool + nx * stride, kb, vb, 16384, nb);
        }
        double ns = 1e9 * (double)(clock() - c0) / CLOCKS_PER_SEC / ITERS;
        printf("round %d in place %-8s %7.1f cpu ns/page pair (%.2f GB/s of pages)\n", round, nm[3], ns,
               (double)(kb + vb) / ns);
    }
    uint8_t *pair = xmalloc(kb + vb); /* the first slot's pages, side by side as in the engine's slots */
    memcpy(pair, pool, kb);
    memcpy(pair + kb, pool + 16384, vb);
    bench_walks(ops, pair, kb, vb, q, nb);
    free(pair);
    free(pool);
    return 0;
}

#if defined(__x86_64__)
/* test_kernels --bench-f16: CPU ns per token of the fp16 kernels (D 64, 3
 * query heads), q.k and p.v apart, AVX2 and (where present) AVX-512, hot in
 * L1/L2, for block lengths from a short window to a whole fp16 page run.
 * Ratios within one run; not a test. */
static int bench_f16(void) {
    enum { D = 64, R = 3, NMAX = 1024 };
    const kkv_ops *o = kkv_ops_get(KKV_KERNEL_AVX512);
    if (!kkv_ops_get(KKV_KERNEL_AVX2)) {
        printf("no AVX2 on this CPU\n");
        return 0;
    }
    static uint16_t kv[NMAX * D];
    static float q[R * D], s[R * NMAX], acc[R * D];
    tu_rng r = tu_rng_make(6);
    rand_f16(&r, kv, NMAX * D, D, 1.0f);
    rand_f32(&r, q, R * D);
    for (int i = 0; i < R * NMAX; i++) s[i] = 0.001f * (float)(i % 13);
    printf("fp16 kernels, D %d, %d heads: cpu ns per token\n%6s %9s %9s %9s %9s %9s %9s\n", D, R, "n",
           "avx2 qk", "avx2 pv", "avx2", "512 qk", "512 pv", "512");
    static const int ns[] = {5, 16, 64, 128, 1024};
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < NELEM(ns); i++) {
            int n = ns[i], iters = 4000000 / n;
            double t[4] = {0, 0, 0, 0};
            for (int k = 0; k < (o ? 4 : 2); k++) {
                clock_t c0 = clock();
                for (int it = 0; it < iters; it++) {
                    if (k == 0) kkv_avx2_qk_f16(s, q, R, kv, n, D, NULL);
                    else if (k == 1) kkv_avx2_pv_f16(acc, s, R, kv, n, D, NULL);
                    else if (k == 2) o->qk_f16(s, q, R, kv, n, D, NULL);
                    else o->pv_f16(acc, s, R, kv, n, D, NULL);
                }
                t[k] = 1e9 * (double)(clock() - c0) / CLOCKS_PER_SEC / iters / n;
            }
            if (o) printf("%6d %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", n, t[0], t[1], t[0] + t[1], t[2], t[3], t[2] + t[3]);
            else printf("%6d %9.2f %9.2f %9.2f %9s %9s %9s\n", n, t[0], t[1], t[0] + t[1], "-", "-", "-");
        }
    return 0;
}
#endif

static void test_dispatch(void) {
    const kkv_cpu *cpu = kkv_cpu_get();
    kkv_kernel best = kkv_kernel_best();
    kkv_kernel want = cpu->avx512 ? KKV_KERNEL_AVX512
                      : cpu->avx2 ? KKV_KERNEL_AVX2
                      : cpu->neon ? KKV_KERNEL_NEON
                                  : KKV_KERNEL_SCALAR;
    CHECK(best == want, "best kernel %s, expected %s", kkv_kernel_name(best), kkv_kernel_name(want));
    CHECK((kkv_ops_get(KKV_KERNEL_AVX2) != NULL) == (cpu->avx2 != 0), "avx2 table vs cpu");
    CHECK((kkv_ops_get(KKV_KERNEL_AVX512) != NULL) == (cpu->avx512 != 0), "avx512 table vs cpu");
    CHECK((kkv_ops_get(KKV_KERNEL_NEON) != NULL) == (cpu->neon != 0), "neon table vs cpu");
#if defined(__aarch64__)
    CHECK(!cpu->neon == (getenv("KKV_CPU") && strcmp(getenv("KKV_CPU"), "scalar") == 0),
          "aarch64: neon unless KKV_CPU=scalar");
    printf("cpu: neon %d\n", cpu->neon);
#endif
#if defined(__x86_64__)
    if (cpu->avx512)
        CHECK(kkv_ops_get(KKV_KERNEL_AVX512)->qk_page == (cpu->vbmi   ? kkv_vbmi512_qk_byte
                                                           : cpu->vnni ? kkv_vnni512_qk_page
                                                                       : kkv_avx2_qk_byte),
              "avx512 table: VBMI / VNNI page kernels exactly where the CPU has them");
    if (cpu->avx2)
        CHECK(kkv_ops_get(KKV_KERNEL_AVX2)->qk_page == kkv_avx2_qk_byte, "avx2 table: the 8-bit key kernel");
    if (cpu->avx2)
        CHECK(kkv_ops_get(KKV_KERNEL_AVX2)->pv_page == (cpu->avxvnni ? kkv_avxvnni_pv_page : kkv_avx2i_pv_page),
              "avx2 table: AVX-VNNI page kernels exactly where the CPU has AVX-VNNI");
    printf("cpu: avx2 %d, avx-vnni %d, avx512 %d, avx512-vnni %d, avx512-vbmi %d\n", cpu->avx2, cpu->avxvnni,
           cpu->avx512, cpu->vnni, cpu->vbmi);
#endif
    CHECK(kkv_ops_get(KKV_KERNEL_AUTO) == kkv_ops_get(best), "auto is best");
    kkv_cache *c = make_cache("kitty", 1, 64, 1);
    CHECK(c && kkv_cache_get_kernel(c) == best, "a new cache uses the best kernel");
    if (c) {
        CHECK((kkv_cache_set_kernel(c, KKV_KERNEL_AVX2) == KKV_OK) == (cpu->avx2 != 0), "set avx2");
        CHECK((kkv_cache_set_kernel(c, KKV_KERNEL_AVX512) == KKV_OK) == (cpu->avx512 != 0), "set avx512");
        CHECK((kkv_cache_set_kernel(c, KKV_KERNEL_NEON) == KKV_OK) == (cpu->neon != 0), "set neon");
        CHECK(kkv_cache_set_kernel(c, KKV_KERNEL_SCALAR) == KKV_OK &&
                  kkv_cache_get_kernel(c) == KKV_KERNEL_SCALAR, "set scalar");
    }
    kkv_cache_free(c);
    const char *cap = getenv("KKV_CPU");
    if (cap && strcmp(cap, "scalar") == 0) CHECK(best == KKV_KERNEL_SCALAR, "KKV_CPU=scalar caps dispatch");
    if (cap && strcmp(cap, "avx2") == 0)
        CHECK(best != KKV_KERNEL_AVX512 && !cpu->vnni && !cpu->avxvnni, "KKV_CPU=avx2 caps dispatch");
    if (cap && strcmp(cap, "avx512") == 0) CHECK(!cpu->vnni && !cpu->vbmi, "KKV_CPU=avx512 leaves VNNI out");
    if (cap && strcmp(cap, "avx512vnni") == 0) CHECK(!cpu->vbmi, "KKV_CPU=avx512vnni leaves VBMI out");
}

/* Scores s [R][n] of queries q [R][D] against decoded keys k [n][D], and
 * outputs acc [R][D] = acc0 + p [R][n] x decoded values v [n][D] (acc0 NULL:
 * from 0), against double sums, each to TOL_PRIM of its magnitude. */
static void check_qk_ref(const char *what, int D, const float *s, const float *q, const float *k,
                         int R, int n, cmp_stats *st) {
    for (int rr = 0; rr < R; rr++)
        for (int t = 0; t < n; t++) {
            double ref = 0, mag = 0;
            for (int j = 0; j < D; j++) {
                double term = (double)q[rr * D + j] * k[(size_t)t * D + j];
                ref += term, mag += fabs(term);
            }
            CHECK(close_to(s[rr * n + t], (float)ref, mag, st), "%s D %d n %d n_rep %d: %g vs %g",
                  what, D, n, R, s[rr * n + t], ref);
        }
}

static void check_pv_ref(const char *what, int D, const float *acc, const float *acc0,
                         const float *p, const float *v, int R, int n, cmp_stats *st) {
    for (int rr = 0; rr < R; rr++)
        for (int j = 0; j < D; j++) {
            double ref = acc0 ? acc0[rr * D + j] : 0.0, mag = fabs(ref);
            for (int t = 0; t < n; t++) {
                double term = (double)p[rr * n + t] * v[(size_t)t * D + j];
                ref += term, mag += fabs(term);
            }
            CHECK(close_to(acc[rr * D + j], (float)ref, mag, st), "%s D %d n %d n_rep %d: %g vs %g",
                  what, D, n, R, acc[rr * D + j], ref);
        }
}

/* 8-bit pages (attn_page8.c, one implementation for every table): the codec
 * reconstructs each element to half a step of its stored parameters (plus
 * what the fp16 rounding of min and scale moves the ends of the range by,
 * which clamps), and the kernels equal double sums over the decoded page to
 * TOL_PRIM of the magnitude (they only reorder nothing: each output is one
 * fp32 sum in a fixed order). */
static void test_page8(tu_rng *r) {
    cmp_stats st = {0};
    double worst_code = 0.0;
    for (int di = 0; di < NELEM(Ds); di++)
        for (int gi = 0; gi < NELEM(Gs); gi++) {
            int D = Ds[di], G = Gs[gi];
            uint16_t *x16 = xmalloc((size_t)G * D * sizeof *x16); /* [G][D] */
            float *x = xmalloc((size_t)G * D * sizeof *x), *dec = xmalloc((size_t)G * D * sizeof *dec);
            uint8_t *kp = xmalloc(kkv_key8_page_bytes(D, G));
            uint8_t *vp = xmalloc(kkv_value_page_bytes(D, G, 8));
            rand_f16(r, x16, G * D, D, 1.0f + (float)di);
            for (int i = 0; i < G * D; i++) x[i] = kkv_f16_to_f32(x16[i]);
            float *vdec = xmalloc((size_t)G * D * sizeof *vdec);
            CHECK(kkv_key8_page_encode(kp, x, D, G) == KKV_OK, "key8 encode: %s", kkv_last_error());
            CHECK(kkv_key8_page_decode(dec, kp, D, G) == KKV_OK, "key8 decode");
            CHECK(kkv_value_page_encode(vp, x, D, G, 8) == KKV_OK, "value8 encode");
            CHECK(kkv_value_page_decode(vdec, vp, D, G, 8) == KKV_OK, "value8 decode");
            kkv_key8_layout kl = kkv_key8_layout_of(D, G);
            kkv_value_layout vl = kkv_value_layout_of(D, G, 8);
            for (int pass = 0; pass < 2; pass++) { /* keys per channel, values per token */
                int groups = pass ? G : D, len = pass ? D : G;
                const uint8_t *pg = pass ? vp : kp;
                size_t so = pass ? vl.scale : kl.scale, mo = pass ? vl.mn : kl.mn;
                for (int g = 0; g < groups; g++) {
                    double mn = INFINITY, mx = -INFINITY;
                    for (int i = 0; i < len; i++) {
                        double v = pass ? x[(size_t)g * D + i] : x[(size_t)i * D + g];
                        mn = fmin(mn, v), mx = fmax(mx, v);
                    }
                    double sc = kkv_f16_to_f32(kkv_ld16(pg + so + 2 * (size_t)g));
                    double m16 = kkv_f16_to_f32(kkv_ld16(pg + mo + 2 * (size_t)g));
                    double bound = 0.5 * sc + fabs(m16 - mn) + fabs(m16 + 255.0 * sc - mx) +
                                   1e-6 * (fabs(mn) + fabs(mx));
                    for (int i = 0; i < len; i++) {
                        size_t at = pass ? (size_t)g * D + i : (size_t)i * D + g;
                        double e = fabs((double)(pass ? vdec : dec)[at] - x[at]);
                        worst_code = fmax(worst_code, bound > 0 ? e / bound : e);
                        CHECK(e <= bound, "8-bit %s D %d G %d: element off by %g > %g",
                              pass ? "value" : "key", D, G, e, bound);
                    }
                }
            }
            for (int ri = 0; ri < NELEM(REPS); ri++) {
                int R = REPS[ri];
                float *q = xmalloc((size_t)R * D * sizeof *q), *sc = xmalloc((size_t)R * G * sizeof *sc);
                float *p = xmalloc((size_t)R * G * sizeof *p), *acc = xmalloc((size_t)R * D * sizeof *acc);
                float *acc0 = xmalloc((size_t)R * D * sizeof *acc0);
                rand_f32(r, q, R * D);
                for (int i = 0; i < R * G; i++) p[i] = fabsf(tu_normal(r));
                for (int i = 0; i < R * D; i++) acc[i] = acc0[i] = (float)i * 0.01f; /* accumulates */
                kkv_qk_page8(sc, q, R, kp, D, G);
                kkv_pv_page8(acc, p, R, vp, D, G);
                check_qk_ref("qk_page8", D, sc, q, dec, R, G, &st);
                check_pv_ref("pv_page8", D, acc, acc0, p, vdec, R, G, &st);
                free(q), free(sc), free(p), free(acc), free(acc0);
            }
            free(x16), free(x), free(dec), free(vdec), free(kp), free(vp);
        }
    /* int8 sink rows: codes within half a step of the fp16-rounded input (or
     * clamped at 127 steps where the fp16 scale rounded down), kernels equal
     * double sums over the decoded rows */
    for (int di = 0; di < NELEM(Ds); di++) {
        int D = Ds[di], n = 37;
        size_t rb = (size_t)D + 2;
        uint16_t *x16 = xmalloc((size_t)n * D * sizeof *x16);
        float *x = xmalloc((size_t)n * D * sizeof *x), *dec = xmalloc((size_t)n * D * sizeof *dec);
        uint8_t *rows = xmalloc((size_t)n * rb);
        rand_f16(r, x16, n * D, D, 1.0f + (float)di);
        for (int i = 0; i < n * D; i++) x[i] = kkv_f16_to_f32(x16[i]);
        for (int j = 0; j < D; j++) x[j] = 0.0f; /* an all-zero row: scale 0, codes 0 */
        for (int t = 0; t < n; t++) {
            kkv_row8_encode(rows + t * rb, x + (size_t)t * D, D);
            kkv_row8_decode(dec + (size_t)t * D, rows + t * rb, D);
            double amax = 0.0, sc = kkv_f16_to_f32(kkv_ld16(rows + t * rb + D));
            for (int j = 0; j < D; j++) amax = fmax(amax, fabs(x[(size_t)t * D + j]));
            double bound = 0.5 * sc + fmax(0.0, amax - 127.0 * sc) + 1e-6 * amax;
            for (int j = 0; j < D; j++) {
                double e = fabs((double)dec[(size_t)t * D + j] - x[(size_t)t * D + j]);
                worst_code = fmax(worst_code, bound > 0 ? e / bound : e);
                CHECK(e <= bound, "int8 row D %d t %d: element off by %g > %g", D, t, e, bound);
            }
        }
        for (int ri = 0; ri < NELEM(REPS); ri++) {
            int R = REPS[ri];
            float *q = xmalloc((size_t)R * D * sizeof *q), *sc = xmalloc((size_t)R * n * sizeof *sc);
            float *p = xmalloc((size_t)R * n * sizeof *p), *acc = xmalloc((size_t)R * D * sizeof *acc);
            rand_f32(r, q, R * D);
            for (int i = 0; i < R * n; i++) p[i] = fabsf(tu_normal(r));
            memset(acc, 0, (size_t)R * D * sizeof *acc);
            kkv_qk_rows8(sc, q, R, rows, n, D);
            kkv_pv_rows8(acc, p, R, rows, n, D);
            check_qk_ref("qk_rows8", D, sc, q, dec, R, n, &st);
            check_pv_ref("pv_rows8", D, acc, NULL, p, dec, R, n, &st);
            free(q), free(sc), free(p), free(acc);
        }
        free(x16), free(x), free(dec), free(rows);
    }
    CHECK(kkv_key8_page_encode(NULL, NULL, 64, 128) == KKV_ERR_INVALID_ARG, "key8: NULL accepted");
    CHECK(kkv_key8_page_bytes(64, 128) == 64 * 128 + 4 * 64, "key8: page bytes");
    CHECK(kkv_value_page_bytes(64, 128, 8) == 64 * 128 + 4 * 128, "value8: page bytes");
    CHECK(kkv_value_page_bytes(64, 128, 6) == 0, "value page of 6 bits has a size");
    printf("kernel page8 / int8 rows: worst error %.3g of magnitude (tolerance %g), codec %.3g of its bound\n",
           st.worst, TOL_PRIM, worst_code);
}

#if defined(__x86_64__)
/* test_kernels --score-error: RMS and worst error of the AVX2 key kernels'
 * scores (16-bit query, 8-bit query, the int8 channel-group kernel) against
 * the scalar kernel, beside the 2-bit keys' own quantization error (scalar
 * scores against q . k on the unquantized keys), over 2000 random pages
 * (D 64, G 128, 3 heads; every 7th key channel 8x, every 11th query channel
 * 4x), n_boost 0, 16 and 32. Numbers for docs/RESULTS.md; not a test. */
static int score_error(void) {
    enum { D = 64, G = 128, R = 3, NPG = 2000 };
    if (!kkv_cpu_get()->avx2) {
        printf("--score-error: this CPU has no AVX2\n");
        return 1;
    }
    static float x[G * D], q[R * D], s0[R * G], s1[3][R * G];
    static uint8_t page[8192];
    const qk_page_fn fn[3] = {kkv_avx2_qk_wide, kkv_avx2_qk_byte, kkv_avx2i_qk_page};
    tu_rng r = tu_rng_make(11);
    printf("n_boost  RMS score  key quantization  16-bit: RMS / worst  8-bit: RMS / worst  int8 groups: RMS / worst\n");
    for (int nb = 0; nb <= 32; nb += 16) {
        double e[3] = {0}, w[3] = {0}, ss = 0, qe = 0;
        for (int p = 0; p < NPG; p++) {
            for (int i = 0; i < G * D; i++) x[i] = tu_normal(&r) * ((i % D) % 7 == 3 ? 8.0f : 1.0f);
            for (int i = 0; i < R * D; i++) q[i] = tu_normal(&r) * ((i % D) % 11 == 5 ? 4.0f : 1.0f);
            kkv_key_page_encode(page, x, D, G, nb, KKV_SELECT_MAGNITUDE, 0, 0, NULL);
            kkv_ops_scalar.qk_page(s0, q, R, page, D, G, nb);
            for (int k = 0; k < 3; k++) fn[k](s1[k], q, R, page, D, G, nb);
            for (int i = 0; i < R * G; i++) {
                double ex = 0;
                for (int j = 0; j < D; j++) ex += (double)q[(i / G) * D + j] * x[(i % G) * D + j];
                qe += (s0[i] - ex) * (s0[i] - ex), ss += ex * ex;
                for (int k = 0; k < 3; k++) {
                    double d = (double)s1[k][i] - s0[i];
                    e[k] += d * d, w[k] = fmax(w[k], fabs(d));
                }
            }
        }
        double n = (double)NPG * R * G;
        printf("%7d  %9.2f  %16.3f  %10.5f / %6.4f  %9.5f / %6.4f  %14.5f / %6.4f\n", nb, sqrt(ss / n), sqrt(qe / n),
               sqrt(e[0] / n), w[0], sqrt(e[1] / n), w[1], sqrt(e[2] / n), w[2]);
    }
    return 0;
}
#endif

#if defined(__aarch64__)
/* kkv_exp_soft4 (core/exp_poly_neon.h) gives the scalar kkv_exp_soft's bits
 * on the softmax's domain and above it to 88: every float of [-88, -86]
 * (the clamp at -87.3, n = -126) and of [-0.36, -0.34] (where n turns from
 * -1 to 0 at -ln2 / 2), and a walk over [-90, 88] in steps of 0.0007. */
static void test_exp_neon(void) {
    static const float ranges[3][3] = {{-88.0f, -86.0f, 0.0f}, {-0.36f, -0.34f, 0.0f}, {-90.0f, 88.0f, 0.0007f}};
    long n_cmp = 0, bad = 0;
    for (int ri = 0; ri < 3; ri++) {
        float x4[4];
        int k = 0;
        for (float x = ranges[ri][0]; x <= ranges[ri][1];
             x = ranges[ri][2] > 0 ? x + ranges[ri][2] : nextafterf(x, INFINITY)) {
            x4[k++] = x;
            if (k < 4) continue;
            float y4[4];
            vst1q_f32(y4, kkv_exp_soft4(vld1q_f32(x4)));
            for (int i = 0; i < 4; i++) {
                float want = kkv_exp_soft(x4[i]);
                bad += memcmp(&want, &y4[i], sizeof want) != 0;
            }
            n_cmp += 4, k = 0;
        }
    }
    CHECK(!bad, "kkv_exp_soft4: %ld of %ld values differ from kkv_exp_soft", bad, n_cmp);
    printf("kernel neon exp: %ld values, the scalar kkv_exp_soft's bits\n", n_cmp);
}
#endif

int main(int argc, char **argv) {
#if defined(__x86_64__)
    if (argc > 1 && strcmp(argv[1], "--bench-plan") == 0) return bench_plan();
    if (argc > 1 && strcmp(argv[1], "--bench-f16") == 0) return bench_f16();
    if (argc > 1 && strcmp(argv[1], "--score-error") == 0) return score_error();
#endif
    if (argc > 1 && strcmp(argv[1], "--bench-pages") == 0) return bench_pages(argc > 2 ? atoi(argv[2]) : 8);
    quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    if (quick) setvbuf(stdout, NULL, _IOLBF, 0); /* each line as it comes, under an emulator */
    test_dispatch();
    if (!quick) {
        tu_rng r8 = tu_rng_make(808);
        test_page8(&r8);
    }
    const kkv_cpu *cpu = kkv_cpu_get();
    static const kkv_kernel kinds[4] = {KKV_KERNEL_SCALAR, KKV_KERNEL_AVX2, KKV_KERNEL_AVX512, KKV_KERNEL_NEON};
    const kkv_ops *tables[4];
    for (int i = 0; i < 4; i++) tables[i] = kkv_ops_get(kinds[i]);
    for (int i = 0; i < 4; i++) {
        if (!tables[i]) {
            printf("kernel %s: not on this CPU, skipped\n", kkv_kernel_name(kinds[i]));
            continue;
        }
        if (quick && kinds[i] == KKV_KERNEL_SCALAR) continue; /* the reference itself */
        tu_rng r = tu_rng_make(1000 + (uint64_t)i);
        cmp_stats st = {0};
        const char *nm = kkv_kernel_name(tables[i]->kind);
        test_qk_f16(tables[i], &r, &st);
        quick_done(nm, "qk_f16");
        test_pv_f16(tables[i], &r, &st);
        quick_done(nm, "pv_f16");
        int is_int = kinds[i] == KKV_KERNEL_AVX2 || kinds[i] == KKV_KERNEL_AVX512 || kinds[i] == KKV_KERNEL_NEON;
#if defined(__x86_64__)
        int qk_bound = tables[i]->qk_page == kkv_vbmi512_qk_wide ? 2
                       : tables[i]->qk_page == kkv_avx2_qk_wide  ? 3
                       : tables[i]->qk_page == kkv_avx2_qk_byte  ? 4
                       : tables[i]->qk_page == kkv_vbmi512_qk_byte ? 5
                                                                 : is_int; /* its own step */
#else
        int qk_bound = kinds[i] == KKV_KERNEL_NEON ? 4 : is_int; /* attn_int_neon.c: the AVX2 8-bit kernel's steps */
#endif
        test_qk_page(nm, tables[i]->qk_page, qk_bound, &r, &st);
        quick_done(nm, "qk_page");
        test_pv_page(nm, tables[i]->pv_page, is_int, &r, &st);
        quick_done(nm, "pv_page");
        test_softmax(tables[i], &r, &st);
        test_softmax_held(tables[i], &r);
        quick_done(nm, "softmax");
        test_encode(tables[i], &r);
        printf("kernel %s: worst primitive error %.3g of magnitude (tolerance %g)\n",
               kkv_kernel_name(tables[i]->kind), st.worst, TOL_PRIM);
    }
#if defined(__x86_64__)
    if (cpu->avx2) { /* the float page kernels the integer ones fall back to */
        tu_rng r = tu_rng_make(77);
        cmp_stats st = {0};
        test_qk_page("avx2-float", kkv_avx2_qk_page, 0, &r, &st);
        test_pv_page("avx2-float", kkv_avx2_pv_page, 0, &r, &st);
        printf("kernel avx2 float page fallback: worst error %.3g of magnitude (tolerance %g)\n", st.worst, TOL_PRIM);
        tu_rng rf = tu_rng_make(78);
        test_fallback_exact("avx2-int", kkv_avx2i_qk_page, kkv_avx2i_pv_page, kkv_avx2_qk_page, kkv_avx2_pv_page, &rf);
        test_fallback_exact("avx2-wide", kkv_avx2_qk_wide, kkv_avx2i_pv_page, kkv_avx2_qk_page, kkv_avx2_pv_page, &rf);
        test_fallback_exact("avx2-byte", kkv_avx2_qk_byte, kkv_avx2i_pv_page, kkv_avx2_qk_page, kkv_avx2_pv_page, &rf);
        test_byte_blocks("avx2", kkv_avx2_qk_byte, &rf);
        test_qk_page("avx2-wide", kkv_avx2_qk_wide, 3, &r, &st); /* every n_boost; the table sends it n_boost > D / 2 */
    }
    if (cpu->avx2) {
        tu_rng r = tu_rng_make(93);
        test_plan_exact("avx2-int", kkv_avx2i_qk_page, kkv_avx2i_qk_plan_bytes, kkv_avx2i_qk_plan, kkv_avx2i_qk_page_plan, &r);
    }
    if (cpu->vnni) {
        tu_rng r = tu_rng_make(94);
        test_plan_exact("avx512-vnni", kkv_vnni512_qk_page, kkv_vnni512_qk_plan_bytes, kkv_vnni512_qk_plan, kkv_vnni512_qk_page_plan, &r);
    }
    if (cpu->vnni) {
        tu_rng r = tu_rng_make(91);
        test_vnni_exact("avx512-vnni", kkv_vnni512_qk_page, kkv_vnni512_pv_page, &r);
        test_fallback_exact("avx512-vnni", kkv_vnni512_qk_page, kkv_vnni512_pv_page, kkv_avx2_qk_page, kkv_avx2_pv_page, &r);
    } else {
        printf("kernel avx512-vnni: not on this CPU (or capped by KKV_CPU), skipped\n");
    }
    if (cpu->avx512) {
        tu_rng r = tu_rng_make(96);
        test_softmax512_exact(&r);
        test_f16_512_exact(&r);
    }
    if (cpu->vbmi) {
        tu_rng r = tu_rng_make(97);
        cmp_stats st = {0};
        worst_int_ratio = 0;
        test_qk_page("avx512-vbmi-wide", kkv_vbmi512_qk_wide, 2, &r, &st);
        printf("kernel avx512-vbmi wide qk_page: worst error %.3f of its bound\n", worst_int_ratio);
        test_vbmi_byte_exact(&r);
    }
    if (cpu->vbmi) {
        tu_rng r = tu_rng_make(95);
        test_vnni_exact("avx512-vbmi", NULL, kkv_vbmi512_pv_page, &r);
        test_fallback_exact("avx512-vbmi", kkv_vbmi512_qk_wide, kkv_vbmi512_pv_page, kkv_avx2_qk_page, kkv_avx2_pv_page, &r);
        test_fallback_exact("avx512-vbmi-byte", kkv_vbmi512_qk_byte, kkv_vbmi512_pv_page, kkv_avx2_qk_page, kkv_avx2_pv_page, &r);
    } else {
        printf("kernel avx512-vbmi: not on this CPU (or capped by KKV_CPU), skipped\n");
    }
    if (cpu->avxvnni) {
        tu_rng r = tu_rng_make(92);
        cmp_stats st = {0};
        test_vnni_exact("avx-vnni", kkv_avxvnni_qk_page, kkv_avxvnni_pv_page, &r);
        test_fallback_exact("avx-vnni", kkv_avxvnni_qk_page, kkv_avxvnni_pv_page, kkv_avx2_qk_page, kkv_avx2_pv_page, &r);
        test_qk_page("avx-vnni", kkv_avxvnni_qk_page, 1, &r, &st);
        test_pv_page("avx-vnni", kkv_avxvnni_pv_page, 1, &r, &st);
    } else {
        printf("kernel avx-vnni: not on this CPU (or capped by KKV_CPU), skipped\n");
    }
#endif
    printf("integer page kernels: worst error %.3g of the derived bound (must be <= 1)\n", worst_int_ratio);
#if defined(__x86_64__)
    if (cpu->avx2) test_page_hash("avx2", kkv_ops_get(KKV_KERNEL_AVX2));
#endif
#if defined(__aarch64__)
    if (cpu->neon) {
        test_exp_neon();
        test_page_hash("neon", &kkv_ops_neon);
        tu_rng rf = tu_rng_make(79);
        test_fallback_exact("neon", kkv_neon_qk_page, kkv_neon_pv_page, kkv_neon_qk_page_f32, kkv_neon_pv_page_f32, &rf);
        test_byte_blocks("neon", kkv_neon_qk_page, &rf); /* one int16 segment, and several */
    }
#endif
    double worst_ref = 0, worst_k = 0;
    kkv_kernel fast = cpu->avx2 ? KKV_KERNEL_AVX2 : cpu->neon ? KKV_KERNEL_NEON : KKV_KERNEL_SCALAR;
    test_end_to_end(fast, &worst_ref, &worst_k);
    printf("end to end: worst error vs double reference %.3g (tol %g), %s vs scalar %.3g (tol %g, %g on AVX2 and NEON quantized pages)\n",
           worst_ref, TOL_REF, kkv_kernel_name(fast), worst_k, TOL_PRIM, TOL_E2E_INT);
    return tu_summary();
}
