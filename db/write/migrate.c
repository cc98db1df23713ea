/*
 * migrate.c - schema deltas after v1 and the in-place migration, with a
 * backup, of files written by an older version.
 */
#include "migrate.h"
#include "schema_sql.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* v1 -> v2: every run gets an identity that survives export, import and
 * merge (runs.uid; a run recorded under v1 gets one derived from its start
 * time, host and id, new runs a random one), and a free-text note. The
 * trigger fills uid for writers that do not set it. */
static const char delta_v2[] =
    "ALTER TABLE runs ADD COLUMN uid TEXT;\n"
    "ALTER TABLE runs ADD COLUMN note TEXT;\n"
    "UPDATE runs SET uid = " ARDB_LEGACY_RUN_UID("runs") ";\n"
    ARDB_SQL_RUNS_UID_INDEX
    "UPDATE attnres_meta SET value = '2' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 2;\n";

/* v2 -> v3: a second ceiling per run, the measured read-only bandwidth
 * (runs.read_gbps, GB/s). On CPUs reads alone can be far below the copy
 * figure, so a ceiling taken from copy_gbps alone misjudges kernels that
 * mostly read; the run records both. Runs recorded before v3, and runs of
 * backends that do not measure it, hold NULL. */
static const char delta_v3[] =
    "ALTER TABLE runs ADD COLUMN read_gbps REAL;\n"
    "UPDATE attnres_meta SET value = '3' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 3;\n";

/* v3 -> v4: devices.simulated, 1 for a device that a stand-in driver
 * simulates (tests/cudasim: its timings are a model, not a measurement),
 * 0 for real hardware. A simulated device is a different device from a real
 * one even when every other field is equal, so the identity of a device
 * becomes (fingerprint, simulated). SQLite cannot change a UNIQUE
 * constraint in place, so the table is rebuilt with the same ids (every
 * reference to a device stays valid) and every device recorded before v4
 * is real. ardb__migrate runs this with foreign keys off, as SQLite's own
 * procedure for rebuilding a table requires, and checks them before it
 * commits; a new (empty) database runs it with them on, which is harmless
 * with no rows. */
static const char delta_v4[] =
    "CREATE TABLE ardb_v4_devices(\n"
    ARDB_SQL_DEVICE_COLUMNS_TO_DRIVER
    "  fingerprint TEXT NOT NULL,\n"
    "  created_at  TEXT NOT NULL,\n"
    "  simulated   INTEGER NOT NULL DEFAULT 0 CHECK(simulated IN (0, 1)),\n"
    "  UNIQUE(fingerprint, simulated)\n"
    ");\n"
    "INSERT INTO ardb_v4_devices(id, backend, name, arch, units, memory,\n"
    "  driver, fingerprint, created_at, simulated)\n"
    "  SELECT id, backend, name, arch, units, memory, driver, fingerprint,\n"
    "  created_at, 0 FROM devices ORDER BY id;\n"
    "DROP TABLE devices;\n"
    "ALTER TABLE ardb_v4_devices RENAME TO devices;\n"
    "CREATE INDEX devices_backend_arch ON devices(backend, arch);\n"
    "UPDATE attnres_meta SET value = '4' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 4;\n";

/* v4 -> v5: runs.owner, the process that records a run (db/write/liveness.c:
 * machine, boot, pid namespace, pid and the process's start time), so that
 * a run whose process was killed can be told from one still going and
 * marked 'interrupted' instead of staying 'running' forever. Runs recorded
 * before v5 have no owner and are left as they are: nothing says whether
 * their process is gone. */
static const char delta_v5[] =
    "ALTER TABLE runs ADD COLUMN owner TEXT;\n"
    "UPDATE attnres_meta SET value = '5' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 5;\n";

/* v5 -> v6: runs.ceilings, the device's ceilings as the run measured them
 * (JSON: every streaming kernel at every thread count, the FMA peak, the
 * largest cache, the write rate of the blend, and the out-of-cache check of
 * the run's winners; docs/design.md §2). copy_gbps and read_gbps stay the
 * best copy and read figures. Runs recorded before v6 hold NULL. */
