/* Passkey retrieval (kittykv_eval.h): a 5-digit key hidden at a chosen depth
 * of a synthetic haystack inside SmolLM2's ChatML template (or the model's own
 * chat template when it is another family, e.g. Gemma's); a trial passes
 * when the greedy answer contains the key. Every method sees exactly the same
 * token ids: the prompts are built and tokenized once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "kittykv_eval.h"

static const char *const HEAD =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n<|im_start|>user\nThere is a pass key hidden inside a lot of irrelevant "
    "text. Find it and memorize it. I will quiz you about the pass key.\n";
static const char *const FILLER =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
    "again. ";
/* %d: the key, twice */
static const char *const NEEDLE = "The pass key is %d. Remember it. %d is the pass key. ";
static const char *const TAIL =
    "\nWhat is the pass key?<|im_end|>\n<|im_start|>assistant\nThe pass key is";

void kkv_passkey_texts(const char **filler, const char **needle) {
    if (filler) *filler = FILLER;
    if (needle) *needle = NEEDLE;
}

kkv_passkey_config kkv_passkey_defaults(void) {
    static const int lengths[] = {1024, 2048, 4096, 8192};
    static const float depths[] = {0.1f, 0.5f, 0.9f};
    kkv_passkey_config c;
    memset(&c, 0, sizeof c);
    c.lengths = lengths;
    c.n_lengths = 4;
    c.depths = depths;
    c.n_depths = 3;
    c.trials = 3;
    c.seed = 1;
    return c;
}

/* One splitmix64 output for the state x (kkv_rng_next steps a copy). */
static uint64_t splitmix(uint64_t x) { return kkv_rng_next(&x); }

/* The key of one (trial, length, depth): 10000..99999, the same for every method. */
static int make_key(uint64_t seed, int trial, int li, int di) {
    uint64_t h = splitmix(splitmix(splitmix(seed) ^ (uint64_t)trial) ^
                          ((uint64_t)li << 32 | (uint64_t)di));
    return 10000 + (int)(h % 90000u);
}

static int count_tokens(const kkv_model *m, const char *text, int special) {
    int n = 0;
    kkv_status s = kkv_tokenize(m, NULL, 0, &n, text, strlen(text), 0, special);
    if (s != KKV_OK && s != KKV_ERR_INVALID_ARG) return -1;
    return n;
}

/* Token counts of the prompt's parts, measured once, and the framing texts. */
typedef struct parts {
    int head, filler, needle, tail;
    const char *htext, *ttext; /* HEAD and TAIL, or the model's own template's */
} parts;

#define FRAME_CAP 1024
/* The task's user text around the haystack (HEAD and TAIL hold it in ChatML). */
static const char *const ASK =
    "There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the pass key.\n";
static const char *const QUESTION = "\nWhat is the pass key?";
static const char *const ANSWER = "The pass key is";

/* head/tail [FRAME_CAP]: HEAD and TAIL in the model's own chat template when
 * it has one other than ChatML (Gemma 3's turns); ChatML models (SmolLM2)
 * and models without a known template keep HEAD and TAIL byte for byte. */
static void frame(const kkv_model *m, char *head, char *tail) {
    const char *name = NULL;
    snprintf(head, FRAME_CAP, "%s", HEAD);
    snprintf(tail, FRAME_CAP, "%s", TAIL);
    if (kkv_chat_template_detect(m, &name) != KKV_OK || !strcmp(name, "chatml")) {
        kkv_clear_error();
        return;
    }
    kkv_chat_msg msg = {"user", "\x01"}; /* a marker where the user text goes */
    char buf[FRAME_CAP / 2]; /* leaves room for the task text in head and tail */
    size_t len = 0;
    if (kkv_chat_format(m, buf, sizeof buf - 1, &len, &msg, 1, 1, NULL) != KKV_OK) {
        kkv_clear_error();
        return;
    }
    buf[len] = 0;
    char *mark = strchr(buf, '\x01');
    if (!mark) return;
    *mark = 0;
    snprintf(head, FRAME_CAP, "%s%s", buf, ASK);
    snprintf(tail, FRAME_CAP, "%s%s%s", QUESTION, mark + 1, ANSWER);
}

/* The prompt text for a target length: as many filler units as fit, the
 * needle after round(depth * units) of them. malloc'd, NULL when out of memory. */
