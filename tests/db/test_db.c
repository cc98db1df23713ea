/*
 * test_db.c - unit tests of the tuning database access layer (db/core/ardb.h, db/tools/ardb_tools.h).
 *
 * Every database lives in a fresh mkdtemp directory under $TMPDIR (or /tmp),
 * removed at the end.
 */
#define _GNU_SOURCE /* nftw, FTW_PHYS */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "check.h"
#include "test_db_run.h"
#include "test_db_scratch.h"
#include "test_files.h"
#include "test_scratch.h"
#include "test_sqlite.h"


/* ---- fixtures ------------------------------------------------------------- */

static ardb_device dev_make(const char *backend, const char *name,
                            const char *arch, const char *fp)
{
    return (ardb_device){.backend = backend, .name = name, .arch = arch, .driver = "12.4", .fingerprint = fp,
                         .units = 132, .memory = INT64_C(150) << 30};
}

static ardb_problem prob_make(int64_t t)
{
    return (ardb_problem){.op = "mix", .dtype = "bf16", .form = "replace", .d = 7168, .n = 9, .heads = 1,
                          .epilogue = 0, .s = 0, .t_bucket = t};
}

static ardb_candidate cand_make(const char *variant, const char *hash)
{
    return (ardb_candidate){.template_name = "cuda/mix", .variant = variant, .params_json = "{\"vec\":8}",
                            .source_hash = hash, .source = "__global__ void k(){}", .kernel_name = "k",
                            .backend = "cuda"};
}

static ardb_measurement meas_make(int64_t run, int64_t cand, int64_t prob,
                                  int64_t dev, const char *bk, double med)
{
    ardb_measurement m;
    memset(&m, 0, sizeof m);
    m.run_id = run;
    m.candidate_id = cand;
    m.problem_id = prob;
    m.device_id = dev;
    m.build_key = bk;
    m.status = ARDB_STATUS_OK;
    m.median_us = med;
    m.min_us = med * 0.9;
    m.max_us = med * 1.2;
    m.spread_us = med * 0.01;
    m.reps = 50;
    m.gbps = 1000.0 / med;
    m.ceiling_fraction = 0.5;
    m.rel_err = 1e-6;
    return m;
}

/* ---- cases ------------------------------------------------------------------- */

static void test_create_reopen(void)
{
    char path[600], msg[256];
    ardb *db = create_db("create.db", path, sizeof path), *db2 = NULL;
    REQUIRE(db != NULL);
    CHECK(strcmp(ardb_errmsg(db), "") == 0);
    ardb_close(db);
    CHECK(ARDB_SCHEMA_VERSION == 11);
    CHECK(raw_int(path, "PRAGMA user_version") == 11);
    CHECK(raw_int(path, "SELECT count(*) FROM attnres_meta WHERE key = "
                        "'schema_version' AND value = '11'") == 1);
    /* A new file has the shape of a migrated one: v1 plus every delta. */
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('runs') "
                        "WHERE name IN ('uid', 'note', 'read_gbps')") == 3);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('devices') "
                        "WHERE name = 'simulated' AND \"notnull\" = 1 "
                        "AND dflt_value = '0'") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('measurements') "
                        "WHERE name = 'ceiling_fraction'") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM attnres_meta WHERE key = "
                        "'format' AND value = 'attnres-tuning-db'") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM sqlite_schema WHERE name IN "
                        "('devices','runs','problems','candidates','binaries',"
                        "'measurements','winners')") == 7);
    /* WAL is persistent in the file header: read it back. */
    {
        sqlite3 *h = NULL;
        sqlite3_stmt *st = NULL;
        const unsigned char *mode = NULL;
        CHECK(sqlite3_open_v2(path, &h, SQLITE_OPEN_READONLY, NULL) ==
              SQLITE_OK);
        CHECK(sqlite3_prepare_v2(h, "PRAGMA journal_mode", -1, &st, NULL) ==
              SQLITE_OK);
        if (st && sqlite3_step(st) == SQLITE_ROW)
            mode = sqlite3_column_text(st, 0);
        CHECK(mode && strcmp((const char *)mode, "wal") == 0);
        sqlite3_finalize(st);
        sqlite3_close(h);
    }

    /* Reopen read-write without CREATE, with CREATE again, and read-only. */
    CHECK(ardb_open(path, 0, &db, msg, sizeof msg) == ARDB_DONE);
    CHECK(db != NULL);
    CHECK(ardb_open(path, ARDB_CREATE, &db2, msg, sizeof msg) == ARDB_DONE);
    ardb_close(db2);
    db2 = NULL;
    CHECK(ardb_open(path, ARDB_READONLY, &db2, msg, sizeof msg) == ARDB_DONE);
    CHECK(db2 != NULL);
    /* A read-only handle refuses writes. */
    if (db2) {
        ardb_device d = dev_make("cpu", "x", "x86_64", "fp-ro");
        int64_t id = 0;
        CHECK(ardb_device_upsert(db2, &d, &id) == ARDB_EREADONLY);
        CHECK(strstr(ardb_errmsg(db2), "read-only") != NULL);
        CHECK(ardb_begin(db2) == ARDB_DONE); /* a read snapshot */
        CHECK(ardb_commit(db2) == ARDB_DONE);
    }
    ardb_close(db2);
    ardb_close(db);
    ardb_close(NULL);
    CHECK(strcmp(ardb_errmsg(NULL), "") != 0);

    /* Bad arguments. */
    db = (ardb *)1;
    CHECK(ardb_open(path, ARDB_READONLY | ARDB_CREATE, &db, msg, sizeof msg) ==
          ARDB_EINVAL);
    CHECK(db == NULL);
    CHECK(ardb_open(NULL, 0, &db, NULL, 0) == ARDB_EINVAL);
    CHECK(ardb_open(path, 0x100, &db, msg, sizeof msg) == ARDB_EINVAL);
}

static void expect_open(const char *path, unsigned flags, int code,
                        const char *msg_part, int line)
{
    char msg[512] = "untouched";
    ardb *db = (ardb *)1;
    int rc = ardb_open(path, flags, &db, msg, sizeof msg);
    int bad = rc != code || (code == ARDB_DONE ? db == NULL || db == (ardb *)1
                                               : db != NULL) ||
              (msg_part && !strstr(msg, msg_part));
    if (bad) {
        fprintf(stderr, "line %d: open(%s, %u) = %d (want %d), msg '%s' "
                        "(want '%s')\n",
                line, path, flags, rc, code, msg,
                msg_part ? msg_part : "");
        check_failures++;
    }
    if (rc == ARDB_DONE && db && db != (ardb *)1)
        ardb_close(db);
}
#define EXPECT_OPEN(p, f, c, m) expect_open((p), (f), (c), (m), __LINE__)

