/*
 * cpu_kernel_abi.h - the calling convention of generated CPU mix kernels.
 *
 * The argument struct, its ABI version (AR_KERNEL_ABI_CPU_MIX) and its
 * compile-time layout checks come from kernel_abi.h, which the build
 * writes from templates/lib/kernel_abi.lua, the file every template pastes
 * the same struct from. Each kernel also exports `<kernel>_abi` (the
 * version) and `<kernel>_abi_op` (the op); the runtime refuses a kernel
 * whose version differs from its own for that op. The thread count a
 * launch spreads tokens over is not part of the binary: the runtime reads
 * it from the variant's parameters ("threads"), or from `<kernel>_threads`
 * where a binary generated before exports it. Neither changes the argument
 * struct, so the version stays.
 */
#ifndef AR_CPU_KERNEL_ABI_H
#define AR_CPU_KERNEL_ABI_H

#include <stdint.h>

#include "kernel_abi.h"

/* The version this library speaks for each attnres_op. */
#define AR_CPU_ABI_VERSIONS \
    ((const int[6]){AR_KERNEL_ABI_CPU_MIX, AR_KERNEL_ABI_CPU_PHASE1, AR_KERNEL_ABI_CPU_PHASE2, \
                    AR_KERNEL_ABI_CPU_MIX_BACKWARD, AR_KERNEL_ABI_CPU_PHASE1_BACKWARD,            \
                    AR_KERNEL_ABI_CPU_PHASE2_BACKWARD})

/* Processes tokens [t0, t1). */
typedef void (*ar_cpu_mix_fn)(const struct attnres_cpu_mix_args *a, int64_t t0,
                              int64_t t1);

/* The mix backward of tokens [t0, t1), t0 the first token of a group of
 * a->group tokens (cpu/mix_backward.lua). */
typedef void (*ar_cpu_mix_backward_fn)(const struct attnres_cpu_mix_backward_args *a, int64_t t0,
                                       int64_t t1);

/* The phase backwards of tokens [t0, t1), t0 the first token of a group
 * (cpu/phase1_backward.lua, cpu/phase2_backward.lua). */
typedef void (*ar_cpu_phase1_backward_fn)(const struct attnres_cpu_phase1_backward_args *a, int64_t t0,
                                          int64_t t1);
typedef void (*ar_cpu_phase2_backward_fn)(const struct attnres_cpu_phase2_backward_args *a, int64_t t0,
                                          int64_t t1);

#endif
