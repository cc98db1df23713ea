/*
 * ops_cuda_phase_backward.c - the CUDA cases of backend_ops for the
 * backwards of Block AttnRes' two phases (templates/cuda/phase1_backward.lua
 * and phase2_backward.lua): one problem on one loaded kernel, which
 * ops_cuda.c chooses, compiles, loads and reports, as run_mix_backward does
 * for the mix backward.
 *
 * Each problem runs twice on the same random inputs (padded strides, NaN
 * in the padding), its per-token gradients reset before each run to NaN or,
 * accumulated, to random priors, and the workspace poisoned with other
 * bytes each time (NaN, then 0x5a): every gradient is checked against
 * attnres_reference_phase1_backward / _phase2_backward on the rounded
 * inputs at DESIGN §1's tolerances (per-token gradients in the storage type
 * at its own, 1e-5 for fp32 and 1e-2 for bf16 and f16; phase 1's fp32
 * source gradients, each site's dqueries row, dquery, dlse and d(out_gain)
 * at fp32's 1e-5 in every dtype, being fp32 sums of products of inputs the
 * reference reads as stored), and the two runs must agree bit for bit.
 * The padding between rows of every output must come back as it was, every
 * input whole (padding too), and the outputs a problem ignores (phase 2's
 * dsublayer without the fused add, d(out_gain) without the epilogue or
 * where the caller passes none) untouched. With one source, the dqueries
 * row of a site without a dlse is exactly zero (the softmax weight is
 * exactly 1). A launch at T = 0 then writes the sums as zeros and leaves
 * every per-token gradient as the runs left it.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "device.h"
#include "ops_cuda_internal.h"
#include "test_compare.h"
#include "test_data.h"

/* The most sources and sites a case makes (the API's sites; the CUDA
 * kernels take fewer, which choose_problems keeps to). */
#define MAX_N 64
#define MAX_S 64

/* The workspace's poison on the first run and on the second: stale partial
 * sums of either kind must not matter. */
static const unsigned char ws_poison[2] = {0xff, 0x5a};

static size_t view_bytes(const view *v) { return (size_t)(v->rows * v->stride) * v->es; }

/* Uploads the bytes v was made with (an output's initial values); 0 on
 * success. */
static int view_reset(run_ctx *c, const view *v, const char *name)
{
    if (cuda_dev->ops->copy_to_device(cuda_dev, v->dptr, v->host, view_bytes(v)) == ATTNRES_OK)
        return 0;
    fail_run(c, 1, "resetting %s", name);
    return -1;
}

/* Fills the workspace with `byte` on the device; 0 on success. */
static int ws_poison_with(run_ctx *c, view *ws, unsigned char byte)
{
    memset(ws->host, byte, view_bytes(ws));
    return view_reset(c, ws, "the workspace");
}

/* Records a failure unless every byte of v on the device (padding too) is
 * what was uploaded: an input, or an output the problem ignores. */
static void expect_unchanged(run_ctx *c, const view *v, const char *name)
{
    if (c->why[0] || !v->dptr)
        return;
    const size_t bytes = view_bytes(v);
    unsigned char *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        fail_run(c, 0, "out of host memory");
        return;
    }
    if (fetch_raw(c, v, buf, bytes, name) == 0 && memcmp(buf, v->host, bytes) != 0) {
        size_t at = 0;
        while (at < bytes && buf[at] == v->host[at])
            at++;
        fail_run(c, 0, "%s was written (first changed byte %zu of %zu, element %zu: row %lld)", name, at, bytes,
                 at / v->es, (long long)(at / v->es / (size_t)(v->stride ? v->stride : 1)));
    }
    free(buf);
}

/* Records a failure unless rows [r0, r0 + rows) of v hold exactly zero
 * (got: scratch of v's size). */
static void expect_zero_rows(run_ctx *c, const view *v, int64_t r0, int64_t rows, const char *name, double *got,
                             const char *why)
{
    if (c->why[0] || view_fetch(c, v, name, got) != 0)
        return;
    for (int64_t r = r0; r < r0 + rows; r++)
        for (int64_t k = 0; k < v->d; k++)
            if (got[r * v->d + k] != 0.0) {
                fail_run(c, 0, "%s: %s[%lld][%lld] = %g, not exactly 0", why, name, (long long)r, (long long)k,
                         got[r * v->d + k]);
                return;
            }
}

/* Copies the outputs' whole buffers back, one after another, into buf;
 * 0 on success. */
