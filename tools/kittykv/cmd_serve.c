/* kittykv serve: an OpenAI-compatible HTTP server with continuous batching
 * over one quantized KV pool. Start-up and shutdown; the scheduler is
 * serve_sched.c, the endpoints serve_http.c. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "serve.h"
#include "util.h"

#define CMD "serve"

static void usage(FILE *f) {
    fprintf(f,
            "usage: kittykv serve [options]\n"
            "OpenAI-compatible server: POST /v1/chat/completions, /v1/completions,\n"
            "GET /v1/models, /health, /metrics. Continuous batching on one KV pool.\n"
            "  -m MODEL            GGUF (default: %s)\n"
            "  --host ADDR         IPv4 address to bind (default 127.0.0.1)\n"
            "  --port N            TCP port (default 8080)\n"
            "  --kv SPEC           KV cache method (default kitty)\n"
            "  --kv-budget MB      KV pool budget in MiB for all requests (default 256)\n"
            "  -c, --ctx N         tokens per sequence, prompt + output (default: the\n"
            "                      model's training context, at most 8192)\n"
            "  -t THREADS          threads (default: all cores)\n"
            "  --api-key KEY       require 'Authorization: Bearer KEY' on /v1/*\n"
            "  --parallel N        sequences decoded together at most (default 64)\n"
            "  --queue N           requests waiting beyond the free batch slots (default 64)\n"
            "  --queue-timeout S   seconds a request may wait in the queue (default 30)\n"
            "  --chunk N           prompt tokens prefilled per step (default 16)\n"
            "  --body-limit KB     largest request body (default 1024)\n"
            "  --max-conn N        open connections at most (default 256)\n"
            "  --chat-template T   override the GGUF's template (known: chatml)\n",
            cli_default_model());
}

typedef struct serve_opts {
    const char *model, *host, *kv, *api_key, *chat_template;
    int port, budget_mb, ctx, threads, parallel, queue, chunk, body_kb, max_conn;
    float queue_timeout;
} serve_opts;

static int parse(serve_opts *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->model = cli_default_model();
    o->host = "127.0.0.1";
    o->kv = "kitty";
    o->port = 8080;
    o->budget_mb = 256;
    o->threads = kkv_cpu_count();
    o->parallel = 64;
    o->queue = 64;
    o->queue_timeout = 30;
    o->chunk = 16;
    o->body_kb = 1024;
    o->max_conn = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = 0;
        if (!v) {
            fprintf(stderr, "kittykv " CMD ": %s needs a value (kittykv serve --help)\n", a);
            return -1;
        }
        if (!strcmp(a, "-m")) o->model = v;
        else if (!strcmp(a, "--host")) o->host = v;
        else if (!strcmp(a, "--kv")) o->kv = v;
        else if (!strcmp(a, "--api-key")) o->api_key = v;
        else if (!strcmp(a, "--chat-template")) o->chat_template = v;
        else if (!strcmp(a, "--port")) r = cli_int(&o->port, v, 1, 65535, CMD, a);
        else if (!strcmp(a, "--kv-budget")) r = cli_int(&o->budget_mb, v, 1, 1 << 20, CMD, a);
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx")) r = cli_int(&o->ctx, v, 8, 1 << 20, CMD, a);
        else if (!strcmp(a, "-t")) r = cli_int(&o->threads, v, 1, 1024, CMD, a);
        else if (!strcmp(a, "--parallel")) r = cli_int(&o->parallel, v, 1, 4096, CMD, a);
        else if (!strcmp(a, "--queue")) r = cli_int(&o->queue, v, 0, 1 << 20, CMD, a);
        else if (!strcmp(a, "--queue-timeout"))
            r = cli_float(&o->queue_timeout, v, 0.01, 86400, CMD, a);
        else if (!strcmp(a, "--chunk")) r = cli_int(&o->chunk, v, 1, 1 << 16, CMD, a);
        else if (!strcmp(a, "--body-limit")) r = cli_int(&o->body_kb, v, 1, 1 << 20, CMD, a);
        else if (!strcmp(a, "--max-conn")) r = cli_int(&o->max_conn, v, 1, 1 << 16, CMD, a);
        else {
            fprintf(stderr, "kittykv " CMD ": unknown option '%s' (kittykv serve --help)\n", a);
            return -1;
        }
        if (r) return -1;
        i++;
    }
    return 0;
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
    if (parse(&o, argc, argv)) return 2;
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
    cfg.max_seqs = o.parallel;
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
            "threads=%d\n", s.model_id, o.host, o.port, spec, o.budget_mb, s.ctx, o.parallel,
            o.threads);
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
    kkv_threadpool_free(tp);
    kkv_model_free(s.vocab);
    kkv_model_free(s.model);
    return rc;
}
