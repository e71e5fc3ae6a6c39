/* ggml weight formats: block sizes, dequantization, the scalar (reference)
 * dot kernels and the threaded matmul driver. The SIMD kernels live in
 * weights_avx2.c and must follow the arithmetic defined here. */
#include "model/weights.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/fp16.h"
#include "core/status.h"
#include "model/gguf.h"

/* ---- type table ---- */

typedef struct wt_info {
    const char *name;
    int         elems; /* per block */
    int         bytes; /* per block */
} wt_info;

/* Indexed by ggml type id; zero entries are ids ggml retired or never used.
 * Q8_1 is 36 bytes (fp16 d and s) as in current ggml; 40 was the size when d
 * and s were fp32. */
static const wt_info WT_INFO[] = {
    [0] = {"F32", 1, 4},       [1] = {"F16", 1, 2},
    [2] = {"Q4_0", 32, 18},    [3] = {"Q4_1", 32, 20},
    [6] = {"Q5_0", 32, 22},    [7] = {"Q5_1", 32, 24},
    [8] = {"Q8_0", 32, 34},    [9] = {"Q8_1", 32, 36},
    [10] = {"Q2_K", 256, 84},  [11] = {"Q3_K", 256, 110},
    [12] = {"Q4_K", 256, 144}, [13] = {"Q5_K", 256, 176},
    [14] = {"Q6_K", 256, 210}, [15] = {"Q8_K", 256, 292},
    [16] = {"IQ2_XXS", 256, 66}, [17] = {"IQ2_XS", 256, 74},
    [18] = {"IQ3_XXS", 256, 98}, [19] = {"IQ1_S", 256, 50},
    [20] = {"IQ4_NL", 32, 18},   [21] = {"IQ3_S", 256, 110},
    [22] = {"IQ2_S", 256, 82},   [23] = {"IQ4_XS", 256, 136},
    [24] = {"I8", 1, 1},       [25] = {"I16", 1, 2},
    [26] = {"I32", 1, 4},      [27] = {"I64", 1, 8},
    [28] = {"F64", 1, 8},      [29] = {"IQ1_M", 256, 56},
    [30] = {"BF16", 1, 2},
    [34] = {"TQ1_0", 256, 54}, [35] = {"TQ2_0", 256, 66},
    [39] = {"MXFP4", 32, 17},
};
#define WT_N_INFO (sizeof WT_INFO / sizeof WT_INFO[0])

int kkv_wt_block_elems(uint32_t type) {
    return type < WT_N_INFO ? WT_INFO[type].elems : 0;
}

size_t kkv_wt_block_bytes(uint32_t type) {
    return type < WT_N_INFO ? (size_t)WT_INFO[type].bytes : 0;
}

const char *kkv_wt_name(uint32_t type) {
    return (type < WT_N_INFO && WT_INFO[type].name) ? WT_INFO[type].name : "unknown";
}

kkv_status kkv_wt_row_size(size_t *out, uint32_t type, int64_t cols) {
    int be = kkv_wt_block_elems(type);
    if (be == 0) return kkv_fail(KKV_ERR_UNSUPPORTED, "unknown ggml type %u", type);
    if (cols <= 0 || cols % be != 0)
        return kkv_fail(KKV_ERR_FORMAT, "row of %lld %s values is not a whole number of %d-value blocks",
                        (long long)cols, kkv_wt_name(type), be);
    uint64_t blocks = (uint64_t)(cols / be), bb = kkv_wt_block_bytes(type);
    if (blocks > SIZE_MAX / bb)
        return kkv_fail(KKV_ERR_FORMAT, "row of %lld %s values overflows size_t", (long long)cols,
                        kkv_wt_name(type));
    *out = (size_t)(blocks * bb);
    return KKV_OK;
}

kkv_status kkv_weight_from_tensor(kkv_weight *out, const struct kkv_gguf_tensor *t) {
    if (!kkv_wt_supported(t->type))
        return kkv_fail(KKV_ERR_UNSUPPORTED, "tensor '%.*s': cannot compute with type %s (%u)",
                        (int)(t->name.len > 200 ? 200 : t->name.len), t->name.ptr,
                        kkv_wt_name(t->type), t->type);
    if (t->ne[2] != 1 || t->ne[3] != 1)
        return kkv_fail(KKV_ERR_FORMAT, "tensor '%.*s' is not 2-D (ne = %lld x %lld x %lld x %lld)",
                        (int)(t->name.len > 200 ? 200 : t->name.len), t->name.ptr,
                        (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                        (long long)t->ne[3]);
    size_t rb;
    KKV_TRY(kkv_wt_row_size(&rb, t->type, t->ne[0]));
    if (t->ne[1] <= 0 || (uint64_t)t->ne[1] > SIZE_MAX / rb || rb * (size_t)t->ne[1] != t->nbytes)
        return kkv_fail(KKV_ERR_FORMAT, "tensor '%.*s': byte size does not match its shape",
                        (int)(t->name.len > 200 ? 200 : t->name.len), t->name.ptr);
    out->type = t->type;
    out->rows = t->ne[1];
    out->cols = t->ne[0];
    out->row_bytes = rb;
    out->data = t->data;
    out->packed = NULL;
    out->pack_rows = 0;
    return KKV_OK;
}

/* ---- little-endian field readers (blocks are unaligned in the mapping) ---- */

static inline float ld_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kkv_f16_to_f32(h);
}

/* ---- dequantization (the layouts of ggml's block_* structs) ---- */

/* Q4_0: fp16 d, 16 bytes; low nibbles are values 0..15, high nibbles 16..31. */
static void deq_q4_0(float *y, const uint8_t *b) {
    float d = ld_f16(b);
    const uint8_t *qs = b + 2;
    for (int i = 0; i < 16; i++) {
        y[i] = (float)((int)(qs[i] & 15) - 8) * d;
        y[i + 16] = (float)((int)(qs[i] >> 4) - 8) * d;
    }
}

