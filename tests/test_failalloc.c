/* Allocation-failure injection. This test is linked with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc,--wrap=mmap
 * (tests/CMakeLists.txt), so every allocation the library makes goes through
 * the wrappers below; arm(k) makes exactly the k-th one (0-based) fail. Each
 * operation is swept over k = 0, 1, ... until a run meets no injected
 * failure, and for every k it must return KKV_ERR_NOMEM (or the documented
 * status), leave the handle as it was (observable state compared) and usable
 * (the same call then succeeds). Leaks on the failure paths are found by
 * LeakSanitizer in the ASan build (scripts/test.sh runs the unit tests there).
 * Allocations inside shared libraries (PCRE2, libc's own) are not wrapped. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_model.h"
#include "testutil.h"

#ifndef KKV_SOURCE_DIR
#define KKV_SOURCE_DIR "."
#endif

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t sz);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t sz);
void *__wrap_realloc(void *p, size_t n);
/* core/bigmem.c: the pool's slabs and the packed weights (mmap, or
 * aligned_alloc under ASan) */
void *__real_aligned_alloc(size_t al, size_t n);
void *__real_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off);
void *__wrap_aligned_alloc(size_t al, size_t n);
void *__wrap_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off);

static atomic_long g_fail_at = -1; /* index of the allocation to fail; -1: none */
static atomic_long g_seen;         /* allocations since arm() */
static atomic_int  g_hit;          /* the armed allocation was reached */

static int inject(void) {
    long at = atomic_load(&g_fail_at);
    if (at < 0) return 0;
    if (atomic_fetch_add(&g_seen, 1) != at) return 0;
    atomic_store(&g_hit, 1);
    return 1;
}

void *__wrap_malloc(size_t n) { return inject() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t sz) { return inject() ? NULL : __real_calloc(n, sz); }
void *__wrap_realloc(void *p, size_t n) { return inject() ? NULL : __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t al, size_t n) { return inject() ? NULL : __real_aligned_alloc(al, n); }
/* anonymous maps only: a file mapping that fails is an I/O error, not NOMEM */
void *__wrap_mmap(void *a, size_t n, int prot, int flags, int fd, off_t off) {
    return (flags & MAP_ANONYMOUS) && inject() ? MAP_FAILED : __real_mmap(a, n, prot, flags, fd, off);
}

static void arm(long k) {
    atomic_store(&g_seen, 0);
    atomic_store(&g_hit, 0);
    atomic_store(&g_fail_at, k);
}

/* Disarms; 1 if the armed allocation failed during the run. */
static int disarm(void) {
    atomic_store(&g_fail_at, -1);
    return atomic_load(&g_hit);
}

/* Upper bound on a sweep: an op that allocates without end is a bug too. */
#define MAX_SWEEP 100000

static kkv_cache_config small_config(int n_threads) {
    kkv_method m;
    kkv_method_from_name(&m, "kitty");
    m.sink = 4;
    m.group = 16;
    m.window = 16;
    kkv_cache_config cfg = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 32,
                            .pool_bytes = 4u << 20, .n_threads = n_threads, .method = m};
    return cfg;
}

static void fill(float *x, size_t n, uint64_t seed) {
    tu_rng r = tu_rng_make(seed);
    for (size_t i = 0; i < n; i++) x[i] = tu_normal(&r);
}

/* Snapshot of what a caller can observe of one sequence. */
typedef struct {
    int len[2];
    uint64_t free_bytes;
    float k[2][64][32], v[2][64][32]; /* [layer][token][D], head 0 */
} snap;

static void take(snap *s, const kkv_cache *c, int seq) {
    memset(s, 0, sizeof *s);
    s->free_bytes = kkv_cache_free_bytes(c);
    for (int l = 0; l < 2; l++) {
        s->len[l] = kkv_seq_len(c, seq, l);
        if (s->len[l] > 0 && s->len[l] <= 64) kkv_seq_read(c, &s->k[l][0][0], &s->v[l][0][0], seq, l, 0);
    }
}

static int same(const snap *a, const snap *b) { return !memcmp(a, b, sizeof *a); }

