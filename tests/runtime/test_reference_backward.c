/*
 * test_reference_backward.c - the fp64 backward references of DESIGN §1b
 * (attnres_reference_mix_backward, _phase1_backward, _phase2_backward and
 * _fold_query_backward) against central finite differences of the fp64
 * forward references, which are the authority on what the gradients are.
 *
 * The loss of a case is a fixed random linear function of the forward's
 * outputs, L = <wo, out> + <wn, normed> (phase 1: <wo, o1> + <wl, lse>), so
 * that its incoming gradients are the weights themselves. Every input of
 * the forward is perturbed element by element by +-h, and the analytic
 * gradient must match (L(x + h) - L(x - h)) / 2h to a relative error of
 * FD_TOLERANCE per gradient. The cases cover H = 1 and several heads, both
 * forms, the epilogue, N = 1 (where the score gradient must be exactly
 * zero), phase 1 with and without a log-sum-exp gradient, phase 2 with and
 * without the fused add, and phase 1 + phase 2 chained against the mix
 * over n + 1 sources. Then accumulation, determinism, and what the
 * functions refuse. All of it is small: well under a second.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "check.h"
#include "test_compare.h"
#include "test_data.h"
#include "test_identity.h"

/* Central differences with a step of 1e-5 (relative to the value) leave a
 * truncation error near 1e-10 and a rounding error near 1e-11 on losses of
 * order one; 1e-7 is far above both and far below any wrong term. */
#define FD_TOLERANCE 1e-7
#define FD_STEP 1e-5

/* ---- scratch: every buffer of a case, freed when the case ends ---------- */

#define MAX_BUFFERS 256
static void *buffers[MAX_BUFFERS];
static int nbuffers;

/* A zeroed array of count doubles that lives until scratch_release(); a
 * failed allocation ends the program, which is a test's right. */
static double *scratch(int64_t count)
{
    double *p = calloc(count > 0 ? (size_t)count : 1, sizeof(double));
    if (!p || nbuffers == MAX_BUFFERS) {
        fprintf(stderr, "test scratch exhausted\n");
        exit(1);
    }
    buffers[nbuffers++] = p;
    return p;
}

static void scratch_release(void)
{
    while (nbuffers > 0)
        free(buffers[--nbuffers]);
}

static double *random_array(uint64_t *s, int64_t count, double spread)
{
    double *p = scratch(count);
    for (int64_t i = 0; i < count; i++)
        p[i] = spread * rng_normal(s);
    return p;
}

/* Rows of d values, each scaled by 10^U(-1, 1) as the kernels' tests do,
 * so that r differs from row to row. */
static double *random_rows(uint64_t *s, int64_t rows, int64_t d)
{
    double *p = scratch(rows * d);
    for (int64_t r = 0; r < rows; r++) {
        const double mag = pow(10.0, 2.0 * rng_uniform(s) - 1.0);
        for (int64_t k = 0; k < d; k++)
            p[r * d + k] = mag * rng_normal(s);
    }
    return p;
}

static double *copy_of(const double *src, int64_t count)
{
    double *p = scratch(count);
    memcpy(p, src, sizeof(double) * (size_t)count);
    return p;
}

static double dot(const double *a, const double *b, int64_t count)
{
    double sum = 0;
    for (int64_t i = 0; i < count; i++)
        sum += a[i] * b[i];
    return sum;
}

/* ---- finite differences ------------------------------------------------ */

/* A case's loss as a function of its inputs, which the check perturbs in
 * place through the pointers it was given. */
typedef double (*loss_fn)(void *ctx);

/* Checks one gradient: grad[i] against the central difference of the
 * loss in x[i], for i < count. Restores x exactly. */
static void check_gradient(const char *what, const char *label, loss_fn loss, void *ctx, double *x,
                           const double *grad, int64_t count)
{
    double *fd = scratch(count);
    for (int64_t i = 0; i < count; i++) {
        const double saved = x[i], h = FD_STEP * fmax(1.0, fabs(saved));
        x[i] = saved + h;
        const double up = loss(ctx);
        x[i] = saved - h;
        const double down = loss(ctx);
        x[i] = saved;
        fd[i] = (up - down) / (2 * h);
    }
    const double err = case_rel_err(grad, fd, count);
    CHECK(err < FD_TOLERANCE);
    if (!(err < FD_TOLERANCE))
        fprintf(stderr, "  %s: gradient of %s off its finite difference by %.3g (relative)\n", label, what, err);
}

/* ---- the mix -------------------------------------------------------------- */

typedef struct mix_case {
    const char *label;
    attnres_problem p;
    int64_t T;
    double *src; /* [n][T][d] */
    const double **srcs;
    double *query, *partial, alpha, *gain, scale, eps, out_eps;
    double *wo, *wn;     /* the loss's weights: dout and dnormed */
    double *out, *normed; /* forward outputs */
} mix_case;

static void mix_case_make(mix_case *c, const char *label, int64_t d, int32_t n, int32_t heads, int additive,
                          int epilogue, uint64_t seed)
{
    uint64_t s = seed;
    memset(c, 0, sizeof *c);
    c->label = label;
    attnres_problem_init(&c->p, ATTNRES_DTYPE_F32, d, n);
    c->p.heads = heads;
    c->p.form = additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    c->p.epilogue = epilogue;
    c->T = 3;
    const int64_t td = c->T * d;
    c->src = random_rows(&s, n * c->T, d);
    c->srcs = (const double **)scratch(n);
    for (int i = 0; i < n; i++)
        c->srcs[i] = c->src + i * td;
    /* The scores stay of order one at these sizes: the softmax is neither
     * uniform nor saturated, so every term of the gradient matters. */
    c->query = random_array(&s, d, 0.5);
    c->partial = random_array(&s, td, 1.0);
    c->alpha = additive ? 0.7 : 1.0;
    c->gain = scratch(d);
    for (int64_t k = 0; k < d; k++)
        c->gain[k] = 1.0 + 0.3 * rng_normal(&s);
    c->scale = 0.8;
    c->eps = 1e-5;
    c->out_eps = 1e-4;
    c->wo = random_array(&s, td, 1.0);
    c->wn = random_array(&s, td, 1.0);
    c->out = scratch(td);
    c->normed = scratch(td);
}

