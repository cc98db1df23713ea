/*
 * core_ops.c - Plan.mix, Plan.phase1 and Plan.phase2: a table per op of the
 * arguments it takes and where each goes in the runtime's argument struct,
 * and call_op, which checks a call against the plan and runs it; and
 * Plan.mix_backward. The helpers core_phase_backward.c shares with it are
 * declared in core_ops_internal.h.
 */
#include "core_ops_internal.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the hot-path methods, described by tables ---------------------------
 * Plan.mix, Plan.phase1 and Plan.phase2 differ only in which arguments they
 * take and where each one goes in the runtime's argument struct. Each is a
 * table of argument descriptions (op_spec below), and one function,
 * call_op, does for all three what a call needs: keyword matching, scalar
 * checks, refusing the arguments that the plan's form, epilogue or fused
 * add forbid and asking for those they require, borrowing every array with
 * its shape, dtype, device and stride checked, allocating the outputs that
 * were not given, the run with the GIL released, and the result. */

/* The argument kinds (K_), conditions (W_) and flags (F_), arg_spec and
 * op_spec are in core_ops_internal.h, which core_phase_backward.c shares. */

const char *const when_needs[] = {"", "form='additive'", "epilogue=True", "fuse_add=True"};
static const char *const when_has[] = {"", "has the additive form", "has the output-norm epilogue",
                                       "fuses the add"};

/* Matches positional and keyword arguments to slots: the first npos names
 * may be given by position, and the first nreq (npos when 0) must be given.
 * Slots left unset hold NULL. */
