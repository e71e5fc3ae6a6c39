/* GGUF v2/v3 reader. Parsing walks the file once with a bounds-checked
 * cursor; every count is capped by the bytes left before anything is
 * allocated, so a hostile header cannot make us allocate more than a small
 * multiple of the file size. After a successful parse every pointer handed
 * out is known to be inside the buffer. */
#define _DEFAULT_SOURCE /* madvise */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"
#include "model/weights.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_NESTING 16 /* arrays of arrays deeper than this are rejected */
/* Smallest encodings, used to cap counts before allocating: a kv is a key
 * length (8), a type (4) and at least a 1-byte value; a tensor info is a name
 * length (8), n_dims (4), one dimension (8), a type (4) and an offset (8). */
#define GGUF_MIN_KV_BYTES 13u
#define GGUF_MIN_TENSOR_BYTES 32u
#define GGUF_MIN_ARRAY_BYTES 12u /* a nested array: element type + count */

typedef struct kv_entry {
    kkv_gguf_str   key;
    kkv_gguf_type  type;
    uint64_t       off;       /* byte offset of the value, for messages */
    const uint8_t *val;       /* scalar: the value bytes in the buffer */
    kkv_gguf_str   str;       /* STRING */
    kkv_gguf_type  elem_type; /* ARRAY */
    uint64_t       n;         /* ARRAY: element count */
    const uint8_t *arr;       /* ARRAY: first element in the buffer */
    kkv_gguf_str  *strs;      /* ARRAY of STRING: [n], owned */
} kv_entry;

typedef struct tensor_rec {
    kkv_gguf_tensor t;
    uint64_t        info_off; /* where its tensor info starts, for messages */
} tensor_rec;

struct kkv_gguf {
    const uint8_t    *base;     /* [size] */
    size_t            size;
    void             *map;      /* the mapping when opened from a file, else NULL */
    uint32_t          version;
    uint32_t          alignment;
    uint64_t          data_offset;
    uint64_t          n_kv;
    kv_entry         *kv;       /* [n_kv], file order */
    const kv_entry  **kv_by_key;/* [n_kv], sorted by key */
    uint64_t          n_tensors;
    tensor_rec       *tensors;  /* [n_tensors], file order */
    const tensor_rec **t_by_name; /* [n_tensors], sorted by name */
};

/* ---- cursor ---- */

typedef struct rd {
    const uint8_t *p;
    size_t         size;
    size_t         pos;
} rd;

static size_t rd_left(const rd *r) { return r->size - r->pos; }

/* Copies a name from the file into buf as printable ASCII (others become '?'),
 * cut at 64 bytes, so an error message stays one readable line. */
static const char *safe_name(char *buf, size_t cap, kkv_gguf_str s) {
    size_t n = s.len < cap - 4 ? (size_t)s.len : cap - 4, i;
    for (i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        buf[i] = (c >= 32 && c < 127) ? (char)c : '?';
    }
    if (n < s.len) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = 0;
    return buf;
}

static kkv_status truncated(const rd *r, const char *what, size_t need) {
    return kkv_fail(KKV_ERR_FORMAT, "gguf: truncated %s at byte offset %zu (needs %zu bytes, %zu left)",
                    what, r->pos, need, rd_left(r));
}

static kkv_status rd_bytes(rd *r, const uint8_t **out, size_t n, const char *what) {
    if (rd_left(r) < n) return truncated(r, what, n);
    *out = r->p + r->pos;
    r->pos += n;
    return KKV_OK;
}

static kkv_status rd_u32(rd *r, uint32_t *out, const char *what) {
    const uint8_t *b = NULL;
    KKV_TRY(rd_bytes(r, &b, 4, what));
    *out = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return KKV_OK;
}

static kkv_status rd_u64(rd *r, uint64_t *out, const char *what) {
    uint32_t lo = 0, hi = 0;
    KKV_TRY(rd_u32(r, &lo, what));
    KKV_TRY(rd_u32(r, &hi, what));
    *out = (uint64_t)hi << 32 | lo;
    return KKV_OK;
}

