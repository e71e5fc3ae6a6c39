/* kittykv serve: the OpenAI request bodies (/v1/completions and
 * /v1/chat/completions) parsed and validated into srv_parsed_req. A pure
 * function of the bytes and the limits: no model, no scheduler, no HTTP, so
 * tests/fuzz/fuzz_serve_req.c can compile this file alone against cJSON.
 * Rendering the chat turns in the model's template is the caller's. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

/* Bumped by every unseeded request; connection threads run this at once. */
static _Atomic uint64_t seed_ctr;

static int fail(srv_req_err *e, int status, const char *param, const char *code,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Fills e (one line) and returns its status. */
static int fail(srv_req_err *e, int status, const char *param, const char *code,
                const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = status;
    e->param = param;
    e->code = code;
    return status;
}

/* Up to cap-1 bytes of s with everything but printable ASCII as '?': a value
 * echoed in a message keeps it one line of valid UTF-8. */
static void echo(char *dst, size_t cap, const char *s) {
    size_t i = 0;
    for (; s[i] && i + 1 < cap; i++)
        dst[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    dst[i] = 0;
}

/* A number field in [lo, hi] (integer if want_int); absent or null keeps *out.
 * 0, or the status with e filled. */
static int get_num(const cJSON *root, const char *key, double lo, double hi, int want_int,
                   double *out, srv_req_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) ||
        (want_int && v->valuedouble != floor(v->valuedouble)))
        return fail(e, 400, key, NULL, "'%s' must be %s", key,
                    want_int ? "an integer" : "a number");
    if (v->valuedouble < lo || v->valuedouble > hi)
        return fail(e, 400, key, NULL, "'%s' = %g is out of range [%g, %g]", key,
                    v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return 0;
}

/* A boolean field; absent or null keeps *out. */
static int get_bool(const cJSON *root, const char *key, int *out, srv_req_err *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return fail(e, 400, key, NULL, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* Sampling options, max_tokens, stream flags and stop strings (both endpoints). */
static int parse_opts(const cJSON *root, const srv_req_limits *lim, srv_parsed_req *o,
                      srv_req_err *e) {
    double temp = 1.0, top_p = 1.0, top_k = 0, min_p = 0, n = 1, mx = -1, seed = -1;
    static const char *const keys[] = {"temperature", "top_p", "top_k", "min_p", "n",
                                       "max_tokens", "max_completion_tokens", "seed"};
    double *dst[] = {&temp, &top_p, &top_k, &min_p, &n, &mx, &mx, &seed};
    static const double lo[] = {0, 0, 0, 0, 1, 1, 1, 0};
    static const double hi[] = {2, 1, 1e9, 1, 1, 1e9, 1e9, 9007199254740991.0};
    static const int isint[] = {0, 0, 1, 0, 1, 1, 1, 1};
    int rc;
    for (int i = 0; i < 8; i++)
        if ((rc = get_num(root, keys[i], lo[i], hi[i], isint[i], dst[i], e))) return rc;
    if (top_p <= 0) return fail(e, 400, "top_p", NULL, "'top_p' must be in (0, 1]");
    if (min_p >= 1) return fail(e, 400, "min_p", NULL, "'min_p' must be in [0, 1)");
    /* no prompt fits beside max_tokens >= ctx: refused before tokenizing */
    if (lim && lim->ctx > 0 && mx >= lim->ctx)
        return fail(e, 400, "max_tokens", "context_length_exceeded",
                    "this model's context is %d tokens; max_tokens asks for %.0f, which "
                    "leaves no room for the prompt", lim->ctx, mx);
    o->sp = kkv_sampler_defaults();
    o->sp.repeat_penalty = 1.0f;
    o->sp.temp = (float)temp;
    o->sp.top_p = (float)top_p;
    o->sp.top_k = (int)top_k;
    o->sp.min_p = (float)min_p;
    if (seed >= 0) {
        o->sp.seed = (uint64_t)seed;
    } else { /* unseeded requests still differ from each other */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t st = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^
                      (atomic_fetch_add_explicit(&seed_ctr, 1, memory_order_relaxed) + 1);
        o->sp.seed = kkv_rng_next(&st);
    }
    o->have_max = mx >= 1;
    o->max_tokens = o->have_max ? (int)mx : 0;

    if ((rc = get_bool(root, "stream", &o->stream, e))) return rc;
    if ((rc = get_bool(root, "ignore_eos", &o->ignore_eos, e))) return rc;
    o->cache_prompt = 1; /* llama-server's name: false keeps the prompt out of the prefix cache */
    if ((rc = get_bool(root, "cache_prompt", &o->cache_prompt, e))) return rc;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && cJSON_IsObject(so)) {
        const cJSON *iu = cJSON_GetObjectItemCaseSensitive(so, "include_usage");
        o->include_usage = iu && cJSON_IsTrue(iu);
    }
    const cJSON *stop = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (stop && !cJSON_IsNull(stop)) {
        const cJSON *one = cJSON_IsString(stop) ? stop : NULL;
        int bad = !one && !cJSON_IsArray(stop);
        if (!bad && !one && cJSON_GetArraySize(stop) > SRV_MAX_STOP) bad = 1;
        for (const cJSON *s = one ? one : (bad ? NULL : stop->child); s && !bad;
             s = one ? NULL : s->next) {
            size_t L = cJSON_IsString(s) ? strlen(s->valuestring) : 0;
            if (!cJSON_IsString(s) || L == 0 || L > SRV_MAX_STOP_LEN) {
                bad = 1;
                break;
            }
            if (!(o->stop[o->n_stop] = strdup(s->valuestring)))
                return fail(e, 500, NULL, NULL, "out of memory");
            o->n_stop++;
        }
        if (bad)
            return fail(e, 400, "stop", NULL, "'stop' must be a non-empty string or an array "
                        "of at most %d such strings (%d bytes each at most)", SRV_MAX_STOP,
                        SRV_MAX_STOP_LEN);
    }
    return 0;
}

/* Message content: a string, or an array of {"type":"text","text":...} parts.
 * Malloc'd; NULL for any other shape (*oom set when it was memory). */
static char *content_text(const cJSON *c, int *oom) {
    char *out = NULL;
    if (!c || cJSON_IsNull(c)) out = strdup("");
    else if (cJSON_IsString(c)) out = strdup(c->valuestring);
    else if (!cJSON_IsArray(c)) return NULL;
    else {
        size_t n = 0;
        for (const cJSON *p = c->child; p; p = p->next) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(p, "type");
            if (!cJSON_IsObject(p) || !cJSON_IsString(t) || !cJSON_IsString(ty) ||
                strcmp(ty->valuestring, "text"))
                return NULL;
            n += strlen(t->valuestring);
        }
        if ((out = malloc(n + 1))) {
            size_t k = 0; /* appended at an offset: strcat would rescan per part */
            for (const cJSON *p = c->child; p; p = p->next) {
                const char *t = cJSON_GetObjectItemCaseSensitive(p, "text")->valuestring;
                size_t l = strlen(t);
                memcpy(out + k, t, l);
                k += l;
            }
            out[k] = 0;
        }
    }
    if (!out) *oom = 1;
    return out;
}

/* The chat turns: roles normalised to system/user/assistant, contents joined. */
static int parse_messages(const cJSON *root, srv_parsed_req *o, srv_req_err *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) return fail(e, 400, "messages", NULL, "'messages' is required");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return fail(e, 400, "messages", NULL, "'messages' must be a non-empty array");
    int n = cJSON_GetArraySize(msgs);
    o->roles = calloc((size_t)n, sizeof *o->roles);       /* [n] static strings */
    o->contents = calloc((size_t)n, sizeof *o->contents); /* [n] owned */
    if (!o->roles || !o->contents) return fail(e, 500, NULL, NULL, "out of memory");
    int i = 0;
    for (const cJSON *m = msgs->child; m && i < n; m = m->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsObject(m) || !cJSON_IsString(role))
            return fail(e, 400, "messages", NULL,
                        "messages[%d] must be an object with a string 'role'", i);
        const char *r = role->valuestring;
        if (!strcmp(r, "system") || !strcmp(r, "developer")) o->roles[i] = "system";
        else if (!strcmp(r, "user")) o->roles[i] = "user";
        else if (!strcmp(r, "assistant")) o->roles[i] = "assistant";
        else {
            char shown[41];
            echo(shown, sizeof shown, r);
            return fail(e, 400, "messages", NULL,
                        "messages[%d].role '%s' is not system, user or assistant", i, shown);
        }
        int oom = 0;
        o->contents[i] = content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), &oom);
        o->n_msgs = i + 1; /* contents[0..i] are set (or NULL): freed from here on */
        if (!o->contents[i])
            return oom ? fail(e, 500, NULL, NULL, "out of memory")
                       : fail(e, 400, "messages", NULL, "messages[%d].content must be a "
                              "string or an array of text parts", i);
    }
    o->n_msgs = i;
    return 0;
}

