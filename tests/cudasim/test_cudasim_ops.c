/*
 * test_cudasim_ops.c - the simulator's own tests, part 1: hand-written PTX
 * per opcode group with known results, checked bit for bit. Every expected value below is written out from the PTX ISA's
 * semantics, not computed by the code under test.
 *
 * Scalar cases run in one thread: each case loads its inputs a, b, c from
 * the input buffer into %rd11..%rd13 (64-bit), %r1..%r3 (their low 32 bits)
 * and %rs1..%rs3 (their low 16 bits), runs its snippet, and stores %r90
 * (32-bit result), %rd90 (64-bit) or %rs90 (16-bit) to out[case]. The warp
 * level cases (shuffles, barriers, divergence, shared memory, parameters,
 * grids) are whole kernels of their own. The last group checks that the
 * module loader refuses what it does not implement, naming it and its line.
 *
 * Prints one line per failed check and a closing "N passed, M failed".
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/check.h"
#include "cudasim.h"
#include "ptx_numerics.h"
/* The case tables leave the approximation fields of exact cases unset. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#include "selftest.h"

/* ---- harness ------------------------------------------------------------ */

/* A launch: a PTX module, its kernel, in/out buffers given as the first two
 * parameters (any further parameters follow in params). */
typedef struct job {
    const char *ptx, *kernel;
    unsigned grid[3], block[3], shared;
    const void *in;
    size_t in_bytes;
    void *out;
    size_t out_bytes;
    void **extra_params; /* params after (in, out), NULL-terminated; or NULL */
    void **params;       /* when set, replaces (in, out, extra) entirely */
    CUresult load_rc, launch_rc, sync_rc;
    char load_msg[2048];
} job;

/* Runs j; returns the first nonzero of load/launch/synchronise (0 when the
 * kernel ran), with j->out filled from the device on success. The output
 * buffer starts as 0xAB bytes so that a missing store shows. A fault is
 * cleared (the primary context reset) before returning. */
static CUresult run_job(job *j)
{
    CUmodule mod = NULL;
    CUfunction fn = NULL;
    CUdeviceptr din = 0, dout = 0;
    j->load_rc = cuModuleLoadData(&mod, j->ptx);
    j->launch_rc = j->sync_rc = CUDA_SUCCESS;
    if (j->load_rc) {
        snprintf(j->load_msg, sizeof j->load_msg, "%s", err_text(j->load_rc));
        return j->load_rc;
    }
    CUresult r = cuModuleGetFunction(&fn, mod, j->kernel);
    if (r) {
        cuModuleUnload(mod);
        return j->load_rc = r;
    }
    size_t inb = j->in_bytes ? j->in_bytes : 8, outb = j->out_bytes ? j->out_bytes : 8;
    if (cuMemAlloc_v2(&din, inb) || cuMemAlloc_v2(&dout, outb)) {
        fprintf(stderr, "cuMemAlloc failed\n");
        exit(2);
    }
    if (j->in_bytes)
        cuMemcpyHtoD_v2(din, j->in, j->in_bytes);
    unsigned char *pat = malloc(outb);
    memset(pat, 0xab, outb);
    cuMemcpyHtoD_v2(dout, pat, outb);
    free(pat);
    void *params[16];
    void **pp = j->params;
    if (!pp) {
        int n = 0;
        params[n++] = &din;
        params[n++] = &dout;
        for (int k = 0; j->extra_params && j->extra_params[k] && n < 15; k++)
            params[n++] = j->extra_params[k];
        params[n] = NULL;
        pp = params;
    }
    j->launch_rc = cuLaunchKernel(fn, j->grid[0] ? j->grid[0] : 1, j->grid[1] ? j->grid[1] : 1,
                                  j->grid[2] ? j->grid[2] : 1, j->block[0] ? j->block[0] : 1,
                                  j->block[1] ? j->block[1] : 1, j->block[2] ? j->block[2] : 1, j->shared, NULL, pp,
                                  NULL);
    if (!j->launch_rc)
        j->sync_rc = ctx_sync();
    if (!j->launch_rc && !j->sync_rc && j->out)
        j->sync_rc = cuMemcpyDtoH_v2(j->out, dout, j->out_bytes);
    r = j->launch_rc ? j->launch_rc : j->sync_rc;
    if (r) {
        snprintf(j->load_msg, sizeof j->load_msg, "%s", err_text(r));
        ctx_reset();
    }
    cuMemFree_v2(din);
    cuMemFree_v2(dout);
    cuModuleUnload(mod);
    return r;
}

#define HEAD ".version 8.0\n.target sm_90\n.address_size 64\n"
#define REGS                                                                                    \
    ".reg .b16 %rs<100>;\n.reg .b32 %r<100>;\n.reg .b64 %rd<100>;\n.reg .pred %p<20>;\n"
/* An entry taking (in, out) as global pointers in %rd1, %rd2. */
#define ENTRY_TAIL                                                                              \
    "(.param .u64 pin, .param .u64 pout)\n{\n" REGS                                             \
    "ld.param.u64 %rd1, [pin];\nld.param.u64 %rd2, [pout];\n"                                   \
    "cvta.to.global.u64 %rd1, %rd1;\ncvta.to.global.u64 %rd2, %rd2;\n"
#define ENTRY(name) ".visible .entry " name ENTRY_TAIL

/* ---- scalar cases --------------------------------------------------------- */

enum { W16 = 16, W32 = 32, W64 = 64, WAPPROX = 1 };

typedef struct scase {
    const char *name;
    const char *code; /* leaves the result in %r90 / %rd90 / %rs90 */
    uint64_t a, b, c;
    uint64_t want;
    int width;        /* W16, W32, W64, or WAPPROX: f32 in %r90 within tol */
    double exact, tol; /* WAPPROX: the exact value and the relative tolerance */
} scase;

/* Builds one single-thread kernel running every case of the group. */
static void run_scalar_group(const char *group, const scase *cs, int n)
{
    size_t cap = 4096 + (size_t)n * 1024, len = 0;
    char *ptx = malloc(cap);
    len += (size_t)snprintf(ptx + len, cap - len, "%s.visible .entry %s%s", HEAD, group, ENTRY_TAIL);
    for (int i = 0; i < n; i++) {
        const int in_off = 24 * i, out_off = 8 * i;
        len += (size_t)snprintf(ptx + len, cap - len,
                                "// case %d: %s\n"
                                "ld.global.u64 %%rd11, [%%rd1+%d];\nld.global.u64 %%rd12, [%%rd1+%d];\n"
                                "ld.global.u64 %%rd13, [%%rd1+%d];\n"
                                "cvt.u32.u64 %%r1, %%rd11;\ncvt.u32.u64 %%r2, %%rd12;\ncvt.u32.u64 %%r3, %%rd13;\n"
                                "cvt.u16.u64 %%rs1, %%rd11;\ncvt.u16.u64 %%rs2, %%rd12;\ncvt.u16.u64 %%rs3, %%rd13;\n"
                                "%s\n",
                                i, cs[i].name, in_off, in_off + 8, in_off + 16, cs[i].code);
        if (cs[i].width == W64)
            len += (size_t)snprintf(ptx + len, cap - len, "st.global.u64 [%%rd2+%d], %%rd90;\n", out_off);
        else if (cs[i].width == W16)
            len += (size_t)snprintf(ptx + len, cap - len, "st.global.u16 [%%rd2+%d], %%rs90;\n", out_off);
        else
            len += (size_t)snprintf(ptx + len, cap - len, "st.global.u32 [%%rd2+%d], %%r90;\n", out_off);
    }
    len += (size_t)snprintf(ptx + len, cap - len, "ret;\n}\n");
    uint64_t *in = calloc((size_t)n * 3, 8), *out = calloc((size_t)n, 8);
    for (int i = 0; i < n; i++) {
        in[3 * i] = cs[i].a;
        in[3 * i + 1] = cs[i].b;
        in[3 * i + 2] = cs[i].c;
    }
    job j = {.ptx = ptx, .kernel = group, .in = in, .in_bytes = (size_t)n * 24, .out = out,
             .out_bytes = (size_t)n * 8};
    CUresult r = run_job(&j);
    check(r == CUDA_SUCCESS, "[%s] the group's kernel did not run: %d %s", group, r, j.load_msg);
    if (r == CUDA_SUCCESS) {
        for (int i = 0; i < n; i++) {
            const scase *c = &cs[i];
            if (c->width == WAPPROX) {
                const float got = num_f32_from_bits((uint32_t)out[i]);
                const double rel = fabs(((double)got - c->exact) / c->exact);
                check(rel <= c->tol, "[%s] %s: got %a (0x%08x), exact %a, relative error %.3g > %.3g", group,
                      c->name, (double)got, (uint32_t)out[i], c->exact, rel, c->tol);
                continue;
            }
            const uint64_t mask = c->width == W64 ? ~0ull : c->width == W16 ? 0xffffull : 0xffffffffull;
            const uint64_t got = out[i] & mask, want = c->want & mask;
            check(got == want, "[%s] %s: `%s` gave 0x%llx, want 0x%llx", group, c->name, c->code,
                  (unsigned long long)got, (unsigned long long)want);
        }
    }
    free(in);
    free(out);
    free(ptx);
}

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define SETP(cmp) "setp." cmp " %p1, %r1, %r2;\nselp.u32 %r90, 1, 0, %p1;"

