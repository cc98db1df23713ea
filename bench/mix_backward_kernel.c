/*
 * mix_backward_kernel.c - times one generated CPU mix backward kernel
 * (templates/cpu/mix_backward.lua), outside the runtime, on K3-shaped
 * inputs: the way to time a variant the tuner would not (one edited by
 * hand to see what a part of it costs, which then computes wrong
 * gradients and fails the tuner's verification).
 *
 *   attnres gen mix_backward_c_bf16_v8_u2_t2 > /tmp/k.c
 *   cc -O3 -march=native -pthread -DKERNEL_SOURCE='"/tmp/k.c"' \
 *      -DKERNEL=attnres_mix_backward_c_bf16_v8_u2 bench/mix_backward_kernel.c -o /tmp/k -lm
 *   /tmp/k D T N THREADS REPEATS [HEADS]
 *
 * Built without KERNEL (and with -I BUILD/runtime/include, for the
 * argument struct in the generated kernel_abi.h), it times a loop that
 * moves the same bytes instead: per token it reads dout and copies each
 * source row to its gradient row, the kernel's traffic at the cost of a
 * copy (the in-harness counterpart of the tuner's paired streaming pass).
 * bench/mix_ab.sh runs both, interleaved.
 *
 * Elements are bf16 unless built with -DELEM_F32 or -DELEM_F16 (the
 * kernel's storage type). The kernel is named after the variant id
 * without its thread count (_tN), a launch parameter: THREADS sets it here.
 *
 * Splits the T tokens evenly over THREADS threads as the runtime does, on
 * token-group boundaries (groups of 32 tokens: T must be a multiple of
 * 32 * THREADS), each calling the kernel REPEATS times on its tokens
 * (repeat a small T to time data held in cache). Writes the source
 * gradients in the storage type, replace form, not accumulated. Prints the
 * median of 9 timed launches after one warm-up, in GB/s of the tuner's
 * traffic model for the op: (N + 1) * T * D elements read (the sources and
 * dout) and N * T * D written (tuner/src/problems.c). The runtime's second
 * pass, which sums the groups' du rows, is not timed (d floats per group).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_launch.h"

#if defined(ELEM_F32)
#define ELEM_BYTES 4
#else
#define ELEM_BYTES 2
#endif

#ifdef KERNEL
/* The kernel, with its argument struct (lib/kernel_abi.lua's definition,
 * which every generated source carries). */
#include KERNEL_SOURCE
#else
#include "kernel_abi.h"
#include "row_lines.h"

/* Per token: reads dout (summed, so the reads stay) and copies every
 * source row to its gradient row, a vector at a time. */
static void move_rows(const struct attnres_cpu_mix_backward_args *a, int64_t t0, int64_t t1)
{
    const int64_t row = a->d * ELEM_BYTES;
    line_t sink = {0};
    for (int64_t t = t0; t < t1; t++) {
        const char *go = (const char *)a->dout + t * a->dout_stride * ELEM_BYTES;
        for (int64_t b = 0; b < row; b += sizeof(line_t))
            sink += LINE(go + b);
        for (int i = 0; i < a->n; i++) {
            const char *x = (const char *)a->src[i] + t * a->src_stride[i] * ELEM_BYTES;
            char *y = (char *)a->dsrc[i] + t * a->dsrc_stride[i] * ELEM_BYTES;
            for (int64_t b = 0; b < row; b += sizeof(line_t))
                LINE(y + b) = LINE(x + b);
        }
    }
    /* Token group t0's du row takes the sink, so nothing is optimised away. */
    memcpy(a->ws_du + t0 / a->group * a->d, &sink, sizeof sink);
}
#define KERNEL move_rows
#endif

/* Tokens per group, as the runtime fixes it for every kernel of the op. */
#define GROUP 32

/* `count` elements of the storage type, on a page boundary, each a value
 * in [1, 2) (bf16/f16/f32 bit patterns) that varies with k and i; freed at
 * exit. */
static void *rows_alloc(int64_t count, int i)
{
    const size_t bytes = (size_t)count * ELEM_BYTES;
    unsigned char *rows = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!rows)
        return NULL;
    for (int64_t k = 0; k < count; k++) {
        const uint32_t step = (uint32_t)((k * 7 + i) % 64);
#if defined(ELEM_F32)
        const uint32_t v = 0x3f800000u + step * 0x10000u;
#elif defined(ELEM_F16)
        const uint32_t v = 0x3c00u + step * 8u;
#else
        const uint32_t v = 0x3f80u + step;
#endif
        memcpy(rows + (size_t)k * ELEM_BYTES, &v, ELEM_BYTES); /* little-endian */
    }
    return rows;
}

/* The kernel as the launcher calls it. */
static void run_range(const void *args, int64_t t0, int64_t t1) { KERNEL(args, t0, t1); }

int main(int argc, char **argv)
{
    kernel_shape shape;
    if (kernel_shape_parse(argc, argv, GROUP, &shape))
        return 2;
    const int64_t d = shape.d, T = shape.T;
    const int n = shape.n, threads = shape.threads, repeats = shape.repeats, heads = shape.heads;
    const void *src[64];
    void *dsrc[64];
    int64_t stride[64];
    for (int i = 0; i < n; i++) {
        src[i] = rows_alloc(T * d, i);
        dsrc[i] = rows_alloc(T * d, 0);
        stride[i] = d;
        if (!src[i] || !dsrc[i])
            return 1;
    }
    const void *dout = rows_alloc(T * d, 64);
    float *query = aligned_alloc(64, (size_t)d * 4);
    float *ws_du = aligned_alloc(64, (size_t)(T / GROUP) * (size_t)d * 4);
    if (!dout || !query || !ws_du)
        return 1;
    for (int64_t k = 0; k < d; k++)
        query[k] = 0.01f * (float)(k % 13);
    struct attnres_cpu_mix_backward_args args = {
        .d = d, .n = n, .heads = heads, .src = src, .src_stride = stride, .query = query, .scale = 1.0f,
        .eps = 1e-6f, .alpha = 1.0f, .dout = dout, .dout_stride = d, .dsrc = dsrc, .dsrc_stride = stride,
        .ws_du = ws_du, .group = GROUP};
    const double seconds = launch_median(run_range, &args, T, threads, repeats);
    const double bytes = (double)(2 * n + 1) * (double)(T * d) * ELEM_BYTES * repeats;
    printf("%-40s d=%lld T=%lld N=%d H=%d threads=%d: %8.2f ms  %5.1f GB/s\n", argv[0], (long long)d,
           (long long)T, n, heads, threads, seconds * 1e3 / repeats, bytes / seconds / 1e9);
    return 0;
}