static void test_open_errors(void)
{
    char path[600], want[800];
    struct stat sb;
    ardb *db;

    /* Missing file: read-only and read-write without CREATE. */
    path_in_tmp(path, sizeof path, "missing.db");
    snprintf(want, sizeof want, "no such database file: %s", path);
    EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
    EXPECT_OPEN(path, 0, ARDB_ENOTDB, want);
    CHECK(stat(path, &sb) != 0); /* nothing was created */

    /* Text garbage: refused, and not modified by a read-write open. */
    {
        static const char junk[] =
            "this is not a database, just some text that is long enough to "
            "fill the SQLite header and then some more words.\n";
        path_in_tmp(path, sizeof path, "garbage.db");
        file_write(path, junk, sizeof junk - 1);
        snprintf(want, sizeof want, "%s is not an SQLite database", path);
        EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
        EXPECT_OPEN(path, 0, ARDB_ENOTDB, want);
        EXPECT_OPEN(path, ARDB_CREATE, ARDB_ENOTDB, want);
        CHECK(stat(path, &sb) == 0 && (size_t)sb.st_size == sizeof junk - 1);
        /* a short file */
        path_in_tmp(path, sizeof path, "short.db");
        file_write(path, "hello\n", 6);
        snprintf(want, sizeof want, "%s is not an SQLite database", path);
        EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
        /* binary garbage of a few pages */
        {
            unsigned char buf[3 * 4096];
            size_t i;
            uint32_t x = 12345;
            for (i = 0; i < sizeof buf; i++) {
                x = x * 1103515245u + 12345u;
                buf[i] = (unsigned char)(x >> 16);
            }
            path_in_tmp(path, sizeof path, "random.db");
            file_write(path, buf, sizeof buf);
            snprintf(want, sizeof want, "%s is not an SQLite database", path);
            EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
            EXPECT_OPEN(path, 0, ARDB_ENOTDB, want);
        }
    }

    /* A truncated attnres database: only part of its first page is left. */
    {
        char src[600];
        db = create_db("full.db", src, sizeof src);
        REQUIRE(db != NULL);
        ardb_close(db); /* checkpoints the WAL into the main file */
        path_in_tmp(path, sizeof path, "truncated.db");
        {
            FILE *f = fopen(src, "rb");
            unsigned char buf[4096 + 1000];
            size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
            if (f)
                fclose(f);
            REQUIRE(n == sizeof buf);
            file_write(path, buf, 1000); /* mid first page */
            snprintf(want, sizeof want, "%s is not an SQLite database", path);
            EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
            EXPECT_OPEN(path, 0, ARDB_ENOTDB, want);
            file_write(path, buf, 50); /* mid header */
            EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
        }
    }

    /* A plain SQLite database, and an empty file. */
    path_in_tmp(path, sizeof path, "plain.db");
    CHECK(raw_exec(path, "CREATE TABLE foo(x); INSERT INTO foo VALUES(1);") ==
          SQLITE_OK);
    snprintf(want, sizeof want, "%s is not an attnres database", path);
    EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
    EXPECT_OPEN(path, 0, ARDB_ENOTDB, want);
    EXPECT_OPEN(path, ARDB_CREATE, ARDB_ENOTDB, want); /* never adopted */
    CHECK(raw_int(path, "SELECT count(*) FROM sqlite_schema") == 1);
    path_in_tmp(path, sizeof path, "othermeta.db");
    CHECK(raw_exec(path, "CREATE TABLE attnres_meta(key, value);"
                         "INSERT INTO attnres_meta VALUES('format','other');"
                         "PRAGMA user_version = 1;") == SQLITE_OK);
    snprintf(want, sizeof want, "%s is not an attnres database", path);
    EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
    path_in_tmp(path, sizeof path, "empty.db");
    file_write(path, "", 0);
    snprintf(want, sizeof want, "%s is not an attnres database", path);
    EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENOTDB, want);
    EXPECT_OPEN(path, 0, ARDB_ENOTDB, want);
    /* ...but CREATE on an empty file (e.g. from mkstemp) makes the schema. */
    EXPECT_OPEN(path, ARDB_CREATE, ARDB_DONE, NULL);
    EXPECT_OPEN(path, ARDB_READONLY, ARDB_DONE, NULL);

    /* A directory. */
    EXPECT_OPEN(tmpdir, ARDB_READONLY, ARDB_ENOTDB, "directory");

    /* A newer schema version. */
    db = create_db("newer.db", path, sizeof path);
    REQUIRE(db != NULL);
    ardb_close(db);
    CHECK(raw_exec(path, "PRAGMA user_version = 12") == SQLITE_OK);
    EXPECT_OPEN(path, ARDB_READONLY, ARDB_ENEWER,
                "database schema version 12 is newer than this build (11)");
    EXPECT_OPEN(path, 0, ARDB_ENEWER, "is newer than this build");
    EXPECT_OPEN(path, ARDB_CREATE, ARDB_ENEWER, "is newer than this build");
    CHECK(raw_int(path, "PRAGMA user_version") == 12);
}

static void test_upserts(void)
{
    char path[600], key[128];
    ardb *db = create_db("upsert.db", path, sizeof path);
    ardb_device d1 = dev_make("cuda", "NVIDIA H200", "sm_90", "cuda|H200|1");
    ardb_device d2 = dev_make("cuda", "NVIDIA H200", "sm_90", "cuda|H200|2");
    ardb_problem p = prob_make(4096);
    ardb_candidate c = cand_make("mix_v8", "aaaa");
    int64_t a = 0, b = 0, x = 0;
    REQUIRE(db != NULL);

    CHECK(ardb_device_upsert(db, &d1, &a) == ARDB_DONE);
    CHECK(ardb_device_upsert(db, &d1, &b) == ARDB_DONE);
    CHECK(a > 0 && a == b);
    CHECK(ardb_device_upsert(db, &d2, &x) == ARDB_DONE);
    CHECK(x > 0 && x != a);
    d1.name = "renamed"; /* same fingerprint: still the same row */
    CHECK(ardb_device_upsert(db, &d1, &b) == ARDB_DONE && b == a);
    d1.fingerprint = NULL;
    CHECK(ardb_device_upsert(db, &d1, &b) == ARDB_EINVAL);

    ardb_problem_key(&p, key, sizeof key);
    CHECK(strcmp(key, "mix:bf16:d7168:n9:h1:replace:epi0:s0:t4096") == 0);
    {
        const ardb_problem q = {.op = "phase1", .dtype = "f32", .form = "additive", .d = 4096, .n = 73,
                                .heads = 8, .epilogue = 1, .s = 4, .t_bucket = 1};
        ardb_problem_key(&q, key, sizeof key);
        CHECK(strcmp(key, "phase1:f32:d4096:n73:h8:additive:epi1:s4:t1") == 0);
        ardb_problem_key(&q, key, 8); /* truncates safely */
        CHECK(strlen(key) == 7);
    }
    CHECK(ardb_problem_upsert(db, &p, &a) == ARDB_DONE);
    CHECK(ardb_problem_upsert(db, &p, &b) == ARDB_DONE);
    CHECK(a > 0 && a == b);
    p.t_bucket = 1;
    CHECK(ardb_problem_upsert(db, &p, &x) == ARDB_DONE && x != a);

    CHECK(ardb_candidate_upsert(db, &c, &a) == ARDB_DONE);
    CHECK(ardb_candidate_upsert(db, &c, &b) == ARDB_DONE);
    CHECK(a > 0 && a == b);
    c.source_hash = "bbbb";
    CHECK(ardb_candidate_upsert(db, &c, &x) == ARDB_DONE && x != a);
    c.variant = NULL;
    CHECK(ardb_candidate_upsert(db, &c, &x) == ARDB_EINVAL);

    ardb_close(db);
    CHECK(raw_int(path, "SELECT count(*) FROM devices") == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM problems") == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM candidates") == 2);
    CHECK(raw_int(path, "SELECT count(*) FROM devices WHERE created_at LIKE "
                        "'____-__-__T__:__:__.___Z'") == 2);
}

static void test_binaries(void)
{
    char path[600];
    ardb *db = create_db("bin.db", path, sizeof path);
    ardb_candidate c = cand_make("v", "h");
    ardb_binary b;
    unsigned char blob[70000];
    void *out = NULL;
    size_t size = 0, i;
    int64_t cid = 0;
    REQUIRE(db != NULL);
    for (i = 0; i < sizeof blob; i++)
        blob[i] = (unsigned char)(i * 7 + 3);
    blob[10] = 0;
    CHECK(ardb_candidate_upsert(db, &c, &cid) == ARDB_DONE);
    memset(&b, 0, sizeof b);
    b.build_key = "bk-1";
    b.candidate_id = cid;
    b.compiler = "nvrtc 12.4";
    b.options = "-arch=sm_90 -O3";
    b.target = "sm_90";
    b.blob = blob;
    b.size = sizeof blob;
    b.resources_json = "{\"regs\":32}";
    CHECK(ardb_binary_put(db, &b) == ARDB_DONE);
    CHECK(ardb_binary_get(db, "bk-1", &out, &size) == ARDB_DONE);
    CHECK(size == sizeof blob && out && memcmp(out, blob, size) == 0);
    free(out);
    out = NULL;

    /* A second put with the same key is a no-op. */
    b.blob = "other";
    b.size = 5;
    CHECK(ardb_binary_put(db, &b) == ARDB_DONE);
    CHECK(ardb_binary_get(db, "bk-1", &out, &size) == ARDB_DONE);
    CHECK(size == sizeof blob);
    free(out);
    out = NULL;

    /* An empty blob, no candidate. */
    memset(&b, 0, sizeof b);
    b.build_key = "bk-empty";
    CHECK(ardb_binary_put(db, &b) == ARDB_DONE);
    CHECK(ardb_binary_get(db, "bk-empty", &out, &size) == ARDB_DONE);
    CHECK(size == 0 && out != NULL);
    free(out);
    out = (void *)1;

    CHECK(ardb_binary_get(db, "nope", &out, &size) == ARDB_ENOTFOUND);
    CHECK(out == NULL && size == 0);
    CHECK(strstr(ardb_errmsg(db), "nope") != NULL);
    b.build_key = NULL;
    CHECK(ardb_binary_put(db, &b) == ARDB_EINVAL);
    /* An unknown candidate id is a foreign key violation. */
    b.build_key = "bk-bad";
    b.candidate_id = 999;
    CHECK(ardb_binary_put(db, &b) == ARDB_EINVAL);
    ardb_close(db);
}

