/* Weight formats and matmul: dequantization of known blocks, the scalar
 * kernels against a double-precision evaluation of their definition, AVX2
 * against scalar, and bit-identical rows whatever the batch size or thread
 * count.
 *
 * Extra modes (used by tests/oracle/test_weights.py, not by CTest):
 *   --dump MODEL TENSOR OUT        dequantize a tensor of a GGUF to raw f32
 *   --dequant TYPE IN OUT          dequantize raw blocks of a ggml type to f32
 *   --matmul MODEL TENSOR X N OUT  out[N][rows] = x[N][cols] @ W^T (raw f32)
 *   --sizes                        print the block size table
 *   --bench [MODEL]                time matmuls (scalar, AVX2, auto; 1 and 2 threads)
 *   --bench-stream                 the same on matrices larger than the caches
 * (batch sizes: KKV_BENCH_N=1,8,64 to choose, default 1,64) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu.h"
#include "core/fp16.h"
#include "core/threads.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "testutil.h"

/* CHECK and the summary come from testutil.h */

/* xorshift64*: deterministic test data */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd_u32(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return (uint32_t)((g_rng * 2685821657736338717ull) >> 32);
}
static float rnd_f(float lo, float hi) { return lo + (hi - lo) * (float)(rnd_u32() >> 8) / 16777216.0f; }

