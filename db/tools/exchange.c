/*
 * exchange.c - moving history between databases and out to other tools:
 * JSON and CSV export, JSON import, and the merge of database files.
 *
 * Merge and import share one path: the source is attached to the
 * destination's connection as schema "ardb_src" (the source file itself,
 * or a private temporary database that the import fills from JSON), and
 * SQL copies what the destination lacks, re-mapping ids through temporary
 * tables. Identity across databases: devices by fingerprint and whether
 * they are simulated (schema v4; older files hold only real ones), problems by
 * key, candidates by (variant, source_hash), binaries by build key, runs by
 * uid, measurements by (run, candidate, problem, device, build key, status,
 * time), winners by (run, problem, device).
 *
 * Library code: never prints; exports go through the caller's writer.
 */
#define _GNU_SOURCE /* realpath */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ardb_tools.h"
#include "json.h"
#include "migrate.h"
#include "query.h"

#define EXPORT_FORMAT "attnres-export"
#define EXPORT_VERSION 1

/* A measurement or winner row (alias t) joined to the run, problem,
 * candidate and device it names; the JSON and CSV exports read both. */
#define KEY_JOINS(t)                                                   \
    " JOIN runs r ON r.id = " t ".run_id"                              \
    " JOIN problems p ON p.id = " t ".problem_id"                      \
    " JOIN candidates c ON c.id = " t ".candidate_id"                  \
    " JOIN devices d ON d.id = " t ".device_id"

/* ---- writing ---------------------------------------------------------------- */

typedef struct writer {
    ardb *db;
    ardb_write_fn fn;
    void *ctx;
    int failed;
} writer;

/* The output's writer failed; errno, where it set one, says why (a full
 * disk, a file-size limit). */
static int write_failed(writer *w, int why)
{
    ardb__fail(w->db, ARDB_ESQL, "export: writing the output failed%s%s", why > 0 ? ": " : "",
               why > 0 ? strerror(why) : "");
    return -1;
}

static int w_raw(writer *w, const char *s, size_t n)
{
    if (w->failed)
        return -1;
    errno = 0;
    if (n && w->fn(w->ctx, s, n) != 0) {
        w->failed = 1;
        return write_failed(w, errno);
    }
    return 0;
}

static int w_str(writer *w, const char *s) { return w_raw(w, s, strlen(s)); }

static int w_json_string(writer *w, const char *s, size_t n)
{
    if (w->failed)
        return -1;
    errno = 0;
    if (ardb__json_write_string((ardb_json_out)w->fn, w->ctx, s, n) != 0) {
        w->failed = 1;
        return write_failed(w, errno);
    }
    return 0;
}

int ardb_json_string(ardb_write_fn fn, void *ctx, const char *s, size_t n)
{
    if (!fn || (!s && n))
        return -1;
    return ardb__json_write_string((ardb_json_out)fn, ctx, s ? s : "", n);
}

/* One column of the current row as a JSON value. */
static int w_json_column(writer *w, sqlite3_stmt *st, int i)
{
    char num[64];
    switch (sqlite3_column_type(st, i)) {
    case SQLITE_NULL:
        return w_str(w, "null");
    case SQLITE_INTEGER:
        snprintf(num, sizeof num, "%lld", (long long)sqlite3_column_int64(st, i));
        return w_str(w, num);
    case SQLITE_FLOAT: {
        double v = sqlite3_column_double(st, i);
        if (!isfinite(v))
            return w_str(w, "null");
        snprintf(num, sizeof num, "%.17g", v);
        return w_str(w, num);
    }
    default: {
        const char *t = (const char *)sqlite3_column_text(st, i);
        if (!t) {
            ardb__fail(w->db, ARDB_ENOMEM, "export: out of memory");
            w->failed = 1;
            return -1;
        }
        return w_json_string(w, t, (size_t)sqlite3_column_bytes(st, i));
    }
    }
}

/* Writes "name": [ one object per row, members named by the columns ]. */
static int export_section(writer *w, const char *name, const char *sql,
                          int last)
{
    sqlite3_stmt *st = NULL;
    int code, rc, ncol, i, first = 1;
    if ((code = ardb__prepare(w->db, sql, &st, "export")))
        return code;
    ncol = sqlite3_column_count(st);
    w_str(w, "\"");
    w_str(w, name);
    w_str(w, "\": [");
    while ((rc = sqlite3_step(st)) == SQLITE_ROW && !w->failed) {
        w_str(w, first ? "\n{" : ",\n{");
        first = 0;
        for (i = 0; i < ncol; i++) {
            const char *cn = sqlite3_column_name(st, i);
            if (i)
                w_str(w, ", ");
            w_json_string(w, cn ? cn : "?", cn ? strlen(cn) : 1);
            w_str(w, ": ");
            w_json_column(w, st, i);
        }
        w_str(w, "}");
    }
    if (w->failed) {
        sqlite3_finalize(st);
        return ARDB_ESQL; /* the message is set */
    }
    if (rc != SQLITE_DONE)
        return ardb__step_fail(w->db, st, rc, "export");
    sqlite3_finalize(st);
    w_str(w, first ? "]" : "\n]");
    w_str(w, last ? "\n" : ",\n");
    return w->failed ? ARDB_ESQL : ARDB_DONE;
}

