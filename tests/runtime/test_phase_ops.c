/*
 * test_phase_ops.c - the Block AttnRes two-phase form (phase1, phase2) on the
 * CPU device: the fp64 references, the public run functions with their
 * argument checks, the built-in generic kernels, and a spread of the tuned
 * template variants compiled the way the tuner compiles them.
 *
 * Results are compared with attnres_reference_phase1/2 on fresh random
 * inputs (source rows 100x apart in magnitude): ||got - ref|| / ||ref|| at
 * most 1e-5 for fp32 storage and 1e-2 for bf16 and fp16, the reference
 * computed from the rounded inputs (DESIGN §1). The references themselves
 * are checked against attnres_reference_mix: phase1 over n sources followed
 * by phase2 with b equals the mix over the n + 1 sources with b last.
 */
#define _GNU_SOURCE /* nftw, setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "argen.h"
#include "attnres.h"
#include "check.h"
#include "device.h"
#include "kernel_abi.h"
#include "test_compare.h"
#include "test_data.h"
#include "test_identity.h"
#include "test_variant.h"

#ifndef TEMPLATE_DIR
#error "TEMPLATE_DIR must name the templates/ folder"
#endif

static char tmpdir[512];
static attnres_device *cpu;


static const attnres_dtype all_dtypes[] = {ATTNRES_DTYPE_F32, ATTNRES_DTYPE_BF16, ATTNRES_DTYPE_F16};

/* ------------------------------------------------------------------------
 * The identity: phase1 + phase2 == mix over n + 1 sources (fp64 references)
 * ---------------------------------------------------------------------- */

static void check_identity(int32_t n, int32_t sites, int32_t heads, int fuse, int epilogue, uint64_t seed)
{
    const int64_t d = 48, T = 5;
    uint64_t s = seed;
    double *src = malloc(sizeof(double) * (size_t)((n + 1) * T * d));
    double *q = malloc(sizeof(double) * (size_t)(sites * d));
    double *o1 = malloc(sizeof(double) * (size_t)(sites * T * d));
    double *lse = malloc(sizeof(double) * (size_t)(sites * T * heads));
    double *b = malloc(sizeof(double) * (size_t)(T * d)), *b_site = malloc(sizeof(double) * (size_t)(T * d));
    double *f = malloc(sizeof(double) * (size_t)(T * d)), *go = malloc(sizeof(double) * (size_t)d);
    double *out2 = malloc(sizeof(double) * (size_t)(T * d)), *outm = malloc(sizeof(double) * (size_t)(T * d));
    double *norm2 = malloc(sizeof(double) * (size_t)(T * d)), *normm = malloc(sizeof(double) * (size_t)(T * d));
    const double **srcs = malloc(sizeof(double *) * (size_t)(n + 1));
    REQUIRE(src && q && o1 && lse && b && b_site && f && go && out2 && outm && norm2 && normm && srcs);
    for (int64_t i = 0; i < (n + 1) * T * d; i++)
        src[i] = rng_normal(&s) * (1 + (i / d) % 7);
    for (int64_t i = 0; i < sites * d; i++)
        q[i] = rng_normal(&s) * 0.4;
    for (int64_t i = 0; i < T * d; i++) {
        b[i] = rng_normal(&s);
        f[i] = rng_normal(&s);
    }
    for (int64_t k = 0; k < d; k++)
        go[k] = 1 + 0.1 * rng_normal(&s);
    for (int i = 0; i <= n; i++)
        srcs[i] = src + (int64_t)i * T * d;

    attnres_problem p1, p2, pm;
    identity_problems(d, n, sites, heads, fuse, epilogue, &p1, &p2, &pm);
    const double scale = 0.8, eps = 1e-5;
    REQUIRE(attnres_reference_phase1(&p1, T, srcs, q, scale, eps, o1, lse) == ATTNRES_OK);
    double worst = 0;
    for (int j = 0; j < sites; j++) {
        memcpy(b_site, b, sizeof(double) * (size_t)(T * d));
        REQUIRE(attnres_reference_phase2(&p2, T, o1 + (int64_t)j * T * d, lse + (int64_t)j * T * heads, b_site,
                                         f, q + (int64_t)j * d, scale, eps, go, 1e-5, out2, norm2) == ATTNRES_OK);
        /* The mix sees b after the add as its last source. */
        memcpy(src + (int64_t)n * T * d, b_site, sizeof(double) * (size_t)(T * d));
        REQUIRE(attnres_reference_mix(&pm, T, srcs, q + (int64_t)j * d, scale, eps, NULL, 1, go, 1e-5, outm,
                                      normm) == ATTNRES_OK);
        worst = case_worse(worst, case_rel_err(out2, outm, T * d));
        if (epilogue)
            worst = case_worse(worst, case_rel_err(norm2, normm, T * d));
        if (fuse)
            for (int64_t i = 0; i < T * d; i++)
                CHECK(b_site[i] == b[i] + f[i]);
    }
    CHECK(worst < 1e-12);
    if (!(worst < 1e-12))
        fprintf(stderr, "  n=%d S=%d H=%d fuse=%d epi=%d: rel err %g\n", n, sites, heads, fuse, epilogue, worst);
    free(src);
    free(q);
    free(o1);
    free(lse);
    free(b);
    free(b_site);
    free(f);
    free(go);
    free(out2);
    free(outm);
    free(norm2);
    free(normm);
    free(srcs);
}

static void test_reference_phase1_then_phase2_equals_mix_over_n_plus_one(void)
{
    check_identity(1, 1, 1, 0, 0, 1);
    check_identity(4, 3, 1, 0, 0, 2);
    check_identity(5, 2, 4, 1, 0, 3);
    check_identity(3, 4, 6, 0, 1, 4);
    check_identity(9, 2, 8, 1, 1, 5);
}

/* ------------------------------------------------------------------------
 * Phase 1: one case with inputs, outputs and reference
 * ---------------------------------------------------------------------- */

/* How a case launches: through a plan, or one compiled kernel directly,
 * with the backend's launch slot or (timed) its time slot, which the tuner
 * uses and which must run the very same operation. */
