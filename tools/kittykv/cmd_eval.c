/* kittykv eval: perplexity, KL divergence from fp16 and top-1 agreement of
 * every KV cache method, all run in lock-step over the same tokens, every
 * scored token attending to the cache as stored. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "kittykv_eval.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "opts.h"
#include "util.h"

#define CMD "eval"
#define MAX_SPECS 64

#ifndef KKV_SOURCE_DIR
#define KKV_SOURCE_DIR "."
#endif

typedef struct opts {
    const char *model, *text, *methods;
    int         ctx, score_from, chunk, threads, json;
} opts;

static const char *const SYNOPSIS =
    "[-m MODEL] [-f TEXT] [-c N] [--score-from P] [--kv LIST] [--chunk C] [-t T] [--json]";
static const char *const EPILOG =
    "A method spec is a method name with optional ':key=value' overrides:\n"
    "  alpha=F  select=magnitude|variance|random|range  seed=N  sink=N  group=N\n"
    "  window=N vbits=2|4|8  kbits=2|8 (8-bit key pages: alpha 0)\n"
    "  eager=0|1 (values quantized as they leave the window)\n"
    "  beyond the paper (docs/FORMAT.md section 5):\n"
    "  pairs=0|1            boost whole RoPE pairs (the model's rope layout)\n"
    "  rot=none|hadamard|random   keys stored rotated, queries rotated alike\n"
    "  vrot=none|hadamard|random  values stored rotated, outputs rotated back\n"
    "  clip=0|1 vclip=0|1   key channel / value token ranges by least squares\n"
    "  budget=none|head|err a layer's boosted channels pooled over its KV heads\n"
    "  sink8=0|1            the sink stored as int8 rows (one fp16 scale each)\n"
    "  win8=0|1             fidelity study: the window read back as int8\n"
    "  (seed also seeds a random rotation)\n"
    "  e.g. kitty:alpha=0.5:select=random:seed=3, kitty:pairs=1:clip=1\n"
    "Options a method ignores are errors (fp16 takes only group).\n"
    "\nKL is KL(p_fp16 || p_method) in nats per position, computed in double over\n"
    "the whole vocabulary; p99 is the nearest-rank 99th percentile. +-95% is the\n"
    "half-width of the KL mean's 95% confidence interval: the scored positions cut\n"
    "into 32 runs of consecutive tokens, t(0.975, 31) x sd(run means) / sqrt(32).\n";

static int parse(opts *o, int argc, char **argv) {
    *o = (opts){.ctx = 4096, .score_from = 256, .chunk = 1};
    const opt_def defs[] = {
        {'m', "model", OPT_STRING, 0, 0, &o->model, NULL, "MODEL",
         "GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf or $KKV_MODEL)"},
        {'f', "file", OPT_STRING, 0, 0, &o->text, NULL, "TEXT",
         "plain-text file (default: data/handbook.txt)"},
        {'c', "ctx-size|ctx", OPT_INT, 2, 1 << 22, &o->ctx, NULL, "N",
         "tokens of the text to use (default 4096)"},
        {0, "score-from", OPT_INT, 1, 1 << 22, &o->score_from, NULL, "P",
         "tokens prefilled before scoring starts (default 256);\n"
         "the N-P predictions after them are scored"},
        {0, "kv|methods", OPT_LIST, 0, 0, &o->methods, NULL, "LIST",
         "comma-separated method specs (default: all ten). fp16\n"
         "always runs as the reference; the spec \"fp16\" reports it."},
        {0, "chunk", OPT_INT, 1, 4096, &o->chunk, NULL, "C",
         "tokens per forward call while scoring (default 1 = one\n"
         "decode step per token). Every token attends to the cache as\n"
         "stored whatever C is, and the logits are bit-identical for\n"
         "every C (the forward pass is chunking invariant); larger C\n"
         "only batches the matmuls and runs faster."},
        {'t', "threads", OPT_INT, 1, CLI_MAX_THREADS, &o->threads, NULL, "N",
         "threads, 1..256 (default: all cores)"},
        {0, "json", OPT_FLAG, 0, 0, &o->json, NULL, NULL,
         "also print one JSON object on the last line of stdout"},
    };
    int rc = opts_run(CMD, SYNOPSIS, defs, OPTS_N(defs), EPILOG, argc, argv);
    if (rc) return rc;
    if (o->score_from >= o->ctx) {
        fprintf(stderr, "kittykv " CMD ": --score-from (%d) must be below --ctx-size (%d)\n",
                o->score_from, o->ctx);
        return 2;
    }
    if (!o->model) o->model = cli_default_model();
    if (!o->text) o->text = KKV_SOURCE_DIR "/data/handbook.txt";
    return 0;
}

static void print_table(const cli_spec *specs, const kkv_eval_result *res, int n,
                        const kkv_eval_result *ref, int n_tokens, int score_from) {
    printf("tokens %d, scored %ld (positions %d..%d), fp16 perplexity %.4f\n\n", n_tokens,
           ref->scored, score_from, n_tokens - 1, ref->ppl);
    printf("%-28s %9s %8s %9s %8s %9s %9s %7s %7s %11s %8s\n", "method", "PPL", "dPPL%",
           "KLD mean", "+-95%", "KLD p99", "KLD max", "top-1", "bits", "KV bytes", "secs");
    for (int i = 0; i < n; i++) {
        const kkv_eval_result *r = &res[i];
        printf("%-28s %9.4f %+8.2f %9.5f %8.5f %9.5f %9.4f %7.4f %7.3f %11llu %8.1f\n", specs[i].name,
               r->ppl, r->dppl_pct, r->kld_mean, kkv_mean_ci95(r->kld, r->scored), r->kld_p99, r->kld_max, r->top1,
               r->mem.bits_per_element, (unsigned long long)r->mem.total, r->seconds);
    }
    printf("\n(+-95%%: half-width of the KLD mean's 95%% confidence interval for text like this,\n"
           "from the means of 32 runs of consecutive positions)\n");
    fflush(stdout);
}

static void print_json(const opts *o, const kkv_model_info *info, const cli_spec *specs,
                       const kkv_eval_result *res, int n, const kkv_eval_result *ref, int n_tokens) {
    printf("{\"model\":");
    cli_json_str(stdout, info->name[0] ? info->name : o->model);
    printf(",\"text\":");
    cli_json_str(stdout, o->text);
    printf(",\"tokens\":%d,\"score_from\":%d,\"scored\":%ld,\"chunk\":%d,\"fp16_ppl\":%.17g,"
           "\"methods\":[",
           n_tokens, o->score_from, ref->scored, o->chunk, ref->ppl);
    for (int i = 0; i < n; i++) {
        const kkv_eval_result *r = &res[i];
        printf("%s{\"name\":", i ? "," : "");
        cli_json_str(stdout, specs[i].name);
        /* the run keeps every method's per-position KL; NaN (null) for one position */
        double ci = kkv_mean_ci95(r->kld, r->scored);
        printf(",\"ppl\":%.17g,\"dppl_pct\":%.17g,\"kld_mean\":%.17g,\"kld_ci95\":", r->ppl, r->dppl_pct,
               r->kld_mean);
        if (isfinite(ci)) printf("%.17g", ci);
        else printf("null");
        printf(",\"kld_p99\":%.17g,"
               "\"kld_max\":%.17g,\"top1\":%.17g,\"bits_per_element\":%.17g,\"kv_bytes\":%llu,"
               "\"scored\":%ld,\"seconds\":%.3f}",
               r->kld_p99, r->kld_max, r->top1,
               r->mem.bits_per_element, (unsigned long long)r->mem.total, r->scored,
               r->seconds);
    }
    printf("]}\n");
    fflush(stdout);
}