int parse_args(const op_spec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **slots)
{
    const arg_spec *names = spec->args;
    for (int i = 0; i < spec->nargs; i++)
        slots[i] = NULL;
    if (nargs > spec->npos) {
        PyErr_Format(PyExc_TypeError, "%s() takes %d positional arguments but %zd were given", spec->fn, spec->npos,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        slots[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GetItem(kwnames, k);
        int found = -1;
        for (int i = 0; i < spec->nargs && found < 0; i++)
            if (key == names[i].interned)
                found = i;
        for (int i = 0; i < spec->nargs && found < 0; i++)
            if (PyUnicode_Compare(key, names[i].interned) == 0)
                found = i;
        if (found < 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", spec->fn, key);
            return -1;
        }
        if (slots[found]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", spec->fn, names[found].name);
            return -1;
        }
        slots[found] = args[nargs + k];
    }
    const int nreq = spec->nreq ? spec->nreq : spec->npos;
    for (int i = 0; i < nreq; i++)
        if (!slots[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", spec->fn, names[i].name);
            return -1;
        }
    return 0;
}

PyObject *opt(PyObject *slot)
{
    return slot ? slot : Py_None;
}

/* A float argument: finite, within float range, and positive if asked. */
int get_float(PyObject *slot, const char *name, double dflt, int positive, float *out)
{
    double v = dflt;
    if (slot && slot != Py_None) {
        v = PyFloat_AsDouble(slot);
        if (v == -1.0 && PyErr_Occurred())
            return -1;
    }
    if (!isfinite(v) || fabs(v) > FLT_MAX || (positive && !(v > 0))) {
        PyErr_Format(PyExc_ValueError, positive ? "%s must be a positive finite number" : "%s must be a finite number",
                     name);
        return -1;
    }
    *out = (float)v;
    return 0;
}

static double clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Runs once, or with repeat > 0 that many times (a failure stops them),
 * adding the wall and this thread's CPU time to *wall and *cpu. Takes no
 * Python object, so that callers run it without the GIL. */
int run_timed(run_fn run, attnres_plan *plan, int64_t t, const void *args, void *stream, long repeat, double *wall,
              double *cpu)
{
    if (repeat <= 0)
        return run(plan, t, args, stream);
    int rc = ATTNRES_OK;
    const double wall0 = clock_ns(CLOCK_MONOTONIC), cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < repeat && rc == ATTNRES_OK; i++)
        rc = run(plan, t, args, stream);
    *cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
    *wall = clock_ns(CLOCK_MONOTONIC) - wall0;
    return rc;
}

int applies(const attnres_problem *p, int when)
{
    switch (when) {
    case W_ADDITIVE:
        return p->form == ATTNRES_FORM_ADDITIVE;
    case W_EPILOGUE:
        return p->epilogue != 0;
    case W_FUSE_ADD:
        return p->fuse_add != 0;
    default:
        return 1;
    }
}

/* The members of the runtime's argument structs are pointers of several
 * types; they are stored through memcpy so that no lvalue of another type
 * touches them. */
static void put_ptr(run_args *r, size_t off, const void *value)
{
    memcpy((char *)r + off, &value, sizeof value);
}

const char *const op_names[] = {"mix", "phase1", "phase2", "mix_backward", "phase1_backward", "phase2_backward"};

/* The body of Plan.mix, Plan.phase1 and Plan.phase2. With repeat > 0 (the
 * benchmark's _time_c) the same prepared arguments are run repeat times and
 * the mean ns per C call is returned instead of the outputs, by the wall
 * clock and by this thread's CPU clock (which leaves out the time the
 * thread was descheduled on a loaded machine): the C call's own cost,
 * measured in the same process on the same memory. */
static PyObject *call_op(const op_spec *spec, PlanObject *self, PyObject *const *args, Py_ssize_t nargs,
                         PyObject *kwnames, long repeat)
{
    PyObject *a[MAX_ARGS];
    if (parse_args(spec, args, nargs, kwnames, a) || !plan_usable(self))
        return NULL;
    const attnres_problem *p = &self->problem;
    if (p->op != spec->op) {
        PyErr_Format(PyExc_ValueError, "%s() called on a plan for op %s", spec->fn, op_names[p->op]);
        return NULL;
    }
    run_args r;
    spec->init(&r);
    /* Scalars, and which arguments the plan takes, before anything is borrowed. */
    int stream_slot = -1;
    for (int i = 0; i < spec->nargs; i++) {
        const arg_spec *s = &spec->args[i];
        const int given = opt(a[i]) != Py_None;
        if (!applies(p, s->when)) {
            if (given) {
                PyErr_Format(PyExc_ValueError, "%s= needs a plan made with %s", s->name, when_needs[s->when]);
                return NULL;
            }
            continue;
        }
        if ((s->flags & F_REQUIRED) && !given) {
            PyErr_Format(PyExc_ValueError, "this plan %s: %s= is required", when_has[s->when], s->name);
            return NULL;
        }
        if (s->kind == K_FLOAT && get_float(a[i], s->name, s->dflt, s->flags & F_POSITIVE, (float *)((char *)&r + s->off)))
            return NULL;
        if (s->kind == K_STREAM)
            stream_slot = i;
    }
    call_ctx c;
    ctx_init(&c, self);
    PyObject *result = NULL, *like = NULL, *objs[MAX_ARGS] = {NULL};
    const dl_dtype storage = storage_dl(p->dtype), f32 = {DL_FLOAT, 32, 1};
    int64_t t = -1;
    void *stream = NULL;
    if (stream_slot >= 0 && resolve_stream(&c, opt(a[stream_slot]), a[0], &stream))
        goto done;
    /* Inputs first, then the outputs, once every input is known to be good. */
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < spec->nargs; i++) {
            const arg_spec *s = &spec->args[i];
            const int is_out = (s->flags & F_OUT) != 0;
            if (is_out != pass || !applies(p, s->when))
                continue;
            const int64_t width = s->flags & F_HEADS ? p->heads : p->d;
            const int64_t count = s->flags & F_SITES ? p->s : p->n;
            const dl_dtype dtype = s->flags & F_F32 ? f32 : storage;
            const char *dname = s->flags & F_F32 ? "f32" : attnres_dtype_name(p->dtype);
            const int writable = is_out || ((s->flags & F_FUSED_OUT) && p->fuse_add);
            PyObject *obj = opt(a[i]);
            if (is_out && obj == Py_None && (s->kind == K_BANK || s->kind == K_ROWS)) {
                obj = s->kind == K_BANK ? allocate(&c, like, dname, 3, count, t, width)
                                        : allocate(&c, like, dname, 2, t, width, 0);
                if (!obj)
                    goto done;
            }
            switch (s->kind) {
            case K_BANK: {
                void **ptrs;
                int64_t *strides;
                PyObject *first = NULL;
                if (borrow_bank(&c, obj, s->name, count, width, dtype, writable, &t, &ptrs, &strides, &first))
                    goto done;
                if (s->flags & F_COMMON) {
                    if (common_stride(strides, count, s->name, (int64_t *)((char *)&r + s->aux)))
                        goto done;
                } else {
                    put_ptr(&r, s->aux, strides);
                }
                put_ptr(&r, s->off, ptrs);
                if (!like)
                    like = first;
                break;
            }
            case K_ROWS: {
                view v;
                if (borrow(&c, obj, s->name, 2, writable, &v) || check_kind(&c, &v, s->name, dtype))
                    goto done;
                if (t < 0)
                    t = v.shape[0];
                if (check_shape2(&v, s->name, t, width, s->flags & F_HEADS ? "to match (T, H)" : "to match (T, d)") ||
                    row_stride(&v, 0, s->name, (int64_t *)((char *)&r + s->aux)))
                    goto done;
                put_ptr(&r, s->off, v.data);
                if (!like)
                    like = obj;
                break;
            }
            case K_QUERY: {
                const int sites = (s->flags & F_SITES) != 0;
                const float *u;
                if (fold(&c, obj, opt(a[s->partner]), s->name, spec->args[s->partner].name, sites ? 2 : 1,
                         sites ? p->s : 1, p->d, &u))
                    goto done;
                put_ptr(&r, s->off, u);
                break;
            }
            case K_VEC: {
                view v;
                if (borrow_f32_dense(&c, obj, s->name, 1, 1, p->d, &v))
                    goto done;
                put_ptr(&r, s->off, v.data);
                break;
            }
            default:
                break;
            }
            objs[i] = obj;
        }
    int rc = ATTNRES_OK;
    char msg[512];
    attnres_plan *plan = self->plan;
    double wall = 0, cpu = 0;
    plan_begin(self);
    Py_BEGIN_ALLOW_THREADS
    rc = run_timed(spec->run, plan, t, &r, stream, repeat, &wall, &cpu);
    if (rc != ATTNRES_OK)
        snprintf(msg, sizeof msg, "%s", attnres_plan_errmsg(plan));
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
    PyObject *second = spec->result[1] >= 0 && applies(p, spec->args[spec->result[1]].when) ? objs[spec->result[1]]
                                                                                             : NULL;
    result = second ? PyTuple_Pack(2, objs[spec->result[0]], second) : Py_NewRef(objs[spec->result[0]]);
done:
    ctx_free(&c);
    return result;
}

/* ---- the three ops' tables ---- */

#define FLOAT_ARG(nm, st, member, dflt, fl) {nm, NULL, K_FLOAT, W_ALWAYS, fl, dflt, -1, offsetof(st, member), 0}
/* A view whose token stride is member##_stride of st. */
#define STRIDED_ARG(nm, kind, when, fl, st, member) \
    {nm, NULL, kind, when, fl, 0, -1, offsetof(st, member), offsetof(st, member##_stride)}
#define STREAM_ARG {"stream", NULL, K_STREAM, W_ALWAYS, 0, 0, -1, 0, 0}
/* The folded query's gain (arg_spec.fold names its entry), taken by the query's fold, not a struct member. */
#define GAIN_ARG(nm) {nm, NULL, K_GAIN, W_ALWAYS, 0, 0, -1, 0, 0}
/* The score's epsilon and scale, which every op takes. */
#define SCORE_ARGS(P, st)                                        \
    [P##_EPS] = FLOAT_ARG("eps", st, eps, 1e-6, F_POSITIVE),     \
    [P##_SCALE] = FLOAT_ARG("scale", st, scale, 1.0, 0)
/* The entries mix and phase 2 end with: the output norm's epilogue, out
 * and the stream. */
#define EPILOGUE_OUT_STREAM(P, st)                                                                          \
    [P##_OUT_GAIN] = {"out_gain", NULL, K_VEC, W_EPILOGUE, F_REQUIRED, 0, -1, offsetof(st, out_gain), 0},  \
    [P##_OUT_EPS] = FLOAT_ARG("out_eps", st, out_eps, 1e-6, F_POSITIVE),                                  \
    [P##_NORMED] = STRIDED_ARG("normed", K_ROWS, W_EPILOGUE, F_OUT, st, normed),                          \
    [P##_OUT] = STRIDED_ARG("out", K_ROWS, W_ALWAYS, F_OUT, st, out), [P##_STREAM] = STREAM_ARG

/* An op's init and run entries: its public _args_init and attnres_run_
 * call on its own member of run_args. */
#define OP_ENTRIES(op, member)                                                                  \
    static void init_##op(run_args *r)                                                          \
    {                                                                                           \
        attnres_##op##_args_init(&r->member);                                                   \
    }                                                                                           \
    static int run_##op(attnres_plan *plan, int64_t t, const void *r, void *stream)             \
    {                                                                                           \
        return attnres_run_##op(plan, t, &((const run_args *)r)->member, stream);               \
    }

OP_ENTRIES(mix, mix)

enum { MIX_SOURCES, MIX_QUERY, MIX_GAIN, MIX_EPS, MIX_SCALE, MIX_PARTIAL, MIX_ALPHA, MIX_OUT_GAIN, MIX_OUT_EPS,
       MIX_NORMED, MIX_OUT, MIX_STREAM, MIX_NARGS };
static arg_spec mix_args[MIX_NARGS] = {
    [MIX_SOURCES] = {"sources", NULL, K_BANK, W_ALWAYS, 0, 0, -1, offsetof(attnres_mix_args, sources),
                     offsetof(attnres_mix_args, source_strides)},
    [MIX_QUERY] = {"query", NULL, K_QUERY, W_ALWAYS, 0, 0, MIX_GAIN, offsetof(attnres_mix_args, query), 0},
    [MIX_GAIN] = GAIN_ARG("gain"),
    SCORE_ARGS(MIX, attnres_mix_args),
    [MIX_PARTIAL] = STRIDED_ARG("partial", K_ROWS, W_ADDITIVE, F_REQUIRED, attnres_mix_args, partial),
    [MIX_ALPHA] = FLOAT_ARG("alpha", attnres_mix_args, alpha, 1.0, 0),
    EPILOGUE_OUT_STREAM(MIX, attnres_mix_args),
};
static const op_spec mix_spec = {"mix", ATTNRES_OP_MIX, 2, MIX_NARGS, mix_args, init_mix, run_mix,
                                 {MIX_OUT, MIX_NORMED}, 0};

OP_ENTRIES(phase1, p1)

enum { P1_SOURCES, P1_QUERIES, P1_GAINS, P1_EPS, P1_SCALE, P1_OUT, P1_LSE, P1_STREAM, P1_NARGS };
static arg_spec p1_args[P1_NARGS] = {
    [P1_SOURCES] = {"sources", NULL, K_BANK, W_ALWAYS, 0, 0, -1, offsetof(attnres_phase1_args, sources),
                    offsetof(attnres_phase1_args, source_strides)},
    [P1_QUERIES] = {"queries", NULL, K_QUERY, W_ALWAYS, F_SITES, 0, P1_GAINS, offsetof(attnres_phase1_args, queries), 0},
    [P1_GAINS] = GAIN_ARG("gains"),
    SCORE_ARGS(P1, attnres_phase1_args),
    [P1_OUT] = STRIDED_ARG("out", K_BANK, W_ALWAYS, F_OUT | F_SITES | F_COMMON, attnres_phase1_args, o1),
    [P1_LSE] = STRIDED_ARG("lse", K_BANK, W_ALWAYS, F_OUT | F_SITES | F_COMMON | F_F32 | F_HEADS, attnres_phase1_args,
                           lse),
    [P1_STREAM] = STREAM_ARG,
};
static const op_spec p1_spec = {"phase1", ATTNRES_OP_PHASE1, 2, P1_NARGS, p1_args, init_phase1, run_phase1,
                                {P1_OUT, P1_LSE}, 0};

OP_ENTRIES(phase2, p2)

enum { P2_O1, P2_LSE, P2_PARTIAL, P2_QUERY, P2_GAIN, P2_SUBLAYER, P2_EPS, P2_SCALE, P2_OUT_GAIN, P2_OUT_EPS,
       P2_NORMED, P2_OUT, P2_STREAM, P2_NARGS };
static arg_spec p2_args[P2_NARGS] = {
    [P2_O1] = STRIDED_ARG("o1", K_ROWS, W_ALWAYS, 0, attnres_phase2_args, o1),
    [P2_LSE] = STRIDED_ARG("lse", K_ROWS, W_ALWAYS, F_F32 | F_HEADS, attnres_phase2_args, lse),
    [P2_PARTIAL] = STRIDED_ARG("partial", K_ROWS, W_ALWAYS, F_FUSED_OUT, attnres_phase2_args, partial),
    [P2_QUERY] = {"query", NULL, K_QUERY, W_ALWAYS, 0, 0, P2_GAIN, offsetof(attnres_phase2_args, query), 0},
    [P2_GAIN] = GAIN_ARG("gain"),
    [P2_SUBLAYER] = STRIDED_ARG("sublayer", K_ROWS, W_FUSE_ADD, F_REQUIRED, attnres_phase2_args, sublayer),
    SCORE_ARGS(P2, attnres_phase2_args),
    EPILOGUE_OUT_STREAM(P2, attnres_phase2_args),
};
static const op_spec p2_spec = {"phase2", ATTNRES_OP_PHASE2, 4, P2_NARGS, p2_args, init_phase2, run_phase2,
                                {P2_OUT, P2_NORMED}, 0};

static const op_spec *const op_specs[] = {&mix_spec, &p1_spec, &p2_spec};

/* The mix backward's run_fn, for run_timed. */
static int run_mix_backward(attnres_plan *plan, int64_t t, const void *args, void *stream)
{
    return attnres_run_mix_backward(plan, t, args, stream);
}

/* ---- the mix backward ------------------------------------------------------
 * Plan.mix_backward takes the forward's inputs and the gradient of out and
 * returns the gradients of §1b. It has its own body rather than a table of
 * call_op: it folds the query into the plan's scratch (not per call), turns
 * the runtime's gradient of the folded query into those of w and the gain,
 * lends the runtime the plan's workspace, and may accumulate into the
 * caller's buffers, none of which the forward ops do. The arguments are
 * still matched by parse_args, so keyword errors read as the forward's. */

enum { BW_SOURCES, BW_QUERY, BW_DOUT, BW_GAIN, BW_EPS, BW_SCALE, BW_ALPHA, BW_DSOURCES, BW_DQUERY, BW_DGAIN,
       BW_DPARTIAL, BW_DALPHA, BW_ACCUMULATE, BW_DSOURCES_F32, BW_STREAM, BW_OUT, BW_OUT_GAIN, BW_OUT_EPS,
       BW_DNORMED, BW_DOUT_GAIN, BW_WORKSPACE, BW_NARGS };
/* Only the names of this table are read (by parse_args and intern_names). */
static arg_spec bw_args[BW_NARGS] = {
    [BW_SOURCES] = {"sources", NULL, K_BANK, W_ALWAYS, 0, 0, -1, 0, 0},
    [BW_QUERY] = {"query", NULL, K_QUERY, W_ALWAYS, 0, 0, BW_GAIN, 0, 0},
    [BW_DOUT] = {"dout", NULL, K_ROWS, W_ALWAYS, 0, 0, -1, 0, 0},
    [BW_GAIN] = {"gain", NULL, K_GAIN, W_ALWAYS, 0, 0, -1, 0, 0},
    [BW_EPS] = {"eps", NULL, K_FLOAT, W_ALWAYS, F_POSITIVE, 1e-6, -1, 0, 0},
    [BW_SCALE] = {"scale", NULL, K_FLOAT, W_ALWAYS, 0, 1.0, -1, 0, 0},
    [BW_ALPHA] = {"alpha", NULL, K_FLOAT, W_ALWAYS, 0, 1.0, -1, 0, 0},
    [BW_DSOURCES] = {"dsources", NULL, K_BANK, W_ALWAYS, F_OUT, 0, -1, 0, 0},
    [BW_DQUERY] = {"dquery", NULL, K_VEC, W_ALWAYS, F_OUT, 0, -1, 0, 0},
    [BW_DGAIN] = {"dgain", NULL, K_VEC, W_ALWAYS, F_OUT, 0, -1, 0, 0},
    [BW_DPARTIAL] = {"dpartial", NULL, K_ROWS, W_ADDITIVE, F_OUT, 0, -1, 0, 0},
    [BW_DALPHA] = {"dalpha", NULL, K_VEC, W_ADDITIVE, F_OUT, 0, -1, 0, 0},
    [BW_ACCUMULATE] = {"accumulate", NULL, K_FLOAT, W_ALWAYS, 0, 0, -1, 0, 0},
    [BW_DSOURCES_F32] = {"dsources_f32", NULL, K_FLOAT, W_ALWAYS, 0, 0, -1, 0, 0},
    [BW_STREAM] = {"stream", NULL, K_STREAM, W_ALWAYS, 0, 0, -1, 0, 0},
    /* The output-norm epilogue: the forward's out and gain, and the
     * gradient of normed; dout may then be None. */
    [BW_OUT] = {"out", NULL, K_ROWS, W_EPILOGUE, 0, 0, -1, 0, 0},
    [BW_OUT_GAIN] = {"out_gain", NULL, K_VEC, W_EPILOGUE, 0, 0, -1, 0, 0},
    [BW_OUT_EPS] = {"out_eps", NULL, K_FLOAT, W_EPILOGUE, F_POSITIVE, 1e-6, -1, 0, 0},
    [BW_DNORMED] = {"dnormed", NULL, K_ROWS, W_EPILOGUE, 0, 0, -1, 0, 0},
    [BW_DOUT_GAIN] = {"dout_gain", NULL, K_VEC, W_EPILOGUE, F_OUT, 0, -1, 0, 0},
    /* The runtime's workspace, for CUDA plans above all (device memory). */
    [BW_WORKSPACE] = {"workspace", NULL, K_VEC, W_ALWAYS, F_OUT, 0, -1, 0, 0},
};
static const op_spec bw_spec = {"mix_backward", ATTNRES_OP_MIX_BACKWARD, 3, BW_NARGS, bw_args, NULL, NULL,
                                {-1, -1}, 0};

/* A writable dense fp32 vector of `len` elements (dquery, dgain, dalpha). */
int borrow_f32_out(call_ctx *c, PyObject *obj, const char *name, int64_t len, view *v)
{
    const dl_dtype f32 = {DL_FLOAT, 32, 1};
    if (borrow(c, obj, name, 1, 1, v) || check_kind(c, v, name, f32))
        return -1;
    if (v->shape[0] != len) {
        PyErr_Format(PyExc_ValueError, "%s must have shape (%lld,), got (%lld,)", name, (long long)len,
                     (long long)v->shape[0]);
        return -1;
    }
    if (len > 1 && v->strides[0] != 1) {
        PyErr_Format(PyExc_ValueError, "%s must be contiguous", name);
        return -1;
    }
    return 0;
}

/* An output array: the caller's, or a new one like the sources. */
PyObject *out_or_new(call_ctx *c, PyObject *given, PyObject *like, const char *dtype, int ndim, int64_t a, int64_t b,
                     int64_t d)
{
    return given != Py_None ? given : allocate(c, like, dtype, ndim, a, b, d);
}

size_t round_up64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Scratch of `bytes` bytes, 64-byte aligned as the runtime's workspace must
 * be: the plan's own (grown when a larger T needs more, so that a training
 * loop allocates only while T grows), or, while another thread has lent the
 * plan's, a buffer of this call's own, freed in *own. */
void *lend_scratch(PlanObject *self, size_t bytes, void **own)
{
    *own = NULL;
    if (!self->scratch_busy && self->scratch_size >= bytes) {
        self->scratch_busy = 1;
        return self->scratch;
    }
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64)) {
        PyErr_NoMemory();
        return NULL;
    }
    if (self->scratch_busy) {
        *own = p;
        return p;
    }
    free(self->scratch);
    self->scratch = p;
    self->scratch_size = bytes;
    self->scratch_busy = 1;
    return p;
}

static PyObject *call_mix_backward(PlanObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                                   long repeat)
{
    const op_spec *spec = &bw_spec;
    PyObject *a[MAX_ARGS];
    if (parse_args(spec, args, nargs, kwnames, a) || !plan_usable(self))
        return NULL;
    const attnres_problem *p = &self->problem;
    if (p->op != ATTNRES_OP_MIX_BACKWARD) {
        PyErr_Format(PyExc_ValueError, "mix_backward() called on a plan for op %s (make one with op='mix_backward')",
                     op_names[p->op]);
        return NULL;
    }
    const int cuda = self->device->is_cuda;
    /* The gradients of w and the gain come from that of u on the host. */
    if (cuda && (opt(a[BW_GAIN]) != Py_None || opt(a[BW_DGAIN]) != Py_None)) {
        PyErr_SetString(PyExc_ValueError, "gain= and dgain= are for CPU plans: a CUDA plan takes the folded query "
                                          "u = gain * w, and dquery is the gradient of u (dw = dquery * gain, "
                                          "dgain = dquery * w)");
        return NULL;
    }
    const int additive = p->form == ATTNRES_FORM_ADDITIVE, epilogue = p->epilogue != 0;
    for (int i = 0; i < BW_NARGS; i++)
        if (!applies(p, bw_args[i].when) && opt(a[i]) != Py_None) {
            PyErr_Format(PyExc_ValueError, "%s= needs a plan made with %s", bw_args[i].name,
                         when_needs[bw_args[i].when]);
            return NULL;
        }
    attnres_mix_backward_args r;
    attnres_mix_backward_args_init(&r);
    if (get_float(a[BW_EPS], "eps", 1e-6, 1, &r.eps) || get_float(a[BW_SCALE], "scale", 1.0, 0, &r.scale) ||
        get_float(a[BW_ALPHA], "alpha", 1.0, 0, &r.alpha) ||
        (epilogue && get_float(a[BW_OUT_EPS], "out_eps", 1e-6, 1, &r.out_eps)))
        return NULL;
    if (epilogue && (opt(a[BW_OUT]) == Py_None || opt(a[BW_OUT_GAIN]) == Py_None || opt(a[BW_DNORMED]) == Py_None)) {
        PyErr_SetString(PyExc_ValueError, "a plan with the epilogue needs out= (the forward's out), out_gain= and "
                                          "dnormed= (the gradient of normed)");
        return NULL;
    }
    if (!epilogue && opt(a[BW_DOUT]) == Py_None) {
        PyErr_SetString(PyExc_ValueError, "dout must not be None (only a plan with the epilogue, given dnormed=, "
                                          "may do without)");
        return NULL;
    }
    const int accumulate = a[BW_ACCUMULATE] ? PyObject_IsTrue(a[BW_ACCUMULATE]) : 0;
    if (accumulate < 0)
        return NULL;
    /* fp32 source gradients whatever the storage: a trainer that sums several
     * sites' gradients into one buffer keeps them unrounded. */
    const int dsrc_f32 = a[BW_DSOURCES_F32] ? PyObject_IsTrue(a[BW_DSOURCES_F32]) : 0;
    if (dsrc_f32 < 0)
        return NULL;
    PyObject *gain = opt(a[BW_GAIN]);
    if (accumulate && (opt(a[BW_DSOURCES]) == Py_None || (additive && opt(a[BW_DPARTIAL]) == Py_None))) {
        PyErr_SetString(PyExc_ValueError, additive ? "accumulate=True adds into the given gradients: pass dsources= "
                                                     "and dpartial="
                                                   : "accumulate=True adds into the given gradients: pass dsources=");
        return NULL;
    }
    if (opt(a[BW_DGAIN]) != Py_None && gain == Py_None) {
        PyErr_SetString(PyExc_ValueError, "dgain= is the gradient of gain=, which was not given");
        return NULL;
    }
    r.flags = (accumulate ? ATTNRES_GRAD_ACCUMULATE : 0u) | (dsrc_f32 ? ATTNRES_GRAD_DSOURCES_F32 : 0u);

    call_ctx c;
    ctx_init(&c, self);
    PyObject *result = NULL, *like = NULL, *dfirst = NULL;
    const dl_dtype storage = storage_dl(p->dtype), f32 = {DL_FLOAT, 32, 1};
    const char *sname = attnres_dtype_name(p->dtype);
    int64_t t = -1;
    void *own = NULL;
    int lent = 0;
    view q, g, dout, dq, dg, dpart, dal, vout, vgain, vdn, vdg;
    void **ptrs, **dptrs;
    int64_t *strides, *dstrides;
    PyObject *objs[BW_NARGS] = {NULL};
    void *stream = NULL;
    /* The inputs, then the outputs once every input is known to be good. */
    if (resolve_stream(&c, opt(a[BW_STREAM]), a[BW_SOURCES], &stream) || borrow_bank(&c, a[BW_SOURCES], "sources", p->n, p->d, storage, 0, &t, &ptrs, &strides, &like) ||
        borrow_f32_dense(&c, a[BW_QUERY], "query", 1, 1, p->d, &q) ||
        (gain != Py_None && borrow_f32_dense(&c, gain, "gain", 1, 1, p->d, &g)) ||
        (opt(a[BW_DOUT]) != Py_None &&
         (borrow(&c, a[BW_DOUT], "dout", 2, 0, &dout) || check_kind(&c, &dout, "dout", storage) ||
          check_shape2(&dout, "dout", t, p->d, "to match (T, d)") || row_stride(&dout, 0, "dout", &r.dout_stride))))
        goto done;
    r.sources = (const void *const *)ptrs;
    r.source_strides = strides;
    r.dout = opt(a[BW_DOUT]) != Py_None ? dout.data : NULL;
    if (epilogue) {
        if (borrow(&c, a[BW_OUT], "out", 2, 0, &vout) || check_kind(&c, &vout, "out", storage) ||
            check_shape2(&vout, "out", t, p->d, "to match (T, d)") || row_stride(&vout, 0, "out", &r.out_stride) ||
            borrow(&c, a[BW_DNORMED], "dnormed", 2, 0, &vdn) || check_kind(&c, &vdn, "dnormed", storage) ||
            check_shape2(&vdn, "dnormed", t, p->d, "to match (T, d)") ||
            row_stride(&vdn, 0, "dnormed", &r.dnormed_stride) ||
            borrow_f32_dense(&c, a[BW_OUT_GAIN], "out_gain", 1, 1, p->d, &vgain))
            goto done;
        r.out = vout.data;
        r.dnormed = vdn.data;
        r.out_gain = (const float *)vgain.data;
    }
    if (!(objs[BW_DSOURCES] = out_or_new(&c, opt(a[BW_DSOURCES]), like, dsrc_f32 ? "f32" : sname, 3, p->n, t, p->d)) ||
        borrow_bank(&c, objs[BW_DSOURCES], "dsources", p->n, p->d, dsrc_f32 ? f32 : storage, 1, &t, &dptrs, &dstrides,
                    &dfirst) ||
        !(objs[BW_DQUERY] = out_or_new(&c, opt(a[BW_DQUERY]), like, "f32", 1, p->d, 0, 0)) ||
        borrow_f32_out(&c, objs[BW_DQUERY], "dquery", p->d, &dq))
        goto done;
    r.dsources = dptrs;
    r.dsource_strides = dstrides;
    r.dquery = (float *)dq.data;
    if (gain != Py_None && (!(objs[BW_DGAIN] = out_or_new(&c, opt(a[BW_DGAIN]), like, "f32", 1, p->d, 0, 0)) ||
                            borrow_f32_out(&c, objs[BW_DGAIN], "dgain", p->d, &dg)))
        goto done;
    if (additive) {
        if (!(objs[BW_DPARTIAL] = out_or_new(&c, opt(a[BW_DPARTIAL]), like, sname, 2, t, p->d, 0)) ||
            borrow(&c, objs[BW_DPARTIAL], "dpartial", 2, 1, &dpart) || check_kind(&c, &dpart, "dpartial", storage) ||
            check_shape2(&dpart, "dpartial", t, p->d, "to match (T, d)") ||
            row_stride(&dpart, 0, "dpartial", &r.dpartial_stride) ||
            !(objs[BW_DALPHA] = out_or_new(&c, opt(a[BW_DALPHA]), like, "f32", 1, 1, 0, 0)) ||
            borrow_f32_out(&c, objs[BW_DALPHA], "dalpha", 1, &dal))
            goto done;
        r.dpartial = dpart.data;
        r.dalpha = (float *)dal.data;
    }
    if (epilogue) {
        if (!(objs[BW_DOUT_GAIN] = out_or_new(&c, opt(a[BW_DOUT_GAIN]), like, "f32", 1, p->d, 0, 0)) ||
            borrow_f32_out(&c, objs[BW_DOUT_GAIN], "dout_gain", p->d, &vdg))
            goto done;
        r.dout_gain = (float *)vdg.data;
    }
    size_t ws_bytes = 0;
    int rc = attnres_mix_backward_workspace_size(self->plan, t, &ws_bytes);
    if (rc != ATTNRES_OK) {
        raise_status(rc, "mix_backward", attnres_plan_errmsg(self->plan));
        goto done;
    }
    r.query = (const float *)q.data;
    if (cuda && opt(a[BW_WORKSPACE]) == Py_None) {
        /* The plan's scratch is host memory, and a buffer made here could
         * be freed before the asynchronous launch ends. */
        PyErr_Format(PyExc_ValueError,
                     "a CUDA plan needs workspace=: a contiguous device buffer of at least %zu bytes for T = %lld "
                     "(Plan.mix_backward_workspace_size), alive until the launch on its stream completes",
                     ws_bytes, (long long)t);
        goto done;
    }
    if (opt(a[BW_WORKSPACE]) != Py_None) {
        view ws;
        if (borrow(&c, a[BW_WORKSPACE], "workspace", 1, 1, &ws))
            goto done;
        if (ws.strides && ws.shape[0] > 1 && ws.strides[0] != 1) {
            PyErr_SetString(PyExc_ValueError, "workspace must be contiguous");
            goto done;
        }
        r.workspace = ws.data;
        r.workspace_size = (size_t)ws.shape[0] * ((size_t)ws.dtype.bits * ws.dtype.lanes / 8);
    }
    if (gain != Py_None || !r.workspace) {
        /* The folded query and the workspace in the plan's scratch. */
        const size_t u_bytes = round_up64(sizeof(float) * (size_t)p->d);
        char *scratch = lend_scratch(self, u_bytes + (r.workspace ? 0 : ws_bytes), &own);
        if (!scratch)
            goto done;
        lent = own == NULL;
        if (gain != Py_None) {
            attnres_fold_query((const float *)q.data, (const float *)g.data, (float *)scratch, p->d);
            r.query = (const float *)scratch;
        }
        if (!r.workspace) {
            r.workspace = scratch + u_bytes;
            r.workspace_size = ws_bytes;
        }
    }

    char msg[512];
    attnres_plan *plan = self->plan;
    double wall = 0, cpu = 0;
    plan_begin(self);
    Py_BEGIN_ALLOW_THREADS
    rc = run_timed(run_mix_backward, plan, t, &r, stream, repeat, &wall, &cpu);
    if (rc != ATTNRES_OK)
        snprintf(msg, sizeof msg, "%s", attnres_plan_errmsg(plan));
    /* u = gain * w, so the runtime's du gives dw = du * gain and dgain =
     * du * w. Each element is read before it is written, so a dquery that
     * is also the query still gets the right values. */
    if (rc == ATTNRES_OK && gain != Py_None) {
        float *dw = (float *)dq.data, *dgn = (float *)dg.data;
        const float *w = (const float *)q.data, *gn = (const float *)g.data;
        for (int64_t k = 0; k < p->d; k++) {
            const float du = dw[k], wk = w[k], gk = gn[k];
            dw[k] = du * gk;
            dgn[k] = du * wk;
        }
    }
    Py_END_ALLOW_THREADS
    plan_end(self);
    if (rc != ATTNRES_OK) {
        raise_status(rc, "mix_backward", msg);
        goto done;
    }
    if (repeat > 0) {
        result = Py_BuildValue("(dd)", wall / (double)repeat, cpu / (double)repeat);
        goto done;
    }
    PyObject *dgain = objs[BW_DGAIN] ? objs[BW_DGAIN] : Py_None;
    if (epilogue)
        result = additive ? PyTuple_Pack(6, objs[BW_DSOURCES], objs[BW_DQUERY], dgain, objs[BW_DPARTIAL],
                                         objs[BW_DALPHA], objs[BW_DOUT_GAIN])
                          : PyTuple_Pack(4, objs[BW_DSOURCES], objs[BW_DQUERY], dgain, objs[BW_DOUT_GAIN]);
    else
        result = additive ? PyTuple_Pack(5, objs[BW_DSOURCES], objs[BW_DQUERY], dgain, objs[BW_DPARTIAL],
                                         objs[BW_DALPHA])
                          : PyTuple_Pack(3, objs[BW_DSOURCES], objs[BW_DQUERY], dgain);
done:
    if (lent)
        self->scratch_busy = 0;
    free(own);
    ctx_free(&c);
    return result;
}

PyObject *plan_mix_backward(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_mix_backward((PlanObject *)op, args, nargs, kwnames, 0);
}

PyObject *plan_mix(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_op(&mix_spec, (PlanObject *)op, args, nargs, kwnames, 0);
}

PyObject *plan_phase1(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_op(&p1_spec, (PlanObject *)op, args, nargs, kwnames, 0);
}

PyObject *plan_phase2(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_op(&p2_spec, (PlanObject *)op, args, nargs, kwnames, 0);
}

/* Plan._time_c(repeat, *args, **keywords) -> (wall, thread CPU) mean ns per
 * attnres_run_* call of the plan's op on those arguments, for
 * bench/python_overhead.py. */
PyObject *plan_time_c(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PlanObject *self = (PlanObject *)op;
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "_time_c(repeat, *args, **keywords) of the plan's op");
        return NULL;
    }
    long repeat = PyLong_AsLong(args[0]);
    if (repeat == -1 && PyErr_Occurred())
        return NULL;
    if (repeat < 1 || repeat > 100000000) {
        PyErr_SetString(PyExc_ValueError, "repeat must be 1 to 1e8");
        return NULL;
    }
    if (!plan_usable(self))
        return NULL;
    if (self->problem.op == ATTNRES_OP_MIX_BACKWARD)
        return call_mix_backward(self, args + 1, nargs - 1, kwnames, repeat);
    if (self->problem.op == ATTNRES_OP_PHASE1_BACKWARD)
        return call_phase1_backward(self, args + 1, nargs - 1, kwnames, repeat);
    if (self->problem.op == ATTNRES_OP_PHASE2_BACKWARD)
        return call_phase2_backward(self, args + 1, nargs - 1, kwnames, repeat);
    return call_op(op_specs[self->problem.op], self, args + 1, nargs - 1, kwnames, repeat);
}

static int intern_names(const op_spec *spec)
{
    for (int i = 0; i < spec->nargs; i++)
        if (!(spec->args[i].interned = PyUnicode_InternFromString(spec->args[i].name)))
            return -1;
    return 0;
}

/* Interns every op's argument names, which parse_args compares by identity
 * before it compares their text; the module's init calls this once. */
int ops_intern_names(void)
{
    for (size_t i = 0; i < sizeof op_specs / sizeof op_specs[0]; i++)
        if (intern_names(op_specs[i]))
            return -1;
    if (intern_names(&phase1_backward_spec) || intern_names(&phase2_backward_spec))
        return -1;
    return intern_names(&bw_spec);
}
