/*
 * rooflines.c - the device measurements that a tuning run records with
 * itself and reports its timings against.
 */
#include "rooflines.h"

#include <math.h>
#include <stdio.h>

int rooflines_measure(attnres_device *dev, rooflines *out)
{
    int rc;
    out->read_gbps = NAN;
    if ((rc = dev->ops->copy_bandwidth(dev, &out->copy_gbps)) != ATTNRES_OK)
        return rc;
    /* The read-only rate: on a CPU, reads alone reach well under the copy
     * figure, and a read-bound kernel cannot beat them. */
    if (dev->ops->read_bandwidth && (rc = dev->ops->read_bandwidth(dev, &out->read_gbps)) != ATTNRES_OK)
        return rc;
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
