/*
 * measure_backward.c - the bench case of the mix backward (DESIGN §1b):
 * random inputs, the fp64 reference gradients, verification of every
 * gradient and the determinism check, for measure.c.
 *
 * Verification runs the kernel twice on the same inputs, its outputs
 * poisoned before the first run and its workspace before each, and
 * compares the two runs bit for bit: the sums over tokens must not depend
 * on anything but the inputs (a kernel that differs is marked
 * nondeterministic and never wins).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "attnres-impl.h"
#include "measure_internal.h"

/* The forward's alpha in the additive form, as the mix's bench case. */
#define BENCH_ALPHA 0.75f

/* The epilogue's buffers of one set of rows: the forward's out, the
 * gradient of normed, and the gain's gradient (NULL without it). */
typedef struct epilogue_bufs {
    void *out, *dnormed;
    float *dgout;
} epilogue_bufs;

static int set_args(bench_case *bc, attnres_mix_backward_args *a, void *src, const void **rows, void *dsrc,
                    void **drows, int64_t t, void *dout, void *dpartial, float *dquery, float *dalpha, void *ws,
                    size_t ws_size, epilogue_bufs e)
{
    attnres_mix_backward_args_init(a);
    const size_t row = (size_t)t * (size_t)bc->p.d * bc->es;
    for (int i = 0; i < bc->p.n; i++) {
        rows[i] = (const char *)src + (size_t)i * row;
        drows[i] = (char *)dsrc + (size_t)i * row;
    }
    const int additive = bc->p.form == ATTNRES_FORM_ADDITIVE;
    a->sources = rows;
    a->query = bc->query;
    a->alpha = BENCH_ALPHA;
    a->dout = dout;
    a->dsources = drows;
    a->dquery = dquery;
    a->dpartial = additive ? dpartial : NULL;
    a->dalpha = additive ? dalpha : NULL;
    a->workspace = ws;
    a->workspace_size = ws_size;
    if (bc->p.epilogue) {
        a->out = e.out;
        a->out_gain = bc->out_gain;
        a->out_eps = 1e-6f;
        a->dnormed = e.dnormed;
        a->dout_gain = e.dgout;
    }
    return ATTNRES_OK;
}

/* The device buffers the backward writes for one set of row values per
 * source (row = tokens * d): the gradients and the workspace. */
static int alloc_outputs(bench_case *bc, size_t row, size_t ws_size, void **dsrc, void **dpartial, float **dquery,
                         float **dalpha, void **ws)
{
    int rc = upload(bc, NULL, row * (size_t)bc->p.n * bc->es, dsrc);
    rc = rc ? rc : upload(bc, NULL, row * bc->es, dpartial);
    rc = rc ? rc : upload(bc, NULL, (size_t)bc->p.d * 4, (void **)dquery);
    rc = rc ? rc : upload(bc, NULL, 4, (void **)dalpha);
    return rc ? rc : upload(bc, NULL, ws_size, ws);
}

/* The epilogue's inputs and its share of the reference: the gain, the
 * gradient of normed, and the forward's out in fp64 rounded through the
 * storage type (hout, the values the kernel reads); then in fp64 the
 * gradient of out the kernel works from, dout + the RMSNorm backward of
 * dnormed through that out, into xdo, and d(out_gain) into ref_dgout. */