static void test_measurements(void)
{
    char path[600];
    ardb *db = create_db("meas.db", path, sizeof path), *ro = NULL;
    ardb_device d = dev_make("cuda", "H200", "sm_90", "fp");
    ardb_problem p = prob_make(4096);
    ardb_candidate c = cand_make("v", "h");
    ardb_measurement m, got;
    int64_t dev = 0, prob = 0, cand = 0, r1, r2, m1 = 0, m2 = 0, m3 = 0,
            found = 0;
    REQUIRE(db != NULL);
    CHECK(strcmp(ardb_status_name(ARDB_STATUS_OK), "ok") == 0);
    CHECK(strcmp(ardb_status_name(ARDB_STATUS_COMPILE_FAILED),
                 "compile_failed") == 0);
    CHECK(strcmp(ardb_status_name(ARDB_STATUS_LAUNCH_FAILED),
                 "launch_failed") == 0);
    CHECK(strcmp(ardb_status_name(ARDB_STATUS_WRONG_RESULT), "wrong_result") ==
          0);
    CHECK(strcmp(ardb_status_name(ARDB_STATUS_SKIPPED), "skipped") == 0);
    CHECK(strcmp(ardb_status_name(ARDB_STATUS_TIMEOUT), "timeout") == 0);
    CHECK(strcmp(ardb_status_name(ARDB_STATUS_NONDETERMINISTIC),
                 "nondeterministic") == 0);
    CHECK(strcmp(ardb_status_name((ardb_status)99), "unknown") == 0);

    REQUIRE(ardb_device_upsert(db, &d, &dev) == ARDB_DONE);
    REQUIRE(ardb_problem_upsert(db, &p, &prob) == ARDB_DONE);
    REQUIRE(ardb_candidate_upsert(db, &c, &cand) == ARDB_DONE);
    r1 = test_run_begin(db, dev);
    r2 = test_run_begin(db, dev);
    REQUIRE(r1 > 0 && r2 > r1);

    CHECK(ardb_measurement_find(db, cand, prob, dev, "bk", &got) ==
          ARDB_ENOTFOUND);
    m = meas_make(r1, cand, prob, dev, "bk", 10.0);
    CHECK(ardb_measurement_add(db, &m, &m1) == ARDB_DONE && m1 > 0);
    m = meas_make(r2, cand, prob, dev, "bk", 12.5);
    m.rel_err = NAN;
    CHECK(ardb_measurement_add(db, &m, &m2) == ARDB_DONE && m2 > m1);
    /* A failed compile: no build key, a message. */
    m = meas_make(r2, cand, prob, dev, NULL, 0.0);
    m.status = ARDB_STATUS_COMPILE_FAILED;
    m.message = "error: too many registers";
    CHECK(ardb_measurement_add(db, &m, &m3) == ARDB_DONE && m3 > m2);

    /* Newest wins. */
    CHECK(ardb_measurement_find_ex(db, cand, prob, dev, "bk", &got, &found) ==
          ARDB_DONE);
    CHECK(found == m2);
    CHECK(got.run_id == r2 && got.status == ARDB_STATUS_OK);
    CHECK(got.median_us == 12.5 && got.reps == 50);
    CHECK(fabs(got.min_us - 11.25) < 1e-12 && fabs(got.gbps - 80.0) < 1e-12);
    CHECK(isnan(got.rel_err));
    CHECK(got.build_key && strcmp(got.build_key, "bk") == 0);
    CHECK(got.message == NULL);
    CHECK(got.candidate_id == cand && got.problem_id == prob &&
          got.device_id == dev);
    ardb_measurement_clear(&got);
    CHECK(got.build_key == NULL);

    CHECK(ardb_measurement_find(db, cand, prob, dev, NULL, &got) == ARDB_DONE);
    CHECK(got.status == ARDB_STATUS_COMPILE_FAILED && got.build_key == NULL);
    CHECK(got.message && strcmp(got.message, "error: too many registers") == 0);
    ardb_measurement_clear(&got);
    /* Two runs that differed (schema v10): stored and read back under
     * its own status, never as a winner. */
    m = meas_make(r2, cand, prob, dev, "bk-nd", 9.0);
    m.status = ARDB_STATUS_NONDETERMINISTIC;
    m.message = "two runs on the same inputs differ in dquery";
    CHECK(ardb_measurement_add(db, &m, &found) == ARDB_DONE);
    CHECK(ardb_winner_set(db, r2, prob, dev, cand, found) == ARDB_EINVAL);
    CHECK(ardb_measurement_find(db, cand, prob, dev, "bk-nd", &got) ==
          ARDB_DONE);
    CHECK(got.status == ARDB_STATUS_NONDETERMINISTIC);
    CHECK(got.message && strstr(got.message, "dquery") != NULL);
    ardb_measurement_clear(&got);
    CHECK(raw_int(path, "SELECT count(*) FROM measurements WHERE status = "
                        "'nondeterministic'") == 1);
    CHECK(ardb_measurement_find(db, cand, prob, dev, "other", &got) ==
          ARDB_ENOTFOUND);
    CHECK(ardb_measurement_find(db, cand, prob, dev + 1, "bk", &got) ==
          ARDB_ENOTFOUND);

    /* Bad ids and status. */
    m = meas_make(r2, cand, prob, dev, "bk", 1.0);
    m.run_id = 12345;
    CHECK(ardb_measurement_add(db, &m, NULL) == ARDB_EINVAL);
    m.run_id = 0;
    CHECK(ardb_measurement_add(db, &m, NULL) == ARDB_EINVAL);
    m.run_id = r2;
    m.status = (ardb_status)42;
    CHECK(ardb_measurement_add(db, &m, NULL) == ARDB_EINVAL);

    /* Read-only handles can find but not add. */
    CHECK(ardb_open(path, ARDB_READONLY, &ro, NULL, 0) == ARDB_DONE);
    if (ro) {
        CHECK(ardb_measurement_find(ro, cand, prob, dev, "bk", &got) ==
              ARDB_DONE);
        CHECK(got.median_us == 12.5);
        ardb_measurement_clear(&got);
        m = meas_make(r2, cand, prob, dev, "bk", 1.0);
        CHECK(ardb_measurement_add(ro, &m, NULL) == ARDB_EREADONLY);
        CHECK(ardb_run_finish(ro, r1, "complete") == ARDB_EREADONLY);
        CHECK(ardb_winner_set(ro, r1, prob, dev, cand, m1) == ARDB_EREADONLY);
    }
    ardb_close(ro);

    /* Runs finish. */
    CHECK(ardb_run_finish(db, r1, "complete") == ARDB_DONE);
    CHECK(ardb_run_finish(db, r2, "bogus") == ARDB_EINVAL);
    CHECK(ardb_run_finish(db, 9999, "failed") == ARDB_ENOTFOUND);
    ardb_close(db);
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE status = 'complete' "
                        "AND finished_at IS NOT NULL") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE status = 'running' "
                        "AND finished_at IS NULL") == 1);
    /* History is append-only. */
    CHECK(raw_exec(path, "UPDATE measurements SET median_us = 1") ==
          SQLITE_CONSTRAINT);
}

static void test_transactions(void)
{
    char path[600];
    ardb *db = create_db("tx.db", path, sizeof path);
    ardb_device d = dev_make("cpu", "cpu", "x86_64-avx512", "fp-a");
    int64_t id = 0;
    REQUIRE(db != NULL);
    CHECK(ardb_rollback(db) == ARDB_DONE); /* nothing open: no-op */
    CHECK(ardb_begin(db) == ARDB_DONE);
    CHECK(ardb_device_upsert(db, &d, &id) == ARDB_DONE);
    CHECK(ardb_rollback(db) == ARDB_DONE);
    CHECK(raw_int(path, "SELECT count(*) FROM devices") == 0);
    CHECK(ardb_begin(db) == ARDB_DONE);
    CHECK(ardb_begin(db) == ARDB_ESQL); /* no nesting */
    CHECK(ardb_device_upsert(db, &d, &id) == ARDB_DONE);
    CHECK(ardb_commit(db) == ARDB_DONE);
    CHECK(raw_int(path, "SELECT count(*) FROM devices") == 1);
    CHECK(ardb_commit(db) == ARDB_ESQL);
    /* An open transaction is rolled back by close. */
    d.fingerprint = "fp-b";
    CHECK(ardb_begin(db) == ARDB_DONE);
    CHECK(ardb_device_upsert(db, &d, &id) == ARDB_DONE);
    ardb_close(db);
    CHECK(raw_int(path, "SELECT count(*) FROM devices") == 1);
}

