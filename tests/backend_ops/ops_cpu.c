/*
 * ops_cpu.c - the CPU backend's cases of backend_ops: the template
 * variants compiled and loaded as the tuner does, and the built-in kernels
 * at every ISA level, each against the fp64 reference at DESIGN §1's
 * tolerances (fp32 storage 1e-5, bf16 and f16 1e-2; phase 1's log-sum-exp
 * 1e-5 in every dtype), outputs poisoned (NaN) before each run.
 *
 * cpu/mix_fused, at two threads (variants that differ only in their thread
 * count share every other line of source): shapes that reach every path of
 * the template: an odd and an even number of sources (the two alternating
 * mix sums), more sources than one sweep's group (two and three sweeps),
 * two heads, the additive form and the norm epilogue, one token (no next
 * token to score or prefetch) and token counts that the launch splits over
 * both threads, so a range ends inside the tensor; a head slice long
 * enough for bursts of 4 steps, in bursts and the steps they leave over;
 * the non-temporal stores both on aligned output rows and on rows that are
 * not, where they must fall back to plain stores; and scores tens apart,
 * whose exponentials reach the softmax's clamp. A bf16 output hides score
 * errors below its rounding, so the variants whose statistics use the bf16
 * dot products are also run against their FMA twin on the same data: both
 * sum the same fp32 products, so at most 1% of the outputs may round
 * differently (leaving out the query's low half, an error of 2^-9 in the
 * scores, changes about a quarter of them). A source specialized for
 * n = 9, as the tuner emits for K3's shape, runs every shape too (right on
 * n = 9 by its own cases, elsewhere by its general ones): for the sample's
 * variants and a quarter of the others. --sample: the covering sample of
 * the variants; --all: every variant, whose count is checked.
 *
 * cpu/phase1 and cpu/phase2: a fixed spread in both modes (every f32
 * schedule, width and unroll at two threads, a few widths of bf16 and f16
 * at one: the compiler is slow), with padded views; phase 1 also at head
 * slices of 112 elements (the tiled mix's steps of 4 vectors leave a tail)
 * and 7 sites (a group at the edge), phase 2 also without the fused add
 * (b's statistics in a sweep of their own).
 *
 * The built-in kernels ("builtin-LEVEL": avx512bf16, avx512, avx2, sse2 on
 * x86-64; neon on AArch64; scalar everywhere), the device opened with
 * ATTNRES_CPU_BUILTIN_ISA naming the level, through plans without a
 * database: the plan's explanation must name the built-in kernel of that
 * level where the host has it and the head width fits every level's step
 * (a multiple of 32), or the scalar one where it fits none (not a multiple
 * of 8), and say that it fell back; every op, dtype, form, epilogue, fused
 * add and a few head counts at T = 1 and 7, head widths 256 and 64 (every
 * level's step divides them), 48 (not a multiple of AVX-512's mix step),
 * 20 (the scalar kernel only) and d = 2048 (source rows 4 or 8 KiB apart,
 * where the mix runs in bursts); the phases also with padded views, odd
 * widths and T = 37 and 130; and launches large enough to be split over
 * the workers. A level the host lacks still runs (plans take the next one
 * down); one this build lacks is skipped.
 *
 * The mix backward's cases, of its template and of its built-in kernels,
 * are in ops_cpu_backward.c, the phase backwards' in
 * ops_cpu_phase_backward.c; this part calls them on its devices.
 */
#define _GNU_SOURCE /* setenv */
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
#include "test_device.h"
#include "test_mix_case.h"
#include "test_phase_case.h"
#include "test_variant.h"

/* The device the cases run on: the scratch one for the variants, or the
 * one opened at a built-in level. */
static attnres_device *cpu;

static attnres_dtype dtype_of(const char *id)
{
    return strstr(id, "_bf16_") ? ATTNRES_DTYPE_BF16 : strstr(id, "_f16_") ? ATTNRES_DTYPE_F16 : ATTNRES_DTYPE_F32;
}

/* Launches through a compiled kernel (ctx) or a plan (ctx). */
static int kernel_mix(void *k, const attnres_problem *p, int64_t T, const attnres_mix_args *a)
{
    const ar_op_args args = ar_op_mix(a);
    return cpu->ops->launch(cpu, k, p, T, &args, NULL);
}

