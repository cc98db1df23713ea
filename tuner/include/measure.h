/*
 * measure.h - verification against the fp64 reference and timing, for one
 * problem on one device. The inputs are fresh random data each run.
 */
#ifndef TUNER_MEASURE_H
#define TUNER_MEASURE_H

#include <stdint.h>

#include "ardb_write.h"
#include "attnres-impl.h"
#include "problems.h"

/* How timings are taken; recorded with every run (as JSON). */
typedef struct measure_policy {
    int warmup;          /* launches before timing */
    int min_reps, max_reps;
    double target_ms;    /* keep repeating until this much time is spent */
    int flush;           /* flush caches between repetitions (GPUs) */
    int64_t verify_tokens; /* tokens verified against the reference */
    int simulated;       /* the device is simulated: times are a model */
    /* Screening: when the first timed launch takes longer than this, stop
     * there (timing.stopped) instead of timing the rest; 0 never stops. */
    double stop_above_us;
    /* Called once the warm-up and the stop decision are behind, before
     * the rest of the launches are timed (NULL: nothing): a deadline for
     * those first launches ends there (isolate.c). Never recorded. */
    void (*decided)(void);
} measure_policy;

/* The policy for dev: many flushed repetitions on GPUs, fewer on the CPU,
 * and three unflushed ones on a simulated device (its times are a model). */
void measure_policy_default(measure_policy *p, const attnres_device *dev);
void measure_policy_json(const measure_policy *p, char *buf, size_t len);

/* Device buffers and host reference data for one problem. */
typedef struct bench_case bench_case;

/* Prepares random inputs (rows differing in magnitude by 100x), the fp64
 * reference for the first verify_tokens tokens, and timing buffers for
 * all T tokens. NULL with a message on failure. */
bench_case *bench_case_create(attnres_device *dev, const tune_problem *tp, const measure_policy *pol,
                              uint64_t seed, char *err, size_t err_len);
void bench_case_free(bench_case *bc);

/* Bytes one launch must move at the problem's T (DESIGN §2). */
double bench_case_bytes(const bench_case *bc);
/* Its bytes split into read and written (problem_traffic). */
void bench_case_traffic(const bench_case *bc, double *read_bytes, double *write_bytes);

/* Runs the kernel on poisoned outputs and compares with the reference:
 * writes ||out - ref|| / ||ref|| (NaN when anything is NaN) to rel_err.
 * Returns ATTNRES_OK or the launch status. */
int bench_case_verify(bench_case *bc, const ar_kernel *k, double *rel_err);

/* 1 when the last bench_case_verify ran the kernel twice on the same
 * inputs and the two runs' outputs differed in any bit (the backwards: the
 * mix's and the phases', whose sums over tokens must be deterministic);
 * such a kernel never wins. */
int bench_case_nondeterministic(const bench_case *bc);
/* What differed in that case: each gradient whose two runs differ, with
 * the count of its values that do and the first of them, e.g. "dquery (3
 * of 128 values, first at element 17)"; "" when the runs agreed. */
const char *bench_case_difference(const bench_case *bc);

/* Tolerance of the problem's dtype (DESIGN §1). */
double bench_case_tolerance(const bench_case *bc);

/* The verdict on the last bench_case_verify, which gave rel_err:
 * ARDB_STATUS_NONDETERMINISTIC when its two runs differed (checked first: a
 * kernel whose runs differ is unusable for training however close either
 * run is), ARDB_STATUS_WRONG_RESULT when rel_err exceeds the dtype's
 * tolerance or is NaN, or when a gradient summed over tokens in fp32 (the mix
 * backward's dquery and dalpha, the phase backwards' query gradients and
 * dout_gain) or phase 2's backward's fp32 dlse misses fp32's 1e-5 whatever
 * the storage type, else ARDB_STATUS_OK. why gets the reason ("" for OK). */
ardb_status bench_case_judge(const bench_case *bc, double rel_err, char *why, size_t why_len);

typedef struct timing {
    double median_us, min_us, max_us, spread_us;
    int reps;
    int stopped; /* stopped after one launch (measure_policy.stop_above_us) */
} timing;

int bench_case_time(bench_case *bc, const ar_kernel *k, const measure_policy *pol, timing *out);

/* Median, extremes and median absolute deviation of n samples (n >= 1);
 * sorts t and overwrites it. */
void timing_summarize(double *t, int n, timing *out);

/* Times n launches back to back (each after a cache flush when asked):
 * times_us gets each launch's microseconds. */
int bench_case_time_launches(bench_case *bc, const ar_kernel *k, int n, int flush, double *times_us);

/* Rewrites every page of the timing buffers a launch writes (outputs, lse
 * rows, phase 2's partial rows where it adds in place) with its own bytes
 * on a CPU device, so that a forked child takes its copies of them here,
 * not during its first timed launch, where they would be charged to a
 * candidate. */
void bench_case_touch(bench_case *bc);

/* Moves the case to another handle of the same device (a forked child
 * opens its own CPU device; the buffers are the same memory). */
void bench_case_set_device(bench_case *bc, attnres_device *dev);

#endif
