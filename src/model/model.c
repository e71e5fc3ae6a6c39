/* Loading a GGUF Llama model: hyperparameters from metadata, every tensor
 * shape and type checked up front so the forward pass never has to, the
 * tokenizer, the matmul thread pool and the fixed working buffers. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "core/bigmem.h"
#include "core/status.h"
#include "model/ops.h"

/* Generous sanity bounds: they only stop absurd metadata from driving huge
 * allocations or int overflow in buffer sizes. */
#define MAX_LAYERS 4096
#define MAX_EMBD   (1 << 16)
#define MAX_FF     (1 << 20)
#define MAX_HEADS  1024
#define MAX_VOCAB  (1 << 24)

static void copy_str(char *dst, size_t cap, kkv_gguf_str s) {
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    memcpy(dst, s.ptr, n);
    dst[n] = 0;
}

/* An integer hyperparameter in [lo, hi]; dflt when absent and not required. */
static kkv_status get_int(const kkv_gguf *g, const char *key, int *out, int64_t lo,
                          int64_t hi, int required, int dflt) {
    int64_t v;
    kkv_status s = kkv_gguf_get_i64(g, key, &v);
    if (s == KKV_ERR_NOT_FOUND && !required) {
        *out = dflt;
        return KKV_OK;
    }
    if (s == KKV_ERR_NOT_FOUND)
        return kkv_fail(KKV_ERR_FORMAT, "model: missing metadata key '%s'", key);
    if (s != KKV_OK) return kkv_fail(KKV_ERR_FORMAT, "model: metadata '%s' is not an integer",
                                     key);
    if (v < lo || v > hi)
        return kkv_fail(KKV_ERR_FORMAT, "model: metadata '%s' = %lld out of range %lld..%lld",
                        key, (long long)v, (long long)lo, (long long)hi);
    *out = (int)v;
    return KKV_OK;
}

static kkv_status get_float(const kkv_gguf *g, const char *key, float *out, int required,
                            float dflt) {
    kkv_status s = kkv_gguf_get_f32(g, key, out);
    if (s == KKV_ERR_NOT_FOUND && !required) {
        *out = dflt;
        return KKV_OK;
    }
    if (s == KKV_ERR_NOT_FOUND)
        return kkv_fail(KKV_ERR_FORMAT, "model: missing metadata key '%s'", key);
    if (s != KKV_OK)
        return kkv_fail(KKV_ERR_FORMAT, "model: metadata '%s' is not a float", key);
    if (!isfinite(*out) || *out <= 0.0f)
        return kkv_fail(KKV_ERR_FORMAT, "model: metadata '%s' = %g must be positive", key,
                        (double)*out);
    return KKV_OK;
}

/* Finds a tensor and checks it is a [rows][cols] matrix of a type matmul
 * supports (rows = 1 and n_dims = 1 for vectors). */
static kkv_status get_tensor(const kkv_gguf *g, kkv_weight *w, const char *name,
                             int64_t rows, int64_t cols, int vector) {
    const kkv_gguf_tensor *t = kkv_gguf_find_tensor(g, name);
    if (!t) return kkv_fail(KKV_ERR_FORMAT, "model: missing tensor '%s'", name);
    int64_t got_rows = t->ne[1];
    int ok = t->ne[0] == cols && t->ne[2] == 1 && t->ne[3] == 1 &&
             (vector ? got_rows == 1 : got_rows == rows);
    if (!ok)
        return kkv_fail(KKV_ERR_FORMAT,
                        "model: tensor '%s' has shape [%lld, %lld, %lld, %lld], want "
                        "[%lld, %lld]",
                        name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        (long long)t->ne[3], (long long)cols, (long long)(vector ? 1 : rows));
    if (!kkv_wt_supported(t->type))
        return kkv_fail(KKV_ERR_UNSUPPORTED,
                        "model: tensor '%s' has type %s (%u), which this build cannot "
                        "compute with",
                        name, kkv_wt_name(t->type) ? kkv_wt_name(t->type) : "?", t->type);
    int be = kkv_wt_block_elems(t->type);
    size_t bb = kkv_wt_block_bytes(t->type);
    if (be <= 0 || bb == 0 || cols % be != 0)
        return kkv_fail(KKV_ERR_FORMAT, "model: tensor '%s' row length %lld is not a multiple "
                        "of the %s block (%d)", name, (long long)cols, kkv_wt_name(t->type), be);
    w->type = t->type;
    w->rows = vector ? 1 : rows;
    w->cols = cols;
    w->row_bytes = (size_t)(cols / be) * bb;
    w->data = t->data;
    w->packed = NULL;
    w->pack_rows = 0;
    if (t->nbytes < w->row_bytes * (uint64_t)w->rows)
        return kkv_fail(KKV_ERR_FORMAT, "model: tensor '%s' is truncated", name);
    return KKV_OK;
}

