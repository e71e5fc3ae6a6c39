/* kittykv passkey: long-context retrieval. A 5-digit key is hidden at a given
 * depth of a synthetic filler haystack inside the model's chat template; the
 * greedy answer must contain it. Accuracy per method x length x depth. */
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
#define ANSWER_TOKENS 8
#define ANSWER_BYTES 256

static const char *const HEAD =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nThere is a pass key hidden inside a lot of irrelevant "
    "text. Find it and memorize it. I will quiz you about the pass key.\n";
static const char *const FILLER =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
    "again. ";
/* %d: the key, twice */
static const char *const NEEDLE = "The pass key is %d. Remember it. %d is the pass key. ";
static const char *const TAIL =
    "\nWhat is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is";

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
         "method specs as in `kittykv eval --help` (default: all eight)"},
        {0, "trials", OPT_INT, 1, 1000, &o->trials, NULL, "K",
         "keys tried per (method, length, depth) (default 3)"},
        {'s', "seed", OPT_U64, 0, 2147483647, &o->seed, NULL, "S", "seed of the keys (default 1)"},
        {'t', "threads", OPT_INT, 1, CLI_MAX_THREADS, &o->threads, NULL, "N",
         "threads, 1..256 (default: all cores)"},
        {0, "json", OPT_FLAG, 0, 0, &o->json, NULL, NULL,
         "also print one JSON object on the last line of stdout"},
    };
    char epilog[1024];
    snprintf(epilog, sizeof epilog,
             "The haystack repeats \"%s\"; the needle\n"
             "\"%s\" sits after the given share of it,\n"
             "inside SmolLM2's ChatML template, and the assistant turn starts with\n"
             "\"The pass key is\". A trial passes when the greedy answer (at most %d tokens,\n"
             "stopping at end of turn) contains the 5-digit key. Every method sees exactly the\n"
             "same prompts.\n", FILLER, NEEDLE, ANSWER_TOKENS);
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

/* One splitmix64 output for the state x (kkv_rng_next steps a copy). */
static uint64_t splitmix(uint64_t x) { return kkv_rng_next(&x); }

/* The key of one (trial, length, depth): 10000..99999, the same for every method. */
static int make_key(uint64_t seed, int trial, int li, int di) {
    uint64_t h = splitmix(splitmix(splitmix(seed) ^ (uint64_t)trial) ^ ((uint64_t)li << 32 |
                                                                      (uint64_t)di));
    return 10000 + (int)(h % 90000u);
}

static int count_tokens(const kkv_model *m, const char *text, int special) {
    int n = 0;
    kkv_status s = kkv_tokenize(m, NULL, 0, &n, text, strlen(text), 0, special);
    if (s != KKV_OK && s != KKV_ERR_INVALID_ARG) return -1;
    return n;
}

/* Token counts of the prompt's parts, measured once. */
typedef struct parts {
    int head, filler, needle, tail;
} parts;

/* Builds the prompt text for a target length: the haystack gets as many
 * filler units as fit, the needle after round(depth * units) of them.
 * Returns a malloc'd string, NULL when out of memory. */
static char *build_prompt(const parts *pt, int length, float depth, int key) {
    int room = length - pt->head - pt->needle - pt->tail;
    int units = room > 0 ? room / pt->filler : 0;
    int before = (int)((double)depth * units + 0.5);
    char needle[160];
    snprintf(needle, sizeof needle, NEEDLE, key, key);
    size_t cap = strlen(HEAD) + strlen(needle) + strlen(TAIL) + (size_t)units * strlen(FILLER) + 1;
    char *s = malloc(cap);
    if (!s) return NULL;
    char *p = s;
    p += sprintf(p, "%s", HEAD);
    for (int u = 0; u < units; u++) {
        if (u == before) p += sprintf(p, "%s", needle);
        p += sprintf(p, "%s", FILLER);
    }
    if (before >= units) p += sprintf(p, "%s", needle);
    /* the haystack ends with a space; the question starts a new line */
    if (p > s && p[-1] == ' ') p--;
    sprintf(p, "%s", TAIL);
    return s;
}

typedef struct cell {
    int  tokens;  /* prompt length actually built */
    int  correct;
    char (*answers)[ANSWER_BYTES]; /* [trials] */
} cell;

/* Runs one prompt through one method: prefill, then greedy up to
 * ANSWER_TOKENS tokens. answer gets the text (NUL-terminated). */
