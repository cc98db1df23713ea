/*
 * test_nvrtc.c - every variant of templates/cuda/mix_online.lua,
 * cuda/mix_twopass.lua, cuda/phase1.lua and cuda/phase2.lua, and of the
 * backwards cuda/mix_backward.lua, phase1_backward.lua and
 * phase2_backward.lua, compiles with NVRTC.
 *
 * For sm_90 each variant the template enumerates, and for sm_80 its generic
 * (fallback) variants and the variants it marks as defaults, must compile
 * with no error and no warning in the log; the generic and default
 * variants must not spill on either. Also
 * checks the ptxas report parser, the launch data of every variant, and
 * that the template accepts and rejects the shapes it should.
 *
 * Needs no GPU. When NVRTC cannot be loaded it prints "SKIP: <reason>" and
 * exits 77 (ctest SKIP_RETURN_CODE). Compiles on one thread per core.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "argen.h"
#include "check.h"
#include "cuda_kernel_abi.h"
#include "cuda_phase_abi.h"
#include "device.h"
#include "nvrtc.h"
#include "storage_convert.h"
#include "test_jobs.h"

#ifndef ATTNRES_TEMPLATE_DIR
#define ATTNRES_TEMPLATE_DIR "templates"
#endif

static const char *template_dir(void)
{
    const char *env = getenv("ATTNRES_TEMPLATE_DIR");
    return env && *env ? env : ATTNRES_TEMPLATE_DIR;
}

/* ---- the ptxas report parser (no NVRTC needed) ------------------------ */

static void test_parse_resources(void)
{
    const char *log =
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'first' for 'sm_90'\n"
        "ptxas info    : Function properties for first\n"
        "ptxas         .     8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n"
        "ptxas info    : Used 40 registers, used 1 barriers, 288 bytes smem, 1136 bytes cmem[0]\n"
        "ptxas info    : Compiling entry function 'second' for 'sm_90'\n"
        "ptxas info    : Function properties for second\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 255 registers, 1136 bytes cmem[0]\n";
    ar_resources r;
    CHECK(ar_nvrtc_parse_resources(log, NULL, &r) == 0);
    CHECK(r.registers == 40 && r.spill_stores == 12 && r.spill_loads == 16 && r.smem == 288 && r.stack == 8);
    CHECK(strcmp(r.json, "{\"registers\":40,\"spill_stores\":12,\"spill_loads\":16,\"smem\":288,\"stack\":8}") == 0);
    CHECK(ar_nvrtc_parse_resources(log, "second", &r) == 0);
    CHECK(r.registers == 255 && r.spill_stores == 0 && r.spill_loads == 0 && r.smem == 0);
    CHECK(ar_nvrtc_parse_resources(log, "third", &r) != 0);
    CHECK(r.registers == -1);
    CHECK(ar_nvrtc_parse_resources(NULL, NULL, &r) != 0);
    CHECK(ar_nvrtc_parse_resources("", NULL, &r) != 0);
    /* A module is judged by its worst entry, figure by figure. */
    CHECK(ar_nvrtc_parse_module_resources(log, &r) == 0);
    CHECK(r.registers == 255 && r.spill_stores == 12 && r.spill_loads == 16 && r.smem == 288 && r.stack == 8);
    CHECK(strcmp(r.json, "{\"registers\":255,\"spill_stores\":12,\"spill_loads\":16,\"smem\":288,\"stack\":8}") == 0);
    CHECK(ar_nvrtc_parse_module_resources("ptxas info    : 0 bytes gmem\n", &r) != 0 && r.registers == -1);
    CHECK(ar_nvrtc_parse_module_resources(NULL, &r) != 0);
}

static void test_abi_header(void)
{
    CHECK(sizeof(attnres_cuda_mix_args) == 1136);
    CHECK(AR_CUDA_MAX_SOURCES == 64);
}

/* ---- the mix templates: launch data and applicability ----------------- */

/* The mix has one template per schedule family; the generic kernel is one
 * of cuda/mix_twopass's variants. */
#define NMIX 2
static const char *const mix_templates[NMIX] = {"cuda/mix_online", "cuda/mix_twopass"};
static argen *gens[NMIX];
static argen_variant *variants[NMIX];
static size_t nvariants[NMIX];