/* A norm vector widened to an owned fp32 array [n]. */
static kkv_status get_norm(const kkv_gguf *g, float **out, const char *name, int n) {
    kkv_weight w;
    KKV_TRY(get_tensor(g, &w, name, 1, n, 1));
    *out = malloc((size_t)n * sizeof(float));
    if (!*out) return kkv_fail(KKV_ERR_NOMEM, "model: out of memory");
    kkv_wt_dequant_row(*out, &w, 0);
    for (int i = 0; i < n; i++)
        if (!isfinite((*out)[i]))
            return kkv_fail(KKV_ERR_FORMAT, "model: tensor '%s' has non-finite values", name);
    return KKV_OK;
}

/* Architectures this engine runs, with the layout choices llama.cpp makes
 * for each (llama_model_rope_type): qwen2/qwen3/gemma3 rotate NeoX halves. */
typedef struct arch_def {
    const char *name;
    int         rope_neox;
    int         qk_norm; /* per-head Q/K RMSNorm tensors belong to the architecture */
    int         gemma;   /* gemma3 block (see kkv_model.gemma) and sliding-window layers */
} arch_def;

static const arch_def ARCHS[] = {
    {"llama", 0, 0, 0}, {"qwen2", 1, 0, 0}, {"qwen3", 1, 1, 0}, {"gemma3", 1, 1, 1}};

/* Gemma 3's fixed layer pattern (llama.cpp: set_swa_pattern(6)): in every
 * run of 6 layers the first 5 use the sliding window, the 6th is global
 * (layers 5, 11, 17 of an 18-layer model). */
#define GEMMA3_SWA_PERIOD 6
/* RoPE base of the windowed layers when the file does not say
 * (gemma3.rope.freq_base_swa; Gemma 3's rope_local_base_freq). */
#define GEMMA3_ROPE_BASE_SWA 10000.0f

/* "<arch>.<suffix>" in buf (the metadata keys are per architecture). */
static const char *akey(char *buf, size_t cap, const char *arch, const char *suffix) {
    snprintf(buf, cap, "%s.%s", arch, suffix);
    return buf;
}

static kkv_status read_rope_scaling(kkv_model *m, const char *arch) {
    const kkv_gguf *g = m->gguf;
    char k[96];
    kkv_gguf_str s;
    m->rope_scale = 1.0f;
    kkv_status st = kkv_gguf_get_str(g, akey(k, sizeof k, arch, "rope.scaling.type"), &s);
    if (st == KKV_ERR_NOT_FOUND) return KKV_OK;
    if (st != KKV_OK) return kkv_fail(KKV_ERR_FORMAT, "model: metadata '%s' is not a string", k);
    if (kkv_gguf_str_eq(s, "none")) return KKV_OK;
    if (!kkv_gguf_str_eq(s, "linear"))
        return kkv_fail(KKV_ERR_UNSUPPORTED, "model: rope scaling '%.*s' is not supported (none, "
                        "linear, or Llama 3's rope_freqs tensor)", (int)(s.len > 32 ? 32 : s.len), s.ptr);
    return get_float(g, akey(k, sizeof k, arch, "rope.scaling.factor"), &m->rope_scale, 1, 1.0f);
}

/* Gemma 3's sliding window and the attention scale. The window counts the
 * token itself: a query at position p sees keys at p - W + 1 .. p (llama.cpp's
 * standard SWA mask), which is what the cache's layer window means. */
static kkv_status read_gemma3(kkv_model *m, const char *a) {
    const kkv_gguf *g = m->gguf;
    kkv_model_info *in = &m->info;
    char k[96];
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "attention.sliding_window"), &in->sliding_window, 1,
                    INT32_MAX, 1, 0));
    if (kkv_gguf_find(g, akey(k, sizeof k, a, "attention.sliding_window_pattern")) >= 0)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "model: '%s' (an explicit layer pattern) is not "
                        "supported; gemma3 uses every %dth layer global", k, GEMMA3_SWA_PERIOD);
    KKV_TRY(get_float(g, akey(k, sizeof k, a, "rope.freq_base_swa"), &in->rope_theta_swa, 0,
                      GEMMA3_ROPE_BASE_SWA));
    /* query_pre_attn_scalar: head_dim, except Gemma 3 27B (62 layers) where
     * it is n_embd / n_heads (llama.cpp reads it the same way) */
    if (in->n_layers == 62)
        m->q_scale = sqrtf((float)in->head_dim) / sqrtf((float)(in->n_embd / in->n_heads));
    return KKV_OK;
}

