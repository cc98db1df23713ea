/*
 * fuzz_dlpack.c - the checks the Python extension runs on every DLPack
 * tensor it borrows (python/attnres/dlpack_check.c), on managed tensors
 * built from arbitrary bytes, as a lying producer could build them.
 *
 * Input (little-endian; bytes past the end read as 0):
 *   byte 0   bit 0 versioned (else legacy), bit 1 shape NULL, bit 2
 *            strides NULL, bit 3 data points into the harness's buffer
 *            (at the data field modulo its size; else the data field is
 *            the pointer itself), bit 4 writable argument, bit 5 the rows
 *            of the last two axes are checked too
 *   byte 1   the ndim the argument must have: 1 + byte % 3
 *   then     u32 major, u32 minor, u64 flags, i32 ndim, u8 code, u8 bits,
 *            u16 lanes, i32 device_type, i32 device_id, u64 byte_offset,
 *            u64 data, and k = clamp(ndim, 0, 8) i64 sizes, then k i64
 *            strides, each in an array of exactly k entries (ASan sees a
 *            read past them)
 *
 * Invariants: a refusal has a message that starts with the argument's
 * name. An accepted tensor has the ndim asked for, a scalar dtype of whole
 * bytes, the sizes given, and an extent that wide arithmetic (__int128)
 * confirms: every element address lies in [1, UINTPTR_MAX] and
 * dlpack_view_item gives the exact address of each index along the first
 * axis. When the extent lies in the harness's buffer, the first element of
 * each of the first 64 indices is read (ASan checks the addresses).
 */
#include <stdlib.h>
#include <string.h>

#include "dlpack_check.h"
#include "fuzz.h"

#define BUFFER_BYTES 4096
#define MAX_DIMS 8

typedef struct {
    const uint8_t *p;
    size_t n, at;
} reader;

static uint64_t take(reader *r, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++, r->at++)
        v |= (uint64_t)(r->at < r->n ? r->p[r->at] : 0) << (8 * i);
    return v;
}

static _Alignas(64) uint8_t buffer[BUFFER_BYTES];

