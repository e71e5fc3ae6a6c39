/* Key page scores on AVX-512 VBMI + VNNI: the VBMI table's key kernels.
 * kkv_vbmi512_qk_byte (the table's entry, at the end of this file) scores
 * pages with n_boost <= D / 2 with an 8-bit query, bit for bit as the AVX2
 * table's 8-bit kernel does, and hands the others to kkv_vbmi512_qk_wide,
 * the 15-bit query described first. Both share the quads of code rows below.
 *
 * s_t = sum_j q_j k_tj with k_tj = c_tj * scale_j + mn_j, so
 *   s_t = sum_j f_j c_tj + sum_j q_j mn_j,   f_j = q_j * scale_j.
 * Per page and query head f is rounded to integers x_j on ONE step
 *   d = max_j |f_j| / QMAX,  QMAX = 127 * 256 + 127 = 32639,
 * and each x_j is split into two signed bytes, x = 256 a + b (a in
 * [-127, 127], b in [-128, 127]). vpdpbusd multiplies the unsigned 2-bit / 4-bit codes by a and
 * by b into two int32 sums A and B; 256 A + B = sum_j x_j c_tj exactly (|A| <=
 * 127 * 15 * 256 * 2, far from overflow). This is the int16 query of the
 * issue in the instruction the CPU is fastest at.
 *
 * Why not the int8 kernel of attn_int_impl.h: with 8 bits one step per page
 * is too coarse (an outlier channel sets the step of all), so that kernel
 * sorts channels into three groups by key range, each with its own step,
 * partial sums and permuted query. That bookkeeping was about half its time
 * per page. With a 256x finer step none of it is needed: channels stay in
 * their stored order, four consecutive rows of the lo plane are one quad,
 * and the high plane's rows (in rank order, FORMAT.md section 2) are quads of
 * their own whose codes are shifted to 0/4/8/12 and whose weights are the
 * query of the channel each row belongs to. Twice the vpdpbusd of the int8
 * kernel, far fewer of everything else.
 *
 * Error (the tests' bound): codes are centred on maxq/2 through the per-head
 * constant, as in the int8 kernel, so
 *   |s_t - exact| <= d/2 * sum_j |c_tj - maxq_j/2|  (+ float rounding).
 * A non-finite f, or a head whose largest |f| is below 1e-30 (not 0;
 * fold_too_small), falls back to the float kernel (kkv_avx2_qk_page). Pure
 * function of its inputs: bit-identical for any thread count. */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "kernels/attn_simd.h"
#include "kernels/avx2_util.h"
#include "core/fp16.h"
#include "quant/quant.h"

#define QMAX 32639.0f
#define RBW 4                               /* query heads per pass over the page */
#define WQ (2 * KKV_MAX_HEAD_DIM + 64) /* weight bytes: lo channels, then hi ranks; whole-register slack */

/* vpermt2b indices of a channel quad from two registers holding rows 0, 1
 * (bytes 0..63) and rows 2, 3 (64..127) of 32 bytes each: output byte
 * 4i + e is row e's byte i; [0] for row bytes 0..15, [1] for 16..31. */
#define QX4(i) (i), 32 + (i), 64 + (i), 96 + (i)
#define QX16(b) QX4(b), QX4(b + 1), QX4(b + 2), QX4(b + 3), QX4(b + 4), QX4(b + 5), QX4(b + 6), \
                QX4(b + 7), QX4(b + 8), QX4(b + 9), QX4(b + 10), QX4(b + 11), QX4(b + 12),       \
                QX4(b + 13), QX4(b + 14), QX4(b + 15)
static const uint8_t quad_ix[2][64] = {{QX16(0)}, {QX16(16)}};

/* vpermt2ps indices putting four per-phase vectors back in token order:
 * output block o of a half holds tokens 4m + e (m = 0..3) of i = 4o + m;
 * even e from the first source (phase 0 or 2), odd e from the second
 * (phase 1 or 3). One table serves both pairs of phases. */
#define TI(o, m) 4 * (o) + (m), 16 + 4 * (o) + (m), 4 * (o) + (m), 16 + 4 * (o) + (m)
#define TO(o) TI(o, 0), TI(o, 1), TI(o, 2), TI(o, 3)
static const int32_t tok_ix[4][16] = {{TO(0)}, {TO(1)}, {TO(2)}, {TO(3)}};

/* Two rows of a quad, bytes [0, n) of each (r: the first row at the chunk's
 * offset; m: the n bytes), in one register; a dead row reads as zeros. */
