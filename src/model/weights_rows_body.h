/* The body of the row-block kernels (weights_rows_impl.h includes it once
 * per register width, RW_N rows of one lane each): RW_FN(res, type, rp, nb,
 * xq, nx, pf, pf_end) sets res[j * RW_N + r] = row r . x_j for the RW_N rows
 * rp and nx x vectors, with the scalar reference's arithmetic per lane
 * (weights_rows_impl.h says how). The includer defines the RW_ names: the
 * vector types, their intrinsics, RW_ROWS_T (transposed code bytes) and
 * RW_ROWS_F16 (one fp16 per row), RW_DPBUSD where vpdpbusd is there, and
 * RW_ROWS_G (register i of a packed field read 4 bytes at a time) for the
 * packed kernels, the only ones that read Q5_0, Q5_1 and the K-quants; they are
 * undefined at the end. */

/* acc = acc + (d_w * d_x) * (float)sumi, lane by lane, rounded as the scalar
 * code rounds it. */
#define RW_ADD_BLOCK(acc, dw, x, sumi) RW_ADDF(acc, RW_MUL(RW_MUL(dw, RW_SETF((x)->d)), RW_CVT(sumi)))
/* Four bytes of an x block, in every lane. */
#define RW_X4(x, i) RW_SET32(ld32((const uint8_t *)(x)->q + 4 * (i)))
/* The vpmaddubsw products of code registers c[i0 .. i0 + n) (n even) with
 * x's registers xi0 .. xi0 + n, added in int16: each int16 lane then holds
 * 2n products of a code and an x of |x| <= 128, exact while 2n * 128 * (the
 * largest code) <= 32767 (every caller says why its n keeps to that). One
 * vpmaddwd then widens (and scales) the whole sum, where one per register
 * was twice the multiplies: Q4_1 with 8 and 16 x vectors went from 106 to
 * 125 GFLOP/s on one Zen 3 core (test_weights --bench, with the mins' pass
 * below), Q6_K from 84 to 93, Q4_K from 93-97 to 105. Q4 and Q5 take it
 * only without vpdpbusd (RW_DOT_Q), the K-quants in every build. The sums
 * are the same integers, so the same bits; test_weights' extremes (every
 * code at its maximum, every x at +-127) fail if one register too many is
 * added. */
#define RW_SUM16(p, c, i0, x, xi0, n)                                                              \
    do {                                                                                           \
        /* two chains, the even and the odd registers: half as long as one */                     \
        RW_I q_ = RW_MADDUBS((c)[(i0) + 1], RW_X4(x, (xi0) + 1));                                  \
        (p) = RW_MADDUBS((c)[i0], RW_X4(x, xi0));                                                  \
        for (int u_ = 2; u_ < (n); u_ += 2) {                                                      \
            (p) = RW_ADD16((p), RW_MADDUBS((c)[(i0) + u_], RW_X4(x, (xi0) + u_)));                 \
            q_ = RW_ADD16(q_, RW_MADDUBS((c)[(i0) + u_ + 1], RW_X4(x, (xi0) + u_ + 1)));           \
        }                                                                                          \
        (p) = RW_ADD16((p), q_);                                                                   \
    } while (0)
/* s = m * (lo[0..3] . x[0..3] + hi[0..3] . x[4..7]), exact in int32, for a
 * 32-value block of codes 0..15 (wide 0: one int16 sum of all eight
 * registers, 16 products of <= 15 * 128 = 30720) or 0..31 (wide 1: one of
 * each four, 8 of <= 31 * 128 = 31744), widened by vpmaddwd with m, the
 * int16 pairs (k, k) of a multiplier k (1, or a K-quant's sub-block scale). */
#define RW_WIDEN_Q(s, lo, hi, x, wide, m)                                                          \
    do {                                                                                           \
        RW_I p0_, p1_;                                                                             \
        RW_SUM16(p0_, lo, 0, x, 0, 4);                                                             \
        RW_SUM16(p1_, hi, 0, x, 4, 4);                                                             \
        (s) = (wide) ? RW_ADD32(RW_MADD(p0_, m), RW_MADD(p1_, m)) : RW_MADD(RW_ADD16(p0_, p1_), m); \
    } while (0)
/* s = lo . x + hi . x of a Q4 (wide 0) or Q5 (wide 1) block: one vpdpbusd
 * per register where there is one, else RW_WIDEN_Q by ones. */
