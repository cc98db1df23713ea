/*
 * ops_cpu_backward.c - the CPU mix backward's cases of backend_ops
 * (attnres_run_mix_backward, templates/cpu/mix_backward.lua): every
 * gradient against attnres_reference_mix_backward at DESIGN §1's
 * tolerances, source gradients in fp32 (ATTNRES_GRAD_DSOURCES_F32) at
 * fp32's whatever the storage type (they are never rounded to it), dalpha
 * relative to the size of its terms (test_mix_backward_case.h), and with
 * one source a query gradient of exactly zero. Each case's name says its
 * problem ("_epi" with the output-norm epilogue, "_dnonly" when the loss
 * reads normed alone and dout is NULL), then "_padP" for views P elements
 * wider than a row, "_acc" for accumulated gradients and "_f32grads" for
 * fp32 source gradients. The epilogue's cases also check d(out_gain).
 *
 * "builtin-host": the built-in kernel the host's own level gives, through
 * plans without a database: every dtype, both forms, H = 1 and 4, N = 1
 * and 3, strided views, written and accumulated gradients, each in the
 * storage type and in fp32; and "_runs": the same plan gives bit-identical
 * gradients on two runs, the second over a workspace of stale values.
 *
 * "builtin-LEVEL": at every ISA level (ATTNRES_CPU_BUILTIN_ISA), the
 * plan's explanation names the kernel the fallback chain must take
 * (ops_cpu.c), and its gradients match the reference in every dtype and
 * form, written and accumulated, at head widths of 256 and 64 (the level's
 * own kernel), 48 (the next level down) and 20 (the scalar kernel); "_runs"
 * cases are bit-identical on two runs and with the launch in one part and
 * in two (a launch of 5.9 MB: the built-ins split per 2 MiB).
 *
 * The template's variants at two threads, compiled as the tuner compiles
 * them: the replace form written and the additive form accumulated, each in
 * the storage type and in fp32; --sample a covering sample (every value of
 * every parameter once), --all every variant. "_threads": one variant at
 * one and at two threads gives bit-identical gradients.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argen.h"
#include "attnres.h"
#include "backend_ops.h"
#include "device.h"
#include "test_covering.h"
#include "test_mix_backward_case.h"
#include "test_variant.h"

/* The device the cases run on (the scratch one, or one opened at a level). */
static attnres_device *dev;

static const attnres_dtype dtypes[] = {ATTNRES_DTYPE_F32, ATTNRES_DTYPE_BF16, ATTNRES_DTYPE_F16};

/* Every combination of the gradient flags: written or accumulated, in the
 * storage type or in fp32. */
#define ALL_FLAGS (ATTNRES_GRAD_ACCUMULATE | ATTNRES_GRAD_DSOURCES_F32)

/* Names case c (its backend, op, variant, dtype, form and heads set) by
 * its problem, epilogue bits (BW_EPILOGUE, BW_DNORMED_ONLY), padding,
 * flags and extra. */
static void bw_name(bo_case *c, int64_t d, int n, int64_t T, int epi, int64_t pad, unsigned flags,
                    const char *extra)
{
    char padding[24] = "", tail[64];
    if (pad)
        snprintf(padding, sizeof padding, "_pad%lld", (long long)pad);
    snprintf(tail, sizeof tail, "%s%s%s%s%s", epi & BW_DNORMED_ONLY ? "_dnonly" : "", padding,
             flags & ATTNRES_GRAD_ACCUMULATE ? "_acc" : "", flags & ATTNRES_GRAD_DSOURCES_F32 ? "_f32grads" : "",
             extra);
    bo_name(c, d, n, 0, T, 0, epi != 0, tail);
}

/* Makes case bc, adding to v when it could not be made; 0 on success. */
static int bw_make(bo_verdict *v, bw_case *bc, attnres_dtype dt, int64_t d, int n, int heads, int form,
                   int64_t T, int64_t pad, unsigned flags, uint64_t seed)
{
    const int rc = bw_case_make(bc, dt, d, n, heads, form, T, pad, flags, seed);
    bo_expect(v, rc == 0, "the case could not be made (out of memory, or the reference refused it: above)");
    return rc;
}

/* Adds to v every gradient of bc that misses the reference. dquery and
 * dalpha are fp32 sums of fp32 products of inputs that the reference reads
 * exactly as stored, so they are held to fp32's tolerance in every dtype:
 * at bf16's 1e-2 a 1% error in dalpha would pass. */
