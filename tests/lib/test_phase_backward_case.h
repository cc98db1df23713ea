/*
 * test_phase_backward_case.h - one phase-1 or phase-2 backward problem
 * (ATTNRES_OP_PHASE1_BACKWARD, ATTNRES_OP_PHASE2_BACKWARD) on random data:
 * its inputs in storage and as the doubles they round to, the fp64
 * reference gradients of those rounded values
 * (attnres_reference_phase1_backward / _phase2_backward), the run's
 * arguments and workspace, and the errors of a run's gradients against
 * the reference (the CPU cases of backend_ops, ops_cpu_phase_backward.c;
 * the API checks of test_phase_backward_api). Header-only, like
 * test_mix_backward_case.h.
 *
 * Every buffer is 64-byte aligned (so that a test can misalign one on
 * purpose) and starts as all-ones bytes, NaN in every dtype: the inputs'
 * padding, which no kernel may read, and every gradient buffer, which a
 * written gradient must fill in its view and leave as it was around it.
 * With ATTNRES_GRAD_ACCUMULATE the gradients' views hold random prior
 * values, which the reference starts from too. Each case's errors say
 * whether a byte outside a gradient's view (its rows' padding, or a buffer
 * the problem ignores) changed.
 */
#ifndef ATTNRES_TEST_PHASE_BACKWARD_CASE_H
#define ATTNRES_TEST_PHASE_BACKWARD_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "device.h"
#include "test_compare.h"
#include "test_data.h"

/* The most sources and sites a case makes. */
#define PB_MAX_N 8
#define PB_MAX_S 8

/* The byte every buffer starts as (NaN in every dtype). */
#define PB_POISON 0xff

/* Options of a case (opts): with ATTNRES_GRAD_ACCUMULATE, phase 1's last
 * source gradient the very same view as its first (one tensor that is two
 * of the sources); phase 2's loss reading normed alone (dout NULL, with the
 * epilogue), dsublayer given (read with the fused add, to be left alone
 * without), d(out_gain) not wanted (NULL). */
#define PB_ALIAS 1
#define PB_DOUT_NULL 2
#define PB_DSUB 4
#define PB_NO_DGAIN 8

/* Phase 1's incoming gradients of lse: none (the array NULL), some sites
 * without one (site 0, a block's first, whose phase 2 does not exist), or
 * one for every site. */
enum { PB_DLSE_NONE, PB_DLSE_SOME, PB_DLSE_ALL };

/* A 64-byte aligned allocation of at least one line. */
static inline void *pb_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? (bytes + 63) / 64 * 64 : 64) != 0)
        return NULL;
    return p;
}

/* A buffer a run writes into, whole (its padding too). */
typedef struct pb_region {
    void *ptr;
    size_t bytes;
} pb_region;

/* ||got - ref|| / ||ref|| of a [rows, width] view of a strided buffer of
 * dtype dt (row r at element r * stride) against ref[rows][width]; the
 * absolute error where ref is all zeros, NaN where got holds one. */
static inline double pb_rel_err(attnres_dtype dt, const void *buf, int64_t stride, const double *ref, int64_t rows,
                                int64_t width)
{
    double num = 0, den = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < width; k++) {
            const double diff = elem_load(dt, buf, r * stride + k) - ref[r * width + k];
            num += diff * diff;
            den += ref[r * width + k] * ref[r * width + k];
        }
    if (isnan(num))
        return NAN;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Whether the bytes of a [rows, stride] buffer of es-byte elements past
 * each row's first width elements still hold the poison. */
static inline int pb_pad_intact(const void *buf, size_t es, int64_t rows, int64_t stride, int64_t width)
{
    const unsigned char *b = buf;
    for (int64_t r = 0; r < rows; r++)
        for (size_t i = (size_t)(r * stride + width) * es; i < (size_t)((r + 1) * stride) * es; i++)
            if (b[i] != PB_POISON)
                return 0;
    return 1;
}

/* Whether all of a buffer's bytes still hold the poison. */
static inline int pb_untouched(const void *buf, size_t bytes)
{
    const unsigned char *b = buf;
    for (size_t i = 0; i < bytes; i++)
        if (b[i] != PB_POISON)
            return 0;
    return 1;
}

