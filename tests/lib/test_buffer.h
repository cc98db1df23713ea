/*
 * test_buffer.h - a growing, NUL-terminated memory buffer that the db
 * tests and the db import fuzz target hand to ardb's export functions as
 * their write callback, so that an export can be inspected as one string.
 */
#ifndef ATTNRES_TEST_BUFFER_H
#define ATTNRES_TEST_BUFFER_H

#include <stdlib.h>
#include <string.h>

typedef struct buffer {
    char *data;
    size_t len, cap;
} buffer;

/* The write callback: appends len bytes, keeping data NUL-terminated;
 * -1 (as a failing sink would) when memory runs out. */
static inline int buffer_write(void *ctx, const void *data, size_t len)
{
    buffer *b = ctx;
    if (b->len + len + 1 > b->cap) {
        size_t ncap = (b->cap ? b->cap * 2 : 4096) + len;
        char *nd = realloc(b->data, ncap);
        if (!nd)
            return -1;
        b->data = nd;
        b->cap = ncap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return 0;
}

#endif
