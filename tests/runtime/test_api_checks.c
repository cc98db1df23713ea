/*
 * test_api_checks.c - what the public API refuses before anything runs:
 * problems beyond the limits of attnres.h or of the CPU's kernels (refused
 * when the plan is made, with a message naming the limit), views whose
 * extent overflows, NULL arguments, outputs that overlap other buffers,
 * and a CPU device asked for a built-in level there is not. Each refusal
 * is EINVAL with a message naming the argument; the legitimate cases next
 * to each (in-place out = partial, interleaved rows) still run.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "check.h"
#include "miss_file.h"
#include "test_device.h"

/* The call is refused with EINVAL, and the plan's message names what was
 * wrong. */
#define CHECK_REFUSED(plan, call, what)                                                                                \
    do {                                                                                                               \
        CHECK((call) == ATTNRES_EINVAL);                                                                               \
        CHECK(strstr(attnres_plan_errmsg(plan), (what)) != NULL);                                                      \
    } while (0)

/* Sets one stride of the arguments to value, checks that call refuses it
 * naming what, and puts the stride back to 0 for the next check. */
#define CHECK_STRIDE_REFUSED(plan, call, stride, value, what)                                                          \
    do {                                                                                                               \
        (stride) = (value);                                                                                            \
        CHECK_REFUSED(plan, call, what);                                                                               \
        (stride) = 0;                                                                                                  \
    } while (0)

/* The same for a conflict between two arguments: the message names both. */
#define CHECK_REFUSED_NAMING_BOTH(plan, call, first, second)                                                           \
    do {                                                                                                               \
        CHECK((call) == ATTNRES_EINVAL);                                                                               \
        CHECK(strstr(attnres_plan_errmsg(plan), (first)) && strstr(attnres_plan_errmsg(plan), (second)));              \
    } while (0)

static attnres_device *cpu;

static int plan_status(const attnres_problem *p, char *msg, size_t msg_len)
{
    attnres_plan *plan = NULL;
    int st = attnres_plan_create(cpu, NULL, p, 0, &plan, msg, msg_len);
    attnres_plan_destroy(plan);
    return st;
}

static void mix_problem(attnres_problem *p, int64_t d, int32_t n, int32_t heads)
{
    attnres_problem_init(p, ATTNRES_DTYPE_F32, d, n);
    p->heads = heads;
}

/* ---- limits ----------------------------------------------------------- */

static void test_plan_refuses_more_sources_than_cpu_kernels_take(void)
{
    attnres_problem p;
    mix_problem(&p, 64, 300, 1);
    char msg[512] = "";
    CHECK(attnres_problem_check(&p, NULL, 0) == ATTNRES_OK); /* other devices may take it */
    CHECK(plan_status(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "256") != NULL && strstr(msg, "N = 300") != NULL);
    CHECK(strstr(attnres_device_errmsg(cpu), "256") != NULL);
    mix_problem(&p, 64, 256, 1);
    CHECK(plan_status(&p, msg, sizeof msg) == ATTNRES_OK);
    /* Phase 1 keeps n * S * H softmax weights per token. */
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 16, 64);
    p.op = ATTNRES_OP_PHASE1;
    p.s = 64;
    p.heads = 16;
    CHECK(plan_status(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "softmax weights") != NULL);
}

/* Every problem attnres_problem_check accepts makes a miss line the reader
 * accepts, and the checker refuses one past each limit. */
