/*
 * dlpack_check.c - the checks of a borrowed DLPack tensor (see
 * dlpack_check.h): every field before its use, every address computation
 * without overflow.
 */
#include "dlpack_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static int refuse(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* The shape as the message shows it: "(2, 3)". */
static const char *shape_text(const int64_t *shape, int ndim, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < ndim && used < len; i++) {
        int n = snprintf(buf + used, len - used, "%s%lld", i ? ", " : "(", (long long)shape[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
    if (used < len)
        snprintf(buf + used, len - used, "%s", ndim == 1 ? ",)" : ")");
    return buf;
}

/* Completes the view of an accepted tensor t (its shape and strides are
 * in v already): the first element at base, and t's dtype and device. */
static int accept(dlpack_view *v, const dl_tensor *t, int ndim, uintptr_t base, int64_t itemsize)
{
    v->ndim = ndim;
    v->data = (char *)base;
    v->itemsize = (size_t)itemsize;
    v->dtype = t->dtype;
    v->device = t->device;
    return 0;
}

int dlpack_check_tensor(const dl_tensor *t, int ndim, const char *name, dlpack_view *v, char *err,
                        size_t err_len)
{
    char text[128];
    if (!t || !v || ndim < 1 || ndim > DLPACK_VIEW_MAX_NDIM)
        return refuse(err, err_len, "%s: no tensor to check", name);
    memset(v, 0, sizeof *v);
    if (t->ndim != ndim)
        return refuse(err, err_len, "%s must have %d dimension%s, got %d (DLPack ndim)", name, ndim,
                      ndim == 1 ? "" : "s", (int)t->ndim);
    if (!t->shape)
        return refuse(err, err_len, "%s: DLPack shape is NULL; a %d-dimensional tensor needs one", name, ndim);
    const dl_dtype dt = t->dtype;
    if (dt.lanes != 1)
        return refuse(err, err_len, "%s: DLPack dtype has %u lanes; only scalar element types (1 lane) are read",
                      name, (unsigned)dt.lanes);
    if (dt.bits == 0 || dt.bits % 8)
        return refuse(err, err_len, "%s: DLPack dtype has %u bits, not a whole number of bytes", name,
                      (unsigned)dt.bits);
    if (t->device.device_type < 1)
        return refuse(err, err_len, "%s: DLPack device_type %d is not a device type", name,
                      (int)t->device.device_type);
    if (t->device.device_id < 0)
        return refuse(err, err_len, "%s: DLPack device_id %d is negative", name, (int)t->device.device_id);

    const int64_t itemsize = dt.bits / 8;
    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        v->shape[i] = t->shape[i];
        if (v->shape[i] < 0)
            return refuse(err, err_len, "%s: DLPack shape[%d] is %lld, a negative size", name, i,
                          (long long)v->shape[i]);
    }
    for (int i = 0; i < ndim; i++)
        if (__builtin_mul_overflow(count, v->shape[i], &count) || count > PTRDIFF_MAX / itemsize)
            return refuse(err, err_len, "%s: DLPack shape %s has more elements than an address space holds", name,
                          shape_text(v->shape, ndim, text, sizeof text));

    /* byte_offset is unsigned in the specification; beyond PTRDIFF_MAX it
     * is no offset into any array. */
    const uintptr_t data = (uintptr_t)t->data;
    if (t->byte_offset > (uint64_t)PTRDIFF_MAX || (uintptr_t)t->byte_offset > UINTPTR_MAX - data)
        return refuse(err, err_len, "%s: DLPack byte_offset %llu puts the data past the end of the address space",
                      name, (unsigned long long)t->byte_offset);
    const uintptr_t base = data + (uintptr_t)t->byte_offset;

    if (count == 0) {
        /* Nothing is read or written; the strides and data mean nothing. */
        return accept(v, t, ndim, base, itemsize);
    }
    if (!t->data)
        return refuse(err, err_len, "%s: DLPack data is NULL for %lld elements", name, (long long)count);
    if (base % (uintptr_t)itemsize)
        return refuse(err, err_len,
                      "%s: DLPack data + byte_offset (%#llx) is not a multiple of the element size %lld", name,
                      (unsigned long long)base, (long long)itemsize);

    /* Every dimension has a size of 1 or more here, so the compact strides
     * are partial products of count, which fits. */
    int64_t compact = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        v->strides[i] = t->strides ? t->strides[i] : compact;
        compact *= v->shape[i];
    }
    /* The lowest and the highest byte offset of an element, relative to
     * the first element, summed over the dimensions with overflow checks. */
    int64_t lo = 0, hi = 0;
    for (int i = 0; i < ndim; i++) {
        int64_t reach;
        if (v->shape[i] == 1)
            continue; /* index 0 only: the stride is never multiplied */
        if (__builtin_mul_overflow(v->shape[i] - 1, v->strides[i], &reach) ||
            __builtin_mul_overflow(reach, itemsize, &reach) ||
            (reach > 0 ? __builtin_add_overflow(hi, reach, &hi) : __builtin_add_overflow(lo, reach, &lo)))
            return refuse(err, err_len,
                          "%s: DLPack strides[%d] = %lld over shape %s reach beyond the address space", name, i,
                          (long long)v->strides[i], shape_text(v->shape, ndim, text, sizeof text));
    }
    /* The lowest element must not sit at address 0: a pointer computed to
     * NULL is undefined, and no array lives there. */
    if (hi > PTRDIFF_MAX - itemsize || lo < -PTRDIFF_MAX || (uintptr_t)(-lo) >= base ||
        (uintptr_t)(hi + itemsize - 1) > UINTPTR_MAX - base)
        return refuse(err, err_len, "%s: DLPack strides over shape %s reach beyond the address space", name,
                      shape_text(v->shape, ndim, text, sizeof text));
    return accept(v, t, ndim, base, itemsize);
}