AI __m512i rows2(const uint8_t *r, size_t rowb, __mmask32 m, int live0, int live1) {
    if (rowb == 32 && m == 0xFFFFFFFFu && live0 && live1) return _mm512_loadu_si512(r); /* adjacent */
    __m256i a = _mm256_maskz_loadu_epi8(live0 ? m : 0, r);
    __m256i b = _mm256_maskz_loadu_epi8(live1 ? m : 0, r + rowb);
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

/* The quad of rows r .. r + 3 (nr of them live) as two registers of code
 * dwords: byte 4i + e = row e's byte i (t[0]: i < 16, t[1]: i >= 16). */
AI void quad_of(__m512i *t, const uint8_t *r, size_t rowb, __mmask32 m, int nr, __m512i ix0, __m512i ix1) {
    __m512i z1 = rows2(r, rowb, m, nr > 0, nr > 1), z2 = rows2(r + 2 * rowb, rowb, m, nr > 2, nr > 3);
    t[0] = _mm512_permutex2var_epi8(z1, ix0, z2);
    t[1] = _mm512_permutex2var_epi8(z1, ix1, z2);
}

/* The code quads of one chunk (row bytes [c, c + nbytes), m their mask;
 * lo, hi: the planes' rows at that offset): T [quad][half], the D / 4 lo
 * quads, then the hi planes' ceil(nb / 4), a quad's dead rows as zeros. */
AI void chunk_quads(__m512i (*T)[2], const uint8_t *lo, const uint8_t *hi, size_t rowb, __mmask32 m, int D, int nb,
                    __m512i ix0, __m512i ix1) {
    int nq = D / 4, nh = (nb + 3) / 4;
    for (int qd = 0; qd < nq; qd++) quad_of(T[qd], lo + (size_t)(4 * qd) * rowb, rowb, m, 4, ix0, ix1);
    for (int hq = 0; hq < nh; hq++)
        quad_of(T[nq + hq], hi + (size_t)(4 * hq) * rowb, rowb, m, nb - 4 * hq < 4 ? nb - 4 * hq : 4, ix0, ix1);
}

/* dst[k] = src[ix[k]] for k < n (every ix[k] < D <= 256), zero from n up to
 * the next multiple of 64 (dst has the room): byte permutes over up to four
 * 64-byte registers of src, read whole (src has ceil(D / 64) * 64 bytes). */
AI void gather_bytes(int8_t *dst, const int8_t *src, const uint8_t *ix, int D, int n) {
    __m512i t0 = _mm512_loadu_si512(src); /* whole registers (src has the room): they forward */
    __m512i t1 = D > 64 ? _mm512_loadu_si512(src + 64) : t0;
    __m512i t2 = D > 128 ? _mm512_loadu_si512(src + 128) : t0;
    __m512i t3 = D > 192 ? _mm512_loadu_si512(src + 192) : t0;
    for (int k = 0; k < n; k += 64) {
        __mmask64 v = n - k >= 64 ? ~0ull : (1ull << (n - k)) - 1;
        __m512i o = _mm512_maskz_loadu_epi8(v, ix + k);
        __m512i g = D > 64 ? _mm512_permutex2var_epi8(t0, o, t1) : _mm512_permutexvar_epi8(o, t0);
        if (D > 128) g = _mm512_mask_mov_epi8(g, _mm512_movepi8_mask(o), _mm512_permutex2var_epi8(t2, o, t3));
        _mm512_storeu_si512(dst + k, _mm512_maskz_mov_epi8(v, g)); /* whole: loads forward from it */
    }
}

/* vpermt2b indices taking each of 64 channels' byte out of the int16 packs
 * p01 = packs(x[0..15], x[16..31]) (bytes 0..63) and p23 = packs(x[32..47],
 * x[48..63]) (bytes 64..127). In each 128-bit lane i, packs puts the words of
 * its first operand's channels 4i..4i+3, then its second's: channel c is word
 * 8 (c % 16 / 4) + 4 (c / 16 % 2) + c % 4 of its pack. ab_ix[0] takes the
 * high byte, [1] the low byte. */
#define AB_W(c) (64 * ((c) / 32) + 2 * (8 * ((c) % 16 / 4) + 4 * ((c) / 16 % 2) + (c) % 4))
#define AB4(c, o) AB_W(c) + (o), AB_W((c) + 1) + (o), AB_W((c) + 2) + (o), AB_W((c) + 3) + (o)
#define AB16(c, o) AB4(c, o), AB4((c) + 4, o), AB4((c) + 8, o), AB4((c) + 12, o)
#define AB64(o) AB16(0, o), AB16(16, o), AB16(32, o), AB16(48, o)
static const uint8_t ab_ix[2][64] = {{AB64(1)}, {AB64(0)}};
/* Integer query of RB heads: x = round(f / d) as (a, b) byte planes
 * w[r][0][i], w[r][1][i] for the D channels, then the nb hi ranks at D + k
 * (the query of the channel rank k belongs to), zero up to a whole quad.
 * d[r]: the step; cst[r]: sum q mn plus the centring term. Heads go in
 * lockstep (channels outer): the page's scale, zero points and boost flags
 * are loaded once, and the heads' reductions overlap. Returns 0 when some f
 * is not finite. */
AI int fold_wide(int8_t (*w)[2][WQ], float *d, float *cst, const float *q, int RB, const float *scale,
                 const float *mn, const uint8_t *idx, int D, int nb) {
    __m512 mx[RBW], c[RBW], corr[RBW], vinv[RBW], vd[RBW];
    __mmask16 bad = 0;
    for (int r = 0; r < RB; r++) mx[r] = c[r] = corr[r] = _mm512_setzero_ps();
    for (int j = 0; j < D; j += 16) {
        __mmask16 m = (__mmask16)(D - j >= 16 ? 0xFFFFu : (1u << (D - j)) - 1);
        __m512 sv = _mm512_maskz_loadu_ps(m, scale + j);
        for (int r = 0; r < RB; r++) {
            __m512 av = _mm512_abs_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, q + (size_t)r * D + j), sv));
            bad |= _mm512_cmp_ps_mask(av, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ); /* inf or NaN */
            mx[r] = _mm512_max_ps(mx[r], av);
        }
    }
    if (bad) return 0; /* inf or NaN */
    for (int r = 0; r < RB; r++) {
        float M = _mm512_reduce_max_ps(mx[r]);
        if (fold_too_small(M)) return 0; /* the float kernel takes the page */
        d[r] = M / QMAX;
        vinv[r] = _mm512_set1_ps(M > 0.0f ? QMAX / M : 0.0f);
        vd[r] = _mm512_set1_ps(d[r]);
    }
    const __m512i ia = _mm512_loadu_si512(ab_ix[0]), ib = _mm512_loadu_si512(ab_ix[1]), h128 = _mm512_set1_epi16(128);
    __m512i plane[RBW][2]; /* [head][a, b]: channels 0..63, kept for the hi ranks when D <= 64 */
    for (int jb = 0; jb < D; jb += 64) { /* 64 channels: whole-register byte stores, which loads forward */
        __m512i xv[RBW][4]; /* [head][16 channels] x as int32 */
        for (int e = 0; e < 4; e++) {
            int j = jb + 16 * e;
            __mmask16 m = (__mmask16)(j >= D ? 0 : D - j >= 16 ? 0xFFFFu : (1u << (D - j)) - 1);
            __m512 sv = _mm512_maskz_loadu_ps(m, scale + j), nv = _mm512_maskz_loadu_ps(m, mn + j);
            __mmask16 boosted = _mm512_cmplt_epu32_mask(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, idx + j)),
                                                        _mm512_set1_epi32(nb));
            __m512 half = _mm512_maskz_mov_ps(m, _mm512_mask_blend_ps(boosted, _mm512_set1_ps(1.5f), _mm512_set1_ps(7.5f)));
            for (int r = 0; r < RB; r++) {
                __m512 qv = _mm512_maskz_loadu_ps(m, q + (size_t)r * D + j), fv = _mm512_mul_ps(qv, sv);
                xv[r][e] = _mm512_cvtps_epi32(_mm512_mul_ps(fv, vinv[r])); /* |x| <= QMAX; 0 past D */
                c[r] = _mm512_fmadd_ps(qv, nv, c[r]);
                corr[r] = _mm512_fmadd_ps(_mm512_fnmadd_ps(vd[r], _mm512_cvtepi32_ps(xv[r][e]), fv), half, corr[r]);
            }
        }
        /* x = 256 a + b, a in [-127, 127], b in [-128, 127]: b is x's low
         * byte, a the high byte of x + 128 (as int16: |x| <= 32639, no
         * overflow). Two packs
         * and two byte permutes per head, where per-lane shifts and narrowing
         * moves took ~4x the instructions (the fold: 40 -> 33 ns per page) */
        for (int r = 0; r < RB; r++) {
            __m512i p01 = _mm512_packs_epi32(xv[r][0], xv[r][1]), p23 = _mm512_packs_epi32(xv[r][2], xv[r][3]);
            __m512i h01 = _mm512_add_epi16(p01, h128), h23 = _mm512_add_epi16(p23, h128);
            plane[r][0] = _mm512_permutex2var_epi8(h01, ia, h23);
            plane[r][1] = _mm512_permutex2var_epi8(p01, ib, p23);
            _mm512_storeu_si512(w[r][0] + jb, plane[r][0]);
            _mm512_storeu_si512(w[r][1] + jb, plane[r][1]);
        }
    }
    for (int r = 0; r < RB; r++) cst[r] = _mm512_reduce_add_ps(c[r]) + _mm512_reduce_add_ps(corr[r]);
    if (!nb) return 1;
    if (D <= 64) {
        /* The channel of each rank built in a register by one compare per
         * rank (a rank no channel claims, on a damaged page, reads channel
         * 0), then each plane's hi weights by one byte permute of the plane
         * still in its register, instead of a round trip through memory
         * (the inv table, then gather_bytes reloading the planes just
         * stored): the kernel went ~206 -> ~202 ns per page hot (Zen 5). */
        __m512i iv = _mm512_maskz_loadu_epi8(D >= 64 ? ~0ull : (1ull << D) - 1, idx), cv = _mm512_setzero_si512();
        for (int k = 0; k < nb; k++) {
            uint64_t mk = _mm512_cmpeq_epi8_mask(iv, _mm512_set1_epi8((char)k));
            cv = _mm512_mask_mov_epi8(cv, 1ull << k, _mm512_set1_epi8((char)(mk ? __builtin_ctzll(mk) : 0)));
        }
        __mmask64 live = nb >= 64 ? ~0ull : (1ull << nb) - 1; /* zero past the last rank */
        for (int r = 0; r < RB; r++)
            for (int p = 0; p < 2; p++) _mm512_storeu_si512(w[r][p] + D, _mm512_maskz_permutexvar_epi8(live, cv, plane[r][p]));
        return 1;
    }
    uint8_t inv[KKV_MAX_HEAD_DIM + 64], sink[KKV_MAX_HEAD_DIM + 1]; /* [nb] the channel of each rank; [idx] values past nb land in sink, unread */
    memset(inv, 0, (size_t)nb); /* a rank no channel claims (a damaged page) reads channel 0 */
    for (int j = 0; j < D; j++) (idx[j] < nb ? inv : sink)[idx[j]] = (uint8_t)j;
    for (int r = 0; r < RB; r++)
        for (int p = 0; p < 2; p++) gather_bytes(w[r][p] + D, w[r][p], inv, D, nb);
    return 1;
}

