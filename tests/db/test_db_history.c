/*
 * test_db_history.c - unit tests of the history layer of the tuning
 * database: run listings and resolution, comparisons (diff, the noise rule,
 * regression classes), migration of a v1 file, merge, JSON/CSV export and
 * import, and the stored winners that a re-validation re-measures.
 *
 * argv[1] is tests/db/fixtures/db_v1.sql, a database as schema v1 wrote
 * it. Every file lives in a fresh mkdtemp directory, removed at the end.
 */
#define _GNU_SOURCE /* nftw, FTW_PHYS */
#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "check.h"
#include "schema_sql.h"
#include "test_buffer.h"
#include "test_db_scratch.h"
#include "test_files.h"
#include "test_scratch.h"
#include "test_sqlite.h"

static char *fixture_sql;

/* ---- helpers ---------------------------------------------------------------- */


/* Writes the v1 fixture to tmpdir/name; path gets its full path. */
static int make_v1(const char *name, char *path, size_t len)
{
    path_in_tmp(path, len, name);
    return raw_exec(path, fixture_sql) == SQLITE_OK ? 0 : -1;
}

/* Writes the v1 fixture migrated to v2 exactly as a build of schema v2
 * did it: the v2 delta of db/write/migrate.c, with the uid it derived
 * spelled out here, so that the file stays what v2 wrote whatever later
 * code derives. */
static int make_v2(const char *name, char *path, size_t len)
{
    static const char delta_v2[] =
        "ALTER TABLE runs ADD COLUMN uid TEXT;\n"
        "ALTER TABLE runs ADD COLUMN note TEXT;\n"
        "UPDATE runs SET uid = printf('v1:%s:%s:%d', runs.started_at,"
        " COALESCE(runs.host, ''), runs.id);\n"
        ARDB_SQL_RUNS_UID_INDEX
        "UPDATE attnres_meta SET value = '2' WHERE key = 'schema_version';\n"
        "PRAGMA user_version = 2;\n";
    if (make_v1(name, path, len))
        return -1;
    return raw_exec(path, delta_v2) == SQLITE_OK ? 0 : -1;
}

/* Collects the rows of a listing as "a|b|c\n" lines and its header. */
typedef struct listing {
    char text[4096], header[256];
    int count;
} listing;

static int collect(void *ctx, int ncol, const char *const *names, const char *const *values)
{
    listing *l = ctx;
    size_t len;
    int i;
    if (!l->header[0])
        for (i = 0; i < ncol; i++) {
            len = strlen(l->header);
            snprintf(l->header + len, sizeof l->header - len, "%s%s", i ? "," : "", names[i]);
        }
    for (i = 0; i < ncol; i++) {
        len = strlen(l->text);
        snprintf(l->text + len, sizeof l->text - len, "%s%s", i ? "|" : "", values[i]);
    }
    len = strlen(l->text);
    snprintf(l->text + len, sizeof l->text - len, "\n");
    l->count++;
    return 0;
}

static int failing_write(void *ctx, const void *data, size_t len)
{
    (void)ctx;
    (void)data;
    (void)len;
    return -1;
}

static int stats_zero(const ardb_merge_stats *s)
{
    return s->devices == 0 && s->problems == 0 && s->candidates == 0 && s->binaries == 0 && s->runs == 0 &&
           s->measurements == 0 && s->winners == 0;
}

/* Records one ok measurement and makes it the run's winner. */
static int64_t add_winner(ardb *db, int64_t run, int64_t cand, int64_t prob, int64_t dev, double us, double spread)
{
    ardb_measurement m = {.run_id = run, .candidate_id = cand, .problem_id = prob, .device_id = dev,
                          .build_key = "bk", .status = ARDB_STATUS_OK, .median_us = us, .min_us = us,
                          .max_us = us, .spread_us = spread, .reps = 10, .gbps = 1, .ceiling_fraction = 0.5,
                          .rel_err = 0};
    int64_t mid = 0;
    if (ardb_measurement_add(db, &m, &mid) != ARDB_DONE)
        return 0;
    if (ardb_winner_set(db, run, prob, dev, cand, mid) != ARDB_DONE)
        return 0;
    return mid;
}

/* ---- classification --------------------------------------------------------- */

static ardb_diff_row row(double a, double sa, double b, double sb)
{
    ardb_diff_row r;
    memset(&r, 0, sizeof r);
    r.winner_a = r.winner_b = r.tried_a = r.tried_b = 1;
    r.us_a = a;
    r.us_b = b;
    r.spread_a = sa;
    r.spread_b = sb;
    return r;
}

static void test_classify_noise_and_threshold(void)
{
    ardb_diff_row r = row(100, 1, 110, 1);
    /* 10% slower, 10 us apart, noise 3 x 2 = 6 us: a regression at 5%. */
    CHECK(ardb_diff_beyond_noise(&r));
    CHECK(ardb_diff_classify(&r, 5) == ARDB_CHANGE_SLOWER);
    /* ...not at a threshold of 20%. */
    CHECK(ardb_diff_classify(&r, 20) == ARDB_CHANGE_SAME);
    /* Within the noise: 3 x (2 + 2) = 12 us > 10 us, whatever the threshold. */
    r = row(100, 2, 110, 2);
    CHECK(!ardb_diff_beyond_noise(&r));
    CHECK(ardb_diff_classify(&r, 0) == ARDB_CHANGE_SAME);
    /* The noise rule is strict: exactly 3 x the spreads is not beyond. */
    r = row(100, 1, 106, 1);
    CHECK(!ardb_diff_beyond_noise(&r));
    /* Faster, symmetric. */
    r = row(110, 1, 100, 1);
    CHECK(ardb_diff_classify(&r, 5) == ARDB_CHANGE_FASTER);
    /* Unknown spreads count as zero. */
    r = row(100, NAN, 101, NAN);
    CHECK(ardb_diff_beyond_noise(&r));
    CHECK(ardb_diff_classify(&r, 5) == ARDB_CHANGE_SAME);
    CHECK(ardb_diff_classify(&r, 0.5) == ARDB_CHANGE_SLOWER);
    /* Lost, missing, new. */
    r = row(100, 1, NAN, NAN);
    r.winner_b = 0;
    CHECK(ardb_diff_classify(&r, 5) == ARDB_CHANGE_LOST);
    r.tried_b = 0;
    CHECK(ardb_diff_classify(&r, 5) == ARDB_CHANGE_MISSING);
    CHECK(!ardb_diff_beyond_noise(&r));
    r = row(NAN, NAN, 100, 1);
    r.winner_a = 0;
    CHECK(ardb_diff_classify(&r, 5) == ARDB_CHANGE_NEW);
    CHECK(strcmp(ardb_change_name(ARDB_CHANGE_LOST), "lost") == 0);
    CHECK(strcmp(ardb_change_name((ardb_change)99), "unknown") == 0);
}

/* ---- migration ---------------------------------------------------------------- */

