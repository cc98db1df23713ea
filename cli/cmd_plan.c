/* cmd_plan.c - `attnres plan --explain`: what the runtime would load for a
 * problem of any op on a device, and which fallback level it reached. */
#include <stdio.h>
#include <string.h>

#include "attnres.h"
#include "cli.h"
#include "problems.h"

static const char plan_usage[] =
    "usage: attnres plan [--device cpu|cuda:N] [--db FILE] [--op OP] --dtype f32|bf16|f16\n"
    "                    --d D --n N [--heads H] [--additive] [--epilogue] [--s S]\n"
    "                    [--fuse-add] [--tokens T] [--require-exact] [--explain]\n"
    "\n"
    "  OP is mix (the default), phase1, phase2, mix_backward, phase1_backward or\n"
    "  phase2_backward, with the fields of a problems file line (docs/problems.md):\n"
    "  --s S is the sites of phase1 and its backward, and required there; --fuse-add\n"
    "  is the fused add of phase2 and its backward, which take --n 1. For the\n"
    "  backwards the explanation ends with the workspace a run of up to T tokens\n"
    "  needs (default 4096), which the caller allocates once at load.\n";

int cmd_plan(int argc, char **argv)
{
    const char *device = NULL, *dbpath = NULL;
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 0, 0);
    unsigned flags = 0;
    /* Each of d, N and H is checked against its own range before it is
     * stored, so a 64-bit value never lands truncated in the 32-bit fields
     * of the problem. */
    int64_t d = p.d, n = p.n, heads = p.heads, s = 0, tokens = 4096;
    int additive = 0, epilogue = 0, fuse_add = 0, require_exact = 0, explain = 0;
    const cli_opt opts[] = {CLI_OPT_STRING("--device", &device),
                            CLI_OPT_STRING("--db", &dbpath),
                            CLI_OPT_CUSTOM("--op", &p.op, cli_parse_op),
                            CLI_OPT_CUSTOM("--dtype", &p.dtype, cli_parse_dtype),
                            CLI_OPT_INT64("--d", &d, 1, PROBLEM_MAX_D),
                            CLI_OPT_INT64("--n", &n, 1, PROBLEM_MAX_N),
                            CLI_OPT_INT64("--heads", &heads, 1, PROBLEM_MAX_HEADS),
                            CLI_OPT_FLAG("--additive", &additive),
                            CLI_OPT_FLAG("--epilogue", &epilogue),
                            CLI_OPT_INT64("--s", &s, 1, PROBLEM_MAX_S),
                            CLI_OPT_FLAG("--fuse-add", &fuse_add),
                            CLI_OPT_INT64("--tokens", &tokens, 1, PROBLEM_MAX_T),
                            CLI_OPT_FLAG("--require-exact", &require_exact),
                            CLI_OPT_FLAG("--explain", &explain), /* what plan always does */
                            CLI_OPT_END};
    const cli_spec args = {.cmd = "plan", .usage = plan_usage, .opts = opts};
    int rc = cli_parse(&args, argc, argv);
    if (rc != CLI_PARSED)
        return rc == CLI_HELP ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    p.d = d;
    p.n = (int32_t)n;
    p.heads = (int32_t)heads;
    if (additive)
        p.form = ATTNRES_FORM_ADDITIVE;
    if (epilogue)
        p.epilogue = 1;
    /* Whether S and the fused add fit the op is attnres_problem_check's to
     * say, below, with the runtime's own message. */
    p.s = (int32_t)s;
    p.fuse_add = fuse_add;
    if (require_exact)
        flags |= ATTNRES_PLAN_REQUIRE_EXACT;
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
    /* A backward's sums over tokens go through a workspace that grows
     * with T; an engine sizes it at load, so the plan says how large. */
    if (p.op == ATTNRES_OP_MIX_BACKWARD || p.op == ATTNRES_OP_PHASE1_BACKWARD || p.op == ATTNRES_OP_PHASE2_BACKWARD) {
        size_t bytes = 0;
        const int mix = p.op == ATTNRES_OP_MIX_BACKWARD;
        int st = mix ? attnres_mix_backward_workspace_size(plan, tokens, &bytes)
                     : attnres_plan_workspace_size(plan, tokens, &bytes);
        if (st != ATTNRES_OK) {
            cli_error("plan", "%s: %s", attnres_errstr(st), attnres_plan_errmsg(plan));
            goto done;
        }
        printf("workspace: %zu bytes for up to %lld tokens (%s)\n", bytes, (long long)tokens,
               mix ? "attnres_mix_backward_workspace_size" : "attnres_plan_workspace_size");
    }
    code = CLI_EXIT_OK;
done:
    attnres_plan_destroy(plan);
    attnres_db_close(db);
    attnres_device_close(dev);
    return code;
}
