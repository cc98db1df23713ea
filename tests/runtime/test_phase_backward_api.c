/*
 * test_phase_backward_api.c - what attnres_run_phase1_backward,
 * attnres_run_phase2_backward and their plans refuse or report on the
 * CPU, apart from any kernel's gradients (those are backend_ops' cases:
 * --backend cpu --op 'phase?_backward'):
 *   - every refusal (NULL arguments and pointers, a short, NULL or
 *     misaligned workspace, unknown flags, ATTNRES_GRAD_DSOURCES_F32 given
 *     to phase 2, outputs that overlap an input or each other, the
 *     workspace overlapping a gradient, strides below a row, bad eps and
 *     out_eps, a wrong struct_size, a negative T) returns its status with
 *     a message naming the problem, and writes no gradient and no byte of
 *     the workspace;
 *   - fp32 source gradients of a bf16 plan are checked as fp32 views;
 *   - with ATTNRES_GRAD_ACCUMULATE two sources' gradients may be one view;
 *   - T = 0 writes zero query gradients (and d(out_gain) with the
 *     epilogue) and touches nothing else, from full arguments or from
 *     none but those;
 *   - another op's run entry on these plans, and theirs on another op's
 *     plan, is EMISMATCH;
 *   - attnres_plan_workspace_size for a plan of every op: 0 for the
 *     forward ops, the mix backward's own size for it, and for the phase
 *     backwards the groups' rows (S of d floats per group for phase 1, d
 *     and, with the epilogue, d more for phase 2), which a run needs;
 *   - on CUDA (the simulated driver ctest names, where the build has the
 *     backend), a plan of each op without a database (the built-in
 *     kernel) is made, reports the workspace a run needs, and at T = 0
 *     writes zero query gradients (and d(out_gain)) and nothing past them;
 *     skipped where no CUDA device opens and none was named, or NVRTC
 *     cannot be loaded. The kernels' gradients are backend_ops' cases
 *     (--backend cuda --op 'phase?_backward').
 */
#define _GNU_SOURCE
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "check.h"
#include "nvrtc.h"
#include "test_device.h"
#include "test_phase_backward_case.h"

static attnres_device *cpu;

static attnres_plan *plan_generic(const attnres_problem *p)
{
    attnres_plan *plan = NULL;
    char msg[512];
    if (attnres_plan_create(cpu, NULL, p, 0, &plan, msg, sizeof msg) != ATTNRES_OK)
        fprintf(stderr, "plan: %s\n", msg);
    return plan;
}

/* Copies of the bytes a refused run must leave as they were: every
 * gradient buffer (whole) and the workspace. */
typedef struct kept {
    const void *ptr[8];
    void *copy[8];
    size_t bytes[8];
    int count;
} kept;

static int keep(kept *k, const pb_region *out, int count, const void *workspace, size_t workspace_size)
{
    memset(k, 0, sizeof *k);
    for (int i = 0; i <= count && i < 8; i++) {
        const void *p = i < count ? out[i].ptr : workspace;
        const size_t n = i < count ? out[i].bytes : workspace_size;
        if (!(k->copy[i] = malloc(n ? n : 1)))
            return -1;
        memcpy(k->copy[i], p, n);
        k->ptr[i] = p;
        k->bytes[i] = n;
        k->count = i + 1;
    }
    return 0;
}

static int unchanged(const kept *k)
{
    for (int i = 0; i < k->count; i++)
        if (memcmp(k->ptr[i], k->copy[i], k->bytes[i]) != 0)
            return 0;
    return 1;
}

static void kept_free(kept *k)
{
    for (int i = 0; i < k->count; i++)
        free(k->copy[i]);
    memset(k, 0, sizeof *k);
}

/* Checks that a run returned status want with a message holding needle
 * (where plan is not NULL), and wrote nothing that k keeps. */
#define REFUSED(rc, plan, want, needle, k) refused((rc), (plan), (want), (needle), (k), #rc, __LINE__)

static void refused(int rc, attnres_plan *plan, int want, const char *needle, const kept *k, const char *what,
                    int line)
{
    if (rc != want) {
        fprintf(stderr, "%s:%d: %s returned %d (%s), not %d: %s\n", __FILE__, line, what, rc, attnres_errstr(rc),
                want, plan ? attnres_plan_errmsg(plan) : "");
        check_failures++;
        return;
    }
    if (plan && needle)
        check_message_has(what, attnres_plan_errmsg(plan), needle);
    if (!unchanged(k)) {
        fprintf(stderr, "%s:%d: %s was refused but wrote a gradient or the workspace\n", __FILE__, line, what);
        check_failures++;
    }
}

/* A 64-byte aligned buffer of bytes (the workspace's alignment), which a
 * refusal must not touch either. */
