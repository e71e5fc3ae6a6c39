/* The cache's internal state. A sequence's tokens, per layer and KV head, are
 * [sink | key pages | key tail] for keys and [sink | value pages | value tail]
 * for values, where
 *   key tail   = the key Q-buffer (0..G tokens, fp16),
 *   value tail = value Q-buffer followed by the window of the R newest values
 *                (0..R+G tokens, fp16, oldest first; with eager values only
 *                the window, 0..R, and vq % G rows of a page being written).
 * A page slot holds page p of one layer of one sequence for every head: the
 * key page and the value page of the same G tokens. The value page is written
 * up to R tokens later than the key page, into the slot the key page took.
 * Slots are reference-counted: forks share the ones whose pages are complete.
 * Staging is per layer, grown and shrunk in KKV_STAGE_CHUNK-token steps, and
 * accounted against the pool through the sequence's credit (cache.c). The
 * sink is a block of its own: once full it never changes, so forks share it
 * (reference-counted, counted once in the pool like a slot).
 * A layer with a window W (kkv_cache_config.layer_window) attends to its
 * newest W tokens only; page slot p is released once its key and value pages
 * are both written and all G of its tokens are before the window (the page
 * table keeps its length; slots[p] of a released page is -1), a function of
 * (len, kp, vq, W) like every other count. Its sink block is kept. */
#ifndef KKV_CACHE_CACHE_H
#define KKV_CACHE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "core/threads.h"
#include "kittykv.h"

#define KKV_SLOTS_PER_CHUNK 64
/* Chunks are carved from slabs of about this many bytes (core/bigmem.h): few
 * huge-page mappings per cache, each written front to back as slots are made,
 * so what is resident stays within one 2 MiB page of what the pool made. */
#define KKV_SLAB_BYTES ((size_t)32 << 20)
/* Staging grows and shrinks in chunks of this many tokens per region. */
#define KKV_STAGE_CHUNK 16

/* One layer of a sequence. A slot holds page p of this layer for every head:
 * the key page and the value page of the same G tokens. */
typedef struct kkv_lseq {
    int       len;       /* tokens appended */
    int       kp;        /* key pages written */
    int       vq;        /* values (after the sink) quantized into pages: a
                            multiple of G unless the method is eager */
    int       n_slots;   /* slots held: max(kp, ceil(vq / G)) */
    int       cap_slots;
    int      *slots;     /* [cap_slots] page table: slot of page p */
    int       cs, ck, cv;/* staging capacity in tokens: sink, key tail, value tail */
    int       win;       /* the layer's window (tokens attended), 0 = all */
    struct kkv_sink *sk; /* sink K and V ([H][2cs][D] fp16), or NULL; shared by forks */
    uint16_t *stage;     /* [H][ck + cv][D] fp16: key tail, value tail */
} kkv_lseq;

/* A layer's sink block. ref: sequences using it; one that is shared is full
 * (cs == S) and read-only. Its bytes are in kkv_cache.used while it lives. */
typedef struct kkv_sink {
    uint32_t ref, pad[3];  /* pad: data keeps malloc's 16-byte alignment */
    uint16_t data[];       /* [H][2cs][srow]: sink K, then sink V, per head */
} kkv_sink;

typedef struct kkv_seq {
    int       live;
    kkv_lseq *ly;        /* [L] */
    /* Pool bytes the sequence holds besides its pages and sinks: its staging
     * plus a surplus that kkv_seq_reserve() took or a flush freed, spent on
     * the next pages first. Once every layer is rsv_len tokens long (the
     * reservation is used up) the surplus goes back to the pool. */
    uint64_t  credit;
    uint64_t  stage_bytes; /* sum over layers of the key/value tail buffers */
    int64_t   rsv_len;     /* length the last kkv_seq_reserve() covers */
    int       failed;    /* a forward pass failed midway: only kkv_seq_free() is allowed */
} kkv_seq;