static int kernel_phase1(void *k, const attnres_problem *p, int64_t T, const attnres_phase1_args *a)
{
    const ar_op_args args = ar_op_phase1(a);
    return cpu->ops->launch(cpu, k, p, T, &args, NULL);
}

static int kernel_phase2(void *k, const attnres_problem *p, int64_t T, const attnres_phase2_args *a)
{
    const ar_op_args args = ar_op_phase2(a);
    return cpu->ops->launch(cpu, k, p, T, &args, NULL);
}

static int plan_mix(void *plan, const attnres_problem *p, int64_t T, const attnres_mix_args *a)
{
    (void)p;
    return attnres_run_mix(plan, T, a, NULL);
}

static int plan_phase1(void *plan, const attnres_problem *p, int64_t T, const attnres_phase1_args *a)
{
    (void)p;
    return attnres_run_phase1(plan, T, a, NULL);
}

static int plan_phase2(void *plan, const attnres_problem *p, int64_t T, const attnres_phase2_args *a)
{
    (void)p;
    return attnres_run_phase2(plan, T, a, NULL);
}

/* Runs a phase problem through kernel or plan (ctx) and adds its errors to
 * v: o1 or out, normed and the partial at the dtype's tolerance, phase 1's
 * log-sum-exp at 1e-5. */
static void phase_case(bo_verdict *v, const attnres_problem *p, int64_t T, uint64_t seed, int padded, int by_plan,
                       void *ctx)
{
    const phase_case_errors e =
        p->op == ATTNRES_OP_PHASE1
            ? phase1_case_run(p, T, seed, padded, by_plan ? plan_phase1 : kernel_phase1, ctx)
            : phase2_case_run(p, T, seed, padded, by_plan ? plan_phase2 : kernel_phase2, ctx);
    const double tol = case_tolerance(p->dtype);
    bo_expect(v, e.out <= tol && e.normed <= tol && e.partial <= tol && e.lse <= 1e-5,
              "rel err %g, normed %g, partial %g (tolerance %g), lse %g (tolerance 1e-5)%s%s", e.out, e.normed,
              e.partial, tol, e.lse, by_plan ? ": " : "", by_plan ? attnres_plan_errmsg(ctx) : "");
}

/* ------------------------------------------------------------------------
 * cpu/mix_fused
 * ---------------------------------------------------------------------- */

typedef struct mix_shape {
    int64_t d;
    int32_t n, heads;
    int additive, epilogue;
    int64_t T;
    double sharp;
    size_t out_shift; /* bytes the output rows start past a 64-byte line */
} mix_shape;

/* The sharpest softmax the comparison with the FMA twin runs at: at 40x the
 * two sums' rounding, scaled by the sharpness, flips 1-2% of the bf16
 * roundings (both still match the reference), so the extreme shape is for
 * the reference alone. */
#define TWIN_SHARPNESS_MAX 4.0

static const mix_shape mix_shapes[] = {
    {128, 9, 1, 0, 0, 7, 1.0, 0},  /* odd n: 2 sweeps of 5 + 4 (group 8), 3 of 3 (group 4) */
    {128, 4, 2, 1, 1, 5, 1.0, 0},  /* even n, two heads of 64, additive with the epilogue */
    {64, 1, 1, 0, 0, 1, 1.0, 0},   /* one source, one token */
    {256, 17, 1, 1, 0, 3, 1.0, 0}, /* three sweeps at group 8, five at group 4 */
    {256, 9, 1, 0, 1, 6, 4.0, 0},  /* a sharper softmax */
    {128, 9, 1, 0, 0, 3, 40.0, 0}, /* scores tens apart: exponentials down at the clamp (e^-86) */
    {96, 3, 1, 0, 1, 4, 1.0, 16},  /* output rows off the stores' alignment */
    {544, 9, 1, 1, 1, 5, 1.0, 16}, /* 17 or 34 steps: bursts of 4 and the steps they leave */
};
#define MIX_SHAPES (sizeof mix_shapes / sizeof mix_shapes[0])

/* Two threads; the non-temporal stores (the same lines of source at every
 * group, prefetch and place of the mix) at group 8 without prefetch, fused.
 * In bursts of 4, no prefetch, "both" (whose statements include those of
 * "token"), "sweep" (the mix apart only) and "all"; "all" (whose statements
 * include those of "both") at group 8 alone. */
