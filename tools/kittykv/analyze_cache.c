/* analyze heatmap and stability: what the cache holds. heatmap reads the fp16
 * keys of one layer back (kkv_seq_read); stability reads the boost index of
 * every key page (kkv_seq_key_page) and compares consecutive pages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "kittykv_eval.h"
#include "plot.h"
#include "util.h"

/* ------------------------------------------------------------ heatmap */

int an_heatmap(an_ctx *a) {
    const int L = a->o.layer, H = a->info.n_kv_heads, D = a->info.head_dim, N = a->o.ctx;
    const int W = kkv_model_layer_window(a->m, L);
    if (W > 0 && N > W) { /* its keys before the window are released, read back as 0 */
        fprintf(stderr, "kittykv analyze heatmap: layer %d is a sliding-window layer (its "
                "newest %d tokens only); pick a global layer or --ctx <= %d\n", L, W, W);
        return 1;
    }
    kkv_method fp16;
    kkv_method_from_name(&fp16, "fp16");
    kkv_cache *c = NULL;
    int seq, rc = 1;
    float *k = malloc((size_t)N * D * sizeof *k);     /* [N][D] one head's keys */
    double *mean = calloc((size_t)H * D, sizeof *mean); /* [H][D] mean |k| */
    float *mx = calloc((size_t)H * D, sizeof *mx);      /* [H][D] max |k| */
    FILE *f = NULL;
    char path[1024];
    if (!k || !mean || !mx) {
        fprintf(stderr, "kittykv analyze heatmap: out of memory\n");
        goto done;
    }
    if (kkv_eval_cache_create(&c, &seq, a->m, &fp16, N, a->o.threads, NULL) != KKV_OK) {
        an_fail(a, "creating the cache");
        goto done;
    }
    if (an_fill(a, c, seq, N)) goto done;
    for (int h = 0; h < H; h++) {
        if (kkv_seq_read(c, k, NULL, seq, L, h) != KKV_OK) {
            an_fail(a, "reading keys");
            goto done;
        }
        char name[64];
        snprintf(name, sizeof name, "heatmap_L%d_h%d.csv", L, h);
        if (!(f = an_open(a, name, path, sizeof path))) goto done;
        /* rows = channels, columns = tokens: the layout gnuplot's matrix reads */
        for (int j = 0; j < D; j++) {
            for (int t = 0; t < N; t++) {
                float v = fabsf(k[(size_t)t * D + j]);
                fprintf(f, "%s%.5g", t ? "," : "", (double)v);
                mean[h * D + j] += v;
                if (v > mx[h * D + j]) mx[h * D + j] = v;
            }
            fputc('\n', f);
        }
        if (an_close(f, path)) {
            f = NULL;
            goto done;
        }
        f = NULL;
        for (int j = 0; j < D; j++) mean[h * D + j] /= N;
    }

    if (!(f = an_open(a, "heatmap.json", path, sizeof path))) goto done;
    fprintf(f, "{\"layer\":%d,\"tokens\":%d,\"head_dim\":%d,\"heads\":[", L, N, D);
    for (int h = 0; h < H; h++) {
        /* the 8 channels with the largest mean |k| (ties to the lower index) */
        int top[8], nt = D < 8 ? D : 8;
        unsigned char used[KKV_MAX_HEAD_DIM] = {0};
        for (int r = 0; r < nt; r++) {
            int best = -1;
            for (int j = 0; j < D; j++)
                if (!used[j] && (best < 0 || mean[h * D + j] > mean[h * D + best])) best = j;
            used[best] = 1;
            top[r] = best;
        }
        fprintf(f, "%s{\"head\":%d,\"csv\":\"heatmap_L%d_h%d.csv\",\"top_channels\":[", h ? "," : "",
                h, L, h);
        for (int r = 0; r < nt; r++) fprintf(f, "%s%d", r ? "," : "", top[r]);
        fprintf(f, "],\"mean_abs\":[");
        for (int j = 0; j < D; j++) fprintf(f, "%s%.6g", j ? "," : "", mean[h * D + j]);
        fprintf(f, "],\"max_abs\":[");
        for (int j = 0; j < D; j++) fprintf(f, "%s%.6g", j ? "," : "", (double)mx[h * D + j]);
        fprintf(f, "]}");
        printf("layer %d head %d: top channels by mean |k|:", L, h);
        for (int r = 0; r < nt; r++) printf(" %d (%.2f)", top[r], mean[h * D + top[r]]);
        printf("\n");
    }
    fprintf(f, "]}\n");
    if (an_close(f, path)) {
        f = NULL;
        goto done;
    }
    f = NULL;

    /* one panel per KV head */
    size_t cap = 4096 + (size_t)H * 512;
    char *gp = malloc(cap);
    if (!gp) goto done;
    int o = snprintf(gp, cap,
                     "set datafile separator ','\nset multiplot layout %d,1 title "
                     "'|key| per channel x token, layer %d (fp16 cache)'\n"
                     "set xlabel 'token'\nset ylabel 'channel'\nset cbrange [0:*]\n"
                     "set palette rgb 33,13,10\nset xrange [-0.5:%d.5]\nset yrange [-0.5:%d.5]\n",
                     H, L, N - 1, D - 1);
    for (int h = 0; h < H; h++)
        o += snprintf(gp + o, cap - (size_t)o,
                      "set title 'KV head %d'\nplot '%s/heatmap_L%d_h%d.csv' matrix with image "
                      "notitle\n",
                      h, a->o.out, L, h);
    snprintf(gp + o, cap - (size_t)o, "unset multiplot\n");
    if (an_path(path, sizeof path, a, "heatmap.png") == 0)
        rc = plot_png("analyze heatmap", path, 1200, 320 * H + 60, gp);
    free(gp);
    if (!rc) printf("wrote %s/heatmap_L%d_h*.csv, heatmap.json, heatmap.png\n", a->o.out, L);
done:
    if (f) fclose(f);
    free(k);
    free(mean);
    free(mx);
    kkv_cache_free(c);
    return rc;
}

