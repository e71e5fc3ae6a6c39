/* libFuzzer target for the tensor-file reader behind `kittykv quantize
 * --keys/--values` (kkv_tensor_parse: .npy header or raw rows). The first two
 * bytes pick the column count (1..65536); the rest is the file. On success the
 * layout must be exactly in bounds, and every data byte is read (ASan checks).
 * Seeds: tests/fuzz/corpus_tensor. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "kittykv_eval.h"

static volatile uint8_t g_sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int cols = 1 + (data[0] | data[1] << 8);
    const uint8_t *file = data + 2;
    size_t len = size - 2;
    int64_t rows = -1;
    size_t off = 0;
    if (kkv_tensor_parse(&rows, &off, file, len, cols, "fuzz") != KKV_OK) return 0;
    if (rows < 0 || off > len || (uint64_t)rows * (uint64_t)cols * 4 != len - off)
        __builtin_trap();
    uint8_t x = 0;
    for (size_t i = off; i < len; i++) x ^= file[i];
    g_sink ^= x;
    return 0;
}
