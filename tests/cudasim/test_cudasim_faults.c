/*
 * test_cudasim_faults.c - the simulator's own tests, part 2: one
 * deliberately broken kernel per fault class, each caught with the right
 * CUresult and a message naming the kernel, block, thread and PTX line,
 * as compute-sanitizer would report it; the negative cases that must not fault; the sticky
 * error and its reset; ATTNRES_CUDASIM_CHECKS=0.
 *
 * Each broken kernel is also run in a corrected form (where one exists), so
 * that a check is seen both to fire and to stay quiet.
 *
 * Prints one line per failed check and a closing "N passed, M failed".
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/check.h"
#include "cudasim.h"
#include "selftest.h"

/* The 1-based line of the first occurrence of needle in text. */
static int line_of(const char *text, const char *needle)
{
    const char *at = strstr(text, needle);
    if (!at)
        return -1;
    int line = 1;
    for (const char *p = text; p < at; p++)
        line += *p == '\n';
    return line;
}

#define HEAD ".version 8.0\n.target sm_90\n.address_size 64\n"
#define REGS ".reg .b16 %rs<32>;\n.reg .b32 %r<64>;\n.reg .b64 %rd<32>;\n.reg .pred %p<16>;\n"
#define ENTRY(name)                                                                             \
    ".visible .entry " name "(.param .u64 pin, .param .u64 pout)\n{\n" REGS                     \
    "ld.param.u64 %rd1, [pin];\nld.param.u64 %rd2, [pout];\n"                                   \
    "cvta.to.global.u64 %rd1, %rd1;\ncvta.to.global.u64 %rd2, %rd2;\n"                          \
    "mov.u32 %r1, %tid.x;\nmov.u32 %r2, %ctaid.x;\nmov.u32 %r3, %laneid;\n"
/* Only thread `tid` of block `cta` goes on past this point; the rest exit. */
/* ONLY_(cta*1000 + tid): only that thread of that block goes on. */
#define ONLY_(n) "mad.lo.u32 %r4, %r2, 1000, %r1;\nsetp.ne.u32 %p1, %r4, " #n ";\n@%p1 bra DONE;\n"
#define TAIL "DONE:\nret;\n}\n"

typedef struct launch {
    const char *ptx, *kernel;
    unsigned grid, block, shared;
    size_t in_bytes;   /* the `in` allocation (filled with 0x01 bytes) */
    size_t out_bytes;  /* the `out` allocation */
    uint32_t *out;     /* when set, read back (out_bytes) on success */
} launch;

/* Loads and launches; returns the launch's own result in *launch_rc and the
 * result of the next synchronising call. Does not reset. */
static CUresult do_launch(const launch *L, CUresult *launch_rc, CUdeviceptr *keep_out)
{
    CUmodule mod;
    CUfunction fn;
    CUresult r = cuModuleLoadData(&mod, L->ptx);
    if (r) {
        printf("  (load of %s failed: %d %s)\n", L->kernel, r, err_text(r));
        *launch_rc = r;
        return r;
    }
    r = cuModuleGetFunction(&fn, mod, L->kernel);
    if (r) {
        *launch_rc = r;
        return r;
    }
    CUdeviceptr din, dout;
    size_t inb = L->in_bytes ? L->in_bytes : 256, outb = L->out_bytes ? L->out_bytes : 256;
    cuMemAlloc_v2(&din, inb);
    cuMemAlloc_v2(&dout, outb);
    unsigned char *fill = malloc(inb > outb ? inb : outb);
    memset(fill, 0x01, inb > outb ? inb : outb);
    cuMemcpyHtoD_v2(din, fill, inb);
    cuMemcpyHtoD_v2(dout, fill, outb);
    free(fill);
    void *pp[] = {&din, &dout};
    *launch_rc = cuLaunchKernel(fn, L->grid ? L->grid : 1, 1, 1, L->block ? L->block : 1, 1, 1, L->shared, NULL,
                                pp, NULL);
    r = *launch_rc ? *launch_rc : ctx_sync();
    if (!r && L->out)
        r = cuMemcpyDtoH_v2(L->out, dout, outb);
    if (keep_out) {
        *keep_out = dout;
    } else {
        /* frees are not synchronising calls and succeed under a fault */
        cuMemFree_v2(dout);
    }
    cuMemFree_v2(din);
    (void)mod; /* left loaded: a module stays valid across the reset */
    return r;
}

/* Runs a kernel that must fault with `code`; the message must name the
 * kernel, block (cta,0,0), thread (tid,0,0) (tid < 0: any thread), the PTX
 * line of fault_text and contain detail. Then resets and checks the
 * context works again. */
