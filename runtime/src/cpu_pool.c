/* cpu_pool.c - see cpu_pool.h. */
#include "cpu_pool.h"

#include <pthread.h>
#include <stdlib.h>

struct cpu_pool {
    pthread_t *threads;
    int nworkers;
    pthread_mutex_t launch_lock; /* one launch at a time */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long generation;
    int pending, stop;
    /* The launch in flight. */
    cpu_pool_fn fn;
    void *ctx;
    int64_t total;
    int parts;
};

typedef struct worker_arg {
    cpu_pool *pool;
    int index; /* 1..nworkers; chunk 0 belongs to the caller */
} worker_arg;

static void run_chunk(cpu_pool *p, int chunk)
{
    int64_t t0 = p->total * chunk / p->parts;
    int64_t t1 = p->total * (chunk + 1) / p->parts;
    if (t1 > t0)
        p->fn(p->ctx, t0, t1);
}

static void *worker_main(void *argp)
{
    worker_arg *arg = argp;
    cpu_pool *p = arg->pool;
    int index = arg->index;
    free(arg);
    unsigned long seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen)
            pthread_cond_wait(&p->start, &p->mu);
        if (p->stop)
            break;
        seen = p->generation;
        if (index < p->parts) {
            pthread_mutex_unlock(&p->mu);
            run_chunk(p, index);
            pthread_mutex_lock(&p->mu);
            if (--p->pending == 0)
                pthread_cond_signal(&p->done);
        }
    }
    pthread_mutex_unlock(&p->mu);
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
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < nworkers; i++) {
        worker_arg *arg = malloc(sizeof *arg);
        if (!arg || pthread_create(&p->threads[i], NULL, worker_main,
                                   (arg->pool = p, arg->index = i + 1, arg))) {
            free(arg);
            p->nworkers = i;
            cpu_pool_destroy(p);
            return -1;
        }
        p->nworkers = i + 1;
    }
    *out = p;
    return 0;
}

void cpu_pool_destroy(cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; i++)
        pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->launch_lock);
    free(p->threads);
    free(p);
}

int cpu_pool_workers(const cpu_pool *p) { return p->nworkers; }

void cpu_pool_run(cpu_pool *p, cpu_pool_fn fn, void *ctx, int64_t total,
                  int parts)
{
    if (parts > p->nworkers + 1)
        parts = p->nworkers + 1;
    if (parts > total)
        parts = (int)total;
    if (parts <= 1) {
        if (total > 0)
            fn(ctx, 0, total);
        return;
    }
    pthread_mutex_lock(&p->launch_lock);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->total = total;
    p->parts = parts;
    p->pending = parts - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    run_chunk(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->launch_lock);
}
