/*
 * kittykv_cpu.h -- kernel choice and thread pools, kept out of the core header
 * (as ggml keeps CPU features out of ggml.h). Part of the core library.
 *
 * Tutorial (a complete program; tests/install/ builds and runs it)
 * --------
 *     #include <stdio.h>
 *     #include <kittykv.h>
 *     #include <kittykv_cpu.h>
 *
 *     int main(void) {
 *         printf("best kernel: %s, %d cores, %s\n", kkv_kernel_name(kkv_kernel_best()),
 *                kkv_cpu_count(), kkv_cpu_name());
 *         kkv_threadpool *tp;                   // one pool shared by every cache
 *         if (kkv_threadpool_create(&tp, 2) != KKV_OK) return 1;
 *         kkv_method m;
 *         kkv_method_parse(&m, "kivi-k2v2");
 *         kkv_cache_config cfg = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 32,
 *                                 .pool_bytes = 4u << 20, .method = m};
 *         kkv_cache *c;
 *         if (kkv_cache_create(&c, &cfg) != KKV_OK) return 1;
 *         kkv_cache_set_threadpool(c, tp);      // borrowed: free the cache first
 *         kkv_cache_set_kernel(c, KKV_KERNEL_SCALAR);
 *         printf("cache kernel: %s\n", kkv_kernel_name(kkv_cache_get_kernel(c)));
 *         kkv_cache_free(c);
 *         kkv_threadpool_free(tp);
 *         return 0;
 *     }
 */
#ifndef KITTYKV_CPU_H
#define KITTYKV_CPU_H

#include "kittykv.h"

KKV_BEGIN_DECLS

/* ---------------------------------------------------------------- kernels */

typedef enum kkv_kernel {
    KKV_KERNEL_AUTO   = 0, /* best the CPU supports                 */
    KKV_KERNEL_SCALAR = 1, /* the reference                         */
    KKV_KERNEL_AVX2   = 2, /* AVX2 + FMA + F16C                     */
    KKV_KERNEL_AVX512 = 3, /* AVX-512 F/BW/VL (+VNNI where present) */
    KKV_KERNEL_NEON   = 4, /* aarch64 Advanced SIMD (q.k, p.v: the reference's bits) */
} kkv_kernel;

/* Selects the attention/flush kernels of a cache; KKV_ERR_UNSUPPORTED if this
 * CPU or build lacks them (the environment variable
 * KKV_CPU=scalar|avx2|avxvnni|avx512|avx512vnni caps what AUTO and this call may pick
 * (scalar also caps neon; neon keeps the weight matmuls off the dot-product
 * extension);
 * VNNI page kernels, where present, give bit-identical results). */
kkv_status  kkv_cache_set_kernel(kkv_cache *c, kkv_kernel k);
/* The kernel a cache uses now (never AUTO; KKV_KERNEL_AUTO for a NULL cache). */
kkv_kernel  kkv_cache_get_kernel(const kkv_cache *c);
/* A constant name ("scalar", "avx2", ...); "unknown" for other values. */
const char *kkv_kernel_name(kkv_kernel k);
/* Best kernel this CPU and build support, after the KKV_CPU cap. */
kkv_kernel  kkv_kernel_best(void);

/* ---------------------------------------------------------------- threads */

/* Online cores, at least 1. */
int kkv_cpu_count(void);
/* One line naming this CPU for benchmark reports, so a figure says which
 * machine gave it: the cpuid brand string, family and model (a hypervisor
 * may shorten the brand string; family and model still tell generations
 * apart), and the instruction sets the kernels may use after the KKV_CPU cap,
 * e.g. "AMD EPYC (family 23, model 1; kernels: avx2)". A constant string that
 * lives as long as the process; never NULL. */
const char *kkv_cpu_name(void);

/* A fixed pool of worker threads. Caches and models own one each by default
 * (kkv_cache_config.n_threads, kkv_model_load's n_threads); one pool can be
 * shared instead, so that a process runs one set of workers. A pool runs one
 * job at a time: callers sharing it must not call into the library from two
 * threads at once. */
typedef struct kkv_threadpool kkv_threadpool;
typedef void (*kkv_task_fn)(void *ctx, int task);

/* n_threads >= 1 threads in all, the caller's included (1: no workers).
 * Free with kkv_threadpool_free after everything that borrows it. */
kkv_status kkv_threadpool_create(kkv_threadpool **out, int n_threads);
void       kkv_threadpool_free(kkv_threadpool *tp);
/* Threads the pool runs tasks on, the caller included (1 for NULL). */
int        kkv_threadpool_size(const kkv_threadpool *tp);
/* Runs fn(ctx, task) for every task in [0, n_tasks) on the pool and the
 * calling thread; returns when all are done. tp may be NULL (serial). Which
 * thread runs a task is unspecified: give each task its own output. Each
 * thread starts on a contiguous run of tasks, in order, so tasks whose
 * neighbours read neighbouring data keep their caches warm. */
void       kkv_threadpool_run(kkv_threadpool *tp, int n_tasks, kkv_task_fn fn, void *ctx);

/* Makes the cache run attention on tp (borrowed; it must outlive the cache or
 * the next call), or on its own pool again with tp = NULL. Results do not
 * depend on the pool. */
kkv_status kkv_cache_set_threadpool(kkv_cache *c, kkv_threadpool *tp);

KKV_END_DECLS
#endif /* KITTYKV_CPU_H */