typedef struct launcher {
    attnres_plan *plan;
    const ar_kernel *kernel;
    int timed;
} launcher;

/* One launch of the case's kernel: through the launch slot, or through
 * the time slot when the case is timed; a time that is negative or not
 * finite fails the launch, so the case reports it. */
static int kernel_launch(const launcher *l, const attnres_problem *p, int64_t T, const ar_op_args *args)
{
    if (!l->timed)
        return cpu->ops->launch(cpu, l->kernel, p, T, args, NULL);
    double us = -1.0;
    int rc = cpu->ops->time(cpu, l->kernel, p, T, args, 1, 1, &us);
    if (rc == ATTNRES_OK && !(us >= 0.0 && us < 1e12)) {
        fprintf(stderr, "  the time slot reported %g us\n", us);
        return ATTNRES_EINVAL;
    }
    return rc;
}

static int launch1(const launcher *l, const attnres_problem *p, int64_t T, const attnres_phase1_args *a)
{
    const ar_op_args args = ar_op_phase1(a);
    return l->plan ? attnres_run_phase1(l->plan, T, a, NULL) : kernel_launch(l, p, T, &args);
}

static int launch2(const launcher *l, const attnres_problem *p, int64_t T, const attnres_phase2_args *a)
{
    const ar_op_args args = ar_op_phase2(a);
    return l->plan ? attnres_run_phase2(l->plan, T, a, NULL) : kernel_launch(l, p, T, &args);
}

/* Runs phase1 of p on T tokens with padded strides; returns the worst
 * relative error of o1 and lse, or INFINITY when the launch failed. */
static double run_phase1_case(const launcher *l, const attnres_problem *p, int64_t T, uint64_t seed)
{
    uint64_t s = seed;
    const int64_t d = p->d, sp = d + 3, op = d + 5, lp = p->heads + 1;
    const int n = p->n, S = p->s, H = p->heads;
    const size_t es = attnres_dtype_size(p->dtype);
    char *src = calloc((size_t)(n * T * sp), es), *o1 = calloc((size_t)(S * T * op), es);
    float *lse = calloc((size_t)(S * T * lp), 4), *q = malloc(sizeof(float) * (size_t)(S * d));
    double *src_x = malloc(sizeof(double) * (size_t)(n * T * d)), *q_x = malloc(sizeof(double) * (size_t)(S * d));
    double *ref_o = malloc(sizeof(double) * (size_t)(S * T * d)), *ref_l = malloc(sizeof(double) * (size_t)(S * T * H));
    double *got_o = malloc(sizeof(double) * (size_t)(S * T * d)), *got_l = malloc(sizeof(double) * (size_t)(S * T * H));
    const void **srcs = malloc(sizeof(void *) * (size_t)n);
    const double **srcs_x = malloc(sizeof(double *) * (size_t)n);
    int64_t *strides = malloc(sizeof(int64_t) * (size_t)n);
    void **o1s = malloc(sizeof(void *) * (size_t)S);
    float **lses = malloc(sizeof(float *) * (size_t)S);
    double err = INFINITY;
    if (!src || !o1 || !lse || !q || !src_x || !q_x || !ref_o || !ref_l || !got_o || !got_l || !srcs || !srcs_x ||
        !strides || !o1s || !lses)
        goto done;
    for (int i = 0; i < n; i++) {
        srcs[i] = src + (size_t)(i * T * sp) * es;
        srcs_x[i] = src_x + i * T * d;
        strides[i] = sp;
        fill_rows(&s, p->dtype, (void *)srcs[i], T, d, sp, 0, src_x + i * T * d);
    }
    for (int64_t i = 0; i < S * d; i++) {
        q[i] = (float)(rng_normal(&s) * 3.0 / sqrt((double)d));
        q_x[i] = q[i];
    }
    for (int j = 0; j < S; j++) {
        o1s[j] = o1 + (size_t)(j * T * op) * es;
        lses[j] = lse + j * T * lp;
    }
    memset(o1, 0xff, (size_t)(S * T * op) * es); /* poison: NaN in every dtype */
    memset(lse, 0xff, (size_t)(S * T * lp) * 4);
    attnres_phase1_args a;
    attnres_phase1_args_init(&a);
    a.sources = srcs;
    a.source_strides = strides;
    a.queries = q;
    a.scale = 0.9f;
    a.eps = 1e-5f;
    a.o1 = o1s;
    a.o1_stride = op;
    a.lse = lses;
    a.lse_stride = lp;
    if (launch1(l, p, T, &a) != ATTNRES_OK)
        goto done;
    if (attnres_reference_phase1(p, T, srcs_x, q_x, 0.9, 1e-5, ref_o, ref_l) != ATTNRES_OK)
        goto done;
    for (int j = 0; j < S; j++)
        for (int64_t t = 0; t < T; t++) {
            for (int64_t k = 0; k < d; k++)
                got_o[(j * T + t) * d + k] = elem_load(p->dtype, o1s[j], t * op + k);
            for (int h = 0; h < H; h++)
                got_l[(j * T + t) * H + h] = lses[j][t * lp + h];
        }
    err = case_worse(case_rel_err(got_o, ref_o, S * T * d), case_rel_err(got_l, ref_l, S * T * H));
    if (isnan(err))
        err = INFINITY;
done:
    free(src);
    free(o1);
    free(lse);
    free(q);
    free(src_x);
    free(q_x);
    free(ref_o);
    free(ref_l);
    free(got_o);
    free(got_l);
    free(srcs);
    free(srcs_x);
    free(strides);
    free(o1s);
    free(lses);
    return err;
}

/* Runs phase2 of p on T tokens with padded strides; checks out, normed and
 * (with fuse_add) the written-back partial. */