static void sweep_cache(void) {
    /* create */
    long k;
    for (int th = 0; th <= 2; th += 2) {
        kkv_cache_config cfg = small_config(th);
        for (k = 0; k < MAX_SWEEP; k++) {
            kkv_cache *c = (kkv_cache *)1;
            arm(k);
            kkv_status s = kkv_cache_create(&c, &cfg);
            int hit = disarm();
            if (!hit) {
                CHECK(s == KKV_OK, "create, no failure: %d", (int)s);
                kkv_cache_free(c);
                break;
            }
            CHECK(s == KKV_ERR_NOMEM && c == NULL, "create, alloc %ld: %d", k, (int)s);
        }
        printf("cache_create (%d threads): %ld allocations swept\n", th, k);
    }

    kkv_cache_config cfg = small_config(0);
    kkv_cache *c = NULL;
    if (kkv_cache_create(&c, &cfg) != KKV_OK) {
        CHECK(0, "create: %s", kkv_last_error());
        return;
    }
    /* seq_add */
    int seq = -1;
    for (k = 0; k < MAX_SWEEP; k++) {
        uint64_t fb = kkv_cache_free_bytes(c);
        kkv_mem m0, m1;
        kkv_cache_mem(c, &m0);
        arm(k);
        kkv_status s = kkv_seq_add(c, &seq);
        int hit = disarm();
        if (!hit) {
            CHECK(s == KKV_OK && seq == 0, "seq_add, no failure: %d", (int)s);
            break;
        }
        kkv_cache_mem(c, &m1);
        CHECK(s == KKV_ERR_NOMEM && kkv_cache_free_bytes(c) == fb &&
                  !memcmp(&m0, &m1, sizeof m0) && kkv_seq_len(c, 0, 0) == -1,
              "seq_add, alloc %ld: %d", k, (int)s);
    }
    printf("seq_add: %ld allocations swept\n", k);

    /* reserve: page table and pool chunks */
    for (k = 0; k < MAX_SWEEP; k++) {
        snap a, b;
        take(&a, c, seq);
        arm(k);
        kkv_status s = kkv_seq_reserve(c, seq, 40);
        int hit = disarm();
        take(&b, c, seq);
        if (!hit) {
            CHECK(s == KKV_OK, "reserve, no failure: %d", (int)s);
            break;
        }
        CHECK(s == KKV_ERR_NOMEM && same(&a, &b), "reserve, alloc %ld: %d", k, (int)s);
    }
    printf("seq_reserve: %ld allocations swept\n", k);
    kkv_seq_free(c, seq);
    kkv_seq_add(c, &seq);

    /* append, attend and flush of 40 tokens (2 key pages, a value page), each
     * call swept on its own from the state the previous calls left */
    float kv[2][2 * 32], q[4 * 32], out[4 * 32];
    long n_append = 0, n_attend = 0, n_flush = 0;
    for (int t = 0; t < 40 && !tu_failed(); t++) {
        for (int l = 0; l < 2; l++) {
            fill(kv[0], 64, 1000u * t + l);
            fill(kv[1], 64, 1000u * t + l + 500);
            fill(q, 128, 7000u * t + l);
            for (k = 0; k < MAX_SWEEP; k++) {
                snap a, b;
                take(&a, c, seq);
                arm(k);
                kkv_status s = kkv_append(c, seq, l, kv[0], kv[1]);
                int hit = disarm();
                if (!hit) {
                    CHECK(s == KKV_OK, "append t %d, no failure: %d", t, (int)s);
                    break;
                }
                take(&b, c, seq);
                CHECK(s == KKV_ERR_NOMEM && same(&a, &b), "append t %d l %d alloc %ld: %d", t,
                      l, k, (int)s);
                n_append++;
            }
            /* swept before any unarmed attend, so the growth of the cache's
             * attention buffer is among the allocations that fail */
            for (k = 0; k < MAX_SWEEP; k++) {
                snap a, b;
                take(&a, c, seq);
                arm(k);
                kkv_status s = kkv_attend(c, out, seq, l, q, 4);
                int hit = disarm();
                take(&b, c, seq);
                if (!hit) {
                    float ref[4 * 32];
                    CHECK(s == KKV_OK && kkv_attend(c, ref, seq, l, q, 4) == KKV_OK &&
                              !memcmp(out, ref, sizeof out) && same(&a, &b),
                          "attend t %d, no failure: %d", t, (int)s);
                    break;
                }
                CHECK(s == KKV_ERR_NOMEM && same(&a, &b), "attend t %d alloc %ld: %d", t, k,
                      (int)s);
                n_attend++;
            }
            for (k = 0; k < MAX_SWEEP; k++) {
                snap a, b;
                take(&a, c, seq);
                arm(k);
                kkv_status s = kkv_flush(c, seq, l);
                int hit = disarm();
                if (!hit) {
                    CHECK(s == KKV_OK, "flush t %d, no failure: %d", t, (int)s);
                    break;
                }
                take(&b, c, seq);
                CHECK(s == KKV_ERR_NOMEM && same(&a, &b), "flush t %d alloc %ld: %d", t, k,
                      (int)s);
                n_flush++;
            }
        }
    }
    printf("append/attend/flush: %ld / %ld / %ld failing allocations swept\n", n_append,
           n_attend, n_flush);
    /* the cache is still consistent: the lengths and a read-back */
    CHECK(kkv_seq_len(c, seq, 0) == 40 && kkv_seq_len(c, seq, 1) == 40, "lengths %d %d",
          kkv_seq_len(c, seq, 0), kkv_seq_len(c, seq, 1));
    kkv_cache_free(c);
}

