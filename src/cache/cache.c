/* Cache lifecycle: create/free, sequences, and the token lifecycle of
 * docs/FORMAT.md section 3 (append -> attend -> flush). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
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
    if (c->fp16) {
        c->kpage = c->vpage = (size_t)c->G * c->D * 2;
    } else {
        c->kpage = kkv_key_page_bytes(c->D, c->G, c->nb);
        c->vpage = kkv_value_page_bytes(c->D, c->G, c->vbits);
    }
    c->slot_bytes = (size_t)c->L * c->H * (c->kpage + c->vpage);
    c->staging_tokens = (size_t)2 * c->S + c->G + c->R + c->G;
    c->staging_bytes = (size_t)c->L * c->H * c->staging_tokens * c->D * 2;
    c->budget = cfg->pool_bytes;
    uint64_t max_slots = c->budget / c->slot_bytes;
    c->max_slots = max_slots > (1u << 30) ? (1 << 30) : (int)max_slots;
    size_t n_chunks = ((size_t)c->max_slots + KKV_SLOTS_PER_CHUNK - 1) / KKV_SLOTS_PER_CHUNK;
    c->chunks = calloc(n_chunks ? n_chunks : 1, sizeof *c->chunks);
    c->free_slots = malloc(((size_t)c->max_slots + 1) * sizeof *c->free_slots);
    c->seqs = calloc((size_t)c->cfg.max_seqs, sizeof *c->seqs);
    c->tile = malloc((size_t)c->G * c->D * sizeof *c->tile);
    kkv_status s = KKV_OK;
    if (!c->chunks || !c->free_slots || !c->seqs || !c->tile)
        s = kkv_fail(KKV_ERR_NOMEM, "cache: out of memory");
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
    for (int p = 0; p < s->n_slots; p++) kkv_pool_give(c, s->slots[p]);
    if (s->live) c->used -= c->staging_bytes;
    free(s->len);
    free(s->n_kpages);
    free(s->n_vpages);
    free(s->slots);
    free(s->staging);
    memset(s, 0, sizeof *s);
}

void kkv_cache_free(kkv_cache *c) {
    if (!c) return;
    if (c->seqs)
        for (int i = 0; i < c->cfg.max_seqs; i++)
            if (c->seqs[i].live) seq_release(c, &c->seqs[i]);
    if (c->chunks) {
        size_t n_chunks = ((size_t)c->max_slots + KKV_SLOTS_PER_CHUNK - 1) / KKV_SLOTS_PER_CHUNK;
        for (size_t i = 0; i < n_chunks; i++) free(c->chunks[i]);
    }
    kkv_tp_free(c->tp_own);
    free(c->chunks);
    free(c->free_slots);
    free(c->seqs);
    free(c->rank);
    free(c->tile);
    free(c->attn_buf);
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

kkv_status kkv_seq_add(kkv_cache *c, int *seq) {
    if (!c || !seq) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_add: NULL argument");
    int id = -1;
    for (int i = 0; i < c->cfg.max_seqs && id < 0; i++)
        if (!c->seqs[i].live) id = i;
    if (id < 0)
        return kkv_fail(KKV_ERR_POOL_FULL, "seq_add: all %d sequence slots in use",
                        c->cfg.max_seqs);
    if (c->used + c->staging_bytes > c->budget)
        return kkv_fail(KKV_ERR_POOL_FULL,
                        "seq_add: pool full: %llu of %llu bytes in use, a sequence's fp16 "
                        "staging needs %zu",
                        (unsigned long long)c->used, (unsigned long long)c->budget,
                        c->staging_bytes);
    kkv_seq *s = &c->seqs[id];
    s->len = calloc((size_t)c->L, sizeof *s->len);
    s->n_kpages = calloc((size_t)c->L, sizeof *s->n_kpages);
    s->n_vpages = calloc((size_t)c->L, sizeof *s->n_vpages);
    s->staging = malloc(c->staging_bytes);
    if (!s->len || !s->n_kpages || !s->n_vpages || !s->staging) {
        seq_release(c, s);
        return kkv_fail(KKV_ERR_NOMEM, "seq_add: out of memory");
    }
    s->live = 1;
    c->used += c->staging_bytes;
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

int kkv_seq_len(const kkv_cache *c, int seq, int layer) {
    const kkv_seq *s = kkv_seq_get(c, seq);
    if (!s || layer < 0 || layer >= c->L) return -1;
    return s->len[layer];
}

/* Pages a layer holding `len` tokens has needed so far: page p is allocated
 * when its key Q-buffer fills, i.e. once len - S >= (p + 1) * G. */
