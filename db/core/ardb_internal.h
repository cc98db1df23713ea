/*
 * ardb_internal.h - shared by the translation units of db/ only.
 */
#ifndef ARDB_INTERNAL_H
#define ARDB_INTERNAL_H

#include <sqlite3.h>

#include "ardb.h"

/* How long a connection waits for another's lock. */
#define ARDB_BUSY_TIMEOUT_MS 10000

/* The ISO-8601 UTC timestamp expression used by every INSERT/UPDATE. */
#define ARDB_NOW "strftime('%Y-%m-%dT%H:%M:%fZ','now')"

/* The name of measurements.ceiling_fraction in a file older than schema
 * v11, which renamed the column (the values are the same). A writer's open
 * migrates such a file; a read-only handle reads it as it is. */
#define ARDB_CEILING_FRACTION_PRE_V11 "roofline"

/* Prepared statements cached per connection (SQLITE_PREPARE_PERSISTENT). */
enum ardb_stmt_id {
    ST_DEVICE_INSERT,
    ST_DEVICE_SELECT,
    ST_RUN_INSERT,
    ST_RUN_FINISH,
    ST_RUN_CEILINGS,
    ST_RUN_ROOFS,
    ST_RUN_STAGES,
    ST_DATA_VERSION,
    ST_PROBLEM_INSERT,
    ST_PROBLEM_SELECT,
    ST_CANDIDATE_INSERT,
    ST_CANDIDATE_SELECT,
    ST_BINARY_INSERT,
    ST_BINARY_SELECT,
    ST_MEASUREMENT_INSERT,
    ST_MEASUREMENT_FIND,
    ST_MEASUREMENT_FIND_PRE_V8,
    ST_MEASUREMENT_FIND_PRE_V11,
    ST_WINNER_SET,
    ST_WINNERS_LOOKUP,
    ST_WINNERS_LOOKUP_PRE_V4,
    ST_WINNERS_LOOKUP_PRE_V9,
    ST_WINNERS_LOOKUP_PRE_V11,
    ST_LIST_WINNERS,
    ST_LIST_RUNS,
    ST_LIST_RUNS_PRE_V3,
    ST_LIST_WINNERS_PRE_V4,
    ST_LIST_WINNERS_PRE_V9,
    ST_LIST_WINNERS_PRE_V11,
    ST_LIST_RUNS_PRE_V4,
    ST_COUNT
};

struct ardb {
    sqlite3 *h;
    int readonly;
    char *path;
    sqlite3_stmt *stmts[ST_COUNT];
    char err[1024];
};

/* Opens a connection (ardb_open_readonly and db/write's ardb_open): checks
 * what lies at path, opens it (read-only as immutable where a reader must,
 * see ardb_open), turns foreign keys on and hands the connection to setup,
 * which checks or prepares the schema. readonly with create is EINVAL. On
 * failure *out is NULL and msg (may be NULL) holds the message. */
int ardb__open(const char *path, int readonly, int create,
               int (*setup)(ardb *db, int create), ardb **out, char *msg,
               size_t msg_len);

/* Formats the message into db->err and returns code. */
int ardb__fail(ardb *db, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Maps an SQLite result code to an ARDB_ code. */
int ardb__map_rc(int rc);
/* Records "what: sqlite3_errmsg()" and returns the mapped code. */
int ardb__sql_fail(ardb *db, int rc, const char *what);
/* Runs statements that take no values (a PRAGMA, BEGIN, COMMIT); on
 * failure records "what: sqlite3_errmsg()" and returns the mapped code. */
int ardb__exec(ardb *db, const char *sql, const char *what);
/* The cached statement for id (prepared on first use), reset and unbound. */
int ardb__stmt(ardb *db, int id, const char *sql, sqlite3_stmt **st);
/* One form of a statement that differs by schema version: the cached
 * statement id and SQL for files of version `since` and later. */
typedef struct ardb_stmt_form {
    int64_t since;
    int id;
    const char *sql;
} ardb_stmt_form;
/* ardb__stmt of the first of the n forms (newest first) whose `since` is
 * at most version; the last form should have since 0. */
int ardb__stmt_for_version(ardb *db, int64_t version, const ardb_stmt_form *forms, size_t n, sqlite3_stmt **st);
/* The same for the schema version of the main database, read first. */
int ardb__stmt_for_schema(ardb *db, const ardb_stmt_form *forms, size_t n, sqlite3_stmt **st);
/* Resets a statement after use so that it holds no read transaction. */
void ardb__release(sqlite3_stmt *st);
/* ardb__sql_fail, then ardb__release of st: the end of a statement that
 * failed to bind or to step. */
int ardb__stmt_fail(ardb *db, sqlite3_stmt *st, int rc, const char *what);
/* EREADONLY with a message when the connection is read-only. */
int ardb__check_writable(ardb *db);
/* malloc'ed copy of a text column; NULL for SQL NULL. *oom set on failure. */
char *ardb__col_dup(sqlite3_stmt *st, int col, int *oom);
/* A double column, NAN for SQL NULL. */
double ardb__col_double(sqlite3_stmt *st, int col);

/* Sequential parameter binding: the first failure is kept in rc. */
typedef struct ardb_binder {
    sqlite3_stmt *st;
    int rc;
    int i;
} ardb_binder;
void ardb__bind_text(ardb_binder *b, const char *s);
void ardb__bind_int64(ardb_binder *b, int64_t v);
void ardb__bind_id(ardb_binder *b, int64_t id); /* <= 0 binds NULL */
void ardb__bind_double(ardb_binder *b, double v);
void ardb__bind_blob(ardb_binder *b, const void *p, size_t n);

#endif
