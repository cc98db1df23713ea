/*
 * cpu_ceilings.h - the CPU device's ceilings (docs/design.md §2).
 */
#ifndef AR_CPU_CEILINGS_H
#define AR_CPU_CEILINGS_H

#include "cpu_pool.h"
#include "device.h"

/* Measures every streaming kernel (memcpy, a copy with non-temporal
 * stores, read-only sums over one and over eight streams) on 1, 2, 4, ...
 * and all threads of the pool, two rounds each keeping its best, and the
 * fp32 FMA peak. ATTNRES_OK, or the failing status with the reason on dev. */
int cpu_ceilings_measure(attnres_device *dev, cpu_pool *pool, ar_ceilings *out);

#endif
