/* convert.h - host conversions between fp32 and the storage dtypes. */
#ifndef TUNER_CONVERT_H
#define TUNER_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "attnres.h"

/* Rounds n floats to dtype into dst (n * attnres_dtype_size bytes). */
void convert_to_storage(attnres_dtype dtype, const float *src, void *dst, size_t n);
/* Widens n storage values back to fp32. */
void convert_from_storage(attnres_dtype dtype, const void *src, float *dst, size_t n);

#endif
