/* The kittykv option parser (see opts.h). */
#include "opts.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kittykv.h"

/* Copies s into buf [cap] for an error message: printable ASCII as is, other
 * bytes as \xHH, cut with "..." after max characters, so a message stays one
 * readable line whatever the user typed. */
static const char *shown_max(char *buf, size_t cap, const char *s, size_t len, size_t max) {
    size_t w = 0;
    for (size_t i = 0; i < len && w + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (i >= max) {
            memcpy(buf + w, "...", 3);
            w += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7F) buf[w++] = (char)c;
        else w += (size_t)snprintf(buf + w, cap - w, "\\x%02x", c);
    }
    buf[w] = 0;
    return buf;
}

static const char *shown(char *buf, size_t cap, const char *s, size_t len) {
    return shown_max(buf, cap, s, len, 60);
}

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && errlen) vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return OPTS_ERROR;
}

/* 1 if name[0..len) is one of the '|'-separated names. */
static int has_name(const char *names, const char *name, size_t len) {
    if (!names) return 0;
    for (const char *p = names; *p;) {
        size_t l = strcspn(p, "|");
        if (l == len && !memcmp(p, name, len)) return 1;
        p += l;
        if (*p == '|') p++;
    }
    return 0;
}

/* The documented spelling of d for messages: "--ctx-size" or "-x". */
static const char *label(char *buf, size_t cap, const opt_def *d) {
    if (d->names) snprintf(buf, cap, "--%.*s", (int)strcspn(d->names, "|"), d->names);
    else snprintf(buf, cap, "-%c", d->short_name);
    return buf;
}

/* Stores value v of option d (spelled opt on the command line). */
static int store(const char *cmd, const opt_def *d, const char *opt, const char *v, char *err,
                 size_t errlen) {
    char sv[256];
    shown(sv, sizeof sv, v, strlen(v));
    char *end = NULL;
    errno = 0;
    switch (d->kind) {
    case OPT_INT: {
        long x = strtol(v, &end, 10);
        if (!*v || *v == ' ' || *end || errno || (double)x < d->lo || (double)x > d->hi)
            return fail(err, errlen, "kittykv %s: bad value for %s: '%s' (want an integer in "
                        "%.0f..%.0f)", cmd, opt, sv, d->lo, d->hi);
        *(int *)d->target = (int)x;
        return OPTS_OK;
    }
    case OPT_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (!*v || *v == '-' || *v == '+' || *v == ' ' || *end || errno || (double)x > d->hi)
            return fail(err, errlen, "kittykv %s: bad value for %s: '%s' (want an integer in "
                        "0..%.0f)", cmd, opt, sv, d->hi);
        *(uint64_t *)d->target = (uint64_t)x;
        return OPTS_OK;
    }
    case OPT_FLOAT: {
        double x = strtod(v, &end);
        if (!*v || *v == ' ' || *end || errno || !isfinite(x) || x < d->lo || x > d->hi)
            return fail(err, errlen, "kittykv %s: bad value for %s: '%s' (want a number in "
                        "[%g, %g])", cmd, opt, sv, d->lo, d->hi);
        *(float *)d->target = (float)x;
        return OPTS_OK;
    }
    case OPT_LIST: {
        size_t len = strlen(v);
        if (!len || v[0] == ',' || v[len - 1] == ',' || strstr(v, ",,"))
            return fail(err, errlen, "kittykv %s: bad list for %s: '%s' (comma-separated, no "
                        "empty entries)", cmd, opt, sv);
        *(const char **)d->target = v;
        return OPTS_OK;
    }
    case OPT_SPEC: {
        kkv_method m;
        if (kkv_method_parse(&m, v) != KKV_OK) {
            /* the library's message quotes the spec: keep it one printable line */
            char msg[512];
            const char *e = kkv_last_error();
            shown_max(msg, sizeof msg, e, strlen(e), 300);
            return fail(err, errlen, "kittykv %s: %s: %s", cmd, opt, msg);
        }
        *(const char **)d->target = v;
        return OPTS_OK;
    }
    case OPT_STRING:
        *(const char **)d->target = v;
        return OPTS_OK;
    case OPT_FLAG:
        break;
    }
    return fail(err, errlen, "kittykv %s: %s: bad option table", cmd, opt);
}

