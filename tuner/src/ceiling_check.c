/*
 * ceiling_check.c - the out-of-cache check of winners against the ceilings.
 */
#include "ceiling_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>

/* Counts a winner in *count and says why into warning; returns 1. */
__attribute__((format(printf, 4, 5))) static int counted(int *count, char *warning, size_t size, const char *fmt, ...)
{
    va_list ap;
    (*count)++;
    va_start(ap, fmt);
    vsnprintf(warning, size, fmt, ap);
    va_end(ap);
    return 1;
}

int ceiling_check_winner(const device_ceilings *r, ceiling_check *c, const char *problem, double gbps, double read_bytes,
                         double write_bytes, double median_us, double spread_us, double paired,
                         double paired_spread, char *warning, size_t size)
{
    if (size)
        warning[0] = 0;
    const double ceiling = device_ceilings_ceiling(r, read_bytes, write_bytes);
    if (!(gbps > 0) || !(ceiling > 0) || !device_ceilings_out_of_cache(r, read_bytes + write_bytes))
        return 0;
    c->checked++;
    const double fraction = gbps / ceiling;
    const double limit = device_ceilings_fastest_ceiling(r, read_bytes, write_bytes);
    const double fastest = limit > 0 ? gbps / limit : 0;
    if (fraction > c->max_fraction)
        c->max_fraction = fraction;
    if (fastest > c->max_fastest)
        c->max_fastest = fastest;
    const double noise = device_ceilings_noise(median_us, spread_us);
    if (!device_ceilings_above(fastest, noise))
        return 0;
    if (paired > 0 && !device_ceilings_above(paired, device_ceilings_noise(paired, paired_spread))) {
        return counted(&c->late, warning, size,
                       "note: %s ran at %.0f%% of the fastest streaming run of the run's start but at %.0f%% of the "
                       "streaming pass timed in its own rounds: the host streamed faster than when the ceilings "
                       "were measured",
                       problem, 100.0 * fastest, 100.0 * paired);
    }
    return counted(&c->over, warning, size,
                   "warning: %s ran at %.0f%% of the fastest streaming run out of cache (noise %.0f%%): "
                   "the ceiling is not a ceiling on this device",
                   problem, 100.0 * fastest, 100.0 * noise);
}

int ceiling_check_paired(ceiling_check *c, const char *problem, double fraction, double spread, char *warning,
                         size_t size)
{
    if (size)
        warning[0] = 0;
    if (!(fraction > 0))
        return 0;
    enum { KEPT = sizeof c->paired_fraction / sizeof c->paired_fraction[0] };
    if (c->paired < KEPT)
        c->paired_fraction[c->paired] = fraction;
    c->paired++;
    const double noise = device_ceilings_noise(fraction, spread);
    if (!device_ceilings_above(fraction, noise))
        return 0;
    return counted(&c->paired_over, warning, size,
                   "warning: %s ran at %.0f%% of a streaming pass moving the same bytes in the same rounds "
                   "(noise %.0f%%): it moves its bytes faster than the device's streaming kernels",
                   problem, 100.0 * fraction, 100.0 * noise);
}

static int by_value(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The kept fractions, sorted, into out; their count. */
static int paired_sorted(const ceiling_check *c, double *out)
{
    enum { KEPT = sizeof c->paired_fraction / sizeof c->paired_fraction[0] };
    int n = c->paired < KEPT ? c->paired : KEPT;
    memcpy(out, c->paired_fraction, sizeof(double) * (size_t)n);
    qsort(out, (size_t)n, sizeof *out, by_value);
    return n;
}

double ceiling_check_paired_median(const ceiling_check *c)
{
    double v[sizeof c->paired_fraction / sizeof c->paired_fraction[0]];
    int n = paired_sorted(c, v);
    return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void ceiling_check_summary(const ceiling_check *c, char *buf, size_t size)
{
    int len;
    if (c->checked && c->late)
        len = snprintf(buf, size,
                       "ceiling check: %d out-of-cache winner(s), %d above the fastest streaming run beyond the "
                       "noise, %d above that of the run's start but within their own streaming pass; highest "
                       "%.0f%% of the ceiling, %.0f%% of the fastest run",
                       c->checked, c->over, c->late, 100.0 * c->max_fraction, 100.0 * c->max_fastest);
    else if (c->checked)
        len = snprintf(buf, size,
                       "ceiling check: %d out-of-cache winner(s), %d above the fastest streaming run beyond the "
                       "noise; highest %.0f%% of the ceiling, %.0f%% of the fastest run",
                       c->checked, c->over, 100.0 * c->max_fraction, 100.0 * c->max_fastest);
    else
        len = snprintf(buf, size, "ceiling check: no out-of-cache winner");
    if (c->paired == 0 || len < 0 || (size_t)len >= size)
        return;
    double v[sizeof c->paired_fraction / sizeof c->paired_fraction[0]];
    int n = paired_sorted(c, v);
    snprintf(buf + len, size - (size_t)len,
             "\npaired check: %d winner(s) timed next to a streaming pass moving the same bytes, %d above it "
             "beyond the noise; median %.0f%% of it, lowest %.0f%%, highest %.0f%%",
             c->paired, c->paired_over, 100.0 * ceiling_check_paired_median(c), 100.0 * v[0], 100.0 * v[n - 1]);
}

void ceiling_check_json(const device_ceilings *r, const ceiling_check *c, char *buf, size_t size)
{
    /* Room kept for the "check" member. */
    enum { CHECK_TEXT = CEILING_CHECK_JSON_SIZE - DEVICE_CEILINGS_JSON_SIZE };
    if (size <= CHECK_TEXT) {
        if (size)
            buf[0] = 0;
        return;
    }
    device_ceilings_json(r, buf, size - CHECK_TEXT);
    const size_t len = strlen(buf);
    if (c && len > 0 && buf[len - 1] == '}')
        snprintf(buf + len - 1, size - len + 1,
                 ", \"check\": {\"out_of_cache\": %d, \"over\": %d, \"late\": %d, \"max_fraction\": %.4f, "
                 "\"max_fraction_of_fastest\": %.4f, \"paired\": %d, \"paired_over\": %d, "
                 "\"paired_median\": %.4f}}",
                 c->checked, c->over, c->late, c->max_fraction, c->max_fastest, c->paired, c->paired_over,
                 c->paired ? ceiling_check_paired_median(c) : 0.0);
}
