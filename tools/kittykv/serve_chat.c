/* kittykv serve: chat templates through the model library (kkv_chat_*): the
 * family is recognised from the GGUF's tokenizer.chat_template at start-up,
 * or named with --chat-template; an unknown template stops the server there
 * instead of rendering prompts the model was not trained on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

static void known(char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (const char *const *t = kkv_chat_template_names(); *t && n < cap; t++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", *t);
}

int srv_chat_init(srv *s, const char *override_name, char *err, size_t cap) {
    char names[160];
    known(names, sizeof names);
    if (override_name) {
        for (const char *const *t = kkv_chat_template_names(); *t; t++)
            if (!strcmp(*t, override_name)) {
                s->chat_template = *t;
                return 0;
            }
        snprintf(err, cap, "unknown --chat-template '%s' (known: %s)", override_name, names);
        return -1;
    }
    const char *name = NULL;
    kkv_status st = kkv_chat_template_detect(s->model, &name);
    if (st == KKV_OK) {
        s->chat_template = name;
        return 0;
    }
    if (st == KKV_ERR_NOT_FOUND)
        snprintf(err, cap, "the model has no tokenizer.chat_template; name its family with "
                 "--chat-template NAME (known: %s)", names);
    else
        snprintf(err, cap, "the model's chat template is none of the known families (%s): "
                 "%s; --chat-template NAME forces one", names, kkv_last_error());
    return -1;
}

char *srv_chat_render(srv *s, const char *const *roles, const char *const *contents, int n,
                      int gen, char *err, size_t cap) {
    kkv_chat_msg *msgs = malloc((size_t)(n > 0 ? n : 1) * sizeof *msgs); /* [n] */
    if (!msgs) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) msgs[i] = (kkv_chat_msg){roles[i], contents[i]};
    size_t len = 0;
    char *out = NULL;
    /* the vocabulary handle is shared by the HTTP threads: under tok_mu */
    pthread_mutex_lock(&s->tok_mu);
    kkv_status st = kkv_chat_format(s->vocab, NULL, 0, &len, msgs, n, gen, s->chat_template);
    if (st == KKV_ERR_INVALID_ARG && len > 0 && (out = malloc(len + 1)))
        st = kkv_chat_format(s->vocab, out, len + 1, &len, msgs, n, gen, s->chat_template);
    else if (st == KKV_OK)
        out = strdup("");
    if (st != KKV_OK) snprintf(err, cap, "chat template: %s", kkv_last_error());
    pthread_mutex_unlock(&s->tok_mu);
    free(msgs);
    if (st != KKV_OK) {
        free(out);
        return NULL;
    }
    if (!out) snprintf(err, cap, "out of memory");
    return out;
}

/* The token count of the first n turns rendered alone, if the whole prompt
 * toks [n_toks] starts with exactly those tokens (a tokenizer may merge
 * across the boundary; then there is no cut there), else 0. */
static int prefix_len(srv *s, const char *const *roles, const char *const *contents, int n,
                      const int32_t *toks, int n_toks) {
    char err[64];
    char *text = srv_chat_render(s, roles, contents, n, 0, err, sizeof err);
    if (!text) return 0;
    int32_t *t = NULL;
    int k = 0;
    pthread_mutex_lock(&s->tok_mu);
    kkv_status st = kkv_tokenize_alloc(s->vocab, &t, &k, text, strlen(text), 1, 1);
    pthread_mutex_unlock(&s->tok_mu);
    free(text);
    int ok = st == KKV_OK && k > 0 && k < n_toks && !memcmp(t, toks, (size_t)k * sizeof *t);
    free(t);
    return ok ? k : 0;
}

int srv_chat_cuts(srv *s, const char *const *roles, const char *const *contents, int n,
                  const int32_t *toks, int n_toks, int *cuts, int max) {
    int k = 0, n_sys = 0, c;
    while (n_sys < n && !strcmp(roles[n_sys], "system")) n_sys++;
    if (n_sys > 0 && n_sys < n && k < max &&
        (c = prefix_len(s, roles, contents, n_sys, toks, n_toks)) > 0)
        cuts[k++] = c;
    if (n - 1 > n_sys && k < max &&
        (c = prefix_len(s, roles, contents, n - 1, toks, n_toks)) > 0 && (!k || c > cuts[0]))
        cuts[k++] = c;
    return k;
}