static int mix_wanted(const char *id)
{
    const char *t = strstr(id, "_t2");
    if (!t || strcmp(t, "_t2") != 0)
        return 0;
    if (strstr(id, "_b4_") && !strstr(id, "_b4_pn_") && !strstr(id, "_b4_pb_") && !strstr(id, "_b4_ps_") &&
        !strstr(id, "_b4_pa_"))
        return 0;
    if (strstr(id, "_pa_") && !strstr(id, "_g8_"))
        return 0;
    return strstr(id, "_sc_") || ((strstr(id, "_g8_pn_") || strstr(id, "_g8_b4_pn_")) && strstr(id, "_ss_"));
}

/* What applies() is asked for variant id on shape sh. Prefetch "all" is
 * tuned only for launches that move 64 MiB and more, but must be right at
 * every T: it is asked about as for a bucket of a million tokens. */
static argen_problem mix_argen_problem(const char *id, const mix_shape *sh)
{
    const argen_problem ap = {.op = "mix", .dtype = attnres_dtype_name(dtype_of(id)),
                              .form = sh->additive ? "additive" : "replace", .d = sh->d,
                              .t = strstr(id, "_pa_") ? INT64_C(1) << 20 : sh->T, .n = sh->n, .heads = sh->heads,
                              .epilogue = sh->epilogue};
    return ap;
}

/* The covering sample (test_covering.h) of the variants this part runs
 * (mix_wanted) that apply to at least one shape; NULL when out of memory. */
static int *mix_sample(argen *g, const argen_variant *v, size_t nv, const argen_device *ad)
{
    const char **json = calloc(nv ? nv : 1, sizeof *json);
    int *usable = calloc(nv ? nv : 1, sizeof *usable), *pick = calloc(nv ? nv : 1, sizeof *pick);
    for (size_t i = 0; json && usable && pick && i < nv; i++) {
        json[i] = v[i].params_json;
        for (size_t si = 0; si < MIX_SHAPES && !usable[i] && mix_wanted(v[i].id); si++) {
            const argen_problem ap = mix_argen_problem(v[i].id, &mix_shapes[si]);
            char why[256];
            usable[i] = argen_applies(g, v[i].id, &ap, ad, why, sizeof why) > 0;
        }
    }
    if (!json || !usable || !pick || covering_sample(json, usable, nv, pick) == 0) {
        free(pick);
        pick = NULL;
    }
    free(json);
    free(usable);
    return pick;
}

/* How many of count outputs of kernel k and of its FMA twin differ on
 * shape sh's data from seed; -1 when out of memory. */
static int64_t twin_differences(ar_kernel *k, ar_kernel *twin, const attnres_problem *p, const mix_shape *sh,
                                uint64_t seed, int64_t count)
{
    double *a = malloc(sizeof(double) * (size_t)count), *b = malloc(sizeof(double) * (size_t)count);
    int64_t differ = -1;
    if (a && b) {
        mix_case_run(p, sh->T, seed, sh->sharp, sh->out_shift, kernel_mix, k, a);
        mix_case_run(p, sh->T, seed, sh->sharp, sh->out_shift, kernel_mix, twin, b);
        differ = 0;
        for (int64_t i = 0; i < count; i++)
            differ += a[i] != b[i];
    }
    free(a);
    free(b);
    return differ;
}

/* A variant's kernels, compiled at its first selected case: its general
 * source, the source specialized for n = 9 (spec) and the FMA twin of a
 * bf16-dot variant (the same id with "_dfma_"). */
typedef struct mix_kernels {
    int compiled, failed, has_spec, has_twin;
    ar_kernel k, spec, twin;
} mix_kernels;

static void mix_compile(argen *g, const char *id, int want_spec, mix_kernels *mk, bo_verdict *v)
{
    mk->compiled = 1;
    mk->failed = compile_variant_on(cpu, g, id, &mk->k) != 0;
    bo_expect(v, !mk->failed, "the variant does not compile or load (above)");
    if (mk->failed)
        return;
    if (want_spec) {
        mk->has_spec = compile_variant_for(cpu, g, id, "n=9", &mk->spec) == 0;
        bo_expect(v, mk->has_spec, "its source specialized for n=9 does not compile or load");
    }
    const char *at = strstr(id, "_dbf16_");
    if (at) {
        char twin_id[256];
        snprintf(twin_id, sizeof twin_id, "%.*s_dfma_%s", (int)(at - id), id, at + strlen("_dbf16_"));
        mk->has_twin = compile_variant_on(cpu, g, twin_id, &mk->twin) == 0;
        bo_expect(v, mk->has_twin, "its FMA twin %s does not compile or load", twin_id);
    }
}

