/* kittykv generate: stream a model's continuation of a prompt, with every
 * attention read going through the chosen KV cache method, then report speed
 * and the cache's true memory next to what fp16 would need. With --compare it
 * decodes the same prompt greedily once per listed method (one model, one
 * cache each) and sets the results side by side. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "kittykv.h"
#include "sample.h"
#include "utf8.h"
#include "util.h"

#define CMD "generate"
#define MAX_COMPARE 16 /* methods in one --compare list */

static const char *const CHAT_TEMPLATE =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kittykv generate [-m MODEL] -p PROMPT [options]\n"
            "  -m MODEL       GGUF file (default: %s)\n"
            "  -p PROMPT      prompt text, or @FILE to read it from a file\n"
            "  -n N           tokens to generate (default 128)\n"
            "  --kv METHOD    KV cache method (default kitty):",
            cli_default_model());
    for (const char *const *n = kkv_method_names(); *n; n++) fprintf(f, " %s", *n);
    fprintf(f,
            "\n"
            "  --compare LIST comma-separated methods (e.g. fp16,kitty): decode the prompt\n"
            "                 greedily with each, one cache per method, in one process;\n"
            "                 print each continuation, then a table: tokens, agreement\n"
            "                 with the first method (leading run of equal ids, and equal\n"
            "                 ids at equal positions), KV bytes, bits/element, bytes as a\n"
            "                 fraction of fp16, prefill and decode tok/s. Implies --temp 0;\n"
            "                 not with --kv, --alpha or --temp > 0\n"
            "  --alpha A      override the method's boost fraction, in [0, 1]\n"
            "  --eager-values quantize each value as it leaves the fp16 window (no value\n"
            "                 Q-buffer; not the paper's lifecycle)\n"
            "  --temp T       sampling temperature (default 0 = greedy, deterministic)\n"
            "  --top-p P      nucleus sampling mass, (0, 1] (default 0.95)\n"
            "  --seed S       sampler seed (default 42)\n"
            "  -t THREADS     threads (default 0 = all cores)\n"
            "  -c CTX         context limit of the sequence in tokens (default 8192)\n"
            "  --kv-budget MB KV pool budget per cache (default: exactly what CTX tokens need)\n"
            "  --chat         wrap the prompt in the ChatML template of SmolLM2\n"
            "  --save-state FILE  after the run, save the sequence (its quantized cache,\n"
            "                 token ids and the next token to feed) to FILE; with -n 0\n"
            "                 the prompt only\n"
            "  --load-state FILE  continue a saved sequence (same model and --kv method):\n"
            "                 -p MORE (optional, no BOS) is fed after it, then -n N tokens;\n"
            "                 greedy output is the uninterrupted run's\n");
}

/* Options. Four are for tests and left out of --help:
 *   --prompt-ids LIST  comma-separated token ids instead of -p text
 *   --ids-out FILE     the generated ids, comma-separated (stop token included)
 *   --logits-out FILE  the last prompt position's logits, raw float32 [n_vocab]
 *   --exact-matmul     kkv_model_set_exact_matmul(m, 1): fp32 activations in the
 *                      matmuls instead of 8-bit blocks, so that the oracle test
 *                      (tests/oracle/test_forward.py) can hold logits to a tight
 *                      tolerance and greedy tokens to an exact match. Slower. */
typedef struct opts {
    const char *model;
    const char *prompt;
    const char *prompt_ids; /* hidden: comma-separated ids instead of text */
    const char *ids_out;    /* hidden: write generated ids here */
    const char *logits_out; /* hidden: float32 logits of the last prompt token */
    const char *kv;
    const char *compare;    /* --compare LIST as given, or NULL */
    const char *save_state; /* --save-state FILE, or NULL */
    const char *load_state; /* --load-state FILE, or NULL */
    const char *methods[MAX_COMPARE]; /* [n_methods] names, pointing into names_buf */
    char        names_buf[256];
    int         n_methods;  /* 1 without --compare */
    int         n_gen, threads, ctx, chat, have_alpha, have_budget, have_kv;
    int         exact_matmul; /* hidden: --exact-matmul */
    int         eager;        /* --eager-values */
    float       alpha, temp, top_p;
    double      budget_mb;
    uint64_t    seed;
} opts;

