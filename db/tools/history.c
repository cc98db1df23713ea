/*
 * history.c - the database as history: runs and everything recorded about
 * them, comparisons of two runs (diff, regress), the latency history of
 * the winners (plots), and the stored winners a re-validation re-measures.
 *
 * Library code: never prints, aborts or exits.
 */
#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ardb_tools.h"
#include "migrate.h"
#include "query.h"

/* ---- readers whose SQL depends on the schema version --------------------- */

/* Writes a reader's SQL text for a file of schema version `version` into
 * sql[size], reading a column that version lacks as its default; returns
 * snprintf's count. */
typedef int versioned_sql(char *sql, size_t size, int64_t version);

/* Reads the schema version of the main file, builds the reader's SQL text
 * for it and prepares it. what names the reader in messages, as for
 * ardb__prepare. A text too long for the buffer fails as a truncated one
 * would: ESQL. */
static int prepare_versioned(ardb *db, versioned_sql *build, sqlite3_stmt **st,
                             const char *what)
{
    char sql[4096];
    int64_t version = 0;
    int code, len;

    if ((code = ardb__user_version(db, "main", &version)))
        return code;
    len = build(sql, sizeof sql, version);
    if (len < 0 || (size_t)len >= sizeof sql)
        return ardb__fail(db, ARDB_ESQL, "%s: SQL text too long", what);
    return ardb__prepare(db, sql, st, what);
}

/* ---- a statement's rows into an array ------------------------------------ */

/* Reads the current row of st into elem (zeroed); nonzero when out of
 * memory, what it did copy left in elem for the array's free to release. */
typedef int row_reader(sqlite3_stmt *st, void *elem);
/* Frees an array of count elements and what they hold. */
typedef void rows_free(void *rows, size_t count);

/* Steps st to its end, reading each row into a new element (elem_size
 * bytes) of a malloc'ed array, and finalizes st. On success *rows and
 * *count hold the array; on failure what was read is freed and the
 * message is "what: out of memory" or what's SQLite failure. */
static int collect_rows(ardb *db, sqlite3_stmt *st, size_t elem_size,
                        row_reader *read, rows_free *free_rows,
                        const char *what, void **rows, size_t *count)
{
    void *arr = NULL;
    size_t n = 0, cap = 0;
    int code = ARDB_DONE, rc;

    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        void *elem;
        if (ardb__grow(&arr, &cap, n + 1, elem_size)) {
            code = ardb__fail(db, ARDB_ENOMEM, "%s: out of memory", what);
            break;
        }
        elem = (char *)arr + n++ * elem_size;
        memset(elem, 0, elem_size);
        if (read(st, elem)) {
            code = ardb__fail(db, ARDB_ENOMEM, "%s: out of memory", what);
            break;
        }
    }
    if (!code && rc != SQLITE_DONE)
        code = ardb__sql_fail(db, rc, what);
    sqlite3_finalize(st);
    if (code) {
        free_rows(arr, n);
        return code;
    }
    *rows = arr;
    *count = n;
    return ARDB_DONE;
}

/* ---- runs ---------------------------------------------------------------- */

void ardb_run_info_clear(ardb_run_info *r)
{
    if (!r)
        return;
    char *const owned[] = {r->uid,          r->note,        r->ceilings,    r->stages,
                           r->started_at,   r->finished_at, r->status,      r->user,
                           r->host,         r->command,     r->project_version, r->templates_hash,
                           r->compiler,     r->driver,      r->policy_json, r->strategy,
                           r->device_name,  r->device_backend, r->device_arch, r->device_fingerprint};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        free(owned[i]);
    memset(r, 0, sizeof *r);
}

void ardb_run_infos_free(ardb_run_info *r, size_t count)
{
    size_t i;
    if (!r)
        return;
    for (i = 0; i < count; i++)
        ardb_run_info_clear(&r[i]);
    free(r);
}

static void free_runs(void *rows, size_t count)
{
    ardb_run_infos_free(rows, count);
}

