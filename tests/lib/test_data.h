/*
 * test_data.h - random test data and storage conversions shared by the
 * tests that run kernels (test_runtime, backend_ops on the CPU and on the
 * simulated CUDA driver). Header-only: static inline in each unit.
 * Elements convert as the runtime's storage_convert.h says.
 */
#ifndef ATTNRES_TEST_DATA_H
#define ATTNRES_TEST_DATA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attnres.h"
#include "storage_convert.h"

/* splitmix64: small, fast and good enough for test data. */
static inline uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1). */
static inline double rng_uniform(uint64_t *s)
{
    return ((double)(rng_next(s) >> 11) + 0.5) / 9007199254740992.0;
}

/* Standard normal (Box-Muller). */
static inline double rng_normal(uint64_t *s)
{
    double u1 = rng_uniform(s), u2 = rng_uniform(s);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Stores v at element i of a buffer of dtype, rounding as the type does
 * (through fp32, as a kernel's input is rounded). */
static inline void elem_store(attnres_dtype dt, void *buf, int64_t i, double v)
{
    ar_storage_store(dt, buf, i, (float)v);
}

static inline double elem_load(attnres_dtype dt, const void *buf, int64_t i)
{
    return ar_storage_load(dt, buf, i);
}

/* Fills rows x d values of a strided storage buffer of dtype dt (row r at
 * element r * stride) with N(0,1) times a magnitude: `magnitude` where it
 * is positive, else one drawn per row as 10^U(-1,1), so that rows differ by
 * up to 100x. The stored (rounded) values also go to exact[rows][d]. */
static inline void fill_rows(uint64_t *s, attnres_dtype dt, void *buf, int64_t rows, int64_t d, int64_t stride,
                             double magnitude, double *exact)
{
    for (int64_t r = 0; r < rows; r++) {
        const double mag = magnitude > 0 ? magnitude : pow(10.0, 2.0 * rng_uniform(s) - 1.0);
        for (int64_t k = 0; k < d; k++) {
            elem_store(dt, buf, r * stride + k, mag * rng_normal(s));
            exact[r * d + k] = elem_load(dt, buf, r * stride + k);
        }
    }
}

#endif