/* A draw of mean 0 and variance 1, bell-shaped: the sum of four uniform
 * draws (Irwin-Hall), scaled. Cheaper than rng_normal's logarithm and
 * cosine, which made most of these cases' time; the shape of the tails
 * (none past 3.5) matters to no gradient here. */
static inline double pb_normal(uint64_t *s)
{
    return (rng_uniform(s) + rng_uniform(s) + rng_uniform(s) + rng_uniform(s) - 2.0) * 1.7320508075688772;
}

/* Stores draws of pb_normal times a magnitude into a [rows, width] view
 * (stride) of dtype dt, and the values they round to into
 * exact[rows][width]: mag where positive, else one per row drawn as
 * 10^U(-1,1), so that rows differ by up to 100x (as test_data.h's
 * fill_rows). */
static inline void pb_fill(uint64_t *s, attnres_dtype dt, void *buf, int64_t rows, int64_t width, int64_t stride,
                           double mag, double *exact)
{
    for (int64_t r = 0; r < rows; r++) {
        const double m = mag > 0 ? mag : pow(10.0, 2.0 * rng_uniform(s) - 1.0);
        for (int64_t k = 0; k < width; k++) {
            elem_store(dt, buf, r * stride + k, m * pb_normal(s));
            exact[r * width + k] = elem_load(dt, buf, r * stride + k);
        }
    }
}

/* ------------------------------------------------------------------------
 * Phase 1's backward
 * ---------------------------------------------------------------------- */

typedef struct p1_case {
    attnres_problem p;          /* op ATTNRES_OP_PHASE1_BACKWARD */
    int64_t T, stride, lstride; /* the token stride of sources, do1 and dsources; of dlse */
    unsigned flags;
    int dlse_mode, opts;
    attnres_dtype gdt;          /* the source gradients' dtype: fp32 with ATTNRES_GRAD_DSOURCES_F32 */
    double scale, eps;
    size_t rowbytes, growbytes; /* one source's, one source gradient's buffer */
    void *src, *dsrc, *do1;
    float *dlse, *queries, *dqueries;
    const void *rows[PB_MAX_N];
    void *drows[PB_MAX_N];
    int64_t strides[PB_MAX_N];
    const void *do1s[PB_MAX_S];
    const float *dlses[PB_MAX_S];
    double *x_src, *x_queries, *x_do1, *x_dlse, *r_dsrc, *r_dqueries;
    void *workspace;
    size_t workspace_size;
    pb_region out[2]; /* dsources, dqueries */
    int nout;
    attnres_phase1_backward_args args;
} p1_case;

static inline void p1_case_free(p1_case *c)
{
    void *bufs[] = {c->src, c->dsrc, c->do1, c->dlse, c->queries, c->dqueries, c->x_src, c->x_queries,
                    c->x_do1, c->x_dlse, c->r_dsrc, c->r_dqueries, c->workspace};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    memset(c, 0, sizeof *c);
}

/* Whether site j has an incoming gradient of lse. */
static inline int p1_has_dlse(const p1_case *c, int j)
{
    return c->dlse_mode == PB_DLSE_ALL || (c->dlse_mode == PB_DLSE_SOME && j % 3 != 0);
}

/* Makes a phase-1 backward case: n sources (rows of magnitudes 10^U(-1,1)),
 * S sites' queries, H heads, T tokens, every view pad elements wider than
 * a row (then a scale of 0.9 and an eps of 1e-5, else 1 and 1e-6), the
 * flags, the dlse variation and options. 0 on success; -1 (said on stderr
 * where the reference refused) otherwise. */
