/* Chat templates: recognising the family of a GGUF's tokenizer.chat_template
 * and formatting messages the way that family's reference template (the
 * Jinja text the models ship) renders them. Running Jinja itself would need
 * an interpreter; the families differ in a handful of fixed strings, so each
 * is code here, and tests/oracle/test_chat.py renders the real templates with
 * jinja2 and compares. */
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "kittykv_model.h"
#include "model/model.h"
#include "model/tokenizer.h"

typedef enum fam { F_CHATML, F_LLAMA3, F_GEMMA, F_LLAMA2, F_MISTRAL, F_N } fam;

static const char *const NAMES[F_N + 1] = {"chatml", "llama3", "gemma", "llama2", "mistral", NULL};

const char *const *kkv_chat_template_names(void) { return NAMES; }

/* Family markers, most specific first: a template holding a family's turn
 * tokens is that family. */
static int detect_text(const char *t, size_t n, fam *out) {
    /* memmem is not C11: a plain search */
    const char *marks[] = {"<|im_start|>", "<|start_header_id|>", "<start_of_turn>", "[INST]"};
    const fam fams[] = {F_CHATML, F_LLAMA3, F_GEMMA, F_MISTRAL};
    for (int k = 0; k < 4; k++) {
        size_t ml = strlen(marks[k]);
        for (size_t i = 0; i + ml <= n; i++)
            if (!memcmp(t + i, marks[k], ml)) {
                *out = fams[k];
                if (fams[k] == F_MISTRAL)
                    for (size_t j = 0; j + 7 <= n; j++)
                        if (!memcmp(t + j, "<<SYS>>", 7)) *out = F_LLAMA2;
                return 1;
            }
    }
    return 0;
}

kkv_status kkv_chat_template_detect(const kkv_model *m, const char **name) {
    if (!m || !name) return kkv_fail(KKV_ERR_INVALID_ARG, "chat: NULL argument");
    if (!m->chat_template)
        return kkv_fail(KKV_ERR_NOT_FOUND, "chat: the model has no tokenizer.chat_template; name "
                        "a template (chatml, llama3, gemma, llama2, mistral)");
    fam f;
    if (!detect_text(m->chat_template, m->chat_template_len, &f))
        return kkv_fail(KKV_ERR_UNSUPPORTED, "chat: the model's tokenizer.chat_template is none of "
                        "the known families (chatml, llama3, gemma, llama2, mistral); name one");
    *name = NAMES[f];
    return KKV_OK;
}

/* ---- a growing text ---- */

typedef struct sb {
    char  *p;   /* [cap] */
    size_t n, cap;
    int    oom;
} sb;

static void put(sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void puts_(sb *b, const char *s) { put(b, s, strlen(s)); }

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

/* s without leading and trailing ASCII whitespace (Jinja's trim and Python's
 * strip on the ASCII range), as [*p, *p + *n). */
static void trimmed(const char *s, const char **p, size_t *n) {
    size_t a = 0, b = strlen(s);
    while (a < b && is_ws(s[a])) a++;
    while (b > a && is_ws(s[b - 1])) b--;
    *p = s + a;
    *n = b - a;
}

static void put_trim(sb *b, const char *s) {
    const char *p;
    size_t n;
    trimmed(s, &p, &n);
    put(b, p, n);
}

/* ---- ChatML's default system message ----
 * SmolLM2 and Qwen2.5 write one into the template, emitted when the first
 * message is not a system one: a literal '<|im_start|>system\n...<|im_end|>'
 * with nothing computed inside. The first such literal is taken (a
 * '<|im_start|>system\n' + messages[0]... concatenation holds quotes and is
 * skipped). Jinja escapes \n, \t, \', \", \\ are decoded. */
static int default_system(const char *t, size_t n, sb *out) {
    static const char open[] = "<|im_start|>system";
    static const char close[] = "<|im_end|>";
    size_t ol = sizeof open - 1, cl = sizeof close - 1;
    for (size_t i = 0; i + ol <= n; i++) {
        if (memcmp(t + i, open, ol) != 0) continue;
        size_t j = i + ol;
        if (j < n && t[j] == '\n') j += 1;
        else if (j + 1 < n && t[j] == '\\' && t[j + 1] == 'n') j += 2;
        else continue;
        size_t e = j;
        while (e + cl <= n && memcmp(t + e, close, cl) != 0) e++;
        if (e + cl > n) return 0;
        int literal = e > j;
        for (size_t k = j; k < e && literal; k++)
            if (t[k] == '\'' || t[k] == '"' || t[k] == '{' || t[k] == '}') literal = 0;
        if (!literal) continue;
        for (size_t k = j; k < e; k++) {
            char c = t[k];
            if (c == '\\' && k + 1 < e) {
                char d = t[++k];
                c = d == 'n' ? '\n' : d == 't' ? '\t' : d;
            }
            put(out, &c, 1);
        }
        return 1;
    }
    return 0;
}

/* ---- the families ---- */

/* Text of a special token the family needs, checked to be one the tokenizer
 * parses back to its id (control or user-defined). */
static kkv_status need_token(const kkv_tok *t, const char *text, const char *family) {
    int32_t id = kkv_tok_find(t, text);
    int ty = id >= 0 ? kkv_tok_type(t, id) : -1;
    if (id < 0 || (ty != KKV_TOKTYPE_CONTROL && ty != KKV_TOKTYPE_USER))
        return kkv_fail(KKV_ERR_UNSUPPORTED, "chat template '%s' needs the special token '%s', which "
                        "this model's vocabulary lacks", family, text);
    return KKV_OK;
}

/* The text of token id (bos/eos) into buf [cap], NUL-terminated. */
static kkv_status token_text(const kkv_tok *t, int32_t id, char *buf, size_t cap, const char *what,
                             const char *family) {
    size_t n = 0;
    if (id < 0 || kkv_tok_piece(t, buf, cap - 1, &n, id) != KKV_OK)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "chat template '%s' needs the model's %s token, which it "
                        "lacks", family, what);
    buf[n] = 0;
    return KKV_OK;
}

