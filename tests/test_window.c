/* Sliding-window layers (kkv_cache_config.layer_window): a windowed layer's
 * attention equals plain softmax attention, in double, over its newest W
 * tokens as an unwindowed twin cache reads them back (pages do not depend on
 * the window, so the twin holds the same bits); what falls wholly before the
 * window is released (pages counted from kkv_seq_mem, pool bytes bounded
 * whatever the length); a reservation covers a long run with windows in a
 * pool too small for it without; fork, save/load continue bit-identically;
 * bad windows and a state of other windows are refused. Runs on the scalar
 * kernel, so the tolerance is test_attn.c's fp32 one (the traversal is what
 * is under test; the SIMD kernels are tests/test_kernels.c's). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "testutil.h"
#include "tu_ref_attend.h"

enum { L = 2, H = 2, NREP = 2 };

static kkv_cache *make(const char *spec, int D, const int *win, size_t pool) {
    kkv_method m;
    kkv_status s = kkv_method_parse(&m, spec);
    CHECK(s == KKV_OK, "%s: %s", spec, kkv_last_error());
    kkv_cache_config cfg = {.n_layers = L, .n_kv_heads = H, .head_dim = D, .pool_bytes = pool,
                            .method = m, .layer_window = win};
    kkv_cache *c = NULL;
    s = kkv_cache_create(&c, &cfg);
    CHECK(s == KKV_OK, "create %s: %s", spec, kkv_last_error());
    if (c) kkv_cache_set_kernel(c, KKV_KERNEL_SCALAR);
    return c;
}

/* One token's K, V [H][D] for step t: deterministic in (seed, t). */
static void token(float *k, float *v, int D, uint64_t seed, int t) {
    tu_rng r = tu_rng_make(seed * 1000003u + (uint64_t)t);
    for (int i = 0; i < H * D; i++) {
        k[i] = (i % D == 3 ? 6.0f : 1.0f) * tu_normal(&r);
        v[i] = tu_normal(&r);
    }
}

/* Appends token t to every layer of seq, attends each layer (out [L][H*NREP][D]),
 * flushes. */
static kkv_status step(kkv_cache *c, int seq, int D, uint64_t seed, int t, float *out,
                       const float *q) {
    float k[H * 256], v[H * 256];
    token(k, v, D, seed, t);
    kkv_status s = KKV_OK;
    for (int l = 0; l < L && s == KKV_OK; l++) {
        s = kkv_append(c, seq, l, k, v);
        if (s == KKV_OK) s = kkv_attend(c, out + (size_t)l * H * NREP * D, seq, l, q, H * NREP);
        if (s == KKV_OK) s = kkv_flush(c, seq, l);
    }
    return s;
}

/* Key pages held by (seq, layer 0; layer 1 is empty or global and counted
 * out): key_lo bytes / one page's, minus layer 1's pages. */
static int held_pages(const kkv_cache *c, int seq, int D, int G) {
    kkv_mem m;
    kkv_seq_mem(c, &m, seq);
    kkv_seq_info in;
    kkv_seq_get_info(c, &in, seq, 1);
    return (int)(m.key_lo / ((uint64_t)H * D * G / 4)) - in.key_pages;
}

/* Windowed layer 0 (window W) against the twin's read-back; layer 1 global
 * must equal the twin's layer 1 bit for bit. */