static inline int p1_case_make(p1_case *c, attnres_dtype dt, int64_t d, int n, int S, int H, int64_t T, int64_t pad,
                               unsigned flags, int dlse_mode, int opts, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    if (n < 1 || n > PB_MAX_N || S < 1 || S > PB_MAX_S || T < 0 || d < 1 || H < 1)
        return -1;
    attnres_problem_init(&c->p, dt, d, n);
    c->p.op = ATTNRES_OP_PHASE1_BACKWARD;
    c->p.s = S;
    c->p.heads = H;
    c->T = T;
    c->stride = d + pad;
    c->lstride = H + (pad ? 3 : 0);
    c->flags = flags;
    c->dlse_mode = dlse_mode;
    c->opts = opts;
    c->gdt = (flags & ATTNRES_GRAD_DSOURCES_F32) ? ATTNRES_DTYPE_F32 : dt;
    c->scale = pad ? 0.9 : 1.0;
    c->eps = pad ? 1e-5 : 1e-6;
    const int64_t T1 = T ? T : 1;
    const size_t es = attnres_dtype_size(dt), ges = attnres_dtype_size(c->gdt);
    const size_t td = (size_t)T1 * (size_t)d;
    c->rowbytes = (size_t)T1 * (size_t)c->stride * es;
    c->growbytes = (size_t)T1 * (size_t)c->stride * ges;
    const size_t lbytes = (size_t)T1 * (size_t)c->lstride * 4;
    c->src = pb_alloc((size_t)n * c->rowbytes);
    c->dsrc = pb_alloc((size_t)n * c->growbytes);
    c->do1 = pb_alloc((size_t)S * c->rowbytes);
    c->dlse = pb_alloc((size_t)S * lbytes);
    c->queries = pb_alloc((size_t)S * (size_t)d * 4);
    c->dqueries = pb_alloc((size_t)S * (size_t)d * 4);
    c->x_src = calloc((size_t)n * td, 8);
    c->x_queries = calloc((size_t)S * (size_t)d, 8);
    c->x_do1 = calloc((size_t)S * td, 8);
    c->x_dlse = calloc((size_t)S * (size_t)T1 * (size_t)H, 8);
    c->r_dsrc = calloc((size_t)n * td, 8);
    c->r_dqueries = calloc((size_t)S * (size_t)d, 8);
    if (!c->src || !c->dsrc || !c->do1 || !c->dlse || !c->queries || !c->dqueries || !c->x_src || !c->x_queries ||
        !c->x_do1 || !c->x_dlse || !c->r_dsrc || !c->r_dqueries)
        return -1;
    memset(c->src, PB_POISON, (size_t)n * c->rowbytes);
    memset(c->dsrc, PB_POISON, (size_t)n * c->growbytes);
    memset(c->do1, PB_POISON, (size_t)S * c->rowbytes);
    memset(c->dlse, PB_POISON, (size_t)S * lbytes);
    memset(c->dqueries, PB_POISON, (size_t)S * (size_t)d * 4);
    uint64_t s = seed;
    for (int64_t k = 0; k < (int64_t)S * d; k++) {
        c->queries[k] = (float)(pb_normal(&s) * 4.0 / sqrt((double)d));
        c->x_queries[k] = c->queries[k];
    }
    const double *xrows[PB_MAX_N];
    double *rrows[PB_MAX_N];
    for (int i = 0; i < n; i++) {
        c->rows[i] = (char *)c->src + (size_t)i * c->rowbytes;
        c->drows[i] = (char *)c->dsrc + (size_t)i * c->growbytes;
        c->strides[i] = c->stride;
        xrows[i] = c->x_src + (size_t)i * td;
        rrows[i] = c->r_dsrc + (size_t)i * td;
        pb_fill(&s, dt, (void *)c->rows[i], T, d, c->stride, 0, c->x_src + (size_t)i * td);
        if (flags & ATTNRES_GRAD_ACCUMULATE)
            pb_fill(&s, c->gdt, c->drows[i], T, d, c->stride, 1.0, rrows[i]);
    }
    for (int j = 0; j < S; j++) {
        c->do1s[j] = (char *)c->do1 + (size_t)j * c->rowbytes;
        pb_fill(&s, dt, (void *)c->do1s[j], T, d, c->stride, 1.0, c->x_do1 + (size_t)j * td);
        float *dl = (float *)((char *)c->dlse + (size_t)j * lbytes);
        c->dlses[j] = p1_has_dlse(c, j) ? dl : NULL;
        if (c->dlses[j])
            pb_fill(&s, ATTNRES_DTYPE_F32, dl, T, H, c->lstride, 0.5, c->x_dlse + (size_t)j * (size_t)T1 * (size_t)H);
    }
    /* One tensor that is the first and the last source: both gradients
     * are added into the first's view, the last's buffer stays as it was. */
    if ((opts & PB_ALIAS) && (flags & ATTNRES_GRAD_ACCUMULATE) && n >= 2) {
        memset(c->drows[n - 1], PB_POISON, c->growbytes);
        c->drows[n - 1] = c->drows[0];
        rrows[n - 1] = rrows[0];
    }
    attnres_problem fwd = c->p;
    fwd.op = ATTNRES_OP_PHASE1;
    char msg[256];
    const int rc = attnres_reference_phase1_backward(&fwd, T, xrows, c->x_queries, c->scale, c->eps, c->x_do1,
                                                     dlse_mode == PB_DLSE_NONE ? NULL : c->x_dlse, flags, rrows,
                                                     c->r_dqueries, msg, sizeof msg);
    if (rc != ATTNRES_OK) {
        fprintf(stderr, "reference: %s\n", msg);
        return -1;
    }
    ar_backward_ws ws;
    if (ar_mix_backward_workspace(d * S, T, 0, &ws) != 0 || !(c->workspace = pb_alloc(ws.bytes)))
        return -1;
    c->workspace_size = ws.bytes;
    memset(c->workspace, 0x5a, ws.bytes ? ws.bytes : 1);
    attnres_phase1_backward_args *a = &c->args;
    attnres_phase1_backward_args_init(a);
    a->sources = c->rows;
    a->source_strides = pad ? c->strides : NULL;
    a->queries = c->queries;
    a->scale = (float)c->scale;
    a->eps = (float)c->eps;
    a->do1 = c->do1s;
    a->do1_stride = pad ? c->stride : 0;
    a->dlse = dlse_mode == PB_DLSE_NONE ? NULL : c->dlses;
    a->dlse_stride = pad ? c->lstride : 0;
    a->flags = flags;
    a->dsources = c->drows;
    a->dsource_strides = pad ? c->strides : NULL;
    a->dqueries = c->dqueries;
    a->workspace = c->workspace;
    a->workspace_size = c->workspace_size;
    c->out[0] = (pb_region){c->dsrc, (size_t)n * c->growbytes};
    c->out[1] = (pb_region){c->dqueries, (size_t)S * (size_t)d * 4};
    c->nout = 2;
    return 0;
}

