/* kittykv bench decode: end-to-end decode tokens/s of the real model per KV
 * method at several context depths.
 *
 * The context up to each depth is SYNTHETIC: post-RoPE-like keys/values are
 * appended straight into every layer of the cache (kkv_append + kkv_flush),
 * because a real prefill of 32K tokens would take far too long on this
 * machine; like llama-bench, that prefill is not timed anyway. The decode
 * steps themselves run the whole model through kkv_model_forward, one token
 * at a time, reading the cache as stored. Steps of all methods interleave
 * (one step each, rotating order) and the figure is the median step. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kittykv_cpu.h"
#include "util.h"

#define CMD "bench decode"

static void usage(FILE *f) {
    fprintf(f,
            "Decode tokens/s of the model per KV method at each context depth. The context\n"
            "is synthetic K/V appended to every layer (prefill is not timed); each decode\n"
            "step runs the real model through kkv_model_forward.\n"
            "With --batch B, a step decodes one token of each of B sequences at that depth\n"
            "in one kkv_model_decode_batch (aggregate tok/s = B / step, CPU tok/s = B / CPU\n"
            "time of the step); batch 1 is kkv_model_forward. One pool serves the model and\n"
            "every cache.\n"
            "Defaults: --depth 0,4096,16384,32768  --methods fp16,kivi-k2v2,kitty,kitty-pro\n"
            "          -n 32 timed decode steps per method and depth  -t all cores  --kernel auto\n"
            "          --batch 1\n"
            "With --scaling (and -t above 1) every step also runs once on one thread (model\n"
            "and cache switched to a one-thread pool for it), interleaved with the -t steps:\n"
            "the speed-up of -t threads over one is a ratio of medians measured side by side\n"
            "(each -t step starts by waking workers that slept through the one-thread step:\n"
            "~3%% against -t at depth 0 on a Zen 3). Beside it the read test's bandwidth on\n"
            "-t threads over one: what a step that only streamed memory could gain.\n"
            "MB/step: the weight matrices a step streams (kkv_model_decode_bytes) plus the\n"
            "stored K/V of the step's sequences; roofline: MB/step / median step over the\n"
            "read bandwidth of -t threads, measured before and after the steps (best, on\n"
            "2 MiB or 4 KiB pages).\n"
            "With --parts each -t step is also cut into the parts of the forward pass\n"
            "(kkv_model_profile: wall time of the caller; its clock reads, ~5 a layer, fall\n"
            "inside the timed steps); the table gives each part's mean ms per step and its\n"
            "share, per method and depth.\n"
            "Default model: %s\n",
            cli_default_model());
}

typedef struct row {
    int    depth, batch;
    double med_s, q1_s, q3_s, min_s, cpu_s, bits;
    double med1_s; /* --scaling: the median step on one thread */
    double bytes;  /* weights streamed + stored K/V of the step's sequences */
    double part_s[KKV_PART_COUNT]; /* --parts: mean seconds per step in each part */
} row;

/* Read bandwidth on o->threads threads into *bw and, with S > 1 (--scaling),
 * on one into *bw1. 1 when the test's array cannot be had. */
static int read_bw(double *bw, double *bw1, const bench_opts *o, int S) {
    *bw = bench_read_bandwidth((size_t)o->bw_mb << 20, o->threads, 5);
    *bw1 = S > 1 ? bench_read_bandwidth((size_t)o->bw_mb << 20, 1, 5) : *bw;
    return *bw > 0 && *bw1 > 0 ? 0 : 1;
}

/* One decode step of method cache c: B == 1 is kkv_model_forward. */
static kkv_status step(kkv_model *model, kkv_cache *c, float *logits, const int *seqs,
                       const int32_t *tok, int B) {
    return B == 1 ? kkv_model_forward(model, c, logits, seqs[0], tok, 1, 0)
                  : kkv_model_decode_batch(model, c, logits, seqs, tok, B);
}

/* Model and cache onto pool tp (both borrow it). */
static kkv_status use_pool(kkv_model *model, kkv_cache *c, kkv_threadpool *tp) {
    kkv_status st = kkv_model_set_threadpool(model, tp);
    return st == KKV_OK ? kkv_cache_set_threadpool(c, tp) : st;
}

