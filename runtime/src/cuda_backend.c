/*
 * cuda_backend.c - NVIDIA GPUs through the CUDA Driver API.
 *
 * libcuda.so.1 is loaded with dlopen at the first use, so the library links
 * and runs on hosts without a driver: there count() is 0 and open() fails
 * with ATTNRES_ENODEV. Kernels are CUDA C++ from templates/cuda, compiled
 * by NVRTC (nvrtc.c, also loaded with dlopen) into cubins for the device's
 * architecture, or into PTX for the newest architecture NVRTC knows when it
 * does not know the device's. Each device holds its primary context; every
 * call makes it current for its duration and restores the caller's.
 *
 * Kernels take one by-value argument (cuda_kernel_abi.h for mix,
 * cuda_phase_abi.h for the Block AttnRes phases), so a launch allocates
 * nothing and can be captured in a CUDA graph. The built-in generic
 * kernels' sources (mix, phase1, phase2) are generated at build time from
 * the templates and compiled with NVRTC when a plan first needs them
 * (cached on disk by build key).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binary_cache.h"
#include "cuda_kernel_abi.h"
#include "cuda_phase_abi.h"
#include "device.h"
#include "nvrtc.h"
#include "sha256.h"

/* Generated at build time from templates/cuda/mix_twopass.lua (see cuda.cmake) ... */
extern const char ar_cuda_generic_mix_f32[], ar_cuda_generic_mix_f32_kernel[], ar_cuda_generic_mix_f32_params[],
    ar_cuda_generic_mix_f32_variant[];
extern const char ar_cuda_generic_mix_bf16[], ar_cuda_generic_mix_bf16_kernel[], ar_cuda_generic_mix_bf16_params[],
    ar_cuda_generic_mix_bf16_variant[];
extern const char ar_cuda_generic_mix_f16[], ar_cuda_generic_mix_f16_kernel[], ar_cuda_generic_mix_f16_params[],
    ar_cuda_generic_mix_f16_variant[];
/* ... and from templates/cuda/phase1.lua and templates/cuda/phase2.lua. */
#define AR_CUDA_GENERIC_DECL(op, dt)                                                                    \
    extern const char ar_cuda_generic_##op##_##dt[], ar_cuda_generic_##op##_##dt##_kernel[],             \
        ar_cuda_generic_##op##_##dt##_params[], ar_cuda_generic_##op##_##dt##_variant[]
AR_CUDA_GENERIC_DECL(phase1, f32);
AR_CUDA_GENERIC_DECL(phase1, bf16);
AR_CUDA_GENERIC_DECL(phase1, f16);
AR_CUDA_GENERIC_DECL(phase2, f32);
AR_CUDA_GENERIC_DECL(phase2, bf16);
AR_CUDA_GENERIC_DECL(phase2, f16);

/* The embedded generic kernels, by op and dtype. */
typedef struct cuda_generic {
    const char *source, *kernel, *params, *variant;
} cuda_generic;

