/* kittykv analyze: the analyses behind the paper's figures and the gaps it
 * leaves open, each writing CSV + JSON + PNG files (cli/analyze_*.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analyze.h"
#include "cmd.h"
#include "kittykv_eval.h"
#include "plot.h"
#include "opts.h"
#include "util.h"

#define CMD "analyze"

#ifndef KKV_SOURCE_DIR
#define KKV_SOURCE_DIR "."
#endif

typedef struct sub {
    const char *name;
    int (*run)(an_ctx *a);
    const char *help;
} sub;

static const sub subs[] = {
    {"heatmap", an_heatmap, "|key| per channel x token of one layer, every KV head (Fig. 2a)"},
    {"sensitivity", an_sensitivity,
     "attention-score MSE when only key channel j is 2-bit, per channel (Fig. 2b)"},
    {"ablation", an_ablation, "KL vs boost fraction alpha for each channel selection (Fig. 4)"},
    {"stability", an_stability, "Jaccard similarity of consecutive pages' boosted sets"},
    {"layers", an_layers, "each layer's share of the KL when only that layer is quantized"},
    {"pareto", an_pareto, "KL vs bits/element over a grid of methods, Pareto frontier marked"},
};
#define N_SUBS (int)(sizeof subs / sizeof subs[0])

static void subs_help(FILE *f) {
    fprintf(f, "usage: kittykv analyze SUBCOMMAND [options]   (kittykv analyze SUBCOMMAND "
            "--help)\n\nsubcommands:\n");
    for (int i = 0; i < N_SUBS; i++) fprintf(f, "  %-12s %s\n", subs[i].name, subs[i].help);
}

static int parse(an_opts *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->layer = -1;
    o->ctx = 1024;
    o->score_from = 256;
    o->chunk = 64;
    o->positions = 8;
    o->out = "analysis";
    o->method = "kitty";
    o->alphas = "0,0.0625,0.125,0.25,0.5,1";
    o->selects = "magnitude,variance,random,oracle";
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        subs_help(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : -1;
    }
    o->sub = argv[1];
    const sub *s = NULL;
    for (int i = 0; i < N_SUBS; i++)
        if (!strcmp(o->sub, subs[i].name)) s = &subs[i];
    if (!s) {
        fprintf(stderr, "kittykv " CMD ": unknown subcommand '%s' (see kittykv analyze --help)\n",
                o->sub);
        return 2;
    }
    const int is_pareto = !strcmp(s->name, "pareto");
    const opt_def defs[] = {
        {'m', "model", OPT_STRING, 0, 0, &o->model, NULL, "MODEL",
         "GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf or $KKV_MODEL)"},
        {'f', "file", OPT_STRING, 0, 0, &o->text, NULL, "TEXT",
         "plain-text file (default: data/handbook.txt)"},
        {'o', "out", OPT_STRING, 0, 0, &o->out, NULL, "DIR",
         "output folder, created if missing (default: analysis)"},
        {'c', "ctx-size|ctx", OPT_INT, 2, 1 << 22, &o->ctx, NULL, "N",
         "tokens of the text (default 1024)"},
        {0, "layer", OPT_INT, 0, 4095, &o->layer, NULL, "L",
         "layer for heatmap/sensitivity (default: the middle one)"},
        {0, "kv|method", is_pareto ? OPT_LIST : OPT_SPEC, 0, 0, &o->method, &o->kv_given,
         is_pareto ? "LIST" : "SPEC",
         is_pareto ? "pareto: comma-separated method specs instead of the default\n"
                     "grid (every named method plus alpha/vbits/group/sink steps)"
                   : "method for stability/layers (default kitty; specs as in\n"
                     "`kittykv eval --help`)"},
        {0, "score-from", OPT_INT, 1, 1 << 22, &o->score_from, NULL, "P",
         "ablation/layers/pareto: tokens before scoring starts (default 256)"},
        {0, "chunk", OPT_INT, 1, 4096, &o->chunk, NULL, "C",
         "ablation/pareto: tokens per forward call (default 64; results are\n"
         "bit-identical for every C, see `kittykv eval --help`)"},
        {0, "alphas", OPT_LIST, 0, 0, &o->alphas, NULL, "LIST",
         "ablation alphas (default 0,0.0625,0.125,0.25,0.5,1)"},
        {0, "selects", OPT_LIST, 0, 0, &o->selects, NULL, "LIST",
         "ablation selections (default magnitude,variance,random,oracle;\n"
         "oracle ranks each layer's and KV head's channels by the\n"
         "sensitivity measure over the same --ctx tokens, fp16 cache)"},
        {0, "calib-from", OPT_INT, 0, 1 << 22, &o->calib_from, NULL, "P",
         "ablation: the oracle calibrates on tokens P..P+ctx-1\n"
         "(default 0: the scored text itself, an in-sample oracle)"},
        {0, "positions", OPT_INT, 1, 4096, &o->positions, NULL, "K",
         "layers: scored positions, evenly spaced (default 8)"},
        {0, "points", OPT_STRING, 0, 0, &o->points, NULL, "FILE",
         "pareto: external points to plot and compare, a CSV of\n"
         "label,bits_per_element,kld_mean[,kld_p99[,top1[,ppl]]]"},
        {0, "from-eval", OPT_LIST, 0, 0, &o->from_eval, NULL, "FILES",
         "pareto: plot saved `kittykv eval --json` outputs (comma-separated,\n"
         "same text, --ctx and --score-from) instead of running; no model\n"
         "needed, their tokens and scoring apply"},
        {0, "json", OPT_FLAG, 0, 0, &o->json, NULL, NULL,
         "pareto: also print the JSON object on the last line of stdout"},
        {'t', "threads", OPT_INT, 1, CLI_MAX_THREADS, &o->threads, NULL, "N",
         "threads, 1..256 (default: all cores)"},
    };
    char cmd[64], synopsis[160];
    snprintf(cmd, sizeof cmd, CMD " %s", s->name);
    snprintf(synopsis, sizeof synopsis, "[options]\n\n%s", s->help);
    int rc = opts_run(cmd, synopsis, defs, OPTS_N(defs),
                      "Files (in DIR): <sub>.csv, <sub>.json and <sub>*.png (PNG through "
                      "gnuplot).\n", argc - 1, argv + 1);
    if (rc) return rc;
    if (!is_pareto && (o->points || o->from_eval || o->json)) {
        fprintf(stderr, "kittykv " CMD " %s: --points, --from-eval and --json are options of "
                "`analyze pareto`\n", s->name);
        return 2;
    }
    if (!o->model) o->model = cli_default_model();
    if (!o->text) o->text = KKV_SOURCE_DIR "/data/handbook.txt";
    if (!plot_path_ok(o->out)) {
        fprintf(stderr, "kittykv " CMD ": --out must not contain quotes or newlines\n");
        return 2;
    }
    return 0;
}

/* Makes sure the outputs can be written before anything is computed: --out
 * is (or becomes) a folder a file can be created in, and the fixed-name files
 * of subcommand name that already exist there are writable regular files. 0, or 1 after
 * printing why. */
