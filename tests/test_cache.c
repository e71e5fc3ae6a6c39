/* Cache tests: the token lifecycle of docs/FORMAT.md section 3 for every method, exact
 * byte accounting (docs/FORMAT.md section 2), chunking/flush/layer-order invariance,
 * the page pool (exhaustion, all-or-nothing, reuse), limits, and non-finite
 * input. Expectations come from the spec's counts and the public page codecs;
 * tests/oracle/test_quant.py checks those codecs against numpy. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_model.h"
#include "testutil.h"

/* ---------------------------------------------------------------- helpers */

/* Spec 6 counts after N tokens, each step append -> flush. */
typedef struct counts {
    int sink, kp, ktail, vp, vtail;
} counts;

static counts counts_of(const kkv_method *m, int N) {
    counts c;
    int S = m->fp16 ? 0 : m->sink, G = m->group, R = m->fp16 ? 0 : m->window;
    c.sink = N < S ? N : S;
    int n = N - c.sink;
    c.kp = n / G;
    c.ktail = n - c.kp * G;
    c.vp = n > R ? (n - R) / G : 0;
    c.vtail = n - c.vp * G;
    return c;
}

/* Bytes by component that L layers x H heads of N tokens must hold. */
static kkv_mem expect_mem(const kkv_method *m, int D, int L, int H, int N) {
    kkv_mem e;
    memset(&e, 0, sizeof e);
    uint64_t G = (uint64_t)m->group, LH = (uint64_t)L * H, d = (uint64_t)D;
    if (m->fp16) {
        e.fp16 = (uint64_t)N * LH * d * 2 * 2;
    } else {
        counts c = counts_of(m, N);
        uint64_t nb = (uint64_t)kkv_method_boost(m, D);
        e.key_lo = c.kp * LH * d * G / 4;
        e.key_hi = c.kp * LH * nb * G / 4;
        e.key_idx = c.kp * LH * d;
        e.key_meta = c.kp * LH * 4 * d;
        e.value_codes = c.vp * LH * G * d * (uint64_t)m->value_bits / 8;
        e.value_meta = c.vp * LH * 4 * G;
        e.fp16 = (uint64_t)(2 * c.sink + c.ktail + c.vtail) * LH * d * 2;
    }
    e.total = e.key_lo + e.key_hi + e.key_idx + e.key_meta + e.value_codes + e.value_meta + e.fp16;
    e.tokens = (uint64_t)N;
    e.bits_per_element = N ? 8.0 * (double)e.total / (2.0 * N * L * H * D) : 0.0;
    return e;
}

static int mem_eq(const kkv_mem *a, const kkv_mem *b) {
    return a->key_lo == b->key_lo && a->key_hi == b->key_hi && a->key_idx == b->key_idx &&
           a->key_meta == b->key_meta && a->value_codes == b->value_codes &&
           a->value_meta == b->value_meta && a->fp16 == b->fp16 && a->total == b->total &&
           a->tokens == b->tokens;
}

static void mem_print(const char *what, const kkv_mem *m) {
    fprintf(stderr,
            "  %s: lo %llu hi %llu idx %llu kmeta %llu vcodes %llu vmeta %llu fp16 %llu total "
            "%llu tokens %llu bpe %.6f\n",
            what, (unsigned long long)m->key_lo, (unsigned long long)m->key_hi,
            (unsigned long long)m->key_idx, (unsigned long long)m->key_meta,
            (unsigned long long)m->value_codes, (unsigned long long)m->value_meta,
            (unsigned long long)m->fp16, (unsigned long long)m->total,
            (unsigned long long)m->tokens, m->bits_per_element);
}

/* What kkv_seq_read must return for one head that received N tokens x, y
 * ([N][D] each, rows `stride` floats apart): fp16 rounding everywhere, and
 * the spec-6 pages replaced by their round trip through the public codecs
 * (magnitude selection only: random selection is seeded internally).
 * ek, ev: [N][D] out. */
static void expect_head(float *ek, float *ev, const float *x, const float *y, size_t stride,
                        int N, int D, const kkv_method *m) {
    for (int t = 0; t < N; t++)
        for (int j = 0; j < D; j++) {
            ek[(size_t)t * D + j] = kkv_f16_round(x[t * stride + j]);
            ev[(size_t)t * D + j] = kkv_f16_round(y[t * stride + j]);
        }
    if (m->fp16) return;
    counts c = counts_of(m, N);
    int G = m->group, nb = kkv_method_boost(m, D);
    uint8_t *page = malloc(kkv_key_page_bytes(D, G, D) + kkv_value_page_bytes(D, G, 4));
    for (int p = 0; p < c.kp; p++) {
        float *blk = ek + ((size_t)c.sink + (size_t)p * G) * D;
        kkv_key_page_encode(page, blk, D, G, nb, KKV_SELECT_MAGNITUDE, 0, (uint64_t)p, NULL);
        kkv_key_page_decode(blk, page, D, G, nb);
    }
    for (int p = 0; p < c.vp; p++) {
        float *blk = ev + ((size_t)c.sink + (size_t)p * G) * D;
        kkv_value_page_encode(page, blk, D, G, m->value_bits);
        kkv_value_page_decode(blk, page, D, G, m->value_bits);
    }
    free(page);
}

static void fill_normal(float *x, size_t n, tu_rng *r, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * tu_normal(r);
}