static void test_limits_are_one_table_for_plans_and_miss_lines(void)
{
    attnres_problem p;
    char msg[512] = "";
    mix_problem(&p, ATTNRES_MAX_D, ATTNRES_MAX_N, ATTNRES_MAX_HEADS);
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_OK);
    ar_miss m = {.p = p, .t = AR_MISS_MAX_T};
    snprintf(m.device, sizeof m.device, "cpu|some cpu|x86_64");
    char line[AR_MISS_LINE_MAX + 2];
    CHECK(ar_miss_format_line(&m, line, sizeof line) > 0);
    attnres_problem_init(&m.p, ATTNRES_DTYPE_BF16, ATTNRES_MAX_D, 1);
    m.p.op = ATTNRES_OP_PHASE1;
    m.p.s = ATTNRES_MAX_S;
    CHECK(ar_miss_format_line(&m, line, sizeof line) > 0);

    mix_problem(&p, 1 << 21, ATTNRES_MAX_N + 1, 1);
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "N") != NULL && strstr(msg, "1048576") != NULL);
    mix_problem(&p, ATTNRES_MAX_HEADS + 1, 1, ATTNRES_MAX_HEADS + 1);
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "heads") != NULL && strstr(msg, "1048576") != NULL);
    mix_problem(&p, (int64_t)ATTNRES_MAX_D + 1, 1, 1);
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "d ") != NULL && strstr(msg, "16777216") != NULL);
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, 64, 1);
    p.op = ATTNRES_OP_PHASE1;
    p.s = ATTNRES_MAX_S + 1;
    CHECK(attnres_problem_check(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "4096") != NULL);
}

/* Runs a mix of n sources of width d with T tokens, all ones, on the
 * calling thread's stack; 0 when the output is right. */
static int run_ones(attnres_plan *plan, int64_t d, int32_t n, int64_t T)
{
    float *buf = malloc(sizeof(float) * (size_t)(d * T * (n + 1) + d));
    if (!buf)
        return -1;
    const void *views[4];
    for (int64_t i = 0; i < d * T * n + d; i++)
        buf[i] = 1.0f;
    for (int i = 0; i < n; i++)
        views[i] = buf + (size_t)(i * d * T);
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = views;
    a.query = buf + (size_t)(d * T * n);
    a.out = buf + (size_t)(d * T * n + d);
    memset(a.out, 0, sizeof(float) * (size_t)(d * T));
    int bad = attnres_run_mix(plan, T, &a, NULL) != ATTNRES_OK;
    for (int64_t k = 0; k < d * T && !bad; k++)
        bad = fabsf(((float *)a.out)[k] - 1.0f) > 1e-5f;
    free(buf);
    return bad;
}

typedef struct stack_run {
    attnres_plan *plan;
    int64_t d;
    int32_t n;
    int bad;
} stack_run;

static void *run_in_thread(void *arg)
{
    stack_run *r = arg;
    r->bad = run_ones(r->plan, r->d, r->n, 3);
    return NULL;
}

/* Per-head state beyond what the CPU kernels may keep on the stack is
 * refused at plan time (it crashed inside a kernel); the largest accepted
 * shape runs on a thread with the default stack. */
static void test_many_heads_refused_at_plan_not_crashing(void)
{
    attnres_problem p;
    char msg[512] = "";
    mix_problem(&p, 524288, 1, 524288);
    CHECK(plan_status(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(strstr(msg, "stack") != NULL);
    mix_problem(&p, (int64_t)1 << 22, 1, 1);
    CHECK(plan_status(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    p.op = ATTNRES_OP_PHASE2;
    CHECK(plan_status(&p, msg, sizeof msg) == ATTNRES_EINVAL);
    /* The largest H = d with N = 2 that fits, by doubling. */
    int64_t fits = 0;
    for (int64_t h = 1024; h <= ATTNRES_MAX_HEADS; h *= 2) {
        mix_problem(&p, h, 2, (int32_t)h);
        if (plan_status(&p, msg, sizeof msg) != ATTNRES_OK)
            break;
        fits = h;
    }
    REQUIRE(fits >= 16384);
    mix_problem(&p, fits, 2, (int32_t)fits);
    attnres_plan *plan = NULL;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg) == ATTNRES_OK);
    stack_run r = {plan, fits, 2, -1};
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, run_in_thread, &r) == 0);
    pthread_join(th, NULL);
    CHECK(r.bad == 0);
    attnres_plan_destroy(plan);
}

/* ---- view extents ----------------------------------------------------- */

