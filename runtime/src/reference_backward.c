/* reference_backward.c - the fp64 backward of DESIGN §1b, written for
 * clarity only, next to the forward reference in reference.c.
 *
 * Every function validates all of its arguments before it writes a byte,
 * then walks the tokens in order, recomputing the forward's row statistics
 * and softmax weights from the inputs. Parameter gradients are summed in
 * fp64 in token order, so that two calls on the same inputs agree bit for
 * bit; that order is also the one the kernels' fixed-order second pass is
 * compared against. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "device.h"
#include "rmsnorm_backward.h"

/* ---- messages and checks -------------------------------------------------- */

/* Writes a message to msg when the caller gave room for one, and returns
 * EINVAL, so that a check reads as `return fail(...)`. */
static int fail(char *msg, size_t msg_len, const char *fmt, ...)
{
    if (msg && msg_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_len, fmt, ap);
        va_end(ap);
    }
    return ATTNRES_EINVAL;
}

/* Adopts and checks the caller's problem, and requires the function's op:
 * a phase problem given to the mix backward would be read with another
 * meaning of its fields. */
static int adopt_problem(const attnres_problem *caller, attnres_op op, const char *fn, attnres_problem *own,
                         char *msg, size_t msg_len)
{
    char scratch[8];
    if (!msg || !msg_len) {
        msg = scratch;
        msg_len = sizeof scratch;
    }
    if (ar_problem_adopt(caller, own, msg, msg_len) != ATTNRES_OK)
        return ATTNRES_EINVAL;
    if (attnres_problem_check(own, msg, msg_len) != ATTNRES_OK)
        return ATTNRES_EINVAL;
    /* Every op by its name (ar_op_name): a backward op's problem, given
     * here by mistake, is named too, not read past a table's end. */
    if (own->op != op)
        return fail(msg, msg_len, "%s takes a problem of op %s, not %s", fn, ar_op_name(op), ar_op_name(own->op));
    return ATTNRES_OK;
}

/* The element count a * b * c of a buffer, or -1 when it or its size in
 * bytes is beyond what a pointer difference can hold. */
static int64_t buffer_count(int64_t a, int64_t b, int64_t c)
{
    const int64_t limit = (int64_t)(PTRDIFF_MAX / (ptrdiff_t)sizeof(double));
    if (a < 0 || b < 0 || c < 0)
        return -1;
    if (b != 0 && a > limit / b)
        return -1;
    const int64_t ab = a * b;
    if (c != 0 && ab > limit / c)
        return -1;
    return ab * c;
}

/* Checks T against the largest buffer of a call: per_token elements per
 * token, `times` times over (the sites of phase 1, else 1). */
static int check_tokens(int64_t T, int64_t per_token, int64_t times, char *msg, size_t msg_len)
{
    if (T < 0)
        return fail(msg, msg_len, "T must be at least 0 (got %lld)", (long long)T);
    if (buffer_count(T, per_token, times) < 0)
        return fail(msg, msg_len, "T = %lld tokens make a buffer of %lld x %lld x %lld doubles, more than an address "
                    "range holds", (long long)T, (long long)times, (long long)T, (long long)per_token);
    return ATTNRES_OK;
}

/* The flags every backward knows. ATTNRES_GRAD_DSOURCES_F32 asks for fp32
 * source gradients; the reference's are fp64 already, so a backward with
 * source gradients accepts it and computes the very same values. */
#define KNOWN_FLAGS (ATTNRES_GRAD_ACCUMULATE | ATTNRES_GRAD_DSOURCES_F32)

/* The scalar arguments every backward shares; has_dsources says whether
 * the backward returns source gradients, which ATTNRES_GRAD_DSOURCES_F32
 * needs. */
static int check_common(double eps, int epilogue, double out_eps, unsigned flags, int has_dsources, char *msg,
                        size_t msg_len)
{
    if (!(eps > 0))
        return fail(msg, msg_len, "eps must be greater than 0 (got %g)", eps);
    if (epilogue && !(out_eps > 0))
        return fail(msg, msg_len, "out_eps must be greater than 0 with the epilogue (got %g)", out_eps);
    if (flags & ~KNOWN_FLAGS)
        return fail(msg, msg_len,
                    "unknown flag bits 0x%x (only ATTNRES_GRAD_ACCUMULATE = 0x%x and ATTNRES_GRAD_DSOURCES_F32 = "
                    "0x%x are defined)",
                    flags & ~KNOWN_FLAGS, ATTNRES_GRAD_ACCUMULATE, ATTNRES_GRAD_DSOURCES_F32);
    if (!has_dsources && (flags & ATTNRES_GRAD_DSOURCES_F32))
        return fail(msg, msg_len, "ATTNRES_GRAD_DSOURCES_F32 does not apply: this backward has no source gradients");
    return ATTNRES_OK;
}