static void free_mix_templates(void)
{
    for (int t = 0; t < NMIX; t++) {
        argen_variants_free(variants[t], nvariants[t]);
        argen_close(gens[t]);
        variants[t] = NULL;
        gens[t] = NULL;
    }
}

static void test_enumerate(void)
{
    size_t per[3] = {0, 0, 0}, total = 0;
    static const char *const dtypes[] = {"f32", "bf16", "f16"};
    for (int t = 0; t < NMIX; t++) {
        char msg[2048];
        REQUIRE(argen_open(template_dir(), mix_templates[t], &gens[t], msg, sizeof msg) == 0);
        CHECK(strcmp(argen_backend(gens[t]), "cuda") == 0);
        CHECK(strcmp(argen_op(gens[t]), "mix") == 0);
        REQUIRE(argen_enumerate(gens[t], &variants[t], &nvariants[t]) == 0);
        REQUIRE(nvariants[t] > 0);
        total += nvariants[t];
        for (size_t i = 0; i < nvariants[t]; i++) {
            const char *j = variants[t][i].params_json;
            int64_t block = ar_json_int(j, "block", -1), tpb = ar_json_int(j, "tokens_per_block", -1);
            CHECK(block >= 64 && block <= 1024 && block % 32 == 0);
            CHECK(tpb >= 1 && block % tpb == 0 && (tpb == 1 || block / tpb == 32));
            CHECK(ar_json_int(j, "smem", -1) == 0);
            CHECK(ar_json_int(j, "abi", -1) == AR_KERNEL_ABI_CUDA_MIX);
            CHECK(ar_json_int(j, "abi_op", -1) == ATTNRES_OP_MIX);
            CHECK(ar_json_int(j, "max_sources", -1) == AR_CUDA_MAX_SOURCES);
            int64_t align = ar_json_int(j, "align", -1);
            CHECK(align >= 2 && align <= 16);
            CHECK(strncmp(variants[t][i].id, "mix_cu_", 7) == 0);
            /* The two-pass kernels take any d; the online ones have a bound. */
            CHECK((ar_json_int(j, "dmax", -1) == 0) == (t == 1));
            for (int d = 0; d < 3; d++) {
                char key[32];
                snprintf(key, sizeof key, "mix_cu_%s_", dtypes[d]);
                if (strncmp(variants[t][i].id, key, strlen(key)) == 0)
                    per[d]++;
            }
        }
        printf("%s variants: %zu\n", mix_templates[t], nvariants[t]);
    }
    printf("mix variants: %zu (f32 %zu, bf16 %zu, f16 %zu)\n", total, per[0], per[1], per[2]);
    CHECK(per[0] + per[1] + per[2] == total);
    for (int d = 0; d < 3; d++)
        CHECK(per[d] > 0 && per[d] <= 400);
}

/* The variants of both mix templates, other than the generic kernel, that
 * accept the problem; *generic_ok says whether the generic one does. */
static int count_applicable(const char *dtype, int64_t d, int n, int heads, int *generic_ok)
{
    argen_problem p = {.op = "mix", .dtype = dtype, .form = "replace", .d = d, .t = 1, .n = n, .heads = heads};
    argen_device dev = {.backend = "cuda", .arch = "sm_90", .units = 132};
    char why[256];
    int count = 0, generics = 0;
    *generic_ok = 0;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "mix_cu_%s_", dtype);
    for (int t = 0; t < NMIX && count >= 0; t++) {
        char *gid = NULL;
        if (argen_generic(gens[t], dtype, &gid) != 0)
            gid = NULL; /* cuda/mix_online has no generic variant */
        else
            generics++;
        for (size_t i = 0; i < nvariants[t]; i++) {
            const char *id = variants[t][i].id;
            if (strncmp(id, prefix, strlen(prefix)) != 0)
                continue; /* other dtypes: refused (checked once below) */
            int ok = argen_applies(gens[t], id, &p, &dev, why, sizeof why);
            if (ok < 0) {
                fprintf(stderr, "applies(%s): %s\n", id, why);
                count = -1;
                break;
            }
            if (ok && gid && strcmp(id, gid) == 0)
                *generic_ok = 1;
            else if (ok)
                count++;
            if (!ok)
                CHECK(why[0] != 0); /* a refusal always says why */
        }
        free(gid);
    }
    CHECK(generics == 1); /* exactly one generic mix kernel per dtype */
    return count;
}

