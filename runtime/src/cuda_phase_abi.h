/*
 * cuda_phase_abi.h - the calling convention of generated CUDA kernels for
 * the Block AttnRes two-phase form (phase1 and phase2).
 *
 * The structs come from kernel_abi.h (templates/lib/kernel_abi.lua), which
 * templates/cuda/phase1.lua and phase2.lua paste into every kernel:
 *   extern "C" __global__ void attnres_<id>(const attnres_cuda_phase1_args a)
 *   extern "C" __global__ void attnres_<id>(const attnres_cuda_phase2_args a)
 * passed by value (no device allocation per launch; graph-capturable). Each
 * has its own version (AR_KERNEL_ABI_CUDA_PHASE1, _PHASE2). Both fit the 4 KiB kernel parameter limit. Strides count elements.
 *
 * Phase 1 runs one block per token and takes (n*S*H + n*H + n) * 4 bytes of
 * dynamic shared memory, which the launch supplies (at most 48 KiB).
 * Phase 2 runs one block per token with static shared memory only.
 */
#ifndef AR_CUDA_PHASE_ABI_H
#define AR_CUDA_PHASE_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_kernel_abi.h"

#define AR_CUDA_PHASE1_MAX_SMEM (48 * 1024)

/* The backwards of the phases (templates/cuda/phase1_backward.lua and
 * phase2_backward.lua), from the same struct file: attnres_<id>, one block
 * per token group writing the group's fp32 partial sums into the caller's
 * workspace (the layout of the CPU's, ar_mix_backward_workspace with a row
 * of S * d for phase 1), and attnres_<id>_sum, the fixed-order pass adding
 * them up; phase 2's has attnres_<id>_epi too, its first entry with the
 * output-norm epilogue. Their per-token tables in dynamic shared memory
 * (ar_cuda_phase{1,2}_backward_smem) are bounded by this. */
#define AR_CUDA_PHASE_BACKWARD_MAX_SMEM (48 * 1024)
#define AR_CUDA_PHASE2_MAX_HEADS 1024

#endif