static void test_v1_file_read_only_then_migrated(void)
{
    char path[600], bak[700], msg[700], sql[160];
    REQUIRE(make_v1("v1.db", path, sizeof path) == 0);
    snprintf(bak, sizeof bak, "%s.v1.bak", path);

    /* Read-only: read as it is, never written. */
    ardb *db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    ardb_run_info *runs = NULL;
    size_t n = 0;
    CHECK(ardb_run_list(db, &runs, &n) == ARDB_DONE && n == 2);
    if (n == 2) {
        CHECK(strcmp(runs[0].uid, "v1:2025-01-01T10:00:00.000Z:builder:1") == 0);
        CHECK(runs[0].note == NULL);
        CHECK(runs[0].measurements == 2 && runs[0].winners == 2);
        CHECK(strcmp(runs[1].driver, "5.11") == 0);
        CHECK(strcmp(runs[1].device_fingerprint, "cpu|Old CPU|x86_64-avx2|8|17179869184|5.10") == 0);
        CHECK(runs[1].copy_gbps == 20.0);
        CHECK(isnan(runs[0].read_gbps) && isnan(runs[1].read_gbps));
    }
    ardb_run_infos_free(runs, n);
    {
        /* The listing has the columns of the current version; a v1 file
         * has no read bandwidth, so it is empty. */
        listing l = {0};
        CHECK(ardb_list_runs(db, collect, &l) == ARDB_DONE && l.count == 2);
        CHECK(strcmp(l.header, "id,started_at,finished_at,status,device,strategy,project_version,compiler,"
                               "copy_gbps,read_gbps") == 0);
        CHECK(strstr(l.text, "|20.0|\n") != NULL);
    }
    CHECK(ardb_run_set_note(db, 1, "x") == ARDB_EREADONLY);
    CHECK(closed_untouched(db, path, bak, 1));

    /* Read-write: migrated in place, with a backup of the v1 file. */
    db = open_migrated(path, bak, 1);
    REQUIRE(db != NULL);
    CHECK(raw_int(bak, "SELECT count(*) FROM measurements") == 4);
    CHECK(raw_int(bak, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'uid'") == 0);
    CHECK(raw_int(path, "SELECT count(*) FROM measurements") == 4);
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE uid = 'v1:2025-02-01T10:00:00.000Z:builder:2'") == 1);
    /* v3: the read bandwidth column, NULL for the runs recorded before;
     * v4: every device recorded before is real hardware. */
    CHECK(raw_int(path, "PRAGMA user_version") == ARDB_SCHEMA_VERSION);
    CHECK(raw_int(path, "SELECT count(*) FROM devices WHERE simulated = 0") ==
          raw_int(bak, "SELECT count(*) FROM devices"));
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'read_gbps'") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE read_gbps IS NULL") == 2);
    char *v = NULL;
    CHECK(ardb_meta_get(db, "schema_version", &v) == ARDB_DONE && v && atoi(v) == ARDB_SCHEMA_VERSION);
    free(v);
    v = NULL;
    CHECK(ardb_meta_get(db, "migrated_from_v1", &v) == ARDB_DONE && v && strstr(v, "backup") &&
          strstr(v, "v1.db.v1.bak"));
    free(v);
    CHECK(ardb_meta_get(db, "no such key", &v) == ARDB_ENOTFOUND);
    /* v2 works: notes, and new runs get a random uid; v3: and a read
     * bandwidth. */
    CHECK(ardb_run_set_note(db, 1, "driver 5.10") == ARDB_DONE);
    CHECK(ardb_run_set_note(db, 99, "x") == ARDB_ENOTFOUND);
    ardb_run r = {.device_id = 1, .strategy = "exhaustive", .read_gbps = 27.5};
    int64_t id = 0;
    CHECK(ardb_run_begin(db, &r, &id) == ARDB_DONE && id == 3);
    ardb_run_info info;
    CHECK(ardb_run_get(db, 3, &info) == ARDB_DONE);
    CHECK(info.uid && strlen(info.uid) == 32 && strspn(info.uid, "0123456789abcdef") == 32);
    CHECK(info.read_gbps == 27.5);
    ardb_run_info_clear(&info);
    CHECK(ardb_run_get(db, 2, &info) == ARDB_DONE && isnan(info.read_gbps) && info.copy_gbps == 20.0);
    ardb_run_info_clear(&info);
    CHECK(ardb_run_get(db, 1, &info) == ARDB_DONE && info.note && strcmp(info.note, "driver 5.10") == 0);
    ardb_run_info_clear(&info);
    CHECK(ardb_run_get(db, 42, &info) == ARDB_ENOTFOUND);
    ardb_close(db);
    /* Opening again migrates nothing more. */
    db = open_db(path, 0);
    CHECK(db != NULL);
    ardb_close(db);
    snprintf(msg, sizeof msg, "%s.v2.bak", path);
    CHECK(!file_exists(msg));
    snprintf(msg, sizeof msg, "%s.v3.bak", path);
    CHECK(!file_exists(msg));
    snprintf(msg, sizeof msg, "%s.v4.bak", path);
    CHECK(!file_exists(msg));

    /* A taken backup name: the next free one is used, the old file kept. */
    REQUIRE(make_v1("v1b.db", path, sizeof path) == 0);
    snprintf(bak, sizeof bak, "%s.v1.bak", path);
    FILE *f = fopen(bak, "w");
    REQUIRE(f != NULL);
    fputs("an older backup\n", f);
    fclose(f);
    db = open_db(path, ARDB_CREATE);
    CHECK(db != NULL);
    ardb_close(db);
    snprintf(msg, sizeof msg, "%s.v1.bak.2", path);
    CHECK(file_exists(msg));
    CHECK(raw_int(msg, "PRAGMA user_version") == 1);
    char *old = file_read(bak);
    CHECK(old && strcmp(old, "an older backup\n") == 0);
    free(old);

    /* A migration that fails leaves the file as it was, and no backup. */
    REQUIRE(make_v1("v1c.db", path, sizeof path) == 0);
    REQUIRE(raw_exec(path, "CREATE INDEX runs_uid ON runs(host);") == SQLITE_OK);
    snprintf(bak, sizeof bak, "%s.v1.bak", path);
    db = (ardb *)1;
    CHECK(ardb_open(path, 0, &db, msg, sizeof msg) != ARDB_DONE && db == NULL);
    CHECK(strstr(msg, "cannot upgrade") != NULL);
    CHECK(raw_int(path, "PRAGMA user_version") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'uid'") == 0);
    CHECK(!file_exists(bak));

    /* A newer file is refused, read-only or not, and left alone. */
    REQUIRE(make_v1("newer.db", path, sizeof path) == 0);
    snprintf(sql, sizeof sql, "PRAGMA user_version = %d;", ARDB_SCHEMA_VERSION + 1);
    REQUIRE(raw_exec(path, sql) == SQLITE_OK);
    db = (ardb *)1;
    CHECK(ardb_open(path, 0, &db, msg, sizeof msg) == ARDB_ENEWER && db == NULL);
    snprintf(sql, sizeof sql, "database schema version %d is newer than this build (%d)", ARDB_SCHEMA_VERSION + 1,
             ARDB_SCHEMA_VERSION);
    CHECK(strstr(msg, sql) != NULL);
    CHECK(ardb_open(path, ARDB_READONLY, &db, msg, sizeof msg) == ARDB_ENEWER);
    CHECK(raw_int(path, "PRAGMA user_version") == ARDB_SCHEMA_VERSION + 1);
}

/* The fixture is what version 1 wrote, so it holds the schema's history:
 * the pieces of the v1 DDL that a later version shares
 * (db/write/schema_sql.h: the v4 and v10 rebuilds take the columns from
 * them) are its statements to the letter, and a new file and the fixture
 * migrated have the same schema, object by object and to the letter of
 * the SQL that SQLite keeps. */
static void test_schema_is_what_v1_wrote_and_its_migrations_made(void)
{
    static const char schema[] = "SELECT group_concat(object, char(10)) FROM (SELECT type || '|' || name || '|' ||"
                                 " tbl_name || '|' || IFNULL(sql, '') AS object FROM sqlite_schema"
                                 " ORDER BY type, name)";
    static const char measurements_v1[] = "CREATE TABLE measurements(\n" ARDB_SQL_MEASUREMENT_COLUMNS_TO_STATUS ")),\n"
                                          ARDB_SQL_MEASUREMENT_COLUMNS_AFTER_STATUS "\n)";
    static const char devices_v1[] = "CREATE TABLE devices(\n" ARDB_SQL_DEVICE_COLUMNS_TO_DRIVER;
    static const char *const measurement_objects[] = {"measurements_key", "measurements_run",
                                                      "measurements_append_only"};
    char path[600], fresh[600], sql[160];
    REQUIRE(make_v1("v1-schema.db", path, sizeof path) == 0);
    char *text = raw_text(path, "SELECT sql FROM sqlite_schema WHERE name = 'measurements'");
    CHECK(text && strcmp(text, measurements_v1) == 0);
    free(text);
    text = raw_text(path, "SELECT sql FROM sqlite_schema WHERE name = 'devices'");
    CHECK(text && strncmp(text, devices_v1, strlen(devices_v1)) == 0);
    free(text);
    for (size_t i = 0; i < sizeof measurement_objects / sizeof measurement_objects[0]; i++) {
        snprintf(sql, sizeof sql, "SELECT sql || ';' || char(10) FROM sqlite_schema WHERE name = '%s'",
                 measurement_objects[i]);
        text = raw_text(path, sql);
        CHECK(text && strstr(ARDB_SQL_MEASUREMENTS_INDEXES, text));
        free(text);
    }

    ardb *db = open_db(path, 0);
    REQUIRE(db != NULL);
    ardb_close(db);
    db = create_db("new-schema.db", fresh, sizeof fresh);
    REQUIRE(db != NULL);
    ardb_close(db);
    char *migrated = raw_text(path, schema), *created = raw_text(fresh, schema);
    CHECK(migrated && created && strstr(created, "CREATE TRIGGER measurements_append_only") && strcmp(migrated, created) == 0);
    if (migrated && created && strcmp(migrated, created) != 0)
        fprintf(stderr, "migrated v1 file:\n%s\nnew file:\n%s\n", migrated, created);
    free(migrated);
    free(created);
}

static void test_v2_file_read_only_then_migrated(void)
{
    char path[600], bak[700];
    REQUIRE(make_v2("v2.db", path, sizeof path) == 0);
    REQUIRE(raw_int(path, "PRAGMA user_version") == 2);
    REQUIRE(raw_exec(path, "UPDATE runs SET note = 'kept' WHERE id = 2;") == SQLITE_OK);
    snprintf(bak, sizeof bak, "%s.v2.bak", path);

    /* Read-only: read as it is; no read bandwidth column, so NaN and "". */
    ardb *db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    ardb_run_info *runs = NULL;
    size_t n = 0;
    CHECK(ardb_run_list(db, &runs, &n) == ARDB_DONE && n == 2);
    if (n == 2) {
        CHECK(strcmp(runs[1].uid, "v1:2025-02-01T10:00:00.000Z:builder:2") == 0);
        CHECK(runs[1].note && strcmp(runs[1].note, "kept") == 0);
        CHECK(runs[1].copy_gbps == 20.0 && isnan(runs[1].read_gbps) && isnan(runs[0].read_gbps));
    }
    ardb_run_infos_free(runs, n);
    {
        listing l = {0};
        CHECK(ardb_list_runs(db, collect, &l) == ARDB_DONE && l.count == 2);
        CHECK(strstr(l.header, ",copy_gbps,read_gbps") != NULL && strstr(l.text, "|20.0|\n") != NULL);
    }
    {
        buffer e = {0};
        CHECK(ardb_export_json(db, 0, buffer_write, &e) == ARDB_DONE);
        CHECK(e.data && strstr(e.data, "\"read_gbps\": null") && !strstr(e.data, "\"read_gbps\": 2"));
        free(e.data);
    }
    CHECK(closed_untouched(db, path, bak, 2));

    /* Read-write: migrated to v4 in place, with a backup of the v2 file. */
    db = open_migrated(path, bak, 2);
    REQUIRE(db != NULL);
    CHECK(raw_int(bak, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'read_gbps'") == 0);
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE read_gbps IS NULL") == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE note = 'kept' AND uid LIKE 'v1:%'") == 1);
    char *v = NULL;
    CHECK(ardb_meta_get(db, "migrated_from_v2", &v) == ARDB_DONE && v && strstr(v, "v2.db.v2.bak"));
    free(v);
    ardb_run_info info;
    CHECK(ardb_run_get(db, 1, &info) == ARDB_DONE && isnan(info.read_gbps));
    ardb_run_info_clear(&info);
    ardb_close(db);
}

/* Writes the v2 fixture migrated to v3 exactly as a build of schema v3 did
 * it (the v3 delta of db/write/migrate.c, copied here so that the file stays what
 * v3 wrote), plus a real CUDA device with a gap in the ids (5), a run on it
 * and its winner, so that a migration that renumbered devices would show. */
static int make_v3(const char *name, char *path, size_t len)
{
    static const char delta_v3[] =
        "ALTER TABLE runs ADD COLUMN read_gbps REAL;\n"
        "UPDATE attnres_meta SET value = '3' WHERE key = 'schema_version';\n"
        "PRAGMA user_version = 3;\n";
    static const char gpu[] =
        "INSERT INTO devices(id, backend, name, arch, units, memory, driver, fingerprint, created_at)"
        " VALUES(5, 'cuda', 'NVIDIA H200', 'sm_90', 132, 150000000000, '560.35', 'cuda|H200|v3',"
        " '2025-03-01T00:00:00.000Z');\n"
        "INSERT INTO runs(id, started_at, finished_at, status, device_id, strategy, copy_gbps, read_gbps, uid)"
        " VALUES(3, '2025-03-01T10:00:00.000Z', '2025-03-01T10:01:00.000Z', 'complete', 5, 'exhaustive',"
        " 4300.0, 4100.0, 'v3-gpu-run');\n"
        "INSERT INTO measurements(id, run_id, candidate_id, problem_id, device_id, build_key, status,"
        " median_us, spread_us, reps, gbps, roofline, created_at)" /* its name before v11 */
        " VALUES(5, 3, 1, 1, 5, 'key-gpu', 'ok', 2.0, 0.01, 50, 3000.0, 0.7, '2025-03-01T10:00:30.000Z');\n"
        "INSERT INTO winners(run_id, problem_id, device_id, candidate_id, measurement_id, created_at)"
        " VALUES(3, 1, 5, 1, 5, '2025-03-01T10:01:00.000Z');\n";
    if (make_v2(name, path, len))
        return -1;
    if (raw_exec(path, delta_v3) != SQLITE_OK)
        return -1;
    return raw_exec(path, gpu) == SQLITE_OK ? 0 : -1;
}

/* Winners of fixture problem 1 (mix f32 d256 n5 h1) for a device at one
 * level; -1 when the lookup fails. */
static long winners_of_p1(ardb *db, const ardb_device *dev, ardb_level level)
{
    ardb_problem p = {.op = "mix", .dtype = "f32", .form = "replace", .d = 256, .n = 5, .heads = 1};
    ardb_winner *w = NULL;
    size_t n = 0;
    if (ardb_winners_lookup(db, &p, dev, level, &w, &n) != ARDB_DONE)
        return -1;
    ardb_winners_free(w, n);
    return (long)n;
}

static void test_v3_file_read_only_then_migrated(void)
{
    char path[600], bak[700], msg[1024], fresh[600];
    ardb_device gpu = {.backend = "cuda", .name = "NVIDIA H200", .arch = "sm_90", .fingerprint = "cuda|H200|v3"};
    ardb_device sim = gpu;
    ardb_level lv;
    ardb_merge_stats s;
    sim.simulated = 1;
    REQUIRE(make_v3("v3.db", path, sizeof path) == 0);
    REQUIRE(raw_int(path, "PRAGMA user_version") == 3);
    snprintf(bak, sizeof bak, "%s.v3.bak", path);

    /* Read-only: read as it is. Every device is real: the GPU's winner
     * serves it and never a simulated device of the same fingerprint. */
    ardb *db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    CHECK(winners_of_p1(db, &gpu, ARDB_LEVEL_EXACT) == 1);
    for (lv = ARDB_LEVEL_EXACT; lv <= ARDB_LEVEL_BACKEND; lv++)
        CHECK(winners_of_p1(db, &sim, lv) == 0);
    {
        listing l = {0};
        CHECK(ardb_list_winners(db, 0, collect, &l) == ARDB_DONE && l.count == 3);
        CHECK(strstr(l.text, "simulated") == NULL && strstr(l.text, "|NVIDIA H200|") != NULL);
        memset(&l, 0, sizeof l);
        CHECK(ardb_list_runs(db, collect, &l) == ARDB_DONE && l.count == 3);
        CHECK(strstr(l.text, "simulated") == NULL && strstr(l.text, "|4100.0\n") != NULL);
    }
    {
        ardb_run_info info;
        CHECK(ardb_run_get(db, 3, &info) == ARDB_DONE && info.device_simulated == 0 && info.read_gbps == 4100.0);
        ardb_run_info_clear(&info);
    }
    {
        ardb_stored_winner *w = NULL;
        size_t n = 0;
        CHECK(ardb_stored_winners(db, &gpu, &w, &n) == ARDB_DONE && n == 1 && w[0].device_id == 5);
        ardb_stored_winners_free(w, n);
        CHECK(ardb_stored_winners(db, &sim, &w, &n) == ARDB_DONE && n == 0);
        ardb_stored_winners_free(w, n);
    }
    {
        buffer e = {0};
        CHECK(ardb_export_json(db, 0, buffer_write, &e) == ARDB_DONE);
        CHECK(e.data && strstr(e.data, "\"simulated\": 0") && !strstr(e.data, "\"simulated\": 1"));
        free(e.data);
    }
    ardb_close(db);
    /* A merge from it (only read) records real devices. */
    db = create_db("v3-merged.db", fresh, sizeof fresh);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, path, &s) == ARDB_DONE && s.devices == 2 && s.runs == 3 && s.winners == 5);
    CHECK(raw_int(fresh, "SELECT count(*) FROM devices WHERE simulated = 0") == 2);
    CHECK(closed_untouched(db, path, bak, 3));

    /* A migration that fails leaves the file as it was, and no backup. */
    {
        char broken[600], broken_bak[700];
        REQUIRE(make_v3("v3-broken.db", broken, sizeof broken) == 0);
        REQUIRE(raw_exec(broken, "CREATE TABLE ardb_v4_devices(x);") == SQLITE_OK);
        snprintf(broken_bak, sizeof broken_bak, "%s.v3.bak", broken);
        db = (ardb *)1;
        CHECK(ardb_open(broken, 0, &db, msg, sizeof msg) != ARDB_DONE && db == NULL);
        CHECK(strstr(msg, "cannot upgrade") != NULL && strstr(msg, "version 4") != NULL);
        CHECK(raw_int(broken, "PRAGMA user_version") == 3);
        CHECK(raw_int(broken, "SELECT count(*) FROM pragma_table_info('devices') WHERE name = 'simulated'") == 0);
        CHECK(raw_int(broken, "SELECT count(*) FROM devices") == 2);
        CHECK(!file_exists(broken_bak));
    }

    /* Read-write: migrated to v4 in place, with a backup of the v3 file;
     * every device keeps its id and is real, and nothing is lost. */
    db = open_migrated(path, bak, 3);
    REQUIRE(db != NULL);
    CHECK(raw_int(bak, "SELECT count(*) FROM pragma_table_info('devices') WHERE name = 'simulated'") == 0);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('devices') WHERE name = 'simulated'") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM devices") == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM devices WHERE simulated = 0 AND id IN (1, 5)") == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM devices WHERE id = 5 AND fingerprint = 'cuda|H200|v3'"
                        " AND name = 'NVIDIA H200' AND memory = 150000000000") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM measurements") == raw_int(bak, "SELECT count(*) FROM measurements"));
    CHECK(raw_int(path, "SELECT count(*) FROM winners") == raw_int(bak, "SELECT count(*) FROM winners"));
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE read_gbps = 4100.0 AND device_id = 5") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_foreign_key_check") == 0);
    CHECK(raw_int(path, "SELECT count(*) FROM sqlite_schema WHERE type = 'index'"
                        " AND name = 'devices_backend_arch' AND tbl_name = 'devices'") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM sqlite_schema WHERE name = 'ardb_v4_devices'") == 0);
    {
        char *v = NULL;
        CHECK(ardb_meta_get(db, "schema_version", &v) == ARDB_DONE && v && atoi(v) == ARDB_SCHEMA_VERSION);
        free(v);
        v = NULL;
        CHECK(ardb_meta_get(db, "migrated_from_v3", &v) == ARDB_DONE && v && strstr(v, "v3.db.v3.bak"));
        free(v);
    }
    /* Foreign keys are enforced again after the migration. */
    {
        ardb_run bad = {.device_id = 99, .strategy = "exhaustive"};
        int64_t rid = 0;
        CHECK(ardb_run_begin(db, &bad, &rid) == ARDB_EINVAL);
    }
    /* v4 works: a simulated device with the GPU's fingerprint is a new
     * device, the real one is found as it was, and winners stay apart. */
    {
        int64_t id = 0;
        CHECK(ardb_device_upsert(db, &gpu, &id) == ARDB_DONE && id == 5);
        CHECK(ardb_device_upsert(db, &sim, &id) == ARDB_DONE && id != 5 && id != 1);
    }
    CHECK(winners_of_p1(db, &gpu, ARDB_LEVEL_EXACT) == 1);
    for (lv = ARDB_LEVEL_EXACT; lv <= ARDB_LEVEL_BACKEND; lv++)
        CHECK(winners_of_p1(db, &sim, lv) == 0);
    ardb_close(db);
    /* Opening again migrates nothing more. */
    db = open_db(path, 0);
    CHECK(db != NULL);
    ardb_close(db);
    snprintf(msg, sizeof msg, "%s.v3.bak.2", path);
    CHECK(!file_exists(msg));
    snprintf(msg, sizeof msg, "%s.v4.bak", path);
    CHECK(!file_exists(msg));
    /* Merging the migrated file again adds only the new simulated device:
     * the old devices are the same ones. */
    db = open_db(fresh, 0);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, path, &s) == ARDB_DONE && s.devices == 1 && s.runs == 0 && s.winners == 0);
    CHECK(raw_int(fresh, "SELECT count(*) FROM devices WHERE simulated = 1") == 1);
    ardb_close(db);
}

