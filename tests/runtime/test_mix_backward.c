/*
 * test_mix_backward.c - the mix backward on the CPU (attnres_run_mix_backward,
 * templates/cpu/mix_backward.lua) against the fp64 reference backward.
 *
 * Cases:
 *   - the built-in kernel, through a plan made without a database,
 *     matches attnres_reference_mix_backward per gradient (DESIGN §1
 *     tolerances) for every dtype, both forms, H = 1 and 4, N = 1 and 3,
 *     strided views, written and accumulated gradients, each in the
 *     storage type and in fp32 (ATTNRES_GRAD_DSOURCES_F32, which must meet
 *     fp32's tolerance: no rounding to the storage type);
 *   - N = 1 gives a query gradient of exactly zero;
 *   - the same plan gives bit-identical gradients on two runs, and one
 *     compiled variant gives bit-identical gradients at 1 and 2 threads;
 *   - at every ISA level the host has (ATTNRES_CPU_BUILTIN_ISA; "scalar"
 *     everywhere), the plan's explanation names the level's built-in
 *     kernel or the scalar one as the fallback chain must, its gradients
 *     match the reference in every dtype and form, written and
 *     accumulated, at head widths for that level, the next one down and
 *     the scalar kernel, and they are bit-identical on two runs and with
 *     the launch in one part and in two ("LEVEL/CASE": --case avx2);
 *   - a covering sample of the template's variants (every value of every
 *     parameter once; --all: every variant) compiled as the tuner compiles
 *     them matches the reference;
 *   - refusals: the epilogue at plan time, a short or missing workspace,
 *     overlapping gradients (fp32 ones as fp32 views), a plan of another
 *     op; T = 0 writes zeros.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "check.h"
#include "storage_convert.h"
#include "test_compare.h"
#include "test_covering.h"
#include "test_data.h"
#include "test_device.h"
#include "test_variant.h"

static attnres_device *cpu;
static char scratch[4096];
static int all_variants;

/* One problem's inputs, as storage and as the doubles they round to, and
 * the reference gradients. */
typedef struct bw_case {
    attnres_problem p;
    int64_t T, stride; /* the token stride of every source and gradient view */
    unsigned flags;
    attnres_dtype gdt; /* the source gradients' type: fp32 with ATTNRES_GRAD_DSOURCES_F32 */
    void *src, *dout, *dsrc, *dpartial;
    const void *rows[8];
    void *drows[8];
    int64_t strides[8];
    float *query, dquery[4096], dalpha;
    double *x_src, *x_dout, *x_query, *r_dsrc, *r_dpartial, r_dquery[4096], r_dalpha;
    void *workspace;
    size_t workspace_size;
    attnres_mix_backward_args args;
} bw_case;

static void case_free(bw_case *c)
{
    free(c->src);
    free(c->dout);
    free(c->dsrc);
    free(c->dpartial);
    free(c->query);
    free(c->x_src);
    free(c->x_dout);
    free(c->x_query);
    free(c->r_dsrc);
    free(c->r_dpartial);
    free(c->workspace);
    memset(c, 0, sizeof *c);
}

/* Fills a case with random data (rows of differing magnitude), the
 * gradient buffers with a prior value where accumulating, and computes the
 * reference from the rounded inputs. 0 on success. */