#ifdef RW_DPBUSD
#define RW_DOT_Q(s, lo, hi, x, wide)                                                               \
    do {                                                                                           \
        RW_I s0_ = RW_ZERO_I(), s1_ = RW_ZERO_I();                                                 \
        for (int i_ = 0; i_ < 4; i_++) {                                                           \
            s0_ = RW_DPB(s0_, (lo)[i_], RW_X4(x, i_));                                             \
            s1_ = RW_DPB(s1_, (hi)[i_], RW_X4(x, 4 + i_));                                         \
        }                                                                                          \
        (s) = RW_ADD32(s0_, s1_);                                                                  \
    } while (0)
#else
#define RW_DOT_Q(s, lo, hi, x, wide) RW_WIDEN_Q(s, lo, hi, x, wide, RW_SET16(1))
#endif
/* accm[j] += m_w * s_x over the blocks of a type whose block (bb bytes)
 * holds fp16 d, then fp16 m (Q4_1, Q5_1): in a pass of its own after the
 * blocks, the same additions in the same order per lane as inside the block
 * loop, but off its registers (inside it, 16 x vectors ran 10% slower per
 * vector than 8). */
#define RW_ADD_MINS(accm, rp, bb, xq, nb, nx)                                                      \
    for (int j_ = 0; j_ < (nx); j_++)                                                              \
        for (int64_t b_ = 0; b_ < (nb); b_++)                                                      \
            (accm)[j_] = RW_ADDF((accm)[j_], RW_MUL(RW_ROWS_F16(rp, (bb) * (size_t)b_ + 2), RW_SETF((xq)[j_][b_].s)))

static inline __attribute__((always_inline)) void RW_FN(float *res, uint32_t type,
                                                        const uint8_t *const *rp, int64_t nb,
                                                        const kkv_q8x *const *xq, const int nx,
                                                        const uint8_t *pf, const uint8_t *pf_end) {
    /* the caller's prefetch range, a few lines per block: issued at once, a
     * block of long rows (8 x 960 B for a 1536-column Q4_1) stalled on the
     * miss buffers and streamed at 0.6x the one-row kernel's rate */
    const int64_t pf_lines = pf < pf_end ? (pf_end - pf + 63) / 64 : 0;
    const int64_t pf_per = nb > 0 ? (pf_lines + nb - 1) / nb : 0;
    const int pf_l2 = kkv_cpu_get()->wt_pf_l2;
    RW_F acc[KKV_WT_NX], accm[KKV_WT_NX];
    for (int j = 0; j < nx; j++) acc[j] = accm[j] = RW_ZERO_F();
    const RW_I m4 = RW_SET8(0x0f);
    if (type == KKV_WT_Q4_0 || type == KKV_WT_Q4_1) {
        const int one = type == KKV_WT_Q4_1;
        const size_t bb = one ? 20 : 18, qoff = one ? 4 : 2;
        for (int64_t b = 0; b < nb; b++) {
            for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
            const size_t o = bb * (size_t)b;
            RW_F dw = RW_ROWS_F16(rp, o);
            RW_I t[4], lo[4], hi[4];
            RW_ROWS_T(t, rp, o + qoff);
            for (int i = 0; i < 4; i++) {
                lo[i] = RW_AND(t[i], m4); /* values 4i..4i+3 */
                hi[i] = RW_AND(RW_SRLI16(t[i], 4), m4); /* 16 + 4i.. */
            }
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                RW_I s;
                RW_DOT_Q(s, lo, hi, x, 0);
                if (!one) s = RW_SUB32(s, RW_SET32(8 * x->isum));
                acc[j] = RW_ADD_BLOCK(acc[j], dw, x, s);
            }
        }
        if (one) RW_ADD_MINS(accm, rp, bb, xq, nb, nx);
    }
