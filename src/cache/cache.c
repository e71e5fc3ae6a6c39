/* Cache lifecycle: create/free, sequences, and the token lifecycle of
 * docs/FORMAT.md section 3 (append -> attend -> flush). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "cache/rotate.h"
#include "core/bigmem.h"
#include "core/fp16.h"
#include "core/rng.h"
#include "core/status.h"
#include "quant/quant.h"

#define DEFAULT_MAX_SEQS 256

kkv_status kkv_cache_create(kkv_cache **out, const kkv_cache_config *cfg) {
    if (out) *out = NULL;
    if (!out || !cfg) return kkv_fail(KKV_ERR_INVALID_ARG, "cache: NULL argument");
    if (cfg->n_layers < 1 || cfg->n_layers > 4096)
        return kkv_fail(KKV_ERR_INVALID_ARG, "cache: n_layers %d must be in 1..4096",
                        cfg->n_layers);
    if (cfg->n_kv_heads < 1 || cfg->n_kv_heads > 1024)
        return kkv_fail(KKV_ERR_INVALID_ARG, "cache: n_kv_heads %d must be in 1..1024",
                        cfg->n_kv_heads);
    if (cfg->max_seqs < 0 || cfg->max_seqs > (1 << 20) || cfg->max_tokens < 0 ||
        cfg->n_threads < 0 || cfg->n_threads > 1024)
        return kkv_fail(KKV_ERR_INVALID_ARG, "cache: negative or huge max_seqs/max_tokens/n_threads");
    KKV_TRY(kkv_method_check(&cfg->method, cfg->head_dim));
    for (int l = 0; cfg->layer_window && l < cfg->n_layers; l++)
        if (cfg->layer_window[l] < 0)
            return kkv_fail(KKV_ERR_INVALID_ARG, "cache: layer_window[%d] = %d is negative", l,
                            cfg->layer_window[l]);
    if (cfg->method.budget && cfg->n_kv_heads > KKV_MAX_BUDGET_HEADS)
        return kkv_fail(KKV_ERR_INVALID_ARG, "cache: budget pools at most %d KV heads, not %d",
                        KKV_MAX_BUDGET_HEADS, cfg->n_kv_heads);
    if (cfg->method.select == KKV_SELECT_EXPLICIT && cfg->method.fp16)
        return kkv_fail(KKV_ERR_INVALID_ARG, "cache: explicit selection with fp16 method");

    kkv_cache *c = calloc(1, sizeof *c);
    if (!c) return kkv_fail(KKV_ERR_NOMEM, "cache: out of memory");
    c->cfg = *cfg;
    if (!c->cfg.max_seqs) c->cfg.max_seqs = DEFAULT_MAX_SEQS;
    const kkv_method *m = &cfg->method;
    c->L = cfg->n_layers;
    c->H = cfg->n_kv_heads;
    c->D = cfg->head_dim;
    c->G = m->group;
    c->fp16 = m->fp16;
    c->S = m->fp16 ? 0 : m->sink;
    c->R = m->fp16 ? 0 : m->window;
    c->nb = kkv_method_boost(m, c->D);
    c->vbits = m->value_bits;
    c->kbits = !c->fp16 && m->key_bits == 8 ? 8 : 2;
    c->sink8 = !c->fp16 && m->sink_int8;
    c->srow = c->sink8 ? c->D / 2 + 1 : c->D;
    c->kpage = kkv_method_key_page_bytes(m, c->D, c->nb);
    c->vpage = c->fp16 ? c->kpage : kkv_value_page_bytes(c->D, c->G, c->vbits);
    c->eager = !c->fp16 && m->eager_values;
    c->bmode = c->fp16 ? 0 : (int)m->budget;
    c->kpage0 = c->fp16 ? 0 : kkv_key_page_bytes(c->D, c->G, 0);
    c->slot_bytes = (size_t)c->H * (c->kpage + c->vpage);
    c->max_k = c->G;
    c->max_v = c->eager ? c->R : c->R + c->G;
    c->budget = cfg->pool_bytes;
    uint64_t max_slots = c->budget / c->slot_bytes;
    c->max_slots = max_slots > (1u << 30) ? (1 << 30) : (int)max_slots;
    size_t n_chunks = kkv_n_chunks(c), per = KKV_BIG_CARVE ? KKV_SLAB_BYTES / kkv_chunk_stride(c) : 1;
    c->slab_chunks = per < 1 ? 1 : (int)per; /* <= 32 MiB / 64 B; a chunk past 32 MiB is a slab */
    c->chunks = calloc(n_chunks ? n_chunks : 1, sizeof *c->chunks);
    c->slabs = calloc(kkv_n_slabs(c) ? kkv_n_slabs(c) : 1, sizeof *c->slabs);
    c->seqs = calloc((size_t)c->cfg.max_seqs, sizeof *c->seqs);
    c->tile = malloc((size_t)c->G * c->D * sizeof *c->tile);
    if (c->bmode) c->bscore = malloc((size_t)c->H * c->D * sizeof *c->bscore);
    kkv_status s = KKV_OK;
    if (!c->chunks || !c->slabs || !c->seqs || !c->tile || (c->bmode && !c->bscore))
        s = kkv_fail(KKV_ERR_NOMEM, "cache: out of memory");
    c->cfg.layer_window = NULL;
    if (s == KKV_OK && cfg->layer_window) {
        c->win = malloc((size_t)c->L * sizeof *c->win);
        if (!c->win) s = kkv_fail(KKV_ERR_NOMEM, "cache: out of memory");
        for (int l = 0; c->win && l < c->L; l++) c->win[l] = cfg->layer_window[l];
        c->cfg.layer_window = c->win;
    }
    if (s == KKV_OK && !c->fp16)
        s = kkv_rot_make(&c->krot, m->key_rot, c->D, kkv_mix64(m->seed, 1));
    if (s == KKV_OK && !c->fp16)
        s = kkv_rot_make(&c->vrot, m->value_rot, c->D, kkv_mix64(m->seed, 2));
    if (s == KKV_OK) s = kkv_tp_create(&c->tp_own, cfg->n_threads);
    c->tp = c->tp_own;
    if (s == KKV_OK) s = kkv_cache_set_kernel(c, KKV_KERNEL_AUTO);
    if (s != KKV_OK) {
        kkv_cache_free(c);
        return s;
    }
    *out = c;
    return KKV_OK;
}