static void equality(const char *spec, int D, int G, int S, int W, int T, int every) {
    int win[L] = {W, 0};
    kkv_cache *a = make(spec, D, win, 64u << 20), *b = make(spec, D, NULL, 64u << 20);
    if (!a || !b) return;
    int sa, sb;
    kkv_seq_add(a, &sa);
    kkv_seq_add(b, &sb);
    size_t od = (size_t)L * H * NREP * D;
    float *oa = malloc(od * sizeof *oa), *ob = malloc(od * sizeof *ob); /* [L][H*NREP][D] */
    float *q = malloc((size_t)H * NREP * D * sizeof *q);                  /* [H*NREP][D] */
    float *rk = malloc((size_t)H * T * D * sizeof *rk); /* [H][T][D] the twin's layer 0 */
    float *rv = malloc((size_t)H * T * D * sizeof *rv);
    double ref[256], tol[256], worst = 0;
    int bad = 0, max_held = 0;
    tu_rng r = tu_rng_make(7);
    for (int t = 0; t < T && !bad; t++) {
        for (int i = 0; i < H * NREP * D; i++) q[i] = 0.5f * tu_normal(&r);
        /* append -> attend -> (read the twin as attention saw it) -> flush */
        float k[H * 256], v[H * 256];
        token(k, v, D, 1, t);
        kkv_status st = KKV_OK;
        for (int l = 0; l < L && st == KKV_OK; l++) {
            st = kkv_append(a, sa, l, k, v);
            if (st == KKV_OK) st = kkv_append(b, sb, l, k, v);
            if (st == KKV_OK) st = kkv_attend(a, oa + (size_t)l * H * NREP * D, sa, l, q, H * NREP);
            if (st == KKV_OK) st = kkv_attend(b, ob + (size_t)l * H * NREP * D, sb, l, q, H * NREP);
            if (st == KKV_OK && l == 0 && t % every == 0)
                for (int kh = 0; kh < H; kh++)
                    kkv_seq_read(b, rk + (size_t)kh * T * D, rv + (size_t)kh * T * D, sb, 0, kh);
            if (st == KKV_OK) st = kkv_flush(a, sa, l);
            if (st == KKV_OK) st = kkv_flush(b, sb, l);
        }
        CHECK(st == KKV_OK, "%s W %d t %d: %s", spec, W, t, kkv_last_error());
        if (st != KKV_OK) break;
        int n = t + 1, f = n > W ? n - W : 0;
        for (int kh = 0; kh < H && t % every == 0; kh++) {
            float *hk = rk + (size_t)kh * T * D, *hv = rv + (size_t)kh * T * D;
            for (int rr = 0; rr < NREP; rr++) {
                int h = kh * NREP + rr;
                tu_ref_attend(ref, tol, q + (size_t)h * D, hk + (size_t)f * D, hv + (size_t)f * D,
                          n - f, D);
                for (int j = 0; j < D; j++) {
                    double e = fabs(oa[(size_t)h * D + j] - ref[j]);
                    worst = fmax(worst, e / tol[j]);
                    if (!(e <= tol[j]) && !bad++)
                        CHECK(0, "%s W %d n %d head %d ch %d: %.9g vs %.9g (tol %.3g)", spec, W,
                              n, h, j, (double)oa[(size_t)h * D + j], ref[j], tol[j]);
                }
            }
        }
        CHECK(!memcmp(oa + (size_t)H * NREP * D, ob + (size_t)H * NREP * D,
                      (size_t)H * NREP * D * sizeof *oa),
              "%s: the global layer differs from the twin's at n %d", spec, n);
        if (G) {
            int hp = held_pages(a, sa, D, G);
            max_held = hp > max_held ? hp : max_held;
        }
    }
    if (G) { /* pages wholly before the window are gone; the rest remain */
        kkv_seq_info in;
        kkv_seq_get_info(a, &in, sa, 0);
        int first = T > W ? T - W : 0, dead = first > S ? (first - S) / G : 0;
        int drop = dead < in.value_pages ? dead : in.value_pages;
        CHECK(held_pages(a, sa, D, G) == in.key_pages - drop, "%s W %d: %d key pages held, "
              "want %d - %d", spec, W, held_pages(a, sa, D, G), in.key_pages, drop);
        CHECK(max_held <= W / G + 4, "%s W %d: up to %d pages held", spec, W, max_held);
        /* read-back: the released pages' tokens read as zeros, the rest as
         * the twin's; a released key page itself is refused by name */
        int zero_bad = 0, same_bad = 0;
        float *ak = malloc((size_t)T * D * sizeof *ak), *av = malloc((size_t)T * D * sizeof *av);
        for (int kh = 0; kh < H; kh++) {
            float *bk = rk + (size_t)kh * T * D, *bv = rv + (size_t)kh * T * D;
            CHECK(kkv_seq_read(a, ak, av, sa, 0, kh) == KKV_OK && kkv_seq_read(b, bk, bv, sb, 0, kh) == KKV_OK,
                  "%s: read: %s", spec, kkv_last_error());
            for (int t = 0; t < T; t++) {
                const float *ka = ak + (size_t)t * D, *va = av + (size_t)t * D;
                int released = t >= S && t < S + drop * G, zero = 1;
                for (int j = 0; j < D; j++) zero &= ka[j] == 0.0f && va[j] == 0.0f;
                int same = !memcmp(ka, bk + (size_t)t * D, (size_t)D * sizeof *ka) &&
                           !memcmp(va, bv + (size_t)t * D, (size_t)D * sizeof *va);
                zero_bad += released && !zero;
                same_bad += !released && !same && !(t < S && zero); /* a released sink reads 0 too */
            }
        }
        CHECK(!zero_bad && !same_bad, "%s W %d: %d released rows not zero, %d kept rows not the twin's",
              spec, W, zero_bad, same_bad);
        free(ak), free(av);
        if (drop > 0) {
            uint8_t pg[1 << 16];
            CHECK(kkv_seq_key_page(a, pg, sizeof pg, sa, 0, 0, 0) == KKV_ERR_NOT_FOUND &&
                      strstr(kkv_last_error(), "released"), "%s: released page 0: %s", spec, kkv_last_error());
            CHECK(kkv_seq_key_page_boost(a, sa, 0, 0, 0) == -1, "%s: boost of a released page", spec);
            CHECK(kkv_seq_key_page(a, pg, sizeof pg, sa, 0, 0, drop) == KKV_OK, "%s: page %d: %s", spec,
                  drop, kkv_last_error());
        }
        CHECK(kkv_seq_get_info(a, &in, sa, L) == KKV_ERR_INVALID_ARG &&
                  kkv_seq_get_info(a, &in, sa, -1) == KKV_ERR_INVALID_ARG, "%s: seq_info of layer %d", spec, L);
    }
    kkv_mem ma, mb;
    kkv_seq_mem(a, &ma, sa);
    kkv_seq_mem(b, &mb, sb);
    if (T > S + W + 3 * G)
        CHECK(ma.total < mb.total, "%s W %d: %llu bytes windowed vs %llu", spec, W,
              (unsigned long long)ma.total, (unsigned long long)mb.total);
    printf("%-28s D %3d W %4d T %4d: worst error/tol %.3f, bytes %llu vs %llu unwindowed\n",
           spec, D, W, T, worst, (unsigned long long)ma.total, (unsigned long long)mb.total);
    kkv_seq_free(a, sa);
    kkv_mem pool;
    kkv_cache_mem(a, &pool);
    CHECK(pool.used == 0, "%s: %llu pool bytes still used after free", spec,
          (unsigned long long)pool.used);
    free(oa), free(ob), free(q), free(rk), free(rv);
    kkv_cache_free(a);
    kkv_cache_free(b);
}