static kkv_cache *make_cache(const kkv_method *m, int L, int H, int D, size_t pool,
                             int max_seqs, int max_tokens) {
    kkv_cache_config cfg = {.n_layers = L, .n_kv_heads = H, .head_dim = D, .pool_bytes = pool,
                            .max_seqs = max_seqs, .max_tokens = max_tokens, .method = *m};
    kkv_cache *c = NULL;
    kkv_status s = kkv_cache_create(&c, &cfg);
    CHECK(s == KKV_OK && c, "cache_create: %s", kkv_last_error());
    return c;
}

static kkv_method method(const char *name) {
    kkv_method m;
    kkv_status s = kkv_method_from_name(&m, name);
    CHECK(s == KKV_OK, "method %s: %s", name, kkv_last_error());
    return m;
}

/* A snapshot of everything observable about one sequence. */
typedef struct snap {
    int len[4];
    kkv_mem mem;
    float *kv; /* [L][H][2][len][D] */
    size_t n;
} snap;

static snap take_snap(const kkv_cache *c, int seq) {
    const kkv_cache_config *cfg = kkv_cache_get_config(c);
    int L = cfg->n_layers, H = cfg->n_kv_heads, D = cfg->head_dim;
    snap s;
    memset(&s, 0, sizeof s);
    size_t total = 0;
    for (int l = 0; l < L && l < 4; l++) {
        s.len[l] = kkv_seq_len(c, seq, l);
        total += (size_t)H * 2 * (size_t)(s.len[l] > 0 ? s.len[l] : 0) * D;
    }
    kkv_seq_mem(c, &s.mem, seq);
    s.kv = calloc(total + 1, sizeof *s.kv);
    s.n = total;
    float *o = s.kv;
    for (int l = 0; l < L && l < 4; l++)
        for (int h = 0; h < H; h++) {
            size_t n = (size_t)(s.len[l] > 0 ? s.len[l] : 0) * D;
            kkv_seq_read(c, o, o + n, seq, l, h);
            o += 2 * n;
        }
    return s;
}

/* Same contents; the pool bytes held may differ (a sequence's credit is the
 * peak it has needed, which depends on the order of its appends). */
static int snap_same_content(const snap *a, const snap *b) {
    return !memcmp(a->len, b->len, sizeof a->len) && mem_eq(&a->mem, &b->mem) && a->n == b->n &&
           !memcmp(a->kv, b->kv, a->n * sizeof *a->kv);
}

static int snap_eq(const snap *a, const snap *b) {
    return !memcmp(a->len, b->len, sizeof a->len) && mem_eq(&a->mem, &b->mem) &&
           a->mem.capacity == b->mem.capacity && a->n == b->n &&
           !memcmp(a->kv, b->kv, a->n * sizeof *a->kv);
}

/* ---------------------------------------------------------------- lifecycle */

static int is_checkpoint(int N, const kkv_method *m, int Tmax) {
    int S = m->fp16 ? 0 : m->sink, G = m->group, R = m->fp16 ? 0 : m->window;
    const int at[] = {1,         S - 1,         S,         S + 1,         S + G - 1,
                      S + G,     S + G + 1,     S + R - 1, S + R,         S + R + 1,
                      S + 2 * G, S + R + G - 1, S + R + G, S + R + G + 1, S + R + 2 * G - 1,
                      S + R + 2 * G, S + R + 2 * G + 1, S + 3 * G, Tmax};
    for (size_t i = 0; i < sizeof at / sizeof *at; i++)
        if (N == at[i]) return 1;
    return 0;
}