static double run_phase2_case(const launcher *l, const attnres_problem *p, int64_t T, uint64_t seed)
{
    uint64_t s = seed;
    const int64_t d = p->d, pad = d + 7, lp = p->heads + 2, H = p->heads;
    const size_t es = attnres_dtype_size(p->dtype);
    const size_t big = (size_t)(T * pad) * es;
    char *o1 = malloc(big), *b = malloc(big), *f = malloc(big), *out = malloc(big), *normed = malloc(big);
    float *lse = malloc(sizeof(float) * (size_t)(T * lp)), *q = malloc(sizeof(float) * (size_t)d);
    float *go = malloc(sizeof(float) * (size_t)d);
    const size_t row = sizeof(double) * (size_t)(T * d);
    double *o1_x = malloc(row), *b_x = malloc(row), *f_x = malloc(row), *ref_out = malloc(row);
    double *ref_norm = malloc(row), *got = malloc(row), *lse_x = malloc(sizeof(double) * (size_t)(T * H));
    double *q_x = malloc(sizeof(double) * (size_t)d), *go_x = malloc(sizeof(double) * (size_t)d);
    double err = INFINITY;
    if (!o1 || !b || !f || !out || !normed || !lse || !q || !go || !o1_x || !b_x || !f_x || !ref_out ||
        !ref_norm || !got || !lse_x || !q_x || !go_x)
        goto done;
    fill_rows(&s, p->dtype, o1, T, d, pad, 0, o1_x);
    fill_rows(&s, p->dtype, b, T, d, pad, 0, b_x);
    fill_rows(&s, p->dtype, f, T, d, pad, 0, f_x);
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            lse[t * lp + h] = (float)(2.0 * rng_normal(&s) + 1.5);
            lse_x[t * H + h] = lse[t * lp + h];
        }
    for (int64_t k = 0; k < d; k++) {
        q[k] = (float)(rng_normal(&s) * 3.0 / sqrt((double)d));
        q_x[k] = q[k];
        go[k] = (float)(1 + 0.1 * rng_normal(&s));
        go_x[k] = go[k];
    }
    memset(out, 0xff, big);
    memset(normed, 0xff, big);
    attnres_phase2_args a;
    attnres_phase2_args_init(&a);
    a.o1 = o1;
    a.o1_stride = pad;
    a.lse = lse;
    a.lse_stride = lp;
    a.partial = b;
    a.partial_stride = pad;
    a.sublayer = f;
    a.sublayer_stride = pad;
    a.query = q;
    a.scale = 1.1f;
    a.eps = 1e-5f;
    a.out = out;
    a.out_stride = pad;
    a.out_gain = go;
    a.out_eps = 1e-5f;
    a.normed = normed;
    a.normed_stride = pad;
    if (launch2(l, p, T, &a) != ATTNRES_OK)
        goto done;
    if (attnres_reference_phase2(p, T, o1_x, lse_x, b_x, f_x, q_x, 1.1, 1e-5, go_x, 1e-5, ref_out, ref_norm) !=
        ATTNRES_OK)
        goto done;
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < d; k++)
            got[t * d + k] = elem_load(p->dtype, out, t * pad + k);
    err = case_rel_err(got, ref_out, T * d);
    if (p->epilogue) {
        for (int64_t t = 0; t < T; t++)
            for (int64_t k = 0; k < d; k++)
                got[t * d + k] = elem_load(p->dtype, normed, t * pad + k);
        err = case_worse(err, case_rel_err(got, ref_norm, T * d));
    }
    /* The partial: b + f when the add is fused (b_x was updated by the
     * reference), untouched otherwise. */
    for (int64_t t = 0; t < T; t++)
        for (int64_t k = 0; k < d; k++)
            got[t * d + k] = elem_load(p->dtype, b, t * pad + k);
    err = case_worse(err, case_rel_err(got, b_x, T * d));
    if (isnan(err))
        err = INFINITY;
done:
    free(o1);
    free(b);
    free(f);
    free(out);
    free(normed);
    free(lse);
    free(q);
    free(go);
    free(o1_x);
    free(b_x);
    free(f_x);
    free(ref_out);
    free(ref_norm);
    free(got);
    free(lse_x);
    free(q_x);
    free(go_x);
    return err;
}

static void phase1_problem(attnres_problem *p, attnres_dtype dt, int64_t d, int32_t n, int32_t s, int32_t h)
{
    attnres_problem_init(p, dt, d, n);
    p->op = ATTNRES_OP_PHASE1;
    p->s = s;
    p->heads = h;
}

static void phase2_problem(attnres_problem *p, attnres_dtype dt, int64_t d, int32_t h, int fuse, int epi)
{
    attnres_problem_init(p, dt, d, 1);
    p->op = ATTNRES_OP_PHASE2;
    p->heads = h;
    p->fuse_add = fuse;
    p->epilogue = epi;
}

/* ------------------------------------------------------------------------
 * The built-in generic kernels through the public API
 * ---------------------------------------------------------------------- */

static void test_generic_phase1_matches_reference_every_dtype(void)
{
    static const struct { int64_t d, T; int32_t n, s, h; } shapes[] = {
        {64, 37, 5, 3, 2}, {37, 4, 3, 2, 1}, {96, 9, 1, 4, 8}, {128, 130, 9, 1, 1}};
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            attnres_problem p;
            phase1_problem(&p, all_dtypes[di], shapes[si].d, shapes[si].n, shapes[si].s, shapes[si].h);
            attnres_plan *plan = NULL;
            char msg[512];
            REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg) == ATTNRES_OK);
            CHECK(attnres_plan_level_get(plan) == ATTNRES_LEVEL_GENERIC);
            launcher l = {plan, NULL, 0};
            double err = run_phase1_case(&l, &p, shapes[si].T, 100 + si * 7 + di);
            CHECK(err <= case_tolerance(p.dtype));
            if (!(err <= case_tolerance(p.dtype)))
                fprintf(stderr, "  %s d=%lld n=%d S=%d H=%d: rel err %g (%s)\n", attnres_dtype_name(p.dtype),
                        (long long)p.d, p.n, p.s, p.heads, err, attnres_plan_errmsg(plan));
            attnres_plan_destroy(plan);
        }
}

