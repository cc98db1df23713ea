/*
 * test_mix_backward_case.h - one mix backward problem on random data: its
 * inputs as storage and as the doubles they round to, the fp64 reference
 * gradients, the run's arguments and workspace, and the errors of a run's
 * gradients against the reference (the CPU cases of backend_ops, the API
 * checks of test_mix_backward_api). Header-only, like test_data.h.
 */
#ifndef ATTNRES_TEST_MIX_BACKWARD_CASE_H
#define ATTNRES_TEST_MIX_BACKWARD_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "device.h"
#include "rmsnorm_backward.h"
#include "storage_convert.h"
#include "test_compare.h"
#include "test_data.h"

/* The form bits of bw_case_make: the additive form, the output-norm
 * epilogue, and with it a loss that reads normed alone (dout NULL). */
#define BW_ADDITIVE 1
#define BW_EPILOGUE 2
#define BW_DNORMED_ONLY 4

/* One problem's inputs, as storage and as the doubles they round to, and
 * the reference gradients. */
typedef struct bw_case {
    attnres_problem p;
    int64_t T, stride; /* the token stride of every source and gradient view */
    unsigned flags;
    attnres_dtype gdt; /* the source gradients' type: fp32 with ATTNRES_GRAD_DSOURCES_F32 */
    void *src, *dout, *dsrc, *dpartial, *out, *dnormed;
    const void *rows[8];
    void *drows[8];
    int64_t strides[8];
    float *query, dquery[4096], dalpha, out_gain[4096], dout_gain[4096];
    double *x_src, *x_dout, *x_query, *r_dsrc, *r_dpartial, r_dquery[4096], r_dalpha, r_dout_gain[4096];
    void *workspace;
    size_t workspace_size;
    attnres_mix_backward_args args;
} bw_case;

static inline void bw_case_free(bw_case *c)
{
    free(c->src);
    free(c->dout);
    free(c->dsrc);
    free(c->dpartial);
    free(c->out);
    free(c->dnormed);
    free(c->query);
    free(c->x_src);
    free(c->x_dout);
    free(c->x_query);
    free(c->r_dsrc);
    free(c->r_dpartial);
    free(c->workspace);
    memset(c, 0, sizeof *c);
}

/* ||got - ref|| / ||ref|| of two fp64 vectors; 0 when both are zero. */
static inline double vec_rel_err(const double *got, const double *ref, int64_t count)
{
    double num = 0, den = 0;
    for (int64_t k = 0; k < count; k++) {
        num += (got[k] - ref[k]) * (got[k] - ref[k]);
        den += ref[k] * ref[k];
    }
    return den == 0 ? (num == 0 ? 0 : INFINITY) : sqrt(num / den);
}

/* The epilogue's share of the reference, from the out the kernel reads:
 * the forward's out in fp64 (partial is zeros), rounded to the storage
 * type into c->out and x_out; then in fp64 the gradient of out, dout +
 * the RMSNorm backward of dnormed through that rounded out, into x_do,
 * and d(out_gain) into r_dout_gain. The mix backward of x_do is then the
 * exact gradient of what the kernel is given: a bf16 out's rounding does
 * not blur the comparison. Checked against the reference's own epilogue
 * (which recomputes out in fp64) at the storage type's tolerance. */
static inline int bw_case_epilogue(bw_case *c, const double *const *xrows, const double *zeros, double alpha,
                                   const double *x_dnormed, double *x_out, double *x_do, uint64_t *s)
{
    const attnres_problem *p = &c->p;
    const int64_t d = p->d, T = c->T;
    const attnres_dtype dt = p->dtype;
    attnres_problem fwd = *p;
    fwd.op = ATTNRES_OP_MIX;
    fwd.epilogue = 0;
    double xg[4096];
    for (int64_t k = 0; k < d; k++) {
        c->out_gain[k] = (float)(1.0 + 0.25 * rng_normal(s));
        xg[k] = c->out_gain[k];
    }
    if (attnres_reference_mix(&fwd, T, xrows, c->x_query, 1.0, 1e-6,
                              p->form == ATTNRES_FORM_ADDITIVE ? zeros : NULL, alpha, NULL, 1e-6, x_out, NULL) !=
        ATTNRES_OK)
        return -1;
    memset(c->r_dout_gain, 0, sizeof c->r_dout_gain);
    for (int64_t t = 0; t < T; t++) {
        double *o = x_out + t * d;
        for (int64_t k = 0; k < d; k++) {
            elem_store(dt, c->out, t * c->stride + k, o[k]);
            o[k] = elem_load(dt, c->out, t * c->stride + k);
            x_do[t * d + k] = c->args.dout ? c->x_dout[t * d + k] : 0.0;
        }
        ar_rmsnorm_backward(o, x_dnormed + t * d, xg, 1e-6, d, x_do + t * d, c->r_dout_gain);
    }
    return 0;
}

