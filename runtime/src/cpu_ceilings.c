/*
 * cpu_ceilings.c - what this CPU's memory and arithmetic allow: streaming
 * kernels that do nothing but move bytes, each on 1, 2, 4, ... and all
 * threads, and a loop of independent FMAs. The tuner compares every kernel
 * with the best of them that matches its traffic (docs/design.md §2); the
 * reasons the figures differ between CPUs are in docs/cpu_kernels.md.
 */
#include "cpu_ceilings.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CEIL_X86 1
#endif

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* ---- the streaming kernels ------------------------------------------ */

/* Sums n bytes (a multiple of 512, 64-byte aligned like every buffer
 * here) from `streams` equal parts of x read side by side, eight
 * accumulators of VBYTES-byte vectors in all (each 64-byte line is
 * 64 / VBYTES aligned loads into one of them), so that only memory bounds
 * the loop. The mix kernels read N rows side by side; a core's
 * prefetchers follow each stream on its own, so one stream and eight can
 * differ. With `ahead` > 0, every line is also asked for `ahead` bytes
 * before it is read (software prefetch into L2), as the tuned mix kernels
 * do: on the Zen 4 guest that read faster than the hardware prefetchers
 * alone (docs/cpu_kernels.md), and a ceiling must have every tool the
 * kernels it bounds have. One function per vector width: 64-byte vectors
 * without AVX-512 are split into halves that, eight of them, do not fit in
 * AVX2's 16 registers and live on the stack, which held this loop to about
 * 70% of the rate of memory on an AVX2 host (docs/cpu_kernels.md). */
#define DEFINE_SUM_STREAMS(name, VBYTES, ATTR)                                                    \
    ATTR static float name(const char *x, size_t n, int streams, size_t ahead)                    \
    {                                                                                             \
        typedef float v __attribute__((vector_size(VBYTES)));                                     \
        enum { PER_LINE = 64 / (VBYTES), LANES = (VBYTES) / 4 };                                  \
        v s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0}, s4 = {0}, s5 = {0}, s6 = {0}, s7 = {0};         \
        const size_t part = streams == 1 ? 64 : n / 8, step = streams == 1 ? 512 : 64;            \
        const size_t len = streams == 1 ? n : part;                                               \
        for (size_t i = 0; i < len; i += step) {                                                  \
            const v *l0 = (const v *)(const void *)(x + i);                                       \
            if (ahead) {                                                                          \
                _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++)                               \
                    __builtin_prefetch(x + i + (size_t)k * part + ahead, 0, 2);                   \
            }                                                                                     \
            _Pragma("GCC unroll 4") for (int h = 0; h < PER_LINE; h++) {                          \
                s0 += l0[h];                                                                      \
                s1 += l0[h + 1 * part / (VBYTES)];                                                \
                s2 += l0[h + 2 * part / (VBYTES)];                                                \
                s3 += l0[h + 3 * part / (VBYTES)];                                                \
                s4 += l0[h + 4 * part / (VBYTES)];                                                \
                s5 += l0[h + 5 * part / (VBYTES)];                                                \
                s6 += l0[h + 6 * part / (VBYTES)];                                                \
                s7 += l0[h + 7 * part / (VBYTES)];                                                \
            }                                                                                     \
        }                                                                                         \
        const v all = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));                          \
        float total = 0.0f;                                                                       \
        for (int i = 0; i < LANES; i++)                                                           \
            total += all[i];                                                                      \
        return total;                                                                             \
    }

DEFINE_SUM_STREAMS(sum_plain, 16, )

#ifdef CEIL_X86
/* The library is built for the baseline ISA; the kernels it is compared
 * with use the machine's widest loads, so the ceiling must too. */
DEFINE_SUM_STREAMS(sum_avx512, 64, __attribute__((target("avx512f"))))
DEFINE_SUM_STREAMS(sum_avx2, 32, __attribute__((target("avx2"))))