static void lifecycle(const char *name, int D) {
    enum { L = 2, H = 2 };
    kkv_method m = method(name);
    int S = m.fp16 ? 0 : m.sink, G = m.group, R = m.fp16 ? 0 : m.window;
    int Tmax = S + R + 3 * G + 3;
    size_t row = (size_t)H * D;
    float *k = malloc((size_t)L * Tmax * row * sizeof *k); /* [L][Tmax][H][D] */
    float *v = malloc((size_t)L * Tmax * row * sizeof *v);
    float *rk = malloc((size_t)Tmax * D * sizeof *rk);     /* [Tmax][D] read back */
    float *rv = malloc((size_t)Tmax * D * sizeof *rv);
    float *ek = malloc((size_t)Tmax * D * sizeof *ek);     /* expected */
    float *ev = malloc((size_t)Tmax * D * sizeof *ev);
    tu_rng r = tu_rng_make(1000u + (uint64_t)D);
    fill_normal(k, (size_t)L * Tmax * row, &r, 2.0f);
    fill_normal(v, (size_t)L * Tmax * row, &r, 1.0f);
    kkv_cache *c = make_cache(&m, L, H, D, 64u << 20, 0, 0);
    int seq = -1;
    CHECK(c && kkv_seq_add(c, &seq) == KKV_OK, "seq_add: %s", kkv_last_error());
    int fails = 0;
    for (int t = 0; c && t < Tmax && fails < 5; t++) {
        for (int l = 0; l < L; l++) {
            kkv_status s = kkv_append(c, seq, l, k + ((size_t)l * Tmax + t) * row,
                                      v + ((size_t)l * Tmax + t) * row);
            CHECK(s == KKV_OK, "%s append t=%d: %s", name, t, kkv_last_error());
            CHECK(kkv_flush(c, seq, l) == KKV_OK, "flush: %s", kkv_last_error());
        }
        int N = t + 1;
        kkv_mem got, want = expect_mem(&m, D, L, H, N);
        kkv_seq_mem(c, &got, seq);
        if (!mem_eq(&got, &want) || fabs(got.bits_per_element - want.bits_per_element) > 1e-9) {
            CHECK(0, "%s D=%d N=%d: seq_mem differs from the spec's byte formulas", name, D, N);
            mem_print("got ", &got);
            mem_print("want", &want);
            fails++;
        }
        CHECK(kkv_seq_len(c, seq, 0) == N && kkv_seq_len(c, seq, 1) == N, "seq_len != %d", N);
        if (!is_checkpoint(N, &m, Tmax)) continue;
        counts cn = counts_of(&m, N);
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++) {
                const float *x = k + (size_t)l * Tmax * row + (size_t)h * D;
                const float *y = v + (size_t)l * Tmax * row + (size_t)h * D;
                CHECK(kkv_seq_read(c, rk, rv, seq, l, h) == KKV_OK, "read: %s", kkv_last_error());
                expect_head(ek, ev, x, y, row, N, D, &m);
                for (int tt = 0; tt < N; tt++) {
                    int kpaged = !m.fp16 && tt >= cn.sink && tt < cn.sink + cn.kp * G;
                    int vpaged = !m.fp16 && tt >= cn.sink && tt < cn.sink + cn.vp * G;
                    int k16 = 1, v16 = 1;
                    for (int j = 0; j < D; j++) {
                        k16 &= rk[(size_t)tt * D + j] == kkv_f16_round(x[tt * row + j]);
                        v16 &= rv[(size_t)tt * D + j] == kkv_f16_round(y[tt * row + j]);
                    }
                    if (k16 == kpaged || v16 == vpaged) {
                        CHECK(0, "%s D=%d N=%d l%d h%d token %d: key %s (want %s), value %s (want %s)",
                              name, D, N, l, h, tt, k16 ? "fp16" : "quantized",
                              kpaged ? "quantized" : "fp16", v16 ? "fp16" : "quantized",
                              vpaged ? "quantized" : "fp16");
                        fails++;
                        break;
                    }
                }
                CHECK(!memcmp(rk, ek, (size_t)N * D * sizeof *rk) &&
                          !memcmp(rv, ev, (size_t)N * D * sizeof *rv),
                      "%s D=%d N=%d l%d h%d: read-back differs from the spec-6 expectation", name,
                      D, N, l, h);
            }
    }
    kkv_cache_free(c);
    free(k);
    free(v);
    free(rk);
    free(rv);
    free(ek);
    free(ev);
}

/* ---------------------------------------------------------------- invariance */

enum { ORDER_TOKEN_MAJOR, ORDER_LAYER_MAJOR, ORDER_RANDOM };

/* Appends T tokens to every layer of a fresh sequence in the given order, with
 * flushes after every step (flush_p = 100), never (0: one final flush per
 * layer) or at random (percent). The final state must not depend on either. */
static void fill_cache(kkv_cache *c, int *seq, const float *k, const float *v, int T, int order,
                       int flush_p, uint64_t seed) {
    const kkv_cache_config *cfg = kkv_cache_get_config(c);
    int L = cfg->n_layers;
    size_t row = (size_t)cfg->n_kv_heads * cfg->head_dim;
    tu_rng r = tu_rng_make(seed);
    CHECK(kkv_seq_add(c, seq) == KKV_OK, "seq_add: %s", kkv_last_error());
    int *done = calloc((size_t)L, sizeof *done);
    int left = T * L;
    while (left > 0) {
        int l;
        if (order == ORDER_TOKEN_MAJOR) l = (T * L - left) % L;
        else if (order == ORDER_LAYER_MAJOR) l = (T * L - left) / T;
        else
            do l = tu_int(&r, L);
            while (done[l] == T);
        int t = done[l]++;
        left--;
        kkv_status s = kkv_append(c, *seq, l, k + ((size_t)l * T + t) * row,
                                  v + ((size_t)l * T + t) * row);
        CHECK(s == KKV_OK, "append: %s", kkv_last_error());
        if (flush_p == 100 || (flush_p > 0 && tu_int(&r, 100) < flush_p))
            CHECK(kkv_flush(c, *seq, l) == KKV_OK, "flush: %s", kkv_last_error());
    }
    for (int l = 0; l < L; l++) kkv_flush(c, *seq, l);
    free(done);
}

