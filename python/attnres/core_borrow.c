/*
 * core_borrow.c - one call's arrays: borrowing them through DLPack (with
 * every field checked), checking their dtype, device, shape and strides
 * against the plan, allocating the outputs a caller left out, resolving the
 * CUDA stream and folding the gain into the query; the call context gives
 * everything back when the call ends.
 */
#include "core_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

void ctx_init(call_ctx *c, PlanObject *plan)
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
void ctx_free(call_ctx *c)
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
int borrow(call_ctx *c, PyObject *obj, const char *name, int ndim, int writable, view *v)
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
dl_dtype storage_dl(attnres_dtype dt)
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
int check_kind(call_ctx *c, const view *v, const char *name, dl_dtype want)
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
int row_stride(const view *v, int axis, const char *name, int64_t *stride)
{
    char err[256];
    if (dlpack_row_stride(v, axis, name, stride, err, sizeof err)) {
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    return 0;
}

int check_shape2(const view *v, const char *name, int64_t a, int64_t b, const char *why)
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
int borrow_f32_dense(call_ctx *c, PyObject *obj, const char *name, int ndim, int64_t rows, int64_t d, view *v)
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
int borrow_bank(call_ctx *c, PyObject *obj, const char *name, int64_t count, int64_t width, dl_dtype dtype,
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
int common_stride(const int64_t *s, int64_t count, const char *name, int64_t *out)
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
 * tensors) through attnres._empty, and keeps it for the call: shape (a,),
 * (a, b) or (a, b, d) for ndim 1, 2 or 3. */
PyObject *allocate(call_ctx *c, PyObject *like, const char *dtype, int ndim, int64_t a, int64_t b, int64_t d)
{
    if (!helper_empty) {
        PyErr_SetString(PyExc_RuntimeError, "attnres._core is used without the attnres package");
        return NULL;
    }
    PyObject *shape = ndim == 1   ? Py_BuildValue("(L)", (long long)a)
                      : ndim == 2 ? Py_BuildValue("(LL)", (long long)a, (long long)b)
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
int resolve_stream(call_ctx *c, PyObject *stream, PyObject *like, void **out)
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
int fold(call_ctx *c, PyObject *query, PyObject *gain, const char *qname, const char *gname, int ndim,
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
