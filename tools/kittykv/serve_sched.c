/* kittykv serve: the scheduler. One thread owns the model and the cache.
 * Each step: finished or abandoned sequences leave (their pages go back to
 * the pool), queued requests join while the pool takes their prompt, every
 * decoding sequence gets one token through ONE kkv_model_decode_batch, then
 * prefilling sequences get prompt chunks of a fixed size (so a long prompt
 * never stalls the others for more than one chunk). A request's numbers do
 * not depend on the rest of the batch: rows of a ragged decode batch are
 * computed independently, prompt chunk boundaries are fixed per request, and
 * each request samples with its own seeded kkv_sampler. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve.h"

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

srv_req *srv_req_new(void) {
    srv_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    if (pthread_cond_init(&r->cv, NULL)) {
        free(r);
        return NULL;
    }
    r->seq = -1;
    r->refs = 1; /* the HTTP side's */
    kkv_utf8_stream_init(&r->u8);
    return r;
}

static void req_free(srv_req *r) {
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->text);
    free(r->gen);
    kkv_sampler_free(r->smp);
    pthread_cond_destroy(&r->cv);
    free(r);
}

static void unref_locked(srv_req *r) {
    if (--r->refs == 0) req_free(r);
}

void srv_release(srv *s, srv_req *r) {
    if (!r) return;
    pthread_mutex_lock(&s->mu);
    if (r->state != REQ_DONE && !r->cancelled) {
        r->cancelled = 1; /* the scheduler frees its sequence at the next step */
        s->m.cancelled++;
        pthread_cond_signal(&s->wake);
    }
    unref_locked(r);
    pthread_mutex_unlock(&s->mu);
}

void srv_count_status(srv *s, int status) {
    int i = status == 200 ? 0 : status == 400 ? 1 : status == 401 ? 2
          : (status == 404 || status == 405) ? 3 : status == 413 ? 4 : 5;
    pthread_mutex_lock(&s->mu);
    s->m.req_by_status[i]++;
    pthread_mutex_unlock(&s->mu);
}

int srv_submit(srv *s, srv_req *r, char *msg, size_t cap) {
    if (kkv_sampler_create(&r->smp, &r->sp) != KKV_OK) {
        snprintf(msg, cap, "%s", kkv_last_error());
        return 400;
    }
    pthread_mutex_lock(&s->mu);
    int status = 0;
    if (s->stopping) {
        snprintf(msg, cap, "the server is shutting down");
        status = 503;
    } else if (s->n_queued >= s->queue_max + (s->parallel - s->n_active)) {
        /* the bound is on requests beyond the free batch slots: a burst into an
         * idle server is not refused for arriving during a step */
        snprintf(msg, cap, "the wait queue is full (%d requests waiting for KV memory)",
                 s->n_queued);
        status = 503;
    } else {
        r->t_submit = srv_now();
        r->state = REQ_QUEUED;
        r->refs++; /* the scheduler's */
        r->next = NULL;
        if (s->queue_tail) s->queue_tail->next = r;
        else s->queue_head = r;
        s->queue_tail = r;
        s->n_queued++;
        s->m.queued = s->n_queued;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    return status;
}

/* ---- text of a request (under mu) */

static int append(srv_req *r, const char *p, size_t n) {
    if (r->text_len + n + 1 > r->text_cap) {
        size_t cap = r->text_cap ? r->text_cap : 256;
        while (cap < r->text_len + n + 1) cap *= 2;
        char *t = realloc(r->text, cap);
        if (!t) return -1;
        r->text = t;
        r->text_cap = cap;
    }
    memcpy(r->text + r->text_len, p, n);
    r->text_len += n;
    r->text[r->text_len] = 0;
    return 0;
}

static void finish(srv *s, srv_req *r, const char *reason, int flush) {
    if (r->state == REQ_DONE) return;
    if (flush) {
        char tail[3];
        size_t n = kkv_utf8_stream_flush(&r->u8, tail);
        if (n) append(r, tail, n);
    }
    r->emit_len = r->text_len;
    r->finish = reason;
    r->state = REQ_DONE;
    if (!strcmp(reason, "stop")) s->m.finished_stop++;
    else s->m.finished_length++;
    pthread_cond_broadcast(&r->cv);
}

static void reject(srv *s, srv_req *r, int status, const char *msg) {
    r->err_status = status;
    snprintf(r->err_msg, sizeof r->err_msg, "%s", msg);
    r->emit_len = r->text_len;
    r->state = REQ_DONE;
    pthread_cond_broadcast(&r->cv);
    (void)s;
}

/* Cuts the text at the earliest stop string that ends in the bytes appended
 * after old_len. 1 if one was found. */
static int check_stop(srv_req *r, size_t old_len) {
    size_t best = (size_t)-1;
    for (int i = 0; i < r->n_stop; i++) {
        size_t L = strlen(r->stop[i]);
        if (L == 0 || L > r->text_len) continue;
        size_t from = old_len + 1 > L ? old_len + 1 - L : 0;
        for (size_t p = from; p + L <= r->text_len && p < best; p++)
            if (!memcmp(r->text + p, r->stop[i], L)) {
                best = p;
                break;
            }
    }
    if (best == (size_t)-1) return 0;
    r->text_len = best;
    r->text[best] = 0;
    return 1;
}

/* What may be sent: all but a tail that is a proper prefix of a stop string,
 * and never half a UTF-8 character. */
static void update_emit(srv_req *r) {
    size_t hold = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t L = strlen(r->stop[i]);
        for (size_t k = L > 0 ? L - 1 : 0; k > hold; k--)
            if (k <= r->text_len && !memcmp(r->text + r->text_len - k, r->stop[i], k)) {
                hold = k;
                break;
            }
    }
    size_t e = r->text_len - hold;
    while (e > r->emit_len && ((unsigned char)r->text[e] & 0xC0) == 0x80) e--;
    if (e > r->emit_len) r->emit_len = e;
}