#define AR_CUDA_GENERIC(op, dt)                                                                         \
    {ar_cuda_generic_##op##_##dt, ar_cuda_generic_##op##_##dt##_kernel, ar_cuda_generic_##op##_##dt##_params, \
     ar_cuda_generic_##op##_##dt##_variant}

static const cuda_generic cuda_generics[3][3] = {
    /* [op][dtype]: ATTNRES_OP_MIX/PHASE1/PHASE2 x ATTNRES_DTYPE_F32/BF16/F16 */
    {AR_CUDA_GENERIC(mix, f32), AR_CUDA_GENERIC(mix, bf16), AR_CUDA_GENERIC(mix, f16)},
    {AR_CUDA_GENERIC(phase1, f32), AR_CUDA_GENERIC(phase1, bf16), AR_CUDA_GENERIC(phase1, f16)},
    {AR_CUDA_GENERIC(phase2, f32), AR_CUDA_GENERIC(phase2, bf16), AR_CUDA_GENERIC(phase2, f16)},
};

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

static struct {
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
} cu = {.once = PTHREAD_ONCE_INIT};

/* Looks up the first of several names (newest ABI first). */
static void *driver_symbol(const char *const *names)
{
    for (; *names; names++) {
        void *p = dlsym(cu.handle, *names);
        if (p)
            return p;
    }
    return NULL;
}

#define CU_SYM(field, ...)                                                            \
    do {                                                                              \
        static const char *const names_[] = {__VA_ARGS__, NULL};                      \
        *(void **)(&cu.field) = driver_symbol(names_);                                \
        if (!cu.field) {                                                              \
            snprintf(cu.error, sizeof cu.error, "the CUDA driver lacks %s", names_[0]); \
            goto fail;                                                                \
        }                                                                             \
    } while (0)

static void driver_load(void)
{
    cu.init_rc = -1;
    /* ATTNRES_CUDA_DRIVER names another driver library: a newer driver
     * outside the loader's path, or the simulated driver of the tests. */
    const char *path = getenv("ATTNRES_CUDA_DRIVER");
    if (!path || !*path)
        path = "libcuda.so.1";
    cu.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!cu.handle) {
        const char *why = dlerror();
        snprintf(cu.error, sizeof cu.error, "no CUDA driver (%.200s not loaded: %.250s)", path,
                 why ? why : "not found");
        return;
    }
    CU_SYM(Init, "cuInit");
    CU_SYM(DriverGetVersion, "cuDriverGetVersion");
    CU_SYM(GetErrorName, "cuGetErrorName");
    CU_SYM(GetErrorString, "cuGetErrorString");
    CU_SYM(DeviceGetCount, "cuDeviceGetCount");
    CU_SYM(DeviceGet, "cuDeviceGet");
    CU_SYM(DeviceGetName, "cuDeviceGetName");
    CU_SYM(DeviceGetAttribute, "cuDeviceGetAttribute");
    CU_SYM(DeviceTotalMem, "cuDeviceTotalMem_v2");
    CU_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    CU_SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
    CU_SYM(CtxGetCurrent, "cuCtxGetCurrent");
    CU_SYM(CtxPushCurrent, "cuCtxPushCurrent_v2");
    CU_SYM(CtxPopCurrent, "cuCtxPopCurrent_v2");
    CU_SYM(ModuleLoadData, "cuModuleLoadData");
    CU_SYM(ModuleUnload, "cuModuleUnload");
    CU_SYM(ModuleGetFunction, "cuModuleGetFunction");
    CU_SYM(FuncGetAttribute, "cuFuncGetAttribute");
    CU_SYM(FuncSetAttribute, "cuFuncSetAttribute");
    CU_SYM(LaunchKernel, "cuLaunchKernel");
    CU_SYM(MemAlloc, "cuMemAlloc_v2");
    CU_SYM(MemFree, "cuMemFree_v2");
    CU_SYM(MemcpyHtoD, "cuMemcpyHtoD_v2");
    CU_SYM(MemcpyDtoH, "cuMemcpyDtoH_v2");
    CU_SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    CU_SYM(MemsetD8Async, "cuMemsetD8Async");
    CU_SYM(StreamCreate, "cuStreamCreate");
    CU_SYM(StreamDestroy, "cuStreamDestroy_v2");
    CU_SYM(StreamSynchronize, "cuStreamSynchronize");
    CU_SYM(EventCreate, "cuEventCreate");
    CU_SYM(EventDestroy, "cuEventDestroy_v2");
    CU_SYM(EventRecord, "cuEventRecord");
    CU_SYM(EventSynchronize, "cuEventSynchronize");
    CU_SYM(EventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime");
    *(void **)(&cu.Describe) = dlsym(cu.handle, "cudasimDescribe");
    cu.simulated = cu.Describe != NULL;
    cu.init_rc = cu.Init(0);
    return;
fail:
    dlclose(cu.handle);
    cu.handle = NULL;
}

static int driver_ready(void)
{
    pthread_once(&cu.once, driver_load);
    return cu.handle != NULL;
}

/* "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered". */
static void error_text(CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (!cu.handle || cu.GetErrorName(r, &name) != CU_OK || !name)
        name = NULL;
    if (!cu.handle || cu.GetErrorString(r, &text) != CU_OK)
        text = NULL;
    if (name && text)
        snprintf(buf, len, "%s: %s", name, text);
    else if (name)
        snprintf(buf, len, "%s", name);
    else
        snprintf(buf, len, "CUDA error %d", r);
}

/* Errors after which the context is unusable until the process exits. */
static int is_sticky(CUresult r)
{
    switch (r) {
    case 214: /* ECC_UNCORRECTABLE */
    case 220: /* NVLINK_UNCORRECTABLE */
    case 226: /* CONTAINED */
    case 700: /* ILLEGAL_ADDRESS */
    case 702: /* LAUNCH_TIMEOUT */
    case 710: /* ASSERT */
    case 714: /* HARDWARE_STACK_ERROR */
    case 715: /* ILLEGAL_INSTRUCTION */
    case 716: /* MISALIGNED_ADDRESS */
    case 717: /* INVALID_ADDRESS_SPACE */
    case 718: /* INVALID_PC */
    case 719: /* LAUNCH_FAILED */
        return 1;
    default:
        return 0;
    }
}

static int cuda_fail(attnres_device *dev, int status, CUresult r, const char *what)
{
    char text[768]; /* a simulated driver's fault description runs long */
    error_text(r, text, sizeof text);
    if (is_sticky(r))
        return ar_device_fail(dev, status,
                              "%s failed: %s (a kernel on this device faulted earlier; the CUDA context is "
                              "unusable until the process restarts)",
                              what, text);
    return ar_device_fail(dev, status, "%s failed: %s", what, text);
}

/* ---- device state ------------------------------------------------------ */

/* What ar_kernel.module points to for CUDA kernels. */
typedef struct cuda_kernel {
    CUmodule module;
    int32_t align;  /* bytes: storage pointers and strides */
    int32_t qalign; /* bytes: query and out_gain */
    int64_t dmax;   /* largest d, 0 for any */
} cuda_kernel;

typedef struct cuda_state {
    CUdevice device;
    CUcontext ctx;
    int cc;             /* 90 for sm_90 */
    int compile_cc;     /* what NVRTC targets */
    int cubin;          /* 1: cubins for compile_cc; 0: PTX (the driver JITs) */
    int ordinal;        /* the device's index, for cu.needs_ptx */
    size_t l2;          /* bytes */
    pthread_mutex_t lock; /* guards everything below (timing resources) */
    CUstream stream;
    CUevent start, stop;
    CUdeviceptr flush;
    size_t flush_bytes;
    CUmodule empty_module;
    CUfunction empty;
    /* The streaming kernels of the ceilings and the stream passes, loaded
     * on first use (ceiling_kernels). */
    CUmodule ceiling_module;
    CUfunction ceiling_read, ceiling_copy;
} cuda_state;

/* Makes the device's context current for one call; restores the caller's. */
static CUresult ctx_enter(const cuda_state *st, int *pushed)
{
    CUcontext cur = NULL;
    *pushed = 0;
    if (cu.CtxGetCurrent(&cur) == CU_OK && cur == st->ctx)
        return CU_OK;
    CUresult r = cu.CtxPushCurrent(st->ctx);
    *pushed = r == CU_OK;
    return r;
}

static void ctx_leave(int pushed)
{
    if (pushed) {
        CUcontext c;
        cu.CtxPopCurrent(&c);
    }
}

/* Whether the device is to be given PTX rather than cubins: the simulated
 * driver runs PTX only, ATTNRES_CUDA_PTX=1 asks for it (a driver newer than
 * the NVRTC at hand JITs it for its GPU), and a device that refused a cubin
 * once keeps getting PTX. */
static int wants_ptx(int ordinal)
{
    const char *env = getenv("ATTNRES_CUDA_PTX");
    /* "0" insists on cubins first, also for a simulator: that is how the
     * tests reach the recompile-after-refusal path. */
    const int insist_cubin = env && strcmp(env, "0") == 0;
    if ((cu.simulated && !insist_cubin) || (env && strcmp(env, "1") == 0))
        return 1;
    return ordinal >= 0 && ordinal < AR_CUDA_MAX_ORDINALS && cu.needs_ptx[ordinal];
}

/* Real code for the device when NVRTC knows its architecture and nothing
 * asks for PTX; else PTX for the newest architecture NVRTC knows that the
 * device runs, which the driver compiles at load. */
static void choose_binary_form(cuda_state *st)
{
    int best = ar_nvrtc_best_arch(st->cc);
    st->cubin = (best == 0 || best == st->cc) && !wants_ptx(st->ordinal);
    st->compile_cc = st->cubin || best == 0 ? st->cc : best;
}

/* The target part of the build key: "sm_90" for cubins, "compute_90 (PTX
 * for sm_90)" for PTX, so that cached binaries of the two never mix. */
static void set_target(attnres_device *dev)
{
    const cuda_state *st = dev->state;
    if (st->cubin)
        snprintf(dev->target, sizeof dev->target, "sm_%d", st->cc);
    else
        snprintf(dev->target, sizeof dev->target, "compute_%d (PTX for sm_%d)", st->compile_cc, st->cc);
}

/* Switches a device whose driver refused a cubin to PTX, for this handle
 * and every later one of the same device in the process. */
static void switch_to_ptx(attnres_device *dev)
{
    cuda_state *st = dev->state;
    pthread_mutex_lock(&dev->lock);
    if (st->ordinal >= 0 && st->ordinal < AR_CUDA_MAX_ORDINALS)
        cu.needs_ptx[st->ordinal] = 1;
    if (st->cubin) {
        choose_binary_form(st);
        set_target(dev);
    }
    pthread_mutex_unlock(&dev->lock);
}

static int cuda_count(void)
{
    if (!driver_ready() || cu.init_rc != CU_OK)
        return 0;
    int n = 0;
    if (cu.DeviceGetCount(&n) != CU_OK || n < 0)
        return 0;
    return n;
}

static int cuda_open(attnres_device *dev, int index)
{
    if (!driver_ready())
        return ar_device_fail(dev, ATTNRES_ENODEV, "%s", cu.error);
    if (cu.init_rc != CU_OK) {
        char text[256];
        error_text(cu.init_rc, text, sizeof text);
        return ar_device_fail(dev, ATTNRES_ENODEV, "the CUDA driver did not initialise: %s", text);
    }
    int count = 0;
    CUresult r = cu.DeviceGetCount(&count);
    if (r != CU_OK)
        return cuda_fail(dev, ATTNRES_ENODEV, r, "cuDeviceGetCount");
    if (index < 0 || index >= count)
        return ar_device_fail(dev, ATTNRES_ENODEV, "no CUDA device %d (%d present)", index, count);
    cuda_state *st = calloc(1, sizeof *st);
    if (!st)
        return ar_device_fail(dev, ATTNRES_ENOMEM, "out of memory");
    pthread_mutex_init(&st->lock, NULL);
    int major = 0, minor = 0, sms = 0, l2 = 0, version = 0;
    size_t mem = 0;
    char name[256] = "";
    if ((r = cu.DeviceGet(&st->device, index)) != CU_OK ||
        (r = cu.DeviceGetName(name, (int)sizeof name - 1, st->device)) != CU_OK ||
        (r = cu.DeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, st->device)) != CU_OK ||
        (r = cu.DeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, st->device)) != CU_OK ||
        (r = cu.DeviceGetAttribute(&sms, CU_ATTR_MULTIPROCESSOR_COUNT, st->device)) != CU_OK ||
        (r = cu.DeviceGetAttribute(&l2, CU_ATTR_L2_CACHE_SIZE, st->device)) != CU_OK ||
        (r = cu.DeviceTotalMem(&mem, st->device)) != CU_OK || (r = cu.DriverGetVersion(&version)) != CU_OK) {
        pthread_mutex_destroy(&st->lock);
        free(st);
        return cuda_fail(dev, ATTNRES_ENODEV, r, "querying the CUDA device");
    }
    if ((r = cu.DevicePrimaryCtxRetain(&st->ctx, st->device)) != CU_OK) {
        pthread_mutex_destroy(&st->lock);
        free(st);
        return cuda_fail(dev, ATTNRES_ENODEV, r, "cuDevicePrimaryCtxRetain");
    }
    st->cc = major * 10 + minor;
    st->l2 = l2 > 0 ? (size_t)l2 : (size_t)64 << 20;
    st->ordinal = index;
    choose_binary_form(st);
    dev->simulated = cu.simulated;
    dev->state = st;
    snprintf(dev->backend, sizeof dev->backend, "cuda");
    snprintf(dev->name, sizeof dev->name, "%s", name);
    snprintf(dev->arch, sizeof dev->arch, "sm_%d", st->cc);
    dev->units = sms;
    dev->memory = (int64_t)mem;
    snprintf(dev->driver, sizeof dev->driver, "%d.%d", version / 1000, (version % 1000) / 10);
    ar_nvrtc_identity(dev->compiler, sizeof dev->compiler);
    snprintf(dev->options, sizeof dev->options, "%s", AR_NVRTC_OPTIONS);
    set_target(dev);
    return ATTNRES_OK;
}