/* The errors of a run's gradients: the worst source gradient's (which),
 * the worst site's query gradient (dqueries, each row against its own
 * reference: a site of small gradients is not hidden by the others), and
 * whether every byte outside the gradients' views is as it was (intact). */
typedef struct p1_errors {
    double dsrc, dqueries;
    int which, site, intact;
} p1_errors;

static inline p1_errors p1_case_errors(const p1_case *c)
{
    const attnres_problem *p = &c->p;
    const int64_t d = p->d, T = c->T;
    const int aliased = c->drows[p->n - 1] == c->drows[0] && p->n >= 2;
    p1_errors e = {0, 0, 0, 0, 1};
    for (int i = 0; i < p->n; i++) {
        const void *buf = (const char *)c->dsrc + (size_t)i * c->growbytes;
        if (aliased && i == p->n - 1) { /* never written: the first source's view took its gradient */
            e.intact &= pb_untouched(buf, c->growbytes);
            continue;
        }
        const double ei = pb_rel_err(c->gdt, buf, c->stride, c->r_dsrc + (size_t)i * (size_t)T * (size_t)d, T, d);
        if (isnan(ei) || ei > e.dsrc) { /* a NaN stays the worst */
            e.dsrc = ei;
            e.which = i;
        }
        e.intact &= pb_pad_intact(buf, attnres_dtype_size(c->gdt), T, c->stride, d);
    }
    for (int j = 0; j < p->s; j++) {
        const double ej = pb_rel_err(ATTNRES_DTYPE_F32, c->dqueries + (size_t)j * (size_t)d, d,
                                     c->r_dqueries + (size_t)j * (size_t)d, 1, d);
        if (isnan(ej) || ej > e.dqueries) {
            e.dqueries = ej;
            e.site = j;
        }
    }
    return e;
}

