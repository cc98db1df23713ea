/*
 * test_cpu_builtins.c - the CPU backend's built-in kernels at every ISA
 * level this host has (runtime/src/cpu_builtin.h).
 *
 * For each level (avx512, avx2, sse2 on x86-64; neon on AArch64; scalar
 * everywhere) the device is opened with ATTNRES_CPU_BUILTIN_ISA naming it,
 * and plans without a database must (1) say in their explanation that they
 * run the built-in kernel of that level, when the host has it and the head
 * width fits every level's step (a multiple of 32), or the scalar generic
 * kernel when it fits none (an odd head width); (2) match the fp64
 * reference within DESIGN §1's tolerance, for every op, dtype, form,
 * epilogue, fused add and a few head counts, at T = 1 and 7, and at sizes
 * that a launch splits over the workers. A level the host lacks is reported as skipped. An unknown
 * level name must make the device open fail with a message naming it.
 */
#define _GNU_SOURCE /* setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "check.h"
#include "test_data.h"
#include "test_device.h"
#include "test_mix_case.h"

static attnres_device *cpu;
static const char *level; /* the level the device was opened with */
static int level_present; /* the host has it */

static const attnres_dtype dtypes[] = {ATTNRES_DTYPE_F32, ATTNRES_DTYPE_BF16, ATTNRES_DTYPE_F16};

/* Plans p without a database; checks the level and which kernel. */
static attnres_plan *plan_builtin(const attnres_problem *p)
{
    attnres_plan *plan = NULL;
    char msg[512];
    if (attnres_plan_create(cpu, NULL, p, 0, &plan, msg, sizeof msg) != ATTNRES_OK) {
        fprintf(stderr, "  plan failed: %s\n", msg);
        return NULL;
    }
    CHECK(attnres_plan_level_get(plan) == ATTNRES_LEVEL_GENERIC);
    char text[4096];
    attnres_plan_explain(plan, text, sizeof text);
    const int64_t hd = p->d / p->heads;
    char want[64];
    if (hd % 8 != 0 || strcmp(level, "scalar") == 0)
        snprintf(want, sizeof want, "(built in, scalar)");
    else if (hd % 32 == 0 && level_present)
        snprintf(want, sizeof want, "(built in, %s)", level);
    else
        want[0] = 0; /* a narrower level or the scalar kernel: either is right */
    if (want[0] && !strstr(text, want)) {
        fprintf(stderr, "  %s d=%lld H=%d: expected %s in:\n%s", level, (long long)p->d, p->heads, want, text);
        check_failures++;
    }
    if (!strstr(text, "built-in generic kernel")) {
        fprintf(stderr, "  the explanation does not say the plan fell back:\n%s", text);
        check_failures++;
    }
    return plan;
}

static void report(const char *what, const attnres_problem *p, int64_t T, double err)
{
    if (!(err <= case_tolerance(p->dtype))) {
        fprintf(stderr, "  %s %s %s d=%lld N=%d S=%d H=%d form=%d epi=%d fuse=%d T=%lld: rel err %g\n", level, what,
                attnres_dtype_name(p->dtype), (long long)p->d, p->n, p->s, p->heads, (int)p->form, p->epilogue,
                p->fuse_add, (long long)T, err);
        check_failures++;
    }
}

static int launch_plan(void *plan, const attnres_problem *p, int64_t T, const attnres_mix_args *a)
{
    (void)p;
    return attnres_run_mix(plan, T, a, NULL);
}

static void run_mix_case(attnres_dtype dt, int64_t d, int32_t n, int32_t heads, int additive, int epi,
                         int64_t T, uint64_t seed)
{
    attnres_problem p;
    attnres_problem_init(&p, dt, d, n);
    p.heads = heads;
    p.form = additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    p.epilogue = epi;
    attnres_plan *plan = plan_builtin(&p);
    REQUIRE(plan);
    const mix_case_errors e = mix_case_run(&p, T, seed, 1.0, 0, launch_plan, plan, NULL);
    report("mix out", &p, T, e.out);
    report("mix normed", &p, T, e.normed);
    attnres_plan_destroy(plan);
}

