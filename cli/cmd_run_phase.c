/*
 * cmd_run_phase.c - `attnres run --op phase1` and `--op phase2`: the two
 * phases of Block AttnRes.
 */
#include <stdlib.h>

#include "attnres-impl.h"
#include "attnres.h"
#include "cli.h"
#include "cmd_run.h"
#include "convert.h"
#include "npy.h"
#include "problems.h"

/* ---- --op phase1 ------------------------------------------------------ */

int run_phase1(const run_opts *o)
{
    npy_array sources = {0}, queries = {0}, gains = {0};
    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    void *src_store = NULL, *o1_store = NULL;
    float *u = NULL, *o1_f = NULL, *lse = NULL;
    const void **srcs = NULL;
    void **o1s = NULL;
    float **lses = NULL;
    if (run_read_sources(o, &sources))
        goto done;
    const int64_t n = sources.shape[0], t = sources.shape[1], d = sources.shape[2], h = o->heads;
    char err[512];
    if (npy_read_f32(o->queries, &queries, err, sizeof err)) {
        cli_error("run", "%s", err);
        goto done;
    }
    if (queries.ndim != 2 || queries.shape[1] != d) {
        char got[128];
        run_shape_text(&queries, got, sizeof got);
        cli_error("run", "--queries %s must have shape (S, d) with d = %lld to match the sources, got %s",
                  o->queries, (long long)d, got);
        goto done;
    }
    const int64_t s = queries.shape[0];
    if (s < 1 || s > PROBLEM_MAX_S) {
        cli_error("run", "--queries %s has S = %lld sites; phase1 needs 1 to %d", o->queries, (long long)s,
                  PROBLEM_MAX_S);
        goto done;
    }
    const int64_t want_g[2] = {s, d};
    if (o->gains && run_read_shaped("--gains", o->gains, 2, want_g, "S, d", "to match --queries", &gains))
        goto done;
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, d, (int32_t)n);
    p.op = ATTNRES_OP_PHASE1;
    p.heads = (int32_t)h;
    p.s = (int32_t)s;
    if (run_check_problem(&p))
        goto done;

    const size_t es = attnres_dtype_size(o->dtype);
    const size_t row = (size_t)t * (size_t)d;
    src_store = malloc(row * (size_t)n * es + 1);
    o1_store = malloc(row * (size_t)s * es + 1);
    o1_f = malloc(row * (size_t)s * 4 + 4);
    lse = malloc((size_t)s * (size_t)t * (size_t)h * 4 + 4);
    u = malloc((size_t)s * (size_t)d * 4);
    srcs = malloc(sizeof *srcs * (size_t)n);
    o1s = malloc(sizeof *o1s * (size_t)s);
    lses = malloc(sizeof *lses * (size_t)s);
    if (!src_store || !o1_store || !o1_f || !lse || !u || !srcs || !o1s || !lses) {
        cli_error("run", "out of memory for S = %lld, T = %lld, d = %lld, n = %lld", (long long)s, (long long)t,
                  (long long)d, (long long)n);
        goto done;
    }
    convert_to_storage(o->dtype, sources.data, src_store, row * (size_t)n);
    for (int64_t j = 0; j < s; j++)
        attnres_fold_query(queries.data + j * d, o->gains ? gains.data + j * d : NULL, u + j * d, d);
    if (run_open_plan(o, &p, &dev, &db, &plan))
        goto done;
    /* As for mix: the kernel sees device copies only (host memory on the
     * CPU), and the outputs come back after the launch. */
    const size_t lse_bytes = (size_t)s * (size_t)t * (size_t)h * 4;
    staged st = {.dev = dev};
    void *d_src = run_stage(&st, src_store, row * (size_t)n * es);
    float *d_u = run_stage(&st, u, (size_t)s * (size_t)d * 4);
    void *d_o1 = run_stage(&st, NULL, row * (size_t)s * es);
    float *d_lse = run_stage(&st, NULL, lse_bytes);
    if (st.failed) {
        cli_error("run", "device buffers: %s", attnres_device_errmsg(dev));
        run_unstage(&st);
        goto done;
    }
    for (int64_t i = 0; i < n; i++)
        srcs[i] = (const char *)d_src + (size_t)i * row * es;
    for (int64_t j = 0; j < s; j++) {
        o1s[j] = (char *)d_o1 + (size_t)j * row * es;
        lses[j] = d_lse + (size_t)j * (size_t)t * (size_t)h;
    }
    attnres_phase1_args a;
    attnres_phase1_args_init(&a);
    a.sources = srcs;
    a.queries = d_u;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.o1 = o1s;
    a.lse = lses;
    const int rc = attnres_run_phase1(plan, t, &a, NULL);
    run_output outs[] = {{d_o1, o1_store, row * (size_t)s, o1_f, {o->out, o1_f, 3, {s, t, d}}},
                         {d_lse, lse, lse_bytes / 4, NULL, {o->lse, lse, 3, {s, t, h}}}};
    exit_code = run_deliver(o, plan, rc, &st, outs, 2);