static void test_stride_times_tokens_overflow_is_refused(void)
{
    enum { D = 16, N = 2 };
    attnres_problem p;
    mix_problem(&p, D, N, 1);
    p.form = ATTNRES_FORM_ADDITIVE;
    p.epilogue = 1;
    attnres_plan *plan = NULL;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    static float src[N][2 * D], q[D], part[2 * D], out[2 * D], gain[D], normed[2 * D];
    const void *views[N] = {src[0], src[1]};
    int64_t strides[N] = {0, 0};
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = views;
    a.source_strides = strides;
    a.query = q;
    a.partial = part;
    a.out = out;
    a.out_gain = gain;
    a.normed = normed;
    CHECK(attnres_run_mix(plan, 2, &a, NULL) == ATTNRES_OK);
    /* Each overflows the extent in bytes (f32: 4 * 2^61 = 2^63) if not in
     * elements; a stride that fits but points at unmapped memory is the
     * caller's lie, which no check can see. */
    const int64_t huge[] = {INT64_MAX, INT64_MAX / 2, INT64_MAX / 4 + 1, (int64_t)1 << 61};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        CHECK_STRIDE_REFUSED(plan, attnres_run_mix(plan, 2, &a, NULL), a.out_stride, huge[i], "out_stride");
        CHECK_STRIDE_REFUSED(plan, attnres_run_mix(plan, 2, &a, NULL), strides[1], huge[i], "source 1");
        CHECK_STRIDE_REFUSED(plan, attnres_run_mix(plan, 2, &a, NULL), a.partial_stride, huge[i], "partial_stride");
        CHECK_STRIDE_REFUSED(plan, attnres_run_mix(plan, 2, &a, NULL), a.normed_stride, huge[i], "normed_stride");
    }
    /* One token spans no stride, but kernels scale it to bytes anyway. */
    CHECK_STRIDE_REFUSED(plan, attnres_run_mix(plan, 1, &a, NULL), strides[0], (int64_t)1 << 61, "source 0");
    /* T itself can overflow the extent with an ordinary stride. */
    CHECK(attnres_run_mix(plan, INT64_MAX / 8, &a, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_run_mix(plan, 2, &a, NULL) == ATTNRES_OK);
    attnres_plan_destroy(plan);

    /* Phase 2's views, and phase 1's. */
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, D, 1);
    p.op = ATTNRES_OP_PHASE2;
    p.heads = 2;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    static float o1[2 * D], lse[4], b[2 * D];
    attnres_phase2_args a2;
    attnres_phase2_args_init(&a2);
    a2.o1 = o1;
    a2.lse = lse;
    a2.partial = b;
    a2.query = q;
    a2.out = out;
    CHECK(attnres_run_phase2(plan, 2, &a2, NULL) == ATTNRES_OK);
    CHECK_STRIDE_REFUSED(plan, attnres_run_phase2(plan, 2, &a2, NULL), a2.lse_stride, INT64_MAX, "lse_stride");
    CHECK_STRIDE_REFUSED(plan, attnres_run_phase2(plan, 2, &a2, NULL), a2.o1_stride, INT64_MAX / 2, "o1_stride");
    CHECK(attnres_run_phase2(plan, 2, &a2, NULL) == ATTNRES_OK);
    attnres_plan_destroy(plan);

    attnres_problem_init(&p, ATTNRES_DTYPE_F32, D, N);
    p.op = ATTNRES_OP_PHASE1;
    p.s = 1;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    void *o1s[1] = {o1};
    float *lses[1] = {lse};
    attnres_phase1_args a1;
    attnres_phase1_args_init(&a1);
    a1.sources = views;
    a1.source_strides = strides;
    a1.queries = q;
    a1.o1 = o1s;
    a1.lse = lses;
    CHECK(attnres_run_phase1(plan, 2, &a1, NULL) == ATTNRES_OK);
    CHECK_STRIDE_REFUSED(plan, attnres_run_phase1(plan, 2, &a1, NULL), a1.o1_stride, INT64_MAX, "o1_stride");
    CHECK_STRIDE_REFUSED(plan, attnres_run_phase1(plan, 2, &a1, NULL), strides[0], INT64_MAX / 2, "source 0");
    attnres_plan_destroy(plan);
}

