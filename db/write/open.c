/*
 * open.c - a writer's connection: ardb_open (WAL, creation and migration
 * of the schema, the runs whose process is gone) and transactions.
 *
 * Library code: never prints, aborts or exits; every failure is a return
 * code plus a message in db->err.
 */
#include "ardb_write.h"
#include "liveness.h"
#include "migrate.h"

#include <stdio.h>
#include <string.h>

/* ---- open ---------------------------------------------------------------- */

/* The current journal mode into buf ("wal", "delete", ...). */
static int journal_mode(ardb *db, const char *sql, char *buf, size_t len)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    buf[0] = '\0';
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) {
            const unsigned char *t = sqlite3_column_text(st, 0);
            if (t)
                snprintf(buf, len, "%s", (const char *)t);
            rc = SQLITE_OK;
        } else if (rc == SQLITE_DONE) {
            rc = SQLITE_OK;
        }
    }
    sqlite3_finalize(st);
    return rc;
}

/* Switches the file to WAL (persistent in the file). The switch needs an
 * exclusive lock and SQLite does not always run the busy handler for it,
 * so a busy answer is retried here until the busy timeout. */
static int set_wal(ardb *db)
{
    char mode[32];
    int waited = 0, rc;
    rc = journal_mode(db, "PRAGMA journal_mode", mode, sizeof mode);
    if (rc == SQLITE_OK && !strcmp(mode, "wal"))
        return ARDB_DONE;
    for (;;) {
        rc = journal_mode(db, "PRAGMA journal_mode = WAL", mode, sizeof mode);
        if (rc == SQLITE_OK)
            return ARDB_DONE; /* "wal", or a mode the file system forces */
        if (((rc & 0xff) != SQLITE_BUSY && (rc & 0xff) != SQLITE_LOCKED) ||
            waited >= ARDB_BUSY_TIMEOUT_MS)
            return ardb__fail(db, ardb__map_rc(rc),
                              "cannot switch %s to WAL: %s", db->path,
                              sqlite3_errmsg(db->h));
        waited += sqlite3_sleep(5 + waited / 50);
    }
}

/* The most runs one open marks; any others are marked by the next. */
#define MAX_MARKED_RUNS 256

/* Marks 'interrupted' every running run whose owning process is gone (see
 * ardb_open). Best effort: a failure leaves the runs to the next read-write
 * open and does not fail this one, since a busy file is no reason to refuse
 * a tuner its database. */
static void mark_interrupted_runs(ardb *db)
{
    sqlite3_stmt *st = NULL;
    int64_t ids[MAX_MARKED_RUNS];
    size_t n = 0, i;
    int rc;

    /* Read first, without a write lock: usually no run is left running. */
    rc = sqlite3_prepare_v2(db->h,
                            "SELECT id, owner FROM runs WHERE status = "
                            "'running' AND owner IS NOT NULL ORDER BY id",
                            -1, &st, NULL);
    while (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW &&
           n < MAX_MARKED_RUNS) {
        rc = SQLITE_OK;
        if (ardb__owner_gone((const char *)sqlite3_column_text(st, 1)))
            ids[n++] = sqlite3_column_int64(st, 0);
    }
    sqlite3_finalize(st);
    st = NULL;
    if (n == 0)
        return;
    if (sqlite3_exec(db->h, "BEGIN IMMEDIATE", NULL, NULL, NULL) != SQLITE_OK)
        return;
    /* "AND status = 'running'": another process may have decided the run
     * (or the run itself finished) since it was read. finished_at stays
     * NULL: when the process ended is not known. */
    rc = sqlite3_prepare_v2(db->h,
                            "UPDATE runs SET status = 'interrupted' WHERE id "
                            "= ? AND status = 'running'",
                            -1, &st, NULL);
    for (i = 0; rc == SQLITE_OK && i < n; i++) {
        rc = sqlite3_bind_int64(st, 1, ids[i]);
        if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_DONE)
            rc = SQLITE_OK;
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK ||
        sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL) != SQLITE_OK)
        (void)sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
}

/* What a writer's open does after the connection is made: WAL, the schema
 * (created or migrated), then the runs left 'running' by a process that is
 * gone. */
static int setup_writer(ardb *db, int create)
{
    int code, rc;
    if ((code = set_wal(db)))
        return code;
    rc = sqlite3_exec(db->h, "PRAGMA synchronous = NORMAL", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, "PRAGMA synchronous = NORMAL");
    if ((code = ardb__schema_init(db, create)))
        return code;
    mark_interrupted_runs(db);
    return ARDB_DONE;
}

int ardb_open(const char *path, unsigned flags, ardb **out, char *msg,
              size_t msg_len)
{
    if ((flags & ~(ARDB_READONLY | ARDB_CREATE)) ||
        ((flags & ARDB_READONLY) && (flags & ARDB_CREATE))) {
        if (out)
            *out = NULL;
        if (msg && msg_len)
            snprintf(msg, msg_len, "ardb_open: invalid argument");
        return ARDB_EINVAL;
    }
    if (flags & ARDB_READONLY)
        return ardb_open_readonly(path, out, msg, msg_len);
    return ardb__open(path, 0, (flags & ARDB_CREATE) != 0, setup_writer, out,
                      msg, msg_len);
}

/* ---- transactions ------------------------------------------------------- */

int ardb_begin(ardb *db)
{
    if (!db)
        return ARDB_EINVAL;
    /* IMMEDIATE: a writer takes the lock up front (through the busy
     * timeout) instead of failing when a read upgrades. */
    return db->readonly ? ardb__exec(db, "BEGIN DEFERRED", "BEGIN DEFERRED failed")
                        : ardb__exec(db, "BEGIN IMMEDIATE", "BEGIN IMMEDIATE failed");
}

int ardb_commit(ardb *db)
{
    if (!db)
        return ARDB_EINVAL;
    return ardb__exec(db, "COMMIT", "COMMIT failed");
}

int ardb_rollback(ardb *db)
{
    if (!db)
        return ARDB_EINVAL;
    if (sqlite3_get_autocommit(db->h))
        return ARDB_DONE; /* nothing open (or SQLite already rolled back) */
    return ardb__exec(db, "ROLLBACK", "ROLLBACK failed");
}