/* The scores of RB heads from their per-phase vectors v [head][phase k]
 * [half] (lane i of half h: token 64 h + 4 i + k) into token order at s
 * (row stride G), the first 4 * nbytes tokens. */
AI void store_tokens(float *s, int G, __m512 (*v)[4][2], int nbytes, int RB) {
    int ntok = 4 * nbytes;
    for (int o = 0; o < 4; o++) {
        __m512i ix = _mm512_loadu_si512(tok_ix[o]);
        for (int h = 0; h < 2; h++) {
            int t0 = 64 * h + 16 * o;
            if (t0 >= ntok) continue;
            __mmask16 m = (__mmask16)(ntok - t0 >= 16 ? 0xFFFFu : (1u << (ntok - t0)) - 1);
            for (int r = 0; r < RB; r++) {
                __m512 p01 = _mm512_permutex2var_ps(v[r][0][h], ix, v[r][1][h]);
                __m512 p23 = _mm512_permutex2var_ps(v[r][2][h], ix, v[r][3][h]);
                __m512 sc = _mm512_mask_blend_ps(0xCCCC, p01, p23);
                if (m == 0xFFFFu) _mm512_storeu_ps(s + (size_t)r * G + t0, sc); /* forwards to the softmax */
                else _mm512_mask_storeu_ps(s + (size_t)r * G + t0, m, sc);
            }
        }
    }
}

