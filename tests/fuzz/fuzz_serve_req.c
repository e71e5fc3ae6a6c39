/* libFuzzer target for kittykv serve's request parser (tools/kittykv/serve_req.c,
 * compiled in directly, with cJSON): the input is a request body, parsed as
 * a chat and as a completion request, twice each, and the parser's promises
 * are checked. An error: a status in 400..599 equal to the return value, one
 * non-empty line of printable ASCII, a non-empty param if any, nothing owned
 * (the output zeroed). A request: every option in its documented range,
 * parameters kkv_sampler_create accepts, max_tokens below the context, 1..4
 * stop strings of 1..256 bytes, and the prompt (completion) or >= 1 turns
 * with a known role and a content (chat). The same body parses the same way
 * twice (the seed aside when none is given); frees leave nothing behind
 * (LeakSanitizer), and a second free is harmless.
 * Build: CC=clang cmake -DKKV_FUZZ=ON; run: fuzz_serve_req tests/fuzz/corpus_serve_req
 * (tests/fuzz/replay.c runs the corpus through it in every build). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/kittykv/serve_req.c"

#define CTX 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int zeroed(const srv_parsed_req *o) {
    static const srv_parsed_req z;
    return !memcmp(o, &z, sizeof z);
}

static void check_err(int rc, const srv_req_err *e) {
    if (rc < 400 || rc > 599 || e->status != rc) __builtin_trap();
    size_t len = 0;
    while (len < sizeof e->msg && e->msg[len]) len++;
    if (len == 0 || len == sizeof e->msg) __builtin_trap();
    for (size_t i = 0; i < len; i++)
        if (e->msg[i] < 0x20 || e->msg[i] >= 0x7f) __builtin_trap();
    if (e->param && !*e->param) __builtin_trap();
    if (e->code && !*e->code) __builtin_trap();
}

static void check_ok(const srv_parsed_req *o, int chat) {
    const kkv_sampler_params *sp = &o->sp;
    if (o->chat != chat) __builtin_trap();
    if ((o->stream | o->include_usage | o->ignore_eos | o->cache_prompt | o->have_max) & ~1)
        __builtin_trap();
    if (o->have_max ? (o->max_tokens < 1 || o->max_tokens >= CTX) : o->max_tokens != 0)
        __builtin_trap();
    if (!(sp->temp >= 0 && sp->temp <= 2) || !(sp->top_p > 0 && sp->top_p <= 1) ||
        sp->top_k < 0 || sp->top_k > 1000000000 || !(sp->min_p >= 0 && sp->min_p < 1))
        __builtin_trap();
    kkv_sampler *smp = NULL;
    if (kkv_sampler_create(&smp, sp) != KKV_OK) __builtin_trap();
    kkv_sampler_free(smp);
    if (o->n_stop < 0 || o->n_stop > SRV_MAX_STOP) __builtin_trap();
    for (int i = 0; i < o->n_stop; i++) {
        size_t L = o->stop[i] ? strlen(o->stop[i]) : 0;
        if (L == 0 || L > SRV_MAX_STOP_LEN) __builtin_trap();
    }
    for (int i = o->n_stop; i < SRV_MAX_STOP; i++)
        if (o->stop[i]) __builtin_trap();
    if (chat) {
        if (o->prompt || o->n_msgs < 1 || !o->roles || !o->contents) __builtin_trap();
        for (int i = 0; i < o->n_msgs; i++) {
            const char *r = o->roles[i];
            if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant")))
                __builtin_trap();
            if (!o->contents[i]) __builtin_trap();
        }
    } else if (!o->prompt || o->roles || o->contents || o->n_msgs) {
        __builtin_trap();
    }
}

/* The two parses of one body agree (the drawn seed aside). */
static void check_same(int rc1, const srv_parsed_req *a, const srv_req_err *ea, int rc2,
                       const srv_parsed_req *b, const srv_req_err *eb, int seeded) {
    if (rc1 != rc2) __builtin_trap();
    if (rc1) {
        if (strcmp(ea->msg, eb->msg) || ea->param != eb->param || ea->code != eb->code)
            __builtin_trap();
        return;
    }
    kkv_sampler_params pa = a->sp, pb = b->sp;
    if (!seeded) pa.seed = pb.seed = 0;
    if (memcmp(&pa, &pb, sizeof pa) || a->stream != b->stream ||
        a->include_usage != b->include_usage || a->ignore_eos != b->ignore_eos ||
        a->have_max != b->have_max || a->max_tokens != b->max_tokens ||
        a->n_stop != b->n_stop || a->n_msgs != b->n_msgs ||
        !a->prompt != !b->prompt || (a->prompt && strcmp(a->prompt, b->prompt)))
        __builtin_trap();
    for (int i = 0; i < a->n_stop; i++)
        if (strcmp(a->stop[i], b->stop[i])) __builtin_trap();
    for (int i = 0; i < a->n_msgs; i++)
        if (a->roles[i] != b->roles[i] || strcmp(a->contents[i], b->contents[i]))
            __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* an exact-size copy, not NUL-terminated: ASan sees any read past the body */
    char *body = malloc(size ? size : 1);
    if (!body) return 0;
    if (size) memcpy(body, data, size);
    const srv_req_limits lim = {.ctx = CTX};
    for (int chat = 0; chat < 2; chat++) {
        srv_parsed_req a, b;
        srv_req_err ea, eb;
        memset(&a, 0x5a, sizeof a); /* the parser must not read what it was given */
        int rc1 = srv_parse_req(body, size, chat, &lim, &a, &ea);
        int rc2 = srv_parse_req(body, size, chat, &lim, &b, &eb);
        if (rc1) {
            check_err(rc1, &ea);
            if (!zeroed(&a)) __builtin_trap();
        } else {
            check_ok(&a, chat);
        }
        /* seeded: "seed" is a number; any other shape failed or was null/absent */
        cJSON *root = cJSON_ParseWithLength(body, size);
        const cJSON *sd = root ? cJSON_GetObjectItemCaseSensitive(root, "seed") : NULL;
        int seeded = sd && cJSON_IsNumber(sd);
        cJSON_Delete(root);
        check_same(rc1, &a, &ea, rc2, &b, &eb, seeded);
        srv_parsed_req_free(&a);
        srv_parsed_req_free(&a); /* zeroed by the first: harmless */
        srv_parsed_req_free(&b);
    }
    srv_parsed_req_free(NULL);
    free(body);
    return 0;
}
