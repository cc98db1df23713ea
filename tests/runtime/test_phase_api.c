/*
 * test_phase_api.c - the Block AttnRes two-phase form (phase1, phase2) on the
 * CPU device, but for its kernels against the reference (the op x backend
 * harness, tests/backend_ops, runs those): the fp64 references' identity
 * with the mix (phase1 over n sources followed by phase2 with b equals the
 * mix over the n + 1 sources with b last), the problem checks, the public
 * run functions' argument checks, NaN confined to its token, the time slot
 * the tuner launches through, the per-op kernel ABI and the thread count
 * a kernel loads with.
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
#include "test_phase_case.h"
#include "test_variant.h"

#ifndef TEMPLATE_DIR
#error "TEMPLATE_DIR must name the templates/ folder"
#endif

static char tmpdir[512];
static attnres_device *cpu;



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
    /* n, sites, heads, fused add, epilogue */
    static const int32_t cases[][5] = {{1, 1, 1, 0, 0}, {4, 3, 1, 0, 0}, {5, 2, 4, 1, 0}, {3, 4, 6, 0, 1}, {9, 2, 8, 1, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        check_identity(cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4], i + 1);
}

/* ------------------------------------------------------------------------
 * Kernels compiled as the tuner compiles them, and their loader
 * ---------------------------------------------------------------------- */

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

/* The generic f32 kernel of a CPU template, emitted: its source, kernel
 * name and parameters (each malloc'ed). */
typedef struct emitted {
    char *id, *src, *name, *json;
} emitted;

static int emit_generic(const char *template_name, emitted *e)
{
    char msg[2048];
    argen *g = NULL;
    memset(e, 0, sizeof *e);
    int rc = argen_open(TEMPLATE_DIR, template_name, &g, msg, sizeof msg);
    if (rc == 0)
        rc = argen_generic(g, "f32", &e->id);
    if (rc == 0)
        rc = argen_emit(g, e->id, &e->src, &e->name, &e->json);
    if (rc)
        fprintf(stderr, "  %s: %s\n", template_name, g ? argen_errmsg(g) : msg);
    argen_close(g);
    return rc;
}

static void emitted_free(emitted *e)
{
    free(e->id);
    free(e->src);
    free(e->name);
    free(e->json);
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
    emitted e;
    REQUIRE(emit_generic("cpu/phase1", &e) == 0);
    char *src = e.src, *name = e.name, *json = e.json;
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
    e.src = src, e.json = json;
    emitted_free(&e);
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
    emitted e;
    REQUIRE(emit_generic("cpu/phase2", &e) == 0);
    char *src = e.src, *name = e.name, *json = e.json;
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
    e.src = src, e.json = json;
    emitted_free(&e);
}

/* The op-generic time slot runs phase 1 and phase 2 (the tuner times them
 * through it on every backend): the generic kernels, launched through it
 * once, match the reference, and several repetitions give a time each. */
/* One launch of kernel k through the time slot; a time that is negative or
 * not finite fails the launch, so the case reports it. */
static int timed_launch(void *k, const attnres_problem *p, int64_t T, const ar_op_args *args)
{
    double us = -1.0;
    int rc = cpu->ops->time(cpu, k, p, T, args, 1, 1, &us);
    if (rc == ATTNRES_OK && !(us >= 0.0 && us < 1e12)) {
        fprintf(stderr, "  the time slot reported %g us\n", us);
        return ATTNRES_EINVAL;
    }
    return rc;
}

static int timed_phase1(void *k, const attnres_problem *p, int64_t T, const attnres_phase1_args *a)
{
    const ar_op_args args = ar_op_phase1(a);
    return timed_launch(k, p, T, &args);
}

