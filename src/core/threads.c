/* Thread pool: between jobs workers spin on the job counter for a short
 * while, then sleep on a condition variable; during a job they take tasks
 * from an atomic counter. A decode step is hundreds of small jobs (every
 * matmul of every layer, every attention call) a few microseconds apart, and
 * waking a sleeping thread through the kernel costs about as much as one such
 * job: with sleeping workers two threads were barely faster than one. The
 * spin is bounded, so an idle pool costs no CPU.
 *
 * Tasks are dealt in contiguous spans, one per thread: a thread takes its own
 * span's tasks from the front, in order, and when it runs out takes other
 * spans' tasks from their back. Neighbouring tasks read neighbouring data (an
 * attention head's consecutive pages, a matmul's consecutive row blocks), and
 * a task prefetches what the next one reads first: with one shared counter two
 * threads took tasks alternately, each started on data the other had fetched,
 * and kitty attention at 16K spent ~18% more CPU on two threads than on one.
 * Which thread runs a task still never changes a result (threads.h).
 *
 * Handshakes use sequentially consistent atomics (Dekker style): a sleeper
 * announces itself (sleepers++ under the mutex) and then re-reads the job
 * counter; a publisher bumps the counter and then reads sleepers. One of the
 * two sees the other, so no wake-up is lost. The caller's wait for the last
 * worker works the same way with caller_waiting. */
#define _GNU_SOURCE
#include "core/threads.h"

#include <pthread.h>
#include <time.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/status.h"

/* How long a worker polls for the next job, and the caller for the last
 * worker, before sleeping: SPIN_NS_DEFAULT, or KKV_SPIN_US microseconds from
 * the environment (read when the pool is made; 0 sleeps at once, as a pool
 * without polling). The bound is wall time, read every 64 polls, and the
 * poll never yields: on an oversubscribed machine (tests run two to a core
 * pair) a yielding poller gave its core away for a whole time slice per job
 * and a test ran 17x slower; a short bound caps the waste at ~20 us per job
 * while still catching the next matmul of a decode step, microseconds away. */
#define SPIN_NS_DEFAULT 20000
#define SPIN_US_MAX     100000

/* The tasks [front, back) of one thread's span, packed front << 32 | back so
 * one compare-and-swap claims a task from either end. A line of its own: the
 * owner claims from it at every task. */
typedef struct span {
    _Alignas(64) atomic_ullong fb;
    char pad[64 - sizeof(atomic_ullong)];
} span;

/* What a worker thread is given: the pool and its span. */
typedef struct worker_arg {
    struct kkv_threadpool *tp;
    int                    self;
} worker_arg;

struct kkv_threadpool {
    int             n_workers; /* threads besides the caller */
    pthread_t      *workers;   /* [n_workers] */
    worker_arg     *args;      /* [n_workers] */
    pthread_mutex_t mu;
    pthread_cond_t  wake;      /* a new job, or shutdown */
    pthread_cond_t  done;      /* the last worker left the job */
    atomic_ulong    generation; /* jobs published so far */
    atomic_int      busy;      /* workers still inside the current job */
    atomic_int      sleepers;  /* workers in (or entering) cond_wait(wake) */
    atomic_int      caller_waiting; /* the caller is in (or entering) cond_wait(done) */
    atomic_int      quit;
    kkv_task_fn     fn;        /* the current job: written before generation moves */
    void           *ctx;
    span           *spans;     /* [n_workers + 1]: the caller's, then worker i's at i + 1 */
    long long       spin_ns;   /* polling bound before sleeping (see SPIN_NS_DEFAULT) */
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* 1 while poll i (from 0) is within spin_ns of the first; reads the clock
 * every 64th poll only. */
static inline int still_spinning(int i, long long *t0, long long spin_ns) {
    if ((i & 63) != 63) return 1;
    long long t = now_ns();
    if (*t0 == 0) *t0 = t;
    return t - *t0 < spin_ns;
}

/* Claims one task of span sp: from the front for its owner, else from the
 * back. Returns -1 when the span is empty. */
static int claim(span *sp, int front) {
    unsigned long long v = atomic_load(&sp->fb);
    for (;;) {
        unsigned f = (unsigned)(v >> 32), b = (unsigned)v;
        if (f >= b) return -1;
        unsigned long long nv = front ? v + (1ull << 32) : v - 1;
        if (atomic_compare_exchange_weak(&sp->fb, &v, nv)) return front ? (int)f : (int)b - 1;
    }
}

/* Runs tasks until every span is empty: self's own first, then the others'. */
static void drain(kkv_tp *tp, int self) {
    int n = tp->n_workers + 1;
    for (int k = 0; k < n; k++) {
        span *sp = &tp->spans[(self + k) % n];
        for (int t; (t = claim(sp, k == 0)) >= 0;) tp->fn(tp->ctx, t);
    }
}

/* Waits until a job after `seen` is published or the pool quits. */
static void wait_job(kkv_tp *tp, unsigned long seen) {
    long long t0 = 0;
    for (int i = 0; still_spinning(i, &t0, tp->spin_ns); i++) {
        if (atomic_load(&tp->generation) != seen || atomic_load(&tp->quit)) return;
        cpu_relax();
    }
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->sleepers, 1);
    while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->quit))
        pthread_cond_wait(&tp->wake, &tp->mu);
    atomic_fetch_sub(&tp->sleepers, 1);
    pthread_mutex_unlock(&tp->mu);
}