/* Copies with non-temporal stores (the lines written bypass the caches
 * and take none of the core's load concurrency); n a multiple of 256.
 * With `ahead` > 0 each source line is prefetched that many bytes early. */
__attribute__((target("avx512f"))) static void copy_nt_avx512(char *dst, const char *src, size_t n, size_t ahead)
{
    for (size_t i = 0; i < n; i += 256) {
        if (ahead)
            for (int k = 0; k < 256; k += 64)
                __builtin_prefetch(src + i + k + ahead, 0, 2);
        __m512 a = _mm512_load_ps((const float *)(src + i)), b = _mm512_load_ps((const float *)(src + i + 64));
        __m512 c = _mm512_load_ps((const float *)(src + i + 128)), d = _mm512_load_ps((const float *)(src + i + 192));
        _mm512_stream_ps((float *)(dst + i), a);
        _mm512_stream_ps((float *)(dst + i + 64), b);
        _mm512_stream_ps((float *)(dst + i + 128), c);
        _mm512_stream_ps((float *)(dst + i + 192), d);
    }
    _mm_sfence();
}
__attribute__((target("avx"))) static void copy_nt_avx(char *dst, const char *src, size_t n, size_t ahead)
{
    for (size_t i = 0; i < n; i += 128) {
        if (ahead) {
            __builtin_prefetch(src + i + ahead, 0, 2);
            __builtin_prefetch(src + i + 64 + ahead, 0, 2);
        }
        __m256 a = _mm256_load_ps((const float *)(src + i)), b = _mm256_load_ps((const float *)(src + i + 32));
        __m256 c = _mm256_load_ps((const float *)(src + i + 64)), d = _mm256_load_ps((const float *)(src + i + 96));
        _mm256_stream_ps((float *)(dst + i), a);
        _mm256_stream_ps((float *)(dst + i + 32), b);
        _mm256_stream_ps((float *)(dst + i + 64), c);
        _mm256_stream_ps((float *)(dst + i + 96), d);
    }
    _mm_sfence();
}
static void copy_nt_sse2(char *dst, const char *src, size_t n, size_t ahead)
{
    for (size_t i = 0; i < n; i += 64) {
        if (ahead)
            __builtin_prefetch(src + i + ahead, 0, 2);
        __m128 a = _mm_load_ps((const float *)(src + i)), b = _mm_load_ps((const float *)(src + i + 16));
        __m128 c = _mm_load_ps((const float *)(src + i + 32)), d = _mm_load_ps((const float *)(src + i + 48));
        _mm_stream_ps((float *)(dst + i), a);
        _mm_stream_ps((float *)(dst + i + 16), b);
        _mm_stream_ps((float *)(dst + i + 32), c);
        _mm_stream_ps((float *)(dst + i + 48), d);
    }
    _mm_sfence();
}
#endif

static float sum_best(const char *x, size_t n, int streams, size_t ahead)
{
#ifdef CEIL_X86
    if (__builtin_cpu_supports("avx512f"))
        return sum_avx512(x, n, streams, ahead);
    if (__builtin_cpu_supports("avx2"))
        return sum_avx2(x, n, streams, ahead);
#endif
    return sum_plain(x, n, streams, ahead);
}

/* How far ahead the prefetching kernels ask for each line: 1 KiB, the
 * distance at which both one stream and eight read fastest on the Zen 4
 * guest, of 512 B to 4 KiB (bench/results/ceilings-2026-12-04.md). */
enum { PREFETCH_AHEAD = 1024 };

enum { OP_MEMCPY, OP_COPY_NT, OP_READ };

/* The streaming kernels, by the name each point records. */
static const struct stream_kernel {
    const char *name;
    int op, streams; /* streams: the read's side-by-side parts */
    size_t ahead;    /* software prefetch distance in bytes, 0 for none */
} kernels[] = {
    {"memcpy", OP_MEMCPY, 1, 0},
    {"copy-nt", OP_COPY_NT, 1, 0},
    {"copy-nt-prefetch", OP_COPY_NT, 1, PREFETCH_AHEAD},
    {"read", OP_READ, 1, 0},
    {"read-8streams", OP_READ, 8, 0},
    {"read-prefetch", OP_READ, 1, PREFETCH_AHEAD},
    {"read-8streams-prefetch", OP_READ, 8, PREFETCH_AHEAD},
};
enum { K_COUNT = sizeof kernels / sizeof kernels[0] };

