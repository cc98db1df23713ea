/*
 * cmd_run_backward.c - `attnres run --op mix_backward`: the gradients of the
 * depth mix (DESIGN §1b) from the forward's inputs and the gradient of out.
 *
 * The gradient of the folded query u that the runtime returns is turned
 * into those of the files the user gave: W (and G), through u = G ⊙ W.
 *
 * With --out-gain the problem has the output-norm epilogue: the runtime
 * reads the forward's out (--out, an input here) and the gradient of normed
 * (--dnormed), and writes the gradient of out_gain (--dout-gain).
 */
#include <stdlib.h>
#include <string.h>

#include "attnres-impl.h"
#include "attnres.h"
#include "cli.h"
#include "cmd_run.h"
#include "convert.h"
#include "npy.h"

/* Host buffers of one run; freed together. */
typedef struct bw_host {
    void *src, *dout, *dsrc, *dpartial, *out, *dnormed;
    float *u, *du, *dsrc_f, *dpartial_f, *dquery, *dgain, *dout_gain;
    const void **srcs;
    void **dsrcs;
    npy_array out_f, dnormed_f; /* the epilogue's inputs as read */
} bw_host;

static void free_each(void *const *bufs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
}

static void bw_host_free(bw_host *h)
{
    void *const bufs[] = {h->src, h->dout, h->dsrc, h->dpartial, h->out, h->dnormed, h->u, h->du,
                          h->dsrc_f, h->dpartial_f, h->dquery, h->dgain, h->dout_gain, h->srcs, h->dsrcs};
    free_each(bufs, sizeof bufs / sizeof bufs[0]);
    npy_free(&h->out_f);
    npy_free(&h->dnormed_f);
}

/* Reads the epilogue's (T, d) inputs: the forward's out and the gradient of
 * normed. */
static int read_epilogue(const run_opts *o, const mix_inputs *in, bw_host *h)
{
    const int64_t td[2] = {in->t, in->d};
    if (run_read_shaped("--out", o->out, 2, td, "T, d", "to match the sources (the forward's out)", &h->out_f))
        return -1;
    return run_read_shaped("--dnormed", o->dnormed, 2, td, "T, d", "to match the sources", &h->dnormed_f);
}