/* ---- overlap ---------------------------------------------------------------- */

/* One argument's bytes: [start, end), an output or not, and whether it
 * is a per-token gradient that ATTNRES_GRAD_ACCUMULATE lets share its
 * buffer with another such gradient of the same size. */
typedef struct view {
    const char *name;
    int64_t index; /* element of an array argument (sources[i]), or -1 */
    uintptr_t start, end;
    int output, summable;
} view;

typedef struct view_list {
    view *v;
    int64_t count, cap;
    int bad; /* an extent wrapped around the address space */
} view_list;

/* Adds an argument to the list; a NULL or empty one has no bytes to
 * overlap. Each caller sizes the list for all of its arguments. */
static void view_add(view_list *l, const char *name, int64_t index, const void *p, int64_t count, int output,
                     int summable)
{
    if (!p || count == 0 || l->count == l->cap)
        return;
    const uintptr_t start = (uintptr_t)p, bytes = (uintptr_t)count * sizeof(double);
    if (start + bytes < start) {
        l->bad = 1;
        return;
    }
    l->v[l->count++] = (view){name, index, start, start + bytes, output, summable};
}

static int view_order(const void *a, const void *b)
{
    const view *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* "sources[3]" or "query": a view's name for a message. */
static const char *view_name(const view *v, char *buf, size_t len)
{
    if (v->index < 0)
        return v->name;
    snprintf(buf, len, "%s[%lld]", v->name, (long long)v->index);
    return buf;
}

static int overlap_fail(const view *a, const view *b, char *msg, size_t msg_len)
{
    char na[64], nb[64];
    return fail(msg, msg_len, "%s overlaps %s: a gradient output must share no byte with any other argument",
                view_name(a, na, sizeof na), view_name(b, nb, sizeof nb));
}

/* The epilogue's views, which the mix and phase 2 backward share: out_gain
 * and dout_gain of d values, dnormed of td. */
static void add_epilogue_views(view_list *l, const double *out_gain, const double *dnormed, const double *dout_gain,
                               int64_t d, int64_t td)
{
    view_add(l, "out_gain", -1, out_gain, d, 0, 0);
    view_add(l, "dnormed", -1, dnormed, td, 0, 0);
    view_add(l, "dout_gain", -1, dout_gain, d, 1, 0);
}

/* Checks that no output overlaps an input or another output, with the
 * exception that accumulating allows the same per-token buffer twice.
 * Sorted by start, a view overlaps an earlier one exactly when it starts
 * before the furthest end reached so far, so one sweep that remembers the
 * furthest-reaching input and output finds every conflict: n log n, since
 * N may run to ATTNRES_MAX_N sources. */
static int check_overlaps(view_list *l, int accumulate, char *msg, size_t msg_len)
{
    if (l->bad)
        return fail(msg, msg_len, "an argument's extent runs past the end of the address space");
    qsort(l->v, (size_t)l->count, sizeof *l->v, view_order);
    const view *reach_in = NULL, *reach_out = NULL;
    for (int64_t i = 0; i < l->count; i++) {
        const view *v = &l->v[i];
        if (v->output && reach_in && reach_in->end > v->start)
            return overlap_fail(v, reach_in, msg, msg_len);
        if (reach_out && reach_out->end > v->start) {
            const int same = v->output && accumulate && v->summable && reach_out->summable &&
                             v->start == reach_out->start && v->end == reach_out->end;
            if (!same)
                return overlap_fail(v, reach_out, msg, msg_len);
        }
        const view **reach = v->output ? &reach_out : &reach_in;
        if (!*reach || v->end > (*reach)->end)
            *reach = v;
    }
    return ATTNRES_OK;
}

/* Says that scratch space is lacking, and returns ENOMEM. */
static int out_of_memory(char *msg, size_t msg_len, const char *what)
{
    fail(msg, msg_len, "out of memory for %s", what);
    return ATTNRES_ENOMEM;
}

static int views_alloc(view_list *l, int64_t cap, char *msg, size_t msg_len)
{
    memset(l, 0, sizeof *l);
    l->v = cap > 0 && (uint64_t)cap <= SIZE_MAX / sizeof(view) ? malloc(sizeof(view) * (size_t)cap) : NULL;
    l->cap = cap;
    return l->v ? ATTNRES_OK : out_of_memory(msg, msg_len, "the overlap check");
}

/* Requires each of the n pointers of an array argument. */
static int check_each(const void *const *ptrs, int32_t n, const char *name, char *msg, size_t msg_len)
{
    if (!ptrs)
        return fail(msg, msg_len, "%s is NULL", name);
    for (int32_t i = 0; i < n; i++)
        if (!ptrs[i])
            return fail(msg, msg_len, "%s[%d] is NULL", name, i);
    return ATTNRES_OK;
}

/* A zeroed array of count doubles, the one allocation helper of the file:
 * NULL when count does not fit in a size_t or memory is lacking. */
static double *doubles(int64_t count)
{
    if (count < 0 || (uint64_t)count > SIZE_MAX / sizeof(double))
        return NULL;
    return calloc(count ? (size_t)count : 1, sizeof(double));
}

/* Points each of the n slots at count[i] doubles: ATTNRES_ENOMEM when any
 * allocation fails, the slots then each NULL or allocated, for
 * free_slots. */
static int alloc_slots(double **const slot[], const int64_t count[], int n)
{
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok &= (*slot[i] = doubles(count[i])) != NULL;
    return ok ? ATTNRES_OK : ATTNRES_ENOMEM;
}

static void free_slots(double **const slot[], int n)
{
    for (int i = 0; i < n; i++)
        free(*slot[i]);
}

/* ---- the math of one token ---------------------------------------------- */

static double inv_rms(const double *v, int64_t d, double eps)
{
    double sumsq = 0;
    for (int64_t k = 0; k < d; k++)
        sumsq += v[k] * v[k];
    return 1.0 / sqrt(sumsq / (double)d + eps);
}

/* q[h] = <v, u> over head h's slice, the score without scale and r. */
static void head_dots(const double *v, const double *u, int64_t d, int heads, double *q)
{
    const int64_t hd = d / heads;
    for (int h = 0; h < heads; h++) {
        double dot = 0;
        for (int64_t k = h * hd; k < (h + 1) * hd; k++)
            dot += v[k] * u[k];
        q[h] = dot;
    }
}

/* The forward state of one token against S queries: per source r, and per
 * site j the head dots q[j][n][H] and the softmax weights a[j][n][H]. */
typedef struct attend {
    int n, sites, heads;
    int64_t d;
    double scale, eps;
    double *r, *q, *a, *dz; /* r [n]; q, a, dz [S][n][H] */
    double *row;            /* [d] one source row's gradient */
} attend;

/* The buffers of an attend, in the order attend_alloc sizes them. */
#define ATTEND_SLOTS(at) {&(at)->r, &(at)->q, &(at)->a, &(at)->dz, &(at)->row}

static int attend_alloc(attend *at, const attnres_problem *p, int sites, double scale, double eps)
{
    const int64_t per_site = buffer_count(p->n, p->heads, 1), all = buffer_count(per_site, sites, 1);
    *at = (attend){.n = p->n, .sites = sites, .heads = p->heads, .d = p->d, .scale = scale, .eps = eps};
    if (all < 0)
        return ATTNRES_ENOMEM;
    double **const slot[] = ATTEND_SLOTS(at);
    const int64_t count[] = {p->n, all, all, all, p->d};
    return alloc_slots(slot, count, 5);
}

static void attend_free(attend *at)
{
    double **const slot[] = ATTEND_SLOTS(at);
    free_slots(slot, 5);
}

/* Recomputes r, q and the weights of one token whose source rows are
 * rows[i]; queries holds the S folded queries, [S][d]. */
static void attend_forward(attend *at, const double *const *rows, const double *queries)
{
    const int n = at->n, heads = at->heads;
    for (int i = 0; i < n; i++)
        at->r[i] = inv_rms(rows[i], at->d, at->eps);
    for (int j = 0; j < at->sites; j++) {
        double *q = at->q + (int64_t)j * n * heads, *a = at->a + (int64_t)j * n * heads;
        for (int i = 0; i < n; i++) {
            head_dots(rows[i], queries + (int64_t)j * at->d, at->d, heads, q + i * heads);
            for (int h = 0; h < heads; h++)
                a[i * heads + h] = at->scale * at->r[i] * q[i * heads + h];
        }
        ar_softmax_heads(a, n, heads, NULL);
    }
}

/* The softmax's backward for one site: from gm, the gradient of the mixed
 * row, and dl, that of the log-sum-exp (NULL: zero), the gradient of each
 * score, dz = a (dl + p - delta) with p = <gm, v> per head and delta = the
 * weighted sum of p. Computing delta from the same p that it is taken from
 * makes dz exactly zero for one source, whose weight is exactly 1. */
static void softmax_backward(const attend *at, const double *const *rows, const double *a, const double *gm,
                             const double *dl, double *dz)
{
    const int n = at->n, heads = at->heads;
    for (int i = 0; i < n; i++)
        head_dots(rows[i], gm, at->d, heads, dz + i * heads);
    for (int h = 0; h < heads; h++) {
        double delta = 0;
        for (int i = 0; i < n; i++)
            delta += a[i * heads + h] * dz[i * heads + h];
        const double lse_grad = dl ? dl[h] : 0.0;
        for (int i = 0; i < n; i++)
            dz[i * heads + h] = a[i * heads + h] * (lse_grad + dz[i * heads + h] - delta);
    }
}

/* Adds the gradient that reaches a row v and the query u through the
 * scores s_h = scale r <v, u>_h, given dz_h = dL/ds_h: through u directly,
 * and through r = (mean(v^2) + eps)^-1/2, whose derivative is
 * -r^3 v / d, so every head's score reaches the whole row. */
static void score_backward(const double *v, const double *u, double r, const double *dz, const double *q,
                           double scale, int64_t d, int heads, double *dv, double *du)
{
    const int64_t hd = d / heads;
    double c = 0;
    for (int h = 0; h < heads; h++)
        c += dz[h] * q[h];
    const double radial = r * r * c / (double)d;
    for (int64_t k = 0; k < d; k++) {
        const double z = dz[k / hd];
        dv[k] += scale * r * (z * u[k] - v[k] * radial);
        du[k] += scale * z * r * v[k];
    }
}

/* Writes or adds one row of a per-token gradient. */
static void put_row(double *dst, const double *src, int64_t count, int accumulate)
{
    for (int64_t k = 0; k < count; k++)
        dst[k] = accumulate ? dst[k] + src[k] : src[k];
}

/* The backward of one token through the S site mixes: gm_j = gm + j *
 * gm_site (the gradient of site j's mixed row), dl_j likewise (NULL: no
 * log-sum-exp gradient). Writes or adds dv_i to dv_rows[i] and adds site
 * j's query gradient to du + j * d. */
static void attend_backward(attend *at, const double *const *rows, const double *queries, const double *gm,
                            int64_t gm_site, const double *dl, int64_t dl_site, double *const *dv_rows,
                            int accumulate, double *du)
{
    const int n = at->n, heads = at->heads;
    const int64_t d = at->d, hd = d / heads, per_site = (int64_t)n * heads;
    for (int j = 0; j < at->sites; j++)
        softmax_backward(at, rows, at->a + j * per_site, gm + j * gm_site, dl ? dl + j * dl_site : NULL,
                         at->dz + j * per_site);
    for (int i = 0; i < n; i++) {
        memset(at->row, 0, sizeof(double) * (size_t)d);
        for (int j = 0; j < at->sites; j++) {
            const double *a = at->a + j * per_site + i * heads, *g = gm + j * gm_site;
            for (int64_t k = 0; k < d; k++)
                at->row[k] += a[k / hd] * g[k];
            score_backward(rows[i], queries + j * d, at->r[i], at->dz + j * per_site + i * heads,
                           at->q + j * per_site + i * heads, at->scale, d, heads, at->row, du + j * d);
        }
        put_row(dv_rows[i], at->row, d, accumulate);
    }
}

/* The gradient of a site's output row: dout (or zero) plus the epilogue's
 * share, which needs the output itself. */
static void output_grad(const double *dout_row, const double *dn_row, const double *out, const double *gain,
                        double out_eps, int64_t d, double *g, double *dgain)
{
    for (int64_t k = 0; k < d; k++)
        g[k] = dout_row ? dout_row[k] : 0.0;
    if (dn_row)
        ar_rmsnorm_backward(out, dn_row, gain, out_eps, d, g, dgain);
}

/* ---- mix ------------------------------------------------------------------------ */

/* Scratch rows of the mix and phase 2 backward. */
typedef struct rows {
    double *mix, *out, *g, *gm, *dgain;
} rows;

/* The buffers of a rows, each d doubles. */
#define ROWS_SLOTS(w) {&(w)->mix, &(w)->out, &(w)->g, &(w)->gm, &(w)->dgain}

static int rows_alloc(rows *w, int64_t d)
{
    double **const slot[] = ROWS_SLOTS(w);
    const int64_t count[] = {d, d, d, d, d};
    return alloc_slots(slot, count, 5);
}

static void rows_free(rows *w)
{
    double **const slot[] = ROWS_SLOTS(w);
    free_slots(slot, 5);
}

static int mix_check(const attnres_problem *p, int64_t T, const double *const *sources, const double *query,
                     double eps, const double *partial, const double *out_gain, double out_eps, const double *dout,
                     const double *dnormed, unsigned flags, double *const *dsources, double *dquery,
                     double *dpartial, double *dalpha, double *dout_gain, char *msg, size_t msg_len)
{
    const int additive = p->form == ATTNRES_FORM_ADDITIVE, epi = p->epilogue;
    int rc;
    if ((rc = check_tokens(T, p->d, 1, msg, msg_len)) || (rc = check_common(eps, epi, out_eps, flags, 1, msg, msg_len)))
        return rc;
    if ((rc = check_each((const void *const *)sources, p->n, "sources", msg, msg_len)) ||
        (rc = check_each((const void *const *)dsources, p->n, "dsources", msg, msg_len)))
        return rc;
    if (!query)
        return fail(msg, msg_len, "query is NULL");
    if (!dquery)
        return fail(msg, msg_len, "dquery is NULL");
    if (additive && !partial)
        return fail(msg, msg_len, "partial is NULL (the additive form reads it)");
    if (additive && !dpartial)
        return fail(msg, msg_len, "dpartial is NULL (the additive form returns the gradient of partial)");
    if (epi && !out_gain)
        return fail(msg, msg_len, "out_gain is NULL (the epilogue reads it)");

    const int64_t td = T * p->d;
    view_list l;
    if ((rc = views_alloc(&l, 2 * (int64_t)p->n + 9, msg, msg_len)))
        return rc;
    for (int32_t i = 0; i < p->n; i++) {
        view_add(&l, "sources", i, sources[i], td, 0, 0);
        view_add(&l, "dsources", i, dsources[i], td, 1, 1);
    }
    view_add(&l, "query", -1, query, p->d, 0, 0);
    view_add(&l, "dout", -1, dout, td, 0, 0);
    view_add(&l, "dquery", -1, dquery, p->d, 1, 0);
    if (additive) {
        view_add(&l, "partial", -1, partial, td, 0, 0);
        view_add(&l, "dpartial", -1, dpartial, td, 1, 1);
        view_add(&l, "dalpha", -1, dalpha, 1, 1, 0);
    }
    if (epi)
        add_epilogue_views(&l, out_gain, dnormed, dout_gain, p->d, td);
    rc = check_overlaps(&l, flags & ATTNRES_GRAD_ACCUMULATE, msg, msg_len);
    free(l.v);
    return rc;
}

int attnres_reference_mix_backward(const attnres_problem *caller, int64_t T, const double *const *sources,
                                   const double *query, double scale, double eps, const double *partial,
                                   double alpha, const double *out_gain, double out_eps, const double *dout,
                                   const double *dnormed, unsigned flags, double *const *dsources, double *dquery,
                                   double *dpartial, double *dalpha, double *dout_gain, char *msg, size_t msg_len)
{
    attnres_problem p;
    int rc = adopt_problem(caller, ATTNRES_OP_MIX, "attnres_reference_mix_backward", &p, msg, msg_len);
    if (rc || (rc = mix_check(&p, T, sources, query, eps, partial, out_gain, out_eps, dout, dnormed, flags, dsources,
                              dquery, dpartial, dalpha, dout_gain, msg, msg_len)))
        return rc;
    const int additive = p.form == ATTNRES_FORM_ADDITIVE, epi = p.epilogue, n = p.n, heads = p.heads;
    const int accumulate = (flags & ATTNRES_GRAD_ACCUMULATE) != 0;
    const int64_t d = p.d, hd = d / heads;
    attend at = {0};
    rows w = {0};
    const double **src = malloc(sizeof *src * (size_t)n);
    double **dv = malloc(sizeof *dv * (size_t)n);
    if (!src || !dv || attend_alloc(&at, &p, 1, scale, eps) != ATTNRES_OK || rows_alloc(&w, d) != ATTNRES_OK) {
        rc = out_of_memory(msg, msg_len, "the scratch rows");
        goto done;
    }
    memset(dquery, 0, sizeof(double) * (size_t)d);
    double alpha_grad = 0;
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < n; i++) {
            src[i] = sources[i] + t * d;
            dv[i] = dsources[i] + t * d;
        }
        attend_forward(&at, src, query);
        for (int64_t k = 0; k < d; k++) {
            double mix = 0;
            for (int i = 0; i < n; i++)
                mix += at.a[i * heads + k / hd] * src[i][k];
            w.mix[k] = mix;
            w.out[k] = additive ? partial[t * d + k] + alpha * mix : mix;
        }
        output_grad(dout ? dout + t * d : NULL, epi && dnormed ? dnormed + t * d : NULL, w.out, out_gain, out_eps,
                    d, w.g, w.dgain);
        /* The additive form passes the output's gradient to partial as it
         * is and to the mix scaled by alpha. */
        for (int64_t k = 0; k < d; k++) {
            w.gm[k] = additive ? alpha * w.g[k] : w.g[k];
            if (additive)
                alpha_grad += w.g[k] * w.mix[k];
        }
        if (additive)
            put_row(dpartial + t * d, w.g, d, accumulate);
        attend_backward(&at, src, query, w.gm, 0, NULL, 0, dv, accumulate, dquery);
    }
    if (additive && dalpha)
        *dalpha = alpha_grad;
    if (epi && dout_gain)
        memcpy(dout_gain, w.dgain, sizeof(double) * (size_t)d);
    rc = ATTNRES_OK;