/* Scores of RB heads over the quads T (nq lo, then nh hi) of one chunk of
 * 4 * nbytes tokens, stored at s (row stride G). */
AI void quads_rb(float *s, int G, const __m512i (*T)[2], int nq, int nh, const int8_t (*w)[2][WQ],
                 const float *d, const float *cst, int nbytes, int RB) {
    const __m512i m3 = _mm512_set1_epi8(3), m12 = _mm512_set1_epi8(12);
    __m512 v[RBW][4][2]; /* [head][phase k][half]: scores of tokens 4i + k */
    for (int k = 0; k < 4; k++) {
        __m512i acc[RBW][2][2];
        for (int r = 0; r < RB; r++)
            acc[r][0][0] = acc[r][0][1] = acc[r][1][0] = acc[r][1][1] = _mm512_setzero_si512();
        for (int qd = 0; qd < nq + nh; qd++) {
            __m512i x[2]; /* codes of the quad in this phase: lo 0..3, hi 0/4/8/12 */
            if (qd < nq) {
                x[0] = _mm512_and_si512(_mm512_srli_epi32(T[qd][0], 2 * k), m3);
                x[1] = _mm512_and_si512(_mm512_srli_epi32(T[qd][1], 2 * k), m3);
            } else if (k) {
                x[0] = _mm512_and_si512(_mm512_srli_epi32(T[qd][0], 2 * k - 2), m12);
                x[1] = _mm512_and_si512(_mm512_srli_epi32(T[qd][1], 2 * k - 2), m12);
            } else {
                x[0] = _mm512_and_si512(_mm512_slli_epi32(T[qd][0], 2), m12);
                x[1] = _mm512_and_si512(_mm512_slli_epi32(T[qd][1], 2), m12);
            }
            for (int r = 0; r < RB; r++) {
                int32_t wa, wb;
                memcpy(&wa, w[r][0] + 4 * qd, 4);
                memcpy(&wb, w[r][1] + 4 * qd, 4);
                __m512i va = _mm512_set1_epi32(wa), vb = _mm512_set1_epi32(wb);
                for (int h = 0; h < 2; h++) {
                    acc[r][0][h] = _mm512_dpbusd_epi32(acc[r][0][h], x[h], va);
                    acc[r][1][h] = _mm512_dpbusd_epi32(acc[r][1][h], x[h], vb);
                }
            }
        }
        for (int r = 0; r < RB; r++)
            for (int h = 0; h < 2; h++) {
                __m512i tot = _mm512_add_epi32(_mm512_slli_epi32(acc[r][0][h], 8), acc[r][1][h]);
                v[r][k][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tot), _mm512_set1_ps(d[r]), _mm512_set1_ps(cst[r]));
            }
    }
    store_tokens(s, G, v, nbytes, RB);
}

