/* measure.c - see measure.h. */
#include "measure.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert.h"
#include "measure_internal.h"

void measure_policy_default(measure_policy *p, const attnres_device *dev)
{
    int gpu = strcmp(dev->backend, "cpu") != 0;
    p->warmup = gpu ? 10 : 2;
    p->min_reps = gpu ? 20 : 5;
    p->max_reps = gpu ? 200 : 50;
    p->target_ms = gpu ? 50.0 : 150.0;
    p->flush = gpu;
    p->verify_tokens = 67; /* not a multiple of any split, crosses chunk edges */
    p->simulated = dev->simulated;
    if (p->simulated) {
        /* A simulated device's event times are a deterministic model, so
         * repeating a launch adds no information, and each launch is
         * interpreted on the CPU (slow): a warm-up and three repetitions,
         * and no L2 flush, which the model does not see. */
        p->warmup = 1;
        p->min_reps = p->max_reps = 3;
        p->flush = 0;
    }
}

void measure_policy_json(const measure_policy *p, char *buf, size_t len)
{
    snprintf(buf, len,
             "{\"warmup\":%d,\"min_reps\":%d,\"max_reps\":%d,\"target_ms\":%.1f,\"flush\":%s,"
             "\"statistic\":\"median\",\"spread\":\"median_abs_deviation\",\"verify_tokens\":%lld%s}",
             p->warmup, p->min_reps, p->max_reps, p->target_ms, p->flush ? "true" : "false",
             (long long)p->verify_tokens, p->simulated ? ",\"simulated\":true" : "");
}


/* splitmix64: small, fast and good enough for test data. */
uint64_t next_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double uniform(uint64_t *s) { return (double)(next_u64(s) >> 11) * 0x1.0p-53; }

double normal(uint64_t *s)
{
    double u = uniform(s), v = uniform(s);
    return sqrt(-2.0 * log(u + 1e-300)) * cos(2.0 * M_PI * v);
}

/* Allocates on the device and copies host bytes there. */
int upload(bench_case *bc, const void *host, size_t bytes, void **dst)
{
    int rc = bc->dev->ops->mem_alloc(bc->dev, bytes, dst);
    if (rc == ATTNRES_OK && host)
        rc = bc->dev->ops->copy_to_device(bc->dev, *dst, host, bytes);
    return rc;
}

void free_each(void *const *ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(ptrs[i]);
}

void device_free_each(bench_case *bc, void *const *bufs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (bufs[i])
            bc->dev->ops->mem_free(bc->dev, bufs[i]);
}

/* Fills n rows of d values, each row scaled by 10^U(-1,1), rounded to the
 * dtype; the rounded values also go to `exact` as doubles. */
void random_rows(uint64_t *s, attnres_dtype dt, int64_t rows, int64_t d, float *f32, double *exact,
                        int vary_rows)
{
    for (int64_t r = 0; r < rows; r++) {
        double scale = vary_rows ? pow(10.0, 2.0 * uniform(s) - 1.0) : 1.0;
        for (int64_t k = 0; k < d; k++)
            f32[r * d + k] = (float)(scale * normal(s));
    }
    /* Round through the storage type so the reference sees what the
     * kernel sees. */
    size_t n = (size_t)(rows * d);
    void *tmp = malloc(n * 4);
    if (tmp) {
        convert_to_storage(dt, f32, tmp, n);
        convert_from_storage(dt, tmp, f32, n);
        free(tmp);
    }
    if (exact)
        for (size_t i = 0; i < n; i++)
            exact[i] = f32[i];
}

static void fill_args(bench_case *bc, attnres_mix_args *a, void *src, const void **rows, int64_t t, void *partial,
                      void *out, void *normed)
{
    attnres_mix_args_init(a);
    for (int i = 0; i < bc->p.n; i++)
        rows[i] = (const char *)src + (size_t)i * (size_t)t * (size_t)bc->p.d * bc->es;
    a->sources = rows;
    a->query = bc->query;
    a->eps = 1e-6f;
    a->partial = partial;
    a->alpha = 0.75f;
    a->out = out;
    a->out_gain = bc->out_gain;
    a->out_eps = 1e-6f;
    a->normed = normed;
}

