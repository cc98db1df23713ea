/*
 * cuda_backend.c - NVIDIA GPUs through the CUDA Driver API: a device's
 * lifecycle, compiling and loading its kernels, its memory, and the
 * backend's ops table (device.h).
 *
 * Kernels are CUDA C++ from templates/cuda, compiled by NVRTC (nvrtc.c,
 * loaded with dlopen like the driver, cuda_driver.c) into cubins for the
 * device's architecture, or into PTX for the newest architecture NVRTC
 * knows when it does not know the device's. Each device holds its primary
 * context; every call makes it current for its duration and restores the
 * caller's. The built-in generic kernels' sources (mix, phase1, phase2) are
 * generated at build time from the templates (mix_backward's too) and compiled with NVRTC when a
 * plan first needs them (cached on disk by build key). Launches are prepared
 * in cuda_args.c and timed in cuda_timing.c.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "binary_cache.h"
#include "cuda_internal.h"
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
/* ... and from templates/cuda/mix_backward.lua, phase1_backward.lua and
 * phase2_backward.lua. */
AR_CUDA_GENERIC_DECL(mix_backward, f32);
AR_CUDA_GENERIC_DECL(mix_backward, bf16);
AR_CUDA_GENERIC_DECL(mix_backward, f16);
AR_CUDA_GENERIC_DECL(phase1_backward, f32);
AR_CUDA_GENERIC_DECL(phase1_backward, bf16);
AR_CUDA_GENERIC_DECL(phase1_backward, f16);
AR_CUDA_GENERIC_DECL(phase2_backward, f32);
AR_CUDA_GENERIC_DECL(phase2_backward, bf16);
AR_CUDA_GENERIC_DECL(phase2_backward, f16);

/* The embedded generic kernels, by op and dtype. */
typedef struct cuda_generic {
    const char *source, *kernel, *params, *variant;
} cuda_generic;

