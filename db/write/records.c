/*
 * records.c - the writes of a tuning run: devices, runs, problems,
 * candidates, binaries, measurements and winners, and the tuner's look-up
 * of what it measured before.
 *
 * Library code: never prints, aborts or exits; every failure is a return
 * code plus a message in db->err.
 */
#include "ardb_write.h"
#include "ardb_internal.h"
#include "liveness.h"
#include "migrate.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- shared helpers ----------------------------------------------------- */

/* Steps an INSERT/UPDATE to completion. */
static int step_done(ardb *db, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st);
    int code = ARDB_DONE;
    if (rc != SQLITE_DONE && rc != SQLITE_ROW)
        code = ardb__sql_fail(db, rc, what);
    ardb__release(st);
    return code;
}

/* Steps a one-column id SELECT. */
static int step_id(ardb *db, sqlite3_stmt *st, const char *what, int64_t *id)
{
    int rc = sqlite3_step(st);
    int code = ARDB_DONE;
    if (rc == SQLITE_ROW)
        *id = sqlite3_column_int64(st, 0);
    else if (rc == SQLITE_DONE)
        code = ardb__fail(db, ARDB_ENOTFOUND, "%s: no such row", what);
    else
        code = ardb__sql_fail(db, rc, what);
    ardb__release(st);
    return code;
}

/* INSERT ... ON CONFLICT DO NOTHING, then SELECT the id: race-free across
 * processes because rows are never deleted. */
#define UPSERT_ID(db, ins, sel, what, id)                                     \
    do {                                                                      \
        int c_ = step_done((db), (ins), (what));                              \
        if (c_)                                                               \
            return c_;                                                        \
        return step_id((db), (sel), (what), (id));                            \
    } while (0)

/* ---- devices -------------------------------------------------------------- */

int ardb_device_upsert(ardb *db, const ardb_device *dev, int64_t *id)
{
    /* A device is (fingerprint, simulated): the same fingerprint recorded
     * by a simulated driver and by hardware names two devices, so that
     * nothing measured on one is ever taken for the other. */
    static const char ins_sql[] =
        "INSERT INTO devices(backend, name, arch, units, memory, driver,"
        " fingerprint, simulated, created_at)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, ?, " ARDB_NOW ")"
        " ON CONFLICT(fingerprint, simulated) DO NOTHING";
    static const char sel_sql[] =
        "SELECT id FROM devices WHERE fingerprint = ? AND simulated = ?";
    sqlite3_stmt *ins, *sel;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!dev || !id || !dev->backend || !dev->fingerprint)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_device_upsert: backend and fingerprint are "
                          "required");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_DEVICE_INSERT, ins_sql, &ins)) ||
        (code = ardb__stmt(db, ST_DEVICE_SELECT, sel_sql, &sel)))
        return code;
    b = (ardb_binder){ins, SQLITE_OK, 0};
    ardb__bind_text(&b, dev->backend);
    ardb__bind_text(&b, dev->name);
    ardb__bind_text(&b, dev->arch);
    ardb__bind_int64(&b, dev->units);
    ardb__bind_int64(&b, dev->memory);
    ardb__bind_text(&b, dev->driver);
    ardb__bind_text(&b, dev->fingerprint);
    ardb__bind_int64(&b, dev->simulated ? 1 : 0);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, ins, b.rc, "device upsert");
    b = (ardb_binder){sel, SQLITE_OK, 0};
    ardb__bind_text(&b, dev->fingerprint);
    ardb__bind_int64(&b, dev->simulated ? 1 : 0);
    if (b.rc != SQLITE_OK) {
        ardb__release(ins);
        return ardb__stmt_fail(db, sel, b.rc, "device upsert");
    }
    UPSERT_ID(db, ins, sel, "device upsert", id);
}

/* ---- runs ------------------------------------------------------------------ */