static double mix_loss(void *ctx)
{
    mix_case *c = ctx;
    const int64_t td = c->T * c->p.d;
    if (attnres_reference_mix(&c->p, c->T, c->srcs, c->query, c->scale, c->eps, c->partial, c->alpha, c->gain,
                              c->out_eps, c->out, c->normed) != ATTNRES_OK)
        return NAN;
    return dot(c->wo, c->out, td) + (c->p.epilogue ? dot(c->wn, c->normed, td) : 0.0);
}

/* The analytic gradients of a mix case. */
typedef struct mix_grads {
    double *dsrc; /* [n][T][d] */
    double **dsrcs;
    double *dquery, *dpartial, dalpha, *dgain;
} mix_grads;

/* The status of a reference backward of case `label`; a refusal is said
 * with its message, since every case here expects the call to run. */
static int said(int rc, const char *label, const char *op, const char *msg)
{
    if (rc != ATTNRES_OK)
        fprintf(stderr, "  %s: %s backward refused: %s\n", label, op, msg);
    return rc;
}

static int mix_backward(mix_case *c, mix_grads *g, const double *dout, unsigned flags)
{
    const int64_t td = c->T * c->p.d;
    if (!g->dsrc) {
        g->dsrc = scratch(c->p.n * td);
        g->dsrcs = (double **)scratch(c->p.n);
        for (int i = 0; i < c->p.n; i++)
            g->dsrcs[i] = g->dsrc + i * td;
        g->dquery = scratch(c->p.d);
        g->dpartial = scratch(td);
        g->dgain = scratch(c->p.d);
    }
    char msg[256] = "";
    const int rc = attnres_reference_mix_backward(&c->p, c->T, c->srcs, c->query, c->scale, c->eps, c->partial,
                                                  c->alpha, c->gain, c->out_eps, dout, c->wn, flags, g->dsrcs,
                                                  g->dquery, g->dpartial, &g->dalpha, g->dgain, msg, sizeof msg);
    return said(rc, c->label, "mix", msg);
}

/* Checks that two sets of gradients of case c hold the same bits in every
 * array; each caller compares dalpha in its own way. */
static void check_grad_arrays_identical(const mix_case *c, const mix_grads *a, const mix_grads *b)
{
    const int64_t td = c->T * c->p.d;
    CHECK(memcmp(a->dsrc, b->dsrc, sizeof(double) * (size_t)(c->p.n * td)) == 0);
    CHECK(memcmp(a->dquery, b->dquery, sizeof(double) * (size_t)c->p.d) == 0);
    CHECK(memcmp(a->dpartial, b->dpartial, sizeof(double) * (size_t)td) == 0);
    CHECK(memcmp(a->dgain, b->dgain, sizeof(double) * (size_t)c->p.d) == 0);
}

static void check_mix_case(mix_case *c)
{
    const int64_t td = c->T * c->p.d, d = c->p.d;
    mix_grads g = {0};
    REQUIRE(mix_backward(c, &g, c->wo, 0) == ATTNRES_OK);
    check_gradient("the sources", c->label, mix_loss, c, c->src, g.dsrc, c->p.n * td);
    check_gradient("the query", c->label, mix_loss, c, c->query, g.dquery, d);
    if (c->p.form == ATTNRES_FORM_ADDITIVE) {
        check_gradient("partial", c->label, mix_loss, c, c->partial, g.dpartial, td);
        check_gradient("alpha", c->label, mix_loss, c, &c->alpha, &g.dalpha, 1);
    }
    if (c->p.epilogue)
        check_gradient("out_gain", c->label, mix_loss, c, c->gain, g.dgain, d);
}

static void test_mix_backward_matches_finite_differences(void)
{
    static const struct {
        const char *label;
        int32_t n, heads;
        int additive, epilogue;
    } forms[] = {
        {"replace H=1", 3, 1, 0, 0},     {"replace H=4", 4, 4, 0, 0},
        {"replace H=2 epilogue", 3, 2, 0, 1}, {"additive H=1", 2, 1, 1, 0},
        {"additive H=3", 5, 3, 1, 0},    {"additive H=6 epilogue", 4, 6, 1, 1},
        {"N=1 replace", 1, 1, 0, 0},     {"N=1 additive H=4 epilogue", 1, 4, 1, 1},
    };
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        mix_case c;
        mix_case_make(&c, forms[f].label, 12, forms[f].n, forms[f].heads, forms[f].additive, forms[f].epilogue,
                      100 + f);
        check_mix_case(&c);
        scratch_release();
    }
}

/* With one source the softmax weight is exactly 1 and the score gradient
 * exactly 0, so the source's gradient is the mix's gradient to the last bit
 * and the query's is exactly zero: no residue of two rounded sums that
 * should cancel (DESIGN §1b). */
static void test_one_source_has_weight_one_and_no_score_gradient(void)
{
    for (int additive = 0; additive <= 1; additive++)
        for (int heads = 1; heads <= 4; heads *= 4) {
            mix_case c;
            mix_case_make(&c, "N=1", 16, 1, heads, additive, additive, 7 + (uint64_t)heads);
            mix_grads g = {0};
            REQUIRE(mix_backward(&c, &g, c.wo, 0) == ATTNRES_OK);
            const int64_t td = c.T * c.p.d;
            /* Replace form without the epilogue: the mix's gradient is dout.
             * Additive with the epilogue: it is alpha times the output's,
             * which is dpartial. */
            for (int64_t i = 0; i < td; i++)
                CHECK(g.dsrc[i] == (additive ? c.alpha * g.dpartial[i] : c.wo[i]));
            for (int64_t k = 0; k < c.p.d; k++)
                CHECK(g.dquery[k] == 0.0);
            /* The forward agrees: out is the source itself (weight 1). */
            REQUIRE(attnres_reference_mix(&c.p, c.T, c.srcs, c.query, c.scale, c.eps, c.partial, c.alpha, c.gain,
                                          c.out_eps, c.out, c.normed) == ATTNRES_OK);
            for (int64_t i = 0; i < td; i++)
                CHECK(c.out[i] == (additive ? c.partial[i] + c.alpha * c.src[i] : c.src[i]));
            scratch_release();
        }
}

/* A loss that reads only normed may pass dout = NULL: the same gradients
 * as zeros. */