/* Runs shape si of variant i (its kernels mk) and adds what it found to v. */
static void mix_run_shape(size_t i, size_t si, const attnres_problem *p, mix_kernels *mk,
                          bo_verdict *v)
{
    const mix_shape *sh = &mix_shapes[si];
    const uint64_t seed = 7000 + 31 * i + si;
    const double tol = case_tolerance(p->dtype);
    const mix_case_errors e = mix_case_run(p, sh->T, seed, sh->sharp, sh->out_shift, kernel_mix, &mk->k, NULL);
    bo_expect(v, e.out <= tol && e.normed <= tol, "rel err %g (normed %g), tolerance %g", e.out, e.normed, tol);
    if (mk->has_twin && sh->sharp <= TWIN_SHARPNESS_MAX) {
        const int64_t count = sh->T * p->d, differ = twin_differences(&mk->k, &mk->twin, p, sh, seed, count);
        bo_expect(v, differ >= 0 && differ * 100 <= count, "%lld of %lld outputs differ from its FMA twin's",
                  (long long)differ, (long long)count);
    }
    if (mk->has_spec) {
        const mix_case_errors es =
            mix_case_run(p, sh->T, seed, sh->sharp, sh->out_shift, kernel_mix, &mk->spec, NULL);
        bo_expect(v, es.out <= tol && es.normed <= tol, "specialized for n=9: rel err %g (normed %g)", es.out,
                  es.normed);
    }
}

static void mix_fused_variants(void)
{
    char msg[1024];
    argen *g = NULL;
    argen_variant *v = NULL;
    size_t nv = 0;
    if (argen_open(TEMPLATE_DIR, "cpu/mix_fused", &g, msg, sizeof msg) != 0 || argen_enumerate(g, &v, &nv) != 0) {
        bo_fail("cpu/mix_fused: %s", g ? argen_errmsg(g) : msg);
        argen_close(g);
        return;
    }
    const argen_device ad = {.backend = "cpu", .arch = cpu->arch, .units = 2};
    int *picked = bo_sample ? mix_sample(g, v, nv, &ad) : NULL;
    if (bo_sample && !picked)
        bo_fail("cpu/mix_fused: out of memory for the covering sample");
    int tried = 0, cases = 0, every_id = 1;
    for (size_t i = 0; i < nv && (picked || !bo_sample); i++) {
        const char *id = v[i].id;
        const attnres_dtype dt = dtype_of(id);
        if (!mix_wanted(id))
            continue;
        if (!bo_variant_wanted("cpu", "mix", dt, id)) {
            every_id = 0;
            continue;
        }
        if (picked && !picked[i])
            continue;
        mix_kernels mk;
        memset(&mk, 0, sizeof mk);
        for (size_t si = 0; si < MIX_SHAPES && !mk.failed; si++) {
            const mix_shape *sh = &mix_shapes[si];
            const argen_problem ap = mix_argen_problem(id, sh);
            char why[256];
            const int applies = argen_applies(g, id, &ap, &ad, why, sizeof why);
            if (applies < 0)
                bo_fail("cpu/mix_fused %s: applies(): %s", id, why);
            if (applies <= 0)
                continue;
            bo_case c = {.backend = "cpu", .op = "mix", .variant = id, .dtype = dt, .additive = sh->additive,
                         .heads = sh->heads};
            char extra[48] = "";
            if (sh->sharp != 1.0)
                snprintf(extra, sizeof extra, "_sharp%g", sh->sharp);
            if (sh->out_shift)
                snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "_shift%zu", sh->out_shift);
            bo_name(&c, sh->d, sh->n, 0, sh->T, 0, sh->epilogue, extra);
            if (!bo_case_wanted(&c))
                continue;
            bo_verdict verdict = {0};
            if (!mk.compiled) {
                mix_compile(g, id, bo_sample || i % 4 == 0, &mk, &verdict);
                tried += !mk.failed;
            }
            if (!mk.failed) {
                attnres_problem p;
                attnres_problem_init(&p, dt, sh->d, sh->n);
                p.heads = sh->heads;
                p.form = sh->additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
                p.epilogue = sh->epilogue;
                mix_run_shape(i, si, &p, &mk, &verdict);
                cases++;
            }
            bo_report(&c, &verdict);
        }
        if (mk.compiled && !mk.failed)
            cpu->ops->unload(cpu, &mk.k);
        if (mk.has_twin)
            cpu->ops->unload(cpu, &mk.twin);
        if (mk.has_spec)
            cpu->ops->unload(cpu, &mk.spec);
    }
    /* At two threads in bursts of 1: 12 f32, 12 f16 and 18 bf16 variants
     * with plain stores, 2 + 2 + 3 with non-temporal ones; in bursts of 4:
     * 8 + 8 + 12 and 2 + 2 + 3. The mix apart adds 14 with plain stores
     * per dtype at 8 lanes: 2 groups times 4 prefetches in bursts of 1 and
     * 3 (none, both, sweep) in bursts of 4; and at 16 lanes, with the
     * sweep prefetch only, 2 groups in bursts of 1 and 4 per dtype and as
     * many again with the bf16 dot products. Prefetch "all" at group 8 with
     * plain stores adds 2 + 2 + 3 in bursts of 1 and as many in bursts of 4.
     * Without AVX-512 on x86-64 only the 84 with 8 lanes apply
     * (lib/cpu_space.lua); elsewhere all but the 18 with the bf16 dot
     * products. */
    const int avx512 = strcmp(cpu->arch, "x86_64-avx512") == 0;
    const int x86 = strncmp(cpu->arch, "x86_64", 6) == 0;
    const int want = avx512 ? 156 : x86 ? 84 : 138;
    if (!bo_listing && !bo_sample && every_id && bo_case_filters_absent() && tried != want)
        bo_fail("cpu/mix_fused: %d variant(s) compiled, where %s has %d", tried, cpu->arch, want);
    if (!bo_listing && tried)
        printf("cpu/mix_fused: %d variant(s) compiled%s, %d case(s) checked\n", tried,
               bo_sample ? " (a covering sample)" : "", cases);
    free(picked);
    argen_variants_free(v, nv);
    argen_close(g);
}