static void on_token(srv *s, srv_req *r, int32_t tok, double now) {
    if (r->state == REQ_DONE) return;
    if (r->n_gen == r->gen_cap) {
        int cap = r->gen_cap ? 2 * r->gen_cap : 64;
        int32_t *g = realloc(r->gen, (size_t)cap * sizeof *g);
        if (g) {
            r->gen = g;
            r->gen_cap = cap;
        }
    }
    if (r->n_gen < r->gen_cap) r->gen[r->n_gen] = tok;
    r->n_gen++;
    s->m.gen_tokens++;
    if (r->t_first == 0) r->t_first = now;
    kkv_sampler_accept(r->smp, tok);
    if (!r->ignore_eos && (tok == s->info.eos || tok == s->info.eot)) {
        finish(s, r, "stop", 1);
        return;
    }
    char piece[512];
    size_t plen = 0;
    if (kkv_token_piece(s->model, piece, sizeof piece, &plen, tok) != KKV_OK) plen = 0;
    char out[KKV_UTF8_STREAM_BOUND(512)];
    size_t o = kkv_utf8_stream_feed(&r->u8, out, piece, plen);
    size_t old = r->text_len;
    if (append(r, out, o)) {
        reject(s, r, 500, "out of memory for the generated text");
        return;
    }
    if (check_stop(r, old)) {
        finish(s, r, "stop", 0);
        return;
    }
    if (r->n_gen >= r->max_tokens || r->n_prompt + r->n_gen >= s->ctx) {
        finish(s, r, "length", 1);
        return;
    }
    r->last = tok;
    update_emit(r);
    pthread_cond_broadcast(&r->cv);
}

/* ---- prefix cache (scheduler thread, under mu) */

static void pc_drop(srv *s, int i) {
    kkv_seq_free(s->cache, s->pc[i].seq);
    free(s->pc[i].tokens);
    s->pc[i] = s->pc[--s->n_pc];
}

/* The least recently used entry other than `keep` (-1: none kept), or -1. */
static int pc_lru(const srv *s, int keep) {
    int lru = -1;
    for (int i = 0; i < s->n_pc; i++)
        if (i != keep && (lru < 0 || s->pc[i].last_used < s->pc[lru].last_used)) lru = i;
    return lru;
}

/* Frees the least recently used entry but `*keep` (which pc_drop may move:
 * *keep follows it; NULL keeps none); 0 if there was none to free. */
static int pc_evict_but(srv *s, int *keep) {
    int v = pc_lru(s, keep ? *keep : -1);
    if (v < 0) return 0;
    if (keep && *keep == s->n_pc - 1) *keep = v; /* pc_drop moves the last entry to v */
    pc_drop(s, v);
    s->m.prefix_evictions++;
    return 1;
}

static int pc_evict(srv *s) { return pc_evict_but(s, NULL); }

