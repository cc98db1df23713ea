/*
 * core_plan.c - the Plan type: a problem checked and planned at model load,
 * its properties, and its method table (the hot-path methods themselves are
 * in core_ops.c).
 */
#include "core_internal.h"

#include <structmember.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The runtime's largest problem sizes, checked here so that every integer a
 * caller passes is range-checked before it is narrowed. */
#define MAX_SOURCES (1 << 20)
#define MAX_HEADS (1 << 20)
#define MAX_SITES 4096

/* The ops a plan can be made for, in the runtime's attnres_op order. */
static const char *const op_names[] = {"mix", "phase1", "phase2", "mix_backward", "phase1_backward",
                                       "phase2_backward"};

/* ---- Plan creation ---- */

static int parse_choice(const char *what, const char *value, const char *const *names, int count, int *out)
{
    for (int i = 0; i < count; i++)
        if (strcmp(value, names[i]) == 0) {
            *out = i;
            return 0;
        }
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < count && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    PyErr_Format(PyExc_ValueError, "%s must be one of %s (got '%s')", what, list, value);
    return -1;
}

static PyObject *plan_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", "db", "dtype", "d", "n", "heads", "form", "epilogue", "op",
                             "sites", "fuse_add", "require_exact", NULL};
    PyObject *devobj, *dbobj;
    const char *dtype = "f32", *form = "replace", *op = "mix";
    long long d = -1, n = -1, heads = 1, sites = -1;
    int epilogue = 0, fuse_add = 0, require_exact = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$sLLLspsLpp:Plan", kwlist, &devobj, &dbobj, &dtype, &d, &n,
                                     &heads, &form, &epilogue, &op, &sites, &fuse_add, &require_exact))
        return NULL;
    if (!PyObject_TypeCheck(devobj, DeviceType)) {
        PyErr_SetString(PyExc_TypeError, "Plan() needs a device from attnres.open_device()");
        return NULL;
    }
    if (dbobj != Py_None && !PyObject_TypeCheck(dbobj, DbType)) {
        PyErr_SetString(PyExc_TypeError, "Plan() needs a database from attnres.open_db(), or None");
        return NULL;
    }
    DeviceObject *dev = (DeviceObject *)devobj;
    DbObject *db = dbobj == Py_None ? NULL : (DbObject *)dbobj;
    if (!device_usable(dev))
        return NULL;
    if (db && (db->closed || !db->db)) {
        PyErr_SetString(PyExc_ValueError, "the database is closed");
        return NULL;
    }
    int op_i, form_i;
    attnres_dtype dt;
    static const char *const forms[] = {"replace", "additive"};
    if (parse_choice("op", op, op_names, 6, &op_i) || parse_choice("form", form, forms, 2, &form_i))
        return NULL;
    if (attnres_dtype_parse(dtype, &dt) != ATTNRES_OK) {
        PyErr_Format(PyExc_ValueError, "dtype must be one of f32, bf16, f16 (got '%s')", dtype);
        return NULL;
    }
    if (d < 1 || d > ((long long)1 << 40)) {
        PyErr_Format(PyExc_ValueError, "d must be given and be at least 1 (got %lld)", d);
        return NULL;
    }
    /* Phase 2 and its backward read no n: it defaults to 1 there. */
    const int phase2 = op_i == ATTNRES_OP_PHASE2 || op_i == ATTNRES_OP_PHASE2_BACKWARD;
    const int phase1 = op_i == ATTNRES_OP_PHASE1 || op_i == ATTNRES_OP_PHASE1_BACKWARD;
    if (n == -1)
        n = phase2 ? 1 : -1;
    if (n < 1 || n > MAX_SOURCES) {
        PyErr_Format(PyExc_ValueError, "n (the number of sources) must be given and be 1 to %d (got %lld)",
                     MAX_SOURCES, n);
        return NULL;
    }
    if (heads < 1 || heads > MAX_HEADS) {
        PyErr_Format(PyExc_ValueError, "heads must be 1 to %d (got %lld)", MAX_HEADS, heads);
        return NULL;
    }
    if (phase1 ? sites < 1 || sites > MAX_SITES : sites != -1 && sites != 0) {
        if (phase1)
            PyErr_Format(PyExc_ValueError, "op='%s' needs sites, the block's routing sites, 1 to 4096 (got %lld)",
                         op_names[op_i], sites);
        else
            PyErr_Format(PyExc_ValueError, "sites is only for op='phase1' and op='phase1_backward' (got %lld)", sites);
        return NULL;
    }
    attnres_problem p;
    attnres_problem_init(&p, dt, (int64_t)d, (int32_t)n);
    p.op = (attnres_op)op_i;
    p.heads = (int32_t)heads;
    p.form = (attnres_form)form_i;
    p.epilogue = epilogue;
    p.s = phase1 ? (int32_t)sites : 0;
    p.fuse_add = fuse_add;
    char msg[1024] = "";
    int rc = attnres_problem_check(&p, msg, sizeof msg);
    if (rc != ATTNRES_OK)
        return raise_status(rc, "invalid problem", msg);

    PlanObject *self = (PlanObject *)PyType_GenericAlloc(type, 0);
    if (!self)
        return NULL;
    /* Planning may compile kernels, so it runs without the GIL; the device
     * and the database are pinned meanwhile, so a close() from another
     * thread waits for it. */
    attnres_plan *plan = NULL;
    dev->users++;
    if (db)
        db->users++;
    attnres_device *cdev = dev->dev;
    attnres_db *cdb = db ? db->db : NULL;
    Py_BEGIN_ALLOW_THREADS
    rc = attnres_plan_create(cdev, cdb, &p, require_exact ? ATTNRES_PLAN_REQUIRE_EXACT : 0, &plan, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (db) {
        db->users--;
        db_release(db);
    }
    if (rc != ATTNRES_OK) {
        dev->users--;
        device_release(dev);
        Py_DECREF(self);
        return raise_status(rc, "cannot plan the problem", msg);
    }
    self->plan = plan;
    Py_INCREF(dev);
    self->device = dev;
    self->problem = p;
    return (PyObject *)self;
}