bench_case *bench_case_create(attnres_device *dev, const tune_problem *tp, const measure_policy *pol, uint64_t seed,
                              char *err, size_t err_len)
{
    bench_case *bc = calloc(1, sizeof *bc);
    if (!bc) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    bc->dev = dev;
    bc->p = tp->p;
    bc->t = tp->t;
    bc->tv = tp->t < pol->verify_tokens ? tp->t : pol->verify_tokens;
    bc->es = attnres_dtype_size(tp->p.dtype);
    if (bc->p.op == ATTNRES_OP_MIX_BACKWARD)
        return bench_backward_create(bc, seed, err, err_len);
    if (bc->p.op == ATTNRES_OP_PHASE1_BACKWARD || bc->p.op == ATTNRES_OP_PHASE2_BACKWARD)
        return bench_phase_backward_create(bc, seed, err, err_len);
    if (bc->p.op != ATTNRES_OP_MIX)
        return bench_phase_create(bc, pol, seed, err, err_len);
    const int64_t d = bc->p.d, n = bc->p.n, tv = bc->tv, t = bc->t;
    const attnres_dtype dt = bc->p.dtype;
    const size_t vrow = (size_t)(tv * d), trow = (size_t)(t * d);
    uint64_t s = seed;
    float *hq = malloc((size_t)d * 4), *hg = malloc((size_t)d * 4);
    float *hsrc = malloc(vrow * (size_t)n * 4), *hpart = malloc(vrow * 4);
    double *xsrc = malloc(vrow * (size_t)n * 8), *xpart = malloc(vrow * 8), *xq = malloc((size_t)d * 8),
           *xg = malloc((size_t)d * 8);
    void *store = malloc((trow > vrow ? trow : vrow) * (size_t)n * bc->es + 64);
    const double **xrows = malloc(sizeof(double *) * (size_t)n);
    bc->v_rows = malloc(sizeof(void *) * (size_t)n);
    bc->t_rows = malloc(sizeof(void *) * (size_t)n);
    bc->ref_out = malloc(vrow * 8);
    bc->ref_normed = malloc(vrow * 8);
    bc->host_out = malloc(vrow * 4 + 4);
    int ok = hq && hg && hsrc && hpart && xsrc && xpart && xq && xg && store && xrows && bc->v_rows && bc->t_rows &&
             bc->ref_out && bc->ref_normed && bc->host_out;
    if (!ok) {
        snprintf(err, err_len, "out of host memory for T = %lld", (long long)t);
        goto fail;
    }
    /* Query ~ N(0, 1/d): scores of order one, as trained pseudo-queries give. */
    for (int64_t k = 0; k < d; k++) {
        hq[k] = (float)(normal(&s) / sqrt((double)d) * 4.0);
        hg[k] = (float)(1.0 + 0.1 * normal(&s));
        xq[k] = hq[k];
        xg[k] = hg[k];
    }
    random_rows(&s, dt, n * tv, d, hsrc, xsrc, 1);
    random_rows(&s, dt, tv, d, hpart, xpart, 0);
    for (int i = 0; i < n; i++)
        xrows[i] = xsrc + (size_t)i * vrow;
    int rc = attnres_reference_mix(&bc->p, tv, xrows, xq, 1.0, 1e-6, xpart, 0.75, xg, 1e-6, bc->ref_out,
                                   bc->ref_normed);
    if (rc != ATTNRES_OK) {
        snprintf(err, err_len, "reference failed: %s", attnres_errstr(rc));
        goto fail;
    }
    /* Device copies: verification inputs, then timing inputs (the
     * verification data tiled to T tokens; the values do not matter). */
    convert_to_storage(dt, hsrc, store, vrow * (size_t)n);
    rc = upload(bc, hq, (size_t)d * 4, (void **)&bc->query);
    rc = rc ? rc : upload(bc, hg, (size_t)d * 4, (void **)&bc->out_gain);
    rc = rc ? rc : upload(bc, store, vrow * (size_t)n * bc->es, &bc->v_src);
    convert_to_storage(dt, hpart, store, vrow);
    rc = rc ? rc : upload(bc, store, vrow * bc->es, &bc->v_partial);
    rc = rc ? rc : upload(bc, NULL, vrow * bc->es, &bc->v_out);
    rc = rc ? rc : upload(bc, NULL, vrow * bc->es, &bc->v_normed);
    for (int64_t r = 0; r < n * t; r++)
        convert_to_storage(dt, hsrc + (size_t)((r % (n * tv)) * d), (char *)store + (size_t)(r * d) * bc->es,
                           (size_t)d);
    rc = rc ? rc : upload(bc, store, trow * (size_t)n * bc->es, &bc->t_src);
    rc = rc ? rc : upload(bc, store, trow * bc->es, &bc->t_partial);
    rc = rc ? rc : upload(bc, NULL, trow * bc->es, &bc->t_out);
    rc = rc ? rc : upload(bc, NULL, trow * bc->es, &bc->t_normed);
    if (rc != ATTNRES_OK) {
        snprintf(err, err_len, "device buffers: %s", attnres_device_errmsg(dev));
        goto fail;
    }
    int add = bc->p.form == ATTNRES_FORM_ADDITIVE, epi = bc->p.epilogue;
    fill_args(bc, &bc->v_args, bc->v_src, bc->v_rows, tv, add ? bc->v_partial : NULL, bc->v_out,
              epi ? bc->v_normed : NULL);
    fill_args(bc, &bc->t_args, bc->t_src, bc->t_rows, t, add ? bc->t_partial : NULL, bc->t_out,
              epi ? bc->t_normed : NULL);
    goto done;
fail:
    bench_case_free(bc);
    bc = NULL;
done:;
    void *const host[] = {hq, hg, hsrc, hpart, xsrc, xpart, xq, xg, store, (void *)xrows};
    free_each(host, MEASURE_COUNT(host));
    return bc;
}

