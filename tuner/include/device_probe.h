/*
 * device_probe.h - the device's own state, read again while a run goes on:
 * one short streaming pass beyond the largest cache, timed at the start of
 * a run (right after its ceilings) and after each try of a final round.
 * A host's memory bandwidth can move by a third within minutes while no
 * thread of the tuner waits for a CPU (a neighbour on the same memory);
 * a pass that reads far below the run's usual reading (the median of its
 * readings so far) shows such a window (disturbance.h, docs/tuning.md
 * "Disturbance").
 */
#ifndef TUNER_DEVICE_PROBE_H
#define TUNER_DEVICE_PROBE_H

#include <stddef.h>

#include "attnres-impl.h"
#include "paired_stream.h"
#include "device_ceilings.h"

/* Each reading is the median of this many passes, after one untimed. */
#define DEVICE_PROBE_PASSES 7
/* The pass moves four times the largest cache, and at most this much. */
#define DEVICE_PROBE_MAX_BYTES (1024.0 * 1048576.0)

typedef struct device_probe {
    paired_stream *pass; /* a copy by the run's fastest copy kernel */
    double first_gbps, last_gbps, min_gbps, max_gbps;
    double usual_gbps;   /* the median of the readings so far: what each
                            reading is held to */
    double *all;         /* every reading, in order */
    int readings, cap;
} device_probe;

/* Prepares the probe of dev from the run's ceilings r. Returns 1 with
 * *out set, 0 where dev cannot be probed (a simulated device, whose times
 * are a model; no streaming pass or copy ceiling), or -1 with the reason
 * in err. */
int device_probe_create(attnres_device *dev, const device_ceilings *r, device_probe **out, char *err, size_t err_len);
void device_probe_free(attnres_device *dev, device_probe *p);

/* Takes one reading, in GB/s, and keeps it (first, last, least, most, the
 * median so far); NaN, and nothing kept, where a pass failed or memory for
 * it ran out. p may be NULL (NaN). */
double device_probe_read(attnres_device *dev, device_probe *p);

/* "copy pass 41.2 GB/s at the start, 40.9 at the end, 39.0-42.0 over 14
 * readings, median 41.0" into buf; "" where p is NULL or has no reading. */
void device_probe_describe(const device_probe *p, char *buf, size_t len);

/* The same as a JSON object for the run's record ("{}" where none). */
void device_probe_json(const device_probe *p, char *buf, size_t len);

#endif