/* ---- the final-round mark (schema v8) ----------------------------------------------- */

/* A database with one candidate of one problem measured once per message,
 * each with the given final-round flag: ids[i] gets the id of the i-th. */
static ardb *make_measured(const char *name, char *path, size_t len, const char *const *messages,
                           const int *final, size_t n, int64_t *ids)
{
    path_in_tmp(path, len, name);
    ardb *db = open_db(path, ARDB_CREATE);
    if (!db)
        return NULL;
    ardb_device d = {.backend = "cpu", .name = "Final CPU", .fingerprint = "cpu|Final CPU"};
    ardb_problem p = {.op = "mix", .dtype = "f32", .form = "replace", .d = 256, .n = 5, .heads = 1, .t_bucket = 64};
    ardb_candidate c = {.template_name = "cpu/mix", .variant = "v_final", .source_hash = "hf", .source = "int f;",
                        .kernel_name = "kf", .backend = "cpu"};
    ardb_run r = {.strategy = "halving", .host = "final"};
    int64_t dev, pid, cid, run;
    if (ardb_device_upsert(db, &d, &dev) || ardb_problem_upsert(db, &p, &pid) || ardb_candidate_upsert(db, &c, &cid))
        goto fail;
    r.device_id = dev;
    if (ardb_run_begin(db, &r, &run))
        goto fail;
    for (size_t i = 0; i < n; i++) {
        /* The last one failed, to show that a failure in a final round is
         * marked too, and that the look-up of a final timing skips it. */
        ardb_measurement m = {.run_id = run, .candidate_id = cid, .problem_id = pid, .device_id = dev,
                              .build_key = "bk", .status = i + 1 < n ? ARDB_STATUS_OK : ARDB_STATUS_LAUNCH_FAILED,
                              .median_us = 10.0 + (double)i, .reps = 5, .rel_err = 0, .message = messages[i],
                              .final_round = final[i]};
        if (ardb_measurement_add(db, &m, &ids[i]))
            goto fail;
    }
    if (ardb_run_finish(db, run, "complete"))
        goto fail;
    return db;
fail:
    fprintf(stderr, "make_measured: %s\n", ardb_errmsg(db));
    ardb_close(db);
    return NULL;
}

/* The final-round flags of every measurement in id order, as digits. */
static long long final_flags(const char *path)
{
    return raw_int(path, "SELECT group_concat(final_round, '') FROM (SELECT final_round FROM measurements ORDER BY id)");
}

/* A file as schema v6 or v7 wrote it: before v8 the final round was told
 * only by the message's first word. A current file with what the later
 * deltas added taken away again (v7 and v8 each add one column) has exactly
 * the older shape. It migrates with the flag set from the message; read
 * only, it is read as it is, with the same flags. */
static void test_final_round_from_v6_and_v7_files(void)
{
    static const char *const messages[] = {"final (interleaved with 3, 11 rounds)", "screening", NULL,
                                           "full (stopped after one timed launch)", "finalist, not final",
                                           "final (interleaved with 2, 3 rounds): launch failed"};
    static const int unset[6] = {0};
    const size_t n = sizeof messages / sizeof messages[0];
    for (int version = 6; version <= 7; version++) {
        char name[32], path[600], bak[700];
        int64_t ids[6];
        snprintf(name, sizeof name, "final-v%d.db", version);
        ardb *db = make_measured(name, path, sizeof path, messages, unset, n, ids);
        REQUIRE(db != NULL);
        ardb_close(db);
        REQUIRE(schema_back_to(path, version) == SQLITE_OK);
        REQUIRE(raw_int(path, "SELECT count(*) FROM pragma_table_info('measurements') WHERE name = 'final_round'") ==
                0);

        /* Read-only: never written, the flag read from the message. */
        db = open_db(path, ARDB_READONLY);
        REQUIRE(db != NULL);
        {
            ardb_measurement m;
            double median = 0, spread = 0;
            int64_t mid = 0, cand = raw_int(path, "SELECT id FROM candidates"),
                    prob = raw_int(path, "SELECT id FROM problems"), dev = raw_int(path, "SELECT id FROM devices");
            buffer e = {0};
            CHECK(ardb_measurement_find(db, cand, prob, dev, "bk", &m) == ARDB_DONE && m.final_round == 1 &&
                  m.status == ARDB_STATUS_LAUNCH_FAILED);
            ardb_measurement_clear(&m);
            CHECK(ardb_measurement_find_final(db, cand, prob, dev, "bk", &median, &spread, &mid) == ARDB_DONE);
            /* The newest ok one marked: "finalist, not final". */
            CHECK(mid == ids[4] && median == 14.0);
            CHECK(ardb_export_json(db, 0, buffer_write, &e) == ARDB_DONE);
            CHECK(e.data && strstr(e.data, "\"message\": \"screening\", \"final_round\": 0,") &&
                  strstr(e.data, "\"message\": \"final (interleaved with 3, 11 rounds)\", \"final_round\": 1,") &&
                  strstr(e.data, "\"message\": \"finalist, not final\", \"final_round\": 1,"));
            free(e.data);
        }
        ardb_close(db);
        CHECK(raw_int(path, "PRAGMA user_version") == version);

        /* Read-write: migrated in place, with a backup. "finalist" starts
         * with "final" as the tuner's old test read it: marked, as then. */
        snprintf(bak, sizeof bak, "%s.v%d.bak", path, version);
        db = open_migrated(path, bak, version);
        CHECK(db != NULL);
        ardb_close(db);
        CHECK(final_flags(path) == 100011);
        CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('measurements') WHERE name = 'final_round' "
                            "AND \"notnull\" = 1 AND dflt_value = '0'") == 1);
        /* Measurements are append-only again after the migration. */
        CHECK(raw_exec(path, "UPDATE measurements SET final_round = 0") != SQLITE_OK);
        CHECK(final_flags(path) == 100011);
    }
}

/* An export of one measurement, open after its created_at member: a case
 * closes it with the member it tests, and with winners where it needs
 * them. */
#define ONE_MEASUREMENT_EXPORT \
    "{\"format\": \"attnres-export\", \"version\": 1," \
    " \"devices\": [{\"backend\": \"cpu\", \"fingerprint\": \"fb\"}]," \
    " \"problems\": [{\"key\": \"mix:f32:d1:n1:h1:replace:epi0:s0:t1\", \"op\": \"mix\", \"dtype\": \"f32\"," \
    " \"form\": \"replace\", \"d\": 1, \"n\": 1, \"heads\": 1, \"epilogue\": 0, \"s\": 0, \"t_bucket\": 1}]," \
    " \"candidates\": [{\"variant\": \"v\", \"source_hash\": \"h\"}]," \
    " \"runs\": [{\"uid\": \"rb\", \"started_at\": \"t\", \"status\": \"complete\"}]," \
    " \"measurements\": [{\"id\": 1, \"run\": \"rb\", \"problem\": \"mix:f32:d1:n1:h1:replace:epi0:s0:t1\"," \
    " \"variant\": \"v\", \"source_hash\": \"h\", \"device\": \"fb\", \"status\": \"ok\"," \
    " \"created_at\": \"t\""

/* Removes every "final_round": N member, as an export of a build before v8. */
static void strip_final_round(char *text)
{
    char *p;
    while ((p = strstr(text, "\"final_round\": "))) {
        char *end = strstr(p, ", ");
        if (!end)
            break;
        memmove(p, end + 2, strlen(end + 2) + 1);
    }
}

/* The flag is what was recorded, not what the message says: export and
 * import, and merge, carry it as it is; an export without it (from a build
 * before v8) is marked from the message, as the migration does. */
