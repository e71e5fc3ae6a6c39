/* Exact memory accounting: bytes of what is stored, by component. */
#include <string.h>

#include "cache/cache.h"
#include "core/status.h"
#include "quant/quant.h"

static void add_seq(const kkv_cache *c, const kkv_seq *s, kkv_mem *m, uint64_t *elems) {
    uint64_t D = (uint64_t)c->D, G = (uint64_t)c->G, H = (uint64_t)c->H;
    kkv_key_layout kl = kkv_key_layout_of(c->D, c->G, c->nb);
    kkv_value_layout vl = kkv_value_layout_of(c->D, c->G, c->vbits);
    uint64_t longest = 0;
    for (int l = 0; l < c->L; l++) {
        kkv_counts n = kkv_counts_of(c, s, l);
        uint64_t kp = (uint64_t)n.kp * H, vp = (uint64_t)n.vp * H;
        uint64_t held16 = (uint64_t)2 * n.sink + (uint64_t)n.ktail + (uint64_t)n.vtail;
        if (c->fp16) {
            m->fp16 += (kp + vp) * G * D * 2;
        } else {
            m->key_lo += kp * (kl.hi - kl.lo);
            m->key_hi += kp * (kl.idx - kl.hi);
            m->key_idx += kp * (kl.scale - kl.idx);
            m->key_meta += kp * (kl.bytes - kl.scale);
            m->value_codes += vp * (vl.scale - vl.codes);
            m->value_meta += vp * (vl.bytes - vl.scale);
        }
        m->fp16 += held16 * H * D * 2;
        *elems += (uint64_t)n.len * H * D * 2;
        longest = (uint64_t)n.len > longest ? (uint64_t)n.len : longest;
    }
    m->tokens += longest;
    m->capacity += (uint64_t)s->n_slots * c->slot_bytes + c->staging_bytes;
}

static void finish(kkv_mem *m, uint64_t elems) {
    m->total = m->key_lo + m->key_hi + m->key_idx + m->key_meta + m->value_codes +
               m->value_meta + m->fp16;
    m->bits_per_element = elems ? 8.0 * (double)m->total / (double)elems : 0.0;
}

kkv_status kkv_seq_mem(const kkv_cache *c, kkv_mem *out, int seq) {
    const kkv_seq *s = kkv_seq_get(c, seq);
    if (!c || !out) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_mem: NULL argument");
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "seq_mem: no sequence %d", seq);
    uint64_t elems = 0;
    memset(out, 0, sizeof *out);
    add_seq(c, s, out, &elems);
    finish(out, elems);
    return KKV_OK;
}

kkv_status kkv_cache_mem(const kkv_cache *c, kkv_mem *out) {
    if (!c || !out) return kkv_fail(KKV_ERR_INVALID_ARG, "cache_mem: NULL argument");
    uint64_t elems = 0;
    memset(out, 0, sizeof *out);
    for (int i = 0; i < c->cfg.max_seqs; i++)
        if (c->seqs[i].live) add_seq(c, &c->seqs[i], out, &elems);
    finish(out, elems);
    out->capacity = c->budget;
    return KKV_OK;
}

uint64_t kkv_cache_free_bytes(const kkv_cache *c) { return c ? c->budget - c->used : 0; }
