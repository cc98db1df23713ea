/*
 * ops_cuda.c - the CUDA backend's cases of backend_ops: every variant of
 * every template under cuda/ (those `attnres gen --list` lists:
 * mix_online, mix_twopass, phase1, phase2, and the backwards mix_backward,
 * phase1_backward and phase2_backward; of each backward a covering sample
 * under --sample, every value of every parameter once, and every variant
 * under --all) runs and matches the reference. The phase backwards' cases
 * are in ops_cuda_phase_backward.c, and what the cases share in
 * ops_cuda_internal.h.
 *
 * For each variant this part picks at least two problems its applies()
 * accepts - N = 1, a d below the variant's bound, T not a multiple of its
 * tokens per block, H > 1 where the variant allows it, the additive form,
 * the fused add and the epilogue - compiles the emitted source with NVRTC
 * to PTX (sm_90 for all problems, sm_80 for the first), loads it through
 * the CUDA backend's own `load` operation with the variant's launch data
 * (as the tuner does), launches it through the backend on random inputs
 * with the outputs poisoned (NaN) and padded strides, copies the results
 * back and compares them with the fp64 reference (runtime/src/reference.c,
 * computed from the rounded inputs): ||got - ref|| / ||ref|| at most 1e-5
 * for fp32 storage, 1e-2 for bf16 and f16 (DESIGN §1). The bytes between
 * rows (stride padding) of every output must come back untouched, inputs
 * are never written, and source padding holds NaN so a read past a row
 * shows. Any launch error or fault fails the case, with the simulator's
 * fault text; the device is then reopened (faults are sticky).
 *
 * The mix backward runs twice per problem (gradients reset, workspace
 * poisoned): every gradient against attnres_reference_mix_backward at the
 * same tolerances, the two runs bit-identical, dquery exactly 0 for N = 1,
 * and its PTX free of atom. and red. instructions. Two of its problems have
 * the output-norm epilogue, one with dout and one without (a loss of
 * normed alone): there the reference's dout is the gradient of out
 * composed in fp64 from the rounded out the kernel reads, d(out_gain) is
 * checked too, and a launch with T = 0 must write zero sums.
 *
 * The phase backwards' problems likewise run twice and are checked against
 * attnres_reference_phase1_backward / _phase2_backward (every gradient,
 * bit-identical runs, the PTX free of atomics): phase 1 with N = 1 (the
 * query gradients of a site without a dlse exactly 0), H > 1, S > 1 and
 * not a multiple of the variant's sites per tile, no dlse, some and all,
 * written and accumulated source gradients in the storage type and in
 * fp32, two of them one view; phase 2 with H = 1 and more heads than
 * warps, the fused add with and without dsublayer (and dsublayer given
 * without it, left untouched), the epilogue with dout and without, with
 * and without d(out_gain); T = 0 writing zero sums every time.
 *
 * Under ctest the device is the simulated driver (ATTNRES_CUDA_DRIVER names
 * libattnres-cudasim.so); on a GPU host without that variable it is the
 * real GPU. Skipped when NVRTC cannot be loaded, or when no CUDA device is
 * present and ATTNRES_CUDA_DRIVER is unset. Compiles on two threads while
 * the main thread runs what is compiled.
 *
 * ATTNRES_VARIANTS_PTX_DIR=D, for diagnosis, writes each PTX compiled to
 * D/<id>.<arch>.ptx.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "argen.h"
#include "attnres.h"
#include "backend_ops.h"
#include "device.h"
#include "nvrtc.h"
#include "rmsnorm_backward.h"
#include "test_compare.h"
#include "test_covering.h"
#include "test_data.h"
#include "test_cuda_open.h"
#include "test_jobs.h"
#include "ops_cuda_internal.h"

#ifndef ATTNRES_TEMPLATE_DIR
#define ATTNRES_TEMPLATE_DIR "templates"
#endif

#define MAX_PROBLEMS 6
#define COMPILE_THREADS 2

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *template_dir(void)
{
    const char *env = getenv("ATTNRES_TEMPLATE_DIR");
    return env && *env ? env : ATTNRES_TEMPLATE_DIR;
}


/* ------------------------------------------------------------------------
 * The device, and the backend calls (one small wrapper each, so a change of
 * the backend's interface is a one-place edit)
 * ---------------------------------------------------------------------- */

attnres_device *cuda_dev;
static int (*sim_last_fault)(char *, size_t);
static const char *(*sim_describe)(void);
static int device_reopens;

static int open_device(char *msg, size_t len)
{
    int rc = attnres_device_open("cuda:0", &cuda_dev, msg, len);
    if (rc != ATTNRES_OK)
        cuda_dev = NULL;
    return rc;
}

/* A fault is sticky: the context is unusable until it is released by every
 * holder and retained anew, which closing and reopening the device does. */
static void reopen_device(void)
{
    char msg[512];
    attnres_device_close(cuda_dev);
    cuda_dev = NULL;
    device_reopens++;
    if (open_device(msg, sizeof msg) != ATTNRES_OK)
        fprintf(stderr, "FATAL: cuda:0 could not be reopened after a fault: %s\n", msg);
}

static int be_load(const void *blob, size_t size, const char *kernel, const char *json, ar_kernel *k)
{
    memset(k, 0, sizeof *k);
    return cuda_dev->ops->load(cuda_dev, blob, size, NULL, kernel, json, k);
}

static void be_unload(ar_kernel *k) { cuda_dev->ops->unload(cuda_dev, k); }

/* The simulator's description of the last fault, when it is one. */
static void fault_text(char *buf, size_t len)
{
    buf[0] = 0;
    if (sim_last_fault && sim_last_fault(buf, len) == 0)
        buf[0] = 0;
}

/* ------------------------------------------------------------------------
 * A failure of one run: recorded with everything needed to diagnose it
 * ---------------------------------------------------------------------- */

