/* The Llama-family forward pass over a kittykv cache (llama, qwen2, qwen3,
 * and gemma3's variant: scaled embedding, post-norms, GeGLU, windowed layers
 * with their own RoPE base; the cache applies each layer's window).
 *
 * Tokens go through the model in chunks of at most KKV_MODEL_CHUNK. Within a
 * chunk every matmul is batched over its tokens, but attention runs token by
 * token in order: append its K/V, attend with its query, flush. That is
 * exactly what single-token calls do, and every other op is per row with a
 * result independent of the batch (kkv_matmul_ex's contract), so a prefill gives
 * bit-identical logits and cache contents however it is split (spec 6.5).
 *
 * The model's working buffers live in the model, so a model runs one forward
 * pass at a time (not reentrant; use one model per thread). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "model/model.h"
#include "model/ops.h"

/* Which sequence each row of a chunk belongs to, and where the chunk sits. */
typedef struct chunk {
    const int     *seqs;   /* [n] sequence of each row */
    const int32_t *tokens; /* [n] */
    int            n;      /* 1..KKV_MODEL_CHUNK */
    float         *logits; /* [n_out][n_vocab] or NULL */
    int            first_out; /* rows first_out..n-1 produce logits */
    int            distinct;  /* every row a different sequence (a decode batch) */
} chunk;

static kkv_status check_cache(const kkv_model *m, const kkv_cache *c) {
    if (!m->layers)
        return kkv_fail(KKV_ERR_INVALID_ARG, "forward: the model was loaded vocabulary-only");
    const kkv_cache_config *cfg = kkv_cache_get_config(c);
    if (cfg->n_layers != m->info.n_layers || cfg->n_kv_heads != m->info.n_kv_heads ||
        cfg->head_dim != m->info.head_dim)
        return kkv_fail(KKV_ERR_INVALID_ARG,
                        "forward: cache shape (%d layers, %d KV heads, head_dim %d) does "
                        "not match the model (%d, %d, %d)",
                        cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, m->info.n_layers,
                        m->info.n_kv_heads, m->info.head_dim);
    /* a windowed layer must see exactly its window: a cache made without the
     * model's windows would attend too far back */
    for (int l = 0; l < m->info.n_layers; l++) {
        int want = m->layers[l].window;
        int got = cfg->layer_window ? cfg->layer_window[l] : 0;
        if (want != got)
            return kkv_fail(KKV_ERR_INVALID_ARG, "forward: cache layer %d has window %d, the "
                            "model %d (make the config with kkv_model_cache_config)", l, got, want);
    }
    return KKV_OK;
}

static kkv_status check_tokens(const kkv_model *m, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= m->info.n_vocab)
            return kkv_fail(KKV_ERR_INVALID_ARG, "forward: token %d at index %d is outside "
                            "the vocabulary (0..%d)", (int)tokens[i], i, m->info.n_vocab - 1);
    return KKV_OK;
}

/* The sequence's length, which every layer must agree on (they differ only
 * after a forward pass failed midway on non-finite activations). */
static kkv_status seq_position(const kkv_model *m, const kkv_cache *c, int seq, int *len) {
    int n0 = kkv_seq_len(c, seq, 0);
    if (n0 < 0) return kkv_fail(KKV_ERR_NOT_FOUND, "forward: no sequence %d", seq);
    for (int l = 1; l < m->info.n_layers; l++)
        if (kkv_seq_len(c, seq, l) != n0)
            return kkv_fail(KKV_ERR_INVALID_ARG, "forward: sequence %d has layers of unequal "
                            "length (an earlier forward pass failed midway); free it", seq);
    *len = n0;
    return KKV_OK;
}

/* kkv_model_profile's clock, in seconds. */
static double prof_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* While profiling: the time since the last mark goes to `part`. */
static inline void prof_mark(kkv_model *m, kkv_model_part part) {
    if (!m->prof_on) return;
    double t = prof_now();
    m->prof_s[part] += t - m->prof_t;
    m->prof_t = t;
}

/* out: [n][w->rows] = x @ w^T with the model's matmul arithmetic. The only
 * failure is running out of scratch memory. */
static kkv_status mm(const kkv_model *m, float *out, const kkv_weight *w, const float *x, int n) {
    return kkv_matmul_ex(m->tp, out, w, x, n, m->matmul_impl);
}