/* Q4_1: fp16 d, fp16 m, 16 bytes of nibbles; value = d * q + m. */
static void deq_q4_1(float *y, const uint8_t *b) {
    float d = ld_f16(b), m = ld_f16(b + 2);
    const uint8_t *qs = b + 4;
    for (int i = 0; i < 16; i++) {
        y[i] = (float)(qs[i] & 15) * d + m;
        y[i + 16] = (float)(qs[i] >> 4) * d + m;
    }
}

/* Q8_0: fp16 d, 32 int8. */
static void deq_q8_0(float *y, const uint8_t *b) {
    float d = ld_f16(b);
    for (int i = 0; i < 32; i++) y[i] = (float)(int8_t)b[2 + i] * d;
}

/* The 6-bit quant (0..63) of element e (0..255) of a Q6_K block: low 4 bits
 * from ql, high 2 bits from qh; each 128-value half uses 64 ql and 32 qh
 * bytes, with the four 32-value quarters taking ql low/low/high/high nibbles
 * (ql bytes 0..31, 32..63, 0..31, 32..63) and qh bit pairs 0,1,2,3. */
static inline int q6k_quant(const uint8_t *blk, int e) {
    int half = e >> 7, quarter = (e >> 5) & 3, l = e & 31;
    const uint8_t *ql = blk + half * 64 + (quarter & 1) * 32;
    const uint8_t *qh = blk + 128 + half * 32;
    int lo = (quarter & 2) ? (ql[l] >> 4) : (ql[l] & 15);
    int hi = (qh[l] >> (2 * quarter)) & 3;
    return lo | (hi << 4);
}

/* Q6_K: ql[128], qh[64], int8 scales[16] (one per 16 values), fp16 d;
 * value = d * scale * (q - 32). */
static void deq_q6_k(float *y, const uint8_t *b) {
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = ld_f16(b + 208);
    for (int e = 0; e < 256; e++) y[e] = d * (float)sc[e / 16] * (float)(q6k_quant(b, e) - 32);
}

/* BF16: the top half of an fp32. */
static inline float ld_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The 5-bit quant (0..31) of element i of a Q5_0/Q5_1 block: low nibble as
 * in Q4 (qs), bit 4 is bit i of the little-endian 32-bit qh. */
static inline int q5_quant(const uint8_t *qh, const uint8_t *qs, int i) {
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    int lo = i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
    return lo | (int)((h >> i) & 1) << 4;
}

/* Q5_0: fp16 d, qh[4], qs[16]; value = d * (q - 16). */
static void deq_q5_0(float *y, const uint8_t *b) {
    float d = ld_f16(b);
    for (int i = 0; i < 32; i++) y[i] = d * (float)(q5_quant(b + 2, b + 6, i) - 16);
}

/* Q5_1: fp16 d, fp16 m, qh[4], qs[16]; value = d * q + m. */
static void deq_q5_1(float *y, const uint8_t *b) {
    float d = ld_f16(b), m = ld_f16(b + 2);
    for (int i = 0; i < 32; i++) y[i] = d * (float)q5_quant(b + 4, b + 8, i) + m;
}

/* Q2_K: scales[16] (low nibble scale, high nibble min, one per 16 values),
 * qs[64], fp16 d, fp16 dmin. Element e: half h = e/128 uses qs[32h..32h+31],
 * quarter j = (e%128)/32 takes bit pair j of qs[32h + e%32]. */
static inline int q2k_quant(const uint8_t *blk, int e) {
    return (blk[16 + 32 * (e >> 7) + (e & 31)] >> (2 * ((e >> 5) & 3))) & 3;
}

static void deq_q2_k(float *y, const uint8_t *b) {
    float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
    for (int s = 0; s < 16; s++) {
        float dl = d * (float)(b[s] & 15), ml = dmin * (float)(b[s] >> 4);
        for (int l = 0; l < 16; l++) y[16 * s + l] = dl * (float)q2k_quant(b, 16 * s + l) - ml;
    }
}

/* Q3_K: hmask[32], qs[64], scales[12] (16 six-bit scales, stored +32), fp16 d.
 * Element e: low 2 bits as Q2_K's (qs at offset 32), bit 2 is bit 4h+j of
 * hmask[e%32]; the quant is (low | hbit << 2) - 4 (-4..3). */
static inline int q3k_quant(const uint8_t *blk, int e) {
    int h = e >> 7, j = (e >> 5) & 3, l = e & 31;
    int lo = (blk[32 + 32 * h + l] >> (2 * j)) & 3;
    int hb = (blk[l] >> (4 * h + j)) & 1;
    return (lo | hb << 2) - 4;
}

/* Scale s (0..15) of a Q3_K block, -32..31: low 4 bits from nibbles of
 * scales[0..7] (low nibbles for s < 8), high 2 bits from scales[8 + s%4]. */
static inline int q3k_scale(const uint8_t *blk, int s) {
    const uint8_t *sc = blk + 96;
    int lo = s < 8 ? (sc[s] & 15) : (sc[s - 8] >> 4);
    int hi = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    return (lo | hi << 4) - 32;
}

static void deq_q3_k(float *y, const uint8_t *b) {
    float d = ld_f16(b + 108);
    for (int s = 0; s < 16; s++) {
        float dl = d * (float)q3k_scale(b, s);
        for (int l = 0; l < 16; l++) y[16 * s + l] = dl * (float)q3k_quant(b, 16 * s + l);
    }
}

/* Six-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K block, packed
 * in 12 bytes: s < 4 in the low 6 bits of bytes s and s+4; s >= 4 in the
 * nibbles of byte s+4 with the top two bits from bytes s-4 and s. */
static inline void k4_scale_min(const uint8_t *sc, int s, int *scale, int *min) {
    if (s < 4) {
        *scale = sc[s] & 63;
        *min = sc[s + 4] & 63;
    } else {
        *scale = (sc[s + 4] & 15) | (sc[s - 4] >> 6) << 4;
        *min = (sc[s + 4] >> 4) | (sc[s] >> 6) << 4;
    }
}

/* Q4_K: fp16 d, fp16 dmin, scales[12], qs[128]; sub-block s (32 values)
 * takes the low (s even) or high nibbles of qs[32 * (s/2) ..];
 * value = d * scale_s * q - dmin * min_s. */
