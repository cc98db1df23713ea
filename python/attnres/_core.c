/*
 * _core.c - the CPython extension over libattnres.
 *
 * It is written against the stable ABI (Py_LIMITED_API 3.10), so one wheel
 * serves every CPython from 3.10 on, and against the public header attnres.h
 * only. Arrays come in through DLPack: any object with __dlpack__ is read in
 * place with its strides, nothing is copied. The hot-path methods
 * (Plan.mix, Plan.phase1, Plan.phase2) parse their arguments with the
 * vectorcall convention, check everything against the plan before anything
 * is launched (so a refused call writes nothing), and release the GIL while
 * the kernel runs.
 *
 * Handles: Device, Db and Plan each own one runtime handle. A Plan keeps a
 * reference to its Device, because the runtime requires plans to be
 * destroyed before their device. close() is deterministic but deferred while
 * the handle is in use by a call that released the GIL (or, for a device,
 * while plans made on it are alive): the runtime handle is then released by
 * whoever finishes last. Every counter below is only touched with the GIL
 * held, which is what makes that safe.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attnres.h"

/* DLPack's structures and the checks of a borrowed tensor live in
 * dlpack_check.c, which has no Python in it so that a fuzz target can drive
 * it (tests/fuzz/fuzz_dlpack.c). */
#include "dlpack_check.h"

/* ---- module globals ----------------------------------------------------
 * The module supports one interpreter (single-phase init), so its state can
 * live in statics. */

static PyObject *Error;         /* attnres.Error(RuntimeError) */
static PyObject *ArgumentError; /* attnres.ArgumentError(Error, ValueError) */
static PyObject *helper_empty;  /* attnres._empty(like, shape, dtype, device) */
static PyObject *helper_stream; /* attnres._stream(stream, like, device) */
static PyObject *str_dlpack;
static PyObject *empty_tuple;
static PyObject *kw_max_version; /* {"max_version": (1, 0)}, the CPU plans' DLPack request */
static PyTypeObject *DeviceType, *DbType, *PlanType;

/* The runtime's largest problem sizes, checked here so that every integer a
 * caller passes is range-checked before it is narrowed. */
#define MAX_SOURCES (1 << 20)
#define MAX_HEADS (1 << 20)
#define MAX_SITES 4096

static const char *status_name(int status)
{
    static const char *names[] = {"OK",        "EINVAL",  "ENOMEM",  "ENODEV",       "EDB",
                                  "EDBVERSION", "ENOTFOUND", "ECOMPILE", "ELOAD",       "ELAUNCH",
                                  "EUNSUPPORTED", "EIO",   "EMISMATCH"};
    return status >= 0 && status < (int)(sizeof names / sizeof names[0]) ? names[status] : "UNKNOWN";
}

/* Raises the exception for a runtime status: bad arguments (EINVAL,
 * EMISMATCH) are an ArgumentError, which is also a ValueError; everything
 * else an attnres.Error. Both carry .status, .status_name and the runtime's
 * message. Returns NULL for the caller to return. */
static PyObject *raise_status(int status, const char *context, const char *msg)
{
    PyObject *type = status == ATTNRES_EINVAL || status == ATTNRES_EMISMATCH ? ArgumentError : Error;
    PyObject *text = PyUnicode_FromFormat("%s: %s (%s)", context, msg && *msg ? msg : attnres_errstr(status),
                                          status_name(status));
    if (!text)
        return NULL;
    PyObject *exc = PyObject_CallFunctionObjArgs(type, text, NULL);
    Py_DECREF(text);
    if (!exc)
        return NULL;
    PyObject *code = PyLong_FromLong(status);
    PyObject *name = PyUnicode_FromString(status_name(status));
    PyObject *message = PyUnicode_FromString(msg ? msg : "");
    if (code && name && message && PyObject_SetAttrString(exc, "status", code) == 0 &&
        PyObject_SetAttrString(exc, "status_name", name) == 0 &&
        PyObject_SetAttrString(exc, "message", message) == 0)
        PyErr_SetObject(type, exc);
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_XDECREF(message);
    Py_DECREF(exc);
    return NULL;
}

/* ---- handles -------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    attnres_device *dev;
    int users;  /* live plans and plan creations in progress */
    int closed; /* close() was called; the handle goes when users reach 0 */
    int is_cuda;
    int ordinal;
    PyObject *spec;
    PyObject *weakrefs;
} DeviceObject;

typedef struct {
    PyObject_HEAD
    attnres_db *db;
    int users; /* plan creations in progress */
    int closed;
    PyObject *path;
} DbObject;

typedef struct {
    PyObject_HEAD
    attnres_plan *plan;
    DeviceObject *device;
    attnres_problem problem;
    int busy; /* runs in progress with the GIL released */
    int closed;
    PyObject *weakrefs;
} PlanObject;

static void device_release(DeviceObject *self)
{
    if (self->dev && self->closed && self->users == 0) {
        attnres_device_close(self->dev);
        self->dev = NULL;
    }
}

static void db_release(DbObject *self)
{
    if (self->db && self->closed && self->users == 0) {
        attnres_db_close(self->db);
        self->db = NULL;
    }
}

/* Destroys the runtime plan once it is closed and idle, then lets go of the
 * device (which the runtime requires to outlive its plans). */
static void plan_release(PlanObject *self)
{
    if (self->plan && self->closed && self->busy == 0) {
        attnres_plan_destroy(self->plan);
        self->plan = NULL;
        DeviceObject *dev = self->device;
        self->device = NULL;
        if (dev) {
            dev->users--;
            device_release(dev);
            Py_DECREF(dev);
        }
    }
}

static void generic_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    tp_free(self);
    Py_DECREF(type);
}

/* ---- Device ---- */

static PyObject *open_device(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "open_device() takes a device spec string: 'cpu' or 'cuda:N'");
        return NULL;
    }
    const char *spec = PyUnicode_AsUTF8AndSize(arg, NULL);
    if (!spec)
        return NULL;
    int is_cuda = strncmp(spec, "cuda", 4) == 0, ordinal = 0;
    if (is_cuda && spec[4] == ':') {
        char *end = NULL;
        long v = strtol(spec + 5, &end, 10);
        if (end == spec + 5 || *end || v < 0 || v > 1024) {
            PyErr_Format(PyExc_ValueError, "device spec '%s' is not 'cuda:N' with N a device number", spec);
            return NULL;
        }
        ordinal = (int)v;
    }
    attnres_device *dev = NULL;
    char msg[1024] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = attnres_device_open(spec, &dev, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    if (rc != ATTNRES_OK)
        return raise_status(rc, "cannot open device", msg);
    DeviceObject *self = PyObject_New(DeviceObject, DeviceType);
    if (!self) {
        attnres_device_close(dev);
        return NULL;
    }
    self->dev = dev;
    self->users = 0;
    self->closed = 0;
    self->is_cuda = is_cuda;
    self->ordinal = ordinal;
    self->weakrefs = NULL;
    Py_INCREF(arg);
    self->spec = arg;
    return (PyObject *)self;
}