static int read_run(sqlite3_stmt *st, void *elem)
{
    ardb_run_info *r = elem;
    int oom = 0, c = 0;
    r->id = sqlite3_column_int64(st, c++);
    r->device_id = sqlite3_column_int64(st, c++);
    r->uid = ardb__col_dup(st, c++, &oom);
    r->note = ardb__col_dup(st, c++, &oom);
    r->started_at = ardb__col_dup(st, c++, &oom);
    r->finished_at = ardb__col_dup(st, c++, &oom);
    r->status = ardb__col_dup(st, c++, &oom);
    r->user = ardb__col_dup(st, c++, &oom);
    r->host = ardb__col_dup(st, c++, &oom);
    r->command = ardb__col_dup(st, c++, &oom);
    r->project_version = ardb__col_dup(st, c++, &oom);
    r->templates_hash = ardb__col_dup(st, c++, &oom);
    r->compiler = ardb__col_dup(st, c++, &oom);
    r->driver = ardb__col_dup(st, c++, &oom);
    r->policy_json = ardb__col_dup(st, c++, &oom);
    r->strategy = ardb__col_dup(st, c++, &oom);
    r->device_name = ardb__col_dup(st, c++, &oom);
    r->device_backend = ardb__col_dup(st, c++, &oom);
    r->device_arch = ardb__col_dup(st, c++, &oom);
    r->device_fingerprint = ardb__col_dup(st, c++, &oom);
    r->copy_gbps = ardb__col_double(st, c++);
    r->launch_us = ardb__col_double(st, c++);
    r->read_gbps = ardb__col_double(st, c++);
    r->measurements = sqlite3_column_int64(st, c++);
    r->winners = sqlite3_column_int64(st, c++);
    r->device_simulated = sqlite3_column_int(st, c++) != 0;
    r->ceilings = ardb__col_dup(st, c++, &oom);
    r->stages = ardb__col_dup(st, c++, &oom);
    return oom;
}

/* Every run with its device and counts; ?1 selects one run, or all when 0. */
static int runs_sql(char *sql, size_t size, int64_t version)
{
    return snprintf(sql, size,
                    "SELECT r.id, r.device_id, %s, %s, r.started_at, r.finished_at,"
                    " r.status, r.user, r.host, r.command, r.project_version,"
                    " r.templates_hash, r.compiler, r.driver, r.policy_json,"
                    " r.strategy, d.name, d.backend, d.arch, d.fingerprint,"
                    " r.copy_gbps, r.launch_us, %s,"
                    " (SELECT count(*) FROM measurements m WHERE m.run_id = r.id),"
                    " (SELECT count(*) FROM winners w WHERE w.run_id = r.id),"
                    " COALESCE(%s, 0), %s, %s"
                    " FROM runs r LEFT JOIN devices d ON d.id = r.device_id"
                    " WHERE ?1 = 0 OR r.id = ?1 ORDER BY r.id",
                    ardb__run_uid_expr(version), version >= 2 ? "r.note" : "NULL",
                    ardb__run_read_gbps_expr(version),
                    ardb__device_simulated_expr(version, "d"),
                    version >= 6 ? "r.ceilings" : "NULL", version >= 7 ? "r.stages" : "NULL");
}

/* Runs (one, or all when run_id is 0) into a malloc'ed array. */
static int query_runs(ardb *db, int64_t run_id, ardb_run_info **out,
                      size_t *count)
{
    sqlite3_stmt *st = NULL;
    void *rows = NULL;
    int code, rc;

    if ((code = prepare_versioned(db, runs_sql, &st, "list runs")))
        return code;
    if ((rc = sqlite3_bind_int64(st, 1, run_id)) != SQLITE_OK)
        return ardb__step_fail(db, st, rc, "list runs");
    if ((code = collect_rows(db, st, sizeof **out, read_run, free_runs,
                             "list runs", &rows, count)))
        return code;
    *out = rows;
    return ARDB_DONE;
}

int ardb_run_list(ardb *db, ardb_run_info **out, size_t *count)
{
    if (!db)
        return ARDB_EINVAL;
    if (!out || !count)
        return ardb__fail(db, ARDB_EINVAL, "ardb_run_list: invalid argument");
    *out = NULL;
    *count = 0;
    return query_runs(db, 0, out, count);
}

int ardb_run_get(ardb *db, int64_t run_id, ardb_run_info *out)
{
    ardb_run_info *arr = NULL;
    size_t n = 0;
    int code;
    if (!db)
        return ARDB_EINVAL;
    if (!out || run_id <= 0)
        return ardb__fail(db, ARDB_EINVAL, "ardb_run_get: invalid argument");
    memset(out, 0, sizeof *out);
    if ((code = query_runs(db, run_id, &arr, &n)))
        return code;
    if (n == 0) {
        free(arr);
        return ardb__fail(db, ARDB_ENOTFOUND, "no run with id %" PRId64,
                          run_id);
    }
    *out = arr[0];
    free(arr);
    return ARDB_DONE;
}

/* The runs whose uid starts with ?1, two at the most. */
static int run_uid_prefix_sql(char *sql, size_t size, int64_t version)
{
    return snprintf(sql, size,
                    "SELECT r.id FROM runs r WHERE substr(%s, 1, length(?1)) = ?1"
                    " LIMIT 2",
                    ardb__run_uid_expr(version));
}

