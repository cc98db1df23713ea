/*
 * cmd_db_compare.c - `attnres db diff` and `attnres db regress`: two runs
 * compared problem by problem, with the noise rule and classification of
 * db/tools/history.c.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "cli.h"
#include "cmd_db.h"

/* Exit statuses of regress (documented in `attnres db --help`). */
#define REGRESS_NONE 0
#define REGRESS_FOUND 1
#define REGRESS_USAGE 2

static int parse_threshold(const char *cmd, const char *flag, const char *v, void *dst)
{
    double *pct = dst;
    if (cli_parse_double(cmd, flag, v, pct))
        return -1;
    if (!(*pct >= 0) || *pct > 1e6) {
        cli_error(cmd, "%s is a percentage >= 0 (got '%s')", flag, v);
        return -1;
    }
    return 0;
}

static void print_run_line(const char *role, const ardb_run_info *r)
{
    char when[20] = "?", tmpl[13];
    if (r->started_at) {
        snprintf(when, sizeof when, "%.19s", r->started_at);
        if (strlen(when) > 10)
            when[10] = ' ';
    }
    snprintf(tmpl, sizeof tmpl, "%s", r->templates_hash ? r->templates_hash : "-");
    printf("%-9s run %" PRId64 "  %s  %s  %s%s  attnres %s  templates %s  compiler %s  driver %s%s%s\n", role, r->id,
           when, r->strategy ? r->strategy : "-", r->device_name ? r->device_name : "-",
           r->device_simulated ? " (simulated)" : "",
           r->project_version ? r->project_version : "-", tmpl, r->compiler ? r->compiler : "-",
           r->driver ? r->driver : "-", r->note ? "  note: " : "", r->note ? r->note : "");
}

/* Two runs and the comparison of their winners, problem by problem: what
 * diff and regress show. */
typedef struct run_pair {
    ardb_run_info ra, rb;
    ardb_diff_row *rows;
    size_t n;
} run_pair;

/* Loads runs a and b and their comparison into cmp, which pair_free
 * empties whatever happened; prints the reason on failure. */
static int load_pair(ardb *db, int64_t a, int64_t b, run_pair *cmp)
{
    if (ardb_run_get(db, a, &cmp->ra) != ARDB_DONE || ardb_run_get(db, b, &cmp->rb) != ARDB_DONE ||
        ardb_diff_runs(db, a, b, &cmp->rows, &cmp->n) != ARDB_DONE) {
        cli_error("db", "%s", ardb_errmsg(db));
        return -1;
    }
    return 0;
}

static void pair_free(run_pair *cmp)
{
    ardb_diff_free(cmp->rows, cmp->n);
    ardb_run_info_clear(&cmp->ra);
    ardb_run_info_clear(&cmp->rb);
}

static void json_row(FILE *out, const ardb_diff_row *r, ardb_change c)
{
    double ratio = r->winner_a && r->winner_b && r->us_a > 0 ? r->us_b / r->us_a : NAN;
    fputs("{\"problem\": ", out);
    db_json_string(out, r->problem);
    db_json_number_member(out, "baseline_us", r->winner_a ? r->us_a : NAN);
    db_json_number_member(out, "candidate_us", r->winner_b ? r->us_b : NAN);
    db_json_number_member(out, "ratio", ratio);
    db_json_string_member(out, "variant_a", r->variant_a);
    db_json_string_member(out, "variant_b", r->variant_b);
    db_json_number_member(out, "baseline_spread_us", r->winner_a ? r->spread_a : NAN);
    db_json_number_member(out, "candidate_spread_us", r->winner_b ? r->spread_b : NAN);
    fprintf(out, ", \"beyond_noise\": %s, \"change\": \"%s\", \"candidate_status\": ",
            ardb_diff_beyond_noise(r) ? "true" : "false", ardb_change_name(c));
    db_json_string(out, r->winner_b ? "ok" : r->status_b);
    fputs("}", out);
}