void fail_run(run_ctx *c, int device_error, const char *fmt, ...)
{
    if (c->why[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if (device_error) {
        c->faulted = 1;
        size_t used = strlen(c->why);
        snprintf(c->why + used, sizeof c->why - used, ": %s",
                 cuda_dev ? attnres_device_errmsg(cuda_dev) : "(no device)");
        char ft[1024];
        fault_text(ft, sizeof ft);
        used = strlen(c->why);
        if (ft[0] && !strstr(c->why, ft))
            snprintf(c->why + used, sizeof c->why - used, " [simulator: %s]", ft);
    }
}

int be_launch(run_ctx *c, const ar_kernel *k, const attnres_problem *p, int64_t T, const ar_op_args *op)
{
    if (cuda_dev->ops->launch(cuda_dev, k, p, T, op, NULL) == ATTNRES_OK)
        return 0;
    fail_run(c, 1, "launch");
    return -1;
}

int refused(run_ctx *c, int status)
{
    if (status == ATTNRES_OK)
        return 0;
    fail_run(c, 0, "the reference refused the problem");
    return 1;
}

/* Sets the inputs that a mix and its backward share: the sources, the
 * query and the scale 0.9 and eps 1e-5 the references are given. */
#define SET_INPUTS(a, rows, strides, query_view)                                                           \
    ((a).sources = (rows), (a).source_strides = (strides), (a).query = (query_view).dptr, (a).scale = 0.9f, \
     (a).eps = 1e-5f)

/* Sets the outputs that a mix and a phase 2 share (their argument structs
 * name them alike): out, and with the epilogue its gain and normed. */
#define SET_OUTPUTS(a, out_view, gain_view, normed_view, epi)                                                  \
    ((a).out = (out_view).dptr, (a).out_stride = (out_view).stride, (a).out_gain = (epi) ? (gain_view).dptr : NULL, \
     (a).out_eps = 1e-5f, (a).normed = (epi) ? (normed_view).dptr : NULL,                                          \
     (a).normed_stride = (epi) ? (normed_view).stride : 0)

/* ------------------------------------------------------------------------
 * Device buffers: a [rows, d] storage view with a padded stride
 * ---------------------------------------------------------------------- */

int view_make(run_ctx *c, view *v, attnres_dtype dt, size_t es, int64_t rows, int64_t d, int64_t stride, int random,
              uint64_t *s, double magnitude)
{
    memset(v, 0, sizeof *v);
    v->dt = dt;
    v->es = es;
    v->rows = rows;
    v->d = d;
    v->stride = stride;
    size_t bytes = (size_t)(rows * stride) * es;
    v->host = malloc(bytes ? bytes : 1);
    v->x = malloc(sizeof(double) * (rows * d > 0 ? (size_t)(rows * d) : 1));
    if (!v->host || !v->x) {
        fail_run(c, 0, "out of host memory");
        return -1;
    }
    memset(v->host, 0xff, bytes); /* NaN in every storage type */
    if (random)
        fill_rows(s, dt, v->host, rows, d, stride, magnitude, v->x);
    if (cuda_dev->ops->mem_alloc(cuda_dev, bytes, &v->dptr) != ATTNRES_OK) {
        fail_run(c, 1, "allocating %zu bytes", bytes);
        v->dptr = NULL;
        return -1;
    }
    if (cuda_dev->ops->copy_to_device(cuda_dev, v->dptr, v->host, bytes) != ATTNRES_OK) {
        fail_run(c, 1, "uploading %zu bytes", bytes);
        return -1;
    }
    return 0;
}

int vec_make(run_ctx *c, view *v, int64_t count, uint64_t *s, double mean, double sd)
{
    memset(v, 0, sizeof *v);
    v->dt = ATTNRES_DTYPE_F32;
    v->es = 4;
    v->rows = 1;
    v->d = v->stride = count;
    v->host = malloc((size_t)count * 4);
    v->x = malloc(sizeof(double) * (size_t)count);
    if (!v->host || !v->x) {
        fail_run(c, 0, "out of host memory");
        return -1;
    }
    for (int64_t k = 0; k < count; k++) {
        ((float *)v->host)[k] = (float)(mean + sd * rng_normal(s));
        v->x[k] = ((float *)v->host)[k];
    }
    if (cuda_dev->ops->mem_alloc(cuda_dev, (size_t)count * 4, &v->dptr) != ATTNRES_OK) {
        fail_run(c, 1, "allocating a vector");
        v->dptr = NULL;
        return -1;
    }
    if (cuda_dev->ops->copy_to_device(cuda_dev, v->dptr, v->host, (size_t)count * 4) != ATTNRES_OK) {
        fail_run(c, 1, "uploading a vector");
        return -1;
    }
    return 0;
}

void view_free(view *v)
{
    if (v->dptr && cuda_dev)
        cuda_dev->ops->mem_free(cuda_dev, v->dptr);
    free(v->host);
    free(v->x);
    memset(v, 0, sizeof *v);
}

int view_fetch(run_ctx *c, const view *v, const char *name, double *got)
{
    size_t bytes = (size_t)(v->rows * v->stride) * v->es;
    unsigned char *buf = malloc(bytes ? bytes : 1);
    if (!buf) {
        fail_run(c, 0, "out of host memory");
        return -1;
    }
    if (cuda_dev->ops->copy_to_host(cuda_dev, buf, v->dptr, bytes) != ATTNRES_OK) {
        fail_run(c, 1, "copying %s back", name);
        free(buf);
        return -1;
    }
    int rc = 0;
    for (int64_t r = 0; r < v->rows && rc == 0; r++) {
        for (int64_t k = 0; k < v->d; k++)
            got[r * v->d + k] = elem_load(v->dt, buf, r * v->stride + k);
        size_t off = (size_t)(r * v->stride + v->d) * v->es, pad = (size_t)(v->stride - v->d) * v->es;
        if (pad && memcmp(buf + off, v->host + off, pad) != 0) {
            fail_run(c, 0, "%s: the padding after row %lld was written (a store outside the row)", name,
                     (long long)r);
            rc = -1;
        }
    }
    free(buf);
    return rc;
}

double compare(run_ctx *c, const char *name, const double *got, const double *want, int64_t count, double tol)
{
    double e = case_rel_err(got, want, count);
    if (!(e <= tol)) {
        int64_t worst = -1;
        double we = -1;
        for (int64_t i = 0; i < count; i++) {
            double d = isnan(got[i]) ? INFINITY : fabs(got[i] - want[i]);
            if (d > we) {
                we = d;
                worst = i;
            }
        }
        int64_t nan = 0;
        for (int64_t i = 0; i < count; i++)
            nan += isnan(got[i]) != 0;
        fail_run(c, 0,
                 "%s: relative error %.3g over %.0e (%lld of %lld values NaN; worst at %lld: got %.6g, want %.6g)",
                 name, e, tol, (long long)nan, (long long)count, (long long)worst,
                 worst >= 0 ? got[worst] : 0.0, worst >= 0 ? want[worst] : 0.0);
    }
    return e;
}

int fetch_compare(run_ctx *c, const view *v, const char *fetched, const char *name, double *got, const double *want,
                  int64_t count, double tol, double *err)
{
    if (view_fetch(c, v, fetched, got))
        return -1;
    *err = fmax(*err, compare(c, name, got, want, count, tol));
    return 0;
}

/* The outputs of a mix or a phase 2: out, and normed with the epilogue,
 * each against its reference. */
static int fetch_outputs(run_ctx *c, const view *out, const view *normed, int epi, double *got, const double *ref,
                         const double *refn, int64_t count, double tol, double *err)
{
    return fetch_compare(c, out, "out", "out", got, ref, count, tol, err) ||
           (epi && fetch_compare(c, normed, "normed", "normed", got, refn, count, tol, err));
}

/* ------------------------------------------------------------------------
 * One problem, for one loaded kernel
 * ---------------------------------------------------------------------- */

int make_sources(run_ctx *c, const attnres_problem *p, int64_t T, int64_t ae, uint64_t *s, view *src,
                 const void **rows, int64_t *strides, const double **xs)
{
    const size_t es = attnres_dtype_size(p->dtype);
    for (int i = 0; i < p->n; i++) {
        if (view_make(c, &src[i], p->dtype, es, T, p->d, padded(p->d, ae, 1 + i % 3), 1, s, 0))
            return -1;
        rows[i] = src[i].dptr;
        strides[i] = src[i].stride;
        xs[i] = src[i].x;
    }
    return 0;
}

uint64_t problem_seed(const problem *pr)
{
    const attnres_problem *p = &pr->p;
    return 0x5eedull ^ ((uint64_t)p->op << 56) ^ ((uint64_t)p->dtype << 52) ^ ((uint64_t)p->d << 20) ^
           ((uint64_t)p->n << 12) ^ ((uint64_t)p->heads << 4) ^ (uint64_t)pr->T ^ ((uint64_t)p->s << 40) ^
           ((uint64_t)p->form << 48) ^ ((uint64_t)p->epilogue << 49) ^ ((uint64_t)p->fuse_add << 50) ^
           ((uint64_t)pr->accumulate << 51) ^ ((uint64_t)pr->dsrc_f32 << 53) ^ ((uint64_t)pr->dnonly << 54) ^
           ((uint64_t)pr->dlse << 60) ^ ((uint64_t)pr->dsub << 62) ^ ((uint64_t)pr->nodgain << 63);
}

/* Runs mix on the loaded kernel; returns the worst relative error (NaN or
 * INFINITY on failure, with c->why set). */
static double run_mix(run_ctx *c, const ar_kernel *k, const problem *pr, int64_t ae)
{
    const attnres_problem *p = &pr->p;
    const int64_t T = pr->T, d = p->d;
    const int n = p->n;
    const size_t es = attnres_dtype_size(p->dtype);
    uint64_t s = problem_seed(pr);
    const int additive = p->form == ATTNRES_FORM_ADDITIVE, epi = p->epilogue;
    view src[64], q, g, part, out, normed;
    memset(src, 0, sizeof src);
    memset(&q, 0, sizeof q), memset(&g, 0, sizeof g), memset(&part, 0, sizeof part);
    memset(&out, 0, sizeof out), memset(&normed, 0, sizeof normed);
    double *ref = malloc(sizeof(double) * (size_t)(T * d)), *refn = malloc(sizeof(double) * (size_t)(T * d));
    double *got = malloc(sizeof(double) * (size_t)(T * d));
    const void *rows[64];
    int64_t strides[64];
    const double *xs[64];
    double err = INFINITY;
    if (!ref || !refn || !got) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    if (make_sources(c, p, T, ae, &s, src, rows, strides, xs))
        goto done;
    if (vec_make(c, &q, d, &s, 0.0, 3.0 / sqrt((double)d)) || vec_make(c, &g, d, &s, 1.0, 0.1))
        goto done;
    if (additive && view_make(c, &part, p->dtype, es, T, d, padded(d, ae, 2), 1, &s, 1.0))
        goto done;
    if (view_make(c, &out, p->dtype, es, T, d, padded(d, ae, 1), 0, &s, 0))
        goto done;
    if (epi && view_make(c, &normed, p->dtype, es, T, d, padded(d, ae, 3), 0, &s, 0))
        goto done;
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    SET_INPUTS(a, rows, strides, q);
    a.partial = additive ? part.dptr : NULL;
    a.partial_stride = additive ? part.stride : 0;
    a.alpha = 0.75f;
    SET_OUTPUTS(a, out, g, normed, epi);
    const ar_op_args op = ar_op_mix(&a);
    if (be_launch(c, k, p, T, &op) ||
        refused(c, attnres_reference_mix(p, T, xs, q.x, 0.9, 1e-5, additive ? part.x : NULL, 0.75, g.x, 1e-5, ref,
                                         refn)))
        goto done;
    err = 0;
    if (fetch_outputs(c, &out, &normed, epi, got, ref, refn, T * d, case_tolerance(p->dtype), &err))
        goto done;
    /* Inputs are never written (the padding check covers the rest). */
    if (additive)
        fetch_compare(c, &part, "partial", "partial (an input)", got, part.x, T * d, 0.0, &err);
    if (n > 0)
        fetch_compare(c, &src[n - 1], "the last source", "the last source (an input)", got, src[n - 1].x, T * d,
                      0.0, &err);
done:
    for (int i = 0; i < n; i++)
        view_free(&src[i]);
    view_free(&q), view_free(&g), view_free(&part), view_free(&out), view_free(&normed);
    free(ref), free(refn), free(got);
    return c->why[0] ? INFINITY : err;
}

int fetch_raw(run_ctx *c, const view *v, void *buf, size_t bytes, const char *name)
{
    if (cuda_dev->ops->copy_to_host(cuda_dev, buf, v->dptr, bytes) != ATTNRES_OK) {
        fail_run(c, 1, "copying %s back", name);
        return -1;
    }
    return 0;
}

/* The output-norm epilogue's inputs of a mix backward: out_gain, dnormed,
 * and the forward's out rounded to the storage type (as the caller keeps
 * it; the reference mix of the same sources, with zeros for partial, whose
 * value enters no gradient). From the rounded out it composes in fp64 the
 * gradient of out the kernel should use, xdo = dout (0 when dnonly) + the
 * RMSNorm backward of dnormed, and the reference d(out_gain), refg, as
 * tests/lib/test_mix_backward_case.h does for the CPU: a bf16 out's
 * rounding then does not blur the comparison. 0, or -1 (c->why set). */
static int make_epilogue(run_ctx *c, const attnres_problem *fwd, int64_t T, int64_t ae, uint64_t *s,
                         const double *const *xs, const view *q, const double *zeros, const view *dout, int dnonly,
                         view *gain, view *dn, view *outv, view *dg, double *xdo, double *refg)
{
    const int64_t d = fwd->d;
    const attnres_dtype dt = fwd->dtype;
    const size_t es = attnres_dtype_size(dt);
    if (vec_make(c, gain, d, s, 1.0, 0.25) || view_make(c, dn, dt, es, T, d, padded(d, ae, 1), 1, s, 1.0) ||
        view_make(c, outv, dt, es, T, d, padded(d, ae, 3), 0, s, 0) ||
        view_make(c, dg, ATTNRES_DTYPE_F32, 4, 1, d, d, 0, s, 0))
        return -1;
    if (refused(c, attnres_reference_mix(fwd, T, xs, q->x, 0.9, 1e-5, fwd->form == ATTNRES_FORM_ADDITIVE ? zeros : NULL,
                                         0.75, NULL, 1e-5, outv->x, NULL)))
        return -1;
    const double eps = (double)1e-5f; /* out_eps as the kernel gets it */
    memset(refg, 0, sizeof(double) * (size_t)d);
    for (int64_t t = 0; t < T; t++) {
        double *o = outv->x + t * d;
        for (int64_t k = 0; k < d; k++) {
            elem_store(dt, outv->host, t * outv->stride + k, o[k]);
            o[k] = elem_load(dt, outv->host, t * outv->stride + k);
            xdo[t * d + k] = dnonly ? 0.0 : dout->x[t * d + k];
        }
        ar_rmsnorm_backward(o, dn->x + t * d, gain->x, eps, d, xdo + t * d, refg);
    }
    if (cuda_dev->ops->copy_to_device(cuda_dev, outv->dptr, outv->host, (size_t)(T * outv->stride) * es) !=
        ATTNRES_OK) {
        fail_run(c, 1, "uploading out");
        return -1;
    }
    return 0;
}

/* Runs the mix backward (both entries) twice on the same inputs, the
 * workspace poisoned (NaN) before each run and the per-token gradients
 * reset to their initial values (poison, or random values when they are
 * accumulated into); checks every gradient against the fp64 reference
 * (with the epilogue, d(out_gain) too, and the reference's dout is the
 * composed gradient of out of make_epilogue) and that the two runs agree
 * bit for bit. Returns the worst relative error (INFINITY on failure, with
 * c->why set). */
static double run_mix_backward(run_ctx *c, const ar_kernel *k, const problem *pr, int64_t ae)
{
    const attnres_problem *p = &pr->p;
    const int64_t T = pr->T, d = p->d;
    const int n = p->n, additive = p->form == ATTNRES_FORM_ADDITIVE, acc = pr->accumulate;
    const int epi = p->epilogue, dnonly = epi && pr->dnonly;
    const size_t es = attnres_dtype_size(p->dtype);
    /* The source gradients' type and element size: fp32 with the flag. */
    const attnres_dtype gdt = pr->dsrc_f32 ? ATTNRES_DTYPE_F32 : p->dtype;
    const size_t ges = attnres_dtype_size(gdt);
    const unsigned flags = (acc ? ATTNRES_GRAD_ACCUMULATE : 0) | (pr->dsrc_f32 ? ATTNRES_GRAD_DSOURCES_F32 : 0);
    uint64_t s = problem_seed(pr);
    view src[64], dsrc[64], q, dout, dpart, dq, da, ws, gain, dn, outv, dg;
    memset(src, 0, sizeof src), memset(dsrc, 0, sizeof dsrc);
    memset(&q, 0, sizeof q), memset(&dout, 0, sizeof dout), memset(&dpart, 0, sizeof dpart);
    memset(&dq, 0, sizeof dq), memset(&da, 0, sizeof da), memset(&ws, 0, sizeof ws);
    memset(&gain, 0, sizeof gain), memset(&dn, 0, sizeof dn), memset(&outv, 0, sizeof outv), memset(&dg, 0, sizeof dg);
    const size_t td = (size_t)(T * d);
    double *ref = malloc(sizeof(double) * (td * (size_t)n + 1)), *refq = malloc(sizeof(double) * (size_t)d);
    double *refp = malloc(sizeof(double) * (td + 1)), *got = malloc(sizeof(double) * (td + 1));
    double *zeros = calloc(td + 1, sizeof(double));
    /* The epilogue's composed gradient of out and reference d(out_gain). */
    double *xdo = malloc(sizeof(double) * (td + 1)), *refg = malloc(sizeof(double) * (size_t)d);
    double refa = 0, err = INFINITY;
    const void *rows[64];
    void *drows[64];
    int64_t strides[64], dstrides[64];
    const double *xs[64];
    double *rs[64];
    unsigned char *first = NULL, *second = NULL;
    size_t ws_size = 0, total = 0;
    ar_backward_ws layout;
    if (!ref || !refq || !refp || !got || !zeros || !xdo || !refg ||
        ar_mix_backward_workspace(d, T, epi, &layout) != 0) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    ws_size = layout.bytes;
    for (int i = 0; i < n; i++) {
        if (view_make(c, &src[i], p->dtype, es, T, d, padded(d, ae, 1 + i % 3), 1, &s, 0) ||
            view_make(c, &dsrc[i], gdt, ges, T, d, padded(d, ae, 1 + (i + 1) % 3), acc, &s, 1.0))
            goto done;
        rows[i] = src[i].dptr, strides[i] = src[i].stride, xs[i] = src[i].x;
        drows[i] = dsrc[i].dptr, dstrides[i] = dsrc[i].stride;
        rs[i] = ref + (size_t)i * td;
        if (acc)
            memcpy(rs[i], dsrc[i].x, sizeof(double) * td);
        total += (size_t)(T * dsrc[i].stride) * ges;
    }
    if (vec_make(c, &q, d, &s, 0.0, 3.0 / sqrt((double)d)) ||
        view_make(c, &dout, p->dtype, es, T, d, padded(d, ae, 2), 1, &s, 1.0) ||
        view_make(c, &dq, ATTNRES_DTYPE_F32, 4, 1, d, d, 0, &s, 0) ||
        view_make(c, &da, ATTNRES_DTYPE_F32, 4, 1, 1, 1, 0, &s, 0) ||
        view_make(c, &ws, ATTNRES_DTYPE_F32, 4, 1, (int64_t)(ws_size / 4), (int64_t)(ws_size / 4), 0, &s, 0))
        goto done;
    if (additive) {
        if (view_make(c, &dpart, p->dtype, es, T, d, padded(d, ae, 3), acc, &s, 1.0))
            goto done;
        if (acc)
            memcpy(refp, dpart.x, sizeof(double) * td);
        total += (size_t)(T * dpart.stride) * es;
    }
    total += (size_t)d * 4 + 4 + (epi ? (size_t)d * 4 : 0);
    first = calloc(1, total), second = calloc(1, total); /* dalpha's slot stays 0 when unused */
    if (!first || !second) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    attnres_problem fwd = *p;
    fwd.op = ATTNRES_OP_MIX;
    fwd.epilogue = 0;
    char msg[256];
    if (epi && make_epilogue(c, &fwd, T, ae, &s, xs, &q, zeros, &dout, dnonly, &gain, &dn, &outv, &dg, xdo, refg))
        goto done;
    /* The gradient of out the kernel works from: dout, or the epilogue's. */
    const double *xgo = epi ? xdo : dout.x;
    /* partial's value enters no gradient: zeros stand in for it. */
    if (attnres_reference_mix_backward(&fwd, T, xs, q.x, 0.9, 1e-5, additive ? zeros : NULL, 0.75, NULL, 1e-5,
                                       xgo, NULL, flags, rs, refq,
                                       additive ? refp : NULL, additive ? &refa : NULL, NULL, msg,
                                       sizeof msg) != ATTNRES_OK) {
        fail_run(c, 0, "the reference refused the problem: %s", msg);
        goto done;
    }
    attnres_mix_backward_args a;
    attnres_mix_backward_args_init(&a);
    SET_INPUTS(a, rows, strides, q);
    a.alpha = 0.75f;
    a.dout = dnonly ? NULL : dout.dptr;
    a.dout_stride = dnonly ? 0 : dout.stride;
    a.flags = flags;
    a.dsources = drows;
    a.dsource_strides = dstrides;
    a.dquery = dq.dptr;
    a.dpartial = additive ? dpart.dptr : NULL;
    a.dpartial_stride = additive ? dpart.stride : 0;
    a.dalpha = additive ? da.dptr : NULL;
    a.workspace = ws.dptr;
    a.workspace_size = ws_size;
    if (epi) {
        SET_VIEW(a, out, outv);
        a.out_gain = gain.dptr;
        a.out_eps = 1e-5f;
        SET_VIEW(a, dnormed, dn);
        a.dout_gain = dg.dptr;
    }
    for (int run = 0; run < 2; run++) {
        unsigned char *out = run ? second : first;
        size_t at = 0;
        /* The initial gradients and a poisoned workspace, before each run. */
        for (int i = 0; i < n; i++)
            if (cuda_dev->ops->copy_to_device(cuda_dev, dsrc[i].dptr, dsrc[i].host,
                                              (size_t)(T * dsrc[i].stride) * ges)) {
                fail_run(c, 1, "resetting a gradient");
                goto done;
            }
        if ((additive &&
             cuda_dev->ops->copy_to_device(cuda_dev, dpart.dptr, dpart.host, (size_t)(T * dpart.stride) * es)) ||
            cuda_dev->ops->copy_to_device(cuda_dev, ws.dptr, ws.host, ws_size) ||
            cuda_dev->ops->copy_to_device(cuda_dev, dq.dptr, dq.host, (size_t)d * 4) ||
            (epi && cuda_dev->ops->copy_to_device(cuda_dev, dg.dptr, dg.host, (size_t)d * 4))) {
            fail_run(c, 1, "resetting the outputs");
            goto done;
        }
        const ar_op_args op = ar_op_mix_backward(&a);
        if (be_launch(c, k, p, T, &op))
            goto done;
        for (int i = 0; i < n; i++) {
            const size_t b = (size_t)(T * dsrc[i].stride) * ges;
            if (fetch_raw(c, &dsrc[i], out + at, b, "a source gradient"))
                goto done;
            at += b;
        }
        if (additive) {
            const size_t b = (size_t)(T * dpart.stride) * es;
            if (fetch_raw(c, &dpart, out + at, b, "dpartial"))
                goto done;
            at += b;
        }
        if (fetch_raw(c, &dq, out + at, (size_t)d * 4, "dquery") ||
            (additive && fetch_raw(c, &da, out + at + (size_t)d * 4, 4, "dalpha")) ||
            (epi && fetch_raw(c, &dg, out + at + (size_t)d * 4 + 4, (size_t)d * 4, "dout_gain")))
            goto done;
    }
    /* dquery, dalpha and dout_gain are fp32 sums of fp32 products of the
     * inputs as stored, never rounded to the storage type: fp32's tolerance
     * in every dtype, dalpha's against the size of its terms. */
    const double tol = case_tolerance(p->dtype), ftol = case_tolerance(ATTNRES_DTYPE_F32);
    err = 0;
    for (int i = 0; i < n && !c->why[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "dsources[%d]", i);
        /* fp32 gradients are never rounded to the storage type. */
        if (view_fetch(c, &dsrc[i], name, got) == 0)
            err = fmax(err, compare(c, name, got, rs[i], T * d, case_tolerance(gdt)));
    }
    if (additive && !c->why[0] && view_fetch(c, &dpart, "dpartial", got) == 0)
        err = fmax(err, compare(c, "dpartial", got, refp, T * d, tol));
    if (!c->why[0] && view_fetch(c, &dq, "dquery", got) == 0) {
        if (n == 1) {
            /* N = 1: the score gradient is exactly zero, and so is dquery. */
            for (int64_t kk = 0; kk < d; kk++)
                if (got[kk] != 0.0) {
                    fail_run(c, 0, "N = 1: dquery[%lld] = %g, not exactly 0", (long long)kk, got[kk]);
                    break;
                }
        } else {
            err = fmax(err, compare(c, "dquery", got, refq, d, ftol));
        }
    }
    if (epi && !c->why[0] && view_fetch(c, &dg, "dout_gain", got) == 0)
        err = fmax(err, compare(c, "dout_gain", got, refg, d, ftol));
    if (additive && !c->why[0] && view_fetch(c, &da, "dalpha", got) == 0) {
        const double e = fabs(got[0] - refa) / case_dalpha_terms(xs, n, xgo, T * d);
        if (!(e <= ftol))
            fail_run(c, 0, "dalpha %.9g, reference %.9g: %.3g of its terms' size, over %.0e", got[0], refa, e, ftol);
        err = fmax(err, e);
    }
    if (!c->why[0] && memcmp(first, second, total) != 0)
        fail_run(c, 0, "two runs on the same inputs gave different gradients (not deterministic)");
    /* T = 0 with the epilogue: the sums over no tokens write zeros over
     * the results above, d(out_gain)'s too. */
    if (epi && !c->why[0]) {
        const ar_op_args op = ar_op_mix_backward(&a);
        const view *sums[2] = {&dq, &dg};
        const int launched = be_launch(c, k, p, 0, &op) == 0;
        for (int w = 0; w < 2 && launched && !c->why[0]; w++)
            if (view_fetch(c, sums[w], w ? "dout_gain" : "dquery", got) == 0)
                for (int64_t kk = 0; kk < d; kk++)
                    if (got[kk] != 0.0) {
                        fail_run(c, 0, "T = 0: %s[%lld] = %g, not 0", w ? "dout_gain" : "dquery", (long long)kk,
                                 got[kk]);
                        break;
                    }
    }
    /* Inputs are never written. */
    if (!c->why[0] && view_fetch(c, &src[n - 1], "the last source", got) == 0)
        err = fmax(err, compare(c, "the last source (an input)", got, src[n - 1].x, T * d, 0.0));
    if (epi && !c->why[0] && view_fetch(c, &dn, "dnormed", got) == 0)
        err = fmax(err, compare(c, "dnormed (an input)", got, dn.x, T * d, 0.0));
done:
    for (int i = 0; i < n; i++)
        view_free(&src[i]), view_free(&dsrc[i]);
    view_free(&q), view_free(&dout), view_free(&dpart), view_free(&dq), view_free(&da), view_free(&ws);
    view_free(&gain), view_free(&dn), view_free(&outv), view_free(&dg);
    free(ref), free(refq), free(refp), free(got), free(zeros), free(first), free(second), free(xdo), free(refg);
    return c->why[0] ? INFINITY : err;
}

/* Whether the PTX has an atomic or reduction instruction (atom., red.,
 * optionally predicated): the backwards' sums must not. */
static int ptx_has_atomics(const char *ptx, size_t size)
{
    const char *p = ptx, *end = ptx + size;
    while (p < end) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            eol = end;
        const char *w = p;
        while (w < eol && (*w == ' ' || *w == '\t'))
            w++;
        if (w < eol && *w == '@') { /* a guard predicate: @%p1 or @!%p1 */
            while (w < eol && *w != ' ' && *w != '\t')
                w++;
            while (w < eol && (*w == ' ' || *w == '\t'))
                w++;
        }
        const size_t len = (size_t)(eol - w);
        if ((len >= 5 && memcmp(w, "atom.", 5) == 0) || (len >= 4 && memcmp(w, "red.", 4) == 0))
            return 1;
        p = eol + 1;
    }
    return 0;
}

static double run_phase1(run_ctx *c, const ar_kernel *k, const problem *pr, int64_t ae)
{
    const attnres_problem *p = &pr->p;
    const int64_t T = pr->T, d = p->d;
    const int n = p->n, S = p->s, H = p->heads;
    const size_t es = attnres_dtype_size(p->dtype);
    uint64_t s = problem_seed(pr);
    view src[64], o1[64], lse[64], q;
    memset(src, 0, sizeof src), memset(o1, 0, sizeof o1), memset(lse, 0, sizeof lse), memset(&q, 0, sizeof q);
    double *ref_o = malloc(sizeof(double) * (size_t)(S * T * d)), *ref_l = malloc(sizeof(double) * (size_t)(S * T * H));
    double *got_o = malloc(sizeof(double) * (size_t)(S * T * d)), *got_l = malloc(sizeof(double) * (size_t)(S * T * H));
    const void *rows[64];
    int64_t strides[64];
    const double *xs[64];
    void *o1p[64];
    float *lsep[64];
    double err = INFINITY;
    if (!ref_o || !ref_l || !got_o || !got_l) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    if (make_sources(c, p, T, ae, &s, src, rows, strides, xs))
        goto done;
    if (vec_make(c, &q, (int64_t)S * d, &s, 0.0, 3.0 / sqrt((double)d)))
        goto done;
    for (int j = 0; j < S; j++) {
        if (view_make(c, &o1[j], p->dtype, es, T, d, padded(d, ae, 2), 0, &s, 0) ||
            view_make(c, &lse[j], ATTNRES_DTYPE_F32, 4, T, H, H + 1, 0, &s, 0))
            goto done;
        o1p[j] = o1[j].dptr;
        lsep[j] = lse[j].dptr;
    }
    attnres_phase1_args a;
    attnres_phase1_args_init(&a);
    a.sources = rows;
    a.source_strides = strides;
    a.queries = q.dptr;
    a.scale = 0.9f;
    a.eps = 1e-5f;
    a.o1 = o1p;
    a.o1_stride = o1[0].stride;
    a.lse = lsep;
    a.lse_stride = lse[0].stride;
    const ar_op_args op = ar_op_phase1(&a);
    if (be_launch(c, k, p, T, &op) || refused(c, attnres_reference_phase1(p, T, xs, q.x, 0.9, 1e-5, ref_o, ref_l)))
        goto done;
    for (int j = 0; j < S; j++) {
        char name[64];
        snprintf(name, sizeof name, "o1 of site %d", j);
        if (view_fetch(c, &o1[j], name, got_o + (int64_t)j * T * d))
            goto done;
        snprintf(name, sizeof name, "lse of site %d", j);
        if (view_fetch(c, &lse[j], name, got_l + (int64_t)j * T * H))
            goto done;
    }
    err = fmax(compare(c, "o1", got_o, ref_o, S * T * d, case_tolerance(p->dtype)),
               compare(c, "lse", got_l, ref_l, S * T * H, case_tolerance(p->dtype)));
done:
    for (int i = 0; i < n; i++)
        view_free(&src[i]);
    for (int j = 0; j < S; j++)
        view_free(&o1[j]), view_free(&lse[j]);
    view_free(&q);
    free(ref_o), free(ref_l), free(got_o), free(got_l);
    return c->why[0] ? INFINITY : err;
}

static double run_phase2(run_ctx *c, const ar_kernel *k, const problem *pr, int64_t ae)
{
    const attnres_problem *p = &pr->p;
    const int64_t T = pr->T, d = p->d, H = p->heads;
    const size_t es = attnres_dtype_size(p->dtype);
    const int fuse = p->fuse_add, epi = p->epilogue;
    uint64_t s = problem_seed(pr);
    view o1, lse, b, f, q, g, out, normed;
    memset(&o1, 0, sizeof o1), memset(&lse, 0, sizeof lse), memset(&b, 0, sizeof b), memset(&f, 0, sizeof f);
    memset(&q, 0, sizeof q), memset(&g, 0, sizeof g), memset(&out, 0, sizeof out), memset(&normed, 0, sizeof normed);
    const size_t row = sizeof(double) * (size_t)(T * d);
    double *ref = malloc(row), *refn = malloc(row), *got = malloc(row), *bx = malloc(row);
    double err = INFINITY;
    if (!ref || !refn || !got || !bx) {
        fail_run(c, 0, "out of host memory");
        goto done;
    }
    if (view_make(c, &o1, p->dtype, es, T, d, padded(d, ae, 1), 1, &s, 0) ||
        view_make(c, &b, p->dtype, es, T, d, padded(d, ae, 2), 1, &s, 0) ||
        (fuse && view_make(c, &f, p->dtype, es, T, d, padded(d, ae, 3), 1, &s, 0)))
        goto done;
    /* lse: fp32 [T, H] with stride H + 2, values around the scores' size. */
    if (view_make(c, &lse, ATTNRES_DTYPE_F32, 4, T, H, H + 2, 0, &s, 0))
        goto done;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            float v = (float)(2.0 * rng_normal(&s) + 1.5);
            ((float *)lse.host)[t * lse.stride + h] = v;
            lse.x[t * H + h] = v;
        }
    if (cuda_dev->ops->copy_to_device(cuda_dev, lse.dptr, lse.host, (size_t)(T * lse.stride) * 4) != ATTNRES_OK) {
        fail_run(c, 1, "uploading lse");
        goto done;
    }
    if (vec_make(c, &q, d, &s, 0.0, 3.0 / sqrt((double)d)) || vec_make(c, &g, d, &s, 1.0, 0.1))
        goto done;
    if (view_make(c, &out, p->dtype, es, T, d, padded(d, ae, 1), 0, &s, 0) ||
        (epi && view_make(c, &normed, p->dtype, es, T, d, padded(d, ae, 2), 0, &s, 0)))
        goto done;
    attnres_phase2_args a;
    attnres_phase2_args_init(&a);
    /* f is all zeros (no pointer, no stride) where the add is not fused. */
    SET_VIEW(a, o1, o1), SET_VIEW(a, lse, lse), SET_VIEW(a, partial, b), SET_VIEW(a, sublayer, f);
    a.query = q.dptr;
    a.scale = 1.1f;
    a.eps = 1e-5f;
    SET_OUTPUTS(a, out, g, normed, epi);
    const ar_op_args op = ar_op_phase2(&a);
    if (be_launch(c, k, p, T, &op))
        goto done;
    memcpy(bx, b.x, row); /* the reference updates b in place when fused */
    if (refused(c, attnres_reference_phase2(p, T, o1.x, lse.x, bx, fuse ? f.x : NULL, q.x, 1.1, 1e-5, g.x, 1e-5, ref,
                                            refn)))
        goto done;
    err = 0;
    if (fetch_outputs(c, &out, &normed, epi, got, ref, refn, T * d, case_tolerance(p->dtype), &err))
        goto done;
    /* The partial: b + f when the add is fused, untouched otherwise. */
    fetch_compare(c, &b, "partial", fuse ? "partial (b + f, written back)" : "partial (an input here)", got, bx,
                  T * d, fuse ? case_tolerance(p->dtype) : 0.0, &err);
done:
    view_free(&o1), view_free(&lse), view_free(&b), view_free(&f);
    view_free(&q), view_free(&g), view_free(&out), view_free(&normed);
    free(ref), free(refn), free(got), free(bx);
    return c->why[0] ? INFINITY : err;
}

