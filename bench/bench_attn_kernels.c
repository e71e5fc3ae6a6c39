/* Decode-attention kernels on SmolLM2-135M shapes (30 layers, 3 KV heads,
 * 9 query heads, head_dim 64): per-token attention time over all layers for
 * fp16 / kivi-k2v2 / kitty / kitty-pro, scalar vs AVX2 kernels, 1 and 2
 * threads, at 1K..32K tokens of context; the bytes each method reads per token
 * (every stored byte of K and V, from kkv_seq_mem), a STREAM-like read
 * bandwidth measured in the same run, and the share of that roofline reached.
 * Also the page-flush cost per token relative to decode.
 *
 *     bench_attn_kernels [max_context [avx2]]   (default 32768; "avx2": skip scalar)
 *
 * Public API only: one filled cache serves both thread counts by borrowing a
 * shared thread pool (kkv_cache_set_threadpool). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kittykv.h"
#include "kittykv_cpu.h"

#define L_LAYERS 30
#define H_KV 3
#define N_Q 9
#define HEAD_D 64

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_state = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)(rng_state >> 40) / (float)(1 << 23) - 1.0f;
}

/* ---------------------------------------------------------------- bandwidth */

typedef struct stream_arg {
    const uint64_t *p; /* [n] */
    size_t          n;
    uint64_t        sum;
} stream_arg;

static void *stream_read(void *arg) {
    stream_arg *a = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= a->n; i += 4) {
        s0 += a->p[i];
        s1 += a->p[i + 1];
        s2 += a->p[i + 2];
        s3 += a->p[i + 3];
    }
    a->sum = s0 + s1 + s2 + s3;
    return NULL;
}

/* Read bandwidth, bytes/s, of n_threads threads reading disjoint halves of a
 * buffer much larger than the last-level cache (best of 5). */
static double read_bandwidth(int n_threads) {
    size_t bytes = (size_t)1 << 30, n = bytes / 8;
    uint64_t *buf = malloc(bytes); /* [n] */
    if (!buf) return 0;
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        stream_arg a[2];
        pthread_t th;
        size_t part = n / (size_t)n_threads;
        double t0 = now();
        for (int i = 0; i < n_threads; i++) a[i] = (stream_arg){buf + part * (size_t)i, part, 0};
        if (n_threads > 1) pthread_create(&th, NULL, stream_read, &a[1]);
        stream_read(&a[0]);
        if (n_threads > 1) pthread_join(th, NULL);
        double dt = now() - t0;
        if (a[0].sum == 42) puts(""); /* keep the reads */
        best = bytes / dt > best ? bytes / dt : best;
    }
    free(buf);
    return best;
}

/* ---------------------------------------------------------------- attention */

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per token for attention over all layers: best wall time of the
 * runs that fit in ~budget seconds (at least one), and the best CPU time of
 * all threads together (*cpu), which a loaded machine disturbs less. */
static double time_attend(kkv_cache *c, int seq, const float *q, float *out, double budget,
                          double *cpu) {
    double best = 1e30, spent = 0;
    int runs = 0;
    *cpu = 1e30;
    while (runs < 3 || (spent < budget && runs < 200)) {
        double t0 = now(), c0 = cpu_now();
        for (int l = 0; l < L_LAYERS; l++) kkv_attend(c, out, seq, l, q, N_Q);
        double dt = now() - t0, dc = cpu_now() - c0;
        best = dt < best ? dt : best;
        *cpu = dc < *cpu ? dc : *cpu;
        spent += dt;
        runs++;
        if (dt > budget) break;
    }
    return best;
}

/* Seconds to flush one key page and one value page of one head with kernel
 * k: the flush calls of a run of appends, over the pages they wrote. */
