/* The model engine end to end.
 *
 * Without a model file: load errors on crafted files -- missing file (IO), not
 * GGUF (FORMAT), another architecture, a llama file with a missing
 * hyperparameter, a wrong tensor shape and an unsupported tensor type.
 *
 * With the default model (skip 77 if absent, unless KKV_REQUIRE_MODEL=1), on
 * the "kitty" method, a prompt long enough to pass S + G + R:
 *   - one call vs random chunks vs one token at a time: bit-identical logits
 *     and bit-identical cache contents (kkv_seq_read) in every layer and head;
 *   - 1 vs 2 threads (matmul and attention): bit-identical;
 *   - decode_batch over two sequences equals two single-token forwards;
 *   - a full pool fails with KKV_ERR_POOL_FULL and leaves the sequence as it
 *     was: after freeing another sequence, the same call gives exactly the
 *     logits of a run that never failed; CTX_FULL likewise, and a batch with
 *     one full sequence appends to none;
 *   - bad arguments (token ids, sequence, cache shape) are rejected. */
#include <math.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_eval.h"
#include "kittykv_model.h"
#include "core/cpu.h"
#include "model/ops.h"
#include "testutil.h"
#include "tu_bytes.h"

#ifndef KKV_SOURCE_DIR
#define KKV_SOURCE_DIR "."
#endif

/* ---------------------------------------------------------------- GGUF writer */


/* A tiny llama GGUF: 1 layer, n_embd 32, 1 head, n_ff 32, vocab 4, all F32.
 * Knobs: arch name, whether block_count is present, a tensor whose type is
 * replaced by IQ4_NL (a type the reader sizes but cannot compute with), a
 * tensor given a wrong row count. */
typedef struct tiny_opts {
    const char *arch;
    int         drop_block_count;
    const char *q5_tensor;
    const char *bad_shape_tensor;
} tiny_opts;

static const char *TINY_TENSORS[] = {
    "token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight",
    "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
    "blk.0.attn_output.weight", "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight",
    "blk.0.ffn_up.weight", "blk.0.ffn_down.weight",
};
#define N_TINY (sizeof TINY_TENSORS / sizeof TINY_TENSORS[0])

static int write_tiny(const char *path, const tiny_opts *o) {
    wbuf b = {0};
    uint64_t n_kv = o->drop_block_count ? 6 : 7;
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, N_TINY);
    put_u64(&b, n_kv);
    put_str(&b, "general.architecture");
    put_u32(&b, 8);
    put_str(&b, o->arch);
    const char *ikeys[] = {"llama.block_count", "llama.embedding_length",
                           "llama.feed_forward_length", "llama.attention.head_count",
                           "llama.attention.head_count_kv"};
    const uint32_t ivals[] = {1, 32, 32, 1, 1};
    for (int i = o->drop_block_count ? 1 : 0; i < 5; i++) {
        put_str(&b, ikeys[i]);
        put_u32(&b, 4);
        put_u32(&b, ivals[i]);
    }
    put_str(&b, "llama.attention.layer_norm_rms_epsilon");
    put_u32(&b, 6);
    put_f32(&b, 1e-5f);

    uint64_t off = 0, sizes[N_TINY];
    for (size_t t = 0; t < N_TINY; t++) {
        const char *name = TINY_TENSORS[t];
        int vec = strstr(name, "norm") != NULL;
        uint64_t rows = vec ? 1 : !strcmp(name, "token_embd.weight") ? 4 : 32;
        if (o->bad_shape_tensor && !strcmp(name, o->bad_shape_tensor)) rows = 16;
        int q5 = o->q5_tensor && !strcmp(name, o->q5_tensor);
        put_str(&b, name);
        put_u32(&b, vec ? 1 : 2);
        put_u64(&b, 32);
        if (!vec) put_u64(&b, rows);
        put_u32(&b, q5 ? 20 : 0);
        put_u64(&b, off);
        sizes[t] = q5 ? rows * 18 : rows * 32 * 4;
        off += (sizes[t] + 31) / 32 * 32;
    }
    while (b.n % 32) put(&b, "", 1);
    for (size_t t = 0; t < N_TINY; t++) {
        uint64_t padded = (sizes[t] + 31) / 32 * 32;
        for (uint64_t i = 0; i < padded / 4; i++) put_f32(&b, i < sizes[t] / 4 ? 0.01f : 0.0f);
    }
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b.p, 1, b.n, f) == b.n;
    if (f) ok = fclose(f) == 0 && ok;
    free(b.p);
    return ok ? 0 : -1;
}

static void expect_load_error(const char *path, kkv_status want, const char *msg_part) {
    kkv_model *m = (kkv_model *)1;
    kkv_status s = kkv_model_load(&m, path, 1);
    CHECK(s == want, "load %s: got %s, want %s (%s)", path, kkv_status_str(s),
          kkv_status_str(want), kkv_last_error());
    CHECK(m == NULL, "load %s: *out not NULL on failure", path);
    if (msg_part)
        CHECK(strstr(kkv_last_error(), msg_part) != NULL, "message '%s' lacks '%s'",
              kkv_last_error(), msg_part);
    if (s == KKV_OK) kkv_model_free(m);
}

/* The two RoPE pairings on a known vector: a quarter turn of pair 0 and a
 * half turn of pair 1, one head of 6 dims with 2 rotating pairs (dims 4, 5
 * stay). Adjacent pairs are (0,1), (2,3); NeoX pairs are (0,2), (1,3). */
static void test_rope_ops(void) {
    const float cs[2] = {0.0f, -1.0f}, sn[2] = {1.0f, 0.0f};
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 2, 3, 4, 5, 6};
    kkv_op_rope(a, 1, 6, cs, sn, 2);
    kkv_op_rope_neox(b, 1, 6, cs, sn, 2);
    const float wa[6] = {-2, 1, -3, -4, 5, 6}, wb[6] = {-3, -2, 1, -4, 5, 6};
    CHECK(memcmp(a, wa, sizeof a) == 0, "adjacent rope: %g %g %g %g", a[0], a[1], a[2], a[3]);
    CHECK(memcmp(b, wb, sizeof b) == 0, "neox rope: %g %g %g %g", b[0], b[1], b[2], b[3]);
}