static int check_outputs(const char *out, const char *name) {
    struct stat st;
    if (mkdir(out, 0777) && errno != EEXIST) {
        fprintf(stderr, "kittykv " CMD ": cannot create '%s': %s\n", out, strerror(errno));
        return 1;
    }
    if (stat(out, &st) || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kittykv " CMD ": --out '%s' is not a folder\n", out);
        return 1;
    }
    char path[4096];
    /* a real file creation: access() misses read-only mounts and ACLs */
    if (snprintf(path, sizeof path, "%s/.kittykv-write-test-XXXXXX", out) >= (int)sizeof path) {
        fprintf(stderr, "kittykv " CMD ": output path too long\n");
        return 1;
    }
    int fd = mkstemp(path);
    if (fd < 0) {
        fprintf(stderr, "kittykv " CMD ": cannot write in '%s': %s\n", out, strerror(errno));
        return 1;
    }
    close(fd);
    unlink(path);
    static const char *const ext[] = {".csv", ".json", ".png", "_layers.csv"};
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        snprintf(path, sizeof path, "%s/%s%s", out, name, ext[i]);
        if (stat(path, &st)) continue;
        if (!S_ISREG(st.st_mode) || access(path, W_OK)) {
            fprintf(stderr, "kittykv " CMD ": cannot write '%s': %s\n", path,
                    S_ISREG(st.st_mode) ? strerror(errno) : "not a regular file");
            return 1;
        }
    }
    return 0;
}