typedef struct stream_job {
    int kernel, threads; /* kernel: an index into kernels[] */
    char *buf;    /* 2 * half bytes: a copy goes from the first half to the second */
    size_t half;  /* a multiple of 4096 * threads */
} stream_job;

static void stream_chunk(void *ctx, int64_t i0, int64_t i1)
{
    const stream_job *j = ctx;
    const struct stream_kernel *k = &kernels[j->kernel];
    for (int64_t i = i0; i < i1; i++) {
        size_t total = k->op == OP_READ ? 2 * j->half : j->half, part = total / (size_t)j->threads;
        size_t off = part * (size_t)i;
        switch (k->op) {
        case OP_MEMCPY: memcpy(j->buf + j->half + off, j->buf + off, part); break;
        case OP_COPY_NT:
#ifdef CEIL_X86
            if (__builtin_cpu_supports("avx512f"))
                copy_nt_avx512(j->buf + j->half + off, j->buf + off, part, k->ahead);
            else if (__builtin_cpu_supports("avx"))
                copy_nt_avx(j->buf + j->half + off, j->buf + off, part, k->ahead);
            else
                copy_nt_sse2(j->buf + j->half + off, j->buf + off, part, k->ahead);
#endif
            break;
        default: {
            volatile float keep = sum_best(j->buf + off, part, k->streams, k->ahead);
            (void)keep; /* the sum must be computed, so every load happens */
        }
        }
    }
}

static int by_time(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of runs spanning span_us (at least five after one that faults
 * pages in and warms up), in bytes per second / 1e9, and the fastest run
 * in *best. The median is the ceiling because kernel times are quoted as
 * medians: on a shared host the fastest of many runs catches a quiet
 * moment that a kernel's median never sees (one guest's read ran 41.5 GB/s
 * at best and 31.5 at the median), and a ceiling taken that way holds
 * kernels to a rate no steady stream reaches. The fastest run is what no
 * kernel's median can beat, for the out-of-cache check. */
static double time_stream(cpu_pool *pool, stream_job *j, double span_us, double *best)
{
    enum { MAX_RUNS = 200 };
    double times[MAX_RUNS], start = now_us();
    int n = 0;
    for (int r = 0; r < MAX_RUNS + 1 && (r < 6 || now_us() - start < span_us); r++) {
        double t0 = now_us();
        cpu_pool_run(pool, stream_chunk, j, j->threads, j->threads);
        double t = now_us() - t0;
        if (r > 0)
            times[n++] = t;
    }
    qsort(times, (size_t)n, sizeof times[0], by_time);
    const double median = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    *best = 2.0 * (double)j->half / (times[0] * 1e3);
    return 2.0 * (double)j->half / (median * 1e3);
}

/* ---- one pass, timed next to a kernel --------------------------------- */