static void put_f16(uint8_t *p, float f) {
    uint16_t h = kkv_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* Weight rows of a type: [rows][row_bytes], every byte `fill` (or random
 * for fill < 0), then sane fp16 scales. */
static uint8_t *fill_weights(kkv_weight *w, uint32_t type, int64_t rows, int64_t cols, int fill) {
    size_t rb;
    if (kkv_wt_row_size(&rb, type, cols) != KKV_OK) return NULL;
    uint8_t *d = malloc(rb * (size_t)rows);
    for (size_t i = 0; i < rb * (size_t)rows; i++) d[i] = fill < 0 ? (uint8_t)rnd_u32() : (uint8_t)fill;
    size_t bb = kkv_wt_block_bytes(type);
    for (size_t off = 0; off < rb * (size_t)rows; off += bb) {
        uint8_t *b = d + off;
        switch (type) {
        case KKV_WT_F32: {
            float v = rnd_f(-1, 1);
            memcpy(b, &v, 4);
            break;
        }
        case KKV_WT_F16: put_f16(b, rnd_f(-1, 1)); break;
        case KKV_WT_Q4_0:
        case KKV_WT_Q8_0: put_f16(b, rnd_f(-0.05f, 0.05f)); break;
        case KKV_WT_Q4_1:
            put_f16(b, rnd_f(0, 0.05f));
            put_f16(b + 2, rnd_f(-0.4f, 0.0f));
            break;
        case KKV_WT_Q6_K: put_f16(b + 208, rnd_f(-0.002f, 0.002f)); break;
        case KKV_WT_BF16: {
            float v = rnd_f(-1, 1);
            uint32_t u;
            memcpy(&u, &v, 4);
            uint16_t h = (uint16_t)(u >> 16);
            memcpy(b, &h, 2);
            break;
        }
        case KKV_WT_Q5_0: put_f16(b, rnd_f(-0.05f, 0.05f)); break;
        case KKV_WT_Q5_1:
            put_f16(b, rnd_f(0, 0.03f));
            put_f16(b + 2, rnd_f(-0.4f, 0.0f));
            break;
        case KKV_WT_Q2_K:
            put_f16(b + 80, rnd_f(0, 0.01f));
            put_f16(b + 82, rnd_f(0, 0.01f));
            break;
        case KKV_WT_Q3_K: put_f16(b + 108, rnd_f(-0.003f, 0.003f)); break;
        case KKV_WT_Q4_K:
        case KKV_WT_Q5_K:
            put_f16(b, rnd_f(0, 0.002f));
            put_f16(b + 2, rnd_f(0, 0.005f));
            break;
        default: break;
        }
    }
    w->type = type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = rb;
    w->data = d;
    w->packed = NULL;
    w->pack_rows = 0;
    return d;
}

/* Random weight rows of a type: [rows][row_bytes], with sane fp16 scales. */
static uint8_t *rand_weights(kkv_weight *w, uint32_t type, int64_t rows, int64_t cols) {
    return fill_weights(w, type, rows, cols, -1);
}

static float *rand_x(int n, int64_t cols) {
    float *x = malloc(sizeof(float) * (size_t)n * (size_t)cols);
    for (size_t i = 0; i < (size_t)n * (size_t)cols; i++) x[i] = rnd_f(-2, 2);
    /* one block with a large outlier, one all-zero block: both edge cases of d */
    if (cols >= 64) {
        x[5] = 40.0f;
        for (int i = 32; i < 64; i++) x[i] = 0.0f;
    }
    return x;
}

/* ---- dequantization of hand-built blocks ---- */

static void test_dequant_known(void) {
    float y[256];
    kkv_weight w = {0};
    uint8_t b[256];

    /* Q4_0: d = 0.5; byte i = i | (15 - i) << 4 */
    put_f16(b, 0.5f);
    for (int i = 0; i < 16; i++) b[2 + i] = (uint8_t)(i | (15 - i) << 4);
    w = (kkv_weight){KKV_WT_Q4_0, 1, 32, 18, b, NULL, 0};
    kkv_wt_dequant_row(y, &w, 0);
    for (int i = 0; i < 16; i++) {
        CHECK(y[i] == (float)(i - 8) * 0.5f, "q4_0 y[%d] = %g", i, y[i]);
        CHECK(y[16 + i] == (float)(7 - i) * 0.5f, "q4_0 y[%d] = %g", 16 + i, y[16 + i]);
    }

    /* Q4_1: d = 0.25, m = -1 */
    put_f16(b, 0.25f);
    put_f16(b + 2, -1.0f);
    for (int i = 0; i < 16; i++) b[4 + i] = (uint8_t)(i | (15 - i) << 4);
    w = (kkv_weight){KKV_WT_Q4_1, 1, 32, 20, b, NULL, 0};
    kkv_wt_dequant_row(y, &w, 0);
    for (int i = 0; i < 16; i++) {
        CHECK(y[i] == (float)i * 0.25f - 1.0f, "q4_1 y[%d] = %g", i, y[i]);
        CHECK(y[16 + i] == (float)(15 - i) * 0.25f - 1.0f, "q4_1 y[%d] = %g", 16 + i, y[16 + i]);
    }

    /* Q8_0: d = 0.125, q = i - 16, second row scaled by 2 */
    for (int r = 0; r < 2; r++) {
        put_f16(b + 34 * r, 0.125f * (float)(r + 1));
        for (int i = 0; i < 32; i++) b[34 * r + 2 + i] = (uint8_t)(int8_t)(i - 16);
    }
    w = (kkv_weight){KKV_WT_Q8_0, 2, 32, 34, b, NULL, 0};
    kkv_wt_dequant_row(y, &w, 1);
    for (int i = 0; i < 32; i++) CHECK(y[i] == (float)(i - 16) * 0.25f, "q8_0 y[%d] = %g", i, y[i]);

    /* Q6_K: bytes set by hand from the ggml layout:
     * ql[0] = 0x21: element 0 low nibble 1, element 64 low bits 2;
     * qh[0] = 0xe4 (bit pairs 00,01,10,11 for elements 0, 32, 64, 96);
     * ql[32] = 0x0f: element 32 low bits 15, element 96 low bits 0;
     * ql[64] = 0x05 and qh[32] = 0x03: element 128 = 5 | 3 << 4 = 53;
     * scales[s] = s - 8; d = 0.5. Everything else zero. */
    memset(b, 0, 210);
    b[0] = 0x21;
    b[128] = 0xe4;
    b[32] = 0x0f;
    b[64] = 0x05;
    b[128 + 32] = 0x03;
    for (int s = 0; s < 16; s++) b[192 + s] = (uint8_t)(int8_t)(s - 8);
    put_f16(b + 208, 0.5f);
    w = (kkv_weight){KKV_WT_Q6_K, 1, 256, 210, b, NULL, 0};
    kkv_wt_dequant_row(y, &w, 0);
    CHECK(y[0] == 0.5f * -8.0f * (1 - 32), "q6_k y[0] = %g", y[0]);
    CHECK(y[32] == 0.5f * -6.0f * ((15 | 1 << 4) - 32), "q6_k y[32] = %g", y[32]);
    CHECK(y[64] == 0.5f * -4.0f * ((2 | 2 << 4) - 32), "q6_k y[64] = %g", y[64]);
    CHECK(y[96] == 0.5f * -2.0f * ((0 | 3 << 4) - 32), "q6_k y[96] = %g", y[96]);
    CHECK(y[128] == 0.5f * 0.0f * (53 - 32), "q6_k y[128] = %g", y[128]);
    CHECK(y[1] == 0.5f * -8.0f * -32.0f, "q6_k y[1] = %g", y[1]);
    CHECK(y[255] == 0.5f * 7.0f * -32.0f, "q6_k y[255] = %g", y[255]);

    /* Q4_K: the 12-byte scale/min packing, both halves of it.
     * scales[0] = 0xc5: sub-block 0 scale 5, top bits 3 of sub-block 4's scale;
     * scales[4] = 0x47: sub-block 0 min 7, top bits 1 of sub-block 4's min;
     * scales[8] = 0x53: sub-block 4 scale low 3, min low 5 -> scale 51, min 21.
     * qs[0] = 0x9a: element 0 = 10 (sub-block 0), element 32 = 9 (sub-block 1,
     * scale and min 0); qs[64] = 0x03: element 128 = 3. d = 0.5, dmin = 0.25. */
    memset(b, 0, 144);
    put_f16(b, 0.5f);
    put_f16(b + 2, 0.25f);
    b[4] = 0xc5;
    b[8] = 0x47;
    b[12] = 0x53;
    b[16] = 0x9a;
    b[16 + 64] = 0x03;
    w = (kkv_weight){KKV_WT_Q4_K, 1, 256, 144, b, NULL, 0};
    kkv_wt_dequant_row(y, &w, 0);
    CHECK(y[0] == 0.5f * 5 * 10 - 0.25f * 7, "q4_k y[0] = %g", y[0]);
    CHECK(y[1] == -0.25f * 7, "q4_k y[1] = %g", y[1]);
    CHECK(y[32] == 0.0f, "q4_k y[32] = %g", y[32]);
    CHECK(y[128] == 0.5f * 51 * 3 - 0.25f * 21, "q4_k y[128] = %g", y[128]);

    /* Q5_0: d = 0.5, bit 4 of element i is bit i of the little-endian qh:
     * qh = 0x80000001 sets elements 0 and 31; qs[15] = 0xf0 -> element 31 low 15. */
    memset(b, 0, 22);
    put_f16(b, 0.5f);
    b[2] = 0x01;
    b[5] = 0x80;
    b[6 + 15] = 0xf0;
    w = (kkv_weight){KKV_WT_Q5_0, 1, 32, 22, b, NULL, 0};
    kkv_wt_dequant_row(y, &w, 0);
    CHECK(y[0] == 0.0f && y[1] == -8.0f && y[31] == 7.5f, "q5_0 %g %g %g", y[0], y[1], y[31]);

    /* F16 / F32 */
    put_f16(b, 1.5f);
    put_f16(b + 2, -0.25f);
    w = (kkv_weight){KKV_WT_F16, 1, 2, 4, b, NULL, 0};
    kkv_wt_dequant_row(y, &w, 0);
    CHECK(y[0] == 1.5f && y[1] == -0.25f, "f16 %g %g", y[0], y[1]);
}

static void test_type_table(void) {
    CHECK(kkv_wt_block_elems(KKV_WT_Q4_1) == 32 && kkv_wt_block_bytes(KKV_WT_Q4_1) == 20, "q4_1");
    CHECK(kkv_wt_block_elems(KKV_WT_Q6_K) == 256 && kkv_wt_block_bytes(KKV_WT_Q6_K) == 210, "q6_k");
    CHECK(kkv_wt_block_bytes(KKV_WT_Q8_0) == 34 && kkv_wt_block_bytes(KKV_WT_Q4_0) == 18, "q8_0/q4_0");
    CHECK(kkv_wt_block_bytes(12) == 144 && kkv_wt_block_bytes(30) == 2 && kkv_wt_block_bytes(28) == 8, "k/bf16/f64");
    CHECK(kkv_wt_block_elems(4) == 0 && kkv_wt_block_elems(5) == 0 && kkv_wt_block_elems(1000) == 0, "retired ids");
    CHECK(kkv_wt_supported(KKV_WT_Q6_K) && kkv_wt_supported(KKV_WT_Q4_K) && kkv_wt_supported(KKV_WT_BF16) &&
              !kkv_wt_supported(16) && !kkv_wt_supported(4) && !kkv_wt_supported(9) /* Q8_1 */,
          "supported");
    CHECK(strcmp(kkv_wt_name(KKV_WT_Q4_1), "Q4_1") == 0, "name");
    size_t rb = 0;
    CHECK(kkv_wt_row_size(&rb, KKV_WT_Q4_1, 576) == KKV_OK && rb == 18 * 20, "row size");
    CHECK(kkv_wt_row_size(&rb, KKV_WT_Q4_1, 33) == KKV_ERR_FORMAT, "partial block");
    CHECK(kkv_wt_row_size(&rb, 4, 32) == KKV_ERR_UNSUPPORTED, "unknown type");
    CHECK(kkv_wt_row_size(&rb, KKV_WT_F32, INT64_MAX) != KKV_OK, "overflow");
}

static void test_q8x(void) {
    float x[64];
    kkv_q8x q[2];
    for (int i = 0; i < 32; i++) x[i] = (float)(i - 16);
    for (int i = 32; i < 64; i++) x[i] = 0.0f;
    kkv_q8x_quantize(q, x, 64);
    CHECK(q[0].d == 16.0f / 127.0f, "d = %g", q[0].d);
    CHECK(q[0].q[0] == -127 && q[0].q[16] == 0 && q[0].q[24] == 64, "q %d %d %d", q[0].q[0], q[0].q[16],
          q[0].q[24]); /* 8 * 127 / 16 = 63.5 rounds to even 64 */
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += q[0].q[i];
    CHECK(q[0].isum == s && q[0].s == q[0].d * (float)s, "sums");
    CHECK(q[1].d == 0.0f && q[1].isum == 0, "zero block");
    x[3] = NAN;
    kkv_q8x_quantize(q, x, 32);
    CHECK(isnan(q[0].d), "NaN block gives NaN scale");
}

/* The SIMD tables' quantizers give kkv_q8x_quantize's bytes: random blocks
 * of many magnitudes, halves that round to even, zeros, -0, tiny and
 * subnormal blocks, Inf and NaN, values at the clamp. */
static void test_q8x_simd(void) {
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
#if defined(__aarch64__)
    enum { NT = 2 };
    const kkv_wt_kernels *tabs[NT] = {&kkv_wt_kernels_neon, &kkv_wt_kernels_neon_dotprod};
    const int have[NT] = {kkv_cpu_get()->neon, kkv_cpu_get()->dotprod};
#else
    enum { NT = 3 };
    const kkv_wt_kernels *tabs[NT] = {&kkv_wt_kernels_avx2, &kkv_wt_kernels_vnni,
                                      &kkv_wt_kernels_avxvnni};
    const int have[NT] = {kkv_cpu_get()->avx2, kkv_cpu_get()->vnni, kkv_cpu_get()->avxvnni};
#endif
    enum { NB = 64 };
    float *x = malloc(sizeof(float) * 32 * NB); /* [NB][32] */
    kkv_q8x *ref = malloc(sizeof *ref * NB), *got = malloc(sizeof *got * NB);
    uint64_t st = 99;
    for (int round = 0; round < 50; round++) {
        for (int b = 0; b < NB; b++) {
            float scale = powf(2.0f, (float)((int)(b % 41) - 20)) * (round % 2 ? 1.0f : 3.7f);
            for (int i = 0; i < 32; i++) {
                st = st * 6364136223846793005ull + 1442695040888963407ull;
                float u = (float)((st >> 40) & 0xFFFFFF) / 16777216.0f * 2.0f - 1.0f;
                x[32 * b + i] = u * scale;
            }
        }
        /* special blocks */
        for (int i = 0; i < 32; i++) {
            x[i] = 0.0f;                                   /* all zero */
            x[32 + i] = (i % 2) ? -0.0f : 0.0f;            /* signed zeros */
            x[64 + i] = 1e-40f * (float)(i - 16);          /* subnormal */
            x[96 + i] = (float)(2 * i - 31) * 0.5f;        /* halves: ties to even */
            x[128 + i] = (float)(i - 16) * 3e38f / 16.0f;  /* near FLT_MAX */
            x[160 + i] = 1e-36f * (float)(i + 1);          /* d just above normal */
        }
        x[192 + round % 32] = INFINITY;
        x[224 + round % 32] = NAN;
        x[256 + round % 32] = -INFINITY;
        kkv_q8x_quantize(ref, x, 32 * NB);
        for (int t = 0; t < NT; t++) {
            if (!have[t]) continue;
            memset(got, 0x5a, sizeof *got * NB);
            tabs[t]->quantize(got, x, 32 * NB);
            int bad = 0;
            for (int b = 0; b < NB; b++) /* NaN scales compare by bits too */
                bad += memcmp(&ref[b], &got[b], sizeof ref[b]) != 0;
            CHECK(bad == 0, "quantizer of table %d differs from kkv_q8x_quantize in %d of %d "
                  "blocks (round %d)", t, bad, NB, round);
        }
    }
    free(x);
    free(ref);
    free(got);
#endif
}

/* The definition of the quantized matmul evaluated in double: the dot of the
 * dequantized row with the quantized activations. */
static double ref_dot(double *abs_sum, const kkv_weight *w, int64_t row, const float *x) {
    float *wr = malloc(sizeof(float) * (size_t)w->cols);
    kkv_wt_dequant_row(wr, w, row);
    int quant = w->type != KKV_WT_F32 && w->type != KKV_WT_F16 && w->type != KKV_WT_BF16;
    kkv_q8x *xq = malloc(sizeof(kkv_q8x) * (size_t)(w->cols / 32 + 1));
    if (quant) kkv_q8x_quantize(xq, x, w->cols);
    double acc = 0, abs = 0;
    for (int64_t i = 0; i < w->cols; i++) {
        double xv = quant ? (double)xq[i / 32].d * xq[i / 32].q[i % 32] : (double)x[i];
        acc += (double)wr[i] * xv;
        abs += fabs((double)wr[i] * xv);
    }
    free(wr);
    free(xq);
    *abs_sum = abs;
    return acc;
}

static const uint32_t TYPES[] = {KKV_WT_F32,  KKV_WT_F16,  KKV_WT_BF16, KKV_WT_Q4_0, KKV_WT_Q4_1,
                                 KKV_WT_Q5_0, KKV_WT_Q5_1, KKV_WT_Q8_0, KKV_WT_Q2_K, KKV_WT_Q3_K,
                                 KKV_WT_Q4_K, KKV_WT_Q5_K, KKV_WT_Q6_K};

static void test_kernels(void) {
    const int ns[] = {1, 3, 5, 17}; /* 5 and 17: the sixteen-row kernels where the CPU has them */
    const int64_t rows_list[] = {1, 7, 37, 8, 16, 9};
    int have_avx2 = kkv_cpu_get()->avx2;
    /* the SIMD table under test: AVX2 on x86 (AUTO's VNNI builds are held
     * to its bits below), NEON on aarch64 */
    const int have_simd = have_avx2 || kkv_cpu_get()->neon;
    const kkv_wt_impl simd = have_avx2 ? KKV_WT_IMPL_AVX2 : KKV_WT_IMPL_NEON;
    const char *simd_name = have_avx2 ? "avx2" : "neon";
    kkv_tp *tp3 = NULL;
    kkv_tp_create(&tp3, 3);
    for (size_t ti = 0; ti < sizeof TYPES / sizeof TYPES[0]; ti++) {
        uint32_t type = TYPES[ti];
        int be = kkv_wt_block_elems(type) < 32 ? 32 : kkv_wt_block_elems(type);
        const int64_t cols_list[] = {be, 3 * (int64_t)be, (576 / be > 0 ? 576 / be : 1) * (int64_t)be};
        for (int ci = 0; ci < 3; ci++) {
            int64_t cols = cols_list[ci];
            if (type == KKV_WT_F32 || type == KKV_WT_F16 || type == KKV_WT_BF16) cols += ci; /* odd lengths: SIMD tails */
            for (int ri = 0; ri < 6; ri++) {
                int64_t rows = rows_list[ri];
                kkv_weight w;
                uint8_t *wd = rand_weights(&w, type, rows, cols);
                for (int ni = 0; ni < 4; ni++) {
                    int n = ns[ni];
                    float *x = rand_x(n, cols);
                    float *os = malloc(sizeof(float) * (size_t)n * (size_t)rows);
                    float *oa = malloc(sizeof(float) * (size_t)n * (size_t)rows);
                    float *o1 = malloc(sizeof(float) * (size_t)rows);
                    CHECK(kkv_matmul_ex(NULL, os, &w, x, n, KKV_WT_IMPL_SCALAR) == KKV_OK, "scalar");
                    if (have_simd) CHECK(kkv_matmul_ex(tp3, oa, &w, x, n, simd) == KKV_OK, "%s", simd_name);
                    if (have_avx2) {
                        /* auto takes the VNNI build where the CPU has one: the
                         * same bits as AVX2 (KKV_CPU=avx2 makes auto AVX2) */
                        float *ov = malloc(sizeof(float) * (size_t)n * (size_t)rows);
                        CHECK(kkv_matmul_ex(tp3, ov, &w, x, n, KKV_WT_IMPL_AUTO) == KKV_OK, "auto");
                        CHECK(memcmp(ov, oa, sizeof(float) * (size_t)n * (size_t)rows) == 0,
                              "%s %lldx%lld n=%d: auto kernels (vnni %d, avx-vnni %d) differ from avx2",
                              kkv_wt_name(type), (long long)rows, (long long)cols, n,
                              kkv_cpu_get()->vnni, kkv_cpu_get()->avxvnni);
                        free(ov);
                    }
                    for (int j = 0; j < n; j++) {
                        for (int64_t r = 0; r < rows; r++) {
                            double abs;
                            double ref = ref_dot(&abs, &w, r, x + (size_t)j * (size_t)cols);
                            float s = os[(size_t)j * (size_t)rows + (size_t)r];
                            CHECK(fabs(s - ref) <= 1e-5 * abs + 1e-30, "%s %lldx%lld n=%d: scalar %.9g ref %.9g",
                                  kkv_wt_name(type), (long long)rows, (long long)cols, n, s, ref);
                            if (have_simd) {
                                float a = oa[(size_t)j * (size_t)rows + (size_t)r];
                                CHECK(fabs(a - s) <= 2e-5 * abs + 1e-30, "%s %lldx%lld n=%d: %s %.9g scalar %.9g",
                                      kkv_wt_name(type), (long long)rows, (long long)cols, n, simd_name, a, s);
                                /* the eight-row kernels keep the scalar order, and NEON
                                 * runs the other types with the scalar kernels: the same bits */
                                if (type == KKV_WT_Q4_0 || type == KKV_WT_Q4_1 || type == KKV_WT_Q8_0 || !have_avx2)
                                    CHECK(memcmp(&a, &s, sizeof a) == 0, "%s %lldx%lld n=%d row %lld: %s %.9g "
                                          "is not the scalar %.9g", kkv_wt_name(type), (long long)rows,
                                          (long long)cols, n, (long long)r, simd_name, a, s);
                            }
                        }
                        /* the same x vector alone, serial: bit-identical */
                        for (int pass = 0; pass <= have_simd; pass++) {
                            const kkv_wt_impl impl = pass ? simd : KKV_WT_IMPL_SCALAR;
                            const float *ob = pass ? oa : os;
                            kkv_matmul_ex(NULL, o1, &w, x + (size_t)j * (size_t)cols, 1, impl);
                            CHECK(memcmp(o1, ob + (size_t)j * (size_t)rows, sizeof(float) * (size_t)rows) == 0,
                                  "%s impl %d: row result depends on n/threads (n=%d j=%d)", kkv_wt_name(type),
                                  impl, n, j);
                        }
                    }
                    free(x);
                    free(os);
                    free(oa);
                    free(o1);
                }
                free(wd);
            }
        }
    }
    kkv_tp_free(tp3);
}

/* Packed weights (kkv_wt_pack, groups of 8 and 16): through every kernel
 * set (AVX2 reads groups of 8; AUTO those of 16 where the CPU has AVX-512
 * VNNI, else of 8; a group size a set does not read falls back to the
 * unpacked rows), the scalar kernels' bits on the unpacked rows, for short
 * last groups, batch sizes across the 8-column groups and 1 or 3 threads. */
static void test_packed(void) {
    const uint32_t types[] = {KKV_WT_Q4_0, KKV_WT_Q4_1, KKV_WT_Q8_0, KKV_WT_Q5_0, KKV_WT_Q5_1, KKV_WT_Q4_K,
                              KKV_WT_Q5_K, KKV_WT_Q6_K};
    const int64_t rows_list[] = {1, 15, 16, 17, 40};
    const int64_t cols_list[] = {32, 96, 576};
    const int64_t kcols_list[] = {256, 512, 768}; /* K-quants: whole 256-value super-blocks */
    const int ns[] = {1, 2, 5, 10, 17};
    int have_avx2 = kkv_cpu_get()->avx2;
    kkv_tp *tp3 = NULL;
    kkv_tp_create(&tp3, 3);
    for (int R = 8; R <= 16; R += 8)
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
        for (int ci = 0; ci < 3; ci++)
            for (int ri = 0; ri < 5; ri++) {
                int64_t rows = rows_list[ri], cols = kkv_wt_block_elems(types[ti]) == 256 ? kcols_list[ci] : cols_list[ci];
                kkv_weight w;
                uint8_t *wd = rand_weights(&w, types[ti], rows, cols);
                size_t pb = 0;
                CHECK(kkv_wt_packed_size(&pb, &w, R) == KKV_OK, "packed size");
                CHECK(pb == (size_t)((rows + R - 1) / R * R) * w.row_bytes, "%s %lld rows: packed size %zu",
                      kkv_wt_name(w.type), (long long)rows, pb);
                uint8_t *pk = malloc(pb);
                CHECK(kkv_wt_pack(pk, &w, R) == KKV_OK, "pack");
                kkv_weight wp = w;
                wp.packed = pk;
                wp.pack_rows = R;
                for (int ni = 0; ni < 5; ni++) {
                    int n = ns[ni];
                    size_t bytes = sizeof(float) * (size_t)n * (size_t)rows;
                    float *x = rand_x(n, cols), *os = malloc(bytes), *op = malloc(bytes);
                    CHECK(kkv_matmul_ex(NULL, os, &w, x, n, KKV_WT_IMPL_SCALAR) == KKV_OK, "scalar");
                    for (int impl = KKV_WT_IMPL_AUTO; impl <= KKV_WT_IMPL_AVX2; impl++) {
                        if (impl == KKV_WT_IMPL_SCALAR || (impl == KKV_WT_IMPL_AVX2 && !have_avx2)) continue;
                        for (int th = 0; th < 2; th++) {
                            memset(op, 0xff, bytes);
                            CHECK(kkv_matmul_ex(th ? tp3 : NULL, op, &wp, x, n, (kkv_wt_impl)impl) == KKV_OK, "packed");
                            CHECK(memcmp(op, os, bytes) == 0, "%s %lldx%lld n=%d impl %d threads %d: packed "
                                  "by %d differs from scalar", kkv_wt_name(w.type), (long long)rows, (long long)cols,
                                  n, impl, th ? 3 : 1, R);
                        }
                    }
                    free(x);
                    free(os);
                    free(op);
                }
                free(pk);
                free(wd);
            }
    kkv_tp_free(tp3);
    /* types without a packed layout */
    kkv_weight w;
    uint8_t *wd = rand_weights(&w, KKV_WT_Q3_K, 16, 256);
    size_t pb = 1;
    CHECK(kkv_wt_packed_size(&pb, &w, 16) == KKV_OK && pb == 0, "Q3_K has no packed layout");
    uint8_t one[16];
    CHECK(kkv_wt_pack(one, &w, 16) == KKV_ERR_UNSUPPORTED, "pack Q3_K refused");
    CHECK(strstr(kkv_last_error(), "Q3_K") != NULL, "error names the type: %s", kkv_last_error());
    free(wd);
    wd = rand_weights(&w, KKV_WT_Q4_1, 16, 32);
    CHECK(kkv_wt_packed_size(&pb, &w, 12) == KKV_ERR_INVALID_ARG, "groups of 12 refused");
    CHECK(kkv_wt_pack(wd, &w, 4) == KKV_ERR_INVALID_ARG && strstr(kkv_last_error(), "8 or 16"),
          "groups of 4 refused: %s", kkv_last_error());
    free(wd);
}

/* The integer sums at their largest: every code at its type's maximum (all
 * code bytes 0xFF: Q4 15, Q5 31, Q6_K 63; Q8_0's 0x80, -128, where one
 * vpmaddubsw pair already reaches 32512) against x vectors whose every
 * Q8 value is +127 or -127, packed, through every kernel set, give the
 * scalar kernels' bits. The row-block kernels add vpmaddubsw pairs in int16
 * as far as these extremes allow (weights_rows_body.h); one register too
 * many wraps, and this fails. */
static void test_packed_extremes(void) {
    const uint32_t types[] = {KKV_WT_Q4_0, KKV_WT_Q4_1, KKV_WT_Q8_0, KKV_WT_Q5_0, KKV_WT_Q5_1, KKV_WT_Q4_K,
                              KKV_WT_Q5_K, KKV_WT_Q6_K};
    const int n = 8; /* the kernels' widest unrolled batch */
    for (int R = 8; R <= 16; R += 8)
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++)
            for (int sign = -1; sign <= 1; sign += 2) {
                int64_t rows = 16, cols = kkv_wt_block_elems(types[ti]) == 256 ? 512 : 576;
                kkv_weight w;
                uint8_t *wd = fill_weights(&w, types[ti], rows, cols, types[ti] == KKV_WT_Q8_0 ? 0x80 : 0xFF);
                size_t pb = 0;
                CHECK(kkv_wt_packed_size(&pb, &w, R) == KKV_OK && pb > 0, "packed size");
                uint8_t *pk = malloc(pb);
                CHECK(kkv_wt_pack(pk, &w, R) == KKV_OK, "pack");
                kkv_weight wp = w;
                wp.packed = pk;
                wp.pack_rows = R;
                size_t bytes = sizeof(float) * (size_t)n * (size_t)rows;
                float *x = malloc(sizeof(float) * (size_t)n * (size_t)cols), *os = malloc(bytes), *op = malloc(bytes);
                for (int64_t i = 0; i < n * cols; i++) x[i] = (float)sign * (1.0f + 0.5f * (float)(i / cols));
                CHECK(kkv_matmul_ex(NULL, os, &w, x, n, KKV_WT_IMPL_SCALAR) == KKV_OK, "scalar");
                for (int impl = KKV_WT_IMPL_AUTO; impl <= KKV_WT_IMPL_AVX2; impl++) {
                    if (impl == KKV_WT_IMPL_SCALAR || (impl == KKV_WT_IMPL_AVX2 && !kkv_cpu_get()->avx2)) continue;
                    memset(op, 0xff, bytes);
                    CHECK(kkv_matmul_ex(NULL, op, &wp, x, n, (kkv_wt_impl)impl) == KKV_OK, "packed");
                    CHECK(memcmp(op, os, bytes) == 0, "%s, every code at its maximum, x %s127, impl %d, packed by %d: "
                          "differs from scalar (%g against %g)", kkv_wt_name(w.type), sign < 0 ? "-" : "+", impl, R,
                          (double)op[0], (double)os[0]);
                }
                free(x);
                free(os);
                free(op);
                free(pk);
                free(wd);
            }
}