/* ---- The 8-bit query: the VBMI table's key kernel for n_boost <= D / 2 ----
 *
 * The wide kernel spends two vpdpbusd per quad, head and phase (the a and b
 * planes), and on an AVX-512 Xeon those were most of its time: ~865 of them
 * a page (D 64, 8 boosted, 3 heads). With the query on 8 bits (the AVX2
 * table's step, d = max |f| / 127; why that is accurate enough:
 * attn_qkbyte_avx2.c) each needs one. The fold gives the AVX2 byte kernel's
 * x, d and constant (fold8), and the integer sums are exact in both, so the
 * scores are bit for bit that kernel's, and its error bound is this one's.
 *
 * Most quads need no shift: phase k's lo codes are taken in place by the
 * mask 3 << 2k (k < 3), i.e. scaled by s_k = 4^k; phase 3 by (T >> 4) & 12,
 * s_3 = 4. A hi-plane code weighs 4x a lo code, so it comes in at 4 s_k:
 * (T << 2) & (12 << 2k) for k < 3, (T >> 2) & 48 for k = 3 (the bits a
 * 32-bit shift carries across bytes fall outside every mask); a byte is at
 * most 3 * 64 = 192. Phase k's sum is then s_k S exactly (|s_k S| <= 16 *
 * 127 * (3 D + 12 nb) < 2^24, so its float is exact too), and
 * fma(s_k S, d / s_k, cst) = fma(S, d, cst) with d / s_k exact: the AVX2
 * kernel's float step, the same bits. */
#define WB (3 * KKV_MAX_HEAD_DIM / 2 + 64) /* weight bytes: D channels, the hi ranks, zeros to a whole 64 */

/* fold_query of qkfold_avx2.h with qmax 127 (the AVX2 byte kernel's fold)
 * for RB heads, on 512-bit registers and with its result as bytes: w [head]
 * the D channels' x, then at D + k the x of high rank k's channel (0 for a
 * rank no channel claims; the lowest channel where several do), zeros to a
 * whole register. x and d are lane by lane the same operations; cst sums in
 * fold_query's order (8-lane accumulators over channels j..j+7, then
 * j+8..j+15, a partial last 8 included, then hsum), so all three are its
 * bits. The bytes go out in whole-register stores that the quads' dword
 * loads forward from (int16 halves and scalar rank stores, read back wider,
 * stalled: ~70 ns a page). Returns 0 when some f is not finite. */
