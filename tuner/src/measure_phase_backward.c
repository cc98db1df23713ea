/*
 * measure_phase_backward.c - the bench cases of the backwards of Block
 * AttnRes' two phases (DESIGN §1b, ATTNRES_OP_PHASE1_BACKWARD and
 * ATTNRES_OP_PHASE2_BACKWARD): random inputs, the fp64 reference
 * gradients, verification of every gradient and the determinism check,
 * for measure.c, as measure_backward.c does for the mix backward.
 *
 * Phase 1's backward takes the n sources, the S sites' folded queries and
 * every site's gradients of o1 and of lse (all S present, as for a block
 * whose every site has a phase 2), and returns the sources' gradients and
 * the S query gradients. Phase 2's backward takes o1, lse, b, the query
 * and the gradient of out (and of normed, with the epilogue's gain), and
 * returns the gradients of o1, lse and b (and of the sublayer output with
 * the fused add), of the query (and of the gain).
 *
 * The gradients in the storage type are held to the dtype's tolerance;
 * the query gradients, d(out_gain) and dlse are fp32 values computed from
 * the inputs as stored, never rounded to the storage type, so they are
 * held to fp32's 1e-5 whatever the dtype (sums_err, bench_case_judge).
 *
 * Verification runs the kernel twice on the same inputs, its outputs
 * poisoned before each run and its workspace poisoned differently before
 * each, and compares the two runs bit for bit: a kernel whose runs differ
 * is marked nondeterministic and never wins.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "attnres-impl.h"
#include "measure_internal.h"

/* One gradient the kernel writes, for the poisoning, the bit comparison of
 * two runs and the comparison with its reference: its device buffer and
 * bytes, its element size, its reference (count elements), whether it is
 * fp32 (then held to fp32's tolerance whatever the dtype) and per token
 * rather than a sum over tokens, and its shape for naming where two runs
 * first differ (dims[0] x ... = count). */
typedef struct grad_out {
    const char *name;
    void *buf;
    size_t bytes, es, count;
    int f32, per_token;
    const double *ref;
    int ndims;
    size_t dims[3];
    const char *axes[3];
} grad_out;

/* The most gradients a phase backward writes (phase 2 with both options). */
#define PHASE_BW_OUTS 6

/* Random data of the phase backwards. */
#define QUERY_SCALE 4.0 /* queries ~ N(0, 16 / d): scores of order one */

/* A device buffer holding `blocks` blocks of T rows, each block the
 * pattern's tv rows (row_bytes each) repeated: the timing inputs, whose
 * values do not matter, made from the verification rows without a host
 * copy of them all. */
static int upload_tiled_rows(bench_case *bc, const void *pattern, int64_t blocks, size_t row_bytes, void **dst)
{
    const size_t vb = (size_t)bc->tv * row_bytes, tb = (size_t)bc->t * row_bytes;
    int rc = upload(bc, NULL, tb * (size_t)blocks, dst);
    for (int64_t b = 0; rc == ATTNRES_OK && b < blocks; b++)
        for (size_t off = 0; rc == ATTNRES_OK && off < tb; off += vb)
            rc = bc->dev->ops->copy_to_device(bc->dev, (char *)*dst + (size_t)b * tb + off,
                                              (const char *)pattern + (size_t)b * vb, tb - off < vb ? tb - off : vb);
    return rc;
}

/* Converts n fp32 values to the storage type in scratch and uploads them. */
static int upload_rows(bench_case *bc, const float *host, size_t n, void *scratch, void **dst)
{
    convert_to_storage(bc->p.dtype, host, scratch, n);
    return upload(bc, scratch, n * bc->es, dst);
}

/* The end of a case's creation: frees its n host scratch buffers and
 * returns the case, or NULL with the case freed and a message when rc says
 * it failed. */
static bench_case *created(bench_case *bc, int rc, void *const *host, size_t n, char *err, size_t len)
{
    free_each(host, n);
    if (rc == ATTNRES_OK)
        return bc;
    if (!err[0])
        snprintf(err, len, "%s buffers: %s", problem_op_name(bc->p.op),
                 rc == ATTNRES_ENOMEM ? "out of memory" : attnres_device_errmsg(bc->dev));
    bench_phase_backward_free(bc);
    return NULL;
}