static void bw_check(bo_verdict *v, const bw_case *bc, const char *what)
{
    const double tol = case_tolerance(bc->p.dtype), gtol = case_tolerance(bc->gdt),
                 ftol = case_tolerance(ATTNRES_DTYPE_F32);
    const bw_errors e = bw_case_errors(bc);
    bo_expect(v, e.dsrc <= gtol, "%sdsources[%d] relative error %.3g over %.0e", what, e.which, e.dsrc, gtol);
    bo_expect(v, e.dquery <= ftol, "%sdquery relative error %.3g over %.0e", what, e.dquery, ftol);
    if (bc->p.epilogue)
        bo_expect(v, e.dout_gain <= ftol, "%sdout_gain relative error %.3g over %.0e", what, e.dout_gain, ftol);
    if (bc->p.form == ATTNRES_FORM_ADDITIVE) {
        bo_expect(v, e.dpartial <= tol, "%sdpartial relative error %.3g over %.0e", what, e.dpartial, tol);
        bo_expect(v, e.dalpha <= ftol, "%sdalpha %.9g, reference %.9g: %.3g of its terms' size, over %.0e", what,
                  (double)bc->dalpha, bc->r_dalpha, e.dalpha, ftol);
    }
    if (bc->p.n == 1) { /* dz is exactly zero, so is du */
        int zero = 1;
        for (int64_t k = 0; k < bc->p.d; k++)
            zero &= bc->dquery[k] == 0.0f;
        bo_expect(v, zero, "%sdquery is not exactly zero with one source", what);
    }
}


/* Launches bc through kernel k on the device directly (as the tuner does),
 * for variants and thread counts a plan does not choose. */
static int bw_launch(const ar_kernel *k, bw_case *bc)
{
    const ar_op_args args = ar_op_mix_backward(&bc->args);
    return dev->ops->launch(dev, k, &bc->p, bc->T, &args, NULL);
}

static attnres_plan *plan_host(const attnres_problem *p, bo_verdict *v)
{
    attnres_plan *plan = NULL;
    char msg[512] = "";
    const int rc = attnres_plan_create(dev, NULL, p, 0, &plan, msg, sizeof msg);
    bo_expect(v, rc == ATTNRES_OK, "no plan: %s", msg);
    return rc == ATTNRES_OK ? plan : NULL;
}

/* Case c (its dtype, form and heads set) on a problem of d, n sources and
 * T tokens, run through the plan planner makes and checked; reported. */
static void plan_case(const bo_case *c, attnres_plan *(*planner)(const attnres_problem *, bo_verdict *), int64_t d,
                      int n, int64_t T, int epi, int64_t pad, unsigned flags, uint64_t seed)
{
    bo_verdict v = {0};
    bw_case bc;
    if (bw_make(&v, &bc, c->dtype, d, n, c->heads, c->additive | epi, T, pad, flags, seed) == 0) {
        attnres_plan *plan = planner(&bc.p, &v);
        if (plan) {
            const int rc = attnres_run_mix_backward(plan, bc.T, &bc.args, NULL);
            bo_expect(&v, rc == ATTNRES_OK, "run: %s", attnres_plan_errmsg(plan));
            if (rc == ATTNRES_OK)
                bw_check(&v, &bc, "");
        }
        attnres_plan_destroy(plan);
    }
    bw_case_free(&bc);
    bo_report(c, &v);
}

/* ------------------------------------------------------------------------
 * The host's built-in kernel
 * ---------------------------------------------------------------------- */

/* The epilogue's variations: none, with dout, and with normed the only
 * output the loss reads. */
static const int epis[] = {0, BW_EPILOGUE, BW_EPILOGUE | BW_DNORMED_ONLY};

static void host_cases(void)
{
    for (int di = 0; di < 3; di++)
        for (int additive = 0; additive <= 1; additive++)
            for (int hi = 0; hi < 2; hi++)
                for (int ni = 0; ni < 2; ni++)
                    for (int ei = 0; ei < 3; ei++)
                        for (unsigned flags = 0; flags <= ALL_FLAGS; flags++) {
                            const int heads = hi ? 4 : 1, n = ni ? 3 : 1;
                            const int64_t pad = (di + ni) % 2 ? 8 : 0;
                            /* The epilogue at H = 4 only, where heads and the norm's whole row differ. */
                            if (ei && !hi)
                                continue;
                            bo_case c = {.backend = "cpu", .op = "mix_backward", .variant = "builtin-host",
                                         .dtype = dtypes[di], .additive = additive, .heads = heads};
                            bw_name(&c, 64, n, 37, epis[ei], pad, flags, "");
                            if (!bo_case_wanted(&c))
                                continue;
                            const uint64_t seed = (uint64_t)(di * 97 + additive * 13 + hi * 5 + ni + ei * 29 +
                                                             17 * (int)(flags & ATTNRES_GRAD_ACCUMULATE));
                            plan_case(&c, plan_host, 64, n, 37, epis[ei], pad, flags, seed);
                        }
}