int run_mix_backward(const run_opts *o)
{
    mix_inputs in;
    bw_host h;
    memset(&h, 0, sizeof h);
    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    if (run_read_mix_inputs(o, &in))
        goto done;
    const int epilogue = o->out_gain != NULL;
    if (epilogue && read_epilogue(o, &in, &h))
        goto done;
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, in.d, (int32_t)in.n);
    p.op = ATTNRES_OP_MIX_BACKWARD;
    p.heads = (int32_t)o->heads;
    /* The additive form's gradients do not depend on partial's values
     * (DESIGN §1b, step 2: d(partial) = G, d(alpha) = <G, mix>), so the
     * file only selects that form; its shape is checked all the same, as
     * it is the forward's input. */
    p.form = o->partial ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    p.epilogue = epilogue;
    if (run_check_problem(&p))
        goto done;

    const size_t es = attnres_dtype_size(o->dtype);
    /* The source gradients' element size: fp32 with --dsources-f32. */
    const size_t ges = o->dsources_f32 ? 4 : es;
    const size_t row = (size_t)in.t * (size_t)in.d, n = (size_t)in.n, d = (size_t)in.d;
    /* One spare byte or float keeps every size non-zero for T = 0. */
    h.src = malloc(row * n * es + 1);
    h.dsrc = malloc(row * n * ges + 1);
    if (o->dout)
        h.dout = malloc(row * es + 1);
    h.u = malloc(d * 4);
    h.du = malloc(d * 4);
    h.dquery = malloc(d * 4);
    h.dsrc_f = malloc(row * n * 4 + 4);
    h.srcs = malloc(sizeof(void *) * n);
    h.dsrcs = malloc(sizeof(void *) * n);
    if (o->gain)
        h.dgain = malloc(d * 4);
    if (o->partial) {
        h.dpartial = malloc(row * es + 1);
        h.dpartial_f = malloc(row * 4 + 4);
    }
    if (epilogue) {
        h.out = malloc(row * es + 1);
        h.dnormed = malloc(row * es + 1);
    }
    if (o->dout_gain)
        h.dout_gain = malloc(d * 4);
    if (!h.src || !h.dsrc || (o->dout && !h.dout) || !h.u || !h.du || !h.dquery || !h.dsrc_f || !h.srcs ||
        !h.dsrcs || (o->gain && !h.dgain) || (o->partial && (!h.dpartial || !h.dpartial_f)) ||
        (epilogue && (!h.out || !h.dnormed)) || (o->dout_gain && !h.dout_gain)) {
        cli_error("run", "out of memory for T = %lld, d = %lld, N = %lld", (long long)in.t, (long long)in.d,
                  (long long)in.n);
        goto done;
    }
    convert_to_storage(o->dtype, in.sources.data, h.src, row * n);
    if (o->dout)
        convert_to_storage(o->dtype, in.dout.data, h.dout, row);
    if (epilogue) {
        convert_to_storage(o->dtype, h.out_f.data, h.out, row);
        convert_to_storage(o->dtype, h.dnormed_f.data, h.dnormed, row);
    }
    attnres_fold_query(in.query.data, o->gain ? in.gain.data : NULL, h.u, in.d);
    if (run_open_plan(o, &p, &dev, &db, &plan))
        goto done;
    size_t ws_bytes = 0;
    int rc = attnres_mix_backward_workspace_size(plan, in.t, &ws_bytes);
    if (rc) {
        cli_error("run", "%s: %s", attnres_errstr(rc), attnres_plan_errmsg(plan));
        goto done;
    }
    /* As for the forward: the kernel sees device copies only (host memory
     * on the CPU), and the gradients come back after the launch. The
     * workspace is the device's too; its allocation is 64-byte aligned. */
    staged st = {.dev = dev};
    void *d_src = run_stage(&st, h.src, row * n * es);
    float *d_u = run_stage(&st, h.u, d * 4);
    void *d_dout = o->dout ? run_stage(&st, h.dout, row * es) : NULL;
    void *d_dsrc = run_stage(&st, NULL, row * n * ges);
    float *d_du = run_stage(&st, NULL, d * 4);
    void *d_dpart = o->partial ? run_stage(&st, NULL, row * es) : NULL;
    float *d_dalpha = o->partial ? run_stage(&st, NULL, 4) : NULL;
    void *d_ws = run_stage(&st, NULL, ws_bytes);
    void *d_out = epilogue ? run_stage(&st, h.out, row * es) : NULL;
    float *d_ogain = epilogue ? run_stage(&st, in.out_gain.data, d * 4) : NULL;
    void *d_dnormed = epilogue ? run_stage(&st, h.dnormed, row * es) : NULL;
    float *d_dogain = o->dout_gain ? run_stage(&st, NULL, d * 4) : NULL;
    if (st.failed) {
        cli_error("run", "device buffers: %s", attnres_device_errmsg(dev));
        run_unstage(&st);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        h.srcs[i] = (const char *)d_src + i * row * es;
        h.dsrcs[i] = (char *)d_dsrc + i * row * ges;
    }
    attnres_mix_backward_args a;
    attnres_mix_backward_args_init(&a);
    a.sources = h.srcs;
    a.query = d_u;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.alpha = (float)o->alpha;
    a.dout = d_dout;
    a.flags = o->dsources_f32 ? ATTNRES_GRAD_DSOURCES_F32 : 0;
    a.dsources = h.dsrcs;
    a.dquery = d_du;
    a.dpartial = d_dpart;
    a.dalpha = d_dalpha;
    a.workspace = d_ws;
    a.workspace_size = ws_bytes;
    a.out = d_out;
    a.out_gain = d_ogain;
    a.out_eps = (float)o->out_eps;
    a.dnormed = d_dnormed;
    a.dout_gain = d_dogain;
    rc = attnres_run_mix_backward(plan, in.t, &a, NULL);
    float dalpha = 0;
    /* fp32 source gradients come back as they are, with nothing to widen. */
    run_output grads[] = {o->dsources_f32 ? (run_output){d_dsrc, h.dsrc_f, row * n, NULL, {NULL, NULL, 0, {0, 0, 0}}}
                                          : (run_output){d_dsrc, h.dsrc, row * n, h.dsrc_f, {NULL, NULL, 0, {0, 0, 0}}},
                          {d_du, h.du, d, NULL, {NULL, NULL, 0, {0, 0, 0}}},
                          {d_dpart, h.dpartial, row, h.dpartial_f, {NULL, NULL, 0, {0, 0, 0}}},
                          {d_dalpha, &dalpha, 1, NULL, {NULL, NULL, 0, {0, 0, 0}}},
                          {d_dogain, h.dout_gain, d, NULL, {NULL, NULL, 0, {0, 0, 0}}}};
    if (run_fetch(o, plan, rc, &st, grads, (int)(sizeof grads / sizeof grads[0])))
        goto done;
    /* u = G ⊙ W, so dW = du ⊙ G and dG = du ⊙ W (G = 1 without --gain). */
    for (size_t k = 0; k < d; k++) {
        h.dquery[k] = o->gain ? h.du[k] * in.gain.data[k] : h.du[k];
        if (o->gain)
            h.dgain[k] = h.du[k] * in.query.data[k];
    }
    out_file files[] = {{o->dsources, h.dsrc_f, 3, {in.n, in.t, in.d}},
                        {o->dquery, h.dquery, 1, {in.d, 0, 0}},
                        {o->dgain, h.dgain, 1, {in.d, 0, 0}},
                        {o->dpartial, h.dpartial_f, 2, {in.t, in.d, 0}},
                        {o->dalpha, &dalpha, 0, {0, 0, 0}},
                        {o->dout_gain, h.dout_gain, 1, {in.d, 0, 0}}};
    if (run_write_outputs(files, (int)(sizeof files / sizeof files[0])))
        goto done;
    exit_code = CLI_EXIT_OK;
done:
    run_close_plan(dev, db, plan);
    bw_host_free(&h);
    run_mix_inputs_free(&in);
    return exit_code;
}
