/* kittykv generate: stream a model's continuation of a prompt, with every
 * attention read going through the chosen KV cache method, then report speed
 * and the cache's true memory next to what fp16 would need. */
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
            "  --alpha A      override the method's boost fraction, in [0, 1]\n"
            "  --temp T       sampling temperature (default 0 = greedy, deterministic)\n"
            "  --top-p P      nucleus sampling mass, (0, 1] (default 0.95)\n"
            "  --seed S       sampler seed (default 42)\n"
            "  -t THREADS     threads (default 0 = all cores)\n"
            "  -c CTX         context limit of the sequence in tokens (default 8192)\n"
            "  --kv-budget MB KV pool budget (default: exactly what CTX tokens need)\n"
            "  --chat         wrap the prompt in the ChatML template of SmolLM2\n");
}

/* Options. Three are for tests and left out of --help:
 *   --prompt-ids LIST  comma-separated token ids instead of -p text
 *   --ids-out FILE     the generated ids, comma-separated (stop token included)
 *   --logits-out FILE  the last prompt position's logits, raw float32 [n_vocab] */
typedef struct opts {
    const char *model;
    const char *prompt;
    const char *prompt_ids; /* hidden: comma-separated ids instead of text */
    const char *ids_out;    /* hidden: write generated ids here */
    const char *logits_out; /* hidden: float32 logits of the last prompt token */
    const char *kv;
    int         n_gen, threads, ctx, chat, have_alpha, have_budget;
    float       alpha, temp, top_p;
    double      budget_mb;
    uint64_t    seed;
} opts;

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
        static const char *const with_value[] = {
            "-m", "--model", "-p", "--prompt", "--prompt-ids", "--ids-out", "--logits-out",
            "--kv", "-n", "-t", "--threads", "-c", "--ctx", "--alpha", "--temp", "--top-p",
            "--seed", "--kv-budget", NULL};
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
        else if (!strcmp(a, "--kv")) o->kv = v;
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
    if (!o->prompt && !o->prompt_ids) {
        fprintf(stderr, "kittykv " CMD ": -p PROMPT is required (see --help)\n");
        return 2;
    }
    if (o->prompt && o->prompt_ids) {
        fprintf(stderr, "kittykv " CMD ": give -p or --prompt-ids, not both\n");
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
        s = kkv_tokenize(m, *ids, cap, n, text, len, 1, o->chat);
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

typedef struct run_state {
    kkv_model  *model;
    kkv_cache  *cache;
    int32_t    *prompt;   /* [n_prompt] */
    int32_t    *gen;      /* [n_gen + 1] */
    float      *logits;   /* [n_vocab] */
    cli_sampler sampler;
} run_state;

static void run_free(run_state *r) {
    cli_sampler_free(&r->sampler);
    free(r->logits);
    free(r->gen);
    free(r->prompt);
    kkv_cache_free(r->cache);
    kkv_model_free(r->model);
}

static int fail(const char *what) {
    fprintf(stderr, "kittykv " CMD ": %s%s%s\n", what ? what : "", what ? ": " : "",
            kkv_last_error());
    return 1;
}

static int generate(const opts *o, run_state *r) {
    kkv_method method;
    if (kkv_method_from_name(&method, o->kv) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": unknown --kv method '%s' (one of:", o->kv);
        for (const char *const *n = kkv_method_names(); *n; n++) fprintf(stderr, " %s", *n);
        fprintf(stderr, ")\n");
        return 2;
    }
    if (o->have_alpha) method.alpha = o->alpha;

    if (kkv_model_load(&r->model, o->model, o->threads) != KKV_OK) return fail(NULL);
    kkv_model_info info;
    kkv_model_get_info(r->model, &info);
    if (kkv_method_check(&method, info.head_dim) != KKV_OK) return fail("--kv");

    int n_prompt, rc = prompt_tokens(o, r->model, &r->prompt, &n_prompt);
    if (rc) return rc;
    if ((long)n_prompt + o->n_gen > o->ctx) {
        fprintf(stderr, "kittykv " CMD ": the prompt (%d token(s)) plus %d new tokens exceed the "
                "context of %d tokens (-c)\n", n_prompt, o->n_gen, o->ctx);
        return 1;
    }

    kkv_cache_config cfg = kkv_model_cache_config(r->model, &method, 0);
    cfg.max_tokens = o->ctx;
    if (o->have_budget) cfg.pool_bytes = (size_t)(o->budget_mb * 1048576.0);
    else if (budget_for_ctx(&cfg.pool_bytes, &cfg, o->ctx) != KKV_OK)
        return fail("sizing the KV pool");
    if (kkv_cache_create(&r->cache, &cfg) != KKV_OK) return fail("creating the KV cache");
    int seq;
    if (kkv_seq_add(r->cache, &seq) != KKV_OK) return fail("KV pool too small");
    /* Everything the run can need, up front: a pool or context that is too
     * small is one clear error before any output. */
    if (kkv_seq_reserve(r->cache, seq, n_prompt + o->n_gen) != KKV_OK)
        return fail("context too long for the KV pool");

    r->logits = malloc((size_t)info.n_vocab * sizeof *r->logits);
    r->gen = malloc(((size_t)o->n_gen + 1) * sizeof *r->gen);
    if (!r->logits || !r->gen) return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
    cli_sampler_init(&r->sampler, o->temp, o->top_p, o->seed);

    double t0 = cli_now();
    if (kkv_model_forward(r->model, r->cache, r->logits, seq, r->prompt, n_prompt, 0) != KKV_OK)
        return fail("prefill");
    double t_prefill = cli_now() - t0;
    if (o->logits_out && write_logits(o->logits_out, r->logits, info.n_vocab)) return 1;

    utf8_stream u8;
    utf8_stream_init(&u8);
    char tail[3];
    int n_out = 0, n_decode = 0, stopped = 0;
    double t_decode = 0.0;
    while (n_out < o->n_gen) {
        int32_t tok = cli_sample(&r->sampler, r->logits, info.n_vocab);
        if (tok < 0) return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
        r->gen[n_out++] = tok;
        if (tok == info.eos || tok == info.eot) {
            stopped = 1;
            break;
        }
        emit(r->model, &u8, tok);
        if (n_out == o->n_gen) break;
        double t1 = cli_now();
        if (kkv_model_forward(r->model, r->cache, r->logits, seq, &tok, 1, 0) != KKV_OK) {
            fputc('\n', stdout);
            return fail("decode");
        }
        t_decode += cli_now() - t1;
        n_decode++;
    }
    fwrite(tail, 1, utf8_stream_flush(&u8, tail), stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (o->ids_out) print_ids(o->ids_out, r->gen, n_out);

    kkv_mem mem;
    if (kkv_seq_mem(r->cache, &mem, seq) != KKV_OK) return fail("memory report");
    int held = kkv_seq_len(r->cache, seq, 0);
    double fp16_bytes = 2.0 * 2.0 * held * info.n_layers * info.n_kv_heads * info.head_dim;
    char threads_str[16];
    if (o->threads) snprintf(threads_str, sizeof threads_str, "%d", o->threads);
    else snprintf(threads_str, sizeof threads_str, "all");
    fprintf(stderr, "\nmodel: %s (%s, %d layers)  kv: %s  alpha: %g  threads: %s\n",
            info.name[0] ? info.name : o->model, info.arch, info.n_layers, o->kv,
            (double)method.alpha, threads_str);
    fprintf(stderr, "prompt: %d tokens, %.1f tok/s (%.3f s)\n", n_prompt,
            t_prefill > 0 ? n_prompt / t_prefill : 0.0, t_prefill);
    fprintf(stderr, "generated: %d tokens%s, decode %.1f tok/s (%d steps, %.3f s)\n",
            n_out - stopped, stopped ? " (end of turn)" : "",
            t_decode > 0 ? n_decode / t_decode : 0.0, n_decode, t_decode);
    fprintf(stderr, "KV cache: %d tokens, %llu bytes, %.3f bits/element; fp16 would need "
            "%.0f bytes (%.2fx)\n", held, (unsigned long long)mem.total, mem.bits_per_element,
            fp16_bytes, mem.total ? fp16_bytes / (double)mem.total : 0.0);
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
