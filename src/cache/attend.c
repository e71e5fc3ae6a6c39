/* Fused decode attention over the cache: one pass with online softmax over
 * [sink | pages | tail], per KV head serving all query heads of its group.
 *
 * Work is cut into units that depend only on the sequence's length (the sink,
 * PAGES_PER_UNIT pages at a time, the tail); each unit yields a partial
 * softmax state of its own, and partials merge in unit order. The result is
 * therefore bit-identical for any thread count. A task is one head's run of
 * consecutive units: the sink with the first page unit, the tail with the last
 * (task_units), so a short stream starts warm. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache.h"
#include "core/fp16.h"
#include "core/status.h"
#include "quant/quant.h"

#define PAGES_PER_UNIT 8

/* One run of at most G tokens whose keys and values each sit in one place. */
typedef struct block {
    int             n;
    const uint16_t *k16;   /* [n][D] fp16 keys, or NULL */
    const uint8_t  *k8;    /* [n][D + 2] int8 sink rows (sink_int8), or NULL */
    const uint8_t  *v8;    /* their values, the same */
    const uint8_t  *kpage; /* quantized key page (n == G), or NULL */
    int             knb;   /* its boosted channels (budget=head|err: per page) */
    const uint16_t *v16;   /* [n - nq][D] fp16 values, or NULL */
    const uint8_t  *vpage; /* quantized value page (n == G, nq == 0), or NULL */
    /* eager values: the block's first nq values are rows vrow0.. of value
     * page vsplit, the rest are v16 */
    const uint8_t  *vsplit;
    int             nq, vrow0;
    const void *pfk, *pfv; /* NULL, or what the next block reads first: prefetched */
    size_t      pfk_n, pfv_n; /* bytes of pfk, pfv to prefetch */
} block;

typedef struct unit {
    int kind;  /* 0 sink, 1 pages, 2 tail */
    int first; /* sink: first token; pages: first page */
    int count; /* tokens (sink/tail) or pages */
    int skip;  /* leading tokens of the unit's first block before a layer's window */
} unit;

/* One sequence of an attention pass: its units and where its partials go. */
typedef struct seqwork {
    const kkv_seq  *s;
    kkv_counts      cnt;
    const unit     *units;  /* [n_units] */
    int             n_units;
    const int      *tfirst; /* [n_tasks + 1] first unit of each of a head's tasks */
    int             n_tasks; /* tasks per head */
    int             task0;  /* its first task: tasks task0 .. task0 + H n_tasks - 1 */
    const float    *q;      /* [H][n_rep][D] */
    float          *acc;    /* [H][n_units][n_rep][D] partial outputs */
    float          *ml;     /* [H][n_units][n_rep][2] partial max and sum */
    float          *out;    /* [H][n_rep][D] the sequence's attention output */
    atomic_int     *left;   /* [H] tasks of each head not yet finished */
} seqwork;

/* One pass over one layer of n_seqs sequences: a single pool job whose tasks
 * are every (sequence, head, unit), so a decode batch's short sequences keep
 * both threads busy instead of each ending in its own half-idle tail. */
typedef struct job {
    kkv_cache      *c;
    int             layer, n_rep, n_seqs;
    int             parts;  /* threads of the pool: slices of each head's tasks */
    const seqwork  *w;      /* [n_seqs], task0 increasing */
    atomic_int      oom;    /* a task could not get its score scratch */
} job;

/* Score scratch of one task lives on its thread's stack when it is this small
 * (n_rep * G floats); larger shapes take it from the heap per task. */
#define STACK_SCORES 4096
/* A unit's partial state (n_rep * (D + 2) floats) stays on the stack up to this. */
#define STACK_PART 2048

/* acc [n_rep][D] += p [n_rep][n] x values of a block whose values are partly
 * quantized (eager values; at most one such block per layer and head): the
 * scalar reference arithmetic, row by row. */
static void pv_split(const kkv_cache *c, float *acc, const float *p, int n_rep, const block *b) {
    int D = c->D;
    float x[KKV_MAX_HEAD_DIM];
    for (int t = 0; t < b->n; t++) {
        if (t < b->nq) {
            if (c->fp16) {
                const uint16_t *r = (const uint16_t *)(const void *)b->vsplit + (size_t)(b->vrow0 + t) * D;
                for (int j = 0; j < D; j++) x[j] = kkv_f16_to_f32(r[j]);
            } else {
                kkv_value_row_decode_ref(x, b->vsplit, b->vrow0 + t, D, c->G, c->vbits);
            }
        } else {
            const uint16_t *r = b->v16 + (size_t)(t - b->nq) * D;
            for (int j = 0; j < D; j++) x[j] = kkv_f16_to_f32(r[j]);
        }
        for (int r = 0; r < n_rep; r++)
            for (int j = 0; j < D; j++) acc[(size_t)r * D + j] += p[(size_t)r * b->n + t] * x[j];
    }
}