static void test_integer(void)
{
    static const scase c32[] = {
        {"add.s32 wraps", "add.s32 %r90, %r1, %r2;", 0x7fffffff, 1, 0, 0x80000000, W32},
        {"sub.s32 wraps", "sub.s32 %r90, %r1, %r2;", 0x80000000, 1, 0, 0x7fffffff, W32},
        {"add.u32 carries out", "add.u32 %r90, %r1, %r2;", 0xffffffff, 2, 0, 1, W32},
        {"add.sat.s32 clamps", "add.sat.s32 %r90, %r1, %r2;", 0x7fffffff, 1, 0, 0x7fffffff, W32},
        {"sub.sat.s32 clamps", "sub.sat.s32 %r90, %r1, %r2;", 0x80000000, 1, 0, 0x80000000, W32},
        {"mul.lo.s32", "mul.lo.s32 %r90, %r1, %r2;", 0x7fffffff, 0x7fffffff, 0, 0x00000001, W32},
        {"mul.hi.s32 max*max", "mul.hi.s32 %r90, %r1, %r2;", 0x7fffffff, 0x7fffffff, 0, 0x3fffffff, W32},
        {"mul.hi.s32 min*max", "mul.hi.s32 %r90, %r1, %r2;", 0x80000000, 0x7fffffff, 0, 0xc0000000, W32},
        {"mul.hi.s32 -1*-1", "mul.hi.s32 %r90, %r1, %r2;", 0xffffffff, 0xffffffff, 0, 0, W32},
        {"mul.hi.u32", "mul.hi.u32 %r90, %r1, %r2;", 0xffffffff, 0xffffffff, 0, 0xfffffffe, W32},
        {"mad.lo.s32", "mad.lo.s32 %r90, %r1, %r2, %r3;", 7, 0xfffffff9, 0x7fffffff, 0x7fffffce, W32},
        {"mad.hi.u32", "mad.hi.u32 %r90, %r1, %r2, %r3;", 0xffffffff, 0xffffffff, 1, 0xffffffff, W32},
        {"div.s32 rounds toward zero", "div.s32 %r90, %r1, %r2;", 0xfffffff9, 3, 0, 0xfffffffe, W32},
        {"rem.s32 takes the dividend's sign", "rem.s32 %r90, %r1, %r2;", 0xfffffff9, 3, 0, 0xffffffff, W32},
        {"rem.s32 positive dividend", "rem.s32 %r90, %r1, %r2;", 7, 0xfffffffd, 0, 1, W32},
        {"div.u32", "div.u32 %r90, %r1, %r2;", 0xfffffff9, 3, 0, 0x55555553, W32},
        {"rem.u32", "rem.u32 %r90, %r1, %r2;", 0xfffffff9, 7, 0, 4, W32},
        {"div.s32 INT_MIN/-1", "div.s32 %r90, %r1, %r2;", 0x80000000, 0xffffffff, 0, 0x80000000, W32},
        {"rem.s32 INT_MIN%-1", "rem.s32 %r90, %r1, %r2;", 0x80000000, 0xffffffff, 0, 0, W32},
        {"min.s32", "min.s32 %r90, %r1, %r2;", 0x80000000, 1, 0, 0x80000000, W32},
        {"min.u32", "min.u32 %r90, %r1, %r2;", 0x80000000, 1, 0, 1, W32},
        {"max.s32", "max.s32 %r90, %r1, %r2;", 0xffffffff, 1, 0, 1, W32},
        {"max.u32", "max.u32 %r90, %r1, %r2;", 0xffffffff, 1, 0, 0xffffffff, W32},
        {"shl.b32 by 31", "shl.b32 %r90, %r1, %r2;", 3, 31, 0, 0x80000000, W32},
        {"shl.b32 by 32 (= width)", "shl.b32 %r90, %r1, %r2;", 1, 32, 0, 0, W32},
        {"shl.b32 by 33", "shl.b32 %r90, %r1, %r2;", 1, 33, 0, 0, W32},
        {"shr.s32 by 4", "shr.s32 %r90, %r1, %r2;", 0x80000000, 4, 0, 0xf8000000, W32},
        {"shr.u32 by 4", "shr.u32 %r90, %r1, %r2;", 0x80000000, 4, 0, 0x08000000, W32},
        {"shr.b32 by 31", "shr.b32 %r90, %r1, %r2;", 0x80000000, 31, 0, 1, W32},
        {"shr.s32 by 33 fills with the sign", "shr.s32 %r90, %r1, %r2;", 0x80000000, 33, 0, 0xffffffff, W32},
        {"shr.s32 by 33, positive", "shr.s32 %r90, %r1, %r2;", 0x7fffffff, 33, 0, 0, W32},
        {"shr.u32 by 32", "shr.u32 %r90, %r1, %r2;", 0x80000000, 32, 0, 0, W32},
        {"shl.b32 by an immediate", "shl.b32 %r90, %r1, 1;", 0x40000001, 0, 0,
         0x80000002, W32},
        {"and.b32", "and.b32 %r90, %r1, %r2;", 0xf0f0f0f0, 0x0ff00ff0, 0, 0x00f000f0, W32},
        {"or.b32", "or.b32 %r90, %r1, %r2;", 0xf0f0f0f0, 0x0ff00ff0, 0, 0xfff0fff0, W32},
        {"xor.b32", "xor.b32 %r90, %r1, %r2;", 0xf0f0f0f0, 0x0ff00ff0, 0, 0xff00ff00, W32},
        {"not.b32", "not.b32 %r90, %r1;", 0xf0f0f0f0, 0, 0, 0x0f0f0f0f, W32},
        {"and.pred / not.pred", "setp.ne.u32 %p1, %r1, 0;\nsetp.ne.u32 %p2, %r2, 0;\nnot.pred %p3, %p2;\n"
                                "and.pred %p4, %p1, %p3;\nselp.u32 %r90, 1, 0, %p4;", 1, 0, 0, 1, W32},
        {"or.pred / xor.pred", "setp.ne.u32 %p1, %r1, 0;\nsetp.ne.u32 %p2, %r2, 0;\nxor.pred %p3, %p1, %p2;\n"
                               "or.pred %p4, %p3, %p2;\nselp.u32 %r90, 7, 9, %p4;", 1, 1, 0, 7, W32},
        {"bfi.b32 inside", "bfi.b32 %r90, %r1, %r2, 4, 3;", 0xf, 0xffff0000, 0, 0xffff0070, W32},
        {"bfi.b32 clipped at bit 31", "bfi.b32 %r90, %r1, %r2, 28, 8;", 0xffffffff, 0, 0, 0xf0000000, W32},
        {"bfi.b32 zero bits into ones", "bfi.b32 %r90, %r1, %r2, 8, 8;", 0, 0xffffffff, 0, 0xffff00ff, W32},
        {"bfi.b32 len 0 keeps b", "bfi.b32 %r90, %r1, %r2, 8, 0;", 0xffffffff, 0x12345678, 0, 0x12345678, W32},
        {"selp true", "setp.eq.u32 %p1, %r3, 1;\nselp.b32 %r90, %r1, %r2, %p1;", 0x11, 0x22, 1, 0x11, W32},
        {"selp false", "setp.eq.u32 %p1, %r3, 1;\nselp.b32 %r90, %r1, %r2, %p1;", 0x11, 0x22, 0, 0x22, W32},
        {"selp !p", "setp.eq.u32 %p1, %r3, 1;\nselp.b32 %r90, %r1, %r2, !%p1;", 0x11, 0x22, 1, 0x22, W32},
        {"setp.lt.s32", SETP("lt.s32"), 0x80000000, 1, 0, 1, W32},
        {"setp.lt.u32", SETP("lt.u32"), 0x80000000, 1, 0, 0, W32},
        {"setp.hi.u32", SETP("hi.u32"), 0x80000000, 1, 0, 1, W32},
        {"setp.ls.u32", SETP("ls.u32"), 5, 5, 0, 1, W32},
        {"setp.ge.s32", SETP("ge.s32"), 0xffffffff, 0, 0, 0, W32},
        {"setp.ne.b32", SETP("ne.b32"), 3, 3, 0, 0, W32},
        {"setp p|q", "setp.gt.s32 %p1|%p2, %r1, %r2;\nselp.u32 %r4, 1, 0, %p1;\nselp.u32 %r5, 2, 0, %p2;\n"
                     "or.b32 %r90, %r4, %r5;", 1, 2, 0, 2, W32},
        {"setp.and with !c", "setp.eq.u32 %p3, %r3, 1;\nsetp.lt.s32.and %p1|%p2, %r1, %r2, !%p3;\n"
                             "selp.u32 %r4, 1, 0, %p1;\nselp.u32 %r5, 2, 0, %p2;\nor.b32 %r90, %r4, %r5;",
         1, 2, 0, 1, W32},
        {"neg.s32 INT_MIN", "neg.s32 %r90, %r1;", 0x80000000, 0, 0, 0x80000000, W32},
        {"abs.s32", "abs.s32 %r90, %r1;", 0xfffffff9, 0, 0, 7, W32},
        {"bfe.u32", "bfe.u32 %r90, %r1, 4, 8;", 0x12345678, 0, 0, 0x67, W32},
        {"bfe.s32 sign-extends the field", "bfe.s32 %r90, %r1, 4, 8;", 0x00000f80, 0, 0, 0xfffffff8, W32},
    };
    run_scalar_group("int32", c32, N(c32));

    static const scase c64[] = {
        {"add.s64 wraps", "add.s64 %rd90, %rd11, %rd12;", 0x7fffffffffffffffull, 1, 0, 0x8000000000000000ull, W64},
        {"sub.s64 wraps", "sub.s64 %rd90, %rd11, %rd12;", 0x8000000000000000ull, 1, 0, 0x7fffffffffffffffull, W64},
        {"mul.lo.s64", "mul.lo.s64 %rd90, %rd11, %rd12;", 0x7fffffffffffffffull, 0x7fffffffffffffffull, 0, 1, W64},
        {"mul.lo.u64 wraps", "mul.lo.u64 %rd90, %rd11, %rd12;", 0x100000001ull, 0x100000001ull, 0,
         0x0000000200000001ull, W64},
        {"mul.hi.u64", "mul.hi.u64 %rd90, %rd11, %rd12;", ~0ull, ~0ull, 0, 0xfffffffffffffffeull, W64},
        {"mul.hi.s64 -1*-1", "mul.hi.s64 %rd90, %rd11, %rd12;", ~0ull, ~0ull, 0, 0, W64},
        {"mul.hi.s64 min*max", "mul.hi.s64 %rd90, %rd11, %rd12;", 0x8000000000000000ull, 0x7fffffffffffffffull, 0,
         0xc000000000000000ull, W64},
        {"mad.lo.s64", "mad.lo.s64 %rd90, %rd11, %rd12, %rd13;", 0xfffffffffffffff9ull, 3, 100, 79, W64},
        {"div.s64", "div.s64 %rd90, %rd11, %rd12;", 0xfffffffffffffff9ull, 3, 0, 0xfffffffffffffffeull, W64},
        {"rem.s64", "rem.s64 %rd90, %rd11, %rd12;", 0xfffffffffffffff9ull, 3, 0, ~0ull, W64},
        {"div.u64", "div.u64 %rd90, %rd11, %rd12;", 0xfffffffffffffff9ull, 3, 0, 0x5555555555555553ull, W64},
        {"rem.u64", "rem.u64 %rd90, %rd11, %rd12;", 0xfffffffffffffff9ull, 10, 0, 9, W64},
        {"div.s64 INT64_MIN/-1", "div.s64 %rd90, %rd11, %rd12;", 0x8000000000000000ull, ~0ull, 0,
         0x8000000000000000ull, W64},
        {"rem.s64 INT64_MIN%-1", "rem.s64 %rd90, %rd11, %rd12;", 0x8000000000000000ull, ~0ull, 0, 0, W64},
        {"min.s64", "min.s64 %rd90, %rd11, %rd12;", 0x8000000000000000ull, 1, 0, 0x8000000000000000ull, W64},
        {"min.u64", "min.u64 %rd90, %rd11, %rd12;", 0x8000000000000000ull, 1, 0, 1, W64},
        {"max.s64", "max.s64 %rd90, %rd11, %rd12;", ~0ull, 1, 0, 1, W64},
        {"max.u64", "max.u64 %rd90, %rd11, %rd12;", ~0ull, 1, 0, ~0ull, W64},
        {"shl.b64 by 63", "shl.b64 %rd90, %rd11, %r2;", 3, 63, 0, 0x8000000000000000ull, W64},
        {"shl.b64 by 64", "shl.b64 %rd90, %rd11, %r2;", 1, 64, 0, 0, W64},
        {"shr.s64 by 70", "shr.s64 %rd90, %rd11, %r2;", 0x8000000000000000ull, 70, 0, ~0ull, W64},
        {"shr.u64 by 63", "shr.u64 %rd90, %rd11, %r2;", 0x8000000000000000ull, 63, 0, 1, W64},
        {"shr.u64 by 64", "shr.u64 %rd90, %rd11, %r2;", 0x8000000000000000ull, 64, 0, 0, W64},
        {"shr.s64 by 36", "shr.s64 %rd90, %rd11, %r2;", 0x8000000000000000ull, 36, 0, 0xfffffffff8000000ull, W64},
        {"mul.wide.s32", "mul.wide.s32 %rd90, %r1, %r2;", 0xfffffff9, 0x7fffffff, 0, 0xfffffffc80000007ull, W64},
        {"mul.wide.u32", "mul.wide.u32 %rd90, %r1, %r2;", 0xffffffff, 0xffffffff, 0, 0xfffffffe00000001ull, W64},
        {"mul.wide.s32 min*min", "mul.wide.s32 %rd90, %r1, %r2;", 0x80000000, 0x80000000, 0, 0x4000000000000000ull,
         W64},
        {"mad.wide.u32", "mad.wide.u32 %rd90, %r1, %r2, %rd13;", 0xffffffff, 0xffffffff, 1, 0xfffffffe00000002ull,
         W64},
        {"mul.wide.s16", "mul.wide.s16 %r90, %rs1, %rs2;", 0x8000, 0x8000, 0, 0x40000000, W32},
        {"and.b64", "and.b64 %rd90, %rd11, %rd12;", 0xff00ff00ff00ff00ull, 0x0ff00ff00ff00ff0ull, 0,
         0x0f000f000f000f00ull, W64},
        {"not.b64", "not.b64 %rd90, %rd11;", 0xff00ff00ff00ff00ull, 0, 0, 0x00ff00ff00ff00ffull, W64},
        {"neg.s64", "neg.s64 %rd90, %rd11;", 1, 0, 0, ~0ull, W64},
        {"setp.lt.s64", "setp.lt.s64 %p1, %rd11, %rd12;\nselp.u32 %r90, 1, 0, %p1;", 0x8000000000000000ull, 1, 0, 1,
         W32},
        {"setp.lt.u64", "setp.lt.u64 %p1, %rd11, %rd12;\nselp.u32 %r90, 1, 0, %p1;", 0x8000000000000000ull, 1, 0, 0,
         W32},
        {"selp.b64", "setp.eq.u32 %p1, %r3, 0;\nselp.b64 %rd90, %rd11, %rd12, %p1;", 0x1111111122222222ull,
         0x3333333344444444ull, 0, 0x1111111122222222ull, W64},
        /* integer-to-integer conversions */
        {"cvt.s64.s32 sign-extends", "cvt.s64.s32 %rd90, %r1;", 0xfffffff9, 0, 0, 0xfffffffffffffff9ull, W64},
        {"cvt.u64.u32 zero-extends", "cvt.u64.u32 %rd90, %r1;", 0xfffffff9, 0, 0, 0x00000000fffffff9ull, W64},
        {"cvt.u64.s32 sign-extends (source type)", "cvt.u64.s32 %rd90, %r1;", 0xfffffff9, 0, 0,
         0xfffffffffffffff9ull, W64},
        {"cvt.s64.u32 zero-extends (source type)", "cvt.s64.u32 %rd90, %r1;", 0xfffffff9, 0, 0,
         0x00000000fffffff9ull, W64},
        {"cvt.u32.u64 truncates", "cvt.u32.u64 %r90, %rd11;", 0x123456789ull, 0, 0, 0x23456789, W32},
        {"cvt.s32.s16 sign-extends", "cvt.s32.s16 %r90, %rs1;", 0x18001, 0, 0, 0xffff8001, W32},
        {"cvt.u32.u16 zero-extends", "cvt.u32.u16 %r90, %rs1;", 0x18001, 0, 0, 0x00008001, W32},
        {"cvt.u16.u32 truncates", "cvt.u16.u32 %rs90, %r1;", 0x12345, 0, 0, 0x2345, W16},
        {"cvt.s32.s8 sign-extends", "cvt.s32.s8 %r90, %r1;", 0x1ff80, 0, 0, 0xffffff80, W32},
        {"cvt.u32.u8 zero-extends", "cvt.u32.u8 %r90, %r1;", 0x1ff80, 0, 0, 0x00000080, W32},
        {"cvt.s64.s16 sign-extends", "cvt.s64.s16 %rd90, %rs1;", 0x8000, 0, 0, 0xffffffffffff8000ull, W64},
        /* packing moves */
        {"mov.b32 {%rs,%rs}: first is the low half", "mov.b32 %r90, {%rs1, %rs2};", 0x1234, 0xabcd, 0, 0xabcd1234,
         W32},
        {"mov.b64 {%r,%r}", "mov.b64 %rd90, {%r1, %r2};", 0x89abcdef, 0x01234567, 0, 0x0123456789abcdefull, W64},
        {"mov.u32 immediate hex", "mov.u32 %r90, 0xdeadbeef;", 0, 0, 0, 0xdeadbeef, W32},
        {"mov.u64 negative immediate", "mov.u64 %rd90, -2;", 0, 0, 0, 0xfffffffffffffffeull, W64},
    };
    run_scalar_group("int64", c64, N(c64));
}

