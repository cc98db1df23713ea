/*
 * npy.h - reading and writing NumPy .npy files of float32 (C order, little
 * endian), the exchange format of `attnres run`.
 *
 * Reading is strict: anything but '<f4', C order, and exactly the bytes the
 * shape calls for is refused with a message naming the problem.
 */
#ifndef TUNER_NPY_H
#define TUNER_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define NPY_MAX_DIMS 8

typedef struct npy_array {
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
    int64_t count; /* elements */
    float *data;   /* malloc'ed */
} npy_array;

/* Parses the header text (the len bytes after the length field: a Python
 * dict literal, padding included) as NumPy does, strictly: fills ndim, shape
 * and count (data stays NULL). 0 on success; on failure a message in err and
 * a zeroed array. Never reads past text + len; text need not end in NUL. */
int npy_parse_header(const char *text, size_t len, npy_array *out, char *err, size_t err_len);

/* 0 on success; on failure a message in err and a zeroed array. The data
 * size is checked against the file's before anything is allocated for it. */
int npy_read_f32(const char *path, npy_array *out, char *err, size_t err_len);
void npy_free(npy_array *a);

/* Writes the array to f as a .npy file; 0, or -1 on a write error. */
int npy_write_f32_stream(FILE *f, const float *data, int ndim, const int64_t *shape);

/* Writes path whole or not at all (atomic_file.h): a failure leaves the
 * earlier file, or no file, and never a partial one. */
int npy_write_f32(const char *path, const float *data, int ndim,
                  const int64_t *shape, char *err, size_t err_len);

#endif