/* ---- NULL arguments --------------------------------------------------- */

static void test_null_arguments_are_refused_or_ignored(void)
{
    CHECK(attnres_dtype_parse("f32", NULL) == ATTNRES_EINVAL);
    attnres_dtype dt;
    CHECK(attnres_dtype_parse(NULL, &dt) == ATTNRES_EINVAL);
    attnres_problem_init(NULL, ATTNRES_DTYPE_F32, 4, 1);
    attnres_mix_args_init(NULL);
    attnres_phase1_args_init(NULL);
    attnres_phase2_args_init(NULL);
    float u[4] = {1, 2, 3, 4};
    attnres_fold_query(NULL, NULL, u, 4);
    attnres_fold_query(u, NULL, NULL, 4);
    CHECK(u[0] == 1 && u[3] == 4);
    CHECK(attnres_problem_check(NULL, NULL, 0) == ATTNRES_EINVAL);
    CHECK(attnres_errstr(-5) != NULL && attnres_dtype_name((attnres_dtype)9) != NULL);
    CHECK(attnres_device_count(NULL) == 0);
    attnres_device *dev = (attnres_device *)1;
    char msg[256];
    CHECK(attnres_device_open(NULL, &dev, msg, sizeof msg) == ATTNRES_EINVAL && dev == NULL);
    CHECK(attnres_device_open("cpu", NULL, msg, sizeof msg) == ATTNRES_EINVAL);
    attnres_device_info info = {.struct_size = sizeof info};
    CHECK(attnres_device_info_get(NULL, &info) == ATTNRES_EINVAL);
    CHECK(attnres_device_info_get(cpu, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_device_errmsg(NULL) != NULL);
    attnres_db *db = (attnres_db *)1;
    CHECK(attnres_db_open(NULL, &db, msg, sizeof msg) == ATTNRES_EINVAL && db == NULL);
    CHECK(attnres_db_open("x.db", NULL, NULL, 0) == ATTNRES_EINVAL);
    attnres_problem p;
    mix_problem(&p, 8, 1, 1);
    attnres_plan *plan = (attnres_plan *)1;
    CHECK(attnres_plan_create(NULL, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_EINVAL && plan == NULL);
    CHECK(attnres_plan_create(cpu, NULL, NULL, 0, &plan, NULL, 0) == ATTNRES_EINVAL);
    CHECK(attnres_plan_create(cpu, NULL, &p, 0, NULL, NULL, 0) == ATTNRES_EINVAL);
    CHECK(attnres_plan_explain(NULL, NULL, 0) == 0);
    CHECK(attnres_plan_errmsg(NULL) != NULL);
    CHECK(attnres_run_mix(NULL, 1, NULL, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_run_phase1(NULL, 1, NULL, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_run_phase2(NULL, 1, NULL, NULL) == ATTNRES_EINVAL);
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    CHECK(attnres_plan_explain(plan, NULL, 0) > 0);
    CHECK(attnres_run_mix(plan, 1, NULL, NULL) == ATTNRES_EINVAL);
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    const void *none[1] = {NULL};
    static float q[8], out[8];
    a.sources = none;
    a.query = q;
    a.out = out;
    CHECK_REFUSED(plan, attnres_run_mix(plan, 1, &a, NULL), "source 0");
    attnres_plan_destroy(plan);
    /* The references. */
    double dq[8] = {0}, dout[8];
    const double *dsrc[1] = {NULL};
    CHECK(attnres_reference_mix(NULL, 1, dsrc, dq, 1, 1e-6, NULL, 1, NULL, 1e-6, dout, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_reference_mix(&p, 1, dsrc, dq, 1, 1e-6, NULL, 1, NULL, 1e-6, dout, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_reference_mix(&p, 1, NULL, dq, 1, 1e-6, NULL, 1, NULL, 1e-6, dout, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_reference_phase1(NULL, 1, NULL, NULL, 1, 1e-6, NULL, NULL) == ATTNRES_EINVAL);
    CHECK(attnres_reference_phase2(NULL, 1, NULL, NULL, NULL, NULL, NULL, 1, 1e-6, NULL, 1e-6, NULL, NULL) ==
          ATTNRES_EINVAL);
    attnres_plan_destroy(NULL);
    attnres_device_close(NULL);
    attnres_db_close(NULL);
    CHECK(attnres_plan_level_get(NULL) == ATTNRES_LEVEL_GENERIC);
}

/* ---- overlap ---------------------------------------------------------- */

static void test_overlapping_outputs_are_refused(void)
{
    enum { D = 32, N = 2, T = 4 };
    attnres_problem p;
    mix_problem(&p, D, N, 2);
    p.form = ATTNRES_FORM_ADDITIVE;
    attnres_plan *plan = NULL;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    /* One buffer holds everything, as views of a [T, 2D] tensor do. */
    static float big[8 * T * D], q[D];
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++)
        big[i] = (float)(i % 13) * 0.25f - 1.0f;
    for (int k = 0; k < D; k++)
        q[k] = 0.1f * (float)(k % 5);
    const void *views[N] = {big, big + T * D};
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = views;
    a.query = q;
    a.partial = big + 2 * T * D;
    a.out = big + 3 * T * D;
    CHECK(attnres_run_mix(plan, T, &a, NULL) == ATTNRES_OK);
    /* In place: out is partial. */
    a.out = (void *)a.partial;
    CHECK(attnres_run_mix(plan, T, &a, NULL) == ATTNRES_OK);
    /* out shifted by one element from partial. */
    a.out = big + 2 * T * D + 1;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_mix(plan, T, &a, NULL), "out", "partial");
    /* The query inside out. */
    a.out = big + 3 * T * D;
    a.query = big + 3 * T * D + D;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_mix(plan, T, &a, NULL), "query", "out");
    a.query = q;
    /* out over a source, by its last row. */
    a.out = big + T * D + (T - 1) * D;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_mix(plan, T, &a, NULL), "source 1", "out");
    /* Interleaved rows of one [T, 2D] buffer do not overlap: source 1 in
     * the even half-rows, out in the odd ones. */
    int64_t strides[N] = {0, 2 * D};
    a.source_strides = strides;
    views[1] = big + 4 * T * D;
    a.out = big + 4 * T * D + D;
    a.out_stride = 2 * D;
    CHECK(attnres_run_mix(plan, T, &a, NULL) == ATTNRES_OK);
    a.out = big + 4 * T * D + D - 1;
    CHECK(attnres_run_mix(plan, T, &a, NULL) == ATTNRES_EINVAL);
    attnres_plan_destroy(plan);

    /* out and normed as one buffer. */
    mix_problem(&p, D, N, 1);
    p.epilogue = 1;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    attnres_mix_args_init(&a);
    views[1] = big + T * D;
    a.sources = views;
    a.query = q;
    a.out = big + 3 * T * D;
    a.out_gain = q;
    a.normed = big + 3 * T * D;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_mix(plan, T, &a, NULL), "normed", "out");
    a.normed = big + 4 * T * D;
    CHECK(attnres_run_mix(plan, T, &a, NULL) == ATTNRES_OK);
    a.out_gain = big + 4 * T * D + D;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_mix(plan, T, &a, NULL), "out_gain", "normed");
    attnres_plan_destroy(plan);

    /* Phase 1: two sites' o1 as one buffer; an lse over a source. */
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, D, N);
    p.op = ATTNRES_OP_PHASE1;
    p.s = 2;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    static float qs[2 * D], o1[2 * T * D], lse[2 * T];
    void *o1s[2] = {o1, o1 + T * D};
    float *lses[2] = {lse, lse + T};
    attnres_phase1_args a1;
    attnres_phase1_args_init(&a1);
    a1.sources = views;
    a1.queries = qs;
    a1.o1 = o1s;
    a1.lse = lses;
    CHECK(attnres_run_phase1(plan, T, &a1, NULL) == ATTNRES_OK);
    o1s[1] = o1;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_phase1(plan, T, &a1, NULL), "o1[0]", "o1[1]");
    o1s[1] = o1 + T * D;
    lses[1] = big + 1;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_phase1(plan, T, &a1, NULL), "lse[1]", "source 0");
    lses[1] = lse + T;
    CHECK(attnres_run_phase1(plan, T, &a1, NULL) == ATTNRES_OK);
    attnres_plan_destroy(plan);

    /* Past 64 sites the outputs are compared by sorted address ranges. */
    enum { S = 100 };
    p.s = S;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    float *many = calloc((size_t)S * (T * D + T) + (size_t)S * D, sizeof(float));
    REQUIRE(many);
    void *o1m[S];
    float *lsem[S];
    for (int j = 0; j < S; j++) {
        o1m[S - 1 - j] = many + (size_t)j * T * D; /* descending, to give the sort work */
        lsem[j] = many + (size_t)S * T * D + (size_t)j * T;
    }
    a1.queries = many + (size_t)S * (T * D + T);
    a1.o1 = o1m;
    a1.lse = lsem;
    CHECK(attnres_run_phase1(plan, T, &a1, NULL) == ATTNRES_OK);
    lsem[70] = lsem[3] + 1;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_phase1(plan, T, &a1, NULL), "lse[3]", "lse[70]");
    lsem[70] = many + (size_t)S * T * D + 70 * T;
    o1m[5] = (float *)o1m[6] + (T - 1) * D;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_phase1(plan, T, &a1, NULL), "o1[5]", "o1[6]");
    attnres_plan_destroy(plan);
    free(many);

    /* Phase 2: out over o1. */
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, D, 1);
    p.op = ATTNRES_OP_PHASE2;
    REQUIRE(attnres_plan_create(cpu, NULL, &p, 0, &plan, NULL, 0) == ATTNRES_OK);
    attnres_phase2_args a2;
    attnres_phase2_args_init(&a2);
    a2.o1 = o1;
    a2.lse = lse;
    a2.partial = big;
    a2.query = q;
    a2.out = big + T * D;
    CHECK(attnres_run_phase2(plan, T, &a2, NULL) == ATTNRES_OK);
    a2.out = o1;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_phase2(plan, T, &a2, NULL), "o1", "out");
    a2.out = big;
    CHECK_REFUSED_NAMING_BOTH(plan, attnres_run_phase2(plan, T, &a2, NULL), "partial", "out");
    attnres_plan_destroy(plan);
}

