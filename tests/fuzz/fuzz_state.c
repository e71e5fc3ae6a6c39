/* libFuzzer target for the sequence-state loader (kkv_seq_load). Each input
 * is tried twice on a small kitty cache (eager values from the first byte's
 * low bit): as it is -- the checksum must refuse nearly everything -- and
 * with its last 8 bytes replaced by the XXH3 of the rest, so mutations reach
 * the parser behind the checksum. A load that succeeds must give a sequence
 * that attention, save and free handle; one that fails must leave the pool as
 * it was. Build: CC=clang cmake -DKKV_FUZZ=ON; run: fuzz_state tests/fuzz/corpus_state */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "kittykv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one(const uint8_t *data, size_t size, int eager) {
    kkv_method m;
    kkv_method_from_name(&m, "kitty");
    m.sink = 5, m.group = 8, m.window = 12, m.eager_values = eager;
    kkv_cache_config cfg = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 16,
                            .pool_bytes = 1u << 20, .method = m};
    kkv_cache *c = NULL;
    if (kkv_cache_create(&c, &cfg) != KKV_OK) __builtin_trap();
    uint64_t f0 = kkv_cache_free_bytes(c);
    int seq = -1, n_tok = 0;
    int32_t tok[64];
    kkv_status s = kkv_seq_load(c, &seq, data, size, 0x1234abcdull, tok, 64, &n_tok);
    if (s == KKV_OK) {
        float q[4 * 16], out[4 * 16];
        for (int i = 0; i < 4 * 16; i++) q[i] = (float)(i % 7) - 3.0f;
        for (int l = 0; l < 2; l++)
            if (kkv_seq_len(c, seq, l) > 0 && kkv_attend(c, out, seq, l, q, 4) != KKV_OK)
                __builtin_trap();
        size_t n = 0;
        if (kkv_seq_save(c, NULL, 0, &n, seq, NULL) != KKV_OK) __builtin_trap();
        kkv_seq_free(c, seq);
    } else if (kkv_cache_free_bytes(c) != f0 || seq != -1) {
        __builtin_trap();
    }
    if (kkv_cache_free_bytes(c) != f0) __builtin_trap();
    kkv_cache_free(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int eager = size > 0 && (data[size - 1] & 1);
    one(data, size, eager);
    if (size >= 8 + 96) {
        uint8_t *b = malloc(size);
        if (!b) return 0;
        memcpy(b, data, size);
        uint64_t h = XXH3_64bits(b, size - 8);
        for (int i = 0; i < 8; i++) b[size - 8 + i] = (uint8_t)(h >> (8 * i));
        one(b, size, eager);
        one(b, size, !eager);
        free(b);
    }
    return 0;
}
