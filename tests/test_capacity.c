/* Capacity (issue 13): eager value quantization, kkv_seq_fork with shared
 * pages and sinks (trees of depth 3 freed in every order, exact accounting,
 * pool-full), staging given back as Q-buffers flush, thread-count and
 * chunking invariance with forks, and kkv_seq_save / kkv_seq_load (round
 * trip byte for byte, continuation, every corruption refused with the cache
 * unchanged), and a pool that spans several slabs. Run under ASan+UBSan by
 * the sanitizer build. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/bigmem.h"
#include "kittykv.h"
#include "testutil.h"

#define XXH_INLINE_ALL /* the state's checksum, re-signed after a corruption */
#include <xxhash.h>

enum { L = 2, H = 2, D = 16, NQ = 4 };

static kkv_method meth(const char *name, int small, int eager) {
    kkv_method m;
    CHECK(kkv_method_parse(&m, name) == KKV_OK, "%s: %s", name, kkv_last_error());
    if (small && !m.fp16) m.sink = 5, m.group = 8, m.window = 12;
    if (small && m.fp16) m.group = 8;
    m.eager_values = eager;
    return m;
}

static kkv_cache *mk_t(const kkv_method *m, size_t pool, int threads) {
    kkv_cache_config cfg = {.n_layers = L, .n_kv_heads = H, .head_dim = D, .pool_bytes = pool,
                            .n_threads = threads, .method = *m};
    kkv_cache *c = NULL;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_OK, "create: %s", kkv_last_error());
    return c;
}

static kkv_cache *mk(const kkv_method *m, size_t pool) { return mk_t(m, pool, 2); }

/* Token t's K/V/Q for layer l: a pure function of (t, l), so two sequences
 * fed the same positions see the same data. */
static void data(float *k, float *v, float *q, int t, int l) {
    tu_rng r = tu_rng_make(((uint64_t)t << 8) ^ (uint64_t)l ^ 0x5eed);
    for (int i = 0; i < H * D; i++) k[i] = tu_normal(&r) * (1.0f + (float)(i % 5)), v[i] = tu_normal(&r);
    for (int i = 0; i < NQ * D; i++) q[i] = tu_normal(&r);
}

/* Feeds tokens [t0, t1) to every layer, append -> attend -> flush; hashes
 * the attention outputs into *h (FNV-1a). */
static kkv_status feed(kkv_cache *c, int seq, int t0, int t1, uint64_t *h) {
    float k[H * D], v[H * D], q[NQ * D], o[NQ * D];
    for (int t = t0; t < t1; t++)
        for (int l = 0; l < L; l++) {
            data(k, v, q, t, l);
            kkv_status s = kkv_append(c, seq, l, k, v);
            if (s == KKV_OK) s = kkv_attend(c, o, seq, l, q, NQ);
            if (s == KKV_OK) s = kkv_flush(c, seq, l);
            if (s != KKV_OK) return s;
            if (h) {
                const uint8_t *b = (const uint8_t *)o;
                for (size_t i = 0; i < sizeof o; i++) *h = (*h ^ b[i]) * 0x100000001b3ull;
            }
        }
    return KKV_OK;
}

/* Everything kkv_seq_read shows of a sequence, [L][H][2][len][D]. */
static float *contents(const kkv_cache *c, int seq, size_t *n) {
    int len = kkv_seq_len(c, seq, 0);
    *n = (size_t)L * H * 2 * (size_t)(len > 0 ? len : 0) * D;
    float *x = calloc(*n + 1, sizeof *x);
    float *o = x;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++, o += 2 * (size_t)len * D)
            kkv_seq_read(c, o, o + (size_t)len * D, seq, l, h);
    return x;
}

static int same_contents(const kkv_cache *a, int sa, const kkv_cache *b, int sb) {
    size_t na, nb;
    float *x = contents(a, sa, &na), *y = contents(b, sb, &nb);
    int eq = na == nb && !memcmp(x, y, na * sizeof *x);
    free(x), free(y);
    return eq;
}

/* ---------------------------------------------------------------- eager */

static void test_eager(void) {
    const char *names[] = {"kitty", "kitty-pro", "kivi-k2v4s"};
    for (int mi = 0; mi < 3; mi++) {
        kkv_method me = meth(names[mi], 1, 1), mp = meth(names[mi], 1, 0);
        kkv_cache *ce = mk(&me, 16u << 20), *cp = mk(&mp, 16u << 20);
        if (!ce || !cp) return;
        int se, sp;
        kkv_seq_add(ce, &se);
        kkv_seq_add(cp, &sp);
        int S = me.sink, G = me.group, R = me.window;
        for (int T = 1; T <= 70; T++) {
            CHECK(feed(ce, se, T - 1, T, NULL) == KKV_OK, "eager feed: %s", kkv_last_error());
            CHECK(feed(cp, sp, T - 1, T, NULL) == KKV_OK, "feed");
            /* keys are untouched; a value is the paper's fp16 or its own
             * quantized row, which the paper's later value page holds too */
            size_t n;
            float *x = contents(ce, se, &n), *y = contents(cp, sp, &n);
            int post = T > S ? T - S : 0, vq_e = post > R ? post - R : 0;
            int vq_p = post >= R + G ? (post - R) / G * G : 0;
            for (int l = 0; l < L; l++)
                for (int h = 0; h < H; h++) {
                    size_t base = ((size_t)l * H + h) * 2 * (size_t)T * D;
                    CHECK(!memcmp(x + base, y + base, (size_t)T * D * sizeof *x), "keys differ");
                    for (int t = 0; t < T; t++) {
                        const float *a = x + base + (size_t)(T + t) * D, *b = y + base + (size_t)(T + t) * D;
                        int i = t - S, differs = memcmp(a, b, D * sizeof *a) != 0;
                        int may = i >= vq_p && i < vq_e; /* the paper's value Q-buffer */
                        CHECK(!differs || may, "%s T=%d token %d: eager value differs outside the "
                              "value Q-buffer", names[mi], T, t);
                        if (may) {
                            float mn = b[0], mx = b[0], err = 0;
                            for (int j = 0; j < D; j++) {
                                mn = b[j] < mn ? b[j] : mn, mx = b[j] > mx ? b[j] : mx;
                                err = fabsf(a[j] - b[j]) > err ? fabsf(a[j] - b[j]) : err;
                            }
                            float step = (mx - mn) / (float)((1 << me.value_bits) - 1);
                            CHECK(err <= 0.5f * step * 1.01f + 1e-3f, "eager value error %g > half a step %g",
                                  (double)err, (double)step);
                        }
                    }
                }
            free(x), free(y);
            kkv_mem m1, m2;
            kkv_seq_mem(ce, &m1, se);
            kkv_seq_mem(cp, &m2, sp);
            CHECK(m1.total <= m2.total, "eager holds more bytes (%llu > %llu)",
                  (unsigned long long)m1.total, (unsigned long long)m2.total);
            if (tu_failed()) break;
        }
        /* chunking/flush-order invariance of the eager lifecycle */
        int s2;
        kkv_seq_add(ce, &s2);
        float k[H * D], v[H * D], q[NQ * D];
        for (int l = L - 1; l >= 0; l--)
            for (int t = 0; t < 70; t++) {
                data(k, v, q, t, l);
                CHECK(kkv_append(ce, s2, l, k, v) == KKV_OK, "append");
                if (t % 3) kkv_flush(ce, s2, l);
            }
        for (int l = 0; l < L; l++) kkv_flush(ce, s2, l);
        CHECK(same_contents(ce, se, ce, s2), "%s eager: layer order / missing flushes changed "
              "the state", names[mi]);
        kkv_cache_free(ce);
        kkv_cache_free(cp);
    }
}