static inline int q4k_quant(const uint8_t *blk, int e) {
    int s = e >> 5;
    uint8_t v = blk[16 + 32 * (s >> 1) + (e & 31)];
    return (s & 1) ? v >> 4 : v & 15;
}

static void deq_q4_k(float *y, const uint8_t *b) {
    float d = ld_f16(b), dmin = ld_f16(b + 2);
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        k4_scale_min(b + 4, s, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        for (int l = 0; l < 32; l++) y[32 * s + l] = d1 * (float)q4k_quant(b, 32 * s + l) - m1;
    }
}

/* Q5_K: as Q4_K with qh[32] after the scales (qs moves to offset 48): bit 4
 * of sub-block s's quant l is bit s of qh[l]. */
static inline int q5k_quant(const uint8_t *blk, int e) {
    int s = e >> 5, l = e & 31;
    uint8_t v = blk[48 + 32 * (s >> 1) + l];
    int lo = (s & 1) ? v >> 4 : v & 15;
    return lo | ((blk[16 + l] >> s) & 1) << 4;
}

static void deq_q5_k(float *y, const uint8_t *b) {
    float d = ld_f16(b), dmin = ld_f16(b + 2);
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        k4_scale_min(b + 4, s, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        for (int l = 0; l < 32; l++) y[32 * s + l] = d1 * (float)q5k_quant(b, 32 * s + l) - m1;
    }
}

/* One block of each computable type to fp32 (the float types are blocks of
 * one value). The sizes come from WT_INFO; a type is computable exactly when
 * it has an entry here. */
typedef void (*deq_fn)(float *y, const uint8_t *b);
static void deq_f32(float *y, const uint8_t *b) { memcpy(y, b, 4); }
static void deq_f16(float *y, const uint8_t *b) { y[0] = ld_f16(b); }
static void deq_bf16(float *y, const uint8_t *b) { y[0] = ld_bf16(b); }
static const deq_fn DEQ[] = {
    [KKV_WT_F32] = deq_f32,   [KKV_WT_F16] = deq_f16,   [KKV_WT_BF16] = deq_bf16,
    [KKV_WT_Q4_0] = deq_q4_0, [KKV_WT_Q4_1] = deq_q4_1, [KKV_WT_Q5_0] = deq_q5_0,
    [KKV_WT_Q5_1] = deq_q5_1, [KKV_WT_Q8_0] = deq_q8_0, [KKV_WT_Q2_K] = deq_q2_k,
    [KKV_WT_Q3_K] = deq_q3_k, [KKV_WT_Q4_K] = deq_q4_k, [KKV_WT_Q5_K] = deq_q5_k,
    [KKV_WT_Q6_K] = deq_q6_k,
};
#define N_DEQ (sizeof DEQ / sizeof DEQ[0])

int kkv_wt_supported(uint32_t type) { return type < N_DEQ && DEQ[type] != NULL; }

void kkv_wt_dequant_row(float *out, const kkv_weight *w, int64_t row) {
    const uint8_t *r = (const uint8_t *)w->data + (size_t)row * w->row_bytes;
    int64_t cols = w->cols;
    if (w->type == KKV_WT_F32) {
        memcpy(out, r, (size_t)cols * 4);
        return;
    }
    if (!kkv_wt_supported(w->type)) {
        /* Unsupported types never reach here through kkv_weight_from_tensor;
         * NaN makes a misuse visible instead of leaving garbage. */
        for (int64_t i = 0; i < cols; i++) out[i] = NAN;
        return;
    }
    const deq_fn f = DEQ[w->type];
    const int64_t be = WT_INFO[w->type].elems, bb = WT_INFO[w->type].bytes;
    for (int64_t b = 0; b < cols / be; b++) f(out + be * b, r + bb * b);
}

/* ---- activation quantization ---- */

/* nearbyintf (round half to even, the default mode) for |x| < 2^22 without
 * the libm call, which cost 5% of a decode step: adding 1.5 * 2^23 leaves no
 * fraction bits. Larger values, infinities and NaN come back unchanged; the
 * caller clamps them to +-127 exactly as it clamps nearbyintf's result. */
static inline float round_even_small(float x) {
    return fabsf(x) < 4194304.0f ? (x + 12582912.0f) - 12582912.0f : x;
}

void kkv_q8x_quantize(kkv_q8x *dst, const float *x, int64_t cols) {
    for (int64_t b = 0; b < cols / 32; b++) {
        const float *v = x + 32 * b;
        kkv_q8x *o = &dst[b];
        float amax = 0.0f;
        int finite = 1;
        for (int i = 0; i < 32; i++) {
            float a = fabsf(v[i]);
            if (!(a <= 3.4028234663852886e38f)) finite = 0; /* Inf or NaN */
            else if (a > amax) amax = a;
        }
        if (!finite) {
            o->d = NAN;
            o->s = NAN;
            o->isum = 0;
            o->isum16 = 0;
            memset(o->q, 0, 32);
            continue;
        }
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t sum = 0, sum16 = 0;
        for (int i = 0; i < 32; i++) {
            /* |v*id| <= 127 up to one rounding; the clamp makes that certain */
            float q = round_even_small(v[i] * id);
            if (q > 127.0f) q = 127.0f;
            if (q < -127.0f) q = -127.0f;
            if (q != q) q = 0.0f; /* 0 * inf where d is subnormal and 1 / d overflows */
            o->q[i] = (int8_t)q;
            sum += o->q[i];
            if (i == 15) sum16 = sum;
        }
        o->d = d;
        o->isum = sum;
        o->isum16 = sum16;
        o->s = d * (float)sum;
    }
}

/* ---- scalar reference kernels ---- */

/* Exact integer dot product of one weight block with one activation block. */
static int32_t sdot_q4_0(const uint8_t *b, const int8_t *q) {
    int32_t s = 0;
    for (int i = 0; i < 16; i++)
        s += ((b[2 + i] & 15) - 8) * q[i] + ((b[2 + i] >> 4) - 8) * q[i + 16];
    return s;
}