static kkv_status read_hparams(kkv_model *m) {
    const kkv_gguf *g = m->gguf;
    kkv_model_info *in = &m->info;
    kkv_gguf_str s;
    kkv_status st = kkv_gguf_get_str(g, "general.architecture", &s);
    if (st != KKV_OK)
        return kkv_fail(KKV_ERR_FORMAT, "model: missing or bad 'general.architecture'");
    copy_str(in->arch, sizeof in->arch, s);
    const arch_def *ad = NULL;
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (kkv_gguf_str_eq(s, ARCHS[i].name)) ad = &ARCHS[i];
    if (!ad) {
        char shown[80];
        return kkv_fail(KKV_ERR_UNSUPPORTED, "unsupported architecture '%s' (supported: llama, "
                        "qwen2, qwen3, gemma3)", kkv_printable(shown, sizeof shown, s.ptr, s.len));
    }
    const char *a = ad->name;
    in->rope_neox = ad->rope_neox;
    m->gemma = ad->gemma;
    m->qk_norm = ad->qk_norm;
    if (kkv_gguf_get_str(g, "general.name", &s) == KKV_OK) copy_str(in->name, sizeof in->name, s);

    char k[96];
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "block_count"), &in->n_layers, 1, MAX_LAYERS, 1, 0));
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "embedding_length"), &in->n_embd, 1, MAX_EMBD, 1, 0));
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "feed_forward_length"), &in->n_ff, 1, MAX_FF, 1, 0));
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "attention.head_count"), &in->n_heads, 1, MAX_HEADS, 1, 0));
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "attention.head_count_kv"), &in->n_kv_heads, 1, MAX_HEADS,
                    0, in->n_heads));
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "context_length"), &in->n_ctx_train, 0, INT32_MAX, 0, 0));
    KKV_TRY(get_float(g, akey(k, sizeof k, a, "rope.freq_base"), &in->rope_theta, 0, 10000.0f));
    KKV_TRY(get_float(g, akey(k, sizeof k, a, "attention.layer_norm_rms_epsilon"), &in->rms_eps, 1, 0));
    if (in->n_heads % in->n_kv_heads != 0)
        return kkv_fail(KKV_ERR_FORMAT, "model: %d query heads are not a multiple of %d KV "
                        "heads", in->n_heads, in->n_kv_heads);
    int hd = in->n_embd / in->n_heads;
    if (in->n_embd % in->n_heads != 0) hd = 0; /* then key_length must say */
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "attention.key_length"), &in->head_dim, 1, 1 << 16, 0, hd));
    int vlen;
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "attention.value_length"), &vlen, 1, 1 << 16, 0,
                    in->head_dim));
    if (in->head_dim == 0)
        return kkv_fail(KKV_ERR_FORMAT, "model: embedding %d is not divisible by %d heads",
                        in->n_embd, in->n_heads);
    if (vlen != in->head_dim)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "model: value length %d differs from key length "
                        "%d", vlen, in->head_dim);
    if (in->head_dim % 4 != 0 || in->head_dim > KKV_MAX_HEAD_DIM)
        return kkv_fail(KKV_ERR_UNSUPPORTED, "model: head dimension %d (the cache needs a "
                        "multiple of 4 up to %d)", in->head_dim, KKV_MAX_HEAD_DIM);
    int rope_dims;
    KKV_TRY(get_int(g, akey(k, sizeof k, a, "rope.dimension_count"), &rope_dims, 0, in->head_dim, 0,
                    in->head_dim));
    if (rope_dims % 2 != 0)
        return kkv_fail(KKV_ERR_FORMAT, "model: odd rope dimension count %d", rope_dims);
    m->rope_pairs = rope_dims / 2;
    in->rope_dims = rope_dims;
    in->rope_theta_swa = in->rope_theta;
    m->q_scale = 1.0f;
    if (m->gemma) KKV_TRY(read_gemma3(m, a));
    return read_rope_scaling(m, a);
}

/* An optional vector tensor of n values widened to fp32 (*out stays NULL
 * when absent). */
static kkv_status get_opt_vec(const kkv_gguf *g, float **out, const char *name, int n) {
    *out = NULL;
    if (!kkv_gguf_find_tensor(g, name)) return KKV_OK;
    return get_norm(g, out, name, n);
}