/* A long run in a pool that holds the window but not the whole sequence: one
 * reservation covers it, the pool never fills, and the bytes held level off. */
static void bounded(void) {
    const char *spec = "kitty:group=16:sink=8:window=16";
    int D = 32, W = 40, T = 3000;
    int win[L] = {W, W};
    kkv_cache *a = make(spec, D, win, 96u << 10); /* ~ the window's pages, not 3000 tokens' */
    if (!a) return;
    int s;
    kkv_seq_add(a, &s);
    kkv_status st = kkv_seq_reserve(a, s, T);
    CHECK(st == KKV_OK, "reserve %d tokens with windows: %s", T, kkv_last_error());
    float *out = malloc((size_t)L * H * NREP * D * sizeof *out), q[H * NREP * 32];
    for (int i = 0; i < H * NREP * D; i++) q[i] = 0.1f * (float)(i % 7);
    uint64_t cap_mid = 0;
    for (int t = 0; t < T && st == KKV_OK; t++) {
        st = step(a, s, D, 3, t, out, q);
        if (t == T / 2) {
            kkv_mem m;
            kkv_seq_mem(a, &m, s);
            cap_mid = m.capacity;
        }
    }
    CHECK(st == KKV_OK, "a reserved windowed run met: %s", kkv_last_error());
    kkv_mem m;
    kkv_seq_mem(a, &m, s);
    /* <=: at the end of the reservation its unused surplus goes back to the pool */
    CHECK(m.capacity <= cap_mid, "capacity grew from %llu to %llu", (unsigned long long)cap_mid,
          (unsigned long long)m.capacity);
    CHECK(m.capacity <= 96u << 10, "capacity %llu within the pool", (unsigned long long)m.capacity);
    /* without windows the same pool cannot take it */
    kkv_cache *b = make(spec, D, NULL, 96u << 10);
    int sb;
    if (b && kkv_seq_add(b, &sb) == KKV_OK)
        CHECK(kkv_seq_reserve(b, sb, T) == KKV_ERR_POOL_FULL, "the unwindowed twin fits");
    kkv_cache_free(b);
    free(out);
    kkv_cache_free(a);
}