/* Prints a JSON array of the rows whose change is one of kinds[0, count):
 * each row whole (json_row), or with names_only its problem's name. */
static void json_rows_of(const run_pair *cmp, double pct, const ardb_change *kinds, size_t count, int names_only)
{
    int first = 1;
    printf("[");
    for (size_t k = 0; k < count; k++)
        for (size_t i = 0; i < cmp->n; i++)
            if (ardb_diff_classify(&cmp->rows[i], pct) == kinds[k]) {
                if (names_only)
                    printf(first ? "" : ", ");
                else
                    printf(first ? "\n  " : ",\n  ");
                first = 0;
                if (names_only)
                    db_json_string(stdout, cmp->rows[i].problem);
                else
                    json_row(stdout, &cmp->rows[i], kinds[k]);
            }
    printf("%s]", first || names_only ? "" : "\n ");
}

/* Parses diff's or regress's arguments and opens the database *path names
 * read-only: 0, -1 when the arguments are wrong, 1 when the database does
 * not open (each said). */
static int parse_and_open(const cli_spec *spec, int argc, char **argv, const char *const *path, ardb **db)
{
    if (cli_parse(spec, argc, argv) != CLI_PARSED)
        return -1;
    return db_open(*path, ARDB_READONLY, db) ? 1 : 0;
}

/* ---- diff ------------------------------------------------------------------- */

int db_cmd_diff(int argc, char **argv)
{
    const char *path = "attnres.db", *pos[2] = {NULL, NULL};
    int npos = 0, json = 0;
    double pct = ARDB_DEFAULT_THRESHOLD_PCT;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path),
                            CLI_OPT_CUSTOM("--threshold", &pct, parse_threshold),
                            CLI_OPT_FLAG("--json", &json),
                            CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts, .pos = pos, .max_pos = 2, .npos = &npos,
                           .extra = "diff compares two runs: RUN_A RUN_B", .dash_positional = 1,
                           .min_pos = 2,
                           .missing = "usage: attnres db diff RUN_A RUN_B [--db FILE] [--threshold PCT] [--json]"};
    ardb *db;
    const int opened = parse_and_open(&spec, argc, argv, &path, &db);
    if (opened)
        return opened < 0 ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    int64_t a, b;
    if (db_resolve_run(db, pos[0], &a) || db_resolve_run(db, pos[1], &b)) {
        ardb_close(db);
        return CLI_EXIT_USAGE;
    }
    run_pair cmp;
    memset(&cmp, 0, sizeof cmp);
    int code = CLI_EXIT_OK;
    if (load_pair(db, a, b, &cmp)) {
        code = CLI_EXIT_FAIL;
    } else if (json) {
        printf("{\"a\": ");
        db_print_run_json(stdout, &cmp.ra);
        printf(",\n \"b\": ");
        db_print_run_json(stdout, &cmp.rb);
        printf(",\n \"threshold_pct\": %g, \"noise_k\": %g,\n \"problems\": [", pct, ARDB_NOISE_K);
        for (size_t i = 0; i < cmp.n; i++) {
            printf(i ? ",\n  " : "\n  ");
            json_row(stdout, &cmp.rows[i], ardb_diff_classify(&cmp.rows[i], pct));
        }
        printf("%s]}\n", cmp.n ? "\n " : "");
    } else {
        print_run_line("A", &cmp.ra);
        print_run_line("B", &cmp.rb);
        printf("\n%-44s %-32s %11s %-32s %11s %8s %-7s %s\n", "problem", "winner A", "A (us)", "winner B", "B (us)",
               "B/A", "noise", "change");
        for (size_t i = 0; i < cmp.n; i++) {
            const ardb_diff_row *r = &cmp.rows[i];
            char ua[32] = "-", ub[32] = "-", ratio[32] = "-";
            if (r->winner_a)
                snprintf(ua, sizeof ua, "%.2f", r->us_a);
            if (r->winner_b)
                snprintf(ub, sizeof ub, "%.2f", r->us_b);
            if (r->winner_a && r->winner_b && r->us_a > 0)
                snprintf(ratio, sizeof ratio, "%.3f", r->us_b / r->us_a);
            ardb_change c = ardb_diff_classify(r, pct);
            printf("%-44s %-32s %11s %-32s %11s %8s %-7s %s%s%s%s\n", r->problem,
                   r->variant_a ? r->variant_a : "(none)", ua,
                   r->variant_b ? r->variant_b : (r->tried_b ? "(none verified)" : "(not tried)"), ub, ratio,
                   r->winner_a && r->winner_b ? (ardb_diff_beyond_noise(r) ? "beyond" : "within") : "-",
                   ardb_change_name(c), !r->winner_b && r->status_b ? " (" : "",
                   !r->winner_b && r->status_b ? r->status_b : "", !r->winner_b && r->status_b ? ")" : "");
        }
        if (cmp.n == 0)
            printf("(neither run recorded anything to compare)\n");
        printf("\nchange: slower/faster = beyond %g%% and beyond %g x the summed spreads; "
               "noise: |B - A| against %g x (spread A + spread B)\n",
               pct, ARDB_NOISE_K, ARDB_NOISE_K);
    }
    pair_free(&cmp);
    ardb_close(db);
    return code;
}