static void device_dealloc(PyObject *op)
{
    DeviceObject *self = (DeviceObject *)op;
    if (self->weakrefs)
        PyObject_ClearWeakRefs(op);
    /* Plans hold a reference, so none is alive here. */
    self->closed = 1;
    self->users = 0;
    device_release(self);
    Py_CLEAR(self->spec);
    generic_dealloc(op);
}

static PyObject *device_close(PyObject *op, PyObject *unused)
{
    (void)unused;
    DeviceObject *self = (DeviceObject *)op;
    self->closed = 1;
    device_release(self);
    Py_RETURN_NONE;
}

static int device_usable(DeviceObject *self)
{
    if (self->closed || !self->dev) {
        PyErr_SetString(PyExc_ValueError, "the device is closed");
        return 0;
    }
    return 1;
}

static PyObject *device_info(PyObject *op, void *closure)
{
    (void)closure;
    DeviceObject *self = (DeviceObject *)op;
    if (!device_usable(self))
        return NULL;
    attnres_device_info info = {.struct_size = sizeof info};
    int rc = attnres_device_info_get(self->dev, &info);
    if (rc != ATTNRES_OK)
        return raise_status(rc, "device info", attnres_device_errmsg(self->dev));
    return Py_BuildValue("{sssssssisLsssssO}", "backend", info.backend, "name", info.name, "arch", info.arch,
                         "units", (int)info.units, "memory", (long long)info.memory, "driver", info.driver,
                         "fingerprint", info.fingerprint, "simulated", info.simulated ? Py_True : Py_False);
}

static PyObject *handle_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

static PyObject *device_exit(PyObject *self, PyObject *args)
{
    (void)args;
    return device_close(self, NULL);
}

static PyObject *device_get_closed(PyObject *op, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((DeviceObject *)op)->closed);
}

static PyObject *device_get_spec(PyObject *op, void *closure)
{
    (void)closure;
    DeviceObject *self = (DeviceObject *)op;
    Py_INCREF(self->spec);
    return self->spec;
}

static PyObject *device_repr(PyObject *op)
{
    DeviceObject *self = (DeviceObject *)op;
    return PyUnicode_FromFormat("<attnres.Device %R%s>", self->spec, self->closed ? " closed" : "");
}