static void print_method_names(FILE *f) {
    for (const char *const *n = kkv_method_names(); *n; n++) fprintf(f, " %s", *n);
}

/* Splits --compare's list into o->methods. Returns 0 or 2 (usage error). */
static int parse_compare(opts *o) {
    size_t len = strlen(o->compare);
    if (len >= sizeof o->names_buf) {
        fprintf(stderr, "kittykv " CMD ": --compare list too long\n");
        return 2;
    }
    memcpy(o->names_buf, o->compare, len + 1);
    o->n_methods = 0;
    char *p = o->names_buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = '\0';
        kkv_method m;
        if (!*p || kkv_method_from_name(&m, p) != KKV_OK) {
            fprintf(stderr, "kittykv " CMD ": --compare: unknown method '%s' (one of:", p);
            print_method_names(stderr);
            fprintf(stderr, ")\n");
            return 2;
        }
        if (o->n_methods == MAX_COMPARE) {
            fprintf(stderr, "kittykv " CMD ": --compare takes at most %d methods\n",
                    MAX_COMPARE);
            return 2;
        }
        o->methods[o->n_methods++] = p;
        if (!comma) break;
        p = comma + 1;
    }
    return 0;
}

/* Returns 0, or the exit status (2 usage, 0 for --help) to stop with. */
static int parse(opts *o, int argc, char **argv) {
    *o = (opts){.model = NULL, .kv = "kitty", .n_gen = 128, .ctx = 8192, .temp = 0.0f,
                .top_p = 0.95f, .seed = 42};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return -1;
        }
        if (!strcmp(a, "--chat")) {
            o->chat = 1;
            continue;
        }
        if (!strcmp(a, "--exact-matmul")) {
            o->exact_matmul = 1;
            continue;
        }
        if (!strcmp(a, "--eager-values")) {
            o->eager = 1;
            continue;
        }
        static const char *const with_value[] = {
            "-m", "--model", "-p", "--prompt", "--prompt-ids", "--ids-out", "--logits-out",
            "--kv", "--compare", "-n", "-t", "--threads", "-c", "--ctx", "--alpha", "--temp",
            "--top-p", "--seed", "--kv-budget", "--save-state", "--load-state", NULL};
        int known = 0;
        for (const char *const *w = with_value; *w; w++) known |= !strcmp(a, *w);
        if (!known) {
            fprintf(stderr, "kittykv " CMD ": unknown option '%s' (see --help)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kittykv " CMD ": %s needs a value (see --help)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = v;
        else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = v;
        else if (!strcmp(a, "--ids-out")) o->ids_out = v;
        else if (!strcmp(a, "--logits-out")) o->logits_out = v;
        else if (!strcmp(a, "--save-state")) o->save_state = v;
        else if (!strcmp(a, "--load-state")) o->load_state = v;
        else if (!strcmp(a, "--kv")) {
            o->kv = v;
            o->have_kv = 1;
        } else if (!strcmp(a, "--compare")) o->compare = v;
        else if (!strcmp(a, "-n")) {
            if (cli_int(&o->n_gen, v, 0, 1 << 24, CMD, a)) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (cli_int(&o->threads, v, 0, 1024, CMD, a)) return 2;
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) {
            if (cli_int(&o->ctx, v, 1, 1 << 24, CMD, a)) return 2;
        } else if (!strcmp(a, "--alpha")) {
            if (cli_float(&o->alpha, v, 0.0, 1.0, CMD, a)) return 2;
            o->have_alpha = 1;
        } else if (!strcmp(a, "--temp")) {
            if (cli_float(&o->temp, v, 0.0, 100.0, CMD, a)) return 2;
        } else if (!strcmp(a, "--top-p")) {
            if (cli_float(&o->top_p, v, 1e-6, 1.0, CMD, a)) return 2;
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || errno || *v == '-') {
                fprintf(stderr, "kittykv " CMD ": bad value for --seed: '%s'\n", v);
                return 2;
            }
            o->seed = (uint64_t)s;
        } else if (!strcmp(a, "--kv-budget")) {
            float mb;
            if (cli_float(&mb, v, 0.001, 1 << 24, CMD, a)) return 2;
            o->budget_mb = mb;
            o->have_budget = 1;
        } else {
            fprintf(stderr, "kittykv " CMD ": unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!o->prompt && !o->prompt_ids && !o->load_state) {
        fprintf(stderr, "kittykv " CMD ": -p PROMPT is required (see --help)\n");
        return 2;
    }
    if (o->prompt && o->prompt_ids) {
        fprintf(stderr, "kittykv " CMD ": give -p or --prompt-ids, not both\n");
        return 2;
    }
    if (o->compare) {
        /* A comparison is only meaningful when every method sees the same
         * deterministic decoding rule and its own defaults. */
        const char *clash = o->have_kv ? "--kv" : o->have_alpha ? "--alpha"
                          : o->save_state ? "--save-state" : o->load_state ? "--load-state"
                          : o->temp > 0.0f ? "--temp > 0" : o->ids_out ? "--ids-out"
                          : o->logits_out ? "--logits-out" : NULL;
        if (clash) {
            fprintf(stderr, "kittykv " CMD ": --compare decodes greedily with each listed "
                    "method's own settings; it cannot be combined with %s\n", clash);
            return 2;
        }
        int rc = parse_compare(o);
        if (rc) return rc;
    } else {
        o->methods[0] = o->kv;
        o->n_methods = 1;
    }
    if (!o->model) o->model = cli_default_model();
    return 0;
}

/* The prompt as token ids: *ids malloc'd [*n]. Returns an exit status. */
static int prompt_tokens(const opts *o, const kkv_model *m, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (o->prompt_ids) {
        int cap = 1;
        for (const char *p = o->prompt_ids; *p; p++) cap += *p == ',';
        *ids = malloc((size_t)cap * sizeof **ids);
        if (!*ids) return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
        const char *p = o->prompt_ids;
        while (*p) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
                fprintf(stderr, "kittykv " CMD ": bad --prompt-ids list '%s'\n", o->prompt_ids);
                return 2;
            }
            (*ids)[(*n)++] = (int32_t)v;
            p = *end ? end + 1 : end;
        }
        return 0;
    }
    char *file_text = NULL;
    const char *text = o->prompt;
    size_t len = strlen(text);
    if (text[0] == '@') {
        file_text = cli_read_file(text + 1, &len);
        if (!file_text) {
            fprintf(stderr, "kittykv " CMD ": cannot read prompt file '%s': %s\n", text + 1,
                    strerror(errno));
            return 1;
        }
        text = file_text;
    }
    char *chat = NULL;
    if (o->chat) {
        size_t cap = len + strlen(CHAT_TEMPLATE) + 1;
        chat = malloc(cap);
        if (!chat) {
            free(file_text);
            return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
        }
        /* The prompt itself may hold '%' or NUL-free binary: copy, not printf it. */
        const char *hole = strstr(CHAT_TEMPLATE, "%s");
        size_t pre = (size_t)(hole - CHAT_TEMPLATE);
        memcpy(chat, CHAT_TEMPLATE, pre);
        memcpy(chat + pre, text, len);
        strcpy(chat + pre + len, hole + 2);
        len = strlen(hole + 2) + pre + len;
        text = chat;
    }
    int cap = (int)(len < (size_t)(1 << 26) ? len : (size_t)(1 << 26)) + 8;
    kkv_status s = KKV_ERR_NOMEM;
    for (int tries = 0; tries < 2; tries++) {
        free(*ids);
        *ids = malloc((size_t)cap * sizeof **ids);
        if (!*ids) break;
        /* a continuation of a loaded state gets no BOS */
        s = kkv_tokenize(m, *ids, cap, n, text, len, !o->load_state, o->chat);
        if (s != KKV_ERR_INVALID_ARG || *n <= cap) break;
        cap = *n; /* too small: *n says how many are needed */
    }
    free(chat);
    free(file_text);
    if (s != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": tokenizing the prompt: %s\n",
                s == KKV_ERR_NOMEM && !*kkv_last_error() ? "out of memory" : kkv_last_error());
        return 1;
    }
    if (*n == 0) {
        fprintf(stderr, "kittykv " CMD ": the prompt is empty\n");
        return 1;
    }
    return 0;
}

