/*
 * ardb_tools.h - the tools of the attnres tuning database: run history,
 * comparisons and the regression policy, revalidation's view of the stored
 * winners, export, import and merge (DESIGN §5).
 *
 * These live in the ardb library (db/tools/), which the tuner and the
 * command line link; it links ardb_write (ardb_write.h), which links
 * ardb_core (ardb.h). The runtime links only ardb_core, so none of this is
 * in libattnres. Ownership and status codes are those of ardb.h.
 */
#ifndef ARDB_TOOLS_H
#define ARDB_TOOLS_H

#include <stddef.h>
#include <stdint.h>

#include "ardb_write.h"

/* ==== resume (db/tools/resume.c) ======================================= */

/* The newest ok measurement of a candidate taken in a final (interleaved)
 * round (measurements.final_round, schema v8): the most trustworthy timing
 * the database holds. ENOTFOUND when there is none. */
int ardb_measurement_find_final(ardb *db, int64_t candidate_id,
                                int64_t problem_id, int64_t device_id,
                                const char *build_key, double *median_us,
                                double *spread_us, int64_t *measurement_id);

/* Whether the final round that took a measurement was disturbed on every
 * try: *evidence (malloc'ed) is what the measurement's run recorded with
 * its provisional winner of the measurement's problem and device (schema
 * v9), NULL when that winner is not provisional, the run recorded none
 * there, or the file is older than v9. A run that decides from final
 * rounds on record carries their mark with them, so that tuning again
 * without measuring cannot make a provisional choice look settled. */
int ardb_measurement_disturbance(ardb *db, int64_t measurement_id,
                                 char **evidence);

/* The relative spreads (spread_us / median_us) of the screenings on a
 * device that timed at least 3 launches (message "screening"): those of
 * problem_id in run_id into *now; those of every other problem or run
 * whose median lies in [lo_us, hi_us] into *before; each at most `cap`,
 * newest first. Arrays are malloc'ed (NULL when empty); the caller frees
 * them. */
int ardb_screening_spreads(ardb *db, int64_t problem_id, int64_t device_id, int64_t run_id, double lo_us,
                           double hi_us, size_t cap, double **now, size_t *nnow, double **before, size_t *nbefore);

/* The candidate that won the nearest other T bucket of a problem (same
 * op, dtype, form, d, n, heads, epilogue and s; nearest by the ratio of
 * the buckets, then the newest run) on a device: where the tuner starts
 * screening. ENOTFOUND when no such bucket has a winner. */
int ardb_winner_nearest_bucket(ardb *db, int64_t problem_id, int64_t device_id,
                               int64_t *candidate_id);

/* ==== listings (db/tools/listings.c) ================================== */

/* Row callback for listings: column names and values as text (SQL NULL is
 * ""; numbers are formatted). Pointers are valid during the call only. A
 * non-zero return stops the listing, which still returns ARDB_DONE. */
typedef int (*ardb_row_fn)(void *ctx, int ncol, const char *const *names,
                           const char *const *values);
/* The latest winner of every problem for every device (or the winners of
 * one run), joined with its measurement: columns problem (key), device
 * (name, with " (simulated)" after a simulated device's), variant,
 * median_us, gbps, ceiling_fraction, provisional ("yes: " and the evidence for a
 * provisional winner, schema v9; "" otherwise); in problem key order with
 * numeric fields compared as numbers. */
int ardb_list_winners(ardb *db, int64_t run_id /* 0: all */, ardb_row_fn fn,
                      void *ctx);
/* All runs, newest last: id, started_at, finished_at, status, device
 * (marked " (simulated)" as in ardb_list_winners), strategy, project_version, compiler, copy_gbps, read_gbps (GB/s with one
 * decimal; "" where not recorded, e.g. every run of a file older than
 * schema v3 opened read-only). */
int ardb_list_runs(ardb *db, ardb_row_fn fn, void *ctx);

/* ==== history: runs, comparisons, revalidation (db/tools/history.c) ==== */

/* Everything recorded about one run. Strings are malloc'ed (NULL where the
 * database holds NULL); free with ardb_run_info_clear. On a read-only
 * handle of a v1 file, note is NULL and uid is the identity that the
 * migration to v2 would give the run; on one of a v1 or v2 file,
 * read_gbps is NaN. */
