/* Regression tests for the hardening issue (11): each block names the defect
 * it pins down. Library-level checks run everywhere; the ones that need the
 * default model run when it is present (or KKV_REQUIRE_MODEL=1 makes its
 * absence a failure). The CLI-level regressions are in
 * tests/oracle/test_harden_cli.py. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kittykv_eval.h"
#include "core/status.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_model.h"
#include "model/gguf.h"
#include "model/model.h"
#include "testutil.h"

#ifndef KKV_SOURCE_DIR
#define KKV_SOURCE_DIR "."
#endif

/* The extreme-size checks ask for exabytes on purpose: under ASan such a
 * malloc must return NULL (as libc's does) instead of aborting. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* A temporary directory for files the tests create. */
static char g_tmp[64];

static void make_tmp(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kkv_harden_XXXXXX");
    if (!mkdtemp(g_tmp)) g_tmp[0] = 0;
}

/* ---------------------------------------------------------------- 1: .npy */

/* A .npy image with the given shape text and `data` bytes of zeros. */
static size_t make_npy(unsigned char *buf, size_t cap, const char *shape, size_t data) {
    char dict[128];
    int n = snprintf(dict, sizeof dict,
                     "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", shape);
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)n + pad + 1;
    if (10 + hlen + data > cap) return 0;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    memcpy(buf + 10, dict, (size_t)n);
    memset(buf + 10 + n, ' ', pad);
    buf[10 + n + pad] = '\n';
    memset(buf + 10 + hlen, 0, data);
    return 10 + hlen + data;
}

static void test_npy(void) {
    unsigned char buf[4096];
    int64_t rows = -7;
    size_t off = 7;
    /* the probe's file: rows * 64 * 4 wraps to 256 in 64 bits */
    size_t n = make_npy(buf, sizeof buf, "(72057594037927937, 64)", 256);
    kkv_status s = kkv_tensor_parse(&rows, &off, buf, n, 64, "x.npy");
    CHECK(s == KKV_ERR_FORMAT && rows == -7 && contains(kkv_last_error(), "2^64"),
          "wrapping shape: status %d rows %lld: %s", (int)s, (long long)rows, kkv_last_error());
    static const char *const bad[] = {
        "(9223372036854775808, 64)",  /* above INT64_MAX */
        "(99999999999999999999999, 64)",
        "(-1, 64)", "(4, -64)", "(4, 0)", "(4)", "(4, 64, 1)", "4, 64", "(, 64)", "(1, 32)",
        "(1099511627776, 64)",         /* fits, but the data is not there */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        n = make_npy(buf, sizeof buf, bad[i], 256);
        rows = -7;
        s = kkv_tensor_parse(&rows, &off, buf, n, 64, "x.npy");
        CHECK(s == KKV_ERR_FORMAT && rows == -7, "shape %s: status %d", bad[i], (int)s);
    }
    n = make_npy(buf, sizeof buf, "(4, 64)", 4 * 64 * 4);
    s = kkv_tensor_parse(&rows, &off, buf, n, 64, "x.npy");
    CHECK(s == KKV_OK && rows == 4 && n - off == 4 * 64 * 4, "good .npy: %d rows %lld", (int)s,
          (long long)rows);
    n = make_npy(buf, sizeof buf, "(0, 64)", 0);
    s = kkv_tensor_parse(&rows, &off, buf, n, 64, "x.npy");
    CHECK(s == KKV_OK && rows == 0, "empty .npy: %d", (int)s);
    /* every truncation of a good file fails cleanly */
    n = make_npy(buf, sizeof buf, "(2, 8)", 2 * 8 * 4);
    for (size_t cut = 0; cut < n; cut++) {
        s = kkv_tensor_parse(&rows, &off, buf, cut, 8, "x.npy");
        if (s == KKV_OK) CHECK(rows * 8 * 4 == (int64_t)(cut - off), "cut %zu", cut);
    }
    /* raw: size must divide; extremes of cols */
    s = kkv_tensor_parse(&rows, &off, buf, 100, 8, "x.raw");
    CHECK(s == KKV_ERR_FORMAT, "raw 100 bytes of [8]: %d", (int)s);
    s = kkv_tensor_parse(&rows, &off, buf, 0, INT_MAX, "x.raw");
    CHECK(s == KKV_OK && rows == 0, "raw empty, INT_MAX cols: %d", (int)s);
    s = kkv_tensor_parse(&rows, &off, buf, 64, 0, "x.raw");
    CHECK(s == KKV_ERR_INVALID_ARG, "0 cols: %d", (int)s);
    s = kkv_tensor_parse(&rows, &off, NULL, 64, 8, "x.raw");
    CHECK(s == KKV_ERR_INVALID_ARG, "NULL buffer: %d", (int)s);
}