AI int fold8(int8_t (*w)[WB], float *d, float *cst, const float *q, int RB, const float *scale,
             const float *mn, const uint8_t *idx, int D, int nb) {
    __m512 mx[RBW], vinv[RBW], vd[RBW];
    __m256 c8[RBW], corr8[RBW];
    __mmask16 bad = 0;
    for (int r = 0; r < RB; r++) mx[r] = _mm512_setzero_ps();
    for (int j = 0; j < D; j += 16) {
        __mmask16 m = (__mmask16)(D - j >= 16 ? 0xFFFFu : (1u << (D - j)) - 1);
        __m512 sv = _mm512_maskz_loadu_ps(m, scale + j);
        for (int r = 0; r < RB; r++) {
            __m512 av = _mm512_abs_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, q + (size_t)r * D + j), sv));
            bad |= _mm512_cmp_ps_mask(av, _mm512_set1_ps(INFINITY), _CMP_NLT_UQ); /* inf or NaN */
            mx[r] = _mm512_max_ps(mx[r], av);
        }
    }
    if (bad) return 0;
    for (int r = 0; r < RB; r++) {
        float M = _mm512_reduce_max_ps(mx[r]);
        if (fold_too_small(M)) return 0; /* the float kernel takes the page */
        d[r] = M / 127.0f;
        vinv[r] = _mm512_set1_ps(M > 0.0f ? 127.0f / M : 0.0f);
        vd[r] = _mm512_set1_ps(d[r]);
        c8[r] = corr8[r] = _mm256_setzero_ps();
    }
    __m512i lo64[RBW]; /* [head] the bytes of channels 0..63, for the hi ranks when D <= 64 */
    for (int jb = 0; jb < D; jb += 64) {
        __m128i xb[RBW][4]; /* [head][16 channels] x as bytes */
        for (int e = 0; e < 4; e++) {
            int j = jb + 16 * e;
            if (j >= D) {
                for (int r = 0; r < RB; r++) xb[r][e] = _mm_setzero_si128();
                continue;
            }
            __mmask16 m = (__mmask16)(D - j >= 16 ? 0xFFFFu : (1u << (D - j)) - 1);
            __m512 sv = _mm512_maskz_loadu_ps(m, scale + j), nv = _mm512_maskz_loadu_ps(m, mn + j);
            __mmask16 boosted = _mm512_cmplt_epu32_mask(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, idx + j)),
                                                        _mm512_set1_epi32(nb));
            __m512 half = _mm512_maskz_mov_ps(m, _mm512_mask_blend_ps(boosted, _mm512_set1_ps(1.5f), _mm512_set1_ps(7.5f)));
            for (int r = 0; r < RB; r++) {
                __m512 qv = _mm512_maskz_loadu_ps(m, q + (size_t)r * D + j), fv = _mm512_mul_ps(qv, sv);
                __m512i xi = _mm512_cvtps_epi32(_mm512_mul_ps(fv, vinv[r])); /* |x| <= 127; 0 past D */
                __m512 t = _mm512_fnmadd_ps(vd[r], _mm512_cvtepi32_ps(xi), fv);
                c8[r] = _mm256_fmadd_ps(_mm512_castps512_ps256(qv), _mm512_castps512_ps256(nv), c8[r]);
                corr8[r] = _mm256_fmadd_ps(_mm512_castps512_ps256(t), _mm512_castps512_ps256(half), corr8[r]);
                if (j + 8 < D) {
                    c8[r] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(qv, 1), _mm512_extractf32x8_ps(nv, 1), c8[r]);
                    corr8[r] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(t, 1), _mm512_extractf32x8_ps(half, 1), corr8[r]);
                }
                xb[r][e] = _mm512_cvtepi32_epi8(xi); /* exact: |x| <= 127 */
            }
        }
        for (int r = 0; r < RB; r++) {
            __m512i v = _mm512_castsi128_si512(xb[r][0]);
            v = _mm512_inserti32x4(v, xb[r][1], 1);
            v = _mm512_inserti32x4(v, xb[r][2], 2);
            v = _mm512_inserti32x4(v, xb[r][3], 3);
            _mm512_storeu_si512(w[r] + jb, v);
            lo64[r] = v;
        }
    }
    for (int r = 0; r < RB; r++) cst[r] = hsum(c8[r]) + hsum(corr8[r]);
    __mmask64 live = nb >= 64 ? ~0ull : (1ull << nb) - 1;
    if (D <= 64) { /* rank k's channel by one compare per rank, then one byte permute per head */
        __m512i iv = _mm512_maskz_loadu_epi8(D >= 64 ? ~0ull : (1ull << D) - 1, idx), cv = _mm512_setzero_si512();
        __mmask64 claimed = 0;
        for (int k = 0; k < nb; k++) {
            uint64_t mk = _mm512_cmpeq_epi8_mask(iv, _mm512_set1_epi8((char)k));
            cv = _mm512_mask_mov_epi8(cv, 1ull << k, _mm512_set1_epi8((char)(mk ? __builtin_ctzll(mk) : 0)));
            claimed |= mk ? 1ull << k : 0;
        }
        for (int r = 0; r < RB; r++) _mm512_storeu_si512(w[r] + D, _mm512_maskz_permutexvar_epi8(live & claimed, cv, lo64[r]));
        return 1;
    }
    /* [nb] the channel of each rank (0 where none claims it) and whether one
     * does; [idx] values past nb land in sink, unread */
    uint8_t inv[KKV_MAX_HEAD_DIM + 64], got[KKV_MAX_HEAD_DIM + 1], sink[KKV_MAX_HEAD_DIM + 1];
    memset(inv, 0, (size_t)nb);
    memset(got, 0, (size_t)nb);
    for (int j = D - 1; j >= 0; j--) { /* the lowest wins */
        (idx[j] < nb ? inv : sink)[idx[j]] = (uint8_t)j;
        (idx[j] < nb ? got : sink)[idx[j]] = 1;
    }
    int unclaimed = 0;
    for (int k = 0; k < nb; k++) unclaimed |= !got[k];
    for (int r = 0; r < RB; r++) {
        gather_bytes(w[r] + D, w[r], inv, D, nb);
        if (unclaimed) /* a damaged page: its unclaimed ranks weigh 0, as in the scalar reference */
            for (int k = 0; k < nb; k++)
                if (!got[k]) w[r][D + k] = 0;
    }
    return 1;
}

