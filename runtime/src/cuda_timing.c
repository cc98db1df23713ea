/*
 * cuda_timing.c - measurements on a CUDA device, on its own timing stream
 * between events: kernel times, the driver's copy bandwidth, the ceilings'
 * streaming kernels (docs/design.md §2), the tuner's stream passes and the
 * time of an empty launch.
 *
 * The timing resources (stream, events, the L2 flush buffer and the loaded
 * streaming and empty kernels) are made on first use, kept in cuda_state
 * and guarded by its lock; cuda_backend.c frees them when the device closes.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"
#include "nvrtc.h"

/* The stream and events timing uses; with st->lock held, context current. */
static CUresult timing_setup(cuda_state *st)
{
    CUresult r = CU_OK;
    if (!st->stream && (r = ar_cuda_driver.StreamCreate(&st->stream, CU_STREAM_NON_BLOCKING)) != CU_OK)
        return r;
    if (!st->start && (r = ar_cuda_driver.EventCreate(&st->start, CU_EVENT_DEFAULT)) != CU_OK)
        return r;
    if (!st->stop && (r = ar_cuda_driver.EventCreate(&st->stop, CU_EVENT_DEFAULT)) != CU_OK)
        return r;
    return CU_OK;
}

/* Milliseconds between start and stop, recorded around work on st->stream. */
static CUresult elapsed_ms(cuda_state *st, float *ms)
{
    CUresult r = ar_cuda_driver.EventSynchronize(st->stop);
    if (r == CU_OK)
        r = ar_cuda_driver.EventElapsedTime(ms, st->start, st->stop);
    return r;
}

/* One call of the timing helpers: lock, context, stream and events. */
static int timing_enter(attnres_device *dev, int *pushed)
{
    cuda_state *st = dev->state;
    pthread_mutex_lock(&st->lock);
    CUresult r = ar_cuda_ctx_enter(st, pushed);
    if (r == CU_OK && (r = timing_setup(st)) != CU_OK)
        ar_cuda_ctx_leave(*pushed);
    if (r != CU_OK) {
        pthread_mutex_unlock(&st->lock);
        return ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "preparing the timing stream");
    }
    return ATTNRES_OK;
}

static void timing_leave(attnres_device *dev, int pushed)
{
    cuda_state *st = dev->state;
    ar_cuda_ctx_leave(pushed);
    pthread_mutex_unlock(&st->lock);
}

/* The two scratch buffers of a bandwidth measurement, `bytes` each, inside
 * a timing call; ENOMEM naming `what` when either cannot be had (the one
 * that was is freed by timing_leave_pair). */
static int alloc_pair(attnres_device *dev, size_t bytes, CUdeviceptr *a, CUdeviceptr *b, const char *what)
{
    CUresult r;
    if ((r = ar_cuda_driver.MemAlloc(a, bytes)) != CU_OK || (r = ar_cuda_driver.MemAlloc(b, bytes)) != CU_OK)
        return ar_cuda_fail(dev, ATTNRES_ENOMEM, r, what);
    return ATTNRES_OK;
}

/* Frees alloc_pair's buffers (0: not had) and leaves the timing call;
 * returns rc. */
static int timing_leave_pair(attnres_device *dev, int pushed, CUdeviceptr a, CUdeviceptr b, int rc)
{
    if (a)
        ar_cuda_driver.MemFree(a);
    if (b)
        ar_cuda_driver.MemFree(b);
    timing_leave(dev, pushed);
    return rc;
}

/* Times reps launches of any op with events around each, on the device's
 * own timing stream; with flush, an L2-sized memset before each launch
 * makes every launch read from DRAM, as a model's sites do. */
