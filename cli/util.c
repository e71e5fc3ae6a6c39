#include "util.h"

#include "core/fileio.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef KKV_SOURCE_DIR
#define KKV_SOURCE_DIR "."
#endif

const char *cli_default_model(void) {
    const char *env = getenv("KKV_MODEL");
    if (env && *env) return env;
    return KKV_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

int cli_int(int *out, const char *s, long lo, long hi, const char *cmd, const char *opt) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "kittykv %s: bad value for %s: '%s' (want an integer in %ld..%ld)\n",
                cmd, opt, s ? s : "", lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_float(float *out, const char *s, double lo, double hi, const char *cmd,
              const char *opt) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || !*s || *end || errno || !isfinite(v) || v < lo || v > hi) {
        fprintf(stderr, "kittykv %s: bad value for %s: '%s' (want a number in [%g, %g])\n",
                cmd, opt, s ? s : "", lo, hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

int cli_int_list(int *out, int cap, const char *s, const char *cmd, const char *opt) {
    int n = 0;
    const char *p = s;
    while (p && *p) {
        char buf[32];
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof buf || n >= cap) {
            fprintf(stderr, "kittykv %s: bad list for %s: '%s'\n", cmd, opt, s);
            return -1;
        }
        memcpy(buf, p, len);
        buf[len] = 0;
        if (cli_int(&out[n], buf, 0, 1L << 30, cmd, opt)) return -1;
        n++;
        p += len;
        if (*p == ',') p++;
    }
    if (n == 0) fprintf(stderr, "kittykv %s: empty list for %s\n", cmd, opt);
    return n ? n : -1;
}

char *cli_read_file(const char *path, size_t *len) {
    char *buf = NULL;
    if (kkv_file_read(&buf, len, path, KKV_TEXT_MAX_BYTES) != KKV_OK) return NULL;
    return buf;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_progress(const char *label, long done, long total, double elapsed_s) {
    static int enabled = -1;
    if (enabled < 0) {
        const char *e = getenv("KKV_PROGRESS");
        enabled = e ? atoi(e) != 0 : isatty(2);
    }
    if (!enabled || total <= 0) return;
    const int width = 30;
    int fill = (int)((double)done / (double)total * width);
    double rate = elapsed_s > 0 ? (double)done / elapsed_s : 0;
    double eta = rate > 0 ? (double)(total - done) / rate : 0;
    fprintf(stderr, "\r%s [", label);
    for (int i = 0; i < width; i++) fputc(i < fill ? '#' : '.', stderr);
    fprintf(stderr, "] %ld/%ld  %.1f/s  eta %.0fs ", done, total, rate, eta);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

void cli_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}