/* ------------------------------------------------------------------------
 * cpu/phase1 and cpu/phase2
 * ---------------------------------------------------------------------- */

/* Which variants run: all f32 schedules, widths and unrolls with two
 * threads, and a few widths for bf16 and f16 (the compiler is slow). */
static int phase_wanted(const char *id)
{
    if (strstr(id, "_f32_"))
        return strstr(id, "_t2") != NULL;
    if (!strstr(id, "_t1"))
        return 0;
    return strstr(id, "_v8_u2_") || strstr(id, "_v16_u1_") || strstr(id, "_v1_u2_");
}

/* Names case c after phase problem p on T tokens. */
static void phase_name(bo_case *c, const attnres_problem *p, int64_t T, int padded)
{
    const int one = p->op == ATTNRES_OP_PHASE1;
    bo_name(c, p->d, one ? p->n : 0, one ? p->s : 0, T, p->fuse_add, p->epilogue, padded ? "_padded" : "");
}

static void phase_variants(const char *template_name, attnres_op op)
{
    char msg[1024];
    argen *g = NULL;
    argen_variant *v = NULL;
    size_t nv = 0;
    const char *opname = op == ATTNRES_OP_PHASE1 ? "phase1" : "phase2";
    if (argen_open(TEMPLATE_DIR, template_name, &g, msg, sizeof msg) != 0 || argen_enumerate(g, &v, &nv) != 0) {
        bo_fail("%s: %s", template_name, g ? argen_errmsg(g) : msg);
        argen_close(g);
        return;
    }
    const argen_device ad = {.backend = "cpu", .arch = cpu->arch, .units = cpu->units};
    int tried = 0, every_id = 1;
    for (size_t i = 0; i < nv; i++) {
        const char *id = v[i].id;
        const attnres_dtype dt = dtype_of(id);
        if (!phase_wanted(id))
            continue;
        if (!bo_variant_wanted("cpu", opname, dt, id)) {
            every_id = 0;
            continue;
        }
        /* The main problem, and the second: phase 1 at d = 224 and 7 sites
         * where the variant applies, phase 2 without the fused add. */
        attnres_problem probs[2];
        int64_t Ts[2] = {67, op == ATTNRES_OP_PHASE1 ? 9 : 67};
        uint64_t seeds[2] = {300 + i, (op == ATTNRES_OP_PHASE1 ? 500 : 700) + i};
        if (op == ATTNRES_OP_PHASE1) {
            phase1_problem(&probs[0], dt, 128, 5, 3, 2);
            phase1_problem(&probs[1], dt, 224, 4, 7, 2);
        } else {
            phase2_problem(&probs[0], dt, 128, 2, 1, 1);
            phase2_problem(&probs[1], dt, 128, 2, 0, 1);
        }
        ar_kernel k;
        int compiled = 0, failed = 0;
        for (int pi = 0; pi < 2 && !failed; pi++) {
            const attnres_problem *p = &probs[pi];
            argen_problem ap = {.op = opname, .dtype = attnres_dtype_name(dt), .form = "replace", .d = p->d,
                                .t = 67, .n = p->n, .heads = p->heads, .epilogue = p->epilogue, .s = p->s};
            char why[256];
            const int applies = argen_applies(g, id, &ap, &ad, why, sizeof why);
            if (applies < 0)
                bo_fail("%s %s: applies(): %s", template_name, id, why);
            if (applies <= 0)
                break; /* the second problem runs where the first does */
            bo_case c = {.backend = "cpu", .op = opname, .variant = id, .dtype = dt, .heads = p->heads};
            phase_name(&c, p, Ts[pi], 1);
            if (!bo_case_wanted(&c))
                continue;
            bo_verdict verdict = {0};
            if (!compiled) {
                compiled = 1;
                failed = compile_variant_on(cpu, g, id, &k) != 0;
                bo_expect(&verdict, !failed, "the variant does not compile or load (above)");
                tried += !failed;
            }
            if (!failed)
                phase_case(&verdict, p, Ts[pi], seeds[pi], 1, 0, &k);
            bo_report(&c, &verdict);
        }
        if (compiled && !failed)
            cpu->ops->unload(cpu, &k);
    }
    if (!bo_listing && every_id && bo_case_filters_absent() && tried < 10)
        bo_fail("%s: only %d variant(s) compiled and checked, fewer than 10", template_name, tried);
    if (!bo_listing && tried)
        printf("%s: %d variant(s) compiled and checked\n", template_name, tried);
    argen_variants_free(v, nv);
    argen_close(g);
}