int ar_cuda_time(attnres_device *dev, const ar_kernel *k, const attnres_problem *p, int64_t T,
                 const ar_op_args *a, int reps, int flush, double *times_us)
{
    cuda_state *st = dev->state;
    if (reps < 1)
        return ATTNRES_OK;
    if (T < 0)
        return ar_device_fail(dev, ATTNRES_EINVAL, "T = %lld is negative", (long long)T);
    cuda_launch_data l;
    int rc = T > 0 ? ar_cuda_prepare(dev, k, p, T, a, &l) : ATTNRES_OK;
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
        if ((r = ar_cuda_driver.MemAlloc(&st->flush, bytes)) != CU_OK) {
            st->flush = 0;
            rc = ar_cuda_fail(dev, ATTNRES_ENOMEM, r, "allocating the L2 flush buffer");
            goto done;
        }
        st->flush_bytes = bytes;
    }
    for (int i = 0; i < reps; i++) {
        if (flush &&
            (r = ar_cuda_driver.MemsetD8Async(st->flush, (unsigned char)i, st->flush_bytes, st->stream)) != CU_OK) {
            rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "flushing the L2 cache");
            goto done;
        }
        if ((r = ar_cuda_driver.EventRecord(st->start, st->stream)) != CU_OK) {
            rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "cuEventRecord");
            goto done;
        }
        if (T > 0 && (rc = ar_cuda_launch_current(dev, k, &l, st->stream)) != ATTNRES_OK)
            goto done;
        float ms = 0.0f;
        if ((r = ar_cuda_driver.EventRecord(st->stop, st->stream)) != CU_OK || (r = elapsed_ms(st, &ms)) != CU_OK) {
            rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "timing the kernel");
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
int ar_cuda_copy_bandwidth(attnres_device *dev, double *gbps)
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
    if ((rc = alloc_pair(dev, bytes, &a, &b, "allocating copy buffers")) != ATTNRES_OK)
        goto done;
    if ((r = ar_cuda_driver.MemsetD8Async(a, 1, bytes, st->stream)) != CU_OK ||
        (r = ar_cuda_driver.MemcpyDtoDAsync(b, a, bytes, st->stream)) != CU_OK ||
        (r = ar_cuda_driver.StreamSynchronize(st->stream)) != CU_OK) {
        rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "warming up the copy");
        goto done;
    }
    for (int i = 0; i < 7; i++) {
        float ms = 0.0f;
        if ((r = ar_cuda_driver.EventRecord(st->start, st->stream)) != CU_OK ||
            (r = ar_cuda_driver.MemcpyDtoDAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, st->stream)) != CU_OK ||
            (r = ar_cuda_driver.EventRecord(st->stop, st->stream)) != CU_OK || (r = elapsed_ms(st, &ms)) != CU_OK) {
            rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "timing a device copy");
            goto done;
        }
        if (ms > 0 && ms < best)
            best = ms;
    }
    *gbps = best < 1e30 ? 2.0 * (double)bytes / (best * 1e-3) / 1e9 : 0.0;
