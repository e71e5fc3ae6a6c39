/* libFuzzer target for the GGUF reader: parse the input, then walk every
 * metadata entry, string array and tensor the way a loader would, reading
 * every byte the reader says is in bounds (ASan reports anything that is
 * not). Build: CC=clang cmake -DKKV_FUZZ=ON; run: fuzz_gguf tests/fuzz/corpus_gguf */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "model/gguf.h"
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
    return 0;
}
