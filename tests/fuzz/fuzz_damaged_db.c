/*
 * fuzz_damaged_db.c - a tuning database file with any bytes, read the ways
 * the project reads one:
 *   - the runtime's public API, as an engine loads a model:
 *     attnres_db_open + attnres_plan_create on the CPU (a tuned shape and
 *     an untuned one, then a run checked against the fp64 reference);
 *   - the read paths of the command line: `db show` (ardb_list_winners),
 *     `db runs` (ardb_list_runs, ardb_run_list), `db diff` and `db regress`
 *     (ardb_run_resolve, ardb_diff_runs and its classification,
 *     ardb_run_latest_on_device), `db plot` (ardb_winner_history drawn with
 *     cli/svg_plot.c), `db export` (JSON and CSV),
 *     `tune --revalidate` / `plan` (ardb_stored_winners) and the file
 *     `tune --ceilings-from` names (ardb_run_latest_measured_ceilings, then
 *     that run read whole).
 *
 * Invariants: every failure is a status with a non-empty message; a plan
 * that is made computes the right result (whatever level it came from); no
 * sanitizer report. The verdict is "accepted" when ardb_open reads the file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "attnres.h"
#include "fuzz.h"
#include "svg_plot.h"
#include "test_plain_mix.h"

enum { D = 64, N = 3, T = 4 };

static attnres_device *cpu;
static ardb_device cpu_info;

static void close_cpu(void)
{
    attnres_device_close(cpu);
    cpu = NULL;
}

static void open_cpu(void)
{
    char msg[256];
    if (attnres_device_open("cpu", &cpu, msg, sizeof msg) != ATTNRES_OK)
        fuzz_fail("cannot open the CPU device", msg);
    attnres_device_info info = {.struct_size = sizeof info};
    if (attnres_device_info_get(cpu, &info) != ATTNRES_OK)
        fuzz_fail("no CPU device info", NULL);
    cpu_info = (ardb_device){.backend = info.backend, .name = info.name, .arch = info.arch, .driver = info.driver,
                             .fingerprint = info.fingerprint, .units = info.units, .memory = info.memory};
    atexit(close_cpu);
}

static void check_status(int rc, ardb *db, const char *what)
{
    if (rc != ARDB_DONE && rc != ARDB_ENOTFOUND) {
        const char *m = ardb_errmsg(db);
        if (!m || !*m)
            fuzz_fail(what, "failed without a message");
    }
}

static int count_rows(void *ctx, int ncol, const char *const *names, const char *const *values)
{
    for (int i = 0; i < ncol; i++)
        if (!names[i] || !values[i])
            fuzz_fail("a listing row with a NULL name or value", NULL);
    ++*(size_t *)ctx;
    return 0;
}

static int discard(void *ctx, const void *data, size_t len)
{
    (void)ctx;
    (void)data;
    (void)len;
    return 0;
}

/* `db plot`'s latency chart: one series of the winner history. */
static void plot(const ardb_winner_point *p, size_t n)
{
    if (!n)
        return;
    double *x = calloc(n, sizeof *x), *y = calloc(n, sizeof *y), *e = calloc(n, sizeof *e);
    FILE *f = fopen("/dev/null", "w");
    if (x && y && e && f) {
        for (size_t i = 0; i < n; i++) {
            x[i] = (double)p[i].run_id;
            y[i] = p[i].median_us;
            e[i] = p[i].spread_us;
        }
        svg_series s = {.name = p[0].device ? p[0].device : "?", .count = n, .x = x, .y = y, .err = e};
        svg_line_opts o = {.title = "t", .x_label = "run id", .y_label = "us", .log_y = -1, .integer_x = 1};
        (void)svg_line_chart(f, &o, &s, 1);
        const char *group = p[0].problem ? p[0].problem : "?";
        const char *series = "run";
        double value = 100.0 * p[0].ceiling_fraction;
        svg_bar_opts b = {.title = "t", .y_label = "%", .reference = 100.0, .reference_name = "copy"};
        (void)svg_bar_chart(f, &b, &group, 1, &series, 1, &value);
    }
    if (f)
        fclose(f);
    free(x);
    free(y);
    free(e);
}

