/*
 * driver_api.c - the CUDA Driver API entry points of the simulated driver.
 *
 * One simulated device (ordinal 0), an sm_90 part shaped like an H200 but
 * named so that it cannot be taken for hardware. Every call is serialised
 * by one lock; work is executed when it is submitted, so streams are
 * ordered trivially, and a device timeline advances by the modelled cost
 * of each launch, copy and memset (sim_exec.h) for events to read. A
 * fault stops the kernel; as on a GPU the launch itself succeeds and the
 * fault's code is returned, sticky, by the calls that follow (cudasim.h).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudasim.h"
#include "ptx.h"
#include "sim_exec.h"
#include "sim_memory.h"

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

/* The device: an sm_90 part with an H200's published shape. */
#define SIM_NAME "attnres cudasim (an sm_90 model, not a GPU)"
#define SIM_MEMORY_BYTES 150754820096ull /* 141 GiB-class HBM3e */
#define SIM_L2_BYTES 52428800

/* The L2 size the device reports: SIM_L2_BYTES, or
 * $ATTNRES_CUDASIM_L2_BYTES where that is a whole number of KiB from 64 KiB
 * to SIM_L2_BYTES (so that a small problem counts as out of cache and the
 * tuner's out-of-cache paths run in a test's time); anything else is
 * ignored. */
static int sim_l2_bytes(void)
{
    const char *v = getenv("ATTNRES_CUDASIM_L2_BYTES");
    char *end = NULL;
    const long long b = v && *v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || b < 65536 || b > SIM_L2_BYTES || b % 1024)
        return SIM_L2_BYTES;
    return (int)b;
}
#define SIM_DRIVER_VERSION 13000
#define SIM_DEFAULT_DYNAMIC_SHARED 49152
#define SIM_MAX_DYNAMIC_SHARED 232448
/* Allocations up to this size start filled with 0xff bytes (a NaN in every
 * float format), so output a kernel forgets to write fails verification. */
#define SIM_POISON_LIMIT ((size_t)64 << 20)

typedef struct CUctx_st {
    int retained;
    CUresult sticky;
} sim_context;

typedef struct CUfunc_st {
    struct CUmod_st *module;
    const ptx_function *f;
    int64_t max_dynamic_shared;
} sim_function;

typedef struct CUmod_st {
    uint32_t magic;
    ptx_module *m;
    sim_function *funcs;
    struct CUmod_st *next;
} sim_module;

typedef struct CUstream_st {
    uint32_t magic;
} sim_stream;

typedef struct CUevent_st {
    uint32_t magic;
    int recorded;
    double at_us;
} sim_event;

enum { MAGIC_MODULE = 0x6d6f6475, MAGIC_STREAM = 0x73747265, MAGIC_EVENT = 0x6576656e, MAGIC_DEAD = 0xdeadbeef };

static struct {
    pthread_mutex_t lock;
    int initialised;
    sim_context ctx;
    sim_memory mem;
    sim_module *modules;
    double now_us; /* the device timeline */
    CUresult last_code;
    char last_fault[2048];
    cudasim_traffic last_traffic;
    cudasim_traffic taken; /* summed since the last cudasimTakeTraffic */
} sim = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The calling thread's context stack. */
static __thread sim_context *ctx_stack[16];
static __thread int ctx_depth;
static __thread char error_text[2400];

static void lock(void)
{
    pthread_mutex_lock(&sim.lock);
}

static CUresult unlock(CUresult r)
{
    pthread_mutex_unlock(&sim.lock);
    return r;
}

/* Records a description for cuGetErrorString of code. */
static void describe(CUresult code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void describe(CUresult code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sim.last_fault, sizeof sim.last_fault, fmt, ap);
    va_end(ap);
    sim.last_code = code;
}

/* The checks every call on the context makes: initialised, a current
 * context, no sticky fault. With the lock held. */
static CUresult ready(void)
{
    if (!sim.initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx_depth == 0 || !ctx_stack[ctx_depth - 1] || !ctx_stack[ctx_depth - 1]->retained)
        return CUDA_ERROR_INVALID_CONTEXT;
    return sim.ctx.sticky;
}

/* The checks every call naming a device makes: initialised, and the one
 * device the simulator has. */
