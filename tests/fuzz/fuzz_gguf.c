/* libFuzzer target for the GGUF reader and model load: parse the input, walk
 * every metadata entry, string array and tensor the way a loader would,
 * reading every byte the reader says is in bounds (ASan reports anything that
 * is not), then load it as a model (hyperparameters, tensor shapes, the
 * tokenizer) and, for a small model that loads, tokenize and run one forward
 * pass. Build: CC=clang cmake -DKKV_FUZZ=ON; run: fuzz_gguf tests/fuzz/corpus_gguf
 * (tiny_llama.seed is a complete 1-layer model). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/model.h"
#include "model/weights.h"

static volatile uint8_t g_sink;

static void touch(const void *p, uint64_t n) {
    const uint8_t *b = p;
    uint8_t x = 0;
    for (uint64_t i = 0; i < n; i++) x ^= b[i];
    g_sink ^= x;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kkv_gguf *g = NULL;
    if (kkv_gguf_parse(&g, data, size) != KKV_OK) return 0;
    (void)kkv_gguf_version(g);
    for (uint64_t i = 0; i < kkv_gguf_n_kv(g); i++) {
        kkv_gguf_str k = kkv_gguf_kv_key(g, i);
        touch(k.ptr, k.len);
        kkv_gguf_value v;
        if (kkv_gguf_kv_value(&v, g, i) != KKV_OK) __builtin_trap();
        if (v.type == KKV_GGUF_STRING) touch(v.str.ptr, v.str.len);
        if (v.strs)
            for (uint64_t j = 0; j < v.n; j++) touch(v.strs[j].ptr, v.strs[j].len);
        if (v.arr) {
            static const int sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
            touch(v.arr, v.n * (uint64_t)sz[v.elem_type]);
        }
        /* the typed getters by key, for keys a C string can name */
        char name[128];
        if (k.len < sizeof name && memchr(k.ptr, 0, k.len) == NULL) {
            memcpy(name, k.ptr, k.len);
            name[k.len] = 0;
            int64_t i64;
            uint32_t u32;
            float f;
            int b;
            kkv_gguf_str s;
            const kkv_gguf_str *sa;
            uint64_t n;
            kkv_gguf_type et;
            const void *arr;
            if (kkv_gguf_find(g, name) < 0) __builtin_trap();
            (void)kkv_gguf_get_i64(g, name, &i64);
            (void)kkv_gguf_get_u32(g, name, &u32);
            (void)kkv_gguf_get_f32(g, name, &f);
            (void)kkv_gguf_get_bool(g, name, &b);
            if (kkv_gguf_get_str(g, name, &s) == KKV_OK) touch(s.ptr, s.len);
            if (kkv_gguf_get_str_arr(g, name, &sa, &n) == KKV_OK)
                for (uint64_t j = 0; j < n; j++) touch(sa[j].ptr, sa[j].len);
            (void)kkv_gguf_get_arr(g, name, &et, &arr, &n);
        }
    }
    for (uint64_t i = 0; i < kkv_gguf_n_tensors(g); i++) {
        const kkv_gguf_tensor *t = kkv_gguf_tensor_at(g, i);
        touch(t->name.ptr, t->name.len);
        touch(t->data, t->nbytes);
        kkv_weight w;
        if (t->n_dims <= 2 && kkv_weight_from_tensor(&w, t) == KKV_OK && w.cols <= 4096) {
            /* dequantize the first row: the block walk must stay in bounds */
            float row[4096];
            kkv_wt_dequant_row(row, &w, 0);
            g_sink ^= (uint8_t)(row[0] != row[0]);
        }
    }
    kkv_gguf_close(g);

    /* the same bytes as a model: every failure must be a clean status */
    if (kkv_gguf_parse(&g, data, size) != KKV_OK) return 0;
    kkv_model *m = NULL;
    if (kkv_model_from_gguf(&m, g, 1) != KKV_OK) return 0; /* g is closed */
    kkv_model_info in;
    kkv_model_get_info(m, &in);
    if (in.n_vocab < 1 || in.n_layers < 1) __builtin_trap();
    if (in.weight_bytes <= (1u << 20) && (uint64_t)in.n_embd * in.n_layers <= 4096) {
        int32_t ids[16];
        int n = 0;
        const char *text = "Hi <|im_start|>";
        if (kkv_tokenize(m, ids, 16, &n, text, strlen(text), 1, 1) == KKV_OK && n > 0) {
            for (int i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= in.n_vocab) __builtin_trap();
            kkv_method me;
            kkv_method_from_name(&me, "kitty");
            kkv_cache_config cfg = kkv_model_cache_config(m, &me, 1 << 20);
            kkv_cache *c = NULL;
            float *lg = malloc((size_t)in.n_vocab * sizeof *lg);
            int seq;
            if (lg && kkv_cache_create(&c, &cfg) == KKV_OK && kkv_seq_add(c, &seq) == KKV_OK)
                (void)kkv_model_forward(m, c, lg, seq, ids, n, 0);
            kkv_cache_free(c);
            free(lg);
        }
    }
    kkv_model_free(m);
    return 0;
}