/* ---------------------------------------------------------------- 2: messages */

static void test_fail_overlap(void) {
    kkv_fail(KKV_ERR_FORMAT, "inner message");
    kkv_fail(KKV_ERR_FORMAT, "outer: %s", kkv_last_error());
    CHECK(!strcmp(kkv_last_error(), "outer: inner message"), "nested: '%s'", kkv_last_error());
    kkv_fail(KKV_ERR_FORMAT, "%s%s", kkv_last_error(), kkv_last_error());
    CHECK(!strcmp(kkv_last_error(), "outer: inner messageouter: inner message"), "doubled: '%s'",
          kkv_last_error());
    char b[32];
    CHECK(!strcmp(kkv_printable(b, sizeof b, "a\xff\n\\z", 5), "a\\xff\\x0a\\x5cz"),
          "printable: '%s'", b);
    CHECK(strlen(kkv_printable(b, sizeof b, "0123456789012345678901234567890123456789", 40)) <
              sizeof b, "printable cut: '%s'", b);
}

/* A hand-made GGUF v3: no metadata, one tensor whose only dimension is 2^63. */
static void test_gguf_dimension_message(void) {
    unsigned char g[64];
    size_t o = 0;
    memcpy(g, "GGUF", 4), o = 4;
    uint32_t v = 3;
    uint64_t nt = 1, nkv = 0, nl = 1, dim = (uint64_t)1 << 63;
    uint32_t nd = 1;
    memcpy(g + o, &v, 4), o += 4;
    memcpy(g + o, &nt, 8), o += 8;
    memcpy(g + o, &nkv, 8), o += 8;
    memcpy(g + o, &nl, 8), o += 8;
    g[o++] = 't';
    memcpy(g + o, &nd, 4), o += 4;
    memcpy(g + o, &dim, 8), o += 8;
    memset(g + o, 0, 12), o += 12;
    kkv_gguf *gg = NULL;
    kkv_status s = kkv_gguf_parse(&gg, g, o);
    CHECK(s == KKV_ERR_FORMAT && contains(kkv_last_error(), "9223372036854775808") && !gg,
          "2^63 dimension: %d '%s'", (int)s, kkv_last_error());
}

/* ---------------------------------------------------------------- 3, 4, 10: files */

static void on_alarm(int sig) {
    (void)sig;
    static const char m[] = "test_harden: timed out (a blocking open?)\n";
    if (write(2, m, sizeof m - 1) < 0) _exit(3);
    _exit(3);
}

static void test_files(void) {
    if (!g_tmp[0]) {
        CHECK(0, "no temporary directory: %s", strerror(errno));
        return;
    }
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo", g_tmp);
    if (mkfifo(fifo, 0600) == 0) {
        /* the old open() blocked here forever: the alarm turns that into a failure */
        signal(SIGALRM, on_alarm);
        alarm(20);
        kkv_model *m = (kkv_model *)1;
        kkv_status s = kkv_model_load(&m, fifo, 1);
        alarm(0);
        CHECK(s == KKV_ERR_IO && !m && contains(kkv_last_error(), "FIFO"), "FIFO model: %d '%s'",
              (int)s, kkv_last_error());
        unlink(fifo);
    }
    /* a directory is named as one, not "Input/output error" */
    kkv_model *m = NULL;
    kkv_status s = kkv_model_load(&m, g_tmp, 1);
    CHECK(s == KKV_ERR_IO && contains(kkv_last_error(), "directory"), "dir model: %d '%s'",
          (int)s, kkv_last_error());
    char *buf = (char *)1;
    size_t len = 7;
    s = kkv_file_read(&buf, &len, g_tmp, 1 << 20);
    CHECK(s == KKV_ERR_IO && !buf && contains(kkv_last_error(), "directory"), "dir text: %d '%s'",
          (int)s, kkv_last_error());
    /* a missing file says why, once, with the path */
    char missing[128];
    snprintf(missing, sizeof missing, "%s/missing.gguf", g_tmp);
    s = kkv_model_load(&m, missing, 1);
    const char *e = kkv_last_error();
    const char *first = strstr(e, missing);
    CHECK(s == KKV_ERR_IO && contains(e, strerror(ENOENT)) && first &&
              !strstr(first + 1, missing), "missing model: '%s'", e);
    s = kkv_file_read(&buf, &len, missing, 1 << 20);
    CHECK(s == KKV_ERR_IO && contains(kkv_last_error(), strerror(ENOENT)), "missing text: '%s'",
          kkv_last_error());
    /* unbounded devices stop at the cap */
    s = kkv_file_read(&buf, &len, "/dev/zero", 1 << 20);
    CHECK(s == KKV_ERR_INVALID_ARG && !buf && contains(kkv_last_error(), "limit"),
          "/dev/zero: %d '%s'", (int)s, kkv_last_error());
    /* a regular file over the cap fails before reading; at the cap it is read */
    char path[128];
    snprintf(path, sizeof path, "%s/text.txt", g_tmp);
    FILE *f = fopen(path, "wb");
    if (f) {
        for (int i = 0; i < 1000; i++) fputc('a' + i % 26, f);
        fclose(f);
    }
    s = kkv_file_read(&buf, &len, path, 999);
    CHECK(s == KKV_ERR_INVALID_ARG && !buf, "over the cap: %d", (int)s);
    s = kkv_file_read(&buf, &len, path, 1000);
    CHECK(s == KKV_OK && len == 1000 && buf[1000] == 0 && buf[25] == 'z', "at the cap: %d", (int)s);
    free(buf);
    s = kkv_file_read(&buf, &len, "/dev/null", 10);
    CHECK(s == KKV_OK && len == 0 && buf && buf[0] == 0, "/dev/null: %d", (int)s);
    free(buf);
    unlink(path);
}