static int case_make(bw_case *c, attnres_dtype dt, int64_t d, int n, int heads, int additive, int64_t T,
                     int64_t pad, unsigned flags, uint64_t seed)
{
    memset(c, 0, sizeof *c);
    attnres_problem_init(&c->p, dt, d, n);
    c->p.op = ATTNRES_OP_MIX_BACKWARD;
    c->p.heads = heads;
    c->p.form = additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    c->T = T;
    c->stride = d + pad;
    c->flags = flags;
    c->gdt = (flags & ATTNRES_GRAD_DSOURCES_F32) ? ATTNRES_DTYPE_F32 : dt;
    const size_t es = attnres_dtype_size(dt), row = (size_t)(T ? T : 1) * (size_t)c->stride;
    const size_t ges = attnres_dtype_size(c->gdt);
    c->src = calloc((size_t)n * row, es);
    c->dsrc = calloc((size_t)n * row, ges);
    c->dout = calloc(row, es);
    c->dpartial = calloc(row, es);
    c->query = calloc((size_t)d, 4);
    c->x_src = calloc((size_t)n * (size_t)(T + 1) * (size_t)d, 8);
    c->r_dsrc = calloc((size_t)n * (size_t)(T + 1) * (size_t)d, 8);
    c->x_dout = calloc((size_t)(T + 1) * (size_t)d, 8);
    c->r_dpartial = calloc((size_t)(T + 1) * (size_t)d, 8);
    c->x_query = calloc((size_t)d, 8);
    if (!c->src || !c->dsrc || !c->dout || !c->dpartial || !c->query || !c->x_src || !c->r_dsrc || !c->x_dout ||
        !c->r_dpartial || !c->x_query || n > 8 || d > 4096)
        return -1;
    uint64_t s = seed;
    for (int64_t k = 0; k < d; k++) {
        c->query[k] = (float)(rng_normal(&s) * 4.0 / sqrt((double)d));
        c->x_query[k] = c->query[k];
    }
    const double alpha = 0.75;
    const double *xrows[8];
    double *rrows[8];
    for (int i = 0; i < n; i++) {
        c->rows[i] = (char *)c->src + (size_t)i * row * es;
        c->drows[i] = (char *)c->dsrc + (size_t)i * row * ges;
        c->strides[i] = c->stride;
        xrows[i] = c->x_src + (size_t)i * (size_t)T * (size_t)d;
        rrows[i] = c->r_dsrc + (size_t)i * (size_t)T * (size_t)d;
        for (int64_t t = 0; t < T; t++) {
            const double mag = pow(10.0, 2.0 * rng_uniform(&s) - 1.0);
            for (int64_t k = 0; k < d; k++) {
                elem_store(dt, (void *)c->rows[i], t * c->stride + k, mag * rng_normal(&s));
                c->x_src[(size_t)i * (size_t)T * (size_t)d + (size_t)(t * d + k)] =
                    elem_load(dt, c->rows[i], t * c->stride + k);
                if (flags & ATTNRES_GRAD_ACCUMULATE) {
                    elem_store(c->gdt, c->drows[i], t * c->stride + k, rng_normal(&s));
                    rrows[i][t * d + k] = elem_load(c->gdt, c->drows[i], t * c->stride + k);
                }
            }
        }
    }
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < d; k++) {
            elem_store(dt, c->dout, t * c->stride + k, rng_normal(&s));
            c->x_dout[t * d + k] = elem_load(dt, c->dout, t * c->stride + k);
            if (flags & ATTNRES_GRAD_ACCUMULATE) {
                elem_store(dt, c->dpartial, t * c->stride + k, rng_normal(&s));
                c->r_dpartial[t * d + k] = elem_load(dt, c->dpartial, t * c->stride + k);
            }
        }
    attnres_problem fwd = c->p;
    fwd.op = ATTNRES_OP_MIX;
    char msg[256];
    /* partial's value enters no gradient: zeros stand in for it. */
    double *zeros = calloc((size_t)(T + 1) * (size_t)d, 8);
    if (!zeros)
        return -1;
    const int rc = attnres_reference_mix_backward(
        &fwd, T, xrows, c->x_query, 1.0, 1e-6, additive ? zeros : NULL, alpha, NULL, 1e-6, c->x_dout, NULL, flags,
        rrows, c->r_dquery, additive ? c->r_dpartial : NULL, additive ? &c->r_dalpha : NULL, NULL, msg, sizeof msg);
    free(zeros);
    if (rc != ATTNRES_OK) {
        fprintf(stderr, "reference: %s\n", msg);
        return -1;
    }
    size_t alpha_off;
    if (ar_mix_backward_workspace(d, T, &c->workspace_size, &alpha_off) != 0 ||
        posix_memalign(&c->workspace, 64, c->workspace_size + 64) != 0)
        return -1;
    attnres_mix_backward_args *a = &c->args;
    attnres_mix_backward_args_init(a);
    a->sources = c->rows;
    a->source_strides = c->strides;
    a->query = c->query;
    a->alpha = (float)alpha;
    a->dout = c->dout;
    a->dout_stride = c->stride;
    a->flags = flags;
    a->dsources = c->drows;
    a->dsource_strides = c->strides;
    a->dquery = c->dquery;
    a->dpartial = additive ? c->dpartial : NULL;
    a->dpartial_stride = c->stride;
    a->dalpha = additive ? &c->dalpha : NULL;
    a->workspace = c->workspace;
    a->workspace_size = c->workspace_size;
    return 0;
}