static int run_one(char *answer, kkv_model *m, kkv_cache *c, const kkv_model_info *info,
                   const int32_t *prompt, int n, float *logits, char *err, size_t errlen) {
    int seq;
    if (kkv_seq_add(c, &seq) != KKV_OK) {
        snprintf(err, errlen, "adding a sequence: %s", kkv_last_error());
        return 1;
    }
    int rc = 1;
    size_t len = 0;
    answer[0] = 0;
    if (kkv_model_forward(m, c, logits, seq, prompt, n, 0) != KKV_OK) {
        snprintf(err, errlen, "prefill: %s", kkv_last_error());
        goto done;
    }
    for (int g = 0; g < ANSWER_TOKENS; g++) {
        int32_t tok = 0;
        for (int v = 1; v < info->n_vocab; v++)
            if (logits[v] > logits[tok]) tok = v;
        if (tok == info->eos || tok == info->eot) break;
        char piece[64];
        size_t pn = 0;
        if (kkv_token_piece(m, piece, sizeof piece, &pn, tok) == KKV_OK &&
            len + pn < ANSWER_BYTES) {
            memcpy(answer + len, piece, pn);
            len += pn;
            answer[len] = 0;
        }
        if (g + 1 == ANSWER_TOKENS) break;
        if (kkv_model_forward(m, c, logits, seq, &tok, 1, 0) != KKV_OK) {
            snprintf(err, errlen, "decode: %s", kkv_last_error());
            goto done;
        }
    }
    rc = 0;
done:
    kkv_seq_free(c, seq);
    return rc;
}

static void print_table(const opts *o, const cli_spec *specs, int n_specs, cell *cells) {
    printf("passkey retrieval: accuracy over %d trial%s per cell (greedy, %d tokens)\n\n",
           o->trials, o->trials == 1 ? "" : "s", ANSWER_TOKENS);
    printf("%-24s %7s", "method", "length");
    for (int d = 0; d < o->n_depths; d++) printf("  d=%-5.2f", (double)o->depths[d]);
    printf("  %6s\n", "mean");
    for (int s = 0; s < n_specs; s++) {
        for (int l = 0; l < o->n_lengths; l++) {
            const cell *row = cells + ((size_t)s * o->n_lengths + l) * o->n_depths;
            int tot = 0;
            printf("%-24s %7d", specs[s].name, o->lengths[l]);
            for (int d = 0; d < o->n_depths; d++) {
                printf("  %7.2f", (double)row[d].correct / o->trials);
                tot += row[d].correct;
            }
            printf("  %6.2f\n", (double)tot / (o->trials * o->n_depths));
        }
    }
    fflush(stdout);
}

