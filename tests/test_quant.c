/* Unit tests of group quantization and the page codecs (docs/FORMAT.md sections 1-2),
 * method tables and parameter validation, through the public API only
 * (core/fp16.h supplies the fp16 rounding the expectations need). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/fp16.h"
#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_model.h"
#include "testutil.h"

#define KEY_G 128

/* ---------------------------------------------------------------- page reading */

typedef struct key_view {
    const uint8_t *lo, *hi, *idx, *scale, *mn;
} key_view;

/* Splits a key page into its parts, per the layout in kittykv.h. */
static key_view key_parts(const uint8_t *page, int D, int G, int nb) {
    key_view v;
    v.lo = page;
    v.hi = v.lo + (size_t)D * G / 4;
    v.idx = v.hi + (size_t)nb * G / 4;
    v.scale = v.idx + D;
    v.mn = v.scale + 2 * (size_t)D;
    return v;
}

static float half_at(const uint8_t *p, int i) {
    return kkv_f16_to_f32((uint16_t)(p[2 * i] | (p[2 * i + 1] << 8)));
}

/* Code of channel j, token t, per spec 5: lo | hi << 2. */
static int key_code(const key_view *v, int G, int nb, int j, int t) {
    int q = (v->lo[(size_t)j * G / 4 + t / 4] >> (2 * (t % 4))) & 3;
    if (v->idx[j] < nb) q |= ((v->hi[(size_t)v->idx[j] * G / 4 + t / 4] >> (2 * (t % 4))) & 3) << 2;
    return q;
}

/* ---------------------------------------------------------------- tests */

static void test_status(void) {
    const char *seen[16];
    for (int s = KKV_OK; s <= KKV_ERR_CTX_FULL; s++) {
        const char *n = kkv_status_str((kkv_status)s);
        CHECK(n && *n && strcmp(n, "unknown status"), "status %d has no name", s);
        seen[s] = n ? n : "";
        for (int t = 0; t < s; t++)
            CHECK(strcmp(seen[t], seen[s]), "statuses %d and %d share the name '%s'", t, s, seen[s]);
    }
    CHECK(kkv_status_str((kkv_status)1234) != NULL, "unknown status gives NULL");
    CHECK(kkv_last_error() != NULL, "kkv_last_error NULL");
}

static void test_methods(void) {
    const char *const *names = kkv_method_names();
    const char *want[] = {"fp16", "kivi-k2v2", "kivi-k2v2s", "kivi-k4v2s", "kivi-k2v4s",
                          "kivi-k4v4", "kitty", "kitty-pro", "kitty-plus", "kitty-plus-pro",
                          "kivi-k8v8"};
    /* docs/FORMAT.md section 1: fp16, sink, value bits, boosted channels of 64 and 128 */
    const int tab[11][5] = {
        {1, 0, -1, 0, 0},  {0, 0, 2, 0, 0},  {0, 32, 2, 0, 0}, {0, 32, 2, 64, 128},
        {0, 32, 4, 0, 0}, {0, 0, 4, 64, 128}, {0, 32, 2, 8, 16}, {0, 32, 2, 16, 32},
        {0, 32, 2, 20, 40}, {0, 32, 2, 33, 66}, {0, 0, 8, 0, 0},
    };
    int n = 0;
    while (names[n]) n++;
    CHECK(n == 11, "kkv_method_names has %d names, want 11", n);
    for (int i = 0; i < 11 && i < n; i++) {
        CHECK(!strcmp(names[i], want[i]), "name %d is '%s', want '%s'", i, names[i], want[i]);
        kkv_method m;
        kkv_status s = kkv_method_from_name(&m, want[i]);
        CHECK(s == KKV_OK, "method %s: %s", want[i], kkv_last_error());
        if (s != KKV_OK) continue;
        CHECK(m.fp16 == tab[i][0], "%s: fp16 %d", want[i], m.fp16);
        CHECK(kkv_method_check(&m, 64) == KKV_OK, "%s fails its own check: %s", want[i],
              kkv_last_error());
        if (m.fp16) continue;
        /* kitty-plus-pro spends 32 window values on boosted channels */
        /* kivi-k8v8 keeps no fp16 window */
        CHECK(m.sink == tab[i][1] && m.group == 128 &&
                  m.window == (i == 9 ? 96 : i == 10 ? 0 : 128) &&
                  m.key_bits == (i == 10 ? 8 : 2) &&
                  m.value_bits == tab[i][2] && m.select == KKV_SELECT_MAGNITUDE,
              "%s: S=%d G=%d R=%d vbits=%d sel=%d", want[i], m.sink, m.group, m.window,
              m.value_bits, (int)m.select);
        CHECK(kkv_method_boost(&m, 64) == tab[i][3] && kkv_method_boost(&m, 128) == tab[i][4],
              "%s: boost %d/%d of 64/128, want %d/%d", want[i], kkv_method_boost(&m, 64),
              kkv_method_boost(&m, 128), tab[i][3], tab[i][4]);
    }
    kkv_method m;
    CHECK(kkv_method_from_name(&m, "kitty-max") == KKV_ERR_NOT_FOUND, "unknown name accepted");
    CHECK(*kkv_last_error(), "no message after unknown method");
    CHECK(kkv_method_from_name(&m, "KITTY") == KKV_ERR_NOT_FOUND, "names are case-sensitive");
    CHECK(kkv_method_from_name(&m, "") == KKV_ERR_NOT_FOUND, "empty name accepted");
}

