/* Save and restore one sequence (docs/STATE_FORMAT.md). Everything is
 * little-endian; the loader checks the checksum first, then every count and
 * every page field that could steer a kernel out of bounds (the boost index),
 * builds the new sequence aside and links it in only when nothing can fail. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cache/cache.h"
#include "core/status.h"
#include "quant/quant.h"

#define MAGIC "KKVSTATE"
#define HEADER_BYTES 96

/* ---------------------------------------------------------------- writer */

typedef struct wbuf {
    uint8_t *p; /* NULL: only count */
    size_t   n;
} wbuf;

static void put(wbuf *w, const void *src, size_t n) {
    if (w->p && n) memcpy(w->p + w->n, src, n);
    w->n += n;
}
static void put_u32(wbuf *w, uint32_t v) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(w, b, 4);
}
static void put_u64(wbuf *w, uint64_t v) {
    put_u32(w, (uint32_t)v);
    put_u32(w, (uint32_t)(v >> 32));
}
/* fp16 rows as little-endian bytes */
static void put_f16(wbuf *w, const uint16_t *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint8_t b[2] = {(uint8_t)x[i], (uint8_t)(x[i] >> 8)};
        put(w, b, 2);
    }
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The layer windows as one header word: 0 when no layer has one (so states
 * of caches without windows are what they always were), else a nonzero hash
 * of every layer's window, so a state only loads into a cache with the same. */
static uint32_t windows_tag(const kkv_cache *c) {
    int any = 0;
    for (int l = 0; c->win && l < c->L; l++) any |= c->win[l] != 0;
    if (!any) return 0;
    uint32_t h = 2166136261u; /* FNV-1a over the windows' little-endian bytes */
    for (int l = 0; l < c->L; l++)
        for (int b = 0; b < 4; b++) {
            h ^= ((uint32_t)c->win[l] >> (8 * b)) & 0xffu;
            h *= 16777619u;
        }
    return h ? h : 1;
}

/* The options beyond the paper in one word (docs/STATE_FORMAT.md): 0 for
 * every method without them, so states written before they existed (the
 * word was reserved, 0) still load. */
static uint32_t plus_options(const kkv_cache *c) {
    const kkv_method *m = &c->cfg.method;
    uint32_t o = (uint32_t)m->pairs | (uint32_t)m->clip << 1 | (uint32_t)m->value_clip << 2 |
                 (uint32_t)m->key_rot << 3 | (uint32_t)m->value_rot << 5;
    /* the pair map decides the boosted set of the pages still to come */
    if (m->pairs) o |= (uint32_t)(c->cfg.rope_neox != 0) << 7 | (uint32_t)c->cfg.rope_dims << 8;
    /* bits 8..16 hold rope_dims (at most 256) */
    o |= (uint32_t)c->bmode << 17 | (uint32_t)m->sink_int8 << 19 | (uint32_t)m->window_int8 << 20;
    o |= (uint32_t)(c->kbits == 8) << 21;
    /* int8 sink rows; bit 19 alone was the fidelity study's fp16 sink */
    o |= (uint32_t)c->sink8 << 22;
    return o;
}

/* The header: also what the loader compares against its cache. */
static void put_header(wbuf *w, const kkv_cache *c, uint64_t fingerprint, uint32_t n_tokens) {
    const kkv_method *m = &c->cfg.method;
    put(w, MAGIC, 8);
    put_u32(w, KKV_STATE_FORMAT_VERSION);
    put_u32(w, HEADER_BYTES);
    put_u32(w, KKV_PAGE_FORMAT_VERSION);
    put_u32(w, (uint32_t)m->fp16);
    put_u32(w, (uint32_t)m->sink);
    put_u32(w, (uint32_t)m->group);
    put_u32(w, (uint32_t)m->window);
    put_u32(w, f32_bits(m->alpha));
    put_u32(w, (uint32_t)m->value_bits);
    put_u32(w, (uint32_t)m->select);
    put_u64(w, m->seed);
    put_u32(w, (uint32_t)c->eager);
    put_u32(w, (uint32_t)c->nb);
    put_u32(w, (uint32_t)c->L);
    put_u32(w, (uint32_t)c->H);
    put_u32(w, (uint32_t)c->D);
    put_u32(w, plus_options(c)); /* 0 for the paper's methods (was reserved) */
    put_u64(w, fingerprint);
    put_u32(w, n_tokens);
    put_u32(w, windows_tag(c)); /* was reserved (0) before layer windows */
}

