/*
 * cuda_internal.h - what the CUDA backend's files (cuda_*.c) share: the
 * Driver API as the backend declares it, the loaded driver, the state of a
 * device and of a kernel, and the functions one file calls in another.
 */
#ifndef AR_CUDA_INTERNAL_H
#define AR_CUDA_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_kernel_abi.h"
#include "cuda_phase_abi.h"
#include "device.h"

/* ---- the Driver API, declared here (no toolkit headers needed) -------- */

/* Device ordinals whose need for PTX is remembered across handles. */
#define AR_CUDA_MAX_ORDINALS 64

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;

enum {
    CU_OK = 0,
    CU_ERROR_NO_DEVICE = 100,
    CU_ERROR_NO_BINARY_FOR_GPU = 209,
    CU_ATTR_MULTIPROCESSOR_COUNT = 16,
    CU_ATTR_L2_CACHE_SIZE = 38,
    CU_ATTR_CC_MAJOR = 75,
    CU_ATTR_CC_MINOR = 76,
    CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTR_MAX_DYNAMIC_SHARED = 8,
    CU_STREAM_NON_BLOCKING = 1,
    CU_EVENT_DEFAULT = 0,
};

/* The driver library and its entry points, loaded once per process
 * (cuda_driver.c, ar_cuda_driver_ready). */
typedef struct cuda_driver {
    pthread_once_t once;
    void *handle;
    CUresult init_rc;
    char error[512];
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxPushCurrent)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*FuncGetAttribute)(int *, int, CUfunction);
    CUresult (*FuncSetAttribute)(CUfunction, int, int);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    /* Set when the driver library is the simulated driver of the tests
     * (tests/cudasim/cudasim.h): it exports cudasimDescribe. */
    const char *(*Describe)(void);
    int simulated;
    /* Devices (by ordinal) whose driver refused a cubin with
     * CUDA_ERROR_NO_BINARY_FOR_GPU: from then on they are given PTX, also
     * by handles opened later in the process. */
    int needs_ptx[AR_CUDA_MAX_ORDINALS];
} cuda_driver;

extern cuda_driver ar_cuda_driver;

/* ---- device and kernel state ------------------------------------------- */

/* What ar_kernel.module points to for CUDA kernels. */
typedef struct cuda_kernel {
    CUmodule module;
    int32_t align;  /* bytes: storage pointers and strides */
    int32_t qalign; /* bytes: query and out_gain */
    int64_t dmax;   /* largest d, 0 for any */
    CUfunction sum; /* a backward: the second entry, <kernel>_sum; else NULL */
    CUfunction epi; /* mix and phase 2 backward: the epilogue's first entry, <kernel>_epi; else NULL */
} cuda_kernel;

typedef struct cuda_state {
    CUdevice device;
    CUcontext ctx;
    int cc;             /* 90 for sm_90 */
    int compile_cc;     /* what NVRTC targets */
    int cubin;          /* 1: cubins for compile_cc; 0: PTX (the driver JITs) */
    int ordinal;        /* the device's index, for ar_cuda_driver.needs_ptx */
    size_t l2;          /* bytes */
    pthread_mutex_t lock; /* guards everything below (timing resources) */
    CUstream stream;
    CUevent start, stop;
    CUdeviceptr flush;
    size_t flush_bytes;
    CUmodule empty_module;
    CUfunction empty;
    /* The streaming kernels of the ceilings and the stream passes, loaded
     * on first use (cuda_timing.c). */
    CUmodule ceiling_module;
    CUfunction ceiling_read, ceiling_copy;
} cuda_state;

/* Everything one launch needs, prepared before the context is entered: the
 * by-value argument struct of the op, the grid and the dynamic shared
 * memory. It lives on the caller's stack: a launch allocates nothing. */
typedef struct cuda_launch_data {
    union {
        attnres_cuda_mix_args mix;
        attnres_cuda_phase1_args phase1;
        attnres_cuda_phase2_args phase2;
        attnres_cuda_mix_backward_args mix_backward;
        attnres_cuda_phase1_backward_args phase1_backward;
        attnres_cuda_phase2_backward_args phase2_backward;
    } args;
    int64_t grid, smem;
    /* The entry of the first launch when it is not the kernel's own
     * (k->entry): a backward's epilogue entry; NULL otherwise. */
    CUfunction first;
    /* A backward's second launch (cuda_kernel.sum) over sum_grid blocks,
     * after the first; 0 for the forward ops. grid may be 0 then (T = 0:
     * the sums over no tokens are still written). */
    int64_t sum_grid;
} cuda_launch_data;

/* ---- cuda_driver.c ----------------------------------------------------- */

/* Loads the driver library on the first call; 1 when it is loaded (whether
 * cuInit succeeded is ar_cuda_driver.init_rc), 0 with the reason in
 * ar_cuda_driver.error. */
int ar_cuda_driver_ready(void);

/* The driver's name and text for r, or its number when it has none. */
void ar_cuda_error_text(CUresult r, char *buf, size_t len);

/* Records "WHAT failed: the driver's text" on dev (and that the context is
 * lost when r is one of the sticky errors); returns status. */
int ar_cuda_fail(attnres_device *dev, int status, CUresult r, const char *what);

/* ---- cuda_backend.c ---------------------------------------------------- */

/* Makes the device's context current for one call; ar_cuda_ctx_leave
 * restores the caller's. */
