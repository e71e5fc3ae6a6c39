/* Exact memory accounting: bytes of what is stored, by component. Pages and
 * sinks that forked sequences share count in full for each sequence that sees
 * them, and once for the pool. */
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "core/status.h"
#include "quant/quant.h"

/* Shared sink blocks already counted in a pool-wide sum: an open-addressing
 * set of pointers, [cap] with cap a power of two above twice the number. */
typedef struct sink_set {
    const kkv_sink **v;
    size_t           cap;
} sink_set;

/* 1 if b was in the set, else adds it and returns 0. */
static int sink_seen(sink_set *ss, const kkv_sink *b) {
    size_t i = ((uintptr_t)b >> 4) * 0x9e3779b97f4a7c15ull & (ss->cap - 1);
    while (ss->v[i]) {
        if (ss->v[i] == b) return 1;
        i = (i + 1) & (ss->cap - 1);
    }
    ss->v[i] = b;
    return 0;
}

/* Adds sequence s. seen: a bit per slot for the pool-wide sum (a shared page
 * is counted at its first visit) and ss the same for sinks, or both NULL for
 * one sequence. */
static void add_seq(const kkv_cache *c, const kkv_seq *s, kkv_mem *m, uint64_t *elems,
                    uint8_t *seen, sink_set *ss) {
    uint64_t D = (uint64_t)c->D, G = (uint64_t)c->G, H = (uint64_t)c->H;
    kkv_key_layout kl = kkv_key_layout_of(c->D, c->G, c->nb);
    kkv_value_layout vl = kkv_value_layout_of(c->D, c->G, c->vbits);
    uint64_t vrow = D * (uint64_t)c->vbits / 8; /* one value's codes */
    uint64_t longest = 0, slots = 0, sinks = 0;
    for (int l = 0; l < c->L; l++) {
        const kkv_lseq *y = &s->ly[l];
        kkv_counts n = kkv_counts_of(c, s, l);
        uint64_t kp = 0, vp = 0, vpart = (uint64_t)(n.vq % c->G);
        for (int p = n.drop; p < y->n_slots; p++) { /* below drop: released */
            int sl = y->slots[p];
            int shared = c->ref[sl] > 1;
            if (seen && shared) {
                if (seen[sl / 8] & (1u << (sl % 8))) continue; /* counted already */
                seen[sl / 8] |= (uint8_t)(1u << (sl % 8));
            }
            if (shared) m->shared += c->slot_bytes;
            slots++;
            kp += p < n.kp;
            vp += p < n.vp;
        }
        kp *= H, vp *= H;
        uint64_t sink16 = (uint64_t)2 * n.sink;
        if (y->sk) {
            int shared = y->sk->ref > 1;
            if (ss && shared && sink_seen(ss, y->sk)) {
                sink16 = 0; /* counted already */
            } else {
                if (shared) m->shared += kkv_sink_bytes(c, y->cs);
                sinks += kkv_sink_bytes(c, y->cs);
            }
        }
        if (c->sink8) { /* int8 sink rows: D codes and a scale each */
            m->sink_int8 += sink16 * H * (uint64_t)c->srow * 2;
            sink16 = 0;
        }
        uint64_t held16 = sink16 + (uint64_t)n.ktail + (uint64_t)n.vtail;
        if (c->fp16) {
            m->fp16 += (kp + vp) * G * D * 2 + vpart * H * D * 2;
        } else {
            if (c->kbits == 8) { /* codes, then scale and min */
                kkv_key8_layout k8 = kkv_key8_layout_of(c->D, c->G);
                m->key_lo += kp * (k8.scale - k8.codes);
                m->key_meta += kp * (k8.bytes - k8.scale);
            } else {
                m->key_lo += kp * (kl.hi - kl.lo);
                m->key_hi += kp * (kl.idx - kl.hi);
                m->key_idx += kp * (kl.scale - kl.idx);
                m->key_meta += kp * (kl.bytes - kl.scale);
            }
            m->value_codes += vp * (vl.scale - vl.codes) + vpart * H * vrow;
            m->value_meta += vp * (vl.bytes - vl.scale) + vpart * H * 4;
        }
        m->fp16 += held16 * H * D * 2;
        *elems += (uint64_t)n.len * H * D * 2;
        longest = (uint64_t)n.len > longest ? (uint64_t)n.len : longest;
    }
    m->tokens += longest;
    m->capacity += slots * c->slot_bytes + sinks + s->credit;
}