static void put_seq(wbuf *w, const kkv_cache *c, const kkv_seq *s, const kkv_state_meta *meta) {
    uint32_t nt = meta && meta->tokens ? (uint32_t)meta->n_tokens : 0;
    put_header(w, c, meta ? meta->model_fingerprint : 0, nt);
    for (uint32_t i = 0; i < nt; i++) put_u32(w, (uint32_t)meta->tokens[i]);
    for (int l = 0; l < c->L; l++) {
        put_u32(w, (uint32_t)s->ly[l].len);
        put_u32(w, (uint32_t)s->ly[l].kp);
        put_u32(w, (uint32_t)s->ly[l].vq);
    }
    size_t D = (size_t)c->D, vrow = D * (size_t)(c->fp16 ? 16 : c->vbits) / 8;
    kkv_value_layout vl = kkv_value_layout_of(c->D, c->G, c->vbits);
    for (int l = 0; l < c->L; l++) {
        kkv_counts n = kkv_counts_of(c, s, l);
        for (int h = 0; h < c->H; h++) {
            if (c->sink8) { /* int8 rows: bytes already in their stored order */
                put(w, kkv_sink_k(c, s, l, h), (size_t)n.sink_held * c->srow * 2);
                put(w, kkv_sink_v(c, s, l, h), (size_t)n.sink_held * c->srow * 2);
            } else {
                put_f16(w, kkv_sink_k(c, s, l, h), (size_t)n.sink_held * D);
                put_f16(w, kkv_sink_v(c, s, l, h), (size_t)n.sink_held * D);
            }
            for (int p = n.drop; p < n.kp; p++) {
                size_t kb = c->kpage;
                if (c->bmode) { /* budget=head|err: each page's n_boost before it */
                    int nb = kkv_kpage_nb(c, s, p, l, h);
                    put_u32(w, (uint32_t)nb);
                    kb = kkv_key_page_bytes(c->D, c->G, nb);
                }
                put(w, kkv_kpage_ptr(c, s, p, l, h), kb);
            }
            for (int p = n.drop; p < n.vp; p++) put(w, kkv_vpage_ptr(c, s, p, l, h), c->vpage);
            int part = n.vq % c->G; /* eager: rows of the page being written */
            if (part) {
                const uint8_t *pg = kkv_vpage_ptr(c, s, n.vp, l, h);
                put(w, pg, (size_t)part * vrow);
                if (!c->fp16) {
                    put(w, pg + vl.scale, (size_t)part * 2);
                    put(w, pg + vl.mn, (size_t)part * 2);
                }
            }
            put_f16(w, kkv_ktail(c, s, l, h), (size_t)n.ktail * D);
            put_f16(w, kkv_vtail(c, s, l, h), (size_t)n.vtail * D);
        }
    }
}

static kkv_status check_meta(const kkv_state_meta *meta) {
    if (meta && (meta->n_tokens < 0 || (meta->n_tokens && !meta->tokens)))
        return kkv_fail(KKV_ERR_INVALID_ARG, "seq_save: bad token list (%d ids)", meta->n_tokens);
    return KKV_OK;
}

kkv_status kkv_seq_save(const kkv_cache *c, void *buf, size_t cap, size_t *n_out, int seq,
                        const kkv_state_meta *meta) {
    if (!c || !n_out) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_save: NULL argument");
    const kkv_seq *s = kkv_seq_get(c, seq);
    if (!s) return kkv_fail(KKV_ERR_NOT_FOUND, "seq_save: no sequence %d", seq);
    KKV_TRY(kkv_seq_check_usable(s, seq, "seq_save"));
    KKV_TRY(check_meta(meta));
    wbuf w = {NULL, 0};
    put_seq(&w, c, s, meta);
    *n_out = w.n + 8;
    if (!buf) return KKV_OK;
    if (cap < *n_out)
        return kkv_fail(KKV_ERR_INVALID_ARG, "seq_save: buffer of %zu bytes, the state needs %zu",
                        cap, *n_out);
    w.p = buf;
    w.n = 0;
    put_seq(&w, c, s, meta);
    put_u64(&w, XXH3_64bits(buf, w.n - 0));
    return KKV_OK;
}