static kkv_status load_tensors(kkv_model *m) {
    const kkv_gguf *g = m->gguf;
    kkv_model_info *in = &m->info;
    const kkv_gguf_tensor *te = kkv_gguf_find_tensor(g, "token_embd.weight");
    if (!te) return kkv_fail(KKV_ERR_FORMAT, "model: missing tensor 'token_embd.weight'");
    if (te->ne[1] < 1 || te->ne[1] > MAX_VOCAB)
        return kkv_fail(KKV_ERR_FORMAT, "model: vocabulary size %lld out of range",
                        (long long)te->ne[1]);
    in->n_vocab = (int)te->ne[1];
    int64_t vs;
    if (kkv_gguf_get_i64(g, "llama.vocab_size", &vs) == KKV_OK && vs != in->n_vocab)
        return kkv_fail(KKV_ERR_FORMAT, "model: llama.vocab_size %lld but token_embd has %d "
                        "rows", (long long)vs, in->n_vocab);
    KKV_TRY(get_tensor(g, &m->tok_embd, "token_embd.weight", in->n_vocab, in->n_embd, 0));
    if (kkv_gguf_find_tensor(g, "output.weight"))
        KKV_TRY(get_tensor(g, &m->output, "output.weight", in->n_vocab, in->n_embd, 0));
    else
        m->output = m->tok_embd; /* tied embeddings */
    KKV_TRY(get_norm(g, &m->output_norm, "output_norm.weight", in->n_embd));

    m->layers = calloc((size_t)in->n_layers, sizeof *m->layers);
    if (!m->layers) return kkv_fail(KKV_ERR_NOMEM, "model: out of memory");
    int64_t qd = (int64_t)in->n_heads * in->head_dim;
    int64_t kvd = (int64_t)in->n_kv_heads * in->head_dim;
    for (int l = 0; l < in->n_layers; l++) {
        kkv_layer *L = &m->layers[l];
        char name[64];
#define T(field, suffix, rows, cols)                                                   \
        snprintf(name, sizeof name, "blk.%d." suffix ".weight", l);                     \
        KKV_TRY(get_tensor(g, &L->field, name, rows, cols, 0))
        T(wq, "attn_q", qd, in->n_embd);
        T(wk, "attn_k", kvd, in->n_embd);
        T(wv, "attn_v", kvd, in->n_embd);
        T(wo, "attn_output", in->n_embd, qd);
        T(w_gate, "ffn_gate", in->n_ff, in->n_embd);
        T(w_up, "ffn_up", in->n_ff, in->n_embd);
        T(w_down, "ffn_down", in->n_embd, in->n_ff);
#undef T
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        KKV_TRY(get_norm(g, &L->attn_norm, name, in->n_embd));
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", l);
        KKV_TRY(get_norm(g, &L->ffn_norm, name, in->n_embd));
        /* Optional parts, used whatever the architecture when present:
         * QKV biases (qwen2) and per-head Q/K norms (qwen3). */
        snprintf(name, sizeof name, "blk.%d.attn_q.bias", l);
        KKV_TRY(get_opt_vec(g, &L->bq, name, (int)qd));
        snprintf(name, sizeof name, "blk.%d.attn_k.bias", l);
        KKV_TRY(get_opt_vec(g, &L->bk, name, (int)kvd));
        snprintf(name, sizeof name, "blk.%d.attn_v.bias", l);
        KKV_TRY(get_opt_vec(g, &L->bv, name, (int)kvd));
        snprintf(name, sizeof name, "blk.%d.attn_q_norm.weight", l);
        KKV_TRY(get_opt_vec(g, &L->q_norm, name, in->head_dim));
        snprintf(name, sizeof name, "blk.%d.attn_k_norm.weight", l);
        KKV_TRY(get_opt_vec(g, &L->k_norm, name, in->head_dim));
        if (!L->q_norm != !L->k_norm)
            return kkv_fail(KKV_ERR_FORMAT, "model: layer %d has only one of attn_q_norm / attn_k_norm", l);
        if (!m->qk_norm && L->q_norm)
            return kkv_fail(KKV_ERR_UNSUPPORTED, "model: attn_q_norm in a '%s' model (only qwen3 "
                            "and gemma3 have per-head QK norms)", in->arch);
        /* the architecture's own: without them the layer would run, wrongly
         * (llama.cpp requires them too) */
        if (m->qk_norm && !L->q_norm)
            return kkv_fail(KKV_ERR_FORMAT, "model: missing tensor 'blk.%d.attn_q_norm.weight'", l);
        if (m->gemma) {
            snprintf(name, sizeof name, "blk.%d.post_attention_norm.weight", l);
            KKV_TRY(get_norm(g, &L->post_attn_norm, name, in->n_embd));
            snprintf(name, sizeof name, "blk.%d.post_ffw_norm.weight", l);
            KKV_TRY(get_norm(g, &L->post_ffn_norm, name, in->n_embd));
            if (l % GEMMA3_SWA_PERIOD < GEMMA3_SWA_PERIOD - 1) L->window = in->sliding_window;
        }
    }
    if (m->gemma) {
        m->layer_window = malloc((size_t)in->n_layers * sizeof *m->layer_window);
        if (!m->layer_window) return kkv_fail(KKV_ERR_NOMEM, "model: out of memory");
        for (int l = 0; l < in->n_layers; l++) m->layer_window[l] = m->layers[l].window;
    }
    if (m->rope_pairs > 0) KKV_TRY(get_opt_vec(g, &m->rope_ff, "rope_freqs.weight", m->rope_pairs));
    for (int i = 0; m->rope_ff && i < m->rope_pairs; i++)
        if (!(m->rope_ff[i] > 0.0f))
            return kkv_fail(KKV_ERR_FORMAT, "model: rope_freqs.weight[%d] = %g is not positive", i,
                            (double)m->rope_ff[i]);
    for (uint64_t i = 0; i < kkv_gguf_n_tensors(g); i++)
        in->weight_bytes += kkv_gguf_tensor_at(g, i)->nbytes;
    return KKV_OK;
}

