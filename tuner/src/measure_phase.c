/*
 * measure_phase.c - verification and timing of the Block AttnRes phase
 * operations (DESIGN §1): phase 1 writes every site's o1 and lse, phase 2
 * merges one site's o1/lse with the partial sum b (and may add f into b).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "measure_internal.h"

/* Copies n storage elements of host fp32 data to a new device buffer. */
static int upload_rows(bench_case *bc, const float *host, size_t n, void *scratch, void **dst)
{
    convert_to_storage(bc->p.dtype, host, scratch, n);
    return upload(bc, scratch, n * bc->es, dst);
}

/* Device buffer of n elements of `count` copies of a tv-token pattern
 * (the timing buffers hold T tokens; their values do not matter). */
static int upload_tiled(bench_case *bc, const void *pattern, size_t pattern_bytes, size_t bytes, void **dst)
{
    char *tmp = malloc(bytes + 1);
    if (!tmp)
        return ATTNRES_ENOMEM;
    for (size_t off = 0; off < bytes; off += pattern_bytes)
        memcpy(tmp + off, pattern, bytes - off < pattern_bytes ? bytes - off : pattern_bytes);
    int rc = upload(bc, tmp, bytes, dst);
    free(tmp);
    return rc;
}

/* The end of a phase case's creation: frees its n host scratch buffers and
 * returns the case, or NULL with the case freed when rc says it failed. */
static bench_case *phase_created(bench_case *bc, int rc, void *const *host, size_t n)
{
    free_each(host, n);
    if (rc != ATTNRES_OK) {
        bench_phase_free(bc);
        return NULL;
    }
    return bc;
}

static bench_case *create_phase1(bench_case *bc, uint64_t s, char *err, size_t len)
{
    const int64_t d = bc->p.d, n = bc->p.n, S = bc->p.s, H = bc->p.heads, tv = bc->tv, t = bc->t;
    const size_t vrow = (size_t)(tv * d), trow = (size_t)(t * d);
    float *hsrc = malloc(vrow * (size_t)n * 4), *hq = malloc((size_t)(S * d) * 4);
    double *xsrc = malloc(vrow * (size_t)n * 8), *xq = malloc((size_t)(S * d) * 8);
    const double **xrows = malloc(sizeof(double *) * (size_t)n);
    void *store = malloc(vrow * (size_t)n * bc->es + 4);
    bc->v_rows = calloc((size_t)n, sizeof(void *));
    bc->t_rows = calloc((size_t)n, sizeof(void *));
    bc->v_o1 = calloc((size_t)S, sizeof(void *));
    bc->t_o1 = calloc((size_t)S, sizeof(void *));
    bc->v_lse = calloc((size_t)S, sizeof(float *));
    bc->t_lse = calloc((size_t)S, sizeof(float *));
    bc->ref_out = malloc(vrow * (size_t)S * 8);
    bc->ref_lse = malloc((size_t)(S * tv * H) * 8);
    int rc = hsrc && hq && xsrc && xq && xrows && store && bc->v_rows && bc->t_rows && bc->v_o1 && bc->t_o1 &&
                     bc->v_lse && bc->t_lse && bc->ref_out && bc->ref_lse
                 ? ATTNRES_OK
                 : ATTNRES_ENOMEM;
    if (rc == ATTNRES_OK) {
        for (int64_t k = 0; k < S * d; k++)
            xq[k] = hq[k] = (float)(normal(&s) / sqrt((double)d) * 4.0);
        random_rows(&s, bc->p.dtype, n * tv, d, hsrc, xsrc, 1);
        for (int64_t i = 0; i < n; i++)
            xrows[i] = xsrc + (size_t)i * vrow;
        rc = attnres_reference_phase1(&bc->p, tv, xrows, xq, 1.0, 1e-6, bc->ref_out, bc->ref_lse);
    }
    rc = rc ? rc : upload(bc, hq, (size_t)(S * d) * 4, (void **)&bc->query);
    rc = rc ? rc : upload_rows(bc, hsrc, vrow * (size_t)n, store, &bc->v_src);
    rc = rc ? rc : upload_tiled(bc, store, vrow * (size_t)n * bc->es, trow * (size_t)n * bc->es, &bc->t_src);
    for (int64_t j = 0; rc == ATTNRES_OK && j < S; j++) {
        rc = upload(bc, NULL, vrow * bc->es, &bc->v_o1[j]);
        rc = rc ? rc : upload(bc, NULL, trow * bc->es, &bc->t_o1[j]);
        rc = rc ? rc : upload(bc, NULL, (size_t)(tv * H) * 4, (void **)&bc->v_lse[j]);
        rc = rc ? rc : upload(bc, NULL, (size_t)(t * H) * 4, (void **)&bc->t_lse[j]);
    }
    if (rc == ATTNRES_OK) {
        for (int64_t i = 0; i < n; i++) {
            bc->v_rows[i] = (const char *)bc->v_src + (size_t)i * vrow * bc->es;
            bc->t_rows[i] = (const char *)bc->t_src + (size_t)i * trow * bc->es;
        }
        attnres_phase1_args *a[2] = {&bc->v_p1, &bc->t_p1};
        for (int w = 0; w < 2; w++) {
            attnres_phase1_args_init(a[w]);
            a[w]->sources = w ? bc->t_rows : bc->v_rows;
            a[w]->queries = bc->query;
            a[w]->o1 = w ? bc->t_o1 : bc->v_o1;
            a[w]->lse = w ? bc->t_lse : bc->v_lse;
        }
    } else {
        snprintf(err, len, "phase 1 buffers: %s", rc == ATTNRES_ENOMEM ? "out of memory" : attnres_device_errmsg(bc->dev));
    }
    void *const host[] = {hsrc, hq, xsrc, xq, (void *)xrows, store};
    return phase_created(bc, rc, host, MEASURE_COUNT(host));
}