int ardb_export_json(ardb *db, unsigned flags, ardb_write_fn fn, void *ctx)
{
    char sql[5][2048], head[256];
    int64_t version = 0;
    const char *uid, *sim;
    writer w = {db, fn, ctx, 0};
    int code, own;

    if (!db)
        return ARDB_EINVAL;
    if (!fn || (flags & ~ARDB_EXPORT_NO_SOURCE))
        return ardb__fail(db, ARDB_EINVAL, "ardb_export_json: invalid argument");
    if ((code = ardb__user_version(db, "main", &version)))
        return code;
    uid = ardb__run_uid_expr(version);
    /* Whether a device is simulated goes with the device and with every
     * reference to one, since a fingerprint alone no longer names a device
     * (schema v4). A file older than v4 has only real devices. */
    sim = ardb__device_simulated_expr(version, "d");
    snprintf(sql[0], sizeof sql[0],
             "SELECT variant, source_hash, backend, template_name AS template,"
             " params_json, kernel_name, %s AS source, created_at"
             " FROM candidates ORDER BY id",
             (flags & ARDB_EXPORT_NO_SOURCE) ? "NULL" : "source");
    snprintf(sql[1], sizeof sql[1],
             "SELECT %s AS uid, r.id AS id, r.started_at AS started_at,"
             " r.finished_at AS finished_at, r.status AS status,"
             " r.user AS user, r.host AS host, r.command AS command,"
             " r.project_version AS project_version,"
             " r.templates_hash AS templates_hash, r.compiler AS compiler,"
             " r.driver AS driver, d.fingerprint AS device,"
             " CASE WHEN d.id IS NULL THEN NULL ELSE %s END"
             " AS device_simulated,"
             " r.policy_json AS policy_json, r.strategy AS strategy,"
             " r.copy_gbps AS copy_gbps, r.launch_us AS launch_us,"
             " %s AS read_gbps, %s AS note, %s AS ceilings, %s AS stages"
             " FROM runs r LEFT JOIN devices d ON d.id = r.device_id"
             " ORDER BY r.id",
             uid, sim, ardb__run_read_gbps_expr(version),
             version >= 2 ? "r.note" : "NULL",
             version >= 6 ? "r.ceilings" : "NULL",
             version >= 7 ? "r.stages" : "NULL");
    snprintf(sql[2], sizeof sql[2],
             "SELECT m.id AS id, %s AS run, p.key AS problem,"
             " c.variant AS variant, c.source_hash AS source_hash,"
             " d.fingerprint AS device, %s AS device_simulated,"
             " m.build_key AS build_key,"
             " m.status AS status, m.median_us AS median_us,"
             " m.min_us AS min_us, m.max_us AS max_us,"
             " m.spread_us AS spread_us, m.reps AS reps, m.gbps AS gbps,"
             " %s AS ceiling_fraction, m.rel_err AS rel_err,"
             " m.message AS message, %s AS final_round,"
             " m.created_at AS created_at"
             " FROM measurements m" KEY_JOINS("m") " ORDER BY m.id",
             uid, sim, ardb__ceiling_fraction_expr(version, "m"), ardb__final_round_expr(version));
    snprintf(sql[3], sizeof sql[3],
             "SELECT %s AS run, p.key AS problem, d.fingerprint AS device,"
             " %s AS device_simulated,"
             " c.variant AS variant, c.source_hash AS source_hash,"
             " w.measurement_id AS measurement, w.created_at AS created_at,"
             " %s AS provisional, %s AS disturbance"
             " FROM winners w" KEY_JOINS("w")
             " ORDER BY w.run_id, " ARDB_PROBLEM_ORDER ", w.device_id",
             uid, sim, version >= 9 ? "w.provisional" : "0",
             version >= 9 ? "w.disturbance" : "NULL");
    snprintf(sql[4], sizeof sql[4],
             "SELECT d.fingerprint AS fingerprint, d.backend AS backend,"
             " d.name AS name, d.arch AS arch, d.units AS units,"
             " d.memory AS memory, d.driver AS driver,"
             " d.created_at AS created_at, %s AS simulated"
             " FROM devices d ORDER BY d.id",
             sim);
    /* One read transaction: the sections are one consistent snapshot
     * (inside the caller's transaction when one is open). */
    own = sqlite3_get_autocommit(db->h);
    if (own && (code = ardb__exec(db, "BEGIN DEFERRED", "export")))
        return code;
    snprintf(head, sizeof head,
             "{\"format\": \"" EXPORT_FORMAT "\", \"version\": %d, "
             "\"schema_version\": %" PRId64 ",\n",
             EXPORT_VERSION, version);
    w_str(&w, head);
    if (w.failed)
        code = ARDB_ESQL;
    if (!code)
        code = export_section(&w, "devices", sql[4], 0);
    if (!code)
        code = export_section(
            &w, "problems",
            "SELECT key, op, dtype, form, d, n, heads, epilogue, s, t_bucket"
            " FROM problems p ORDER BY " ARDB_PROBLEM_ORDER,
            0);
    if (!code)
        code = export_section(&w, "candidates", sql[0], 0);
    if (!code)
        code = export_section(&w, "runs", sql[1], 0);
    if (!code)
        code = export_section(&w, "measurements", sql[2], 0);
    if (!code)
        code = export_section(&w, "winners", sql[3], 1);
    if (!code && w_str(&w, "}\n"))
        code = ARDB_ESQL;
    if (own)
        (void)sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL);
    return code;
}

/* ---- CSV ------------------------------------------------------------------- */

static int w_csv_field(writer *w, const char *s, size_t n)
{
    size_t i, start = 0;
    if (!memchr(s, ',', n) && !memchr(s, '"', n) && !memchr(s, '\n', n) &&
        !memchr(s, '\r', n))
        return w_raw(w, s, n);
    w_raw(w, "\"", 1);
    for (i = 0; i < n; i++)
        if (s[i] == '"') {
            w_raw(w, s + start, i + 1 - start); /* through the quote */
            w_raw(w, "\"", 1);
            start = i + 1;
        }
    w_raw(w, s + start, n - start);
    return w_raw(w, "\"", 1);
}