/* The entry holding exactly toks [n], or -1. */
static int pc_same(const srv *s, const int32_t *toks, int n) {
    for (int i = 0; i < s->n_pc; i++)
        if (s->pc[i].n == n && !memcmp(s->pc[i].tokens, toks, (size_t)n * sizeof *toks))
            return i;
    return -1;
}

/* Makes seq an entry holding toks [n] (copied); a room is made by LRU. On
 * failure (no memory) the sequence is freed. */
static void pc_insert(srv *s, int seq, const int32_t *toks, int n) {
    int32_t *t = malloc((size_t)n * sizeof *t);
    if (!t) {
        kkv_seq_free(s->cache, seq);
        return;
    }
    memcpy(t, toks, (size_t)n * sizeof *t);
    if (s->n_pc == s->pc_max) pc_evict(s);
    s->pc[s->n_pc++] = (srv_prefix){seq, t, n, ++s->tick};
}

/* Keeps a finished request's sequence as an entry when every token it holds
 * is known (prompt + generated tokens fed back) and no entry holds the same
 * tokens already; else frees it. */
static void pc_keep_or_free(srv *s, srv_req *r) {
    int held = kkv_seq_len(s->cache, r->seq, 0);
    int ok = s->pc_max > 0 && r->cache_prompt && !r->cancelled && !r->err_status &&
             r->n_gen > 0 && r->n_gen <= r->gen_cap && held == r->n_prompt + r->n_gen - 1;
    int32_t *t = ok ? malloc((size_t)held * sizeof *t) : NULL; /* [held] */
    if (!t) {
        kkv_seq_free(s->cache, r->seq);
        return;
    }
    memcpy(t, r->prompt, (size_t)r->n_prompt * sizeof *t);
    memcpy(t + r->n_prompt, r->gen, (size_t)(held - r->n_prompt) * sizeof *t);
    int same = pc_same(s, t, held);
    if (same >= 0) { /* the same request again: the pool stays where it was */
        s->pc[same].last_used = ++s->tick;
        kkv_seq_free(s->cache, r->seq);
    } else {
        pc_insert(s, r->seq, t, held);
    }
    free(t);
}

/* r's prefill has reached one of its cuts (n = r->n_fed tokens held): a fork
 * of its sequence becomes an entry for the prompts that share those tokens.
 * Room for the fork's copied staging comes from LRU entries, never from the
 * running requests; if there is none it is skipped. */
static void pc_fork_cut(srv *s, srv_req *r, int n) {
    int same = pc_same(s, r->prompt, n);
    if (same >= 0) {
        s->pc[same].last_used = ++s->tick;
        return;
    }
    if (s->n_pc == s->pc_max) pc_evict(s);
    int child = -1;
    kkv_status st;
    while ((st = kkv_seq_fork(s->cache, &child, r->seq)) == KKV_ERR_POOL_FULL && pc_evict(s)) {
    }
    if (st != KKV_OK) return;
    pc_insert(s, child, r->prompt, n);
    s->m.prefix_forks++;
}

/* The entry holding the longest proper prefix of r's prompt, or -1; *lcp =
 * the most leading tokens r shares with any entry (a prefix of it or not). */
static int pc_find(const srv *s, const srv_req *r, int *lcp) {
    int best = -1;
    *lcp = 0;
    for (int i = 0; i < s->n_pc; i++) {
        const srv_prefix *e = &s->pc[i];
        int k = 0, m = e->n < r->n_prompt ? e->n : r->n_prompt;
        while (k < m && e->tokens[k] == r->prompt[k]) k++;
        if (k > *lcp) *lcp = k;
        if (k == e->n && e->n < r->n_prompt && (best < 0 || e->n > s->pc[best].n)) best = i;
    }
    return best;
}

/* Adds cut position p to r's ascending cuts (if new and room). */
static void add_cut(srv_req *r, int p) {
    int i = 0;
    while (i < r->n_cuts && r->cuts[i] < p) i++;
    if ((i < r->n_cuts && r->cuts[i] == p) || r->n_cuts == SRV_MAX_CUTS) return;
    memmove(r->cuts + i + 1, r->cuts + i, (size_t)(r->n_cuts - i) * sizeof *r->cuts);
    r->cuts[i] = p;
    r->n_cuts++;
}