/* ------------------------------------------------------------------------
 * Variants and the problems chosen for them
 * ---------------------------------------------------------------------- */

/* The ops by number (attnres_op), as templates name them. */
#define NOPS 6
static const char *const op_names[NOPS] = {"mix",          "phase1",          "phase2",
                                           "mix_backward", "phase1_backward", "phase2_backward"};

/* Whether op is a backward: its sums a pass of their own, without atomics. */
static int is_backward(int op)
{
    return op == ATTNRES_OP_MIX_BACKWARD || op == ATTNRES_OP_PHASE1_BACKWARD || op == ATTNRES_OP_PHASE2_BACKWARD;
}

typedef struct variant {
    argen *g;
    int op;
    char *id, *source, *kernel, *json;
    attnres_dtype dt;
    int special; /* 1 default, 2 generic */
    int failed;
    problem prob[MAX_PROBLEMS];
    int nprob;
} variant;

/* "key":"value" of a flat JSON object, into buf ("" when absent). */
static void json_str(const char *json, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    buf[0] = 0;
    const char *p = json ? strstr(json, pat) : NULL;
    if (!p)
        return;
    p += strlen(pat);
    size_t i = 0;
    while (p[i] && p[i] != '"' && i + 1 < len) {
        buf[i] = p[i];
        i++;
    }
    buf[i] = 0;
}

