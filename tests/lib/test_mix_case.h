/*
 * test_mix_case.h - kernel cases on random data: filling, widening and the
 * error against the fp64 reference (DESIGN §1), and one mix problem run
 * through any launch, a plan (a built-in kernel) or a compiled template
 * variant (the CPU cases of backend_ops). Header-only, like test_data.h.
 */
#ifndef ATTNRES_TEST_MIX_CASE_H
#define ATTNRES_TEST_MIX_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "test_compare.h"
#include "test_data.h"

/* rows x d random values stored in buf (dtype dt); the rounded values go to
 * exact. Rows differ in magnitude by up to 100x. */
static inline void case_fill(uint64_t *s, attnres_dtype dt, void *buf, int64_t rows, int64_t d, double *exact)
{
    fill_rows(s, dt, buf, rows, d, d, 0, exact);
}

static inline void case_fill_f32(uint64_t *s, float *f, double *exact, int64_t count, double mag)
{
    for (int64_t i = 0; i < count; i++) {
        f[i] = (float)(mag * rng_normal(s));
        exact[i] = f[i];
    }
}

static inline void case_widen(attnres_dtype dt, const void *buf, double *out, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        out[i] = elem_load(dt, buf, i);
}

/* Launches the mix of p on T tokens with arguments a; an attnres status. */
typedef int (*mix_case_launch)(void *ctx, const attnres_problem *p, int64_t T, const attnres_mix_args *a);

/* The errors of one run: out, and normed when p has the epilogue (else 0);
 * both INFINITY when the launch or the reference failed. */
typedef struct mix_case_errors {
    double out, normed;
} mix_case_errors;

/* Runs p (form, epilogue, heads as set; at most 64 sources) on T tokens of
 * random data from seed, with alpha 0.75 and eps 1e-5. The scores spread
 * about as N(0, sharp^2): a sharper softmax passes score errors on to the
 * output. The output rows (out, normed) start out_shift bytes past a
 * 64-byte boundary (a multiple of the element size). Every output starts
 * as all-ones bytes (NaN in every dtype), so an unwritten element shows.
 * With `kept` (T * d values), the output is also left there, widened to
 * double. */
static inline mix_case_errors mix_case_run(const attnres_problem *p, int64_t T, uint64_t seed, double sharp,
                                           size_t out_shift, mix_case_launch launch, void *ctx, double *kept)
{
    mix_case_errors e = {INFINITY, INFINITY};
    const attnres_dtype dt = p->dtype;
    const int n = p->n, additive = p->form == ATTNRES_FORM_ADDITIVE, epi = p->epilogue;
    const int64_t d = p->d, td = T * d;
    const size_t es = attnres_dtype_size(dt);
    if (n < 1 || n > 64)
        return e;
    uint64_t s = seed;
    char *src = malloc(es * (size_t)(n * td));
    double *src_x = malloc(sizeof(double) * (size_t)(n * td));
    const size_t out_bytes = (es * (size_t)td + out_shift + 63) / 64 * 64;
    char *partial = malloc(es * (size_t)td), *out_base = aligned_alloc(64, out_bytes);
    char *normed_base = aligned_alloc(64, out_bytes);
    char *out = out_base ? out_base + out_shift : NULL, *normed = normed_base ? normed_base + out_shift : NULL;
    double *partial_x = malloc(sizeof(double) * (size_t)td), *q_x = malloc(sizeof(double) * (size_t)d);
    double *go_x = malloc(sizeof(double) * (size_t)d);
    double *ref = malloc(sizeof(double) * (size_t)td), *ref_n = malloc(sizeof(double) * (size_t)td);
    double *got = malloc(sizeof(double) * (size_t)td);
    float *q = malloc(sizeof(float) * (size_t)d), *go = malloc(sizeof(float) * (size_t)d);
    if (src && src_x && partial && out && normed && partial_x && q_x && go_x && ref && ref_n && got && q && go) {
        case_fill(&s, dt, src, n * T, d, src_x);
        case_fill(&s, dt, partial, T, d, partial_x);
        case_fill_f32(&s, q, q_x, d, sharp / sqrt((double)d));
        case_fill_f32(&s, go, go_x, d, 1.0);
        const void *views[64];
        const double *views_x[64];
        for (int i = 0; i < n; i++) {
            views[i] = src + es * (size_t)(i * td);
            views_x[i] = src_x + i * td;
        }
        attnres_mix_args a;
        attnres_mix_args_init(&a);
        a.sources = views;
        a.query = q;
        a.eps = 1e-5f;
        a.partial = additive ? partial : NULL;
        a.alpha = 0.75f;
        a.out = out;
        a.out_gain = epi ? go : NULL;
        a.out_eps = 1e-6f;
        a.normed = epi ? normed : NULL;
        memset(out, 0xff, es * (size_t)td);
        memset(normed, 0xff, es * (size_t)td);
        if (launch(ctx, p, T, &a) == ATTNRES_OK &&
            attnres_reference_mix(p, T, views_x, q_x, 1.0, 1e-5, additive ? partial_x : NULL, 0.75,
                                  epi ? go_x : NULL, 1e-6, ref, epi ? ref_n : NULL) == ATTNRES_OK) {
            case_widen(dt, out, got, td);
            e.out = case_rel_err(got, ref, td);
            if (kept)
                memcpy(kept, got, sizeof(double) * (size_t)td);
            e.normed = 0.0;
            if (epi) {
                case_widen(dt, normed, got, td);
                e.normed = case_rel_err(got, ref_n, td);
            }
        }
    }
    free(src), free(src_x), free(partial), free(out_base), free(normed_base), free(partial_x), free(q_x), free(go_x);
    free(ref), free(ref_n), free(got), free(q), free(go);
    return e;
}

#endif