#define F(x) ((uint64_t)num_f32_bits(x))
#define FNAN 0x7fc00000ull
#define SETPF(cmp) "setp." cmp ".f32 %p1, %r1, %r2;\nselp.u32 %r90, 1, 0, %p1;"

static void test_float(void)
{
    /* 1 + 0.75 ulp: rn and rp round up, rz and rm down; the negative case
     * mirrors it (rm up in magnitude, rp down). */
    const uint64_t one = 0x3f800000, ulp75 = 0x33c00000, mone = 0xbf800000, mulp75 = 0xb3c00000;
    const uint64_t ulp25 = 0x33000000;   /* 0.25 ulp of 1 */
    const uint64_t onep = 0x3f800001;    /* 1 + 2^-23 */
    const uint64_t monep = 0xbf800001;   /* -(1 + 2^-23) */
    const uint64_t mone22 = 0xbf800002;  /* -(1 + 2^-22) */
    const scase cf[] = {
        {"add.rn.f32 1+0.75ulp", "add.rn.f32 %r90, %r1, %r2;", one, ulp75, 0, 0x3f800001, W32},
        {"add.rz.f32 1+0.75ulp", "add.rz.f32 %r90, %r1, %r2;", one, ulp75, 0, 0x3f800000, W32},
        {"add.rm.f32 1+0.75ulp", "add.rm.f32 %r90, %r1, %r2;", one, ulp75, 0, 0x3f800000, W32},
        {"add.rp.f32 1+0.75ulp", "add.rp.f32 %r90, %r1, %r2;", one, ulp75, 0, 0x3f800001, W32},
        {"add.rn.f32 -1-0.75ulp", "add.rn.f32 %r90, %r1, %r2;", mone, mulp75, 0, 0xbf800001, W32},
        {"add.rz.f32 -1-0.75ulp", "add.rz.f32 %r90, %r1, %r2;", mone, mulp75, 0, 0xbf800000, W32},
        {"add.rm.f32 -1-0.75ulp", "add.rm.f32 %r90, %r1, %r2;", mone, mulp75, 0, 0xbf800001, W32},
        {"add.rp.f32 -1-0.75ulp", "add.rp.f32 %r90, %r1, %r2;", mone, mulp75, 0, 0xbf800000, W32},
        {"add.rn.f32 1+0.25ulp", "add.rn.f32 %r90, %r1, %r2;", one, ulp25, 0, 0x3f800000, W32},
        {"add.rp.f32 1+0.25ulp", "add.rp.f32 %r90, %r1, %r2;", one, ulp25, 0, 0x3f800001, W32},
        {"add.f32 (default rn) 1+0.5ulp ties to even", "add.f32 %r90, %r1, %r2;", one, 0x33800000, 0, 0x3f800000,
         W32},
        {"add.f32 (1+ulp)+0.5ulp ties to even (up)", "add.f32 %r90, %r1, %r2;", onep, 0x33800000, 0, 0x3f800002,
         W32},
        {"sub.rm.f32 x-x is -0", "sub.rm.f32 %r90, %r1, %r2;", one, one, 0, 0x80000000, W32},
        {"sub.rn.f32 x-x is +0", "sub.rn.f32 %r90, %r1, %r2;", one, one, 0, 0x00000000, W32},
        {"mul.rn.f32 (1+u)^2", "mul.rn.f32 %r90, %r1, %r2;", onep, onep, 0, 0x3f800002, W32},
        {"mul.rz.f32 (1+u)^2", "mul.rz.f32 %r90, %r1, %r2;", onep, onep, 0, 0x3f800002, W32},
        {"mul.rm.f32 (1+u)^2", "mul.rm.f32 %r90, %r1, %r2;", onep, onep, 0, 0x3f800002, W32},
        {"mul.rp.f32 (1+u)^2", "mul.rp.f32 %r90, %r1, %r2;", onep, onep, 0, 0x3f800003, W32},
        {"mul.rn.f32 -(1+u)(1+u)", "mul.rn.f32 %r90, %r1, %r2;", monep, onep, 0, 0xbf800002, W32},
        {"mul.rz.f32 -(1+u)(1+u)", "mul.rz.f32 %r90, %r1, %r2;", monep, onep, 0, 0xbf800002, W32},
        {"mul.rm.f32 -(1+u)(1+u)", "mul.rm.f32 %r90, %r1, %r2;", monep, onep, 0, 0xbf800003, W32},
        {"mul.rp.f32 -(1+u)(1+u)", "mul.rp.f32 %r90, %r1, %r2;", monep, onep, 0, 0xbf800002, W32},
        {"fma.rn.f32 is fused: (1+u)^2-(1+2u) = 2^-46", "fma.rn.f32 %r90, %r1, %r2, %r3;", onep, onep, mone22,
         0x28800000, W32},
        {"mul.rn then add.rn is not fused", "mul.rn.f32 %r4, %r1, %r2;\nadd.rn.f32 %r90, %r4, %r3;", onep, onep,
         mone22, 0x00000000, W32},
        {"fma.rn.f32 (1+u)^2-1", "fma.rn.f32 %r90, %r1, %r2, %r3;", onep, onep, mone, 0x34800000, W32},
        {"fma.rz.f32 (1+u)^2-1", "fma.rz.f32 %r90, %r1, %r2, %r3;", onep, onep, mone, 0x34800000, W32},
        {"fma.rm.f32 (1+u)^2-1", "fma.rm.f32 %r90, %r1, %r2, %r3;", onep, onep, mone, 0x34800000, W32},
        {"fma.rp.f32 (1+u)^2-1", "fma.rp.f32 %r90, %r1, %r2, %r3;", onep, onep, mone, 0x34800001, W32},
        {"fma.rm.f32 -(1+u)(1+u)+1", "fma.rm.f32 %r90, %r1, %r2, %r3;", monep, onep, one, 0xb4800001, W32},
        {"fma.rp.f32 -(1+u)(1+u)+1", "fma.rp.f32 %r90, %r1, %r2, %r3;", monep, onep, one, 0xb4800000, W32},
        {"div.rn.f32 1/3", "div.rn.f32 %r90, %r1, %r2;", one, F(3.0f), 0, 0x3eaaaaab, W32},
        {"div.rz.f32 1/3", "div.rz.f32 %r90, %r1, %r2;", one, F(3.0f), 0, 0x3eaaaaaa, W32},
        {"div.rp.f32 1/3", "div.rp.f32 %r90, %r1, %r2;", one, F(3.0f), 0, 0x3eaaaaab, W32},
        {"div.rm.f32 1/3", "div.rm.f32 %r90, %r1, %r2;", one, F(3.0f), 0, 0x3eaaaaaa, W32},
        /* ftz: subnormal inputs and results become zero of the same sign */
        {"add.f32 keeps a subnormal", "add.f32 %r90, %r1, %r2;", 0x00000001, 0, 0, 0x00000001, W32},
        {"add.ftz.f32 flushes a subnormal input", "add.ftz.f32 %r90, %r1, %r2;", 0x00000001, 0, 0, 0x00000000, W32},
        {"add.ftz.f32 flushes a negative subnormal input", "add.ftz.f32 %r90, %r1, %r2;", 0x80000001, 0x80000000, 0,
         0x80000000, W32},
        {"mul.f32 gives a subnormal", "mul.rn.f32 %r90, %r1, %r2;", 0x00800000, F(0.5f), 0, 0x00400000, W32},
        {"mul.ftz.f32 flushes a subnormal result", "mul.rn.ftz.f32 %r90, %r1, %r2;", 0x00800000, F(0.5f), 0,
         0x00000000, W32},
        {"mul.ftz.f32 flushes to -0", "mul.rn.ftz.f32 %r90, %r1, %r2;", 0x80800000, F(0.5f), 0, 0x80000000, W32},
        {"fma.rn.ftz.f32 subnormal addend ignored", "fma.rn.ftz.f32 %r90, %r1, %r2, %r3;", 0x00800000, one, 0x007fffff,
         0x00800000, W32},
        {"fma.rn.f32 keeps a subnormal addend", "fma.rn.f32 %r90, %r1, %r2, %r3;", 0x00800000, one, 0x007fffff,
         0x00ffffff, W32},
        /* sat */
        {"add.sat.f32 clamps to 1", "add.sat.f32 %r90, %r1, %r2;", F(0.75f), F(0.5f), 0, 0x3f800000, W32},
        {"add.sat.f32 clamps to +0", "add.sat.f32 %r90, %r1, %r2;", F(-0.5f), F(0.25f), 0, 0x00000000, W32},
        {"mul.sat.f32 NaN gives +0", "mul.sat.f32 %r90, %r1, %r2;", FNAN, one, 0, 0x00000000, W32},
        {"add.sat.f32 in range", "add.sat.f32 %r90, %r1, %r2;", F(0.25f), F(0.5f), 0, F(0.75f), W32},
        /* min/max: a NaN input yields the other; -0 < +0 */
        {"min.f32 NaN,1", "min.f32 %r90, %r1, %r2;", FNAN, one, 0, 0x3f800000, W32},
        {"min.f32 1,NaN", "min.f32 %r90, %r1, %r2;", one, FNAN, 0, 0x3f800000, W32},
        {"max.f32 NaN,-1", "max.f32 %r90, %r1, %r2;", FNAN, mone, 0, 0xbf800000, W32},
        {"max.f32 NaN,NaN is the canonical NaN", "max.f32 %r90, %r1, %r2;", FNAN, 0xffc00001, 0, 0x7fffffff, W32},
        {"min.f32 -0,+0", "min.f32 %r90, %r1, %r2;", 0x80000000, 0, 0, 0x80000000, W32},
        {"min.f32 +0,-0", "min.f32 %r90, %r1, %r2;", 0, 0x80000000, 0, 0x80000000, W32},
        {"max.f32 -0,+0", "max.f32 %r90, %r1, %r2;", 0x80000000, 0, 0, 0x00000000, W32},
        {"max.f32 +0,-0", "max.f32 %r90, %r1, %r2;", 0, 0x80000000, 0, 0x00000000, W32},
        {"min.f32 ordinary", "min.f32 %r90, %r1, %r2;", F(-3.0f), F(2.0f), 0, F(-3.0f), W32},
        {"min.ftz.f32 subnormals flush", "min.ftz.f32 %r90, %r1, %r2;", 0x80000001, 0x00000001, 0, 0x80000000, W32},
        /* setp ordered and unordered */
        {"setp.lt.f32 NaN,1", SETPF("lt"), FNAN, one, 0, 0, W32},
        {"setp.ltu.f32 NaN,1", SETPF("ltu"), FNAN, one, 0, 1, W32},
        {"setp.ltu.f32 0.5,1", SETPF("ltu"), F(0.5f), one, 0, 1, W32},
        {"setp.ltu.f32 2,1", SETPF("ltu"), F(2.0f), one, 0, 0, W32},
        {"setp.ge.f32 NaN,1", SETPF("ge"), FNAN, one, 0, 0, W32},
        {"setp.geu.f32 NaN,1", SETPF("geu"), FNAN, one, 0, 1, W32},
        {"setp.geu.f32 0.5,1", SETPF("geu"), F(0.5f), one, 0, 0, W32},
        {"setp.ne.f32 NaN,NaN", SETPF("ne"), FNAN, FNAN, 0, 0, W32},
        {"setp.neu.f32 NaN,NaN", SETPF("neu"), FNAN, FNAN, 0, 1, W32},
        {"setp.eq.f32 -0,+0", SETPF("eq"), 0x80000000, 0, 0, 1, W32},
        {"setp.nan.f32", SETPF("nan"), one, FNAN, 0, 1, W32},
        {"setp.num.f32", SETPF("num"), one, FNAN, 0, 0, W32},
        /* float to integer: rounding, saturation, NaN to 0 */
        {"cvt.rni.s32.f32 2.5", "cvt.rni.s32.f32 %r90, %r1;", F(2.5f), 0, 0, 2, W32},
        {"cvt.rni.s32.f32 3.5", "cvt.rni.s32.f32 %r90, %r1;", F(3.5f), 0, 0, 4, W32},
        {"cvt.rni.s32.f32 -2.5", "cvt.rni.s32.f32 %r90, %r1;", F(-2.5f), 0, 0, 0xfffffffe, W32},
        {"cvt.rzi.s32.f32 -2.7", "cvt.rzi.s32.f32 %r90, %r1;", F(-2.7f), 0, 0, 0xfffffffe, W32},
        {"cvt.rmi.s32.f32 -2.5", "cvt.rmi.s32.f32 %r90, %r1;", F(-2.5f), 0, 0, 0xfffffffd, W32},
        {"cvt.rpi.s32.f32 2.1", "cvt.rpi.s32.f32 %r90, %r1;", F(2.1f), 0, 0, 3, W32},
        {"cvt.rni.s32.f32 3e9 saturates", "cvt.rni.s32.f32 %r90, %r1;", F(3e9f), 0, 0, 0x7fffffff, W32},
        {"cvt.rni.s32.f32 -3e9 saturates", "cvt.rni.s32.f32 %r90, %r1;", F(-3e9f), 0, 0, 0x80000000, W32},
        {"cvt.rzi.s32.f32 +inf", "cvt.rzi.s32.f32 %r90, %r1;", 0x7f800000, 0, 0, 0x7fffffff, W32},
        {"cvt.rni.s32.f32 NaN is 0", "cvt.rni.s32.f32 %r90, %r1;", FNAN, 0, 0, 0, W32},
        {"cvt.rzi.u32.f32 -1.5 is 0", "cvt.rzi.u32.f32 %r90, %r1;", F(-1.5f), 0, 0, 0, W32},
        {"cvt.rzi.u32.f32 5e9 saturates", "cvt.rzi.u32.f32 %r90, %r1;", F(5e9f), 0, 0, 0xffffffff, W32},
        {"cvt.rzi.u32.f32 NaN is 0", "cvt.rzi.u32.f32 %r90, %r1;", FNAN, 0, 0, 0, W32},
        {"cvt.rni.u32.f32 4294967040", "cvt.rni.u32.f32 %r90, %r1;", 0x4f7fffff, 0, 0, 0xffffff00, W32},
        {"cvt.rni.s64.f32 1e19 saturates", "cvt.rni.s64.f32 %rd90, %r1;", F(1e19f), 0, 0, 0x7fffffffffffffffull,
         W64},
        {"cvt.rni.s64.f32 -1e19 saturates", "cvt.rni.s64.f32 %rd90, %r1;", F(-1e19f), 0, 0, 0x8000000000000000ull,
         W64},
        {"cvt.rzi.u64.f32 NaN is 0", "cvt.rzi.u64.f32 %rd90, %r1;", FNAN, 0, 0, 0, W64},
        {"cvt.rzi.s64.f32 -2^40", "cvt.rzi.s64.f32 %rd90, %r1;", 0xd3800000, 0, 0, 0xffffff0000000000ull, W64},
        {"cvt.rzi.s16.f32 40000 saturates", "cvt.rzi.s16.f32 %rs90, %r1;", F(40000.0f), 0, 0, 0x7fff, W16},
        /* integer to float */
        {"cvt.rn.f32.s32 2^24+1 ties to even", "cvt.rn.f32.s32 %r90, %r1;", 16777217, 0, 0, 0x4b800000, W32},
        {"cvt.rp.f32.s32 2^24+1", "cvt.rp.f32.s32 %r90, %r1;", 16777217, 0, 0, 0x4b800001, W32},
        {"cvt.rn.f32.s32 2^24+3 ties to even (up)", "cvt.rn.f32.s32 %r90, %r1;", 16777219, 0, 0, 0x4b800002, W32},
        {"cvt.rm.f32.s32 -(2^24+3)", "cvt.rm.f32.s32 %r90, %r1;", (uint32_t)-16777219, 0, 0, 0xcb800002, W32},
        {"cvt.rz.f32.s32 -(2^24+3)", "cvt.rz.f32.s32 %r90, %r1;", (uint32_t)-16777219, 0, 0, 0xcb800001, W32},
        {"cvt.rz.f32.u32 2^32-1", "cvt.rz.f32.u32 %r90, %r1;", 0xffffffff, 0, 0, 0x4f7fffff, W32},
        {"cvt.rn.f32.u32 2^32-1", "cvt.rn.f32.u32 %r90, %r1;", 0xffffffff, 0, 0, 0x4f800000, W32},
        {"cvt.rn.f32.s32 -1", "cvt.rn.f32.s32 %r90, %r1;", 0xffffffff, 0, 0, 0xbf800000, W32},
        {"cvt.rn.f32.s64 2^53+1", "cvt.rn.f32.s64 %r90, %rd11;", 0x20000000000001ull, 0, 0, 0x5a000000, W32},
        {"cvt.rn.f32.u64 2^64-1", "cvt.rn.f32.u64 %r90, %rd11;", ~0ull, 0, 0, 0x5f800000, W32},
        /* f32 to f16: ties to even, subnormals, overflow */
        {"cvt.rn.f16.f32 1", "cvt.rn.f16.f32 %rs90, %r1;", one, 0, 0, 0x3c00, W16},
        {"cvt.rn.f16.f32 1+2^-11 ties to even (down)", "cvt.rn.f16.f32 %rs90, %r1;", 0x3f801000, 0, 0, 0x3c00, W16},
        {"cvt.rn.f16.f32 1+3*2^-11 ties to even (up)", "cvt.rn.f16.f32 %rs90, %r1;", 0x3f803000, 0, 0, 0x3c02, W16},
        {"cvt.rn.f16.f32 just above the tie", "cvt.rn.f16.f32 %rs90, %r1;", 0x3f801001, 0, 0, 0x3c01, W16},
        {"cvt.rn.f16.f32 just below the tie", "cvt.rn.f16.f32 %rs90, %r1;", 0x3f800fff, 0, 0, 0x3c00, W16},
        {"cvt.rn.f16.f32 -2", "cvt.rn.f16.f32 %rs90, %r1;", F(-2.0f), 0, 0, 0xc000, W16},
        {"cvt.rn.f16.f32 65504 (max)", "cvt.rn.f16.f32 %rs90, %r1;", F(65504.0f), 0, 0, 0x7bff, W16},
        {"cvt.rn.f16.f32 65519 rounds to max", "cvt.rn.f16.f32 %rs90, %r1;", F(65519.0f), 0, 0, 0x7bff, W16},
        {"cvt.rn.f16.f32 65520 overflows to inf", "cvt.rn.f16.f32 %rs90, %r1;", F(65520.0f), 0, 0, 0x7c00, W16},
        {"cvt.rn.f16.f32 -1e6 to -inf", "cvt.rn.f16.f32 %rs90, %r1;", F(-1e6f), 0, 0, 0xfc00, W16},
        {"cvt.rn.f16.f32 +inf", "cvt.rn.f16.f32 %rs90, %r1;", 0x7f800000, 0, 0, 0x7c00, W16},
        {"cvt.rn.f16.f32 2^-14 (min normal)", "cvt.rn.f16.f32 %rs90, %r1;", 0x38800000, 0, 0, 0x0400, W16},
        {"cvt.rn.f16.f32 2^-24 (min subnormal)", "cvt.rn.f16.f32 %rs90, %r1;", 0x33800000, 0, 0, 0x0001, W16},
        {"cvt.rn.f16.f32 2^-25 ties to even (0)", "cvt.rn.f16.f32 %rs90, %r1;", 0x33000000, 0, 0, 0x0000, W16},
        {"cvt.rn.f16.f32 3*2^-25 ties to even (2)", "cvt.rn.f16.f32 %rs90, %r1;", 0x33c00000, 0, 0, 0x0002, W16},
        {"cvt.rn.f16.f32 just above 2^-25", "cvt.rn.f16.f32 %rs90, %r1;", 0x33000001, 0, 0, 0x0001, W16},
        {"cvt.rn.f16.f32 -2^-24", "cvt.rn.f16.f32 %rs90, %r1;", 0xb3800000, 0, 0, 0x8001, W16},
        {"cvt.rn.f16.f32 1023*2^-24 (max subnormal)", "cvt.rn.f16.f32 %rs90, %r1;", F(1023.0f / 16777216.0f), 0, 0,
         0x03ff, W16},
        {"cvt.rn.f16.f32 (2^-14 - 2^-25) rounds to min normal", "cvt.rn.f16.f32 %rs90, %r1;", 0x387fe000, 0, 0,
         0x0400, W16},
        {"cvt.rn.f16.f32 -0", "cvt.rn.f16.f32 %rs90, %r1;", 0x80000000, 0, 0, 0x8000, W16},
        {"cvt.rn.f16.f32 NaN is the canonical 0x7fff", "cvt.rn.f16.f32 %rs90, %r1;", FNAN, 0, 0, 0x7fff, W16},
        /* f32 to bf16 */
        {"cvt.rn.bf16.f32 1", "cvt.rn.bf16.f32 %rs90, %r1;", one, 0, 0, 0x3f80, W16},
        {"cvt.rn.bf16.f32 tie to even (down)", "cvt.rn.bf16.f32 %rs90, %r1;", 0x3f808000, 0, 0, 0x3f80, W16},
        {"cvt.rn.bf16.f32 tie to even (up)", "cvt.rn.bf16.f32 %rs90, %r1;", 0x3f818000, 0, 0, 0x3f82, W16},
        {"cvt.rn.bf16.f32 above the tie", "cvt.rn.bf16.f32 %rs90, %r1;", 0x3f808001, 0, 0, 0x3f81, W16},
        {"cvt.rn.bf16.f32 negative tie", "cvt.rn.bf16.f32 %rs90, %r1;", 0xbf818000, 0, 0, 0xbf82, W16},
        {"cvt.rn.bf16.f32 FLT_MAX overflows to inf", "cvt.rn.bf16.f32 %rs90, %r1;", 0x7f7fffff, 0, 0, 0x7f80, W16},
        {"cvt.rn.bf16.f32 subnormal tie", "cvt.rn.bf16.f32 %rs90, %r1;", 0x00018000, 0, 0, 0x0002, W16},
        {"cvt.rn.bf16.f32 NaN is the canonical 0x7fff", "cvt.rn.bf16.f32 %rs90, %r1;", 0xffc12345, 0, 0, 0x7fff,
         W16},
        {"cvt.rn.bf16.f32 NaN with low payload only", "cvt.rn.bf16.f32 %rs90, %r1;", 0x7f800001, 0, 0, 0x7fff, W16},
        {"cvt.rn.bf16x2.f32: a in the upper half", "cvt.rn.bf16x2.f32 %r90, %r1, %r2;", one, F(2.0f), 0,
         0x3f804000, W32},
        {"cvt.rn.bf16x2.f32 rounds both", "cvt.rn.bf16x2.f32 %r90, %r1, %r2;", 0x3f818000, 0x3f808001, 0,
         0x3f823f81, W32},
        {"cvt.rn.f16x2.f32: a in the upper half", "cvt.rn.f16x2.f32 %r90, %r1, %r2;", one, F(-2.0f), 0, 0x3c00c000,
         W32},
        /* widening */
        {"cvt.f32.f16 1", "cvt.f32.f16 %r90, %rs1;", 0x3c00, 0, 0, 0x3f800000, W32},
        {"cvt.f32.f16 min subnormal", "cvt.f32.f16 %r90, %rs1;", 0x0001, 0, 0, 0x33800000, W32},
        {"cvt.f32.f16 max subnormal", "cvt.f32.f16 %r90, %rs1;", 0x83ff, 0, 0, 0xb87fc000, W32},
        {"cvt.f32.f16 -65504", "cvt.f32.f16 %r90, %rs1;", 0xfbff, 0, 0, 0xc77fe000, W32},
        {"cvt.f32.f16 -inf", "cvt.f32.f16 %r90, %rs1;", 0xfc00, 0, 0, 0xff800000, W32},
        {"cvt.f32.bf16", "cvt.f32.bf16 %r90, %rs1;", 0x3f81, 0, 0, 0x3f810000, W32},
        {"cvt.f32.bf16 negative subnormal", "cvt.f32.bf16 %r90, %rs1;", 0x8001, 0, 0, 0x80010000, W32},
        {"cvt.rni.f32.f32 2.5", "cvt.rni.f32.f32 %r90, %r1;", F(2.5f), 0, 0, F(2.0f), W32},
        {"cvt.rmi.f32.f32 -0.5", "cvt.rmi.f32.f32 %r90, %r1;", F(-0.5f), 0, 0, F(-1.0f), W32},
        {"cvt.ftz.f32.f32 flushes", "cvt.ftz.f32.f32 %r90, %r1;", 0x80000005, 0, 0, 0x80000000, W32},
        /* neg/abs on floats are sign-bit operations */
        {"abs.f32 -0", "abs.f32 %r90, %r1;", 0x80000000, 0, 0, 0, W32},
        {"neg.f32 +0", "neg.f32 %r90, %r1;", 0, 0, 0, 0x80000000, W32},
        /* approximations within their documented error */
        {"ex2.approx.ftz.f32 0.5", "ex2.approx.ftz.f32 %r90, %r1;", F(0.5f), 0, 0, 0, WAPPROX, 1.4142135623730951,
         0x1p-22},
        {"ex2.approx.ftz.f32 -10.25", "ex2.approx.ftz.f32 %r90, %r1;", F(-10.25f), 0, 0, 0, WAPPROX, 0,
         0x1p-22}, /* exact filled in below */
        {"ex2.approx.ftz.f32 20.3", "ex2.approx.ftz.f32 %r90, %r1;", F(20.3f), 0, 0, 0, WAPPROX, 0,
         0x1p-22}, /* exact filled in below */
        {"ex2.approx.f32 0", "ex2.approx.f32 %r90, %r1;", 0, 0, 0, 0x3f800000, W32},
        {"ex2.approx.ftz.f32 -inf is +0", "ex2.approx.ftz.f32 %r90, %r1;", 0xff800000, 0, 0, 0, W32},
        {"rsqrt.approx.f32 2", "rsqrt.approx.f32 %r90, %r1;", F(2.0f), 0, 0, 0, WAPPROX, 0.70710678118654752,
         0x1p-22},
        {"rsqrt.approx.f32 1e-30", "rsqrt.approx.ftz.f32 %r90, %r1;", F(1e-30f), 0, 0, 0, WAPPROX, 0,
         0x1p-22}, /* exact filled in below */
        {"rsqrt.approx.f32 +0 is +inf", "rsqrt.approx.f32 %r90, %r1;", 0, 0, 0, 0x7f800000, W32},
        {"rsqrt.approx.f32 -1 is NaN", "rsqrt.approx.f32 %r90, %r1;\nsetp.nan.f32 %p1, %r90, %r90;\n"
                                       "selp.u32 %r90, 1, 0, %p1;", F(-1.0f), 0, 0, 1, W32},
        {"div.approx.f32 1/3", "div.approx.f32 %r90, %r1, %r2;", one, F(3.0f), 0, 0, WAPPROX, 1.0 / 3.0, 0x1p-22},
        {"div.approx.f32 7/1e30", "div.approx.f32 %r90, %r1, %r2;", F(7.0f), F(1e30f), 0, 0, WAPPROX, 0, 0x1p-22},
        {"div.approx.f32 |b| > 2^126 gives 0", "div.approx.f32 %r90, %r1, %r2;", one, 0x7f000000, 0, 0, W32},
        {"div.approx.f32 inf/|b| > 2^126 gives NaN",
         "div.approx.f32 %r4, %r1, %r2;\nsetp.nan.f32 %p1, %r4, %r4;\nselp.u32 %r90, 1, 0, %p1;", 0x7f800000,
         0x7f000000, 0, 1, W32},
        {"div.full.f32 1/3 within 2 ulp", "div.full.f32 %r90, %r1, %r2;", one, F(3.0f), 0, 0, WAPPROX, 1.0 / 3.0,
         0x1p-22},
        {"sqrt.rn.f32 2", "sqrt.rn.f32 %r90, %r1;", F(2.0f), 0, 0, 0x3fb504f3, W32},
        {"sqrt.rp.f32 2", "sqrt.rp.f32 %r90, %r1;", F(2.0f), 0, 0, 0x3fb504f4, W32},
        {"rcp.rn.f32 3", "rcp.rn.f32 %r90, %r1;", F(3.0f), 0, 0, 0x3eaaaaab, W32},
        /* f64 */
        {"add.rn.f64 1+0.75ulp", "add.rn.f64 %rd90, %rd11, %rd12;", 0x3ff0000000000000ull, 0x3ca8000000000000ull, 0,
         0x3ff0000000000001ull, W64},
        {"add.rz.f64 1+0.75ulp", "add.rz.f64 %rd90, %rd11, %rd12;", 0x3ff0000000000000ull, 0x3ca8000000000000ull, 0,
         0x3ff0000000000000ull, W64},
        {"fma.rn.f64", "fma.rn.f64 %rd90, %rd11, %rd12, %rd13;", 0x3ff0000000000001ull, 0x3ff0000000000001ull,
         0xbff0000000000002ull, 0x3970000000000000ull, W64},
        {"cvt.rn.f32.f64 ties to even", "cvt.rn.f32.f64 %r90, %rd11;", 0x3ff0000010000000ull, 0, 0, 0x3f800000,
         W32},
        {"cvt.rp.f32.f64", "cvt.rp.f32.f64 %r90, %rd11;", 0x3ff0000000000001ull, 0, 0, 0x3f800001, W32},
        {"cvt.f64.f32", "cvt.f64.f32 %rd90, %r1;", 0x3f800001, 0, 0, 0x3ff0000020000000ull, W64},
    };
    scase *c = malloc(sizeof cf);
    memcpy(c, cf, sizeof cf);
    for (int i = 0; i < N(cf); i++) {
        if (c[i].width != WAPPROX || c[i].exact != 0)
            continue;
        if (strstr(c[i].name, "ex2"))
            c[i].exact = exp2((double)num_f32_from_bits((uint32_t)c[i].a));
        else if (strstr(c[i].name, "rsqrt"))
            c[i].exact = 1.0 / sqrt((double)num_f32_from_bits((uint32_t)c[i].a));
        else
            c[i].exact = (double)num_f32_from_bits((uint32_t)c[i].a) / (double)num_f32_from_bits((uint32_t)c[i].b);
    }
    run_scalar_group("float", c, N(cf));
    free(c);
}