static int32_t sdot_q4_1(const uint8_t *b, const int8_t *q) {
    int32_t s = 0;
    for (int i = 0; i < 16; i++) s += (b[4 + i] & 15) * q[i] + (b[4 + i] >> 4) * q[i + 16];
    return s;
}

static int32_t sdot_q8_0(const uint8_t *b, const int8_t *q) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += (int8_t)b[2 + i] * q[i];
    return s;
}

/* Activation block k (0..7) of a Q6_K super-block: two 16-value sub-blocks,
 * each with its own int8 scale. */
static int32_t sdot_q6_k(const uint8_t *b, int k, const int8_t *q) {
    const int8_t *sc = (const int8_t *)(b + 192);
    int32_t s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) {
        s0 += (q6k_quant(b, 32 * k + i) - 32) * q[i];
        s1 += (q6k_quant(b, 32 * k + 16 + i) - 32) * q[i + 16];
    }
    return sc[2 * k] * s0 + sc[2 * k + 1] * s1;
}

static int32_t sdot_q5_0(const uint8_t *b, const int8_t *q) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += (q5_quant(b + 2, b + 6, i) - 16) * q[i];
    return s;
}

static int32_t sdot_q5_1(const uint8_t *b, const int8_t *q) {
    int32_t s = 0;
    for (int i = 0; i < 32; i++) s += q5_quant(b + 4, b + 8, i) * q[i];
    return s;
}

/* Activation block k (0..7) of a Q2_K super-block: sum of scale * q over its
 * two 16-value sub-blocks; *mins = the sub-block mins times the sums of x's
 * quants over each sub-block. */
static int32_t sdot_q2_k(const uint8_t *b, int k, const kkv_q8x *x, int32_t *mins) {
    int32_t s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) {
        s0 += q2k_quant(b, 32 * k + i) * x->q[i];
        s1 += q2k_quant(b, 32 * k + 16 + i) * x->q[i + 16];
    }
    *mins = (b[2 * k] >> 4) * x->isum16 + (b[2 * k + 1] >> 4) * (x->isum - x->isum16);
    return (b[2 * k] & 15) * s0 + (b[2 * k + 1] & 15) * s1;
}

static int32_t sdot_q3_k(const uint8_t *b, int k, const int8_t *q) {
    int32_t s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) {
        s0 += q3k_quant(b, 32 * k + i) * q[i];
        s1 += q3k_quant(b, 32 * k + 16 + i) * q[i + 16];
    }
    return q3k_scale(b, 2 * k) * s0 + q3k_scale(b, 2 * k + 1) * s1;
}

/* Sub-block k of a Q4_K/Q5_K super-block: scale * sumi; *mins = min * isum. */
static int32_t sdot_q45_k(const uint8_t *b, int k, const kkv_q8x *x, int five, int32_t *mins) {
    int sc, mn;
    k4_scale_min(b + 4, k, &sc, &mn);
    int32_t s = 0;
    for (int i = 0; i < 32; i++)
        s += (five ? q5k_quant(b, 32 * k + i) : q4k_quant(b, 32 * k + i)) * x->q[i];
    *mins = mn * x->isum;
    return sc * s;
}

static float sdot_row_q(uint32_t type, const uint8_t *row, int64_t cols, const kkv_q8x *x) {
    float acc = 0.0f, accm = 0.0f;
    int64_t nb = cols / 32;
    for (int64_t b = 0; b < nb; b++) {
        const kkv_q8x *xb = &x[b];
        switch (type) {
        case KKV_WT_Q4_0: {
            const uint8_t *wb = row + 18 * b;
            acc += (ld_f16(wb) * xb->d) * (float)sdot_q4_0(wb, xb->q);
            break;
        }
        case KKV_WT_Q4_1: {
            const uint8_t *wb = row + 20 * b;
            acc += (ld_f16(wb) * xb->d) * (float)sdot_q4_1(wb, xb->q);
            accm += ld_f16(wb + 2) * xb->s;
            break;
        }
        case KKV_WT_Q8_0: {
            const uint8_t *wb = row + 34 * b;
            acc += (ld_f16(wb) * xb->d) * (float)sdot_q8_0(wb, xb->q);
            break;
        }
        case KKV_WT_Q6_K: {
            const uint8_t *wb = row + 210 * (b / 8);
            acc += (ld_f16(wb + 208) * xb->d) * (float)sdot_q6_k(wb, (int)(b % 8), xb->q);
            break;
        }
        case KKV_WT_Q5_0: {
            const uint8_t *wb = row + 22 * b;
            acc += (ld_f16(wb) * xb->d) * (float)sdot_q5_0(wb, xb->q);
            break;
        }
        case KKV_WT_Q5_1: {
            const uint8_t *wb = row + 24 * b;
            acc += (ld_f16(wb) * xb->d) * (float)sdot_q5_1(wb, xb->q);
            accm += ld_f16(wb + 2) * xb->s;
            break;
        }
        case KKV_WT_Q2_K: {
            const uint8_t *wb = row + 84 * (b / 8);
            int32_t mins;
            int32_t si = sdot_q2_k(wb, (int)(b % 8), xb, &mins);
            acc += (ld_f16(wb + 80) * xb->d) * (float)si;
            accm -= (ld_f16(wb + 82) * xb->d) * (float)mins;
            break;
        }
        case KKV_WT_Q3_K: {
            const uint8_t *wb = row + 110 * (b / 8);
            acc += (ld_f16(wb + 108) * xb->d) * (float)sdot_q3_k(wb, (int)(b % 8), xb->q);
            break;
        }
        case KKV_WT_Q4_K:
        case KKV_WT_Q5_K: {
            int five = type == KKV_WT_Q5_K;
            const uint8_t *wb = row + (five ? 176 : 144) * (b / 8);
            int32_t mins;
            int32_t si = sdot_q45_k(wb, (int)(b % 8), xb, five, &mins);
            acc += (ld_f16(wb) * xb->d) * (float)si;
            accm -= (ld_f16(wb + 2) * xb->d) * (float)mins;
            break;
        }
        default: return NAN;
        }
    }
    return acc + accm;
}

