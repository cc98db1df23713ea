/*
 * test_data.h - random test data and storage conversions shared by the
 * tests that run kernels (test_runtime, test_phase_ops, and the simulated
 * CUDA variant sweep). Header-only: each test is one translation unit.
 */
#ifndef ATTNRES_TEST_DATA_H
#define ATTNRES_TEST_DATA_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attnres.h"

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

/* fp32 -> bf16 by round-to-nearest-even on the upper 16 bits. */
static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Stores v at element i of a buffer of dtype, rounding as the type does. */
static inline void elem_store(attnres_dtype dt, void *buf, int64_t i, double v)
{
    switch (dt) {
    case ATTNRES_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case ATTNRES_DTYPE_BF16: ((uint16_t *)buf)[i] = f32_to_bf16((float)v); break;
    case ATTNRES_DTYPE_F16: ((_Float16 *)buf)[i] = (_Float16)(float)v; break;
    }
}

static inline double elem_load(attnres_dtype dt, const void *buf, int64_t i)
{
    switch (dt) {
    case ATTNRES_DTYPE_F32: return ((const float *)buf)[i];
    case ATTNRES_DTYPE_BF16: return bf16_to_f32(((const uint16_t *)buf)[i]);
    case ATTNRES_DTYPE_F16: return (double)(float)((const _Float16 *)buf)[i];
    }
    return NAN;
}

#endif