/* The workspaces of both sets of rows: the token groups' fp32 rows of the
 * query gradients (d per site) and, with phase 2's epilogue, d(out_gain)'s. */
static int workspaces(bench_case *bc, int64_t row, int epilogue, char *err, size_t len)
{
    ar_backward_ws vws, tws;
    if (ar_mix_backward_workspace(row, bc->tv, epilogue, &vws) ||
        ar_mix_backward_workspace(row, bc->t, epilogue, &tws)) {
        snprintf(err, len, "no workspace size for T = %lld", (long long)bc->t);
        return ATTNRES_EINVAL;
    }
    bc->v_ws_size = vws.bytes;
    bc->t_ws_size = tws.bytes;
    int rc = upload(bc, NULL, bc->v_ws_size, &bc->v_ws);
    return rc ? rc : upload(bc, NULL, bc->t_ws_size, &bc->t_ws);
}

/* Phase 1's backward: sources, queries, the sites' do1 and dlse. */
static bench_case *create_phase1_backward(bench_case *bc, uint64_t s, char *err, size_t len)
{
    const int64_t d = bc->p.d, n = bc->p.n, S = bc->p.s, H = bc->p.heads, tv = bc->tv, t = bc->t;
    const attnres_dtype dt = bc->p.dtype;
    const size_t vrow = (size_t)(tv * d), vl = (size_t)(tv * H), trow = (size_t)(t * d), tl = (size_t)(t * H);
    const size_t es = bc->es, most = (size_t)(n > S ? n : S);
    float *hq = malloc((size_t)(S * d) * 4), *hsrc = malloc(vrow * (size_t)n * 4),
          *hdo1 = malloc(vrow * (size_t)S * 4), *hdl = malloc(vl * (size_t)S * 4);
    double *xq = malloc((size_t)(S * d) * 8), *xsrc = malloc(vrow * (size_t)n * 8),
           *xdo1 = malloc(vrow * (size_t)S * 8), *xdl = malloc(vl * (size_t)S * 8);
    const double **xrows = malloc(sizeof(double *) * (size_t)n);
    double **rrows = malloc(sizeof(double *) * (size_t)n);
    void *store = malloc(vrow * most * es + 4);
    bc->v_rows = calloc((size_t)n, sizeof(void *));
    bc->t_rows = calloc((size_t)n, sizeof(void *));
    bc->v_drows = calloc((size_t)n, sizeof(void *));
    bc->t_drows = calloc((size_t)n, sizeof(void *));
    bc->v_do1_ptrs = calloc((size_t)S, sizeof(void *));
    bc->t_do1_ptrs = calloc((size_t)S, sizeof(void *));
    bc->v_dlse_ptrs = calloc((size_t)S, sizeof(float *));
    bc->t_dlse_ptrs = calloc((size_t)S, sizeof(float *));
    bc->ref_dsrc = malloc(vrow * (size_t)n * 8);
    bc->ref_dquery = malloc((size_t)(S * d) * 8);
    int rc = hq && hsrc && hdo1 && hdl && xq && xsrc && xdo1 && xdl && xrows && rrows && store && bc->v_rows &&
                     bc->t_rows && bc->v_drows && bc->t_drows && bc->v_do1_ptrs && bc->t_do1_ptrs &&
                     bc->v_dlse_ptrs && bc->t_dlse_ptrs && bc->ref_dsrc && bc->ref_dquery
                 ? ATTNRES_OK
                 : ATTNRES_ENOMEM;
    if (rc == ATTNRES_OK) {
        for (int64_t k = 0; k < S * d; k++)
            xq[k] = hq[k] = (float)(normal(&s) / sqrt((double)d) * QUERY_SCALE);
        random_rows(&s, dt, n * tv, d, hsrc, xsrc, 1);
        random_rows(&s, dt, S * tv, d, hdo1, xdo1, 0);
        /* dlse as phase 2's backward gives it, -p2 (1 - p2) <G, b - o1>
         * per head: of the order of a head's dot of two rows. */
        const double dl_scale = sqrt((double)(d / H)) / 4.0;
        for (size_t e = 0; e < vl * (size_t)S; e++)
            xdl[e] = hdl[e] = (float)(normal(&s) * dl_scale);
        for (int64_t i = 0; i < n; i++) {
            xrows[i] = xsrc + (size_t)i * vrow;
            rrows[i] = bc->ref_dsrc + (size_t)i * vrow;
        }
        attnres_problem fwd = bc->p;
        fwd.op = ATTNRES_OP_PHASE1;
        char msg[256];
        rc = attnres_reference_phase1_backward(&fwd, tv, xrows, xq, 1.0, 1e-6, xdo1, xdl, 0, rrows, bc->ref_dquery,
                                               msg, sizeof msg);
        if (rc != ATTNRES_OK)
            snprintf(err, len, "reference failed: %s", msg);
    }
    rc = rc ? rc : workspaces(bc, d * S, 0, err, len);
    rc = rc ? rc : upload(bc, hq, (size_t)(S * d) * 4, (void **)&bc->query);
    rc = rc ? rc : upload_rows(bc, hsrc, vrow * (size_t)n, store, &bc->v_src);
    rc = rc ? rc : upload_tiled_rows(bc, store, n, (size_t)d * es, &bc->t_src);
    rc = rc ? rc : upload_rows(bc, hdo1, vrow * (size_t)S, store, &bc->v_site_do1);
    rc = rc ? rc : upload_tiled_rows(bc, store, S, (size_t)d * es, &bc->t_site_do1);
    rc = rc ? rc : upload(bc, hdl, vl * (size_t)S * 4, (void **)&bc->v_site_dlse);
    rc = rc ? rc : upload_tiled_rows(bc, hdl, S, (size_t)H * 4, (void **)&bc->t_site_dlse);
    rc = rc ? rc : upload(bc, NULL, vrow * (size_t)n * es, &bc->v_dsrc);
    rc = rc ? rc : upload(bc, NULL, trow * (size_t)n * es, &bc->t_dsrc);
    rc = rc ? rc : upload(bc, NULL, (size_t)(S * d) * 4, (void **)&bc->v_dquery);
    rc = rc ? rc : upload(bc, NULL, (size_t)(S * d) * 4, (void **)&bc->t_dquery);
    if (rc == ATTNRES_OK) {
        for (int64_t i = 0; i < n; i++) {
            bc->v_rows[i] = (const char *)bc->v_src + (size_t)i * vrow * es;
            bc->t_rows[i] = (const char *)bc->t_src + (size_t)i * trow * es;
            bc->v_drows[i] = (char *)bc->v_dsrc + (size_t)i * vrow * es;
            bc->t_drows[i] = (char *)bc->t_dsrc + (size_t)i * trow * es;
        }
        for (int64_t j = 0; j < S; j++) {
            bc->v_do1_ptrs[j] = (const char *)bc->v_site_do1 + (size_t)j * vrow * es;
            bc->t_do1_ptrs[j] = (const char *)bc->t_site_do1 + (size_t)j * trow * es;
            bc->v_dlse_ptrs[j] = bc->v_site_dlse + (size_t)j * vl;
            bc->t_dlse_ptrs[j] = bc->t_site_dlse + (size_t)j * tl;
        }
        attnres_phase1_backward_args *a[2] = {&bc->v_p1b, &bc->t_p1b};
        for (int w = 0; w < 2; w++) {
            attnres_phase1_backward_args_init(a[w]);
            a[w]->sources = w ? bc->t_rows : bc->v_rows;
            a[w]->queries = bc->query;
            a[w]->do1 = w ? bc->t_do1_ptrs : bc->v_do1_ptrs;
            a[w]->dlse = w ? bc->t_dlse_ptrs : bc->v_dlse_ptrs;
            a[w]->dsources = w ? bc->t_drows : bc->v_drows;
            a[w]->dqueries = w ? bc->t_dquery : bc->v_dquery;
            a[w]->workspace = w ? bc->t_ws : bc->v_ws;
            a[w]->workspace_size = w ? bc->t_ws_size : bc->v_ws_size;
        }
    }
    void *const host[] = {hq, hsrc, hdo1, hdl, xq, xsrc, xdo1, xdl, (void *)xrows, (void *)rrows, store};
    return created(bc, rc, host, MEASURE_COUNT(host), err, len);
}

