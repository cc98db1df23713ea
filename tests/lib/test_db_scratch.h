/*
 * test_db_scratch.h - the db tests' files in their scratch directory: the
 * directory (main makes it with db_scratch_begin), a path in it, a new
 * database there, and the check that an import is refused with the
 * message it should give. Header-only.
 */
#ifndef ATTNRES_TEST_DB_SCRATCH_H
#define ATTNRES_TEST_DB_SCRATCH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ardb_tools.h"
#include "check.h"
#include "test_scratch.h"
#include "test_sqlite.h"

static char tmpdir[512];

/* Makes tmpdir for the cases main runs (scratch_begin); TEST_DB_KEEP set
 * keeps it. */
static inline void db_scratch_begin(const char *name)
{
    scratch_begin(name, tmpdir, sizeof tmpdir, check_listing, "TEST_DB_KEEP");
}

/* The path of name in the scratch directory, into buf. */
static inline void path_in_tmp(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", tmpdir, name);
}

/* A new database at name in the scratch directory, path set to its path;
 * NULL, with the reason printed, where it cannot be made. */
static inline ardb *create_db(const char *name, char *path, size_t len)
{
    path_in_tmp(path, len, name);
    return open_db(path, ARDB_CREATE);
}

static inline int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Whether a writer's open migrated the file at path, which had schema
 * version `from`, in place: it is at ARDB_SCHEMA_VERSION now, and the
 * backup at bak holds it as it was, at `from`. */
static inline int migrated_with_backup(const char *path, const char *bak, int from)
{
    return raw_int(path, "PRAGMA user_version") == ARDB_SCHEMA_VERSION && file_exists(bak) &&
           raw_int(bak, "PRAGMA user_version") == from;
}

/* Closes db, which read the file at path (opened it read-only, or merged
 * it), and whether reading left that file as it was: still at schema
 * version `from`, and no backup at bak. */
static inline int closed_untouched(ardb *db, const char *path, const char *bak, int from)
{
    ardb_close(db);
    return raw_int(path, "PRAGMA user_version") == from && !file_exists(bak);
}

/* Opens the file at path, at schema version `from`, for writing, which
 * migrates it; NULL unless migrated_with_backup holds after the open. */
static inline ardb *open_migrated(const char *path, const char *bak, int from)
{
    ardb *db = open_db(path, 0);
    if (db && !migrated_with_backup(path, bak, from)) {
        ardb_close(db);
        return NULL;
    }
    return db;
}

/* Makes the database at path look as schema version `to` (4 to 10) left
 * it: the columns that later versions added are dropped, the one v11
 * renamed takes its older name, and the version marks are set back (the
 * status check that v10 widened stays wide). SQLite's result code;
 * SQLITE_MISUSE for a version outside 4 to 10. */
static inline int schema_back_to(const char *path, int to)
{
    static const char *const added_in[] = {
        [5] = "ALTER TABLE runs DROP COLUMN owner;",
        [6] = "ALTER TABLE runs DROP COLUMN ceilings;",
        [7] = "ALTER TABLE runs DROP COLUMN stages;",
        [8] = "ALTER TABLE measurements DROP COLUMN final_round;",
        [9] = "ALTER TABLE winners DROP COLUMN provisional; ALTER TABLE winners DROP COLUMN disturbance;",
        /* v10 only widened a CHECK, which an older reader does not see. */
        [10] = "",
        [11] = TEST_SQL_PRE_V11,
    };
    char sql[1024];
    if (to < 4 || to > 10)
        return SQLITE_MISUSE;
    size_t len = (size_t)snprintf(sql, sizeof sql,
                                  "UPDATE attnres_meta SET value = '%d' WHERE key = 'schema_version';"
                                  " PRAGMA user_version = %d;",
                                  to, to);
    for (int v = to + 1; v <= 11 && len < sizeof sql; v++)
        len += (size_t)snprintf(sql + len, sizeof sql - len, " %s", added_in[v]);
    return raw_exec(path, sql);
}

/* An export that an import must refuse, and what its message says. */
typedef struct import_refusal {
    const char *text, *msg;
} import_refusal;

/* Imports text into db, which must refuse it (ARDB_EINVAL) with a message
 * holding msg; counts a failure, naming case i of `what`, where it does
 * not. */
static inline void check_import_refused(ardb *db, const char *what, size_t i, const char *text, const char *msg)
{
    ardb_merge_stats s;
    const int rc = ardb_import_json(db, text, strlen(text), &s);
    if (rc != ARDB_EINVAL || !strstr(ardb_errmsg(db), msg)) {
        fprintf(stderr, "%s %zu: rc %d, message '%s' (want '%s')\n", what, i, rc, ardb_errmsg(db), msg);
        check_failures++;
    }
}

#endif