void kkv_wt_scalar_dot_q(float *res, uint32_t type, const void *row, int64_t cols,
                         const kkv_q8x *const *xq, int nx) {
    for (int j = 0; j < nx; j++) res[j] = sdot_row_q(type, row, cols, xq[j]);
}

void kkv_wt_scalar_dot_f(float *res, uint32_t type, const void *row, int64_t cols,
                         const float *const *xf, int nx) {
    const uint8_t *r = row;
    for (int j = 0; j < nx; j++) {
        float acc = 0.0f;
        if (type == KKV_WT_F32) {
            for (int64_t i = 0; i < cols; i++) {
                float w;
                memcpy(&w, r + 4 * i, 4);
                acc += w * xf[j][i];
            }
        } else if (type == KKV_WT_BF16) {
            for (int64_t i = 0; i < cols; i++) acc += ld_bf16(r + 2 * i) * xf[j][i];
        } else {
            for (int64_t i = 0; i < cols; i++) acc += ld_f16(r + 2 * i) * xf[j][i];
        }
        res[j] = acc;
    }
}

const kkv_wt_kernels kkv_wt_kernels_scalar = {kkv_wt_scalar_dot_q, kkv_wt_scalar_dot_f, kkv_q8x_quantize, NULL, NULL,
                                                 NULL, 0};

/* ---- matmul driver ---- */

typedef struct mm_ctx {
    const kkv_wt_kernels *k;
    const kkv_weight     *w;
    float                *out;     /* [n][rows] */
    const float          *x;       /* [n][cols] */
    const kkv_q8x        *xq;      /* [n][cols/32] blocks, NULL for F32/F16 */
    int                   n;
    int64_t               rows_per_task; /* of the small tasks */
    float                *row_f;   /* KKV_WT_IMPL_F32: [tasks][cols] scratch, else NULL */
    int64_t               big_rows; /* rows of each of the first n_big tasks */
    int                   n_big;
    int                   row_block; /* rows per kernel call: KKV_WT_ROWS or KKV_WT_ROWS16
                                        where the table's row kernels cover w->type (and
                                        xq is set), else 0 (dot_q row by row) */
    int                   packed;    /* 1: row_block is w->pack_rows and the kernel reads
                                        w->packed, one group per call */
} mm_ctx;

static int is_quant(uint32_t type) { return type != KKV_WT_F32 && type != KKV_WT_F16 && type != KKV_WT_BF16; }

/* Rows [r0, r1) against every x vector, in tiles of MM_ROW_TILE rows: a tile
 * of weight rows stays in L1 while groups of KKV_WT_NX x vectors stream past
 * it, so the (larger) quantized x batch is read from L2 once per tile rather
 * than once per row. Neither the tiling nor the grouping changes any output:
 * the kernels compute each (row, x) pair with the same operations for any nx
 * and any neighbours. */
#define MM_ROW_TILE 16

/* Batches of at least this many x vectors take the sixteen-row kernels where
 * the table has them: there the matmul is compute-bound and they are 1.35x
 * faster. A single x vector streams the weights from DRAM, and sixteen rows
 * side by side streamed them 30% slower than eight (decode at depth 0, 175
 * vs 119 tok/s on one thread); at 2 the two were level within the noise.
 * Only speed depends on this: both give the scalar kernels' bits. */
#define MM_ROWS16_MIN_N 4

/* Software prefetch of the weight stream: the first MM_PF_BYTES of a task at
 * once, then MM_PF_BYTES ahead of the next row. A task is a short stream (12-26
 * KB for a decode step's Q/K/V at 2 threads), too short for the hardware
 * prefetcher to ramp up: without this Q/K/V ran at 7 GB/s on one core and
 * took 1.36 against 1.54 ms per token on two (SmolLM2-135M), with it 0.69-0.88.
 * 2048 bytes measured best of 0 (next row only), 1024, 2048, 4096 and 8192
 * on a Zen 3, and 1024-4096 were level on an Intel Xeon at depth 0 (8192 cost
 * one thread 5%), as were 1024-16384 at 32K depth, where the weights come
 * from DRAM. The hint depends on the CPU (kkv_cpu's wt_pf_l2, KKV_WT_PF=l2|nta to
 * force one). On the Zen 3 the non-temporal hint (the weights are read once
 * per step) kept one thread as fast as without prefetching, where the
 * all-levels hint cost it 4% and the L2 hint 11%. On the Xeon (AVX-512,
 * 2 MB L2 per core) prefetchnta stalled on the fill buffers: perf put 88% of
 * the sixteen-row kernel's samples on the instruction after it, and decode
 * at depth 0 ran 58-64 tok/s on one thread and 104-112 on two, against
 * 134-143 and 219-247 with no prefetch, 170-174 and 388-391 with the
 * all-levels hint and 200-263 and 370-436 with the L2 hint (locality 1,
 * prefetcht2). Speed only: prefetches change no result. */
#define MM_PF_BYTES 2048
#define MM_LINE 64

static inline void prefetch_range(const uint8_t *p, const uint8_t *end, int pf_l2) {
    for (; p < end; p += MM_LINE) KKV_WT_PF(p, pf_l2);
}