/* ||got - ref|| / ||ref|| over a strided storage buffer. */
static double rel_err_storage(attnres_dtype dt, const void *buf, int64_t stride, const double *ref, int64_t T,
                              int64_t d)
{
    double num = 0, den = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < d; k++) {
            const double diff = elem_load(dt, buf, t * stride + k) - ref[t * d + k];
            num += diff * diff;
            den += ref[t * d + k] * ref[t * d + k];
        }
    return isnan(num) ? NAN : sqrt(num) / (sqrt(den) + 1e-300);
}

/* Checks every gradient of a case that ran; returns the worst error. */
static double case_check(const bw_case *c, const char *what)
{
    const attnres_problem *p = &c->p;
    const double tol = case_tolerance(p->dtype);
    /* fp32 source gradients are never rounded to the storage type: they
     * meet fp32's tolerance whatever the inputs' type. */
    const double gtol = case_tolerance(c->gdt);
    double worst = 0;
    for (int i = 0; i < p->n; i++) {
        const double e = rel_err_storage(c->gdt, c->drows[i], c->stride,
                                         c->r_dsrc + (size_t)i * (size_t)c->T * (size_t)p->d, c->T, p->d);
        if (!(e <= gtol))
            fprintf(stderr, "  %s: dsources[%d] relative error %.3g over %.0e\n", what, i, e, gtol);
        CHECK(e <= gtol);
        worst = e > worst ? e : worst;
    }
    double num = 0, den = 0;
    for (int64_t k = 0; k < p->d; k++) {
        num += (c->dquery[k] - c->r_dquery[k]) * (c->dquery[k] - c->r_dquery[k]);
        den += c->r_dquery[k] * c->r_dquery[k];
    }
    /* An all-zero reference (N = 1) must be met exactly. */
    const double eq = den == 0 ? (num == 0 ? 0 : INFINITY) : sqrt(num / den);
    if (!(eq <= tol))
        fprintf(stderr, "  %s: dquery relative error %.3g over %.0e\n", what, eq, tol);
    CHECK(eq <= tol);
    if (p->form == ATTNRES_FORM_ADDITIVE) {
        const double e = rel_err_storage(p->dtype, c->dpartial, c->stride, c->r_dpartial, c->T, p->d);
        CHECK(e <= tol);
        const double ea = fabs(c->dalpha - c->r_dalpha) / (fabs(c->r_dalpha) + 1e-300);
        if (!(ea <= tol))
            fprintf(stderr, "  %s: dalpha %.9g, reference %.9g\n", what, (double)c->dalpha, c->r_dalpha);
        CHECK(ea <= tol);
    }
    return worst > eq ? worst : eq;
}

static attnres_plan *plan_generic(const attnres_problem *p)
{
    attnres_plan *plan = NULL;
    char msg[512];
    if (attnres_plan_create(cpu, NULL, p, 0, &plan, msg, sizeof msg) != ATTNRES_OK)
        fprintf(stderr, "plan: %s\n", msg);
    return plan;
}

static const attnres_dtype dtypes[] = {ATTNRES_DTYPE_F32, ATTNRES_DTYPE_BF16, ATTNRES_DTYPE_F16};

/* Every combination of the gradient flags: written or accumulated, in the
 * storage type or in fp32. */
#define ALL_FLAGS (ATTNRES_GRAD_ACCUMULATE | ATTNRES_GRAD_DSOURCES_F32)

/* The flags as words for a case's name. */
static const char *flags_name(unsigned flags)
{
    static const char *names[] = {"", " accumulate", " fp32 dsources", " accumulate fp32 dsources"};
    return names[flags & ALL_FLAGS];
}