static void seq_release(kkv_cache *c, kkv_seq *s) {
    if (s->ly)
        for (int l = 0; l < c->L; l++) {
            kkv_lseq *y = &s->ly[l];
            for (int p = 0; p < y->n_slots; p++)
                if (y->slots[p] >= 0) kkv_pool_give(c, y->slots[p]); /* -1: released */
            kkv_sink_drop(c, y->sk, y->cs);
            free(y->slots);
            free(y->stage);
        }
    if (s->live) c->used -= s->credit;
    free(s->ly);
    memset(s, 0, sizeof *s);
}

void kkv_cache_free(kkv_cache *c) {
    if (!c) return;
    if (c->seqs)
        for (int i = 0; i < c->cfg.max_seqs; i++)
            if (c->seqs[i].live) seq_release(c, &c->seqs[i]);
    if (c->slabs) {
        for (size_t i = 0; i < kkv_n_slabs(c); i++) kkv_big_free(c->slabs[i], kkv_slab_bytes(c, i));
    }
    free(c->slabs);
    kkv_tp_free(c->tp_own);
    free(c->chunks);
    free(c->free_slots);
    free(c->ref);
    free(c->seqs);
    free(c->rank);
    free(c->tile);
    free(c->bscore);
    free(c->attn_buf);
    free(c->attn_plan);
    free(c->win);
    free(c->krot);
    free(c->vrot);
    free(c->rot_buf);
    free(c);
}

const kkv_cache_config *kkv_cache_get_config(const kkv_cache *c) { return c ? &c->cfg : NULL; }

kkv_status kkv_cache_set_threadpool(kkv_cache *c, kkv_threadpool *tp) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "set_threadpool: NULL cache");
    c->tp = tp ? tp : c->tp_own;
    return KKV_OK;
}

kkv_seq *kkv_seq_get(const kkv_cache *c, int seq) {
    if (!c || seq < 0 || seq >= c->cfg.max_seqs || !c->seqs[seq].live) return NULL;
    return &c->seqs[seq];
}

int kkv_seq_new_id(const kkv_cache *c) {
    for (int i = 0; i < c->cfg.max_seqs; i++)
        if (!c->seqs[i].live) return i;
    return -1;
}

kkv_status kkv_seq_mark_failed(kkv_cache *c, int seq) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "mark_failed: NULL cache");
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "mark_failed: no sequence %d", seq);
    s->failed = 1;
    return KKV_OK;
}

kkv_status kkv_seq_check_usable(const kkv_seq *s, int seq, const char *what) {
    if (s->failed)
        return kkv_fail(KKV_ERR_INVALID_ARG, "%s: sequence %d holds part of a failed forward "
                        "pass; free it", what, seq);
    return KKV_OK;
}

/* An empty sequence holds nothing from the pool: staging and pages come as
 * tokens arrive (or with kkv_seq_reserve). */
kkv_status kkv_seq_add(kkv_cache *c, int *seq) {
    if (!c || !seq) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_add: NULL argument");
    int id = kkv_seq_new_id(c);
    if (id < 0)
        return kkv_fail(KKV_ERR_POOL_FULL, "seq_add: all %d sequence slots in use",
                        c->cfg.max_seqs);
    kkv_seq *s = &c->seqs[id];
    s->ly = calloc((size_t)c->L, sizeof *s->ly);
    if (!s->ly) return kkv_fail(KKV_ERR_NOMEM, "seq_add: out of memory");
    for (int l = 0; c->win && l < c->L; l++) s->ly[l].win = c->win[l];
    s->live = 1;
    *seq = id;
    return KKV_OK;
}

kkv_status kkv_seq_free(kkv_cache *c, int seq) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_free: NULL cache");
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "seq_free: no sequence %d", seq);
    seq_release(c, s);
    return KKV_OK;
}

kkv_status kkv_seq_fork(kkv_cache *c, int *child, int parent) {
    if (!c || !child) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_fork: NULL argument");
    kkv_seq *p = kkv_seq_get(c, parent);
    if (!p) return kkv_fail(KKV_ERR_NOT_FOUND, "seq_fork: no sequence %d", parent);
    KKV_TRY(kkv_seq_check_usable(p, parent, "seq_fork"));
    int id = kkv_seq_new_id(c);
    if (id < 0)
        return kkv_fail(KKV_ERR_POOL_FULL, "seq_fork: all %d sequence slots in use",
                        c->cfg.max_seqs);
    /* pages still being written (key written, values not all) are copied, and
     * so is a sink that is not full yet; a full sink is shared */
    int n_copy = 0;
    uint64_t sink_copy = 0;
    for (int l = 0; l < c->L; l++) {
        kkv_counts n = kkv_counts_of(c, p, l);
        int full = n.kp < n.vp ? n.kp : n.vp;
        n_copy += p->ly[l].n_slots - full;
        if (p->ly[l].sk && n.sink < c->S) sink_copy += kkv_sink_bytes(c, p->ly[l].cs);
    }
    uint64_t need = p->stage_bytes + (uint64_t)n_copy * c->slot_bytes + sink_copy;
    if (need > c->budget - c->used)
        return kkv_fail(KKV_ERR_POOL_FULL,
                        "seq_fork: pool full: %llu of %llu bytes in use, the fork needs %llu",
                        (unsigned long long)c->used, (unsigned long long)c->budget,
                        (unsigned long long)need);
    kkv_seq *s = &c->seqs[id];
    kkv_seq tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.ly = calloc((size_t)c->L, sizeof *tmp.ly);
    kkv_status st = tmp.ly ? KKV_OK : kkv_fail(KKV_ERR_NOMEM, "seq_fork: out of memory");
    int l_done = 0; /* layers whose copied slots are taken */
    for (int l = 0; l < c->L && st == KKV_OK; l++) {
        const kkv_lseq *y = &p->ly[l];
        kkv_lseq *x = &tmp.ly[l];
        kkv_counts n = kkv_counts_of(c, p, l);
        int full = n.kp < n.vp ? n.kp : n.vp;
        *x = *y;
        x->slots = NULL, x->stage = NULL, x->sk = NULL, x->n_slots = 0, x->cap_slots = 0;
        if (y->sk && n.sink < c->S) {
            x->sk = kkv_sink_new(c, y->cs);
            if (!x->sk) {
                st = kkv_fail(KKV_ERR_NOMEM, "seq_fork: out of memory");
                break;
            }
            memcpy(x->sk->data, y->sk->data, (size_t)kkv_sink_bytes(c, y->cs));
        }
        size_t sb = (size_t)kkv_stage_bytes(c, 0, y->ck, y->cv);
        if (sb) {
            x->stage = malloc(sb);
            if (!x->stage) {
                st = kkv_fail(KKV_ERR_NOMEM, "seq_fork: out of memory");
                break;
            }
            memcpy(x->stage, y->stage, sb);
        }
        if (y->n_slots) {
            x->slots = malloc((size_t)y->n_slots * sizeof *x->slots);
            if (!x->slots) {
                st = kkv_fail(KKV_ERR_NOMEM, "seq_fork: out of memory");
                break;
            }
            x->cap_slots = y->n_slots;
        }
        for (int q = full; q < y->n_slots && st == KKV_OK; q++) {
            st = kkv_pool_take(c, &x->slots[q]);
            if (st == KKV_OK) {
                memcpy(kkv_slot_ptr(c, x->slots[q]), kkv_slot_ptr(c, y->slots[q]), c->slot_bytes);
                if (c->bmode)
                    memcpy(kkv_slot_kpfx(c, x->slots[q]), kkv_slot_kpfx(c, y->slots[q]),
                           (size_t)c->H * sizeof(uint16_t));
                x->n_slots = q + 1; /* for the undo below: slots [full, q] are ours */
            }
        }
        l_done = l + 1;
    }
    if (st != KKV_OK) {
        for (int l = 0; tmp.ly && l < c->L; l++) {
            kkv_lseq *x = &tmp.ly[l];
            if (l < l_done || x->n_slots) {
                kkv_counts n = kkv_counts_of(c, p, l);
                int full = n.kp < n.vp ? n.kp : n.vp;
                for (int q = full; q < x->n_slots; q++) kkv_pool_untake(c, x->slots[q]);
            }
            free(x->slots);
            free(x->stage);
            free(x->sk); /* only a copy, never accounted */
        }
        free(tmp.ly);
        return st;
    }
    /* nothing can fail now: share the written pages */
    for (int l = 0; l < c->L; l++) {
        const kkv_lseq *y = &p->ly[l];
        kkv_lseq *x = &tmp.ly[l];
        kkv_counts n = kkv_counts_of(c, p, l);
        int full = n.kp < n.vp ? n.kp : n.vp;
        for (int q = 0; q < full; q++) {
            x->slots[q] = y->slots[q];
            if (q >= n.drop) c->ref[y->slots[q]]++; /* below drop: released (-1) */
        }
        x->n_slots = y->n_slots;
        if (y->sk && !x->sk) {
            x->sk = y->sk;
            y->sk->ref++;
        }
    }
    tmp.live = 1;
    tmp.stage_bytes = p->stage_bytes;
    tmp.credit = p->stage_bytes;
    c->used += need;
    *s = tmp;
    *child = id;
    return KKV_OK;
}

