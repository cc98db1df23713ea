/*
 * run_overhead.c - what the hot path costs on top of the kernel, at T = 1
 * on the CPU.
 *
 * Times, interleaved round by round so that all see the same machine:
 *   empty        a call of an empty function through a pointer (the floor)
 *   mix direct   the built-in generic mix kernel called directly
 *   mix run      attnres_run_mix on a plan of that same kernel
 *   mix tuned    attnres_run_mix on a plan from --db (its tuned kernel)
 *   p2 direct    the built-in generic phase-2 kernel called directly
 *   p2 run       attnres_run_phase2 on a plan of that same kernel
 * and reports the median ns per call over the rounds. The overhead of the
 * runtime is "run" minus "direct": argument checks, bucket choice and the
 * backend's dispatch.
 *
 * It also counts the allocations of the whole process during the timed
 * calls (malloc, calloc and realloc are wrapped at link time) and fails if
 * there is any: the hot path must not allocate.
 *
 * Usage: run_overhead [--db FILE] [--d D] [--n N] [--rounds R] [--calls K]
 * Links libattnres.a: the direct calls need the library's internal kernels.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnres.h"
#include "cpu_kernel_abi.h"
#include "cpu_phase_abi.h"

/* The built-in kernels, as runtime/src/cpu_backend.c declares them. */
extern void (*const ar_generic_mix_f32)(const struct attnres_cpu_mix_args *, int64_t, int64_t);
extern void (*const ar_generic_phase2_f32)(const struct attnres_cpu_phase2_args *, int64_t, int64_t);

/* Every allocation of the process is counted (the link wraps malloc,
 * calloc and realloc): the hot path must make none. */