typedef struct ardb_run_info {
    int64_t id, device_id;
    char *uid, *note;
    char *started_at, *finished_at, *status;
    char *user, *host, *command;
    char *project_version, *templates_hash, *compiler, *driver;
    char *policy_json, *strategy;
    char *device_name, *device_backend, *device_arch, *device_fingerprint;
    double copy_gbps, launch_us;   /* NaN where not recorded */
    double read_gbps;              /* read-only bandwidth (v3); NaN where
                                      not recorded */
    char *ceilings;                /* the ceilings JSON (v6); NULL where not
                                      recorded */
    char *stages;                  /* where the run's time went, JSON (v7);
                                      NULL where not recorded */
    int64_t measurements;          /* recorded in this run */
    int64_t winners;               /* problems this run chose a winner for */
    int device_simulated;          /* 1: the run's device is simulated (v4);
                                      0 for hardware, no device, or a file
                                      older than v4 */
} ardb_run_info;

/* One run by id; ENOTFOUND ("no run with id N") when absent. */
int ardb_run_get(ardb *db, int64_t run_id, ardb_run_info *out);
/* All runs, oldest (lowest id) first; *out is owned by the caller
 * (ardb_run_infos_free); *count may be 0. */
int ardb_run_list(ardb *db, ardb_run_info **out, size_t *count);
void ardb_run_info_clear(ardb_run_info *r);             /* NULL: no-op */
void ardb_run_infos_free(ardb_run_info *r, size_t count);

/* Resolves what a person types for a run: a decimal id, "latest" (the
 * highest id), "latest~K" (K runs before it), or a unique prefix of at
 * least 4 characters of a run's uid (a number that is no run's id is tried
 * as one too). ENOTFOUND or EINVAL (ambiguous, bad syntax) with a message. */
int ardb_run_resolve(ardb *db, const char *text, int64_t *run_id);

/* The newest run after after_id (a higher id) on device device_id that
 * chose a winner or recorded a measurement: the run to compare with a
 * baseline. ENOTFOUND if none. */
int ardb_run_latest_on_device(ardb *db, int64_t device_id, int64_t after_id,
                              int64_t *run_id);

/* Sets the free-text note of a run (schema v2): a label such as "driver
 * 560.35". NULL clears it. ENOTFOUND for an unknown run. */
int ardb_run_set_note(ardb *db, int64_t run_id, const char *note);
/* The newest run before before_id on device device_id that measured the
 * device's ceilings itself (copy bandwidth, launch time and the ceilings
 * JSON, not carried from another run): where a run that measures nothing
 * takes them from. ENOTFOUND when there is none. */
int ardb_run_latest_with_ceilings(ardb *db, int64_t device_id, int64_t before_id, int64_t *run_id);
/* The newest run, on the device whose fingerprint is given, that measured
 * the device's ceilings itself and started at most max_age_s seconds ago:
 * where a run told to take its ceilings from another database (tune
 * --ceilings-from) finds them. ENOTFOUND when there is none. */
int ardb_run_latest_measured_ceilings(ardb *db, const char *fingerprint, int64_t max_age_s, int64_t *run_id);

/* The noise rule of comparisons: a difference is beyond the noise when
 * |median_b - median_a| > ARDB_NOISE_K * (spread_a + spread_b), spread
 * being the median absolute deviation of each measurement. */
#define ARDB_NOISE_K 3.0
/* Default regression threshold, percent slower than the baseline. */
#define ARDB_DEFAULT_THRESHOLD_PCT 5.0

/* One problem of a comparison of run a (baseline) with run b. */
typedef struct ardb_diff_row {
    int64_t problem_id;
    char *problem;                 /* key text */
    int winner_a, winner_b;        /* the run chose a winner for it */
    int tried_a, tried_b;          /* the run measured it or chose a winner */
    char *variant_a, *variant_b;   /* NULL without a winner */
    double us_a, us_b;             /* winner median; NaN without a winner */
    double spread_a, spread_b;     /* median abs deviation; NaN if unknown */
    double ceiling_fraction_a, ceiling_fraction_b; /* the winner's (ardb_measurement) */
    char *status_b;                /* without a winner in b: the status of
                                      b's last measurement of it, or NULL */
} ardb_diff_row;

/* The problems either run measured or chose a winner for, in problem key
 * order (fields compared as numbers). Where a run holds winners on several
 * devices for one problem, the fastest is taken. *rows is owned by the
 * caller (ardb_diff_free). ENOTFOUND when a run does not exist. */
int ardb_diff_runs(ardb *db, int64_t run_a, int64_t run_b,
                   ardb_diff_row **rows, size_t *count);