/* One block for all working buffers of KKV_MODEL_CHUNK tokens. */
static kkv_status alloc_work(kkv_model *m) {
    const kkv_model_info *in = &m->info;
    size_t C = KKV_MODEL_CHUNK;
    size_t qd = (size_t)in->n_heads * in->head_dim;
    size_t kvd = (size_t)in->n_kv_heads * in->head_dim;
    size_t rp = (size_t)(m->rope_pairs > 0 ? m->rope_pairs : 1);
    int swa_tables = m->layer_window != NULL;
    size_t floats = C * (3 * (size_t)in->n_embd + 2 * qd + 2 * kvd + 2 * (size_t)in->n_ff +
                         (swa_tables ? 4 : 2) * rp);
    m->work_mem = malloc(floats * sizeof(float));
    m->w.pos = malloc(C * sizeof *m->w.pos);
    m->inv_freq = malloc(rp * sizeof *m->inv_freq);
    if (swa_tables) m->inv_freq_swa = malloc(rp * sizeof *m->inv_freq_swa);
    if (!m->work_mem || !m->w.pos || !m->inv_freq || (swa_tables && !m->inv_freq_swa))
        return kkv_fail(KKV_ERR_NOMEM, "model: out of memory for working buffers");
    float *p = m->work_mem;
    m->w.x = p, p += C * in->n_embd;
    m->w.xn = p, p += C * in->n_embd;
    m->w.proj = p, p += C * in->n_embd;
    m->w.q = p, p += C * qd;
    m->w.att = p, p += C * qd;
    m->w.k = p, p += C * kvd;
    m->w.v = p, p += C * kvd;
    m->w.gate = p, p += C * in->n_ff;
    m->w.up = p, p += C * in->n_ff;
    m->w.cs = p, p += C * rp;
    m->w.sn = p, p += C * rp;
    if (swa_tables) {
        m->w.cs_swa = p, p += C * rp;
        m->w.sn_swa = p;
        /* windowed layers: their own base, no scaling (llama.cpp's
         * rope_freq_scale_train_swa = 1) */
        kkv_op_rope_freqs(m->inv_freq_swa, 2 * m->rope_pairs, in->rope_theta_swa);
    }
    kkv_op_rope_freqs(m->inv_freq, 2 * m->rope_pairs, in->rope_theta);
    /* scaling divides the angle: linear by one factor, Llama 3 per pair */
    for (int i = 0; i < m->rope_pairs; i++) {
        m->inv_freq[i] /= (double)m->rope_scale;
        if (m->rope_ff) m->inv_freq[i] /= (double)m->rope_ff[i];
    }
    return KKV_OK;
}

static kkv_status read_chat_template(kkv_model *m);

kkv_status kkv_model_load(kkv_model **out, const char *path, int n_threads) {
    if (!out) return kkv_fail(KKV_ERR_INVALID_ARG, "model: out is NULL");
    *out = NULL;
    if (!path) return kkv_fail(KKV_ERR_INVALID_ARG, "model: path is NULL");
    if (n_threads < 0)
        return kkv_fail(KKV_ERR_INVALID_ARG, "model: n_threads %d is negative", n_threads);
    kkv_gguf *g;
    KKV_TRY(kkv_gguf_open(&g, path)); /* its messages name the path */
    kkv_status s = kkv_model_from_gguf(out, g, n_threads);
    if (s != KKV_OK) {
        char shown[160];
        kkv_printable(shown, sizeof shown, path, strlen(path));
        kkv_fail(s, "%s: %s", shown, kkv_last_error()); /* then every message names it once */
    }
    return s;
}

static kkv_status compute_fingerprint(kkv_model *m);

/* The weights the matmul kernels of this CPU read faster packed
 * (kkv_wt_pack; same results), copied into one block. Only speed depends
 * on it; KKV_WT_PACK=0 in the environment turns it off (for comparisons).
 * The copies are as large as the packed tensors; their pages in the file
 * mapping are released (kkv_gguf_release), so the resident memory stays
 * about the same. */
static kkv_status pack_weights(kkv_model *m) {
    const int R = kkv_wt_pack_rows();
    if (!R) return KKV_OK;
    int nl = m->info.n_layers, tied = m->output.data == m->tok_embd.data;
    int nw = 7 * nl + 2;
    kkv_weight **all = malloc((size_t)nw * sizeof *all); /* [nw] */
    size_t *off = malloc((size_t)(nw + 1) * sizeof *off); /* [nw + 1] byte offsets in packed_mem */
    if (!all || !off) {
        free(all);
        free(off);
        return kkv_fail(KKV_ERR_NOMEM, "model: out of memory");
    }
    int k = 0;
    all[k++] = &m->tok_embd;
    if (!tied) all[k++] = &m->output;
    for (int l = 0; l < nl; l++) {
        kkv_layer *L = &m->layers[l];
        kkv_weight *lw[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++) all[k++] = lw[i];
    }
    kkv_status s = KKV_OK;
    off[0] = 0;
    for (int i = 0; i < k && s == KKV_OK; i++) { /* off[i + 1] - off[i]: 0 for an unpacked type */
        size_t b;
        s = kkv_wt_packed_size(&b, all[i], R);
        b = (b + 63) & ~(size_t)63;
        if (s == KKV_OK && b > SIZE_MAX - off[i]) s = kkv_fail(KKV_ERR_NOMEM, "model: packed weights too large");
        off[i + 1] = off[i] + b;
    }
    /* no room for the copy: the model runs unpacked (the same results, slower) */
    if (s == KKV_OK && off[k] > 0) {
        m->packed_mem = kkv_big_alloc(off[k]); /* huge pages: each step streams it all */
        m->packed_bytes = off[k];
    }
    for (int i = 0; i < k && s == KKV_OK && m->packed_mem; i++) {
        if (off[i + 1] == off[i]) continue;
        uint8_t *dst = (uint8_t *)m->packed_mem + off[i];
        s = kkv_wt_pack(dst, all[i], R);
        all[i]->packed = dst;
        all[i]->pack_rows = R;
        /* the matmuls read the copy; only embedding lookups (a row per
         * token) still read the file's bytes, and fault those back in */
        kkv_gguf_release(m->gguf, all[i]->data, (size_t)all[i]->rows * all[i]->row_bytes);
    }
    if (tied) {
        m->output.packed = m->tok_embd.packed;
        m->output.pack_rows = m->tok_embd.pack_rows;
    }
    free(all);
    free(off);
    return s;
}