static void invariance(const char *name, kkv_select sel) {
    enum { L = 3, H = 2, D = 32 };
    kkv_method m = method(name);
    m.select = sel;
    m.seed = 77;
    const int Ts[] = {1, 200, 32 + 128 + 128 + 128 * 2 + 17};
    for (size_t ti = 0; ti < sizeof Ts / sizeof *Ts; ti++) {
        int T = Ts[ti];
        size_t n = (size_t)L * T * H * D;
        float *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
        tu_rng r = tu_rng_make(5 + ti);
        fill_normal(k, n, &r, 3.0f);
        fill_normal(v, n, &r, 1.0f);
        const int orders[4][2] = {{ORDER_TOKEN_MAJOR, 100},
                                  {ORDER_LAYER_MAJOR, 0},
                                  {ORDER_RANDOM, 30},
                                  {ORDER_LAYER_MAJOR, 100}};
        snap ref;
        memset(&ref, 0, sizeof ref);
        uint8_t *pa = malloc(kkv_key_page_bytes(D, m.group, D) + 64);
        uint8_t *pb = malloc(kkv_key_page_bytes(D, m.group, D) + 64);
        kkv_cache *c0 = NULL;
        int s0 = -1;
        for (int o = 0; o < 4; o++) {
            kkv_cache *c = make_cache(&m, L, H, D, 32u << 20, 0, 0);
            int seq = -1;
            if (!c) break;
            if (o == 3) { /* a reserved sequence behind a discarded one */
                int junk;
                kkv_seq_add(c, &junk);
                kkv_seq_reserve(c, junk, 300);
                kkv_seq_free(c, junk);
                CHECK(kkv_seq_add(c, &junk) == KKV_OK, "seq_add");
                CHECK(kkv_seq_reserve(c, junk, T) == KKV_OK, "reserve: %s", kkv_last_error());
            }
            fill_cache(c, &seq, k, v, T, orders[o][0], orders[o][1], 9 + (uint64_t)o);
            snap s = take_snap(c, seq);
            if (o == 0) {
                ref = s;
                c0 = c;
                s0 = seq;
                continue;
            }
            CHECK(snap_same_content(&ref, &s), "%s sel %d T=%d: order %d / flush %d%% changes the state",
                  name, (int)sel, T, orders[o][0], orders[o][1]);
            int same = 1;
            if (!m.fp16)
                for (int l = 0; l < L; l++)
                    for (int h = 0; h < H; h++)
                        for (int p = 0; p < counts_of(&m, T).kp; p++) {
                            size_t kb = kkv_key_page_bytes(D, m.group, kkv_method_boost(&m, D));
                            CHECK(kkv_seq_key_page(c0, pa, kb, s0, l, h, p) == KKV_OK,
                                  "key_page: %s", kkv_last_error());
                            CHECK(kkv_seq_key_page(c, pb, kb, seq, l, h, p) == KKV_OK,
                                  "key_page: %s", kkv_last_error());
                            same &= !memcmp(pa, pb, kb);
                        }
            CHECK(same, "%s sel %d T=%d order %d: key page bytes differ", name, (int)sel, T, o);
            free(s.kv);
            kkv_cache_free(c);
        }
        free(ref.kv);
        kkv_cache_free(c0);
        free(pa);
        free(pb);
        free(k);
        free(v);
    }
}

/* ---------------------------------------------------------------- pool */

/* Appends n tokens to every layer of seq, token-major, flushing each step;
 * returns the first failing status. */
static kkv_status feed(kkv_cache *c, int seq, int n, tu_rng *r) {
    const kkv_cache_config *cfg = kkv_cache_get_config(c);
    size_t row = (size_t)cfg->n_kv_heads * cfg->head_dim;
    float kv[2][4 * 64];
    for (int t = 0; t < n; t++)
        for (int l = 0; l < cfg->n_layers; l++) {
            fill_normal(kv[0], row, r, 1.0f);
            fill_normal(kv[1], row, r, 1.0f);
            kkv_status s = kkv_append(c, seq, l, kv[0], kv[1]);
            if (s == KKV_OK) s = kkv_flush(c, seq, l);
            if (s != KKV_OK) return s;
        }
    return KKV_OK;
}

/* Staging on demand (issue 13): the pool bytes a sequence holds follow its
 * length in chunks; kkv_seq_reserve(n) takes exactly the peak that n more
 * tokens reach, no more and no less; pool-full is all or nothing. */