/* Loads of signed sub-word types sign-extend into a wider destination. */
static void test_loads_stores(void)
{
    static const char ptx[] = HEAD ENTRY("ldst")
        "mov.u32 %r10, %tid.x;\n"
        /* v4 and v2 loads and stores, with offsets */
        "ld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1+16];\n"
        "st.global.v4.u32 [%rd2], {%r4, %r3, %r2, %r1};\n"
        "ld.global.v2.u64 {%rd10, %rd11}, [%rd1+32];\n"
        "st.global.v2.u64 [%rd2+16], {%rd11, %rd10};\n"
        "ld.global.v2.u32 {%r5, %r6}, [%rd1+8];\n"
        "st.global.v2.u32 [%rd2+32], {%r6, %r5};\n"
        "ld.global.v4.u16 {%rs1, %rs2, %rs3, %rs4}, [%rd1];\n"
        "st.global.v4.u16 [%rd2+40], {%rs2, %rs1, %rs4, %rs3};\n"
        /* sign and zero extension of sub-word loads into 32-bit registers */
        "ld.global.s8 %r7, [%rd1+7];\n"
        "st.global.u32 [%rd2+48], %r7;\n"
        "ld.global.u8 %r8, [%rd1+7];\n"
        "st.global.u32 [%rd2+52], %r8;\n"
        "ld.global.s16 %r9, [%rd1+6];\n"
        "st.global.u32 [%rd2+56], %r9;\n"
        "ld.global.s32 %rd12, [%rd1+4];\n"
        "st.global.u64 [%rd2+64], %rd12;\n"
        /* sub-word stores write only their bytes */
        "st.global.u8 [%rd2+72], %r1;\n"
        "st.global.u16 [%rd2+74], %r1;\n"
        /* ld.global.nc is a load */
        "ld.global.nc.v4.f32 {%r1, %r2, %r3, %r4}, [%rd1+16];\n"
        "st.global.v4.f32 [%rd2+80], {%r1, %r2, %r3, %r4};\n"
        "ret;\n}\n";
    uint8_t in[48];
    const uint32_t w[12] = {0x44332211, 0x80f7ff88, 0x0000aaaa, 0x0000bbbb, 0x11111111, 0x22222222,
                            0x33333333, 0x44444444, 0x55555555, 0x66666666, 0x77777777, 0x88888888};
    memcpy(in, w, sizeof in);
    uint32_t out[24];
    job j = {.ptx = ptx, .kernel = "ldst", .in = in, .in_bytes = sizeof in, .out = out, .out_bytes = sizeof out};
    CUresult r = run_job(&j);
    check(r == 0, "[ldst] kernel failed: %d %s", r, j.load_msg);
    if (r)
        return;
    const uint32_t want[24] = {
        0x44444444, 0x33333333, 0x22222222, 0x11111111,     /* v4 reversed */
        0x77777777, 0x88888888, 0x55555555, 0x66666666,     /* v2.u64 swapped */
        0x0000bbbb, 0x0000aaaa,                             /* v2.u32 swapped */
        0x22114433, 0xff8880f7,                             /* v4.u16 pairs swapped */
        0xffffff80,                                         /* ld.s8 of 0x80 */
        0x00000080,                                         /* ld.u8 */
        0xffff80f7,                                         /* ld.s16 of 0x80f7 */
        0xabababab,                                         /* (unused word) */
        0x80f7ff88, 0xffffffff,                             /* ld.s32 into 64 bits */
        0x1111abab | 0x00000000, 0xabababab,                /* st.u8 then st.u16: bytes 72, 74-75 */
        0x11111111, 0x22222222, 0x33333333, 0x44444444,     /* nc v4 */
    };
    /* word 18 (bytes 72..75): byte 72 = 0x11 (low byte of %r1 = 0x11111111),
     * byte 73 untouched (0xab), bytes 74..75 = 0x1111. */
    uint32_t want18 = 0x1111ab11;
    for (int i = 0; i < 24; i++) {
        if (i == 15 || i == 19)
            continue;
        const uint32_t wv = i == 18 ? want18 : want[i];
        check(out[i] == wv, "[ldst] word %d: got 0x%08x, want 0x%08x", i, out[i], wv);
    }
}

