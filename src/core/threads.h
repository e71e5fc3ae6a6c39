/* A small fixed thread pool. kkv_tp_run() runs fn(ctx, task) for every task in
 * [0, n_tasks) on the pool and the calling thread, and returns when all are
 * done. Which thread runs a task must not change its result: callers give each
 * task its own output slot and merge in task order, which keeps results
 * bit-identical for any thread count. */
#ifndef KKV_CORE_THREADS_H
#define KKV_CORE_THREADS_H

#include "core/export.h"
#include "kittykv_cpu.h"

/* The library's name for the public kkv_threadpool. */
typedef kkv_threadpool kkv_tp;

/* More threads than this is a caller's mistake (and costs more than it gives). */
#define KKV_MAX_THREADS 256

/* n_threads <= 1 gives a pool that runs everything on the caller's thread.
 * *out = NULL is valid for that case too. */
KKV_LAYER_API kkv_status kkv_tp_create(kkv_tp **out, int n_threads);
KKV_LAYER_API void kkv_tp_free(kkv_tp *tp);
/* Threads the pool runs tasks on, the caller included (>= 1; 1 for NULL). */
KKV_LAYER_API int kkv_tp_size(const kkv_tp *tp);
/* tp may be NULL (serial). Not reentrant: a task must not call kkv_tp_run on
 * the same pool. */
KKV_LAYER_API void kkv_tp_run(kkv_tp *tp, int n_tasks, kkv_task_fn fn, void *ctx);

#endif