int ardb_export_csv(ardb *db, ardb_csv_table table, ardb_write_fn fn,
                    void *ctx)
{
    char sql[4096];
    int64_t version = 0;
    const char *uid, *sim;
    sqlite3_stmt *st = NULL;
    writer w = {db, fn, ctx, 0};
    int code, rc, ncol, i;

    if (!db)
        return ARDB_EINVAL;
    if (!fn || (unsigned)table > ARDB_CSV_RUNS)
        return ardb__fail(db, ARDB_EINVAL, "ardb_export_csv: invalid argument");
    if ((code = ardb__user_version(db, "main", &version)))
        return code;
    uid = ardb__run_uid_expr(version);
    sim = ardb__device_simulated_expr(version, "d");
#define RUN_COLUMNS                                                           \
    " r.started_at AS run_started_at, r.status AS run_status,"               \
    " r.strategy AS run_strategy, r.project_version AS project_version,"     \
    " r.templates_hash AS templates_hash, r.compiler AS compiler,"           \
    " r.driver AS driver,"
#define PROBLEM_COLUMNS                                                       \
    " p.key AS problem, p.op AS op, p.dtype AS dtype, p.d AS d, p.n AS n,"   \
    " p.heads AS heads, p.form AS form, p.epilogue AS epilogue, p.s AS s,"   \
    " p.t_bucket AS t_bucket,"
    switch (table) {
    case ARDB_CSV_MEASUREMENTS:
        snprintf(sql, sizeof sql,
                 "SELECT m.id AS measurement_id, r.id AS run_id, %s AS run_uid,"
                 RUN_COLUMNS
                 " d.fingerprint AS device_fingerprint, d.name AS device_name,"
                 " %s AS device_simulated,"
                 PROBLEM_COLUMNS
                 " c.template_name AS template, c.variant AS variant,"
                 " c.source_hash AS source_hash, m.build_key AS build_key,"
                 " m.status AS status, m.median_us AS median_us,"
                 " m.min_us AS min_us, m.max_us AS max_us,"
                 " m.spread_us AS spread_us, m.reps AS reps, m.gbps AS gbps,"
                 " %s AS ceiling_fraction, m.rel_err AS rel_err,"
                 " EXISTS (SELECT 1 FROM winners w WHERE w.run_id = m.run_id"
                 "  AND w.measurement_id = m.id) AS is_winner,"
                 " %s AS final_round,"
                 " m.message AS message, m.created_at AS created_at"
                 " FROM measurements m" KEY_JOINS("m") " ORDER BY m.id",
                 uid, sim, ardb__ceiling_fraction_expr(version, "m"), ardb__final_round_expr(version));
        break;
    case ARDB_CSV_WINNERS:
        snprintf(sql, sizeof sql,
                 "SELECT r.id AS run_id, %s AS run_uid," RUN_COLUMNS
                 " d.fingerprint AS device_fingerprint, d.name AS device_name,"
                 " %s AS device_simulated,"
                 PROBLEM_COLUMNS
                 " c.template_name AS template, c.variant AS variant,"
                 " m.median_us AS median_us, m.spread_us AS spread_us,"
                 " m.gbps AS gbps, %s AS ceiling_fraction,"
                 " m.run_id AS measured_in_run,"
                 " %s AS provisional, %s AS disturbance"
                 " FROM winners w" KEY_JOINS("w")
                 " JOIN measurements m ON m.id = w.measurement_id"
                 " ORDER BY w.run_id, " ARDB_PROBLEM_ORDER ", w.device_id",
                 uid, sim, ardb__ceiling_fraction_expr(version, "m"), version >= 9 ? "w.provisional" : "0",
                 version >= 9 ? "w.disturbance" : "NULL");
        break;
    default:
        snprintf(sql, sizeof sql,
                 "SELECT r.id AS run_id, %s AS run_uid, r.started_at AS"
                 " started_at, r.finished_at AS finished_at, r.status AS"
                 " status, r.user AS user, r.host AS host, r.command AS"
                 " command, r.project_version AS project_version,"
                 " r.templates_hash AS templates_hash, r.compiler AS compiler,"
                 " r.driver AS driver, d.fingerprint AS device_fingerprint,"
                 " d.name AS device_name,"
                 " CASE WHEN d.id IS NULL THEN NULL ELSE %s END"
                 " AS device_simulated, r.policy_json AS policy_json,"
                 " r.strategy AS strategy, r.copy_gbps AS copy_gbps,"
                 " r.launch_us AS launch_us, %s AS note,"
                 " %s AS read_gbps"
                 " FROM runs r LEFT JOIN devices d ON d.id = r.device_id"
                 " ORDER BY r.id",
                 uid, sim, version >= 2 ? "r.note" : "NULL",
                 ardb__run_read_gbps_expr(version));
        break;
    }
#undef RUN_COLUMNS
#undef PROBLEM_COLUMNS
    if ((code = ardb__prepare(db, sql, &st, "export csv")))
        return code;
    ncol = sqlite3_column_count(st);
    for (i = 0; i < ncol; i++) {
        const char *cn = sqlite3_column_name(st, i);
        if (i)
            w_raw(&w, ",", 1);
        w_csv_field(&w, cn ? cn : "?", cn ? strlen(cn) : 1);
    }
    w_raw(&w, "\r\n", 2);
    while (!w.failed && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        for (i = 0; i < ncol; i++) {
            if (i)
                w_raw(&w, ",", 1);
            if (sqlite3_column_type(st, i) == SQLITE_FLOAT) {
                char num[64];
                double v = sqlite3_column_double(st, i);
                if (isfinite(v)) {
                    snprintf(num, sizeof num, "%.17g", v);
                    w_raw(&w, num, strlen(num));
                }
            } else if (sqlite3_column_type(st, i) != SQLITE_NULL) {
                const char *t = (const char *)sqlite3_column_text(st, i);
                if (t)
                    w_csv_field(&w, t, (size_t)sqlite3_column_bytes(st, i));
            }
        }
        w_raw(&w, "\r\n", 2);
    }
    if (w.failed) {
        sqlite3_finalize(st);
        return ARDB_ESQL;
    }
    if (rc != SQLITE_DONE)
        return ardb__step_fail(db, st, rc, "export csv");
    sqlite3_finalize(st);
    return ARDB_DONE;
}

/* ---- merging from the attached schema "ardb_src" --------------------------- */

static const char *const main_tables[] = {
    "devices", "problems", "candidates", "binaries", "runs", "measurements",
    "winners"};
#define N_TABLES (sizeof main_tables / sizeof main_tables[0])

static int count_rows(ardb *db, int64_t counts[N_TABLES])
{
    size_t i;
    for (i = 0; i < N_TABLES; i++) {
        char sql[96];
        int code;
        snprintf(sql, sizeof sql, "SELECT count(*) FROM main.%s",
                 main_tables[i]);
        if ((code = ardb__query_int(db, sql, 0, 0, &counts[i], "merge")))
            return code;
    }
    return ARDB_DONE;
}

static const char drop_maps[] =
    "DROP TABLE IF EXISTS temp.ardb_map_device;"
    "DROP TABLE IF EXISTS temp.ardb_map_problem;"
    "DROP TABLE IF EXISTS temp.ardb_map_candidate;"
    "DROP TABLE IF EXISTS temp.ardb_map_run;"
    "DROP TABLE IF EXISTS temp.ardb_map_meas;";

/* The statements of a merge, in order. A step that names the source runs
 * (alias r) has %1$s for their uid expression, %2$s for their note, %3$s
 * for their read bandwidth, %4$s and %5$s for their ceilings and stages; a
 * step that names the source devices (alias s) has %1$s for whether each is
 * simulated; the one that copies the source measurements (alias s) has
 * %1$s for whether each is of a final round; the one that copies the
 * source winners (alias s) has %1$s and %2$s for whether each is
 * provisional and its evidence; the others have no conversions. */
