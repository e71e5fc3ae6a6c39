/* kittykv serve: an OpenAI-compatible HTTP server with continuous batching
 * over one quantized KV pool. Start-up and shutdown; the scheduler is
 * serve_sched.c, the endpoints serve_http.c. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "opts.h"
#include "serve.h"
#include "util.h"

#define CMD "serve"

typedef struct serve_opts {
    const char *model, *host, *kv, *api_key, *chat_template;
    int port, budget_mb, ctx, threads, parallel, queue, chunk, body_kb, max_conn, prefix;
    float queue_timeout;
} serve_opts;

static const char *const SYNOPSIS = "[-m MODEL] [--port N] [--kv SPEC] [--kv-budget MB] [options]";
static const char *const EPILOG =
    "Endpoints: POST /v1/chat/completions, /v1/completions (stream via SSE),\n"
    "GET /v1/models, /health, /metrics (Prometheus text). All requests share one\n"
    "KV pool of --kv-budget MiB; each scheduler step decodes one token for every\n"
    "active request in one batch and prefills --chunk prompt tokens.\n";

/* Returns 0, or the exit status (2 usage, -1 for --help) to stop with. */
static int parse(serve_opts *o, int argc, char **argv) {
    *o = (serve_opts){.model = NULL, .host = "127.0.0.1", .kv = "kitty", .port = 8080,
                      .budget_mb = 256, .threads = kkv_cpu_count(), .parallel = 64,
                      .queue = 64, .queue_timeout = 30, .chunk = 16, .body_kb = 1024,
                      .max_conn = 256, .prefix = 8};
    if (o->threads > CLI_MAX_THREADS) o->threads = CLI_MAX_THREADS;
    const opt_def defs[] = {
        {'m', "model", OPT_STRING, 0, 0, &o->model, NULL, "MODEL",
         "GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf or $KKV_MODEL)"},
        {0, "host", OPT_STRING, 0, 0, &o->host, NULL, "ADDR",
         "IPv4 address to bind (default 127.0.0.1)"},
        {0, "port", OPT_INT, 1, 65535, &o->port, NULL, "N", "TCP port (default 8080)"},
        {0, "kv", OPT_SPEC, 0, 0, &o->kv, NULL, "SPEC", "KV cache method spec (default kitty)"},
        {0, "kv-budget", OPT_INT, 1, 1 << 20, &o->budget_mb, NULL, "MB",
         "KV pool budget in MiB shared by all requests (default 256)"},
        {'c', "ctx-size|ctx", OPT_INT, 8, 1 << 20, &o->ctx, NULL, "N",
         "tokens per sequence, prompt + output (default: the model's\n"
         "training context, at most 8192)"},
        {'t', "threads", OPT_INT, 1, CLI_MAX_THREADS, &o->threads, NULL, "N",
         "threads (default: all cores); one pool for model and cache"},
        {0, "api-key", OPT_STRING, 0, 0, &o->api_key, NULL, "KEY",
         "require 'Authorization: Bearer KEY' on /v1/*"},
        {0, "parallel", OPT_INT, 1, 4096, &o->parallel, NULL, "N",
         "sequences decoded together at most (default 64)"},
        {0, "queue", OPT_INT, 0, 1 << 20, &o->queue, NULL, "N",
         "requests waiting beyond the free batch slots (default 64);\n"
         "past that: HTTP 503"},
        {0, "queue-timeout", OPT_FLOAT, 0.01, 86400, &o->queue_timeout, NULL, "S",
         "seconds a request may wait for KV memory (default 30); then 503"},
        {0, "chunk", OPT_INT, 1, 1 << 16, &o->chunk, NULL, "N",
         "prompt tokens prefilled per step (default 16)"},
        {0, "body-limit", OPT_INT, 1, 1 << 20, &o->body_kb, NULL, "KB",
         "largest request body in KiB (default 1024); past that: 413"},
        {0, "max-conn", OPT_INT, 1, 1 << 16, &o->max_conn, NULL, "N",
         "open connections at most (default 256)"},
        {0, "prefix-cache", OPT_INT, 0, 4096, &o->prefix, NULL, "N",
         "prefix-cache entries: finished requests (a conversation's next\n"
         "turn starts with them) and prompt prefixes (a system prompt's end,\n"
         "the earlier turns, a prefix two prompts share); a prompt that\n"
         "starts with all of an entry's tokens forks its pages; evicted LRU\n"
         "when the pool needs room (default 8, 0: off)"},
        {0, "chat-template", OPT_STRING, 0, 0, &o->chat_template, NULL, "NAME",
         "template family instead of the GGUF's own (kittykv tokenize\n"
         "--help lists them)"},
    };
    int rc = opts_run(CMD, SYNOPSIS, defs, OPTS_N(defs), EPILOG, argc, argv);
    if (!o->model) o->model = cli_default_model();
    return rc;
}