static void sweep_model(const char *path) {
    long k;
    int n_unpacked = 0;
    kkv_model *m = NULL;
    for (k = 0; k < MAX_SWEEP; k++) {
        m = (kkv_model *)1;
        arm(k);
        kkv_status s = kkv_model_load(&m, path, 1);
        int hit = disarm();
        if (!hit) {
            CHECK(s == KKV_OK, "load, no failure: %d %s", (int)s, kkv_last_error());
            break;
        }
        if (s == KKV_OK && m && m != (kkv_model *)1 && ++n_unpacked == 1) {
            /* the one optional allocation: the packed weight copy; without it
             * the model loads and runs unpacked (model.c) */
            kkv_model_free(m);
            continue;
        }
        CHECK(s == KKV_ERR_NOMEM && m == NULL, "load, alloc %ld: %d %s", k, (int)s,
              kkv_last_error());
        if (tu_failed()) return;
    }
    CHECK(n_unpacked == 1, "load: the packed copy's allocation was swept %d times", n_unpacked);
    printf("model_load: %ld allocations swept\n", k);
    if (!m || m == (kkv_model *)1) return;

    kkv_model_info in;
    kkv_model_get_info(m, &in);
    kkv_method me;
    kkv_method_from_name(&me, "kitty");
    kkv_cache_config cfg = kkv_model_cache_config(m, &me, 16u << 20);
    kkv_cache *c = NULL;
    size_t lb = (size_t)in.n_vocab * sizeof(float);
    float *lg = malloc(lb), *ref = malloc(lb);
    int32_t toks[2] = {1, 504};
    int seq = -1;
    if (!lg || !ref || kkv_cache_create(&c, &cfg) != KKV_OK || kkv_seq_add(c, &seq) != KKV_OK ||
        kkv_model_forward(m, c, ref, seq, toks, 2, 0) != KKV_OK) {
        CHECK(0, "forward setup: %s", kkv_last_error());
        goto done;
    }
    long n_marked = 0;
    for (k = 0; k < MAX_SWEEP; k++) {
        kkv_seq_free(c, seq);
        kkv_seq_add(c, &seq);
        uint64_t fb = kkv_cache_free_bytes(c);
        arm(k);
        kkv_status s = kkv_model_forward(m, c, lg, seq, toks, 2, 0);
        int hit = disarm();
        if (!hit) {
            CHECK(s == KKV_OK && !memcmp(lg, ref, lb), "forward, no failure: %d", (int)s);
            break;
        }
        CHECK(s == KKV_ERR_NOMEM, "forward, alloc %ld: %d %s", k, (int)s, kkv_last_error());
        /* documented: untouched (lengths 0), or marked failed until freed */
        int touched = 0;
        for (int l = 0; l < in.n_layers; l++) touched |= kkv_seq_len(c, seq, l) != 0;
        if (touched) {
            n_marked++;
            CHECK(kkv_model_forward(m, c, lg, seq, toks, 1, 0) == KKV_ERR_INVALID_ARG,
                  "forward alloc %ld: touched sequence not marked", k);
        } else {
            CHECK(kkv_cache_free_bytes(c) <= fb, "forward alloc %ld: pool", k);
        }
        if (tu_failed()) break;
    }
    printf("model_forward: %ld allocations swept (%ld left a marked sequence)\n", k, n_marked);
    /* the model and cache stay usable: a fresh sequence gives the reference */
    kkv_seq_free(c, seq);
    kkv_seq_add(c, &seq);
    CHECK(kkv_model_forward(m, c, lg, seq, toks, 2, 0) == KKV_OK && !memcmp(lg, ref, lb),
          "forward after the sweep");
done:
    free(lg);
    free(ref);
    kkv_cache_free(c);
    kkv_model_free(m);
}

/* Chat formatting with the model's own ChatML template, which writes a
 * default system message when the conversation has none: every allocation
 * (the default system text's included) fails cleanly. The ASan/UBSan build
 * also checks that no NULL text from a failed buffer reaches memcpy. */
