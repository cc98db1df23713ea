/*
 * device_ceilings.c - the device measurements that a tuning run records with
 * itself and reports its timings against.
 */
#include "device_ceilings.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Rounds of copy then read; each measurement is already the best of runs
 * spanning half a second. On a shared host a stall can last longer than
 * that, and two figures taken at different moments can then disagree (one
 * run measured 37.8 GB/s copy and 15.3 GB/s read, a few seconds apart), so
 * the two alternate and each keeps its best. (A backend with ceilings
 * alternates its kernels itself.) */
enum { CEILING_ROUNDS = 2 };

static int measure_two(attnres_device *dev, device_ceilings *out)
{
    int rc;
    for (int round = 0; round < CEILING_ROUNDS; round++) {
        double copy = 0.0, read = NAN;
        if ((rc = dev->ops->copy_bandwidth(dev, &copy)) != ATTNRES_OK)
            return rc;
        if (copy > out->copy_gbps)
            out->copy_gbps = copy;
        if (!dev->ops->read_bandwidth)
            continue;
        if ((rc = dev->ops->read_bandwidth(dev, &read)) != ATTNRES_OK)
            return rc;
        if (isnan(out->read_gbps) || read > out->read_gbps)
            out->read_gbps = read;
    }
    return ATTNRES_OK;
}

int device_ceilings_measure(attnres_device *dev, device_ceilings *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    out->read_gbps = NAN;
    out->ceil.fma_gflops = NAN;
    if (dev->ops->ceilings) {
        if ((rc = dev->ops->ceilings(dev, &out->ceil)) != ATTNRES_OK)
            return rc;
        /* The ceilings are the best of the kernels of each kind. */
        for (int i = 0; i < out->ceil.n; i++) {
            const ar_ceiling_point *p = &out->ceil.pt[i];
            const double best = p->best_gbps > p->gbps ? p->best_gbps : p->gbps;
            if (p->kind == AR_CEILING_COPY && p->gbps > out->copy_gbps)
                out->copy_gbps = p->gbps;
            if (p->kind == AR_CEILING_COPY && best > out->copy_best_gbps)
                out->copy_best_gbps = best;
            if (p->kind == AR_CEILING_READ && (isnan(out->read_gbps) || p->gbps > out->read_gbps))
                out->read_gbps = p->gbps;
            if (p->kind == AR_CEILING_READ && best > out->read_best_gbps)
                out->read_best_gbps = best;
        }
    } else if ((rc = measure_two(dev, out)) != ATTNRES_OK) {
        return rc;
    }
    return dev->ops->empty_launch(dev, &out->launch_us);
}

/* The read rate the blend uses: a copy reads half the bytes it moves, so
 * reading can go at least at half the copy figure; a read kernel that
 * measured less left bandwidth unused, and the blend must still put the
 * copy at the copy ceiling. */
static double blend_read(const device_ceilings *r)
{
    return r->read_gbps > 0.5 * r->copy_gbps ? r->read_gbps : 0.5 * r->copy_gbps;
}

double device_ceilings_write_gbps(const device_ceilings *r)
{
    if (isnan(r->read_gbps) || !(r->copy_gbps > 0))
        return NAN;
    /* B / copy/2 = B / read + B / write */
    double inv = 2.0 / r->copy_gbps - 1.0 / blend_read(r);
    return inv > 1e-12 ? 1.0 / inv : INFINITY;
}

double device_ceilings_ceiling(const device_ceilings *r, double read_bytes, double write_bytes)
{
    if (!(r->copy_gbps > 0))
        return NAN;
    if (isnan(r->read_gbps) || read_bytes + write_bytes <= 0)
        return r->copy_gbps;
    double w = device_ceilings_write_gbps(r);
    double t = read_bytes / blend_read(r) + (isinf(w) ? 0.0 : write_bytes / w);
    return t > 0 ? (read_bytes + write_bytes) / t : r->copy_gbps;
}

#define CACHE_DEFAULT (64.0 * 1048576.0)

