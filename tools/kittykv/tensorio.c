#include "tensorio.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Finds `key': VALUE in a .npy header dict and returns a pointer to VALUE. */
static const char *npy_field(const char *hdr, const char *key) {
    const char *p = strstr(hdr, key);
    if (!p) return NULL;
    p = strchr(p + strlen(key), ':');
    if (!p) return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

static float *read_npy(const char *path, const char *buf, size_t len, int cols, long *rows,
                       char *err, size_t errlen) {
    if (len < 10 || buf[6] < 1 || buf[6] > 3) {
        snprintf(err, errlen, "%s: unsupported .npy version", path);
        return NULL;
    }
    size_t hlen, hoff;
    if (buf[6] == 1) {
        hlen = (uint8_t)buf[8] | ((size_t)(uint8_t)buf[9] << 8);
        hoff = 10;
    } else {
        if (len < 12) {
            snprintf(err, errlen, "%s: truncated .npy header", path);
            return NULL;
        }
        hlen = (uint8_t)buf[8] | ((size_t)(uint8_t)buf[9] << 8) |
               ((size_t)(uint8_t)buf[10] << 16) | ((size_t)(uint8_t)buf[11] << 24);
        hoff = 12;
    }
    if (hlen > len - hoff || hlen > 65536) {
        snprintf(err, errlen, "%s: truncated .npy header", path);
        return NULL;
    }
    char hdr[65537];
    memcpy(hdr, buf + hoff, hlen);
    hdr[hlen] = 0;
    const char *descr = npy_field(hdr, "'descr'");
    const char *fortran = npy_field(hdr, "'fortran_order'");
    const char *shape = npy_field(hdr, "'shape'");
    if (!descr || strncmp(descr, "'<f4'", 5)) {
        snprintf(err, errlen, "%s: .npy dtype must be float32 ('<f4')", path);
        return NULL;
    }
    if (!fortran || strncmp(fortran, "False", 5)) {
        snprintf(err, errlen, "%s: .npy must be C-ordered", path);
        return NULL;
    }
    long r = -1, c = -1;
    if (!shape || sscanf(shape, "(%ld, %ld)", &r, &c) != 2 || r < 0 || c <= 0) {
        snprintf(err, errlen, "%s: .npy must be 2-D [tokens][head_dim]", path);
        return NULL;
    }
    if (c != cols) {
        snprintf(err, errlen, "%s: .npy has %ld columns, --head-dim is %d", path, c, cols);
        return NULL;
    }
    size_t need = (size_t)r * (size_t)c * 4;
    if (len - hoff - hlen != need) {
        snprintf(err, errlen, "%s: .npy data is %zu bytes, shape (%ld, %ld) needs %zu", path,
                 len - hoff - hlen, r, c, need);
        return NULL;
    }
    float *x = malloc(need ? need : 1);
    if (!x) {
        snprintf(err, errlen, "%s: out of memory", path);
        return NULL;
    }
    memcpy(x, buf + hoff + hlen, need);
    *rows = r;
    return x;
}

float *tio_read(const char *path, int cols, long *rows, char *err, size_t errlen) {
    size_t len;
    char *buf = cli_read_file(path, &len);
    if (!buf) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    float *x = NULL;
    if (len >= 6 && !memcmp(buf, "\x93NUMPY", 6)) {
        x = read_npy(path, buf, len, cols, rows, err, errlen);
    } else if (len % ((size_t)cols * 4) != 0) {
        snprintf(err, errlen, "%s: %zu bytes is not a whole number of [%d] float32 rows", path,
                 len, cols);
    } else {
        x = malloc(len ? len : 1);
        if (x) {
            memcpy(x, buf, len);
            *rows = (long)(len / ((size_t)cols * 4));
        } else {
            snprintf(err, errlen, "%s: out of memory", path);
        }
    }
    free(buf);
    return x;
}

int tio_write(const char *path, const float *x, long rows, int cols, char *err, size_t errlen) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    if (ends_with(path, ".npy")) {
        char hdr[128];
        int n = snprintf(hdr, sizeof hdr,
                         "{'descr': '<f4', 'fortran_order': False, 'shape': (%ld, %d), }", rows,
                         cols);
        int total = 10 + n + 1;
        int pad = (64 - total % 64) % 64;
        int hlen = n + pad + 1;
        unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                                 (unsigned char)(hlen >> 8)};
        fwrite(pre, 1, 10, f);
        fwrite(hdr, 1, (size_t)n, f);
        for (int i = 0; i < pad; i++) fputc(' ', f);
        fputc('\n', f);
    }
    size_t want = (size_t)rows * (size_t)cols;
    int bad = fwrite(x, sizeof *x, want, f) != want;
    bad |= fclose(f) != 0;
    if (bad) {
        snprintf(err, errlen, "%s: write failed", path);
        return -1;
    }
    return 0;
}
