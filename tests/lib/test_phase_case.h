/*
 * test_phase_case.h - one phase 1 or phase 2 problem on random host data,
 * run through any launch (a plan, a compiled kernel, the time slot) and
 * compared with the fp64 reference (DESIGN §1), as test_mix_case.h does
 * for the mix: for the CPU cases of the op x backend harness
 * (tests/backend_ops) and the phase API checks. Header-only.
 *
 * Two layouts: contiguous views with only the arguments the problem uses
 * and the defaults of attnres_phase*_args_init (scale 1, out_eps 1e-6);
 * or padded views (every row past its end by a few elements) with every
 * argument given, the unused ones too, and scales other than 1. Every
 * output starts as all-ones bytes (NaN in every dtype), so an unwritten
 * element shows.
 */
#ifndef ATTNRES_TEST_PHASE_CASE_H
#define ATTNRES_TEST_PHASE_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "test_compare.h"
#include "test_data.h"

/* A phase 1 problem: n sources, s sites, h heads. */
static inline void phase1_problem(attnres_problem *p, attnres_dtype dt, int64_t d, int32_t n, int32_t s, int32_t h)
{
    attnres_problem_init(p, dt, d, n);
    p->op = ATTNRES_OP_PHASE1;
    p->s = s;
    p->heads = h;
}

/* A phase 2 problem: h heads, the fused add and the epilogue as given. */
static inline void phase2_problem(attnres_problem *p, attnres_dtype dt, int64_t d, int32_t h, int fuse, int epi)
{
    attnres_problem_init(p, dt, d, 1);
    p->op = ATTNRES_OP_PHASE2;
    p->heads = h;
    p->fuse_add = fuse;
    p->epilogue = epi;
}

typedef int (*phase1_case_launch)(void *ctx, const attnres_problem *p, int64_t T, const attnres_phase1_args *a);
typedef int (*phase2_case_launch)(void *ctx, const attnres_problem *p, int64_t T, const attnres_phase2_args *a);

/* The errors of one run against the reference: phase 1's o1 (out) and
 * lse; phase 2's out, normed (0 without the epilogue) and the partial
 * (b + f written back with the fused add, else untouched). All INFINITY
 * when the launch or the reference failed, or memory ran out. */
typedef struct phase_case_errors {
    double out, lse, normed, partial;
} phase_case_errors;

/* The error of rows x d values of a strided storage buffer against want. */
static inline double phase_case_err(attnres_dtype dt, const void *buf, int64_t rows, int64_t d, int64_t stride,
                                    const double *want, double *scratch)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < d; k++)
            scratch[r * d + k] = elem_load(dt, buf, r * stride + k);
    return case_rel_err(scratch, want, rows * d);
}

/* Runs phase 1 of p (n sources, s sites, at most 64 of each) on T tokens
 * of random data from seed. */
static inline phase_case_errors phase1_case_run(const attnres_problem *p, int64_t T, uint64_t seed, int padded,
                                                phase1_case_launch launch, void *ctx)
{
    phase_case_errors e = {INFINITY, INFINITY, INFINITY, INFINITY};
    uint64_t s = seed;
    const int64_t d = p->d, sp = padded ? d + 3 : d, op = padded ? d + 5 : d;
    const int n = p->n, S = p->s, H = p->heads, lp = padded ? H + 1 : H;
    const size_t es = attnres_dtype_size(p->dtype);
    if (n < 1 || n > 64 || S < 1 || S > 64)
        return e;
    char *src = calloc((size_t)(n * T * sp), es), *o1 = calloc((size_t)(S * T * op), es);
    float *lse = calloc((size_t)(S * T * lp), sizeof(float)), *q = malloc(sizeof(float) * (size_t)(S * d));
    double *src_x = malloc(sizeof(double) * (size_t)(n * T * d)), *q_x = malloc(sizeof(double) * (size_t)(S * d));
    double *ref_o = malloc(sizeof(double) * (size_t)(S * T * d)), *ref_l = malloc(sizeof(double) * (size_t)(S * T * H));
    double *got = malloc(sizeof(double) * (size_t)(S * T * (d > H ? d : H)));
    const void *srcs[64];
    const double *srcs_x[64];
    int64_t strides[64];
    void *o1s[64];
    float *lses[64];
    if (src && o1 && lse && q && src_x && q_x && ref_o && ref_l && got) {
        for (int i = 0; i < n; i++) {
            srcs[i] = src + (size_t)(i * T * sp) * es;
            srcs_x[i] = src_x + i * T * d;
            strides[i] = sp;
            fill_rows(&s, p->dtype, (void *)srcs[i], T, d, sp, 0, src_x + i * T * d);
        }
        for (int64_t i = 0; i < S * d; i++) {
            q[i] = (float)(rng_normal(&s) * (padded ? 3.0 : 1.0) / sqrt((double)d));
            q_x[i] = q[i];
        }
        for (int j = 0; j < S; j++) {
            o1s[j] = o1 + (size_t)(j * T * op) * es;
            lses[j] = lse + j * T * lp;
        }
        memset(o1, 0xff, (size_t)(S * T * op) * es);
        memset(lse, 0xff, (size_t)(S * T * lp) * sizeof(float));
        attnres_phase1_args a;
        attnres_phase1_args_init(&a);
        a.sources = srcs, a.queries = q, a.eps = 1e-5f;
        a.o1 = o1s, a.lse = lses;
        if (padded) {
            a.source_strides = strides;
            a.scale = 0.9f;
            a.o1_stride = op;
            a.lse_stride = lp;
        }
        const double scale = padded ? 0.9 : 1.0;
        if (launch(ctx, p, T, &a) == ATTNRES_OK &&
            attnres_reference_phase1(p, T, srcs_x, q_x, scale, 1e-5, ref_o, ref_l) == ATTNRES_OK) {
            e.out = e.lse = 0;
            for (int j = 0; j < S; j++) {
                e.out = case_worse(e.out, phase_case_err(p->dtype, o1s[j], T, d, op, ref_o + j * T * d, got));
                e.lse = case_worse(e.lse, phase_case_err(ATTNRES_DTYPE_F32, lses[j], T, H, lp, ref_l + j * T * H, got));
            }
            e.normed = e.partial = 0;
        }
    }
    free(src), free(o1), free(lse), free(q), free(src_x), free(q_x), free(ref_o), free(ref_l), free(got);
    return e;
}

