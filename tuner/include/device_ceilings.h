/*
 * device_ceilings.h - what a tuning run measures of its device before any kernel:
 * the ceilings every timing is compared with (docs/design.md §2).
 */
#ifndef ATTNRES_DEVICE_CEILINGS_H
#define ATTNRES_DEVICE_CEILINGS_H

#include <stddef.h>

#include "attnres-impl.h"

typedef struct device_ceilings {
    double copy_gbps; /* best copy kernel: bytes read + written per second */
    double read_gbps; /* best read-only kernel; NaN where not measured */
    double copy_best_gbps, read_best_gbps; /* the same over each kernel's
                         fastest run (0: not measured, use the above) */
    double launch_us; /* an empty launch */
    ar_ceilings ceil; /* every streaming kernel at every thread count (n = 0:
                         the backend has only the two figures above) */
} device_ceilings;

/* Measures all of them; ATTNRES_OK, or the failing status with the reason
 * in attnres_device_errmsg(dev). A backend without a read measurement leaves read_gbps
 * NaN. */
int device_ceilings_measure(attnres_device *dev, device_ceilings *out);

/* "copy bandwidth 41.3 GB/s, read 28.1 GB/s, empty launch 0.11 us" into
 * buf (read "not measured" where NaN), then ", FMA 512 GFLOP/s" where
 * measured, then the largest cache: ", largest cache 32 MiB by a read sweep
 * (the system says 32 MiB)", or where no sweep found it, its size as the
 * device says. */
void device_ceilings_format(const device_ceilings *r, char *buf, size_t size);

/* The ceiling of a kernel that reads `read_bytes` and writes `write_bytes`,
 * in GB/s of their sum: the time-based blend of docs/design.md §2,
 *   (R + W) / (R / read + W / write),
 * where the effective write rate follows from the copy and read ceilings
 * (a copy reads and writes B bytes in 2B / copy seconds). Pure reads get the
 * read ceiling, equal reads and writes the copy ceiling. Without a read
 * ceiling it is the copy ceiling. */
double device_ceilings_ceiling(const device_ceilings *r, double read_bytes, double write_bytes);

/* The out-of-cache check (docs/design.md §2): a kernel moving `bytes` runs
 * out of cache when they are at least four times the device's largest cache
 * (64 MiB where the device does not say); there no timing may exceed the
 * ceiling that matches its traffic by more than the noise, twice its
 * relative spread and at least 5%. device_ceilings_above: 1 when a fraction of
 * the ceiling is above it beyond that noise. */
int device_ceilings_out_of_cache(const device_ceilings *r, double bytes);
/* 1 when `bytes` are at least the device's largest cache (64 MiB where it
 * does not say): a kernel's data cannot all sit in it, and a streaming pass
 * over as many bytes evicts what kernels timed before it left there. Where
 * a kernel is paired with such a pass (paired_stream.h). */
int device_ceilings_beyond_cache(const device_ceilings *r, double bytes);

/* The ceiling of device_ceilings_ceiling taken from the streaming kernels'
 * fastest runs instead of their medians: what the check holds a kernel's
 * median to. A kernel's median can beat the median ceiling when the
 * ceilings were measured in a slow moment of a shared host; beating the
 * fastest streaming run says the ceiling is not one. */
double device_ceilings_fastest_ceiling(const device_ceilings *r, double read_bytes, double write_bytes);
double device_ceilings_noise(double median_us, double spread_us);
int device_ceilings_above(double fraction, double noise);

/* The effective write rate of the blend, GB/s; INFINITY where the copy's
 * writes cost nothing beyond its reads, NaN without a read ceiling. */
double device_ceilings_write_gbps(const device_ceilings *r);

/* The ceilings as one JSON object: every point, the FMA peak, the cache
 * size and the blend's write rate, for the run's record. */
void device_ceilings_json(const device_ceilings *r, char *buf, size_t size);

/* A size that holds device_ceilings_json's text of every point (under 128 bytes
 * each) and of the figures before them. */
enum { DEVICE_CEILINGS_JSON_SIZE = 1024 + AR_CEILING_POINTS * 128 };

/* Restores a run's recorded ceilings: copy, read and launch from its
 * columns, the fastest runs, FMA peak and cache size from the
 * device_ceilings_json text it recorded. The per-kernel points are not restored
 * (ceil.n = 0). -1 when json holds no copy bandwidth. */
int device_ceilings_from_record(const char *json, double copy_gbps, double read_gbps, double launch_us, device_ceilings *out);

/* One line per kernel: "memcpy  1 thread 12.3 GB/s, 2 threads 20.1 GB/s";
 * written to buf, lines separated by '\n'. */
void device_ceilings_detail(const device_ceilings *r, char *buf, size_t size);

/* 100 * gbps / limit into buf as "52.1%", or "-" without a limit. */
void device_ceilings_percent(double gbps, double limit, char *buf, size_t size);

#endif