#define AR_CUDA_GENERIC(op, dt)                                                                         \
    {ar_cuda_generic_##op##_##dt, ar_cuda_generic_##op##_##dt##_kernel, ar_cuda_generic_##op##_##dt##_params, \
     ar_cuda_generic_##op##_##dt##_variant}

static const cuda_generic cuda_generics[AR_OPS][3] = {
    /* [op][dtype]: ATTNRES_OP_MIX ... ATTNRES_OP_PHASE2_BACKWARD x ATTNRES_DTYPE_F32/BF16/F16 */
    {AR_CUDA_GENERIC(mix, f32), AR_CUDA_GENERIC(mix, bf16), AR_CUDA_GENERIC(mix, f16)},
    {AR_CUDA_GENERIC(phase1, f32), AR_CUDA_GENERIC(phase1, bf16), AR_CUDA_GENERIC(phase1, f16)},
    {AR_CUDA_GENERIC(phase2, f32), AR_CUDA_GENERIC(phase2, bf16), AR_CUDA_GENERIC(phase2, f16)},
    {AR_CUDA_GENERIC(mix_backward, f32), AR_CUDA_GENERIC(mix_backward, bf16), AR_CUDA_GENERIC(mix_backward, f16)},
    {AR_CUDA_GENERIC(phase1_backward, f32), AR_CUDA_GENERIC(phase1_backward, bf16),
     AR_CUDA_GENERIC(phase1_backward, f16)},
    {AR_CUDA_GENERIC(phase2_backward, f32), AR_CUDA_GENERIC(phase2_backward, bf16),
     AR_CUDA_GENERIC(phase2_backward, f16)},
};

/* ---- device state ------------------------------------------------------ */

/* Makes the device's context current for one call; restores the caller's. */
CUresult ar_cuda_ctx_enter(const cuda_state *st, int *pushed)
{
    CUcontext cur = NULL;
    *pushed = 0;
    if (ar_cuda_driver.CtxGetCurrent(&cur) == CU_OK && cur == st->ctx)
        return CU_OK;
    CUresult r = ar_cuda_driver.CtxPushCurrent(st->ctx);
    *pushed = r == CU_OK;
    return r;
}

void ar_cuda_ctx_leave(int pushed)
{
    if (pushed) {
        CUcontext c;
        ar_cuda_driver.CtxPopCurrent(&c);
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
    if ((ar_cuda_driver.simulated && !insist_cubin) || (env && strcmp(env, "1") == 0))
        return 1;
    return ordinal >= 0 && ordinal < AR_CUDA_MAX_ORDINALS && ar_cuda_driver.needs_ptx[ordinal];
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
        ar_cuda_driver.needs_ptx[st->ordinal] = 1;
    if (st->cubin) {
        choose_binary_form(st);
        set_target(dev);
    }
    pthread_mutex_unlock(&dev->lock);
}

static int cuda_count(void)
{
    if (!ar_cuda_driver_ready() || ar_cuda_driver.init_rc != CU_OK)
        return 0;
    int n = 0;
    if (ar_cuda_driver.DeviceGetCount(&n) != CU_OK || n < 0)
        return 0;
    return n;
}

static int cuda_open(attnres_device *dev, int index)
{
    if (!ar_cuda_driver_ready())
        return ar_device_fail(dev, ATTNRES_ENODEV, "%s", ar_cuda_driver.error);
    if (ar_cuda_driver.init_rc != CU_OK) {
        char text[256];
        ar_cuda_error_text(ar_cuda_driver.init_rc, text, sizeof text);
        return ar_device_fail(dev, ATTNRES_ENODEV, "the CUDA driver did not initialise: %s", text);
    }
    int count = 0;
    CUresult r = ar_cuda_driver.DeviceGetCount(&count);
    if (r != CU_OK)
        return ar_cuda_fail(dev, ATTNRES_ENODEV, r, "cuDeviceGetCount");
    if (index < 0 || index >= count)
        return ar_device_fail(dev, ATTNRES_ENODEV, "no CUDA device %d (%d present)", index, count);
    cuda_state *st = calloc(1, sizeof *st);
    if (!st)
        return ar_device_fail(dev, ATTNRES_ENOMEM, "out of memory");
    pthread_mutex_init(&st->lock, NULL);
    int major = 0, minor = 0, sms = 0, l2 = 0, version = 0;
    size_t mem = 0;
    char name[256] = "";
    if ((r = ar_cuda_driver.DeviceGet(&st->device, index)) != CU_OK ||
        (r = ar_cuda_driver.DeviceGetName(name, (int)sizeof name - 1, st->device)) != CU_OK ||
        (r = ar_cuda_driver.DeviceGetAttribute(&major, CU_ATTR_CC_MAJOR, st->device)) != CU_OK ||
        (r = ar_cuda_driver.DeviceGetAttribute(&minor, CU_ATTR_CC_MINOR, st->device)) != CU_OK ||
        (r = ar_cuda_driver.DeviceGetAttribute(&sms, CU_ATTR_MULTIPROCESSOR_COUNT, st->device)) != CU_OK ||
        (r = ar_cuda_driver.DeviceGetAttribute(&l2, CU_ATTR_L2_CACHE_SIZE, st->device)) != CU_OK ||
        (r = ar_cuda_driver.DeviceTotalMem(&mem, st->device)) != CU_OK ||
        (r = ar_cuda_driver.DriverGetVersion(&version)) != CU_OK) {
        pthread_mutex_destroy(&st->lock);
        free(st);
        return ar_cuda_fail(dev, ATTNRES_ENODEV, r, "querying the CUDA device");
    }
    if ((r = ar_cuda_driver.DevicePrimaryCtxRetain(&st->ctx, st->device)) != CU_OK) {
        pthread_mutex_destroy(&st->lock);
        free(st);
        return ar_cuda_fail(dev, ATTNRES_ENODEV, r, "cuDevicePrimaryCtxRetain");
    }
    st->cc = major * 10 + minor;
    st->l2 = l2 > 0 ? (size_t)l2 : (size_t)64 << 20;
    st->ordinal = index;
    choose_binary_form(st);
    dev->simulated = ar_cuda_driver.simulated;
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
    if (ar_cuda_ctx_enter(st, &pushed) == CU_OK) {
        if (st->stream)
            ar_cuda_driver.StreamSynchronize(st->stream);
        if (st->start)
            ar_cuda_driver.EventDestroy(st->start);
        if (st->stop)
            ar_cuda_driver.EventDestroy(st->stop);
        if (st->flush)
            ar_cuda_driver.MemFree(st->flush);
        if (st->empty_module)
            ar_cuda_driver.ModuleUnload(st->empty_module);
        if (st->ceiling_module)
            ar_cuda_driver.ModuleUnload(st->ceiling_module);
        if (st->stream)
            ar_cuda_driver.StreamDestroy(st->stream);
        ar_cuda_ctx_leave(pushed);
    }
    ar_cuda_driver.DevicePrimaryCtxRelease(st->device);
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
    CUresult r = ar_cuda_ctx_enter(st, &pushed);
    if (r != CU_OK) {
        free(text);
        free(ck);
        return ar_cuda_fail(dev, ATTNRES_ELOAD, r, "making the CUDA context current");
    }
    CUfunction fn = NULL, sum = NULL, epi = NULL;
    int max_threads = 0, epi_threads = 0;
    /* A backward's module has a sum entry, and but for phase 1's an
     * epilogue entry. */
    const int abi_op = ar_json_int(params_json, "abi_op", -1);
    const int backward = abi_op == ATTNRES_OP_MIX_BACKWARD || abi_op == ATTNRES_OP_PHASE1_BACKWARD ||
                         abi_op == ATTNRES_OP_PHASE2_BACKWARD;
    const int has_epi = backward && abi_op != ATTNRES_OP_PHASE1_BACKWARD;
    char sum_name[sizeof k->kernel_name + sizeof AR_CUDA_MIX_BACKWARD_SUM_SUFFIX];
    char epi_name[sizeof k->kernel_name + sizeof AR_CUDA_MIX_BACKWARD_EPI_SUFFIX];
    snprintf(sum_name, sizeof sum_name, "%s%s", kernel_name, AR_CUDA_MIX_BACKWARD_SUM_SUFFIX);
    snprintf(epi_name, sizeof epi_name, "%s%s", kernel_name, AR_CUDA_MIX_BACKWARD_EPI_SUFFIX);
    if ((r = ar_cuda_driver.ModuleLoadData(&ck->module, image)) != CU_OK) {
        ck->module = NULL;
        *no_binary = r == CU_ERROR_NO_BINARY_FOR_GPU && is_elf(blob, size);
        status = ar_cuda_fail(dev, ATTNRES_ELOAD, r, "cuModuleLoadData");
    } else if ((r = ar_cuda_driver.ModuleGetFunction(&fn, ck->module, kernel_name)) != CU_OK) {
        status = ar_cuda_fail(dev, ATTNRES_ELOAD, r, "cuModuleGetFunction");
    } else if (backward && (r = ar_cuda_driver.ModuleGetFunction(&sum, ck->module, sum_name)) != CU_OK) {
        /* A backward's second pass is an entry of the same module. */
        status = ar_cuda_fail(dev, ATTNRES_ELOAD, r, "cuModuleGetFunction (the backward's sum entry)");
    } else if (has_epi && (r = ar_cuda_driver.ModuleGetFunction(&epi, ck->module, epi_name)) != CU_OK) {
        /* ... and so is its first pass with the output-norm epilogue. */
        status = ar_cuda_fail(dev, ATTNRES_ELOAD, r, "cuModuleGetFunction (the backward's epilogue entry)");
    } else if ((r = ar_cuda_driver.FuncGetAttribute(&max_threads, CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK, fn)) != CU_OK ||
               (epi && (r = ar_cuda_driver.FuncGetAttribute(&epi_threads, CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK, epi)) !=
                           CU_OK)) {
        status = ar_cuda_fail(dev, ATTNRES_ELOAD, r, "cuFuncGetAttribute");
    } else if (max_threads < block || (epi && epi_threads < block)) {
        status = ar_device_fail(dev, ATTNRES_ELOAD, "kernel %s runs at most %d threads per block on %s, not %lld",
                                kernel_name, epi && epi_threads < max_threads ? epi_threads : max_threads, dev->arch,
                                (long long)block);
    } else if (smem > 48 * 1024 &&
               (r = ar_cuda_driver.FuncSetAttribute(fn, CU_FUNC_ATTR_MAX_DYNAMIC_SHARED, (int)smem)) != CU_OK) {
        status = ar_cuda_fail(dev, ATTNRES_ELOAD, r, "allowing the kernel's dynamic shared memory");
    }
    if (status != ATTNRES_OK && ck->module)
        ar_cuda_driver.ModuleUnload(ck->module);
    ar_cuda_ctx_leave(pushed);
    free(text);
    if (status != ATTNRES_OK) {
        free(ck);
        return status;
    }
    ck->align = (int32_t)align;
    ck->qalign = (int32_t)qalign;
    ck->dmax = dmax;
    ck->sum = sum;
    ck->epi = epi;
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
    if ((unsigned)p->op >= AR_OPS || (unsigned)dtype > ATTNRES_DTYPE_F16)
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
        if (ck->module && ar_cuda_ctx_enter(dev->state, &pushed) == CU_OK) {
            ar_cuda_driver.ModuleUnload(ck->module);
            ar_cuda_ctx_leave(pushed);
        }
        free(ck);
    }
    k->module = NULL;
    k->entry = NULL;
}

/* ---- memory ------------------------------------------------------------ */

static int cuda_mem_alloc(attnres_device *dev, size_t bytes, void **ptr)
{
    *ptr = NULL;
    int pushed;
    CUresult r = ar_cuda_ctx_enter(dev->state, &pushed);
    if (r != CU_OK)
        return ar_cuda_fail(dev, ATTNRES_ENOMEM, r, "making the CUDA context current");
    CUdeviceptr p = 0;
    r = ar_cuda_driver.MemAlloc(&p, bytes ? bytes : 256);
    ar_cuda_ctx_leave(pushed);
    if (r != CU_OK) {
        char what[96];
        snprintf(what, sizeof what, "allocating %zu bytes on the GPU", bytes);
        return ar_cuda_fail(dev, ATTNRES_ENOMEM, r, what);
    }
    *ptr = (void *)(uintptr_t)p;
    return ATTNRES_OK;
}

static void cuda_mem_free(attnres_device *dev, void *ptr)
{
    if (!ptr)
        return;
    int pushed;
    if (ar_cuda_ctx_enter(dev->state, &pushed) == CU_OK) {
        ar_cuda_driver.MemFree((CUdeviceptr)(uintptr_t)ptr);
        ar_cuda_ctx_leave(pushed);
    }
}

static int cuda_copy_to_device(attnres_device *dev, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return ATTNRES_OK;
    int pushed;
    CUresult r = ar_cuda_ctx_enter(dev->state, &pushed);
    if (r == CU_OK) {
        r = ar_cuda_driver.MemcpyHtoD((CUdeviceptr)(uintptr_t)dst, src, bytes);
        ar_cuda_ctx_leave(pushed);
    }
    return r == CU_OK ? ATTNRES_OK : ar_cuda_fail(dev, ATTNRES_EIO, r, "copying to the GPU");
}

static int cuda_copy_to_host(attnres_device *dev, void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return ATTNRES_OK;
    int pushed;
    CUresult r = ar_cuda_ctx_enter(dev->state, &pushed);
    if (r == CU_OK) {
        r = ar_cuda_driver.MemcpyDtoH(dst, (CUdeviceptr)(uintptr_t)src, bytes);
        ar_cuda_ctx_leave(pushed);
    }
    return r == CU_OK ? ATTNRES_OK : ar_cuda_fail(dev, ATTNRES_EIO, r, "copying from the GPU");
}

const ar_backend ar_cuda_backend = {
    .name = "cuda",
    .count = cuda_count,
    .open = cuda_open,
    .close = cuda_close,
    .compile = cuda_compile,
    .load = cuda_load,
    .check_problem = ar_cuda_check_problem,
    .load_generic = cuda_load_generic,
    .unload = cuda_unload,
    .launch = ar_cuda_launch,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .copy_to_device = cuda_copy_to_device,
    .copy_to_host = cuda_copy_to_host,
    .time = ar_cuda_time,
    .copy_bandwidth = ar_cuda_copy_bandwidth,
    .empty_launch = ar_cuda_empty_launch,
    .ceilings = ar_cuda_ceilings,
    .stream_pass = ar_cuda_stream_pass,
};