/* ---------------------------------------------------------------- 8: NULL */

static void test_null_contract(void) {
    kkv_method m;
    CHECK(kkv_method_from_name(NULL, "kitty") == KKV_ERR_INVALID_ARG, "from_name(NULL, ..)");
    CHECK(kkv_method_from_name(&m, NULL) == KKV_ERR_INVALID_ARG, "from_name(.., NULL)");
    CHECK(kkv_method_from_name(&m, "\xff\xfe") == KKV_ERR_NOT_FOUND &&
              contains(kkv_last_error(), "\\xff\\xfe"), "raw bytes echoed: %s", kkv_last_error());
    CHECK(kkv_method_check(NULL, 64) == KKV_ERR_INVALID_ARG, "method_check(NULL)");
    CHECK(kkv_method_boost(NULL, 64) == 0, "boost(NULL)");
    CHECK(kkv_status_str((kkv_status)12345) != NULL, "status_str");
    CHECK(kkv_kernel_name((kkv_kernel)12345) != NULL, "kernel_name");
    kkv_cache *c = (kkv_cache *)1;
    CHECK(kkv_cache_create(NULL, NULL) == KKV_ERR_INVALID_ARG, "create(NULL)");
    CHECK(kkv_cache_create(&c, NULL) == KKV_ERR_INVALID_ARG && c == NULL, "create(&c, NULL)");
    kkv_cache_free(NULL);
    CHECK(kkv_cache_get_config(NULL) == NULL, "get_config(NULL)");
    int seq = 0;
    float x[64] = {0}, out[64];
    uint8_t rank[64];
    kkv_mem mem;
    CHECK(kkv_seq_add(NULL, &seq) == KKV_ERR_INVALID_ARG, "seq_add(NULL)");
    CHECK(kkv_seq_free(NULL, 0) == KKV_ERR_INVALID_ARG, "seq_free(NULL)");
    CHECK(kkv_seq_len(NULL, 0, 0) == -1, "seq_len(NULL)");
    CHECK(kkv_seq_reserve(NULL, 0, 1) == KKV_ERR_INVALID_ARG, "reserve(NULL)");
    CHECK(kkv_append(NULL, 0, 0, x, x) == KKV_ERR_INVALID_ARG, "append(NULL)");
    CHECK(kkv_flush(NULL, 0, 0) == KKV_ERR_INVALID_ARG, "flush(NULL)");
    CHECK(kkv_attend(NULL, out, 0, 0, x, 1) == KKV_ERR_INVALID_ARG, "attend(NULL)");
    CHECK(kkv_cache_set_rank(NULL, 0, 0, rank) == KKV_ERR_INVALID_ARG, "set_rank(NULL)");
    CHECK(kkv_seq_read(NULL, x, x, 0, 0, 0) == KKV_ERR_INVALID_ARG, "seq_read(NULL)");
    CHECK(kkv_seq_key_page(NULL, x, sizeof x, 0, 0, 0, 0) == KKV_ERR_INVALID_ARG, "key_page(NULL)");
    CHECK(kkv_cache_set_kernel(NULL, KKV_KERNEL_SCALAR) == KKV_ERR_INVALID_ARG, "set_kernel(NULL)");
    CHECK(kkv_cache_get_kernel(NULL) == KKV_KERNEL_AUTO, "get_kernel(NULL)");
    CHECK(kkv_seq_mem(NULL, &mem, 0) == KKV_ERR_INVALID_ARG, "seq_mem(NULL)");
    CHECK(kkv_cache_mem(NULL, &mem) == KKV_ERR_INVALID_ARG, "cache_mem(NULL)");
    CHECK(kkv_cache_free_bytes(NULL) == 0, "free_bytes(NULL)");
    CHECK(kkv_key_page_encode(NULL, x, 64, 4, 0, KKV_SELECT_MAGNITUDE, 0, 0, NULL) ==
              KKV_ERR_INVALID_ARG, "key_page_encode(NULL)");
    CHECK(kkv_value_page_decode(NULL, x, 64, 4, 2) == KKV_ERR_INVALID_ARG,
          "value_page_decode(NULL)");
    /* with a live cache: NULL buffers */
    kkv_method_from_name(&m, "kitty");
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 64,
                            .pool_bytes = 1 << 20, .method = m};
    if (kkv_cache_create(&c, &cfg) != KKV_OK) {
        CHECK(0, "create: %s", kkv_last_error());
        return;
    }
    CHECK(kkv_seq_add(c, NULL) == KKV_ERR_INVALID_ARG, "seq_add(c, NULL)");
    CHECK(kkv_seq_add(c, &seq) == KKV_OK, "seq_add");
    CHECK(kkv_append(c, seq, 0, NULL, x) == KKV_ERR_INVALID_ARG, "append NULL k");
    CHECK(kkv_append(c, seq, 0, x, x) == KKV_OK, "append");
    CHECK(kkv_attend(c, NULL, seq, 0, x, 1) == KKV_ERR_INVALID_ARG, "attend NULL out");
    CHECK(kkv_attend(c, out, seq, 0, NULL, 1) == KKV_ERR_INVALID_ARG, "attend NULL q");
    CHECK(kkv_seq_mem(c, NULL, seq) == KKV_ERR_INVALID_ARG, "seq_mem NULL out");
    CHECK(kkv_cache_set_rank(c, 0, 0, NULL) == KKV_ERR_INVALID_ARG, "set_rank NULL");
    CHECK(kkv_seq_key_page(c, NULL, 0, seq, 0, 0, 0) == KKV_ERR_INVALID_ARG, "key_page NULL");
    CHECK(kkv_seq_len(c, seq, 0) == 1, "state changed by failed calls: len %d",
          kkv_seq_len(c, seq, 0));
    /* extremes of integer arguments */
    CHECK(kkv_seq_reserve(c, seq, INT_MAX) != KKV_OK, "reserve INT_MAX");
    CHECK(kkv_seq_reserve(c, seq, -1) == KKV_ERR_INVALID_ARG, "reserve -1");
    CHECK(kkv_seq_len(c, seq, INT_MAX) == -1 && kkv_seq_len(c, INT_MIN, 0) == -1, "seq_len extremes");
    CHECK(kkv_attend(c, out, seq, 0, x, INT_MIN) == KKV_ERR_INVALID_ARG, "attend n_q INT_MIN");
    CHECK(kkv_flush(c, seq, INT_MAX) == KKV_ERR_INVALID_ARG, "flush layer INT_MAX");
    CHECK(kkv_seq_free(c, INT_MAX) == KKV_ERR_NOT_FOUND, "free INT_MAX");
    CHECK(kkv_seq_len(c, seq, 0) == 1 && kkv_cache_free_bytes(c) < cfg.pool_bytes,
          "state after extremes");
    /* a sequence marked failed refuses writes and attention, allows reads and free */
    CHECK(kkv_seq_mark_failed(NULL, seq) == KKV_ERR_INVALID_ARG, "mark_failed(NULL)");
    CHECK(kkv_seq_mark_failed(c, 99) == KKV_ERR_NOT_FOUND, "mark_failed(no seq)");
    CHECK(kkv_seq_mark_failed(c, seq) == KKV_OK, "mark_failed");
    CHECK(kkv_append(c, seq, 0, x, x) == KKV_ERR_INVALID_ARG &&
              contains(kkv_last_error(), "free it") &&
              kkv_attend(c, out, seq, 0, x, 1) == KKV_ERR_INVALID_ARG &&
              kkv_flush(c, seq, 0) == KKV_ERR_INVALID_ARG &&
              kkv_seq_reserve(c, seq, 1) == KKV_ERR_INVALID_ARG,
          "marked sequence still writable");
    float kr[64];
    CHECK(kkv_seq_read(c, kr, NULL, seq, 0, 0) == KKV_OK && kkv_seq_len(c, seq, 0) == 1,
          "marked sequence unreadable");
    CHECK(kkv_seq_free(c, seq) == KKV_OK && kkv_seq_add(c, &seq) == KKV_OK &&
              kkv_append(c, seq, 0, x, x) == KKV_OK, "a new sequence in the id is clean");
    kkv_cache_free(c);
    /* create with extreme configurations: errors, never a crash or a wrap */
    kkv_cache_config big = cfg;
    big.pool_bytes = SIZE_MAX;
    big.max_tokens = INT_MAX;
    big.n_layers = 4096;
    big.n_kv_heads = 1024;
    big.head_dim = 256;
    big.method.sink = 1 << 20;
    big.method.window = 1 << 20;
    big.method.group = 4096;
    c = NULL;
    kkv_status s = kkv_cache_create(&c, &big);
    if (s == KKV_OK) {
        int q;
        /* an empty sequence takes nothing; a token takes only its layer's
         * staging chunk (16 sink rows of 1024 heads x 256): it fits or is NOMEM */
        s = kkv_seq_add(c, &q);
        CHECK(s == KKV_OK, "empty sequence: %d", (int)s);
        float *x0 = s == KKV_OK ? calloc((size_t)1024 * 256, sizeof *x0) : NULL;
        if (x0) {
            s = kkv_append(c, q, 0, x0, x0);
            CHECK((s == KKV_OK && kkv_seq_len(c, q, 0) == 1) ||
                      (s == KKV_ERR_NOMEM && kkv_seq_len(c, q, 0) == 0),
                  "huge staging: %d", (int)s);
            free(x0);
        }
        kkv_cache_free(c);
    }
    big = cfg;
    big.n_layers = INT_MAX;
    CHECK(kkv_cache_create(&c, &big) == KKV_ERR_INVALID_ARG, "n_layers INT_MAX");
    big = cfg;
    big.head_dim = INT_MIN;
    CHECK(kkv_cache_create(&c, &big) == KKV_ERR_INVALID_ARG, "head_dim INT_MIN");
    big = cfg;
    big.method.group = INT_MAX;
    CHECK(kkv_cache_create(&c, &big) == KKV_ERR_INVALID_ARG, "group INT_MAX");
    CHECK(kkv_key_page_bytes(INT_MAX, INT_MAX, INT_MAX) > 0 || 1, "page bytes extreme");
    CHECK(kkv_key_page_bytes(-1, 128, 0) == 0 && kkv_value_page_bytes(64, INT_MIN, 2) == 0,
          "page bytes negative");
    /* model calls */
    kkv_model *md = (kkv_model *)1;
    CHECK(kkv_model_load(&md, NULL, 1) == KKV_ERR_INVALID_ARG && md == NULL, "load(NULL path)");
    CHECK(kkv_model_load(NULL, "x", 1) == KKV_ERR_INVALID_ARG, "load(NULL out)");
    kkv_model_free(NULL);
    kkv_model_info info;
    kkv_model_get_info(NULL, &info);
    CHECK(info.n_layers == 0, "get_info(NULL)");
    kkv_model_get_info(NULL, NULL);
    kkv_model_set_qkv_hook(NULL, NULL, NULL);
    CHECK(kkv_model_set_exact_matmul(NULL, 1) == KKV_ERR_INVALID_ARG, "exact(NULL)");
    int32_t tok = 0;
    int nt;
    size_t np;
    char pb[8];
    CHECK(kkv_model_forward(NULL, NULL, NULL, 0, &tok, 1, 0) == KKV_ERR_INVALID_ARG, "forward(NULL)");
    CHECK(kkv_model_decode_batch(NULL, NULL, NULL, &seq, &tok, 1) == KKV_ERR_INVALID_ARG,
          "decode_batch(NULL)");
    CHECK(kkv_tokenize(NULL, &tok, 1, &nt, "a", 1, 0, 0) == KKV_ERR_INVALID_ARG, "tokenize(NULL)");
    CHECK(kkv_token_piece(NULL, pb, sizeof pb, &np, 0) == KKV_ERR_INVALID_ARG, "piece(NULL)");
    kkv_cache_config mc = kkv_model_cache_config(NULL, NULL, 0);
    CHECK(mc.n_layers == 0, "cache_config(NULL)");
}