static void test_validation(void) {
    kkv_method base;
    kkv_method_from_name(&base, "kitty");
    const int bad_dims[] = {0, -4, 2, 6, 10, 63, 258, 260, 512};
    for (size_t i = 0; i < sizeof bad_dims / sizeof *bad_dims; i++) {
        CHECK(kkv_method_check(&base, bad_dims[i]) == KKV_ERR_INVALID_ARG,
              "head_dim %d accepted", bad_dims[i]);
        CHECK(*kkv_last_error(), "no message for head_dim %d", bad_dims[i]);
    }
    const int good_dims[] = {4, 8, 12, 64, 96, 128, 256};
    for (size_t i = 0; i < sizeof good_dims / sizeof *good_dims; i++)
        CHECK(kkv_method_check(&base, good_dims[i]) == KKV_OK, "head_dim %d rejected: %s",
              good_dims[i], kkv_last_error());
    const float bad_alpha[] = {-0.001f, 1.0001f, 1.5f, -INFINITY, INFINITY, NAN};
    for (size_t i = 0; i < sizeof bad_alpha / sizeof *bad_alpha; i++) {
        kkv_method m = base;
        m.alpha = bad_alpha[i];
        CHECK(kkv_method_check(&m, 64) == KKV_ERR_INVALID_ARG, "alpha %g accepted",
              (double)bad_alpha[i]);
    }
    const float good_alpha[] = {0.0f, 0.3f, 1.0f};
    for (size_t i = 0; i < sizeof good_alpha / sizeof *good_alpha; i++) {
        kkv_method m = base;
        m.alpha = good_alpha[i];
        CHECK(kkv_method_check(&m, 64) == KKV_OK, "alpha %g rejected", (double)good_alpha[i]);
    }
    const int bad_group[] = {0, 2, 6, 130, 4097, 8192, -128};
    for (size_t i = 0; i < sizeof bad_group / sizeof *bad_group; i++) {
        kkv_method m = base;
        m.group = bad_group[i];
        CHECK(kkv_method_check(&m, 64) == KKV_ERR_INVALID_ARG, "group %d accepted", bad_group[i]);
    }
    const int bad_vbits[] = {0, 1, 3, 6, 16};
    for (size_t i = 0; i < sizeof bad_vbits / sizeof *bad_vbits; i++) {
        kkv_method m = base;
        m.value_bits = bad_vbits[i];
        CHECK(kkv_method_check(&m, 64) == KKV_ERR_INVALID_ARG, "value_bits %d accepted",
              bad_vbits[i]);
    }
    const int bad_kbits[] = {1, 3, 4, 16, -2};
    for (size_t i = 0; i < sizeof bad_kbits / sizeof *bad_kbits; i++) {
        kkv_method m = base;
        m.key_bits = bad_kbits[i];
        CHECK(kkv_method_check(&m, 64) == KKV_ERR_INVALID_ARG, "key_bits %d accepted",
              bad_kbits[i]);
    }
    {
        kkv_method m = base; /* 8-bit keys have no boost */
        m.key_bits = 8;
        m.alpha = m.alpha > 0.0f ? m.alpha : 0.125f;
        CHECK(kkv_method_check(&m, 64) == KKV_ERR_INVALID_ARG, "key_bits 8 with a boost accepted");
        m.alpha = 0.0f;
        CHECK(kkv_method_check(&m, 64) == KKV_OK, "key_bits 8: %s", kkv_last_error());
    }
    kkv_method m = base;
    m.sink = -1;
    CHECK(kkv_method_check(&m, 64) == KKV_ERR_INVALID_ARG, "sink -1 accepted");
    m = base;
    m.window = -1;
    CHECK(kkv_method_check(&m, 64) == KKV_ERR_INVALID_ARG, "window -1 accepted");
    m = base;
    m.select = (kkv_select)9;
    CHECK(kkv_method_check(&m, 64) == KKV_ERR_INVALID_ARG, "select 9 accepted");
    CHECK(kkv_method_check(NULL, 64) == KKV_ERR_INVALID_ARG, "NULL method accepted");

    /* boost = round(alpha * D) */
    m = base;
    m.alpha = 0.3f;
    CHECK(kkv_method_boost(&m, 64) == 19 && kkv_method_boost(&m, 128) == 38,
          "alpha 0.3: boost %d/%d, want 19/38", kkv_method_boost(&m, 64), kkv_method_boost(&m, 128));

    /* cache_create: every bad config fails with *out = NULL */
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = 64,
                            .pool_bytes = 1 << 20, .method = base};
    kkv_cache_config bad[7];
    for (int i = 0; i < 7; i++) bad[i] = cfg;
    bad[0].head_dim = 6;
    bad[1].head_dim = 260;
    bad[2].n_layers = 0;
    bad[3].n_kv_heads = 0;
    bad[4].method.alpha = NAN;
    bad[5].method.value_bits = 3;
    bad[6].method.group = 6;
    for (int i = 0; i < 7; i++) {
        kkv_cache *c = (kkv_cache *)&cfg; /* any non-NULL value */
        kkv_status s = kkv_cache_create(&c, &bad[i]);
        CHECK(s == KKV_ERR_INVALID_ARG && c == NULL, "bad config %d: status %d", i, (int)s);
        CHECK(*kkv_last_error(), "bad config %d: no message", i);
        if (s == KKV_OK) kkv_cache_free(c);
    }
    CHECK(kkv_cache_create(NULL, &cfg) == KKV_ERR_INVALID_ARG, "NULL out accepted");
    kkv_cache_free(NULL); /* must not crash */

    /* page codecs validate too */
    uint8_t page[8192];
    float k[KEY_G * 8];
    for (int i = 0; i < KEY_G * 8; i++) k[i] = (float)i;
    CHECK(kkv_key_page_encode(page, k, 6, KEY_G, 1, KKV_SELECT_MAGNITUDE, 0, 0, NULL) ==
              KKV_ERR_INVALID_ARG, "key page with D=6 accepted");
    CHECK(kkv_key_page_encode(page, k, 8, 6, 1, KKV_SELECT_MAGNITUDE, 0, 0, NULL) ==
              KKV_ERR_INVALID_ARG, "key page with G=6 accepted");
    CHECK(kkv_key_page_encode(page, k, 8, KEY_G, 9, KKV_SELECT_MAGNITUDE, 0, 0, NULL) ==
              KKV_ERR_INVALID_ARG, "key page with n_boost > D accepted");
    CHECK(kkv_key_page_encode(page, k, 8, KEY_G, 1, KKV_SELECT_EXPLICIT, 0, 0, NULL) ==
              KKV_ERR_INVALID_ARG, "explicit selection without rank accepted");
    CHECK(kkv_value_page_encode(page, k, 8, KEY_G, 3) == KKV_ERR_INVALID_ARG,
          "value page with 3 bits accepted");
    CHECK(kkv_key_page_bytes(64, 128, 65) == 0,
          "page_bytes of n_boost > D is not 0");
    CHECK(kkv_value_page_bytes(64, 128, 3) == 0, "value page bytes of 3 bits not 0");
    /* a corrupt idx byte is a format error, not an out-of-bounds read */
    CHECK(kkv_key_page_encode(page, k, 8, KEY_G, 2, KKV_SELECT_MAGNITUDE, 0, 0, NULL) == KKV_OK,
          "encode: %s", kkv_last_error());
    page[8 * KEY_G / 4 + 2 * KEY_G / 4] = 200;
    float out[KEY_G * 8];
    CHECK(kkv_key_page_decode(out, page, 8, KEY_G, 2) == KKV_ERR_FORMAT,
          "decode of idx 200 with n_boost 2 not rejected");
}