static CUresult device_known(CUdevice dev)
{
    if (!sim.initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* ---- errors ------------------------------------------------------------ */

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_TIMEOUT, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {CUDA_ERROR_ILLEGAL_INSTRUCTION, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

API CUresult cuGetErrorName(CUresult error, const char **str)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error) {
            *str = errors[i].name;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuGetErrorString(CUresult error, const char **str)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == error) {
            lock();
            if (sim.last_code == error && sim.last_fault[0])
                snprintf(error_text, sizeof error_text, "%s [cudasim: %s]", errors[i].text, sim.last_fault);
            else
                snprintf(error_text, sizeof error_text, "%s", errors[i].text);
            unlock(0);
            *str = error_text;
            return CUDA_SUCCESS;
        }
    *str = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- the simulator's own entry points ---------------------------------- */

API const char *cudasimDescribe(void)
{
    return "attnres cudasim 1: a PTX interpreter with an sm_90 model (not a GPU)";
}

API int cudasimLastFault(char *buf, size_t len)
{
    lock();
    CUresult code = sim.ctx.sticky;
    if (buf && len)
        snprintf(buf, len, "%s", code ? sim.last_fault : "");
    return unlock(code);
}

API int cudasimLastTraffic(cudasim_traffic *t)
{
    lock();
    *t = sim.last_traffic;
    return unlock(0);
}

API int cudasimTakeTraffic(cudasim_traffic *t)
{
    lock();
    *t = sim.taken;
    memset(&sim.taken, 0, sizeof sim.taken);
    return unlock(0);
}

/* Adds one launch's counters to those cudasimTakeTraffic returns. */
static void add_traffic(cudasim_traffic *sum, const cudasim_traffic *t)
{
    sum->requests += t->requests;
    sum->bytes_requested += t->bytes_requested;
    sum->sectors += t->sectors;
    sum->distinct_sectors += t->distinct_sectors;
    sum->read_bytes += t->read_bytes;
    sum->write_bytes += t->write_bytes;
    sum->warp_instructions += t->warp_instructions;
    sum->model_us += t->model_us;
}

/* ---- initialisation and the device ------------------------------------- */

API CUresult cuInit(unsigned flags)
{
    if (flags)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    sim.initialised = 1;
    return unlock(CUDA_SUCCESS);
}

API CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    *version = SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim.initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    *count = 1;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    const CUresult known = device_known(ordinal);
    if (known == CUDA_SUCCESS)
        *device = 0;
    return known;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    if (!name || len < 1)
        return CUDA_ERROR_INVALID_VALUE;
    const CUresult known = device_known(dev);
    if (known != CUDA_SUCCESS)
        return known;
    snprintf(name, (size_t)len, "%s", SIM_NAME);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *value, int attrib, CUdevice dev)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    const CUresult known = device_known(dev);
    if (known != CUDA_SUCCESS)
        return known;
    static const int table[][2] = {
        {1, 1024},       /* MAX_THREADS_PER_BLOCK */
        {2, 1024},       {3, 1024}, {4, 64}, /* MAX_BLOCK_DIM_X/Y/Z */
        {5, 2147483647}, {6, 65535}, {7, 65535}, /* MAX_GRID_DIM_X/Y/Z */
        {8, 49152},      /* MAX_SHARED_MEMORY_PER_BLOCK */
        {9, 65536},      /* TOTAL_CONSTANT_MEMORY */
        {10, 32},        /* WARP_SIZE */
        {12, 65536},     /* MAX_REGISTERS_PER_BLOCK */
        {13, SIM_CLOCK_KHZ}, /* CLOCK_RATE */
        {16, SIM_SMS},   /* MULTIPROCESSOR_COUNT */
        {36, 2619000},   /* MEMORY_CLOCK_RATE */
        {37, 6144},      /* GLOBAL_MEMORY_BUS_WIDTH */
        {39, 2048},      /* MAX_THREADS_PER_MULTIPROCESSOR */
        {75, 9},         {76, 0}, /* COMPUTE_CAPABILITY_MAJOR/MINOR */
        {81, 233472},    /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
        {82, 65536},     /* MAX_REGISTERS_PER_MULTIPROCESSOR */
        {97, SIM_MAX_DYNAMIC_SHARED}, /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    };
    if (attrib == 38) { /* L2_CACHE_SIZE, which a test may shrink */
        *value = sim_l2_bytes();
        return CUDA_SUCCESS;
    }
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i][0] == attrib) {
            *value = table[i][1];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    const CUresult known = device_known(dev);
    if (known != CUDA_SUCCESS)
        return known;
    *bytes = (size_t)SIM_MEMORY_BYTES;
    return CUDA_SUCCESS;
}

/* ---- contexts ---------------------------------------------------------- */

