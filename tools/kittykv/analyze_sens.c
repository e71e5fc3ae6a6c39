/* analyze sensitivity (the paper's Fig. 2b) and the oracle rankings behind the
 * ablation's select=oracle: how much the attention scores of one layer move
 * when only key channel j is stored at 2 bits.
 *
 * Only channel j changes, so the score error of query t against key s is
 * q_t[j] * e_s[j] / sqrt(D), where e = (2-bit channel j) - (fp16 channel j).
 * Its mean square over the query heads of a KV head's group and the causal
 * pairs (s <= t) is therefore exact from two running sums, with no subsampling:
 *   MSE_j = sum_t Q2_t[j] * E_t[j] / (D * group_heads * N(N+1)/2)
 * with Q2_t[j] = sum over the group's query heads of q_t[j]^2 and E_t[j] the
 * sum of e_s[j]^2 over the keys that query t sees quantized. As in the cache,
 * the first S tokens stay fp16 and a page of G tokens is quantized only after
 * the query of its last token has attended (docs/FORMAT.md section 3), so query t sees
 * page p quantized iff t >= S + (p+1)*G; every other pair has error 0 but
 * still counts in the mean. The 2-bit values come from the library's own
 * codec: kkv_key_page_encode with no boost quantizes every channel of a page
 * independently (per-channel min/max, fp16 scale and min), so one encode and
 * decode per page yields the error of each channel quantized alone. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "kittykv_eval.h"
#include "plot.h"
#include "util.h"

/* What the query hook collects. */
typedef struct sens_cap {
    int    l0, nl;      /* layers [l0, l0 + nl) are captured               */
    int    n, h, d, gq; /* tokens, KV heads, head_dim, query heads per KV head */
    float *q2;          /* [nl][n][h][d] sum over the group's heads of q^2   */
    long   calls;       /* (layer, token) pairs stored                     */
} sens_cap;

static void sens_hook(void *user, int seq, int layer, int64_t pos, const float *q,
                      const float *k, const float *v) {
    sens_cap *c = user;
    (void)seq;
    (void)k;
    (void)v;
    if (layer < c->l0 || layer >= c->l0 + c->nl || pos < 0 || pos >= c->n) return;
    float *dst = c->q2 + (((size_t)(layer - c->l0) * c->n + (size_t)pos) * c->h) * c->d;
    for (int kh = 0; kh < c->h; kh++)
        for (int j = 0; j < c->d; j++) {
            float s = 0.0f;
            for (int g = 0; g < c->gq; g++) {
                float x = q[((size_t)kh * c->gq + g) * c->d + j];
                s += x * x;
            }
            dst[(size_t)kh * c->d + j] = s;
        }
    c->calls++;
}

/* Runs tokens [0, n) through a fresh fp16 cache with the hook collecting
 * layers [l0, l0 + nl). On success *cache (caller frees) holds the keys and
 * cap->q2 is filled. 0, or 1 after printing why. */
static int sens_capture(sens_cap *cap, kkv_cache **cache, int *seq, an_ctx *a, int l0, int nl,
                        int n) {
    *cache = NULL;
    memset(cap, 0, sizeof *cap);
    cap->l0 = l0;
    cap->nl = nl;
    cap->n = n;
    cap->h = a->info.n_kv_heads;
    cap->d = a->info.head_dim;
    cap->gq = a->info.n_heads / a->info.n_kv_heads;
    cap->q2 = malloc((size_t)nl * n * cap->h * cap->d * sizeof *cap->q2);
    if (!cap->q2) {
        fprintf(stderr, "kittykv analyze %s: out of memory for the queries\n", a->o.sub);
        return 1;
    }
    kkv_method fp16;
    kkv_method_from_name(&fp16, "fp16");
    if (kkv_eval_cache_create(cache, seq, a->m, &fp16, n, a->o.threads, NULL) != KKV_OK)
        return an_fail(a, "creating the cache");
    kkv_model_set_qkv_hook(a->m, sens_hook, cap);
    int rc = an_fill(a, *cache, *seq, n);
    kkv_model_set_qkv_hook(a->m, NULL, NULL);
    if (rc) return 1;
    if (cap->calls != (long)nl * n) {
        fprintf(stderr, "kittykv analyze %s: the query hook saw %ld (layer, token) pairs, "
                "expected %ld\n", a->o.sub, cap->calls, (long)nl * n);
        return 1;
    }
    return 0;
}

