/*
 * ardb_write.h - the write side of the attnres tuning database (DESIGN §5):
 * a writer's open (creating and migrating the schema), transactions, and
 * the records of a tuning run: devices, runs, problems, candidates,
 * binaries, measurements, winners.
 *
 * These live in the ardb_write library (db/write/), which the tuner, the
 * command line and db/tools link, never the runtime: libattnres carries
 * only the read side (ardb.h). Ownership and status codes are those of
 * ardb.h.
 */
#ifndef ARDB_WRITE_H
#define ARDB_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "ardb.h"

/* Open flags. */
#define ARDB_READONLY 1u /* open an existing file read-only (ardb_open_readonly) */
#define ARDB_CREATE 2u   /* create the file and schema when missing (tuner) */

/* Opens a database. ARDB_READONLY is ardb_open_readonly (ardb.h). flags 0
 * opens an existing file read-write; ARDB_CREATE also creates the file and
 * the schema when missing; ARDB_READONLY with ARDB_CREATE is EINVAL.
 * Without ARDB_CREATE a missing file is ENOTDB; the other failures are
 * ardb_open_readonly's. An older schema is migrated in place, keeping a
 * copy as PATH.v<N>.bak. Read-write connections use WAL and a busy timeout
 * so that several tuner processes can share one file. */
int ardb_open(const char *path, unsigned flags, ardb **out, char *msg,
              size_t msg_len);
/* A read-write open also decides the state of runs left 'running': a run
 * whose process is certainly gone (killed, crashed, or the machine
 * rebooted; db/write/liveness.c says how that is told, robust to pid reuse)
 * becomes 'interrupted'. Runs of processes on other machines or in other
 * pid namespaces, and runs recorded before schema v5, stay as they are.
 * This is best effort: when the file is busy beyond the busy timeout it is
 * left to the next open, and the open succeeds all the same. */

/* Transactions: short and explicit, so a SIGKILL leaves whole rows only.
 * begin is BEGIN IMMEDIATE on a read-write connection; rollback without an
 * open transaction is a no-op. Outside a transaction every call is its own
 * (autocommit) transaction. Write calls on a read-only handle: EREADONLY.
 * A foreign key or CHECK violation (e.g. an unknown id) is EINVAL. */
int ardb_begin(ardb *db);
int ardb_commit(ardb *db);
int ardb_rollback(ardb *db);

/* ---- devices ---------------------------------------------------------- */
/* Inserts the device if its (fingerprint, simulated) pair is new; returns
 * its id either way. */
int ardb_device_upsert(ardb *db, const ardb_device *dev, int64_t *id);

/* ---- runs ------------------------------------------------------------- */
typedef struct ardb_run {
    int64_t device_id;
    const char *user, *host, *command;
    const char *project_version, *templates_hash, *compiler, *driver;
    const char *policy_json;  /* measurement policy, recorded with the run */
    const char *strategy;
    double copy_gbps;         /* measured device copy bandwidth (NaN: NULL) */
    double launch_us;         /* measured empty-launch time (NaN: NULL) */
    double read_gbps;         /* measured read-only bandwidth, GB/s (schema
                                 v3). NaN or <= 0 means not measured and is
                                 stored as NULL, so that a caller that
                                 zero-initializes the struct records none. */
} ardb_run;
/* Records a new run as 'running', owned by the calling process (schema
 * v5: see ardb_open for what becomes of it when the process is gone). */
int ardb_run_begin(ardb *db, const ardb_run *run, int64_t *run_id);
/* status: "complete", "failed" or "interrupted". A run that another
 * process marked 'interrupted' while its own process still ran (only where
 * that process could not be seen) takes the status it finishes with. */
int ardb_run_finish(ardb *db, int64_t run_id, const char *status);
/* Records the run's ceilings (schema v6): a JSON object, replacing what was
 * recorded before (a run records them when it starts and again with the
 * check of its winners). EINVAL unless json starts with '{'. */
int ardb_run_set_ceilings(ardb *db, int64_t run_id, const char *json);
/* Records the run's copy and read bandwidth and empty-launch time, as
 * ardb_run_begin does (NaN: NULL; read_gbps <= 0 too), for a run that
 * measures them after it began or carries them from an earlier run. */
int ardb_run_set_roofs(ardb *db, int64_t run_id, double copy_gbps, double read_gbps, double launch_us);
/* Records where the run's time went (schema v7): a JSON object of seconds
 * and counts per stage (tuner/include/tune_stages.h), replacing what was
 * recorded before. EINVAL unless json starts with '{'. */
int ardb_run_set_stages(ardb *db, int64_t run_id, const char *json);

/* ---- problems --------------------------------------------------------- */
/* Canonical key text, e.g. "mix:bf16:d7168:n9:h1:replace:epi0:s0:t4096". */
void ardb_problem_key(const ardb_problem *p, char *buf, size_t len);
int ardb_problem_upsert(ardb *db, const ardb_problem *p, int64_t *id);

