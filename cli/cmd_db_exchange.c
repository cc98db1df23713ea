/*
 * cmd_db_exchange.c - `attnres db export`, `import` and `merge`: sharing
 * history between databases and with dashboards.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "atomic_file.h"
#include "cli.h"
#include "cmd_db.h"

static int write_file(void *ctx, const void *data, size_t len)
{
    return fwrite(data, 1, len, (FILE *)ctx) == len ? 0 : -1;
}

static void print_stats(const char *what, const ardb_merge_stats *s)
{
    printf("%s: added %" PRId64 " device(s), %" PRId64 " problem(s), %" PRId64 " candidate(s), %" PRId64
           " binary(ies), %" PRId64 " run(s), %" PRId64 " measurement(s), %" PRId64 " winner(s)\n",
           what, s->devices, s->problems, s->candidates, s->binaries, s->runs, s->measurements, s->winners);
}

int db_cmd_export(int argc, char **argv)
{
    const char *path = "attnres.db", *out_path = NULL, *table = NULL;
    int json = 0, csv = 0;
    unsigned flags = 0;
    int no_source = 0;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path),    CLI_OPT_STRING("--out", &out_path),
                            CLI_OPT_STRING("--table", &table), CLI_OPT_FLAG("--json", &json),
                            CLI_OPT_FLAG("--csv", &csv),       CLI_OPT_FLAG("--no-source", &no_source),
                            CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts};
    if (cli_parse(&spec, argc, argv) != CLI_PARSED)
        return CLI_EXIT_USAGE;
    if (no_source)
        flags |= ARDB_EXPORT_NO_SOURCE;
    if (json == csv) {
        cli_error("db", "export needs one of --json or --csv");
        return CLI_EXIT_USAGE;
    }
    ardb_csv_table t = ARDB_CSV_MEASUREMENTS;
    if (table) {
        if (!csv) {
            cli_error("db", "--table goes with --csv (the JSON export holds every table)");
            return CLI_EXIT_USAGE;
        }
        if (strcmp(table, "measurements") == 0)
            t = ARDB_CSV_MEASUREMENTS;
        else if (strcmp(table, "winners") == 0)
            t = ARDB_CSV_WINNERS;
        else if (strcmp(table, "runs") == 0)
            t = ARDB_CSV_RUNS;
        else {
            cli_error("db", "--table is measurements, winners or runs (got '%s')", table);
            return CLI_EXIT_USAGE;
        }
    }
    if (flags && !json) {
        cli_error("db", "--no-source goes with --json");
        return CLI_EXIT_USAGE;
    }
    ardb *db;
    if (db_open(path, ARDB_READONLY, &db))
        return CLI_EXIT_FAIL;
    /* A file is written through a temporary and renamed into place only
     * when the whole export succeeded: a failure (a damaged database, a
     * full disk) leaves an existing file as it was, never truncated. */
    atomic_file file = {0};
    char msg[1024];
    FILE *out = stdout;
    if (out_path && strcmp(out_path, "-") != 0) {
        if (atomic_file_open(&file, out_path, msg, sizeof msg)) {
            cli_error("db", "%s", msg);
            ardb_close(db);
            return CLI_EXIT_FAIL;
        }
        out = file.f;
    }
    int rc = json ? ardb_export_json(db, flags, write_file, out) : ardb_export_csv(db, t, write_file, out);
    if (rc != ARDB_DONE)
        cli_error("db", "%s", ardb_errmsg(db));
    if (out == stdout) {
        if (fflush(out) != 0 && rc == ARDB_DONE) {
            cli_error("db", "writing standard output failed");
            rc = ARDB_ESQL;
        }
    } else if (rc == ARDB_DONE &&
               (atomic_file_close(&file, msg, sizeof msg) || atomic_file_commit(&file, msg, sizeof msg))) {
        cli_error("db", "%s", msg);
        rc = ARDB_ESQL;
    }
    atomic_file_discard(&file);
    ardb_close(db);
    return rc == ARDB_DONE ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

/* Reads a whole file (or standard input for "-"); NULL with a message. */
static char *read_all(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    if (!f) {
        cli_error("db", "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    for (;;) {
        if (n + 65536 + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                cli_error("db", "%s is too large to read", path);
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap = ncap;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                cli_error("db", "reading %s failed", path);
                free(buf);
                buf = NULL;
            }
            break;
        }
    }
    if (f != stdin)
        fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

int db_cmd_import(int argc, char **argv)
{
    const char *path = "attnres.db", *in = NULL;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path), CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts, .pos = &in, .max_pos = 1,
                           .extra = "import takes one file", .dash_positional = 1, .min_pos = 1,
                           .missing = "usage: attnres db import FILE.json [--db FILE]"};
    if (cli_parse(&spec, argc, argv) != CLI_PARSED)
        return CLI_EXIT_USAGE;
    size_t len = 0;
    char *text = read_all(in, &len);
    if (!text)
        return CLI_EXIT_FAIL;
    ardb *db;
    if (db_open(path, ARDB_CREATE, &db)) {
        free(text);
        return CLI_EXIT_FAIL;
    }
    ardb_merge_stats s;
    int rc = ardb_import_json(db, text, len, &s);
    free(text);
    if (rc != ARDB_DONE)
        cli_error("db", "%s: %s", in, ardb_errmsg(db));
    else
        print_stats(in, &s);
    ardb_close(db);
    return rc == ARDB_DONE ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

int db_cmd_merge(int argc, char **argv)
{
    const char *path = "attnres.db", *src = NULL;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path), CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts, .pos = &src, .max_pos = 1,
                           .extra = "merge takes one source database (run it once per file)",
                           .dash_positional = 1, .min_pos = 1,
                           .missing = "usage: attnres db merge SRC.db [--db FILE]"};
    if (cli_parse(&spec, argc, argv) != CLI_PARSED)
        return CLI_EXIT_USAGE;
    ardb *db;
    if (db_open(path, ARDB_CREATE, &db))
        return CLI_EXIT_FAIL;
    ardb_merge_stats s;
    int rc = ardb_merge(db, src, &s);
    if (rc != ARDB_DONE)
        cli_error("db", "%s", ardb_errmsg(db));
    else
        print_stats(src, &s);
    ardb_close(db);
    return rc == ARDB_DONE ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