/* ---------------------------------------------------------------- fork */

/* A fork continues exactly as its parent, and exactly as a sequence that
 * never forked. */
static void test_fork_continue(const kkv_method *m, const char *what, int at) {
    kkv_cache *c = mk(m, 32u << 20);
    if (!c) return;
    int ref, p, ch;
    kkv_seq_add(c, &ref);
    kkv_seq_add(c, &p);
    uint64_t hr = 0, hc = 0, hp = 0;
    feed(c, ref, 0, at, NULL);
    feed(c, p, 0, at, NULL);
    CHECK(kkv_seq_fork(c, &ch, p) == KKV_OK, "fork: %s", kkv_last_error());
    CHECK(same_contents(c, p, c, ch), "%s: child differs from parent", what);
    feed(c, ref, at, 90, &hr);
    feed(c, ch, at, 90, &hc);
    CHECK(hr == hc && same_contents(c, ref, c, ch), "%s: child forked at %d does not continue "
          "as the parent would", what, at);
    feed(c, p, at, 90, &hp); /* the parent after its child grew: its shared pages unchanged */
    CHECK(hp == hr && same_contents(c, ref, c, p), "%s: parent changed by its child", what);
    kkv_cache_free(c);
}

/* A fork past the sink shares the parent's sink block: the pool pays only
 * for what the child owns, kkv_seq_mem says the sink is shared, and the
 * pool-wide sum counts its fp16 once. A fork inside the sink copies it. */
static void test_fork_sink(const kkv_method *m, const char *what) {
    kkv_cache *c = mk(m, 32u << 20);
    if (!c) return;
    int S = m->fp16 ? 0 : m->sink, i8 = !m->fp16 && m->sink_int8; /* int8 rows: D + 2 bytes */
    uint64_t sink = (uint64_t)L * H * 2 * S * (i8 ? D + 2 : D * 2); /* every layer's K and V */
    int p = -1, ch = -1, young = -1, yc = -1;
    kkv_seq_add(c, &p);
    feed(c, p, 0, S + 3, NULL);
    kkv_mem pm0, pm1, cm, all;
    kkv_seq_mem(c, &pm0, p);
    uint64_t f0 = kkv_cache_free_bytes(c);
    CHECK(kkv_seq_fork(c, &ch, p) == KKV_OK, "fork: %s", kkv_last_error());
    kkv_seq_mem(c, &pm1, p);
    kkv_seq_mem(c, &cm, ch);
    kkv_cache_mem(c, &all);
    CHECK(cm.capacity == pm0.capacity && cm.shared == pm1.shared && pm1.shared >= sink,
          "%s: fork holds %llu (parent %llu), shares %llu, sinks %llu", what,
          (unsigned long long)cm.capacity, (unsigned long long)pm0.capacity,
          (unsigned long long)cm.shared, (unsigned long long)sink);
    CHECK(f0 - kkv_cache_free_bytes(c) == cm.capacity - cm.shared, "%s: the fork took %llu, owns "
          "%llu", what, (unsigned long long)(f0 - kkv_cache_free_bytes(c)),
          (unsigned long long)(cm.capacity - cm.shared));
    uint64_t held = i8 ? all.sink_int8 : all.fp16, p1 = i8 ? pm1.sink_int8 : pm1.fp16,
             c1 = i8 ? cm.sink_int8 : cm.fp16;
    CHECK(held == p1 + c1 - sink && all.used == pm0.capacity + cm.capacity - cm.shared,
          "%s: pool-wide sum counts the shared sink %s", what, held > p1 + c1 - sink ?
          "twice" : "wrong");
    /* inside the sink: copied, nothing shared, and both grow their own */
    kkv_seq_add(c, &young);
    feed(c, young, 0, S > 1 ? S - 1 : 0, NULL);
    f0 = kkv_cache_free_bytes(c);
    CHECK(kkv_seq_fork(c, &yc, young) == KKV_OK, "fork: %s", kkv_last_error());
    kkv_seq_mem(c, &cm, yc);
    CHECK(cm.shared == 0 && f0 - kkv_cache_free_bytes(c) == cm.capacity, "%s: fork inside the "
          "sink shares %llu", what, (unsigned long long)cm.shared);
    uint64_t hy = 0, hc = 0;
    feed(c, young, S > 1 ? S - 1 : 0, S + 9, &hy);
    feed(c, yc, S > 1 ? S - 1 : 0, S + 9, &hc);
    CHECK(hy == hc && same_contents(c, young, c, yc), "%s: copied sink continues otherwise", what);
    /* the parent goes first: the child keeps the sink, the pool keeps its bytes */
    kkv_seq_free(c, p);
    kkv_seq_mem(c, &cm, ch);
    CHECK(cm.shared == 0, "%s: nothing is shared after the parent left", what);
    kkv_seq_free(c, ch);
    kkv_seq_free(c, young);
    kkv_seq_free(c, yc);
    kkv_cache_mem(c, &all);
    CHECK(all.used == 0 && kkv_cache_free_bytes(c) == all.capacity, "%s: pool not whole", what);
    kkv_cache_free(c);
}