int opts_parse(const char *cmd, const opt_def *defs, int n, int argc, char *const *argv,
               char *err, size_t errlen) {
    if (err && errlen) err[0] = 0;
    for (int i = 1; i < argc; i++)
        if (argv[i] && (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))) return OPTS_HELP;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char sa[256], opt[128];
        if (!a) return fail(err, errlen, "kittykv %s: NULL argument", cmd);
        const opt_def *d = NULL;
        const char *v = NULL; /* attached value: --x=v or -xv */
        if (a[0] == '-' && a[1] == '-' && a[2]) {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            for (int k = 0; k < n && !d; k++)
                if (has_name(defs[k].names, name, len)) d = &defs[k];
            if (d && eq) v = eq + 1;
            snprintf(opt, sizeof opt, "--%s", shown(sa, sizeof sa, name, len));
        } else if (a[0] == '-' && a[1] && a[1] != '-') {
            for (int k = 0; k < n && !d; k++)
                if (defs[k].short_name && defs[k].short_name == a[1]) d = &defs[k];
            if (d && a[2]) v = a + 2;
            snprintf(opt, sizeof opt, "-%s", shown(sa, sizeof sa, a + 1, d ? 1 : strlen(a + 1)));
        } else {
            return fail(err, errlen, "kittykv %s: unexpected argument '%s' (see kittykv %s "
                        "--help)", cmd, shown(sa, sizeof sa, a, strlen(a)), cmd);
        }
        if (!d)
            return fail(err, errlen, "kittykv %s: unknown option '%s' (see kittykv %s --help)",
                        cmd, opt, cmd);
        if (d->kind == OPT_FLAG) {
            if (v) return fail(err, errlen, "kittykv %s: %s takes no value", cmd, opt);
            *(int *)d->target = 1;
        } else {
            if (!v) {
                if (i + 1 >= argc || !argv[i + 1]) {
                    char lb[64];
                    return fail(err, errlen, "kittykv %s: %s needs a value (%s %s)", cmd, opt,
                                label(lb, sizeof lb, d), d->metavar ? d->metavar : "VALUE");
                }
                v = argv[++i];
            }
            int rc = store(cmd, d, opt, v, err, errlen);
            if (rc) return rc;
        }
        if (d->given) *d->given = 1;
    }
    return OPTS_OK;
}

/* The left column of d's help line: "-c, --ctx-size N". */
static int left_col(char *buf, size_t cap, const opt_def *d) {
    char names[96];
    int w = 0;
    if (d->short_name && d->names)
        w = snprintf(names, sizeof names, "-%c, --%.*s", d->short_name,
                     (int)strcspn(d->names, "|"), d->names);
    else if (d->short_name) w = snprintf(names, sizeof names, "-%c", d->short_name);
    else w = snprintf(names, sizeof names, "    --%.*s", (int)strcspn(d->names, "|"), d->names);
    (void)w;
    if (d->kind == OPT_FLAG) return snprintf(buf, cap, "%s", names);
    return snprintf(buf, cap, "%s %s", names, d->metavar ? d->metavar : "VALUE");
}

void opts_help(FILE *f, const char *cmd, const char *synopsis, const opt_def *defs, int n,
               const char *epilog) {
    fprintf(f, "usage: kittykv %s %s\n\noptions:\n", cmd, synopsis ? synopsis : "[options]");
    opts_help_options(f, defs, n);
    if (epilog) fprintf(f, "\n%s", epilog);
}

void opts_help_options(FILE *f, const opt_def *defs, int n) {
    int width = 0;
    char buf[160];
    for (int k = 0; k < n; k++) {
        if (!defs[k].help) continue;
        int w = left_col(buf, sizeof buf, &defs[k]);
        if (w > width) width = w;
    }
    if (width > 28) width = 28;
    for (int k = 0; k < n; k++) {
        const opt_def *d = &defs[k];
        if (!d->help) continue;
        int w = left_col(buf, sizeof buf, d);
        fprintf(f, "  %s", buf);
        if (w > width) fprintf(f, "\n  %*s", width, "");
        else fprintf(f, "%*s", width - w, "");
        for (const char *p = d->help;;) {
            size_t l = strcspn(p, "\n");
            fprintf(f, "  %.*s\n", (int)l, p);
            p += l;
            if (!*p) break;
            p++;
            fprintf(f, "  %*s", width, "");
        }
        const char *alias = d->names ? strchr(d->names, '|') : NULL;
        while (alias) {
            const char *next = strchr(alias + 1, '|');
            int l = next ? (int)(next - alias - 1) : (int)strlen(alias + 1);
            fprintf(f, "  %*s  (also --%.*s)\n", width, "", l, alias + 1);
            alias = next;
        }
    }
    fprintf(f, "  -h, --help%*s  this text\n", width > 10 ? width - 10 : 0, "");
}

int opts_run(const char *cmd, const char *synopsis, const opt_def *defs, int n,
             const char *epilog, int argc, char *const *argv) {
    char err[512];
    int rc = opts_parse(cmd, defs, n, argc, argv, err, sizeof err);
    if (rc == OPTS_HELP) {
        opts_help(stdout, cmd, synopsis, defs, n, epilog);
        return -1;
    }
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    return 0;
}
