/*
 * ops_cuda_internal.h - what the CUDA cases of backend_ops share: the
 * device, the record of a run's first failure, device views (a [rows, d]
 * buffer with a padded stride, its upload, fetch and padding check), the
 * comparison with the reference, and one problem of a variant. ops_cuda.c
 * defines them and runs the sweep; ops_cuda_phase_backward.c holds the
 * phase backwards' cases, which the sweep calls.
 */
#ifndef ATTNRES_OPS_CUDA_INTERNAL_H
#define ATTNRES_OPS_CUDA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "attnres.h"
#include "device.h"

/* The device the cases run on: cuda:0, reopened after a fault (NULL when
 * that failed). */
extern attnres_device *cuda_dev;

/* A failure of one run: recorded with everything needed to diagnose it. */
typedef struct run_ctx {
    const char *variant, *arch;
    char why[2048]; /* first failure */
    int faulted;    /* the device needs reopening */
} run_ctx;

/* Records the first failure of a run; with device_error, the device's
 * message and the simulator's fault text are added and the device is to be
 * reopened. */
void fail_run(run_ctx *c, int device_error, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Launches k with the op's arguments; a failure is recorded in c as a
 * device error (the device is reopened after it). 0 on success. */
int be_launch(run_ctx *c, const ar_kernel *k, const attnres_problem *p, int64_t T, const ar_op_args *op);

/* Whether the reference refused the problem (status), recorded in c. */
int refused(run_ctx *c, int status);

/* Sets argument `field` and its stride to device view v. */
#define SET_VIEW(a, field, v) ((a).field = (v).dptr, (a).field##_stride = (v).stride)

/* A device buffer: a [rows, d] storage view with a padded stride. */
typedef struct view {
    attnres_dtype dt;
    size_t es;
    int64_t rows, d, stride;
    unsigned char *host; /* what was uploaded: rows * stride elements */
    double *x;           /* the rounded values as doubles, [rows][d] (inputs) */
    void *dptr;
} view;

/* random: rows of N(0,1) scaled by `magnitude` (0: 10^U(-1,1) per row), the
 * padding NaN; else every byte 0xff (NaN in every dtype), the poison. */
int view_make(run_ctx *c, view *v, attnres_dtype dt, size_t es, int64_t rows, int64_t d, int64_t stride, int random,
              uint64_t *s, double magnitude);

/* fp32 vector (query, gain) from doubles: x holds the values as stored. */
int vec_make(run_ctx *c, view *v, int64_t count, uint64_t *s, double mean, double sd);

void view_free(view *v);

/* Copies the view back; *got = its values [rows][d] as doubles. Checks the
 * padding between rows is what was uploaded. 0 on success. */
int view_fetch(run_ctx *c, const view *v, const char *name, double *got);

/* Compares got with want; records a failure when over tolerance or NaN. */
double compare(run_ctx *c, const char *name, const double *got, const double *want, int64_t count, double tol);

/* Fetches view v (named `fetched` if that fails) and folds its error
 * against want, under the name `name`, into *err; -1 when the fetch failed
 * (which fails the run). */
int fetch_compare(run_ctx *c, const view *v, const char *fetched, const char *name, double *got, const double *want,
                  int64_t count, double tol, double *err);

/* Copies a device buffer of `bytes` back into buf; 0 on success. */
int fetch_raw(run_ctx *c, const view *v, void *buf, size_t bytes, const char *name);

/* Padded stride: d plus `extra` loads of the kernel's alignment. */
static inline int64_t padded(int64_t d, int64_t align_elems, int extra) { return d + align_elems * extra; }

/* Phase 1's incoming gradients of lse in a phase-1 backward problem: none
 * (the array NULL), some sites without one (site 0, as a block's first,
 * and every third), or one for every site. */
enum { DLSE_NONE, DLSE_SOME, DLSE_ALL };

/* One problem, for one loaded kernel. */
typedef struct problem {
    attnres_problem p;
    int64_t T;
    int accumulate; /* the backwards: ATTNRES_GRAD_ACCUMULATE */
    int dsrc_f32;   /* mix_backward, phase1_backward: ATTNRES_GRAD_DSOURCES_F32 */
    int dnonly;     /* mix_backward, phase2_backward with the epilogue: dout NULL (a loss of normed alone) */
    int dlse;       /* phase1_backward: DLSE_* */
    int dsub;       /* phase2_backward: dsublayer given (left untouched without the fused add) */
    int nodgain;    /* phase2_backward with the epilogue: dout_gain NULL */
    int alias;      /* phase1_backward, accumulated: the last source's gradient the very view of the first's */
} problem;

/* The n sources of p: random [T, d] views with padded strides (each a
 * different padding), and their device pointers, strides and exact
 * values; -1 when one cannot be made (the run failed). */
int make_sources(run_ctx *c, const attnres_problem *p, int64_t T, int64_t ae, uint64_t *s, view *src,
                 const void **rows, int64_t *strides, const double **xs);

uint64_t problem_seed(const problem *pr);

/* The phase backwards' cases (ops_cuda_phase_backward.c) on a loaded
 * kernel, ae elements of the storage type to its alignment: the worst
 * relative error, or INFINITY with c->why set. */
double run_phase1_backward(run_ctx *c, const ar_kernel *k, const problem *pr, int64_t ae);
double run_phase2_backward(run_ctx *c, const ar_kernel *k, const problem *pr, int64_t ae);

#endif