static const char *const merge_steps[] = {
    /* Devices, problems, candidates, binaries: by their natural keys. A
     * device is (fingerprint, simulated): a simulated device never merges
     * into a real one with its fingerprint. */
    "INSERT INTO main.devices(backend, name, arch, units, memory, driver,"
    " fingerprint, simulated, created_at)"
    " SELECT s.backend, s.name, s.arch, s.units, s.memory, s.driver,"
    " s.fingerprint, %1$s, s.created_at FROM ardb_src.devices s"
    " WHERE true ORDER BY s.id"
    " ON CONFLICT(fingerprint, simulated) DO NOTHING",
    "CREATE TEMP TABLE ardb_map_device AS SELECT s.id AS src, d.id AS dst"
    " FROM ardb_src.devices s JOIN main.devices d"
    " ON d.fingerprint = s.fingerprint AND d.simulated = %1$s",
    "INSERT INTO main.problems(key, op, dtype, form, d, n, heads, epilogue,"
    " s, t_bucket)"
    " SELECT key, op, dtype, form, d, n, heads, epilogue, s, t_bucket"
    " FROM ardb_src.problems WHERE true ORDER BY id"
    " ON CONFLICT(key) DO NOTHING",
    "CREATE TEMP TABLE ardb_map_problem AS SELECT s.id AS src, p.id AS dst"
    " FROM ardb_src.problems s JOIN main.problems p ON p.key = s.key",
    /* A candidate known without its source (an export made without
     * sources) gets the source when the other side has it. */
    "INSERT INTO main.candidates(backend, template_name, variant,"
    " params_json, source_hash, source, kernel_name, created_at)"
    " SELECT backend, template_name, variant, params_json, source_hash,"
    " source, kernel_name, created_at FROM ardb_src.candidates"
    " WHERE true ORDER BY id"
    " ON CONFLICT(variant, source_hash) DO UPDATE SET source = excluded.source"
    " WHERE candidates.source IS NULL AND excluded.source IS NOT NULL",
    "CREATE TEMP TABLE ardb_map_candidate AS SELECT s.id AS src, c.id AS dst"
    " FROM ardb_src.candidates s JOIN main.candidates c"
    " ON c.variant = s.variant AND c.source_hash = s.source_hash",
    "INSERT INTO main.binaries(build_key, candidate_id, compiler, options,"
    " target, blob, resources_json, created_at)"
    " SELECT s.build_key, mc.dst, s.compiler, s.options, s.target, s.blob,"
    " s.resources_json, s.created_at FROM ardb_src.binaries s"
    " LEFT JOIN temp.ardb_map_candidate mc ON mc.src = s.candidate_id"
    " WHERE true ORDER BY s.rowid ON CONFLICT(build_key) DO NOTHING",
    /* Runs by uid, in the source's order. */
    "INSERT INTO main.runs(started_at, finished_at, status, user, host,"
    " command, project_version, templates_hash, compiler, driver, device_id,"
    " policy_json, strategy, copy_gbps, launch_us, uid, note, read_gbps,"
    " ceilings, stages)"
    " SELECT r.started_at, r.finished_at, r.status, r.user, r.host,"
    " r.command, r.project_version, r.templates_hash, r.compiler, r.driver,"
    " md.dst, r.policy_json, r.strategy, r.copy_gbps, r.launch_us, %1$s, %2$s,"
    " %3$s, %4$s, %5$s"
    " FROM ardb_src.runs r LEFT JOIN temp.ardb_map_device md"
    " ON md.src = r.device_id"
    " WHERE NOT EXISTS (SELECT 1 FROM main.runs x WHERE x.uid = %1$s)"
    " ORDER BY r.id",
    "CREATE TEMP TABLE ardb_map_run AS SELECT r.id AS src, x.id AS dst,"
    " r.status AS status, r.finished_at AS finished_at"
    " FROM ardb_src.runs r JOIN main.runs x ON x.uid = %1$s",
    /* A run copied while it was still running gets its end. */
    "UPDATE main.runs SET status = (SELECT m.status FROM temp.ardb_map_run m"
    "  WHERE m.dst = runs.id),"
    " finished_at = (SELECT m.finished_at FROM temp.ardb_map_run m"
    "  WHERE m.dst = runs.id)"
    " WHERE status = 'running' AND id IN (SELECT dst FROM temp.ardb_map_run"
    "  WHERE status <> 'running')",
    /* Measurements: those the destination already holds are found, the
     * others copied, in the source's order. */
    "CREATE TEMP TABLE ardb_map_meas(src INTEGER PRIMARY KEY, dst INTEGER,"
    " run INTEGER, cand INTEGER, prob INTEGER, dev INTEGER)",
    "INSERT INTO temp.ardb_map_meas(src, run, cand, prob, dev)"
    " SELECT s.id, mr.dst, mc.dst, mp.dst, md.dst"
    " FROM ardb_src.measurements s"
    " JOIN temp.ardb_map_run mr ON mr.src = s.run_id"
    " JOIN temp.ardb_map_candidate mc ON mc.src = s.candidate_id"
    " JOIN temp.ardb_map_problem mp ON mp.src = s.problem_id"
    " JOIN temp.ardb_map_device md ON md.src = s.device_id",
    "UPDATE temp.ardb_map_meas SET dst = (SELECT min(m.id)"
    " FROM ardb_src.measurements s, main.measurements m"
    " WHERE s.id = ardb_map_meas.src AND m.candidate_id = ardb_map_meas.cand"
    " AND m.problem_id = ardb_map_meas.prob AND m.device_id = ardb_map_meas.dev"
    " AND m.build_key IS s.build_key AND m.run_id = ardb_map_meas.run"
    " AND m.status = s.status AND m.created_at = s.created_at)",
    "INSERT INTO main.measurements(run_id, candidate_id, problem_id,"
    " device_id, build_key, status, median_us, min_us, max_us, spread_us,"
    " reps, gbps, ceiling_fraction, rel_err, message, final_round, created_at)"
    " SELECT mm.run, mm.cand, mm.prob, mm.dev, s.build_key, s.status,"
    " s.median_us, s.min_us, s.max_us, s.spread_us, s.reps, s.gbps,"
    " %2$s, s.rel_err, s.message, %1$s, s.created_at"
    " FROM temp.ardb_map_meas mm JOIN ardb_src.measurements s"
    " ON s.id = mm.src WHERE mm.dst IS NULL ORDER BY s.id",
    "UPDATE temp.ardb_map_meas SET dst = (SELECT min(m.id)"
    " FROM ardb_src.measurements s, main.measurements m"
    " WHERE s.id = ardb_map_meas.src AND m.candidate_id = ardb_map_meas.cand"
    " AND m.problem_id = ardb_map_meas.prob AND m.device_id = ardb_map_meas.dev"
    " AND m.build_key IS s.build_key AND m.run_id = ardb_map_meas.run"
    " AND m.status = s.status AND m.created_at = s.created_at)"
    " WHERE dst IS NULL",
    /* Winners: one per (run, problem, device); one already there stays. */
    "INSERT INTO main.winners(run_id, problem_id, device_id, candidate_id,"
    " measurement_id, created_at, provisional, disturbance)"
    " SELECT mr.dst, mp.dst, md.dst, mc.dst, mm.dst, s.created_at, %1$s, %2$s"
    " FROM ardb_src.winners s"
    " JOIN temp.ardb_map_run mr ON mr.src = s.run_id"
    " JOIN temp.ardb_map_problem mp ON mp.src = s.problem_id"
    " JOIN temp.ardb_map_device md ON md.src = s.device_id"
    " JOIN temp.ardb_map_candidate mc ON mc.src = s.candidate_id"
    " JOIN temp.ardb_map_meas mm ON mm.src = s.measurement_id"
    " WHERE mm.dst IS NOT NULL ORDER BY s.run_id, s.problem_id"
    " ON CONFLICT(run_id, problem_id, device_id) DO NOTHING",
};

/* Substitutes %1$s to %5$s of a step (snprintf's positional form; a step
 * may use only the leading ones). */
