/*
 * cmd_db.c - `attnres db`: the tuning database as history. This file holds
 * the dispatcher, the listings (show, runs) and notes; comparisons are in
 * cmd_db_compare.c, export/import/merge in cmd_db_exchange.c, pictures in
 * cmd_db_plot.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "cli.h"
#include "cmd_db.h"
#include "revalidate.h"

static const char db_usage[] =
    "usage: attnres db show [--db FILE] [--run RUN]\n"
    "       attnres db runs [--db FILE] [--long | --json]\n"
    "       attnres db diff RUN_A RUN_B [--db FILE] [--threshold PCT] [--json]\n"
    "       attnres db regress --baseline RUN [--candidate RUN] [--threshold PCT] [--json] [--db FILE]\n"
    "       attnres db export --json|--csv [--table measurements|winners|runs] [--no-source]\n"
    "                         [--out FILE] [--db FILE]\n"
    "       attnres db import FILE.json [--db FILE]\n"
    "       attnres db merge SRC.db [--db FILE]\n"
    "       attnres db plot --out DIR [--runs N] [--db FILE]\n"
    "       attnres db note RUN TEXT [--db FILE]\n"
    "       attnres db revalidate [--device SPEC] [--db FILE] [--retries N] [--quiet]\n"
    "\n"
    "  show        the newest winner of every problem on every device (or of one run);\n"
    "              a provisional one (its final round disturbed on every try) says so,\n"
    "              with the evidence\n"
    "  runs        every run, oldest first: when, who, versions, device, policy, note\n"
    "  diff        per problem, each run's winner and time, the ratio B/A, and whether\n"
    "              the difference is beyond the noise of both runs\n"
    "  regress     exit 0 when no problem of the candidate run (default: the newest\n"
    "              run after the baseline on its device) got slower than the baseline\n"
    "              beyond PCT percent (default 5) and the noise, 1 when one did (listed),\n"
    "              2 on usage errors or when the runs cannot be compared (a run that\n"
    "              is still running, was interrupted or failed is not compared)\n"
    "  export      the history as JSON (for import elsewhere) or CSV (for dashboards)\n"
    "  import      a JSON export, without duplicates (FILE - reads standard input)\n"
    "  merge       another database file, without duplicates (e.g. tuning shards)\n"
    "  plot        SVG charts into DIR: each problem's winner latency across runs, and\n"
    "              % of ceiling by problem for the last N runs (default 8)\n"
    "  note        label a run (e.g. \"driver 560.35\"); shown by runs, diff and regress\n"
    "  revalidate  the same as `attnres tune --revalidate`: re-measure the stored\n"
    "              winners only (and decide provisional ones again), as a new run\n"
    "              that regress can compare\n"
    "\n"
    "  RUN is an id, 'latest', 'latest~K' (K runs before the newest) or the start of\n"
    "  a run's uid. Noise: |B - A| > 3 x (spread A + spread B), spread being each\n"
    "  measurement's median absolute deviation. FILE defaults to attnres.db.\n";

/* ---- shared helpers ------------------------------------------------------ */

int db_open(const char *path, unsigned flags, ardb **db)
{
    char msg[1024];
    if (ardb_open(path, flags, db, msg, sizeof msg) != ARDB_DONE) {
        cli_error("db", "%s", msg);
        return -1;
    }
    return 0;
}

int db_resolve_run(ardb *db, const char *text, int64_t *run_id)
{
    if (ardb_run_resolve(db, text, run_id) != ARDB_DONE) {
        cli_error("db", "%s", ardb_errmsg(db));
        return -1;
    }
    return 0;
}

static int write_stream(void *ctx, const void *data, size_t len)
{
    return fwrite(data, 1, len, (FILE *)ctx) == len ? 0 : -1;
}

void db_json_string(FILE *out, const char *s)
{
    /* Through the database layer's writer, which escapes what JSON needs
     * and replaces bytes that are not UTF-8 (a database can hold any), so
     * that the output is always JSON; a write error shows in ferror. */
    if (!s)
        fputs("null", out);
    else
        (void)ardb_json_string(write_stream, out, s, strlen(s));
}