kkv_status kkv_model_from_gguf(kkv_model **out, kkv_gguf *g, int n_threads) {
    if (!out) {
        kkv_gguf_close(g);
        return kkv_fail(KKV_ERR_INVALID_ARG, "model: out is NULL");
    }
    *out = NULL;
    if (!g) return kkv_fail(KKV_ERR_INVALID_ARG, "model: gguf is NULL");
    if (n_threads < 0) {
        kkv_gguf_close(g);
        return kkv_fail(KKV_ERR_INVALID_ARG, "model: n_threads %d is negative", n_threads);
    }
    kkv_model *m = calloc(1, sizeof *m);
    if (!m) {
        kkv_gguf_close(g);
        return kkv_fail(KKV_ERR_NOMEM, "model: out of memory");
    }
    m->gguf = g;
    kkv_status s = read_hparams(m);
    if (s == KKV_OK) s = load_tensors(m);
    if (s == KKV_OK) s = compute_fingerprint(m);
    if (s == KKV_OK) s = pack_weights(m);
    if (s == KKV_OK) s = kkv_tok_from_gguf(&m->tok, m->gguf);
    /* Every id the tokenizer can produce must have an embedding row and every
     * logit a token text, or generated ids would vanish from the text. */
    if (s == KKV_OK && kkv_tok_n_vocab(m->tok) != m->info.n_vocab)
        s = kkv_fail(KKV_ERR_FORMAT, "model: the tokenizer has %d tokens but token_embd has "
                     "%d rows", kkv_tok_n_vocab(m->tok), m->info.n_vocab);
    if (s == KKV_OK) s = read_chat_template(m);
    if (s == KKV_OK) s = alloc_work(m);
    if (s == KKV_OK) s = kkv_tp_create(&m->tp_own, n_threads ? n_threads : kkv_cpu_count());
    m->tp = m->tp_own;
    if (s != KKV_OK) {
        kkv_model_free(m);
        return s;
    }
    m->info.bos = kkv_tok_bos(m->tok);
    m->info.eos = kkv_tok_eos(m->tok);
    m->info.eot = kkv_tok_eot(m->tok);
    *out = m;
    kkv_clear_error(); /* optional lookups on the way left messages */
    return KKV_OK;
}

/* A copy of tokenizer.chat_template (kept: a vocabulary-only model closes
 * the file). Absent is fine; kkv_chat_format says so when asked. */
static kkv_status read_chat_template(kkv_model *m) {
    kkv_gguf_str s;
    kkv_status st = kkv_gguf_get_str(m->gguf, "tokenizer.chat_template", &s);
    if (st == KKV_ERR_NOT_FOUND) return KKV_OK;
    if (st != KKV_OK) return kkv_fail(KKV_ERR_FORMAT, "model: tokenizer.chat_template is not a string");
    m->chat_template = malloc((size_t)s.len + 1);
    if (!m->chat_template) return kkv_fail(KKV_ERR_NOMEM, "model: out of memory");
    memcpy(m->chat_template, s.ptr, (size_t)s.len);
    m->chat_template[s.len] = 0;
    m->chat_template_len = (size_t)s.len;
    return KKV_OK;
}

kkv_status kkv_model_load_vocab(kkv_model **out, const char *path, const char *pre) {
    if (!out) return kkv_fail(KKV_ERR_INVALID_ARG, "vocab: out is NULL");
    *out = NULL;
    if (!path) return kkv_fail(KKV_ERR_INVALID_ARG, "vocab: path is NULL");
    kkv_model *m = calloc(1, sizeof *m);
    if (!m) return kkv_fail(KKV_ERR_NOMEM, "vocab: out of memory");
    kkv_status s = kkv_gguf_open(&m->gguf, path); /* its messages name the path */
    if (s == KKV_OK && (s = kkv_tok_from_gguf_pre(&m->tok, m->gguf, pre)) != KKV_OK) {
        char shown[160];
        kkv_printable(shown, sizeof shown, path, strlen(path));
        kkv_fail(s, "%s: %s", shown, kkv_last_error());
    }
    if (s == KKV_OK) s = read_chat_template(m);
    if (s != KKV_OK) {
        kkv_model_free(m);
        return s;
    }
    /* The mapping is not needed once the vocabulary is copied. */
    kkv_gguf_close(m->gguf);
    m->gguf = NULL;
    m->info.n_vocab = kkv_tok_n_vocab(m->tok);
    m->info.bos = kkv_tok_bos(m->tok);
    m->info.eos = kkv_tok_eos(m->tok);
    m->info.eot = kkv_tok_eot(m->tok);
    *out = m;
    return KKV_OK;
}