static void finish(kkv_mem *m, uint64_t elems) {
    m->total = m->key_lo + m->key_hi + m->key_idx + m->key_meta + m->value_codes +
               m->value_meta + m->fp16 + m->sink_int8;
    m->bits_per_element = elems ? 8.0 * (double)m->total / (double)elems : 0.0;
}

kkv_status kkv_seq_mem(const kkv_cache *c, kkv_mem *out, int seq) {
    const kkv_seq *s = kkv_seq_get(c, seq);
    if (!c || !out) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_mem: NULL argument");
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "seq_mem: no sequence %d", seq);
    uint64_t elems = 0;
    memset(out, 0, sizeof *out);
    add_seq(c, s, out, &elems, NULL, NULL);
    finish(out, elems);
    out->used = out->capacity;
    return KKV_OK;
}

/* Sums the sequences ss[0..n) into *out: pages held by several of them (and
 * shared sink blocks) counted once. who names the caller in the error. */
static kkv_status sum_seqs(const kkv_cache *c, kkv_mem *out, const kkv_seq *const *seqs, int n,
                           const char *who) {
    size_t n_shared = 0;
    for (int i = 0; i < n; i++)
        for (int l = 0; l < c->L; l++)
            n_shared += seqs[i]->ly[l].sk && seqs[i]->ly[l].sk->ref > 1;
    sink_set ss = {NULL, 1};
    while (ss.cap < 2 * n_shared + 2) ss.cap *= 2;
    ss.v = calloc(ss.cap, sizeof *ss.v); /* [cap] */
    uint8_t *seen = calloc((size_t)c->n_made / 8 + 1, 1); /* [n_made] bits */
    if (!seen || !ss.v) {
        free(seen), free(ss.v);
        return kkv_fail(KKV_ERR_NOMEM, "%s: out of memory", who);
    }
    uint64_t elems = 0;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < n; i++) add_seq(c, seqs[i], out, &elems, seen, &ss);
    free(seen);
    free(ss.v);
    finish(out, elems);
    return KKV_OK;
}

kkv_status kkv_cache_mem(const kkv_cache *c, kkv_mem *out) {
    if (!c || !out) return kkv_fail(KKV_ERR_INVALID_ARG, "cache_mem: NULL argument");
    const kkv_seq **live = malloc(((size_t)c->cfg.max_seqs + 1) * sizeof *live); /* [max_seqs] */
    if (!live) return kkv_fail(KKV_ERR_NOMEM, "cache_mem: out of memory");
    int n = 0;
    for (int i = 0; i < c->cfg.max_seqs; i++)
        if (c->seqs[i].live) live[n++] = &c->seqs[i];
    kkv_status st = sum_seqs(c, out, live, n, "cache_mem");
    free(live);
    if (st != KKV_OK) return st;
    out->used = c->used;
    out->capacity = c->budget;
    return KKV_OK;
}

kkv_status kkv_seqs_mem(const kkv_cache *c, kkv_mem *out, const int *seqs, int n) {
    if (!c || !out || (n > 0 && !seqs) || n < 0)
        return kkv_fail(KKV_ERR_INVALID_ARG, "seqs_mem: NULL argument or n < 0");
    const kkv_seq **list = malloc(((size_t)n + 1) * sizeof *list); /* [n] */
    if (!list) return kkv_fail(KKV_ERR_NOMEM, "seqs_mem: out of memory");
    for (int i = 0; i < n; i++) {
        list[i] = kkv_seq_get(c, seqs[i]);
        int dup = 0;
        for (int j = 0; j < i; j++) dup |= seqs[j] == seqs[i];
        if (!list[i] || dup) {
            kkv_status st = !list[i]
                ? kkv_fail(KKV_ERR_NOT_FOUND, "seqs_mem: no sequence %d", seqs[i])
                : kkv_fail(KKV_ERR_INVALID_ARG, "seqs_mem: sequence %d listed twice", seqs[i]);
            free(list);
            return st;
        }
    }
    kkv_status st = sum_seqs(c, out, list, n, "seqs_mem");
    free(list);
    if (st != KKV_OK) return st;
    out->used = out->capacity;
    return KKV_OK;
}

uint64_t kkv_cache_free_bytes(const kkv_cache *c) { return c ? c->budget - c->used : 0; }
