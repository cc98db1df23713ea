/*
 * listings.c - the tables `attnres db show` prints: the latest winners and
 * the runs, one row at a time as text.
 */
#include "ardb_tools.h"
#include "ardb_internal.h"
#include "schema.h"

#include <stddef.h>

/* Steps st and hands each row to fn as text; SQL NULL is passed as "". A
 * non-zero return from fn stops the listing (still ARDB_DONE). */
static int list_rows(ardb *db, sqlite3_stmt *st, ardb_row_fn fn, void *ctx,
                     const char *what)
{
    enum { MAXCOL = 32 };
    const char *names[MAXCOL], *values[MAXCOL];
    int ncol = sqlite3_column_count(st), rc, i, code = ARDB_DONE;

    if (ncol > MAXCOL)
        ncol = MAXCOL;
    for (i = 0; i < ncol; i++) {
        names[i] = sqlite3_column_name(st, i);
        if (!names[i]) {
            ardb__release(st);
            return ardb__fail(db, ARDB_ENOMEM, "%s: out of memory", what);
        }
    }
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        for (i = 0; i < ncol; i++) {
            if (sqlite3_column_type(st, i) == SQLITE_NULL) {
                values[i] = "";
            } else {
                values[i] = (const char *)sqlite3_column_text(st, i);
                if (!values[i]) {
                    code = ardb__fail(db, ARDB_ENOMEM, "%s: out of memory",
                                      what);
                    break;
                }
            }
        }
        if (code != ARDB_DONE)
            break;
        if (fn(ctx, ncol, names, values) != 0) {
            rc = SQLITE_DONE;
            break;
        }
    }
    if (code == ARDB_DONE && rc != SQLITE_DONE)
        code = ardb__sql_fail(db, rc, what);
    ardb__release(st);
    return code;
}

/* The device column of the listings: its name (else fingerprint), with
 * " (simulated)" after a simulated device's, so that a person reading a
 * listing never takes a simulator's model timings for hardware. */
#define DEVICE_LABEL(simulated)                                               \
    "COALESCE(d.name, d.fingerprint) ||"                                      \
    " CASE WHEN " simulated " THEN ' (simulated)' ELSE '' END"