kkv_status kkv_seq_save_file(const kkv_cache *c, const char *path, int seq,
                             const kkv_state_meta *meta) {
    if (!path) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_save: NULL path");
    size_t n = 0;
    KKV_TRY(kkv_seq_save(c, NULL, 0, &n, seq, meta));
    uint8_t *buf = malloc(n);
    if (!buf) return kkv_fail(KKV_ERR_NOMEM, "seq_save: out of memory for %zu bytes", n);
    kkv_status st = kkv_seq_save(c, buf, n, &n, seq, meta);
    size_t plen = strlen(path);
    char *tmp = st == KKV_OK ? malloc(plen + 5) : NULL;
    if (st == KKV_OK && !tmp) st = kkv_fail(KKV_ERR_NOMEM, "seq_save: out of memory");
    if (st == KKV_OK) {
        memcpy(tmp, path, plen);
        memcpy(tmp + plen, ".tmp", 5);
        FILE *f = fopen(tmp, "wb");
        if (!f) {
            st = kkv_fail(KKV_ERR_IO, "seq_save: cannot create %s: %s", tmp, strerror(errno));
        } else {
            int bad = fwrite(buf, 1, n, f) != n;
            bad |= fclose(f) != 0;
            if (bad || rename(tmp, path) != 0) {
                st = kkv_fail(KKV_ERR_IO, "seq_save: cannot write %s: %s", path, strerror(errno));
                remove(tmp);
            }
        }
    }
    free(tmp);
    free(buf);
    return st;
}

/* ---------------------------------------------------------------- reader */

typedef struct rbuf {
    const uint8_t *p;
    size_t         n, at;
} rbuf;

static int take(rbuf *r, size_t n, const uint8_t **out) {
    if (r->n - r->at < n) return -1;
    *out = r->p + r->at;
    r->at += n;
    return 0;
}
static uint32_t ld_u32(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static uint64_t ld_u64(const uint8_t *b) { return ld_u32(b) | (uint64_t)ld_u32(b + 4) << 32; }

/* fp16 finite: exponent not all ones */
static int f16_finite(uint16_t h) { return (h & 0x7c00) != 0x7c00; }

static int rows_finite(const uint8_t *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!f16_finite(kkv_ld16(b + 2 * i))) return 0;
    return 1;
}

/* A key page whose index could send a kernel out of bounds, or whose fp16
 * parts are not finite, is malformed. */
static const char *bad_key_page(const kkv_cache *c, const uint8_t *pg, int nb) {
    if (c->fp16) return rows_finite(pg, (size_t)c->G * c->D) ? NULL : "non-finite fp16 key";
    if (c->kbits == 8) /* every code byte is in range */
        return rows_finite(pg + kkv_key8_layout_of(c->D, c->G).scale, 2 * (size_t)c->D)
                   ? NULL : "non-finite key scale or min";
    kkv_key_layout kl = kkv_key_layout_of(c->D, c->G, nb);
    uint8_t used[KKV_MAX_HEAD_DIM] = {0};
    int boosted = 0;
    for (int j = 0; j < c->D; j++) {
        int r = pg[kl.idx + j];
        if (r > nb) return "key page index out of range";
        if (r < nb) {
            if (used[r]++) return "key page index uses a row twice";
            boosted++;
        }
    }
    if (boosted != nb) return "key page boosts the wrong number of channels";
    if (!rows_finite(pg + kl.scale, 2 * (size_t)c->D)) return "non-finite key scale or min";
    return NULL;
}

static int win_of(const kkv_cache *c, int l) { return c->win ? c->win[l] : 0; }

static kkv_status fmt(const char *why) {
    return kkv_fail(KKV_ERR_FORMAT, "seq_load: %s", why);
}

