/*
 * cuda_kernel_abi.h - the calling convention of generated CUDA mix kernels.
 *
 * templates/lib/cuda_mix.lua emits the same struct into every kernel of
 * templates/cuda/mix_online.lua and cuda/mix_twopass.lua:
 *   extern "C" __global__ void attnres_<id>(const attnres_cuda_mix_args a)
 * The struct is passed by value, so a launch needs no device allocation and
 * can be captured in a CUDA graph. Each variant's params_json carries
 * "abi": AR_CUDA_KERNEL_ABI; the runtime refuses any other value. Strides
 * count elements. The kernel checks sizeof() == 1136 at compile time.
 */
#ifndef AR_CUDA_KERNEL_ABI_H
#define AR_CUDA_KERNEL_ABI_H

#include <stddef.h>
#include <stdint.h>

#define AR_CUDA_KERNEL_ABI 1
#define AR_CUDA_MAX_SOURCES 64

typedef struct attnres_cuda_mix_args {
    const void *src[AR_CUDA_MAX_SOURCES];      /* device pointers, [T, d] views */
    int64_t src_stride[AR_CUDA_MAX_SOURCES];   /* token strides */
    int64_t d;
    int32_t n, heads;
    int64_t T;
    const float *query; /* [d] fp32, gain-folded */
    float scale, eps;
    const void *partial; /* additive form, else NULL */
    int64_t partial_stride;
    float alpha;
    void *out;
    int64_t out_stride;
    const float *out_gain; /* epilogue, else NULL */
    float out_eps;
    void *normed; /* epilogue, else NULL */
    int64_t normed_stride;
} attnres_cuda_mix_args;

_Static_assert(sizeof(attnres_cuda_mix_args) == 1136, "CUDA kernel ABI: struct size");
_Static_assert(offsetof(attnres_cuda_mix_args, d) == 1024, "CUDA kernel ABI: d");
_Static_assert(offsetof(attnres_cuda_mix_args, T) == 1040, "CUDA kernel ABI: T");
_Static_assert(offsetof(attnres_cuda_mix_args, query) == 1048, "CUDA kernel ABI: query");
_Static_assert(offsetof(attnres_cuda_mix_args, alpha) == 1080, "CUDA kernel ABI: alpha");
_Static_assert(offsetof(attnres_cuda_mix_args, out) == 1088, "CUDA kernel ABI: out");
_Static_assert(offsetof(attnres_cuda_mix_args, normed_stride) == 1128, "CUDA kernel ABI: normed_stride");

#endif
