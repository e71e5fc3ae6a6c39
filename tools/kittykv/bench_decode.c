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
            "Defaults: --depth 0,4096,16384,32768  --methods fp16,kivi-k2v2,kitty,kitty-pro\n"
            "          -n 32 timed decode steps per method and depth  -t all cores  --kernel auto\n"
            "Default model: %s\n",
            cli_default_model());
}

typedef struct row {
    int    depth;
    double med_s, q1_s, q3_s, min_s, cpu_s, bits;
} row;

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
    if (bench_set_methods(&o, "fp16,kivi-k2v2,kitty,kitty-pro")) return 2;
    int rc = bench_parse(&o, argc, argv,
                         BO_MODEL | BO_DEPTH | BO_METHODS | BO_THREADS | BO_KERNEL | BO_N,
                         usage);
    if (rc) return rc < 0 ? 0 : rc;

    kkv_model *model;
    if (bench_load_model(&model, &o, 0)) return 1;
    kkv_model_info info;
    kkv_model_get_info(model, &info);
    bench_shape sh = bench_shape_of(model);
    const int M = o.n_methods, N = o.n, last_depth = o.list[o.n_list - 1];

    kkv_cache *caches[BENCH_MAX_METHODS] = {0};
    int seqs[BENCH_MAX_METHODS] = {0};
    bench_synth g;
    memset(&g, 0, sizeof g);
    float *logits = malloc((size_t)info.n_vocab * sizeof *logits);   /* [n_vocab] */
    double *times = malloc((size_t)M * (N + 1) * sizeof *times);      /* [M][N] wall s */
    double *cpu = malloc((size_t)M * (N + 1) * sizeof *cpu);          /* [M][N] CPU s */
    row *rows = malloc((size_t)o.n_list * M * sizeof *rows);         /* [depths][M] */
    kkv_kernel used = KKV_KERNEL_AUTO;
    rc = 0;
    if (!logits || !times || !cpu || !rows ||
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
        size_t pool = bench_pool_for(&sh, last_depth + (N + 1) * o.n_list, 1);
        kkv_cache_config cfg = kkv_model_cache_config(model, &o.methods[i], pool);
        cfg.n_threads = o.threads;
        cfg.max_seqs = 1;
        if (kkv_cache_create(&caches[i], &cfg) != KKV_OK ||
            kkv_cache_set_kernel(caches[i], o.kernel) != KKV_OK ||
            kkv_seq_add(caches[i], &seqs[i]) != KKV_OK)
            rc = bench_fail(&o, o.method_names[i]);
        else used = kkv_cache_get_kernel(caches[i]);
    }

    uint64_t trng = 12345;
    for (int d = 0; d < o.n_list && !rc; d++) {
        int depth = o.list[d];
        char label[48];
        snprintf(label, sizeof label, "synthetic context %d", depth);
        /* every cache holds the same tokens, so one fill serves all */
        if (kkv_seq_len(caches[0], seqs[0], 0) < depth &&
            bench_fill(caches, seqs, M, depth, &g, label) != KKV_OK) {
            rc = bench_fail(&o, "filling the caches");
            break;
        }
        /* one untimed warm-up step, then N timed steps, one per method in turn */
        double t_start = cli_now();
        for (int s = 0; s <= N && !rc; s++) {
            int32_t tok = (int32_t)(bench_rand(&trng) * 1e6f);
            tok = (int32_t)((uint32_t)tok % (uint32_t)info.n_vocab);
            for (int k = 0; k < M; k++) {
                int i = bench_order(s, k, M);
                double t0 = cli_now(), c0 = bench_cpu_now();
                if (kkv_model_forward(model, caches[i], logits, seqs[i], &tok, 1, 0) != KKV_OK) {
                    rc = bench_fail(&o, "decode");
                    break;
                }
                if (s > 0) {
                    times[(size_t)i * N + s - 1] = cli_now() - t0;
                    cpu[(size_t)i * N + s - 1] = bench_cpu_now() - c0;
                }
            }
            snprintf(label, sizeof label, "decode at %d", depth);
            cli_progress(label, s, N, cli_now() - t_start);
        }
        for (int i = 0; i < M && !rc; i++) {
            const double *t = times + (size_t)i * N;
            kkv_mem mem;
            kkv_seq_mem(caches[i], &mem, seqs[i]);
            rows[(size_t)d * M + i] = (row){depth, bench_median(t, N), bench_quantile(t, N, 0.25),
                                            bench_quantile(t, N, 0.75), bench_quantile(t, N, 0.0),
                                            bench_median(cpu + (size_t)i * N, N),
                                            mem.bits_per_element};
        }
    }

    if (!rc) {
        int fp16 = -1;
        for (int i = 0; i < M; i++)
            if (o.methods[i].fp16) fp16 = i;
        printf("kittykv bench decode: %s (%d layers), %d thread%s, attention kernel %s; "
               "context = synthetic K/V (prefill not timed), decode = real model\n",
               info.name[0] ? info.name : info.arch, info.n_layers, o.threads,
               o.threads > 1 ? "s" : "", kkv_kernel_name(used));
        printf("%-11s %7s %10s %10s %10s %10s %10s %8s %9s %8s\n", "method", "depth", "tok/s",
               "ms/token", "ms IQR", "ms best", "cpu ms", "bits/el", "vs fp16", "cpu vs");
        for (int d = 0; d < o.n_list; d++)
            for (int i = 0; i < M; i++) {
                const row *r = &rows[(size_t)d * M + i];
                printf("%-11s %7d %10.2f %10.2f %10.2f %10.2f %10.2f %8.3f ", o.method_names[i],
                       r->depth, 1.0 / r->med_s, r->med_s * 1e3, (r->q3_s - r->q1_s) * 1e3,
                       r->min_s * 1e3, r->cpu_s * 1e3, r->bits);
                if (fp16 >= 0)
                    printf("%8.2fx %7.2fx\n", rows[(size_t)d * M + fp16].med_s / r->med_s,
                           rows[(size_t)d * M + fp16].cpu_s / r->cpu_s);
                else printf("%9s %8s\n", "-", "-");
            }
        printf("(median of %d interleaved single-token steps per point after one warm-up; "
               "tok/s = 1 / median step; cpu ms: median CPU time of all threads)\n", N);
        if (o.json) {
            printf("{\"bench\":\"decode\",\"model\":");
            cli_json_str(stdout, info.name);
            printf(",\"threads\":%d,\"kernel\":", o.threads);
            cli_json_str(stdout, kkv_kernel_name(used));
            printf(",\"n\":%d,\"context\":\"synthetic\",\"rows\":[", N);
            for (int d = 0; d < o.n_list; d++)
                for (int i = 0; i < M; i++) {
                    const row *r = &rows[(size_t)d * M + i];
                    printf("%s{\"method\":", d || i ? "," : "");
                    cli_json_str(stdout, o.method_names[i]);
                    printf(",\"depth\":%d,\"tok_s\":", r->depth);
                    bench_json_num(stdout, 1.0 / r->med_s);
                    printf(",\"ms_per_token\":");
                    bench_json_num(stdout, r->med_s * 1e3);
                    printf(",\"ms_q1\":");
                    bench_json_num(stdout, r->q1_s * 1e3);
                    printf(",\"ms_q3\":");
                    bench_json_num(stdout, r->q3_s * 1e3);
                    printf(",\"cpu_ms_per_token\":");
                    bench_json_num(stdout, r->cpu_s * 1e3);
                    printf(",\"ms_min\":");
                    bench_json_num(stdout, r->min_s * 1e3);
                    printf(",\"bits_per_element\":");
                    bench_json_num(stdout, r->bits);
                    printf(",\"speedup_vs_fp16\":");
                    if (fp16 >= 0) bench_json_num(stdout, rows[(size_t)d * M + fp16].med_s / r->med_s);
                    else printf("null");
                    printf(",\"cpu_speedup_vs_fp16\":");
                    if (fp16 >= 0) bench_json_num(stdout, rows[(size_t)d * M + fp16].cpu_s / r->cpu_s);
                    else printf("null");
                    printf("}");
                }
            printf("]}\n");
        }
    }
    for (int i = 0; i < M; i++) kkv_cache_free(caches[i]);
    bench_synth_free(&g);
    free(logits);
    free(times);
    free(cpu);
    free(rows);
    kkv_model_free(model);
    return rc;
}