kkv_status kkv_seq_load(kkv_cache *c, int *seq, const void *buf, size_t n,
                        uint64_t model_fingerprint, int32_t *tokens, int tokens_cap,
                        int *n_tokens) {
    if (!c || !seq || (!buf && n)) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_load: NULL argument");
    rbuf r = {buf, n, 0};
    if (n < 8 + 4 || memcmp(buf, MAGIC, 8)) return fmt("not a kittykv sequence state (bad magic)");
    uint32_t version = ld_u32(r.p + 8);
    if (version != KKV_STATE_FORMAT_VERSION) {
        char why[96];
        snprintf(why, sizeof why, "format version %u, this build reads %d", version,
                 KKV_STATE_FORMAT_VERSION);
        return fmt(why);
    }
    if (n < HEADER_BYTES + 8) return fmt("truncated header");
    if (XXH3_64bits(buf, n - 8) != ld_u64(r.p + n - 8))
        return fmt("checksum mismatch (corrupted or truncated)");
    r.n = n - 8;
    /* the header must be exactly what this cache would write */
    uint8_t want[HEADER_BYTES];
    wbuf w = {want, 0};
    const uint8_t *h = NULL;
    take(&r, HEADER_BYTES, &h);
    uint32_t nt = ld_u32(h + 88);
    put_header(&w, c, model_fingerprint, nt);
    if (memcmp(h, want, 20)) return fmt("header size or page format differs");
    if (memcmp(h + 20, want + 20, 44)) return fmt("made with another method or parameters");
    if (memcmp(h + 64, want + 64, 12)) return fmt("made for another model shape (layers, KV heads, head_dim)");
    if (memcmp(h + 80, want + 80, 8)) return fmt("made with another model (fingerprint differs)");
    if (memcmp(h + 76, want + 76, 4))
        return fmt("made with other options beyond the paper (pairs, rotation, clipping, RoPE "
                   "layout, budget, int8 parts)");
    if (memcmp(h + 92, want + 92, 4))
        return fmt("made with other layer windows (sliding-window layers differ)");
    if (nt > (uint32_t)(r.n - r.at) / 4) return fmt("truncated token list");
    if (n_tokens) *n_tokens = (int)nt;
    if (tokens && (uint32_t)tokens_cap < nt)
        return kkv_fail(KKV_ERR_INVALID_ARG, "seq_load: %u token ids do not fit in %d", nt,
                        tokens_cap);
    const uint8_t *tok = NULL;
    take(&r, (size_t)nt * 4, &tok);
    int id = kkv_seq_new_id(c);
    if (id < 0)
        return kkv_fail(KKV_ERR_POOL_FULL, "seq_load: all %d sequence slots in use",
                        c->cfg.max_seqs);

    /* layer counts, checked against the lifecycle */
    kkv_seq t;
    memset(&t, 0, sizeof t);
    const uint8_t *cnt;
    if (take(&r, (size_t)c->L * 12, &cnt)) return fmt("truncated layer table");
    int G = c->G;
    uint64_t stage = 0, sinks = 0; /* tails (credit) and sink blocks */
    int pages = 0;
    for (int l = 0; l < c->L; l++) {
        uint32_t len = ld_u32(cnt + 12 * l), kp = ld_u32(cnt + 12 * l + 4),
                 vq = ld_u32(cnt + 12 * l + 8);
        if (len > (1u << 30) || (c->cfg.max_tokens && len > (uint32_t)c->cfg.max_tokens))
            return fmt("sequence longer than the cache allows");
        uint32_t post = len > (uint32_t)c->S ? len - (uint32_t)c->S : 0;
        if ((uint64_t)kp * G > post || post - kp * (uint32_t)G > (uint32_t)G || vq > post ||
            post - vq > (uint32_t)c->max_v || (!c->eager && vq % (uint32_t)G) ||
            (!c->eager && vq > kp * (uint32_t)G))
            return fmt("layer counts inconsistent with the method's lifecycle");
        if (c->eager && vq != (post > (uint32_t)c->R ? post - (uint32_t)c->R : 0))
            return fmt("layer counts inconsistent with eager values");
        kkv_counts k = kkv_counts_make(c, (int)len, (int)kp, (int)vq, win_of(c, l));
        stage += kkv_stage_bytes(c, 0, kkv_stage_cap(k.ktail, c->max_k),
                                 kkv_stage_cap(k.vtail, c->max_v));
        sinks += kkv_sink_bytes(c, kkv_stage_cap(k.sink, c->S));
        pages += kkv_slots_for(c, &k) - k.drop;
    }
    uint64_t need = stage + sinks + (uint64_t)pages * c->slot_bytes;
    /* bytes the layers' contents take, to refuse truncation before allocating */
    size_t D = (size_t)c->D, vrow = D * (size_t)(c->fp16 ? 16 : c->vbits) / 8;
    uint64_t body = 0;
    for (int l = 0; l < c->L; l++) {
        kkv_counts k = kkv_counts_make(c, (int)ld_u32(cnt + 12 * l), (int)ld_u32(cnt + 12 * l + 4),
                                       (int)ld_u32(cnt + 12 * l + 8), win_of(c, l));
        uint64_t part = (uint64_t)(k.vq % G) * (vrow + (c->fp16 ? 0 : 4));
        body += (uint64_t)c->H * ((uint64_t)2 * k.sink_held * (uint64_t)c->srow * 2 +
                                  (uint64_t)(k.ktail + k.vtail) * D * 2 +
                                  (uint64_t)(k.kp - k.drop) * (c->kpage + (c->bmode ? 4 : 0)) +
                                  (uint64_t)(k.vp - k.drop) * c->vpage + part);
    }
    if (body != r.n - r.at) return fmt(body > r.n - r.at ? "truncated contents" : "trailing bytes");
    if (need > c->budget - c->used)
        return kkv_fail(KKV_ERR_POOL_FULL,
                        "seq_load: pool full: %llu of %llu bytes in use, the sequence needs %llu",
                        (unsigned long long)c->used, (unsigned long long)c->budget,
                        (unsigned long long)need);

    /* build it aside */
    kkv_status st = KKV_OK;
    const char *why = NULL;
    t.ly = calloc((size_t)c->L, sizeof *t.ly);
    if (!t.ly) return kkv_fail(KKV_ERR_NOMEM, "seq_load: out of memory");
    kkv_value_layout vl = kkv_value_layout_of(c->D, G, c->vbits);
    for (int l = 0; l < c->L && st == KKV_OK && !why; l++) {
        kkv_lseq *y = &t.ly[l];
        y->len = (int)ld_u32(cnt + 12 * l);
        y->kp = (int)ld_u32(cnt + 12 * l + 4);
        y->vq = (int)ld_u32(cnt + 12 * l + 8);
        y->win = win_of(c, l);
        kkv_counts k = kkv_counts_make(c, y->len, y->kp, y->vq, y->win);
        y->cs = kkv_stage_cap(k.sink_held, c->S);
        y->ck = kkv_stage_cap(k.ktail, c->max_k);
        y->cv = kkv_stage_cap(k.vtail, c->max_v);
        size_t sb = (size_t)kkv_stage_bytes(c, 0, y->ck, y->cv);
        int ns = kkv_slots_for(c, &k);
        if (sb && !(y->stage = malloc(sb))) st = kkv_fail(KKV_ERR_NOMEM, "seq_load: out of memory");
        if (y->cs && st == KKV_OK && !(y->sk = kkv_sink_new(c, y->cs)))
            st = kkv_fail(KKV_ERR_NOMEM, "seq_load: out of memory");
        if (ns && st == KKV_OK && !(y->slots = malloc((size_t)ns * sizeof *y->slots)))
            st = kkv_fail(KKV_ERR_NOMEM, "seq_load: out of memory");
        y->cap_slots = ns;
        for (int p = 0; p < k.drop && st == KKV_OK; p++) y->slots[p] = -1; /* released */
        if (st == KKV_OK) y->n_slots = k.drop; /* the table keeps its length */
        for (int p = k.drop; p < ns && st == KKV_OK; p++) {
            st = kkv_pool_take(c, &y->slots[p]);
            if (st == KKV_OK) y->n_slots = p + 1;
        }
        for (int hh = 0; hh < c->H && st == KKV_OK && !why; hh++) {
            const uint8_t *b = NULL;
            size_t rows[2] = {(size_t)k.sink_held, (size_t)k.sink_held};
            uint16_t *dst[2] = {kkv_sink_k(c, &t, l, hh), kkv_sink_v(c, &t, l, hh)};
            for (int i = 0; i < 2 && !why && c->sink8; i++) { /* int8 rows */
                size_t rb = (size_t)c->srow * 2;
                take(&r, rows[i] * rb, &b);
                for (size_t t8 = 0; t8 < rows[i] && !why; t8++)
                    if (!rows_finite(b + t8 * rb + D, 1)) why = "non-finite int8 sink scale";
                if (rows[i]) memcpy(dst[i], b, rows[i] * rb);
            }
            for (int i = 0; i < 2 && !why && !c->sink8; i++) {
                take(&r, rows[i] * D * 2, &b);
                if (!rows_finite(b, rows[i] * D)) why = "non-finite fp16 sink";
                for (size_t e = 0; e < rows[i] * D; e++) dst[i][e] = kkv_ld16(b + 2 * e);
            }
            for (int p = k.drop; p < k.kp && !why; p++) {
                int nb = c->nb;
                if (c->bmode) { /* the page's n_boost: the slot's rows must add up */
                    uint16_t *pfx = kkv_slot_kpfx(c, t.ly[l].slots[p]);
                    if (take(&r, 4, &b)) {
                        why = "truncated contents";
                        break;
                    }
                    uint32_t v = ld_u32(b);
                    if (hh == 0) pfx[0] = 0;
                    uint32_t end = (uint32_t)pfx[hh] + v, all = (uint32_t)(c->H * c->nb);
                    if (v > (uint32_t)c->D || end > all || (hh + 1 == c->H && end != all)) {
                        why = "key pages of a layer boost the wrong number of channels";
                        break;
                    }
                    if (hh + 1 < c->H) pfx[hh + 1] = (uint16_t)end;
                    nb = (int)v;
                }
                size_t kb = !c->bmode ? c->kpage : kkv_key_page_bytes(c->D, G, nb);
                if (take(&r, kb, &b)) {
                    why = "truncated contents";
                    break;
                }
                why = bad_key_page(c, b, nb);
                memcpy(kkv_kpage_ptr(c, &t, p, l, hh), b, kb);
            }
            for (int p = k.drop; p < k.vp && !why; p++) {
                take(&r, c->vpage, &b);
                if (c->fp16 ? !rows_finite(b, (size_t)G * D) : !rows_finite(b + vl.scale, 2 * (size_t)G))
                    why = "non-finite value page";
                memcpy(kkv_vpage_ptr(c, &t, p, l, hh), b, c->vpage);
            }
            int part = k.vq % G;
            if (part && !why) {
                uint8_t *pg = kkv_vpage_ptr(c, &t, k.vp, l, hh);
                take(&r, (size_t)part * vrow, &b);
                memcpy(pg, b, (size_t)part * vrow);
                if (c->fp16) {
                    if (!rows_finite(b, (size_t)part * D)) why = "non-finite value row";
                } else {
                    take(&r, (size_t)part * 2, &b);
                    memcpy(pg + vl.scale, b, (size_t)part * 2);
                    if (!rows_finite(b, (size_t)part)) why = "non-finite value scale";
                    take(&r, (size_t)part * 2, &b);
                    memcpy(pg + vl.mn, b, (size_t)part * 2);
                    if (!rows_finite(b, (size_t)part)) why = "non-finite value min";
                }
            }
            size_t tr[2] = {(size_t)k.ktail, (size_t)k.vtail};
            uint16_t *td[2] = {kkv_ktail(c, &t, l, hh), kkv_vtail(c, &t, l, hh)};
            for (int i = 0; i < 2 && !why; i++) {
                take(&r, tr[i] * D * 2, &b);
                if (!rows_finite(b, tr[i] * D)) why = "non-finite fp16 tail";
                for (size_t e = 0; e < tr[i] * D; e++) td[i][e] = kkv_ld16(b + 2 * e);
            }
        }
    }
    if (st == KKV_OK && why) st = fmt(why);
    if (st != KKV_OK) {
        for (int l = 0; l < c->L; l++) {
            for (int p = 0; p < t.ly[l].n_slots; p++)
                if (t.ly[l].slots[p] >= 0) kkv_pool_untake(c, t.ly[l].slots[p]);
            free(t.ly[l].slots);
            free(t.ly[l].stage);
            free(t.ly[l].sk); /* never accounted */
        }
        free(t.ly);
        return st;
    }
    if (tokens)
        for (uint32_t i = 0; i < nt; i++) tokens[i] = (int32_t)ld_u32(tok + 4 * i);
    t.live = 1;
    t.stage_bytes = stage;
    t.credit = stage;
    c->used += need;
    c->seqs[id] = t;
    *seq = id;
    return KKV_OK;
}

kkv_status kkv_seq_load_file(kkv_cache *c, int *seq, const char *path,
                             uint64_t model_fingerprint, int32_t *tokens, int tokens_cap,
                             int *n_tokens) {
    if (!path) return kkv_fail(KKV_ERR_INVALID_ARG, "seq_load: NULL path");
    FILE *f = fopen(path, "rb");
    if (!f) return kkv_fail(KKV_ERR_IO, "seq_load: cannot open %s: %s", path, strerror(errno));
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    kkv_status st = KKV_OK;
    for (;;) {
        if (n == cap) {
            size_t nc = cap ? cap * 2 : 1 << 16;
            uint8_t *nb = realloc(buf, nc);
            if (!nb) {
                st = kkv_fail(KKV_ERR_NOMEM, "seq_load: out of memory reading %s", path);
                break;
            }
            buf = nb;
            cap = nc;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) st = kkv_fail(KKV_ERR_IO, "seq_load: cannot read %s", path);
            break;
        }
    }
    fclose(f);
    if (st == KKV_OK)
        st = kkv_seq_load(c, seq, buf, n, model_fingerprint, tokens, tokens_cap, n_tokens);
    free(buf);
    return st;
}