static void pc_account(srv *s) {
    int ids[4096 + 1]; /* [n_pc] entries, then [n_active] requests; pc_max <= 4096 */
    int n = 0;
    kkv_mem m;
    for (int i = 0; i < s->n_pc; i++) ids[n++] = s->pc[i].seq;
    s->m.prefix_bytes = n && kkv_seqs_mem(s->cache, &m, ids, n) == KKV_OK ? m.capacity : 0;
    s->m.prefix_entries = s->n_pc;
    n = 0;
    for (srv_req *r = s->active; r && n < 4096; r = r->next)
        if (r->seq >= 0) ids[n++] = r->seq;
    s->m.request_bytes = n && kkv_seqs_mem(s->cache, &m, ids, n) == KKV_OK ? m.capacity : 0;
}

/* ---- lists (under mu) */

static void reap(srv *s, double now) {
    for (srv_req **pp = &s->active; *pp;) {
        srv_req *r = *pp;
        if (r->cancelled || r->state == REQ_DONE) {
            pc_keep_or_free(s, r);
            r->seq = -1;
            if (r->state != REQ_DONE) r->state = REQ_DONE;
            *pp = r->next;
            s->n_active--;
            unref_locked(r);
        } else {
            pp = &r->next;
        }
    }
    srv_req *prev = NULL;
    for (srv_req *r = s->queue_head; r;) {
        srv_req *next = r->next;
        int drop = r->cancelled;
        if (!drop && now - r->t_submit > s->queue_timeout_s) {
            char msg[160];
            snprintf(msg, sizeof msg, "timed out after %.0f s waiting for KV memory",
                     s->queue_timeout_s);
            reject(s, r, 503, msg);
            drop = 1;
        }
        if (drop) {
            if (prev) prev->next = next;
            else s->queue_head = next;
            if (s->queue_tail == r) s->queue_tail = prev;
            s->n_queued--;
            unref_locked(r);
        } else {
            prev = r;
        }
        r = next;
    }
}

static void push_active(srv *s, srv_req *r) {
    r->next = NULL;
    srv_req **pp = &s->active;
    while (*pp) pp = &(*pp)->next;
    *pp = r;
    s->n_active++;
}

/* Moves queued requests into the batch while the pool takes their prompt (and
 * the first generated token). One that cannot fit even in an empty pool gets
 * 503 at once instead of waiting out its timeout. */
static void admit(srv *s) {
    while (s->queue_head && s->n_active < s->parallel) {
        srv_req *r = s->queue_head;
        int lcp = 0, seq = -1, reused = 0;
        int hit = r->cache_prompt ? pc_find(s, r, &lcp) : -1;
        kkv_status st;
        for (;;) {
            if (hit >= 0) { /* fork the entry: its tokens are r's prefix */
                reused = s->pc[hit].n;
                st = kkv_seq_fork(s->cache, &seq, s->pc[hit].seq);
                if (st == KKV_OK) {
                    st = kkv_seq_reserve(s->cache, seq, r->n_prompt - reused + 1);
                    if (st != KKV_OK) kkv_seq_free(s->cache, seq);
                }
            } else {
                st = kkv_seq_add(s->cache, &seq);
                if (st == KKV_OK) {
                    st = kkv_seq_reserve(s->cache, seq, r->n_prompt + 1);
                    if (st != KKV_OK) kkv_seq_free(s->cache, seq);
                }
            }
            /* make room from the prefix cache, never from the entry being forked */
            if (st != KKV_ERR_POOL_FULL || !pc_evict_but(s, hit >= 0 ? &hit : NULL)) break;
        }
        if (st == KKV_ERR_POOL_FULL && s->n_active > 0) break; /* wait for room */
        s->queue_head = r->next;
        if (!s->queue_head) s->queue_tail = NULL;
        s->n_queued--;
        if (st != KKV_OK) {
            char msg[200];
            if (st == KKV_ERR_POOL_FULL)
                snprintf(msg, sizeof msg, "the prompt (%d tokens) needs more KV memory than "
                         "the whole pool (--kv-budget) holds", r->n_prompt);
            else
                snprintf(msg, sizeof msg, "adding a sequence: %s", kkv_last_error());
            reject(s, r, st == KKV_ERR_POOL_FULL ? 503 : 500, msg);
            unref_locked(r);
            continue;
        }
        if (hit >= 0) s->pc[hit].last_used = ++s->tick;
        /* the prompt and an entry part within the prompt: keep the part they share
         * (a system prompt the template did not mark) if it saves enough */
        if (r->cache_prompt && s->pc_max > 0) {
            if (lcp < r->n_prompt && lcp >= reused + SRV_PREFIX_MIN) add_cut(r, lcp);
        } else {
            r->n_cuts = 0;
        }
        r->cut_i = 0;
        while (r->cut_i < r->n_cuts && r->cuts[r->cut_i] <= reused) r->cut_i++;
        r->seq = seq;
        r->n_fed = reused;
        r->reused = reused;
        if (reused) {
            s->m.prefix_hits++;
            s->m.prefix_tokens_reused += (uint64_t)reused;
        } else {
            s->m.prefix_misses++;
        }
        r->state = REQ_PREFILL;
        pthread_cond_broadcast(&r->cv);
        s->m.prompt_tokens += (uint64_t)r->n_prompt;
        push_active(s, r);
    }
}