static void test_generic_phase2_matches_reference_every_dtype(void)
{
    static const struct { int64_t d, T; int32_t h; int fuse, epi; } shapes[] = {
        {64, 37, 2, 1, 1}, {37, 4, 1, 0, 0}, {96, 9, 8, 1, 0}, {128, 130, 1, 0, 1}};
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            attnres_problem p;
            phase2_problem(&p, all_dtypes[di], shapes[si].d, shapes[si].h, shapes[si].fuse, shapes[si].epi);
            attnres_plan *plan = NULL;
            char msg[512];
            REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg) == ATTNRES_OK);
            launcher l = {plan, NULL, 0};
            double err = run_phase2_case(&l, &p, shapes[si].T, 200 + si * 7 + di);
            CHECK(err <= case_tolerance(p.dtype));
            if (!(err <= case_tolerance(p.dtype)))
                fprintf(stderr, "  %s d=%lld H=%d fuse=%d epi=%d: rel err %g (%s)\n", attnres_dtype_name(p.dtype),
                        (long long)p.d, p.heads, p.fuse_add, p.epilogue, err, attnres_plan_errmsg(plan));
            attnres_plan_destroy(plan);
        }
}

/* ------------------------------------------------------------------------
 * Tuned variants, compiled as the tuner compiles them
 * ---------------------------------------------------------------------- */

/* Compiles and loads variant id of template g; 0 on success. */
static int compile_variant(argen *g, const char *id, ar_kernel *k) { return compile_variant_on(cpu, g, id, k); }

/* Compiles source as the tuner would and loads it; the load's status. */
static int compile_and_load(const char *src, const char *name, const char *json, ar_kernel *k)
{
    void *blob = NULL;
    size_t size = 0;
    char *log = NULL;
    memset(k, 0, sizeof *k);
    int rc = cpu->ops->compile(cpu, src, name, &blob, &size, &log);
    free(log);
    if (rc == 0)
        rc = cpu->ops->load(cpu, blob, size, src, name, json, k);
    free(blob);
    return rc;
}

/* Replaces the first "from" in *src (malloc'ed) by "to". */
static void replace_once(char **src, const char *from, const char *to)
{
    char *at = strstr(*src, from);
    REQUIRE(at != NULL);
    size_t head = (size_t)(at - *src), flen = strlen(from), tlen = strlen(to), rest = strlen(at + flen);
    char *out = malloc(head + tlen + rest + 1);
    REQUIRE(out != NULL);
    memcpy(out, *src, head);
    memcpy(out + head, to, tlen);
    memcpy(out + head + tlen, at + flen, rest + 1);
    free(*src);
    *src = out;
}

/* A kernel carries its struct's version and its op; the loader compares the
 * version with its own for that op only, so a bump of one op's struct
 * refuses that op's kernels and no other's. */
static void test_kernel_abi_is_checked_per_op(void)
{
    static const int current[AR_OPS] = {1, 1, 1, 1}, mix_bumped[AR_OPS] = {2, 1, 1, 1};
    char why[200];
    CHECK(ar_kernel_abi_ok(current, 1, ATTNRES_OP_PHASE1, why, sizeof why));
    CHECK(ar_kernel_abi_ok(mix_bumped, 1, ATTNRES_OP_PHASE1, why, sizeof why));
    CHECK(ar_kernel_abi_ok(mix_bumped, 1, ATTNRES_OP_PHASE2, why, sizeof why));
    CHECK(!ar_kernel_abi_ok(mix_bumped, 1, ATTNRES_OP_MIX, why, sizeof why) && strstr(why, "mix ABI 1"));
    CHECK(ar_kernel_abi_ok(mix_bumped, 2, ATTNRES_OP_MIX, why, sizeof why));
    /* Untagged kernels predate per-op versions: version 1 of every op. */
    CHECK(ar_kernel_abi_ok(current, 1, -1, why, sizeof why));
    CHECK(!ar_kernel_abi_ok(mix_bumped, 1, -1, why, sizeof why) && strstr(why, "no op tag"));
    CHECK(!ar_kernel_abi_ok(current, 1, 7, why, sizeof why) && strstr(why, "names no op"));

    /* The same through the loader, on a real phase-1 kernel. */
    char msg[2048], *id = NULL, *src = NULL, *name = NULL, *json = NULL;
    argen *g;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/phase1", &g, msg, sizeof msg) == 0);
    REQUIRE(argen_generic(g, "f32", &id) == 0);
    REQUIRE(argen_emit(g, id, &src, &name, &json) == 0);
    /* The struct comes from the one definition, layout checks included. */
    CHECK(strstr(src, "templates/lib/kernel_abi.lua") != NULL);
    CHECK(strstr(src, "_Static_assert(sizeof(attnres_cpu_phase1_args) == ") != NULL);
    ar_kernel k;
    CHECK(compile_and_load(src, name, json, &k) == ATTNRES_OK);
    cpu->ops->unload(cpu, &k);
    char from[300], to[300];
    snprintf(from, sizeof from, "const int %s_abi = %d;", name, AR_KERNEL_ABI_CPU_PHASE1);
    snprintf(to, sizeof to, "const int %s_abi = %d;", name, AR_KERNEL_ABI_CPU_PHASE1 + 1);
    replace_once(&src, from, to);
    CHECK(compile_and_load(src, name, json, &k) == ATTNRES_ELOAD);
    CHECK(strstr(attnres_device_errmsg(cpu), "phase1 ABI") != NULL);
    /* Back to the right version, without the op tag: an older kernel. */
    replace_once(&src, to, from);
    snprintf(from, sizeof from, "const int %s_abi_op = ", name);
    snprintf(to, sizeof to, "const int %s_abi_op_untagged = ", name);
    replace_once(&src, from, to);
    CHECK(compile_and_load(src, name, json, &k) == ATTNRES_OK);
    cpu->ops->unload(cpu, &k);
    free(id);
    free(src);
    free(name);
    free(json);
    argen_close(g);
}