/* Spec 5 byte counts. */
static void test_page_bytes(void) {
    {
        kkv_method a, b, f;
        kkv_method_from_name(&a, "kitty");
        kkv_method_from_name(&b, "kivi-k8v8");
        kkv_method_from_name(&f, "fp16");
        CHECK(kkv_method_key_page_bytes(&a, 64, 8) == 2624 &&
                  kkv_method_key_page_bytes(&b, 64, 8) == 64 * 128 + 4 * 64 &&
                  kkv_method_key_page_bytes(&f, 64, 8) == 64 * 128 * 2 &&
                  kkv_method_key_page_bytes(NULL, 64, 8) == 0 &&
                  kkv_method_key_page_bytes(&a, 64, 65) == 0,
              "method key page bytes: kitty %zu, kivi-k8v8 %zu, fp16 %zu",
              kkv_method_key_page_bytes(&a, 64, 8), kkv_method_key_page_bytes(&b, 64, 8),
              kkv_method_key_page_bytes(&f, 64, 8));
    }
    CHECK(kkv_key_page_bytes(64, 128, 8) == 2624, "kitty D=64 key page %zu, want 2624",
          kkv_key_page_bytes(64, 128, 8));
    CHECK(kkv_key_page_bytes(64, 128, 16) == 2880, "kitty-pro D=64 key page %zu, want 2880",
          kkv_key_page_bytes(64, 128, 16));
    CHECK(kkv_key_page_bytes(64, 128, 0) == 2048 + 64 + 256, "K2 page %zu",
          kkv_key_page_bytes(64, 128, 0));
    CHECK(kkv_key_page_bytes(64, 128, 64) == 2048 + 2048 + 64 + 256, "K4 page %zu",
          kkv_key_page_bytes(64, 128, 64));
    CHECK(kkv_key_page_bytes(128, 128, 16) == 4096 + 512 + 128 + 512, "kitty D=128 key page %zu",
          kkv_key_page_bytes(128, 128, 16));
    CHECK(kkv_value_page_bytes(64, 128, 2) == 2560, "V2 D=64 value page %zu",
          kkv_value_page_bytes(64, 128, 2));
    CHECK(kkv_value_page_bytes(64, 128, 4) == 4096 + 512, "V4 D=64 value page %zu",
          kkv_value_page_bytes(64, 128, 4));
    CHECK(kkv_value_page_bytes(12, 8, 4) == 8 * 6 + 32, "V4 D=12 G=8 value page %zu",
          kkv_value_page_bytes(12, 8, 4));
    /* 2624 B = 2.5625 bits per key element (spec: 2.56) */
    CHECK(fabs(8.0 * 2624 / (64 * 128) - 2.5625) < 1e-12, "kitty bits/element");
}