done:
    free(src);
    free(dv);
    attend_free(&at);
    rows_free(&w);
    return rc;
}

/* ---- phase 1 -------------------------------------------------------------------- */

int attnres_reference_phase1_backward(const attnres_problem *caller, int64_t T, const double *const *sources,
                                      const double *queries, double scale, double eps, const double *do1,
                                      const double *dlse, unsigned flags, double *const *dsources,
                                      double *dqueries, char *msg, size_t msg_len)
{
    attnres_problem p;
    int rc = adopt_problem(caller, ATTNRES_OP_PHASE1, "attnres_reference_phase1_backward", &p, msg, msg_len);
    if (rc || (rc = check_tokens(T, p.d, p.s, msg, msg_len)) ||
        (rc = check_common(eps, 0, 0, flags, 1, msg, msg_len)) ||
        (rc = check_each((const void *const *)sources, p.n, "sources", msg, msg_len)) ||
        (rc = check_each((const void *const *)dsources, p.n, "dsources", msg, msg_len)))
        return rc;
    if (!queries)
        return fail(msg, msg_len, "queries is NULL");
    if (!do1)
        return fail(msg, msg_len, "do1 is NULL (pass zeros for sites whose o1 the loss does not read)");
    if (!dqueries)
        return fail(msg, msg_len, "dqueries is NULL");
    const int n = p.n, sites = p.s, heads = p.heads;
    const int64_t d = p.d, td = T * d;
    view_list l;
    if ((rc = views_alloc(&l, 2 * (int64_t)n + 4, msg, msg_len)))
        return rc;
    for (int32_t i = 0; i < n; i++) {
        view_add(&l, "sources", i, sources[i], td, 0, 0);
        view_add(&l, "dsources", i, dsources[i], td, 1, 1);
    }
    view_add(&l, "queries", -1, queries, (int64_t)sites * d, 0, 0);
    view_add(&l, "do1", -1, do1, sites * td, 0, 0);
    view_add(&l, "dlse", -1, dlse, (int64_t)sites * T * heads, 0, 0);
    view_add(&l, "dqueries", -1, dqueries, (int64_t)sites * d, 1, 0);
    rc = check_overlaps(&l, flags & ATTNRES_GRAD_ACCUMULATE, msg, msg_len);
    free(l.v);
    if (rc)
        return rc;

    attend at = {0};
    const double **src = malloc(sizeof *src * (size_t)n);
    double **dv = malloc(sizeof *dv * (size_t)n);
    if (!src || !dv || attend_alloc(&at, &p, sites, scale, eps) != ATTNRES_OK) {
        rc = out_of_memory(msg, msg_len, "the scratch of the sites' weights");
        goto done;
    }
    memset(dqueries, 0, sizeof(double) * (size_t)(sites * d));
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < n; i++) {
            src[i] = sources[i] + t * d;
            dv[i] = dsources[i] + t * d;
        }
        attend_forward(&at, src, queries);
        /* Site j's rows of do1 and dlse are [S][T][.]: a stride of T rows. */
        attend_backward(&at, src, queries, do1 + t * d, td, dlse ? dlse + t * heads : NULL, T * heads, dv,
                        (flags & ATTNRES_GRAD_ACCUMULATE) != 0, dqueries);
    }
    rc = ATTNRES_OK;