/* Pulls the next quantized page pair into L2 while this one is computed:
 * pages of one (layer, head) lie a whole slot apart, beyond the hardware
 * prefetcher. prefetcht2 (locality 1), not t0: on Zen 4 with pages 495 KB
 * apart a page pair (kitty, D 64) took 1.74 us with t2, 2.12 us with t0,
 * 2.44 us with none, 1.50 us hot.
 * The pair's lines (~72 for kitty) go out in three equal bursts, before the
 * keys are scored, before the softmax and before the values are summed. A
 * prefetch that finds every miss buffer taken waits for one to free, so one
 * burst of all of them stalled the core for most of a memory latency per page
 * (two bursts of ~36 were already 7-9% faster than one). With three bursts of
 * <= 24 a pair in place took 550 ns where two took 1000 (hot: ~460; Zen 5,
 * test_kernels --bench-pages). Later points and more distance measured no
 * better. (fp16 pages are 16x larger and are prefetched row by row by the
 * kernels instead: see attend_block.) */
typedef struct pf_plan {
    const char *k, *v; /* next key / value page, or NULL */
    size_t      kl, nl; /* lines of the key page; of both */
    size_t      i, per; /* next line; lines per burst */
} pf_plan;

static pf_plan pf_make(const block *b) {
    pf_plan P = {b->pfk, b->pfv, 0, 0, 0, 0};
    P.kl = P.k ? (b->pfk_n + 63) / 64 : 0;
    P.nl = P.kl + (P.v ? (b->pfv_n + 63) / 64 : 0);
    P.per = (P.nl + 2) / 3;
    return P;
}

static void pf_burst(pf_plan *P) {
    size_t e = P->i + P->per < P->nl ? P->i + P->per : P->nl;
    for (; P->i < e; P->i++) {
        const char *a = P->i < P->kl ? P->k + 64 * P->i : P->v + 64 * (P->i - P->kl);
        __builtin_prefetch(a, 0, 1);
    }
}

/* Online-softmax update of one block into the partial state of n_rep query
 * heads: acc [n_rep][D], ml [n_rep][2] (running max, running sum).
 * sc: [n_rep][G] scratch. The first `skip` tokens (0 <= skip < n) lie before
 * the layer's window: their scores are left out of the softmax and their
 * probabilities are 0, so the kernels see whole blocks and stay unchanged. */
static void attend_block(const kkv_cache *c, float *acc, float *ml, float *sc, const float *q,
                         int n_rep, const block *b, int skip, const void *next_k) {
    const kkv_ops *ops = c->ops;
    int D = c->D, n = b->n, m = n - skip;
    pf_plan P = pf_make(b);
    pf_burst(&P);
    /* fp16 streams: the values are prefetched while the keys are scored, the
     * next page's keys (next_k, n rows) while the values are summed */
    if (b->k8) kkv_qk_rows8(sc, q, n_rep, b->k8, n, D);
    else if (b->kpage && c->kbits == 8) kkv_qk_page8(sc, q, n_rep, b->kpage, D, c->G);
    else if (b->kpage) ops->qk_page(sc, q, n_rep, b->kpage, D, c->G, b->knb);
    else ops->qk_f16(sc, q, n_rep, b->k16, n, D, b->vsplit || b->vpage ? NULL : b->v16);
    if (skip) { /* rows [n_rep][n] -> [n_rep][m] in place (destinations never pass sources) */
        for (int r = 0; r < n_rep; r++)
            memmove(sc + (size_t)r * m, sc + (size_t)r * n + skip, (size_t)m * sizeof *sc);
    }
    pf_burst(&P);
    ops->softmax(sc, ml, acc, n_rep, m, D, 1.0f / sqrtf((float)D));
    if (skip) { /* back to [n_rep][n], masked tokens at probability 0 */
        for (int r = n_rep - 1; r >= 0; r--) {
            memmove(sc + (size_t)r * n + skip, sc + (size_t)r * m, (size_t)m * sizeof *sc);
            memset(sc + (size_t)r * n, 0, (size_t)skip * sizeof *sc);
        }
    }
    pf_burst(&P);
    /* sc now holds the unnormalised probabilities, [n_rep][n] */
    if (b->v8) kkv_pv_rows8(acc, sc, n_rep, b->v8, n, D);
    else if (b->vsplit) pv_split(c, acc, sc, n_rep, b);
    else if (b->vpage && c->vbits == 8) kkv_pv_page8(acc, sc, n_rep, b->vpage, D, c->G);
    else if (b->vpage) ops->pv_page(acc, sc, n_rep, b->vpage, D, c->G, c->vbits);
    else ops->pv_f16(acc, sc, n_rep, b->v16, n, D, next_k);
}

