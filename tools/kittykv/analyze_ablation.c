/* analyze ablation: KL divergence from fp16 against the boost fraction alpha,
 * for each way of choosing the boosted channels (the paper's Figure 4), all
 * runs in lock-step through the eval engine. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "kittykv_eval.h"
#include "plot.h"
#include "util.h"

#define MAX_ALPHAS 16
#define N_SELECT 4

static const char *const SELECT_NAMES[N_SELECT] = {"magnitude", "variance", "random", "oracle"};

static int parse_alphas(double *out, const char *s) {
    int n = 0;
    const char *p = s;
    while (*p) {
        size_t len = strcspn(p, ",");
        char buf[32];
        float v;
        if (len == 0 || len >= sizeof buf || n >= MAX_ALPHAS) return -1;
        memcpy(buf, p, len);
        buf[len] = 0;
        if (cli_float(&v, buf, 0.0, 1.0, "analyze", "--alphas")) return -1;
        out[n++] = v;
        p += len;
        if (*p == ',') p++;
    }
    return n ? n : -1;
}

static int parse_selects(int *use, const char *s) {
    memset(use, 0, N_SELECT * sizeof *use);
    const char *p = s;
    int any = 0;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (int i = 0; i < N_SELECT; i++)
            if (strlen(SELECT_NAMES[i]) == len && !strncmp(p, SELECT_NAMES[i], len)) {
                use[i] = found = any = 1;
            }
        if (!found) return -1;
        p += len;
        if (*p == ',') p++;
    }
    return any ? 0 : -1;
}

int an_ablation(an_ctx *a) {
    const an_opts *o = &a->o;
    const int D = a->info.head_dim;
    double alphas[MAX_ALPHAS];
    int use[N_SELECT];
    int na = parse_alphas(alphas, o->alphas);
    if (na < 0) {
        fprintf(stderr, "kittykv analyze ablation: bad --alphas '%s'\n", o->alphas);
        return 2;
    }
    if (parse_selects(use, o->selects)) {
        fprintf(stderr, "kittykv analyze ablation: bad --selects '%s' (magnitude, variance, "
                "random, oracle)\n", o->selects);
        return 2;
    }
    if (o->score_from >= o->ctx) {
        fprintf(stderr, "kittykv analyze ablation: --score-from must be below --ctx\n");
        return 2;
    }
    uint8_t *ranks = NULL; /* [n_layers][n_kv_heads][D] oracle rankings */
    if (use[3]) {
        ranks = malloc((size_t)a->info.n_layers * a->info.n_kv_heads * D);
        if (!ranks) return fprintf(stderr, "kittykv analyze ablation: out of memory\n"), 1;
        if (an_oracle_ranks(a, ranks)) {
            fprintf(stderr, "kittykv analyze ablation: no oracle rankings: the oracle line is "
                    "left out\n");
            use[3] = 0;
            free(ranks);
            ranks = NULL;
        }
    }

    /* One run per distinct cache: with no channel or every channel boosted the
     * selection cannot matter, so those alphas run once for all selections. */
    cli_spec specs[MAX_ALPHAS * N_SELECT];
    int which[MAX_ALPHAS][N_SELECT]; /* spec index of (alpha, select), -1 unused */
    int n_specs = 0;
    char err[256];
    for (int i = 0; i < na; i++) {
        kkv_method probe;
        kkv_method_from_name(&probe, "kitty");
        probe.alpha = (float)alphas[i];
        int nb = kkv_method_boost(&probe, D), shared = -1;
        for (int s = 0; s < N_SELECT; s++) {
            which[i][s] = -1;
            if (!use[s]) continue;
            if ((nb == 0 || nb == D) && shared >= 0) {
                which[i][s] = shared;
                continue;
            }
            char text[128];
            if (nb == 0 || nb == D)
                snprintf(text, sizeof text, "kitty:alpha=%g", alphas[i]);
            else
                snprintf(text, sizeof text, "kitty:alpha=%g:select=%s%s", alphas[i],
                         SELECT_NAMES[s], s == 2 ? ":seed=1" : "");
            if (cli_spec_parse(&specs[n_specs], text, err, sizeof err)) {
                fprintf(stderr, "kittykv analyze ablation: %s\n", err);
                free(ranks);
                return 1;
            }
            which[i][s] = n_specs;
            if (nb == 0 || nb == D) shared = n_specs;
            n_specs++;
        }
    }

    kkv_eval_result *res = calloc((size_t)n_specs, sizeof *res), ref;
    int rc = 1;
    FILE *f = NULL;
    char path[1024], cpath[1024];
    if (!res) goto done;
    kkv_eval_config cfg = kkv_eval_defaults();
    cfg.n_tokens = o->ctx;
    cfg.score_from = o->score_from;
    cfg.chunk = o->chunk;
    cfg.pool = a->tp;
    cfg.ranks = ranks;
    if (cli_eval_run(res, &ref, a->m, a->tokens, &cfg, specs, n_specs, "ablation",
                     "analyze ablation"))
        goto done;

    if (!(f = an_open(a, "ablation.csv", cpath, sizeof cpath))) goto done;
    fprintf(f, "alpha,select,boosted,kld_mean,kld_p99,kld_max,top1,ppl,dppl_pct,"
               "bits_per_element\n");
    /* grouped by selection, so that each one's rows are one run of lines */
    for (int s = 0; s < N_SELECT; s++)
        for (int i = 0; i < na; i++) {
            if (which[i][s] < 0) continue;
            const kkv_eval_result *r = &res[which[i][s]];
            fprintf(f, "%g,%s,%d,%.8g,%.8g,%.8g,%.6f,%.6f,%.4f,%.4f\n", alphas[i],
                    SELECT_NAMES[s], kkv_method_boost(&specs[which[i][s]].method, D), r->kld_mean,
                    r->kld_p99, r->kld_max, r->top1, r->ppl, r->dppl_pct,
                    r->mem.bits_per_element);
        }
    if (an_close(f, cpath)) {
        f = NULL;
        goto done;
    }
    f = NULL;
    if (!(f = an_open(a, "ablation.json", path, sizeof path))) goto done;
    fprintf(f, "{\"tokens\":%d,\"score_from\":%d,\"scored\":%ld,\"fp16_ppl\":%.8g,\"runs\":[",
            o->ctx, o->score_from, ref.scored, ref.ppl);
    int first = 1;
    for (int i = 0; i < na; i++)
        for (int s = 0; s < N_SELECT; s++) {
            if (which[i][s] < 0) continue;
            const kkv_eval_result *r = &res[which[i][s]];
            fprintf(f, "%s{\"alpha\":%g,\"select\":\"%s\",\"spec\":", first ? "" : ",", alphas[i],
                    SELECT_NAMES[s]);
            cli_json_str(f, specs[which[i][s]].name);
            fprintf(f, ",\"kld_mean\":%.8g,\"kld_p99\":%.8g,\"top1\":%.6f,\"ppl\":%.6f}",
                    r->kld_mean, r->kld_p99, r->top1, r->ppl);
            first = 0;
        }
    fprintf(f, "]}\n");
    if (an_close(f, path)) {
        f = NULL;
        goto done;
    }
    f = NULL;

    printf("KL(fp16 || kitty) mean over %ld positions (tokens %d..%d), by alpha and channel "
           "selection\n\n%-8s %8s", ref.scored, o->score_from, o->ctx - 1, "alpha", "boosted");
    for (int s = 0; s < N_SELECT; s++)
        if (use[s]) printf(" %11s", SELECT_NAMES[s]);
    printf("\n");
    for (int i = 0; i < na; i++) {
        int any = -1;
        for (int s = 0; s < N_SELECT; s++)
            if (which[i][s] >= 0) any = which[i][s];
        printf("%-8g %8d", alphas[i], any >= 0 ? kkv_method_boost(&specs[any].method, D) : 0);
        for (int s = 0; s < N_SELECT; s++)
            if (use[s]) printf(" %11.5f", res[which[i][s]].kld_mean);
        printf("\n");
    }
    printf("\ntop-1 agreement with fp16\n%-8s %8s", "alpha", "");
    for (int s = 0; s < N_SELECT; s++)
        if (use[s]) printf(" %11s", SELECT_NAMES[s]);
    printf("\n");
    for (int i = 0; i < na; i++) {
        printf("%-8g %8s", alphas[i], "");
        for (int s = 0; s < N_SELECT; s++)
            if (use[s]) printf(" %11.4f", res[which[i][s]].top1);
        printf("\n");
    }

    /* gnuplot reads the CSV once per selection: rows k*na .. k*na+na-1 */
    char gp[4096];
    int n = snprintf(gp, sizeof gp,
                     "set datafile separator ','\nset key top right\nset grid\n"
                     "set title 'KL(fp16 || kitty) vs boost fraction, by channel selection'\n"
                     "set xlabel 'alpha (share of key channels at 4 bits)'\n"
                     "set ylabel 'mean KL divergence (nats)'\nset logscale y\nplot ");
    int k = 0;
    for (int s = 0; s < N_SELECT; s++) {
        if (!use[s]) continue;
        n += snprintf(gp + n, sizeof gp - (size_t)n,
                      "%s'%s' skip 1 every ::%d::%d using 1:4 with linespoints lw 2 title '%s'",
                      k ? ", " : "", cpath, k * na, k * na + na - 1, SELECT_NAMES[s]);
        k++;
    }
    snprintf(gp + n, sizeof gp - (size_t)n, "\n");
    if (an_path(path, sizeof path, a, "ablation.png") == 0)
        rc = plot_png("analyze ablation", path, 900, 550, gp);
    if (!rc) printf("\nwrote %s/ablation.csv, ablation.json, ablation.png\n", o->out);
done:
    if (f) fclose(f);
    kkv_eval_results_free(res, n_specs);
    free(res);
    free(ranks);
    return rc;
}