static void test_generic_matches_reference(void)
{
    int cases = 0;
    for (int di = 0; di < 3; di++)
        for (int additive = 0; additive <= 1; additive++)
            for (int hi = 0; hi < 2; hi++)
                for (int ni = 0; ni < 2; ni++)
                    for (unsigned flags = 0; flags <= ALL_FLAGS; flags++) {
                        const int heads = hi ? 4 : 1, n = ni ? 3 : 1;
                        bw_case c;
                        const int64_t pad = (di + ni) % 2 ? 8 : 0;
                        REQUIRE(case_make(&c, dtypes[di], 64, n, heads, additive, 37, pad, flags,
                                          (uint64_t)(di * 97 + additive * 13 + hi * 5 + ni + 17 * (flags & ATTNRES_GRAD_ACCUMULATE))) == 0);
                        attnres_plan *plan = plan_generic(&c.p);
                        CHECK(plan != NULL);
                        if (plan) {
                            const int rc = attnres_run_mix_backward(plan, c.T, &c.args, NULL);
                            if (rc != ATTNRES_OK)
                                fprintf(stderr, "run: %s\n", attnres_plan_errmsg(plan));
                            CHECK(rc == ATTNRES_OK);
                            char what[96];
                            snprintf(what, sizeof what, "%s %s H=%d N=%d%s", attnres_dtype_name(dtypes[di]),
                                     additive ? "additive" : "replace", heads, n, flags_name(flags));
                            if (rc == ATTNRES_OK)
                                case_check(&c, what);
                            if (n == 1) /* dz is exactly zero, so is du */
                                for (int64_t k = 0; k < c.p.d; k++)
                                    CHECK(c.dquery[k] == 0.0f);
                            cases++;
                        }
                        attnres_plan_destroy(plan);
                        case_free(&c);
                    }
    printf("ok: %d generic cases\n", cases);
}

/* Runs a case through kernel k on the device directly (as the tuner
 * does), for variants and thread counts a plan does not choose. */
static int launch_kernel(const ar_kernel *k, bw_case *c)
{
    const ar_op_args args = ar_op_mix_backward(&c->args);
    return cpu->ops->launch(cpu, k, &c->p, c->T, &args, NULL);
}

static void bit_identical_across_runs_and_threads(unsigned flags)
{
    bw_case c;
    REQUIRE(case_make(&c, ATTNRES_DTYPE_BF16, 128, 3, 2, 1, 300, 0, flags, 5) == 0);
    attnres_plan *plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    const size_t es = attnres_dtype_size(c.gdt), bytes = (size_t)c.p.n * (size_t)c.T * (size_t)c.stride * es;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_OK);
    void *first = malloc(bytes);
    float q1[128], a1 = c.dalpha;
    REQUIRE(first != NULL);
    memcpy(first, c.dsrc, bytes);
    memcpy(q1, c.dquery, sizeof q1);
    memset(c.workspace, 0x5a, c.workspace_size); /* old partial sums must not matter */
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_OK);
    CHECK(memcmp(first, c.dsrc, bytes) == 0);
    CHECK(memcmp(q1, c.dquery, sizeof q1) == 0);
    CHECK(memcmp(&a1, &c.dalpha, sizeof a1) == 0);
    attnres_plan_destroy(plan);

    /* One compiled variant at 1 and at 2 threads. */
    char msg[1024];
    argen *g = NULL;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/mix_backward", &g, msg, sizeof msg) == 0);
    ar_kernel k1, k2;
    REQUIRE(compile_variant_on(cpu, g, "mix_backward_c_bf16_v8_u2_t1", &k1) == 0);
    REQUIRE(compile_variant_on(cpu, g, "mix_backward_c_bf16_v8_u2_t2", &k2) == 0);
    CHECK(k1.threads == 1 && k2.threads == 2);
    CHECK(launch_kernel(&k1, &c) == ATTNRES_OK);
    memcpy(first, c.dsrc, bytes);
    memcpy(q1, c.dquery, sizeof q1);
    a1 = c.dalpha;
    case_check(&c, "bf16 v8 u2 at 1 thread");
    CHECK(launch_kernel(&k2, &c) == ATTNRES_OK);
    CHECK(memcmp(first, c.dsrc, bytes) == 0);
    CHECK(memcmp(q1, c.dquery, sizeof q1) == 0);
    CHECK(memcmp(&a1, &c.dalpha, sizeof a1) == 0);
    cpu->ops->unload(cpu, &k1);
    cpu->ops->unload(cpu, &k2);
    argen_close(g);
    free(first);
    case_free(&c);
}

