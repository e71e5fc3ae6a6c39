/* kittykv tokenize: token ids (or pieces) of a text. Needs only the GGUF
 * metadata, so it opens the file with the GGUF reader, not the model loader.
 *
 * --lines treats every input line as its own text, with the escapes \\ \n \t
 * \r and \xHH decoded (so a line can hold newlines or arbitrary bytes), and
 * prints one line of ids per input line: the oracle test feeds hundreds of
 * strings through one process this way. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_eval.h"
#include "kittykv_model.h"
#include "opts.h"
#include "util.h"

static void print_piece(FILE *f, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        size_t l = c >= 0x80 ? kkv_utf8_valid_len(p + i, n - i) : 1;
        if (c >= 0x80 && l > 0) {
            fwrite(p + i, 1, l, f);
            i += l;
            continue;
        }
        if (c == '\\') fputs("\\\\", f);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c < 0x20 || c >= 0x7F) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
        i++;
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Decodes the escapes of s[0..n) in place; returns the new length, or -1
 * (with a message) for a bad escape. */
static long unescape(char *s, size_t n, long line) {
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') {
            s[w++] = s[i];
            continue;
        }
        char c = i + 1 < n ? s[++i] : 0;
        if (c == '\\') s[w++] = '\\';
        else if (c == 'n') s[w++] = '\n';
        else if (c == 't') s[w++] = '\t';
        else if (c == 'r') s[w++] = '\r';
        else if (c == 'x' && i + 2 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
            s[w++] = (char)(hexval(s[i + 1]) * 16 + hexval(s[i + 2]));
            i += 2;
        } else {
            fprintf(stderr, "kittykv tokenize: line %ld: bad escape (use \\\\ \\n \\t \\r \\xHH)\n",
                    line);
            return -1;
        }
    }
    return (long)w;
}

typedef struct opts {
    int add_bos, special, pieces, stats;
} opts;

/* Tokenizes one text and prints it; returns 0 or 1 (runtime failure). */
static int run_one(const kkv_model *tok, const opts *o, const char *text, size_t len,
                   double *secs, size_t *n_tok) {
    int32_t *ids = NULL;
    int n = 0;
    double t0 = cli_now();
    kkv_status s = kkv_tokenize_alloc(tok, &ids, &n, text, len, o->add_bos, o->special);
    *secs += cli_now() - t0;
    if (s != KKV_OK) {
        fprintf(stderr, "kittykv tokenize: %s\n", kkv_last_error());
        return 1;
    }
    *n_tok += (size_t)n;
    char buf[256];
    for (int i = 0; i < n; i++) {
        if (!o->pieces) {
            printf(i ? " %d" : "%d", (int)ids[i]);
            continue;
        }
        size_t pl = 0;
        char *pb = buf;
        s = kkv_token_piece(tok, buf, sizeof buf, &pl, ids[i]);
        if (s == KKV_ERR_INVALID_ARG && pl > sizeof buf && (pb = malloc(pl)) != NULL)
            s = kkv_token_piece(tok, pb, pl, &pl, ids[i]);
        if (s != KKV_OK || !pb) {
            fprintf(stderr, "kittykv tokenize: %s\n", kkv_last_error());
            if (pb != buf) free(pb);
            free(ids);
            return 1;
        }
        printf("%d\t", (int)ids[i]);
        print_piece(stdout, (const unsigned char *)pb, pl);
        putchar('\n');
        if (pb != buf) free(pb);
    }
    if (!o->pieces) putchar('\n');
    free(ids);
    return 0;
}

/* The chat text of data (one user message, or ROLE<TAB>CONTENT lines when
 * turns) in a malloc'd *out [*out_len + 1]. Returns 0, 1 or 2 (bad input). */