int kkv_seq_len(const kkv_cache *c, int seq, int layer) {
    const kkv_seq *s = kkv_seq_get(c, seq);
    if (!s || layer < 0 || layer >= c->L) return -1;
    return s->ly[layer].len;
}

/* ---------------------------------------------------------------- the lifecycle as counts */

/* (len, kp, vq) of one layer: the whole state the lifecycle acts on. */
typedef struct lstate {
    int len, kp, vq;
    int win; /* the layer's window: fixed, carried for the counts */
} lstate;

static lstate lstate_of(const kkv_lseq *y) {
    lstate a = {y->len, y->kp, y->vq, y->win};
    return a;
}

static kkv_counts counts_st(const kkv_cache *c, lstate a) {
    return kkv_counts_make(c, a.len, a.kp, a.vq, a.win);
}

/* What kkv_flush() does: a full key Q-buffer becomes key page kp; without
 * eager values, a full value Q-buffer (window + G) becomes value page vq / G. */
static lstate st_flush(const kkv_cache *c, lstate a) {
    kkv_counts n = counts_st(c, a);
    if (n.ktail == c->G) a.kp++;
    if (!c->eager && n.vtail == c->R + c->G) a.vq += c->G;
    return a;
}

/* What kkv_append() does: a leftover flush, the token, and with eager values
 * the oldest value of a full window goes into its page. */
static lstate st_append(const kkv_cache *c, lstate a) {
    a = st_flush(c, a);
    a.len++;
    if (c->eager && counts_st(c, a).vtail > c->R) a.vq++;
    return a;
}

typedef struct caps {
    int cs, ck, cv;
} caps;

static caps caps_of(const kkv_cache *c, lstate a) {
    kkv_counts n = counts_st(c, a);
    caps k = {kkv_stage_cap(n.sink_held, c->S), kkv_stage_cap(n.ktail, c->max_k),
              kkv_stage_cap(n.vtail, c->max_v)};
    return k;
}

static uint64_t caps_bytes(const kkv_cache *c, caps k) {
    return kkv_stage_bytes(c, k.cs, k.ck, k.cv);
}

static int slots_st(const kkv_cache *c, lstate a) {
    kkv_counts n = counts_st(c, a);
    return kkv_slots_for(c, &n);
}

void kkv_seq_release_window(kkv_cache *c, kkv_seq *s, int l, int drop0) {
    kkv_lseq *y = &s->ly[l];
    kkv_counts n = kkv_counts_of(c, s, l);
    for (int p = drop0; p < n.drop; p++) {
        int sl = y->slots[p];
        y->slots[p] = -1;
        int last = c->ref[sl] == 1;
        kkv_pool_give(c, sl);
        /* the bytes become this sequence's credit: a freed slot's move from
         * the pages to the credit (used unchanged), a shared one's from the
         * pool if it has room */
        if (last || c->budget - c->used >= c->slot_bytes) {
            c->used += c->slot_bytes;
            s->credit += c->slot_bytes;
        }
    }
}

/* ---------------------------------------------------------------- pool credit */

kkv_status kkv_seq_charge(const kkv_cache *c, const kkv_seq *s, uint64_t new_stage,
                          uint64_t obj_bytes, uint64_t *from_pool) {
    uint64_t surplus = s->credit - s->stage_bytes;
    uint64_t add = (new_stage > s->stage_bytes ? new_stage - s->stage_bytes : 0) + obj_bytes;
    uint64_t freed = new_stage < s->stage_bytes ? s->stage_bytes - new_stage : 0;
    uint64_t have = surplus + freed;
    uint64_t fp = add > have ? add - have : 0;
    if (fp > c->budget - c->used)
        return kkv_fail(KKV_ERR_POOL_FULL,
                        "pool full: %llu of %llu bytes in use, the sequence needs %llu more",
                        (unsigned long long)c->used, (unsigned long long)c->budget,
                        (unsigned long long)fp);
    *from_pool = fp;
    return KKV_OK;
}