/* Replaces the first "\"threads\":N" of a params JSON by "\"threads\":to". */
static void set_threads(char **json, const char *to)
{
    char *at = strstr(*json, "\"threads\":");
    REQUIRE(at != NULL);
    const char *num = at + strlen("\"threads\":");
    char from[64];
    snprintf(from, sizeof from, "\"threads\":%.*s", (int)strspn(num, "-0123456789"), num);
    char repl[64];
    snprintf(repl, sizeof repl, "\"threads\":%s", to);
    replace_once(json, from, repl);
}

/* A CPU kernel's thread count is a launch parameter: the loader takes it
 * from the variant's parameters, so that one binary serves every thread
 * count; a binary generated before, which exports <kernel>_threads, keeps
 * the count it exports; with neither the load fails naming the kernel. */
static void test_kernel_threads_come_from_params_or_an_older_binary(void)
{
    char msg[2048], *id = NULL, *src = NULL, *name = NULL, *json = NULL;
    argen *g;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/phase2", &g, msg, sizeof msg) == 0);
    REQUIRE(argen_generic(g, "f32", &id) == 0);
    REQUIRE(argen_emit(g, id, &src, &name, &json) == 0);
    CHECK(strstr(src, "_threads") == NULL);
    ar_kernel k;
    CHECK(compile_and_load(src, name, json, &k) == ATTNRES_OK);
    CHECK(k.threads == (int)ar_json_int(json, "threads", -1));
    cpu->ops->unload(cpu, &k);
    set_threads(&json, "3");
    CHECK(compile_and_load(src, name, json, &k) == ATTNRES_OK);
    CHECK(k.threads == 3);
    cpu->ops->unload(cpu, &k);
    set_threads(&json, "0");
    CHECK(compile_and_load(src, name, json, &k) == ATTNRES_ELOAD);
    CHECK(strstr(attnres_device_errmsg(cpu), name) && strstr(attnres_device_errmsg(cpu), "0 threads"));
    CHECK(compile_and_load(src, name, "{\"vec\":1}", &k) == ATTNRES_ELOAD);
    CHECK(strstr(attnres_device_errmsg(cpu), name) && strstr(attnres_device_errmsg(cpu), "no thread count"));
    CHECK(compile_and_load(src, name, NULL, &k) == ATTNRES_ELOAD);
    CHECK(strstr(attnres_device_errmsg(cpu), "no thread count") != NULL);

    /* An older binary: its exported count wins over the parameters. */
    char old[300];
    snprintf(old, sizeof old, "void %s(", name);
    char with_symbol[400];
    snprintf(with_symbol, sizeof with_symbol, "const int %s_threads = 5;\n\nvoid %s(", name, name);
    replace_once(&src, old, with_symbol);
    set_threads(&json, "2");
    CHECK(compile_and_load(src, name, json, &k) == ATTNRES_OK);
    CHECK(k.threads == 5);
    cpu->ops->unload(cpu, &k);
    CHECK(compile_and_load(src, name, NULL, &k) == ATTNRES_OK);
    CHECK(k.threads == 5);
    cpu->ops->unload(cpu, &k);
    free(id);
    free(src);
    free(name);
    free(json);
    argen_close(g);
}

/* Which variants to try: all f32 schedules, widths and unrolls with two
 * threads, and a few widths for bf16 and f16 (the compiler is slow). */
static int variant_selected(const char *id)
{
    if (strstr(id, "_f32_"))
        return strstr(id, "_t2") != NULL;
    if (!strstr(id, "_t1"))
        return 0;
    return strstr(id, "_v8_u2_") || strstr(id, "_v16_u1_") || strstr(id, "_v1_u2_");
}

static void test_template_variants(const char *name, int op)
{
    char msg[1024];
    argen *g = NULL;
    REQUIRE(argen_open(TEMPLATE_DIR, name, &g, msg, sizeof msg) == 0);
    argen_variant *v = NULL;
    size_t nv = 0;
    REQUIRE(argen_enumerate(g, &v, &nv) == 0);
    argen_device ad = {.backend = "cpu", .arch = cpu->arch, .units = cpu->units};
    int tried = 0;
    for (size_t i = 0; i < nv; i++) {
        /* Each variant is a unit: --case CASE/VARIANT_ID runs it alone. */
        if (!variant_selected(v[i].id) || !check_unit(v[i].id))
            continue;
        attnres_dtype dt = strstr(v[i].id, "_bf16_") ? ATTNRES_DTYPE_BF16
                           : strstr(v[i].id, "_f16_") ? ATTNRES_DTYPE_F16
                                                      : ATTNRES_DTYPE_F32;
        attnres_problem p;
        if (op == 1)
            phase1_problem(&p, dt, 128, 5, 3, 2);
        else
            phase2_problem(&p, dt, 128, 2, 1, 1);
        argen_problem ap = {.op = op == 1 ? "phase1" : "phase2", .dtype = attnres_dtype_name(dt),
                            .form = "replace", .d = p.d, .t = 67, .n = p.n, .heads = p.heads,
                            .epilogue = p.epilogue, .s = p.s};
        char why[256];
        int applies = argen_applies(g, v[i].id, &ap, &ad, why, sizeof why);
        CHECK(applies >= 0);
        if (applies <= 0)
            continue;
        ar_kernel k;
        int rc = compile_variant(g, v[i].id, &k);
        CHECK(rc == 0);
        if (rc)
            continue;
        tried++;
        launcher l = {NULL, &k, 0};
        double err = op == 1 ? run_phase1_case(&l, &p, 67, 300 + i) : run_phase2_case(&l, &p, 67, 300 + i);
        CHECK(err <= case_tolerance(dt));
        if (!(err <= case_tolerance(dt)))
            fprintf(stderr, "  %s: rel err %g\n", v[i].id, err);
        if (op == 1) {
            /* Head slices of 112 elements: the tiled mix's steps of 4
             * vectors leave a tail (one step of 64 and 48 more at 16
             * lanes, three of 32 and 16 more at 8); 7 sites leave a group
             * at the edge. */
            phase1_problem(&p, dt, 224, 4, 7, 2);
            ap.d = p.d, ap.n = p.n, ap.s = p.s;
            if (argen_applies(g, v[i].id, &ap, &ad, why, sizeof why) > 0) {
                err = run_phase1_case(&l, &p, 9, 500 + i);
                CHECK(err <= case_tolerance(dt));
                if (!(err <= case_tolerance(dt)))
                    fprintf(stderr, "  %s at d=224: rel err %g\n", v[i].id, err);
            }
        }
        if (op == 2) {
            /* Without the fused add the kernel gathers b's statistics in a
             * sweep of its own (its other loop). */
            p.fuse_add = 0;
            err = run_phase2_case(&l, &p, 67, 700 + i);
            CHECK(err <= case_tolerance(dt));
            if (!(err <= case_tolerance(dt)))
                fprintf(stderr, "  %s without the fused add: rel err %g\n", v[i].id, err);
        }
        cpu->ops->unload(cpu, &k);
    }
    check_units_end();
    if (check_every_unit())
        CHECK(tried >= 10);
    printf("     %s: %d variant(s) compiled and checked\n", name, tried);
    argen_variants_free(v, nv);
    argen_close(g);
}