static void test_null_incoming_gradient_is_zero(void)
{
    mix_case c;
    mix_case_make(&c, "dout NULL", 12, 3, 2, 1, 1, 31);
    const int64_t td = c.T * c.p.d;
    mix_grads a = {0}, b = {0};
    double *zeros = scratch(td);
    REQUIRE(mix_backward(&c, &a, NULL, 0) == ATTNRES_OK);
    REQUIRE(mix_backward(&c, &b, zeros, 0) == ATTNRES_OK);
    check_grad_arrays_identical(&c, &a, &b);
    CHECK(a.dalpha == b.dalpha);
    scratch_release();
}

/* ---- phase 1 ------------------------------------------------------------------ */

typedef struct phase1_case {
    const char *label;
    attnres_problem p;
    int64_t T;
    double *src, *queries, scale, eps;
    const double **srcs;
    double *wo, *wl; /* the loss's weights: do1 [S][T][d] and dlse [S][T][H] */
    double *o1, *lse;
} phase1_case;

static void phase1_case_make(phase1_case *c, const char *label, int64_t d, int32_t n, int32_t sites, int32_t heads,
                             uint64_t seed)
{
    uint64_t s = seed;
    memset(c, 0, sizeof *c);
    c->label = label;
    attnres_problem_init(&c->p, ATTNRES_DTYPE_F32, d, n);
    c->p.op = ATTNRES_OP_PHASE1;
    c->p.heads = heads;
    c->p.s = sites;
    c->T = 3;
    c->src = random_rows(&s, n * c->T, d);
    c->srcs = (const double **)scratch(n);
    for (int i = 0; i < n; i++)
        c->srcs[i] = c->src + i * c->T * d;
    c->queries = random_array(&s, sites * d, 0.5);
    c->scale = 0.9;
    c->eps = 1e-5;
    c->wo = random_array(&s, sites * c->T * d, 1.0);
    c->wl = random_array(&s, sites * c->T * heads, 1.0);
    c->o1 = scratch(sites * c->T * d);
    c->lse = scratch(sites * c->T * heads);
}

static double phase1_loss(void *ctx)
{
    phase1_case *c = ctx;
    if (attnres_reference_phase1(&c->p, c->T, c->srcs, c->queries, c->scale, c->eps, c->o1, c->lse) != ATTNRES_OK)
        return NAN;
    return dot(c->wo, c->o1, c->p.s * c->T * c->p.d) + (c->wl ? dot(c->wl, c->lse, c->p.s * c->T * c->p.heads) : 0);
}

static int phase1_backward(phase1_case *c, double *dsrc, double *dqueries, unsigned flags)
{
    double *dsrcs[16];
    for (int i = 0; i < c->p.n; i++)
        dsrcs[i] = dsrc + i * c->T * c->p.d;
    char msg[256] = "";
    const int rc = attnres_reference_phase1_backward(&c->p, c->T, c->srcs, c->queries, c->scale, c->eps, c->wo,
                                                     c->wl, flags, dsrcs, dqueries, msg, sizeof msg);
    return said(rc, c->label, "phase 1", msg);
}

static void test_phase1_backward_matches_finite_differences(void)
{
    static const struct {
        const char *label;
        int32_t n, sites, heads;
        int with_lse;
    } forms[] = {
        {"phase1 n=3 S=2 H=1", 3, 2, 1, 1},
        {"phase1 n=4 S=3 H=3", 4, 3, 3, 1},
        {"phase1 n=1 S=2 H=2", 1, 2, 2, 1},
        {"phase1 n=3 S=2 H=2 no lse gradient", 3, 2, 2, 0},
    };
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        phase1_case c;
        phase1_case_make(&c, forms[f].label, 12, forms[f].n, forms[f].sites, forms[f].heads, 200 + f);
        if (!forms[f].with_lse)
            c.wl = NULL; /* the first site of a block: no phase 2, no lse gradient */
        double *dsrc = scratch(c.p.n * c.T * c.p.d), *dq = scratch(c.p.s * c.p.d);
        REQUIRE(phase1_backward(&c, dsrc, dq, 0) == ATTNRES_OK);
        check_gradient("the sources", c.label, phase1_loss, &c, c.src, dsrc, c.p.n * c.T * c.p.d);
        check_gradient("the queries", c.label, phase1_loss, &c, c.queries, dq, c.p.s * c.p.d);
        scratch_release();
    }
}

/* ---- phase 2 ------------------------------------------------------------------ */

typedef struct phase2_case {
    const char *label;
    attnres_problem p;
    int64_t T;
    double *o1, *lse, *partial, *sublayer, *query, scale, eps, *gain, out_eps;
    double *wo, *wn;
    double *b, *out, *normed; /* the forward's partial sum after the add, and outputs */
} phase2_case;

static void phase2_case_make(phase2_case *c, const char *label, int64_t d, int32_t heads, int fuse, int epilogue,
                             uint64_t seed)
{
    uint64_t s = seed;
    memset(c, 0, sizeof *c);
    c->label = label;
    attnres_problem_init(&c->p, ATTNRES_DTYPE_F32, d, 1);
    c->p.op = ATTNRES_OP_PHASE2;
    c->p.heads = heads;
    c->p.fuse_add = fuse;
    c->p.epilogue = epilogue;
    c->T = 3;
    const int64_t td = c->T * d;
    c->o1 = random_array(&s, td, 1.0);
    /* lse near the scores keeps p2 away from 0 and 1. */
    c->lse = random_array(&s, c->T * heads, 0.7);
    c->partial = random_rows(&s, c->T, d);
    c->sublayer = random_array(&s, td, 0.5);
    c->query = random_array(&s, d, 0.5);
    c->scale = 1.1;
    c->eps = 1e-5;
    c->gain = scratch(d);
    for (int64_t k = 0; k < d; k++)
        c->gain[k] = 1.0 + 0.3 * rng_normal(&s);
    c->out_eps = 1e-4;
    c->wo = random_array(&s, td, 1.0);
    c->wn = random_array(&s, td, 1.0);
    c->b = scratch(td);
    c->out = scratch(td);
    c->normed = scratch(td);
}

/* The forward adds the sublayer into its partial in place, so each
 * evaluation starts from a fresh copy. */
static double phase2_loss(void *ctx)
{
    phase2_case *c = ctx;
    const int64_t td = c->T * c->p.d;
    memcpy(c->b, c->partial, sizeof(double) * (size_t)td);
    if (attnres_reference_phase2(&c->p, c->T, c->o1, c->lse, c->b, c->sublayer, c->query, c->scale, c->eps,
                                 c->gain, c->out_eps, c->out, c->normed) != ATTNRES_OK)
        return NAN;
    return dot(c->wo, c->out, td) + (c->p.epilogue ? dot(c->wn, c->normed, td) : 0.0);
}