void bench_case_free(bench_case *bc)
{
    if (!bc)
        return;
    if (bc->p.op == ATTNRES_OP_MIX_BACKWARD) {
        bench_backward_free(bc);
        return;
    }
    if (bc->p.op == ATTNRES_OP_PHASE1_BACKWARD || bc->p.op == ATTNRES_OP_PHASE2_BACKWARD) {
        bench_phase_backward_free(bc);
        return;
    }
    if (bc->p.op != ATTNRES_OP_MIX) {
        bench_phase_free(bc);
        return;
    }
    void *const dev_bufs[] = {bc->v_src, bc->v_partial, bc->v_out, bc->v_normed, bc->t_src,
                              bc->t_partial, bc->t_out, bc->t_normed, bc->query, bc->out_gain};
    device_free_each(bc, dev_bufs, MEASURE_COUNT(dev_bufs));
    void *const host[] = {bc->v_rows, bc->t_rows, bc->ref_out, bc->ref_normed, bc->host_out, bc};
    free_each(host, MEASURE_COUNT(host));
}

double bench_case_bytes(const bench_case *bc)
{
    tune_problem tp = {bc->p, bc->t};
    return problem_bytes(&tp);
}

void bench_case_traffic(const bench_case *bc, double *read_bytes, double *write_bytes)
{
    tune_problem tp = {bc->p, bc->t};
    problem_traffic(&tp, read_bytes, write_bytes);
}

int bench_case_nondeterministic(const bench_case *bc) { return bc->nondeterministic; }

const char *bench_case_difference(const bench_case *bc) { return bc->nondeterministic ? bc->difference : ""; }

double bench_case_tolerance(const bench_case *bc) { return bc->p.dtype == ATTNRES_DTYPE_F32 ? 1e-5 : 1e-2; }

ardb_status bench_case_judge(const bench_case *bc, double rel_err, char *why, size_t why_len)
{
    const double tol = bench_case_tolerance(bc), sums_tol = 1e-5;
    why[0] = '\0';
    if (bc->nondeterministic) {
        snprintf(why, why_len, "two runs on the same inputs differ in %s (relative error against the reference %.3g)",
                 bc->difference, rel_err);
        return ARDB_STATUS_NONDETERMINISTIC;
    }
    if (!(rel_err <= tol)) { /* NaN never passes */
        snprintf(why, why_len, "relative error %.3g exceeds %.0e", rel_err, tol);
        return ARDB_STATUS_WRONG_RESULT;
    }
    /* An fp32 sum of products of the inputs as stored: the storage type's
     * rounding never enters it, so at bf16's 1e-2 a 1% error would pass. */
    if (bc->sums_name && !(bc->sums_err <= sums_tol)) {
        snprintf(why, why_len, "%s relative error %.3g exceeds %.0e (%s, whatever the dtype)", bc->sums_name,
                 bc->sums_err, sums_tol,
                 bc->sums_per_token ? "fp32 per token, from the inputs as stored" : "an fp32 sum over tokens");
        return ARDB_STATUS_WRONG_RESULT;
    }
    return ARDB_STATUS_OK;
}