/* Phase 2's backward: o1, lse, b, the query, dout (and the epilogue's gain
 * and dnormed). b stands for the partial sum as the forward used it (with
 * fuse_add, b + f): the backward reads no sublayer output. */
static bench_case *create_phase2_backward(bench_case *bc, uint64_t s, char *err, size_t len)
{
    const int64_t d = bc->p.d, H = bc->p.heads, tv = bc->tv, t = bc->t;
    const attnres_dtype dt = bc->p.dtype;
    const int epi = bc->p.epilogue, fuse = bc->p.fuse_add;
    const size_t vrow = (size_t)(tv * d), vl = (size_t)(tv * H), trow = (size_t)(t * d), tl = (size_t)(t * H);
    const size_t es = bc->es, row_bytes = (size_t)d * es;
    float *ho1 = malloc(vrow * 4), *hb = malloc(vrow * 4), *hdo = malloc(vrow * 4), *hdn = malloc(vrow * 4),
          *hl = malloc(vl * 4), *hq = malloc((size_t)d * 4), *hog = malloc((size_t)d * 4);
    double *xo1 = malloc(vrow * 8), *xb = malloc(vrow * 8), *xdo = malloc(vrow * 8), *xdn = malloc(vrow * 8),
           *xl = malloc(vl * 8), *xq = malloc((size_t)d * 8), *xog = malloc((size_t)d * 8);
    void *store = malloc(vrow * es + 4);
    bc->ref_do1 = malloc(vrow * 8);
    bc->ref_dlse = malloc(vl * 8);
    bc->ref_dpartial = malloc(vrow * 8);
    bc->ref_dquery = malloc((size_t)d * 8);
    bc->ref_dgout = malloc((size_t)d * 8);
    int rc = ho1 && hb && hdo && hdn && hl && hq && hog && xo1 && xb && xdo && xdn && xl && xq && xog && store &&
                     bc->ref_do1 && bc->ref_dlse && bc->ref_dpartial && bc->ref_dquery && bc->ref_dgout
                 ? ATTNRES_OK
                 : ATTNRES_ENOMEM;
    if (rc == ATTNRES_OK) {
        for (int64_t k = 0; k < d; k++) {
            xq[k] = hq[k] = (float)(normal(&s) / sqrt((double)d) * QUERY_SCALE);
            xog[k] = hog[k] = (float)(1.0 + 0.2 * normal(&s));
        }
        random_rows(&s, dt, tv, d, ho1, xo1, 1);
        random_rows(&s, dt, tv, d, hb, xb, 1);
        random_rows(&s, dt, tv, d, hdo, xdo, 0);
        random_rows(&s, dt, tv, d, hdn, xdn, 0);
        /* An lse as phase 1 gives it: scores of order one over ~9 sources. */
        for (size_t i = 0; i < vl; i++)
            xl[i] = hl[i] = (float)(normal(&s) + log(9.0));
        attnres_problem fwd = bc->p;
        fwd.op = ATTNRES_OP_PHASE2;
        char msg[256];
        /* dsublayer's values are db's (attnres.h): it is compared with them. */
        rc = attnres_reference_phase2_backward(&fwd, tv, xo1, xl, xb, xq, 1.0, 1e-6, epi ? xog : NULL, 1e-6, xdo,
                                               epi ? xdn : NULL, 0, bc->ref_do1, bc->ref_dlse, bc->ref_dpartial, NULL,
                                               bc->ref_dquery, epi ? bc->ref_dgout : NULL, msg, sizeof msg);
        if (rc != ATTNRES_OK)
            snprintf(err, len, "reference failed: %s", msg);
    }
    rc = rc ? rc : workspaces(bc, d, epi, err, len);
    rc = rc ? rc : upload(bc, hq, (size_t)d * 4, (void **)&bc->query);
    rc = rc ? rc : upload(bc, hl, vl * 4, &bc->v_lse_in);
    rc = rc ? rc : upload_tiled_rows(bc, hl, 1, (size_t)H * 4, &bc->t_lse_in);
    rc = rc ? rc : upload_rows(bc, ho1, vrow, store, &bc->v_src);
    rc = rc ? rc : upload_tiled_rows(bc, store, 1, row_bytes, &bc->t_src);
    rc = rc ? rc : upload_rows(bc, hb, vrow, store, &bc->v_partial);
    rc = rc ? rc : upload_tiled_rows(bc, store, 1, row_bytes, &bc->t_partial);
    rc = rc ? rc : upload_rows(bc, hdo, vrow, store, &bc->v_dout);
    rc = rc ? rc : upload_tiled_rows(bc, store, 1, row_bytes, &bc->t_dout);
    if (epi) {
        rc = rc ? rc : upload(bc, hog, (size_t)d * 4, (void **)&bc->out_gain);
        rc = rc ? rc : upload_rows(bc, hdn, vrow, store, &bc->v_dnormed);
        rc = rc ? rc : upload_tiled_rows(bc, store, 1, row_bytes, &bc->t_dnormed);
        rc = rc ? rc : upload(bc, NULL, (size_t)d * 4, (void **)&bc->v_dgout);
        rc = rc ? rc : upload(bc, NULL, (size_t)d * 4, (void **)&bc->t_dgout);
    }
    rc = rc ? rc : upload(bc, NULL, vrow * es, &bc->v_do1);
    rc = rc ? rc : upload(bc, NULL, trow * es, &bc->t_do1);
    rc = rc ? rc : upload(bc, NULL, vl * 4, (void **)&bc->v_dlse);
    rc = rc ? rc : upload(bc, NULL, tl * 4, (void **)&bc->t_dlse);
    rc = rc ? rc : upload(bc, NULL, vrow * es, &bc->v_dpartial);
    rc = rc ? rc : upload(bc, NULL, trow * es, &bc->t_dpartial);
    if (fuse) {
        rc = rc ? rc : upload(bc, NULL, vrow * es, &bc->v_dsub);
        rc = rc ? rc : upload(bc, NULL, trow * es, &bc->t_dsub);
    }
    rc = rc ? rc : upload(bc, NULL, (size_t)d * 4, (void **)&bc->v_dquery);
    rc = rc ? rc : upload(bc, NULL, (size_t)d * 4, (void **)&bc->t_dquery);
    if (rc == ATTNRES_OK) {
        attnres_phase2_backward_args *a[2] = {&bc->v_p2b, &bc->t_p2b};
        for (int w = 0; w < 2; w++) {
            attnres_phase2_backward_args_init(a[w]);
            a[w]->o1 = w ? bc->t_src : bc->v_src;
            a[w]->lse = w ? bc->t_lse_in : bc->v_lse_in;
            a[w]->partial = w ? bc->t_partial : bc->v_partial;
            a[w]->query = bc->query;
            a[w]->dout = w ? bc->t_dout : bc->v_dout;
            if (epi) {
                a[w]->out_gain = bc->out_gain;
                a[w]->dnormed = w ? bc->t_dnormed : bc->v_dnormed;
                a[w]->dout_gain = w ? bc->t_dgout : bc->v_dgout;
            }
            a[w]->do1 = w ? bc->t_do1 : bc->v_do1;
            a[w]->dlse = w ? bc->t_dlse : bc->v_dlse;
            a[w]->dpartial = w ? bc->t_dpartial : bc->v_dpartial;
            a[w]->dsublayer = fuse ? (w ? bc->t_dsub : bc->v_dsub) : NULL;
            a[w]->dquery = w ? bc->t_dquery : bc->v_dquery;
            a[w]->workspace = w ? bc->t_ws : bc->v_ws;
            a[w]->workspace_size = w ? bc->t_ws_size : bc->v_ws_size;
        }
    }
    void *const host[] = {ho1, hb, hdo, hdn, hl, hq, hog, xo1, xb, xdo, xdn, xl, xq, xog, store};
    return created(bc, rc, host, MEASURE_COUNT(host), err, len);
}