static void cuda_close(attnres_device *dev)
{
    cuda_state *st = dev->state;
    if (!st)
        return;
    int pushed;
    if (ctx_enter(st, &pushed) == CU_OK) {
        if (st->stream)
            cu.StreamSynchronize(st->stream);
        if (st->start)
            cu.EventDestroy(st->start);
        if (st->stop)
            cu.EventDestroy(st->stop);
        if (st->flush)
            cu.MemFree(st->flush);
        if (st->empty_module)
            cu.ModuleUnload(st->empty_module);
        if (st->ceiling_module)
            cu.ModuleUnload(st->ceiling_module);
        if (st->stream)
            cu.StreamDestroy(st->stream);
        ctx_leave(pushed);
    }
    cu.DevicePrimaryCtxRelease(st->device);
    pthread_mutex_destroy(&st->lock);
    free(st);
    dev->state = NULL;
}

/* ---- compile and load -------------------------------------------------- */

static int cuda_compile(attnres_device *dev, const char *source, const char *kernel_name, void **blob,
                        size_t *size, char **log)
{
    cuda_state *st = dev->state;
    char arch[32], name[200], err[768];
    snprintf(arch, sizeof arch, "sm_%d", st->compile_cc);
    snprintf(name, sizeof name, "%.150s.cu", kernel_name ? kernel_name : "kernel");
    int rc = ar_nvrtc_compile(source, name, arch, st->cubin, blob, size, log, NULL, err, sizeof err);
    if (rc != ATTNRES_OK)
        return ar_device_fail(dev, rc, "NVRTC could not compile %s: %s", kernel_name ? kernel_name : "a kernel", err);
    return ATTNRES_OK;
}

static int is_elf(const void *blob, size_t size)
{
    return size >= 4 && memcmp(blob, "\177ELF", 4) == 0;
}

/* Loads one module image (cubin or PTX) into k. *no_binary is set when the
 * driver answered CUDA_ERROR_NO_BINARY_FOR_GPU to a cubin. */
static int load_image(attnres_device *dev, const void *blob, size_t size, const char *kernel_name,
                      const char *params_json, ar_kernel *k, int *no_binary)
{
    cuda_state *st = dev->state;
    if (!blob || !size || !kernel_name)
        return ar_device_fail(dev, ATTNRES_EINVAL, "no binary or kernel name to load");
    char why[200];
    if (!ar_kernel_abi_ok(AR_CUDA_ABI_VERSIONS, ar_json_int(params_json, "abi", -1),
                          ar_json_int(params_json, "abi_op", -1), why, sizeof why))
        return ar_device_fail(dev, ATTNRES_ELOAD, "kernel %s: %s", kernel_name, why);
    int64_t block = ar_json_int(params_json, "block", -1);
    int64_t tpb = ar_json_int(params_json, "tokens_per_block", 1);
    int64_t smem = ar_json_int(params_json, "smem", 0);
    int64_t align = ar_json_int(params_json, "align", 16);
    int64_t qalign = ar_json_int(params_json, "qalign", 16);
    int64_t dmax = ar_json_int(params_json, "dmax", 0);
    if (block < 1 || block > 1024 || tpb < 1 || tpb > block || smem < 0 || smem > (1 << 20) || align < 1 ||
        align > 256 || qalign < 1 || qalign > 256 || dmax < 0)
        return ar_device_fail(dev, ATTNRES_ELOAD, "kernel %s has invalid launch data %s", kernel_name,
                              params_json ? params_json : "(none)");
    cuda_kernel *ck = calloc(1, sizeof *ck);
    if (!ck)
        return ar_device_fail(dev, ATTNRES_ENOMEM, "out of memory");
    /* PTX must reach the driver NUL-terminated. */
    char *text = NULL;
    const void *image = blob;
    if (!is_elf(blob, size) && ((const char *)blob)[size - 1] != 0) {
        text = malloc(size + 1);
        if (!text) {
            free(ck);
            return ar_device_fail(dev, ATTNRES_ENOMEM, "out of memory");
        }
        memcpy(text, blob, size);
        text[size] = 0;
        image = text;
    }
    int pushed, status = ATTNRES_OK;
    CUresult r = ctx_enter(st, &pushed);
    if (r != CU_OK) {
        free(text);
        free(ck);
        return cuda_fail(dev, ATTNRES_ELOAD, r, "making the CUDA context current");
    }
    CUfunction fn = NULL;
    int max_threads = 0;
    if ((r = cu.ModuleLoadData(&ck->module, image)) != CU_OK) {
        ck->module = NULL;
        *no_binary = r == CU_ERROR_NO_BINARY_FOR_GPU && is_elf(blob, size);
        status = cuda_fail(dev, ATTNRES_ELOAD, r, "cuModuleLoadData");
    } else if ((r = cu.ModuleGetFunction(&fn, ck->module, kernel_name)) != CU_OK) {
        status = cuda_fail(dev, ATTNRES_ELOAD, r, "cuModuleGetFunction");
    } else if ((r = cu.FuncGetAttribute(&max_threads, CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK, fn)) != CU_OK) {
        status = cuda_fail(dev, ATTNRES_ELOAD, r, "cuFuncGetAttribute");
    } else if (max_threads < block) {
        status = ar_device_fail(dev, ATTNRES_ELOAD, "kernel %s runs at most %d threads per block on %s, not %lld",
                                kernel_name, max_threads, dev->arch, (long long)block);
    } else if (smem > 48 * 1024 &&
               (r = cu.FuncSetAttribute(fn, CU_FUNC_ATTR_MAX_DYNAMIC_SHARED, (int)smem)) != CU_OK) {
        status = cuda_fail(dev, ATTNRES_ELOAD, r, "allowing the kernel's dynamic shared memory");
    }
    if (status != ATTNRES_OK && ck->module)
        cu.ModuleUnload(ck->module);
    ctx_leave(pushed);
    free(text);
    if (status != ATTNRES_OK) {
        free(ck);
        return status;
    }
    ck->align = (int32_t)align;
    ck->qalign = (int32_t)qalign;
    ck->dmax = dmax;
    k->module = ck;
    k->entry = fn;
    k->threads = (int32_t)block;
    k->tokens_per_block = (int32_t)tpb;
    k->smem = (int32_t)smem;
    snprintf(k->kernel_name, sizeof k->kernel_name, "%s", kernel_name);
    return ATTNRES_OK;
}

/* Loads a binary; when the driver has no code for this GPU in a cubin, the
 * device switches to PTX (set_target changes its build keys) and, given the
 * source, the kernel is compiled as PTX and loaded once more. */
static int cuda_load(attnres_device *dev, const void *blob, size_t size, const char *source,
                     const char *kernel_name, const char *params_json, ar_kernel *k)
{
    int no_binary = 0;
    int rc = load_image(dev, blob, size, kernel_name, params_json, k, &no_binary);
    if (rc == ATTNRES_OK || !no_binary)
        return rc;
    char first[512];
    snprintf(first, sizeof first, "%.500s", attnres_device_errmsg(dev));
    switch_to_ptx(dev);
    if (!source)
        return ar_device_fail(dev, ATTNRES_ELOAD,
                              "%.400s; the device takes PTX from now on (target %.200s), and a recompile from "
                              "source will load",
                              first, dev->target);
    void *ptx = NULL;
    size_t ptx_size = 0;
    if ((rc = cuda_compile(dev, source, kernel_name, &ptx, &ptx_size, NULL)) != ATTNRES_OK)
        return rc;
    rc = load_image(dev, ptx, ptx_size, kernel_name, params_json, k, &no_binary);
    free(ptx);
    if (rc != ATTNRES_OK)
        return rc;
    /* The kernel now is the PTX build: name it by that build's key. */
    char hash[65];
    ar_sha256_string(source, hash);
    ar_build_key(dev, hash, k->build_key);
    return ATTNRES_OK;
}

