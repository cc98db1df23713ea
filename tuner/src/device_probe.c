/* device_probe.c - see device_probe.h. */
#include "device_probe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int device_probe_create(attnres_device *dev, const device_ceilings *r, device_probe **out, char *err, size_t err_len)
{
    *out = NULL;
    if (dev->simulated)
        return 0;
    /* Out of cache by the ceiling check's own rule, so that the pass
     * streams from memory wherever the kernels it stands for do. */
    double bytes = 0;
    for (double b = 4096.0; b < DEVICE_PROBE_MAX_BYTES && !device_ceilings_out_of_cache(r, b);)
        b *= 2, bytes = b;
    if (bytes == 0 || bytes > DEVICE_PROBE_MAX_BYTES)
        bytes = DEVICE_PROBE_MAX_BYTES;
    /* Read as much as it writes: paired_stream makes that one copy. */
    paired_stream *ps = NULL;
    int got = paired_stream_create(dev, r, bytes / 2, bytes / 2, &ps, err, err_len);
    if (got <= 0)
        return got;
    device_probe *p = calloc(1, sizeof *p);
    if (!p) {
        paired_stream_free(dev, ps);
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    p->pass = ps;
    p->first_gbps = p->last_gbps = p->min_gbps = p->max_gbps = p->usual_gbps = NAN;
    *out = p;
    return 1;
}

void device_probe_free(attnres_device *dev, device_probe *p)
{
    if (!p)
        return;
    paired_stream_free(dev, p->pass);
    free(p->all);
    free(p);
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double device_probe_read(attnres_device *dev, device_probe *p)
{
    if (!p)
        return NAN;
    double us[DEVICE_PROBE_PASSES], one;
    if (paired_stream_run(dev, p->pass, &one) != ATTNRES_OK)
        return NAN;
    for (int i = 0; i < DEVICE_PROBE_PASSES; i++)
        if (paired_stream_run(dev, p->pass, &us[i]) != ATTNRES_OK || !(us[i] > 0))
            return NAN;
    qsort(us, DEVICE_PROBE_PASSES, sizeof us[0], by_value);
    const double gbps = p->pass->bytes / (us[DEVICE_PROBE_PASSES / 2] * 1e3);
    if (p->readings == p->cap) {
        int cap = p->cap ? 2 * p->cap : 64;
        double *all = realloc(p->all, (size_t)cap * sizeof *all);
        if (!all)
            return NAN;
        p->all = all;
        p->cap = cap;
    }
    p->all[p->readings++] = gbps;
    if (p->readings == 1)
        p->first_gbps = p->min_gbps = p->max_gbps = gbps;
    p->last_gbps = gbps;
    p->min_gbps = fmin(p->min_gbps, gbps);
    p->max_gbps = fmax(p->max_gbps, gbps);
    /* The median, robust to one fast outlier as to one slow window: a
     * run that read 70 GB/s once and 45-55 otherwise is not disturbed at
     * 47. A run of a few hundred problems sorts a few hundred values. */
    double *sorted = malloc((size_t)p->readings * sizeof *sorted);
    if (sorted) {
        memcpy(sorted, p->all, (size_t)p->readings * sizeof *sorted);
        qsort(sorted, (size_t)p->readings, sizeof *sorted, by_value);
        const int h = p->readings / 2;
        p->usual_gbps = p->readings % 2 ? sorted[h] : 0.5 * (sorted[h - 1] + sorted[h]);
        free(sorted);
    }
    return gbps;
}

void device_probe_describe(const device_probe *p, char *buf, size_t len)
{
    if (!p || p->readings == 0) {
        snprintf(buf, len, "%s", "");
        return;
    }
    if (p->readings == 1) {
        snprintf(buf, len, "copy pass %.1f GB/s at the start", p->first_gbps);
        return;
    }
    snprintf(buf, len, "copy pass %.1f GB/s at the start, %.1f at the end, %.1f-%.1f over %d readings, median %.1f",
             p->first_gbps, p->last_gbps, p->min_gbps, p->max_gbps, p->readings, p->usual_gbps);
}

void device_probe_json(const device_probe *p, char *buf, size_t len)
{
    if (!p || p->readings == 0) {
        snprintf(buf, len, "{}");
        return;
    }
    snprintf(buf, len,
             "{\"bytes\": %.0f, \"first_gbps\": %.3f, \"last_gbps\": %.3f, \"min_gbps\": %.3f, "
             "\"max_gbps\": %.3f, \"median_gbps\": %.3f, \"readings\": %d}",
             p->pass->bytes, p->first_gbps, p->last_gbps, p->min_gbps, p->max_gbps, p->usual_gbps, p->readings);
}
