/* kittykv serve: chat templates. The model library has no chat-template call
 * yet (kkv_chat_* is being added on another branch), so the server recognises
 * ChatML from the GGUF's tokenizer.chat_template itself and refuses to start
 * on any other template rather than silently using the wrong one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

#define SMOL_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

int srv_chat_init(srv *s, const char *override_name, char *err, size_t cap) {
    if (override_name) {
        if (!strcmp(override_name, "chatml")) {
            s->chat_kind = CHAT_CHATML;
            s->chat_default_system = NULL;
            return 0;
        }
        snprintf(err, cap, "unknown --chat-template '%s' (this build knows: chatml)",
                 override_name);
        return -1;
    }
    size_t len = 0;
    kkv_status st = kkv_model_meta_str(s->model, "tokenizer.chat_template", NULL, 0, &len);
    if (st == KKV_ERR_NOT_FOUND) {
        snprintf(err, cap, "the model has no tokenizer.chat_template; pass --chat-template "
                 "chatml if it was trained on ChatML");
        return -1;
    }
    char *t = malloc(len + 1);
    if (!t || kkv_model_meta_str(s->model, "tokenizer.chat_template", t, len + 1, NULL)) {
        free(t);
        snprintf(err, cap, "reading tokenizer.chat_template: %s", kkv_last_error());
        return -1;
    }
    int chatml = strstr(t, "<|im_start|>") && strstr(t, "<|im_end|>");
    /* SmolLM2's template inserts its own system turn when there is none. */
    s->chat_default_system = chatml && strstr(t, SMOL_SYSTEM) ? SMOL_SYSTEM : NULL;
    free(t);
    if (!chatml) {
        snprintf(err, cap, "the model's chat template is not ChatML, the only family this "
                 "build renders (--chat-template chatml forces it)");
        return -1;
    }
    s->chat_kind = CHAT_CHATML;
    return 0;
}

typedef struct sbuf {
    char  *p;
    size_t n, cap;
    int    oom;
} sbuf;

static void put(sbuf *b, const char *s) {
    size_t l = strlen(s);
    if (b->oom) return;
    if (b->n + l + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + l + 1) cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, l + 1);
    b->n += l;
}

char *srv_chat_render(const srv *s, const char *const *roles, const char *const *contents,
                      int n) {
    sbuf b = {0};
    put(&b, "");
    if (s->chat_default_system && (n == 0 || strcmp(roles[0], "system"))) {
        put(&b, "<|im_start|>system\n");
        put(&b, s->chat_default_system);
        put(&b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        put(&b, "<|im_start|>");
        put(&b, roles[i]);
        put(&b, "\n");
        put(&b, contents[i]);
        put(&b, "<|im_end|>\n");
    }
    put(&b, "<|im_start|>assistant\n");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
