/* libFuzzer target for method-spec parsing, kkv_method_parse ("kitty",
 * "kitty:alpha=0.5:select=random:seed=3"). Checks: a rejection says why and
 * leaves *out untouched; an accepted spec passes kkv_method_check for a head
 * dimension of 64 or is rejected there with a message, formats back to a spec
 * that parses to the same method (kkv_method_format's promise), and drives a
 * small cache (create, add, append, flush) without a crash.
 * Seeds: tests/fuzz/corpus_method_spec. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kittykv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_method(const kkv_method *a, const kkv_method *b) {
    return a->fp16 == b->fp16 && a->sink == b->sink && a->group == b->group &&
           a->window == b->window && a->alpha == b->alpha && a->value_bits == b->value_bits &&
           a->select == b->select && a->seed == b->seed && a->eager_values == b->eager_values &&
           a->pairs == b->pairs && a->key_rot == b->key_rot && a->value_rot == b->value_rot &&
           a->clip == b->clip && a->value_clip == b->value_clip && a->budget == b->budget &&
           a->sink_int8 == b->sink_int8 && a->window_int8 == b->window_int8 &&
           a->key_bits == b->key_bits;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    kkv_method m, before;
    memset(&m, 0xA5, sizeof m);
    before = m;
    kkv_status s = kkv_method_parse(&m, text);
    if (s != KKV_OK) {
        if (!kkv_last_error()[0] || memcmp(&m, &before, sizeof m)) __builtin_trap();
        free(text);
        return 0;
    }
    char spec[256];
    size_t n = 0;
    kkv_method back;
    if (kkv_method_format(spec, sizeof spec, &n, &m) != KKV_OK || n != strlen(spec) ||
        kkv_method_parse(&back, spec) != KKV_OK || !same_method(&back, &m))
        __builtin_trap();
    if (kkv_method_check(&m, 64) == KKV_OK && m.select != KKV_SELECT_EXPLICIT) {
        kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 64,
                                .pool_bytes = 1 << 20, .method = m};
        kkv_cache *c = NULL;
        if (kkv_cache_create(&c, &cfg) == KKV_OK) {
            int seq;
            float kv[64] = {0};
            if (kkv_seq_add(c, &seq) == KKV_OK) {
                (void)kkv_append(c, seq, 0, kv, kv);
                (void)kkv_flush(c, seq, 0);
            }
            kkv_cache_free(c);
        }
    } else if (kkv_method_check(&m, 64) != KKV_OK && !kkv_last_error()[0]) {
        __builtin_trap();
    }
    free(text);
    return 0;
}