/* Whether every buffer of the case has a size that fits size_t: rows of
 * T tokens (and of the verified ones) for the most row sets either op
 * keeps (n sources or S sites, or phase 2's one), 8 bytes an element at
 * most (the host's fp64 reference). */
static int sizes_fit(const bench_case *bc)
{
    const uint64_t sets = (uint64_t)(bc->p.n > bc->p.s ? bc->p.n : bc->p.s), d = (uint64_t)bc->p.d;
    uint64_t x;
    for (int w = 0; w < 2; w++)
        if (__builtin_mul_overflow((uint64_t)(w ? bc->t : bc->tv), d, &x) || __builtin_mul_overflow(x, sets, &x) ||
            __builtin_mul_overflow(x, (uint64_t)8, &x) || x > (uint64_t)SIZE_MAX / 2)
            return 0;
    return 1;
}

bench_case *bench_phase_backward_create(bench_case *bc, uint64_t seed, char *err, size_t err_len)
{
    err[0] = '\0';
    if (!sizes_fit(bc)) {
        snprintf(err, err_len, "the buffers of %s at T = %lld do not fit the address space", problem_op_name(bc->p.op),
                 (long long)bc->t);
        free(bc);
        return NULL;
    }
    return bc->p.op == ATTNRES_OP_PHASE1_BACKWARD ? create_phase1_backward(bc, seed, err, err_len)
                                                  : create_phase2_backward(bc, seed, err, err_len);
}

