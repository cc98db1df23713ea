/*
 * test_cpu_mix_variants.c - every tuned variant of the fused CPU mix
 * template (templates/cpu/mix_fused.lua) at two threads, compiled and
 * loaded as the tuner does, against the fp64 reference.
 *
 * The shapes reach every path of the template: an odd and an even number
 * of sources (the two alternating mix sums), more sources than one sweep's
 * group (two and three sweeps), two heads, the additive form and the norm
 * epilogue, one token (no next token to score or prefetch) and token
 * counts that the launch splits over both threads, so a range ends inside
 * the tensor; a head slice long enough for bursts of 4 steps, in bursts
 * and the steps they leave over; the non-temporal stores
 * both on aligned output rows and on rows that are not, where they must
 * fall back to plain stores; and scores tens apart, whose exponentials
 * reach the softmax's clamp. Variants
 * that only differ in their thread count share every other line of source.
 *
 * A bf16 output hides score errors below its rounding, so the variants
 * whose statistics use the bf16 dot products are also run against their
 * FMA twin on the same data: both sum the same fp32 products, so at most
 * 1% of the outputs may round differently. Leaving out the query's low
 * half, an error of 2^-9 in the scores, changes about a quarter of them.
 */
#define _GNU_SOURCE /* setenv, mkdtemp */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "argen.h"
#include "attnres.h"
#include "check.h"
#include "device.h"
#include "test_covering.h"
#include "test_mix_case.h"
#include "test_variant.h"

static attnres_device *cpu;
/* --sample: only a covering sample of the variants (test_covering.h). */
static int sample_only;

static int launch_kernel(void *kernel, const attnres_problem *p, int64_t T, const attnres_mix_args *a)
{
    const ar_op_args args = ar_op_mix(a);
    return cpu->ops->launch(cpu, kernel, p, T, &args, NULL);
}

typedef struct shape {
    int64_t d;
    int32_t n, heads;
    int additive, epilogue;
    int64_t T;
    double sharp;
    size_t out_shift; /* bytes the output rows start past a 64-byte line */
} shape;

/* The sharpest softmax the comparison with the FMA twin runs at. */
#define TWIN_SHARPNESS_MAX 4.0

static const shape shapes[] = {
    {128, 9, 1, 0, 0, 7, 1.0, 0},  /* odd n: 2 sweeps of 5 + 4 (group 8), 3 of 3 (group 4) */
    {128, 4, 2, 1, 1, 5, 1.0, 0},  /* even n, two heads of 64, additive with the epilogue */
    {64, 1, 1, 0, 0, 1, 1.0, 0},   /* one source, one token */
    {256, 17, 1, 1, 0, 3, 1.0, 0}, /* three sweeps at group 8, five at group 4 */
    {256, 9, 1, 0, 1, 6, 4.0, 0},  /* a sharper softmax */
    {128, 9, 1, 0, 0, 3, 40.0, 0}, /* scores tens apart: exponentials down at the clamp (e^-86) */
    {96, 3, 1, 0, 1, 4, 1.0, 16},  /* output rows off the stores' alignment */
    {544, 9, 1, 1, 1, 5, 1.0, 16}, /* 17 or 34 steps: bursts of 4 and the steps they leave */
};

/* Two threads; the non-temporal stores (the same lines of source at every
 * group, prefetch and place of the mix) at group 8 without prefetch, fused.
 * In bursts of 4, no prefetch, "both" (whose statements include those of
 * "token"), "sweep" (the mix apart only) and "all"; "all" (whose statements
 * include those of "both") at group 8 alone. */
static int wanted(const char *id)
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

static attnres_dtype dtype_of(const char *id)
{
    return strstr(id, "_bf16_") ? ATTNRES_DTYPE_BF16 : strstr(id, "_f16_") ? ATTNRES_DTYPE_F16 : ATTNRES_DTYPE_F32;
}

/* The FMA twin of bf16-dot variant id: the same id with "_dfma_". */
static void twin_of(const char *id, char *twin_id, size_t size)
{
    const char *at = strstr(id, "_dbf16_");
    snprintf(twin_id, size, "%.*s_dfma_%s", (int)(at - id), id, at + strlen("_dbf16_"));
}

