/* kittykv chat: a multi-turn conversation on one cached sequence. Each line
 * of stdin is a user message; the reply streams to stdout. The conversation
 * stays in the KV cache between turns: a turn forwards only its new tokens
 * (the close of the previous reply, the user's turn and the assistant's
 * opening, as the model's chat template writes them), never the earlier
 * turns again.
 *
 * The new text of turn k is what the template adds when the conversation
 * grows by one user message: format(messages + [user], gen) minus
 * format(messages) (every family here only appends), preceded by the part of
 * the last assistant turn's closing the cache does not hold yet: what the
 * template writes after the end-of-turn token the reply stopped on (ChatML's
 * "\n"), or that token too when the reply was cut at -n. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"
#include "kittykv.h"
#include "kittykv_eval.h"
#include "kittykv_model.h"
#include "opts.h"
#include "util.h"

#define CMD "chat"

typedef struct conv {
    kkv_chat_msg *msgs; /* [n] roles static, contents owned */
    int           n, cap;
} conv;

static int conv_add(conv *c, const char *role, const char *content, size_t len) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        kkv_chat_msg *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (!m) return 1;
        c->msgs = m;
        c->cap = cap;
    }
    char *s = malloc(len + 1);
    if (!s) return 1;
    memcpy(s, content, len);
    s[len] = 0;
    c->msgs[c->n++] = (kkv_chat_msg){role, s};
    return 0;
}

static void conv_free(conv *c) {
    for (int i = 0; i < c->n; i++) free((char *)c->msgs[i].content);
    free(c->msgs);
}

/* The formatted text of c's first n messages, malloc'd, or NULL (message printed). */
static char *format(const kkv_model *m, const conv *c, int n, int gen, const char *tmpl, size_t *len) {
    size_t need = 0;
    char *buf = NULL;
    kkv_status s = kkv_chat_format(m, NULL, 0, &need, c->msgs, n, gen, tmpl);
    if (s == KKV_ERR_INVALID_ARG && need > 0) {
        buf = malloc(need + 1);
        if (buf) s = kkv_chat_format(m, buf, need + 1, &need, c->msgs, n, gen, tmpl);
    }
    if (s != KKV_OK) {
        fprintf(stderr, "kittykv " CMD ": %s\n", need > 0 && !buf ? "out of memory" : kkv_last_error());
        free(buf);
        return NULL;
    }
    *len = need;
    return buf;
}

/* Last occurrence of needle [nl] in hay [hl], or -1. */
static long rfind(const char *hay, size_t hl, const char *needle, size_t nl) {
    if (nl == 0 || nl > hl) return -1;
    for (size_t i = hl - nl + 1; i-- > 0;)
        if (!memcmp(hay + i, needle, nl)) return (long)i;
    return -1;
}

typedef struct opts {
    const char *model, *kv, *system, *tmpl, *ids_out;
    int         n_gen, ctx, threads, stats;
    float       temp, top_p;
    uint64_t    seed;
} opts;

static const char *const EPILOG =
    "One user message per stdin line (empty lines are skipped; EOF ends). The\n"
    "conversation stays in the KV cache: each turn forwards only its new tokens.\n";

/* Returns 0, or the exit status (2 usage, -1 for --help) to stop with. */
static int parse(opts *o, int argc, char **argv) {
    *o = (opts){.kv = "kitty", .n_gen = 256, .ctx = 4096, .temp = 0.0f, .top_p = 0.95f, .seed = 42};
    const opt_def defs[] = {
        {'m', "model", OPT_STRING, 0, 0, &o->model, NULL, "MODEL",
         "GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf or $KKV_MODEL)"},
        {0, "kv", OPT_SPEC, 0, 0, &o->kv, NULL, "SPEC", "KV cache method spec (default kitty)"},
        {'n', "n-predict", OPT_INT, 1, 1 << 20, &o->n_gen, NULL, "N", "most tokens per reply (default 256)"},
        {'c', "ctx-size|ctx", OPT_INT, 1, 1 << 24, &o->ctx, NULL, "N",
         "context of the whole conversation in tokens (default 4096)"},
        {0, "system", OPT_STRING, 0, 0, &o->system, NULL, "TEXT", "a system message first"},
        {0, "chat-template", OPT_STRING, 0, 0, &o->tmpl, NULL, "NAME",
         "chatml, llama3, gemma, llama2 or mistral instead of the model's own"},
        {0, "temp", OPT_FLOAT, 0, 100, &o->temp, NULL, "T", "sampling temperature (default 0 = greedy)"},
        {0, "top-p", OPT_FLOAT, 1e-6, 1, &o->top_p, NULL, "P", "nucleus mass, (0, 1] (default 0.95)"},
        {'s', "seed", OPT_U64, 0, 18446744073709551615.0, &o->seed, NULL, "S", "sampler seed (default 42)"},
        {'t', "threads", OPT_INT, 1, CLI_MAX_THREADS, &o->threads, NULL, "N", "threads (default: all cores)"},
        {0, "stats", OPT_FLAG, 0, 0, &o->stats, NULL, NULL,
         "per turn on stderr: tokens forwarded, tokens in the cache"},
        {0, "ids-out", OPT_STRING, 0, 0, &o->ids_out, NULL, "FILE",
         "every token the cache holds at the end, comma-separated"},
    };
    int rc = opts_run(CMD, "[-m MODEL] [options] < lines", defs, OPTS_N(defs), EPILOG, argc, argv);
    if (rc) return rc;
    if (!o->model) o->model = cli_default_model();
    return 0;
}