static void mm_rows(const mm_ctx *c, int64_t r0, int64_t r1) {
    const kkv_weight *w = c->w;
    size_t nb = (size_t)(w->cols / 32);
    /* packed: the group of row r (a multiple of R) at r * row_bytes, the last one whole */
    const uint8_t *base = (const uint8_t *)(c->packed ? w->packed : w->data);
    const int64_t R = c->row_block;
    const int64_t r_end = c->packed ? (r1 + R - 1) / R * R : r1;
    const uint8_t *stream_end = base + (size_t)r_end * w->row_bytes;
    /* the head of the task's stream at once, then `lead` ahead of the next
     * row; the row-block kernels (8 or 16 rows) read a block's rows side by
     * side, so their lead covers the whole next block of rows, and they
     * spread each range over their blocks */
    const size_t lead = MM_PF_BYTES + (size_t)c->row_block * w->row_bytes;
    const int pf_l2 = kkv_cpu_get()->wt_pf_l2;
    const uint8_t *pf = base + (size_t)r0 * w->row_bytes;
    const uint8_t *pf_to = (size_t)(stream_end - pf) > lead ? pf + lead : stream_end;
    prefetch_range(pf, pf_to, pf_l2);
    pf = pf_to;
    for (int64_t t0 = r0; t0 < r1; t0 += MM_ROW_TILE) {
        int64_t t1 = t0 + MM_ROW_TILE < r1 ? t0 + MM_ROW_TILE : r1;
        for (int j0 = 0; j0 < c->n; j0 += KKV_WT_NX) {
            int nx = c->n - j0 < KKV_WT_NX ? c->n - j0 : KKV_WT_NX;
            const kkv_q8x *xq[KKV_WT_NX];
            const float *xf[KKV_WT_NX];
            for (int j = 0; j < nx; j++) {
                xq[j] = c->xq ? c->xq + (size_t)(j0 + j) * nb : NULL;
                xf[j] = c->x ? c->x + (size_t)(j0 + j) * (size_t)w->cols : NULL;
            }
            for (int64_t r = t0; r < t1;) {
                /* a row block (8 or 16 rows) where the kernels cover the type, else one */
                int nr = c->row_block ? (int)(t1 - r < c->row_block ? t1 - r : c->row_block) : 1;
                const uint8_t *row = base + (size_t)r * w->row_bytes;
                const uint8_t *pf_from = pf;
                if (pf < stream_end) { /* keep `lead` ahead of the rows after these */
                    const uint8_t *next = row + (size_t)nr * w->row_bytes;
                    pf_to = (size_t)(stream_end - next) > lead ? next + lead : stream_end;
                    if (pf_to > pf) {
                        if (!c->row_block) prefetch_range(pf, pf_to, pf_l2); /* else the kernel spreads it */
                        pf = pf_to;
                    }
                }
                float res[KKV_WT_NX * KKV_WT_ROWS16]; /* [nx][row_block] or [nx] */
                if (c->packed) {
                    const uint8_t *group = row;
                    c->k->dot_q_pack(res, w->type, &group, w->cols, xq, nx, pf_from, pf);
                    for (int j = 0; j < nx; j++)
                        for (int i = 0; i < nr; i++)
                            c->out[(size_t)(j0 + j) * (size_t)w->rows + (size_t)(r + i)] = res[R * j + i];
                } else if (c->row_block) {
                    const uint8_t *rp[KKV_WT_ROWS16];
                    for (int i = 0; i < c->row_block; i++) rp[i] = row + (size_t)(i < nr ? i : 0) * w->row_bytes;
                    if (c->row_block == KKV_WT_ROWS16)
                        c->k->dot_q_rows16(res, w->type, rp, w->cols, xq, nx, pf_from, pf);
                    else
                        c->k->dot_q_rows(res, w->type, rp, w->cols, xq, nx, pf_from, pf);
                    for (int j = 0; j < nx; j++)
                        for (int i = 0; i < nr; i++)
                            c->out[(size_t)(j0 + j) * (size_t)w->rows + (size_t)(r + i)] = res[c->row_block * j + i];
                } else {
                    if (c->xq) c->k->dot_q(res, w->type, row, w->cols, xq, nx);
                    else c->k->dot_f(res, w->type, row, w->cols, xf, nx);
                    for (int j = 0; j < nx; j++) c->out[(size_t)(j0 + j) * (size_t)w->rows + (size_t)r] = res[j];
                }
                r += nr;
            }
        }
    }
}

/* KKV_WT_IMPL_F32: rows [r0, r1) dequantized one at a time into row_f
 * ([cols] scratch) and dotted with each x in double. */
static void mm_rows_f32(const mm_ctx *c, float *row_f, int64_t r0, int64_t r1) {
    const kkv_weight *w = c->w;
    for (int64_t r = r0; r < r1; r++) {
        kkv_wt_dequant_row(row_f, w, r);
        for (int j = 0; j < c->n; j++) {
            const float *x = c->x + (size_t)j * (size_t)w->cols;
            /* four partial sums in a fixed order: no serial add chain */
            double acc[4] = {0.0, 0.0, 0.0, 0.0};
            int64_t i = 0;
            for (; i + 4 <= w->cols; i += 4)
                for (int u = 0; u < 4; u++) acc[u] += (double)row_f[i + u] * (double)x[i + u];
            for (; i < w->cols; i++) acc[0] += (double)row_f[i] * (double)x[i];
            c->out[(size_t)j * (size_t)w->rows + (size_t)r] =
                (float)((acc[0] + acc[1]) + (acc[2] + acc[3]));
        }
    }
}

static void mm_task(void *ctx, int task) {
    const mm_ctx *c = ctx;
    int64_t r0, r1;
    if (task < c->n_big) {
        r0 = (int64_t)task * c->big_rows;
        r1 = r0 + c->big_rows;
    } else {
        r0 = (int64_t)c->n_big * c->big_rows + (int64_t)(task - c->n_big) * c->rows_per_task;
        r1 = r0 + c->rows_per_task;
    }
    if (r1 > c->w->rows) r1 = c->w->rows;
    if (c->row_f) mm_rows_f32(c, c->row_f + (size_t)task * (size_t)c->w->cols, r0, r1);
    else mm_rows(c, r0, r1);
}