static void model_id(char *out, size_t cap, const char *path) {
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    size_t n = strlen(b);
    if (n > 5 && !strcmp(b + n - 5, ".gguf")) n -= 5;
    snprintf(out, cap, "%.*s", (int)n, b);
}

int cmd_serve(int argc, char **argv) {
    serve_opts o;
    int prc = parse(&o, argc, argv);
    if (prc) return prc < 0 ? 0 : prc;
    kkv_method method;
    if (kkv_method_parse(&method, o.kv) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": --kv '%s': %s\n", o.kv, kkv_last_error());
        return 2;
    }
    /* Signals go to the main thread's sigwait only: block them before any
     * thread starts, so every thread inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    static srv s; /* static: the HTTP threads may outlive a stack frame's idea of it */
    memset(&s, 0, sizeof s);
    kkv_threadpool *tp = NULL;
    srv_http *http = NULL;
    int rc = 1, started = 0;
    char err[300];
    if (kkv_model_load(&s.model, o.model, 1) != KKV_OK ||
        kkv_model_load_vocab(&s.vocab, o.model, NULL) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s: %s\n", o.model, kkv_last_error());
        goto out;
    }
    kkv_model_get_info(s.model, &s.info);
    if (srv_chat_init(&s, o.chat_template, err, sizeof err)) {
        fprintf(stderr, "kittykv " CMD ": %s\n", err);
        rc = 2;
        goto out;
    }
    s.ctx = o.ctx ? o.ctx : (s.info.n_ctx_train > 0 && s.info.n_ctx_train < 8192
                                 ? s.info.n_ctx_train : 8192);
    s.parallel = o.parallel;
    s.queue_max = o.queue;
    s.queue_timeout_s = o.queue_timeout;
    s.chunk = o.chunk;
    model_id(s.model_id, sizeof s.model_id, o.model);
    kkv_cache_config cfg = kkv_model_cache_config(s.model, &method, (size_t)o.budget_mb << 20);
    cfg.max_seqs = o.parallel + o.prefix;
    s.pc_max = o.prefix;
    s.pc = calloc((size_t)o.prefix + 1, sizeof *s.pc);
    if (!s.pc) {
        fprintf(stderr, "kittykv " CMD ": out of memory\n");
        goto out;
    }
    cfg.max_tokens = s.ctx;
    cfg.n_threads = 1; /* attention runs on the shared pool set below */
    if (kkv_threadpool_create(&tp, o.threads) != KKV_OK ||
        kkv_cache_create(&s.cache, &cfg) != KKV_OK ||
        kkv_cache_set_threadpool(s.cache, tp) != KKV_OK ||
        kkv_model_set_threadpool(s.model, tp) != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", kkv_last_error());
        goto out;
    }
    if (srv_start(&s)) {
        fprintf(stderr, "kittykv " CMD ": cannot start the scheduler thread\n");
        goto out;
    }
    started = 1;
    if (srv_http_start(&http, &s, o.host, o.port, o.api_key, (size_t)o.body_kb << 10,
                       o.max_conn))
        goto out;
    char spec[128];
    kkv_method_format(spec, sizeof spec, NULL, &method);
    fprintf(stderr, "kittykv serve: %s on http://%s:%d  kv=%s budget=%d MiB ctx=%d parallel=%d "
            "threads=%d chat=%s\n", s.model_id, o.host, o.port, spec, o.budget_mb, s.ctx,
            o.parallel, o.threads, s.chat_template);
    fflush(stderr);
    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "kittykv serve: signal %d, shutting down\n", sig);
    rc = 0;
out:
    if (started) srv_stop(&s); /* wakes every waiting handler with a 503 */
    srv_http_stop(http);
    if (started) {
        pthread_mutex_destroy(&s.mu);
        pthread_mutex_destroy(&s.tok_mu);
        pthread_cond_destroy(&s.wake);
    }
    kkv_cache_free(s.cache);
    free(s.pc);
    kkv_threadpool_free(tp);
    kkv_model_free(s.vocab);
    kkv_model_free(s.model);
    return rc;
}
