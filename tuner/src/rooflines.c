/*
 * rooflines.c - the device measurements that a tuning run records with
 * itself and reports its timings against.
 */
#include "rooflines.h"

#include <math.h>
#include <stdio.h>

/* Rounds of copy then read; each measurement is already the best of runs
 * spanning half a second. On a shared host a stall can last longer than
 * that, and two figures taken at different moments can then disagree (one
 * run measured 37.8 GB/s copy and 15.3 GB/s read, a few seconds apart), so
 * the two alternate and each keeps its best. */
enum { ROOFLINE_ROUNDS = 2 };

int rooflines_measure(attnres_device *dev, rooflines *out)
{
    int rc;
    out->copy_gbps = 0.0;
    out->read_gbps = NAN;
    for (int round = 0; round < ROOFLINE_ROUNDS; round++) {
        double copy = 0.0, read = NAN;
        if ((rc = dev->ops->copy_bandwidth(dev, &copy)) != ATTNRES_OK)
            return rc;
        if (copy > out->copy_gbps)
            out->copy_gbps = copy;
        /* The read-only rate: on a CPU, reads alone reach well under the
         * copy figure, and a read-bound kernel cannot beat them. */
        if (!dev->ops->read_bandwidth)
            continue;
        if ((rc = dev->ops->read_bandwidth(dev, &read)) != ATTNRES_OK)
            return rc;
        if (isnan(out->read_gbps) || read > out->read_gbps)
            out->read_gbps = read;
    }
    return dev->ops->empty_launch(dev, &out->launch_us);
}

void rooflines_format(const rooflines *r, char *buf, size_t size)
{
    char read[48] = "read not measured";
    if (!isnan(r->read_gbps))
        snprintf(read, sizeof read, "read %.1f GB/s", r->read_gbps);
    snprintf(buf, size, "copy bandwidth %.1f GB/s, %s, empty launch %.2f us", r->copy_gbps, read, r->launch_us);
}

void rooflines_percent(double gbps, double limit, char *buf, size_t size)
{
    if (isnan(limit) || limit <= 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.1f%%", 100.0 * gbps / limit);
}