static void test_applies(void)
{
    REQUIRE(gens[0] && gens[1] && nvariants[0] && nvariants[1]);
    int g;
    /* K3 and MHAR-8B have tuned candidates besides the generic kernel. */
    CHECK(count_applicable("bf16", 7168, 9, 1, &g) > 10 && g);
    CHECK(count_applicable("bf16", 4096, 9, 8, &g) > 10 && g);
    CHECK(count_applicable("f16", 2048, 25, 1, &g) > 10 && g);
    CHECK(count_applicable("f32", 1024, 73 - 9, 1, &g) > 5 && g);
    /* Odd shapes: only what can run them, and the generic always. */
    CHECK(count_applicable("bf16", 1000, 7, 5, &g) >= 0 && g);
    CHECK(count_applicable("f32", 3, 1, 3, &g) >= 0 && g);
    CHECK(count_applicable("f16", 16384, 64, 128, &g) >= 0 && g);
    /* Another dtype's variant is refused, with the reason. */
    for (int t = 0; t < NMIX; t++) {
        argen_problem p = {.op = "mix", .dtype = "f16", .form = "replace", .d = 1024, .t = 1, .n = 3, .heads = 1};
        char why[256];
        CHECK(argen_applies(gens[t], variants[t][0].id, &p, NULL, why, sizeof why) == 0 && why[0]);
    }
    /* Over 64 sources or heads not dividing d: nothing applies. */
    CHECK(count_applicable("bf16", 4096, 65, 1, &g) == 0 && !g);
    CHECK(count_applicable("bf16", 4096, 9, 3, &g) == 0 && !g);
}

/* ---- compiling every variant ------------------------------------------ */

typedef struct job {
    const char *id, *source, *kernel, *arch;
    int must_not_spill;
    int rc;
    ar_resources res;
    char err[512];
    char *log;
} job;

static job *jobs;
static size_t njobs;

/* Compiles job i on a worker thread of the pool (test_jobs.h). */
static void compile_job(size_t i)
{
    job *j = &jobs[i];
    char name[200];
    snprintf(name, sizeof name, "%s.cu", j->id);
    j->rc = ar_nvrtc_compile(j->source, name, j->arch, 1, NULL, NULL, &j->log, &j->res, j->err, sizeof j->err);
}

static int log_has_warning(const char *log)
{
    return log && (strcasestr(log, "warning") || strcasestr(log, "error"));
}