/* ------------------------------------------------------------ stability */

/* E[J(A, B)] for independent uniform k-subsets A, B of d items:
 * |A n B| is hypergeometric, J = i / (2k - i). */
static double random_jaccard(int k, int d) {
    if (k <= 0 || k >= d) return 1.0;
    double e = 0.0;
    for (int i = 0; i <= k; i++) {
        if (k - i > d - k) continue;
        double lp = lgamma(k + 1.0) - lgamma(i + 1.0) - lgamma(k - i + 1.0) +
                    lgamma(d - k + 1.0) - lgamma(k - i + 1.0) - lgamma(d - 2.0 * k + i + 1.0) -
                    (lgamma(d + 1.0) - lgamma(k + 1.0) - lgamma(d - k + 1.0));
        e += exp(lp) * (double)i / (double)(2 * k - i);
    }
    return e;
}

int an_stability(an_ctx *a) {
    const int NL = a->info.n_layers, H = a->info.n_kv_heads, D = a->info.head_dim;
    const int N = a->o.ctx;
    char err[256];
    cli_spec sp;
    if (cli_spec_parse(&sp, a->o.method, err, sizeof err)) {
        fprintf(stderr, "kittykv analyze stability: --method: %s\n", err);
        return 2;
    }
    const kkv_method *mt = &sp.method;
    if (mt->fp16 || mt->select == KKV_SELECT_EXPLICIT || mt->key_bits == 8) {
        fprintf(stderr, "kittykv analyze stability: --method must be a quantized method with "
                "2-bit key pages and magnitude, variance or random selection\n");
        return 2;
    }
    if (kkv_method_check(mt, D) != KKV_OK) return an_fail(a, "--method");
    const int nb = kkv_method_boost(mt, D), G = mt->group;
    const int n_pages = N > mt->sink ? (N - mt->sink) / G : 0;
    if (nb == 0 || nb == D || n_pages < 2) {
        fprintf(stderr, "kittykv analyze stability: need 0 < boosted channels < %d (have %d) "
                "and at least 2 key pages (have %d: raise --ctx)\n", D, nb, n_pages);
        return 2;
    }
    kkv_cache *c = NULL;
    int seq, rc = 1;
    const size_t pb = kkv_key_page_bytes(D, G, D); /* budget=head|err: up to D boosted */
    uint8_t *page = malloc(pb);                                /* one key page */
    uint8_t *sets = malloc((size_t)n_pages * D);               /* [page][D] 1 = boosted */
    double *lay = calloc((size_t)NL * 3, sizeof *lay);          /* [layer] mean, min, max */
    FILE *f = NULL, *fl = NULL;
    char path[1024], lpath[1024];
    if (!page || !sets || !lay) {
        fprintf(stderr, "kittykv analyze stability: out of memory\n");
        goto done;
    }
    if (kkv_eval_cache_create(&c, &seq, a->m, mt, N, a->o.threads, NULL) != KKV_OK) {
        an_fail(a, "creating the cache");
        goto done;
    }
    if (an_fill(a, c, seq, N)) goto done;
    if (!(f = an_open(a, "stability.csv", path, sizeof path))) goto done;
    fprintf(f, "layer,head,page,jaccard,overlap\n");
    double all = 0.0;
    long n_all = 0;
    for (int l = 0; l < NL; l++) {
        double sum = 0.0, mn = 1.0, mxv = 0.0;
        int n = 0;
        for (int h = 0; h < H; h++) {
            for (int p = 0; p < n_pages; p++) {
                if (kkv_seq_key_page(c, page, pb, seq, l, h, p) != KKV_OK) {
                    an_fail(a, "reading a key page");
                    goto done;
                }
                const int pnb = kkv_seq_key_page_boost(c, seq, l, h, p);
                const size_t idx_off = (size_t)D * G / 4 + (size_t)pnb * G / 4;
                for (int j = 0; j < D; j++) sets[(size_t)p * D + j] = page[idx_off + j] != pnb;
            }
            for (int p = 1; p < n_pages; p++) {
                int inter = 0, uni = 0;
                for (int j = 0; j < D; j++) {
                    int x = sets[(size_t)p * D + j], y = sets[(size_t)(p - 1) * D + j];
                    inter += x && y;
                    uni += x || y;
                }
                double jac = uni ? (double)inter / uni : 1.0;
                fprintf(f, "%d,%d,%d,%.6f,%d\n", l, h, p, jac, inter);
                sum += jac;
                if (jac < mn) mn = jac;
                if (jac > mxv) mxv = jac;
                n++;
            }
        }
        lay[l * 3] = sum / n;
        lay[l * 3 + 1] = mn;
        lay[l * 3 + 2] = mxv;
        all += sum;
        n_all += n;
    }
    if (an_close(f, path)) {
        f = NULL;
        goto done;
    }
    f = NULL;
    const double rj = random_jaccard(nb, D), mean_all = all / (double)n_all;
    if (!(fl = an_open(a, "stability_layers.csv", lpath, sizeof lpath))) goto done;
    fprintf(fl, "layer,mean_jaccard,min_jaccard,max_jaccard,random_expectation\n");
    for (int l = 0; l < NL; l++)
        fprintf(fl, "%d,%.6f,%.6f,%.6f,%.6f\n", l, lay[l * 3], lay[l * 3 + 1], lay[l * 3 + 2], rj);
    if (an_close(fl, lpath)) {
        fl = NULL;
        goto done;
    }
    fl = NULL;
    if (!(f = an_open(a, "stability.json", path, sizeof path))) goto done;
    fprintf(f, "{\"method\":");
    cli_json_str(f, sp.name);
    fprintf(f, ",\"tokens\":%d,\"pages\":%d,\"boosted\":%d,\"head_dim\":%d,"
            "\"mean_jaccard\":%.6f,\"random_expectation\":%.6f,\"layers\":[",
            N, n_pages, nb, D, mean_all, rj);
    for (int l = 0; l < NL; l++) fprintf(f, "%s%.6f", l ? "," : "", lay[l * 3]);
    fprintf(f, "]}\n");
    if (an_close(f, path)) {
        f = NULL;
        goto done;
    }
    f = NULL;

    printf("boosted-set stability, %s: %d of %d channels, %d pages of %d tokens per head\n",
           sp.name, nb, D, n_pages, G);
    printf("mean Jaccard of consecutive pages: %.3f (independent random sets: %.3f)\n\n",
           mean_all, rj);
    printf("%5s %8s %8s %8s\n", "layer", "mean", "min", "max");
    for (int l = 0; l < NL; l++)
        printf("%5d %8.3f %8.3f %8.3f\n", l, lay[l * 3], lay[l * 3 + 1], lay[l * 3 + 2]);

    char gp[2048];
    snprintf(gp, sizeof gp,
             "set datafile separator ','\nset key autotitle columnhead bottom right\n"
             "set title 'Jaccard similarity of consecutive pages'' boosted key channels (%s)'\n"
             "set xlabel 'layer'\nset ylabel 'Jaccard'\nset yrange [0:1.05]\nset grid\n"
             "plot '%s' using 1:2 with linespoints lw 2 title 'mean over heads and pages', "
             "'' using 1:3 with lines dt 2 title 'min', "
             "'' using 1:5 with lines lc rgb 'gray' title 'random sets (expected)'\n",
             sp.name, lpath);
    if (an_path(path, sizeof path, a, "stability.png") == 0)
        rc = plot_png("analyze stability", path, 900, 500, gp);
    if (!rc) printf("\nwrote %s/stability.csv, stability_layers.csv, stability.json, "
                    "stability.png\n", a->o.out);
done:
    if (f) fclose(f);
    if (fl) fclose(fl);
    free(page);
    free(sets);
    free(lay);
    kkv_cache_free(c);
    return rc;
}