static void permute(int *a, int n, int k, void (*fn)(const int *, void *), void *u) {
    if (k == n) {
        fn(a, u);
        return;
    }
    for (int i = k; i < n; i++) {
        int t = a[k];
        a[k] = a[i], a[i] = t;
        permute(a, n, k + 1, fn, u);
        t = a[k], a[k] = a[i], a[i] = t;
    }
}

typedef struct tree_ctx {
    const kkv_method *m;
    int orders;
} tree_ctx;

/* Root R (40 tokens) -> A (+20) -> B (+20) -> C (+20), and R -> A2 (+7):
 * depth 3. Frees in the given order; after each free every survivor still
 * reads back exactly, and at the end the pool is whole. */
static void tree_free(const int *order, void *u) {
    tree_ctx *x = u;
    enum { N = 5 };
    kkv_cache *c = mk(x->m, 32u << 20), *rc = mk(x->m, 32u << 20);
    if (!c || !rc) return;
    uint64_t f0 = kkv_cache_free_bytes(c);
    int s[N], r[N]; /* tree sequences, and references built without forks */
    int ends[N] = {40, 60, 80, 100, 47}, parent[N] = {-1, 0, 1, 2, 0};
    for (int i = 0; i < N; i++) {
        if (parent[i] < 0) {
            kkv_seq_add(c, &s[i]);
            feed(c, s[i], 0, ends[i], NULL);
        } else {
            CHECK(kkv_seq_fork(c, &s[i], s[parent[i]]) == KKV_OK, "fork: %s", kkv_last_error());
            feed(c, s[i], ends[parent[i]], ends[i], NULL);
        }
        kkv_seq_add(rc, &r[i]);
        feed(rc, r[i], 0, ends[i], NULL);
    }
    /* accounting: the pool counts shared pages once */
    kkv_mem pm, sm;
    kkv_cache_mem(c, &pm);
    uint64_t sum_cap = 0, sum_own = 0;
    for (int i = 0; i < N; i++) {
        kkv_seq_mem(c, &sm, s[i]);
        sum_cap += sm.capacity;
        sum_own += sm.capacity - sm.shared;
        kkv_mem rm;
        kkv_seq_mem(rc, &rm, r[i]);
        CHECK(sm.total == rm.total && sm.tokens == rm.tokens, "fork %d reports other bytes", i);
    }
    CHECK(pm.used == f0 - kkv_cache_free_bytes(c), "pool used %llu != handed out %llu",
          (unsigned long long)pm.used, (unsigned long long)(f0 - kkv_cache_free_bytes(c)));
    CHECK(pm.used >= sum_own + pm.shared && pm.used < sum_cap, "shared bytes not counted once");
    CHECK(pm.shared > 0, "nothing shared");
    /* a set of sequences: shared pages once; all of them are the pool */
    kkv_mem xm;
    CHECK(kkv_seqs_mem(c, &xm, s, N) == KKV_OK && xm.capacity == pm.used &&
              xm.used == pm.used && xm.shared == pm.shared && xm.total == pm.total &&
              xm.tokens == pm.tokens, "seqs_mem of all: %llu != pool %llu",
          (unsigned long long)xm.capacity, (unsigned long long)pm.used);
    for (int i = 0; i < N; i++) { /* one alone: as kkv_seq_mem */
        kkv_seq_mem(c, &sm, s[i]);
        CHECK(kkv_seqs_mem(c, &xm, &s[i], 1) == KKV_OK && xm.capacity == sm.capacity &&
                  xm.shared == sm.shared && xm.total == sm.total, "seqs_mem of %d", i);
    }
    { /* A and its fork A2 share R's pages: once, less than the two apart */
        int two[2] = {s[1], s[4]};
        kkv_mem a, b;
        kkv_seq_mem(c, &a, s[1]);
        kkv_seq_mem(c, &b, s[4]);
        CHECK(kkv_seqs_mem(c, &xm, two, 2) == KKV_OK && xm.capacity < a.capacity + b.capacity &&
                  xm.capacity >= a.capacity && xm.capacity >= b.capacity, "seqs_mem of two");
        int dup[2] = {s[1], s[1]}, none[1] = {99};
        CHECK(kkv_seqs_mem(c, &xm, dup, 2) == KKV_ERR_INVALID_ARG && *kkv_last_error(),
              "seqs_mem: duplicate id accepted");
        CHECK(kkv_seqs_mem(c, &xm, none, 1) == KKV_ERR_NOT_FOUND, "seqs_mem: no such seq");
        CHECK(kkv_seqs_mem(c, &xm, NULL, 0) == KKV_OK && xm.capacity == 0, "seqs_mem: empty");
        CHECK(kkv_seqs_mem(NULL, &xm, two, 2) == KKV_ERR_INVALID_ARG, "seqs_mem: NULL cache");
    }
    int live[N] = {1, 1, 1, 1, 1};
    for (int k = 0; k < N; k++) {
        CHECK(kkv_seq_free(c, s[order[k]]) == KKV_OK, "free");
        live[order[k]] = 0;
        for (int i = 0; i < N; i++)
            if (live[i]) CHECK(same_contents(c, s[i], rc, r[i]), "free of %d changed %d", order[k], i);
    }
    CHECK(kkv_cache_free_bytes(c) == f0, "pool not whole after freeing the tree (%llu of %llu)",
          (unsigned long long)kkv_cache_free_bytes(c), (unsigned long long)f0);
    kkv_cache_mem(c, &pm);
    CHECK(pm.used == 0 && pm.shared == 0, "accounting left over");
    x->orders++;
    kkv_cache_free(c);
    kkv_cache_free(rc);
}

