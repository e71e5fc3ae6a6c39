/* Shared pieces of `kittykv bench` (see bench.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "bench.h"
#include "kittykv_cpu.h"
#include "opts.h"
#include "util.h"

/* ------------------------------------------------------------ options */

int bench_set_methods(bench_opts *o, const char *list) {
    char err[512];
    size_t len = strlen(list);
    if (len >= sizeof o->names_buf) {
        fprintf(stderr, "kittykv %s: method list too long\n", o->cmd);
        return 2;
    }
    cli_spec *specs = malloc(BENCH_MAX_METHODS * sizeof *specs); /* [BENCH_MAX_METHODS] */
    if (!specs) {
        fprintf(stderr, "kittykv %s: out of memory\n", o->cmd);
        return 2;
    }
    int n = cli_spec_list(specs, BENCH_MAX_METHODS, list, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "kittykv %s: %s\n", o->cmd, err);
        free(specs);
        return 2;
    }
    /* the spec texts, kept in o: names_buf holds them NUL-separated */
    memcpy(o->names_buf, list, len + 1);
    char *p = o->names_buf;
    for (int i = 0; i < n; i++) {
        if (specs[i].method.select == KKV_SELECT_EXPLICIT) {
            fprintf(stderr, "kittykv %s: select=oracle needs channel rankings; only "
                    "`kittykv analyze ablation` computes them\n", o->cmd);
            free(specs);
            return 2;
        }
        o->methods[i] = specs[i].method;
        o->method_names[i] = p;
        p += strcspn(p, ",");
        if (*p) *p++ = 0;
    }
    o->n_methods = n;
    free(specs);
    return 0;
}

static int parse_kernel(kkv_kernel *k, const char *s, const char *cmd) {
    static const kkv_kernel all[] = {KKV_KERNEL_AUTO, KKV_KERNEL_SCALAR, KKV_KERNEL_AVX2,
                                     KKV_KERNEL_AVX512, KKV_KERNEL_NEON};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(s, kkv_kernel_name(all[i]))) {
            *k = all[i];
            return 0;
        }
    fprintf(stderr, "kittykv %s: unknown --kernel '%s' (auto, scalar, avx2, avx512, neon)\n", cmd, s);
    return 2;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* A sorted list of token counts for --ctx / --depth: 0 or 2. */
static int parse_counts(bench_opts *o, const char *v, const char *opt) {
    o->n_list = cli_int_list(o->list, BENCH_MAX_LIST, v, o->cmd, opt);
    if (o->n_list < 0) return 2;
    for (int j = 0; j < o->n_list; j++)
        if (o->list[j] > (1 << 22)) {
            fprintf(stderr, "kittykv %s: %s value %d is over 4194304\n", o->cmd, opt, o->list[j]);
            return 2;
        }
    qsort(o->list, (size_t)o->n_list, sizeof o->list[0], cmp_int);
    return 0;
}