void ardb_diff_free(ardb_diff_row *rows, size_t count);

typedef enum ardb_change {
    ARDB_CHANGE_SAME = 0,    /* within the noise or the threshold */
    ARDB_CHANGE_SLOWER = 1,  /* b slower beyond both: a regression */
    ARDB_CHANGE_FASTER = 2,  /* b faster beyond both */
    ARDB_CHANGE_LOST = 3,    /* a has a winner; b measured it, found none:
                                a regression */
    ARDB_CHANGE_NEW = 4,     /* only b has a winner */
    ARDB_CHANGE_MISSING = 5  /* a has a winner; b did not try it */
} ardb_change;
/* Classifies a row against a threshold in percent (slower: us_b/us_a - 1,
 * faster: us_a/us_b - 1, must reach threshold_pct/100), and the noise. */
ardb_change ardb_diff_classify(const ardb_diff_row *r, double threshold_pct);
/* "same", "slower", "faster", "lost", "new", "missing". */
const char *ardb_change_name(ardb_change c);
/* Whether |us_b - us_a| > ARDB_NOISE_K * (spread_a + spread_b); 0 when a
 * side has no winner. Unknown spreads count as 0. */
int ardb_diff_beyond_noise(const ardb_diff_row *r);

/* One run's winner for one problem on one device: a point of the latency
 * history. device is the device's name (else its fingerprint), with
 * " (simulated)" after a simulated device's. */
typedef struct ardb_winner_point {
    int64_t run_id, problem_id, device_id;
    char *problem, *device, *variant, *strategy, *started_at;
    double median_us, spread_us, gbps, ceiling_fraction;
} ardb_winner_point;
/* Every winner of every run, ordered by problem (key order), device, run.
 * *out is owned by the caller (ardb_winner_points_free). */
int ardb_winner_history(ardb *db, ardb_winner_point **out, size_t *count);
void ardb_winner_points_free(ardb_winner_point *p, size_t count);

/* A stored winner as a re-measurement needs it. */
typedef struct ardb_stored_winner {
    int64_t problem_id, candidate_id, run_id, device_id;
    ardb_level level;        /* how its device matched (as the runtime) */
    char *op, *dtype, *form; /* the problem */
    int64_t d, t_bucket;
    int32_t n, heads, epilogue, s;
    char *problem_key, *variant, *template_name, *kernel_name, *params_json;
    char *source, *source_hash, *backend;
    double median_us, spread_us;
    int64_t measurement_id;  /* the timing it won with (any run's) */
    /* Chosen by a final round that other work disturbed on every try
     * (schema v9), and that evidence; 0 and NULL otherwise. */
    int provisional;
    char *disturbance;
} ardb_stored_winner;
/* For every problem with a winner on a device like dev, the winner the
 * runtime's fallback would choose: an exact fingerprint match first, then
 * the same backend and arch, then the same backend; within a level the
 * newest run's. Only devices of dev's kind count (dev->simulated), as in
 * ardb_winners_lookup. In problem key order; *out owned by the caller
 * (ardb_stored_winners_free). dev needs backend and fingerprint. */
int ardb_stored_winners(ardb *db, const ardb_device *dev,
                        ardb_stored_winner **out, size_t *count);
void ardb_stored_winners_free(ardb_stored_winner *w, size_t count);

/* A finalist of a stored winner's final round, as a re-decision needs it. */
typedef struct ardb_stored_finalist {
    int64_t candidate_id, measurement_id;
    char *variant, *template_name, *kernel_name, *params_json;
    char *source, *source_hash;
    double median_us, spread_us;
} ardb_stored_finalist;
/* The candidates that the final round which took measurement_id timed ok
 * for its problem on its device: every ok final-round measurement
 * (measurements.final_round, schema v8; the message's first word before)
 * of the measurement's run, problem and device, the newest of each
 * candidate, fastest first. What `tune --revalidate` times again to decide
 * a provisional winner. *count may be 0 (a winner recorded outside a
 * final round); *out owned by the caller (ardb_stored_finalists_free). */
int ardb_stored_finalists(ardb *db, int64_t measurement_id,
                          ardb_stored_finalist **out, size_t *count);
void ardb_stored_finalists_free(ardb_stored_finalist *f, size_t count);

/* ==== exchange: export, import, merge (db/tools/exchange.c) ============ */

/* Where exports go: returns 0 when all len bytes were written; on a
 * failure errno, where set, says why (the export's message gives it). */
