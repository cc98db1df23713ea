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
#include "device_probe.h"
#include "ardb_write.h"
#include "attnres-impl.h"
#include "measure.h"
#include "problems.h"
#include "device_ceilings.h"
#include "tune_stages.h"
#include "tuner_base.h"

typedef enum strategy {
    STRATEGY_HALVING,    /* screen all cheaply, measure the best fully */
    STRATEGY_EXHAUSTIVE, /* measure every candidate fully */
    STRATEGY_RANDOM      /* measure a deterministic random sample fully */
} strategy;

typedef struct tune_opts {
    const char *device, *db, *preset, *problems, *misses;
    int jobs, quiet, isolate, revalidate;
    int no_prune;        /* tune what the templates would prune (T.prune) */
    int explain_pruning; /* list each pruned variant and why */
    strategy strategy;
    int64_t budget_candidates; /* 0: no limit */
    double budget_seconds;     /* per problem; 0: no limit */
    double time_limit_s;       /* per candidate */
    uint64_t seed;
    int shard_index, shard_count;
    int retries;               /* final rounds timed again after a disturbed one */
    /* A database whose latest run on this device, if it measured the
     * ceilings within TUNE_CEILINGS_FROM_MAX_AGE_S, gives them to this run
     * (NULL: measure them). */
    const char *ceilings_from;
} tune_opts;

/* One variant's source, emitted once per run and shared by its problems. */
typedef struct source_entry {
    char *id, *source, *kernel, *json, *template_name;
    char *spec;         /* the facts its source is specialized for ("" none) */
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
    device_ceilings roof; /* measured before the first compile or measurement
                       (run_ceilings.c), or carried */
    int roof_ready;
    int64_t roof_carried_from; /* the run they were carried from (0: measured) */
    char roof_from_uid[64];    /* the run of opt.ceilings_from they were taken
                                  from ("": none) */
    device_probe *probe;       /* first read right after the ceilings were
                                  measured, then after each final round's try
                                  and at the end of the run (NULL: none) */
    measure_policy policy;
    argen **templates;
    size_t ntemplates;
    argen_variant **variants; /* per template, enumerated once a run */
    size_t *nvariants;
    source_entry **sources; /* stable pointers: candidates keep them */
    size_t nsources;
    size_t reused, measured, failed; /* candidate counts over the run */
    size_t unrecorded;               /* results a database write lost: the run fails */
    tune_stages stages;              /* where the run's time went */
} tuner;

/* One row of the winners table. */
typedef struct winner_row {
    char problem[160], variant[128];
    double median_us, spread_us, gbps;
    double ceiling_fraction;                       /* gbps over the matching ceiling */
    double read_bytes, write_bytes, flops; /* the problem's traffic and arithmetic */
    double paired, paired_spread, pair_gbps; /* of the streaming pass timed in the
                                                final rounds (NaN: none) */
    int found;
    /* Final rounds that other work on the machine disturbed (disturbance.h):
     * how many, and what the last of them showed. provisional: the one on
     * record was disturbed too, after every retry. */
    int disturbed;
    int provisional;
    char disturbance[224];
    /* The screening's spread against the device's usual for the problem
     * (search_screening_disturbed); NaN where not judged. */
    double screen_spread, screen_usual;
    int screen_disturbed;
} winner_row;

