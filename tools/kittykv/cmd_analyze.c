/* kittykv analyze: the analyses behind the paper's figures and the gaps it
 * leaves open, each writing CSV + JSON + PNG files (cli/analyze_*.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "analyze.h"
#include "cmd.h"
#include "kittykv_eval.h"
#include "plot.h"
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
};
#define N_SUBS (int)(sizeof subs / sizeof subs[0])

static void usage(FILE *f) {
    fprintf(f, "usage: kittykv analyze SUBCOMMAND [options]\n\nsubcommands:\n");
    for (int i = 0; i < N_SUBS; i++) fprintf(f, "  %-12s %s\n", subs[i].name, subs[i].help);
    fprintf(f,
            "\noptions:\n"
            "  -m MODEL        GGUF file (default: %s)\n"
            "  -f TEXT         plain-text file (default: %s/data/handbook.txt)\n"
            "  --out DIR       output folder, created if missing (default: analysis)\n"
            "  --ctx N         tokens of the text (default 1024)\n"
            "  --layer L       layer for heatmap/sensitivity (default: the middle one)\n"
            "  --method SPEC   method for stability/layers (default kitty; specs as in\n"
            "                  `kittykv eval --help`)\n"
            "  --score-from P  ablation/layers: tokens before scoring starts (default 256)\n"
            "  --chunk C       ablation: tokens per forward call (default 64; results are\n"
            "                  bit-identical for every C, see `kittykv eval --help`)\n"
            "  --alphas LIST   ablation alphas (default 0,0.0625,0.125,0.25,0.5,1)\n"
            "  --selects LIST  ablation selections (default magnitude,variance,random,oracle;\n"
            "                  oracle ranks each layer's and KV head's channels by the\n"
            "                  sensitivity measure over the same --ctx tokens, fp16 cache)\n"
            "  --calib-from P  ablation: the oracle calibrates on tokens P..P+ctx-1\n"
            "                  (default 0: the scored text itself, an in-sample oracle)\n"
            "  --positions K   layers: scored positions, evenly spaced (default 8)\n"
            "  -t T            threads (default 0 = all cores)\n"
            "\nFiles (in DIR): <sub>.csv, <sub>.json and <sub>*.png (PNG through gnuplot).\n",
            cli_default_model(), KKV_SOURCE_DIR);
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
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : -1;
    }
    o->sub = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kittykv " CMD ": %s needs a value (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) o->text = v;
        else if (!strcmp(a, "--out")) o->out = v;
        else if (!strcmp(a, "--method")) o->method = v;
        else if (!strcmp(a, "--alphas")) o->alphas = v;
        else if (!strcmp(a, "--selects")) o->selects = v;
        else if (!strcmp(a, "--ctx")) {
            if (cli_int(&o->ctx, v, 2, 1 << 22, CMD, a)) return 2;
        } else if (!strcmp(a, "--layer")) {
            if (cli_int(&o->layer, v, 0, 4095, CMD, a)) return 2;
        } else if (!strcmp(a, "--score-from")) {
            if (cli_int(&o->score_from, v, 1, 1 << 22, CMD, a)) return 2;
        } else if (!strcmp(a, "--chunk")) {
            if (cli_int(&o->chunk, v, 1, 4096, CMD, a)) return 2;
        } else if (!strcmp(a, "--calib-from")) {
            if (cli_int(&o->calib_from, v, 0, 1 << 22, CMD, a)) return 2;
        } else if (!strcmp(a, "--positions")) {
            if (cli_int(&o->positions, v, 1, 4096, CMD, a)) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (cli_int(&o->threads, v, 0, 1024, CMD, a)) return 2;
        } else {
            fprintf(stderr, "kittykv " CMD ": unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o->model) o->model = cli_default_model();
    if (!o->text) o->text = KKV_SOURCE_DIR "/data/handbook.txt";
    if (!plot_path_ok(o->out)) {
        fprintf(stderr, "kittykv " CMD ": --out must not contain quotes or newlines\n");
        return 2;
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
    if (!s) {
        fprintf(stderr, "kittykv " CMD ": unknown subcommand '%s' (see --help)\n", a.o.sub);
        return 2;
    }
    if (mkdir(a.o.out, 0777) && errno != EEXIST) {
        fprintf(stderr, "kittykv " CMD ": cannot create '%s': %s\n", a.o.out, strerror(errno));
        return 1;
    }
    rc = 1;
    char err[512];
    if (kkv_model_load(&a.m, a.o.model, a.o.threads) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        goto done;
    }
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
        fprintf(stderr, "kittykv " CMD ": '%s' has %d tokens, fewer than --ctx %d\n", a.o.text,
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
    return rc;
}
