/* libFuzzer target for the tokenizer, on the default model's vocabulary
 * ($KKV_MODEL, else models/SmolLM2-135M-Instruct.Q4_1.gguf under the source
 * tree) with every pre-tokenizer this build knows, then the SentencePiece
 * path on tests/fuzz/corpus_gguf/tiny_spm.seed (a tiny vocabulary written by
 * make_seeds.py, also a seed of fuzz_gguf) and on the Gemma 3 vocabulary
 * (models/gemma-3-270m-q4_k_m.gguf) when present. Input byte 0 picks the
 * tokenizer (low bits), special-token parsing (bit 6) and BOS (bit 7); the
 * rest is the text. Checks: status OK, every id in range, the count reported
 * for a too-small buffer equals the real count, and the round trip
 * detokenize(tokenize(x)) == x whenever it must hold (no BOS; byte-level BPE:
 * every byte of x has a byte token of its own, else U+FFFD stands in for it;
 * SentencePiece: x has no U+2581, which decodes as a space). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/tokenizer.h"

#ifndef KKV_SOURCE_DIR
#define KKV_SOURCE_DIR "."
#endif

#define MAX_TOK 16
static kkv_tok *g_tok[MAX_TOK];
static int g_spm[MAX_TOK]; /* a SentencePiece tokenizer (byte fallback, no space prefix) */
static int g_n_tok;
static int g_byte_ok[256]; /* byte b alone tokenizes to one token whose piece is b (BPE) */

/* Adds the tokenizer(s) of a file: every pre-tokenizer for a BPE vocabulary,
 * the one for SentencePiece. A missing file adds none. */
static void add_file(const char *path, int all_pre) {
    kkv_gguf *g = NULL;
    if (kkv_gguf_open(&g, path) != KKV_OK) {
        fprintf(stderr, "fuzz_tokenizer: %s (skipped)\n", kkv_last_error());
        return;
    }
    const char *const *names = kkv_tok_pre_names();
    for (int i = 0; all_pre && names[i] && g_n_tok < MAX_TOK; i++)
        if (kkv_tok_from_gguf_pre(&g_tok[g_n_tok], g, names[i]) == KKV_OK) g_n_tok++;
    if (!all_pre && g_n_tok < MAX_TOK) {
        if (kkv_tok_from_gguf(&g_tok[g_n_tok], g) != KKV_OK) {
            fprintf(stderr, "fuzz_tokenizer: %s: %s\n", path, kkv_last_error());
            abort();
        }
        g_spm[g_n_tok++] = 1;
    }
    kkv_gguf_close(g);
}

static void init(void) {
    const char *path = getenv("KKV_MODEL");
    if (!path || !*path) path = KKV_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
    add_file(path, 1);
    int n_bpe = g_n_tok;
    add_file(KKV_SOURCE_DIR "/tests/fuzz/corpus_gguf/tiny_spm.seed", 0);
    FILE *f = fopen(KKV_SOURCE_DIR "/models/gemma-3-270m-q4_k_m.gguf", "rb");
    if (f) {
        fclose(f);
        add_file(KKV_SOURCE_DIR "/models/gemma-3-270m-q4_k_m.gguf", 0);
    }
    if (!g_n_tok) abort();
    for (int b = 0; b < 256 && n_bpe; b++) {
        char c = (char)b, piece[16];
        int32_t id;
        int n = 0;
        size_t pl = 0;
        g_byte_ok[b] = kkv_tok_encode(g_tok[0], &id, 1, &n, &c, 1, 0, 0) == KKV_OK && n == 1 &&
                       kkv_tok_piece(g_tok[0], piece, sizeof piece, &pl, id) == KKV_OK &&
                       pl == 1 && piece[0] == c;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_n_tok) init();
    if (size < 1 || size > 1 << 16) return 0;
    int which = (data[0] & 0x3f) % g_n_tok;
    const kkv_tok *t = g_tok[which];
    int special = (data[0] >> 6) & 1, bos = data[0] >> 7;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int cap = (int)len + 2;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    char *back = malloc(4 * len + 64);
    if (!ids || !back) abort();
    int n = -1;
    kkv_status s = kkv_tok_encode(t, ids, cap, &n, text, len, bos, special);
    if (s != KKV_OK || n < 0 || n > cap) __builtin_trap();
    int V = kkv_tok_n_vocab(t);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) __builtin_trap();
    if (n > 1) { /* too small a buffer: an error that reports the count needed */
        int need = -1;
        if (kkv_tok_encode(t, ids, n - 1, &need, text, len, bos, special) != KKV_ERR_INVALID_ARG ||
            need != n)
            __builtin_trap();
        kkv_tok_encode(t, ids, cap, &n, text, len, bos, special);
    }
    size_t w = 0;
    for (int i = 0; i < n; i++) {
        size_t pl = 0;
        if (kkv_tok_piece(t, back + w, 4 * len + 64 - w, &pl, ids[i]) != KKV_OK) __builtin_trap();
        w += pl;
    }
    int must = !bos;
    if (g_spm[which])
        for (size_t i = 0; i + 2 < len && must; i++) must = memcmp(text + i, "\xE2\x96\x81", 3) != 0;
    else
        for (size_t i = 0; i < len && must; i++) must = g_byte_ok[(uint8_t)text[i]];
    if (must && (w != len || memcmp(back, text, len))) __builtin_trap();
    free(ids);
    free(back);
    return 0;
}
