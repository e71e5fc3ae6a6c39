/* kittykv serve: shared declarations of the scheduler (serve_sched.c), the
 * HTTP front end (serve_http.c), request parsing (serve_req.c), chat templates
 * (serve_chat.c) and the command (cmd_serve.c). One scheduler thread owns
 * the model and the cache; HTTP threads only submit requests and read their
 * published text, under srv.mu. */
#ifndef KKV_SERVE_H
#define KKV_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_model.h"

#define SRV_MAX_STOP 4
#define SRV_MAX_STOP_LEN 256
#define SRV_MAX_CUTS 4
/* A prompt that parts from an entry within its own tokens, after sharing at
 * least this many tokens more than it reuses, keeps the shared part as an
 * entry of its own: the second user of a system prompt makes it reusable for
 * everyone after. */
#define SRV_PREFIX_MIN 16

enum { REQ_QUEUED = 0, REQ_PREFILL = 1, REQ_DECODE = 2, REQ_DONE = 3 };

typedef struct srv_req srv_req;
struct srv_req {
    /* set by the submitter, read-only afterwards */
    int32_t           *prompt;  /* [n_prompt] token ids, owned */
    int                n_prompt;
    int                max_tokens;
    kkv_sampler_params sp;
    char              *stop[SRV_MAX_STOP]; /* owned, NUL-terminated */
    int                n_stop;
    int                ignore_eos; /* keep going past EOS/EOT (benchmarks, tests) */
    int                cache_prompt; /* 0: neither look up nor keep prefix entries */
    int                cuts[SRV_MAX_CUTS]; /* [n_cuts] ascending prompt positions in
                                      * [1, n_prompt) where the prefix so far is kept
                                      * as an entry (a system prompt's end, the turns
                                      * before the last message) */
    int                n_cuts;
    double             t_submit; /* monotonic seconds */

    /* shared: read and written under srv.mu */
    int         state;
    int         cancelled;   /* the client went away: free the sequence now */
    int         refs;        /* HTTP side + scheduler; freed at 0 */
    char       *text;        /* [text_len] generated UTF-8 (stop-truncated), owned */
    size_t      text_len, text_cap;
    size_t      emit_len;    /* prefix of text that can be sent (no stop can start in it) */
    int         n_gen;       /* tokens generated */
    const char *finish;      /* "stop" / "length" once done, static string */
    int         err_status;  /* HTTP status of a rejection (503, 500), 0 if none */
    char        err_msg[200];
    double      t_first;     /* first token, monotonic seconds (0: none yet) */
    pthread_cond_t cv;       /* signalled whenever text/state changes */

    /* scheduler-private */
    int             seq;
    int             n_fed;   /* prompt tokens already prefilled */
    int32_t         last;    /* token to feed at the next decode step */
    int32_t        *gen;     /* [gen_cap] tokens generated, for the prefix cache */
    int             gen_cap;
    int             reused;  /* prompt tokens that came from the prefix cache */
    int             cut_i;   /* next of cuts[] still ahead of n_fed */
    kkv_sampler    *smp;
    kkv_utf8_stream u8;
    srv_req        *next;    /* queue / active list link */
};

typedef struct srv_metrics {
    uint64_t req_by_status[6]; /* 200, 400, 401, 404/405, 413, 503/500 */
    uint64_t prompt_tokens, gen_tokens, decode_steps, prefill_chunks;
    uint64_t finished_stop, finished_length, cancelled;
    uint64_t prefix_hits, prefix_misses, prefix_tokens_reused, prefix_evictions;
    uint64_t prefix_bytes;     /* pool bytes held by prefix-cache entries (pages they
                                  share counted once: kkv_seqs_mem) */
    uint64_t request_bytes;    /* pool bytes held by active requests (the same way) */
    uint64_t prefix_forks;     /* entries made at a prompt's cut */
    int      prefix_entries;
    double   decode_tps;       /* tokens/s of recent decode steps (moving average) */
    kkv_mem  mem;              /* snapshot of kkv_cache_mem after the last step */
    uint64_t pool_free;
    int      active, queued;
} srv_metrics;

/* A sequence kept in the pool with the tokens it holds: a finished request
 * (prompt + answer: the conversation's next turn starts with them) or a
 * prompt's prefix forked off at one of its cuts (a shared system prompt). A
 * later prompt that starts with all of an entry's tokens forks the entry
 * (kkv_seq_fork: written pages are shared, not copied) and prefills only the
 * rest; the entry stays for the next user. Least recently used entries are
 * freed when the pool needs room. */
typedef struct srv_prefix {
    int      seq;
    int32_t *tokens; /* [n] owned */
    int      n;
    uint64_t last_used; /* scheduler step counter, for LRU */
} srv_prefix;

