#include "tensorio.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kittykv_eval.h"
#include "util.h"

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

float *tio_read(const char *path, int cols, long *rows, char *err, size_t errlen) {
    /* The layout checks (sizes, overflow) live in the library so the fuzz
     * target exercises exactly this parser. */
    char *buf = NULL;
    size_t len = 0;
    int64_t r = 0;
    size_t off = 0;
    float *x = NULL;
    kkv_status s = kkv_file_read(&buf, &len, path, SIZE_MAX - 1);
    if (s == KKV_OK) s = kkv_tensor_parse(&r, &off, buf, len, cols, path);
    if (s != KKV_OK) snprintf(err, errlen, "%s", kkv_last_error());
    else if ((uint64_t)r > LONG_MAX) snprintf(err, errlen, "%s: %lld rows is too many", path, (long long)r);
    else {
        size_t need = len - off; /* == r * cols * 4, checked by the parser */
        x = malloc(need ? need : 1);
        if (!x) snprintf(err, errlen, "%s: out of memory", path);
        else if (need) memcpy(x, buf + off, need);
    }
    free(buf);
    if (x) *rows = (long)r;
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