int an_path(char *buf, size_t cap, const an_ctx *a, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", a->o.out, name);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

FILE *an_open(const an_ctx *a, const char *name, char *path, size_t path_cap) {
    if (an_path(path, path_cap, a, name)) {
        fprintf(stderr, "kittykv " CMD ": output path too long\n");
        return NULL;
    }
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "kittykv " CMD ": cannot write '%s': %s\n", path, strerror(errno));
    return f;
}

int an_close(FILE *f, const char *path) {
    int bad = ferror(f);
    if (fclose(f) || bad) {
        fprintf(stderr, "kittykv " CMD ": error writing '%s'\n", path);
        return 1;
    }
    return 0;
}

int an_fail(const an_ctx *a, const char *what) {
    fprintf(stderr, "kittykv " CMD " %s: %s: %s\n", a->o.sub, what, kkv_last_error());
    return 1;
}

int an_fill(an_ctx *a, kkv_cache *c, int seq, int n) {
    double t0 = cli_now();
    const int step = 256; /* for the progress bar; results do not depend on it */
    for (int i = 0; i < n; i += step) {
        int k = n - i < step ? n - i : step;
        if (kkv_model_forward(a->m, c, NULL, seq, a->tokens + i, k, 0) != KKV_OK)
            return an_fail(a, "forward pass");
        cli_progress(a->o.sub, i + k, n, cli_now() - t0);
    }
    return 0;
}

int cmd_analyze(int argc, char **argv) {
    an_ctx a;
    memset(&a, 0, sizeof a);
    int rc = parse(&a.o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    const sub *s = NULL;
    for (int i = 0; i < N_SUBS; i++)
        if (!strcmp(a.o.sub, subs[i].name)) s = &subs[i];
    if (check_outputs(a.o.out, a.o.sub)) return 1;
    if (a.o.from_eval) return an_pareto_saved(&a);
    rc = 1;
    char err[512];
    a.o.threads = cli_threads(a.o.threads, CMD);
    if (kkv_threadpool_create(&a.tp, a.o.threads) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        goto done;
    }
    if (cli_model_load(&a.m, a.o.model, a.tp, CMD)) goto done;
    kkv_model_get_info(a.m, &a.info);
    if (a.o.layer < 0) a.o.layer = a.info.n_layers / 2;
    if (a.o.layer >= a.info.n_layers) {
        fprintf(stderr, "kittykv " CMD ": --layer %d: the model has %d layers\n", a.o.layer,
                a.info.n_layers);
        rc = 2;
        goto done;
    }
    if (kkv_eval_tokenize_file(&a.tokens, &a.n_tokens, a.m, a.o.text) != KKV_OK) {
        snprintf(err, sizeof err, "%s", kkv_last_error());
        fprintf(stderr, "kittykv " CMD ": %s\n", err);
        goto done;
    }
    if (a.n_tokens < a.o.ctx) {
        fprintf(stderr, "kittykv " CMD ": '%s' has %d tokens, fewer than --ctx-size %d\n", a.o.text,
                a.n_tokens, a.o.ctx);
        goto done;
    }
    if (a.n_tokens - a.o.ctx < a.o.calib_from) {
        fprintf(stderr, "kittykv " CMD ": '%s' has %d tokens, fewer than --calib-from %d + "
                "--ctx %d\n", a.o.text, a.n_tokens, a.o.calib_from, a.o.ctx);
        goto done;
    }
    rc = s->run(&a);
done:
    free(a.tokens);
    kkv_model_free(a.m);
    kkv_threadpool_free(a.tp);
    return rc;
}