void kkv_seq_commit(kkv_cache *c, kkv_seq *s, uint64_t new_stage, uint64_t obj_bytes,
                    uint64_t from_pool) {
    c->used += from_pool;
    s->credit = s->credit + from_pool - obj_bytes;
    s->stage_bytes = new_stage;
}

/* Staging a flush frees is surplus that pays for the next pages while a
 * reservation runs; after it, the sequence holds exactly what it stores. */
void kkv_seq_trim(kkv_cache *c, kkv_seq *s) {
    if (s->credit == s->stage_bytes) return;
    for (int l = 0; l < c->L; l++)
        if (s->ly[l].len < s->rsv_len) return;
    c->used -= s->credit - s->stage_bytes;
    s->credit = s->stage_bytes;
}

/* ---------------------------------------------------------------- staging buffers */

/* Moves the key and value tails of every head from a stage of capacities
 * (ok, ov) to one of (nk, nv), keeping the rows counts n says are there. */
static void move_tails(const kkv_cache *c, uint16_t *dst, const uint16_t *src, int ok, int ov,
                       int nk, int nv, const kkv_counts *n) {
    size_t D = (size_t)c->D, ot = (size_t)(ok + ov), nt = (size_t)(nk + nv);
    size_t so[2] = {0, (size_t)ok}, doff[2] = {0, (size_t)nk};
    size_t rows[2] = {(size_t)n->ktail, (size_t)n->vtail};
    for (int h = 0; h < c->H; h++)
        for (int r = 0; r < 2; r++)
            if (rows[r])
                memmove(dst + ((size_t)h * nt + doff[r]) * D, src + ((size_t)h * ot + so[r]) * D,
                        rows[r] * D * 2);
}

/* Resizes layer y's staging to capacities k, keeping the tokens that counts n
 * says are there. Growing allocates new buffers (KKV_ERR_NOMEM leaves y as it
 * was); shrinking moves the tails down in place and cannot fail. The sink
 * only grows: it is never asked to shrink. */
static kkv_status stage_resize(const kkv_cache *c, kkv_lseq *y, const kkv_counts *n, caps k) {
    if (k.cs == y->cs && k.ck == y->ck && k.cv == y->cv) return KKV_OK;
    size_t D = (size_t)c->D, nt = (size_t)(k.ck + k.cv);
    int grow = k.ck > y->ck || k.cv > y->cv;
    uint16_t *dst = y->stage;
    if (grow) {
        dst = malloc((size_t)c->H * nt * D * 2);
        if (!dst) return kkv_fail(KKV_ERR_NOMEM, "staging: out of memory");
    }
    if (k.cs > y->cs) {
        kkv_sink *sk = kkv_sink_new(c, k.cs);
        if (!sk) {
            if (grow) free(dst);
            return kkv_fail(KKV_ERR_NOMEM, "staging: out of memory");
        }
        for (int h = 0; h < c->H && n->sink; h++)
            for (int r = 0; r < 2; r++)
                memcpy(sk->data + ((size_t)h * 2 + r) * k.cs * c->srow,
                       y->sk->data + ((size_t)h * 2 + r) * y->cs * c->srow,
                       (size_t)n->sink * c->srow * 2);
        free(y->sk); /* growing: the block is this sequence's alone */
        y->sk = sk;
        y->cs = k.cs;
    }
    if (k.ck != y->ck || k.cv != y->cv) {
        if (y->stage) move_tails(c, dst, y->stage, y->ck, y->cv, k.ck, k.cv, n);
        if (grow) {
            free(y->stage);
        } else if (nt == 0) {
            free(dst);
            dst = NULL;
        } /* else the block keeps its size: settle() shrinks in place */
        y->stage = dst;
        y->ck = k.ck, y->cv = k.cv;
    }
    return KKV_OK;
}

/* Grows the page table of y to `want` slots with fresh pages; all or nothing
 * (the bytes are accounted by the caller). */
static kkv_status take_slots(kkv_cache *c, kkv_lseq *y, int want) {
    if (want <= y->n_slots) return KKV_OK;
    if (want > y->cap_slots) {
        int cap = y->cap_slots ? y->cap_slots : 16;
        while (cap < want) cap *= 2;
        int *ns = realloc(y->slots, (size_t)cap * sizeof *ns);
        if (!ns) return kkv_fail(KKV_ERR_NOMEM, "page table: out of memory");
        y->slots = ns;
        y->cap_slots = cap;
    }
    int have = y->n_slots;
    for (int p = have; p < want; p++) {
        kkv_status st = kkv_pool_take(c, &y->slots[p]);
        if (st != KKV_OK) {
            for (int q = have; q < p; q++) kkv_pool_untake(c, y->slots[q]);
            return st;
        }
    }
    y->n_slots = want;
    return KKV_OK;
}

/* Moves layer l of s from its state to `to` as far as the pool is concerned:
 * staging capacity for `to` (keeping the current tokens) and the slots `to`
 * holds. All or nothing. */
static kkv_status prepare(kkv_cache *c, kkv_seq *s, int l, lstate to) {
    kkv_lseq *y = &s->ly[l];
    caps cur = {y->cs, y->ck, y->cv}, want = caps_of(c, to);
    uint64_t new_stage = s->stage_bytes - kkv_stage_bytes(c, 0, cur.ck, cur.cv) +
                         kkv_stage_bytes(c, 0, want.ck, want.cv);
    int n_pages = slots_st(c, to) - y->n_slots;
    if (n_pages < 0) n_pages = 0;
    uint64_t sink_add = want.cs > cur.cs ? kkv_sink_bytes(c, want.cs - cur.cs) : 0;
    uint64_t obj = (uint64_t)n_pages * c->slot_bytes + sink_add, fp = 0;
    KKV_TRY(kkv_seq_charge(c, s, new_stage, obj, &fp));
    /* the buffer holds the current tokens until the change is done */
    caps both = {cur.cs > want.cs ? cur.cs : want.cs, cur.ck > want.ck ? cur.ck : want.ck,
                 cur.cv > want.cv ? cur.cv : want.cv};
    kkv_counts n = kkv_counts_of(c, s, l);
    int have = y->n_slots;
    KKV_TRY(take_slots(c, y, have + n_pages));
    kkv_status st = stage_resize(c, y, &n, both);
    if (st != KKV_OK) { /* nothing of the staging changed */
        for (int q = have; q < y->n_slots; q++) kkv_pool_untake(c, y->slots[q]);
        y->n_slots = have;
        return st;
    }
    kkv_seq_commit(c, s, new_stage, obj, fp);
    return KKV_OK;
}

