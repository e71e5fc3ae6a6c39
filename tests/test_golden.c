/* Byte-for-byte regression against the cache layout before staging on demand
 * (issue 13): for several methods and odd shapes, a fixed stream of keys and
 * values goes through append -> attend -> flush; the attention outputs, every
 * key page and the read-back K/V are hashed (FNV-1a 64 over their bytes) and
 * compared with hashes recorded from the previous layout (commit c5d8199,
 * scalar kernels and the best kernel, 1 and 3 threads). Any change to the
 * pages' bytes or to what attention computes changes a hash. The AVX2 output
 * hashes were re-recorded for the integer-domain page kernels (issue 15:
 * src/kernels/attn_int_avx2.c changes what the AVX2 table computes, within
 * the bounds of kernels.h; the scalar hashes, pages and read-back are the
 * previous layout's). kitty-plus and kitty-plus-pro were recorded when they
 * were added (issue 10), from this same code; kitty-plus-pro again when its
 * definition changed (pooled budget, window 96). Every AVX2 output hash was
 * re-recorded when the SIMD softmax took the fused argument fmsub(s, inv, m),
 * two sum chains and a degree-6 exponential (issue 15; the scalar ones stay),
 * and again when the AVX2 table's key kernel became the 16-bit one of
 * src/kernels/attn_qkwide_avx2.c (one query step per page and head instead
 * of int8 channel groups; the value kernel's bits did not change), and
 * again when pages with n_boost <= D / 2 (every case here but the 4-bit
 * and 8-bit keys) went to the 8-bit key kernel of
 * src/kernels/attn_qkbyte_avx2.c (one int8 query step per page and head),
 * and again when the SIMD softmaxes took their own exponential
 * (kkv_exp_soft of src/core/exp_poly.h: a fused rounding and a degree-5
 * minimax polynomial). On aarch64 the NEON table's outputs are checked
 * against the same AVX2 hashes: its fp16 kernels, softmax and integer page
 * kernels take the AVX2 ones' operations lane for lane.
 * KKV_GOLDEN_PRINT=1 prints the table instead of checking it. */
#include <stdlib.h>
#include <string.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "core/cpu.h"
#include "testutil.h"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

typedef struct gcase {
    const char *name; /* named method, then overrides (0 = keep) */
    int sink, group, window, D, L, H, n_q, T;
    uint64_t out_hash, page_hash, read_hash; /* scalar kernel */
    uint64_t out_avx2;                       /* AVX2 kernel's outputs */
} gcase;