/* Runs phase 2 of p on T tokens of random data from seed. */
static inline phase_case_errors phase2_case_run(const attnres_problem *p, int64_t T, uint64_t seed, int padded,
                                                phase2_case_launch launch, void *ctx)
{
    phase_case_errors e = {INFINITY, INFINITY, INFINITY, INFINITY};
    uint64_t s = seed;
    const int64_t d = p->d, pad = padded ? d + 7 : d, H = p->heads, lp = padded ? H + 2 : H;
    const int fuse = p->fuse_add, epi = p->epilogue;
    const size_t es = attnres_dtype_size(p->dtype), big = (size_t)(T * pad) * es, row = sizeof(double) * (size_t)(T * d);
    char *o1 = malloc(big), *b = malloc(big), *f = malloc(big), *out = malloc(big), *normed = malloc(big);
    float *lse = malloc(sizeof(float) * (size_t)(T * lp)), *q = malloc(sizeof(float) * (size_t)d);
    float *go = malloc(sizeof(float) * (size_t)d);
    double *o1_x = malloc(row), *b_x = malloc(row), *f_x = malloc(row), *ref = malloc(row), *ref_n = malloc(row);
    double *got = malloc(row), *lse_x = malloc(sizeof(double) * (size_t)(T * H));
    double *q_x = malloc(sizeof(double) * (size_t)d), *go_x = malloc(sizeof(double) * (size_t)d);
    if (o1 && b && f && out && normed && lse && q && go && o1_x && b_x && f_x && ref && ref_n && got && lse_x && q_x &&
        go_x) {
        fill_rows(&s, p->dtype, o1, T, d, pad, 0, o1_x);
        fill_rows(&s, p->dtype, b, T, d, pad, 0, b_x);
        fill_rows(&s, p->dtype, f, T, d, pad, 0, f_x);
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                lse[t * lp + h] = (float)(2.0 * rng_normal(&s) + 1.5);
                lse_x[t * H + h] = lse[t * lp + h];
            }
        for (int64_t k = 0; k < d; k++) {
            q[k] = (float)(rng_normal(&s) * (padded ? 3.0 : 1.0) / sqrt((double)d));
            q_x[k] = q[k];
            go[k] = (float)(1 + 0.1 * rng_normal(&s));
            go_x[k] = go[k];
        }
        memset(out, 0xff, big);
        memset(normed, 0xff, big);
        attnres_phase2_args a;
        attnres_phase2_args_init(&a);
        a.o1 = o1, a.lse = lse, a.partial = b;
        a.query = q, a.eps = 1e-5f, a.out = out;
        /* Padded: every argument given, those the problem does not use too. */
        a.sublayer = fuse || padded ? f : NULL;
        a.out_gain = epi || padded ? go : NULL;
        a.normed = epi || padded ? normed : NULL;
        if (padded) {
            a.o1_stride = a.partial_stride = a.sublayer_stride = a.out_stride = a.normed_stride = pad;
            a.lse_stride = lp;
            a.scale = 1.1f;
            a.out_eps = 1e-5f;
        }
        const double scale = padded ? 1.1 : 1.0, out_eps = padded ? 1e-5 : 1e-6;
        if (launch(ctx, p, T, &a) == ATTNRES_OK &&
            attnres_reference_phase2(p, T, o1_x, lse_x, b_x, fuse ? f_x : NULL, q_x, scale, 1e-5, epi ? go_x : NULL,
                                     out_eps, ref, epi ? ref_n : NULL) == ATTNRES_OK) {
            e.lse = 0;
            e.out = phase_case_err(p->dtype, out, T, d, pad, ref, got);
            e.normed = epi ? phase_case_err(p->dtype, normed, T, d, pad, ref_n, got) : 0;
            /* The reference updated b_x to b + f where the add is fused. */
            e.partial = phase_case_err(p->dtype, b, T, d, pad, b_x, got);
        }
    }
    free(o1), free(b), free(f), free(out), free(normed), free(lse), free(q), free(go), free(o1_x), free(b_x);
    free(f_x), free(ref), free(ref_n), free(got), free(lse_x), free(q_x), free(go_x);
    return e;
}

#endif
