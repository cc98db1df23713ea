/* cli.c - see cli.h. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_double(const char *cmd, const char *flag, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno == ERANGE) {
        cli_error(cmd, "%s expects a number, got '%s'", flag, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_int(const char *cmd, const char *flag, const char *text, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (!*text || *end || errno == ERANGE) {
        cli_error(cmd, "%s expects an integer, got '%s'", flag, text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_int_range(const char *cmd, const char *flag, const char *text, int64_t min, int64_t max,
                        int64_t *out)
{
    /* strtoll alone would take " +7" and saturate on overflow; the first
     * character must be a digit or '-', and ERANGE is an error. */
    char *end;
    errno = 0;
    long long v = 0;
    int ok = (text[0] >= '0' && text[0] <= '9') || (text[0] == '-' && text[1] >= '0' && text[1] <= '9');
    if (ok) {
        v = strtoll(text, &end, 10);
        ok = !*end && errno != ERANGE && v >= min && v <= max;
    }
    if (!ok) {
        cli_error(cmd, "%s must be an integer from %lld to %lld (got '%s')", flag, (long long)min, (long long)max,
                  text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_positive(const char *cmd, const char *flag, const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno == ERANGE || !isfinite(v) || !(v > 0)) {
        cli_error(cmd, "%s must be a positive finite number (got '%s')", flag, text);
        return -1;
    }
    *out = v;
    return 0;
}

const char *cli_value(const char *cmd, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc) {
        cli_error(cmd, "%s needs a value", argv[*i]);
        return NULL;
    }
    (*i)++;
    return argv[*i];
}
