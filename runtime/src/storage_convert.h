/*
 * storage_convert.h - one element between fp32 and the storage types bf16
 * and f16, as the host side writes kernels' inputs and reads their
 * outputs (the tuner, the command line, tests and benchmarks).
 *
 * Header-only: the runtime itself never converts, so libattnres carries
 * no code for it. bf16 rounds to nearest even and keeps NaN a quiet NaN;
 * f16 uses the compiler's _Float16, which rounds to nearest even too.
 * The simulated driver (tests/cudasim/ptx_numerics.c) has its own
 * conversions on purpose: it models what the GPU's cvt instructions do,
 * canonical NaN included.
 */
#ifndef AR_STORAGE_CONVERT_H
#define AR_STORAGE_CONVERT_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attnres.h"

static inline uint16_t ar_bf16_from_f32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float ar_bf16_to_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t ar_f16_from_f32(float f)
{
    const _Float16 h = (_Float16)f;
    uint16_t b;
    memcpy(&b, &h, sizeof b);
    return b;
}

static inline float ar_f16_to_f32(uint16_t b)
{
    _Float16 h;
    memcpy(&h, &b, sizeof h);
    return (float)h;
}

/* Stores v as element i of a buffer of dtype, rounded as the type rounds. */
static inline void ar_storage_store(attnres_dtype dtype, void *buf, int64_t i, float v)
{
    switch (dtype) {
    case ATTNRES_DTYPE_F32: ((float *)buf)[i] = v; break;
    case ATTNRES_DTYPE_BF16: ((uint16_t *)buf)[i] = ar_bf16_from_f32(v); break;
    case ATTNRES_DTYPE_F16: ((uint16_t *)buf)[i] = ar_f16_from_f32(v); break;
    }
}

/* Element i of a buffer of dtype, widened to fp32 (exactly). */
static inline float ar_storage_load(attnres_dtype dtype, const void *buf, int64_t i)
{
    switch (dtype) {
    case ATTNRES_DTYPE_F32: return ((const float *)buf)[i];
    case ATTNRES_DTYPE_BF16: return ar_bf16_to_f32(((const uint16_t *)buf)[i]);
    case ATTNRES_DTYPE_F16: return ar_f16_to_f32(((const uint16_t *)buf)[i]);
    }
    return NAN;
}

#endif