/* Batch-size and thread-count invariance on a model-sized matrix through the
 * public entry point, including n that are not multiples of the kernel group. */
static void test_invariance(void) {
    kkv_tp *tp2 = NULL, *tp4 = NULL;
    kkv_tp_create(&tp2, 2);
    kkv_tp_create(&tp4, 4);
    const uint32_t types[] = {KKV_WT_Q4_1, KKV_WT_Q8_0, KKV_WT_Q6_K, KKV_WT_Q5_0, KKV_WT_Q5_1,
                              KKV_WT_Q2_K, KKV_WT_Q3_K, KKV_WT_Q4_K, KKV_WT_Q5_K, KKV_WT_BF16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        kkv_weight w;
        int64_t rows = 301, cols = kkv_wt_block_elems(types[ti]) == 256 ? 512 : 576;
        uint8_t *wd = rand_weights(&w, types[ti], rows, cols);
        int n = 23;
        float *x = rand_x(n, cols);
        float *full = malloc(sizeof(float) * (size_t)n * (size_t)rows);
        float *part = malloc(sizeof(float) * (size_t)n * (size_t)rows);
        CHECK(kkv_matmul_ex(NULL, full, &w, x, n, KKV_WT_IMPL_AUTO) == KKV_OK, "matmul failed");
        kkv_tp *pools[] = {NULL, tp2, tp4};
        for (int p = 0; p < 3; p++) {
            /* split the batch as 1 + 6 + 5 + 11 */
            const int cuts[] = {0, 1, 7, 12, 23};
            for (int c = 0; c < 4; c++)
                CHECK(kkv_matmul_ex(pools[p], part + (size_t)cuts[c] * (size_t)rows, &w,
                                    x + (size_t)cuts[c] * (size_t)cols, cuts[c + 1] - cuts[c],
                                    KKV_WT_IMPL_AUTO) == KKV_OK,
                      "matmul failed");
            CHECK(memcmp(full, part, sizeof(float) * (size_t)n * (size_t)rows) == 0,
                  "%s: pool %d / batch split changes results", kkv_wt_name(types[ti]), p);
        }
        /* NaN in x propagates to that x vector's outputs only */
        x[7] = NAN;
        CHECK(kkv_matmul_ex(tp2, part, &w, x, 2, KKV_WT_IMPL_AUTO) == KKV_OK, "matmul failed");
        CHECK(isnan(part[0]) && isnan(part[rows - 1]) && !isnan(part[rows]), "NaN propagation");
        free(wd);
        free(x);
        free(full);
        free(part);
    }
    /* bad weights are refused */
    kkv_weight bad = {KKV_WT_Q4_1, 2, 33, 20, NULL, NULL, 0};
    float o[4], xx[66] = {0};
    CHECK(kkv_matmul_ex(NULL, o, &bad, xx, 1, KKV_WT_IMPL_AUTO) == KKV_ERR_INVALID_ARG, "bad cols");
    bad = (kkv_weight){16, 2, 256, 66, NULL, NULL, 0};
    CHECK(kkv_matmul_ex(NULL, o, &bad, xx, 1, KKV_WT_IMPL_AUTO) == KKV_ERR_UNSUPPORTED, "IQ2_XXS not computable");
    CHECK(strstr(kkv_last_error(), "IQ2_XXS") != NULL, "error names the type: %s", kkv_last_error());
    kkv_tp_free(tp2);
    kkv_tp_free(tp4);
}

