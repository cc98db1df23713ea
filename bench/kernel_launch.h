/*
 * kernel_launch.h - the launcher that the kernel harnesses of bench/ share
 * (mix_kernel.c, mix_backward_kernel.c, phase1_kernel.c, phase2_kernel.c):
 * a kernel entry over a token range, timed on T tokens split evenly over
 * the threads; and the shape the two mix harnesses read from their
 * arguments.
 */
#ifndef ATTNRES_BENCH_KERNEL_LAUNCH_H
#define ATTNRES_BENCH_KERNEL_LAUNCH_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* A kernel entry, as the generated CPU kernels take one: tokens [t0, t1). */
typedef void (*token_range_fn)(const void *args, int64_t t0, int64_t t1);

typedef struct launch_job {
    token_range_fn run;
    const void *args;
    int64_t t0, t1;
    int repeats;
} launch_job;

static double launch_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *launch_job_run(void *p)
{
    const launch_job *j = p;
    for (int r = 0; r < j->repeats; r++)
        j->run(j->args, j->t0, j->t1);
    return NULL;
}

/* One launch: thread i takes tokens [T * i / threads, T * (i + 1) / threads)
 * `repeats` times; the calling thread is thread 0. Seconds of wall time. */
static double launch_once(token_range_fn run, const void *args, int64_t T, int threads, int repeats)
{
    pthread_t th[64];
    launch_job jobs[64];
    const double t0 = launch_now();
    for (int i = 0; i < threads; i++) {
        jobs[i] = (launch_job){run, args, T * i / threads, T * (i + 1) / threads, repeats};
        if (i > 0)
            pthread_create(&th[i], NULL, launch_job_run, &jobs[i]);
    }
    launch_job_run(&jobs[0]);
    for (int i = 1; i < threads; i++)
        pthread_join(th[i], NULL);
    return launch_now() - t0;
}

static int launch_by_value(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The median of 9 timed launches after one warm-up; threads 1..64. */
static double launch_median(token_range_fn run, const void *args, int64_t T, int threads, int repeats)
{
    double times[9];
    launch_once(run, args, T, threads, repeats);
    for (int r = 0; r < 9; r++)
        times[r] = launch_once(run, args, T, threads, repeats);
    qsort(times, 9, sizeof *times, launch_by_value);
    return times[4];
}

/* The shape the mix harnesses take: D T N THREADS REPEATS [HEADS]. */
typedef struct kernel_shape {
    int64_t d, T;
    int n, threads, repeats, heads;
} kernel_shape;

/* Reads the shape from argv into s; 0, or 2 (the exit status) after saying
 * what is wrong. A kernel that starts each thread on a token group's first
 * token gives the group size: T must then be a multiple of group * THREADS
 * (group 1: any T). */
static inline int kernel_shape_parse(int argc, char **argv, int64_t group, kernel_shape *s)
{
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s D T N THREADS REPEATS [HEADS]\n", argv[0]);
        return 2;
    }
    s->d = atoll(argv[1]), s->T = atoll(argv[2]);
    s->n = atoi(argv[3]), s->threads = atoi(argv[4]), s->repeats = atoi(argv[5]);
    s->heads = argc == 7 ? atoi(argv[6]) : 1;
    if (s->d <= 0 || s->d % 64 || s->T <= 0 || s->n < 1 || s->n > 64 || s->threads < 1 || s->threads > 64 ||
        s->repeats < 1 || s->heads < 1 || s->d % (64 * (int64_t)s->heads)) {
        fprintf(stderr, "%s: D must be a positive multiple of 64 * HEADS, N 1..64, THREADS 1..64\n", argv[0]);
        return 2;
    }
    if (s->T % (group * s->threads)) {
        fprintf(stderr, "%s: T must be a multiple of %lld * THREADS\n", argv[0], (long long)group);
        return 2;
    }
    return 0;
}

#endif