done:
    free(src);
    free(dv);
    attend_free(&at);
    return rc;
}

/* ---- phase 2 -------------------------------------------------------------------- */


static int phase2_check(const attnres_problem *p, int64_t T, const double *o1, const double *lse, const double *b,
                        const double *query, double eps, const double *out_gain, double out_eps, const double *dout,
                        const double *dnormed, unsigned flags, double *do1, double *dlse, double *db,
                        double *dsublayer, double *dquery, double *dout_gain, char *msg, size_t msg_len)
{
    int rc;
    if ((rc = check_tokens(T, p->d, 1, msg, msg_len)) ||
        (rc = check_common(eps, p->epilogue, out_eps, flags, 0, msg, msg_len)))
        return rc;
    const struct {
        const void *ptr;
        const char *name;
    } needed[] = {{o1, "o1"}, {lse, "lse"}, {b, "b"}, {query, "query"}, {do1, "do1"}, {dlse, "dlse"},
                  {db, "db"}, {dquery, "dquery"}};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!needed[i].ptr)
            return fail(msg, msg_len, "%s is NULL", needed[i].name);
    if (p->epilogue && !out_gain)
        return fail(msg, msg_len, "out_gain is NULL (the epilogue reads it)");
    const int64_t td = T * p->d, th = T * p->heads;
    view_list l;
    if ((rc = views_alloc(&l, 14, msg, msg_len)))
        return rc;
    view_add(&l, "o1", -1, o1, td, 0, 0);
    view_add(&l, "lse", -1, lse, th, 0, 0);
    view_add(&l, "b", -1, b, td, 0, 0);
    view_add(&l, "query", -1, query, p->d, 0, 0);
    view_add(&l, "dout", -1, dout, td, 0, 0);
    view_add(&l, "do1", -1, do1, td, 1, 1);
    view_add(&l, "dlse", -1, dlse, th, 1, 1);
    view_add(&l, "db", -1, db, td, 1, 1);
    view_add(&l, "dquery", -1, dquery, p->d, 1, 0);
    if (p->fuse_add)
        view_add(&l, "dsublayer", -1, dsublayer, td, 1, 1);
    if (p->epilogue)
        add_epilogue_views(&l, out_gain, dnormed, dout_gain, p->d, td);
    rc = check_overlaps(&l, flags & ATTNRES_GRAD_ACCUMULATE, msg, msg_len);
    free(l.v);
    return rc;
}