static void test_fork(void) {
    const char *names[] = {"kitty", "fp16", "kivi-k4v4", "kivi-k8v8", "kitty:sink8=1"};
    for (int mi = 0; mi < 5; mi++)
        for (int eager = 0; eager < 2; eager++) {
            kkv_method m = meth(names[mi], 1, eager);
            kkv_method big = meth(names[mi], 0, eager);
            const int at[] = {3, 20, 41};
            for (int i = 0; i < 3; i++) {
                test_fork_continue(&m, names[mi], at[i]);
                test_fork_continue(&big, names[mi], at[i]);
            }
            test_fork_sink(&m, names[mi]);
            test_fork_sink(&big, names[mi]);
            int order[5] = {0, 1, 2, 3, 4};
            tree_ctx x = {&m, 0};
            permute(order, 5, 0, tree_free, &x);
            CHECK(x.orders == 120, "orders %d", x.orders);
        }
    /* pool full during fork: everything as it was */
    kkv_method m = meth("kitty", 1, 0);
    kkv_cache *c = mk(&m, 32u << 20);
    int p;
    kkv_seq_add(c, &p);
    kkv_seq_reserve(c, p, 50); /* the peak of 50 tokens, which growing on demand reaches */
    kkv_mem pmem;
    kkv_seq_mem(c, &pmem, p);
    kkv_cache_free(c);
    c = mk(&m, pmem.capacity + 100);
    kkv_seq_add(c, &p);
    CHECK(feed(c, p, 0, 50, NULL) == KKV_OK, "feed: %s", kkv_last_error());
    size_t n0;
    float *before = contents(c, p, &n0);
    uint64_t fb = kkv_cache_free_bytes(c);
    int ch = -7;
    CHECK(kkv_seq_fork(c, &ch, p) == KKV_ERR_POOL_FULL && *kkv_last_error(), "fork fit");
    size_t n1;
    float *after = contents(c, p, &n1);
    CHECK(ch == -7 && fb == kkv_cache_free_bytes(c) && n0 == n1 && !memcmp(before, after, n0 * 4) &&
              kkv_seq_len(c, p + 1, 0) == -1, "failed fork changed the cache");
    CHECK(kkv_seq_fork(c, &ch, 99) == KKV_ERR_NOT_FOUND, "fork of no sequence");
    free(before), free(after);
    kkv_cache_free(c);
}

/* ---------------------------------------------------------------- staging release */

/* Pool bytes a copy of sequence seq made by save -> load holds: the bytes its
 * state needs and nothing more (a loaded sequence has no surplus). */
static uint64_t loaded_capacity(kkv_cache *c, int seq) {
    size_t n = 0;
    kkv_seq_save(c, NULL, 0, &n, seq, NULL);
    uint8_t *b = malloc(n);
    kkv_cache *c2 = NULL;
    kkv_cache_create(&c2, kkv_cache_get_config(c));
    int x = -1;
    kkv_mem m = {0};
    if (b && c2 && kkv_seq_save(c, b, n, &n, seq, NULL) == KKV_OK &&
        kkv_seq_load(c2, &x, b, n, 0, NULL, 0, NULL) == KKV_OK)
        kkv_seq_mem(c2, &m, x);
    else
        CHECK(0, "save/load: %s", kkv_last_error());
    free(b);
    kkv_cache_free(c2);
    return m.capacity;
}

/* A sequence grown on demand holds exactly what its state needs after every
 * step: when a Q-buffer flushes, its fp16 rows go back to the pool (the
 * sequence's capacity shrinks, the pool's free bytes grow by as much). One
 * that reserved keeps its bytes until the reservation is used up, then holds
 * the same as the other. */
static void test_release(const kkv_method *m, const char *what, int T, int every) {
    kkv_cache *c = mk(m, 32u << 20);
    if (!c) return;
    int s = -1, r = -1, drops = 0;
    kkv_seq_add(c, &s);
    kkv_seq_add(c, &r);
    CHECK(kkv_seq_reserve(c, r, T) == KKV_OK, "reserve: %s", kkv_last_error());
    kkv_mem ms, mr;
    kkv_seq_mem(c, &mr, r);
    uint64_t cap_r = mr.capacity, cap_s = 0;
    for (int t = 0; t < T && !tu_failed(); t++) {
        uint64_t f = kkv_cache_free_bytes(c);
        CHECK(feed(c, s, t, t + 1, NULL) == KKV_OK, "feed: %s", kkv_last_error());
        kkv_seq_mem(c, &ms, s);
        CHECK((int64_t)(f - kkv_cache_free_bytes(c)) == (int64_t)(ms.capacity - cap_s),
              "%s t=%d: the pool and the sequence disagree", what, t);
        drops += ms.capacity < cap_s;
        cap_s = ms.capacity;
        if (t % every == 0 || t == T - 1)
            CHECK(cap_s == loaded_capacity(c, s), "%s t=%d: holds %llu, its state needs %llu", what,
                  t, (unsigned long long)cap_s, (unsigned long long)loaded_capacity(c, s));
        f = kkv_cache_free_bytes(c);
        CHECK(feed(c, r, t, t + 1, NULL) == KKV_OK, "feed: %s", kkv_last_error());
        kkv_seq_mem(c, &mr, r);
        if (t < T - 1)
            CHECK(mr.capacity == cap_r && kkv_cache_free_bytes(c) == f, "%s t=%d: a reserved "
                  "sequence's bytes changed", what, t);
    }
    CHECK(mr.capacity == ms.capacity && mr.capacity <= cap_r, "%s: after its reservation a "
          "sequence holds %llu, on demand %llu (reserved %llu)", what,
          (unsigned long long)mr.capacity, (unsigned long long)ms.capacity,
          (unsigned long long)cap_r);
    /* at least every value flush gives bytes back; with eager values, every
     * key flush whose new slot (a key and a value page per head) is smaller
     * than the G fp16 keys per head it frees (not so for 8-bit pages); fp16's
     * pages take what its tails held, so it never falls */
    int S = m->fp16 ? 0 : m->sink, R = m->fp16 ? 0 : m->window, G = m->group;
    size_t kpage = kkv_method_key_page_bytes(m, D, kkv_method_boost(m, D));
    int key_drop = kpage + kkv_value_page_bytes(D, G, m->value_bits) < (size_t)2 * G * D;
    int flushes = m->eager_values ? (key_drop ? (T - S) / G : 0)
                                  : T - S > R ? (T - S - R) / G : 0;
    CHECK(m->fp16 ? drops == 0 : drops >= flushes && (drops > 0 || flushes == 0),
          "%s: capacity fell %d times in %d tokens", what, drops, T);
    kkv_cache_free(c);
}

