/*
 * disturbance.h - whether other work took the machine while the tuner
 * timed: the measuring process's threads waiting for a CPU (Linux's
 * per-thread run-queue wait, /proc/self/task/N/schedstat), and time the
 * hypervisor gave the guest's CPUs to others (steal, /proc/stat). Either
 * above a few percent of the window means the timings of that window
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
    int readable;        /* 0: this system has neither file */
} disturbance_mark;

/* What a window showed: CPU-seconds this process's threads waited for a
 * CPU per second of the window, and the fraction of all CPUs' time stolen.
 * Both NaN where they could not be read. */
typedef struct disturbance {
    double wait_frac;
    double steal_frac;
} disturbance;

/* A window is disturbed from this fraction on, of either figure. */
#define DISTURBANCE_FRACTION 0.05

void disturbance_begin(disturbance_mark *m);
/* The figures of the window that began at m and ends now. */
disturbance disturbance_end(const disturbance_mark *m);
/* 1 when either figure reaches DISTURBANCE_FRACTION. */
int disturbance_found(const disturbance *d);
/* "threads waited 12% of the window for a CPU, 0% stolen" into buf. */
void disturbance_describe(const disturbance *d, char *buf, size_t len);

#endif
