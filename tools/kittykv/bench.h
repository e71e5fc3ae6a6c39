/* Shared pieces of `kittykv bench`: option parsing, robust statistics,
 * synthetic post-RoPE-like K/V, cache filling and a STREAM-like read test.
 *
 * Every figure a benchmark prints is measured in the same run: timings are
 * repeated, interleaved across methods (round-robin, rotating the order) and
 * summarised by medians, because the machine is shared and noisy. */
#ifndef KKV_CLI_BENCH_H
#define KKV_CLI_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kittykv.h"
#include "kittykv_cpu.h"
#include "kittykv_eval.h"

#define BENCH_MAX_METHODS 16
#define BENCH_MAX_LIST    32

/* Options of every bench subcommand; each subcommand accepts a subset
 * (bench_parse's `allowed` mask) and fills its own defaults first. */
enum {
    BO_MODEL    = 1 << 0,  /* -m MODEL                          */
    BO_CTX      = 1 << 1,  /* --ctx LIST                        */
    BO_DEPTH    = 1 << 2,  /* --depth LIST                      */
    BO_METHODS  = 1 << 3,  /* --methods LIST                    */
    BO_METHOD   = 1 << 4,  /* --method NAME                     */
    BO_THREADS  = 1 << 5,  /* -t THREADS                        */
    BO_KERNEL   = 1 << 6,  /* --kernel auto|scalar|avx2|avx512  */
    BO_N        = 1 << 7,  /* -n N                              */
    BO_BUDGET   = 1 << 8,  /* --kv-budget MB                    */
    BO_REPS     = 1 << 9,  /* --reps N                          */
    BO_BW       = 1 << 10, /* --bw-mb MB                        */
    BO_MAXBATCH = 1 << 11, /* --max-batch N                     */
    BO_BASELINE = 1 << 12, /* --no-baseline                     */
    BO_CTX1     = 1 << 13, /* --ctx N (one value)               */
    BO_PREFIX   = 1 << 14, /* --shared-prefix N                 */
    BO_BATCH    = 1 << 15, /* --batch LIST                      */
    BO_SCALING  = 1 << 16, /* --scaling                         */
    BO_PARTS    = 1 << 17, /* --parts                           */
};

/* Largest --batch value (sequences decoded together in one step). */
#define BENCH_MAX_BATCH 256

typedef struct bench_opts {
    const char *cmd;        /* "bench attention", for messages         */
    const char *model;      /* NULL: the default model                 */
    int         model_given;
    int         list[BENCH_MAX_LIST]; /* --ctx / --depth values, ascending */
    int         n_list;
    int         ctx;        /* serve: one context                      */
    kkv_method  methods[BENCH_MAX_METHODS];
    const char *method_names[BENCH_MAX_METHODS]; /* specs, pointing into names_buf */
    char        names_buf[512];
    int         n_methods;
    int         threads;    /* >= 1                                    */
    kkv_kernel  kernel;
    int         json;
    int         n;          /* decode steps / tokens                   */
    double      budget_mb;
    int         reps;       /* minimum timed repetitions               */
    int         bw_mb;      /* read-test array size                    */
    int         max_batch;
    int         baseline;   /* flush: also run fp16 as a noise floor   */
    int         shared_prefix; /* serve: tokens every sequence shares (0: none) */
    int         batch[BENCH_MAX_LIST]; /* decode: batch sizes, ascending (default {1}) */
    int         n_batch;
    int         scaling;    /* attention: also time one thread, interleaved */
    int         parts;      /* decode: time the parts of each step (kkv_model_profile) */
} bench_opts;

/* Parses argv[1..] into o (defaults already set by the caller; o->cmd set).
 * On --help: the usage line, usage(stdout) (the description and defaults),
 * then the options table generated from the admitted options. Returns 0 to run, -1 after --help, 2 on a usage
 * error (message printed). Methods are validated against head_dim 64 later
 * by kkv_method_check when the shape is known. */
int bench_parse(bench_opts *o, int argc, char **argv, unsigned allowed,
                void (*usage)(FILE *f));
/* Sets o->methods from a comma-separated list of method specs; 2 on error. */
int bench_set_methods(bench_opts *o, const char *list);