void db_json_number(FILE *out, double v)
{
    if (isfinite(v))
        fprintf(out, "%.17g", v);
    else
        fputs("null", out);
}

void db_json_string_member(FILE *out, const char *key, const char *s)
{
    fprintf(out, ", \"%s\": ", key);
    db_json_string(out, s);
}

void db_json_number_member(FILE *out, const char *key, double v)
{
    fprintf(out, ", \"%s\": ", key);
    db_json_number(out, v);
}

void db_run_label(const ardb_run_info *r, char *buf, size_t len)
{
    char when[20] = "?";
    if (r->started_at) {
        snprintf(when, sizeof when, "%.19s", r->started_at);
        if (strlen(when) > 10)
            when[10] = ' ';
    }
    snprintf(buf, len, "run %" PRId64 " (%s, %s)", r->id, r->strategy ? r->strategy : "?", when);
}

/* ---- show ------------------------------------------------------------------- */

typedef struct table_ctx {
    int printed_header;
    const int *widths;
    size_t provisional; /* rows whose provisional column is set */
} table_ctx;

static int print_row(void *ctxp, int ncol, const char *const *names, const char *const *values)
{
    table_ctx *ctx = ctxp;
    if (!ctx->printed_header) {
        for (int i = 0; i < ncol; i++)
            printf("%-*s ", ctx->widths[i < 8 ? i : 7], names[i]);
        printf("\n");
        ctx->printed_header = 1;
    }
    for (int i = 0; i < ncol; i++) {
        printf("%-*s ", ctx->widths[i < 8 ? i : 7], values[i] ? values[i] : "");
        if (strcmp(names[i], "provisional") == 0 && values[i] && values[i][0])
            ctx->provisional++;
    }
    printf("\n");
    return 0;
}

static int cmd_show(int argc, char **argv)
{
    const char *path = "attnres.db", *run_text = NULL;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path), CLI_OPT_STRING("--run", &run_text), CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts};
    if (cli_parse(&spec, argc, argv) != CLI_PARSED)
        return CLI_EXIT_USAGE;
    ardb *db;
    int64_t run = 0;
    if (db_open(path, ARDB_READONLY, &db))
        return CLI_EXIT_FAIL;
    if (run_text && db_resolve_run(db, run_text, &run)) {
        ardb_close(db);
        return CLI_EXIT_USAGE;
    }
    /* The last column, provisional, holds the evidence: no padding. */
    static const int widths[8] = {44, 24, 34, 12, 9, 9, 0, 0};
    table_ctx ctx = {0, widths, 0};
    int rc = ardb_list_winners(db, run, print_row, &ctx);
    if (rc != ARDB_DONE)
        cli_error("db", "%s", ardb_errmsg(db));
    else if (!ctx.printed_header)
        printf("(no winners recorded in %s)\n", path);
    else if (ctx.provisional)
        printf("\n%zu provisional winner(s): chosen by a final round that other work on the machine disturbed on "
               "every try, so the choice may be the noise's; `attnres tune --revalidate` on a quiet machine decides "
               "again (docs/tuning.md, \"Disturbance\")\n",
               ctx.provisional);
    ardb_close(db);
    return rc == ARDB_DONE ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

/* ---- runs ------------------------------------------------------------------- */

static const char *or_dash(const char *s) { return s && *s ? s : "-"; }