static void compile_template(argen *gen, argen_variant *variants, size_t nvariants)
{
    static const char *const archs[] = {"sm_80", "sm_90"};
    char *sources[1024] = {0}, *kernels[1024] = {0};
    int special[1024] = {0};
    REQUIRE(nvariants <= 1024);
    static const char *const dtypes[] = {"f32", "bf16", "f16"};
    char *generic[3] = {0};
    /* A template may have no generic variant (cuda/mix_online). */
    for (int d = 0; d < 3; d++)
        if (argen_generic(gen, dtypes[d], &generic[d]) != 0)
            generic[d] = NULL;
    for (size_t i = 0; i < nvariants; i++) {
        char *json = NULL;
        if (argen_emit(gen, variants[i].id, &sources[i], &kernels[i], &json) != 0) {
            fprintf(stderr, "emit %s: %s\n", variants[i].id, argen_errmsg(gen));
            check_failures++;
            continue;
        }
        char want[200];
        snprintf(want, sizeof want, "attnres_%s", variants[i].id);
        CHECK(strcmp(kernels[i], want) == 0);
        CHECK(strstr(sources[i], "extern \"C\" __global__") != NULL);
        special[i] = ar_json_int(json, "default", 0) == 1;
        for (int d = 0; d < 3; d++)
            if (generic[d] && strcmp(generic[d], variants[i].id) == 0)
                special[i] = 2;
        free(json);
    }
    jobs = calloc(nvariants * 2, sizeof *jobs);
    REQUIRE(jobs);
    njobs = 0;
    /* Every variant for sm_90; for sm_80 the generic and default ones, which
     * must not spill there either. No template has a path of its own per
     * architecture, so a variant's sm_80 compile tells little its sm_90
     * one does not, at the cost of the sweep's time again. */
    size_t per_arch[2] = {0, 0};
    for (size_t i = 0; i < nvariants; i++)
        for (int a = 0; a < 2; a++)
            if (sources[i] && (a == 1 || special[i])) {
                jobs[njobs++] = (job){.id = variants[i].id, .source = sources[i], .kernel = kernels[i],
                                      .arch = archs[a], .must_not_spill = special[i]};
                per_arch[a]++;
            }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = cores < 1 ? 1 : cores > 16 ? 16 : (int)cores;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    job_pool pool;
    job_pool_start(&pool, njobs, nthreads, compile_job);
    const int threads = job_pool_finish(&pool);
    clock_gettime(CLOCK_MONOTONIC, &t1);

    int ok[2] = {0, 0}, warned = 0, failed = 0, spilled_special = 0, spilled_other = 0, maxreg = 0;
    int reported = 0;
    for (size_t i = 0; i < njobs; i++) {
        job *j = &jobs[i];
        int a = strcmp(j->arch, "sm_90") == 0;
        if (j->rc != 0) {
            failed++;
            if (reported++ < 10)
                fprintf(stderr, "FAIL compile %s %s: %s\n%s\n", j->id, j->arch, j->err, j->log ? j->log : "");
        } else if (log_has_warning(j->log)) {
            warned++;
            if (reported++ < 10)
                fprintf(stderr, "WARN %s %s:\n%s\n", j->id, j->arch, j->log);
        } else {
            ok[a]++;
        }
        if (j->rc == 0) {
            int spills = j->res.spill_stores + j->res.spill_loads;
            if (j->res.registers < 0) {
                failed++;
                fprintf(stderr, "no ptxas report for %s %s\n", j->id, j->arch);
            }
            if (j->res.registers > maxreg)
                maxreg = j->res.registers;
            if (spills && j->must_not_spill) {
                spilled_special++;
                fprintf(stderr, "SPILL in %s variant %s %s: %d bytes of spill stores, %d of loads\n",
                        j->must_not_spill == 2 ? "generic" : "default", j->id, j->arch, j->res.spill_stores,
                        j->res.spill_loads);
            } else if (spills) {
                spilled_other++;
            }
            if (j->must_not_spill)
                printf("  %-8s %-46s %s: %d registers, spills %d/%d bytes (the most of its entries)\n",
                       j->must_not_spill == 2 ? "generic" : "default", j->id, j->arch, j->res.registers,
                       j->res.spill_stores, j->res.spill_loads);
        }
        free(j->log);
    }
    printf("compiled clean: sm_80 %d/%zu, sm_90 %d/%zu; warnings %d, failures %d; spilling: %d "
           "(generic/default: %d); max registers %d; %.1f s on %d threads\n",
           ok[0], per_arch[0], ok[1], per_arch[1], warned, failed, spilled_other + spilled_special, spilled_special,
           maxreg, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9, threads);
    CHECK(failed == 0);
    CHECK(warned == 0);
    CHECK(spilled_special == 0);
    CHECK((size_t)(ok[0] + ok[1]) == njobs);
    free(jobs);
    jobs = NULL;
    for (size_t i = 0; i < nvariants; i++) {
        free(sources[i]);
        free(kernels[i]);
    }
    for (int d = 0; d < 3; d++)
        free(generic[d]);
}

static void test_compile_all(void)
{
    for (int t = 0; t < NMIX; t++) {
        REQUIRE(gens[t] && nvariants[t]);
        compile_template(gens[t], variants[t], nvariants[t]);
    }
}

/* ---- the Block AttnRes phase templates (cuda/phase1, cuda/phase2) ------ */

static int phase_applies(argen *g, argen_variant *v, size_t nv, const char *op, const char *dtype, int64_t d, int n,
                         int heads, int s, int *generic_ok)
{
    argen_problem p = {.op = op, .dtype = dtype, .form = "replace", .d = d, .t = 1, .n = n, .heads = heads, .s = s};
    argen_device dev = {.backend = "cuda", .arch = "sm_90", .units = 132};
    char *gid = NULL, why[256];
    if (argen_generic(g, dtype, &gid) != 0)
        return -1;
    int count = 0;
    *generic_ok = 0;
    for (size_t i = 0; i < nv; i++) {
        int ok = argen_applies(g, v[i].id, &p, &dev, why, sizeof why);
        if (ok < 0) {
            fprintf(stderr, "applies(%s): %s\n", v[i].id, why);
            count = -1;
            break;
        }
        if (!ok)
            CHECK(why[0] != 0);
        else if (strcmp(v[i].id, gid) == 0)
            *generic_ok = 1;
        else
            count++;
    }
    free(gid);
    return count;
}

