/*
 * tune_stages.h - where a tuning run's time went: seconds and candidates
 * per stage (ceilings, generation, compilation, verification, screening,
 * full timing, final rounds), printed after the winners table and recorded
 * with the run (runs.stages, schema v7) so that runs can be compared.
 *
 * Stages are timed on the tuner's clock where the tuner runs them. Inside
 * a measurement (which on the CPU runs in a child process) the child times
 * its own verification and timing; what the tuner waits for beyond those
 * (fork, opening the device in the child, loading the kernel) is counted
 * as "isolation".
 */
#ifndef TUNER_TUNE_STAGES_H
#define TUNER_TUNE_STAGES_H

#include <stddef.h>

typedef enum tune_stage {
    STAGE_CEILINGS,     /* the device's streaming kernels and launch time */
    STAGE_GENERATION,   /* enumerating, emitting and recording variants */
    STAGE_COMPILE,      /* the compile pool (items: variants compiled) */
    STAGE_VERIFY,       /* runs against the fp64 reference */
    STAGE_SCREENING,    /* the first, cheap timings (or full ones when exhaustive) */
    STAGE_FULL,         /* the halving's second round */
    STAGE_FINAL,        /* the interleaved final rounds (items: problems) */
    STAGE_ISOLATION,    /* child processes and kernel loads around measurements */
    STAGE_COUNT
} tune_stage;

typedef struct tune_stages {
    double seconds[STAGE_COUNT];
    size_t items[STAGE_COUNT];
    double total_s;     /* the run's wall time, set when it ends */
    size_t pruned;      /* candidates left out before compiling (T.prune) */
    size_t stopped;     /* screenings stopped after one timed launch */
    size_t cut;         /* screenings cut short during a launch */
} tune_stages;

/* The stage's name as printed and recorded ("ceilings", "generation", ...). */
const char *tune_stage_name(tune_stage s);

/* Adds seconds and items to a stage. Negative seconds (clock rounding when
 * a stage is computed as a difference) count as zero. */
void tune_stages_add(tune_stages *st, tune_stage s, double seconds, size_t items);

/* A table, one line a stage and one for what no stage accounts for. */
void tune_stages_format(const tune_stages *st, char *buf, size_t len);

/* {"total_s": ..., "ceilings": {"s": ..., "n": ...}, ..., "other_s": ...};
 * more, when not NULL, is further members (", \"key\": value ...") put
 * before the closing brace. */
void tune_stages_json(const tune_stages *st, const char *more, char *buf, size_t len);

#endif