static void plan_dealloc(PyObject *op)
{
    PlanObject *self = (PlanObject *)op;
    if (self->weakrefs)
        PyObject_ClearWeakRefs(op);
    handle_drop(op);
    generic_dealloc(op);
}

int plan_usable(PlanObject *self)
{
    return handle_usable(self->closed, self->plan, "the plan is closed");
}

static PyObject *plan_explain(PyObject *op, PyObject *unused)
{
    (void)unused;
    PlanObject *self = (PlanObject *)op;
    if (!plan_usable(self))
        return NULL;
    size_t need = attnres_plan_explain(self->plan, NULL, 0);
    char *buf = malloc(need + 1);
    if (!buf)
        return PyErr_NoMemory();
    attnres_plan_explain(self->plan, buf, need + 1);
    PyObject *text = PyUnicode_DecodeUTF8(buf, (Py_ssize_t)strlen(buf), "replace");
    free(buf);
    return text;
}

/* Plan.mix_backward_workspace_size(T): the bytes attnres_mix_backward_workspace_size gives. */
static PyObject *plan_mix_backward_workspace_size(PyObject *op, PyObject *arg)
{
    PlanObject *self = (PlanObject *)op;
    if (!plan_usable(self))
        return NULL;
    long long t = PyLong_AsLongLong(arg);
    if (t == -1 && PyErr_Occurred())
        return NULL;
    size_t bytes = 0;
    int rc = attnres_mix_backward_workspace_size(self->plan, (int64_t)t, &bytes);
    if (rc != ATTNRES_OK)
        return raise_status(rc, "mix_backward_workspace_size", attnres_plan_errmsg(self->plan));
    return PyLong_FromSize_t(bytes);
}

/* Plan.workspace_size(T): the bytes attnres_plan_workspace_size gives, for a plan of any op. */
static PyObject *plan_workspace_size(PyObject *op, PyObject *arg)
{
    PlanObject *self = (PlanObject *)op;
    if (!plan_usable(self))
        return NULL;
    long long t = PyLong_AsLongLong(arg);
    if (t == -1 && PyErr_Occurred())
        return NULL;
    size_t bytes = 0;
    int rc = attnres_plan_workspace_size(self->plan, (int64_t)t, &bytes);
    if (rc != ATTNRES_OK)
        return raise_status(rc, "workspace_size", attnres_plan_errmsg(self->plan));
    return PyLong_FromSize_t(bytes);
}

static PyObject *plan_get_level(PyObject *op, void *closure)
{
    (void)closure;
    PlanObject *self = (PlanObject *)op;
    if (!plan_usable(self))
        return NULL;
    static const char *const names[] = {"exact", "architecture", "backend", "generic"};
    int level = (int)attnres_plan_level_get(self->plan);
    return PyUnicode_FromString(level >= 0 && level < 4 ? names[level] : "unknown");
}