/* fp16 values of token `tok` (after the sink) that are not yet in a page. */
static const uint16_t *vtail_row(const kkv_cache *c, const uint16_t *vt, const kkv_counts *n,
                                 int tok) {
    int i = tok - n->sink - n->vq;
    return vt + (size_t)i * c->D;
}

/* Values of the block of n tokens from token t0 after the sink, whose keys
 * are its key source: a whole value page, fp16 rows, or a split. */
static void block_values(const kkv_cache *c, block *b, const kkv_seq *s, int l, int h,
                         const kkv_counts *n, int t0) {
    b->vpage = b->vsplit = NULL;
    b->v16 = NULL;
    b->nq = b->vrow0 = 0;
    const uint16_t *vt = kkv_vtail(c, s, l, h);
    if (t0 >= n->vq) {
        b->v16 = vtail_row(c, vt, n, n->sink + t0);
    } else if (t0 + b->n <= n->vq && b->n == c->G) {
        const uint8_t *vp = kkv_vpage_ptr(c, s, t0 / c->G, l, h);
        if (c->fp16) b->v16 = (const uint16_t *)(const void *)vp;
        else b->vpage = vp;
    } else {
        b->vsplit = kkv_vpage_ptr(c, s, t0 / c->G, l, h);
        b->vrow0 = t0 % c->G;
        b->nq = n->vq - t0 < b->n ? n->vq - t0 : b->n;
        b->v16 = b->nq < b->n ? vt : NULL;
    }
}

/* The sequence whose tasks include `task`: the last with task0 <= task. */
static const seqwork *work_of(const job *J, int task) {
    int lo = 0, hi = J->n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (J->w[mid].task0 <= task) lo = mid;
        else hi = mid - 1;
    }
    return &J->w[lo];
}

/* Lines of a stream that the block before it prefetches: the first ~48
 * (three bursts of 16); the hardware prefetcher takes over from there. */
#define STREAM_AHEAD (48 * 64)

/* Points b's prefetch at the first block of unit V of head h (the next unit
 * of the same task): its first key page and value page, or the first rows of
 * a sink or the key tail (fp16, cold streams of their own: ~29% of kitty's
 * attention samples in a batch-10 decode at 2K, for ~8% of their hot time). */
static void prefetch_unit(const kkv_cache *c, block *b, const seqwork *W, int layer, int h,
                          const unit *V) {
    const kkv_seq *s = W->s;
    if (V->kind == 1 && !c->fp16) {
        b->pfk = kkv_kpage_ptr(c, s, V->first, layer, h), b->pfk_n = c->kpage;
        b->pfv = V->first < W->cnt.vp ? kkv_vpage_ptr(c, s, V->first, layer, h) : NULL;
        b->pfv_n = c->vpage;
    } else if (V->kind == 2) {
        size_t kb = (size_t)V->count * c->D * 2;
        b->pfk = kkv_ktail(c, s, layer, h), b->pfk_n = kb < STREAM_AHEAD ? kb : STREAM_AHEAD;
    }
}

/* Unit u of head h into its partial state. next: the unit this task runs
 * after it, or NULL. */
