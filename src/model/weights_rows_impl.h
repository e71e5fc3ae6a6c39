/* Eight weight rows at once for Q4_0, Q4_1 and Q8_0 (part of
 * weights_avx2_impl.h; built in each of its three kernel sets).
 *
 * Why. The one-row kernel keeps 8 fp32 lanes per (row, x vector) and pays a
 * convert, a multiply and an FMA for every 32-value block and x vector; in a
 * batch those float operations outnumber the integer dots. Here one int32
 * lane is one row: a block of eight rows is transposed in registers (four
 * bytes of each row per lane), each x vector's block is broadcast four bytes
 * at a time, and eight u8 x s8 quad dots leave the exact integer block sum
 * of all eight rows in one register. The float work per block and x vector
 * is then one convert and a few multiplies and adds for eight rows.
 *
 * Arithmetic: per row, exactly the scalar reference's (weights.c
 * sdot_row_q): block by block, acc += (d_w * d_x) * (float)sumi and, for
 * Q4_1, accm += m_w * s_x, then acc + accm, each operation rounded once as
 * there (the build has -ffp-contract=off). So these kernels give the scalar
 * kernels' bits, whatever the row's neighbours, the batch or the threads.
 *
 * Integer sums: Q4_1's codes are 0..15, dotted as unsigned. Q4_0's are
 * c - 8 with c 0..15: the sum of c * x minus 8 * (sum of x). Q8_0's are
 * signed: with vpdpbusd (no int16 stage) w + 128 as unsigned, minus 128 *
 * (sum of x); with vpmaddubsw that could saturate int16, so there |w| against
 * x with w's sign. All exact in int32. */

/* A block of eight rows: row pointers (a tail repeats one row; the extra
 * lanes are computed and dropped). */
#define WT_ROWS KKV_WT_ROWS

/* acc + the four u8 x s8 products of each int32 lane. */
static inline __m256i dpb(__m256i acc, __m256i u, __m256i s) {
#ifdef KKV_WT_DPBUSD
    return KKV_WT_DPBUSD(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

static inline int32_t ld32(const uint8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline short ld16(const uint8_t *p) {
    short v;
    memcpy(&v, p, 2);
    return v;
}

/* 16 bytes at a (rows 0..3) and b (rows 4..7) as one register. */
static inline __m256i ld_pair(const uint8_t *a, const uint8_t *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)a)),
                                   _mm_loadu_si128((const __m128i *)(const void *)b), 1);
}

/* The 16 bytes at offset off of each of the eight rows, transposed: t[i]
 * holds bytes 4i..4i+3 of row r in int32 lane r. */
static inline void rows_16(__m256i t[4], const uint8_t *const *rp, size_t off) {
    __m256i a0 = ld_pair(rp[0] + off, rp[4] + off), a1 = ld_pair(rp[1] + off, rp[5] + off);
    __m256i a2 = ld_pair(rp[2] + off, rp[6] + off), a3 = ld_pair(rp[3] + off, rp[7] + off);
    __m256i u0 = _mm256_unpacklo_epi32(a0, a1), u1 = _mm256_unpackhi_epi32(a0, a1);
    __m256i u2 = _mm256_unpacklo_epi32(a2, a3), u3 = _mm256_unpackhi_epi32(a2, a3);
    t[0] = _mm256_unpacklo_epi64(u0, u2);
    t[1] = _mm256_unpackhi_epi64(u0, u2);
    t[2] = _mm256_unpacklo_epi64(u1, u3);
    t[3] = _mm256_unpackhi_epi64(u1, u3);
}

/* One fp16 at offset off of each row, as 8 fp32 lanes. */
static inline __m256 rows_f16(const uint8_t *const *rp, size_t off) {
    __m128i h = _mm_setr_epi16(ld16(rp[0] + off), ld16(rp[1] + off), ld16(rp[2] + off), ld16(rp[3] + off),
                               ld16(rp[4] + off), ld16(rp[5] + off), ld16(rp[6] + off), ld16(rp[7] + off));
    return _mm256_cvtph_ps(h);
}

/* Four bytes of an x block, in every lane. */
static inline __m256i x4(const kkv_q8x *x, int i) { return _mm256_set1_epi32(ld32((const uint8_t *)x->q + 4 * i)); }

/* acc = acc + (d_w * d_x) * (float)sumi, lane by lane, rounded as the scalar
 * code rounds it. */
static inline __m256 add_block(__m256 acc, __m256 dw, const kkv_q8x *x, __m256i sumi) {
    __m256 p = _mm256_mul_ps(dw, _mm256_broadcast_ss(&x->d));
    return _mm256_add_ps(acc, _mm256_mul_ps(p, _mm256_cvtepi32_ps(sumi)));
}

