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
#include "kittykv_eval.h"
#include "kittykv_model.h"
#include "kittykv_cpu.h"
#include "opts.h"
#include "util.h"

#define CMD "generate"
#define MAX_COMPARE 16 /* methods in one --compare list */

/* Options. Five are for tests and left out of --help:
 *   --prompt-ids LIST  comma-separated token ids instead of -p text
 *   --ids-out FILE     the generated ids, comma-separated (stop token included)
 *   --logits-out FILE  the last prompt position's logits, raw float32 [n_vocab]
 *   --exact-matmul     kkv_model_set_exact_matmul(m, 1): fp32 activations in the
 *                      matmuls instead of 8-bit blocks, so that the oracle test
 *                      (tests/oracle/test_forward.py) can hold logits to a tight
 *                      tolerance and greedy tokens to an exact match. Slower.
 *   --sliding-window W kkv_model_set_sliding_window(m, W): a short window, so the
 *                      Gemma oracle test (tests/oracle/test_gemma.py) exercises
 *                      the windowed layers in a short run. */
typedef struct opts {
    const char *model;
    const char *prompt;
    const char *file;       /* -f: the prompt from a file (as -p @FILE) */
    const char *prompt_ids; /* hidden: comma-separated ids instead of text */
    const char *ids_out;    /* hidden: write generated ids here */
    const char *logits_out; /* hidden: float32 logits of the last prompt token */
    const char *kv;
    const char *compare;    /* --compare LIST as given, or NULL */
    const char *save_state; /* --save-state FILE, or NULL */
    const char *load_state; /* --load-state FILE, or NULL */
    const char *chat_template; /* --chat-template NAME, or NULL: the model's */
    cli_spec    specs[MAX_COMPARE]; /* [n_methods] --kv (with --alpha) or --compare */
    int         n_methods;  /* 1 without --compare */
    int         n_gen, threads, ctx, chat, have_alpha, have_budget, have_kv;
    int         exact_matmul; /* hidden: --exact-matmul */
    int         window;       /* hidden: --sliding-window W (0: the model's) */
    float       alpha, temp, top_p, min_p, repeat_penalty, budget_mb;
    int         top_k, repeat_last_n, have_temp;
    uint64_t    seed;
} opts;

static const char *const SYNOPSIS = "[-m MODEL] (-p PROMPT | -f FILE) [options]";
static const char *const EPILOG =
    "--kv and --compare take method specs: a name with optional ':key=value'\n"
    "overrides, as in `kittykv eval --help` (e.g. kitty:alpha=0.5:select=random).\n"
    "Sampling is greedy (deterministic) unless --temp > 0.\n";