static void run_phase1_case(attnres_dtype dt, int64_t d, int32_t n, int32_t sites, int32_t heads, int64_t T,
                            uint64_t seed)
{
    attnres_problem p;
    attnres_problem_init(&p, dt, d, n);
    p.op = ATTNRES_OP_PHASE1;
    p.s = sites;
    p.heads = heads;
    attnres_plan *plan = plan_builtin(&p);
    REQUIRE(plan);
    uint64_t s = seed;
    const size_t es = attnres_dtype_size(dt);
    const int64_t td = T * d, th = T * heads;
    char *src = malloc(es * (size_t)(n * td)), *o1 = malloc(es * (size_t)(sites * td));
    double *src_x = malloc(sizeof(double) * (size_t)(n * td));
    float *q = malloc(sizeof(float) * (size_t)(sites * d)), *lse = malloc(sizeof(float) * (size_t)(sites * th));
    double *q_x = malloc(sizeof(double) * (size_t)(sites * d));
    double *ref_o1 = malloc(sizeof(double) * (size_t)(sites * td)), *ref_lse = malloc(sizeof(double) * (size_t)(sites * th));
    double *got = malloc(sizeof(double) * (size_t)(sites * td));
    case_fill(&s, dt, src, n * T, d, src_x);
    case_fill_f32(&s, q, q_x, sites * d, 1.0 / sqrt((double)d));
    const void *views[16];
    const double *views_x[16];
    void *o1_views[16];
    float *lse_views[16];
    for (int i = 0; i < n; i++) {
        views[i] = src + es * (size_t)(i * td);
        views_x[i] = src_x + i * td;
    }
    for (int j = 0; j < sites; j++) {
        o1_views[j] = o1 + es * (size_t)(j * td);
        lse_views[j] = lse + j * th;
    }
    memset(o1, 0xff, es * (size_t)(sites * td));
    memset(lse, 0xff, sizeof(float) * (size_t)(sites * th));
    attnres_phase1_args a;
    attnres_phase1_args_init(&a);
    a.sources = views;
    a.queries = q;
    a.eps = 1e-5f;
    a.o1 = o1_views;
    a.lse = lse_views;
    CHECK(attnres_run_phase1(plan, T, &a, NULL) == ATTNRES_OK);
    CHECK(attnres_reference_phase1(&p, T, views_x, q_x, 1.0, 1e-5, ref_o1, ref_lse) == ATTNRES_OK);
    case_widen(dt, o1, got, sites * td);
    report("phase1 o1", &p, T, case_rel_err(got, ref_o1, sites * td));
    for (int64_t i = 0; i < sites * th; i++)
        got[i] = lse[i];
    double lse_err = case_rel_err(got, ref_lse, sites * th);
    if (!(lse_err <= 1e-5)) {
        fprintf(stderr, "  %s phase1 lse %s d=%lld: rel err %g\n", level, attnres_dtype_name(dt), (long long)d,
                lse_err);
        check_failures++;
    }
    attnres_plan_destroy(plan);
    free(src), free(o1), free(src_x), free(q), free(lse), free(q_x), free(ref_o1), free(ref_lse), free(got);
}

static void run_phase2_case(attnres_dtype dt, int64_t d, int32_t heads, int fuse, int epi, int64_t T, uint64_t seed)
{
    attnres_problem p;
    attnres_problem_init(&p, dt, d, 1);
    p.op = ATTNRES_OP_PHASE2;
    p.heads = heads;
    p.fuse_add = fuse;
    p.epilogue = epi;
    attnres_plan *plan = plan_builtin(&p);
    REQUIRE(plan);
    uint64_t s = seed;
    const size_t es = attnres_dtype_size(dt);
    const int64_t td = T * d, th = T * heads;
    char *o1 = malloc(es * (size_t)td), *b = malloc(es * (size_t)td), *f = malloc(es * (size_t)td);
    char *out = malloc(es * (size_t)td), *normed = malloc(es * (size_t)td);
    double *o1_x = malloc(sizeof(double) * (size_t)td), *b_x = malloc(sizeof(double) * (size_t)td);
    double *f_x = malloc(sizeof(double) * (size_t)td), *lse_x = malloc(sizeof(double) * (size_t)th);
    double *q_x = malloc(sizeof(double) * (size_t)d), *go_x = malloc(sizeof(double) * (size_t)d);
    double *ref = malloc(sizeof(double) * (size_t)td), *ref_n = malloc(sizeof(double) * (size_t)td);
    double *got = malloc(sizeof(double) * (size_t)td);
    float *lse = malloc(sizeof(float) * (size_t)th), *q = malloc(sizeof(float) * (size_t)d);
    float *go = malloc(sizeof(float) * (size_t)d);
    case_fill(&s, dt, o1, T, d, o1_x);
    case_fill(&s, dt, b, T, d, b_x);
    case_fill(&s, dt, f, T, d, f_x);
    case_fill_f32(&s, lse, lse_x, th, 1.0);
    case_fill_f32(&s, q, q_x, d, 1.0 / sqrt((double)d));
    case_fill_f32(&s, go, go_x, d, 1.0);
    memset(out, 0xff, es * (size_t)td);
    memset(normed, 0xff, es * (size_t)td);
    attnres_phase2_args a;
    attnres_phase2_args_init(&a);
    a.o1 = o1;
    a.lse = lse;
    a.partial = b;
    a.sublayer = fuse ? f : NULL;
    a.query = q;
    a.eps = 1e-5f;
    a.out = out;
    a.out_gain = epi ? go : NULL;
    a.normed = epi ? normed : NULL;
    CHECK(attnres_run_phase2(plan, T, &a, NULL) == ATTNRES_OK);
    CHECK(attnres_reference_phase2(&p, T, o1_x, lse_x, b_x, fuse ? f_x : NULL, q_x, 1.0, 1e-5, epi ? go_x : NULL,
                                   1e-6, ref, epi ? ref_n : NULL) == ATTNRES_OK);
    case_widen(dt, out, got, td);
    report("phase2 out", &p, T, case_rel_err(got, ref, td));
    if (epi) {
        case_widen(dt, normed, got, td);
        report("phase2 normed", &p, T, case_rel_err(got, ref_n, td));
    }
    if (fuse) {
        case_widen(dt, b, got, td);
        report("phase2 b + f", &p, T, case_rel_err(got, b_x, td));
    }
    attnres_plan_destroy(plan);
    free(o1), free(b), free(f), free(out), free(normed), free(o1_x), free(b_x), free(f_x), free(lse_x);
    free(q_x), free(go_x), free(ref), free(ref_n), free(got), free(lse), free(q), free(go);
}