static int pages_for(const kkv_cache *c, int64_t len) {
    return len > c->S ? (int)((len - c->S) / c->G) : 0;
}

/* Grows the page table of s to `want` pages, all or nothing. */
static kkv_status ensure_slots(kkv_cache *c, kkv_seq *s, int want) {
    if (want <= s->n_slots) return KKV_OK;
    if (want > s->cap_slots) {
        int cap = s->cap_slots ? s->cap_slots : 16;
        while (cap < want) cap *= 2;
        int *ns = realloc(s->slots, (size_t)cap * sizeof *ns);
        if (!ns) return kkv_fail(KKV_ERR_NOMEM, "page table: out of memory");
        s->slots = ns;
        s->cap_slots = cap;
    }
    int have = s->n_slots;
    for (int p = have; p < want; p++) {
        kkv_status st = kkv_pool_take(c, &s->slots[p]);
        if (st != KKV_OK) {
            for (int q = have; q < p; q++) kkv_pool_give(c, s->slots[q]);
            return st;
        }
    }
    s->n_slots = want;
    return KKV_OK;
}

kkv_status kkv_seq_reserve(kkv_cache *c, int seq, int n_tokens) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "reserve: NULL cache");
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "reserve: no sequence %d", seq);
    KKV_TRY(kkv_seq_check_usable(s, seq, "reserve"));
    if (n_tokens < 0) return kkv_fail(KKV_ERR_INVALID_ARG, "reserve: n_tokens %d < 0", n_tokens);
    int64_t longest = 0;
    for (int l = 0; l < c->L; l++) longest = s->len[l] > longest ? s->len[l] : longest;
    if (c->cfg.max_tokens && longest + n_tokens > c->cfg.max_tokens)
        return kkv_fail(KKV_ERR_CTX_FULL, "sequence %d: %lld + %d tokens exceed max_tokens %d",
                        seq, (long long)longest, n_tokens, c->cfg.max_tokens);
    if (longest + n_tokens > INT_MAX)
        return kkv_fail(KKV_ERR_CTX_FULL, "sequence %d: %lld + %d tokens exceed %d", seq,
                        (long long)longest, n_tokens, INT_MAX);
    return ensure_slots(c, s, pages_for(c, longest + n_tokens));
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

/* Quantizes whatever Q-buffer of (s, l) is full. Pages already exist. */
static void flush_layer(kkv_cache *c, kkv_seq *s, int l) {
    kkv_counts n = kkv_counts_of(c, s, l);
    size_t D = (size_t)c->D;
    if (n.ktail == c->G) {
        int p = n.kp;
        for (int h = 0; h < c->H; h++) {
            uint16_t *st = kkv_stage(c, s, l, h);
            uint8_t *dst = kkv_kpage_ptr(c, s, p, l, h);
            if (c->fp16) {
                memcpy(dst, st + kkv_off_ktail(c), (size_t)c->G * D * 2);
            } else {
                const uint8_t *rank = c->rank ? c->rank + ((size_t)l * c->H + h) * D : NULL;
                uint64_t seed = kkv_mix64(c->cfg.method.seed, ((uint64_t)l << 20) | (uint64_t)h);
                c->ops->key_encode(dst, c->tile, st + kkv_off_ktail(c), c->D, c->G, c->nb,
                                   c->cfg.method.select, seed, (uint64_t)p, rank);
            }
        }
        s->n_kpages[l]++;
    }
    if (n.vtail == c->R + c->G) {
        int p = n.vp;
        for (int h = 0; h < c->H; h++) {
            uint16_t *vt = kkv_stage(c, s, l, h) + kkv_off_vtail(c);
            uint8_t *dst = kkv_vpage_ptr(c, s, p, l, h);
            if (c->fp16) memcpy(dst, vt, (size_t)c->G * D * 2);
            else c->ops->value_encode(dst, c->tile, vt, c->D, c->G, c->vbits);
            /* the window's R values move to the front of the tail */
            memmove(vt, vt + (size_t)c->G * D, (size_t)c->R * D * 2);
        }
        s->n_vpages[l]++;
    }
}