typedef struct phase2_grads {
    double *do1, *dlse, *db, *dsub, *dquery, *dgain;
} phase2_grads;

static void phase2_grads_make(phase2_grads *g, const phase2_case *c)
{
    const int64_t td = c->T * c->p.d;
    g->do1 = scratch(td);
    g->dlse = scratch(c->T * c->p.heads);
    g->db = scratch(td);
    g->dsub = scratch(td);
    g->dquery = scratch(c->p.d);
    g->dgain = scratch(c->p.d);
}

/* Runs the forward once (for b after the add), then the backward. */
static int phase2_backward(phase2_case *c, phase2_grads *g, unsigned flags)
{
    char msg[256] = "";
    if (isnan(phase2_loss(c)))
        return ATTNRES_EINVAL;
    const int rc = attnres_reference_phase2_backward(&c->p, c->T, c->o1, c->lse, c->b, c->query, c->scale, c->eps,
                                                     c->gain, c->out_eps, c->wo, c->wn, flags, g->do1, g->dlse,
                                                     g->db, g->dsub, g->dquery, g->dgain, msg, sizeof msg);
    return said(rc, c->label, "phase 2", msg);
}

static void test_phase2_backward_matches_finite_differences(void)
{
    static const struct {
        const char *label;
        int32_t heads;
        int fuse, epilogue;
    } forms[] = {
        {"phase2 H=1", 1, 0, 0},
        {"phase2 H=4 fused add epilogue", 4, 1, 1},
        {"phase2 H=3 fused add", 3, 1, 0},
        {"phase2 H=2 epilogue", 2, 0, 1},
    };
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        phase2_case c;
        phase2_case_make(&c, forms[f].label, 12, forms[f].heads, forms[f].fuse, forms[f].epilogue, 300 + f);
        phase2_grads g;
        phase2_grads_make(&g, &c);
        REQUIRE(phase2_backward(&c, &g, 0) == ATTNRES_OK);
        const int64_t td = c.T * c.p.d;
        check_gradient("o1", c.label, phase2_loss, &c, c.o1, g.do1, td);
        check_gradient("lse", c.label, phase2_loss, &c, c.lse, g.dlse, c.T * c.p.heads);
        check_gradient("the partial sum", c.label, phase2_loss, &c, c.partial, g.db, td);
        check_gradient("the query", c.label, phase2_loss, &c, c.query, g.dquery, c.p.d);
        if (c.p.fuse_add)
            check_gradient("the sublayer", c.label, phase2_loss, &c, c.sublayer, g.dsub, td);
        if (c.p.epilogue)
            check_gradient("out_gain", c.label, phase2_loss, &c, c.gain, g.dgain, c.p.d);
        scratch_release();
    }
}

/* ---- the phases chained against the mix ------------------------------------------- */

/* Phase 1 over n sources then phase 2 with b equals the mix over the n + 1
 * sources with b last; so phase 2's backward (giving do1 and dlse) fed into
 * phase 1's must equal the mix's backward, site by site: the n sources'
 * gradients summed over the sites, b's likewise, each site's query
 * gradient the sum of its two phases', the same gain gradient. The sums
 * over sites go through ATTNRES_GRAD_ACCUMULATE. */
static void check_chain(int32_t n, int32_t sites, int32_t heads, int fuse, int epilogue, uint64_t seed)
{
    const int64_t d = 12, T = 3, td = T * d;
    uint64_t s = seed;
    char label[96];
    snprintf(label, sizeof label, "chain n=%d S=%d H=%d fuse=%d epilogue=%d", n, sites, heads, fuse, epilogue);
    double *src = random_rows(&s, (n + 1) * T, d); /* source n is b, after the add */
    double *queries = random_array(&s, sites * d, 0.5);
    double *partial = random_rows(&s, T, d), *sublayer = random_array(&s, td, 0.5);
    double *gain = random_array(&s, d, 0.3);
    for (int64_t k = 0; k < d; k++)
        gain[k] += 1.0;
    double *wo = random_array(&s, sites * td, 1.0), *wn = random_array(&s, sites * td, 1.0);
    const double scale = 0.8, eps = 1e-5, out_eps = 1e-4;
    double *b = src + n * td;
    for (int64_t i = 0; i < td; i++)
        b[i] = fuse ? partial[i] + sublayer[i] : partial[i];
    const double **srcs = (const double **)scratch(n + 1);
    for (int i = 0; i <= n; i++)
        srcs[i] = src + i * td;

    attnres_problem p1, p2, pm;
    identity_problems(d, n, sites, heads, fuse, epilogue, &p1, &p2, &pm);

    /* The mix, site by site, its source gradients summed over the sites. */
    double *m_dsrc = scratch((n + 1) * td), *m_dq = scratch(sites * d), *m_dgain = scratch(sites * d);
    double **m_dsrcs = (double **)scratch(n + 1);
    for (int i = 0; i <= n; i++)
        m_dsrcs[i] = m_dsrc + i * td;
    char msg[256] = "";
    for (int j = 0; j < sites; j++)
        REQUIRE(attnres_reference_mix_backward(&pm, T, srcs, queries + j * d, scale, eps, NULL, 1, gain, out_eps,
                                               wo + j * td, wn + j * td, ATTNRES_GRAD_ACCUMULATE, m_dsrcs,
                                               m_dq + j * d, NULL, NULL, m_dgain + j * d, msg, sizeof msg) ==
                ATTNRES_OK);

    /* The two phases: forward phase 1, then per site phase 2's backward
     * (db summed over sites), then phase 1's backward with every site's
     * do1 and dlse. */
    double *o1 = scratch(sites * td), *lse = scratch(sites * T * heads);
    REQUIRE(attnres_reference_phase1(&p1, T, srcs, queries, scale, eps, o1, lse) == ATTNRES_OK);
    double *do1 = scratch(sites * td), *dlse = scratch(sites * T * heads), *db = scratch(td), *dsub = scratch(td);
    double *dq2 = scratch(sites * d), *dgain2 = scratch(sites * d);
    for (int j = 0; j < sites; j++)
        REQUIRE(attnres_reference_phase2_backward(&p2, T, o1 + j * td, lse + j * T * heads, b, queries + j * d, scale,
                                                  eps, gain, out_eps, wo + j * td, wn + j * td,
                                                  ATTNRES_GRAD_ACCUMULATE, do1 + j * td, dlse + j * T * heads, db,
                                                  dsub, dq2 + j * d, dgain2 + j * d, msg, sizeof msg) == ATTNRES_OK);
    double *p_dsrc = scratch(n * td), *dq1 = scratch(sites * d);
    double **p_dsrcs = (double **)scratch(n);
    for (int i = 0; i < n; i++)
        p_dsrcs[i] = p_dsrc + i * td;
    REQUIRE(attnres_reference_phase1_backward(&p1, T, srcs, queries, scale, eps, do1, dlse, 0, p_dsrcs, dq1, msg,
                                              sizeof msg) == ATTNRES_OK);
    for (int64_t i = 0; i < sites * d; i++)
        dq1[i] += dq2[i];

    double worst = case_rel_err(p_dsrc, m_dsrc, n * td);
    worst = fmax(worst, case_rel_err(db, m_dsrc + n * td, td));
    worst = fmax(worst, case_rel_err(dq1, m_dq, sites * d));
    if (epilogue)
        worst = fmax(worst, case_rel_err(dgain2, m_dgain, sites * d));
    if (fuse)
        CHECK(memcmp(dsub, db, sizeof(double) * (size_t)td) == 0);
    CHECK(worst < 1e-12);
    if (!(worst < 1e-12))
        fprintf(stderr, "  %s: the phases' gradients differ from the mix's by %.3g (relative)\n", label, worst);
    scratch_release();
}

