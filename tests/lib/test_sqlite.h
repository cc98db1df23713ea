/*
 * test_sqlite.h - what the db tests do to a database file beside ardb:
 * open it through ardb with the failure printed, and read or change it
 * with plain SQLite, so that a check of what the file holds does not go
 * through the library under test. Header-only.
 */
#ifndef ATTNRES_TEST_SQLITE_H
#define ATTNRES_TEST_SQLITE_H

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ardb.h"

/* SQL that takes back v11's rename of measurements.ceiling_fraction, for
 * a test that turns a current file into one that an older version wrote. */
#define TEST_SQL_PRE_V11 "ALTER TABLE measurements RENAME COLUMN ceiling_fraction TO roofline;"

/* Opens path through ardb with flags; NULL, with ardb's message printed,
 * where it cannot. */
static inline ardb *open_db(const char *path, unsigned flags)
{
    char msg[512];
    ardb *db = NULL;
    if (ardb_open(path, flags, &db, msg, sizeof msg) != ARDB_DONE)
        fprintf(stderr, "open %s: %s\n", path, msg);
    return db;
}

/* Runs sql (one or more statements) on a plain connection, creating the
 * file if it is missing; SQLite's result code, with its message printed
 * on failure. */
static inline int raw_exec(const char *path, const char *sql)
{
    sqlite3 *h = NULL;
    int rc = sqlite3_open_v2(path, &h, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(h, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        fprintf(stderr, "%s: %s\n", sql, h ? sqlite3_errmsg(h) : "cannot open");
    sqlite3_close(h);
    return rc;
}

/* Prepares sql on a plain connection to the existing file path and steps
 * it to its first row; SQLITE_ROW when there is one. A writer may hold
 * the file: the connection waits up to ten seconds for it. */
static inline int raw_first_row(const char *path, const char *sql, sqlite3 **h, sqlite3_stmt **st)
{
    *h = NULL;
    *st = NULL;
    if (sqlite3_open_v2(path, h, SQLITE_OPEN_READWRITE, NULL) != SQLITE_OK ||
        sqlite3_busy_timeout(*h, 10000) != SQLITE_OK ||
        sqlite3_prepare_v2(*h, sql, -1, st, NULL) != SQLITE_OK)
        return SQLITE_ERROR;
    return sqlite3_step(*st);
}

/* The first column of sql's first row as an integer, or -1. */
static inline long long raw_int(const char *path, const char *sql)
{
    sqlite3 *h;
    sqlite3_stmt *st;
    long long v = -1;
    if (raw_first_row(path, sql, &h, &st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(h);
    return v;
}

/* The first column of sql's first row as a string to free, or NULL. */
static inline char *raw_text(const char *path, const char *sql)
{
    sqlite3 *h;
    sqlite3_stmt *st;
    char *out = NULL;
    if (raw_first_row(path, sql, &h, &st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        out = strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(h);
    return out;
}

#endif