static const char delta_v6[] =
    "ALTER TABLE runs ADD COLUMN ceilings TEXT;\n"
    "UPDATE attnres_meta SET value = '6' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 6;\n";

/* v6 -> v7: runs.stages, where the run's time went (JSON: seconds and
 * counts per stage, tuner/include/tune_stages.h). Runs recorded before v7,
 * and revalidation runs, hold NULL. */
static const char delta_v7[] =
    "ALTER TABLE runs ADD COLUMN stages TEXT;\n"
    "UPDATE attnres_meta SET value = '7' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 7;\n";

/* v7 -> v8: measurements.final_round, 1 for a timing taken in the
 * interleaved final round of a problem (the tuner's most trustworthy one,
 * which a resumed run decides from), 0 for any other. Before v8 the mark
 * was only the message's first word ("final ..."); a migrated file gets the
 * flag from it. Measurements are append-only, so the trigger that refuses
 * updates steps aside for this one and is put back as it was. */
static const char delta_v8[] =
    "ALTER TABLE measurements ADD COLUMN final_round INTEGER NOT NULL\n"
    "  DEFAULT 0 CHECK(final_round IN (0, 1));\n"
    "DROP TRIGGER measurements_append_only;\n"
    "UPDATE measurements SET final_round = " ARDB_LEGACY_FINAL_ROUND("message") ";\n"
    ARDB_SQL_MEASUREMENTS_APPEND_ONLY
    "UPDATE attnres_meta SET value = '8' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 8;\n";

/* v8 -> v9: winners.provisional and winners.disturbance. A winner is
 * provisional when the final round that chose it was disturbed by other
 * work on the machine on every try (tuner/include/disturbance.h): the
 * choice may be the noise's, so `attnres db show` and the runtime's plan
 * explanation say so, and `attnres tune --revalidate` decides it again.
 * disturbance is the evidence, what the last try showed; NULL for a winner
 * that is not provisional. Winners recorded before v9 were not watched and
 * are not provisional. */
static const char delta_v9[] =
    "ALTER TABLE winners ADD COLUMN provisional INTEGER NOT NULL\n"
    "  DEFAULT 0 CHECK(provisional IN (0, 1));\n"
    "ALTER TABLE winners ADD COLUMN disturbance TEXT;\n"
    "UPDATE attnres_meta SET value = '9' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 9;\n";

/* v9 -> v10: measurements.status accepts 'nondeterministic', for a
 * candidate whose two runs on the same inputs differ in some bit (the
 * backward's determinism check); until v10 it was recorded as
 * 'wrong_result' with a message starting "nondeterministic:", and those
 * rows stay as they are, since the message alone is what they hold.
 * SQLite cannot change a CHECK constraint in place, so the table is
 * rebuilt as v4 rebuilds devices: the same columns in the same order and
 * the same ids (winners refer to measurements by id), its indexes and the
 * append-only trigger recreated, with foreign keys off while it runs and
 * checked before the migration commits (ardb__migrate). */
static const char delta_v10[] =
    "CREATE TABLE ardb_v10_measurements(\n"
    ARDB_SQL_MEASUREMENT_COLUMNS_TO_STATUS ",\n"
    "                 'nondeterministic')),\n"
    ARDB_SQL_MEASUREMENT_COLUMNS_AFTER_STATUS ",\n"
    "  final_round  INTEGER NOT NULL DEFAULT 0 CHECK(final_round IN (0, 1))\n"
    ");\n"
    "INSERT INTO ardb_v10_measurements(id, run_id, candidate_id, problem_id,\n"
    "  device_id, build_key, status, median_us, min_us, max_us, spread_us,\n"
    "  reps, gbps, roofline, rel_err, message, created_at, final_round)\n"
    "  SELECT id, run_id, candidate_id, problem_id, device_id, build_key,\n"
    "  status, median_us, min_us, max_us, spread_us, reps, gbps, roofline,\n"
    "  rel_err, message, created_at, final_round FROM measurements\n"
    "  ORDER BY id;\n"
    "DROP TABLE measurements;\n"
    "ALTER TABLE ardb_v10_measurements RENAME TO measurements;\n"
    ARDB_SQL_MEASUREMENTS_INDEXES
    "UPDATE attnres_meta SET value = '10' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 10;\n";

