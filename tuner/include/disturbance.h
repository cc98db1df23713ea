/*
 * disturbance.h - whether other work took the machine while the tuner
 * timed: the measuring process's threads waiting for a CPU (Linux's
 * per-thread run-queue wait, /proc/self/task/N/schedstat), and time the
 * hypervisor gave the guest's CPUs to others (steal, /proc/stat), and
 * the device's own streaming pass read after the window against the run's
 * usual reading (device_probe.h). Any of them far from its quiet level
 * means the timings of that window
 * compare kernels on a machine that was not the one they will run on
 * alone (docs/tuning.md, "Disturbance").
 */
#ifndef TUNER_DISTURBANCE_H
#define TUNER_DISTURBANCE_H

#include <stddef.h>

/* Readings at the start of a window. */
typedef struct disturbance_mark {
    double wall_s;       /* monotonic clock */
    double wait_s;       /* all of this process's threads' run-queue wait */
    double steal_ticks;  /* /proc/stat's steal, all CPUs */
    double total_ticks;  /* /proc/stat's user..steal, all CPUs */
    double preempted;    /* involuntary context switches of this process */
    int readable;        /* 0: this system has neither file */
} disturbance_mark;

/* What a window showed: CPU-seconds this process's threads waited for a
 * CPU per second of the window, and the fraction of all CPUs' time stolen.
 * Both NaN where they could not be read. */
typedef struct disturbance {
    double wait_frac;
    double steal_frac;
    double preempted_per_s; /* this process's threads taken off a CPU for another */
    /* The device's streaming pass right after the window, and the median
     * of its readings of the run so far, this one included, in GB/s
     * (device_probe.h); 0 or NaN where none was read. */
    double stream_gbps, stream_usual_gbps;
} disturbance;

/* A window is disturbed from these fractions on. Waits have a floor on a
 * quiet machine (a woken thread waits for its CPU to wake; kernel threads
 * run now and then): on the Zen 4 guest, quiet final rounds read 0-6%, ones
 * beside a hog on every CPU 50-110%. Steal has none. */
#define DISTURBANCE_WAIT 0.20
#define DISTURBANCE_STEAL 0.05
/* A streaming pass this factor slower than the run's usual (the median of
 * its readings) shows a device not in its usual state: the Zen 4 guest's
 * memory bandwidth moved from 67 to 42 GB/s within two minutes once.
 * Against the median, not the first reading: a run that began beside
 * other work would otherwise find every quiet window after it disturbed;
 * nor the fastest: one run read 70 GB/s once and 38-55 otherwise, and
 * held to 70 it timed 10 of 13 final rounds again. */
#define DISTURBANCE_DRIFT 1.25

void disturbance_begin(disturbance_mark *m);
/* The figures of the window that began at m and ends now. */
disturbance disturbance_end(const disturbance_mark *m);
/* 1 when the waits reach DISTURBANCE_WAIT, the steal DISTURBANCE_STEAL,
 * or the streaming pass read DISTURBANCE_DRIFT times slower than the
 * run's usual. */
int disturbance_found(const disturbance *d);
/* "threads waited 42% of the window for a CPU, 0% stolen, 699 preemptions/s"
 * into buf, and where a streaming pass was read, ", copy pass at 42.3 GB/s
 * against the run's usual 67.1". */
void disturbance_describe(const disturbance *d, char *buf, size_t len);

#endif