/* Row i of a [rows][cols] buffer. */
static inline float *row(float *base, int i, int cols) {
    return base + (size_t)i * (size_t)cols;
}

/* x[i] += b[i]; x, b: [n]. */
static void add_bias(float *x, const float *b, int n) {
    for (int i = 0; i < n; i++) x[i] += b[i];
}

/* The gated activation (SwiGLU, or Gemma's GeGLU) of n * F values in place,
 * in pool tasks of at most ACT_CHUNK values, and at least one task per thread
 * (chunk sizes rounded up to ACT_ALIGN values, 64 bytes). Element by element,
 * so the same bits however it is split. Why a pool job: one expf or tanhf per
 * value made it ~2 ms of a decode step of 10 sequences on the calling thread
 * alone (~3% of the CPU time, while the other thread waited). Why split a
 * single token's F values too: on the caller alone they were ~3.7 us per
 * layer of SmolLM2 (1536 expf) with the other thread idle; split, decode at
 * depth 0 on two threads ran 3% faster for SmolLM2 and 9% for Gemma 3
 * (tanhf), alternating rounds against the old split. (Those were libm's
 * expf and tanhf; with the 8-lane kernels of kkv_op_act, one token's values
 * all on the caller measured within noise of the split, -1.2% in 10 rounds.) */
#define ACT_CHUNK 4096
#define ACT_ALIGN 16

typedef struct act_job {
    float       *g;     /* [total] gate, overwritten with the activation */
    const float *u;     /* [total] up */
    size_t       total;
    size_t       chunk; /* values per task */
    kkv_act_fn   fn;    /* kkv_op_act's pick: the same bits on every CPU */
} act_job;

static void act_task(void *ctx, int task) {
    const act_job *a = ctx;
    size_t i0 = (size_t)task * a->chunk;
    int n = (int)(a->total - i0 < a->chunk ? a->total - i0 : a->chunk);
    a->fn(a->g + i0, a->u + i0, n);
}

static void activate(const kkv_model *m, float *g, const float *u, size_t total) {
    size_t threads = (size_t)kkv_tp_size(m->tp);
    size_t per = (total + threads - 1) / threads; /* one task per thread at least */
    per = (per + ACT_ALIGN - 1) / ACT_ALIGN * ACT_ALIGN;
    if (per > ACT_CHUNK) per = ACT_CHUNK;
    if (per == 0) return; /* total == 0 */
    act_job a = {g, u, total, per, kkv_op_act(m->gemma)};
    size_t tasks = (total + per - 1) / per;
    if (tasks <= 1) {
        act_task(&a, 0);
        return;
    }
    kkv_tp_run(m->tp, (int)tasks, act_task, &a);
}

/* Runs one chunk through every layer. m->w.pos must hold each row's position.
 * On a failing kkv_append/attend/flush (non-finite activations) the cache
 * holds the layers done so far and the status is returned. */