/* Per-channel score MSE of one (layer, KV head), see the top of the file.
 * mse: [d] out. k: [n][d] keys as the fp16 cache serves them. q2: the head's
 * row of sens_cap.q2, rows `stride` floats apart. page: [kkv_key_page_bytes(d,
 * group, 0)] and dec: [group][d] scratch. 0, or 1 after printing why. */
static int sens_head(double *mse, const float *k, const float *q2, size_t stride, int n, int d,
                     int gq, int sink, int group, void *page, float *dec, const an_ctx *a) {
    double e2[KKV_MAX_HEAD_DIM] = {0}; /* [d] E_t: squared errors of quantized keys */
    double acc[KKV_MAX_HEAD_DIM] = {0};
    int n_pages = n > sink ? (n - sink) / group : 0, next = 0;
    for (int t = 0; t < n; t++) {
        if (next < n_pages && t == sink + (next + 1) * group) {
            const float *kp = k + (size_t)(sink + next * group) * d; /* [group][d] */
            if (kkv_key_page_encode(page, kp, d, group, 0, KKV_SELECT_MAGNITUDE, 0, 0, NULL) !=
                    KKV_OK ||
                kkv_key_page_decode(dec, page, d, group, 0) != KKV_OK)
                return an_fail(a, "quantizing a key page");
            for (int s = 0; s < group; s++)
                for (int j = 0; j < d; j++) {
                    double e = (double)dec[(size_t)s * d + j] - (double)kp[(size_t)s * d + j];
                    e2[j] += e * e;
                }
            next++;
        }
        const float *qt = q2 + (size_t)t * stride;
        for (int j = 0; j < d; j++) acc[j] += (double)qt[j] * e2[j];
    }
    double pairs = (double)gq * n * (n + 1.0) / 2.0;
    for (int j = 0; j < d; j++) mse[j] = acc[j] / ((double)d * pairs);
    return 0;
}

/* order: [d] channels by v descending, ties to the lower index. */
static void rank_desc(int *order, const double *v, int d) {
    for (int j = 0; j < d; j++) order[j] = j;
    for (int i = 1; i < d; i++) { /* insertion sort: stable, d <= 256 */
        int x = order[i], p = i;
        while (p > 0 && v[order[p - 1]] < v[x]) {
            order[p] = order[p - 1];
            p--;
        }
        order[p] = x;
    }
}

/* How one head's sensitivity compares with magnitude. */
typedef struct sens_cmp {
    int    overlap;        /* |top-K by MSE  n  top-K by mean |k||          */
    double share_sens;     /* share of the total MSE in the top-K by MSE    */
    double share_mag;      /* share of the total MSE in the top-K by |k|    */
    double spearman;       /* rank correlation of MSE and mean |k|          */
} sens_cmp;

static sens_cmp sens_compare(const int *by_sens, const int *by_mag, const double *mse, int d,
                             int top) {
    sens_cmp r = {0};
    int rs[KKV_MAX_HEAD_DIM], rm[KKV_MAX_HEAD_DIM]; /* [d] rank of each channel */
    double tot = 0.0;
    for (int i = 0; i < d; i++) {
        rs[by_sens[i]] = i;
        rm[by_mag[i]] = i;
        tot += mse[i];
    }
    double d2 = 0.0;
    for (int j = 0; j < d; j++) {
        d2 += (double)(rs[j] - rm[j]) * (rs[j] - rm[j]);
        if (rs[j] < top && rm[j] < top) r.overlap++;
    }
    for (int i = 0; i < top; i++) {
        r.share_sens += mse[by_sens[i]];
        r.share_mag += mse[by_mag[i]];
    }
    if (tot > 0) {
        r.share_sens /= tot;
        r.share_mag /= tot;
    }
    r.spearman = d > 1 ? 1.0 - 6.0 * d2 / ((double)d * ((double)d * d - 1.0)) : 1.0;
    return r;
}

