/*
 * cpu_phase_abi.h - the calling convention of generated CPU kernels for the
 * Block AttnRes two-phase form (phase1 and phase2).
 *
 * templates/cpu/phase1.lua and templates/cpu/phase2.lua emit the same
 * structs into every kernel they generate, together with `<kernel>_abi` and
 * `<kernel>_threads`, exactly as the mix kernels do. The loader checks
 * `<kernel>_abi` against AR_CPU_KERNEL_ABI (cpu_kernel_abi.h), which
 * versions these structs as well: change any CPU kernel struct and bump it
 * in every template at once.
 */
#ifndef AR_CPU_PHASE_ABI_H
#define AR_CPU_PHASE_ABI_H

#include <stdint.h>

#include "cpu_kernel_abi.h"

/* Phase 1: n sources against s queries. Strides count elements. */
struct attnres_cpu_phase1_args {
    int64_t d;
    int32_t n, heads, s;
    const void *const *src;     /* n pointers */
    const int64_t *src_stride;  /* n token strides, never 0 */
    const float *queries;       /* [s, d] */
    float scale, eps;
    void *const *o1;            /* s pointers, each [T, d] */
    int64_t o1_stride;
    float *const *lse;          /* s pointers, each [T, heads] */
    int64_t lse_stride;
};

/* Phase 2: one site's merge with the partial sum; sublayer is NULL unless
 * the add is fused, normed is NULL unless the epilogue runs. */
struct attnres_cpu_phase2_args {
    int64_t d;
    int32_t heads;
    const void *o1;
    int64_t o1_stride;
    const float *lse;
    int64_t lse_stride;
    void *partial;
    int64_t partial_stride;
    const void *sublayer;
    int64_t sublayer_stride;
    const float *query;
    float scale, eps;
    void *out;
    int64_t out_stride;
    const float *out_gain;
    float out_eps;
    void *normed;
    int64_t normed_stride;
};

/* Each processes tokens [t0, t1). */
typedef void (*ar_cpu_phase1_fn)(const struct attnres_cpu_phase1_args *a,
                                 int64_t t0, int64_t t1);
typedef void (*ar_cpu_phase2_fn)(const struct attnres_cpu_phase2_args *a,
                                 int64_t t0, int64_t t1);

/* Most floats of per-token scratch a phase-1 launch may ask of the stack
 * (n * s * heads softmax weights); larger problems are refused. */
#define AR_CPU_PHASE1_MAX_WEIGHTS (1 << 15)

#endif