/* The gated activations: kkv_op_act's pick (AVX2 where the CPU has it) gives
 * the scalar reference's bits on every length (tails of 1..7) and on the
 * edges of the exponential's range, infinities and NaN included; and the
 * reference is within a few float roundings of a double-precision
 * evaluation of the formulas with libm's exp. */
static double act_ref(int gemma, double x, double u) {
    /* 0.5 x (1 + tanh z) as x / (1 + e^-2z): the same function, without the
     * cancellation of 1 + tanh z for z << 0 (which even double suffers) */
    if (gemma) return x / (1.0 + exp(-2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x))) * u;
    return x / (1.0 + exp(-x)) * u;
}

static void test_act_ops(void) {
    enum { N = 4096 };
    static float g[N], u[N], a[N], b[N];
    tu_rng r = tu_rng_make(11);
    static const float edge[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 1e-20f, 87.0f, -87.0f, 87.3f, -87.3f,
                                 88.0f, -88.0f, 89.0f, -89.0f, 100.0f, -100.0f, 1e30f, -1e30f,
                                 INFINITY, -INFINITY, NAN, 0.5f, -0.5f, 3.0f, -3.0f};
    const int n_edge = (int)(sizeof edge / sizeof edge[0]);
    for (int i = 0; i < N; i++) {
        static const float spread[4] = {0.1f, 1.0f, 5.0f, 30.0f};
        g[i] = i < n_edge ? edge[i] : tu_normal(&r) * spread[i % 4];
        u[i] = i < n_edge ? 1.0f : tu_normal(&r);
    }
    for (int gemma = 0; gemma < 2; gemma++) {
        kkv_act_fn ref = gemma ? kkv_op_geglu : kkv_op_swiglu, fast = kkv_op_act(gemma);
        /* every length 1..40 at several offsets, then the whole array */
        int mism = 0;
        for (int len = 1; len <= 40; len++)
            for (int off = 0; off + len <= 200; off += 37) {
                memcpy(a, g + off, (size_t)len * sizeof *a);
                memcpy(b, g + off, (size_t)len * sizeof *b);
                ref(a, u + off, len);
                fast(b, u + off, len);
                mism += memcmp(a, b, (size_t)len * sizeof *a) != 0;
            }
        memcpy(a, g, sizeof a);
        memcpy(b, g, sizeof b);
        ref(a, u, N);
        fast(b, u, N);
        mism += memcmp(a, b, sizeof a) != 0;
        CHECK(mism == 0, "%s: the fast activation differs from the reference in %d runs",
              gemma ? "geglu" : "swiglu", mism);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            if (isnan(g[i])) {
                bad += !isnan(a[i]);
                continue;
            }
            double x = g[i], want = act_ref(gemma, x, (double)u[i]);
            /* the exponential's argument carries the float roundings of its
             * computation (GeGLU's cubic: a few ulps of 2z), which e^arg turns
             * into ~|arg| ulps of the result; past e^88 the exact value is
             * below 1e-35 */
            double arg = gemma ? 2.0 * 0.7978845608028654 * fabs(x + 0.044715 * x * x * x) : fabs(x);
            double tol = (2e-6 + 3e-7 * arg) * fabs(want) + 1e-35;
            if (isinf(want) ? a[i] != (float)want : fabs((double)a[i] - want) > tol) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s(%g, %g) = %.9g, double %.9g\n", gemma ? "geglu" : "swiglu",
                            (double)g[i], (double)u[i], (double)a[i], want);
            }
        }
        CHECK(bad == 0, "%s: %d values off the double-precision formula", gemma ? "geglu" : "swiglu", bad);
    }
}

static void test_load_errors(void) {
    char dir[] = "/tmp/kkv_test_model_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/missing.gguf", dir);
    expect_load_error(path, KKV_ERR_IO, NULL);

    snprintf(path, sizeof path, "%s/text.gguf", dir);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs("this is not a GGUF file, just some text that is long enough to parse\n", f);
        fclose(f);
    }
    expect_load_error(path, KKV_ERR_FORMAT, NULL);
    remove(path);

    struct {
        tiny_opts   o;
        kkv_status  want;
        const char *msg;
    } cases[] = {
        {{"gpt2", 0, NULL, NULL}, KKV_ERR_UNSUPPORTED, "unsupported architecture 'gpt2'"},
        {{"llama", 1, NULL, NULL}, KKV_ERR_FORMAT, "llama.block_count"},
        {{"llama", 0, "blk.0.ffn_up.weight", NULL}, KKV_ERR_UNSUPPORTED, "blk.0.ffn_up.weight"},
        {{"llama", 0, "token_embd.weight", NULL}, KKV_ERR_UNSUPPORTED, "IQ4_NL"},
        {{"gemma2", 0, NULL, NULL}, KKV_ERR_UNSUPPORTED, "unsupported architecture 'gemma2'"},
        /* gemma3 is supported: this file's llama.* keys are not its keys */
        {{"gemma3", 0, NULL, NULL}, KKV_ERR_FORMAT, "gemma3.block_count"},
        {{"llama", 0, NULL, "blk.0.attn_k.weight"}, KKV_ERR_FORMAT, "blk.0.attn_k.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/tiny%zu.gguf", dir, i);
        CHECK(write_tiny(path, &cases[i].o) == 0, "cannot write %s", path);
        expect_load_error(path, cases[i].want, cases[i].msg);
        remove(path);
    }
    /* The writer itself is sound: the same file with nothing wrong gets past
     * every model check (it fails only for lack of a tokenizer). */
    tiny_opts good = {"llama", 0, NULL, NULL};
    snprintf(path, sizeof path, "%s/good.gguf", dir);
    CHECK(write_tiny(path, &good) == 0, "cannot write %s", path);
    kkv_model *m = NULL;
    kkv_status s = kkv_model_load(&m, path, 1);
    CHECK(s == KKV_OK || strstr(kkv_last_error(), "tokenizer") != NULL ||
              strstr(kkv_last_error(), "token") != NULL,
          "valid tiny model failed for another reason: %s", kkv_last_error());
    kkv_model_free(m);
    remove(path);
    rmdir(dir);
}