typedef struct state {
    kkv_model   *m;
    kkv_cache   *cache;
    kkv_sampler *smp;
    float       *logits; /* [n_vocab] */
    int32_t     *held;   /* [ctx] every token in the cache, in order */
    int          n_held;
    conv         c;
} state;

static int fail(const char *what) {
    fprintf(stderr, "kittykv " CMD ": %s: %s\n", what, kkv_last_error());
    return 1;
}

/* Forwards ids [n] (appending them to held); logits of the last. */
static int feed(state *st, const opts *o, int seq, const int32_t *ids, int n) {
    if (st->n_held + n > o->ctx) {
        fprintf(stderr, "kittykv " CMD ": the conversation exceeds the context of %d tokens (-c)\n", o->ctx);
        return 1;
    }
    if (kkv_model_forward(st->m, st->cache, st->logits, seq, ids, n, 0) != KKV_OK) return fail("forward");
    memcpy(st->held + st->n_held, ids, (size_t)n * sizeof *ids);
    st->n_held += n;
    return 0;
}

static int run(state *st, const opts *o) {
    if (kkv_model_load(&st->m, o->model, cli_threads(o->threads, CMD)) != KKV_OK) return fail(o->model);
    kkv_model_info info;
    kkv_model_get_info(st->m, &info);
    kkv_method method;
    if (kkv_method_parse(&method, o->kv) != KKV_OK) return fail("--kv");
    if (kkv_method_check(&method, info.head_dim) != KKV_OK) return fail("--kv");
    kkv_cache_config cfg = kkv_model_cache_config(st->m, &method, 0);
    cfg.max_tokens = o->ctx;
    if (kkv_eval_pool_bytes(&cfg.pool_bytes, &cfg, o->ctx) != KKV_OK) return fail("sizing the KV pool");
    if (kkv_cache_create(&st->cache, &cfg) != KKV_OK) return fail("creating the KV cache");
    int seq;
    if (kkv_seq_add(st->cache, &seq) != KKV_OK) return fail("KV pool");
    kkv_sampler_params sp = kkv_sampler_defaults();
    sp.temp = o->temp;
    sp.top_p = o->top_p;
    sp.seed = o->seed;
    if (kkv_sampler_create(&st->smp, &sp) != KKV_OK) return fail("sampler");
    st->logits = malloc((size_t)info.n_vocab * sizeof *st->logits);
    st->held = malloc((size_t)o->ctx * sizeof *st->held);
    if (!st->logits || !st->held) return fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
    if (o->system && conv_add(&st->c, "system", o->system, strlen(o->system))) return 1;
    /* the format must be usable before the first line is read */
    size_t l0;
    char *probe = format(st->m, &st->c, st->c.n, 1, o->tmpl, &l0);
    if (!probe) return 1;
    free(probe);

    int tty = isatty(0), turn = 0, stopped = 0;
    int32_t stop_tok = -1;
    char *line = NULL;
    size_t cap = 0;
    for (;;) {
        if (tty) fputs("> ", stderr);
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (memchr(line, 0, (size_t)got)) {
            fprintf(stderr, "kittykv " CMD ": a message cannot hold NUL bytes\n");
            free(line);
            return 1;
        }
        int n_before = st->c.n;
        if (conv_add(&st->c, "user", line, (size_t)got)) break;
        size_t pl = 0, fl = 0;
        char *prev = NULL, *full = format(st->m, &st->c, st->c.n, 1, o->tmpl, &fl);
        if (!full) return free(line), 1;
        const char *delta = full;
        size_t dl = fl;
        char *joined = NULL;
        if (turn > 0) {
            prev = format(st->m, &st->c, n_before, 0, o->tmpl, &pl);
            if (!prev) return free(line), free(full), 1;
            if (pl > fl || memcmp(prev, full, pl) != 0) {
                fprintf(stderr, "kittykv " CMD ": the template rewrites earlier turns; cannot continue "
                        "the cached conversation\n");
                return free(line), free(full), free(prev), 1;
            }
            /* the closing of the last reply that the cache does not hold */
            char piece[256];
            size_t ml = 0;
            int32_t mark = stopped ? stop_tok : info.eot >= 0 ? info.eot : info.eos;
            long at = -1;
            if (mark >= 0 && kkv_token_piece(st->m, piece, sizeof piece, &ml, mark) == KKV_OK)
                at = rfind(prev, pl, piece, ml);
            size_t from = at < 0 ? pl : (size_t)at + (stopped ? ml : 0);
            joined = malloc(pl - from + fl - pl + 1);
            if (!joined) return free(line), free(full), free(prev), 1;
            memcpy(joined, prev + from, pl - from);
            memcpy(joined + (pl - from), full + pl, fl - pl);
            delta = joined;
            dl = pl - from + fl - pl;
        }
        int32_t *ids = NULL;
        int n_ids = 0;
        kkv_status s = kkv_tokenize_alloc(st->m, &ids, &n_ids, delta, dl, turn == 0, 1);
        free(full);
        free(prev);
        free(joined);
        if (s != KKV_OK) return free(line), fail("tokenize");
        int rc = n_ids > 0 ? feed(st, o, seq, ids, n_ids) : 0;
        free(ids);
        if (rc) return free(line), rc;

        /* the reply */
        kkv_utf8_stream u8;
        kkv_utf8_stream_init(&u8);
        char out[KKV_UTF8_STREAM_BOUND(256)];
        size_t rcap = 256, rl = 0;
        char *reply = malloc(rcap);
        int n_gen = 0;
        stopped = 0;
        while (reply && n_gen < o->n_gen) {
            int32_t tok;
            if (kkv_sampler_sample(st->smp, &tok, st->logits, info.n_vocab) != KKV_OK)
                return free(line), free(reply), fail("sampling");
            n_gen++;
            if (tok == info.eos || tok == info.eot) {
                stopped = 1;
                stop_tok = tok;
            } else {
                char piece[256];
                size_t pn = 0;
                if (kkv_token_piece(st->m, piece, sizeof piece, &pn, tok) == KKV_OK) {
                    fwrite(out, 1, kkv_utf8_stream_feed(&u8, out, piece, pn), stdout);
                    fflush(stdout);
                    if (rl + pn + 1 > rcap) {
                        rcap = 2 * (rl + pn + 1);
                        char *r2 = realloc(reply, rcap);
                        if (!r2) break;
                        reply = r2;
                    }
                    memcpy(reply + rl, piece, pn);
                    rl += pn;
                }
            }
            /* the token joins the cache (a stop token too: it closes the turn) */
            if ((rc = feed(st, o, seq, &tok, 1)) != 0) return free(line), free(reply), rc;
            if (stopped) break;
        }
        if (!reply) return free(line), fprintf(stderr, "kittykv " CMD ": out of memory\n"), 1;
        fwrite(out, 1, kkv_utf8_stream_flush(&u8, out), stdout);
        fputc('\n', stdout);
        fflush(stdout);
        if (memchr(reply, 0, rl)) rl = strlen(reply); /* a NUL piece: keep the text before it */
        rc = conv_add(&st->c, "assistant", reply, rl);
        free(reply);
        if (rc) break;
        turn++;
        if (o->stats)
            fprintf(stderr, "turn %d: forwarded %d prompt + %d reply tokens%s; cache holds %d tokens\n", turn,
                    n_ids, n_gen, stopped ? " (end of turn)" : "", kkv_seq_len(st->cache, seq, 0));
    }
    free(line);
    if (o->ids_out) {
        FILE *f = fopen(o->ids_out, "w");
        if (!f) return fprintf(stderr, "kittykv " CMD ": cannot write %s\n", o->ids_out), 1;
        for (int i = 0; i < st->n_held; i++) fprintf(f, i ? ",%d" : "%d", (int)st->held[i]);
        fputc('\n', f);
        if (fclose(f) != 0) return 1;
    }
    return 0;
}

int cmd_chat(int argc, char **argv) {
    opts o;
    int rc = parse(&o, argc, argv);
    if (rc) return rc < 0 ? 0 : rc;
    state st;
    memset(&st, 0, sizeof st);
    rc = run(&st, &o);
    conv_free(&st.c);
    free(st.logits);
    free(st.held);
    kkv_sampler_free(st.smp);
    kkv_cache_free(st.cache);
    kkv_model_free(st.m);
    return rc;
}