/* ---- tool modes ---- */

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    size_t w = fwrite(p, 1, n, f);
    return (fclose(f) != 0 || w != n);
}

static void *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(sz > 0 ? (size_t)sz : 1);
    *n = fread(p, 1, (size_t)sz, f);
    fclose(f);
    return p;
}

static int open_weight(kkv_gguf **g, kkv_weight *w, const char *model, const char *tensor) {
    if (kkv_gguf_open(g, model) != KKV_OK) {
        fprintf(stderr, "%s\n", kkv_last_error());
        return 1;
    }
    const kkv_gguf_tensor *t = kkv_gguf_find_tensor(*g, tensor);
    if (!t) {
        fprintf(stderr, "no tensor %s\n", tensor);
        return 1;
    }
    if (t->n_dims == 1) {
        /* a 1-D tensor as one row */
        kkv_gguf_tensor t2 = *t;
        t2.ne[1] = 1;
        if (kkv_weight_from_tensor(w, &t2) != KKV_OK) {
            fprintf(stderr, "%s\n", kkv_last_error());
            return 1;
        }
        return 0;
    }
    if (kkv_weight_from_tensor(w, t) != KKV_OK) {
        fprintf(stderr, "%s\n", kkv_last_error());
        return 1;
    }
    return 0;
}