/* The state and every attention output are the same for 1 and 3 attention
 * threads, token-major and layer-major feeding with flushes left out, and for
 * forks made from either. */
static void test_invariance(const kkv_method *m, const char *what) {
    kkv_cache *a = mk_t(m, 32u << 20, 1), *b = mk_t(m, 32u << 20, 3);
    if (!a || !b) return;
    int sa = -1, sb = -1, ca = -1, cb = -1;
    kkv_seq_add(a, &sa);
    kkv_seq_add(b, &sb);
    CHECK(feed(a, sa, 0, 37, NULL) == KKV_OK, "feed: %s", kkv_last_error());
    float k[H * D], v[H * D], q[NQ * D];
    for (int l = L - 1; l >= 0; l--)
        for (int t = 0; t < 37; t++) {
            data(k, v, q, t, l);
            CHECK(kkv_append(b, sb, l, k, v) == KKV_OK, "append: %s", kkv_last_error());
            if (t % 3 == 1) kkv_flush(b, sb, l);
        }
    for (int l = 0; l < L; l++) kkv_flush(b, sb, l);
    CHECK(same_contents(a, sa, b, sb), "%s: chunking or threads changed the state", what);
    CHECK(kkv_seq_fork(a, &ca, sa) == KKV_OK && kkv_seq_fork(b, &cb, sb) == KKV_OK, "fork: %s",
          kkv_last_error());
    uint64_t h[4] = {0, 0, 0, 0};
    feed(a, ca, 37, 80, &h[0]);
    feed(b, cb, 37, 80, &h[1]);
    feed(a, sa, 37, 80, &h[2]);
    feed(b, sb, 37, 80, &h[3]);
    CHECK(h[0] == h[1] && h[1] == h[2] && h[2] == h[3] && same_contents(a, ca, b, cb) &&
              same_contents(a, sa, b, cb), "%s: forks differ across threads or chunking", what);
    kkv_cache_free(a);
    kkv_cache_free(b);
}

/* ---------------------------------------------------------------- save / load */

static uint8_t *save(const kkv_cache *c, int seq, const kkv_state_meta *meta, size_t *n) {
    CHECK(kkv_seq_save(c, NULL, 0, n, seq, meta) == KKV_OK, "size: %s", kkv_last_error());
    uint8_t *b = malloc(*n);
    CHECK(kkv_seq_save(c, b, *n, n, seq, meta) == KKV_OK, "save: %s", kkv_last_error());
    return b;
}

