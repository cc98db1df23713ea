/*
 * test_cuda_open.h - how a test that runs kernels on cuda:0 starts: it
 * needs NVRTC and a CUDA device, the simulated driver that ctest names in
 * ATTNRES_CUDA_DRIVER or a real one. Without NVRTC, or without a device
 * where no driver was named, the test is skipped; a named driver that does
 * not open fails it. Header-only.
 */
#ifndef ATTNRES_TEST_CUDA_OPEN_H
#define ATTNRES_TEST_CUDA_OPEN_H

#include <stdio.h>
#include <stdlib.h>

#include "attnres.h"
#include "nvrtc.h"

/* Opens cuda:0 as *dev; 0 when it is open, else the program's exit
 * status with the reason printed: 77 (ctest's skip) or 1. */
static inline int test_cuda_open(attnres_device **dev)
{
    char why[512];
    if (ar_nvrtc_available(why, sizeof why) != 0) {
        printf("SKIP: NVRTC is not available: %s\n", why);
        return 77;
    }
    const char *driver = getenv("ATTNRES_CUDA_DRIVER");
    char msg[512] = "";
    if (attnres_device_open("cuda:0", dev, msg, sizeof msg) == ATTNRES_OK)
        return 0;
    *dev = NULL;
    if (driver && *driver) {
        fprintf(stderr, "FAIL: cuda:0 did not open with ATTNRES_CUDA_DRIVER=%s: %s\n", driver, msg);
        return 1;
    }
    printf("SKIP: no CUDA device (%s) and ATTNRES_CUDA_DRIVER is unset\n", msg);
    return 77;
}

#endif