static kkv_status rd_str(rd *r, kkv_gguf_str *out, const char *what) {
    size_t at = r->pos;
    uint64_t len = 0;
    KKV_TRY(rd_u64(r, &len, what));
    if (len > rd_left(r))
        return kkv_fail(KKV_ERR_FORMAT,
                        "gguf: %s at byte offset %zu claims %llu bytes but only %zu remain", what, at,
                        (unsigned long long)len, rd_left(r));
    out->ptr = (const char *)r->p + r->pos;
    out->len = len;
    r->pos += (size_t)len;
    return KKV_OK;
}

/* Size of a scalar value type, 0 for STRING/ARRAY, -1 for an unknown type. */
static int scalar_size(uint32_t t) {
    static const int sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof sz / sizeof sz[0] ? sz[t] : -1;
}

static kkv_status bad_type(size_t at, uint32_t t) {
    return kkv_fail(KKV_ERR_FORMAT, "gguf: unknown metadata value type %u at byte offset %zu", t, at);
}

/* Checks n elements of type t (n * size) fit, then steps over them. */
static kkv_status skip_array(rd *r, uint32_t t, uint64_t n, int depth);

static kkv_status skip_value(rd *r, uint32_t t, int depth) {
    int sz = scalar_size(t);
    if (sz < 0) return bad_type(r->pos, t);
    const uint8_t *b = NULL;
    if (sz > 0) return rd_bytes(r, &b, (size_t)sz, "metadata value");
    if (t == KKV_GGUF_STRING) {
        kkv_gguf_str s;
        return rd_str(r, &s, "string");
    }
    uint32_t et = 0;
    uint64_t n = 0;
    KKV_TRY(rd_u32(r, &et, "array element type"));
    KKV_TRY(rd_u64(r, &n, "array length"));
    return skip_array(r, et, n, depth + 1);
}

static kkv_status skip_array(rd *r, uint32_t t, uint64_t n, int depth) {
    if (depth > GGUF_MAX_NESTING)
        return kkv_fail(KKV_ERR_FORMAT, "gguf: arrays nested deeper than %d at byte offset %zu",
                        GGUF_MAX_NESTING, r->pos);
    int sz = scalar_size(t);
    if (sz < 0) return bad_type(r->pos - 12, t);
    /* every element takes at least this many bytes: caps the loop below */
    uint64_t min = sz > 0 ? (uint64_t)sz : (t == KKV_GGUF_STRING ? 8u : GGUF_MIN_ARRAY_BYTES);
    if (n > rd_left(r) / min)
        return kkv_fail(KKV_ERR_FORMAT,
                        "gguf: array at byte offset %zu claims %llu elements of type %u but only %zu bytes remain",
                        r->pos - 12, (unsigned long long)n, t, rd_left(r));
    if (sz > 0) {
        r->pos += (size_t)(n * (uint64_t)sz);
        return KKV_OK;
    }
    for (uint64_t i = 0; i < n; i++) KKV_TRY(skip_value(r, t, depth));
    return KKV_OK;
}

/* Reads the value of kv e (its type already set). Top-level string arrays are
 * indexed into e->strs; nested arrays are only checked and skipped. */
static kkv_status read_value(rd *r, kv_entry *e) {
    e->off = r->pos;
    int sz = scalar_size(e->type);
    if (sz < 0) return bad_type(r->pos - 4, e->type);
    if (sz > 0) return rd_bytes(r, &e->val, (size_t)sz, "metadata value");
    if (e->type == KKV_GGUF_STRING) return rd_str(r, &e->str, "string value");
    uint32_t et = 0;
    KKV_TRY(rd_u32(r, &et, "array element type"));
    KKV_TRY(rd_u64(r, &e->n, "array length"));
    e->elem_type = (kkv_gguf_type)et;
    e->arr = r->p + r->pos;
    if (et != KKV_GGUF_STRING) return skip_array(r, et, e->n, 1);
    if (e->n > rd_left(r) / 8)
        return kkv_fail(KKV_ERR_FORMAT,
                        "gguf: string array at byte offset %llu claims %llu strings but only %zu bytes remain",
                        (unsigned long long)e->off, (unsigned long long)e->n, rd_left(r));
    if (e->n == 0) return KKV_OK;
    e->strs = malloc((size_t)e->n * sizeof *e->strs);
    if (!e->strs) return kkv_fail(KKV_ERR_NOMEM, "gguf: out of memory for a %llu-string array",
                                  (unsigned long long)e->n);
    for (uint64_t i = 0; i < e->n; i++) KKV_TRY(rd_str(r, &e->strs[i], "string array element"));
    return KKV_OK;
}