static int snapshot(run_ctx *c, const view *const *outs, int count, unsigned char *buf)
{
    size_t at = 0;
    for (int i = 0; i < count; i++) {
        if (fetch_raw(c, outs[i], buf + at, view_bytes(outs[i]), "a gradient"))
            return -1;
        at += view_bytes(outs[i]);
    }
    return 0;
}

/* The snapshots of two runs: the first output whose bytes differ fails the
 * run. */
static void expect_same_runs(run_ctx *c, const view *const *outs, const char *const *names, int count,
                             const unsigned char *first, const unsigned char *second)
{
    size_t at = 0;
    for (int i = 0; i < count && !c->why[0]; i++) {
        if (memcmp(first + at, second + at, view_bytes(outs[i])) != 0)
            fail_run(c, 0, "two runs on the same inputs gave different %s (not deterministic)", names[i]);
        at += view_bytes(outs[i]);
    }
}

/* After the runs, a launch on no tokens: the sums (views sums, names
 * snames) are written as zeros and the per-token outputs keep the second
 * run's bytes, which `second` holds in the order of outs. */
static void expect_empty_launch(run_ctx *c, const ar_kernel *k, const attnres_problem *p, const ar_op_args *op,
                                const view *const *sums, const char *const *snames, int nsums,
                                const view *const *outs, const char *const *names, int count,
                                const unsigned char *second, double *got)
{
    if (c->why[0] || be_launch(c, k, p, 0, op))
        return;
    for (int w = 0; w < nsums; w++)
        expect_zero_rows(c, sums[w], 0, sums[w]->rows, snames[w], got, "T = 0");
    size_t at = 0;
    for (int i = 0; i < count && !c->why[0]; i++) {
        const size_t bytes = view_bytes(outs[i]);
        unsigned char *buf = malloc(bytes ? bytes : 1);
        if (!buf) {
            fail_run(c, 0, "out of host memory");
            return;
        }
        if (fetch_raw(c, outs[i], buf, bytes, names[i]) == 0 && memcmp(buf, second + at, bytes) != 0)
            fail_run(c, 0, "T = 0: %s was written (a launch on no tokens may write the sums alone)", names[i]);
        free(buf);
        at += bytes;
    }
}

/* ------------------------------------------------------------------------
 * Phase 1's backward
 * ---------------------------------------------------------------------- */

/* Whether site j of a problem has an incoming gradient of lse. */
static int has_dlse(const problem *pr, int j)
{
    return pr->dlse == DLSE_ALL || (pr->dlse == DLSE_SOME && j % 3 != 0);
}