int cpu_stream_pass(attnres_device *dev, cpu_pool *pool, char *buf, const ar_stream_pass *pass, double *us)
{
    stream_job jobs[AR_STREAM_STEPS];
    int n = 0;
    const int all = cpu_pool_workers(pool) + 1;
    for (int s = 0; s < AR_STREAM_STEPS; s++) {
        const ar_stream_step *st = &pass->step[s];
        if (!st->kernel)
            continue;
        int kernel = 0;
        while (kernel < K_COUNT && strcmp(kernels[kernel].name, st->kernel) != 0)
            kernel++;
        if (kernel == K_COUNT)
            return ar_device_fail(dev, ATTNRES_EINVAL, "stream pass step %d: no streaming kernel '%s'", s,
                                  st->kernel);
#ifndef CEIL_X86
        if (kernels[kernel].op == OP_COPY_NT)
            return ar_device_fail(dev, ATTNRES_EINVAL, "stream pass step %d: %s needs x86-64", s, st->kernel);
#endif
        if (st->threads < 1 || st->threads > all)
            return ar_device_fail(dev, ATTNRES_EINVAL, "stream pass step %d: %d threads, this device has 1 to %d",
                                  s, st->threads, all);
        if (st->bytes == 0 || st->bytes % ((size_t)4096 * (size_t)st->threads) || st->offset % 64)
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "stream pass step %d: %zu bytes at offset %zu; bytes must be a positive "
                                  "multiple of 4096 x %d threads and the offset of 64",
                                  s, st->bytes, st->offset, st->threads);
        /* The streaming kernels load whole aligned vectors. */
        if ((uintptr_t)(buf + st->offset) % 64)
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "stream pass step %d: the buffer at offset %zu is not 64-byte aligned", s,
                                  st->offset);
        /* A read job reads 2 * half bytes, a copy job copies half of them. */
        const int read = kernels[kernel].op == OP_READ;
        jobs[n++] = (stream_job){.kernel = kernel, .threads = st->threads, .buf = buf + st->offset,
                                 .half = read ? st->bytes / 2 : st->bytes};
    }
    const double t0 = now_us();
    for (int i = 0; i < n; i++)
        cpu_pool_run(pool, stream_chunk, &jobs[i], jobs[i].threads, jobs[i].threads);
    *us = now_us() - t0;
    return ATTNRES_OK;
}

/* ---- the FMA peak --------------------------------------------------- */

enum { FMA_ITERS = 1 << 22 };

/* Twelve independent chains, named so that each stays in a register:
 * enough to cover the latency of two FMA units. */
#define FMA_CHAINS(T, SET, FMA, ADD)                                                                          \
    T a0 = SET(0.f), a1 = SET(1.f), a2 = SET(2.f), a3 = SET(3.f), a4 = SET(4.f), a5 = SET(5.f);              \
    T a6 = SET(6.f), a7 = SET(7.f), a8 = SET(8.f), a9 = SET(9.f), a10 = SET(10.f), a11 = SET(11.f);          \
    const T m = SET(0.999999f), c = SET(1e-7f);                                                               \
    for (int i = 0; i < FMA_ITERS; i++) {                                                                     \
        a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c);                       \
        a4 = FMA(a4, m, c), a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c);                       \
        a8 = FMA(a8, m, c), a9 = FMA(a9, m, c), a10 = FMA(a10, m, c), a11 = FMA(a11, m, c);                   \
    }                                                                                                         \
    a0 = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(a6, a7)));                                   \
    a0 = ADD(a0, ADD(ADD(a8, a9), ADD(a10, a11)))

#ifdef CEIL_X86
__attribute__((target("avx512f"))) static double fma_avx512(void)
{
    FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps);
    volatile float keep = _mm512_reduce_add_ps(a0);
    (void)keep;
    return 12.0 * 16 * 2 * FMA_ITERS;
}
__attribute__((target("avx2,fma"))) static double fma_avx2(void)
{
    FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps);
    float out[8];
    _mm256_storeu_ps(out, a0);
    volatile float keep = out[0];
    (void)keep;
    return 12.0 * 8 * 2 * FMA_ITERS;
}
#endif

static inline float set_scalar(float x) { return x; }
static inline float add_scalar(float x, float y) { return x + y; }

static double fma_plain(void)
{
    FMA_CHAINS(float, set_scalar, fmaf, add_scalar);
    volatile float keep = a0;
    (void)keep;
    return 12.0 * 2 * FMA_ITERS;
}

typedef struct fma_job {
    double flop[256];
} fma_job;

static void fma_chunk(void *ctx, int64_t i0, int64_t i1)
{
    fma_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) {
        double f;
#ifdef CEIL_X86
        if (__builtin_cpu_supports("avx512f"))
            f = fma_avx512();
        else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            f = fma_avx2();
        else
#endif
            f = fma_plain();
        j->flop[i % 256] = f;
    }
}