/* Packing bit positions, with codes chosen through the data: channel j holds
 * integers 0..maxq so that scale16 = 1, mn16 = 0 and the code is the value. */
static void test_key_packing(void) {
    enum { D = 8, G = 16, NB = 3 };
    float k[G * D];
    int code[D][G];
    tu_rng r = tu_rng_make(7);
    /* explicit ranking: channel 5 is rank 0, 2 rank 1, 7 rank 2 */
    const uint8_t rank[D] = {5, 2, 7, 0, 1, 3, 4, 6};
    for (int j = 0; j < D; j++) {
        int boosted = j == 5 || j == 2 || j == 7;
        int maxq = boosted ? 15 : 3;
        for (int t = 0; t < G; t++) code[j][t] = tu_int(&r, maxq + 1);
        code[j][0] = 0; /* pin min and max so scale = 1 and mn = 0 */
        code[j][1] = maxq;
        for (int t = 0; t < G; t++) k[t * D + j] = (float)code[j][t];
    }
    size_t bytes = kkv_key_page_bytes(D, G, NB);
    uint8_t page[1024];
    memset(page, 0xAB, sizeof page);
    kkv_status s = kkv_key_page_encode(page, k, D, G, NB, KKV_SELECT_EXPLICIT, 0, 0, rank);
    CHECK(s == KKV_OK, "encode: %s", kkv_last_error());
    CHECK(page[bytes] == 0xAB, "encode wrote past kkv_key_page_bytes()");
    key_view v = key_parts(page, D, G, NB);
    for (int j = 0; j < D; j++) {
        int want_idx = j == 5 ? 0 : j == 2 ? 1 : j == 7 ? 2 : NB;
        CHECK(v.idx[j] == want_idx, "idx[%d] = %d, want %d", j, v.idx[j], want_idx);
        CHECK(half_at(v.scale, j) == 1.0f && half_at(v.mn, j) == 0.0f,
              "channel %d: scale %g mn %g", j, (double)half_at(v.scale, j),
              (double)half_at(v.mn, j));
        for (int b = 0; b < G / 4; b++) {
            int lo = 0, hi = 0;
            for (int t = 4 * b; t < 4 * b + 4; t++) {
                lo |= (code[j][t] & 3) << (2 * (t % 4));
                hi |= (code[j][t] >> 2) << (2 * (t % 4));
            }
            CHECK(v.lo[j * G / 4 + b] == lo, "lo[%d][%d] = 0x%02x, want 0x%02x", j, b,
                  v.lo[j * G / 4 + b], lo);
            if (want_idx < NB)
                CHECK(v.hi[want_idx * G / 4 + b] == hi, "hi[%d][%d] = 0x%02x, want 0x%02x",
                      want_idx, b, v.hi[want_idx * G / 4 + b], hi);
        }
    }
    float out[G * D];
    CHECK(kkv_key_page_decode(out, page, D, G, NB) == KKV_OK, "decode: %s", kkv_last_error());
    CHECK(!memcmp(out, k, sizeof k), "integer keys do not round-trip exactly");

    /* magnitude selection: hi row r belongs to the r-th largest mean |k|;
     * channels 3 and 6 tie, so 3 (lower index) ranks first */
    for (int t = 0; t < G; t++)
        for (int j = 0; j < D; j++) k[t * D + j] = 0.25f * (float)((t + j) % 3);
    for (int t = 0; t < G; t++) {
        k[t * D + 3] = t % 2 ? 40.0f : -40.0f;
        k[t * D + 6] = t % 2 ? -40.0f : 40.0f;
        k[t * D + 1] = t % 3 ? 30.0f : 10.0f;
    }
    CHECK(kkv_key_page_encode(page, k, D, G, NB, KKV_SELECT_MAGNITUDE, 0, 0, NULL) == KKV_OK,
          "encode: %s", kkv_last_error());
    CHECK(v.idx[3] == 0 && v.idx[6] == 1 && v.idx[1] == 2, "magnitude idx 3/6/1 = %d/%d/%d",
          v.idx[3], v.idx[6], v.idx[1]);
    /* variance: 3 and 6 tie again (equal spread, opposite sign: 25600 each),
     * then channel 1 (values 10/30: 1500) */
    CHECK(kkv_key_page_encode(page, k, D, G, NB, KKV_SELECT_VARIANCE, 0, 0, NULL) == KKV_OK,
          "encode: %s", kkv_last_error());
    CHECK(v.idx[3] == 0 && v.idx[6] == 1 && v.idx[1] == 2, "variance idx 3/6/1 = %d/%d/%d",
          v.idx[3], v.idx[6], v.idx[1]);
    /* idx of a page is a bijection between boosted channels and 0..nb-1 */
    int seen[NB + 1] = {0};
    for (int j = 0; j < D; j++) seen[v.idx[j] <= NB ? v.idx[j] : NB]++;
    CHECK(seen[0] == 1 && seen[1] == 1 && seen[2] == 1 && seen[NB] == D - NB,
          "idx is not a bijection onto 0..nb-1 plus sentinels");
}