int ardb_run_resolve(ardb *db, const char *text, int64_t *run_id)
{
    int64_t v;
    int code, rc;
    const char *p;

    if (!db)
        return ARDB_EINVAL;
    if (!text || !run_id || !*text)
        return ardb__fail(db, ARDB_EINVAL, "a run is an id, 'latest', "
                                           "'latest~K' or a uid prefix");
    for (p = text; isdigit((unsigned char)*p); p++)
        ;
    const int digits = !*p;
    if (digits && p - text <= 18) {
        v = strtoll(text, NULL, 10);
        code = ardb__query_int(db, "SELECT id FROM runs WHERE id = ?1", v, 0,
                               run_id, "find run");
        /* Random uids start with digits only now and then: a number that
         * is no id may still be the start of one. */
        if (code != ARDB_ENOTFOUND || strlen(text) < 4)
            return code == ARDB_ENOTFOUND
                       ? ardb__fail(db, ARDB_ENOTFOUND, "no run with id %s",
                                    text)
                       : code;
    }
    if (!strncmp(text, "latest", 6) && (!text[6] || text[6] == '~')) {
        int64_t back = 0;
        if (text[6] == '~') {
            char *end;
            back = strtoll(text + 7, &end, 10);
            if (!isdigit((unsigned char)text[7]) || *end || back < 0)
                return ardb__fail(db, ARDB_EINVAL,
                                  "'%s': expected latest~K with K a count "
                                  "of runs",
                                  text);
        }
        code = ardb__query_int(db,
                               "SELECT id FROM runs ORDER BY id DESC"
                               " LIMIT 1 OFFSET ?1",
                               back, 0, run_id, "find run");
        if (code == ARDB_ENOTFOUND)
            return ardb__fail(db, ARDB_ENOTFOUND,
                              "'%s': the database does not hold that many "
                              "runs",
                              text);
        return code;
    }
    if (strlen(text) < 4)
        return ardb__fail(db, ARDB_EINVAL,
                          "'%s' is not a run: give an id, 'latest', "
                          "'latest~K' or at least 4 characters of a uid",
                          text);
    {
        sqlite3_stmt *st = NULL;
        int64_t found = 0, matches = 0;
        if ((code = prepare_versioned(db, run_uid_prefix_sql, &st, "find run")))
            return code;
        if ((rc = sqlite3_bind_text(st, 1, text, -1, SQLITE_STATIC)) !=
            SQLITE_OK)
            return ardb__step_fail(db, st, rc, "find run");
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            found = sqlite3_column_int64(st, 0);
            matches++;
        }
        if (rc != SQLITE_DONE)
            return ardb__step_fail(db, st, rc, "find run");
        sqlite3_finalize(st);
        if (matches == 0)
            return ardb__fail(db, ARDB_ENOTFOUND,
                              digits ? "no run with id or uid %s..."
                                     : "no run with uid %s...",
                              text);
        if (matches > 1)
            return ardb__fail(db, ARDB_EINVAL,
                              "'%s' is the start of several run uids", text);
        *run_id = found;
        return ARDB_DONE;
    }
}

int ardb_run_latest_on_device(ardb *db, int64_t device_id, int64_t after_id,
                              int64_t *run_id)
{
    int code;
    if (!db)
        return ARDB_EINVAL;
    if (!run_id)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_run_latest_on_device: invalid argument");
    code = ardb__query_int(
        db,
        "SELECT r.id FROM runs r WHERE r.device_id = ?1 AND r.id > ?2"
        " AND (EXISTS (SELECT 1 FROM winners w WHERE w.run_id = r.id)"
        "  OR EXISTS (SELECT 1 FROM measurements m WHERE m.run_id = r.id))"
        " ORDER BY r.id DESC LIMIT 1",
        device_id, after_id, run_id, "latest run");
    if (code == ARDB_ENOTFOUND)
        return ardb__fail(db, ARDB_ENOTFOUND,
                          "no run after run %" PRId64 " on its device",
                          after_id);
    return code;
}

/* ARDB_DONE where the file's runs can hold ceilings (schema v6 on; a
 * writer's handle is migrated), ENOTFOUND with the reason where not. */
static int ceilings_recorded(ardb *db)
{
    int64_t version = ARDB_SCHEMA_VERSION;
    int code = db->readonly ? ardb__user_version(db, "main", &version) : ARDB_DONE;
    if (code)
        return code;
    if (version < 6)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run recorded its ceilings (schema version %" PRId64 ")",
                          version);
    return ARDB_DONE;
}

int ardb_run_latest_with_ceilings(ardb *db, int64_t device_id, int64_t before_id, int64_t *run_id)
{
    if (!db)
        return ARDB_EINVAL;
    if (!run_id)
        return ardb__fail(db, ARDB_EINVAL, "ardb_run_latest_with_ceilings: invalid argument");
    int code = ceilings_recorded(db);
    if (code)
        return code;
    code = ardb__query_int(db,
                           "SELECT id FROM runs WHERE device_id = ?1 AND id < ?2 AND ceilings IS NOT NULL"
                           " AND copy_gbps IS NOT NULL AND launch_us IS NOT NULL"
                           " AND ceilings NOT LIKE '%\"carried_from_%' ORDER BY id DESC LIMIT 1",
                           device_id, before_id, run_id, "latest run with ceilings");
    if (code == ARDB_ENOTFOUND)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run before run %" PRId64 " measured its device's ceilings",
                          before_id);
    return code;
}