/* The gradients of one run, to compare bit for bit. */
typedef struct bw_result {
    void *dsrc, *dpartial;
    float dquery[4096], dout_gain[4096], dalpha;
} bw_result;

/* The bytes of bc's source gradients and of its partial's. */
static size_t dsrc_bytes(const bw_case *bc)
{
    return (size_t)bc->p.n * (size_t)bc->T * (size_t)bc->stride * attnres_dtype_size(bc->gdt);
}

static size_t dpartial_bytes(const bw_case *bc)
{
    return (size_t)bc->T * (size_t)bc->stride * attnres_dtype_size(bc->p.dtype);
}

/* Runs bc through k (NULL: through plan) from the gradients it was made
 * with (prior), over a workspace of stale values, and compares its
 * gradients with first's bit for bit, or keeps them there and checks them
 * against the reference when first->dsrc is NULL. */
static void run_and_compare(bo_verdict *v, bw_case *bc, attnres_plan *plan, const ar_kernel *k,
                            const bw_result *prior, bw_result *first, const char *what)
{
    memcpy(bc->dsrc, prior->dsrc, dsrc_bytes(bc));
    memcpy(bc->dpartial, prior->dpartial, dpartial_bytes(bc));
    memset(bc->workspace, 0x5a, bc->workspace_size); /* old partial sums must not matter */
    const int rc = k ? bw_launch(k, bc) : attnres_run_mix_backward(plan, bc->T, &bc->args, NULL);
    bo_expect(v, rc == ATTNRES_OK, "%s: the run failed (%d)", what, rc);
    if (!first->dsrc) {
        first->dsrc = malloc(dsrc_bytes(bc));
        first->dpartial = malloc(dpartial_bytes(bc));
        if (!first->dsrc || !first->dpartial) {
            bo_expect(v, 0, "out of memory");
            return;
        }
        memcpy(first->dsrc, bc->dsrc, dsrc_bytes(bc));
        memcpy(first->dpartial, bc->dpartial, dpartial_bytes(bc));
        memcpy(first->dquery, bc->dquery, sizeof(float) * (size_t)bc->p.d);
        memcpy(first->dout_gain, bc->dout_gain, sizeof(float) * (size_t)bc->p.d);
        first->dalpha = bc->dalpha;
        bw_check(v, bc, "");
        return;
    }
    const int same = memcmp(first->dsrc, bc->dsrc, dsrc_bytes(bc)) == 0 &&
                     memcmp(first->dpartial, bc->dpartial, dpartial_bytes(bc)) == 0 &&
                     memcmp(first->dquery, bc->dquery, sizeof(float) * (size_t)bc->p.d) == 0 &&
                     memcmp(first->dout_gain, bc->dout_gain, sizeof(float) * (size_t)bc->p.d) == 0 &&
                     memcmp(&first->dalpha, &bc->dalpha, sizeof bc->dalpha) == 0;
    bo_expect(v, same, "%s: the gradients differ from the first run's", what);
}

/* Keeps bc's gradients as made (the prior values accumulation adds to). */
static int keep_prior(const bw_case *bc, bw_result *prior)
{
    prior->dsrc = malloc(dsrc_bytes(bc));
    prior->dpartial = malloc(dpartial_bytes(bc));
    if (!prior->dsrc || !prior->dpartial)
        return -1;
    memcpy(prior->dsrc, bc->dsrc, dsrc_bytes(bc));
    memcpy(prior->dpartial, bc->dpartial, dpartial_bytes(bc));
    return 0;
}

static void result_free(bw_result *r)
{
    free(r->dsrc);
    free(r->dpartial);
}

/* The bf16 case "_runs" of variant on d, three sources, two heads and 300
 * tokens, additive (with the epilogue where epi says): the plan planner
 * makes gives bit-identical gradients on two runs, the second over a
 * workspace of stale values; with parts, also the built-in kernel launched
 * in one part and in two. */