/* ---- warp-level kernels ---------------------------------------------------- */

/* Shuffles: each lane holds 100 + lane; every variant stores the value and
 * the predicate (1/0) per lane. */
static void test_shuffles(void)
{
    static const char ptx[] = HEAD ENTRY("shfl")
        "mov.u32 %r1, %laneid;\n"
        "add.u32 %r2, %r1, 100;\n"
        "mul.wide.u32 %rd3, %r1, 8;\n"
        "add.u64 %rd4, %rd2, %rd3;\n"
        /* 0: up 3, full warp (c = 0) */
        "shfl.sync.up.b32 %r3|%p1, %r2, 3, 0, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+0], {%r3, %r4};\n"
        /* 1: down 5, full warp (c = 0x1f) */
        "shfl.sync.down.b32 %r3|%p1, %r2, 5, 0x1f, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+256], {%r3, %r4};\n"
        /* 2: bfly 1 */
        "shfl.sync.bfly.b32 %r3|%p1, %r2, 1, 0x1f, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+512], {%r3, %r4};\n"
        /* 3: idx 7 */
        "shfl.sync.idx.b32 %r3|%p1, %r2, 7, 0x1f, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+768], {%r3, %r4};\n"
        /* 4: down 2 within segments of 8 (c = (32-8)<<8 | 0x1f) */
        "shfl.sync.down.b32 %r3|%p1, %r2, 2, 0x181f, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+1024], {%r3, %r4};\n"
        /* 5: up 1 within segments of 8 (c = (32-8)<<8) */
        "shfl.sync.up.b32 %r3|%p1, %r2, 1, 0x1800, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+1280], {%r3, %r4};\n"
        /* 6: idx 3 within segments of 8 */
        "shfl.sync.idx.b32 %r3|%p1, %r2, 3, 0x181f, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+1536], {%r3, %r4};\n"
        /* 7: bfly 4 within segments of 4 (lane ^ 4 leaves the segment) */
        "shfl.sync.bfly.b32 %r3|%p1, %r2, 4, 0x1c1f, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+1792], {%r3, %r4};\n"
        /* 8: idx by a lane-dependent source, register operands for b and c */
        "sub.u32 %r5, 31, %r1;\nmov.u32 %r6, 0x1f;\n"
        "shfl.sync.idx.b32 %r3|%p1, %r2, %r5, %r6, 0xffffffff;\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+2048], {%r3, %r4};\n"
        /* 9: partial membermasks on the two sides of a divergent branch */
        "setp.lt.u32 %p2, %r1, 16;\n"
        "@%p2 bra LOW;\n"
        "shfl.sync.bfly.b32 %r3|%p1, %r2, 4, 0x1f, 0xffff0000;\n"
        "bra.uni JOIN;\n"
        "LOW:\n"
        "shfl.sync.bfly.b32 %r3|%p1, %r2, 8, 0x1f, 0x0000ffff;\n"
        "JOIN:\n"
        "selp.u32 %r4, 1, 0, %p1;\nst.global.v2.u32 [%rd4+2304], {%r3, %r4};\n"
        /* 10: a partial mask with the predicate-guarded lanes only */
        "and.b32 %r7, %r1, 1;\nsetp.eq.u32 %p3, %r7, 0;\n"
        "mov.u32 %r3, 0;\nmov.u32 %r4, 9;\n"
        "@%p3 shfl.sync.idx.b32 %r3, %r2, 4, 0x1f, 0x55555555;\n"
        "st.global.v2.u32 [%rd4+2560], {%r3, %r4};\n"
        "ret;\n}\n";
    enum { V = 11 };
    uint32_t out[V * 64];
    job j = {.ptx = ptx, .kernel = "shfl", .block = {32, 1, 1}, .out = out, .out_bytes = sizeof out};
    CUresult r = run_job(&j);
    check(r == 0, "[shfl] kernel failed: %d %s", r, j.load_msg);
    if (r)
        return;
    static const char *const names[V] = {"up 3",           "down 5",        "bfly 1",      "idx 7",
                                         "down 2 width 8", "up 1 width 8",  "idx 3 width 8", "bfly 4 width 4",
                                         "idx 31-lane",    "partial masks", "guarded idx"};
    for (int v = 0; v < V; v++) {
        int bad = 0;
        for (int l = 0; l < 32 && !bad; l++) {
            int src, p = 1;
            switch (v) {
            case 0: src = l - 3; p = src >= 0; break;
            case 1: src = l + 5; p = src <= 31; break;
            case 2: src = l ^ 1; break;
            case 3: src = 7; break;
            case 4: src = l + 2; p = src <= (l | 7); break;
            case 5: src = l - 1; p = src >= (l & ~7); break;
            case 6: src = (l & ~7) | 3; break;
            case 7: src = l ^ 4; p = src <= (l | 3); break;
            case 8: src = 31 - l; break;
            case 9: src = l < 16 ? l ^ 8 : l ^ 4; break;
            default: src = 4; p = 9; break;
            }
            if (!p)
                src = l;
            uint32_t wv = 100u + (uint32_t)src, wp = (uint32_t)p;
            if (v == 10 && (l & 1))
                wv = 0; /* guarded off: %r3 keeps 0 */
            if (v == 10)
                wp = 9;
            const uint32_t gv = out[v * 64 + 2 * l], gp = out[v * 64 + 2 * l + 1];
            if (gv != wv || gp != wp) {
                check(0, "[shfl %s] lane %d: got value %u pred %u, want %u pred %u", names[v], l, gv, gp, wv, wp);
                bad = 1;
            }
        }
        if (!bad)
            check(1, "%s", "");
    }
}