static bench_case *create_phase2(bench_case *bc, uint64_t s, char *err, size_t len)
{
    const int64_t d = bc->p.d, H = bc->p.heads, tv = bc->tv, t = bc->t;
    const size_t vrow = (size_t)(tv * d), trow = (size_t)(t * d), vl = (size_t)(tv * H);
    int fuse = bc->p.fuse_add;
    float *ho1 = malloc(vrow * 4), *hb = malloc(vrow * 4), *hf = malloc(vrow * 4), *hl = malloc(vl * 4);
    float *hq = malloc((size_t)d * 4), *hg = malloc((size_t)d * 4);
    double *xo1 = malloc(vrow * 8), *xf = malloc(vrow * 8), *xl = malloc(vl * 8), *xq = malloc((size_t)d * 8),
           *xg = malloc((size_t)d * 8);
    void *store = malloc(vrow * bc->es + 4);
    bc->ref_out = malloc(vrow * 8);
    bc->ref_normed = malloc(vrow * 8);
    bc->ref_partial = malloc(vrow * 8);
    bc->v_partial_init = malloc(vrow * bc->es + 4);
    int rc = ho1 && hb && hf && hl && hq && hg && xo1 && xf && xl && xq && xg && store && bc->ref_out &&
                     bc->ref_normed && bc->ref_partial && bc->v_partial_init
                 ? ATTNRES_OK
                 : ATTNRES_ENOMEM;
    if (rc == ATTNRES_OK) {
        for (int64_t k = 0; k < d; k++) {
            xq[k] = hq[k] = (float)(normal(&s) / sqrt((double)d) * 4.0);
            xg[k] = hg[k] = (float)(1.0 + 0.1 * normal(&s));
        }
        random_rows(&s, bc->p.dtype, tv, d, ho1, xo1, 1);
        random_rows(&s, bc->p.dtype, tv, d, hb, bc->ref_partial, 1);
        random_rows(&s, bc->p.dtype, tv, d, hf, xf, 0);
        /* An lse as phase 1 gives it: scores of order one over ~9 sources. */
        for (size_t i = 0; i < vl; i++)
            xl[i] = hl[i] = (float)(normal(&s) + log(9.0));
        rc = attnres_reference_phase2(&bc->p, tv, xo1, xl, bc->ref_partial, fuse ? xf : NULL, xq, 1.0, 1e-6,
                                      bc->p.epilogue ? xg : NULL, 1e-6, bc->ref_out,
                                      bc->p.epilogue ? bc->ref_normed : NULL);
    }
    rc = rc ? rc : upload(bc, hq, (size_t)d * 4, (void **)&bc->query);
    rc = rc ? rc : upload(bc, hg, (size_t)d * 4, (void **)&bc->out_gain);
    rc = rc ? rc : upload(bc, hl, vl * 4, &bc->v_lse_in);
    rc = rc ? rc : upload_tiled(bc, hl, vl * 4, (size_t)(t * H) * 4, &bc->t_lse_in);
    rc = rc ? rc : upload_rows(bc, ho1, vrow, store, &bc->v_src);
    rc = rc ? rc : upload_tiled(bc, store, vrow * bc->es, trow * bc->es, &bc->t_src);
    rc = rc ? rc : upload_rows(bc, hb, vrow, store, &bc->v_partial);
    if (rc == ATTNRES_OK)
        memcpy(bc->v_partial_init, store, vrow * bc->es);
    rc = rc ? rc : upload_tiled(bc, store, vrow * bc->es, trow * bc->es, &bc->t_partial);
    rc = rc ? rc : upload_rows(bc, hf, vrow, store, &bc->v_sub);
    rc = rc ? rc : upload_tiled(bc, store, vrow * bc->es, trow * bc->es, &bc->t_sub);
    rc = rc ? rc : upload(bc, NULL, vrow * bc->es, &bc->v_out);
    rc = rc ? rc : upload(bc, NULL, vrow * bc->es, &bc->v_normed);
    rc = rc ? rc : upload(bc, NULL, trow * bc->es, &bc->t_out);
    rc = rc ? rc : upload(bc, NULL, trow * bc->es, &bc->t_normed);
    if (rc == ATTNRES_OK) {
        attnres_phase2_args *a[2] = {&bc->v_p2, &bc->t_p2};
        for (int w = 0; w < 2; w++) {
            attnres_phase2_args_init(a[w]);
            a[w]->o1 = w ? bc->t_src : bc->v_src;
            a[w]->lse = w ? bc->t_lse_in : bc->v_lse_in;
            a[w]->partial = w ? bc->t_partial : bc->v_partial;
            a[w]->sublayer = fuse ? (w ? bc->t_sub : bc->v_sub) : NULL;
            a[w]->query = bc->query;
            a[w]->out = w ? bc->t_out : bc->v_out;
            a[w]->out_gain = bc->p.epilogue ? bc->out_gain : NULL;
            a[w]->normed = bc->p.epilogue ? (w ? bc->t_normed : bc->v_normed) : NULL;
        }
    } else {
        snprintf(err, len, "phase 2 buffers: %s", rc == ATTNRES_ENOMEM ? "out of memory" : attnres_device_errmsg(bc->dev));
    }
    void *const host[] = {ho1, hb, hf, hl, hq, hg, xo1, xf, xl, xq, xg, store};
    return phase_created(bc, rc, host, MEASURE_COUNT(host));
}

