/*
 * cpu_kernel_abi.h - the calling convention of generated CPU mix kernels.
 *
 * templates/cpu/mix.lua emits the same struct into every kernel it
 * generates, together with `<kernel>_abi` (this version) and
 * `<kernel>_threads`. The runtime refuses a kernel whose ABI differs.
 */
#ifndef AR_CPU_KERNEL_ABI_H
#define AR_CPU_KERNEL_ABI_H

#include <stdint.h>

#define AR_CPU_KERNEL_ABI 1

struct attnres_cpu_mix_args {
    int64_t d;
    int32_t n, heads;
    const void *const *src;
    const int64_t *src_stride;
    const float *query;
    float scale, eps;
    const void *partial;
    int64_t partial_stride;
    float alpha;
    void *out;
    int64_t out_stride;
    const float *out_gain;
    float out_eps;
    void *normed;
    int64_t normed_stride;
};

/* Processes tokens [t0, t1). */
typedef void (*ar_cpu_mix_fn)(const struct attnres_cpu_mix_args *a, int64_t t0,
                              int64_t t1);

#endif
