/*
 * cuda_driver.c - the CUDA driver library, loaded with dlopen at the first
 * use: its entry points, the text of its errors, and which of them leave a
 * context unusable.
 *
 * libcuda.so.1 (or the library ATTNRES_CUDA_DRIVER names) is loaded with
 * dlopen, so the library links and runs on hosts without a driver: there
 * the backend's count() is 0 and open() fails with ATTNRES_ENODEV.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"

cuda_driver ar_cuda_driver = {.once = PTHREAD_ONCE_INIT};

/* Looks up the first of several names (newest ABI first). */
static void *driver_symbol(const char *const *names)
{
    for (; *names; names++) {
        void *p = dlsym(ar_cuda_driver.handle, *names);
        if (p)
            return p;
    }
    return NULL;
}

#define CU_SYM(field, ...)                                                                                      \
    do {                                                                                                        \
        static const char *const names_[] = {__VA_ARGS__, NULL};                                                \
        *(void **)(&ar_cuda_driver.field) = driver_symbol(names_);                                              \
        if (!ar_cuda_driver.field) {                                                                            \
            snprintf(ar_cuda_driver.error, sizeof ar_cuda_driver.error, "the CUDA driver lacks %s", names_[0]); \
            goto fail;                                                                                          \
        }                                                                                                       \
    } while (0)

static void driver_load(void)
{
    ar_cuda_driver.init_rc = -1;
    /* ATTNRES_CUDA_DRIVER names another driver library: a newer driver
     * outside the loader's path, or the simulated driver of the tests. */
    const char *path = getenv("ATTNRES_CUDA_DRIVER");
    if (!path || !*path)
        path = "libcuda.so.1";
    ar_cuda_driver.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!ar_cuda_driver.handle) {
        const char *why = dlerror();
        snprintf(ar_cuda_driver.error, sizeof ar_cuda_driver.error, "no CUDA driver (%.200s not loaded: %.250s)",
                 path, why ? why : "not found");
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
    *(void **)(&ar_cuda_driver.Describe) = dlsym(ar_cuda_driver.handle, "cudasimDescribe");
    ar_cuda_driver.simulated = ar_cuda_driver.Describe != NULL;
    ar_cuda_driver.init_rc = ar_cuda_driver.Init(0);
    return;
fail:
    dlclose(ar_cuda_driver.handle);
    ar_cuda_driver.handle = NULL;
}

int ar_cuda_driver_ready(void)
{
    pthread_once(&ar_cuda_driver.once, driver_load);
    return ar_cuda_driver.handle != NULL;
}

/* "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered". */
void ar_cuda_error_text(CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *text = NULL;
    if (!ar_cuda_driver.handle || ar_cuda_driver.GetErrorName(r, &name) != CU_OK || !name)
        name = NULL;
    if (!ar_cuda_driver.handle || ar_cuda_driver.GetErrorString(r, &text) != CU_OK)
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
    static const CUresult sticky[] = {
        214 /* ECC_UNCORRECTABLE */,      220 /* NVLINK_UNCORRECTABLE */,   226 /* CONTAINED */,
        700 /* ILLEGAL_ADDRESS */,        702 /* LAUNCH_TIMEOUT */,         710 /* ASSERT */,
        714 /* HARDWARE_STACK_ERROR */,   715 /* ILLEGAL_INSTRUCTION */,    716 /* MISALIGNED_ADDRESS */,
        717 /* INVALID_ADDRESS_SPACE */,  718 /* INVALID_PC */,             719 /* LAUNCH_FAILED */,
    };
    for (size_t i = 0; i < sizeof sticky / sizeof sticky[0]; i++)
        if (r == sticky[i])
            return 1;
    return 0;
}

int ar_cuda_fail(attnres_device *dev, int status, CUresult r, const char *what)
{
    char text[768]; /* a simulated driver's fault description runs long */
    ar_cuda_error_text(r, text, sizeof text);
    if (is_sticky(r))
        return ar_device_fail(dev, status,
                              "%s failed: %s (a kernel on this device faulted earlier; the CUDA context is "
                              "unusable until the process restarts)",
                              what, text);
    return ar_device_fail(dev, status, "%s failed: %s", what, text);
}