static argen_device gen_device(void)
{
    argen_device d = {.backend = "cuda", .arch = cuda_dev->arch, .units = cuda_dev->units};
    return d;
}

/* Adds the problem if the variant's applies() accepts it; 1 if added, 0 if
 * refused (why set), -1 on a template error. */
static int try_problem(variant *v, attnres_op op, int64_t d, int n, int heads, int s, int64_t T, int additive,
                       int fuse, int epi, char *why, size_t why_len)
{
    if (v->nprob >= MAX_PROBLEMS)
        return 0;
    problem pr;
    attnres_problem_init(&pr.p, v->dt, d, n);
    pr.p.op = op;
    pr.p.heads = heads;
    pr.p.s = op == ATTNRES_OP_PHASE1 || op == ATTNRES_OP_PHASE1_BACKWARD ? s : 0;
    pr.p.form = additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    pr.p.fuse_add = fuse;
    pr.p.epilogue = epi;
    pr.T = T;
    pr.accumulate = pr.dsrc_f32 = pr.dnonly = pr.dsub = pr.nodgain = pr.alias = 0;
    /* Phase 1's backward: every site with a dlse unless a role says (0,
     * DLSE_NONE, elsewhere: the other ops' seeds stay as they were). */
    pr.dlse = op == ATTNRES_OP_PHASE1_BACKWARD ? DLSE_ALL : DLSE_NONE;
    argen_problem ap = {.op = op_names[op], .dtype = attnres_dtype_name(v->dt),
                        .form = additive ? "additive" : "replace", .d = d, .t = T, .n = n, .heads = heads,
                        .epilogue = epi, .s = pr.p.s};
    argen_device ad = gen_device();
    char msg[256];
    if (attnres_problem_check(&pr.p, msg, sizeof msg) != ATTNRES_OK) {
        snprintf(why, why_len, "not a valid problem: %.200s", msg);
        return 0;
    }
    int ok = argen_applies(v->g, v->id, &ap, &ad, why, why_len);
    if (ok == 1)
        v->prob[v->nprob++] = pr;
    return ok;
}