int compare_n(bench_case *bc, const void *dev_buf, const double *ref, size_t n, int f32, double *err)
{
    size_t es = f32 ? 4 : bc->es;
    void *tmp = malloc(n * es + 4);
    float *wide = malloc(n * 4 + 4);
    int rc = tmp && wide ? ATTNRES_OK : ATTNRES_ENOMEM;
    if (rc == ATTNRES_OK)
        rc = bc->dev->ops->copy_to_host(bc->dev, tmp, dev_buf, n * es);
    if (rc == ATTNRES_OK) {
        convert_from_storage(f32 ? ATTNRES_DTYPE_F32 : bc->p.dtype, tmp, wide, n);
        double num = 0, den = 0;
        for (size_t i = 0; i < n; i++) {
            double diff = (double)wide[i] - ref[i];
            num += diff * diff;
            den += ref[i] * ref[i];
        }
        *err = isnan(num) ? NAN : sqrt(num) / (sqrt(den) + 1e-300);
    }
    free(tmp);
    free(wide);
    return rc;
}

int bench_case_verify(bench_case *bc, const ar_kernel *k, double *rel_err)
{
    *rel_err = NAN;
    bc->nondeterministic = 0;
    bc->difference[0] = '\0';
    bc->sums_err = 0;
    bc->sums_name = NULL;
    bc->sums_per_token = 0;
    if (bc->p.op == ATTNRES_OP_MIX_BACKWARD)
        return bench_backward_verify(bc, k, rel_err);
    if (bc->p.op == ATTNRES_OP_PHASE1_BACKWARD || bc->p.op == ATTNRES_OP_PHASE2_BACKWARD)
        return bench_phase_backward_verify(bc, k, rel_err);
    if (bc->p.op != ATTNRES_OP_MIX)
        return bench_phase_verify(bc, k, rel_err);
    size_t bytes = (size_t)(bc->tv * bc->p.d) * bc->es;
    /* Poison the outputs: all-ones bytes are NaN in every dtype, so a
     * kernel that skips an element can never pass. */
    void *poison = malloc(bytes + 4);
    if (!poison)
        return ATTNRES_ENOMEM;
    memset(poison, 0xff, bytes);
    int rc = bc->dev->ops->copy_to_device(bc->dev, bc->v_out, poison, bytes);
    if (rc == ATTNRES_OK)
        rc = bc->dev->ops->copy_to_device(bc->dev, bc->v_normed, poison, bytes);
    free(poison);
    if (rc != ATTNRES_OK)
        return rc;
    const ar_op_args args = ar_op_mix(&bc->v_args);
    rc = bc->dev->ops->launch(bc->dev, k, &bc->p, bc->tv, &args, NULL);
    if (rc != ATTNRES_OK)
        return rc;
    double e1 = 0, e2 = 0;
    size_t n = (size_t)(bc->tv * bc->p.d);
    rc = compare_n(bc, bc->v_out, bc->ref_out, n, 0, &e1);
    if (rc == ATTNRES_OK && bc->p.epilogue)
        rc = compare_n(bc, bc->v_normed, bc->ref_normed, n, 0, &e2);
    *rel_err = (isnan(e1) || isnan(e2)) ? NAN : (e1 > e2 ? e1 : e2);
    return rc;
}

/* Times reps launches of whichever operation the case holds, on its timing
 * buffers (all T tokens), through the device's op-generic time slot. */
