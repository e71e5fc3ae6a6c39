/* analyze pareto: KL divergence from fp16 against memory (bits per K/V
 * element, every stored byte counted) over a grid of method specs, all run in
 * lock-step through the eval engine on one text, with the Pareto frontier
 * marked and, optionally, another tool's points (--points) on the same plot
 * and compared with the best kittykv method at no more bits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "kittykv_eval.h"
#include "pareto.h"
#include "plot.h"
#include "util.h"

#define WHO "analyze pareto"

/* The default grid beyond the named methods (kkv_method_names(), all of
 * them): one step of each knob away from the paper's settings, chosen to
 * fill the 3.5..5.5 bits/element range where other quantized caches sit. */
static const char *const GRID_EXTRA[] = {
    "kitty:alpha=0.5",    /* alpha: half the key channels at 4 bits        */
    "kitty:vbits=4",      /* vbits: 4-bit values                            */
    "kitty-pro:vbits=4",
    "kitty:group=64",     /* group: pages (key groups) of 64 tokens         */
    "kitty:sink=0",       /* sink: no fp16 attention sink                   */
    "kivi-k4v4:group=64", /* 4-bit keys and values, finer key groups        */
    "kivi-k4v4:group=32",
    "kivi-k4v4:sink=32",  /* 4-bit keys and values with the fp16 sink       */
};
#define N_GRID_EXTRA (int)(sizeof GRID_EXTRA / sizeof GRID_EXTRA[0])

/* The default grid as one comma-separated list in buf [cap]. */
static void default_grid(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (const char *const *nm = kkv_method_names(); *nm; nm++)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, "%s%s", n ? "," : "", *nm);
    for (int i = 0; i < N_GRID_EXTRA; i++)
        n += (size_t)snprintf(buf + n, n < cap ? cap - n : 0, ",%s", GRID_EXTRA[i]);
}

static int by_bits(const void *x, const void *y) {
    const pareto_pt *a = x, *b = y;
    if (a->bits != b->bits) return a->bits < b->bits ? -1 : 1;
    if (a->kld_mean != b->kld_mean) return a->kld_mean < b->kld_mean ? -1 : 1;
    return strcmp(a->label, b->label);
}

/* A JSON number, or null for NAN. */
static void jnum(FILE *f, const char *key, double v, int comma) {
    if (isfinite(v)) fprintf(f, "%s\"%s\":%.10g", comma ? "," : "", key, v);
    else fprintf(f, "%s\"%s\":null", comma ? "," : "", key);
}

/* A CSV field: the number, or empty for NAN. */
static void cnum(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, ",%.10g", v);
    else fprintf(f, ",");
}

static void write_json(FILE *f, const pareto_run *run, const pareto_pt *p, int n) {
    fprintf(f, "{\"text\":");
    cli_json_str(f, run->text);
    fprintf(f, ",\"tokens\":%d,\"score_from\":%d,\"scored\":%ld", run->tokens, run->score_from,
            run->scored);
    jnum(f, "fp16_ppl", run->fp16_ppl, 1);
    fprintf(f, ",\"points\":[");
    for (int i = 0, k = 0; i < n; i++) {
        if (p[i].external) continue;
        fprintf(f, "%s{\"spec\":", k++ ? "," : "");
        cli_json_str(f, p[i].label);
        jnum(f, "bits_per_element", p[i].bits, 1);
        jnum(f, "kld_mean", p[i].kld_mean, 1);
        jnum(f, "kld_p99", p[i].kld_p99, 1);
        jnum(f, "ppl", p[i].ppl, 1);
        jnum(f, "dppl_pct", p[i].dppl_pct, 1);
        jnum(f, "top1", p[i].top1, 1);
        fprintf(f, ",\"frontier\":%s}", p[i].frontier ? "true" : "false");
    }
    fprintf(f, "],\"external\":[");
    for (int i = 0, k = 0; i < n; i++) {
        if (!p[i].external) continue;
        fprintf(f, "%s{\"label\":", k++ ? "," : "");
        cli_json_str(f, p[i].label);
        jnum(f, "bits_per_element", p[i].bits, 1);
        jnum(f, "kld_mean", p[i].kld_mean, 1);
        jnum(f, "kld_p99", p[i].kld_p99, 1);
        jnum(f, "top1", p[i].top1, 1);
        jnum(f, "ppl", p[i].ppl, 1);
        int b = pareto_best_within(p, n, p[i].bits);
        fprintf(f, ",\"best_kittykv\":");
        if (b < 0) {
            fprintf(f, "null,\"kittykv_lower_kl\":false}");
            continue;
        }
        fprintf(f, "{\"spec\":");
        cli_json_str(f, p[b].label);
        jnum(f, "bits_per_element", p[b].bits, 1);
        jnum(f, "kld_mean", p[b].kld_mean, 1);
        fprintf(f, "},\"kittykv_lower_kl\":%s}",
                p[b].kld_mean < p[i].kld_mean ? "true" : "false");
    }
    fprintf(f, "]}\n");
}