static int cuda_load_generic(attnres_device *dev, const attnres_problem *p, ar_kernel *k)
{
    const attnres_dtype dtype = p->dtype;
    if ((unsigned)p->op > ATTNRES_OP_PHASE2 || (unsigned)dtype > ATTNRES_DTYPE_F16)
        return ar_device_fail(dev, ATTNRES_EINVAL, "no generic kernel for op %d and dtype %d", (int)p->op,
                              (int)dtype);
    const cuda_generic *gk = &cuda_generics[p->op][dtype];
    const char *source = gk->source, *kernel = gk->kernel, *params = gk->params, *variant = gk->variant;
    memset(k, 0, sizeof *k);
    char hash[65], path[4200];
    ar_sha256_string(source, hash);
    ar_build_key(dev, hash, k->build_key);
    void *blob = NULL;
    size_t size = 0;
    int cache = ar_cache_path(k->build_key, ((cuda_state *)dev->state)->cubin ? ".cubin" : ".ptx", path,
                              sizeof path) == 0;
    int rc = ATTNRES_ELOAD;
    if (cache && ar_read_file(path, &blob, &size) == 0) {
        rc = cuda_load(dev, blob, size, source, kernel, params, k);
        free(blob);
        blob = NULL;
    }
    if (rc != ATTNRES_OK) { /* not cached, or a damaged entry: compile */
        if ((rc = cuda_compile(dev, source, kernel, &blob, &size, NULL)) != ATTNRES_OK)
            return rc;
        if (cache)
            ar_cache_store(path, blob, size); /* best effort */
        rc = cuda_load(dev, blob, size, source, kernel, params, k);
        free(blob);
        if (rc != ATTNRES_OK)
            return rc;
    }
    snprintf(k->variant, sizeof k->variant, "%s", variant);
    return ATTNRES_OK;
}

static void cuda_unload(attnres_device *dev, ar_kernel *k)
{
    cuda_kernel *ck = k->module;
    if (ck) {
        int pushed;
        if (ck->module && ctx_enter(dev->state, &pushed) == CU_OK) {
            cu.ModuleUnload(ck->module);
            ctx_leave(pushed);
        }
        free(ck);
    }
    k->module = NULL;
    k->entry = NULL;
}

/* The dynamic shared memory phase 1's softmax weights take per block. */
static int64_t phase1_weights_smem(const attnres_problem *p)
{
    return ((int64_t)p->n * p->s * p->heads + (int64_t)p->n * p->heads + p->n) * (int64_t)sizeof(float);
}

/* What no CUDA kernel runs, refused when the plan is made: the launch
 * checks below stay for launches outside a plan (the tuner's). */
static int cuda_check_problem(attnres_device *dev, const attnres_problem *p)
{
    const int n = p->n, S = p->s, H = p->heads;
    if (p->op == ATTNRES_OP_MIX && n > AR_CUDA_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the CUDA kernels take at most %d sources (N = %d)",
                              AR_CUDA_MAX_SOURCES, n);
    if (p->op == ATTNRES_OP_PHASE1) {
        if (n > AR_CUDA_PHASE1_MAX_SOURCES || S > AR_CUDA_PHASE1_MAX_SITES)
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "the CUDA phase1 kernels take at most %d sources and %d sites (N = %d, S = %d)",
                                  AR_CUDA_PHASE1_MAX_SOURCES, AR_CUDA_PHASE1_MAX_SITES, n, S);
        const int64_t smem = phase1_weights_smem(p);
        if (smem > AR_CUDA_PHASE1_MAX_SMEM)
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "phase1 with N = %d, S = %d, H = %d needs %lld bytes of shared memory, over the %d "
                                  "a CUDA phase1 kernel may use",
                                  n, S, H, (long long)smem, AR_CUDA_PHASE1_MAX_SMEM);
    }
    if (p->op == ATTNRES_OP_PHASE2 && H > AR_CUDA_PHASE2_MAX_HEADS)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the CUDA phase2 kernels take at most %d heads (H = %d)",
                              AR_CUDA_PHASE2_MAX_HEADS, H);
    return ATTNRES_OK;
}

/* ---- launch ------------------------------------------------------------ */

static int misaligned(const void *p, int64_t align)
{
    return align > 1 && (uintptr_t)p % (uintptr_t)align != 0;
}

/* Fills the by-value argument struct; EINVAL/EMISMATCH with a message when
 * the arguments cannot be run by this kernel. No allocation. */
static int fill_mix(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                     const attnres_mix_args *a, attnres_cuda_mix_args *args)
{
    const cuda_kernel *ck = k->module;
    const int n = p->n;
    if (n < 1 || n > AR_CUDA_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA kernels take 1 to %d sources, not %d",
                              AR_CUDA_MAX_SOURCES, n);
    if (!ck || !k->entry)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded");
    if (ck->dmax && p->d > ck->dmax)
        return ar_device_fail(dev, ATTNRES_EMISMATCH, "d = %lld exceeds the %lld that kernel %s handles",
                              (long long)p->d, (long long)ck->dmax, k->kernel_name);
    if (!a || !a->sources || !a->query || !a->out)
        return ar_device_fail(dev, ATTNRES_EINVAL, "sources, query and out are required");
    if (p->form == ATTNRES_FORM_ADDITIVE && !a->partial)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the additive form needs partial");
    if (p->epilogue && (!a->normed || !a->out_gain))
        return ar_device_fail(dev, ATTNRES_EINVAL, "the epilogue needs normed and out_gain");
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype);
    const int64_t align = ck->align;
    for (int i = 0; i < n; i++) {
        const int64_t stride = a->source_strides && a->source_strides[i] ? a->source_strides[i] : p->d;
        if (!a->sources[i])
            return ar_device_fail(dev, ATTNRES_EINVAL, "source %d is NULL", i);
        if (misaligned(a->sources[i], align) || (stride * es) % align != 0)
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "source %d (pointer or stride %lld) is not %lld-byte aligned as kernel %s needs", i,
                                  (long long)stride, (long long)align, k->kernel_name);
        args->src[i] = a->sources[i];
        args->src_stride[i] = stride;
    }
    if (n < AR_CUDA_MAX_SOURCES) {
        memset(&args->src[n], 0, (size_t)(AR_CUDA_MAX_SOURCES - n) * sizeof args->src[0]);
        memset(&args->src_stride[n], 0, (size_t)(AR_CUDA_MAX_SOURCES - n) * sizeof args->src_stride[0]);
    }
    args->d = p->d;
    args->n = n;
    args->heads = p->heads;
    args->T = T;
    args->query = a->query;
    args->scale = a->scale;
    args->eps = a->eps;
    args->partial = p->form == ATTNRES_FORM_ADDITIVE ? a->partial : NULL;
    args->partial_stride = a->partial_stride ? a->partial_stride : p->d;
    args->alpha = a->alpha;
    args->out = a->out;
    args->out_stride = a->out_stride ? a->out_stride : p->d;
    args->out_gain = p->epilogue ? a->out_gain : NULL;
    args->out_eps = a->out_eps;
    args->normed = p->epilogue ? a->normed : NULL;
    args->normed_stride = a->normed_stride ? a->normed_stride : p->d;
    if (misaligned(args->out, align) || (args->out_stride * es) % align ||
        (args->partial && (misaligned(args->partial, align) || (args->partial_stride * es) % align)) ||
        (args->normed && (misaligned(args->normed, align) || (args->normed_stride * es) % align)))
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "out, partial or normed (pointer or stride) is not %lld-byte aligned as kernel %s needs",
                              (long long)align, k->kernel_name);
    if (misaligned(args->query, ck->qalign) || (args->out_gain && misaligned(args->out_gain, ck->qalign)))
        return ar_device_fail(dev, ATTNRES_EINVAL, "query or out_gain is not %d-byte aligned as kernel %s needs",
                              ck->qalign, k->kernel_name);
    return ATTNRES_OK;
}

/* ---- Block AttnRes phases ---------------------------------------------- */

/* A storage view (pointer and token stride in elements) the kernel loads
 * with `align`-byte accesses. */
static int view_misaligned(const void *ptr, int64_t stride, int64_t es, int64_t align)
{
    return misaligned(ptr, align) || (stride * es) % align != 0;
}

