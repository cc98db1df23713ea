/*
 * test_files.h - writing a file whole and reading one back, for the C tests
 * that lay out inputs (templates, problems files, damaged databases) or
 * read fixtures. Header-only.
 */
#ifndef ATTNRES_TEST_FILES_H
#define ATTNRES_TEST_FILES_H

#include <stdio.h>
#include <stdlib.h>

/* Writes len bytes of data to path, created or truncated; 0, or -1 when it
 * cannot be opened or written whole. */
static inline int file_write(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int bad = fwrite(data, 1, len, f) != len;
    bad |= fclose(f) != 0;
    return bad ? -1 : 0;
}

/* The whole file at path as a NUL-terminated string to free; NULL when it
 * cannot be read. */
static inline char *file_read(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1)) != NULL) {
        if (fread(buf, 1, (size_t)n, f) == (size_t)n) {
            buf[n] = '\0';
        } else {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

#endif