kkv_status kkv_flush(kkv_cache *c, int seq, int layer) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "flush: NULL cache");
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "flush: no sequence %d", seq);
    KKV_TRY(kkv_seq_check_usable(s, seq, "flush"));
    if (layer < 0 || layer >= c->L)
        return kkv_fail(KKV_ERR_INVALID_ARG, "flush: layer %d not in 0..%d", layer, c->L - 1);
    flush_layer(c, s, layer);
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
    if ((c->cfg.max_tokens && s->len[layer] >= c->cfg.max_tokens) || s->len[layer] == INT_MAX)
        return kkv_fail(KKV_ERR_CTX_FULL, "append: sequence %d is at max_tokens %d", seq,
                        c->cfg.max_tokens ? c->cfg.max_tokens : INT_MAX);
    /* A Q-buffer left full by a missing kkv_flush() is flushed now, so the
     * state is what append-attend-flush would have left. Slots first: the
     * only failure comes before any change. */
    KKV_TRY(ensure_slots(c, s, pages_for(c, (int64_t)s->len[layer] + 1)));
    flush_layer(c, s, layer);

    kkv_counts cnt = kkv_counts_of(c, s, layer);
    for (int h = 0; h < c->H; h++) {
        uint16_t *st = kkv_stage(c, s, layer, h);
        const float *kh = k + (size_t)h * c->D, *vh = v + (size_t)h * c->D;
        if (cnt.len < c->S) {
            store_f16(st + kkv_off_sink_k(c) + (size_t)cnt.len * c->D, kh, c->D);
            store_f16(st + kkv_off_sink_v(c) + (size_t)cnt.len * c->D, vh, c->D);
        } else {
            store_f16(st + kkv_off_ktail(c) + (size_t)cnt.ktail * c->D, kh, c->D);
            store_f16(st + kkv_off_vtail(c) + (size_t)cnt.vtail * c->D, vh, c->D);
        }
    }
    s->len[layer]++;
    return KKV_OK;
}

kkv_status kkv_attend(kkv_cache *c, float *out, int seq, int layer, const float *q, int n_q) {
    if (!c) return kkv_fail(KKV_ERR_INVALID_ARG, "attend: NULL cache");
    kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "attend: no sequence %d", seq);
    KKV_TRY(kkv_seq_check_usable(s, seq, "attend"));
    if (layer < 0 || layer >= c->L)
        return kkv_fail(KKV_ERR_INVALID_ARG, "attend: layer %d not in 0..%d", layer, c->L - 1);
    if (!out || !q || n_q < c->H || n_q % c->H)
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "attend: n_q %d must be a positive multiple of n_kv_heads %d", n_q, c->H);
    if (s->len[layer] == 0)
        return kkv_fail(KKV_ERR_INVALID_ARG, "attend: sequence %d layer %d is empty", seq, layer);
    KKV_TRY(check_finite(q, (size_t)n_q * c->D, "attend: query"));
    return kkv_attend_impl(c, out, s, layer, q, n_q);
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
