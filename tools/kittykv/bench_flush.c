/* kittykv bench flush: what quantizing pages costs, and whether it shows as
 * latency spikes every G tokens.
 *
 * Part 1, the primitive (no model needed): a cache of the model's shape gets
 * N synthetic tokens in decode order; every kkv_flush call is timed, and the
 * calls that actually wrote a page (the key or value page bytes grew) are
 * told apart from those that found nothing full.
 * Part 2, with the model: N real decode steps through kkv_model_forward from
 * an empty cache, each step timed. Steps whose token filled a Q-buffer (spec
 * section 6: a key page when len - S is a multiple of G, a value page when
 * len - S - R is) are the flush steps. Reported: p50/p99/max and p99/p50 of
 * the step latency, the flush steps' excess over the others, and the flush
 * share of decode time. The same run on an fp16 cache, interleaved step by
 * step, is the noise floor (fp16 "flushes" are plain copies). */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kittykv_cpu.h"
#include "util.h"

#define CMD "bench flush"

static void usage(FILE *f) {
    fprintf(f,
            "Cost of one page flush, its share of decode time, and per-token decode latency\n"
            "percentiles over a run that crosses many page boundaries.\n"
            "Defaults: --method kitty  -n 2048 tokens  -t all cores  --kernel auto;\n"
            "without a model (-m) only part 1 runs.\n"
            "Default model: %s\n",
            cli_default_model());
}

/* Quantized page bytes of a sequence, to see whether a flush wrote a page. */
static uint64_t page_bytes(const kkv_cache *c, int seq) {
    kkv_mem m;
    if (kkv_seq_mem(c, &m, seq) != KKV_OK) return 0;
    return m.key_lo + m.key_hi + m.value_codes;
}

/* Whether appending the token that made the layer `len` long filled a
 * Q-buffer, by the lifecycle of docs/FORMAT.md section 3 (fp16: S = R = 0). */
static int is_flush_len(const kkv_method *m, int len) {
    int S = m->fp16 ? 0 : m->sink, R = m->fp16 ? 0 : m->window, G = m->group;
    int key = len > S && (len - S) % G == 0;
    int val = len - S - R >= G && (len - S - R) % G == 0;
    return key || val;
}

typedef struct prim {
    int    n_page, n_none;
    double page_p50, page_p90, page_max, none_p50, total_s, per_token_s;
    double pages_per_call; /* key + value pages per flushing call, all heads */
} prim;