/* Pool budget that holds exactly ctx tokens of one sequence with this method:
 * measured on a throw-away cache (the pool reserves address space lazily), so
 * it stays right whatever the cache's page and staging layout. */
static kkv_status budget_for_ctx(size_t *out, const kkv_cache_config *base, int ctx) {
    kkv_cache_config cfg = *base;
    int S = cfg.method.sink, G = cfg.method.group, R = cfg.method.window;
    /* Upper bound: every token, sink, buffer and window in fp16, twice. */
    double per_tok = 2.0 * 2.0 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim;
    double bound = 2.0 * per_tok * ((double)ctx + 2.0 * S + 4.0 * G + R + 64);
    cfg.pool_bytes = (size_t)bound;
    cfg.max_tokens = ctx;
    cfg.n_threads = 1;
    kkv_cache *probe;
    kkv_status cs = kkv_cache_create(&probe, &cfg);
    if (cs != KKV_OK) return cs;
    int seq;
    kkv_status s = kkv_seq_add(probe, &seq);
    if (s == KKV_OK) s = kkv_seq_reserve(probe, seq, ctx);
    kkv_mem mem;
    if (s == KKV_OK) s = kkv_seq_mem(probe, &mem, seq);
    if (s == KKV_OK) *out = (size_t)mem.capacity;
    kkv_cache_free(probe);
    return s;
}