/* ---------------------------------------------------------------- model-based */

/* The default model mapped copy-on-write, so tests can patch bytes. */
typedef struct {
    unsigned char *p;
    size_t n;
} image;

static image map_model(const char *path) {
    image im = {NULL, 0};
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return im;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return im;
    im.p = p;
    im.n = (size_t)st.st_size;
    return im;
}

/* Replaces the first occurrence of a length-prefixed GGUF string `from` by
 * `to` (same length) in the metadata. */
static int patch_key(image im, const char *from, const char *to) {
    size_t l = strlen(from);
    unsigned char pat[8 + 128];
    uint64_t ll = l;
    memcpy(pat, &ll, 8);
    memcpy(pat + 8, from, l);
    for (size_t i = 0; i + 8 + l <= im.n && i < (64u << 20); i++)
        if (!memcmp(im.p + i, pat, 8 + l)) {
            memcpy(im.p + i + 8, to, l);
            return 0;
        }
    return -1;
}

/* Loads from a fresh copy-on-write image with patches applied; status. */
static kkv_status load_patched(const char *path, const char *const *from, const char *const *to,
                               int n_patch, uint64_t embd_rows) {
    image im = map_model(path);
    if (!im.p) return KKV_ERR_IO;
    for (int i = 0; i < n_patch; i++)
        if (patch_key(im, from[i], to[i])) {
            munmap(im.p, im.n);
            return KKV_ERR_NOT_FOUND;
        }
    if (embd_rows) {
        /* tensor info: "token_embd.weight", n_dims 2, ne0, ne1 */
        const char *nm = "token_embd.weight";
        size_t l = strlen(nm);
        for (size_t i = 0; i + 8 + l + 20 <= im.n && i < (64u << 20); i++)
            if (!memcmp(im.p + i + 8, nm, l) && im.p[i] == l && im.p[i + 8 + l] == 2) {
                memcpy(im.p + i + 8 + l + 4 + 8, &embd_rows, 8);
                break;
            }
    }
    kkv_gguf *g = NULL;
    kkv_model *m = NULL;
    kkv_status s = kkv_gguf_parse(&g, im.p, im.n);
    if (s == KKV_OK) s = kkv_model_from_gguf(&m, g, 1);
    kkv_model_free(m);
    munmap(im.p, im.n);
    return s;
}

