/*
 * cmd_run_phase_backward.c - `attnres run --op phase1_backward` and `--op
 * phase2_backward`: the gradients of Block AttnRes' two phases (DESIGN §1b)
 * from the forward's inputs and the gradients of its outputs.
 *
 * As for mix_backward (cmd_run_backward.c), the runtime returns the
 * gradient of each folded query u, which is turned into those of the files
 * the user gave through u = G ⊙ W, and the workspace the sums over tokens
 * need is sized with attnres_plan_workspace_size.
 */
#include <stdlib.h>
#include <string.h>

#include "attnres-impl.h"
#include "attnres.h"
#include "cli.h"
#include "cmd_run.h"
#include "convert.h"
#include "npy.h"
#include "problems.h"

/* An empty run_output's file. */
#define NO_FILE {NULL, NULL, 0, {0, 0, 0}}

static void free_each(void *const *bufs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(bufs[i]);
}

/* Asks the plan for its workspace on T tokens; 0, else -1 with the reason
 * printed. */
static int workspace_size(attnres_plan *plan, int64_t t, size_t *bytes)
{
    int rc = attnres_plan_workspace_size(plan, t, bytes);
    if (rc) {
        cli_error("run", "%s: %s", attnres_errstr(rc), attnres_plan_errmsg(plan));
        return -1;
    }
    return 0;
}

/* u = G ⊙ W, so dW = du ⊙ G and dG = du ⊙ W (G = 1 without a gain), over
 * count elements; dg may be NULL (no gain). */
static void fold_backward(const float *du, const float *w, const float *g, size_t count, float *dw, float *dg)
{
    for (size_t k = 0; k < count; k++) {
        dw[k] = g ? du[k] * g[k] : du[k];
        if (g)
            dg[k] = du[k] * w[k];
    }
}

/* ---- --op phase1_backward ------------------------------------------------ */

/* The inputs of phase 1's backward as read, and its host buffers. */
typedef struct p1bw {
    npy_array sources, queries, gains, do1, dlse;
    void *src, *do1_store, *dsrc;
    float *u, *du, *dsrc_f, *dqueries, *dgains;
    const void **srcs, **do1s;
    const float **dlses;
    void **dsrcs;
} p1bw;

static void p1bw_free(p1bw *h)
{
    void *const bufs[] = {h->src, h->do1_store, h->dsrc, h->u, h->du, h->dsrc_f, h->dqueries, h->dgains,
                          (void *)h->srcs, (void *)h->do1s, (void *)h->dlses, h->dsrcs};
    free_each(bufs, sizeof bufs / sizeof bufs[0]);
    npy_free(&h->sources);
    npy_free(&h->queries);
    npy_free(&h->gains);
    npy_free(&h->do1);
    npy_free(&h->dlse);
}

/* Reads --queries: (S, d) with 1 <= S <= PROBLEM_MAX_S. */
static int read_queries(const run_opts *o, int64_t d, npy_array *q)
{
    char err[512];
    if (npy_read_f32(o->queries, q, err, sizeof err)) {
        cli_error("run", "%s", err);
        return -1;
    }
    if (q->ndim != 2 || q->shape[1] != d) {
        char got[128];
        run_shape_text(q, got, sizeof got);
        cli_error("run", "--queries %s must have shape (S, d) with d = %lld to match the sources, got %s",
                  o->queries, (long long)d, got);
        return -1;
    }
    if (q->shape[0] < 1 || q->shape[0] > PROBLEM_MAX_S) {
        cli_error("run", "--queries %s has S = %lld sites; phase1_backward needs 1 to %d", o->queries,
                  (long long)q->shape[0], PROBLEM_MAX_S);
        return -1;
    }
    return 0;
}

