/*
 * mix_kernel.c - times one generated bf16 CPU mix kernel, outside the
 * runtime, on K3-shaped inputs; or, built without KERNEL, a kernel that only
 * reads the same rows in the same order (the ceiling of a read-bound mix).
 * bench/mix_kernels.sh builds and runs it for the figures in
 * docs/cpu_kernels.md.
 *
 *   attnres gen mix_c_bf16_fused_v16_g8_a2048_t2 > /tmp/k.c
 *   cc -O3 -march=native -pthread -DKERNEL_SOURCE='"/tmp/k.c"' \
 *      -DKERNEL=attnres_mix_c_bf16_fused_v16_g8_a2048_t2 bench/mix_kernel.c -o /tmp/k -lm
 *   /tmp/k D T N THREADS REPEATS [HEADS]
 *
 * Splits the T tokens evenly over THREADS threads, each calling the kernel
 * REPEATS times on its tokens (repeat small T to time data held in cache);
 * prints the median of 9 timed launches after one warm-up, in GB/s of
 * (N + 1) * T * D bf16 elements, the traffic the tuner counts.
 *
 * Every source starts on a page boundary, as the rows of one bank (the
 * tuner's layout) start at one page offset when a source's size is a
 * multiple of 4 KiB. SOURCE_OFFSET=B in the environment starts source i
 * (i + 1) * B bytes past its page instead (B a multiple of 64), so that
 * their rows fall into different L1 sets. NORM=1 (kernel builds only) runs
 * the output-norm epilogue as well, writing a second output row per token
 * (counted in the GB/s).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_launch.h"

#ifdef KERNEL
#define KERNEL_BUILD 1 /* KERNEL names the read-only loop otherwise */
#include KERNEL_SOURCE
#else
#define KERNEL_BUILD 0

/* The widest vector the target loads: a 64-byte line is one AVX-512 load or
 * two AVX2 ones (a 64-byte GNU C vector without AVX-512 lives on the stack). */
#if defined(__AVX512F__)
#define VEC_BYTES 64
#else
#define VEC_BYTES 32
#endif
typedef int32_t vec_t __attribute__((vector_size(VEC_BYTES), may_alias, aligned(1)));

struct attnres_cpu_mix_args { /* the fields the read-only kernel uses */
    int64_t d;
    int32_t n, heads;
    const void *const *src;
    const int64_t *src_stride;
    const float *query;
    float scale, eps;
    void *out;
    int64_t out_stride;
};

/* Reads every source row of tokens [t0, t1), a vector of every row in turn
 * as the fused kernels do, and adds the words up so nothing is skipped.
 * Built with -DREAD_GROUP=G, it reads the rows G at a time instead (each
 * group over the whole row before the next), as a sweep of G statistics
 * rows does: the access pattern's own ceiling for many sources. */
#ifndef READ_GROUP
#define READ_GROUP 64 /* all sources in turn */
#endif
static void read_only(const struct attnres_cpu_mix_args *a, int64_t t0, int64_t t1)
{
    vec_t s = {0};
    for (int64_t t = t0; t < t1; t++)
        for (int i0 = 0; i0 < a->n; i0 += READ_GROUP)
            for (int64_t k = 0; k < a->d; k += 32)
                for (int i = i0; i < a->n && i < i0 + READ_GROUP; i++)
                    for (int b = 0; b < 64; b += VEC_BYTES)
                        s += *(const vec_t *)(const void *)((const char *)a->src[i] + b +
                                                            2 * (t * a->src_stride[i] + k));
    *(vec_t *)(void *)((uint16_t *)a->out + t0 * a->out_stride) = s;
}
#define KERNEL read_only
#endif

/* The kernel as the launcher calls it. */
static void run_range(const void *args, int64_t t0, int64_t t1) { KERNEL(args, t0, t1); }

int main(int argc, char **argv)
{
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: %s D T N THREADS REPEATS [HEADS]\n", argv[0]);
        return 2;
    }
    const int64_t d = atoll(argv[1]), T = atoll(argv[2]);
    const int n = atoi(argv[3]), threads = atoi(argv[4]), repeats = atoi(argv[5]);
    const int heads = argc == 7 ? atoi(argv[6]) : 1;
    if (d <= 0 || d % 64 || T <= 0 || n < 1 || n > 64 || threads < 1 || threads > 64 || repeats < 1 ||
        heads < 1 || d % (64 * (int64_t)heads)) {
        fprintf(stderr, "%s: D must be a positive multiple of 64 * HEADS, N 1..64, THREADS 1..64\n", argv[0]);
        return 2;
    }
    const char *offset_env = getenv("SOURCE_OFFSET");
    const long offset = offset_env ? atol(offset_env) : 0;
    if (offset < 0 || offset % 64 || offset > 4096) {
        fprintf(stderr, "%s: SOURCE_OFFSET must be a multiple of 64 from 0 to 4096\n", argv[0]);
        return 2;
    }
    const void *src[64];
    int64_t stride[64];
    for (int i = 0; i < n; i++) {
        /* Freed at exit; only the shifted pointer is kept. */
        const size_t shift = (size_t)offset * (size_t)(i + 1);
        char *block = aligned_alloc(4096, ((size_t)(T * d) * 2 + shift + 4095) / 4096 * 4096);
        if (!block)
            return 1;
        uint16_t *s = (uint16_t *)(block + shift);
        for (int64_t k = 0; k < T * d; k++) /* bf16 values in [1, 2), differing per source */
            s[k] = (uint16_t)(0x3f80 + (k * 7 + i) % 64);
        src[i] = s;
        stride[i] = d;
    }
    float *query = aligned_alloc(64, (size_t)d * 4);
    uint16_t *out = aligned_alloc(4096, ((size_t)(T * d) * 2 + 4095) / 4096 * 4096);
    if (!query || !out)
        return 1;
    for (int64_t k = 0; k < d; k++)
        query[k] = 0.01f * (float)(k % 13);
    memset(out, 0, (size_t)(T * d) * 2);
    const char *norm_env = getenv("NORM");
    const int norm = norm_env && strcmp(norm_env, "1") == 0;
#if !KERNEL_BUILD
    if (norm) {
        fprintf(stderr, "%s: NORM=1 needs a kernel build\n", argv[0]);
        return 2;
    }
#endif
    uint16_t *normed = norm ? aligned_alloc(4096, ((size_t)(T * d) * 2 + 4095) / 4096 * 4096) : NULL;
    float *gain = aligned_alloc(64, (size_t)d * 4);
    if ((norm && !normed) || !gain)
        return 1;
    for (int64_t k = 0; k < d; k++)
        gain[k] = 1.0f + 0.001f * (float)(k % 7);
    struct attnres_cpu_mix_args args = {
        .d = d, .n = n, .heads = heads, .src = src, .src_stride = stride, .query = query,
        .scale = 1.0f, .eps = 1e-6f, .out = out, .out_stride = d};
#if KERNEL_BUILD
    if (norm) {
        args.out_gain = gain;
        args.out_eps = 1e-6f;
        args.normed = normed;
        args.normed_stride = d;
    }
#endif
    const double seconds = launch_median(run_range, &args, T, threads, repeats);
    const double bytes = (double)(n + 1 + norm) * (double)(T * d) * 2.0 * repeats;
    printf("%-40s d=%lld T=%lld N=%d H=%d threads=%d: %8.2f ms  %5.1f GB/s\n", argv[0],
           (long long)d, (long long)T, n, heads, threads, seconds * 1e3 / repeats, bytes / seconds / 1e9);
    return 0;
}