static int format_step(char *buf, size_t len, const char *step,
                       const char *uid, const char *note,
                       const char *read_gbps, const char *ceilings,
                       const char *stages)
{
    int n = snprintf(buf, len, step, uid, note, read_gbps, ceilings, stages);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* Copies ardb_src into main; the caller holds the write transaction. */
static int merge_attached(ardb *db, int64_t src_version,
                          ardb_merge_stats *stats)
{
    int64_t before[N_TABLES], after[N_TABLES];
    char sql[4096], uid[256];
    size_t i;
    int code;

    /* The source's runs are aliased r; their uid is the v2 column or the
     * identity that the migration derives for a v1 file. */
    snprintf(uid, sizeof uid, "%s", ardb__run_uid_expr(src_version));
    if ((code = count_rows(db, before)) ||
        (code = ardb__exec(db, drop_maps, "merge")))
        return code;
    for (i = 0; i < sizeof merge_steps / sizeof merge_steps[0]; i++) {
        /* Only steps that name the source runs (alias r), devices,
         * measurements or winners (alias s) take arguments. */
        if (strstr(merge_steps[i], "ardb_src.devices s")) {
            if (format_step(sql, sizeof sql, merge_steps[i],
                            ardb__device_simulated_expr(src_version, "s"),
                            NULL, NULL, NULL, NULL))
                return ardb__fail(db, ARDB_ESQL, "merge: statement too long");
        } else if (strstr(merge_steps[i], "ardb_src.measurements s")) {
            if (format_step(sql, sizeof sql, merge_steps[i],
                            src_version >= 8 ? "s.final_round"
                                             : ARDB_LEGACY_FINAL_ROUND("s.message"),
                            ardb__ceiling_fraction_expr(src_version, "s"), NULL, NULL, NULL))
                return ardb__fail(db, ARDB_ESQL, "merge: statement too long");
        } else if (strstr(merge_steps[i], "ardb_src.winners s")) {
            /* A source older than v9 has no provisional winner. */
            if (format_step(sql, sizeof sql, merge_steps[i],
                            src_version >= 9 ? "s.provisional" : "0",
                            src_version >= 9 ? "s.disturbance" : "NULL",
                            NULL, NULL, NULL))
                return ardb__fail(db, ARDB_ESQL, "merge: statement too long");
        } else if (strstr(merge_steps[i], "%1$s")) {
            if (format_step(sql, sizeof sql, merge_steps[i], uid,
                            src_version >= 2 ? "r.note" : "NULL",
                            ardb__run_read_gbps_expr(src_version),
                            src_version >= 6 ? "r.ceilings" : "NULL",
                            src_version >= 7 ? "r.stages" : "NULL"))
                return ardb__fail(db, ARDB_ESQL, "merge: statement too long");
        } else {
            snprintf(sql, sizeof sql, "%s", merge_steps[i]);
        }
        if ((code = ardb__exec(db, sql, "merge")))
            return code;
    }
    if ((code = count_rows(db, after)) ||
        (code = ardb__exec(db, drop_maps, "merge")))
        return code;
    if (stats) {
        stats->devices = after[0] - before[0];
        stats->problems = after[1] - before[1];
        stats->candidates = after[2] - before[2];
        stats->binaries = after[3] - before[3];
        stats->runs = after[4] - before[4];
        stats->measurements = after[5] - before[5];
        stats->winners = after[6] - before[6];
    }
    return ARDB_DONE;
}

/* ATTACH needs no open transaction; a failed merge leaves none open. */
static int attach(ardb *db, const char *path)
{
    sqlite3_stmt *st = NULL;
    int code, rc;
    if (!sqlite3_get_autocommit(db->h))
        return ardb__fail(db, ARDB_EINVAL,
                          "merge and import cannot run inside a transaction");
    if ((code = ardb__prepare(db, "ATTACH DATABASE ?1 AS ardb_src", &st,
                              "attach")))
        return code;
    rc = sqlite3_bind_text(st, 1, path, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
        return ardb__step_fail(db, st, rc, "cannot attach the source");
    sqlite3_finalize(st);
    return ARDB_DONE;
}

static void detach(ardb *db)
{
    if (!sqlite3_get_autocommit(db->h))
        (void)sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    (void)sqlite3_exec(db->h, drop_maps, NULL, NULL, NULL);
    (void)sqlite3_exec(db->h, "DETACH DATABASE ardb_src", NULL, NULL, NULL);
}

/* Runs the merge from the attached source in one write transaction. */
static int merge_in_transaction(ardb *db, int64_t src_version,
                                ardb_merge_stats *stats)
{
    int code;
    if ((code = ardb__exec(db, "BEGIN IMMEDIATE", "merge")))
        return code;
    if ((code = merge_attached(db, src_version, stats)))
        return code; /* detach() rolls back */
    return ardb__exec(db, "COMMIT", "merge");
}

int ardb_merge(ardb *db, const char *src_path, ardb_merge_stats *stats)
{
    char msg[1024], a[PATH_MAX], b[PATH_MAX];
    ardb *src = NULL;
    int64_t version = 0;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!src_path || !*src_path)
        return ardb__fail(db, ARDB_EINVAL, "ardb_merge: no source path");
    if ((code = ardb__check_writable(db)))
        return code;
    if (realpath(src_path, a) && realpath(db->path, b) && !strcmp(a, b))
        return ardb__fail(db, ARDB_EINVAL,
                          "cannot merge %s into itself", src_path);
    /* The source must be an attnres database this build can read. */
    code = ardb_open(src_path, ARDB_READONLY, &src, msg, sizeof msg);
    if (code)
        return ardb__fail(db, code, "merge: %s", msg);
    code = ardb__user_version(src, "main", &version);
    if (code)
        ardb__fail(db, code, "merge: %s", ardb_errmsg(src));
    ardb_close(src);
    if (code)
        return code;
    if ((code = attach(db, src_path)))
        return code;
    code = merge_in_transaction(db, version, stats);
    detach(db);
    return code;
}

/* ---- import ------------------------------------------------------------------ */

/* The staging tables an import fills: the shape the merge reads, with the
 * checks that let a bad file fail at its row. */
static const char staging_ddl[] =
    "CREATE TABLE ardb_src.devices(id INTEGER PRIMARY KEY,"
    " backend TEXT NOT NULL, name TEXT, arch TEXT, units INTEGER,"
    " memory INTEGER, driver TEXT, fingerprint TEXT NOT NULL,"
    " created_at TEXT NOT NULL,"
    " simulated INTEGER NOT NULL DEFAULT 0 CHECK(simulated IN (0, 1)),"
    " UNIQUE(fingerprint, simulated));"
    "CREATE TABLE ardb_src.problems(id INTEGER PRIMARY KEY,"
    " key TEXT NOT NULL UNIQUE, op TEXT NOT NULL, dtype TEXT NOT NULL,"
    " form TEXT NOT NULL, d INTEGER NOT NULL, n INTEGER NOT NULL,"
    " heads INTEGER NOT NULL, epilogue INTEGER NOT NULL, s INTEGER NOT NULL,"
    " t_bucket INTEGER NOT NULL,"
    " CHECK(key = op || ':' || dtype || ':d' || d || ':n' || n || ':h' ||"
    "  heads || ':' || form || ':epi' || epilogue || ':s' || s || ':t' ||"
    "  t_bucket));"
    "CREATE TABLE ardb_src.candidates(id INTEGER PRIMARY KEY, backend TEXT,"
    " template_name TEXT, variant TEXT NOT NULL, params_json TEXT,"
    " source_hash TEXT NOT NULL, source TEXT, kernel_name TEXT,"
    " created_at TEXT NOT NULL, UNIQUE(variant, source_hash));"
    "CREATE TABLE ardb_src.binaries(build_key TEXT PRIMARY KEY,"
    " candidate_id INTEGER, compiler TEXT, options TEXT, target TEXT,"
    " blob BLOB NOT NULL, resources_json TEXT, created_at TEXT NOT NULL);"
    "CREATE TABLE ardb_src.runs(id INTEGER PRIMARY KEY,"
    " uid TEXT NOT NULL UNIQUE, note TEXT, started_at TEXT NOT NULL,"
    " finished_at TEXT, status TEXT NOT NULL CHECK(status IN"
    "  ('running','complete','failed','interrupted')),"
    " user TEXT, host TEXT, command TEXT, project_version TEXT,"
    " templates_hash TEXT, compiler TEXT, driver TEXT, device_id INTEGER,"
    " policy_json TEXT, strategy TEXT, copy_gbps REAL, launch_us REAL,"
    " read_gbps REAL, ceilings TEXT, stages TEXT);"
    "CREATE TABLE ardb_src.measurements(id INTEGER PRIMARY KEY,"
    " run_id INTEGER NOT NULL, candidate_id INTEGER NOT NULL,"
    " problem_id INTEGER NOT NULL, device_id INTEGER NOT NULL,"
    " build_key TEXT, status TEXT NOT NULL CHECK(status IN ('ok',"
    "  'compile_failed','launch_failed','wrong_result','skipped','timeout',"
    "  'nondeterministic')),"
    " median_us REAL, min_us REAL, max_us REAL, spread_us REAL,"
    " reps INTEGER, gbps REAL, ceiling_fraction REAL, rel_err REAL, message TEXT,"
    " created_at TEXT NOT NULL,"
    " final_round INTEGER NOT NULL DEFAULT 0 CHECK(final_round IN (0, 1)));"
    "CREATE TABLE ardb_src.winners(run_id INTEGER NOT NULL,"
    " problem_id INTEGER NOT NULL, device_id INTEGER NOT NULL,"
    " candidate_id INTEGER NOT NULL, measurement_id INTEGER NOT NULL,"
    " created_at TEXT NOT NULL,"
    " provisional INTEGER NOT NULL DEFAULT 0 CHECK(provisional IN (0, 1)),"
    " disturbance TEXT);";

/* One member of an imported object: its name, kind ('s' text, 'i'
 * integer, 'r' number), whether it must be there, and the range its value
 * must lie in (import_range; 0: any). */
typedef struct import_field {
    const char *name;
    char kind;
    int required;
    char range;
} import_field;

/* Members that exports of older builds wrote under another name, which
 * an import still reads. */
static const struct {
    const char *name, *old_name;
} renamed_members[] = {{"ceiling_fraction", ARDB_CEILING_FRACTION_PRE_V11}};

/* The ranges of imported numbers (ardb.h gives the bounds and why): a file
 * that claims a negative or absurd time would otherwise be stored and
 * shown, and would break the charts and comparisons that read it. */
enum import_range {
    RANGE_NONE = 0,
    RANGE_TIME = 't',      /* microseconds, 0 .. ARDB_IMPORT_MAX_US */
    RANGE_BANDWIDTH = 'b', /* GB/s, 0 .. ARDB_IMPORT_MAX_GBPS */
    RANGE_CEILING_FRACTION = 'f',  /* fraction, 0 .. ARDB_IMPORT_MAX_CEILING_FRACTION */
    RANGE_FINITE = 'e',    /* finite and >= 0 (a relative error) */
    RANGE_REPS = 'n'       /* a count, 0 .. ARDB_IMPORT_MAX_REPS */
};

typedef struct import_section {
    const char *name;
    const char *sql;  /* parameters ?1.. in the order of fields */
    const import_field *fields;
    size_t nfields;
    const char *refs; /* what a NOT NULL failure means, or NULL */
} import_section;

#define NOW_OR(p) "COALESCE(" p ", " ARDB_NOW ")"

static const import_field device_fields[] = {
    {"backend", 's', 1, 0}, {"name", 's', 0, 0},   {"arch", 's', 0, 0},
    {"units", 'i', 0, 0},   {"memory", 'i', 0, 0}, {"driver", 's', 0, 0},
    {"fingerprint", 's', 1, 0}, {"created_at", 's', 0, 0},
    /* Optional: exports of builds before schema v4 do not carry it, and
     * every device they hold is real (0). */
    {"simulated", 'i', 0, 0}};
static const import_field problem_fields[] = {
    {"key", 's', 1, 0}, {"op", 's', 1, 0},    {"dtype", 's', 1, 0},
    {"form", 's', 1, 0}, {"d", 'i', 1, 0},    {"n", 'i', 1, 0},
    {"heads", 'i', 1, 0}, {"epilogue", 'i', 1, 0}, {"s", 'i', 1, 0},
    {"t_bucket", 'i', 1, 0}};
static const import_field candidate_fields[] = {
    {"backend", 's', 0, 0},     {"template", 's', 0, 0},   {"variant", 's', 1, 0},
    {"params_json", 's', 0, 0}, {"source_hash", 's', 1, 0}, {"source", 's', 0, 0},
    {"kernel_name", 's', 0, 0}, {"created_at", 's', 0, 0}};
static const import_field run_fields[] = {
    {"uid", 's', 1, 0},          {"note", 's', 0, 0},
    {"started_at", 's', 1, 0},   {"finished_at", 's', 0, 0},
    {"status", 's', 1, 0},       {"user", 's', 0, 0},
    {"host", 's', 0, 0},         {"command", 's', 0, 0},
    {"project_version", 's', 0, 0}, {"templates_hash", 's', 0, 0},
    {"compiler", 's', 0, 0},     {"driver", 's', 0, 0},
    {"device", 's', 0, 0},       {"policy_json", 's', 0, 0},
    {"strategy", 's', 0, 0},     {"copy_gbps", 'r', 0, RANGE_BANDWIDTH},
    {"launch_us", 'r', 0, RANGE_TIME},
    /* Optional: exports of builds before schema v3 do not carry it. A
     * value <= 0 is stored as NULL (not measured), as ardb_run_begin does. */
    {"read_gbps", 'r', 0, RANGE_BANDWIDTH},
    /* Optional, as the devices' own: absent means a real device. */
    {"device_simulated", 'i', 0, 0},
    /* Optional: exports of builds before schema v6 do not carry it. */
    {"ceilings", 's', 0, 0},
    /* Optional: exports of builds before schema v7 do not carry it. */
    {"stages", 's', 0, 0}};
static const import_field measurement_fields[] = {
    {"id", 'i', 1, 0},         {"run", 's', 1, 0},       {"problem", 's', 1, 0},
    {"variant", 's', 1, 0},    {"source_hash", 's', 1, 0}, {"device", 's', 1, 0},
    {"build_key", 's', 0, 0},  {"status", 's', 1, 0},
    {"median_us", 'r', 0, RANGE_TIME},     {"min_us", 'r', 0, RANGE_TIME},
    {"max_us", 'r', 0, RANGE_TIME},        {"spread_us", 'r', 0, RANGE_TIME},
    {"reps", 'i', 0, RANGE_REPS},          {"gbps", 'r', 0, RANGE_BANDWIDTH},
    {"ceiling_fraction", 'r', 0, RANGE_CEILING_FRACTION},  {"rel_err", 'r', 0, RANGE_FINITE},
    {"message", 's', 0, 0},   {"created_at", 's', 1, 0},
    {"device_simulated", 'i', 0, 0},
    /* Optional: exports of builds before schema v8 do not carry it; their
     * measurements are marked from the message as the migration does. */
    {"final_round", 'i', 0, 0}};
static const import_field winner_fields[] = {
    {"run", 's', 1, 0},         {"problem", 's', 1, 0}, {"device", 's', 1, 0},
    {"variant", 's', 1, 0},     {"source_hash", 's', 1, 0},
    {"measurement", 'i', 1, 0}, {"created_at", 's', 0, 0},
    {"device_simulated", 'i', 0, 0},
    /* Optional: exports of builds before schema v9 do not carry them, and
     * none of their winners is provisional. */
    {"provisional", 'i', 0, 0}, {"disturbance", 's', 0, 0}};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

static const import_section sections[] = {
    {"devices",
     "INSERT INTO ardb_src.devices(backend, name, arch, units, memory, driver,"
     " fingerprint, created_at, simulated) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, "
     NOW_OR("?8") ", COALESCE(?9, 0))",
     device_fields, COUNT_OF(device_fields), NULL},
    {"problems",
     "INSERT INTO ardb_src.problems(key, op, dtype, form, d, n, heads,"
     " epilogue, s, t_bucket) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
     problem_fields, COUNT_OF(problem_fields), NULL},
    {"candidates",
     "INSERT INTO ardb_src.candidates(backend, template_name, variant,"
     " params_json, source_hash, source, kernel_name, created_at)"
     " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, " NOW_OR("?8") ")",
     candidate_fields, COUNT_OF(candidate_fields), NULL},
    {"runs",
     "INSERT INTO ardb_src.runs(uid, note, started_at, finished_at, status,"
     " user, host, command, project_version, templates_hash, compiler, driver,"
     " device_id, policy_json, strategy, copy_gbps, launch_us, read_gbps,"
     " ceilings, stages)"
     " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12,"
     " CASE WHEN ?13 IS NULL THEN NULL ELSE"
     "  (SELECT id FROM ardb_src.devices WHERE fingerprint = ?13"
     "   AND simulated = COALESCE(?19, 0)) END,"
     " ?14, ?15, ?16, ?17, CASE WHEN ?18 > 0 THEN ?18 END, ?20, ?21)",
     run_fields, COUNT_OF(run_fields), NULL},
    {"measurements",
     "INSERT INTO ardb_src.measurements(id, run_id, problem_id, candidate_id,"
     " device_id, build_key, status, median_us, min_us, max_us, spread_us,"
     " reps, gbps, ceiling_fraction, rel_err, message, created_at, final_round)"
     " VALUES(?1, (SELECT id FROM ardb_src.runs WHERE uid = ?2),"
     " (SELECT id FROM ardb_src.problems WHERE key = ?3),"
     " (SELECT id FROM ardb_src.candidates WHERE variant = ?4"
     "  AND source_hash = ?5),"
     " (SELECT id FROM ardb_src.devices WHERE fingerprint = ?6"
     "  AND simulated = COALESCE(?19, 0)),"
     " ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,"
     " COALESCE(?20, " ARDB_LEGACY_FINAL_ROUND("?17") "))",
     measurement_fields, COUNT_OF(measurement_fields),
     "names a run, problem, candidate or device that the file does not "
     "define"},
    {"winners",
     "INSERT INTO ardb_src.winners(run_id, problem_id, device_id,"
     " candidate_id, measurement_id, created_at, provisional, disturbance)"
     " VALUES((SELECT id FROM ardb_src.runs WHERE uid = ?1),"
     " (SELECT id FROM ardb_src.problems WHERE key = ?2),"
     " (SELECT id FROM ardb_src.devices WHERE fingerprint = ?3"
     "  AND simulated = COALESCE(?8, 0)),"
     " (SELECT id FROM ardb_src.candidates WHERE variant = ?4"
     "  AND source_hash = ?5),"
     " (SELECT id FROM ardb_src.measurements WHERE id = ?6),"
     " " NOW_OR("?7") ", COALESCE(?9, 0), ?10)",
     winner_fields, COUNT_OF(winner_fields),
     "names a run, problem, device, candidate or measurement that the file "
     "does not define"},
};

/* EINVAL naming the member and the record when a number lies outside the
 * field's range; ARDB_DONE otherwise. */
static int check_range(ardb *db, const ardb_json *v, const import_field *f,
                       const char *sec, size_t row)
{
    double x = v->number, max;
    const char *what;
    switch (f->range) {
    case RANGE_TIME:
        max = ARDB_IMPORT_MAX_US;
        what = "a time in microseconds";
        break;
    case RANGE_BANDWIDTH:
        max = ARDB_IMPORT_MAX_GBPS;
        what = "a bandwidth in GB/s";
        break;
    case RANGE_CEILING_FRACTION:
        max = ARDB_IMPORT_MAX_CEILING_FRACTION;
        what = "a fraction of the ceiling";
        break;
    case RANGE_REPS:
        max = ARDB_IMPORT_MAX_REPS;
        what = "a repetition count";
        break;
    case RANGE_FINITE:
        if (isfinite(x) && x >= 0)
            return ARDB_DONE;
        return ardb__fail(db, ARDB_EINVAL,
                          "import: %s[%zu] (line %d): \"%s\" must be a finite "
                          "number >= 0, not %g",
                          sec, row, v->line, f->name, x);
    default:
        return ARDB_DONE;
    }
    /* NaN fails both comparisons; JSON cannot spell it, but 1e999 reads
     * as infinity. */
    if (x >= 0 && x <= max)
        return ARDB_DONE;
    return ardb__fail(db, ARDB_EINVAL,
                      "import: %s[%zu] (line %d): \"%s\" must be %s between "
                      "0 and %g, not %g",
                      sec, row, v->line, f->name, what, max, x);
}

/* Binds one member; EINVAL with a message naming the member and the record
 * when its type is wrong, a number is out of its range, or a string is
 * not UTF-8 (a JSON text is UTF-8, and an export must be one again). */
static int bind_field(ardb *db, sqlite3_stmt *st, int i, const ardb_json *v,
                      const import_field *f, const char *sec, size_t row)
{
    int rc = SQLITE_OK, code;
    size_t bad = 0;
    if (v && v->type == ARDB_JSON_STRING && f->kind == 's' &&
        !ardb__utf8_valid(v->string, v->length, &bad))
        return ardb__fail(db, ARDB_EINVAL,
                          "import: %s[%zu] (line %d): \"%s\" is not valid "
                          "UTF-8 (at byte %zu)",
                          sec, row, v->line, f->name, bad);
    if (v && v->type == ARDB_JSON_NUMBER && f->range &&
        (f->kind == 'r' || v->is_integer) &&
        (code = check_range(db, v, f, sec, row)))
        return code;
    if (!v || v->type == ARDB_JSON_NULL) {
        if (f->required)
            return ardb__fail(db, ARDB_EINVAL,
                              "import: %s[%zu] (line %d): \"%s\" is missing",
                              sec, row, v ? v->line : 0, f->name);
        rc = sqlite3_bind_null(st, i);
    } else if (f->kind == 's' && v->type == ARDB_JSON_STRING) {
        rc = sqlite3_bind_text(st, i, v->string, (int)v->length, SQLITE_STATIC);
    } else if (f->kind == 'i' && v->type == ARDB_JSON_NUMBER && v->is_integer) {
        rc = sqlite3_bind_int64(st, i, v->integer);
    } else if (f->kind == 'r' && v->type == ARDB_JSON_NUMBER) {
        rc = sqlite3_bind_double(st, i, v->number);
    } else {
        return ardb__fail(db, ARDB_EINVAL,
                          "import: %s[%zu] (line %d): \"%s\" must be %s", sec,
                          row, v->line, f->name,
                          f->kind == 's'   ? "a string"
                          : f->kind == 'i' ? "an integer"
                                           : "a number");
    }
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, "import");
    return ARDB_DONE;
}