static int epilogue_inputs(bench_case *bc, uint64_t *s, const double *const *xrows, const double *xq,
                           const double *zeros, float *hog, float *hdn, float *hout, double *xdo, char *err,
                           size_t err_len)
{
    const int64_t d = bc->p.d, tv = bc->tv;
    const size_t vrow = (size_t)(tv * d);
    double *xdn = malloc(vrow * 8 + 8), *xout = malloc(vrow * 8 + 8), *xog = malloc((size_t)d * 8);
    void *tmp = malloc(vrow * 4 + 4);
    int rc = xdn && xout && xog && tmp ? ATTNRES_OK : ATTNRES_ENOMEM;
    if (rc == ATTNRES_OK) {
        for (int64_t k = 0; k < d; k++) {
            hog[k] = (float)(1.0 + 0.2 * normal(s));
            xog[k] = hog[k];
        }
        random_rows(s, bc->p.dtype, tv, d, hdn, xdn, 0);
        attnres_problem fwd = bc->p;
        fwd.op = ATTNRES_OP_MIX;
        fwd.epilogue = 0;
        rc = attnres_reference_mix(&fwd, tv, xrows, xq, 1.0, 1e-6,
                                   bc->p.form == ATTNRES_FORM_ADDITIVE ? zeros : NULL, BENCH_ALPHA, NULL, 1e-6,
                                   xout, NULL);
    }
    if (rc == ATTNRES_OK) {
        for (size_t e = 0; e < vrow; e++)
            hout[e] = (float)xout[e];
        convert_to_storage(bc->p.dtype, hout, tmp, vrow);
        convert_from_storage(bc->p.dtype, tmp, hout, vrow);
        for (size_t e = 0; e < vrow; e++)
            xout[e] = hout[e];
        memset(bc->ref_dgout, 0, sizeof(double) * (size_t)d);
        for (int64_t t = 0; t < tv; t++)
            ar_rmsnorm_backward(xout + t * d, xdn + t * d, xog, 1e-6, d, xdo + t * d, bc->ref_dgout);
    } else {
        snprintf(err, err_len, "the epilogue's inputs: %s", rc == ATTNRES_ENOMEM ? "out of host memory"
                                                                                 : "the reference forward failed");
    }
    free(xdn);
    free(xout);
    free(xog);
    free(tmp);
    return rc;
}