/* ---- sorted indexes ---- */

static int str_cmp(kkv_gguf_str a, kkv_gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}

static int kv_cmp(const void *a, const void *b) {
    return str_cmp((*(const kv_entry *const *)a)->key, (*(const kv_entry *const *)b)->key);
}

static int tensor_cmp(const void *a, const void *b) {
    return str_cmp((*(const tensor_rec *const *)a)->t.name, (*(const tensor_rec *const *)b)->t.name);
}

static kkv_gguf_str cstr(const char *c) {
    kkv_gguf_str s = {c, strlen(c)};
    return s;
}

/* ---- parse ---- */

static kkv_status parse_header(kkv_gguf *g, rd *r) {
    const uint8_t *magic = NULL;
    if (r->size < 4) return truncated(r, "magic", 4);
    KKV_TRY(rd_bytes(r, &magic, 4, "magic"));
    if (memcmp(magic, "GGUF", 4) != 0)
        return kkv_fail(KKV_ERR_FORMAT, "gguf: bad magic at byte offset 0 (not a GGUF file)");
    KKV_TRY(rd_u32(r, &g->version, "version"));
    if (g->version == 1)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "gguf: version 1 files (32-bit counts) are not supported; "
                                             "convert to v3");
    if (g->version != 2 && g->version != 3)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "gguf: version %u at byte offset 4 is not supported (2 or 3, "
                                             "little-endian)", g->version);
    KKV_TRY(rd_u64(r, &g->n_tensors, "tensor count"));
    KKV_TRY(rd_u64(r, &g->n_kv, "metadata count"));
    uint64_t left = rd_left(r);
    if (g->n_kv > left / GGUF_MIN_KV_BYTES || g->n_tensors > left / GGUF_MIN_TENSOR_BYTES ||
        g->n_kv * GGUF_MIN_KV_BYTES > left - g->n_tensors * GGUF_MIN_TENSOR_BYTES)
        return kkv_fail(KKV_ERR_FORMAT,
                        "gguf: header at byte offset 8 claims %llu tensors and %llu metadata entries, "
                        "more than the %llu remaining bytes can hold",
                        (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv,
                        (unsigned long long)left);
    return KKV_OK;
}

static kkv_status parse_kv(kkv_gguf *g, rd *r) {
    if (g->n_kv) {
        g->kv = calloc((size_t)g->n_kv, sizeof *g->kv);
        g->kv_by_key = malloc((size_t)g->n_kv * sizeof *g->kv_by_key);
        if (!g->kv || !g->kv_by_key) return kkv_fail(KKV_ERR_NOMEM, "gguf: out of memory for metadata");
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        kv_entry *e = &g->kv[i];
        uint32_t t = 0;
        KKV_TRY(rd_str(r, &e->key, "metadata key"));
        KKV_TRY(rd_u32(r, &t, "metadata value type"));
        e->type = (kkv_gguf_type)t;
        KKV_TRY(read_value(r, e));
        g->kv_by_key[i] = e;
    }
    if (g->n_kv > 1) qsort(g->kv_by_key, (size_t)g->n_kv, sizeof *g->kv_by_key, kv_cmp);
    for (uint64_t i = 1; i < g->n_kv; i++) {
        if (str_cmp(g->kv_by_key[i - 1]->key, g->kv_by_key[i]->key) == 0) {
            char nb[80];
            return kkv_fail(KKV_ERR_FORMAT, "gguf: duplicate metadata key '%s' (value at byte offset %llu)",
                            safe_name(nb, sizeof nb, g->kv_by_key[i]->key),
                            (unsigned long long)g->kv_by_key[i]->off);
        }
    }
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = kkv_gguf_find(g, "general.alignment");
    if (ai >= 0) {
        const kv_entry *e = &g->kv[ai];
        uint32_t a;
        if (e->type != KKV_GGUF_U32)
            return kkv_fail(KKV_ERR_FORMAT, "gguf: general.alignment at byte offset %llu has type %u, not u32",
                            (unsigned long long)e->off, (unsigned)e->type);
        memcpy(&a, e->val, 4); /* the format is little-endian, as are our targets */
        if (a == 0 || (a & (a - 1)) != 0)
            return kkv_fail(KKV_ERR_FORMAT,
                            "gguf: general.alignment %u at byte offset %llu is not a nonzero power of two", a,
                            (unsigned long long)e->off);
        g->alignment = a;
    }
    return KKV_OK;
}