int run_phase1_backward(const run_opts *o)
{
    p1bw h;
    memset(&h, 0, sizeof h);
    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    if (run_read_sources(o, &h.sources))
        goto done;
    const int64_t n = h.sources.shape[0], t = h.sources.shape[1], d = h.sources.shape[2], hh = o->heads;
    if (read_queries(o, d, &h.queries))
        goto done;
    const int64_t s = h.queries.shape[0];
    const int64_t sd[2] = {s, d}, std[3] = {s, t, d}, sth[3] = {s, t, hh};
    if (o->gains && run_read_shaped("--gains", o->gains, 2, sd, "S, d", "to match --queries", &h.gains))
        goto done;
    if (run_read_shaped("--do1", o->do1, 3, std, "S, T, d", "to match --queries and the sources", &h.do1))
        goto done;
    if (o->dlse && run_read_shaped("--dlse", o->dlse, 3, sth, "S, T, H",
                                   "to match --queries, the sources and --heads", &h.dlse))
        goto done;
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, d, (int32_t)n);
    p.op = ATTNRES_OP_PHASE1_BACKWARD;
    p.heads = (int32_t)hh;
    p.s = (int32_t)s;
    if (run_check_problem(&p))
        goto done;

    const size_t es = attnres_dtype_size(o->dtype);
    /* The source gradients' element size: fp32 with --dsources-f32. */
    const size_t ges = o->dsources_f32 ? 4 : es;
    const size_t row = (size_t)t * (size_t)d, nn = (size_t)n, ss = (size_t)s, sdn = ss * (size_t)d;
    const size_t dlse_count = ss * (size_t)t * (size_t)hh;
    /* One spare byte or float keeps every size non-zero for T = 0. */
    h.src = malloc(row * nn * es + 1);
    h.do1_store = malloc(row * ss * es + 1);
    h.dsrc = malloc(row * nn * ges + 1);
    h.dsrc_f = malloc(row * nn * 4 + 4);
    h.u = malloc(sdn * 4);
    h.du = malloc(sdn * 4);
    h.dqueries = malloc(sdn * 4);
    if (o->gains)
        h.dgains = malloc(sdn * 4);
    h.srcs = malloc(sizeof(void *) * nn);
    h.dsrcs = malloc(sizeof(void *) * nn);
    h.do1s = malloc(sizeof(void *) * ss);
    h.dlses = malloc(sizeof(void *) * ss);
    if (!h.src || !h.do1_store || !h.dsrc || !h.dsrc_f || !h.u || !h.du || !h.dqueries || (o->gains && !h.dgains) ||
        !h.srcs || !h.dsrcs || !h.do1s || !h.dlses) {
        cli_error("run", "out of memory for S = %lld, T = %lld, d = %lld, n = %lld", (long long)s, (long long)t,
                  (long long)d, (long long)n);
        goto done;
    }
    convert_to_storage(o->dtype, h.sources.data, h.src, row * nn);
    convert_to_storage(o->dtype, h.do1.data, h.do1_store, row * ss);
    for (int64_t j = 0; j < s; j++)
        attnres_fold_query(h.queries.data + j * d, o->gains ? h.gains.data + j * d : NULL, h.u + j * d, d);
    if (run_open_plan(o, &p, &dev, &db, &plan))
        goto done;
    size_t ws_bytes = 0;
    if (workspace_size(plan, t, &ws_bytes))
        goto done;
    /* The kernel sees device copies only (host memory on the CPU), and the
     * gradients come back after the launch. */
    staged st = {.dev = dev};
    void *d_src = run_stage(&st, h.src, row * nn * es);
    float *d_u = run_stage(&st, h.u, sdn * 4);
    void *d_do1 = run_stage(&st, h.do1_store, row * ss * es);
    float *d_dlse = o->dlse ? run_stage(&st, h.dlse.data, dlse_count * 4) : NULL;
    void *d_dsrc = run_stage(&st, NULL, row * nn * ges);
    float *d_du = run_stage(&st, NULL, sdn * 4);
    void *d_ws = run_stage(&st, NULL, ws_bytes);
    if (st.failed) {
        cli_error("run", "device buffers: %s", attnres_device_errmsg(dev));
        run_unstage(&st);
        goto done;
    }
    for (size_t i = 0; i < nn; i++) {
        h.srcs[i] = (const char *)d_src + i * row * es;
        h.dsrcs[i] = (char *)d_dsrc + i * row * ges;
    }
    for (size_t j = 0; j < ss; j++) {
        h.do1s[j] = (const char *)d_do1 + j * row * es;
        h.dlses[j] = o->dlse ? d_dlse + j * (size_t)t * (size_t)hh : NULL;
    }
    attnres_phase1_backward_args a;
    attnres_phase1_backward_args_init(&a);
    a.sources = h.srcs;
    a.queries = d_u;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.do1 = h.do1s;
    a.dlse = o->dlse ? h.dlses : NULL;
    a.flags = o->dsources_f32 ? ATTNRES_GRAD_DSOURCES_F32 : 0;
    a.dsources = h.dsrcs;
    a.dqueries = d_du;
    a.workspace = d_ws;
    a.workspace_size = ws_bytes;
    const int rc = attnres_run_phase1_backward(plan, t, &a, NULL);
    /* fp32 source gradients come back as they are, with nothing to widen. */
    run_output grads[] = {o->dsources_f32 ? (run_output){d_dsrc, h.dsrc_f, row * nn, NULL, NO_FILE}
                                          : (run_output){d_dsrc, h.dsrc, row * nn, h.dsrc_f, NO_FILE},
                          {d_du, h.du, sdn, NULL, NO_FILE}};
    if (run_fetch(o, plan, rc, &st, grads, (int)(sizeof grads / sizeof grads[0])))
        goto done;
    fold_backward(h.du, h.queries.data, o->gains ? h.gains.data : NULL, sdn, h.dqueries, h.dgains);
    const out_file files[] = {{o->dsources, h.dsrc_f, 3, {n, t, d}},
                              {o->dqueries, h.dqueries, 2, {s, d, 0}},
                              {o->dgains, h.dgains, 2, {s, d, 0}}};
    if (run_write_outputs(files, (int)(sizeof files / sizeof files[0])))
        goto done;
    exit_code = CLI_EXIT_OK;