/* Part 1. */
static int run_primitive(const bench_opts *o, const bench_shape *sh, prim *out) {
    const kkv_method *m = &o->methods[0];
    kkv_cache_config cfg = {.n_layers = sh->n_layers, .n_kv_heads = sh->n_kv_heads,
                            .head_dim = sh->head_dim, .pool_bytes = bench_pool_for(sh, o->n, 1),
                            .max_seqs = 1, .n_threads = o->threads, .method = *m};
    kkv_cache *c = NULL;
    int seq, rc = 0;
    size_t calls = (size_t)o->n * sh->n_layers;
    double *tp = malloc(calls * sizeof *tp), *tn = malloc(calls * sizeof *tn); /* [calls] */
    bench_synth g;
    if (bench_synth_init(&g, sh->n_layers, sh->n_kv_heads, sh->head_dim, 42) || !tp || !tn) {
        free(tp);
        free(tn);
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        return 1;
    }
    if (kkv_cache_create(&c, &cfg) != KKV_OK || kkv_cache_set_kernel(c, o->kernel) != KKV_OK ||
        kkv_seq_add(c, &seq) != KKV_OK)
        rc = bench_fail(o, "cache");
    size_t hd = (size_t)sh->n_kv_heads * sh->head_dim;
    int np = 0, nn = 0;
    uint64_t pages_written = 0;
    double t_start = cli_now();
    for (int t = 0; t < o->n && !rc; t++) {
        bench_synth_token(&g, t);
        for (int l = 0; l < sh->n_layers && !rc; l++) {
            if (kkv_append(c, seq, l, g.k + l * hd, g.v + l * hd) != KKV_OK) {
                rc = bench_fail(o, "append");
                break;
            }
            uint64_t before = m->fp16 ? 0 : page_bytes(c, seq);
            double t0 = cli_now();
            kkv_status s = kkv_flush(c, seq, l);
            double dt = cli_now() - t0;
            if (s != KKV_OK) rc = bench_fail(o, "flush");
            int wrote = m->fp16 ? is_flush_len(m, t + 1) : page_bytes(c, seq) != before;
            if (wrote) tp[np++] = dt;
            else tn[nn++] = dt;
        }
        if (t % 64 == 63 || t + 1 == o->n) cli_progress("flush primitive", t + 1, o->n,
                                                       cli_now() - t_start);
    }
    if (!rc) {
        int S = m->fp16 ? 0 : m->sink, R = m->fp16 ? 0 : m->window;
        int kp = o->n > S ? (o->n - S) / m->group : 0;
        int vp = o->n - S - R >= m->group ? (o->n - S - R) / m->group : 0;
        pages_written = (uint64_t)(kp + vp) * sh->n_layers * sh->n_kv_heads;
        double tot = bench_sum(tp, np) + bench_sum(tn, nn);
        *out = (prim){np, nn, np ? bench_median(tp, np) : 0.0,
                      np ? bench_quantile(tp, np, 0.9) : 0.0, np ? bench_max(tp, np) : 0.0,
                      nn ? bench_median(tn, nn) : 0.0, tot, tot / o->n,
                      np ? (double)pages_written / np : 0.0};
    }
    kkv_cache_free(c);
    bench_synth_free(&g);
    free(tp);
    free(tn);
    return rc;
}

typedef struct lat {
    int    n, n_flush;
    double p50, p90, p99, max, mean, flush_p50, other_p50, share;
    double dp99, dmax; /* detrended: quantiles of t[i] / local median, over p50 */
} lat;

/* Median of the (up to) 8 nearest non-flush steps around step i: the local
 * baseline a flush step is compared with, so slow drifts of the shared
 * machine and the growing context cancel out. */
static double local_baseline(const double *t, const int *flush, int n, int i) {
    double near[8]; /* [<= 8] */
    int k = 0;
    for (int d = 1; d < n && k < 8; d++) {
        if (i - d >= 0 && !flush[i - d] && k < 8) near[k++] = t[i - d];
        if (i + d < n && !flush[i + d] && k < 8) near[k++] = t[i + d];
    }
    return k ? bench_median(near, k) : t[i];
}

/* Median of the steps within DETREND_W of step i, itself left out: the
 * context grows during the run (attention cost grows with it) and the shared
 * machine drifts, so spikes are measured against this local level. */
#define DETREND_W 16
static double local_level(const double *t, int n, int i) {
    double w[2 * DETREND_W]; /* [<= 2W] */
    int k = 0;
    for (int j = i - DETREND_W; j <= i + DETREND_W; j++)
        if (j >= 0 && j < n && j != i) w[k++] = t[j];
    return k ? bench_median(w, k) : t[i];
}

static lat latency_stats(const double *t, const int *flush, int n) {
    lat s;
    memset(&s, 0, sizeof s);
    double *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b); /* [n] */
    int na = 0, nb = 0;
    double excess = 0.0;
    for (int i = 0; a && b && i < n; i++) {
        if (flush[i]) {
            a[na++] = t[i];
            excess += t[i] - local_baseline(t, flush, n, i);
        } else {
            b[nb++] = t[i];
        }
    }
    s.n = n;
    s.n_flush = na;
    s.p50 = bench_median(t, n);
    s.p90 = bench_quantile(t, n, 0.9);
    s.p99 = bench_quantile(t, n, 0.99);
    s.max = bench_max(t, n);
    s.mean = bench_sum(t, n) / n;
    s.flush_p50 = na ? bench_median(a, na) : 0.0;
    s.other_p50 = nb ? bench_median(b, nb) : 0.0;
    /* what the flush steps took beyond their neighbours, over all the time */
    s.share = excess / bench_sum(t, n);
    for (int i = 0; a && i < n; i++) a[i] = t[i] / local_level(t, n, i);
    if (a) {
        double d50 = bench_median(a, n);
        s.dp99 = bench_quantile(a, n, 0.99) / d50;
        s.dmax = bench_max(a, n) / d50;
    }
    free(a);
    free(b);
    return s;
}