typedef struct sched_buf {
    float   *logits;  /* [parallel][n_vocab] decode logits */
    float   *plogits; /* [n_vocab] logits of a prompt's last token */
    int     *seqs;    /* [parallel] */
    int32_t *toks;    /* [parallel] tokens fed, then tokens sampled */
    srv_req **batch;  /* [parallel] */
    srv_req **pf;     /* [parallel] prefill chunks of this step */
    int     *pf_n;    /* [parallel] */
} sched_buf;

static void step(srv *s, sched_buf *b) {
    /* under mu on entry and exit */
    const size_t V = (size_t)s->info.n_vocab;
    int nb = 0, np = 0, budget = s->chunk;
    for (srv_req *r = s->active; r; r = r->next) {
        if (r->cancelled || r->state != REQ_DECODE) continue;
        kkv_status st = kkv_seq_reserve(s->cache, r->seq, 1);
        while (st == KKV_ERR_POOL_FULL && pc_evict(s)) st = kkv_seq_reserve(s->cache, r->seq, 1);
        if (st != KKV_OK) { /* this one is out of pool: it ends, the others go on */
            finish(s, r, "length", 1);
            continue;
        }
        b->batch[nb] = r;
        b->seqs[nb] = r->seq;
        b->toks[nb] = r->last;
        nb++;
    }
    for (srv_req *r = s->active; r && budget > 0; r = r->next) {
        if (r->cancelled || r->state != REQ_PREFILL) continue;
        int n = r->n_prompt - r->n_fed;
        if (n > s->chunk) n = s->chunk;
        /* a chunk ends at the next cut, where the prefix is forked off */
        if (r->cut_i < r->n_cuts && r->n_fed + n > r->cuts[r->cut_i])
            n = r->cuts[r->cut_i] - r->n_fed;
        if (np > 0 && n > budget) break;
        b->pf[np] = r;
        b->pf_n[np++] = n;
        budget -= n;
    }
    pthread_mutex_unlock(&s->mu);

    double t0 = srv_now();
    kkv_status sd = KKV_OK;
    if (nb) {
        sd = kkv_model_decode_batch(s->model, s->cache, b->logits, b->seqs, b->toks, nb);
        if (sd == KKV_OK)
            for (int i = 0; i < nb; i++)
                if (kkv_sampler_sample(b->batch[i]->smp, &b->toks[i], b->logits + (size_t)i * V,
                                       (int)V) != KKV_OK)
                    b->toks[i] = s->info.eos;
    }
    double t1 = srv_now();
    char dec_err[200] = "";
    if (sd != KKV_OK) snprintf(dec_err, sizeof dec_err, "decode: %s", kkv_last_error());

    pthread_mutex_lock(&s->mu);
    if (nb) {
        for (int i = 0; i < nb; i++) {
            if (sd == KKV_OK) on_token(s, b->batch[i], b->toks[i], t1);
            else if (sd == KKV_ERR_POOL_FULL) finish(s, b->batch[i], "length", 1);
            else reject(s, b->batch[i], 500, dec_err);
        }
        s->m.decode_steps++;
        double tps = (double)nb / (t1 - t0 > 1e-9 ? t1 - t0 : 1e-9);
        s->m.decode_tps = s->m.decode_tps == 0 ? tps : 0.9 * s->m.decode_tps + 0.1 * tps;
    }
    pthread_mutex_unlock(&s->mu);

    for (int i = 0; i < np; i++) {
        srv_req *r = b->pf[i];
        int last = r->n_fed + b->pf_n[i] == r->n_prompt;
        kkv_status st = kkv_model_forward(s->model, s->cache, last ? b->plogits : NULL, r->seq,
                                          r->prompt + r->n_fed, b->pf_n[i], 0);
        int32_t tok = 0;
        if (st == KKV_OK && last && kkv_sampler_sample(r->smp, &tok, b->plogits, (int)V) != KKV_OK)
            tok = s->info.eos;
        char err[200] = "";
        if (st != KKV_OK && st != KKV_ERR_POOL_FULL)
            snprintf(err, sizeof err, "prefill: %s", kkv_last_error());
        double t2 = srv_now();
        pthread_mutex_lock(&s->mu);
        s->m.prefill_chunks++;
        if (st == KKV_OK) {
            r->n_fed += b->pf_n[i];
            if (r->cut_i < r->n_cuts && r->n_fed == r->cuts[r->cut_i]) {
                pc_fork_cut(s, r, r->n_fed);
                r->cut_i++;
            }
            if (last) {
                r->state = REQ_DECODE;
                on_token(s, r, tok, t2);
            }
        } else if (st == KKV_ERR_POOL_FULL) {
            finish(s, r, "length", 1);
        } else {
            reject(s, r, 500, err);
        }
        pthread_mutex_unlock(&s->mu);
    }

    pthread_mutex_lock(&s->mu);
    kkv_cache_mem(s->cache, &s->m.mem);
    s->m.pool_free = kkv_cache_free_bytes(s->cache);
    pc_account(s);
}