/* The buffer a change of layer l to state `to` ends in, allocated before
 * anything changes (so that its failure leaves the cache as it was): NULL when
 * no tail ends smaller than it is during the change, or when they end empty. */
static kkv_status pre_settle(const kkv_cache *c, const kkv_seq *s, int l, lstate to,
                             uint16_t **pre) {
    const kkv_lseq *y = &s->ly[l];
    caps w = caps_of(c, to);
    *pre = NULL;
    if (w.ck >= y->ck && w.cv >= y->cv) return KKV_OK;
    size_t nt = (size_t)(w.ck + w.cv);
    if (nt == 0) return KKV_OK;
    *pre = malloc((size_t)c->H * nt * c->D * 2);
    return *pre ? KKV_OK : kkv_fail(KKV_ERR_NOMEM, "staging: out of memory");
}

/* After the change: the tails move into `pre` (from pre_settle()), sized to
 * what the state needs, the larger block is freed, and a reservation that is
 * used up gives its surplus back. */
static void settle(kkv_cache *c, kkv_seq *s, int l, uint16_t *pre) {
    kkv_lseq *y = &s->ly[l];
    kkv_counts n = kkv_counts_of(c, s, l);
    caps k = caps_of(c, lstate_of(y));
    if (k.ck == y->ck && k.cv == y->cv) {
        free(pre);
    } else if (pre) {
        move_tails(c, pre, y->stage, y->ck, y->cv, k.ck, k.cv, &n);
        free(y->stage);
        y->stage = pre;
        y->ck = k.ck, y->cv = k.cv;
    } else if (k.ck + k.cv == 0) {
        free(y->stage);
        y->stage = NULL;
        y->ck = y->cv = 0;
    } else {
        k.cs = y->cs;
        (void)stage_resize(c, y, &n, k); /* grows never; in place */
    }
    if (y->len >= s->rsv_len) kkv_seq_trim(c, s);
}

/* The state append -> flush leaves at len tokens (len >= 1): the lifecycle
 * is a function of the length once a step has been flushed. */
static lstate st_canonical(const kkv_cache *c, int64_t len, int win) {
    lstate a = {(int)len, 0, 0, win};
    int64_t post = len > c->S ? len - c->S : 0;
    a.kp = (int)(post / c->G);
    int64_t out = post > c->R ? post - c->R : 0; /* values out of the window */
    a.vq = (int)(c->eager ? out : out / c->G * c->G);
    return a;
}

/* Bytes of the change from state `from` to state a in the peak of
 * layer_peak(): a's staging + the slots held beyond base, less the sink of
 * capacity cs0 the layer holds already (the sink is a block of its own, not
 * paid from credit). The pages a releases (its window) are given back only
 * after the change, so it holds a's page table less what `from` released. */
static uint64_t st_bytes(const kkv_cache *c, lstate from, lstate a, int base, int cs0) {
    int ns = slots_st(c, a) - counts_st(c, from).drop - base;
    return caps_bytes(c, caps_of(c, a)) - kkv_sink_bytes(c, cs0) +
           (uint64_t)(ns > 0 ? ns : 0) * c->slot_bytes;
}

/* Peak pool bytes (staging + pages taken from now on, less the pages a
 * window gave back) of layer y over n more tokens of append -> flush,
 * counting from its current state. Past the first S + R + 3G steps (+ W for a
 * windowed layer: its sink goes and its page count levels off by then) the
 * staging repeats with period G while held slots only grow or repeat, so the
 * rest of the peak is within the last G + 1 steps: O(S + R + G + W) per call. */
static uint64_t layer_peak(const kkv_cache *c, const kkv_lseq *y, int64_t n) {
    lstate a = lstate_of(y);
    int base = y->n_slots - counts_st(c, a).drop, cs0 = y->cs;
    uint64_t peak = st_bytes(c, a, a, base, cs0);
    int64_t warm = (int64_t)c->S + c->R + 3 * (int64_t)c->G + y->win;
    int64_t first = n < warm ? n : warm;
    for (int64_t i = 0; i < first; i++) {
        for (int step = 0; step < 2; step++) {
            lstate b = step ? st_flush(c, a) : st_append(c, a);
            uint64_t x = st_bytes(c, a, b, base, cs0);
            peak = x > peak ? x : peak;
            a = b;
        }
    }
    if (n > first) {
        int64_t end = (int64_t)y->len + n, from = end - c->G - 1;
        from = from > (int64_t)y->len + first ? from : (int64_t)y->len + first;
        for (int64_t len = from; len < end; len++) {
            lstate p = st_canonical(c, len, y->win), b = st_append(c, p);
            uint64_t x = st_bytes(c, p, b, base, cs0);
            peak = x > peak ? x : peak;
            x = st_bytes(c, b, st_flush(c, b), base, cs0);
            peak = x > peak ? x : peak;
        }
    }
    return peak;
}

kkv_status kkv_seq_reserve(kkv_cache *c, int seq, int n_tokens) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "reserve: NULL cache");
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "reserve: no sequence %d", seq);
    KKV_TRY(kkv_seq_check_usable(s, seq, "reserve"));
    if (n_tokens < 0) return kkv_fail(KKV_ERR_INVALID_ARG, "reserve: n_tokens %d < 0", n_tokens);
    int64_t longest = 0;
    for (int l = 0; l < c->L; l++) longest = s->ly[l].len > longest ? s->ly[l].len : longest;
    if (c->cfg.max_tokens && longest + n_tokens > c->cfg.max_tokens)
        return kkv_fail(KKV_ERR_CTX_FULL, "sequence %d: %lld + %d tokens exceed max_tokens %d",
                        seq, (long long)longest, n_tokens, c->cfg.max_tokens);
    if (longest + n_tokens > INT_MAX)
        return kkv_fail(KKV_ERR_CTX_FULL, "sequence %d: %lld + %d tokens exceed %d", seq,
                        (long long)longest, n_tokens, INT_MAX);
    /* Layers are independent: the credit must cover the sum of their peaks,
     * which is also the peak when they move in step (the engine's case). */
    uint64_t need = 0, prev = 0;
    for (int l = 0; l < c->L; l++) {
        const kkv_lseq *y = &s->ly[l], *x = l ? &s->ly[l - 1] : NULL;
        int same = x && x->len == y->len && x->kp == y->kp && x->vq == y->vq &&
                   x->n_slots == y->n_slots && x->win == y->win;
        prev = same ? prev : layer_peak(c, y, n_tokens);
        need += prev;
    }
    if (need <= s->credit) {
        s->rsv_len = longest + n_tokens > s->rsv_len ? longest + n_tokens : s->rsv_len;
        return KKV_OK;
    }
    uint64_t fp = need - s->credit;
    if (fp > c->budget - c->used)
        return kkv_fail(KKV_ERR_POOL_FULL,
                        "pool full: %llu of %llu bytes in use, %d more tokens of sequence %d "
                        "need %llu more",
                        (unsigned long long)c->used, (unsigned long long)c->budget, n_tokens,
                        seq, (unsigned long long)fp);
    c->used += fp;
    s->credit = need;
    s->rsv_len = longest + n_tokens > s->rsv_len ? longest + n_tokens : s->rsv_len;
    return KKV_OK;
}

