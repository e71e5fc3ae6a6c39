/* kittykv serve: the HTTP front end on libmicrohttpd (one thread per
 * connection) with cJSON. A handler parses and validates the request,
 * tokenizes it, submits it to the scheduler and then either waits for the
 * whole answer or streams it as server-sent events, polling its socket so a
 * client that goes away frees its sequence at once. */
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

struct srv_http {
    struct MHD_Daemon *d;
    srv               *s;
    const char        *api_key; /* borrowed from argv; NULL: no check */
    size_t             body_limit;
};

typedef struct conn_ctx {
    char  *body; /* [n] request body, NUL-terminated */
    size_t n, cap;
    int    too_big;
} conn_ctx;

/* ---- responses */

static enum MHD_Result send_text(struct MHD_Connection *c, srv *s, int status,
                                 const char *ctype, const char *body) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                                                MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", ctype);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    srv_count_status(s, status);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, srv *s, int status, cJSON *j) {
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!t) return send_text(c, s, 500, "application/json",
                             "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                             "\"param\":null,\"code\":null}}");
    enum MHD_Result ret = send_text(c, s, status, "application/json", t);
    free(t);
    return ret;
}

static cJSON *error_obj(int status, const char *msg, const char *param, const char *code) {
    const char *type = status == 401 ? "authentication_error"
                     : status >= 500 ? "server_error" : "invalid_request_error";
    cJSON *j = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(j, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return j;
}

static enum MHD_Result send_error(struct MHD_Connection *c, srv *s, int status, const char *msg,
                                  const char *param, const char *code) {
    return send_json(c, s, status, error_obj(status, msg, param, code));
}

/* ---- request parsing: serve_req.c; chat turns rendered here (needs the model) */

/* The chat prompt in the model's template; NULL with err set. */
static char *chat_prompt(srv *s, const srv_parsed_req *p, char *err, size_t cap) {
    return srv_chat_render(s, p->roles, (const char *const *)p->contents, p->n_msgs, 1, err,
                           cap);
}

/* ---- peers */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* 1 when the client has closed its end (a pending request byte is not that). */
static int peer_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) return 1;
    char ch;
    ssize_t r = recv(fd, &ch, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void deadline_in(struct timespec *ts, long ms) {
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_nsec += ms * 1000000L;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

/* ---- answers */

static cJSON *usage_obj(const srv_req *r) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", r->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", r->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", r->n_prompt + r->n_gen);
    return u;
}

/* One chunk or whole answer. text [n] (not NUL-terminated) may be NULL. */
static cJSON *answer(srv *s, const char *id, long created, int chat, int chunk,
                     const char *text, size_t n, const char *role, const char *finish) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", id);
    cJSON_AddStringToObject(j, "object", chat ? (chunk ? "chat.completion.chunk"
                                                       : "chat.completion")
                                              : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)created);
    cJSON_AddStringToObject(j, "model", s->model_id);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    char *t = malloc(n + 1);
    if (t) {
        if (n) memcpy(t, text, n);
        t[n] = 0;
    }
    if (chat) {
        cJSON *msg = cJSON_AddObjectToObject(ch, chunk ? "delta" : "message");
        if (role) cJSON_AddStringToObject(msg, "role", role);
        if (text || !chunk) cJSON_AddStringToObject(msg, "content", t ? t : "");
    } else {
        cJSON_AddStringToObject(ch, "text", t ? t : "");
    }
    free(t);
    cJSON_AddNullToObject(ch, "logprobs");
    if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
    else cJSON_AddNullToObject(ch, "finish_reason");
    return j;
}

typedef struct stream_st {
    srv     *s;
    srv_req *r;
    int      chat, include_usage, fd, phase; /* 0 role, 1 text, 2 ended */
    size_t   sent;
    char    *pend; /* [pend_n] bytes of events not yet handed to MHD */
    size_t   pend_n, pend_off;
    char     id[48];
    long     created;
} stream_st;