static void *sched_main(void *arg) {
    srv *s = arg;
    sched_buf b;
    size_t V = (size_t)s->info.n_vocab, P = (size_t)s->parallel;
    b.logits = malloc(P * V * sizeof *b.logits);
    b.plogits = malloc(V * sizeof *b.plogits);
    b.seqs = malloc(P * sizeof *b.seqs);
    b.toks = malloc(P * sizeof *b.toks);
    b.batch = malloc(P * sizeof *b.batch);
    b.pf = malloc(P * sizeof *b.pf);
    b.pf_n = malloc(P * sizeof *b.pf_n);
    int ok = b.logits && b.plogits && b.seqs && b.toks && b.batch && b.pf && b.pf_n;

    pthread_mutex_lock(&s->mu);
    if (!ok) {
        fprintf(stderr, "kittykv serve: out of memory for the scheduler\n");
        s->stopping = 1;
    }
    kkv_cache_mem(s->cache, &s->m.mem);
    s->m.pool_free = kkv_cache_free_bytes(s->cache);
    while (!s->stopping) {
        reap(s, srv_now());
        admit(s);
        s->m.active = s->n_active;
        s->m.queued = s->n_queued;
        if (!s->active) {
            kkv_cache_mem(s->cache, &s->m.mem);
            s->m.pool_free = kkv_cache_free_bytes(s->cache);
            pc_account(s);
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 200 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&s->wake, &s->mu, &ts);
            continue;
        }
        step(s, &b);
    }
    /* shutdown: everyone still here is told so */
    for (srv_req *r = s->active; r; r = r->next)
        if (r->state != REQ_DONE) reject(s, r, 503, "the server is shutting down");
    for (srv_req *r = s->queue_head; r; r = r->next)
        reject(s, r, 503, "the server is shutting down");
    while (s->active) {
        srv_req *r = s->active;
        s->active = r->next;
        kkv_seq_free(s->cache, r->seq);
        unref_locked(r);
    }
    while (s->queue_head) {
        srv_req *r = s->queue_head;
        s->queue_head = r->next;
        unref_locked(r);
    }
    s->queue_tail = NULL;
    s->n_active = s->n_queued = 0;
    while (s->n_pc) pc_drop(s, s->n_pc - 1);
    pthread_mutex_unlock(&s->mu);
    free(b.logits);
    free(b.plogits);
    free(b.seqs);
    free(b.toks);
    free(b.batch);
    free(b.pf);
    free(b.pf_n);
    return NULL;
}

int srv_start(srv *s) {
    if (pthread_mutex_init(&s->mu, NULL) || pthread_cond_init(&s->wake, NULL) ||
        pthread_mutex_init(&s->tok_mu, NULL))
        return -1;
    return pthread_create(&s->thread, NULL, sched_main, s) ? -1 : 0;
}

void srv_stop(srv *s) {
    pthread_mutex_lock(&s->mu);
    s->stopping = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
}
