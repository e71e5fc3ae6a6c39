/* analyze layers: how much each layer's quantized cache contributes to the
 * KL divergence from fp16.
 *
 * One cache holds one method for every layer, so "quantize only layer l" is
 * built from parts, through the public API only:
 *  1. F: an fp16 run of the text; its K/V are read back (kkv_seq_read).
 *  2. Q: F's K/V of every layer pushed through the method's token lifecycle
 *     (kkv_append + kkv_flush). Q's layer l is exactly what layer l would
 *     store if only it were quantized: layer l's K/V depend only on layers
 *     below it, which are fp16.
 *  3. At a scored position t, a fresh fp16 cache H gets tokens 0..t-1 with
 *     layer l from Q (read back as attention sees it) and every other layer
 *     from F; one forward step of token t then gives the next-token
 *     distribution with only layer l's past quantized, compared with F's.
 * This is a teacher-forced, one-step measure: the past of the other layers
 * is the fp16 one. Two controls run with it: every layer from F (must give
 * KL exactly 0, proving the splice is exact) and every layer from Q (the
 * teacher-forced total, to compare with the sum over layers). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "analyze.h"
#include "kittykv_eval.h"
#include "plot.h"
#include "util.h"

typedef struct layers_state {
    int     NL, H, D, N, V;
    float  *fk, *fv;   /* [NL][H][N][D] F's keys and values                */
    float  *qk, *qv;   /* [NL][H][N][D] Q's, as read back at length t      */
    float  *tk, *tv;   /* [H][D] one token of one layer, for kkv_append    */
    float  *logits;    /* [V] */
    float  *ref;       /* [K][V] F's logits at the scored positions        */
    double *lp, *p, *lq; /* [V] log-softmax of F, exp of it, of the hybrid */
} layers_state;

static float *at(float *base, const layers_state *s, int l, int h) {
    return base + ((size_t)l * s->H + h) * (size_t)s->N * s->D;
}

/* Fills sequence seq of the fp16 cache hc with tokens 0..t-1, each layer from
 * Q or F. which: the one layer taken from Q, -1 none, -2 all. */
static kkv_status splice(layers_state *s, kkv_cache *hc, int seq, int t, int which) {
    for (int l = 0; l < s->NL; l++) {
        int from_q = which == -2 || which == l;
        float *K = from_q ? s->qk : s->fk, *Vv = from_q ? s->qv : s->fv;
        for (int i = 0; i < t; i++) {
            for (int h = 0; h < s->H; h++) {
                memcpy(s->tk + (size_t)h * s->D, at(K, s, l, h) + (size_t)i * s->D,
                       (size_t)s->D * sizeof *s->tk);
                memcpy(s->tv + (size_t)h * s->D, at(Vv, s, l, h) + (size_t)i * s->D,
                       (size_t)s->D * sizeof *s->tv);
            }
            kkv_status st = kkv_append(hc, seq, l, s->tk, s->tv);
            if (st == KKV_OK) st = kkv_flush(hc, seq, l);
            if (st != KKV_OK) return st;
        }
    }
    return KKV_OK;
}