struct kkv_cache {
    kkv_cache_config cfg;
    int L, H, D, G, S, R, nb, vbits, fp16, eager;
    int kbits;              /* 2 (the boosted format) or 8 (8-bit key pages) */
    int sink8;              /* the sink is stored as int8 rows (method sink_int8) */
    int srow;               /* uint16 units of one sink row: D fp16, or with sink8
                               D/2 + 1 (D int8 codes, then the row's fp16 scale;
                               D is a multiple of 4, kkv_method_check) */
    int   *win;             /* [L] window of each layer (0 = all); cfg.layer_window points here, or NULL */
    size_t kpage, vpage;    /* bytes of one key / value page of one head */
    size_t slot_bytes;      /* H * (kpage + vpage): one layer's page p */
    int    max_k, max_v;    /* most tokens a key / value tail holds */
    /* pool: used = slots in use * slot_bytes + bytes of live sink blocks +
     * credit of every live sequence */
    uint64_t  budget, used;
    int       max_slots;
    uint8_t **chunks;       /* [n_chunks] lazily made; each points into a slab */
    uint8_t **slabs;        /* [kkv_n_slabs] kkv_big_alloc blocks, lazily made */
    int       slab_chunks;  /* chunks per slab (>= 1) */
    int      *free_slots;   /* [max_slots] stack of free slot ids */
    uint32_t *ref;          /* [max_slots] sequences referencing each slot */
    int       n_free, n_made; /* slots on the stack, slots ever created */
    int       n_used_slots;   /* slots with ref > 0 */
    /* sequences */
    kkv_seq  *seqs;         /* [max_seqs] */
    uint8_t  *rank;         /* [L][H][D] explicit ranking, or NULL */
    float    *tile;         /* [G][D] flush scratch */
    /* attention scratch, grown on demand and kept (decode attends per layer
     * per token): partial outputs and softmax states, and the pass's plan
     * (per sequence its counts and units) */
    void     *attn_buf;     /* [attn_bytes] floats */
    size_t    attn_bytes;
    void     *attn_plan;    /* [attn_plan_cap] bytes */
    size_t    attn_plan_cap;
    /* beyond the paper (docs/FORMAT.md section 5) */
    float    *krot, *vrot;  /* [D][D] key / value rotation (stored = R x), or NULL */
    /* budget=head|err: a slot is [H value pages][H key pages of nb_h rows
     * each, sum nb_h = H * nb] (the same slot_bytes as the plain layout), and
     * each chunk of slots ends in kpfx [KKV_SLOTS_PER_CHUNK][H] uint16: boosted
     * rows of the slot's heads before head h. Bookkeeping like the page table:
     * not in the pool's bytes. */
    int       bmode;        /* kkv_budget of the method (0 for the fp16 method) */
    size_t    kpage0;       /* bytes of a key page with no boosted channel */
    float    *bscore;       /* [H][D] flush scratch: channel scores of a layer's heads */
    float    *rot_buf;      /* [rot_cap] rotated queries / appended K,V, grown on demand */
    size_t    rot_cap;
    const kkv_ops *ops;
    kkv_tp   *tp;           /* attention workers: tp_own, or a borrowed pool */
    kkv_tp   *tp_own;       /* owned; NULL when n_threads <= 1 */
};

/* The staging of (layer, head): sink K [cs][srow] and sink V [cs][srow] in
 * the sink block (fp16 rows, or int8 rows with sink_int8), key tail [ck][D]
 * and value tail [cv][D] fp16 in the stage. NULL where the layer has no such
 * buffer. */
static inline uint16_t *kkv_sink_k(const kkv_cache *c, const kkv_seq *s, int l, int h) {
    const kkv_lseq *y = &s->ly[l];
    return y->sk ? y->sk->data + (size_t)h * 2 * (size_t)y->cs * c->srow : NULL;
}
static inline uint16_t *kkv_sink_v(const kkv_cache *c, const kkv_seq *s, int l, int h) {
    const kkv_lseq *y = &s->ly[l];
    return y->sk ? y->sk->data + ((size_t)h * 2 + 1) * (size_t)y->cs * c->srow : NULL;
}
static inline uint16_t *kkv_ktail(const kkv_cache *c, const kkv_seq *s, int l, int h) {
    const kkv_lseq *y = &s->ly[l];
    return y->stage ? y->stage + (size_t)h * (size_t)(y->ck + y->cv) * c->D : NULL;
}
static inline uint16_t *kkv_vtail(const kkv_cache *c, const kkv_seq *s, int l, int h) {
    const kkv_lseq *y = &s->ly[l];
    return y->stage ? y->stage + ((size_t)h * (size_t)(y->ck + y->cv) + (size_t)y->ck) * c->D
                    : NULL;
}