static void test_phase1_template_variants_match_reference(void) { test_template_variants("cpu/phase1", 1); }
static void test_phase2_template_variants_match_reference(void) { test_template_variants("cpu/phase2", 2); }

/* The op-generic time slot runs phase 1 and phase 2 (the tuner times them
 * through it on every backend): the generic kernels, launched through it
 * once, match the reference, and several repetitions give a time each. */
static void test_time_slot_runs_phase_ops(void)
{
    attnres_problem p1, p2;
    phase1_problem(&p1, ATTNRES_DTYPE_F32, 64, 5, 3, 2);
    phase2_problem(&p2, ATTNRES_DTYPE_BF16, 96, 4, 1, 1);
    ar_kernel k1, k2;
    memset(&k1, 0, sizeof k1);
    memset(&k2, 0, sizeof k2);
    REQUIRE(cpu->ops->load_generic(cpu, &p1, &k1) == ATTNRES_OK);
    REQUIRE(cpu->ops->load_generic(cpu, &p2, &k2) == ATTNRES_OK);
    launcher l1 = {NULL, &k1, 1}, l2 = {NULL, &k2, 1};
    double e1 = run_phase1_case(&l1, &p1, 37, 901), e2 = run_phase2_case(&l2, &p2, 19, 902);
    CHECK(e1 <= case_tolerance(p1.dtype));
    CHECK(e2 <= case_tolerance(p2.dtype));
    if (!(e1 <= case_tolerance(p1.dtype)) || !(e2 <= case_tolerance(p2.dtype)))
        fprintf(stderr, "  timed phase1 rel err %g, phase2 %g (%s)\n", e1, e2, attnres_device_errmsg(cpu));
    /* Three repetitions on T = 0 time empty launches: three times, each >= 0. */
    attnres_phase1_args a1;
    attnres_phase1_args_init(&a1);
    const ar_op_args args1 = ar_op_phase1(&a1);
    double us[3] = {-1, -1, -1};
    CHECK(cpu->ops->time(cpu, &k1, &p1, 0, &args1, 3, 0, us) == ATTNRES_OK);
    CHECK(us[0] >= 0 && us[1] >= 0 && us[2] >= 0);
    /* Arguments of another op are refused by name, never run. */
    attnres_phase2_args a2;
    attnres_phase2_args_init(&a2);
    const ar_op_args wrong = ar_op_phase2(&a2);
    CHECK(cpu->ops->time(cpu, &k1, &p1, 4, &wrong, 1, 0, us) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_device_errmsg(cpu), "op") != NULL);
    CHECK(cpu->ops->launch(cpu, &k1, &p1, 4, &wrong, NULL) == ATTNRES_EINVAL);
    cpu->ops->unload(cpu, &k1);
    cpu->ops->unload(cpu, &k2);
}

static void test_phase1_applies_refuses_other_ops_and_widths(void)
{
    char msg[1024], why[256];
    argen *g = NULL;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/phase1", &g, msg, sizeof msg) == 0);
    argen_device ad = {.backend = "cpu", .arch = "x86_64-avx512", .units = 64};
    argen_problem ap = {.op = "phase1", .dtype = "f32", .form = "replace", .d = 128, .t = 1, .n = 3, .heads = 1,
                        .s = 2};
    CHECK(argen_applies(g, "phase1_c_f32_siteouter_persite_v16_u2_t4", &ap, &ad, why, sizeof why) == 1);
    ap.op = "mix";
    CHECK(argen_applies(g, "phase1_c_f32_siteouter_persite_v16_u2_t4", &ap, &ad, why, sizeof why) == 0);
    ap.op = "phase1";
    ap.d = 48; /* 48 is not a multiple of 32 */
    CHECK(argen_applies(g, "phase1_c_f32_siteouter_persite_v16_u2_t4", &ap, &ad, why, sizeof why) == 0);
    CHECK(strstr(why, "multiple") != NULL);
    ap.d = 128;
    ap.s = 0;
    CHECK(argen_applies(g, "phase1_c_f32_siteouter_persite_v16_u2_t4", &ap, &ad, why, sizeof why) == 0);
    char *id = NULL;
    REQUIRE(argen_generic(g, "bf16", &id) == 0);
    CHECK(strcmp(id, "phase1_c_bf16_siteouter_persite_v1_u1_t64") == 0);
    free(id);
    argen_close(g);
}

/* ------------------------------------------------------------------------
 * Problems and arguments that are refused
 * ---------------------------------------------------------------------- */

static void test_problem_check_for_phase_ops(void)
{
    char msg[256];
    attnres_problem p;
    phase1_problem(&p, ATTNRES_DTYPE_F32, 64, 3, 2, 1);
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_OK);
    phase2_problem(&p, ATTNRES_DTYPE_F32, 64, 4, 1, 1);
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_OK);

