/*
 * phase1_kernel.c - times one generated bf16 CPU phase 1 kernel, outside
 * the runtime, on K3-shaped inputs (N sources, S sites, one head unless
 * HEADS says otherwise); or, built
 * without KERNEL, a loop that reads the N source rows and writes the S
 * output rows with no arithmetic to speak of (what the traffic alone takes;
 * phase 1 is bound by its arithmetic, S dot products and mixes per row).
 * bench/mix_ab.sh builds and runs it for phase 1 variants.
 *
 *   attnres gen phase1_c_bf16_tiled_tiled_v16_u1_t1 > /tmp/k.c
 *   cc -O3 -march=native -pthread -DKERNEL_SOURCE='"/tmp/k.c"' \
 *      -DKERNEL=attnres_phase1_c_bf16_tiled_tiled_v16_u1 bench/phase1_kernel.c -o /tmp/k -lm
 *   /tmp/k D T N S THREADS REPEATS [HEADS]
 *
 * Built without KERNEL it needs -I BUILD/runtime/include, for the argument
 * struct in the generated kernel_abi.h.
 *
 * The kernel is named after the variant id without its thread count
 * (_tN), which is a launch parameter: THREADS sets it here.
 *
 * Splits the T tokens evenly over THREADS threads, each calling the kernel
 * REPEATS times on its tokens; prints the median of 9 timed launches after
 * one warm-up, in GB/s of the traffic the tuner counts for phase 1 (the N
 * source rows read, the S output rows written), and in microseconds per
 * call. The N sources lie back to back, as in an engine's bank, and so do
 * the S outputs.
 */
#include <math.h>
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

/* Integer adds of the raw words: every source row read, every output row
 * written with their sum; the bytes move, nothing is computed. */
static void move_rows(const struct attnres_cpu_phase1_args *a, int64_t t0, int64_t t1)
{
    for (int64_t t = t0; t < t1; t++)
        for (int64_t k = 0; k < a->d; k += VEC_WORDS) {
            line_t x = {0};
            for (int i = 0; i < a->n; i++)
                x += LINE((const uint16_t *)a->src[i] + t * a->src_stride[i] + k);
            for (int j = 0; j < a->s; j++)
                LINE((uint16_t *)a->o1[j] + t * a->o1_stride + k) = x;
        }
}
#define KERNEL move_rows
#endif

/* The kernel as the launcher calls it. */
static void run_range(const void *args, int64_t t0, int64_t t1) { KERNEL(args, t0, t1); }

/* The bf16 bits of the next value in [-1.43, 1.43] of a fixed pseudo-random
 * sequence (the same inputs in every build). */
static uint16_t bf16_value(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    const float f = (float)((int)(*state >> 40) % 2001 - 1000) / 700.0f;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

int main(int argc, char **argv)
{
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: %s D T N S THREADS REPEATS [HEADS]\n", argv[0]);
        return 2;
    }
    const int64_t d = atoll(argv[1]), T = atoll(argv[2]);
    const int n = atoi(argv[3]), s = atoi(argv[4]), threads = atoi(argv[5]), repeats = atoi(argv[6]);
    const int heads = argc == 8 ? atoi(argv[7]) : 1;
    if (d <= 0 || d % 64 || d > 65536 || T <= 0 || T > (1 << 20) || n < 1 || n > 64 || s < 1 || s > 64 ||
        threads < 1 || threads > 64 || repeats < 1 || repeats > 1000000 || heads < 1 || heads > 64 ||
        d % (64 * heads)) {
        fprintf(stderr, "%s: D must be a multiple of 64 up to 65536, T 1..2^20, N and S 1..64, THREADS 1..64, "
                        "REPEATS 1..10^6, HEADS 1..64 with D / HEADS a multiple of 64\n", argv[0]);
        return 2;
    }
    /* Freed at exit. */
    uint16_t *bank = aligned_alloc(4096, ((size_t)(n * T * d) * 2 + 4095) / 4096 * 4096);
    float *queries = aligned_alloc(64, (size_t)(s * d) * 4);
    if (!bank || !queries)
        return 1;
    uint64_t state = 42;
    for (int64_t k = 0; k < n * T * d; k++)
        bank[k] = bf16_value(&state);
    /* Queries of unit norm, as a trained pseudo-query folded with its gain
     * is: scores of order one. */
    for (int64_t k = 0; k < s * d; k++) {
        uint32_t u = (uint32_t)bf16_value(&state) << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        queries[k] = f / sqrtf((float)d);
    }
    const void *src[64];
    int64_t stride[64];
    void *o1[64];
    float *lse[64];
    for (int i = 0; i < n; i++) {
        src[i] = bank + (size_t)(i * T * d);
        stride[i] = d;
    }
    /* The S outputs lie back to back too, [S, T, d] and [S, T, H], as the
     * runtime's callers hold them. */
    uint16_t *out = aligned_alloc(4096, ((size_t)(s * T * d) * 2 + 4095) / 4096 * 4096);
    float *lse_all = aligned_alloc(64, ((size_t)(s * T * heads) * 4 + 63) / 64 * 64);
    if (!out || !lse_all)
        return 1;
    for (int j = 0; j < s; j++) {
        o1[j] = out + (size_t)(j * T * d);
        lse[j] = lse_all + (size_t)(j * T * heads);
    }
    struct attnres_cpu_phase1_args args = {
        .d = d, .n = n, .heads = heads, .s = s, .src = src, .src_stride = stride, .queries = queries,
        .scale = 1.0f, .eps = 1e-6f, .o1 = o1, .o1_stride = d, .lse = lse, .lse_stride = heads};
    const double seconds = launch_median(run_range, &args, T, threads, repeats);
    const double bytes = (double)(n + s) * (double)(T * d) * 2.0 * repeats;
    printf("%-40s d=%lld T=%lld N=%d S=%d H=%d threads=%d: %8.1f us  %5.1f GB/s\n", argv[0], (long long)d,
           (long long)T, n, s, heads, threads, seconds * 1e6 / repeats, bytes / seconds / 1e9);
    return 0;
}