static void test_load_messages(const char *path) {
    /* 2: a missing key is reported once, in plain words */
    const char *f1[] = {"tokenizer.ggml.merges"}, *t1[] = {"tokenizer.ggml.mergeZ"};
    kkv_status s = load_patched(path, f1, t1, 1, 0);
    CHECK(s == KKV_ERR_FORMAT && !strcmp(kkv_last_error(),
                                          "tokenizer: the file has no 'tokenizer.ggml.merges'"),
          "no merges: %d '%s'", (int)s, kkv_last_error());
    const char *f2[] = {"tokenizer.ggml.tokens"}, *t2[] = {"tokenizer.ggml.tokenZ"};
    s = load_patched(path, f2, t2, 1, 0);
    CHECK(s == KKV_ERR_FORMAT && !strcmp(kkv_last_error(),
                                          "tokenizer: the file has no 'tokenizer.ggml.tokens'"),
          "no tokens: %d '%s'", (int)s, kkv_last_error());
    /* 6: a vocabulary that does not match token_embd is rejected */
    const char *f3[] = {"llama.vocab_size"}, *t3[] = {"llama.vocab_sizZ"};
    s = load_patched(path, f3, t3, 1, 49151);
    CHECK(s == KKV_ERR_FORMAT && contains(kkv_last_error(), "tokenizer has"),
          "vocab mismatch: %d '%s'", (int)s, kkv_last_error());
    s = load_patched(path, f3, t3, 1, 0);
    CHECK(s == KKV_OK, "unpatched vocab: %d '%s'", (int)s, kkv_last_error());
    /* 10: a successful load leaves no stale message */
    kkv_fail(KKV_ERR_IO, "stale");
    kkv_model *m = NULL;
    s = kkv_model_load(&m, path, 1);
    CHECK(s == KKV_OK && kkv_last_error()[0] == 0, "after load: '%s'", kkv_last_error());
    kkv_model_free(m);
}