API CUresult cuDevicePrimaryCtxRetain(sim_context **ctx, CUdevice dev)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    const CUresult known = device_known(dev);
    if (known != CUDA_SUCCESS)
        return unlock(known);
    sim.ctx.retained++;
    *ctx = &sim.ctx;
    return unlock(CUDA_SUCCESS);
}

/* Releasing the last reference ends the context's fault state, as a new
 * primary context would start clean. */
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    lock();
    const CUresult known = device_known(dev);
    if (known != CUDA_SUCCESS)
        return unlock(known);
    if (sim.ctx.retained == 0)
        return unlock(CUDA_ERROR_INVALID_CONTEXT);
    if (--sim.ctx.retained == 0)
        sim.ctx.sticky = CUDA_SUCCESS;
    return unlock(CUDA_SUCCESS);
}

API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

/* Clears the fault state. Unlike a real reset it keeps allocations and
 * modules, so handles the caller still holds stay valid. */
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    lock();
    const CUresult known = device_known(dev);
    if (known != CUDA_SUCCESS)
        return unlock(known);
    sim.ctx.sticky = CUDA_SUCCESS;
    sim.last_code = 0;
    sim.last_fault[0] = 0;
    return unlock(CUDA_SUCCESS);
}

API CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return cuDevicePrimaryCtxReset_v2(dev);
}

