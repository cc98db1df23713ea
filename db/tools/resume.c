/*
 * resume.c - what the tuner asks the database when it resumes work.
 */
#include <stdlib.h>

#include "ardb_internal.h"
#include "ardb_tools.h"
#include "migrate.h"
#include "query.h"
#include "schema.h"

/* Prepares sql, which runs once and so is not cached, with the n ids bound
 * to ?1 to ?n; ARDB_DONE, or the failure recorded as what's. */
static int prepare_ids(ardb *db, const char *sql, const char *what, sqlite3_stmt **st, int n, const int64_t *ids)
{
    const int rc = sqlite3_prepare_v2(db->h, sql, -1, st, NULL);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, what);
    for (int i = 0; i < n; i++)
        sqlite3_bind_int64(*st, i + 1, ids[i]);
    return ARDB_DONE;
}

int ardb_measurement_find_final(ardb *db, int64_t candidate_id, int64_t problem_id, int64_t device_id,
                                const char *build_key, double *median_us, double *spread_us,
                                int64_t *measurement_id)
{
    /* The newest ok measurement of a final (interleaved) round; a reader
     * of a file older than v8 tells one as the migration would. */
#define FIND_FINAL_SQL(final_round)                                           \
    "SELECT id, median_us, spread_us FROM measurements"                       \
    " WHERE candidate_id = ?1 AND problem_id = ?2 AND device_id = ?3"        \
    " AND build_key IS ?4 AND status = 'ok' AND " final_round                \
    " ORDER BY id DESC LIMIT 1"
    static const char sql[] = FIND_FINAL_SQL("final_round = 1");
    static const char sql_pre_v8[] = FIND_FINAL_SQL(ARDB_LEGACY_FINAL_ROUND("message"));
#undef FIND_FINAL_SQL
    sqlite3_stmt *st = NULL;
    int64_t version;
    if (!db || !median_us || !spread_us || !measurement_id)
        return ARDB_EINVAL;
    const int64_t ids[] = {candidate_id, problem_id, device_id};
    int code = ardb__read_version(db, &version);
    if (code || (code = prepare_ids(db, version >= 8 ? sql : sql_pre_v8, "final measurement", &st, 3, ids)))
        return code;
    if (build_key)
        sqlite3_bind_text(st, 4, build_key, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 4);
    const int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *measurement_id = sqlite3_column_int64(st, 0);
        *median_us = ardb__col_double(st, 1);
        *spread_us = ardb__col_double(st, 2);
    } else if (rc == SQLITE_DONE) {
        code = ARDB_ENOTFOUND;
    } else {
        code = ardb__sql_fail(db, rc, "final measurement");
    }
    sqlite3_finalize(st);
    return code;
}

int ardb_winner_nearest_bucket(ardb *db, int64_t problem_id, int64_t device_id, int64_t *candidate_id)
{
    static const char sql[] =
        "SELECT w.candidate_id FROM problems q"
        " JOIN problems p ON p.op = q.op AND p.dtype = q.dtype AND p.form = q.form AND p.d = q.d"
        " AND p.n = q.n AND p.heads = q.heads AND p.epilogue = q.epilogue AND p.s = q.s"
        " AND p.t_bucket != q.t_bucket"
        " JOIN winners w ON w.problem_id = p.id AND w.device_id = ?2"
        " WHERE q.id = ?1"
        " ORDER BY MAX(p.t_bucket * 1.0 / q.t_bucket, q.t_bucket * 1.0 / p.t_bucket), w.run_id DESC"
        " LIMIT 1";
    if (!db || !candidate_id)
        return ARDB_EINVAL;
    sqlite3_stmt *st = NULL;
    const int64_t ids[] = {problem_id, device_id};
    int code = prepare_ids(db, sql, "nearest bucket's winner", &st, 2, ids);
    if (code)
        return code;
    const int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW)
        *candidate_id = sqlite3_column_int64(st, 0);
    else if (rc == SQLITE_DONE)
        code = ARDB_ENOTFOUND;
    else
        code = ardb__sql_fail(db, rc, "nearest bucket's winner");
    sqlite3_finalize(st);
    return code;
}

