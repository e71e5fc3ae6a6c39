/* The cache's internal state. A sequence's tokens, per layer and KV head, are
 * [sink | key pages | key tail] for keys and [sink | value pages | value tail]
 * for values, where
 *   key tail   = the key Q-buffer (0..G tokens, fp16),
 *   value tail = value Q-buffer followed by the window of the R newest values
 *                (0..R+G tokens, fp16, oldest first).
 * A page slot holds page p of one sequence for every layer and head: the key
 * page and the value page of the same G tokens. The value page is written up
 * to R tokens later than the key page, into the slot the key page allocated. */
#ifndef KKV_CACHE_CACHE_H
#define KKV_CACHE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "core/threads.h"
#include "kittykv.h"

#define KKV_SLOTS_PER_CHUNK 64

typedef struct kkv_seq {
    int       live;
    int      *len;       /* [L] tokens appended per layer */
    int      *n_kpages;  /* [L] key pages written per layer */
    int      *n_vpages;  /* [L] value pages written per layer */
    int      *slots;     /* [cap_slots] page table: slot of page p */
    int       n_slots;   /* pages allocated (>= every layer's n_kpages) */
    int       cap_slots;
    uint16_t *staging;   /* [L][H][staging_tokens][D] fp16: sink K, sink V, key tail, value tail */
    int       failed;    /* a forward pass failed midway: only kkv_seq_free() is allowed */
} kkv_seq;

struct kkv_cache {
    kkv_cache_config cfg;
    int L, H, D, G, S, R, nb, vbits, fp16;
    size_t kpage, vpage;    /* bytes of one key / value page of one head */
    size_t slot_bytes;      /* L * H * (kpage + vpage) */
    size_t staging_tokens;  /* 2S + G + R + G per (layer, head) */
    size_t staging_bytes;   /* per sequence */
    /* pool */
    uint64_t  budget, used; /* bytes: slots handed out + staging of live seqs */
    int       max_slots;
    uint8_t **chunks;       /* [ceil(max_slots / KKV_SLOTS_PER_CHUNK)] lazily allocated */
    int      *free_slots;   /* [max_slots] stack of free slot ids */
    int       n_free, n_made; /* slots on the stack, slots ever created */
    /* sequences */
    kkv_seq  *seqs;         /* [max_seqs] */
    uint8_t  *rank;         /* [L][H][D] explicit ranking, or NULL */
    float    *tile;         /* [G][D] flush scratch */
    float    *attn_buf;     /* [attn_cap] attention partials, grown on demand */
    size_t    attn_cap;
    const kkv_ops *ops;
    kkv_tp   *tp;           /* attention workers: tp_own, or a borrowed pool */
    kkv_tp   *tp_own;       /* owned; NULL when n_threads <= 1 */
};

/* Offsets into a (layer, head) staging block, in fp16 elements. */
static inline uint16_t *kkv_stage(const kkv_cache *c, const kkv_seq *s, int l, int h) {
    return s->staging + ((size_t)l * c->H + h) * c->staging_tokens * c->D;
}
static inline size_t kkv_off_sink_k(const kkv_cache *c) { (void)c; return 0; }
static inline size_t kkv_off_sink_v(const kkv_cache *c) { return (size_t)c->S * c->D; }
static inline size_t kkv_off_ktail(const kkv_cache *c) { return (size_t)2 * c->S * c->D; }
static inline size_t kkv_off_vtail(const kkv_cache *c) {
    return ((size_t)2 * c->S + c->G) * c->D;
}

/* Slot memory and the pages of (layer, head) inside it. */
static inline uint8_t *kkv_slot_ptr(const kkv_cache *c, int slot) {
    return c->chunks[slot / KKV_SLOTS_PER_CHUNK] +
           (size_t)(slot % KKV_SLOTS_PER_CHUNK) * c->slot_bytes;
}
static inline uint8_t *kkv_kpage_ptr(const kkv_cache *c, const kkv_seq *s, int p, int l,
                                     int h) {
    return kkv_slot_ptr(c, s->slots[p]) + ((size_t)l * c->H + h) * (c->kpage + c->vpage);
}
static inline uint8_t *kkv_vpage_ptr(const kkv_cache *c, const kkv_seq *s, int p, int l,
                                     int h) {
    return kkv_kpage_ptr(c, s, p, l, h) + c->kpage;
}

/* Token counts of one layer, derived from len (single source of truth). */
typedef struct kkv_counts {
    int len;    /* tokens */
    int sink;   /* fp16 sink tokens */
    int kp, vp; /* key / value pages written */
    int ktail;  /* key Q-buffer tokens */
    int vtail;  /* value Q-buffer + window tokens */
} kkv_counts;

static inline kkv_counts kkv_counts_of(const kkv_cache *c, const kkv_seq *s, int l) {
    kkv_counts n;
    n.len = s->len[l];
    n.sink = n.len < c->S ? n.len : c->S;
    n.kp = s->n_kpages[l];
    n.vp = s->n_vpages[l];
    n.ktail = n.len - n.sink - n.kp * c->G;
    n.vtail = n.len - n.sink - n.vp * c->G;
    return n;
}

/* Pool: allocate one slot (KKV_ERR_POOL_FULL if the budget is spent) / free. */
kkv_status kkv_pool_take(kkv_cache *c, int *slot);
void       kkv_pool_give(kkv_cache *c, int slot);
/* Looks up a live sequence; NULL if there is none with that id. */
kkv_seq   *kkv_seq_get(const kkv_cache *c, int seq);
/* KKV_ERR_INVALID_ARG "what: sequence N ... free it" if s is marked failed. */
kkv_status kkv_seq_check_usable(const kkv_seq *s, int seq, const char *what);

/* Fused decode attention (attn.c). */
kkv_status kkv_attend_impl(kkv_cache *c, float *out, const kkv_seq *s, int layer,
                           const float *q, int n_q);

#endif