static void print_tables(const pareto_run *run, const pareto_pt *p, int n) {
    printf("KL(fp16 || method) vs bits/element: %d tokens of %s, %ld scored predictions "
           "(tokens %d..%d), fp16 perplexity %.4f\n\n", run->tokens, run->text, run->scored,
           run->score_from, run->tokens - 1, run->fp16_ppl);
    printf("%-28s %8s %9s %9s %9s %8s %7s %s\n", "method", "bits/el", "KL mean", "KL p99",
           "PPL", "dPPL%", "top-1", "frontier");
    for (int i = 0; i < n; i++) {
        if (p[i].external) continue;
        printf("%-28s %8.3f %9.5f %9.5f %9.4f %+8.2f %7.4f %s\n", p[i].label, p[i].bits,
               p[i].kld_mean, p[i].kld_p99, p[i].ppl, p[i].dppl_pct, p[i].top1,
               p[i].frontier ? "*" : "");
    }
    int any = 0;
    for (int i = 0; i < n; i++) any |= p[i].external;
    if (!any) return;
    printf("\n%-24s %8s %9s  %-28s %8s %9s %s\n", "external point", "bits/el", "KL mean",
           "best kittykv at <= bits", "bits/el", "KL mean", "kittykv lower");
    for (int i = 0; i < n; i++) {
        if (!p[i].external) continue;
        int b = pareto_best_within(p, n, p[i].bits);
        if (b < 0) {
            printf("%-24s %8.3f %9.5f  %-28s %8s %9s %s\n", p[i].label, p[i].bits,
                   p[i].kld_mean, "(none)", "", "", "no");
            continue;
        }
        printf("%-24s %8.3f %9.5f  %-28s %8.3f %9.5f %s\n", p[i].label, p[i].bits,
               p[i].kld_mean, p[b].label, p[b].bits, p[b].kld_mean,
               p[b].kld_mean < p[i].kld_mean ? "yes" : "no");
    }
}

/* One gnuplot datablock row: bits, KL, "label" (quotes in labels become '). */
static void gp_row(FILE *f, const pareto_pt *p) {
    fprintf(f, "%.10g %.10g \"", p->bits, p->kld_mean);
    for (const char *c = p->label; *c; c++) fputc(*c == '"' || *c == '\n' ? '\'' : *c, f);
    fprintf(f, "\"\n");
}

