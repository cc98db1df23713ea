/*
 * cuda_kernel_abi.h - the calling convention of generated CUDA mix kernels.
 *
 *   extern "C" __global__ void attnres_<id>(const attnres_cuda_mix_args a)
 * The struct is passed by value, so a launch needs no device allocation and
 * can be captured in a CUDA graph. It comes from kernel_abi.h, which the
 * build writes from templates/lib/kernel_abi.lua, the file
 * templates/lib/cuda_mix.lua pastes the same struct from into every kernel
 * of cuda/mix_online.lua and cuda/mix_twopass.lua; both sides assert its size at compile time
 * (this side every offset too). Each variant's params_json carries
 * "abi": AR_KERNEL_ABI_CUDA_MIX and "abi_op"; the runtime refuses any other
 * version for the op. Strides count elements.
 */
#ifndef AR_CUDA_KERNEL_ABI_H
#define AR_CUDA_KERNEL_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "kernel_abi.h"

/* The version this library speaks for each attnres_op. */
#define AR_CUDA_ABI_VERSIONS                                                                       \
    ((const int[6]){AR_KERNEL_ABI_CUDA_MIX, AR_KERNEL_ABI_CUDA_PHASE1, AR_KERNEL_ABI_CUDA_PHASE2, \
                    AR_KERNEL_ABI_CUDA_MIX_BACKWARD, AR_KERNEL_ABI_CUDA_PHASE1_BACKWARD,        \
                    AR_KERNEL_ABI_CUDA_PHASE2_BACKWARD})

/* The mix backward (templates/cuda/mix_backward.lua) has three entries in
 * one module, all taking attnres_cuda_mix_backward_args: attnres_<id>,
 * one block per token group writing the groups' fp32 partial sums into the
 * caller's workspace, attnres_<id>_epi, the same with the output-norm
 * epilogue, and attnres_<id>_sum, the fixed-order pass that adds them up. Its per-token tables take (3 n H + 2 n + H) * 4 bytes of dynamic
 * shared memory, which the launch supplies (at most 48 KiB). */
#define AR_CUDA_MIX_BACKWARD_SUM_SUFFIX "_sum"
#define AR_CUDA_MIX_BACKWARD_EPI_SUFFIX "_epi"
#define AR_CUDA_MIX_BACKWARD_MAX_SMEM (48 * 1024)

#endif
