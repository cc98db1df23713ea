/*
 * core_phase_backward.c - Plan.phase1_backward and Plan.phase2_backward:
 * the backwards of Block AttnRes' two phases (attnres_run_phase1_backward,
 * attnres_run_phase2_backward), modelled on Plan.mix_backward in
 * core_ops.c, whose helpers they share through core_ops_internal.h.
 *
 * Like the mix backward, each has a body of its own rather than a table of
 * call_op: it folds the gain into the query in the plan's scratch, turns
 * the runtime's gradient of the folded query u = gain * w into those of w
 * and the gain (dw = du * gain, dgain = du * w), lends the runtime the
 * plan's scratch as its workspace (a CUDA plan takes workspace=, a device
 * buffer), may accumulate into the caller's buffers, and runs without the
 * GIL. The arguments are matched by parse_args, so keyword errors read as
 * every other method's.
 */
#include "core_ops_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const dl_dtype f32_dl = {DL_FLOAT, 32, 1};

/* The run_fns of the two ops, for run_timed. */
static int run_phase1_backward(attnres_plan *plan, int64_t t, const void *args, void *stream)
{
    return attnres_run_phase1_backward(plan, t, args, stream);
}

static int run_phase2_backward(attnres_plan *plan, int64_t t, const void *args, void *stream)
{
    return attnres_run_phase2_backward(plan, t, args, stream);
}

/* A [T, width] view of dtype with contiguous rows: borrowed (writable for
 * an output), its shape checked against T (taken from it when *t < 0);
 * its data and token stride out. */
static int borrow_rows(call_ctx *c, PyObject *obj, const char *name, int writable, dl_dtype dtype, int64_t *t,
                       int64_t width, int heads, void **data, int64_t *stride)
{
    view v;
    if (borrow(c, obj, name, 2, writable, &v) || check_kind(c, &v, name, dtype))
        return -1;
    if (*t < 0)
        *t = v.shape[0];
    if (check_shape2(&v, name, *t, width, heads ? "to match (T, H)" : "to match (T, d)") ||
        row_stride(&v, 0, name, stride))
        return -1;
    *data = v.data;
    return 0;
}

/* A writable dense fp32 [rows, d] matrix (dqueries, dgains). */
static int borrow_f32_out_rows(call_ctx *c, PyObject *obj, const char *name, int64_t rows, int64_t d, view *v)
{
    if (borrow(c, obj, name, 2, 1, v) || check_kind(c, v, name, f32_dl))
        return -1;
    if (v->shape[0] != rows || v->shape[1] != d) {
        PyErr_Format(PyExc_ValueError, "%s must have shape (%lld, %lld), got (%lld, %lld)", name, (long long)rows,
                     (long long)d, (long long)v->shape[0], (long long)v->shape[1]);
        return -1;
    }
    if ((d > 1 && v->strides[1] != 1) || (rows > 1 && v->strides[0] != d)) {
        PyErr_Format(PyExc_ValueError, "%s must be contiguous (C order)", name);
        return -1;
    }
    return 0;
}

/* A call's workspace and folded queries: workspace= (a contiguous buffer,
 * needed on CUDA, where the plan's host scratch would not do) or the plan's
 * scratch for the runtime's workspace, and with fold_count > 0 room for
 * that many folded query floats at the start of the scratch (*fold). The
 * caller clears the plan's scratch_busy when *lent, and frees *own. */