static int timed_phase2(void *k, const attnres_problem *p, int64_t T, const attnres_phase2_args *a)
{
    const ar_op_args args = ar_op_phase2(a);
    return timed_launch(k, p, T, &args);
}

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
    const phase_case_errors e1 = phase1_case_run(&p1, 37, 901, 1, timed_phase1, &k1);
    const phase_case_errors e2 = phase2_case_run(&p2, 19, 902, 1, timed_phase2, &k2);
    const double tol1 = case_tolerance(p1.dtype), tol2 = case_tolerance(p2.dtype);
    const int ok1 = e1.out <= tol1 && e1.lse <= 1e-5, ok2 = e2.out <= tol2 && e2.normed <= tol2 && e2.partial <= tol2;
    CHECK(ok1);
    CHECK(ok2);
    if (!ok1 || !ok2)
        fprintf(stderr, "  timed phase1 rel err %g (lse %g), phase2 %g (normed %g, partial %g) (%s)\n", e1.out,
                e1.lse, e2.out, e2.normed, e2.partial, attnres_device_errmsg(cpu));
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
    a1.sources = srcs, a1.queries = q;
    a1.o1 = o1s, a1.lse = lses;
    CHECK(attnres_run_phase1(plan1, 2, &a1, NULL) == ATTNRES_OK);
    CHECK(attnres_run_phase1(plan1, 0, NULL, NULL) == ATTNRES_OK); /* T = 0: no-op */
    CHECK(attnres_run_phase1(NULL, 2, &a1, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_run_phase1(plan1, -1, &a1, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_run_phase1(plan1, 2, NULL, NULL) == ATTNRES_EINVAL);
    /* Each change of the arguments that run alone is refused. */
#define RUN_CHANGED(run, plan, args, change, want)                          \
    do {                                                                   \
        __typeof__(args) bad = (args);                                     \
        change;                                                            \
        CHECK(run(plan, 2, &bad, NULL) == (want));                         \
    } while (0)
#define RUN1_CHANGED(change, want) RUN_CHANGED(attnres_run_phase1, plan1, a1, change, want)
#define RUN2_CHANGED(change, want) RUN_CHANGED(attnres_run_phase2, plan2, a2, change, want)
    void *o1_null[2] = {o1a, NULL};
    RUN1_CHANGED(bad.o1 = o1_null, ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan1), "site 1") != NULL);
    RUN1_CHANGED(bad.eps = 0, ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan1), "eps") != NULL);
    RUN1_CHANGED(bad.o1_stride = 15, ATTNRES_EMISMATCH);
    RUN1_CHANGED(bad.lse_stride = 1, ATTNRES_EMISMATCH);
    const void *misaligned[2] = {(const char *)src[0] + 1, src[1]};
    RUN1_CHANGED(bad.sources = misaligned, ATTNRES_EINVAL);

    attnres_phase2_args a2;
    attnres_phase2_args_init(&a2);
    a2.o1 = o1a, a2.lse = lsea, a2.partial = b, a2.sublayer = f;
    a2.query = q, a2.out = out, a2.out_gain = g, a2.normed = normed;
    CHECK(attnres_run_phase2(plan2, 2, &a2, NULL) == ATTNRES_OK);
    RUN2_CHANGED(bad.sublayer = NULL, ATTNRES_EINVAL); /* the plan fuses the add */
    CHECK(strstr(attnres_plan_errmsg(plan2), "sublayer") != NULL);
    RUN2_CHANGED(bad.normed = NULL, ATTNRES_EINVAL);
    RUN2_CHANGED(bad.out_eps = NAN, ATTNRES_EINVAL);
    RUN2_CHANGED(bad.partial_stride = 8, ATTNRES_EMISMATCH);
    RUN2_CHANGED(bad.lse = NULL, ATTNRES_EINVAL);
#undef RUN1_CHANGED
#undef RUN2_CHANGED
#undef RUN_CHANGED

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
    a1.sources = srcs, a1.queries = q;
    a1.o1 = o1s, a1.lse = lses;
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
    if (scratch_cpu_open("phase-api", tmpdir, sizeof tmpdir, &cpu) != 0)
        return 1;
    RUN_CASE(test_reference_phase1_then_phase2_equals_mix_over_n_plus_one);
    RUN_CASE(test_problem_check_for_phase_ops);
    RUN_CASE(test_phase_runs_refuse_bad_arguments);
    RUN_CASE(test_nan_in_one_token_stays_in_that_token);
    RUN_CASE(test_phase1_too_many_weights_is_refused_at_plan);
    RUN_CASE(test_phase1_applies_refuses_other_ops_and_widths);
    RUN_CASE(test_time_slot_runs_phase_ops);
    RUN_CASE(test_kernel_abi_is_checked_per_op);
    RUN_CASE(test_kernel_threads_come_from_params_or_an_older_binary);
    attnres_device_close(cpu);
    scratch_remove(tmpdir);
    CHECK_EXIT();
}