static char *build_prompt(const parts *pt, int length, float depth, int key) {
    int room = length - pt->head - pt->needle - pt->tail;
    int units = room > 0 ? room / pt->filler : 0;
    int before = (int)((double)depth * units + 0.5);
    char needle[160];
    snprintf(needle, sizeof needle, NEEDLE, key, key);
    size_t cap = strlen(pt->htext) + strlen(needle) + strlen(pt->ttext) +
                 (size_t)units * strlen(FILLER) + 1;
    char *s = malloc(cap); /* [cap] */
    if (!s) return NULL;
    char *p = s;
    p += sprintf(p, "%s", pt->htext);
    for (int u = 0; u < units; u++) {
        if (u == before) p += sprintf(p, "%s", needle);
        p += sprintf(p, "%s", FILLER);
    }
    if (before >= units) p += sprintf(p, "%s", needle);
    /* the haystack ends with a space; the question starts a new line */
    if (p > s && p[-1] == ' ') p--;
    sprintf(p, "%s", pt->ttext);
    return s;
}

/* Prefill, then greedy up to KKV_PASSKEY_ANSWER_TOKENS tokens; answer gets
 * the text (NUL-terminated). logits: [n_vocab] scratch. base >= 0 is a
 * sequence that already holds prompt[0..skip): the trial forks it (sharing
 * its pages) and prefills only the rest, which gives the same logits as a
 * whole prefill because results do not depend on prompt chunking. */
static kkv_status run_one(char *answer, kkv_model *m, kkv_cache *c, const kkv_model_info *info,
                          int base, const int32_t *prompt, int n, int skip, float *logits) {
    int seq;
    if (base >= 0) {
        KKV_TRY(kkv_seq_fork(c, &seq, base));
    } else {
        KKV_TRY(kkv_seq_add(c, &seq));
        skip = 0;
    }
    size_t len = 0;
    answer[0] = 0;
    kkv_status s = kkv_model_forward(m, c, logits, seq, prompt + skip, n - skip, 0);
    for (int g = 0; s == KKV_OK && g < KKV_PASSKEY_ANSWER_TOKENS; g++) {
        int32_t tok = kkv_argmax(logits, info->n_vocab);
        if (tok == info->eos || tok == info->eot) break;
        char piece[64];
        size_t pn = 0;
        if (kkv_token_piece(m, piece, sizeof piece, &pn, tok) == KKV_OK &&
            len + pn < KKV_PASSKEY_ANSWER_BYTES) {
            memcpy(answer + len, piece, pn);
            len += pn;
            answer[len] = 0;
        }
        if (g + 1 == KKV_PASSKEY_ANSWER_TOKENS) break;
        s = kkv_model_forward(m, c, logits, seq, &tok, 1, 0);
    }
    kkv_seq_free(c, seq);
    return s;
}

/* How many leading tokens all T prompts of a cell share (the haystack up to
 * the needle; trials differ only in the key), at most one less than the
 * shortest so that every trial prefills at least one token of its own.
 * prompts[first + t * stride] is trial t's prompt, of n[...] tokens. */
static int shared_prefix(int32_t *const *prompts, const int *n, size_t first, size_t stride,
                         int T) {
    int k = n[first] - 1;
    for (int t = 1; t < T; t++) {
        const int32_t *a = prompts[first], *b = prompts[first + (size_t)t * stride];
        int lim = n[first + (size_t)t * stride] - 1;
        if (lim < k) k = lim;
        int i = 0;
        while (i < k && a[i] == b[i]) i++;
        k = i;
    }
    return k > 0 ? k : 0;
}

/* Wilson score interval of k successes in n trials at z = 1.96 (95%). */
static void wilson(double *lo, double *hi, int k, int n) {
    if (n <= 0) {
        *lo = 0.0, *hi = 1.0;
        return;
    }
    const double z = 1.959963984540054, p = (double)k / n, z2n = z * z / n;
    double mid = (p + z2n / 2) / (1 + z2n);
    double half = z * sqrt(p * (1 - p) / n + z2n / (4.0 * n)) / (1 + z2n);
    *lo = mid - half < 0 ? 0 : mid - half;
    *hi = mid + half > 1 ? 1 : mid + half;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void kkv_passkey_cells_free(kkv_passkey_cell *cells, size_t n) {
    if (!cells) return;
    for (size_t i = 0; i < n; i++) {
        free(cells[i].keys);
        free(cells[i].answers);
        cells[i].keys = NULL;
        cells[i].answers = NULL;
    }
}

static kkv_status quote(kkv_status s, const char *what, const char *name) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s", kkv_last_error());
    return kkv_fail(s, "passkey: %s: %s: %s", name, what, msg);
}

