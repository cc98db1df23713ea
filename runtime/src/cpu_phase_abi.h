/*
 * cpu_phase_abi.h - the calling convention of generated CPU kernels for the
 * Block AttnRes two-phase form (phase1 and phase2).
 *
 * The structs and their versions (AR_KERNEL_ABI_CPU_PHASE1, _PHASE2) come
 * from kernel_abi.h, generated from templates/lib/kernel_abi.lua like the
 * mix struct (cpu_kernel_abi.h); each op has its own version.
 */
#ifndef AR_CPU_PHASE_ABI_H
#define AR_CPU_PHASE_ABI_H

#include <stdint.h>

#include "cpu_kernel_abi.h"

/* Each processes tokens [t0, t1). */
typedef void (*ar_cpu_phase1_fn)(const struct attnres_cpu_phase1_args *a,
                                 int64_t t0, int64_t t1);
typedef void (*ar_cpu_phase2_fn)(const struct attnres_cpu_phase2_args *a,
                                 int64_t t0, int64_t t1);

/* Most floats of per-token scratch a phase-1 launch may ask of the stack
 * (n * s * heads softmax weights); larger problems are refused. */
#define AR_CPU_PHASE1_MAX_WEIGHTS (1 << 15)

/* Most sites of a phase-1 backward: its run checks every pair of its
 * views for overlaps, 2 n + 2 S + 2 of them. */
#define AR_CPU_PHASE1_BACKWARD_MAX_SITES 64

/* Floats apart of the padded stack rows a phase-1 backward keeps per site
 * (three of them: u, do1 and du of a column block; PAD in
 * templates/cpu/phase1_backward.lua). */
#define AR_CPU_PHASE1_BACKWARD_PAD 272

#endif