static void test_pool(void) {
    enum { L = 2, H = 2, D = 16 };
    const char *names[] = {"kitty", "fp16", "kivi-k2v4s"};
    for (int mi = 0; mi < 3; mi++) {
        for (int eager = 0; eager < 2; eager++) {
            kkv_method m = method(names[mi]);
            m.eager_values = eager;
            int S = m.fp16 ? 0 : m.sink, G = m.group;
            uint64_t tok = (uint64_t)L * H * D * 2; /* one fp16 K or V row, all layers/heads */
            uint64_t slot = (uint64_t)L * H *
                            (m.fp16 ? 2u * G * D * 2
                                    : kkv_key_page_bytes(D, G, kkv_method_boost(&m, D)) +
                                          kkv_value_page_bytes(D, G, m.value_bits));
            kkv_cache *c = make_cache(&m, L, H, D, 64u << 20, 0, 0);
            if (!c) return;
            uint64_t f0 = kkv_cache_free_bytes(c);
            int a, b;
            tu_rng r = tu_rng_make(31);
            CHECK(kkv_seq_add(c, &a) == KKV_OK && kkv_cache_free_bytes(c) == f0,
                  "an empty sequence takes pool bytes");
            CHECK(feed(c, a, 10, &r) == KKV_OK, "feed");
            kkv_mem mem;
            kkv_seq_mem(c, &mem, a);
            /* 10 tokens: one 16-token chunk of sink K and V (fp16: of key and value tail) */
            CHECK(mem.capacity == 2 * 16 * tok, "%s: 10 tokens hold %llu bytes, want %llu",
                  names[mi], (unsigned long long)mem.capacity, (unsigned long long)(32 * tok));
            CHECK(f0 - kkv_cache_free_bytes(c) == mem.capacity, "pool and sequence disagree");
            /* reserve is exact: the same bytes as growing on demand in step */
            const int ns[] = {1, S + G - 1, S + G, S + 3 * G + 5, 1000};
            for (int i = 0; i < 5; i++) {
                int n = ns[i];
                int x, y;
                kkv_seq_add(c, &x);
                kkv_seq_add(c, &y);
                tu_rng r1 = tu_rng_make(5), r2 = tu_rng_make(5);
                CHECK(kkv_seq_reserve(c, x, n) == KKV_OK, "reserve: %s", kkv_last_error());
                uint64_t fx = kkv_cache_free_bytes(c);
                CHECK(feed(c, x, n, &r1) == KKV_OK, "feed");
                /* nothing more from the pool; once the reservation is used up
                 * its surplus (staging the last flushes freed) comes back */
                CHECK(kkv_cache_free_bytes(c) >= fx, "%s n=%d: appends after reserve took %lld more",
                      names[mi], n, (long long)(fx - kkv_cache_free_bytes(c)));
                CHECK(feed(c, y, n, &r2) == KKV_OK, "feed");
                kkv_mem mx, my;
                kkv_seq_mem(c, &mx, x);
                kkv_seq_mem(c, &my, y);
                CHECK(mx.capacity == my.capacity, "%s eager %d n=%d: reserve took %llu, on demand "
                      "%llu", names[mi], eager, n, (unsigned long long)mx.capacity,
                      (unsigned long long)my.capacity);
                kkv_seq_free(c, x);
                kkv_seq_free(c, y);
            }
            CHECK(kkv_seq_free(c, a) == KKV_OK && kkv_cache_free_bytes(c) == f0, "pool back");
            CHECK(kkv_seq_free(c, a) == KKV_ERR_NOT_FOUND, "double free accepted");
            CHECK(kkv_seq_free(c, 12345) == KKV_ERR_NOT_FOUND &&
                      kkv_seq_free(c, -1) == KKV_ERR_NOT_FOUND, "bad ids accepted");
            kkv_cache_free(c);

            /* pool full: a budget of what one sequence of S + 3G tokens needs */
            kkv_seq_add(c = make_cache(&m, L, H, D, 64u << 20, 0, 0), &a);
            kkv_seq_reserve(c, a, S + 3 * G);
            kkv_seq_mem(c, &mem, a);
            uint64_t need = mem.capacity;
            kkv_cache_free(c);
            c = make_cache(&m, L, H, D, need + slot / 2, 0, 0);
            if (!c) return;
            f0 = kkv_cache_free_bytes(c);
            kkv_seq_add(c, &a);
            kkv_seq_add(c, &b);
            CHECK(kkv_seq_reserve(c, a, S + 3 * G + 200) == KKV_ERR_POOL_FULL, "over-reserve fit");
            CHECK(*kkv_last_error() && kkv_cache_free_bytes(c) == f0, "failed reserve kept bytes");
            CHECK(kkv_seq_reserve(c, a, S + 3 * G) == KKV_OK, "reserve: %s", kkv_last_error());
            CHECK(kkv_seq_reserve(c, b, S + G) == KKV_ERR_POOL_FULL, "b reserved what a holds");
            /* b grows on demand until the pool says no: nothing changes then */
            kkv_status st = KKV_OK;
            int fail_at = -1;
            float kv[2][H * D];
            for (int t = 0; t < 10 * G && st == KKV_OK; t++)
                for (int l = 0; l < L && st == KKV_OK; l++)
                    for (int op = 0; op < 2 && st == KKV_OK; op++) {
                        snap sa = take_snap(c, a), sb = take_snap(c, b);
                        uint64_t fb = kkv_cache_free_bytes(c);
                        fill_normal(kv[0], H * D, &r, 1.0f);
                        fill_normal(kv[1], H * D, &r, 1.0f);
                        st = op ? kkv_flush(c, b, l) : kkv_append(c, b, l, kv[0], kv[1]);
                        if (st != KKV_OK) {
                            fail_at = t;
                            CHECK(st == KKV_ERR_POOL_FULL && *kkv_last_error(), "status %d", (int)st);
                            snap sa2 = take_snap(c, a), sb2 = take_snap(c, b);
                            CHECK(snap_eq(&sa, &sa2) && snap_eq(&sb, &sb2) &&
                                      kkv_cache_free_bytes(c) == fb,
                                  "POOL_FULL (%s) changed a sequence or the pool", op ? "flush" : "append");
                            free(sa2.kv), free(sb2.kv);
                        }
                        free(sa.kv), free(sb.kv);
                    }
            CHECK(fail_at >= 0, "b never met a full pool");
            CHECK(feed(c, a, S + 3 * G, &r) == KKV_OK, "a's reserved tokens: %s", kkv_last_error());
            CHECK(kkv_seq_free(c, a) == KKV_OK, "free");
            CHECK(feed(c, b, 1, &r) == KKV_OK, "retry after free: %s", kkv_last_error());
            (void)kv;
            kkv_seq_free(c, b);
            CHECK(kkv_cache_free_bytes(c) == f0, "free bytes back to start");
            kkv_cache_free(c);
        }
    }
}

/* 50 ragged sequences, interleaved, with frees and re-adds; every read-back
 * checked against its own expectation, and the pool back to empty. */