void bo_cpu_variants(void)
{
    if (!bo_op_wanted("cpu", "mix") && !bo_op_wanted("cpu", "phase1") && !bo_op_wanted("cpu", "phase2") &&
        !bo_op_wanted("cpu", "mix_backward") && !bo_op_wanted("cpu", "phase1_backward") &&
        !bo_op_wanted("cpu", "phase2_backward"))
        return;
    /* The variants compile into a cache of their own, in a scratch
     * directory; the cache the program was given is set back after. */
    const char *given = getenv("ATTNRES_CACHE_DIR");
    char *cache = given ? strdup(given) : NULL, dir[512];
    if (scratch_cpu_open("backend-ops", dir, sizeof dir, &cpu) != 0) {
        bo_fail("cpu: the device does not open");
        free(cache);
        return;
    }
    if (bo_op_wanted("cpu", "mix"))
        mix_fused_variants();
    if (bo_op_wanted("cpu", "phase1"))
        phase_variants("cpu/phase1", ATTNRES_OP_PHASE1);
    if (bo_op_wanted("cpu", "phase2"))
        phase_variants("cpu/phase2", ATTNRES_OP_PHASE2);
    if (bo_op_wanted("cpu", "mix_backward"))
        bo_cpu_mix_backward_variants(cpu);
    if (bo_op_wanted("cpu", "phase1_backward") || bo_op_wanted("cpu", "phase2_backward"))
        bo_cpu_phase_backward_variants(cpu);
    attnres_device_close(cpu);
    cpu = NULL;
    scratch_remove(dir);
    if (cache)
        setenv("ATTNRES_CACHE_DIR", cache, 1);
    else
        unsetenv("ATTNRES_CACHE_DIR");
    free(cache);
}

/* ------------------------------------------------------------------------
 * The built-in kernels at every ISA level
 * ---------------------------------------------------------------------- */

static const char *level;     /* the level the device was opened with */
static int level_present;     /* the host has it */
static char level_variant[64]; /* "builtin-LEVEL" */