static kkv_status run_chunk(kkv_model *m, kkv_cache *c, const chunk *ch) {
    const kkv_model_info *in = &m->info;
    const kkv_model_work *w = &m->w;
    const int n = ch->n, E = in->n_embd, F = in->n_ff;
    const int QD = in->n_heads * in->head_dim, KD = in->n_kv_heads * in->head_dim;
    const int RP = m->rope_pairs;

    /* gemma3 scales the embedding by sqrt(n_embd) (in fp32, as llama.cpp) */
    const float emb_scale = m->gemma ? sqrtf((float)E) : 1.0f;
    for (int i = 0; i < n; i++) {
        float *x = row(w->x, i, E);
        kkv_wt_dequant_row(x, &m->tok_embd, ch->tokens[i]);
        if (m->gemma)
            for (int j = 0; j < E; j++) x[j] *= emb_scale;
        if (RP > 0)
            kkv_op_rope_table(row(w->cs, i, RP), row(w->sn, i, RP), m->inv_freq, RP,
                              w->pos[i]);
        if (RP > 0 && w->cs_swa)
            kkv_op_rope_table(row(w->cs_swa, i, RP), row(w->sn_swa, i, RP), m->inv_freq_swa,
                              RP, w->pos[i]);
    }
    prof_mark(m, KKV_PART_OTHER);
    for (int l = 0; l < in->n_layers; l++) {
        const kkv_layer *L = &m->layers[l];
        for (int i = 0; i < n; i++)
            kkv_op_rmsnorm(row(w->xn, i, E), row(w->x, i, E), L->attn_norm, E, in->rms_eps);
        {
            float *const o3[3] = {w->q, w->k, w->v};
            const kkv_weight *const w3[3] = {&L->wq, &L->wk, &L->wv};
            KKV_TRY(kkv_matmul_multi(m->tp, 3, o3, w3, w->xn, n, m->matmul_impl));
        }
        for (int i = 0; i < n; i++) {
            float *q = row(w->q, i, QD), *k = row(w->k, i, KD), *v = row(w->v, i, KD);
            if (L->bq) add_bias(q, L->bq, QD);
            if (L->bk) add_bias(k, L->bk, KD);
            if (L->bv) add_bias(v, L->bv, KD);
            if (L->q_norm) { /* qwen3: RMSNorm of every head, before RoPE */
                for (int h = 0; h < in->n_heads; h++)
                    kkv_op_rmsnorm(q + (size_t)h * (size_t)in->head_dim, q + (size_t)h * (size_t)in->head_dim,
                                   L->q_norm, in->head_dim, in->rms_eps);
                for (int h = 0; h < in->n_kv_heads; h++)
                    kkv_op_rmsnorm(k + (size_t)h * (size_t)in->head_dim, k + (size_t)h * (size_t)in->head_dim,
                                   L->k_norm, in->head_dim, in->rms_eps);
            }
            int local = L->window && w->cs_swa; /* windowed layer: its own RoPE base */
            float *cs = row(local ? w->cs_swa : w->cs, i, RP);
            float *sn = row(local ? w->sn_swa : w->sn, i, RP);
            if (in->rope_neox) {
                kkv_op_rope_neox(q, in->n_heads, in->head_dim, cs, sn, RP);
                kkv_op_rope_neox(k, in->n_kv_heads, in->head_dim, cs, sn, RP);
            } else {
                kkv_op_rope(q, in->n_heads, in->head_dim, cs, sn, RP);
                kkv_op_rope(k, in->n_kv_heads, in->head_dim, cs, sn, RP);
            }
            if (m->q_scale != 1.0f)
                for (int j = 0; j < QD; j++) q[j] *= m->q_scale;
        }
        prof_mark(m, KKV_PART_QKV);
        /* Token by token, so each token sees the cache exactly as a
         * single-token call would have left it. Rows of different sequences
         * do not see each other, so a decode batch appends them all, attends
         * in one pass (one pool job, not one per sequence) and flushes: each
         * sequence gets the same calls in the same order. */
        for (int i = 0; i < n; i++) {
            int seq = ch->seqs[i];
            if (m->hook)
                m->hook(m->hook_user, seq, l, w->pos[i], row(w->q, i, QD), row(w->k, i, KD),
                        row(w->v, i, KD));
            KKV_TRY(kkv_append(c, seq, l, row(w->k, i, KD), row(w->v, i, KD)));
            if (ch->distinct) continue;
            KKV_TRY(kkv_attend(c, row(w->att, i, QD), seq, l, row(w->q, i, QD), in->n_heads));
            KKV_TRY(kkv_flush(c, seq, l));
        }
        if (ch->distinct) {
            KKV_TRY(kkv_attend_batch(c, w->att, ch->seqs, n, l, w->q, in->n_heads));
            for (int i = 0; i < n; i++) KKV_TRY(kkv_flush(c, ch->seqs[i], l));
        }
        prof_mark(m, KKV_PART_ATTENTION);
        KKV_TRY(mm(m, w->proj, &L->wo, w->att, n));
        if (L->post_attn_norm) /* gemma3: the block output is normed before the add */
            for (int i = 0; i < n; i++)
                kkv_op_rmsnorm(row(w->proj, i, E), row(w->proj, i, E), L->post_attn_norm, E,
                               in->rms_eps);
        for (size_t j = 0; j < (size_t)n * E; j++) w->x[j] += w->proj[j];
        prof_mark(m, KKV_PART_OUT_PROJ);

        for (int i = 0; i < n; i++)
            kkv_op_rmsnorm(row(w->xn, i, E), row(w->x, i, E), L->ffn_norm, E, in->rms_eps);
        {
            float *const o2[2] = {w->gate, w->up};
            const kkv_weight *const w2[2] = {&L->w_gate, &L->w_up};
            KKV_TRY(kkv_matmul_multi(m->tp, 2, o2, w2, w->xn, n, m->matmul_impl));
        }
        activate(m, w->gate, w->up, (size_t)n * (size_t)F);
        KKV_TRY(mm(m, w->proj, &L->w_down, w->gate, n));
        if (L->post_ffn_norm)
            for (int i = 0; i < n; i++)
                kkv_op_rmsnorm(row(w->proj, i, E), row(w->proj, i, E), L->post_ffn_norm, E,
                               in->rms_eps);
        for (size_t j = 0; j < (size_t)n * E; j++) w->x[j] += w->proj[j];
        prof_mark(m, KKV_PART_FFN);
    }
    if (ch->logits && ch->first_out < n) {
        int n_out = n - ch->first_out;
        for (int i = ch->first_out; i < n; i++)
            kkv_op_rmsnorm(row(w->xn, i, E), row(w->x, i, E), m->output_norm, E, in->rms_eps);
        KKV_TRY(mm(m, ch->logits, &m->output, row(w->xn, ch->first_out, E), n_out));
        prof_mark(m, KKV_PART_HEAD);
    }
    return KKV_OK;
}