static double time_fma(cpu_pool *pool, int threads)
{
    fma_job j;
    double best = 0.0;
    for (int r = 0; r < 6; r++) {
        double t0 = now_us();
        cpu_pool_run(pool, fma_chunk, &j, threads, threads);
        double t = now_us() - t0, flop = 0.0;
        for (int i = 0; i < threads && i < 256; i++)
            flop += j.flop[i];
        if (r > 0 && flop / (t * 1e3) > best)
            best = flop / (t * 1e3);
    }
    return best;
}

/* ---- the largest cache ---------------------------------------------- */

/* The directory that describes cpu0's caches; tests stand a fake one in
 * with ATTNRES_CPU_CACHE_SYSFS (attnres.h). */
static const char *cache_sysfs_dir(void)
{
    const char *dir = getenv("ATTNRES_CPU_CACHE_SYSFS");
    return dir && *dir ? dir : "/sys/devices/system/cpu/cpu0/cache";
}

/* The size of the highest-level cache that cpu0 sees, from sysfs ("32768K"),
 * else glibc's figure (which on some AMD guests is the whole socket's L3,
 * ten times what lscpu and sysfs report), else 0. A hint only: one guest's
 * sysfs said 480 MiB, and then no problem counted as out of cache. */
static double cache_hint(void)
{
    int best_level = 0;
    double best = 0.0;
    const char *dir = cache_sysfs_dir();
    for (int i = 0; i < 16; i++) {
        char path[4200], text[64];
        int level = 0;
        snprintf(path, sizeof path, "%s/index%d/level", dir, i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fscanf(f, "%d", &level) != 1)
            level = 0;
        fclose(f);
        snprintf(path, sizeof path, "%s/index%d/size", dir, i);
        if (!(f = fopen(path, "r")))
            continue;
        double size = 0.0;
        if (fgets(text, sizeof text, f)) {
            char *end;
            size = strtod(text, &end);
            size *= *end == 'K' ? 1024.0 : *end == 'M' ? 1048576.0 : *end == 'G' ? 1073741824.0 : 1.0;
        }
        fclose(f);
        if (level > best_level && size > 0) {
            best_level = level;
            best = size;
        }
    }
    if (best > 0)
        return best;
    long cache = -1;
#ifdef _SC_LEVEL3_CACHE_SIZE
    cache = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (cache <= 0)
        cache = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return cache > 0 ? (double)cache : 0.0;
}

double cpu_cache_knee(const double *bytes, const double *gbps, int n)
{
    if (n < 2 || !(gbps[n - 1] > 0))
        return 0.0;
    for (int i = n - 2; i >= 0; i--)
        if (gbps[i] >= CPU_CACHE_KNEE_RATIO * gbps[n - 1])
            return bytes[i];
    return 0.0;
}

/* ---- all of them ----------------------------------------------------- */

/* 1, 2, 4, ... below all, and all: the thread counts each kernel runs on. */
static int thread_counts(int all, int *out, int max)
{
    int n = 0;
    for (int t = 1; t < all && n < max - 1; t *= 2)
        out[n++] = t;
    out[n++] = all;
    return n;
}

enum { CEIL_ROUNDS = 2 };

/* The read kernel on all threads over 2 MiB, 4 MiB, ... up to the whole
 * buffer (whose rate is memory's), each size's fastest run of two rounds:
 * the largest cache's effective size is where the rate falls to memory's
 * (cpu_cache_knee). The fastest runs, not the medians, since other work on
 * the machine only slows a run: with the medians, a sweep beside another
 * test's threads once found no knee at all. About 0.3 s. */