static double time_flush(kkv_kernel k, const kkv_method *m) {
    kkv_cache_config cfg = {.n_layers = 1, .n_kv_heads = 1, .head_dim = HEAD_D,
                            .pool_bytes = (size_t)64 << 20, .method = *m};
    kkv_cache *c;
    int seq;
    if (kkv_cache_create(&c, &cfg) != KKV_OK) return 0.0;
    if (kkv_cache_set_kernel(c, k) != KKV_OK || kkv_seq_add(c, &seq) != KKV_OK) {
        kkv_cache_free(c);
        return 0.0;
    }
    float kv[2][HEAD_D];
    int n = m->sink + m->window + 64 * m->group, pages = 64;
    double spent = 0.0;
    for (int t = 0; t < n; t++) {
        for (int j = 0; j < HEAD_D; j++) {
            kv[0][j] = frand() * (j % 17 == 3 ? 8.0f : 1.0f);
            kv[1][j] = frand();
        }
        if (kkv_append(c, seq, 0, kv[0], kv[1]) != KKV_OK) break;
        double t0 = now();
        kkv_flush(c, seq, 0);
        spent += now() - t0;
    }
    kkv_cache_free(c);
    return spent / pages;
}

int main(int argc, char **argv) {
    int max_ctx = argc > 1 ? atoi(argv[1]) : 32768;
    static const char *methods[] = {"fp16", "kivi-k2v2", "kitty", "kitty-pro"};
    static const int ctxs[] = {1024, 4096, 16384, 32768};
    enum { NM = 4, NC = 4 };
    int have_avx2 = kkv_kernel_best() >= KKV_KERNEL_AVX2;
    int only_avx2 = have_avx2 && argc > 2 && strcmp(argv[2], "avx2") == 0;
    double bw1 = read_bandwidth(1), bw2 = read_bandwidth(2);
    printf("# read bandwidth (STREAM-like sum over 1 GiB): 1 thread %.1f GB/s, 2 threads %.1f GB/s\n",
           bw1 / 1e9, bw2 / 1e9);
    printf("# shapes: %d layers, %d KV heads, %d query heads, head_dim %d; time = attention of one\n"
           "# decode token over all layers (best of repeated runs)\n",
           L_LAYERS, H_KV, N_Q, HEAD_D);
    /* [method][ctx][kernel][threads] seconds */
    double T[NM][NC][2][2];
    memset(T, 0, sizeof T);
    kkv_threadpool *tp2 = NULL;
    if (kkv_threadpool_create(&tp2, 2) != KKV_OK) return 1;
    float q[N_Q * HEAD_D], out[N_Q * HEAD_D], k[H_KV * HEAD_D], v[H_KV * HEAD_D];
    for (int i = 0; i < N_Q * HEAD_D; i++) q[i] = frand();

    printf("# ms/token: wall time; cpu ms: CPU time of all threads (best runs); GB/s and\n"
           "# %%roof: bytes read per token over wall time, against the read bandwidth above\n");
    printf("\n%-6s %-10s %-6s %3s %10s %10s %10s %8s %7s\n", "ctx", "method", "kernel", "thr",
           "ms/token", "cpu ms", "MB/token", "GB/s", "%roof");
    for (int mi = 0; mi < NM; mi++) {
        kkv_method m;
        kkv_method_from_name(&m, methods[mi]);
        kkv_cache_config cfg = {.n_layers = L_LAYERS, .n_kv_heads = H_KV, .head_dim = HEAD_D,
                                .pool_bytes = (size_t)3 << 30, .n_threads = 1, .method = m};
        kkv_cache *c;
        int seq;
        if (kkv_cache_create(&c, &cfg) != KKV_OK || kkv_seq_add(c, &seq) != KKV_OK) {
            fprintf(stderr, "cache: %s\n", kkv_last_error());
            return 1;
        }
        int len = 0;
        for (int ci = 0; ci < NC && ctxs[ci] <= max_ctx; ci++) {
            for (; len < ctxs[ci]; len++) {
                for (int i = 0; i < H_KV * HEAD_D; i++) {
                    k[i] = frand() * ((i % HEAD_D) % 17 == 3 ? 8.0f : 1.0f);
                    v[i] = frand();
                }
                for (int l = 0; l < L_LAYERS; l++) {
                    if (kkv_append(c, seq, l, k, v) != KKV_OK || kkv_flush(c, seq, l) != KKV_OK) {
                        fprintf(stderr, "fill: %s\n", kkv_last_error());
                        return 1;
                    }
                }
            }
            kkv_mem mem;
            kkv_seq_mem(c, &mem, seq);
            for (int ki = 0; ki < 2; ki++) {
                if ((ki == 1 && !have_avx2) || (ki == 0 && only_avx2)) continue;
                kkv_cache_set_kernel(c, ki ? KKV_KERNEL_AVX2 : KKV_KERNEL_SCALAR);
                for (int th = 0; th < 2; th++) {
                    kkv_cache_set_threadpool(c, th ? tp2 : NULL);
                    double cpu_t;
                    double t = time_attend(c, seq, q, out, ki ? 0.5 : 0.2, &cpu_t);
                    kkv_cache_set_threadpool(c, NULL);
                    T[mi][ci][ki][th] = t;
                    double gbs = mem.total / t / 1e9;
                    printf("%-6d %-10s %-6s %3d %10.3f %10.3f %10.2f %8.2f %6.1f%%\n", ctxs[ci],
                           methods[mi], ki ? "avx2" : "scalar", th + 1, t * 1e3, cpu_t * 1e3,
                           mem.total / 1e6, gbs, 100.0 * mem.total / t / (th ? bw2 : bw1));
                    fflush(stdout);
                }
            }
        }
        kkv_cache_free(c);
    }
    kkv_threadpool_free(tp2);

    printf("\n# speedup vs fp16 (same kernel, same threads; ratio of times in this run)\n");
    printf("%-6s %-10s %14s %14s %14s %14s\n", "ctx", "method", "scalar/1thr", "scalar/2thr",
           "avx2/1thr", "avx2/2thr");
    for (int ci = 0; ci < NC && ctxs[ci] <= max_ctx; ci++)
        for (int mi = 1; mi < NM; mi++) {
            printf("%-6d %-10s", ctxs[ci], methods[mi]);
            for (int ki = 0; ki < 2; ki++)
                for (int th = 0; th < 2; th++) {
                    double a = T[0][ci][ki][th], b = T[mi][ci][ki][th];
                    printf(" %14.2f", b > 0 ? a / b : 0.0);
                }
            printf("\n");
        }
    printf("\n# avx2 speedup over scalar (1 thread)\n");
    for (int ci = 0; ci < NC && ctxs[ci] <= max_ctx; ci++)
        for (int mi = 0; mi < NM; mi++)
            if (T[mi][ci][1][0] > 0)
                printf("%-6d %-10s %8.2fx\n", ctxs[ci], methods[mi], T[mi][ci][0][0] / T[mi][ci][1][0]);

    printf("\n# page flush (one key + one value page of one head, G=128) and its share of\n"
           "# decode: every G tokens each of the %d layer-heads flushes once\n", L_LAYERS * H_KV);
    for (int mi = 1; mi < NM; mi++) {
        kkv_method m;
        kkv_method_from_name(&m, methods[mi]);
        for (int ki = 0; ki < 2; ki++) {
            if (ki == 1 && !have_avx2) continue;
            double f = time_flush(ki ? KKV_KERNEL_AVX2 : KKV_KERNEL_SCALAR, &m);
            double per_tok = f * L_LAYERS * H_KV / m.group;
            printf("%-10s %-6s flush %7.2f us/page, %7.2f us/token amortised", methods[mi],
                   ki ? "avx2" : "scalar", f * 1e6, per_tok * 1e6);
            for (int ci = 0; ci < NC && ctxs[ci] <= max_ctx; ci++)
                printf("  %dK: %.3f%%", ctxs[ci] / 1024, 100.0 * per_tok / T[mi][ci][ki][0]);
            printf("\n");
        }
    }
    return 0;
}
