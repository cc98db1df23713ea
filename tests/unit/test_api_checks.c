/*
 * test_api_checks.c - what the public API refuses before anything runs:
 * problems beyond the limits of attnres.h or of the CPU's kernels, refused
 * when the plan is made with EINVAL and a message naming the limit; the
 * largest shapes accepted still run.
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

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    char msg[512];
    if (!check_listing && attnres_device_open("cpu", &cpu, msg, sizeof msg) != ATTNRES_OK) {
        fprintf(stderr, "cannot open the CPU device: %s\n", msg);
        return 1;
    }
    RUN_CASE(test_plan_refuses_more_sources_than_cpu_kernels_take);
    RUN_CASE(test_limits_are_one_table_for_plans_and_miss_lines);
    RUN_CASE(test_many_heads_refused_at_plan_not_crashing);
    attnres_device_close(cpu);
    CHECK_EXIT();
}
