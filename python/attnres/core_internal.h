/*
 * core_internal.h - what the translation units of the extension attnres._core
 * share, and nothing else: the handle objects, one call's context and the
 * functions one file calls in another. Not installed, not part of any API.
 *
 * Every file of the extension includes this header first, so that each one
 * sees Python.h with the same Py_LIMITED_API: the stable ABI of 3.10, which
 * lets one wheel serve every CPython from 3.10 on.
 */
#ifndef ATTNRES_CORE_INTERNAL_H
#define ATTNRES_CORE_INTERNAL_H

#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#include "attnres.h"

/* DLPack's structures and the checks of a borrowed tensor live in
 * dlpack_check.c, which has no Python in it so that a fuzz target can drive
 * it (tests/fuzz/fuzz_dlpack.c). */
#include "dlpack_check.h"

/* ---- module globals (_core.c) ----------------------------------------------
 * The module supports one interpreter (single-phase init), so its state can
 * live in globals, which the module's init sets. */

extern PyObject *helper_empty;  /* attnres._empty(like, shape, dtype, device) */
extern PyObject *helper_stream; /* attnres._stream(stream, like, device) */
extern PyObject *str_dlpack;
extern PyObject *empty_tuple;
extern PyObject *kw_max_version; /* {"max_version": (1, 0)}, the CPU plans' DLPack request */
extern PyTypeObject *DeviceType, *DbType;

PyObject *raise_status(int status, const char *context, const char *msg);

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
    /* The backwards' scratch (mix, phase 1 and phase 2), owned by the plan
     * so that a training step allocates nothing once the largest T has been
     * seen: the runtime's workspace (grown to the largest T so far) and room
     * for the folded query (or queries). scratch_busy marks them lent to a
     * run in progress; a second thread running the same plan meanwhile gets
     * its own for that call. */
    void *scratch;
    size_t scratch_size;
    int scratch_busy;
} PlanObject;

/* core_lifetime.c: deferred release and pinning. */
void device_release(DeviceObject *self);
void db_release(DbObject *self);
void plan_release(PlanObject *self);
void plan_begin(PlanObject *self);
void plan_end(PlanObject *self);
void generic_dealloc(PyObject *self);
/* A Device's, Db's or Plan's deallocation: marks it closed, forgets its
 * users and releases its runtime handle. */
void handle_drop(PyObject *self);
/* close() of the three types: marks the handle closed; its runtime handle
 * goes now, or when the last user finishes. */
PyObject *handle_close(PyObject *self, PyObject *unused);
/* Whether a handle can be used (not closed, its runtime handle alive); else
 * raises ValueError with closed_msg. */
int handle_usable(int closed, const void *runtime_handle, const char *closed_msg);
PyObject *handle_enter(PyObject *self, PyObject *unused);
PyObject *handle_exit(PyObject *self, PyObject *args);
/* The getter of `closed`, for a getset entry whose closure is the offset of
 * the handle's int closed: HANDLE_CLOSED_GETSET(DbObject). */
PyObject *handle_get_closed(PyObject *self, void *closed_offset);
#define HANDLE_CLOSED_GETSET(type) \
    {"closed", handle_get_closed, NULL, "Whether close() was called.", (void *)offsetof(type, closed)}

/* core_device.c, core_db.c, core_plan.c: the handle types. */
extern PyType_Spec device_spec, db_spec, plan_spec;
PyObject *open_device(PyObject *module, PyObject *arg);
PyObject *open_db(PyObject *module, PyObject *arg);
int device_usable(DeviceObject *self);
int plan_usable(PlanObject *self);

/* ---- one call's borrowed arrays (core_borrow.c) ----------------------------
 * A call collects every DLPack tensor it consumed, every Python object it
 * made (outputs, folded queries) and every scratch buffer in its call_ctx,
 * and gives them all back at the end, error or not. */

#define INLINE_SLOTS 24

typedef struct {
    void **items;
    Py_ssize_t count, cap;
    void *inline_items[INLINE_SLOTS];
} ptr_list;

typedef struct {
    PlanObject *plan;
    ptr_list tensors;  /* dl_managed * to give back through their deleters */
    ptr_list vtensors; /* dl_managed_versioned *, likewise */
    ptr_list objects; /* PyObject * references to drop */
    ptr_list buffers; /* malloc'd scratch */
    PyObject *kw_versioned; /* the keywords of __dlpack__: max_version, and the stream on CUDA */
    PyObject *kw_legacy;    /* the keywords for a producer without max_version: NULL, or the stream */
} call_ctx;

/* An array as the kernels see it: a pointer and up to three dimensions with
 * element strides, every field checked (dlpack_check.h). */
typedef dlpack_view view;

void ctx_init(call_ctx *c, PlanObject *plan);
void ctx_free(call_ctx *c);
int borrow(call_ctx *c, PyObject *obj, const char *name, int ndim, int writable, view *v);
dl_dtype storage_dl(attnres_dtype dt);
int check_kind(call_ctx *c, const view *v, const char *name, dl_dtype want);
int row_stride(const view *v, int axis, const char *name, int64_t *stride);
int check_shape2(const view *v, const char *name, int64_t a, int64_t b, const char *why);
int borrow_f32_dense(call_ctx *c, PyObject *obj, const char *name, int ndim, int64_t rows, int64_t d, view *v);
int borrow_bank(call_ctx *c, PyObject *obj, const char *name, int64_t count, int64_t width, dl_dtype dtype,
                int writable, int64_t *t, void ***ptrs, int64_t **strides, PyObject **first_obj);
int common_stride(const int64_t *s, int64_t count, const char *name, int64_t *out);
PyObject *allocate(call_ctx *c, PyObject *like, const char *dtype, int ndim, int64_t a, int64_t b, int64_t d);
int resolve_stream(call_ctx *c, PyObject *stream, PyObject *like, void **out);
int fold(call_ctx *c, PyObject *query, PyObject *gain, const char *qname, const char *gname, int ndim, int64_t rows,
         int64_t d, const float **u);

/* ---- the hot-path methods (core_ops.c) ------------------------------------ */

PyObject *plan_mix(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *plan_phase1(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *plan_phase2(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *plan_mix_backward(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);

/* ---- the phase backwards (core_phase_backward.c) --------------------------- */

PyObject *plan_phase1_backward(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *plan_phase2_backward(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *plan_time_c(PyObject *op, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
int ops_intern_names(void);

#endif
