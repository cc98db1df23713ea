/* cmd_db.c - `attnres db`: reading a tuning database. */
#include <stdio.h>
#include <string.h>

#include "ardb.h"
#include "cli.h"

static const char db_usage[] =
    "usage: attnres db show [--db FILE] [--run ID]\n"
    "       attnres db runs [--db FILE]\n"
    "\n"
    "  show   the newest winner of every problem on every device (or of one run)\n"
    "  runs   every tuning run, oldest first\n"
    "  FILE defaults to attnres.db.\n";

typedef struct table_ctx {
    int printed_header;
    const int *widths;
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
    for (int i = 0; i < ncol; i++)
        printf("%-*s ", ctx->widths[i < 8 ? i : 7], values[i] ? values[i] : "");
    printf("\n");
    return 0;
}

int cmd_db(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        fputs(db_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    const char *sub = argv[1], *path = "attnres.db";
    int64_t run = 0;
    for (int i = 2; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--help") == 0) {
            fputs(db_usage, stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(argv[i], "--db") == 0) {
            if (!(path = cli_value("db", argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (strcmp(argv[i], "--run") == 0 && strcmp(sub, "show") == 0) {
            if (!(v = cli_value("db", argc, argv, &i)) || cli_parse_int("db", "--run", v, &run))
                return CLI_EXIT_USAGE;
        } else {
            cli_error("db", "unknown option '%s' (see attnres db --help)", argv[i]);
            return CLI_EXIT_USAGE;
        }
    }
    if (strcmp(sub, "show") != 0 && strcmp(sub, "runs") != 0) {
        cli_error("db", "unknown subcommand '%s' (see attnres db --help)", sub);
        return CLI_EXIT_USAGE;
    }
    char msg[1024];
    ardb *db;
    if (ardb_open(path, ARDB_READONLY, &db, msg, sizeof msg) != ARDB_DONE) {
        cli_error("db", "%s", msg);
        return CLI_EXIT_FAIL;
    }
    static const int show_widths[8] = {44, 24, 34, 12, 9, 9, 9, 9};
    static const int run_widths[8] = {5, 25, 25, 10, 24, 11, 8, 10};
    table_ctx ctx = {0, strcmp(sub, "show") == 0 ? show_widths : run_widths};
    int rc = strcmp(sub, "show") == 0 ? ardb_list_winners(db, run, print_row, &ctx)
                                      : ardb_list_runs(db, print_row, &ctx);
    if (rc != ARDB_DONE)
        cli_error("db", "%s", ardb_errmsg(db));
    else if (!ctx.printed_header)
        printf("(no %s recorded in %s)\n", strcmp(sub, "show") == 0 ? "winners" : "runs", path);
    ardb_close(db);
    return rc == ARDB_DONE ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
