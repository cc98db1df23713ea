/*
 * ardb.h - the read side of the attnres tuning database (DESIGN §5): what
 * the runtime reads, and all that libattnres carries of db/.
 *
 * Every SQL statement of the project lives in db/. This header declares
 * db/'s core (ardb_core, db/core/): open a file read-only and check its
 * schema, look up winners, load binaries, watch the data version. The
 * writes of a tuning run, and the creation and migration of the schema, are
 * in ardb_write.h (ardb_write, db/write/); the tools that only the tuner
 * and the command line need (history, comparisons, export, import, merge)
 * in ardb_tools.h (db/tools/). Neither is in libattnres.
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
 * runs.ceilings, version 7 runs.stages, version 8 measurements.final_round,
 * version 9 winners.provisional and winners.disturbance, version 10 the
 * measurement status 'nondeterministic', version 11 the name
 * measurements.ceiling_fraction (roofline before v11; db/write/migrate.c).
 * A writer's open (ardb_open, ardb_write.h) migrates an older file in place,
 * keeping a copy as PATH.v<N>.bak; a read-only open reads it as it is (every
 * device of a file older than v4 is real; no measurement of a file older
 * than v10 is nondeterministic; a file older than v11 is read under the
 * column's older name).
 *
 * A file newer than this build is refused by every open, the runtime's
 * included (ARDB_ENEWER), even where the change would not affect what it
 * reads (v10 adds no column): the version is the whole contract, so an
 * older build never guesses what a newer file means. */
#define ARDB_SCHEMA_VERSION 11

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

/* Opens an existing database read-only. A missing file is ENOTDB ("no such
 * database file: PATH"). A file that is not SQLite, or SQLite without the
 * attnres schema, is ENOTDB with a message that says so; a newer
 * user_version is ENEWER; an older one is read as it is. Anything but a
 * regular file at path, or at path-wal, -shm, -journal, is ENOTDB before
 * SQLite opens it (a FIFO's open would block). In a directory this process
 * cannot write, where SQLite cannot make the -shm file a WAL reader needs,
 * the file is read as immutable (no -shm, no locks: right while nobody
 * writes it), unless a -wal file there holds changes (ESQL, naming it). On
 * failure *out is NULL and msg (may be NULL) is set. */
int ardb_open_readonly(const char *path, ardb **out, char *msg,
                       size_t msg_len);
void ardb_close(ardb *db); /* NULL is a no-op */
const char *ardb_errmsg(const ardb *db); /* last failure, never NULL */

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

/* ---- problems --------------------------------------------------------- */
typedef struct ardb_problem {
    const char *op;    /* "mix", "phase1", "phase2", "mix_backward", "phase1_backward", "phase2_backward" */
    const char *dtype; /* "f32", "bf16", "f16" */
    const char *form;  /* "replace", "additive" */
    int64_t d;
    int32_t n, heads, epilogue;
    int32_t s;         /* phase1 queries per block, 0 otherwise */
    int64_t t_bucket;  /* tokens the bucket was tuned at */
} ardb_problem;

/* ---- binaries (content-addressed by build key) ------------------------ */
/* ENOTFOUND when absent. *blob is malloc'ed, owned by the caller. */
int ardb_binary_get(ardb *db, const char *build_key, void **blob, size_t *size);

/* ---- winners ---------------------------------------------------------- */
/* One tuned T bucket of a problem, as the runtime needs it. */
typedef struct ardb_winner {
    int64_t t_bucket;
    char *variant, *kernel_name, *source, *source_hash, *params_json;
    char *device_fingerprint, *device_arch;
    int64_t run_id;
    double median_us, gbps;
    double ceiling_fraction; /* gbps over the ceiling matching its traffic
                                (runs that record ceilings, v6); over the
                                run's copy_gbps before */
    /* 1 when the final round that chose it was disturbed by other work on
     * every try (schema v9): the choice may be the noise's, and `attnres
     * tune --revalidate` decides it again. disturbance is that evidence,
     * NULL for a winner that is not provisional. Winners of a file older
     * than v9 are not provisional. No ABI is at stake in adding them:
     * ardb.h is not installed and libattnres exports only attnres_
     * symbols (runtime/libattnres.map), so every user of this struct is
     * built with it. */
    int provisional;
    char *disturbance;
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

#endif /* ARDB_H */
