/*
 * test_determinism_check.c - the tuner's determinism check of a backward
 * candidate (tuner/src/measure_backward.c, measure_phase_backward.c,
 * isolate.c): a variant of templates/cpu/mix_backward.lua is measured as a
 * tuning run measures it, in process and in a child, once as generated and
 * once with a fault that lets the workspace's stale bytes into du. The
 * generated one is ok; the faulty one, whose run compared with the
 * reference is right, is recorded as nondeterministic, with a message
 * naming the gradient that differed and where. The same for a variant of
 * each phase's backward (cpu/phase1_backward.lua, cpu/phase2_backward.lua,
 * the latter with the fused add and the epilogue, so that every gradient
 * is compared). And the verdict's fp32 rule: a bf16 variant whose dquery
 * is 0.1% off is a wrong result, although 0.1% is inside bf16's
 * tolerance; so is a bf16 phase-2 backward whose fp32 dlse is.
 */
#define _GNU_SOURCE /* nftw, FTW_PHYS (test_scratch.h) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "isolate.h"
#include "measure.h"
#include "test_variant.h"

static attnres_device *cpu;
static char scratch[4096];

/* A compiled variant, as the tuner hands one to job_measure. */
typedef struct built {
    char *src, *name, *json;
    void *blob;
    size_t size;
    char build_key[65];
} built;

/* Compiles src (named name) on the CPU; 0 on success. */
static int build(built *b, char *src, char *name, char *json)
{
    char *log = NULL, hash[65];
    b->src = src;
    b->name = name;
    b->json = json;
    int rc = cpu->ops->compile(cpu, src, name, &b->blob, &b->size, &log);
    if (rc)
        fprintf(stderr, "compile: %s\n%s\n", attnres_device_errmsg(cpu), log ? log : "");
    free(log);
    ar_sha256_string(src, hash);
    ar_build_key(cpu, hash, b->build_key);
    return rc;
}

static void built_free(built *b)
{
    free(b->src);
    free(b->name);
    free(b->json);
    free(b->blob);
}

/* src with every occurrence of from replaced by to; NULL when src has no
 * such text (the template changed) or out of memory. */
static char *replaced(const char *src, const char *from, const char *to)
{
    const size_t skip = strlen(from), add = strlen(to);
    size_t count = 0;
    for (const char *at = strstr(src, from); at; at = strstr(at + skip, from))
        count++;
    if (count == 0)
        return NULL;
    char *out = malloc(strlen(src) - count * skip + count * add + 1), *o = out;
    if (!out)
        return NULL;
    for (const char *at; (at = strstr(src, from)) != NULL; src = at + skip) {
        memcpy(o, src, (size_t)(at - src));
        o += at - src;
        memcpy(o, to, add);
        o += add;
    }
    strcpy(o, src);
    return out;
}

static job_result measure(bench_case *bc, const char *variant, const built *b, int isolate)
{
    job_kernel k = {.variant = variant, .kernel_name = b->name, .params_json = b->json, .build_key = b->build_key,
                    .source = b->src, .blob = b->blob, .blob_size = b->size};
    job_options opt;
    memset(&opt, 0, sizeof opt);
    opt.verify = 1;
    opt.isolate = isolate;
    opt.time_limit_s = 60;
    job_result r;
    job_measure(cpu, bc, &k, &opt, &r);
    return r;
}

/* A generated variant and the same with a text of its source replaced
 * (from -> to, wherever it stands), both compiled, and a case of the
 * problem on which the tuner only verifies them. */
typedef struct pair {
    argen *g;
    built good, bad;
    bench_case *bc;
} pair;

/* The problems the cases verify on, at T = 48: two token groups of the
 * backwards' sums, the second one short. */
static tune_problem mix_problem(attnres_dtype dt)
{
    tune_problem tp;
    attnres_problem_init(&tp.p, dt, 128, 3);
    tp.p.op = ATTNRES_OP_MIX_BACKWARD;
    tp.t = 48;
    return tp;
}

