/*
 * core_device.c - the Device type, a runtime device handle, and
 * attnres.open_device(), which makes one.
 */
#include "core_internal.h"

#include <structmember.h>

#include <stdlib.h>
#include <string.h>

PyObject *open_device(PyObject *module, PyObject *arg)
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
    handle_drop(op);
    Py_CLEAR(self->spec);
    generic_dealloc(op);
}

int device_usable(DeviceObject *self)
{
    return handle_usable(self->closed, self->dev, "the device is closed");
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
    {"close", handle_close, METH_NOARGS, "Closes the device (once the plans made on it are gone)."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", handle_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef device_getset[] = {
    {"info", device_info, NULL, "The device fingerprint fields, as a dict.", NULL},
    HANDLE_CLOSED_GETSET(DeviceObject),
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

PyType_Spec device_spec = {"attnres.Device", sizeof(DeviceObject), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, device_slots};