/* The table; o's fields are its targets. n_defs gets the count. */
static int defs_of(opt_def *d, opts *o) {
    const opt_def t[] = {
        {'m', "model", OPT_STRING, 0, 0, &o->model, NULL, "MODEL",
         "GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf or $KKV_MODEL)"},
        {'p', "prompt", OPT_STRING, 0, 0, &o->prompt, NULL, "PROMPT",
         "prompt text, or @FILE to read it from a file"},
        {'f', "file", OPT_STRING, 0, 0, &o->file, NULL, "FILE", "read the prompt from FILE"},
        {'n', "n-predict", OPT_INT, 0, 1 << 24, &o->n_gen, NULL, "N",
         "tokens to generate (default 128)"},
        {0, "kv", OPT_SPEC, 0, 0, &o->kv, &o->have_kv, "SPEC",
         "KV cache method spec (default kitty)"},
        {0, "compare", OPT_LIST, 0, 0, &o->compare, NULL, "LIST",
         "comma-separated method specs (e.g. fp16,kitty): decode the prompt\n"
         "greedily with each, one cache per method, in one process;\n"
         "print each continuation, then a table: tokens, agreement\n"
         "with the first method (leading run of equal ids, and equal\n"
         "ids at equal positions), KV bytes, bits/element, bytes as a\n"
         "fraction of fp16, prefill and decode tok/s. Implies --temp 0;\n"
         "not with --kv, --alpha or --temp > 0"},
        {0, "alpha", OPT_FLOAT, 0, 1, &o->alpha, &o->have_alpha, "A",
         "the method's boost fraction in [0, 1] (same as SPEC:alpha=A;\n"
         "an error for a method that has none, such as fp16)"},
        {0, "temp", OPT_FLOAT, 0, 100, &o->temp, &o->have_temp, "T",
         "sampling temperature (default 0 = greedy, deterministic)"},
        {0, "top-k", OPT_INT, 0, 1 << 30, &o->top_k, NULL, "K",
         "keep the K most likely tokens (default 0 = off)"},
        {0, "top-p", OPT_FLOAT, 1e-6, 1, &o->top_p, NULL, "P",
         "nucleus sampling mass, (0, 1] (default 0.95)"},
        {0, "min-p", OPT_FLOAT, 0, 0.999999, &o->min_p, NULL, "P",
         "drop tokens below P times the top one's probability (default 0)"},
        {0, "repeat-penalty", OPT_FLOAT, 1, 100, &o->repeat_penalty, NULL, "R",
         "penalty of recent tokens, >= 1 (default 1 = off)"},
        {0, "repeat-last-n", OPT_INT, 0, 1 << 20, &o->repeat_last_n, NULL, "N",
         "tokens of history the penalty looks at (default 64)"},
        {'s', "seed", OPT_U64, 0, 18446744073709551615.0, &o->seed, NULL, "S",
         "sampler seed (default 42)"},
        {'t', "threads", OPT_INT, 1, CLI_MAX_THREADS, &o->threads, NULL, "N",
         "threads, 1..256 (default: all cores); one pool shared by the\n"
         "model and every cache"},
        {'c', "ctx-size|ctx", OPT_INT, 1, 1 << 24, &o->ctx, NULL, "N",
         "context limit of the sequence in tokens (default 8192)"},
        {0, "kv-budget", OPT_FLOAT, 0.001, 1 << 24, &o->budget_mb, &o->have_budget, "MB",
         "KV pool budget per cache (default: exactly what -c tokens need)"},
        {0, "chat", OPT_FLAG, 0, 0, &o->chat, NULL, NULL,
         "format the prompt as one user message with the model's own chat\n"
         "template (chatml, llama3, gemma, llama2 or mistral), plus the\n"
         "assistant's opening"},
        {0, "chat-template", OPT_STRING, 0, 0, &o->chat_template, &o->chat, "NAME",
         "use that template family instead (implies --chat)"},
        {0, "save-state", OPT_STRING, 0, 0, &o->save_state, NULL, "FILE",
         "after the run, save the sequence (its quantized cache, the\n"
         "token ids and the next token to feed) to FILE; with -n 0 the\n"
         "prompt alone (docs/STATE_FORMAT.md)"},
        {0, "load-state", OPT_STRING, 0, 0, &o->load_state, NULL, "FILE",
         "continue a saved sequence (same model and --kv spec): -p MORE\n"
         "(optional, no BOS) is fed after it, then -n N tokens; greedy\n"
         "output is the uninterrupted run's"},
        {0, "prompt-ids", OPT_LIST, 0, 0, &o->prompt_ids, NULL, "LIST", NULL},
        {0, "ids-out", OPT_STRING, 0, 0, &o->ids_out, NULL, "FILE", NULL},
        {0, "logits-out", OPT_STRING, 0, 0, &o->logits_out, NULL, "FILE", NULL},
        {0, "exact-matmul", OPT_FLAG, 0, 0, &o->exact_matmul, NULL, NULL, NULL},
        {0, "sliding-window", OPT_INT, 1, 1 << 30, &o->window, NULL, "W", NULL},
    };
    memcpy(d, t, sizeof t);
    return OPTS_N(t);
}