/* Scores of RB heads over the quads T (nq lo, then nh hi) of one chunk of
 * 4 * nbytes tokens, 8-bit weights w [head][quad dword], stored at s (row
 * stride G). Two phases per pass: with one, each of the 2 RB sums took one
 * vpdpbusd per quad, and the loop waited on their latency (5 cycles an
 * iteration for 8 vector instructions); 4 RB sums hide it. */
AI void quads8_rb(float *s, int G, const __m512i (*T)[2], int nq, int nh, const int8_t (*w)[WB],
                  const float *d, const float *cst, int nbytes, int RB) {
    __m512 v[RBW][4][2]; /* [head][phase k][half]: scores of tokens 4i + k */
    const __m512i m3 = _mm512_set1_epi8(3), m12 = _mm512_set1_epi8(12), m48 = _mm512_set1_epi8(48),
                  m192 = _mm512_set1_epi8((char)192);
    for (int k0 = 0; k0 < 4; k0 += 2) {
        __m512i acc[RBW][2][2]; /* [head][phase k0, k0 + 1][half] */
        for (int r = 0; r < RB; r++) acc[r][0][0] = acc[r][0][1] = acc[r][1][0] = acc[r][1][1] = _mm512_setzero_si512();
        for (int qd = 0; qd < nq + nh; qd++) {
            __m512i x[2][2]; /* [phase][half] the quad's codes, times s_k (lo) or 4 s_k (hi) */
            for (int h = 0; h < 2; h++) {
                __m512i t = T[qd][h];
                if (qd < nq && k0 == 0) x[0][h] = _mm512_and_si512(t, m3), x[1][h] = _mm512_and_si512(t, m12);
                else if (qd < nq) x[0][h] = _mm512_and_si512(t, m48), x[1][h] = _mm512_and_si512(_mm512_srli_epi32(t, 4), m12);
                else if (k0 == 0) {
                    __m512i t2 = _mm512_slli_epi32(t, 2);
                    x[0][h] = _mm512_and_si512(t2, m12), x[1][h] = _mm512_and_si512(t2, m48);
                } else {
                    x[0][h] = _mm512_and_si512(_mm512_slli_epi32(t, 2), m192);
                    x[1][h] = _mm512_and_si512(_mm512_srli_epi32(t, 2), m48);
                }
            }
            for (int r = 0; r < RB; r++) {
                int32_t wq;
                memcpy(&wq, w[r] + 4 * qd, 4);
                __m512i vw = _mm512_set1_epi32(wq);
                for (int p = 0; p < 2; p++)
                    for (int h = 0; h < 2; h++) dp512_into(&acc[r][p][h], x[p][h], vw);
            }
        }
        for (int p = 0; p < 2; p++) {
            int k = k0 + p;
            float inv_s = k == 0 ? 1.0f : k == 2 ? 0.0625f : 0.25f; /* 1 / s_k */
            for (int r = 0; r < RB; r++)
                for (int h = 0; h < 2; h++)
                    v[r][k][h] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][p][h]), _mm512_set1_ps(d[r] * inv_s),
                                                 _mm512_set1_ps(cst[r]));
        }
    }
    store_tokens(s, G, v, nbytes, RB);
}

