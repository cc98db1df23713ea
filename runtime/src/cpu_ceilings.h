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

/* A size counts as held by a cache where it reads at least this many
 * times as fast as memory. */
#define CPU_CACHE_KNEE_RATIO 1.5

/* The largest cache's effective size from a read sweep: bytes[0..n)
 * ascending, each read at gbps[i], the last so large that its rate is
 * memory's. The largest size read at least CPU_CACHE_KNEE_RATIO times as
 * fast as the last; 0 where none is (the sweep shows no cache). */
double cpu_cache_knee(const double *bytes, const double *gbps, int n);

/* One pass of the streaming kernels over buf (device.h, ar_stream_pass),
 * each step on its thread count of the pool, timed as a whole into *us.
 * ATTNRES_EINVAL naming the step for an unknown kernel, a thread count
 * beyond the pool, or bytes and offsets off their multiples. */
int cpu_stream_pass(attnres_device *dev, cpu_pool *pool, char *buf, const ar_stream_pass *pass, double *us);

#endif
