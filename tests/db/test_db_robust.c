/*
 * test_db_robust.c - the tuning database against hostile and damaged
 * input: the defects that a sanitizer build and mutated files
 * found, each as a case that failed before its fix.
 *
 *   - an import of an export version this build does not read (it read the
 *     parsed document after freeing it);
 *   - imports of impossible values (negative, non-finite or absurd timings
 *     and repetition counts) and of strings that are not UTF-8, and exports
 *     of a database that holds such strings, which must still be JSON;
 *   - the SVG charts of huge stored timings (a float-to-int conversion of
 *     infinity, and a tick loop that never ended);
 *   - runs whose process was killed, which must become "interrupted", and
 *     the migration that records a run's process (schema v5).
 *
 * CMake builds this test with AddressSanitizer and UndefinedBehaviorSanitizer
 * where the compiler has them (tests/db/CMakeLists_db.cmake), so a use
 * after free or an undefined conversion fails it in an ordinary build.
 * Every file lives in a fresh mkdtemp directory, removed at the end.
 */
#define _GNU_SOURCE /* nftw, FTW_PHYS, open_memstream */
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "check.h"
#include "svg_plot.h"
#include "test_buffer.h"
#include "test_db_scratch.h"
#include "test_scratch.h"
#include "test_sqlite.h"
#include "test_utf8.h"


/* ---- helpers ---------------------------------------------------------------- */


/* ---- 1: an unsupported export version ------------------------------------------ */

static void test_import_of_another_version_is_refused(void)
{
    static const import_refusal cases[] = {
        {"{\"format\": \"attnres-export\", \"version\": 2}", "export version 2 is newer than this build reads (1)"},
        {"{\"format\": \"attnres-export\", \"version\": 0}", "export version 0 is not one this build reads (1)"},
        {"{\"format\": \"attnres-export\", \"version\": 1.5}", "export version 1.5 is not one this build reads"},
        {"{\"format\": \"attnres-export\", \"version\": \"1\"}", "export version is missing or not a number"},
        {"{\"format\": \"attnres-export\"}", "export version is missing or not a number"},
    };
    char path[600];
    ardb *db = create_db("version.db", path, sizeof path);
    REQUIRE(db != NULL);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_import_refused(db, "version case", i, cases[i].text, cases[i].msg);
    ardb_close(db);
}

/* ---- 2: impossible values and strings that are not UTF-8 ---------------------- */

#define PROBLEM_KEY "mix:f32:d2:n1:h1:replace:epi0:s0:t1"

/* A whole export with one run and one measurement; run_extra and
 * measurement_extra are members added to (or, when repeated, taking the
 * place of) the run's and the measurement's. */
static char *export_doc(const char *run_extra, const char *measurement_extra)
{
    static const char fmt[] =
        "{\"format\": \"attnres-export\", \"version\": 1,\n"
        "\"devices\": [{\"fingerprint\": \"fp\", \"backend\": \"cpu\"}],\n"
        "\"problems\": [{\"key\": \"" PROBLEM_KEY "\", \"op\": \"mix\", \"dtype\": \"f32\", \"form\": \"replace\","
        " \"d\": 2, \"n\": 1, \"heads\": 1, \"epilogue\": 0, \"s\": 0, \"t_bucket\": 1}],\n"
        "\"candidates\": [{\"variant\": \"v\", \"source_hash\": \"h\"}],\n"
        "\"runs\": [{%s\"uid\": \"r1\", \"started_at\": \"2025-01-01T00:00:00.000Z\", \"status\": \"complete\","
        " \"device\": \"fp\"}],\n"
        "\"measurements\": [\n{%s\"id\": 1, \"run\": \"r1\", \"problem\": \"" PROBLEM_KEY "\", \"variant\": \"v\","
        " \"source_hash\": \"h\", \"device\": \"fp\", \"status\": \"ok\", \"created_at\": \"t\"}]}\n";
    size_t n = sizeof fmt + strlen(run_extra) + strlen(measurement_extra);
    char *doc = malloc(n);
    if (doc)
        snprintf(doc, n, fmt, run_extra, measurement_extra);
    return doc;
}

