/* kittykv bench serve: serving at a fixed KV memory budget.
 *
 * For each method, a cache whose pool is exactly the budget takes sequences
 * one by one, each reserving ctx tokens (kkv_seq_add + kkv_seq_reserve),
 * until the pool says KKV_ERR_POOL_FULL: that count is the largest batch of
 * ctx-token sequences that fits -- counted, not estimated. Then that many
 * sequences (capped by --max-batch) get ctx - n synthetic tokens (see bench
 * decode: the prefill is not timed) and decode n steps together through
 * kkv_model_decode_batch, ending at exactly ctx tokens. Steps of all methods
 * interleave; aggregate tokens/s = batch / median step time.
 *
 * --shared-prefix P: one prefix sequence of P tokens is filled first (a
 * server's prefix-cache entry, counted against the budget), and every
 * sequence is a kkv_seq_fork of it reserving its ctx - P own tokens; the
 * ratio column then compares with fp16 *without* sharing, the plain count. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "kittykv_cpu.h"
#include "util.h"

#define CMD "bench serve"
#define MAX_SEQS_PROBE 65536

static void usage(FILE *f) {
    fprintf(f,
            "Largest number of concurrent CTX-token sequences that fit a KV budget, per\n"
            "method (counted by reserving them until the pool is full), and the aggregate\n"
            "decode tokens/s of that batch (kkv_model_decode_batch; synthetic context).\n"
            "Defaults: --kv-budget 1024 MiB  -c 4096 tokens per sequence\n"
            "          --methods fp16,kivi-k2v2,kitty,kitty-pro  -n 16 timed batch decode steps\n"
            "          --max-batch 64  -t all cores  --kernel auto  --shared-prefix 0\n"
            "Method specs such as kitty:eager=1 (eager value quantization) are taken.\n"
            "Default model: %s\n",
            cli_default_model());
}

typedef struct meth {
    kkv_cache *c;
    int       *seqs;    /* [fit] */
    int        fit;     /* sequences that fit */
    int        fit_plain; /* sequences that fit without a shared prefix */
    int        root;    /* the shared prefix sequence, or -1 */
    uint64_t   shared_bytes; /* of seq_bytes: pages shared with the prefix */
    int        batch;   /* measured batch, <= fit */
    uint64_t   seq_bytes; /* pool bytes one ctx-token sequence takes */
    double    *times;   /* [n] wall seconds */
    double    *cpu;     /* [n] CPU seconds, all threads */
    double     med_s, min_s, cpu_s;
} meth;

/* Fills m->fit by reserving ctx-token sequences until the pool is full: new
 * ones, or forks of m->root reserving the tokens beyond the prefix. */
static int count_fit(const bench_opts *o, meth *m) {
    m->seqs = malloc(MAX_SEQS_PROBE * sizeof *m->seqs);
    if (!m->seqs) return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
    for (;;) {
        int seq;
        kkv_status s = m->root >= 0 ? kkv_seq_fork(m->c, &seq, m->root) : kkv_seq_add(m->c, &seq);
        if (s == KKV_OK) {
            s = kkv_seq_reserve(m->c, seq, o->ctx - kkv_seq_len(m->c, seq, 0));
            if (s != KKV_OK) kkv_seq_free(m->c, seq);
        }
        if (s == KKV_ERR_POOL_FULL) break;
        if (s != KKV_OK) return bench_fail(o, "reserving sequences");
        if (m->fit == 0) {
            kkv_mem mem;
            kkv_seq_mem(m->c, &mem, seq);
            m->seq_bytes = mem.capacity;
            m->shared_bytes = mem.shared;
        }
        m->seqs[m->fit++] = seq;
        if (m->fit == MAX_SEQS_PROBE) break;
    }
    return 0;
}

/* The plain count (no sharing) on a throw-away cache of the same config. */
static int count_plain(const bench_opts *o, const kkv_cache_config *cfg, int *fit) {
    kkv_cache *c;
    if (kkv_cache_create(&c, cfg) != KKV_OK) return bench_fail(o, "cache");
    *fit = 0;
    for (;;) {
        int seq;
        kkv_status s = kkv_seq_add(c, &seq);
        if (s == KKV_OK) s = kkv_seq_reserve(c, seq, o->ctx);
        if (s != KKV_OK) break;
        if (++*fit == MAX_SEQS_PROBE) break;
    }
    kkv_cache_free(c);
    return 0;
}