static int take_scratch(call_ctx *c, PlanObject *self, PyObject *workspace, int64_t t, const char *fn,
                        size_t fold_count, float **fold, void **ws, size_t *ws_size, void **own, int *lent)
{
    size_t need = 0;
    const int rc = attnres_plan_workspace_size(self->plan, t, &need);
    if (rc != ATTNRES_OK) {
        raise_status(rc, fn, attnres_plan_errmsg(self->plan));
        return -1;
    }
    *fold = NULL;
    if (self->device->is_cuda && workspace == Py_None) {
        /* The plan's scratch is host memory, and a buffer made here could
         * be freed before the asynchronous launch ends. */
        PyErr_Format(PyExc_ValueError,
                     "a CUDA plan needs workspace=: a contiguous device buffer of at least %zu bytes for T = %lld "
                     "(Plan.workspace_size), alive until the launch on its stream completes",
                     need, (long long)t);
        return -1;
    }
    if (workspace != Py_None) {
        view w;
        if (borrow(c, workspace, "workspace", 1, 1, &w))
            return -1;
        if (w.shape[0] > 1 && w.strides[0] != 1) {
            PyErr_SetString(PyExc_ValueError, "workspace must be contiguous");
            return -1;
        }
        *ws = w.data;
        *ws_size = (size_t)w.shape[0] * ((size_t)w.dtype.bits * w.dtype.lanes / 8);
    }
    if (fold_count || !*ws) {
        const size_t u_bytes = fold_count ? round_up64(sizeof(float) * fold_count) : 0;
        /* At least one line: the plan's scratch is NULL until first grown. */
        const size_t bytes = u_bytes + (*ws ? 0 : need);
        char *scratch = lend_scratch(self, bytes ? bytes : 64, own);
        if (!scratch)
            return -1;
        *lent = *own == NULL;
        if (fold_count)
            *fold = (float *)scratch;
        if (!*ws) {
            *ws = scratch + u_bytes;
            *ws_size = need;
        }
    }
    return 0;
}

/* u = gain * w gives dw = du * gain and dgain = du * w. du is in dq,
 * which becomes dw; each element is read before it is written, so a dq
 * that is also the query still gets the right values. No Python object:
 * runs without the GIL. */
static void unfold(float *dq, float *dg, const float *w, const float *gain, int64_t count)
{
    for (int64_t k = 0; k < count; k++) {
        const float du = dq[k], wk = w[k], gk = gain[k];
        dq[k] = du * gk;
        dg[k] = du * wk;
    }
}

/* Says that the plan is for another op. */
static int wrong_op(const PlanObject *self, attnres_op op, const char *fn)
{
    if (self->problem.op == op)
        return 0;
    PyErr_Format(PyExc_ValueError, "%s() called on a plan for op %s (make one with op='%s')", fn,
                 op_names[self->problem.op], fn);
    return -1;
}

/* Refuses the arguments the plan's epilogue or fused add forbid. */
static int refuse_inapplicable(const attnres_problem *p, const arg_spec *args, int nargs, PyObject *const *slots)
{
    for (int i = 0; i < nargs; i++)
        if (!applies(p, args[i].when) && opt(slots[i]) != Py_None) {
            PyErr_Format(PyExc_ValueError, "%s= needs a plan made with %s", args[i].name, when_needs[args[i].when]);
            return -1;
        }
    return 0;
}

/* A flag argument's truth: 0 or 1, -1 with an exception set. */
static int truth(PyObject *slot)
{
    return slot ? PyObject_IsTrue(slot) : 0;
}

/* ---- phase 1 ----------------------------------------------------------------
 * phase1_backward(sources, queries, do1, dlse=None, *, gains=None, ...):
 * the forward's inputs and every site's gradients of o1 and lse. Only the
 * names of the table are read (by parse_args, intern_names and
 * refuse_inapplicable, with `when`). */

enum { P1B_SOURCES, P1B_QUERIES, P1B_DO1, P1B_DLSE, P1B_GAINS, P1B_EPS, P1B_SCALE, P1B_DSOURCES, P1B_DQUERIES,
       P1B_DGAINS, P1B_ACCUMULATE, P1B_DSOURCES_F32, P1B_STREAM, P1B_WORKSPACE, P1B_NARGS };
