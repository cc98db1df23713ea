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