static void print_ids(const char *path, const int32_t *ids, int n) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kittykv " CMD ": cannot write '%s': %s\n", path, strerror(errno));
        return;
    }
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", (int)ids[i]);
    fprintf(f, "\n");
    fclose(f);
}

static int write_logits(const char *path, const float *logits, int n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(logits, sizeof *logits, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "kittykv " CMD ": cannot write '%s': %s\n", path, strerror(errno));
        if (f) fclose(f);
        return 1;
    }
    return fclose(f) ? 1 : 0;
}

/* Writes a token's bytes to stdout as soon as they complete UTF-8 characters
 * (a character may span tokens). */
static void emit(const kkv_model *m, utf8_stream *u, int32_t tok) {
    char buf[256];
    char out[UTF8_STREAM_BOUND(sizeof buf)];
    size_t n = 0;
    if (kkv_token_piece(m, buf, sizeof buf, &n, tok) != KKV_OK) return;
    fwrite(out, 1, utf8_stream_feed(u, out, buf, n), stdout);
    fflush(stdout);
}

/* What one method's run produced, for the report and the comparison table. */
typedef struct method_run {
    const char *name;
    float       alpha;
    int32_t    *gen;       /* [n_gen + 1] generated ids, stop token included */
    int         n_out;     /* ids in gen */
    int         stopped;   /* 1 if gen ends with an end-of-text token */
    int         n_decode;  /* single-token forward passes timed in t_decode */
    double      t_prefill, t_decode;
    int         held;      /* tokens in the cache at the end */
    kkv_mem     mem;
    double      fp16_bytes; /* what an fp16 cache of `held` tokens would take */
} method_run;

static int fail(const char *what) {
    fprintf(stderr, "kittykv " CMD ": %s%s%s\n", what ? what : "", what ? ": " : "",
            kkv_last_error());
    return 1;
}

/* Prefills the prompt into a fresh cache of `name`'s method and decodes up to
 * o->n_gen tokens, streaming their text to stdout. logits: [n_vocab] scratch.
 * Fills *res (res->gen must hold n_gen + 1 ids). Returns an exit status. */
