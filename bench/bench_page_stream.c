/* How this machine feeds a stream of page pairs to a slow consumer, measured
 * without the library: the memory side of decode attention on its own.
 *
 *     bench_page_stream [--mb N] [--work-ns X] [--rounds R] [--json]
 *
 * A consumer walks chunks of 5,184 bytes (one kitty page pair of SmolLM2: a
 * 2,624-byte key page and a 2,560-byte value page) in a --mb MiB buffer
 * (default 1024: beyond any last-level cache this project has met), doing a
 * fixed amount of scalar work per chunk, spread over its 81 lines and
 * calibrated so that a hot chunk takes --work-ns a line (default 7.5: the
 * AVX-512 page kernels on an Intel Xeon, ~620 ns a pair). Chunks are visited
 *   scattered:  in a hashed order (pages of many sequences, recycled slots);
 *   strided:    every 90th chunk (466 KB apart), as a head's pages lie in
 *               the page pool for one long sequence (a slot of each of the
 *               30 layers apart, each slot 3 heads' pairs);
 *   sequential: in address order, as pages laid out per (layer, head) would;
 * and the next chunk is fetched ahead of use
 *   none:   by the hardware prefetchers alone;
 *   bursts: in three software-prefetch bursts per chunk (cache/attend.c);
 *   spread: one line of the next chunk per line consumed.
 * Rows give ns per line and the excess over the hot chunk (the compute
 * floor). Medians of R interleaved rounds. Not a test: the machine is shared.
 *
 * Why. The page kernels cost ~620 ns a pair hot but ~900 in the engine on
 * the Xeon (docs/RESULTS.md, twenty-fifth session). This separates what the
 * memory system charges for each way of fetching from the kernels, and shows
 * whether a layout change would pay before anyone writes one. Public headers
 * only, like every benchmark. Its scalar consumer overstates how much the
 * order matters: the real kernels walking a pool of the engine's layout
 * (test_kernels --bench-pages) put the three orders within 2-4% of each other
 * with the burst prefetch (docs/RESULTS.md, twenty-sixth session). */
#define _DEFAULT_SOURCE /* madvise */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "kittykv_cpu.h"

#define CHUNK 5184 /* bytes of one page pair */
#define LINE  64
#define LINES ((CHUNK + LINE - 1) / LINE) /* 81 */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The consumer's work on one line: its eight words folded into s, then w
 * dependent multiply-adds (a few cycles each on every 64-bit CPU). */
static inline uint64_t consume(const uint8_t *line, uint64_t s, int w) {
    uint64_t x[8];
    memcpy(x, line, sizeof x);
    s += x[0] ^ x[1] ^ x[2] ^ x[3] ^ x[4] ^ x[5] ^ x[6] ^ x[7];
    for (int i = 0; i < w; i++) s = s * 6364136223846793005ull + 1442695040888963407ull;
    return s;
}

enum { PF_NONE, PF_BURSTS, PF_SPREAD };

typedef struct stream {
    const uint8_t *buf;
    size_t         n_chunks;
    int            work;  /* multiply-adds per chunk, spread over its lines */
} stream;

enum { ORDER_SCATTERED, ORDER_STRIDED, ORDER_SEQUENTIAL, N_ORDERS };
#define STRIDE 90 /* chunks: 466 KB, the page pool's distance between a head's pages */

/* Chunk i of a walk: i times a prime modulo n_chunks (a permutation, so no
 * chunk twice in one walk of at most n_chunks), every STRIDE-th chunk (then
 * the next residue), or address order. */
static size_t chunk_at(const stream *S, size_t i, int order) {
    size_t n = S->n_chunks, lanes = n / STRIDE;
    if (order == ORDER_SCATTERED) return (size_t)((i * 2654435761ull) % n);
    if (order == ORDER_STRIDED) return (i % lanes) * STRIDE + (i / lanes) % STRIDE;
    return i % n;
}

/* ns per line over n chunks; hot: the same chunk every time. */
static double walk(const stream *S, size_t n, int order, int pf, int hot, uint64_t *sink) {
    const size_t nl = LINES, per = (nl + 2) / 3;
    uint64_t s = *sink;
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        const uint8_t *c = S->buf + (hot ? 0 : chunk_at(S, i, order) * CHUNK);
        const uint8_t *nx = S->buf + (hot ? 0 : chunk_at(S, i + 1, order) * CHUNK);
        for (size_t l = 0; l < nl; l++) {
            if (pf == PF_BURSTS && l % per == 0)
                for (size_t k = l; k < l + per && k < nl; k++) __builtin_prefetch(nx + LINE * k, 0, 1);
            if (pf == PF_SPREAD) __builtin_prefetch(nx + LINE * l, 0, 1);
            int w = (int)((size_t)S->work * (l + 1) / nl - (size_t)S->work * l / nl);
            s = consume(c + LINE * l, s, w);
        }
    }
    double dt = now() - t0;
    *sink = s;
    return 1e9 * dt / (double)(n * nl);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(void) {
    fprintf(stderr, "usage: bench_page_stream [--mb N (64..65536)] [--work-ns X (0..100)] "
                    "[--rounds R (1..50)] [--json]\n");
}