static void test_final_round_travels_with_export_import_and_merge(void)
{
    static const char *const messages[] = {"interleaved", "final words, not a final round", NULL, "x"};
    static const int final[] = {1, 0, 7, 0};
    char src[600], path[600];
    int64_t ids[4];
    buffer a = {0}, again = {0};
    ardb_merge_stats s;
    ardb *db = make_measured("final-src.db", src, sizeof src, messages, final, 4, ids);
    REQUIRE(db != NULL);
    CHECK(final_flags(src) == 1010); /* any non-zero flag is recorded as 1 */
    CHECK(ardb_export_json(db, 0, buffer_write, &a) == ARDB_DONE);
    ardb_close(db);
    REQUIRE(a.data != NULL);

    db = create_db("final-imported.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE && s.measurements == 4);
    CHECK(final_flags(path) == 1010);
    CHECK(ardb_export_json(db, 0, buffer_write, &again) == ARDB_DONE);
    CHECK(again.data && strcmp(a.data, again.data) == 0);
    ardb_close(db);

    db = create_db("final-merged.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, src, &s) == ARDB_DONE && s.measurements == 4);
    CHECK(final_flags(path) == 1010);
    ardb_close(db);

    strip_final_round(a.data);
    a.len = strlen(a.data);
    CHECK(strstr(a.data, "final_round") == NULL);
    db = create_db("final-older-export.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE && s.measurements == 4);
    CHECK(final_flags(path) == 100); /* leading zero: "0100" */
    check_import_refused(db, "final_round 2", 0, ONE_MEASUREMENT_EXPORT ", \"final_round\": 2}]}", "inconsistent");
    ardb_close(db);
    free(a.data);
    free(again.data);
}

/* ---- the provisional mark (schema v9) ------------------------------------------- */

/* What make_final_round recorded. */
typedef struct final_fix {
    int64_t dev, prob, run, later_run;
    int64_t cand[3];
    int64_t won;         /* the run's winning measurement: c0's final timing */
    int64_t c2_final;    /* c2's newest final timing */
    int64_t later_won;   /* the later run's winner, timed outside a final round */
} final_fix;

static const char evidence[] = "threads waited 61% of the window for a CPU, 0% stolen, 930 preemptions/s";

/* A database with one problem on one device. Its first run screened three
 * candidates, then timed them in a final round: c0 at 10 us, c1 failed
 * there, c2 at 13 us and once more at 12 us; c0 won, provisional with
 * `evidence` unless it is NULL. A later run re-measured c2 alone (11 us,
 * not in a final round) and made it its ordinary winner. */
static ardb *make_final_round(const char *name, char *path, size_t len, const char *why, final_fix *f)
{
    path_in_tmp(path, len, name);
    ardb *db = open_db(path, ARDB_CREATE);
    if (!db)
        return NULL;
    memset(f, 0, sizeof *f);
    ardb_device d = {.backend = "cpu", .name = "Busy CPU", .fingerprint = "cpu|Busy CPU"};
    ardb_problem p = {.op = "mix", .dtype = "f32", .form = "replace", .d = 1024, .n = 8, .heads = 1,
                      .t_bucket = 4096};
    ardb_run r = {.strategy = "halving", .host = "busy"};
    static const char *const variants[3] = {"v_c0", "v_c1", "v_c2"};
    if (ardb_device_upsert(db, &d, &f->dev) || ardb_problem_upsert(db, &p, &f->prob))
        goto fail;
    for (int i = 0; i < 3; i++) {
        char hash[8], source[32];
        snprintf(hash, sizeof hash, "h%d", i);
        snprintf(source, sizeof source, "int c%d;", i);
        ardb_candidate c = {.template_name = "cpu/mix", .variant = variants[i], .source_hash = hash,
                            .source = source, .kernel_name = "k", .backend = "cpu",
                            .params_json = "{\"threads\": 2}"};
        if (ardb_candidate_upsert(db, &c, &f->cand[i]))
            goto fail;
    }
    r.device_id = f->dev;
    if (ardb_run_begin(db, &r, &f->run))
        goto fail;
    /* Screening first (faster figures, to show that they are not final),
     * then the final round; c2 twice there, its newest counts. */
    static const struct {
        int cand, final;
        ardb_status status;
        double us;
    } timings[] = {{0, 0, ARDB_STATUS_OK, 9.0},   {1, 0, ARDB_STATUS_OK, 9.5},
                   {2, 0, ARDB_STATUS_OK, 8.0},   {0, 1, ARDB_STATUS_OK, 10.0},
                   {1, 1, ARDB_STATUS_LAUNCH_FAILED, 0}, {2, 1, ARDB_STATUS_OK, 13.0},
                   {2, 1, ARDB_STATUS_OK, 12.0}};
    for (size_t i = 0; i < sizeof timings / sizeof timings[0]; i++) {
        ardb_measurement m = {.run_id = f->run, .candidate_id = f->cand[timings[i].cand], .problem_id = f->prob,
                              .device_id = f->dev, .build_key = "bk", .status = timings[i].status,
                              .median_us = timings[i].us, .spread_us = 0.1, .reps = 15, .rel_err = 0,
                              .message = timings[i].final ? "final (interleaved with 3, 15 rounds)" : "screening",
                              .final_round = timings[i].final};
        int64_t id;
        /* Apart in time, as a real run's are: a merge tells the
         * measurements of one candidate in one run apart by when they were
         * taken (a millisecond's resolution). */
        usleep(2000);
        if (ardb_measurement_add(db, &m, &id))
            goto fail;
        if (timings[i].final && timings[i].cand == 0)
            f->won = id;
        if (timings[i].final && timings[i].cand == 2)
            f->c2_final = id;
    }
    if (ardb_winner_set_ex(db, f->run, f->prob, f->dev, f->cand[0], f->won, why) ||
        ardb_run_finish(db, f->run, "complete"))
        goto fail;
    if (ardb_run_begin(db, &r, &f->later_run))
        goto fail;
    ardb_measurement m = {.run_id = f->later_run, .candidate_id = f->cand[2], .problem_id = f->prob,
                          .device_id = f->dev, .build_key = "bk", .status = ARDB_STATUS_OK, .median_us = 11.0,
                          .reps = 15, .rel_err = 0};
    if (ardb_measurement_add(db, &m, &f->later_won) ||
        ardb_winner_set(db, f->later_run, f->prob, f->dev, f->cand[2], f->later_won) ||
        ardb_run_finish(db, f->later_run, "complete"))
        goto fail;
    return db;
fail:
    fprintf(stderr, "make_final_round: %s\n", ardb_errmsg(db));
    ardb_close(db);
    return NULL;
}

/* The winner the runtime would load for the fixture's problem on its
 * device, at the exact level. */
static int lookup_one(ardb *db, ardb_winner **w)
{
    ardb_problem p = {.op = "mix", .dtype = "f32", .form = "replace", .d = 1024, .n = 8, .heads = 1};
    ardb_device d = {.backend = "cpu", .fingerprint = "cpu|Busy CPU"};
    size_t n = 0;
    *w = NULL;
    if (ardb_winners_lookup(db, &p, &d, ARDB_LEVEL_EXACT, w, &n) != ARDB_DONE || n != 1) {
        ardb_winners_free(*w, n);
        *w = NULL;
        return -1;
    }
    return 0;
}

/* Every reader of winners carries the mark: the runtime's lookup, the
 * listing of `db show`, the stored winners of a revalidation, and a
 * measurement's disturbance for a resumed run. Replacing the run's winner
 * replaces the mark; a provisional winner without evidence is refused. */
static void test_provisional_winner_read_everywhere(void)
{
    char path[600];
    final_fix f;
    ardb *db = make_final_round("provisional.db", path, sizeof path, evidence, &f);
    REQUIRE(db != NULL);
    CHECK(raw_int(path, "SELECT provisional FROM winners WHERE run_id = 1") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE provisional = 0 AND disturbance IS NULL") == 1);

    /* The later run's ordinary winner is the newest: not provisional. */
    ardb_winner *w = NULL;
    CHECK(lookup_one(db, &w) == 0 && w && w->provisional == 0 && w->disturbance == NULL &&
          strcmp(w->variant, "v_c2") == 0);
    ardb_winners_free(w, 1);
    /* Only the first run's is provisional, in its listing with evidence. */
    listing l;
    memset(&l, 0, sizeof l);
    CHECK(ardb_list_winners(db, f.run, collect, &l) == ARDB_DONE && l.count == 1);
    CHECK(strcmp(l.header, "problem,device,variant,median_us,gbps,ceiling_fraction,provisional") == 0);
    CHECK(strstr(l.text, "|v_c0|10.000|") && strstr(l.text, "|yes: threads waited 61% of the window for a CPU"));
    memset(&l, 0, sizeof l);
    CHECK(ardb_list_winners(db, f.later_run, collect, &l) == ARDB_DONE && l.count == 1);
    CHECK(strstr(l.text, "|v_c2|11.000|") && l.text[strlen(l.text) - 2] == '|');
    char *why = (char *)1;
    CHECK(ardb_measurement_disturbance(db, f.won, &why) == ARDB_DONE && why && strcmp(why, evidence) == 0);
    free(why);
    /* c2's final timing was taken in the same disturbed round. */
    CHECK(ardb_measurement_disturbance(db, f.c2_final, &why) == ARDB_DONE && why && strcmp(why, evidence) == 0);
    free(why);
    CHECK(ardb_measurement_disturbance(db, f.later_won, &why) == ARDB_DONE && why == NULL);
    CHECK(ardb_measurement_disturbance(db, 9999, &why) == ARDB_DONE && why == NULL);

    /* With the later run's winner gone, the provisional one is served and
     * stored, with its evidence and the timing it won with. */
    CHECK(raw_exec(path, "DELETE FROM winners WHERE run_id = 2") == SQLITE_OK);
    CHECK(lookup_one(db, &w) == 0 && w && w->provisional == 1 && w->disturbance &&
          strcmp(w->disturbance, evidence) == 0 && strcmp(w->variant, "v_c0") == 0);
    ardb_winners_free(w, 1);
    ardb_device d = {.backend = "cpu", .fingerprint = "cpu|Busy CPU"};
    ardb_stored_winner *sw = NULL;
    size_t n = 0;
    CHECK(ardb_stored_winners(db, &d, &sw, &n) == ARDB_DONE && n == 1);
    CHECK(n == 1 && sw[0].provisional == 1 && sw[0].disturbance && strcmp(sw[0].disturbance, evidence) == 0 &&
          sw[0].measurement_id == f.won);
    ardb_stored_winners_free(sw, n);

    /* Its finalists: the ok final timings of that round, newest of each
     * candidate, fastest first; the screening and the failure are not. */
    ardb_stored_finalist *fin = NULL;
    CHECK(ardb_stored_finalists(db, f.won, &fin, &n) == ARDB_DONE && n == 2);
    CHECK(n == 2 && fin[0].candidate_id == f.cand[0] && fin[0].measurement_id == f.won && fin[0].median_us == 10.0 &&
          strcmp(fin[0].variant, "v_c0") == 0 && strcmp(fin[0].source, "int c0;") == 0 &&
          strcmp(fin[0].params_json, "{\"threads\": 2}") == 0);
    CHECK(n == 2 && fin[1].candidate_id == f.cand[2] && fin[1].measurement_id == f.c2_final &&
          fin[1].median_us == 12.0);
    ardb_stored_finalists_free(fin, n);
    /* A winner timed outside a final round has none. */
    CHECK(ardb_stored_finalists(db, f.later_won, &fin, &n) == ARDB_DONE && n == 0 && fin == NULL);

    /* Timed again undisturbed, the run's winner is no longer provisional. */
    CHECK(ardb_winner_set_ex(db, f.run, f.prob, f.dev, f.cand[2], f.c2_final, NULL) == ARDB_DONE);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE run_id = 1 AND provisional = 0"
                        " AND disturbance IS NULL") == 1);
    CHECK(ardb_winner_set_ex(db, f.run, f.prob, f.dev, f.cand[0], f.won, evidence) == ARDB_DONE);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE run_id = 1 AND provisional = 1") == 1);
    /* A mark without evidence is refused and changes nothing. */
    CHECK(ardb_winner_set_ex(db, f.run, f.prob, f.dev, f.cand[2], f.c2_final, "") == ARDB_EINVAL);
    CHECK(strstr(ardb_errmsg(db), "needs the disturbance") != NULL);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE run_id = 1 AND provisional = 1"
                        " AND candidate_id = 1") == 1);
    /* The column takes 0 and 1 only. */
    CHECK(raw_exec(path, "UPDATE winners SET provisional = 2") != SQLITE_OK);
    ardb_close(db);
}

/* The screenings' relative spreads on a device: the problem's in this run
 * apart from the others' of launches as long, newest first, each list
 * capped; final timings and measurements of other stages are not
 * screenings. */
static void test_screening_spreads(void)
{
    char path[600];
    final_fix f;
    ardb *db = make_final_round("spreads.db", path, sizeof path, NULL, &f);
    REQUIRE(db != NULL);
    double *now = NULL, *before = NULL;
    size_t nnow = 0, nbefore = 0;
    CHECK(ardb_screening_spreads(db, f.prob, f.dev, f.run, 1, 100, 100, &now, &nnow, &before, &nbefore) ==
          ARDB_DONE);
    CHECK(nnow == 3 && nbefore == 0 && before == NULL);
    CHECK(nnow == 3 && fabs(now[0] - 0.1 / 8.0) < 1e-12 && fabs(now[1] - 0.1 / 9.5) < 1e-12 &&
          fabs(now[2] - 0.1 / 9.0) < 1e-12);
    free(now);
    /* From the later run, the first run's are the others': capped at 2,
     * and only those of launches as long (9.0 and 9.5 us in [8.5, 20]). */
    CHECK(ardb_screening_spreads(db, f.prob, f.dev, f.later_run, 1, 100, 2, &now, &nnow, &before, &nbefore) ==
          ARDB_DONE);
    CHECK(nnow == 0 && now == NULL && nbefore == 2 && fabs(before[0] - 0.1 / 8.0) < 1e-12);
    free(before);
    CHECK(ardb_screening_spreads(db, f.prob, f.dev, f.later_run, 8.5, 20, 100, &now, &nnow, &before, &nbefore) ==
          ARDB_DONE);
    CHECK(nnow == 0 && nbefore == 2 && fabs(before[0] - 0.1 / 9.5) < 1e-12 && fabs(before[1] - 0.1 / 9.0) < 1e-12);
    free(before);
    CHECK(ardb_screening_spreads(db, f.prob, f.dev, f.run, 100, 200, 100, &now, &nnow, &before, &nbefore) ==
              ARDB_DONE &&
          nnow == 3 && nbefore == 0);
    free(now);
    CHECK(ardb_screening_spreads(db, f.prob, f.dev, f.run, 1, 100, 100, NULL, &nnow, &before, &nbefore) ==
          ARDB_EINVAL);
    ardb_close(db);
}

/* A file as schema v8 wrote it: a current file with v9's two columns
 * taken away again has exactly the older shape. Read-only it is read as it
 * is, with no provisional winner; a writer's open migrates it, with a
 * backup, and every winner it held is an ordinary one. */
static void test_v8_file_has_no_provisional_winner(void)
{
    char path[600], bak[700];
    final_fix f;
    ardb *db = make_final_round("v8.db", path, sizeof path, NULL, &f);
    REQUIRE(db != NULL);
    ardb_close(db);
    REQUIRE(schema_back_to(path, 8) == SQLITE_OK);

    db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    ardb_winner *w = NULL;
    CHECK(lookup_one(db, &w) == 0 && w && w->provisional == 0 && w->disturbance == NULL);
    ardb_winners_free(w, 1);
    listing l;
    memset(&l, 0, sizeof l);
    CHECK(ardb_list_winners(db, 0, collect, &l) == ARDB_DONE && l.count == 1);
    CHECK(strcmp(l.header, "problem,device,variant,median_us,gbps,ceiling_fraction,provisional") == 0 &&
          l.text[strlen(l.text) - 2] == '|');
    ardb_device d = {.backend = "cpu", .fingerprint = "cpu|Busy CPU"};
    ardb_stored_winner *sw = NULL;
    size_t n = 0;
    CHECK(ardb_stored_winners(db, &d, &sw, &n) == ARDB_DONE && n == 1 && sw[0].provisional == 0 &&
          sw[0].disturbance == NULL);
    ardb_stored_winners_free(sw, n);
    char *why = (char *)1;
    CHECK(ardb_measurement_disturbance(db, f.won, &why) == ARDB_DONE && why == NULL);
    ardb_stored_finalist *fin = NULL;
    CHECK(ardb_stored_finalists(db, f.won, &fin, &n) == ARDB_DONE && n == 2);
    ardb_stored_finalists_free(fin, n);
    buffer e = {0};
    CHECK(ardb_export_json(db, 0, buffer_write, &e) == ARDB_DONE);
    CHECK(e.data && strstr(e.data, "\"provisional\": 0, \"disturbance\": null}"));
    free(e.data);
    ardb_close(db);
    CHECK(raw_int(path, "PRAGMA user_version") == 8);

    snprintf(bak, sizeof bak, "%s.v8.bak", path);
    db = open_migrated(path, bak, 8);
    CHECK(db != NULL);
    ardb_close(db);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('winners') WHERE name = 'provisional'"
                        " AND \"notnull\" = 1 AND dflt_value = '0'") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE provisional = 0 AND disturbance IS NULL") == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM winners") == 2);
}

/* The measurements table as schema v9 held it: the v1 table with v8's
 * column added, whose status check knows no 'nondeterministic'. The table
 * is rebuilt with the same ids, as the v10 delta does the other way, so
 * that a current file becomes exactly what v9 wrote. */