static void *scratch_ws(size_t bytes)
{
    void *p = pb_alloc(bytes + 128);
    if (p)
        memset(p, 0x33, bytes + 128);
    return p;
}

/* ------------------------------------------------------------------------
 * Phase 1
 * ---------------------------------------------------------------------- */

#define RUN1(a) attnres_run_phase1_backward(plan, c.T, &(a), NULL)

static void test_phase1_refusals(void)
{
    REQUIRE(test_cpu_open(&cpu) == 0);
    p1_case c;
    /* n = 3 sources, S = 2 sites, H = 2, 40 tokens (two groups), site 0
     * without a dlse. */
    REQUIRE(p1_case_make(&c, ATTNRES_DTYPE_F32, 64, 3, 2, 2, 40, 0, 0, PB_DLSE_SOME, 0, 7) == 0);
    attnres_plan *plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    const int64_t d = c.p.d;
    size_t need = 0;
    CHECK(attnres_plan_workspace_size(plan, c.T, &need) == ATTNRES_OK && need == c.workspace_size);
    CHECK(need >= 2 * 2 * (size_t)d * 4); /* two groups' rows of S d floats */
    CHECK(attnres_plan_workspace_size(plan, -1, &need) == ATTNRES_EINVAL);
    CHECK(attnres_plan_workspace_size(plan, c.T, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_plan_workspace_size(NULL, c.T, &need) == ATTNRES_EINVAL);
    CHECK(attnres_mix_backward_workspace_size(plan, c.T, &need) == ATTNRES_EMISMATCH);
    kept k;
    REQUIRE(keep(&k, c.out, c.nout, c.workspace, c.workspace_size) == 0);
    const attnres_phase1_backward_args good = c.args;
    attnres_phase1_backward_args a;

    /* NULL arguments and pointers. */
    REFUSED(attnres_run_phase1_backward(NULL, c.T, &good, NULL), NULL, ATTNRES_EINVAL, NULL, &k);
    REFUSED(attnres_run_phase1_backward(plan, c.T, NULL, NULL), plan, ATTNRES_EINVAL, "dqueries", &k);
    a = good, a.dqueries = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "dqueries", &k);
    a = good, a.dqueries = (float *)((char *)c.dqueries + 2);
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "aligned dqueries", &k);
    a = good, a.sources = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "sources", &k);
    a = good, a.queries = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "queries", &k);
    a = good, a.queries = (const float *)((const char *)c.queries + 2);
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "aligned queries", &k);
    a = good, a.do1 = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "do1", &k);
    a = good, a.dsources = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "dsources", &k);
    const void *srcs[PB_MAX_N], *do1s[PB_MAX_S];
    void *dsrcs[PB_MAX_N];
    const float *dlses[PB_MAX_S];
    memcpy(srcs, c.rows, sizeof srcs);
    memcpy(do1s, c.do1s, sizeof do1s);
    memcpy(dsrcs, c.drows, sizeof dsrcs);
    memcpy(dlses, c.dlses, sizeof dlses);
    a = good, a.sources = srcs, srcs[1] = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "source 1 is NULL", &k);
    srcs[1] = (const char *)c.rows[1] + 2;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "source 1 is not aligned", &k);
    srcs[1] = c.rows[1];
    a = good, a.do1 = do1s, do1s[1] = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "do1[1]", &k);
    do1s[1] = (const char *)c.do1s[1] + 2;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "do1[1]", &k);
    do1s[1] = c.do1s[1];
    a = good, a.dsources = dsrcs, dsrcs[2] = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "dsources[2]", &k);
    dsrcs[2] = (char *)c.drows[2] + 2;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "dsources[2]", &k);
    dsrcs[2] = c.drows[2];
    a = good, a.dlse = dlses, dlses[1] = (const float *)((const char *)c.dlses[1] + 2);
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "dlse[1]", &k);
    dlses[1] = c.dlses[1];

    /* The workspace: short, NULL, misaligned, overlapping a gradient. */
    a = good, a.workspace_size = need - 1;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "workspace", &k);
    a = good, a.workspace = NULL;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "workspace", &k);
    void *other = scratch_ws(need);
    REQUIRE(other != NULL);
    kept ko;
    REQUIRE(keep(&ko, NULL, 0, other, need + 128) == 0);
    a = good, a.workspace = (char *)other + 16;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "not aligned", &k);
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "not aligned", &ko);
    a = good, a.workspace = c.drows[1]; /* 64-byte aligned, large enough */
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "the workspace and dsources[1] overlap", &k);

    /* Flags. */
    a = good, a.flags = 4;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "unknown flags 0x4", &k);
    a = good, a.flags = ATTNRES_GRAD_ACCUMULATE | 0x100;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "unknown flags 0x100", &k);

    /* Overlaps: a gradient that is a source, two sources' gradients in one
     * view unless accumulating, dqueries over queries, a site's dlse
     * inside a gradient, dqueries inside a source gradient. */
    a = good, a.dsources = dsrcs, dsrcs[1] = (void *)c.rows[0];
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "overlap", &k);
    dsrcs[1] = c.drows[0];
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "overlap", &k);
    dsrcs[1] = (char *)c.drows[0] + 4 * 8; /* the same buffer, 8 elements on: not the same view */
    a.flags = ATTNRES_GRAD_ACCUMULATE;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "overlap", &k);
    dsrcs[1] = c.drows[1];
    a = good, a.dqueries = (float *)c.queries;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a = good, a.dlse = dlses, dlses[1] = (const float *)c.drows[0];
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "overlap", &k);
    dlses[1] = c.dlses[1];
    a = good, a.dqueries = (float *)c.drows[2];
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "overlap", &k);

    /* Strides below a row. */
    int64_t strides[PB_MAX_N] = {d, d - 1, d};
    a = good, a.source_strides = strides;
    REFUSED(RUN1(a), plan, ATTNRES_EMISMATCH, "stride", &k);
    a = good, a.dsource_strides = strides;
    REFUSED(RUN1(a), plan, ATTNRES_EMISMATCH, "stride", &k);
    a = good, a.do1_stride = d - 1;
    REFUSED(RUN1(a), plan, ATTNRES_EMISMATCH, "stride", &k);
    a = good, a.dlse_stride = c.p.heads - 1;
    REFUSED(RUN1(a), plan, ATTNRES_EMISMATCH, "stride", &k);

    /* eps, struct_size, T. */
    static const float bad_eps[] = {0.0f, -1e-6f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_eps / sizeof bad_eps[0]; i++) {
        a = good, a.eps = bad_eps[i];
        REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "eps", &k);
    }
    a = good, a.struct_size = sizeof a - 8;
    REFUSED(RUN1(a), plan, ATTNRES_EINVAL, "struct_size", &k);
    REFUSED(attnres_run_phase1_backward(plan, -1, &good, NULL), plan, ATTNRES_EINVAL, "T", &k);

    /* Another op's entry on this plan, and this entry on another op's. */
    attnres_phase2_backward_args a2;
    attnres_phase2_backward_args_init(&a2);
    REFUSED(attnres_run_phase2_backward(plan, c.T, &a2, NULL), plan, ATTNRES_EMISMATCH, "phase1_backward", &k);
    attnres_mix_backward_args am;
    attnres_mix_backward_args_init(&am);
    REFUSED(attnres_run_mix_backward(plan, c.T, &am, NULL), plan, ATTNRES_EMISMATCH, "phase1_backward", &k);
    attnres_phase1_args a1;
    attnres_phase1_args_init(&a1);
    REFUSED(attnres_run_phase1(plan, c.T, &a1, NULL), plan, ATTNRES_EMISMATCH, "phase1_backward", &k);
    {
        attnres_problem fwd = c.p;
        fwd.op = ATTNRES_OP_PHASE1;
        attnres_plan *forward = plan_generic(&fwd);
        CHECK(forward != NULL);
        if (forward)
            REFUSED(attnres_run_phase1_backward(forward, c.T, &good, NULL), forward, ATTNRES_EMISMATCH,
                    "attnres_run_phase1_backward", &k);
        attnres_plan_destroy(forward);
    }

    /* What runs: the case as made, and with accumulation the gradients of
     * two sources in the very same view. */
    CHECK(RUN1(good) == ATTNRES_OK);
    a = good, a.flags = ATTNRES_GRAD_ACCUMULATE, a.dsources = dsrcs, dsrcs[2] = c.drows[0];
    CHECK(RUN1(a) == ATTNRES_OK);
    dsrcs[2] = c.drows[2];

    /* No tokens: zero query gradients, nothing else written, from full
     * arguments and from dqueries alone. */
    const size_t qbytes = sizeof(float) * (size_t)(c.p.s * d);
    kept rest;
    REQUIRE(keep(&rest, c.out, 1, c.workspace, c.workspace_size) == 0); /* dsources and the workspace */
    for (int64_t i = 0; i < c.p.s * d; i++)
        c.dqueries[i] = 1.0f;
    CHECK(attnres_run_phase1_backward(plan, 0, &good, NULL) == ATTNRES_OK);
    int zero = 1;
    for (int64_t i = 0; i < c.p.s * d; i++)
        zero &= c.dqueries[i] == 0.0f;
    CHECK(zero);
    CHECK(unchanged(&rest));
    memset(c.dqueries, PB_POISON, qbytes);
    attnres_phase1_backward_args none;
    attnres_phase1_backward_args_init(&none);
    none.dqueries = c.dqueries;
    CHECK(attnres_run_phase1_backward(plan, 0, &none, NULL) == ATTNRES_OK);
    zero = 1;
    for (int64_t i = 0; i < c.p.s * d; i++)
        zero &= c.dqueries[i] == 0.0f;
    CHECK(zero);
    CHECK(unchanged(&rest));
    none.dqueries = NULL;
    CHECK(attnres_run_phase1_backward(plan, 0, &none, NULL) == ATTNRES_EINVAL);
    none.dqueries = c.dqueries, none.flags = 4;
    CHECK(attnres_run_phase1_backward(plan, 0, &none, NULL) == ATTNRES_EINVAL);
    kept_free(&rest);
    kept_free(&ko);
    free(other);
    kept_free(&k);
    attnres_plan_destroy(plan);
    p1_case_free(&c);

    /* fp32 source gradients of a bf16 plan: checked as fp32 views, for
     * alignment and for overlap, though bf16 views would pass. */
    REQUIRE(p1_case_make(&c, ATTNRES_DTYPE_BF16, 64, 2, 1, 1, 40, 0, ATTNRES_GRAD_DSOURCES_F32, PB_DLSE_NONE, 0, 8) ==
            0);
    plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    REQUIRE(keep(&k, c.out, c.nout, c.workspace, c.workspace_size) == 0);
    CHECK(RUN1(c.args) == ATTNRES_OK);
    kept_free(&k);
    REQUIRE(keep(&k, c.out, c.nout, c.workspace, c.workspace_size) == 0);
    void *keep1 = c.drows[1];
    c.drows[1] = (char *)c.drows[0] + 2;
    REFUSED(RUN1(c.args), plan, ATTNRES_EINVAL, "4-byte", &k);
    /* Right after the first source's fp32 rows, but inside them as bf16
     * would count them. */
    c.drows[1] = (char *)c.drows[0] + (size_t)c.T * (size_t)c.stride * 2;
    REFUSED(RUN1(c.args), plan, ATTNRES_EINVAL, "overlap", &k);
    c.drows[1] = keep1;
    kept_free(&k);
    attnres_plan_destroy(plan);
    p1_case_free(&c);
    attnres_device_close(cpu);
    cpu = NULL;
}