int ardb_run_latest_measured_ceilings(ardb *db, const char *fingerprint, int64_t max_age_s, int64_t *run_id)
{
    static const char sql[] =
        "SELECT r.id FROM runs r JOIN devices d ON d.id = r.device_id"
        " WHERE d.fingerprint = ?1 AND r.ceilings IS NOT NULL"
        " AND r.copy_gbps IS NOT NULL AND r.launch_us IS NOT NULL"
        " AND r.ceilings NOT LIKE '%\"carried_from_%'"
        " AND r.started_at >= strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || ?2 || ' seconds')"
        " ORDER BY r.id DESC LIMIT 1";
    if (!db)
        return ARDB_EINVAL;
    if (!fingerprint || !run_id || max_age_s < 0)
        return ardb__fail(db, ARDB_EINVAL, "ardb_run_latest_measured_ceilings: invalid argument");
    int code = ceilings_recorded(db);
    if (code)
        return code;
    sqlite3_stmt *st = NULL;
    if ((code = ardb__prepare(db, sql, &st, "latest measured ceilings")))
        return code;
    int rc = sqlite3_bind_text(st, 1, fingerprint, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int64(st, 2, max_age_s);
    if (rc != SQLITE_OK)
        return ardb__step_fail(db, st, rc, "latest measured ceilings");
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *run_id = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return ARDB_DONE;
    }
    if (rc != SQLITE_DONE)
        return ardb__step_fail(db, st, rc, "latest measured ceilings");
    sqlite3_finalize(st);
    return ardb__fail(db, ARDB_ENOTFOUND, "no run in the last %" PRId64 " s measured this device's ceilings",
                      max_age_s);
}

int ardb_run_set_note(ardb *db, int64_t run_id, const char *note)
{
    sqlite3_stmt *st = NULL;
    int64_t version = 0;
    int code, rc;
    if (!db)
        return ARDB_EINVAL;
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__user_version(db, "main", &version)))
        return code;
    if (version < 2)
        return ardb__fail(db, ARDB_EINVAL,
                          "run notes need schema version 2 (this file is "
                          "version %" PRId64 ")",
                          version);
    if ((code = ardb__prepare(db, "UPDATE runs SET note = ?1 WHERE id = ?2",
                              &st, "set note")))
        return code;
    rc = note ? sqlite3_bind_text(st, 1, note, -1, SQLITE_STATIC)
              : sqlite3_bind_null(st, 1);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_int64(st, 2, run_id);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
        return ardb__step_fail(db, st, rc, "set note");
    sqlite3_finalize(st);
    if (sqlite3_changes(db->h) == 0)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run with id %" PRId64,
                          run_id);
    return ARDB_DONE;
}

/* ---- comparing two runs ------------------------------------------------- */

void ardb_diff_free(ardb_diff_row *rows, size_t count)
{
    size_t i;
    if (!rows)
        return;
    for (i = 0; i < count; i++) {
        free(rows[i].problem);
        free(rows[i].variant_a);
        free(rows[i].variant_b);
        free(rows[i].status_b);
    }
    free(rows);
}

static void free_diff_rows(void *rows, size_t count)
{
    ardb_diff_free(rows, count);
}

static int read_diff_row(sqlite3_stmt *st, void *elem)
{
    ardb_diff_row *r = elem;
    int oom = 0;
    r->problem_id = sqlite3_column_int64(st, 0);
    r->problem = ardb__col_dup(st, 1, &oom);
    r->winner_a = sqlite3_column_int(st, 2);
    r->winner_b = sqlite3_column_int(st, 3);
    r->tried_a = sqlite3_column_int(st, 4);
    r->tried_b = sqlite3_column_int(st, 5);
    r->variant_a = ardb__col_dup(st, 6, &oom);
    r->variant_b = ardb__col_dup(st, 7, &oom);
    r->us_a = ardb__col_double(st, 8);
    r->us_b = ardb__col_double(st, 9);
    r->spread_a = ardb__col_double(st, 10);
    r->spread_b = ardb__col_double(st, 11);
    r->ceiling_fraction_a = ardb__col_double(st, 12);
    r->ceiling_fraction_b = ardb__col_double(st, 13);
    r->status_b = ardb__col_dup(st, 14, &oom);
    return oom;
}

static int run_exists(ardb *db, int64_t run_id)
{
    int64_t id;
    int code = ardb__query_int(db, "SELECT id FROM runs WHERE id = ?1", run_id,
                               0, &id, "find run");
    if (code == ARDB_ENOTFOUND)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run with id %" PRId64,
                          run_id);
    return code;
}

/* Per run and problem, the fastest winner (a run normally has one device);
 * the problems either run measured or chose a winner for. */
