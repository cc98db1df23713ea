/*
 * final_round.c - the interleaved round that decides between finalists,
 * timed again while other work on the machine disturbs it (final_round.h).
 */
#include "final_round.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void final_retry(final_try_fn try_round, void *try_ctx, int retries, unsigned pause_s, int watch,
                 final_note_fn note, void *note_ctx, final_verdict *v)
{
    memset(v, 0, sizeof *v);
    for (;;) {
        disturbance d = try_round(try_ctx);
        v->tries++;
        if (!watch || !disturbance_found(&d))
            return;
        v->disturbed++;
        disturbance_describe(&d, v->disturbance, sizeof v->disturbance);
        char line[300];
        if (v->tries > retries) {
            v->provisional = 1;
            snprintf(line, sizeof line, "final round disturbed (%s); its winner is provisional", v->disturbance);
            if (note)
                note(note_ctx, line);
            return;
        }
        snprintf(line, sizeof line, "final round disturbed (%s): timed again in %u s", v->disturbance, pause_s);
        if (note)
            note(note_ctx, line);
        if (pause_s)
            sleep(pause_s);
    }
}

int final_rounds(const attnres_device *dev)
{
    if (dev->simulated)
        return 3;
    return strcmp(dev->backend, "cpu") == 0 ? FINAL_ROUNDS_CPU : 31;
}

/* One try of final_interleave: the interleaved rounds, whose results all
 * carry the window's disturbance. */
typedef struct interleave_try {
    attnres_device *dev;
    bench_case *bc;
    const job_kernel *ks;
    size_t k;
    int rounds;
    const job_options *opt;
    device_probe *probe;
    job_result *res;
} interleave_try;

static disturbance interleave_once(void *ctx)
{
    interleave_try *t = ctx;
    job_interleave(t->dev, t->bc, t->ks, t->k, t->rounds, t->opt, t->res);
    disturbance d = {NAN, NAN, NAN, NAN, NAN};
    if (t->k)
        d = t->res[0].dist;
    /* Right after the rounds, in the window's state; the streaming pass
     * of each round (paired_stream.h) moves the kernel's bytes, not the
     * probe's, so it cannot stand in for it. */
    if (t->probe) {
        d.stream_gbps = device_probe_read(t->dev, t->probe);
        d.stream_usual_gbps = t->probe->usual_gbps;
    }
    return d;
}

void final_interleave(attnres_device *dev, bench_case *bc, const job_kernel *ks, size_t k, const job_options *opt,
                      device_probe *probe, int retries, final_note_fn note, void *note_ctx, job_result *res,
                      final_verdict *v)
{
    job_options o = *opt;
    o.round_us = dev->simulated ? 0 : FINAL_ROUND_US;
    interleave_try t = {dev, bc, ks, k, final_rounds(dev), &o, probe, res};
    final_retry(interleave_once, &t, retries, FINAL_RETRY_PAUSE_S, !dev->simulated, note, note_ctx, v);
}

void final_message(const job_result *r, size_t k, int rounds, char *buf, size_t len)
{
    int used = snprintf(buf, len, "final (interleaved with %zu, %d rounds", k, rounds);
    if (used < 0 || (size_t)used >= len)
        return;
    if (!isnan(r->paired))
        snprintf(buf + used, len - (size_t)used, "; %.1f%% of a streaming pass at %.2f GB/s in the same rounds)",
                 100.0 * r->paired, r->pair_gbps);
    else
        snprintf(buf + used, len - (size_t)used, ")");
}