done:
    run_close_plan(dev, db, plan);
    free(src_store);
    free(o1_store);
    free(o1_f);
    free(lse);
    free(u);
    free(srcs);
    free(o1s);
    free(lses);
    npy_free(&sources);
    npy_free(&queries);
    npy_free(&gains);
    return exit_code;
}

/* ---- --op phase2 ------------------------------------------------------ */

int run_phase2(const run_opts *o)
{
    npy_array o1 = {0}, lse = {0}, partial = {0}, query = {0}, gain = {0}, sublayer = {0}, out_gain = {0};
    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    void *o1_store = NULL, *b_store = NULL, *f_store = NULL, *out_store = NULL, *normed_store = NULL;
    float *u = NULL, *out_f = NULL, *normed_f = NULL, *b_f = NULL;
    char err[512];
    if (npy_read_f32(o->o1, &o1, err, sizeof err)) {
        cli_error("run", "%s", err);
        goto done;
    }
    if (o1.ndim != 2 || o1.shape[1] < 1) {
        char got[128];
        run_shape_text(&o1, got, sizeof got);
        cli_error("run", "--o1 %s must have shape (T, d) with d >= 1, got %s", o->o1, got);
        goto done;
    }
    const int64_t t = o1.shape[0], d = o1.shape[1];
    if (npy_read_f32(o->lse, &lse, err, sizeof err)) {
        cli_error("run", "%s", err);
        goto done;
    }
    if (lse.ndim != 2 || lse.shape[0] != t || lse.shape[1] < 1) {
        char got[128];
        run_shape_text(&lse, got, sizeof got);
        cli_error("run", "--lse %s must have shape (T, H) with T = %lld to match --o1, got %s", o->lse,
                  (long long)t, got);
        goto done;
    }
    const int64_t h = lse.shape[1];
    /* H goes into a 32-bit field: it is checked before it is narrowed. */
    if (h > PROBLEM_MAX_HEADS) {
        cli_error("run", "--lse %s has H = %lld columns; at most %d heads are supported", o->lse, (long long)h,
                  PROBLEM_MAX_HEADS);
        goto done;
    }
    if (o->have_heads && o->heads != h) {
        cli_error("run", "--heads %lld does not match --lse %s, which has H = %lld columns", (long long)o->heads,
                  o->lse, (long long)h);
        goto done;
    }
    if (d % h != 0) {
        cli_error("run", "H = %lld heads (from --lse) does not divide d = %lld", (long long)h, (long long)d);
        goto done;
    }
    const int64_t want_td[2] = {t, d};
    if (run_read_shaped("--partial", o->partial, 2, want_td, "T, d", "to match --o1", &partial))
        goto done;
    if (o->sublayer && run_read_shaped("--sublayer", o->sublayer, 2, want_td, "T, d", "to match --o1", &sublayer))
        goto done;
    if (run_read_shaped("--query", o->query, 1, &d, "d", "to match --o1", &query))
        goto done;
    if (o->gain && run_read_shaped("--gain", o->gain, 1, &d, "d", "to match --o1", &gain))
        goto done;
    if (o->out_gain && run_read_shaped("--out-gain", o->out_gain, 1, &d, "d", "to match --o1", &out_gain))
        goto done;
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, d, 1);
    p.op = ATTNRES_OP_PHASE2;
    p.heads = (int32_t)h;
    p.epilogue = o->normed ? 1 : 0;
    p.fuse_add = o->sublayer ? 1 : 0;
    if (run_check_problem(&p))
        goto done;

    const size_t es = attnres_dtype_size(o->dtype);
    const size_t row = (size_t)t * (size_t)d;
    o1_store = malloc(row * es + 1);
    b_store = malloc(row * es + 1);
    out_store = malloc(row * es + 1);
    out_f = malloc(row * 4 + 4);
    u = malloc((size_t)d * 4);
    if (p.fuse_add) {
        f_store = malloc(row * es + 1);
        b_f = malloc(row * 4 + 4);
    }
    if (p.epilogue) {
        normed_store = malloc(row * es + 1);
        normed_f = malloc(row * 4 + 4);
    }
    if (!o1_store || !b_store || !out_store || !out_f || !u || (p.fuse_add && (!f_store || !b_f)) ||
        (p.epilogue && (!normed_store || !normed_f))) {
        cli_error("run", "out of memory for T = %lld, d = %lld", (long long)t, (long long)d);
        goto done;
    }
    convert_to_storage(o->dtype, o1.data, o1_store, row);
    convert_to_storage(o->dtype, partial.data, b_store, row);
    if (p.fuse_add)
        convert_to_storage(o->dtype, sublayer.data, f_store, row);
    attnres_fold_query(query.data, o->gain ? gain.data : NULL, u, d);
    if (run_open_plan(o, &p, &dev, &db, &plan))
        goto done;
    /* Device copies of every buffer (eight at most, what staged holds). */
    staged st = {.dev = dev};
    void *d_o1 = run_stage(&st, o1_store, row * es);
    float *d_lse = run_stage(&st, lse.data, (size_t)t * (size_t)h * 4);
    void *d_b = run_stage(&st, b_store, row * es);
    void *d_f = p.fuse_add ? run_stage(&st, f_store, row * es) : NULL;
    float *d_u = run_stage(&st, u, (size_t)d * 4);
    float *d_gain = o->out_gain ? run_stage(&st, out_gain.data, (size_t)d * 4) : NULL;
    void *d_out = run_stage(&st, NULL, row * es);
    void *d_normed = p.epilogue ? run_stage(&st, NULL, row * es) : NULL;
    if (st.failed) {
        cli_error("run", "device buffers: %s", attnres_device_errmsg(dev));
        run_unstage(&st);
        goto done;
    }
    attnres_phase2_args a;
    attnres_phase2_args_init(&a);
    a.o1 = d_o1;
    a.lse = d_lse;
    a.partial = d_b;
    a.sublayer = d_f;
    a.query = d_u;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.out = d_out;
    a.out_gain = d_gain;
    a.out_eps = (float)o->out_eps;
    a.normed = d_normed;
    const int rc = attnres_run_phase2(plan, t, &a, NULL);
    run_output outs[] = {{d_out, out_store, row, out_f, {o->out, out_f, 2, {t, d, 0}}},
                         {d_normed, normed_store, row, normed_f, {o->normed, normed_f, 2, {t, d, 0}}},
                         {p.fuse_add ? d_b : NULL, b_store, row, b_f, {o->partial_out, b_f, 2, {t, d, 0}}}};
    exit_code = run_deliver(o, plan, rc, &st, outs, 3);
done:
    run_close_plan(dev, db, plan);
    free(o1_store);
    free(b_store);
    free(f_store);
    free(out_store);
    free(normed_store);
    free(u);
    free(out_f);
    free(normed_f);
    free(b_f);
    npy_free(&o1);
    npy_free(&lse);
    npy_free(&partial);
    npy_free(&query);
    npy_free(&gain);
    npy_free(&sublayer);
    npy_free(&out_gain);
    return exit_code;
}