static void run_unit(const job *J, const seqwork *W, int h, int u, const unit *next, float *sc) {
    const kkv_cache *c = J->c;
    int D = c->D, G = c->G;
    const unit *U = &W->units[u];
    const kkv_counts *n = &W->cnt;
    const kkv_seq *s = W->s;
    const float *q = W->q + (size_t)h * J->n_rep * D;
    size_t tu = (size_t)h * W->n_units + u;
    float *acc_out = W->acc + tu * J->n_rep * D, *ml_out = W->ml + tu * J->n_rep * 2;
    /* The unit's state lives on this thread's stack while its blocks run and
     * is copied out once: in the shared arrays neighbouring units' states
     * share cache lines (ml is 24 bytes a unit for 3 heads), which the two
     * threads, running neighbouring units, wrote in turn at every page. */
    float part[STACK_PART]; /* [n_rep][D] acc, then [n_rep][2] ml */
    int local = (size_t)J->n_rep * (D + 2) <= STACK_PART;
    float *acc = local ? part : acc_out;
    float *ml = local ? part + (size_t)J->n_rep * D : ml_out;
    memset(acc, 0, (size_t)J->n_rep * D * sizeof *acc);
    for (int r = 0; r < J->n_rep; r++) {
        ml[2 * r] = -INFINITY;
        ml[2 * r + 1] = 0.0f;
    }
    block b;
    b.k8 = b.v8 = NULL; /* only sink rows are int8 */
    b.pfk = b.pfv = NULL;
    b.pfk_n = b.pfv_n = 0;
    if (U->kind == 0) { /* sink, in runs of at most G */
        for (int t = U->first; t < U->first + U->count; t += G) {
            b.n = U->first + U->count - t < G ? U->first + U->count - t : G;
            const uint16_t *sk = kkv_sink_k(c, s, J->layer, h) + (size_t)t * c->srow;
            const uint16_t *sv = kkv_sink_v(c, s, J->layer, h) + (size_t)t * c->srow;
            int i8 = c->sink8;
            b.k16 = i8 ? NULL : sk;
            b.v16 = i8 ? NULL : sv;
            b.k8 = i8 ? (const uint8_t *)(const void *)sk : NULL;
            b.v8 = i8 ? (const uint8_t *)(const void *)sv : NULL;
            b.kpage = b.vpage = b.vsplit = NULL;
            b.nq = 0;
            if (next && t + G >= U->first + U->count) prefetch_unit(c, &b, W, J->layer, h, next);
            attend_block(c, acc, ml, sc, q, J->n_rep, &b, 0, NULL); /* the unit starts in the window */
        }
    } else if (U->kind == 1) {
        for (int p = U->first; p < U->first + U->count; p++) {
            const uint8_t *kp = kkv_kpage_ptr(c, s, p, J->layer, h);
            const void *next_k = NULL; /* fp16: the next page's keys, streamed */
            if (c->fp16 && p + 1 < U->first + U->count) next_k = kkv_kpage_ptr(c, s, p + 1, J->layer, h);
            /* quantized: the next page, past the unit's end too: on one
             * thread the next unit is the next task, which otherwise starts
             * on a cold page (kitty at 16K, one thread: 6-8% faster; two
             * threads, where the other worker often has it: no change, and
             * two units ahead was slower there) */
            int pf = !c->fp16 && p + 1 < n->kp;
            b.pfk = pf ? kkv_kpage_ptr(c, s, p + 1, J->layer, h) : NULL;
            b.pfv = pf && p + 1 < n->vp ? kkv_vpage_ptr(c, s, p + 1, J->layer, h) : NULL;
            b.pfk_n = c->kpage, b.pfv_n = c->vpage;
            if (!pf && next && p + 1 == U->first + U->count) prefetch_unit(c, &b, W, J->layer, h, next);
            b.n = G;
            b.k16 = c->fp16 ? (const uint16_t *)(const void *)kp : NULL;
            b.kpage = c->fp16 ? NULL : kp;
            b.knb = c->fp16 ? 0 : kkv_kpage_nb(c, s, p, J->layer, h);
            block_values(c, &b, s, J->layer, h, n, p * G);
            attend_block(c, acc, ml, sc, q, J->n_rep, &b, p == U->first ? U->skip : 0, next_k);
        }
    } else { /* key Q-buffer; its values are in the value tail */
        b.n = U->count;
        b.k16 = kkv_ktail(c, s, J->layer, h);
        b.kpage = NULL;
        block_values(c, &b, s, J->layer, h, n, n->kp * G);
        attend_block(c, acc, ml, sc, q, J->n_rep, &b, U->skip, NULL);
    }
    if (local) {
        memcpy(acc_out, acc, (size_t)J->n_rep * D * sizeof *acc);
        memcpy(ml_out, ml, (size_t)J->n_rep * 2 * sizeof *ml);
    }
}

/* out [n_rep][D] of KV head h of one sequence (W->out): its partials merged
 * in unit order, so the result does not depend on which thread ran which
 * unit, nor on which thread merges. */