int cmd_eval(int argc, char **argv) {
    opts o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;

    cli_spec specs[MAX_SPECS];
    int n_specs = cli_spec_list_or_all(specs, MAX_SPECS, o.methods, CMD);
    if (n_specs < 0) return 2;

    o.threads = cli_threads(o.threads, CMD);
    kkv_threadpool *tp = NULL; /* shared by the model and every method's cache */
    kkv_model *m = NULL;
    int32_t *tokens = NULL;
    kkv_eval_result res[MAX_SPECS], ref;
    memset(res, 0, sizeof res);
    rc = 1;
    if (kkv_threadpool_create(&tp, o.threads) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        goto done;
    }
    if (cli_model_load(&m, o.model, tp, CMD)) goto done;
    kkv_model_info info;
    kkv_model_get_info(m, &info);
    int n_tok;
    if (kkv_eval_tokenize_file(&tokens, &n_tok, m, o.text) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        goto done;
    }
    if (n_tok < o.ctx) {
        fprintf(stderr, "kittykv " CMD ": '%s' has %d tokens, fewer than --ctx-size %d\n", o.text,
                n_tok, o.ctx);
        goto done;
    }
    kkv_eval_config cfg = kkv_eval_defaults();
    cfg.n_tokens = o.ctx;
    cfg.score_from = o.score_from;
    cfg.chunk = o.chunk;
    cfg.pool = tp;
    cfg.keep_kld = 1; /* for the KLD mean's interval */
    if (cli_eval_run(res, &ref, m, tokens, &cfg, specs, n_specs, "eval", CMD)) goto done;
    print_table(specs, res, n_specs, &ref, o.ctx, o.score_from);
    if (o.json) print_json(&o, &info, specs, res, n_specs, &ref, o.ctx);
    rc = 0;
done:
    kkv_eval_results_free(res, n_specs);
    free(tokens);
    kkv_model_free(m);
    kkv_threadpool_free(tp);
    return rc;
}
