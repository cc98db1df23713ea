/*
 * schema.c - the creation of the tuning database schema: the v1 DDL (later
 * versions are the deltas of migrate.c), run on a new file, and the
 * migration of an older one, when a writer opens it.
 */
#include "migrate.h"
#include "schema_sql.h"

#include <string.h>

/* Schema v1, exactly as version 1 wrote it; a new database runs it and
 * then the deltas of migrate.c up to ARDB_SCHEMA_VERSION. Tables are
 * append-only by convention (history is compared across runs);
 * measurements are protected by a trigger. Times are ISO-8601 UTC text
 * written by the access layer. */
static const char schema_v1[] =
    "CREATE TABLE attnres_meta(\n"
    "  key   TEXT PRIMARY KEY NOT NULL,\n"
    "  value TEXT\n"
    ");\n"
    "CREATE TABLE devices(\n"
    ARDB_SQL_DEVICE_COLUMNS_TO_DRIVER
    "  fingerprint TEXT NOT NULL UNIQUE,\n"
    "  created_at  TEXT NOT NULL\n"
    ");\n"
    "CREATE INDEX devices_backend_arch ON devices(backend, arch);\n"
    "CREATE TABLE runs(\n"
    "  id              INTEGER PRIMARY KEY,\n"
    "  started_at      TEXT NOT NULL,\n"
    "  finished_at     TEXT,\n"
    "  status          TEXT NOT NULL DEFAULT 'running' CHECK(status IN\n"
    "                    ('running','complete','failed','interrupted')),\n"
    "  user            TEXT,\n"
    "  host            TEXT,\n"
    "  command         TEXT,\n"
    "  project_version TEXT,\n"
    "  templates_hash  TEXT,\n"
    "  compiler        TEXT,\n"
    "  driver          TEXT,\n"
    "  device_id       INTEGER REFERENCES devices(id),\n"
    "  policy_json     TEXT,\n"
    "  strategy        TEXT,\n"
    "  copy_gbps       REAL,\n"
    "  launch_us       REAL\n"
    ");\n"
    "CREATE TABLE problems(\n"
    "  id       INTEGER PRIMARY KEY,\n"
    "  key      TEXT NOT NULL UNIQUE,\n"
    "  op       TEXT NOT NULL,\n"
    "  dtype    TEXT NOT NULL,\n"
    "  form     TEXT NOT NULL,\n"
    "  d        INTEGER NOT NULL,\n"
    "  n        INTEGER NOT NULL,\n"
    "  heads    INTEGER NOT NULL,\n"
    "  epilogue INTEGER NOT NULL,\n"
    "  s        INTEGER NOT NULL,\n"
    "  t_bucket INTEGER NOT NULL\n"
    ");\n"
    "CREATE INDEX problems_shape ON problems(op, dtype, form, d, n, heads,\n"
    "                                        epilogue, s, t_bucket);\n"
    "CREATE TABLE candidates(\n"
    "  id            INTEGER PRIMARY KEY,\n"
    "  backend       TEXT,\n"
    "  template_name TEXT,\n"
    "  variant       TEXT NOT NULL,\n"
    "  params_json   TEXT,\n"
    "  source_hash   TEXT NOT NULL,\n"
    "  source        TEXT,\n"
    "  kernel_name   TEXT,\n"
    "  created_at    TEXT NOT NULL,\n"
    "  UNIQUE(variant, source_hash)\n"
    ");\n"
    "CREATE TABLE binaries(\n"
    "  build_key      TEXT PRIMARY KEY NOT NULL,\n"
    "  candidate_id   INTEGER REFERENCES candidates(id),\n"
    "  compiler       TEXT,\n"
    "  options        TEXT,\n"
    "  target         TEXT,\n"
    "  blob           BLOB NOT NULL,\n"
    "  resources_json TEXT,\n"
    "  created_at     TEXT NOT NULL\n"
    ");\n"
    "CREATE INDEX binaries_candidate ON binaries(candidate_id);\n"
    "CREATE TABLE measurements(\n"
    ARDB_SQL_MEASUREMENT_COLUMNS_TO_STATUS ")),\n"
    ARDB_SQL_MEASUREMENT_COLUMNS_AFTER_STATUS "\n"
    ");\n"
    ARDB_SQL_MEASUREMENTS_INDEXES
    "CREATE TABLE winners(\n"
    "  run_id         INTEGER NOT NULL REFERENCES runs(id),\n"
    "  problem_id     INTEGER NOT NULL REFERENCES problems(id),\n"
    "  device_id      INTEGER NOT NULL REFERENCES devices(id),\n"
    "  candidate_id   INTEGER NOT NULL REFERENCES candidates(id),\n"
    "  measurement_id INTEGER NOT NULL REFERENCES measurements(id),\n"
    "  created_at     TEXT NOT NULL,\n"
    "  PRIMARY KEY(run_id, problem_id, device_id)\n"
    ");\n"
    "CREATE INDEX winners_problem ON winners(problem_id, device_id, run_id);\n"
    "INSERT INTO attnres_meta(key, value) VALUES\n"
    "  ('format', '" ARDB_FORMAT_MAGIC "'),\n"
    "  ('schema_version', '1'),\n"
    "  ('created_at', " ARDB_NOW ");\n"
    "PRAGMA user_version = 1;\n";

static int exec(ardb *db, const char *sql, const char *what)
{
    int rc = sqlite3_exec(db->h, sql, NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, what);
    return ARDB_DONE;
}

static int create_schema(ardb *db, schema_state *s)
{
    int code;
    if ((code = exec(db, "BEGIN IMMEDIATE", "cannot create the schema")))
        return code;
    /* Another process may have created it since it was read. */
    if ((code = ardb__schema_read(db, s)))
        goto fail;
    if (s->objects == 0 && s->user_version == 0) {
        if ((code = exec(db, schema_v1, "cannot create the schema")) ||
            (code = ardb__schema_upgrade(db, 1)))
            goto fail;
        if ((code = ardb__schema_read(db, s)))
            goto fail;
    }
    if ((code = exec(db, "COMMIT", "cannot create the schema")))
        goto fail;
    return ARDB_DONE;
fail:
    if (!sqlite3_get_autocommit(db->h))
        (void)sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    return code;
}

int ardb__schema_init(ardb *db, int create)
{
    schema_state s;
    int code = ardb__schema_read(db, &s);
    if (code)
        return code;
    if (s.objects == 0 && s.user_version == 0 && create &&
        (code = create_schema(db, &s)))
        return code;
    if ((code = ardb__schema_check(db, &s)))
        return code;
    /* An older file is migrated in place, with a backup. */
    if (s.user_version < ARDB_SCHEMA_VERSION)
        return ardb__migrate(db, s.user_version);
    return ARDB_DONE;
}