static const kkv_wt_kernels *pick_kernels(kkv_wt_impl impl) {
    switch (impl) {
    case KKV_WT_IMPL_SCALAR:
    case KKV_WT_IMPL_F32: return &kkv_wt_kernels_scalar;
    case KKV_WT_IMPL_AVX2:
#if defined(__x86_64__) || defined(__i386__)
        return kkv_cpu_get()->avx2 ? &kkv_wt_kernels_avx2 : NULL;
#else
        return NULL;
#endif
    case KKV_WT_IMPL_NEON:
#if defined(__aarch64__)
        if (kkv_cpu_get()->neon) return kkv_cpu_get()->dotprod ? &kkv_wt_kernels_neon_dotprod : &kkv_wt_kernels_neon;
#endif
        return NULL;
    case KKV_WT_IMPL_AUTO:
#if defined(__x86_64__) || defined(__i386__)
        /* the VNNI builds give the AVX2 kernels' bits, faster */
        if (kkv_cpu_get()->vnni) return &kkv_wt_kernels_vnni;
        if (kkv_cpu_get()->avxvnni) return &kkv_wt_kernels_avxvnni;
        if (kkv_cpu_get()->avx2) return &kkv_wt_kernels_avx2;
#endif
#if defined(__aarch64__)
        if (kkv_cpu_get()->neon) return pick_kernels(KKV_WT_IMPL_NEON);
#endif
        return &kkv_wt_kernels_scalar;
    }
    return NULL;
}

int kkv_wt_pack_rows(void) {
    const char *e = getenv("KKV_WT_PACK");
    const kkv_wt_kernels *k = pick_kernels(KKV_WT_IMPL_AUTO);
    return k->dot_q_pack && !(e && strcmp(e, "0") == 0) ? k->pack_rows : 0;
}

static kkv_status check_weight(const kkv_weight *w) {
    if (!kkv_wt_supported(w->type))
        return kkv_fail(KKV_ERR_UNSUPPORTED, "matmul: cannot compute with type %s (%u)",
                        kkv_wt_name(w->type), w->type);
    size_t rb;
    if (w->rows < 0 || kkv_wt_row_size(&rb, w->type, w->cols) != KKV_OK || rb != w->row_bytes ||
        (is_quant(w->type) && w->cols % 32 != 0))
        return kkv_fail(KKV_ERR_INVALID_ARG, "matmul: inconsistent %s weight (%lld x %lld, %zu bytes/row)",
                        kkv_wt_name(w->type), (long long)w->rows, (long long)w->cols, w->row_bytes);
    return KKV_OK;
}

/* Rows per task: enough tasks for the pool to balance, each big enough that
 * the dispatch cost stays small. Only speed depends on this. */
static int64_t rows_per_task(const kkv_tp *tp, int64_t rows, int n) {
    int threads = kkv_tp_size(tp);
    if (threads <= 1) return rows > 0 ? rows : 1;
    /* 1/4 of a thread's rows: 1/16 measured 20% slower at depth 0 with 2
     * threads (shorter weight streams for the prefetcher) */
    int64_t per = rows / ((int64_t)threads * 4);
    int64_t min_rows = n >= 8 ? 4 : 32;
    if (per < min_rows) per = min_rows;
    return per;
}

/* The matmul of w against n x vectors (xq: their blocks, NULL for F32/F16)
 * with kernels k, before its task plan. With the row-block kernels a task
 * is a whole number of row blocks where it can be (a tail block costs as
 * much as a full one). Only speed depends on the task sizes. */
static mm_ctx mm_make(const kkv_wt_kernels *k, const kkv_weight *w, float *out, const float *x,
                      const kkv_q8x *xq, int n, const kkv_tp *tp) {
    mm_ctx c = {k, w, out, x, xq, n, rows_per_task(tp, w->rows, n), NULL, 0, 0, 0, 0};
    int r8 = xq && k->dot_q_rows && k->dot_q_rows(NULL, w->type, NULL, 0, NULL, 0, NULL, NULL);
    int r16 = xq && k->dot_q_rows16 && k->dot_q_rows16(NULL, w->type, NULL, 0, NULL, 0, NULL, NULL);
    c.packed = xq && w->packed && k->dot_q_pack && w->pack_rows == k->pack_rows &&
               k->dot_q_pack(NULL, w->type, NULL, 0, NULL, 0, NULL, NULL);
    c.row_block = c.packed ? k->pack_rows : r16 && n >= MM_ROWS16_MIN_N ? KKV_WT_ROWS16 : r8 ? KKV_WT_ROWS : 0;
    if (c.row_block) c.rows_per_task = (c.rows_per_task + c.row_block - 1) / c.row_block * c.row_block;
    return c;
}

/* Task plan of c (rows_per_task already set); returns the task count. With a
 * pool, the first tasks are one contiguous block of BIG_PCT% / threads of the
 * rows per thread, the rest small tasks of rows_per_task that balance the
 * finish. Each task starts a new weight stream, which costs DRAM latency before
 * the prefetchers catch up: with only small tasks (8 per weight at 2 threads)
 * a decode step at depth 0 ran 179 tok/s, with 75/90/100% in big blocks 193 /
 * 195 / 223 (SmolLM2-135M, 2 threads, interleaved rounds). The rest stays in
 * small tasks for a thread that starts late. 95 against 90: 2-4% faster steps
 * at depth 0 (SmolLM2, four sets of 10-12 interleaved rounds, Zen 3), 7% for
 * Gemma 3. Only speed depends on this. */
#define BIG_PCT 95

static int64_t plan_big(mm_ctx *c, const kkv_tp *tp) {
    int threads = kkv_tp_size(tp);
    int64_t rows = c->w->rows;
    c->n_big = 0;
    c->big_rows = 0;
    if (threads > 1) {
        int64_t big = rows * BIG_PCT / 100 / threads;
        if (c->row_block) big -= big % c->row_block;
        if (big >= 2 * c->rows_per_task) { /* else small tasks alone balance as well */
            c->n_big = threads;
            c->big_rows = big;
        }
    }
    int64_t rest = rows - (int64_t)c->n_big * c->big_rows;
    return c->n_big + (rest + c->rows_per_task - 1) / c->rows_per_task;
}

