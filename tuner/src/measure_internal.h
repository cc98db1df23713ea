/*
 * measure_internal.h - the bench_case shared by measure.c (mix),
 * measure_phase.c (Block AttnRes phase 1 and phase 2), measure_backward.c
 * (the mix backward) and measure_phase_backward.c (the phases' backwards).
 */
#ifndef TUNER_MEASURE_INTERNAL_H
#define TUNER_MEASURE_INTERNAL_H

#include "measure.h"

struct bench_case {
    attnres_device *dev;
    attnres_problem p;
    int64_t t, tv; /* timed tokens, verified tokens */
    size_t es;
    /* device buffers: verification (tv tokens) and timing (t tokens) */
    void *v_src, *v_partial, *v_out, *v_normed;
    void *t_src, *t_partial, *t_out, *t_normed;
    float *query, *out_gain; /* device copies */
    const void **v_rows, **t_rows;
    double *ref_out, *ref_normed; /* host, tv tokens */
    float *host_out;
    attnres_mix_args v_args, t_args;
    /* phase1: S outputs and lse rows; phase2: lse input, sublayer, b copy */
    void **v_o1, **t_o1;
    float **v_lse, **t_lse;
    double *ref_lse, *ref_partial;
    void *v_lse_in, *t_lse_in, *v_sub, *t_sub;
    void *v_partial_init; /* host copy of b, restored before verification */
    attnres_phase1_args v_p1, t_p1;
    attnres_phase2_args v_p2, t_p2;
    /* mix_backward (measure_backward.c): gradients and workspaces of both
     * sets, the reference gradients, and whether the last verification
     * saw two runs differ. */
    void *v_dout, *t_dout, *v_dsrc, *t_dsrc, *v_dpartial, *t_dpartial, *v_ws, *t_ws;
    void **v_drows, **t_drows;
    float *v_dquery, *t_dquery, *v_dalpha, *t_dalpha;
    double *ref_dsrc, *ref_dquery, *ref_dpartial, ref_dalpha;
    double dalpha_scale; /* sum over tokens and elements of |dout| max_n |v_n|: bounds sum |dout mix| */
    size_t v_ws_size, t_ws_size;
    int nondeterministic;
    /* The worst error of the gradients that are fp32 sums over tokens
     * (dquery; dalpha against the size of its terms; the phases'
     * backwards' query gradients and dout_gain) or fp32 per token (phase
     * 2's dlse, sums_per_token set when it is the worst) and its name:
     * held to fp32's tolerance in every dtype (bench_case_judge). */
    double sums_err;
    const char *sums_name;
    int sums_per_token;
    /* What differed between the two runs: each gradient that did, with
     * how many of its values and the first of them ("" when none). */
    char difference[256];
    attnres_mix_backward_args v_bw, t_bw;
    /* The mix backward's epilogue: the forward's out and the gradient of
     * normed (inputs; the gain is out_gain above), the gain's gradient,
     * and its reference. */
    void *v_eout, *t_eout, *v_dnormed, *t_dnormed;
    float *v_dgout, *t_dgout;
    double *ref_dgout;
    /* The phases' backwards (measure_phase_backward.c), beside the mix
     * backward's fields above (sources and their gradients, dquery: phase
     * 1's S rows of d, the workspaces, dout, dnormed, dgout; phase 2's o1,
     * lse and b in v_src, v_lse_in and v_partial). Phase 1: every site's
     * do1 and dlse rows, one buffer each, and each site's pointer into
     * them. Phase 2: the gradients of o1, lse and (fuse_add) the sublayer
     * output, and the references of the first two. */
    void *v_site_do1, *t_site_do1;
    float *v_site_dlse, *t_site_dlse;
    const void **v_do1_ptrs, **t_do1_ptrs;
    const float **v_dlse_ptrs, **t_dlse_ptrs;
    void *v_do1, *t_do1, *v_dsub, *t_dsub;
    float *v_dlse, *t_dlse;
    double *ref_do1, *ref_dlse;
    attnres_phase1_backward_args v_p1b, t_p1b;
    attnres_phase2_backward_args v_p2b, t_p2b;
};

/* Random data helpers (splitmix64). */
uint64_t next_u64(uint64_t *s);
double uniform(uint64_t *s);
double normal(uint64_t *s);

/* Allocates bytes on the case's device and copies host data there (if
 * host is not NULL). */
int upload(bench_case *bc, const void *host, size_t bytes, void **dst);

/* Frees each of n host allocations; NULL ones are skipped, as free does. */
void free_each(void *const *ptrs, size_t n);

/* Frees each of the case's n device buffers that was allocated. */
void device_free_each(bench_case *bc, void *const *bufs, size_t n);

#define MEASURE_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Fills rows x d values (each row scaled by 10^U(-1,1) when vary_rows),
 * rounded through the dtype; the rounded values also go to exact. */
void random_rows(uint64_t *s, attnres_dtype dt, int64_t rows, int64_t d, float *f32, double *exact, int vary_rows);

/* ||device buffer - ref|| / ||ref|| over n elements of the case's dtype
 * (or fp32 when f32 is set); NaN when anything is NaN. */
int compare_n(bench_case *bc, const void *dev_buf, const double *ref, size_t n, int f32, double *err);

/* The phase operations (measure_phase.c). */
bench_case *bench_phase_create(bench_case *bc, const measure_policy *pol, uint64_t seed, char *err,
                               size_t err_len);
void bench_phase_free(bench_case *bc);
int bench_phase_verify(bench_case *bc, const ar_kernel *k, double *rel_err);

/* The mix backward (measure_backward.c). */
bench_case *bench_backward_create(bench_case *bc, uint64_t seed, char *err, size_t err_len);
void bench_backward_free(bench_case *bc);
int bench_backward_verify(bench_case *bc, const ar_kernel *k, double *rel_err);

/* The backwards of phase 1 and phase 2 (measure_phase_backward.c). */
bench_case *bench_phase_backward_create(bench_case *bc, uint64_t seed, char *err, size_t err_len);
void bench_phase_backward_free(bench_case *bc);
int bench_phase_backward_verify(bench_case *bc, const ar_kernel *k, double *rel_err);

#endif