/* Fills a case with random data (rows of differing magnitude), the
 * gradient buffers with a prior value where accumulating, and computes the
 * reference from the rounded inputs. form holds BW_ADDITIVE, BW_EPILOGUE
 * and BW_DNORMED_ONLY bits (0 or 1 is the replace or additive form).
 * 0 on success. */
static inline int bw_case_make(bw_case *c, attnres_dtype dt, int64_t d, int n, int heads, int form,
                               int64_t T, int64_t pad, unsigned flags, uint64_t seed)
{
    const int additive = (form & BW_ADDITIVE) != 0, epilogue = (form & BW_EPILOGUE) != 0;
    memset(c, 0, sizeof *c);
    attnres_problem_init(&c->p, dt, d, n);
    c->p.op = ATTNRES_OP_MIX_BACKWARD;
    c->p.heads = heads;
    c->p.form = additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    c->p.epilogue = epilogue;
    c->T = T;
    c->stride = d + pad;
    c->flags = flags;
    c->gdt = (flags & ATTNRES_GRAD_DSOURCES_F32) ? ATTNRES_DTYPE_F32 : dt;
    const size_t es = attnres_dtype_size(dt), row = (size_t)(T ? T : 1) * (size_t)c->stride;
    const size_t ges = attnres_dtype_size(c->gdt);
    c->src = calloc((size_t)n * row, es);
    c->dsrc = calloc((size_t)n * row, ges);
    c->dout = calloc(row, es);
    c->dpartial = calloc(row, es);
    c->out = calloc(row, es);
    c->dnormed = calloc(row, es);
    c->query = calloc((size_t)d, 4);
    c->x_src = calloc((size_t)n * (size_t)(T + 1) * (size_t)d, 8);
    c->r_dsrc = calloc((size_t)n * (size_t)(T + 1) * (size_t)d, 8);
    c->x_dout = calloc((size_t)(T + 1) * (size_t)d, 8);
    c->r_dpartial = calloc((size_t)(T + 1) * (size_t)d, 8);
    c->x_query = calloc((size_t)d, 8);
    /* The epilogue's fp64 rows: dnormed, out and the gradient of out. */
    double *x_epi = calloc(3 * (size_t)(T + 1) * (size_t)d, 8);
    if (!c->src || !c->dsrc || !c->dout || !c->dpartial || !c->out || !c->dnormed || !c->query || !c->x_src ||
        !c->r_dsrc || !c->x_dout || !c->r_dpartial || !c->x_query || !x_epi || n > 8 || d > 4096) {
        free(x_epi);
        return -1;
    }
    double *const x_dnormed = x_epi, *const x_out = x_epi + (size_t)(T + 1) * (size_t)d,
                  *const x_do = x_epi + 2 * (size_t)(T + 1) * (size_t)d;
    uint64_t s = seed;
    for (int64_t k = 0; k < d; k++) {
        c->query[k] = (float)(rng_normal(&s) * 4.0 / sqrt((double)d));
        c->x_query[k] = c->query[k];
    }
    const double alpha = 0.75;
    const double *xrows[8];
    double *rrows[8];
    for (int i = 0; i < n; i++) {
        c->rows[i] = (char *)c->src + (size_t)i * row * es;
        c->drows[i] = (char *)c->dsrc + (size_t)i * row * ges;
        c->strides[i] = c->stride;
        xrows[i] = c->x_src + (size_t)i * (size_t)T * (size_t)d;
        rrows[i] = c->r_dsrc + (size_t)i * (size_t)T * (size_t)d;
        for (int64_t t = 0; t < T; t++) {
            const double mag = pow(10.0, 2.0 * rng_uniform(&s) - 1.0);
            for (int64_t k = 0; k < d; k++) {
                elem_store(dt, (void *)c->rows[i], t * c->stride + k, mag * rng_normal(&s));
                c->x_src[(size_t)i * (size_t)T * (size_t)d + (size_t)(t * d + k)] =
                    elem_load(dt, c->rows[i], t * c->stride + k);
                if (flags & ATTNRES_GRAD_ACCUMULATE) {
                    elem_store(c->gdt, c->drows[i], t * c->stride + k, rng_normal(&s));
                    rrows[i][t * d + k] = elem_load(c->gdt, c->drows[i], t * c->stride + k);
                }
            }
        }
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < d; k++) {
            elem_store(dt, c->dout, t * c->stride + k, rng_normal(&s));
            c->x_dout[t * d + k] = elem_load(dt, c->dout, t * c->stride + k);
            if (flags & ATTNRES_GRAD_ACCUMULATE) {
                elem_store(dt, c->dpartial, t * c->stride + k, rng_normal(&s));
                c->r_dpartial[t * d + k] = elem_load(dt, c->dpartial, t * c->stride + k);
            }
            if (epilogue) {
                elem_store(dt, c->dnormed, t * c->stride + k, rng_normal(&s));
                x_dnormed[t * d + k] = elem_load(dt, c->dnormed, t * c->stride + k);
            }
        }
    attnres_mix_backward_args *a = &c->args;
    attnres_mix_backward_args_init(a);
    a->dout = (epilogue && (form & BW_DNORMED_ONLY)) ? NULL : c->dout;
    attnres_problem fwd = c->p;
    fwd.op = ATTNRES_OP_MIX;
    fwd.epilogue = 0;
    char msg[256];
    /* partial's value enters no gradient: zeros stand in for it. */
    double *zeros = calloc((size_t)(T + 1) * (size_t)d, 8);
    int rc = zeros ? ATTNRES_OK : ATTNRES_ENOMEM;
    if (rc == ATTNRES_OK && epilogue && bw_case_epilogue(c, xrows, zeros, alpha, x_dnormed, x_out, x_do, &s) != 0)
        rc = ATTNRES_EINVAL;
    if (rc == ATTNRES_OK)
        rc = attnres_reference_mix_backward(&fwd, T, xrows, c->x_query, 1.0, 1e-6, additive ? zeros : NULL, alpha,
                                            NULL, 1e-6, epilogue ? x_do : c->x_dout, NULL, flags, rrows,
                                            c->r_dquery, additive ? c->r_dpartial : NULL,
                                            additive ? &c->r_dalpha : NULL, NULL, msg, sizeof msg);
    if (rc == ATTNRES_OK && epilogue) {
        /* The reference's own epilogue, which recomputes out in fp64,
         * agrees with the composition above on the sums over tokens
         * (dquery, d(out_gain)) to the storage type's rounding of out. */
        fwd.epilogue = 1;
        double *scratch = calloc((size_t)(n + 1) * (size_t)(T + 1) * (size_t)d + 2 * (size_t)d, 8), *rows_own[8];
        rc = scratch ? ATTNRES_OK : ATTNRES_ENOMEM;
        double *const dq_own = scratch, *const dg_own = scratch + d, xg[4096];
        for (int i = 0; rc == ATTNRES_OK && i < n; i++)
            rows_own[i] = scratch + 2 * d + (size_t)i * (size_t)(T + 1) * (size_t)d;
        for (int64_t k = 0; k < d; k++)
            xg[k] = c->out_gain[k];
        if (rc == ATTNRES_OK)
            rc = attnres_reference_mix_backward(&fwd, T, xrows, c->x_query, 1.0, 1e-6, additive ? zeros : NULL,
                                                alpha, xg, 1e-6, a->dout ? c->x_dout : NULL, x_dnormed, 0, rows_own,
                                                dq_own, additive ? scratch + 2 * d + (size_t)n * (size_t)(T + 1) * (size_t)d : NULL,
                                                NULL, dg_own, msg, sizeof msg);
        const double tol = case_tolerance(dt);
        if (rc == ATTNRES_OK && (vec_rel_err(c->r_dquery, dq_own, d) > tol ||
                                 vec_rel_err(c->r_dout_gain, dg_own, d) > tol)) {
            snprintf(msg, sizeof msg, "the composed epilogue reference is off the reference's own: dquery %.3g, "
                     "d(out_gain) %.3g", vec_rel_err(c->r_dquery, dq_own, d), vec_rel_err(c->r_dout_gain, dg_own, d));
            rc = ATTNRES_EINVAL;
        }
        free(scratch);
    }
    /* The gradient of out that the kernel works from, for dalpha_scale. */
    if (epilogue)
        memcpy(c->x_dout, x_do, sizeof(double) * (size_t)T * (size_t)d);
    free(zeros);
    free(x_epi);
    if (rc != ATTNRES_OK) {
        fprintf(stderr, "reference: %s\n", msg);
        return -1;
    }
    ar_backward_ws ws;
    if (ar_mix_backward_workspace(d, T, epilogue, &ws) != 0)
        return -1;
    c->workspace_size = ws.bytes;
    if (posix_memalign(&c->workspace, 64, c->workspace_size + 64) != 0)
        return -1;
    a->sources = c->rows;
    a->source_strides = c->strides;
    a->query = c->query;
    a->alpha = (float)alpha;
    a->dout_stride = c->stride;
    if (epilogue) {
        a->out = c->out;
        a->out_stride = c->stride;
        a->out_gain = c->out_gain;
        a->out_eps = 1e-6f;
        a->dnormed = c->dnormed;
        a->dnormed_stride = c->stride;
        a->dout_gain = c->dout_gain;
    }
    a->flags = flags;
    a->dsources = c->drows;
    a->dsource_strides = c->strides;
    a->dquery = c->dquery;
    a->dpartial = additive ? c->dpartial : NULL;
    a->dpartial_stride = c->stride;
    a->dalpha = additive ? &c->dalpha : NULL;
    a->workspace = c->workspace;
    a->workspace_size = c->workspace_size;
    return 0;
}