/* Part 2: decode o->n tokens on the method (and fp16 unless --no-baseline),
 * interleaved, timing each step. */
static int run_latency(const bench_opts *o, kkv_model *model, lat *out, lat *base,
                       lat *out_cpu, lat *base_cpu) {
    kkv_model_info info;
    kkv_model_get_info(model, &info);
    bench_shape sh = bench_shape_of(model);
    int M = o->baseline && !o->methods[0].fp16 ? 2 : 1;
    kkv_method ms[2] = {o->methods[0], {0}};
    if (M == 2) kkv_method_from_name(&ms[1], "fp16");
    kkv_cache *c[2] = {NULL, NULL};
    int seq[2] = {0, 0}, rc = 0, N = o->n;
    double *t = malloc((size_t)2 * N * sizeof *t); /* [2][N] wall seconds */
    double *cpu = malloc((size_t)2 * N * sizeof *cpu); /* [2][N] CPU seconds */
    int *fl = malloc((size_t)2 * N * sizeof *fl);  /* [2][N] */
    float *logits = malloc((size_t)info.n_vocab * sizeof *logits);
    if (!t || !cpu || !fl || !logits) {
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        rc = 1;
    }
    for (int i = 0; i < M && !rc; i++) {
        kkv_cache_config cfg = kkv_model_cache_config(model, &ms[i], bench_pool_for(&sh, N + 8, 1));
        cfg.n_threads = o->threads;
        cfg.max_seqs = 1;
        if (kkv_cache_create(&c[i], &cfg) != KKV_OK ||
            kkv_cache_set_kernel(c[i], o->kernel) != KKV_OK || kkv_seq_add(c[i], &seq[i]) != KKV_OK)
            rc = bench_fail(o, "cache");
    }
    uint64_t trng = 99;
    double t_start = cli_now();
    for (int s = 0; s < N && !rc; s++) {
        int32_t tok = (int32_t)((uint32_t)(int32_t)(bench_rand(&trng) * 1e6f) %
                                (uint32_t)info.n_vocab);
        for (int k = 0; k < M && !rc; k++) {
            int i = bench_order(s, k, M);
            double t0 = cli_now(), c0 = bench_cpu_now();
            if (kkv_model_forward(model, c[i], logits, seq[i], &tok, 1, 0) != KKV_OK)
                rc = bench_fail(o, "decode");
            t[(size_t)i * N + s] = cli_now() - t0;
            cpu[(size_t)i * N + s] = bench_cpu_now() - c0;
            fl[(size_t)i * N + s] = is_flush_len(&ms[i], s + 1);
        }
        if (s % 16 == 15 || s + 1 == N) cli_progress("decode", s + 1, N, cli_now() - t_start);
    }
    if (!rc) {
        *out = latency_stats(t, fl, N);
        *out_cpu = latency_stats(cpu, fl, N);
        if (M == 2) {
            *base = latency_stats(t + N, fl + N, N);
            *base_cpu = latency_stats(cpu + N, fl + N, N);
        }
    }
    for (int i = 0; i < M; i++) kkv_cache_free(c[i]);
    free(t);
    free(cpu);
    free(fl);
    free(logits);
    return rc;
}

