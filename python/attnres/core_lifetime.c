/*
 * core_lifetime.c - when the runtime handles behind Device, Db and Plan are
 * released, and what the three handle types share (deallocation, __enter__,
 * __exit__ and the closed attribute).
 *
 * Device, Db and Plan each own one runtime handle. A Plan keeps a reference
 * to its Device, because the runtime requires plans to be destroyed before
 * their device. close() is deterministic but deferred while the handle is in
 * use by a call that released the GIL (or, for a device, while plans made on
 * it are alive): the runtime handle is then released by whoever finishes
 * last. Every counter (users, busy) is only touched with the GIL held, which
 * is what makes that safe.
 */
#include "core_internal.h"

#include <stdlib.h>

void device_release(DeviceObject *self)
{
    if (self->dev && self->closed && self->users == 0) {
        attnres_device_close(self->dev);
        self->dev = NULL;
    }
}

void db_release(DbObject *self)
{
    if (self->db && self->closed && self->users == 0) {
        attnres_db_close(self->db);
        self->db = NULL;
    }
}

/* Destroys the runtime plan once it is closed and idle, then lets go of the
 * device (which the runtime requires to outlive its plans). */
void plan_release(PlanObject *self)
{
    if (self->plan && self->closed && self->busy == 0) {
        attnres_plan_destroy(self->plan);
        self->plan = NULL;
        free(self->scratch);
        self->scratch = NULL;
        self->scratch_size = 0;
        DeviceObject *dev = self->device;
        self->device = NULL;
        if (dev) {
            dev->users--;
            device_release(dev);
            Py_DECREF(dev);
        }
    }
}

/* Marks a handle of any of the three types closed and releases its
 * runtime handle unless a user still holds it. dropping (the handle's
 * deallocation) also forgets the users, none of which can be alive then. */
static void handle_shut(PyObject *self, int dropping)
{
    if (Py_TYPE(self) == DeviceType) {
        DeviceObject *d = (DeviceObject *)self;
        d->closed = 1;
        if (dropping)
            d->users = 0;
        device_release(d);
    } else if (Py_TYPE(self) == DbType) {
        DbObject *b = (DbObject *)self;
        b->closed = 1;
        if (dropping)
            b->users = 0;
        db_release(b);
    } else {
        PlanObject *p = (PlanObject *)self;
        p->closed = 1;
        if (dropping)
            p->busy = 0;
        plan_release(p);
    }
}

void handle_drop(PyObject *self)
{
    handle_shut(self, 1);
}

PyObject *handle_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    handle_shut(self, 0);
    Py_RETURN_NONE;
}

int handle_usable(int closed, const void *runtime_handle, const char *closed_msg)
{
    if (closed || !runtime_handle) {
        PyErr_SetString(PyExc_ValueError, closed_msg);
        return 0;
    }
    return 1;
}

void generic_dealloc(PyObject *self)
{
    PyTypeObject *type = Py_TYPE(self);
    freefunc tp_free = (freefunc)PyType_GetSlot(type, Py_tp_free);
    tp_free(self);
    Py_DECREF(type);
}

PyObject *handle_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    Py_INCREF(self);
    return self;
}

/* Leaving a with block closes the handle, through its own close(). */
PyObject *handle_exit(PyObject *self, PyObject *args)
{
    (void)args;
    return PyObject_CallMethod(self, "close", NULL);
}

PyObject *handle_get_closed(PyObject *self, void *closed_offset)
{
    return PyBool_FromLong(*(const int *)((const char *)self + (size_t)(uintptr_t)closed_offset));
}

/* A run pins its plan: close() from another thread meanwhile only marks
 * it, and the last run to finish destroys it. */
void plan_begin(PlanObject *self)
{
    Py_INCREF(self);
    self->busy++;
}

void plan_end(PlanObject *self)
{
    self->busy--;
    plan_release(self);
    Py_DECREF(self);
}