int attnres_reference_phase2_backward(const attnres_problem *caller, int64_t T, const double *o1,
                                      const double *lse, const double *b, const double *query, double scale,
                                      double eps, const double *out_gain, double out_eps, const double *dout,
                                      const double *dnormed, unsigned flags, double *do1, double *dlse, double *db,
                                      double *dsublayer, double *dquery, double *dout_gain, char *msg,
                                      size_t msg_len)
{
    attnres_problem p;
    int rc = adopt_problem(caller, ATTNRES_OP_PHASE2, "attnres_reference_phase2_backward", &p, msg, msg_len);
    if (rc || (rc = phase2_check(&p, T, o1, lse, b, query, eps, out_gain, out_eps, dout, dnormed, flags, do1, dlse,
                                 db, dsublayer, dquery, dout_gain, msg, msg_len)))
        return rc;
    const int heads = p.heads, epi = p.epilogue, accumulate = (flags & ATTNRES_GRAD_ACCUMULATE) != 0;
    const int64_t d = p.d, hd = d / heads;
    rows w = {0};
    double *q, *p2, *dx, *dl;
    double **const per_head[] = {&q, &p2, &dx, &dl};
    const int64_t per_head_count[] = {heads, heads, heads, heads};
    if (alloc_slots(per_head, per_head_count, 4) != ATTNRES_OK || rows_alloc(&w, d) != ATTNRES_OK) {
        rc = out_of_memory(msg, msg_len, "the scratch rows");
        goto done;
    }
    memset(dquery, 0, sizeof(double) * (size_t)d);
    for (int64_t t = 0; t < T; t++) {
        const double *bt = b + t * d, *ot = o1 + t * d;
        const double r = inv_rms(bt, d, eps);
        head_dots(bt, query, d, heads, q);
        for (int h = 0; h < heads; h++)
            p2[h] = ar_sigmoid(scale * r * q[h] - lse[t * heads + h]);
        for (int64_t k = 0; k < d; k++)
            w.out[k] = ot[k] + p2[k / hd] * (bt[k] - ot[k]);
        output_grad(dout ? dout + t * d : NULL, epi && dnormed ? dnormed + t * d : NULL, w.out, out_gain, out_eps,
                    d, w.g, w.dgain);
        /* out = o1 + p2 (b - o1): o1 keeps 1 - p2 of the gradient, b gets
         * p2 of it, and p2 = sigmoid(s2 - lse) passes <g, b - o1> on to
         * s2 and, negated, to lse. */
        for (int h = 0; h < heads; h++) {
            double pi = 0;
            for (int64_t k = h * hd; k < (h + 1) * hd; k++)
                pi += w.g[k] * (bt[k] - ot[k]);
            dx[h] = p2[h] * (1.0 - p2[h]) * pi;
            dl[h] = -dx[h];
        }
        for (int64_t k = 0; k < d; k++) {
            w.gm[k] = w.g[k] * (1.0 - p2[k / hd]);
            w.g[k] *= p2[k / hd];
        }
        score_backward(bt, query, r, dx, q, scale, d, heads, w.g, dquery);
        put_row(do1 + t * d, w.gm, d, accumulate);
        put_row(dlse + t * heads, dl, heads, accumulate);
        put_row(db + t * d, w.g, d, accumulate);
        if (p.fuse_add && dsublayer)
            put_row(dsublayer + t * d, w.g, d, accumulate);
    }
    if (epi && dout_gain)
        memcpy(dout_gain, w.dgain, sizeof(double) * (size_t)d);
    rc = ATTNRES_OK;
done:
    free_slots(per_head, 4);
    rows_free(&w);
    return rc;
}