static const char measurements_as_v9[] =
    "PRAGMA foreign_keys = OFF;\n"
    "BEGIN;\n"
    "CREATE TABLE v9_measurements(\n"
    ARDB_SQL_MEASUREMENT_COLUMNS_TO_STATUS ")),\n"
    ARDB_SQL_MEASUREMENT_COLUMNS_AFTER_STATUS "\n"
    ");\n"
    "ALTER TABLE v9_measurements ADD COLUMN final_round INTEGER NOT NULL\n"
    "  DEFAULT 0 CHECK(final_round IN (0, 1));\n"
    "INSERT INTO v9_measurements SELECT * FROM measurements ORDER BY id;\n"
    "DROP TABLE measurements;\n"
    "ALTER TABLE v9_measurements RENAME TO measurements;\n"
    ARDB_SQL_MEASUREMENTS_INDEXES
    "UPDATE attnres_meta SET value = '9' WHERE key = 'schema_version';\n"
    "PRAGMA user_version = 9;\n"
    "COMMIT;\n";

/* Every measurement of a file, in id order, as one line each. */
static char *measurement_rows(const char *path)
{
    return raw_text(path, "SELECT group_concat(row, '\n') FROM (SELECT id || '|' || run_id || '|' || candidate_id"
                          " || '|' || problem_id || '|' || device_id || '|' || IFNULL(build_key, '-') || '|' ||"
                          " status || '|' || IFNULL(median_us, '-') || '|' || IFNULL(spread_us, '-') || '|' ||"
                          " IFNULL(reps, '-') || '|' || IFNULL(message, '-') || '|' || created_at || '|' ||"
                          " final_round AS row FROM measurements ORDER BY id)");
}

/* A file as schema v9 wrote it takes no 'nondeterministic' measurement.
 * Read-only it is read as it is; a writer's open migrates it, with a
 * backup, rebuilding the table: every measurement keeps its id and
 * values, the winners still refer to theirs, the indexes and the
 * append-only trigger are back, and the new status is accepted. */
static void test_v9_file_takes_nondeterministic_after_migration(void)
{
    char path[600], bak[700];
    final_fix f;
    ardb *db = make_final_round("v9.db", path, sizeof path, evidence, &f);
    REQUIRE(db != NULL);
    ardb_close(db);
    char *before = measurement_rows(path);
    REQUIRE(before != NULL);
    REQUIRE(raw_exec(path, measurements_as_v9) == SQLITE_OK);
    char *as_v9 = measurement_rows(path);
    CHECK(as_v9 && strcmp(before, as_v9) == 0);
    free(as_v9);
    const char *insert = "INSERT INTO measurements(run_id, candidate_id, problem_id, device_id, status, created_at)"
                         " SELECT run_id, candidate_id, problem_id, device_id, 'nondeterministic', 'now'"
                         " FROM measurements WHERE id = 1";
    CHECK(raw_exec(path, insert) == SQLITE_CONSTRAINT);

    db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    ardb_winner *w = NULL;
    CHECK(lookup_one(db, &w) == 0 && w && w->provisional == 0);
    ardb_winners_free(w, 1);
    ardb_measurement m;
    CHECK(ardb_measurement_find(db, f.cand[1], f.prob, f.dev, "bk", &m) == ARDB_DONE &&
          m.status == ARDB_STATUS_LAUNCH_FAILED);
    ardb_measurement_clear(&m);
    ardb_close(db);
    CHECK(raw_int(path, "PRAGMA user_version") == 9);

    snprintf(bak, sizeof bak, "%s.v9.bak", path);
    db = open_migrated(path, bak, 9);
    REQUIRE(db != NULL);
    char *after = measurement_rows(path);
    CHECK(after && strcmp(before, after) == 0);
    free(after);
    CHECK(raw_int(path, "SELECT count(*) FROM winners w JOIN measurements m ON m.id = w.measurement_id"
                        " AND m.candidate_id = w.candidate_id AND m.status = 'ok'") == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_foreign_key_check") == 0);
    CHECK(raw_int(path, "SELECT count(*) FROM sqlite_schema WHERE tbl_name = 'measurements' AND name IN"
                        " ('measurements_key', 'measurements_run', 'measurements_append_only')") == 3);
    CHECK(raw_int(path, "SELECT count(*) FROM sqlite_schema WHERE name LIKE '%v10%'") == 0);
    CHECK(raw_exec(path, "UPDATE measurements SET median_us = 1") == SQLITE_CONSTRAINT);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('measurements') WHERE name = 'final_round'"
                        " AND \"notnull\" = 1 AND dflt_value = '0'") == 1);

    /* The new status is accepted now, through ardb and in plain SQL. */
    ardb_measurement nd = {.run_id = f.later_run, .candidate_id = f.cand[1], .problem_id = f.prob,
                           .device_id = f.dev, .build_key = "bk-nd", .status = ARDB_STATUS_NONDETERMINISTIC,
                           .rel_err = 0, .message = "two runs on the same inputs differ in dquery"};
    int64_t id = 0;
    CHECK(ardb_measurement_add(db, &nd, &id) == ARDB_DONE && id == f.later_won + 1);
    CHECK(ardb_measurement_find(db, f.cand[1], f.prob, f.dev, "bk-nd", &m) == ARDB_DONE &&
          m.status == ARDB_STATUS_NONDETERMINISTIC);
    ardb_measurement_clear(&m);
    ardb_close(db);
    CHECK(raw_exec(path, insert) == SQLITE_OK);
    CHECK(raw_int(path, "SELECT count(*) FROM measurements WHERE status = 'nondeterministic'") == 2);
    free(before);
}

/* A nondeterministic measurement travels with export, import and merge;
 * a merge from a v9 file, which holds none, brings its measurements as
 * they are. */
static void test_nondeterministic_travels(void)
{
    char src[600], path[600], old[600];
    final_fix f;
    buffer a = {0};
    ardb_merge_stats s;
    ardb *db = make_final_round("nd-src.db", src, sizeof src, NULL, &f);
    REQUIRE(db != NULL);
    ardb_measurement nd = {.run_id = f.later_run, .candidate_id = f.cand[1], .problem_id = f.prob,
                           .device_id = f.dev, .build_key = "bk-nd", .status = ARDB_STATUS_NONDETERMINISTIC,
                           .rel_err = 2e-7, .message = "two runs on the same inputs differ in dquery"};
    CHECK(ardb_measurement_add(db, &nd, NULL) == ARDB_DONE);
    CHECK(ardb_export_json(db, 0, buffer_write, &a) == ARDB_DONE);
    {
        buffer c = {0};
        CHECK(ardb_export_csv(db, ARDB_CSV_MEASUREMENTS, buffer_write, &c) == ARDB_DONE);
        CHECK(c.data && strstr(c.data, ",nondeterministic,") != NULL);
        free(c.data);
    }
    ardb_close(db);
    REQUIRE(a.data != NULL);
    CHECK(strstr(a.data, "\"status\": \"nondeterministic\"") != NULL);

    db = create_db("nd-imported.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE && s.measurements == 9);
    CHECK(raw_int(path, "SELECT count(*) FROM measurements WHERE status = 'nondeterministic'"
                        " AND message LIKE '%dquery'") == 1);
    ardb_close(db);

    db = create_db("nd-merged.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, src, &s) == ARDB_DONE && s.measurements == 9);
    CHECK(raw_int(path, "SELECT count(*) FROM measurements WHERE status = 'nondeterministic'") == 1);
    /* Merged again: nothing new. */
    CHECK(ardb_merge(db, src, &s) == ARDB_DONE && s.measurements == 0);
    ardb_close(db);

    /* A v9 source (without the new row, which v9 could not hold). */
    db = make_final_round("nd-v9.db", old, sizeof old, NULL, &f);
    REQUIRE(db != NULL);
    ardb_close(db);
    REQUIRE(raw_exec(old, measurements_as_v9) == SQLITE_OK);
    db = create_db("nd-merged-v9.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, old, &s) == ARDB_DONE && s.measurements == 8);
    CHECK(raw_int(path, "SELECT count(*) FROM measurements WHERE status = 'nondeterministic'") == 0);
    ardb_close(db);
    CHECK(raw_int(old, "PRAGMA user_version") == 9);

    /* A status this build does not know is refused at its row. */
    char *bad = strdup(a.data);
    REQUIRE(bad != NULL);
    char *at = strstr(bad, "\"status\": \"nondeterministic\"");
    REQUIRE(at != NULL);
    memcpy(at + strlen("\"status\": \""), "nondeterminisTIC", 16);
    db = create_db("nd-bad.db", path, sizeof path);
    REQUIRE(db != NULL);
    check_import_refused(db, "unknown status", 0, bad, "measurements[8]");
    ardb_close(db);
    free(bad);
    free(a.data);
}

/* Replaces every `from` in text by `to`; a new string to free, or NULL. */
static char *replace_all(const char *text, const char *from, const char *to)
{
    size_t nf = strlen(from), nt = strlen(to), n = 0;
    for (const char *p = strstr(text, from); p; p = strstr(p + nf, from))
        n++;
    char *out = malloc(strlen(text) + n * nt + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *p; (p = strstr(text, from)); text = p + nf) {
        memcpy(o, text, (size_t)(p - text));
        o += p - text;
        memcpy(o, to, nt);
        o += nt;
    }
    strcpy(o, text);
    return out;
}

/* A file as schema v10 wrote it names the fraction of the ceiling by its
 * name before v11, "roofline". Read-only, every reader finds it so and hands
 * it on under the new one (the runtime's lookup, the listing of `db show`,
 * the resume cache, compare, history, export and merge); a writer's open
 * renames the column, with a backup, keeping every value. An export of a
 * build before v11 imports, its older key read; one that holds both keys
 * is refused. */
static void test_v10_file_renamed_to_ceiling_fraction(void)
{
    static const char old_name[] = "roofline"; /* its name before v11 */
    char path[600], bak[700], merged[600];
    final_fix f;
    ardb_merge_stats s;
    ardb *db = make_final_round("v10.db", path, sizeof path, NULL, &f);
    REQUIRE(db != NULL);
    int64_t mid = add_winner(db, f.later_run, f.cand[0], f.prob, f.dev, 5.0, 0.1);
    CHECK(mid > 0);
    ardb_close(db);
    char *before = measurement_rows(path);
    REQUIRE(before != NULL);
    REQUIRE(raw_exec(path, TEST_SQL_PRE_V11 "UPDATE attnres_meta SET value = '10' WHERE key = 'schema_version';"
                           "PRAGMA user_version = 10;") == SQLITE_OK);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('measurements') WHERE name = 'ceiling_fraction'") == 0);

    db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    ardb_winner *w = NULL;
    CHECK(lookup_one(db, &w) == 0 && w && w->ceiling_fraction == 0.5 && strcmp(w->variant, "v_c0") == 0);
    ardb_winners_free(w, 1);
    listing l;
    memset(&l, 0, sizeof l);
    CHECK(ardb_list_winners(db, f.later_run, collect, &l) == ARDB_DONE && l.count == 1);
    CHECK(strcmp(l.header, "problem,device,variant,median_us,gbps,ceiling_fraction,provisional") == 0 &&
          strstr(l.text, "|0.500|") != NULL);
    ardb_measurement m;
    CHECK(ardb_measurement_find(db, f.cand[0], f.prob, f.dev, "bk", &m) == ARDB_DONE && m.ceiling_fraction == 0.5);
    ardb_measurement_clear(&m);
    ardb_diff_row *rows = NULL;
    size_t n = 0;
    CHECK(ardb_diff_runs(db, f.run, f.later_run, &rows, &n) == ARDB_DONE && n == 1 && rows &&
          rows[0].ceiling_fraction_b == 0.5 && rows[0].ceiling_fraction_a == 0.0);
    ardb_diff_free(rows, n);
    ardb_winner_point *pts = NULL;
    CHECK(ardb_winner_history(db, &pts, &n) == ARDB_DONE && n == 2 && pts && pts[1].run_id == f.later_run &&
          pts[1].ceiling_fraction == 0.5);
    ardb_winner_points_free(pts, n);
    buffer a = {0}, c = {0};
    CHECK(ardb_export_json(db, 0, buffer_write, &a) == ARDB_DONE);
    CHECK(ardb_export_csv(db, ARDB_CSV_WINNERS, buffer_write, &c) == ARDB_DONE);
    ardb_close(db);
    REQUIRE(a.data != NULL);
    CHECK(strstr(a.data, "\"ceiling_fraction\": 0.5") != NULL && strstr(a.data, old_name) == NULL);
    CHECK(c.data && strstr(c.data, ",ceiling_fraction,") != NULL && strstr(c.data, old_name) == NULL);
    free(c.data);
    CHECK(raw_int(path, "PRAGMA user_version") == 10);

    path_in_tmp(merged, sizeof merged, "v10-merged.db");
    db = open_db(merged, ARDB_CREATE);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, path, &s) == ARDB_DONE && s.measurements == 9);
    ardb_close(db);
    CHECK(raw_int(merged, "SELECT count(*) FROM measurements WHERE ceiling_fraction = 0.5") == 1);

    snprintf(bak, sizeof bak, "%s.v10.bak", path);
    db = open_migrated(path, bak, 10);
    CHECK(db != NULL);
    ardb_close(db);
    /* The backup keeps the older name, the file holds the new one with every value. */
    static const char renamed[] = "SELECT count(*) FROM pragma_table_info('measurements') WHERE name = 'ceiling_fraction'";
    CHECK(raw_int(bak, renamed) == 0 && raw_int(path, renamed) == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM measurements WHERE ceiling_fraction = 0.5") == 1 &&
          raw_int(path, "SELECT count(*) FROM measurements WHERE ceiling_fraction = 0") == 8);
    char *after = measurement_rows(path);
    CHECK(after && strcmp(before, after) == 0);
    free(after);
    CHECK(raw_int(path, "SELECT count(*) FROM sqlite_schema WHERE tbl_name = 'measurements' AND name IN"
                        " ('measurements_key', 'measurements_run', 'measurements_append_only')") == 3);
    CHECK(raw_exec(path, "UPDATE measurements SET ceiling_fraction = 1") == SQLITE_CONSTRAINT);

    /* The export as a build before v11 wrote it. */
    char *older = replace_all(a.data, "\"ceiling_fraction\"", "\"roofline\""); /* its key before v11 */
    REQUIRE(older != NULL);
    CHECK(strstr(older, "ceiling_fraction") == NULL);
    path_in_tmp(merged, sizeof merged, "v10-imported.db");
    db = open_db(merged, ARDB_CREATE);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, older, strlen(older), &s) == ARDB_DONE && s.measurements == 9);
    CHECK(raw_int(merged, "SELECT count(*) FROM measurements WHERE ceiling_fraction = 0.5") == 1);
    char *both = replace_all(older, "\"roofline\": 0.5", "\"roofline\": 0.5, \"ceiling_fraction\": 0.5"); /* before v11 */
    REQUIRE(both != NULL);
    path_in_tmp(merged, sizeof merged, "v10-both.db");
    ardb_close(db);
    db = open_db(merged, ARDB_CREATE);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, both, strlen(both), &s) == ARDB_EINVAL);
    CHECK(strstr(ardb_errmsg(db), "measurements[8]") && strstr(ardb_errmsg(db), "its older name"));
    ardb_close(db);
    free(both);
    free(older);
    free(a.data);
    free(before);
}

