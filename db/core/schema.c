/*
 * schema.c - what a file holds: whether it is an attnres database, and of
 * which schema version. Creating and migrating the schema is db/write's.
 */
#include "schema.h"

#include <stdio.h>
#include <string.h>

/* Errors met while probing a file at open: a file SQLite cannot parse is
 * "not an SQLite database"; others keep their mapped code. */
static int probe_fail(ardb *db, int rc)
{
    int prim = rc & 0xff;
    if (prim == SQLITE_NOTADB || prim == SQLITE_CORRUPT)
        return ardb__fail(db, ARDB_ENOTDB, "%s is not an SQLite database (%s)",
                          db->path, sqlite3_errmsg(db->h));
    return ardb__fail(db, ardb__map_rc(rc), "cannot read %s: %s", db->path,
                      sqlite3_errmsg(db->h));
}

/* Runs a one-value query; *val gets column 0 as int64 or text match. */
static int query_int(ardb *db, const char *sql, int64_t *val, int *found)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return probe_fail(db, rc);
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *val = sqlite3_column_int64(st, 0);
        if (found)
            *found = 1;
        rc = SQLITE_DONE;
    } else if (found) {
        *found = 0;
    }
    if (rc != SQLITE_DONE) {
        int code = probe_fail(db, rc);
        sqlite3_finalize(st);
        return code;
    }
    sqlite3_finalize(st);
    return ARDB_DONE;
}

int ardb__schema_read(ardb *db, schema_state *s)
{
    int64_t v = 0;
    int found = 0, code;
    memset(s, 0, sizeof *s);
    if ((code = query_int(db, "SELECT count(*) FROM sqlite_schema", &s->objects,
                          NULL)))
        return code;
    if ((code = query_int(db, "PRAGMA user_version", &s->user_version, NULL)))
        return code;
    if ((code = query_int(db,
                          "SELECT 1 FROM sqlite_schema WHERE type = 'table' "
                          "AND name = 'attnres_meta'",
                          &v, &found)))
        return code;
    s->has_meta = found;
    if (!s->has_meta)
        return ARDB_DONE;
    if ((code = query_int(db,
                          "SELECT 1 FROM attnres_meta WHERE key = 'format' "
                          "AND value = '" ARDB_FORMAT_MAGIC "'",
                          &v, &found))) {
        /* An attnres_meta of another shape is not ours. */
        if (code == ARDB_ESQL) {
            s->has_meta = 0;
            return ARDB_DONE;
        }
        return code;
    }
    s->format_ok = found;
    return ARDB_DONE;
}

int ardb__schema_check(ardb *db, const schema_state *s)
{
    if (s->objects == 0 && s->user_version == 0)
        return ardb__fail(db, ARDB_ENOTDB,
                          "%s is not an attnres database (it is empty)",
                          db->path);
    if (!s->has_meta || !s->format_ok)
        return ardb__fail(db, ARDB_ENOTDB, "%s is not an attnres database",
                          db->path);
    if (s->user_version > ARDB_SCHEMA_VERSION)
        return ardb__fail(db, ARDB_ENEWER,
                          "database schema version %lld is newer than this "
                          "build (%d): open it with a newer attnres",
                          (long long)s->user_version, ARDB_SCHEMA_VERSION);
    if (s->user_version < 1)
        return ardb__fail(db, ARDB_ENOTDB,
                          "%s is not an attnres database (schema version "
                          "%lld)",
                          db->path, (long long)s->user_version);
    return ARDB_DONE;
}

int ardb__read_version(ardb *db, int64_t *version)
{
    *version = ARDB_SCHEMA_VERSION;
    return db->readonly ? ardb__user_version(db, "main", version) : ARDB_DONE;
}

int ardb__user_version(ardb *db, const char *schema, int64_t *version)
{
    char sql[96];
    sqlite3_stmt *st = NULL;
    int rc;
    snprintf(sql, sizeof sql, "PRAGMA \"%s\".user_version", schema);
    rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        *version = sqlite3_column_int64(st, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, "cannot read the schema version");
    return ARDB_DONE;
}
