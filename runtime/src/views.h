/*
 * views.h - the memory a run's arguments span, checked before a launch.
 *
 * A view is T rows of `width` elements, `stride` elements apart, from
 * `ptr` (a vector such as the query is one row). Its extent, (T - 1) *
 * stride + width elements, is computed in bytes with overflow checks, and
 * so is its last address, so that no kernel ever forms a pointer outside
 * what the caller described. Two views overlap when they share a byte:
 * views of one stride are compared row by row (the interleaved halves of a
 * [T, 2d] buffer do not overlap), others by their whole address ranges
 * [ptr, ptr + extent). Nothing here allocates.
 */
#ifndef AR_VIEWS_H
#define AR_VIEWS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ar_view {
    uintptr_t start;  /* address of the first byte */
    uint64_t stride;  /* bytes from one row to the next */
    uint64_t width;   /* bytes of one row */
    uint64_t rows;
    uint64_t extent;  /* bytes from start to the end of the last row */
} ar_view;

/* Describes rows x width elements of elem_size bytes at ptr, stride
 * elements apart (rows >= 1, width >= 1, stride >= width or rows == 1).
 * 0, or -1 when the stride in bytes, the extent in elements or in bytes,
 * or the view's last address does not fit (the extent must stay within
 * PTRDIFF_MAX; the stride in bytes, which kernels compute even for one
 * row, within int64_t). */
int ar_view_make(ar_view *v, const void *ptr, int64_t rows, int64_t stride, int64_t width, size_t elem_size);

/* 1 when the two views share a byte, else 0. */
int ar_views_overlap(const ar_view *a, const ar_view *b);

/* 1 when a and b are the same view: the in-place case. */
int ar_views_same(const ar_view *a, const ar_view *b);

#endif