static void expect_fault(const char *what, const launch *L, CUresult code, int cta, int tid, const char *fault_text,
                         const char *detail)
{
    CUresult lrc;
    CUresult r = do_launch(L, &lrc, NULL);
    check(lrc == CUDA_SUCCESS, "[%s] cuLaunchKernel returned %d; a fault must come from the next synchronising call",
          what, lrc);
    check(r == code, "[%s] the synchronising call returned %d, want %d (%s)", what, r, code, err_text(r));
    if (r == code) {
        const char *s = err_text(code);
        char want[256];
        snprintf(want, sizeof want, "[cudasim: kernel %s, block (%d,0,0)", L->kernel, cta);
        check(strstr(s, want) != NULL, "[%s] message lacks `%s`: %s", what, want, s);
        if (tid >= 0)
            snprintf(want, sizeof want, ", thread (%d,0,0)", tid);
        else
            snprintf(want, sizeof want, ", thread (");
        check(strstr(s, want) != NULL, "[%s] message lacks `%s`: %s", what, want, s);
        const int line = line_of(L->ptx, fault_text);
        snprintf(want, sizeof want, "PTX line %d `%s", line, fault_text);
        check(strstr(s, want) != NULL, "[%s] message lacks `%s`: %s", what, want, s);
        if (detail)
            check(strstr(s, detail) != NULL, "[%s] message lacks `%s`: %s", what, detail, s);
        char buf[2048];
        const int lf = cudasimLastFault(buf, sizeof buf);
        check(lf == (int)code && strstr(buf, L->kernel) != NULL, "[%s] cudasimLastFault gave %d `%s`", what, lf,
              buf);
    }
    check(ctx_reset() == CUDA_SUCCESS, "[%s] cuDevicePrimaryCtxReset failed", what);
    check(ctx_sync() == CUDA_SUCCESS, "[%s] the context still fails after the reset", what);
}

/* Runs a kernel that must not fault; returns 1 when it ran. */
static int expect_clean(const char *what, const launch *L)
{
    CUresult lrc;
    CUresult r = do_launch(L, &lrc, NULL);
    check(lrc == CUDA_SUCCESS && r == CUDA_SUCCESS, "[%s] must not fault: launch %d, sync %d (%s)", what, lrc, r,
          err_text(r ? r : lrc));
    if (r || lrc)
        ctx_reset();
    return !r && !lrc;
}

/* ---- global memory ------------------------------------------------------------ */

static void test_global(void)
{
    static const char rd[] = HEAD ENTRY("oob_read") ONLY_(1003) "ld.global.u32 %r5, [%rd1+100];\n"
                                                               "st.global.u32 [%rd2], %r5;\n" TAIL;
    static const char rd_ok[] = HEAD ENTRY("oob_read") ONLY_(1003) "ld.global.u32 %r5, [%rd1+96];\n"
                                                                  "st.global.u32 [%rd2], %r5;\n" TAIL;
    static const char wr[] = HEAD ENTRY("oob_write") ONLY_(40) "st.global.u32 [%rd1+100], %r1;\n" TAIL;
    static const char straddle[] = HEAD ENTRY("oob_straddle") ONLY_(5) "ld.global.u64 %rd5, [%rd1+96];\n" TAIL;
    static const char before[] = HEAD ENTRY("oob_before") ONLY_(0) "ld.global.u32 %r5, [%rd1+-4];\n" TAIL;
    static const char mis[] = HEAD ENTRY("misaligned_v4") ONLY_(2007)
        "ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd1+4];\n" TAIL;
    static const char mis_ok[] = HEAD ENTRY("misaligned_v4") ONLY_(2007)
        "ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd1+16];\n" TAIL;
    static const char mis_st[] = HEAD ENTRY("misaligned_st") ONLY_(1) "st.global.u32 [%rd2+2], %r1;\n" TAIL;
    static const char mis_v2[] = HEAD ENTRY("misaligned_v2") ONLY_(2)
        "ld.global.v2.u32 {%r5, %r6}, [%rd1+4];\n" TAIL;

    launch L = {.ptx = rd, .kernel = "oob_read", .grid = 2, .block = 64, .in_bytes = 100};
    expect_fault("global read just past the end", &L, CUDA_ERROR_ILLEGAL_ADDRESS, 1, 3, "ld.global.u32 %r5",
                 "outside every allocation");
    L.ptx = rd_ok;
    expect_clean("global read of the last word", &L);
    launch W = {.ptx = wr, .kernel = "oob_write", .grid = 1, .block = 64, .in_bytes = 100};
    expect_fault("global write just past the end", &W, CUDA_ERROR_ILLEGAL_ADDRESS, 0, 40, "st.global.u32 [%rd1+100]",
                 "outside every allocation");
    launch S = {.ptx = straddle, .kernel = "oob_straddle", .block = 32, .in_bytes = 100};
    expect_fault("global u64 straddling the end", &S, CUDA_ERROR_ILLEGAL_ADDRESS, 0, 5, "ld.global.u64", NULL);
    launch B = {.ptx = before, .kernel = "oob_before", .block = 32, .in_bytes = 100};
    expect_fault("global read just before the start", &B, CUDA_ERROR_ILLEGAL_ADDRESS, 0, 0, "ld.global.u32", NULL);
    launch M = {.ptx = mis, .kernel = "misaligned_v4", .grid = 3, .block = 32, .in_bytes = 256};
    expect_fault("misaligned v4 load", &M, CUDA_ERROR_MISALIGNED_ADDRESS, 2, 7, "ld.global.v4.u32", "misaligned");
    M.ptx = mis_ok;
    expect_clean("aligned v4 load", &M);
    launch MS = {.ptx = mis_st, .kernel = "misaligned_st", .block = 32};
    expect_fault("misaligned u32 store", &MS, CUDA_ERROR_MISALIGNED_ADDRESS, 0, 1, "st.global.u32", "misaligned");
    launch M2 = {.ptx = mis_v2, .kernel = "misaligned_v2", .block = 32};
    expect_fault("misaligned v2 load (8-byte alignment)", &M2, CUDA_ERROR_MISALIGNED_ADDRESS, 0, 2,
                 "ld.global.v2.u32", "misaligned");

    /* The read-only path is not coherent with the kernel's own stores: an
     * ld.global.nc of bytes the launch wrote is a fault; of the neighbouring
     * bytes in the same sector it is not. */
    static const char nc_stale[] = HEAD ENTRY("nc_after_write") ONLY_(9) "st.global.u32 [%rd2+8], %r1;\n"
                                                                       "ld.global.nc.u32 %r5, [%rd2+8];\n" TAIL;
    static const char nc_ok[] = HEAD ENTRY("nc_after_write") ONLY_(9) "st.global.u32 [%rd2+8], %r1;\n"
                                                                    "ld.global.nc.u32 %r5, [%rd2+12];\n"
                                                                    "ld.global.u32 %r6, [%rd2+8];\n" TAIL;
    launch NC = {.ptx = nc_stale, .kernel = "nc_after_write", .block = 32};
    expect_fault("ld.global.nc of bytes the launch wrote", &NC, CUDA_ERROR_LAUNCH_FAILED, 0, 9, "ld.global.nc.u32",
                 "reads memory this launch wrote");
    NC.ptx = nc_ok;
    expect_clean("ld.global.nc beside a store, and a coherent load of it", &NC);
}

