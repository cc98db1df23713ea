/*
 * test_plain_mix.h - a plan's mix with the default arguments (sources,
 * query and output, nothing else) and the relative error of an output
 * against its fp64 reference: what the programs that plan from damaged
 * or fuzzed databases run to see that a plan they got computes the right
 * thing. Public API only. Header-only.
 */
#ifndef ATTNRES_TEST_PLAIN_MIX_H
#define ATTNRES_TEST_PLAIN_MIX_H

#include <math.h>
#include <stdint.h>

#include "attnres.h"

/* Runs the plan's mix over T tokens of sources with query into out; the
 * run's status. */
static inline int plain_mix_run(attnres_plan *plan, int64_t T, const void *const *sources, const float *query,
                                float *out)
{
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = sources;
    a.query = query;
    a.out = out;
    return attnres_run_mix(plan, T, &a, NULL);
}

/* ||out - ref|| / ||ref|| over n values. */
static inline double plain_rel_err(const float *out, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t k = 0; k < n; k++) {
        num += (out[k] - ref[k]) * (out[k] - ref[k]);
        den += ref[k] * ref[k];
    }
    return sqrt(num / den);
}

#endif