static void test_phases_chained_equal_the_mix_backward(void)
{
    check_chain(1, 1, 1, 0, 0, 1);
    check_chain(4, 3, 1, 0, 0, 2);
    check_chain(5, 2, 4, 1, 0, 3);
    check_chain(3, 4, 6, 0, 1, 4);
    check_chain(2, 2, 3, 1, 1, 5);
}

/* ---- the folded query ----------------------------------------------------------- */

static void test_fold_query_backward(void)
{
    uint64_t s = 9;
    const int64_t d = 10;
    double *w = random_array(&s, d, 1), *gain = random_array(&s, d, 1), *du = random_array(&s, d, 1);
    double *dw = scratch(d), *dg = scratch(d);
    char msg[128] = "";
    REQUIRE(attnres_reference_fold_query_backward(du, w, gain, d, dw, dg, msg, sizeof msg) == ATTNRES_OK);
    for (int64_t k = 0; k < d; k++)
        CHECK(dw[k] == du[k] * gain[k] && dg[k] == du[k] * w[k]);
    REQUIRE(attnres_reference_fold_query_backward(du, w, NULL, d, dw, NULL, msg, sizeof msg) == ATTNRES_OK);
    for (int64_t k = 0; k < d; k++)
        CHECK(dw[k] == du[k]);
    CHECK(attnres_reference_fold_query_backward(du, w, gain, -1, dw, dg, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "d must be") != NULL);
    CHECK(attnres_reference_fold_query_backward(NULL, w, gain, d, dw, dg, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "du is NULL") != NULL);
    CHECK(attnres_reference_fold_query_backward(du, w, gain, d, du, dg, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "overlaps") != NULL);
    scratch_release();
}

/* ---- accumulation and determinism ------------------------------------------- */

/* ATTNRES_GRAD_ACCUMULATE adds exactly what a write would have written;
 * and where one tensor is two of the sources, the same gradient buffer may
 * be given twice, receiving both gradients. Parameter gradients are
 * written either way. */
static void test_accumulate_adds_what_write_writes(void)
{
    uint64_t s = 41;
    mix_case c;
    mix_case_make(&c, "accumulate", 12, 3, 2, 1, 1, 40);
    const int64_t td = c.T * c.p.d;
    mix_grads wr = {0}, acc = {0};
    REQUIRE(mix_backward(&c, &wr, c.wo, 0) == ATTNRES_OK);
    REQUIRE(mix_backward(&c, &acc, c.wo, 0) == ATTNRES_OK); /* allocates acc's buffers */
    double *base = random_array(&s, c.p.n * td, 1), *pbase = random_array(&s, td, 1);
    memcpy(acc.dsrc, base, sizeof(double) * (size_t)(c.p.n * td));
    memcpy(acc.dpartial, pbase, sizeof(double) * (size_t)td);
    for (int64_t k = 0; k < c.p.d; k++)
        acc.dquery[k] = acc.dgain[k] = 1e9;
    REQUIRE(mix_backward(&c, &acc, c.wo, ATTNRES_GRAD_ACCUMULATE) == ATTNRES_OK);
    for (int64_t i = 0; i < c.p.n * td; i++)
        CHECK(acc.dsrc[i] == base[i] + wr.dsrc[i]);
    for (int64_t i = 0; i < td; i++)
        CHECK(acc.dpartial[i] == pbase[i] + wr.dpartial[i]);
    CHECK(memcmp(acc.dquery, wr.dquery, sizeof(double) * (size_t)c.p.d) == 0);
    CHECK(memcmp(acc.dgain, wr.dgain, sizeof(double) * (size_t)c.p.d) == 0);

    /* Sources 0 and 1 the same tensor, one gradient buffer for both. */
    c.srcs[1] = c.srcs[0];
    mix_grads two = {0};
    REQUIRE(mix_backward(&c, &two, c.wo, 0) == ATTNRES_OK);
    double *shared = copy_of(base, td);
    double *dsrcs[3] = {shared, shared, acc.dsrc + 2 * td};
    char msg[256] = "";
    REQUIRE(attnres_reference_mix_backward(&c.p, c.T, c.srcs, c.query, c.scale, c.eps, c.partial, c.alpha, c.gain,
                                           c.out_eps, c.wo, c.wn, ATTNRES_GRAD_ACCUMULATE, dsrcs, acc.dquery,
                                           acc.dpartial, NULL, NULL, msg, sizeof msg) == ATTNRES_OK);
    for (int64_t i = 0; i < td; i++)
        CHECK(shared[i] == (base[i] + two.dsrc[i]) + two.dsrc[td + i]);
    /* Without the flag the same buffer twice is refused. */
    CHECK(attnres_reference_mix_backward(&c.p, c.T, c.srcs, c.query, c.scale, c.eps, c.partial, c.alpha, c.gain,
                                         c.out_eps, c.wo, c.wn, 0, dsrcs, acc.dquery, acc.dpartial, NULL, NULL, msg,
                                         sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "dsources[0] overlaps dsources[1]") != NULL ||
          strstr(msg, "dsources[1] overlaps dsources[0]") != NULL);
    scratch_release();
}