static void merge_head(const kkv_cache *c, const seqwork *W, int h, int n_rep) {
    int D = c->D, nu = W->n_units;
    for (int r = 0; r < n_rep; r++) {
        float *o = W->out + ((size_t)h * n_rep + r) * D;
        float m = -INFINITY, l = 0.0f;
        for (int j = 0; j < D; j++) o[j] = 0.0f;
        for (int u = 0; u < nu; u++) {
            size_t i = ((size_t)h * nu + u) * n_rep + r;
            const float *p = W->acc + i * D;
            float pm = W->ml[2 * i], pl = W->ml[2 * i + 1];
            float mx = pm > m ? pm : m;
            float a = expf(m - mx), b = expf(pm - mx);
            for (int j = 0; j < D; j++) o[j] = o[j] * a + p[j] * b;
            l = l * a + pl * b;
            m = mx;
        }
        float inv = 1.0f / l;
        for (int j = 0; j < D; j++) o[j] *= inv;
    }
}

/* Task k of a sequence as (head h, task g of that head). The pool deals
 * tasks to its threads in contiguous spans (threads.c), so the order is by
 * part, then head: part i holds the i-th of T slices of every head's tasks.
 * Each thread then walks its slice of each head in page order. */
static void task_head(const job *J, const seqwork *W, int k, int *h, int *g) {
    int nt = W->n_tasks, T = J->parts, H = J->c->H;
    for (int i = 0; i < T; i++) {
        int b0 = i * nt / T, b1 = (i + 1) * nt / T, len = b1 - b0;
        if (k < H * b1) {
            int r = k - H * b0;
            *h = r / len;
            *g = b0 + r % len;
            return;
        }
    }
    *h = 0, *g = 0; /* unreachable: k < H nt */
}

static void run_task(void *arg, int task) {
    job *J = arg;
    const seqwork *W = work_of(J, task);
    int k = task - W->task0;
    int h, g;
    task_head(J, W, k, &h, &g);
    float stack_sc[STACK_SCORES];
    size_t sc_n = (size_t)J->n_rep * J->c->G;
    float *sc = sc_n <= STACK_SCORES ? stack_sc : malloc(sc_n * sizeof *sc); /* [n_rep][G] */
    if (!sc) { /* reported by the caller */
        atomic_store(&J->oom, 1);
        return;
    }
    for (int u = W->tfirst[g]; u < W->tfirst[g + 1]; u++)
        run_unit(J, W, h, u, u + 1 < W->tfirst[g + 1] ? &W->units[u + 1] : NULL, sc);
    if (sc != stack_sc) free(sc);
    /* The thread that finishes a head's last task merges it, inside the job
     * (every head has a task: kkv_attend refuses an empty layer, and the
     * newest key is in the tail or a page, so units_of gives at least one):
     * merged after the job by the caller alone, the merges were ~3 us of
     * each ~115 us layer at 16K (kitty, 2 threads) with the other thread
     * idle. The countdown's read-modify-write orders the other tasks'
     * partials before the merge reads them. */
    if (atomic_fetch_sub(&W->left[h], 1) == 1 && !atomic_load(&J->oom)) merge_head(J->c, W, h, J->n_rep);
}

/* A head's tasks over the units (tfirst, room for nu + 1): a new task at every
 * page unit but the first; the sink runs with the first page unit and the
 * tail with the last, and the unit before each prefetches the next's first
 * lines (prefetch_unit). As tasks of their own, a sink or a tail started on a
 * cold stream and the first page unit on a cold page. In a batch-10 decode at
 * 2K the attention's samples fell 13% against the weight matmuls'; single long
 * sequences measured the same. Partials stay one per unit: the same bits.
 * Returns the task count. */
static int task_units(int *tfirst, const unit *units, int nu) {
    int nt = 0, pages = 0;
    for (int u = 0; u < nu; u++) {
        if (u == 0 || (units[u].kind == 1 && pages > 0)) tfirst[nt++] = u;
        pages += units[u].kind == 1;
    }
    tfirst[nt] = nu;
    return nt;
}

/* At least units_of's count: sink, page groups, tail (a window only drops some). */
static int unit_bound(const kkv_counts *n) {
    return 2 + (n->kp + PAGES_PER_UNIT - 1) / PAGES_PER_UNIT;
}

/* The units of one sequence's layer into units (room for unit_bound(n));
 * returns their count. They depend only on its length and the layer's
 * window, so the result does not depend on the thread count. A windowed layer
 * starts at token n.first: sink tokens before it are left out, pages wholly
 * before it skipped (or released), and the block it falls in masks its
 * leading tokens. */