static PyMethodDef device_methods[] = {
    {"close", device_close, METH_NOARGS, "Closes the device (once the plans made on it are gone)."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", device_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef device_getset[] = {
    {"info", device_info, NULL, "The device fingerprint fields, as a dict.", NULL},
    {"closed", device_get_closed, NULL, "Whether close() was called.", NULL},
    {"spec", device_get_spec, NULL, "The spec the device was opened with.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* Weak references let engines keep caches of devices and plans without
 * keeping them alive; the limited API declares the slot as a member. */
static PyMemberDef device_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(DeviceObject, weakrefs), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot device_slots[] = {
    {Py_tp_members, device_members},
    {Py_tp_dealloc, device_dealloc},
    {Py_tp_methods, device_methods},
    {Py_tp_getset, device_getset},
    {Py_tp_repr, device_repr},
    {Py_tp_doc, "A device handle; made by attnres.open_device()."},
    {0, NULL},
};

static PyType_Spec device_spec = {"attnres.Device", sizeof(DeviceObject), 0,
                                  Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, device_slots};

/* ---- Db ---- */

static PyObject *open_db(PyObject *module, PyObject *arg)
{
    (void)module;
    PyObject *bytes = NULL;
    if (!PyUnicode_FSConverter(arg, &bytes))
        return NULL;
    const char *path = PyBytes_AsString(bytes);
    if (!path) {
        Py_DECREF(bytes);
        return NULL;
    }
    attnres_db *db = NULL;
    char msg[1024] = "";
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = attnres_db_open(path, &db, msg, sizeof msg);
    Py_END_ALLOW_THREADS
    Py_DECREF(bytes);
    if (rc != ATTNRES_OK)
        return raise_status(rc, "cannot open the database", msg);
    DbObject *self = PyObject_New(DbObject, DbType);
    if (!self) {
        attnres_db_close(db);
        return NULL;
    }
    self->db = db;
    self->users = 0;
    self->closed = 0;
    Py_INCREF(arg);
    self->path = arg;
    return (PyObject *)self;
}

static void db_dealloc(PyObject *op)
{
    DbObject *self = (DbObject *)op;
    self->closed = 1;
    self->users = 0;
    db_release(self);
    Py_CLEAR(self->path);
    generic_dealloc(op);
}

static PyObject *db_close(PyObject *op, PyObject *unused)
{
    (void)unused;
    DbObject *self = (DbObject *)op;
    self->closed = 1;
    db_release(self);
    Py_RETURN_NONE;
}

static PyObject *db_exit(PyObject *self, PyObject *args)
{
    (void)args;
    return db_close(self, NULL);
}

static PyObject *db_get_closed(PyObject *op, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((DbObject *)op)->closed);
}

static PyObject *db_repr(PyObject *op)
{
    DbObject *self = (DbObject *)op;
    return PyUnicode_FromFormat("<attnres.Db %R%s>", self->path, self->closed ? " closed" : "");
}

static PyMethodDef db_methods[] = {
    {"close", db_close, METH_NOARGS, "Closes the database; plans made from it stay valid."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", db_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef db_getset[] = {
    {"closed", db_get_closed, NULL, "Whether close() was called.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot db_slots[] = {
    {Py_tp_dealloc, db_dealloc},
    {Py_tp_methods, db_methods},
    {Py_tp_getset, db_getset},
    {Py_tp_repr, db_repr},
    {Py_tp_doc, "A read-only tuning database; made by attnres.open_db()."},
    {0, NULL},
};

static PyType_Spec db_spec = {"attnres.Db", sizeof(DbObject), 0,
                              Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, db_slots};

/* ---- Plan creation ---- */

static int parse_choice(const char *what, const char *value, const char *const *names, int count, int *out)
{
    for (int i = 0; i < count; i++)
        if (strcmp(value, names[i]) == 0) {
            *out = i;
            return 0;
        }
    PyErr_Format(PyExc_ValueError, "%s must be one of %s%s%s%s%s (got '%s')", what, names[0], count > 1 ? ", " : "",
                 count > 1 ? names[1] : "", count > 2 ? ", " : "", count > 2 ? names[2] : "", value);
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
    static const char *const ops[] = {"mix", "phase1", "phase2"};
    static const char *const forms[] = {"replace", "additive"};
    int op_i, form_i;
    attnres_dtype dt;
    if (parse_choice("op", op, ops, 3, &op_i) || parse_choice("form", form, forms, 2, &form_i))
        return NULL;
    if (attnres_dtype_parse(dtype, &dt) != ATTNRES_OK) {
        PyErr_Format(PyExc_ValueError, "dtype must be one of f32, bf16, f16 (got '%s')", dtype);
        return NULL;
    }
    if (d < 1 || d > ((long long)1 << 40)) {
        PyErr_Format(PyExc_ValueError, "d must be given and be at least 1 (got %lld)", d);
        return NULL;
    }
    if (n == -1)
        n = op_i == ATTNRES_OP_PHASE2 ? 1 : -1;
    if (n < 1 || n > MAX_SOURCES) {
        PyErr_Format(PyExc_ValueError, "n (the number of sources) must be given and be 1 to %d (got %lld)",
                     MAX_SOURCES, n);
        return NULL;
    }
    if (heads < 1 || heads > MAX_HEADS) {
        PyErr_Format(PyExc_ValueError, "heads must be 1 to %d (got %lld)", MAX_HEADS, heads);
        return NULL;
    }
    if (op_i == ATTNRES_OP_PHASE1 ? sites < 1 || sites > MAX_SITES : sites != -1 && sites != 0) {
        PyErr_Format(PyExc_ValueError,
                     op_i == ATTNRES_OP_PHASE1 ? "op='phase1' needs sites, the block's routing sites, 1 to 4096 (got %lld)"
                                               : "sites is only for op='phase1' (got %lld)",
                     sites);
        return NULL;
    }
    attnres_problem p;
    attnres_problem_init(&p, dt, (int64_t)d, (int32_t)n);
    p.op = (attnres_op)op_i;
    p.heads = (int32_t)heads;
    p.form = (attnres_form)form_i;
    p.epilogue = epilogue;
    p.s = op_i == ATTNRES_OP_PHASE1 ? (int32_t)sites : 0;
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
    self->closed = 1;
    self->busy = 0;
    plan_release(self);
    generic_dealloc(op);
}

static PyObject *plan_close(PyObject *op, PyObject *unused)
{
    (void)unused;
    PlanObject *self = (PlanObject *)op;
    self->closed = 1;
    plan_release(self);
    Py_RETURN_NONE;
}

static PyObject *plan_exit(PyObject *self, PyObject *args)
{
    (void)args;
    return plan_close(self, NULL);
}

static int plan_usable(PlanObject *self)
{
    if (self->closed || !self->plan) {
        PyErr_SetString(PyExc_ValueError, "the plan is closed");
        return 0;
    }
    return 1;
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
    static const char *const ops[] = {"mix", "phase1", "phase2"};
    return Py_BuildValue("{sssssLsisisssOsisO}", "op", ops[p->op], "dtype", attnres_dtype_name(p->dtype), "d",
                         (long long)p->d, "n", (int)p->n, "heads", (int)p->heads, "form",
                         p->form == ATTNRES_FORM_ADDITIVE ? "additive" : "replace", "epilogue",
                         p->epilogue ? Py_True : Py_False, "sites", (int)p->s, "fuse_add",
                         p->fuse_add ? Py_True : Py_False);
}

static PyObject *plan_get_closed(PyObject *op, void *closure)
{
    (void)closure;
    return PyBool_FromLong(((PlanObject *)op)->closed);
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

/* ---- one call's borrowed arrays -------------------------------------------
 * A call collects every DLPack tensor it consumed, every Python object it
 * made (outputs, folded queries) and every scratch buffer, and gives them
 * all back at the end, error or not. */

#define INLINE_SLOTS 24

typedef struct {
    void **items;
    Py_ssize_t count, cap;
    void *inline_items[INLINE_SLOTS];
} ptr_list;

static void list_init(ptr_list *l)
{
    l->items = l->inline_items;
    l->count = 0;
    l->cap = INLINE_SLOTS;
}

static int list_push(ptr_list *l, void *item)
{
    if (l->count == l->cap) {
        Py_ssize_t cap = l->cap * 2;
        void **grown = malloc(sizeof(void *) * (size_t)cap);
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(grown, l->items, sizeof(void *) * (size_t)l->count);
        if (l->items != l->inline_items)
            free(l->items);
        l->items = grown;
        l->cap = cap;
    }
    l->items[l->count++] = item;
    return 0;
}

static void list_free(ptr_list *l)
{
    if (l->items != l->inline_items)
        free(l->items);
    list_init(l);
}

typedef struct {
    PlanObject *plan;
    ptr_list tensors;  /* dl_managed * to give back through their deleters */
    ptr_list vtensors; /* dl_managed_versioned *, likewise */
    ptr_list objects; /* PyObject * references to drop */
    ptr_list buffers; /* malloc'd scratch */
    PyObject *kw_versioned; /* the keywords of __dlpack__: max_version, and the stream on CUDA */
    PyObject *kw_legacy;    /* the keywords for a producer without max_version: NULL, or the stream */
} call_ctx;

static void ctx_init(call_ctx *c, PlanObject *plan)
{
    c->plan = plan;
    list_init(&c->tensors);
    list_init(&c->vtensors);
    list_init(&c->objects);
    list_init(&c->buffers);
    c->kw_versioned = Py_NewRef(kw_max_version);
    c->kw_legacy = NULL;
}

/* Gives everything back. Deleters may touch Python objects (NumPy's does),
 * so this runs with the GIL held; the current exception is kept. */
static void ctx_free(call_ctx *c)
{
    for (Py_ssize_t i = 0; i < c->tensors.count; i++) {
        dl_managed *m = c->tensors.items[i];
        if (m->deleter)
            m->deleter(m);
    }
    for (Py_ssize_t i = 0; i < c->vtensors.count; i++) {
        dl_managed_versioned *m = c->vtensors.items[i];
        if (m->deleter)
            m->deleter(m);
    }
    for (Py_ssize_t i = 0; i < c->objects.count; i++)
        Py_DECREF((PyObject *)c->objects.items[i]);
    for (Py_ssize_t i = 0; i < c->buffers.count; i++)
        free(c->buffers.items[i]);
    list_free(&c->tensors);
    list_free(&c->vtensors);
    list_free(&c->objects);
    list_free(&c->buffers);
    Py_CLEAR(c->kw_versioned);
    Py_CLEAR(c->kw_legacy);
}

static void *ctx_alloc(call_ctx *c, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        PyErr_NoMemory();
        return NULL;
    }
    if (list_push(&c->buffers, p)) {
        free(p);
        return NULL;
    }
    return p;
}

/* An array as the kernels see it: a pointer and up to three dimensions with
 * element strides, every field checked (dlpack_check.h). */
typedef dlpack_view view;

static const char *dtype_text(dl_dtype t, char *buf, size_t len)
{
    const char *kind = t.code == 0 ? "int" : t.code == 1 ? "uint" : t.code == DL_FLOAT ? "float"
                       : t.code == DL_BFLOAT ? "bfloat" : t.code == 5 ? "complex" : t.code == 6 ? "bool" : "type";
    if (t.lanes == 1)
        snprintf(buf, len, "%s%u", kind, (unsigned)t.bits);
    else
        snprintf(buf, len, "%s%ux%u", kind, (unsigned)t.bits, (unsigned)t.lanes);
    return buf;
}

/* After a CUDA plan's __dlpack__(stream=...) failed: when obj's
 * __dlpack_device__ says it is not on the plan's device (host arrays refuse
 * a stream), that is the error to report. Returns 1 with that error set,
 * else 0 with the original error kept. */
static int wrong_device(call_ctx *c, PyObject *obj, const char *name)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int devtype = -1, devid = -1;
    PyObject *where = PyObject_CallMethod(obj, "__dlpack_device__", NULL);
    if (!where || !PyArg_ParseTuple(where, "ii", &devtype, &devid))
        devtype = -1;
    Py_XDECREF(where);
    PyErr_Clear();
    const DeviceObject *dev = c->plan->device;
    if (devtype == -1 || ((devtype == DL_CUDA || devtype == DL_CUDA_MANAGED) && devid == dev->ordinal)) {
        PyErr_Restore(type, value, tb);
        return 0;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Format(PyExc_ValueError, "%s is on %s:%d but the plan runs on %U", name,
                 devtype == DL_CPU ? "cpu" : devtype == DL_CUDA ? "cuda" : "device type", devid, dev->spec);
    return 1;
}

/* Calls obj.__dlpack__: first as DLPack 1.0 asks, with max_version, then,
 * for a producer from before 1.0 that refuses the keyword with a
 * TypeError, without it. */
static PyObject *call_dlpack(call_ctx *c, PyObject *method)
{
    PyObject *capsule = PyObject_Call(method, empty_tuple, c->kw_versioned);
    if (!capsule && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        capsule = c->kw_legacy ? PyObject_Call(method, empty_tuple, c->kw_legacy) : PyObject_CallNoArgs(method);
    }
    return capsule;
}

/* Consumes obj's DLPack capsule, versioned or legacy: the capsule is
 * renamed "used_dltensor_versioned" or "used_dltensor" as the protocol
 * requires, and the tensor is given back through its deleter when the call
 * ends. obj is an array with __dlpack__, or an unused capsule itself (what
 * torch.utils.dlpack.to_dlpack returns, many times cheaper than torch's
 * __dlpack__; attnres.torch passes those). ndim is the rank the argument
 * must have; a writable argument (an output) must not be flagged read-only,
 * nor be a copy the producer made. */
static int borrow(call_ctx *c, PyObject *obj, const char *name, int ndim, int writable, view *v)
{
    const int given_capsule = PyCapsule_CheckExact(obj);
    PyObject *capsule;
    if (given_capsule) {
        capsule = Py_NewRef(obj);
    } else {
        PyObject *method = PyObject_GetAttr(obj, str_dlpack);
        if (!method) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "%s must be an array with __dlpack__ (NumPy >= 1.22, torch, CuPy, JAX) or a DLPack capsule, got %S",
                         name, (PyObject *)Py_TYPE(obj));
            return -1;
        }
        capsule = call_dlpack(c, method);
        Py_DECREF(method);
    }
    if (!capsule && c->plan->device->is_cuda && wrong_device(c, obj, name))
        return -1;
    if (!capsule) {
        /* NumPy refuses read-only arrays through the legacy ABI, for
         * example; say which argument. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_Format(PyExc_ValueError, "%s cannot be exported through DLPack: %S", name, value ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    char err[512];
    int rc;
    if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        dl_managed_versioned *m = PyCapsule_GetPointer(capsule, "dltensor_versioned");
        if (PyCapsule_SetName(capsule, "used_dltensor_versioned") || list_push(&c->vtensors, m)) {
            Py_DECREF(capsule);
            return -1;
        }
        Py_DECREF(capsule);
        rc = dlpack_check_versioned(m, ndim, writable, name, v, err, sizeof err);
    } else if (PyCapsule_IsValid(capsule, "dltensor")) {
        dl_managed *m = PyCapsule_GetPointer(capsule, "dltensor");
        if (PyCapsule_SetName(capsule, "used_dltensor") || list_push(&c->tensors, m)) {
            Py_DECREF(capsule);
            return -1;
        }
        Py_DECREF(capsule);
        rc = dlpack_check_legacy(m, ndim, name, v, err, sizeof err);
    } else {
        Py_DECREF(capsule);
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     given_capsule ? "%s is a capsule but not an unused 'dltensor_versioned' or 'dltensor' one"
                                   : "%s.__dlpack__() did not return an unused 'dltensor_versioned' or 'dltensor' capsule",
                     name);
        return -1;
    }
    if (rc) {
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    return 0;
}

/* The element type a dtype name stands for. */
static dl_dtype storage_dl(attnres_dtype dt)
{
    dl_dtype t = {DL_FLOAT, 32, 1};
    if (dt == ATTNRES_DTYPE_BF16)
        t.code = DL_BFLOAT, t.bits = 16;
    else if (dt == ATTNRES_DTYPE_F16)
        t.bits = 16;
    return t;
}

static int same_dtype(dl_dtype a, dl_dtype b)
{
    return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/* Checks an array's element type and that it lives on the plan's device. */
static int check_kind(call_ctx *c, const view *v, const char *name, dl_dtype want)
{
    char got[32], need[32];
    if (!same_dtype(v->dtype, want)) {
        PyErr_Format(PyExc_ValueError, "%s has dtype %s; this plan needs %s", name,
                     dtype_text(v->dtype, got, sizeof got), dtype_text(want, need, sizeof need));
        return -1;
    }
    const DeviceObject *dev = c->plan->device;
    int ok = dev->is_cuda ? (v->device.device_type == DL_CUDA || v->device.device_type == DL_CUDA_MANAGED) &&
                                v->device.device_id == dev->ordinal
                          : v->device.device_type == DL_CPU || v->device.device_type == DL_CUDA_HOST;
    if (!ok) {
        const char *where = v->device.device_type == DL_CPU ? "cpu" : v->device.device_type == DL_CUDA ? "cuda" : "device type";
        PyErr_Format(PyExc_ValueError, "%s is on %s:%d but the plan runs on %U", name, where,
                     (int)v->device.device_id, dev->spec);
        return -1;
    }
    return 0;
}

/* The token stride of a [.., T, width] view whose rows must be contiguous:
 * the kernels read each row as width consecutive elements. */
static int row_stride(const view *v, int axis, const char *name, int64_t *stride)
{
    char err[256];
    if (dlpack_row_stride(v, axis, name, stride, err, sizeof err)) {
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    return 0;
}

static int check_shape2(const view *v, const char *name, int64_t a, int64_t b, const char *why)
{
    if (v->shape[0] != a || v->shape[1] != b) {
        PyErr_Format(PyExc_ValueError, "%s must have shape (%lld, %lld) %s, got (%lld, %lld)", name, (long long)a,
                     (long long)b, why, (long long)v->shape[0], (long long)v->shape[1]);
        return -1;
    }
    return 0;
}

/* A dense fp32 vector or [rows, d] matrix (queries, gains), as the API has
 * no stride for these. */
static int borrow_f32_dense(call_ctx *c, PyObject *obj, const char *name, int ndim, int64_t rows, int64_t d,
                            view *v)
{
    if (borrow(c, obj, name, ndim, 0, v))
        return -1;
    dl_dtype f32 = {DL_FLOAT, 32, 1};
    if (check_kind(c, v, name, f32))
        return -1;
    if (ndim == 1 ? v->shape[0] != d : v->shape[0] != rows || v->shape[1] != d) {
        if (ndim == 1)
            PyErr_Format(PyExc_ValueError, "%s must have shape (%lld,) to match d, got (%lld,)", name, (long long)d,
                         (long long)v->shape[0]);
        else
            PyErr_Format(PyExc_ValueError, "%s must have shape (%lld, %lld), got (%lld, %lld)", name,
                         (long long)rows, (long long)d, (long long)v->shape[0], (long long)v->shape[1]);
        return -1;
    }
    int dense = (d <= 1 || v->strides[ndim - 1] == 1) && (ndim == 1 || rows <= 1 || v->strides[0] == d);
    if (!dense) {
        PyErr_Format(PyExc_ValueError, "%s must be contiguous (C order)", name);
        return -1;
    }
    return 0;
}

/* A bank of count [T, width] views: one [count, T, width] array or a
 * sequence of count [T, width] arrays, each with its own token stride.
 * *t is the T to match, or -1 to take it from the bank. Fills ptrs and
 * strides (count entries each, allocated in c). first_obj receives the
 * object the bank's library is taken from when outputs are allocated. */
static int borrow_bank(call_ctx *c, PyObject *obj, const char *name, int64_t count, int64_t width, dl_dtype dtype,
                       int writable, int64_t *t, void ***ptrs, int64_t **strides, PyObject **first_obj)
{
    void **p = ctx_alloc(c, sizeof(void *) * (size_t)count);
    int64_t *s = ctx_alloc(c, sizeof(int64_t) * (size_t)count);
    if (!p || !s)
        return -1;
    /* One array (with __dlpack__, or its capsule), else a sequence of views. */
    int one_array = PyCapsule_CheckExact(obj);
    if (!one_array) {
        PyObject *method = PyObject_GetAttr(obj, str_dlpack);
        one_array = method != NULL;
        Py_XDECREF(method);
    }
    if (one_array) {
        view v;
        if (borrow(c, obj, name, 3, writable, &v) || check_kind(c, &v, name, dtype))
            return -1;
        if (v.shape[0] != count || v.shape[2] != width || (*t >= 0 && v.shape[1] != *t)) {
            PyErr_Format(PyExc_ValueError, "%s must have shape (%lld, %s, %lld), got (%lld, %lld, %lld)", name,
                         (long long)count, *t >= 0 ? "T" : "T", (long long)width, (long long)v.shape[0],
                         (long long)v.shape[1], (long long)v.shape[2]);
            return -1;
        }
        int64_t st;
        if (row_stride(&v, 1, name, &st))
            return -1;
        for (int64_t i = 0; i < count; i++) {
            p[i] = dlpack_view_item(&v, i);
            s[i] = st;
        }
        *t = v.shape[1];
        *first_obj = obj;
    } else {
        PyErr_Clear();
        PyObject *seq = PySequence_Check(obj) && !PyUnicode_Check(obj) ? PySequence_Tuple(obj) : NULL;
        if (!seq) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be one (%lld, T, %lld) array or a sequence of %lld (T, %lld) arrays",
                         name, (long long)count, (long long)width, (long long)count, (long long)width);
            return -1;
        }
        if (list_push(&c->objects, seq)) {
            Py_DECREF(seq);
            return -1;
        }
        Py_ssize_t len = PyTuple_Size(seq);
        if (len != count) {
            PyErr_Format(PyExc_ValueError, "%s has %zd entries; this plan needs %lld", name, len, (long long)count);
            return -1;
        }
        for (Py_ssize_t i = 0; i < len; i++) {
            char item_name[96];
            snprintf(item_name, sizeof item_name, "%s[%zd]", name, i);
            PyObject *item = PyTuple_GetItem(seq, i);
            view v;
            if (!item || borrow(c, item, item_name, 2, writable, &v) || check_kind(c, &v, item_name, dtype))
                return -1;
            if (v.shape[1] != width || (*t >= 0 && v.shape[0] != *t)) {
                PyErr_Format(PyExc_ValueError, "%s must have shape (%s, %lld), got (%lld, %lld)", item_name,
                             *t >= 0 ? "T" : "T", (long long)width, (long long)v.shape[0], (long long)v.shape[1]);
                return -1;
            }
            if (row_stride(&v, 0, item_name, &s[i]))
                return -1;
            p[i] = v.data;
            *t = v.shape[0];
            if (i == 0)
                *first_obj = item;
        }
    }
    *ptrs = p;
    *strides = s;
    return 0;
}

/* All views of a bank must share one token stride where the API has only
 * one (o1 and lse of phase 1). */
static int common_stride(const int64_t *s, int64_t count, const char *name, int64_t *out)
{
    for (int64_t i = 1; i < count; i++)
        if (s[i] != s[0]) {
            PyErr_Format(PyExc_ValueError, "%s views must share one token stride (view 0 has %lld, view %lld has %lld)",
                         name, (long long)s[0], (long long)i, (long long)s[i]);
            return -1;
        }
    *out = count ? s[0] : 0;
    return 0;
}

/* Allocates an output like `like` (NumPy for NumPy inputs, torch for torch
 * tensors) through attnres._empty, and keeps it for the call. */
static PyObject *allocate(call_ctx *c, PyObject *like, const char *dtype, int ndim, int64_t a, int64_t b, int64_t d)
{
    if (!helper_empty) {
        PyErr_SetString(PyExc_RuntimeError, "attnres._core is used without the attnres package");
        return NULL;
    }
    PyObject *shape = ndim == 2 ? Py_BuildValue("(LL)", (long long)a, (long long)b)
                                : Py_BuildValue("(LLL)", (long long)a, (long long)b, (long long)d);
    if (!shape)
        return NULL;
    PyObject *out = PyObject_CallFunction(helper_empty, "OOsO", like, shape, dtype, (PyObject *)c->plan->device);
    Py_DECREF(shape);
    if (!out)
        return NULL;
    if (list_push(&c->objects, out)) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* The stream a CUDA call runs on: the caller's stream=, else the array
 * library's current stream (attnres._stream knows torch and CuPy). It also
 * sets the keyword DLPack producers get, so that they order their pending
 * work before ours. CPU plans need neither. */
static int resolve_stream(call_ctx *c, PyObject *stream, PyObject *like, void **out)
{
    *out = NULL;
    if (!c->plan->device->is_cuda) {
        if (stream != Py_None) {
            PyErr_SetString(PyExc_ValueError, "stream= is only for CUDA plans");
            return -1;
        }
        return 0;
    }
    PyObject *ptr = PyObject_CallFunctionObjArgs(helper_stream, stream, like, (PyObject *)c->plan->device, NULL);
    if (!ptr)
        return -1;
    void *s = PyLong_AsVoidPtr(ptr);
    Py_DECREF(ptr);
    if (!s && PyErr_Occurred())
        return -1;
    *out = s;
    /* DLPack reserves 0 as ambiguous; 1 names the legacy default stream. */
    const Py_ssize_t dl_stream = (Py_ssize_t)(s ? (intptr_t)s : 1);
    PyObject *versioned = Py_BuildValue("{sns(ii)}", "stream", dl_stream, "max_version", DL_MAJOR, 0);
    PyObject *legacy = Py_BuildValue("{sn}", "stream", dl_stream);
    if (!versioned || !legacy) {
        Py_XDECREF(versioned);
        Py_XDECREF(legacy);
        return -1;
    }
    Py_DECREF(c->kw_versioned);
    c->kw_versioned = versioned;
    c->kw_legacy = legacy;
    return 0;
}

/* The folded pseudo-query u = gain * w (DESIGN §1). Without a gain the
 * query is used in place. On the CPU the product is formed in scratch
 * memory; on a GPU the arrays' own library multiplies them (on its current
 * stream), since the runtime offers no device-side fold. Folding once at
 * model load and passing gain=None is the fast path. */
static int fold(call_ctx *c, PyObject *query, PyObject *gain, const char *qname, const char *gname, int ndim,
                int64_t rows, int64_t d, const float **u)
{
    view q, g;
    if (gain == Py_None) {
        if (borrow_f32_dense(c, query, qname, ndim, rows, d, &q))
            return -1;
        *u = (const float *)q.data;
        return 0;
    }
    if (c->plan->device->is_cuda) {
        if (borrow_f32_dense(c, query, qname, ndim, rows, d, &q) || borrow_f32_dense(c, gain, gname, ndim, rows, d, &g))
            return -1;
        PyObject *prod = PyNumber_Multiply(query, gain);
        if (!prod)
            return -1;
        if (list_push(&c->objects, prod)) {
            Py_DECREF(prod);
            return -1;
        }
        if (borrow_f32_dense(c, prod, qname, ndim, rows, d, &q))
            return -1;
        *u = (const float *)q.data;
        return 0;
    }
    if (borrow_f32_dense(c, query, qname, ndim, rows, d, &q) || borrow_f32_dense(c, gain, gname, ndim, rows, d, &g))
        return -1;
    float *buf = ctx_alloc(c, sizeof(float) * (size_t)(rows * d));
    if (!buf)
        return -1;
    for (int64_t r = 0; r < rows; r++)
        attnres_fold_query((const float *)q.data + r * d, (const float *)g.data + r * d, buf + r * d, d);
    *u = buf;
    return 0;
}

/* ---- the hot-path methods, described by tables ---------------------------
 * Plan.mix, Plan.phase1 and Plan.phase2 differ only in which arguments they
 * take and where each one goes in the runtime's argument struct. Each is a
 * table of argument descriptions (op_spec below), and one function,
 * call_op, does for all three what a call needs: keyword matching, scalar
 * checks, refusing the arguments that the plan's form, epilogue or fused
 * add forbid and asking for those they require, borrowing every array with
 * its shape, dtype, device and stride checked, allocating the outputs that
 * were not given, the run with the GIL released, and the result. */

/* What an argument is. */
enum {
    K_FLOAT,  /* a float scalar, stored at off */
    K_STREAM, /* the CUDA stream; resolved before any array is borrowed */
    K_BANK,   /* count [T, width] views, one (count, T, width) array or a sequence:
               * the pointer array at off, the token strides at aux */
    K_ROWS,   /* one [T, width] view: the pointer at off, its token stride at aux */
    K_QUERY,  /* a dense fp32 [d] (or [S, d] with F_SITES), folded with the gain
               * in slot `partner`; the folded pointer at off */
    K_GAIN,   /* the gain of a K_QUERY, read there */
    K_VEC,    /* a dense fp32 [d] vector (out_gain) at off */
};

/* When an argument applies. Outside its condition it is refused if given. */
enum { W_ALWAYS, W_ADDITIVE, W_EPILOGUE, W_FUSE_ADD };

static const char *const when_needs[] = {"", "form='additive'", "epilogue=True", "fuse_add=True"};
static const char *const when_has[] = {"", "has the additive form", "has the output-norm epilogue",
                                       "fuses the add"};

enum {
    F_REQUIRED = 1 << 0,  /* must be given where it applies */
    F_OUT = 1 << 1,       /* an output: allocated when omitted, borrowed after every input */
    F_F32 = 1 << 2,       /* fp32 rather than the plan's storage type */
    F_HEADS = 1 << 3,     /* width H rather than d */
    F_SITES = 1 << 4,     /* count (or rows) S rather than n (or 1) */
    F_COMMON = 1 << 5,    /* a bank whose views share one token stride, one int64_t at aux */
    F_POSITIVE = 1 << 6,  /* a float that must be > 0 */
    F_FUSED_OUT = 1 << 7, /* an input that the fused add writes in place */
};

typedef struct {
    const char *name;
    PyObject *interned;
    unsigned char kind, when;
    unsigned short flags;
    double dflt;   /* K_FLOAT: the default */
    int partner;   /* K_QUERY: the slot of its gain */
    size_t off;    /* byte offset of the member the value goes to */
    size_t aux;    /* byte offset of the stride member(s) */
} arg_spec;

#define MAX_ARGS 16

typedef union {
    attnres_mix_args mix;
    attnres_phase1_args p1;
    attnres_phase2_args p2;
} run_args;

typedef struct {
    const char *fn;
    attnres_op op;
    int npos;      /* the leading arguments that may be positional; all are required */
    int nargs;
    arg_spec *args;
    void (*init)(run_args *);
    int (*run)(attnres_plan *, int64_t, const run_args *, void *);
    int result[2]; /* the slots returned: one object, or a pair when the second applies */
} op_spec;

/* Matches positional and keyword arguments to slots: the first npos names
 * may be given by position, and must be given. Slots left unset hold NULL. */
static int parse_args(const op_spec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      PyObject **slots)
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
    for (int i = 0; i < spec->npos; i++)
        if (!slots[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", spec->fn, names[i].name);
            return -1;
        }
    return 0;
}

static PyObject *opt(PyObject *slot)
{
    return slot ? slot : Py_None;
}

/* A float argument: finite, within float range, and positive if asked. */
static int get_float(PyObject *slot, const char *name, double dflt, int positive, float *out)
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

/* A run pins its plan: close() from another thread meanwhile only marks
 * it, and the last run to finish destroys it. */
static void plan_begin(PlanObject *self)
{
    Py_INCREF(self);
    self->busy++;
}

static void plan_end(PlanObject *self)
{
    self->busy--;
    plan_release(self);
    Py_DECREF(self);
}

static double clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int applies(const attnres_problem *p, int when)
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

static const char *const op_names[] = {"mix", "phase1", "phase2"};

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
    if (repeat > 0) {
        const double wall0 = clock_ns(CLOCK_MONOTONIC), cpu0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
        for (long i = 0; i < repeat && rc == ATTNRES_OK; i++)
            rc = spec->run(plan, t, &r, stream);
        cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
        wall = clock_ns(CLOCK_MONOTONIC) - wall0;
    } else {
        rc = spec->run(plan, t, &r, stream);
    }
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

static void init_mix(run_args *r)
{
    attnres_mix_args_init(&r->mix);
}

static int run_mix(attnres_plan *plan, int64_t t, const run_args *r, void *stream)
{
    return attnres_run_mix(plan, t, &r->mix, stream);
}

enum { MIX_SOURCES, MIX_QUERY, MIX_GAIN, MIX_EPS, MIX_SCALE, MIX_PARTIAL, MIX_ALPHA, MIX_OUT_GAIN, MIX_OUT_EPS,
       MIX_NORMED, MIX_OUT, MIX_STREAM, MIX_NARGS };
static arg_spec mix_args[MIX_NARGS] = {
    [MIX_SOURCES] = {"sources", NULL, K_BANK, W_ALWAYS, 0, 0, -1, offsetof(attnres_mix_args, sources),
                     offsetof(attnres_mix_args, source_strides)},
    [MIX_QUERY] = {"query", NULL, K_QUERY, W_ALWAYS, 0, 0, MIX_GAIN, offsetof(attnres_mix_args, query), 0},
    [MIX_GAIN] = {"gain", NULL, K_GAIN, W_ALWAYS, 0, 0, -1, 0, 0},
    [MIX_EPS] = FLOAT_ARG("eps", attnres_mix_args, eps, 1e-6, F_POSITIVE),
    [MIX_SCALE] = FLOAT_ARG("scale", attnres_mix_args, scale, 1.0, 0),
    [MIX_PARTIAL] = {"partial", NULL, K_ROWS, W_ADDITIVE, F_REQUIRED, 0, -1, offsetof(attnres_mix_args, partial),
                     offsetof(attnres_mix_args, partial_stride)},
    [MIX_ALPHA] = FLOAT_ARG("alpha", attnres_mix_args, alpha, 1.0, 0),
    [MIX_OUT_GAIN] = {"out_gain", NULL, K_VEC, W_EPILOGUE, F_REQUIRED, 0, -1, offsetof(attnres_mix_args, out_gain), 0},
    [MIX_OUT_EPS] = FLOAT_ARG("out_eps", attnres_mix_args, out_eps, 1e-6, F_POSITIVE),
    [MIX_NORMED] = {"normed", NULL, K_ROWS, W_EPILOGUE, F_OUT, 0, -1, offsetof(attnres_mix_args, normed),
                    offsetof(attnres_mix_args, normed_stride)},
    [MIX_OUT] = {"out", NULL, K_ROWS, W_ALWAYS, F_OUT, 0, -1, offsetof(attnres_mix_args, out),
                 offsetof(attnres_mix_args, out_stride)},
    [MIX_STREAM] = {"stream", NULL, K_STREAM, W_ALWAYS, 0, 0, -1, 0, 0},
};
static const op_spec mix_spec = {"mix", ATTNRES_OP_MIX, 2, MIX_NARGS, mix_args, init_mix, run_mix,
                                 {MIX_OUT, MIX_NORMED}};

static void init_phase1(run_args *r)
{
    attnres_phase1_args_init(&r->p1);
}

static int run_phase1(attnres_plan *plan, int64_t t, const run_args *r, void *stream)
{
    return attnres_run_phase1(plan, t, &r->p1, stream);
}

enum { P1_SOURCES, P1_QUERIES, P1_GAINS, P1_EPS, P1_SCALE, P1_OUT, P1_LSE, P1_STREAM, P1_NARGS };
static arg_spec p1_args[P1_NARGS] = {
    [P1_SOURCES] = {"sources", NULL, K_BANK, W_ALWAYS, 0, 0, -1, offsetof(attnres_phase1_args, sources),
                    offsetof(attnres_phase1_args, source_strides)},
    [P1_QUERIES] = {"queries", NULL, K_QUERY, W_ALWAYS, F_SITES, 0, P1_GAINS, offsetof(attnres_phase1_args, queries), 0},
    [P1_GAINS] = {"gains", NULL, K_GAIN, W_ALWAYS, 0, 0, -1, 0, 0},
    [P1_EPS] = FLOAT_ARG("eps", attnres_phase1_args, eps, 1e-6, F_POSITIVE),
    [P1_SCALE] = FLOAT_ARG("scale", attnres_phase1_args, scale, 1.0, 0),
    [P1_OUT] = {"out", NULL, K_BANK, W_ALWAYS, F_OUT | F_SITES | F_COMMON, 0, -1, offsetof(attnres_phase1_args, o1),
                offsetof(attnres_phase1_args, o1_stride)},
    [P1_LSE] = {"lse", NULL, K_BANK, W_ALWAYS, F_OUT | F_SITES | F_COMMON | F_F32 | F_HEADS, 0, -1,
                offsetof(attnres_phase1_args, lse), offsetof(attnres_phase1_args, lse_stride)},
    [P1_STREAM] = {"stream", NULL, K_STREAM, W_ALWAYS, 0, 0, -1, 0, 0},
};
static const op_spec p1_spec = {"phase1", ATTNRES_OP_PHASE1, 2, P1_NARGS, p1_args, init_phase1, run_phase1,
                                {P1_OUT, P1_LSE}};

static void init_phase2(run_args *r)
{
    attnres_phase2_args_init(&r->p2);
}

static int run_phase2(attnres_plan *plan, int64_t t, const run_args *r, void *stream)
{
    return attnres_run_phase2(plan, t, &r->p2, stream);
}

enum { P2_O1, P2_LSE, P2_PARTIAL, P2_QUERY, P2_GAIN, P2_SUBLAYER, P2_EPS, P2_SCALE, P2_OUT_GAIN, P2_OUT_EPS,
       P2_NORMED, P2_OUT, P2_STREAM, P2_NARGS };
static arg_spec p2_args[P2_NARGS] = {
    [P2_O1] = {"o1", NULL, K_ROWS, W_ALWAYS, 0, 0, -1, offsetof(attnres_phase2_args, o1),
               offsetof(attnres_phase2_args, o1_stride)},
    [P2_LSE] = {"lse", NULL, K_ROWS, W_ALWAYS, F_F32 | F_HEADS, 0, -1, offsetof(attnres_phase2_args, lse),
                offsetof(attnres_phase2_args, lse_stride)},
    [P2_PARTIAL] = {"partial", NULL, K_ROWS, W_ALWAYS, F_FUSED_OUT, 0, -1, offsetof(attnres_phase2_args, partial),
                    offsetof(attnres_phase2_args, partial_stride)},
    [P2_QUERY] = {"query", NULL, K_QUERY, W_ALWAYS, 0, 0, P2_GAIN, offsetof(attnres_phase2_args, query), 0},
    [P2_GAIN] = {"gain", NULL, K_GAIN, W_ALWAYS, 0, 0, -1, 0, 0},
    [P2_SUBLAYER] = {"sublayer", NULL, K_ROWS, W_FUSE_ADD, F_REQUIRED, 0, -1, offsetof(attnres_phase2_args, sublayer),
                     offsetof(attnres_phase2_args, sublayer_stride)},
    [P2_EPS] = FLOAT_ARG("eps", attnres_phase2_args, eps, 1e-6, F_POSITIVE),
    [P2_SCALE] = FLOAT_ARG("scale", attnres_phase2_args, scale, 1.0, 0),
    [P2_OUT_GAIN] = {"out_gain", NULL, K_VEC, W_EPILOGUE, F_REQUIRED, 0, -1, offsetof(attnres_phase2_args, out_gain), 0},
    [P2_OUT_EPS] = FLOAT_ARG("out_eps", attnres_phase2_args, out_eps, 1e-6, F_POSITIVE),
    [P2_NORMED] = {"normed", NULL, K_ROWS, W_EPILOGUE, F_OUT, 0, -1, offsetof(attnres_phase2_args, normed),
                   offsetof(attnres_phase2_args, normed_stride)},
    [P2_OUT] = {"out", NULL, K_ROWS, W_ALWAYS, F_OUT, 0, -1, offsetof(attnres_phase2_args, out),
                offsetof(attnres_phase2_args, out_stride)},
    [P2_STREAM] = {"stream", NULL, K_STREAM, W_ALWAYS, 0, 0, -1, 0, 0},
};
static const op_spec p2_spec = {"phase2", ATTNRES_OP_PHASE2, 4, P2_NARGS, p2_args, init_phase2, run_phase2,
                                {P2_OUT, P2_NORMED}};

static const op_spec *const op_specs[] = {&mix_spec, &p1_spec, &p2_spec};

static PyObject *plan_mix(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_op(&mix_spec, (PlanObject *)op, args, nargs, kwnames, 0);
}

static PyObject *plan_phase1(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_op(&p1_spec, (PlanObject *)op, args, nargs, kwnames, 0);
}

static PyObject *plan_phase2(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return call_op(&p2_spec, (PlanObject *)op, args, nargs, kwnames, 0);
}

/* Plan._time_c(repeat, *args, **keywords) -> (wall, thread CPU) mean ns per
 * attnres_run_* call of the plan's op on those arguments, for
 * bench/python_overhead.py. */
static PyObject *plan_time_c(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
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
    return call_op(op_specs[self->problem.op], self, args + 1, nargs - 1, kwnames, repeat);
}

static PyObject *plan_repr(PyObject *op)
{
    PlanObject *self = (PlanObject *)op;
    static const char *const ops[] = {"mix", "phase1", "phase2"};
    const attnres_problem *p = &self->problem;
    return PyUnicode_FromFormat("<attnres.Plan op=%s dtype=%s d=%lld n=%d heads=%d%s>", ops[p->op],
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
    {"_time_c", FASTCALL_KW(plan_time_c), METH_FASTCALL | METH_KEYWORDS, NULL},
    {"explain", plan_explain, METH_NOARGS, "Which kernels the plan loaded, at which fallback level, and why."},
    {"close", plan_close, METH_NOARGS, "Destroys the plan (after any run in progress)."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", plan_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef plan_getset[] = {
    {"level", plan_get_level, NULL, "The fallback level: exact, architecture, backend or generic.", NULL},
    {"problem", plan_get_problem, NULL, "The planned problem, as a dict.", NULL},
    {"closed", plan_get_closed, NULL, "Whether close() was called.", NULL},
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
                "One routing site planned at model load; db=None plans the built-in kernels."},
    {0, NULL},
};

static PyType_Spec plan_spec = {"attnres.Plan", sizeof(PlanObject), 0, Py_TPFLAGS_DEFAULT, plan_slots};

/* ---- module ---- */

static PyObject *version(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyUnicode_FromString(attnres_version());
}

static PyObject *device_count(PyObject *module, PyObject *arg)
{
    (void)module;
    const char *backend = PyUnicode_Check(arg) ? PyUnicode_AsUTF8AndSize(arg, NULL) : NULL;
    if (!backend) {
        PyErr_SetString(PyExc_TypeError, "device_count() takes 'cpu' or 'cuda'");
        return NULL;
    }
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = attnres_device_count(backend);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(n);
}

/* miss_file_set(path | None): attnres_miss_file_set. A str or os.PathLike
 * names the file (encoded as the file system encodes names); None or ""
 * turns recording off. */
static PyObject *miss_file_set(PyObject *module, PyObject *arg)
{
    (void)module;
    PyObject *bytes = NULL;
    const char *path = NULL;
    if (arg != Py_None) {
        if (!PyUnicode_FSConverter(arg, &bytes))
            return NULL;
        path = PyBytes_AsString(bytes); /* the converter refuses embedded NULs */
        if (!path) {
            Py_DECREF(bytes);
            return NULL;
        }
    }
    const int status = attnres_miss_file_set(path);
    Py_XDECREF(bytes);
    if (status != ATTNRES_OK)
        return raise_status(status, "miss_file_set", "the path must be shorter than 4096 bytes");
    Py_RETURN_NONE;
}

/* attnres/__init__.py hands over the Python helpers that allocate outputs in
 * the inputs' library and find a library's current CUDA stream. */
static PyObject *set_helpers(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *empty, *stream;
    if (!PyArg_ParseTuple(args, "OO", &empty, &stream))
        return NULL;
    Py_INCREF(empty);
    Py_INCREF(stream);
    Py_XDECREF(helper_empty);
    Py_XDECREF(helper_stream);
    helper_empty = empty;
    helper_stream = stream;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"version", version, METH_NOARGS, "attnres_version() of the linked library."},
    {"open_device", open_device, METH_O, "open_device('cpu' | 'cuda' | 'cuda:N') -> Device"},
    {"open_db", open_db, METH_O, "open_db(path) -> Db, opened read-only"},
    {"device_count", device_count, METH_O, "device_count('cpu' | 'cuda') -> int"},
    {"miss_file_set", miss_file_set, METH_O,
     "miss_file_set(path | None): record the problems that plans fall back on in path, for\n"
     "`attnres tune --from-misses path` (attnres_miss_file_set; None or '' turns it off)."},
    {"_set_helpers", set_helpers, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "attnres._core",
                                        "The C core of the attnres package (see attnres).", -1, module_methods,
                                        NULL, NULL, NULL, NULL};

static int intern_names(const op_spec *spec)
{
    for (int i = 0; i < spec->nargs; i++)
        if (!(spec->args[i].interned = PyUnicode_InternFromString(spec->args[i].name)))
            return -1;
    return 0;
}

static int add_type(PyObject *m, PyType_Spec *spec, PyObject *bases, PyTypeObject **out)
{
    PyObject *type = PyType_FromSpecWithBases(spec, bases);
    if (!type)
        return -1;
    const char *dot = strrchr(spec->name, '.');
    if (PyModule_AddObjectRef(m, dot ? dot + 1 : spec->name, type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    *out = (PyTypeObject *)type;
    return 0;
}

PyMODINIT_FUNC PyInit__core(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (intern_names(&mix_spec) || intern_names(&p1_spec) || intern_names(&p2_spec))
        goto fail;
    if (!(str_dlpack = PyUnicode_InternFromString("__dlpack__")) || !(empty_tuple = PyTuple_New(0)) ||
        !(kw_max_version = Py_BuildValue("{s(ii)}", "max_version", DL_MAJOR, 0)))
        goto fail;
    Error = PyErr_NewExceptionWithDoc("attnres.Error",
                                      "A failure reported by libattnres; .status, .status_name and .message say which.",
                                      PyExc_RuntimeError, NULL);
    if (!Error || PyModule_AddObjectRef(m, "Error", Error) < 0)
        goto fail;
    PyObject *bases = PyTuple_Pack(2, Error, PyExc_ValueError);
    if (!bases)
        goto fail;
    ArgumentError = PyErr_NewExceptionWithDoc("attnres.ArgumentError",
                                              "The runtime refused the arguments (EINVAL, EMISMATCH).", bases, NULL);
    Py_DECREF(bases);
    if (!ArgumentError || PyModule_AddObjectRef(m, "ArgumentError", ArgumentError) < 0)
        goto fail;
    if (add_type(m, &device_spec, NULL, &DeviceType) || add_type(m, &db_spec, NULL, &DbType) ||
        add_type(m, &plan_spec, NULL, &PlanType))
        goto fail;
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