static void pend_event(stream_st *st, cJSON *j) {
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    cJSON_Delete(j);
    if (!t) return;
    size_t l = strlen(t), need = st->pend_n + l + 9; /* "data: " t "\n\n" NUL */
    char *p = realloc(st->pend, need);
    if (p) {
        st->pend = p;
        st->pend_n += (size_t)snprintf(p + st->pend_n, need - st->pend_n, "data: %s\n\n", t);
    }
    free(t);
}

static void pend_raw(stream_st *st, const char *t) {
    size_t l = strlen(t);
    char *p = realloc(st->pend, st->pend_n + l + 1);
    if (!p) return;
    st->pend = p;
    memcpy(p + st->pend_n, t, l + 1);
    st->pend_n += l;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_st *st = cls;
    (void)pos;
    for (;;) {
        if (st->pend_off < st->pend_n) {
            size_t n = st->pend_n - st->pend_off;
            if (n > max) n = max;
            memcpy(buf, st->pend + st->pend_off, n);
            st->pend_off += n;
            return (ssize_t)n;
        }
        st->pend_n = st->pend_off = 0;
        if (st->phase == 2) return MHD_CONTENT_READER_END_OF_STREAM;
        if (st->phase == 0) {
            if (st->chat) pend_event(st, answer(st->s, st->id, st->created, 1, 1, "", 0,
                                                "assistant", NULL));
            st->phase = 1;
            continue;
        }
        srv_req *r = st->r;
        pthread_mutex_lock(&st->s->mu);
        while (r->emit_len == st->sent && r->state != REQ_DONE) {
            struct timespec ts;
            deadline_in(&ts, 200);
            pthread_cond_timedwait(&r->cv, &st->s->mu, &ts);
            if (r->emit_len == st->sent && r->state != REQ_DONE) {
                pthread_mutex_unlock(&st->s->mu);
                if (peer_gone(st->fd)) return MHD_CONTENT_READER_END_WITH_ERROR;
                pthread_mutex_lock(&st->s->mu);
            }
        }
        if (r->emit_len > st->sent) {
            size_t a = st->sent, b = r->emit_len;
            char *t = malloc(b - a);
            if (t) memcpy(t, r->text + a, b - a);
            st->sent = b;
            pthread_mutex_unlock(&st->s->mu);
            if (!t) return MHD_CONTENT_READER_END_WITH_ERROR;
            pend_event(st, answer(st->s, st->id, st->created, st->chat, 1, t, b - a, NULL,
                                  NULL));
            free(t);
            continue;
        }
        /* done, everything sent */
        if (r->err_status) {
            cJSON *e = error_obj(r->err_status, r->err_msg, NULL, NULL);
            pthread_mutex_unlock(&st->s->mu);
            pend_event(st, e);
        } else {
            cJSON *fin = answer(st->s, st->id, st->created, st->chat, 1, NULL, 0, NULL,
                                r->finish);
            cJSON *u = NULL;
            if (st->include_usage) {
                u = answer(st->s, st->id, st->created, st->chat, 1, NULL, 0, NULL, NULL);
                cJSON_DeleteItemFromObject(u, "choices");
                cJSON_AddArrayToObject(u, "choices");
                cJSON_AddItemToObject(u, "usage", usage_obj(r));
            }
            pthread_mutex_unlock(&st->s->mu);
            pend_event(st, fin);
            if (u) pend_event(st, u);
        }
        pend_raw(st, "data: [DONE]\n\n");
        st->phase = 2;
    }
}

static void stream_free(void *cls) {
    stream_st *st = cls;
    srv_release(st->s, st->r); /* cancels it if it is still running */
    free(st->pend);
    free(st);
}

/* ---- endpoints */

/* Waits until r is done (or, with started_only, out of the queue), checking
 * every 200 ms whether the client is still there. 0, or -1 if it left. */
