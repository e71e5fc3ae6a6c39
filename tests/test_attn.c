/* Fused decode attention (kkv_attend) against plain softmax attention computed
 * in double precision over the cache as kkv_seq_read() returns it, for every
 * method, GQA ratios 1/3/4/8, head_dim 64 and 128, odd lengths that end in the
 * sink, in a full unflushed Q-buffer, and past several page groups. Also:
 * bit-identical results for any thread count, and kkv_attend_batch equal to
 * kkv_attend sequence by sequence. The fp32-rounding tolerance
 * below is the scalar kernel's: run_case uses it, so this checks the page
 * traversal and merge exactly. The SIMD page kernels work in the integer
 * domain with their own error bound (src/kernels/kernels.h); that agreement, end
 * to end too, is tests/test_kernels.c's job. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_model.h"
#include "testutil.h"
#include "tu_ref_attend.h"

typedef struct stats {
    double worst_ratio; /* max |err| / tol over all outputs */
    double worst_abs;
    long   outputs;
    int    teeth; /* the wrong-head reference is rejected by the tolerance */
    int    drop_tried, drop_caught; /* reference without the newest token */
} stats;

/* One configuration: method, n_kv, n_rep, D; attends at several lengths. */
static void run_case(stats *st, const char *name, int n_kv, int n_rep, int D, int extreme) {
    enum { TMAX = 1301 };
    const int at[] = {1, 31, 33, 159, 160, 161, 287, 289, 417, 1057, 1185, TMAX};
    kkv_method m;
    kkv_method_from_name(&m, name);
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = n_kv, .head_dim = D,
                            .pool_bytes = 256u << 20, .method = m};
    kkv_cache *c = NULL;
    if (kkv_cache_create(&c, &cfg) != KKV_OK) {
        CHECK(0, "cache_create: %s", kkv_last_error());
        return;
    }
    kkv_cache_set_kernel(c, KKV_KERNEL_SCALAR); /* flush bytes are the same for every kernel */
    int seq;
    kkv_seq_add(c, &seq);
    int n_q = n_kv * n_rep;
    size_t row = (size_t)n_kv * D;
    tu_rng r = tu_rng_make((uint64_t)D * 1000 + (uint64_t)n_q * 10 + (uint64_t)extreme);
    float *k = malloc(row * sizeof *k), *v = malloc(row * sizeof *v);
    float *q = malloc((size_t)n_q * D * sizeof *q), *out = malloc((size_t)n_q * D * sizeof *out);
    float *rk = malloc((size_t)TMAX * D * sizeof *rk), *rv = malloc((size_t)TMAX * D * sizeof *rv);
    double *ref = malloc((size_t)D * sizeof *ref), *tol = malloc((size_t)D * sizeof *tol);
    double *wrong = malloc((size_t)D * sizeof *wrong), *tw = malloc((size_t)D * sizeof *tw);
    size_t ai = 0;
    for (int t = 0; t < TMAX; t++) {
        for (size_t i = 0; i < row; i++) {
            int j = (int)(i % (size_t)D);
            /* outlier channels 3 and 17 (mod D), a positive mean on channel 5 */
            float ks = j == 3 || j == 17 ? 8.0f : 1.5f;
            k[i] = ks * tu_normal(&r) + (j == 5 ? 4.0f : 0.0f);
            v[i] = tu_normal(&r);
            if (extreme && t % 7 == 0) k[i] *= 3000.0f; /* near and beyond the fp16 range */
            if (extreme && t % 5 == 0) v[i] *= 20000.0f;
        }
        CHECK(kkv_append(c, seq, 0, k, v) == KKV_OK, "append: %s", kkv_last_error());
        if (ai < sizeof at / sizeof *at && t + 1 == at[ai]) {
            ai++;
            int n = t + 1;
            for (int i = 0; i < n_q * D; i++)
                q[i] = (extreme ? 0.01f : 0.7f) * tu_normal(&r);
            kkv_status s = kkv_attend(c, out, seq, 0, q, n_q);
            CHECK(s == KKV_OK, "attend: %s", kkv_last_error());
            for (int kh = 0; kh < n_kv; kh++) {
                kkv_seq_read(c, rk, rv, seq, 0, kh);
                for (int rr = 0; rr < n_rep; rr++) {
                    int h = kh * n_rep + rr;
                    const float *qh = q + (size_t)h * D;
                    tu_ref_attend(ref, tol, qh, rk, rv, n, D);
                    for (int j = 0; j < D; j++) {
                        double e = fabs(out[(size_t)h * D + j] - ref[j]);
                        st->worst_ratio = fmax(st->worst_ratio, e / tol[j]);
                        st->worst_abs = fmax(st->worst_abs, e);
                        st->outputs++;
                        if (!(e <= tol[j])) {
                            CHECK(0, "%s n_kv %d n_rep %d D %d%s n=%d head %d ch %d: %.9g vs %.9g"
                                  " (tol %.3g)", name, n_kv, n_rep, D, extreme ? " extreme" : "",
                                  n, h, j, (double)out[(size_t)h * D + j], ref[j], tol[j]);
                            break;
                        }
                    }
                    /* how often would losing the newest token go unnoticed? */
                    if (n > 1) {
                        tu_ref_attend(wrong, tw, qh, rk, rv, n - 1, D);
                        st->drop_tried++;
                        for (int j = 0; j < D; j++)
                            if (fabs(out[(size_t)h * D + j] - wrong[j]) > tol[j]) {
                                st->drop_caught++;
                                break;
                            }
                    }
                    /* the same query against another KV head must be rejected */
                    if (n_kv > 1 && n > 8) {
                        float *ok_ = malloc((size_t)n * D * sizeof *ok_);
                        float *ov = malloc((size_t)n * D * sizeof *ov);
                        kkv_seq_read(c, ok_, ov, seq, 0, (kh + 1) % n_kv);
                        tu_ref_attend(wrong, tw, qh, ok_, ov, n, D);
                        for (int j = 0; j < D; j++)
                            if (fabs(out[(size_t)h * D + j] - wrong[j]) > tol[j]) {
                                st->teeth++;
                                break;
                            }
                        free(ok_);
                        free(ov);
                    }
                }
            }
        }
        kkv_flush(c, seq, 0);
    }
    kkv_cache_free(c);
    free(k);
    free(v);
    free(q);
    free(out);
    free(rk);
    free(rv);
    free(ref);
    free(tol);
    free(wrong);
    free(tw);
}