kkv_status kkv_model_set_threadpool(kkv_model *m, kkv_threadpool *tp) {
    if (!m) return kkv_fail(KKV_ERR_INVALID_ARG, "set_threadpool: NULL model");
    m->tp = tp ? tp : m->tp_own;
    return KKV_OK;
}

void kkv_model_free(kkv_model *m) {
    if (!m) return;
    if (m->layers) {
        for (int l = 0; l < m->info.n_layers; l++) {
            free(m->layers[l].attn_norm);
            free(m->layers[l].ffn_norm);
            free(m->layers[l].bq);
            free(m->layers[l].bk);
            free(m->layers[l].bv);
            free(m->layers[l].q_norm);
            free(m->layers[l].k_norm);
            free(m->layers[l].post_attn_norm);
            free(m->layers[l].post_ffn_norm);
        }
        free(m->layers);
    }
    free(m->output_norm);
    kkv_big_free(m->packed_mem, m->packed_bytes);
    free(m->rope_ff);
    free(m->work_mem);
    free(m->w.pos);
    free(m->inv_freq);
    free(m->inv_freq_swa);
    free(m->layer_window);
    kkv_tp_free(m->tp_own);
    kkv_tok_free(m->tok);
    kkv_gguf_close(m->gguf);
    free(m->chat_template);
    free(m);
}

kkv_status kkv_model_set_exact_matmul(kkv_model *m, int exact) {
    if (!m) return kkv_fail(KKV_ERR_INVALID_ARG, "set_exact_matmul: NULL model");
    m->matmul_impl = exact ? KKV_WT_IMPL_F32 : KKV_WT_IMPL_AUTO;
    return KKV_OK;
}

void kkv_model_set_qkv_hook(kkv_model *m, kkv_qkv_hook fn, void *user) {
    if (!m) return;
    m->hook = fn;
    m->hook_user = user;
}

uint64_t kkv_model_fingerprint(const kkv_model *m) { return m ? m->fingerprint : 0; }

/* Every tensor's name, type, shape and bytes: a saved state made with other
 * weights (or a re-quantized file) is refused. At load, while the weights
 * are being read for packing anyway, so that the released pages stay
 * released. */
static kkv_status compute_fingerprint(kkv_model *m) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return kkv_fail(KKV_ERR_NOMEM, "model: out of memory");
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, &m->info.n_layers, sizeof m->info.n_layers);
    uint64_t n = kkv_gguf_n_tensors(m->gguf);
    for (uint64_t i = 0; i < n; i++) {
        const kkv_gguf_tensor *t = kkv_gguf_tensor_at(m->gguf, i);
        XXH3_64bits_update(st, t->name.ptr, t->name.len);
        XXH3_64bits_update(st, &t->type, sizeof t->type);
        XXH3_64bits_update(st, t->ne, sizeof t->ne);
        XXH3_64bits_update(st, t->data, t->nbytes);
    }
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    m->fingerprint = h ? h : 1; /* 0 means "no model" in a saved state */
    return KKV_OK;
}

void kkv_model_get_info(const kkv_model *m, kkv_model_info *out) {
    if (!out) return;
    if (!m) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = m->info;
}

kkv_cache_config kkv_model_cache_config(const kkv_model *m, const kkv_method *method,
                                        size_t pool_bytes) {
    kkv_cache_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (!m) return cfg;
    cfg.n_layers = m->info.n_layers;
    cfg.n_kv_heads = m->info.n_kv_heads;
    cfg.head_dim = m->info.head_dim;
    cfg.pool_bytes = pool_bytes;
    cfg.layer_window = m->layer_window; /* borrowed until kkv_cache_create copies it */
    /* Attention uses as many threads as the matmuls; the two never overlap. */
    cfg.n_threads = kkv_tp_size(m->tp);
    if (method) cfg.method = *method;
    /* the pair map for pair-aware boosting follows the architecture's RoPE */
    cfg.rope_neox = m->info.rope_neox;
    cfg.rope_dims = m->info.rope_dims;
    return cfg;
}

kkv_status kkv_tokenize(const kkv_model *m, int32_t *tokens, int cap, int *n_out,
                        const char *text, size_t len, int add_bos, int special) {
    if (!m) return kkv_fail(KKV_ERR_INVALID_ARG, "tokenize: model is NULL");
    return kkv_tok_encode(m->tok, tokens, cap, n_out, text, len, add_bos, special);
}