/* Removes every "provisional": N and "disturbance": X member of an
 * export, as a build before v9 wrote it. */
static void strip_provisional(char *text)
{
    static const char *const members[] = {", \"provisional\": ", ", \"disturbance\": "};
    for (int k = 0; k < 2; k++) {
        char *p;
        while ((p = strstr(text, members[k]))) {
            /* The member's value ends at the next ", \"" or at the
             * object's end; the evidence holds no quote. */
            char *end = p + strlen(members[k]);
            if (*end == '"')
                end = strchr(end + 1, '"') + 1;
            else
                end += strcspn(end, ",}");
            memmove(p, end, strlen(end) + 1);
        }
    }
}

/* The mark and its evidence travel with export and import and with a
 * merge; an export or a source file from before v9 brings ordinary
 * winners, and a mark other than 0 or 1 is refused. */
static void test_provisional_travels_with_export_import_and_merge(void)
{
    char src[600], path[600];
    final_fix f;
    buffer a = {0}, again = {0};
    ardb_merge_stats s;
    ardb *db = make_final_round("prov-src.db", src, sizeof src, evidence, &f);
    REQUIRE(db != NULL);
    CHECK(ardb_export_json(db, 0, buffer_write, &a) == ARDB_DONE);
    {
        buffer c = {0};
        CHECK(ardb_export_csv(db, ARDB_CSV_WINNERS, buffer_write, &c) == ARDB_DONE);
        CHECK(c.data && strstr(c.data, ",measured_in_run,provisional,disturbance\r\n") &&
              strstr(c.data, ",1,1,\"threads waited 61% of the window for a CPU, 0% stolen, 930 preemptions/s\"\r\n") &&
              strstr(c.data, ",2,0,\r\n"));
        free(c.data);
    }
    ardb_close(db);
    REQUIRE(a.data != NULL);
    CHECK(strstr(a.data, "\"provisional\": 1, \"disturbance\": \"threads waited 61%") != NULL);

    db = create_db("prov-imported.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE && s.winners == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE provisional = 1 AND disturbance LIKE 'threads waited 61%'") ==
          1);
    CHECK(ardb_export_json(db, 0, buffer_write, &again) == ARDB_DONE);
    CHECK(again.data && strcmp(a.data, again.data) == 0);
    ardb_close(db);

    db = create_db("prov-merged.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, src, &s) == ARDB_DONE && s.winners == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE provisional = 1 AND disturbance LIKE 'threads waited 61%'") ==
          1);
    ardb_close(db);

    /* A v8 source: its winners are ordinary ones. */
    REQUIRE(schema_back_to(src, 8) == SQLITE_OK);
    db = create_db("prov-merged-v8.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, src, &s) == ARDB_DONE && s.winners == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE provisional = 0 AND disturbance IS NULL") == 2);
    ardb_close(db);

    /* An export of a build before v9. */
    strip_provisional(a.data);
    a.len = strlen(a.data);
    CHECK(strstr(a.data, "provisional") == NULL && strstr(a.data, "disturbance") == NULL);
    db = create_db("prov-older-export.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE && s.winners == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM winners WHERE provisional = 0 AND disturbance IS NULL") == 2);
    check_import_refused(db, "provisional 2", 0,
                         ONE_MEASUREMENT_EXPORT "}],"
                         " \"winners\": [{\"run\": \"rb\", \"problem\": \"mix:f32:d1:n1:h1:replace:epi0:s0:t1\","
                         " \"device\": \"fb\", \"variant\": \"v\", \"source_hash\": \"h\", \"measurement\": 1,"
                         " \"provisional\": 2, \"disturbance\": \"x\"}]}",
                         "inconsistent");
    ardb_close(db);
    free(a.data);
    free(again.data);
}

/* ---- runs, diff ----------------------------------------------------------------- */

static void test_diff_and_resolve(void)
{
    char path[600];
    REQUIRE(make_v1("diff.db", path, sizeof path) == 0);
    ardb *db = open_db(path, 0);
    REQUIRE(db != NULL);

    /* Run 2 against run 1: bf16 slower (100 -> 250), f32 the same (run 2
     * reused run 1's measurement). Problems in key order. */
    ardb_diff_row *rows = NULL;
    size_t n = 0;
    CHECK(ardb_diff_runs(db, 1, 2, &rows, &n) == ARDB_DONE && n == 2);
    if (n == 2) {
        CHECK(strcmp(rows[0].problem, "mix:bf16:d512:n9:h4:additive:epi1:s0:t64") == 0);
        CHECK(rows[0].winner_a && rows[0].winner_b && rows[0].tried_b);
        CHECK(rows[0].us_a == 100.0 && rows[0].us_b == 250.0);
        CHECK(rows[0].spread_a == 1.0 && rows[0].spread_b == 2.0);
        CHECK(strcmp(rows[0].variant_a, "mix_c_bf16_online_v8_u1_t4") == 0);
        CHECK(strcmp(rows[0].variant_b, "mix_c_bf16_online_v1_u1_t1") == 0);
        CHECK(rows[0].ceiling_fraction_b == 0.6);
        CHECK(ardb_diff_classify(&rows[0], 5) == ARDB_CHANGE_SLOWER);
        CHECK(ardb_diff_classify(&rows[0], 200) == ARDB_CHANGE_SAME);
        CHECK(strcmp(rows[1].problem, "mix:f32:d256:n5:h1:replace:epi0:s0:t64") == 0);
        CHECK(rows[1].us_a == 10.0 && rows[1].us_b == 10.0);
        CHECK(ardb_diff_classify(&rows[1], 5) == ARDB_CHANGE_SAME);
    }
    ardb_diff_free(rows, n);
    CHECK(ardb_diff_runs(db, 2, 1, &rows, &n) == ARDB_DONE && n == 2);
    if (n == 2)
        CHECK(ardb_diff_classify(&rows[0], 5) == ARDB_CHANGE_FASTER);
    ardb_diff_free(rows, n);
    CHECK(ardb_diff_runs(db, 1, 9, &rows, &n) == ARDB_ENOTFOUND && rows == NULL && n == 0);
    CHECK(strstr(ardb_errmsg(db), "no run with id 9") != NULL);

    /* Run 3 re-validates f32 and finds it wrong: lost; bf16 not tried:
     * missing. Against run 3 as the baseline, f32 is new in run 2. */
    ardb_run r = {.device_id = 1, .strategy = "revalidate"};
    int64_t run3 = 0, mid = 0;
    REQUIRE(ardb_run_begin(db, &r, &run3) == ARDB_DONE);
    ardb_measurement m = {.run_id = run3, .candidate_id = 1, .problem_id = 1, .device_id = 1,
                          .build_key = "key-a", .status = ARDB_STATUS_WRONG_RESULT, .median_us = NAN,
                          .rel_err = 0.3, .message = "relative error 0.3"};
    REQUIRE(ardb_measurement_add(db, &m, &mid) == ARDB_DONE);
    REQUIRE(ardb_run_finish(db, run3, "complete") == ARDB_DONE);
    CHECK(ardb_diff_runs(db, 2, run3, &rows, &n) == ARDB_DONE && n == 2);
    if (n == 2) {
        CHECK(ardb_diff_classify(&rows[0], 5) == ARDB_CHANGE_MISSING);
        CHECK(ardb_diff_classify(&rows[1], 5) == ARDB_CHANGE_LOST);
        CHECK(rows[1].status_b && strcmp(rows[1].status_b, "wrong_result") == 0);
        CHECK(rows[1].variant_b == NULL && isnan(rows[1].us_b));
    }
    ardb_diff_free(rows, n);
    CHECK(ardb_diff_runs(db, run3, 2, &rows, &n) == ARDB_DONE && n == 2);
    if (n == 2)
        CHECK(ardb_diff_classify(&rows[1], 5) == ARDB_CHANGE_NEW);
    ardb_diff_free(rows, n);

    /* Resolving what a person types. */
    int64_t id = 0;
    CHECK(ardb_run_resolve(db, "2", &id) == ARDB_DONE && id == 2);
    CHECK(ardb_run_resolve(db, "latest", &id) == ARDB_DONE && id == run3);
    CHECK(ardb_run_resolve(db, "latest~2", &id) == ARDB_DONE && id == 1);
    CHECK(ardb_run_resolve(db, "latest~3", &id) == ARDB_ENOTFOUND);
    CHECK(ardb_run_resolve(db, "latest~x", &id) == ARDB_EINVAL);
    CHECK(ardb_run_resolve(db, "9", &id) == ARDB_ENOTFOUND);
    CHECK(ardb_run_resolve(db, "v1:2025-02", &id) == ARDB_DONE && id == 2);
    CHECK(ardb_run_resolve(db, "v1:2025", &id) == ARDB_EINVAL);
    CHECK(strstr(ardb_errmsg(db), "several") != NULL);
    CHECK(ardb_run_resolve(db, "abc", &id) == ARDB_EINVAL);
    CHECK(ardb_run_resolve(db, "zzzzzz", &id) == ARDB_ENOTFOUND);
    CHECK(ardb_run_resolve(db, "", &id) == ARDB_EINVAL);
    {
        ardb_run_info info;
        char prefix[9];
        REQUIRE(ardb_run_get(db, run3, &info) == ARDB_DONE);
        snprintf(prefix, sizeof prefix, "%s", info.uid);
        ardb_run_info_clear(&info);
        CHECK(ardb_run_resolve(db, prefix, &id) == ARDB_DONE && id == run3);
    }
    /* A uid that starts with digits only (about 1 in 40 random ones do)
     * resolves from a numeric prefix that is no run's id. */
    {
        char sql[128];
        snprintf(sql, sizeof sql, "UPDATE runs SET uid = '31415926abc' WHERE id = %lld;",
                 (long long)run3);
        REQUIRE(raw_exec(path, sql) == SQLITE_OK);
        CHECK(ardb_run_resolve(db, "31415926", &id) == ARDB_DONE && id == run3);
        CHECK(ardb_run_resolve(db, "2718", &id) == ARDB_ENOTFOUND);
        CHECK(strstr(ardb_errmsg(db), "no run with id or uid 2718") != NULL);
        CHECK(ardb_run_resolve(db, "2", &id) == ARDB_DONE && id == 2);
    }

    /* The run after a baseline on its device. */
    CHECK(ardb_run_latest_on_device(db, 1, 1, &id) == ARDB_DONE && id == run3);
    CHECK(ardb_run_latest_on_device(db, 1, run3, &id) == ARDB_ENOTFOUND);
    CHECK(ardb_run_latest_on_device(db, 7, 0, &id) == ARDB_ENOTFOUND);

    /* The latency history, in problem order then run. */
    ardb_winner_point *p = NULL;
    CHECK(ardb_winner_history(db, &p, &n) == ARDB_DONE && n == 4);
    if (n == 4) {
        CHECK(p[0].problem_id == 2 && p[0].run_id == 1 && p[0].median_us == 100.0);
        CHECK(p[1].problem_id == 2 && p[1].run_id == 2 && p[1].median_us == 250.0);
        CHECK(p[2].problem_id == 1 && p[3].problem_id == 1 && p[3].run_id == 2);
        CHECK(strcmp(p[0].device, "Old CPU") == 0 && strcmp(p[0].strategy, "exhaustive") == 0);
    }
    ardb_winner_points_free(p, n);
    ardb_close(db);
}

/* ---- stored winners --------------------------------------------------------------- */