static void test_state(const kkv_method *m, const char *what, int T, int exhaustive) {
    kkv_cache *c = mk(m, 32u << 20);
    if (!c) return;
    int s, ref;
    kkv_seq_add(c, &s);
    kkv_seq_add(c, &ref);
    feed(c, s, 0, T, NULL);
    feed(c, ref, 0, T, NULL);
    int32_t toks[3] = {7, 8, 9};
    kkv_state_meta meta = {0x1234abcdull, toks, 3};
    size_t n;
    uint8_t *st = save(c, s, &meta, &n);
    kkv_mem mem;
    kkv_seq_mem(c, &mem, s);
    CHECK(n <= mem.total + 96 + 8 + 12 + 12 * L, "%s: state %zu bytes, sequence %llu", what, n,
          (unsigned long long)mem.total);
    int32_t got[3] = {0, 0, 0};
    int nt = -1, ld = -1;
    CHECK(kkv_seq_load(c, &ld, st, n, 0x1234abcdull, got, 3, &nt) == KKV_OK, "%s load: %s", what,
          kkv_last_error());
    CHECK(nt == 3 && got[0] == 7 && got[2] == 9, "tokens");
    CHECK(same_contents(c, s, c, ld), "%s: loaded sequence differs", what);
    size_t n2;
    uint8_t *st2 = save(c, ld, &meta, &n2);
    CHECK(n2 == n && !memcmp(st, st2, n), "%s: save -> load -> save differs", what);
    free(st2);
    uint64_t h1 = 0, h2 = 0;
    feed(c, ref, T, T + 40, &h1);
    feed(c, ld, T, T + 40, &h2);
    CHECK(h1 == h2 && same_contents(c, ref, c, ld), "%s: loaded sequence continues otherwise", what);
    /* a file */
    const char *path = "test_capacity.state";
    CHECK(kkv_seq_save_file(c, path, s, &meta) == KKV_OK, "save file: %s", kkv_last_error());
    int lf;
    CHECK(kkv_seq_load_file(c, &lf, path, 0x1234abcdull, NULL, 0, NULL) == KKV_OK, "load file: %s",
          kkv_last_error());
    CHECK(same_contents(c, s, c, lf), "file round trip");
    remove(path);
    CHECK(kkv_seq_load_file(c, &lf, "/nonexistent/x", 0, NULL, 0, NULL) == KKV_ERR_IO, "no file");
    /* saves that cannot happen: nothing written, nothing left behind */
    CHECK(kkv_seq_save_file(c, "/nonexistent/x", s, &meta) == KKV_ERR_IO &&
              strstr(kkv_last_error(), "cannot create"), "save into no folder: %s", kkv_last_error());
    const char *dir = "test_capacity.dir"; /* rename onto a folder fails after the write */
    CHECK(mkdir(dir, 0700) == 0, "mkdir %s", dir);
    CHECK(kkv_seq_save_file(c, dir, s, &meta) == KKV_ERR_IO && strstr(kkv_last_error(), "cannot write") &&
              access("test_capacity.dir.tmp", F_OK) != 0, "save onto a folder: %s", kkv_last_error());
    rmdir(dir);
    size_t small = 0;
    uint8_t one_byte[1];
    CHECK(kkv_seq_save(c, one_byte, sizeof one_byte, &small, s, &meta) == KKV_ERR_INVALID_ARG &&
              small == n && strstr(kkv_last_error(), "buffer of 1 bytes"), "small buffer: %s", kkv_last_error());
    kkv_state_meta bad_meta[2] = {{0x1234abcdull, toks, -1}, {0x1234abcdull, NULL, 2}};
    for (int i = 0; i < 2; i++)
        CHECK(kkv_seq_save(c, NULL, 0, &small, s, &bad_meta[i]) == KKV_ERR_INVALID_ARG &&
                  strstr(kkv_last_error(), "bad token list"), "token list %d: %s", i, kkv_last_error());
    kkv_seq_free(c, lf);
    kkv_seq_free(c, ld);

    /* corruption: the cache exactly as before, a one-line reason */
    uint64_t fb = kkv_cache_free_bytes(c);
    int next = -1;
    kkv_seq_add(c, &next);
    kkv_seq_free(c, next);
    uint8_t *bad = malloc(n);
    int flips = 0;
    for (size_t i = 0; i < n; i += exhaustive ? 1 : 1 + i / 16) {
        memcpy(bad, st, n);
        bad[i] ^= (uint8_t)(1u << (i % 8));
        int x = -5;
        kkv_status r = kkv_seq_load(c, &x, bad, n, 0x1234abcdull, NULL, 0, NULL);
        if (r != KKV_ERR_FORMAT || x != -5 || !*kkv_last_error() || strchr(kkv_last_error(), '\n')) {
            CHECK(0, "%s: flipped byte %zu: status %d (%s)", what, i, (int)r, kkv_last_error());
            break;
        }
        flips++;
    }
    for (size_t len = 0; len < n; len += exhaustive ? 1 : 1 + len / 8) {
        int x = -5;
        kkv_status r = kkv_seq_load(c, &x, st, len, 0x1234abcdull, NULL, 0, NULL);
        if (r != KKV_ERR_FORMAT) {
            CHECK(0, "%s: truncated to %zu: status %d", what, len, (int)r);
            break;
        }
    }
    CHECK(kkv_seq_load(c, &ld, st, n, 0x999, NULL, 0, NULL) == KKV_ERR_FORMAT &&
              strstr(kkv_last_error(), "another model"), "fingerprint: %s", kkv_last_error());
    /* a future version, with a valid checksum */
    memcpy(bad, st, n);
    bad[8] = 2;
    CHECK(kkv_seq_load(c, &ld, bad, n, 0x1234abcdull, NULL, 0, NULL) == KKV_ERR_FORMAT &&
              strstr(kkv_last_error(), "version"), "future version: %s", kkv_last_error());
    int32_t one[1];
    CHECK(kkv_seq_load(c, &ld, st, n, 0x1234abcdull, one, 1, &nt) == KKV_ERR_INVALID_ARG && nt == 3,
          "small token buffer");
    int again;
    kkv_seq_add(c, &again);
    CHECK(again == next && kkv_cache_free_bytes(c) == fb, "failed loads changed the cache");
    kkv_seq_free(c, again);
    /* another method or shape */
    kkv_method other = *m;
    if (m->key_bits == 8) other.value_bits = m->value_bits == 8 ? 4 : 8; /* no alpha to change */
    else other.alpha = other.alpha > 0.5f ? 0.25f : 0.75f;
    other.fp16 = 0;
    kkv_cache *c2 = mk(&other, 32u << 20);
    CHECK(kkv_seq_load(c2, &ld, st, n, 0x1234abcdull, NULL, 0, NULL) == KKV_ERR_FORMAT,
          "other method accepted");
    kkv_cache_free(c2);
    kkv_cache_config cfg = *kkv_cache_get_config(c);
    cfg.n_kv_heads = 1;
    c2 = NULL;
    kkv_cache_create(&c2, &cfg);
    CHECK(kkv_seq_load(c2, &ld, st, n, 0x1234abcdull, NULL, 0, NULL) == KKV_ERR_FORMAT &&
              strstr(kkv_last_error(), "shape"), "other shape: %s", kkv_last_error());
    kkv_cache_free(c2);
    /* pool full during load */
    cfg = *kkv_cache_get_config(c);
    cfg.pool_bytes = mem.capacity / 2;
    c2 = NULL;
    kkv_cache_create(&c2, &cfg);
    uint64_t f2 = kkv_cache_free_bytes(c2);
    CHECK(kkv_seq_load(c2, &ld, st, n, 0x1234abcdull, NULL, 0, NULL) == KKV_ERR_POOL_FULL &&
              kkv_cache_free_bytes(c2) == f2, "pool-full load");
    kkv_cache_free(c2);
    free(bad);
    free(st);
    kkv_cache_free(c);
}

/* Copies of state st that c takes before a load fails; each freed again.
 * *last: the failing load's status. */
static int fill_count(kkv_cache *c, const uint8_t *st, size_t n, kkv_status *last) {
    int ids[64], k = 0;
    *last = KKV_OK;
    while (k < 64 && (*last = kkv_seq_load(c, &ids[k], st, n, 0x1234abcdull, NULL, 0, NULL)) == KKV_OK) k++;
    for (int i = 0; i < k; i++) kkv_seq_free(c, ids[i]);
    return k;
}

/* Corruptions the checksum cannot see, as a buggy writer or a hostile file
 * gives them: two bytes at a time (on a stride) set to 0x7FFF, an fp16 NaN
 * where they land on a scale, a minimum, a sink or a tail, an out-of-range
 * rank in a key page's index, an absurd count in the layer table, and the
 * XXH3 re-signed. (test_state's flips all stop at the checksum.) The loader
 * checks the page contents after it has taken the sequence's pool pages, so
 * each refusal must give them back: a leaked page would leave c->used alone
 * but hold a slot, so the test also fills the pool with good copies before
 * and after the sweep and wants the same number. */