static int role_is(const kkv_chat_msg *m, const char *r) { return strcmp(m->role, r) == 0; }

static kkv_status check_msgs(const kkv_chat_msg *msgs, int n, fam f) {
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return kkv_fail(KKV_ERR_INVALID_ARG, "chat: message %d has a NULL role or content", i);
        if (!role_is(&msgs[i], "system") && !role_is(&msgs[i], "user") && !role_is(&msgs[i], "assistant"))
            return kkv_fail(KKV_ERR_INVALID_ARG, "chat: message %d has role '%.32s' (system, user or "
                            "assistant)", i, msgs[i].role);
        if (i > 0 && f != F_CHATML && f != F_LLAMA3 && role_is(&msgs[i], "system"))
            return kkv_fail(KKV_ERR_INVALID_ARG, "chat: template '%s' takes a system message only "
                            "first (message %d)", NAMES[f], i);
    }
    return KKV_OK;
}

static kkv_status format(sb *b, const kkv_model *m, const kkv_tok *t, fam f, int own,
                         const kkv_chat_msg *msgs, int n, int add_gen) {
    const char *fn = NAMES[f];
    switch (f) {
    case F_CHATML: {
        KKV_TRY(need_token(t, "<|im_start|>", fn));
        KKV_TRY(need_token(t, "<|im_end|>", fn));
        /* the default system message belongs to the model's own template */
        if (own && (n == 0 || !role_is(&msgs[0], "system")) && m->chat_template) {
            sb sys = {0};
            /* a text cut short by a failed allocation is not used (its p may
             * be NULL): the out-of-memory is reported below */
            if (default_system(m->chat_template, m->chat_template_len, &sys) && !sys.oom) {
                puts_(b, "<|im_start|>system\n");
                put(b, sys.p, sys.n);
                puts_(b, "<|im_end|>\n");
            }
            if (sys.oom) b->oom = 1;
            free(sys.p);
        }
        for (int i = 0; i < n; i++) {
            puts_(b, "<|im_start|>");
            puts_(b, msgs[i].role);
            puts_(b, "\n");
            puts_(b, msgs[i].content);
            puts_(b, "<|im_end|>\n");
        }
        if (add_gen) puts_(b, "<|im_start|>assistant\n");
        return KKV_OK;
    }
    case F_LLAMA3:
        KKV_TRY(need_token(t, "<|start_header_id|>", fn));
        KKV_TRY(need_token(t, "<|end_header_id|>", fn));
        KKV_TRY(need_token(t, "<|eot_id|>", fn));
        for (int i = 0; i < n; i++) {
            puts_(b, "<|start_header_id|>");
            puts_(b, msgs[i].role);
            puts_(b, "<|end_header_id|>\n\n");
            put_trim(b, msgs[i].content);
            puts_(b, "<|eot_id|>");
        }
        if (add_gen) puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        return KKV_OK;
    case F_GEMMA: {
        KKV_TRY(need_token(t, "<start_of_turn>", fn));
        KKV_TRY(need_token(t, "<end_of_turn>", fn));
        int i0 = n > 0 && role_is(&msgs[0], "system") ? 1 : 0;
        for (int i = i0; i < n; i++) {
            puts_(b, "<start_of_turn>");
            puts_(b, role_is(&msgs[i], "assistant") ? "model" : msgs[i].role);
            puts_(b, "\n");
            if (i == i0 && i0 == 1) { /* Gemma 3: the system text, untrimmed, then a blank line */
                puts_(b, msgs[0].content);
                puts_(b, "\n\n");
            }
            put_trim(b, msgs[i].content);
            puts_(b, "<end_of_turn>\n");
        }
        if (add_gen) puts_(b, "<start_of_turn>model\n");
        return KKV_OK;
    }
    case F_LLAMA2:
    case F_MISTRAL: {
        char bos[64], eos[64];
        if (f == F_LLAMA2) KKV_TRY(token_text(t, kkv_tok_bos(t), bos, sizeof bos, "BOS", fn));
        KKV_TRY(token_text(t, kkv_tok_eos(t), eos, sizeof eos, "EOS", fn));
        int i0 = n > 0 && role_is(&msgs[0], "system") ? 1 : 0;
        for (int i = i0; i < n; i++) {
            /* the turn's content, with the system text folded into the first */
            sb c = {0};
            if (i == i0 && i0 == 1) {
                if (f == F_LLAMA2) {
                    puts_(&c, "<<SYS>>\n");
                    puts_(&c, msgs[0].content);
                    puts_(&c, "\n<</SYS>>\n\n");
                } else {
                    puts_(&c, msgs[0].content);
                    puts_(&c, "\n\n");
                }
            }
            puts_(&c, msgs[i].content);
            put(&c, "", 1);
            if (c.oom) {
                free(c.p);
                b->oom = 1;
                return KKV_OK;
            }
            int user = role_is(&msgs[i], "user");
            if (f == F_LLAMA2) {
                /* the first BOS comes from tokenization (add_bos) */
                if (user) {
                    if (i > i0) puts_(b, bos);
                    puts_(b, "[INST] ");
                    put_trim(b, c.p);
                    puts_(b, " [/INST]");
                } else {
                    puts_(b, " ");
                    put_trim(b, c.p);
                    puts_(b, " ");
                    puts_(b, eos);
                }
            } else if (user) {
                puts_(b, "[INST] ");
                puts_(b, c.p);
                puts_(b, " [/INST]");
            } else {
                puts_(b, c.p);
                puts_(b, eos);
            }
            free(c.p);
        }
        return KKV_OK; /* the prompt already ends where the answer starts */
    }
    case F_N: break;
    }
    return kkv_fail(KKV_ERR_INVALID_ARG, "chat: bad family");
}