int dlpack_check_versioned(const dl_managed_versioned *m, int ndim, int writable, const char *name,
                           dlpack_view *v, char *err, size_t err_len)
{
    if (!m)
        return refuse(err, err_len, "%s: the capsule holds no tensor", name);
    if (m->version.major != DL_MAJOR)
        return refuse(err, err_len, "%s was exported as DLPack %u.%u, which this package cannot read (it reads %d.x)",
                      name, (unsigned)m->version.major, (unsigned)m->version.minor, DL_MAJOR);
    if (writable && (m->flags & DL_FLAG_READ_ONLY))
        return refuse(err, err_len,
                      "%s is read-only (its DLPack export says so); it is written, so it must be writable", name);
    if (writable && (m->flags & DL_FLAG_IS_COPIED))
        return refuse(err, err_len, "%s was exported as a copy; it is written, and the writes would be lost", name);
    return dlpack_check_tensor(&m->dl_tensor, ndim, name, v, err, err_len);
}

int dlpack_check_legacy(const dl_managed *m, int ndim, const char *name, dlpack_view *v, char *err,
                        size_t err_len)
{
    if (!m)
        return refuse(err, err_len, "%s: the capsule holds no tensor", name);
    return dlpack_check_tensor(&m->dl_tensor, ndim, name, v, err, err_len);
}

int dlpack_row_stride(const dlpack_view *v, int axis, const char *name, int64_t *stride, char *err,
                      size_t err_len)
{
    if (!v || !stride || axis < 0 || axis + 1 >= v->ndim)
        return refuse(err, err_len, "%s: no rows to check", name);
    const int64_t width = v->shape[axis + 1], t = v->shape[axis];
    /* An empty view has nothing to read; libraries give it any strides. */
    int empty = 0;
    for (int i = 0; i < v->ndim; i++)
        empty |= v->shape[i] == 0;
    if (empty) {
        *stride = width;
        return 0;
    }
    if (width > 1 && v->strides[axis + 1] != 1)
        return refuse(err, err_len, "%s rows are not contiguous (element stride %lld); the kernels need stride 1",
                      name, (long long)v->strides[axis + 1]);
    const int64_t s = t > 1 ? v->strides[axis] : width;
    if (s < width)
        return refuse(err, err_len, "%s token stride %lld is less than the row width %lld (rows would overlap)",
                      name, (long long)s, (long long)width);
    *stride = s;
    return 0;
}

char *dlpack_view_item(const dlpack_view *v, int64_t i)
{
    /* i * stride * itemsize is at most the extent dlpack_check_tensor
     * checked, so neither product overflows. */
    return v->data + (ptrdiff_t)(i * v->strides[0]) * (ptrdiff_t)v->itemsize;
}