int bench_parse(bench_opts *o, int argc, char **argv, unsigned allowed,
                void (*usage)(FILE *f)) {
    const char *cmd = o->cmd;
    const char *ctx_list = NULL, *depth_list = NULL, *methods = NULL, *method = NULL;
    const char *kernel = NULL, *batch_list = NULL;
    int threads_given = 0, no_baseline = 0;
    float budget = (float)o->budget_mb;
    /* Every bench option, each with the mask bit that admits it. */
    const struct { unsigned bit; opt_def d; } all[] = {
        {BO_MODEL, {'m', "model", OPT_STRING, 0, 0, &o->model, &o->model_given, "MODEL",
                    "GGUF file to take the shapes (and weights) from"}},
        {BO_CTX, {'c', "ctx-size|ctx", OPT_LIST, 0, 0, &ctx_list, NULL, "LIST",
                  "contexts in tokens, comma-separated"}},
        {BO_CTX1, {'c', "ctx-size|ctx", OPT_INT, 1, 1 << 22, &o->ctx, NULL, "N",
                   "tokens per sequence"}},
        {BO_DEPTH, {0, "depth", OPT_LIST, 0, 0, &depth_list, NULL, "LIST",
                    "context depths in tokens, comma-separated"}},
        {BO_METHODS, {0, "kv|methods", OPT_LIST, 0, 0, &methods, NULL, "LIST",
                      "comma-separated method specs (kittykv eval --help)"}},
        {BO_METHOD, {0, "kv|method", OPT_SPEC, 0, 0, &method, NULL, "SPEC",
                     "one method spec (kittykv eval --help)"}},
        {BO_THREADS, {'t', "threads", OPT_INT, 1, CLI_MAX_THREADS, &o->threads, &threads_given,
                      "N", "threads, 1..256"}},
        {BO_KERNEL, {0, "kernel", OPT_STRING, 0, 0, &kernel, NULL, "K",
                     "attention kernel: auto|scalar|avx2|avx512"}},
        {BO_N, {'n', "n-predict", OPT_INT, 1, 1 << 22, &o->n, NULL, "N",
                "tokens / timed decode steps"}},
        {BO_BUDGET, {0, "kv-budget", OPT_FLOAT, 1, 1 << 20, &budget, NULL, "MB",
                     "KV pool budget in MiB"}},
        {BO_REPS, {0, "reps", OPT_INT, 1, 100000, &o->reps, NULL, "N",
                   "minimum timed repetitions per point"}},
        {BO_BW, {0, "bw-mb", OPT_INT, 1, 1 << 16, &o->bw_mb, NULL, "MB",
                 "read-test array size"}},
        {BO_MAXBATCH, {0, "max-batch", OPT_INT, 1, 1 << 16, &o->max_batch, NULL, "N",
                       "cap on the measured batch"}},
        {BO_BASELINE, {0, "no-baseline", OPT_FLAG, 0, 0, &no_baseline, NULL, NULL,
                       "skip the interleaved fp16 noise-floor run"}},
        {BO_PREFIX, {0, "shared-prefix", OPT_INT, 0, 1 << 22, &o->shared_prefix, NULL, "P",
                     "sequences fork one P-token prefix (kkv_seq_fork) and reserve\n"
                     "ctx - P tokens of their own; seqs/fp16 compares with fp16\n"
                     "without sharing (default 0: no sharing)"}},
        {BO_BATCH, {0, "batch", OPT_LIST, 0, 0, &batch_list, NULL, "LIST",
                    "sequences decoded together per step (kkv_model_decode_batch),\n"
                    "comma-separated, 1..256 (default 1: kkv_model_forward)"}},
        {BO_SCALING, {0, "scaling", OPT_FLAG, 0, 0, &o->scaling, NULL, NULL,
                       "also time every method on one thread, interleaved with the\n"
                       "-t runs, and print the speed-up of -t threads over one"}},
        {BO_PARTS, {0, "parts", OPT_FLAG, 0, 0, &o->parts, NULL, NULL,
                    "also print where the -t steps' time goes: Q/K/V, attention,\n"
                    "output projection, FFN, head, other (kkv_model_profile)"}},
        {~0u, {0, "json", OPT_FLAG, 0, 0, &o->json, NULL, NULL,
               "also print one JSON object on the last line"}},
    };
    opt_def defs[sizeof all / sizeof all[0]];
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].bit & allowed) defs[n++] = all[i].d;
    char err[512];
    int rc = opts_parse(cmd, defs, n, argc, argv, err, sizeof err);
    if (rc == OPTS_HELP) {
        printf("usage: kittykv %s [options]\n\n", cmd);
        usage(stdout);
        printf("\noptions:\n");
        opts_help_options(stdout, defs, n);
        return -1;
    }
    if (rc) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (ctx_list && parse_counts(o, ctx_list, "--ctx-size")) return 2;
    if (depth_list && parse_counts(o, depth_list, "--depth")) return 2;
    if (methods && bench_set_methods(o, methods)) return 2;
    if (method) {
        if (strchr(method, ',')) {
            fprintf(stderr, "kittykv %s: --method takes one spec\n", cmd);
            return 2;
        }
        if (bench_set_methods(o, method)) return 2;
    }
    if (kernel && parse_kernel(&o->kernel, kernel, cmd)) return 2;
    if (batch_list) {
        o->n_batch = cli_int_list(o->batch, BENCH_MAX_LIST, batch_list, cmd, "--batch");
        if (o->n_batch < 0) return 2;
        for (int j = 0; j < o->n_batch; j++)
            if (o->batch[j] < 1 || o->batch[j] > BENCH_MAX_BATCH) {
                fprintf(stderr, "kittykv %s: --batch value %d is outside 1..%d\n", cmd,
                        o->batch[j], BENCH_MAX_BATCH);
                return 2;
            }
        qsort(o->batch, (size_t)o->n_batch, sizeof o->batch[0], cmp_int);
    }
    if (no_baseline) o->baseline = 0;
    o->budget_mb = budget;
    o->threads = cli_threads(threads_given ? o->threads : 0, cmd);
    return 0;
}