static kkv_status parse_tensor_info(tensor_rec *tr, rd *r) {
    kkv_gguf_tensor *t = &tr->t;
    char nb[80];
    tr->info_off = r->pos;
    KKV_TRY(rd_str(r, &t->name, "tensor name"));
    uint32_t nd = 0;
    size_t nd_at = r->pos;
    KKV_TRY(rd_u32(r, &nd, "tensor n_dims"));
    if (nd < 1 || nd > 4)
        return kkv_fail(KKV_ERR_FORMAT, "gguf: tensor '%s' has n_dims %u at byte offset %zu (must be 1..4)",
                        safe_name(nb, sizeof nb, t->name), nd, nd_at);
    t->n_dims = (int)nd;
    uint64_t elems = 1;
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        uint64_t ne = 0;
        size_t at = r->pos;
        KKV_TRY(rd_u64(r, &ne, "tensor dimension"));
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return kkv_fail(KKV_ERR_FORMAT, "gguf: tensor '%s' has dimension %u = %llu at byte "
                            "offset %zu (must be 1..2^63-1)",
                            safe_name(nb, sizeof nb, t->name), d, (unsigned long long)ne, at);
        if (ne > (uint64_t)INT64_MAX / elems)
            return kkv_fail(KKV_ERR_FORMAT, "gguf: tensor '%s' element count overflows at byte offset %zu",
                            safe_name(nb, sizeof nb, t->name), at);
        elems *= ne;
        t->ne[d] = (int64_t)ne;
    }
    size_t type_at = r->pos;
    KKV_TRY(rd_u32(r, &t->type, "tensor type"));
    int be = kkv_wt_block_elems(t->type);
    uint64_t bb = kkv_wt_block_bytes(t->type);
    if (be == 0)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "gguf: tensor '%s' has unknown ggml type %u at byte offset %zu",
                        safe_name(nb, sizeof nb, t->name), t->type, type_at);
    if (t->ne[0] % be != 0)
        return kkv_fail(KKV_ERR_FORMAT,
                        "gguf: tensor '%s' (info at byte offset %llu): row of %lld is not a multiple of the "
                        "%s block size %d", safe_name(nb, sizeof nb, t->name),
                        (unsigned long long)tr->info_off, (long long)t->ne[0], kkv_wt_name(t->type), be);
    /* elems fits int64 and rows are whole blocks, so blocks * bb is checked once */
    uint64_t blocks = elems / (uint64_t)be;
    if (blocks > UINT64_MAX / bb)
        return kkv_fail(KKV_ERR_FORMAT, "gguf: tensor '%s' byte size overflows (info at byte offset %llu)",
                        safe_name(nb, sizeof nb, t->name), (unsigned long long)tr->info_off);
    t->nbytes = blocks * bb;
    KKV_TRY(rd_u64(r, &t->offset, "tensor offset"));
    return KKV_OK;
}