static PyObject *plan_get_problem(PyObject *op, void *closure)
{
    (void)closure;
    const attnres_problem *p = &((PlanObject *)op)->problem;
    return Py_BuildValue("{sssssLsisisssOsisO}", "op", op_names[p->op], "dtype", attnres_dtype_name(p->dtype), "d",
                         (long long)p->d, "n", (int)p->n, "heads", (int)p->heads, "form",
                         p->form == ATTNRES_FORM_ADDITIVE ? "additive" : "replace", "epilogue",
                         p->epilogue ? Py_True : Py_False, "sites", (int)p->s, "fuse_add",
                         p->fuse_add ? Py_True : Py_False);
}

static PyObject *plan_get_device(PyObject *op, void *closure)
{
    (void)closure;
    PlanObject *self = (PlanObject *)op;
    if (!self->device)
        Py_RETURN_NONE;
    Py_INCREF(self->device);
    return (PyObject *)self->device;
}

static PyObject *plan_repr(PyObject *op)
{
    PlanObject *self = (PlanObject *)op;
    const attnres_problem *p = &self->problem;
    return PyUnicode_FromFormat("<attnres.Plan op=%s dtype=%s d=%lld n=%d heads=%d%s>", op_names[p->op],
                                attnres_dtype_name(p->dtype), (long long)p->d, (int)p->n, (int)p->heads,
                                self->closed ? " closed" : "");
}

#define FASTCALL_KW(fn) ((PyCFunction)(void (*)(void))(fn))