static arg_spec p1b_args[P1B_NARGS] = {
    [P1B_SOURCES] = {"sources", NULL, K_BANK, W_ALWAYS, 0, 0, -1, 0, 0},
    [P1B_QUERIES] = {"queries", NULL, K_QUERY, W_ALWAYS, F_SITES, 0, P1B_GAINS, 0, 0},
    [P1B_DO1] = {"do1", NULL, K_BANK, W_ALWAYS, F_SITES | F_COMMON, 0, -1, 0, 0},
    [P1B_DLSE] = {"dlse", NULL, K_BANK, W_ALWAYS, F_SITES | F_COMMON | F_F32 | F_HEADS, 0, -1, 0, 0},
    [P1B_GAINS] = {"gains", NULL, K_GAIN, W_ALWAYS, 0, 0, -1, 0, 0},
    [P1B_EPS] = {"eps", NULL, K_FLOAT, W_ALWAYS, F_POSITIVE, 1e-6, -1, 0, 0},
    [P1B_SCALE] = {"scale", NULL, K_FLOAT, W_ALWAYS, 0, 1.0, -1, 0, 0},
    [P1B_DSOURCES] = {"dsources", NULL, K_BANK, W_ALWAYS, F_OUT, 0, -1, 0, 0},
    [P1B_DQUERIES] = {"dqueries", NULL, K_VEC, W_ALWAYS, F_OUT | F_SITES, 0, -1, 0, 0},
    [P1B_DGAINS] = {"dgains", NULL, K_VEC, W_ALWAYS, F_OUT | F_SITES, 0, -1, 0, 0},
    [P1B_ACCUMULATE] = {"accumulate", NULL, K_FLOAT, W_ALWAYS, 0, 0, -1, 0, 0},
    [P1B_DSOURCES_F32] = {"dsources_f32", NULL, K_FLOAT, W_ALWAYS, 0, 0, -1, 0, 0},
    [P1B_STREAM] = {"stream", NULL, K_STREAM, W_ALWAYS, 0, 0, -1, 0, 0},
    [P1B_WORKSPACE] = {"workspace", NULL, K_VEC, W_ALWAYS, F_OUT, 0, -1, 0, 0},
};
/* Four positional arguments, of which dlse may be left out. */
const op_spec phase1_backward_spec = {"phase1_backward", ATTNRES_OP_PHASE1_BACKWARD, 4, P1B_NARGS, p1b_args, NULL,
                                      NULL, {-1, -1}, 3};

