/*
 * ardb.h - the access layer of the attnres tuning database (DESIGN §5).
 *
 * Every SQL statement of the project lives in db/; the runtime and the tuner
 * only call these functions. This header declares db/'s core (ardb_core,
 * db/core/), the part the runtime links; the tools that only the tuner and
 * the command line need (history, comparisons, export, import, merge) are
 * declared in ardb_tools.h (db/tools/).
 *
 * db/ depends on SQLite and libc only: it does not include the runtime's
 * header, and the runtime maps these status codes to attnres_status.
 *
 * Ownership: strings passed in are copied by SQLite; strings and blobs
 * returned through out-parameters are malloc'ed and owned by the caller
 * unless a comment says otherwise.
 */
#ifndef ARDB_H
#define ARDB_H

#include <stddef.h>
#include <stdint.h>

/* Version 2 added runs.uid and runs.note, version 3 runs.read_gbps,
 * version 4 devices.simulated, version 5 runs.owner, version 6
 * runs.ceilings (db/core/migrate.c). A
 * read-write open migrates an older file in place, keeping a copy as
 * PATH.v<N>.bak; a read-only open reads it as it is (every device of a file
 * older than v4 is real). */
#define ARDB_SCHEMA_VERSION 7

/* Return codes of every ardb_ function. */
enum {
    ARDB_DONE = 0,       /* success */
    ARDB_EINVAL = 1,     /* bad argument */
    ARDB_ENOMEM = 2,
    ARDB_ENOTDB = 3,     /* missing file, not SQLite, or not an attnres db */
    ARDB_ENEWER = 4,     /* schema newer than this build */
    ARDB_ENOTFOUND = 5,  /* no such row */
    ARDB_EBUSY = 6,      /* locked beyond the busy timeout */
    ARDB_EREADONLY = 7,  /* write attempted on a read-only database */
    ARDB_ESQL = 8        /* any other SQLite failure (corrupt, I/O, ...) */
};

/* Fallback levels of ardb_winners_lookup (same order as the runtime's). */
typedef enum ardb_level {
    ARDB_LEVEL_EXACT = 0,
    ARDB_LEVEL_ARCHITECTURE = 1,
    ARDB_LEVEL_BACKEND = 2
} ardb_level;

typedef struct ardb ardb;

/* Open flags. */
#define ARDB_READONLY 1u /* open an existing file read-only (runtime) */
#define ARDB_CREATE 2u   /* create the file and schema when missing (tuner) */

/* Opens a database. Without ARDB_CREATE a missing file is ENOTDB ("no such
 * database file: PATH"). A file that is not SQLite, or SQLite without the
 * attnres schema, is ENOTDB with a message that says so; a newer
 * user_version is ENEWER. flags 0 opens an existing file read-write;
 * ARDB_READONLY with ARDB_CREATE is EINVAL. Read-write connections use WAL
 * and a busy timeout so that several tuner processes can share one file.
 * Anything but a regular file at path, or at path-wal, -shm, -journal, is
 * ENOTDB before SQLite opens it (a FIFO's open would block). A read-only
 * open in a directory this process cannot write, where SQLite cannot make
 * the -shm file a WAL reader needs, reads the file as immutable (no -shm,
 * no locks: right while nobody writes it), unless a -wal file there holds
 * changes (ESQL, naming it). On failure *out is NULL and msg (may be NULL)
 * is set. */
int ardb_open(const char *path, unsigned flags, ardb **out, char *msg,
              size_t msg_len);
/* A read-write open also decides the state of runs left 'running': a run
 * whose process is certainly gone (killed, crashed, or the machine
 * rebooted; db/core/liveness.c says how that is told, robust to pid reuse)
 * becomes 'interrupted'. Runs of processes on other machines or in other
 * pid namespaces, and runs recorded before schema v5, stay as they are.
 * This is best effort: when the file is busy beyond the busy timeout it is
 * left to the next open, and the open succeeds all the same. */
void ardb_close(ardb *db); /* NULL is a no-op */
const char *ardb_errmsg(const ardb *db); /* last failure, never NULL */

/* Transactions: short and explicit, so a SIGKILL leaves whole rows only.
 * begin is BEGIN IMMEDIATE on a read-write connection; rollback without an
 * open transaction is a no-op. Outside a transaction every call is its own
 * (autocommit) transaction. Write calls on a read-only handle: EREADONLY.
 * A foreign key or CHECK violation (e.g. an unknown id) is EINVAL. */
int ardb_begin(ardb *db);
int ardb_commit(ardb *db);
int ardb_rollback(ardb *db);

/* ---- devices ---------------------------------------------------------- */
typedef struct ardb_device {
    const char *backend, *name, *arch, *driver, *fingerprint;
    int32_t units;
    int64_t memory;
    /* 1 for a simulated device (a stand-in driver such as tests/cudasim,
     * whose timings are a model), 0 for real hardware. It is last and 0
     * means hardware, so that a caller that zero-initialises the struct
     * records a real device; any other non-zero value is recorded as 1. A
     * simulated device and a real one are never the same device, and
     * winners never cross between them (schema v4). */
    int simulated;
} ardb_device;
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
/* Records where the run's time went (schema v7): a JSON object of seconds
 * and counts per stage (tuner/include/tune_stages.h), replacing what was
 * recorded before. EINVAL unless json starts with '{'. */