/* ---------------------------------------------------------------- real model */

/* Past S + G + R = 288 of kitty: 3 key pages, 2 value pages, partial buffers. */
#define N_PROMPT 430

static kkv_model      *g_m;
static kkv_model_info  g_info;

static kkv_cache *make_cache(const char *method, size_t pool_bytes, int max_tokens,
                             int threads) {
    kkv_method me;
    if (kkv_method_from_name(&me, method) != KKV_OK) return NULL;
    kkv_cache_config cfg = kkv_model_cache_config(g_m, &me, pool_bytes);
    cfg.max_tokens = max_tokens;
    cfg.n_threads = threads;
    kkv_cache *c = NULL;
    if (kkv_cache_create(&c, &cfg) != KKV_OK) {
        fprintf(stderr, "cache: %s\n", kkv_last_error());
        return NULL;
    }
    return c;
}

/* The prompt: real English, tokenized, cut to n tokens. tokens: [n]. */
static int make_prompt(int32_t *tokens, int n) {
    static const char para[] =
        "The package manager keeps a database of every file it installed, so that "
        "removing a package never leaves stray files behind. When two packages want "
        "the same file, the installation stops and explains the conflict instead of "
        "guessing. Configuration files are treated with special care: a local change "
        "is never overwritten silently, and the administrator is asked what to do. ";
    size_t cap = 16 * sizeof para + 64;
    char *text = malloc(cap);
    if (!text) return -1;
    text[0] = 0;
    for (int part = 1; part <= 14; part++) {
        char head[32];
        snprintf(head, sizeof head, "Section %d. ", part);
        strcat(text, head);
        strcat(text, para);
    }
    int32_t *all = malloc(4096 * sizeof *all);
    int got = 0;
    kkv_status s = all ? kkv_tokenize(g_m, all, 4096, &got, text, strlen(text), 1, 0)
                       : KKV_ERR_NOMEM;
    free(text);
    if (s != KKV_OK || got < n) {
        fprintf(stderr, "tokenize: %s (%d tokens)\n", kkv_last_error(), got);
        free(all);
        return -1;
    }
    memcpy(tokens, all, (size_t)n * sizeof *tokens);
    free(all);
    return 0;
}

/* 1 if every layer and head of two sequences hold the same bits. */
static int same_cache(const kkv_cache *a, int sa, const kkv_cache *b, int sb) {
    int n = kkv_seq_len(a, sa, 0);
    if (n != kkv_seq_len(b, sb, 0) || n < 0) return 0;
    size_t sz = (size_t)(n ? n : 1) * g_info.head_dim;
    float *ka = malloc(sz * 4), *va = malloc(sz * 4), *kb = malloc(sz * 4), *vb = malloc(sz * 4);
    int same = ka && va && kb && vb;
    for (int l = 0; same && l < g_info.n_layers; l++) {
        if (kkv_seq_len(a, sa, l) != n || kkv_seq_len(b, sb, l) != n) same = 0;
        for (int h = 0; same && h < g_info.n_kv_heads; h++) {
            if (kkv_seq_read(a, ka, va, sa, l, h) != KKV_OK ||
                kkv_seq_read(b, kb, vb, sb, l, h) != KKV_OK)
                same = 0;
            else if (memcmp(ka, kb, (size_t)n * g_info.head_dim * 4) ||
                     memcmp(va, vb, (size_t)n * g_info.head_dim * 4))
                same = 0;
        }
    }
    free(ka), free(va), free(kb), free(vb);
    return same;
}

static size_t V(void) { return (size_t)g_info.n_vocab; }