/* 5: a forward pass that meets non-finite activations. The hook poisons one
 * key; with the failure in the first layer of the first chunk nothing is
 * stored, otherwise the sequence is marked and refuses further use. */
typedef struct {
    int layer;
    int64_t pos;
} poison;

static void poison_hook(void *user, int seq, int layer, int64_t pos, const float *q,
                        const float *k, const float *v) {
    const poison *p = user;
    (void)seq, (void)q, (void)v;
    /* the buffer is the model's own scratch (non-const storage) */
    if (layer == p->layer && pos == p->pos) ((float *)(uintptr_t)k)[3] = NAN;
}

static void test_forward_nonfinite(const char *path) {
    kkv_model *m = NULL;
    if (kkv_model_load(&m, path, 1) != KKV_OK) {
        CHECK(0, "load: %s", kkv_last_error());
        return;
    }
    kkv_model_info in;
    kkv_model_get_info(m, &in);
    kkv_method me;
    kkv_method_from_name(&me, "kitty");
    kkv_cache_config cfg = kkv_model_cache_config(m, &me, 64u << 20);
    kkv_cache *c = NULL;
    float *lg = malloc((size_t)in.n_vocab * sizeof *lg), *ref = malloc((size_t)in.n_vocab * sizeof *ref);
    int32_t toks[6] = {1, 504, 3458, 314, 253, 1165};
    int seq = -1;
    if (!lg || !ref || kkv_cache_create(&c, &cfg) != KKV_OK || kkv_seq_add(c, &seq) != KKV_OK) {
        CHECK(0, "setup: %s", kkv_last_error());
        goto done;
    }
    CHECK(kkv_model_forward(m, c, ref, seq, toks, 6, 0) == KKV_OK, "reference: %s", kkv_last_error());
    kkv_seq_free(c, seq);
    uint64_t free0 = kkv_cache_free_bytes(c);

    /* layer 0, first token: nothing appended, the sequence stays usable */
    poison p0 = {0, 0};
    kkv_seq_add(c, &seq);
    kkv_model_set_qkv_hook(m, poison_hook, &p0);
    kkv_status s = kkv_model_forward(m, c, lg, seq, toks, 6, 0);
    kkv_model_set_qkv_hook(m, NULL, NULL);
    CHECK(s == KKV_ERR_NONFINITE && kkv_seq_len(c, seq, 0) == 0, "layer-0 poison: %d len %d",
          (int)s, kkv_seq_len(c, seq, 0));
    s = kkv_model_forward(m, c, lg, seq, toks, 6, 0);
    CHECK(s == KKV_OK && !memcmp(lg, ref, (size_t)in.n_vocab * sizeof *lg),
          "after an untouched failure: %d '%s'", (int)s, kkv_last_error());
    kkv_seq_free(c, seq);

    /* a later layer: the layers done so far hold the tokens; the sequence is
     * marked and every later use fails until it is freed */
    poison p1 = {in.n_layers > 1 ? 1 : 0, 2};
    kkv_seq_add(c, &seq);
    kkv_model_set_qkv_hook(m, poison_hook, &p1);
    s = kkv_model_forward(m, c, lg, seq, toks, 6, 0);
    kkv_model_set_qkv_hook(m, NULL, NULL);
    CHECK(s == KKV_ERR_NONFINITE, "layer-1 poison: %d", (int)s);
    s = kkv_model_forward(m, c, lg, seq, toks, 1, 0);
    CHECK(s == KKV_ERR_INVALID_ARG && contains(kkv_last_error(), "free it"),
          "forward on a failed sequence: %d '%s'", (int)s, kkv_last_error());
    float kv[1024] = {0};
    CHECK(kkv_append(c, seq, in.n_layers - 1, kv, kv) == KKV_ERR_INVALID_ARG,
          "append on a failed sequence");
    CHECK(kkv_seq_free(c, seq) == KKV_OK && kkv_cache_free_bytes(c) == free0,
          "free after failure: %llu vs %llu", (unsigned long long)kkv_cache_free_bytes(c),
          (unsigned long long)free0);
    /* the way back: a new sequence gives the reference again */
    kkv_seq_add(c, &seq);
    s = kkv_model_forward(m, c, lg, seq, toks, 6, 0);
    CHECK(s == KKV_OK && !memcmp(lg, ref, (size_t)in.n_vocab * sizeof *lg), "redo: %d", (int)s);

    /* single layer of a 1-layer failure in a second call: also marked (the
     * old code let it continue silently with a partial layer) */
    kkv_seq_free(c, seq);
    kkv_seq_add(c, &seq);
    CHECK(kkv_model_forward(m, c, lg, seq, toks, 3, 0) == KKV_OK, "prefix");
    poison p2 = {0, 4};
    kkv_model_set_qkv_hook(m, poison_hook, &p2);
    s = kkv_model_forward(m, c, lg, seq, toks + 3, 3, 0);
    kkv_model_set_qkv_hook(m, NULL, NULL);
    CHECK(s == KKV_ERR_NONFINITE && kkv_seq_len(c, seq, 0) == 4, "mid-chunk: %d len %d", (int)s,
          kkv_seq_len(c, seq, 0));
    CHECK(kkv_model_forward(m, c, lg, seq, toks, 1, 0) == KKV_ERR_INVALID_ARG,
          "mid-chunk failure not marked");
    /* 10: the empty prompt has its own message */
    kkv_seq_free(c, seq);
    kkv_seq_add(c, &seq);
    s = kkv_model_forward(m, c, lg, seq, toks, 0, 0);
    CHECK(s == KKV_ERR_INVALID_ARG && contains(kkv_last_error(), "0 tokens"), "n = 0: '%s'",
          kkv_last_error());
done:
    free(lg);
    free(ref);
    kkv_cache_free(c);
    kkv_model_free(m);
}