typedef struct srv {
    /* configuration */
    kkv_model      *model;     /* used by the scheduler thread only */
    kkv_model      *vocab;     /* tokenizer for HTTP threads, under tok_mu */
    pthread_mutex_t tok_mu;
    kkv_cache      *cache;
    kkv_model_info  info;
    char            model_id[128];
    int             ctx;       /* tokens per sequence */
    int             parallel;  /* active sequences at most */
    int             queue_max;
    double          queue_timeout_s;
    int             chunk;     /* prefill tokens per step */
    const char     *chat_template; /* kkv_chat_* family name (static storage) */

    /* state under mu */
    pthread_mutex_t mu;
    pthread_cond_t  wake;      /* scheduler: new work or shutdown */
    int             stopping;
    srv_req        *queue_head, *queue_tail;
    int             n_queued;
    srv_req        *active;    /* active list (prefill or decode) */
    int             n_active;
    srv_metrics     m;
    uint64_t        next_id;
    srv_prefix     *pc;        /* [pc_max] prefix cache (scheduler thread) */
    int             pc_max, n_pc;
    uint64_t        tick;
    pthread_t       thread;
} srv;

double srv_now(void);

/* Scheduler: start/stop the thread; submit a request (takes one ref for the
 * scheduler; returns 0, or an HTTP status with msg filled when the queue is
 * full); release drops the caller's ref (and cancels it if not done). */
int  srv_start(srv *s);
void srv_stop(srv *s);
int  srv_submit(srv *s, srv_req *r, char *msg, size_t cap);
void srv_release(srv *s, srv_req *r);
srv_req *srv_req_new(void);
/* Counts a finished HTTP exchange in the metrics. */
void srv_count_status(srv *s, int status);

/* Request bodies (serve_req.c): pure, needing neither the model nor the
 * scheduler (tests/fuzz/fuzz_serve_req.c runs it alone). */
typedef struct srv_req_limits {
    int ctx; /* tokens per sequence: max_tokens >= ctx is refused; <= 0: no check */
} srv_req_limits;

typedef struct srv_parsed_req {
    int   chat;                 /* 1: /v1/chat/completions, 0: /v1/completions */
    int   stream, include_usage, ignore_eos; /* 0 or 1 */
    int   cache_prompt;         /* 0 or 1 (default 1): use and feed the prefix cache */
    int   have_max, max_tokens; /* max_tokens in [1, ctx) when have_max, else 0 */
    kkv_sampler_params sp;      /* valid for kkv_sampler_create; seed drawn if not given */
    char *stop[SRV_MAX_STOP];   /* [n_stop] owned, 1..SRV_MAX_STOP_LEN bytes each */
    int   n_stop;
    char *prompt;               /* completion: the prompt text, owned; chat: NULL */
    const char **roles;         /* chat: [n_msgs] owned array of "system", "user" or
                                 * "assistant" (static strings) */
    char **contents;            /* chat: [n_msgs] owned array of owned texts */
    int   n_msgs;               /* chat: >= 1 */
} srv_parsed_req;

typedef struct srv_req_err {
    int         status;   /* HTTP status, 400..599 */
    const char *param;    /* the offending field (static storage), or NULL */
    const char *code;     /* OpenAI error code (static storage), or NULL */
    char        msg[300]; /* one line of printable ASCII */
} srv_req_err;

/* Parses body [n] bytes (need not be NUL-terminated) as a chat or completion
 * request under lim (NULL: none). 0 with *out filled (free it with
 * srv_parsed_req_free), or the HTTP status with *e filled and nothing owned
 * in *out. Thread-safe. */
int  srv_parse_req(const char *body, size_t n, int chat, const srv_req_limits *lim,
                   srv_parsed_req *out, srv_req_err *e);
/* Frees what *o owns and zeroes it; NULL and a zeroed or freed *o are fine. */
void srv_parsed_req_free(srv_parsed_req *o);
/* After tokenizing: 0 if n_prompt tokens plus max_tokens fit in ctx, else 400
 * (context_length_exceeded) with *e filled. */
int  srv_req_fits(const srv_parsed_req *o, int n_prompt, int ctx, srv_req_err *e);

/* Chat templates (serve_chat.c). */
/* Picks the template family from the model (or the override name). 0, or -1
 * with a message in err. */
int  srv_chat_init(srv *s, const char *override_name, char *err, size_t cap);
/* The role/content turns in the template, then (gen 1) the assistant's
 * opening. roles, contents: [n]. A malloc'd NUL-terminated prompt, or NULL
 * with the reason in err. Takes tok_mu. */
char *srv_chat_render(srv *s, const char *const *roles, const char *const *contents, int n,
                      int gen, char *err, size_t cap);

/* Where a chat prompt toks [n_toks] (the n turns rendered with the
 * assistant's opening) may be cut for the prefix cache: after the leading
 * system turns (shared by users), and after all turns but the last (the
 * conversation so far). Writes at most max ascending positions in
 * [1, n_toks) to cuts; returns how many. Takes tok_mu. */
int  srv_chat_cuts(srv *s, const char *const *roles, const char *const *contents, int n,
                   const int32_t *toks, int n_toks, int *cuts, int max);

/* HTTP front end (serve_http.c). */
typedef struct srv_http srv_http;
int  srv_http_start(srv_http **out, srv *s, const char *host, int port, const char *api_key,
                    size_t body_limit, int max_conn);
void srv_http_stop(srv_http *h);

#endif
