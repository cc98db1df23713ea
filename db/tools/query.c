/* query.c - see query.h. */
#include "query.h"

#include <stdlib.h>
#include <string.h>

#include "migrate.h"

int ardb__prepare(ardb *db, const char *sql, sqlite3_stmt **st,
                  const char *what)
{
    int rc = sqlite3_prepare_v2(db->h, sql, -1, st, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_finalize(*st);
        *st = NULL;
        return ardb__sql_fail(db, rc, what);
    }
    return ARDB_DONE;
}

int ardb__step_fail(ardb *db, sqlite3_stmt *st, int rc, const char *what)
{
    int code = ardb__sql_fail(db, rc, what);
    sqlite3_finalize(st);
    return code;
}

int ardb__query_int(ardb *db, const char *sql, int64_t p1, int64_t p2,
                    int64_t *out, const char *what)
{
    sqlite3_stmt *st = NULL;
    int code = ardb__prepare(db, sql, &st, what), rc, n;
    if (code)
        return code;
    n = sqlite3_bind_parameter_count(st);
    rc = SQLITE_OK;
    if (n >= 1)
        rc = sqlite3_bind_int64(st, 1, p1);
    if (rc == SQLITE_OK && n >= 2)
        rc = sqlite3_bind_int64(st, 2, p2);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *out = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return ARDB_DONE;
    }
    if (rc == SQLITE_DONE) {
        sqlite3_finalize(st);
        return ardb__fail(db, ARDB_ENOTFOUND, "%s: no such row", what);
    }
    return ardb__step_fail(db, st, rc, what);
}

int ardb__grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    size_t ncap;
    void *p;
    if (need <= *cap)
        return 0;
    ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    p = realloc(*arr, ncap * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = ncap;
    return 0;
}

const char *ardb__run_uid_expr(int64_t version)
{
    return version >= 2 ? "COALESCE(r.uid, " ARDB_LEGACY_RUN_UID("r") ")"
                        : ARDB_LEGACY_RUN_UID("r");
}

const char *ardb__run_read_gbps_expr(int64_t version)
{
    return version >= 3 ? "r.read_gbps" : "NULL";
}

const char *ardb__device_simulated_expr(int64_t version, const char *alias)
{
    if (!alias)
        return NULL;
    if (version < 4)
        return "0";
    if (!strcmp(alias, "d"))
        return "d.simulated";
    if (!strcmp(alias, "s"))
        return "s.simulated";
    if (!strcmp(alias, "x"))
        return "x.simulated";
    return NULL;
}

const char *ardb__final_round_expr(int64_t version)
{
    return version >= 8 ? "m.final_round" : ARDB_LEGACY_FINAL_ROUND("m.message");
}

const char *ardb__ceiling_fraction_expr(int64_t version, const char *alias)
{
    if (!alias)
        return NULL;
    if (!strcmp(alias, "m"))
        return version >= 11 ? "m.ceiling_fraction" : "m." ARDB_CEILING_FRACTION_PRE_V11;
    if (!strcmp(alias, "s"))
        return version >= 11 ? "s.ceiling_fraction" : "s." ARDB_CEILING_FRACTION_PRE_V11;
    return NULL;
}