/* Opens CUDA template name of op, enumerates it, and checks the launch
 * data every variant states: its ABI (abi_op, the struct's version), a
 * block of whole warps, 128 to 512 threads, and an alignment of 2 to 16
 * bytes. *out is the handle, NULL where that failed (the case then
 * stops: REQUIRE). */
static void open_cuda_template(const char *name, const char *op, attnres_op abi_op, argen **out,
                               argen_variant **v, size_t *nv)
{
    char msg[2048];
    argen *g = NULL;
    *out = NULL;
    REQUIRE(argen_open(template_dir(), name, &g, msg, sizeof msg) == 0);
    CHECK(strcmp(argen_backend(g), "cuda") == 0);
    CHECK(strcmp(argen_op(g), op) == 0);
    REQUIRE(argen_enumerate(g, v, nv) == 0 && *nv > 0);
    printf("%s variants: %zu\n", name, *nv);
    for (size_t i = 0; i < *nv; i++) {
        const char *j = (*v)[i].params_json;
        CHECK(ar_json_int(j, "abi", -1) == AR_CUDA_ABI_VERSIONS[abi_op]);
        CHECK(ar_json_int(j, "abi_op", -1) == (int64_t)abi_op);
        const int64_t block = ar_json_int(j, "block", -1), align = ar_json_int(j, "align", -1);
        CHECK(block >= 128 && block <= 512 && block % 32 == 0);
        CHECK(align >= 2 && align <= 16);
    }
    *out = g;
}

/* Compiles every variant of g (compile_template) where NVRTC loads, then
 * frees the variants and closes g. */
static void compile_and_close(argen *g, argen_variant *v, size_t nv)
{
    char msg[512];
    if (ar_nvrtc_available(msg, sizeof msg) == 0)
        compile_template(g, v, nv);
    argen_variants_free(v, nv);
    argen_close(g);
}

static void test_phase_templates(void)
{
    static const char *const names[] = {"cuda/phase1", "cuda/phase2"};
    static const char *const ops[] = {"phase1", "phase2"};
    CHECK(sizeof(attnres_cuda_phase1_args) == 2112 && sizeof(attnres_cuda_phase1_args) <= 4096);
    CHECK(sizeof(attnres_cuda_phase2_args) == 152);
    static const attnres_op op_values[] = {ATTNRES_OP_PHASE1, ATTNRES_OP_PHASE2};
    for (int t = 0; t < 2; t++) {
        argen_variant *v = NULL;
        size_t nv = 0;
        argen *g;
        open_cuda_template(names[t], ops[t], op_values[t], &g, &v, &nv);
        REQUIRE(g != NULL);
        for (size_t i = 0; i < nv; i++)
            CHECK(ar_json_int(v[i].params_json, "tokens_per_block", -1) == 1);
        int gok;
        if (t == 0) {
            /* K3-like and MHAR-like blocks: tuned candidates and the generic. */
            CHECK(phase_applies(g, v, nv, "phase1", "bf16", 7168, 9, 1, 8, &gok) > 3 && gok);
            CHECK(phase_applies(g, v, nv, "phase1", "f16", 4096, 9, 8, 4, &gok) > 3 && gok);
            CHECK(phase_applies(g, v, nv, "phase1", "f32", 200, 5, 20, 3, &gok) >= 0 && gok);
            CHECK(phase_applies(g, v, nv, "phase1", "bf16", 1000, 64, 5, 64, &gok) >= 0 && !gok); /* smem */
            CHECK(phase_applies(g, v, nv, "phase1", "bf16", 4096, 9, 1, 65, &gok) == 0 && !gok);
            CHECK(phase_applies(g, v, nv, "phase1", "bf16", 4096, 65, 1, 2, &gok) == 0 && !gok);
            CHECK(phase_applies(g, v, nv, "mix", "bf16", 4096, 9, 1, 0, &gok) == 0 && !gok);
        } else {
            CHECK(phase_applies(g, v, nv, "phase2", "bf16", 7168, 1, 1, 0, &gok) > 3 && gok);
            CHECK(phase_applies(g, v, nv, "phase2", "f32", 96, 1, 3, 0, &gok) >= 0 && gok);
            CHECK(phase_applies(g, v, nv, "phase2", "f16", 4096, 1, 3, 0, &gok) == 0 && !gok);
            CHECK(phase_applies(g, v, nv, "phase1", "f16", 4096, 1, 1, 1, &gok) == 0 && !gok);
        }
        compile_and_close(g, v, nv);
    }
}

