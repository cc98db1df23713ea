/*
 * resume.c - what the tuner asks the database when it resumes work.
 */
#include "ardb_internal.h"

#include <inttypes.h>

int ardb_winner_latest(ardb *db, int64_t problem_id, int64_t device_id,
                       int64_t *candidate_id, int64_t *measurement_id)
{
    /* The newest run's decision for this problem on this device. */
    static const char sql[] =
        "SELECT candidate_id, measurement_id FROM winners"
        " WHERE problem_id = ?1 AND device_id = ?2"
        " ORDER BY run_id DESC LIMIT 1";
    sqlite3_stmt *st = NULL;
    if (!db || !candidate_id || !measurement_id)
        return ARDB_EINVAL;
    int rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, "latest winner");
    sqlite3_bind_int64(st, 1, problem_id);
    sqlite3_bind_int64(st, 2, device_id);
    rc = sqlite3_step(st);
    int code = ARDB_DONE;
    if (rc == SQLITE_ROW) {
        *candidate_id = sqlite3_column_int64(st, 0);
        *measurement_id = sqlite3_column_int64(st, 1);
    } else if (rc == SQLITE_DONE) {
        code = ardb__fail(db, ARDB_ENOTFOUND, "no winner for problem %" PRId64 " on device %" PRId64, problem_id,
                          device_id);
    } else {
        code = ardb__sql_fail(db, rc, "latest winner");
    }
    sqlite3_finalize(st);
    return code;
}