/* Chooses the problems of one variant. Each role lists candidates in order
 * of preference; the first one applies() accepts is taken. 0 on success,
 * -1 with a message when a role has no accepted candidate. */
static int choose_problems(variant *v, char *err, size_t err_len)
{
    const char *j = v->json;
    const int threads = (int)ar_json_int(j, "threads", ar_json_int(j, "block", 0));
    const int vec = (int)ar_json_int(j, "vec", 1);
    const int tpb = (int)ar_json_int(j, "tokens_per_block", 1);
    const int64_t dmax = ar_json_int(j, "dmax", 0);
    /* Sources per step: an online variant's batch, a two-pass one's unroll. */
    const int batch = (int)ar_json_int(j, "batch", ar_json_int(j, "unroll", 1));
    const int sj = (int)ar_json_int(j, "sj", 1);
    const int warps = threads / 32 > 0 ? threads / 32 : 1;
    char map[16], why[256] = "";
    json_str(j, "map", map, sizeof map);
    const int G = strcmp(map, "warp") == 0 ? 32 : threads;
    /* T: never a multiple of the tokens per block (when that exceeds 1). */
    const int64_t T1 = tpb > 1 ? tpb + 1 : 3, T2 = tpb > 1 ? 2 * tpb + tpb / 2 + 1 : 2, T3 = 1;
    struct { const char *role; int got; } roles[MAX_PROBLEMS] = {{NULL, 0}};
    int nroles = 0, r;

#define ROLE(name) (roles[nroles].role = (name), roles[nroles].got = 0, nroles++)
#define TRY(...)                                                                                  \
    do {                                                                                          \
        if (!roles[nroles - 1].got) {                                                             \
            r = try_problem(v, __VA_ARGS__, why, sizeof why);                                     \
            if (r < 0) {                                                                          \
                snprintf(err, err_len, "applies() failed: %s", why);                              \
                return -1;                                                                        \
            }                                                                                     \
            roles[nroles - 1].got = r;                                                            \
        }                                                                                         \
    } while (0)
/* Sets a field of the problem the role just took, if it took one. */
#define SET_LAST(field, value)                            \
    do {                                                  \
        if (roles[nroles - 1].got)                        \
            v->prob[v->nprob - 1].field = (value);        \
    } while (0)

    if (v->op == ATTNRES_OP_MIX && dmax > 0) {
        /* Online schedules: dmax/2 < d <= dmax, H dividing the threads of a token. */
        ROLE("N = 1, d below the bound");
        TRY(ATTNRES_OP_MIX, dmax - vec, 1, 1, 0, T1, 0, 0, 0);
        TRY(ATTNRES_OP_MIX, dmax - 2 * vec, 1, 1, 0, T1, 0, 0, 0);
        ROLE("H > 1, N over a batch, additive, epilogue");
        for (int h = 4; h >= 2 && !roles[nroles - 1].got; h /= 2)
            TRY(ATTNRES_OP_MIX, dmax - (int64_t)h * vec, 2 * batch + 1, h, 0, T2, 1, 0, 1);
        ROLE("d at the bound, heads narrower than a warp, T = 1");
        for (int h = G / 8; h >= 2 && !roles[nroles - 1].got; h /= 2)
            TRY(ATTNRES_OP_MIX, dmax, 3 * batch, h, 0, T3, 0, 0, 1);
        TRY(ATTNRES_OP_MIX, dmax, 3 * batch, 1, 0, T3, 0, 0, 1);
    } else if (v->op == ATTNRES_OP_MIX) {
        /* twopass: any d, any H (tiles of 16 heads), N up to 64. */
        ROLE("N = 1, small d");
        TRY(ATTNRES_OP_MIX, 37 * vec, 1, 1, 0, T1, 0, 0, 0);
        ROLE("H > 16 (two head tiles), additive, epilogue");
        TRY(ATTNRES_OP_MIX, 20 * 3 * vec, 2 * batch + 1, 20, 0, T1, 1, 0, 1);
        ROLE("N = 64, H = 4, T = 2");
        TRY(ATTNRES_OP_MIX, 4 * 40 * vec, 64, 4, 0, 2, 0, 0, 1);
    } else if (v->op == ATTNRES_OP_PHASE1) {
        ROLE("n = 1, S = 1, small d");
        TRY(ATTNRES_OP_PHASE1, 37 * vec, 1, 1, 1, T1, 0, 0, 0);
        ROLE("H = 3, S not a multiple of the site block");
        TRY(ATTNRES_OP_PHASE1, 3 * 11 * vec, 5, 3, 2 * sj + 1, 2, 0, 0, 0);
        ROLE("more heads than warps, S = site block");
        TRY(ATTNRES_OP_PHASE1, (int64_t)(warps + 1) * 40 * vec, 9, warps + 1, sj, 2, 0, 0, 0);
    } else if (v->op == ATTNRES_OP_PHASE2) {
        ROLE("H = 1, small d");
        TRY(ATTNRES_OP_PHASE2, 37 * vec, 1, 1, 0, T1, 0, 0, 0);
        ROLE("more heads than warps, fused add, epilogue");
        TRY(ATTNRES_OP_PHASE2, (int64_t)(warps + 3) * 2 * vec, 1, warps + 3, 0, 2, 0, 1, 1);
        ROLE("H = 3 (leftover warps), epilogue");
        TRY(ATTNRES_OP_PHASE2, 3 * 70 * vec, 1, 3, 0, 2, 0, 0, 1);
    } else if (v->op == ATTNRES_OP_MIX_BACKWARD) {
        /* One block per group of 32 tokens: T over two groups, the last
         * one short, and T = 1. */
        ROLE("N = 1 (dquery exactly 0), small d, T = 1");
        TRY(ATTNRES_OP_MIX_BACKWARD, 37 * vec, 1, 1, 0, 1, 0, 0, 0);
        ROLE("H = 3, N over the unroll, additive, accumulated, three groups");
        TRY(ATTNRES_OP_MIX_BACKWARD, 3 * 11 * vec, 2 * batch + 1, 3, 0, 2 * 32 + 5, 1, 0, 0);
        if (roles[nroles - 1].got)
            v->prob[v->nprob - 1].accumulate = 1;
        ROLE("more heads than warps, two groups, fp32 source gradients accumulated");
        TRY(ATTNRES_OP_MIX_BACKWARD, (int64_t)(warps + 1) * 2 * vec, 4, warps + 1, 0, 33, 0, 0, 0);
        if (roles[nroles - 1].got)
            v->prob[v->nprob - 1].accumulate = v->prob[v->nprob - 1].dsrc_f32 = 1;
        ROLE("fp32 source gradients written, small d, epilogue");
        TRY(ATTNRES_OP_MIX_BACKWARD, 37 * vec, 2, 1, 0, 2, 0, 0, 1);
        if (roles[nroles - 1].got)
            v->prob[v->nprob - 1].dsrc_f32 = 1;
        ROLE("epilogue with dout NULL, additive, H = 2, two groups");
        TRY(ATTNRES_OP_MIX_BACKWARD, 2 * 13 * vec, 3, 2, 0, 33, 1, 0, 1);
        if (roles[nroles - 1].got)
            v->prob[v->nprob - 1].dnonly = 1;
    } else if (v->op == ATTNRES_OP_PHASE1_BACKWARD) {
        /* One block per group of 32 tokens; sweep 1 takes tiles of (head,
         * 4 sources, sj sites) a warp each. d <= 256 keeps the simulator's
         * cost small. */
        ROLE("N = 1, S = 2, site 0 without a dlse (its dqueries exactly 0), T = 1");
        TRY(ATTNRES_OP_PHASE1_BACKWARD, 29 * vec, 1, 1, 2, 1, 0, 0, 0);
        SET_LAST(dlse, DLSE_SOME);
        ROLE("H = 3, N = 5 and S = 2 sj + 1 (more tiles than warps, short ones), some dlse, accumulated with two "
             "gradients one view, three groups");
        TRY(ATTNRES_OP_PHASE1_BACKWARD, 3 * 10 * vec, 5, 3, 2 * sj + 1, 2 * 32 + 5, 0, 0, 0);
        SET_LAST(dlse, DLSE_SOME);
        SET_LAST(accumulate, 1);
        SET_LAST(alias, 1);
        ROLE("H = 2, N = 4, S = sj, every dlse, fp32 source gradients accumulated, two groups");
        TRY(ATTNRES_OP_PHASE1_BACKWARD, 2 * 12 * vec, 4, 2, sj, 33, 0, 0, 0);
        SET_LAST(accumulate, 1);
        SET_LAST(dsrc_f32, 1);
        /* Over a group and a part: at two tokens one token's p1 - p2
         * cancelling in fp32 (the terms 40 times its size) takes dqueries
         * past 1e-5 in any fp32 implementation. */
        ROLE("fp32 source gradients written, no dlse, N = 2, S = 1, T = 37");
        TRY(ATTNRES_OP_PHASE1_BACKWARD, 29 * vec, 2, 1, 1, 37, 0, 0, 0);
        SET_LAST(dlse, DLSE_NONE);
        SET_LAST(dsrc_f32, 1);
        /* The one wide row: every thread takes a second chunk of it. */
        ROLE("d over the block's width (a thread's second chunk), N = 2, S = 1, T = 7");
        TRY(ATTNRES_OP_PHASE1_BACKWARD, (int64_t)(warps * 32 + 5) * vec, 2, 1, 1, 7, 0, 0, 0);
    } else if (v->op == ATTNRES_OP_PHASE2_BACKWARD) {
        /* Heads split over the warps (several warps a head when fewer, one
         * warp a head in turns when more); without the epilogue dout_gain
         * is passed all the same and must stay untouched. */
        /* Three tokens: one token's dlse alone, a sum over d that may
         * cancel, would sit near fp32's 1e-5 in any implementation. */
        ROLE("H = 1, small d, T = 3");
        TRY(ATTNRES_OP_PHASE2_BACKWARD, 29 * vec, 1, 1, 0, 3, 0, 0, 0);
        ROLE("H = 3, fused add with dsublayer, accumulated, three groups");
        TRY(ATTNRES_OP_PHASE2_BACKWARD, 3 * 10 * vec, 1, 3, 0, 2 * 32 + 5, 0, 1, 0);
        SET_LAST(dsub, 1);
        SET_LAST(accumulate, 1);
        ROLE("more heads than warps, epilogue, fused add without dsublayer, two groups");
        TRY(ATTNRES_OP_PHASE2_BACKWARD, (int64_t)(warps + 3) * (vec > 1 ? vec : 3), 1, warps + 3, 0, 33, 0, 1, 1);
        ROLE("epilogue with dout NULL and dout_gain NULL, accumulated, dsublayer given without the fused add, H = 2");
        TRY(ATTNRES_OP_PHASE2_BACKWARD, 2 * 13 * vec, 1, 2, 0, 40, 0, 0, 1);
        SET_LAST(dnonly, 1);
        SET_LAST(nodgain, 1);
        SET_LAST(accumulate, 1);
        SET_LAST(dsub, 1);
        ROLE("epilogue, H = 1, fused add with dsublayer, T = 70");
        TRY(ATTNRES_OP_PHASE2_BACKWARD, 32 * vec, 1, 1, 0, 70, 0, 1, 1);
        SET_LAST(dsub, 1);
        ROLE("d over the block's width (a thread's second chunk), epilogue, T = 7");
        TRY(ATTNRES_OP_PHASE2_BACKWARD, (int64_t)(warps * 32 + 5) * vec, 1, 1, 0, 7, 0, 0, 1);
    } else {
        snprintf(err, err_len, "unknown op %d", v->op);
        return -1;
    }
#undef SET_LAST
#undef TRY
#undef ROLE
    for (int i = 0; i < nroles; i++)
        if (!roles[i].got) {
            snprintf(err, err_len, "no problem for role \"%s\" is accepted by applies(): %s", roles[i].role, why);
            return -1;
        }
    return 0;
}

