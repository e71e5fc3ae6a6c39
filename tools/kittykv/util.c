#include "util.h"

#include "kittykv_eval.h"
#include "kittykv_model.h"

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
    if (kkv_file_read(&buf, len, path, KKV_EVAL_MAX_TEXT_BYTES) != KKV_OK) return NULL;
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

/* Control bytes of a message (echoed user text) become '?': one line. */
static void one_line(char *s) {
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7F) *s = '?';
}

static int spec_parse(cli_spec *out, const char *text, char *err, size_t errlen);

int cli_spec_parse(cli_spec *out, const char *text, char *err, size_t errlen) {
    int rc = spec_parse(out, text, err, errlen);
    if (rc && errlen) one_line(err);
    return rc;
}

static int spec_parse(cli_spec *out, const char *text, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    size_t len = strlen(text);
    if (len == 0 || len >= sizeof out->name) {
        snprintf(err, errlen, "method spec '%s' is empty or longer than %zu characters", text,
                 sizeof out->name - 1);
        return -1;
    }
    if (kkv_method_parse(&out->method, text) != KKV_OK) {
        snprintf(err, errlen, "%s", kkv_last_error());
        return -1;
    }
    memcpy(out->name, text, len + 1);
    out->is_ref = !strcmp(text, "fp16");
    return 0;
}

int cli_spec_list(cli_spec *out, int cap, const char *list, char *err, size_t errlen) {
    int n = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        char one[sizeof out->name];
        if (len == 0 || len >= sizeof one) {
            snprintf(err, errlen, "bad method list '%s'", list);
            if (errlen) one_line(err);
            return -1;
        }
        if (n >= cap) {
            snprintf(err, errlen, "too many methods (at most %d)", cap);
            return -1;
        }
        memcpy(one, p, len);
        one[len] = 0;
        if (cli_spec_parse(&out[n], one, err, errlen)) return -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(out[i].name, one)) {
                snprintf(err, errlen, "method '%s' is listed twice", one);
                if (errlen) one_line(err);
                return -1;
            }
        n++;
        p += len;
        if (*p == ',') p++;
    }
    if (n == 0) snprintf(err, errlen, "empty method list");
    if (n == 0 && errlen) one_line(err);
    return n ? n : -1;
}

void cli_progress_cb(void *user, long done, long total, double elapsed_s) {
    cli_progress((const char *)user, done, total, elapsed_s);
}

int cli_eval_run(kkv_eval_result *res, kkv_eval_result *ref, kkv_model *m, const int32_t *tokens,
                 kkv_eval_config *cfg, const cli_spec *specs, int n_specs, const char *label,
                 const char *cmd) {
    const char **names = malloc(((size_t)n_specs + 1) * sizeof *names); /* [n_specs] */
    if (!names) {
        fprintf(stderr, "kittykv %s: out of memory\n", cmd);
        return 1;
    }
    for (int i = 0; i < n_specs; i++) names[i] = specs[i].name;
    cfg->progress = cli_progress_cb;
    cfg->progress_user = (void *)label;
    kkv_status s = kkv_eval_run(res, ref, m, tokens, cfg, names, n_specs);
    free(names);
    if (s != KKV_OK) {
        fprintf(stderr, "kittykv %s: %s\n", cmd, kkv_last_error());
        return 1;
    }
    return 0;
}

int cli_threads(int requested, const char *cmd) {
    int cores = kkv_cpu_count();
    if (cores < 1) cores = 1;
    if (requested <= 0) return cores < CLI_MAX_THREADS ? cores : CLI_MAX_THREADS;
    if (requested > cores)
        fprintf(stderr, "kittykv %s: warning: -t %d is more than the %d online core%s; "
                "expect it to be slower, not faster\n", cmd, requested, cores,
                cores == 1 ? "" : "s");
    return requested;
}

int cli_model_load(kkv_model **m, const char *path, kkv_threadpool *tp, const char *cmd) {
    /* 1 thread: the model starts no workers of its own, then borrows tp */
    if (kkv_model_load(m, path, 1) != KKV_OK || kkv_model_set_threadpool(*m, tp) != KKV_OK) {
        fprintf(stderr, "kittykv %s: %s\n", cmd, kkv_last_error());
        kkv_model_free(*m);
        *m = NULL;
        return 1;
    }
    return 0;
}

int cli_spec_list_or_all(cli_spec *out, int cap, const char *list, const char *cmd) {
    char err[512];
    int n = 0;
    if (!list) {
        for (const char *const *nm = kkv_method_names(); *nm && n < cap; nm++)
            cli_spec_parse(&out[n++], *nm, err, sizeof err);
        return n;
    }
    n = cli_spec_list(out, cap, list, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "kittykv %s: --kv: %s\n", cmd, err);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (out[i].method.select == KKV_SELECT_EXPLICIT) {
            fprintf(stderr, "kittykv %s: --kv: select=oracle needs channel rankings; only "
                    "`kittykv analyze ablation` computes them\n", cmd);
            return -1;
        }
    return n;
}
