/*
 * ceiling_check.h - the out-of-cache check of a run's winners against the
 * ceilings (docs/design.md §2), shared by `attnres tune` and
 * `attnres tune --revalidate`: the same warnings, summary line and record.
 */
#ifndef ATTNRES_CEILING_CHECK_H
#define ATTNRES_CEILING_CHECK_H

#include <stddef.h>

#include "device_ceilings.h"

typedef struct ceiling_check {
    int checked;         /* winners out of cache */
    int over;            /* those above the fastest streaming run beyond the noise */
    int late;            /* those above the fastest run of the run's start, but not
                            above the streaming pass timed in their own rounds */
    double max_fraction; /* the highest fraction of the matching (median) ceiling */
    double max_fastest;  /* the highest fraction of the matching fastest runs */
    /* Winners timed next to a streaming pass (paired_stream.h): how many,
     * how many above it beyond the noise, and the fractions of the first
     * 64 of them, which the median and extremes are taken over. */
    int paired, paired_over;
    double paired_fraction[64];
} ceiling_check;

/* Counts one verified winner that moved read_bytes + write_bytes at gbps,
 * its timing's median and spread giving the noise; a winner in cache is not
 * counted. `paired` is its fraction of the streaming pass timed in its own
 * rounds, with that fraction's spread (NaN: it had none): the pass runs the
 * ceilings' own kernels over the winner's bytes, so it is a measurement of
 * the ceiling too, minutes after the run's start. A winner above the
 * fastest streaming run that matches its traffic beyond the noise is over
 * its ceiling unless it is within its pass; then the ceilings of the run's
 * start were measured in a slow moment, and it is counted as late. Returns
 * 1 for either, with the warning (over) or the note (late) in `warning`
 * (one line, no newline); 0 otherwise, `warning` then empty. */
int ceiling_check_winner(const device_ceilings *r, ceiling_check *c, const char *problem, double gbps, double read_bytes,
                         double write_bytes, double median_us, double spread_us, double paired,
                         double paired_spread, char *warning, size_t size);

/* Counts one winner's fraction of the streaming pass timed in its own
 * rounds (NaN: it had none, and nothing is counted), with the median
 * absolute deviation of that fraction over the rounds. Returns 1 when it
 * is above the pass beyond the noise (device_ceilings_noise), with the warning
 * in `warning`; 0 otherwise, `warning` then empty. */
int ceiling_check_paired(ceiling_check *c, const char *problem, double fraction, double spread, char *warning,
                         size_t size);

/* The median of the paired fractions counted; NaN when there are none. */
double ceiling_check_paired_median(const ceiling_check *c);

/* "ceiling check: 5 out-of-cache winner(s), 0 above ...", then the paired
 * winners' median, lowest and highest fraction of their pass; no newline. */
void ceiling_check_summary(const ceiling_check *c, char *buf, size_t size);

/* device_ceilings_json with the check's outcome added as "check" (c NULL: the
 * ceilings alone, before the winners are known). */
void ceiling_check_json(const device_ceilings *r, const ceiling_check *c, char *buf, size_t size);

/* A size that holds ceiling_check_json's text. */
enum { CEILING_CHECK_JSON_SIZE = DEVICE_CEILINGS_JSON_SIZE + 256 };

#endif