/* Head widths: 256 and 64 (every level's step divides them), 48 (not a
 * multiple of AVX-512's mix step), 20 (the scalar kernel only); d = 2048
 * puts every source's rows 4 or 8 KiB apart, where the mix runs in bursts. */
static void test_mix_every_dtype_form_and_epilogue(void)
{
    static const struct { int64_t d; int32_t h, n; } shapes[] = {{256, 1, 9}, {256, 4, 3}, {96, 2, 5}, {20, 1, 2},
                                                                 {64, 1, 1}, {2048, 2, 9}};
    uint64_t seed = 1;
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int additive = 0; additive < 2; additive++)
                for (int epi = 0; epi < 2; epi++)
                    for (int64_t T = 1; T <= 7; T += 6)
                        run_mix_case(dtypes[di], shapes[si].d, shapes[si].n, shapes[si].h, additive, epi, T,
                                     seed++);
}

/* Launches large enough to be split over the workers (cpu_builtin.h:
 * AR_CPU_BUILTIN_PART_BYTES per part): 42 MB and 50 MB. */
static void test_launches_split_over_workers(void)
{
    run_mix_case(ATTNRES_DTYPE_F32, 4096, 9, 1, 0, 0, 256, 3000);
    run_phase2_case(ATTNRES_DTYPE_F32, 4096, 1, 0, 0, 1024, 3001);
}

static void test_phase1_every_dtype(void)
{
    static const struct { int64_t d; int32_t h, n, s; } shapes[] = {{256, 1, 8, 7}, {256, 2, 1, 1}, {96, 2, 3, 5},
                                                                    {20, 1, 2, 3}};
    uint64_t seed = 1000;
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int64_t T = 1; T <= 7; T += 6)
                run_phase1_case(dtypes[di], shapes[si].d, shapes[si].n, shapes[si].s, shapes[si].h, T, seed++);
}

static void test_phase2_every_dtype_fuse_and_epilogue(void)
{
    static const struct { int64_t d; int32_t h; } shapes[] = {{256, 1}, {256, 8}, {96, 2}, {20, 1}};
    uint64_t seed = 2000;
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int fuse = 0; fuse < 2; fuse++)
                for (int epi = 0; epi < 2; epi++)
                    for (int64_t T = 1; T <= 7; T += 6)
                        run_phase2_case(dtypes[di], shapes[si].d, shapes[si].h, fuse, epi, T, seed++);
}

static void test_unknown_level_fails_the_open_with_its_name(void)
{
    setenv("ATTNRES_CPU_BUILTIN_ISA", "avx1024", 1);
    attnres_device *dev = NULL;
    char msg[512] = "";
    CHECK(attnres_device_open("cpu", &dev, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(dev == NULL);
    CHECK(strstr(msg, "avx1024") != NULL && strstr(msg, "scalar") != NULL);
    attnres_device_close(dev);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    for (size_t i = 0; i < TEST_BUILTIN_LEVELS; i++) {
        level = test_builtin_levels[i];
        level_present = test_host_has_level(level);
        const int opened = test_cpu_open_level(level, &cpu, check_listing);
        if (opened < 0)
            return 1;
        if (!opened)
            continue;
        if (!check_listing)
            printf("level %s\n", level);
        /* Named "LEVEL/CASE": --case avx2 runs every case at that level. */
        RUN_CASE_IN(level, test_mix_every_dtype_form_and_epilogue);
        RUN_CASE_IN(level, test_phase1_every_dtype);
        RUN_CASE_IN(level, test_phase2_every_dtype_fuse_and_epilogue);
        RUN_CASE_IN(level, test_launches_split_over_workers);
        attnres_device_close(cpu);
    }
    RUN_CASE(test_unknown_level_fails_the_open_with_its_name);
    CHECK_EXIT();
}
