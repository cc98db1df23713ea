/*
 * ceilings.c - the device's ceilings as the tuner measures them
 * (runtime/src/cpu_ceilings.c, docs/design.md §2): every streaming kernel's
 * GB/s by thread count, the FMA peak and the largest cache, repeated so that
 * a shared host's noise shows.
 *
 *   build/bin/ceilings [--device SPEC] [--repeat K]
 *
 * Each repetition is one full measurement (itself the best of two rounds of
 * runs spanning 0.2 s per kernel and thread count); the table gives the
 * median and the best of the K repetitions per kernel and thread count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "device.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv)
{
    const char *spec = "cpu";
    int repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc)
            spec = argv[++i];
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--device SPEC] [--repeat K]\n", argv[0]);
            return 2;
        }
    }
    if (repeat < 1 || repeat > 50) {
        fprintf(stderr, "ceilings: --repeat must be 1..50\n");
        return 2;
    }
    attnres_device *dev = NULL;
    char msg[512];
    if (attnres_device_open(spec, &dev, msg, sizeof msg) != ATTNRES_OK) {
        fprintf(stderr, "ceilings: cannot open %s: %s\n", spec, msg);
        return 1;
    }
    if (!dev->ops->ceilings) {
        fprintf(stderr, "ceilings: the %s backend has no ceiling kernels\n", dev->backend);
        attnres_device_close(dev);
        return 1;
    }
    ar_ceilings *runs = calloc((size_t)repeat, sizeof *runs);
    double *v = calloc((size_t)repeat, sizeof *v);
    if (!runs || !v)
        return 1;
    for (int r = 0; r < repeat; r++)
        if (dev->ops->ceilings(dev, &runs[r]) != ATTNRES_OK) {
            fprintf(stderr, "ceilings: %s\n", attnres_device_errmsg(dev));
            return 1;
        }
    printf("device %s (%s), %d unit(s); %d repetition(s)\n", dev->name, dev->backend, dev->units, repeat);
    printf("largest cache %.1f MiB\n\n", runs[0].cache_bytes / 1048576.0);
    printf("%-22s %-5s %8s %12s %12s\n", "kernel", "kind", "threads", "median GB/s", "best GB/s");
    for (int i = 0; i < runs[0].n; i++) {
        double best = 0;
        for (int r = 0; r < repeat; r++) {
            v[r] = runs[r].pt[i].gbps;
            best = v[r] > best ? v[r] : best;
        }
        const ar_ceiling_point *p = &runs[0].pt[i];
        printf("%-22s %-5s %8d %12.2f %12.2f\n", p->kernel, p->kind == AR_CEILING_READ ? "read" : "copy",
               p->threads, median(v, repeat), best);
    }
    double best = 0;
    for (int r = 0; r < repeat; r++) {
        v[r] = runs[r].fma_gflops;
        best = v[r] > best ? v[r] : best;
    }
    printf("%-22s %-5s %8d %12.1f %12.1f  (GFLOP/s, fp32)\n", "fma", "flop", runs[0].fma_threads, median(v, repeat),
           best);
    free(runs);
    free(v);
    attnres_device_close(dev);
    return 0;
}