/* Binds the member of obj that field f names, or where obj has none, the
 * member of its older name, with errors naming the key the file used. An
 * object that holds both is refused: which one it means is unclear. */
static int bind_member(ardb *db, sqlite3_stmt *st, int i, const ardb_json *obj,
                       const import_field *f, const char *sec, size_t row)
{
    const ardb_json *v = ardb__json_get(obj, f->name), *old = NULL;
    import_field as_named = *f;
    size_t k;
    for (k = 0; k < COUNT_OF(renamed_members) && !old; k++)
        if (!strcmp(f->name, renamed_members[k].name) &&
            (old = ardb__json_get(obj, renamed_members[k].old_name)))
            as_named.name = renamed_members[k].old_name;
    if (v && old)
        return ardb__fail(db, ARDB_EINVAL,
                          "import: %s[%zu] (line %d) holds both \"%s\" and "
                          "its older name \"%s\"",
                          sec, row, obj->line, f->name, as_named.name);
    return bind_field(db, st, i, old ? old : v, &as_named, sec, row);
}

static int import_section_rows(ardb *db, const ardb_json *doc,
                               const import_section *sec)
{
    const ardb_json *arr = ardb__json_get(doc, sec->name);
    sqlite3_stmt *st = NULL;
    size_t r, f;
    int code, rc;

    if (!arr || arr->type == ARDB_JSON_NULL)
        return ARDB_DONE; /* a section may be left out */
    if (arr->type != ARDB_JSON_ARRAY)
        return ardb__fail(db, ARDB_EINVAL,
                          "import: \"%s\" (line %d) must be an array",
                          sec->name, arr->line);
    if ((code = ardb__prepare(db, sec->sql, &st, "import")))
        return code;
    for (r = 0; r < arr->count; r++) {
        const ardb_json *obj = &arr->items[r];
        if (obj->type != ARDB_JSON_OBJECT) {
            code = ardb__fail(db, ARDB_EINVAL,
                              "import: %s[%zu] (line %d) must be an object",
                              sec->name, r, obj->line);
            break;
        }
        sqlite3_reset(st);
        sqlite3_clear_bindings(st);
        for (f = 0; f < sec->nfields && !code; f++)
            code = bind_member(db, st, (int)f + 1, obj, &sec->fields[f],
                               sec->name, r);
        if (code)
            break;
        rc = sqlite3_step(st);
        if (rc != SQLITE_DONE) {
            const char *why = sqlite3_errmsg(db->h);
            if ((rc & 0xff) == SQLITE_CONSTRAINT && sec->refs &&
                strstr(why, "NOT NULL"))
                code = ardb__fail(db, ARDB_EINVAL,
                                  "import: %s[%zu] (line %d) %s", sec->name, r,
                                  obj->line, sec->refs);
            else if ((rc & 0xff) == SQLITE_CONSTRAINT)
                code = ardb__fail(db, ARDB_EINVAL,
                                  "import: %s[%zu] (line %d) is inconsistent:"
                                  " %s",
                                  sec->name, r, obj->line, why);
            else
                code = ardb__sql_fail(db, rc, "import");
            break;
        }
    }
    sqlite3_finalize(st);
    return code;
}

