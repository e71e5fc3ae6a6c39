/* libFuzzer target for method-spec parsing ("kitty:alpha=0.5:select=random",
 * comma-separated lists), today the CLI's eval_spec_parse/eval_spec_list in
 * cli/eval_run.c; retarget to kkv_method_parse when the parser moves into the
 * library. Every spec that parses must be a method the cache accepts for some
 * head dimension the spec allows, or be rejected by kkv_method_check with a
 * message; a cache is created from it to exercise the sizes it implies.
 * Seeds: tests/fuzz/corpus_method_spec. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eval_run.h"
#include "kittykv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    char err[256];
    eval_spec one;
    if (eval_spec_parse(&one, text, err, sizeof err) == 0) {
        if (kkv_method_check(&one.method, 64) == KKV_OK &&
            one.method.select != KKV_SELECT_EXPLICIT) {
            kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 64,
                                    .pool_bytes = 1 << 20, .method = one.method};
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
        }
    } else if (!err[0]) {
        __builtin_trap(); /* a rejection must say why */
    }
    eval_spec list[8];
    int n = eval_spec_list(list, 8, text, err, sizeof err);
    if (n == 0 || n > 8) __builtin_trap();
    free(text);
    return 0;
}