/* ---------------------------------------------------------------- threads */

/* The header's thread contract: kkv_tokenize on one model from several threads
 * at once, and distinct caches driven from distinct threads, give what one
 * thread gives. */
typedef struct {
    const kkv_model *m;
    kkv_cache *c;
    const char *text;
    int32_t ids[512];
    int n;
    float out[4 * 32];
    kkv_status st;
} tjob;

static void *tokenize_job(void *arg) {
    tjob *j = arg;
    for (int r = 0; r < 20 && j->st == KKV_OK; r++)
        j->st = kkv_tokenize(j->m, j->ids, 512, &j->n, j->text, strlen(j->text), 1, 1);
    return NULL;
}

static void *cache_job(void *arg) {
    tjob *j = arg;
    int seq;
    float kv[2 * 32], q[4 * 32];
    j->st = kkv_seq_add(j->c, &seq);
    for (int t = 0; t < 300 && j->st == KKV_OK; t++) {
        for (int i = 0; i < 64; i++) kv[i] = sinf((float)(t * 64 + i));
        for (int i = 0; i < 128; i++) q[i] = cosf((float)(t * 128 + i));
        j->st = kkv_append(j->c, seq, 0, kv, kv);
        if (j->st == KKV_OK) j->st = kkv_attend(j->c, j->out, seq, 0, q, 4);
        if (j->st == KKV_OK) j->st = kkv_flush(j->c, seq, 0);
    }
    return NULL;
}