static kkv_status check_finite(const float *x, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return kkv_fail(KKV_ERR_NONFINITE, "%s: NaN or Inf at element %zu", what, i);
    return KKV_OK;
}

static void store_f16(uint16_t *dst, const float *x, int n) {
    for (int i = 0; i < n; i++) dst[i] = kkv_f16_store(x[i]);
}

/* win8 fidelity study: y [n] = x read back from int8 codes with one
 * fp16 absmax scale (q = round(x / scale) in -127..127). The caller stores y
 * in fp16, whose rounding (2^-11 relative) is far below the int8 step. */
static const float *int8_round(float *y, const float *x, int n) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
    float scale = kkv_f16_to_f32(kkv_f16_store(amax / 127.0f));
    for (int i = 0; i < n; i++) {
        float q = scale > 0.0f ? rintf(x[i] / scale) : 0.0f;
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        y[i] = q * scale;
    }
    return y;
}

/* A key page of the options beyond the paper: pair-aware ranking and/or
 * clipped ranges (docs/FORMAT.md section 5). kt: [G][D] fp16. Without clip
 * the kernel encodes with the ranking given as explicit, so its bytes are the
 * scalar codec's. */
static void key_encode_plus(kkv_cache *c, uint8_t *dst, const uint16_t *kt, uint64_t seed,
                            uint64_t page, const uint8_t *rank) {
    const kkv_method *m = &c->cfg.method;
    size_t n = (size_t)c->G * c->D;
    uint8_t order[KKV_MAX_HEAD_DIM];
    for (size_t i = 0; i < n; i++) c->tile[i] = kkv_f16_to_f32(kt[i]);
    if (m->pairs && m->select != KKV_SELECT_EXPLICIT && m->select != KKV_SELECT_RANDOM)
        kkv_rank_pairs(order, c->tile, c->D, c->G, m->select, c->cfg.rope_neox,
                       c->cfg.rope_dims);
    else
        kkv_rank_channels(order, c->tile, c->D, c->G, m->select, seed, page, rank);
    if (m->clip) kkv_key_encode_clip_ref(dst, c->tile, c->D, c->G, c->nb, order, 1);
    else c->ops->key_encode(dst, c->tile, kt, c->D, c->G, c->nb, KKV_SELECT_EXPLICIT, 0, page,
                            order);
}

/* budget=head|err: key page p of every head of layer l from one pooled
 * allocation. Scores first (one head's tile at a time), then the greedy
 * split, then each head encoded with its own n_boost at its slot offset; the
 * prefix row is written before any page, so the offsets are those pages'. */
static void flush_keys_pooled(kkv_cache *c, kkv_seq *s, int l, int p) {
    const kkv_method *m = &c->cfg.method;
    size_t n = (size_t)c->G * c->D;
    uint8_t order[KKV_MAX_BUDGET_HEADS * KKV_MAX_HEAD_DIM]; /* [H][D] */
    int nb[KKV_MAX_BUDGET_HEADS];                           /* [H] */
    for (int h = 0; h < c->H; h++) {
        const uint16_t *kt = kkv_ktail(c, s, l, h);
        for (size_t i = 0; i < n; i++) c->tile[i] = kkv_f16_to_f32(kt[i]);
        float *sc = c->bscore + (size_t)h * c->D;
        if (c->bmode == KKV_BUDGET_ERR) kkv_boost_gain(sc, c->tile, c->D, c->G, m->clip);
        else kkv_score_channels(sc, c->tile, c->D, c->G, m->select);
    }
    kkv_budget_alloc(order, nb, c->bscore, c->H, c->D, c->H * c->nb, m->pairs,
                     c->cfg.rope_neox, c->cfg.rope_dims);
    int slot = s->ly[l].slots[p];
    uint16_t *pfx = kkv_slot_kpfx(c, slot);
    for (int h = 0, acc = 0; h < c->H; acc += nb[h], h++) pfx[h] = (uint16_t)acc;
    for (int h = 0; h < c->H; h++) {
        const uint16_t *kt = kkv_ktail(c, s, l, h);
        for (size_t i = 0; i < n; i++) c->tile[i] = kkv_f16_to_f32(kt[i]);
        kkv_key_encode_clip_ref(kkv_slot_kpage(c, slot, h), c->tile, c->D, c->G, nb[h],
                                order + (size_t)h * c->D, m->clip);
    }
}

/* Quantizes whatever Q-buffer of (s, l) is full. Slots and staging are ready. */
static void flush_data(kkv_cache *c, kkv_seq *s, int l) {
    kkv_lseq *y = &s->ly[l];
    kkv_counts n = kkv_counts_of(c, s, l);
    size_t D = (size_t)c->D;
    if (n.ktail == c->G && c->bmode) {
        flush_keys_pooled(c, s, l, n.kp);
        y->kp++;
    } else if (n.ktail == c->G) {
        int p = n.kp;
        for (int h = 0; h < c->H; h++) {
            uint16_t *kt = kkv_ktail(c, s, l, h);
            uint8_t *dst = kkv_kpage_ptr(c, s, p, l, h);
            if (c->fp16) {
                memcpy(dst, kt, (size_t)c->G * D * 2);
            } else if (c->kbits == 8) {
                for (size_t i = 0; i < (size_t)c->G * D; i++) c->tile[i] = kkv_f16_to_f32(kt[i]);
                kkv_key8_encode_ref(dst, c->tile, c->D, c->G);
            } else {
                const uint8_t *rank = c->rank ? c->rank + ((size_t)l * c->H + h) * D : NULL;
                uint64_t seed = kkv_mix64(c->cfg.method.seed, ((uint64_t)l << 20) | (uint64_t)h);
                const kkv_method *m = &c->cfg.method;
                if (m->pairs || m->clip) {
                    key_encode_plus(c, dst, kt, seed, (uint64_t)p, rank);
                } else {
                    c->ops->key_encode(dst, c->tile, kt, c->D, c->G, c->nb, m->select, seed,
                                       (uint64_t)p, rank);
                }
            }
        }
        y->kp++;
    }
    if (!c->eager && n.vtail == c->R + c->G) {
        int p = n.vp;
        for (int h = 0; h < c->H; h++) {
            uint16_t *vt = kkv_vtail(c, s, l, h);
            uint8_t *dst = kkv_vpage_ptr(c, s, p, l, h);
            if (c->fp16) {
                memcpy(dst, vt, (size_t)c->G * D * 2);
            } else if (c->cfg.method.value_clip || c->vbits == 8) { /* row by row */
                for (int t = 0; t < c->G; t++) {
                    for (size_t j = 0; j < D; j++) c->tile[j] = kkv_f16_to_f32(vt[t * D + j]);
                    kkv_value_row_encode_clip_ref(dst, t, c->tile, c->D, c->G, c->vbits,
                                                  c->cfg.method.value_clip);
                }
            } else {
                c->ops->value_encode(dst, c->tile, vt, c->D, c->G, c->vbits);
            }
            /* the window's R values move to the front of the tail */
            memmove(vt, vt + (size_t)c->G * D, (size_t)c->R * D * 2);
        }
        y->vq += c->G;
    }
}