static kkv_status matmul_f32(kkv_tp *tp, float *out, const kkv_weight *w, const float *x,
                             int n) {
    int64_t per = rows_per_task(tp, w->rows, n);
    int64_t tasks = (w->rows + per - 1) / per;
    if (tasks > 1 << 20) {
        per = (w->rows + (1 << 20) - 1) >> 20;
        tasks = (w->rows + per - 1) / per;
    }
    float *row_f = malloc((size_t)tasks * (size_t)w->cols * sizeof *row_f); /* [tasks][cols] */
    if (!row_f) return kkv_fail(KKV_ERR_NOMEM, "matmul: out of memory for f32 rows");
    mm_ctx c = {&kkv_wt_kernels_scalar, w, out, x, NULL, n, per, row_f, 0, 0, 0, 0};
    kkv_tp_run(tp, (int)tasks, mm_task, &c);
    free(row_f);
    return KKV_OK;
}

kkv_status kkv_matmul_ex(kkv_tp *tp, float *out, const kkv_weight *w, const float *x, int n,
                         kkv_wt_impl impl) {
    const kkv_wt_kernels *k = pick_kernels(impl);
    if (!k) return kkv_fail(KKV_ERR_UNSUPPORTED, "matmul: kernel set %d is not available here", (int)impl);
    KKV_TRY(check_weight(w));
    if (n < 0) return kkv_fail(KKV_ERR_INVALID_ARG, "matmul: n = %d", n);
    if (n == 0 || w->rows == 0) return KKV_OK;
    if (impl == KKV_WT_IMPL_F32) return matmul_f32(tp, out, w, x, n);
    kkv_q8x *xq = NULL; /* [n][cols/32] */
    if (is_quant(w->type)) {
        size_t nb = (size_t)(w->cols / 32);
        if ((size_t)n > SIZE_MAX / sizeof(kkv_q8x) / nb)
            return kkv_fail(KKV_ERR_NOMEM, "matmul: activation scratch too large");
        xq = malloc((size_t)n * nb * sizeof *xq);
        if (!xq) return kkv_fail(KKV_ERR_NOMEM, "matmul: out of memory for %d activation rows", n);
        for (int j = 0; j < n; j++) k->quantize(xq + (size_t)j * nb, x + (size_t)j * (size_t)w->cols, w->cols);
    }
    mm_ctx c = mm_make(k, w, out, x, xq, n, tp);
    int64_t tasks = plan_big(&c, tp);
    if (tasks > 1 << 30) { /* keeps the task count an int; rows_per_task grows instead */
        c.n_big = 0;
        c.rows_per_task = (w->rows + (1 << 30) - 1) >> 30;
        if (c.row_block) /* tasks start on a row block (a packed group) */
            c.rows_per_task = (c.rows_per_task + c.row_block - 1) / c.row_block * c.row_block;
        tasks = (w->rows + c.rows_per_task - 1) / c.rows_per_task;
    }
    kkv_tp_run(tp, (int)tasks, mm_task, &c);
    free(xq);
    return KKV_OK;
}

/* Tasks of several matmuls in one job: task t belongs to the first weight i
 * with t < first[i + 1]. */
typedef struct mm_multi {
    int    nw;
    mm_ctx c[KKV_MM_MULTI];
    int    first[KKV_MM_MULTI + 1]; /* [nw + 1] first task of each weight */
} mm_multi;

static void mm_multi_task(void *ctx, int task) {
    const mm_multi *M = ctx;
    int i = 0;
    while (task >= M->first[i + 1]) i++;
    mm_task((void *)&M->c[i], task - M->first[i]);
}

kkv_status kkv_matmul_multi(kkv_tp *tp, int nw, float *const *out, const kkv_weight *const *w,
                            const float *x, int n, kkv_wt_impl impl) {
    if (nw < 1 || nw > KKV_MM_MULTI)
        return kkv_fail(KKV_ERR_INVALID_ARG, "matmul: %d weights in one job (1..%d)", nw, KKV_MM_MULTI);
    int same = impl != KKV_WT_IMPL_F32;
    for (int i = 1; i < nw; i++) same = same && w[i]->cols == w[0]->cols;
    if (!same || n == 0) {
        for (int i = 0; i < nw; i++) KKV_TRY(kkv_matmul_ex(tp, out[i], w[i], x, n, impl));
        return KKV_OK;
    }
    const kkv_wt_kernels *k = pick_kernels(impl);
    if (!k) return kkv_fail(KKV_ERR_UNSUPPORTED, "matmul: kernel set %d is not available here", (int)impl);
    int any_quant = 0;
    for (int i = 0; i < nw; i++) {
        KKV_TRY(check_weight(w[i]));
        any_quant |= is_quant(w[i]->type);
    }
    if (n < 0) return kkv_fail(KKV_ERR_INVALID_ARG, "matmul: n = %d", n);
    kkv_q8x *xq = NULL; /* [n][cols/32], shared by the quantized weights */
    if (any_quant) {
        size_t nb = (size_t)(w[0]->cols / 32);
        if ((size_t)n > SIZE_MAX / sizeof(kkv_q8x) / nb)
            return kkv_fail(KKV_ERR_NOMEM, "matmul: activation scratch too large");
        xq = malloc((size_t)n * nb * sizeof *xq);
        if (!xq) return kkv_fail(KKV_ERR_NOMEM, "matmul: out of memory for %d activation rows", n);
        for (int j = 0; j < n; j++) k->quantize(xq + (size_t)j * nb, x + (size_t)j * (size_t)w[0]->cols, w[0]->cols);
    }
    mm_multi M = {.nw = nw};
    int64_t total = 0;
    for (int i = 0; i < nw; i++) {
        M.c[i] = mm_make(k, w[i], out[i], x, is_quant(w[i]->type) ? xq : NULL, n, tp);
        int64_t tasks = w[i]->rows > 0 ? plan_big(&M.c[i], tp) : 0;
        if (total + tasks > 1 << 30) { /* absurd sizes: one by one keeps the counts ints */
            free(xq);
            for (int j = 0; j < nw; j++) KKV_TRY(kkv_matmul_ex(tp, out[j], w[j], x, n, impl));
            return KKV_OK;
        }
        M.first[i] = (int)total;
        total += tasks;
    }
    M.first[nw] = (int)total;
    kkv_tp_run(tp, (int)total, mm_multi_task, &M);
    free(xq);
    return KKV_OK;
}
