/* kittykv bench attention: decode attention of one token over every layer of
 * the default model's shapes, per method and context length, against the
 * machine's read bandwidth measured in the same run (the roofline).
 *
 * Setup (not timed): one cache per method, filled with the same synthetic
 * post-RoPE-like keys/values through kkv_append + kkv_flush. Timed: the 30
 * kkv_attend calls of one token, repeated in rounds that visit every method
 * in a rotating order; the figure is the median. Bytes per token are the
 * stored bytes (kkv_seq_mem total), which is exactly what one token reads. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kittykv_cpu.h"
#include "util.h"

#define CMD "bench attention"
/* Timed rounds stop growing once a context's rounds took this long. */
#define ROUND_BUDGET_S 1.5

static void usage(FILE *f) {
    fprintf(f,
            "Decode attention of one token over all layers (the default model's shapes:\n"
            "read from -m MODEL when present, else 30 layers, 9 query / 3 KV heads, D 64)\n"
            "over a cache filled with synthetic keys/values to each context.\n"
            "Defaults: --ctx 1024,4096,16384,32768  --methods fp16,kivi-k2v2,kitty,kitty-pro\n"
            "          -t all cores (attention and read test)  --kernel auto  --reps 9  --bw-mb 256\n"
            "With --scaling (and -t above 1) every method also runs on a one-thread cache\n"
            "filled the same way, timed in the same interleaved rounds: the speed-up of\n"
            "-t threads over one is a ratio of medians measured side by side, printed beside\n"
            "the read test's bandwidth on -t threads over one (the ceiling where memory\n"
            "bounds the kernel).\n");
}

/* One token's attention over every layer. q: [L][n_q][D], out: [n_q][D]. */
static kkv_status attend_all(kkv_cache *c, int seq, const float *q, float *out,
                             const bench_shape *sh) {
    size_t qn = (size_t)sh->n_heads * sh->head_dim;
    for (int l = 0; l < sh->n_layers; l++) {
        kkv_status s = kkv_attend(c, out, seq, l, q + (size_t)l * qn, sh->n_heads);
        if (s != KKV_OK) return s;
    }
    return KKV_OK;
}

typedef struct row {
    int    method, ctx, reps;
    double med_s, q1_s, q3_s, min_s, cpu_s, bytes, bits;
} row;

/* Caches are [n_sets][n_methods]: set 0 runs on -t threads, set 1 (with
 * --scaling) on one thread. */
#define MAX_SETS 2

typedef struct state {
    kkv_cache *caches[MAX_SETS * BENCH_MAX_METHODS];
    int        seqs[MAX_SETS * BENCH_MAX_METHODS];
    float     *q, *out;
    double    *times; /* [n_sets * n_methods][MAX_REPS] wall seconds */
    double    *cpu;   /* [n_sets * n_methods][MAX_REPS] CPU seconds, all threads */
    row       *rows;  /* [n_list][n_sets * n_methods] */
    bench_synth g;
} state;

static void state_free(state *st, int n_caches) {
    for (int i = 0; i < n_caches; i++) kkv_cache_free(st->caches[i]);
    free(st->q);
    free(st->out);
    free(st->times);
    free(st->cpu);
    free(st->rows);
    bench_synth_free(&st->g);
}

#define MAX_REPS 400

/* Times every cache (M of them: n_sets * n_methods) at their current
 * context; fills rows[0..M). */
static int measure(const bench_opts *o, state *st, const bench_shape *sh, row *rows, int ctx,
                   int M) {
    double est = 0.0;
    for (int i = 0; i < M; i++) { /* warm-up, and a cost estimate */
        double t0 = cli_now();
        if (attend_all(st->caches[i], st->seqs[i], st->q, st->out, sh) != KKV_OK)
            return bench_fail(o, "attention");
        est += cli_now() - t0;
    }
    int reps = o->reps;
    if (est > 0 && reps < (int)(ROUND_BUDGET_S / est)) reps = (int)(ROUND_BUDGET_S / est);
    if (reps > MAX_REPS) reps = MAX_REPS;
    double t_start = cli_now();
    for (int r = 0; r < reps; r++) {
        for (int k = 0; k < M; k++) {
            int i = bench_order(r, k, M);
            double t0 = cli_now(), c0 = bench_cpu_now();
            if (attend_all(st->caches[i], st->seqs[i], st->q, st->out, sh) != KKV_OK)
                return bench_fail(o, "attention");
            st->times[(size_t)i * MAX_REPS + r] = cli_now() - t0;
            st->cpu[(size_t)i * MAX_REPS + r] = bench_cpu_now() - c0;
        }
        cli_progress("timing", r + 1, reps, cli_now() - t_start);
    }
    for (int i = 0; i < M; i++) {
        const double *t = st->times + (size_t)i * MAX_REPS;
        kkv_mem mem;
        if (kkv_seq_mem(st->caches[i], &mem, st->seqs[i]) != KKV_OK)
            return bench_fail(o, "memory");
        rows[i] = (row){i % o->n_methods, ctx, reps, bench_median(t, reps), bench_quantile(t, reps, 0.25),
                        bench_quantile(t, reps, 0.75), bench_quantile(t, reps, 0.0),
                        bench_median(st->cpu + (size_t)i * MAX_REPS, reps), (double)mem.total,
                        mem.bits_per_element};
    }
    return 0;
}

