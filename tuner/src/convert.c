/* convert.c - see convert.h. bf16 rounds to nearest even, NaN kept. */
#include "convert.h"

#include <string.h>

static uint16_t f32_to_bf16(float x)
{
    uint32_t w;
    memcpy(&w, &x, 4);
    if ((w & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((w >> 16) | 0x40u);
    return (uint16_t)((w + 0x7fffu + ((w >> 16) & 1u)) >> 16);
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t w = (uint32_t)h << 16;
    float x;
    memcpy(&x, &w, 4);
    return x;
}

void convert_to_storage(attnres_dtype dtype, const float *src, void *dst, size_t n)
{
    switch (dtype) {
    case ATTNRES_DTYPE_F32:
        memcpy(dst, src, n * 4);
        break;
    case ATTNRES_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = f32_to_bf16(src[i]);
        break;
    case ATTNRES_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            ((_Float16 *)dst)[i] = (_Float16)src[i];
        break;
    }
}

void convert_from_storage(attnres_dtype dtype, const void *src, float *dst, size_t n)
{
    switch (dtype) {
    case ATTNRES_DTYPE_F32:
        memcpy(dst, src, n * 4);
        break;
    case ATTNRES_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case ATTNRES_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)((const _Float16 *)src)[i];
        break;
    }
}