static void test_ragged(void) {
    enum { L = 2, H = 2, D = 8, NS = 50, TMAX = 1500 };
    const char *names[] = {"kitty", "kivi-k2v2", "fp16"};
    for (int mi = 0; mi < 3; mi++) {
        kkv_method m = method(names[mi]);
        kkv_cache *c = make_cache(&m, L, H, D, 64u << 20, 64, 0);
        if (!c) return;
        uint64_t free0 = kkv_cache_free_bytes(c);
        tu_rng r = tu_rng_make(2024u + (uint64_t)mi);
        size_t row = (size_t)H * D;
        float *k[NS], *v[NS]; /* [L][TMAX][H][D] per sequence */
        int want[NS], have[NS], id[NS];
        for (int i = 0; i < NS; i++) {
            want[i] = tu_int(&r, TMAX + 1);
            if (i < 3) want[i] = i == 0 ? 0 : i == 1 ? 1 : TMAX;
            have[i] = 0;
            k[i] = malloc((size_t)L * TMAX * row * sizeof **k);
            v[i] = malloc((size_t)L * TMAX * row * sizeof **v);
            fill_normal(k[i], (size_t)L * TMAX * row, &r, 2.0f);
            fill_normal(v[i], (size_t)L * TMAX * row, &r, 1.0f);
            CHECK(kkv_seq_add(c, &id[i]) == KKV_OK, "seq_add %d: %s", i, kkv_last_error());
        }
        /* a sequence freed half-way and added again must start empty */
        int recycled = 0;
        for (;;) {
            int live = 0;
            for (int i = 0; i < NS; i++) live += have[i] < want[i];
            if (!live) break;
            int i = tu_int(&r, NS);
            if (have[i] >= want[i]) continue;
            if (i == 7 && have[i] == want[i] / 2 && !recycled && want[i] > 10) {
                recycled = 1;
                CHECK(kkv_seq_free(c, id[i]) == KKV_OK, "free");
                CHECK(kkv_seq_add(c, &id[i]) == KKV_OK, "re-add");
                CHECK(kkv_seq_len(c, id[i], 0) == 0, "re-added sequence not empty");
                have[i] = 0;
            }
            int t = have[i]++;
            for (int l = 0; l < L; l++) {
                kkv_status s = kkv_append(c, id[i], l, k[i] + ((size_t)l * TMAX + t) * row,
                                          v[i] + ((size_t)l * TMAX + t) * row);
                CHECK(s == KKV_OK, "append: %s", kkv_last_error());
                kkv_flush(c, id[i], l);
            }
        }
        float *rk = malloc((size_t)TMAX * D * sizeof *rk), *rv = malloc((size_t)TMAX * D * sizeof *rv);
        float *ek = malloc((size_t)TMAX * D * sizeof *ek), *ev = malloc((size_t)TMAX * D * sizeof *ev);
        kkv_mem sum, all, one;
        memset(&sum, 0, sizeof sum);
        int bad = 0;
        for (int i = 0; i < NS; i++) {
            CHECK(kkv_seq_len(c, id[i], 1) == want[i], "seq %d len %d want %d", i,
                  kkv_seq_len(c, id[i], 1), want[i]);
            kkv_seq_mem(c, &one, id[i]);
            kkv_mem e = expect_mem(&m, D, L, H, want[i]);
            CHECK(mem_eq(&one, &e), "%s ragged seq %d (%d tokens): mem differs", names[mi], i,
                  want[i]);
            sum.total += one.total;
            sum.fp16 += one.fp16;
            sum.key_lo += one.key_lo;
            sum.value_codes += one.value_codes;
            sum.tokens += one.tokens;
            for (int l = 0; l < L; l++)
                for (int h = 0; h < H && !bad; h++) {
                    CHECK(kkv_seq_read(c, rk, rv, id[i], l, h) == KKV_OK, "read");
                    expect_head(ek, ev, k[i] + (size_t)l * TMAX * row + (size_t)h * D,
                                v[i] + (size_t)l * TMAX * row + (size_t)h * D, row, want[i], D, &m);
                    size_t nbytes = (size_t)want[i] * D * sizeof *rk;
                    if (memcmp(rk, ek, nbytes) || memcmp(rv, ev, nbytes)) {
                        CHECK(0, "%s ragged seq %d l%d h%d (%d tokens): read-back differs",
                              names[mi], i, l, h, want[i]);
                        bad = 1;
                    }
                }
        }
        CHECK(kkv_cache_mem(c, &all) == KKV_OK, "cache_mem");
        CHECK(all.total == sum.total && all.fp16 == sum.fp16 && all.key_lo == sum.key_lo &&
                  all.value_codes == sum.value_codes && all.tokens == sum.tokens,
              "cache_mem (total %llu tokens %llu) is not the sum over sequences (%llu, %llu)",
              (unsigned long long)all.total, (unsigned long long)all.tokens,
              (unsigned long long)sum.total, (unsigned long long)sum.tokens);
        CHECK(all.capacity == 64u << 20, "cache_mem capacity %llu is not the pool budget",
              (unsigned long long)all.capacity);
        for (int i = 0; i < NS; i++) {
            CHECK(kkv_seq_free(c, id[i]) == KKV_OK, "free %d", i);
            free(k[i]);
            free(v[i]);
        }
        CHECK(kkv_cache_free_bytes(c) == free0, "%s: free bytes %llu after freeing all, start %llu",
              names[mi], (unsigned long long)kkv_cache_free_bytes(c), (unsigned long long)free0);
        kkv_cache_mem(c, &all);
        CHECK(all.total == 0 && all.tokens == 0, "empty cache holds bytes");
        kkv_cache_free(c);
        free(rk);
        free(rv);
        free(ek);
        free(ev);
    }
}

/* ---------------------------------------------------------------- limits, bad input */

