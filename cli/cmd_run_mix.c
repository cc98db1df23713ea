/*
 * cmd_run_mix.c - `attnres run --op mix`: the AttnRes depth mix of N sources.
 */
#include <stdlib.h>

#include "attnres-impl.h"
#include "attnres.h"
#include "cli.h"
#include "cmd_run.h"
#include "convert.h"
#include "npy.h"

int run_mix(const run_opts *o)
{
    mix_inputs in;
    if (run_read_mix_inputs(o, &in))
        return CLI_EXIT_FAIL;
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, in.d, (int32_t)in.n);
    p.heads = (int32_t)o->heads;
    p.form = o->partial ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    p.epilogue = o->normed ? 1 : 0;

    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    const size_t es = attnres_dtype_size(o->dtype);
    const size_t row = (size_t)in.t * (size_t)in.d;
    void *src_store = malloc(row * (size_t)in.n * es + 1), *part_store = NULL;
    void *out_store = malloc(row * es + 1), *normed_store = p.epilogue ? malloc(row * es + 1) : NULL;
    float *query = malloc((size_t)in.d * 4), *out_f = malloc(row * 4 + 4);
    float *normed_f = p.epilogue ? malloc(row * 4 + 4) : NULL;
    const void **srcs = malloc(sizeof(void *) * (size_t)in.n);
    if (!src_store || !out_store || !query || !out_f || !srcs || (p.epilogue && (!normed_store || !normed_f))) {
        cli_error("run", "out of memory for T = %lld, d = %lld, N = %lld", (long long)in.t, (long long)in.d,
                  (long long)in.n);
        goto done;
    }
    convert_to_storage(o->dtype, in.sources.data, src_store, row * (size_t)in.n);
    for (int64_t i = 0; i < in.n; i++)
        srcs[i] = (const char *)src_store + (size_t)i * row * es;
    attnres_fold_query(in.query.data, o->gain ? in.gain.data : NULL, query, in.d);
    if (o->partial) {
        if (!(part_store = malloc(row * es + 1))) {
            cli_error("run", "out of memory");
            goto done;
        }
        convert_to_storage(o->dtype, in.partial.data, part_store, row);
    }
    if (run_open_plan(o, &p, &dev, &db, &plan))
        goto done;
    /* Inputs and outputs live in the device's memory (host memory on the
     * CPU); the kernel only ever sees device pointers. */
    staged st = {.dev = dev};
    const void **dsrcs = malloc(sizeof(void *) * (size_t)in.n);
    void *d_src = run_stage(&st, src_store, row * (size_t)in.n * es);
    float *d_query = run_stage(&st, query, (size_t)in.d * 4);
    void *d_part = part_store ? run_stage(&st, part_store, row * es) : NULL;
    float *d_gain = o->out_gain ? run_stage(&st, in.out_gain.data, (size_t)in.d * 4) : NULL;
    void *d_out = run_stage(&st, NULL, row * es);
    void *d_normed = p.epilogue ? run_stage(&st, NULL, row * es) : NULL;
    if (!dsrcs || st.failed) {
        cli_error("run", "device buffers: %s", st.failed ? attnres_device_errmsg(dev) : "out of memory");
        free(dsrcs);
        run_unstage(&st);
        goto done;
    }
    for (int64_t i = 0; i < in.n; i++)
        dsrcs[i] = (const char *)d_src + (size_t)i * row * es;
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = dsrcs;
    a.query = d_query;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.partial = d_part;
    a.alpha = (float)o->alpha;
    a.out = d_out;
    a.out_gain = d_gain;
    a.out_eps = (float)o->out_eps;
    a.normed = d_normed;
    const int rc = attnres_run_mix(plan, in.t, &a, NULL);
    free(dsrcs);
    run_output outs[] = {{d_out, out_store, row, out_f, {o->out, out_f, 2, {in.t, in.d, 0}}},
                         {d_normed, normed_store, row, normed_f, {o->normed, normed_f, 2, {in.t, in.d, 0}}}};
    exit_code = run_deliver(o, plan, rc, &st, outs, 2);
done:
    run_close_plan(dev, db, plan);
    free(src_store);
    free(part_store);
    free(out_store);
    free(normed_store);
    free(query);
    free(out_f);
    free(normed_f);
    free(srcs);
    run_mix_inputs_free(&in);
    return exit_code;
}