static void test_stored_winners_fall_back_like_the_runtime(void)
{
    char path[600];
    REQUIRE(make_v1("stored.db", path, sizeof path) == 0);
    ardb *db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    ardb_stored_winner *w = NULL;
    size_t n = 0;
    ardb_device same = {.backend = "cpu", .arch = "x86_64-avx2",
                        .fingerprint = "cpu|Old CPU|x86_64-avx2|8|17179869184|5.10"};
    CHECK(ardb_stored_winners(db, &same, &w, &n) == ARDB_DONE && n == 2);
    if (n == 2) {
        /* The newest run's winners, with what a re-measurement needs. */
        CHECK(w[0].problem_id == 2 && w[0].run_id == 2 && w[0].candidate_id == 3);
        CHECK(w[0].level == ARDB_LEVEL_EXACT);
        CHECK(strcmp(w[0].dtype, "bf16") == 0 && strcmp(w[0].form, "additive") == 0);
        CHECK(w[0].d == 512 && w[0].n == 9 && w[0].heads == 4 && w[0].epilogue == 1 && w[0].t_bucket == 64);
        CHECK(strcmp(w[0].source, "int c;") == 0 && strcmp(w[0].kernel_name, "attnres_c") == 0);
        CHECK(w[0].median_us == 250.0);
        CHECK(w[1].problem_id == 1 && w[1].candidate_id == 1 && w[1].run_id == 2);
    }
    ardb_stored_winners_free(w, n);
    ardb_device driver_changed = {.backend = "cpu", .arch = "x86_64-avx2", .fingerprint = "cpu|Old CPU|new"};
    CHECK(ardb_stored_winners(db, &driver_changed, &w, &n) == ARDB_DONE && n == 2);
    if (n == 2)
        CHECK(w[0].level == ARDB_LEVEL_ARCHITECTURE && w[1].level == ARDB_LEVEL_ARCHITECTURE);
    ardb_stored_winners_free(w, n);
    ardb_device other_arch = {.backend = "cpu", .arch = "aarch64", .fingerprint = "cpu|arm"};
    CHECK(ardb_stored_winners(db, &other_arch, &w, &n) == ARDB_DONE && n == 2);
    if (n == 2)
        CHECK(w[0].level == ARDB_LEVEL_BACKEND);
    ardb_stored_winners_free(w, n);
    ardb_device gpu = {.backend = "cuda", .arch = "sm_90", .fingerprint = "cuda|H200"};
    CHECK(ardb_stored_winners(db, &gpu, &w, &n) == ARDB_DONE && n == 0 && w == NULL);
    ardb_device bad = {.backend = "cpu"};
    CHECK(ardb_stored_winners(db, &bad, &w, &n) == ARDB_EINVAL);
    ardb_close(db);
}

/* ---- ceilings taken from another database ------------------------------------- */

/* tune --ceilings-from's lookup: the newest run of the same fingerprint
 * that measured the ceilings itself, no older than the age given. */
static void test_measured_ceilings_by_fingerprint_and_age(void)
{
    char path[600];
    path_in_tmp(path, sizeof path, "ceilings.db");
    ardb *db = open_db(path, ARDB_CREATE);
    REQUIRE(db != NULL);
    ardb_device d = {.backend = "cpu", .name = "Some CPU", .arch = "x86_64-avx2", .units = 2, .memory = 1 << 30,
                     .driver = "6.1", .fingerprint = "cpu|Some CPU|x86_64-avx2|2"};
    ardb_device other = {.backend = "cpu", .name = "Other CPU", .arch = "x86_64-avx2", .units = 2,
                         .memory = 1 << 30, .driver = "6.1", .fingerprint = "cpu|Other CPU|x86_64-avx2|2"};
    int64_t dev, odev, measured, carried, uid_carried, unmeasured, elsewhere, found = -1;
    REQUIRE(ardb_device_upsert(db, &d, &dev) == ARDB_DONE && ardb_device_upsert(db, &other, &odev) == ARDB_DONE);
    ardb_run r = {.strategy = "halving", .host = "h", .device_id = dev};
    REQUIRE(ardb_run_begin(db, &r, &measured) == ARDB_DONE && ardb_run_begin(db, &r, &carried) == ARDB_DONE &&
            ardb_run_begin(db, &r, &uid_carried) == ARDB_DONE && ardb_run_begin(db, &r, &unmeasured) == ARDB_DONE);
    r.device_id = odev;
    REQUIRE(ardb_run_begin(db, &r, &elsewhere) == ARDB_DONE);
    const char *json = "{\"copy_gbps\": 30.5, \"read_gbps\": 40}";
    REQUIRE(ardb_run_set_roofs(db, measured, 30.5, 40.0, 0.2) == ARDB_DONE &&
            ardb_run_set_ceilings(db, measured, json) == ARDB_DONE);
    REQUIRE(ardb_run_set_roofs(db, carried, 30.5, 40.0, 0.2) == ARDB_DONE &&
            ardb_run_set_ceilings(db, carried, "{\"carried_from_run\": 1, \"copy_gbps\": 30.5}") == ARDB_DONE);
    REQUIRE(ardb_run_set_roofs(db, uid_carried, 30.5, 40.0, 0.2) == ARDB_DONE &&
            ardb_run_set_ceilings(db, uid_carried, "{\"carried_from_uid\": \"abcd\", \"copy_gbps\": 30.5}") ==
                ARDB_DONE);
    REQUIRE(ardb_run_set_roofs(db, elsewhere, 20.0, 25.0, 0.3) == ARDB_DONE &&
            ardb_run_set_ceilings(db, elsewhere, json) == ARDB_DONE);
    /* The runs that carried theirs and the one that measured none are
     * passed over; the other device's run is not this device's. */
    CHECK(ardb_run_latest_measured_ceilings(db, d.fingerprint, 3600, &found) == ARDB_DONE && found == measured);
    CHECK(ardb_run_latest_measured_ceilings(db, other.fingerprint, 3600, &found) == ARDB_DONE &&
          found == elsewhere);
    CHECK(ardb_run_latest_measured_ceilings(db, "cpu|Unknown", 3600, &found) == ARDB_ENOTFOUND);
    CHECK(ardb_run_latest_measured_ceilings(db, d.fingerprint, -1, &found) == ARDB_EINVAL);
    ardb_close(db);
    /* Two days old: too old for a day's limit, within a week's. */
    REQUIRE(raw_exec(path, "UPDATE runs SET started_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-2 days')") ==
            SQLITE_OK);
    db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    CHECK(ardb_run_latest_measured_ceilings(db, d.fingerprint, 86400, &found) == ARDB_ENOTFOUND);
    CHECK(strstr(ardb_errmsg(db), "86400 s") != NULL);
    CHECK(ardb_run_latest_measured_ceilings(db, d.fingerprint, 7 * 86400, &found) == ARDB_DONE && found == measured);
    ardb_close(db);
}

/* ---- merge ------------------------------------------------------------------------- */

/* A database of its own: device X, two problems, two runs where run 2's
 * winner for P reuses run 1's measurement. */
static ardb *make_shard(const char *name, char *path, size_t len, int64_t *run2)
{
    path_in_tmp(path, len, name);
    ardb *db = open_db(path, ARDB_CREATE);
    if (!db)
        return NULL;
    ardb_device d = {.backend = "cpu", .name = "Shard CPU", .arch = "x86_64-avx512", .units = 4, .memory = 1 << 30,
                     .driver = "6.1", .fingerprint = "cpu|Shard CPU|x86_64-avx512|4"};
    ardb_problem p = {.op = "mix", .dtype = "f32", .form = "replace", .d = 256, .n = 5, .heads = 1, .t_bucket = 64};
    ardb_problem q = {.op = "mix", .dtype = "f32", .form = "replace", .d = 1024, .n = 9, .heads = 1, .t_bucket = 64};
    ardb_candidate c1 = {.template_name = "cpu/mix", .variant = "v_fast", .source_hash = "h1", .source = "int f;",
                         .kernel_name = "k1", .backend = "cpu"};
    ardb_candidate c2 = {.template_name = "cpu/mix", .variant = "v_slow", .source_hash = "h2", .source = "int s;",
                         .kernel_name = "k2", .backend = "cpu"};
    int64_t dev, pid, qid, cid1, cid2, r1, r2, m1;
    ardb_run r = {.strategy = "exhaustive", .host = "shard", .read_gbps = 27.5};
    ardb_binary b = {.build_key = "bk-shard", .blob = "xyz", .size = 3};
    if (ardb_device_upsert(db, &d, &dev) || ardb_problem_upsert(db, &p, &pid) ||
        ardb_problem_upsert(db, &q, &qid) || ardb_candidate_upsert(db, &c1, &cid1) ||
        ardb_candidate_upsert(db, &c2, &cid2))
        goto fail;
    b.candidate_id = cid1;
    r.device_id = dev;
    if (ardb_binary_put(db, &b) || ardb_run_begin(db, &r, &r1))
        goto fail;
    if (!(m1 = add_winner(db, r1, cid1, pid, dev, 20.0, 0.5)) || !add_winner(db, r1, cid1, qid, dev, 80.0, 1.0) ||
        ardb_run_finish(db, r1, "complete") || ardb_run_begin(db, &r, &r2) ||
        ardb_winner_set(db, r2, pid, dev, cid1, m1) || !add_winner(db, r2, cid2, qid, dev, 160.0, 1.0) ||
        ardb_run_finish(db, r2, "complete"))
        goto fail;
    *run2 = r2;
    return db;
fail:
    fprintf(stderr, "make_shard: %s\n", ardb_errmsg(db));
    ardb_close(db);
    return NULL;
}