static void sweep_chat(const char *path) {
    kkv_model *m = NULL;
    if (kkv_model_load_vocab(&m, path, NULL) != KKV_OK) {
        CHECK(0, "chat: vocab load: %s", kkv_last_error());
        return;
    }
    const kkv_chat_msg msgs[] = {{"user", "Hello"}};
    char ref[4096], got[4096];
    size_t n_ref = 0, n = 0;
    CHECK(kkv_chat_format(m, ref, sizeof ref, &n_ref, msgs, 1, 1, NULL) == KKV_OK, "chat: %s",
          kkv_last_error());
    /* the sweep below only means something if the default system text is there */
    static const char sys[] = "<|im_start|>system\n";
    CHECK(!strncmp(ref, sys, sizeof sys - 1) && strncmp(ref + sizeof sys - 1, "<|im_end|>", 10),
          "chat: no default system message in '%s'", ref);
    long k;
    for (k = 0; k < MAX_SWEEP; k++) {
        arm(k);
        kkv_status s = kkv_chat_format(m, got, sizeof got, &n, msgs, 1, 1, NULL);
        int hit = disarm();
        if (!hit) {
            CHECK(s == KKV_OK && n == n_ref && !strcmp(got, ref), "chat, no failure: %d", (int)s);
            break;
        }
        CHECK(s == KKV_ERR_NOMEM, "chat, alloc %ld: %d %s", k, (int)s, kkv_last_error());
    }
    printf("chat format: %ld allocations swept\n", k);
    kkv_model_free(m);
}

/* The SentencePiece tokenizer on the fuzz seed vocabulary: loading and
 * encoding fail cleanly at every allocation and work afterwards. */
static void sweep_spm(void) {
    const char *path = KKV_SOURCE_DIR "/tests/fuzz/corpus_gguf/tiny_spm.seed";
    long k;
    kkv_model *m = NULL;
    for (k = 0; k < MAX_SWEEP; k++) {
        m = (kkv_model *)1;
        arm(k);
        kkv_status s = kkv_model_load_vocab(&m, path, NULL);
        int hit = disarm();
        if (!hit) {
            CHECK(s == KKV_OK, "spm load, no failure: %d %s", (int)s, kkv_last_error());
            break;
        }
        CHECK(s == KKV_ERR_NOMEM && m == NULL, "spm load, alloc %ld: %d %s", k, (int)s,
              kkv_last_error());
        if (tu_failed()) return;
    }
    printf("spm vocab load: %ld allocations swept\n", k);
    if (!m || m == (kkv_model *)1) return;
    static const char text[] = "<s>hello  world xyz \xc3\xa9\xff<u> the\n";
    int32_t ref[64], got[64];
    int n_ref = 0, n = 0;
    CHECK(kkv_tokenize(m, ref, 64, &n_ref, text, sizeof text - 1, 1, 1) == KKV_OK, "spm encode");
    for (k = 0; k < MAX_SWEEP; k++) {
        arm(k);
        kkv_status s = kkv_tokenize(m, got, 64, &n, text, sizeof text - 1, 1, 1);
        int hit = disarm();
        if (!hit) {
            CHECK(s == KKV_OK && n == n_ref && !memcmp(got, ref, (size_t)n * sizeof *got),
                  "spm encode, no failure: %d", (int)s);
            break;
        }
        CHECK(s == KKV_ERR_NOMEM, "spm encode, alloc %ld: %d %s", k, (int)s, kkv_last_error());
    }
    printf("spm encode: %ld allocations swept\n", k);
    kkv_model_free(m);
}

int main(void) {
    /* the wrappers must be in effect, or the sweeps prove nothing */
    arm(0);
    void *volatile p = malloc(16);
    int hit = disarm();
    CHECK(p == NULL && hit, "malloc is not wrapped (link with --wrap=malloc)");
    free(p);
    if (tu_failed()) return tu_summary();

    sweep_cache();
    sweep_spm();
    const char *path = getenv("KKV_MODEL") && *getenv("KKV_MODEL")
                           ? getenv("KKV_MODEL")
                           : KKV_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *req = getenv("KKV_REQUIRE_MODEL");
    if (access(path, R_OK) == 0) {
        sweep_model(path);
        sweep_chat(path);
    } else if (req && !strcmp(req, "1")) CHECK(0, "model %s missing and KKV_REQUIRE_MODEL=1", path);
    else printf("note: no model at %s: model sweeps skipped\n", path);
    return tu_summary();
}
