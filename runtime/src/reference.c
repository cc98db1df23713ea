/* reference.c - the fp64 oracle of DESIGN §1, written for clarity only. */
#include <math.h>
#include <stdlib.h>

#include "attnres.h"
#include "device.h"

/* Softmax over the n sources of each head, in place on scores laid out
 * [n][H]: the forward's max-shifted form, so that one source gets a weight
 * of exactly 1 (exp(0) / 1). Writes the log-sum-exp per head when lse is
 * not NULL. fmax skips NaN: a NaN score still reaches every weight through
 * exp(NaN) and the sum, as the kernels do. */
void ar_softmax_heads(double *s, int n, int heads, double *lse)
{
    for (int h = 0; h < heads; h++) {
        double m = -1e300, l = 0;
        for (int i = 0; i < n; i++)
            m = fmax(m, s[i * heads + h]);
        for (int i = 0; i < n; i++) {
            s[i * heads + h] = exp(s[i * heads + h] - m);
            l += s[i * heads + h];
        }
        for (int i = 0; i < n; i++)
            s[i * heads + h] /= l;
        if (lse)
            lse[h] = m + log(l);
    }
}

/* Copies the caller's problem into own: whether it could be read and is a
 * valid problem. */
static int adopt_valid(const attnres_problem *caller, attnres_problem *own)
{
    return ar_problem_adopt(caller, own, NULL, 0) == ATTNRES_OK && attnres_problem_check(own, NULL, 0) == ATTNRES_OK;
}

int attnres_reference_mix(const attnres_problem *caller, int64_t T,
                          const double *const *sources, const double *query,
                          double scale, double eps, const double *partial,
                          double alpha, const double *out_gain, double out_eps,
                          double *out, double *normed)
{
    attnres_problem own;
    const attnres_problem *p = &own;
    if (!adopt_valid(caller, &own) || T < 0 || !sources ||
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
        ar_softmax_heads(score, n, heads, NULL);
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

/* ---- Block AttnRes, two-phase form -------------------------------------- */

/* 1 / RMS of one row of d values. */
static double inv_rms(const double *v, int64_t d, double eps)
{
    double sumsq = 0;
    for (int64_t k = 0; k < d; k++)
        sumsq += v[k] * v[k];
    return 1.0 / sqrt(sumsq / (double)d + eps);
}

int attnres_reference_phase1(const attnres_problem *caller, int64_t T,
                             const double *const *sources,
                             const double *queries, double scale, double eps,
                             double *o1, double *lse)
{
    attnres_problem own;
    const attnres_problem *p = &own;
    if (!adopt_valid(caller, &own) ||
        p->op != ATTNRES_OP_PHASE1 || T < 0 || !sources || !queries || !o1 ||
        !lse || !(eps > 0))
        return ATTNRES_EINVAL;
    for (int32_t i = 0; i < p->n; i++)
        if (!sources[i])
            return ATTNRES_EINVAL;
    const int64_t d = p->d, hd = p->d / p->heads;
    const int n = p->n, heads = p->heads, sites = p->s;
    double *r = malloc(sizeof(double) * (size_t)n);
    double *score = malloc(sizeof(double) * (size_t)n);
    if (!r || !score) {
        free(r);
        free(score);
        return ATTNRES_ENOMEM;
    }
    for (int64_t t = 0; t < T; t++) {
        for (int i = 0; i < n; i++)
            r[i] = inv_rms(sources[i] + t * d, d, eps);
        for (int j = 0; j < sites; j++) {
            const double *u = queries + (int64_t)j * d;
            double *o = o1 + ((int64_t)j * T + t) * d;
            for (int h = 0; h < heads; h++) {
                for (int i = 0; i < n; i++) {
                    const double *v = sources[i] + t * d;
                    double dot = 0;
                    for (int64_t k = h * hd; k < (h + 1) * hd; k++)
                        dot += r[i] * v[k] * u[k];
                    score[i] = scale * dot;
                }
                ar_softmax_heads(score, n, 1, &lse[((int64_t)j * T + t) * heads + h]);
                for (int64_t k = h * hd; k < (h + 1) * hd; k++) {
                    double mix = 0;
                    for (int i = 0; i < n; i++)
                        mix += score[i] * sources[i][t * d + k];
                    o[k] = mix;
                }
            }
        }
    }
    free(r);
    free(score);
    return ATTNRES_OK;
}

double ar_sigmoid(double x)
{
    if (x >= 0)
        return 1.0 / (1.0 + exp(-x));
    const double e = exp(x);
    return e / (1.0 + e);
}

int attnres_reference_phase2(const attnres_problem *caller, int64_t T,
                             const double *o1, const double *lse,
                             double *partial, const double *sublayer,
                             const double *query, double scale, double eps,
                             const double *out_gain, double out_eps,
                             double *out, double *normed)
{
    attnres_problem own;
    const attnres_problem *p = &own;
    if (!adopt_valid(caller, &own) ||
        p->op != ATTNRES_OP_PHASE2 || T < 0 || !o1 || !lse || !partial ||
        !query || !out || !(eps > 0) || (p->fuse_add && !sublayer) ||
        (p->epilogue && (!out_gain || !normed || !(out_eps > 0))))
        return ATTNRES_EINVAL;
    const int64_t d = p->d, hd = p->d / p->heads;
    const int heads = p->heads;
    for (int64_t t = 0; t < T; t++) {
        double *b = partial + t * d;
        if (p->fuse_add)
            for (int64_t k = 0; k < d; k++)
                b[k] += sublayer[t * d + k];
        const double r = inv_rms(b, d, eps);
        const double *o = o1 + t * d;
        double *y = out + t * d;
        for (int h = 0; h < heads; h++) {
            double dot = 0;
            for (int64_t k = h * hd; k < (h + 1) * hd; k++)
                dot += r * b[k] * query[k];
            const double p2 = ar_sigmoid(scale * dot - lse[t * heads + h]);
            for (int64_t k = h * hd; k < (h + 1) * hd; k++)
                y[k] = o[k] + p2 * (b[k] - o[k]);
        }
        if (p->epilogue) {
            const double rs = inv_rms(y, d, out_eps);
            for (int64_t k = 0; k < d; k++)
                normed[t * d + k] = y[k] * rs * out_gain[k];
        }
    }
    return ATTNRES_OK;
}