static int run_method(method_run *res, const opts *o, kkv_model *m,
                      const kkv_model_info *info, const int32_t *prompt, int n_prompt,
                      const char *name, cli_sampler *smp, float *logits) {
    kkv_method method;
    if (kkv_method_from_name(&method, name) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": unknown --kv method '%s' (one of:", name);
        print_method_names(stderr);
        fprintf(stderr, ")\n");
        return 2;
    }
    if (o->have_alpha) method.alpha = o->alpha;
    method.eager_values = o->eager;
    if (kkv_method_check(&method, info->head_dim) != KKV_OK) return fail("--kv");
    res->name = name;
    res->alpha = method.alpha;

    kkv_cache_config cfg = kkv_model_cache_config(m, &method, 0);
    cfg.max_tokens = o->ctx;
    if (o->have_budget) cfg.pool_bytes = (size_t)(o->budget_mb * 1048576.0);
    else if (budget_for_ctx(&cfg.pool_bytes, &cfg, o->ctx) != KKV_OK)
        return fail("sizing the KV pool");
    kkv_cache *cache;
    if (kkv_cache_create(&cache, &cfg) != KKV_OK) return fail("creating the KV cache");
    int rc = 0, seq = -1;
    /* hist: every id the cache holds, then the next one to feed; a saved state
     * carries the same list, so a load continues exactly where a run stopped */
    int32_t *hist = malloc(((size_t)o->ctx + 2) * sizeof *hist); /* [ctx + 2] */
    int n_hist = 0;
    int32_t *feed = NULL; /* [n_feed] the first forward pass's tokens */
    int n_feed = n_prompt;
    if (!hist) {
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        rc = 1;
    }
    if (!rc && o->load_state) {
        uint64_t fp = kkv_model_fingerprint(m);
        kkv_status ls = kkv_seq_load_file(cache, &seq, o->load_state, fp, hist, o->ctx + 1, &n_hist);
        if (ls != KKV_OK) {
            fprintf(stderr, "kittykv " CMD ": --load-state %s: %s\n", o->load_state,
                    ls == KKV_ERR_INVALID_ARG ? "longer than the context (-c)" : kkv_last_error());
            rc = 1;
        } else if (n_hist != kkv_seq_len(cache, seq, 0) + 1) {
            fprintf(stderr, "kittykv " CMD ": --load-state %s: %d token ids for a sequence of %d "
                    "tokens (not saved by kittykv generate)\n", o->load_state, n_hist,
                    kkv_seq_len(cache, seq, 0));
            rc = 1;
        } else if (n_hist + n_prompt + o->n_gen > o->ctx) {
            fprintf(stderr, "kittykv " CMD ": the loaded %d tokens plus %d more exceed the "
                    "context of %d tokens (-c)\n", n_hist, n_prompt + o->n_gen, o->ctx);
            rc = 1;
        } else {
            /* the pending token, then the new prompt */
            n_hist--;
            n_feed = 1 + n_prompt;
            feed = malloc((size_t)n_feed * sizeof *feed);
            if (!feed) {
                fprintf(stderr, "kittykv " CMD ": out of memory\n");
                rc = 1;
            } else {
                feed[0] = hist[n_hist];
                if (n_prompt) memcpy(feed + 1, prompt, (size_t)n_prompt * sizeof *feed);
            }
        }
    } else if (!rc) {
        if (kkv_seq_add(cache, &seq) != KKV_OK) rc = fail("KV pool too small");
    }
    const int32_t *first = feed ? feed : prompt;
    /* saving the prompt alone: its last token stays pending (chunking
     * invariance: n - 1 then 1 token is the n-token prefill) */
    int hold = o->save_state && o->n_gen == 0 && !feed;
    /* Everything the run can need, up front: a pool or context that is too
     * small is one clear error before any output. */
    if (!rc && kkv_seq_reserve(cache, seq, n_feed + o->n_gen) != KKV_OK)
        rc = fail("context too long for the KV pool");

    double t0 = cli_now();
    if (!rc && n_feed - hold > 0 &&
        kkv_model_forward(m, cache, logits, seq, first, n_feed - hold, 0) != KKV_OK)
        rc = fail("prefill");
    if (!rc) {
        memcpy(hist + n_hist, first, (size_t)n_feed * sizeof *hist);
        n_hist += n_feed - hold;
    }
    res->t_prefill = cli_now() - t0;
    if (!rc && o->logits_out && write_logits(o->logits_out, logits, info->n_vocab)) rc = 1;

    utf8_stream u8;
    utf8_stream_init(&u8);
    while (!rc && res->n_out < o->n_gen) {
        int32_t tok = cli_sample(smp, logits, info->n_vocab);
        if (tok < 0) {
            fprintf(stderr, "kittykv " CMD ": out of memory\n");
            rc = 1;
            break;
        }
        res->gen[res->n_out++] = tok;
        hist[n_hist] = tok; /* pending until fed */
        if (tok == info->eos || tok == info->eot) {
            res->stopped = 1;
            break;
        }
        emit(m, &u8, tok);
        if (res->n_out == o->n_gen) break;
        double t1 = cli_now();
        if (kkv_model_forward(m, cache, logits, seq, &tok, 1, 0) != KKV_OK) {
            fputc('\n', stdout);
            rc = fail("decode");
            break;
        }
        n_hist++;
        res->t_decode += cli_now() - t1;
        res->n_decode++;
    }
    if (!rc && o->save_state) {
        kkv_state_meta meta = {kkv_model_fingerprint(m), hist, n_hist + 1};
        if (kkv_seq_save_file(cache, o->save_state, seq, &meta) != KKV_OK)
            rc = fail("--save-state");
    }
    free(feed);
    free(hist);
    if (!rc) {
        char tail[UTF8_STREAM_BOUND(0)];
        fwrite(tail, 1, utf8_stream_flush(&u8, tail), stdout);
        fputc('\n', stdout);
        fflush(stdout);
        if (kkv_seq_mem(cache, &res->mem, seq) != KKV_OK) rc = fail("memory report");
        res->held = kkv_seq_len(cache, seq, 0);
        res->fp16_bytes = 2.0 * 2.0 * res->held * info->n_layers * info->n_kv_heads *
                          info->head_dim;
    }
    kkv_cache_free(cache);
    return rc;
}