/* Same cache contents, n_threads 1 vs 2 vs 4 vs 7: identical bits, at lengths
 * where the work is one task per head, a few (short streams: the sink, the
 * tail's two units) and many. */
static void test_threads(void) {
    enum { H = 2, D = 64, T = 1500, NQ = 8, NCK = 10 };
    const int checkpoints[NCK] = {1, 31, 32, 40, 100, 150, 161, 200, 300, T};
    const char *names[] = {"kitty", "fp16", "kivi-k4v4"};
    static float outs[4][NCK][NQ * D];
    for (int mi = 0; mi < 3; mi++) {
        kkv_method m;
        kkv_method_from_name(&m, names[mi]);
        const int threads[] = {1, 2, 4, 7};
        for (int ti = 0; ti < 4; ti++) {
            kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = H, .head_dim = D,
                                    .pool_bytes = 64u << 20, .n_threads = threads[ti], .method = m};
            kkv_cache *c = NULL;
            if (kkv_cache_create(&c, &cfg) != KKV_OK) {
                CHECK(0, "cache_create: %s", kkv_last_error());
                return;
            }
            int seq;
            kkv_seq_add(c, &seq);
            tu_rng r = tu_rng_make(55);
            float k[H * D], v[H * D], q[NQ * D];
            for (int t = 0, ck = 0; t < T; t++) {
                for (int i = 0; i < H * D; i++) {
                    k[i] = 2.0f * tu_normal(&r);
                    v[i] = tu_normal(&r);
                }
                kkv_append(c, seq, 0, k, v);
                if (t + 1 == checkpoints[ck]) { /* attends before the flush, as a decode step does */
                    for (int i = 0; i < NQ * D; i++) q[i] = tu_normal(&r);
                    CHECK(kkv_attend(c, outs[ti][ck], seq, 0, q, NQ) == KKV_OK, "attend: %s", kkv_last_error());
                    ck++;
                }
                kkv_flush(c, seq, 0);
            }
            kkv_cache_free(c);
        }
        for (int ck = 0; ck < NCK; ck++)
            for (int ti = 1; ti < 4; ti++)
                CHECK(!memcmp(outs[0][ck], outs[ti][ck], sizeof outs[0][ck]),
                      "%s, %d tokens: attention output on %d threads differs from one thread's", names[mi],
                      checkpoints[ck], threads[ti]);
    }
}