bench_case *bench_phase_create(bench_case *bc, const measure_policy *pol, uint64_t seed, char *err, size_t err_len)
{
    (void)pol;
    return bc->p.op == ATTNRES_OP_PHASE1 ? create_phase1(bc, seed, err, err_len) : create_phase2(bc, seed, err, err_len);
}

void bench_phase_free(bench_case *bc)
{
    if (!bc)
        return;
    void *const bufs[] = {bc->v_src, bc->t_src, bc->v_partial, bc->t_partial, bc->v_out, bc->v_normed, bc->t_out,
                          bc->t_normed, bc->query, bc->out_gain, bc->v_lse_in, bc->t_lse_in, bc->v_sub, bc->t_sub};
    device_free_each(bc, bufs, MEASURE_COUNT(bufs));
    for (int32_t j = 0; j < bc->p.s; j++) {
        void *const per_site[] = {bc->v_o1 ? bc->v_o1[j] : NULL, bc->t_o1 ? bc->t_o1[j] : NULL,
                                  bc->v_lse ? bc->v_lse[j] : NULL, bc->t_lse ? bc->t_lse[j] : NULL};
        device_free_each(bc, per_site, MEASURE_COUNT(per_site));
    }
    void *const host[] = {bc->v_o1,   bc->t_o1,    bc->v_lse,   bc->t_lse,       bc->v_rows,     bc->t_rows,
                          bc->ref_out, bc->ref_normed, bc->ref_lse, bc->ref_partial, bc->v_partial_init, bc->host_out,
                          bc};
    free_each(host, MEASURE_COUNT(host));
}

