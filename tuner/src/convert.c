/* convert.c - see convert.h. One element converts as storage_convert.h says. */
#include "convert.h"

#include "attnres-impl.h"

void convert_to_storage(attnres_dtype dtype, const float *src, void *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ar_storage_store(dtype, dst, (int64_t)i, src[i]);
}

void convert_from_storage(attnres_dtype dtype, const void *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = ar_storage_load(dtype, src, (int64_t)i);
}
