/* paired_stream.c - see paired_stream.h. */
#include "paired_stream.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "measure.h"

/* The fastest point of one kind among the run's ceilings; NULL if none. */
static const ar_ceiling_point *fastest(const ar_ceilings *c, int kind)
{
    const ar_ceiling_point *best = NULL;
    for (int i = 0; i < c->n; i++)
        if (c->pt[i].kind == kind && c->pt[i].gbps > 0 && (!best || c->pt[i].gbps > best->gbps))
            best = &c->pt[i];
    return best;
}

/* bytes rounded down to whole pages per thread (a CUDA point's threads
 * are blocks per SM, 0 for the driver's copy: whole pages); 0 when less
 * than that. */
static size_t whole(double bytes, int threads)
{
    const double unit = 4096.0 * (double)(threads > 1 ? threads : 1);
    return (size_t)floor(bytes / unit) * (size_t)unit;
}

int paired_stream_create(attnres_device *dev, const device_ceilings *r, double read_bytes, double write_bytes,
                         paired_stream **out, char *err, size_t err_len)
{
    *out = NULL;
    if (!dev->ops->stream_pass || !device_ceilings_beyond_cache(r, read_bytes + write_bytes) || write_bytes > read_bytes)
        return 0;
    const ar_ceiling_point *copy = fastest(&r->ceil, AR_CEILING_COPY), *read = fastest(&r->ceil, AR_CEILING_READ);
    if (!copy || !read)
        return 0;
    paired_stream *ps = calloc(1, sizeof *ps);
    if (!ps) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    ps->blocks_per_sm = strcmp(dev->ops->name, "cuda") == 0;
    /* The writes: a copy of as many bytes as the kernel writes. */
    ar_stream_step *w = &ps->pass.step[0];
    *w = (ar_stream_step){.kernel = copy->kernel, .threads = copy->threads, .offset = 0,
                          .bytes = whole(write_bytes, copy->threads)};
    /* The reads beyond those: read by the read kernel, or copied in halves
     * where reading measured below half the copy figure, as the blend
     * assumes (device_ceilings.c). */
    const double rest = read_bytes - (double)w->bytes;
    const int rd_copies = read->gbps < 0.5 * copy->gbps;
    ar_stream_step *rd = &ps->pass.step[1];
    if (!rd_copies)
        *rd = (ar_stream_step){.kernel = read->kernel, .threads = read->threads, .bytes = whole(rest, read->threads)};
    else
        *rd = (ar_stream_step){.kernel = copy->kernel, .threads = copy->threads,
                               .bytes = whole(0.5 * rest, copy->threads)};
    rd->offset = 2 * w->bytes;
    if (w->bytes == 0)
        w->kernel = NULL;
    if (rd->bytes == 0)
        rd->kernel = NULL;
    ps->buf_bytes = rd->offset + (rd_copies ? 2 : 1) * rd->bytes;
    ps->bytes = 2.0 * (double)w->bytes + (rd_copies ? 2.0 : 1.0) * (double)rd->bytes;
    if (ps->buf_bytes == 0) {
        free(ps);
        return 0;
    }
    if (dev->ops->mem_alloc(dev, ps->buf_bytes, &ps->buf) != ATTNRES_OK) {
        snprintf(err, err_len, "the streaming pass's %zu MiB: %s", ps->buf_bytes >> 20, attnres_device_errmsg(dev));
        free(ps);
        return -1;
    }
    /* Written once, so that reads stream from memory (untouched pages of a
     * CPU read as the one zero page, from cache) and no pass faults pages in. */
    enum { CHUNK = 1 << 22 };
    float *ones = malloc(CHUNK);
    const int have_ones = ones != NULL;
    int rc = have_ones ? ATTNRES_OK : ATTNRES_ENOMEM;
    for (size_t i = 0; ones && i < CHUNK / sizeof *ones; i++)
        ones[i] = 1.0f;
    for (size_t off = 0; rc == ATTNRES_OK && off < ps->buf_bytes; off += CHUNK) {
        size_t n = ps->buf_bytes - off < CHUNK ? ps->buf_bytes - off : CHUNK;
        rc = dev->ops->copy_to_device(dev, (char *)ps->buf + off, ones, n);
    }
    free(ones);
    if (rc != ATTNRES_OK) {
        snprintf(err, err_len, "writing the streaming pass's buffer: %s",
                 have_ones ? attnres_device_errmsg(dev) : "out of memory");
        paired_stream_free(dev, ps);
        return -1;
    }
    *out = ps;
    return 1;
}

int paired_stream_for_case(attnres_device *dev, const device_ceilings *r, const bench_case *bc, paired_stream **out,
                           char *err, size_t err_len)
{
    double rd, wr;
    bench_case_traffic(bc, &rd, &wr);
    return paired_stream_create(dev, r, rd, wr, out, err, err_len);
}

void paired_stream_free(attnres_device *dev, paired_stream *ps)
{
    if (!ps)
        return;
    if (ps->buf)
        dev->ops->mem_free(dev, ps->buf);
    free(ps);
}

int paired_stream_run(attnres_device *dev, const paired_stream *ps, double *us)
{
    return dev->ops->stream_pass(dev, ps->buf, &ps->pass, us);
}

void paired_stream_describe(const paired_stream *ps, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = 0;
    for (int s = 0; s < AR_STREAM_STEPS && len < size; s++) {
        const ar_stream_step *st = &ps->pass.step[s];
        if (!st->kernel)
            continue;
        const char *sep = len ? " + " : "";
        /* Below 0.1 GB in MB, so that a small pass does not read as 0.00 GB. */
        const int in_gb = st->bytes >= 100000000;
        const double amount = (double)st->bytes / (in_gb ? 1e9 : 1e6);
        const char *unit = in_gb ? "GB" : "MB";
        if (!ps->blocks_per_sm)
            len += (size_t)snprintf(buf + len, size - len, "%s%s on %d thread%s over %.2f %s", sep, st->kernel,
                                    st->threads, st->threads == 1 ? "" : "s", amount, unit);
        else if (st->threads > 0)
            len += (size_t)snprintf(buf + len, size - len, "%s%s at %d blocks per SM over %.2f %s", sep,
                                    st->kernel, st->threads, amount, unit);
        else
            len += (size_t)snprintf(buf + len, size - len, "%s%s over %.2f %s", sep, st->kernel, amount, unit);
    }
}