static kkv_status parse_tensors(kkv_gguf *g, rd *r) {
    if (g->n_tensors) {
        g->tensors = calloc((size_t)g->n_tensors, sizeof *g->tensors);
        g->t_by_name = malloc((size_t)g->n_tensors * sizeof *g->t_by_name);
        if (!g->tensors || !g->t_by_name) return kkv_fail(KKV_ERR_NOMEM, "gguf: out of memory for tensor infos");
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        KKV_TRY(parse_tensor_info(&g->tensors[i], r));
        g->t_by_name[i] = &g->tensors[i];
    }
    uint64_t a = g->alignment, end = r->pos;
    /* end < size, so the rounding cannot overflow 64 bits */
    g->data_offset = (end + a - 1) / a * a;
    char nb[80];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tensor_rec *tr = &g->tensors[i];
        kkv_gguf_tensor *t = &tr->t;
        if (t->offset % a != 0)
            return kkv_fail(KKV_ERR_FORMAT,
                            "gguf: tensor '%s' (info at byte offset %llu) has offset %llu, not a multiple of "
                            "the alignment %llu", safe_name(nb, sizeof nb, t->name),
                            (unsigned long long)tr->info_off, (unsigned long long)t->offset,
                            (unsigned long long)a);
        if (g->data_offset > g->size || t->offset > g->size - g->data_offset ||
            t->nbytes > g->size - g->data_offset - t->offset)
            return kkv_fail(KKV_ERR_FORMAT,
                            "gguf: tensor '%s' (info at byte offset %llu): data [%llu, +%llu) past the end of "
                            "the %zu-byte file", safe_name(nb, sizeof nb, t->name),
                            (unsigned long long)tr->info_off,
                            (unsigned long long)(g->data_offset + t->offset), (unsigned long long)t->nbytes,
                            g->size);
        t->data = g->base + g->data_offset + t->offset;
    }
    if (g->n_tensors > 1) qsort(g->t_by_name, (size_t)g->n_tensors, sizeof *g->t_by_name, tensor_cmp);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        if (str_cmp(g->t_by_name[i - 1]->t.name, g->t_by_name[i]->t.name) == 0)
            return kkv_fail(KKV_ERR_FORMAT, "gguf: duplicate tensor name '%s' (info at byte offset %llu)",
                            safe_name(nb, sizeof nb, g->t_by_name[i]->t.name),
                            (unsigned long long)g->t_by_name[i]->info_off);
    }
    return KKV_OK;
}

kkv_status kkv_gguf_parse(kkv_gguf **out, const void *data, size_t size) {
    *out = NULL;
    if (!data && size) return kkv_fail(KKV_ERR_INVALID_ARG, "gguf: NULL buffer");
    kkv_gguf *g = calloc(1, sizeof *g);
    if (!g) return kkv_fail(KKV_ERR_NOMEM, "gguf: out of memory");
    g->base = data;
    g->size = size;
    rd r = {data, size, 0};
    kkv_status s = parse_header(g, &r);
    if (s == KKV_OK) s = parse_kv(g, &r);
    if (s == KKV_OK) s = parse_tensors(g, &r);
    if (s != KKV_OK) {
        kkv_gguf_close(g);
        return s;
    }
    *out = g;
    return KKV_OK;
}

kkv_status kkv_gguf_open(kkv_gguf **out, const char *path) {
    if (!out) return kkv_fail(KKV_ERR_INVALID_ARG, "gguf: out is NULL");
    *out = NULL;
    if (!path) return kkv_fail(KKV_ERR_INVALID_ARG, "gguf: path is NULL");
    char shown[160];
    kkv_printable(shown, sizeof shown, path, strlen(path));
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected
     * below as not a regular file. (No reads go through fd: it is mapped.) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return kkv_fail(KKV_ERR_IO, "gguf: cannot open '%s': %s", shown, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kkv_fail(KKV_ERR_IO, "gguf: cannot stat '%s': %s", shown, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kkv_fail(KKV_ERR_IO, "gguf: '%s' is %s, not a regular file", shown,
                        S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                        : S_ISCHR(st.st_mode) ? "a character device" : "a special file");
    }
    if (st.st_size < 24) {
        close(fd);
        return kkv_fail(KKV_ERR_FORMAT, "gguf: '%s' is %lld bytes, too short for a GGUF header",
                        shown, (long long)st.st_size);
    }
    if ((unsigned long long)st.st_size > SIZE_MAX) {
        close(fd);
        return kkv_fail(KKV_ERR_IO, "gguf: '%s' is too large to map", shown);
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd); /* the mapping keeps the file open */
    if (map == MAP_FAILED)
        return kkv_fail(KKV_ERR_IO, "gguf: cannot map '%s': %s", shown, strerror(map_errno));
    kkv_gguf *g;
    kkv_status s = kkv_gguf_parse(&g, map, size);
    if (s != KKV_OK) { /* the parser's message, with the file it is about */
        munmap(map, size);
        const char *e = kkv_last_error();
        return kkv_fail(s, "gguf: '%s': %s", shown, strncmp(e, "gguf: ", 6) ? e : e + 6);
    }
    g->map = map;
    *out = g;
    return KKV_OK;
}

void kkv_gguf_close(kkv_gguf *g) {
    if (!g) return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++) free(g->kv[i].strs);
    free(g->kv);
    free(g->kv_by_key);
    free(g->tensors);
    free(g->t_by_name);
    if (g->map) munmap(g->map, g->size);
    free(g);
}

