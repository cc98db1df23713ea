/*
 * phase2_kernel.c - times one generated bf16 CPU phase 2 kernel, outside the
 * runtime, on K3-shaped inputs (one site, the fused residual add, optionally
 * the output norm); or, built without KERNEL, a loop that moves the same
 * rows with no arithmetic to speak of (the ceiling of the access pattern).
 * bench/mix_ab.sh builds and runs it (phase 2 variants) for the figures in
 * docs/cpu_kernels.md.
 *
 *   attnres gen phase2_c_bf16_v16_u2_p1_t2 > /tmp/k.c
 *   cc -O3 -march=native -pthread -DKERNEL_SOURCE='"/tmp/k.c"' \
 *      -DKERNEL=attnres_phase2_c_bf16_v16_u2_p1 bench/phase2_kernel.c -o /tmp/k -lm
 *   /tmp/k D T THREADS NORM
 *
 * Built without KERNEL it needs -I BUILD/runtime/include, for the argument
 * struct in the generated kernel_abi.h.
 *
 * The kernel is named after the variant id without its thread count
 * (_tN), which is a launch parameter: THREADS sets it here.
 *
 * Splits the T tokens evenly over THREADS threads; prints the median of 9
 * timed launches after one warm-up, in GB/s of the traffic the tuner counts
 * (reads of b, f and o1, writes of b and out, and of normed with NORM = 1).
 * Each launch adds f into b again, so b's values drift; the inputs are small
 * enough that 11 launches stay finite.
 *
 * Built without KERNEL, PASSES=2 (the default) moves the rows as the
 * kernel does, b += f in one sweep and out = o1 + b in a second; PASSES=1
 * does both in one sweep, the pattern's best case.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_launch.h"

#ifdef KERNEL
#include KERNEL_SOURCE
#else
#include "row_lines.h"

/* The argument struct as the runtime fills it (templates/lib/kernel_abi.lua,
 * generated into the build's runtime/include/kernel_abi.h). */
#include "kernel_abi.h"

#ifndef PASSES
#define PASSES 2
#endif
/* Integer adds of the raw words: the bytes move, nothing is computed. */
static void move_rows(const struct attnres_cpu_phase2_args *a, int64_t t0, int64_t t1)
{
    for (int64_t t = t0; t < t1; t++) {
        uint16_t *b = (uint16_t *)a->partial + t * a->partial_stride;
        const uint16_t *f = (const uint16_t *)a->sublayer + t * a->sublayer_stride;
        const uint16_t *o = (const uint16_t *)a->o1 + t * a->o1_stride;
        uint16_t *out = (uint16_t *)a->out + t * a->out_stride;
        uint16_t *normed = a->normed ? (uint16_t *)a->normed + t * a->normed_stride : NULL;
        for (int64_t k = 0; k < a->d; k += VEC_WORDS) {
            const line_t x = LINE(b + k) + LINE(f + k);
            LINE(b + k) = x;
            if (PASSES == 1) {
                const line_t y = x + LINE(o + k);
                LINE(out + k) = y;
                if (normed)
                    LINE(normed + k) = y;
            }
        }
        for (int64_t k = 0; PASSES == 2 && k < a->d; k += VEC_WORDS) {
            const line_t y = LINE(b + k) + LINE(o + k);
            LINE(out + k) = y;
            if (normed)
                LINE(normed + k) = y;
        }
    }
}
#define KERNEL move_rows
#endif

/* The kernel as the launcher calls it. */
static void run_range(const void *args, int64_t t0, int64_t t1) { KERNEL(args, t0, t1); }

/* A page-aligned array of `count` bf16 values in [1, 2) (or tiny ones, for
 * the sublayer output that is added 11 times), differing per array. */
static uint16_t *bf16_array(int64_t count, int salt, int tiny)
{
    uint16_t *p = aligned_alloc(4096, ((size_t)count * 2 + 4095) / 4096 * 4096);
    if (!p)
        return NULL;
    for (int64_t k = 0; k < count; k++)
        p[k] = (uint16_t)((tiny ? 0x3c00 : 0x3f80) + (k * 7 + salt) % 64);
    return p;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s D T THREADS NORM\n", argv[0]);
        return 2;
    }
    const int64_t d = atoll(argv[1]), T = atoll(argv[2]);
    const int threads = atoi(argv[3]), norm = atoi(argv[4]);
    if (d <= 0 || d % 64 || d > 65536 || T <= 0 || T > (1 << 20) || threads < 1 || threads > 64 ||
        (norm != 0 && norm != 1)) {
        fprintf(stderr, "%s: D must be a multiple of 64 up to 65536, T 1..2^20, THREADS 1..64, NORM 0 or 1\n",
                argv[0]);
        return 2;
    }
    /* Freed at exit. */
    uint16_t *b = bf16_array(T * d, 1, 0), *f = bf16_array(T * d, 2, 1), *o = bf16_array(T * d, 3, 0);
    uint16_t *out = bf16_array(T * d, 4, 0), *normed = norm ? bf16_array(T * d, 5, 0) : NULL;
    float *query = aligned_alloc(64, (size_t)d * 4), *gain = aligned_alloc(64, (size_t)d * 4);
    float *lse = aligned_alloc(64, ((size_t)T * 4 + 63) / 64 * 64);
    if (!b || !f || !o || !out || (norm && !normed) || !query || !gain || !lse)
        return 1;
    for (int64_t k = 0; k < d; k++) {
        query[k] = 0.01f * (float)(k % 13) - 0.06f;
        gain[k] = 1.0f + 0.001f * (float)(k % 7);
    }
    for (int64_t t = 0; t < T; t++)
        lse[t] = 1.0f + 0.001f * (float)(t % 5);
    const struct attnres_cpu_phase2_args args = {
        .d = d, .heads = 1, .o1 = o, .o1_stride = d, .lse = lse, .lse_stride = 1, .partial = b,
        .partial_stride = d, .sublayer = f, .sublayer_stride = d, .query = query, .scale = 1.0f / 84.7f,
        .eps = 1e-6f, .out = out, .out_stride = d, .out_gain = gain, .out_eps = 1e-6f, .normed = normed,
        .normed_stride = d};
    const double seconds = launch_median(run_range, &args, T, threads, 1);
    const double bytes = (5.0 + norm) * (double)(T * d) * 2.0;
    printf("%-40s d=%lld T=%lld threads=%d norm=%d: %8.2f ms  %5.1f GB/s\n", argv[0], (long long)d,
           (long long)T, threads, norm, seconds * 1e3, bytes / seconds / 1e9);
    return 0;
}