/* ------------------------------------------------------------------------
 * Compiling: two worker threads ahead of the main thread, which runs
 * ---------------------------------------------------------------------- */

typedef struct job {
    variant *v;
    const char *arch;
    int sel[MAX_PROBLEMS]; /* the problems selected: all for sm_90, the first for sm_80 */
    int nsel;
    int rc;
    void *blob;
    size_t size;
    char err[1024];
    double seconds;
} job;

static job *jobs;
static size_t njobs;

/* Compiles job i on a worker thread of the pool (test_jobs.h). */
static void compile_job(size_t i)
{
    job *jb = &jobs[i];
    char name[200];
    snprintf(name, sizeof name, "%s.cu", jb->v->id);
    double t0 = now_s();
    char *log = NULL;
    int rc = ar_nvrtc_compile(jb->v->source, name, jb->arch, 0, &jb->blob, &jb->size, &log, NULL, jb->err,
                              sizeof jb->err);
    if (rc != ATTNRES_OK && log) {
        size_t used = strlen(jb->err);
        snprintf(jb->err + used, sizeof jb->err - used, "\n%s", log);
    }
    free(log);
    const char *dir = getenv("ATTNRES_VARIANTS_PTX_DIR");
    if (rc == ATTNRES_OK && dir && *dir) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s.%s.ptx", dir, jb->v->id, jb->arch);
        FILE *f = fopen(path, "w");
        if (f) {
            fwrite(jb->blob, 1, jb->size > 0 ? jb->size - 1 : 0, f);
            fclose(f);
        }
    }
    jb->rc = rc;
    jb->seconds = now_s() - t0;
}