/* Returns 0, or the exit status (2 usage, -1 for --help) to stop with. */
static int parse(opts *o, int argc, char **argv) {
    *o = (opts){.model = NULL, .kv = "kitty", .n_gen = 128, .ctx = 8192, .temp = 0.0f,
                .top_p = 0.95f, .repeat_penalty = 1.0f, .repeat_last_n = 64, .seed = 42};
    opt_def defs[40];
    int n_defs = defs_of(defs, o);
    int rc = opts_run(CMD, SYNOPSIS, defs, n_defs, EPILOG, argc, argv);
    if (rc) return rc;
    if (!!o->prompt + !!o->file + !!o->prompt_ids > 1 ||
        (!o->load_state && !!o->prompt + !!o->file + !!o->prompt_ids != 1)) {
        fprintf(stderr, "kittykv " CMD ": give exactly one of -p PROMPT and -f FILE "
                "(see --help)\n");
        return 2;
    }
    char err[512];
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
        /* split by hand: unlike eval's lists, a method may be listed twice
         * (fp16,fp16 checks that two runs of one method agree) */
        o->n_methods = 0;
        for (const char *p = o->compare; *p;) {
            char one[sizeof o->specs[0].name];
            size_t len = strcspn(p, ",");
            if (o->n_methods == MAX_COMPARE || len >= sizeof one) {
                fprintf(stderr, "kittykv " CMD ": --compare takes at most %d specs of at most "
                        "%zu characters\n", MAX_COMPARE, sizeof one - 1);
                return 2;
            }
            memcpy(one, p, len);
            one[len] = 0;
            if (cli_spec_parse(&o->specs[o->n_methods++], one, err, sizeof err)) {
                fprintf(stderr, "kittykv " CMD ": --compare: %s\n", err);
                return 2;
            }
            p += len;
            if (*p == ',') p++;
        }
    } else {
        /* --alpha is the spec's alpha key: the spec parser rejects it for a
         * method without boosted channels, and when the spec gives it too. */
        char spec[sizeof o->specs[0].name];
        int n = o->have_alpha ? snprintf(spec, sizeof spec, "%s:alpha=%.9g", o->kv,
                                         (double)o->alpha)
                              : snprintf(spec, sizeof spec, "%s", o->kv);
        if (n < 0 || (size_t)n >= sizeof spec) {
            fprintf(stderr, "kittykv " CMD ": --kv: spec too long\n");
            return 2;
        }
        if (cli_spec_parse(&o->specs[0], spec, err, sizeof err)) {
            fprintf(stderr, "kittykv " CMD ": %s: %s\n", o->have_alpha ? "--alpha" : "--kv",
                    err);
            return 2;
        }
        o->n_methods = 1;
    }
    for (int i = 0; i < o->n_methods; i++)
        if (o->specs[i].method.select == KKV_SELECT_EXPLICIT) {
            fprintf(stderr, "kittykv " CMD ": select=oracle needs channel rankings; only "
                    "`kittykv analyze ablation` computes them\n");
            return 2;
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
        if (!*p) {
            fprintf(stderr, "kittykv " CMD ": --prompt-ids is empty (give at least one id)\n");
            return 2;
        }
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
    const char *path = o->file ? o->file : text[0] == '@' ? text + 1 : NULL;
    size_t len = text ? strlen(text) : 0;
    if (path) {
        file_text = cli_read_file(path, &len);
        if (!file_text) {
            fprintf(stderr, "kittykv " CMD ": prompt file %s\n", kkv_last_error());
            return 1;
        }
        text = file_text;
    }
    char *chat = NULL;
    if (o->chat) {
        if (memchr(text, 0, len)) {
            free(file_text);
            return fprintf(stderr, "kittykv " CMD ": a --chat prompt cannot hold NUL bytes\n"), 1;
        }
        char *content = malloc(len + 1); /* text may be a file's bytes: NUL-terminate */
        if (!content) {
            free(file_text);
            return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
        }
        memcpy(content, text, len);
        content[len] = 0;
        kkv_chat_msg msg = {"user", content};
        size_t need = 0;
        kkv_status cs = kkv_chat_format(m, NULL, 0, &need, &msg, 1, 1, o->chat_template);
        /* *len is set only when the text was made: then the first call failed for room alone */
        if (cs == KKV_ERR_INVALID_ARG && need > 0) {
            chat = malloc(need + 1);
            if (chat) cs = kkv_chat_format(m, chat, need + 1, &need, &msg, 1, 1, o->chat_template);
        }
        free(content);
        if (cs != KKV_OK) {
            fprintf(stderr, "kittykv " CMD ": --chat: %s\n",
                    need > 0 && !chat ? "out of memory" : kkv_last_error());
            free(chat);
            free(file_text);
            return 1;
        }
        len = need;
        text = chat;
    }
    /* a continuation of a loaded state gets no BOS */
    kkv_status s = kkv_tokenize_alloc(m, ids, n, text, len, !o->load_state, o->chat);
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


static int print_ids(const char *path, const int32_t *ids, int n) {
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "kittykv " CMD ": cannot write '%s': %s\n", path, strerror(errno));
        return 1;
    }
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", (int)ids[i]);
    fprintf(f, "\n");
    int bad = ferror(f);
    if (fclose(f) || bad) {
        fprintf(stderr, "kittykv " CMD ": error writing '%s'\n", path);
        return 1;
    }
    return 0;
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
static void emit(const kkv_model *m, kkv_utf8_stream *u, int32_t tok) {
    char buf[256];
    char out[KKV_UTF8_STREAM_BOUND(sizeof buf)];
    size_t n = 0;
    if (kkv_token_piece(m, buf, sizeof buf, &n, tok) != KKV_OK) return;
    fwrite(out, 1, kkv_utf8_stream_feed(u, out, buf, n), stdout);
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
                      const cli_spec *spec, kkv_sampler *smp, float *logits,
                      kkv_threadpool *tp) {
    kkv_method method = spec->method;
    if (kkv_method_check(&method, info->head_dim) != KKV_OK) return fail(spec->name);
    res->name = spec->name;
    res->alpha = method.alpha;

    kkv_cache_config cfg = kkv_model_cache_config(m, &method, 0);
    cfg.n_threads = 1; /* no workers of its own: it borrows the CLI's pool */
    cfg.max_tokens = o->ctx;
    if (o->have_budget) cfg.pool_bytes = (size_t)(o->budget_mb * 1048576.0);
    else if (kkv_eval_pool_bytes(&cfg.pool_bytes, &cfg, o->ctx) != KKV_OK)
        return fail("sizing the KV pool");
    kkv_cache *cache;
    if (kkv_cache_create(&cache, &cfg) != KKV_OK) return fail("creating the KV cache");
    int rc = 0, seq = -1;
    if (kkv_cache_set_threadpool(cache, tp) != KKV_OK) rc = fail("thread pool");
    /* hist: every id the cache holds, then the next one to feed; a saved state
     * carries the same list, so a load continues exactly where a run stopped */
    int32_t *hist = malloc(((size_t)o->ctx + 2) * sizeof *hist); /* [ctx + 2] */
    int n_hist = 0;
    int32_t *feed = NULL; /* [n_feed] the first forward pass's tokens */
    int n_feed = n_prompt;
    if (!rc && !hist) {
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        rc = 1;
    }
    if (!rc && o->load_state) {
        uint64_t fp = kkv_model_fingerprint(m);
        kkv_status ls = kkv_seq_load_file(cache, &seq, o->load_state, fp, hist, o->ctx + 1,
                                          &n_hist);
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
            for (int i = 0; !rc && i < n_hist; i++)
                if (kkv_sampler_accept(smp, hist[i]) != KKV_OK) rc = fail("sampler");
        }
    }
    const int32_t *first = feed ? feed : prompt;
    for (int i = 0; !rc && i < n_feed; i++)
        if (kkv_sampler_accept(smp, first[i]) != KKV_OK) rc = fail("sampler");
    /* Everything the run can need, up front: a pool or context that is too
     * small is one clear error before any output. */
    if (!rc && !o->load_state && kkv_seq_add(cache, &seq) != KKV_OK) rc = fail("KV pool too small");
    if (!rc && kkv_seq_reserve(cache, seq, n_feed + o->n_gen) != KKV_OK)
        rc = fail("context too long for the KV pool");
    /* saving the prompt alone: its last token stays pending (chunking
     * invariance: n - 1 then 1 token is the n-token prefill) */
    int hold = o->save_state && o->n_gen == 0 && !feed;

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

    kkv_utf8_stream u8;
    kkv_utf8_stream_init(&u8);
    while (!rc && res->n_out < o->n_gen) {
        int32_t tok;
        if (kkv_sampler_sample(smp, &tok, logits, info->n_vocab) != KKV_OK) {
            rc = fail("sampling");
            break;
        }
        res->gen[res->n_out++] = tok;
        hist[n_hist] = tok; /* pending until fed */
        if (kkv_sampler_accept(smp, tok) != KKV_OK) {
            rc = fail("sampler");
            break;
        }
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
        char tail[KKV_UTF8_STREAM_BOUND(0)];
        fwrite(tail, 1, kkv_utf8_stream_flush(&u8, tail), stdout);
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
    snprintf(threads_str, sizeof threads_str, "%d", o->threads);
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
    snprintf(threads_str, sizeof threads_str, "%d", o->threads);
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
    kkv_sampler *sampler;
    kkv_threadpool *tp;   /* the one pool of the process: model and caches borrow it */
} run_state;