static int wait_req(srv *s, srv_req *r, int fd, int started_only) {
    int gone = 0;
    pthread_mutex_lock(&s->mu);
    while (!gone && r->state != REQ_DONE && !(started_only && r->state != REQ_QUEUED)) {
        struct timespec tsd;
        deadline_in(&tsd, 200);
        pthread_cond_timedwait(&r->cv, &s->mu, &tsd);
        if (r->state != REQ_DONE && !(started_only && r->state != REQ_QUEUED)) {
            pthread_mutex_unlock(&s->mu);
            gone = peer_gone(fd);
            pthread_mutex_lock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return gone ? -1 : 0;
}

static enum MHD_Result completions(struct MHD_Connection *c, srv_http *h, conn_ctx *cx,
                                   int chat) {
    srv *s = h->s;
    char err[300];
    if (cx->too_big) {
        snprintf(err, sizeof err, "request body exceeds %zu bytes", h->body_limit);
        return send_error(c, s, 413, err, NULL, "request_too_large");
    }
    srv_parsed_req o;
    srv_req_err pe;
    srv_req_limits lim = {.ctx = s->ctx};
    if (srv_parse_req(cx->body, cx->n, chat, &lim, &o, &pe))
        return send_error(c, s, pe.status, pe.msg, pe.param, pe.code);
    char *text = chat ? chat_prompt(s, &o, err, sizeof err) : o.prompt;
    if (!text) {
        srv_parsed_req_free(&o);
        return send_error(c, s, 400, err, "messages", NULL);
    }
    int32_t *toks = NULL;
    int n = 0;
    pthread_mutex_lock(&s->tok_mu);
    kkv_status ts = kkv_tokenize_alloc(s->vocab, &toks, &n, text, strlen(text), 1, chat);
    if (ts != KKV_OK) snprintf(err, sizeof err, "tokenizing: %s", kkv_last_error());
    pthread_mutex_unlock(&s->tok_mu);
    if (chat) free(text); /* a completion's text is o.prompt, freed with o */
    if (ts != KKV_OK || n == 0) {
        free(toks);
        srv_parsed_req_free(&o);
        return send_error(c, s, 400, ts != KKV_OK ? err : "the prompt is empty",
                          chat ? "messages" : "prompt", NULL);
    }
    if (srv_req_fits(&o, n, s->ctx, &pe)) {
        free(toks);
        srv_parsed_req_free(&o);
        return send_error(c, s, pe.status, pe.msg, pe.param, pe.code);
    }
    srv_req *r = srv_req_new();
    if (!r) {
        free(toks);
        srv_parsed_req_free(&o);
        return send_error(c, s, 500, "out of memory", NULL, NULL);
    }
    r->prompt = toks;
    r->n_prompt = n;
    r->max_tokens = o.have_max ? o.max_tokens : s->ctx - n;
    r->sp = o.sp;
    r->ignore_eos = o.ignore_eos;
    r->cache_prompt = o.cache_prompt;
    if (chat && o.cache_prompt)
        r->n_cuts = srv_chat_cuts(s, o.roles, (const char *const *)o.contents, o.n_msgs, toks,
                                  n, r->cuts, SRV_MAX_CUTS);
    for (int i = 0; i < o.n_stop; i++) r->stop[i] = o.stop[i];
    r->n_stop = o.n_stop;
    o.n_stop = 0; /* the stops are r's now */
    int stream = o.stream, include_usage = o.include_usage;
    srv_parsed_req_free(&o);
    int status = srv_submit(s, r, err, sizeof err);
    if (status) {
        srv_release(s, r);
        return send_error(c, s, status, err, NULL, status == 503 ? "overloaded" : NULL);
    }
    char id[48];
    pthread_mutex_lock(&s->mu);
    snprintf(id, sizeof id, "%s-%llu", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++s->next_id);
    pthread_mutex_unlock(&s->mu);
    long created = (long)time(NULL);
    int fd = conn_fd(c);

    /* A streamed answer commits to status 200 with its headers: first wait until
     * the request is out of the queue, so a rejection still gets its 503. */
    if (wait_req(s, r, fd, stream)) {
        srv_release(s, r);
        return MHD_NO; /* the client left: drop the connection */
    }
    pthread_mutex_lock(&s->mu);
    int rejected = r->err_status;
    pthread_mutex_unlock(&s->mu);
    if (stream && !rejected) {
        stream_st *st = calloc(1, sizeof *st);
        struct MHD_Response *resp =
            st ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read,
                                                   st, stream_free)
               : NULL;
        if (!resp) {
            free(st);
            srv_release(s, r);
            return send_error(c, s, 500, "out of memory", NULL, NULL);
        }
        st->s = s;
        st->r = r;
        st->chat = chat;
        st->include_usage = include_usage;
        st->fd = fd;
        snprintf(st->id, sizeof st->id, "%s", id);
        st->created = created;
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp); /* stream_free runs when MHD is done with it */
        srv_count_status(s, 200);
        return ret;
    }

    pthread_mutex_lock(&s->mu);
    cJSON *j;
    int code = 200;
    if (r->err_status) {
        code = r->err_status;
        j = error_obj(code, r->err_msg, NULL, code == 503 ? "overloaded" : NULL);
    } else {
        j = answer(s, id, created, chat, 0, r->text ? r->text : "", r->text_len,
                   chat ? "assistant" : NULL, r->finish);
        cJSON_AddItemToObject(j, "usage", usage_obj(r));
    }
    pthread_mutex_unlock(&s->mu);
    srv_release(s, r);
    return send_json(c, s, code, j);
}