/* Runs bf16-dot variant `id` (loaded as k) and its FMA twin (loaded as
 * twin) on the same data; at most 1% of the outputs may differ. */
static void check_against_fma_twin(const char *id, ar_kernel *k, ar_kernel *twin, const attnres_problem *p,
                                   int64_t T, uint64_t seed, double sharp, size_t out_shift)
{
    const int64_t count = T * p->d;
    double *a = malloc(sizeof(double) * (size_t)count), *b = malloc(sizeof(double) * (size_t)count);
    REQUIRE(a && b);
    mix_case_run(p, T, seed, sharp, out_shift, launch_kernel, k, a);
    mix_case_run(p, T, seed, sharp, out_shift, launch_kernel, twin, b);
    int64_t differ = 0;
    for (int64_t i = 0; i < count; i++)
        differ += a[i] != b[i];
    CHECK(differ * 100 <= count);
    if (differ * 100 > count)
        fprintf(stderr, "  %s: %lld of %lld outputs differ from its FMA twin\n", id, (long long)differ,
                (long long)count);
    free(a);
    free(b);
}

/* The covering sample (test_covering.h) of the variants this test runs
 * (wanted) that apply to at least one of the shapes; NULL when out of
 * memory. */
static int *sample_variants(argen *g, const argen_variant *v, size_t nv, const argen_device *ad)
{
    const char **json = calloc(nv ? nv : 1, sizeof *json);
    int *usable = calloc(nv ? nv : 1, sizeof *usable), *pick = calloc(nv ? nv : 1, sizeof *pick);
    for (size_t i = 0; json && usable && pick && i < nv; i++) {
        json[i] = v[i].params_json;
        const attnres_dtype dt = dtype_of(v[i].id);
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0] && !usable[i] && wanted(v[i].id); si++) {
            const shape *sh = &shapes[si];
            const int64_t bucket = strstr(v[i].id, "_pa_") ? INT64_C(1) << 20 : sh->T;
            argen_problem ap = {.op = "mix", .dtype = attnres_dtype_name(dt),
                                .form = sh->additive ? "additive" : "replace", .d = sh->d, .t = bucket,
                                .n = sh->n, .heads = sh->heads, .epilogue = sh->epilogue};
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

static void test_every_fused_variant_matches_reference(void)
{
    char msg[1024];
    argen *g = NULL;
    REQUIRE(argen_open(TEMPLATE_DIR, "cpu/mix_fused", &g, msg, sizeof msg) == 0);
    argen_variant *v = NULL;
    size_t nv = 0;
    REQUIRE(argen_enumerate(g, &v, &nv) == 0);
    argen_device ad = {.backend = "cpu", .arch = cpu->arch, .units = 2};
    int *picked = sample_only ? sample_variants(g, v, nv, &ad) : NULL;
    REQUIRE(!sample_only || picked);
    int tried = 0, cases = 0;
    for (size_t i = 0; i < nv; i++) {
        if (picked && !picked[i])
            continue;
        /* Each variant is a unit: --case CASE/VARIANT_ID runs it alone. */
        if (!wanted(v[i].id) || !check_unit(v[i].id))
            continue;
        const attnres_dtype dt = dtype_of(v[i].id);
        ar_kernel k, twin, spec9;
        int compiled = 0, has_twin = 0;
        /* A source specialized for n = 9, as the tuner emits for K3's
         * shape: right on the shapes with n = 9 by its own cases, and on
         * every other n by its general ones. The covering sample and a
         * quarter of the full sweep take one. */
        int has_spec = 0;
        const int want_spec = sample_only || i % 4 == 0;
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const shape *sh = &shapes[si];
            attnres_problem p;
            attnres_problem_init(&p, dt, sh->d, sh->n);
            p.heads = sh->heads;
            p.form = sh->additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
            p.epilogue = sh->epilogue;
            /* Prefetch "all" is tuned only for launches that move 64 MiB
             * and more, but must be right at every T: it is asked about as
             * for a bucket of a million tokens, and runs these shapes. */
            const int64_t bucket = strstr(v[i].id, "_pa_") ? INT64_C(1) << 20 : sh->T;
            argen_problem ap = {.op = "mix", .dtype = attnres_dtype_name(dt),
                                .form = sh->additive ? "additive" : "replace", .d = p.d, .t = bucket,
                                .n = p.n, .heads = p.heads, .epilogue = p.epilogue};
            char why[256];
            const int applies = argen_applies(g, v[i].id, &ap, &ad, why, sizeof why);
            CHECK(applies >= 0);
            if (applies <= 0)
                continue;
            if (!compiled) {
                const int rc = compile_variant_on(cpu, g, v[i].id, &k);
                CHECK(rc == 0);
                if (rc)
                    break;
                compiled = 1;
                tried++;
                if (want_spec) {
                    has_spec = compile_variant_for(cpu, g, v[i].id, "n=9", &spec9) == 0;
                    CHECK(has_spec);
                }
                if (strstr(v[i].id, "_dbf16_")) {
                    char twin_id[256];
                    twin_of(v[i].id, twin_id, sizeof twin_id);
                    has_twin = compile_variant_on(cpu, g, twin_id, &twin) == 0;
                    CHECK(has_twin);
                }
            }
            const uint64_t seed = 7000 + 31 * i + si;
            const mix_case_errors e =
                mix_case_run(&p, sh->T, seed, sh->sharp, sh->out_shift, launch_kernel, &k, NULL);
            cases++;
            const double tol = case_tolerance(dt);
            CHECK(e.out <= tol && e.normed <= tol);
            /* The twin bound holds while the two sums' rounding, scaled by the
             * softmax's sharpness, stays far below the output's: at 40x it
             * flips 1-2% of the bf16 roundings (both still match the
             * reference above), so the extreme shape is for the reference
             * alone. */
            if (has_twin && sh->sharp <= TWIN_SHARPNESS_MAX)
                check_against_fma_twin(v[i].id, &k, &twin, &p, sh->T, seed, sh->sharp, sh->out_shift);
            if (has_spec) {
                const mix_case_errors es =
                    mix_case_run(&p, sh->T, seed, sh->sharp, sh->out_shift, launch_kernel, &spec9, NULL);
                CHECK(es.out <= tol && es.normed <= tol);
                if (!(es.out <= tol && es.normed <= tol))
                    fprintf(stderr, "  %s specialized for n=9, on N=%d T=%lld: rel err %g (normed %g)\n", v[i].id,
                            sh->n, (long long)sh->T, es.out, es.normed);
            }
            if (!(e.out <= tol && e.normed <= tol))
                fprintf(stderr, "  %s d=%lld N=%d H=%d %s epi=%d T=%lld sharp=%g: rel err %g (normed %g)\n",
                        v[i].id, (long long)sh->d, sh->n, sh->heads, sh->additive ? "additive" : "replace",
                        sh->epilogue, (long long)sh->T, sh->sharp, e.out, e.normed);
        }
        if (compiled)
            cpu->ops->unload(cpu, &k);
        if (has_twin)
            cpu->ops->unload(cpu, &twin);
        if (has_spec)
            cpu->ops->unload(cpu, &spec9);
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
    check_units_end();
    if (check_every_unit() && !sample_only)
        CHECK(tried == want);
    printf("     cpu/mix_fused: %d variant(s) compiled%s, %d case(s) checked\n", tried,
           sample_only ? " (a covering sample)" : "", cases);
    free(picked);
    argen_variants_free(v, nv);
    argen_close(g);
}

int main(int argc, char **argv)
{
    sample_only = covering_requested(&argc, argv);
    CHECK_ARGS(argc, argv);
    char dir[512];
    if (scratch_cpu_open("mixvar", dir, sizeof dir, &cpu) != 0)
        return 1;
    RUN_CASE(test_every_fused_variant_matches_reference);
    attnres_device_close(cpu);
    scratch_remove(dir);
    CHECK_EXIT();
}