/* Winners: four devices, three T buckets, three runs. */
typedef struct wfix {
    int64_t dA, dB, dC, dCpu;        /* A,B: cuda sm_90; C: cuda sm_80 */
    int64_t p1, p4k, p16k, pOther;   /* t = 1, 4096, 16384; heads 8 */
    int64_t c1, c2, c3;
    int64_t r1, r2, r3;
} wfix;

static int set_winner(ardb *db, int64_t run, int64_t prob, int64_t dev,
                      int64_t cand, double med)
{
    ardb_measurement m = meas_make(run, cand, prob, dev, "bk", med);
    int64_t mid = 0;
    if (ardb_measurement_add(db, &m, &mid) != ARDB_DONE)
        return -1;
    return ardb_winner_set(db, run, prob, dev, cand, mid);
}

static int wfix_make(ardb *db, wfix *f)
{
    ardb_device a = dev_make("cuda", "NVIDIA H200", "sm_90", "fpA");
    ardb_device b = dev_make("cuda", "NVIDIA H100", "sm_90", "fpB");
    ardb_device c = dev_make("cuda", "NVIDIA A100", "sm_80", "fpC");
    ardb_device cpu = dev_make("cpu", "EPYC", "x86_64-avx512", "fpCPU");
    ardb_problem p = prob_make(1);
    ardb_candidate c1 = cand_make("mix_v1", "h1"), c2 = cand_make("mix_v2", "h2"),
                   c3 = cand_make("mix_v3", "h3");
    int rc = 0;
    c2.source = "src2";
    c2.kernel_name = "k2";
    rc |= ardb_device_upsert(db, &a, &f->dA);
    rc |= ardb_device_upsert(db, &b, &f->dB);
    rc |= ardb_device_upsert(db, &c, &f->dC);
    rc |= ardb_device_upsert(db, &cpu, &f->dCpu);
    rc |= ardb_problem_upsert(db, &p, &f->p1);
    p.t_bucket = 4096;
    rc |= ardb_problem_upsert(db, &p, &f->p4k);
    p.t_bucket = 16384;
    rc |= ardb_problem_upsert(db, &p, &f->p16k);
    p.heads = 8;
    p.t_bucket = 4096;
    rc |= ardb_problem_upsert(db, &p, &f->pOther);
    rc |= ardb_candidate_upsert(db, &c1, &f->c1);
    rc |= ardb_candidate_upsert(db, &c2, &f->c2);
    rc |= ardb_candidate_upsert(db, &c3, &f->c3);
    if (rc)
        return -1;
    f->r1 = test_run_begin(db, f->dA);
    f->r2 = test_run_begin(db, f->dB);
    f->r3 = test_run_begin(db, f->dC);
    if (!f->r1 || !f->r2 || !f->r3)
        return -1;
    /* run 1 on A: t1 -> c1, t4096 -> c1 (later replaced by c3 in run 1) */
    rc |= set_winner(db, f->r1, f->p1, f->dA, f->c1, 5.0);
    rc |= set_winner(db, f->r1, f->p4k, f->dA, f->c1, 50.0);
    rc |= set_winner(db, f->r1, f->p4k, f->dA, f->c3, 40.0);
    rc |= set_winner(db, f->r1, f->pOther, f->dA, f->c1, 7.0);
    /* run 2 on B: t4096 -> c2 */
    rc |= set_winner(db, f->r2, f->p4k, f->dB, f->c2, 45.0);
    /* run 3 on C: t16384 -> c3 */
    rc |= set_winner(db, f->r3, f->p16k, f->dC, f->c3, 900.0);
    return rc ? -1 : 0;
}

/* How many winners a lookup at `level` returns, freed again; -1 when the
 * lookup fails. */
static long lookup_count(ardb *db, const ardb_problem *p, const ardb_device *q, ardb_level level)
{
    ardb_winner *w = NULL;
    size_t n = 0;
    if (ardb_winners_lookup(db, p, q, level, &w, &n) != ARDB_DONE)
        return -1;
    ardb_winners_free(w, n);
    return (long)n;
}

static void test_winners(void)
{
    char path[600];
    ardb *db = create_db("win.db", path, sizeof path), *ro = NULL;
    wfix f;
    ardb_winner *w = NULL;
    size_t n = 99;
    ardb_problem p = prob_make(777); /* t_bucket is ignored */
    ardb_device q;
    REQUIRE(db != NULL);
    memset(&f, 0, sizeof f);
    REQUIRE(wfix_make(db, &f) == 0);

    /* winner_set refuses a measurement of something else, or not ok. */
    {
        ardb_measurement m = meas_make(f.r1, f.c1, f.p1, f.dA, "bk", 1.0);
        int64_t mid = 0;
        CHECK(ardb_measurement_add(db, &m, &mid) == ARDB_DONE);
        CHECK(ardb_winner_set(db, f.r1, f.p1, f.dA, f.c2, mid) == ARDB_EINVAL);
        CHECK(ardb_winner_set(db, f.r1, f.p4k, f.dA, f.c1, mid) == ARDB_EINVAL);
        m.status = ARDB_STATUS_WRONG_RESULT;
        CHECK(ardb_measurement_add(db, &m, &mid) == ARDB_DONE);
        CHECK(ardb_winner_set(db, f.r1, f.p1, f.dA, f.c1, mid) == ARDB_EINVAL);
        CHECK(ardb_winner_set(db, 9999, f.p1, f.dA, f.c1, mid - 1) ==
              ARDB_EINVAL); /* unknown run: foreign key */
    }

    /* EXACT on A: run 1's winners for t1 and t4096 (the replacement). */
    q = dev_make("cuda", "NVIDIA H200", "sm_90", "fpA");
    CHECK(ardb_winners_lookup(db, &p, &q, ARDB_LEVEL_EXACT, &w, &n) ==
          ARDB_DONE);
    CHECK(n == 2);
    if (n == 2) {
        CHECK(w[0].t_bucket == 1 && strcmp(w[0].variant, "mix_v1") == 0);
        CHECK(w[0].run_id == f.r1 && w[0].median_us == 5.0);
        CHECK(strcmp(w[0].device_fingerprint, "fpA") == 0);
        CHECK(strcmp(w[0].device_arch, "sm_90") == 0);
        CHECK(strcmp(w[0].kernel_name, "k") == 0);
        CHECK(strcmp(w[0].source_hash, "h1") == 0);
        CHECK(strcmp(w[0].params_json, "{\"vec\":8}") == 0);
        CHECK(strcmp(w[0].source, "__global__ void k(){}") == 0);
        CHECK(fabs(w[0].gbps - 200.0) < 1e-9 && w[0].ceiling_fraction == 0.5);
        CHECK(w[1].t_bucket == 4096 && strcmp(w[1].variant, "mix_v3") == 0);
        CHECK(w[1].median_us == 40.0);
    }
    ardb_winners_free(w, n);

    /* ARCHITECTURE sm_90 from an unknown device: t4096 from run 2 (B). */
    q = dev_make("cuda", "NVIDIA H20", "sm_90", "fpUnknown");
    CHECK(ardb_winners_lookup(db, &p, &q, ARDB_LEVEL_EXACT, &w, &n) ==
          ARDB_DONE);
    CHECK(n == 0 && w == NULL);
    ardb_winners_free(w, n);
    CHECK(ardb_winners_lookup(db, &p, &q, ARDB_LEVEL_ARCHITECTURE, &w, &n) ==
          ARDB_DONE);
    CHECK(n == 2);
    if (n == 2) {
        CHECK(w[0].t_bucket == 1 && w[0].run_id == f.r1);
        CHECK(w[1].t_bucket == 4096 && w[1].run_id == f.r2);
        CHECK(strcmp(w[1].variant, "mix_v2") == 0);
        CHECK(strcmp(w[1].kernel_name, "k2") == 0);
        CHECK(strcmp(w[1].source, "src2") == 0);
        CHECK(strcmp(w[1].device_fingerprint, "fpB") == 0);
    }
    ardb_winners_free(w, n);

    /* BACKEND cuda: all three buckets, newest run each. */
    q = dev_make("cuda", "whatever", "sm_100", "fpX");
    CHECK(lookup_count(db, &p, &q, ARDB_LEVEL_ARCHITECTURE) == 0);
    CHECK(ardb_winners_lookup(db, &p, &q, ARDB_LEVEL_BACKEND, &w, &n) ==
          ARDB_DONE);
    CHECK(n == 3);
    if (n == 3) {
        CHECK(w[0].t_bucket == 1 && w[0].run_id == f.r1);
        CHECK(w[1].t_bucket == 4096 && w[1].run_id == f.r2);
        CHECK(w[2].t_bucket == 16384 && w[2].run_id == f.r3);
        CHECK(strcmp(w[2].device_arch, "sm_80") == 0);
    }
    ardb_winners_free(w, n);

    /* Other backend, other problem fields. */
    q = dev_make("cpu", "EPYC", "x86_64-avx512", "fpCPU");
    CHECK(lookup_count(db, &p, &q, ARDB_LEVEL_BACKEND) == 0);
    q = dev_make("cuda", "NVIDIA H200", "sm_90", "fpA");
    p.heads = 8;
    CHECK(lookup_count(db, &p, &q, ARDB_LEVEL_EXACT) == 1);
    p.heads = 1;
    p.dtype = "f16";
    CHECK(lookup_count(db, &p, &q, ARDB_LEVEL_BACKEND) == 0);
    p.dtype = "bf16";

    /* A newer run on A wins over the older one at every level. */
    {
        int64_t r4 = test_run_begin(db, f.dA);
        CHECK(set_winner(db, r4, f.p1, f.dA, f.c2, 6.0) == ARDB_DONE);
        CHECK(ardb_winners_lookup(db, &p, &q, ARDB_LEVEL_EXACT, &w, &n) ==
              ARDB_DONE);
        CHECK(n == 2 && w[0].run_id == r4 &&
              strcmp(w[0].variant, "mix_v2") == 0);
        CHECK(n == 2 && w[1].run_id == f.r1);
        ardb_winners_free(w, n);
    }

    /* Bad arguments. */
    q.fingerprint = NULL;
    CHECK(ardb_winners_lookup(db, &p, &q, ARDB_LEVEL_EXACT, &w, &n) ==
          ARDB_EINVAL);
    CHECK(ardb_winners_lookup(db, &p, &q, (ardb_level)7, &w, &n) ==
          ARDB_EINVAL);

    /* The same through a read-only handle. */
    CHECK(ardb_open(path, ARDB_READONLY, &ro, NULL, 0) == ARDB_DONE);
    if (ro) {
        q = dev_make("cuda", "x", "sm_90", "zzz");
        CHECK(lookup_count(ro, &p, &q, ARDB_LEVEL_ARCHITECTURE) == 2);
    }
    ardb_close(ro);
    ardb_winners_free(NULL, 0);
    ardb_close(db);
}