int ardb_run_begin(ardb *db, const ardb_run *run, int64_t *run_id)
{
    static const char sql[] =
        "INSERT INTO runs(started_at, status, user, host, command,"
        " project_version, templates_hash, compiler, driver, device_id,"
        " policy_json, strategy, copy_gbps, launch_us, read_gbps, owner)"
        " VALUES(" ARDB_NOW ", 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,"
        " ?, ?)";
    char owner[512];
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!run || !run_id)
        return ardb__fail(db, ARDB_EINVAL, "ardb_run_begin: invalid argument");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_RUN_INSERT, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, run->user);
    ardb__bind_text(&b, run->host);
    ardb__bind_text(&b, run->command);
    ardb__bind_text(&b, run->project_version);
    ardb__bind_text(&b, run->templates_hash);
    ardb__bind_text(&b, run->compiler);
    ardb__bind_text(&b, run->driver);
    ardb__bind_id(&b, run->device_id);
    ardb__bind_text(&b, run->policy_json);
    ardb__bind_text(&b, run->strategy);
    ardb__bind_double(&b, run->copy_gbps);
    ardb__bind_double(&b, run->launch_us);
    /* Not measured (NaN, or 0 from a caller that zero-initializes the
     * struct and predates the field) is NULL, never a zero ceiling. */
    ardb__bind_double(&b, isfinite(run->read_gbps) && run->read_gbps > 0
                              ? run->read_gbps
                              : NAN);
    /* Without an owner (no /proc) the run is never marked interrupted by
     * another process: nothing could tell that this one is gone. */
    ardb__bind_text(&b, ardb__owner_self(owner, sizeof owner) == 0 ? owner
                                                                    : NULL);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "run begin");
    /* The rowid is read before the statement is reset: same connection. */
    {
        int rc = sqlite3_step(st);
        if (rc != SQLITE_DONE)
            return ardb__stmt_fail(db, st, rc, "run begin");
        *run_id = sqlite3_last_insert_rowid(db->h);
        ardb__release(st);
    }
    return ARDB_DONE;
}

int ardb_run_finish(ardb *db, int64_t run_id, const char *status)
{
    static const char sql[] =
        "UPDATE runs SET status = ?, finished_at = " ARDB_NOW " WHERE id = ?";
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!status || (strcmp(status, "complete") && strcmp(status, "failed") &&
                    strcmp(status, "interrupted")))
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_run_finish: status must be complete, failed "
                          "or interrupted");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_RUN_FINISH, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, status);
    ardb__bind_int64(&b, run_id);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "run finish");
    if ((code = step_done(db, st, "run finish")))
        return code;
    if (sqlite3_changes(db->h) == 0)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run with id %" PRId64,
                          run_id);
    return ARDB_DONE;
}

/* Sets one JSON column of a run (the column and statement are fixed by the
 * callers below, never from input). */
static int run_set_json(ardb *db, int stmt, const char *sql, const char *what, int64_t run_id, const char *json)
{
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!json || json[0] != '{')
        return ardb__fail(db, ARDB_EINVAL, "recording the run's %s: it must be a JSON object", what);
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, stmt, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, json);
    ardb__bind_int64(&b, run_id);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, what);
    if ((code = step_done(db, st, what)))
        return code;
    if (sqlite3_changes(db->h) == 0)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run with id %" PRId64,
                          run_id);
    return ARDB_DONE;
}

int ardb_run_set_ceilings(ardb *db, int64_t run_id, const char *json)
{
    return run_set_json(db, ST_RUN_CEILINGS, "UPDATE runs SET ceilings = ? WHERE id = ?", "ceilings", run_id,
                        json);
}