/* ---- regress ---------------------------------------------------------------- */

/* Why a run cannot be compared, or NULL when it completed. A run that did
 * not finish measured only some problems, and the ones it left out would
 * read as "not in the candidate" (or, in a baseline, hide the regressions
 * of the problems it never reached), so regress refuses it. */
static const char *incomplete(const ardb_run_info *r)
{
    const char *st = r->status ? r->status : "";
    if (strcmp(st, "complete") == 0)
        return NULL;
    if (strcmp(st, "running") == 0)
        return "is still running (or its process was killed and no attnres has opened the database for "
               "writing since, which would mark it interrupted)";
    if (strcmp(st, "interrupted") == 0)
        return "was interrupted: its process ended before the run finished";
    if (strcmp(st, "failed") == 0)
        return "failed before it finished";
    return "has an unknown status";
}

static int refuse_incomplete(const char *role, const ardb_run_info *r)
{
    const char *why = incomplete(r);
    if (!why)
        return 0;
    cli_error("db", "the %s run %" PRId64 " (%s) %s; only complete runs are compared: choose another with --%s "
                    "(see attnres db runs)",
              role, r->id, r->status ? r->status : "?", why, role);
    return -1;
}

int db_cmd_regress(int argc, char **argv)
{
    const char *path = "attnres.db", *base_text = NULL, *cand_text = NULL;
    int json = 0;
    double pct = ARDB_DEFAULT_THRESHOLD_PCT;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path),
                            CLI_OPT_STRING("--baseline", &base_text,
                                           .required = "regress needs --baseline RUN (see attnres db --help)"),
                            CLI_OPT_STRING("--candidate", &cand_text),
                            CLI_OPT_CUSTOM("--threshold", &pct, parse_threshold),
                            CLI_OPT_FLAG("--json", &json),
                            CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts};
    ardb *db;
    if (parse_and_open(&spec, argc, argv, &path, &db))
        return REGRESS_USAGE;
    int64_t a, b;
    run_pair cmp;
    memset(&cmp, 0, sizeof cmp);
    int code = REGRESS_USAGE;
    if (db_resolve_run(db, base_text, &a))
        goto done;
    if (cand_text) {
        if (db_resolve_run(db, cand_text, &b))
            goto done;
    } else {
        if (ardb_run_get(db, a, &cmp.ra) != ARDB_DONE) {
            cli_error("db", "%s", ardb_errmsg(db));
            goto done;
        }
        if (ardb_run_latest_on_device(db, cmp.ra.device_id, a, &b) != ARDB_DONE) {
            cli_error("db", "%s; give --candidate RUN", ardb_errmsg(db));
            goto done;
        }
        ardb_run_info_clear(&cmp.ra);
    }
    if (a == b) {
        cli_error("db", "the baseline and the candidate are the same run (%" PRId64 ")", a);
        goto done;
    }
    if (load_pair(db, a, b, &cmp))
        goto done;
    if (refuse_incomplete("baseline", &cmp.ra) || refuse_incomplete("candidate", &cmp.rb))
        goto done;

    size_t counts[6] = {0}, compared = 0;
    for (size_t i = 0; i < cmp.n; i++) {
        ardb_change c = ardb_diff_classify(&cmp.rows[i], pct);
        counts[c]++;
        compared += cmp.rows[i].winner_a && cmp.rows[i].winner_b;
    }
    size_t regressions = counts[ARDB_CHANGE_SLOWER] + counts[ARDB_CHANGE_LOST];
    if (json) {
        static const ardb_change regressed[] = {ARDB_CHANGE_SLOWER, ARDB_CHANGE_LOST}, faster = ARDB_CHANGE_FASTER,
                                  missing = ARDB_CHANGE_MISSING, added = ARDB_CHANGE_NEW;
        printf("{\"baseline\": ");
        db_print_run_json(stdout, &cmp.ra);
        printf(",\n \"candidate\": ");
        db_print_run_json(stdout, &cmp.rb);
        printf(",\n \"threshold_pct\": %g, \"noise_k\": %g, \"compared\": %zu, \"regressed\": %s,\n", pct,
               ARDB_NOISE_K, compared, regressions ? "true" : "false");
        printf(" \"regressions\": ");
        json_rows_of(&cmp, pct, regressed, 2, 0);
        printf(",\n \"improvements\": ");
        json_rows_of(&cmp, pct, &faster, 1, 0);
        printf(",\n \"missing\": ");
        json_rows_of(&cmp, pct, &missing, 1, 1);
        printf(",\n \"new\": ");
        json_rows_of(&cmp, pct, &added, 1, 1);
        printf("}\n");
    } else {
        print_run_line("baseline", &cmp.ra);
        print_run_line("candidate", &cmp.rb);
        printf("threshold %g%%, noise %g x (spread of baseline + spread of candidate)\n\n", pct, ARDB_NOISE_K);
        for (size_t i = 0; i < cmp.n; i++) {
            const ardb_diff_row *r = &cmp.rows[i];
            ardb_change c = ardb_diff_classify(r, pct);
            if (c == ARDB_CHANGE_SLOWER)
                printf("REGRESSION %-44s %10.2f us -> %10.2f us  x%.3f  (+-%.2f, +-%.2f)  %s -> %s\n", r->problem,
                       r->us_a, r->us_b, r->us_a > 0 ? r->us_b / r->us_a : INFINITY, r->spread_a, r->spread_b,
                       r->variant_a, r->variant_b);
            else if (c == ARDB_CHANGE_LOST)
                printf("LOST       %-44s %10.2f us -> no verified kernel (%s)  %s\n", r->problem, r->us_a,
                       r->status_b ? r->status_b : "no winner", r->variant_a);
        }
        if (regressions)
            printf("\n");
        printf("%zu regression(s): %zu slower beyond %g%% and the noise, %zu lost; %zu faster, %zu unchanged, "
               "%zu not in the candidate, %zu new (%zu compared)\n",
               regressions, counts[ARDB_CHANGE_SLOWER], pct, counts[ARDB_CHANGE_LOST], counts[ARDB_CHANGE_FASTER],
               counts[ARDB_CHANGE_SAME], counts[ARDB_CHANGE_MISSING], counts[ARDB_CHANGE_NEW], compared);
    }
    code = regressions ? REGRESS_FOUND : REGRESS_NONE;
done:
    pair_free(&cmp);
    ardb_close(db);
    return code;
}