/* After a pass that failed midway: a sequence whose layers no longer all hold
 * `len` tokens is marked failed, so it cannot be extended by mistake. One
 * that was not touched stays as it was. */
static void mark_if_touched(const kkv_model *m, kkv_cache *c, int seq, int len) {
    for (int l = 0; l < m->info.n_layers; l++)
        if (kkv_seq_len(c, seq, l) != len) {
            (void)kkv_seq_mark_failed(c, seq); /* the sequence exists: cannot fail */
            return;
        }
}

static kkv_status forward_pass(kkv_model *m, kkv_cache *c, float *logits, int seq,
                               const int32_t *tokens, int n, int all_logits) {
    if (!m || !c || !tokens)
        return kkv_fail(KKV_ERR_INVALID_ARG, "forward: NULL %s",
                        !m ? "model" : !c ? "cache" : "tokens");
    if (n < 1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "forward: %d tokens (at least 1 is needed)", n);
    KKV_TRY(check_cache(m, c));
    KKV_TRY(check_tokens(m, tokens, n));
    int len = 0;
    KKV_TRY(seq_position(m, c, seq, &len));
    /* Everything the n tokens need, now: a full pool fails here, untouched. */
    KKV_TRY(kkv_seq_reserve(c, seq, n));

    int seqs[KKV_MODEL_CHUNK]; /* [C] all the same sequence */
    for (int i = 0; i < KKV_MODEL_CHUNK; i++) seqs[i] = seq;
    const size_t V = (size_t)m->info.n_vocab;
    for (int done = 0; done < n;) {
        int cn = n - done < KKV_MODEL_CHUNK ? n - done : KKV_MODEL_CHUNK;
        int last = done + cn == n;
        chunk ch = {seqs, tokens + done, cn, NULL, cn, 0};
        if (logits && all_logits) {
            ch.logits = logits + (size_t)done * V;
            ch.first_out = 0;
        } else if (logits && last) {
            ch.logits = logits;
            ch.first_out = cn - 1;
        }
        for (int i = 0; i < cn; i++) m->w.pos[i] = (int64_t)len + done + i;
        kkv_status s = run_chunk(m, c, &ch);
        if (s != KKV_OK) {
            mark_if_touched(m, c, seq, len);
            return s;
        }
        done += cn;
    }
    return KKV_OK;
}

/* Pool policy of a decode batch: every sequence is reserved one token before
 * anything runs. kkv_seq_reserve only allocates, so when sequence j cannot be
 * reserved the pages already reserved for sequences before j stay with them;
 * that is harmless -- they are the pages those sequences' next token needs
 * and go back to the pool with kkv_seq_free -- and no token is appended to
 * any sequence, so every length and all cached K/V are as they were. */