static void test_value_packing(void) {
    enum { D = 12, G = 8 };
    for (int bits = 2; bits <= 4; bits += 2) {
        int maxq = (1 << bits) - 1;
        float v[G * D];
        int code[G][D];
        tu_rng r = tu_rng_make(11u + (unsigned)bits);
        for (int t = 0; t < G; t++) {
            for (int c = 0; c < D; c++) code[t][c] = tu_int(&r, maxq + 1);
            code[t][3] = 0;
            code[t][8] = maxq;
            for (int c = 0; c < D; c++) v[t * D + c] = (float)code[t][c] - 2.0f; /* mn = -2 */
        }
        uint8_t page[512];
        memset(page, 0xCD, sizeof page);
        size_t bytes = kkv_value_page_bytes(D, G, bits);
        CHECK(kkv_value_page_encode(page, v, D, G, bits) == KKV_OK, "encode: %s",
              kkv_last_error());
        CHECK(page[bytes] == 0xCD, "value encode wrote past the page");
        int per = 8 / bits;
        size_t row = (size_t)D / per;
        for (int t = 0; t < G; t++) {
            for (size_t b = 0; b < row; b++) {
                int want = 0;
                for (int c = (int)b * per; c < (int)(b + 1) * per; c++)
                    want |= code[t][c] << (bits * (c % per));
                CHECK(page[t * row + b] == want, "%d-bit value byte [%d][%zu] 0x%02x, want 0x%02x",
                      bits, t, b, page[t * row + b], want);
            }
            CHECK(half_at(page + G * row, t) == 1.0f && half_at(page + G * row + 2 * G, t) == -2.0f,
                  "%d-bit token %d: scale %g mn %g", bits, t, (double)half_at(page + G * row, t),
                  (double)half_at(page + G * row + 2 * G, t));
        }
        float out[G * D];
        CHECK(kkv_value_page_decode(out, page, D, G, bits) == KKV_OK, "decode");
        CHECK(!memcmp(out, v, sizeof v), "%d-bit integer values do not round-trip", bits);
    }
}