#ifdef RW_ROWS_G
    else if (type == KKV_WT_Q5_0 || type == KKV_WT_Q5_1) {
        /* The Q4 branch above plus the fifth bits; kept apart on purpose:
         * folded into it with a runtime `five`, Q4_1 with 8 vectors ran 2%
         * slower hot (test_weights --bench, three rounds). Q4's nibbles
         * plus a fifth bit: byte k of row r's lane in register
         * g (lo[0..3], then hi[0..3]) is value 4g + k, whose fifth bit is bit
         * g of byte k of the lane in h (kkv_wt_pack). A 16-bit shift by 4 - g
         * takes it to bit 4 without carrying a neighbour's bit there (|4 - g|
         * <= 4, and bit 4 of a byte only ever receives bits of that byte). */
        const int one = type == KKV_WT_Q5_1;
        const size_t bb = one ? 24 : 22, hoff = one ? 4 : 2, qoff = one ? 8 : 6;
        const RW_I m16 = RW_SET8(0x10);
        for (int64_t b = 0; b < nb; b++) {
            for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
            const size_t o = bb * (size_t)b;
            RW_F dw = RW_ROWS_F16(rp, o);
            const RW_I h = RW_ROWS_G(rp, o + hoff, 0);
            RW_I t[4], lo[4], hi[4];
            RW_ROWS_T(t, rp, o + qoff);
            lo[0] = RW_OR(RW_AND(t[0], m4), RW_AND(RW_SLLI16(h, 4), m16)); /* values 0..3 */
            lo[1] = RW_OR(RW_AND(t[1], m4), RW_AND(RW_SLLI16(h, 3), m16));
            lo[2] = RW_OR(RW_AND(t[2], m4), RW_AND(RW_SLLI16(h, 2), m16));
            lo[3] = RW_OR(RW_AND(t[3], m4), RW_AND(RW_SLLI16(h, 1), m16));
            hi[0] = RW_OR(RW_AND(RW_SRLI16(t[0], 4), m4), RW_AND(h, m16)); /* values 16..19 */
            hi[1] = RW_OR(RW_AND(RW_SRLI16(t[1], 4), m4), RW_AND(RW_SRLI16(h, 1), m16));
            hi[2] = RW_OR(RW_AND(RW_SRLI16(t[2], 4), m4), RW_AND(RW_SRLI16(h, 2), m16));
            hi[3] = RW_OR(RW_AND(RW_SRLI16(t[3], 4), m4), RW_AND(RW_SRLI16(h, 3), m16));
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                RW_I s;
                RW_DOT_Q(s, lo, hi, x, 1); /* codes 0..31 */
                if (!one) s = RW_SUB32(s, RW_SET32(16 * x->isum));
                acc[j] = RW_ADD_BLOCK(acc[j], dw, x, s);
            }
        }
        if (one) RW_ADD_MINS(accm, rp, bb, xq, nb, nx);
    } else if (type == KKV_WT_Q4_K || type == KKV_WT_Q5_K) {
        /* Super-blocks of 256 values (144 bytes): fp16 d, dmin, 12 bytes of
         * 6-bit sub-block scales and mins, then 128 code bytes, sub-block k
         * in the low (k even) or high nibbles of bytes 32 (k / 2) ... Q5_K
         * (176 bytes) has 32 bytes qh before the codes: bit k of qh[l] is the
         * fifth bit of sub-block k's value l, and register i of qh holds the
         * same values as register i of the codes, so a 16-bit shift by 4 - k
         * and a mask put it in place (as for Q5_0, no neighbour's bit). Per
         * block, as the scalar code: sumi = scale_k * (codes . x), exact in
         * int32 (vpmaddwd by the scale instead of by 1), acc += (d * d_x) *
         * sumi; accm -= (dmin * d_x) * (min_k * isum), where min_k * isum
         * (< 2^18) is exact in fp32 either way. */
        const int five = type == KKV_WT_Q5_K;
        const size_t bb = five ? 176 : 144, qoff = five ? 48 : 16;
        const RW_I m6 = RW_SET8(0x3f), m30 = RW_SET8(0x30), mff = RW_SET32(0xff), m16 = RW_SET8(0x10);
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const size_t o = bb * (size_t)sb;
            RW_F dw = RW_ROWS_F16(rp, o), dmw = RW_ROWS_F16(rp, o + 2);
            const RW_I s0 = RW_ROWS_G(rp, o + 4, 0), s1 = RW_ROWS_G(rp, o + 4, 1), s2 = RW_ROWS_G(rp, o + 4, 2);
            /* bytes k of each lane: scales and mins of sub-blocks k (lo) and 4 + k (hi) */
            const RW_I sc_lo = RW_AND(s0, m6), mn_lo = RW_AND(s1, m6);
            const RW_I sc_hi = RW_OR(RW_AND(s2, m4), RW_AND(RW_SRLI16(s0, 2), m30));
            const RW_I mn_hi = RW_OR(RW_AND(RW_SRLI16(s2, 4), m4), RW_AND(RW_SRLI16(s1, 2), m30));
            for (int kp = 0; kp < 4; kp++) {
                for (int64_t i = 0; i < 2 * pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
                RW_I c[8];
                for (int i = 0; i < 8; i++) c[i] = RW_ROWS_G(rp, o + qoff + 32 * (size_t)kp, i);
                for (int e = 0; e < 2; e++) {
                    const int k = 2 * kp + e;
                    const RW_I scs = k < 4 ? sc_lo : sc_hi, mns = k < 4 ? mn_lo : mn_hi;
                    const RW_I sc = RW_AND(RW_SRLI32(scs, 8 * (k & 3)), mff);
                    const RW_I scw = RW_OR(sc, RW_SLLI32(sc, 16)); /* (scale, scale) int16 */
                    const RW_F mnf = RW_CVT(RW_AND(RW_SRLI32(mns, 8 * (k & 3)), mff));
                    RW_I q[8];
                    for (int i = 0; i < 8; i++) {
                        q[i] = e ? RW_AND(RW_SRLI16(c[i], 4), m4) : RW_AND(c[i], m4);
                        if (five) {
                            RW_I h = RW_ROWS_G(rp, o + 16, i);
                            h = k < 4 ? RW_SLLI16(h, 4 - k) : k == 4 ? h : RW_SRLI16(h, k - 4);
                            q[i] = RW_OR(q[i], RW_AND(h, m16));
                        }
                    }
                    for (int j = 0; j < nx; j++) {
                        const kkv_q8x *x = &xq[j][8 * sb + k];
                        RW_I s; /* codes 0..15 (Q4_K) or 0..31 (Q5_K), times the scale */
                        RW_WIDEN_Q(s, q, q + 4, x, five, scw);
                        acc[j] = RW_ADD_BLOCK(acc[j], dw, x, s);
                        accm[j] = RW_SUBF(accm[j], RW_MUL(RW_MUL(dmw, RW_SETF(x->d)),
                                                          RW_MUL(mnf, RW_SETF((float)x->isum))));
                    }
                }
            }
        }
    } else if (type == KKV_WT_Q6_K) {
        /* Super-blocks of 256 values (210 bytes): ql[128], qh[64], 16 int8
         * scales (one per 16 values), fp16 d. Block k (half h = k / 4,
         * quarter q = k % 4): the low (q < 2) or high nibbles of ql[64 h +
         * 32 (q % 2) ..] with bits 2q, 2q + 1 of qh[32 h ..] above them, codes
         * 0..63 for values code - 32. As the scalar code: sumi = sc0 (codes .
         * x - 32 isum16) + sc1 (... over values 16..31), exact in int32:
         * vpmaddwd by each half's scale, and the offsets as one vpmaddwd of
         * (sc0, sc1) by (isum16, isum - isum16). acc += (d * d_x) * sumi. */
        const RW_I m30 = RW_SET8(0x30), mlo = RW_SET32(0xffff);
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const size_t o = 210 * (size_t)sb;
            RW_F dw = RW_ROWS_F16(rp, o + 208);
            for (int k = 0; k < 8; k++) {
                for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
                const int h = k >> 2, q = k & 3;
                RW_I c[8];
                for (int i = 0; i < 8; i++) {
                    RW_I l = RW_ROWS_G(rp, o + 64 * (size_t)h + 32 * (size_t)(q & 1), i);
                    RW_I u = RW_ROWS_G(rp, o + 128 + 32 * (size_t)h, i);
                    l = q & 2 ? RW_AND(RW_SRLI16(l, 4), m4) : RW_AND(l, m4);
                    /* bits 2q, 2q + 1 of each qh byte to bits 4, 5 (16-bit
                     * shifts by <= 4 bring no neighbour's bit there) */
                    u = q == 0 ? RW_SLLI16(u, 4) : q == 1 ? RW_SLLI16(u, 2) : q == 2 ? u : RW_SRLI16(u, 2);
                    c[i] = RW_OR(l, RW_AND(u, m30));
                }
                /* int8 scales 2k, 2k + 1: bytes 2 (k % 2), + 1 of register k / 2 */
                const RW_I v = RW_SRLI32(RW_ROWS_G(rp, o + 192, k >> 1), 16 * (k & 1));
                const RW_I sc0 = RW_SRAI16(RW_SLLI16(v, 8), 8), sc1 = RW_SRAI16(v, 8); /* low words */
                const RW_I scw0 = RW_OR(RW_AND(sc0, mlo), RW_SLLI32(sc0, 16));
                const RW_I scw1 = RW_OR(RW_AND(sc1, mlo), RW_SLLI32(sc1, 16));
                const RW_I scp = RW_OR(RW_AND(sc0, mlo), RW_SLLI32(sc1, 16));
                for (int j = 0; j < nx; j++) {
                    const kkv_q8x *x = &xq[j][8 * sb + k];
                    /* codes 0..63: int16 sums of two registers (<= 4 * 63 *
                     * 128 = 32256), each widened by its half's scale */
                    RW_I s = RW_ZERO_I();
                    for (int i = 0; i < 8; i += 2) {
                        RW_I p;
                        RW_SUM16(p, c, i, x, i, 2);
                        s = RW_ADD32(s, RW_MADD(p, i < 4 ? scw0 : scw1));
                    }
                    /* |isum16|, |isum - isum16| <= 16 * 127: int16 */
                    const uint32_t isp = (uint32_t)(uint16_t)(int16_t)x->isum16 |
                                         (uint32_t)(uint16_t)(int16_t)(x->isum - x->isum16) << 16;
                    const RW_I off = RW_MADD(scp, RW_SET32((int)isp));
                    s = RW_SUB32(s, RW_SLLI32(off, 5));
                    acc[j] = RW_ADD_BLOCK(acc[j], dw, x, s);
                }
            }
        }
    }