static void test_bit_identical_across_runs_and_threads(void)
{
    bit_identical_across_runs_and_threads(0);
    bit_identical_across_runs_and_threads(ATTNRES_GRAD_DSOURCES_F32);
}

/* ---- the built-in kernels per ISA level --------------------------------- */

static attnres_device *lvl;  /* the CPU device opened at one ISA level */
static const char *lvl_name; /* that level ("scalar": the scalar kernel alone) */
static int lvl_present;      /* the host has the level */

/* Plans p on the level's device without a database, and checks that the
 * explanation names the kernel the fallback chain must take: the level's
 * built-in where the host has the level and the head width is a multiple
 * of 32 (every level's loop step divides it), the scalar kernel where the
 * head width is no multiple of 8 (no level's step divides it), and a
 * narrower level or the scalar kernel in between. */
static attnres_plan *plan_at_level(const attnres_problem *p)
{
    attnres_plan *plan = NULL;
    char msg[512], text[4096];
    if (attnres_plan_create(lvl, NULL, p, 0, &plan, msg, sizeof msg) != ATTNRES_OK) {
        fprintf(stderr, "  %s plan: %s\n", lvl_name, msg);
        return NULL;
    }
    attnres_plan_explain(plan, text, sizeof text);
    const int64_t hd = p->d / p->heads;
    char want[64] = "";
    if (hd % 8 != 0 || strcmp(lvl_name, "scalar") == 0)
        snprintf(want, sizeof want, "(built in, scalar)");
    else if (hd % 32 == 0 && lvl_present)
        snprintf(want, sizeof want, "(built in, %s)", lvl_name);
    if (want[0] && !strstr(text, want)) {
        fprintf(stderr, "  %s d=%lld H=%d: expected %s in:\n%s", lvl_name, (long long)p->d, p->heads, want, text);
        check_failures++;
    }
    return plan;
}

/* Every dtype, both forms, written and accumulated gradients, N = 1 and 3,
 * at head widths of 256 and 64 (the level's own kernel), 48 (AVX-512's
 * step of 32 does not divide it: the next level down) and 20 (the scalar
 * kernel), over 70 tokens (two whole groups and a part). */
static void test_builtin_matches_reference(void)
{
    static const struct { int64_t d; int h; } shapes[] = {{256, 1}, {256, 4}, {96, 2}, {20, 1}};
    int cases = 0;
    for (int di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int additive = 0; additive <= 1; additive++)
                for (int n = 1; n <= 3; n += 2)
                    for (unsigned flags = 0; flags <= ALL_FLAGS; flags++) {
                        bw_case c;
                        const int64_t pad = (si + (size_t)n) % 2 ? 16 : 0;
                        /* fp32 gradients reuse the data of the storage-type case. */
                        const int seed = (int)(((((size_t)di * 4 + si) * 2 + (size_t)additive) * 2 + (size_t)(n > 1)) *
                                                   2 + (flags & ATTNRES_GRAD_ACCUMULATE));
                        REQUIRE(case_make(&c, dtypes[di], shapes[si].d, n, shapes[si].h, additive, 70, pad, flags,
                                          (uint64_t)(4000 + seed)) == 0);
                        attnres_plan *plan = plan_at_level(&c.p);
                        CHECK(plan != NULL);
                        if (plan) {
                            const int rc = attnres_run_mix_backward(plan, c.T, &c.args, NULL);
                            if (rc != ATTNRES_OK)
                                fprintf(stderr, "  run: %s\n", attnres_plan_errmsg(plan));
                            CHECK(rc == ATTNRES_OK);
                            char what[128];
                            snprintf(what, sizeof what, "%s %s d=%lld H=%d N=%d %s%s", lvl_name,
                                     attnres_dtype_name(dtypes[di]), (long long)shapes[si].d, shapes[si].h, n,
                                     additive ? "additive" : "replace", flags_name(flags));
                            if (rc == ATTNRES_OK)
                                case_check(&c, what);
                            if (n == 1) /* dz is exactly zero, so is du */
                                for (int64_t k = 0; k < c.p.d; k++)
                                    CHECK(c.dquery[k] == 0.0f);
                        }
                        attnres_plan_destroy(plan);
                        case_free(&c);
                        cases++;
                    }
    printf("ok: %d cases at %s\n", cases, lvl_name);
}