done:
    return timing_leave_pair(dev, pushed, a, b, rc);
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
    CUresult r = ar_cuda_driver.LaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, st->stream, args, NULL); /* warm-up */
    *best_ms = 0.0f;
    for (int i = 0; r == CU_OK && i < reps; i++) {
        float ms = 0.0f;
        if ((r = ar_cuda_driver.EventRecord(st->start, st->stream)) != CU_OK ||
            (r = ar_cuda_driver.LaunchKernel(f, grid, 1, 1, 256, 1, 1, 0, st->stream, args, NULL)) != CU_OK ||
            (r = ar_cuda_driver.EventRecord(st->stop, st->stream)) != CU_OK || (r = elapsed_ms(st, &ms)) != CU_OK)
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
    if ((r = ar_cuda_driver.ModuleLoadData(&module, image)) != CU_OK ||
        (r = ar_cuda_driver.ModuleGetFunction(&st->ceiling_read, module, "attnres_ceiling_read")) != CU_OK ||
        (r = ar_cuda_driver.ModuleGetFunction(&st->ceiling_copy, module, "attnres_ceiling_copy")) != CU_OK) {
        if (module)
            ar_cuda_driver.ModuleUnload(module);
        free(image);
        return ar_cuda_fail(dev, ATTNRES_ELOAD, r, "loading the ceiling kernels");
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
int ar_cuda_ceilings(attnres_device *dev, ar_ceilings *out)
{
    cuda_state *st = dev->state;
    int rc;
    memset(out, 0, sizeof *out);
    out->fma_gflops = NAN;
    out->cache_bytes = (double)st->l2;
    double copy = 0.0;
    if ((rc = ar_cuda_copy_bandwidth(dev, &copy)) != ATTNRES_OK)
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
    if ((rc = alloc_pair(dev, bytes, &a, &b, "allocating the ceiling buffers")) != ATTNRES_OK)
        goto done;
    if ((r = ar_cuda_driver.MemsetD8Async(a, 1, bytes, st->stream)) != CU_OK ||
        (r = ar_cuda_driver.StreamSynchronize(st->stream)) != CU_OK) {
        rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "filling the ceiling buffers");
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
            rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "timing the ceiling kernels");
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
    return timing_leave_pair(dev, pushed, a, b, rc);
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
int ar_cuda_stream_pass(attnres_device *dev, void *buf, const ar_stream_pass *pass, double *us)
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
    CUresult r = ar_cuda_driver.EventRecord(st->start, st->stream);
    for (int s = 0; r == CU_OK && s < AR_STREAM_STEPS; s++) {
        const ar_stream_step *step = &pass->step[s];
        CUdeviceptr x = base + step->offset, y = x + step->bytes;
        unsigned long long n = step->bytes / 16;
        const unsigned grid = (unsigned)step->threads * (unsigned)(dev->units > 0 ? dev->units : 1);
        void *read_args[] = {&x, &n, &x}, *copy_args[] = {&x, &y, &n};
        if (kinds[s] == 1)
            r = ar_cuda_driver.LaunchKernel(st->ceiling_read, grid, 1, 1, 256, 1, 1, 0, st->stream, read_args, NULL);
        else if (kinds[s] == 2)
            r = ar_cuda_driver.LaunchKernel(st->ceiling_copy, grid, 1, 1, 256, 1, 1, 0, st->stream, copy_args, NULL);
        else if (kinds[s] == 3)
            r = ar_cuda_driver.MemcpyDtoDAsync(y, x, step->bytes, st->stream);
    }
    float ms = 0.0f;
    if (r == CU_OK && (r = ar_cuda_driver.EventRecord(st->stop, st->stream)) == CU_OK)
        r = elapsed_ms(st, &ms);
    if (r != CU_OK)
        rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "running a stream pass");
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
int ar_cuda_empty_launch(attnres_device *dev, double *us)
{
    cuda_state *st = dev->state;
    enum { WARM = 10, REPS = 201 };
    double t[REPS];
    int pushed, rc;
    if ((rc = timing_enter(dev, &pushed)) != ATTNRES_OK)
        return rc;
    CUresult r = CU_OK;
    if (!st->empty_module) {
        if ((r = ar_cuda_driver.ModuleLoadData(&st->empty_module, empty_ptx)) != CU_OK ||
            (r = ar_cuda_driver.ModuleGetFunction(&st->empty, st->empty_module, "attnres_empty")) != CU_OK) {
            if (st->empty_module)
                ar_cuda_driver.ModuleUnload(st->empty_module);
            st->empty_module = NULL;
            rc = ar_cuda_fail(dev, ATTNRES_ELOAD, r, "loading the empty kernel");
            goto done;
        }
    }
    for (int i = 0; i < WARM + REPS; i++) {
        float ms = 0.0f;
        if ((r = ar_cuda_driver.EventRecord(st->start, st->stream)) != CU_OK ||
            (r = ar_cuda_driver.LaunchKernel(st->empty, 1, 1, 1, 32, 1, 1, 0, st->stream, NULL, NULL)) != CU_OK ||
            (r = ar_cuda_driver.EventRecord(st->stop, st->stream)) != CU_OK || (r = elapsed_ms(st, &ms)) != CU_OK) {
            rc = ar_cuda_fail(dev, ATTNRES_ELAUNCH, r, "timing an empty launch");
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