/* ------------------------------------------------------------------------
 * Phase 2
 * ---------------------------------------------------------------------- */

#define RUN2(a) attnres_run_phase2_backward(plan, c.T, &(a), NULL)

static void test_phase2_refusals(void)
{
    REQUIRE(test_cpu_open(&cpu) == 0);
    p2_case c;
    /* The fused add (dsublayer given) and the epilogue, H = 2, 40 tokens. */
    REQUIRE(p2_case_make(&c, ATTNRES_DTYPE_F32, 64, 2, 1, 1, 40, 0, 0, PB_DSUB, 9) == 0);
    attnres_plan *plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    const int64_t d = c.p.d;
    size_t need = 0, plain = 0;
    CHECK(attnres_plan_workspace_size(plan, c.T, &need) == ATTNRES_OK && need == c.workspace_size);
    {
        /* Without the epilogue the groups' d(out_gain) rows go. */
        attnres_problem q = c.p;
        q.epilogue = 0;
        attnres_plan *without = plan_generic(&q);
        CHECK(without && attnres_plan_workspace_size(without, c.T, &plain) == ATTNRES_OK && plain < need);
        CHECK(plain >= 2 * (size_t)d * 4);
        attnres_plan_destroy(without);
    }
    kept k;
    REQUIRE(keep(&k, c.out, c.nout, c.workspace, c.workspace_size) == 0);
    const attnres_phase2_backward_args good = c.args;
    attnres_phase2_backward_args a;

    /* NULL arguments and pointers. */
    REFUSED(attnres_run_phase2_backward(NULL, c.T, &good, NULL), NULL, ATTNRES_EINVAL, NULL, &k);
    REFUSED(attnres_run_phase2_backward(plan, c.T, NULL, NULL), plan, ATTNRES_EINVAL, "dquery", &k);
    a = good, a.dquery = NULL;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "dquery", &k);
    a = good, a.dquery = (float *)((char *)c.dquery + 2);
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "dquery", &k);
    a = good, a.dout_gain = (float *)((char *)c.dout_gain + 2);
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "dout_gain", &k);
    a = good, a.query = NULL;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "query", &k);
    static const struct { size_t offset; const char *name; } rows[] = {
        {offsetof(attnres_phase2_backward_args, o1), "o1"},
        {offsetof(attnres_phase2_backward_args, lse), "lse"},
        {offsetof(attnres_phase2_backward_args, partial), "partial"},
        {offsetof(attnres_phase2_backward_args, do1), "do1"},
        {offsetof(attnres_phase2_backward_args, dlse), "dlse"},
        {offsetof(attnres_phase2_backward_args, dpartial), "dpartial"},
        {offsetof(attnres_phase2_backward_args, out_gain), "out_gain"},
        {offsetof(attnres_phase2_backward_args, dnormed), "dnormed"},
        {offsetof(attnres_phase2_backward_args, dsublayer), "dsublayer"},
        {offsetof(attnres_phase2_backward_args, dout), "dout"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        /* The field, a pointer of whatever type, through its bytes. */
        char *const field = (char *)&a + rows[i].offset, what[64];
        void *ptr;
        a = good;
        memcpy(&ptr, field, sizeof ptr);
        ptr = (char *)ptr + 2;
        memcpy(field, &ptr, sizeof ptr);
        snprintf(what, sizeof what, "%s misaligned", rows[i].name);
        refused(RUN2(a), plan, ATTNRES_EINVAL, rows[i].name, &k, what, __LINE__);
        /* NULL: refused but for dsublayer (not trained) and dout (the
         * epilogue's dnormed stands in). */
        if (strcmp(rows[i].name, "dsublayer") == 0 || strcmp(rows[i].name, "dout") == 0)
            continue;
        a = good;
        ptr = NULL;
        memcpy(field, &ptr, sizeof ptr);
        snprintf(what, sizeof what, "%s NULL", rows[i].name);
        refused(RUN2(a), plan, ATTNRES_EINVAL, rows[i].name, &k, what, __LINE__);
    }

    /* The workspace. */
    a = good, a.workspace_size = need - 1;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "workspace", &k);
    a = good, a.workspace = NULL;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "workspace", &k);
    void *other = scratch_ws(need);
    REQUIRE(other != NULL);
    kept ko;
    REQUIRE(keep(&ko, NULL, 0, other, need + 128) == 0);
    a = good, a.workspace = (char *)other + 32;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "not aligned", &k);
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "not aligned", &ko);
    a = good, a.workspace = c.db;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "the workspace and dpartial overlap", &k);

    /* Flags: phase 2 takes ATTNRES_GRAD_ACCUMULATE only. */
    a = good, a.flags = ATTNRES_GRAD_DSOURCES_F32;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "ATTNRES_GRAD_ACCUMULATE only", &k);
    a = good, a.flags = ATTNRES_GRAD_ACCUMULATE | ATTNRES_GRAD_DSOURCES_F32;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "unknown flags 0x2", &k);
    a = good, a.flags = 8;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "unknown flags 0x8", &k);

    /* Overlaps: no output may share a byte with another argument, not
     * even, accumulated, another per-token gradient. */
    a = good, a.do1 = c.db;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a = good, a.dsublayer = c.db;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a.flags = ATTNRES_GRAD_ACCUMULATE;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a = good, a.do1 = c.o1;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a = good, a.dlse = c.lse;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a = good, a.dquery = c.query;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a = good, a.dout_gain = c.out_gain;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a = good, a.dout_gain = c.dquery;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);
    a = good, a.dpartial = (char *)c.dnormed + 4 * (size_t)(d + 3); /* inside dnormed, off its rows */
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "overlap", &k);

    /* Strides below a row (d, or H for lse and dlse). */
    static const struct { size_t offset; int64_t value; const char *name; } strides[] = {
        {offsetof(attnres_phase2_backward_args, o1_stride), -1, "o1"},
        {offsetof(attnres_phase2_backward_args, partial_stride), -1, "partial"},
        {offsetof(attnres_phase2_backward_args, dout_stride), -1, "dout"},
        {offsetof(attnres_phase2_backward_args, dnormed_stride), -1, "dnormed"},
        {offsetof(attnres_phase2_backward_args, do1_stride), -1, "do1"},
        {offsetof(attnres_phase2_backward_args, dpartial_stride), -1, "dpartial"},
        {offsetof(attnres_phase2_backward_args, dsublayer_stride), -1, "dsublayer"},
        {offsetof(attnres_phase2_backward_args, lse_stride), 1, "lse"},
        {offsetof(attnres_phase2_backward_args, dlse_stride), 1, "dlse"},
    };
    for (size_t i = 0; i < sizeof strides / sizeof strides[0]; i++) {
        a = good;
        *(int64_t *)((char *)&a + strides[i].offset) = strides[i].value < 0 ? d - 1 : strides[i].value;
        char what[64];
        snprintf(what, sizeof what, "%s stride below its row", strides[i].name);
        refused(RUN2(a), plan, ATTNRES_EMISMATCH, strides[i].name, &k, what, __LINE__);
    }

    /* eps and out_eps, struct_size, T. */
    static const float bad_eps[] = {0.0f, -1e-6f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_eps / sizeof bad_eps[0]; i++) {
        a = good, a.eps = bad_eps[i];
        REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "eps", &k);
        a = good, a.out_eps = bad_eps[i];
        REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "out_eps", &k);
    }
    a = good, a.struct_size = sizeof a + 8;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "struct_size", &k);
    REFUSED(attnres_run_phase2_backward(plan, -5, &good, NULL), plan, ATTNRES_EINVAL, "T", &k);

    /* Another op's entry on this plan, and this entry on another op's. */
    attnres_phase1_backward_args a1;
    attnres_phase1_backward_args_init(&a1);
    REFUSED(attnres_run_phase1_backward(plan, c.T, &a1, NULL), plan, ATTNRES_EMISMATCH, "phase2_backward", &k);
    attnres_phase2_args f2;
    attnres_phase2_args_init(&f2);
    REFUSED(attnres_run_phase2(plan, c.T, &f2, NULL), plan, ATTNRES_EMISMATCH, "phase2_backward", &k);
    {
        attnres_problem fwd = c.p;
        fwd.op = ATTNRES_OP_PHASE2;
        attnres_plan *forward = plan_generic(&fwd);
        CHECK(forward != NULL);
        if (forward)
            REFUSED(attnres_run_phase2_backward(forward, c.T, &good, NULL), forward, ATTNRES_EMISMATCH,
                    "attnres_run_phase2_backward", &k);
        attnres_plan_destroy(forward);
    }

    /* What runs: the case as made, dout NULL (the epilogue's dnormed
     * stands in), dsublayer and d(out_gain) NULL (not trained). */
    CHECK(RUN2(good) == ATTNRES_OK);
    a = good, a.dout = NULL;
    CHECK(RUN2(a) == ATTNRES_OK);
    a = good, a.dsublayer = NULL, a.dout_gain = NULL;
    CHECK(RUN2(a) == ATTNRES_OK);

    /* No tokens: zero dquery and d(out_gain), nothing else written. */
    kept rest;
    REQUIRE(keep(&rest, c.out, 4, c.workspace, c.workspace_size) == 0); /* do1, dlse, dpartial, dsublayer */
    for (int64_t i = 0; i < d; i++)
        c.dquery[i] = c.dout_gain[i] = 1.0f;
    CHECK(attnres_run_phase2_backward(plan, 0, &good, NULL) == ATTNRES_OK);
    int zero = 1;
    for (int64_t i = 0; i < d; i++)
        zero &= c.dquery[i] == 0.0f && c.dout_gain[i] == 0.0f;
    CHECK(zero);
    CHECK(unchanged(&rest));
    attnres_phase2_backward_args none;
    attnres_phase2_backward_args_init(&none);
    none.dquery = c.dquery;
    for (int64_t i = 0; i < d; i++)
        c.dquery[i] = 1.0f;
    CHECK(attnres_run_phase2_backward(plan, 0, &none, NULL) == ATTNRES_OK);
    zero = 1;
    for (int64_t i = 0; i < d; i++)
        zero &= c.dquery[i] == 0.0f;
    CHECK(zero);
    CHECK(unchanged(&rest));
    none.flags = ATTNRES_GRAD_DSOURCES_F32;
    CHECK(attnres_run_phase2_backward(plan, 0, &none, NULL) == ATTNRES_EINVAL);
    kept_free(&rest);
    kept_free(&ko);
    free(other);
    kept_free(&k);
    attnres_plan_destroy(plan);
    p2_case_free(&c);

    /* Without the epilogue: dout is needed; d(out_gain), given, is left
     * alone, at T = 0 too. */
    REQUIRE(p2_case_make(&c, ATTNRES_DTYPE_BF16, 64, 1, 0, 0, 40, 0, 0, 0, 10) == 0);
    plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    REQUIRE(keep(&k, c.out, c.nout, c.workspace, c.workspace_size) == 0);
    a = c.args, a.dout = NULL;
    REFUSED(RUN2(a), plan, ATTNRES_EINVAL, "dout", &k);
    kept_free(&k);
    a = c.args, a.dout_gain = c.dout_gain, a.out_gain = c.out_gain, a.dnormed = c.dnormed;
    REQUIRE(keep(&k, c.out + 5, 1, c.workspace, 0) == 0); /* dout_gain */
    CHECK(RUN2(a) == ATTNRES_OK);
    CHECK(attnres_run_phase2_backward(plan, 0, &a, NULL) == ATTNRES_OK);
    CHECK(unchanged(&k));
    kept_free(&k);
    attnres_plan_destroy(plan);
    p2_case_free(&c);
    attnres_device_close(cpu);
    cpu = NULL;
}