static void test_merge_without_duplicates(void)
{
    char shard[600], dst[600], v1[600], path[600];
    ardb_merge_stats s;
    int64_t run2 = 0, id;
    ardb *a = make_shard("shard.db", shard, sizeof shard, &run2);
    REQUIRE(a != NULL);
    ardb_close(a);

    /* Into the migrated fixture, which has its own device and history. */
    REQUIRE(make_v1("dst.db", dst, sizeof dst) == 0);
    ardb *db = open_db(dst, 0);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, shard, &s) == ARDB_DONE);
    CHECK(s.devices == 1 && s.problems == 1 && s.candidates == 2 && s.binaries == 1);
    CHECK(s.runs == 2 && s.measurements == 3 && s.winners == 4);
    CHECK(ardb_merge(db, shard, &s) == ARDB_DONE && stats_zero(&s));
    /* The shard's read bandwidth came along; the fixture's runs have none. */
    CHECK(raw_int(dst, "SELECT count(*) FROM runs WHERE host = 'shard' AND read_gbps = 27.5") == 2);
    CHECK(raw_int(dst, "SELECT count(*) FROM runs WHERE host = 'builder' AND read_gbps IS NULL") == 2);
    /* The merged runs compare as they did at home (ids re-mapped, run 2's
     * reused winner pointing at run 1's measurement). */
    ardb_diff_row *rows = NULL;
    size_t n = 0;
    CHECK(ardb_run_resolve(db, "latest", &id) == ARDB_DONE && id == 4);
    CHECK(ardb_diff_runs(db, 3, 4, &rows, &n) == ARDB_DONE && n == 2);
    if (n == 2) {
        CHECK(strcmp(rows[0].problem, "mix:f32:d256:n5:h1:replace:epi0:s0:t64") == 0);
        CHECK(rows[0].us_a == 20.0 && rows[0].us_b == 20.0);
        CHECK(rows[1].us_a == 80.0 && rows[1].us_b == 160.0);
        CHECK(ardb_diff_classify(&rows[1], 5) == ARDB_CHANGE_SLOWER);
        CHECK(strcmp(rows[1].variant_b, "v_slow") == 0);
    }
    ardb_diff_free(rows, n);
    CHECK(raw_int(dst, "SELECT count(*) FROM winners w JOIN measurements m ON m.id = w.measurement_id"
                       " WHERE w.run_id = 4 AND m.run_id = 3") == 1);
    void *blob = NULL;
    size_t size = 0;
    CHECK(ardb_binary_get(db, "bk-shard", &blob, &size) == ARDB_DONE && size == 3 && !memcmp(blob, "xyz", 3));
    free(blob);

    /* Errors: itself, a missing file, a newer file, a read-only handle. */
    CHECK(ardb_merge(db, dst, &s) == ARDB_EINVAL && strstr(ardb_errmsg(db), "itself"));
    path_in_tmp(path, sizeof path, "missing.db");
    CHECK(ardb_merge(db, path, &s) == ARDB_ENOTDB && strstr(ardb_errmsg(db), "no such database file"));
    REQUIRE(make_v1("newer-src.db", path, sizeof path) == 0);
    REQUIRE(raw_exec(path, "PRAGMA user_version = 99;") == SQLITE_OK);
    CHECK(ardb_merge(db, path, &s) == ARDB_ENEWER);
    CHECK(ardb_begin(db) == ARDB_DONE);
    CHECK(ardb_merge(db, shard, &s) == ARDB_EINVAL && strstr(ardb_errmsg(db), "transaction"));
    CHECK(ardb_rollback(db) == ARDB_DONE);
    ardb_close(db);
    db = open_db(dst, ARDB_READONLY);
    CHECK(db && ardb_merge(db, shard, &s) == ARDB_EREADONLY);
    ardb_close(db);

    /* From a v1 file that is only read (and stays v1); once that file is
     * migrated, merging it again adds nothing: run identities agree. */
    REQUIRE(make_v1("old.db", v1, sizeof v1) == 0);
    db = create_db("fresh.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_merge(db, v1, &s) == ARDB_DONE);
    CHECK(s.devices == 1 && s.problems == 2 && s.candidates == 3 && s.binaries == 1);
    CHECK(s.runs == 2 && s.measurements == 4 && s.winners == 4);
    CHECK(raw_int(v1, "PRAGMA user_version") == 1);
    ardb *old = open_db(v1, 0); /* migrates */
    CHECK(old != NULL);
    ardb_close(old);
    CHECK(raw_int(v1, "PRAGMA user_version") == ARDB_SCHEMA_VERSION);
    CHECK(ardb_merge(db, v1, &s) == ARDB_DONE && stats_zero(&s));
    /* Runs merged from a file without the column have none. */
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE read_gbps IS NULL") == 2);
    /* A v2 file that is only read merges too, and its runs are the same. */
    {
        char v2[600];
        REQUIRE(make_v2("old2.db", v2, sizeof v2) == 0);
        CHECK(ardb_merge(db, v2, &s) == ARDB_DONE && stats_zero(&s));
        CHECK(raw_int(v2, "PRAGMA user_version") == 2);
    }

    /* A run merged while running gets its end and its later rows. */
    a = open_db(shard, 0);
    REQUIRE(a != NULL);
    ardb_run r = {.device_id = 1, .strategy = "exhaustive"};
    int64_t r3 = 0;
    REQUIRE(ardb_run_begin(a, &r, &r3) == ARDB_DONE);
    CHECK(add_winner(a, r3, 1, 1, 1, 19.0, 0.4) != 0);
    CHECK(ardb_merge(db, shard, &s) == ARDB_DONE && s.runs == 3 && s.measurements == 4);
    CHECK(add_winner(a, r3, 2, 2, 1, 90.0, 0.4) != 0);
    CHECK(ardb_run_finish(a, r3, "complete") == ARDB_DONE);
    ardb_close(a);
    CHECK(ardb_merge(db, shard, &s) == ARDB_DONE);
    CHECK(s.runs == 0 && s.measurements == 1 && s.winners == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE status = 'running'") == 0);
    CHECK(ardb_merge(db, shard, &s) == ARDB_DONE && stats_zero(&s));
    ardb_close(db);
}

/* ---- export and import -------------------------------------------------------------- */

static void test_export_import_round_trip(void)
{
    char src[600], path[600], path2[600];
    buffer a = {0}, b = {0}, nosrc = {0};
    ardb_merge_stats s;
    REQUIRE(make_v1("exp.db", src, sizeof src) == 0);
    ardb *db = open_db(src, 0);
    REQUIRE(db != NULL);
    CHECK(ardb_run_set_note(db, 2, "driver \"5.11\"\tupgrade") == ARDB_DONE);
    /* Run 2 has a read bandwidth, run 1 (recorded before v3) none. */
    REQUIRE(raw_exec(src, "UPDATE runs SET read_gbps = 27.5 WHERE id = 2;") == SQLITE_OK);
    CHECK(ardb_export_json(db, 0, buffer_write, &a) == ARDB_DONE);
    CHECK(ardb_export_json(db, ARDB_EXPORT_NO_SOURCE, buffer_write, &nosrc) == ARDB_DONE);
    CHECK(ardb_export_json(db, 0, failing_write, NULL) != ARDB_DONE);
    CHECK(strstr(ardb_errmsg(db), "writing the output failed") != NULL);
    CHECK(ardb_export_json(db, 0x80, buffer_write, &b) == ARDB_EINVAL);
    ardb_close(db);
    REQUIRE(a.data != NULL && nosrc.data != NULL);
    CHECK(strncmp(a.data, "{\"format\": \"attnres-export\", \"version\": 1", 41) == 0);
    CHECK(strstr(a.data, "\"source\": \"int c;\"") != NULL);
    CHECK(strstr(nosrc.data, "\"source\": \"int c;\"") == NULL);
    CHECK(strstr(a.data, "\"note\": \"driver \\\"5.11\\\"\\tupgrade\"") != NULL);
    CHECK(strstr(a.data, "\"read_gbps\": 27.5, ") != NULL);
    CHECK(strstr(a.data, "\"read_gbps\": null, ") != NULL);

    /* Into an empty database: everything, in the same order, so that its
     * own export is the same text. Twice: nothing more. */
    db = create_db("imported.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE);
    CHECK(s.devices == 1 && s.problems == 2 && s.candidates == 3 && s.binaries == 0);
    CHECK(s.runs == 2 && s.measurements == 4 && s.winners == 4);
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE && stats_zero(&s));
    CHECK(ardb_export_json(db, 0, buffer_write, &b) == ARDB_DONE);
    CHECK(b.data && strcmp(a.data, b.data) == 0);
    {
        ardb_run_info *runs = NULL;
        size_t n = 0;
        CHECK(ardb_run_list(db, &runs, &n) == ARDB_DONE && n == 2);
        if (n == 2) {
            CHECK(strcmp(runs[1].uid, "v1:2025-02-01T10:00:00.000Z:builder:2") == 0);
            CHECK(runs[1].read_gbps == 27.5);
            CHECK(isnan(runs[0].read_gbps));
        }
        ardb_run_infos_free(runs, n);
    }
    ardb_close(db);

    /* An export of an older build has no "read_gbps", and a newer one may
     * have members this build does not know: both import, the first with
     * no read bandwidth, the unknown members ignored. A read bandwidth of
     * 0 means not measured. */
    {
        static const char older[] =
            "{\"format\": \"attnres-export\", \"version\": 1, \"schema_version\": 2,\n"
            "\"devices\": [{\"fingerprint\": \"fp-old\", \"backend\": \"cpu\", \"future\": [1, {\"x\": 2}]}],\n"
            "\"runs\": [{\"uid\": \"old-run\", \"started_at\": \"2025-03-01T00:00:00.000Z\","
            " \"status\": \"complete\", \"device\": \"fp-old\", \"copy_gbps\": 30.5, \"note\": null},\n"
            " {\"uid\": \"new-run\", \"started_at\": \"2025-03-02T00:00:00.000Z\", \"status\": \"complete\","
            " \"device\": \"fp-old\", \"read_gbps\": 12.25, \"ceiling_kind\": \"read\"},\n"
            " {\"uid\": \"zero-run\", \"started_at\": \"2025-03-03T00:00:00.000Z\", \"status\": \"complete\","
            " \"read_gbps\": 0}],\n"
            "\"future_section\": [{\"a\": 1}]}\n";
        static const char bad_type[] =
            "{\"format\": \"attnres-export\", \"version\": 1, \"runs\": [{\"uid\": \"r\", \"started_at\": \"t\","
            " \"status\": \"complete\", \"read_gbps\": \"fast\"}]}";
        ardb_run_info *runs = NULL;
        size_t n = 0;
        db = create_db("older-export.db", path2, sizeof path2);
        REQUIRE(db != NULL);
        CHECK(ardb_import_json(db, older, strlen(older), &s) == ARDB_DONE && s.runs == 3 && s.devices == 1);
        CHECK(ardb_run_list(db, &runs, &n) == ARDB_DONE && n == 3);
        if (n == 3) {
            CHECK(strcmp(runs[0].uid, "old-run") == 0 && isnan(runs[0].read_gbps) && runs[0].copy_gbps == 30.5);
            CHECK(strcmp(runs[1].uid, "new-run") == 0 && runs[1].read_gbps == 12.25);
            CHECK(strcmp(runs[2].uid, "zero-run") == 0 && isnan(runs[2].read_gbps));
        }
        ardb_run_infos_free(runs, n);
        check_import_refused(db, "read_gbps as a string", 0, bad_type, "\"read_gbps\" must be a number");
        ardb_close(db);
    }

    /* Without sources first: the later full import fills them in. */
    db = create_db("nosource.db", path2, sizeof path2);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, nosrc.data, nosrc.len, &s) == ARDB_DONE && s.candidates == 3);
    CHECK(raw_int(path2, "SELECT count(*) FROM candidates WHERE source IS NULL") == 3);
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE && stats_zero(&s));
    CHECK(raw_int(path2, "SELECT count(*) FROM candidates WHERE source IS NULL") == 0);

    /* Bad input: refused whole, with a message that says where. */
    static const import_refusal bad[] = {
        {"{\"format\": \"attnres-export\", \"version\": 1,\n \"runs\": [}", "line 2"},
        {"[1, 2]", "not an attnres export"},
        {"{\"format\": \"something else\", \"version\": 1}", "not an attnres export"},
        {"{\"format\": \"attnres-export\", \"version\": 7}", "version"},
        {"{\"format\": \"attnres-export\", \"version\": 1, \"runs\": {}}", "must be an array"},
        {"{\"format\": \"attnres-export\", \"version\": 1, \"devices\": [{\"backend\": \"cpu\"}]}",
         "\"fingerprint\" is missing"},
        {"{\"format\": \"attnres-export\", \"version\": 1, \"devices\": [{\"backend\": \"cpu\", "
         "\"fingerprint\": 5}]}",
         "must be a string"},
        {"{\"format\": \"attnres-export\", \"version\": 1, \"problems\": [{\"key\": \"mix:f32:d1:n1:h1:replace:epi0:"
         "s0:t1\", \"op\": \"mix\", \"dtype\": \"f32\", \"form\": \"replace\", \"d\": 2, \"n\": 1, \"heads\": 1, "
         "\"epilogue\": 0, \"s\": 0, \"t_bucket\": 1}]}",
         "inconsistent"},
        {"{\"format\": \"attnres-export\", \"version\": 1, \"measurements\": [{\"id\": 1, \"run\": \"r\", "
         "\"problem\": \"p\", \"variant\": \"v\", \"source_hash\": \"h\", \"device\": \"d\", \"status\": \"ok\", "
         "\"created_at\": \"t\"}]}",
         "does not define"},
        {"{\"format\": \"attnres-export\", \"version\": 1, \"devices\": [{\"backend\": \"cpu\", "
         "\"fingerprint\": \"\\ud800\"}]}",
         "surrogate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        check_import_refused(db, "bad input", i, bad[i].text, bad[i].msg);
    /* A file whose last row is bad adds nothing at all. */
    {
        const char *tail = "{\"format\": \"attnres-export\", \"version\": 1, \"devices\": [{\"backend\": \"cpu\", "
                           "\"fingerprint\": \"new-device\"}], \"winners\": [{\"run\": \"nope\", \"problem\": \"p\", "
                           "\"device\": \"new-device\", \"variant\": \"v\", \"source_hash\": \"h\", "
                           "\"measurement\": 1}]}";
        CHECK(ardb_import_json(db, tail, strlen(tail), &s) == ARDB_EINVAL);
        CHECK(raw_int(path2, "SELECT count(*) FROM devices WHERE fingerprint = 'new-device'") == 0);
    }
    /* The handle is still usable afterwards. */
    CHECK(ardb_import_json(db, a.data, a.len, &s) == ARDB_DONE && stats_zero(&s));
    ardb_close(db);
    free(a.data);
    free(b.data);
    free(nosrc.data);
}

static void test_csv_export(void)
{
    char path[600];
    buffer m = {0}, w = {0}, r = {0};
    REQUIRE(make_v1("csv.db", path, sizeof path) == 0);
    ardb *db = open_db(path, ARDB_READONLY); /* a v1 file, read as it is */
    REQUIRE(db != NULL);
    CHECK(ardb_export_csv(db, ARDB_CSV_MEASUREMENTS, buffer_write, &m) == ARDB_DONE);
    CHECK(ardb_export_csv(db, ARDB_CSV_WINNERS, buffer_write, &w) == ARDB_DONE);
    CHECK(ardb_export_csv(db, ARDB_CSV_RUNS, buffer_write, &r) == ARDB_DONE);
    CHECK(ardb_export_csv(db, (ardb_csv_table)9, buffer_write, &r) == ARDB_EINVAL);
    ardb_close(db);
    REQUIRE(m.data && w.data && r.data);
    {
        static const char head[] = "measurement_id,run_id,run_uid,run_started_at,";
        CHECK(strncmp(m.data, head, sizeof head - 1) == 0);
    }
    CHECK(strstr(m.data, ",\"a, \"\"quoted\"\" message\",") != NULL);
    size_t lines = 0;
    for (const char *p = m.data; *p; p++)
        lines += *p == '\n';
    CHECK(lines == 5); /* header + 4 measurements */
    /* The winners table holds run 2's reused winner too. */
    lines = 0;
    for (const char *p = w.data; *p; p++)
        lines += *p == '\n';
    CHECK(lines == 5);
    /* Last, whether each is provisional and the evidence: none in a v1 file. */
    CHECK(strstr(w.data, ",mix_c_bf16_online_v1_u1_t1,250,2,12,0.59999999999999998,2,0,\r\n") != NULL);
    CHECK(strstr(r.data, "v1:2025-02-01T10:00:00.000Z:builder:2") != NULL);
    /* The runs table has the read bandwidth last, empty for a v1 file. */
    CHECK(strstr(r.data, ",launch_us,note,read_gbps\r\n") != NULL);
    free(m.data);
    free(w.data);
    free(r.data);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    /* --list runs no case, so it needs no fixture. */
    if (!check_listing && (argc < 2 || !(fixture_sql = file_read(argv[1])))) {
        fprintf(stderr, "usage: test_db_history [--list] [--case NAME]... FIXTURE.sql "
                        "(tests/db/fixtures/db_v1.sql)\n");
        return 2;
    }
    db_scratch_begin("db-history");
    RUN_CASE(test_classify_noise_and_threshold);
    RUN_CASE(test_v1_file_read_only_then_migrated);
    RUN_CASE(test_schema_is_what_v1_wrote_and_its_migrations_made);
    RUN_CASE(test_v2_file_read_only_then_migrated);
    RUN_CASE(test_v3_file_read_only_then_migrated);
    RUN_CASE(test_final_round_from_v6_and_v7_files);
    RUN_CASE(test_final_round_travels_with_export_import_and_merge);
    RUN_CASE(test_provisional_winner_read_everywhere);
    RUN_CASE(test_screening_spreads);
    RUN_CASE(test_v8_file_has_no_provisional_winner);
    RUN_CASE(test_v9_file_takes_nondeterministic_after_migration);
    RUN_CASE(test_nondeterministic_travels);
    RUN_CASE(test_v10_file_renamed_to_ceiling_fraction);
    RUN_CASE(test_provisional_travels_with_export_import_and_merge);
    RUN_CASE(test_diff_and_resolve);
    RUN_CASE(test_stored_winners_fall_back_like_the_runtime);
    RUN_CASE(test_measured_ceilings_by_fingerprint_and_age);
    RUN_CASE(test_merge_without_duplicates);
    RUN_CASE(test_export_import_round_trip);
    RUN_CASE(test_csv_export);
    free(fixture_sql);
    CHECK_EXIT();
}