/* Fills phase 1's by-value struct and the dynamic shared memory it needs;
 * EINVAL/EUNSUPPORTED with a message when this kernel cannot run them. */
static int fill_phase1(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                       const attnres_phase1_args *a, attnres_cuda_phase1_args *args, int64_t *smem_out)
{
    const cuda_kernel *ck = k->module;
    if (!ck || !k->entry)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded");
    const int n = p->n, S = p->s, H = p->heads;
    if (n < 1 || n > AR_CUDA_PHASE1_MAX_SOURCES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA phase1 kernels take 1 to %d sources, not %d",
                              AR_CUDA_PHASE1_MAX_SOURCES, n);
    if (S < 1 || S > AR_CUDA_PHASE1_MAX_SITES)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA phase1 kernels take 1 to %d sites, not %d",
                              AR_CUDA_PHASE1_MAX_SITES, S);
    if (H < 1 || p->d < 1 || p->d > ((int64_t)1 << 30) || p->d % H)
        return ar_device_fail(dev, ATTNRES_EINVAL, "d = %lld and H = %d are not a valid shape", (long long)p->d, H);
    const int64_t smem = phase1_weights_smem(p);
    if (smem > AR_CUDA_PHASE1_MAX_SMEM)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED,
                              "phase1 with n = %d, S = %d, H = %d needs %lld bytes of shared memory, over the %d "
                              "a CUDA phase1 kernel may use",
                              n, S, H, (long long)smem, AR_CUDA_PHASE1_MAX_SMEM);
    if (!a || !a->sources || !a->queries || !a->o1 || !a->lse)
        return ar_device_fail(dev, ATTNRES_EINVAL, "sources, queries, o1 and lse are required");
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype), align = ck->align;
    memset(args, 0, sizeof *args);
    for (int i = 0; i < n; i++) {
        const int64_t stride = a->source_strides && a->source_strides[i] ? a->source_strides[i] : p->d;
        if (!a->sources[i])
            return ar_device_fail(dev, ATTNRES_EINVAL, "source %d is NULL", i);
        if (view_misaligned(a->sources[i], stride, es, align))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "source %d (pointer or stride %lld) is not %lld-byte aligned as kernel %s needs", i,
                                  (long long)stride, (long long)align, k->kernel_name);
        args->src[i] = a->sources[i];
        args->src_stride[i] = stride;
    }
    args->o1_stride = a->o1_stride ? a->o1_stride : p->d;
    args->lse_stride = a->lse_stride ? a->lse_stride : H;
    for (int j = 0; j < S; j++) {
        if (!a->o1[j] || !a->lse[j])
            return ar_device_fail(dev, ATTNRES_EINVAL, "o1 or lse of site %d is NULL", j);
        if (view_misaligned(a->o1[j], args->o1_stride, es, align) || misaligned(a->lse[j], 4))
            return ar_device_fail(dev, ATTNRES_EINVAL,
                                  "o1 of site %d (pointer or stride) is not %lld-byte aligned as kernel %s needs, "
                                  "or its lse is not 4-byte aligned",
                                  j, (long long)align, k->kernel_name);
        args->o1[j] = a->o1[j];
        args->lse[j] = a->lse[j];
    }
    if (misaligned(a->queries, ck->qalign))
        return ar_device_fail(dev, ATTNRES_EINVAL, "queries is not %d-byte aligned as kernel %s needs", ck->qalign,
                              k->kernel_name);
    args->d = p->d;
    args->n = n;
    args->heads = H;
    args->s = S;
    args->T = T;
    args->queries = a->queries;
    args->scale = a->scale;
    args->eps = a->eps;
    *smem_out = smem + k->smem;
    return ATTNRES_OK;
}

/* Fills phase 2's by-value struct; EINVAL/EUNSUPPORTED with a message when
 * this kernel cannot run the arguments. */
static int fill_phase2(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                       const attnres_phase2_args *a, attnres_cuda_phase2_args *args)
{
    const cuda_kernel *ck = k->module;
    if (!ck || !k->entry)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded");
    const int H = p->heads;
    if (H < 1 || H > AR_CUDA_PHASE2_MAX_HEADS)
        return ar_device_fail(dev, ATTNRES_EUNSUPPORTED, "CUDA phase2 kernels take 1 to %d heads, not %d",
                              AR_CUDA_PHASE2_MAX_HEADS, H);
    if (p->d < 1 || p->d > ((int64_t)1 << 30) || p->d % H)
        return ar_device_fail(dev, ATTNRES_EINVAL, "d = %lld and H = %d are not a valid shape", (long long)p->d, H);
    if (!a || !a->o1 || !a->lse || !a->partial || !a->query || !a->out)
        return ar_device_fail(dev, ATTNRES_EINVAL, "o1, lse, partial, query and out are required");
    if (p->fuse_add && !a->sublayer)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the fused add needs sublayer");
    if (p->epilogue && (!a->normed || !a->out_gain))
        return ar_device_fail(dev, ATTNRES_EINVAL, "the epilogue needs normed and out_gain");
    const int64_t es = (int64_t)attnres_dtype_size(p->dtype), align = ck->align;
    memset(args, 0, sizeof *args);
    args->d = p->d;
    args->heads = H;
    args->T = T;
    args->o1 = a->o1;
    args->o1_stride = a->o1_stride ? a->o1_stride : p->d;
    args->lse = a->lse;
    args->lse_stride = a->lse_stride ? a->lse_stride : H;
    args->partial = a->partial;
    args->partial_stride = a->partial_stride ? a->partial_stride : p->d;
    args->sublayer = p->fuse_add ? a->sublayer : NULL;
    args->sublayer_stride = a->sublayer_stride ? a->sublayer_stride : p->d;
    args->query = a->query;
    args->scale = a->scale;
    args->eps = a->eps;
    args->out = a->out;
    args->out_stride = a->out_stride ? a->out_stride : p->d;
    args->out_gain = p->epilogue ? a->out_gain : NULL;
    args->out_eps = a->out_eps;
    args->normed = p->epilogue ? a->normed : NULL;
    args->normed_stride = a->normed_stride ? a->normed_stride : p->d;
    if (view_misaligned(args->o1, args->o1_stride, es, align) ||
        view_misaligned(args->partial, args->partial_stride, es, align) ||
        view_misaligned(args->out, args->out_stride, es, align) ||
        (args->sublayer && view_misaligned(args->sublayer, args->sublayer_stride, es, align)) ||
        (args->normed && view_misaligned(args->normed, args->normed_stride, es, align)))
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "o1, partial, sublayer, out or normed (pointer or stride) is not %lld-byte aligned as "
                              "kernel %s needs",
                              (long long)align, k->kernel_name);
    if (misaligned(args->lse, 4) || misaligned(args->query, ck->qalign) ||
        (args->out_gain && misaligned(args->out_gain, ck->qalign)))
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "lse is not 4-byte aligned, or query or out_gain is not %d-byte aligned as kernel %s "
                              "needs",
                              ck->qalign, k->kernel_name);
    return ATTNRES_OK;
}

/* ---- the op-generic launch --------------------------------------------- */

/* Everything one launch needs, prepared before the context is entered: the
 * by-value argument struct of the op, the grid and the dynamic shared
 * memory. It lives on the caller's stack: a launch allocates nothing. */
typedef struct cuda_launch_data {
    union {
        attnres_cuda_mix_args mix;
        attnres_cuda_phase1_args phase1;
        attnres_cuda_phase2_args phase2;
    } args;
    int64_t grid, smem;
} cuda_launch_data;

/* Checks the tagged arguments against the problem and the kernel and fills
 * l; T must be positive. Mix kernels handle tokens_per_block tokens per
 * block, the phase kernels one token per block (cuda_phase_abi.h). */