/* Argument checks of kkv_attend. */
static void test_args(void) {
    kkv_method m;
    kkv_method_from_name(&m, "kitty");
    kkv_cache_config cfg = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 8,
                            .pool_bytes = 1u << 20, .method = m};
    kkv_cache *c = NULL;
    if (kkv_cache_create(&c, &cfg) != KKV_OK) return;
    int seq;
    kkv_seq_add(c, &seq);
    float kv[16] = {0}, q[48] = {0}, out[48];
    kkv_append(c, seq, 0, kv, kv);
    CHECK(kkv_attend(c, out, seq, 0, q, 3) == KKV_ERR_INVALID_ARG, "n_q 3 with 2 KV heads");
    CHECK(kkv_attend(c, out, seq, 0, q, 0) == KKV_ERR_INVALID_ARG, "n_q 0");
    CHECK(kkv_attend(c, out, seq, 1, q, 2) == KKV_ERR_INVALID_ARG, "attend to an empty layer");
    CHECK(kkv_attend(c, out, seq, 2, q, 2) == KKV_ERR_INVALID_ARG, "layer 2 of 2");
    CHECK(kkv_attend(c, out, seq + 1, 0, q, 2) == KKV_ERR_NOT_FOUND, "no such sequence");
    CHECK(kkv_attend(c, NULL, seq, 0, q, 2) == KKV_ERR_INVALID_ARG, "NULL out");
    /* a single token: the output is that token's value exactly */
    float v1[16];
    for (int i = 0; i < 16; i++) v1[i] = 0.1f * (float)i - 0.5f;
    int s2;
    kkv_seq_add(c, &s2);
    kkv_append(c, s2, 0, kv, v1);
    for (int i = 0; i < 48; i++) q[i] = (float)i;
    CHECK(kkv_attend(c, out, s2, 0, q, 6) == KKV_OK, "attend: %s", kkv_last_error());
    float rv[16];
    kkv_seq_read(c, NULL, rv, s2, 0, 0);
    kkv_seq_read(c, NULL, rv + 8, s2, 0, 1);
    int same = 1;
    for (int h = 0; h < 6; h++)
        for (int j = 0; j < 8; j++) same &= out[h * 8 + j] == rv[(h / 3) * 8 + j];
    CHECK(same, "one token: output is not exactly its value");
    kkv_cache_free(c);
}

/* kkv_attend_batch: sequences of different lengths (in the sink, in the
 * Q-buffer, past several page groups; one repeated) attended in one pass give,
 * block by block, exactly kkv_attend's bytes, on 1 and 2 threads, for plain,
 * rotated, eager and int8-sink methods, and on a windowed layer. Bad calls fail
 * with the right status. */