static void test_limits(void) {
    enum { H = 1, D = 8 };
    kkv_method m = method("kitty");
    m.sink = 4;
    m.group = 8;
    m.window = 8;
    kkv_cache *c = make_cache(&m, 1, H, D, 1u << 20, 3, 50);
    if (!c) return;
    float x[D] = {1, 2, 3, 4, 5, 6, 7, 8};
    int s[4];
    for (int i = 0; i < 3; i++)
        CHECK(kkv_seq_add(c, &s[i]) == KKV_OK, "seq_add %d: %s", i, kkv_last_error());
    kkv_status st = kkv_seq_add(c, &s[3]);
    CHECK(st != KKV_OK, "a 4th sequence with max_seqs 3");
    CHECK(st == KKV_ERR_POOL_FULL, "max_seqs exhausted gives status %d (%s)", (int)st,
          kkv_status_str(st));
    CHECK(kkv_seq_free(c, s[1]) == KKV_OK, "free");
    CHECK(kkv_seq_add(c, &s[3]) == KKV_OK && s[3] == s[1], "the freed id is reused");
    for (int t = 0; t < 50; t++) {
        CHECK(kkv_append(c, s[0], 0, x, x) == KKV_OK, "append %d: %s", t, kkv_last_error());
        kkv_flush(c, s[0], 0);
    }
    snap a = take_snap(c, s[0]);
    CHECK(kkv_append(c, s[0], 0, x, x) == KKV_ERR_CTX_FULL, "append past max_tokens");
    CHECK(*kkv_last_error(), "no message");
    CHECK(kkv_seq_reserve(c, s[0], 1) == KKV_ERR_CTX_FULL, "reserve past max_tokens");
    CHECK(kkv_seq_reserve(c, s[2], 51) == KKV_ERR_CTX_FULL, "reserve of 51 with max 50");
    CHECK(kkv_seq_reserve(c, s[2], 50) == KKV_OK, "reserve of 50: %s", kkv_last_error());
    snap b = take_snap(c, s[0]);
    CHECK(snap_eq(&a, &b), "CTX_FULL changed the sequence");
    free(a.kv);
    free(b.kv);
    /* bad ids and layers */
    CHECK(kkv_append(c, 99, 0, x, x) == KKV_ERR_NOT_FOUND, "append to seq 99");
    CHECK(kkv_append(c, s[2], 1, x, x) == KKV_ERR_INVALID_ARG, "append to layer 1 of 1");
    CHECK(kkv_append(c, s[2], -1, x, x) == KKV_ERR_INVALID_ARG, "append to layer -1");
    CHECK(kkv_append(c, s[2], 0, NULL, x) == KKV_ERR_INVALID_ARG, "append NULL key");
    CHECK(kkv_flush(c, 99, 0) == KKV_ERR_NOT_FOUND, "flush seq 99");
    CHECK(kkv_seq_len(c, 99, 0) == -1 && kkv_seq_len(c, s[2], 5) == -1, "seq_len of nothing");
    float out[D];
    CHECK(kkv_attend(c, out, s[2], 0, x, 1) == KKV_ERR_INVALID_ARG, "attend on empty sequence");
    CHECK(kkv_seq_read(c, out, out, 99, 0, 0) == KKV_ERR_NOT_FOUND, "read seq 99");
    CHECK(kkv_seq_read(c, out, out, s[2], 0, 1) == KKV_ERR_INVALID_ARG, "read head 1 of 1");
    uint8_t pg[512];
    /* 50 tokens, S=4, G=8: pages 0..4 and 6 fp16 keys */
    CHECK(kkv_seq_key_page(c, pg, sizeof pg, s[0], 0, 0, 4) == KKV_OK, "page 4 of 50 tokens: %s",
          kkv_last_error());
    CHECK(kkv_seq_key_page(c, pg, sizeof pg, s[0], 0, 0, 5) == KKV_ERR_INVALID_ARG,
          "page 5 of 50 tokens exists");
    CHECK(kkv_seq_key_page(c, pg, 10, s[0], 0, 0, 0) == KKV_ERR_INVALID_ARG, "tiny page buffer");
    kkv_cache_free(c);
}

/* NaN / Inf: rejected with KKV_ERR_NONFINITE and nothing stored, including at
 * the step whose key Q-buffer is full and not yet flushed. */
static void test_nonfinite(void) {
    enum { L = 1, H = 2, D = 16 };
    const char *names[] = {"kitty", "fp16"};
    for (int mi = 0; mi < 2; mi++) {
        kkv_method m = method(names[mi]);
        kkv_cache *c = make_cache(&m, L, H, D, 16u << 20, 0, 0);
        if (!c) return;
        int seq;
        kkv_seq_add(c, &seq);
        tu_rng r = tu_rng_make(8);
        float k[H * D], v[H * D], bad[H * D];
        const float poison[] = {NAN, INFINITY, -INFINITY};
        int S = m.fp16 ? 0 : m.sink;
        for (int t = 0; t < S + 2 * m.group + 5; t++) {
            fill_normal(k, H * D, &r, 1.0f);
            fill_normal(v, H * D, &r, 1.0f);
            int probe = t % 61 == 0 || t == S || t == S + m.group || t == S + m.group - 1 ||
                        t == S + 2 * m.group;
            if (probe) {
                snap a = take_snap(c, seq);
                for (int pi = 0; pi < 3; pi++) {
                    memcpy(bad, k, sizeof bad);
                    bad[(t + pi * 5) % (H * D)] = poison[pi];
                    CHECK(kkv_append(c, seq, 0, bad, v) == KKV_ERR_NONFINITE,
                          "%s t=%d: key %g accepted", names[mi], t, (double)poison[pi]);
                    CHECK(*kkv_last_error(), "no message");
                    memcpy(bad, v, sizeof bad);
                    bad[H * D - 1 - pi] = poison[pi];
                    CHECK(kkv_append(c, seq, 0, k, bad) == KKV_ERR_NONFINITE,
                          "%s t=%d: value %g accepted", names[mi], t, (double)poison[pi]);
                    float out[H * D];
                    if (t > 0) {
                        bad[0] = poison[pi];
                        CHECK(kkv_attend(c, out, seq, 0, bad, H) == KKV_ERR_NONFINITE,
                              "query %g accepted", (double)poison[pi]);
                    }
                }
                snap b = take_snap(c, seq);
                CHECK(snap_eq(&a, &b), "%s t=%d: rejected input changed the sequence", names[mi], t);
                free(a.kv);
                free(b.kv);
            }
            CHECK(kkv_append(c, seq, 0, k, v) == KKV_OK, "append: %s", kkv_last_error());
            /* leave a full key Q-buffer unflushed every other page */
            if ((t - S) / m.group % 2 == 0) kkv_flush(c, seq, 0);
        }
        /* finite values beyond fp16: clamped to +-65504 when stored */
        int N = kkv_seq_len(c, seq, 0);
        for (int i = 0; i < H * D; i++) k[i] = i % 2 ? 1e30f : -70000.0f;
        CHECK(kkv_append(c, seq, 0, k, k) == KKV_OK, "append of 1e30: %s", kkv_last_error());
        float *rk = malloc((size_t)(N + 1) * D * sizeof *rk);
        float *rv = malloc((size_t)(N + 1) * D * sizeof *rv);
        kkv_seq_read(c, rk, rv, seq, 0, 1);
        int ok = 1;
        for (int j = 0; j < D; j++) {
            float want = j % 2 ? 65504.0f : -65504.0f; /* head 1 starts at an even index */
            ok &= rk[(size_t)N * D + j] == want && rv[(size_t)N * D + j] == want;
        }
        CHECK(ok, "%s: values beyond fp16 not clamped to +-65504", names[mi]);
        free(rk);
        free(rv);
        kkv_cache_free(c);
    }
}