/* The wide-arithmetic extent of an accepted view, relative to its data. */
static void check_accepted(const dl_tensor *t, const dlpack_view *v, int ndim, const int64_t *strides_given)
{
    if (v->ndim != ndim)
        fuzz_fail("accepted view with another ndim", NULL);
    if (t->dtype.lanes != 1 || t->dtype.bits == 0 || t->dtype.bits % 8 || v->itemsize != t->dtype.bits / 8u)
        fuzz_fail("accepted dtype that is not whole scalar bytes", NULL);
    __int128 count = 1;
    for (int i = 0; i < ndim; i++) {
        if (v->shape[i] != t->shape[i] || v->shape[i] < 0)
            fuzz_fail("accepted view with other or negative sizes", NULL);
        count *= v->shape[i];
    }
    const __int128 base = (__int128)(uintptr_t)t->data + (__int128)t->byte_offset;
    if ((uintptr_t)v->data != (uintptr_t)base || base > (__int128)UINTPTR_MAX)
        fuzz_fail("accepted view whose data is not data + byte_offset", NULL);
    if (count == 0)
        return;
    if (!t->data)
        fuzz_fail("accepted NULL data with elements", NULL);
    const __int128 size = (__int128)v->itemsize;
    __int128 lo = 0, hi = 0, compact = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        const int64_t want = strides_given ? strides_given[i] : (int64_t)compact;
        if (v->shape[i] > 1 && v->strides[i] != want)
            fuzz_fail("accepted view with other strides", NULL);
        const __int128 reach = (__int128)(v->shape[i] - 1) * v->strides[i] * size;
        if (reach > 0)
            hi += reach;
        else
            lo += reach;
        compact *= v->shape[i];
    }
    if (base + lo <= 0 || base + hi + size - 1 > (__int128)UINTPTR_MAX || hi + size > (__int128)PTRDIFF_MAX ||
        -lo > (__int128)PTRDIFF_MAX)
        fuzz_fail("accepted view whose elements leave the address space", NULL);
    /* The addresses core_borrow.c computes for a bank's views. */
    const int64_t rows = v->shape[0];
    for (int64_t i = 0; i < rows; i = i < 64 || i == rows - 1 ? i + 1 : rows - 1) {
        const __int128 want = base + (__int128)i * v->strides[0] * size;
        if ((__int128)(uintptr_t)dlpack_view_item(v, i) != want)
            fuzz_fail("dlpack_view_item gives another address", NULL);
    }
    /* Within the buffer, the first element of each index is read. */
    const __int128 start = (__int128)(uintptr_t)buffer, end = start + BUFFER_BYTES;
    if (base + lo < start || base + hi + size > end)
        return;
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < rows && i < 64; i++) {
        const char *first = dlpack_view_item(v, i);
        sink ^= (uint8_t)first[0];
        sink ^= (uint8_t)first[v->itemsize - 1];
    }
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    const unsigned form = (unsigned)take(&r, 1);
    const int ndim = 1 + (int)(take(&r, 1) % 3);
    dl_managed_versioned mv;
    dl_managed ml;
    memset(&mv, 0, sizeof mv);
    memset(&ml, 0, sizeof ml);
    mv.version.major = (uint32_t)take(&r, 4);
    mv.version.minor = (uint32_t)take(&r, 4);
    mv.flags = take(&r, 8);
    dl_tensor t;
    memset(&t, 0, sizeof t);
    t.ndim = (int32_t)take(&r, 4);
    t.dtype.code = (uint8_t)take(&r, 1);
    t.dtype.bits = (uint8_t)take(&r, 1);
    t.dtype.lanes = (uint16_t)take(&r, 2);
    t.device.device_type = (int32_t)take(&r, 4);
    t.device.device_id = (int32_t)take(&r, 4);
    t.byte_offset = take(&r, 8);
    const uint64_t data_field = take(&r, 8);
    t.data = form & 8 ? (void *)(buffer + data_field % BUFFER_BYTES) : (void *)(uintptr_t)data_field;
    const int k = t.ndim < 0 ? 0 : t.ndim > MAX_DIMS ? MAX_DIMS : t.ndim;
    int64_t *shape = malloc(sizeof(int64_t) * (size_t)(k ? k : 1));
    int64_t *strides = malloc(sizeof(int64_t) * (size_t)(k ? k : 1));
    if (!shape || !strides)
        fuzz_fail("out of memory", NULL);
    for (int i = 0; i < k; i++)
        shape[i] = (int64_t)take(&r, 8);
    for (int i = 0; i < k; i++)
        strides[i] = (int64_t)take(&r, 8);
    t.shape = form & 2 ? NULL : shape;
    t.strides = form & 4 ? NULL : strides;

    const char *name = "arg";
    char err[512] = "";
    dlpack_view v;
    memset(&v, 0x5a, sizeof v);
    int rc;
    const dl_tensor *given;
    if (form & 1) {
        mv.dl_tensor = t;
        given = &mv.dl_tensor;
        rc = dlpack_check_versioned(&mv, ndim, (form & 16) != 0, name, &v, err, sizeof err);
    } else {
        ml.dl_tensor = t;
        given = &ml.dl_tensor;
        rc = dlpack_check_legacy(&ml, ndim, name, &v, err, sizeof err);
    }
    if (rc) {
        fuzz_verdict = FUZZ_REFUSED;
        if (strncmp(err, name, strlen(name)))
            fuzz_fail("refusal without a message naming the argument", err);
    } else {
        fuzz_verdict = FUZZ_ACCEPTED;
        if ((form & 1) && (mv.version.major != DL_MAJOR ||
                           ((form & 16) && (mv.flags & (DL_FLAG_READ_ONLY | DL_FLAG_IS_COPIED)))))
            fuzz_fail("accepted a version or flags that must be refused", NULL);
        check_accepted(given, &v, ndim, given->strides);
        if ((form & 32) && ndim >= 2) {
            int64_t stride = 0;
            err[0] = '\0';
            if (dlpack_row_stride(&v, ndim - 2, name, &stride, err, sizeof err) == 0) {
                const int64_t width = v.shape[ndim - 1];
                if (stride < width)
                    fuzz_fail("accepted rows that overlap", NULL);
            } else if (strncmp(err, name, strlen(name))) {
                fuzz_fail("row refusal without a message naming the argument", err);
            }
        }
    }
    free(shape);
    free(strides);
    return 0;
}