static int prepare(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                   const ar_op_args *a, cuda_launch_data *l)
{
    if (!a || a->op != p->op)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the arguments are for op %d, the problem is op %d",
                              a ? (int)a->op : -1, (int)p->op);
    if (!k->module || !k->entry)
        return ar_device_fail(dev, ATTNRES_EINVAL, "the kernel is not loaded");
    int rc;
    switch (a->op) {
    case ATTNRES_OP_MIX:
        rc = fill_mix(dev, k, p, T, a->mix, &l->args.mix);
        l->grid = (T + k->tokens_per_block - 1) / k->tokens_per_block;
        l->smem = k->smem;
        break;
    case ATTNRES_OP_PHASE1:
        rc = fill_phase1(dev, k, p, T, a->phase1, &l->args.phase1, &l->smem);
        l->grid = T;
        break;
    case ATTNRES_OP_PHASE2:
        rc = fill_phase2(dev, k, p, T, a->phase2, &l->args.phase2);
        l->grid = T;
        l->smem = k->smem;
        break;
    default:
        return ar_device_fail(dev, ATTNRES_EINVAL, "unknown op %d", (int)a->op);
    }
    if (rc == ATTNRES_OK && l->grid > 0x7fffffff)
        return ar_device_fail(dev, ATTNRES_EINVAL, "T = %lld needs more than 2^31-1 blocks", (long long)T);
    return rc;
}

/* Launches prepared work on `stream` with the context already current. */
static int launch_current(attnres_device *dev, const ar_kernel *k, cuda_launch_data *l, CUstream stream)
{
    void *params[] = {&l->args};
    CUresult r = cu.LaunchKernel((CUfunction)k->entry, (unsigned)l->grid, 1, 1, (unsigned)k->threads, 1, 1,
                                 (unsigned)l->smem, stream, params, NULL);
    if (r != CU_OK) {
        char what[256];
        snprintf(what, sizeof what, "launching %s", k->kernel_name);
        return cuda_fail(dev, ATTNRES_ELAUNCH, r, what);
    }
    return ATTNRES_OK;
}

static int cuda_launch(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                       const ar_op_args *a, void *stream)
{
    if (T == 0)
        return ATTNRES_OK;
    if (T < 0)
        return ar_device_fail(dev, ATTNRES_EINVAL, "T = %lld is negative", (long long)T);
    cuda_launch_data l;
    int rc = prepare(dev, k, p, T, a, &l);
    if (rc != ATTNRES_OK)
        return rc;
    int pushed;
    CUresult r = ctx_enter(dev->state, &pushed);
    if (r != CU_OK)
        return cuda_fail(dev, ATTNRES_ELAUNCH, r, "making the CUDA context current");
    rc = launch_current(dev, k, &l, (CUstream)stream);
    ctx_leave(pushed);
    return rc;
}

/* ---- memory and timing ------------------------------------------------- */

static int cuda_mem_alloc(attnres_device *dev, size_t bytes, void **ptr)
{
    *ptr = NULL;
    int pushed;
    CUresult r = ctx_enter(dev->state, &pushed);
    if (r != CU_OK)
        return cuda_fail(dev, ATTNRES_ENOMEM, r, "making the CUDA context current");
    CUdeviceptr p = 0;
    r = cu.MemAlloc(&p, bytes ? bytes : 256);
    ctx_leave(pushed);
    if (r != CU_OK) {
        char what[96];
        snprintf(what, sizeof what, "allocating %zu bytes on the GPU", bytes);
        return cuda_fail(dev, ATTNRES_ENOMEM, r, what);
    }
    *ptr = (void *)(uintptr_t)p;
    return ATTNRES_OK;
}

static void cuda_mem_free(attnres_device *dev, void *ptr)
{
    if (!ptr)
        return;
    int pushed;
    if (ctx_enter(dev->state, &pushed) == CU_OK) {
        cu.MemFree((CUdeviceptr)(uintptr_t)ptr);
        ctx_leave(pushed);
    }
}

static int cuda_copy_to_device(attnres_device *dev, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return ATTNRES_OK;
    int pushed;
    CUresult r = ctx_enter(dev->state, &pushed);
    if (r == CU_OK) {
        r = cu.MemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes);
        ctx_leave(pushed);
    }
    return r == CU_OK ? ATTNRES_OK : cuda_fail(dev, ATTNRES_EIO, r, "copying to the GPU");
}

static int cuda_copy_to_host(attnres_device *dev, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return ATTNRES_OK;
    int pushed;
    CUresult r = ctx_enter(dev->state, &pushed);
    if (r == CU_OK) {
        r = cu.MemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes);
        ctx_leave(pushed);
    }
    return r == CU_OK ? ATTNRES_OK : cuda_fail(dev, ATTNRES_EIO, r, "copying from the GPU");
}

/* The stream and events timing uses; with st->lock held, context current. */
static CUresult timing_setup(cuda_state *st)
{
    CUresult r = CU_OK;
    if (!st->stream && (r = cu.StreamCreate(&st->stream, CU_STREAM_NON_BLOCKING)) != CU_OK)
        return r;
    if (!st->start && (r = cu.EventCreate(&st->start, CU_EVENT_DEFAULT)) != CU_OK)
        return r;
    if (!st->stop && (r = cu.EventCreate(&st->stop, CU_EVENT_DEFAULT)) != CU_OK)
        return r;
    return CU_OK;
}

/* Milliseconds between start and stop, recorded around work on st->stream. */
static CUresult elapsed_ms(cuda_state *st, float *ms)
{
    CUresult r = cu.EventSynchronize(st->stop);
    if (r == CU_OK)
        r = cu.EventElapsedTime(ms, st->start, st->stop);
    return r;
}

/* One call of the timing helpers: lock, context, stream and events. */
static int timing_enter(attnres_device *dev, int *pushed)
{
    cuda_state *st = dev->state;
    pthread_mutex_lock(&st->lock);
    CUresult r = ctx_enter(st, pushed);
    if (r == CU_OK && (r = timing_setup(st)) != CU_OK)
        ctx_leave(*pushed);
    if (r != CU_OK) {
        pthread_mutex_unlock(&st->lock);
        return cuda_fail(dev, ATTNRES_ELAUNCH, r, "preparing the timing stream");
    }
    return ATTNRES_OK;
}

static void timing_leave(attnres_device *dev, int pushed)
{
    cuda_state *st = dev->state;
    ctx_leave(pushed);
    pthread_mutex_unlock(&st->lock);
}

/* Times reps launches of any op with events around each, on the device's
 * own timing stream; with flush, an L2-sized memset before each launch
 * makes every launch read from DRAM, as a model's sites do. */
static int cuda_time(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                     const ar_op_args *a, int reps, int flush, double *times_us)
{
    cuda_state *st = dev->state;
    if (reps < 1)
        return ATTNRES_OK;
    if (T < 0)
        return ar_device_fail(dev, ATTNRES_EINVAL, "T = %lld is negative", (long long)T);
    cuda_launch_data l;
    int rc = T > 0 ? prepare(dev, k, p, T, a, &l) : ATTNRES_OK;
    if (rc != ATTNRES_OK)
        return rc;
    int pushed;
    if ((rc = timing_enter(dev, &pushed)) != ATTNRES_OK)
        return rc;
    CUresult r = CU_OK;
    if (flush && !st->flush) {
        /* Writing twice the L2's size evicts everything the kernel read. */
        size_t bytes = 2 * st->l2;
        if (bytes < ((size_t)64 << 20))
            bytes = (size_t)64 << 20;
        if ((r = cu.MemAlloc(&st->flush, bytes)) != CU_OK) {
            st->flush = 0;
            rc = cuda_fail(dev, ATTNRES_ENOMEM, r, "allocating the L2 flush buffer");
            goto done;
        }
        st->flush_bytes = bytes;
    }
    for (int i = 0; i < reps; i++) {
        if (flush && (r = cu.MemsetD8Async(st->flush, (unsigned char)i, st->flush_bytes, st->stream)) != CU_OK) {
            rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "flushing the L2 cache");
            goto done;
        }
        if ((r = cu.EventRecord(st->start, st->stream)) != CU_OK) {
            rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "cuEventRecord");
            goto done;
        }
        if (T > 0 && (rc = launch_current(dev, k, &l, st->stream)) != ATTNRES_OK)
            goto done;
        float ms = 0.0f;
        if ((r = cu.EventRecord(st->stop, st->stream)) != CU_OK || (r = elapsed_ms(st, &ms)) != CU_OK) {
            rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "timing the kernel");
            goto done;
        }
        times_us[i] = (double)ms * 1e3;
    }
done:
    timing_leave(dev, pushed);
    return rc;
}

/* Best of several device-to-device copies of 256 MiB: bytes read + written
 * per second, as DESIGN §2 counts. */