int ardb_list_winners(ardb *db, int64_t run_id, ardb_row_fn fn, void *ctx)
{
#define LIST_WINNERS_SQL(simulated, provisional, fraction)                    \
    "SELECT problem, device, variant, median_us, gbps, ceiling_fraction,"     \
    " provisional"                                                            \
    " FROM ("                                                                 \
    "  SELECT p.key AS problem, " DEVICE_LABEL(simulated) " AS device,"       \
    "   c.variant AS variant,"                                                \
    "   CASE WHEN m.median_us IS NULL THEN NULL"                              \
    "        ELSE printf('%.3f', m.median_us) END AS median_us,"              \
    "   CASE WHEN m.gbps IS NULL THEN NULL"                                   \
    "        ELSE printf('%.1f', m.gbps) END AS gbps,"                        \
    "   CASE WHEN m." fraction " IS NULL THEN NULL"                           \
    "        ELSE printf('%.3f', m." fraction ") END AS ceiling_fraction,"    \
    "   " provisional " AS provisional,"                                      \
    "   p.op, p.dtype, p.d, p.n, p.heads, p.form, p.epilogue, p.s,"           \
    "   p.t_bucket, d.id AS did,"                                             \
    "   row_number() OVER (PARTITION BY w.problem_id, w.device_id"            \
    "    ORDER BY r.started_at DESC, w.run_id DESC) AS rn"                    \
    "  FROM winners w"                                                        \
    "  JOIN runs r ON r.id = w.run_id"                                        \
    "  JOIN problems p ON p.id = w.problem_id"                                \
    "  JOIN devices d ON d.id = w.device_id"                                  \
    "  JOIN candidates c ON c.id = w.candidate_id"                            \
    "  JOIN measurements m ON m.id = w.measurement_id"                        \
    "  WHERE ?1 = 0 OR w.run_id = ?1"                                         \
    " ) WHERE rn = 1"                                                         \
    " ORDER BY op, dtype, d, n, heads, form, epilogue, s, t_bucket, did"
/* A provisional winner (schema v9) is listed with its evidence; the
 * others leave the column empty. */
#define PROVISIONAL                                                           \
    "CASE WHEN w.provisional THEN 'yes: ' ||"                                 \
    " COALESCE(NULLIF(w.disturbance, ''), 'its final round was disturbed') END"
    /* A file older than v4 opened read-only has only real devices; one
     * older than v9 has no provisional winner; one older than v11 names the
     * fraction of the ceiling by its older name. */
    static const char sql[] = LIST_WINNERS_SQL("d.simulated", PROVISIONAL, "ceiling_fraction");
    static const char sql_pre_v11[] = LIST_WINNERS_SQL("d.simulated", PROVISIONAL, ARDB_CEILING_FRACTION_PRE_V11);
    static const char sql_pre_v9[] = LIST_WINNERS_SQL("d.simulated", "NULL", ARDB_CEILING_FRACTION_PRE_V11);
    static const char sql_pre_v4[] = LIST_WINNERS_SQL("0", "NULL", ARDB_CEILING_FRACTION_PRE_V11);
#undef PROVISIONAL
#undef LIST_WINNERS_SQL
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!fn || run_id < 0)
        return ardb__fail(db, ARDB_EINVAL, "ardb_list_winners: invalid argument");
    const ardb_stmt_form forms[] = {{11, ST_LIST_WINNERS, sql},
                                    {9, ST_LIST_WINNERS_PRE_V11, sql_pre_v11},
                                    {4, ST_LIST_WINNERS_PRE_V9, sql_pre_v9},
                                    {0, ST_LIST_WINNERS_PRE_V4, sql_pre_v4}};
    if ((code = ardb__stmt_for_schema(db, forms, 4, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_int64(&b, run_id);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "list winners");
    return list_rows(db, st, fn, ctx, "list winners");
}

int ardb_list_runs(ardb *db, ardb_row_fn fn, void *ctx)
{
#define LIST_RUNS_SQL(read_gbps, simulated)                                   \
    "SELECT r.id AS id, r.started_at AS started_at,"                         \
    " r.finished_at AS finished_at, r.status AS status,"                     \
    " " DEVICE_LABEL(simulated) " AS device, r.strategy AS strategy,"        \
    " r.project_version AS project_version, r.compiler AS compiler,"         \
    " CASE WHEN r.copy_gbps IS NULL THEN NULL"                               \
    "      ELSE printf('%.1f', r.copy_gbps) END AS copy_gbps,"               \
    " " read_gbps " AS read_gbps"                                            \
    " FROM runs r LEFT JOIN devices d ON d.id = r.device_id"                 \
    " ORDER BY r.id"
#define READ_GBPS                                                             \
    "CASE WHEN r.read_gbps IS NULL THEN NULL"                                 \
    " ELSE printf('%.1f', r.read_gbps) END"
    static const char sql[] = LIST_RUNS_SQL(READ_GBPS, "d.simulated");
    /* A file older than v4 opened read-only has only real devices; one
     * older than v3 has no read_gbps column either: it lists the same
     * columns, with read_gbps empty. */
    static const char sql_pre_v4[] = LIST_RUNS_SQL(READ_GBPS, "0");
    static const char sql_pre_v3[] = LIST_RUNS_SQL("NULL", "0");
#undef READ_GBPS
#undef LIST_RUNS_SQL
    sqlite3_stmt *st;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!fn)
        return ardb__fail(db, ARDB_EINVAL, "ardb_list_runs: invalid argument");
    const ardb_stmt_form forms[] = {
        {4, ST_LIST_RUNS, sql}, {3, ST_LIST_RUNS_PRE_V4, sql_pre_v4}, {0, ST_LIST_RUNS_PRE_V3, sql_pre_v3}};
    if ((code = ardb__stmt_for_schema(db, forms, 3, &st)))
        return code;
    return list_rows(db, st, fn, ctx, "list runs");
}

#undef DEVICE_LABEL