/* mean |k| per channel of k [n][d] into mag [d]. */
static void mean_abs(double *mag, const float *k, int n, int d) {
    for (int j = 0; j < d; j++) mag[j] = 0.0;
    for (int t = 0; t < n; t++)
        for (int j = 0; j < d; j++) mag[j] += fabs((double)k[(size_t)t * d + j]);
    for (int j = 0; j < d; j++) mag[j] /= n;
}

/* Kitty's S, G and boost count K for head_dim d. */
static void kitty_shape(int *sink, int *group, int *top, int d) {
    kkv_method km;
    kkv_method_from_name(&km, "kitty");
    *sink = km.sink;
    *group = km.group;
    *top = kkv_method_boost(&km, d);
    if (*top < 1) *top = 1;
}

/* ------------------------------------------------------------ sensitivity */

int an_sensitivity(an_ctx *a) {
    const int L = a->o.layer, H = a->info.n_kv_heads, D = a->info.head_dim, N = a->o.ctx;
    int S, G, K;
    kitty_shape(&S, &G, &K, D);
    sens_cap cap;
    memset(&cap, 0, sizeof cap);
    kkv_cache *c = NULL;
    int seq, rc = 1;
    FILE *f = NULL;
    char path[1024], cpath[1024];
    float *k = malloc((size_t)N * D * sizeof *k);            /* [N][D] one head's keys */
    float *dec = malloc((size_t)G * D * sizeof *dec);        /* [G][D] decoded page    */
    void *page = malloc(kkv_key_page_bytes(D, G, 0));
    double *mse = malloc((size_t)H * D * sizeof *mse);       /* [H][D]                 */
    double *mag = malloc((size_t)H * D * sizeof *mag);       /* [H][D] mean |k|        */
    int *by_sens = malloc((size_t)H * D * sizeof *by_sens);  /* [H][D] channel order   */
    int *by_mag = malloc((size_t)H * D * sizeof *by_mag);    /* [H][D]                 */
    sens_cmp cmp[64];
    if (H > 64) {
        fprintf(stderr, "kittykv analyze sensitivity: more than 64 KV heads\n");
        goto done;
    }
    if (!k || !dec || !page || !mse || !mag || !by_sens || !by_mag) {
        fprintf(stderr, "kittykv analyze sensitivity: out of memory\n");
        goto done;
    }
    if (N < S + G)
        fprintf(stderr, "kittykv analyze sensitivity: warning: --ctx %d holds no full key page "
                "(S=%d, G=%d): every MSE is 0\n", N, S, G);
    if (sens_capture(&cap, &c, &seq, a, L, 1, N)) goto done;
    for (int h = 0; h < H; h++) {
        if (kkv_seq_read(c, k, NULL, seq, L, h) != KKV_OK) {
            an_fail(a, "reading keys");
            goto done;
        }
        if (sens_head(mse + (size_t)h * D, k, cap.q2 + (size_t)h * D, (size_t)H * D, N, D,
                      cap.gq, S, G, page, dec, a))
            goto done;
        mean_abs(mag + (size_t)h * D, k, N, D);
        rank_desc(by_sens + (size_t)h * D, mse + (size_t)h * D, D);
        rank_desc(by_mag + (size_t)h * D, mag + (size_t)h * D, D);
        cmp[h] = sens_compare(by_sens + (size_t)h * D, by_mag + (size_t)h * D,
                              mse + (size_t)h * D, D, K);
    }

    /* CSV: D rows per head, in channel order (the bar charts read it so) */
    if (!(f = an_open(a, "sensitivity.csv", cpath, sizeof cpath))) goto done;
    fprintf(f, "layer,head,channel,score_mse,mse_share,mean_abs_k,sens_rank,mag_rank\n");
    for (int h = 0; h < H; h++) {
        double tot = 0.0;
        int rs[KKV_MAX_HEAD_DIM], rm[KKV_MAX_HEAD_DIM];
        for (int i = 0; i < D; i++) {
            tot += mse[h * D + i];
            rs[by_sens[h * D + i]] = i;
            rm[by_mag[h * D + i]] = i;
        }
        for (int j = 0; j < D; j++)
            fprintf(f, "%d,%d,%d,%.8g,%.6f,%.6g,%d,%d\n", L, h, j, mse[h * D + j],
                    tot > 0 ? mse[h * D + j] / tot : 0.0, mag[h * D + j], rs[j], rm[j]);
    }
    if (an_close(f, cpath)) {
        f = NULL;
        goto done;
    }
    f = NULL;

    if (!(f = an_open(a, "sensitivity.json", path, sizeof path))) goto done;
    fprintf(f, "{\"layer\":%d,\"tokens\":%d,\"head_dim\":%d,\"sink\":%d,\"group\":%d,"
               "\"top_k\":%d,\"query_heads_per_kv_head\":%d,\"heads\":[",
            L, N, D, S, G, K, cap.gq);
    for (int h = 0; h < H; h++) {
        fprintf(f, "%s{\"head\":%d,\"top_sensitivity\":[", h ? "," : "", h);
        for (int i = 0; i < K; i++) fprintf(f, "%s%d", i ? "," : "", by_sens[h * D + i]);
        fprintf(f, "],\"top_magnitude\":[");
        for (int i = 0; i < K; i++) fprintf(f, "%s%d", i ? "," : "", by_mag[h * D + i]);
        fprintf(f, "],\"overlap\":%d,\"mse_share_top_sensitivity\":%.6f,"
                   "\"mse_share_top_magnitude\":%.6f,\"spearman\":%.6f,\"score_mse\":[",
                cmp[h].overlap, cmp[h].share_sens, cmp[h].share_mag, cmp[h].spearman);
        for (int j = 0; j < D; j++) fprintf(f, "%s%.8g", j ? "," : "", mse[h * D + j]);
        fprintf(f, "]}");
    }
    fprintf(f, "]}\n");
    if (an_close(f, path)) {
        f = NULL;
        goto done;
    }
    f = NULL;

    printf("attention-score MSE when only key channel j is 2-bit, layer %d, %d tokens "
           "(S=%d, G=%d), %d query heads per KV head\n",
           L, N, S, G, cap.gq);
    for (int h = 0; h < H; h++) {
        const int *bs = by_sens + (size_t)h * D, *bm = by_mag + (size_t)h * D;
        double tot = 0.0;
        for (int j = 0; j < D; j++) tot += mse[h * D + j];
        printf("\nKV head %d (total MSE %.4g)\n  top %d by sensitivity:", h, tot, K);
        for (int i = 0; i < K; i++)
            printf(" %d (%.1f%%)", bs[i], tot > 0 ? 100.0 * mse[h * D + bs[i]] / tot : 0.0);
        printf("\n  top %d by magnitude:  ", K);
        for (int i = 0; i < K; i++) printf(" %d (|k| %.2f)", bm[i], mag[h * D + bm[i]]);
        printf("\n  overlap %d of %d; MSE share of the top %d: %.1f%% by sensitivity, %.1f%% by "
               "magnitude; Spearman(MSE, |k|) %.3f\n",
               cmp[h].overlap, K, K, 100.0 * cmp[h].share_sens, 100.0 * cmp[h].share_mag,
               cmp[h].spearman);
    }

    rc = 0;
    for (int h = 0; h < H && !rc; h++) {
        char gp[2048], name[64];
        snprintf(gp, sizeof gp,
                 "set datafile separator ','\nset grid ytics\nset key top left\n"
                 "set title 'Attention-score MSE with only key channel j at 2 bits, layer %d, "
                 "KV head %d'\nset xlabel 'key channel j'\nset ylabel 'score MSE'\n"
                 "set y2label 'mean |k|'\nset ytics nomirror\nset y2tics\nset xrange [-1:%d]\n"
                 "set style fill solid 0.7\nset boxwidth 0.8\n"
                 "plot '%s' skip 1 every ::%d::%d using 3:4 with boxes lc rgb '#3060c0' "
                 "title 'score MSE', '' skip 1 every ::%d::%d using 3:6 axes x1y2 with points "
                 "pt 7 ps 0.6 lc rgb '#d04020' title 'mean |k|'\n",
                 L, h, D, cpath, h * D, h * D + D - 1, h * D, h * D + D - 1);
        snprintf(name, sizeof name, "sensitivity_L%d_h%d.png", L, h);
        if (an_path(path, sizeof path, a, name)) {
            fprintf(stderr, "kittykv analyze sensitivity: output path too long\n");
            rc = 1;
        } else {
            rc = plot_png("analyze sensitivity", path, 1000, 450, gp);
        }
    }
    if (!rc)
        printf("\nwrote %s/sensitivity.csv, sensitivity.json, sensitivity_L%d_h*.png\n",
               a->o.out, L);
done:
    free(cap.q2);
    if (f) fclose(f);
    kkv_cache_free(c);
    free(k);
    free(dec);
    free(page);
    free(mse);
    free(mag);
    free(by_sens);
    free(by_mag);
    return rc;
}