/* The error bound of section 3 for one decoded element.
 *
 * Let m = mn16 (= mn exactly: groups are made of fp16 values, and fp16 holds
 * every fp16 min), s = scale16 = fp16(fp32((mx - mn) / maxq)) and
 * s* = (mx - mn) / maxq exactly. For x in [mn, mx], y = (x - m) / s:
 *  - if round(y) <= maxq the code is the nearest grid point: |x - x'| <= s/2;
 *  - otherwise the code is clamped to maxq (only when s < s*) and
 *    x - x' <= mx - m - maxq*s = maxq*(s* - s);
 *  - s = 0 (constant group, or s* below half the smallest subnormal):
 *    x' = m and |x - x'| <= mx - mn = maxq*s*.
 * So |x - x'| <= s/2 + maxq*|s - s*|, where |s - s*| is the fp16 rounding of
 * the scale (<= 2^-11 s* for normal s, <= 2^-25 for subnormal) plus two fp32
 * roundings. On top come the fp32 roundings of (x - m), of the division, of
 * + 0.5 (which can move a near-half y to the other grid point: an extra
 * O(ulp) beyond s/2) and of the decode's q*s + m (q*s is exact: <= 4+11
 * significant bits); all are below 4 ulp of max(|mn|, |mx|), so slack
 * 2^-21 * max(|mn|, |mx|) covers them. */
static double qbound(double mn, double mx, double s, int maxq) {
    double sstar = (mx - mn) / maxq;
    double amax = fabs(mn) > fabs(mx) ? fabs(mn) : fabs(mx);
    return s / 2 + maxq * fabs(s - sstar) + ldexp(amax, -21);
}