static void print_lat(const char *name, const lat *s) {
    printf("%-11s %6d %6d %9.2f %9.2f %9.2f %9.2f %8.3f %8.3f %8.3f %10.2f %10.2f %8.2f%%\n",
           name, s->n, s->n_flush, s->p50 * 1e3, s->p90 * 1e3, s->p99 * 1e3, s->max * 1e3,
           s->p99 / s->p50, s->dp99, s->dmax, s->flush_p50 * 1e3, s->other_p50 * 1e3,
           100.0 * s->share);
}

static void json_lat(const lat *s) {
    printf("{\"n\":%d,\"flush_steps\":%d,\"p50_ms\":", s->n, s->n_flush);
    bench_json_num(stdout, s->p50 * 1e3);
    printf(",\"p90_ms\":");
    bench_json_num(stdout, s->p90 * 1e3);
    printf(",\"p99_ms\":");
    bench_json_num(stdout, s->p99 * 1e3);
    printf(",\"max_ms\":");
    bench_json_num(stdout, s->max * 1e3);
    printf(",\"mean_ms\":");
    bench_json_num(stdout, s->mean * 1e3);
    printf(",\"p99_over_p50\":");
    bench_json_num(stdout, s->p99 / s->p50);
    printf(",\"detrended_p99_over_p50\":");
    bench_json_num(stdout, s->dp99);
    printf(",\"detrended_max_over_p50\":");
    bench_json_num(stdout, s->dmax);
    printf(",\"flush_step_p50_ms\":");
    bench_json_num(stdout, s->flush_p50 * 1e3);
    printf(",\"other_step_p50_ms\":");
    bench_json_num(stdout, s->other_p50 * 1e3);
    printf(",\"flush_share_pct\":");
    bench_json_num(stdout, 100.0 * s->share);
    printf("}");
}