static gcase cases[] = {
    {"fp16", 0, 0, 0, 64, 2, 2, 4, 300,
     0x442c09f31eb0c0ffull, 0x486f56dac9fba0e8ull, 0x6c645b6731bcb762ull, 0xb8729c07e870182bull},
    {"kivi-k2v2", 0, 0, 0, 64, 2, 2, 4, 400,
     0x78a035f2e49da522ull, 0xaf32973cb18c740dull, 0xd7f394bdf7337678ull, 0x00d65521f2fa6d93ull},
    {"kivi-k4v4", 0, 0, 0, 20, 2, 1, 3, 333,
     0xea30944990c66f68ull, 0x22ec02ab20ed3dcdull, 0x0896cd572ef5e337ull, 0x7a72b96da42a4c3aull},
    {"kivi-k2v4s", 0, 0, 0, 36, 1, 2, 2, 290,
     0x939633e10b83efe0ull, 0x12f521d6c8b8e46bull, 0x52e2a7e670a12866ull, 0xd6beded042518c95ull},
    {"kitty", 0, 0, 0, 64, 2, 2, 6, 420,
     0x4509366db0972355ull, 0x40c581adb83f7322ull, 0x8897e31416de6474ull, 0x78fec6a294cfdb3cull},
    {"kitty-pro", 0, 16, 24, 28, 3, 1, 2, 211,
     0x242832acff5ba4c7ull, 0x9a9c4ad35fd33424ull, 0x9d4ff4f39ad61197ull, 0x7969f06763e9dd8cull},
    {"kitty", 5, 8, 3, 12, 2, 3, 3, 97,
     0x6f19bcd18a2ad2d8ull, 0xa828c314bfa1589full, 0x07c12d81156e191cull, 0xbca31feb8a19f3ccull},
    {"kitty", 33, 12, 40, 16, 1, 1, 1, 250,
     0xa97ec7bee42c6ed3ull, 0x6149d02739c592cfull, 0x13b032b8056ac0afull, 0x5eeb8ff994c86e31ull},
    /* beyond the paper (docs/FORMAT.md section 5), recorded when they were added */
    {"kitty-plus", 0, 0, 0, 64, 2, 2, 6, 420,
     0x8fc2806274eb480bull, 0x4ca435d3406e1846ull, 0xcd8f4fc2648d547eull, 0xcde27461f15a1405ull},
    /* re-recorded when kitty-plus-pro became a pooled budget (issue 10,
     * points 1.3/1.4), with 3 KV heads so that the pool has heads to share */
    {"kitty-plus-pro", 0, 16, 24, 32, 2, 3, 6, 300,
     0xe66ff6aa4d53df52ull, 0xe3b483101bd9e022ull, 0x8d7b27f463cae154ull, 0xac1baf2c207a8621ull},
    /* 8-bit pages (issue 10, the q8_0 point of the frontier), recorded when
     * added; the second with a sink, an odd page size and a window */
    {"kivi-k8v8", 0, 0, 0, 64, 2, 2, 4, 300,
     0x2cb5515dbc2bbc64ull, 0x320548a085d3782cull, 0x51ae10bc8ea14a8cull, 0xaab4a05f5113294full},
    {"kivi-k8v8", 5, 12, 3, 20, 1, 3, 3, 101,
     0xe102198ddfe1cfa5ull, 0x3c7bdf41420374b7ull, 0x504040182eb37e32ull, 0xbb4d43da7c2760e0ull},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

/* Runs a case; returns the three hashes. */
static void run_case(const gcase *g, kkv_kernel kern, int threads, uint64_t h[3]) {
    kkv_method m;
    kkv_method_from_name(&m, g->name);
    if (g->sink) m.sink = g->sink;
    if (g->group) m.group = g->group;
    if (g->window) m.window = g->window;
    kkv_cache_config cfg = {.n_layers = g->L, .n_kv_heads = g->H, .head_dim = g->D,
                            .pool_bytes = 256u << 20, .n_threads = threads, .method = m};
    kkv_cache *c = NULL;
    h[0] = h[1] = h[2] = 0xcbf29ce484222325ull;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_OK, "create %s: %s", g->name, kkv_last_error());
    if (!c) return;
    CHECK(kkv_cache_set_kernel(c, kern) == KKV_OK, "kernel");
    int seq;
    kkv_seq_add(c, &seq);
    size_t HD = (size_t)g->H * g->D;
    float *k = malloc(HD * sizeof *k), *v = malloc(HD * sizeof *v); /* [H][D] */
    float *q = malloc((size_t)g->n_q * g->D * sizeof *q);             /* [n_q][D] */
    float *o = malloc((size_t)g->n_q * g->D * sizeof *o);             /* [n_q][D] */
    tu_rng r = tu_rng_make(1234);
    for (int t = 0; t < g->T; t++) {
        for (int l = 0; l < g->L; l++) {
            for (size_t i = 0; i < HD; i++) {
                k[i] = tu_normal(&r) * (1.0f + (float)(i % 7));
                v[i] = tu_normal(&r);
            }
            for (int i = 0; i < g->n_q * g->D; i++) q[i] = tu_normal(&r);
            CHECK(kkv_append(c, seq, l, k, v) == KKV_OK, "append");
            CHECK(kkv_attend(c, o, seq, l, q, g->n_q) == KKV_OK, "attend");
            h[0] = fnv(h[0], o, (size_t)g->n_q * g->D * sizeof *o);
            CHECK(kkv_flush(c, seq, l) == KKV_OK, "flush");
        }
    }
    kkv_method_check(&m, g->D);
    /* a pooled budget gives each page its own n_boost: hash each page at its size */
    size_t kb = kkv_method_key_page_bytes(&m, g->D, g->D);
    uint8_t *pg = malloc(kb);
    float *rk = malloc((size_t)g->T * g->D * sizeof *rk), *rv = malloc((size_t)g->T * g->D * sizeof *rv);
    for (int l = 0; l < g->L; l++)
        for (int hh = 0; hh < g->H; hh++) {
            for (int p = 0; kkv_seq_key_page(c, pg, kb, seq, l, hh, p) == KKV_OK; p++)
                h[1] = fnv(h[1], pg, kkv_method_key_page_bytes(&m, g->D,
                                         kkv_seq_key_page_boost(c, seq, l, hh, p)));
            CHECK(kkv_seq_read(c, rk, rv, seq, l, hh) == KKV_OK, "read");
            h[2] = fnv(h[2], rk, (size_t)g->T * g->D * sizeof *rk);
            h[2] = fnv(h[2], rv, (size_t)g->T * g->D * sizeof *rv);
        }
    free(pg), free(rk), free(rv), free(k), free(v), free(q), free(o);
    kkv_cache_free(c);
}