static tune_problem phase1_problem(attnres_dtype dt)
{
    tune_problem tp;
    attnres_problem_init(&tp.p, dt, 128, 3);
    tp.p.op = ATTNRES_OP_PHASE1_BACKWARD;
    tp.p.s = 2;
    tp.p.heads = 2;
    tp.t = 48;
    return tp;
}

static tune_problem phase2_problem(attnres_dtype dt)
{
    tune_problem tp;
    attnres_problem_init(&tp.p, dt, 128, 1);
    tp.p.op = ATTNRES_OP_PHASE2_BACKWARD;
    tp.p.heads = 2;
    tp.p.fuse_add = 1;
    tp.p.epilogue = 1;
    tp.t = 48;
    return tp;
}

static int pair_make(pair *pr, const char *tmpl, const char *id, const char *from, const char *to,
                     tune_problem tp, uint64_t seed)
{
    char msg[1024], err[256];
    memset(pr, 0, sizeof *pr);
    if (argen_open(TEMPLATE_DIR, tmpl, &pr->g, msg, sizeof msg) != 0) {
        fprintf(stderr, "  %s\n", msg);
        return -1;
    }
    char *src = NULL, *name = NULL, *json = NULL;
    if (argen_emit_for(pr->g, id, NULL, &src, &name, &json) != 0)
        return -1;
    /* NULL when the template no longer has the text this replaces. */
    char *changed = replaced(src, from, to);
    if (!changed || build(&pr->good, src, name, json) != 0 ||
        build(&pr->bad, changed, strdup(name), strdup(json)) != 0)
        return -1;
    measure_policy pol;
    measure_policy_default(&pol, cpu);
    pol.max_reps = 0; /* verification only */
    pr->bc = bench_case_create(cpu, &tp, &pol, seed, err, sizeof err);
    if (!pr->bc)
        fprintf(stderr, "  %s\n", err);
    return pr->bc ? 0 : -1;
}

static void pair_free(pair *pr)
{
    bench_case_free(pr->bc);
    built_free(&pr->good);
    built_free(&pr->bad);
    argen_close(pr->g);
}

static void test_nondeterministic_candidate_is_recorded_as_such(void)
{
    static const char id[] = "mix_backward_c_f32_v1_u1_t1";
    /* du's rows no longer cleared alone: a bit of the workspace's old
     * contents decides whether du[0] starts at 1 or 0. The tuner poisons
     * the workspace differently before each of its two runs (0xa5, then
     * 0x3c), so the runs differ in dquery only. */
    pair pr;
    REQUIRE(pair_make(&pr, "cpu/mix_backward", id, "memset(du, 0, sizeof(float) * (size_t)d);",
                      "{ const unsigned stale = *(const unsigned char *)du;"
                      " memset(du, 0, sizeof(float) * (size_t)d);"
                      " if (stale & 1u) du[0] = 1.0f; }",
                      mix_problem(ATTNRES_DTYPE_F32), 7) == 0);
    CHECK(strcmp(pr.good.build_key, pr.bad.build_key) != 0);
    for (int isolate = 0; isolate <= 1; isolate++) {
        job_result r = measure(pr.bc, id, &pr.good, isolate);
        CHECK(r.status == ARDB_STATUS_OK);
        /* In a child the case's own record of the check stays there. */
        if (!isolate)
            CHECK(!bench_case_nondeterministic(pr.bc) && strcmp(bench_case_difference(pr.bc), "") == 0);
        if (r.status != ARDB_STATUS_OK)
            fprintf(stderr, "  generated (isolate %d): %s: %s\n", isolate, ardb_status_name(r.status), r.message);

        r = measure(pr.bc, id, &pr.bad, isolate);
        printf("faulty (isolate %d): %s: %s\n", isolate, ardb_status_name(r.status), r.message);
        CHECK(r.status == ARDB_STATUS_NONDETERMINISTIC);
        CHECK(strcmp(ardb_status_name(r.status), "nondeterministic") == 0);
        CHECK(strncmp(r.message, "two runs on the same inputs differ in dquery (", 46) == 0);
        CHECK(strstr(r.message, "first at element 0)") != NULL);
        CHECK(strstr(r.message, "dsources") == NULL && strstr(r.message, "dalpha") == NULL);
        CHECK(strstr(r.message, "relative error against the reference") != NULL);
        /* The second run, the one compared with the reference, is right:
         * only the determinism check tells this kernel from a good one. */
        CHECK(r.rel_err <= bench_case_tolerance(pr.bc));
    }
    pair_free(&pr);
}