static int cuda_copy_bandwidth(attnres_device *dev, double *gbps)
{
    cuda_state *st = dev->state;
    size_t bytes = (size_t)256 << 20;
    if (dev->memory > 0 && (int64_t)bytes * 8 > dev->memory)
        bytes = (size_t)(dev->memory / 8) & ~(size_t)4095;
    int pushed, rc;
    if ((rc = timing_enter(dev, &pushed)) != ATTNRES_OK)
        return rc;
    CUdeviceptr a = 0, b = 0;
    CUresult r;
    double best = 1e30;
    if ((r = cu.MemAlloc(&a, bytes)) != CU_OK || (r = cu.MemAlloc(&b, bytes)) != CU_OK) {
        rc = cuda_fail(dev, ATTNRES_ENOMEM, r, "allocating copy buffers");
        goto done;
    }
    if ((r = cu.MemsetD8Async(a, 1, bytes, st->stream)) != CU_OK ||
        (r = cu.MemcpyDtoDAsync(b, a, bytes, st->stream)) != CU_OK ||
        (r = cu.StreamSynchronize(st->stream)) != CU_OK) {
        rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "warming up the copy");
        goto done;
    }
    for (int i = 0; i < 7; i++) {
        float ms = 0.0f;
        if ((r = cu.EventRecord(st->start, st->stream)) != CU_OK ||
            (r = cu.MemcpyDtoDAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, st->stream)) != CU_OK ||
            (r = cu.EventRecord(st->stop, st->stream)) != CU_OK || (r = elapsed_ms(st, &ms)) != CU_OK) {
            rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "timing a device copy");
            goto done;
        }
        if (ms > 0 && ms < best)
            best = ms;
    }
    *gbps = best < 1e30 ? 2.0 * (double)bytes / (best * 1e-3) / 1e9 : 0.0;
done:
    if (a)
        cu.MemFree(a);
    if (b)
        cu.MemFree(b);
    timing_leave(dev, pushed);
    return rc;
}

/* The streaming kernels of the ceilings (docs/design.md §2), compiled by
 * NVRTC like every kernel: a grid-stride read-only sum with 16-byte loads,
 * two loads in flight per thread and step, and a grid-stride copy. The sum
 * is stored only when it equals a value that a buffer of 0x01 bytes never
 * sums to, so every load must happen and nothing is written. */
static const char ceiling_source[] =
    "extern \"C\" __global__ void attnres_ceiling_read(const float4 *__restrict__ x, unsigned long long n,\n"
    "                                                  float *out)\n"
    "{\n"
    "    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n"
    "    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    float4 s = make_float4(0.f, 0.f, 0.f, 0.f), t = s;\n"
    "    for (; i + stride < n; i += 2 * stride) {\n"
    "        float4 a = x[i], b = x[i + stride];\n"
    "        s.x += a.x; s.y += a.y; s.z += a.z; s.w += a.w;\n"
    "        t.x += b.x; t.y += b.y; t.z += b.z; t.w += b.w;\n"
    "    }\n"
    "    if (i < n) {\n"
    "        float4 a = x[i];\n"
    "        s.x += a.x; s.y += a.y; s.z += a.z; s.w += a.w;\n"
    "    }\n"
    "    float v = s.x + s.y + s.z + s.w + t.x + t.y + t.z + t.w;\n"
    "    if (v == -1234.5f)\n"
    "        out[0] = v;\n"
    "}\n"
    "extern \"C\" __global__ void attnres_ceiling_copy(const float4 *__restrict__ x, float4 *__restrict__ y,\n"
    "                                                  unsigned long long n)\n"
    "{\n"
    "    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;\n"
    "    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)\n"
    "        y[i] = x[i];\n"
    "}\n";

/* The best of reps timed launches of f (grid blocks of 256 threads). */
static CUresult time_grid(cuda_state *st, CUfunction f, unsigned grid, void **args, int reps, float *best_ms)
{
    CUresult r = cu.LaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, st->stream, args, NULL); /* warm-up */
    *best_ms = 0.0f;
    for (int i = 0; r == CU_OK && i < reps; i++) {
        float ms = 0.0f;
        if ((r = cu.EventRecord(st->start, st->stream)) != CU_OK ||
            (r = cu.LaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, st->stream, args, NULL)) != CU_OK ||
            (r = cu.EventRecord(st->stop, st->stream)) != CU_OK || (r = elapsed_ms(st, &ms)) != CU_OK)
            break;
        if (ms > 0 && (*best_ms == 0.0f || ms < *best_ms))
            *best_ms = ms;
    }
    return r;
}

/* Compiles and loads the streaming kernels once per device; called between
 * timing_enter and timing_leave (under the lock, in the context). */
static int ceiling_kernels(attnres_device *dev)
{
    cuda_state *st = dev->state;
    if (st->ceiling_module)
        return ATTNRES_OK;
    void *image = NULL;
    size_t image_size = 0;
    char arch[32], err[768];
    snprintf(arch, sizeof arch, "sm_%d", st->compile_cc);
    int rc = ar_nvrtc_compile(ceiling_source, "attnres_ceilings.cu", arch, st->cubin, &image, &image_size, NULL,
                              NULL, err, sizeof err);
    if (rc != ATTNRES_OK)
        return ar_device_fail(dev, rc, "NVRTC could not compile the ceiling kernels: %s", err);
    CUmodule module = NULL;
    CUresult r;
    if ((r = cu.ModuleLoadData(&module, image)) != CU_OK ||
        (r = cu.ModuleGetFunction(&st->ceiling_read, module, "attnres_ceiling_read")) != CU_OK ||
        (r = cu.ModuleGetFunction(&st->ceiling_copy, module, "attnres_ceiling_copy")) != CU_OK) {
        if (module)
            cu.ModuleUnload(module);
        free(image);
        return cuda_fail(dev, ATTNRES_ELOAD, r, "loading the ceiling kernels");
    }
    free(image);
    st->ceiling_module = module;
    return ATTNRES_OK;
}

/* The driver's copy (copy_bandwidth), and the grid-stride read and copy
 * kernels at 2, 4 and 8 blocks of 256 threads per SM ("threads" of a point
 * is blocks per SM). On the simulated driver, whose times are a model, over
 * 256 KiB at 4 blocks per SM only: it proves the kernels run and are
 * recorded, not how fast. */
static int cuda_ceilings(attnres_device *dev, ar_ceilings *out)
{
    cuda_state *st = dev->state;
    int rc;
    memset(out, 0, sizeof *out);
    out->fma_gflops = NAN;
    out->cache_bytes = (double)st->l2;
    double copy = 0.0;
    if ((rc = cuda_copy_bandwidth(dev, &copy)) != ATTNRES_OK)
        return rc;
    /* Each point is the fastest of its launches, median and best alike: a
     * GPU's launches vary far less than a shared host's loops. */
    out->pt[out->n++] = (ar_ceiling_point){"memcpy-dtod", AR_CEILING_COPY, 0, copy, copy};

    size_t bytes = dev->simulated ? (size_t)256 << 10 : (size_t)256 << 20;
    if (!dev->simulated && dev->memory > 0 && (int64_t)bytes * 8 > dev->memory)
        bytes = (size_t)(dev->memory / 8) & ~(size_t)4095;
    const int per_sm[] = {2, 4, 8}, reps = dev->simulated ? 1 : 7;
    int pushed;
    if ((rc = timing_enter(dev, &pushed)) != ATTNRES_OK)
        return rc;
    CUdeviceptr a = 0, b = 0;
    CUresult r;
    if ((rc = ceiling_kernels(dev)) != ATTNRES_OK)
        goto done;
    CUfunction fread_k = st->ceiling_read, fcopy_k = st->ceiling_copy;
    if ((r = cu.MemAlloc(&a, bytes)) != CU_OK || (r = cu.MemAlloc(&b, bytes)) != CU_OK) {
        rc = cuda_fail(dev, ATTNRES_ENOMEM, r, "allocating the ceiling buffers");
        goto done;
    }
    if ((r = cu.MemsetD8Async(a, 1, bytes, st->stream)) != CU_OK ||
        (r = cu.StreamSynchronize(st->stream)) != CU_OK) {
        rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "filling the ceiling buffers");
        goto done;
    }
    unsigned long long n = bytes / 16;
    for (size_t k = 0; k < sizeof per_sm / sizeof per_sm[0]; k++) {
        if (dev->simulated && per_sm[k] != 4)
            continue;
        unsigned grid = (unsigned)(per_sm[k] * (dev->units > 0 ? dev->units : 1));
        void *read_args[] = {&a, &n, &b}, *copy_args[] = {&a, &b, &n};
        float ms_read = 0.0f, ms_copy = 0.0f;
        if ((r = time_grid(st, fread_k, grid, read_args, reps, &ms_read)) != CU_OK ||
            (r = time_grid(st, fcopy_k, grid, copy_args, reps, &ms_copy)) != CU_OK) {
            rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "timing the ceiling kernels");
            goto done;
        }
        if (out->n + 2 > AR_CEILING_POINTS)
            break;
        const double read = ms_read > 0 ? (double)bytes / (ms_read * 1e-3) / 1e9 : 0.0;
        const double copied = ms_copy > 0 ? 2.0 * (double)bytes / (ms_copy * 1e-3) / 1e9 : 0.0;
        out->pt[out->n++] = (ar_ceiling_point){"read", AR_CEILING_READ, per_sm[k], read, read};
        out->pt[out->n++] = (ar_ceiling_point){"copy", AR_CEILING_COPY, per_sm[k], copied, copied};
    }