/* An unknown built-in level (ATTNRES_CPU_BUILTIN_ISA) makes the CPU
 * device's open fail with a message naming it and the levels there are. */
static void test_unknown_level_fails_the_open_with_its_name(void)
{
    setenv("ATTNRES_CPU_BUILTIN_ISA", "avx1024", 1);
    attnres_device *dev = NULL;
    char msg[512] = "";
    CHECK(attnres_device_open("cpu", &dev, msg, sizeof msg) == ATTNRES_EINVAL);
    CHECK(dev == NULL);
    CHECK(strstr(msg, "avx1024") != NULL && strstr(msg, "scalar") != NULL);
    attnres_device_close(dev);
    unsetenv("ATTNRES_CPU_BUILTIN_ISA");
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (!check_listing && test_cpu_open(&cpu) != 0)
        return 1;
    RUN_CASE(test_plan_refuses_more_sources_than_cpu_kernels_take);
    RUN_CASE(test_limits_are_one_table_for_plans_and_miss_lines);
    RUN_CASE(test_many_heads_refused_at_plan_not_crashing);
    RUN_CASE(test_stride_times_tokens_overflow_is_refused);
    RUN_CASE(test_null_arguments_are_refused_or_ignored);
    RUN_CASE(test_overlapping_outputs_are_refused);
    RUN_CASE(test_unknown_level_fails_the_open_with_its_name);
    attnres_device_close(cpu);
    CHECK_EXIT();
}