/* The gradients of one run, to compare bit for bit. */
typedef struct bw_result {
    void *dsrc, *dpartial;
    float dquery[4096], dalpha;
} bw_result;

/* Runs c through k (NULL: through plan) from the same prior gradients,
 * and compares its gradients with *first bit for bit, or keeps them there
 * when first->dsrc is NULL. */
static void run_and_compare(bw_case *c, attnres_plan *plan, const ar_kernel *k, const void *prior_dsrc,
                            const void *prior_dpartial, size_t bytes, bw_result *first, const char *what)
{
    /* bytes is one storage-type view; the source gradients' may be fp32. */
    const size_t gbytes = bytes / attnres_dtype_size(c->p.dtype) * attnres_dtype_size(c->gdt);
    memcpy(c->dsrc, prior_dsrc, (size_t)c->p.n * gbytes);
    memcpy(c->dpartial, prior_dpartial, bytes);
    memset(c->workspace, 0x5a, c->workspace_size); /* old partial sums must not matter */
    const ar_op_args args = ar_op_mix_backward(&c->args);
    const int rc = k ? lvl->ops->launch(lvl, k, &c->p, c->T, &args, NULL)
                     : attnres_run_mix_backward(plan, c->T, &c->args, NULL);
    CHECK(rc == ATTNRES_OK);
    if (!first->dsrc) {
        first->dsrc = malloc((size_t)c->p.n * gbytes);
        first->dpartial = malloc(bytes);
        REQUIRE(first->dsrc && first->dpartial);
        memcpy(first->dsrc, c->dsrc, (size_t)c->p.n * gbytes);
        memcpy(first->dpartial, c->dpartial, bytes);
        memcpy(first->dquery, c->dquery, sizeof(float) * (size_t)c->p.d);
        first->dalpha = c->dalpha;
        case_check(c, what);
        return;
    }
    const int same = memcmp(first->dsrc, c->dsrc, (size_t)c->p.n * gbytes) == 0 &&
                     memcmp(first->dpartial, c->dpartial, bytes) == 0 &&
                     memcmp(first->dquery, c->dquery, sizeof(float) * (size_t)c->p.d) == 0 &&
                     memcmp(&first->dalpha, &c->dalpha, sizeof c->dalpha) == 0;
    if (!same)
        fprintf(stderr, "  %s: gradients differ from the first run's\n", what);
    CHECK(same);
}

/* The plan's kernel gives bit-identical gradients on two runs, and when
 * launched with one part and with two (a launch of 5.9 MB: the built-ins
 * split launches per 2 MiB, cpu_builtin.h), written and accumulated. */