static void run_free(run_state *r) {
    kkv_sampler_free(r->sampler);
    for (int i = 0; i < MAX_COMPARE; i++) free(r->runs[i].gen);
    free(r->logits);
    free(r->prompt);
    kkv_model_free(r->model);
    kkv_threadpool_free(r->tp); /* after everything that borrows it */
}

static int generate(const opts *o, run_state *r) {
    if (kkv_threadpool_create(&r->tp, o->threads) != KKV_OK) return fail("thread pool");
    if (cli_model_load(&r->model, o->model, r->tp, CMD)) return 1;
    if (o->exact_matmul && kkv_model_set_exact_matmul(r->model, 1) != KKV_OK)
        return fail("--exact-matmul");
    if (o->window && kkv_model_set_sliding_window(r->model, o->window) != KKV_OK)
        return fail("--sliding-window");
    kkv_model_info info;
    kkv_model_get_info(r->model, &info);

    int n_prompt = 0, rc = 0;
    if (o->prompt || o->file || o->prompt_ids)
        rc = prompt_tokens(o, r->model, &r->prompt, &n_prompt);
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
        kkv_sampler_free(r->sampler);
        r->sampler = NULL;
        kkv_sampler_params sp = kkv_sampler_defaults();
        sp.temp = o->temp;
        sp.top_p = o->top_p;
        sp.top_k = o->top_k;
        sp.min_p = o->min_p;
        sp.repeat_penalty = o->repeat_penalty;
        sp.repeat_last_n = o->repeat_last_n;
        sp.seed = o->seed;
        if (kkv_sampler_create(&r->sampler, &sp) != KKV_OK) return fail("sampler");
        if (o->compare) {
            printf("%s=== %s ===\n", i ? "\n" : "", o->specs[i].name);
            fflush(stdout);
        }
        rc = run_method(&r->runs[i], o, r->model, &info, r->prompt, n_prompt, &o->specs[i],
                        r->sampler, r->logits, r->tp);
        if (rc) return rc;
    }
    if (o->ids_out && print_ids(o->ids_out, r->runs[0].gen, r->runs[0].n_out)) return 1;
    if (o->compare) report_compare(o, &info, r->runs, o->n_methods, n_prompt);
    else report_one(o, &info, &r->runs[0], n_prompt);
    return 0;
}

int cmd_generate(int argc, char **argv) {
    opts o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    o.threads = cli_threads(o.threads, CMD);
    run_state r;
    memset(&r, 0, sizeof r);
    rc = generate(&o, &r);
    run_free(&r);
    return rc;
}