static kkv_status decode_batch_pass(kkv_model *m, kkv_cache *c, float *logits,
                                    const int *seqs, const int32_t *tokens, int n) {
    if (!m || !c || !seqs || !tokens)
        return kkv_fail(KKV_ERR_INVALID_ARG, "decode batch: NULL %s",
                        !m ? "model" : !c ? "cache" : !seqs ? "seqs" : "tokens");
    if (n < 1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "decode batch: %d sequences (at least 1 is "
                        "needed)", n);
    KKV_TRY(check_cache(m, c));
    KKV_TRY(check_tokens(m, tokens, n));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (seqs[i] == seqs[j])
                return kkv_fail(KKV_ERR_INVALID_ARG, "decode batch: sequence %d appears "
                                "twice (at %d and %d)", seqs[i], j, i);
    int *lens = calloc((size_t)n, sizeof *lens); /* [n] length of each before the step */
    if (!lens) return kkv_fail(KKV_ERR_NOMEM, "decode batch: out of memory");
    kkv_status s = KKV_OK;
    for (int i = 0; i < n && s == KKV_OK; i++) s = seq_position(m, c, seqs[i], &lens[i]);
    int started = 0; /* run_chunk reached: lengths may have changed */
    for (int i = 0; i < n && s == KKV_OK; i++) s = kkv_seq_reserve(c, seqs[i], 1);
    const size_t V = (size_t)m->info.n_vocab;
    for (int done = 0; done < n && s == KKV_OK;) {
        int cn = n - done < KKV_MODEL_CHUNK ? n - done : KKV_MODEL_CHUNK;
        chunk ch = {seqs + done, tokens + done, cn, logits ? logits + (size_t)done * V : NULL,
                    0, 1};
        for (int i = 0; i < cn; i++) m->w.pos[i] = lens[done + i];
        started = 1;
        s = run_chunk(m, c, &ch);
        done += cn;
    }
    if (s != KKV_OK && started)
        for (int i = 0; i < n; i++) mark_if_touched(m, c, seqs[i], lens[i]);
    free(lens);
    return s;
}

/* The entry points: the passes above, timed when profiling (the argument
 * checks, the reservation and whatever follows the last layer count as
 * "other"). */
static void prof_begin(kkv_model *m) {
    if (m && m->prof_on) m->prof_t = prof_now();
}

static kkv_status prof_end(kkv_model *m, kkv_status s) {
    if (m && m->prof_on) {
        prof_mark(m, KKV_PART_OTHER);
        m->prof_passes++;
    }
    return s;
}

kkv_status kkv_model_forward(kkv_model *m, kkv_cache *c, float *logits, int seq,
                             const int32_t *tokens, int n, int all_logits) {
    prof_begin(m);
    return prof_end(m, forward_pass(m, c, logits, seq, tokens, n, all_logits));
}

kkv_status kkv_model_decode_batch(kkv_model *m, kkv_cache *c, float *logits,
                                  const int *seqs, const int32_t *tokens, int n) {
    prof_begin(m);
    return prof_end(m, decode_batch_pass(m, c, logits, seqs, tokens, n));
}

kkv_status kkv_model_profile(kkv_model *m, int enable) {
    if (!m) return kkv_fail(KKV_ERR_INVALID_ARG, "profile: NULL model");
    if (enable != 0 && enable != 1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "profile: enable is %d (0 or 1)", enable);
    if (enable) {
        memset(m->prof_s, 0, sizeof m->prof_s);
        m->prof_passes = 0;
    }
    m->prof_on = enable;
    return KKV_OK;
}

kkv_status kkv_model_profile_get(const kkv_model *m, double *seconds, int n, int64_t *passes) {
    if (!m || !seconds)
        return kkv_fail(KKV_ERR_INVALID_ARG, "profile: NULL %s", !m ? "model" : "seconds");
    if (n < 0) return kkv_fail(KKV_ERR_INVALID_ARG, "profile: %d parts asked for", n);
    for (int i = 0; i < n; i++) seconds[i] = i < KKV_PART_COUNT ? m->prof_s[i] : 0.0;
    if (passes) *passes = m->prof_passes;
    return KKV_OK;
}

const char *kkv_model_part_name(int part) {
    static const char *const names[KKV_PART_COUNT] = {"qkv", "attention", "out_proj", "ffn", "head",
                                                      "other"};
    return part >= 0 && part < KKV_PART_COUNT ? names[part] : "?";
}