/* Collects listing rows as "a|b|c" lines. */
typedef struct rows {
    char text[8192];
    int count, stop_after;
    char header[256];
} rows;

static int collect(void *ctx, int ncol, const char *const *names,
                   const char *const *values)
{
    rows *r = ctx;
    size_t len = strlen(r->text);
    int i;
    if (!r->header[0])
        for (i = 0; i < ncol; i++) {
            size_t hl = strlen(r->header);
            snprintf(r->header + hl, sizeof r->header - hl, "%s%s",
                     i ? "," : "", names[i]);
        }
    for (i = 0; i < ncol; i++) {
        snprintf(r->text + len, sizeof r->text - len, "%s%s", i ? "|" : "",
                 values[i]);
        len = strlen(r->text);
    }
    snprintf(r->text + len, sizeof r->text - len, "\n");
    r->count++;
    return r->stop_after && r->count >= r->stop_after;
}

static void test_lists(void)
{
    char path[600];
    ardb *db = create_db("list.db", path, sizeof path);
    wfix f;
    rows r;
    int before = check_failures;
    REQUIRE(db != NULL);

    memset(&r, 0, sizeof r);
    CHECK(ardb_list_winners(db, 0, collect, &r) == ARDB_DONE && r.count == 0);
    CHECK(ardb_list_runs(db, collect, &r) == ARDB_DONE && r.count == 0);

    memset(&f, 0, sizeof f);
    REQUIRE(wfix_make(db, &f) == 0);
    CHECK(ardb_run_finish(db, f.r1, "complete") == ARDB_DONE);

    memset(&r, 0, sizeof r);
    CHECK(ardb_list_winners(db, 0, collect, &r) == ARDB_DONE);
    CHECK(strcmp(r.header,
                 "problem,device,variant,median_us,gbps,ceiling_fraction,provisional") ==
          0);
    CHECK(r.count == 5);
    /* No winner is provisional: the last column is empty. */
    CHECK(strcmp(r.text,
                 "mix:bf16:d7168:n9:h1:replace:epi0:s0:t1|NVIDIA H200|mix_v1|"
                 "5.000|200.0|0.500|\n"
                 "mix:bf16:d7168:n9:h1:replace:epi0:s0:t4096|NVIDIA H200|"
                 "mix_v3|40.000|25.0|0.500|\n"
                 "mix:bf16:d7168:n9:h1:replace:epi0:s0:t4096|NVIDIA H100|"
                 "mix_v2|45.000|22.2|0.500|\n"
                 "mix:bf16:d7168:n9:h1:replace:epi0:s0:t16384|NVIDIA A100|"
                 "mix_v3|900.000|1.1|0.500|\n"
                 "mix:bf16:d7168:n9:h8:replace:epi0:s0:t4096|NVIDIA H200|"
                 "mix_v1|7.000|142.9|0.500|\n") == 0);
    if (check_failures != before)
        fprintf(stderr, "%s", r.text);

    /* A newer run for (t1, A) replaces the row; one run only. */
    {
        int64_t r4 = test_run_begin(db, f.dA);
        CHECK(set_winner(db, r4, f.p1, f.dA, f.c2, 6.0) == ARDB_DONE);
        memset(&r, 0, sizeof r);
        CHECK(ardb_list_winners(db, 0, collect, &r) == ARDB_DONE);
        CHECK(r.count == 5 && strstr(r.text, "t1|NVIDIA H200|mix_v2|6.000|"));
        memset(&r, 0, sizeof r);
        CHECK(ardb_list_winners(db, f.r1, collect, &r) == ARDB_DONE);
        CHECK(r.count == 3 && strstr(r.text, "t1|NVIDIA H200|mix_v1|5.000|"));
        memset(&r, 0, sizeof r);
        CHECK(ardb_list_winners(db, r4, collect, &r) == ARDB_DONE);
        CHECK(r.count == 1);
        memset(&r, 0, sizeof r);
        CHECK(ardb_list_winners(db, 999, collect, &r) == ARDB_DONE);
        CHECK(r.count == 0);
    }

    /* Runs. */
    memset(&r, 0, sizeof r);
    CHECK(ardb_list_runs(db, collect, &r) == ARDB_DONE);
    CHECK(r.count == 4);
    CHECK(strcmp(r.header, "id,started_at,finished_at,status,device,strategy,"
                           "project_version,compiler,copy_gbps,read_gbps") ==
          0);
    {
        /* first line: id 1, a time, a time, complete, H200, ... */
        char line[512];
        const char *nl = strchr(r.text, '\n');
        size_t l = nl ? (size_t)(nl - r.text) : 0;
        char *tok, *save = NULL;
        int col = 0;
        memcpy(line, r.text, l < sizeof line ? l : sizeof line - 1);
        line[l < sizeof line ? l : sizeof line - 1] = '\0';
        for (tok = strtok_r(line, "|", &save); tok;
             tok = strtok_r(NULL, "|", &save), col++) {
            if (col == 0)
                CHECK(strcmp(tok, "1") == 0);
            if (col == 1 || col == 2)
                CHECK(strlen(tok) == 24 && tok[10] == 'T' && tok[23] == 'Z');
            if (col == 3)
                CHECK(strcmp(tok, "complete") == 0);
            if (col == 4)
                CHECK(strcmp(tok, "NVIDIA H200") == 0);
            if (col == 5)
                CHECK(strcmp(tok, "exhaustive") == 0);
            if (col == 8)
                CHECK(strcmp(tok, "4300.0") == 0);
            if (col == 9)
                CHECK(strcmp(tok, "4100.0") == 0);
        }
        CHECK(col == 10);
        /* second run: not finished, finished_at empty */
        CHECK(strstr(r.text, "||running|NVIDIA H100|exhaustive|0.1.0|") != NULL);
    }
    /* Stop early. */
    memset(&r, 0, sizeof r);
    r.stop_after = 2;
    CHECK(ardb_list_runs(db, collect, &r) == ARDB_DONE && r.count == 2);
    CHECK(ardb_list_runs(db, NULL, NULL) == ARDB_EINVAL);
    ardb_close(db);
}

