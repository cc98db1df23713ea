/* convert.c - see convert.h. One element converts as storage_convert.h says. */
#include "convert.h"

#include <string.h>

#include "attnres-impl.h"

void convert_to_storage(attnres_dtype dtype, const float *src, void *dst, size_t n)
{
    switch (dtype) {
    case ATTNRES_DTYPE_F32:
        memcpy(dst, src, n * 4);
        break;
    case ATTNRES_DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = ar_bf16_from_f32(src[i]);
        break;
    case ATTNRES_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = ar_f16_from_f32(src[i]);
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
            dst[i] = ar_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case ATTNRES_DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = ar_f16_to_f32(((const uint16_t *)src)[i]);
        break;
    }
}