/* bar.sync with a shared-memory exchange across warps; static and dynamic
 * shared memory; the dynamic window follows the static variables. */
static void test_shared_and_barriers(void)
{
    static const char ptx[] = HEAD
        ".extern .shared .align 16 .b8 dsm[];\n"
        ENTRY("xchg")
        ".shared .align 4 .b32 sbuf[96];\n"
        "mov.u32 %r1, %tid.x;\n"
        "mov.u32 %r2, %ntid.x;\n"
        "mul.lo.u32 %r3, %r1, 3;\nadd.u32 %r3, %r3, 1;\n"
        "shl.b32 %r4, %r1, 2;\n"
        "mov.u32 %r5, sbuf;\n"
        "add.u32 %r6, %r5, %r4;\n"
        "st.shared.u32 [%r6], %r3;\n"
        /* dynamic: dsm[tid] = tid ^ 0x5a5a */
        "mov.u32 %r7, dsm;\n"
        "add.u32 %r8, %r7, %r4;\n"
        "xor.b32 %r9, %r1, 0x5a5a;\n"
        "st.shared.u32 [%r8], %r9;\n"
        "bar.sync 0;\n"
        /* read the mirror thread's values */
        "sub.u32 %r10, %r2, 1;\nsub.u32 %r10, %r10, %r1;\nshl.b32 %r10, %r10, 2;\n"
        "add.u32 %r11, %r5, %r10;\nld.shared.u32 %r12, [%r11];\n"
        "add.u32 %r13, %r7, %r10;\nld.shared.u32 %r14, [%r13];\n"
        "mul.wide.u32 %rd3, %r1, 16;\nadd.u64 %rd4, %rd2, %rd3;\n"
        "st.global.v4.u32 [%rd4], {%r12, %r14, %r7, %r5};\n"
        "bar.sync 0;\n"
        /* a second round, after the barrier, overwriting */
        "st.shared.u32 [%r6], %r1;\n"
        "barrier.sync.aligned 0;\n"
        "ld.shared.u32 %r15, [%r11];\n"
        "st.global.u32 [%rd4+12], %r15;\n"
        "ret;\n}\n";
    enum { T = 96 };
    uint32_t out[T * 4];
    job j = {.ptx = ptx, .kernel = "xchg", .block = {T, 1, 1}, .shared = T * 4, .out = out, .out_bytes = sizeof out};
    CUresult r = run_job(&j);
    check(r == 0, "[shared exchange] kernel failed: %d %s", r, j.load_msg);
    if (r)
        return;
    int bad = 0;
    for (int t = 0; t < T && !bad; t++) {
        const uint32_t m = (uint32_t)(T - 1 - t);
        const uint32_t *o = out + 4 * t;
        if (o[0] != m * 3 + 1 || o[1] != (m ^ 0x5a5a) || o[3] != m) {
            check(0, "[shared exchange] thread %d: got %u %u %u, want %u %u %u", t, o[0], o[1], o[3], m * 3 + 1,
                  m ^ 0x5a5a, m);
            bad = 1;
        }
    }
    check(!bad, "[shared exchange] values");
    /* the dynamic window starts after the 384 static bytes, 16-aligned */
    check(out[2] == 384,
          "[dynamic shared] window offset %u, want 384 (after the static sbuf)", out[2]);
}

