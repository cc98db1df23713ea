/*
 * read_bandwidth.c - how fast this machine's cores stream reads from memory,
 * the ceiling of a read-dominated kernel such as the depth mix (the tuner's
 * roofline is the copy bandwidth, which counts written bytes too).
 *
 *   cc -O2 -march=native -pthread bench/read_bandwidth.c -o /tmp/read_bandwidth
 *   /tmp/read_bandwidth [THREADS]
 *
 * Sums a 2 GiB float buffer with THREADS threads (default 1 and 2), best of 4.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef float vf __attribute__((vector_size(64)));

static const float *buffer;
static size_t count;
static int nthreads;
static volatile float sink; /* keeps every sum alive */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *sum_part(void *arg)
{
    size_t part = (size_t)arg, lo = part * count / (size_t)nthreads, hi = (part + 1) * count / (size_t)nthreads;
    vf s0 = {0}, s1 = {0};
    for (size_t i = lo; i + 32 <= hi; i += 32) {
        vf a, b;
        memcpy(&a, buffer + i, sizeof a);
        memcpy(&b, buffer + i + 16, sizeof b);
        s0 += a;
        s1 += b;
    }
    s0 += s1;
    sink = s0[0];
    return NULL;
}

static double measure(int threads)
{
    nthreads = threads;
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        pthread_t th[64];
        double t0 = now();
        for (int i = 1; i < threads; i++)
            pthread_create(&th[i], NULL, sum_part, (void *)(size_t)i);
        sum_part((void *)0);
        for (int i = 1; i < threads; i++)
            pthread_join(th[i], NULL);
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    return (double)count * 4 / best / 1e9;
}

int main(int argc, char **argv)
{
    count = (size_t)512 << 20;
    float *a = aligned_alloc(64, count * 4);
    if (!a)
        return 1;
    memset(a, 1, count * 4);
    buffer = a;
    if (argc > 1) {
        int t = atoi(argv[1]);
        printf("%d thread(s): %.1f GB/s read\n", t, measure(t < 1 ? 1 : t > 64 ? 64 : t));
    } else {
        for (int t = 1; t <= 2; t++)
            printf("%d thread(s): %.1f GB/s read\n", t, measure(t));
    }
    free(a);
    return 0;
}