static void test_chunking(const int32_t *prompt) {
    const size_t pool = 256u << 20;
    kkv_cache *c1 = make_cache("kitty", pool, 0, 1), *c2 = make_cache("kitty", pool, 0, 1),
              *c3 = make_cache("kitty", pool, 0, 1);
    float *all = malloc((size_t)N_PROMPT * V() * sizeof(float)); /* [N][V] */
    float *lg = malloc(V() * sizeof(float));                      /* [V] */
    if (!c1 || !c2 || !c3 || !all || !lg) {
        CHECK(0, "setup failed");
        goto out;
    }
    int s1 = -1, s2 = -1, s3 = -1;
    CHECK(kkv_seq_add(c1, &s1) == KKV_OK && kkv_seq_add(c2, &s2) == KKV_OK &&
              kkv_seq_add(c3, &s3) == KKV_OK, "seq_add: %s", kkv_last_error());

    /* one call, every position's logits */
    kkv_status s = kkv_model_forward(g_m, c1, all, s1, prompt, N_PROMPT, 1);
    CHECK(s == KKV_OK, "one-call forward: %s", kkv_last_error());
    CHECK(kkv_seq_len(c1, s1, g_info.n_layers - 1) == N_PROMPT, "length after prefill %d",
          kkv_seq_len(c1, s1, g_info.n_layers - 1));

    /* random chunks: last-token logits of each chunk */
    tu_rng r = tu_rng_make(7);
    int done = 0, chunks = 0, bad = 0;
    while (done < N_PROMPT) {
        int cn = 1 + tu_int(&r, 150);
        if (cn > N_PROMPT - done) cn = N_PROMPT - done;
        s = kkv_model_forward(g_m, c2, lg, s2, prompt + done, cn, 0);
        done += cn;
        chunks++;
        if (s != KKV_OK || memcmp(lg, all + (size_t)(done - 1) * V(), V() * 4)) bad++;
    }
    CHECK(bad == 0, "%d of %d chunks differ from the one-call logits (%s)", bad, chunks,
          kkv_last_error());
    CHECK(same_cache(c1, s1, c2, s2), "chunked prefill left a different cache");

    /* one token at a time */
    bad = 0;
    for (int i = 0; i < N_PROMPT; i++) {
        s = kkv_model_forward(g_m, c3, lg, s3, prompt + i, 1, 0);
        if (s != KKV_OK || memcmp(lg, all + (size_t)i * V(), V() * 4)) bad++;
    }
    CHECK(bad == 0, "%d of %d single-token steps differ from the one-call logits", bad,
          N_PROMPT);
    CHECK(same_cache(c1, s1, c3, s3), "token-by-token prefill left a different cache");

    /* sanity: the logits are finite and not constant */
    int finite = 1;
    float mn = all[0], mx = all[0];
    for (size_t i = 0; i < (size_t)N_PROMPT * V(); i++) {
        if (!isfinite(all[i])) finite = 0;
        if (all[i] < mn) mn = all[i];
        if (all[i] > mx) mx = all[i];
    }
    CHECK(finite && mx - mn > 1.0f, "logits degenerate: finite %d range %g..%g", finite,
          (double)mn, (double)mx);

    /* 2 threads (matmul and attention) give the same bits */
    kkv_model *m2 = NULL;
    kkv_cache *c4 = NULL;
    const char *path = getenv("KKV_MODEL") && *getenv("KKV_MODEL")
                           ? getenv("KKV_MODEL")
                           : KKV_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    if (kkv_model_load(&m2, path, 2) == KKV_OK && (c4 = make_cache("kitty", pool, 0, 2))) {
        int s4 = -1;
        kkv_seq_add(c4, &s4);
        s = kkv_model_forward(m2, c4, lg, s4, prompt, N_PROMPT, 0);
        CHECK(s == KKV_OK, "2-thread forward: %s", kkv_last_error());
        CHECK(!memcmp(lg, all + (size_t)(N_PROMPT - 1) * V(), V() * 4),
              "2 threads give different logits");
        CHECK(same_cache(c1, s1, c4, s4), "2 threads leave a different cache");
    } else {
        CHECK(0, "2-thread setup: %s", kkv_last_error());
    }
    kkv_cache_free(c4);
    kkv_model_free(m2);
out:
    free(all);
    free(lg);
    kkv_cache_free(c1);
    kkv_cache_free(c2);
    kkv_cache_free(c3);
}

/* A batch of 10 (more than one group of the matmul's activation columns:
 * 8 + 2; attention on 2 threads, one pass for all ten): every member's logits
 * equal its single-token forward,
 * so they do not depend on the batch's composition. */
#define BATCH_WIDE 10
static void test_decode_batch_wide(const int32_t *prompt) {
    const size_t pool = 64u << 20;
    kkv_cache *a = make_cache("kitty", pool, 0, 2), *b = make_cache("kitty", pool, 0, 1);
    float *lb = malloc(BATCH_WIDE * V() * sizeof(float)), *l1 = malloc(V() * 4);
    if (!a || !b || !lb || !l1) {
        CHECK(0, "setup failed");
        goto out;
    }
    int sa[BATCH_WIDE], sb[BATCH_WIDE];
    int32_t toks[BATCH_WIDE];
    for (int i = 0; i < BATCH_WIDE; i++) {
        /* different lengths and positions; the first two fill their key
         * Q-buffers in this step (sink 32 + 128, + another 128), so the batch
         * flushes pages between its attention and the next layer */
        int len = i == 0 ? 159 : i == 1 ? 287 : 3 + 2 * i;
        CHECK(kkv_seq_add(a, &sa[i]) == KKV_OK && kkv_seq_add(b, &sb[i]) == KKV_OK &&
                  kkv_model_forward(g_m, a, NULL, sa[i], prompt + 7 * i, len, 0) == KKV_OK &&
                  kkv_model_forward(g_m, b, NULL, sb[i], prompt + 7 * i, len, 0) == KKV_OK,
              "prefill %d: %s", i, kkv_last_error());
        toks[i] = prompt[7 * i + len]; /* 7 * 1 + 287 < N_PROMPT */
    }
    CHECK(kkv_model_decode_batch(g_m, a, lb, sa, toks, BATCH_WIDE) == KKV_OK,
          "decode batch of %d: %s", BATCH_WIDE, kkv_last_error());
    int bad = 0;
    for (int i = 0; i < BATCH_WIDE; i++) {
        CHECK(kkv_model_forward(g_m, b, l1, sb[i], &toks[i], 1, 0) == KKV_OK,
              "single step %d: %s", i, kkv_last_error());
        bad += memcmp(lb + (size_t)i * V(), l1, V() * 4) != 0;
        bad += !same_cache(a, sa[i], b, sb[i]);
    }
    CHECK(bad == 0, "a batch of %d differs from single-token forwards in %d "
          "logits/caches", BATCH_WIDE, bad);
out:
    free(lb), free(l1);
    kkv_cache_free(a);
    kkv_cache_free(b);
}

