/* The options beyond the paper (docs/FORMAT.md section 5): pair-aware boost
 * selection follows the cache's RoPE layout, rotations keep attention exact
 * (rotated query, un-rotated output) and kkv_seq_read in the model's space,
 * clipped ranges never lose to min/max in squared error, attention over every
 * option matches a double-precision reference built from the read-back K/V,
 * results do not depend on threads, and save/load carries the options. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "testutil.h"
#include "tu_ref_attend.h"

static kkv_cache *make(const char *spec, int L, int H, int D, int neox, int rope_dims,
                       int threads) {
    kkv_method m;
    if (kkv_method_parse(&m, spec) != KKV_OK) {
        CHECK(0, "parse %s: %s", spec, kkv_last_error());
        return NULL;
    }
    kkv_cache_config cfg = {.n_layers = L, .n_kv_heads = H, .head_dim = D,
                            .pool_bytes = 64u << 20, .n_threads = threads, .method = m,
                            .rope_neox = neox, .rope_dims = rope_dims};
    kkv_cache *c = NULL;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_OK, "create %s: %s", spec, kkv_last_error());
    return c;
}

/* Page 0 of a kitty cache (8 of 64 boosted) whose channel `hot` carries an
 * outlier: with pairs=1 both `hot` and its rotary partner are boosted. */
static void test_pairs(void) {
    enum { D = 64, G = 128 };
    struct { int neox, rope_dims, hot, mate; } cases[] = {
        {0, 0, 5, 4}, {0, 0, 10, 11}, {1, 0, 5, 37}, {1, 0, 40, 8}, {1, 32, 3, 19},
        {0, 48, 50, -1}, /* channel 50 is past the rotated dims: a pair of one */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        for (int pairs = 0; pairs <= 1; pairs++) {
            kkv_cache *c = make(pairs ? "kitty:pairs=1:sink=0" : "kitty:sink=0", 1, 1, D,
                                cases[ci].neox, cases[ci].rope_dims, 1);
            if (!c) return;
            int seq;
            kkv_seq_add(c, &seq);
            tu_rng r = tu_rng_make(7 + ci);
            float k[D], v[D];
            for (int t = 0; t < G; t++) {
                for (int j = 0; j < D; j++) {
                    k[j] = tu_normal(&r) * 0.5f;
                    v[j] = tu_normal(&r);
                }
                k[cases[ci].hot] += 20.0f; /* the magnitude outlier */
                /* its partner is the channel a magnitude ranking puts low */
                if (cases[ci].mate >= 0) k[cases[ci].mate] *= 0.1f;
                kkv_append(c, seq, 0, k, v);
                kkv_flush(c, seq, 0);
            }
            size_t kb = kkv_key_page_bytes(D, G, 8);
            uint8_t *pg = malloc(kb);
            CHECK(kkv_seq_key_page(c, pg, kb, seq, 0, 0, 0) == KKV_OK, "page: %s",
                  kkv_last_error());
            const uint8_t *idx = pg + kb - 4 * D - D; /* idx precedes scale and mn */
            CHECK(idx[cases[ci].hot] == 0, "case %zu pairs=%d: outlier %d not ranked first (%d)",
                  ci, pairs, cases[ci].hot, idx[cases[ci].hot]);
            if (cases[ci].mate >= 0) {
                int boosted = idx[cases[ci].mate] < 8;
                CHECK(boosted == pairs, "case %zu pairs=%d: partner %d boosted %d", ci, pairs,
                      cases[ci].mate, boosted);
                if (pairs) CHECK(idx[cases[ci].mate] == 1, "partner rank %d", idx[cases[ci].mate]);
            }
            int nb = 0;
            for (int j = 0; j < D; j++) nb += idx[j] < 8;
            CHECK(nb == 8, "case %zu: %d boosted, want 8", ci, nb);
            free(pg);
            kkv_cache_free(c);
        }
    }
}

/* Attention of every option against the reference; read-back of the fp16
 * parts equals the input to fp16 rounding through the rotation; identical
 * outputs at 1 and 3 threads and on the scalar kernel's pages. */
