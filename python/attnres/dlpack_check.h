/*
 * dlpack_check.h - the DLPack structures the extension reads, and the
 * checks a borrowed tensor passes before any of its fields is used.
 *
 * A capsule comes from another library, or from anyone with ctypes, so
 * every field is untrusted. These functions read a field only after the
 * fields it depends on are checked (shape only for the expected ndim, and
 * only when it is not NULL), and they refuse a tensor whose addresses
 * cannot be computed: every address data + byte_offset + i * stride *
 * element size for an index the shape allows must be computable without
 * overflow. They cannot tell whether the memory a tensor describes exists:
 * a producer that lies about its data pointer is beyond any consumer.
 *
 * No Python here: core_borrow.c calls these for every array it borrows, and
 * the fuzz target tests/fuzz/fuzz_dlpack.c calls them on tensors built from
 * arbitrary bytes. Nothing here allocates, prints or aborts.
 */
#ifndef ATTNRES_DLPACK_CHECK_H
#define ATTNRES_DLPACK_CHECK_H

#include <stddef.h>
#include <stdint.h>

/* ---- the structures of the DLPack specification -------------------------
 * Both ABIs: DLPack 1.0's versioned managed tensor (capsule
 * "dltensor_versioned", with a version and flags such as read-only) and
 * the legacy unversioned one of dlpack.h v0.8 (capsule "dltensor"). Written
 * here from the specification so that the package needs no header of
 * another project; the layouts must match the specification exactly. */

enum {
    DL_CPU = 1,
    DL_CUDA = 2,
    DL_CUDA_HOST = 3,
    DL_CUDA_MANAGED = 13,
};

enum { DL_FLOAT = 2, DL_BFLOAT = 4 };

typedef struct {
    int32_t device_type;
    int32_t device_id;
} dl_device;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} dl_dtype;

typedef struct {
    void *data;
    dl_device device;
    int32_t ndim;
    dl_dtype dtype;
    int64_t *shape;
    int64_t *strides; /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed {
    dl_tensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct dl_managed *self);
} dl_managed;

typedef struct {
    uint32_t major;
    uint32_t minor;
} dl_version;

typedef struct dl_managed_versioned {
    dl_version version;
    void *manager_ctx;
    void (*deleter)(struct dl_managed_versioned *self);
    uint64_t flags;
    dl_tensor dl_tensor;
} dl_managed_versioned;

/* The flags of a versioned tensor that matter here. */
#define DL_FLAG_READ_ONLY ((uint64_t)1 << 0)
#define DL_FLAG_IS_COPIED ((uint64_t)1 << 1)

/* The DLPack major version this package reads. */
#define DL_MAJOR 1

/* The most dimensions an argument of the extension has. */
#define DLPACK_VIEW_MAX_NDIM 3

/* A checked tensor as the extension uses it. */
typedef struct {
    char *data; /* the first element: the tensor's data + byte_offset */
    int ndim;
    int64_t shape[DLPACK_VIEW_MAX_NDIM];
    /* In elements: the producer's, or compact row-major where it gave
     * none; all 0 in a tensor without elements, whose strides mean
     * nothing and may be anything. */
    int64_t strides[DLPACK_VIEW_MAX_NDIM];
    size_t itemsize; /* bytes per element, 1 or more */
    dl_dtype dtype;
    dl_device device;
} dlpack_view;

/* Each check returns 0 and fills *v, or returns -1 and writes into err (of
 * err_len bytes, at least 1) a message that starts with name, the
 * argument's name, and names the field at fault.
 *
 * dlpack_check_tensor: t must have ndim (1..DLPACK_VIEW_MAX_NDIM)
 * dimensions, a shape (any strides), non-negative sizes, a scalar dtype of
 * whole bytes, a device type and id DLPack could mean, data for every
 * element it has, data + byte_offset aligned to the element size, and
 * addresses as described above. Whether the dtype and device are the ones
 * a plan takes is the caller's check. */
int dlpack_check_tensor(const dl_tensor *t, int ndim, const char *name, dlpack_view *v, char *err,
                        size_t err_len);

/* A versioned tensor: also its major version, and for a writable argument
 * (one that is written) that it is neither read-only nor a copy. */
int dlpack_check_versioned(const dl_managed_versioned *m, int ndim, int writable, const char *name,
                           dlpack_view *v, char *err, size_t err_len);

/* A legacy tensor, which has no flags. */
int dlpack_check_legacy(const dl_managed *m, int ndim, const char *name, dlpack_view *v, char *err,
                        size_t err_len);

/* The token stride of a [.., T, width] view (T at axis, width at axis + 1)
 * whose rows the kernels read as width consecutive elements: rows must be
 * contiguous and must not overlap. Returns 0 and sets *stride, or -1 with
 * a message. */
int dlpack_row_stride(const dlpack_view *v, int axis, const char *name, int64_t *stride, char *err,
                      size_t err_len);

/* The address of index i (0 <= i < shape[0]) along a checked view's first
 * axis; never overflows for such an i. */
char *dlpack_view_item(const dlpack_view *v, int64_t i);

#endif