static void test_decode_batch(const int32_t *prompt) {
    const size_t pool = 64u << 20;
    kkv_cache *a = make_cache("kitty", pool, 0, 1), *b = make_cache("kitty", pool, 0, 1);
    float *lb = malloc(2 * V() * sizeof(float)), *l1 = malloc(V() * 4), *l2 = malloc(V() * 4);
    if (!a || !b || !lb || !l1 || !l2) {
        CHECK(0, "setup failed");
        goto out;
    }
    int a1 = -1, a2 = -1, b1 = -1, b2 = -1;
    kkv_seq_add(a, &a1), kkv_seq_add(a, &a2), kkv_seq_add(b, &b1), kkv_seq_add(b, &b2);
    /* different lengths, so the batch has different positions */
    CHECK(kkv_model_forward(g_m, a, NULL, a1, prompt, 40, 0) == KKV_OK &&
              kkv_model_forward(g_m, a, NULL, a2, prompt + 100, 25, 0) == KKV_OK &&
              kkv_model_forward(g_m, b, NULL, b1, prompt, 40, 0) == KKV_OK &&
              kkv_model_forward(g_m, b, NULL, b2, prompt + 100, 25, 0) == KKV_OK,
          "prefill: %s", kkv_last_error());
    int32_t toks[2] = {prompt[40], prompt[125]};
    int seqs[2] = {a1, a2};
    CHECK(kkv_model_decode_batch(g_m, a, lb, seqs, toks, 2) == KKV_OK, "decode batch: %s",
          kkv_last_error());
    CHECK(kkv_model_forward(g_m, b, l1, b1, &toks[0], 1, 0) == KKV_OK &&
              kkv_model_forward(g_m, b, l2, b2, &toks[1], 1, 0) == KKV_OK,
          "single steps: %s", kkv_last_error());
    CHECK(!memcmp(lb, l1, V() * 4) && !memcmp(lb + V(), l2, V() * 4),
          "decode_batch differs from single-token forwards");
    CHECK(same_cache(a, a1, b, b1) && same_cache(a, a2, b, b2),
          "decode_batch left a different cache");

    int dup[2] = {a1, a1};
    CHECK(kkv_model_decode_batch(g_m, a, lb, dup, toks, 2) == KKV_ERR_INVALID_ARG,
          "a repeated sequence must be rejected");
    CHECK(kkv_seq_len(a, a1, 0) == 41, "rejected batch changed the sequence");
out:
    free(lb), free(l1), free(l2);
    kkv_cache_free(a);
    kkv_cache_free(b);
}

/* Bytes kkv_seq_reserve(n) takes for a new sequence: the peak of n tokens
 * (staging + pages). Once they are in, what the peak held beyond the state
 * goes back to the pool. */
static uint64_t capacity_for(int n) {
    kkv_cache *c = make_cache("kitty", 256u << 20, 0, 1);
    int s = -1;
    kkv_mem mem = {0};
    if (c && kkv_seq_add(c, &s) == KKV_OK && (n == 0 || kkv_seq_reserve(c, s, n) == KKV_OK))
        kkv_seq_mem(c, &mem, s);
    kkv_cache_free(c);
    return mem.capacity;
}