PyObject *call_phase1_backward(PlanObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                               long repeat)
{
    const op_spec *spec = &phase1_backward_spec;
    PyObject *a[MAX_ARGS];
    if (parse_args(spec, args, nargs, kwnames, a) || !plan_usable(self) ||
        wrong_op(self, ATTNRES_OP_PHASE1_BACKWARD, spec->fn))
        return NULL;
    const attnres_problem *p = &self->problem;
    PyObject *gains = opt(a[P1B_GAINS]);
    if (self->device->is_cuda && (gains != Py_None || opt(a[P1B_DGAINS]) != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "gains= and dgains= are for CPU plans: a CUDA plan takes the folded "
                                          "queries u = gains * w, and dqueries is the gradient of u (dw = dqueries "
                                          "* gains, dgains = dqueries * w)");
        return NULL;
    }
    attnres_phase1_backward_args r;
    attnres_phase1_backward_args_init(&r);
    if (get_float(a[P1B_EPS], "eps", 1e-6, 1, &r.eps) || get_float(a[P1B_SCALE], "scale", 1.0, 0, &r.scale))
        return NULL;
    const int accumulate = truth(a[P1B_ACCUMULATE]);
    if (accumulate < 0)
        return NULL;
    const int dsrc_f32 = truth(a[P1B_DSOURCES_F32]);
    if (dsrc_f32 < 0)
        return NULL;
    if (accumulate && opt(a[P1B_DSOURCES]) == Py_None) {
        PyErr_SetString(PyExc_ValueError, "accumulate=True adds into the given gradients: pass dsources=");
        return NULL;
    }
    if (opt(a[P1B_DGAINS]) != Py_None && gains == Py_None) {
        PyErr_SetString(PyExc_ValueError, "dgains= is the gradient of gains=, which was not given");
        return NULL;
    }
    r.flags = (accumulate ? ATTNRES_GRAD_ACCUMULATE : 0u) | (dsrc_f32 ? ATTNRES_GRAD_DSOURCES_F32 : 0u);

    call_ctx c;
    ctx_init(&c, self);
    PyObject *result = NULL, *like = NULL, *unused = NULL;
    PyObject *objs[P1B_NARGS] = {NULL};
    const dl_dtype storage = storage_dl(p->dtype);
    const char *sname = attnres_dtype_name(p->dtype);
    int64_t t = -1;
    void *own = NULL, *stream = NULL;
    int lent = 0;
    view q, g, dq, dg;
    void **ptrs, **dptrs, **do1_ptrs, **dlse_ptrs;
    int64_t *strides, *dstrides, *do1_strides, *dlse_strides;
    /* The inputs, then the outputs once every input is known to be good. */
    if (resolve_stream(&c, opt(a[P1B_STREAM]), a[P1B_SOURCES], &stream) ||
        borrow_bank(&c, a[P1B_SOURCES], "sources", p->n, p->d, storage, 0, &t, &ptrs, &strides, &like) ||
        borrow_f32_dense(&c, a[P1B_QUERIES], "queries", 2, p->s, p->d, &q) ||
        (gains != Py_None && borrow_f32_dense(&c, gains, "gains", 2, p->s, p->d, &g)) ||
        borrow_bank(&c, a[P1B_DO1], "do1", p->s, p->d, storage, 0, &t, &do1_ptrs, &do1_strides, &unused) ||
        common_stride(do1_strides, p->s, "do1", &r.do1_stride))
        goto done;
    if (opt(a[P1B_DLSE]) != Py_None) {
        if (borrow_bank(&c, a[P1B_DLSE], "dlse", p->s, p->heads, f32_dl, 0, &t, &dlse_ptrs, &dlse_strides,
                        &unused) ||
            common_stride(dlse_strides, p->s, "dlse", &r.dlse_stride))
            goto done;
        r.dlse = (const float *const *)dlse_ptrs;
    }
    r.sources = (const void *const *)ptrs;
    r.source_strides = strides;
    r.queries = (const float *)q.data;
    r.do1 = (const void *const *)do1_ptrs;
    if (!(objs[P1B_DSOURCES] =
              out_or_new(&c, opt(a[P1B_DSOURCES]), like, dsrc_f32 ? "f32" : sname, 3, p->n, t, p->d)) ||
        borrow_bank(&c, objs[P1B_DSOURCES], "dsources", p->n, p->d, dsrc_f32 ? f32_dl : storage, 1, &t, &dptrs,
                    &dstrides, &unused) ||
        !(objs[P1B_DQUERIES] = out_or_new(&c, opt(a[P1B_DQUERIES]), like, "f32", 2, p->s, p->d, 0)) ||
        borrow_f32_out_rows(&c, objs[P1B_DQUERIES], "dqueries", p->s, p->d, &dq))
        goto done;
    r.dsources = dptrs;
    r.dsource_strides = dstrides;
    r.dqueries = (float *)dq.data;
    if (gains != Py_None && (!(objs[P1B_DGAINS] = out_or_new(&c, opt(a[P1B_DGAINS]), like, "f32", 2, p->s, p->d, 0)) ||
                             borrow_f32_out_rows(&c, objs[P1B_DGAINS], "dgains", p->s, p->d, &dg)))
        goto done;
    const size_t fold_count = gains != Py_None ? (size_t)p->s * (size_t)p->d : 0;
    float *u = NULL;
    if (take_scratch(&c, self, opt(a[P1B_WORKSPACE]), t, spec->fn, fold_count, &u, &r.workspace, &r.workspace_size,
                     &own, &lent))
        goto done;
    if (u) {
        /* The rows are dense, so one element-wise fold covers all S. */
        attnres_fold_query((const float *)q.data, (const float *)g.data, u, (int64_t)fold_count);
        r.queries = u;
    }

    char msg[512];
    attnres_plan *plan = self->plan;
    double wall = 0, cpu = 0;
    int rc;
    plan_begin(self);
    Py_BEGIN_ALLOW_THREADS
    rc = run_timed(run_phase1_backward, plan, t, &r, stream, repeat, &wall, &cpu);
    if (rc != ATTNRES_OK)
        snprintf(msg, sizeof msg, "%s", attnres_plan_errmsg(plan));
    if (rc == ATTNRES_OK && gains != Py_None)
        unfold((float *)dq.data, (float *)dg.data, (const float *)q.data, (const float *)g.data, (int64_t)fold_count);
    Py_END_ALLOW_THREADS
    plan_end(self);
    if (rc != ATTNRES_OK) {
        raise_status(rc, spec->fn, msg);
        goto done;
    }
    if (repeat > 0)
        result = Py_BuildValue("(dd)", wall / (double)repeat, cpu / (double)repeat);
    else
        result = PyTuple_Pack(3, objs[P1B_DSOURCES], objs[P1B_DQUERIES],
                              objs[P1B_DGAINS] ? objs[P1B_DGAINS] : Py_None);
done:
    if (lent)
        self->scratch_busy = 0;
    free(own);
    ctx_free(&c);
    return result;
}