int main(void) {
    int print = getenv("KKV_GOLDEN_PRINT") != NULL;
    for (int i = 0; i < N_CASES; i++) {
        gcase *g = &cases[i];
        uint64_t ref[3], h[3], a2[3] = {0, 0, 0};
        run_case(g, KKV_KERNEL_SCALAR, 1, ref);
        /* after the KKV_CPU cap; the NEON table computes the AVX2 table's
         * outputs (src/kernels/attn_neon.c, attn_int_neon.c), so on aarch64
         * it is held to the same hashes */
        int has_avx2_bytes = kkv_cpu_get()->avx2 || kkv_cpu_get()->neon;
        if (has_avx2_bytes) run_case(g, kkv_cpu_get()->avx2 ? KKV_KERNEL_AVX2 : KKV_KERNEL_NEON, 2, a2);
        if (print) {
            printf("    {\"%s\", %d, %d, %d, %d, %d, %d, %d, %d,\n     0x%016llxull, 0x%016llxull, "
                   "0x%016llxull, 0x%016llxull},\n", g->name, g->sink, g->group, g->window, g->D,
                   g->L, g->H, g->n_q, g->T, (unsigned long long)ref[0],
                   (unsigned long long)ref[1], (unsigned long long)ref[2],
                   (unsigned long long)a2[0]);
            continue;
        }
        if (has_avx2_bytes)
            CHECK(a2[0] == g->out_avx2 && a2[1] == ref[1], "case %d (%s): AVX2 (or NEON) outputs %016llx "
                  "differ from the previous layout's", i, g->name, (unsigned long long)a2[0]);
        CHECK(ref[0] == g->out_hash && ref[1] == g->page_hash && ref[2] == g->read_hash,
              "case %d (%s): hashes %016llx %016llx %016llx differ from the previous layout's",
              i, g->name, (unsigned long long)ref[0], (unsigned long long)ref[1],
              (unsigned long long)ref[2]);
        /* pages are kernel-independent; every kernel agrees with itself across threads */
        uint64_t h1[3];
        run_case(g, KKV_KERNEL_AUTO, 1, h1);
        run_case(g, KKV_KERNEL_AUTO, 3, h);
        CHECK(h1[1] == ref[1] && h[1] == ref[1], "case %d: best-kernel pages differ", i);
        CHECK(h1[0] == h[0] && h1[2] == h[2], "case %d: thread count changed the result", i);
        /* the best table (AVX-512, with VNNI page kernels where present) gives
         * exactly the AVX2 table's outputs: same float primitives, and integer
         * page kernels whose sums are exact in every variant. The exception is
         * a 2/4-bit key page with more than D / 2 boosted channels under VBMI,
         * whose key kernel rounds the query to 15 bits where AVX2's rounds it
         * to 16 (test_kernels holds each to its own bound): methods that boost
         * more than half the channels, or pool the budget over the heads. */
        kkv_method m;
        int wide_keys = kkv_method_parse(&m, g->name) == KKV_OK && !m.fp16 && m.key_bits != 8 &&
                        (m.alpha > 0.5f || m.budget != KKV_BUDGET_NONE) && kkv_cpu_get()->vbmi;
        if (has_avx2_bytes && !wide_keys)
            CHECK(h1[0] == a2[0], "case %d (%s): best-kernel outputs differ from AVX2's", i, g->name);
    }
    return print ? 0 : tu_summary();
}