#define EXPECT_BAD(setup, needle)                                                   \
    do {                                                                            \
        setup;                                                                      \
        msg[0] = 0;                                                                 \
        CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_EINVAL);        \
        CHECK(strstr(msg, needle) != NULL);                                         \
        attnres_plan *plan_ = NULL;                                                 \
        CHECK(attnres_plan_create(cpu, NULL, &p, 0, &plan_, NULL, 0) == ATTNRES_EINVAL); \
        CHECK(plan_ == NULL);                                                       \
    } while (0)
    EXPECT_BAD(phase1_problem(&p, ATTNRES_DTYPE_F32, 64, 3, 0, 1), "S");
    EXPECT_BAD(phase1_problem(&p, ATTNRES_DTYPE_F32, 64, 3, 5000, 1), "S");
    EXPECT_BAD((phase1_problem(&p, ATTNRES_DTYPE_F32, 64, 3, 2, 1), p.epilogue = 1), "epilogue");
    EXPECT_BAD((phase1_problem(&p, ATTNRES_DTYPE_F32, 64, 3, 2, 1), p.form = ATTNRES_FORM_ADDITIVE), "additive");
    EXPECT_BAD((phase1_problem(&p, ATTNRES_DTYPE_F32, 64, 3, 2, 1), p.fuse_add = 1), "fuse_add");
    EXPECT_BAD((attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 3), p.s = 2), "phase1");
    EXPECT_BAD((attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 3), p.fuse_add = 1), "fuse_add");
    EXPECT_BAD((phase2_problem(&p, ATTNRES_DTYPE_F32, 64, 1, 2, 0)), "fuse_add");
    EXPECT_BAD((phase2_problem(&p, ATTNRES_DTYPE_F32, 64, 1, 0, 0), p.s = 1), "phase1");
    EXPECT_BAD((attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 3), p.op = (attnres_op)9), "op");
#undef EXPECT_BAD
}

static void test_phase_runs_refuse_bad_arguments(void)
{
    attnres_problem p1, p2, pm;
    phase1_problem(&p1, ATTNRES_DTYPE_F32, 16, 2, 2, 2);
    phase2_problem(&p2, ATTNRES_DTYPE_F32, 16, 2, 1, 1);
    attnres_problem_init(&pm, ATTNRES_DTYPE_F32, 16, 2);
    attnres_plan *plan1 = NULL, *plan2 = NULL, *planm = NULL;
    REQUIRE(attnres_plan_create(cpu, NULL, &p1, 0, &plan1, NULL, 0) == ATTNRES_OK);
    REQUIRE(attnres_plan_create(cpu, NULL, &p2, 0, &plan2, NULL, 0) == ATTNRES_OK);
    REQUIRE(attnres_plan_create(cpu, NULL, &pm, 0, &planm, NULL, 0) == ATTNRES_OK);
    float src[2][32], q[32], o1a[32], o1b[32], lsea[4], lseb[4], b[32], f[32], out[32], normed[32], g[16];
    for (int i = 0; i < 32; i++)
        src[0][i] = src[1][i] = q[i] = b[i] = f[i] = 0.5f + (float)i / 32;
    for (int i = 0; i < 16; i++)
        g[i] = 1;
    const void *srcs[2] = {src[0], src[1]};
    void *o1s[2] = {o1a, o1b};
    float *lses[2] = {lsea, lseb};
    attnres_phase1_args a1;
    attnres_phase1_args_init(&a1);
    a1.sources = srcs;
    a1.queries = q;
    a1.o1 = o1s;
    a1.lse = lses;
    CHECK(attnres_run_phase1(plan1, 2, &a1, NULL) == ATTNRES_OK);
    CHECK(attnres_run_phase1(plan1, 0, NULL, NULL) == ATTNRES_OK); /* T = 0: no-op */
    CHECK(attnres_run_phase1(NULL, 2, &a1, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_run_phase1(plan1, -1, &a1, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_run_phase1(plan1, 2, NULL, NULL) == ATTNRES_EINVAL);
    attnres_phase1_args bad = a1;
    void *o1_null[2] = {o1a, NULL};
    bad.o1 = o1_null;
    CHECK(attnres_run_phase1(plan1, 2, &bad, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan1), "site 1") != NULL);
    bad = a1;
    bad.eps = 0;
    CHECK(attnres_run_phase1(plan1, 2, &bad, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan1), "eps") != NULL);
    bad = a1;
    bad.o1_stride = 15;
    CHECK(attnres_run_phase1(plan1, 2, &bad, NULL) == ATTNRES_EMISMATCH);
    bad = a1;
    bad.lse_stride = 1;
    CHECK(attnres_run_phase1(plan1, 2, &bad, NULL) == ATTNRES_EMISMATCH);
    bad = a1;
    const void *misaligned[2] = {(const char *)src[0] + 1, src[1]};
    bad.sources = misaligned;
    CHECK(attnres_run_phase1(plan1, 2, &bad, NULL) == ATTNRES_EINVAL);

    attnres_phase2_args a2;
    attnres_phase2_args_init(&a2);
    a2.o1 = o1a;
    a2.lse = lsea;
    a2.partial = b;
    a2.sublayer = f;
    a2.query = q;
    a2.out = out;
    a2.out_gain = g;
    a2.normed = normed;
    CHECK(attnres_run_phase2(plan2, 2, &a2, NULL) == ATTNRES_OK);
    attnres_phase2_args bad2 = a2;
    bad2.sublayer = NULL; /* the plan fuses the add */
    CHECK(attnres_run_phase2(plan2, 2, &bad2, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan2), "sublayer") != NULL);
    bad2 = a2;
    bad2.normed = NULL;
    CHECK(attnres_run_phase2(plan2, 2, &bad2, NULL) == ATTNRES_EINVAL);
    bad2 = a2;
    bad2.out_eps = NAN;
    CHECK(attnres_run_phase2(plan2, 2, &bad2, NULL) == ATTNRES_EINVAL);
    bad2 = a2;
    bad2.partial_stride = 8;
    CHECK(attnres_run_phase2(plan2, 2, &bad2, NULL) == ATTNRES_EMISMATCH);
    bad2 = a2;
    bad2.lse = NULL;
    CHECK(attnres_run_phase2(plan2, 2, &bad2, NULL) == ATTNRES_EINVAL);

    /* A plan runs only its own op. */
    attnres_mix_args am;
    attnres_mix_args_init(&am);
    am.sources = srcs;
    am.query = q;
    am.out = out;
    CHECK(attnres_run_mix(planm, 2, &am, NULL) == ATTNRES_OK);
    CHECK(attnres_run_mix(plan1, 2, &am, NULL) == ATTNRES_EMISMATCH);
    CHECK(strstr(attnres_plan_errmsg(plan1), "phase1") != NULL);
    CHECK(attnres_run_phase1(plan2, 2, &a1, NULL) == ATTNRES_EMISMATCH);
    CHECK(attnres_run_phase2(plan1, 2, &a2, NULL) == ATTNRES_EMISMATCH);
    CHECK(attnres_run_phase2(planm, 2, &a2, NULL) == ATTNRES_EMISMATCH);

    /* The explanation names the op. */
    char text[2048];
    attnres_plan_explain(plan1, text, sizeof text);
    CHECK(strstr(text, "phase1") != NULL && strstr(text, "S=2") != NULL);
    attnres_plan_destroy(plan1);
    attnres_plan_destroy(plan2);
    attnres_plan_destroy(planm);
}