void artuner_log(const tuner *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *artuner_strategy_name(strategy s);

/* candidates.c */
int artuner_load_templates(tuner *t);
void artuner_templates_hash(tuner *t, char out[65]);
/* The source of variant id of template g, emitted and recorded once. */
source_entry *artuner_source(tuner *t, argen *g, const char *id, const char *spec);
/* Compiles the sources that have no binary yet, jobs at a time, and
 * stores the binaries: once per build key, and none the kernel cache
 * holds intact (CPU). todo is reordered. */
void artuner_compile_missing(tuner *t, source_entry **todo, size_t count);

/* search.c: measures one problem and records its winner in w. */
int tune_problem_one(tuner *t, const tune_problem *tp, size_t index, size_t total, winner_row *w);

/* One candidate of a problem, as the search sees it. */
typedef struct candidate_ref {
    source_entry *e;
    int reused;            /* measured by an earlier run */
    int64_t measurement_id;
    ardb_status status;
    double median_us, spread_us;
    int final_round;       /* took part in the interleaved round */
    int cut;               /* screening cut short during a launch (ranked last) */
    double paired, paired_spread, pair_gbps; /* job_result's, from this run's final round */
} candidate_ref;

/* The search's decisions, apart from any measurement so that they can be
 * checked on given timings (search.c, docs/tuning.md). */

/* Screening stops timing a candidate after one launch slower than this
 * multiple of the fastest screening of its problem so far. Its one launch
 * already ranks it far outside the quarter the second round times unless
 * that quarter reaches that far (then it is timed fully there). A
 * disturbance must slow a launch by half to stop a candidate that could
 * win; one that stops a winner this way is caught by nothing else either. */
#define SEARCH_STOP_FACTOR 1.5
/* Only where the fastest screening so far is at least this long: one short
 * launch is too noisy to judge by (a 125 us kernel once took 248 us in its
 * one launch, was stopped and ranked 118th, and the default path lost 10%
 * on that problem), and timing its other launches costs next to nothing. */
#define SEARCH_STOP_MIN_US 1000.0
/* The screening's stop threshold (measure_policy.stop_above_us) given the
 * fastest screening median so far; 0 (never stop) when there is none or it
 * is below SEARCH_STOP_MIN_US. */
double search_stop_above(double fastest_us);

/* A screening launch still running at SEARCH_CUT_FACTOR times the fastest
 * screening of its problem so far (counting every launch before the stop
 * decision: a warm-up, if any, and the first timed one) is cut short: its
 * measuring process ends, the candidate is recorded as skipped ("stopped
 * during a launch"), and a new process takes the rest of its batch. Such a
 * candidate is already out of the race by SEARCH_STOP_FACTOR, and the
 * scalar and one-thread variants that run 4-200x slower than the best took
 * most of a long problem's screening waiting for those launches to end.
 * Never sooner than SEARCH_CUT_FLOOR_US, so that a short launch preempted
 * once is not cut; only in a measuring process (isolate.h), where ending
 * the process is safe. */
#define SEARCH_CUT_FACTOR 4.0
#define SEARCH_CUT_FLOOR_US 20000.0
/* The deadline of a candidate's `launches` screening launches before its
 * stop decision, in microseconds; 0 (never cut) when nothing is fastest. */
double search_cut_after(double fastest_us, int launches);

/* Whether a problem's screening was disturbed, from its screenings'
 * relative spreads (MAD over median, ardb_screening_spreads) in this run
 * (now) and the device's other screenings of launches about as long
 * (before: half to twice the problem's median screening, other problems
 * of this run and earlier runs): the median of now at least
 * SCREEN_SPREAD_FACTOR times that of before, and at least
 * SCREEN_SPREAD_FLOOR, with at least SCREEN_SPREAD_MIN_NOW and
 * SCREEN_SPREAD_MIN_BEFORE of each. About as long, because a launch of a
 * few microseconds spreads far more than one of milliseconds on a quiet
 * machine too. Sets the two medians (NaN where there are none); sorts
 * both arrays.
 * A disturbed screening can leave the best candidate out of the finalists,
 * which no re-timing of the final round would bring back: the run says so
 * (its `screening disturbed:` line) and leaves the choice as it is. */
#define SCREEN_SPREAD_FACTOR 3.0
#define SCREEN_SPREAD_FLOOR 0.05
#define SCREEN_SPREAD_MIN_NOW 10
#define SCREEN_SPREAD_MIN_BEFORE 30
int search_screening_disturbed(double *now, size_t nnow, double *before, size_t nbefore, double *now_median,
                               double *usual_median);

/* Screening order: where a problem's nearest T bucket has a winner on
 * record for the device, that candidate goes first; the rest follow by
 * vector lanes (vec x unroll), then threads, most first, keeping the
 * templates' order among equals. The thresholds above are set by the
 * fastest so far, so a fast candidate early spares every slow one after it
 * all but one launch. first_candidate_id: 0 when there is none. Order
 * changes nothing else: every candidate is screened under the same rules. */
void search_order(candidate_ref *cands, size_t n, int64_t first_candidate_id);

/* The halving's two rounds on the CPU (full: the run's policy, 150 ms of
 * launches, 5 to 50): screening times as many launches as fill
 * SEARCH_SCREEN_MS after one warm-up, 3 to 50: 3 where launches are long
 * (beyond the cache), 50 where they are short and one launch says little;
 * its ranking only has to put the best in the quarter the second round
 * takes.
 * That round aims at SEARCH_SECOND_MS (at least the full policy's 5, at
 * most SEARCH_SECOND_MAX_REPS): it only has to bring the best within the
 * finalists' margin, and the interleaved final round decides. Short
 * launches take more than a full timing's 50 there: 50 launches of 100 us
 * span 5 ms, and one burst of noise that long once timed a winner 22%
 * slow, out of the final round. Launches of a few milliseconds (every
 * problem beyond the cache) are where this saves time; short ones still
 * reach the repetition caps. GPUs and a simulated device: 10 and the full
 * policy's repetitions, as before. */
#define SEARCH_SCREEN_MS 20.0
#define SEARCH_SCREEN_MIN_REPS 3
#define SEARCH_SECOND_MS 100.0
#define SEARCH_SECOND_MAX_REPS 200
void search_round_policies(const measure_policy *full, const char *backend, int simulated,
                           measure_policy *screening, measure_policy *second);

/* Screening launches longer than this skip the warm-up after a measuring
 * process's first candidate (job_batch.warm_once_above_us): the first
 * launch's own costs (waking the workers, cold instruction caches) are far
 * below their noise. Shorter ones keep it; it costs them next to nothing. */
#define SEARCH_WARM_ONCE_ABOVE_US 1000.0

/* The run's ceilings (run_ceilings.c). tuner_ceilings_measure measures and
 * records them once, before the run's first compile or measurement, so a
 * run that finds everything on record spends no time on them;
 * tuner_ceilings_carry gives such a run those of the device's latest run
 * that measured them (measuring them where none did). With
 * opt.ceilings_from, tuner_ceilings_measure first looks there (and says why
 * it measures when it finds none). 0, or -1 said. */
/* How recent a run of --ceilings-from must be to give its ceilings: a
 * working day, so that a machine changed since (memory, BIOS, kernel) is
 * measured again by the next day's runs. */
#define TUNE_CEILINGS_FROM_MAX_AGE_S 86400
int tuner_ceilings_measure(tuner *t);
int tuner_ceilings_carry(tuner *t);
/* Records the ceilings with the run, and the check's outcome once the
 * winners are known (c NULL: not yet); carried ones name their run. */
struct ceiling_check;
void tuner_ceilings_record(tuner *t, const struct ceiling_check *c);

/* qsort order of candidate_ref pointers: by median, fastest first. */
int search_by_median(const void *a, const void *b);
/* How many of nok screened candidates the second halving round times
 * fully: a quarter, at least three, at most budget_candidates (when > 0)
 * and at most nok. */
size_t search_halving_keep(size_t nok, int64_t budget_candidates);
/* How many of the sorted candidates ok[0..nok) go to the interleaved final
 * round: every one within 10% of the fastest, at least two, at most six. */
size_t search_finalists(candidate_ref *const *ok, size_t nok);
/* The resources a variant holds, for tie-breaks: threads, then threads per
 * block, then vec x unroll, from its parameters. */
int64_t search_resources(const source_entry *e);
/* The winner of a final round: of the ok candidates within the noise of the
 * fastest (twice the sum of their spreads, at least 3% and at most 5% of
 * the fastest median), the one with the fewest resources, then the
 * smallest id.
 * equivalent receives those candidates' ids, comma-separated. NULL when no
 * candidate is ok. */
candidate_ref *search_choose(candidate_ref *const *fin, size_t k, char *equivalent, size_t len);

#endif
