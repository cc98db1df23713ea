/*
 * read_bandwidth.c - how fast this machine's cores stream reads from memory,
 * the ceiling of a read-dominated kernel such as the depth mix, next to the
 * copy bandwidth as the tuner measures it (its ceiling, which counts read
 * and written bytes), so that one run gives both.
 *
 *   cc -O2 -march=native -pthread bench/read_bandwidth.c -o /tmp/read_bandwidth
 *   /tmp/read_bandwidth [THREADS]
 *
 * Sums a 2 GiB float buffer with THREADS threads (default 1 and 2), best of 4;
 * then copies 256 MiB with memcpy split over the same threads, best of runs
 * spanning half a second as the tuner does (read + written bytes per second).
 * The first run of each is not counted.
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

static char *copy_dst;
static const char *copy_src;
static size_t copy_bytes;

static void *copy_part(void *arg)
{
    size_t part = (size_t)arg, lo = part * copy_bytes / (size_t)nthreads,
           hi = (part + 1) * copy_bytes / (size_t)nthreads;
    memcpy(copy_dst + lo, copy_src + lo, hi - lo);
    return NULL;
}

/* The shortest time of `part` run on `threads` threads, over at least
 * `runs` runs spanning at least `seconds`; the first run, which faults the
 * pages in, does not count. */
static double best_time(void *(*part)(void *), int threads, int runs, double seconds)
{
    nthreads = threads;
    double best = 1e30, start = now();
    for (int r = 0; r < 64 && (r < runs || now() - start < seconds); r++) {
        pthread_t th[64];
        double t0 = now();
        for (int i = 1; i < threads; i++)
            pthread_create(&th[i], NULL, part, (void *)(size_t)i);
        part((void *)0);
        for (int i = 1; i < threads; i++)
            pthread_join(th[i], NULL);
        double t = now() - t0;
        if (r > 0 && t < best)
            best = t;
    }
    return best;
}

/* The tuner's copy bandwidth (runtime/src/cpu_backend.c): the same buffer
 * size, split and statistic. */
static double measure_copy(int threads)
{
    copy_bytes = (size_t)256 << 20;
    char *src = aligned_alloc(64, copy_bytes), *dst = aligned_alloc(64, copy_bytes);
    if (!src || !dst) {
        free(src);
        return 0.0;
    }
    memset(src, 1, copy_bytes);
    memset(dst, 2, copy_bytes);
    copy_src = src;
    copy_dst = dst;
    double best = best_time(copy_part, threads, 8, 0.5);
    free(src);
    free(dst);
    return 2.0 * (double)copy_bytes / best / 1e9;
}

static double measure(int threads)
{
    return (double)count * 4 / best_time(sum_part, threads, 5, 0.0) / 1e9;
}

static void report(int threads)
{
    double r = measure(threads), c = measure_copy(threads);
    printf("%d thread(s): %.1f GB/s read, %.1f GB/s copy (read is %.0f%% of copy)\n", threads, r,
           c, 100.0 * r / c);
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
        report(t < 1 ? 1 : t > 64 ? 64 : t);
    } else {
        for (int t = 1; t <= 2; t++)
            report(t);
    }
    free(a);
    return 0;
}