/* Fork and save/load in the middle of a windowed run continue exactly. */
static void fork_and_state(const char *spec, int D, int W) {
    int win[L] = {W, 0}, T1 = 300, T2 = 200;
    kkv_cache *a = make(spec, D, win, 64u << 20);
    if (!a) return;
    int p, ch, ld;
    kkv_seq_add(a, &p);
    size_t od = (size_t)L * H * NREP * D;
    float *o1 = malloc(od * sizeof *o1), *o2 = malloc(od * sizeof *o2), *o3 = malloc(od * sizeof *o3);
    float *q = malloc((size_t)H * NREP * D * sizeof *q);
    for (int i = 0; i < H * NREP * D; i++) q[i] = 0.05f * (float)(i % 11) - 0.2f;
    for (int t = 0; t < T1; t++) step(a, p, D, 5, t, o1, q);
    size_t n = 0;
    CHECK(kkv_seq_save(a, NULL, 0, &n, p, NULL) == KKV_OK, "save size: %s", kkv_last_error());
    uint8_t *buf = malloc(n);
    CHECK(kkv_seq_save(a, buf, n, &n, p, NULL) == KKV_OK, "save: %s", kkv_last_error());
    CHECK(kkv_seq_fork(a, &ch, p) == KKV_OK, "fork: %s", kkv_last_error());
    CHECK(kkv_seq_load(a, &ld, buf, n, 0, NULL, 0, NULL) == KKV_OK, "load: %s",
          kkv_last_error());
    int same = 1;
    for (int t = T1; t < T1 + T2; t++) {
        if (p >= 0) step(a, p, D, 5, t, o1, q);
        same &= step(a, ch, D, 5, t, o2, q) == KKV_OK && step(a, ld, D, 5, t, o3, q) == KKV_OK;
        if (p >= 0) same &= !memcmp(o1, o2, od * sizeof *o1);
        same &= !memcmp(o2, o3, od * sizeof *o2);
        if (t == T1 + 10) { /* the parent goes early: shared pages stay with the child */
            kkv_seq_free(a, p);
            p = -1;
        }
    }
    CHECK(same, "%s: fork / loaded state diverge from the parent", spec);
    /* a cache with other windows refuses the state */
    int other[L] = {W + 1, 0};
    kkv_cache *b = make(spec, D, other, 64u << 20), *c0 = make(spec, D, NULL, 64u << 20);
    int x;
    CHECK(b && kkv_seq_load(b, &x, buf, n, 0, NULL, 0, NULL) == KKV_ERR_FORMAT,
          "a state of other windows loaded");
    CHECK(c0 && kkv_seq_load(c0, &x, buf, n, 0, NULL, 0, NULL) == KKV_ERR_FORMAT,
          "a windowed state loaded without windows");
    kkv_seq_free(a, ch);
    kkv_seq_free(a, ld);
    kkv_mem pool;
    kkv_cache_mem(a, &pool);
    CHECK(pool.used == 0, "%s: %llu bytes used after freeing all", spec,
          (unsigned long long)pool.used);
    kkv_cache_free(b);
    kkv_cache_free(c0);
    kkv_cache_free(a);
    free(buf), free(o1), free(o2), free(o3), free(q);
}

static void bad_input(void) {
    int win[L] = {-1, 0};
    kkv_method m;
    kkv_method_from_name(&m, "kitty");
    kkv_cache_config cfg = {.n_layers = L, .n_kv_heads = H, .head_dim = 64,
                            .pool_bytes = 1u << 20, .method = m, .layer_window = win};
    kkv_cache *c = (kkv_cache *)&cfg;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_ERR_INVALID_ARG && !c, "negative window accepted");
    win[0] = 5;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_OK, "create: %s", kkv_last_error());
    win[0] = 9; /* the cache copied the array */
    CHECK(c && kkv_cache_get_config(c)->layer_window[0] == 5, "window not copied");
    kkv_cache_free(c);
}

int main(void) {
    /* small pages so that a few hundred tokens release many of them; the
     * window inside the sink, inside a page, wider than R + G, and W = 1 */
    const char *specs[] = {"kitty:group=16:sink=8:window=16", "kivi-k2v2s:group=16:window=16",
                           "fp16:group=16", "kitty:group=16:sink=8:window=16:eager=1",
                           "kivi-k2v2:group=32:window=32"};
    int S[] = {8, 32, 0, 8, 0}, G[] = {16, 16, 0 /* fp16: no key_lo to count */, 16, 32};
    int Ws[] = {1, 5, 37, 100};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++)
        for (size_t w = 0; w < sizeof Ws / sizeof *Ws; w++)
            equality(specs[i], 32, G[i], S[i], Ws[w], 260, 1);
    equality("kitty", 256, 128, 32, 512, 800, 3); /* Gemma's shape and window */
    bounded();
    fork_and_state("kitty:group=16:sink=8:window=16", 32, 37);
    fork_and_state("kitty:group=16:sink=8:window=16:eager=1", 32, 37);
    fork_and_state("fp16:group=16", 32, 1); /* saved with every page released */
    bad_input();
    return tu_summary();
}