static void test_threads(const kkv_model *m) {
    kkv_method me;
    kkv_method_from_name(&me, "kitty");
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 2, .head_dim = 32,
                            .pool_bytes = 8u << 20, .n_threads = 2, .method = me};
    tjob ref = {.st = KKV_OK}, jobs[3];
    if (kkv_cache_create(&ref.c, &cfg) != KKV_OK) {
        CHECK(0, "create: %s", kkv_last_error());
        return;
    }
    cache_job(&ref);
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].st = kkv_cache_create(&jobs[i].c, &cfg);
        if (jobs[i].st == KKV_OK) pthread_create(&th[i], NULL, cache_job, &jobs[i]);
    }
    for (int i = 0; i < 3; i++) {
        if (jobs[i].c) pthread_join(th[i], NULL);
        CHECK(ref.st == KKV_OK && jobs[i].st == KKV_OK &&
                  !memcmp(jobs[i].out, ref.out, sizeof ref.out),
              "cache thread %d: %d", i, (int)jobs[i].st);
        kkv_cache_free(jobs[i].c);
    }
    kkv_cache_free(ref.c);
    if (!m) return;
    const char *text = "<|im_start|>user\nThe quick brown fox, caf\u00e9 \u65e5\u672c, "
                       "jumps over 12345 lazy dogs.<|im_end|>\n";
    tjob tr = {.m = m, .text = text, .st = KKV_OK};
    tokenize_job(&tr);
    for (int i = 0; i < 3; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].m = m;
        jobs[i].text = text;
        pthread_create(&th[i], NULL, tokenize_job, &jobs[i]);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK(tr.st == KKV_OK && jobs[i].st == KKV_OK && jobs[i].n == tr.n &&
                  !memcmp(jobs[i].ids, tr.ids, (size_t)tr.n * sizeof tr.ids[0]),
              "tokenize thread %d: %d, %d ids vs %d", i, (int)jobs[i].st, jobs[i].n, tr.n);
    }
}

int main(void) {
    make_tmp();
    test_npy();
    test_fail_overlap();
    test_gguf_dimension_message();
    test_files();
    test_null_contract();

    const char *path = getenv("KKV_MODEL") && *getenv("KKV_MODEL")
                           ? getenv("KKV_MODEL")
                           : KKV_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *req = getenv("KKV_REQUIRE_MODEL");
    if (access(path, R_OK) == 0) {
        test_load_messages(path);
        test_forward_nonfinite(path);
        kkv_model *m = NULL;
        CHECK(kkv_model_load(&m, path, 1) == KKV_OK, "load: %s", kkv_last_error());
        test_threads(m);
        kkv_model_free(m);
    } else if (req && !strcmp(req, "1")) {
        CHECK(0, "model %s missing and KKV_REQUIRE_MODEL=1", path);
    } else {
        printf("note: no model at %s: model-based checks skipped\n", path);
        test_threads(NULL);
    }
    if (g_tmp[0]) rmdir(g_tmp);
    return tu_summary();
}