/* Slot memory and the pages of (layer, head) inside it. */
static inline uint8_t *kkv_slot_ptr(const kkv_cache *c, int slot) {
    return c->chunks[slot / KKV_SLOTS_PER_CHUNK] +
           (size_t)(slot % KKV_SLOTS_PER_CHUNK) * c->slot_bytes;
}
/* budget mode: the prefix row [H] of a slot (see kkv_cache.bmode) */
static inline uint16_t *kkv_slot_kpfx(const kkv_cache *c, int slot) {
    return (uint16_t *)(void *)(c->chunks[slot / KKV_SLOTS_PER_CHUNK] +
                                (size_t)KKV_SLOTS_PER_CHUNK * c->slot_bytes) +
           (size_t)(slot % KKV_SLOTS_PER_CHUNK) * c->H;
}
/* Boosted channels (hi rows) of head h's key page in a slot. */
static inline int kkv_slot_nb(const kkv_cache *c, int slot, int h) {
    if (!c->bmode) return c->nb;
    const uint16_t *x = kkv_slot_kpfx(c, slot);
    return (h + 1 < c->H ? x[h + 1] : c->H * c->nb) - x[h];
}
static inline uint8_t *kkv_slot_kpage(const kkv_cache *c, int slot, int h) {
    if (!c->bmode) return kkv_slot_ptr(c, slot) + (size_t)h * (c->kpage + c->vpage);
    return kkv_slot_ptr(c, slot) + (size_t)c->H * c->vpage + (size_t)h * c->kpage0 +
           (size_t)kkv_slot_kpfx(c, slot)[h] * (size_t)(c->G / 4);
}
static inline uint8_t *kkv_kpage_ptr(const kkv_cache *c, const kkv_seq *s, int p, int l,
                                     int h) {
    return kkv_slot_kpage(c, s->ly[l].slots[p], h);
}
static inline uint8_t *kkv_vpage_ptr(const kkv_cache *c, const kkv_seq *s, int p, int l,
                                     int h) {
    if (!c->bmode) return kkv_kpage_ptr(c, s, p, l, h) + c->kpage;
    return kkv_slot_ptr(c, s->ly[l].slots[p]) + (size_t)h * c->vpage;
}
static inline int kkv_kpage_nb(const kkv_cache *c, const kkv_seq *s, int p, int l, int h) {
    return kkv_slot_nb(c, s->ly[l].slots[p], h);
}
/* Bytes of each chunk's slot memory plus its budget bookkeeping. */
static inline size_t kkv_chunk_bytes(const kkv_cache *c) {
    return c->slot_bytes * KKV_SLOTS_PER_CHUNK +
           (c->bmode ? (size_t)KKV_SLOTS_PER_CHUNK * c->H * sizeof(uint16_t) : 0);
}
/* Distance between chunks in a slab: kkv_chunk_bytes rounded up to 64. */
static inline size_t kkv_chunk_stride(const kkv_cache *c) {
    return (kkv_chunk_bytes(c) + 63) & ~(size_t)63;
}
static inline size_t kkv_n_chunks(const kkv_cache *c) {
    return ((size_t)c->max_slots + KKV_SLOTS_PER_CHUNK - 1) / KKV_SLOTS_PER_CHUNK;
}
static inline size_t kkv_n_slabs(const kkv_cache *c) {
    return (kkv_n_chunks(c) + (size_t)c->slab_chunks - 1) / (size_t)c->slab_chunks;
}
/* Bytes of slab i: slab_chunks chunks, fewer in the last one. */
static inline size_t kkv_slab_bytes(const kkv_cache *c, size_t i) {
    size_t left = kkv_n_chunks(c) - i * (size_t)c->slab_chunks;
    return (left < (size_t)c->slab_chunks ? left : (size_t)c->slab_chunks) * kkv_chunk_stride(c);
}

/* Token counts of one layer, derived from (len, kp, vq). */
typedef struct kkv_counts {
    int len;    /* tokens */
    int sink;   /* fp16 sink tokens */
    int kp;     /* key pages written */
    int vq;     /* values quantized (after the sink) */
    int vp;     /* value pages completely written: vq / G */
    int ktail;  /* key Q-buffer tokens */
    int vtail;  /* fp16 values after the sink: value Q-buffer + window */
    int first;  /* first token a windowed layer still attends to (0 without a window) */
    int sink_held; /* sink tokens stored: = sink (a windowed layer keeps its sink block,
                      shared by forks; attention skips it once it is before first) */
    int drop;   /* leading page slots released (wholly before first, both pages written) */
} kkv_counts;

static inline kkv_counts kkv_counts_make(const kkv_cache *c, int len, int kp, int vq, int win) {
    kkv_counts n;
    n.len = len;
    n.sink = n.len < c->S ? n.len : c->S;
    n.kp = kp;
    n.vq = vq;
    n.vp = vq / c->G;
    n.ktail = n.len - n.sink - n.kp * c->G;
    n.vtail = n.len - n.sink - n.vq;
    n.first = win > 0 && n.len > win ? n.len - win : 0;
    n.sink_held = n.sink;
    int dead = n.first > c->S ? (n.first - c->S) / c->G : 0; /* pages wholly before first */
    int vp = n.vp < n.kp ? n.vp : n.kp;
    n.drop = dead < vp ? dead : vp;
    return n;
}
static inline kkv_counts kkv_counts_of(const kkv_cache *c, const kkv_seq *s, int l) {
    return kkv_counts_make(c, s->ly[l].len, s->ly[l].kp, s->ly[l].vq, s->ly[l].win);
}