double device_ceilings_fastest_ceiling(const device_ceilings *r, double read_bytes, double write_bytes)
{
    device_ceilings fastest = *r;
    if (r->copy_best_gbps > r->copy_gbps)
        fastest.copy_gbps = r->copy_best_gbps;
    if (!isnan(r->read_gbps) && r->read_best_gbps > r->read_gbps)
        fastest.read_gbps = r->read_best_gbps;
    return device_ceilings_ceiling(&fastest, read_bytes, write_bytes);
}

static double largest_cache(const device_ceilings *r)
{
    return r->ceil.cache_bytes > 0 ? r->ceil.cache_bytes : CACHE_DEFAULT;
}

int device_ceilings_out_of_cache(const device_ceilings *r, double bytes) { return bytes >= 4.0 * largest_cache(r); }

int device_ceilings_beyond_cache(const device_ceilings *r, double bytes) { return bytes >= largest_cache(r); }

double device_ceilings_noise(double median_us, double spread_us)
{
    double noise = median_us > 0 && spread_us > 0 ? 2.0 * spread_us / median_us : 0.0;
    return noise > 0.05 ? noise : 0.05;
}

int device_ceilings_above(double fraction, double noise) { return fraction > 1.0 + noise; }

void device_ceilings_format(const device_ceilings *r, char *buf, size_t size)
{
    char read[48] = "read not measured", fma[48] = "";
    if (!isnan(r->read_gbps))
        snprintf(read, sizeof read, "read %.1f GB/s", r->read_gbps);
    if (r->ceil.fma_gflops > 0)
        snprintf(fma, sizeof fma, ", FMA %.0f GFLOP/s", r->ceil.fma_gflops);
    int len = snprintf(buf, size, "copy bandwidth %.1f GB/s, %s, empty launch %.2f us%s", r->copy_gbps, read,
                       r->launch_us, fma);
    if (len < 0 || (size_t)len >= size || !(r->ceil.cache_bytes > 0))
        return;
    const double mib = 1048576.0;
    if (r->ceil.cache_measured > 0)
        snprintf(buf + len, size - (size_t)len, ", largest cache %.0f MiB by a read sweep (the system says %.0f MiB)",
                 r->ceil.cache_measured / mib, r->ceil.cache_hint_bytes / mib);
    else
        snprintf(buf + len, size - (size_t)len, ", largest cache %.0f MiB", r->ceil.cache_bytes / mib);
}

/* Appends to buf at *len, keeping it terminated. */
static void put(char *buf, size_t size, size_t *len, const char *fmt, double a, double b, const char *s)
{
    if (*len >= size)
        return;
    int n = s ? snprintf(buf + *len, size - *len, fmt, s, a, b) : snprintf(buf + *len, size - *len, fmt, a, b);
    if (n > 0)
        *len = *len + (size_t)n < size ? *len + (size_t)n : size - 1;
}

static void put_number(char *buf, size_t size, size_t *len, const char *key, double v)
{
    char num[64];
    if (isfinite(v))
        snprintf(num, sizeof num, "\"%s\": %.6g", key, v);
    else
        snprintf(num, sizeof num, "\"%s\": null", key);
    put(buf, size, len, "%s", 0, 0, num);
}