bench_case *bench_backward_create(bench_case *bc, uint64_t seed, char *err, size_t err_len)
{
    const int64_t d = bc->p.d, n = bc->p.n, tv = bc->tv, t = bc->t;
    const attnres_dtype dt = bc->p.dtype;
    const size_t vrow = (size_t)(tv * d), trow = (size_t)(t * d), big = trow > vrow ? trow : vrow;
    const int additive = bc->p.form == ATTNRES_FORM_ADDITIVE, epi = bc->p.epilogue;
    uint64_t s = seed;
    float *hq = malloc((size_t)d * 4), *hsrc = malloc(vrow * (size_t)n * 4), *hdo = malloc(vrow * 4);
    /* The epilogue's gain, gradient of normed and forward out (on the host). */
    float *hog = malloc((size_t)d * 4), *hdn = malloc(vrow * 4 + 4), *hout = malloc(vrow * 4 + 4);
    double *xsrc = malloc(vrow * (size_t)n * 8), *xdo = malloc(vrow * 8), *xq = malloc((size_t)d * 8),
           *zeros = calloc(vrow + 1, 8);
    void *store = malloc(big * (size_t)n * bc->es + 64);
    const double **xrows = malloc(sizeof(double *) * (size_t)n);
    double **rrows = malloc(sizeof(double *) * (size_t)n);
    bc->v_rows = malloc(sizeof(void *) * (size_t)n);
    bc->t_rows = malloc(sizeof(void *) * (size_t)n);
    bc->v_drows = malloc(sizeof(void *) * (size_t)n);
    bc->t_drows = malloc(sizeof(void *) * (size_t)n);
    bc->ref_dsrc = malloc(vrow * (size_t)n * 8 + 8);
    bc->ref_dquery = malloc((size_t)d * 8);
    bc->ref_dpartial = malloc(vrow * 8 + 8);
    bc->ref_dgout = malloc((size_t)d * 8);
    int ok = hq && hsrc && hdo && xsrc && xdo && xq && zeros && store && xrows && rrows && bc->v_rows &&
             bc->t_rows && bc->v_drows && bc->t_drows && bc->ref_dsrc && bc->ref_dquery && bc->ref_dpartial &&
             hog && hdn && hout && bc->ref_dgout;
    if (!ok) {
        snprintf(err, err_len, "out of host memory for T = %lld", (long long)t);
        goto fail;
    }
    for (int64_t k = 0; k < d; k++) {
        hq[k] = (float)(normal(&s) / sqrt((double)d) * 4.0);
        xq[k] = hq[k];
    }
    random_rows(&s, dt, n * tv, d, hsrc, xsrc, 1);
    random_rows(&s, dt, tv, d, hdo, xdo, 0);
    for (int i = 0; i < n; i++) {
        xrows[i] = xsrc + (size_t)i * vrow;
        rrows[i] = bc->ref_dsrc + (size_t)i * vrow;
    }
    /* partial's value enters no gradient: zeros stand in for it. With the
     * epilogue, xdo becomes the gradient of out the kernel works from, and
     * the mix's reference backward takes it. */
    if (epi && epilogue_inputs(bc, &s, xrows, xq, zeros, hog, hdn, hout, xdo, err, err_len) != ATTNRES_OK)
        goto fail;
    attnres_problem fwd = bc->p;
    fwd.op = ATTNRES_OP_MIX;
    fwd.epilogue = 0;
    char msg[256];
    int rc = attnres_reference_mix_backward(&fwd, tv, xrows, xq, 1.0, 1e-6, additive ? zeros : NULL, BENCH_ALPHA,
                                            NULL, 1e-6, xdo, NULL, 0, rrows, bc->ref_dquery,
                                            additive ? bc->ref_dpartial : NULL, additive ? &bc->ref_dalpha : NULL,
                                            NULL, msg, sizeof msg);
    if (rc != ATTNRES_OK) {
        snprintf(err, err_len, "reference failed: %s", msg);
        goto fail;
    }
    /* dalpha = sum over tokens of dout . mix is one number whose terms
     * cancel: on random inputs it is now and then ten times smaller than
     * its terms, and an fp32 sum's error relative to it then passes 1e-5
     * for a correct kernel. Its error is measured against the size of its
     * terms instead: |mix| is at most the largest |v_n| (a convex blend). */
    bc->dalpha_scale = 0;
    for (size_t e = 0; e < vrow; e++) {
        double vmax = 0;
        for (int i = 0; i < n; i++)
            vmax = fmax(vmax, fabs(xrows[i][e]));
        bc->dalpha_scale += fabs(xdo[e]) * vmax;
    }
    ar_backward_ws vws, tws;
    if (ar_mix_backward_workspace(d, tv, bc->p.epilogue, &vws) || ar_mix_backward_workspace(d, t, bc->p.epilogue, &tws)) {
        snprintf(err, err_len, "no workspace size for T = %lld", (long long)t);
        goto fail;
    }
    bc->v_ws_size = vws.bytes;
    bc->t_ws_size = tws.bytes;
    convert_to_storage(dt, hsrc, store, vrow * (size_t)n);
    rc = upload(bc, hq, (size_t)d * 4, (void **)&bc->query);
    rc = rc ? rc : upload(bc, store, vrow * (size_t)n * bc->es, &bc->v_src);
    convert_to_storage(dt, hdo, store, vrow);
    rc = rc ? rc : upload(bc, store, vrow * bc->es, &bc->v_dout);
    rc = rc ? rc
            : alloc_outputs(bc, vrow, bc->v_ws_size, &bc->v_dsrc, &bc->v_dpartial, &bc->v_dquery, &bc->v_dalpha,
                            &bc->v_ws);
    if (epi) {
        rc = rc ? rc : upload(bc, hog, (size_t)d * 4, (void **)&bc->out_gain);
        convert_to_storage(dt, hout, store, vrow);
        rc = rc ? rc : upload(bc, store, vrow * bc->es, &bc->v_eout);
        convert_to_storage(dt, hdn, store, vrow);
        rc = rc ? rc : upload(bc, store, vrow * bc->es, &bc->v_dnormed);
        rc = rc ? rc : upload(bc, NULL, (size_t)d * 4, (void **)&bc->v_dgout);
    }
    /* Timing inputs: the verification rows tiled to T tokens. */
    for (int64_t r = 0; r < n * t; r++)
        convert_to_storage(dt, hsrc + (size_t)((r % (n * tv)) * d), (char *)store + (size_t)(r * d) * bc->es,
                           (size_t)d);
    rc = rc ? rc : upload(bc, store, trow * (size_t)n * bc->es, &bc->t_src);
    rc = rc ? rc : upload(bc, store, trow * bc->es, &bc->t_dout);
    rc = rc ? rc
            : alloc_outputs(bc, trow, bc->t_ws_size, &bc->t_dsrc, &bc->t_dpartial, &bc->t_dquery, &bc->t_dalpha,
                            &bc->t_ws);
    if (epi) {
        /* The epilogue's timing rows: its verification rows tiled too. */
        for (int64_t r = 0; r < t; r++)
            convert_to_storage(dt, hout + (size_t)((r % tv) * d), (char *)store + (size_t)(r * d) * bc->es,
                               (size_t)d);
        rc = rc ? rc : upload(bc, store, trow * bc->es, &bc->t_eout);
        for (int64_t r = 0; r < t; r++)
            convert_to_storage(dt, hdn + (size_t)((r % tv) * d), (char *)store + (size_t)(r * d) * bc->es,
                               (size_t)d);
        rc = rc ? rc : upload(bc, store, trow * bc->es, &bc->t_dnormed);
        rc = rc ? rc : upload(bc, NULL, (size_t)d * 4, (void **)&bc->t_dgout);
    }
    if (rc != ATTNRES_OK) {
        snprintf(err, err_len, "device buffers: %s", attnres_device_errmsg(bc->dev));
        goto fail;
    }
    set_args(bc, &bc->v_bw, bc->v_src, bc->v_rows, bc->v_dsrc, bc->v_drows, tv, bc->v_dout, bc->v_dpartial,
             bc->v_dquery, bc->v_dalpha, bc->v_ws, bc->v_ws_size,
             (epilogue_bufs){bc->v_eout, bc->v_dnormed, bc->v_dgout});
    set_args(bc, &bc->t_bw, bc->t_src, bc->t_rows, bc->t_dsrc, bc->t_drows, t, bc->t_dout, bc->t_dpartial,
             bc->t_dquery, bc->t_dalpha, bc->t_ws, bc->t_ws_size,
             (epilogue_bufs){bc->t_eout, bc->t_dnormed, bc->t_dgout});
    goto done;
fail:
    bench_backward_free(bc);
    bc = NULL;
done:;
    void *const host[] = {hq, hsrc, hdo, xsrc, xdo, xq, zeros, store, (void *)xrows, (void *)rrows, hog, hdn, hout};
    free_each(host, MEASURE_COUNT(host));
    return bc;
}

