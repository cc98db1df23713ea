/*
 * test_device.h - opening the CPU device at the start of a test program,
 * with the reason printed when it cannot be opened: without the device no
 * case can run, so the program stops there. Header-only.
 */
#ifndef ATTNRES_TEST_DEVICE_H
#define ATTNRES_TEST_DEVICE_H

#include <stdio.h>

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

#endif