/* Coordinates in a 2-D grid of 2-D blocks: the message names x, y and z. */
static void test_coordinates(void)
{
    static const char ptx[] = HEAD ENTRY("coords2d")
        "mov.u32 %r5, %tid.y;\nmov.u32 %r6, %ctaid.y;\n"
        "setp.eq.u32 %p2, %r1, 1;\nsetp.eq.u32 %p3, %r5, 2;\nand.pred %p2, %p2, %p3;\n"
        "setp.eq.u32 %p3, %r2, 1;\nand.pred %p2, %p2, %p3;\n"
        "setp.eq.u32 %p3, %r6, 2;\nand.pred %p2, %p2, %p3;\n"
        "@!%p2 bra DONE;\n"
        "st.global.u32 [%rd1+4096], %r1;\n" TAIL;
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr din, dout;
    check(cuModuleLoadData(&mod, ptx) == 0 && cuModuleGetFunction(&fn, mod, "coords2d") == 0, "[coords] load");
    cuMemAlloc_v2(&din, 256);
    cuMemAlloc_v2(&dout, 256);
    void *pp[] = {&din, &dout};
    check(cuLaunchKernel(fn, 2, 3, 1, 4, 8, 1, 0, NULL, pp, NULL) == 0, "[coords] launch");
    CUresult r = ctx_sync();
    check(r == CUDA_ERROR_ILLEGAL_ADDRESS, "[coords] sync gave %d", r);
    const char *s = err_text(r);
    check(strstr(s, "kernel coords2d, block (1,2,0), thread (1,2,0), PTX line") != NULL, "[coords] message: %s", s);
    ctx_reset();
    cuMemFree_v2(din);
    cuMemFree_v2(dout);
    cuModuleUnload(mod);
}

/* ---- shared memory -------------------------------------------------------------- */