/* ------------------------------------------------------------------------
 * attnres_plan_workspace_size for every op
 * ---------------------------------------------------------------------- */

static void test_workspace_sizes(void)
{
    REQUIRE(test_cpu_open(&cpu) == 0);
    const int64_t d = 96, Ts[] = {0, 1, 32, 33, 70};
    for (int op = ATTNRES_OP_MIX; op <= ATTNRES_OP_PHASE2_BACKWARD; op++)
        for (int epi = 0; epi <= 1; epi++) {
            const attnres_op fwd = op == ATTNRES_OP_MIX_BACKWARD       ? ATTNRES_OP_MIX
                                   : op == ATTNRES_OP_PHASE1_BACKWARD ? ATTNRES_OP_PHASE1
                                   : op == ATTNRES_OP_PHASE2_BACKWARD ? ATTNRES_OP_PHASE2
                                                                      : (attnres_op)op;
            if (epi && fwd == ATTNRES_OP_PHASE1)
                continue; /* no epilogue */
            attnres_problem p;
            attnres_problem_init(&p, ATTNRES_DTYPE_BF16, d, fwd == ATTNRES_OP_PHASE2 ? 1 : 3);
            p.op = (attnres_op)op;
            p.heads = 2;
            p.epilogue = epi;
            p.s = fwd == ATTNRES_OP_PHASE1 ? 5 : 0;
            attnres_plan *plan = plan_generic(&p);
            CHECK(plan != NULL);
            if (!plan)
                continue;
            for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++) {
                const int64_t T = Ts[i], groups = (T + 31) / 32;
                size_t bytes = 12345, mix = 0;
                CHECK(attnres_plan_workspace_size(plan, T, &bytes) == ATTNRES_OK);
                if (op == ATTNRES_OP_MIX || op == ATTNRES_OP_PHASE1 || op == ATTNRES_OP_PHASE2) {
                    CHECK(bytes == 0);
                } else if (op == ATTNRES_OP_MIX_BACKWARD) {
                    CHECK(attnres_mix_backward_workspace_size(plan, T, &mix) == ATTNRES_OK && bytes == mix);
                } else {
                    /* Every group's rows: S of d floats (phase 1), or d and with
                     * the epilogue d more (phase 2). */
                    const size_t rows = (size_t)groups * (size_t)d * 4 * (op == ATTNRES_OP_PHASE1_BACKWARD ? 5 : 1);
                    CHECK(bytes >= rows * (epi ? 2 : 1));
                    CHECK(bytes <= rows * (epi ? 2 : 1) + 192 + (size_t)groups * 4);
                    CHECK(T > 0 || bytes == 0);
                }
                if (op == ATTNRES_OP_PHASE1_BACKWARD || op == ATTNRES_OP_PHASE2_BACKWARD) {
                    /* What a run needs: one byte less is refused. */
                    ar_backward_ws ws;
                    CHECK(ar_mix_backward_workspace(op == ATTNRES_OP_PHASE1_BACKWARD ? d * 5 : d, T,
                                                    op == ATTNRES_OP_PHASE2_BACKWARD && epi, &ws) == 0 &&
                          ws.bytes == bytes);
                }
            }
            size_t bytes = 0;
            CHECK(attnres_plan_workspace_size(plan, -1, &bytes) == ATTNRES_EINVAL);
            CHECK(strstr(attnres_plan_errmsg(plan), "T = -1") != NULL);
            if (op >= ATTNRES_OP_MIX_BACKWARD)
                CHECK(attnres_plan_workspace_size(plan, INT64_MAX, &bytes) == ATTNRES_EINVAL);
            attnres_plan_destroy(plan);
        }
    /* A run given exactly the size it reports runs, one byte less does not
     * (phase 1 at 33 tokens: two groups). */
    p1_case c;
    REQUIRE(p1_case_make(&c, ATTNRES_DTYPE_F32, 64, 2, 3, 1, 33, 0, 0, PB_DLSE_ALL, 0, 3) == 0);
    attnres_plan *plan = plan_generic(&c.p);
    size_t need = 0;
    CHECK(plan && attnres_plan_workspace_size(plan, c.T, &need) == ATTNRES_OK);
    if (plan) {
        c.args.workspace_size = need;
        CHECK(attnres_run_phase1_backward(plan, c.T, &c.args, NULL) == ATTNRES_OK);
        c.args.workspace_size = need - 1;
        CHECK(attnres_run_phase1_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    }
    attnres_plan_destroy(plan);
    p1_case_free(&c);
    attnres_device_close(cpu);
    cpu = NULL;
}