int ardb_import_json(ardb *db, const char *text, size_t len,
                     ardb_merge_stats *stats)
{
    char err[512];
    ardb_json *doc = NULL;
    const ardb_json *fmt, *ver;
    size_t i;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!text)
        return ardb__fail(db, ARDB_EINVAL, "ardb_import_json: no input");
    if ((code = ardb__check_writable(db)))
        return code;
    if (ardb__json_parse(text, len, &doc, err, sizeof err))
        return ardb__fail(db, ARDB_EINVAL, "import: not JSON: %s", err);
    fmt = ardb__json_get(doc, "format");
    ver = ardb__json_get(doc, "version");
    if (doc->type != ARDB_JSON_OBJECT || !fmt ||
        fmt->type != ARDB_JSON_STRING || strcmp(fmt->string, EXPORT_FORMAT)) {
        ardb__json_free(doc);
        return ardb__fail(db, ARDB_EINVAL,
                          "import: not an attnres export (no \"format\": "
                          "\"" EXPORT_FORMAT "\")");
    }
    /* The message is formatted before the document is freed, since it
     * quotes the version that the document holds. */
    if (!ver || ver->type != ARDB_JSON_NUMBER)
        code = ardb__fail(db, ARDB_EINVAL,
                          "import: export version is missing or not a number "
                          "(this build reads version %d)",
                          EXPORT_VERSION);
    else if (ver->is_integer && ver->integer > EXPORT_VERSION)
        code = ardb__fail(db, ARDB_EINVAL,
                          "import: export version %" PRId64 " is newer than "
                          "this build reads (%d): import it with a newer "
                          "attnres",
                          ver->integer, EXPORT_VERSION);
    else if (!ver->is_integer || ver->integer < 1)
        code = ardb__fail(db, ARDB_EINVAL,
                          "import: export version %.17g is not one this build "
                          "reads (%d)",
                          ver->number, EXPORT_VERSION);
    if (code) {
        ardb__json_free(doc);
        return code;
    }
    if ((code = attach(db, ""))) {
        ardb__json_free(doc);
        return code;
    }
    code = ardb__exec(db, "BEGIN IMMEDIATE", "import");
    if (!code)
        code = ardb__exec(db, staging_ddl, "import");
    for (i = 0; !code && i < COUNT_OF(sections); i++)
        code = import_section_rows(db, doc, &sections[i]);
    ardb__json_free(doc);
    if (!code)
        code = merge_attached(db, ARDB_SCHEMA_VERSION, stats);
    if (!code)
        code = ardb__exec(db, "COMMIT", "import");
    detach(db);
    return code;
}