/* The --scaling table: each method's median on -t threads against its
 * one-thread twin, timed in the same interleaved rounds. */
static void print_scaling(const bench_opts *o, const state *st, int K, double bw, double bw1) {
    int M = o->n_methods;
    printf("\nthread scaling, same run (medians of the interleaved rounds):\n");
    printf("%-11s %7s %12s %12s %9s %11s %10s\n", "method", "ctx", "us 1 thread", "us threads",
           "speed-up", "per thread", "read bw x");
    for (int c = 0; c < o->n_list; c++)
        for (int i = 0; i < M; i++) {
            const row *a = &st->rows[(size_t)c * K + M + i], *b = &st->rows[(size_t)c * K + i];
            double sp = a->med_s / b->med_s;
            printf("%-11s %7d %12.1f %12.1f %8.2fx %10.0f%% %9.2fx\n", o->method_names[i], b->ctx,
                   a->med_s * 1e6, b->med_s * 1e6, sp, 100.0 * sp / o->threads, bw / bw1);
        }
    printf("(us threads: on %d threads; speed-up = us 1 thread / us threads; per thread = speed-up / %d; "
           "read bw x = read bandwidth on %d threads (%.2f GB/s) / on one (%.2f GB/s), the ceiling "
           "where memory bounds the kernel)\n", o->threads, o->threads, o->threads, bw, bw1);
}

static void json_scaling(const bench_opts *o, const state *st, int K) {
    int M = o->n_methods;
    printf(",\"scaling\":[");
    for (int c = 0; c < o->n_list; c++)
        for (int i = 0; i < M; i++) {
            const row *a = &st->rows[(size_t)c * K + M + i], *b = &st->rows[(size_t)c * K + i];
            printf("%s{\"method\":", c || i ? "," : "");
            cli_json_str(stdout, o->method_names[i]);
            printf(",\"ctx\":%d,\"us_one_thread\":", b->ctx);
            bench_json_num(stdout, a->med_s * 1e6);
            printf(",\"us_threads\":");
            bench_json_num(stdout, b->med_s * 1e6);
            printf(",\"cpu_us_one_thread\":");
            bench_json_num(stdout, a->cpu_s * 1e6);
            printf(",\"speedup\":");
            bench_json_num(stdout, a->med_s / b->med_s);
            printf("}");
        }
    printf("]");
}

