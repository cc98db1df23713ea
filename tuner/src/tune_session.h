/*
 * tune_session.h - the state of one `attnres tune` run, shared by the files
 * that do its parts: candidates.c (templates, sources, compilation),
 * search.c (measuring one problem and choosing its winner) and cmd_tune.c
 * (options, the run record and the summary).
 */
#ifndef TUNER_TUNE_SESSION_H
#define TUNER_TUNE_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "argen.h"
#include "ardb.h"
#include "device.h"
#include "measure.h"
#include "problems.h"
#include "rooflines.h"

typedef enum strategy {
    STRATEGY_HALVING,    /* screen all cheaply, measure the best fully */
    STRATEGY_EXHAUSTIVE, /* measure every candidate fully */
    STRATEGY_RANDOM      /* measure a deterministic random sample fully */
} strategy;

typedef struct tune_opts {
    const char *device, *db, *preset, *problems, *misses;
    int jobs, quiet, isolate, revalidate;
    strategy strategy;
    int64_t budget_candidates; /* 0: no limit */
    double budget_seconds;     /* per problem; 0: no limit */
    double time_limit_s;       /* per candidate */
    uint64_t seed;
    int shard_index, shard_count;
} tune_opts;

/* One variant's source, emitted once per run and shared by its problems. */
typedef struct source_entry {
    char *id, *source, *kernel, *json, *template_name;
    char hash[65], build_key[65];
    int64_t candidate_id;
    int have_binary;    /* in the database */
    int compile_failed;
    char *compile_log;
    int pruned;         /* the compiler's resource report rules it out */
    char resources[160];/* that report as JSON, "" when there is none */
    void *blob;         /* freshly compiled, to store */
    size_t blob_size;
} source_entry;

typedef struct tuner {
    tune_opts opt;
    attnres_device *dev;
    ardb *db;
    int64_t device_id, run_id;
    rooflines roof; /* measured before the first candidate */
    measure_policy policy;
    argen **templates;
    size_t ntemplates;
    source_entry **sources; /* stable pointers: candidates keep them */
    size_t nsources;
    size_t reused, measured, failed; /* candidate counts over the run */
} tuner;

/* One row of the winners table. */
typedef struct winner_row {
    char problem[160], variant[128];
    double median_us, gbps, roofline;
    int found;
} winner_row;

double now_s(void);
void log_line(const tuner *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *strategy_name(strategy s);

/* candidates.c */
int load_templates(tuner *t);
void templates_hash(tuner *t, char out[65]);
/* The source of variant id of template g, emitted and recorded once. */
source_entry *get_source(tuner *t, argen *g, const char *id);
/* Compiles the sources that have no binary yet, jobs at a time, and
 * stores the binaries. */
void compile_missing(tuner *t, source_entry **todo, size_t count);

/* search.c: measures one problem and records its winner in w. */
int tune_problem_one(tuner *t, const tune_problem *tp, size_t index, size_t total, winner_row *w);

#endif