static int parse_prompt(const cJSON *root, srv_parsed_req *o, srv_req_err *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (p && cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1) p = p->child;
    if (!p) return fail(e, 400, "prompt", NULL, "'prompt' is required");
    if (!cJSON_IsString(p))
        return fail(e, 400, "prompt", NULL,
                    "'prompt' must be a string (or an array of one string)");
    if (!(o->prompt = strdup(p->valuestring))) return fail(e, 500, NULL, NULL, "out of memory");
    return 0;
}

void srv_parsed_req_free(srv_parsed_req *o) {
    if (!o) return;
    for (int i = 0; i < o->n_stop; i++) free(o->stop[i]);
    for (int i = 0; o->contents && i < o->n_msgs; i++) free(o->contents[i]);
    free(o->contents);
    free(o->roles);
    free(o->prompt);
    memset(o, 0, sizeof *o);
}

int srv_parse_req(const char *body, size_t n, int chat, const srv_req_limits *lim,
                  srv_parsed_req *out, srv_req_err *e) {
    memset(out, 0, sizeof *out);
    memset(e, 0, sizeof *e);
    cJSON *root = cJSON_ParseWithLength(body ? body : "", body ? n : 0);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fail(e, 400, NULL, "invalid_json", "the body is not a JSON object");
    }
    out->chat = chat ? 1 : 0;
    int rc = parse_opts(root, lim, out, e);
    if (!rc) rc = chat ? parse_messages(root, out, e) : parse_prompt(root, out, e);
    cJSON_Delete(root);
    if (rc) srv_parsed_req_free(out); /* nothing owned on an error */
    return rc;
}

int srv_req_fits(const srv_parsed_req *o, int n_prompt, int ctx, srv_req_err *e) {
    if (n_prompt >= ctx || (o->have_max && o->max_tokens > ctx - n_prompt))
        return fail(e, 400, "max_tokens", "context_length_exceeded",
                    "this model's context is %d tokens; the prompt has %d and max_tokens "
                    "asks for %d more", ctx, n_prompt, o->have_max ? o->max_tokens : 1);
    return 0;
}