/* The subcommands (cli/bench_*.c). Exit status as in cmd.h. */
int bench_attention(int argc, char **argv);
int bench_decode(int argc, char **argv);
int bench_flush(int argc, char **argv);
int bench_serve(int argc, char **argv);

/* ---- statistics (x is not modified) */
double bench_median(const double *x, int n);
/* Linear-interpolated quantile, q in [0, 1]. */
double bench_quantile(const double *x, int n, double q);
double bench_max(const double *x, int n);
double bench_sum(const double *x, int n);

/* ---- model shape */
typedef struct bench_shape {
    int n_layers, n_kv_heads, n_heads, head_dim;
    int from_model; /* 1: read from a GGUF file, 0: SmolLM2-135M constants */
} bench_shape;

/* The default model's constants (30 layers, 3 KV heads, 9 query heads, 64). */
bench_shape bench_default_shape(void);
bench_shape bench_shape_of(const kkv_model *m);

/* Loads the model of o (or the default one). *m = NULL and 0 returned when
 * the default model is missing and `optional` is set; an explicit -m that
 * fails, or a missing model when not optional, prints and returns 1. */
int bench_load_model(kkv_model **m, const bench_opts *o, int optional);

/* ---- synthetic keys and values */
/* Deterministic post-RoPE-like K/V: per channel a bias and a spread, a few
 * outlier channels per head (large bias and spread, as real keys have), then
 * a rotary rotation of channel pairs by the token position. Values are plain
 * small noise. The content does not change the kernels' work, only the
 * quantizer's choices, but it keeps those choices realistic. */
typedef struct bench_synth {
    int       L, H, D;
    uint64_t  rng;
    float    *bias;  /* [H][D] */
    float    *sigma; /* [H][D] */
    float    *freq;  /* [D/2] rotary frequencies */
    float    *k, *v; /* [L][H][D] one token of every layer */
} bench_synth;

/* A roughly normal pseudo-random number (spread ~0.7) from state *s. */
float bench_rand(uint64_t *s);

int  bench_synth_init(bench_synth *g, int L, int H, int D, uint64_t seed);
void bench_synth_free(bench_synth *g);
/* Fills g->k and g->v with the token at position pos for every layer. */
void bench_synth_token(bench_synth *g, int64_t pos);

/* Appends synthetic tokens to every (caches[i], seqs[i]) until each holds
 * `target` tokens per layer (all must start at the same length), in decode
 * order: append, then flush, per layer. Progress on stderr under `label`.
 * Returns KKV_OK or the first failing status (message in kkv_last_error). */
kkv_status bench_fill(kkv_cache *const *caches, const int *seqs, int n, int target,
                      bench_synth *g, const char *label);

/* A pool budget that surely holds n_seqs sequences of ctx tokens (address
 * space is reserved lazily, so generous is free). */
size_t bench_pool_for(const bench_shape *sh, int ctx, int n_seqs);

/* ---- memory bandwidth */
/* Best-of-`reps` read bandwidth in GB/s (1e9 bytes/s) of summing a
 * `bytes`-byte array with `threads` threads: the faster of an array on
 * transparent huge pages (as the library's pool and weights are, where the OS
 * has them) and one on 4 KiB pages, read interleaved; < 0 if out of memory. */
double bench_read_bandwidth(size_t bytes, int threads, int reps);
/* The same two reads, the huge-page array's best returned and the 4 KiB
 * one's in *small_pages. */
double bench_read_bandwidth_pages(size_t bytes, int threads, int reps, double *small_pages);

/* CPU seconds this process has used, all threads. On a shared machine the
 * wall time of a step includes time the scheduler gave to other jobs; with
 * one thread the CPU time does not, so it is the steadier figure. */
double bench_cpu_now(void);

/* ---- output */
/* Prints a double as a JSON number (null when not finite). */
void bench_json_num(FILE *f, double x);
/* Prints "fail: <what>: <kkv_last_error>" on stderr; returns 1. */
int bench_fail(const bench_opts *o, const char *what);
/* Rotation of a round-robin: the i-th method timed in round r. */
static inline int bench_order(int r, int i, int n) { return (r + i) % n; }

#endif