kkv_status kkv_flush(kkv_cache *c, int seq, int layer) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "flush: NULL cache");
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "flush: no sequence %d", seq);
    KKV_TRY(kkv_seq_check_usable(s, seq, "flush"));
    if (layer < 0 || layer >= c->L)
        return kkv_fail(KKV_ERR_INVALID_ARG, "flush: layer %d not in 0..%d", layer, c->L - 1);
    lstate cur = lstate_of(&s->ly[layer]), to = st_flush(c, cur);
    if (to.kp == cur.kp && to.vq == cur.vq) return KKV_OK;
    uint16_t *pre;
    KKV_TRY(pre_settle(c, s, layer, to, &pre));
    kkv_status st = prepare(c, s, layer, to);
    if (st != KKV_OK) {
        free(pre);
        return st;
    }
    int drop0 = kkv_counts_of(c, s, layer).drop;
    flush_data(c, s, layer);
    settle(c, s, layer, pre);
    kkv_seq_release_window(c, s, layer, drop0);
    return KKV_OK;
}

/* Eager values: the oldest value of the full window of (l, h) goes into row
 * vq % G of value page vq / G, and the window moves down one row; the new
 * value v16 [D] fp16 takes the last row (with R = 0 it is itself quantized). */
static void eager_push(kkv_cache *c, kkv_seq *s, int l, int h, const uint16_t *v16) {
    kkv_lseq *y = &s->ly[l];
    size_t D = (size_t)c->D;
    uint16_t *vt = kkv_vtail(c, s, l, h);
    const uint16_t *old = c->R ? vt : v16;
    for (size_t j = 0; j < D; j++) c->tile[j] = kkv_f16_to_f32(old[j]);
    uint8_t *page = kkv_vpage_ptr(c, s, y->vq / c->G, l, h);
    if (c->fp16) memcpy(page + (size_t)(y->vq % c->G) * D * 2, old, D * 2);
    else kkv_value_row_encode_clip_ref(page, y->vq % c->G, c->tile, c->D, c->G, c->vbits,
                                       c->cfg.method.value_clip);
    if (c->R) {
        memmove(vt, vt + D, (size_t)(c->R - 1) * D * 2);
        memcpy(vt + (size_t)(c->R - 1) * D, v16, D * 2);
    }
}

/* c->rot_buf holds at least n floats. */
static kkv_status rot_scratch(kkv_cache *c, size_t n) {
    if (n <= c->rot_cap) return KKV_OK;
    float *b = realloc(c->rot_buf, n * sizeof *b);
    if (!b) return kkv_fail(KKV_ERR_NOMEM, "rotation: out of memory");
    c->rot_buf = b;
    c->rot_cap = n;
    return KKV_OK;
}

kkv_status kkv_append(kkv_cache *c, int seq, int layer, const float *k, const float *v) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "append: NULL cache");
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "append: no sequence %d", seq);
    KKV_TRY(kkv_seq_check_usable(s, seq, "append"));
    if (layer < 0 || layer >= c->L)
        return kkv_fail(KKV_ERR_INVALID_ARG, "append: layer %d not in 0..%d", layer, c->L - 1);
    if (!k || !v) return kkv_fail(KKV_ERR_INVALID_ARG, "append: NULL key or value");
    size_t n = (size_t)c->H * c->D;
    KKV_TRY(check_finite(k, n, "append: key"));
    KKV_TRY(check_finite(v, n, "append: value"));
    if (c->krot || c->vrot) { /* stored rotated (docs/FORMAT.md section 5) */
        KKV_TRY(rot_scratch(c, 2 * n));
        float *rk = c->rot_buf, *rv = c->rot_buf + n; /* [H][D] each */
        for (int h = 0; h < c->H; h++) {
            size_t o = (size_t)h * c->D;
            if (c->krot) kkv_rot_apply(rk + o, c->krot, k + o, c->D);
            else memcpy(rk + o, k + o, (size_t)c->D * sizeof *rk);
            if (c->vrot) kkv_rot_apply(rv + o, c->vrot, v + o, c->D);
            else memcpy(rv + o, v + o, (size_t)c->D * sizeof *rv);
        }
        k = rk;
        v = rv;
    }
    kkv_lseq *y = &s->ly[layer];
    if ((c->cfg.max_tokens && y->len >= c->cfg.max_tokens) || y->len == INT_MAX)
        return kkv_fail(KKV_ERR_CTX_FULL, "append: sequence %d is at max_tokens %d", seq,
                        c->cfg.max_tokens ? c->cfg.max_tokens : INT_MAX);
    /* A Q-buffer left full by a missing kkv_flush() is flushed now, so the
     * state is what append-attend-flush would have left. Pool first: the
     * only failure comes before any change. */
    lstate to = st_append(c, lstate_of(y));
    uint16_t *pre;
    KKV_TRY(pre_settle(c, s, layer, to, &pre));
    kkv_status pst = prepare(c, s, layer, to);
    if (pst != KKV_OK) {
        free(pre);
        return pst;
    }
    int drop0 = kkv_counts_of(c, s, layer).drop;
    flush_data(c, s, layer);

    kkv_counts cnt = kkv_counts_of(c, s, layer);
    int eager = c->eager && cnt.len >= c->S && cnt.vtail == c->R;
    const kkv_method *m = &c->cfg.method;
    for (int h = 0; h < c->H; h++) {
        const float *kh = k + (size_t)h * c->D, *vh = v + (size_t)h * c->D;
        float v8[KKV_MAX_HEAD_DIM]; /* [D] int8-rounded (win8) */
        if (cnt.len >= c->S && m->window_int8) vh = int8_round(v8, vh, c->D);
        if (cnt.len < c->S && c->sink8) { /* int8 sink rows */
            kkv_row8_encode((uint8_t *)(kkv_sink_k(c, s, layer, h) + (size_t)cnt.len * c->srow),
                            kh, c->D);
            kkv_row8_encode((uint8_t *)(kkv_sink_v(c, s, layer, h) + (size_t)cnt.len * c->srow),
                            vh, c->D);
        } else if (cnt.len < c->S) {
            store_f16(kkv_sink_k(c, s, layer, h) + (size_t)cnt.len * c->D, kh, c->D);
            store_f16(kkv_sink_v(c, s, layer, h) + (size_t)cnt.len * c->D, vh, c->D);
        } else {
            store_f16(kkv_ktail(c, s, layer, h) + (size_t)cnt.ktail * c->D, kh, c->D);
            if (eager) {
                uint16_t v16[KKV_MAX_HEAD_DIM];
                store_f16(v16, vh, c->D);
                eager_push(c, s, layer, h, v16);
            } else {
                store_f16(kkv_vtail(c, s, layer, h) + (size_t)cnt.vtail * c->D, vh, c->D);
            }
        }
    }
    if (eager) y->vq++;
    y->len++;
    settle(c, s, layer, pre);
    kkv_seq_release_window(c, s, layer, drop0);
    return KKV_OK;
}