static int diff_runs_sql(char *sql, size_t size, int64_t version)
{
    return snprintf(sql, size,
        "WITH"
        " wa AS (SELECT * FROM (SELECT w.problem_id, c.variant, m.median_us,"
        "  m.spread_us, %1$s AS fraction, row_number() OVER (PARTITION BY"
        "  w.problem_id ORDER BY m.median_us, w.device_id) AS rn"
        "  FROM winners w JOIN measurements m ON m.id = w.measurement_id"
        "  JOIN candidates c ON c.id = w.candidate_id WHERE w.run_id = ?1)"
        "  WHERE rn = 1),"
        " wb AS (SELECT * FROM (SELECT w.problem_id, c.variant, m.median_us,"
        "  m.spread_us, %1$s AS fraction, row_number() OVER (PARTITION BY"
        "  w.problem_id ORDER BY m.median_us, w.device_id) AS rn"
        "  FROM winners w JOIN measurements m ON m.id = w.measurement_id"
        "  JOIN candidates c ON c.id = w.candidate_id WHERE w.run_id = ?2)"
        "  WHERE rn = 1),"
        " ta AS (SELECT problem_id FROM measurements WHERE run_id = ?1"
        "  UNION SELECT problem_id FROM winners WHERE run_id = ?1),"
        " tb AS (SELECT problem_id FROM measurements WHERE run_id = ?2"
        "  UNION SELECT problem_id FROM winners WHERE run_id = ?2),"
        " k AS (SELECT problem_id FROM ta UNION SELECT problem_id FROM tb)"
        " SELECT p.id, p.key, wa.problem_id IS NOT NULL,"
        "  wb.problem_id IS NOT NULL,"
        "  EXISTS (SELECT 1 FROM ta WHERE ta.problem_id = p.id),"
        "  EXISTS (SELECT 1 FROM tb WHERE tb.problem_id = p.id),"
        "  wa.variant, wb.variant, wa.median_us, wb.median_us, wa.spread_us,"
        "  wb.spread_us, wa.fraction, wb.fraction,"
        "  CASE WHEN wb.problem_id IS NULL THEN (SELECT m.status"
        "   FROM measurements m WHERE m.run_id = ?2 AND m.problem_id = p.id"
        "   ORDER BY m.id DESC LIMIT 1) END"
        " FROM k JOIN problems p ON p.id = k.problem_id"
        " LEFT JOIN wa ON wa.problem_id = p.id"
        " LEFT JOIN wb ON wb.problem_id = p.id"
        " ORDER BY " ARDB_PROBLEM_ORDER,
        ardb__ceiling_fraction_expr(version, "m"));
}

int ardb_diff_runs(ardb *db, int64_t run_a, int64_t run_b,
                   ardb_diff_row **rows, size_t *count)
{
    sqlite3_stmt *st = NULL;
    void *arr = NULL;
    int code, rc;

    if (!db)
        return ARDB_EINVAL;
    if (!rows || !count)
        return ardb__fail(db, ARDB_EINVAL, "ardb_diff_runs: invalid argument");
    *rows = NULL;
    *count = 0;
    if ((code = run_exists(db, run_a)) || (code = run_exists(db, run_b)) ||
        (code = prepare_versioned(db, diff_runs_sql, &st, "diff runs")))
        return code;
    if ((rc = sqlite3_bind_int64(st, 1, run_a)) != SQLITE_OK ||
        (rc = sqlite3_bind_int64(st, 2, run_b)) != SQLITE_OK)
        return ardb__step_fail(db, st, rc, "diff runs");
    if ((code = collect_rows(db, st, sizeof **rows, read_diff_row,
                             free_diff_rows, "diff runs", &arr, count)))
        return code;
    *rows = arr;
    return ARDB_DONE;
}

int ardb_diff_beyond_noise(const ardb_diff_row *r)
{
    double sa, sb;
    if (!r || !r->winner_a || !r->winner_b || isnan(r->us_a) || isnan(r->us_b))
        return 0;
    sa = isnan(r->spread_a) || r->spread_a < 0 ? 0 : r->spread_a;
    sb = isnan(r->spread_b) || r->spread_b < 0 ? 0 : r->spread_b;
    return fabs(r->us_b - r->us_a) > ARDB_NOISE_K * (sa + sb);
}

ardb_change ardb_diff_classify(const ardb_diff_row *r, double threshold_pct)
{
    double t = threshold_pct > 0 ? threshold_pct / 100.0 : 0.0;
    if (!r)
        return ARDB_CHANGE_SAME;
    if (r->winner_a && r->winner_b) {
        if (!ardb_diff_beyond_noise(r))
            return ARDB_CHANGE_SAME;
        if (r->us_b > r->us_a && (r->us_a <= 0 || r->us_b / r->us_a - 1.0 >= t))
            return ARDB_CHANGE_SLOWER;
        if (r->us_a > r->us_b && (r->us_b <= 0 || r->us_a / r->us_b - 1.0 >= t))
            return ARDB_CHANGE_FASTER;
        return ARDB_CHANGE_SAME;
    }
    if (r->winner_a)
        return r->tried_b ? ARDB_CHANGE_LOST : ARDB_CHANGE_MISSING;
    if (r->winner_b)
        return ARDB_CHANGE_NEW;
    return ARDB_CHANGE_SAME;
}

