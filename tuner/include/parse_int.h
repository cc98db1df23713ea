/*
 * parse_int.h - the one reading of an integer a user wrote, on the command
 * line (cli/) and in a problems file (problems.c): a whole decimal token
 * in a range, refused rather than truncated or saturated.
 */
#ifndef ATTNRES_TUNER_PARSE_INT_H
#define ATTNRES_TUNER_PARSE_INT_H

#include <stdint.h>

/* Reads text, an optional '-' then decimal digits and nothing else (no
 * '+', no spaces), into *out when its value lies in [min, max]; 0, or -1
 * when it does not (out of range, overflow, or not such a token). */
int tune_parse_int(const char *text, int64_t min, int64_t max, int64_t *out);

#endif