static void test_shared(void)
{
    static const char oob[] = HEAD ENTRY("sh_oob") ".shared .align 4 .b32 sh[16];\n" ONLY_(9)
        "mov.u32 %r6, sh;\n"
        "st.shared.u32 [%r6+64], %r1;\n" TAIL;
    static const char oob_ok[] = HEAD ENTRY("sh_oob") ".shared .align 4 .b32 sh[16];\n" ONLY_(9)
        "mov.u32 %r6, sh;\n"
        "st.shared.u32 [%r6+60], %r1;\n" TAIL;
    static const char dyn[] = HEAD ".extern .shared .align 16 .b8 dsm[];\n" ENTRY("dyn_oob") ONLY_(33)
        "mov.u32 %r6, dsm;\n"
        "st.shared.u32 [%r6+128], %r1;\n" TAIL;
    static const char dyn_ok[] = HEAD ".extern .shared .align 16 .b8 dsm[];\n" ENTRY("dyn_oob") ONLY_(33)
        "mov.u32 %r6, dsm;\n"
        "st.shared.u32 [%r6+124], %r1;\n" TAIL;
    launch L = {.ptx = oob, .kernel = "sh_oob", .block = 32};
    expect_fault("static shared just past the end", &L, CUDA_ERROR_ILLEGAL_ADDRESS, 0, 9, "st.shared.u32",
                 "shared memory");
    L.ptx = oob_ok;
    expect_clean("static shared last word", &L);
    launch D = {.ptx = dyn, .kernel = "dyn_oob", .block = 64, .shared = 128};
    expect_fault("dynamic shared past the launch's bytes", &D, CUDA_ERROR_ILLEGAL_ADDRESS, 0, 33, "st.shared.u32",
                 "shared memory");
    D.ptx = dyn_ok;
    expect_clean("dynamic shared last word", &D);

    /* races: every lane writes the same word */
    static const char race[] = HEAD ENTRY("sh_race") ".shared .align 4 .b32 sh[64];\n"
        "mov.u32 %r6, sh;\n"
        "st.shared.u32 [%r6], %r1;\n"
        "ret;\n}\n";
    launch R = {.ptx = race, .kernel = "sh_race", .block = 32};
    expect_fault("shared race: two lanes write one word", &R, CUDA_ERROR_LAUNCH_FAILED, 0, 1, "st.shared.u32",
                 "race");
    /* across warps: thread 0 and thread 32 write word 0, no barrier */
    static const char race_w[] = HEAD ENTRY("sh_race_warps") ".shared .align 4 .b32 sh[64];\n"
        "mov.u32 %r6, sh;\n"
        "and.b32 %r7, %r1, 31;\n"
        "setp.ne.u32 %p2, %r7, 0;\n"
        "@%p2 bra DONE;\n"
        "st.shared.u32 [%r6], %r1;\n" TAIL;
    launch RW = {.ptx = race_w, .kernel = "sh_race_warps", .block = 64};
    expect_fault("shared race across warps", &RW, CUDA_ERROR_LAUNCH_FAILED, 0, 32, "st.shared.u32", "race");
    /* write by one thread, read by another, no barrier */
    static const char race_rw[] = HEAD ENTRY("sh_race_rw") ".shared .align 4 .b32 sh[64];\n"
        "mov.u32 %r6, sh;\n"
        "setp.eq.u32 %p2, %r1, 0;\n"
        "@%p2 st.shared.u32 [%r6+8], %r1;\n"
        "ld.shared.u32 %r8, [%r6+8];\n" TAIL;
    static const char race_rw_ok[] = HEAD ENTRY("sh_race_rw") ".shared .align 4 .b32 sh[64];\n"
        "mov.u32 %r6, sh;\n"
        "setp.eq.u32 %p2, %r1, 0;\n"
        "@%p2 st.shared.u32 [%r6+8], %r1;\n"
        "bar.sync 0;\n"
        "ld.shared.u32 %r8, [%r6+8];\n" TAIL;
    launch RR = {.ptx = race_rw, .kernel = "sh_race_rw", .block = 32};
    expect_fault("shared race: write then another thread's read", &RR, CUDA_ERROR_LAUNCH_FAILED, 0, 1,
                 "ld.shared.u32", "race");
    RR.ptx = race_rw_ok;
    expect_clean("write, bar.sync, read by all", &RR);

    /* a read of never-written shared memory */
    static const char uninit[] = HEAD ENTRY("sh_uninit") ".shared .align 4 .b32 sh[64];\n"
        "mov.u32 %r6, sh;\n"
        "shl.b32 %r7, %r1, 2;\nadd.u32 %r8, %r6, %r7;\n"
        "st.shared.u32 [%r8], %r1;\n"
        "bar.sync 0;\n"
        "ld.shared.u32 %r9, [%r8+4];\n" /* thread 31 reads word 32: nobody wrote it */
        "st.global.u32 [%rd2], %r9;\n"
        "ret;\n}\n";
    launch U = {.ptx = uninit, .kernel = "sh_uninit", .block = 32};
    expect_fault("read of never-written shared memory", &U, CUDA_ERROR_LAUNCH_FAILED, 0, 31, "ld.shared.u32",
                 "no thread has written");

    /* shared memory does not carry over between blocks: block 0 writes and
     * reads its word; block 1 only reads it */
    static const char blocks[] = HEAD ENTRY("sh_blocks") ".shared .align 4 .b32 sh[64];\n"
        "mov.u32 %r6, sh;\n"
        "setp.ne.u32 %p2, %r2, 0;\n"
        "@%p2 bra READ;\n"
        "st.shared.u32 [%r6], %r1;\n"
        "READ:\n"
        "bar.sync 0;\n"
        "ld.shared.u32 %r9, [%r6];\n"
        "st.global.u32 [%rd2], %r9;\n"
        "ret;\n}\n";
    launch SB = {.ptx = blocks, .kernel = "sh_blocks", .grid = 2, .block = 1};
    expect_fault("block 1 reads shared memory only block 0 wrote", &SB, CUDA_ERROR_LAUNCH_FAILED, 1, 0,
                 "ld.shared.u32", "no thread has written");

    /* same thread write-then-read, read-write-read, and neighbouring bytes */
    static const char self[] = HEAD ENTRY("sh_self") ".shared .align 4 .b32 sh[128];\n"
        "mov.u32 %r6, sh;\n"
        "shl.b32 %r7, %r1, 2;\nadd.u32 %r8, %r6, %r7;\n"
        "st.shared.u32 [%r8], %r1;\n"
        "ld.shared.u32 %r9, [%r8];\n"
        "add.u32 %r9, %r9, 1;\n"
        "st.shared.u32 [%r8], %r9;\n"
        "ld.shared.u32 %r10, [%r8];\n"
        "add.u32 %r11, %r6, %r1;\n"
        "st.shared.u8 [%r11+256], %r1;\n" /* thread t writes byte 256+t */
        "mul.wide.u32 %rd5, %r1, 4;\nadd.u64 %rd6, %rd2, %rd5;\n"
        "st.global.u32 [%rd6], %r10;\n"
        "ret;\n}\n";
    uint32_t out[64];
    launch SF = {.ptx = self, .kernel = "sh_self", .block = 64, .out = out, .out_bytes = sizeof out};
    if (expect_clean("same-thread write then read; distinct bytes of one word", &SF)) {
        int bad = 0;
        for (uint32_t t = 0; t < 64; t++)
            bad += out[t] != t + 1;
        check(!bad, "[sh_self] values wrong");
    }

    /* ATTNRES_CUDASIM_CHECKS=0 turns the race and uninitialised checks off */
    setenv("ATTNRES_CUDASIM_CHECKS", "0", 1);
    expect_clean("race with ATTNRES_CUDASIM_CHECKS=0", &R);
    expect_clean("cross-warp race with ATTNRES_CUDASIM_CHECKS=0", &RW);
    expect_clean("uninitialised read with ATTNRES_CUDASIM_CHECKS=0", &U);
    /* bounds are still checked */
    launch LO = {.ptx = oob, .kernel = "sh_oob", .block = 32};
    expect_fault("shared OOB with ATTNRES_CUDASIM_CHECKS=0", &LO, CUDA_ERROR_ILLEGAL_ADDRESS, 0, 9, "st.shared.u32",
                 "shared memory");
    setenv("ATTNRES_CUDASIM_CHECKS", "1", 1);
    expect_fault("race again with ATTNRES_CUDASIM_CHECKS=1", &R, CUDA_ERROR_LAUNCH_FAILED, 0, 1, "st.shared.u32",
                 "race");
    unsetenv("ATTNRES_CUDASIM_CHECKS");
    expect_fault("uninitialised read with the checks on by default", &U, CUDA_ERROR_LAUNCH_FAILED, 0, 31,
                 "ld.shared.u32", "no thread has written");
}