static void test_attention(void) {
    static const char *specs[] = {
        "kitty:rot=hadamard", "kitty:rot=random:seed=4", "kitty:vrot=hadamard",
        "kitty:rot=random:vrot=random:seed=2", "kitty:clip=1", "kitty:vclip=1",
        "kitty:pairs=1", "kitty:select=range", "kitty-plus", "kitty-plus-pro",
        "kitty-plus:vrot=hadamard", "kivi-k2v2s:rot=hadamard:clip=1:eager=1",
        /* 8-bit pages (with a sink: the check below reads it back) */
        "kivi-k8v8:sink=32", "kivi-k8v8:sink=32:window=128:eager=0:rot=hadamard:vrot=random",
    };
    enum { L = 2, H = 2, NQ = 6, T = 300 };
    for (size_t si = 0; si < sizeof specs / sizeof *specs; si++) {
        int D = si % 2 ? 64 : 32;
        kkv_cache *c1 = make(specs[si], L, H, D, (int)(si % 2), 0, 1);
        kkv_cache *c3 = make(specs[si], L, H, D, (int)(si % 2), 0, 3);
        if (!c1 || !c3) return;
        /* the scalar kernel is exact to float rounding; test_golden covers
         * the SIMD kernels of the named methods at several thread counts */
        kkv_cache_set_kernel(c1, KKV_KERNEL_SCALAR);
        kkv_cache_set_kernel(c3, KKV_KERNEL_SCALAR);
        int s1, s3;
        kkv_seq_add(c1, &s1);
        kkv_seq_add(c3, &s3);
        size_t HD = (size_t)H * D;
        float *k = malloc((size_t)T * HD * sizeof *k), *v = malloc((size_t)T * HD * sizeof *v);
        float q[NQ * 64], o1[NQ * 64], o3[NQ * 64];
        float *rk = malloc((size_t)T * D * sizeof *rk), *rv = malloc((size_t)T * D * sizeof *rv);
        tu_rng r = tu_rng_make(99 + si);
        for (size_t i = 0; i < (size_t)T * HD; i++) {
            k[i] = tu_normal(&r) * (1.0f + (float)(i % 5));
            v[i] = tu_normal(&r);
        }
        double worst = 0.0;
        int same = 1;
        for (int t = 0; t < T; t++)
            for (int l = 0; l < L; l++) {
                for (int i = 0; i < NQ * D; i++) q[i] = tu_normal(&r);
                const float *kt = k + (size_t)t * HD, *vt = v + (size_t)t * HD;
                CHECK(kkv_append(c1, s1, l, kt, vt) == KKV_OK, "append: %s", kkv_last_error());
                CHECK(kkv_append(c3, s3, l, kt, vt) == KKV_OK, "append: %s", kkv_last_error());
                CHECK(kkv_attend(c1, o1, s1, l, q, NQ) == KKV_OK, "attend: %s", kkv_last_error());
                kkv_attend(c3, o3, s3, l, q, NQ);
                same &= !memcmp(o1, o3, (size_t)NQ * D * sizeof *o1);
                if (l == 1 && (t % 37 == 0 || t == T - 1)) {
                    for (int h = 0; h < H; h++) {
                        kkv_seq_read(c1, rk, rv, s1, l, h);
                        for (int rr = 0; rr < NQ / H; rr++) {
                            int qh = h * (NQ / H) + rr;
                            double ref[64];
                            tu_ref_attend(ref, NULL, q + (size_t)qh * D, rk, rv, t + 1, D);
                            for (int j = 0; j < D; j++) {
                                double e = fabs(ref[j] - o1[(size_t)qh * D + j]);
                                worst = e > worst ? e : worst;
                            }
                        }
                    }
                }
                kkv_flush(c1, s1, l);
                kkv_flush(c3, s3, l);
            }
        CHECK(same, "%s: 1 and 3 threads differ", specs[si]);
        /* float rounding of sums over <= 300 tokens of |v| ~ 1; a rotation
         * left out anywhere would be off by O(1) */
        CHECK(worst < 1e-3, "%s: attention differs from the read-back reference by %g",
              specs[si], worst);
        /* the sink (fp16) reads back as the input to rotation rounding */
        kkv_seq_read(c1, rk, rv, s1, 0, 1);
        double werr = 0.0;
        for (int t = 0; t < 32; t++)
            for (int j = 0; j < D; j++) {
                double a = rk[(size_t)t * D + j], b = k[(size_t)t * HD + D + j];
                double a2 = rv[(size_t)t * D + j], b2 = v[(size_t)t * HD + D + j];
                werr = fmax(werr, fmax(fabs(a - b) / 5.0, fabs(a2 - b2)));
            }
        CHECK(werr < 1e-2, "%s: sink reads back %g away from the input", specs[si], werr);
        free(k), free(v), free(rk), free(rv);
        kkv_cache_free(c1);
        kkv_cache_free(c3);
    }
}

/* Clipped key and value ranges: never more squared error than min/max on the
 * same (page-resident) tokens, and less on Gaussian data. */
