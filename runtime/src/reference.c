/* reference.c - the fp64 oracle of DESIGN §1, written for clarity only. */
#include <math.h>
#include <stdlib.h>

#include "attnres.h"

int attnres_reference_mix(const attnres_problem *p, int64_t T,
                          const double *const *sources, const double *query,
                          double scale, double eps, const double *partial,
                          double alpha, const double *out_gain, double out_eps,
                          double *out, double *normed)
{
    if (attnres_problem_check(p, NULL, 0) != ATTNRES_OK || T < 0 || !sources ||
        !query || !out || !(eps > 0) ||
        (p->form == ATTNRES_FORM_ADDITIVE && !partial) ||
        (p->epilogue && (!out_gain || !normed || !(out_eps > 0))))
        return ATTNRES_EINVAL;
    for (int32_t i = 0; i < p->n; i++)
        if (!sources[i])
            return ATTNRES_EINVAL;
    const int64_t d = p->d, hd = p->d / p->heads;
    const int n = p->n, heads = p->heads;
    double *score = malloc(sizeof(double) * (size_t)n * (size_t)heads);
    if (!score)
        return ATTNRES_ENOMEM;
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < n; i++) {
            const double *v = sources[i] + t * d;
            double sumsq = 0;
            for (int64_t k = 0; k < d; k++)
                sumsq += v[k] * v[k];
            const double r = 1.0 / sqrt(sumsq / (double)d + eps);
            for (int h = 0; h < heads; h++) {
                double dot = 0;
                for (int64_t k = h * hd; k < (h + 1) * hd; k++)
                    dot += r * v[k] * query[k];
                score[i * heads + h] = scale * dot;
            }
        }
        for (int h = 0; h < heads; h++) {
            /* fmax skips NaN: a NaN score still reaches every weight through
             * exp(NaN) and the sum, as the kernels do. */
            double m = -1e300, l = 0;
            for (int i = 0; i < n; i++)
                m = fmax(m, score[i * heads + h]);
            for (int i = 0; i < n; i++) {
                score[i * heads + h] = exp(score[i * heads + h] - m);
                l += score[i * heads + h];
            }
            for (int i = 0; i < n; i++)
                score[i * heads + h] /= l;
        }
        double *o = out + t * d;
        for (int64_t k = 0; k < d; k++) {
            const int h = (int)(k / hd);
            double mix = 0;
            for (int i = 0; i < n; i++)
                mix += score[i * heads + h] * sources[i][t * d + k];
            o[k] = p->form == ATTNRES_FORM_ADDITIVE
                       ? partial[t * d + k] + alpha * mix
                       : mix;
        }
        if (p->epilogue) {
            double sumsq = 0;
            for (int64_t k = 0; k < d; k++)
                sumsq += o[k] * o[k];
            const double rs = 1.0 / sqrt(sumsq / (double)d + out_eps);
            for (int64_t k = 0; k < d; k++)
                normed[t * d + k] = o[k] * rs * out_gain[k];
        }
    }
    free(score);
    return ATTNRES_OK;
}