static int mode_dump(const char *model, const char *tensor, const char *outp) {
    kkv_gguf *g = NULL;
    kkv_weight w;
    if (open_weight(&g, &w, model, tensor)) return 1;
    float *out = malloc(sizeof(float) * (size_t)w.rows * (size_t)w.cols);
    for (int64_t r = 0; r < w.rows; r++) kkv_wt_dequant_row(out + (size_t)r * (size_t)w.cols, &w, r);
    int rc = write_file(outp, out, sizeof(float) * (size_t)w.rows * (size_t)w.cols);
    free(out);
    kkv_gguf_close(g);
    return rc;
}

static int mode_dequant(const char *type_s, const char *inp, const char *outp) {
    uint32_t type = (uint32_t)atoi(type_s);
    size_t n = 0;
    uint8_t *in = read_file(inp, &n);
    size_t bb = kkv_wt_block_bytes(type);
    if (!in || !kkv_wt_supported(type) || n % bb != 0 || n == 0) {
        fprintf(stderr, "bad --dequant input\n");
        free(in);
        return 1;
    }
    int64_t be = kkv_wt_block_elems(type), blocks = (int64_t)(n / bb);
    kkv_weight w = {type, 1, blocks * be, n, in, NULL, 0};
    float *out = malloc(sizeof(float) * (size_t)w.cols);
    kkv_wt_dequant_row(out, &w, 0);
    int rc = write_file(outp, out, sizeof(float) * (size_t)w.cols);
    free(out);
    free(in);
    return rc;
}