const char *ardb_change_name(ardb_change c)
{
    static const char *const names[] = {"same", "slower", "faster",
                                        "lost", "new",    "missing"};
    if ((unsigned)c < sizeof names / sizeof names[0])
        return names[c];
    return "unknown";
}

/* ---- latency history ------------------------------------------------------ */

void ardb_winner_points_free(ardb_winner_point *p, size_t count)
{
    size_t i;
    if (!p)
        return;
    for (i = 0; i < count; i++) {
        free(p[i].problem);
        free(p[i].device);
        free(p[i].variant);
        free(p[i].strategy);
        free(p[i].started_at);
    }
    free(p);
}

/* Every winner with its problem, device, run and timing. The device is
 * named as in the listings: a simulated one says so, so that a chart never
 * passes a simulator's model timings for those of hardware of the same
 * name. */
static void free_winner_points(void *rows, size_t count)
{
    ardb_winner_points_free(rows, count);
}

static int read_winner_point(sqlite3_stmt *st, void *elem)
{
    ardb_winner_point *p = elem;
    int oom = 0;
    p->run_id = sqlite3_column_int64(st, 0);
    p->problem_id = sqlite3_column_int64(st, 1);
    p->device_id = sqlite3_column_int64(st, 2);
    p->problem = ardb__col_dup(st, 3, &oom);
    p->device = ardb__col_dup(st, 4, &oom);
    p->variant = ardb__col_dup(st, 5, &oom);
    p->strategy = ardb__col_dup(st, 6, &oom);
    p->started_at = ardb__col_dup(st, 7, &oom);
    p->median_us = ardb__col_double(st, 8);
    p->spread_us = ardb__col_double(st, 9);
    p->gbps = ardb__col_double(st, 10);
    p->ceiling_fraction = ardb__col_double(st, 11);
    return oom;
}

static int winner_history_sql(char *sql, size_t size, int64_t version)
{
    return snprintf(sql, size,
        "SELECT w.run_id, w.problem_id, w.device_id, p.key,"
        " COALESCE(d.name, d.fingerprint) ||"
        " CASE WHEN %s THEN ' (simulated)' ELSE '' END, c.variant, r.strategy,"
        " r.started_at, m.median_us, m.spread_us, m.gbps, %s"
        " FROM winners w JOIN problems p ON p.id = w.problem_id"
        " JOIN devices d ON d.id = w.device_id"
        " JOIN candidates c ON c.id = w.candidate_id"
        " JOIN measurements m ON m.id = w.measurement_id"
        " JOIN runs r ON r.id = w.run_id"
        " ORDER BY " ARDB_PROBLEM_ORDER ", w.device_id, w.run_id",
        ardb__device_simulated_expr(version, "d"), ardb__ceiling_fraction_expr(version, "m"));
}

int ardb_winner_history(ardb *db, ardb_winner_point **out, size_t *count)
{
    sqlite3_stmt *st = NULL;
    void *rows = NULL;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!out || !count)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_winner_history: invalid argument");
    *out = NULL;
    *count = 0;
    if ((code = prepare_versioned(db, winner_history_sql, &st, "winner history")) ||
        (code = collect_rows(db, st, sizeof **out, read_winner_point,
                             free_winner_points, "winner history", &rows,
                             count)))
        return code;
    *out = rows;
    return ARDB_DONE;
}

/* ---- stored winners (re-validation) ------------------------------------- */

void ardb_stored_winners_free(ardb_stored_winner *w, size_t count)
{
    size_t i;
    if (!w)
        return;
    for (i = 0; i < count; i++) {
        free(w[i].op);
        free(w[i].dtype);
        free(w[i].form);
        free(w[i].problem_key);
        free(w[i].variant);
        free(w[i].template_name);
        free(w[i].kernel_name);
        free(w[i].params_json);
        free(w[i].source);
        free(w[i].source_hash);
        free(w[i].backend);
        free(w[i].disturbance);
    }
    free(w);
}

static void free_stored_winners(void *rows, size_t count)
{
    ardb_stored_winners_free(rows, count);
}