static void test_resigned(const kkv_method *m, const char *what, int T, size_t stride) {
    kkv_cache *c = mk(m, 32u << 20);
    if (!c) return;
    int s;
    kkv_seq_add(c, &s);
    feed(c, s, 0, T, NULL);
    kkv_state_meta meta = {0x1234abcdull, NULL, 0};
    size_t n;
    uint8_t *st = save(c, s, &meta, &n);
    kkv_mem mem;
    kkv_seq_mem(c, &mem, s);
    kkv_cache_config cfg = *kkv_cache_get_config(c);
    kkv_cache_free(c);
    cfg.pool_bytes = 3 * mem.capacity + mem.capacity / 2; /* three copies fit, not four */
    c = NULL;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_OK, "%s: create: %s", what, kkv_last_error());
    if (!c) {
        free(st);
        return;
    }
    kkv_status last;
    int fill0 = fill_count(c, st, n, &last);
    CHECK(fill0 == 3 && last == KKV_ERR_POOL_FULL, "%s: %d copies fit (status %d)", what, fill0, (int)last);
    uint64_t fb = kkv_cache_free_bytes(c);
    uint8_t *bad = malloc(n);
    int refused = 0, accepted = 0, nonfinite = 0, index = 0, counts = 0;
    for (size_t i = 0; i + 10 <= n; i += stride) {
        memcpy(bad, st, n);
        bad[i] = 0xFF, bad[i + 1] = 0x7F;
        uint64_t h = XXH3_64bits(bad, n - 8);
        for (int b = 0; b < 8; b++) bad[n - 8 + b] = (uint8_t)(h >> (8 * b));
        int x = -5;
        kkv_status r = kkv_seq_load(c, &x, bad, n, 0x1234abcdull, NULL, 0, NULL);
        if (r == KKV_OK) { /* code bytes: any value is a valid code */
            accepted++;
            kkv_seq_free(c, x);
        } else {
            const char *e = kkv_last_error();
            refused++;
            nonfinite += strstr(e, "non-finite") != NULL;
            index += strstr(e, "index") != NULL;
            counts += strstr(e, "layer counts") != NULL || strstr(e, "longer than") != NULL;
            if ((r != KKV_ERR_FORMAT && r != KKV_ERR_POOL_FULL) || x != -5 || !*e || strchr(e, '\n')) {
                CHECK(0, "%s: 0x7FFF at byte %zu: status %d (%s)", what, i, (int)r, e);
                break;
            }
        }
        if (kkv_cache_free_bytes(c) != fb) {
            CHECK(0, "%s: 0x7FFF at byte %zu changed the free bytes (status %d)", what, i, (int)r);
            break;
        }
    }
    int fill1 = fill_count(c, st, n, &last);
    CHECK(fill1 == fill0 && last == KKV_ERR_POOL_FULL && kkv_cache_free_bytes(c) == fb,
          "%s: %d copies fit after the sweep, %d before: pages leaked", what, fill1, fill0);
    /* the checks behind the page contents ran: the sink's, tails' and
     * scales' NaN everywhere; an index only where keys have one */
    CHECK(refused > 0 && nonfinite > 0 && counts > 0, "%s: %d refused (%d non-finite, %d counts)", what,
          refused, nonfinite, counts);
    if (!m->fp16 && m->key_bits != 8) CHECK(index > 0, "%s: no index refusal", what);
    if (!m->fp16) CHECK(accepted > 0, "%s: no code byte accepted", what);
    free(bad);
    free(st);
    kkv_cache_free(c);
}

/* Seeds for tests/fuzz/fuzz_state (its cache shape): KKV_FUZZ_CORPUS=dir. */
static void write_corpus(const char *dir) {
    const int lens[] = {0, 3, 17, 40};
    for (int eager = 0; eager < 2; eager++)
        for (int i = 0; i < 4; i++) {
            kkv_method m = meth("kitty", 1, eager);
            kkv_cache *c = mk(&m, 1u << 20);
            int s;
            kkv_seq_add(c, &s);
            feed(c, s, 0, lens[i], NULL);
            int32_t toks[2] = {1, 2};
            kkv_state_meta meta = {0x1234abcdull, toks, 2};
            char path[512];
            snprintf(path, sizeof path, "%s/state_%s_%d", dir, eager ? "eager" : "paper", lens[i]);
            CHECK(kkv_seq_save_file(c, path, s, &meta) == KKV_OK, "%s", kkv_last_error());
            kkv_cache_free(c);
        }
}

/* A pool whose slots span several slabs (cache/cache.h: KKV_SLAB_BYTES; one
 * 2 MiB chunk each under ASan): every page of a long fp16 sequence reads back
 * exactly what was appended, so no two chunks overlap across a slab's edge,
 * and the pool's bytes leave room for the whole context. Values are
 * multiples of 1/64 in [-16, 16), exact in fp16. */
static float slab_val(int t, int h, int d, int which) {
    uint32_t x = (uint32_t)t * 2654435761u ^ (uint32_t)(h * 131 + d * 7 + which * 977) * 40503u;
    return (float)((x >> 7) % 2048u) / 64.0f - 16.0f;
}

#if defined(__linux__) && KKV_BIG_CARVE
/* 1 when the mapping holding p is advised MADV_HUGEPAGE ("hg" in its smaps
 * VmFlags), 0 when not, -1 when /proc/self/smaps cannot say. */
static int vma_advised_huge(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, r = -1;
    uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) in = a >= lo && a < hi;
        else if (in && strncmp(line, "VmFlags:", 8) == 0) {
            r = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return r;
}
#endif

/* core/bigmem.h: zeroed, writable to its last byte, 2 MiB-aligned on the
 * huge-page path and advised huge unless KKV_HUGEPAGES=0; no block for 0 or
 * absurd sizes; NULL frees as a no-op. */
