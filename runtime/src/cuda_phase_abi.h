/*
 * cuda_phase_abi.h - the calling convention of generated CUDA kernels for
 * the Block AttnRes two-phase form (phase1 and phase2).
 *
 * templates/cuda/phase1.lua and templates/cuda/phase2.lua emit the same
 * structs into every kernel:
 *   extern "C" __global__ void attnres_<id>(const attnres_cuda_phase1_args a)
 *   extern "C" __global__ void attnres_<id>(const attnres_cuda_phase2_args a)
 * passed by value (no device allocation per launch; graph-capturable). They
 * are versioned by AR_CUDA_KERNEL_ABI (cuda_kernel_abi.h), like the mix
 * struct: change any of them and bump it in every CUDA template at once.
 * Both fit the 4 KiB kernel parameter limit. Strides count elements.
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

#define AR_CUDA_PHASE1_MAX_SOURCES 64
#define AR_CUDA_PHASE1_MAX_SITES 64
#define AR_CUDA_PHASE1_MAX_SMEM (48 * 1024)
#define AR_CUDA_PHASE2_MAX_HEADS 1024

typedef struct attnres_cuda_phase1_args {
    const void *src[AR_CUDA_PHASE1_MAX_SOURCES];   /* [T, d] views */
    int64_t src_stride[AR_CUDA_PHASE1_MAX_SOURCES];
    void *o1[AR_CUDA_PHASE1_MAX_SITES];            /* [T, d] outputs, one per site */
    float *lse[AR_CUDA_PHASE1_MAX_SITES];          /* [T, H] fp32 outputs */
    int64_t d;
    int32_t n, heads, s, pad_;
    int64_t T;
    const float *queries; /* [S, d] fp32, gain-folded */
    float scale, eps;
    int64_t o1_stride;
    int64_t lse_stride;
} attnres_cuda_phase1_args;

typedef struct attnres_cuda_phase2_args {
    int64_t d;
    int32_t heads, pad0_;
    int64_t T;
    const void *o1;
    int64_t o1_stride;
    const float *lse;
    int64_t lse_stride;
    void *partial;            /* b: read, and written when sublayer is set */
    int64_t partial_stride;
    const void *sublayer;     /* f: NULL unless the add is fused */
    int64_t sublayer_stride;
    const float *query;
    float scale, eps;
    void *out;
    int64_t out_stride;
    const float *out_gain;    /* epilogue only */
    float out_eps, pad1_;
    void *normed;             /* NULL unless the epilogue runs */
    int64_t normed_stride;
} attnres_cuda_phase2_args;

_Static_assert(sizeof(attnres_cuda_phase1_args) == 2112, "CUDA phase1 ABI: struct size");
_Static_assert(offsetof(attnres_cuda_phase1_args, o1) == 1024, "CUDA phase1 ABI: o1");
_Static_assert(offsetof(attnres_cuda_phase1_args, d) == 2048, "CUDA phase1 ABI: d");
_Static_assert(offsetof(attnres_cuda_phase1_args, T) == 2072, "CUDA phase1 ABI: T");
_Static_assert(offsetof(attnres_cuda_phase1_args, lse_stride) == 2104, "CUDA phase1 ABI: lse_stride");
_Static_assert(sizeof(attnres_cuda_phase2_args) == 152, "CUDA phase2 ABI: struct size");
_Static_assert(offsetof(attnres_cuda_phase2_args, query) == 88, "CUDA phase2 ABI: query");
_Static_assert(offsetof(attnres_cuda_phase2_args, out_eps) == 128, "CUDA phase2 ABI: out_eps");
_Static_assert(offsetof(attnres_cuda_phase2_args, normed_stride) == 144, "CUDA phase2 ABI: normed_stride");

#endif
