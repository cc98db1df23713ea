/*
 * test_mix_backward_api.c - what attnres_run_mix_backward and its plans
 * refuse or report on the CPU, apart from any kernel's gradients (those
 * are backend_ops' cases: --backend cpu --op mix_backward):
 *   - the epilogue's arguments: a missing dnormed, a bad out_eps and a gain
 *     gradient that overlaps an input are refused, a caller's struct from
 *     before the epilogue's fields still runs a plan without it, and T = 0
 *     zeroes the gain's gradient too;
 *   - the workspace size a plan reports is the one the run needs, and a
 *     negative token count is refused;
 *   - a short workspace, a gradient that overlaps a source, two sources'
 *     gradients in one buffer unless accumulating, and unknown flags are
 *     refused, each naming the problem;
 *   - fp32 source gradients of a bf16 plan are checked as fp32 views, for
 *     alignment and overlap, though bf16 views would pass;
 *   - T = 0 writes a zero query gradient and reads nothing else;
 *   - a mix backward plan refuses to run the mix.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "check.h"
#include "test_device.h"
#include "test_mix_backward_case.h"

static attnres_device *cpu;

static attnres_plan *plan_generic(const attnres_problem *p)
{
    attnres_plan *plan = NULL;
    char msg[512];
    if (attnres_plan_create(cpu, NULL, p, 0, &plan, msg, sizeof msg) != ATTNRES_OK)
        fprintf(stderr, "plan: %s\n", msg);
    return plan;
}

static void test_refusals(void)
{
    /* Plans without a database take built-in kernels: nothing is compiled,
     * so the device needs no scratch cache. */
    REQUIRE(test_cpu_open(&cpu) == 0);
    bw_case c;
    REQUIRE(bw_case_make(&c, ATTNRES_DTYPE_F32, 64, 2, 1, 0, 40, 0, 0, 9) == 0);
    attnres_plan *plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    /* A caller built before the epilogue's fields: its struct ends at out. */
    attnres_mix_backward_args old = c.args;
    old.struct_size = offsetof(attnres_mix_backward_args, out);
    CHECK(attnres_run_mix_backward(plan, c.T, &old, NULL) == ATTNRES_OK);
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
    bw_case_free(&c);

    /* The epilogue: its workspace holds the gain's per-group sums too, and
     * its arguments are checked. */
    REQUIRE(bw_case_make(&c, ATTNRES_DTYPE_F32, 64, 2, 1, BW_EPILOGUE, 40, 0, 0, 11) == 0);
    plan = plan_generic(&c.p);
    REQUIRE(plan != NULL);
    size_t plain = 0;
    CHECK(attnres_mix_backward_workspace_size(plan, c.T, &need) == ATTNRES_OK && need == c.workspace_size);
    {
        attnres_problem q = c.p;
        q.epilogue = 0;
        attnres_plan *without = plan_generic(&q);
        CHECK(without && attnres_mix_backward_workspace_size(without, c.T, &plain) == ATTNRES_OK && plain < need);
        attnres_plan_destroy(without);
    }
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_OK);
    c.args.dnormed = NULL;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "dnormed") != NULL);
    c.args.dnormed = c.dnormed;
    c.args.out_eps = 0.0f;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "out_eps") != NULL);
    c.args.out_eps = 1e-6f;
    c.args.dout_gain = (float *)c.out;
    CHECK(attnres_run_mix_backward(plan, c.T, &c.args, NULL) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_plan_errmsg(plan), "overlap") != NULL);
    c.args.dout_gain = c.dout_gain;
    /* The old struct has no out: the epilogue cannot run from it. */
    old = c.args;
    old.struct_size = offsetof(attnres_mix_backward_args, out);
    CHECK(attnres_run_mix_backward(plan, c.T, &old, NULL) == ATTNRES_EINVAL);
    /* No tokens: the gain's gradient is a sum over none, zero too. */
    for (int64_t k = 0; k < c.p.d; k++)
        c.dout_gain[k] = 1.0f;
    CHECK(attnres_run_mix_backward(plan, 0, &c.args, NULL) == ATTNRES_OK);
    for (int64_t k = 0; k < c.p.d; k++)
        CHECK(c.dout_gain[k] == 0.0f && c.dquery[k] == 0.0f);
    attnres_plan_destroy(plan);
    bw_case_free(&c);

    /* fp32 source gradients of a bf16 plan: checked as fp32 views, for
     * alignment and for overlap, though bf16 views would pass. */
    REQUIRE(bw_case_make(&c, ATTNRES_DTYPE_BF16, 64, 2, 1, 0, 40, 0, ATTNRES_GRAD_DSOURCES_F32, 10) == 0);
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
    bw_case_free(&c);
    attnres_device_close(cpu);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN_CASE(test_refusals);
    CHECK_EXIT();
}