static int units_of(unit *units, const kkv_cache *c, const kkv_counts *n) {
    int nu = 0;
    int f = n->first, S = n->sink, G = c->G;
    if (f < S) units[nu++] = (unit){0, f, S - f, 0};
    int fp = f > S ? (f - S) / G : 0; /* first page with a token in the window */
    int pskip = f > S ? (f - S) % G : 0;
    if (fp > n->kp) fp = n->kp; /* f is in the key Q-buffer */
    for (int p = fp; p < n->kp; p += PAGES_PER_UNIT)
        units[nu++] = (unit){1, p, n->kp - p < PAGES_PER_UNIT ? n->kp - p : PAGES_PER_UNIT,
                             p == fp ? pskip : 0};
    int t0 = S + n->kp * G; /* first token of the key Q-buffer */
    if (n->ktail) units[nu++] = (unit){2, 0, n->ktail, f > t0 ? f - t0 : 0};
    return nu;
}

/* Grows a cache-held scratch to at least `bytes` (kept: decode calls attend
 * per layer per token). */
static kkv_status grow(void **buf, size_t *cap, size_t bytes) {
    if (bytes <= *cap) return KKV_OK;
    void *nb = realloc(*buf, bytes);
    if (!nb) return kkv_fail(KKV_ERR_NOMEM, "attend: out of memory");
    *buf = nb;
    *cap = bytes;
    return KKV_OK;
}

kkv_status kkv_attend_impl(kkv_cache *c, float *out, const kkv_seq *const *ss, int n_seqs,
                           int layer, const float *q, int n_q) {
    int D = c->D, n_rep = n_q / c->H;
    size_t row = (size_t)n_q * D; /* floats of one sequence's q and out */
    /* plan: [n_seqs] seqwork (counts first), then every sequence's units */
    KKV_TRY(grow(&c->attn_plan, &c->attn_plan_cap, (size_t)n_seqs * sizeof(seqwork)));
    size_t n_units = 0;
    for (int i = 0; i < n_seqs; i++) {
        seqwork *W = (seqwork *)c->attn_plan + i;
        W->s = ss[i];
        W->cnt = kkv_counts_of(c, ss[i], layer);
        n_units += (size_t)unit_bound(&W->cnt);
    }
    size_t plan_bytes = (size_t)n_seqs * sizeof(seqwork) + (size_t)n_seqs * c->H * sizeof(atomic_int) +
                        n_units * sizeof(unit) + (n_units + (size_t)n_seqs) * sizeof(int);
    KKV_TRY(grow(&c->attn_plan, &c->attn_plan_cap, plan_bytes)); /* realloc keeps the counts */
    seqwork *w = c->attn_plan; /* [n_seqs] */
    atomic_int *left = (atomic_int *)(void *)(w + n_seqs); /* [n_seqs][H] */
    unit *units = (unit *)(void *)(left + (size_t)n_seqs * c->H); /* [n_units] (unit holds ints only) */
    int *tfirst = (int *)(void *)(units + n_units); /* [n_units + n_seqs] */
    size_t parts = 0; /* partial states (one per head, unit and query head) */
    int tasks = 0;
    for (int i = 0; i < n_seqs; i++) {
        seqwork *W = &w[i];
        W->units = units;
        W->n_units = units_of(units, c, &W->cnt);
        W->tfirst = tfirst;
        W->n_tasks = task_units(tfirst, units, W->n_units);
        W->task0 = tasks;
        W->q = q + (size_t)i * row;
        W->out = out + (size_t)i * row;
        W->left = left + (size_t)i * c->H;
        for (int h = 0; h < c->H; h++) atomic_init(&W->left[h], W->n_tasks);
        units += W->n_units;
        tfirst += W->n_tasks + 1;
        tasks += c->H * W->n_tasks;
        parts += (size_t)c->H * W->n_units * n_rep;
    }
    KKV_TRY(grow(&c->attn_buf, &c->attn_bytes, parts * (size_t)(D + 2) * sizeof(float)));
    float *acc = c->attn_buf, *ml = acc + parts * D; /* [parts][D], [parts][2] */
    for (int i = 0; i < n_seqs; i++) {
        size_t pi = (size_t)c->H * w[i].n_units * n_rep;
        w[i].acc = acc;
        w[i].ml = ml;
        acc += pi * D;
        ml += pi * 2;
    }
    job J = {c, layer, n_rep, n_seqs, kkv_tp_size(c->tp), w, 0};
    kkv_tp_run(c->tp, tasks, run_task, &J);
    if (atomic_load(&J.oom)) return kkv_fail(KKV_ERR_NOMEM, "attend: out of memory for scores");
    return KKV_OK;
}