/* RB_CALL(fn, rb, args...): fn(args..., RB) with RB = rb (1..4) a constant. */
#define RB_CALL(fn, rb, ...)                   \
    do {                                       \
        if ((rb) == 4) fn(__VA_ARGS__, 4);     \
        else if ((rb) == 3) fn(__VA_ARGS__, 3); \
        else if ((rb) == 2) fn(__VA_ARGS__, 2); \
        else fn(__VA_ARGS__, 1);               \
    } while (0)

/* Both key kernels: per group of up to RBW heads the fold (wide: the 15-bit
 * fold_wide, else the 8-bit fold8), then per 32-byte chunk of the rows (128
 * tokens) the code quads and their scores. Always inlined, wide a constant
 * at each call, and the entry points pass the engines' shapes as constants. */
AI void qk_vbmi(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb, int wide) {
    float scale[KKV_MAX_HEAD_DIM], mn[KKV_MAX_HEAD_DIM]; /* [D] */
    kkv_key_layout L = key_page_f32(scale, mn, page, D, G, nb);
    size_t rowb = (size_t)G / 4;
    int nq = D / 4, nh = (nb + 3) / 4;
    const __m512i ix0 = _mm512_loadu_si512(quad_ix[0]), ix1 = _mm512_loadu_si512(quad_ix[1]);
    for (int r0 = 0; r0 < n_rep; r0 += RBW) {
        int rb = n_rep - r0 < RBW ? n_rep - r0 : RBW;
        float d[RBW], cst[RBW];
        /* wide: [head][a, b][WQ] byte planes; 8-bit: [head][WB] bytes */
        int8_t wbuf[RBW * 2 * WQ];
        _Static_assert(RBW * WB <= RBW * 2 * WQ, "the 8-bit weights fit the wide ones' buffer");
        int8_t(*w2)[2][WQ] = (int8_t(*)[2][WQ])(void *)wbuf;
        int8_t(*w1)[WB] = (int8_t(*)[WB])(void *)wbuf;
        const float *qr = q + (size_t)r0 * D;
        if (!(wide ? fold_wide(w2, d, cst, qr, rb, scale, mn, page + L.idx, D, nb)
                   : fold8(w1, d, cst, qr, rb, scale, mn, page + L.idx, D, nb))) {
            kkv_avx2_qk_page(s, q, n_rep, page, D, G, nb);
            return;
        }
        for (size_t c = 0; c < rowb; c += 32) {
            int nbytes = rowb - c < 32 ? (int)(rowb - c) : 32;
            __mmask32 m = nbytes == 32 ? 0xFFFFFFFFu : (1u << nbytes) - 1;
            __m512i T[2 * KKV_MAX_HEAD_DIM / 4][2]; /* [quad][half]: lo quads, then hi quads */
            chunk_quads(T, page + L.lo + c, page + L.hi + c, rowb, m, D, nb, ix0, ix1);
            float *sr = s + (size_t)r0 * G + 4 * c;
            const __m512i(*Tc)[2] = (const __m512i(*)[2])T;
            if (wide) RB_CALL(quads_rb, rb, sr, G, Tc, nq, nh, (const int8_t(*)[2][WQ])w2, d, cst, nbytes);
            else RB_CALL(quads8_rb, rb, sr, G, Tc, nq, nh, (const int8_t(*)[WB])w1, d, cst, nbytes);
        }
    }
}

AI void qk_wide(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    qk_vbmi(s, q, n_rep, page, D, G, nb, 1);
}
AI void qk_byte(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    qk_vbmi(s, q, n_rep, page, D, G, nb, 0);
}

void kkv_vbmi512_qk_wide(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    KKV_QK_ENGINE_SHAPES(qk_wide, s, q, n_rep, page, D, G, nb);
}

void kkv_vbmi512_qk_byte(float *s, const float *q, int n_rep, const uint8_t *page, int D, int G, int nb) {
    if (2 * nb > D) { /* mostly 4-bit keys: the 15-bit query */
        kkv_vbmi512_qk_wide(s, q, n_rep, page, D, G, nb);
        return;
    }
    KKV_QK_ENGINE_SHAPES(qk_byte, s, q, n_rep, page, D, G, nb);
}
