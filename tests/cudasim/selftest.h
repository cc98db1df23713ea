/*
 * selftest.h - the small harness the simulator's own tests share: a check
 * counter that prints failures, the text of a CUresult, and the context
 * reset and synchronisation the fault tests lean on. Header-only: each test
 * is one translation unit.
 */
#ifndef CUDASIM_SELFTEST_H
#define CUDASIM_SELFTEST_H

#include <stdarg.h>
#include <stdio.h>

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

#endif
