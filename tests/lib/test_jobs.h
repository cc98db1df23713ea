/*
 * test_jobs.h - a few threads working through a numbered list of jobs
 * (compiling every variant with NVRTC, in test_nvrtc and in the simulated
 * CUDA sweep): each thread takes the next job until none is left, and the
 * caller can wait for one job while later ones go on. Header-only; the
 * program links with threads.
 */
#ifndef ATTNRES_TEST_JOBS_H
#define ATTNRES_TEST_JOBS_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define JOB_POOL_MAX_THREADS 16

typedef struct job_pool {
    void (*run)(size_t job); /* runs one job; called on a worker thread */
    size_t count, next;
    unsigned char *done;     /* per job: run has returned */
    pthread_mutex_t lock;
    pthread_cond_t finished;
    pthread_t threads[JOB_POOL_MAX_THREADS];
    int started;
} job_pool;

static inline void *job_pool_worker(void *arg)
{
    job_pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        const size_t i = p->next < p->count ? p->next++ : p->count;
        pthread_mutex_unlock(&p->lock);
        if (i >= p->count)
            return NULL;
        p->run(i);
        pthread_mutex_lock(&p->lock);
        p->done[i] = 1;
        pthread_cond_broadcast(&p->finished);
        pthread_mutex_unlock(&p->lock);
    }
}

/* Starts up to `threads` workers on jobs 0 to count - 1; where none can
 * be started (or the done flags cannot be allocated) the jobs run here,
 * before it returns. */
static inline void job_pool_start(job_pool *p, size_t count, int threads, void (*run)(size_t job))
{
    *p = (job_pool){.run = run, .count = count, .done = calloc(count ? count : 1, 1)};
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->finished, NULL);
    if (threads > JOB_POOL_MAX_THREADS)
        threads = JOB_POOL_MAX_THREADS;
    for (int t = 0; p->done && t < threads; t++)
        if (pthread_create(&p->threads[p->started], NULL, job_pool_worker, p) == 0)
            p->started++;
    if (p->started == 0) {
        /* No worker: the jobs run here, and none is left to wait for. */
        for (size_t i = 0; i < count; i++)
            run(i);
        p->next = count;
        if (p->done)
            memset(p->done, 1, count);
    }
}

/* Waits until job i has run. */
static inline void job_pool_wait(job_pool *p, size_t i)
{
    pthread_mutex_lock(&p->lock);
    while (p->done && i < p->count && !p->done[i])
        pthread_cond_wait(&p->finished, &p->lock);
    pthread_mutex_unlock(&p->lock);
}

/* Waits for every worker to finish and frees the pool's state; returns
 * how many threads worked (1 where the jobs ran on the caller). */
static inline int job_pool_finish(job_pool *p)
{
    for (int t = 0; t < p->started; t++)
        pthread_join(p->threads[t], NULL);
    free(p->done);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->finished);
    return p->started ? p->started : 1;
}

#endif