static void *worker_main(void *arg) {
    const worker_arg *wa = arg;
    kkv_tp *tp = wa->tp;
    unsigned long seen = 0;
    for (;;) {
        wait_job(tp, seen);
        if (atomic_load(&tp->quit)) break;
        seen = atomic_load(&tp->generation);
        drain(tp, wa->self);
        if (atomic_fetch_sub(&tp->busy, 1) == 1 && atomic_load(&tp->caller_waiting)) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done);
            pthread_mutex_unlock(&tp->mu);
        }
    }
    return NULL;
}

kkv_status kkv_tp_create(kkv_tp **out, int n_threads) {
    *out = NULL;
    if (n_threads <= 1) return KKV_OK;
    return kkv_threadpool_create(out, n_threads);
}

/* The polling bound: KKV_SPIN_US (0..SPIN_US_MAX microseconds) when set and
 * valid, else the default. */
static long long spin_bound_ns(void) {
    const char *e = getenv("KKV_SPIN_US");
    if (!e || !*e) return SPIN_NS_DEFAULT;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end || v < 0 || v > SPIN_US_MAX) return SPIN_NS_DEFAULT;
    return (long long)v * 1000;
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
    tp->args = calloc((size_t)n_threads, sizeof *tp->args);      /* [n_threads - 1] used */
    tp->spans = aligned_alloc(64, (size_t)n_threads * sizeof *tp->spans); /* [n_threads] */
    if (!tp->workers || !tp->args || !tp->spans) {
        free(tp->workers);
        free(tp->args);
        free(tp->spans);
        free(tp);
        return kkv_fail(KKV_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 0; i < n_threads; i++) atomic_init(&tp->spans[i].fb, 0);
    tp->spin_ns = spin_bound_ns();
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done, NULL);
    for (int i = 0; i < n_threads - 1; i++) {
        tp->args[i] = (worker_arg){tp, i + 1};
        if (pthread_create(&tp->workers[i], NULL, worker_main, &tp->args[i]) != 0) break;
        tp->n_workers++;
    }
    *out = tp;
    return KKV_OK;
}

void kkv_tp_free(kkv_tp *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->quit, 1);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_workers; i++) pthread_join(tp->workers[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->wake);
    pthread_cond_destroy(&tp->done);
    free(tp->workers);
    free(tp->args);
    free(tp->spans);
    free(tp);
}

int kkv_tp_size(const kkv_tp *tp) { return tp ? tp->n_workers + 1 : 1; }

void kkv_tp_run(kkv_tp *tp, int n_tasks, kkv_task_fn fn, void *ctx) {
    if (n_tasks <= 0) return;
    if (!tp || tp->n_workers == 0 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(ctx, t);
        return;
    }
    /* no worker is inside a job here (the last run waited for busy == 0) */
    tp->fn = fn;
    tp->ctx = ctx;
    int n = tp->n_workers + 1; /* span i: tasks [i * n_tasks / n, (i + 1) * n_tasks / n) */
    for (int i = 0; i < n; i++) {
        unsigned long long f = (unsigned long long)((long long)i * n_tasks / n);
        unsigned long long b = (unsigned long long)((long long)(i + 1) * n_tasks / n);
        atomic_store(&tp->spans[i].fb, f << 32 | b);
    }
    atomic_store(&tp->busy, tp->n_workers);
    atomic_fetch_add(&tp->generation, 1);
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->wake);
        pthread_mutex_unlock(&tp->mu);
    }
    drain(tp, 0);
    long long t0 = 0;
    for (int i = 0; atomic_load(&tp->busy) > 0 && still_spinning(i, &t0, tp->spin_ns); i++) cpu_relax();
    if (atomic_load(&tp->busy) > 0) {
        pthread_mutex_lock(&tp->mu);
        /* an exchange, not a store: the same in C11, but qemu-user (7.2, on
         * an x86 host) runs an aarch64 store-release and the load-acquire
         * after it without the store-to-load order ARM gives the pair, so
         * the last worker could miss caller_waiting while this missed its
         * decrement, and the emulated tests hung about one run in eight */
        atomic_exchange(&tp->caller_waiting, 1);
        while (atomic_load(&tp->busy) > 0) pthread_cond_wait(&tp->done, &tp->mu);
        atomic_store(&tp->caller_waiting, 0);
        pthread_mutex_unlock(&tp->mu);
    }
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