/* ATTNRES_GRAD_DSOURCES_F32 asks for fp32 source gradients; the
 * reference's are fp64 already, so the mix and phase-1 backwards give
 * the very same bits with it, written or accumulated, and phase 2, which
 * has no source gradients, refuses it. */
static void test_dsources_f32_flag_changes_nothing_in_fp64(void)
{
    const unsigned f32 = ATTNRES_GRAD_DSOURCES_F32, acc = ATTNRES_GRAD_ACCUMULATE;
    mix_case c;
    mix_case_make(&c, "dsources f32", 12, 3, 2, 1, 1, 45);
    const int64_t td = c.T * c.p.d;
    mix_grads plain = {0}, flagged = {0};
    REQUIRE(mix_backward(&c, &plain, c.wo, 0) == ATTNRES_OK);
    REQUIRE(mix_backward(&c, &flagged, c.wo, f32) == ATTNRES_OK);
    CHECK(memcmp(plain.dsrc, flagged.dsrc, sizeof(double) * (size_t)(c.p.n * td)) == 0);
    CHECK(memcmp(plain.dquery, flagged.dquery, sizeof(double) * (size_t)c.p.d) == 0);
    CHECK(memcmp(plain.dpartial, flagged.dpartial, sizeof(double) * (size_t)td) == 0);
    CHECK(plain.dalpha == flagged.dalpha);
    REQUIRE(mix_backward(&c, &plain, c.wo, acc) == ATTNRES_OK);
    REQUIRE(mix_backward(&c, &flagged, c.wo, acc | f32) == ATTNRES_OK);
    CHECK(memcmp(plain.dsrc, flagged.dsrc, sizeof(double) * (size_t)(c.p.n * td)) == 0);
    CHECK(memcmp(plain.dpartial, flagged.dpartial, sizeof(double) * (size_t)td) == 0);

    phase1_case p1;
    phase1_case_make(&p1, "dsources f32 phase1", 8, 3, 2, 2, 46);
    const int64_t p1n = p1.p.n * p1.T * p1.p.d, p1q = p1.p.s * p1.p.d;
    double *ds_a = scratch(p1n), *ds_b = scratch(p1n), *dq_a = scratch(p1q), *dq_b = scratch(p1q);
    REQUIRE(phase1_backward(&p1, ds_a, dq_a, 0) == ATTNRES_OK);
    REQUIRE(phase1_backward(&p1, ds_b, dq_b, f32) == ATTNRES_OK);
    CHECK(memcmp(ds_a, ds_b, sizeof(double) * (size_t)p1n) == 0);
    CHECK(memcmp(dq_a, dq_b, sizeof(double) * (size_t)p1q) == 0);

    phase2_case p2;
    phase2_case_make(&p2, "dsources f32 phase2", 8, 2, 0, 0, 47);
    phase2_grads g2;
    phase2_grads_make(&g2, &p2);
    CHECK(phase2_backward(&p2, &g2, f32) == ATTNRES_EINVAL);
    scratch_release();
}

/* Two calls on the same inputs give bit-identical gradients: the sums over
 * tokens have one fixed order. */
static void test_two_calls_are_bit_identical(void)
{
    mix_case c;
    mix_case_make(&c, "determinism", 12, 4, 3, 1, 1, 50);
    mix_grads a = {0}, b = {0};
    REQUIRE(mix_backward(&c, &a, c.wo, 0) == ATTNRES_OK);
    REQUIRE(mix_backward(&c, &b, c.wo, 0) == ATTNRES_OK);
    check_grad_arrays_identical(&c, &a, &b);
    CHECK(memcmp(&a.dalpha, &b.dalpha, sizeof a.dalpha) == 0);

    phase1_case c1;
    phase1_case_make(&c1, "determinism phase1", 12, 3, 2, 2, 51);
    const int64_t n1 = c1.p.n * c1.T * c1.p.d, q1 = c1.p.s * c1.p.d;
    double *s1 = scratch(n1), *s2 = scratch(n1), *dq1 = scratch(q1), *dq2 = scratch(q1);
    REQUIRE(phase1_backward(&c1, s1, dq1, 0) == ATTNRES_OK);
    REQUIRE(phase1_backward(&c1, s2, dq2, 0) == ATTNRES_OK);
    CHECK(memcmp(s1, s2, sizeof(double) * (size_t)n1) == 0);
    CHECK(memcmp(dq1, dq2, sizeof(double) * (size_t)q1) == 0);

    phase2_case c2;
    phase2_case_make(&c2, "determinism phase2", 12, 4, 1, 1, 52);
    phase2_grads g1, g2;
    phase2_grads_make(&g1, &c2);
    phase2_grads_make(&g2, &c2);
    REQUIRE(phase2_backward(&c2, &g1, 0) == ATTNRES_OK);
    REQUIRE(phase2_backward(&c2, &g2, 0) == ATTNRES_OK);
    const size_t row = sizeof(double) * (size_t)(c2.T * c2.p.d);
    CHECK(memcmp(g1.do1, g2.do1, row) == 0 && memcmp(g1.db, g2.db, row) == 0 && memcmp(g1.dsub, g2.dsub, row) == 0);
    CHECK(memcmp(g1.dlse, g2.dlse, sizeof(double) * (size_t)(c2.T * c2.p.heads)) == 0);
    CHECK(memcmp(g1.dquery, g2.dquery, sizeof(double) * (size_t)c2.p.d) == 0);
    CHECK(memcmp(g1.dgain, g2.dgain, sizeof(double) * (size_t)c2.p.d) == 0);
    scratch_release();
}

/* T = 0 touches no per-token buffer and writes the token sums as zero. */
static void test_no_tokens_writes_zero_parameter_gradients(void)
{
    mix_case c;
    mix_case_make(&c, "T=0", 12, 2, 2, 1, 1, 60);
    mix_grads g = {0};
    REQUIRE(mix_backward(&c, &g, c.wo, 0) == ATTNRES_OK);
    const int64_t td = c.T * c.p.d;
    for (int64_t i = 0; i < c.p.n * td; i++)
        g.dsrc[i] = 5;
    for (int64_t k = 0; k < c.p.d; k++)
        g.dquery[k] = g.dgain[k] = 5;
    g.dalpha = 5;
    c.T = 0;
    REQUIRE(mix_backward(&c, &g, c.wo, 0) == ATTNRES_OK);
    for (int64_t i = 0; i < c.p.n * td; i++)
        CHECK(g.dsrc[i] == 5);
    for (int64_t k = 0; k < c.p.d; k++)
        CHECK(g.dquery[k] == 0 && g.dgain[k] == 0);
    CHECK(g.dalpha == 0);
    scratch_release();
}