API CUresult cuCtxGetCurrent(sim_context **ctx)
{
    if (!ctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim.initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    *ctx = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPushCurrent_v2(sim_context *ctx)
{
    if (!sim.initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx != &sim.ctx || !sim.ctx.retained)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == (int)(sizeof ctx_stack / sizeof ctx_stack[0]))
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxPopCurrent_v2(sim_context **ctx)
{
    if (!sim.initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_context *c = ctx_stack[--ctx_depth];
    if (ctx)
        *ctx = c;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize(void)
{
    lock();
    return unlock(ready());
}

/* ---- modules and functions --------------------------------------------- */

static sim_module *find_module(sim_module *h)
{
    for (sim_module *m = sim.modules; m; m = m->next)
        if (m == h && m->magic == MAGIC_MODULE)
            return m;
    return NULL;
}

static void module_free(sim_module *mod)
{
    if (!mod)
        return;
    if (mod->m)
        for (int i = 0; i < mod->m->nglobals; i++)
            sim_memory_remove(&sim.mem, (uint64_t)(uintptr_t)mod->m->globals[i].data, NULL);
    ptx_module_free(mod->m);
    free(mod->funcs);
    mod->magic = MAGIC_DEAD;
    free(mod);
}

API CUresult cuModuleLoadData(sim_module **module, const void *image)
{
    if (!module || !image)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    const unsigned char *b = image;
    if (memcmp(b, "\177ELF", 4) == 0 || (b[0] == 0x50 && b[1] == 0xed && b[2] == 0x55 && b[3] == 0xba)) {
        describe(CUDA_ERROR_NO_BINARY_FOR_GPU,
                 "the simulator runs PTX only; this image is a %s", b[0] == 0x7f ? "cubin (ELF)" : "fatbinary");
        return unlock(CUDA_ERROR_NO_BINARY_FOR_GPU);
    }
    char err[1024];
    ptx_module *pm = NULL;
    if (ptx_parse(image, &pm, err, sizeof err)) {
        describe(CUDA_ERROR_INVALID_PTX, "%s", err);
        return unlock(CUDA_ERROR_INVALID_PTX);
    }
    if (pm->target > 90) {
        describe(CUDA_ERROR_INVALID_PTX, "PTX for sm_%d cannot run on the simulated sm_90 device", pm->target);
        ptx_module_free(pm);
        return unlock(CUDA_ERROR_INVALID_PTX);
    }
    sim_module *mod = calloc(1, sizeof *mod);
    if (!mod || !(mod->funcs = calloc((size_t)(pm->nfuncs ? pm->nfuncs : 1), sizeof *mod->funcs))) {
        free(mod);
        ptx_module_free(pm);
        return unlock(CUDA_ERROR_OUT_OF_MEMORY);
    }
    mod->magic = MAGIC_MODULE;
    mod->m = pm;
    for (int i = 0; i < pm->nfuncs; i++) {
        mod->funcs[i].module = mod;
        mod->funcs[i].f = &pm->funcs[i];
        mod->funcs[i].max_dynamic_shared = SIM_DEFAULT_DYNAMIC_SHARED - pm->funcs[i].static_shared;
    }
    for (int i = 0; i < pm->nglobals; i++)
        if (sim_memory_add(&sim.mem, (uint64_t)(uintptr_t)pm->globals[i].data, (uint64_t)pm->globals[i].size, 0)) {
            pm->nglobals = i; /* only those added are removed */
            module_free(mod);
            return unlock(CUDA_ERROR_OUT_OF_MEMORY);
        }
    mod->next = sim.modules;
    sim.modules = mod;
    *module = mod;
    return unlock(CUDA_SUCCESS);
}

API CUresult cuModuleUnload(sim_module *module)
{
    lock();
    if (!sim.initialised)
        return unlock(CUDA_ERROR_NOT_INITIALIZED);
    sim_module *mod = find_module(module);
    if (!mod)
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    for (sim_module **p = &sim.modules; *p; p = &(*p)->next)
        if (*p == mod) {
            *p = mod->next;
            break;
        }
    module_free(mod);
    return unlock(CUDA_SUCCESS);
}

API CUresult cuModuleGetFunction(sim_function **fn, sim_module *module, const char *name)
{
    if (!fn || !name)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    sim_module *mod = find_module(module);
    if (!mod)
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    for (int i = 0; i < mod->m->nfuncs; i++)
        if (strcmp(mod->m->funcs[i].name, name) == 0) {
            *fn = &mod->funcs[i];
            return unlock(CUDA_SUCCESS);
        }
    return unlock(CUDA_ERROR_NOT_FOUND);
}

/* A function handle is valid while its module is loaded. */
static sim_function *find_function(sim_function *fn)
{
    for (sim_module *m = sim.modules; m; m = m->next)
        if (m->magic == MAGIC_MODULE && fn >= m->funcs && fn < m->funcs + m->m->nfuncs)
            return fn;
    return NULL;
}

API CUresult cuFuncGetAttribute(int *value, int attrib, sim_function *fn)
{
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (!find_function(fn))
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    const ptx_function *f = fn->f;
    switch (attrib) {
    case 0: /* MAX_THREADS_PER_BLOCK */
        *value = f->maxntid ? f->maxntid : 1024;
        break;
    case 1: /* SHARED_SIZE_BYTES */
        *value = (int)f->static_shared;
        break;
    case 2: /* CONST_SIZE_BYTES */
    case 3: /* LOCAL_SIZE_BYTES */
        *value = 0;
        break;
    case 4: /* NUM_REGS: virtual registers, at most what a thread can have */
        *value = f->nregs > 255 ? 255 : f->nregs;
        break;
    case 5: /* PTX_VERSION */
    case 6: /* BINARY_VERSION */
        *value = 90;
        break;
    case 8: /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
        *value = (int)fn->max_dynamic_shared;
        break;
    default:
        return unlock(CUDA_ERROR_INVALID_VALUE);
    }
    return unlock(CUDA_SUCCESS);
}

API CUresult cuFuncSetAttribute(sim_function *fn, int attrib, int value)
{
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (!find_function(fn))
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    if (attrib == 8) { /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
        if (value < 0 || value > SIM_MAX_DYNAMIC_SHARED - fn->f->static_shared)
            return unlock(CUDA_ERROR_INVALID_VALUE);
        fn->max_dynamic_shared = value;
        return unlock(CUDA_SUCCESS);
    }
    if (attrib == 9) /* PREFERRED_SHARED_MEMORY_CARVEOUT: a hint */
        return unlock(value >= -1 && value <= 100 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
    return unlock(CUDA_ERROR_INVALID_VALUE);
}

/* ---- streams and events ------------------------------------------------- */

/* NULL, CU_STREAM_LEGACY (1) and CU_STREAM_PER_THREAD (2) are streams too. */
static int valid_stream(const sim_stream *s)
{
    return (uintptr_t)s <= 2 || s->magic == MAGIC_STREAM;
}

/* Streams and events are structs whose first member is their magic number;
 * these make and unmake both. A destroyed handle keeps MAGIC_DEAD until its
 * memory is reused, so that a use after destroy is refused while it can be. */
static CUresult handle_create(void **out, size_t size, uint32_t magic)
{
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    uint32_t *h = calloc(1, size);
    if (!h)
        return unlock(CUDA_ERROR_OUT_OF_MEMORY);
    *h = magic;
    *out = h;
    return unlock(CUDA_SUCCESS);
}

static CUresult handle_destroy(void *handle, uint32_t magic)
{
    lock();
    if (!sim.initialised)
        return unlock(CUDA_ERROR_NOT_INITIALIZED);
    /* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD cannot be destroyed. */
    if ((uintptr_t)handle <= 2 || *(uint32_t *)handle != magic)
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    *(uint32_t *)handle = MAGIC_DEAD;
    free(handle);
    return unlock(CUDA_SUCCESS);
}

API CUresult cuStreamCreate(sim_stream **stream, unsigned flags)
{
    if (!stream || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    return handle_create((void **)stream, sizeof **stream, MAGIC_STREAM);
}

API CUresult cuStreamDestroy_v2(sim_stream *stream)
{
    return handle_destroy(stream, MAGIC_STREAM);
}

API CUresult cuStreamSynchronize(sim_stream *stream)
{
    lock();
    CUresult r = ready();
    if (!r && !valid_stream(stream))
        r = CUDA_ERROR_INVALID_HANDLE;
    return unlock(r);
}

API CUresult cuEventCreate(sim_event **event, unsigned flags)
{
    if (!event || flags > 0xf)
        return CUDA_ERROR_INVALID_VALUE;
    return handle_create((void **)event, sizeof **event, MAGIC_EVENT);
}

API CUresult cuEventDestroy_v2(sim_event *event)
{
    return handle_destroy(event, MAGIC_EVENT);
}

API CUresult cuEventRecord(sim_event *event, sim_stream *stream)
{
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (!event || event->magic != MAGIC_EVENT || !valid_stream(stream))
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    event->recorded = 1;
    event->at_us = sim.now_us;
    return unlock(CUDA_SUCCESS);
}

API CUresult cuEventSynchronize(sim_event *event)
{
    lock();
    CUresult r = ready();
    if (!r && (!event || event->magic != MAGIC_EVENT))
        r = CUDA_ERROR_INVALID_HANDLE;
    return unlock(r);
}

API CUresult cuEventElapsedTime(float *ms, sim_event *start, sim_event *end)
{
    if (!ms)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (!start || !end || start->magic != MAGIC_EVENT || end->magic != MAGIC_EVENT)
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    if (!start->recorded || !end->recorded)
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    *ms = (float)((end->at_us - start->at_us) * 1e-3);
    return unlock(CUDA_SUCCESS);
}

API CUresult cuEventElapsedTime_v2(float *ms, sim_event *start, sim_event *end)
{
    return cuEventElapsedTime(ms, start, end);
}

/* ---- memory --------------------------------------------------------------- */

API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (bytes > SIM_MEMORY_BYTES - sim.mem.bytes)
        return unlock(CUDA_ERROR_OUT_OF_MEMORY);
    const size_t rounded = (bytes + 255) & ~(size_t)255;
    void *p = aligned_alloc(256, rounded);
    if (!p)
        return unlock(CUDA_ERROR_OUT_OF_MEMORY);
    if (bytes <= SIM_POISON_LIMIT)
        memset(p, 0xff, rounded);
    if (sim_memory_add(&sim.mem, (uint64_t)(uintptr_t)p, bytes, 1)) {
        free(p);
        return unlock(CUDA_ERROR_OUT_OF_MEMORY);
    }
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return unlock(CUDA_SUCCESS);
}

API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    lock();
    if (!sim.initialised)
        return unlock(CUDA_ERROR_NOT_INITIALIZED);
    if (!dptr)
        return unlock(CUDA_SUCCESS);
    int owned = 0;
    const sim_region *reg = sim_memory_find(&sim.mem, dptr, 1);
    if (!reg || reg->base != dptr || !reg->owned)
        return unlock(CUDA_ERROR_INVALID_VALUE);
    sim_memory_remove(&sim.mem, dptr, &owned);
    free((void *)(uintptr_t)dptr);
    return unlock(CUDA_SUCCESS);
}

static int device_range(CUdeviceptr p, size_t bytes)
{
    return sim_memory_find(&sim.mem, p, bytes) != NULL;
}

/* Advances the timeline by moving `bytes` through DRAM. */
static void spend(double bytes)
{
    sim.now_us += bytes / (SIM_DRAM_GBPS * 1e3) + SIM_LAUNCH_US;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes)
{
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (bytes && (!src || !device_range(dst, bytes)))
        return unlock(CUDA_ERROR_INVALID_VALUE);
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return unlock(CUDA_SUCCESS);
}

API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes)
{
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (bytes && (!dst || !device_range(src, bytes)))
        return unlock(CUDA_ERROR_INVALID_VALUE);
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return unlock(CUDA_SUCCESS);
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, sim_stream *stream)
{
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (!valid_stream(stream))
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    if (bytes && (!device_range(dst, bytes) || !device_range(src, bytes)))
        return unlock(CUDA_ERROR_INVALID_VALUE);
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, bytes);
    spend(2.0 * (double)bytes);
    return unlock(CUDA_SUCCESS);
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, sim_stream *stream)
{
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (!valid_stream(stream))
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    if (bytes && !device_range(dst, bytes))
        return unlock(CUDA_ERROR_INVALID_VALUE);
    memset((void *)(uintptr_t)dst, value, bytes);
    spend((double)bytes);
    return unlock(CUDA_SUCCESS);
}

/* ---- launches -------------------------------------------------------------- */

static int checks_enabled(void)
{
    const char *v = getenv("ATTNRES_CUDASIM_CHECKS");
    return !(v && strcmp(v, "0") == 0);
}

/* Appends the launch's counters to $ATTNRES_CUDASIM_TRAFFIC, when set. */
static void log_traffic(const sim_function *fn, const sim_launch *l, const sim_result *res)
{
    const char *path = getenv("ATTNRES_CUDASIM_TRAFFIC");
    if (!path || !*path)
        return;
    FILE *f = fopen(path, "a");
    if (!f)
        return;
    const cudasim_traffic *t = &res->traffic;
    fprintf(f,
            "{\"kernel\":\"%s\",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"dynamic_shared\":%lld,"
            "\"requests\":%llu,\"bytes_requested\":%llu,\"sectors\":%llu,\"sectors_per_request\":%.3f,"
            "\"distinct_sectors\":%llu,\"distinct_bytes\":%llu,\"read_bytes\":%llu,\"write_bytes\":%llu,"
            "\"warp_instructions\":%llu,\"model_us\":%.3f,\"fault\":%d}\n",
            fn->f->name, l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2],
            (long long)l->dynamic_shared, t->requests, t->bytes_requested, t->sectors,
            t->requests ? (double)t->sectors / (double)t->requests : 0.0, t->distinct_sectors,
            t->distinct_sectors * 32, t->read_bytes, t->write_bytes, t->warp_instructions, t->model_us, res->code);
    fclose(f);
}

API CUresult cuLaunchKernel(sim_function *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shared, sim_stream *stream, void **params, void **extra)
{
    lock();
    CUresult r = ready();
    if (r)
        return unlock(r);
    if (!find_function(fn) || !valid_stream(stream))
        return unlock(CUDA_ERROR_INVALID_HANDLE);
    if (extra)
        return unlock(CUDA_ERROR_NOT_SUPPORTED);
    const ptx_function *f = fn->f;
    if (!gx || !gy || !gz || !bx || !by || !bz || gx > 2147483647u || gy > 65535 || gz > 65535 || bx > 1024 ||
        by > 1024 || bz > 64 || (uint64_t)bx * by * bz > 1024)
        return unlock(CUDA_ERROR_INVALID_VALUE);
    if (f->maxntid && (uint64_t)bx * by * bz > (uint64_t)f->maxntid)
        return unlock(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    if ((int64_t)shared > fn->max_dynamic_shared)
        return unlock(CUDA_ERROR_INVALID_VALUE);
    if (f->nparams && !params)
        return unlock(CUDA_ERROR_INVALID_VALUE);
    uint8_t *buf = calloc(1, (size_t)(f->param_bytes ? f->param_bytes : 1));
    if (!buf)
        return unlock(CUDA_ERROR_OUT_OF_MEMORY);
    for (int i = 0; i < f->nparams; i++) {
        if (!params[i]) {
            free(buf);
            return unlock(CUDA_ERROR_INVALID_VALUE);
        }
        memcpy(buf + f->params[i].offset, params[i], (size_t)f->params[i].size);
    }
    sim_launch l = {.f = f,
                    .grid = {gx, gy, gz},
                    .block = {bx, by, bz},
                    .params = buf,
                    .dynamic_shared = shared,
                    .mem = &sim.mem,
                    .checks = checks_enabled()};
    static sim_result res; /* large; guarded by the lock */
    sim_run(&l, &res);
    free(buf);
    sim.last_traffic = res.traffic;
    add_traffic(&sim.taken, &res.traffic);
    sim.now_us += res.traffic.model_us;
    log_traffic(fn, &l, &res);
    if (res.code) {
        sim.ctx.sticky = res.code;
        describe(res.code, "%s", res.message);
    }
    return unlock(CUDA_SUCCESS);
}
