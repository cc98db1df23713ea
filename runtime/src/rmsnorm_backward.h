/*
 * rmsnorm_backward.h - the RMSNorm backward of the output-norm epilogue in
 * fp64, which the reference backward (reference_backward.c) runs on the out
 * it recomputes, and the harnesses that check kernels (the tuner's bench
 * case, backend_ops, tests/lib) run on the out a kernel is given, rounded
 * to the storage type: header-only, so that they share this one copy.
 */
#ifndef ATTNRES_RMSNORM_BACKWARD_H
#define ATTNRES_RMSNORM_BACKWARD_H

#include <math.h>
#include <stdint.h>

/* Adds the RMSNorm backward of normed = o * rho * gain, rho = 1 /
 * sqrt(mean(o^2) + eps), to g (the gradient of o) and its gain's gradient
 * to dgain: rho depends on the whole row, so each element's gradient has a
 * share of <dn * gain, o>. */
static inline void ar_rmsnorm_backward(const double *o, const double *dn, const double *gain, double eps, int64_t d,
                                       double *g, double *dgain)
{
    double sumsq = 0, gamma = 0;
    for (int64_t k = 0; k < d; k++) {
        sumsq += o[k] * o[k];
        gamma += dn[k] * gain[k] * o[k];
    }
    const double rho = 1.0 / sqrt(sumsq / (double)d + eps);
    for (int64_t k = 0; k < d; k++) {
        g[k] += rho * (dn[k] * gain[k] - o[k] * rho * rho * gamma / (double)d);
        dgain[k] += dn[k] * o[k] * rho;
    }
}

#endif