static double measured_cache(cpu_pool *pool, char *buf, size_t bytes, int threads, double memory_gbps)
{
    enum { SWEEP_MAX = 24 };
    double size[SWEEP_MAX], gbps[SWEEP_MAX];
    int n = 0, read = 0;
    while (strcmp(kernels[read].name, "read") != 0)
        read++;
    for (size_t s = (size_t)2 << 20; n < SWEEP_MAX; s *= 2) {
        if (s > bytes)
            s = bytes;
        size[n] = (double)s;
        gbps[n++] = 0.0;
        if (s == bytes)
            break;
    }
    for (int round = 0; round < CEIL_ROUNDS; round++)
        for (int i = 0; i < n; i++) {
            /* A read job reads 2 * half bytes in parts of whole pages. */
            size_t unit = (size_t)8192 * (size_t)threads;
            stream_job j = {.kernel = read, .threads = threads, .buf = buf,
                            .half = (size_t)size[i] / unit * unit / 2};
            double best = 0.0;
            if (j.half)
                time_stream(pool, &j, 20e3, &best);
            if (best > gbps[i])
                gbps[i] = best;
        }
    /* The ceilings' own runs of the same kernel over the same buffer are
     * more of them: a busy machine slows the sweep's few long runs most. */
    if (memory_gbps > gbps[n - 1])
        gbps[n - 1] = memory_gbps;
    return cpu_cache_knee(size, gbps, n);
}

int cpu_ceilings_measure(attnres_device *dev, cpu_pool *pool, ar_ceilings *out)
{
    memset(out, 0, sizeof *out);
    out->fma_gflops = NAN;
    int all = cpu_pool_workers(pool) + 1, counts[16];
    int nc = thread_counts(all, counts, 16);
    /* 256 MiB each way (512 MiB read), far beyond any cache, in parts of
     * whole pages per thread. */
    const size_t half = ((size_t)256 << 20) / ((size_t)4096 * (size_t)all) * (size_t)4096 * (size_t)all;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, 2 * half))
        return ar_device_fail(dev, ATTNRES_ENOMEM, "cannot allocate the %zu MiB ceiling buffer", (2 * half) >> 20);
    memset(buf, 1, 2 * half);
    for (int k = 0; k < K_COUNT; k++) {
#ifndef CEIL_X86
        if (kernels[k].op == OP_COPY_NT)
            continue;
#endif
        for (int c = 0; c < nc && out->n < AR_CEILING_POINTS; c++) {
            ar_ceiling_point *p = &out->pt[out->n++];
            p->kernel = kernels[k].name;
            p->kind = kernels[k].op == OP_READ ? AR_CEILING_READ : AR_CEILING_COPY;
            p->threads = counts[c];
            p->gbps = p->best_gbps = 0.0;
        }
    }
    /* Rounds over every kernel in turn, each keeping its best median: a
     * stall of a shared host then spoils one round of a figure, not the
     * figure. */
    for (int round = 0; round < CEIL_ROUNDS; round++)
        for (int i = 0; i < out->n; i++) {
            ar_ceiling_point *p = &out->pt[i];
            int kernel = 0;
            while (strcmp(kernels[kernel].name, p->kernel) != 0)
                kernel++;
            stream_job j = {.kernel = kernel, .threads = p->threads, .buf = buf, .half = half};
            double best = 0.0, g = time_stream(pool, &j, 0.2e6, &best);
            if (g > p->gbps)
                p->gbps = g;
            if (best > p->best_gbps)
                p->best_gbps = best;
        }
    out->cache_hint_bytes = cache_hint();
    double read_all = 0.0; /* the read kernel's fastest run on all threads, above */
    for (int i = 0; i < out->n; i++)
        if (strcmp(out->pt[i].kernel, "read") == 0 && out->pt[i].threads == all)
            read_all = out->pt[i].best_gbps;
    out->cache_measured = measured_cache(pool, buf, 2 * half, all, read_all);
    out->cache_bytes = out->cache_measured > 0 ? out->cache_measured : out->cache_hint_bytes;
    free(buf);
    for (int c = 0; c < nc; c++) {
        double g = time_fma(pool, counts[c]);
        if (isnan(out->fma_gflops) || g > out->fma_gflops) {
            out->fma_gflops = g;
            out->fma_threads = counts[c];
        }
    }
    return ATTNRES_OK;
}