/* ---- the backward templates (cuda/mix_backward, phase1_backward,
 * phase2_backward) ------------------------------------------------------ */

static void test_backward_templates(void)
{
    static const char *const names[] = {"cuda/mix_backward", "cuda/phase1_backward", "cuda/phase2_backward"};
    static const char *const ops[] = {"mix_backward", "phase1_backward", "phase2_backward"};
    static const attnres_op op_values[] = {ATTNRES_OP_MIX_BACKWARD, ATTNRES_OP_PHASE1_BACKWARD,
                                           ATTNRES_OP_PHASE2_BACKWARD};
    /* Passed by value: within the 4 KiB of kernel parameters. */
    CHECK(sizeof(attnres_cuda_mix_backward_args) <= 4096);
    CHECK(sizeof(attnres_cuda_phase1_backward_args) <= 4096);
    CHECK(sizeof(attnres_cuda_phase2_backward_args) <= 4096);
    for (int t = 0; t < 3; t++) {
        argen_variant *v = NULL;
        size_t nv = 0;
        argen *g;
        open_cuda_template(names[t], ops[t], op_values[t], &g, &v, &nv);
        REQUIRE(g != NULL);
        /* K3's and MHAR-8B's shapes: tuned candidates and the generic. */
        int gok;
        if (t == 0) {
            CHECK(phase_applies(g, v, nv, ops[t], "bf16", 7168, 9, 1, 0, &gok) > 3 && gok);
            CHECK(phase_applies(g, v, nv, ops[t], "bf16", 4096, 9, 8, 0, &gok) > 3 && gok);
            CHECK(phase_applies(g, v, nv, ops[t], "bf16", 4096, 65, 1, 0, &gok) == 0 && !gok);
        } else if (t == 1) {
            CHECK(phase_applies(g, v, nv, ops[t], "bf16", 7168, 8, 1, 24, &gok) > 3 && gok);
            CHECK(phase_applies(g, v, nv, ops[t], "bf16", 4096, 8, 8, 24, &gok) > 3 && gok);
            CHECK(phase_applies(g, v, nv, ops[t], "bf16", 4096, 8, 1, 65, &gok) == 0 && !gok);
        } else {
            CHECK(phase_applies(g, v, nv, ops[t], "bf16", 7168, 1, 1, 0, &gok) > 3 && gok);
            CHECK(phase_applies(g, v, nv, ops[t], "bf16", 4096, 1, 8, 0, &gok) > 3 && gok);
        }
        CHECK(phase_applies(g, v, nv, "mix", "bf16", 4096, 9, 1, 0, &gok) == 0 && !gok);
        compile_and_close(g, v, nv);
    }
}

/* A source with a deliberate error and one with a warning: both reported. */
static void test_diagnostics(void)
{
    char err[512], *log = NULL;
    ar_resources r;
    int rc = ar_nvrtc_compile("extern \"C\" __global__ void k() { undefined_thing(); }", "bad.cu", "sm_90", 1, NULL,
                              NULL, &log, &r, err, sizeof err);
    CHECK(rc == ATTNRES_ECOMPILE);
    CHECK(strstr(err, "undefined_thing") != NULL);
    CHECK(log && strstr(log, "undefined_thing"));
    free(log);
    rc = ar_nvrtc_compile("extern \"C\" __global__ void k(int *p) { int unused; *p = 1; }", "warn.cu", "sm_90", 1,
                          NULL, NULL, &log, &r, err, sizeof err);
    CHECK(rc == ATTNRES_OK);
    CHECK(log_has_warning(log));
    CHECK(r.registers >= 0);
    free(log);
    CHECK(ar_nvrtc_compile("x", "a.cu", "sm_x", 1, NULL, NULL, NULL, NULL, err, sizeof err) == ATTNRES_EINVAL);
    void *blob = NULL;
    size_t size = 0;
    rc = ar_nvrtc_compile("extern \"C\" __global__ void k(int *p) { *p = 1; }", "ptx.cu", "compute_80", 0, &blob,
                          &size, NULL, NULL, err, sizeof err);
    CHECK(rc == ATTNRES_OK && blob && size > 0 && strstr(blob, ".entry k"));
    free(blob);
    int major = 0, minor = 0;
    CHECK(ar_nvrtc_version(&major, &minor) == 0 && major >= 11);
    CHECK(ar_nvrtc_best_arch(90) >= 80);
}