done:
    run_close_plan(dev, db, plan);
    p1bw_free(&h);
    return exit_code;
}

/* ---- --op phase2_backward ------------------------------------------------ */

/* The inputs of phase 2's backward as read, and its host buffers. */
typedef struct p2bw {
    npy_array o1, lse, partial, query, gain, out_gain, dout, dnormed;
    void *o1_store, *b_store, *dout_store, *dnormed_store, *do1, *dpartial, *dsublayer;
    float *u, *du, *do1_f, *dlse, *dpartial_f, *dsublayer_f, *dquery, *dgain, *dout_gain;
} p2bw;

static void p2bw_free(p2bw *h)
{
    void *const bufs[] = {h->o1_store, h->b_store, h->dout_store, h->dnormed_store, h->do1, h->dpartial,
                          h->dsublayer, h->u, h->du, h->do1_f, h->dlse, h->dpartial_f, h->dsublayer_f,
                          h->dquery, h->dgain, h->dout_gain};
    free_each(bufs, sizeof bufs / sizeof bufs[0]);
    npy_array *const arrays[] = {&h->o1, &h->lse, &h->partial, &h->query, &h->gain, &h->out_gain, &h->dout,
                                 &h->dnormed};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        npy_free(arrays[i]);
}

/* Reads --o1 (T, d) and --lse (T, H), and checks H: it goes into a 32-bit
 * field, so it is checked before it is narrowed. */
static int read_o1_lse(const run_opts *o, p2bw *h)
{
    char err[512], got[128];
    if (npy_read_f32(o->o1, &h->o1, err, sizeof err)) {
        cli_error("run", "%s", err);
        return -1;
    }
    if (h->o1.ndim != 2 || h->o1.shape[1] < 1) {
        run_shape_text(&h->o1, got, sizeof got);
        cli_error("run", "--o1 %s must have shape (T, d) with d >= 1, got %s", o->o1, got);
        return -1;
    }
    const int64_t t = h->o1.shape[0], d = h->o1.shape[1];
    if (npy_read_f32(o->lse, &h->lse, err, sizeof err)) {
        cli_error("run", "%s", err);
        return -1;
    }
    if (h->lse.ndim != 2 || h->lse.shape[0] != t || h->lse.shape[1] < 1) {
        run_shape_text(&h->lse, got, sizeof got);
        cli_error("run", "--lse %s must have shape (T, H) with T = %lld to match --o1 and H >= 1, got %s", o->lse,
                  (long long)t, got);
        return -1;
    }
    const int64_t hh = h->lse.shape[1];
    if (hh > PROBLEM_MAX_HEADS) {
        cli_error("run", "--lse %s has H = %lld columns; at most %d heads are supported", o->lse, (long long)hh,
                  PROBLEM_MAX_HEADS);
        return -1;
    }
    if (o->have_heads && o->heads != hh) {
        cli_error("run", "--heads %lld does not match --lse %s, which has H = %lld columns", (long long)o->heads,
                  o->lse, (long long)hh);
        return -1;
    }
    if (d % hh != 0) {
        cli_error("run", "H = %lld heads (from --lse) does not divide d = %lld", (long long)hh, (long long)d);
        return -1;
    }
    return 0;
}