kkv_status kkv_passkey_run(kkv_passkey_cell *cells, kkv_model *m, const kkv_passkey_config *cfg,
                           const char *const *specs, int n_specs) {
    if (!cells || !m || !cfg || !specs || n_specs < 1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "passkey: NULL argument or no method");
    if (cfg->n_lengths < 1 || cfg->n_depths < 1 || !cfg->lengths || !cfg->depths ||
        cfg->trials < 1 || cfg->trials > 100000 || cfg->n_lengths > 4096 || cfg->n_depths > 4096)
        return kkv_fail(KKV_ERR_INVALID_ARG, "passkey: need lengths, depths and 1..100000 trials");
    for (int l = 0; l < cfg->n_lengths; l++)
        if (cfg->lengths[l] < 1 || cfg->lengths[l] > (1 << 24))
            return kkv_fail(KKV_ERR_INVALID_ARG, "passkey: length %d outside 1..16777216",
                            cfg->lengths[l]);
    for (int d = 0; d < cfg->n_depths; d++)
        if (!(cfg->depths[d] >= 0.0f && cfg->depths[d] <= 1.0f))
            return kkv_fail(KKV_ERR_INVALID_ARG, "passkey: depth %g outside [0, 1]",
                            (double)cfg->depths[d]);
    kkv_model_info info;
    kkv_model_get_info(m, &info);
    kkv_method *methods = calloc((size_t)n_specs, sizeof *methods); /* [n_specs] */
    if (!methods) return kkv_fail(KKV_ERR_NOMEM, "passkey: out of memory");
    for (int s = 0; s < n_specs; s++) {
        kkv_status st = specs[s] ? kkv_method_parse(&methods[s], specs[s])
                                 : kkv_fail(KKV_ERR_INVALID_ARG, "passkey: NULL spec");
        if (st == KKV_OK && methods[s].select == KKV_SELECT_EXPLICIT)
            st = kkv_fail(KKV_ERR_INVALID_ARG, "passkey: %s: select=oracle is for `kittykv "
                          "analyze ablation` only", specs[s]);
        if (st == KKV_OK && kkv_method_check(&methods[s], info.head_dim) != KKV_OK)
            st = quote(KKV_ERR_INVALID_ARG, "method", specs[s]);
        if (st != KKV_OK) {
            free(methods);
            return st;
        }
    }
    const int T = cfg->trials, NL = cfg->n_lengths, ND = cfg->n_depths;
    const size_t n_cells = (size_t)n_specs * NL * ND, n_prompts = (size_t)T * NL * ND;
    memset(cells, 0, n_cells * sizeof *cells);
    int *keys = calloc(n_prompts, sizeof *keys);             /* [trial][length][depth] */
    int32_t **prompts = calloc(n_prompts, sizeof *prompts);  /* [trial][length][depth] */
    int *plen = calloc(n_prompts, sizeof *plen);             /* [trial][length][depth] */
    float *logits = malloc((size_t)info.n_vocab * sizeof *logits); /* [n_vocab] */
    kkv_cache *cache = NULL;
    kkv_status st = KKV_OK;
    if (!keys || !prompts || !plen || !logits) {
        st = kkv_fail(KKV_ERR_NOMEM, "passkey: out of memory");
        goto done;
    }
    for (size_t i = 0; i < n_cells; i++) {
        cells[i].trials = T;
        cells[i].keys = calloc((size_t)T, sizeof *cells[i].keys);
        cells[i].answers = calloc((size_t)T, sizeof *cells[i].answers);
        if (!cells[i].keys || !cells[i].answers) {
            st = kkv_fail(KKV_ERR_NOMEM, "passkey: out of memory");
            goto done;
        }
    }

    char needle[160], two[512];
    snprintf(needle, sizeof needle, NEEDLE, 12345, 12345);
    /* A filler unit's marginal cost: inside the haystack it merges with the
     * space before it, so count two units minus one. */
    snprintf(two, sizeof two, "%s%s", FILLER, FILLER);
    char head[FRAME_CAP], tail[FRAME_CAP];
    frame(m, head, tail);
    parts pt = {count_tokens(m, head, 1), count_tokens(m, two, 0) - count_tokens(m, FILLER, 0),
                count_tokens(m, needle, 0), count_tokens(m, tail, 1), head, tail};
    if (pt.head < 0 || pt.filler <= 0 || pt.needle < 0 || pt.tail < 0) {
        st = quote(KKV_ERR_FORMAT, "tokenizing the template", "prompt");
        goto done;
    }
    int max_len = 0;
    for (int t = 0; t < T; t++)
        for (int l = 0; l < NL; l++)
            for (int d = 0; d < ND; d++) {
                size_t pi = ((size_t)t * NL + l) * ND + d;
                keys[pi] = make_key(cfg->seed, t, l, d);
                char *text = build_prompt(&pt, cfg->lengths[l], cfg->depths[d], keys[pi]);
                if (!text) {
                    st = kkv_fail(KKV_ERR_NOMEM, "passkey: out of memory");
                    goto done;
                }
                st = kkv_tokenize_alloc(m, &prompts[pi], &plen[pi], text, strlen(text), 1, 1);
                free(text);
                if (st != KKV_OK) {
                    st = quote(st, "tokenizing a prompt", "prompt");
                    goto done;
                }
                if (plen[pi] > max_len) max_len = plen[pi];
            }

    double t0 = now_s();
    long done_runs = 0, total_runs = (long)(n_cells * (size_t)T);
    if (cfg->progress) cfg->progress(cfg->progress_user, 0, total_runs, 0.0);
    for (int s = 0; s < n_specs; s++) {
        /* Room for two sequences: the shared haystack and one trial forked
         * from it (each holds its own fp16 staging). */
        const int n_tok = max_len + KKV_PASSKEY_ANSWER_TOKENS;
        kkv_cache_config cc = kkv_model_cache_config(m, &methods[s], 0);
        cc.max_tokens = n_tok;
        cc.n_threads = cfg->pool ? 1 : cfg->n_threads;
        size_t one = 0;
        st = kkv_eval_pool_bytes(&one, &cc, n_tok);
        cc.pool_bytes = 2 * one;
        if (st == KKV_OK) st = kkv_cache_create(&cache, &cc);
        if (st == KKV_OK && cfg->pool) st = kkv_cache_set_threadpool(cache, cfg->pool);
        if (st != KKV_OK) {
            st = quote(st, "creating the cache", specs[s]);
            goto done;
        }
        for (int l = 0; l < NL; l++)
            for (int d = 0; d < ND; d++) {
                kkv_passkey_cell *c = &cells[((size_t)s * NL + l) * ND + d];
                /* The haystack before the needle is the same in every trial:
                 * prefill it once into a base sequence and fork it per trial. */
                const size_t first = (size_t)l * ND + d, stride = (size_t)NL * ND;
                int skip = T > 1 ? shared_prefix(prompts, plen, first, stride, T) : 0;
                int base = -1;
                if (skip > 0) {
                    st = kkv_seq_add(cache, &base);
                    if (st == KKV_OK)
                        st = kkv_model_forward(m, cache, logits, base, prompts[first], skip, 0);
                    if (st != KKV_OK) {
                        st = quote(st, "prefilling the shared haystack", specs[s]);
                        goto done;
                    }
                }
                for (int t = 0; t < T; t++) {
                    size_t pi = first + (size_t)t * stride;
                    c->tokens = plen[pi];
                    c->keys[t] = keys[pi];
                    st = run_one(c->answers[t], m, cache, &info, base, prompts[pi], plen[pi], skip,
                                 logits);
                    if (st != KKV_OK) {
                        st = quote(st, "generating", specs[s]);
                        goto done;
                    }
                    char key[16];
                    snprintf(key, sizeof key, "%d", keys[pi]);
                    c->correct += strstr(c->answers[t], key) != NULL;
                    if (cfg->progress)
                        cfg->progress(cfg->progress_user, ++done_runs, total_runs, now_s() - t0);
                }
                if (base >= 0) kkv_seq_free(cache, base);
                c->accuracy = (double)c->correct / T;
                wilson(&c->ci_lo, &c->ci_hi, c->correct, T);
            }
        kkv_cache_free(cache);
        cache = NULL;
    }
done:
    if (st != KKV_OK) kkv_passkey_cells_free(cells, n_cells);
    if (prompts)
        for (size_t i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(plen);
    free(keys);
    free(logits);
    free(methods);
    kkv_cache_free(cache);
    return st;
}