static void print_runs_table(const ardb_run_info *r, size_t n)
{
    printf("%-5s %-19s %-9s %-10s %-26s %-8s %-12s %-24s %-7s %-7s %s\n", "id", "started (UTC)", "status",
           "strategy", "device", "version", "templates", "compiler", "winners", "meas.", "note");
    for (size_t i = 0; i < n; i++) {
        char when[20] = "-", dev[27], comp[25], tmpl[13];
        if (r[i].started_at) {
            snprintf(when, sizeof when, "%.19s", r[i].started_at);
            if (strlen(when) > 10)
                when[10] = ' ';
        }
        /* A simulated device says so, even where its name is cut short. */
        if (r[i].device_simulated)
            snprintf(dev, sizeof dev, "%.14s (simulated)", or_dash(r[i].device_name));
        else
            snprintf(dev, sizeof dev, "%s", or_dash(r[i].device_name));
        snprintf(comp, sizeof comp, "%s", or_dash(r[i].compiler));
        snprintf(tmpl, sizeof tmpl, "%s", or_dash(r[i].templates_hash));
        printf("%-5" PRId64 " %-19s %-9s %-10s %-26s %-8s %-12s %-24s %-7" PRId64 " %-7" PRId64 " %s\n", r[i].id, when,
               or_dash(r[i].status), or_dash(r[i].strategy), dev, or_dash(r[i].project_version), tmpl, comp,
               r[i].winners, r[i].measurements, r[i].note ? r[i].note : "");
    }
}

static void print_runs_long(const ardb_run_info *r, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        printf("run %" PRId64 "%s%s\n", r[i].id, r[i].note ? ": " : "", r[i].note ? r[i].note : "");
        printf("  uid          %s\n", or_dash(r[i].uid));
        printf("  started      %s\n  finished     %s (%s)\n", or_dash(r[i].started_at), or_dash(r[i].finished_at),
               or_dash(r[i].status));
        printf("  by           %s@%s\n  command      %s\n", or_dash(r[i].user), or_dash(r[i].host),
               or_dash(r[i].command));
        printf("  attnres      %s, templates %s\n", or_dash(r[i].project_version), or_dash(r[i].templates_hash));
        printf("  compiler     %s\n  driver       %s\n", or_dash(r[i].compiler), or_dash(r[i].driver));
        printf("  device       %s (%s, %s%s)\n  fingerprint  %s\n", or_dash(r[i].device_name),
               or_dash(r[i].device_backend), or_dash(r[i].device_arch),
               r[i].device_simulated ? ", simulated: model timings, never used for hardware" : "",
               or_dash(r[i].device_fingerprint));
        printf("  strategy     %s\n  policy       %s\n", or_dash(r[i].strategy), or_dash(r[i].policy_json));
        char read[48] = "read not measured";
        if (!isnan(r[i].read_gbps))
            snprintf(read, sizeof read, "%.1f GB/s read", r[i].read_gbps);
        printf("  ceilings     %.1f GB/s copy, %s, %.2f us empty launch\n", r[i].copy_gbps, read, r[i].launch_us);
        if (r[i].ceilings)
            printf("  ceilings     %s\n", r[i].ceilings);
        if (r[i].stages)
            printf("  stages       %s\n", r[i].stages);
        printf("  recorded     %" PRId64 " measurement(s), %" PRId64 " winner(s)\n\n", r[i].measurements,
               r[i].winners);
    }
}

void db_print_run_json(FILE *out, const ardb_run_info *r)
{
    struct {
        const char *k, *v;
    } s[] = {{"uid", r->uid},
             {"note", r->note},
             {"started_at", r->started_at},
             {"finished_at", r->finished_at},
             {"status", r->status},
             {"user", r->user},
             {"host", r->host},
             {"command", r->command},
             {"project_version", r->project_version},
             {"templates_hash", r->templates_hash},
             {"compiler", r->compiler},
             {"driver", r->driver},
             {"strategy", r->strategy},
             {"policy_json", r->policy_json},
             {"device", r->device_name},
             {"device_fingerprint", r->device_fingerprint},
             {"ceilings", r->ceilings},
             {"stages", r->stages}};
    fprintf(out, "{\"id\": %" PRId64, r->id);
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        fprintf(out, ", \"%s\": ", s[i].k);
        db_json_string(out, s[i].v);
    }
    db_json_number_member(out, "copy_gbps", r->copy_gbps);
    db_json_number_member(out, "read_gbps", r->read_gbps);
    db_json_number_member(out, "launch_us", r->launch_us);
    fprintf(out, ", \"device_simulated\": %s", r->device_simulated ? "true" : "false");
    fprintf(out, ", \"measurements\": %" PRId64 ", \"winners\": %" PRId64 "}", r->measurements, r->winners);
}