static void test_batch(void) {
    enum { H = 3, D = 64, NQ = 9, NS = 6, L = 2 };
    const int lens[NS] = {5, 170, 700, 1400, 2300, 290};
    const char *specs[] = {"kitty", "fp16", "kitty-pro:rot=hadamard", "kitty:eager=1:sink8=1",
                           "kivi-k4v2s"};
    const int win[L] = {0, 300}; /* layer 1 attends to its newest 300 tokens */
    for (size_t mi = 0; mi < sizeof specs / sizeof *specs; mi++)
        for (int th = 1; th <= 2; th++) {
            kkv_method m;
            if (kkv_method_parse(&m, specs[mi]) != KKV_OK) {
                CHECK(0, "%s: %s", specs[mi], kkv_last_error());
                return;
            }
            kkv_cache_config cfg = {.n_layers = L, .n_kv_heads = H, .head_dim = D,
                                    .pool_bytes = 256u << 20, .n_threads = th, .method = m,
                                    .layer_window = win};
            kkv_cache *c = NULL;
            if (kkv_cache_create(&c, &cfg) != KKV_OK) {
                CHECK(0, "cache_create %s: %s", specs[mi], kkv_last_error());
                return;
            }
            tu_rng r = tu_rng_make(77 + mi);
            int seqs[NS + 1];
            float k[H * D], v[H * D];
            for (int i = 0; i < NS; i++) {
                kkv_seq_add(c, &seqs[i]);
                for (int t = 0; t < lens[i]; t++)
                    for (int l = 0; l < L; l++) {
                        for (int j = 0; j < H * D; j++) {
                            k[j] = (j % D == 3 ? 6.0f : 1.5f) * tu_normal(&r);
                            v[j] = tu_normal(&r);
                        }
                        kkv_append(c, seqs[i], l, k, v);
                        kkv_flush(c, seqs[i], l);
                    }
            }
            seqs[NS] = seqs[2]; /* a repeat: attention only reads */
            static float q[(NS + 1) * NQ * D], ob[(NS + 1) * NQ * D], o1[NQ * D];
            for (int i = 0; i < (NS + 1) * NQ * D; i++) q[i] = tu_normal(&r);
            for (int l = 0; l < L; l++) {
                CHECK(kkv_attend_batch(c, ob, seqs, NS + 1, l, q, NQ) == KKV_OK,
                      "%s batch: %s", specs[mi], kkv_last_error());
                int bad = 0;
                for (int i = 0; i <= NS; i++) {
                    CHECK(kkv_attend(c, o1, seqs[i], l, q + (size_t)i * NQ * D, NQ) == KKV_OK,
                          "%s attend: %s", specs[mi], kkv_last_error());
                    bad += memcmp(o1, ob + (size_t)i * NQ * D, sizeof o1) != 0;
                }
                CHECK(bad == 0, "%s, %d thread(s), layer %d: %d of %d batch blocks differ from "
                      "kkv_attend", specs[mi], th, l, bad, NS + 1);
            }
            if (mi == 0 && th == 1) { /* argument checks */
                int none = seqs[NS - 1] + 100, empty;
                kkv_seq_add(c, &empty);
                int with_bad[2] = {seqs[0], none}, with_empty[2] = {seqs[0], empty};
                CHECK(kkv_attend_batch(c, ob, with_bad, 2, 0, q, NQ) == KKV_ERR_NOT_FOUND,
                      "batch with an unknown sequence");
                CHECK(kkv_attend_batch(c, ob, with_empty, 2, 0, q, NQ) == KKV_ERR_INVALID_ARG,
                      "batch with an empty sequence");
                CHECK(kkv_attend_batch(c, ob, seqs, 0, 0, q, NQ) == KKV_ERR_INVALID_ARG, "n 0");
                CHECK(kkv_attend_batch(c, ob, NULL, 1, 0, q, NQ) == KKV_ERR_INVALID_ARG, "NULL seqs");
                CHECK(kkv_attend_batch(c, ob, seqs, 1, L, q, NQ) == KKV_ERR_INVALID_ARG, "layer L");
                CHECK(kkv_attend_batch(c, ob, seqs, 1, 0, q, 4) == KKV_ERR_INVALID_ARG, "n_q 4");
                CHECK(kkv_attend_batch(NULL, ob, seqs, 1, 0, q, NQ) == KKV_ERR_INVALID_ARG, "NULL cache");
                CHECK(kkv_attend_batch(c, ob, seqs, INT_MAX / 2, 0, q, NQ) == KKV_ERR_INVALID_ARG,
                      "a hostile sequence count");
                float qn[2 * NQ * D];
                memcpy(qn, q, sizeof qn);
                qn[NQ * D + 5] = NAN; /* in the second sequence's query */
                CHECK(kkv_attend_batch(c, ob, seqs, 2, 0, qn, NQ) == KKV_ERR_NONFINITE,
                      "a NaN in a later sequence's query");
            }
            kkv_cache_free(c);
        }
}

int main(void) {
    const char *const *names = kkv_method_names();
    const int combos[][2] = {{1, 1}, {2, 1}, {1, 3}, {2, 3}, {1, 4}, {2, 4}, {1, 8}, {4, 8}};
    stats st = {0, 0, 0, 0, 0, 0};
    for (int i = 0; names[i]; i++)
        for (int D = 64; D <= 128; D *= 2)
            for (size_t ci = 0; ci < sizeof combos / sizeof *combos; ci++) {
                if (D == 128 && ci % 2) continue; /* keep the run short */
                run_case(&st, names[i], combos[ci][0], combos[ci][1], D, 0);
            }
    run_case(&st, "kitty", 2, 4, 64, 1);
    run_case(&st, "fp16", 2, 4, 128, 1);
    run_case(&st, "kivi-k2v4s", 1, 3, 64, 1);
    printf("attention: %ld outputs, worst |err| %.3g, worst |err|/tol %.4f; wrong-head "
           "references rejected %d times; a dropped newest token caught %d of %d times\n",
           st.outputs, st.worst_abs, st.worst_ratio, st.teeth, st.drop_caught, st.drop_tried);
    CHECK(st.teeth > 100, "the tolerance did not reject wrong-head references (%d)", st.teeth);
    test_threads();
    test_args();
    test_batch();
    return tu_summary();
}