static double rate(int n, double t) {
    return t > 0 ? n / t : 0.0;
}

/* The single-method report, on stderr so stdout is only the text. */
static void report_one(const opts *o, const kkv_model_info *info, const method_run *r,
                       int n_prompt) {
    char threads_str[16];
    if (o->threads) snprintf(threads_str, sizeof threads_str, "%d", o->threads);
    else snprintf(threads_str, sizeof threads_str, "all");
    fprintf(stderr, "\nmodel: %s (%s, %d layers)  kv: %s  alpha: %g  threads: %s\n",
            info->name[0] ? info->name : o->model, info->arch, info->n_layers, r->name,
            (double)r->alpha, threads_str);
    fprintf(stderr, "prompt: %d tokens, %.1f tok/s (%.3f s)\n", n_prompt,
            rate(n_prompt, r->t_prefill), r->t_prefill);
    fprintf(stderr, "generated: %d tokens%s, decode %.1f tok/s (%d steps, %.3f s)\n",
            r->n_out - r->stopped, r->stopped ? " (end of turn)" : "",
            rate(r->n_decode, r->t_decode), r->n_decode, r->t_decode);
    fprintf(stderr, "KV cache: %d tokens, %llu bytes, %.3f bits/element; fp16 would need "
            "%.0f bytes (%.2fx)\n", r->held, (unsigned long long)r->mem.total,
            r->mem.bits_per_element, r->fp16_bytes,
            r->mem.total ? r->fp16_bytes / (double)r->mem.total : 0.0);
}

/* Agreement of b with a: *lead = ids equal before the first difference,
 * *same = positions holding the same id; both out of the longer run. */
static void agreement(int *lead, int *same, const method_run *a, const method_run *b) {
    int n = a->n_out < b->n_out ? a->n_out : b->n_out;
    *lead = 0;
    while (*lead < n && a->gen[*lead] == b->gen[*lead]) (*lead)++;
    *same = 0;
    for (int i = 0; i < n; i++) *same += a->gen[i] == b->gen[i];
}

/* The --compare table, on stdout after the continuations. */
static void report_compare(const opts *o, const kkv_model_info *info, const method_run *r,
                           int n, int n_prompt) {
    char threads_str[16];
    if (o->threads) snprintf(threads_str, sizeof threads_str, "%d", o->threads);
    else snprintf(threads_str, sizeof threads_str, "all");
    printf("\nmodel: %s (%s, %d layers)  prompt: %d tokens  greedy, up to %d new tokens  "
           "threads: %s\n", info->name[0] ? info->name : o->model, info->arch,
           info->n_layers, n_prompt, o->n_gen, threads_str);
    printf("agreement is with %s: leading run of identical ids / identical ids at the same "
           "position, out of the longer of the two runs\n\n", r[0].name);
    printf("%-12s %8s %10s %10s %12s %9s %10s %13s %12s\n", "method", "tokens", "lead-agree",
           "pos-agree", "KV bytes", "bits/elem", "bytes/fp16", "prefill tok/s",
           "decode tok/s");
    for (int i = 0; i < n; i++) {
        int lead, same, longer = r[i].n_out > r[0].n_out ? r[i].n_out : r[0].n_out;
        agreement(&lead, &same, &r[0], &r[i]);
        char tokens[24], la[24], pa[24];
        snprintf(tokens, sizeof tokens, "%d%s", r[i].n_out - r[i].stopped,
                 r[i].stopped ? "+eot" : "");
        snprintf(la, sizeof la, "%d/%d", lead, longer);
        snprintf(pa, sizeof pa, "%d/%d", same, longer);
        printf("%-12s %8s %10s %10s %12llu %9.3f %10.3f %13.1f %12.1f\n", r[i].name, tokens,
               la, pa, (unsigned long long)r[i].mem.total, r[i].mem.bits_per_element,
               r[i].fp16_bytes > 0 ? (double)r[i].mem.total / r[i].fp16_bytes : 0.0,
               rate(n_prompt, r[i].t_prefill), rate(r[i].n_decode, r[i].t_decode));
    }
    fflush(stdout);
}

