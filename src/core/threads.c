/* Thread pool: workers sleep on a condition variable between jobs and take
 * tasks from an atomic counter during one. */
#define _GNU_SOURCE
#include "core/threads.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/status.h"

struct kkv_threadpool {
    int             n_workers; /* threads besides the caller */
    pthread_t      *workers;   /* [n_workers] */
    pthread_mutex_t mu;
    pthread_cond_t  wake;      /* a new job, or shutdown */
    pthread_cond_t  done;      /* the last worker left the job */
    unsigned long   generation;
    int             busy;      /* workers still inside the current job */
    int             quit;
    kkv_task_fn     fn;
    void           *ctx;
    int             n_tasks;
    atomic_int      next;
};

static void drain(kkv_tp *tp) {
    for (;;) {
        int t = atomic_fetch_add(&tp->next, 1);
        if (t >= tp->n_tasks) return;
        tp->fn(tp->ctx, t);
    }
}

static void *worker_main(void *arg) {
    kkv_tp *tp = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->quit && tp->generation == seen) pthread_cond_wait(&tp->wake, &tp->mu);
        if (tp->quit) break;
        seen = tp->generation;
        pthread_mutex_unlock(&tp->mu);
        drain(tp);
        pthread_mutex_lock(&tp->mu);
        if (--tp->busy == 0) pthread_cond_signal(&tp->done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

kkv_status kkv_tp_create(kkv_tp **out, int n_threads) {
    *out = NULL;
    if (n_threads <= 1) return KKV_OK;
    return kkv_threadpool_create(out, n_threads);
}

kkv_status kkv_threadpool_create(kkv_threadpool **out, int n_threads) {
    if (!out) return kkv_fail(KKV_ERR_INVALID_ARG, "thread pool: NULL output");
    *out = NULL;
    if (n_threads < 1 || n_threads > KKV_MAX_THREADS)
        return kkv_fail(KKV_ERR_INVALID_ARG, "thread pool: %d threads is outside 1..%d",
                        n_threads, KKV_MAX_THREADS);
    kkv_tp *tp = calloc(1, sizeof *tp);
    if (!tp) return kkv_fail(KKV_ERR_NOMEM, "thread pool: out of memory");
    tp->workers = calloc((size_t)n_threads, sizeof *tp->workers); /* [n_threads - 1] used */
    if (!tp->workers) {
        free(tp);
        return kkv_fail(KKV_ERR_NOMEM, "thread pool: out of memory");
    }
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done, NULL);
    for (int i = 0; i < n_threads - 1; i++) {
        if (pthread_create(&tp->workers[i], NULL, worker_main, tp) != 0) break;
        tp->n_workers++;
    }
    *out = tp;
    return KKV_OK;
}

void kkv_tp_free(kkv_tp *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->quit = 1;
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_workers; i++) pthread_join(tp->workers[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done);
    free(tp->workers);
    free(tp);
}

int kkv_tp_size(const kkv_tp *tp) { return tp ? tp->n_workers + 1 : 1; }

void kkv_tp_run(kkv_tp *tp, int n_tasks, kkv_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!tp || tp->n_workers == 0 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t);
        return;
    }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_tasks = n_tasks;
    atomic_store(&tp->next, 0);
    tp->busy = tp->n_workers;
    tp->generation++;
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    drain(tp);
    pthread_mutex_lock(&tp->mu);
    while (tp->busy > 0) pthread_cond_wait(&tp->done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
}

void kkv_threadpool_free(kkv_threadpool *tp) { kkv_tp_free(tp); }
int  kkv_threadpool_size(const kkv_threadpool *tp) { return kkv_tp_size(tp); }
void kkv_threadpool_run(kkv_threadpool *tp, int n_tasks, kkv_task_fn fn, void *ctx) {
    if (fn) kkv_tp_run(tp, n_tasks, fn, ctx);
}

int kkv_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
