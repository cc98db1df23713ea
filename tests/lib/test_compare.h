/*
 * test_compare.h - how the kernel tests compare an output with the fp64
 * reference (docs/design.md §1): the relative error over a whole output
 * and the bound each storage dtype must stay within. Header-only.
 */
#ifndef ATTNRES_TEST_COMPARE_H
#define ATTNRES_TEST_COMPARE_H

#include <math.h>
#include <stdint.h>

#include "attnres.h"

/* The relative error a kernel of each storage dtype must stay within. */
static inline double case_tolerance(attnres_dtype dt) { return dt == ATTNRES_DTYPE_F32 ? 1e-5 : 1e-2; }

/* The root-mean-square error of got against want, relative to want's
 * (absolute where want is all zeros). A NaN on either side gives NaN, so
 * that no comparison passes an output that holds one. */
static inline double case_rel_err(const double *got, const double *want, int64_t count)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < count; i++) {
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The size of the terms of the mix backward's dalpha = sum over tokens
 * and elements of dout . mix: sum |dout| max_n |v_n| over count values,
 * sources src[0..n) (|mix| is at most the largest |v_n|, a convex blend).
 * Its terms cancel, so that on random inputs dalpha is now and then ten
 * times smaller than they are and a correct fp32 sum's error relative to
 * dalpha itself passes 1e-5: it is held to this size instead, as the tuner
 * holds it. 1 where the terms are all zero. */
static inline double case_dalpha_terms(const double *const *src, int n, const double *dout, int64_t count)
{
    double size = 0;
    for (int64_t e = 0; e < count; e++) {
        double vmax = 0;
        for (int i = 0; i < n; i++)
            vmax = fmax(vmax, fabs(src[i][e]));
        size += fabs(dout[e]) * vmax;
    }
    return size > 0 ? size : 1.0;
}

/* The worse of two errors, NaN if either is. */
static inline double case_worse(double a, double b) { return isnan(a) || isnan(b) ? NAN : fmax(a, b); }

#endif
