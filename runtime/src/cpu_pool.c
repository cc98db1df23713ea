/*
 * cpu_pool.c - see cpu_pool.h.
 *
 * Waking a sleeping thread through a condition variable costs tens of
 * microseconds, as much as a whole decode-sized launch. Workers therefore
 * spin for a short while after each launch, watching an atomic generation
 * counter, and only then go to sleep; the caller likewise spins while its
 * workers finish. A pool that is idle for long costs no CPU.
 */
#include "cpu_pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "attnres.h"

/* Iterations a worker spins before sleeping (roughly 100-200 us). */
#define POOL_SPIN_ITERATIONS 20000

struct cpu_pool {
    pthread_t *threads;
    int nworkers;
    pthread_mutex_t launch_lock; /* one launch at a time */
    pthread_mutex_t mu;          /* guards sleeping and the condition */
    pthread_cond_t start;
    /* (launch number << 16) | parts: one word, so that a worker learns
     * whether it takes part from the same load that announces the launch. */
    atomic_ulong generation;
    atomic_int pending;
    atomic_int stop;
    int sleeping;
    /* The launch in flight; written before generation is published. */
    cpu_pool_fn fn;
    void *ctx;
    int64_t total;
};

typedef struct worker_arg {
    cpu_pool *pool;
    int index; /* 1..nworkers; chunk 0 belongs to the caller */
} worker_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void run_chunk(cpu_pool *p, int chunk, int parts)
{
    int64_t t0 = p->total * chunk / parts;
    int64_t t1 = p->total * (chunk + 1) / parts;
    if (t1 > t0)
        p->fn(p->ctx, t0, t1);
}

/* Waits until the generation moves past `seen` (or the pool stops). */
static unsigned long wait_for_launch(cpu_pool *p, unsigned long seen)
{
    for (int i = 0; i < POOL_SPIN_ITERATIONS; i++) {
        unsigned long g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen || atomic_load(&p->stop))
            return g;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    p->sleeping++;
    unsigned long g;
    while ((g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->start, &p->mu);
    p->sleeping--;
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *argp)
{
    worker_arg *arg = argp;
    cpu_pool *p = arg->pool;
    int index = arg->index;
    free(arg);
    unsigned long seen = 0;
    for (;;) {
        seen = wait_for_launch(p, seen);
        if (atomic_load(&p->stop))
            break;
        int parts = (int)(seen & 0xffff);
        if (index < parts) {
            run_chunk(p, index, parts);
            atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
        }
    }
    return NULL;
}

int cpu_pool_create(int nworkers, cpu_pool **out)
{
    *out = NULL;
    cpu_pool *p = calloc(1, sizeof *p);
    if (!p)
        return -1;
    p->threads = calloc(nworkers > 0 ? (size_t)nworkers : 1, sizeof *p->threads);
    if (!p->threads) {
        free(p);
        return -1;
    }
    pthread_mutex_init(&p->launch_lock, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    /* Kernels keep up to ATTNRES_CPU_STACK_MAX bytes of state on the stack:
     * workers get at least twice that, whatever RLIMIT_STACK says. */
    pthread_attr_t attr;
    size_t stack = 0;
    pthread_attr_init(&attr);
    if (pthread_attr_getstacksize(&attr, &stack) == 0 && stack < 2 * (size_t)ATTNRES_CPU_STACK_MAX)
        pthread_attr_setstacksize(&attr, 2 * (size_t)ATTNRES_CPU_STACK_MAX);
    for (int i = 0; i < nworkers; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg) {
            pthread_attr_destroy(&attr);
            cpu_pool_destroy(p);
            return -1;
        }
        arg->pool = p;
        arg->index = i + 1;
        if (pthread_create(&p->threads[i], &attr, worker_main, arg) != 0) {
            free(arg);
            pthread_attr_destroy(&attr);
            cpu_pool_destroy(p);
            return -1;
        }
        p->nworkers = i + 1;
    }
    pthread_attr_destroy(&attr);
    *out = p;
    return 0;
}

void cpu_pool_destroy(cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->start);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->launch_lock);
    free(p->threads);
    free(p);
}

int cpu_pool_workers(const cpu_pool *p) { return p->nworkers; }

void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *ctx, int64_t total, int parts)
{
    if (parts > p->nworkers + 1)
        parts = p->nworkers + 1;
    if (parts > 0xffff)
        parts = 0xffff;
    if (parts > total)
        parts = (int)total;
    if (parts <= 1) {
        if (total > 0)
            fn(ctx, 0, total);
        return;
    }
    pthread_mutex_lock(&p->launch_lock);
    p->fn = fn;
    p->ctx = ctx;
    p->total = total;
    atomic_store_explicit(&p->pending, parts - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    unsigned long ticket = ((atomic_load(&p->generation) >> 16) + 1) << 16 | (unsigned long)parts;
    atomic_store_explicit(&p->generation, ticket, memory_order_release);
    if (p->sleeping)
        pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    run_chunk(p, 0, parts);
    /* The workers are running, not sleeping: spin, yielding now and then so
     * an oversubscribed machine still makes progress. */
    for (unsigned spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < 4096)
            cpu_relax();
        else
            sched_yield();
    }
    pthread_mutex_unlock(&p->launch_lock);
}