void bench_backward_free(bench_case *bc)
{
    if (!bc)
        return;
    void *const dev_bufs[] = {bc->v_src,  bc->v_dout,     bc->v_dsrc,   bc->v_dpartial, bc->v_dquery,
                              bc->v_dalpha, bc->v_ws,     bc->t_src,    bc->t_dout,     bc->t_dsrc,
                              bc->t_dpartial, bc->t_dquery, bc->t_dalpha, bc->t_ws,     bc->query,
                              bc->v_eout, bc->t_eout, bc->v_dnormed, bc->t_dnormed, bc->out_gain, bc->v_dgout,
                              bc->t_dgout};
    device_free_each(bc, dev_bufs, MEASURE_COUNT(dev_bufs));
    void *const host[] = {bc->v_rows,   bc->t_rows,     bc->v_drows,      bc->t_drows,
                          bc->ref_dsrc, bc->ref_dquery, bc->ref_dpartial, bc->ref_dgout, bc};
    free_each(host, MEASURE_COUNT(host));
}

/* Fills a device buffer with one byte value. */
static int fill(bench_case *bc, void *dst, size_t bytes, int value)
{
    void *host = malloc(bytes + 4);
    if (!host)
        return ATTNRES_ENOMEM;
    memset(host, value, bytes);
    int rc = bc->dev->ops->copy_to_device(bc->dev, dst, host, bytes);
    free(host);
    return rc;
}