int bench_serve(int argc, char **argv) {
    bench_opts o;
    memset(&o, 0, sizeof o);
    o.cmd = CMD;
    o.threads = kkv_cpu_count();
    o.n = 16;
    o.ctx = 4096;
    o.budget_mb = 1024;
    o.max_batch = 64;
    o.kernel = KKV_KERNEL_AUTO;
    if (bench_set_methods(&o, "fp16,kivi-k2v2,kitty,kitty-pro")) return 2;
    int rc = bench_parse(&o, argc, argv,
                         BO_MODEL | BO_CTX1 | BO_METHODS | BO_THREADS | BO_KERNEL | BO_N |
                             BO_BUDGET | BO_MAXBATCH | BO_PREFIX,
                         usage);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.shared_prefix && o.shared_prefix + o.n > o.ctx) {
        fprintf(stderr, "kittykv " CMD ": --shared-prefix %d plus -n %d exceed --ctx %d\n",
                o.shared_prefix, o.n, o.ctx);
        return 2;
    }
    if (o.n > o.ctx) {
        fprintf(stderr, "kittykv " CMD ": -n %d exceeds --ctx %d\n", o.n, o.ctx);
        return 2;
    }
    kkv_model *model;
    if (bench_load_model(&model, &o, 0)) return 1;
    kkv_model_info info;
    kkv_model_get_info(model, &info);
    bench_shape sh = bench_shape_of(model);
    const int M = o.n_methods, N = o.n;
    size_t budget = (size_t)(o.budget_mb * 1048576.0);

    meth ms[BENCH_MAX_METHODS];
    memset(ms, 0, sizeof ms);
    bench_synth g;
    memset(&g, 0, sizeof g);
    float *logits = NULL;
    int32_t *tokens = NULL;
    kkv_kernel used = KKV_KERNEL_AUTO;
    int max_b = 0;
    rc = bench_synth_init(&g, sh.n_layers, sh.n_kv_heads, sh.head_dim, 42);
    if (rc) fprintf(stderr, "kittykv " CMD ": out of memory\n");
    for (int i = 0; i < M && !rc; i++) {
        meth *m = &ms[i];
        if (kkv_method_check(&o.methods[i], sh.head_dim) != KKV_OK) {
            rc = bench_fail(&o, o.method_names[i]);
            break;
        }
        kkv_cache_config cfg = kkv_model_cache_config(model, &o.methods[i], budget);
        cfg.n_threads = o.threads;
        cfg.max_seqs = MAX_SEQS_PROBE;
        cfg.max_tokens = o.ctx;
        if (kkv_cache_create(&m->c, &cfg) != KKV_OK || kkv_cache_set_kernel(m->c, o.kernel)) {
            rc = bench_fail(&o, o.method_names[i]);
            break;
        }
        used = kkv_cache_get_kernel(m->c);
        m->root = -1;
        if ((rc = count_plain(&o, &cfg, &m->fit_plain))) break;
        if (o.shared_prefix) {
            /* the prefix: one sequence of P synthetic tokens, kept for the forks */
            kkv_cache *cs[1] = {m->c};
            char label[64];
            snprintf(label, sizeof label, "prefix %s", o.method_names[i]);
            if (kkv_seq_add(m->c, &m->root) != KKV_OK ||
                kkv_seq_reserve(m->c, m->root, o.shared_prefix) != KKV_OK ||
                bench_fill(cs, &m->root, 1, o.shared_prefix, &g, label) != KKV_OK) {
                rc = bench_fail(&o, "filling the shared prefix");
                break;
            }
        }
        if ((rc = count_fit(&o, m))) break;
        m->batch = m->fit < o.max_batch ? m->fit : o.max_batch;
        /* sequences beyond the measured batch go back to the pool */
        for (int s = m->batch; s < m->fit; s++) kkv_seq_free(m->c, m->seqs[s]);
        max_b = m->batch > max_b ? m->batch : max_b;
        m->times = malloc((size_t)N * sizeof *m->times);
        m->cpu = malloc((size_t)N * sizeof *m->cpu);
        if (!m->times || !m->cpu) {
            fprintf(stderr, "kittykv " CMD ": out of memory\n");
            rc = 1;
        }
    }
    /* fill every measured sequence with the same synthetic context */
    for (int i = 0; i < M && !rc; i++) {
        meth *m = &ms[i];
        if (m->batch == 0) continue;
        kkv_cache **cs = malloc((size_t)m->batch * sizeof *cs);
        if (!cs) {
            rc = 1;
            break;
        }
        for (int s = 0; s < m->batch; s++) cs[s] = m->c;
        char label[64];
        snprintf(label, sizeof label, "fill %s x%d", o.method_names[i], m->batch);
        if (bench_fill(cs, m->seqs, m->batch, o.ctx - N, &g, label) != KKV_OK)
            rc = bench_fail(&o, "filling the sequences");
        free(cs);
    }
    if (!rc) {
        logits = malloc((size_t)(max_b ? max_b : 1) * info.n_vocab * sizeof *logits);
        tokens = malloc((size_t)(max_b ? max_b : 1) * sizeof *tokens);
        if (!logits || !tokens) {
            fprintf(stderr, "kittykv " CMD ": out of memory\n");
            rc = 1;
        }
    }
    uint64_t trng = 777;
    double t_start = cli_now();
    for (int s = 0; s < N && !rc; s++) {
        for (int b = 0; b < max_b; b++)
            tokens[b] = (int32_t)((uint32_t)(int32_t)(bench_rand(&trng) * 1e6f) %
                                  (uint32_t)info.n_vocab);
        for (int k = 0; k < M && !rc; k++) {
            meth *m = &ms[bench_order(s, k, M)];
            if (m->batch == 0) continue;
            double t0 = cli_now(), c0 = bench_cpu_now();
            if (kkv_model_decode_batch(model, m->c, logits, m->seqs, tokens, m->batch) != KKV_OK)
                rc = bench_fail(&o, "batch decode");
            m->times[s] = cli_now() - t0;
            m->cpu[s] = bench_cpu_now() - c0;
        }
        cli_progress("batch decode", s + 1, N, cli_now() - t_start);
    }

    if (!rc) {
        int fp16 = -1;
        for (int i = 0; i < M; i++) {
            ms[i].med_s = ms[i].batch ? bench_median(ms[i].times, N) : 0.0;
            ms[i].min_s = ms[i].batch ? bench_quantile(ms[i].times, N, 0.0) : 0.0;
            ms[i].cpu_s = ms[i].batch ? bench_median(ms[i].cpu, N) : 0.0;
            if (o.methods[i].fp16) fp16 = i;
        }
        printf("kittykv bench serve: KV budget %.0f MiB, %d-token sequences, %s, %d thread%s, "
               "attention kernel %s; context synthetic, decode = kkv_model_decode_batch\n",
               o.budget_mb, o.ctx, info.name[0] ? info.name : info.arch, o.threads,
               o.threads > 1 ? "s" : "", kkv_kernel_name(used));
        if (o.shared_prefix)
            printf("every sequence forks one %d-token prefix and reserves %d tokens of its own; "
                   "MiB/seq = what a fork holds beyond the shared pages and sink; seqs/fp16 is against "
                   "fp16 without sharing (%d)\n", o.shared_prefix, o.ctx - o.shared_prefix,
                   fp16 >= 0 ? ms[fp16].fit_plain : 0);
        printf("%-16s %8s %9s %10s %6s %10s %10s %10s %9s %9s %9s\n", "method", "seqs fit", "no-share",
               "MiB/seq", "batch", "step ms", "cpu ms", "tok/s", "seqs/fp16", "tok/fp16",
               "cpu tok/");
        for (int i = 0; i < M; i++) {
            const meth *m = &ms[i];
            double tps = m->batch ? m->batch / m->med_s : 0.0;
            printf("%-16s %8d %9d %10.2f %5d%s %10.1f %10.1f %10.2f", o.method_names[i], m->fit,
                   m->fit_plain, (double)(m->seq_bytes - m->shared_bytes) / 1048576.0, m->batch, m->batch < m->fit ? "*" : " ",
                   m->med_s * 1e3, m->cpu_s * 1e3, tps);
            if (fp16 >= 0 && ms[fp16].fit && ms[fp16].batch && m->batch) {
                double tps16 = ms[fp16].batch / ms[fp16].med_s;
                double cpu16 = ms[fp16].batch / ms[fp16].cpu_s;
                printf(" %8.2fx %8.2fx %8.2fx\n", (double)m->fit / ms[fp16].fit_plain, tps / tps16,
                       m->batch / m->cpu_s / cpu16);
            } else {
                printf(" %9s %9s %9s\n", "-", "-", "-");
            }
        }
        printf("(seqs fit: counted by reserving %d tokens per sequence until KKV_ERR_POOL_FULL; "
               "MiB/seq includes the fp16 staging; * = batch capped by --max-batch %d; "
               "tok/s = batch / median of %d interleaved steps; cpu: median CPU time of all "
               "threads, and the tok/s ratio from it)\n", o.ctx, o.max_batch, N);
        if (o.json) {
            printf("{\"bench\":\"serve\",\"kv_budget_mb\":");
            bench_json_num(stdout, o.budget_mb);
            printf(",\"ctx\":%d,\"shared_prefix\":%d,\"n\":%d,\"threads\":%d,\"max_batch\":%d,"
                   "\"kernel\":", o.ctx, o.shared_prefix, N, o.threads, o.max_batch);
            cli_json_str(stdout, kkv_kernel_name(used));
            printf(",\"context\":\"synthetic\",\"rows\":[");
            for (int i = 0; i < M; i++) {
                const meth *m = &ms[i];
                double tps = m->batch ? m->batch / m->med_s : 0.0;
                printf("%s{\"method\":", i ? "," : "");
                cli_json_str(stdout, o.method_names[i]);
                printf(",\"max_seqs\":%d,\"max_seqs_unshared\":%d,\"bytes_per_seq\":%llu,"
                       "\"shared_bytes_per_seq\":%llu,\"batch\":%d,\"capped\":%s,"
                       "\"step_ms\":", m->fit, m->fit_plain, (unsigned long long)m->seq_bytes,
                       (unsigned long long)m->shared_bytes, m->batch,
                       m->batch < m->fit ? "true" : "false");
                bench_json_num(stdout, m->med_s * 1e3);
                printf(",\"step_cpu_ms\":");
                bench_json_num(stdout, m->cpu_s * 1e3);
                printf(",\"step_ms_min\":");
                bench_json_num(stdout, m->min_s * 1e3);
                printf(",\"tok_s\":");
                bench_json_num(stdout, tps);
                printf(",\"seqs_vs_fp16\":");
                if (fp16 >= 0 && ms[fp16].fit_plain)
                    bench_json_num(stdout, (double)m->fit / ms[fp16].fit_plain);
                else printf("null");
                printf(",\"tok_s_vs_fp16\":");
                if (fp16 >= 0 && ms[fp16].batch)
                    bench_json_num(stdout, tps / (ms[fp16].batch / ms[fp16].med_s));
                else printf("null");
                printf(",\"cpu_tok_s_vs_fp16\":");
                if (fp16 >= 0 && ms[fp16].batch && m->batch)
                    bench_json_num(stdout, (m->batch / m->cpu_s) / (ms[fp16].batch / ms[fp16].cpu_s));
                else printf("null");
                printf("}");
            }
            printf("]}\n");
        }
    }
    for (int i = 0; i < M; i++) {
        kkv_cache_free(ms[i].c);
        free(ms[i].seqs);
        free(ms[i].times);
        free(ms[i].cpu);
    }
    bench_synth_free(&g);
    free(logits);
    free(tokens);
    kkv_model_free(model);
    return rc;
}