int bench_flush(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.cmd = CMD;
    o.threads = kkv_cpu_count();
    o.n = 2048;
    o.kernel = KKV_KERNEL_AUTO;
    o.baseline = 1;
    if (bench_set_methods(&o, "kitty")) return 2;
    int rc = bench_parse(&o, argc, argv,
                         BO_MODEL | BO_METHOD | BO_THREADS | BO_KERNEL | BO_N | BO_BASELINE,
                         usage);
    if (rc) return rc < 0 ? 0 : rc;
    kkv_model *model;
    if (bench_load_model(&model, &o, 1)) return 1;
    bench_shape sh = model ? bench_shape_of(model) : bench_default_shape();
    if (kkv_method_check(&o.methods[0], sh.head_dim) != KKV_OK) {
        kkv_model_free(model);
        return bench_fail(&o, o.method_names[0]);
    }
    prim p;
    memset(&p, 0, sizeof p);
    lat s, b, sc, bc;
    memset(&s, 0, sizeof s);
    memset(&b, 0, sizeof b);
    memset(&sc, 0, sizeof sc);
    memset(&bc, 0, sizeof bc);
    rc = run_primitive(&o, &sh, &p);
    int have_lat = model != NULL, have_base = have_lat && o.baseline && !o.methods[0].fp16;
    if (!rc && have_lat) rc = run_latency(&o, model, &s, &b, &sc, &bc);
    kkv_model_free(model);
    if (rc) return rc;

    /* flush share estimated from part 1: all flush time / mean decode step */
    double share_est = have_lat && s.mean > 0 ? p.per_token_s / s.mean : 0.0;
    printf("kittykv bench flush: method %s, %d tokens, %d layers x %d KV heads x D %d, "
           "%d thread%s\n", o.method_names[0], o.n, sh.n_layers, sh.n_kv_heads, sh.head_dim,
           o.threads, o.threads > 1 ? "s" : "");
    printf("\npart 1 -- kkv_flush per (token, layer), synthetic K/V:\n");
    printf("  calls that wrote pages: %d (%.1f pages each: key and/or value page of every "
           "head)\n", p.n_page, p.pages_per_call);
    printf("  page-writing call: p50 %.2f us, p90 %.2f us, max %.2f us; per page %.2f us\n",
           p.page_p50 * 1e6, p.page_p90 * 1e6, p.page_max * 1e6,
           p.pages_per_call > 0 ? p.page_p50 / p.pages_per_call * 1e6 : 0.0);
    printf("  other calls: %d, p50 %.3f us\n", p.n_none, p.none_p50 * 1e6);
    printf("  all flush time / token: %.2f us (one flushing step, all layers: %.1f us)\n",
           p.per_token_s * 1e6, p.page_p50 * sh.n_layers * 1e6);
    if (have_lat) {
        printf("\npart 2 -- real decode steps from an empty cache (ms):\n");
        printf("%-11s %6s %6s %9s %9s %9s %9s %8s %8s %8s %10s %10s %9s\n", "method", "steps",
               "flush", "p50", "p90", "p99", "max", "p99/p50", "dt p99", "dt max", "flush p50",
               "other p50", "share");
        print_lat(o.method_names[0], &s);
        if (have_base) print_lat("fp16", &b);
        char name[40];
        snprintf(name, sizeof name, "%s cpu", o.method_names[0]);
        print_lat(name, &sc);
        if (have_base) print_lat("fp16 cpu", &bc);
        printf("(rows 'cpu': the same steps in CPU time of all threads, which leaves out the "
               "time the shared machine gave to other jobs; dt p99 / dt max: detrended, each "
               "step over the median of its %d neighbours on each side, p99 and max over p50 "
               "of that ratio)\n", DETREND_W);
        printf("flush share of decode time: %.3f%% measured (flush steps' excess over their 8 "
               "nearest other steps, summed, / total; noisy), %.3f%% from part 1 (flush time "
               "per token / mean step)\n", 100.0 * s.share,
               100.0 * share_est);
    } else {
        printf("\n(no model: part 2, decode latency, skipped)\n");
    }
    if (o.json) {
        printf("{\"bench\":\"flush\",\"method\":");
        cli_json_str(stdout, o.method_names[0]);
        printf(",\"n\":%d,\"threads\":%d,\"primitive\":{\"page_calls\":%d,\"other_calls\":%d,"
               "\"pages_per_call\":", o.n, o.threads, p.n_page, p.n_none);
        bench_json_num(stdout, p.pages_per_call);
        printf(",\"page_call_us_p50\":");
        bench_json_num(stdout, p.page_p50 * 1e6);
        printf(",\"page_call_us_p90\":");
        bench_json_num(stdout, p.page_p90 * 1e6);
        printf(",\"page_call_us_max\":");
        bench_json_num(stdout, p.page_max * 1e6);
        printf(",\"per_page_us\":");
        bench_json_num(stdout, p.pages_per_call > 0 ? p.page_p50 / p.pages_per_call * 1e6 : 0);
        printf(",\"other_call_us_p50\":");
        bench_json_num(stdout, p.none_p50 * 1e6);
        printf(",\"flush_us_per_token\":");
        bench_json_num(stdout, p.per_token_s * 1e6);
        printf("},\"latency\":");
        if (have_lat) json_lat(&s);
        else printf("null");
        printf(",\"baseline_fp16\":");
        if (have_base) json_lat(&b);
        else printf("null");
        printf(",\"latency_cpu\":");
        if (have_lat) json_lat(&sc);
        else printf("null");
        printf(",\"baseline_fp16_cpu\":");
        if (have_base) json_lat(&bc);
        else printf("null");
        printf(",\"flush_share_pct\":");
        if (have_lat) bench_json_num(stdout, 100.0 * s.share);
        else printf("null");
        printf(",\"flush_share_est_pct\":");
        if (have_lat) bench_json_num(stdout, 100.0 * share_est);
        else printf("null");
        printf("}\n");
    }
    return 0;
}
