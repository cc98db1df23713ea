/*
 * cudasim.h - what the simulated CUDA driver offers beyond the Driver API.
 *
 * libattnres-cudasim.so stands in for libcuda.so.1: it exports the Driver
 * API entry points that runtime/src/cuda_driver.c resolves, with their real
 * signatures and error codes, and runs kernels by interpreting the PTX that
 * NVRTC emits. It accepts PTX only (a cubin load answers
 * CUDA_ERROR_NO_BINARY_FOR_GPU). The backend loads it when
 * ATTNRES_CUDA_DRIVER names it.
 *
 * Faults. A kernel that faults (global access outside every allocation,
 * misaligned access, shared memory out of bounds, barrier divergence, a
 * barrier that can never complete, a shuffle naming an inactive lane, a
 * shared-memory race between barriers, a read of never-written shared
 * memory, an ld.global.nc of bytes the launch wrote) is stopped at the
 * first fault. As on hardware, cuLaunchKernel
 * itself returns CUDA_SUCCESS; the fault's code is returned by the next call
 * that synchronises (cuStreamSynchronize, cuEventSynchronize, cuMemcpy*,
 * cuCtxSynchronize) and, being sticky, by every later call on the context
 * until the primary context is reset (cuDevicePrimaryCtxReset, or released
 * by every holder and retained anew). cuGetErrorString(code) for the fault's
 * code returns the driver's text followed by the fault's description:
 *   "an illegal memory access was encountered [cudasim: kernel K, block
 *    (x,y,z), thread (x,y,z), PTX line L `ld.global.v4.u32 ...`: address
 *    0x... (16 bytes) is outside every allocation]"
 *
 * Environment:
 *   ATTNRES_CUDASIM_TRAFFIC=PATH  appends one JSON line per launch to PATH
 *                                 (kernel, grid, block, traffic counters,
 *                                 the modelled time; see docs/cudasim.md).
 *   ATTNRES_CUDASIM_CHECKS=0      turns off the shared-memory race and
 *                                 uninitialised-read checks and the check of
 *                                 ld.global.nc against the launch's own
 *                                 stores (on by default).
 *   ATTNRES_CUDASIM_L2_BYTES=B    the L2 size the device reports, a whole
 *                                 number of KiB from 64 KiB to the default
 *                                 50 MiB (other values are ignored): below
 *                                 it, small problems are out of cache.
 */
#ifndef CUDASIM_H
#define CUDASIM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A NUL-terminated description of the simulator ("attnres cudasim 1: PTX
 * interpreter, sm_90 model"). A driver library that exports this symbol is
 * a simulator: the CUDA backend marks its devices as simulated. */
const char *cudasimDescribe(void);

/* Copies the description of the last fault (empty when none) into buf and
 * returns its CUresult (0 when none). */
int cudasimLastFault(char *buf, size_t len);

/* Traffic counters of the last launch in this process. */
typedef struct cudasim_traffic {
    unsigned long long requests;        /* warp-level global memory instructions */
    unsigned long long bytes_requested; /* bytes the active lanes asked for */
    unsigned long long sectors;         /* 32-byte sectors summed over requests */
    unsigned long long distinct_sectors;/* distinct sectors the launch touched */
    unsigned long long read_bytes;      /* distinct sectors read, in bytes */
    unsigned long long write_bytes;     /* distinct sectors written, in bytes */
    unsigned long long warp_instructions; /* warp-level instructions issued */
    double model_us;                    /* the modelled time of the launch */
} cudasim_traffic;
int cudasimLastTraffic(cudasim_traffic *t);
/* The counters summed over every launch since the previous call (or since
 * the process started), which this call sets back to zero: the traffic of
 * an operation that launches more than one kernel. Distinct sectors are
 * summed per launch, so bytes one launch writes and the next reads count
 * in both. */
int cudasimTakeTraffic(cudasim_traffic *t);

#ifdef __cplusplus
}
#endif

#endif
