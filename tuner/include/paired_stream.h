/*
 * paired_stream.h - the ceiling of a kernel timed in the kernel's own
 * rounds: a pass of the device's streaming kernels that moves what the
 * kernel moves, read and written the way the run's ceiling assumes
 * (docs/design.md §2). On a shared host the ceilings measured at the start
 * of a run and a kernel timed minutes later can see different loads; a
 * kernel's time over the pass's time in the same round cannot.
 */
#ifndef TUNER_PAIRED_STREAM_H
#define TUNER_PAIRED_STREAM_H

#include <stddef.h>

#include "attnres-impl.h"
#include "device_ceilings.h"

typedef struct paired_stream {
    ar_stream_pass pass;
    void *buf;       /* device memory the pass streams over */
    size_t buf_bytes;
    double bytes;    /* what one pass moves: read + written */
    int blocks_per_sm; /* a CUDA pass: its steps' threads are blocks per SM */
} paired_stream;

/* Prepares the pass for a kernel that reads read_bytes and writes
 * write_bytes: the writes as a copy by the run's fastest copy kernel, the
 * other reads by its fastest read kernel (or, where reading measured below
 * half the copy figure, as a copy too: the blend's rule), each at the
 * thread count where it was fastest, over a fresh buffer of about the
 * kernel's size written once. Returns 1 with *out set, 0 where no pass
 * matches (the device has no pass or no read ceiling, the kernel's data
 * fit its largest cache (device_ceilings_beyond_cache), or it writes more than
 * it reads), or -1 with the reason
 * in err. */
int paired_stream_create(attnres_device *dev, const device_ceilings *r, double read_bytes, double write_bytes,
                         paired_stream **out, char *err, size_t err_len);

/* paired_stream_create for the bytes that the kernels of a bench case move
 * (bench_case_traffic in measure.h). */
struct bench_case;
int paired_stream_for_case(attnres_device *dev, const device_ceilings *r, const struct bench_case *bc, paired_stream **out,
                           char *err, size_t err_len);
void paired_stream_free(attnres_device *dev, paired_stream *ps);

/* Times one pass, in microseconds. */
int paired_stream_run(attnres_device *dev, const paired_stream *ps, double *us);

/* "copy-nt on 2 threads over 1.10 GB + read-8streams on 2 threads over
 * 9.90 GB"; on CUDA "memcpy-dtod over 0.50 GB + read at 4 blocks per SM
 * over 4.50 GB" (below 0.1 GB a step's bytes are given in MB). */
void paired_stream_describe(const paired_stream *ps, char *buf, size_t size);

#endif