/* v10 -> v11: measurements.roofline becomes measurements.ceiling_fraction,
 * the project's one word for the idea; the values stay as they are. SQLite
 * renames the column in place, in the table, its indexes and triggers.
 * Readers of an older file opened read-only use the older name
 * (ARDB_CEILING_FRACTION_PRE_V11). */
static const char delta_v11[] =
    "ALTER TABLE measurements RENAME COLUMN " ARDB_CEILING_FRACTION_PRE_V11 " TO ceiling_fraction;\n"
    "UPDATE attnres_meta SET value = '11' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 11;\n";

typedef struct delta {
    int64_t to;
    const char *sql;
} delta;

static const delta deltas[] = {{2, delta_v2}, {3, delta_v3}, {4, delta_v4}, {5, delta_v5}, {6, delta_v6},
                                {7, delta_v7}, {8, delta_v8}, {9, delta_v9}, {10, delta_v10},
                                {11, delta_v11}};

int ardb__schema_upgrade(ardb *db, int64_t from)
{
    size_t i;
    for (i = 0; i < sizeof deltas / sizeof deltas[0]; i++) {
        int rc;
        if (deltas[i].to <= from)
            continue;
        rc = sqlite3_exec(db->h, deltas[i].sql, NULL, NULL, NULL);
        if (rc != SQLITE_OK)
            return ardb__fail(db, ardb__map_rc(rc),
                              "cannot upgrade %s to schema version %lld: %s",
                              db->path, (long long)deltas[i].to,
                              sqlite3_errmsg(db->h));
    }
    return ARDB_DONE;
}

/* Copies the committed state of the file to a new backup file through a
 * second, read-only connection: the caller holds the write lock, so that
 * state cannot change, and readers are not blocked by it. */
static int backup_file(ardb *db, int64_t from, char *bak, size_t bak_len)
{
    sqlite3 *src = NULL, *dst = NULL;
    sqlite3_backup *b;
    struct stat sb;
    int rc, k;

    for (k = 1; k < 100; k++) {
        if (k == 1)
            snprintf(bak, bak_len, "%s.v%lld.bak", db->path, (long long)from);
        else
            snprintf(bak, bak_len, "%s.v%lld.bak.%d", db->path,
                     (long long)from, k);
        if (stat(bak, &sb) != 0 && errno == ENOENT)
            break;
    }
    if (k == 100)
        return ardb__fail(db, ARDB_ESQL,
                          "cannot migrate %s: no free backup file name", db->path);
    rc = sqlite3_open_v2(db->path, &src, SQLITE_OPEN_READONLY, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_open_v2(bak, &dst,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL);
    if (rc == SQLITE_OK) {
        b = sqlite3_backup_init(dst, "main", src, "main");
        if (!b) {
            rc = sqlite3_errcode(dst);
        } else {
            rc = sqlite3_backup_step(b, -1);
            if (rc == SQLITE_DONE)
                rc = SQLITE_OK;
            if (sqlite3_backup_finish(b) != SQLITE_OK && rc == SQLITE_OK)
                rc = sqlite3_errcode(dst);
        }
    }
    if (rc != SQLITE_OK) {
        int code = ardb__fail(db, ardb__map_rc(rc),
                              "cannot migrate %s: writing the backup %s "
                              "failed: %s",
                              db->path, bak,
                              dst ? sqlite3_errmsg(dst) : src ? sqlite3_errmsg(src)
                                                              : "cannot open");
        sqlite3_close(dst);
        sqlite3_close(src);
        remove(bak);
        return code;
    }
    /* The backup keeps the journal mode of the original (WAL); closing it
     * folds its WAL into the file so that one file is the whole backup. */
    rc = sqlite3_close(dst);
    sqlite3_close(src);
    if (rc != SQLITE_OK) {
        remove(bak);
        return ardb__fail(db, ARDB_ESQL, "cannot migrate %s: closing the "
                                         "backup %s failed",
                          db->path, bak);
    }
    return ARDB_DONE;
}

/* Notes the migration in attnres_meta: when, from which version, and
 * where the backup is. */
static int note_migration(ardb *db, int64_t from, const char *bak)
{
    static const char sql[] =
        "INSERT INTO attnres_meta(key, value) VALUES(?1, " ARDB_NOW
        " || ' backup ' || ?2) ON CONFLICT(key) DO UPDATE SET"
        " value = excluded.value";
    char key[64];
    sqlite3_stmt *st = NULL;
    int rc;
    snprintf(key, sizeof key, "migrated_from_v%lld", (long long)from);
    rc = sqlite3_prepare_v2(db->h, sql, -1, &st, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 1, key, -1, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_text(st, 2, bak, -1, SQLITE_TRANSIENT);
    if (rc == SQLITE_OK && (rc = sqlite3_step(st)) == SQLITE_DONE)
        rc = SQLITE_OK;
    sqlite3_finalize(st);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, "cannot record the migration");
    return ARDB_DONE;
}

/* Fails the migration when a row refers to a row that does not exist: a
 * rebuilt table must keep every id that others refer to. */
static int check_foreign_keys(ardb *db)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db->h, "PRAGMA foreign_key_check", -1, &st,
                                NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        const char *table = (const char *)sqlite3_column_text(st, 0);
        int code = ardb__fail(db, ARDB_ESQL,
                              "cannot migrate %s: a row of %s refers to a "
                              "missing row after the upgrade",
                              db->path, table ? table : "?");
        sqlite3_finalize(st);
        return code;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE)
        return ardb__sql_fail(db, rc, "cannot check the migrated file");
    return ARDB_DONE;
}