/* The read-only bandwidth of a run (schema v3): a measured value reads
 * back as it was; NaN, 0 and negative values mean "not measured" and are
 * stored as NULL, read back as NaN and listed as "". */
/* ---- simulated devices (schema v4) --------------------------------------- */

/* Counts the winners a lookup returns at one level; -1 when it fails. With
 * fp non-NULL, also counts how many of them were measured on that
 * fingerprint into *from_fp. */
static long count_level(ardb *db, const ardb_device *q, ardb_level level,
                        const char *fp, long *from_fp)
{
    ardb_problem p = prob_make(0);
    ardb_winner *w = NULL;
    size_t n = 0, i;
    if (ardb_winners_lookup(db, &p, q, level, &w, &n) != ARDB_DONE)
        return -1;
    if (from_fp) {
        *from_fp = 0;
        for (i = 0; i < n; i++)
            if (fp && w[i].device_fingerprint &&
                strcmp(w[i].device_fingerprint, fp) == 0)
                (*from_fp)++;
    }
    ardb_winners_free(w, n);
    return (long)n;
}

/* A growable text sink for exports. */
typedef struct sink {
    char *data;
    size_t len;
} sink;

static int sink_write(void *ctx, const void *data, size_t len)
{
    sink *s = ctx;
    char *p = realloc(s->data, s->len + len + 1);
    if (!p)
        return -1;
    memcpy(p + s->len, data, len);
    s->len += len;
    p[s->len] = '\0';
    s->data = p;
    return 0;
}

/* Checks that, in db, winners never cross between the simulated sm_90
 * device (fingerprint "fp-sim") and real devices, and that real sm_90
 * devices still share theirs: the fixture of test_simulated_devices. */
static void check_simulated_apart(ardb *db)
{
    static const ardb_level levels[] = {ARDB_LEVEL_EXACT,
                                        ARDB_LEVEL_ARCHITECTURE,
                                        ARDB_LEVEL_BACKEND};
    ardb_device real_twin = dev_make("cuda", "cudasim sm_90", "sm_90", "fp-sim");
    ardb_device real_new = dev_make("cuda", "NVIDIA H200", "sm_90", "fp-new");
    ardb_device sim = real_twin, sim_new = real_new, sim_twin_of_real;
    long from = 0;
    size_t i;
    sim.simulated = 1;
    sim_new.simulated = 1;
    sim_twin_of_real = dev_make("cuda", "NVIDIA H200", "sm_90", "fp-real");
    sim_twin_of_real.simulated = 1;

    /* A real device, even one equal to the simulated one in every other
     * field, gets nothing measured on it at any level. The only real
     * winner is for t4096 (fp-real), so at the architecture and backend
     * levels it gets exactly that one. */
    for (i = 0; i < 3; i++) {
        long n = count_level(db, &real_twin, levels[i], "fp-sim", &from);
        CHECK(n == (levels[i] == ARDB_LEVEL_EXACT ? 0 : 1) && from == 0);
        n = count_level(db, &real_new, levels[i], "fp-sim", &from);
        CHECK(n == (levels[i] == ARDB_LEVEL_EXACT ? 0 : 1) && from == 0);
    }
    /* The simulated device gets its own two buckets at every level and
     * never the real t4096 winner, although that run is newer. */
    for (i = 0; i < 3; i++) {
        CHECK(count_level(db, &sim, levels[i], "fp-sim", &from) == 2 &&
              from == 2);
        CHECK(count_level(db, &sim_new, levels[i], "fp-sim", &from) ==
                  (levels[i] == ARDB_LEVEL_EXACT ? 0 : 2) &&
              from == (levels[i] == ARDB_LEVEL_EXACT ? 0 : 2));
        /* A simulated device with a real one's fingerprint is not it. */
        CHECK(count_level(db, &sim_twin_of_real, levels[i], "fp-real",
                          &from) == (levels[i] == ARDB_LEVEL_EXACT ? 0 : 2) &&
              from == 0);
    }
    /* Two real devices still share: exact for fp-real, and the
     * architecture and backend levels for a new real sm_90 device. */
    {
        ardb_device real = dev_make("cuda", "NVIDIA H200", "sm_90", "fp-real");
        CHECK(count_level(db, &real, ARDB_LEVEL_EXACT, "fp-real", &from) == 1 &&
              from == 1);
        CHECK(count_level(db, &real_new, ARDB_LEVEL_ARCHITECTURE, "fp-real",
                          &from) == 1 && from == 1);
        CHECK(count_level(db, &real_new, ARDB_LEVEL_BACKEND, "fp-real",
                          &from) == 1 && from == 1);
    }
}

