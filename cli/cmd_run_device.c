/*
 * cmd_run_device.c - the device side of `attnres run`: buffers staged in the
 * device's memory, the device, database and plan opened and closed, and the
 * problem checked before anything large is allocated for it.
 */
#include "attnres-impl.h"
#include "attnres.h"
#include "cli.h"
#include "cmd_run.h"
#include "convert.h"

/* Allocates bytes on the device and copies host data there (if any). */
void *run_stage(staged *st, const void *host, size_t bytes)
{
    void *d = NULL;
    if (st->failed || st->count == RUN_MAX_STAGED ||
        st->dev->ops->mem_alloc(st->dev, bytes ? bytes : 4, &d) != ATTNRES_OK) {
        st->failed = 1;
        return NULL;
    }
    st->ptr[st->count++] = d;
    if (host && st->dev->ops->copy_to_device(st->dev, d, host, bytes) != ATTNRES_OK)
        st->failed = 1;
    return d;
}

void run_unstage(staged *st)
{
    for (int i = 0; i < st->count; i++)
        st->dev->ops->mem_free(st->dev, st->ptr[i]);
    st->count = 0;
}

int run_fetch(const run_opts *o, attnres_plan *plan, int rc, staged *st, run_output *outs, int count)
{
    attnres_device *dev = st->dev;
    const size_t es = attnres_dtype_size(o->dtype);
    if (rc)
        cli_error("run", "%s: %s", attnres_errstr(rc), attnres_plan_errmsg(plan));
    for (int i = 0; !rc && i < count; i++)
        if (outs[i].device && dev->ops->copy_to_host(dev, outs[i].host, outs[i].device,
                                                     outs[i].count * (outs[i].f ? es : 4)) != ATTNRES_OK) {
            cli_error("run", "copying the outputs back: %s", attnres_device_errmsg(dev));
            rc = -1;
        }
    run_unstage(st);
    if (rc)
        return -1;
    for (int i = 0; i < count; i++)
        if (outs[i].device && outs[i].f)
            convert_from_storage(o->dtype, outs[i].host, outs[i].f, outs[i].count);
    return 0;
}

int run_deliver(const run_opts *o, attnres_plan *plan, int rc, staged *st, run_output *outs, int count)
{
    if (count > RUN_MAX_OUTPUTS || run_fetch(o, plan, rc, st, outs, count))
        return CLI_EXIT_FAIL;
    out_file files[RUN_MAX_OUTPUTS];
    for (int i = 0; i < count; i++)
        files[i] = outs[i].file;
    return run_write_outputs(files, count) ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* Opens the device, the database if any, and plans p. On failure the
 * caller closes whatever was opened. */
int run_open_plan(const run_opts *o, const attnres_problem *p, attnres_device **dev, attnres_db **db,
                  attnres_plan **plan)
{
    char msg[1024];
    *dev = NULL;
    *db = NULL;
    *plan = NULL;
    const char *spec = o->device ? o->device : cli_best_device();
    if (attnres_device_open(spec, dev, msg, sizeof msg)) {
        cli_error("run", "cannot open device %s: %s", spec, msg);
        return -1;
    }
    if (o->db && attnres_db_open(o->db, db, msg, sizeof msg)) {
        cli_error("run", "%s", msg);
        return -1;
    }
    if (attnres_plan_create(*dev, *db, p, o->require_exact ? ATTNRES_PLAN_REQUIRE_EXACT : 0, plan, msg,
                            sizeof msg)) {
        cli_error("run", "cannot plan the problem: %s", msg);
        return -1;
    }
    return 0;
}

void run_close_plan(attnres_device *dev, attnres_db *db, attnres_plan *plan)
{
    attnres_plan_destroy(plan);
    attnres_db_close(db);
    attnres_device_close(dev);
}

/* Checks p before anything large is allocated for it. */
int run_check_problem(const attnres_problem *p)
{
    char msg[512];
    if (attnres_problem_check(p, msg, sizeof msg) != ATTNRES_OK) {
        cli_error("run", "%s", msg);
        return -1;
    }
    return 0;
}