int ardb_run_set_roofs(ardb *db, int64_t run_id, double copy_gbps, double read_gbps, double launch_us)
{
    sqlite3_stmt *st;
    ardb_binder b;
    int code;
    if (!db)
        return ARDB_EINVAL;
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_RUN_ROOFS, "UPDATE runs SET copy_gbps = ?, read_gbps = ?, launch_us = ? WHERE id = ?",
                           &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_double(&b, copy_gbps);
    ardb__bind_double(&b, isfinite(read_gbps) && read_gbps > 0 ? read_gbps : NAN);
    ardb__bind_double(&b, launch_us);
    ardb__bind_int64(&b, run_id);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "the run's ceilings");
    if ((code = step_done(db, st, "the run's ceilings")))
        return code;
    if (sqlite3_changes(db->h) == 0)
        return ardb__fail(db, ARDB_ENOTFOUND, "no run with id %" PRId64, run_id);
    return ARDB_DONE;
}

int ardb_run_set_stages(ardb *db, int64_t run_id, const char *json)
{
    return run_set_json(db, ST_RUN_STAGES, "UPDATE runs SET stages = ? WHERE id = ?", "stages", run_id, json);
}

/* ---- problems --------------------------------------------------------------- */

void ardb_problem_key(const ardb_problem *p, char *buf, size_t len)
{
    if (!buf || !len)
        return;
    if (!p) {
        buf[0] = '\0';
        return;
    }
    snprintf(buf, len, "%s:%s:d%" PRId64 ":n%" PRId32 ":h%" PRId32
             ":%s:epi%" PRId32 ":s%" PRId32 ":t%" PRId64,
             p->op ? p->op : "?", p->dtype ? p->dtype : "?", p->d, p->n,
             p->heads, p->form ? p->form : "?", p->epilogue, p->s,
             p->t_bucket);
}

int ardb_problem_upsert(ardb *db, const ardb_problem *p, int64_t *id)
{
    static const char ins_sql[] =
        "INSERT INTO problems(key, op, dtype, form, d, n, heads, epilogue, s,"
        " t_bucket) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT(key) DO NOTHING";
    static const char sel_sql[] = "SELECT id FROM problems WHERE key = ?";
    char key[256];
    sqlite3_stmt *ins, *sel;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!p || !id || !p->op || !p->dtype || !p->form)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_problem_upsert: op, dtype and form are "
                          "required");
    ardb_problem_key(p, key, sizeof key);
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_PROBLEM_INSERT, ins_sql, &ins)) ||
        (code = ardb__stmt(db, ST_PROBLEM_SELECT, sel_sql, &sel)))
        return code;
    b = (ardb_binder){ins, SQLITE_OK, 0};
    ardb__bind_text(&b, key);
    ardb__bind_text(&b, p->op);
    ardb__bind_text(&b, p->dtype);
    ardb__bind_text(&b, p->form);
    ardb__bind_int64(&b, p->d);
    ardb__bind_int64(&b, p->n);
    ardb__bind_int64(&b, p->heads);
    ardb__bind_int64(&b, p->epilogue);
    ardb__bind_int64(&b, p->s);
    ardb__bind_int64(&b, p->t_bucket);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, ins, b.rc, "problem upsert");
    b = (ardb_binder){sel, SQLITE_OK, 0};
    ardb__bind_text(&b, key);
    if (b.rc != SQLITE_OK) {
        ardb__release(ins);
        return ardb__stmt_fail(db, sel, b.rc, "problem upsert");
    }
    UPSERT_ID(db, ins, sel, "problem upsert", id);
}

/* ---- candidates ---------------------------------------------------------------- */