static int read_stored_winner(sqlite3_stmt *st, void *elem)
{
    ardb_stored_winner *w = elem;
    int oom = 0, c = 0;
    w->problem_id = sqlite3_column_int64(st, c++);
    w->candidate_id = sqlite3_column_int64(st, c++);
    w->run_id = sqlite3_column_int64(st, c++);
    w->device_id = sqlite3_column_int64(st, c++);
    w->level = (ardb_level)sqlite3_column_int(st, c++);
    w->op = ardb__col_dup(st, c++, &oom);
    w->dtype = ardb__col_dup(st, c++, &oom);
    w->form = ardb__col_dup(st, c++, &oom);
    w->d = sqlite3_column_int64(st, c++);
    w->t_bucket = sqlite3_column_int64(st, c++);
    w->n = sqlite3_column_int(st, c++);
    w->heads = sqlite3_column_int(st, c++);
    w->epilogue = sqlite3_column_int(st, c++);
    w->s = sqlite3_column_int(st, c++);
    w->problem_key = ardb__col_dup(st, c++, &oom);
    w->variant = ardb__col_dup(st, c++, &oom);
    w->template_name = ardb__col_dup(st, c++, &oom);
    w->kernel_name = ardb__col_dup(st, c++, &oom);
    w->params_json = ardb__col_dup(st, c++, &oom);
    w->source = ardb__col_dup(st, c++, &oom);
    w->source_hash = ardb__col_dup(st, c++, &oom);
    w->backend = ardb__col_dup(st, c++, &oom);
    w->median_us = ardb__col_double(st, c++);
    w->spread_us = ardb__col_double(st, c++);
    w->measurement_id = sqlite3_column_int64(st, c++);
    w->provisional = sqlite3_column_int(st, c++) != 0;
    w->disturbance = w->provisional ? ardb__col_dup(st, c, &oom) : NULL;
    return oom;
}

/* Per problem, the winner a device would be served (?1 its fingerprint, ?2
 * its backend, ?3 its arch, ?4 whether it is simulated). As
 * ardb_winners_lookup: only devices of the same kind (simulated or real:
 * the last conversion) count, at every level. A file older than v9 has no
 * provisional winner. */
static int stored_winners_sql(char *sql, size_t size, int64_t version)
{
#define LEVEL_EXPR                                                            \
    "CASE WHEN d.fingerprint = ?1 THEN 0 WHEN d.arch = ?3 THEN 1 ELSE 2 END"
    return snprintf(sql, size,
        "SELECT problem_id, candidate_id, run_id, device_id, lvl, op, dtype,"
        " form, d, t_bucket, n, heads, epilogue, s, key, variant,"
        " template_name, kernel_name, params_json, source, source_hash,"
        " backend, median_us, spread_us, measurement_id, provisional,"
        " disturbance FROM ("
        "  SELECT w.problem_id, w.candidate_id, w.run_id, w.device_id,"
        "   " LEVEL_EXPR " AS lvl, p.op, p.dtype, p.form, p.d, p.t_bucket,"
        "   p.n, p.heads, p.epilogue, p.s, p.key, c.variant, c.template_name,"
        "   c.kernel_name, c.params_json, c.source, c.source_hash, c.backend,"
        "   m.median_us, m.spread_us, w.measurement_id,"
        "   %s AS provisional, %s AS disturbance,"
        "   row_number() OVER (PARTITION BY w.problem_id ORDER BY " LEVEL_EXPR
        ",    w.run_id DESC, m.median_us) AS rn"
        "  FROM winners w JOIN devices d ON d.id = w.device_id"
        "  JOIN problems p ON p.id = w.problem_id"
        "  JOIN candidates c ON c.id = w.candidate_id"
        "  JOIN measurements m ON m.id = w.measurement_id"
        "  WHERE d.backend = ?2 AND %s = ?4"
        " ) AS x WHERE rn = 1"
        " ORDER BY op, dtype, d, n, heads, form, epilogue, s, t_bucket",
        version >= 9 ? "w.provisional" : "0",
        version >= 9 ? "w.disturbance" : "NULL",
        ardb__device_simulated_expr(version, "d"));
#undef LEVEL_EXPR
}

int ardb_stored_winners(ardb *db, const ardb_device *dev,
                        ardb_stored_winner **out, size_t *count)
{
    sqlite3_stmt *st = NULL;
    void *rows = NULL;
    int code, rc;

    if (!db)
        return ARDB_EINVAL;
    if (!out || !count || !dev || !dev->backend || !dev->fingerprint)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_stored_winners: a device with backend and "
                          "fingerprint is required");
    *out = NULL;
    *count = 0;
    if ((code = prepare_versioned(db, stored_winners_sql, &st, "stored winners")))
        return code;
    if ((rc = sqlite3_bind_text(st, 1, dev->fingerprint, -1, SQLITE_STATIC)) !=
            SQLITE_OK ||
        (rc = sqlite3_bind_text(st, 2, dev->backend, -1, SQLITE_STATIC)) !=
            SQLITE_OK ||
        (rc = dev->arch ? sqlite3_bind_text(st, 3, dev->arch, -1, SQLITE_STATIC)
                        : sqlite3_bind_null(st, 3)) != SQLITE_OK ||
        (rc = sqlite3_bind_int(st, 4, dev->simulated ? 1 : 0)) != SQLITE_OK)
        return ardb__step_fail(db, st, rc, "stored winners");
    if ((code = collect_rows(db, st, sizeof **out, read_stored_winner,
                             free_stored_winners, "stored winners", &rows,
                             count)))
        return code;
    *out = rows;
    return ARDB_DONE;
}

