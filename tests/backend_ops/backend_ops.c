/*
 * backend_ops.c - the op x backend harness, after ggml's test-backend-ops:
 * every (backend, op, dtype, form, head count, kernel, problem) case
 * against the fp64 reference, in one program.
 *
 *   backend_ops [--backend B] [--op O] [--dtype D] [--form F] [--heads H]
 *               [--variant V] [--arch A] [--case C] [--sample | --all]
 *               [--list] [--verbose]
 *
 * Each filter but --heads is a shell pattern (fnmatch: "mix_c_*",
 * "phase?"), or several separated by '|' ("mix|phase?"); a case runs when
 * it matches every filter given. The kernels:
 * on the CPU the variants of the templates cpu/mix_fused, cpu/phase1,
 * cpu/phase2, cpu/mix_backward, cpu/phase1_backward and cpu/phase2_backward
 * compiled as the tuner compiles them, and the built-in kernels at each ISA
 * level ("builtin-avx2", ...; of the backwards also "builtin-host", the
 * host's own level); on CUDA (where the build has
 * the backend) every variant of every cuda/ template, through NVRTC for
 * sm_90 and sm_80 (--arch), on the device ATTNRES_CUDA_DRIVER names (the
 * simulated driver under ctest) or a real one. --sample (the default) runs
 * the covering samples of the fast tier (tests/lib/test_covering.h), --all
 * every variant; what each template samples is said in ops_cpu.c and
 * ops_cuda.c. --list prints the cases it would run, one a line, as the
 * options that select each alone.
 *
 * A case that fails prints its figures and the command that reruns it
 * alone:
 *   FAIL cpu mix bf16 additive H=1 mix_c_bf16_... d128_n4_h2_t5_epi: ...
 *   reproduce: [env ATTNRES_...=...] /abs/backend_ops --backend cpu ...
 * The run ends with the count of cases passed, failed and skipped; the exit
 * status is 1 when any failed, 77 when every case was skipped (no CUDA
 * device, no NVRTC), 2 when the options are wrong or select no case.
 */
#define _GNU_SOURCE
#include "backend_ops.h"

#include <fnmatch.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int bo_sample = 1, bo_verbose, bo_listing;

/* The filters: NULL where not given. */
static const char *f_backend, *f_op, *f_dtype, *f_form, *f_variant, *f_arch, *f_case;
static int f_heads; /* 0: any */
static int passed, failed, skipped, listed;

/* Whether s matches pattern, a shell pattern or several separated by '|'
 * ("mix|phase?"); every string matches no pattern (NULL). */
static int matches(const char *pattern, const char *s)
{
    if (!pattern)
        return 1;
    for (const char *at = pattern; s; at++) {
        const char *bar = strchr(at, '|');
        const size_t len = bar ? (size_t)(bar - at) : strlen(at);
        char one[256];
        if (len < sizeof one) {
            memcpy(one, at, len);
            one[len] = '\0';
            if (fnmatch(one, s, 0) == 0)
                return 1;
        }
        if (!bar)
            break;
        at = bar;
    }
    return 0;
}

int bo_variant_wanted(const char *backend, const char *op, attnres_dtype dt, const char *variant)
{
    return matches(f_backend, backend) && matches(f_op, op) && matches(f_dtype, attnres_dtype_name(dt)) &&
           matches(f_variant, variant);
}

int bo_case_filters_absent(void) { return !f_form && !f_heads && !f_arch && !f_case; }

int bo_op_wanted(const char *backend, const char *op)
{
    return matches(f_backend, backend) && (!op || matches(f_op, op));
}

/* The options that select case c alone, into buf. */
static void case_options(const bo_case *c, char *buf, size_t len)
{
    int n = snprintf(buf, len, "--backend %s --op %s --dtype %s --form %s --heads %d --variant %s", c->backend,
                     c->op, attnres_dtype_name(c->dtype), c->additive ? "additive" : "replace", c->heads,
                     c->variant);
    if (c->arch && n > 0 && (size_t)n < len)
        n += snprintf(buf + n, len - (size_t)n, " --arch %s", c->arch);
    if (n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " --case %s %s", c->name, bo_sample ? "--sample" : "--all");
}

int bo_case_wanted(const bo_case *c)
{
    if (!bo_variant_wanted(c->backend, c->op, c->dtype, c->variant) ||
        !matches(f_form, c->additive ? "additive" : "replace") || (f_heads && f_heads != c->heads) ||
        !matches(f_arch, c->arch) || !matches(f_case, c->name))
        return 0;
    if (bo_listing) {
        char opts[512];
        case_options(c, opts, sizeof opts);
        printf("%s\n", opts);
        listed++;
        return 0;
    }
    return 1;
}

