/*
 * backend_ops.h - the op x backend harness (backend_ops.c): what its
 * backend parts (ops_cpu.c, ops_cuda.c) share. Each part enumerates its
 * cases, asks the harness whether a case is selected before doing any work
 * for it, and reports each case's verdict; the harness filters, lists,
 * prints the command that reproduces a failed case and counts.
 */
#ifndef ATTNRES_BACKEND_OPS_H
#define ATTNRES_BACKEND_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "attnres.h"

/* One case: an op of one dtype, form and head count, run by one kernel
 * (a template variant's id, or "builtin-LEVEL" for the CPU's built-in
 * kernels at an ISA level), for one compile target (CUDA) and one problem
 * (its shape, the name). */
typedef struct bo_case {
    const char *backend, *op, *variant;
    const char *arch; /* the compile target, NULL where there is one */
    attnres_dtype dtype;
    int additive, heads;
    char name[96];
} bo_case;

/* What one case found: failed when an expectation did not hold, with the
 * figures of every one that did not. */
typedef struct bo_verdict {
    int failed;
    char text[2048];
} bo_verdict;

/* --sample (the fast tier's covering samples) rather than --all. */
extern int bo_sample;
/* --verbose: a line for every case that passes too. */
extern int bo_verbose;
/* --list: cases are printed, none is run. */
extern int bo_listing;

/* Whether the backend's, op's, dtype's and variant's cases may be selected
 * (the filters on those four), before the variant is compiled. */
int bo_variant_wanted(const char *backend, const char *op, attnres_dtype dt, const char *variant);
/* Whether the case runs: every filter matches and the harness is not
 * listing (then the case is printed instead). */
int bo_case_wanted(const bo_case *c);
/* Whether the backend's op (any op: NULL) may have cases selected. */
int bo_op_wanted(const char *backend, const char *op);
/* Whether no filter narrows the cases of a variant (--form, --heads,
 * --arch, --case): with every variant of a template wanted, checks on
 * totals over them then apply. */
int bo_case_filters_absent(void);

/* Names case c by its problem: "d128_n9_s3_h2_t7" (n, s left out where
 * 0), then "_fuse" and "_epi" where set, then extra ("" for none). */
void bo_name(bo_case *c, int64_t d, int n, int s, int64_t T, int fuse, int epi, const char *extra);

/* Adds the figures of a failed expectation to v (ok: nothing). */
void bo_expect(bo_verdict *v, int ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Reports the case: passed or failed, with the reproduce line. */
void bo_report(const bo_case *c, const bo_verdict *v);
/* A failure outside any case (a template that does not open, a count of
 * variants that is wrong): counted as a failed case. */
void bo_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Something that could not run here (a backend or level this host or build
 * lacks), with the reason: counted as skipped. */
void bo_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The backends' parts. */
void bo_cpu_variants(void);
void bo_cpu_builtins(void);
/* The CPU mix backward's cases (ops_cpu_backward.c): the host's built-in
 * kernel and the template's variants on device dev; the built-in kernel of
 * the level dev was opened at, named variant ("builtin-LEVEL"). */
void bo_cpu_mix_backward_variants(attnres_device *dev);
void bo_cpu_mix_backward_builtins(attnres_device *dev, const char *variant);
/* The same for the backwards of Block AttnRes' two phases
 * (ops_cpu_phase_backward.c: ops "phase1_backward" and "phase2_backward"). */
void bo_cpu_phase_backward_variants(attnres_device *dev);
void bo_cpu_phase_backward_builtins(attnres_device *dev, const char *variant);
/* Plans p without a database on the level's device (ops_cpu.c), and adds to
 * v whether the plan is the built-in kernel the fallback chain must give;
 * NULL (v failed) when no plan was made. */
attnres_plan *bo_cpu_plan_builtin(const attnres_problem *p, bo_verdict *v);
void bo_cuda(void);

#endif