static int migrate_locked(ardb *db, int64_t from);

int ardb__migrate(ardb *db, int64_t from)
{
    int code, rc;
    /* A delta may rebuild a table that others refer to (v4 rebuilds
     * devices, v10 measurements); SQLite's procedure for that runs with foreign keys off,
     * which can only be switched outside a transaction. migrate_locked
     * checks the references itself before it commits. */
    rc = sqlite3_exec(db->h, "PRAGMA foreign_keys = OFF", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, "cannot migrate");
    code = migrate_locked(db, from);
    rc = sqlite3_exec(db->h, "PRAGMA foreign_keys = ON", NULL, NULL, NULL);
    if (rc != SQLITE_OK && code == ARDB_DONE)
        code = ardb__sql_fail(db, rc, "cannot migrate");
    return code;
}

static int migrate_locked(ardb *db, int64_t from)
{
    char bak[4200];
    int64_t now = from;
    int rc, code;

    rc = sqlite3_exec(db->h, "BEGIN IMMEDIATE", NULL, NULL, NULL);
    if (rc != SQLITE_OK)
        return ardb__fail(db, ardb__map_rc(rc), "cannot migrate %s: %s",
                          db->path, sqlite3_errmsg(db->h));
    /* Another process may have migrated the file since it was read. */
    if ((code = ardb__user_version(db, "main", &now)))
        goto fail;
    if (now >= ARDB_SCHEMA_VERSION) {
        rc = sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL);
        return rc == SQLITE_OK ? ARDB_DONE : ardb__sql_fail(db, rc, "commit");
    }
    if ((code = backup_file(db, now, bak, sizeof bak)))
        goto fail;
    if ((code = ardb__schema_upgrade(db, now)) ||
        (code = check_foreign_keys(db)) ||
        (code = note_migration(db, now, bak)))
        goto fail_backup;
    rc = sqlite3_exec(db->h, "COMMIT", NULL, NULL, NULL);
    if (rc != SQLITE_OK) {
        code = ardb__fail(db, ardb__map_rc(rc), "cannot migrate %s: %s",
                          db->path, sqlite3_errmsg(db->h));
        goto fail_backup;
    }
    return ARDB_DONE;
fail_backup:
    /* The file stays as it was, so its copy is not needed. */
    remove(bak);
fail:
    if (!sqlite3_get_autocommit(db->h))
        (void)sqlite3_exec(db->h, "ROLLBACK", NULL, NULL, NULL);
    return code;
}