void bench_phase_backward_free(bench_case *bc)
{
    if (!bc)
        return;
    void *const dev_bufs[] = {bc->query,     bc->out_gain,    bc->v_src,       bc->t_src,       bc->v_site_do1,
                              bc->t_site_do1, bc->v_site_dlse, bc->t_site_dlse, bc->v_dsrc,     bc->t_dsrc,
                              bc->v_dquery,  bc->t_dquery,    bc->v_ws,        bc->t_ws,        bc->v_lse_in,
                              bc->t_lse_in,  bc->v_partial,   bc->t_partial,   bc->v_dout,      bc->t_dout,
                              bc->v_dnormed, bc->t_dnormed,   bc->v_dgout,     bc->t_dgout,     bc->v_do1,
                              bc->t_do1,     bc->v_dlse,      bc->t_dlse,      bc->v_dpartial,  bc->t_dpartial,
                              bc->v_dsub,    bc->t_dsub};
    device_free_each(bc, dev_bufs, MEASURE_COUNT(dev_bufs));
    void *const host[] = {bc->v_rows,      bc->t_rows,      (void *)bc->v_do1_ptrs, (void *)bc->t_do1_ptrs,
                          (void *)bc->v_dlse_ptrs, (void *)bc->t_dlse_ptrs, bc->v_drows, bc->t_drows,
                          bc->ref_dsrc,    bc->ref_dquery,  bc->ref_do1,     bc->ref_dlse,
                          bc->ref_dpartial, bc->ref_dgout,  bc};
    free_each(host, MEASURE_COUNT(host));
}