/* ---- barriers and shuffles ------------------------------------------------------ */

static void test_barriers(void)
{
    /* lanes 32..47 of warp 1 branch past the barrier (and do not exit):
     * lanes 48..63 reach it alone */
    static const char div[] = HEAD ENTRY("bar_div")
        "setp.lt.u32 %p2, %r1, 48;\n"
        "setp.ge.u32 %p3, %r1, 32;\n"
        "and.pred %p4, %p2, %p3;\n"
        "@%p4 bra SKIP;\n"
        "bar.sync 0;\n"
        "SKIP:\n"
        "st.global.u32 [%rd2], %r1;\n"
        "ret;\n}\n";
    launch D = {.ptx = div, .kernel = "bar_div", .block = 64};
    expect_fault("barrier divergence within a warp", &D, CUDA_ERROR_LAUNCH_FAILED, 0, 48, "bar.sync 0",
                 "barrier divergence");

    /* warps wait at different barriers */
    static const char ids[] = HEAD ENTRY("bar_ids")
        "shr.u32 %r5, %r1, 5;\n"
        "bar.sync %r5;\n"
        "ret;\n}\n";
    launch I = {.ptx = ids, .kernel = "bar_ids", .block = 64};
    char where[64];
    snprintf(where, sizeof where, "warp 1 at barrier 1 (line %d)", line_of(ids, "bar.sync %r5"));
    expect_fault("warps at different barrier ids", &I, CUDA_ERROR_LAUNCH_TIMEOUT, 0, -1, "bar.sync %r5", where);
    /* a thread count larger than the block */
    static const char big[] = HEAD ENTRY("bar_count")
        "bar.sync 1, 128;\n"
        "ret;\n}\n";
    launch C = {.ptx = big, .kernel = "bar_count", .block = 64};
    expect_fault("bar.sync count larger than the block", &C, CUDA_ERROR_LAUNCH_TIMEOUT, 0, -1, "bar.sync 1, 128",
                 "never complete");
    static const char big_ok[] = HEAD ENTRY("bar_count")
        "bar.sync 1, 64;\n"
        "ret;\n}\n";
    C.ptx = big_ok;
    expect_clean("bar.sync count equal to the block", &C);
    /* one warp waits while the other waits at a later barrier, 0 then 0:
     * the same id, different program points, is legal and completes */
    static const char two[] = HEAD ENTRY("bar_two_sites")
        "setp.lt.u32 %p2, %r1, 32;\n"
        "@%p2 bra A;\n"
        "bar.sync 0;\n"
        "bra.uni B;\n"
        "A:\n"
        "bar.sync 0;\n"
        "B:\n"
        "ret;\n}\n";
    launch T = {.ptx = two, .kernel = "bar_two_sites", .block = 64};
    expect_clean("warp-uniform barriers at two sites", &T);

    /* negative: a whole warp exits early while the others use bar.sync */
    static const char wexit[] = HEAD ENTRY("bar_warp_exit") ".shared .align 4 .b32 sh[96];\n"
        "shr.u32 %r5, %r1, 5;\n"
        "setp.eq.u32 %p2, %r5, 1;\n"
        "@%p2 bra DONE;\n"
        "mov.u32 %r6, sh;\n"
        "shl.b32 %r7, %r1, 2;\nadd.u32 %r8, %r6, %r7;\n"
        "st.shared.u32 [%r8], %r1;\n"
        "bar.sync 0;\n"
        "xor.b32 %r9, %r1, 64;\n" /* warp 0 <-> warp 2 */
        "shl.b32 %r9, %r9, 2;\nadd.u32 %r9, %r6, %r9;\n"
        "ld.shared.u32 %r10, [%r9];\n"
        "bar.sync 0;\n"
        "mul.wide.u32 %rd5, %r1, 4;\nadd.u64 %rd6, %rd2, %rd5;\n"
        "st.global.u32 [%rd6], %r10;\n" TAIL;
    uint32_t out[96];
    launch WE = {.ptx = wexit, .kernel = "bar_warp_exit", .block = 96, .out = out, .out_bytes = sizeof out};
    if (expect_clean("a whole warp exits before the others' bar.sync", &WE)) {
        int bad = 0;
        for (uint32_t t = 0; t < 96; t++)
            if (t / 32 != 1)
                bad += out[t] != (t ^ 64);
        check(!bad, "[bar_warp_exit] exchanged values wrong");
    }
    /* negative: lanes 16..31 of warp 0 exit (the branch's taken side);
     * lanes 0..15 and warp 1 reach the barrier */
    static const char pexit1[] = HEAD ENTRY("bar_part_exit_taken")
        "setp.ge.u32 %p2, %r1, 16;\n"
        "setp.lt.u32 %p3, %r1, 32;\n"
        "and.pred %p4, %p2, %p3;\n"
        "@%p4 bra DONE;\n"
        "bar.sync 0;\n"
        "mul.wide.u32 %rd5, %r1, 4;\nadd.u64 %rd6, %rd2, %rd5;\n"
        "st.global.u32 [%rd6], %r1;\n" TAIL;
    launch P1 = {.ptx = pexit1, .kernel = "bar_part_exit_taken", .block = 64};
    expect_clean("partial-warp exit (exiting lanes branch to the shared final ret), the rest at bar.sync", &P1);
    /* the same with the exiting lanes' own ret (no common post-dominator) */
    static const char pexit1b[] = HEAD ENTRY("bar_part_exit_own_ret")
        "setp.ge.u32 %p2, %r1, 16;\n"
        "setp.lt.u32 %p3, %r1, 32;\n"
        "and.pred %p4, %p2, %p3;\n"
        "@%p4 bra EXIT;\n"
        "bar.sync 0;\n"
        "mul.wide.u32 %rd5, %r1, 4;\nadd.u64 %rd6, %rd2, %rd5;\n"
        "st.global.u32 [%rd6], %r1;\n"
        "ret;\n"
        "EXIT:\n"
        "ret;\n}\n";
    launch P1b = {.ptx = pexit1b, .kernel = "bar_part_exit_own_ret", .block = 64};
    expect_clean("partial-warp exit (exiting lanes branch to their own ret), the rest at bar.sync", &P1b);
    /* negative: the same, with the lanes that stay on the branch's taken
     * side (run first) and the exiting lanes falling through to ret */
    static const char pexit2[] = HEAD ENTRY("bar_part_exit_fall")
        "setp.lt.u32 %p2, %r1, 16;\n"
        "setp.ge.u32 %p3, %r1, 32;\n"
        "or.pred %p4, %p2, %p3;\n"
        "@%p4 bra WORK;\n"
        "ret;\n"
        "WORK:\n"
        "bar.sync 0;\n"
        "mul.wide.u32 %rd5, %r1, 4;\nadd.u64 %rd6, %rd2, %rd5;\n"
        "st.global.u32 [%rd6], %r1;\n"
        "ret;\n}\n";
    launch P2 = {.ptx = pexit2, .kernel = "bar_part_exit_fall", .block = 64};
    expect_clean("partial-warp exit (exiting lanes fall through), the rest at bar.sync", &P2);
    /* negative: the exiting lanes leave by a guarded ret, no branch */
    static const char pexit3[] = HEAD ENTRY("bar_part_exit_ret")
        "setp.ge.u32 %p2, %r3, 20;\n"
        "@%p2 ret;\n"
        "bar.sync 0;\n"
        "st.global.u32 [%rd2], %r1;\n"
        "ret;\n}\n";
    launch P3 = {.ptx = pexit3, .kernel = "bar_part_exit_ret", .block = 64};
    expect_clean("partial-warp exit by @p ret, the rest at bar.sync", &P3);
}