/* ---- the CUDA device, when there is one --------------------------------- */

/* Runs the generic kernel of dtype on the device and compares with the
 * fp64 reference (computed from the rounded inputs). */
static void check_generic_run(attnres_device *dev, attnres_dtype dt, int64_t d, int n, int heads, int64_t T,
                              int additive, int epilogue)
{
    const ar_backend *ops = dev->ops;
    attnres_problem p;
    attnres_problem_init(&p, dt, d, n);
    p.heads = heads;
    p.form = additive ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    p.epilogue = epilogue;
    const size_t es = attnres_dtype_size(dt), rows = (size_t)(T * d);
    ar_kernel k;
    REQUIRE(ops->load_generic(dev, &p, &k) == ATTNRES_OK);
    double *hd[64], *hq = malloc(d * sizeof *hq), *hp = malloc(rows * sizeof *hp), *hg = malloc(d * sizeof *hg);
    double *ref = malloc(rows * sizeof *ref), *refn = malloc(rows * sizeof *refn);
    char *hbuf = malloc(rows * 4);
    float *fq = malloc(d * 4), *fg = malloc(d * 4);
    void *dsrc[64] = {0}, *dq = NULL, *dg = NULL, *dpart = NULL, *dout = NULL, *dnorm = NULL;
    REQUIRE(hq && hp && hg && ref && refn && hbuf && fq && fg);
    unsigned seed = 12345;
    for (int i = 0; i < n; i++) {
        hd[i] = malloc(rows * sizeof(double));
        for (size_t j = 0; j < rows; j++) {
            seed = seed * 1103515245u + 12345u;
            float v = ((float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f) * (1.0f + 0.25f * (float)i);
            ar_storage_store(dt, hbuf, (int64_t)j, v);
            hd[i][j] = (double)ar_storage_load(dt, hbuf, (int64_t)j);
        }
        CHECK(ops->mem_alloc(dev, rows * es, &dsrc[i]) == 0);
        CHECK(ops->copy_to_device(dev, dsrc[i], hbuf, rows * es) == 0);
    }
    for (int64_t j = 0; j < d; j++) {
        fq[j] = (float)((j * 37 % 101) - 50) / 500.0f;
        fg[j] = 1.0f + (float)(j % 5) / 10.0f;
        hq[j] = fq[j];
        hg[j] = fg[j];
    }
    for (size_t j = 0; j < rows; j++) {
        float v = (float)((j * 13) % 17) / 17.0f - 0.5f;
        ar_storage_store(dt, hbuf, (int64_t)j, v);
        hp[j] = (double)ar_storage_load(dt, hbuf, (int64_t)j);
    }
    CHECK(ops->mem_alloc(dev, rows * es, &dpart) == 0 && ops->copy_to_device(dev, dpart, hbuf, rows * es) == 0);
    CHECK(ops->mem_alloc(dev, d * 4, &dq) == 0 && ops->copy_to_device(dev, dq, fq, d * 4) == 0);
    CHECK(ops->mem_alloc(dev, d * 4, &dg) == 0 && ops->copy_to_device(dev, dg, fg, d * 4) == 0);
    CHECK(ops->mem_alloc(dev, rows * es, &dout) == 0 && ops->mem_alloc(dev, rows * es, &dnorm) == 0);
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = (const void *const *)dsrc;
    a.query = dq;
    a.eps = 1e-5f;
    a.scale = 0.5f;
    a.partial = additive ? dpart : NULL;
    a.alpha = 0.75f;
    a.out = dout;
    a.out_gain = epilogue ? dg : NULL;
    a.normed = epilogue ? dnorm : NULL;
    const ar_op_args args = ar_op_mix(&a);
    int rc = ops->launch(dev, &k, &p, T, &args, NULL);
    CHECK(rc == ATTNRES_OK);
    if (rc)
        fprintf(stderr, "launch: %s\n", attnres_device_errmsg(dev));
    CHECK(attnres_reference_mix(&p, T, (const double *const *)hd, hq, 0.5, 1e-5, additive ? hp : NULL, 0.75, hg, 1e-6,
                                ref, refn) == 0);
    const double tol = dt == ATTNRES_DTYPE_F32 ? 1e-5 : 1e-2;
    for (int which = 0; which < 1 + epilogue; which++) {
        CHECK(ops->copy_to_host(dev, hbuf, which ? dnorm : dout, rows * es) == 0);
        double num = 0, den = 0;
        for (size_t j = 0; j < rows; j++) {
            double e = (double)ar_storage_load(dt, hbuf, (int64_t)j) - (which ? refn : ref)[j];
            num += e * e;
            den += (which ? refn : ref)[j] * (which ? refn : ref)[j];
        }
        double err = sqrt(num / (den > 0 ? den : 1));
        printf("  generic %s d=%lld N=%d H=%d T=%lld%s%s: %s relative error %.2e\n", attnres_dtype_name(dt),
               (long long)d, n, heads, (long long)T, additive ? " additive" : "", epilogue ? " epilogue" : "",
               which ? "normed" : "out", err);
        CHECK(err <= tol);
    }
    for (int i = 0; i < n; i++) {
        ops->mem_free(dev, dsrc[i]);
        free(hd[i]);
    }
    ops->mem_free(dev, dq);
    ops->mem_free(dev, dg);
    ops->mem_free(dev, dpart);
    ops->mem_free(dev, dout);
    ops->mem_free(dev, dnorm);
    ops->unload(dev, &k);
    free(hq), free(hp), free(hg), free(ref), free(refn), free(hbuf), free(fq), free(fg);
}

static void test_cuda_device(void)
{
    int count = attnres_device_count("cuda");
    attnres_device *dev = NULL;
    char msg[512] = "";
    int rc = attnres_device_open("cuda:0", &dev, msg, sizeof msg);
    if (count == 0) {
        /* No driver or no GPU: a clean refusal, never a crash. */
        CHECK(rc == ATTNRES_ENODEV);
        CHECK(dev == NULL);
        CHECK(msg[0] != 0);
        printf("  no CUDA device: %s\n", msg);
        return;
    }
    REQUIRE(rc == ATTNRES_OK && dev);
    attnres_device_info info = {.struct_size = sizeof info};
    CHECK(attnres_device_info_get(dev, &info) == 0);
    printf("  cuda:0 %s %s, %d SMs, driver %s, %s, target %s\n", info.name, info.arch, info.units, info.driver,
           dev->compiler, dev->target);
    CHECK(strncmp(info.arch, "sm_", 3) == 0 && info.units > 0 && info.memory > 0);
    check_generic_run(dev, ATTNRES_DTYPE_F32, 96, 3, 2, 5, 0, 0);
    check_generic_run(dev, ATTNRES_DTYPE_F32, 200, 5, 20, 3, 1, 1);
    check_generic_run(dev, ATTNRES_DTYPE_BF16, 7168, 9, 1, 4, 0, 0);
    check_generic_run(dev, ATTNRES_DTYPE_F16, 4096, 9, 8, 3, 1, 1);
    double gbps = 0, us = 0;
    CHECK(dev->ops->copy_bandwidth(dev, &gbps) == 0 && gbps > 0);
    CHECK(dev->ops->empty_launch(dev, &us) == 0 && us > 0);
    printf("  copy bandwidth %.0f GB/s, empty launch %.2f us\n", gbps, us);
    attnres_device_close(dev);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN_CASE(test_parse_resources);
    RUN_CASE(test_abi_header);
    /* test_applies and test_compile_all use the templates it loads. */
    RUN_FIXTURE(test_enumerate);
    RUN_CASE(test_applies);
    RUN_CASE(test_cuda_device);
    char why[512];
    /* --list names the cases that need NVRTC too. */
    if (!check_listing && ar_nvrtc_available(why, sizeof why) != 0) {
        free_mix_templates();
        if (check_failures)
            CHECK_EXIT();
        printf("SKIP: %s\n", why);
        return 77;
    }
    RUN_CASE(test_diagnostics);
    RUN_CASE(test_compile_all);
    RUN_CASE(test_phase_templates);
    RUN_CASE(test_backward_templates);
    free_mix_templates();
    CHECK_EXIT();
}