/* Copies the verification outputs to one host buffer, for the bit
 * comparison of two runs. */
static int outputs(bench_case *bc, char *host, size_t src_bytes, size_t row_bytes)
{
    const size_t d4 = (size_t)bc->p.d * 4;
    int rc = bc->dev->ops->copy_to_host(bc->dev, host, bc->v_dsrc, src_bytes);
    rc = rc ? rc : bc->dev->ops->copy_to_host(bc->dev, host + src_bytes, bc->v_dquery, d4);
    rc = rc ? rc : bc->dev->ops->copy_to_host(bc->dev, host + src_bytes + d4, bc->v_dpartial, row_bytes);
    rc = rc ? rc : bc->dev->ops->copy_to_host(bc->dev, host + src_bytes + d4 + row_bytes, bc->v_dalpha, 4);
    if (bc->p.epilogue)
        rc = rc ? rc : bc->dev->ops->copy_to_host(bc->dev, host + src_bytes + d4 + row_bytes + 4, bc->v_dgout, d4);
    return rc;
}

/* Appends to out one gradient's share of the difference between two runs:
 * how many of its values differ and where the first is, its index split
 * into source, token and element when rows > 0 (the sources' gradients),
 * into token and element when rows == 0 and tokens > 0, and a plain
 * element otherwise. Nothing when its bytes agree. */
static void describe_gradient(char *out, size_t len, const char *name, const char *a, const char *b, size_t bytes,
                              size_t es, int64_t tokens, int64_t d, int rows)
{
    if (memcmp(a, b, bytes) == 0)
        return;
    const size_t n = bytes / es;
    size_t differ = 0, first = 0;
    for (size_t i = n; i-- > 0;)
        if (memcmp(a + i * es, b + i * es, es) != 0) {
            differ++;
            first = i;
        }
    char where[96];
    if (rows > 0)
        snprintf(where, sizeof where, "source %zu, token %zu, element %zu", first / (size_t)(tokens * d),
                 first / (size_t)d % (size_t)tokens, first % (size_t)d);
    else if (tokens > 0)
        snprintf(where, sizeof where, "token %zu, element %zu", first / (size_t)d, first % (size_t)d);
    else
        snprintf(where, sizeof where, "element %zu", first);
    const size_t used = strlen(out);
    if (used + 1 < len)
        snprintf(out + used, len - used, "%s%s (%zu of %zu values, first at %s)", used ? ", " : "", name, differ, n,
                 where);
}