static void test_bounds(void) {
    enum { D = 64, G = 128 };
    static float k[G * D], kr[G * D], out[G * D];
    static uint8_t page[8192];
    const int nbs[] = {0, 8, 16, 64};
    tu_rng r = tu_rng_make(99);
    long worst_ratio_ppm = 0;
    for (int trial = 0; trial < 24; trial++) {
        /* ranges from subnormal to beyond fp16 */
        double mag = ldexp(1.0, -30 + trial * 2);
        for (int i = 0; i < G * D; i++) {
            float x = (float)(mag * tu_normal(&r) + (trial % 3 ? 0.0 : 3.0 * mag));
            k[i] = x;
            kr[i] = kkv_f16_round(x);
        }
        int nb = nbs[trial % 4];
        kkv_status s = kkv_key_page_encode(page, k, D, G, nb, KKV_SELECT_MAGNITUDE, 0, 0, NULL);
        CHECK(s == KKV_OK, "encode: %s", kkv_last_error());
        CHECK(kkv_key_page_decode(out, page, D, G, nb) == KKV_OK, "decode: %s", kkv_last_error());
        key_view v = key_parts(page, D, G, nb);
        int bad = 0;
        for (int j = 0; j < D && !bad; j++) {
            int boosted = v.idx[j] < nb, maxq = boosted ? 15 : 3;
            CHECK(v.idx[j] <= nb, "idx[%d] = %d > nb %d", j, v.idx[j], nb);
            double mn = INFINITY, mx = -INFINITY;
            for (int t = 0; t < G; t++) {
                mn = fmin(mn, kr[t * D + j]);
                mx = fmax(mx, kr[t * D + j]);
            }
            double sc = half_at(v.scale, j), m16 = half_at(v.mn, j);
            CHECK(m16 == mn, "trial %d ch %d: mn16 %g != group min %g", trial, j, m16, mn);
            double b = qbound(mn, mx, sc, maxq);
            for (int t = 0; t < G; t++) {
                int q = key_code(&v, G, nb, j, t);
                double x = kr[t * D + j], xd = out[t * D + j];
                if (q > maxq || (float)((float)q * (float)sc + (float)m16) != out[t * D + j] ||
                    fabs(x - xd) > b) {
                    CHECK(0, "trial %d ch %d tok %d: x %.9g x' %.9g code %d (max %d) bound %.3g",
                          trial, j, t, x, xd, q, maxq, b);
                    bad = 1;
                    break;
                }
                if (sc >= ldexp(1.0, -14)) { /* normal scale: rounding is relative */
                    long ppm = (long)(1e6 * fabs(x - xd) / (sc / 2));
                    worst_ratio_ppm = ppm > worst_ratio_ppm ? ppm : worst_ratio_ppm;
                }
            }
        }
        CHECK(!bad, "bound violated in trial %d", trial);
    }
    /* the bound is tight: the worst error is close to scale/2 */
    CHECK(worst_ratio_ppm > 900000 && worst_ratio_ppm < 1020000,
          "worst |x - x'| / (scale/2) = %.4f, expected about 1", worst_ratio_ppm / 1e6);

    /* values: the same bound per token, 2 and 4 bits */
    for (int bits = 2; bits <= 4; bits += 2) {
        for (int i = 0; i < G * D; i++) {
            k[i] = 5.0f * tu_normal(&r);
            kr[i] = kkv_f16_round(k[i]);
        }
        CHECK(kkv_value_page_encode(page, k, D, G, bits) == KKV_OK, "encode");
        CHECK(kkv_value_page_decode(out, page, D, G, bits) == KKV_OK, "decode");
        const uint8_t *sc16 = page + (size_t)G * D * bits / 8, *mn16 = sc16 + 2 * G;
        int bad = 0;
        for (int t = 0; t < G && !bad; t++) {
            double mn = INFINITY, mx = -INFINITY;
            for (int c = 0; c < D; c++) {
                mn = fmin(mn, kr[t * D + c]);
                mx = fmax(mx, kr[t * D + c]);
            }
            double b = qbound(mn, mx, half_at(sc16, t), (1 << bits) - 1);
            CHECK(half_at(mn16, t) == mn, "value token %d: mn16 != min", t);
            for (int c = 0; c < D; c++)
                if (fabs(kr[t * D + c] - out[t * D + c]) > b) {
                    CHECK(0, "%d-bit value t %d c %d: |%g - %g| > %g", bits, t, c,
                          (double)kr[t * D + c], (double)out[t * D + c], b);
                    bad = 1;
                    break;
                }
        }
    }
}

/* Constant groups (scale 0 -> codes 0, decode == mn exactly), out-of-range
 * clamping and non-finite rejection in the page codecs. */
