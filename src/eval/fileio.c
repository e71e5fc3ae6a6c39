/* Bounded reads of untrusted files, shared by the CLI, the evaluation and the
 * fuzz targets: a whole file with a size cap, and the layout of a 2-D float32
 * tensor file (declarations and contracts in kittykv_eval.h). */
#include "kittykv_eval.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

kkv_status kkv_file_read(char **out, size_t *len, const char *path, size_t max_bytes) {
    if (!out || !len || !path) return kkv_fail(KKV_ERR_INVALID_ARG, "read file: NULL argument");
    *out = NULL;
    *len = 0;
    char shown[160];
    kkv_printable(shown, sizeof shown, path, strlen(path));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kkv_fail(KKV_ERR_IO, "%s: %s", shown, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kkv_fail(KKV_ERR_IO, "%s: %s", shown, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return kkv_fail(KKV_ERR_IO, "%s: is a directory, not a file", shown);
    }
    if (S_ISREG(st.st_mode) && (uint64_t)st.st_size > max_bytes) {
        close(fd);
        return kkv_fail(KKV_ERR_INVALID_ARG, "%s: %llu bytes is more than the %zu-byte limit",
                        shown, (unsigned long long)st.st_size, max_bytes);
    }
    /* Grow geometrically, never past max_bytes + 1 (the +1 detects "more"). */
    size_t cap = 1 << 16, n = 0;
    if (S_ISREG(st.st_mode) && (size_t)st.st_size + 1 > cap) cap = (size_t)st.st_size + 1;
    if (cap > max_bytes + 1) cap = max_bytes + 1;
    char *buf = malloc(cap + 1); /* [cap + 1]: data and the NUL */
    if (!buf) {
        close(fd);
        return kkv_fail(KKV_ERR_NOMEM, "%s: out of memory", shown);
    }
    for (;;) {
        if (n == cap) {
            if (cap > max_bytes) break; /* read max_bytes + 1: too much */
            size_t ncap = cap > (SIZE_MAX - 1) / 2 ? SIZE_MAX - 1 : cap * 2;
            if (ncap > max_bytes + 1) ncap = max_bytes + 1;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                close(fd);
                return kkv_fail(KKV_ERR_NOMEM, "%s: out of memory after %zu bytes", shown, n);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return kkv_fail(KKV_ERR_IO, "%s: read failed: %s", shown, strerror(e));
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (n > max_bytes) {
        free(buf);
        return kkv_fail(KKV_ERR_INVALID_ARG, "%s: more than the %zu-byte limit", shown,
                        max_bytes);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return KKV_OK;
}

/* Finds 'key': in a NUL-terminated .npy header dict; the value after it. */
static const char *npy_field(const char *hdr, const char *key) {
    const char *p = strstr(hdr, key);
    if (!p) return NULL;
    p += strlen(key);
    while (*p == ' ') p++;
    if (*p != ':') return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

/* A non-negative decimal dimension; -1 if absent, negative or above INT64_MAX. */
static int64_t npy_dim(const char **pp) {
    const char *p = *pp;
    while (*p == ' ') p++;
    if (*p < '0' || *p > '9') return -1;
    int64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX - (*p - '0')) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    while (*p == ' ') p++;
    *pp = p;
    return v;
}

kkv_status kkv_tensor_parse(int64_t *rows, size_t *data_off, const void *buf, size_t len,
                            int cols, const char *name) {
    if (!name) name = "tensor";
    if (!rows || !data_off || (!buf && len))
        return kkv_fail(KKV_ERR_INVALID_ARG, "%s: NULL argument", name);
    if (cols < 1) return kkv_fail(KKV_ERR_INVALID_ARG, "%s: %d columns", name, cols);
    const unsigned char *b = buf;
    const size_t row_bytes = (size_t)cols * 4;
    if (len < 6 || memcmp(b, "\x93NUMPY", 6) != 0) {
        if (len % row_bytes != 0)
            return kkv_fail(KKV_ERR_FORMAT, "%s: %zu bytes is not a whole number of [%d] "
                            "float32 rows", name, len, cols);
        *rows = (int64_t)(len / row_bytes);
        *data_off = 0;
        return KKV_OK;
    }
    if (len < 10 || b[6] < 1 || b[6] > 3)
        return kkv_fail(KKV_ERR_FORMAT, "%s: unsupported .npy version", name);
    size_t hlen, hoff;
    if (b[6] == 1) {
        hlen = (size_t)b[8] | (size_t)b[9] << 8;
        hoff = 10;
    } else {
        if (len < 12) return kkv_fail(KKV_ERR_FORMAT, "%s: truncated .npy header", name);
        hlen = (size_t)b[8] | (size_t)b[9] << 8 | (size_t)b[10] << 16 | (size_t)b[11] << 24;
        hoff = 12;
    }
    if (hlen > len - hoff || hlen > 65536)
        return kkv_fail(KKV_ERR_FORMAT, "%s: truncated .npy header", name);
    char *hdr = malloc(hlen + 1); /* [hlen + 1] the dict, NUL-terminated */
    if (!hdr) return kkv_fail(KKV_ERR_NOMEM, "%s: out of memory", name);
    memcpy(hdr, b + hoff, hlen);
    hdr[hlen] = 0;
    kkv_status s = KKV_OK;
    const char *descr = npy_field(hdr, "'descr'");
    const char *fortran = npy_field(hdr, "'fortran_order'");
    const char *shape = npy_field(hdr, "'shape'");
    int64_t r = -1, c = -1;
    if (!descr || strncmp(descr, "'<f4'", 5)) {
        s = kkv_fail(KKV_ERR_FORMAT, "%s: .npy dtype must be float32 ('<f4')", name);
    } else if (!fortran || strncmp(fortran, "False", 5)) {
        s = kkv_fail(KKV_ERR_FORMAT, "%s: .npy must be C-ordered", name);
    } else {
        const char *p = shape;
        int ok = p && *p == '(';
        if (ok) p++, r = npy_dim(&p);
        ok = ok && r >= 0 && *p == ',';
        if (ok) p++, c = npy_dim(&p);
        if (ok && *p == ',') p++;
        while (ok && *p == ' ') p++;
        ok = ok && c >= 1 && *p == ')';
        if (!ok)
            s = kkv_fail(KKV_ERR_FORMAT, "%s: .npy shape must be 2-D (tokens, head_dim) with "
                         "dimensions below 2^63", name);
    }
    free(hdr);
    if (s != KKV_OK) return s;
    if (c != cols)
        return kkv_fail(KKV_ERR_FORMAT, "%s: .npy has %lld columns, want %d", name,
                        (long long)c, cols);
    size_t have = len - hoff - hlen;
    /* r * row_bytes must not wrap: compare by division first. */
    if ((uint64_t)r > SIZE_MAX / row_bytes)
        return kkv_fail(KKV_ERR_FORMAT, "%s: .npy shape (%lld, %lld) is more than 2^64 bytes",
                        name, (long long)r, (long long)c);
    if ((size_t)r * row_bytes != have)
        return kkv_fail(KKV_ERR_FORMAT, "%s: .npy data is %zu bytes, shape (%lld, %lld) "
                        "needs %zu", name, have, (long long)r, (long long)c,
                        (size_t)r * row_bytes);
    *rows = r;
    *data_off = hoff + hlen;
    return KKV_OK;
}