kkv_status kkv_token_piece(const kkv_model *m, char *buf, size_t cap, size_t *n_out,
                           int32_t token) {
    if (!m) return kkv_fail(KKV_ERR_INVALID_ARG, "token piece: model is NULL");
    return kkv_tok_piece(m->tok, buf, cap, n_out, token);
}

kkv_status kkv_tokenize_alloc(const kkv_model *m, int32_t **tokens, int *n_out,
                              const char *text, size_t len, int add_bos, int special) {
    if (!m || !tokens || !n_out || (!text && len))
        return kkv_fail(KKV_ERR_INVALID_ARG, "tokenize: NULL argument");
    *tokens = NULL;
    *n_out = 0;
    if (len > (size_t)INT32_MAX - 8)
        return kkv_fail(KKV_ERR_INVALID_ARG, "tokenize: %zu bytes is more than a token count "
                        "can hold", len);
    /* Byte-level BPE gives at most one token per byte (plus BOS); one try
     * almost always fits, and a second with the exact count always does. */
    int cap = (int)len + 8, got = 0;
    kkv_status s = KKV_OK;
    for (int tries = 0; tries < 2; tries++) {
        int32_t *buf = malloc((size_t)cap * sizeof *buf); /* [cap] */
        if (!buf) return kkv_fail(KKV_ERR_NOMEM, "tokenize: out of memory");
        s = kkv_tokenize(m, buf, cap, &got, text ? text : "", len, add_bos, special);
        if (s == KKV_OK) {
            *tokens = buf;
            *n_out = got;
            return KKV_OK;
        }
        free(buf);
        if (s != KKV_ERR_INVALID_ARG || got <= cap) break;
        cap = got;
    }
    return s;
}

const char *const *kkv_pretokenizer_names(void) { return kkv_tok_pre_names(); }

kkv_status kkv_detokenize(const kkv_model *m, char *buf, size_t cap, size_t *n_out,
                          const int32_t *tokens, int n) {
    if (!m || !n_out || (n > 0 && !tokens) || (cap && !buf) || n < 0)
        return kkv_fail(KKV_ERR_INVALID_ARG, "detokenize: NULL argument or negative count");
    kkv_utf8_stream st;
    kkv_utf8_stream_init(&st);
    size_t w = 0;
    char piece[256], tmp[KKV_UTF8_STREAM_BOUND(256)];
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->info.n_vocab)
            return kkv_fail(KKV_ERR_INVALID_ARG, "detokenize: token %d at %d is outside the "
                            "vocabulary (0..%d)", (int)tokens[i], i, m->info.n_vocab - 1);
        size_t len;
        KKV_TRY(kkv_tok_piece(m->tok, piece, sizeof piece, &len, tokens[i]));
        size_t k = kkv_utf8_stream_feed(&st, tmp, piece, len);
        if (w + k <= cap) memcpy(buf + w, tmp, k);
        w += k;
    }
    size_t k = kkv_utf8_stream_flush(&st, tmp);
    if (w + k <= cap) memcpy(buf + w, tmp, k);
    w += k;
    *n_out = w;
    if (w > cap)
        return kkv_fail(KKV_ERR_INVALID_ARG, "detokenize: %zu bytes needed, %zu given", w, cap);
    return KKV_OK;
}

/* Bytes of w a matmul streams: its packed copy where it has one, else its
 * rows. */
static uint64_t streamed(const kkv_weight *w) {
    size_t packed = 0;
    if (w->packed && kkv_wt_packed_size(&packed, w, w->pack_rows) == KKV_OK && packed > 0) return packed;
    return w->rows > 0 ? (uint64_t)w->rows * (uint64_t)w->row_bytes : 0;
}

uint64_t kkv_model_decode_bytes(const kkv_model *m) {
    if (!m || !m->layers) return 0;
    uint64_t b = streamed(&m->output);
    for (int l = 0; l < m->info.n_layers; l++) {
        const kkv_layer *L = &m->layers[l];
        b += streamed(&L->wq) + streamed(&L->wk) + streamed(&L->wv) + streamed(&L->wo) +
             streamed(&L->w_gate) + streamed(&L->w_up) + streamed(&L->w_down);
    }
    return b;
}

int kkv_model_layer_window(const kkv_model *m, int layer) {
    if (!m || !m->layers || layer < 0 || layer >= m->info.n_layers) return 0;
    return m->layers[layer].window;
}

kkv_status kkv_model_set_sliding_window(kkv_model *m, int window) {
    if (!m) return kkv_fail(KKV_ERR_INVALID_ARG, "set_sliding_window: NULL model");
    if (!m->layer_window)
        return kkv_fail(KKV_ERR_INVALID_ARG, "set_sliding_window: the model has no windowed "
                        "layers");
    if (window < 1)
        return kkv_fail(KKV_ERR_INVALID_ARG, "set_sliding_window: window %d < 1", window);
    for (int l = 0; l < m->info.n_layers; l++)
        if (m->layers[l].window) m->layers[l].window = m->layer_window[l] = window;
    m->info.sliding_window = window;
    return KKV_OK;
}