/* ------------------------------------------------------------------------
 * CUDA
 * ---------------------------------------------------------------------- */

/* Floats past the sums a T = 0 run writes, which must stay as they were. */
#define CUDA_TAIL 16

static void test_cuda_plans(void)
{
    attnres_device *gpu = NULL;
    char msg[512] = "";
    if (attnres_device_open("cuda:0", &gpu, msg, sizeof msg) != ATTNRES_OK) {
        const char *driver = getenv("ATTNRES_CUDA_DRIVER");
        if (driver && *driver) {
            fprintf(stderr, "cuda:0 did not open with ATTNRES_CUDA_DRIVER=%s: %s\n", driver, msg);
            check_failures++;
        } else {
            printf("skip: no CUDA device (%s) and ATTNRES_CUDA_DRIVER is unset\n", msg);
        }
        return;
    }
    if (ar_nvrtc_available(msg, sizeof msg) != 0) {
        printf("skip: NVRTC is not available (%s): no CUDA plan can compile its kernel\n", msg);
        attnres_device_close(gpu);
        return;
    }
    /* The plans compile their built-in kernels: into the suite's kernel
     * cache under ctest, never the user's. */
    const char *cache = getenv("ATTNRES_TEST_KERNEL_CACHE");
    if (!getenv("ATTNRES_CACHE_DIR") && cache && *cache)
        setenv("ATTNRES_CACHE_DIR", cache, 1);
    const int64_t d = 128;
    for (int op = ATTNRES_OP_PHASE1_BACKWARD; op <= ATTNRES_OP_PHASE2_BACKWARD; op++) {
        const int phase1 = op == ATTNRES_OP_PHASE1_BACKWARD, S = 2;
        attnres_problem p;
        attnres_problem_init(&p, ATTNRES_DTYPE_BF16, d, phase1 ? 3 : 1);
        p.op = (attnres_op)op;
        p.heads = 2;
        p.s = phase1 ? S : 0;
        p.epilogue = !phase1; /* phase 2's sums then take d(out_gain) too */
        attnres_plan *plan = NULL;
        msg[0] = '\0';
        const int rc = attnres_plan_create(gpu, NULL, &p, 0, &plan, msg, sizeof msg);
        CHECK(rc == ATTNRES_OK);
        if (rc != ATTNRES_OK || !plan) {
            fprintf(stderr, "a CUDA plan of %s: %s\n", phase1 ? "phase1_backward" : "phase2_backward", msg);
            continue;
        }
        /* The workspace: none at T = 0, the groups' rows at 33 tokens. */
        size_t bytes = 1;
        ar_backward_ws ws;
        CHECK(attnres_plan_workspace_size(plan, 0, &bytes) == ATTNRES_OK && bytes == 0);
        CHECK(attnres_plan_workspace_size(plan, 33, &bytes) == ATTNRES_OK);
        CHECK(ar_mix_backward_workspace(phase1 ? S * d : d, 33, !phase1, &ws) == 0 && ws.bytes == bytes);
        /* T = 0 from no arguments but the sums: S rows of d, or dquery and
         * d(out_gain), NaN before, zeros after, the floats past them kept. */
        const size_t sums = (size_t)(phase1 ? S * d : 2 * d), all = sums + CUDA_TAIL;
        float *host = malloc(all * sizeof(float));
        void *mem = NULL;
        REQUIRE(host != NULL);
        memset(host, 0xff, all * sizeof(float));
        CHECK(gpu->ops->mem_alloc(gpu, all * sizeof(float), &mem) == ATTNRES_OK);
        if (mem && gpu->ops->copy_to_device(gpu, mem, host, all * sizeof(float)) == ATTNRES_OK) {
            int run;
            if (phase1) {
                attnres_phase1_backward_args a;
                attnres_phase1_backward_args_init(&a);
                a.dqueries = mem;
                run = attnres_run_phase1_backward(plan, 0, &a, NULL);
            } else {
                attnres_phase2_backward_args a;
                attnres_phase2_backward_args_init(&a);
                a.dquery = mem;
                a.dout_gain = (float *)mem + d;
                run = attnres_run_phase2_backward(plan, 0, &a, NULL);
            }
            CHECK(run == ATTNRES_OK);
            if (run != ATTNRES_OK)
                fprintf(stderr, "T = 0: %s\n", attnres_plan_errmsg(plan));
            CHECK(gpu->ops->copy_to_host(gpu, host, mem, all * sizeof(float)) == ATTNRES_OK);
            int zeros = 1, kept = 1;
            for (size_t i = 0; i < sums; i++)
                zeros &= host[i] == 0.0f;
            for (size_t i = sums; i < all; i++)
                kept &= isnan(host[i]) != 0;
            CHECK(run != ATTNRES_OK || zeros);
            CHECK(kept);
        } else {
            fprintf(stderr, "the sums' device buffer could not be made or filled\n");
            check_failures++;
        }
        if (mem)
            gpu->ops->mem_free(gpu, mem);
        free(host);
        attnres_plan_destroy(plan);
    }
    attnres_device_close(gpu);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN_CASE(test_phase1_refusals);
    RUN_CASE(test_phase2_refusals);
    RUN_CASE(test_workspace_sizes);
    RUN_CASE(test_cuda_plans);
    CHECK_EXIT();
}