static void print_json(const opts *o, const kkv_model_info *info, const cli_spec *specs,
                       int n_specs, cell *cells, const int *keys) {
    printf("{\"model\":");
    cli_json_str(stdout, info->name[0] ? info->name : o->model);
    printf(",\"trials\":%d,\"seed\":%llu,\"answer_tokens\":%d,\"results\":[", o->trials,
           (unsigned long long)o->seed, ANSWER_TOKENS);
    int first = 1;
    for (int s = 0; s < n_specs; s++)
        for (int l = 0; l < o->n_lengths; l++)
            for (int d = 0; d < o->n_depths; d++) {
                size_t ci = ((size_t)s * o->n_lengths + l) * o->n_depths + d;
                const cell *c = &cells[ci];
                printf("%s{\"method\":", first ? "" : ",");
                first = 0;
                cli_json_str(stdout, specs[s].name);
                printf(",\"length\":%d,\"depth\":%g,\"prompt_tokens\":%d,\"correct\":%d,"
                       "\"trials\":%d,\"accuracy\":%.17g,\"keys\":[",
                       o->lengths[l], (double)o->depths[d], c->tokens, c->correct, o->trials,
                       (double)c->correct / o->trials);
                for (int t = 0; t < o->trials; t++)
                    printf("%s%d", t ? "," : "",
                           keys[((size_t)t * o->n_lengths + l) * o->n_depths + d]);
                printf("],\"answers\":[");
                for (int t = 0; t < o->trials; t++) {
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
    char err[512];
    cli_spec specs[MAX_SPECS];
    int n_specs = 0;
    if (o.methods) {
        n_specs = cli_spec_list(specs, MAX_SPECS, o.methods, err, sizeof err);
        if (n_specs < 0) {
            fprintf(stderr, "kittykv " CMD ": --kv: %s\n", err);
            return 2;
        }
        for (int s = 0; s < n_specs; s++)
            if (specs[s].method.select == KKV_SELECT_EXPLICIT) {
                fprintf(stderr, "kittykv " CMD ": --kv: select=oracle is for `kittykv "
                        "analyze ablation` only\n");
                return 2;
            }
    } else {
        for (const char *const *nm = kkv_method_names(); *nm; nm++)
            cli_spec_parse(&specs[n_specs++], *nm, err, sizeof err);
    }

    const size_t n_cells = (size_t)n_specs * o.n_lengths * o.n_depths;
    const size_t n_prompts = (size_t)o.trials * o.n_lengths * o.n_depths;
    kkv_threadpool *tp = NULL; /* shared by the model and every cache */
    kkv_model *m = NULL;
    kkv_cache *cache = NULL;
    float *logits = NULL;
    cell *cells = calloc(n_cells, sizeof *cells);
    int *keys = calloc(n_prompts, sizeof *keys);           /* [trial][length][depth] */
    int32_t **prompts = calloc(n_prompts, sizeof *prompts); /* [trial][length][depth] */
    int *plen = calloc(n_prompts, sizeof *plen);
    rc = 1;
    if (!cells || !keys || !prompts || !plen) goto oom;
    for (size_t i = 0; i < n_cells; i++) {
        cells[i].answers = calloc((size_t)o.trials, sizeof *cells[i].answers);
        if (!cells[i].answers) goto oom;
    }
    o.threads = cli_threads(o.threads, CMD);
    if (kkv_threadpool_create(&tp, o.threads) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        goto done;
    }
    if (cli_model_load(&m, o.model, tp, CMD)) goto done;
    kkv_model_info info;
    kkv_model_get_info(m, &info);
    logits = malloc((size_t)info.n_vocab * sizeof *logits);
    if (!logits) goto oom;

    char needle[160];
    snprintf(needle, sizeof needle, NEEDLE, 12345, 12345);
    /* A filler unit's marginal cost: inside the haystack it merges with the
     * space before it, so count two units minus one. */
    char two[512];
    snprintf(two, sizeof two, "%s%s", FILLER, FILLER);
    parts pt = {count_tokens(m, HEAD, 1), count_tokens(m, two, 0) - count_tokens(m, FILLER, 0),
                count_tokens(m, needle, 0), count_tokens(m, TAIL, 1)};
    if (pt.head < 0 || pt.filler <= 0 || pt.needle < 0 || pt.tail < 0) {
        fprintf(stderr, "kittykv " CMD ": tokenizing the template: %s\n", kkv_last_error());
        goto done;
    }
    /* Every prompt, tokenized once and shared by all methods. */
    int max_len = 0;
    for (int t = 0; t < o.trials; t++)
        for (int l = 0; l < o.n_lengths; l++)
            for (int d = 0; d < o.n_depths; d++) {
                size_t pi = ((size_t)t * o.n_lengths + l) * o.n_depths + d;
                keys[pi] = make_key(o.seed, t, l, d);
                char *text = build_prompt(&pt, o.lengths[l], o.depths[d], keys[pi]);
                if (!text) goto oom;
                int cap = o.lengths[l] * 2 + 64, n = 0;
                prompts[pi] = malloc((size_t)cap * sizeof **prompts);
                kkv_status s = prompts[pi] ? kkv_tokenize(m, prompts[pi], cap, &n, text,
                                                          strlen(text), 1, 1)
                                           : KKV_ERR_NOMEM;
                free(text);
                if (s != KKV_OK) {
                    fprintf(stderr, "kittykv " CMD ": tokenizing a prompt: %s\n",
                            kkv_last_error());
                    goto done;
                }
                plen[pi] = n;
                if (n > max_len) max_len = n;
            }
    if (info.n_ctx_train > 0 && max_len > info.n_ctx_train)
        fprintf(stderr, "kittykv " CMD ": warning: prompts of %d tokens exceed the model's "
                "trained context (%d)\n", max_len, info.n_ctx_train);

    double t0 = cli_now();
    long done_runs = 0, total_runs = (long)(n_cells * (size_t)o.trials);
    for (int s = 0; s < n_specs; s++) {
        if (kkv_method_check(&specs[s].method, info.head_dim) != KKV_OK) {
            fprintf(stderr, "kittykv " CMD ": %s: %s\n", specs[s].name, kkv_last_error());
            goto done;
        }
        int seq0;
        if (kkv_eval_cache_create(&cache, &seq0, m, &specs[s].method, max_len + ANSWER_TOKENS,
                           1, NULL) != KKV_OK ||
            kkv_cache_set_threadpool(cache, tp) != KKV_OK ||
            kkv_seq_free(cache, seq0) != KKV_OK) {
            fprintf(stderr, "kittykv " CMD ": %s: creating the cache: %s\n", specs[s].name,
                    kkv_last_error());
            goto done;
        }
        for (int l = 0; l < o.n_lengths; l++)
            for (int d = 0; d < o.n_depths; d++) {
                cell *c = &cells[((size_t)s * o.n_lengths + l) * o.n_depths + d];
                for (int t = 0; t < o.trials; t++) {
                    size_t pi = ((size_t)t * o.n_lengths + l) * o.n_depths + d;
                    c->tokens = plen[pi];
                    if (run_one(c->answers[t], m, cache, &info, prompts[pi], plen[pi],
                                logits, err, sizeof err)) {
                        fprintf(stderr, "kittykv " CMD ": %s: %s\n", specs[s].name, err);
                        goto done;
                    }
                    char key[16];
                    snprintf(key, sizeof key, "%d", keys[pi]);
                    c->correct += strstr(c->answers[t], key) != NULL;
                    cli_progress("passkey", ++done_runs, total_runs, cli_now() - t0);
                }
            }
        kkv_cache_free(cache);
        cache = NULL;
    }
    print_table(&o, specs, n_specs, cells);
    if (o.json) print_json(&o, &info, specs, n_specs, cells, keys);
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "kittykv " CMD ": out of memory\n");
done:
    if (cells)
        for (size_t i = 0; i < n_cells; i++) free(cells[i].answers);
    if (prompts)
        for (size_t i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(plen);
    free(keys);
    free(cells);
    free(logits);
    kkv_cache_free(cache);
    kkv_model_free(m);
    kkv_threadpool_free(tp);
    return rc;
}