static void test_builtin_bit_identical_across_runs_and_threads(void)
{
    for (unsigned flags = 0; flags <= ALL_FLAGS; flags++) {
        bw_case c;
        REQUIRE(case_make(&c, ATTNRES_DTYPE_BF16, 1024, 3, 2, 1, 300, 0, flags, 77 + flags) == 0);
        attnres_plan *plan = plan_at_level(&c.p);
        REQUIRE(plan != NULL);
        const size_t bytes = (size_t)c.T * (size_t)c.stride * 2;
        const size_t gbytes = (size_t)c.T * (size_t)c.stride * attnres_dtype_size(c.gdt);
        void *prior_dsrc = malloc((size_t)c.p.n * gbytes), *prior_dpartial = malloc(bytes);
        REQUIRE(prior_dsrc && prior_dpartial);
        memcpy(prior_dsrc, c.dsrc, (size_t)c.p.n * gbytes);
        memcpy(prior_dpartial, c.dpartial, bytes);
        bw_result first = {0};
        char what[96];
        snprintf(what, sizeof what, "%s bf16 d=1024 H=2 N=3 additive%s", lvl_name, flags_name(flags));
        run_and_compare(&c, plan, NULL, prior_dsrc, prior_dpartial, bytes, &first, what);
        run_and_compare(&c, plan, NULL, prior_dsrc, prior_dpartial, bytes, &first, what);
        ar_kernel k;
        REQUIRE(lvl->ops->load_generic(lvl, &c.p, &k) == ATTNRES_OK);
        for (int threads = 1; threads <= 2; threads++) {
            k.threads = threads;
            run_and_compare(&c, NULL, &k, prior_dsrc, prior_dpartial, bytes, &first, what);
        }
        lvl->ops->unload(lvl, &k);
        attnres_plan_destroy(plan);
        free(first.dsrc);
        free(first.dpartial);
        free(prior_dsrc);
        free(prior_dpartial);
        case_free(&c);
    }
}

static void test_template_variants_match_reference(void)
{
    char msg[1024];
    argen *g = NULL;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/mix_backward", &g, msg, sizeof msg) == 0);
    argen_variant *v = NULL;
    size_t nv = 0;
    REQUIRE(argen_enumerate(g, &v, &nv) == 0);
    argen_device ad = {.backend = "cpu", .arch = cpu->arch, .units = 2};
    const char **json = calloc(nv, sizeof *json);
    int *usable = calloc(nv, sizeof *usable), *pick = calloc(nv, sizeof *pick);
    REQUIRE(json && usable && pick);
    for (size_t i = 0; i < nv; i++) {
        json[i] = v[i].params_json;
        argen_problem ap = {.op = "mix_backward", .dtype = "f32", .form = "replace", .d = 128, .t = 64,
                            .n = 2, .heads = 2, .epilogue = 0};
        char dt[8];
        snprintf(dt, sizeof dt, "%s", strstr(v[i].id, "_bf16_") ? "bf16" : strstr(v[i].id, "_f16_") ? "f16" : "f32");
        ap.dtype = dt;
        char why[256];
        usable[i] = argen_applies(g, v[i].id, &ap, &ad, why, sizeof why) > 0 && strstr(v[i].id, "_t2") != NULL;
    }
    if (!all_variants)
        REQUIRE(covering_sample(json, usable, nv, pick) > 0);
    int tried = 0;
    for (size_t i = 0; i < nv; i++) {
        if (!usable[i] || (!all_variants && !pick[i]) || !check_unit(v[i].id))
            continue;
        const attnres_dtype dt = strstr(v[i].id, "_bf16_")  ? ATTNRES_DTYPE_BF16
                                 : strstr(v[i].id, "_f16_") ? ATTNRES_DTYPE_F16
                                                            : ATTNRES_DTYPE_F32;
        ar_kernel k;
        if (compile_variant_on(cpu, g, v[i].id, &k) != 0) {
            CHECK(0);
            continue;
        }
        /* Replace written, additive accumulated, each in the storage type
         * and in fp32. */
        for (int form = 0; form < 4; form++) {
            const int additive = form & 1;
            const unsigned flags = (additive ? ATTNRES_GRAD_ACCUMULATE : 0) | (form & 2 ? ATTNRES_GRAD_DSOURCES_F32 : 0);
            bw_case c;
            REQUIRE(case_make(&c, dt, 128, 2 + additive, 2, additive, 70, 16 * additive, flags, 1000 + i + form) == 0);
            CHECK(launch_kernel(&k, &c) == ATTNRES_OK);
            char what[160];
            snprintf(what, sizeof what, "%s %s%s", v[i].id, additive ? "additive" : "replace", flags_name(flags));
            case_check(&c, what);
            case_free(&c);
        }
        cpu->ops->unload(cpu, &k);
        tried++;
    }
    printf("ok: %d variant(s) of cpu/mix_backward\n", tried);
    CHECK(tried > 0);
    free(json);
    free(usable);
    free(pick);
    argen_variants_free(v, nv);
    argen_close(g);
}