/* ||got - ref|| / ||ref|| over a strided storage buffer. */
static inline double rel_err_storage(attnres_dtype dt, const void *buf, int64_t stride, const double *ref,
                                     int64_t T, int64_t d)
{
    double num = 0, den = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < d; k++) {
            const double diff = elem_load(dt, buf, t * stride + k) - ref[t * d + k];
            num += diff * diff;
            den += ref[t * d + k] * ref[t * d + k];
        }
    return isnan(num) ? NAN : sqrt(num) / (sqrt(den) + 1e-300);
}

/* The size of dalpha's terms (case_dalpha_terms), which its error is
 * held to; bw_case_make makes cases of at most 8 sources. */
static inline double dalpha_scale(const bw_case *c)
{
    const size_t td = (size_t)c->T * (size_t)c->p.d;
    const double *rows[8];
    for (int i = 0; i < c->p.n; i++)
        rows[i] = c->x_src + (size_t)i * td;
    return case_dalpha_terms(rows, c->p.n, c->x_dout, (int64_t)td);
}
/* The errors of a run's gradients against the reference: the worst source
 * gradient's (which), the query's (0 only where it matches an all-zero
 * reference exactly), and in the additive form the partial's and dalpha's,
 * the last relative to the size of its terms (dalpha_scale). */