void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
static unsigned long allocations;
void *__wrap_malloc(size_t n)
{
    allocations++;
    return __real_malloc(n);
}
void *__wrap_calloc(size_t n, size_t size)
{
    allocations++;
    return __real_calloc(n, size);
}
void *__wrap_realloc(void *p, size_t n)
{
    allocations++;
    return __real_realloc(p, n);
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

__attribute__((noinline)) static void empty_kernel(const void *args, int64_t t0, int64_t t1)
{
    (void)args;
    (void)t0;
    (void)t1;
    __asm__ volatile("" ::: "memory");
}

enum { V_EMPTY, V_MIX_DIRECT, V_MIX_RUN, V_MIX_TUNED, V_P2_DIRECT, V_P2_RUN, V_COUNT };
static const char *const names[V_COUNT] = {"empty function", "mix direct", "mix run", "mix run (tuned)",
                                           "phase2 direct", "phase2 run"};

typedef struct bench {
    attnres_plan *mix, *tuned, *p2;
    attnres_mix_args ma;
    attnres_phase2_args pa;
    struct attnres_cpu_mix_args mk;
    struct attnres_cpu_phase2_args pk;
    void (*volatile empty)(const void *, int64_t, int64_t);
} bench;

/* K calls of variant v; returns nanoseconds per call, or -1 on an error. */
static double time_calls(bench *b, int v, int calls)
{
    int bad = 0;
    double t0 = now_ns();
    for (int i = 0; i < calls; i++) {
        switch (v) {
        case V_EMPTY: b->empty(&b->mk, 0, 1); break;
        case V_MIX_DIRECT: ar_generic_mix_f32(&b->mk, 0, 1); break;
        case V_MIX_RUN: bad |= attnres_run_mix(b->mix, 1, &b->ma, NULL); break;
        case V_MIX_TUNED: bad |= attnres_run_mix(b->tuned, 1, &b->ma, NULL); break;
        case V_P2_DIRECT: ar_generic_phase2_f32(&b->pk, 0, 1); break;
        case V_P2_RUN: bad |= attnres_run_phase2(b->p2, 1, &b->pa, NULL); break;
        }
    }
    double t = (now_ns() - t0) / calls;
    return bad ? -1 : t;
}

int main(int argc, char **argv)
{
    const char *dbpath = NULL;
    int64_t d = 256;
    int n = 9, rounds = 201, calls = 2000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--db"))
            dbpath = argv[i + 1];
        else if (!strcmp(argv[i], "--d"))
            d = strtoll(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--n"))
            n = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--rounds"))
            rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--calls"))
            calls = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: run_overhead [--db FILE] [--d D] [--n N] [--rounds R] [--calls K]\n");
            return 2;
        }
    }
    if ((argc - 1) % 2 || d < 1 || n < 1 || n > 64 || rounds < 1 || calls < 1) {
        fprintf(stderr, "usage: run_overhead [--db FILE] [--d D] [--n N] [--rounds R] [--calls K]\n");
        return 2;
    }
    char msg[512];
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    bench b;
    memset(&b, 0, sizeof b);
    b.empty = (void (*)(const void *, int64_t, int64_t))empty_kernel;
    int code = 1;
    if (attnres_device_open("cpu", &dev, msg, sizeof msg)) {
        fprintf(stderr, "run_overhead: %s\n", msg);
        return 1;
    }
    if (dbpath && attnres_db_open(dbpath, &db, msg, sizeof msg)) {
        fprintf(stderr, "run_overhead: %s\n", msg);
        goto done;
    }
    /* Inputs: N sources of one token, fp32. */
    float *buf = NULL;
    if (posix_memalign((void **)&buf, 64, sizeof(float) * (size_t)d * (size_t)(n + 8)))
        goto done;
    for (int64_t i = 0; i < d * (n + 8); i++)
        buf[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    const void *src[64];
    int64_t strides[64];
    for (int i = 0; i < n; i++) {
        src[i] = buf + (int64_t)i * d;
        strides[i] = d;
    }
    float *query = buf + (int64_t)n * d, *out = buf + (int64_t)(n + 1) * d;
    float *o1 = buf + (int64_t)(n + 2) * d, *partial = buf + (int64_t)(n + 3) * d, *lse = buf + (int64_t)(n + 4) * d;
    lse[0] = 1.0f;

    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, d, n);
    if (attnres_plan_create(dev, NULL, &p, 0, &b.mix, msg, sizeof msg) ||
        (db && attnres_plan_create(dev, db, &p, 0, &b.tuned, msg, sizeof msg))) {
        fprintf(stderr, "run_overhead: %s\n", msg);
        goto done_buf;
    }
    attnres_problem p2;
    attnres_problem_init(&p2, ATTNRES_DTYPE_F32, d, 1);
    p2.op = ATTNRES_OP_PHASE2;
    if (attnres_plan_create(dev, NULL, &p2, 0, &b.p2, msg, sizeof msg)) {
        fprintf(stderr, "run_overhead: %s\n", msg);
        goto done_buf;
    }
    attnres_mix_args_init(&b.ma);
    b.ma.sources = src;
    b.ma.query = query;
    b.ma.eps = 1e-5f;
    b.ma.out = out;
    b.mk = (struct attnres_cpu_mix_args){.d = d, .n = n, .heads = 1, .src = src, .src_stride = strides,
                                         .query = query, .scale = 1, .eps = 1e-5f, .partial_stride = d,
                                         .alpha = 1, .out = out, .out_stride = d, .out_eps = 1e-6f,
                                         .normed_stride = d};
    attnres_phase2_args_init(&b.pa);
    b.pa.o1 = o1;
    b.pa.lse = lse;
    b.pa.partial = partial;
    b.pa.query = query;
    b.pa.eps = 1e-5f;
    b.pa.out = out;
    b.pk = (struct attnres_cpu_phase2_args){.d = d, .heads = 1, .o1 = o1, .o1_stride = d, .lse = lse,
                                            .lse_stride = 1, .partial = partial, .partial_stride = d,
                                            .sublayer_stride = d, .query = query, .scale = 1, .eps = 1e-5f,
                                            .out = out, .out_stride = d, .out_eps = 1e-6f, .normed_stride = d};

    double *samples = malloc(sizeof(double) * (size_t)rounds * V_COUNT);
    if (!samples)
        goto done_buf;
    for (int v = 0; v < V_COUNT; v++) /* warm-up */
        if (v != V_MIX_TUNED || b.tuned)
            time_calls(&b, v, calls);
    const unsigned long allocations_before = allocations;
    for (int r = 0; r < rounds; r++)
        for (int v = 0; v < V_COUNT; v++) {
            double t = v == V_MIX_TUNED && !b.tuned ? 0 : time_calls(&b, v, calls);
            if (t < 0) {
                fprintf(stderr, "run_overhead: %s failed: %s\n", names[v],
                        attnres_plan_errmsg(v == V_P2_RUN ? b.p2 : v == V_MIX_TUNED ? b.tuned : b.mix));
                free(samples);
                goto done_buf;
            }
            samples[v * rounds + r] = t;
        }
    const unsigned long hot_allocations = allocations - allocations_before;
    /* Paired per round (same machine state): run minus direct. */
    double *diff = malloc(sizeof(double) * (size_t)rounds * 2);
    if (!diff) {
        free(samples);
        goto done_buf;
    }
    for (int r = 0; r < rounds; r++) {
        diff[r] = samples[V_MIX_RUN * rounds + r] - samples[V_MIX_DIRECT * rounds + r];
        diff[rounds + r] = samples[V_P2_RUN * rounds + r] - samples[V_P2_DIRECT * rounds + r];
    }
    qsort(diff, (size_t)rounds, sizeof *diff, cmp_double);
    qsort(diff + rounds, (size_t)rounds, sizeof *diff, cmp_double);
    double med[V_COUNT], p10[V_COUNT], p90[V_COUNT];
    for (int v = 0; v < V_COUNT; v++) {
        double *s = samples + v * rounds;
        qsort(s, (size_t)rounds, sizeof *s, cmp_double);
        med[v] = s[rounds / 2];
        p10[v] = s[rounds / 10];
        p90[v] = s[rounds * 9 / 10];
    }
    char level[64] = "";
    if (b.tuned)
        snprintf(level, sizeof level, " (plan level %d)", (int)attnres_plan_level_get(b.tuned));
    printf("run overhead at T = 1 on the CPU: fp32, d = %lld, N = %d; median of %d rounds of %d calls\n",
           (long long)d, n, rounds, calls);
    printf("%-22s %12s %12s %12s\n", "call", "median ns", "p10 ns", "p90 ns");
    for (int v = 0; v < V_COUNT; v++) {
        if (v == V_MIX_TUNED && !b.tuned)
            continue;
        printf("%-22s %12.1f %12.1f %12.1f%s\n", names[v], med[v], p10[v], p90[v], v == V_MIX_TUNED ? level : "");
    }
    printf("runtime overhead (run - direct, paired per round): mix median %.1f ns [p10 %.1f, p90 %.1f], "
           "phase2 median %.1f ns [p10 %.1f, p90 %.1f]\n",
           diff[rounds / 2], diff[rounds / 10], diff[rounds * 9 / 10], diff[rounds + rounds / 2],
           diff[rounds + rounds / 10], diff[rounds + rounds * 9 / 10]);
    printf("allocations during the %ld timed calls: %lu\n", (long)rounds * calls * V_COUNT, hot_allocations);
    free(diff);
    free(samples);
    code = hot_allocations ? 1 : 0;
done_buf:
    free(buf);
done:
    attnres_plan_destroy(b.mix);
    attnres_plan_destroy(b.tuned);
    attnres_plan_destroy(b.p2);
    attnres_db_close(db);
    attnres_device_close(dev);
    return code;
}