done:
    if (a)
        cu.MemFree(a);
    if (b)
        cu.MemFree(b);
    timing_leave(dev, pushed);
    return rc;
}

/* The most blocks of 256 threads per SM a stream pass step may ask for:
 * beyond an SM's 2048 resident threads the grid only queues. */
enum { PASS_MAX_PER_SM = 32 };

/* Checks one step of a pass (device.h, ar_stream_pass) and sets *out to 1
 * for the read kernel, 2 for the grid-stride copy, 3 for the driver's copy. */
static int pass_step_kind(attnres_device *dev, int s, const ar_stream_step *st, CUdeviceptr base, int *out)
{
    const int kind = strcmp(st->kernel, "read") == 0          ? 1
                     : strcmp(st->kernel, "copy") == 0        ? 2
                     : strcmp(st->kernel, "memcpy-dtod") == 0 ? 3
                                                              : 0;
    if (!kind)
        return ar_device_fail(dev, ATTNRES_EINVAL, "stream pass step %d: no streaming kernel '%s'", s, st->kernel);
    if (kind == 3 && st->threads != 0)
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "stream pass step %d: memcpy-dtod is the driver's copy and takes 0 blocks per SM, "
                              "not %d",
                              s, st->threads);
    if (kind != 3 && (st->threads < 1 || st->threads > PASS_MAX_PER_SM))
        return ar_device_fail(dev, ATTNRES_EINVAL, "stream pass step %d: %d blocks per SM; it takes 1 to %d", s,
                              st->threads, PASS_MAX_PER_SM);
    if (st->bytes == 0 || st->bytes % 4096 || st->offset % 64)
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "stream pass step %d: %zu bytes at offset %zu; bytes must be a positive multiple "
                              "of 4096 and the offset of 64",
                              s, st->bytes, st->offset);
    /* The grid-stride kernels load whole 16-byte vectors. */
    if ((base + st->offset) % 16)
        return ar_device_fail(dev, ATTNRES_EINVAL,
                              "stream pass step %d: the buffer at offset %zu is not 16-byte aligned", s, st->offset);
    *out = kind;
    return ATTNRES_OK;
}

/* One pass of the streaming kernels over buf, timed by events around all
 * of its steps on the timing stream: a read step reads its bytes, a copy
 * step (grid-stride, or the driver's) writes as many right after them. The
 * read kernel stores nothing unless its bytes sum to -1234.5, which the
 * ones that the tuner fills a pass's buffer with never do. */
static int cuda_stream_pass(attnres_device *dev, void *buf, const ar_stream_pass *pass, double *us)
{
    cuda_state *st = dev->state;
    const CUdeviceptr base = (CUdeviceptr)(uintptr_t)buf;
    int kinds[AR_STREAM_STEPS] = {0}, rc;
    for (int s = 0; s < AR_STREAM_STEPS; s++)
        if (pass->step[s].kernel && (rc = pass_step_kind(dev, s, &pass->step[s], base, &kinds[s])) != ATTNRES_OK)
            return rc;
    int pushed;
    if ((rc = timing_enter(dev, &pushed)) != ATTNRES_OK)
        return rc;
    if ((rc = ceiling_kernels(dev)) != ATTNRES_OK)
        goto done;
    CUresult r = cu.EventRecord(st->start, st->stream);
    for (int s = 0; r == CU_OK && s < AR_STREAM_STEPS; s++) {
        const ar_stream_step *step = &pass->step[s];
        CUdeviceptr x = base + step->offset, y = x + step->bytes;
        unsigned long long n = step->bytes / 16;
        const unsigned grid = (unsigned)step->threads * (unsigned)(dev->units > 0 ? dev->units : 1);
        void *read_args[] = {&x, &n, &x}, *copy_args[] = {&x, &y, &n};
        if (kinds[s] == 1)
            r = cu.LaunchKernel(st->ceiling_read, grid, 1, 1, 256, 1, 1, 0, st->stream, read_args, NULL);
        else if (kinds[s] == 2)
            r = cu.LaunchKernel(st->ceiling_copy, grid, 1, 1, 256, 1, 1, 0, st->stream, copy_args, NULL);
        else if (kinds[s] == 3)
            r = cu.MemcpyDtoDAsync(y, x, step->bytes, st->stream);
    }
    float ms = 0.0f;
    if (r == CU_OK && (r = cu.EventRecord(st->stop, st->stream)) == CU_OK)
        r = elapsed_ms(st, &ms);
    if (r != CU_OK)
        rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "running a stream pass");
    else
        *us = (double)ms * 1e3;
done:
    timing_leave(dev, pushed);
    return rc;
}

/* An empty kernel in PTX, so that it needs no compiler: the driver JITs it. */
static const char empty_ptx[] = ".version 7.0\n"
                                ".target sm_70\n"
                                ".address_size 64\n"
                                ".visible .entry attnres_empty()\n"
                                "{\n"
                                "    ret;\n"
                                "}\n";

/* Median GPU time of one empty launch, timed like the time slot's launches. */
static int cuda_empty_launch(attnres_device *dev, double *us)
{
    cuda_state *st = dev->state;
    enum { WARM = 10, REPS = 201 };
    double t[REPS];
    int pushed, rc;
    if ((rc = timing_enter(dev, &pushed)) != ATTNRES_OK)
        return rc;
    CUresult r = CU_OK;
    if (!st->empty_module) {
        if ((r = cu.ModuleLoadData(&st->empty_module, empty_ptx)) != CU_OK ||
            (r = cu.ModuleGetFunction(&st->empty, st->empty_module, "attnres_empty")) != CU_OK) {
            if (st->empty_module)
                cu.ModuleUnload(st->empty_module);
            st->empty_module = NULL;
            rc = cuda_fail(dev, ATTNRES_ELOAD, r, "loading the empty kernel");
            goto done;
        }
    }
    for (int i = 0; i < WARM + REPS; i++) {
        float ms = 0.0f;
        if ((r = cu.EventRecord(st->start, st->stream)) != CU_OK ||
            (r = cu.LaunchKernel(st->empty, 1, 1, 1, 32, 1, 1, 0, st->stream, NULL, NULL)) != CU_OK ||
            (r = cu.EventRecord(st->stop, st->stream)) != CU_OK || (r = elapsed_ms(st, &ms)) != CU_OK) {
            rc = cuda_fail(dev, ATTNRES_ELAUNCH, r, "timing an empty launch");
            goto done;
        }
        if (i >= WARM)
            t[i - WARM] = (double)ms * 1e3;
    }
    for (int i = 1; i < REPS; i++)
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    *us = t[REPS / 2];
done:
    timing_leave(dev, pushed);
    return rc;
}

const ar_backend ar_cuda_backend = {
    .name = "cuda",
    .count = cuda_count,
    .open = cuda_open,
    .close = cuda_close,
    .compile = cuda_compile,
    .load = cuda_load,
    .check_problem = cuda_check_problem,
    .load_generic = cuda_load_generic,
    .unload = cuda_unload,
    .launch = cuda_launch,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .copy_to_device = cuda_copy_to_device,
    .copy_to_host = cuda_copy_to_host,
    .time = cuda_time,
    .copy_bandwidth = cuda_copy_bandwidth,
    .empty_launch = cuda_empty_launch,
    .ceilings = cuda_ceilings,
    .stream_pass = cuda_stream_pass,
};