static enum MHD_Result models(struct MHD_Connection *c, srv *s) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "object", "list");
    cJSON *d = cJSON_AddArrayToObject(j, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(d, m);
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "kittykv");
    cJSON_AddNumberToObject(m, "context_length", s->ctx);
    return send_json(c, s, 200, j);
}

static long rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
        fclose(f);
    }
    return rss * sysconf(_SC_PAGESIZE);
}

static enum MHD_Result metrics(struct MHD_Connection *c, srv *s) {
    srv_metrics m;
    pthread_mutex_lock(&s->mu);
    m = s->m;
    pthread_mutex_unlock(&s->mu);
    size_t cap = 16384, n = 0;
    char *b = malloc(cap);
    if (!b) return send_error(c, s, 500, "out of memory", NULL, NULL);
#define P(...) n += (size_t)snprintf(b + n, n < cap ? cap - n : 0, __VA_ARGS__)
    static const char *codes[] = {"200", "400", "401", "404", "413", "5xx"};
    P("# HELP kittykv_requests_total HTTP requests answered, by status.\n"
      "# TYPE kittykv_requests_total counter\n");
    for (int i = 0; i < 6; i++)
        P("kittykv_requests_total{status=\"%s\"} %llu\n", codes[i],
          (unsigned long long)m.req_by_status[i]);
    P("# TYPE kittykv_prompt_tokens_total counter\nkittykv_prompt_tokens_total %llu\n",
      (unsigned long long)m.prompt_tokens);
    P("# TYPE kittykv_generated_tokens_total counter\nkittykv_generated_tokens_total %llu\n",
      (unsigned long long)m.gen_tokens);
    P("# TYPE kittykv_finished_total counter\n"
      "kittykv_finished_total{reason=\"stop\"} %llu\n"
      "kittykv_finished_total{reason=\"length\"} %llu\n"
      "kittykv_finished_total{reason=\"cancelled\"} %llu\n",
      (unsigned long long)m.finished_stop, (unsigned long long)m.finished_length,
      (unsigned long long)m.cancelled);
    P("# TYPE kittykv_decode_steps_total counter\nkittykv_decode_steps_total %llu\n",
      (unsigned long long)m.decode_steps);
    P("# TYPE kittykv_active_sequences gauge\nkittykv_active_sequences %d\n", m.active);
    P("# TYPE kittykv_queued_requests gauge\nkittykv_queued_requests %d\n", m.queued);
    P("# HELP kittykv_kv_pool_bytes KV pool bytes: budget, allocated (used) and free.\n"
      "# TYPE kittykv_kv_pool_bytes gauge\n"
      "kittykv_kv_pool_bytes{state=\"budget\"} %llu\n"
      "kittykv_kv_pool_bytes{state=\"used\"} %llu\n"
      "kittykv_kv_pool_bytes{state=\"free\"} %llu\n",
      (unsigned long long)m.mem.capacity, (unsigned long long)(m.mem.capacity - m.pool_free),
      (unsigned long long)m.pool_free);
    P("# HELP kittykv_kv_stored_bytes Bytes stored in the KV cache, by component.\n"
      "# TYPE kittykv_kv_stored_bytes gauge\n");
    const char *comp[] = {"key_lo", "key_hi", "key_idx", "key_meta", "value_codes",
                          "value_meta", "fp16", "sink_int8"};
    const uint64_t val[] = {m.mem.key_lo, m.mem.key_hi, m.mem.key_idx, m.mem.key_meta,
                            m.mem.value_codes, m.mem.value_meta, m.mem.fp16, m.mem.sink_int8};
    for (int i = 0; i < 8; i++)
        P("kittykv_kv_stored_bytes{component=\"%s\"} %llu\n", comp[i],
          (unsigned long long)val[i]);
    P("# HELP kittykv_prefix_cache_bytes Pool bytes held by prefix-cache entries (pages "
      "they share counted once).\n"
      "# TYPE kittykv_prefix_cache_bytes gauge\nkittykv_prefix_cache_bytes %llu\n"
      "# TYPE kittykv_prefix_cache_entries gauge\nkittykv_prefix_cache_entries %d\n",
      (unsigned long long)m.prefix_bytes, m.prefix_entries);
    P("# HELP kittykv_request_kv_bytes Pool bytes held by active requests (pages they "
      "share counted once).\n"
      "# TYPE kittykv_request_kv_bytes gauge\nkittykv_request_kv_bytes %llu\n",
      (unsigned long long)m.request_bytes);
    P("# HELP kittykv_prefix_shared_bytes KV page bytes that two or more sequences hold "
      "(forks of a cached prefix), counted once.\n"
      "# TYPE kittykv_prefix_shared_bytes gauge\nkittykv_prefix_shared_bytes %llu\n"
      "# TYPE kittykv_prefix_forks_total counter\nkittykv_prefix_forks_total %llu\n",
      (unsigned long long)m.mem.shared, (unsigned long long)m.prefix_forks);
    P("# TYPE kittykv_prefix_lookups_total counter\n"
      "kittykv_prefix_lookups_total{result=\"hit\"} %llu\n"
      "kittykv_prefix_lookups_total{result=\"miss\"} %llu\n"
      "# TYPE kittykv_prefix_tokens_reused_total counter\n"
      "kittykv_prefix_tokens_reused_total %llu\n"
      "# TYPE kittykv_prefix_evictions_total counter\nkittykv_prefix_evictions_total %llu\n",
      (unsigned long long)m.prefix_hits, (unsigned long long)m.prefix_misses,
      (unsigned long long)m.prefix_tokens_reused, (unsigned long long)m.prefix_evictions);
    P("# TYPE kittykv_kv_tokens gauge\nkittykv_kv_tokens %llu\n",
      (unsigned long long)m.mem.tokens);
    P("# HELP kittykv_decode_tokens_per_second Tokens per second of recent decode steps.\n"
      "# TYPE kittykv_decode_tokens_per_second gauge\nkittykv_decode_tokens_per_second %.3f\n",
      m.decode_tps);
    P("# TYPE kittykv_process_resident_bytes gauge\nkittykv_process_resident_bytes %ld\n",
      rss_bytes());
#undef P
    enum MHD_Result ret = n < cap ? send_text(c, s, 200, "text/plain; version=0.0.4", b)
                                  : send_error(c, s, 500, "metrics overflow", NULL, NULL);
    free(b);
    return ret;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version,
                               const char *upload_data, size_t *upload_data_size,
                               void **con_cls) {
    srv_http *h = cls;
    srv *s = h->s;
    (void)version;
    conn_ctx *cx = *con_cls;
    if (!cx) {
        cx = calloc(1, sizeof *cx);
        if (!cx) return MHD_NO;
        *con_cls = cx;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > h->body_limit) {
            char err[120];
            snprintf(err, sizeof err, "request body exceeds %zu bytes", h->body_limit);
            return send_error(c, s, 413, err, NULL, "request_too_large");
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        size_t n = *upload_data_size;
        if (!cx->too_big && cx->n + n > h->body_limit) {
            cx->too_big = 1;
            free(cx->body);
            cx->body = NULL;
            cx->n = cx->cap = 0;
        }
        if (!cx->too_big) {
            if (cx->n + n + 1 > cx->cap) {
                size_t cap = cx->cap ? cx->cap : 4096;
                while (cap < cx->n + n + 1) cap *= 2;
                char *b = realloc(cx->body, cap);
                if (!b) return MHD_NO;
                cx->body = b;
                cx->cap = cap;
            }
            memcpy(cx->body + cx->n, upload_data, n);
            cx->n += n;
            cx->body[cx->n] = 0;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/health")) {
        if (!get) return send_error(c, s, 405, "use GET", NULL, NULL);
        return send_text(c, s, 200, "application/json", "{\"status\":\"ok\"}");
    }
    if (!strcmp(url, "/metrics")) {
        if (!get) return send_error(c, s, 405, "use GET", NULL, NULL);
        return metrics(c, s);
    }
    if (strncmp(url, "/v1/", 4))
        return send_error(c, s, 404, "no such endpoint", NULL, "not_found");
    if (h->api_key) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
        size_t kl = strlen(h->api_key);
        if (!auth || strncmp(auth, "Bearer ", 7) || strlen(auth + 7) != kl ||
            memcmp(auth + 7, h->api_key, kl))
            return send_error(c, s, 401, "invalid or missing API key (Authorization: Bearer "
                              "KEY)", NULL, "invalid_api_key");
    }
    if (!strcmp(url, "/v1/models")) {
        if (!get) return send_error(c, s, 405, "use GET", NULL, NULL);
        return models(c, s);
    }
    int chat = !strcmp(url, "/v1/chat/completions");
    if (chat || !strcmp(url, "/v1/completions")) {
        if (!post) return send_error(c, s, 405, "use POST", NULL, NULL);
        return completions(c, h, cx, chat);
    }
    return send_error(c, s, 404, "no such endpoint", NULL, "not_found");
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)c;
    (void)toe;
    conn_ctx *cx = *con_cls;
    if (cx) {
        free(cx->body);
        free(cx);
        *con_cls = NULL;
    }
}

int srv_http_start(srv_http **out, srv *s, const char *host, int port, const char *api_key,
                   size_t body_limit, int max_conn) {
    *out = NULL;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost")) host = "127.0.0.1";
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "kittykv serve: --host '%s' is not an IPv4 address\n", host);
        return -1;
    }
    srv_http *h = calloc(1, sizeof *h);
    if (!h) return -1;
    h->s = s;
    h->api_key = api_key;
    h->body_limit = body_limit;
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                MHD_USE_ERROR_LOG,
                            (uint16_t)port, NULL, NULL, handler, h, MHD_OPTION_SOCK_ADDR, &sa,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
                            MHD_OPTION_CONNECTION_TIMEOUT, 300u, MHD_OPTION_NOTIFY_COMPLETED,
                            completed, h, MHD_OPTION_END);
    if (!h->d) {
        fprintf(stderr, "kittykv serve: cannot listen on %s:%d (%s)\n", host, port,
                strerror(errno));
        free(h);
        return -1;
    }
    *out = h;
    return 0;
}

void srv_http_stop(srv_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