CUresult ar_cuda_ctx_enter(const cuda_state *st, int *pushed);
void ar_cuda_ctx_leave(int pushed);

/* ---- cuda_args.c ------------------------------------------------------- */

/* 1 when p is not a multiple of align bytes (align 0 or 1: never). */
static inline int ar_cuda_misaligned(const void *p, int64_t align)
{
    return align > 1 && (uintptr_t)p % (uintptr_t)align != 0;
}

/* A view (pointer and token stride in elements of es bytes) that the kernel
 * loads with `align`-byte accesses, and is not aligned for them. */
static inline int ar_cuda_view_misaligned(const void *ptr, int64_t stride, int64_t es, int64_t align)
{
    return ar_cuda_misaligned(ptr, align) || (stride * es) % align != 0;
}

/* The stride of view `name` of the caller's arguments a: its own, or a
 * whole row of `row` elements where it gave 0. */
#define ROW_STRIDE(a, name, row) ((a)->name##_stride ? (a)->name##_stride : (row))
/* View `name` from the caller's arguments a into the by-value struct args
 * (the fields have the same names): its pointer and ROW_STRIDE. */
#define TAKE_VIEW(args, a, name, row) ((args)->name = (a)->name, (args)->name##_stride = ROW_STRIDE(a, name, row))

/* The shape and softmax parameters that every op's by-value struct carries
 * under the same names: d, heads and T from the problem and launch, scale
 * and eps from the caller's arguments `a`. */
#define FILL_SHAPE(args, a, p, nh, nt) \
    do {                               \
        (args)->d = (p)->d;            \
        (args)->heads = (nh);          \
        (args)->T = (nt);              \
        (args)->scale = (a)->scale;    \
        (args)->eps = (a)->eps;        \
    } while (0)

/* The ops table's check_problem: what no CUDA kernel runs. */
int ar_cuda_check_problem(attnres_device *dev, const attnres_problem *p);

/* Checks one launch's arguments against the problem and the kernel and
 * fills l (T > 0, or T = 0 for the mix backward); ATTNRES_OK, or the status with the reason on dev. */
int ar_cuda_prepare(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                    const ar_op_args *a, cuda_launch_data *l);

/* A backward's n sources and their gradients as the caller gives them: a
 * stride of 0, or no strides, means d. */
typedef struct cuda_source_views {
    const void *const *sources;
    const int64_t *strides;
    void *const *dsources;
    const int64_t *dstrides;
} cuda_source_views;

/* The fp32 rows a backward reads whole vectors of: the query and out_gain
 * (may be NULL) at the kernel's qalign, the workspace at 16 bytes.
 * ATTNRES_OK, or EINVAL saying which. */
int ar_cuda_check_fp32_rows(attnres_device *dev, const ar_kernel *k, const void *query, const void *out_gain,
                            const void *workspace);
/* Fills a backward's by-value arrays of the p->n sources and gradients
 * (src, src_stride, dsrc, dsrc_stride), the sources read `align` bytes at a
 * time in elements of es bytes, the gradients dalign bytes in elements of
 * des (fp32 gradients take the query's alignment); a NULL or misaligned
 * view is refused with a message. */
int ar_cuda_fill_source_gradients(attnres_device *dev, const ar_kernel *k, const attnres_problem *p,
                                  const cuda_source_views *v, int64_t es, int64_t align, int64_t des,
                                  int64_t dalign, const void **src, int64_t *src_stride, void **dsrc,
                                  int64_t *dsrc_stride);

/* ---- cuda_args_phase1_backward.c, cuda_args_phase2_backward.c ---------- */

/* The dynamic shared memory a phase backward's per-token tables take per
 * block (templates/cuda/phase1_backward.lua, phase2_backward.lua), which
 * ar_cuda_check_problem bounds by AR_CUDA_PHASE_BACKWARD_MAX_SMEM. */
int64_t ar_cuda_phase1_backward_smem(const attnres_problem *p);
int64_t ar_cuda_phase2_backward_smem(const attnres_problem *p);

/* Fill a phase backward's by-value struct and its launch (grid, dynamic
 * shared memory, the sum entry's grid, the first entry) in l, after
 * checking the caller's arguments against the problem and the kernel. T
 * may be 0: then only the sums run, and write zeros. */
int ar_cuda_fill_phase1_backward(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                                 const attnres_phase1_backward_args *a, cuda_launch_data *l);
int ar_cuda_fill_phase2_backward(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                                 const attnres_phase2_backward_args *a, cuda_launch_data *l);

/* Launches prepared work on stream, the context already current. */
int ar_cuda_launch_current(attnres_device *dev, const ar_kernel *k, cuda_launch_data *l, CUstream stream);

/* The ops table's launch. */
int ar_cuda_launch(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                   const ar_op_args *a, void *stream);

/* ---- cuda_timing.c ----------------------------------------------------- */

/* The ops table's time, copy_bandwidth, empty_launch, ceilings and
 * stream_pass (device.h). */
int ar_cuda_time(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                 const ar_op_args *a, int reps, int flush, double *times_us);
int ar_cuda_copy_bandwidth(attnres_device *dev, double *gbps);
int ar_cuda_empty_launch(attnres_device *dev, double *us);
int ar_cuda_ceilings(attnres_device *dev, ar_ceilings *out);
int ar_cuda_stream_pass(attnres_device *dev, void *buf, const ar_stream_pass *pass, double *us);

#endif