/* ---- the folded query -------------------------------------------------------- */

int attnres_reference_fold_query_backward(const double *du, const double *w, const double *gain, int64_t d,
                                          double *dw, double *dgain, char *msg, size_t msg_len)
{
    if (d < 0 || buffer_count(d, 1, 1) < 0)
        return fail(msg, msg_len, "d must be between 0 and the largest array of doubles (got %lld)", (long long)d);
    if (!du || !w || !dw)
        return fail(msg, msg_len, "%s is NULL", !du ? "du" : !w ? "w" : "dw");
    view_list l;
    if (views_alloc(&l, 5, msg, msg_len) != ATTNRES_OK)
        return ATTNRES_ENOMEM;
    view_add(&l, "du", -1, du, d, 0, 0);
    view_add(&l, "w", -1, w, d, 0, 0);
    view_add(&l, "gain", -1, gain, d, 0, 0);
    view_add(&l, "dw", -1, dw, d, 1, 0);
    view_add(&l, "dgain", -1, dgain, d, 1, 0);
    const int rc = check_overlaps(&l, 0, msg, msg_len);
    free(l.v);
    if (rc)
        return rc;
    /* u = gain * w: each factor's gradient is du times the other factor. */
    for (int64_t k = 0; k < d; k++) {
        dw[k] = gain ? du[k] * gain[k] : du[k];
        if (dgain)
            dgain[k] = du[k] * w[k];
    }
    return ATTNRES_OK;
}