static void test_pool_full(const int32_t *prompt) {
    /* Room for reserving a 300-token sequence and a 200-token one. With the
     * 300 tokens in, a gives back the staging of its peak (token 288, both
     * Q-buffers full); growing a to 400 needs more than that. */
    uint64_t cap300 = capacity_for(300), cap200 = capacity_for(200);
    CHECK(cap300 > cap200 && cap200 > 0, "capacities %llu %llu", (unsigned long long)cap300,
          (unsigned long long)cap200);
    kkv_cache *c = make_cache("kitty", (size_t)(cap300 + cap200), 0, 1);
    kkv_cache *ref = make_cache("kitty", 256u << 20, 0, 1);
    float *lg = malloc(V() * 4), *lr = malloc(V() * 4);
    if (!c || !ref || !lg || !lr) {
        CHECK(0, "setup failed");
        goto out;
    }
    int a = -1, b = -1, r = -1;
    CHECK(kkv_seq_add(c, &a) == KKV_OK && kkv_seq_add(c, &b) == KKV_OK &&
              kkv_seq_add(ref, &r) == KKV_OK, "seq_add: %s", kkv_last_error());
    CHECK(kkv_model_forward(g_m, c, NULL, a, prompt, 300, 0) == KKV_OK, "a: %s",
          kkv_last_error());
    CHECK(kkv_model_forward(g_m, c, NULL, b, prompt, 200, 0) == KKV_OK, "b: %s",
          kkv_last_error());
    CHECK(kkv_model_forward(g_m, ref, NULL, r, prompt, 300, 0) == KKV_OK, "ref: %s",
          kkv_last_error());
    uint64_t free_before = kkv_cache_free_bytes(c);
    CHECK(free_before > 0, "a kept the surplus of its reservation");
    kkv_status s = kkv_model_forward(g_m, c, lg, a, prompt + 300, 100, 0);
    CHECK(s == KKV_ERR_POOL_FULL, "growing a past the pool: got %s", kkv_status_str(s));
    CHECK(kkv_seq_len(c, a, 0) == 300 && kkv_seq_len(c, a, g_info.n_layers - 1) == 300,
          "failed forward changed the length: %d", kkv_seq_len(c, a, 0));
    CHECK(kkv_cache_free_bytes(c) == free_before, "failed forward changed the pool");
    CHECK(same_cache(c, a, ref, r), "failed forward changed the cached K/V");

    CHECK(kkv_seq_free(c, b) == KKV_OK, "seq_free");
    s = kkv_model_forward(g_m, c, lg, a, prompt + 300, 100, 0);
    CHECK(s == KKV_OK, "after freeing b: %s", kkv_last_error());
    CHECK(kkv_model_forward(g_m, ref, lr, r, prompt + 300, 100, 0) == KKV_OK, "ref: %s",
          kkv_last_error());
    CHECK(!memcmp(lg, lr, V() * 4), "the retried forward differs from an unfailed run");
    CHECK(same_cache(c, a, ref, r), "the retried forward left a different cache");
out:
    free(lg), free(lr);
    kkv_cache_free(c);
    kkv_cache_free(ref);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* kkv_model_profile: the parts of a pass are timed, add up to its wall time,
 * restart from zero, stop, and change no result. */
static void test_profile(const int32_t *prompt) {
    kkv_cache *c = make_cache("kitty", 64u << 20, 200, 1);
    float *l0 = malloc(V() * 4), *l1 = malloc(V() * 4);
    int a = -1, b = -1;
    if (!c || !l0 || !l1 || kkv_seq_add(c, &a) != KKV_OK || kkv_seq_add(c, &b) != KKV_OK) {
        CHECK(0, "setup failed");
        free(l0);
        free(l1);
        kkv_cache_free(c);
        return;
    }
    double sec[KKV_PART_COUNT];
    int64_t passes = -1;
    CHECK(kkv_model_profile_get(g_m, sec, KKV_PART_COUNT, &passes) == KKV_OK && passes == 0,
          "never started: %lld passes", (long long)passes);
    CHECK(kkv_model_forward(g_m, c, l0, a, prompt, 30, 0) == KKV_OK, "a: %s", kkv_last_error());
    CHECK(kkv_model_profile(g_m, 1) == KKV_OK, "start: %s", kkv_last_error());
    double t0 = now_s();
    CHECK(kkv_model_forward(g_m, c, l1, b, prompt, 30, 0) == KKV_OK, "b: %s", kkv_last_error());
    double wall = now_s() - t0;
    CHECK(!memcmp(l0, l1, V() * 4), "profiling changed the logits");
    CHECK(kkv_model_profile_get(g_m, sec, KKV_PART_COUNT, &passes) == KKV_OK && passes == 1, "%lld passes after one",
          (long long)passes);
    double sum = 0.0;
    for (int p = 0; p < KKV_PART_COUNT; p++) {
        CHECK(sec[p] >= 0.0, "part %s: %g s", kkv_model_part_name(p), sec[p]);
        sum += sec[p];
    }
    CHECK(sec[KKV_PART_QKV] > 0 && sec[KKV_PART_ATTENTION] > 0 && sec[KKV_PART_OUT_PROJ] > 0 &&
              sec[KKV_PART_FFN] > 0 && sec[KKV_PART_HEAD] > 0,
          "a part of a 30-token pass took no time: %g %g %g %g %g", sec[0], sec[1], sec[2], sec[3], sec[4]);
    CHECK(sum <= wall && sum > 0.9 * wall, "parts %g s against the pass's %g s", sum, wall);
    /* decode steps add up; stopping keeps the totals */
    int32_t tok = prompt[30];
    CHECK(kkv_model_decode_batch(g_m, c, l1, &b, &tok, 1) == KKV_OK, "step: %s", kkv_last_error());
    CHECK(kkv_model_profile(g_m, 0) == KKV_OK, "stop: %s", kkv_last_error());
    double sec2[KKV_PART_COUNT];
    CHECK(kkv_model_profile_get(g_m, sec2, KKV_PART_COUNT, &passes) == KKV_OK && passes == 2 && sec2[KKV_PART_FFN] > sec[KKV_PART_FFN],
          "after a decode step: %lld passes, ffn %g -> %g s", (long long)passes, sec[KKV_PART_FFN], sec2[KKV_PART_FFN]);
    CHECK(kkv_model_forward(g_m, c, l1, a, &tok, 1, 0) == KKV_OK, "a step: %s", kkv_last_error());
    CHECK(kkv_model_profile_get(g_m, sec, KKV_PART_COUNT, &passes) == KKV_OK && passes == 2 && !memcmp(sec, sec2, sizeof sec),
          "a pass after stopping was timed");
    CHECK(kkv_model_profile(g_m, 1) == KKV_OK && kkv_model_profile_get(g_m, sec, KKV_PART_COUNT, NULL) == KKV_OK &&
              sec[KKV_PART_FFN] == 0.0,
          "a restart kept the totals");
    CHECK(kkv_model_profile(g_m, 0) == KKV_OK, "stop: %s", kkv_last_error());
    /* refusals and names */
    CHECK(kkv_model_profile(NULL, 1) == KKV_ERR_INVALID_ARG && kkv_model_profile(g_m, 2) == KKV_ERR_INVALID_ARG &&
              kkv_model_profile_get(NULL, sec, KKV_PART_COUNT, NULL) == KKV_ERR_INVALID_ARG &&
              kkv_model_profile_get(g_m, NULL, KKV_PART_COUNT, NULL) == KKV_ERR_INVALID_ARG &&
              kkv_model_profile_get(g_m, sec, -1, NULL) == KKV_ERR_INVALID_ARG,
          "bad profile arguments accepted");
    /* a caller built for fewer parts gets those only; one built for more gets zeros past ours */
    double few[3] = {-1, -1, -1}, more[KKV_PART_COUNT + 2];
    for (int p = 0; p < KKV_PART_COUNT + 2; p++) more[p] = -1;
    CHECK(kkv_model_profile_get(g_m, few, 2, NULL) == KKV_OK && few[2] == -1 &&
              kkv_model_profile_get(g_m, more, KKV_PART_COUNT + 2, NULL) == KKV_OK &&
              more[KKV_PART_COUNT] == 0.0 && more[KKV_PART_COUNT + 1] == 0.0,
          "profile_get's part count not honoured");
    CHECK(!strcmp(kkv_model_part_name(KKV_PART_QKV), "qkv") && !strcmp(kkv_model_part_name(KKV_PART_OTHER), "other") &&
              !strcmp(kkv_model_part_name(-1), "?") && !strcmp(kkv_model_part_name(KKV_PART_COUNT), "?"),
          "part names");
    free(l0);
    free(l1);
    kkv_cache_free(c);
}

static void test_bad_args(const int32_t *prompt) {
    kkv_cache *c = make_cache("kitty", 64u << 20, 50, 1);
    float *lg = malloc(V() * 4);
    if (!c || !lg) {
        CHECK(0, "setup failed");
        free(lg);
        kkv_cache_free(c);
        return;
    }
    int s = -1;
    kkv_seq_add(c, &s);
    CHECK(kkv_model_forward(g_m, c, lg, s, prompt, 40, 0) == KKV_OK, "40 tokens: %s",
          kkv_last_error());
    kkv_status st = kkv_model_forward(g_m, c, lg, s, prompt, 20, 0);
    CHECK(st == KKV_ERR_CTX_FULL, "past max_tokens: got %s", kkv_status_str(st));
    CHECK(kkv_seq_len(c, s, 0) == 40, "CTX_FULL changed the length");

    /* a batch where the second sequence is full appends to neither */
    int s2 = -1;
    kkv_seq_add(c, &s2);
    CHECK(kkv_model_forward(g_m, c, lg, s2, prompt, 10, 0) == KKV_OK, "s2: %s",
          kkv_last_error());
    CHECK(kkv_model_forward(g_m, c, lg, s, prompt, 10, 0) == KKV_OK, "s to 50: %s",
          kkv_last_error());
    int seqs[2] = {s2, s};
    int32_t toks[2] = {prompt[10], prompt[50]};
    float *lb = malloc(2 * V() * 4);
    st = lb ? kkv_model_decode_batch(g_m, c, lb, seqs, toks, 2) : KKV_ERR_NOMEM;
    CHECK(st == KKV_ERR_CTX_FULL, "batch past max_tokens: got %s", kkv_status_str(st));
    CHECK(kkv_seq_len(c, s2, 0) == 10 && kkv_seq_len(c, s, 0) == 50,
          "failed batch appended: %d %d", kkv_seq_len(c, s2, 0), kkv_seq_len(c, s, 0));
    free(lb);

    int32_t bad[3] = {prompt[0], (int32_t)g_info.n_vocab, prompt[1]};
    CHECK(kkv_model_forward(g_m, c, lg, s, bad, 3, 0) == KKV_ERR_INVALID_ARG,
          "token id n_vocab accepted");
    bad[1] = -1;
    CHECK(kkv_model_forward(g_m, c, lg, s, bad, 3, 0) == KKV_ERR_INVALID_ARG,
          "token id -1 accepted");
    CHECK(kkv_seq_len(c, s, 0) == 50, "rejected tokens changed the length");
    CHECK(kkv_model_forward(g_m, c, lg, s + 7, prompt, 1, 0) == KKV_ERR_NOT_FOUND,
          "unknown sequence accepted");
    CHECK(kkv_model_forward(g_m, c, lg, s, prompt, 0, 0) == KKV_ERR_INVALID_ARG,
          "n = 0 accepted");
    kkv_cache_free(c);

    /* a cache of another shape */
    kkv_method me;
    kkv_method_from_name(&me, "fp16");
    kkv_cache_config cfg = kkv_model_cache_config(g_m, &me, 16u << 20);
    cfg.n_layers = 2;
    if (kkv_cache_create(&c, &cfg) == KKV_OK) {
        kkv_seq_add(c, &s);
        CHECK(kkv_model_forward(g_m, c, lg, s, prompt, 1, 0) == KKV_ERR_INVALID_ARG,
              "cache of another shape accepted");
        kkv_cache_free(c);
    }
    free(lg);
}

/* Fork and save/load through the model: a child forked after the prompt,
 * and a sequence loaded from the parent's saved state, continue with logits
 * bit-identical to the parent's (issue 13). */
static void test_fork_state(const int32_t *prompt) {
    for (int eager = 0; eager < 2; eager++) {
        kkv_method me;
        kkv_method_from_name(&me, "kitty");
        me.eager_values = eager;
        kkv_cache_config cfg = kkv_model_cache_config(g_m, &me, 256u << 20);
        kkv_cache *c = NULL;
        if (kkv_cache_create(&c, &cfg) != KKV_OK) {
            CHECK(0, "cache: %s", kkv_last_error());
            return;
        }
        int p, ch, ld;
        float *lp = malloc(V() * sizeof(float)), *lc = malloc(V() * sizeof(float));
        float *ll = malloc(V() * sizeof(float));
        kkv_seq_add(c, &p);
        CHECK(kkv_model_forward(g_m, c, lp, p, prompt, 300, 0) == KKV_OK, "prefill: %s",
              kkv_last_error());
        CHECK(kkv_seq_fork(c, &ch, p) == KKV_OK, "fork: %s", kkv_last_error());
        size_t n = 0;
        kkv_state_meta meta = {kkv_model_fingerprint(g_m), prompt, 300};
        kkv_seq_save(c, NULL, 0, &n, p, &meta);
        uint8_t *buf = malloc(n);
        CHECK(kkv_seq_save(c, buf, n, &n, p, &meta) == KKV_OK, "save: %s", kkv_last_error());
        CHECK(kkv_seq_load(c, &ld, buf, n, kkv_model_fingerprint(g_m), NULL, 0, NULL) == KKV_OK,
              "load: %s", kkv_last_error());
        for (int i = 300; i < 340; i++) {
            kkv_model_forward(g_m, c, lp, p, &prompt[i], 1, 0);
            kkv_model_forward(g_m, c, lc, ch, &prompt[i], 1, 0);
            kkv_model_forward(g_m, c, ll, ld, &prompt[i], 1, 0);
            if (memcmp(lp, lc, V() * sizeof(float)) || memcmp(lp, ll, V() * sizeof(float))) {
                CHECK(0, "eager %d token %d: fork or loaded sequence's logits differ", eager, i);
                break;
            }
        }
        CHECK(same_cache(c, p, c, ch) && same_cache(c, p, c, ld), "caches differ after 40 steps");
        free(buf), free(lp), free(lc), free(ll);
        kkv_cache_free(c);
    }
}

/* kkv_eval_run and kkv_passkey_run refuse, before any forward pass, what the
 * CLI's own checks keep from them (a C caller gets no such help): NULL
 * arguments, bad counts, a NULL, unknown, duplicate or select=oracle spec,
 * lengths and depths out of range. Each a one-line message naming it. */
static void expect_refusal(kkv_status st, const char *word, const char *what) {
    const char *e = kkv_last_error();
    CHECK(st == KKV_ERR_INVALID_ARG && strstr(e, word) && !strchr(e, '\n'), "%s: status %d, '%s'", what,
          (int)st, e);
}

static void test_eval_refusals(const int32_t *prompt) {
    kkv_eval_config cfg = kkv_eval_defaults();
    cfg.n_tokens = 16;
    cfg.score_from = 8;
    kkv_eval_result res[2];
    const char *dup[] = {"kitty", "kitty"}, *oracle[] = {"kitty:select=oracle"}, *null_spec[] = {NULL},
               *unknown[] = {"kitty-max"};
    expect_refusal(kkv_eval_run(res, NULL, NULL, prompt, &cfg, dup, 1), "NULL argument", "eval: no model");
    expect_refusal(kkv_eval_run(res, NULL, g_m, prompt, &cfg, dup, -1), "negative spec count", "eval: -1 specs");
    expect_refusal(kkv_eval_run(res, NULL, g_m, prompt, &cfg, dup, 2), "listed twice", "eval: duplicate");
    expect_refusal(kkv_eval_run(res, NULL, g_m, prompt, &cfg, oracle, 1), "select=oracle", "eval: oracle");
    expect_refusal(kkv_eval_run(res, NULL, g_m, prompt, &cfg, null_spec, 1), "NULL or too long", "eval: NULL spec");
    CHECK(kkv_eval_run(res, NULL, g_m, prompt, &cfg, unknown, 1) == KKV_ERR_NOT_FOUND, "eval: unknown method");
    cfg.score_from = 16;
    expect_refusal(kkv_eval_run(res, NULL, g_m, prompt, &cfg, dup, 1), "score_from", "eval: nothing to score");

    kkv_passkey_config pk = kkv_passkey_defaults();
    kkv_passkey_cell cells[16];
    const int zero_len[] = {0};
    const float deep[] = {1.5f}, nan_depth[] = {NAN};
    expect_refusal(kkv_passkey_run(cells, NULL, &pk, dup, 1), "NULL argument", "passkey: no model");
    expect_refusal(kkv_passkey_run(cells, g_m, &pk, null_spec, 1), "NULL spec", "passkey: NULL spec");
    expect_refusal(kkv_passkey_run(cells, g_m, &pk, oracle, 1), "select=oracle", "passkey: oracle");
    kkv_passkey_config bad = pk;
    bad.trials = 0;
    expect_refusal(kkv_passkey_run(cells, g_m, &bad, dup, 1), "trials", "passkey: 0 trials");
    bad = pk;
    bad.lengths = zero_len, bad.n_lengths = 1;
    expect_refusal(kkv_passkey_run(cells, g_m, &bad, dup, 1), "length 0", "passkey: length 0");
    bad = pk;
    bad.depths = deep, bad.n_depths = 1;
    expect_refusal(kkv_passkey_run(cells, g_m, &bad, dup, 1), "depth 1.5", "passkey: depth 1.5");
    bad.depths = nan_depth;
    expect_refusal(kkv_passkey_run(cells, g_m, &bad, dup, 1), "depth", "passkey: depth NaN");
}

int main(void) {
    test_rope_ops();
    test_act_ops();
    test_load_errors();

    const char *path = getenv("KKV_MODEL") && *getenv("KKV_MODEL")
                           ? getenv("KKV_MODEL")
                           : KKV_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    const char *req = getenv("KKV_REQUIRE_MODEL");
    if (access(path, R_OK) != 0) {
        if (req && !strcmp(req, "1")) {
            CHECK(0, "model %s missing and KKV_REQUIRE_MODEL=1", path);
            return tu_summary();
        }
        printf("skip: no model at %s\n", path);
        tu_summary();
        return TU_SKIP;
    }
    if (kkv_model_load(&g_m, path, 1) != KKV_OK) {
        CHECK(0, "load %s: %s", path, kkv_last_error());
        return tu_summary();
    }
    kkv_model_get_info(g_m, &g_info);
    CHECK(!strcmp(g_info.arch, "llama") && g_info.n_layers > 0 && g_info.n_vocab > 0,
          "info: arch %s layers %d vocab %d", g_info.arch, g_info.n_layers, g_info.n_vocab);
    CHECK(g_info.rope_neox == 0 && g_info.rope_dims == g_info.head_dim, "info: llama rope layout %d, dims %d",
          g_info.rope_neox, g_info.rope_dims);
    /* SmolLM2 ties its output matrix to token_embd and keeps only the norm
     * vectors (two per layer and the output norm, fp32) outside the matrices */
    uint64_t norms = (uint64_t)(2 * g_info.n_layers + 1) * (uint64_t)g_info.n_embd * 4u;
    CHECK(kkv_model_decode_bytes(g_m) == g_info.weight_bytes - norms,
          "decode bytes %llu = the file's tensors %llu less the norms %llu",
          (unsigned long long)kkv_model_decode_bytes(g_m), (unsigned long long)g_info.weight_bytes,
          (unsigned long long)norms);
    CHECK(kkv_model_decode_bytes(NULL) == 0, "decode bytes of NULL");
    int32_t *prompt = malloc(N_PROMPT * sizeof *prompt);
    if (!prompt || make_prompt(prompt, N_PROMPT)) {
        CHECK(0, "no prompt tokens");
    } else {
        test_chunking(prompt);
        test_decode_batch(prompt);
        test_decode_batch_wide(prompt);
        test_pool_full(prompt);
        test_bad_args(prompt);
        test_profile(prompt);
        test_fork_state(prompt);
        test_eval_refusals(prompt);
    }
    free(prompt);
    kkv_model_free(g_m);
    return tu_summary();
}
