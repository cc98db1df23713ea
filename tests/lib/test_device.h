/*
 * test_device.h - opening the CPU device at the start of a test program,
 * with the reason printed when it cannot be opened: without the device no
 * case can run, so the program stops there; and at each ISA level of the
 * built-in kernels (runtime/src/cpu_builtin.h), for the tests that run
 * every case at every level. Header-only.
 */
#ifndef ATTNRES_TEST_DEVICE_H
#define ATTNRES_TEST_DEVICE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"

/* Opens the CPU device as *dev; 0 on success, else -1 with the library's
 * message printed. */
static inline int test_cpu_open(attnres_device **dev)
{
    char msg[512] = "";
    const int rc = attnres_device_open("cpu", dev, msg, sizeof msg);
    if (rc != ATTNRES_OK) {
        fprintf(stderr, "cannot open the CPU device: %s (%s)\n", attnres_errstr(rc), msg);
        return -1;
    }
    return 0;
}

/* The built-in kernels' levels of this target, widest first; "scalar" is
 * the generic kernels alone. */
#if defined(__x86_64__)
static const char *const test_builtin_levels[] = {"avx512bf16", "avx512", "avx2", "sse2", "scalar"};
#elif defined(__aarch64__)
static const char *const test_builtin_levels[] = {"neon", "scalar"};
#else
static const char *const test_builtin_levels[] = {"scalar"};
#endif
#define TEST_BUILTIN_LEVELS (sizeof test_builtin_levels / sizeof test_builtin_levels[0])

/* Whether this CPU runs the level's instructions; one it lacks is still
 * opened (plans take the next level down). Must agree with the feature
 * checks in runtime/src/cpu_builtin.c. */
static inline int test_host_has_level(const char *name)
{
    if (strcmp(name, "scalar") == 0)
        return 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (strcmp(name, "avx512bf16") == 0)
        return test_host_has_level("avx512") && __builtin_cpu_supports("avx512bf16");
    if (strcmp(name, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (strcmp(name, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (strcmp(name, "sse2") == 0)
        return 1;
#elif defined(__aarch64__)
    if (strcmp(name, "neon") == 0)
        return 1;
#endif
    return 0;
}

/* Opens the CPU device as *dev at the level (ATTNRES_CPU_BUILTIN_ISA, left
 * set): 1 when opened, 0 when this build has no such level (a compiler
 * without -mavx512bf16 builds none), -1 when the open failed. Says why
 * on stderr when it failed, and unless quiet (a test that only lists its
 * cases) why a level is skipped or runs on the next one down. */
static inline int test_cpu_open_level(const char *level, attnres_device **dev, int quiet)
{
    if (!test_host_has_level(level) && !quiet)
        printf("skip %s: this CPU lacks it (plans take the next level down)\n", level);
    setenv("ATTNRES_CPU_BUILTIN_ISA", level, 1);
    char msg[512] = "";
    if (attnres_device_open("cpu", dev, msg, sizeof msg) == ATTNRES_OK)
        return 1;
    if (strcmp(level, "avx512bf16") == 0 && strstr(msg, "is not an ISA level of this build")) {
        if (!quiet)
            printf("skip %s: this build has no such level (%s)\n", level, msg);
        return 0;
    }
    fprintf(stderr, "cannot open the CPU device with ATTNRES_CPU_BUILTIN_ISA=%s: %s\n", level, msg);
    return -1;
}

#endif