static void test_simulated_devices(void)
{
    char path[600], path2[600];
    ardb *db = create_db("sim.db", path, sizeof path), *ro = NULL, *db2;
    ardb_device real = dev_make("cuda", "NVIDIA H200", "sm_90", "fp-real");
    ardb_device sim = dev_make("cuda", "cudasim sm_90", "sm_90", "fp-sim");
    ardb_device twin = sim;
    ardb_problem p = prob_make(1);
    ardb_candidate c1 = cand_make("mix_sim", "hs"), c2 = cand_make("mix_real", "hr");
    int64_t d_real = 0, d_sim = 0, d_twin = 0, id = 0, p1 = 0, p4k = 0;
    int64_t k1 = 0, k2 = 0, r_sim, r_real;
    REQUIRE(db != NULL);
    sim.simulated = 1;

    /* A simulated and a real device with otherwise equal fields are two
     * devices; any non-zero mark is recorded as 1. */
    REQUIRE(ardb_device_upsert(db, &real, &d_real) == ARDB_DONE);
    REQUIRE(ardb_device_upsert(db, &sim, &d_sim) == ARDB_DONE);
    REQUIRE(ardb_device_upsert(db, &twin, &d_twin) == ARDB_DONE);
    CHECK(d_real != d_sim && d_twin != d_sim && d_twin != d_real);
    CHECK(ardb_device_upsert(db, &sim, &id) == ARDB_DONE && id == d_sim);
    twin.simulated = 7;
    CHECK(ardb_device_upsert(db, &twin, &id) == ARDB_DONE && id == d_sim);
    twin.simulated = 0;
    CHECK(ardb_device_upsert(db, &twin, &id) == ARDB_DONE && id == d_twin);
    CHECK(raw_int(path, "SELECT count(*) FROM devices WHERE simulated = 1") == 1);
    CHECK(raw_int(path, "SELECT count(*) FROM devices WHERE fingerprint = 'fp-sim'") == 2);

    /* The simulated device wins t1 and t4096; later a real device wins
     * t4096. */
    REQUIRE(ardb_problem_upsert(db, &p, &p1) == ARDB_DONE);
    p.t_bucket = 4096;
    REQUIRE(ardb_problem_upsert(db, &p, &p4k) == ARDB_DONE);
    REQUIRE(ardb_candidate_upsert(db, &c1, &k1) == ARDB_DONE);
    REQUIRE(ardb_candidate_upsert(db, &c2, &k2) == ARDB_DONE);
    r_sim = test_run_begin(db, d_sim);
    REQUIRE(r_sim != 0);
    CHECK(set_winner(db, r_sim, p1, d_sim, k1, 3.0) == ARDB_DONE);
    CHECK(set_winner(db, r_sim, p4k, d_sim, k1, 30.0) == ARDB_DONE);
    CHECK(ardb_run_finish(db, r_sim, "complete") == ARDB_DONE);
    r_real = test_run_begin(db, d_real);
    REQUIRE(r_real != 0);
    CHECK(set_winner(db, r_real, p4k, d_real, k2, 40.0) == ARDB_DONE);
    CHECK(ardb_run_finish(db, r_real, "complete") == ARDB_DONE);
    check_simulated_apart(db);

    /* Re-validation takes its winners from the same side only. */
    {
        ardb_stored_winner *w = NULL;
        size_t n = 0, i, sim_rows = 0;
        ardb_device q = dev_make("cuda", "NVIDIA H200", "sm_90", "fp-sim");
        CHECK(ardb_stored_winners(db, &q, &w, &n) == ARDB_DONE && n == 1);
        for (i = 0; i < n; i++)
            sim_rows += w[i].device_id == d_sim;
        CHECK(sim_rows == 0);
        ardb_stored_winners_free(w, n);
        q.simulated = 1;
        q.fingerprint = "fp-other";
        CHECK(ardb_stored_winners(db, &q, &w, &n) == ARDB_DONE && n == 2);
        for (i = 0; i < n; i++)
            CHECK(w[i].device_id == d_sim && w[i].level == ARDB_LEVEL_ARCHITECTURE);
        ardb_stored_winners_free(w, n);
    }

    /* Listings and run records say which device is simulated. */
    {
        rows r;
        ardb_run_info info;
        memset(&r, 0, sizeof r);
        CHECK(ardb_list_winners(db, 0, collect, &r) == ARDB_DONE && r.count == 3);
        CHECK(strstr(r.text, "|cudasim sm_90 (simulated)|mix_sim|") != NULL);
        CHECK(strstr(r.text, "|NVIDIA H200|mix_real|") != NULL);
        memset(&r, 0, sizeof r);
        CHECK(ardb_list_runs(db, collect, &r) == ARDB_DONE && r.count == 2);
        CHECK(strstr(r.text, "|cudasim sm_90 (simulated)|") != NULL);
        CHECK(ardb_run_get(db, r_sim, &info) == ARDB_DONE && info.device_simulated == 1);
        ardb_run_info_clear(&info);
        CHECK(ardb_run_get(db, r_real, &info) == ARDB_DONE && info.device_simulated == 0);
        ardb_run_info_clear(&info);
    }

    /* The same through a read-only handle (the runtime's). */
    CHECK(ardb_open(path, ARDB_READONLY, &ro, NULL, 0) == ARDB_DONE);
    if (ro)
        check_simulated_apart(ro);
    ardb_close(ro);

    /* Export and import keep the mark on the devices and on every
     * reference to one; a second import adds nothing. */
    {
        sink a = {0}, b = {0};
        ardb_merge_stats s;
        CHECK(ardb_export_json(db, 0, sink_write, &a) == ARDB_DONE && a.data);
        CHECK(a.data && strstr(a.data, "\"fingerprint\": \"fp-sim\"") &&
              strstr(a.data, "\"simulated\": 1") &&
              strstr(a.data, "\"device_simulated\": 1"));
        db2 = create_db("sim-imported.db", path2, sizeof path2);
        REQUIRE(db2 != NULL);
        CHECK(ardb_import_json(db2, a.data, a.len, &s) == ARDB_DONE);
        CHECK(s.devices == 3 && s.runs == 2 && s.winners == 3);
        CHECK(ardb_import_json(db2, a.data, a.len, &s) == ARDB_DONE && s.devices == 0 &&
              s.runs == 0 && s.measurements == 0 && s.winners == 0);
        check_simulated_apart(db2);
        CHECK(ardb_export_json(db2, 0, sink_write, &b) == ARDB_DONE);
        CHECK(b.data && strcmp(a.data, b.data) == 0);
        ardb_close(db2);
        free(a.data);
        free(b.data);
    }

    /* An export without the mark (a build before v4) imports as real
     * devices, and beside a simulated one of the same fingerprint. */
    {
        static const char older[] =
            "{\"format\": \"attnres-export\", \"version\": 1, \"schema_version\": 3,\n"
            "\"devices\": [{\"fingerprint\": \"fp-sim\", \"backend\": \"cuda\", \"arch\": \"sm_90\"},"
            " {\"fingerprint\": \"fp-old\", \"backend\": \"cuda\", \"arch\": \"sm_90\"}],\n"
            "\"runs\": [{\"uid\": \"old-run\", \"started_at\": \"2025-03-01T00:00:00.000Z\","
            " \"status\": \"complete\", \"device\": \"fp-sim\"}]}\n";
        ardb_merge_stats s;
        CHECK(ardb_import_json(db, older, sizeof older - 1, &s) == ARDB_DONE);
        CHECK(s.devices == 1 && s.runs == 1); /* fp-sim real is known: d_twin */
        CHECK(raw_int(path, "SELECT count(*) FROM devices WHERE simulated = 0") == 3);
        CHECK(raw_int(path, "SELECT count(*) FROM runs r JOIN devices d ON d.id = r.device_id"
                            " WHERE r.uid = 'old-run' AND d.simulated = 0 AND d.fingerprint = 'fp-sim'") == 1);
        check_simulated_apart(db);
    }

    /* A merge keeps them apart too. */
    db2 = create_db("sim-merged.db", path2, sizeof path2);
    REQUIRE(db2 != NULL);
    {
        ardb_merge_stats s;
        CHECK(ardb_merge(db2, path, &s) == ARDB_DONE && s.devices == 4 && s.winners == 3);
        CHECK(ardb_merge(db2, path, &s) == ARDB_DONE && s.devices == 0 && s.winners == 0);
        CHECK(raw_int(path2, "SELECT count(*) FROM devices WHERE simulated = 1") == 1);
        check_simulated_apart(db2);
    }
    ardb_close(db2);
    ardb_close(db);
}

static void test_run_read_gbps(void)
{
    static const double given[] = {27.5, NAN, 0.0, -3.0};
    char path[600];
    ardb *db = create_db("read_gbps.db", path, sizeof path), *ro = NULL;
    ardb_device d = dev_make("cpu", "Some CPU", "x86_64", "cpu|rg");
    ardb_run_info info;
    int64_t dev = 0, ids[4] = {0};
    rows r;
    size_t i;
    REQUIRE(db != NULL);
    REQUIRE(ardb_device_upsert(db, &d, &dev) == ARDB_DONE);
    for (i = 0; i < 4; i++) {
        ardb_run run;
        memset(&run, 0, sizeof run);
        run.device_id = dev;
        run.strategy = "exhaustive";
        run.copy_gbps = 40.0;
        run.launch_us = NAN;
        run.read_gbps = given[i];
        CHECK(ardb_run_begin(db, &run, &ids[i]) == ARDB_DONE);
    }
    CHECK(ardb_run_get(db, ids[0], &info) == ARDB_DONE);
    CHECK(info.read_gbps == 27.5);
    CHECK(info.copy_gbps == 40.0 && isnan(info.launch_us));
    ardb_run_info_clear(&info);
    for (i = 1; i < 4; i++) {
        CHECK(ardb_run_get(db, ids[i], &info) == ARDB_DONE);
        CHECK(isnan(info.read_gbps));
        ardb_run_info_clear(&info);
    }
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE read_gbps IS NULL") ==
          3);
    CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE read_gbps = 27.5") ==
          1);
    /* The listing, through a read-only handle as the CLI reads it. */
    CHECK(ardb_open(path, ARDB_READONLY, &ro, NULL, 0) == ARDB_DONE);
    if (ro) {
        memset(&r, 0, sizeof r);
        CHECK(ardb_list_runs(ro, collect, &r) == ARDB_DONE && r.count == 4);
        CHECK(strstr(r.header, ",copy_gbps,read_gbps") != NULL);
        CHECK(strstr(r.text, "|40.0|27.5\n") != NULL);
        CHECK(strstr(r.text, "|40.0|\n") != NULL);
    }
    ardb_close(ro);
    ardb_close(db);
}

/* Runs every read and write call once on db; returns how many failed with
 * ESQL. Any other code than the expected ones is a check failure. */
static int exercise(ardb *db, int writable)
{
    ardb_device d = dev_make("cuda", "H200", "sm_90", "fp-199");
    ardb_problem p = prob_make(4096);
    ardb_candidate c = cand_make("mix_v1", "h1");
    ardb_winner *w = NULL;
    ardb_measurement m;
    void *blob = NULL;
    size_t n = 0, size = 0;
    int64_t id = 0;
    int rc, esql = 0, i;
    rows r;
#define ALLOW(expr, ok2)                                                     \
    do {                                                                     \
        rc = (expr);                                                         \
        CHECK(rc == ARDB_DONE || rc == (ok2) || rc == ARDB_ESQL);            \
        esql += rc == ARDB_ESQL;                                             \
        if (rc == ARDB_ESQL)                                                 \
            CHECK(strlen(ardb_errmsg(db)) > 0);                              \
    } while (0)
    for (i = 0; i < 3; i++) {
        ALLOW(ardb_winners_lookup(db, &p, &d, (ardb_level)i, &w, &n),
              ARDB_DONE);
        ardb_winners_free(w, n);
        w = NULL;
    }
    ALLOW(ardb_binary_get(db, "bk-7", &blob, &size), ARDB_ENOTFOUND);
    free(blob);
    ALLOW(ardb_measurement_find(db, 1, 1, 1, "bk", &m), ARDB_ENOTFOUND);
    ardb_measurement_clear(&m);
    memset(&r, 0, sizeof r);
    ALLOW(ardb_list_winners(db, 0, collect, &r), ARDB_DONE);
    memset(&r, 0, sizeof r);
    ALLOW(ardb_list_runs(db, collect, &r), ARDB_DONE);
    if (writable) {
        ALLOW(ardb_device_upsert(db, &d, &id), ARDB_DONE);
        d.fingerprint = "fp-new";
        ALLOW(ardb_device_upsert(db, &d, &id), ARDB_DONE);
        ALLOW(ardb_problem_upsert(db, &p, &id), ARDB_DONE);
        ALLOW(ardb_candidate_upsert(db, &c, &id), ARDB_DONE);
    }
#undef ALLOW
    return esql;
}