/* The live, usable, non-empty sequence `seq` of an attend call. */
static kkv_status attend_seq(const kkv_cache *c, const kkv_seq **out, int seq, int layer) {
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "attend: no sequence %d", seq);
    KKV_TRY(kkv_seq_check_usable(s, seq, "attend"));
    if (s->ly[layer].len == 0)
        return kkv_fail(KKV_ERR_INVALID_ARG, "attend: sequence %d layer %d is empty", seq, layer);
    *out = s;
    return KKV_OK;
}

#define ATTEND_STACK_SEQS 64

kkv_status kkv_attend_batch(kkv_cache *c, float *out, const int *seqs, int n, int layer,
                            const float *q, int n_q) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "attend: NULL cache");
    if (!seqs || n < 1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "attend: %s", !seqs ? "NULL seqs" : "no sequences");
    if (layer < 0 || layer >= c->L)
        return kkv_fail(KKV_ERR_INVALID_ARG, "attend: layer %d not in 0..%d", layer, c->L - 1);
    if (!out || !q || n_q < c->H || n_q % c->H)
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "attend: n_q %d must be a positive multiple of n_kv_heads %d", n_q, c->H);
    if (n > INT_MAX / n_q)
        return kkv_fail(KKV_ERR_INVALID_ARG, "attend: %d sequences of %d query heads are too "
                        "many rows", n, n_q);
    const kkv_seq *stack_ss[ATTEND_STACK_SEQS];
    const kkv_seq **ss = n <= ATTEND_STACK_SEQS ? stack_ss : malloc((size_t)n * sizeof *ss); /* [n] */
    if (!ss) return kkv_fail(KKV_ERR_NOMEM, "attend: out of memory");
    size_t nq = (size_t)n * (size_t)n_q; /* query rows of the call */
    kkv_status st = KKV_OK;
    for (int i = 0; i < n && st == KKV_OK; i++) st = attend_seq(c, &ss[i], seqs[i], layer);
    if (st == KKV_OK) st = check_finite(q, nq * c->D, "attend: query");
    if (st == KKV_OK && c->krot) { /* Rq . Rk = q . k: the query joins the keys' space */
        st = rot_scratch(c, nq * c->D);
        for (size_t r = 0; r < nq && st == KKV_OK; r++)
            kkv_rot_apply(c->rot_buf + r * c->D, c->krot, q + r * c->D, c->D);
        q = c->rot_buf;
    }
    if (st == KKV_OK) st = kkv_attend_impl(c, out, ss, n, layer, q, n_q);
    /* sum_t p_t R v_t = R out: one R^T per head restores the output */
    if (st == KKV_OK && c->vrot) kkv_rot_back_rows(out, c->vrot, (int)nq, c->D);
    if (ss != stack_ss) free(ss);
    return st;
}

kkv_status kkv_attend(kkv_cache *c, float *out, int seq, int layer, const float *q, int n_q) {
    return kkv_attend_batch(c, out, &seq, 1, layer, q, n_q);
}

kkv_status kkv_cache_set_rank(kkv_cache *c, int layer, int head, const uint8_t *rank) {
    if (!c || !rank || layer < 0 || layer >= c->L || head < 0 || head >= c->H)
        return kkv_fail(KKV_ERR_INVALID_ARG, "set_rank: bad layer %d / head %d", layer, head);
    uint8_t seen[KKV_MAX_HEAD_DIM] = {0};
    for (int j = 0; j < c->D; j++) {
        if (rank[j] >= c->D || seen[rank[j]])
            return kkv_fail(KKV_ERR_INVALID_ARG, "set_rank: not a permutation of 0..%d", c->D - 1);
        seen[rank[j]] = 1;
    }
    if (!c->rank) {
        c->rank = malloc((size_t)c->L * c->H * c->D);
        if (!c->rank) return kkv_fail(KKV_ERR_NOMEM, "set_rank: out of memory");
        /* until set, a head's ranking is the identity */
        for (size_t i = 0; i < (size_t)c->L * c->H; i++)
            for (int j = 0; j < c->D; j++) c->rank[i * c->D + j] = (uint8_t)j;
    }
    memcpy(c->rank + ((size_t)layer * c->H + head) * c->D, rank, (size_t)c->D);
    return KKV_OK;
}

kkv_status kkv_cache_set_kernel(kkv_cache *c, kkv_kernel k) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "set_kernel: NULL cache");
    if (k == KKV_KERNEL_AUTO) k = kkv_kernel_best();
    const kkv_ops *ops = kkv_ops_get(k);
    if (!ops)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "kernel %s is not supported by this CPU or build",
                        kkv_kernel_name(k));
    c->ops = ops;
    return KKV_OK;
}

kkv_kernel kkv_cache_get_kernel(const kkv_cache *c) {
    return c ? c->ops->kind : KKV_KERNEL_AUTO;
}