/* More per-token softmax weights than the CPU kernels keep on the stack is
 * refused when the plan is made, with a message, rather than overflowing
 * the stack or failing only at the first run. */
static void test_phase1_too_many_weights_is_refused_at_plan(void)
{
    enum { N = 64, S = 64, H = 16, D = 16 };
    attnres_problem p;
    phase1_problem(&p, ATTNRES_DTYPE_F32, D, N, S, H);
    attnres_plan *plan = NULL;
    char msg[512] = "";
    CHECK(attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(plan == NULL);
    CHECK(strstr(msg, "softmax weights") != NULL);
}

static void test_nan_in_one_token_stays_in_that_token(void)
{
    enum { N = 3, S = 2, T = 5, D = 16, H = 2 };
    attnres_problem p1, p2;
    phase1_problem(&p1, ATTNRES_DTYPE_F32, D, N, S, H);
    phase2_problem(&p2, ATTNRES_DTYPE_F32, D, H, 0, 0);
    attnres_plan *plan1 = NULL, *plan2 = NULL;
    REQUIRE(attnres_plan_create(cpu, NULL, &p1, 0, &plan1, NULL, 0) == ATTNRES_OK);
    REQUIRE(attnres_plan_create(cpu, NULL, &p2, 0, &plan2, NULL, 0) == ATTNRES_OK);
    static float src[N][T * D], q[S * D], o1[S][T * D], lse[S][T * H], b[T * D], out[T * D];
    uint64_t s = 9;
    for (int i = 0; i < N; i++)
        for (int k = 0; k < T * D; k++)
            src[i][k] = (float)rng_normal(&s);
    for (int k = 0; k < S * D; k++)
        q[k] = (float)rng_normal(&s);
    for (int k = 0; k < T * D; k++)
        b[k] = (float)rng_normal(&s);
    src[1][3 * D + 4] = NAN; /* source 1, token 3 */
    const void *srcs[N] = {src[0], src[1], src[2]};
    void *o1s[S] = {o1[0], o1[1]};
    float *lses[S] = {lse[0], lse[1]};
    attnres_phase1_args a1;
    attnres_phase1_args_init(&a1);
    a1.sources = srcs;
    a1.queries = q;
    a1.o1 = o1s;
    a1.lse = lses;
    REQUIRE(attnres_run_phase1(plan1, T, &a1, NULL) == ATTNRES_OK);
    for (int j = 0; j < S; j++)
        for (int t = 0; t < T; t++) {
            int nan_o = 0, nan_l = 0;
            for (int k = 0; k < D; k++)
                nan_o += isnan(o1[j][t * D + k]) != 0;
            for (int h = 0; h < H; h++)
                nan_l += isnan(lse[j][t * H + h]) != 0;
            CHECK(t == 3 ? nan_o == D && nan_l == H : nan_o == 0 && nan_l == 0);
        }
    b[1 * D + 9] = NAN; /* token 1 of the partial */
    attnres_phase2_args a2;
    attnres_phase2_args_init(&a2);
    a2.o1 = o1[0];
    a2.lse = lse[0];
    a2.partial = b;
    a2.query = q;
    a2.out = out;
    REQUIRE(attnres_run_phase2(plan2, T, &a2, NULL) == ATTNRES_OK);
    for (int t = 0; t < T; t++) {
        int nan_o = 0;
        for (int k = 0; k < D; k++)
            nan_o += isnan(out[t * D + k]) != 0;
        CHECK(t == 1 || t == 3 ? nan_o > 0 : nan_o == 0);
    }
    attnres_plan_destroy(plan1);
    attnres_plan_destroy(plan2);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (scratch_cpu_open("phase", tmpdir, sizeof tmpdir, &cpu) != 0)
        return 1;
    RUN_CASE(test_reference_phase1_then_phase2_equals_mix_over_n_plus_one);
    RUN_CASE(test_problem_check_for_phase_ops);
    RUN_CASE(test_phase_runs_refuse_bad_arguments);
    RUN_CASE(test_generic_phase1_matches_reference_every_dtype);
    RUN_CASE(test_generic_phase2_matches_reference_every_dtype);
    RUN_CASE(test_nan_in_one_token_stays_in_that_token);
    RUN_CASE(test_phase1_too_many_weights_is_refused_at_plan);
    RUN_CASE(test_phase1_applies_refuses_other_ops_and_widths);
    RUN_CASE(test_time_slot_runs_phase_ops);
    RUN_CASE(test_kernel_abi_is_checked_per_op);
    RUN_CASE(test_kernel_threads_come_from_params_or_an_older_binary);
    RUN_CASE(test_phase1_template_variants_match_reference);
    RUN_CASE(test_phase2_template_variants_match_reference);
    attnres_device_close(cpu);
    scratch_remove(tmpdir);
    CHECK_EXIT();
}