/* The --scaling table and its JSON member. */
static void print_scaling(const bench_opts *o, const row *rows, int R, double bw, double bw1) {
    int M = o->n_methods;
    printf("\nthread scaling, same run (medians of the interleaved steps):\n");
    printf("%-11s %7s %5s %12s %12s %9s %11s %10s\n", "method", "depth", "batch", "ms 1 thread",
           "ms threads", "speed-up", "per thread", "read bw x");
    for (int k = 0; k < R; k++)
        for (int i = 0; i < M; i++) {
            const row *r = &rows[(size_t)k * M + i];
            double sp = r->med1_s / r->med_s;
            printf("%-11s %7d %5d %12.2f %12.2f %8.2fx %10.0f%% %9.2fx\n", o->method_names[i],
                   r->depth, r->batch, r->med1_s * 1e3, r->med_s * 1e3, sp,
                   100.0 * sp / o->threads, bw / bw1);
        }
    printf("(ms threads: on %d threads; speed-up = ms 1 thread / ms threads; read bw x = read "
           "bandwidth on %d threads (%.2f GB/s) / on one (%.2f GB/s), the ceiling of a step "
           "bound by memory)\n", o->threads, o->threads, bw, bw1);
}

static void json_scaling(const bench_opts *o, const row *rows, int R) {
    int M = o->n_methods;
    printf(",\"scaling\":[");
    for (int k = 0; k < R; k++)
        for (int i = 0; i < M; i++) {
            const row *r = &rows[(size_t)k * M + i];
            printf("%s{\"method\":", k || i ? "," : "");
            cli_json_str(stdout, o->method_names[i]);
            printf(",\"depth\":%d,\"batch\":%d,\"ms_one_thread\":", r->depth, r->batch);
            bench_json_num(stdout, r->med1_s * 1e3);
            printf(",\"ms_threads\":");
            bench_json_num(stdout, r->med_s * 1e3);
            printf(",\"speedup\":");
            bench_json_num(stdout, r->med1_s / r->med_s);
            printf("}");
        }
    printf("]");
}

/* The --parts table: mean ms per step in each part of the forward pass and
 * its share of their sum, per method and depth. */
static void print_parts(const bench_opts *o, const row *rows, int R) {
    printf("\nwhere a step goes (--parts: kkv_model_profile, mean ms per step on %d thread%s):\n",
           o->threads, o->threads > 1 ? "s" : "");
    printf("%-11s %7s %5s", "method", "depth", "batch");
    for (int p = 0; p < KKV_PART_COUNT; p++) printf(" %15s", kkv_model_part_name(p));
    printf("\n");
    for (int k = 0; k < R; k++)
        for (int i = 0; i < o->n_methods; i++) {
            const row *r = &rows[(size_t)k * o->n_methods + i];
            double sum = 0.0;
            for (int p = 0; p < KKV_PART_COUNT; p++) sum += r->part_s[p];
            printf("%-11s %7d %5d", o->method_names[i], r->depth, r->batch);
            for (int p = 0; p < KKV_PART_COUNT; p++)
                printf(" %7.3f (%4.1f%%)", r->part_s[p] * 1e3, sum > 0 ? 100.0 * r->part_s[p] / sum : 0.0);
            printf("\n");
        }
    printf("(qkv: norm, Q/K/V projections, RoPE; attention: the cache's append, attend and flush;\n"
           "out_proj: output projection and residual; ffn: norm, gate/up, activation, down,\n"
           "residual; head: output norm and vocabulary projection; other: embedding, checks,\n"
           "page reservation)\n");
}

static void json_parts(const bench_opts *o, const row *rows, int R) {
    printf(",\"parts\":[");
    for (int k = 0; k < R; k++)
        for (int i = 0; i < o->n_methods; i++) {
            const row *r = &rows[(size_t)k * o->n_methods + i];
            printf("%s{\"method\":", k || i ? "," : "");
            cli_json_str(stdout, o->method_names[i]);
            printf(",\"depth\":%d,\"batch\":%d", r->depth, r->batch);
            for (int p = 0; p < KKV_PART_COUNT; p++) {
                printf(",\"%s_ms\":", kkv_model_part_name(p));
                bench_json_num(stdout, r->part_s[p] * 1e3);
            }
            printf("}");
        }
    printf("]");
}