/* res[j * 8 + r] = row r . x_j for the eight rows rp and nx x vectors. */
static inline __attribute__((always_inline)) void rows_q_nx(float *res, uint32_t type,
                                                            const uint8_t *const *rp, int64_t nb,
                                                            const kkv_q8x *const *xq, const int nx,
                                                            const uint8_t *pf, const uint8_t *pf_end) {
    /* the caller's prefetch range, a few lines per block: issued at once, a
     * block of long rows (8 x 960 B for a 1536-column Q4_1) stalled on the
     * miss buffers and streamed at 0.6x the one-row kernel's rate */
    const int64_t pf_lines = pf < pf_end ? (pf_end - pf + 63) / 64 : 0;
    const int64_t pf_per = nb > 0 ? (pf_lines + nb - 1) / nb : 0;
    __m256 acc[KKV_WT_NX], accm[KKV_WT_NX];
    for (int j = 0; j < nx; j++) acc[j] = accm[j] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (type == KKV_WT_Q4_0 || type == KKV_WT_Q4_1) {
        const int one = type == KKV_WT_Q4_1;
        const size_t bb = one ? 20 : 18, qoff = one ? 4 : 2;
        for (int64_t b = 0; b < nb; b++) {
            for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) __builtin_prefetch(pf, 0, 0);
            const size_t o = bb * (size_t)b;
            __m256 dw = rows_f16(rp, o), mw = one ? rows_f16(rp, o + 2) : _mm256_setzero_ps();
            __m256i t[4], lo[4], hi[4];
            rows_16(t, rp, o + qoff);
            for (int i = 0; i < 4; i++) {
                lo[i] = _mm256_and_si256(t[i], m4); /* values 4i..4i+3 */
                hi[i] = _mm256_and_si256(_mm256_srli_epi16(t[i], 4), m4); /* 16 + 4i.. */
            }
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                for (int i = 0; i < 4; i++) {
                    s0 = dpb(s0, lo[i], x4(x, i));
                    s1 = dpb(s1, hi[i], x4(x, 4 + i));
                }
                __m256i s = _mm256_add_epi32(s0, s1);
                if (!one) s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * x->isum));
                acc[j] = add_block(acc[j], dw, x, s);
                if (one) accm[j] = _mm256_add_ps(accm[j], _mm256_mul_ps(mw, _mm256_broadcast_ss(&x->s)));
            }
        }
    } else { /* KKV_WT_Q8_0 */
        for (int64_t b = 0; b < nb; b++) {
            for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) __builtin_prefetch(pf, 0, 0);
            const size_t o = 34 * (size_t)b;
            __m256 dw = rows_f16(rp, o);
            __m256i w[8];
            rows_16(w, rp, o + 2);      /* values 4i..4i+3, i < 4 */
            rows_16(w + 4, rp, o + 18); /* 16 + ... */
#ifdef KKV_WT_DPBUSD
            for (int i = 0; i < 8; i++) w[i] = _mm256_xor_si256(w[i], _mm256_set1_epi8((char)0x80));
#else
            __m256i wa[8];
            for (int i = 0; i < 8; i++) wa[i] = _mm256_abs_epi8(w[i]);
#endif
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
                for (int i = 0; i < 4; i++) {
#ifdef KKV_WT_DPBUSD
                    s0 = dpb(s0, w[i], x4(x, i));
                    s1 = dpb(s1, w[4 + i], x4(x, 4 + i));
#else
                    s0 = dpb(s0, wa[i], _mm256_sign_epi8(x4(x, i), w[i]));
                    s1 = dpb(s1, wa[4 + i], _mm256_sign_epi8(x4(x, 4 + i), w[4 + i]));
#endif
                }
                __m256i s = _mm256_add_epi32(s0, s1);
#ifdef KKV_WT_DPBUSD
                s = _mm256_sub_epi32(s, _mm256_set1_epi32(128 * x->isum));
#endif
                acc[j] = add_block(acc[j], dw, x, s);
            }
        }
    }
    for (int j = 0; j < nx; j++) _mm256_storeu_ps(res + WT_ROWS * j, _mm256_add_ps(acc[j], accm[j]));
}

static int rows_covers(uint32_t type) {
    return type == KKV_WT_Q4_0 || type == KKV_WT_Q4_1 || type == KKV_WT_Q8_0;
}

static int avx2_dot_q_rows(float *res, uint32_t type, const uint8_t *const *rows, int64_t cols,
                           const kkv_q8x *const *xq, int nx, const uint8_t *pf, const uint8_t *pf_end) {
    if (!rows_covers(type)) return 0;
    if (nx == 0) return 1; /* the question alone */
    int64_t nb = cols / 32;
    switch (nx) {
    case 1: rows_q_nx(res, type, rows, nb, xq, 1, pf, pf_end); break;
    case 2: rows_q_nx(res, type, rows, nb, xq, 2, pf, pf_end); break;
    case 3: rows_q_nx(res, type, rows, nb, xq, 3, pf, pf_end); break;
    case 4: rows_q_nx(res, type, rows, nb, xq, 4, pf, pf_end); break;
    case 5: rows_q_nx(res, type, rows, nb, xq, 5, pf, pf_end); break;
    case 6: rows_q_nx(res, type, rows, nb, xq, 6, pf, pf_end); break;
    case 7: rows_q_nx(res, type, rows, nb, xq, 7, pf, pf_end); break;
    default: rows_q_nx(res, type, rows, nb, xq, 8, pf, pf_end); break;
    }
    return 1;
}