void kkv_gguf_release(const kkv_gguf *g, const void *p, size_t n) {
    if (!g || !g->map || n == 0) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)g->base;
    uintptr_t a = (uintptr_t)p, b = a + n;
    if (a < lo || b > lo + g->size || b < a) return; /* not ours */
    a = (a + page - 1) / page * page;
    b = b / page * page;
    /* MAP_PRIVATE and never written: the pages come back from the file */
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* ---- queries ---- */

uint32_t kkv_gguf_version(const kkv_gguf *g) { return g->version; }
uint64_t kkv_gguf_n_kv(const kkv_gguf *g) { return g->n_kv; }
uint32_t kkv_gguf_alignment(const kkv_gguf *g) { return g->alignment; }
uint64_t kkv_gguf_data_offset(const kkv_gguf *g) { return g->data_offset; }

kkv_gguf_str kkv_gguf_kv_key(const kkv_gguf *g, uint64_t i) {
    kkv_gguf_str none = {"", 0};
    return i < g->n_kv ? g->kv[i].key : none;
}

kkv_gguf_type kkv_gguf_kv_type(const kkv_gguf *g, uint64_t i) {
    return i < g->n_kv ? g->kv[i].type : KKV_GGUF_U8;
}

int64_t kkv_gguf_find(const kkv_gguf *g, const char *key) {
    kkv_gguf_str k = cstr(key);
    uint64_t lo = 0, hi = g->n_kv;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(g->kv_by_key[mid]->key, k);
        if (c == 0) return (int64_t)(g->kv_by_key[mid] - g->kv);
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}

static kkv_status lookup(const kv_entry **out, const kkv_gguf *g, const char *key) {
    int64_t i = kkv_gguf_find(g, key);
    if (i < 0) return kkv_fail(KKV_ERR_NOT_FOUND, "gguf: no metadata key '%s'", key);
    *out = &g->kv[i];
    return KKV_OK;
}

static kkv_status wrong_type(const kv_entry *e, const char *key, const char *want) {
    return kkv_fail(KKV_ERR_FORMAT, "gguf: metadata '%s' (byte offset %llu) has type %u, expected %s", key,
                    (unsigned long long)e->off, (unsigned)e->type, want);
}

/* An integer value as a sign flag and magnitude, so u64 and i64 both fit. */
static int int_value(const kv_entry *e, int *neg, uint64_t *mag) {
    const uint8_t *v = e->val;
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    int64_t s = 0;
    int is_signed = 0;
    switch (e->type) {
    case KKV_GGUF_U8: memcpy(&u8, v, 1); u64 = u8; break;
    case KKV_GGUF_U16: memcpy(&u16, v, 2); u64 = u16; break;
    case KKV_GGUF_U32: memcpy(&u32, v, 4); u64 = u32; break;
    case KKV_GGUF_U64: memcpy(&u64, v, 8); break;
    case KKV_GGUF_I8: { int8_t t; memcpy(&t, v, 1); s = t; is_signed = 1; u64 = 0; break; }
    case KKV_GGUF_I16: { int16_t t; memcpy(&t, v, 2); s = t; is_signed = 1; u64 = 0; break; }
    case KKV_GGUF_I32: { int32_t t; memcpy(&t, v, 4); s = t; is_signed = 1; u64 = 0; break; }
    case KKV_GGUF_I64: memcpy(&s, v, 8); is_signed = 1; u64 = 0; break;
    default: return 0;
    }
    if (is_signed) {
        *neg = s < 0;
        *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    } else {
        *neg = 0;
        *mag = u64;
    }
    return 1;
}

kkv_status kkv_gguf_get_i64(const kkv_gguf *g, const char *key, int64_t *out) {
    const kv_entry *e = NULL;
    KKV_TRY(lookup(&e, g, key));
    int neg;
    uint64_t mag;
    if (!int_value(e, &neg, &mag)) return wrong_type(e, key, "an integer");
    if (neg ? mag > (uint64_t)INT64_MAX + 1 : mag > (uint64_t)INT64_MAX)
        return kkv_fail(KKV_ERR_FORMAT, "gguf: metadata '%s' does not fit in int64", key);
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag; /* two's complement wrap is exact here */
    return KKV_OK;
}