int bench_decode(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.cmd = CMD;
    o.threads = kkv_cpu_count();
    o.n = 32;
    o.kernel = KKV_KERNEL_AUTO;
    int dflt[] = {0, 4096, 16384, 32768};
    memcpy(o.list, dflt, sizeof dflt);
    o.n_list = 4;
    o.batch[0] = 1;
    o.n_batch = 1;
    o.bw_mb = 256;
    if (bench_set_methods(&o, "fp16,kivi-k2v2,kitty,kitty-pro")) return 2;
    int rc = bench_parse(&o, argc, argv,
                         BO_MODEL | BO_DEPTH | BO_METHODS | BO_THREADS | BO_KERNEL | BO_N |
                         BO_BATCH | BO_SCALING | BO_PARTS | BO_BW, usage);
    if (rc) return rc < 0 ? 0 : rc;
    const int NB = o.n_batch, BMAX = o.batch[NB - 1];
    const int S = o.scaling && o.threads > 1 ? 2 : 1; /* runs per step: -t threads, then one */
    if (o.scaling && o.threads == 1)
        fprintf(stderr, "kittykv " CMD ": --scaling needs -t above 1; ignored\n");

    /* One pool for the model and every cache, as `generate` and `serve` run:
     * a pool per cache meant idle workers polling beside the model's (three
     * or more threads wanting two cores at every attention call). */
    kkv_threadpool *tp = NULL, *tp1 = NULL; /* tp1: --scaling's one-thread pool */
    if (kkv_threadpool_create(&tp, o.threads) != KKV_OK ||
        (S > 1 && kkv_threadpool_create(&tp1, 1) != KKV_OK)) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        kkv_threadpool_free(tp);
        return 1;
    }
    kkv_model *model;
    bench_opts o1 = o;
    o1.threads = 1; /* the model starts no workers of its own either */
    if (bench_load_model(&model, &o1, 0) || kkv_model_set_threadpool(model, tp) != KKV_OK) {
        if (model) fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        kkv_model_free(model);
        kkv_threadpool_free(tp);
        kkv_threadpool_free(tp1);
        return 1;
    }
    kkv_model_info info;
    kkv_model_get_info(model, &info);
    const double wbytes = (double)kkv_model_decode_bytes(model);
    /* the roofline (and --scaling's ceiling) first, while the caches hold no memory */
    double bw = 0.0, bw1 = 0.0;
    fprintf(stderr, "measuring read bandwidth (%d MiB, %d thread%s%s)...\n", o.bw_mb, o.threads,
            o.threads > 1 ? "s" : "", S > 1 ? " and one" : "");
    if (read_bw(&bw, &bw1, &o, S)) {
        fprintf(stderr, "kittykv " CMD ": out of memory for the read test (%d MiB)\n", o.bw_mb);
        kkv_model_free(model);
        kkv_threadpool_free(tp);
        kkv_threadpool_free(tp1);
        return 1;
    }
    bench_shape sh = bench_shape_of(model);
    const int M = o.n_methods, N = o.n, last_depth = o.list[o.n_list - 1];

    kkv_cache *caches[BENCH_MAX_METHODS] = {0};
    int seqs[BENCH_MAX_METHODS] = {0};
    bench_synth g;
    memset(&g, 0, sizeof g);
    float *logits = malloc((size_t)BMAX * info.n_vocab * sizeof *logits); /* [BMAX][n_vocab] */
    double *times = malloc((size_t)NB * M * (N + 1) * sizeof *times); /* [NB][M][N] wall s */
    double *cpu = malloc((size_t)NB * M * (N + 1) * sizeof *cpu);     /* [NB][M][N] CPU s */
    double *times1 = malloc((size_t)NB * M * (N + 1) * sizeof *times1); /* [NB][M][N] one thread */
    double *parts = calloc((size_t)NB * M * KKV_PART_COUNT, sizeof *parts); /* [NB][M][parts] s, one depth */
    row *rows = malloc((size_t)o.n_list * NB * M * sizeof *rows);    /* [depths][NB][M] */
    int *bseqs = malloc((size_t)M * BMAX * sizeof *bseqs);           /* [M][BMAX] */
    int32_t *btok = malloc((size_t)BMAX * sizeof *btok);             /* [BMAX] */
    kkv_kernel used = KKV_KERNEL_AUTO;
    rc = 0;
    if (!logits || !times || !cpu || !times1 || !parts || !rows || !bseqs || !btok ||
        bench_synth_init(&g, sh.n_layers, sh.n_kv_heads, sh.head_dim, 42)) {
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        rc = 1;
    }
    for (int i = 0; i < M && !rc; i++) {
        if (kkv_method_check(&o.methods[i], sh.head_dim) != KKV_OK) {
            rc = bench_fail(&o, o.method_names[i]);
            break;
        }
        /* room for the deepest context plus every decode step of every depth */
        size_t pool = bench_pool_for(&sh, last_depth + S * (N + 1) * o.n_list * NB, BMAX);
        kkv_cache_config cfg = kkv_model_cache_config(model, &o.methods[i], pool);
        cfg.n_threads = 1; /* no workers of its own: it borrows tp */
        cfg.max_seqs = BMAX;
        if (kkv_cache_create(&caches[i], &cfg) != KKV_OK ||
            kkv_cache_set_threadpool(caches[i], tp) != KKV_OK ||
            kkv_cache_set_kernel(caches[i], o.kernel) != KKV_OK) {
            rc = bench_fail(&o, o.method_names[i]);
            break;
        }
        for (int b = 0; b < BMAX && !rc; b++)
            if (kkv_seq_add(caches[i], &bseqs[(size_t)i * BMAX + b]) != KKV_OK)
                rc = bench_fail(&o, o.method_names[i]);
        seqs[i] = bseqs[(size_t)i * BMAX];
        if (!rc) used = kkv_cache_get_kernel(caches[i]);
    }

    /* every sequence of every cache, for the synthetic fill */
    kkv_cache **fillc = malloc((size_t)M * BMAX * sizeof *fillc); /* [M * BMAX] */
    if (!fillc && !rc) {
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        rc = 1;
    }
    for (int i = 0; i < M && !rc; i++)
        for (int b = 0; b < BMAX; b++) fillc[(size_t)i * BMAX + b] = caches[i];
    uint64_t trng = 12345;
    for (int d = 0; d < o.n_list && !rc; d++) {
        int depth = o.list[d];
        char label[48];
        snprintf(label, sizeof label, "synthetic context %d", depth);
        /* every sequence holds the same tokens, so one fill serves all (sequences
         * past the first batches hold fewer decoded tokens: depths are nominal) */
        if (kkv_seq_len(caches[0], seqs[0], 0) < depth &&
            bench_fill(fillc, bseqs, M * BMAX, depth, &g, label) != KKV_OK) {
            rc = bench_fail(&o, "filling the caches");
            break;
        }
        /* one untimed warm-up step, then N timed steps: every batch size of
         * every method in turn */
        double t_start = cli_now();
        for (int s = 0; s <= N && !rc; s++) {
            for (int bi = 0; bi < NB && !rc; bi++) {
                const int B = o.batch[bi];
                for (int b = 0; b < B; b++) {
                    int32_t tok = (int32_t)(bench_rand(&trng) * 1e6f);
                    btok[b] = (int32_t)((uint32_t)tok % (uint32_t)info.n_vocab);
                }
                for (int k = 0; k < M; k++) {
                    int i = bench_order(s, k, M);
                    const int *sq = bseqs + (size_t)i * BMAX;
                    /* --parts: timed from zero for this step only */
                    kkv_status st = o.parts && s > 0 ? kkv_model_profile(model, 1) : KKV_OK;
                    double t0 = cli_now(), c0 = bench_cpu_now();
                    if (st == KKV_OK) st = step(model, caches[i], logits, sq, btok, B);
                    size_t at = ((size_t)bi * M + i) * N + (s > 0 ? s - 1 : 0); /* s 0: warm-up, not kept */
                    if (st == KKV_OK && s > 0) {
                        times[at] = cli_now() - t0;
                        cpu[at] = bench_cpu_now() - c0;
                    }
                    if (st == KKV_OK && o.parts && s > 0) {
                        double ps[KKV_PART_COUNT];
                        st = kkv_model_profile_get(model, ps, KKV_PART_COUNT, NULL);
                        if (st == KKV_OK) st = kkv_model_profile(model, 0);
                        for (int p = 0; st == KKV_OK && p < KKV_PART_COUNT; p++)
                            parts[((size_t)bi * M + i) * KKV_PART_COUNT + p] += ps[p];
                    }
                    if (st == KKV_OK && S > 1) { /* the same step on one thread */
                        st = use_pool(model, caches[i], tp1);
                        double t1 = cli_now();
                        if (st == KKV_OK) st = step(model, caches[i], logits, sq, btok, B);
                        if (st == KKV_OK && s > 0) times1[at] = cli_now() - t1;
                        if (st == KKV_OK) st = use_pool(model, caches[i], tp);
                    }
                    if (st != KKV_OK) {
                        rc = bench_fail(&o, "decode");
                        break;
                    }
                }
            }
            snprintf(label, sizeof label, "decode at %d", depth);
            cli_progress(label, s, N, cli_now() - t_start);
        }
        for (int bi = 0; bi < NB && !rc; bi++)
            for (int i = 0; i < M; i++) {
                const double *t = times + ((size_t)bi * M + i) * N;
                kkv_mem mem;
                kkv_seq_mem(caches[i], &mem, seqs[i]);
                double kv = 0.0; /* what the step's attention reads: its sequences' stored K/V */
                for (int b = 0; b < o.batch[bi]; b++) {
                    kkv_mem mb;
                    kkv_seq_mem(caches[i], &mb, bseqs[(size_t)i * BMAX + b]);
                    kv += (double)mb.total;
                }
                row *r = &rows[((size_t)d * NB + bi) * M + i];
                *r = (row){depth, o.batch[bi], bench_median(t, N), bench_quantile(t, N, 0.25),
                           bench_quantile(t, N, 0.75), bench_quantile(t, N, 0.0),
                           bench_median(cpu + ((size_t)bi * M + i) * N, N), mem.bits_per_element,
                           S > 1 ? bench_median(times1 + ((size_t)bi * M + i) * N, N) : 0.0,
                           wbytes + kv, {0}};
                double *ps = parts + ((size_t)bi * M + i) * KKV_PART_COUNT;
                for (int p = 0; p < KKV_PART_COUNT; p++) {
                    r->part_s[p] = ps[p] / N;
                    ps[p] = 0.0; /* for the next depth */
                }
            }
    }
    free(fillc);
    if (!rc) { /* a second read test after the steps: the best of both (the first stands if it fails) */
        double b2 = 0.0, b21 = 0.0;
        if (read_bw(&b2, &b21, &o, S) == 0) {
            if (b2 > bw) bw = b2;
            if (b21 > bw1) bw1 = b21;
        }
    }

    if (!rc) {
        int fp16 = -1;
        for (int i = 0; i < M; i++)
            if (o.methods[i].fp16) fp16 = i;
        const int R = o.n_list * NB; /* rows of (depth, batch), each with M methods */
        printf("kittykv bench decode: %s (%d layers), %d thread%s, attention kernel %s; "
               "context = synthetic K/V (prefill not timed), decode = real model\n",
               info.name[0] ? info.name : info.arch, info.n_layers, o.threads,
               o.threads > 1 ? "s" : "", kkv_kernel_name(used));
        printf("cpu: %s\n", kkv_cpu_name());
        printf("read bandwidth (sum over %d MiB, %d thread%s, best of 10 on 2 MiB and 10 on 4 KiB "
               "pages, interleaved): %.2f GB/s\n", o.bw_mb,
               o.threads, o.threads > 1 ? "s" : "", bw);
        printf("%-11s %7s %5s %10s %10s %10s %10s %10s %10s %8s %9s %9s %9s %8s\n", "method",
               "depth", "batch", "tok/s", "cpu tok/s", "ms/step", "ms IQR", "ms best", "cpu ms",
               "bits/el", "MB/step", "roofline", "vs fp16", "cpu vs");
        for (int k = 0; k < R; k++)
            for (int i = 0; i < M; i++) {
                const row *r = &rows[(size_t)k * M + i];
                printf("%-11s %7d %5d %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %8.3f %9.2f "
                       "%8.1f%% ",
                       o.method_names[i], r->depth, r->batch, r->batch / r->med_s,
                       r->batch / r->cpu_s, r->med_s * 1e3, (r->q3_s - r->q1_s) * 1e3,
                       r->min_s * 1e3, r->cpu_s * 1e3, r->bits, r->bytes / 1e6,
                       100.0 * r->bytes / r->med_s * 1e-9 / bw);
                if (fp16 >= 0)
                    printf("%8.2fx %7.2fx\n", rows[(size_t)k * M + fp16].med_s / r->med_s,
                           rows[(size_t)k * M + fp16].cpu_s / r->cpu_s);
                else printf("%9s %8s\n", "-", "-");
            }
        printf("(median of %d interleaved steps per point after one warm-up; a step decodes "
               "one token of each of `batch` sequences; tok/s = batch / median step; cpu tok/s "
               "= batch / median CPU time of the step, all threads; roofline = MB/step / ms/step "
               "over the read bandwidth)\n", N);
        if (S > 1) print_scaling(&o, rows, R, bw, bw1);
        if (o.parts) print_parts(&o, rows, R);
        if (o.json) {
            printf("{\"bench\":\"decode\",\"model\":");
            cli_json_str(stdout, info.name);
            printf(",\"cpu\":");
            cli_json_str(stdout, kkv_cpu_name());
            printf(",\"threads\":%d,\"kernel\":", o.threads);
            cli_json_str(stdout, kkv_kernel_name(used));
            printf(",\"n\":%d,\"context\":\"synthetic\",\"bandwidth_gbs\":", N);
            bench_json_num(stdout, bw);
            if (S > 1) {
                printf(",\"bandwidth_one_thread_gbs\":");
                bench_json_num(stdout, bw1);
            }
            printf(",\"weight_bytes_per_step\":%.0f", wbytes); /* exact: a count below 2^53 */
            printf(",\"rows\":[");
            for (int k = 0; k < R; k++)
                for (int i = 0; i < M; i++) {
                    const row *r = &rows[(size_t)k * M + i];
                    const row *f = fp16 >= 0 ? &rows[(size_t)k * M + fp16] : NULL;
                    printf("%s{\"method\":", k || i ? "," : "");
                    cli_json_str(stdout, o.method_names[i]);
                    printf(",\"depth\":%d,\"batch\":%d,\"tok_s\":", r->depth, r->batch);
                    bench_json_num(stdout, r->batch / r->med_s);
                    printf(",\"cpu_tok_s\":");
                    bench_json_num(stdout, r->batch / r->cpu_s);
                    printf(",\"ms_per_token\":");
                    bench_json_num(stdout, r->med_s * 1e3 / r->batch);
                    printf(",\"ms_per_step\":");
                    bench_json_num(stdout, r->med_s * 1e3);
                    printf(",\"ms_q1\":");
                    bench_json_num(stdout, r->q1_s * 1e3);
                    printf(",\"ms_q3\":");
                    bench_json_num(stdout, r->q3_s * 1e3);
                    printf(",\"cpu_ms_per_token\":");
                    bench_json_num(stdout, r->cpu_s * 1e3 / r->batch);
                    printf(",\"ms_min\":");
                    bench_json_num(stdout, r->min_s * 1e3);
                    printf(",\"bits_per_element\":");
                    bench_json_num(stdout, r->bits);
                    printf(",\"bytes_per_step\":%.0f", r->bytes);
                    printf(",\"roofline\":");
                    bench_json_num(stdout, r->bytes / r->med_s * 1e-9 / bw);
                    printf(",\"speedup_vs_fp16\":");
                    if (f) bench_json_num(stdout, f->med_s / r->med_s);
                    else printf("null");
                    printf(",\"cpu_speedup_vs_fp16\":");
                    if (f) bench_json_num(stdout, f->cpu_s / r->cpu_s);
                    else printf("null");
                    printf("}");
                }
            printf("]");
            if (S > 1) json_scaling(&o, rows, R);
            if (o.parts) json_parts(&o, rows, R);
            printf("}\n");
        }
    }
    for (int i = 0; i < M; i++) kkv_cache_free(caches[i]);
    bench_synth_free(&g);
    free(logits);
    free(times);
    free(cpu);
    free(times1);
    free(parts);
    free(rows);
    free(bseqs);
    free(btok);
    kkv_model_free(model);
    kkv_threadpool_free(tp); /* after everything that borrows it */
    kkv_threadpool_free(tp1);
    return rc;
}