/* A database whose later pages are overwritten: calls fail with ESQL and a
 * message, never crash. */
static void test_corrupt_pages(void)
{
    char path[600], msg[256];
    ardb *db = create_db("corrupt.db", path, sizeof path);
    ardb_device d = dev_make("cuda", "H200", "sm_90", "fp-c");
    wfix f;
    int i, fd, rc, esql = 0;
    REQUIRE(db != NULL);
    memset(&f, 0, sizeof f);
    REQUIRE(wfix_make(db, &f) == 0);
    for (i = 0; i < 300; i++) {
        char fp[32];
        ardb_binary b;
        int64_t id = 0;
        snprintf(fp, sizeof fp, "fp-%d", i);
        d.fingerprint = fp;
        CHECK(ardb_device_upsert(db, &d, &id) == ARDB_DONE);
        memset(&b, 0, sizeof b);
        b.build_key = fp + 1; /* "p-N" */
        b.blob = path; /* any 100 bytes */
        b.size = 100;
        CHECK(ardb_binary_put(db, &b) == ARDB_DONE);
    }
    CHECK(exercise(db, 1) == 0);
    ardb_close(db); /* checkpoints the WAL into the main file */
    fd = open(path, O_WRONLY);
    REQUIRE(fd >= 0);
    {
        unsigned char junk[4096];
        struct stat sb;
        off_t off, pages;
        memset(junk, 0xA5, sizeof junk);
        CHECK(fstat(fd, &sb) == 0);
        pages = sb.st_size / 4096;
        /* Keep the schema (pages 1..23 in v1) and the table roots; spoil
         * the data pages written last. */
        CHECK(pages > 32);
        for (off = (pages - 8) * 4096; off < sb.st_size; off += 4096)
            CHECK(pwrite(fd, junk, sizeof junk, off) == (ssize_t)sizeof junk);
    }
    close(fd);
    for (i = 0; i < 2; i++) {
        unsigned flags = i ? 0 : ARDB_READONLY;
        db = NULL;
        rc = ardb_open(path, flags, &db, msg, sizeof msg);
        CHECK(rc == ARDB_DONE || rc == ARDB_ENOTDB);
        if (rc == ARDB_DONE) {
            esql += exercise(db, !i ? 0 : 1);
            ardb_close(db);
        }
    }
    CHECK(esql > 0); /* the spoiled pages were reached */
}

/* Two (or more) processes create the same file and write into it at once. */
#define WRITERS 2
#define PER_WRITER 200

static int writer_child(const char *path, int who)
{
    ardb *db = NULL;
    char msg[256], variant[32];
    ardb_device d = dev_make("cuda", "H200", "sm_90", "shared-fp");
    ardb_problem p = prob_make(4096);
    ardb_candidate c = cand_make("shared", "shared-hash");
    int64_t dev, prob, cand, mycand, run, mid;
    int i;
    if (ardb_open(path, ARDB_CREATE, &db, msg, sizeof msg) != ARDB_DONE) {
        fprintf(stderr, "writer %d: open: %s\n", who, msg);
        return 2;
    }
    if (ardb_device_upsert(db, &d, &dev) || ardb_problem_upsert(db, &p, &prob) ||
        ardb_candidate_upsert(db, &c, &cand))
        goto fail;
    if (!(run = test_run_begin(db, dev)))
        goto fail;
    for (i = 0; i < PER_WRITER; i++) {
        ardb_measurement m;
        int in_tx = (i % 4) == 0;
        snprintf(variant, sizeof variant, "w%d_%d", who, i % 10);
        c.variant = variant;
        c.source_hash = variant;
        if (in_tx && ardb_begin(db))
            goto fail;
        if (ardb_candidate_upsert(db, &c, &mycand))
            goto fail;
        /* A shared upsert raced by both writers. */
        p.t_bucket = 1 + i % 5;
        if (ardb_problem_upsert(db, &p, &prob))
            goto fail;
        m = meas_make(run, mycand, prob, dev, "bk", 1.0 + i);
        if (ardb_measurement_add(db, &m, &mid))
            goto fail;
        if (in_tx && ardb_commit(db))
            goto fail;
    }
    if (ardb_run_finish(db, run, "complete"))
        goto fail;
    ardb_close(db);
    return 0;
fail:
    fprintf(stderr, "writer %d: %s\n", who, ardb_errmsg(db));
    ardb_close(db);
    return 1;
}

static void test_concurrent_writers(void)
{
    int round;
    for (round = 0; round < 3; round++) {
        char path[600], name[32];
        pid_t pids[WRITERS];
        int i, ok = 1;
        snprintf(name, sizeof name, "conc%d.db", round);
        path_in_tmp(path, sizeof path, name);
        fflush(NULL);
        for (i = 0; i < WRITERS; i++) {
            pids[i] = fork();
            if (pids[i] == 0)
                _exit(writer_child(path, i));
            CHECK(pids[i] > 0);
        }
        for (i = 0; i < WRITERS; i++) {
            int status = 0;
            if (pids[i] <= 0 || waitpid(pids[i], &status, 0) != pids[i] ||
                !WIFEXITED(status) || WEXITSTATUS(status) != 0)
                ok = 0;
        }
        CHECK(ok);
        CHECK(raw_int(path, "SELECT count(*) FROM measurements") ==
              WRITERS * PER_WRITER);
        CHECK(raw_int(path, "SELECT count(*) FROM devices") == 1);
        CHECK(raw_int(path, "SELECT count(*) FROM problems") == 6);
        CHECK(raw_int(path, "SELECT count(*) FROM candidates") ==
              1 + WRITERS * 10);
        CHECK(raw_int(path, "SELECT count(*) FROM runs WHERE status = "
                            "'complete'") == WRITERS);
        CHECK(raw_int(path, "SELECT count(*) FROM attnres_meta WHERE key = "
                            "'format'") == 1);
        CHECK(raw_int(path, "SELECT count(*) FROM pragma_integrity_check "
                            "WHERE integrity_check != 'ok'") == 0);
        {
            ardb *db = NULL;
            CHECK(ardb_open(path, ARDB_READONLY, &db, NULL, 0) == ARDB_DONE);
            ardb_close(db);
        }
    }
}

/* A reader sees committed data while a writer holds a write transaction. */
static void test_reader_during_write(void)
{
    char path[600];
    ardb *w = create_db("rw.db", path, sizeof path), *r = NULL;
    ardb_device d = dev_make("cpu", "c", "x86_64", "fp1");
    ardb_problem p = prob_make(1);
    int64_t id = 0;
    rows rr;
    REQUIRE(w != NULL);
    CHECK(ardb_device_upsert(w, &d, &id) == ARDB_DONE);
    CHECK(ardb_begin(w) == ARDB_DONE);
    CHECK(ardb_problem_upsert(w, &p, &id) == ARDB_DONE);
    CHECK(test_run_begin(w, id) > 0);
    CHECK(ardb_open(path, ARDB_READONLY, &r, NULL, 0) == ARDB_DONE);
    if (r) {
        memset(&rr, 0, sizeof rr);
        CHECK(ardb_list_runs(r, collect, &rr) == ARDB_DONE && rr.count == 0);
    }
    CHECK(ardb_commit(w) == ARDB_DONE);
    if (r) {
        memset(&rr, 0, sizeof rr);
        CHECK(ardb_list_runs(r, collect, &rr) == ARDB_DONE && rr.count == 1);
    }
    ardb_close(r);
    ardb_close(w);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    db_scratch_begin("db");
    RUN_CASE(test_create_reopen);
    RUN_CASE(test_open_errors);
    RUN_CASE(test_corrupt_pages);
    RUN_CASE(test_upserts);
    RUN_CASE(test_binaries);
    RUN_CASE(test_measurements);
    RUN_CASE(test_transactions);
    RUN_CASE(test_winners);
    RUN_CASE(test_lists);
    RUN_CASE(test_run_read_gbps);
    RUN_CASE(test_simulated_devices);
    RUN_CASE(test_concurrent_writers);
    RUN_CASE(test_reader_during_write);
    CHECK_EXIT();
}