int ardb_run_set_stages(ardb *db, int64_t run_id, const char *json);

/* ---- problems --------------------------------------------------------- */
typedef struct ardb_problem {
    const char *op;    /* "mix", "phase1", "phase2" */
    const char *dtype; /* "f32", "bf16", "f16" */
    const char *form;  /* "replace", "additive" */
    int64_t d;
    int32_t n, heads, epilogue;
    int32_t s;         /* phase1 queries per block, 0 otherwise */
    int64_t t_bucket;  /* tokens the bucket was tuned at */
} ardb_problem;
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
/* ENOTFOUND when absent. *blob is malloc'ed, owned by the caller. */
int ardb_binary_get(ardb *db, const char *build_key, void **blob, size_t *size);

/* ---- measurements ----------------------------------------------------- */
typedef enum ardb_status {
    ARDB_STATUS_OK = 0,
    ARDB_STATUS_COMPILE_FAILED = 1,
    ARDB_STATUS_LAUNCH_FAILED = 2,
    ARDB_STATUS_WRONG_RESULT = 3,
    ARDB_STATUS_SKIPPED = 4,
    ARDB_STATUS_TIMEOUT = 5
} ardb_status;
const char *ardb_status_name(ardb_status s); /* "ok", "compile_failed", ... */

typedef struct ardb_measurement {
    int64_t run_id, candidate_id, problem_id, device_id;
    const char *build_key;     /* may be NULL when compilation failed */
    ardb_status status;
    double median_us, min_us, max_us, spread_us; /* spread: median abs deviation */
    int32_t reps;
    double gbps;               /* achieved bandwidth at the median */
    double roofline;           /* gbps over the ceiling matching its traffic
                                  (runs that record ceilings, v6); over
                                  the run's copy_gbps before */
    double rel_err;            /* ||out-ref|| / ||ref|| */
    const char *message;       /* why it failed, may be NULL */
} ardb_measurement;
int ardb_measurement_add(ardb *db, const ardb_measurement *m, int64_t *id);

/* Finds the newest measurement of (candidate, problem, device, build_key)
 * from any run: the tuner's resume cache. build_key NULL matches a NULL
 * build key. ENOTFOUND when there is none. String fields of *m are
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

/* One tuned T bucket of a problem, as the runtime needs it. */
typedef struct ardb_winner {
    int64_t t_bucket;
    char *variant, *kernel_name, *source, *source_hash, *params_json;
    char *device_fingerprint, *device_arch;
    int64_t run_id;
    double median_us, gbps, roofline;
} ardb_winner;

/* The winners for a problem (t_bucket ignored) at one fallback level:
 *   EXACT: device fingerprint equal; ARCHITECTURE: same backend and arch;
 *   BACKEND: same backend. At every level only devices of the same kind
 * count: a real device (dev->simulated 0) never gets a winner measured on
 * a simulated one, nor a simulated device one measured on hardware, since a
 * simulator's timings are a model. For each T bucket the newest run's winner is
 * returned, sorted by t_bucket. *out is a malloc'ed array owned by the
 * caller (ardb_winners_free). *count may be 0. String fields are NULL
 * where the database holds NULL. */
int ardb_winners_lookup(ardb *db, const ardb_problem *p, const ardb_device *dev,
                        ardb_level level, ardb_winner **out,
                        size_t *count);
void ardb_winners_free(ardb_winner *w, size_t count);

/* SQLite's data version of the main database (PRAGMA data_version): it
 * changes whenever another connection commits to the file, so that a caller
 * that keeps what it looked up can tell when to look again. It reads the
 * file as a lookup does (a short read transaction). */
int ardb_data_version(ardb *db, int64_t *version);

/* Row callback for listings: column names and values as text (SQL NULL is
 * ""; numbers are formatted). Pointers are valid during the call only. A
 * non-zero return stops the listing, which still returns ARDB_DONE. */
typedef int (*ardb_row_fn)(void *ctx, int ncol, const char *const *names,
                           const char *const *values);
/* The latest winner of every problem for every device (or the winners of
 * one run), joined with its measurement: columns problem (key), device
 * (name, with " (simulated)" after a simulated device's), variant,
 * median_us, gbps, roofline; in problem key order with numeric fields
 * compared as numbers. */
int ardb_list_winners(ardb *db, int64_t run_id /* 0: all */, ardb_row_fn fn,
                      void *ctx);
/* All runs, newest last: id, started_at, finished_at, status, device
 * (marked " (simulated)" as in ardb_list_winners), strategy, project_version, compiler, copy_gbps, read_gbps (GB/s with one
 * decimal; "" where not recorded, e.g. every run of a file older than
 * schema v3 opened read-only). */
int ardb_list_runs(ardb *db, ardb_row_fn fn, void *ctx);

#endif /* ARDB_H */
