/*
 * rooflines.h - what a tuning run measures of its device before any kernel:
 * the limits every timing is compared with (DESIGN §2).
 */
#ifndef ATTNRES_ROOFLINES_H
#define ATTNRES_ROOFLINES_H

#include <stddef.h>

#include "device.h"

typedef struct rooflines {
    double copy_gbps; /* bytes read + written per second by a device copy */
    double read_gbps; /* bytes read per second alone; NaN where not measured */
    double launch_us; /* an empty launch */
} rooflines;

/* Measures all three, copy and read in alternating rounds, each keeping its
 * best; ATTNRES_OK, or the failing status with the reason in attnres_device_errmsg(dev). A
 * backend without a read measurement leaves read_gbps NaN. */
int rooflines_measure(attnres_device *dev, rooflines *out);

/* "copy bandwidth 41.3 GB/s, read 28.1 GB/s, empty launch 0.11 us" into
 * buf (read "not measured" where NaN). */
void rooflines_format(const rooflines *r, char *buf, size_t size);

/* 100 * gbps / limit into buf as "52.1%", or "-" without a limit. */
void rooflines_percent(double gbps, double limit, char *buf, size_t size);

#endif