/* ------------------------------------------------------------------------
 * The cases: a variant's problems for one compile target
 * ---------------------------------------------------------------------- */

/* The case of problem pr of variant v compiled for arch; the phase 1
 * backward's name says which sites have a dlse ("_nodlse", "_somedlse" or
 * "_dlse"). */
static void cuda_case(const variant *v, const problem *pr, const char *arch, bo_case *c)
{
    const attnres_problem *p = &pr->p;
    *c = (bo_case){.backend = "cuda", .op = op_names[v->op], .variant = v->id, .arch = arch, .dtype = v->dt,
                   .additive = p->form == ATTNRES_FORM_ADDITIVE, .heads = p->heads};
    static const char *const dlse[] = {"_nodlse", "_somedlse", "_dlse"};
    const int phase1 = p->op == ATTNRES_OP_PHASE1 || p->op == ATTNRES_OP_PHASE1_BACKWARD;
    const int phase2 = p->op == ATTNRES_OP_PHASE2 || p->op == ATTNRES_OP_PHASE2_BACKWARD;
    char extra[64];
    snprintf(extra, sizeof extra, "%s%s%s%s%s%s%s", p->op == ATTNRES_OP_PHASE1_BACKWARD ? dlse[pr->dlse] : "",
             pr->dnonly ? "_dnonly" : "", pr->dsub ? "_dsub" : "", pr->nodgain ? "_nodgain" : "",
             pr->accumulate ? "_acc" : "", pr->dsrc_f32 ? "_f32grads" : "", pr->alias ? "_alias" : "");
    bo_name(c, p->d, phase2 ? 0 : p->n, phase1 ? p->s : 0, pr->T, p->fuse_add, p->epilogue, extra);
}

/* Fails every selected case of job jb with the same reason; returns how
 * many. */
static int fail_job(const job *jb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail_job(const job *jb, const char *fmt, ...)
{
    bo_verdict v = {.failed = 1};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v.text, sizeof v.text, fmt, ap);
    va_end(ap);
    for (int i = 0; i < jb->nsel; i++) {
        bo_case c;
        cuda_case(jb->v, &jb->v->prob[jb->sel[i]], jb->arch, &c);
        bo_report(&c, &v);
    }
    return jb->nsel;
}

/* ------------------------------------------------------------------------
 * The sweep
 * ---------------------------------------------------------------------- */

typedef struct sweep {
    variant *vs;
    size_t nv;
    argen *gens[16];
    int ngens;
} sweep;

/* The variants of template `name` (op) wanted, emitted, with their
 * problems, appended to sw; per_op counts them. */
static void collect_template(sweep *sw, size_t *cap, const char *name, int per_op[NOPS])
{
    argen *g = NULL;
    char msg[2048];
    if (argen_open(template_dir(), name, &g, msg, sizeof msg) != 0) {
        bo_fail("template %s: %s", name, msg);
        return;
    }
    if (sw->ngens == 16) {
        bo_fail("template %s: more than 16 CUDA templates", name);
        argen_close(g);
        return;
    }
    sw->gens[sw->ngens++] = g;
    const char *opname = argen_op(g);
    int op = -1;
    for (int o = 0; o < NOPS; o++)
        if (strcmp(opname, op_names[o]) == 0)
            op = o;
    if (op < 0) {
        bo_fail("template %s: op %s is not one this harness knows", name, opname);
        return;
    }
    if (!bo_op_wanted("cuda", opname))
        return;
    argen_variant *list = NULL;
    size_t count = 0;
    if (argen_enumerate(g, &list, &count) != 0 || count == 0) {
        bo_fail("template %s: no variants (%s)", name, argen_errmsg(g));
        return;
    }
    /* The backwards' covering samples (every value of every parameter
     * once) under --sample; every other template's variants all. */
    int *pick = NULL;
    if (is_backward(op) && bo_sample) {
        const char **json = calloc(count, sizeof *json);
        pick = calloc(count, sizeof *pick);
        for (size_t i = 0; json && pick && i < count; i++)
            json[i] = list[i].params_json;
        if (!json || !pick || covering_sample(json, NULL, count, pick) == 0) {
            bo_fail("template %s: no covering sample (out of memory)", name);
            free(pick);
            pick = NULL;
            count = 0;
        }
        free(json);
    }
    char *generic[3] = {NULL, NULL, NULL};
    static const char *const dts[] = {"f32", "bf16", "f16"};
    for (int d = 0; d < 3; d++)
        if (argen_generic(g, dts[d], &generic[d]) != 0)
            generic[d] = NULL;
    int every_id = 1, added = 0;
    for (size_t i = 0; i < count; i++) {
        if (pick && !pick[i])
            continue;
        if (*cap == sw->nv) {
            *cap = *cap ? 2 * *cap : 512;
            variant *grown = realloc(sw->vs, *cap * sizeof *sw->vs);
            if (!grown) {
                bo_fail("out of memory for the variants");
                break;
            }
            sw->vs = grown;
        }
        variant *v = &sw->vs[sw->nv];
        memset(v, 0, sizeof *v);
        v->g = g;
        v->op = op;
        v->id = strdup(list[i].id);
        if (argen_emit(g, v->id, &v->source, &v->kernel, &v->json) != 0) {
            bo_fail("%s: emit: %s", v->id, argen_errmsg(g));
            free(v->id);
            continue;
        }
        char dt[16], err[1024];
        json_str(v->json, "dtype", dt, sizeof dt);
        const int known = attnres_dtype_parse(dt, &v->dt) == ATTNRES_OK;
        if (known && !bo_variant_wanted("cuda", opname, v->dt, v->id)) {
            every_id = 0;
        } else if (!known) {
            bo_fail("%s: params have no known dtype (%s)", v->id, v->json);
        } else if (choose_problems(v, err, sizeof err) != 0) {
            bo_fail("%s: %s", v->id, err);
        } else if (v->nprob < 2) {
            bo_fail("%s: only %d problem(s) accepted", v->id, v->nprob);
        } else {
            v->special = ar_json_int(v->json, "default", 0) == 1;
            for (int d = 0; d < 3; d++)
                if (generic[d] && strcmp(generic[d], v->id) == 0)
                    v->special = 2;
            per_op[op]++;
            added++;
            sw->nv++;
            continue;
        }
        free(v->id), free(v->source), free(v->kernel), free(v->json);
    }
    if (every_id && added == 0)
        bo_fail("template %s: no variant to run", name);
    free(pick);
    for (int d = 0; d < 3; d++)
        free(generic[d]);
    argen_variants_free(list, count);
}

/* The jobs: every variant for sm_90 with all its problems, and for sm_80
 * (whose PTX NVRTC emits differently) on its first problem; only those
 * with a selected case. */