/* Spec 5 figures through the cache (D=64, G=128, one head). */
static void test_accounting(void) {
    kkv_method m = method("kitty");
    kkv_cache *c = make_cache(&m, 1, 1, 64, 8u << 20, 0, 0);
    if (!c) return;
    int seq;
    kkv_seq_add(c, &seq);
    float x[64];
    tu_rng r = tu_rng_make(4);
    kkv_mem mem;
    for (int t = 0; t < 32 + 128 + 128; t++) {
        fill_normal(x, 64, &r, 1.0f);
        kkv_append(c, seq, 0, x, x);
        kkv_flush(c, seq, 0);
        if (t + 1 != 32 + 128) continue;
        /* one key page, no value page yet: 160 tokens = 32 sink + 128 paged keys */
        kkv_seq_mem(c, &mem, seq);
        CHECK(mem.key_lo == 2048 && mem.key_hi == 32 * 8 && mem.key_idx == 64 &&
                  mem.key_meta == 256 && mem.value_codes == 0 && mem.value_meta == 0,
              "kitty key page: lo %llu hi %llu idx %llu meta %llu", (unsigned long long)mem.key_lo,
              (unsigned long long)mem.key_hi, (unsigned long long)mem.key_idx,
              (unsigned long long)mem.key_meta);
        CHECK(mem.key_lo + mem.key_hi + mem.key_idx + mem.key_meta == 2624, "kitty page != 2624 B");
        CHECK(mem.fp16 == (2 * 32 + 0 + 128) * 64 * 2, "fp16 bytes %llu at 160 tokens",
              (unsigned long long)mem.fp16);
    }
    /* 288 tokens: two key pages, one value page, 128 window values */
    kkv_seq_mem(c, &mem, seq);
    CHECK(mem.key_lo == 2 * 2048 && mem.key_hi == 2 * 256 && mem.key_idx == 2 * 64 &&
              mem.key_meta == 2 * 256,
          "kitty 2 key pages: lo %llu hi %llu idx %llu meta %llu", (unsigned long long)mem.key_lo,
          (unsigned long long)mem.key_hi, (unsigned long long)mem.key_idx,
          (unsigned long long)mem.key_meta);
    CHECK(mem.value_codes == 2048 && mem.value_meta == 512, "value page: %llu + %llu",
          (unsigned long long)mem.value_codes, (unsigned long long)mem.value_meta);
    CHECK(mem.fp16 == (2 * 32 + 0 + 128) * 64 * 2, "fp16 bytes %llu", (unsigned long long)mem.fp16);
    CHECK(mem.tokens == 288, "tokens %llu", (unsigned long long)mem.tokens);
    double bpe = 8.0 * (double)mem.total / (2.0 * 288 * 64);
    CHECK(fabs(mem.bits_per_element - bpe) < 1e-12, "bits/element %f, want %f",
          mem.bits_per_element, bpe);
    kkv_cache_free(c);
}

int main(void) {
    const char *const *names = kkv_method_names();
    /* The expectation model here is the paper's lifecycle and min/max codecs;
     * the methods beyond it (kitty-plus*: eager values, pairs, clipping) are
     * checked by tests/test_plus.c. */
    for (int i = 0; names[i] && strncmp(names[i], "kitty-plus", 10); i++) {
        lifecycle(names[i], 64);
        if (i % 3 == 0) lifecycle(names[i], 12);
    }
    lifecycle("kitty-pro", 128);
    invariance("kitty", KKV_SELECT_MAGNITUDE);
    invariance("kitty-pro", KKV_SELECT_VARIANCE);
    invariance("kitty", KKV_SELECT_RANDOM);
    invariance("kivi-k2v2", KKV_SELECT_MAGNITUDE);
    invariance("kivi-k4v4", KKV_SELECT_MAGNITUDE);
    invariance("fp16", KKV_SELECT_MAGNITUDE);
    test_pool();
    test_ragged();
    test_limits();
    test_nonfinite();
    test_accounting();
    return tu_summary();
}