int bench_attention(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.cmd = CMD;
    o.threads = kkv_cpu_count();
    o.reps = 9;
    o.bw_mb = 256;
    o.kernel = KKV_KERNEL_AUTO;
    int dflt[] = {1024, 4096, 16384, 32768};
    memcpy(o.list, dflt, sizeof dflt);
    o.n_list = 4;
    if (bench_set_methods(&o, "fp16,kivi-k2v2,kitty,kitty-pro")) return 2;
    int rc = bench_parse(&o, argc, argv,
                         BO_MODEL | BO_CTX | BO_METHODS | BO_THREADS | BO_KERNEL | BO_REPS |
                             BO_BW | BO_SCALING,
                         usage);
    if (rc) return rc < 0 ? 0 : rc;
    for (int i = 0; i < o.n_list; i++)
        if (o.list[i] < 1) {
            fprintf(stderr, "kittykv " CMD ": contexts must be >= 1\n");
            return 2;
        }

    kkv_model *model;
    if (bench_load_model(&model, &o, 1)) return 1;
    bench_shape sh = model ? bench_shape_of(model) : bench_default_shape();
    kkv_model_free(model);
    for (int i = 0; i < o.n_methods; i++)
        if (kkv_method_check(&o.methods[i], sh.head_dim) != KKV_OK)
            return bench_fail(&o, o.method_names[i]);

    /* The roofline first, while the caches do not yet hold memory. */
    int M = o.n_methods;
    int S = o.scaling && o.threads > 1 ? 2 : 1, K = S * M; /* cache sets; caches */
    fprintf(stderr, "measuring read bandwidth (%d MiB, %d threads%s)...\n", o.bw_mb, o.threads,
            S > 1 ? " and one" : "");
    double bw_small = -1.0, bw_small2 = -1.0; /* on 4 KiB pages */
    double bw = bench_read_bandwidth_pages((size_t)o.bw_mb << 20, o.threads, 5, &bw_small);
    double bw1 = S > 1 ? bench_read_bandwidth((size_t)o.bw_mb << 20, 1, 5) : bw;
    if (bw <= 0 || bw_small <= 0 || bw1 <= 0) {
        fprintf(stderr, "kittykv " CMD ": out of memory for the read test\n");
        return 1;
    }

    if (o.scaling && o.threads == 1)
        fprintf(stderr, "kittykv " CMD ": --scaling needs -t above 1; ignored\n");
    state st;
    memset(&st, 0, sizeof st);
    size_t qn = (size_t)sh.n_layers * sh.n_heads * sh.head_dim;
    st.q = malloc(qn * sizeof *st.q);
    st.out = malloc((size_t)sh.n_heads * sh.head_dim * sizeof *st.out);
    st.times = malloc((size_t)K * MAX_REPS * sizeof *st.times);
    st.cpu = malloc((size_t)K * MAX_REPS * sizeof *st.cpu);
    st.rows = malloc((size_t)o.n_list * K * sizeof *st.rows);
    if (!st.q || !st.out || !st.times || !st.cpu || !st.rows ||
        bench_synth_init(&st.g, sh.n_layers, sh.n_kv_heads, sh.head_dim, 42)) {
        state_free(&st, K);
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        return 1;
    }
    uint64_t qrng = 7;
    for (size_t i = 0; i < qn; i++) st.q[i] = bench_rand(&qrng);

    rc = 0;
    kkv_kernel used = KKV_KERNEL_AUTO;
    for (int i = 0; i < K && !rc; i++) {
        kkv_cache_config cfg = {.n_layers = sh.n_layers, .n_kv_heads = sh.n_kv_heads,
                                .head_dim = sh.head_dim,
                                .pool_bytes = bench_pool_for(&sh, o.list[o.n_list - 1], 1),
                                .max_seqs = 1, .n_threads = i < M ? o.threads : 1,
                                .method = o.methods[i % M]};
        if (kkv_cache_create(&st.caches[i], &cfg) != KKV_OK ||
            kkv_cache_set_kernel(st.caches[i], o.kernel) != KKV_OK ||
            kkv_seq_add(st.caches[i], &st.seqs[i]) != KKV_OK)
            rc = bench_fail(&o, o.method_names[i % M]);
        else used = kkv_cache_get_kernel(st.caches[i]);
    }
    for (int c = 0; c < o.n_list && !rc; c++) {
        char label[48];
        snprintf(label, sizeof label, "fill %d", o.list[c]);
        if (bench_fill(st.caches, st.seqs, K, o.list[c], &st.g, label) != KKV_OK) {
            rc = bench_fail(&o, "filling the caches");
            break;
        }
        rc = measure(&o, &st, &sh, st.rows + (size_t)c * K, o.list[c], K);
    }
    if (rc) {
        state_free(&st, K);
        return rc;
    }
    /* A second read test after the timings: the best of both is the roofline.
     * Each reads an array on 2 MiB pages (as the pool's slabs are,
     * core/bigmem.h) and one on 4 KiB pages, interleaved: the roofline is the
     * faster, so the page size the cache uses cannot flatter it. */
    double bw2 = bench_read_bandwidth_pages((size_t)o.bw_mb << 20, o.threads, 5, &bw_small2);
    double bw_huge = bw2 > bw ? bw2 : bw;
    if (bw_small2 > bw_small) bw_small = bw_small2;
    bw = bw_small > bw_huge ? bw_small : bw_huge;
    if (S > 1) {
        bw2 = bench_read_bandwidth((size_t)o.bw_mb << 20, 1, 5);
        if (bw2 > bw1) bw1 = bw2;
    }

    int fp16 = -1;
    for (int i = 0; i < M; i++)
        if (o.methods[i].fp16) fp16 = i;
    printf("kittykv bench attention: one decode token over %d layers (%d query / %d KV heads, "
           "head_dim %d%s), kernel %s, %d thread%s\n",
           sh.n_layers, sh.n_heads, sh.n_kv_heads, sh.head_dim,
           sh.from_model ? ", from the model" : ", default shapes", kkv_kernel_name(used),
           o.threads, o.threads > 1 ? "s" : "");
    printf("cpu: %s\n", kkv_cpu_name());
    printf("read bandwidth (sum over %d MiB, %d thread%s): %.2f GB/s, the best of 10 reads on 2 MiB "
           "pages (%.2f) and 10 on 4 KiB pages (%.2f), interleaved\n", o.bw_mb,
           o.threads, o.threads > 1 ? "s" : "", bw, bw_huge, bw_small);
    printf("%-11s %7s %11s %10s %10s %11s %8s %8s %9s %8s %8s\n", "method", "ctx", "us/token",
           "us best", "cpu us", "MB/token", "bits/el", "GB/s", "roofline", "vs fp16",
           "cpu vs");
    for (int c = 0; c < o.n_list; c++)
        for (int i = 0; i < M; i++) {
            const row *r = &st.rows[(size_t)c * K + i];
            double gbs = r->bytes / r->med_s * 1e-9;
            double sp = fp16 >= 0 ? st.rows[(size_t)c * K + fp16].med_s / r->med_s : 0.0;
            printf("%-11s %7d %11.1f %10.1f %10.1f %11.3f %8.3f %8.2f %8.1f%% ", o.method_names[i],
                   r->ctx, r->med_s * 1e6, r->min_s * 1e6, r->cpu_s * 1e6, r->bytes / 1e6,
                   r->bits, gbs, 100.0 * gbs / bw);
            if (fp16 >= 0)
                printf("%7.2fx %7.2fx\n", sp, st.rows[(size_t)c * K + fp16].cpu_s / r->cpu_s);
            else printf("%8s %8s\n", "-", "-");
        }
    printf("(us/token: median of >= %d interleaved repetitions, GB/s and ratios from it; "
           "us best: the fastest one; cpu us: median CPU time of all threads; bytes/token = stored bytes = bytes "
           "read; roofline = GB/s / read bandwidth; a cache that fits the last-level cache "
           "can exceed 100%%)\n", o.reps);
    if (S > 1) print_scaling(&o, &st, K, bw, bw1);
    if (o.json) {
        printf("{\"bench\":\"attention\",\"cpu\":");
        cli_json_str(stdout, kkv_cpu_name());
        printf(",\"kernel\":");
        cli_json_str(stdout, kkv_kernel_name(used));
        printf(",\"threads\":%d,\"n_layers\":%d,\"n_heads\":%d,\"n_kv_heads\":%d,"
               "\"head_dim\":%d,\"shapes_from_model\":%s,\"bandwidth_gbs\":",
               o.threads, sh.n_layers, sh.n_heads, sh.n_kv_heads, sh.head_dim,
               sh.from_model ? "true" : "false");
        bench_json_num(stdout, bw);
        printf(",\"bandwidth_2m_pages_gbs\":");
        bench_json_num(stdout, bw_huge);
        printf(",\"bandwidth_4k_pages_gbs\":");
        bench_json_num(stdout, bw_small);
        if (S > 1) {
            printf(",\"bandwidth_one_thread_gbs\":");
            bench_json_num(stdout, bw1);
        }
        printf(",\"rows\":[");
        for (int c = 0; c < o.n_list; c++)
            for (int i = 0; i < M; i++) {
                const row *r = &st.rows[(size_t)c * K + i];
                double gbs = r->bytes / r->med_s * 1e-9;
                printf("%s{\"method\":", c || i ? "," : "");
                cli_json_str(stdout, o.method_names[i]);
                printf(",\"ctx\":%d,\"us_per_token\":", r->ctx);
                bench_json_num(stdout, r->med_s * 1e6);
                printf(",\"us_q1\":");
                bench_json_num(stdout, r->q1_s * 1e6);
                printf(",\"us_q3\":");
                bench_json_num(stdout, r->q3_s * 1e6);
                printf(",\"cpu_us_per_token\":");
                bench_json_num(stdout, r->cpu_s * 1e6);
                printf(",\"us_min\":");
                bench_json_num(stdout, r->min_s * 1e6);
                printf(",\"reps\":%d,\"bytes_per_token\":%.0f,\"bits_per_element\":", r->reps,
                       r->bytes);
                bench_json_num(stdout, r->bits);
                printf(",\"gbs\":");
                bench_json_num(stdout, gbs);
                printf(",\"roofline_pct\":");
                bench_json_num(stdout, 100.0 * gbs / bw);
                printf(",\"speedup_vs_fp16\":");
                if (fp16 >= 0) bench_json_num(stdout, st.rows[(size_t)c * K + fp16].med_s / r->med_s);
                else printf("null");
                printf(",\"cpu_speedup_vs_fp16\":");
                if (fp16 >= 0) bench_json_num(stdout, st.rows[(size_t)c * K + fp16].cpu_s / r->cpu_s);
                else printf("null");
                printf("}");
            }
        printf("]");
        if (S > 1) json_scaling(&o, &st, K);
        printf("}\n");
    }
    state_free(&st, K);
    return 0;
}