static void test_clip(void) {
    enum { D = 64, T = 32 + 128 + 128 + 128 };
    double err[2][2] = {{0, 0}, {0, 0}}; /* [clip][key, value] */
    for (int clip = 0; clip <= 1; clip++) {
        kkv_cache *c = make(clip ? "kitty:clip=1:vclip=1:eager=1:window=0" : "kitty:eager=1:window=0",
                            1, 1, D, 0, 0, 1);
        if (!c) return;
        int seq;
        kkv_seq_add(c, &seq);
        float *k = malloc((size_t)T * D * sizeof *k), *v = malloc((size_t)T * D * sizeof *v);
        float *rk = malloc((size_t)T * D * sizeof *rk), *rv = malloc((size_t)T * D * sizeof *rv);
        tu_rng r = tu_rng_make(5);
        for (int i = 0; i < T * D; i++) {
            k[i] = tu_normal(&r);
            v[i] = tu_normal(&r);
        }
        for (int t = 0; t < T; t++) {
            kkv_append(c, seq, 0, k + (size_t)t * D, v + (size_t)t * D);
            kkv_flush(c, seq, 0);
        }
        kkv_seq_read(c, rk, rv, seq, 0, 0);
        for (int t = 32; t < 32 + 3 * 128; t++)
            for (int j = 0; j < D; j++) {
                double a = rk[t * D + j] - kkv_f16_round(k[t * D + j]);
                double b = rv[t * D + j] - kkv_f16_round(v[t * D + j]);
                err[clip][0] += a * a;
                err[clip][1] += b * b;
            }
        free(k), free(v), free(rk), free(rv);
        kkv_cache_free(c);
    }
    CHECK(err[1][0] < 0.8 * err[0][0], "clip: key squared error %g vs min/max %g", err[1][0],
          err[0][0]);
    CHECK(err[1][1] < 0.8 * err[0][1], "vclip: value squared error %g vs min/max %g", err[1][1],
          err[0][1]);
}

/* Save/load keeps the options; another option set refuses the state. */
static void test_state(void) {
    enum { D = 64, T = 400 };
    const char *spec = "kitty-plus:vrot=random:seed=3";
    kkv_cache *a = make(spec, 2, 1, D, 1, 0, 1), *b = make(spec, 2, 1, D, 1, 0, 1);
    kkv_cache *other = make("kitty-plus", 2, 1, D, 1, 0, 1);
    kkv_cache *layout = make(spec, 2, 1, D, 0, 0, 1);
    if (!a || !b || !other || !layout) return;
    int seq;
    kkv_seq_add(a, &seq);
    tu_rng r = tu_rng_make(11);
    float k[D], v[D];
    for (int t = 0; t < T; t++)
        for (int l = 0; l < 2; l++) {
            for (int j = 0; j < D; j++) k[j] = tu_normal(&r) * (float)(1 + j % 3), v[j] = tu_normal(&r);
            kkv_append(a, seq, l, k, v);
            kkv_flush(a, seq, l);
        }
    size_t n = 0;
    CHECK(kkv_seq_save(a, NULL, 0, &n, seq, NULL) == KKV_OK, "save size: %s", kkv_last_error());
    uint8_t *buf = malloc(n);
    CHECK(kkv_seq_save(a, buf, n, &n, seq, NULL) == KKV_OK, "save: %s", kkv_last_error());
    int got;
    CHECK(kkv_seq_load(b, &got, buf, n, 0, NULL, 0, NULL) == KKV_OK, "load: %s", kkv_last_error());
    float *x = malloc(2 * (size_t)T * D * sizeof *x), *y = malloc(2 * (size_t)T * D * sizeof *y);
    for (int l = 0; l < 2; l++) {
        kkv_seq_read(a, x, x + (size_t)T * D, seq, l, 0);
        kkv_seq_read(b, y, y + (size_t)T * D, got, l, 0);
        CHECK(!memcmp(x, y, 2 * (size_t)T * D * sizeof *x), "layer %d: loaded K/V differ", l);
    }
    float q[D], oa[D], ob[D];
    for (int j = 0; j < D; j++) q[j] = tu_normal(&r);
    kkv_attend(a, oa, seq, 1, q, 1);
    kkv_attend(b, ob, got, 1, q, 1);
    CHECK(!memcmp(oa, ob, sizeof oa), "loaded sequence attends differently");
    CHECK(kkv_seq_load(other, &got, buf, n, 0, NULL, 0, NULL) == KKV_ERR_FORMAT,
          "a state with a value rotation loaded into a cache without one");
    CHECK(kkv_seq_load(layout, &got, buf, n, 0, NULL, 0, NULL) == KKV_ERR_FORMAT,
          "a pairs state loaded into a cache with another RoPE layout");
    free(buf), free(x), free(y);
    kkv_cache_free(a), kkv_cache_free(b), kkv_cache_free(other), kkv_cache_free(layout);
}

static void test_bad(void) {
    kkv_method m;
    kkv_method_parse(&m, "kitty:rot=hadamard");
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 20,
                            .pool_bytes = 1u << 20, .method = m};
    kkv_cache *c = NULL;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_ERR_INVALID_ARG && !c,
          "Hadamard with head_dim 20 accepted");
    cfg.method.key_rot = KKV_ROT_RANDOM;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_OK, "random rotation, D=20: %s", kkv_last_error());
    kkv_cache_free(c);
    c = NULL;
    cfg.method.key_rot = (kkv_rot)7;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_ERR_INVALID_ARG, "rotation 7 accepted");
    cfg.method.key_rot = KKV_ROT_HADAMARD;
    cfg.head_dim = 64;
    cfg.method.pairs = 1;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_ERR_INVALID_ARG, "pairs with a key rotation accepted");
}

int main(void) {
    test_pairs();
    test_attention();
    test_clip();
    test_state();
    test_bad();
    return tu_summary();
}