/* Parameters by value: a struct with mixed members. */
static void test_params(void)
{
    static const char ptx[] = HEAD
        ".visible .entry params(.param .u64 pout, .param .u32 pk, .param .align 8 .b8 s[24], .param .f32 pf)\n{\n"
        REGS
        "ld.param.u64 %rd2, [pout];\ncvta.to.global.u64 %rd2, %rd2;\n"
        "ld.param.u32 %r1, [pk];\n"
        "ld.param.u32 %r2, [s];\n"
        "ld.param.u32 %r3, [s+4];\n"
        "ld.param.u64 %rd3, [s+8];\n"
        "ld.param.v2.u32 {%r4, %r5}, [s+16];\n"
        "ld.param.f32 %r6, [pf];\n"
        "ld.param.u8 %r7, [s+5];\n"
        "st.global.v4.u32 [%rd2], {%r1, %r2, %r3, %r4};\n"
        "st.global.u64 [%rd2+16], %rd3;\n"
        "st.global.v2.u32 [%rd2+24], {%r5, %r6};\n"
        "st.global.u32 [%rd2+32], %r7;\n"
        "ret;\n}\n";
    struct {
        uint32_t a, b;
        uint64_t c;
        uint32_t d, e;
    } s = {0x11111111, 0x2233cc44, 0x0123456789abcdefull, 0xdddddddd, 0xeeeeeeee};
    uint32_t k = 0xcafef00d;
    float pf = -1.5f;
    CUdeviceptr dout;
    uint32_t out[9] = {0};
    CUmodule mod;
    CUfunction fn;
    CUresult r = cuModuleLoadData(&mod, ptx);
    check(r == 0, "[params] load: %d %s", r, r ? err_text(r) : "");
    if (r)
        return;
    r = cuModuleGetFunction(&fn, mod, "params");
    cuMemAlloc_v2(&dout, sizeof out);
    void *pp[] = {&dout, &k, &s, &pf};
    r = r ? r : cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, pp, NULL);
    r = r ? r : cuMemcpyDtoH_v2(out, dout, sizeof out);
    check(r == 0, "[params] run: %d %s", r, r ? err_text(r) : "");
    if (r)
        ctx_reset();
    const uint32_t want[9] = {0xcafef00d, 0x11111111, 0x2233cc44, 0xdddddddd, 0x89abcdef, 0x01234567,
                              0xeeeeeeee, 0xbfc00000, 0xcc};
    for (int i = 0; !r && i < 9; i++)
        check(out[i] == want[i], "[params] word %d: got 0x%08x, want 0x%08x", i, out[i], want[i]);
    cuMemFree_v2(dout);
    cuModuleUnload(mod);
}

