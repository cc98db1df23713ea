/*
 * mix_kernel.c - times one generated CPU mix kernel, outside the runtime,
 * on K3-shaped inputs; or, built without KERNEL, a kernel that only reads
 * the same rows in the same order (the ceiling of a read-bound mix).
 * Elements are bf16 unless built with -DELEM_F32 or -DELEM_F16 (the
 * kernel's storage type; bench/mix_ab.sh picks it from the variant's name).
 * bench/mix_kernels.sh builds and runs it for the figures in
 * docs/cpu_kernels.md.
 *
 *   attnres gen mix_c_bf16_fused_v16_g8_pn_dfma_sc_t2 > /tmp/k.c
 *   cc -O3 -march=native -pthread -DKERNEL_SOURCE='"/tmp/k.c"' \
 *      -DKERNEL=attnres_mix_c_bf16_fused_v16_g8_pn_dfma_sc bench/mix_kernel.c -o /tmp/k -lm
 *   /tmp/k D T N THREADS REPEATS [HEADS]
 *
 * Built without KERNEL it needs -I BUILD/runtime/include, for the argument
 * struct in the generated kernel_abi.h.
 *
 * The kernel is named after the variant id without its thread count
 * (_tN), which is a launch parameter: THREADS sets it here.
 *
 * Splits the T tokens evenly over THREADS threads, each calling the kernel
 * REPEATS times on its tokens (repeat small T to time data held in cache);
 * prints the median of 9 timed launches after one warm-up, in GB/s of
 * (N + 1) * T * D elements, the traffic the tuner counts. PARTIAL=1 in
 * the environment (kernel builds only) runs the additive form, reading a
 * partial sum row per token as well (counted in the GB/s); the read-only
 * loop then reads it as one more source.
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

/* The storage element: its size, and a value in [1, 2) that differs by k. */
#if defined(ELEM_F32)
#define ELEM_BYTES 4
static uint32_t elem_value(int64_t k, int i)
{
    return 0x3f800000u + (uint32_t)((k * 7 + i) % 64) * 0x10000u;
}
#elif defined(ELEM_F16)
#define ELEM_BYTES 2
static uint32_t elem_value(int64_t k, int i) { return 0x3c00u + (uint32_t)((k * 7 + i) % 64) * 8u; }
#else
#define ELEM_BYTES 2
static uint32_t elem_value(int64_t k, int i) { return 0x3f80u + (uint32_t)((k * 7 + i) % 64); }
#endif

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

/* The argument struct as the runtime fills it (templates/lib/kernel_abi.lua,
 * generated into the build's runtime/include/kernel_abi.h). */
#include "kernel_abi.h"

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
            for (int64_t k = 0; k < a->d; k += 64 / ELEM_BYTES)
                for (int i = i0; i < a->n && i < i0 + READ_GROUP; i++)
                    for (int b = 0; b < 64; b += VEC_BYTES)
                        s += *(const vec_t *)(const void *)((const char *)a->src[i] + b +
                                                            ELEM_BYTES * (t * a->src_stride[i] + k));
    *(vec_t *)(void *)((char *)a->out + ELEM_BYTES * t0 * a->out_stride) = s;
}
#define KERNEL read_only
#endif

/* A page-aligned block of `count` elements starting `shift` bytes past its
 * page, filled with source i's values (i < 0: zeros); freed at exit. */
static void *rows_alloc(int64_t count, size_t shift, int i)
{
    const size_t bytes = (size_t)count * ELEM_BYTES;
    char *block = aligned_alloc(4096, (bytes + shift + 4095) / 4096 * 4096);
    if (!block)
        return NULL;
    char *rows = block + shift;
    memset(rows, 0, bytes);
    for (int64_t k = 0; i >= 0 && k < count; k++) {
        const uint32_t v = elem_value(k, i);
        memcpy(rows + (size_t)k * ELEM_BYTES, &v, ELEM_BYTES); /* little-endian */
    }
    return rows;
}

static int env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "1") == 0;
}

/* The kernel as the launcher calls it. */
static void run_range(const void *args, int64_t t0, int64_t t1) { KERNEL(args, t0, t1); }

int main(int argc, char **argv)
{
    kernel_shape shape;
    if (kernel_shape_parse(argc, argv, 1, &shape))
        return 2;
    const int64_t d = shape.d, T = shape.T;
    const int n = shape.n, threads = shape.threads, repeats = shape.repeats, heads = shape.heads;
    const char *offset_env = getenv("SOURCE_OFFSET");
    const long offset = offset_env ? atol(offset_env) : 0;
    if (offset < 0 || offset % 64 || offset > 4096) {
        fprintf(stderr, "%s: SOURCE_OFFSET must be a multiple of 64 from 0 to 4096\n", argv[0]);
        return 2;
    }
    const void *src[64];
    int64_t stride[64];
    for (int i = 0; i < n; i++) {
        /* Source i starts (i + 1) * offset bytes past its page. */
        src[i] = rows_alloc(T * d, (size_t)offset * (size_t)(i + 1), i);
        stride[i] = d;
    }
    float *query = aligned_alloc(64, (size_t)d * 4);
    void *out = rows_alloc(T * d, 0, -1);
    if (!query || !out)
        return 1;
    for (int64_t k = 0; k < d; k++)
        query[k] = 0.01f * (float)(k % 13);
    const int norm = env_flag("NORM"), partial = env_flag("PARTIAL");
#if !KERNEL_BUILD
    if (norm) {
        fprintf(stderr, "%s: NORM=1 needs a kernel build\n", argv[0]);
        return 2;
    }
    if (partial && n == 64) {
        fprintf(stderr, "%s: PARTIAL=1 reads one row more than N: N must be below 64\n", argv[0]);
        return 2;
    }
#endif
    void *normed = norm ? rows_alloc(T * d, 0, -1) : NULL;
    const void *partial_rows = partial ? rows_alloc(T * d, 0, 64) : NULL;
    float *gain = aligned_alloc(64, (size_t)d * 4);
    if ((norm && !normed) || (partial && !partial_rows) || !gain)
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
    if (partial) {
        args.partial = partial_rows;
        args.partial_stride = d;
        args.alpha = 1.0f;
    }
#else
    if (partial) { /* the partial row is read as one more source */
        src[n] = partial_rows;
        stride[n] = d;
        args.n = n + 1;
    }
#endif
    const double seconds = launch_median(run_range, &args, T, threads, repeats);
    const double bytes = (double)(n + 1 + norm + partial) * (double)(T * d) * ELEM_BYTES * repeats;
    printf("%-40s d=%lld T=%lld N=%d H=%d threads=%d: %8.2f ms  %5.1f GB/s\n", argv[0],
           (long long)d, (long long)T, n, heads, threads, seconds * 1e3 / repeats, bytes / seconds / 1e9);
    return 0;
}