/* Pool: a fresh slot with one reference (the caller has accounted its bytes
 * in c->used) / drop one reference, returning the slot and its bytes to the
 * pool when it was the last. */
kkv_status kkv_pool_take(kkv_cache *c, int *slot);
void       kkv_pool_give(kkv_cache *c, int slot);
/* Releases the page slots of layer l that its counts say are out of the
 * window (slots[drop0 .. n.drop) -> -1). Each slot's bytes stay with the
 * sequence as credit, to pay for its next pages (a slot still shared with a
 * fork keeps its bytes in the pool for the other holder; the credit is then
 * taken from the pool when it has room). Cannot fail. */
void       kkv_seq_release_window(kkv_cache *c, kkv_seq *s, int l, int drop0);
/* Undoes a kkv_pool_take() whose bytes were never accounted. */
void       kkv_pool_untake(kkv_cache *c, int slot);
/* The lowest free sequence id, or -1. */
int        kkv_seq_new_id(const kkv_cache *c);

/* Credit accounting of one change to a sequence: staging goes from its
 * current bytes to new_stage and objects of obj_bytes (new slots, sink
 * growth) are made. Spends the sequence's surplus first, then the pool;
 * KKV_ERR_POOL_FULL (nothing changed) if the pool cannot give the rest.
 * kkv_seq_charge() only checks; kkv_seq_commit() books it. */
kkv_status kkv_seq_charge(const kkv_cache *c, const kkv_seq *s, uint64_t new_stage,
                          uint64_t obj_bytes, uint64_t *from_pool);
void       kkv_seq_commit(kkv_cache *c, kkv_seq *s, uint64_t new_stage, uint64_t obj_bytes,
                          uint64_t from_pool);
/* Gives the surplus credit back to the pool once the reservation is used up. */
void       kkv_seq_trim(kkv_cache *c, kkv_seq *s);

/* Staging bytes of one layer with capacities (cs, ck, cv): sink and tails. */
static inline uint64_t kkv_stage_bytes(const kkv_cache *c, int cs, int ck, int cv) {
    return (uint64_t)c->H * 2 *
           ((uint64_t)2 * cs * (uint64_t)c->srow + (uint64_t)(ck + cv) * (uint64_t)c->D);
}
/* Bytes of a sink block of capacity cs (the header is bookkeeping, like a
 * page table, and not counted). */
static inline uint64_t kkv_sink_bytes(const kkv_cache *c, int cs) {
    return kkv_stage_bytes(c, cs, 0, 0);
}
/* A sink block of capacity cs with one reference (bytes not yet accounted),
 * or NULL when out of memory; kkv_sink_drop() drops one reference and, with
 * the last, frees it and gives its bytes back to the pool. */
kkv_sink  *kkv_sink_new(const kkv_cache *c, int cs);
void       kkv_sink_drop(kkv_cache *c, kkv_sink *b, int cs);
/* Capacity a region needs to hold n tokens: n rounded up to the chunk, at most max. */
static inline int kkv_stage_cap(int n, int max) {
    int r = (n + KKV_STAGE_CHUNK - 1) / KKV_STAGE_CHUNK * KKV_STAGE_CHUNK;
    return r < max ? r : max;
}
/* Slots a layer with these counts holds. */
static inline int kkv_slots_for(const kkv_cache *c, const kkv_counts *n) {
    int v = (n->vq + c->G - 1) / c->G;
    return n->kp > v ? n->kp : v;
}
/* Looks up a live sequence; NULL if there is none with that id. */
kkv_seq   *kkv_seq_get(const kkv_cache *c, int seq);
/* KKV_ERR_INVALID_ARG "what: sequence N ... free it" if s is marked failed. */
kkv_status kkv_seq_check_usable(const kkv_seq *s, int seq, const char *what);

/* Fused decode attention of one layer of n_seqs sequences in one pool job
 * (attend.c). out, q: [n_seqs][n_q][D]; arguments already checked. */
kkv_status kkv_attend_impl(kkv_cache *c, float *out, const kkv_seq *const *ss, int n_seqs,
                           int layer, const float *q, int n_q);

#endif