static void test_big_alloc(void) {
    size_t sizes[] = {1, 4096, KKV_BIG_ALIGN - 1, KKV_BIG_ALIGN, 3 * KKV_BIG_ALIGN + 5};
    for (int i = 0; i < 5; i++) {
        uint8_t *p = kkv_big_alloc(sizes[i]);
        CHECK(p != NULL, "big_alloc %zu: NULL", sizes[i]);
        if (!p) continue;
        size_t nz = 0;
        for (size_t j = 0; j < sizes[i]; j++) nz += p[j] != 0;
        CHECK(nz == 0, "big_alloc %zu: %zu bytes not zero", sizes[i], nz);
        memset(p, 0xA5, sizes[i]);
        CHECK((uintptr_t)p % 64 == 0, "big_alloc %zu: %p not 64-byte aligned", sizes[i], (void *)p);
#if defined(__linux__) && KKV_BIG_CARVE
        CHECK((uintptr_t)p % KKV_BIG_ALIGN == 0, "big_alloc %zu: %p not 2 MiB-aligned", sizes[i], (void *)p);
#endif
        kkv_big_free(p, sizes[i]);
    }
#if defined(__linux__) && KKV_BIG_CARVE
    /* the advice is on the mapping (smaps VmFlags "hg"), and KKV_HUGEPAGES=0
     * leaves it off; where the kernel has no THP at all, madvise fails and
     * there is nothing to see */
    FILE *thp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (thp) {
        fclose(thp);
        /* both cases whatever the caller's environment says; theirs put back after */
        const char *was = getenv("KKV_HUGEPAGES"); /* invalid once the variable changes: copied */
        char *saved = was ? strdup(was) : NULL;
        CHECK(!was || saved, "out of memory copying KKV_HUGEPAGES");
        for (int off = 0; off < 2; off++) {
            if (off) setenv("KKV_HUGEPAGES", "0", 1);
            else unsetenv("KKV_HUGEPAGES");
            uint8_t *p = kkv_big_alloc(KKV_BIG_ALIGN);
            int hg = p ? vma_advised_huge(p) : -1;
            CHECK(hg == !off, "big_alloc with KKV_HUGEPAGES %s: VmFlags hg %d", off ? "0" : "unset", hg);
            kkv_big_free(p, KKV_BIG_ALIGN);
        }
        if (saved) setenv("KKV_HUGEPAGES", saved, 1);
        else unsetenv("KKV_HUGEPAGES");
        free(saved);
    }
#endif
    CHECK(kkv_big_alloc(0) == NULL, "big_alloc 0: a block");
    CHECK(kkv_big_alloc(SIZE_MAX) == NULL && kkv_big_alloc(SIZE_MAX / 2 + 1) == NULL, "big_alloc: a block of SIZE_MAX");
    kkv_big_free(NULL, 0);
    kkv_big_free(NULL, 1 << 20);
}

static void test_slabs(void) {
    enum { SH = 4, SD = 128, ST = 34000 };
    kkv_method m = meth("fp16", 0, 0);
    m.group = 16; /* a slot is 4 heads x 2 x 16 x 128 x 2 B = 32 KiB; a chunk 2 MiB */
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = SH, .head_dim = SD,
                            .pool_bytes = (size_t)80 << 20, .n_threads = 1, .method = m};
    kkv_cache *c = NULL;
    CHECK(kkv_cache_create(&c, &cfg) == KKV_OK, "slabs: create: %s", kkv_last_error());
    if (!c) return;
    int s = -1;
    CHECK(kkv_seq_add(c, &s) == KKV_OK, "slabs: seq_add: %s", kkv_last_error());
    static float k[SH * SD], v[SH * SD]; /* [H][D] */
    for (int t = 0; t < ST && !tu_failed(); t++) {
        for (int h = 0; h < SH; h++)
            for (int d = 0; d < SD; d++) k[h * SD + d] = slab_val(t, h, d, 0), v[h * SD + d] = slab_val(t, h, d, 1);
        CHECK(kkv_append(c, s, 0, k, v) == KKV_OK, "slabs: append %d: %s", t, kkv_last_error());
    }
    float *rk = malloc((size_t)ST * SD * sizeof *rk), *rv = malloc((size_t)ST * SD * sizeof *rv); /* [T][D] */
    CHECK(rk && rv && kkv_seq_len(c, s, 0) == ST, "slabs: %d tokens", kkv_seq_len(c, s, 0));
    for (int h = 0; h < SH && rk && rv && !tu_failed(); h++) {
        CHECK(kkv_seq_read(c, rk, rv, s, 0, h) == KKV_OK, "slabs: read: %s", kkv_last_error());
        long bad = 0;
        for (int t = 0; t < ST; t++)
            for (int d = 0; d < SD; d++)
                bad += rk[(size_t)t * SD + d] != slab_val(t, h, d, 0) || rv[(size_t)t * SD + d] != slab_val(t, h, d, 1);
        CHECK(bad == 0, "slabs: head %d: %ld values differ from what was appended", h, bad);
    }
    free(rk);
    free(rv);
    kkv_cache_free(c);
}

int main(void) {
    if (getenv("KKV_FUZZ_CORPUS")) {
        write_corpus(getenv("KKV_FUZZ_CORPUS"));
        return tu_summary();
    }
    test_eager();
    test_fork();
    test_big_alloc();
    test_slabs();
    const char *rel[] = {"kitty", "fp16", "kivi-k2v4s", "kivi-k8v8", "kitty:sink8=1"};
    for (int mi = 0; mi < 5; mi++)
        for (int eager = 0; eager < 2; eager++) {
            kkv_method m = meth(rel[mi], 1, eager), big = meth(rel[mi], 0, eager);
            test_release(&m, rel[mi], 70, 1);
            test_release(&big, rel[mi], 32 + 3 * 128 + 40, 37);
            test_invariance(&m, rel[mi]);
            test_invariance(&big, rel[mi]);
        }
    const char *names[] = {"kitty", "kitty-pro", "fp16", "kivi-k2v4s", "kivi-k8v8",
                           "kitty:sink8=1"};
    for (int mi = 0; mi < 6; mi++)
        for (int eager = 0; eager < 2; eager++) {
            kkv_method m = meth(names[mi], 1, eager);
            test_state(&m, names[mi], 61, mi == 0);
            kkv_method big = meth(names[mi], 0, eager);
            test_state(&big, names[mi], 300, 0);
            test_resigned(&m, names[mi], 61, 1);
            test_resigned(&big, names[mi], 300, 7);
        }
    return tu_summary();
}