static const attnres_dtype dtypes[] = {ATTNRES_DTYPE_F32, ATTNRES_DTYPE_BF16, ATTNRES_DTYPE_F16};

/* Plans p without a database, and adds to v whether the plan is the
 * built-in kernel it must be; NULL (v failed) when no plan was made. */
attnres_plan *bo_cpu_plan_builtin(const attnres_problem *p, bo_verdict *v)
{
    attnres_plan *plan = NULL;
    char msg[512] = "";
    const int rc = attnres_plan_create(cpu, NULL, p, 0, &plan, msg, sizeof msg);
    bo_expect(v, rc == ATTNRES_OK, "no plan: %s", msg);
    if (rc != ATTNRES_OK)
        return NULL;
    bo_expect(v, attnres_plan_level_get(plan) == ATTNRES_LEVEL_GENERIC, "the plan's level is not generic");
    char text[4096];
    attnres_plan_explain(plan, text, sizeof text);
    const int64_t hd = p->d / p->heads;
    char want[64] = ""; /* "": a narrower level or the scalar kernel, either is right */
    if (hd % 8 != 0 || strcmp(level, "scalar") == 0)
        snprintf(want, sizeof want, "(built in, scalar)");
    else if (hd % 32 == 0 && level_present)
        snprintf(want, sizeof want, "(built in, %s)", level);
    bo_expect(v, !want[0] || strstr(text, want), "expected %s in the explanation:\n%s", want, text);
    bo_expect(v, strstr(text, "built-in generic kernel") != NULL,
              "the explanation does not say the plan fell back:\n%s", text);
    return plan;
}

/* The case of problem p on T tokens at this level, named; 0 when not
 * selected. */
static int builtin_case(bo_case *c, const attnres_problem *p, int64_t T, int padded)
{
    static const char *const ops[] = {"mix", "phase1", "phase2", "mix_backward"};
    *c = (bo_case){.backend = "cpu", .op = ops[p->op], .variant = level_variant, .dtype = p->dtype,
                   .additive = p->form == ATTNRES_FORM_ADDITIVE, .heads = p->heads};
    if (p->op == ATTNRES_OP_MIX)
        bo_name(c, p->d, p->n, 0, T, 0, p->epilogue, "");
    else
        phase_name(c, p, T, padded);
    return bo_case_wanted(c);
}

static void builtin_mix(attnres_dtype dt, int64_t d, int32_t n, int32_t heads, int additive, int epi, int64_t T,
                        uint64_t seed)
{
    attnres_problem p;
    attnres_problem_init(&p, dt, d, n);
    p.heads = heads;
    p.form = additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    p.epilogue = epi;
    bo_case c;
    if (!builtin_case(&c, &p, T, 0))
        return;
    bo_verdict v = {0};
    attnres_plan *plan = bo_cpu_plan_builtin(&p, &v);
    if (plan) {
        const mix_case_errors e = mix_case_run(&p, T, seed, 1.0, 0, plan_mix, plan, NULL);
        const double tol = case_tolerance(dt);
        bo_expect(&v, e.out <= tol && e.normed <= tol, "rel err %g (normed %g), tolerance %g", e.out, e.normed,
                  tol);
        attnres_plan_destroy(plan);
    }
    bo_report(&c, &v);
}

static void builtin_phase(const attnres_problem *p, int64_t T, uint64_t seed, int padded)
{
    bo_case c;
    if (!builtin_case(&c, p, T, padded))
        return;
    bo_verdict v = {0};
    attnres_plan *plan = bo_cpu_plan_builtin(p, &v);
    if (plan) {
        phase_case(&v, p, T, seed, padded, 1, plan);
        attnres_plan_destroy(plan);
    }
    bo_report(&c, &v);
}

