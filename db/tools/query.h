/*
 * query.h - one-off statements for the history and exchange layers
 * (history.c, exchange.c): prepare, run, read columns. Internal to db/.
 *
 * The access layer of ardb.c caches the statements of the hot paths; these
 * layers run each statement once per call, so they prepare and finalize.
 */
#ifndef ARDB_QUERY_H
#define ARDB_QUERY_H

#include <stddef.h>
#include <stdint.h>

#include "ardb_internal.h"

/* Prepares sql; on failure records "what: message". */
int ardb__prepare(ardb *db, const char *sql, sqlite3_stmt **st,
                  const char *what);
/* Records an SQLite failure of a step, finalizes st, returns the code. */
int ardb__step_fail(ardb *db, sqlite3_stmt *st, int rc, const char *what);
/* Runs a one-value integer query with up to two int64 parameters (?1, ?2);
 * ENOTFOUND when it returns no row. */
int ardb__query_int(ardb *db, const char *sql, int64_t p1, int64_t p2,
                    int64_t *out, const char *what);
/* Makes room for need elements in a growable array. 0, or -1 on OOM. */
int ardb__grow(void **arr, size_t *cap, size_t need, size_t elem);
/* The SQL expression of a run's uid for a schema version, with the runs
 * table aliased as `r` in the statement: the column from v2 on, else the
 * identity the v2 migration derives. */
const char *ardb__run_uid_expr(int64_t version);
/* The SQL expression of a run's read-only bandwidth for a schema version,
 * runs aliased `r`: the column from v3 on, else NULL, since a file older
 * than v3 opened read-only has no such column. */
const char *ardb__run_read_gbps_expr(int64_t version);
/* The SQL expression of whether a device is simulated for a schema
 * version, devices aliased `alias`: the column from v4 on, else 0, since
 * every device of a file older than v4 (opened read-only, so not migrated)
 * is real hardware. Returns a static string per alias it knows ("d", "s",
 * "x"), NULL for another. */
const char *ardb__device_simulated_expr(int64_t version, const char *alias);
/* The SQL expression of whether a measurement is of a final round for a
 * schema version, measurements aliased `m`: the column from v8 on, else
 * what the migration to v8 derives from the message. */
const char *ardb__final_round_expr(int64_t version);
/* The SQL expression of a measurement's fraction of the ceiling for a
 * schema version, measurements aliased `alias`: ceiling_fraction from v11
 * on, the column's older name before. Returns a static string per alias it
 * knows ("m", "s"), NULL for another. */
const char *ardb__ceiling_fraction_expr(int64_t version, const char *alias);
/* The order of problems in every listing: key fields compared as numbers.
 * `p` is the alias of the problems table. */
#define ARDB_PROBLEM_ORDER                                                    \
    "p.op, p.dtype, p.d, p.n, p.heads, p.form, p.epilogue, p.s, p.t_bucket"

#endif