/* ------------------------------------------------------------ statistics */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double bench_quantile(const double *x, int n, double q) {
    if (n <= 0) return NAN;
    double *s = malloc((size_t)n * sizeof *s); /* [n] sorted copy */
    if (!s) return NAN;
    memcpy(s, x, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_double);
    double pos = q * (double)(n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) i = n - 1;
    double f = pos - (double)i;
    double r = i + 1 < n ? s[i] + f * (s[i + 1] - s[i]) : s[i];
    free(s);
    return r;
}

double bench_median(const double *x, int n) { return bench_quantile(x, n, 0.5); }

double bench_max(const double *x, int n) {
    double m = n > 0 ? x[0] : NAN;
    for (int i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

double bench_sum(const double *x, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

/* ------------------------------------------------------------ model shape */

bench_shape bench_default_shape(void) {
    return (bench_shape){.n_layers = 30, .n_kv_heads = 3, .n_heads = 9, .head_dim = 64,
                         .from_model = 0};
}

bench_shape bench_shape_of(const kkv_model *m) {
    kkv_model_info in;
    kkv_model_get_info(m, &in);
    return (bench_shape){.n_layers = in.n_layers, .n_kv_heads = in.n_kv_heads,
                         .n_heads = in.n_heads, .head_dim = in.head_dim, .from_model = 1};
}

int bench_load_model(kkv_model **m, const bench_opts *o, int optional) {
    *m = NULL;
    const char *path = o->model ? o->model : cli_default_model();
    FILE *f = fopen(path, "rb");
    if (!f && optional && !o->model_given) {
        fprintf(stderr, "kittykv %s: model '%s' not found: using the default model's shapes "
                "(30 layers, 9 query / 3 KV heads, head_dim 64)\n", o->cmd, path);
        return 0;
    }
    if (f) fclose(f);
    if (kkv_model_load(m, path, o->threads) != KKV_OK) {
        fprintf(stderr, "kittykv %s: %s\n", o->cmd, kkv_last_error());
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------ synthetic K/V */

/* Roughly normal: the sum of two uniforms on [-1, 1) (triangular), from one
 * 64-bit draw. */
static float rng_tri(uint64_t *s) {
    uint64_t r = kkv_rng_next(s);
    float a = (float)(r >> 40) * (1.0f / 16777216.0f);
    float b = (float)((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
    return (a + b - 1.0f) * 1.2f;
}

float bench_rand(uint64_t *s) { return rng_tri(s); }

int bench_synth_init(bench_synth *g, int L, int H, int D, uint64_t seed) {
    memset(g, 0, sizeof *g);
    g->L = L;
    g->H = H;
    g->D = D;
    g->rng = seed;
    size_t hd = (size_t)H * D, lhd = (size_t)L * hd;
    g->bias = malloc(hd * sizeof *g->bias);
    g->sigma = malloc(hd * sizeof *g->sigma);
    g->freq = malloc((size_t)(D / 2) * sizeof *g->freq);
    g->k = malloc(lhd * sizeof *g->k);
    g->v = malloc(lhd * sizeof *g->v);
    if (!g->bias || !g->sigma || !g->freq || !g->k || !g->v) {
        bench_synth_free(g);
        return 1;
    }
    for (int h = 0; h < H; h++)
        for (int j = 0; j < D; j++) {
            size_t i = (size_t)h * D + j;
            g->bias[i] = 0.3f * rng_tri(&g->rng);
            g->sigma[i] = 0.5f + 0.5f * fabsf(rng_tri(&g->rng));
        }
    /* three outlier channels per head, at head-dependent places */
    for (int h = 0; h < H; h++)
        for (int o = 0; o < 3; o++) {
            int j = (int)((7u * (unsigned)h + 23u * (unsigned)o + 5u) % (unsigned)D);
            g->bias[(size_t)h * D + j] = 6.0f + 2.0f * (float)o;
            g->sigma[(size_t)h * D + j] = 3.0f;
        }
    for (int i = 0; i < D / 2; i++) g->freq[i] = powf(10000.0f, -2.0f * (float)i / (float)D);
    return 0;
}

void bench_synth_free(bench_synth *g) {
    free(g->bias);
    free(g->sigma);
    free(g->freq);
    free(g->k);
    free(g->v);
    memset(g, 0, sizeof *g);
}

void bench_synth_token(bench_synth *g, int64_t pos) {
    int D = g->D, half = D / 2;
    float cs[KKV_MAX_HEAD_DIM / 2], sn[KKV_MAX_HEAD_DIM / 2]; /* [D/2] */
    for (int i = 0; i < half; i++) {
        double a = (double)pos * (double)g->freq[i];
        cs[i] = (float)cos(a);
        sn[i] = (float)sin(a);
    }
    for (int l = 0; l < g->L; l++)
        for (int h = 0; h < g->H; h++) {
            size_t o = ((size_t)l * g->H + h) * D;
            const float *b = g->bias + (size_t)h * D, *s = g->sigma + (size_t)h * D;
            float *k = g->k + o, *v = g->v + o;
            for (int j = 0; j < D; j++) {
                k[j] = b[j] + s[j] * rng_tri(&g->rng);
                v[j] = 0.5f * rng_tri(&g->rng);
            }
            /* rotate pairs (2i, 2i+1) as Llama's rotary embedding does */
            for (int i = 0; i < half; i++) {
                float x = k[2 * i], y = k[2 * i + 1];
                k[2 * i] = x * cs[i] - y * sn[i];
                k[2 * i + 1] = x * sn[i] + y * cs[i];
            }
        }
}

kkv_status bench_fill(kkv_cache *const *caches, const int *seqs, int n, int target,
                      bench_synth *g, const char *label) {
    if (n <= 0) return KKV_OK;
    int start = kkv_seq_len(caches[0], seqs[0], 0);
    if (start >= target) return KKV_OK;
    size_t hd = (size_t)g->H * g->D;
    double t0 = cli_now(), last = t0;
    long total = target - start;
    for (int pos = start; pos < target; pos++) {
        bench_synth_token(g, pos);
        for (int i = 0; i < n; i++)
            for (int l = 0; l < g->L; l++) {
                kkv_status s = kkv_append(caches[i], seqs[i], l, g->k + l * hd, g->v + l * hd);
                if (s == KKV_OK) s = kkv_flush(caches[i], seqs[i], l);
                if (s != KKV_OK) return s;
            }
        double now = cli_now();
        if (now - last > 0.25 || pos + 1 == target) {
            cli_progress(label, pos + 1 - start, total, now - t0);
            last = now;
        }
    }
    return KKV_OK;
}

size_t bench_pool_for(const bench_shape *sh, int ctx, int n_seqs) {
    /* fp16 for every token, plus staging (sink, Q-buffers, window) of at most
     * 2*128 + 4*128 tokens per sequence for the named methods, times 2 */
    double per_tok = 2.0 * 2.0 * sh->n_layers * sh->n_kv_heads * sh->head_dim;
    double b = 2.0 * per_tok * ((double)ctx + 1024.0) * (double)n_seqs + (64 << 20);
    return (size_t)b;
}

/* ------------------------------------------------------------ bandwidth */

typedef struct bw_job {
    uint64_t *a;      /* [n] */
    size_t    n;
    int       parts;
    int       init;   /* 1: write the pattern (first touch) instead of reading */
    uint64_t *sums;   /* [parts] */
} bw_job;

static void bw_task(void *ctx, int t) {
    bw_job *J = ctx;
    size_t per = (J->n / (size_t)J->parts) & ~(size_t)7;
    size_t lo = (size_t)t * per, hi = t == J->parts - 1 ? J->n : lo + per;
    if (J->init) {
        for (size_t i = lo; i < hi; i++) J->a[i] = i * 0x9E3779B97F4A7C15ULL;
        return;
    }
    uint64_t s = 0;
    size_t i = lo;
#if defined(__SSE2__)
    /* four independent 128-bit accumulators: the loop is load-bound */
    __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
    for (; i + 8 <= hi; i += 8) {
        const __m128i *p = (const __m128i *)(const void *)(J->a + i);
        a0 = _mm_add_epi64(a0, _mm_load_si128(p));
        a1 = _mm_add_epi64(a1, _mm_load_si128(p + 1));
        a2 = _mm_add_epi64(a2, _mm_load_si128(p + 2));
        a3 = _mm_add_epi64(a3, _mm_load_si128(p + 3));
    }
    uint64_t lanes[2]; /* [2] */
    _mm_storeu_si128((__m128i *)(void *)lanes,
                     _mm_add_epi64(_mm_add_epi64(a0, a1), _mm_add_epi64(a2, a3)));
    s = lanes[0] + lanes[1];
#else
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (; i + 4 <= hi; i += 4) {
        s0 += J->a[i];
        s1 += J->a[i + 1];
        s2 += J->a[i + 2];
        s3 += J->a[i + 3];
    }
    s = s0 + s1 + s2 + s3;
#endif
    for (; i < hi; i++) s += J->a[i];
    J->sums[t] = s;
}

/* The read test's array: 2 MiB-aligned and, for `huge`, advised as huge
 * pages (as the library's pool and weights are, core/bigmem.h), else advised
 * against them. len: a multiple of 2 MiB. */
static uint64_t *bw_array(size_t len, int huge) {
    uint64_t *a = aligned_alloc((size_t)2 << 20, len);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (a) (void)madvise(a, len, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
    (void)huge;
#endif
    return a;
}

double bench_read_bandwidth_pages(size_t bytes, int threads, int reps, double *small_pages) {
    size_t n = bytes / sizeof(uint64_t);
    n &= ~(size_t)63;
    if (n == 0) return -1.0;
    kkv_threadpool *tp = NULL;
    if (kkv_threadpool_create(&tp, threads) != KKV_OK) return -1.0;
    size_t huge = (size_t)2 << 20, len = (n * sizeof(uint64_t) + huge - 1) & ~(huge - 1);
    int parts = 8 * (threads > 0 ? threads : 1);
    bw_job J[2] = {{bw_array(len, 1), n, parts, 1, NULL}, {bw_array(len, 0), n, parts, 1, NULL}};
    uint64_t *sums = calloc((size_t)parts, sizeof *sums);
    double best[2] = {-1.0, -1.0};
    if (J[0].a && J[1].a && sums) {
        volatile uint64_t sink = 0;
        for (int i = 0; i < 2; i++) {
            J[i].sums = sums;
            kkv_threadpool_run(tp, parts, bw_task, &J[i]); /* first touch, by the readers */
            J[i].init = 0;
        }
        for (int r = 0; r < reps; r++)
            for (int k = 0; k < 2; k++) { /* interleaved, the order alternating */
                int i = (r + k) % 2;
                double t0 = cli_now();
                kkv_threadpool_run(tp, parts, bw_task, &J[i]);
                double dt = cli_now() - t0;
                for (int p = 0; p < parts; p++) sink += sums[p];
                double gbs = (double)(n * sizeof(uint64_t)) / dt * 1e-9;
                if (gbs > best[i]) best[i] = gbs;
            }
        (void)sink;
    }
    free(J[0].a);
    free(J[1].a);
    free(sums);
    kkv_threadpool_free(tp);
    *small_pages = best[1];
    return best[0];
}

double bench_read_bandwidth(size_t bytes, int threads, int reps) {
    double small = -1.0, huge = bench_read_bandwidth_pages(bytes, threads, reps, &small);
    return huge < 0 || small < 0 ? -1.0 : huge > small ? huge : small;
}

double bench_cpu_now(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts)) return 0.0;
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ output */

void bench_json_num(FILE *f, double x) {
    if (isfinite(x)) fprintf(f, "%.6g", x);
    else fputs("null", f);
}

int bench_fail(const bench_opts *o, const char *what) {
    fprintf(stderr, "kittykv %s: %s: %s\n", o->cmd, what, kkv_last_error());
    return 1;
}