static void test_refusals(void)
{
    char msg[512];
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 2);
    p.op = ATTNRES_OP_MIX_BACKWARD;
    p.epilogue = 1;
    attnres_plan *plan = NULL;
    CHECK(attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg) == ATTNRES_EUNSUPPORTED);
    CHECK(plan == NULL && strstr(msg, "epilogue") != NULL);

    bw_case c;
    REQUIRE(case_make(&c, ATTNRES_DTYPE_F32, 64, 2, 1, 0, 40, 0, 0, 9) == 0);
    plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    size_t need = 0;
    CHECK(attnres_mix_backward_workspace_size(plan, c.T, &need) == ATTNRES_OK && need == c.workspace_size);
    CHECK(attnres_mix_backward_workspace_size(plan, -1, &need) == ATTNRES_EINVAL);
    c.args.workspace_size = need - 1;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "workspace") != NULL);
    c.args.workspace_size = need;
    /* A gradient that is a source. */
    void *keep = c.drows[1];
    c.drows[1] = (void *)c.rows[0];
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "overlap") != NULL);
    /* Two sources' gradients in one buffer: only when accumulating. */
    c.drows[1] = c.drows[0];
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    c.args.flags = ATTNRES_GRAD_ACCUMULATE;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_OK);
    c.args.flags = 4;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    c.args.flags = 0;
    c.drows[1] = keep;
    attnres_plan_destroy(plan);
    case_free(&c);

    /* fp32 source gradients of a bf16 plan: checked as fp32 views, for
     * alignment and for overlap, though bf16 views would pass. */
    REQUIRE(case_make(&c, ATTNRES_DTYPE_BF16, 64, 2, 1, 0, 40, 0, ATTNRES_GRAD_DSOURCES_F32, 10) == 0);
    plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_OK);
    keep = c.drows[1];
    c.drows[1] = (char *)c.drows[0] + 2;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "aligned to 4-byte") != NULL);
    c.drows[1] = (char *)c.drows[0] + (size_t)c.T * (size_t)c.stride * 2;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "overlap") != NULL);
    c.drows[1] = keep;
    /* No tokens: zero sums, nothing else read. */
    for (int64_t k = 0; k < c.p.d; k++)
        c.dquery[k] = 1.0f;
    attnres_mix_backward_args none;
    attnres_mix_backward_args_init(&none);
    none.dquery = c.dquery;
    CHECK(attnres_run_mix_backward(plan, 0, &none, NULL) == ATTNRES_OK);
    for (int64_t k = 0; k < c.p.d; k++)
        CHECK(c.dquery[k] == 0.0f);
    attnres_mix_args mix;
    attnres_mix_args_init(&mix);
    CHECK(attnres_run_mix(plan, 1, &mix, NULL) == ATTNRES_EMISMATCH);
    attnres_plan_destroy(plan);
    case_free(&c);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--all") == 0)
            all_variants = 1;
    if (scratch_cpu_open("mix-backward", scratch, sizeof scratch, &cpu) != 0)
        return 1;
    RUN_CASE(test_generic_matches_reference);
    RUN_CASE(test_bit_identical_across_runs_and_threads);
    RUN_CASE(test_template_variants_match_reference);
    RUN_CASE(test_refusals);
    for (size_t i = 0; i < TEST_BUILTIN_LEVELS; i++) {
        lvl_name = test_builtin_levels[i];
        lvl_present = test_host_has_level(lvl_name);
        const int opened = test_cpu_open_level(lvl_name, &lvl, check_listing);
        if (opened < 0)
            check_failures++;
        if (opened <= 0)
            continue;
        /* Named "LEVEL/CASE": --case avx2 runs every case at that level. */
        RUN_CASE_IN(lvl_name, test_builtin_matches_reference);
        RUN_CASE_IN(lvl_name, test_builtin_bit_identical_across_runs_and_threads);
        attnres_device_close(lvl);
    }
    unsetenv("ATTNRES_CPU_BUILTIN_ISA");
    attnres_device_close(cpu);
    scratch_remove(scratch);
    CHECK_EXIT();
}