typedef struct bw_errors {
    double dsrc, dquery, dpartial, dalpha, dout_gain;
    int which;
} bw_errors;

static inline bw_errors bw_case_errors(const bw_case *c)
{
    const attnres_problem *p = &c->p;
    bw_errors e = {0};
    for (int i = 0; i < p->n; i++) {
        const double ei = rel_err_storage(c->gdt, c->drows[i], c->stride,
                                          c->r_dsrc + (size_t)i * (size_t)c->T * (size_t)p->d, c->T, p->d);
        if (isnan(ei) || ei > e.dsrc) { /* a NaN stays the worst */
            e.dsrc = ei;
            e.which = i;
        }
    }
    double num = 0, den = 0;
    for (int64_t k = 0; k < p->d; k++) {
        num += (c->dquery[k] - c->r_dquery[k]) * (c->dquery[k] - c->r_dquery[k]);
        den += c->r_dquery[k] * c->r_dquery[k];
    }
    e.dquery = den == 0 ? (num == 0 ? 0 : INFINITY) : sqrt(num / den);
    if (p->epilogue) {
        double got[4096];
        for (int64_t k = 0; k < p->d; k++)
            got[k] = c->dout_gain[k];
        e.dout_gain = vec_rel_err(got, c->r_dout_gain, p->d);
    }
    if (p->form == ATTNRES_FORM_ADDITIVE) {
        e.dpartial = rel_err_storage(p->dtype, c->dpartial, c->stride, c->r_dpartial, c->T, p->d);
        e.dalpha = fabs(c->dalpha - c->r_dalpha) / dalpha_scale(c);
    }
    return e;
}

#endif