static int cmd_runs(int argc, char **argv)
{
    const char *path = "attnres.db";
    int json = 0, lng = 0;
    const cli_opt opts[] = {
        CLI_OPT_STRING("--db", &path), CLI_OPT_FLAG("--json", &json), CLI_OPT_FLAG("--long", &lng), CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts};
    if (cli_parse(&spec, argc, argv) != CLI_PARSED)
        return CLI_EXIT_USAGE;
    ardb *db;
    ardb_run_info *runs = NULL;
    size_t n = 0;
    if (db_open(path, ARDB_READONLY, &db))
        return CLI_EXIT_FAIL;
    if (ardb_run_list(db, &runs, &n) != ARDB_DONE) {
        cli_error("db", "%s", ardb_errmsg(db));
        ardb_close(db);
        return CLI_EXIT_FAIL;
    }
    if (json) {
        printf("[");
        for (size_t i = 0; i < n; i++) {
            printf(i ? ",\n " : "\n ");
            db_print_run_json(stdout, &runs[i]);
        }
        printf("%s]\n", n ? "\n" : "");
    } else if (n == 0) {
        printf("(no runs recorded in %s)\n", path);
    } else if (lng) {
        print_runs_long(runs, n);
    } else {
        print_runs_table(runs, n);
    }
    ardb_run_infos_free(runs, n);
    ardb_close(db);
    return CLI_EXIT_OK;
}

/* ---- note ------------------------------------------------------------------- */

static int cmd_note(int argc, char **argv)
{
    const char *path = "attnres.db", *pos[2] = {NULL, NULL};
    int npos = 0;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path), CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts, .pos = pos, .max_pos = 2, .npos = &npos,
                           .extra = "note takes RUN and one TEXT (quote it)", .dash_positional = 1,
                           .min_pos = 2, .missing = "usage: attnres db note RUN TEXT [--db FILE]"};
    if (cli_parse(&spec, argc, argv) != CLI_PARSED)
        return CLI_EXIT_USAGE;
    ardb *db;
    int64_t run;
    if (db_open(path, 0, &db))
        return CLI_EXIT_FAIL;
    if (db_resolve_run(db, pos[0], &run)) {
        ardb_close(db);
        return CLI_EXIT_USAGE;
    }
    int rc = ardb_run_set_note(db, run, pos[1][0] ? pos[1] : NULL);
    if (rc != ARDB_DONE)
        cli_error("db", "%s", ardb_errmsg(db));
    ardb_close(db);
    return rc == ARDB_DONE ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

/* ---- revalidate ------------------------------------------------------------ */

static int cmd_revalidate(int argc, char **argv)
{
    const char *path = "attnres.db", *device = NULL;
    int quiet = 0, retries = 0;
    if (tune_retries_default(&retries))
        return CLI_EXIT_USAGE;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path), CLI_OPT_STRING("--device", &device),
                            CLI_OPT_FLAG("--quiet", &quiet), CLI_OPT_INT("--retries", &retries, 0, 10),
                            CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts};
    if (cli_parse(&spec, argc, argv) != CLI_PARSED)
        return CLI_EXIT_USAGE;
    return tune_revalidate(device ? device : cli_best_device(), path, quiet, retries);
}

/* ---- dispatch --------------------------------------------------------------- */

typedef struct subcommand {
    const char *name;
    int (*fn)(int argc, char **argv);
} subcommand;

static const subcommand subcommands[] = {
    {"show", cmd_show},          {"runs", cmd_runs},     {"diff", db_cmd_diff},
    {"regress", db_cmd_regress}, {"export", db_cmd_export}, {"import", db_cmd_import},
    {"merge", db_cmd_merge},     {"plot", db_cmd_plot},  {"note", cmd_note},
    {"revalidate", cmd_revalidate},
};

int cmd_db(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(db_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(db_usage, stdout);
            return CLI_EXIT_OK;
        }
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (strcmp(argv[1], subcommands[i].name) == 0)
            return subcommands[i].fn(argc - 1, argv + 1);
    cli_error("db", "unknown subcommand '%s' (see attnres db --help)", argv[1]);
    return CLI_EXIT_USAGE;
}
