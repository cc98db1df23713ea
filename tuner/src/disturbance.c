/* disturbance.c - see disturbance.h. */
#define _GNU_SOURCE
#include "disturbance.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "tuner_base.h"

/* The sum of the run-queue wait of every thread of this process, in
 * seconds; -1 where schedstat cannot be read. Threads that ended before
 * the window closes take their wait with them, which only makes a window
 * look quieter: the device's workers live as long as the device. */
static double threads_wait_s(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d)
        return -1;
    double total = 0;
    int read = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/self/task/%.20s/schedstat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        unsigned long long run_ns, wait_ns;
        if (fscanf(f, "%llu %llu", &run_ns, &wait_ns) == 2) {
            total += (double)wait_ns * 1e-9;
            read = 1;
        }
        fclose(f);
    }
    closedir(d);
    return read ? total : -1;
}

/* /proc/stat's first line: steal and the sum of user..steal, in ticks. */
static int cpu_ticks(double *steal, double *total)
{
    FILE *f = fopen("/proc/stat", "r");
    if (!f)
        return -1;
    unsigned long long v[8] = {0};
    int n = fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7]);
    fclose(f);
    if (n < 8)
        return -1;
    *total = 0;
    for (int i = 0; i < 8; i++)
        *total += (double)v[i];
    *steal = (double)v[7];
    return 0;
}

static double preemptions(void)
{
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_nivcsw : -1;
}

void disturbance_begin(disturbance_mark *m)
{
    m->wall_s = artuner_now_s();
    m->preempted = preemptions();
    m->wait_s = threads_wait_s();
    m->readable = m->wait_s >= 0;
    if (cpu_ticks(&m->steal_ticks, &m->total_ticks) == 0)
        m->readable = 1;
    else
        m->total_ticks = -1;
}

disturbance disturbance_end(const disturbance_mark *m)
{
    disturbance d = {NAN, NAN, NAN, NAN, NAN};
    double wall = artuner_now_s() - m->wall_s, wait = threads_wait_s(), steal, total, pre = preemptions();
    if (m->preempted >= 0 && pre >= 0 && wall > 0)
        d.preempted_per_s = (pre - m->preempted) / wall;
    if (m->wait_s >= 0 && wait >= 0 && wall > 0)
        d.wait_frac = (wait - m->wait_s) / wall;
    if (m->total_ticks >= 0 && cpu_ticks(&steal, &total) == 0 && total > m->total_ticks)
        d.steal_frac = (steal - m->steal_ticks) / (total - m->total_ticks);
    return d;
}

/* Both readings there, and positive (0 and NaN are none). */
static int stream_read(const disturbance *d)
{
    return d->stream_gbps > 0 && d->stream_usual_gbps > 0;
}

int disturbance_found(const disturbance *d)
{
    const int drifted = stream_read(d) && d->stream_gbps * DISTURBANCE_DRIFT <= d->stream_usual_gbps;
    return d->wait_frac >= DISTURBANCE_WAIT || d->steal_frac >= DISTURBANCE_STEAL || drifted;
}

void disturbance_describe(const disturbance *d, char *buf, size_t len)
{
    char wait[64] = "thread waits unknown", steal[48] = "steal unknown", pre[48] = "", stream[80] = "";
    if (!isnan(d->wait_frac))
        snprintf(wait, sizeof wait, "threads waited %.0f%% of the window for a CPU", 100.0 * d->wait_frac);
    if (!isnan(d->steal_frac))
        snprintf(steal, sizeof steal, "%.0f%% stolen", 100.0 * d->steal_frac);
    if (!isnan(d->preempted_per_s))
        snprintf(pre, sizeof pre, ", %.0f preemptions/s", d->preempted_per_s);
    if (stream_read(d))
        snprintf(stream, sizeof stream, ", copy pass at %.1f GB/s against the run's usual %.1f", d->stream_gbps,
                 d->stream_usual_gbps);
    snprintf(buf, len, "%s, %s%s%s", wait, steal, pre, stream);
}