static void make_jobs(sweep *sw)
{
    static const char *const archs[] = {"sm_90", "sm_80"};
    jobs = calloc(2 * sw->nv + 1, sizeof *jobs);
    njobs = 0;
    if (!jobs) {
        bo_fail("out of memory for the jobs");
        return;
    }
    for (size_t i = 0; i < sw->nv; i++)
        for (int a = 0; a < 2; a++) {
            job *jb = &jobs[njobs];
            *jb = (job){.v = &sw->vs[i], .arch = archs[a]};
            for (int pi = 0; pi < (a == 0 ? sw->vs[i].nprob : 1); pi++) {
                bo_case c;
                cuda_case(jb->v, &jb->v->prob[pi], jb->arch, &c);
                if (bo_case_wanted(&c))
                    jb->sel[jb->nsel++] = pi;
            }
            if (jb->nsel)
                njobs++;
        }
}

typedef struct slow { const char *id, *arch; double s; } slow;

static void run_jobs(void)
{
    job_pool pool;
    job_pool_start(&pool, njobs, COMPILE_THREADS, compile_job);
    double t_start = now_s(), compile_s = 0, run_s = 0, load_s = 0, worst_err[3] = {0, 0, 0};
    int runs = 0, failed_runs = 0, failed_variants = 0;
    enum { NSLOW = 5 };
    slow slowest[NSLOW];
    memset(slowest, 0, sizeof slowest);
    for (size_t ji = 0; ji < njobs; ji++) {
        job *jb = &jobs[ji];
        variant *v = jb->v;
        job_pool_wait(&pool, ji);
        compile_s += jb->seconds;
        int variant_failed = 1;
        if (jb->rc != ATTNRES_OK) {
            failed_runs += fail_job(jb, "NVRTC: %s", jb->err);
            goto next;
        }
        if (!cuda_dev) {
            failed_runs += fail_job(jb, "no device");
            goto next;
        }
        if (is_backward(v->op) && ptx_has_atomics(jb->blob, jb->size)) {
            failed_runs += fail_job(jb, "its PTX has an atom. or red. instruction");
            goto next;
        }
        double t0 = now_s();
        ar_kernel k;
        if (be_load(jb->blob, jb->size, v->kernel, v->json, &k) != ATTNRES_OK) {
            char ft[1024];
            fault_text(ft, sizeof ft);
            failed_runs += fail_job(jb, "the backend's load: %s%s%s", attnres_device_errmsg(cuda_dev),
                                    ft[0] ? "; simulator: " : "", ft);
            goto next;
        }
        variant_failed = 0;
        double t1 = now_s();
        load_s += t1 - t0;
        const int64_t align = ar_json_int(v->json, "align", 16);
        const int64_t es = (int64_t)attnres_dtype_size(v->dt);
        const int64_t ae = align > es ? align / es : 1;
        for (int si = 0; si < jb->nsel; si++) {
            const problem *pr = &v->prob[jb->sel[si]];
            run_ctx c;
            memset(&c, 0, sizeof c);
            c.variant = v->id;
            c.arch = jb->arch;
            bo_case bc;
            cuda_case(v, pr, jb->arch, &bc);
            double r0 = now_s(), e;
            switch (v->op) {
            case ATTNRES_OP_MIX: e = run_mix(&c, &k, pr, ae); break;
            case ATTNRES_OP_PHASE1: e = run_phase1(&c, &k, pr, ae); break;
            case ATTNRES_OP_MIX_BACKWARD: e = run_mix_backward(&c, &k, pr, ae); break;
            case ATTNRES_OP_PHASE1_BACKWARD: e = run_phase1_backward(&c, &k, pr, ae); break;
            case ATTNRES_OP_PHASE2_BACKWARD: e = run_phase2_backward(&c, &k, pr, ae); break;
            default: e = run_phase2(&c, &k, pr, ae); break;
            }
            const double rs = now_s() - r0;
            runs++;
            bo_verdict verdict = {0};
            bo_expect(&verdict, !c.why[0], "%s", c.why);
            bo_report(&bc, &verdict);
            if (c.why[0]) {
                failed_runs++;
                variant_failed = 1;
                if (c.faulted) {
                    be_unload(&k);
                    reopen_device();
                    if (!cuda_dev)
                        goto next;
                    if (be_load(jb->blob, jb->size, v->kernel, v->json, &k) != ATTNRES_OK) {
                        bo_fail("%s [%s]: reload after the fault: %s", v->id, jb->arch,
                                attnres_device_errmsg(cuda_dev));
                        goto next;
                    }
                }
            } else if (e > worst_err[v->dt]) {
                worst_err[v->dt] = e;
            }
            if (bo_verbose)
                printf("     %s [%s] %s: err %.2e, %.3f s\n", v->id, jb->arch, bc.name, e, rs);
        }
        be_unload(&k);
        {
            double vs_s = now_s() - t1;
            run_s += vs_s;
            for (int si = 0; si < NSLOW; si++)
                if (vs_s > slowest[si].s) {
                    memmove(&slowest[si + 1], &slowest[si], (NSLOW - 1 - si) * sizeof slowest[0]);
                    slowest[si] = (slow){v->id, jb->arch, vs_s};
                    break;
                }
        }
    next:
        if (variant_failed && !v->failed) {
            failed_variants++;
            v->failed = 1;
        }
        free(jb->blob);
        jb->blob = NULL;
    }
    const int compile_threads = job_pool_finish(&pool);
    printf("cuda: ran %d problem(s) on %zu compiled kernel(s): %d failed, %d variant(s) wrong or faulting; "
           "device reopened %d time(s)\n",
           runs, njobs, failed_runs, failed_variants, device_reopens);
    printf("cuda: worst relative error of the runs that passed: f32 %.2e (tolerance 1e-5), bf16 %.2e, "
           "f16 %.2e (tolerance 1e-2)\n",
           worst_err[0], worst_err[1], worst_err[2]);
    printf("cuda: %.1f s to run (budget: 300 s on 2 cores); NVRTC %.1f s over %d thread(s), loads %.1f s, "
           "runs %.1f s\n",
           now_s() - t_start, compile_s, compile_threads, load_s, run_s);
    printf("cuda: slowest kernels to run:");
    for (int si = 0; si < NSLOW && slowest[si].id; si++)
        printf(" %s [%s] %.2f s;", slowest[si].id, slowest[si].arch, slowest[si].s);
    printf("\n");
    if (sim_last_fault && failed_runs == 0) {
        char ft[1024];
        fault_text(ft, sizeof ft);
        if (ft[0])
            bo_fail("cuda: a fault nobody reported: %s", ft);
    }
}

void bo_cuda(void)
{
    char why[512], msg[512] = "";
    /* Listing needs no NVRTC, only the device that applies() asks about. */
    if (!bo_listing && ar_nvrtc_available(why, sizeof why) != 0) {
        bo_skip("cuda: NVRTC is not available: %s", why);
        return;
    }
    const char *driver = getenv("ATTNRES_CUDA_DRIVER");
    if (open_device(msg, sizeof msg) != ATTNRES_OK) {
        if (driver && *driver)
            bo_fail("cuda: cuda:0 did not open with ATTNRES_CUDA_DRIVER=%s: %s", driver, msg);
        else
            bo_skip("cuda: no CUDA device (%s) and ATTNRES_CUDA_DRIVER is unset", msg);
        return;
    }
    if (driver && *driver) {
        void *h = dlopen(driver, RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            *(void **)&sim_last_fault = dlsym(h, "cudasimLastFault");
            *(void **)&sim_describe = dlsym(h, "cudasimDescribe");
        }
    }
    if (!bo_listing) {
        int major = 0, minor = 0;
        ar_nvrtc_version(&major, &minor);
        printf("cuda: device cuda:0: %s %s, %d SMs, driver %s%s%s; NVRTC %d.%d, kernels loaded as PTX\n",
               cuda_dev->name, cuda_dev->arch, cuda_dev->units, cuda_dev->driver, sim_describe ? "; " : "",
               sim_describe ? sim_describe() : "", major, minor);
    }
    char **names = NULL;
    size_t ntemplates = 0;
    sweep sw;
    memset(&sw, 0, sizeof sw);
    if (argen_list_templates(template_dir(), &names, &ntemplates) != 0 || ntemplates == 0) {
        bo_fail("cuda: no templates in %s", template_dir());
    } else {
        size_t cap = 0;
        int per_op[NOPS] = {0, 0, 0, 0, 0, 0};
        const double t0 = now_s();
        for (size_t t = 0; t < ntemplates; t++)
            if (strncmp(names[t], "cuda/", 5) == 0)
                collect_template(&sw, &cap, names[t], per_op);
        if (!bo_listing)
            printf("cuda: variants %zu (mix %d, phase1 %d, phase2 %d, mix_backward %d, phase1_backward %d, "
                   "phase2_backward %d%s); problems chosen in %.2f s\n",
                   sw.nv, per_op[0], per_op[1], per_op[2], per_op[3], per_op[4], per_op[5],
                   bo_sample ? ", of the backwards a covering sample" : ", all", now_s() - t0);
        make_jobs(&sw);
        if (!bo_listing)
            run_jobs();
    }
    free(jobs);
    jobs = NULL;
    for (size_t i = 0; i < sw.nv; i++) {
        free(sw.vs[i].id);
        free(sw.vs[i].source);
        free(sw.vs[i].kernel);
        free(sw.vs[i].json);
    }
    free(sw.vs);
    for (int i = 0; i < sw.ngens; i++)
        argen_close(sw.gens[i]);
    argen_names_free(names, ntemplates);
    attnres_device_close(cuda_dev);
    cuda_dev = NULL;
}