/* A bf16 candidate whose query gradient is 0.1% off: inside bf16's 1e-2,
 * which holds the gradients stored in bf16, but dquery is an fp32 sum of
 * the inputs as stored, held to fp32's 1e-5, so it is a wrong result. */
static void test_sloppy_fp32_sum_is_wrong_in_bf16(void)
{
    static const char id[] = "mix_backward_c_bf16_v1_u1_t1";
    pair pr;
    REQUIRE(pair_make(&pr, "cpu/mix_backward", id, "load_f32(du + k) + zr * x", "load_f32(du + k) + 1.001f * zr * x",
                      mix_problem(ATTNRES_DTYPE_BF16), 11) == 0);
    job_result r = measure(pr.bc, id, &pr.good, 0);
    CHECK(r.status == ARDB_STATUS_OK);
    if (r.status != ARDB_STATUS_OK)
        fprintf(stderr, "  generated: %s: %s\n", ardb_status_name(r.status), r.message);
    r = measure(pr.bc, id, &pr.bad, 0);
    printf("sloppy: %s: %s\n", ardb_status_name(r.status), r.message);
    CHECK(r.status == ARDB_STATUS_WRONG_RESULT);
    CHECK(strncmp(r.message, "dquery relative error ", 22) == 0 && strstr(r.message, "exceeds 1e-05") != NULL);
    /* Only the fp32 rule tells it from a good kernel. */
    CHECK(r.rel_err <= bench_case_tolerance(pr.bc));
    pair_free(&pr);
}

/* Measures a phase backward's pair as a tuning run does, in process and in
 * a child: the generated variant is ok, the faulty one nondeterministic,
 * its message naming `differs` (the gradient and where its first value
 * differs) and none of the gradients in `agree`, its compared run right. */
static void check_phase_pair(pair *pr, const char *id, const char *differs, const char *const *agree)
{
    for (int isolate = 0; isolate <= 1; isolate++) {
        job_result r = measure(pr->bc, id, &pr->good, isolate);
        CHECK(r.status == ARDB_STATUS_OK);
        if (r.status != ARDB_STATUS_OK)
            fprintf(stderr, "  generated (isolate %d): %s: %s\n", isolate, ardb_status_name(r.status), r.message);
        if (!isolate)
            CHECK(!bench_case_nondeterministic(pr->bc) && strcmp(bench_case_difference(pr->bc), "") == 0);
        r = measure(pr->bc, id, &pr->bad, isolate);
        printf("faulty %s (isolate %d): %s: %s\n", id, isolate, ardb_status_name(r.status), r.message);
        CHECK(r.status == ARDB_STATUS_NONDETERMINISTIC);
        CHECK(strncmp(r.message, "two runs on the same inputs differ in ", 38) == 0 &&
              strstr(r.message, differs) != NULL);
        for (int i = 0; agree[i]; i++) {
            char named[64];
            snprintf(named, sizeof named, "%s (", agree[i]);
            CHECK(strstr(r.message, named) == NULL);
        }
        CHECK(r.rel_err <= bench_case_tolerance(pr->bc));
    }
}

/* Phase 1's backward: each token group's S rows of du no longer cleared
 * alone; the stale first byte decides whether site 0's du[0] starts at 1. */