kkv_status kkv_gguf_get_u32(const kkv_gguf *g, const char *key, uint32_t *out) {
    const kv_entry *e = NULL;
    KKV_TRY(lookup(&e, g, key));
    int neg;
    uint64_t mag;
    if (!int_value(e, &neg, &mag)) return wrong_type(e, key, "an integer");
    if ((neg && mag != 0) || mag > UINT32_MAX)
        return kkv_fail(KKV_ERR_FORMAT, "gguf: metadata '%s' does not fit in u32", key);
    *out = (uint32_t)mag;
    return KKV_OK;
}

kkv_status kkv_gguf_get_f32(const kkv_gguf *g, const char *key, float *out) {
    const kv_entry *e = NULL;
    KKV_TRY(lookup(&e, g, key));
    if (e->type == KKV_GGUF_F32) {
        memcpy(out, e->val, 4);
    } else if (e->type == KKV_GGUF_F64) {
        double d;
        memcpy(&d, e->val, 8);
        *out = (float)d;
    } else {
        return wrong_type(e, key, "f32 or f64");
    }
    return KKV_OK;
}

kkv_status kkv_gguf_get_bool(const kkv_gguf *g, const char *key, int *out) {
    const kv_entry *e = NULL;
    KKV_TRY(lookup(&e, g, key));
    if (e->type != KKV_GGUF_BOOL) return wrong_type(e, key, "bool");
    *out = e->val[0] != 0;
    return KKV_OK;
}

kkv_status kkv_gguf_get_str(const kkv_gguf *g, const char *key, kkv_gguf_str *out) {
    const kv_entry *e = NULL;
    KKV_TRY(lookup(&e, g, key));
    if (e->type != KKV_GGUF_STRING) return wrong_type(e, key, "string");
    *out = e->str;
    return KKV_OK;
}

kkv_status kkv_gguf_get_str_arr(const kkv_gguf *g, const char *key, const kkv_gguf_str **out,
                                uint64_t *n) {
    const kv_entry *e = NULL;
    KKV_TRY(lookup(&e, g, key));
    if (e->type != KKV_GGUF_ARRAY || e->elem_type != KKV_GGUF_STRING)
        return wrong_type(e, key, "array of strings");
    *out = e->strs;
    *n = e->n;
    return KKV_OK;
}

kkv_status kkv_gguf_get_arr(const kkv_gguf *g, const char *key, kkv_gguf_type *elem_type,
                            const void **data, uint64_t *n) {
    const kv_entry *e = NULL;
    KKV_TRY(lookup(&e, g, key));
    if (e->type != KKV_GGUF_ARRAY || scalar_size(e->elem_type) <= 0)
        return wrong_type(e, key, "array of numbers or bools");
    *elem_type = e->elem_type;
    *data = e->arr;
    *n = e->n;
    return KKV_OK;
}

kkv_status kkv_gguf_kv_value(kkv_gguf_value *out, const kkv_gguf *g, uint64_t i) {
    if (i >= g->n_kv)
        return kkv_fail(KKV_ERR_INVALID_ARG, "gguf: metadata index %llu out of range", (unsigned long long)i);
    const kv_entry *e = &g->kv[i];
    memset(out, 0, sizeof *out);
    out->type = e->type;
    out->offset = e->off;
    out->scalar = e->val;
    out->str = e->str;
    if (e->type == KKV_GGUF_ARRAY) {
        out->elem_type = e->elem_type;
        out->n = e->n;
        out->arr = scalar_size(e->elem_type) > 0 ? e->arr : NULL;
        out->strs = e->strs;
    }
    return KKV_OK;
}

uint64_t kkv_gguf_n_tensors(const kkv_gguf *g) { return g->n_tensors; }

const kkv_gguf_tensor *kkv_gguf_tensor_at(const kkv_gguf *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i].t : NULL;
}

const kkv_gguf_tensor *kkv_gguf_find_tensor(const kkv_gguf *g, const char *name) {
    kkv_gguf_str k = cstr(name);
    uint64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = str_cmp(g->t_by_name[mid]->t.name, k);
        if (c == 0) return &g->t_by_name[mid]->t;
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

int kkv_gguf_str_eq(kkv_gguf_str s, const char *c) {
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}