/* ------------------------------------------------------------------------
 * Phase 2's backward
 * ---------------------------------------------------------------------- */

typedef struct p2_case {
    attnres_problem p;          /* op ATTNRES_OP_PHASE2_BACKWARD */
    int64_t T, stride, lstride; /* the token stride of every [T, d] view; of lse and dlse */
    unsigned flags;
    int opts;
    double scale, eps, out_eps;
    size_t rowbytes, lbytes;
    void *o1, *b, *dout, *dnormed, *do1, *db, *dsub;
    float *lse, *dlse, *query, *out_gain, *dquery, *dout_gain;
    double *x_o1, *x_b, *x_lse, *x_dout, *x_dnormed, *x_query, *x_gain;
    double *r_do1, *r_db, *r_dsub, *r_dlse, *r_dquery, *r_dout_gain;
    void *workspace;
    size_t workspace_size;
    pb_region out[6]; /* do1, dlse, dpartial, dsublayer, dquery, dout_gain */
    int nout;
    attnres_phase2_backward_args args;
} p2_case;

static inline void p2_case_free(p2_case *c)
{
    void *bufs[] = {c->o1,     c->b,      c->dout,     c->dnormed, c->do1,     c->db,       c->dsub,
                    c->lse,    c->dlse,   c->query,    c->out_gain, c->dquery, c->dout_gain, c->x_o1,
                    c->x_b,    c->x_lse,  c->x_dout,   c->x_dnormed, c->x_query, c->x_gain, c->r_do1,
                    c->r_db,   c->r_dsub, c->r_dlse,   c->r_dquery, c->r_dout_gain, c->workspace};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    memset(c, 0, sizeof *c);
}

/* Makes a phase-2 backward case: d, H heads, the fused add and the
 * epilogue as given, T tokens, views pad elements wider than a row (then
 * every argument is given, those the problem ignores too, with a scale of
 * 1.1 and epsilons of 1e-5; else only those it reads, scale 1, eps 1e-6),
 * the flags and options. 0 on success. */