/* ------------------------------------------------------------ oracle */

int an_oracle_ranks(an_ctx *a, uint8_t *ranks) {
    const int NL = a->info.n_layers, H = a->info.n_kv_heads, D = a->info.head_dim;
    const int N = a->o.ctx;
    int S, G, K;
    kitty_shape(&S, &G, &K, D);
    sens_cap cap;
    memset(&cap, 0, sizeof cap);
    kkv_cache *c = NULL;
    int seq, rc = 1;
    float *k = malloc((size_t)N * D * sizeof *k);     /* [N][D] one head's keys */
    float *dec = malloc((size_t)G * D * sizeof *dec); /* [G][D] decoded page    */
    void *page = malloc(kkv_key_page_bytes(D, G, 0));
    FILE *f = NULL;
    char path[1024];
    if (!k || !dec || !page) {
        fprintf(stderr, "kittykv analyze %s: out of memory\n", a->o.sub);
        goto done;
    }
    if (N < S + G) {
        fprintf(stderr, "kittykv analyze %s: the oracle needs --ctx >= %d (one full key page "
                "after the sink)\n", a->o.sub, S + G);
        goto done;
    }
    /* an_fill reads from a->tokens: point it at the calibration text */
    int32_t *text = a->tokens;
    a->tokens += a->o.calib_from;
    int bad = sens_capture(&cap, &c, &seq, a, 0, NL, N);
    a->tokens = text;
    if (bad) goto done;
    if (!(f = an_open(a, "oracle_ranks.csv", path, sizeof path))) goto done;
    fprintf(f, "layer,head,channels_by_sensitivity\n");
    double ov = 0.0, sh_s = 0.0, sh_m = 0.0, rho = 0.0;
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < H; h++) {
            double mse[KKV_MAX_HEAD_DIM], mag[KKV_MAX_HEAD_DIM];
            int bs[KKV_MAX_HEAD_DIM], bm[KKV_MAX_HEAD_DIM];
            if (kkv_seq_read(c, k, NULL, seq, l, h) != KKV_OK) {
                an_fail(a, "reading keys");
                goto done;
            }
            const float *q2 = cap.q2 + ((size_t)l * N * H + (size_t)h) * D;
            if (sens_head(mse, k, q2, (size_t)H * D, N, D, cap.gq, S, G, page, dec, a))
                goto done;
            mean_abs(mag, k, N, D);
            rank_desc(bs, mse, D);
            rank_desc(bm, mag, D);
            sens_cmp r = sens_compare(bs, bm, mse, D, K);
            ov += r.overlap;
            sh_s += r.share_sens;
            sh_m += r.share_mag;
            rho += r.spearman;
            uint8_t *dst = ranks + ((size_t)l * H + h) * D;
            fprintf(f, "%d,%d,", l, h);
            for (int i = 0; i < D; i++) {
                dst[i] = (uint8_t)bs[i];
                fprintf(f, "%s%d", i ? " " : "", bs[i]);
            }
            fputc('\n', f);
        }
    rc = an_close(f, path);
    f = NULL;
    if (rc) goto done;
    int nh = NL * H;
    printf("oracle rankings from tokens %d..%d, %d layers x %d KV heads: top %d by sensitivity vs "
           "by magnitude overlap %.2f of %d on average; they hold %.1f%% vs %.1f%% of the "
           "score MSE; mean Spearman %.3f (wrote %s)\n",
           a->o.calib_from, a->o.calib_from + N - 1, NL, H, K, ov / nh, K, 100.0 * sh_s / nh, 100.0 * sh_m / nh, rho / nh, path);
done:
    if (f) fclose(f);
    free(cap.q2);
    kkv_cache_free(c);
    free(k);
    free(dec);
    free(page);
    return rc;
}