kkv_status kkv_chat_format(const kkv_model *m, char *buf, size_t cap, size_t *len,
                           const kkv_chat_msg *msgs, int n, int add_generation_prompt,
                           const char *name) {
    if (!m || !len || (n > 0 && !msgs) || n < 0 || (cap > 0 && !buf))
        return kkv_fail(KKV_ERR_INVALID_ARG, "chat: NULL argument or n < 0");
    fam f = F_N;
    int own = 0;
    if (name) {
        for (int i = 0; i < F_N; i++)
            if (!strcmp(name, NAMES[i])) f = (fam)i;
        if (f == F_N)
            return kkv_fail(KKV_ERR_INVALID_ARG, "chat: unknown template '%.32s' (known: chatml, "
                            "llama3, gemma, llama2, mistral)", name);
        fam mine;
        own = m->chat_template && detect_text(m->chat_template, m->chat_template_len, &mine) && mine == f;
    } else {
        const char *mine;
        KKV_TRY(kkv_chat_template_detect(m, &mine));
        for (int i = 0; i < F_N; i++)
            if (!strcmp(mine, NAMES[i])) f = (fam)i;
        own = 1;
    }
    KKV_TRY(check_msgs(msgs, n, f));
    sb b = {0};
    kkv_status st = format(&b, m, m->tok, f, own, msgs, n, add_generation_prompt);
    if (st == KKV_OK && b.oom) st = kkv_fail(KKV_ERR_NOMEM, "chat: out of memory");
    if (st == KKV_OK) {
        *len = b.n;
        if (b.n + 1 > cap) st = kkv_fail(KKV_ERR_INVALID_ARG, "chat: %zu bytes do not fit in %zu", b.n + 1, cap);
        else {
            if (b.n) memcpy(buf, b.p, b.n);
            buf[b.n] = 0;
        }
    }
    free(b.p);
    return st;
}