static inline int p2_case_make(p2_case *c, attnres_dtype dt, int64_t d, int H, int fuse, int epi, int64_t T,
                               int64_t pad, unsigned flags, int opts, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    if (T < 0 || d < 1 || H < 1)
        return -1;
    attnres_problem_init(&c->p, dt, d, 1);
    c->p.op = ATTNRES_OP_PHASE2_BACKWARD;
    c->p.heads = H;
    c->p.fuse_add = fuse;
    c->p.epilogue = epi;
    c->T = T;
    c->stride = d + pad;
    c->lstride = H + (pad ? 2 : 0);
    c->flags = flags;
    c->opts = opts;
    c->scale = pad ? 1.1 : 1.0;
    c->eps = pad ? 1e-5 : 1e-6;
    c->out_eps = pad ? 1e-5 : 1e-6;
    const int64_t T1 = T ? T : 1;
    const size_t es = attnres_dtype_size(dt), td = (size_t)T1 * (size_t)d, th = (size_t)T1 * (size_t)H;
    c->rowbytes = (size_t)T1 * (size_t)c->stride * es;
    c->lbytes = (size_t)T1 * (size_t)c->lstride * 4;
    void **rowbufs[] = {&c->o1, &c->b, &c->dout, &c->dnormed, &c->do1, &c->db, &c->dsub};
    for (size_t i = 0; i < sizeof rowbufs / sizeof rowbufs[0]; i++)
        if ((*rowbufs[i] = pb_alloc(c->rowbytes)))
            memset(*rowbufs[i], PB_POISON, c->rowbytes);
    float **lbufs[] = {&c->lse, &c->dlse};
    for (size_t i = 0; i < 2; i++)
        if ((*lbufs[i] = pb_alloc(c->lbytes)))
            memset(*lbufs[i], PB_POISON, c->lbytes);
    float **dbufs[] = {&c->query, &c->out_gain, &c->dquery, &c->dout_gain};
    for (size_t i = 0; i < 4; i++)
        if ((*dbufs[i] = pb_alloc((size_t)d * 4)))
            memset(*dbufs[i], PB_POISON, (size_t)d * 4);
    double **xs[] = {&c->x_o1, &c->x_b, &c->x_dout, &c->x_dnormed, &c->r_do1, &c->r_db, &c->r_dsub};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++)
        *xs[i] = calloc(td, 8);
    c->x_lse = calloc(th, 8);
    c->r_dlse = calloc(th, 8);
    double **xd[] = {&c->x_query, &c->x_gain, &c->r_dquery, &c->r_dout_gain};
    for (size_t i = 0; i < 4; i++)
        *xd[i] = calloc((size_t)d, 8);
    if (!c->o1 || !c->b || !c->dout || !c->dnormed || !c->do1 || !c->db || !c->dsub || !c->lse || !c->dlse ||
        !c->query || !c->out_gain || !c->dquery || !c->dout_gain || !c->x_o1 || !c->x_b || !c->x_dout ||
        !c->x_dnormed || !c->r_do1 || !c->r_db || !c->r_dsub || !c->x_lse || !c->r_dlse || !c->x_query ||
        !c->x_gain || !c->r_dquery || !c->r_dout_gain)
        return -1;
    uint64_t s = seed;
    pb_fill(&s, dt, c->o1, T, d, c->stride, 0, c->x_o1);
    pb_fill(&s, dt, c->b, T, d, c->stride, 0, c->x_b);
    pb_fill(&s, dt, c->dout, T, d, c->stride, 1.0, c->x_dout);
    pb_fill(&s, dt, c->dnormed, T, d, c->stride, 1.0, c->x_dnormed);
    /* lse around its typical size, so that p2 = sigmoid(score - lse)
     * spreads over (0, 1). */
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            c->lse[t * c->lstride + h] = (float)(2.0 * pb_normal(&s) + 1.5);
            c->x_lse[t * H + h] = c->lse[t * c->lstride + h];
        }
    for (int64_t k = 0; k < d; k++) {
        c->query[k] = (float)(pb_normal(&s) * 2.0 / sqrt((double)d));
        c->x_query[k] = c->query[k];
        c->out_gain[k] = (float)(1.0 + 0.25 * pb_normal(&s));
        c->x_gain[k] = c->out_gain[k];
    }
    const int dsub_read = fuse && (opts & PB_DSUB);
    if (flags & ATTNRES_GRAD_ACCUMULATE) {
        pb_fill(&s, dt, c->do1, T, d, c->stride, 1.0, c->r_do1);
        pb_fill(&s, dt, c->db, T, d, c->stride, 1.0, c->r_db);
        if (dsub_read)
            pb_fill(&s, dt, c->dsub, T, d, c->stride, 1.0, c->r_dsub);
        pb_fill(&s, ATTNRES_DTYPE_F32, c->dlse, T, H, c->lstride, 1.0, c->r_dlse);
    }
    const int dout_null = epi && (opts & PB_DOUT_NULL), want_dgain = epi && !(opts & PB_NO_DGAIN);
    attnres_problem fwd = c->p;
    fwd.op = ATTNRES_OP_PHASE2;
    char msg[256];
    const int rc = attnres_reference_phase2_backward(
        &fwd, T, c->x_o1, c->x_lse, c->x_b, c->x_query, c->scale, c->eps, epi ? c->x_gain : NULL, c->out_eps,
        dout_null ? NULL : c->x_dout, epi ? c->x_dnormed : NULL, flags, c->r_do1, c->r_dlse, c->r_db,
        dsub_read ? c->r_dsub : NULL, c->r_dquery, want_dgain ? c->r_dout_gain : NULL, msg, sizeof msg);
    if (rc != ATTNRES_OK) {
        fprintf(stderr, "reference: %s\n", msg);
        return -1;
    }
    ar_backward_ws ws;
    if (ar_mix_backward_workspace(d, T, epi, &ws) != 0 || !(c->workspace = pb_alloc(ws.bytes)))
        return -1;
    c->workspace_size = ws.bytes;
    memset(c->workspace, 0x5a, ws.bytes ? ws.bytes : 1);
    attnres_phase2_backward_args *a = &c->args;
    attnres_phase2_backward_args_init(a);
    const int all = pad != 0; /* every argument, those the problem ignores too */
    a->o1 = c->o1;
    a->lse = c->lse;
    a->partial = c->b;
    a->query = c->query;
    a->scale = (float)c->scale;
    a->eps = (float)c->eps;
    a->out_gain = epi || all ? c->out_gain : NULL;
    a->out_eps = (float)c->out_eps;
    a->dout = dout_null ? NULL : c->dout;
    a->dnormed = epi || all ? c->dnormed : NULL;
    a->flags = flags;
    a->do1 = c->do1;
    a->dlse = c->dlse;
    a->dpartial = c->db;
    a->dsublayer = (opts & PB_DSUB) ? c->dsub : NULL;
    a->dquery = c->dquery;
    a->dout_gain = (opts & PB_NO_DGAIN) || !(epi || all) ? NULL : c->dout_gain;
    if (pad) {
        a->o1_stride = a->partial_stride = a->dout_stride = a->dnormed_stride = c->stride;
        a->do1_stride = a->dpartial_stride = a->dsublayer_stride = c->stride;
        a->lse_stride = a->dlse_stride = c->lstride;
    }
    a->workspace = c->workspace;
    a->workspace_size = c->workspace_size;
    c->out[0] = (pb_region){c->do1, c->rowbytes};
    c->out[1] = (pb_region){c->dlse, c->lbytes};
    c->out[2] = (pb_region){c->db, c->rowbytes};
    c->out[3] = (pb_region){c->dsub, c->rowbytes};
    c->out[4] = (pb_region){c->dquery, (size_t)d * 4};
    c->out[5] = (pb_region){c->dout_gain, (size_t)d * 4};
    c->nout = 6;
    return 0;
}

