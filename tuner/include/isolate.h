/*
 * isolate.h - measuring candidates so that a bad one cannot end the run.
 *
 * On the CPU a candidate runs in a forked child process (one child takes a
 * batch of them in turn): a kernel that crashes kills only the child
 * (launch_failed, with the signal), one that hangs is killed at the time
 * limit (timeout). The child inherits the
 * problem's buffers copy-on-write and opens its own CPU device, so the
 * parent's worker threads are never shared across fork. On CUDA, where a
 * context cannot cross fork, candidates run in-process.
 */
#ifndef TUNER_ISOLATE_H
#define TUNER_ISOLATE_H

#include <stddef.h>

#include "ardb_write.h"
#include "attnres-impl.h"
#include "disturbance.h"
#include "measure.h"
#include "paired_stream.h"

/* What a candidate is, for loading it anywhere. */
typedef struct job_kernel {
    const char *variant, *kernel_name, *params_json, *build_key;
    const char *source; /* what blob was compiled from (for a recompile) */
    const void *blob;   /* the compiled binary */
    size_t blob_size;
} job_kernel;

/* The outcome of measuring one candidate. */
typedef struct job_result {
    ardb_status status;
    double rel_err;
    timing tm;
    /* Interleaved with a streaming pass (job_options.pair): the median over
     * rounds of the kernel's rate over the pass's in the same round, the
     * median absolute deviation of that ratio, and the pass's median GB/s;
     * NaN without a pass. */
    double paired, paired_spread, pair_gbps;
    /* Seconds the measurement spent verifying and timing (in the child,
     * when isolated), for the run's breakdown (tune_stages.h). */
    double verify_s, time_s;
    /* A screening launch cut short at its deadline (job_batch.cut_after):
     * status skipped, tm.stopped set; the measuring process ended after
     * sending this result. */
    int cut;
    /* job_interleave: what other work took from the rounds' window. */
    disturbance dist;
    char message[512];
} job_result;

typedef struct job_options {
    int verify;             /* check against the reference first */
    measure_policy policy;  /* timing policy; reps 0 = verify only */
    double time_limit_s;    /* per job; 0 = none */
    int isolate;            /* fork a child (CPU only) */
    const paired_stream *pair; /* job_interleave: a pass timed in each round; NULL: none */
    /* job_interleave: each candidate's share of a round is a batch of
     * launches of about this many microseconds, sized by its warm-up
     * launch (its median launch is the round's figure); 0: one launch. */
    double round_us;
} job_options;

/* Measures one candidate: verify (when asked) then time. Never fails as a
 * whole: the result's status says what happened. */
void job_measure(attnres_device *dev, bench_case *bc, const job_kernel *k, const job_options *opt,
                 job_result *out);

/* Candidates measured one after another (job_measure_batch). */
typedef struct job_batch {
    const job_kernel *ks;
    size_t k;
    const job_options *opt;
    /* The fastest median known before the batch (INFINITY: none), and the
     * stop threshold it gives a candidate's first timed launch
     * (measure_policy.stop_above_us); NULL: never stop. */
    double fastest_us;
    double (*stop_above)(double fastest_us);
    /* Once the fastest so far is above this many microseconds, a child's
     * candidates after its first time without warm-up launches (0: they
     * always warm up): what a warm-up is for, the first touch of the
     * timing buffers, the first of the child did, and verification has
     * just run the candidate. */
    double warm_once_above_us;
    /* The deadline of a candidate's launches before its stop decision
     * (the warm-up, if any, and the first timed one), in microseconds, from
     * the fastest before it; past it the launch is cut short (job_result.
     * cut). Applies in a measuring process only; NULL or 0: never cut. */
    double (*cut_after)(double fastest_us, int launches);
} job_batch;

/* Measures a batch as job_measure would each of them, in order, with each
 * candidate's stop threshold and deadline from the fastest of those before
 * it. On the CPU one child process measures them all, so its start and its
 * first touch of the problem's buffers are paid once a batch: a candidate
 * that crashes, overruns the time limit or is cut at its deadline ends that
 * child, is recorded as such, and a new child measures the rest. out has
 * b->k results. */
void job_measure_batch(attnres_device *dev, bench_case *bc, const job_batch *b, job_result *out);

/* Times k candidates interleaved (A B C A B C ...) for `rounds` rounds, so
 * that drift in the machine's state affects them all alike; with
 * opt->pair, the streaming pass closes each round (A B C S A B C S ...)
 * and each result gets its rate relative to the pass's. The results'
 * timings are the rounds' figures after interleave_normalize. */
void job_interleave(attnres_device *dev, bench_case *bc, const job_kernel *ks, size_t k, int rounds,
                    const job_options *opt, job_result *out);

/* Scales each round's times t[i * rounds + r] by a factor common to the
 * round's candidates (those with ok[i]): the rounds' median level over the
 * round's own (its median candidate, or the geometric mean of two). A
 * disturbance that slows a whole round then moves no candidate against
 * another, and rankings inside a round are unchanged. With fewer than two
 * candidates nothing changes. */
void interleave_normalize(double *t, const int *ok, size_t k, int rounds);

#endif
