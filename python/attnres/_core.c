/*
 * _core.c - the CPython extension over libattnres: the module attnres._core
 * itself, its globals, its exceptions and the runtime statuses they carry,
 * its module-level functions and its init. The handle types, the borrowing
 * of arrays and the hot-path methods are in the core_*.c files beside it,
 * which share core_internal.h.
 *
 * The extension is written against the stable ABI (Py_LIMITED_API 3.10, set
 * in core_internal.h), so one wheel serves every CPython from 3.10 on, and
 * against the public header attnres.h only. Arrays come in through DLPack:
 * any object with __dlpack__ is read in place with its strides, nothing is
 * copied. The hot-path methods (Plan.mix, Plan.phase1, Plan.phase2) parse
 * their arguments with the vectorcall convention, check everything against
 * the plan before anything is launched (so a refused call writes nothing),
 * and release the GIL while the kernel runs.
 */
#include "core_internal.h"

#include <string.h>

/* ---- module globals ----------------------------------------------------
 * The module supports one interpreter (single-phase init), so its state can
 * live in globals. */

static PyObject *Error;         /* attnres.Error(RuntimeError) */
static PyObject *ArgumentError; /* attnres.ArgumentError(Error, ValueError) */
PyObject *helper_empty;         /* attnres._empty(like, shape, dtype, device) */
PyObject *helper_stream;        /* attnres._stream(stream, like, device) */
PyObject *str_dlpack;
PyObject *empty_tuple;
PyObject *kw_max_version; /* {"max_version": (1, 0)}, the CPU plans' DLPack request */
PyTypeObject *DeviceType, *DbType;
static PyTypeObject *PlanType;

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
PyObject *raise_status(int status, const char *context, const char *msg)
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
    if (ops_intern_names())
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