/* The errors of a run's gradients against the reference (dsub and
 * dout_gain 0 where the case does not want them), and whether every byte
 * outside the gradients' views is as it was: the rows' padding, a
 * dsublayer the problem has no fused add for, a d(out_gain) it has no
 * epilogue for or the caller did not ask for. */
typedef struct p2_errors {
    double do1, db, dsub, dlse, dquery, dout_gain;
    int intact;
} p2_errors;

static inline p2_errors p2_case_errors(const p2_case *c)
{
    const attnres_problem *p = &c->p;
    const attnres_dtype dt = p->dtype;
    const size_t es = attnres_dtype_size(dt);
    const int64_t d = p->d, T = c->T, H = p->heads;
    const int dsub_read = p->fuse_add && (c->opts & PB_DSUB), want_dgain = p->epilogue && !(c->opts & PB_NO_DGAIN);
    p2_errors e = {0, 0, 0, 0, 0, 0, 1};
    e.do1 = pb_rel_err(dt, c->do1, c->stride, c->r_do1, T, d);
    e.db = pb_rel_err(dt, c->db, c->stride, c->r_db, T, d);
    e.dlse = pb_rel_err(ATTNRES_DTYPE_F32, c->dlse, c->lstride, c->r_dlse, T, H);
    e.dquery = pb_rel_err(ATTNRES_DTYPE_F32, c->dquery, d, c->r_dquery, 1, d);
    e.intact = pb_pad_intact(c->do1, es, T, c->stride, d) && pb_pad_intact(c->db, es, T, c->stride, d) &&
               pb_pad_intact(c->dlse, 4, T, c->lstride, H);
    if (dsub_read) {
        e.dsub = pb_rel_err(dt, c->dsub, c->stride, c->r_dsub, T, d);
        e.intact &= pb_pad_intact(c->dsub, es, T, c->stride, d);
    } else {
        e.intact &= pb_untouched(c->dsub, c->rowbytes);
    }
    if (want_dgain)
        e.dout_gain = pb_rel_err(ATTNRES_DTYPE_F32, c->dout_gain, d, c->r_dout_gain, 1, d);
    else
        e.intact &= pb_untouched(c->dout_gain, (size_t)d * 4);
    return e;
}

#endif