void bo_name(bo_case *c, int64_t d, int n, int s, int64_t T, int fuse, int epi, const char *extra)
{
    char ns[16] = "", ss[16] = "";
    if (n)
        snprintf(ns, sizeof ns, "_n%d", n);
    if (s)
        snprintf(ss, sizeof ss, "_s%d", s);
    snprintf(c->name, sizeof c->name, "d%lld%s%s_h%d_t%lld%s%s%s", (long long)d, ns, ss, c->heads, (long long)T,
             fuse ? "_fuse" : "", epi ? "_epi" : "", extra);
}

void bo_expect(bo_verdict *v, int ok, const char *fmt, ...)
{
    if (ok)
        return;
    v->failed = 1;
    size_t used = strlen(v->text);
    if (used && used + 2 < sizeof v->text) {
        memcpy(v->text + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->text + used, sizeof v->text - used, fmt, ap);
    va_end(ap);
}

void bo_report(const bo_case *c, const bo_verdict *v)
{
    const char *form = c->additive ? "additive" : "replace";
    if (!v->failed) {
        passed++;
        if (bo_verbose)
            printf("ok   %s %s %s %s H=%d %s%s%s %s\n", c->backend, c->op, attnres_dtype_name(c->dtype), form,
                   c->heads, c->variant, c->arch ? " " : "", c->arch ? c->arch : "", c->name);
        return;
    }
    failed++;
    printf("FAIL %s %s %s %s H=%d %s%s%s %s: %s\n", c->backend, c->op, attnres_dtype_name(c->dtype), form, c->heads,
           c->variant, c->arch ? " " : "", c->arch ? c->arch : "", c->name, v->text);
    check_print_program("reproduce");
    char opts[512];
    case_options(c, opts, sizeof opts);
    printf(" %s\n", opts);
    fflush(stdout);
}

void bo_fail(const char *fmt, ...)
{
    failed++;
    fputs("FAIL ", stdout);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

void bo_skip(const char *fmt, ...)
{
    skipped++;
    fputs("skip ", stdout);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
}

#ifndef BACKEND_OPS_CUDA
void bo_cuda(void) { bo_skip("cuda: this build has no CUDA backend (ATTNRES_CUDA is off)"); }
#endif

static int usage(const char *why)
{
    fprintf(stderr,
            "backend_ops: %s\n"
            "usage: backend_ops [--backend B] [--op O] [--dtype D] [--form F] [--heads H] [--variant V]\n"
            "                   [--arch A] [--case C] [--sample | --all] [--list] [--verbose]\n"
            "  filters but --heads are shell patterns; see tests/backend_ops/backend_ops.c\n",
            why);
    return 2;
}

int main(int argc, char **argv)
{
    /* check.h keeps the program's path and the ATTNRES_ variables it
     * started with, for the reproduce line. */
    char *self[] = {argv[0], NULL};
    int one = 1;
    check_args(&one, self);
    for (int i = 1; i < argc; i++) {
        static const struct {
            const char *name;
            const char **to;
        } filters[] = {{"--backend", &f_backend}, {"--op", &f_op},           {"--dtype", &f_dtype},
                       {"--form", &f_form},       {"--variant", &f_variant}, {"--arch", &f_arch},
                       {"--case", &f_case}};
        int taken = 0;
        for (size_t k = 0; k < sizeof filters / sizeof filters[0] && !taken; k++)
            if (strcmp(argv[i], filters[k].name) == 0) {
                if (i + 1 >= argc)
                    return usage("a filter needs a value");
                *filters[k].to = argv[++i];
                taken = 1;
            }
        if (taken)
            continue;
        if (strcmp(argv[i], "--heads") == 0 && i + 1 < argc) {
            char *end;
            f_heads = (int)strtol(argv[++i], &end, 10);
            if (*end || f_heads < 1)
                return usage("--heads takes a positive number");
        } else if (strcmp(argv[i], "--sample") == 0) {
            bo_sample = 1;
        } else if (strcmp(argv[i], "--all") == 0) {
            bo_sample = 0;
        } else if (strcmp(argv[i], "--list") == 0) {
            bo_listing = 1;
        } else if (strcmp(argv[i], "--verbose") == 0) {
            bo_verbose = 1;
        } else {
            char why[300];
            snprintf(why, sizeof why, "unknown option '%s'", argv[i]);
            return usage(why);
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (bo_op_wanted("cpu", NULL)) {
        bo_cpu_variants();
        bo_cpu_builtins();
    }
    if (bo_op_wanted("cuda", NULL))
        bo_cuda();
    if (bo_listing) {
        if (!listed && !skipped)
            return usage("no case matches the filters");
        return 0;
    }
    printf("backend_ops: %d case(s) passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (failed)
        return 1;
    if (!passed)
        return skipped ? 77 : usage("no case matches the filters");
    return 0;
}