static void cli_read_paths(ardb *db)
{
    size_t rows = 0;
    check_status(ardb_list_winners(db, 0, count_rows, &rows), db, "list_winners");
    check_status(ardb_list_runs(db, count_rows, &rows), db, "list_runs");

    ardb_run_info *runs = NULL;
    size_t nruns = 0;
    int rc = ardb_run_list(db, &runs, &nruns);
    check_status(rc, db, "run_list");
    if (rc == ARDB_DONE && nruns) {
        int64_t a = runs[0].id, b = runs[nruns - 1].id, resolved;
        ardb_run_info one;
        if (ardb_run_get(db, b, &one) == ARDB_DONE)
            ardb_run_info_clear(&one);
        check_status(ardb_run_resolve(db, "latest", &resolved), db, "run_resolve");
        (void)ardb_run_resolve(db, "latest~1", &resolved);
        check_status(ardb_run_latest_on_device(db, runs[0].device_id, a, &resolved), db, "run_latest_on_device");
        ardb_diff_row *diff = NULL;
        size_t nd = 0;
        rc = ardb_diff_runs(db, a, b, &diff, &nd);
        check_status(rc, db, "diff_runs");
        if (rc == ARDB_DONE) {
            for (size_t i = 0; i < nd; i++) {
                (void)ardb_change_name(ardb_diff_classify(&diff[i], ARDB_DEFAULT_THRESHOLD_PCT));
                (void)ardb_diff_beyond_noise(&diff[i]);
            }
            ardb_diff_free(diff, nd);
        }
    }
    ardb_run_infos_free(runs, nruns);

    ardb_winner_point *pts = NULL;
    size_t np = 0;
    rc = ardb_winner_history(db, &pts, &np);
    check_status(rc, db, "winner_history");
    if (rc == ARDB_DONE) {
        plot(pts, np);
        ardb_winner_points_free(pts, np);
    }

    /* Any age a record may claim: a century. */
    int64_t source = 0;
    rc = ardb_run_latest_measured_ceilings(db, cpu_info.fingerprint, (int64_t)100 * 365 * 86400, &source);
    check_status(rc, db, "run_latest_measured_ceilings");
    if (rc == ARDB_DONE) {
        ardb_run_info one;
        if (ardb_run_get(db, source, &one) == ARDB_DONE)
            ardb_run_info_clear(&one);
    }

    ardb_stored_winner *sw = NULL;
    size_t ns = 0;
    rc = ardb_stored_winners(db, &cpu_info, &sw, &ns);
    check_status(rc, db, "stored_winners");
    if (rc == ARDB_DONE)
        ardb_stored_winners_free(sw, ns);

    check_status(ardb_export_json(db, 0, discard, NULL), db, "export_json");
    for (int t = ARDB_CSV_MEASUREMENTS; t <= ARDB_CSV_RUNS; t++)
        check_status(ardb_export_csv(db, (ardb_csv_table)t, discard, NULL), db, "export_csv");
}

/* Plans one problem from the database and, when a plan is made, checks a
 * run against the fp64 reference (DESIGN §1 tolerance for fp32). */
static void plan_and_run(attnres_db *adb, int n)
{
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, D, n);
    attnres_plan *plan = NULL;
    char msg[512] = "";
    int rc = attnres_plan_create(cpu, adb, &p, 0, &plan, msg, sizeof msg);
    if (rc != ATTNRES_OK) {
        if (plan)
            fuzz_fail("a failed plan_create returned a plan", msg);
        if (!msg[0])
            fuzz_fail("plan_create failed without a message", attnres_errstr(rc));
        return;
    }
    static float src[8][T * D], query[D], out[T * D];
    static double dsrc[8][T * D], dq[D], ref[T * D];
    const void *s[8];
    const double *ds[8];
    for (int j = 0; j < n; j++) {
        for (int k = 0; k < T * D; k++) {
            src[j][k] = (float)sin(0.37 * (j * T * D + k) + 0.1);
            dsrc[j][k] = src[j][k];
        }
        s[j] = src[j];
        ds[j] = dsrc[j];
    }
    for (int k = 0; k < D; k++) {
        query[k] = (float)(0.25 * cos(0.11 * k));
        dq[k] = query[k];
    }
    rc = plain_mix_run(plan, T, s, query, out);
    if (rc != ATTNRES_OK)
        fuzz_fail("a plan that was made does not run", attnres_plan_errmsg(plan));
    if (attnres_reference_mix(&p, T, ds, dq, 1.0, 1e-6, NULL, 1.0, NULL, 1e-6, ref, NULL) != ATTNRES_OK)
        fuzz_fail("the reference refuses the problem", NULL);
    if (!(plain_rel_err(out, ref, T * D) <= 1e-5)) {
        char explain[2048];
        attnres_plan_explain(plan, explain, sizeof explain);
        fuzz_fail("a plan from the database computes a wrong result", explain);
    }
    attnres_plan_destroy(plan);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!cpu)
        open_cpu();
    char path[1024], msg[512] = "";
    fuzz_remove_db("damaged.db");
    fuzz_write_file("damaged.db", data, size, path, sizeof path);

    ardb *db = NULL;
    if (ardb_open(path, ARDB_READONLY, &db, msg, sizeof msg) == ARDB_DONE) {
        fuzz_verdict = FUZZ_ACCEPTED;
        cli_read_paths(db);
        ardb_close(db);
    } else {
        fuzz_verdict = FUZZ_REFUSED;
        if (db)
            fuzz_fail("a failed ardb_open returned a handle", msg);
        if (!msg[0])
            fuzz_fail("ardb_open failed without a message", NULL);
    }

    attnres_db *adb = NULL;
    msg[0] = '\0';
    int rc = attnres_db_open(path, &adb, msg, sizeof msg);
    if (rc == ATTNRES_OK) {
        plan_and_run(adb, N);
        plan_and_run(adb, N + 2);
        attnres_db_close(adb);
    } else if (adb || !msg[0]) {
        fuzz_fail("a failed attnres_db_open returned a handle or no message", attnres_errstr(rc));
    }
    fuzz_remove_db("damaged.db");
    return 0;
}