/* The gradients of the case's verification launch, in a fixed order:
 * their count. */
static int gradients(const bench_case *bc, grad_out *g)
{
    const size_t d = (size_t)bc->p.d, tv = (size_t)bc->tv, es = bc->es;
    int k = 0;
    if (bc->p.op == ATTNRES_OP_PHASE1_BACKWARD) {
        const size_t n = (size_t)bc->p.n, S = (size_t)bc->p.s;
        g[k++] = (grad_out){"dsources", bc->v_dsrc, n * tv * d * es, es, n * tv * d, 0, 0, bc->ref_dsrc,
                            3, {n, tv, d}, {"source", "token", "element"}};
        g[k++] = (grad_out){"dqueries", bc->v_dquery, S * d * 4, 4, S * d, 1, 0, bc->ref_dquery,
                            2, {S, d}, {"site", "element"}};
        return k;
    }
    const size_t H = (size_t)bc->p.heads;
    g[k++] = (grad_out){"do1", bc->v_do1, tv * d * es, es, tv * d, 0, 0, bc->ref_do1,
                        2, {tv, d}, {"token", "element"}};
    g[k++] = (grad_out){"dlse", bc->v_dlse, tv * H * 4, 4, tv * H, 1, 1, bc->ref_dlse,
                        2, {tv, H}, {"token", "head"}};
    g[k++] = (grad_out){"dpartial", bc->v_dpartial, tv * d * es, es, tv * d, 0, 0, bc->ref_dpartial,
                        2, {tv, d}, {"token", "element"}};
    if (bc->p.fuse_add) /* the same values as dpartial */
        g[k++] = (grad_out){"dsublayer", bc->v_dsub, tv * d * es, es, tv * d, 0, 0, bc->ref_dpartial,
                            2, {tv, d}, {"token", "element"}};
    g[k++] = (grad_out){"dquery", bc->v_dquery, d * 4, 4, d, 1, 0, bc->ref_dquery, 1, {d}, {"element"}};
    if (bc->p.epilogue)
        g[k++] = (grad_out){"dout_gain", bc->v_dgout, d * 4, 4, d, 1, 0, bc->ref_dgout, 1, {d}, {"element"}};
    return k;
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

/* Appends to out one gradient's share of the difference between two runs:
 * how many of its values differ and where the first is, its index split
 * along the gradient's axes ("site 2, element 17"). Nothing when its
 * bytes agree. */
static void describe_gradient(char *out, size_t len, const grad_out *g, const char *a, const char *b)
{
    if (memcmp(a, b, g->bytes) == 0)
        return;
    size_t differ = 0, first = 0;
    for (size_t i = g->count; i-- > 0;)
        if (memcmp(a + i * g->es, b + i * g->es, g->es) != 0) {
            differ++;
            first = i;
        }
    char where[128] = "";
    size_t used_w = 0, rest = first, stride = g->count;
    for (int x = 0; x < g->ndims && used_w < sizeof where; x++) {
        stride /= g->dims[x];
        int w = snprintf(where + used_w, sizeof where - used_w, "%s%s %zu", x ? ", " : "", g->axes[x], rest / stride);
        used_w += w > 0 ? (size_t)w : 0;
        rest %= stride;
    }
    const size_t used = strlen(out);
    if (used + 1 < len)
        snprintf(out + used, len - used, "%s%s (%zu of %zu values, first at %s)", used ? ", " : "", g->name, differ,
                 g->count, where);
}

int bench_phase_backward_verify(bench_case *bc, const ar_kernel *k, double *rel_err)
{
    grad_out g[PHASE_BW_OUTS];
    const int count = gradients(bc, g);
    size_t all = 0;
    for (int i = 0; i < count; i++)
        all += g[i].bytes;
    char *first = malloc(all + 4), *second = malloc(all + 4);
    int rc = first && second ? ATTNRES_OK : ATTNRES_ENOMEM;
    const ar_op_args args = bc->p.op == ATTNRES_OP_PHASE1_BACKWARD ? ar_op_phase1_backward(&bc->v_p1b)
                                                                   : ar_op_phase2_backward(&bc->v_p2b);
    for (int run = 0; run < 2 && rc == ATTNRES_OK; run++) {
        /* All-ones bytes are NaN in every dtype: a skipped element fails.
         * The workspace gets a different poison on each run, so that a
         * kernel that reads a partial sum before writing it differs. */
        for (int i = 0; i < count && rc == ATTNRES_OK; i++)
            rc = fill(bc, g[i].buf, g[i].bytes, 0xff);
        rc = rc ? rc : fill(bc, bc->v_ws, bc->v_ws_size, run ? 0x3c : 0xa5);
        rc = rc ? rc : bc->dev->ops->launch(bc->dev, k, &bc->p, bc->tv, &args, NULL);
        char *host = run ? second : first;
        for (int i = 0; i < count && rc == ATTNRES_OK; i++) {
            rc = bc->dev->ops->copy_to_host(bc->dev, host, g[i].buf, g[i].bytes);
            host += g[i].bytes;
        }
    }
    if (rc == ATTNRES_OK && memcmp(first, second, all) != 0) {
        /* The message names the gradients that differ: a sum over tokens
         * (the query gradients, dout_gain) points at the workspace or the
         * group order, a per-token one at a race in the kernel. */
        bc->difference[0] = '\0';
        bc->nondeterministic = 1;
        size_t off = 0;
        for (int i = 0; i < count; i++) {
            describe_gradient(bc->difference, sizeof bc->difference, &g[i], first + off, second + off);
            off += g[i].bytes;
        }
    }
    free(first);
    free(second);
    if (rc != ATTNRES_OK)
        return rc;
    /* Per gradient: the worst relative error of any; the fp32 ones also
     * the worst of them, held to fp32's tolerance (bench_case_judge). */
    double worst = 0;
    for (int i = 0; i < count && rc == ATTNRES_OK; i++) {
        double e = 0;
        rc = compare_n(bc, g[i].buf, g[i].ref, g[i].count, g[i].f32, &e);
        worst = isnan(e) || e > worst ? e : worst;
        if (g[i].f32 && (isnan(e) || e > bc->sums_err || !bc->sums_name)) {
            bc->sums_err = e;
            bc->sums_name = g[i].name;
            bc->sums_per_token = g[i].per_token;
        }
    }
    *rel_err = isnan(worst) ? NAN : worst;
    return rc;
}