void device_ceilings_json(const device_ceilings *r, char *buf, size_t size)
{
    size_t len = 0;
    if (size)
        buf[0] = 0;
    put(buf, size, &len, "{", 0, 0, NULL);
    put_number(buf, size, &len, "copy_gbps", r->copy_gbps);
    put(buf, size, &len, ", ", 0, 0, NULL);
    put_number(buf, size, &len, "read_gbps", r->read_gbps);
    put(buf, size, &len, ", ", 0, 0, NULL);
    put_number(buf, size, &len, "copy_best_gbps", r->copy_best_gbps > 0 ? r->copy_best_gbps : r->copy_gbps);
    put(buf, size, &len, ", ", 0, 0, NULL);
    put_number(buf, size, &len, "read_best_gbps", r->read_best_gbps > 0 ? r->read_best_gbps : r->read_gbps);
    put(buf, size, &len, ", ", 0, 0, NULL);
    /* INFINITY (writes free) is recorded as null too; "blend" says how. */
    put_number(buf, size, &len, "write_gbps", device_ceilings_write_gbps(r));
    put(buf, size, &len, ", \"blend\": \"time\", ", 0, 0, NULL);
    put_number(buf, size, &len, "fma_gflops", r->ceil.fma_gflops);
    put(buf, size, &len, ", \"fma_threads\": %.0f, ", r->ceil.fma_threads, 0, NULL);
    put_number(buf, size, &len, "cache_bytes", r->ceil.cache_bytes);
    put(buf, size, &len, ", ", 0, 0, NULL);
    put_number(buf, size, &len, "cache_hint_bytes", r->ceil.cache_hint_bytes);
    put(buf, size, &len, ", ", 0, 0, NULL);
    put_number(buf, size, &len, "cache_measured_bytes", r->ceil.cache_measured);
    put(buf, size, &len, ", \"kernels\": [", 0, 0, NULL);
    for (int i = 0; i < r->ceil.n; i++) {
        const ar_ceiling_point *p = &r->ceil.pt[i];
        put(buf, size, &len, i ? ", {\"kernel\": \"%s\", " : "{\"kernel\": \"%s\", ", 0, 0, p->kernel);
        put(buf, size, &len, "\"kind\": \"%s\", ", 0, 0, p->kind == AR_CEILING_READ ? "read" : "copy");
        put(buf, size, &len, "\"threads\": %.0f, \"gbps\": %.2f, ", p->threads, p->gbps, NULL);
        put(buf, size, &len, "\"best_gbps\": %.2f}", p->best_gbps > 0 ? p->best_gbps : p->gbps, 0, NULL);
    }
    put(buf, size, &len, "]}", 0, 0, NULL);
}

void device_ceilings_detail(const device_ceilings *r, char *buf, size_t size)
{
    size_t len = 0;
    if (size)
        buf[0] = 0;
    for (int i = 0; i < r->ceil.n; i++) {
        const ar_ceiling_point *p = &r->ceil.pt[i];
        int first = i == 0 || strcmp(r->ceil.pt[i - 1].kernel, p->kernel) != 0;
        if (first)
            put(buf, size, &len, i ? "\n  %-22s" : "  %-22s", 0, 0, p->kernel);
        put(buf, size, &len, first ? " %.0f thr %.1f GB/s" : ", %.0f thr %.1f GB/s", p->threads, p->gbps, NULL);
    }
}

void device_ceilings_percent(double gbps, double limit, char *buf, size_t size)
{
    if (isnan(limit) || limit <= 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.1f%%", 100.0 * gbps / limit);
}

/* The number device_ceilings_json wrote for key, NaN for null or where it is
 * missing. */
static double recorded_number(const char *json, const char *key) { return ar_json_double(json, key, NAN); }

int device_ceilings_from_record(const char *json, double copy_gbps, double read_gbps, double launch_us, device_ceilings *out)
{
    memset(out, 0, sizeof *out);
    if (!json || !isfinite(recorded_number(json, "copy_gbps")))
        return -1;
    out->copy_gbps = copy_gbps;
    out->read_gbps = read_gbps > 0 ? read_gbps : NAN;
    out->launch_us = launch_us;
    double best = recorded_number(json, "copy_best_gbps");
    out->copy_best_gbps = isfinite(best) ? best : 0;
    best = recorded_number(json, "read_best_gbps");
    out->read_best_gbps = isfinite(best) ? best : 0;
    out->ceil.fma_gflops = recorded_number(json, "fma_gflops");
    double threads = recorded_number(json, "fma_threads");
    out->ceil.fma_threads = isfinite(threads) ? (int)threads : 0;
    double cache = recorded_number(json, "cache_bytes");
    out->ceil.cache_bytes = isfinite(cache) ? cache : 0;
    cache = recorded_number(json, "cache_hint_bytes");
    out->ceil.cache_hint_bytes = isfinite(cache) ? cache : 0;
    cache = recorded_number(json, "cache_measured_bytes");
    out->ceil.cache_measured = isfinite(cache) ? cache : 0;
    return 0;
}