/* ---- the finalists of a stored winner (re-decision) ---------------------- */

void ardb_stored_finalists_free(ardb_stored_finalist *f, size_t count)
{
    size_t i;
    if (!f)
        return;
    for (i = 0; i < count; i++) {
        free(f[i].variant);
        free(f[i].template_name);
        free(f[i].kernel_name);
        free(f[i].params_json);
        free(f[i].source);
        free(f[i].source_hash);
    }
    free(f);
}

static void free_stored_finalists(void *rows, size_t count)
{
    ardb_stored_finalists_free(rows, count);
}

static int read_stored_finalist(sqlite3_stmt *st, void *elem)
{
    ardb_stored_finalist *f = elem;
    int oom = 0;
    f->candidate_id = sqlite3_column_int64(st, 0);
    f->measurement_id = sqlite3_column_int64(st, 1);
    f->variant = ardb__col_dup(st, 2, &oom);
    f->template_name = ardb__col_dup(st, 3, &oom);
    f->kernel_name = ardb__col_dup(st, 4, &oom);
    f->params_json = ardb__col_dup(st, 5, &oom);
    f->source = ardb__col_dup(st, 6, &oom);
    f->source_hash = ardb__col_dup(st, 7, &oom);
    f->median_us = ardb__col_double(st, 8);
    f->spread_us = ardb__col_double(st, 9);
    return oom;
}

/* The finalists of the final round that chose the winner measured as ?1.
 * That round times each finalist once a run; the newest of a candidate is
 * taken all the same, so that a file where one was timed twice still lists
 * it once. */
static int stored_finalists_sql(char *sql, size_t size, int64_t version)
{
    return snprintf(sql, size,
        "SELECT candidate_id, id, variant, template_name, kernel_name,"
        " params_json, source, source_hash, median_us, spread_us FROM ("
        "  SELECT c.id AS candidate_id, m.id AS id, c.variant AS variant,"
        "   c.template_name AS template_name, c.kernel_name AS kernel_name,"
        "   c.params_json AS params_json, c.source AS source,"
        "   c.source_hash AS source_hash, m.median_us AS median_us,"
        "   m.spread_us AS spread_us,"
        "   row_number() OVER (PARTITION BY m.candidate_id"
        "    ORDER BY m.id DESC) AS rn"
        "  FROM measurements won"
        "  JOIN measurements m ON m.run_id = won.run_id"
        "   AND m.problem_id = won.problem_id AND m.device_id = won.device_id"
        "  JOIN candidates c ON c.id = m.candidate_id"
        "  WHERE won.id = ?1 AND m.status = 'ok' AND %s"
        " ) WHERE rn = 1 ORDER BY median_us, variant, candidate_id",
        ardb__final_round_expr(version));
}

int ardb_stored_finalists(ardb *db, int64_t measurement_id,
                          ardb_stored_finalist **out, size_t *count)
{
    sqlite3_stmt *st = NULL;
    void *rows = NULL;
    int code, rc;

    if (!db)
        return ARDB_EINVAL;
    if (!out || !count)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_stored_finalists: invalid argument");
    *out = NULL;
    *count = 0;
    if ((code = prepare_versioned(db, stored_finalists_sql, &st, "stored finalists")))
        return code;
    if ((rc = sqlite3_bind_int64(st, 1, measurement_id)) != SQLITE_OK)
        return ardb__step_fail(db, st, rc, "stored finalists");
    if ((code = collect_rows(db, st, sizeof **out, read_stored_finalist,
                             free_stored_finalists, "stored finalists", &rows,
                             count)))
        return code;
    *out = rows;
    return ARDB_DONE;
}

/* ---- meta ------------------------------------------------------------------ */

int ardb_meta_get(ardb *db, const char *key, char **value)
{
    sqlite3_stmt *st = NULL;
    int code, rc, oom = 0;
    if (!db)
        return ARDB_EINVAL;
    if (!key || !value)
        return ardb__fail(db, ARDB_EINVAL, "ardb_meta_get: invalid argument");
    *value = NULL;
    if ((code = ardb__prepare(db, "SELECT value FROM attnres_meta WHERE key = ?1",
                              &st, "read meta")))
        return code;
    if ((rc = sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC)) != SQLITE_OK)
        return ardb__step_fail(db, st, rc, "read meta");
    rc = sqlite3_step(st);
    if (rc == SQLITE_DONE) {
        sqlite3_finalize(st);
        return ardb__fail(db, ARDB_ENOTFOUND, "no meta value '%s'", key);
    }
    if (rc != SQLITE_ROW)
        return ardb__step_fail(db, st, rc, "read meta");
    *value = ardb__col_dup(st, 0, &oom);
    if (!*value && !oom)
        *value = calloc(1, 1);
    sqlite3_finalize(st);
    if (!*value)
        return ardb__fail(db, ARDB_ENOMEM, "read meta: out of memory");
    return ARDB_DONE;
}