static void test_shuffle_faults(void)
{
    /* lanes 0..15 take the branch; lanes 16..31 shuffle naming the whole warp */
    static const char sh[] = HEAD ENTRY("shfl_div")
        "setp.lt.u32 %p2, %r3, 16;\n"
        "@%p2 bra A;\n"
        "shfl.sync.bfly.b32 %r5, %r1, 1, 0x1f, 0xffffffff;\n"
        "bra.uni B;\n"
        "A:\n"
        "add.u32 %r5, %r1, 1;\n"
        "B:\n"
        "st.global.u32 [%rd2], %r5;\n"
        "ret;\n}\n";
    static const char sh_ok[] = HEAD ENTRY("shfl_div")
        "setp.lt.u32 %p2, %r3, 16;\n"
        "@%p2 bra A;\n"
        "shfl.sync.bfly.b32 %r5, %r1, 1, 0x1f, 0xffff0000;\n"
        "bra.uni B;\n"
        "A:\n"
        "add.u32 %r5, %r1, 1;\n"
        "B:\n"
        "st.global.u32 [%rd2], %r5;\n"
        "ret;\n}\n";
    launch S = {.ptx = sh, .kernel = "shfl_div", .block = 32};
    expect_fault("shfl.sync membermask names lanes on another path", &S, CUDA_ERROR_LAUNCH_FAILED, 0, 16,
                 "shfl.sync.bfly.b32", "membermask");
    S.ptx = sh_ok;
    expect_clean("shfl.sync membermask of the executing half", &S);
    /* the mask names only executing lanes, but the source lane is outside it */
    static const char src[] = HEAD ENTRY("shfl_src")
        "setp.lt.u32 %p2, %r3, 16;\n"
        "@%p2 bra A;\n"
        "shfl.sync.idx.b32 %r5, %r1, 3, 0x1f, 0xffff0000;\n"
        "A:\n"
        "st.global.u32 [%rd2], %r5;\n"
        "ret;\n}\n";
    launch SS = {.ptx = src, .kernel = "shfl_src", .block = 32};
    expect_fault("shfl.sync reads a lane outside the membermask", &SS, CUDA_ERROR_LAUNCH_FAILED, 0, 16,
                 "shfl.sync.idx.b32", "lane 3");
}