static void runs_case(const char *variant, int64_t d, int epi, unsigned flags, uint64_t seed,
                      attnres_plan *(*planner)(const attnres_problem *, bo_verdict *), int parts)
{
    bo_case c = {.backend = "cpu", .op = "mix_backward", .variant = variant, .dtype = ATTNRES_DTYPE_BF16,
                 .additive = 1, .heads = 2};
    bw_name(&c, d, 3, 300, epi, 0, flags, "_runs");
    if (!bo_case_wanted(&c))
        return;
    bo_verdict v = {0};
    bw_case bc = {0};
    bw_result prior = {0}, first = {0};
    if (bw_make(&v, &bc, ATTNRES_DTYPE_BF16, d, 3, 2, BW_ADDITIVE | epi, 300, 0, flags, seed) == 0) {
        attnres_plan *plan = planner(&bc.p, &v);
        if (plan && keep_prior(&bc, &prior) == 0) {
            run_and_compare(&v, &bc, plan, NULL, &prior, &first, "first run");
            run_and_compare(&v, &bc, plan, NULL, &prior, &first, "second run");
        }
        if (plan && parts) {
            ar_kernel k;
            const int rc = dev->ops->load_generic(dev, &bc.p, &k);
            bo_expect(&v, rc == ATTNRES_OK, "the built-in kernel does not load (%d)", rc);
            for (int threads = 1; rc == ATTNRES_OK && prior.dsrc && threads <= 2; threads++) {
                k.threads = threads;
                run_and_compare(&v, &bc, NULL, &k, &prior, &first, threads == 1 ? "in one part" : "in two parts");
            }
            if (rc == ATTNRES_OK)
                dev->ops->unload(dev, &k);
        }
        attnres_plan_destroy(plan);
    }
    result_free(&prior);
    result_free(&first);
    bw_case_free(&bc);
    bo_report(&c, &v);
}

/* Determinism's variations: gradients written in bf16, in fp32, and in
 * fp32 with the epilogue. */
static const struct { int epi; unsigned flags; } run_kinds[] = {
    {0, 0}, {0, ATTNRES_GRAD_DSOURCES_F32}, {BW_EPILOGUE, ATTNRES_GRAD_DSOURCES_F32}};

/* The host's plan twice, in each of run_kinds. */
static void host_runs(void)
{
    for (size_t r = 0; r < sizeof run_kinds / sizeof run_kinds[0]; r++)
        runs_case("builtin-host", 128, run_kinds[r].epi, run_kinds[r].flags, 5, plan_host, 0);
}

/* ------------------------------------------------------------------------
 * The template's variants
 * ---------------------------------------------------------------------- */

static attnres_dtype dtype_of(const char *id)
{
    return strstr(id, "_bf16_") ? ATTNRES_DTYPE_BF16 : strstr(id, "_f16_") ? ATTNRES_DTYPE_F16 : ATTNRES_DTYPE_F32;
}

/* One variant at one and at two threads, ids[0] and ids[1]. */
static void variant_threads_of(argen *g, const char *const ids[2])
{
    for (size_t r = 0; r < sizeof run_kinds / sizeof run_kinds[0]; r++) {
        const unsigned flags = run_kinds[r].flags;
        bo_case c = {.backend = "cpu", .op = "mix_backward", .variant = ids[1], .dtype = ATTNRES_DTYPE_BF16,
                     .additive = 1, .heads = 2};
        bw_name(&c, 128, 3, 300, run_kinds[r].epi, 0, flags, "_threads");
        if (!bo_case_wanted(&c))
            continue;
        bo_verdict v = {0};
        ar_kernel k[2];
        int loaded = 0;
        for (; loaded < 2 && compile_variant_on(dev, g, ids[loaded], &k[loaded]) == 0; loaded++)
            ;
        bo_expect(&v, loaded == 2, "%s does not compile or load (above)", loaded < 2 ? ids[loaded] : "");
        bw_case bc = {0};
        bw_result prior = {0}, first = {0};
        if (loaded == 2 &&
            bw_make(&v, &bc, ATTNRES_DTYPE_BF16, 128, 3, 2, BW_ADDITIVE | run_kinds[r].epi, 300, 0, flags, 5) == 0) {
            bo_expect(&v, k[0].threads == 1 && k[1].threads == 2, "the kernels load with %d and %d threads",
                      k[0].threads, k[1].threads);
            if (keep_prior(&bc, &prior) == 0) {
                run_and_compare(&v, &bc, NULL, &k[0], &prior, &first, "at 1 thread");
                run_and_compare(&v, &bc, NULL, &k[1], &prior, &first, "at 2 threads");
            }
        }
        bw_case_free(&bc);
        while (loaded > 0)
            dev->ops->unload(dev, &k[--loaded]);
        result_free(&prior);
        result_free(&first);
        bo_report(&c, &v);
    }
}