#endif
    else { /* KKV_WT_Q8_0 */
        for (int64_t b = 0; b < nb; b++) {
            for (int64_t i = 0; i < pf_per && pf < pf_end; i++, pf += 64) KKV_WT_PF(pf, pf_l2);
            const size_t o = 34 * (size_t)b;
            RW_F dw = RW_ROWS_F16(rp, o);
            RW_I w[8];
            RW_ROWS_T(w, rp, o + 2);      /* values 4i..4i+3, i < 4 */
            RW_ROWS_T(w + 4, rp, o + 18); /* 16 + ... */
#ifdef RW_DPBUSD
            for (int i = 0; i < 8; i++) w[i] = RW_XOR(w[i], RW_SET8((char)0x80));
#else
            RW_I wa[8];
            for (int i = 0; i < 8; i++) wa[i] = _mm256_abs_epi8(w[i]);
#endif
            for (int j = 0; j < nx; j++) {
                const kkv_q8x *x = &xq[j][b];
                RW_I s0 = RW_ZERO_I(), s1 = RW_ZERO_I();
                for (int i = 0; i < 4; i++) {
#ifdef RW_DPBUSD
                    s0 = RW_DPB(s0, w[i], RW_X4(x, i));
                    s1 = RW_DPB(s1, w[4 + i], RW_X4(x, 4 + i));
#else
                    s0 = RW_DPB(s0, wa[i], _mm256_sign_epi8(RW_X4(x, i), w[i]));
                    s1 = RW_DPB(s1, wa[4 + i], _mm256_sign_epi8(RW_X4(x, 4 + i), w[4 + i]));
#endif
                }
                RW_I s = RW_ADD32(s0, s1);
#ifdef RW_DPBUSD
                s = RW_SUB32(s, RW_SET32(128 * x->isum));
#endif
                acc[j] = RW_ADD_BLOCK(acc[j], dw, x, s);
            }
        }
    }
    for (int j = 0; j < nx; j++) RW_STORE(res + RW_N * j, RW_ADDF(acc[j], accm[j]));
}

#undef RW_ADD_BLOCK
#undef RW_X4
#undef RW_FN
#undef RW_N
#undef RW_I
#undef RW_F
#undef RW_ZERO_I
#undef RW_ZERO_F
#undef RW_SET8
#undef RW_SET16
#undef RW_SET32
#undef RW_SETF
#undef RW_AND
#undef RW_XOR
#undef RW_SRLI16
#undef RW_ADD32
#undef RW_ADD16
#undef RW_SUM16
#undef RW_DOT_Q
#undef RW_WIDEN_Q
#undef RW_ADD_MINS
#undef RW_SUB32
#undef RW_DPB
#undef RW_CVT
#undef RW_MUL
#undef RW_ADDF
#undef RW_STORE
#undef RW_ROWS_T
#undef RW_ROWS_F16
#undef RW_ROWS_G
#undef RW_DPBUSD
#undef RW_OR
#undef RW_SLLI16
#undef RW_SRLI32
#undef RW_SRAI16
#undef RW_SLLI32
#undef RW_MADDUBS
#undef RW_MADD
#undef RW_SUBF
