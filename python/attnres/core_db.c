/*
 * core_db.c - the Db type, a read-only tuning database handle, and
 * attnres.open_db(), which makes one.
 */
#include "core_internal.h"

PyObject *open_db(PyObject *module, PyObject *arg)
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
    handle_drop(op);
    Py_CLEAR(((DbObject *)op)->path);
    generic_dealloc(op);
}

static PyObject *db_repr(PyObject *op)
{
    DbObject *self = (DbObject *)op;
    return PyUnicode_FromFormat("<attnres.Db %R%s>", self->path, self->closed ? " closed" : "");
}

static PyMethodDef db_methods[] = {
    {"close", handle_close, METH_NOARGS, "Closes the database; plans made from it stay valid."},
    {"__enter__", handle_enter, METH_NOARGS, NULL},
    {"__exit__", handle_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef db_getset[] = {
    HANDLE_CLOSED_GETSET(DbObject),
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

PyType_Spec db_spec = {"attnres.Db", sizeof(DbObject), 0,
                       Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION, db_slots};