/* KL on a log axis: points with KL 0 (fp16 itself) cannot be drawn. */
static int plot(const an_ctx *a, const pareto_run *run, const pareto_pt *p, int n) {
    char *body = NULL, png[1024];
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    if (!f) return fprintf(stderr, "kittykv " WHO ": out of memory\n"), 1;
    const char *base = strrchr(run->text, '/');
    base = base ? base + 1 : run->text;
    int n_ext = 0, n_zero = 0;
    fprintf(f, "$kkv << EOD\n");
    for (int i = 0; i < n; i++) {
        if (p[i].external) n_ext++;
        else if (p[i].kld_mean > 0) gp_row(f, &p[i]);
        else n_zero++;
    }
    fprintf(f, "EOD\n$front << EOD\n");
    for (int i = 0; i < n; i++)
        if (p[i].frontier && p[i].kld_mean > 0) gp_row(f, &p[i]);
    fprintf(f, "EOD\n$ext << EOD\n");
    for (int i = 0; i < n; i++)
        if (p[i].external && p[i].kld_mean > 0) gp_row(f, &p[i]);
    fprintf(f, "EOD\n");
    fprintf(f, "set termoption noenhanced\nset grid\nset key top right box opaque\n"
               "set logscale y\nset format y '%%g'\n"
               "set offsets graph 0.02, graph 0.12, graph 0.05, graph 0.05\n"
               "set title \"KL(fp16 || method) vs memory: %s, %d tokens, scored %d..%d%s\"\n"
               "set xlabel 'bits per K/V element (every stored byte: codes, scales, indices, "
               "fp16 parts)'\nset ylabel 'mean KL divergence from fp16 (nats, log scale)'\n",
            base, run->tokens, run->score_from, run->tokens - 1,
            n_zero ? " (KL 0 not drawn)" : "");
    fprintf(f, "plot $front using 1:2 with steps lw 2 lc rgb '#1f77b4' title 'kittykv Pareto "
               "frontier', \\\n  $kkv using 1:2 with points pt 7 ps 1.2 lc rgb '#1f77b4' "
               "title 'kittykv methods', \\\n  $kkv using 1:2:3 with labels offset 0.6,0.5 "
               "left font ',8' notitle");
    if (n_ext)
        fprintf(f, ", \\\n  $ext using 1:2 with points pt 5 ps 1.5 lc rgb '#d62728' title "
                   "'external points (--points)', \\\n  $ext using 1:2:3 with labels offset "
                   "0.6,-0.6 left font ',8' tc rgb '#d62728' notitle");
    fprintf(f, "\n");
    int bad = ferror(f);
    if (fclose(f) || bad) {
        free(body);
        return fprintf(stderr, "kittykv " WHO ": out of memory\n"), 1;
    }
    int rc = an_path(png, sizeof png, a, "pareto.png") ? 1
                                                         : plot_png(WHO, png, 1100, 700, body);
    free(body);
    return rc;
}

/* Frontier, tables, CSV, JSON, PNG: what both ways in share. p [n]. */
static int emit(const an_ctx *a, const pareto_run *run, pareto_pt *p, int n) {
    qsort(p, (size_t)n, sizeof *p, by_bits);
    pareto_frontier(p, n);
    print_tables(run, p, n);
    char path[1024];
    FILE *f = an_open(a, "pareto.csv", path, sizeof path);
    if (!f) return 1;
    fprintf(f, "label,source,bits_per_element,kld_mean,kld_p99,ppl,dppl_pct,top1,frontier\n");
    for (int i = 0; i < n; i++) {
        fprintf(f, "%s,%s,%.10g,%.10g", p[i].label, p[i].external ? "external" : "kittykv",
                p[i].bits, p[i].kld_mean);
        cnum(f, p[i].kld_p99);
        cnum(f, p[i].ppl);
        cnum(f, p[i].dppl_pct);
        cnum(f, p[i].top1);
        fprintf(f, ",%d\n", p[i].frontier);
    }
    if (an_close(f, path)) return 1;
    if (!(f = an_open(a, "pareto.json", path, sizeof path))) return 1;
    write_json(f, run, p, n);
    if (an_close(f, path)) return 1;
    int rc = plot(a, run, p, n);
    if (!rc) printf("\nwrote %s/pareto.csv, pareto.json, pareto.png\n", a->o.out);
    if (a->o.json) write_json(stdout, run, p, n);
    fflush(stdout);
    return rc;
}

/* The external points, appended to p [cap] after n; the new count or -1. */
static int add_points(const an_ctx *a, pareto_pt *p, int n, int cap) {
    if (!a->o.points) return n;
    char err[512];
    int k = pareto_read_points(p + n, cap - n, a->o.points, err, sizeof err);
    if (k < 0) {
        fprintf(stderr, "kittykv " WHO ": %s\n", err);
        return -1;
    }
    return n + k;
}

