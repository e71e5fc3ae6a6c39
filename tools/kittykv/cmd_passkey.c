/* kittykv passkey: long-context retrieval (kkv_passkey_run in kittykv-eval).
 * A 5-digit key is hidden at a given depth of a synthetic filler haystack; the
 * greedy answer must contain it. Accuracy per method x length x depth, with a
 * 95% Wilson interval per cell. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "kittykv_eval.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "opts.h"
#include "util.h"

#define CMD "passkey"
#define MAX_SPECS 32
#define MAX_LIST 32
typedef struct opts {
    const char *model, *methods;
    int         lengths[MAX_LIST], n_lengths;
    float       depths[MAX_LIST];
    int         n_depths, trials, threads, json;
    uint64_t    seed;
} opts;

static int parse_depths(opts *o, const char *s) {
    o->n_depths = 0;
    const char *p = s;
    while (*p) {
        size_t len = strcspn(p, ",");
        char buf[32];
        if (len == 0 || len >= sizeof buf || o->n_depths >= MAX_LIST) {
            fprintf(stderr, "kittykv " CMD ": bad list for --depths: '%s'\n", s);
            return -1;
        }
        memcpy(buf, p, len);
        buf[len] = 0;
        if (cli_float(&o->depths[o->n_depths++], buf, 0.0, 1.0, CMD, "--depths")) return -1;
        p += len;
        if (*p == ',') p++;
    }
    if (!o->n_depths) fprintf(stderr, "kittykv " CMD ": empty --depths\n");
    return o->n_depths ? 0 : -1;
}

static int parse(opts *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->trials = 3;
    o->seed = 1;
    static const int dl[] = {1024, 2048, 4096, 8192};
    static const float dd[] = {0.1f, 0.5f, 0.9f};
    o->n_lengths = 4;
    memcpy(o->lengths, dl, sizeof dl);
    o->n_depths = 3;
    memcpy(o->depths, dd, sizeof dd);
    const char *lengths = NULL, *depths = NULL;
    const opt_def defs[] = {
        {'m', "model", OPT_STRING, 0, 0, &o->model, NULL, "MODEL",
         "GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf or $KKV_MODEL)"},
        {0, "lengths", OPT_LIST, 0, 0, &lengths, NULL, "LIST",
         "prompt lengths in tokens, 64..1048576 (default 1024,2048,4096,8192)"},
        {0, "depths", OPT_LIST, 0, 0, &depths, NULL, "LIST",
         "needle depths in [0, 1] (default 0.1,0.5,0.9)"},
        {0, "kv|methods", OPT_LIST, 0, 0, &o->methods, NULL, "LIST",
         "method specs as in `kittykv eval --help` (default: all ten)"},
        {0, "trials", OPT_INT, 1, 1000, &o->trials, NULL, "K",
         "keys tried per (method, length, depth) (default 3)"},
        {'s', "seed", OPT_U64, 0, 2147483647, &o->seed, NULL, "S", "seed of the keys (default 1)"},
        {'t', "threads", OPT_INT, 1, CLI_MAX_THREADS, &o->threads, NULL, "N",
         "threads, 1..256 (default: all cores)"},
        {0, "json", OPT_FLAG, 0, 0, &o->json, NULL, NULL,
         "also print one JSON object on the last line of stdout"},
    };
    char epilog[1024];
    const char *FILLER, *NEEDLE;
    kkv_passkey_texts(&FILLER, &NEEDLE);
    snprintf(epilog, sizeof epilog,
             "The haystack repeats \"%s\"; the needle\n"
             "\"%s\" sits after the given share of it,\n"
             "inside SmolLM2's ChatML template, and the assistant turn starts with\n"
             "\"The pass key is\". A trial passes when the greedy answer (at most %d tokens,\n"
             "stopping at end of turn) contains the 5-digit key. Every method sees exactly the\n"
             "same prompts.\n", FILLER, NEEDLE, KKV_PASSKEY_ANSWER_TOKENS);
    int rc = opts_run(CMD, "[-m MODEL] [--lengths L1,L2..] [--depths D1,D2..] [--kv LIST] "
                      "[--trials K] [-s S] [-t T] [--json]", defs, OPTS_N(defs), epilog,
                      argc, argv);
    if (rc) return rc;
    if (lengths) {
        o->n_lengths = cli_int_list(o->lengths, MAX_LIST, lengths, CMD, "--lengths");
        if (o->n_lengths < 0) return 2;
        for (int k = 0; k < o->n_lengths; k++)
            if (o->lengths[k] < 64 || o->lengths[k] > (1 << 20)) {
                fprintf(stderr, "kittykv " CMD ": --lengths: %d is not in 64..1048576\n",
                        o->lengths[k]);
                return 2;
            }
    }
    if (depths && parse_depths(o, depths)) return 2;
    if (!o->model) o->model = cli_default_model();
    return 0;
}

static void print_table(const opts *o, const cli_spec *specs, int n_specs,
                        const kkv_passkey_cell *cells) {
    printf("passkey retrieval: accuracy over %d trial%s per cell (greedy, %d tokens)\n\n",
           o->trials, o->trials == 1 ? "" : "s", KKV_PASSKEY_ANSWER_TOKENS);
    printf("%-24s %7s", "method", "length");
    for (int d = 0; d < o->n_depths; d++) printf("  d=%-5.2f", (double)o->depths[d]);
    printf("  %6s\n", "mean");
    for (int s = 0; s < n_specs; s++) {
        for (int l = 0; l < o->n_lengths; l++) {
            const kkv_passkey_cell *row = cells + ((size_t)s * o->n_lengths + l) * o->n_depths;
            int tot = 0;
            printf("%-24s %7d", specs[s].name, o->lengths[l]);
            for (int d = 0; d < o->n_depths; d++) {
                printf("  %7.2f", row[d].accuracy);
                tot += row[d].correct;
            }
            printf("  %6.2f\n", (double)tot / (o->trials * o->n_depths));
        }
    }
    if (o->trials > 1)
        printf("\n95%% Wilson intervals per cell are in --json (ci_lo, ci_hi); with %d trials a "
               "cell of 1.00 still has ci_lo %.2f\n", o->trials,
               (double)o->trials / (o->trials + 3.8415));
    fflush(stdout);
}

static void print_json(const opts *o, const kkv_model_info *info, const cli_spec *specs,
                       int n_specs, const kkv_passkey_cell *cells) {
    printf("{\"model\":");
    cli_json_str(stdout, info->name[0] ? info->name : o->model);
    printf(",\"trials\":%d,\"seed\":%llu,\"answer_tokens\":%d,\"results\":[", o->trials,
           (unsigned long long)o->seed, KKV_PASSKEY_ANSWER_TOKENS);
    int first = 1;
    for (int s = 0; s < n_specs; s++)
        for (int l = 0; l < o->n_lengths; l++)
            for (int d = 0; d < o->n_depths; d++) {
                const kkv_passkey_cell *c = &cells[((size_t)s * o->n_lengths + l) * o->n_depths + d];
                printf("%s{\"method\":", first ? "" : ",");
                first = 0;
                cli_json_str(stdout, specs[s].name);
                printf(",\"length\":%d,\"depth\":%g,\"prompt_tokens\":%d,\"correct\":%d,"
                       "\"trials\":%d,\"accuracy\":%.17g,\"ci_lo\":%.6f,\"ci_hi\":%.6f,"
                       "\"keys\":[",
                       o->lengths[l], (double)o->depths[d], c->tokens, c->correct, c->trials,
                       c->accuracy, c->ci_lo, c->ci_hi);
                for (int t = 0; t < c->trials; t++) printf("%s%d", t ? "," : "", c->keys[t]);
                printf("],\"answers\":[");
                for (int t = 0; t < c->trials; t++) {
                    if (t) putchar(',');
                    cli_json_str(stdout, c->answers[t]);
                }
                printf("]}");
            }
    printf("]}\n");
    fflush(stdout);
}

int cmd_passkey(int argc, char **argv) {
    opts o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    cli_spec specs[MAX_SPECS];
    const char *names[MAX_SPECS];
    int n_specs = cli_spec_list_or_all(specs, MAX_SPECS, o.methods, CMD);
    if (n_specs < 0) return 2;
    for (int s = 0; s < n_specs; s++) names[s] = specs[s].name;

    const size_t n_cells = (size_t)n_specs * o.n_lengths * o.n_depths;
    kkv_threadpool *tp = NULL; /* shared by the model and every cache */
    kkv_model *m = NULL;
    kkv_passkey_cell *cells = calloc(n_cells, sizeof *cells); /* [spec][length][depth] */
    rc = 1;
    if (!cells) {
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        return 1;
    }
    o.threads = cli_threads(o.threads, CMD);
    if (kkv_threadpool_create(&tp, o.threads) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        goto done;
    }
    if (cli_model_load(&m, o.model, tp, CMD)) goto done;
    kkv_model_info info;
    kkv_model_get_info(m, &info);
    if (info.n_ctx_train > 0) {
        int max_len = 0;
        for (int l = 0; l < o.n_lengths; l++) max_len = o.lengths[l] > max_len ? o.lengths[l] : max_len;
        if (max_len > info.n_ctx_train)
            fprintf(stderr, "kittykv " CMD ": warning: prompts of %d tokens exceed the model's "
                    "trained context (%d)\n", max_len, info.n_ctx_train);
    }
    kkv_passkey_config cfg = kkv_passkey_defaults();
    cfg.lengths = o.lengths;
    cfg.n_lengths = o.n_lengths;
    cfg.depths = o.depths;
    cfg.n_depths = o.n_depths;
    cfg.trials = o.trials;
    cfg.seed = o.seed;
    cfg.pool = tp;
    cfg.progress = cli_progress_cb;
    cfg.progress_user = (void *)"passkey";
    if (kkv_passkey_run(cells, m, &cfg, names, n_specs) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        goto done;
    }
    print_table(&o, specs, n_specs, cells);
    if (o.json) print_json(&o, &info, specs, n_specs, cells);
    rc = 0;
done:
    kkv_passkey_cells_free(cells, n_cells);
    free(cells);
    kkv_model_free(m);
    kkv_threadpool_free(tp);
    return rc;
}
