/*
 * selftest.h - the small harness the simulator's own tests share: a check
 * counter that prints failures, the text of a CUresult, the context reset
 * and synchronisation the fault tests lean on, and the start and end of a
 * test program (the device's primary context made current, then released,
 * and the tally). Header-only: each test is one translation unit.
 */
#ifndef CUDASIM_SELFTEST_H
#define CUDASIM_SELFTEST_H

#include <stdarg.h>
#include <stdio.h>

#include "../lib/check.h"
#include "driver_api_decl.h"

static int g_pass, g_fail;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static void check(int ok, const char *fmt, ...)
{
    if (ok) {
        g_pass++;
        return;
    }
    g_fail++;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static inline const char *err_text(CUresult r)
{
    const char *s = NULL;
    if (cuGetErrorString(r, &s) != CUDA_SUCCESS || !s)
        return "(no text)";
    return s;
}

static inline CUresult ctx_reset(void)
{
    if (cuDevicePrimaryCtxReset_v2)
        return cuDevicePrimaryCtxReset_v2(0);
    return cuDevicePrimaryCtxReset(0);
}

static inline CUresult ctx_sync(void)
{
    return cuCtxSynchronize ? cuCtxSynchronize() : cuStreamSynchronize(NULL);
}

/* Makes the simulated device's primary context current as *dev's; 0, else
 * -1 with the failure printed as the run's tally. */
static inline int selftest_begin(CUdevice *dev)
{
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(dev, 0) || cuDevicePrimaryCtxRetain(&ctx, *dev) || cuCtxPushCurrent_v2(ctx)) {
        printf("cannot set up the simulated device\n0 passed, 1 failed\n");
        return -1;
    }
    return 0;
}

/* Releases the context selftest_begin made current and prints the tally;
 * the program's exit status. */
static inline int selftest_end(CUdevice dev)
{
    cuCtxPopCurrent_v2(NULL);
    cuDevicePrimaryCtxRelease_v2(dev);
    if (!check_listing)
        printf("%d passed, %d failed\n", g_pass, g_fail);
    return check_exit_status(g_fail);
}

/* One case of a self-test: its name (what --case selects) and function. */
typedef struct {
    const char *name;
    void (*fn)(void);
} selftest_case;
#define SELFTEST_CASE(fn) {#fn, fn}

/* A self-test's main after its own setup: runs cases[0, n) on the
 * simulated device, its failures counted in g_fail; the exit status. */
static inline int selftest_run(const selftest_case *cases, size_t n)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    CUdevice dev;
    if (selftest_begin(&dev) != 0)
        return 1;
    for (size_t i = 0; i < n; i++)
        check_run_case(cases[i].name, cases[i].fn, &g_fail, 0);
    return selftest_end(dev);
}

#endif