int bench_backward_verify(bench_case *bc, const ar_kernel *k, double *rel_err)
{
    const size_t row_bytes = (size_t)(bc->tv * bc->p.d) * bc->es, src_bytes = row_bytes * (size_t)bc->p.n;
    const size_t all = src_bytes + (size_t)bc->p.d * 4 * (bc->p.epilogue ? 2 : 1) + row_bytes + 4;
    char *first = malloc(all), *second = malloc(all);
    int rc = first && second ? ATTNRES_OK : ATTNRES_ENOMEM;
    const ar_op_args args = ar_op_mix_backward(&bc->v_bw);
    for (int run = 0; run < 2 && rc == ATTNRES_OK; run++) {
        /* All-ones bytes are NaN in every dtype: a skipped element fails.
         * The workspace gets a different poison on each run, so that a
         * kernel that reads a partial sum before writing it differs. */
        rc = fill(bc, bc->v_dsrc, src_bytes, 0xff);
        rc = rc ? rc : fill(bc, bc->v_dpartial, row_bytes, 0xff);
        rc = rc ? rc : fill(bc, bc->v_dquery, (size_t)bc->p.d * 4, 0xff);
        rc = rc ? rc : fill(bc, bc->v_dalpha, 4, 0xff);
        if (bc->p.epilogue)
            rc = rc ? rc : fill(bc, bc->v_dgout, (size_t)bc->p.d * 4, 0xff);
        rc = rc ? rc : fill(bc, bc->v_ws, bc->v_ws_size, run ? 0x3c : 0xa5);
        rc = rc ? rc : bc->dev->ops->launch(bc->dev, k, &bc->p, bc->tv, &args, NULL);
        rc = rc ? rc : outputs(bc, run ? second : first, src_bytes, row_bytes);
    }
    if (rc == ATTNRES_OK && memcmp(first, second, all) != 0) {
        /* The message names the gradients that differ: a sum over tokens
         * (dquery, dalpha) points at the workspace or the group order, a
         * per-token one (dsources, dpartial) at a race in the kernel. */
        const size_t d4 = (size_t)bc->p.d * 4;
        char *out = bc->difference;
        const size_t len = sizeof bc->difference;
        out[0] = '\0';
        bc->nondeterministic = 1;
        describe_gradient(out, len, "dsources", first, second, src_bytes, bc->es, bc->tv, bc->p.d, 1);
        describe_gradient(out, len, "dquery", first + src_bytes, second + src_bytes, d4, 4, 0, bc->p.d, 0);
        describe_gradient(out, len, "dpartial", first + src_bytes + d4, second + src_bytes + d4, row_bytes, bc->es,
                          bc->tv, bc->p.d, 0);
        describe_gradient(out, len, "dalpha", first + src_bytes + d4 + row_bytes, second + src_bytes + d4 + row_bytes,
                          4, 4, 0, 1, 0);
        if (bc->p.epilogue)
            describe_gradient(out, len, "dout_gain", first + src_bytes + d4 + row_bytes + 4,
                              second + src_bytes + d4 + row_bytes + 4, d4, 4, 0, bc->p.d, 0);
    }
    free(first);
    free(second);
    if (rc != ATTNRES_OK)
        return rc;
    /* Per gradient: the worst relative error of any. */
    double worst = 0, e = 0;
    const size_t vrow = (size_t)(bc->tv * bc->p.d);
    rc = compare_n(bc, bc->v_dsrc, bc->ref_dsrc, vrow * (size_t)bc->p.n, 0, &e);
    worst = e;
    if (rc == ATTNRES_OK) {
        rc = compare_n(bc, bc->v_dquery, bc->ref_dquery, (size_t)bc->p.d, 1, &e);
        /* N = 1: the reference is exactly zero, and so must the kernel's be. */
        double den = 0;
        for (int64_t k2 = 0; k2 < bc->p.d; k2++)
            den += bc->ref_dquery[k2] * bc->ref_dquery[k2];
        if (den == 0 && e != 0)
            e = INFINITY;
        worst = isnan(e) || e > worst ? e : worst;
        bc->sums_err = e;
        bc->sums_name = "dquery";
    }
    if (rc == ATTNRES_OK && bc->p.form == ATTNRES_FORM_ADDITIVE) {
        rc = compare_n(bc, bc->v_dpartial, bc->ref_dpartial, vrow, 0, &e);
        worst = isnan(e) || e > worst ? e : worst;
        float got = NAN;
        if (rc == ATTNRES_OK)
            rc = bc->dev->ops->copy_to_host(bc->dev, &got, bc->v_dalpha, 4);
        /* Against the size of its terms (dalpha_scale), not its own. */
        e = fabs((double)got - bc->ref_dalpha) / (bc->dalpha_scale > 0 ? bc->dalpha_scale : 1.0);
        worst = isnan(e) || e > worst ? e : worst;
        if (isnan(e) || e > bc->sums_err) {
            bc->sums_err = e;
            bc->sums_name = "dalpha (against the size of its terms)";
        }
    }
    if (rc == ATTNRES_OK && bc->p.epilogue) {
        rc = compare_n(bc, bc->v_dgout, bc->ref_dgout, (size_t)bc->p.d, 1, &e);
        worst = isnan(e) || e > worst ? e : worst;
        if (isnan(e) || e > bc->sums_err) {
            bc->sums_err = e;
            bc->sums_name = "dout_gain";
        }
    }
    *rel_err = isnan(worst) ? NAN : worst;
    return rc;
}