static void test_import_refuses_impossible_values(void)
{
    static const struct {
        const char *run, *measurement, *msg; /* msg NULL: imports */
    } cases[] = {
        {"", "\"median_us\": 12.5, \"min_us\": 12, \"max_us\": 14, \"spread_us\": 0.25, \"reps\": 100, "
             "\"gbps\": 3.5, \"ceiling_fraction\": 0.5, \"rel_err\": 1e-7, ",
         NULL},
        {"\"launch_us\": 4.5, \"copy_gbps\": 20, \"read_gbps\": 11, ", "\"median_us\": 0, \"reps\": 0, ", NULL},
        {"", "\"median_us\": -1, ", "measurements[0] (line 7): \"median_us\" must be a time in microseconds"},
        {"", "\"median_us\": 1e308, ", "\"median_us\" must be a time in microseconds between 0 and 1e+09"},
        {"", "\"min_us\": 1e999, ", "measurements[0] (line 7): \"min_us\""},
        {"", "\"max_us\": -1e999, ", "\"max_us\""},
        {"", "\"spread_us\": -0.5, ", "\"spread_us\""},
        {"", "\"reps\": -1, ", "measurements[0] (line 7): \"reps\" must be a repetition count between 0 and"},
        {"", "\"reps\": 1000000000000, ", "\"reps\" must be a repetition count"},
        {"", "\"gbps\": -3, ", "\"gbps\" must be a bandwidth"},
        {"", "\"gbps\": 1e300, ", "\"gbps\" must be a bandwidth"},
        {"", "\"ceiling_fraction\": -0.1, ", "\"ceiling_fraction\""},
        {"", "\"roofline\": 2e6, ", "\"roofline\" must be a fraction of the ceiling"}, /* its key before v11 */
        {"", "\"rel_err\": 1e999, ", "\"rel_err\" must be a finite number >= 0"},
        {"", "\"rel_err\": -1, ", "\"rel_err\""},
        {"\"launch_us\": -2, ", "", "runs[0] (line 5): \"launch_us\" must be a time in microseconds"},
        {"\"copy_gbps\": 1e999, ", "", "runs[0] (line 5): \"copy_gbps\" must be a bandwidth"},
        {"\"read_gbps\": -1e999, ", "", "\"read_gbps\""},
        /* Strings: raw bytes that are not UTF-8 (a lone continuation byte,
         * an overlong '/', an encoded surrogate, a code point above
         * U+10FFFF, a sequence cut short) are refused; any UTF-8 is kept. */
        {"\"host\": \"h\xc3\xa9llo \xe2\x82\xac \xf0\x9d\x84\x9e\", ", "\"message\": \"\xe6\x97\xa5\", ", NULL},
        {"\"host\": \"a\xff" "b\", ", "", "runs[0] (line 5): \"host\" is not valid UTF-8 (at byte 1)"},
        {"\"note\": \"\xc0\xaf\", ", "", "\"note\" is not valid UTF-8"},
        {"", "\"message\": \"x\xed\xa0\x80\", ", "measurements[0] (line 7): \"message\" is not valid UTF-8 (at byte 1)"},
        {"", "\"build_key\": \"\xf4\x90\x80\x80\", ", "\"build_key\" is not valid UTF-8"},
        {"", "\"message\": \"ab\xe2\x82\", ", "\"message\" is not valid UTF-8 (at byte 2)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[600], name[64];
        ardb_merge_stats s;
        snprintf(name, sizeof name, "values-%zu.db", i);
        path_in_tmp(path, sizeof path, name);
        ardb *db = open_db(path, ARDB_CREATE);
        char *doc = export_doc(cases[i].run, cases[i].measurement);
        if (!db || !doc) {
            check_failures++;
            ardb_close(db);
            free(doc);
            continue;
        }
        int rc = ardb_import_json(db, doc, strlen(doc), &s);
        int good = cases[i].msg ? rc == ARDB_EINVAL && strstr(ardb_errmsg(db), cases[i].msg) != NULL
                                : rc == ARDB_DONE && s.measurements == 1 && s.runs == 1;
        if (!good) {
            fprintf(stderr, "values case %zu: rc %d, message '%s' (want %s%s)\n", i, rc, ardb_errmsg(db),
                    cases[i].msg ? cases[i].msg : "success", "");
            check_failures++;
        }
        ardb_close(db);
        free(doc);
    }
}

/* A database that already holds bytes that are not UTF-8 (written before
 * imports checked, or by a tool through SQL) still exports as JSON: such
 * bytes become U+FFFD, and the export imports again. */
static void test_export_is_always_json(void)
{
    char path[600], path2[600];
    ardb_merge_stats s;
    buffer e = {0};
    char *doc = export_doc("", "\"median_us\": 12.5, ");
    path_in_tmp(path, sizeof path, "bytes.db");
    path_in_tmp(path2, sizeof path2, "bytes-again.db");
    ardb *db = open_db(path, ARDB_CREATE);
    REQUIRE(db != NULL && doc != NULL);
    CHECK(ardb_import_json(db, doc, strlen(doc), &s) == ARDB_DONE);
    ardb_close(db);
    free(doc);
    CHECK(raw_exec(path, "UPDATE runs SET host = CAST(X'61FF62C0AFEDA080F4908080E282' AS TEXT),"
                         " note = X'00FE41', command = CAST(X'E282AC' AS TEXT)") == SQLITE_OK);
    db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    CHECK(ardb_export_json(db, 0, buffer_write, &e) == ARDB_DONE);
    ardb_close(db);
    REQUIRE(e.data != NULL);
    CHECK(utf8_valid(e.data, e.len));
    CHECK(strstr(e.data, "\"host\": \"a\\ufffdb\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd"
                         "\\ufffd\"") != NULL);
    CHECK(strstr(e.data, "\"note\": \"\\u0000\\ufffdA\"") != NULL);
    CHECK(strstr(e.data, "\"command\": \"\xe2\x82\xac\"") != NULL);
    db = open_db(path2, ARDB_CREATE);
    REQUIRE(db != NULL);
    CHECK(ardb_import_json(db, e.data, e.len, &s) == ARDB_DONE && s.runs == 1);
    ardb_close(db);
    free(e.data);
}

/* ---- 2: charts of huge timings ------------------------------------------------- */

static char *chart_text(int bar, const double *y, const double *err, size_t n)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    double x[8];
    int rc;
    if (!f)
        return NULL;
    for (size_t i = 0; i < n; i++)
        x[i] = (double)(i + 1);
    if (bar) {
        const char *groups[8] = {"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}, *series[1] = {"run 1"};
        svg_bar_opts o = {.title = "t", .y_label = "% of ceiling", .reference = 100, .reference_name = "r"};
        rc = svg_bar_chart(f, &o, groups, n, series, 1, y);
    } else {
        svg_series s = {.name = "cpu", .count = n, .x = x, .y = y, .err = err};
        svg_line_opts o = {.title = "t", .x_label = "run id", .y_label = "us", .log_y = -1, .integer_x = 1};
        rc = svg_line_chart(f, &o, &s, 1);
    }
    fclose(f);
    if (rc != 0) {
        free(text);
        return NULL;
    }
    return text;
}

/* Every number in the chart is finite, and it has y tick labels. */
static int chart_sane(const char *svg)
{
    return svg && !strstr(svg, "nan") && !strstr(svg, "inf") && strstr(svg, "text-anchor=\"end\"") &&
           strstr(svg, "</svg>");
}

static void test_charts_of_huge_timings(void)
{
    static const double y1[] = {1.5, 1e308}, e1[] = {0.1, 1e308};
    static const double y2[] = {1e308, 1.7e308}, e2[] = {0, 1.7e308};
    static const double y3[] = {1e-300, 1.7976931348623157e308}, e3[] = {1e-300, 0};
    static const double y4[] = {5, 5.0000001}, e4[] = {1e308, 0};
    static const double b1[] = {1.7e308, 50}, b2[] = {1.7976931348623157e308, 1e-300}, b3[] = {1e300, 1};
    static const struct {
        int bars;
        const double *y, *err;
    } charts[] = {{0, y1, e1}, {0, y2, e2}, {0, y3, e3}, {0, y4, e4}, {1, b1, NULL}, {1, b2, NULL}, {1, b3, NULL}};
    for (size_t i = 0; i < sizeof charts / sizeof charts[0]; i++) {
        char *t = chart_text(charts[i].bars, charts[i].y, charts[i].err, 2);
        if (!chart_sane(t)) {
            fprintf(stderr, "chart %zu is not sane\n", i);
            check_failures++;
        }
        free(t);
    }
}

/* ---- 6: runs whose process is gone ------------------------------------------- */

static char *run_status(const char *path, int64_t id)
{
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT status FROM runs WHERE id = %lld", (long long)id);
    return raw_text(path, sql);
}

static int status_is(const char *path, int64_t id, const char *want)
{
    char *st = run_status(path, id);
    int ok = st && strcmp(st, want) == 0;
    if (!ok)
        fprintf(stderr, "run %lld: status %s, want %s\n", (long long)id, st ? st : "(none)", want);
    free(st);
    return ok;
}

/* Sets run id's owner to this process's owner with field k (0-based, of
 * "v1|MACHINE|BOOT|PIDNS|PID|START", db/write/liveness.c) replaced by value. */
static int set_owner_field(const char *path, int64_t id, int64_t from, int k, const char *value)
{
    char sql[1024], *owner, *parts[8], *save = NULL;
    int n = 0;
    snprintf(sql, sizeof sql, "SELECT owner FROM runs WHERE id = %lld", (long long)from);
    if (!(owner = raw_text(path, sql)))
        return -1;
    for (char *t = strtok_r(owner, "|", &save); t && n < 8; t = strtok_r(NULL, "|", &save))
        parts[n++] = t;
    if (n != 6) {
        free(owner);
        return -1;
    }
    parts[k] = (char *)value;
    snprintf(sql, sizeof sql, "UPDATE runs SET owner = '%s|%s|%s|%s|%s|%s' WHERE id = %lld", parts[0], parts[1],
             parts[2], parts[3], parts[4], parts[5], (long long)id);
    free(owner);
    return raw_exec(path, sql) == SQLITE_OK ? 0 : -1;
}

static void test_killed_runs_become_interrupted(void)
{
    char path[600];
    ardb_run r = {.host = "here", .strategy = "exhaustive"};
    int64_t live, killed = 0, reused, other_machine, old_run, rebooted, done;
    ardb *db = create_db("runs.db", path, sizeof path);
    REQUIRE(db != NULL);
    REQUIRE(ardb_run_begin(db, &r, &live) == ARDB_DONE);
    ardb_close(db);

    /* A child records a run and is killed before it finishes it. */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        ardb *c = NULL;
        int64_t id;
        if (ardb_open(path, 0, &c, NULL, 0) != ARDB_DONE || ardb_run_begin(c, &r, &id) != ARDB_DONE)
            _exit(3);
        raise(SIGKILL);
        _exit(4);
    }
    int ws = 0;
    REQUIRE(pid > 0 && waitpid(pid, &ws, 0) == pid);
    CHECK(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    char *max = raw_text(path, "SELECT max(id) FROM runs");
    killed = max ? atoll(max) : 0;
    free(max);
    CHECK(killed == live + 1 && status_is(path, killed, "running"));

    /* Runs whose owner this process fabricates from its own: the same pid
     * started at another time (a reused pid), another machine, another
     * boot of this one; a run without owner (recorded before schema v5);
     * and one that finished. */
    db = open_db(path, 0);
    REQUIRE(db != NULL);
    CHECK(ardb_run_begin(db, &r, &reused) == ARDB_DONE);
    CHECK(ardb_run_begin(db, &r, &other_machine) == ARDB_DONE);
    CHECK(ardb_run_begin(db, &r, &rebooted) == ARDB_DONE);
    CHECK(ardb_run_begin(db, &r, &old_run) == ARDB_DONE);
    CHECK(ardb_run_begin(db, &r, &done) == ARDB_DONE);
    CHECK(ardb_run_finish(db, done, "complete") == ARDB_DONE);
    ardb_close(db);
    CHECK(set_owner_field(path, reused, live, 5, "1") == 0);
    CHECK(set_owner_field(path, other_machine, live, 1, "another-machine") == 0);
    CHECK(set_owner_field(path, rebooted, live, 2, "00000000-0000-0000-0000-000000000000") == 0);
    CHECK(set_owner_field(path, done, killed, 0, "v1") == 0);
    CHECK(raw_exec(path, "UPDATE runs SET owner = NULL WHERE id = (SELECT max(id) - 1 FROM runs)") == SQLITE_OK);

    /* The open that recorded them has already decided the killed child's
     * run. A read-only open decides nothing; the next read-write open
     * decides the rest. */
    CHECK(status_is(path, killed, "interrupted"));
    db = open_db(path, ARDB_READONLY);
    ardb_close(db);
    CHECK(status_is(path, reused, "running") && status_is(path, rebooted, "running"));
    db = open_db(path, 0);
    REQUIRE(db != NULL);
    CHECK(status_is(path, live, "running"));
    CHECK(status_is(path, killed, "interrupted"));
    CHECK(status_is(path, reused, "interrupted"));
    CHECK(status_is(path, other_machine, "running"));
    CHECK(status_is(path, rebooted, "interrupted"));
    CHECK(status_is(path, old_run, "running"));
    CHECK(status_is(path, done, "complete"));
    /* A run marked interrupted that its process still finishes (possible
     * only where the process could not be seen) takes its real status. */
    CHECK(ardb_run_finish(db, reused, "complete") == ARDB_DONE && status_is(path, reused, "complete"));
    ardb_close(db);
}

/* A v4 file gains runs.owner through a migration with a backup; its
 * running runs have no owner and stay running. */
static void test_v4_file_migrated_to_v5(void)
{
    char path[600], bak[700];
    ardb_run r = {.host = "old"};
    int64_t id;
    ardb *db = create_db("v4.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_run_begin(db, &r, &id) == ARDB_DONE);
    ardb_close(db);
    REQUIRE(schema_back_to(path, 4) == SQLITE_OK);
    db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    ardb_close(db);
    snprintf(bak, sizeof bak, "%s.v4.bak", path);
    CHECK(!file_exists(bak));
    db = open_db(path, 0);
    REQUIRE(db != NULL);
    ardb_close(db);
    CHECK(migrated_with_backup(path, bak, 4));
    CHECK(raw_int(path, "SELECT count(*) FROM pragma_table_info('runs') WHERE name = 'owner'") == 1);
    CHECK(status_is(path, id, "running"));
}

/* A v5 file gains runs.ceilings through a migration with a backup: its
 * runs hold none, a read-only open reads it as it is, and ceilings set
 * after it survive a merge and an export and import. */
static void test_v5_file_migrated_to_v6(void)
{
    char path[600], bak[700], shard[600], copy[600];
    ardb_run r = {.host = "old", .copy_gbps = 40.0, .read_gbps = 50.0};
    ardb_run_info info;
    int64_t old_id, new_id;
    ardb *db = create_db("v5.db", path, sizeof path);
    REQUIRE(db != NULL);
    CHECK(ardb_run_begin(db, &r, &old_id) == ARDB_DONE);
    CHECK(ardb_run_finish(db, old_id, "complete") == ARDB_DONE);
    ardb_close(db);
    REQUIRE(schema_back_to(path, 5) == SQLITE_OK);
    db = open_db(path, ARDB_READONLY);
    REQUIRE(db != NULL);
    CHECK(ardb_run_get(db, old_id, &info) == ARDB_DONE && info.ceilings == NULL && info.copy_gbps == 40.0);
    ardb_run_info_clear(&info);
    CHECK(ardb_run_set_ceilings(db, old_id, "{}") != ARDB_DONE); /* read-only */
    ardb_close(db);
    snprintf(bak, sizeof bak, "%s.v5.bak", path);
    CHECK(!file_exists(bak));
    db = open_db(path, 0);
    REQUIRE(db != NULL);
    CHECK(migrated_with_backup(path, bak, 5));
    CHECK(ardb_run_get(db, old_id, &info) == ARDB_DONE && info.ceilings == NULL);
    ardb_run_info_clear(&info);

    /* Set, replaced, refused when not an object or for no run. */
    static const char json[] = "{\"copy_gbps\": 46.5, \"read_gbps\": 53.7, \"kernels\": []}";
    CHECK(ardb_run_begin(db, &r, &new_id) == ARDB_DONE);
    CHECK(ardb_run_set_ceilings(db, new_id, "{\"first\": 1}") == ARDB_DONE);
    CHECK(ardb_run_set_ceilings(db, new_id, json) == ARDB_DONE);
    CHECK(ardb_run_set_ceilings(db, new_id, "[1]") == ARDB_EINVAL && strstr(ardb_errmsg(db), "JSON object"));
    CHECK(ardb_run_set_ceilings(db, new_id, NULL) == ARDB_EINVAL);
    CHECK(ardb_run_set_ceilings(db, new_id + 100, json) == ARDB_ENOTFOUND);
    CHECK(ardb_run_finish(db, new_id, "complete") == ARDB_DONE);
    CHECK(ardb_run_get(db, new_id, &info) == ARDB_DONE && info.ceilings && strcmp(info.ceilings, json) == 0);
    ardb_run_info_clear(&info);

    /* A merge into an empty file keeps them, and the old run's NULL. */
    ardb *dst = create_db("v6-merged.db", shard, sizeof shard);
    ardb_merge_stats ms;
    REQUIRE(dst != NULL);
    CHECK(ardb_merge(dst, path, &ms) == ARDB_DONE && ms.runs == 2);
    ardb_close(dst);
    char *got = raw_text(shard, "SELECT ceilings FROM runs WHERE ceilings IS NOT NULL");
    CHECK(got && strcmp(got, json) == 0);
    free(got);
    got = raw_text(shard, "SELECT count(*) FROM runs WHERE ceilings IS NULL");
    CHECK(got && strcmp(got, "1") == 0);
    free(got);

    /* So do an export and an import. */
    buffer e = {0};
    CHECK(ardb_export_json(db, 0, buffer_write, &e) == ARDB_DONE && e.data && strstr(e.data, "\"ceilings\": null"));
    dst = create_db("v6-imported.db", copy, sizeof copy);
    ardb_merge_stats is;
    REQUIRE(dst != NULL);
    CHECK(e.data && ardb_import_json(dst, e.data, e.len, &is) == ARDB_DONE && is.runs == 2);
    ardb_close(dst);
    got = raw_text(copy, "SELECT ceilings FROM runs WHERE ceilings IS NOT NULL");
    CHECK(got && strcmp(got, json) == 0);
    free(got);
    free(e.data);
    ardb_close(db);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    db_scratch_begin("db-robust");
    /* A chart whose tick loop never ends must fail the test, not hang it. */
    alarm(60);
    RUN_CASE(test_import_of_another_version_is_refused);
    RUN_CASE(test_import_refuses_impossible_values);
    RUN_CASE(test_export_is_always_json);
    RUN_CASE(test_charts_of_huge_timings);
    RUN_CASE(test_killed_runs_become_interrupted);
    RUN_CASE(test_v4_file_migrated_to_v5);
    RUN_CASE(test_v5_file_migrated_to_v6);
    CHECK_EXIT();
}