typedef int (*ardb_write_fn)(void *ctx, const void *data, size_t len);

/* Export flags. */
#define ARDB_EXPORT_NO_SOURCE 1u /* JSON: candidates without source text */

/* The whole history as one JSON object (format "attnres-export", version
 * 1): devices, problems, candidates (with source unless
 * ARDB_EXPORT_NO_SOURCE), runs (with uid), measurements and winners, which
 * name what they refer to by keys (run uid, problem key, variant and
 * source hash, device fingerprint), so the file is meaningful alone and
 * can be imported into any database. Binaries are not exported. */
int ardb_export_json(ardb *db, unsigned flags, ardb_write_fn fn, void *ctx);

/* CSV tables for dashboards (RFC 4180, header row). */
typedef enum ardb_csv_table {
    ARDB_CSV_MEASUREMENTS = 0, /* every measurement joined with its run,
                                  problem, candidate and device, and whether
                                  it is its run's winner */
    ARDB_CSV_WINNERS = 1,      /* every run's winners (reused ones too) */
    ARDB_CSV_RUNS = 2          /* every run */
} ardb_csv_table;
int ardb_export_csv(ardb *db, ardb_csv_table table, ardb_write_fn fn,
                    void *ctx);

/* What a merge or an import added (rows new to the destination). */
typedef struct ardb_merge_stats {
    int64_t devices, problems, candidates, binaries, runs, measurements,
        winners;
} ardb_merge_stats;

/* Imports a JSON export (text of len bytes) with merge semantics:
 * everything already present is skipped, ids are re-mapped; importing the
 * same file twice adds nothing. One transaction: all or nothing. EINVAL
 * with a message naming the place for malformed or inconsistent input. */
int ardb_import_json(ardb *db, const char *text, size_t len,
                     ardb_merge_stats *stats);

/* What an import accepts as a plausible measurement; a value outside is
 * refused (EINVAL naming the member and the record), as is a NaN or an
 * infinity (JSON's 1e999) and any string that is not well-formed UTF-8.
 * Every bound is >= 0 and far above what any device records, so that only
 * values that cannot be measurements are refused:
 *   - times (median_us, min_us, max_us, spread_us, launch_us): at most
 *     1e9 us, 1000 s for one launch of a memory-bound kernel whose largest
 *     preset problem moves a few GB (the tuner gives up on a kernel long
 *     before that);
 *   - repetitions (reps): at most 1e9, as many 1 us launches as fit in
 *     that time, and within the int32 of ardb_measurement;
 *   - bandwidths (gbps, copy_gbps, read_gbps): at most 1e6 GB/s, 200 times
 *     the fastest memory of today (H200: 4.8 TB/s);
 *   - ceiling_fraction (a measured bandwidth over the ceiling that matches its
 *     traffic, or over the run's copy bandwidth before v6; above 1 when a
 *     problem fits in a cache; its key was "roofline" before v11): at most 1e6;
 *   - rel_err: finite. */
#define ARDB_IMPORT_MAX_US 1e9
#define ARDB_IMPORT_MAX_REPS 1e9
#define ARDB_IMPORT_MAX_GBPS 1e6
#define ARDB_IMPORT_MAX_CEILING_FRACTION 1e6

/* Writes s (n bytes) through fn as a quoted JSON string: quotes, control
 * characters and backslashes escaped, and bytes that are not well-formed
 * UTF-8 written as U+FFFD, so that the result is always valid JSON (a
 * database can hold any bytes in a text column). Returns fn's first
 * non-zero result, or 0. */
int ardb_json_string(ardb_write_fn fn, void *ctx, const char *s, size_t n);

/* Merges the database file src_path into db without duplicates: devices
 * by fingerprint, problems by key, candidates by (variant, source_hash),
 * binaries by build key, runs by uid (measurements and winners copied with
 * their run, ids re-mapped; a run already present gets the measurements it
 * lacks, and its status when it was still running). src may be an older
 * schema version; it is only read. Merging the same file twice adds
 * nothing. One transaction: all or nothing. stats may be NULL. */
int ardb_merge(ardb *db, const char *src_path, ardb_merge_stats *stats);

/* A value of attnres_meta (e.g. "schema_version", "migrated_from_v1");
 * ENOTFOUND when absent. *value is malloc'ed. */
int ardb_meta_get(ardb *db, const char *key, char **value);

#endif /* ARDB_TOOLS_H */