/* A variant at one and at two threads (the same source but for the
 * count), in each layout: bit-identical gradients, written in bf16 and
 * fp32. */
static void variant_threads(argen *g)
{
    static const char *const layouts[][2] = {
        {"mix_backward_c_bf16_v8_u2_t1", "mix_backward_c_bf16_v8_u2_t2"},
        {"mix_backward_c_bf16_v8_u1_pr_t1", "mix_backward_c_bf16_v8_u1_pr_t2"},
    };
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++)
        variant_threads_of(g, layouts[l]);
}

/* Which variants run: those at two threads that apply to the cases' shape. */
static int *variants_usable(argen *g, const argen_variant *vs, size_t nv, const argen_device *ad)
{
    int *usable = calloc(nv ? nv : 1, sizeof *usable);
    for (size_t i = 0; usable && i < nv; i++) {
        const argen_problem ap = {.op = "mix_backward", .dtype = attnres_dtype_name(dtype_of(vs[i].id)),
                                  .form = "replace", .d = 128, .t = 64, .n = 2, .heads = 2, .epilogue = 0};
        char why[256];
        usable[i] = strstr(vs[i].id, "_t2") != NULL && argen_applies(g, vs[i].id, &ap, ad, why, sizeof why) > 0;
    }
    return usable;
}

/* The epilogue's bits of variant_cases' case form (0 to 5). */
static int form_epi(int form)
{
    return form == 4 ? BW_EPILOGUE : form == 5 ? BW_EPILOGUE | BW_DNORMED_ONLY : 0;
}

/* Runs the six cases of variant i (id), compiled once if any is
 * selected: the replace form written and the additive form accumulated,
 * each in the storage type and in fp32, then the same two with the
 * epilogue, the additive one with dout NULL. Whether it compiled. */
static int variant_cases(argen *g, size_t i, const char *id)
{
    const attnres_dtype dt = dtype_of(id);
    bo_case cs[6];
    int wanted[6], any = 0;
    for (int form = 0; form < 6; form++) {
        const int additive = form & 1;
        const unsigned flags = (additive ? ATTNRES_GRAD_ACCUMULATE : 0) | (form & 2 ? ATTNRES_GRAD_DSOURCES_F32 : 0);
        cs[form] = (bo_case){.backend = "cpu", .op = "mix_backward", .variant = id, .dtype = dt,
                             .additive = additive, .heads = 2};
        bw_name(&cs[form], 128, 2 + additive, 70, form_epi(form), 16 * additive, flags, "");
        wanted[form] = bo_case_wanted(&cs[form]);
        any |= wanted[form];
    }
    if (!any)
        return 0;
    ar_kernel k;
    const int loaded = compile_variant_on(dev, g, id, &k) == 0;
    for (int form = 0; form < 6; form++) {
        if (!wanted[form])
            continue;
        const int additive = form & 1;
        const unsigned flags = (additive ? ATTNRES_GRAD_ACCUMULATE : 0) | (form & 2 ? ATTNRES_GRAD_DSOURCES_F32 : 0);
        bo_verdict v = {0};
        bo_expect(&v, loaded, "the variant does not compile or load (above)");
        bw_case bc = {0};
        if (loaded && bw_make(&v, &bc, dt, 128, 2 + additive, 2, additive | form_epi(form), 70, 16 * additive, flags,
                              1000 + i + (size_t)form) == 0) {
            const int rc = bw_launch(&k, &bc);
            bo_expect(&v, rc == ATTNRES_OK, "the launch failed (%d)", rc);
            if (rc == ATTNRES_OK)
                bw_check(&v, &bc, "");
        }
        bw_case_free(&bc);
        bo_report(&cs[form], &v);
    }
    if (loaded)
        dev->ops->unload(dev, &k);
    return loaded;
}