static void test_special(void) {
    enum { D = 8, G = 16 };
    float k[G * D], out[G * D];
    uint8_t page[512], before[512];
    tu_rng r = tu_rng_make(3);
    for (int t = 0; t < G; t++)
        for (int j = 0; j < D; j++) k[t * D + j] = tu_normal(&r);
    for (int t = 0; t < G; t++) {
        k[t * D + 2] = 3.14159f;      /* constant channel */
        k[t * D + 5] = -1e-9f;        /* constant, rounds to fp16 zero */
        k[t * D + 6] = t == 4 ? 1e6f : t == 9 ? -FLT_MAX : 0.5f; /* beyond fp16 */
    }
    /* channel 2 boosted (rank 0) to test the 4-bit constant path too */
    const uint8_t rank[D] = {2, 6, 0, 1, 3, 4, 5, 7};
    CHECK(kkv_key_page_encode(page, k, D, G, 2, KKV_SELECT_EXPLICIT, 0, 0, rank) == KKV_OK,
          "encode: %s", kkv_last_error());
    CHECK(kkv_key_page_decode(out, page, D, G, 2) == KKV_OK, "decode");
    key_view v = key_parts(page, D, G, 2);
    CHECK(v.scale[4] == 0 && v.scale[5] == 0 && v.scale[10] == 0 && v.scale[11] == 0,
          "constant channels 2 and 5 do not have scale16 == 0");
    for (int t = 0; t < G; t++) {
        CHECK(key_code(&v, G, 2, 2, t) == 0 && key_code(&v, G, 2, 5, t) == 0,
              "constant channel code not 0 at token %d", t);
        CHECK(out[t * D + 2] == kkv_f16_round(3.14159f), "constant decode %.9g != mn16 %.9g",
              (double)out[t * D + 2], (double)kkv_f16_round(3.14159f));
        CHECK(out[t * D + 5] == 0.0f, "constant -1e-9 decodes to %g", (double)out[t * D + 5]);
    }
    CHECK(half_at(v.mn, 6) == -65504.0f, "mn of a channel with -FLT_MAX is %g, want -65504",
          (double)half_at(v.mn, 6));
    CHECK(out[9 * D + 6] == -65504.0f, "-FLT_MAX decodes to %g", (double)out[9 * D + 6]);
    CHECK(fabs(out[4 * D + 6] - 65504.0) <= 65504.0 / 15 / 2 * 1.01,
          "1e6 decodes to %g (want within scale/2 of 65504)", (double)out[4 * D + 6]);
    for (int i = 0; i < G * D; i++) CHECK(isfinite(out[i]), "non-finite decode at %d", i);

    /* constant value tokens */
    float vals[G * D];
    for (int i = 0; i < G * D; i++) vals[i] = tu_normal(&r);
    for (int c = 0; c < D; c++) vals[3 * D + c] = -7.77f;
    for (int bits = 2; bits <= 4; bits += 2) {
        CHECK(kkv_value_page_encode(page, vals, D, G, bits) == KKV_OK, "encode");
        CHECK(kkv_value_page_decode(out, page, D, G, bits) == KKV_OK, "decode");
        const uint8_t *codes = page + (size_t)3 * D * bits / 8;
        int zero = 1;
        for (int b = 0; b < D * bits / 8; b++) zero &= codes[b] == 0;
        CHECK(zero, "%d-bit constant token has non-zero codes", bits);
        for (int c = 0; c < D; c++)
            CHECK(out[3 * D + c] == kkv_f16_round(-7.77f), "%d-bit constant token decodes to %g",
                  bits, (double)out[3 * D + c]);
    }

    /* NaN / Inf: KKV_ERR_NONFINITE and the destination untouched */
    const float poison[] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        memcpy(k, vals, sizeof k);
        k[(i * 37) % (G * D)] = poison[i];
        memset(page, 0x5A, sizeof page);
        memcpy(before, page, sizeof page);
        CHECK(kkv_key_page_encode(page, k, D, G, 2, KKV_SELECT_MAGNITUDE, 0, 0, NULL) ==
                  KKV_ERR_NONFINITE, "key page accepted %g", (double)poison[i]);
        CHECK(*kkv_last_error(), "no message");
        CHECK(!memcmp(page, before, sizeof page), "key page written despite %g", (double)poison[i]);
        CHECK(kkv_value_page_encode(page, k, D, G, 2) == KKV_ERR_NONFINITE,
              "value page accepted %g", (double)poison[i]);
        CHECK(!memcmp(page, before, sizeof page), "value page written despite %g",
              (double)poison[i]);
    }
}

/* Subnormal and tiny ranges: scale underflows to 0 or a subnormal. */
static void test_tiny(void) {
    enum { D = 4, G = 8 };
    float k[G * D], out[G * D];
    uint8_t page[256];
    for (int t = 0; t < G; t++) {
        k[t * D + 0] = (float)t * ldexpf(1.0f, -24); /* 0..7 smallest subnormals */
        k[t * D + 1] = 1.0f + (t == 3 ? ldexpf(1.0f, -10) : 0.0f); /* one ulp step */
        k[t * D + 2] = ldexpf(1.0f, -24) * (t % 2); /* scale 2^-24/3 underflows */
        k[t * D + 3] = -2.0f;
    }
    CHECK(kkv_key_page_encode(page, k, D, G, 0, KKV_SELECT_MAGNITUDE, 0, 0, NULL) == KKV_OK,
          "encode");
    CHECK(kkv_key_page_decode(out, page, D, G, 0) == KKV_OK, "decode");
    key_view v = key_parts(page, D, G, 0);
    for (int j = 0; j < D; j++) {
        double mn = INFINITY, mx = -INFINITY;
        for (int t = 0; t < G; t++) {
            mn = fmin(mn, k[t * D + j]);
            mx = fmax(mx, k[t * D + j]);
        }
        double b = qbound(mn, mx, half_at(v.scale, j), 3);
        for (int t = 0; t < G; t++)
            CHECK(fabs(k[t * D + j] - out[t * D + j]) <= b, "tiny ch %d t %d: %g vs %g (bound %g)",
                  j, t, (double)k[t * D + j], (double)out[t * D + j], b);
    }
    CHECK(v.scale[4] == 0 && v.scale[5] == 0, "2^-24/3 scale did not underflow to 0");
}

int main(void) {
    test_status();
    test_methods();
    test_validation();
    test_page_bytes();
    test_key_packing();
    test_value_packing();
    test_bounds();
    test_special();
    test_tiny();
    return tu_summary();
}