/* Every case at the level the device is open at. */
static void builtin_cases(void)
{
    /* The mix: head widths 256 and 64, 48, 20; d = 2048 in bursts. */
    static const struct { int64_t d; int32_t h, n; } mix[] = {{256, 1, 9}, {256, 4, 3}, {96, 2, 5}, {20, 1, 2},
                                                              {64, 1, 1}, {2048, 2, 9}};
    uint64_t seed = 1;
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof mix / sizeof mix[0]; si++)
            for (int additive = 0; additive < 2; additive++)
                for (int epi = 0; epi < 2; epi++)
                    for (int64_t T = 1; T <= 7; T += 6)
                        builtin_mix(dtypes[di], mix[si].d, mix[si].n, mix[si].h, additive, epi, T, seed++);
    attnres_problem p;
    static const struct { int64_t d; int32_t h, n, s; } ph1[] = {{256, 1, 8, 7}, {256, 2, 1, 1}, {96, 2, 3, 5},
                                                                 {20, 1, 2, 3}};
    seed = 1000;
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof ph1 / sizeof ph1[0]; si++)
            for (int64_t T = 1; T <= 7; T += 6) {
                phase1_problem(&p, dtypes[di], ph1[si].d, ph1[si].n, ph1[si].s, ph1[si].h);
                builtin_phase(&p, T, seed++, 0);
            }
    static const struct { int64_t d; int32_t h; } ph2[] = {{256, 1}, {256, 8}, {96, 2}, {20, 1}};
    seed = 2000;
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < sizeof ph2 / sizeof ph2[0]; si++)
            for (int fuse = 0; fuse < 2; fuse++)
                for (int epi = 0; epi < 2; epi++)
                    for (int64_t T = 1; T <= 7; T += 6) {
                        phase2_problem(&p, dtypes[di], ph2[si].d, ph2[si].h, fuse, epi);
                        builtin_phase(&p, T, seed++, 0);
                    }
    /* Padded views with every argument, odd widths, longer T. */
    static const struct { int64_t d, T; int32_t n, s, h; } pad1[] = {
        {64, 37, 5, 3, 2}, {37, 4, 3, 2, 1}, {96, 9, 1, 4, 8}, {128, 130, 9, 1, 1}};
    static const struct { int64_t d, T; int32_t h; int fuse, epi; } pad2[] = {
        {64, 37, 2, 1, 1}, {37, 4, 1, 0, 0}, {96, 9, 8, 1, 0}, {128, 130, 1, 0, 1}};
    for (size_t di = 0; di < 3; di++)
        for (size_t si = 0; si < 4; si++) {
            phase1_problem(&p, dtypes[di], pad1[si].d, pad1[si].n, pad1[si].s, pad1[si].h);
            builtin_phase(&p, pad1[si].T, 100 + si * 7 + di, 1);
            phase2_problem(&p, dtypes[di], pad2[si].d, pad2[si].h, pad2[si].fuse, pad2[si].epi);
            builtin_phase(&p, pad2[si].T, 200 + si * 7 + di, 1);
        }
    /* Launches split over the workers (cpu_builtin.h:
     * AR_CPU_BUILTIN_PART_BYTES per part): 42 MB and 50 MB. */
    builtin_mix(ATTNRES_DTYPE_F32, 4096, 9, 1, 0, 0, 256, 3000);
    phase2_problem(&p, ATTNRES_DTYPE_F32, 4096, 1, 0, 0);
    builtin_phase(&p, 1024, 3001, 0);
    bo_cpu_mix_backward_builtins(cpu, level_variant);
    bo_cpu_phase_backward_builtins(cpu, level_variant);
}

void bo_cpu_builtins(void)
{
    for (size_t i = 0; i < TEST_BUILTIN_LEVELS; i++) {
        level = test_builtin_levels[i];
        snprintf(level_variant, sizeof level_variant, "builtin-%s", level);
        int wanted = 0;
        static const char *const ops[] = {"mix", "phase1", "phase2", "mix_backward", "phase1_backward",
                                          "phase2_backward"};
        for (size_t op = 0; op < sizeof ops / sizeof ops[0]; op++)
            for (size_t di = 0; di < 3; di++)
                wanted |= bo_variant_wanted("cpu", ops[op], dtypes[di], level_variant);
        if (!wanted)
            continue;
        level_present = test_host_has_level(level);
        const int opened = test_cpu_open_level(level, &cpu, 1);
        if (opened < 0) {
            bo_fail("%s: the CPU device does not open at this level", level_variant);
            continue;
        }
        if (!opened) {
            bo_skip("%s: this build has no such level", level_variant);
            continue;
        }
        if (!bo_listing && !level_present)
            printf("%s: this CPU lacks it, so plans take the next level down\n", level_variant);
        builtin_cases();
        attnres_device_close(cpu);
        cpu = NULL;
    }
    unsetenv("ATTNRES_CPU_BUILTIN_ISA");
}
