/*
 * schema_sql.h - the pieces of the schema's DDL that more than one schema
 * version states: the v1 tables that a later version rebuilds (devices in
 * v4; measurements in v10, which only widens the status check), v2's uid
 * index, and the tests that rebuild an older file. One
 * text serves them all, so that a rebuilt table is byte for byte the one
 * it stands for. Internal to db/ and its tests.
 */
#ifndef ARDB_SCHEMA_SQL_H
#define ARDB_SCHEMA_SQL_H

/* The columns of the devices table up to the driver, in v1 and in the v4
 * rebuild. */
#define ARDB_SQL_DEVICE_COLUMNS_TO_DRIVER      \
    "  id          INTEGER PRIMARY KEY,\n"    \
    "  backend     TEXT NOT NULL,\n"          \
    "  name        TEXT,\n"                   \
    "  arch        TEXT,\n"                   \
    "  units       INTEGER,\n"                \
    "  memory      INTEGER,\n"                \
    "  driver      TEXT,\n"

/* Schema v2's unique index on runs.uid and the trigger that gives a run
 * inserted without one a random uid. */
#define ARDB_SQL_RUNS_UID_INDEX                                                  \
    "CREATE UNIQUE INDEX runs_uid ON runs(uid);\n"                              \
    "CREATE TRIGGER runs_uid_default AFTER INSERT ON runs\n"                    \
    "WHEN NEW.uid IS NULL BEGIN\n"                                              \
    "  UPDATE runs SET uid = lower(hex(randomblob(16))) WHERE id = NEW.id;\n"   \
    "END;\n"

/* The measurements columns up to the status check, whose list of statuses stays open:
 * v1 closes it after 'timeout', v10 adds 'nondeterministic'. */
#define ARDB_SQL_MEASUREMENT_COLUMNS_TO_STATUS                               \
    "  id           INTEGER PRIMARY KEY,\n"                                  \
    "  run_id       INTEGER NOT NULL REFERENCES runs(id),\n"                 \
    "  candidate_id INTEGER NOT NULL REFERENCES candidates(id),\n"           \
    "  problem_id   INTEGER NOT NULL REFERENCES problems(id),\n"             \
    "  device_id    INTEGER NOT NULL REFERENCES devices(id),\n"              \
    "  build_key    TEXT,\n"                                                 \
    "  status       TEXT NOT NULL CHECK(status IN ('ok','compile_failed',\n" \
    "                 'launch_failed','wrong_result','skipped','timeout'"

/* The columns after the status, up to created_at (no comma after it). */
#define ARDB_SQL_MEASUREMENT_COLUMNS_AFTER_STATUS \
    "  median_us    REAL,\n"                      \
    "  min_us       REAL,\n"                      \
    "  max_us       REAL,\n"                      \
    "  spread_us    REAL,\n"                      \
    "  reps         INTEGER,\n"                   \
    "  gbps         REAL,\n"                      \
    "  roofline     REAL,\n"                      \
    "  rel_err      REAL,\n"                      \
    "  message      TEXT,\n"                      \
    "  created_at   TEXT NOT NULL"

/* The trigger that keeps measurements append-only. */
#define ARDB_SQL_MEASUREMENTS_APPEND_ONLY                                \
    "CREATE TRIGGER measurements_append_only BEFORE UPDATE ON measurements\n" \
    "BEGIN SELECT RAISE(ABORT, 'measurements are append-only'); END;\n"

/* The indexes and the trigger of the measurements table. */
#define ARDB_SQL_MEASUREMENTS_INDEXES                                        \
    "CREATE INDEX measurements_key ON measurements(candidate_id, problem_id,\n" \
    "                                              device_id, build_key);\n" \
    "CREATE INDEX measurements_run ON measurements(run_id);\n"               \
    ARDB_SQL_MEASUREMENTS_APPEND_ONLY

#endif