static int mode_matmul(const char *model, const char *tensor, const char *xp, const char *n_s, const char *outp) {
    kkv_gguf *g = NULL;
    kkv_weight w;
    if (open_weight(&g, &w, model, tensor)) return 1;
    int n = atoi(n_s);
    size_t xn = 0;
    float *x = read_file(xp, &xn);
    if (!x || n <= 0 || xn != sizeof(float) * (size_t)n * (size_t)w.cols) {
        fprintf(stderr, "bad --matmul x file\n");
        return 1;
    }
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)w.rows);
    kkv_tp *tp = NULL;
    kkv_tp_create(&tp, 2);
    if (kkv_matmul_ex(tp, out, &w, x, n, KKV_WT_IMPL_AUTO) != KKV_OK) {
        fprintf(stderr, "matmul: %s\n", kkv_last_error());
        kkv_tp_free(tp);
        free(out);
        free(x);
        return 1;
    }
    int rc = write_file(outp, out, sizeof(float) * (size_t)n * (size_t)w.rows);
    kkv_tp_free(tp);
    free(out);
    free(x);
    kkv_gguf_close(g);
    return rc;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Batch sizes the benches time: KKV_BENCH_N (comma-separated, 1..256) or 1,64. */
static int bench_ns(int *ns, int cap) {
    const char *e = getenv("KKV_BENCH_N");
    int k = 0;
    for (const char *p = e; p && *p && k < cap;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 256 || (*end && *end != ',')) {
            fprintf(stderr, "KKV_BENCH_N: '%s' is not a list of sizes 1..256; using 1,64\n", e);
            k = 0;
            break;
        }
        ns[k++] = (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    if (k == 0) {
        ns[k++] = 1;
        ns[k++] = 64;
    }
    return k;
}

static void bench_one(const kkv_weight *w, const char *label) {
    static int ns[16], n_ns; /* parsed once: one message for a bad list */
    if (!n_ns) n_ns = bench_ns(ns, 16);
    for (int ni = 0; ni < n_ns; ni++) {
        int n = ns[ni];
        float *x = rand_x(n, w->cols);
        float *out = malloc(sizeof(float) * (size_t)n * (size_t)w->rows);
        /* the last two: the same weights packed (kkv_wt_pack: by 8 for avx2, by
         * the AUTO set's group size for auto), where they can be */
        const kkv_wt_impl impls[] = {KKV_WT_IMPL_SCALAR, KKV_WT_IMPL_AVX2, KKV_WT_IMPL_AUTO,
                                     KKV_WT_IMPL_AVX2, KKV_WT_IMPL_AUTO};
        const char *names[] = {"scalar", "avx2", "auto", "avx2+p", "auto+p"};
        uint8_t *pk[2] = {NULL, NULL}; /* [avx2, auto] */
        const int pr[2] = {8, kkv_wt_pack_rows()};
        for (int i = 0; i < 2; i++) {
            size_t pb = 0;
            if (pr[i] && kkv_wt_packed_size(&pb, w, pr[i]) == KKV_OK && pb && (pk[i] = malloc(pb)) &&
                kkv_wt_pack(pk[i], w, pr[i]) != KKV_OK) {
                free(pk[i]);
                pk[i] = NULL;
            }
        }
        for (int ii = 0; ii < 5; ii++) {
            kkv_wt_impl impl = impls[ii];
            if (impl == KKV_WT_IMPL_AVX2 && !kkv_cpu_get()->avx2) continue;
            if (ii >= 3 && !pk[ii - 3]) continue;
            kkv_weight wb = *w;
            wb.packed = ii >= 3 ? pk[ii - 3] : NULL;
            wb.pack_rows = ii >= 3 ? pr[ii - 3] : 0;
            for (int th = 1; th <= 2; th++) {
                kkv_tp *tp = NULL;
                kkv_tp_create(&tp, th);
                /* best of repeated calls: the machine may be shared */
                int reps = 0;
                double start = now_s(), per = 1e30;
                do {
                    double t0 = now_s();
                    kkv_matmul_ex(tp, out, &wb, x, n, impl);
                    double t = now_s() - t0;
                    if (t < per) per = t;
                    reps++;
                } while (now_s() - start < 0.5 && reps < 1000);
                double gflops = 2.0 * (double)n * (double)w->rows * (double)w->cols / per * 1e-9;
                double gbs = (double)w->rows * (double)w->row_bytes / per * 1e-9;
                printf("%-28s %-6s n=%-3d threads=%d  %8.3f ms  %7.2f GFLOP/s  %6.2f GB/s weights\n", label,
                       names[ii], n, th, per * 1e3, gflops, gbs);
                kkv_tp_free(tp);
            }
        }
        free(pk[0]);
        free(pk[1]);
        free(x);
        free(out);
    }
}

/* bench_one on random weights of a type. */
static void bench_random(const char *what, uint32_t type, int64_t rows, int64_t cols) {
    kkv_weight w;
    uint8_t *d = rand_weights(&w, type, rows, cols);
    char label[64];
    snprintf(label, sizeof label, "%s %s %lldx%lld", what, kkv_wt_name(type), (long long)w.rows,
             (long long)w.cols);
    bench_one(&w, label);
    free(d);
}

static int mode_bench(const char *model) {
    kkv_gguf *g = NULL;
    kkv_weight w;
    if (model && open_weight(&g, &w, model, "token_embd.weight") == 0) {
        char label[64];
        snprintf(label, sizeof label, "token_embd %s %lldx%lld", kkv_wt_name(w.type), (long long)w.rows,
                 (long long)w.cols);
        bench_one(&w, label);
        kkv_weight w2;
        kkv_gguf *g2 = NULL;
        if (open_weight(&g2, &w2, model, "blk.0.ffn_up.weight") == 0) {
            snprintf(label, sizeof label, "ffn_up %s %lldx%lld", kkv_wt_name(w2.type), (long long)w2.rows,
                     (long long)w2.cols);
            bench_one(&w2, label);
        }
        kkv_gguf_close(g2);
        kkv_gguf_close(g);
    }
    const uint32_t types[] = {KKV_WT_Q4_1, KKV_WT_Q8_0, KKV_WT_Q4_0, KKV_WT_Q6_K, KKV_WT_F16,
                              KKV_WT_Q4_K, KKV_WT_Q5_K, KKV_WT_Q2_K, KKV_WT_Q3_K, KKV_WT_Q5_0,
                              KKV_WT_Q5_1, KKV_WT_BF16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        bench_random("random", types[i], 4096,
                     576 / kkv_wt_block_elems(types[i]) * kkv_wt_block_elems(types[i]) == 576 ? 576 : 512);
    return 0;
}

/* Matrices larger than the last-level cache (~150 MB of Q8_0, 85 MB of
 * Q4_1), so every call streams its weights from DRAM as a decode step does. */
static int mode_bench_stream(void) {
    bench_random("stream", KKV_WT_Q8_0, 262144, 576);
    bench_random("stream", KKV_WT_Q4_1, 262144, 576);
    bench_random("stream", KKV_WT_Q4_1, 98304, 1536);
    return 0;
}

/* KKV_WT_PF=l2|nta (set by the test_weights_pf_* runs) must reach the hint
 * the kernels read, and KKV_CPU=neon (test_weights_nodotprod) must take sdot
 * away; the rest of this test then checks the bits under them. */
static void test_env_caps(void) {
    const char *cap = getenv("KKV_CPU");
    if (cap && strcmp(cap, "neon") == 0) CHECK(kkv_cpu_get()->dotprod == 0, "KKV_CPU=neon left dotprod on");
    const char *pf = getenv("KKV_WT_PF");
    if (pf && strcmp(pf, "l2") == 0) CHECK(kkv_cpu_get()->wt_pf_l2 == 1, "KKV_WT_PF=l2 not applied");
    if (pf && strcmp(pf, "nta") == 0) CHECK(kkv_cpu_get()->wt_pf_l2 == 0, "KKV_WT_PF=nta not applied");
}

int main(int argc, char **argv) {
    if (argc >= 5 && strcmp(argv[1], "--dump") == 0) return mode_dump(argv[2], argv[3], argv[4]);
    if (argc >= 5 && strcmp(argv[1], "--dequant") == 0) return mode_dequant(argv[2], argv[3], argv[4]);
    if (argc >= 7 && strcmp(argv[1], "--matmul") == 0)
        return mode_matmul(argv[2], argv[3], argv[4], argv[5], argv[6]);
    if (argc == 2 && strcmp(argv[1], "--sizes") == 0) {
        for (uint32_t t = 0; t < 64; t++)
            if (kkv_wt_block_elems(t)) printf("%u %s %d %zu\n", t, kkv_wt_name(t), kkv_wt_block_elems(t), kkv_wt_block_bytes(t));
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--bench") == 0) return mode_bench(argc >= 3 ? argv[2] : NULL);
    if (argc >= 2 && strcmp(argv[1], "--bench-stream") == 0) return mode_bench_stream();

    test_env_caps();
    test_type_table();
    test_dequant_known();
    test_q8x();
    test_q8x_simd();
    test_kernels();
    test_packed();
    test_packed_extremes();
    test_invariance();
    if (!kkv_cpu_get()->avx2 && !kkv_cpu_get()->neon)
        printf("note: no AVX2 or NEON kernels here; SIMD comparisons skipped\n");
    else if (kkv_cpu_get()->neon)
        printf("NEON weight kernels checked against the scalar ones (%s)\n",
               kkv_cpu_get()->dotprod ? "with sdot" : "without sdot");
    if (tu_failed()) return tu_summary();
    return tu_summary();
}