int ardb_candidate_upsert(ardb *db, const ardb_candidate *c, int64_t *id)
{
    static const char ins_sql[] =
        "INSERT INTO candidates(backend, template_name, variant, params_json,"
        " source_hash, source, kernel_name, created_at)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, " ARDB_NOW ")"
        " ON CONFLICT(variant, source_hash) DO NOTHING";
    static const char sel_sql[] =
        "SELECT id FROM candidates WHERE variant = ? AND source_hash = ?";
    sqlite3_stmt *ins, *sel;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!c || !id || !c->variant || !c->source_hash)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_candidate_upsert: variant and source_hash are "
                          "required");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_CANDIDATE_INSERT, ins_sql, &ins)) ||
        (code = ardb__stmt(db, ST_CANDIDATE_SELECT, sel_sql, &sel)))
        return code;
    b = (ardb_binder){ins, SQLITE_OK, 0};
    ardb__bind_text(&b, c->backend);
    ardb__bind_text(&b, c->template_name);
    ardb__bind_text(&b, c->variant);
    ardb__bind_text(&b, c->params_json);
    ardb__bind_text(&b, c->source_hash);
    ardb__bind_text(&b, c->source);
    ardb__bind_text(&b, c->kernel_name);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, ins, b.rc, "candidate upsert");
    b = (ardb_binder){sel, SQLITE_OK, 0};
    ardb__bind_text(&b, c->variant);
    ardb__bind_text(&b, c->source_hash);
    if (b.rc != SQLITE_OK) {
        ardb__release(ins);
        return ardb__stmt_fail(db, sel, b.rc, "candidate upsert");
    }
    UPSERT_ID(db, ins, sel, "candidate upsert", id);
}

/* ---- binaries ------------------------------------------------------------------ */

int ardb_binary_put(ardb *db, const ardb_binary *bin)
{
    static const char sql[] =
        "INSERT INTO binaries(build_key, candidate_id, compiler, options,"
        " target, blob, resources_json, created_at)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, " ARDB_NOW ")"
        " ON CONFLICT(build_key) DO NOTHING";
    sqlite3_stmt *st;
    ardb_binder b;
    int code;

    if (!db)
        return ARDB_EINVAL;
    if (!bin || !bin->build_key || (bin->size && !bin->blob))
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_binary_put: build_key and blob are required");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_BINARY_INSERT, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, bin->build_key);
    ardb__bind_id(&b, bin->candidate_id);
    ardb__bind_text(&b, bin->compiler);
    ardb__bind_text(&b, bin->options);
    ardb__bind_text(&b, bin->target);
    ardb__bind_blob(&b, bin->blob, bin->size);
    ardb__bind_text(&b, bin->resources_json);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "binary put");
    return step_done(db, st, "binary put");
}


/* ---- measurements ----------------------------------------------------------------- */

static const char *const status_names[] = {
    "ok", "compile_failed", "launch_failed", "wrong_result", "skipped",
    "timeout", "nondeterministic"};
#define N_STATUS (sizeof status_names / sizeof status_names[0])

const char *ardb_status_name(ardb_status s)
{
    if ((unsigned)s < N_STATUS)
        return status_names[s];
    return "unknown";
}

static int status_from_name(const char *name, ardb_status *s)
{
    size_t i;
    for (i = 0; name && i < N_STATUS; i++)
        if (!strcmp(name, status_names[i])) {
            *s = (ardb_status)i;
            return 1;
        }
    return 0;
}

int ardb_measurement_add(ardb *db, const ardb_measurement *m, int64_t *id)
{
    static const char sql[] =
        "INSERT INTO measurements(run_id, candidate_id, problem_id, device_id,"
        " build_key, status, median_us, min_us, max_us, spread_us, reps, gbps,"
        " ceiling_fraction, rel_err, message, final_round, created_at)"
        " VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, " ARDB_NOW ")";
    sqlite3_stmt *st;
    ardb_binder b;
    int code, rc;

    if (!db)
        return ARDB_EINVAL;
    if (!m || (unsigned)m->status >= N_STATUS || m->run_id <= 0 ||
        m->candidate_id <= 0 || m->problem_id <= 0 || m->device_id <= 0)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_measurement_add: ids and a valid status are "
                          "required");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_MEASUREMENT_INSERT, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_int64(&b, m->run_id);
    ardb__bind_int64(&b, m->candidate_id);
    ardb__bind_int64(&b, m->problem_id);
    ardb__bind_int64(&b, m->device_id);
    ardb__bind_text(&b, m->build_key);
    ardb__bind_text(&b, status_names[m->status]);
    ardb__bind_double(&b, m->median_us);
    ardb__bind_double(&b, m->min_us);
    ardb__bind_double(&b, m->max_us);
    ardb__bind_double(&b, m->spread_us);
    ardb__bind_int64(&b, m->reps);
    ardb__bind_double(&b, m->gbps);
    ardb__bind_double(&b, m->ceiling_fraction);
    ardb__bind_double(&b, m->rel_err);
    ardb__bind_text(&b, m->message);
    ardb__bind_int64(&b, m->final_round != 0);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "measurement add");
    rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
        return ardb__stmt_fail(db, st, rc, "measurement add");
    if (id)
        *id = sqlite3_last_insert_rowid(db->h);
    ardb__release(st);
    return ARDB_DONE;
}