int an_layers(an_ctx *a) {
    const an_opts *o = &a->o;
    char err[256];
    cli_spec sp;
    if (cli_spec_parse(&sp, o->method, err, sizeof err)) {
        fprintf(stderr, "kittykv analyze layers: --method: %s\n", err);
        return 2;
    }
    if (sp.method.fp16 || sp.method.select == KKV_SELECT_EXPLICIT) {
        fprintf(stderr, "kittykv analyze layers: --method must be a quantized method without "
                "select=oracle\n");
        return 2;
    }
    if (o->score_from >= o->ctx) {
        fprintf(stderr, "kittykv analyze layers: --score-from must be below --ctx\n");
        return 2;
    }
    layers_state s = {.NL = a->info.n_layers, .H = a->info.n_kv_heads, .D = a->info.head_dim,
                      .N = o->ctx, .V = a->info.n_vocab};
    const int K = o->positions < o->ctx - o->score_from ? o->positions : o->ctx - o->score_from;
    const int NC = s.NL + 2; /* configurations: each layer, none, all */
    size_t kv = (size_t)s.NL * s.H * s.N * s.D;
    s.fk = malloc(kv * sizeof *s.fk);
    s.fv = malloc(kv * sizeof *s.fv);
    s.qk = malloc(kv * sizeof *s.qk);
    s.qv = malloc(kv * sizeof *s.qv);
    s.tk = malloc((size_t)s.H * s.D * sizeof *s.tk);
    s.tv = malloc((size_t)s.H * s.D * sizeof *s.tv);
    s.logits = malloc((size_t)s.V * sizeof *s.logits);
    s.ref = malloc((size_t)K * s.V * sizeof *s.ref);
    s.lp = malloc((size_t)s.V * sizeof *s.lp);
    s.p = malloc((size_t)s.V * sizeof *s.p);
    s.lq = malloc((size_t)s.V * sizeof *s.lq);
    int *pos = malloc((size_t)K * sizeof *pos);               /* [K] scored positions */
    double *kl = calloc((size_t)NC * K, sizeof *kl);          /* [NC][K] */
    kkv_method fp16;
    kkv_method_from_name(&fp16, "fp16");
    kkv_cache *F = NULL, *Q = NULL, *Hc = NULL;
    int fs, qs, hs, rc = 1;
    FILE *f = NULL;
    char path[1024], cpath[1024];
    if (!s.fk || !s.fv || !s.qk || !s.qv || !s.tk || !s.tv || !s.logits || !s.ref || !s.lp || !s.p ||
        !s.lq || !pos || !kl) {
        fprintf(stderr, "kittykv analyze layers: out of memory\n");
        goto done;
    }
    for (int i = 0; i < K; i++)
        pos[i] = K == 1 ? o->ctx - 1
                        : o->score_from + (int)((long)i * (o->ctx - 1 - o->score_from) / (K - 1));
    if (kkv_eval_cache_create(&F, &fs, a->m, &fp16, s.N, o->threads, NULL) != KKV_OK ||
        kkv_eval_cache_create(&Q, &qs, a->m, &sp.method, s.N, o->threads, NULL) != KKV_OK ||
        kkv_eval_cache_create(&Hc, &hs, a->m, &fp16, s.N, o->threads, NULL) != KKV_OK ||
        kkv_seq_free(Hc, hs) != KKV_OK) {
        an_fail(a, "creating the caches");
        goto done;
    }
    /* F's logits at each scored position: the reference distributions */
    for (int i = 0, done_tok = 0; i < K; i++) {
        int n = pos[i] + 1 - done_tok;
        if (kkv_model_forward(a->m, F, s.ref + (size_t)i * s.V, fs, a->tokens + done_tok, n,
                              0) != KKV_OK) {
            an_fail(a, "fp16 forward pass");
            goto done;
        }
        done_tok += n;
    }
    for (int l = 0; l < s.NL; l++)
        for (int h = 0; h < s.H; h++)
            if (kkv_seq_read(F, at(s.fk, &s, l, h), at(s.fv, &s, l, h), fs, l, h) != KKV_OK) {
                an_fail(a, "reading the fp16 cache");
                goto done;
            }
    kkv_cache_free(F);
    F = NULL;

    double t0 = cli_now();
    int fed = 0; /* tokens of F's K/V pushed into Q so far */
    for (int i = 0; i < K; i++) {
        const int t = pos[i];
        /* Q holds tokens 0..t-1, flushed as after t decode steps */
        for (; fed < t; fed++)
            for (int l = 0; l < s.NL; l++) {
                for (int h = 0; h < s.H; h++) {
                    memcpy(s.tk + (size_t)h * s.D, at(s.fk, &s, l, h) + (size_t)fed * s.D,
                           (size_t)s.D * sizeof *s.tk);
                    memcpy(s.tv + (size_t)h * s.D, at(s.fv, &s, l, h) + (size_t)fed * s.D,
                           (size_t)s.D * sizeof *s.tv);
                }
                if (kkv_append(Q, qs, l, s.tk, s.tv) != KKV_OK ||
                    kkv_flush(Q, qs, l) != KKV_OK) {
                    an_fail(a, "building the quantized cache");
                    goto done;
                }
            }
        for (int l = 0; l < s.NL; l++)
            for (int h = 0; h < s.H; h++)
                if (kkv_seq_read(Q, at(s.qk, &s, l, h), at(s.qv, &s, l, h), qs, l, h) != KKV_OK) {
                    an_fail(a, "reading the quantized cache");
                    goto done;
                }
        kkv_log_softmax(s.lp, s.ref + (size_t)i * s.V, s.V);
        for (int v = 0; v < s.V; v++) s.p[v] = exp(s.lp[v]);
        /* configuration c: 0..NL-1 one layer from Q, NL none (the splice
         * check), NL+1 every layer */
        for (int c = 0; c < NC; c++) {
            int which = c < s.NL ? c : (c == s.NL ? -1 : -2);
            if (kkv_seq_add(Hc, &hs) != KKV_OK || splice(&s, Hc, hs, t, which) != KKV_OK ||
                kkv_model_forward(a->m, Hc, s.logits, hs, a->tokens + t, 1, 0) != KKV_OK) {
                an_fail(a, "hybrid forward step");
                goto done;
            }
            kkv_seq_free(Hc, hs);
            kkv_log_softmax(s.lq, s.logits, s.V);
            kl[(size_t)c * K + i] = kkv_kl(s.p, s.lp, s.lq, s.V);
        }
        cli_progress("layers", i + 1, K, cli_now() - t0);
    }

    /* The splice check: H with every layer from F must reproduce F's own
     * logits bit for bit, so its KL is exactly 0. */
    double ref_max = 0.0, sum_layers = 0.0, all_mean = 0.0;
    double *mean = calloc((size_t)NC, sizeof *mean); /* [NC] */
    if (!mean) goto done;
    for (int c = 0; c < NC; c++) {
        for (int i = 0; i < K; i++) mean[c] += kl[(size_t)c * K + i];
        mean[c] /= K;
    }
    for (int i = 0; i < K; i++)
        if (fabs(kl[(size_t)s.NL * K + i]) > ref_max) ref_max = fabs(kl[(size_t)s.NL * K + i]);
    for (int l = 0; l < s.NL; l++) sum_layers += mean[l];
    all_mean = mean[s.NL + 1];

    if (!(f = an_open(a, "layers.csv", cpath, sizeof cpath))) goto done_mean;
    fprintf(f, "layer,kld_mean,share");
    for (int i = 0; i < K; i++) fprintf(f, ",kld_t%d", pos[i]);
    fprintf(f, "\n");
    for (int l = 0; l < s.NL; l++) {
        fprintf(f, "%d,%.8g,%.6f", l, mean[l], sum_layers > 0 ? mean[l] / sum_layers : 0.0);
        for (int i = 0; i < K; i++) fprintf(f, ",%.8g", kl[(size_t)l * K + i]);
        fprintf(f, "\n");
    }
    if (an_close(f, cpath)) {
        f = NULL;
        goto done_mean;
    }
    f = NULL;
    if (!(f = an_open(a, "layers.json", path, sizeof path))) goto done_mean;
    fprintf(f, "{\"method\":");
    cli_json_str(f, sp.name);
    fprintf(f, ",\"tokens\":%d,\"positions\":[", o->ctx);
    for (int i = 0; i < K; i++) fprintf(f, "%s%d", i ? "," : "", pos[i]);
    fprintf(f, "],\"splice_check_max_kld\":%.8g,\"all_layers_kld_mean\":%.8g,"
            "\"sum_single_layer_kld_mean\":%.8g,\"layers\":[", ref_max, all_mean, sum_layers);
    for (int l = 0; l < s.NL; l++)
        fprintf(f, "%s{\"layer\":%d,\"kld_mean\":%.8g,\"share\":%.6f}", l ? "," : "", l, mean[l],
                sum_layers > 0 ? mean[l] / sum_layers : 0.0);
    fprintf(f, "]}\n");
    if (an_close(f, path)) {
        f = NULL;
        goto done_mean;
    }
    f = NULL;

    printf("per-layer KL, %s, %d positions of %d tokens (teacher-forced, one step)\n", sp.name,
           K, o->ctx);
    printf("splice check (every layer from fp16): max KL %.3g (must be 0)\n", ref_max);
    printf("every layer quantized: mean KL %.5f; sum of single-layer KLs %.5f\n\n", all_mean,
           sum_layers);
    printf("%5s %11s %7s\n", "layer", "KL mean", "share");
    for (int l = 0; l < s.NL; l++)
        printf("%5d %11.6f %6.1f%%\n", l, mean[l],
               sum_layers > 0 ? 100.0 * mean[l] / sum_layers : 0.0);
    if (ref_max != 0.0)
        fprintf(stderr, "kittykv analyze layers: warning: the splice check is not exact\n");

    char gp[2048];
    snprintf(gp, sizeof gp,
             "set datafile separator ','\nset grid ytics\nset style fill solid 0.8\n"
             "set boxwidth 0.8\nset title 'share of KL(fp16 || %s) when only one layer is "
             "quantized'\nset xlabel 'layer'\nset ylabel 'share of the sum over layers'\n"
             "set xrange [-1:%d]\nset yrange [0:*]\n"
             "plot '%s' skip 1 using 1:3 with boxes notitle\n",
             sp.name, s.NL, cpath);
    if (an_path(path, sizeof path, a, "layers.png") == 0)
        rc = plot_png("analyze layers", path, 900, 500, gp);
    if (!rc) printf("\nwrote %s/layers.csv, layers.json, layers.png\n", o->out);
done_mean:
    free(mean);
done:
    if (f) fclose(f);
    free(s.fk);
    free(s.fv);
    free(s.qk);
    free(s.qv);
    free(s.tk);
    free(s.tv);
    free(s.logits);
    free(s.ref);
    free(s.lp);
    free(s.p);
    free(s.lq);
    free(pos);
    free(kl);
    kkv_cache_free(F);
    kkv_cache_free(Q);
    kkv_cache_free(Hc);
    return rc;
}
