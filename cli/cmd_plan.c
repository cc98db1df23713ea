/* cmd_plan.c - `attnres plan --explain`: what the runtime would load for a
 * problem on a device, and which fallback level it reached. */
#include <stdio.h>
#include <string.h>

#include "attnres.h"
#include "cli.h"
#include "problems.h"

static const char plan_usage[] =
    "usage: attnres plan [--device cpu|cuda:N] [--db FILE] --dtype f32|bf16|f16 --d D --n N\n"
    "                    [--heads H] [--additive] [--epilogue] [--require-exact] [--explain]\n";

int cmd_plan(int argc, char **argv)
{
    const char *device = NULL, *dbpath = NULL, *v;
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 0, 0);
    unsigned flags = 0;
    int64_t x;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(plan_usage, stdout);
            return CLI_EXIT_OK;
        } else if (strcmp(a, "--device") == 0) {
            if (!(device = cli_value("plan", argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (strcmp(a, "--db") == 0) {
            if (!(dbpath = cli_value("plan", argc, argv, &i)))
                return CLI_EXIT_USAGE;
        } else if (strcmp(a, "--dtype") == 0) {
            if (!(v = cli_value("plan", argc, argv, &i)))
                return CLI_EXIT_USAGE;
            if (attnres_dtype_parse(v, &p.dtype)) {
                cli_error("plan", "--dtype must be f32, bf16 or f16 (got '%s')", v);
                return CLI_EXIT_USAGE;
            }
        } else if (strcmp(a, "--d") == 0 || strcmp(a, "--n") == 0 || strcmp(a, "--heads") == 0) {
            /* Each value is checked against its own range before it is
             * stored, so a 64-bit value never lands truncated in the 32-bit
             * fields of the problem. */
            int64_t max = strcmp(a, "--d") == 0 ? PROBLEM_MAX_D : strcmp(a, "--n") == 0 ? PROBLEM_MAX_N
                                                                                          : PROBLEM_MAX_HEADS;
            if (!(v = cli_value("plan", argc, argv, &i)) || cli_parse_int_range("plan", a, v, 1, max, &x))
                return CLI_EXIT_USAGE;
            if (strcmp(a, "--d") == 0)
                p.d = x;
            else if (strcmp(a, "--n") == 0)
                p.n = (int32_t)x;
            else
                p.heads = (int32_t)x;
        } else if (strcmp(a, "--additive") == 0) {
            p.form = ATTNRES_FORM_ADDITIVE;
        } else if (strcmp(a, "--epilogue") == 0) {
            p.epilogue = 1;
        } else if (strcmp(a, "--require-exact") == 0) {
            flags |= ATTNRES_PLAN_REQUIRE_EXACT;
        } else if (strcmp(a, "--explain") != 0) {
            cli_error("plan", "unknown option '%s' (see attnres plan --help)", a);
            return CLI_EXIT_USAGE;
        }
    }
    char msg[1024];
    if (attnres_problem_check(&p, msg, sizeof msg)) {
        cli_error("plan", "%s", msg);
        return CLI_EXIT_USAGE;
    }
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    int code = CLI_EXIT_FAIL;
    const char *spec = device ? device : cli_best_device();
    if (attnres_device_open(spec, &dev, msg, sizeof msg)) {
        cli_error("plan", "cannot open device %s: %s", spec, msg);
        goto done;
    }
    if (dbpath && attnres_db_open(dbpath, &db, msg, sizeof msg)) {
        cli_error("plan", "%s", msg);
        goto done;
    }
    if (attnres_plan_create(dev, db, &p, flags, &plan, msg, sizeof msg)) {
        cli_error("plan", "%s", msg);
        goto done;
    }
    char text[8192];
    attnres_plan_explain(plan, text, sizeof text);
    fputs(text, stdout);
    code = CLI_EXIT_OK;
done:
    attnres_plan_destroy(plan);
    attnres_db_close(db);
    attnres_device_close(dev);
    return code;
}
