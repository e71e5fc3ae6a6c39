/* The loaded model, shared by model.c (loading, tokenizer wrappers) and
 * forward.c (the forward pass). Weights stay in the GGUF mapping in their
 * quantized blocks; only the small norm vectors are widened to fp32. */
#ifndef KKV_MODEL_MODEL_H
#define KKV_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/threads.h"
#include "kittykv_model.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/weights.h"

/* Tokens the forward pass processes per internal step. Working buffers are
 * sized for this many tokens once, at load time, and longer calls are split
 * into chunks of this size: results do not depend on the split (every op is
 * per row, and the cache sees tokens one by one either way). */
#define KKV_MODEL_CHUNK 64

typedef struct kkv_layer {
    float     *attn_norm; /* [n_embd], owned */
    float     *ffn_norm;  /* [n_embd], owned */
    kkv_weight wq;        /* [n_heads*head_dim][n_embd]    */
    kkv_weight wk;        /* [n_kv_heads*head_dim][n_embd] */
    kkv_weight wv;        /* [n_kv_heads*head_dim][n_embd] */
    kkv_weight wo;        /* [n_embd][n_heads*head_dim]    */
    kkv_weight w_gate;    /* [n_ff][n_embd] */
    kkv_weight w_up;      /* [n_ff][n_embd] */
    kkv_weight w_down;    /* [n_embd][n_ff] */
    float     *bq, *bk, *bv; /* [n_heads*head_dim] / [n_kv_heads*head_dim] biases (Qwen2), owned, or NULL */
    float     *q_norm;    /* [head_dim] per-head RMSNorm of Q before RoPE (Qwen3), owned, or NULL */
    float     *k_norm;    /* [head_dim] same for K, or NULL */
    float     *post_attn_norm; /* [n_embd] RMSNorm of the attention output before the
                                  residual add (gemma3), owned, or NULL */
    float     *post_ffn_norm;  /* [n_embd] same for the FFN output, or NULL */
    int        window;    /* sliding window in tokens (gemma3 local layers), 0 = global */
} kkv_layer;

/* Working buffers for up to KKV_MODEL_CHUNK tokens (C below), one allocation. */
typedef struct kkv_model_work {
    float  *x;     /* [C][n_embd] residual stream          */
    float  *xn;    /* [C][n_embd] normed input of a block  */
    float  *q;     /* [C][n_heads*head_dim]                */
    float  *k;     /* [C][n_kv_heads*head_dim]             */
    float  *v;     /* [C][n_kv_heads*head_dim]             */
    float  *att;   /* [C][n_heads*head_dim] attention out  */
    float  *proj;  /* [C][n_embd] block output             */
    float  *gate;  /* [C][n_ff]                            */
    float  *up;    /* [C][n_ff]                            */
    float  *cs;    /* [C][rope_pairs] cos per token        */
    float  *sn;    /* [C][rope_pairs] sin per token        */
    float  *cs_swa; /* [C][rope_pairs] cos/sin with the windowed layers' base */
    float  *sn_swa; /* (gemma3), or NULL when every layer uses cs/sn          */
    int64_t *pos;  /* [C] position of each token           */
} kkv_model_work;

struct kkv_model {
    kkv_gguf      *gguf;       /* owns the mapping the weights point into */
    kkv_tok       *tok;
    char          *chat_template; /* [chat_template_len + 1] tokenizer.chat_template, owned, or NULL */
    size_t         chat_template_len;
    kkv_tp        *tp;         /* matmul threads: tp_own or a borrowed pool; NULL = caller */
    kkv_tp        *tp_own;     /* owned */
    kkv_wt_impl    matmul_impl; /* AUTO, or F32 for exact activations */
    kkv_qkv_hook   hook;        /* analysis observer, or NULL */
    void          *hook_user;
    kkv_model_info info;
    int            rope_pairs; /* rope.dimension_count / 2 */
    double        *inv_freq;   /* [rope_pairs], scaling (rope_freqs / linear) folded in */
    double        *inv_freq_swa; /* [rope_pairs] windowed layers (own base, no scaling), or NULL */
    int            qk_norm;    /* per-head Q/K norms are allowed (qwen3, gemma3) */
    int            gemma;      /* gemma3 block: embedding * sqrt(n_embd), post-norms, GeGLU */
    float          q_scale;    /* query multiplier so that the cache's 1/sqrt(D) gives the
                                  model's attention scale (1 but for Gemma 3 27B) */
    int           *layer_window; /* [n_layers] copy of each layer's window (0 = global), for
                                    kkv_model_cache_config; NULL when no layer has one */
    float          rope_scale; /* linear rope.scaling.factor (1 = none) */
    float         *rope_ff;    /* [rope_pairs] rope_freqs.weight (Llama 3 scaling), owned, or NULL */
    kkv_weight     tok_embd;   /* [n_vocab][n_embd] */
    kkv_weight     output;     /* [n_vocab][n_embd]; tok_embd when tied */
    float         *output_norm; /* [n_embd], owned */
    kkv_layer     *layers;     /* [n_layers] */
    uint64_t       fingerprint; /* kkv_model_fingerprint, computed at load (0: vocabulary only) */
    void          *packed_mem; /* owned (kkv_big_alloc): every weight's packed copy (kkv_wt_pack), or NULL */
    size_t         packed_bytes; /* its size, for kkv_big_free */
    kkv_model_work w;
    float         *work_mem;   /* backing store of w (one block) */
    int            prof_on;    /* kkv_model_profile: time the parts of each pass */
    double         prof_s[KKV_PART_COUNT]; /* wall seconds per part since profiling started */
    double         prof_t;     /* start of the interval being timed (monotonic seconds) */
    int64_t        prof_passes;
};

/* kkv_model_load() on an already parsed GGUF, which the model takes over in
 * every case (closed on failure). For tests and fuzz targets that hold the
 * file in memory (kkv_gguf_parse); the buffer must outlive the model. */
kkv_status kkv_model_from_gguf(kkv_model **out, kkv_gguf *g, int n_threads);

#endif