double run_phase1_backward(run_ctx *c, const ar_kernel *k, const problem *pr, int64_t ae)
{
    const attnres_problem *p = &pr->p;
    const int64_t T = pr->T, d = p->d, H = p->heads;
    const int n = p->n, S = p->s, acc = pr->accumulate;
    const size_t es = attnres_dtype_size(p->dtype);
    /* The source gradients' type: fp32 with the flag. */
    const attnres_dtype gdt = pr->dsrc_f32 ? ATTNRES_DTYPE_F32 : p->dtype;
    const size_t ges = attnres_dtype_size(gdt);
    const unsigned flags = (acc ? ATTNRES_GRAD_ACCUMULATE : 0) | (pr->dsrc_f32 ? ATTNRES_GRAD_DSOURCES_F32 : 0);
    /* One tensor that is the first and the last source: both gradients
     * added into the first's view, the last's buffer left alone. */
    const int alias = pr->alias && acc && n >= 2;
    if (n < 1 || n > MAX_N || S < 1 || S > MAX_S) {
        fail_run(c, 0, "n = %d or S = %d is beyond what this case makes", n, S);
        return INFINITY;
    }
    uint64_t s = problem_seed(pr);
    view src[MAX_N], dsrc[MAX_N], do1[MAX_S], dlse[MAX_S], q, dq, ws;
    memset(src, 0, sizeof src), memset(dsrc, 0, sizeof dsrc), memset(do1, 0, sizeof do1);
    memset(dlse, 0, sizeof dlse), memset(&q, 0, sizeof q), memset(&dq, 0, sizeof dq), memset(&ws, 0, sizeof ws);
    const size_t td = (size_t)(T * d), th = (size_t)(T * H), sd = (size_t)S * (size_t)d;
    const size_t scratch = (td > sd ? td : sd) + th + 1;
    double *ref = malloc(sizeof(double) * (td * (size_t)n + 1)), *refq = malloc(sizeof(double) * sd);
    double *xdo1 = malloc(sizeof(double) * (td * (size_t)S + 1)), *xdlse = calloc(th * (size_t)S + 1, sizeof(double));
    double *got = malloc(sizeof(double) * scratch);
    const void *rows[MAX_N], *do1p[MAX_S];
    const float *dlsep[MAX_S];
    void *drows[MAX_N];
    int64_t strides[MAX_N], dstrides[MAX_N];
    const double *xs[MAX_N];
    double *rs[MAX_N];
    const view *outs[MAX_N + 1];
    const char *names[MAX_N + 1];
    char namebuf[MAX_N][24];
    int nouts = 0;
    unsigned char *first = NULL, *second = NULL;
    size_t total = 0;
    double err = INFINITY;
    ar_backward_ws layout;
    if (!ref || !refq || !xdo1 || !xdlse || !got || ar_mix_backward_workspace(S * d, T, 0, &layout) != 0) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    if (make_sources(c, p, T, ae, &s, src, rows, strides, xs))
        goto done;
    for (int i = 0; i < n; i++) {
        if (view_make(c, &dsrc[i], gdt, ges, T, d, padded(d, ae, 1 + (i + 1) % 3), acc, &s, 1.0))
            goto done;
        drows[i] = dsrc[i].dptr, dstrides[i] = dsrc[i].stride;
        rs[i] = ref + (size_t)i * td;
        if (acc)
            memcpy(rs[i], dsrc[i].x, sizeof(double) * td);
    }
    if (alias) {
        drows[n - 1] = drows[0], dstrides[n - 1] = dstrides[0];
        rs[n - 1] = rs[0];
    }
    for (int i = 0; i < n; i++)
        if (!(alias && i == n - 1)) {
            snprintf(namebuf[i], sizeof namebuf[i], "dsources[%d]", i);
            outs[nouts] = &dsrc[i], names[nouts++] = namebuf[i];
        }
    /* Every site's do1 shares one stride (the API has one), dlse too. */
    for (int j = 0; j < S; j++) {
        if (view_make(c, &do1[j], p->dtype, es, T, d, padded(d, ae, 2), 1, &s, 1.0))
            goto done;
        memcpy(xdo1 + (size_t)j * td, do1[j].x, sizeof(double) * td);
        do1p[j] = do1[j].dptr;
        dlsep[j] = NULL;
        if (!has_dlse(pr, j))
            continue;
        if (view_make(c, &dlse[j], ATTNRES_DTYPE_F32, 4, T, H, H + 3, 1, &s, 0.5))
            goto done;
        memcpy(xdlse + (size_t)j * th, dlse[j].x, sizeof(double) * th);
        dlsep[j] = dlse[j].dptr;
    }
    if (vec_make(c, &q, (int64_t)S * d, &s, 0.0, 4.0 / sqrt((double)d)) ||
        view_make(c, &dq, ATTNRES_DTYPE_F32, 4, S, d, d, 0, &s, 0) ||
        view_make(c, &ws, ATTNRES_DTYPE_F32, 4, 1, (int64_t)(layout.bytes / 4), (int64_t)(layout.bytes / 4), 0, &s,
                  0))
        goto done;
    outs[nouts] = &dq, names[nouts++] = "dqueries";
    for (int i = 0; i < nouts; i++)
        total += view_bytes(outs[i]);
    first = malloc(total ? total : 1), second = malloc(total ? total : 1);
    if (!first || !second) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    attnres_problem fwd = *p;
    fwd.op = ATTNRES_OP_PHASE1;
    char msg[256];
    if (attnres_reference_phase1_backward(&fwd, T, xs, q.x, 0.9, 1e-5, xdo1, pr->dlse == DLSE_NONE ? NULL : xdlse,
                                          flags, rs, refq, msg, sizeof msg) != ATTNRES_OK) {
        fail_run(c, 0, "the reference refused the problem: %s", msg);
        goto done;
    }
    attnres_phase1_backward_args a;
    attnres_phase1_backward_args_init(&a);
    a.sources = rows;
    a.source_strides = strides;
    a.queries = q.dptr;
    a.scale = 0.9f;
    a.eps = 1e-5f;
    a.do1 = do1p;
    a.do1_stride = do1[0].stride;
    a.dlse = pr->dlse == DLSE_NONE ? NULL : dlsep;
    a.dlse_stride = H + 3;
    a.flags = flags;
    a.dsources = drows;
    a.dsource_strides = dstrides;
    a.dqueries = dq.dptr;
    a.workspace = ws.dptr;
    a.workspace_size = layout.bytes;
    const ar_op_args op = ar_op_phase1_backward(&a);
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < nouts; i++)
            if (view_reset(c, outs[i], names[i]))
                goto done;
        if (ws_poison_with(c, &ws, ws_poison[run]) || be_launch(c, k, p, T, &op) ||
            snapshot(c, outs, nouts, run ? second : first))
            goto done;
    }
    const double ftol = case_tolerance(ATTNRES_DTYPE_F32);
    err = 0;
    for (int i = 0; i < n && !c->why[0]; i++) {
        if (alias && i == n - 1)
            continue;
        if (view_fetch(c, &dsrc[i], namebuf[i], got) == 0)
            err = fmax(err, compare(c, namebuf[i], got, rs[i], T * d, case_tolerance(gdt)));
    }
    /* Each site's query gradient against its own reference: a site of
     * small gradients is not hidden by the others. */
    if (!c->why[0] && view_fetch(c, &dq, "dqueries", got) == 0)
        for (int j = 0; j < S && !c->why[0]; j++) {
            char name[32];
            snprintf(name, sizeof name, "dqueries[%d]", j);
            if (n == 1 && !has_dlse(pr, j)) {
                /* The weight is exactly 1, p - delta exactly 0. */
                for (int64_t kk = 0; kk < d; kk++)
                    if (got[(size_t)j * (size_t)d + (size_t)kk] != 0.0) {
                        fail_run(c, 0, "N = 1 without a dlse: %s[%lld] = %g, not exactly 0", name, (long long)kk,
                                 got[(size_t)j * (size_t)d + (size_t)kk]);
                        break;
                    }
            } else {
                err = fmax(err, compare(c, name, got + (size_t)j * (size_t)d, refq + (size_t)j * (size_t)d, d, ftol));
            }
        }
    expect_same_runs(c, outs, names, nouts, first, second);
    const view *sums[1] = {&dq};
    const char *snames[1] = {"dqueries"};
    expect_empty_launch(c, k, p, &op, sums, snames, 1, outs, names, nouts - 1, second, got);
    if (alias)
        expect_unchanged(c, &dsrc[n - 1], "the last source's own gradient buffer (its view is the first's)");
    /* Inputs are never written. */
    for (int i = 0; i < n; i++)
        expect_unchanged(c, &src[i], "a source (an input)");
    for (int j = 0; j < S; j++) {
        expect_unchanged(c, &do1[j], "a site's do1 (an input)");
        expect_unchanged(c, &dlse[j], "a site's dlse (an input)");
    }
    expect_unchanged(c, &q, "queries (an input)");