int main(int argc, char **argv) {
    long mb = 1024, rounds = 5;
    double work_ns = 7.5;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        char *end = NULL;
        if (strcmp(argv[i], "--json") == 0) json = 1;
        else if (strcmp(argv[i], "--mb") == 0 && i + 1 < argc) mb = strtol(argv[++i], &end, 10);
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = strtol(argv[++i], &end, 10);
        else if (strcmp(argv[i], "--work-ns") == 0 && i + 1 < argc) work_ns = strtod(argv[++i], &end);
        else {
            usage();
            return 2;
        }
        if (end && *end) {
            fprintf(stderr, "bench_page_stream: '%s' is not a number\n", argv[i]);
            return 2;
        }
    }
    if (mb < 64 || mb > 65536 || rounds < 1 || rounds > 50 || !(work_ns >= 0.0 && work_ns <= 100.0)) {
        usage();
        return 2;
    }
    size_t align = (size_t)2 << 20, bytes = (((size_t)mb << 20) + align - 1) & ~(align - 1);
    uint8_t *buf = aligned_alloc(align, bytes); /* [n_chunks][CHUNK] bytes, then a tail */
    if (!buf) {
        fprintf(stderr, "bench_page_stream: cannot allocate %ld MiB\n", mb);
        return 1;
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(buf, bytes, MADV_HUGEPAGE); /* as the page pool's slabs (core/bigmem.c) */
#endif
    for (size_t i = 0; i < bytes; i += 8) { /* resident and not all zero */
        uint64_t v = i * 0x9E3779B97F4A7C15ull;
        memcpy(buf + i, &v, 8);
    }
    stream S = {buf, bytes / CHUNK - 1, 0};
    uint64_t sink = 0;
    /* calibrate the work per chunk on the hot chunk */
    size_t cal_n = 20000;
    walk(&S, cal_n, 0, PF_NONE, 1, &sink); /* warm-up */
    double w0 = walk(&S, cal_n, 0, PF_NONE, 1, &sink);
    const double nl = LINES;
    S.work = 64 * LINES;
    double w64 = walk(&S, cal_n, 0, PF_NONE, 1, &sink);
    double per_step = (w64 - w0) / 64.0; /* ns a line per step a line */
    S.work = per_step > 0 && work_ns > w0 ? (int)((work_ns - w0) / per_step * nl + 0.5) : 0;
    for (int it = 0; it < 3 && S.work > 0; it++) { /* a step's cost depends on how many overlap: refine */
        double hot = walk(&S, cal_n, 0, PF_NONE, 1, &sink);
        if (hot <= w0) break;
        S.work = (int)((double)S.work * (work_ns - w0) / (hot - w0) + 0.5);
    }

    static const char *lay[] = {"scattered", "strided", "sequential"}, *pfn[] = {"none", "bursts", "spread"};
    enum { N_ROWS = 1 + 3 * N_ORDERS };
    double t[N_ROWS][50];
    size_t n = S.n_chunks < 150000 ? S.n_chunks : 150000; /* each chunk once a round at most */
    for (long r = 0; r < rounds; r++) {
        if (!json) fprintf(stderr, "\rround %ld/%ld", r + 1, rounds);
        t[0][r] = walk(&S, n / 8, 0, PF_NONE, 1, &sink);
        for (int row = 1; row < N_ROWS; row++)
            t[row][r] = walk(&S, n, (row - 1) / 3, (row - 1) % 3, 0, &sink);
    }
    if (!json) fprintf(stderr, "\r                \r");
    volatile uint64_t keep = sink; /* the work has a use */
    (void)keep;
    double med[N_ROWS];
    for (int row = 0; row < N_ROWS; row++) {
        qsort(t[row], (size_t)rounds, sizeof t[row][0], cmp_d);
        med[row] = t[row][rounds / 2];
    }
    if (json) {
        printf("{\"cpu\": \"%s\", \"mb\": %ld, \"chunk_bytes\": %d, \"work_steps_chunk\": %d, \"hot_ns_line\": %.3f, "
               "\"rows\": [",
               kkv_cpu_name(), mb, CHUNK, S.work, med[0]);
        for (int row = 1; row < N_ROWS; row++)
            printf("%s{\"order\": \"%s\", \"prefetch\": \"%s\", \"ns_line\": %.3f, \"excess_ns_chunk\": %.1f}",
                   row > 1 ? ", " : "", lay[(row - 1) / 3], pfn[(row - 1) % 3], med[row],
                   (med[row] - med[0]) * nl);
        printf("]}\n");
        free(buf);
        return 0;
    }
    printf("cpu: %s\n", kkv_cpu_name());
    printf("chunks of %d B (a kitty page pair, %.0f lines) in %ld MiB, %d work steps a chunk; medians of %ld rounds\n\n",
           CHUNK, nl, mb, S.work, rounds);
    printf("%-11s %-8s %9s %12s %12s %10s\n", "order", "prefetch", "ns/line", "ns/chunk", "excess ns", "GB/s");
    printf("%-11s %-8s %9.2f %12.0f %12s %10.2f\n", "hot", "-", med[0], med[0] * nl, "-", LINE / med[0]);
    for (int row = 1; row < N_ROWS; row++)
        printf("%-11s %-8s %9.2f %12.0f %12.0f %10.2f\n", lay[(row - 1) / 3], pfn[(row - 1) % 3],
               med[row], med[row] * nl, (med[row] - med[0]) * nl, LINE / med[row]);
    printf("\n(excess: ns a chunk over the hot chunk, what fetching it cost beyond the work; "
           "GB/s: one thread's rate of chunk bytes)\n");
    free(buf);
    return 0;
}