/* ---- the sticky error ------------------------------------------------------------- */

static void test_sticky(void)
{
    static const char bad[] = HEAD ENTRY("sticky_bad") ONLY_(0) "ld.global.u32 %r5, [%rd1+256];\n" TAIL;
    static const char good[] = HEAD ENTRY("sticky_good")
        "mul.wide.u32 %rd5, %r1, 4;\nadd.u64 %rd6, %rd2, %rd5;\n"
        "add.u32 %r5, %r1, 7;\n"
        "st.global.u32 [%rd6], %r5;\n"
        "ret;\n}\n";
    CUmodule mgood;
    CUfunction fgood;
    CUresult r = cuModuleLoadData(&mgood, good);
    check(r == 0, "[sticky] load good: %d", r);
    r = cuModuleGetFunction(&fgood, mgood, "sticky_good");
    check(r == 0, "[sticky] get good: %d", r);
    CUdeviceptr buf;
    cuMemAlloc_v2(&buf, 256);
    CUevent ev = NULL;
    check(cuEventCreate(&ev, 0) == 0, "[sticky] cuEventCreate");

    launch L = {.ptx = bad, .kernel = "sticky_bad", .block = 32, .in_bytes = 256};
    CUresult lrc;
    CUdeviceptr kept;
    r = do_launch(&L, &lrc, &kept);
    check(lrc == 0, "[sticky] the faulting launch itself returned %d", lrc);
    check(r == CUDA_ERROR_ILLEGAL_ADDRESS, "[sticky] first sync returned %d", r);
    uint32_t host[64];
    check(cuMemcpyDtoH_v2(host, buf, sizeof host) == CUDA_ERROR_ILLEGAL_ADDRESS, "[sticky] cuMemcpyDtoH not sticky");
    check(cuMemcpyHtoD_v2(buf, host, sizeof host) == CUDA_ERROR_ILLEGAL_ADDRESS, "[sticky] cuMemcpyHtoD not sticky");
    check(cuStreamSynchronize(NULL) == CUDA_ERROR_ILLEGAL_ADDRESS, "[sticky] cuStreamSynchronize not sticky");
    check(ctx_sync() == CUDA_ERROR_ILLEGAL_ADDRESS, "[sticky] second cuCtxSynchronize not sticky");
    check(cuEventSynchronize(ev) == CUDA_ERROR_ILLEGAL_ADDRESS, "[sticky] cuEventSynchronize not sticky");
    void *pp[] = {&buf, &buf};
    r = cuLaunchKernel(fgood, 1, 1, 1, 32, 1, 1, 0, NULL, pp, NULL);
    check(r == CUDA_ERROR_ILLEGAL_ADDRESS, "[sticky] a launch on the faulted context returned %d", r);
    char msg[2048];
    check(cudasimLastFault(msg, sizeof msg) == CUDA_ERROR_ILLEGAL_ADDRESS && strstr(msg, "sticky_bad"),
          "[sticky] cudasimLastFault: %s", msg);
    const char *s = err_text(CUDA_ERROR_ILLEGAL_ADDRESS);
    check(strncmp(s, "an illegal memory access was encountered [cudasim: kernel sticky_bad", 68) == 0,
          "[sticky] cuGetErrorString: %s", s);
    /* reset: launches work again, and the old handles stay valid */
    check(ctx_reset() == 0, "[sticky] reset");
    check(ctx_sync() == 0, "[sticky] sync after reset");
    check(cudasimLastFault(msg, sizeof msg) == 0 && msg[0] == 0, "[sticky] cudasimLastFault after reset: %s", msg);
    s = err_text(CUDA_ERROR_ILLEGAL_ADDRESS);
    check(strcmp(s, "an illegal memory access was encountered") == 0, "[sticky] text after reset: %s", s);
    r = cuLaunchKernel(fgood, 1, 1, 1, 32, 1, 1, 0, NULL, pp, NULL);
    check(r == 0, "[sticky] launch after reset: %d", r);
    check(cuEventRecord(ev, NULL) == 0 && cuEventSynchronize(ev) == 0, "[sticky] event after reset");
    memset(host, 0, sizeof host);
    check(cuMemcpyDtoH_v2(host, buf, 128) == 0, "[sticky] copy after reset");
    int okv = 1;
    for (uint32_t t = 0; t < 32; t++)
        okv &= host[t] == t + 7;
    check(okv, "[sticky] the kernel after the reset computed wrong values");
    /* a later fault in another kernel replaces the message */
    static const char bad2[] = HEAD ENTRY("sticky_bad2") ONLY_(4)
        "ld.global.v2.u32 {%r5, %r6}, [%rd1+4];\n" TAIL;
    launch L2 = {.ptx = bad2, .kernel = "sticky_bad2", .block = 32};
    r = do_launch(&L2, &lrc, NULL);
    check(r == CUDA_ERROR_MISALIGNED_ADDRESS, "[sticky] second fault: %d", r);
    /* only the fault's own code carries the description */
    s = err_text(CUDA_ERROR_ILLEGAL_ADDRESS);
    check(strstr(s, "cudasim") == NULL, "[sticky] another code's text carries the fault: %s", s);
    s = err_text(CUDA_ERROR_MISALIGNED_ADDRESS);
    check(strstr(s, "sticky_bad2") != NULL && strstr(s, "thread (4,0,0)") != NULL, "[sticky] second text: %s", s);
    ctx_reset();
    /* releasing every hold on the primary context and retaining it anew
     * also starts clean */
    r = do_launch(&L2, &lrc, NULL);
    check(r == CUDA_ERROR_MISALIGNED_ADDRESS, "[sticky] third fault: %d", r);
    CUcontext c2;
    cuCtxPopCurrent_v2(NULL);
    check(cuDevicePrimaryCtxRelease_v2(0) == 0, "[sticky] release");
    check(cuDevicePrimaryCtxRetain(&c2, 0) == 0 && cuCtxPushCurrent_v2(c2) == 0, "[sticky] retain anew");
    check(ctx_sync() == 0, "[sticky] a re-retained primary context is still faulted");
    cuEventDestroy_v2(ev);
    cuMemFree_v2(kept);
    cuMemFree_v2(buf);
    cuModuleUnload(mgood);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    unsetenv("ATTNRES_CUDASIM_CHECKS");
    static const selftest_case cases[] = {
        SELFTEST_CASE(test_global),   SELFTEST_CASE(test_coordinates),    SELFTEST_CASE(test_shared),
        SELFTEST_CASE(test_barriers), SELFTEST_CASE(test_shuffle_faults), SELFTEST_CASE(test_sticky),
    };
    return selftest_run(cases, sizeof cases / sizeof cases[0]);
}