typedef struct run_state {
    kkv_model  *model;
    int32_t    *prompt;   /* [n_prompt] */
    float      *logits;   /* [n_vocab] */
    method_run  runs[MAX_COMPARE]; /* [n_methods]; each gen is [n_gen + 1] */
    cli_sampler sampler;
} run_state;

static void run_free(run_state *r) {
    cli_sampler_free(&r->sampler);
    for (int i = 0; i < MAX_COMPARE; i++) free(r->runs[i].gen);
    free(r->logits);
    free(r->prompt);
    kkv_model_free(r->model);
}

static int generate(const opts *o, run_state *r) {
    /* Names first: a typo is a usage error before the model loads. */
    for (int i = 0; i < o->n_methods; i++) {
        kkv_method method;
        if (kkv_method_from_name(&method, o->methods[i]) != KKV_OK) {
            fprintf(stderr, "kittykv " CMD ": unknown --kv method '%s' (one of:",
                    o->methods[i]);
            print_method_names(stderr);
            fprintf(stderr, ")\n");
            return 2;
        }
    }
    if (kkv_model_load(&r->model, o->model, o->threads) != KKV_OK) return fail(NULL);
    if (o->exact_matmul && kkv_model_set_exact_matmul(r->model, 1) != KKV_OK)
        return fail("--exact-matmul");
    kkv_model_info info;
    kkv_model_get_info(r->model, &info);

    int n_prompt = 0, rc = 0;
    if (o->prompt || o->prompt_ids) rc = prompt_tokens(o, r->model, &r->prompt, &n_prompt);
    if (rc) return rc;
    if ((long)n_prompt + o->n_gen > o->ctx) {
        fprintf(stderr, "kittykv " CMD ": the prompt (%d token(s)) plus %d new tokens exceed the "
                "context of %d tokens (-c)\n", n_prompt, o->n_gen, o->ctx);
        return 1;
    }
    r->logits = malloc((size_t)info.n_vocab * sizeof *r->logits);
    if (!r->logits) return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
    for (int i = 0; i < o->n_methods; i++) {
        r->runs[i].gen = malloc(((size_t)o->n_gen + 1) * sizeof *r->runs[i].gen);
        if (!r->runs[i].gen) return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
    }

    for (int i = 0; i < o->n_methods; i++) {
        /* Each method starts from the same sampler state (greedy ignores it). */
        cli_sampler_free(&r->sampler);
        cli_sampler_init(&r->sampler, o->temp, o->top_p, o->seed);
        if (o->compare) {
            printf("%s=== %s ===\n", i ? "\n" : "", o->methods[i]);
            fflush(stdout);
        }
        rc = run_method(&r->runs[i], o, r->model, &info, r->prompt, n_prompt, o->methods[i],
                        &r->sampler, r->logits);
        if (rc) return rc;
    }
    if (o->ids_out) print_ids(o->ids_out, r->runs[0].gen, r->runs[0].n_out);
    if (o->compare) report_compare(o, &info, r->runs, o->n_methods, n_prompt);
    else report_one(o, &info, &r->runs[0], n_prompt);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    opts o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    run_state r;
    memset(&r, 0, sizeof r);
    rc = generate(&o, &r);
    run_free(&r);
    return rc;
}