int an_pareto_saved(an_ctx *a) {
    pareto_pt *p = calloc(2 * PARETO_MAX_POINTS, sizeof *p); /* [measured + external] */
    pareto_run run, more;
    char err[512], path[1024];
    int n = 0, rc = 1;
    if (!p) return fprintf(stderr, "kittykv " WHO ": out of memory\n"), 1;
    /* a comma-separated list: runs over the same tokens, their methods joined */
    for (const char *s = a->o.from_eval; *s;) {
        size_t len = strcspn(s, ",");
        if (len >= sizeof path) {
            fprintf(stderr, "kittykv " WHO ": --from-eval: a path is too long\n");
            goto done;
        }
        memcpy(path, s, len);
        path[len] = 0;
        s += len + (s[len] == ',');
        int k = pareto_read_eval_json(n ? &more : &run, p + n, PARETO_MAX_POINTS - n, path, err,
                                      sizeof err);
        if (k < 0) {
            fprintf(stderr, "kittykv " WHO ": %s\n", err);
            goto done;
        }
        if (n && (more.tokens != run.tokens || more.score_from != run.score_from ||
                  strcmp(more.text, run.text))) {
            fprintf(stderr, "kittykv " WHO ": --from-eval %s: another text, --ctx or "
                    "--score-from than the first run's\n", path);
            goto done;
        }
        for (int i = n; i < n + k; i++)
            for (int j = 0; j < i; j++)
                if (!strcmp(p[i].label, p[j].label)) {
                    fprintf(stderr, "kittykv " WHO ": --from-eval %s: method '%s' is in two "
                            "runs\n", path, p[i].label);
                    goto done;
                }
        n += k;
    }
    n = add_points(a, p, n, 2 * PARETO_MAX_POINTS);
    if (n >= 0) rc = emit(a, &run, p, n);
done:
    free(p);
    return rc;
}

int an_pareto(an_ctx *a) {
    const an_opts *o = &a->o;
    if (o->score_from >= o->ctx) {
        fprintf(stderr, "kittykv " WHO ": --score-from must be below --ctx\n");
        return 2;
    }
    char grid[4096];
    if (!o->kv_given) default_grid(grid, sizeof grid);
    cli_spec *specs = calloc(PARETO_MAX_POINTS, sizeof *specs);          /* [n_specs] */
    pareto_pt *p = calloc(2 * PARETO_MAX_POINTS, sizeof *p);             /* [n + external] */
    kkv_eval_result *res = calloc(PARETO_MAX_POINTS, sizeof *res), ref; /* [n_specs] */
    int rc = 1, n = 0;
    if (!specs || !p || !res) {
        fprintf(stderr, "kittykv " WHO ": out of memory\n");
        goto done;
    }
    n = cli_spec_list_or_all(specs, PARETO_MAX_POINTS, o->kv_given ? o->method : grid, WHO);
    if (n < 0) {
        rc = 2;
        n = 0;
        goto done;
    }
    /* the points file is read before the long run, so a bad one fails fast */
    int n_all = add_points(a, p, n, 2 * PARETO_MAX_POINTS);
    if (n_all < 0) goto done;
    kkv_eval_config cfg = kkv_eval_defaults();
    cfg.n_tokens = o->ctx;
    cfg.score_from = o->score_from;
    cfg.chunk = o->chunk;
    cfg.pool = a->tp;
    fprintf(stderr, "kittykv " WHO ": %d method%s in lock-step with fp16 over %d tokens "
            "(scoring from %d)\n", n, n == 1 ? "" : "s", o->ctx, o->score_from);
    if (cli_eval_run(res, &ref, a->m, a->tokens, &cfg, specs, n, "pareto", WHO)) goto done;
    for (int i = 0; i < n; i++) {
        pareto_pt *q = &p[i];
        snprintf(q->label, sizeof q->label, "%s", specs[i].name);
        q->bits = res[i].mem.bits_per_element;
        q->kld_mean = res[i].kld_mean;
        q->kld_p99 = res[i].kld_p99;
        q->ppl = res[i].ppl;
        q->dppl_pct = res[i].dppl_pct;
        q->top1 = res[i].top1;
        q->external = 0;
    }
    pareto_run run = {.tokens = o->ctx, .score_from = o->score_from, .scored = ref.scored,
                      .fp16_ppl = ref.ppl};
    snprintf(run.text, sizeof run.text, "%s", o->text);
    rc = emit(a, &run, p, n_all);
done:
    if (res) kkv_eval_results_free(res, n);
    free(res);
    free(p);
    free(specs);
    return rc;
}