static int format_chat(const kkv_model *tok, char *data, size_t len, int turns,
                       const char *name, int add_gen, char **out, size_t *out_len) {
    size_t cap_msgs = 1;
    for (size_t i = 0; i < len; i++) cap_msgs += data[i] == '\n';
    kkv_chat_msg *msgs = malloc(cap_msgs * sizeof *msgs); /* [cap_msgs] */
    if (!msgs) return 1;
    int n = 0;
    if (!turns) {
        msgs[n++] = (kkv_chat_msg){"user", data};
    } else {
        size_t pos = 0;
        for (long ln = 1; pos < len; ln++) {
            char *nl = memchr(data + pos, '\n', len - pos);
            size_t end = nl ? (size_t)(nl - data) : len;
            char *tab = memchr(data + pos, '\t', end - pos);
            if (!tab) {
                fprintf(stderr, "kittykv tokenize: --chat-turns line %ld has no TAB after the role\n", ln);
                free(msgs);
                return 2;
            }
            *tab = 0;
            long l = unescape(tab + 1, (size_t)(data + end - tab - 1), ln);
            if (l < 0) {
                free(msgs);
                return 2;
            }
            tab[1 + l] = 0; /* unescaping only shrinks: this stays inside the line */
            msgs[n++] = (kkv_chat_msg){data + pos, tab + 1};
            pos = end + 1;
        }
    }
    size_t need = 0;
    kkv_status s = kkv_chat_format(tok, NULL, 0, &need, msgs, n, add_gen, name);
    *out = NULL;
    if (s == KKV_ERR_INVALID_ARG && need > 0) {
        *out = malloc(need + 1);
        if (*out) s = kkv_chat_format(tok, *out, need + 1, &need, msgs, n, add_gen, name);
    }
    free(msgs);
    if (s != KKV_OK) {
        fprintf(stderr, "kittykv tokenize: %s\n", need > 0 && !*out ? "out of memory" : kkv_last_error());
        free(*out);
        *out = NULL;
        return 1;
    }
    *out_len = need;
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *file = NULL, *pre = NULL, *chat_template = NULL;
    opts o = {1, 0, 0, 0};
    int lines = 0, no_bos = 0, chat = 0, turns = 0, no_gen = 0, print_chat = 0;
    const opt_def defs[] = {
        {'m', "model", OPT_STRING, 0, 0, &model, NULL, "MODEL",
         "GGUF model (default: models/SmolLM2-135M-Instruct.Q4_1.gguf or $KKV_MODEL)"},
        {'p', "prompt", OPT_STRING, 0, 0, &text, NULL, "TEXT", "text to tokenize"},
        {'f', "file", OPT_STRING, 0, 0, &file, NULL, "FILE",
         "read the text from FILE ('-' for stdin)"},
        {0, "special", OPT_FLAG, 0, 0, &o.special, NULL, NULL,
         "parse special-token text such as <|im_start|> into its id"},
        {0, "no-bos", OPT_FLAG, 0, 0, &no_bos, NULL, NULL,
         "do not prepend BOS (only added when the model asks for it)"},
        {0, "pieces", OPT_FLAG, 0, 0, &o.pieces, NULL, NULL,
         "print 'id<TAB>piece' per token; the piece is escaped: \\\\ \\n \\t \\r,\n"
         "\\xHH for control bytes and bytes of incomplete UTF-8"},
        {0, "lines", OPT_FLAG, 0, 0, &lines, NULL, NULL,
         "every input line is a separate text with escapes \\\\ \\n \\t \\r \\xHH\n"
         "decoded; prints one line of ids per input line"},
        {0, "pre", OPT_STRING, 0, 0, &pre, NULL, "NAME",
         "override the model's pre-tokenizer (testing)"},
        {0, "stats", OPT_FLAG, 0, 0, &o.stats, NULL, NULL,
         "print the token count and speed on stderr"},
        {0, "chat", OPT_FLAG, 0, 0, &chat, NULL, NULL,
         "the text is one user message: format it with the model's chat\n"
         "template (implies --special), plus the assistant's opening"},
        {0, "chat-turns", OPT_FLAG, 0, 0, &turns, NULL, NULL,
         "the text is a conversation, one message per line as\n"
         "ROLE<TAB>CONTENT with the --lines escapes (implies --chat)"},
        {0, "chat-template", OPT_STRING, 0, 0, &chat_template, &chat, "NAME",
         "chatml, llama3, gemma, llama2 or mistral instead of the model's\n"
         "own template (implies --chat)"},
        {0, "no-gen-prompt", OPT_FLAG, 0, 0, &no_gen, NULL, NULL,
         "leave out the assistant's opening"},
        {0, "print-chat", OPT_FLAG, 0, 0, &print_chat, NULL, NULL,
         "print the formatted chat text as it is, instead of ids"},
    };
    int rc0 = opts_run("tokenize", "[-m MODEL] (-p TEXT | -f FILE) [options]", defs,
                       OPTS_N(defs), "Output: token ids separated by spaces on one line.\n",
                       argc, argv);
    if (rc0) return rc0 < 0 ? 0 : rc0;
    if (!model) model = cli_default_model();
    if (no_bos) o.add_bos = 0;
    if (!text == !file) {
        fprintf(stderr, "kittykv tokenize: give exactly one of -p TEXT and -f FILE\n");
        return 2;
    }
    if (lines && o.pieces) {
        fprintf(stderr, "kittykv tokenize: --lines and --pieces do not combine\n");
        return 2;
    }
    if (turns || print_chat) chat = 1;
    if (lines && chat) {
        fprintf(stderr, "kittykv tokenize: --lines and the chat options do not combine\n");
        return 2;
    }
    if (chat) o.special = 1;

    char *data;
    size_t len;
    if (file) {
        data = cli_read_file(!strcmp(file, "-") ? "/dev/stdin" : file, &len);
        if (!data) {
            fprintf(stderr, "kittykv tokenize: %s\n", kkv_last_error());
            return 1;
        }
    } else {
        len = strlen(text);
        data = malloc(len + 1);
        if (!data) return 1;
        memcpy(data, text, len + 1);
    }

    kkv_model *tok = NULL;
    kkv_status s = kkv_model_load_vocab(&tok, model, pre); /* messages name the path */
    if (s != KKV_OK) {
        fprintf(stderr, "kittykv tokenize: %s\n", kkv_last_error());
        free(data);
        return 1;
    }
    if (chat) {
        char *ct = NULL;
        size_t cl = 0;
        if (memchr(data, 0, len)) {
            fprintf(stderr, "kittykv tokenize: a chat text cannot hold NUL bytes\n");
            kkv_model_free(tok);
            free(data);
            return 1;
        }
        int rc = format_chat(tok, data, len, turns, chat_template, !no_gen, &ct, &cl);
        free(data);
        if (rc) {
            kkv_model_free(tok);
            return rc;
        }
        data = ct;
        len = cl;
        if (print_chat) {
            int bad = fwrite(data, 1, len, stdout) != len;
            kkv_model_free(tok);
            free(data);
            return bad;
        }
    }

    int rc = 0;
    double secs = 0;
    size_t n_tok = 0;
    if (!lines) rc = run_one(tok, &o, data, len, &secs, &n_tok);
    else {
        size_t pos = 0;
        for (long ln = 1; rc == 0 && pos < len; ln++) {
            char *nl = memchr(data + pos, '\n', len - pos);
            size_t end = nl ? (size_t)(nl - data) : len;
            long l = unescape(data + pos, end - pos, ln);
            rc = l < 0 ? 2 : run_one(tok, &o, data + pos, (size_t)l, &secs, &n_tok);
            pos = end + 1;
        }
    }
    if (rc == 0 && o.stats)
        fprintf(stderr, "kittykv tokenize: %zu bytes -> %zu tokens in %.3f s (%.2f MB/s)\n", len,
                n_tok, secs, secs > 0 ? (double)len / secs / 1e6 : 0.0);
    kkv_model_free(tok);
    free(data);
    return rc;
}
