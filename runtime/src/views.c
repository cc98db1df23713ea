/* views.c - see views.h. */
#include "views.h"

int ar_view_make(ar_view *v, const void *ptr, int64_t rows, int64_t stride, int64_t width, size_t elem_size)
{
    int64_t span, elems, bytes, stride_bytes;
    uintptr_t last;
    if (rows < 1 || width < 1 || (rows > 1 && stride < width) || elem_size == 0 || elem_size > 16)
        return -1;
    /* Kernels scale the stride to bytes even for one row. */
    if (__builtin_mul_overflow(stride, (int64_t)elem_size, &stride_bytes))
        return -1;
    if (rows == 1)
        stride = width;
    if (__builtin_mul_overflow(rows - 1, stride, &span) || __builtin_add_overflow(span, width, &elems) ||
        __builtin_mul_overflow(elems, (int64_t)elem_size, &bytes) || (uint64_t)bytes > (uint64_t)PTRDIFF_MAX ||
        __builtin_add_overflow((uintptr_t)ptr, (uintptr_t)bytes - 1, &last))
        return -1;
    v->start = (uintptr_t)ptr;
    v->stride = (uint64_t)stride * elem_size;
    v->width = (uint64_t)width * elem_size;
    v->rows = (uint64_t)rows;
    v->extent = (uint64_t)bytes;
    return 0;
}

/* Whole ranges: [start, start + extent). */
static int ranges_overlap(const ar_view *a, const ar_view *b)
{
    return a->start < b->start + b->extent && b->start < a->start + a->extent;
}

int ar_views_overlap(const ar_view *a, const ar_view *b)
{
    if (!ranges_overlap(a, b))
        return 0;
    if (a->rows != b->rows || a->rows == 1 || a->stride != b->stride)
        return 1;
    /* Rows i of a and j of b meet when delta + k * s lies in (-wb, wa)
     * for k = j - i in [-(T - 1), T - 1], delta = b.start - a.start: take
     * the least k that puts it above -wb and see whether it is below wa.
     * Every quantity is below 2^63 in magnitude (extents fit ptrdiff_t),
     * and __int128 holds their products. */
    const __int128 s = (__int128)a->stride, wa = (__int128)a->width, wb = (__int128)b->width;
    const __int128 delta = (__int128)b->start - (__int128)a->start, kmax = (__int128)a->rows - 1;
    __int128 num = -wb - delta; /* k must exceed num / s */
    __int128 k = num >= 0 ? num / s + 1 : -((-num) / s); /* floor(num / s) + 1 */
    if (num < 0 && (-num) % s == 0)
        k = num / s + 1;
    if (k < -kmax)
        k = -kmax;
    return k <= kmax && delta + k * s < wa;
}

int ar_views_same(const ar_view *a, const ar_view *b)
{
    return a->start == b->start && a->stride == b->stride && a->width == b->width && a->rows == b->rows;
}