/* ---- refusals ---------------------------------------------------------------------- */

#define POISON 12345.0

/* Every output buffer of the refusal cases holds POISON; a refused call
 * must leave it so. */
static int untouched(const double *p, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        if (p[i] != POISON)
            return 0;
    return 1;
}

static double *poisoned(int64_t count)
{
    double *p = scratch(count);
    for (int64_t i = 0; i < count; i++)
        p[i] = POISON;
    return p;
}

/* The arguments of one mix backward call, changed one at a time. */
typedef struct mix_call {
    attnres_problem p;
    int no_problem; /* pass NULL for the problem */
    int64_t T;
    const double *const *sources;
    const double *query, *partial, *gain, *dout, *dnormed;
    double eps, out_eps;
    unsigned flags;
    double *const *dsources;
    double *dquery, *dpartial, *dalpha, *dgain;
} mix_call;

static int mix_call_run(const mix_call *m, char *msg, size_t len)
{
    return attnres_reference_mix_backward(m->no_problem ? NULL : &m->p, m->T, m->sources, m->query, 1.0, m->eps, m->partial, 0.5,
                                          m->gain, m->out_eps, m->dout, m->dnormed, m->flags, m->dsources, m->dquery,
                                          m->dpartial, m->dalpha, m->dgain, msg, len);
}

static void test_mix_backward_refuses_bad_arguments(void)
{
    uint64_t s = 70;
    const int64_t d = 8, T = 2, td = T * d;
    double *src = random_array(&s, 3 * td, 1), *query = random_array(&s, d, 1), *partial = random_array(&s, td, 1);
    double *gain = random_array(&s, d, 1), *dout = random_array(&s, td, 1), *dn = random_array(&s, td, 1);
    double *dsrc = poisoned(3 * td), *dq = poisoned(d), *dp = poisoned(td), *da = poisoned(1), *dg = poisoned(d);
    const double *srcs[3] = {src, src + td, src + 2 * td};
    double *dsrcs[3] = {dsrc, dsrc + td, dsrc + 2 * td};
    mix_call base = {.T = T, .sources = srcs, .query = query, .partial = partial, .gain = gain, .dout = dout,
                     .dnormed = dn, .eps = 1e-6, .out_eps = 1e-6, .dsources = dsrcs, .dquery = dq, .dpartial = dp,
                     .dalpha = da, .dgain = dg};
    attnres_problem_init(&base.p, ATTNRES_DTYPE_F32, d, 3);
    base.p.heads = 2;
    base.p.form = ATTNRES_FORM_ADDITIVE;
    base.p.epilogue = 1;

    const double *bad_srcs[3] = {src, NULL, src + 2 * td};
    double *bad_dsrcs[3] = {dsrc, dsrc + td, NULL};
    double *alias_in[3] = {(double *)src, dsrc + td, dsrc + 2 * td};
    double *alias_out[3] = {dsrc, dsrc, dsrc + 2 * td};
    double *shifted[3] = {dsrc, dsrc + td - 1, dsrc + 2 * td}; /* one double shared */

    struct {
        const char *what, *expect;
        mix_call m;
    } cases[17];
    int ncases = 0;
#define REFUSE(WHAT, EXPECT, ...)                                            \
    do {                                                                     \
        mix_call m_ = base;                                                  \
        __VA_ARGS__;                                                         \
        cases[ncases].what = (WHAT);                                         \
        cases[ncases].expect = (EXPECT);                                     \
        cases[ncases].m = m_;                                                \
        ncases++;                                                            \
    } while (0)
    REFUSE("NULL problem", "problem is NULL", m_.no_problem = 1);
    REFUSE("phase problem", "takes a problem of op mix, not phase2", m_.p.op = ATTNRES_OP_PHASE2, m_.p.n = 1,
           m_.p.form = ATTNRES_FORM_REPLACE);
    /* A backward op's problem (the mix backward's plan problem, say) is
     * named in the message, not looked up past the end of a table. */
    REFUSE("backward op problem", "takes a problem of op mix, not mix_backward", m_.p.op = ATTNRES_OP_MIX_BACKWARD);
    REFUSE("heads not dividing d", "divide d", m_.p.heads = 3);
    REFUSE("negative T", "T must be at least 0", m_.T = -1);
    REFUSE("huge T", "more than an address range", m_.T = INT64_MAX / 4);
    REFUSE("eps 0", "eps must be greater than 0", m_.eps = 0);
    REFUSE("out_eps NaN", "out_eps must be greater than 0", m_.out_eps = NAN);
    REFUSE("unknown flag", "unknown flag bits 0x4", m_.flags = 4);
    REFUSE("NULL source", "sources[1] is NULL", m_.sources = bad_srcs);
    REFUSE("NULL dsource", "dsources[2] is NULL", m_.dsources = bad_dsrcs);
    REFUSE("NULL partial", "partial is NULL", m_.partial = NULL);
    REFUSE("NULL out_gain", "out_gain is NULL", m_.gain = NULL);
    REFUSE("gradient into a source", "overlaps", m_.dsources = alias_in);
    REFUSE("one buffer twice, writing", "overlaps", m_.dsources = alias_out);
    REFUSE("gradients sharing a double", "overlaps", m_.dsources = shifted, m_.flags = ATTNRES_GRAD_ACCUMULATE);
    REFUSE("dalpha inside dquery", "overlaps", m_.dalpha = dq + 3);
#undef REFUSE
    for (int i = 0; i < ncases; i++) {
        char msg[256] = "";
        const int rc = mix_call_run(&cases[i].m, msg, sizeof msg);
        CHECK(rc == ATTNRES_EINVAL);
        CHECK(strstr(msg, cases[i].expect) != NULL);
        if (rc != ATTNRES_EINVAL || !strstr(msg, cases[i].expect))
            fprintf(stderr, "  %s: rc %d, message \"%s\", wanted \"%s\"\n", cases[i].what, rc, msg, cases[i].expect);
        CHECK(untouched(dsrc, 3 * td) && untouched(dq, d) && untouched(dp, td) && untouched(da, 1) &&
              untouched(dg, d));
        /* Without a message buffer the same refusal, and no crash. */
        CHECK(mix_call_run(&cases[i].m, NULL, 99) == ATTNRES_EINVAL);
    }
    /* The base call itself is fine, and what the form does not use may be NULL. */
    char msg[256] = "";
    CHECK(mix_call_run(&base, msg, sizeof msg) == ATTNRES_OK);
    mix_call lean = base;
    lean.p.form = ATTNRES_FORM_REPLACE;
    lean.p.epilogue = 0;
    lean.partial = lean.gain = lean.dnormed = NULL;
    lean.dpartial = lean.dalpha = lean.dgain = NULL;
    CHECK(mix_call_run(&lean, msg, sizeof msg) == ATTNRES_OK);
    scratch_release();
}