/* ---- phase 2 ----------------------------------------------------------------
 * phase2_backward(o1, lse, partial, query, dout, *, gain=None, ...): the
 * forward's inputs (partial as the forward used it: after the fused add)
 * and the gradients of out and, with the epilogue, normed. */

enum { P2B_O1, P2B_LSE, P2B_PARTIAL, P2B_QUERY, P2B_DOUT, P2B_GAIN, P2B_EPS, P2B_SCALE, P2B_OUT_GAIN, P2B_OUT_EPS,
       P2B_DNORMED, P2B_DO1, P2B_DLSE, P2B_DPARTIAL, P2B_DSUBLAYER, P2B_DQUERY, P2B_DGAIN, P2B_DOUT_GAIN,
       P2B_ACCUMULATE, P2B_STREAM, P2B_WORKSPACE, P2B_NARGS };
static arg_spec p2b_args[P2B_NARGS] = {
    [P2B_O1] = {"o1", NULL, K_ROWS, W_ALWAYS, 0, 0, -1, 0, 0},
    [P2B_LSE] = {"lse", NULL, K_ROWS, W_ALWAYS, F_F32 | F_HEADS, 0, -1, 0, 0},
    [P2B_PARTIAL] = {"partial", NULL, K_ROWS, W_ALWAYS, 0, 0, -1, 0, 0},
    [P2B_QUERY] = {"query", NULL, K_QUERY, W_ALWAYS, 0, 0, P2B_GAIN, 0, 0},
    [P2B_DOUT] = {"dout", NULL, K_ROWS, W_ALWAYS, 0, 0, -1, 0, 0},
    [P2B_GAIN] = {"gain", NULL, K_GAIN, W_ALWAYS, 0, 0, -1, 0, 0},
    [P2B_EPS] = {"eps", NULL, K_FLOAT, W_ALWAYS, F_POSITIVE, 1e-6, -1, 0, 0},
    [P2B_SCALE] = {"scale", NULL, K_FLOAT, W_ALWAYS, 0, 1.0, -1, 0, 0},
    /* The output-norm epilogue: the forward's gain, and the gradient of
     * normed; dout may then be None. */
    [P2B_OUT_GAIN] = {"out_gain", NULL, K_VEC, W_EPILOGUE, 0, 0, -1, 0, 0},
    [P2B_OUT_EPS] = {"out_eps", NULL, K_FLOAT, W_EPILOGUE, F_POSITIVE, 1e-6, -1, 0, 0},
    [P2B_DNORMED] = {"dnormed", NULL, K_ROWS, W_EPILOGUE, 0, 0, -1, 0, 0},
    [P2B_DO1] = {"do1", NULL, K_ROWS, W_ALWAYS, F_OUT, 0, -1, 0, 0},
    [P2B_DLSE] = {"dlse", NULL, K_ROWS, W_ALWAYS, F_OUT | F_F32 | F_HEADS, 0, -1, 0, 0},
    [P2B_DPARTIAL] = {"dpartial", NULL, K_ROWS, W_ALWAYS, F_OUT, 0, -1, 0, 0},
    /* fuse_add: the gradient of the sublayer output, the same values as
     * dpartial; filled only when given. */
    [P2B_DSUBLAYER] = {"dsublayer", NULL, K_ROWS, W_FUSE_ADD, F_OUT, 0, -1, 0, 0},
    [P2B_DQUERY] = {"dquery", NULL, K_VEC, W_ALWAYS, F_OUT, 0, -1, 0, 0},
    [P2B_DGAIN] = {"dgain", NULL, K_VEC, W_ALWAYS, F_OUT, 0, -1, 0, 0},
    [P2B_DOUT_GAIN] = {"dout_gain", NULL, K_VEC, W_EPILOGUE, F_OUT, 0, -1, 0, 0},
    [P2B_ACCUMULATE] = {"accumulate", NULL, K_FLOAT, W_ALWAYS, 0, 0, -1, 0, 0},
    [P2B_STREAM] = {"stream", NULL, K_STREAM, W_ALWAYS, 0, 0, -1, 0, 0},
    [P2B_WORKSPACE] = {"workspace", NULL, K_VEC, W_ALWAYS, F_OUT, 0, -1, 0, 0},
};
const op_spec phase2_backward_spec = {"phase2_backward", ATTNRES_OP_PHASE2_BACKWARD, 5, P2B_NARGS, p2b_args, NULL,
                                      NULL, {-1, -1}, 0};