static void template_variants(void)
{
    char msg[1024];
    argen *g = NULL;
    argen_variant *vs = NULL;
    size_t nv = 0;
    if (argen_open(TEMPLATE_DIR, "cpu/mix_backward", &g, msg, sizeof msg) != 0 ||
        argen_enumerate(g, &vs, &nv) != 0) {
        bo_fail("cpu/mix_backward: %s", g ? argen_errmsg(g) : msg);
        argen_close(g);
        return;
    }
    variant_threads(g);
    const argen_device ad = {.backend = "cpu", .arch = dev->arch, .units = 2};
    int *usable = variants_usable(g, vs, nv, &ad), *pick = NULL;
    const char **json = calloc(nv ? nv : 1, sizeof *json);
    if (bo_sample) {
        pick = calloc(nv ? nv : 1, sizeof *pick);
        for (size_t i = 0; json && i < nv; i++)
            json[i] = vs[i].params_json;
        if (!usable || !json || !pick || covering_sample(json, usable, nv, pick) == 0) {
            free(pick);
            pick = NULL;
        }
    }
    if (!usable || (bo_sample && !pick))
        bo_fail("cpu/mix_backward: out of memory, or no variant to sample");
    int tried = 0, every_id = 1;
    for (size_t i = 0; usable && (pick || !bo_sample) && i < nv; i++) {
        if (!usable[i] || (pick && !pick[i]))
            continue;
        if (!bo_variant_wanted("cpu", "mix_backward", dtype_of(vs[i].id), vs[i].id)) {
            every_id = 0;
            continue;
        }
        tried += variant_cases(g, i, vs[i].id);
    }
    if (!bo_listing && every_id && bo_case_filters_absent() && tried == 0)
        bo_fail("cpu/mix_backward: no variant compiled and checked");
    if (!bo_listing && tried)
        printf("cpu/mix_backward: %d variant(s) compiled%s\n", tried, bo_sample ? " (a covering sample)" : "");
    free(json);
    free(usable);
    free(pick);
    argen_variants_free(vs, nv);
    argen_close(g);
}

void bo_cpu_mix_backward_variants(attnres_device *on)
{
    dev = on;
    host_cases();
    host_runs();
    if (bo_op_wanted("cpu", "mix_backward"))
        template_variants();
    dev = NULL;
}

/* ------------------------------------------------------------------------
 * The built-in kernels at one ISA level
 * ---------------------------------------------------------------------- */

/* Every dtype, both forms, written and accumulated gradients, N = 1 and 3,
 * over 70 tokens (two whole groups and a part). */
static void level_cases(const char *variant)
{
    static const struct { int64_t d; int h; } shapes[] = {{256, 1}, {256, 4}, {96, 2}, {20, 1}};
    for (int di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int additive = 0; additive <= 1; additive++)
                for (int n = 1; n <= 3; n += 2)
                    for (int epi = 0; epi <= BW_EPILOGUE; epi += BW_EPILOGUE)
                        for (unsigned flags = 0; flags <= ALL_FLAGS; flags++) {
                            const int64_t pad = (si + (size_t)n) % 2 ? 16 : 0;
                            /* The epilogue written in the storage type and accumulated in fp32. */
                            if (epi && flags != 0 && flags != ALL_FLAGS)
                                continue;
                            bo_case c = {.backend = "cpu", .op = "mix_backward", .variant = variant,
                                         .dtype = dtypes[di], .additive = additive, .heads = shapes[si].h};
                            bw_name(&c, shapes[si].d, n, 70, epi, pad, flags, "");
                            if (!bo_case_wanted(&c))
                                continue;
                            /* fp32 gradients reuse the data of the storage-type case. */
                            const size_t seed =
                                (((((size_t)di * 4 + si) * 2 + (size_t)additive) * 2 + (size_t)(n > 1)) * 2 +
                                 (flags & ATTNRES_GRAD_ACCUMULATE)) * 2 + (size_t)(epi != 0);
                            plan_case(&c, bo_cpu_plan_builtin, shapes[si].d, n, 70, epi, pad, flags, 4000 + seed);
                        }
}

/* The plan's kernel on two runs, and launched in one part and in two (a
 * launch of 5.9 MB: the built-ins split per 2 MiB), written and
 * accumulated, in bf16 and in fp32. */
static void level_runs(const char *variant)
{
    for (unsigned flags = 0; flags <= ALL_FLAGS; flags++)
        runs_case(variant, 1024, flags == ALL_FLAGS ? BW_EPILOGUE : 0, flags, 77 + flags, bo_cpu_plan_builtin, 1);
}

void bo_cpu_mix_backward_builtins(attnres_device *on, const char *variant)
{
    dev = on;
    level_cases(variant);
    level_runs(variant);
    dev = NULL;
}
