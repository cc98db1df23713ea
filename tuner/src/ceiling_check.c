/*
 * ceiling_check.c - the out-of-cache check of winners against the ceilings.
 */
#include "ceiling_check.h"

#include <stdio.h>
#include <string.h>

int ceiling_check_winner(const rooflines *r, ceiling_check *c, const char *problem, double gbps, double read_bytes,
                         double write_bytes, double median_us, double spread_us, char *warning, size_t size)
{
    if (size)
        warning[0] = 0;
    const double ceiling = rooflines_ceiling(r, read_bytes, write_bytes);
    if (!(gbps > 0) || !(ceiling > 0) || !rooflines_out_of_cache(r, read_bytes + write_bytes))
        return 0;
    c->checked++;
    const double fraction = gbps / ceiling;
    const double limit = rooflines_fastest_ceiling(r, read_bytes, write_bytes);
    const double fastest = limit > 0 ? gbps / limit : 0;
    if (fraction > c->max_fraction)
        c->max_fraction = fraction;
    if (fastest > c->max_fastest)
        c->max_fastest = fastest;
    const double noise = rooflines_noise(median_us, spread_us);
    if (!rooflines_above(fastest, noise))
        return 0;
    c->over++;
    snprintf(warning, size,
             "warning: %s ran at %.0f%% of the fastest streaming run out of cache (noise %.0f%%): "
             "the ceiling is not a ceiling on this device",
             problem, 100.0 * fastest, 100.0 * noise);
    return 1;
}

void ceiling_check_summary(const ceiling_check *c, char *buf, size_t size)
{
    if (c->checked)
        snprintf(buf, size,
                 "ceiling check: %d out-of-cache winner(s), %d above the fastest streaming run beyond the noise; "
                 "highest %.0f%% of the ceiling, %.0f%% of the fastest run",
                 c->checked, c->over, 100.0 * c->max_fraction, 100.0 * c->max_fastest);
    else
        snprintf(buf, size, "ceiling check: no out-of-cache winner");
}

void ceiling_check_json(const rooflines *r, const ceiling_check *c, char *buf, size_t size)
{
    enum { CHECK_TEXT = 160 }; /* room kept for the "check" member */
    if (size <= CHECK_TEXT) {
        if (size)
            buf[0] = 0;
        return;
    }
    rooflines_json(r, buf, size - CHECK_TEXT);
    const size_t len = strlen(buf);
    if (c && len > 0 && buf[len - 1] == '}')
        snprintf(buf + len - 1, size - len + 1,
                 ", \"check\": {\"out_of_cache\": %d, \"over\": %d, \"max_fraction\": %.4f, "
                 "\"max_fraction_of_fastest\": %.4f}}",
                 c->checked, c->over, c->max_fraction, c->max_fastest);
}