PyObject *call_phase2_backward(PlanObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                               long repeat)
{
    const op_spec *spec = &phase2_backward_spec;
    PyObject *a[MAX_ARGS];
    if (parse_args(spec, args, nargs, kwnames, a) || !plan_usable(self) ||
        wrong_op(self, ATTNRES_OP_PHASE2_BACKWARD, spec->fn))
        return NULL;
    const attnres_problem *p = &self->problem;
    const int epilogue = p->epilogue != 0;
    PyObject *gain = opt(a[P2B_GAIN]);
    if (self->device->is_cuda && (gain != Py_None || opt(a[P2B_DGAIN]) != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "gain= and dgain= are for CPU plans: a CUDA plan takes the folded query "
                                          "u = gain * w, and dquery is the gradient of u (dw = dquery * gain, "
                                          "dgain = dquery * w)");
        return NULL;
    }
    if (refuse_inapplicable(p, p2b_args, P2B_NARGS, a))
        return NULL;
    attnres_phase2_backward_args r;
    attnres_phase2_backward_args_init(&r);
    if (get_float(a[P2B_EPS], "eps", 1e-6, 1, &r.eps) || get_float(a[P2B_SCALE], "scale", 1.0, 0, &r.scale) ||
        (epilogue && get_float(a[P2B_OUT_EPS], "out_eps", 1e-6, 1, &r.out_eps)))
        return NULL;
    if (epilogue && (opt(a[P2B_OUT_GAIN]) == Py_None || opt(a[P2B_DNORMED]) == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "a plan with the epilogue needs out_gain= and dnormed= (the gradient of "
                                          "normed)");
        return NULL;
    }
    if (!epilogue && opt(a[P2B_DOUT]) == Py_None) {
        PyErr_SetString(PyExc_ValueError, "dout must not be None (only a plan with the epilogue, given dnormed=, "
                                          "may do without)");
        return NULL;
    }
    const int accumulate = truth(a[P2B_ACCUMULATE]);
    if (accumulate < 0)
        return NULL;
    if (accumulate &&
        (opt(a[P2B_DO1]) == Py_None || opt(a[P2B_DLSE]) == Py_None || opt(a[P2B_DPARTIAL]) == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "accumulate=True adds into the given gradients: pass do1=, dlse= and "
                                          "dpartial= (and dsublayer=, if wanted)");
        return NULL;
    }
    if (opt(a[P2B_DGAIN]) != Py_None && gain == Py_None) {
        PyErr_SetString(PyExc_ValueError, "dgain= is the gradient of gain=, which was not given");
        return NULL;
    }
    r.flags = accumulate ? ATTNRES_GRAD_ACCUMULATE : 0u;

    call_ctx c;
    ctx_init(&c, self);
    PyObject *result = NULL, *like = a[P2B_O1];
    PyObject *objs[P2B_NARGS] = {NULL};
    const dl_dtype storage = storage_dl(p->dtype);
    const char *sname = attnres_dtype_name(p->dtype);
    int64_t t = -1;
    void *own = NULL, *stream = NULL, *data;
    int lent = 0;
    view q, g, vgain, dq, dg, vdg;
    /* The inputs, then the outputs once every input is known to be good. */
    if (resolve_stream(&c, opt(a[P2B_STREAM]), like, &stream) ||
        borrow_rows(&c, a[P2B_O1], "o1", 0, storage, &t, p->d, 0, &data, &r.o1_stride))
        goto done;
    r.o1 = data;
    if (borrow_rows(&c, a[P2B_LSE], "lse", 0, f32_dl, &t, p->heads, 1, &data, &r.lse_stride))
        goto done;
    r.lse = data;
    if (borrow_rows(&c, a[P2B_PARTIAL], "partial", 0, storage, &t, p->d, 0, &data, &r.partial_stride))
        goto done;
    r.partial = data;
    if (borrow_f32_dense(&c, a[P2B_QUERY], "query", 1, 1, p->d, &q) ||
        (gain != Py_None && borrow_f32_dense(&c, gain, "gain", 1, 1, p->d, &g)))
        goto done;
    r.query = (const float *)q.data;
    if (opt(a[P2B_DOUT]) != Py_None) {
        if (borrow_rows(&c, a[P2B_DOUT], "dout", 0, storage, &t, p->d, 0, &data, &r.dout_stride))
            goto done;
        r.dout = data;
    }
    if (epilogue) {
        if (borrow_f32_dense(&c, a[P2B_OUT_GAIN], "out_gain", 1, 1, p->d, &vgain) ||
            borrow_rows(&c, a[P2B_DNORMED], "dnormed", 0, storage, &t, p->d, 0, &data, &r.dnormed_stride))
            goto done;
        r.out_gain = (const float *)vgain.data;
        r.dnormed = data;
    }
    if (!(objs[P2B_DO1] = out_or_new(&c, opt(a[P2B_DO1]), like, sname, 2, t, p->d, 0)) ||
        borrow_rows(&c, objs[P2B_DO1], "do1", 1, storage, &t, p->d, 0, &r.do1, &r.do1_stride) ||
        !(objs[P2B_DLSE] = out_or_new(&c, opt(a[P2B_DLSE]), like, "f32", 2, t, p->heads, 0)) ||
        borrow_rows(&c, objs[P2B_DLSE], "dlse", 1, f32_dl, &t, p->heads, 1, &data, &r.dlse_stride))
        goto done;
    r.dlse = data;
    if (!(objs[P2B_DPARTIAL] = out_or_new(&c, opt(a[P2B_DPARTIAL]), like, sname, 2, t, p->d, 0)) ||
        borrow_rows(&c, objs[P2B_DPARTIAL], "dpartial", 1, storage, &t, p->d, 0, &r.dpartial, &r.dpartial_stride))
        goto done;
    if (opt(a[P2B_DSUBLAYER]) != Py_None &&
        borrow_rows(&c, a[P2B_DSUBLAYER], "dsublayer", 1, storage, &t, p->d, 0, &r.dsublayer, &r.dsublayer_stride))
        goto done;
    if (!(objs[P2B_DQUERY] = out_or_new(&c, opt(a[P2B_DQUERY]), like, "f32", 1, p->d, 0, 0)) ||
        borrow_f32_out(&c, objs[P2B_DQUERY], "dquery", p->d, &dq))
        goto done;
    r.dquery = (float *)dq.data;
    if (gain != Py_None && (!(objs[P2B_DGAIN] = out_or_new(&c, opt(a[P2B_DGAIN]), like, "f32", 1, p->d, 0, 0)) ||
                            borrow_f32_out(&c, objs[P2B_DGAIN], "dgain", p->d, &dg)))
        goto done;
    if (epilogue) {
        if (!(objs[P2B_DOUT_GAIN] = out_or_new(&c, opt(a[P2B_DOUT_GAIN]), like, "f32", 1, p->d, 0, 0)) ||
            borrow_f32_out(&c, objs[P2B_DOUT_GAIN], "dout_gain", p->d, &vdg))
            goto done;
        r.dout_gain = (float *)vdg.data;
    }
    float *u = NULL;
    if (take_scratch(&c, self, opt(a[P2B_WORKSPACE]), t, spec->fn, gain != Py_None ? (size_t)p->d : 0, &u,
                     &r.workspace, &r.workspace_size, &own, &lent))
        goto done;
    if (u) {
        attnres_fold_query((const float *)q.data, (const float *)g.data, u, p->d);
        r.query = u;
    }

    char msg[512];
    attnres_plan *plan = self->plan;
    double wall = 0, cpu = 0;
    int rc;
    plan_begin(self);
    Py_BEGIN_ALLOW_THREADS
    rc = run_timed(run_phase2_backward, plan, t, &r, stream, repeat, &wall, &cpu);
    if (rc != ATTNRES_OK)
        snprintf(msg, sizeof msg, "%s", attnres_plan_errmsg(plan));
    if (rc == ATTNRES_OK && gain != Py_None)
        unfold((float *)dq.data, (float *)dg.data, (const float *)q.data, (const float *)g.data, p->d);
    Py_END_ALLOW_THREADS
    plan_end(self);
    if (rc != ATTNRES_OK) {
        raise_status(rc, spec->fn, msg);
        goto done;
    }
    if (repeat > 0) {
        result = Py_BuildValue("(dd)", wall / (double)repeat, cpu / (double)repeat);
        goto done;
    }
    PyObject *dgain = objs[P2B_DGAIN] ? objs[P2B_DGAIN] : Py_None;
    result = epilogue ? PyTuple_Pack(6, objs[P2B_DO1], objs[P2B_DLSE], objs[P2B_DPARTIAL], objs[P2B_DQUERY], dgain,
                                     objs[P2B_DOUT_GAIN])
                      : PyTuple_Pack(5, objs[P2B_DO1], objs[P2B_DLSE], objs[P2B_DPARTIAL], objs[P2B_DQUERY], dgain);
done:
    if (lent)
        self->scratch_busy = 0;
    free(own);
    ctx_free(&c);
    return result;
}

PyObject *plan_phase1_backward(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_phase1_backward((PlanObject *)op, args, nargs, kwnames, 0);
}

PyObject *plan_phase2_backward(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_phase2_backward((PlanObject *)op, args, nargs, kwnames, 0);
}