done:
    for (int i = 0; i < n && i < MAX_N; i++)
        view_free(&src[i]), view_free(&dsrc[i]);
    for (int j = 0; j < S && j < MAX_S; j++)
        view_free(&do1[j]), view_free(&dlse[j]);
    view_free(&q), view_free(&dq), view_free(&ws);
    free(ref), free(refq), free(xdo1), free(xdlse), free(got), free(first), free(second);
    return c->why[0] ? INFINITY : err;
}

/* ------------------------------------------------------------------------
 * Phase 2's backward
 * ---------------------------------------------------------------------- */

double run_phase2_backward(run_ctx *c, const ar_kernel *k, const problem *pr, int64_t ae)
{
    const attnres_problem *p = &pr->p;
    const int64_t T = pr->T, d = p->d, H = p->heads;
    const int acc = pr->accumulate, fuse = p->fuse_add, epi = p->epilogue;
    const int dnonly = epi && pr->dnonly, dsub_read = fuse && pr->dsub, want_dgain = epi && !pr->nodgain;
    const size_t es = attnres_dtype_size(p->dtype);
    const unsigned flags = acc ? ATTNRES_GRAD_ACCUMULATE : 0;
    uint64_t s = problem_seed(pr);
    view o1, lse, b, q, g, dout, dn, do1, dlse, db, dsub, dq, dg, ws;
    view *all[] = {&o1, &lse, &b, &q, &g, &dout, &dn, &do1, &dlse, &db, &dsub, &dq, &dg, &ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        memset(all[i], 0, sizeof *all[i]);
    const size_t td = (size_t)(T * d), th = (size_t)(T * H);
    double *r_do1 = malloc(sizeof(double) * (td + 1)), *r_db = malloc(sizeof(double) * (td + 1));
    double *r_dsub = malloc(sizeof(double) * (td + 1)), *r_dlse = malloc(sizeof(double) * (th + 1));
    double *r_dq = malloc(sizeof(double) * (size_t)d), *r_dg = malloc(sizeof(double) * (size_t)d);
    double *got = malloc(sizeof(double) * (td + th + (size_t)d + 1));
    const view *outs[6];
    const char *names[6];
    int nouts = 0;
    unsigned char *first = NULL, *second = NULL;
    size_t total = 0;
    double err = INFINITY;
    ar_backward_ws layout;
    if (!r_do1 || !r_db || !r_dsub || !r_dlse || !r_dq || !r_dg || !got ||
        ar_mix_backward_workspace(d, T, epi, &layout) != 0) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    if (view_make(c, &o1, p->dtype, es, T, d, padded(d, ae, 1), 1, &s, 0) ||
        view_make(c, &b, p->dtype, es, T, d, padded(d, ae, 2), 1, &s, 0) ||
        view_make(c, &dout, p->dtype, es, T, d, padded(d, ae, 3), 1, &s, 1.0) ||
        (epi && view_make(c, &dn, p->dtype, es, T, d, padded(d, ae, 1), 1, &s, 1.0)))
        goto done;
    /* lse: fp32 [T, H] with stride H + 2, around its typical size, so that
     * the weight sigmoid(score - lse) spreads over (0, 1). */
    if (view_make(c, &lse, ATTNRES_DTYPE_F32, 4, T, H, H + 2, 0, &s, 0))
        goto done;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            const float v = (float)(2.0 * rng_normal(&s) + 1.5);
            ((float *)lse.host)[t * lse.stride + h] = v;
            lse.x[t * H + h] = v;
        }
    if (view_reset(c, &lse, "lse") || vec_make(c, &q, d, &s, 0.0, 2.0 / sqrt((double)d)) ||
        (epi && vec_make(c, &g, d, &s, 1.0, 0.25)))
        goto done;
    /* The gradients: NaN, or random priors to add into. */
    if (view_make(c, &do1, p->dtype, es, T, d, padded(d, ae, 2), acc, &s, 1.0) ||
        view_make(c, &dlse, ATTNRES_DTYPE_F32, 4, T, H, H + 2, acc, &s, 1.0) ||
        view_make(c, &db, p->dtype, es, T, d, padded(d, ae, 3), acc, &s, 1.0) ||
        (pr->dsub && view_make(c, &dsub, p->dtype, es, T, d, padded(d, ae, 1), acc && fuse, &s, 1.0)) ||
        view_make(c, &dq, ATTNRES_DTYPE_F32, 4, 1, d, d, 0, &s, 0) ||
        view_make(c, &dg, ATTNRES_DTYPE_F32, 4, 1, d, d, 0, &s, 0) ||
        view_make(c, &ws, ATTNRES_DTYPE_F32, 4, 1, (int64_t)(layout.bytes / 4), (int64_t)(layout.bytes / 4), 0, &s,
                  0))
        goto done;
    if (acc) {
        memcpy(r_do1, do1.x, sizeof(double) * td);
        memcpy(r_db, db.x, sizeof(double) * td);
        memcpy(r_dlse, dlse.x, sizeof(double) * th);
        if (dsub_read)
            memcpy(r_dsub, dsub.x, sizeof(double) * td);
    }
    outs[nouts] = &do1, names[nouts++] = "do1";
    outs[nouts] = &dlse, names[nouts++] = "dlse";
    outs[nouts] = &db, names[nouts++] = "dpartial";
    if (pr->dsub)
        outs[nouts] = &dsub, names[nouts++] = "dsublayer";
    outs[nouts] = &dq, names[nouts++] = "dquery";
    outs[nouts] = &dg, names[nouts++] = "dout_gain";
    for (int i = 0; i < nouts; i++)
        total += view_bytes(outs[i]);
    first = malloc(total ? total : 1), second = malloc(total ? total : 1);
    if (!first || !second) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    attnres_problem fwd = *p;
    fwd.op = ATTNRES_OP_PHASE2;
    char msg[256];
    if (attnres_reference_phase2_backward(&fwd, T, o1.x, lse.x, b.x, q.x, 1.1, 1e-5, epi ? g.x : NULL, 1e-5,
                                          dnonly ? NULL : dout.x, epi ? dn.x : NULL, flags, r_do1, r_dlse, r_db,
                                          dsub_read ? r_dsub : NULL, r_dq, want_dgain ? r_dg : NULL, msg,
                                          sizeof msg) != ATTNRES_OK) {
        fail_run(c, 0, "the reference refused the problem: %s", msg);
        goto done;
    }
    attnres_phase2_backward_args a;
    attnres_phase2_backward_args_init(&a);
    SET_VIEW(a, o1, o1), SET_VIEW(a, lse, lse), SET_VIEW(a, partial, b);
    a.query = q.dptr;
    a.scale = 1.1f;
    a.eps = 1e-5f;
    if (epi) {
        a.out_gain = g.dptr;
        a.out_eps = 1e-5f;
        SET_VIEW(a, dnormed, dn);
    }
    if (!dnonly)
        SET_VIEW(a, dout, dout);
    a.flags = flags;
    SET_VIEW(a, do1, do1), SET_VIEW(a, dlse, dlse), SET_VIEW(a, dpartial, db);
    if (pr->dsub)
        SET_VIEW(a, dsublayer, dsub);
    a.dquery = dq.dptr;
    /* Without the epilogue d(out_gain) is given all the same: the problem
     * has none, so its buffer must stay as it was. */
    a.dout_gain = want_dgain || !epi ? dg.dptr : NULL;
    a.workspace = ws.dptr;
    a.workspace_size = layout.bytes;
    const ar_op_args op = ar_op_phase2_backward(&a);
    for (int run = 0; run < 2; run++) {
        for (int i = 0; i < nouts; i++)
            if (view_reset(c, outs[i], names[i]))
                goto done;
        if (ws_poison_with(c, &ws, ws_poison[run]) || be_launch(c, k, p, T, &op) ||
            snapshot(c, outs, nouts, run ? second : first))
            goto done;
    }
    const double tol = case_tolerance(p->dtype), ftol = case_tolerance(ATTNRES_DTYPE_F32);
    err = 0;
    if (fetch_compare(c, &do1, "do1", "do1", got, r_do1, T * d, tol, &err) ||
        fetch_compare(c, &db, "dpartial", "dpartial", got, r_db, T * d, tol, &err) ||
        fetch_compare(c, &dlse, "dlse", "dlse", got, r_dlse, T * H, ftol, &err) ||
        fetch_compare(c, &dq, "dquery", "dquery", got, r_dq, d, ftol, &err))
        goto done;
    if (dsub_read && fetch_compare(c, &dsub, "dsublayer", "dsublayer", got, r_dsub, T * d, tol, &err))
        goto done;
    if (want_dgain && fetch_compare(c, &dg, "dout_gain", "dout_gain", got, r_dg, d, ftol, &err))
        goto done;
    expect_same_runs(c, outs, names, nouts, first, second);
    /* T = 0: dquery and d(out_gain) written as zeros, nothing else. */
    const view *sums[2] = {&dq, &dg};
    const char *snames[2] = {"dquery", "dout_gain"};
    expect_empty_launch(c, k, p, &op, sums, snames, want_dgain ? 2 : 1, outs, names, nouts - 2, second, got);
    /* What the problem ignores is left alone, by both launches. */
    if (pr->dsub && !fuse)
        expect_unchanged(c, &dsub, "dsublayer (given without the fused add)");
    if (!want_dgain)
        expect_unchanged(c, &dg, epi ? "dout_gain's buffer (the caller passed none)"
                                     : "dout_gain (given to a problem without the epilogue)");
    /* Inputs are never written. */
    expect_unchanged(c, &o1, "o1 (an input)");
    expect_unchanged(c, &lse, "lse (an input)");
    expect_unchanged(c, &b, "partial (an input)");
    expect_unchanged(c, &q, "query (an input)");
    expect_unchanged(c, &dout, "dout (an input)");
    if (epi) {
        expect_unchanged(c, &g, "out_gain (an input)");
        expect_unchanged(c, &dn, "dnormed (an input)");
    }
done:
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        view_free(all[i]);
    free(r_do1), free(r_db), free(r_dsub), free(r_dlse), free(r_dq), free(r_dg), free(got), free(first),
        free(second);
    return c->why[0] ? INFINITY : err;
}