int ardb_measurement_disturbance(ardb *db, int64_t measurement_id, char **evidence)
{
    /* The run that took the measurement recorded, with its winner of the
     * measurement's problem and device, whether that final round was
     * disturbed on every try. */
    static const char sql[] =
        "SELECT COALESCE(NULLIF(w.disturbance, ''), 'its final round was disturbed')"
        " FROM measurements m JOIN winners w ON w.run_id = m.run_id"
        " AND w.problem_id = m.problem_id AND w.device_id = m.device_id"
        " WHERE m.id = ?1 AND w.provisional = 1";
    int64_t version;
    if (!db)
        return ARDB_EINVAL;
    if (!evidence)
        return ardb__fail(db, ARDB_EINVAL, "ardb_measurement_disturbance: invalid argument");
    *evidence = NULL;
    int code = ardb__read_version(db, &version);
    /* No winner of a file older than v9 is provisional. */
    if (code || version < 9)
        return code;
    sqlite3_stmt *st = NULL;
    if ((code = prepare_ids(db, sql, "a measurement's disturbance", &st, 1, &measurement_id)))
        return code;
    const int rc = sqlite3_step(st);
    int oom = 0;
    if (rc == SQLITE_ROW) {
        *evidence = ardb__col_dup(st, 0, &oom);
        if (oom)
            code = ardb__fail(db, ARDB_ENOMEM, "a measurement's disturbance: out of memory");
    } else if (rc != SQLITE_DONE) {
        code = ardb__sql_fail(db, rc, "a measurement's disturbance");
    }
    sqlite3_finalize(st);
    return code;
}

/* Appends v to a growing array; 0, or -1 when out of memory. */
static int push(double **a, size_t *n, size_t *cap, double v)
{
    if (*n == *cap) {
        size_t grow = *cap ? 2 * *cap : 64;
        double *p = realloc(*a, grow * sizeof *p);
        if (!p)
            return -1;
        *a = p;
        *cap = grow;
    }
    (*a)[(*n)++] = v;
    return 0;
}

int ardb_screening_spreads(ardb *db, int64_t problem_id, int64_t device_id, int64_t run_id, double lo_us,
                           double hi_us, size_t cap, double **now, size_t *nnow, double **before, size_t *nbefore)
{
    static const char sql[] =
        "SELECT run_id = ?3 AND problem_id = ?1, spread_us / median_us FROM measurements"
        " WHERE device_id = ?2 AND status = 'ok' AND message = 'screening' AND reps >= 3"
        " AND median_us > 0 AND spread_us >= 0"
        " AND ((run_id = ?3 AND problem_id = ?1) OR median_us BETWEEN ?4 AND ?5) ORDER BY id DESC";
    if (!db)
        return ARDB_EINVAL;
    if (!now || !nnow || !before || !nbefore)
        return ardb__fail(db, ARDB_EINVAL, "ardb_screening_spreads: invalid argument");
    *now = *before = NULL;
    *nnow = *nbefore = 0;
    sqlite3_stmt *st = NULL;
    int rc, code = ardb__prepare(db, sql, &st, "screening spreads");
    if (code)
        return code;
    sqlite3_bind_int64(st, 1, problem_id);
    sqlite3_bind_int64(st, 2, device_id);
    sqlite3_bind_int64(st, 3, run_id);
    sqlite3_bind_double(st, 4, lo_us);
    sqlite3_bind_double(st, 5, hi_us);
    size_t cap_now = 0, cap_before = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const int mine = sqlite3_column_int(st, 0);
        const double v = sqlite3_column_double(st, 1);
        double **a = mine ? now : before;
        size_t *n = mine ? nnow : nbefore, *c = mine ? &cap_now : &cap_before;
        if (*n < cap && push(a, n, c, v)) {
            code = ardb__fail(db, ARDB_ENOMEM, "screening spreads: out of memory");
            break;
        }
        if (*nnow >= cap && *nbefore >= cap)
            break;
    }
    if (code == ARDB_DONE && rc != SQLITE_DONE)
        code = ardb__sql_fail(db, rc, "screening spreads");
    sqlite3_finalize(st);
    if (code != ARDB_DONE) {
        free(*now), free(*before);
        *now = *before = NULL;
        *nnow = *nbefore = 0;
    }
    return code;
}