static void test_phase_backwards_refuse_bad_arguments(void)
{
    uint64_t s = 80;
    const int64_t d = 8, T = 2, td = T * d;
    const int sites = 2, heads = 2;
    attnres_problem p1, p2;
    attnres_problem_init(&p1, ATTNRES_DTYPE_F32, d, 2);
    p1.op = ATTNRES_OP_PHASE1;
    p1.heads = heads;
    p1.s = sites;
    attnres_problem_init(&p2, ATTNRES_DTYPE_F32, d, 1);
    p2.op = ATTNRES_OP_PHASE2;
    p2.heads = heads;
    p2.epilogue = 1;
    double *src = random_array(&s, 2 * td, 1), *queries = random_array(&s, sites * d, 1);
    double *do1 = random_array(&s, sites * td, 1), *dlse_in = random_array(&s, sites * T * heads, 1);
    double *dsrc = poisoned(2 * td), *dqs = poisoned(sites * d);
    const double *srcs[2] = {src, src + td};
    double *dsrcs[2] = {dsrc, dsrc + td};
    char msg[256] = "";

    CHECK(attnres_reference_phase1_backward(&p2, T, srcs, queries, 1, 1e-6, do1, dlse_in, 0, dsrcs, dqs, msg,
                                            sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "op phase1, not phase2") != NULL);
    CHECK(attnres_reference_phase1_backward(&p1, T, srcs, queries, 1, 1e-6, NULL, dlse_in, 0, dsrcs, dqs, msg,
                                            sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "do1 is NULL") != NULL);
    CHECK(attnres_reference_phase1_backward(&p1, T, srcs, queries, 1, 1e-6, do1, dlse_in, 0, dsrcs, queries, msg,
                                            sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "dqueries overlaps queries") != NULL || strstr(msg, "queries overlaps dqueries") != NULL);
    CHECK(attnres_reference_phase1_backward(&p1, T, srcs, queries, 1, 1e-6, do1, dsrc + 1, 0, dsrcs, dqs, msg,
                                            sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "dlse") != NULL && strstr(msg, "overlaps") != NULL);
    CHECK(untouched(dsrc, 2 * td) && untouched(dqs, sites * d));
    /* The same call with good arguments (and no message buffer) writes. */
    CHECK(attnres_reference_phase1_backward(&p1, T, srcs, queries, 1, 1e-6, do1, dlse_in, 0, dsrcs, dqs, NULL, 0) ==
          ATTNRES_OK);
    CHECK(!untouched(dsrc, 2 * td));

    double *o1 = random_array(&s, td, 1), *lse = random_array(&s, T * heads, 1), *b = random_array(&s, td, 1);
    double *gain = random_array(&s, d, 1), *dout = random_array(&s, td, 1);
    double *g_o1 = poisoned(td), *g_lse = poisoned(T * heads), *g_b = poisoned(td), *g_q = poisoned(d);
    CHECK(attnres_reference_phase2_backward(&p2, T, o1, NULL, b, queries, 1, 1e-6, gain, 1e-6, dout, NULL, 0, g_o1,
                                            g_lse, g_b, NULL, g_q, NULL, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "lse is NULL") != NULL);
    CHECK(attnres_reference_phase2_backward(&p2, T, o1, lse, b, queries, 1, 1e-6, NULL, 1e-6, dout, NULL, 0, g_o1,
                                            g_lse, g_b, NULL, g_q, NULL, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "out_gain is NULL") != NULL);
    CHECK(attnres_reference_phase2_backward(&p2, T, o1, lse, b, queries, 1, 1e-6, gain, 1e-6, dout, NULL, 0, g_o1,
                                            g_lse, b, NULL, g_q, NULL, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "overlaps") != NULL && strstr(msg, "db") != NULL);
    CHECK(attnres_reference_phase2_backward(&p2, T, o1, lse, b, queries, 1, 1e-6, gain, 1e-6, dout, NULL, 0, g_o1,
                                            lse, g_b, NULL, g_q, NULL, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "overlaps") != NULL && strstr(msg, "dlse") != NULL);
    CHECK(attnres_reference_phase2_backward(&p2, -3, o1, lse, b, queries, 1, 1e-6, gain, 1e-6, dout, NULL, 0, g_o1,
                                            g_lse, g_b, NULL, g_q, NULL, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "T must be at least 0") != NULL);
    CHECK(untouched(g_o1, td) && untouched(g_lse, T * heads) && untouched(g_b, td) && untouched(g_q, d));
    scratch_release();
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN_CASE(test_mix_backward_matches_finite_differences);
    RUN_CASE(test_one_source_has_weight_one_and_no_score_gradient);
    RUN_CASE(test_null_incoming_gradient_is_zero);
    RUN_CASE(test_phase1_backward_matches_finite_differences);
    RUN_CASE(test_phase2_backward_matches_finite_differences);
    RUN_CASE(test_phases_chained_equal_the_mix_backward);
    RUN_CASE(test_fold_query_backward);
    RUN_CASE(test_accumulate_adds_what_write_writes);
    RUN_CASE(test_dsources_f32_flag_changes_nothing_in_fp64);
    RUN_CASE(test_two_calls_are_bit_identical);
    RUN_CASE(test_no_tokens_writes_zero_parameter_gradients);
    RUN_CASE(test_mix_backward_refuses_bad_arguments);
    RUN_CASE(test_phase_backwards_refuse_bad_arguments);
    CHECK_EXIT();
}
