/*
 * test_data.h - random test data and storage conversions shared by the
 * tests that run kernels (test_runtime, test_phase_ops, and the simulated
 * CUDA variant sweep). Header-only: each test is one translation unit.
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

#endif