/* ---- candidates (one generated kernel variant) ------------------------ */
typedef struct ardb_candidate {
    const char *template_name;  /* e.g. "cpu/mix" */
    const char *variant;        /* variant id, e.g. "mix_c_f32_online_v8_u2_t2" */
    const char *params_json;
    const char *source_hash;    /* hex hash of source */
    const char *source;
    const char *kernel_name;    /* entry symbol in the compiled object */
    const char *backend;        /* "cpu" or "cuda" */
} ardb_candidate;
int ardb_candidate_upsert(ardb *db, const ardb_candidate *c, int64_t *id);

/* ---- binaries (content-addressed by build key) ------------------------ */
typedef struct ardb_binary {
    const char *build_key;    /* hash of source hash + compiler + options + target */
    int64_t candidate_id;
    const char *compiler, *options, *target;
    const void *blob;
    size_t size;
    const char *resources_json; /* registers, spills, shared memory; may be NULL */
} ardb_binary;
int ardb_binary_put(ardb *db, const ardb_binary *b); /* no-op if key exists */

/* ---- measurements ----------------------------------------------------- */
typedef enum ardb_status {
    ARDB_STATUS_OK = 0,
    ARDB_STATUS_COMPILE_FAILED = 1,
    ARDB_STATUS_LAUNCH_FAILED = 2,
    ARDB_STATUS_WRONG_RESULT = 3,
    ARDB_STATUS_SKIPPED = 4,
    ARDB_STATUS_TIMEOUT = 5,
    /* Two runs on the same inputs gave outputs that differ in some bit
     * (schema v10): a kernel whose sums depend on more than its inputs,
     * which never wins. Files older than v10 recorded it as wrong_result
     * with a message starting "nondeterministic:". */
    ARDB_STATUS_NONDETERMINISTIC = 6
} ardb_status;
const char *ardb_status_name(ardb_status s); /* "ok", "compile_failed", ... */

typedef struct ardb_measurement {
    int64_t run_id, candidate_id, problem_id, device_id;
    const char *build_key;     /* may be NULL when compilation failed */
    ardb_status status;
    double median_us, min_us, max_us, spread_us; /* spread: median abs deviation */
    int32_t reps;
    double gbps;               /* achieved bandwidth at the median */
    double ceiling_fraction;   /* gbps over the ceiling matching its traffic
                                  (runs that record ceilings, v6); over
                                  the run's copy_gbps before */
    double rel_err;            /* ||out-ref|| / ||ref|| */
    const char *message;       /* why it failed, may be NULL */
    /* 1 for a timing of the interleaved final round (schema v8), 0 for
     * any other; any other non-zero value is recorded as 1. Last, so that
     * a caller that zero-initialises the struct records an ordinary one. */
    int final_round;
} ardb_measurement;
int ardb_measurement_add(ardb *db, const ardb_measurement *m, int64_t *id);

/* Finds the newest measurement of (candidate, problem, device, build_key)
 * from any run: the tuner's resume cache. build_key NULL matches a NULL
 * build key. ENOTFOUND when there is none. On a read-only handle of a file
 * older than v8, final_round is what the migration would set. String fields of *m are
 * malloc'ed; free them with ardb_measurement_clear. Doubles stored as NaN
 * (SQL NULL) come back as NaN. */
int ardb_measurement_find(ardb *db, int64_t candidate_id, int64_t problem_id,
                          int64_t device_id, const char *build_key,
                          ardb_measurement *m);
/* The same, also returning the measurement's id (for ardb_winner_set);
 * measurement_id may be NULL. */
int ardb_measurement_find_ex(ardb *db, int64_t candidate_id,
                             int64_t problem_id, int64_t device_id,
                             const char *build_key, ardb_measurement *m,
                             int64_t *measurement_id);
void ardb_measurement_clear(ardb_measurement *m);

/* ---- winners ---------------------------------------------------------- */
/* measurement_id must be an "ok" measurement of that candidate, problem and
 * device (from any run), else EINVAL. Setting it again for the same
 * (run, problem, device) replaces the run's winner. */
int ardb_winner_set(ardb *db, int64_t run_id, int64_t problem_id,
                    int64_t device_id, int64_t candidate_id,
                    int64_t measurement_id);
/* The same, for a winner that may be provisional (schema v9): disturbance
 * NULL records an ordinary winner; otherwise the winner is provisional,
 * chosen by a final round that other work on the machine disturbed on
 * every try, and disturbance is that evidence (what the last try showed,
 * tuner/include/disturbance.h), which must not be empty (EINVAL).
 * Replacing a run's winner replaces its mark and evidence too.
 * ardb_winner_set is this with NULL. */
int ardb_winner_set_ex(ardb *db, int64_t run_id, int64_t problem_id,
                       int64_t device_id, int64_t candidate_id,
                       int64_t measurement_id, const char *disturbance);

#endif /* ARDB_WRITE_H */