static int time_launches(bench_case *bc, const ar_kernel *k, int reps, int flush, double *times_us)
{
    ar_op_args args = ar_op_mix(&bc->t_args);
    if (bc->p.op == ATTNRES_OP_PHASE1)
        args = ar_op_phase1(&bc->t_p1);
    else if (bc->p.op == ATTNRES_OP_PHASE2)
        args = ar_op_phase2(&bc->t_p2);
    else if (bc->p.op == ATTNRES_OP_MIX_BACKWARD)
        args = ar_op_mix_backward(&bc->t_bw);
    else if (bc->p.op == ATTNRES_OP_PHASE1_BACKWARD)
        args = ar_op_phase1_backward(&bc->t_p1b);
    else if (bc->p.op == ATTNRES_OP_PHASE2_BACKWARD)
        args = ar_op_phase2_backward(&bc->t_p2b);
    return bc->dev->ops->time(bc->dev, k, &bc->p, bc->t, &args, reps, flush, times_us);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void timing_summarize(double *t, int n, timing *out)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    out->reps = n;
    out->min_us = t[0];
    out->max_us = t[n - 1];
    out->median_us = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    for (int i = 0; i < n; i++)
        t[i] = fabs(t[i] - out->median_us);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    out->spread_us = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

int bench_case_time(bench_case *bc, const ar_kernel *k, const measure_policy *pol, timing *out)
{
    memset(out, 0, sizeof *out);
    int max_reps = pol->max_reps > 0 ? pol->max_reps : 1;
    double warm[64];
    int warmup = pol->warmup < 64 ? pol->warmup : 64;
    int rc = warmup ? time_launches(bc, k, warmup, pol->flush, warm) : ATTNRES_OK;
    if (rc != ATTNRES_OK)
        return rc;
    double *t = malloc(sizeof(double) * (size_t)max_reps);
    if (!t)
        return ATTNRES_ENOMEM;
    /* The first timed launch goes alone where it decides something: how
     * many launches fill the time target when there was no warm-up, and
     * whether to stop. */
    double one = warmup ? warm[warmup - 1] : 0;
    int first = 0;
    if (!warmup || pol->stop_above_us > 0) {
        rc = time_launches(bc, k, 1, pol->flush, t);
        first = 1;
        if (!warmup)
            one = t[0];
    }
    int reps = one > 0 ? (int)(pol->target_ms * 1e3 / one) : max_reps;
    if (reps < pol->min_reps)
        reps = pol->min_reps;
    if (reps > max_reps)
        reps = max_reps;
    if (reps < 1)
        reps = 1;
    /* A candidate whose first timed launch is already far behind the best
     * of its problem cannot win: the rest of its launches would only
     * measure by how much it loses. */
    if (rc == ATTNRES_OK && pol->stop_above_us > 0 && reps > 1 && t[0] > pol->stop_above_us) {
        timing_summarize(t, 1, out);
        out->stopped = 1;
        free(t);
        return rc;
    }
    if (rc == ATTNRES_OK && pol->decided)
        pol->decided();
    if (rc == ATTNRES_OK && reps > first)
        rc = time_launches(bc, k, reps - first, pol->flush, t + first);
    if (rc == ATTNRES_OK)
        timing_summarize(t, reps, out);
    free(t);
    return rc;
}

int bench_case_time_launches(bench_case *bc, const ar_kernel *k, int n, int flush, double *times_us)
{
    return time_launches(bc, k, n, flush, times_us);
}

/* Rewrites one byte of every page of a buffer with its own value. */
static void touch_pages(void *buf, size_t bytes)
{
    if (!buf)
        return;
    long page = sysconf(_SC_PAGESIZE);
    size_t step = page > 0 ? (size_t)page : 4096;
    volatile unsigned char *p = buf;
    for (size_t i = 0; i < bytes; i += step)
        p[i] = p[i];
    if (bytes)
        p[bytes - 1] = p[bytes - 1];
}

void bench_case_touch(bench_case *bc)
{
    if (strcmp(bc->dev->backend, "cpu") != 0)
        return;
    size_t row_bytes = (size_t)(bc->t * bc->p.d) * bc->es;
    size_t lse_bytes = (size_t)(bc->t * bc->p.heads) * 4;
    touch_pages(bc->t_out, row_bytes);
    if (bc->p.epilogue)
        touch_pages(bc->t_normed, row_bytes);
    if (bc->p.op == ATTNRES_OP_PHASE2 && bc->p.fuse_add) /* b += f, in place */
        touch_pages(bc->t_partial, row_bytes);
    for (int64_t j = 0; bc->p.op == ATTNRES_OP_PHASE1 && j < bc->p.s; j++) {
        touch_pages(bc->t_o1 ? bc->t_o1[j] : NULL, row_bytes);
        touch_pages(bc->t_lse ? bc->t_lse[j] : NULL, lse_bytes);
    }
    if (bc->p.op == ATTNRES_OP_MIX_BACKWARD) { /* the gradients and the workspace */
        touch_pages(bc->t_dsrc, row_bytes * (size_t)bc->p.n);
        touch_pages(bc->t_dpartial, row_bytes);
        touch_pages(bc->t_ws, bc->t_ws_size);
    }
    if (bc->p.op == ATTNRES_OP_PHASE1_BACKWARD) { /* the sources' and queries' gradients, the workspace */
        touch_pages(bc->t_dsrc, row_bytes * (size_t)bc->p.n);
        touch_pages(bc->t_dquery, (size_t)bc->p.s * (size_t)bc->p.d * 4);
        touch_pages(bc->t_ws, bc->t_ws_size);
    }
    if (bc->p.op == ATTNRES_OP_PHASE2_BACKWARD) { /* do1, dlse, db (and dsublayer), the workspace */
        touch_pages(bc->t_do1, row_bytes);
        touch_pages(bc->t_dlse, lse_bytes);
        touch_pages(bc->t_dpartial, row_bytes);
        touch_pages(bc->t_dsub, row_bytes);
        touch_pages(bc->t_ws, bc->t_ws_size);
    }
}

void bench_case_set_device(bench_case *bc, attnres_device *dev) { bc->dev = dev; }
