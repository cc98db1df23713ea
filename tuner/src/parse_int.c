/*
 * parse_int.c - see parse_int.h.
 */
#include "parse_int.h"

#include <errno.h>
#include <stdlib.h>

int tune_parse_int(const char *text, int64_t min, int64_t max, int64_t *out)
{
    /* strtoll alone would take " +7" and saturate on overflow; the first
     * character must be a digit or '-', and ERANGE is an error. */
    if (!((text[0] >= '0' && text[0] <= '9') || (text[0] == '-' && text[1] >= '0' && text[1] <= '9')))
        return -1;
    char *end;
    errno = 0;
    const long long v = strtoll(text, &end, 10);
    if (*end || errno == ERANGE || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}