static int poison(bench_case *bc, void *dst, size_t bytes)
{
    void *p = malloc(bytes + 4);
    if (!p)
        return ATTNRES_ENOMEM;
    memset(p, 0xff, bytes); /* NaN in every dtype */
    int rc = bc->dev->ops->copy_to_device(bc->dev, dst, p, bytes);
    free(p);
    return rc;
}

static double worst(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

int bench_phase_verify(bench_case *bc, const ar_kernel *k, double *rel_err)
{
    attnres_device *dev = bc->dev;
    const size_t vrow = (size_t)(bc->tv * bc->p.d), vl = (size_t)(bc->tv * bc->p.heads);
    double e = 0, x = 0;
    int rc = ATTNRES_OK;
    if (bc->p.op == ATTNRES_OP_PHASE1) {
        for (int32_t j = 0; rc == ATTNRES_OK && j < bc->p.s; j++) {
            rc = poison(bc, bc->v_o1[j], vrow * bc->es);
            rc = rc ? rc : poison(bc, bc->v_lse[j], vl * 4);
        }
        const ar_op_args args = ar_op_phase1(&bc->v_p1);
        rc = rc ? rc : dev->ops->launch(dev, k, &bc->p, bc->tv, &args, NULL);
        for (int32_t j = 0; rc == ATTNRES_OK && j < bc->p.s; j++) {
            rc = compare_n(bc, bc->v_o1[j], bc->ref_out + (size_t)j * vrow, vrow, 0, &x);
            e = worst(e, x);
            rc = rc ? rc : compare_n(bc, bc->v_lse[j], bc->ref_lse + (size_t)j * vl, vl, 1, &x);
            e = worst(e, x);
        }
    } else {
        /* b is an input that a fused launch overwrites: restore it first. */
        rc = dev->ops->copy_to_device(dev, bc->v_partial, bc->v_partial_init, vrow * bc->es);
        rc = rc ? rc : poison(bc, bc->v_out, vrow * bc->es);
        rc = rc ? rc : poison(bc, bc->v_normed, vrow * bc->es);
        const ar_op_args args = ar_op_phase2(&bc->v_p2);
        rc = rc ? rc : dev->ops->launch(dev, k, &bc->p, bc->tv, &args, NULL);
        rc = rc ? rc : compare_n(bc, bc->v_out, bc->ref_out, vrow, 0, &e);
        if (rc == ATTNRES_OK && bc->p.epilogue) {
            rc = compare_n(bc, bc->v_normed, bc->ref_normed, vrow, 0, &x);
            e = worst(e, x);
        }
        if (rc == ATTNRES_OK && bc->p.fuse_add) {
            rc = compare_n(bc, bc->v_partial, bc->ref_partial, vrow, 0, &x);
            e = worst(e, x);
        }
    }
    *rel_err = e;
    return rc;
}