/* Divergence: if/else per lane, nested, reconverging before a common store
 * and a full-warp shuffle; a loop with a lane-dependent trip count. */
static void test_divergence(void)
{
    static const char ptx[] = HEAD ENTRY("diverge")
        "mov.u32 %r1, %laneid;\n"
        "and.b32 %r2, %r1, 1;\n"
        "setp.eq.u32 %p1, %r2, 1;\n"
        "@%p1 bra ODD;\n"
        "add.u32 %r3, %r1, 100;\n"          /* even: lane + 100 */
        "setp.lt.u32 %p2, %r1, 8;\n"
        "@!%p2 bra EVEN_HI;\n"
        "add.u32 %r3, %r3, 5000;\n"         /* even and < 8 */
        "EVEN_HI:\n"
        "bra.uni JOIN;\n"
        "ODD:\n"
        "mul.lo.u32 %r3, %r1, 2;\n"         /* odd: lane * 2 */
        "JOIN:\n"
        "add.u32 %r3, %r3, 1000;\n"
        /* every lane must be here: a full-warp shuffle reads lane 31's value */
        "shfl.sync.idx.b32 %r4, %r3, 31, 0x1f, 0xffffffff;\n"
        /* loop: sum 0..lane, lane+1 iterations */
        "mov.u32 %r5, 0;\nmov.u32 %r6, 0;\n"
        "LOOP:\n"
        "add.u32 %r5, %r5, %r6;\n"
        "add.u32 %r6, %r6, 1;\n"
        "setp.le.u32 %p3, %r6, %r1;\n"
        "@%p3 bra LOOP;\n"
        /* after the loop all lanes again: lane 0 reads lane 31's sum */
        "shfl.sync.idx.b32 %r7, %r5, 31, 0x1f, 0xffffffff;\n"
        "mul.wide.u32 %rd3, %r1, 16;\nadd.u64 %rd4, %rd2, %rd3;\n"
        "st.global.v4.u32 [%rd4], {%r3, %r4, %r5, %r7};\n"
        "ret;\n}\n";
    uint32_t out[32 * 4];
    job j = {.ptx = ptx, .kernel = "diverge", .block = {32, 1, 1}, .out = out, .out_bytes = sizeof out};
    CUresult r = run_job(&j);
    check(r == 0, "[divergence] kernel failed: %d %s", r, j.load_msg);
    if (r)
        return;
    int bad = 0;
    for (uint32_t l = 0; l < 32 && !bad; l++) {
        const uint32_t v = (l & 1) ? l * 2 + 1000 : l + 100 + (l < 8 ? 5000 : 0) + 1000;
        const uint32_t sum = l * (l + 1) / 2;
        const uint32_t *o = out + 4 * l;
        if (o[0] != v || o[1] != 31 * 2 + 1000 || o[2] != sum || o[3] != 31 * 32 / 2) {
            check(0, "[divergence] lane %u: got %u %u %u %u, want %u %u %u %u", l, o[0], o[1], o[2], o[3], v,
                  31 * 2 + 1000, sum, 31 * 32 / 2);
            bad = 1;
        }
    }
    check(!bad, "[divergence]");
}

/* A multi-block grid: every thread records its coordinates. */
static void test_grid(void)
{
    static const char ptx[] = HEAD ENTRY("grid")
        "mov.u32 %r1, %tid.x;\nmov.u32 %r2, %tid.y;\n"
        "mov.u32 %r3, %ctaid.x;\nmov.u32 %r4, %ctaid.y;\nmov.u32 %r5, %ctaid.z;\n"
        "mov.u32 %r6, %nctaid.x;\nmov.u32 %r7, %nctaid.y;\nmov.u32 %r8, %nctaid.z;\n"
        "mov.u32 %r9, %ntid.x;\nmov.u32 %r10, %ntid.y;\n"
        /* linear block = (z*ny + y)*nx + x; linear thread = ty*ntx + tx */
        "mad.lo.u32 %r11, %r5, %r7, %r4;\nmad.lo.u32 %r11, %r11, %r6, %r3;\n"
        "mad.lo.u32 %r12, %r2, %r9, %r1;\n"
        "mul.lo.u32 %r13, %r9, %r10;\nmad.lo.u32 %r14, %r11, %r13, %r12;\n"
        "shl.b32 %r15, %r3, 24;\nshl.b32 %r16, %r4, 16;\nor.b32 %r15, %r15, %r16;\n"
        "shl.b32 %r16, %r5, 8;\nor.b32 %r15, %r15, %r16;\nor.b32 %r15, %r15, %r12;\n"
        "shl.b32 %r17, %r6, 16;\nshl.b32 %r18, %r7, 8;\nor.b32 %r17, %r17, %r18;\nor.b32 %r17, %r17, %r8;\n"
        "mul.wide.u32 %rd3, %r14, 8;\nadd.u64 %rd4, %rd2, %rd3;\n"
        "st.global.v2.u32 [%rd4], {%r15, %r17};\n"
        "ret;\n}\n";
    enum { GX = 3, GY = 2, GZ = 2, BX = 5, BY = 2, NT = GX * GY * GZ * BX * BY };
    uint32_t out[NT * 2];
    job j = {.ptx = ptx, .kernel = "grid", .grid = {GX, GY, GZ}, .block = {BX, BY, 1}, .out = out,
             .out_bytes = sizeof out};
    CUresult r = run_job(&j);
    check(r == 0, "[grid] kernel failed: %d %s", r, j.load_msg);
    if (r)
        return;
    int bad = 0;
    for (int z = 0; z < GZ; z++)
        for (int y = 0; y < GY; y++)
            for (int x = 0; x < GX; x++)
                for (int t = 0; t < BX * BY && !bad; t++) {
                    const int blk = (z * GY + y) * GX + x, i = blk * BX * BY + t;
                    const uint32_t w0 = (uint32_t)(x << 24 | y << 16 | z << 8 | t), w1 = GX << 16 | GY << 8 | GZ;
                    if (out[2 * i] != w0 || out[2 * i + 1] != w1) {
                        check(0, "[grid] block (%d,%d,%d) thread %d: got 0x%08x 0x%08x, want 0x%08x 0x%08x", x, y,
                              z, t, out[2 * i], out[2 * i + 1], w0, w1);
                        bad = 1;
                    }
                }
    check(!bad, "[grid]");
}

/* ---- load-time refusals ----------------------------------------------------- */

static void expect_refusal(const char *what, const char *ptx, CUresult want, const char *needle1,
                           const char *needle2)
{
    CUmodule mod = NULL;
    CUresult r = cuModuleLoadData(&mod, ptx);
    const char *s = err_text(r);
    check(r == want, "[load %s] got %d, want %d (%s)", what, r, want, s);
    if (r == CUDA_SUCCESS) {
        cuModuleUnload(mod);
        return;
    }
    if (needle1)
        check(strstr(s, needle1) != NULL, "[load %s] message lacks `%s`: %s", what, needle1, s);
    if (needle2)
        check(strstr(s, needle2) != NULL, "[load %s] message lacks `%s`: %s", what, needle2, s);
}

static void test_refusals(void)
{
    /* line numbers: HEAD is lines 1-3, the entry line 4, "{" is on line 4 too
     * (ENTRY writes "...)\n{\n"), so: 4 entry, 5 {, 6-9 regs, 10-13 params. */
    static const char good[] = HEAD ENTRY("ok") "ret;\n}\n";
    expect_refusal("a good module", good, CUDA_SUCCESS, NULL, NULL);
    static const char unknown_op[] = HEAD ENTRY("bad") "mov.u32 %r1, 1;\n"  /* line 14 */
                                                       "frobnicate.b32 %r2, %r1;\n" /* line 15 */
                                                       "ret;\n}\n";
    expect_refusal("unknown opcode", unknown_op, CUDA_ERROR_INVALID_PTX, "frobnicate", "line 15");
    static const char bad_type[] = HEAD ENTRY("bad") "mov.u32 %r1, 1;\n" /* 14 */
                                                     "mov.u32 %r2, 2;\n" /* 15 */
                                                     "add.f16 %rs1, %rs2, %rs3;\n" /* 16 */
                                                     "ret;\n}\n";
    expect_refusal("add.f16", bad_type, CUDA_ERROR_INVALID_PTX, "add.f16", "line 16");
    static const char bad_dir[] = HEAD ".bogus 1\n" /* line 4 */
        ".visible .entry k()\n{\nret;\n}\n";
    expect_refusal("unknown directive", bad_dir, CUDA_ERROR_INVALID_PTX, ".bogus", "line 4");
    static const char bad_dir_in[] = HEAD ".visible .entry k()\n{\n" /* 4, 5 */
                                         ".reg .b32 %r<4>;\n"      /* 6 */
                                         ".local .b32 x;\n"        /* 7 */
                                         "ret;\n}\n";
    expect_refusal("unsupported directive in a body", bad_dir_in, CUDA_ERROR_INVALID_PTX, ".local", "line 7");
    static const char bad_mod[] = HEAD ENTRY("bad") "ld.global.cs.u32 %r1, [%rd1];\n" /* 14 */ "ret;\n}\n";
    expect_refusal("unknown modifier", bad_mod, CUDA_ERROR_INVALID_PTX, ".cs", "line 14");
    static const char cubin[64] = "\177ELF\002\001\001";
    expect_refusal("cubin", cubin, CUDA_ERROR_NO_BINARY_FOR_GPU, NULL, NULL);
    /* a refused load leaves the context usable */
    expect_refusal("a good module after refusals", good, CUDA_SUCCESS, NULL, NULL);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    static const selftest_case cases[] = {
        SELFTEST_CASE(test_integer),  SELFTEST_CASE(test_float),           SELFTEST_CASE(test_loads_stores),
        SELFTEST_CASE(test_shuffles), SELFTEST_CASE(test_shared_and_barriers), SELFTEST_CASE(test_params),
        SELFTEST_CASE(test_divergence), SELFTEST_CASE(test_grid),          SELFTEST_CASE(test_refusals),
    };
    return selftest_run(cases, sizeof cases / sizeof cases[0]);
}