int ardb_measurement_find(ardb *db, int64_t candidate_id, int64_t problem_id,
                          int64_t device_id, const char *build_key,
                          ardb_measurement *m)
{
    return ardb_measurement_find_ex(db, candidate_id, problem_id, device_id,
                                    build_key, m, NULL);
}

int ardb_measurement_find_ex(ardb *db, int64_t candidate_id,
                             int64_t problem_id, int64_t device_id,
                             const char *build_key, ardb_measurement *m,
                             int64_t *measurement_id)
{
#define MEASUREMENT_FIND_SQL(fraction, final_round)                           \
    "SELECT id, run_id, status, median_us, min_us, max_us, spread_us,"       \
    " reps, gbps, " fraction ", rel_err, message, build_key, " final_round   \
    " FROM measurements"                                                      \
    " WHERE candidate_id = ? AND problem_id = ? AND device_id = ?"           \
    " AND build_key IS ?"                                                     \
    " ORDER BY id DESC LIMIT 1"
    static const char sql[] = MEASUREMENT_FIND_SQL("ceiling_fraction", "final_round");
    /* A writer's handle is always of the current version (its open
     * migrates); a reader's may be of an older file, read as it is. */
    static const char sql_pre_v11[] = MEASUREMENT_FIND_SQL(ARDB_CEILING_FRACTION_PRE_V11, "final_round");
    static const char sql_pre_v8[] =
        MEASUREMENT_FIND_SQL(ARDB_CEILING_FRACTION_PRE_V11, ARDB_LEGACY_FINAL_ROUND("message"));
#undef MEASUREMENT_FIND_SQL
    sqlite3_stmt *st;
    ardb_binder b;
    int64_t version;
    int code = ARDB_DONE, rc, oom = 0;

    if (!db)
        return ARDB_EINVAL;
    if (!m)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_measurement_find: invalid argument");
    memset(m, 0, sizeof *m);
    if ((code = ardb__read_version(db, &version)))
        return code;
    const ardb_stmt_form forms[] = {{11, ST_MEASUREMENT_FIND, sql},
                                    {8, ST_MEASUREMENT_FIND_PRE_V11, sql_pre_v11},
                                    {0, ST_MEASUREMENT_FIND_PRE_V8, sql_pre_v8}};
    if ((code = ardb__stmt_for_version(db, version, forms, 3, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_int64(&b, candidate_id);
    ardb__bind_int64(&b, problem_id);
    ardb__bind_int64(&b, device_id);
    ardb__bind_text(&b, build_key);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "measurement find");
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        ardb_status s = ARDB_STATUS_OK;
        const char *sname = (const char *)sqlite3_column_text(st, 2);
        m->candidate_id = candidate_id;
        m->problem_id = problem_id;
        m->device_id = device_id;
        m->run_id = sqlite3_column_int64(st, 1);
        if (measurement_id)
            *measurement_id = sqlite3_column_int64(st, 0);
        if (!status_from_name(sname, &s))
            code = ardb__fail(db, ARDB_ESQL,
                              "measurement find: unknown status '%s'",
                              sname ? sname : "(null)");
        m->status = s;
        m->median_us = ardb__col_double(st, 3);
        m->min_us = ardb__col_double(st, 4);
        m->max_us = ardb__col_double(st, 5);
        m->spread_us = ardb__col_double(st, 6);
        m->reps = (int32_t)sqlite3_column_int64(st, 7);
        m->gbps = ardb__col_double(st, 8);
        m->ceiling_fraction = ardb__col_double(st, 9);
        m->rel_err = ardb__col_double(st, 10);
        m->message = ardb__col_dup(st, 11, &oom);
        m->build_key = ardb__col_dup(st, 12, &oom);
        m->final_round = sqlite3_column_int(st, 13) != 0;
        if (oom && !code)
            code = ardb__fail(db, ARDB_ENOMEM,
                              "measurement find: out of memory");
        if (code)
            ardb_measurement_clear(m);
    } else if (rc == SQLITE_DONE) {
        code = ardb__fail(db, ARDB_ENOTFOUND, "no such measurement");
    } else {
        code = ardb__sql_fail(db, rc, "measurement find");
    }
    ardb__release(st);
    return code;
}

void ardb_measurement_clear(ardb_measurement *m)
{
    if (!m)
        return;
    free((char *)m->build_key);
    free((char *)m->message);
    memset(m, 0, sizeof *m);
}

/* ---- winners ------------------------------------------------------------- */

int ardb_winner_set(ardb *db, int64_t run_id, int64_t problem_id,
                    int64_t device_id, int64_t candidate_id,
                    int64_t measurement_id)
{
    return ardb_winner_set_ex(db, run_id, problem_id, device_id, candidate_id,
                              measurement_id, NULL);
}

int ardb_winner_set_ex(ardb *db, int64_t run_id, int64_t problem_id,
                       int64_t device_id, int64_t candidate_id,
                       int64_t measurement_id, const char *disturbance)
{
    /* The measurement must be an ok one of this candidate, problem and
     * device (from any run: the tuner's resume cache reuses old ones).
     * Setting a winner again for the same run replaces it, provisional
     * mark and evidence included: a winner timed again undisturbed is no
     * longer provisional. */
    static const char sql[] =
        "INSERT INTO winners(run_id, problem_id, device_id, candidate_id,"
        " measurement_id, created_at, provisional, disturbance)"
        " SELECT ?1, ?2, ?3, ?4, m.id, " ARDB_NOW ", ?6 IS NOT NULL, ?6"
        " FROM measurements m"
        " WHERE m.id = ?5 AND m.candidate_id = ?4 AND m.problem_id = ?2"
        " AND m.device_id = ?3 AND m.status = 'ok'"
        " ON CONFLICT(run_id, problem_id, device_id) DO UPDATE SET"
        " candidate_id = excluded.candidate_id,"
        " measurement_id = excluded.measurement_id,"
        " created_at = excluded.created_at,"
        " provisional = excluded.provisional,"
        " disturbance = excluded.disturbance";
    sqlite3_stmt *st;
    ardb_binder b;
    int code, rc;

    if (!db)
        return ARDB_EINVAL;
    /* A provisional winner says why: an empty account of the disturbance
     * would leave a reader with a mark and no evidence. */
    if (disturbance && !*disturbance)
        return ardb__fail(db, ARDB_EINVAL,
                          "winner set: a provisional winner needs the "
                          "disturbance that made it so");
    if ((code = ardb__check_writable(db)) ||
        (code = ardb__stmt(db, ST_WINNER_SET, sql, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_int64(&b, run_id);
    ardb__bind_int64(&b, problem_id);
    ardb__bind_int64(&b, device_id);
    ardb__bind_int64(&b, candidate_id);
    ardb__bind_int64(&b, measurement_id);
    ardb__bind_text(&b, disturbance);
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "winner set");
    rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
        return ardb__stmt_fail(db, st, rc, "winner set");
    ardb__release(st);
    if (sqlite3_changes(db->h) == 0)
        return ardb__fail(db, ARDB_EINVAL,
                          "winner set: measurement %" PRId64
                          " is not an ok measurement of candidate %" PRId64
                          ", problem %" PRId64 " and device %" PRId64,
                          measurement_id, candidate_id, problem_id, device_id);
    return ARDB_DONE;
}