/* Reads the inputs after --o1 and --lse, each shape checked against theirs. */
static int read_p2bw_rest(const run_opts *o, p2bw *h)
{
    const int64_t t = h->o1.shape[0], d = h->o1.shape[1], td[2] = {t, d};
    const char *why = "to match --o1";
    const int failed = run_read_shaped("--partial", o->partial, 2, td, "T, d", why, &h->partial) ||
                       run_read_shaped("--query", o->query, 1, &d, "d", why, &h->query) ||
                       (o->gain && run_read_shaped("--gain", o->gain, 1, &d, "d", why, &h->gain)) ||
                       (o->out_gain && run_read_shaped("--out-gain", o->out_gain, 1, &d, "d", why, &h->out_gain)) ||
                       (o->dout && run_read_shaped("--dout", o->dout, 2, td, "T, d", why, &h->dout)) ||
                       (o->dnormed && run_read_shaped("--dnormed", o->dnormed, 2, td, "T, d", why, &h->dnormed));
    return failed ? -1 : 0;
}

int run_phase2_backward(const run_opts *o)
{
    p2bw h;
    memset(&h, 0, sizeof h);
    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    if (read_o1_lse(o, &h) || read_p2bw_rest(o, &h))
        goto done;
    const int64_t t = h.o1.shape[0], d = h.o1.shape[1], hh = h.lse.shape[1];
    const int epilogue = o->out_gain != NULL;
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, d, 1);
    p.op = ATTNRES_OP_PHASE2_BACKWARD;
    p.heads = (int32_t)hh;
    p.epilogue = epilogue;
    p.fuse_add = o->fuse_add ? 1 : 0;
    if (run_check_problem(&p))
        goto done;

    const size_t es = attnres_dtype_size(o->dtype);
    const size_t row = (size_t)t * (size_t)d, dd = (size_t)d, th = (size_t)t * (size_t)hh;
    /* One spare byte or float keeps every size non-zero for T = 0. */
    h.o1_store = malloc(row * es + 1);
    h.b_store = malloc(row * es + 1);
    if (o->dout)
        h.dout_store = malloc(row * es + 1);
    if (epilogue)
        h.dnormed_store = malloc(row * es + 1);
    h.do1 = malloc(row * es + 1);
    h.do1_f = malloc(row * 4 + 4);
    h.dlse = malloc(th * 4 + 4);
    h.dpartial = malloc(row * es + 1);
    h.dpartial_f = malloc(row * 4 + 4);
    if (o->dsublayer) {
        h.dsublayer = malloc(row * es + 1);
        h.dsublayer_f = malloc(row * 4 + 4);
    }
    h.u = malloc(dd * 4);
    h.du = malloc(dd * 4);
    h.dquery = malloc(dd * 4);
    if (o->gain)
        h.dgain = malloc(dd * 4);
    if (o->dout_gain)
        h.dout_gain = malloc(dd * 4);
    if (!h.o1_store || !h.b_store || (o->dout && !h.dout_store) || (epilogue && !h.dnormed_store) || !h.do1 ||
        !h.do1_f || !h.dlse || !h.dpartial || !h.dpartial_f || (o->dsublayer && (!h.dsublayer || !h.dsublayer_f)) ||
        !h.u || !h.du || !h.dquery || (o->gain && !h.dgain) || (o->dout_gain && !h.dout_gain)) {
        cli_error("run", "out of memory for T = %lld, d = %lld", (long long)t, (long long)d);
        goto done;
    }
    convert_to_storage(o->dtype, h.o1.data, h.o1_store, row);
    convert_to_storage(o->dtype, h.partial.data, h.b_store, row);
    if (o->dout)
        convert_to_storage(o->dtype, h.dout.data, h.dout_store, row);
    if (epilogue)
        convert_to_storage(o->dtype, h.dnormed.data, h.dnormed_store, row);
    attnres_fold_query(h.query.data, o->gain ? h.gain.data : NULL, h.u, d);
    if (run_open_plan(o, &p, &dev, &db, &plan))
        goto done;
    size_t ws_bytes = 0;
    if (workspace_size(plan, t, &ws_bytes))
        goto done;
    /* Device copies of every buffer (fourteen at most, RUN_MAX_STAGED). */
    staged st = {.dev = dev};
    void *d_o1 = run_stage(&st, h.o1_store, row * es);
    float *d_lse = run_stage(&st, h.lse.data, th * 4);
    void *d_b = run_stage(&st, h.b_store, row * es);
    float *d_u = run_stage(&st, h.u, dd * 4);
    void *d_dout = o->dout ? run_stage(&st, h.dout_store, row * es) : NULL;
    float *d_ogain = epilogue ? run_stage(&st, h.out_gain.data, dd * 4) : NULL;
    void *d_dnormed = epilogue ? run_stage(&st, h.dnormed_store, row * es) : NULL;
    void *d_do1 = run_stage(&st, NULL, row * es);
    float *d_dlse = run_stage(&st, NULL, th * 4);
    void *d_db = run_stage(&st, NULL, row * es);
    void *d_df = o->dsublayer ? run_stage(&st, NULL, row * es) : NULL;
    float *d_du = run_stage(&st, NULL, dd * 4);
    float *d_dogain = o->dout_gain ? run_stage(&st, NULL, dd * 4) : NULL;
    void *d_ws = run_stage(&st, NULL, ws_bytes);
    if (st.failed) {
        cli_error("run", "device buffers: %s", attnres_device_errmsg(dev));
        run_unstage(&st);
        goto done;
    }
    attnres_phase2_backward_args a;
    attnres_phase2_backward_args_init(&a);
    a.o1 = d_o1;
    a.lse = d_lse;
    a.partial = d_b;
    a.query = d_u;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.out_gain = d_ogain;
    a.out_eps = (float)o->out_eps;
    a.dout = d_dout;
    a.dnormed = d_dnormed;
    a.do1 = d_do1;
    a.dlse = d_dlse;
    a.dpartial = d_db;
    a.dsublayer = d_df;
    a.dquery = d_du;
    a.dout_gain = d_dogain;
    a.workspace = d_ws;
    a.workspace_size = ws_bytes;
    const int rc = attnres_run_phase2_backward(plan, t, &a, NULL);
    run_output grads[] = {{d_do1, h.do1, row, h.do1_f, NO_FILE},
                          {d_dlse, h.dlse, th, NULL, NO_FILE},
                          {d_db, h.dpartial, row, h.dpartial_f, NO_FILE},
                          {d_df, h.dsublayer, row, h.dsublayer_f, NO_FILE},
                          {d_du, h.du, dd, NULL, NO_FILE},
                          {d_dogain, h.dout_gain, dd, NULL, NO_FILE}};
    if (run_fetch(o, plan, rc, &st, grads, (int)(sizeof grads / sizeof grads[0])))
        goto done;
    fold_backward(h.du, h.query.data, o->gain ? h.gain.data : NULL, dd, h.dquery, h.dgain);
    const out_file files[] = {{o->do1, h.do1_f, 2, {t, d, 0}},
                              {o->dlse, h.dlse, 2, {t, hh, 0}},
                              {o->dpartial, h.dpartial_f, 2, {t, d, 0}},
                              {o->dsublayer, h.dsublayer_f, 2, {t, d, 0}},
                              {o->dquery, h.dquery, 1, {d, 0, 0}},
                              {o->dgain, h.dgain, 1, {d, 0, 0}},
                              {o->dout_gain, h.dout_gain, 1, {d, 0, 0}}};
    _Static_assert(sizeof files / sizeof files[0] <= RUN_MAX_OUTPUTS, "run_write_outputs writes them all");
    if (run_write_outputs(files, (int)(sizeof files / sizeof files[0])))
        goto done;
    exit_code = CLI_EXIT_OK;
done:
    run_close_plan(dev, db, plan);
    p2bw_free(&h);
    return exit_code;
}
