/* analyze pareto's data: frontier, best point within a budget, and the two
 * input files (external points CSV, a saved eval JSON). See pareto.h. */
#include "pareto.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kittykv_eval.h"

/* Points files are a few lines; eval JSON is one line per run. The caps only
 * make /dev/zero or a wrong path fail fast. */
#define POINTS_MAX_BYTES ((size_t)1 << 20)
#define EVAL_MAX_BYTES ((size_t)16 << 20)
#define BITS_EPS 1e-9

int pareto_frontier(pareto_pt *p, int n) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        p[i].frontier = 0;
        if (p[i].external) continue;
        int dominated = 0;
        for (int j = 0; j < n && !dominated; j++) {
            if (j == i || p[j].external) continue;
            dominated = p[j].bits <= p[i].bits && p[j].kld_mean <= p[i].kld_mean &&
                        (p[j].bits < p[i].bits || p[j].kld_mean < p[i].kld_mean);
        }
        p[i].frontier = !dominated;
        count += !dominated;
    }
    return count;
}

int pareto_best_within(const pareto_pt *p, int n, double max_bits) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (p[i].external || p[i].bits > max_bits + BITS_EPS) continue;
        if (best < 0 || p[i].kld_mean < p[best].kld_mean ||
            (p[i].kld_mean == p[best].kld_mean && p[i].bits < p[best].bits))
            best = i;
    }
    return best;
}

/* Trims spaces and tabs at both ends, in place. */
static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = 0;
    return s;
}

/* A whole-field finite number; 0 or -1. */
static int num(double *out, const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

int pareto_read_points(pareto_pt *out, int cap, const char *path, char *err, size_t errlen) {
    char *buf;
    size_t len;
    if (kkv_file_read(&buf, &len, path, POINTS_MAX_BYTES) != KKV_OK) {
        snprintf(err, errlen, "--points: %s", kkv_last_error());
        return -1;
    }
    int n = 0, line_no = 0, rc = 0, seen = 0; /* seen: a non-comment line */
    char *save = NULL;
    for (char *line = buf; line && rc == 0; line = save) {
        char *nl = strchr(line, '\n');
        save = nl ? nl + 1 : NULL;
        if (nl) *nl = 0;
        line_no++;
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *f[7];
        int nf = 0;
        for (char *p = s; nf < 7;) {
            f[nf++] = p;
            char *c = strchr(p, ',');
            if (!c) break;
            *c = 0;
            p = c + 1;
        }
        for (int i = 0; i < nf; i++) f[i] = trim(f[i]);
        double bits, kl, extra[3] = {NAN, NAN, NAN};
        int first = !seen;
        seen = 1;
        if (first && nf >= 2 && num(&bits, f[1])) continue; /* a header line */
        if (nf < 3 || nf > 6) {
            snprintf(err, errlen, "--points %s:%d: want label,bits_per_element,kld_mean"
                     "[,kld_p99[,top1[,ppl]]], got %d field%s", path, line_no, nf,
                     nf == 1 ? "" : "s");
            rc = -1;
        } else if (!*f[0] || strlen(f[0]) >= PARETO_LABEL || strchr(f[0], '"')) {
            snprintf(err, errlen, "--points %s:%d: the label must be 1..%d characters without "
                     "double quotes", path, line_no, PARETO_LABEL - 1);
            rc = -1;
        } else if (num(&bits, f[1]) || bits <= 0 || bits > 64) {
            snprintf(err, errlen, "--points %s:%d: bits_per_element '%s' is not a number in "
                     "(0, 64]", path, line_no, f[1]);
            rc = -1;
        } else if (num(&kl, f[2]) || kl < 0) {
            snprintf(err, errlen, "--points %s:%d: kld_mean '%s' is not a number >= 0", path,
                     line_no, f[2]);
            rc = -1;
        } else if (n >= cap) {
            snprintf(err, errlen, "--points %s: more than %d points", path, cap);
            rc = -1;
        } else {
            for (int i = 3; i < nf && rc == 0; i++)
                if (*f[i] && num(&extra[i - 3], f[i])) {
                    snprintf(err, errlen, "--points %s:%d: field %d '%s' is not a number", path,
                             line_no, i + 1, f[i]);
                    rc = -1;
                }
            if (rc == 0) {
                pareto_pt *p = &out[n++];
                memset(p, 0, sizeof *p);
                snprintf(p->label, sizeof p->label, "%s", f[0]);
                p->bits = bits;
                p->kld_mean = kl;
                p->kld_p99 = extra[0];
                p->top1 = extra[1];
                p->ppl = extra[2];
                p->dppl_pct = NAN;
                p->external = 1;
            }
        }
    }
    free(buf);
    if (rc == 0 && n == 0) {
        snprintf(err, errlen, "--points %s: no points in the file", path);
        rc = -1;
    }
    return rc ? -1 : n;
}

/* A number member of o, or NAN when missing or not a number. */
static double jnum(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

int pareto_read_eval_json(pareto_run *run, pareto_pt *out, int cap, const char *path, char *err,
                          size_t errlen) {
    char *buf;
    size_t len;
    if (kkv_file_read(&buf, &len, path, EVAL_MAX_BYTES) != KKV_OK) {
        snprintf(err, errlen, "--from-eval: %s", kkv_last_error());
        return -1;
    }
    const char *obj = NULL; /* the last line starting with '{' */
    for (char *line = buf; line;) {
        if (*line == '{') obj = line;
        char *nl = strchr(line, '\n');
        if (nl) *nl = 0;
        line = nl ? nl + 1 : NULL;
    }
    cJSON *j = obj ? cJSON_Parse(obj) : NULL;
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(j, "methods");
    int n = -1;
    memset(run, 0, sizeof *run);
    if (!j || !cJSON_IsArray(ms) || !isfinite(jnum(j, "tokens")) ||
        !isfinite(jnum(j, "score_from"))) {
        snprintf(err, errlen, "--from-eval %s: no `kittykv eval --json` object in the file",
                 path);
        goto done;
    }
    run->tokens = (int)jnum(j, "tokens");
    run->score_from = (int)jnum(j, "score_from");
    run->scored = (long)jnum(j, "scored");
    run->fp16_ppl = jnum(j, "fp16_ppl");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(j, "text");
    if (cJSON_IsString(text)) snprintf(run->text, sizeof run->text, "%s", text->valuestring);
    int k = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, ms) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
        double bits = jnum(m, "bits_per_element"), kl = jnum(m, "kld_mean");
        if (!cJSON_IsString(name) || !isfinite(bits) || !isfinite(kl) ||
            strlen(name->valuestring) >= PARETO_LABEL) {
            snprintf(err, errlen, "--from-eval %s: method %d lacks a name, bits_per_element or "
                     "kld_mean", path, k + 1);
            goto done;
        }
        if (k >= cap) {
            snprintf(err, errlen, "--from-eval %s: more than %d methods", path, cap);
            goto done;
        }
        pareto_pt *p = &out[k++];
        memset(p, 0, sizeof *p);
        snprintf(p->label, sizeof p->label, "%s", name->valuestring);
        p->bits = bits;
        p->kld_mean = kl;
        p->kld_p99 = jnum(m, "kld_p99");
        p->ppl = jnum(m, "ppl");
        p->dppl_pct = jnum(m, "dppl_pct");
        p->top1 = jnum(m, "top1");
    }
    if (k == 0) {
        snprintf(err, errlen, "--from-eval %s: the run has no methods", path);
        goto done;
    }
    n = k;
done:
    cJSON_Delete(j);
    free(buf);
    return n;
}