static PyMethodDef plan_methods[] = {
    {"mix", FASTCALL_KW(plan_mix), METH_FASTCALL | METH_KEYWORDS,
     "mix(sources, query, *, gain=None, eps=1e-6, scale=1.0, partial=None, alpha=1.0, out_gain=None,\n"
     "    out_eps=1e-6, normed=None, out=None, stream=None) -> out, or (out, normed) with the epilogue"},
    {"phase1", FASTCALL_KW(plan_phase1), METH_FASTCALL | METH_KEYWORDS,
     "phase1(sources, queries, *, gains=None, eps=1e-6, scale=1.0, out=None, lse=None, stream=None)\n"
     "    -> (o1, lse), o1 of shape (S, T, d) and lse (S, T, H) float32"},
    {"phase2", FASTCALL_KW(plan_phase2), METH_FASTCALL | METH_KEYWORDS,
     "phase2(o1, lse, partial, query, *, gain=None, sublayer=None, eps=1e-6, scale=1.0, out_gain=None,\n"
     "       out_eps=1e-6, normed=None, out=None, stream=None) -> out, or (out, normed) with the epilogue;\n"
     "with fuse_add, partial is updated in place to partial + sublayer"},
    {"mix_backward", FASTCALL_KW(plan_mix_backward), METH_FASTCALL | METH_KEYWORDS,
     "mix_backward(sources, query, dout, *, gain=None, eps=1e-6, scale=1.0, alpha=1.0, dsources=None,\n"
     "             dquery=None, dgain=None, dpartial=None, dalpha=None, accumulate=False, dsources_f32=False,\n"
     "             stream=None, out=None, out_gain=None, out_eps=1e-6, dnormed=None, dout_gain=None,\n"
     "             workspace=None)\n"
     "    -> (dsources, dquery, dgain), and in the additive form (dsources, dquery, dgain, dpartial, dalpha):\n"
     "the gradients of the mix (DESIGN §1b) for a plan made with op='mix_backward'; dgain is None\n"
     "without gain; accumulate=True adds into the given dsources (and dpartial); dsources_f32=True\n"
     "makes every source gradient float32 (written or added unrounded) whatever the plan's dtype.\n"
     "A plan with epilogue=True takes the forward's out and out_gain and dnormed, the gradient of\n"
     "normed (dout may then be None), and returns the gradient of out_gain (float32, (d,)) last.\n"
     "A CUDA plan runs on stream= (else the arrays' current stream), takes the folded query (no\n"
     "gain=) and needs workspace=, a device buffer of mix_backward_workspace_size(T) bytes"},
    {"mix_backward_workspace_size", plan_mix_backward_workspace_size, METH_O,
     "mix_backward_workspace_size(T) -> the bytes of the workspace a run on up to T tokens needs\n"
     "(a CUDA plan takes it as workspace=, a device buffer; a CPU plan uses scratch of its own)"},
    {"phase1_backward", FASTCALL_KW(plan_phase1_backward), METH_FASTCALL | METH_KEYWORDS,
     "phase1_backward(sources, queries, do1, dlse=None, *, gains=None, eps=1e-6, scale=1.0, dsources=None,\n"
     "                dqueries=None, dgains=None, accumulate=False, dsources_f32=False, stream=None,\n"
     "                workspace=None)\n"
     "    -> (dsources, dqueries, dgains)\n"
     "The backward of phase1 for a plan made with op='phase1_backward' (the forward's d, n, heads and\n"
     "sites; at most 64 sites on the CPU): the forward's inputs, do1 the gradients of the S outputs o1\n"
     "(one (S, T, d) array of the plan's dtype, or a sequence of S (T, d) arrays sharing a token\n"
     "stride) and dlse those of lse (None for zero, or an (S, T, H) float32 bank, as phase2_backward\n"
     "returns them). dsources (n, T, d) is each source's gradient summed over the sites, dqueries\n"
     "(S, d) float32 the gradients of the queries (of w with gains=, whose gradient dgains is then\n"
     "returned, else None), summed over tokens in a fixed order. accumulate=True adds into the given\n"
     "dsources; dsources_f32=True makes them float32 whatever the plan's dtype. A CUDA plan takes the\n"
     "folded queries (no gains=) and needs workspace=, a device buffer of workspace_size(T) bytes"},
    {"phase2_backward", FASTCALL_KW(plan_phase2_backward), METH_FASTCALL | METH_KEYWORDS,
     "phase2_backward(o1, lse, partial, query, dout, *, gain=None, eps=1e-6, scale=1.0, out_gain=None,\n"
     "                out_eps=1e-6, dnormed=None, do1=None, dlse=None, dpartial=None, dsublayer=None,\n"
     "                dquery=None, dgain=None, dout_gain=None, accumulate=False, stream=None,\n"
     "                workspace=None)\n"
     "    -> (do1, dlse, dpartial, dquery, dgain), and with the epilogue\n"
     "       (do1, dlse, dpartial, dquery, dgain, dout_gain)\n"
     "The backward of phase2 for a plan made with op='phase2_backward' (the forward's d, heads,\n"
     "fuse_add and epilogue): the forward's inputs, partial as the forward used it (with fuse_add,\n"
     "partial after the call: partial + sublayer), and dout, the gradient of out. It returns the\n"
     "gradients of o1, of lse (float32 (T, H), for phase1_backward), of partial (with fuse_add also\n"
     "that of partial before the add and of the sublayer output, which dsublayer=, if given, receives\n"
     "too) and of the query (of w with gain=, whose gradient dgain is then returned, else None),\n"
     "float32 and summed over tokens in a fixed order. A plan with epilogue=True takes out_gain= and\n"
     "dnormed=, the gradient of normed (dout may then be None), and returns the gradient of out_gain\n"
     "last. accumulate=True adds into the given do1, dlse and dpartial (and dsublayer). A CUDA plan\n"
     "takes the folded query (no gain=) and needs workspace=, a device buffer of workspace_size(T) bytes"},
    {"workspace_size", plan_workspace_size, METH_O,
     "workspace_size(T) -> the bytes of the workspace a run of the plan on up to T tokens needs, for a\n"
     "plan of any op (0 for the forward ops; a CUDA backward plan takes it as workspace=, a device\n"
     "buffer; a CPU plan uses scratch of its own)"},
    {"_time_c", FASTCALL_KW(plan_time_c), METH_FASTCALL | METH_KEYWORDS, NULL},
    {"explain", plan_explain, METH_NOARGS, "Which kernels the plan loaded, at which fallback level, and why."},
    {"close", handle_close, METH_NOARGS, "Destroys the plan (after any run in progress)."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", handle_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"level", plan_get_level, NULL, "The fallback level: exact, architecture, backend or generic.", NULL},
    {"problem", plan_get_problem, NULL, "The planned problem, as a dict.", NULL},
    HANDLE_CLOSED_GETSET(PlanObject),
    {"device", plan_get_device, NULL, "The device the plan runs on (None once closed).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef plan_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(PlanObject, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot plan_slots[] = {
    {Py_tp_members, plan_members},
    {Py_tp_new, plan_new},
    {Py_tp_dealloc, plan_dealloc},
    {Py_tp_methods, plan_methods},
    {Py_tp_getset, plan_getset},
    {Py_tp_repr, plan_repr},
    {Py_tp_doc, "Plan(device, db, *, dtype='f32', d, n, heads=1, form='replace', epilogue=False, op='mix',\n"
                "     sites=None, fuse_add=False, require_exact=False)\n"
                "One routing site planned at model load; db=None plans the built-in kernels. op is mix, phase1,\n"
                "phase2, or a backward: mix_backward, phase1_backward or phase2_backward (sites for phase1 and\n"
                "its backward; n defaults to 1 for phase2 and its backward)."},
    {0, NULL},
};

PyType_Spec plan_spec = {"attnres.Plan", sizeof(PlanObject), 0, Py_TPFLAGS_DEFAULT, plan_slots};