static void test_nondeterministic_phase1_backward(void)
{
    static const char id[] = "phase1_backward_c_f32_v1_u1_t1";
    pair pr;
    REQUIRE(pair_make(&pr, "cpu/phase1_backward", id, "memset(ws, 0, sizeof(float) * (size_t)(sites * d));",
                      "{ const unsigned stale = *(const unsigned char *)ws;"
                      " memset(ws, 0, sizeof(float) * (size_t)(sites * d));"
                      " if (stale & 1u) ws[0] = 1.0f; }",
                      phase1_problem(ATTNRES_DTYPE_F32), 13) == 0);
    static const char *const agree[] = {"dsources", NULL};
    check_phase_pair(&pr, id, "dqueries (1 of 256 values, first at site 0, element 0)", agree);
    pair_free(&pr);
}

/* Phase 2's backward with the fused add and the epilogue: du's stale first
 * byte let in the same way; dquery alone differs. */
static void test_nondeterministic_phase2_backward(void)
{
    static const char id[] = "phase2_backward_c_f32_v1_u1_t1";
    pair pr;
    REQUIRE(pair_make(&pr, "cpu/phase2_backward", id, "memset(du, 0, sizeof(float) * (size_t)d);",
                      "{ const unsigned stale = *(const unsigned char *)du;"
                      " memset(du, 0, sizeof(float) * (size_t)d);"
                      " if (stale & 1u) du[0] = 1.0f; }",
                      phase2_problem(ATTNRES_DTYPE_F32), 17) == 0);
    static const char *const agree[] = {"do1", "dlse", "dpartial", "dsublayer", "dout_gain", NULL};
    check_phase_pair(&pr, id, "dquery (1 of 128 values, first at element 0)", agree);
    pair_free(&pr);
}

/* A bf16 phase-2 backward whose dlse is 0.1% off: an fp32 gradient of the
 * inputs as stored, held to fp32's 1e-5 like the sums. */
static void test_sloppy_dlse_is_wrong_in_bf16(void)
{
    static const char id[] = "phase2_backward_c_bf16_v1_u1_t1";
    pair pr;
    REQUIRE(pair_make(&pr, "cpu/phase2_backward", id, "dl[h] = acc ? dl[h] - dx[h] : -dx[h];",
                      "dl[h] = acc ? dl[h] - dx[h] : -1.001f * dx[h];", phase2_problem(ATTNRES_DTYPE_BF16), 19) == 0);
    job_result r = measure(pr.bc, id, &pr.good, 0);
    CHECK(r.status == ARDB_STATUS_OK);
    if (r.status != ARDB_STATUS_OK)
        fprintf(stderr, "  generated: %s: %s\n", ardb_status_name(r.status), r.message);
    r = measure(pr.bc, id, &pr.bad, 0);
    printf("sloppy dlse: %s: %s\n", ardb_status_name(r.status), r.message);
    CHECK(r.status == ARDB_STATUS_WRONG_RESULT);
    CHECK(strncmp(r.message, "dlse relative error ", 20) == 0 && strstr(r.message, "exceeds 1e-05") != NULL &&
          strstr(r.message, "fp32 per token") != NULL);
    CHECK(r.rel_err <= bench_case_tolerance(pr.bc));
    pair_free(&pr);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (scratch_cpu_open("determinism", scratch, sizeof scratch, &cpu) != 0)
        return 1;
    RUN_CASE(test_nondeterministic_candidate_is_recorded_as_such);
    RUN_CASE(test_sloppy_fp32_sum_is_wrong_in_bf16);
    RUN_CASE(test_nondeterministic_phase1_backward);
    RUN_CASE(test_nondeterministic_phase2_backward);
    RUN_CASE(test_sloppy_dlse_is_wrong_in_bf16);
    attnres_device_close(cpu);
    scratch_remove(scratch);
    CHECK_EXIT();
}
