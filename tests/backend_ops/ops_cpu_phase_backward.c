/*
 * ops_cpu_phase_backward.c - the CPU cases of backend_ops for the
 * backwards of Block AttnRes' two phases (attnres_run_phase1_backward,
 * attnres_run_phase2_backward; templates/cpu/phase1_backward.lua and
 * phase2_backward.lua), as ops_cpu_backward.c has them for the mix
 * backward: every gradient against attnres_reference_phase1_backward /
 * _phase2_backward on the rounded inputs (test_phase_backward_case.h) at
 * DESIGN §1's tolerances: the per-token gradients in the storage type at
 * its own (fp32 1e-5, bf16 and f16 1e-2), phase 1's source gradients in
 * fp32 (ATTNRES_GRAD_DSOURCES_F32) at fp32's whatever the storage type,
 * and the fp32 ones at 1e-5 in every dtype: dqueries (each site's row on
 * its own), dquery, d(out_gain) and dlse, sums of fp32 products of inputs
 * that the reference reads exactly as stored. Every gradient buffer starts
 * as NaN (or, accumulated, as random priors), and no byte outside a
 * gradient's view may change: its rows' padding, a dsublayer without the
 * fused add, a d(out_gain) without the epilogue or not asked for, the
 * buffer of a source gradient that is another's very view. With one
 * source, the query gradient of every site without a dlse is exactly zero
 * (the softmax weight is exactly 1).
 *
 * Case names: phase 1's say its problem, then "_nodlse" (the dlse array
 * NULL), "_somedlse" (site 0 and every third without one, as a block's
 * first site) or "_dlse" (every site); phase 2's its problem ("_fuse",
 * "_epi"), then "_dnonly" (with the epilogue, dout NULL: the loss reads
 * normed alone), "_dsub" (dsublayer given; without "_fuse" it must stay
 * untouched), "_nodgain" (d(out_gain) NULL). Then "_padP" for views P
 * elements wider than a row (with every argument given, a scale other
 * than 1 and epsilons of 1e-5), "_acc" for accumulated gradients,
 * "_f32grads" for phase 1's fp32 source gradients and "_alias" for its
 * last source's gradient the very same view as the first's (accumulated).
 *
 * "builtin-host": the built-in kernel of the host's own level, through
 * plans without a database, for f32, bf16 and f16: phase 1 at n = 1 and 3,
 * S = 1 and 3, H = 1 and 4, each dlse variation and flag combination,
 * contiguous and padded; phase 2 at H = 1 and 4, with and without the
 * fused add and dsublayer, without the epilogue, with it and with it and
 * dout NULL, written and accumulated, contiguous and padded; over 37
 * tokens (a whole group of 32 and a part). "_runs": one plan gives
 * bit-identical gradients on two runs, the second over a workspace of
 * other stale values.
 *
 * "builtin-LEVEL": at every ISA level (ATTNRES_CPU_BUILTIN_ISA), the plan's
 * explanation names the kernel the fallback chain must take (ops_cpu.c),
 * and the gradients match the reference in every dtype at head widths of
 * 256 and 64 (the level's own kernel), 48 (the next level down) and 20
 * (the scalar kernel), over 70 tokens; "_runs" cases are bit-identical on
 * two runs and with the launch in one part and in two (launches of 4.6 and
 * 5.9 MB: the built-ins split per 2 MiB).
 *
 * The templates' variants at two threads, compiled as the tuner compiles
 * them, each on four cases that together take every store loop and path
 * of its template (written and added, fp32 and storage-type source
 * gradients, dsublayer or not, the epilogue with and without dout);
 * --sample a covering sample (every value of every parameter once), --all
 * every variant. "_threads": one variant at one and at two threads gives
 * bit-identical gradients.
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
#include "test_phase_backward_case.h"
#include "test_variant.h"

/* The device the cases run on (the scratch one, or one opened at a level). */
static attnres_device *dev;

static const attnres_dtype dtypes[] = {ATTNRES_DTYPE_F32, ATTNRES_DTYPE_BF16, ATTNRES_DTYPE_F16};

/* Every combination of the gradient flags (phase 1's; phase 2 takes
 * ATTNRES_GRAD_ACCUMULATE only). */
#define ALL_FLAGS (ATTNRES_GRAD_ACCUMULATE | ATTNRES_GRAD_DSOURCES_F32)

#define P1 ATTNRES_OP_PHASE1_BACKWARD
#define P2 ATTNRES_OP_PHASE2_BACKWARD

/* One case's problem and variations, of either op. */
typedef struct pb_shape {
    attnres_op op;
    attnres_dtype dt;
    int64_t d, T, pad;
    int n, s, heads; /* n and s: phase 1 */
    unsigned flags;
    int dlse;        /* phase 1: PB_DLSE_* */
    int fuse, epi;   /* phase 2 */
    int opts;        /* PB_ALIAS (phase 1); PB_DOUT_NULL, PB_DSUB, PB_NO_DGAIN (phase 2) */
} pb_shape;

/* A case of either op, made. */
typedef struct pb_case {
    attnres_op op;
    p1_case one;
    p2_case two;
} pb_case;

static const char *op_name(attnres_op op) { return op == P1 ? "phase1_backward" : "phase2_backward"; }

/* Case c of shape sh, run by variant, named (module comment) with extra
 * at the end. */
static bo_case pb_bo_case(const pb_shape *sh, const char *variant, const char *extra)
{
    bo_case c = {.backend = "cpu", .op = op_name(sh->op), .variant = variant, .dtype = sh->dt, .heads = sh->heads};
    static const char *const dlse[] = {"_nodlse", "_somedlse", "_dlse"};
    char padding[24] = "", tail[96];
    if (sh->pad)
        snprintf(padding, sizeof padding, "_pad%lld", (long long)sh->pad);
    const char *acc = sh->flags & ATTNRES_GRAD_ACCUMULATE ? "_acc" : "";
    if (sh->op == P1) {
        snprintf(tail, sizeof tail, "%s%s%s%s%s%s", dlse[sh->dlse], padding, acc,
                 sh->flags & ATTNRES_GRAD_DSOURCES_F32 ? "_f32grads" : "", sh->opts & PB_ALIAS ? "_alias" : "",
                 extra);
        bo_name(&c, sh->d, sh->n, sh->s, sh->T, 0, 0, tail);
    } else {
        snprintf(tail, sizeof tail, "%s%s%s%s%s%s", sh->epi && (sh->opts & PB_DOUT_NULL) ? "_dnonly" : "",
                 sh->opts & PB_DSUB ? "_dsub" : "", sh->opts & PB_NO_DGAIN ? "_nodgain" : "", padding, acc, extra);
        bo_name(&c, sh->d, 0, 0, sh->T, sh->fuse, sh->epi, tail);
    }
    return c;
}

/* Makes case pc of shape sh, adding to v when it could not be made; 0 on
 * success. */
static int pb_make(bo_verdict *v, pb_case *pc, const pb_shape *sh, uint64_t seed)
{
    memset(pc, 0, sizeof *pc);
    pc->op = sh->op;
    const int rc = sh->op == P1 ? p1_case_make(&pc->one, sh->dt, sh->d, sh->n, sh->s, sh->heads, sh->T, sh->pad,
                                               sh->flags, sh->dlse, sh->opts, seed)
                                : p2_case_make(&pc->two, sh->dt, sh->d, sh->heads, sh->fuse, sh->epi, sh->T, sh->pad,
                                               sh->flags, sh->opts, seed);
    bo_expect(v, rc == 0, "the case could not be made (out of memory, or the reference refused it: above)");
    return rc;
}

static void pb_free(pb_case *pc)
{
    p1_case_free(&pc->one);
    p2_case_free(&pc->two);
}

static const attnres_problem *pb_problem(const pb_case *pc) { return pc->op == P1 ? &pc->one.p : &pc->two.p; }

static int64_t pb_tokens(const pb_case *pc) { return pc->op == P1 ? pc->one.T : pc->two.T; }

/* The buffers a run writes into, and its workspace. */
static pb_region *pb_outputs(pb_case *pc, int *count)
{
    *count = pc->op == P1 ? pc->one.nout : pc->two.nout;
    return pc->op == P1 ? pc->one.out : pc->two.out;
}

static pb_region pb_workspace(pb_case *pc)
{
    return pc->op == P1 ? (pb_region){pc->one.workspace, pc->one.workspace_size}
                        : (pb_region){pc->two.workspace, pc->two.workspace_size};
}

static int pb_run_plan(attnres_plan *plan, pb_case *pc)
{
    return pc->op == P1 ? attnres_run_phase1_backward(plan, pc->one.T, &pc->one.args, NULL)
                        : attnres_run_phase2_backward(plan, pc->two.T, &pc->two.args, NULL);
}

/* Launches pc through kernel k on the device directly (as the tuner does),
 * for variants and thread counts a plan does not choose. */
static int pb_launch(const ar_kernel *k, pb_case *pc)
{
    const ar_op_args args = pc->op == P1 ? ar_op_phase1_backward(&pc->one.args) : ar_op_phase2_backward(&pc->two.args);
    return dev->ops->launch(dev, k, pb_problem(pc), pb_tokens(pc), &args, NULL);
}

/* Adds to v every gradient of pc that misses the reference, and any byte
 * outside the gradients' views that changed. */
static void pb_check(bo_verdict *v, const pb_case *pc, const char *what)
{
    const double ftol = case_tolerance(ATTNRES_DTYPE_F32);
    if (pc->op == P1) {
        const p1_case *c = &pc->one;
        const double gtol = case_tolerance(c->gdt);
        const p1_errors e = p1_case_errors(c);
        bo_expect(v, e.dsrc <= gtol, "%sdsources[%d] relative error %.3g over %.0e", what, e.which, e.dsrc, gtol);
        bo_expect(v, e.dqueries <= ftol, "%sdqueries[%d] relative error %.3g over %.0e", what, e.site, e.dqueries,
                  ftol);
        bo_expect(v, e.intact, "%sa byte outside the source gradients' views changed", what);
        if (c->p.n == 1) /* a = 1: p - delta is exactly 0, dz is dlse alone */
            for (int j = 0; j < c->p.s; j++) {
                if (p1_has_dlse(c, j))
                    continue;
                int zero = 1;
                for (int64_t k = 0; k < c->p.d; k++)
                    zero &= c->dqueries[(size_t)j * (size_t)c->p.d + (size_t)k] == 0.0f;
                bo_expect(v, zero, "%sdqueries[%d] is not exactly zero with one source and no dlse", what, j);
            }
        return;
    }
    const p2_case *c = &pc->two;
    const double tol = case_tolerance(c->p.dtype);
    const p2_errors e = p2_case_errors(c);
    bo_expect(v, e.do1 <= tol, "%sdo1 relative error %.3g over %.0e", what, e.do1, tol);
    bo_expect(v, e.db <= tol, "%sdpartial relative error %.3g over %.0e", what, e.db, tol);
    bo_expect(v, e.dsub <= tol, "%sdsublayer relative error %.3g over %.0e", what, e.dsub, tol);
    bo_expect(v, e.dlse <= ftol, "%sdlse relative error %.3g over %.0e", what, e.dlse, ftol);
    bo_expect(v, e.dquery <= ftol, "%sdquery relative error %.3g over %.0e", what, e.dquery, ftol);
    bo_expect(v, e.dout_gain <= ftol, "%sdout_gain relative error %.3g over %.0e", what, e.dout_gain, ftol);
    bo_expect(v, e.intact, "%sa byte outside the gradients' views changed (padding, or a buffer the problem ignores)",
              what);
}

static attnres_plan *plan_host(const attnres_problem *p, bo_verdict *v)
{
    attnres_plan *plan = NULL;
    char msg[512] = "";
    const int rc = attnres_plan_create(dev, NULL, p, 0, &plan, msg, sizeof msg);
    bo_expect(v, rc == ATTNRES_OK, "no plan: %s", msg);
    return rc == ATTNRES_OK ? plan : NULL;
}

/* The case of shape sh run by variant through the plan planner makes and
 * checked; reported. */
static void plan_case(const pb_shape *sh, const char *variant,
                      attnres_plan *(*planner)(const attnres_problem *, bo_verdict *), uint64_t seed)
{
    const bo_case c = pb_bo_case(sh, variant, "");
    if (!bo_case_wanted(&c))
        return;
    bo_verdict v = {0};
    pb_case pc;
    if (pb_make(&v, &pc, sh, seed) == 0) {
        attnres_plan *plan = planner(pb_problem(&pc), &v);
        if (plan) {
            const int rc = pb_run_plan(plan, &pc);
            bo_expect(&v, rc == ATTNRES_OK, "run: %s", attnres_plan_errmsg(plan));
            if (rc == ATTNRES_OK)
                pb_check(&v, &pc, "");
        }
        attnres_plan_destroy(plan);
    }
    pb_free(&pc);
    bo_report(&c, &v);
}

/* ------------------------------------------------------------------------
 * The host's built-in kernel
 * ---------------------------------------------------------------------- */

/* Phase 2's epilogue variations: none, with dout, and with normed the only
 * output the loss reads. */
static const struct { int epi, opts; } epis[] = {{0, 0}, {1, 0}, {1, PB_DOUT_NULL}};

static void host_cases(void)
{
    for (int di = 0; di < 3; di++)
        for (int ni = 0; ni < 2; ni++)
            for (int si = 0; si < 2; si++)
                for (int hi = 0; hi < 2; hi++)
                    for (int dl = PB_DLSE_NONE; dl <= PB_DLSE_ALL; dl++)
                        for (unsigned flags = 0; flags <= ALL_FLAGS; flags++) {
                            const pb_shape sh = {.op = P1, .dt = dtypes[di], .d = 64, .T = 37,
                                                 .pad = (di + ni + si + hi) % 2 ? 8 : 0, .n = ni ? 3 : 1,
                                                 .s = si ? 3 : 1, .heads = hi ? 4 : 1, .flags = flags, .dlse = dl};
                            plan_case(&sh, "builtin-host", plan_host,
                                      (uint64_t)(((((di * 2 + ni) * 2 + si) * 2 + hi) * 3 + dl) * 4) + flags);
                        }
    /* One tensor that is two of the sources: its gradient added twice. */
    for (int di = 0; di < 3; di++)
        for (unsigned f32 = 0; f32 <= ATTNRES_GRAD_DSOURCES_F32; f32 += ATTNRES_GRAD_DSOURCES_F32) {
            const pb_shape sh = {.op = P1, .dt = dtypes[di], .d = 64, .T = 37, .pad = 8, .n = 3, .s = 3, .heads = 4,
                                 .flags = ATTNRES_GRAD_ACCUMULATE | f32, .dlse = PB_DLSE_SOME, .opts = PB_ALIAS};
            plan_case(&sh, "builtin-host", plan_host, 500 + (uint64_t)(di * 4) + f32);
        }
    for (int di = 0; di < 3; di++)
        for (int hi = 0; hi < 2; hi++)
            for (int fuse = 0; fuse <= 1; fuse++)
                for (int dsub = 0; dsub <= 1; dsub++)
                    for (int ei = 0; ei < 3; ei++)
                        for (unsigned acc = 0; acc <= ATTNRES_GRAD_ACCUMULATE; acc++) {
                            const pb_shape sh = {.op = P2, .dt = dtypes[di], .d = 64, .T = 37,
                                                 .pad = (di + hi + fuse + ei) % 2 ? 7 : 0, .heads = hi ? 4 : 1,
                                                 .flags = acc, .fuse = fuse, .epi = epis[ei].epi,
                                                 .opts = epis[ei].opts | (dsub ? PB_DSUB : 0)};
                            plan_case(&sh, "builtin-host", plan_host,
                                      1000 + (uint64_t)(((((di * 2 + hi) * 2 + fuse) * 2 + dsub) * 3 + ei) * 2) +
                                          acc);
                        }
    /* The epilogue without d(out_gain): the other gradients as with it. */
    for (int di = 0; di < 3; di++) {
        const pb_shape sh = {.op = P2, .dt = dtypes[di], .d = 64, .T = 37, .pad = 7, .heads = 4, .fuse = 1,
                             .epi = 1, .opts = PB_DSUB | PB_NO_DGAIN};
        plan_case(&sh, "builtin-host", plan_host, 1500 + (uint64_t)di);
    }
}

/* The gradient buffers of one run, whole, to restore or compare bit for
 * bit. */
typedef struct pb_snap {
    void *bytes[8];
    int count;
} pb_snap;

static int snap_take(pb_case *pc, pb_snap *s)
{
    int count;
    pb_region *r = pb_outputs(pc, &count);
    for (int i = 0; i < count; i++) {
        if (!(s->bytes[i] = malloc(r[i].bytes ? r[i].bytes : 1)))
            return -1;
        memcpy(s->bytes[i], r[i].ptr, r[i].bytes);
    }
    s->count = count;
    return 0;
}

static void snap_put(pb_case *pc, const pb_snap *s)
{
    int count;
    pb_region *r = pb_outputs(pc, &count);
    for (int i = 0; i < count && i < s->count; i++)
        memcpy(r[i].ptr, s->bytes[i], r[i].bytes);
}

static int snap_same(pb_case *pc, const pb_snap *s)
{
    int count, same = 1;
    pb_region *r = pb_outputs(pc, &count);
    for (int i = 0; i < count && i < s->count; i++)
        same &= memcmp(r[i].ptr, s->bytes[i], r[i].bytes) == 0;
    return same && count == s->count;
}

static void snap_free(pb_snap *s)
{
    for (int i = 0; i < 8; i++)
        free(s->bytes[i]);
    memset(s, 0, sizeof *s);
}

/* Runs pc through k (NULL: through plan) from the gradients it was made
 * with (prior), over a workspace of stale values (other ones each time),
 * and compares its gradients with first's bit for bit, or keeps them there
 * and checks them against the reference when first is empty. */
static void run_and_compare(bo_verdict *v, pb_case *pc, attnres_plan *plan, const ar_kernel *k, const pb_snap *prior,
                            pb_snap *first, const char *what)
{
    static unsigned char stale = 0x5a;
    snap_put(pc, prior);
    const pb_region ws = pb_workspace(pc);
    memset(ws.ptr, stale, ws.bytes); /* old partial sums must not matter */
    stale ^= 0xa5;                   /* 0x5a, then NaN, then 0x5a */
    const int rc = k ? pb_launch(k, pc) : pb_run_plan(plan, pc);
    bo_expect(v, rc == ATTNRES_OK, "%s: the run failed (%d)", what, rc);
    if (rc != ATTNRES_OK)
        return;
    if (!first->count) {
        bo_expect(v, snap_take(pc, first) == 0, "out of memory");
        pb_check(v, pc, "");
        return;
    }
    bo_expect(v, snap_same(pc, first), "%s: the gradients differ from the first run's", what);
}

/* Case "_runs" of shape sh: the plan planner makes gives bit-identical
 * gradients on two runs; with parts, also the built-in kernel launched in
 * one part and in two. */
static void runs_case(const pb_shape *sh, const char *variant,
                      attnres_plan *(*planner)(const attnres_problem *, bo_verdict *), int parts, uint64_t seed)
{
    const bo_case c = pb_bo_case(sh, variant, "_runs");
    if (!bo_case_wanted(&c))
        return;
    bo_verdict v = {0};
    pb_case pc;
    pb_snap prior = {0}, first = {0};
    if (pb_make(&v, &pc, sh, seed) == 0) {
        attnres_plan *plan = planner(pb_problem(&pc), &v);
        const int kept = snap_take(&pc, &prior) == 0;
        bo_expect(&v, kept, "out of memory");
        if (plan && kept) {
            run_and_compare(&v, &pc, plan, NULL, &prior, &first, "first run");
            run_and_compare(&v, &pc, plan, NULL, &prior, &first, "second run");
        }
        if (plan && kept && parts) {
            ar_kernel k;
            const int rc = dev->ops->load_generic(dev, pb_problem(&pc), &k);
            bo_expect(&v, rc == ATTNRES_OK, "the built-in kernel does not load (%d)", rc);
            for (int threads = 1; rc == ATTNRES_OK && threads <= 2; threads++) {
                k.threads = threads;
                run_and_compare(&v, &pc, NULL, &k, &prior, &first, threads == 1 ? "in one part" : "in two parts");
            }
            if (rc == ATTNRES_OK)
                dev->ops->unload(dev, &k);
        }
        attnres_plan_destroy(plan);
    }
    snap_free(&prior);
    snap_free(&first);
    pb_free(&pc);
    bo_report(&c, &v);
}

/* Determinism's variations, bf16 at two heads over T tokens: phase 1
 * written in bf16, in fp32, and accumulated in fp32; phase 2 with the
 * fused add and dsublayer written, accumulated, and accumulated with the
 * epilogue. */
static pb_shape runs_shape(attnres_op op, int64_t d, int64_t T, int r)
{
    pb_shape sh = {.op = op, .dt = ATTNRES_DTYPE_BF16, .d = d, .T = T, .heads = 2};
    if (op == P1) {
        static const unsigned flags[] = {0, ATTNRES_GRAD_DSOURCES_F32, ALL_FLAGS};
        sh.n = 3, sh.s = 3, sh.dlse = PB_DLSE_SOME, sh.flags = flags[r];
    } else {
        sh.fuse = 1, sh.opts = PB_DSUB, sh.flags = r ? ATTNRES_GRAD_ACCUMULATE : 0, sh.epi = r == 2;
    }
    return sh;
}

static void host_runs(void)
{
    for (int op = P1; op <= P2; op++)
        for (int r = 0; r < 3; r++) {
            const pb_shape sh = runs_shape((attnres_op)op, 128, 300, r);
            runs_case(&sh, "builtin-host", plan_host, 0, 5 + (uint64_t)r);
        }
}

/* ------------------------------------------------------------------------
 * The templates' variants
 * ---------------------------------------------------------------------- */

static attnres_dtype dtype_of(const char *id)
{
    return strstr(id, "_bf16_") ? ATTNRES_DTYPE_BF16 : strstr(id, "_f16_") ? ATTNRES_DTYPE_F16 : ATTNRES_DTYPE_F32;
}

/* The four cases every variant runs, d = 128 over 70 tokens (two whole
 * groups and a part), which together take every store loop and path of
 * the template. Phase 1: written in the storage type, added, written in
 * fp32 with one source (its query gradients exactly zero), and added in
 * fp32 into a view two sources share. Phase 2: with the fused add and
 * dsublayer written and (with the epilogue) added, without: the epilogue
 * with dout NULL written, and added with a dsublayer to leave alone. */
static pb_shape variant_shape(attnres_op op, attnres_dtype dt, int form)
{
    pb_shape sh = {.op = op, .dt = dt, .d = 128, .T = 70};
    if (op == P1) {
        static const struct { int n, s, h, dlse, opts, pad; unsigned flags; } f[4] = {
            {3, 3, 2, PB_DLSE_SOME, 0, 0, 0},
            {3, 2, 1, PB_DLSE_ALL, 0, 8, ATTNRES_GRAD_ACCUMULATE},
            {1, 3, 2, PB_DLSE_NONE, 0, 8, ATTNRES_GRAD_DSOURCES_F32},
            {3, 3, 2, PB_DLSE_SOME, PB_ALIAS, 0, ALL_FLAGS}};
        sh.n = f[form].n, sh.s = f[form].s, sh.heads = f[form].h, sh.dlse = f[form].dlse, sh.opts = f[form].opts;
        sh.pad = f[form].pad, sh.flags = f[form].flags;
    } else {
        static const struct { int h, fuse, epi, opts, pad; unsigned flags; } f[4] = {
            {2, 1, 0, PB_DSUB, 0, 0},
            {1, 1, 1, PB_DSUB, 7, ATTNRES_GRAD_ACCUMULATE},
            {2, 0, 1, PB_DOUT_NULL, 7, 0},
            {2, 0, 0, PB_DSUB, 0, ATTNRES_GRAD_ACCUMULATE}};
        sh.heads = f[form].h, sh.fuse = f[form].fuse, sh.epi = f[form].epi, sh.opts = f[form].opts;
        sh.pad = f[form].pad, sh.flags = f[form].flags;
    }
    return sh;
}

/* A variant compiled and loaded once for every case of its template that
 * runs it: the "_threads" pair, whose two-thread one the covering sample
 * may take too. */
typedef struct held_kernel {
    char id[64];
    int state; /* 0: not compiled yet, 1: loaded, -1: it failed (said above) */
    ar_kernel k;
} held_kernel;

static const ar_kernel *held_get(argen *g, held_kernel *h)
{
    if (h->state == 0)
        h->state = compile_variant_on(dev, g, h->id, &h->k) == 0 ? 1 : -1;
    return h->state == 1 ? &h->k : NULL;
}

static void held_release(held_kernel *h)
{
    if (h->state == 1)
        dev->ops->unload(dev, &h->k);
    h->state = 0;
}

/* One variant at one and at two threads, held[0] and held[1], on the
 * determinism cases of its op at d = 128 over 300 tokens (ten groups, five
 * a thread). */
static void variant_threads(argen *g, attnres_op op, held_kernel held[2])
{
    for (int r = 0; r < 3; r++) {
        const pb_shape sh = runs_shape(op, 128, 300, r);
        const bo_case c = pb_bo_case(&sh, held[1].id, "_threads");
        if (!bo_case_wanted(&c))
            continue;
        bo_verdict v = {0};
        const ar_kernel *k[2] = {held_get(g, &held[0]), held_get(g, &held[1])};
        bo_expect(&v, k[0] && k[1], "%s does not compile or load (above)", !k[0] ? held[0].id : held[1].id);
        pb_case pc = {0};
        pb_snap prior = {0}, first = {0};
        if (k[0] && k[1] && pb_make(&v, &pc, &sh, 5 + (uint64_t)r) == 0) {
            bo_expect(&v, k[0]->threads == 1 && k[1]->threads == 2, "the kernels load with %d and %d threads",
                      k[0]->threads, k[1]->threads);
            if (snap_take(&pc, &prior) == 0) {
                run_and_compare(&v, &pc, NULL, k[0], &prior, &first, "at 1 thread");
                run_and_compare(&v, &pc, NULL, k[1], &prior, &first, "at 2 threads");
            }
        }
        pb_free(&pc);
        snap_free(&prior);
        snap_free(&first);
        bo_report(&c, &v);
    }
}

/* Which variants run: those at two threads that apply to the cases' shapes
 * (all four have head widths of 64 or 128). */
static int *variants_usable(argen *g, attnres_op op, const argen_variant *vs, size_t nv, const argen_device *ad)
{
    int *usable = calloc(nv ? nv : 1, sizeof *usable);
    for (size_t i = 0; usable && i < nv; i++) {
        const argen_problem ap = {.op = op_name(op), .dtype = attnres_dtype_name(dtype_of(vs[i].id)),
                                  .form = "replace", .d = 128, .t = 70, .n = op == P1 ? 3 : 1, .heads = 2,
                                  .epilogue = 0, .s = op == P1 ? 3 : 0};
        char why[256];
        usable[i] = strstr(vs[i].id, "_t2") != NULL && argen_applies(g, vs[i].id, &ap, ad, why, sizeof why) > 0;
    }
    return usable;
}

/* Runs the four cases of variant i (id), compiled once if any is
 * selected (or taken from held, when it holds id). Whether it compiled. */
static int variant_cases(argen *g, attnres_op op, size_t i, const char *id, held_kernel *held)
{
    const attnres_dtype dt = dtype_of(id);
    bo_case cs[4];
    pb_shape shs[4];
    int wanted[4], any = 0;
    for (int form = 0; form < 4; form++) {
        shs[form] = variant_shape(op, dt, form);
        cs[form] = pb_bo_case(&shs[form], id, "");
        wanted[form] = bo_case_wanted(&cs[form]);
        any |= wanted[form];
    }
    if (!any)
        return 0;
    ar_kernel own;
    const int is_held = strcmp(id, held->id) == 0;
    const ar_kernel *k = is_held ? held_get(g, held) : compile_variant_on(dev, g, id, &own) == 0 ? &own : NULL;
    const int loaded = k != NULL;
    for (int form = 0; form < 4; form++) {
        if (!wanted[form])
            continue;
        bo_verdict v = {0};
        bo_expect(&v, loaded, "the variant does not compile or load (above)");
        pb_case pc = {0};
        if (loaded && pb_make(&v, &pc, &shs[form], 3000 + 7 * i + (size_t)form) == 0) {
            const int rc = pb_launch(k, &pc);
            bo_expect(&v, rc == ATTNRES_OK, "the launch failed (%d): %s", rc, attnres_device_errmsg(dev));
            if (rc == ATTNRES_OK)
                pb_check(&v, &pc, "");
        }
        pb_free(&pc);
        bo_report(&cs[form], &v);
    }
    if (loaded && !is_held)
        dev->ops->unload(dev, &own);
    return loaded;
}

static void template_variants(attnres_op op)
{
    char msg[1024], tmpl[64];
    snprintf(tmpl, sizeof tmpl, "cpu/%s", op_name(op));
    argen *g = NULL;
    argen_variant *vs = NULL;
    size_t nv = 0;
    if (argen_open(TEMPLATE_DIR, tmpl, &g, msg, sizeof msg) != 0 || argen_enumerate(g, &vs, &nv) != 0) {
        bo_fail("%s: %s", tmpl, g ? argen_errmsg(g) : msg);
        argen_close(g);
        return;
    }
    held_kernel held[2] = {{.state = 0}, {.state = 0}};
    for (int t = 0; t < 2; t++)
        snprintf(held[t].id, sizeof held[t].id, "%s_c_bf16_v8_u2_ss_t%d", op_name(op), t + 1);
    variant_threads(g, op, held);
    const argen_device ad = {.backend = "cpu", .arch = dev->arch, .units = 2};
    int *usable = variants_usable(g, op, vs, nv, &ad), *pick = NULL;
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
        bo_fail("%s: out of memory, or no variant to sample", tmpl);
    int tried = 0, every_id = 1, want = 0;
    for (size_t i = 0; usable && (pick || !bo_sample) && i < nv; i++) {
        if (!usable[i] || (pick && !pick[i]))
            continue;
        if (!bo_variant_wanted("cpu", op_name(op), dtype_of(vs[i].id), vs[i].id)) {
            every_id = 0;
            continue;
        }
        want++;
        tried += variant_cases(g, op, i, vs[i].id, &held[1]);
    }
    if (!bo_listing && every_id && bo_case_filters_absent() && (tried == 0 || tried != want))
        bo_fail("%s: %d of %d variant(s) compiled and checked", tmpl, tried, want);
    if (!bo_listing && tried)
        printf("%s: %d variant(s) compiled%s\n", tmpl, tried, bo_sample ? " (a covering sample)" : "");
    held_release(&held[0]);
    held_release(&held[1]);
    free(json);
    free(usable);
    free(pick);
    argen_variants_free(vs, nv);
    argen_close(g);
}

void bo_cpu_phase_backward_variants(attnres_device *on)
{
    dev = on;
    host_cases();
    host_runs();
    if (bo_op_wanted("cpu", "phase1_backward"))
        template_variants(P1);
    if (bo_op_wanted("cpu", "phase2_backward"))
        template_variants(P2);
    dev = NULL;
}

/* ------------------------------------------------------------------------
 * The built-in kernels at one ISA level
 * ---------------------------------------------------------------------- */

/* Every dtype at head widths of 256, 64, 48 and 20 over 70 tokens: phase
 * 1 with one source and site (no dlse), three of each (some dlse) and two
 * (every dlse), each in every flag combination; phase 2 with and without
 * the fused add (and dsublayer), written and accumulated, with the
 * epilogue written and, dout NULL, accumulated. */
static void level_cases(const char *variant)
{
    static const struct { int64_t d; int h; } shapes[] = {{256, 1}, {256, 4}, {96, 2}, {20, 1}};
    static const struct { int n, s, dlse; } p1s[] = {{1, 1, PB_DLSE_NONE}, {3, 3, PB_DLSE_SOME}, {2, 2, PB_DLSE_ALL}};
    static const struct { int epi, opts; unsigned flags; } p2s[] = {
        {0, 0, 0}, {0, 0, ATTNRES_GRAD_ACCUMULATE}, {1, 0, 0}, {1, PB_DOUT_NULL, ATTNRES_GRAD_ACCUMULATE}};
    for (int di = 0; di < 3; di++)
        for (int si = 0; si < 4; si++) {
            for (int ci = 0; ci < 3; ci++)
                for (unsigned flags = 0; flags <= ALL_FLAGS; flags++) {
                    const pb_shape sh = {.op = P1, .dt = dtypes[di], .d = shapes[si].d, .T = 70,
                                         .pad = (si + ci) % 2 ? 16 : 0, .n = p1s[ci].n, .s = p1s[ci].s,
                                         .heads = shapes[si].h, .flags = flags, .dlse = p1s[ci].dlse};
                    plan_case(&sh, variant, bo_cpu_plan_builtin, 4000 + (uint64_t)(((di * 4 + si) * 3 + ci) * 4) + flags);
                }
            for (int fuse = 0; fuse <= 1; fuse++)
                for (int ci = 0; ci < 4; ci++) {
                    const pb_shape sh = {.op = P2, .dt = dtypes[di], .d = shapes[si].d, .T = 70,
                                         .pad = (si + fuse + ci) % 2 ? 16 : 0, .heads = shapes[si].h,
                                         .flags = p2s[ci].flags, .fuse = fuse, .epi = p2s[ci].epi,
                                         .opts = p2s[ci].opts | (fuse ? PB_DSUB : 0)};
                    plan_case(&sh, variant, bo_cpu_plan_builtin, 6000 + (uint64_t)(((di * 4 + si) * 2 + fuse) * 4 + ci));
                }
        }
}

/* The plan's kernel on two runs, and launched in one part and in two, at
 * d = 1024 over 300 tokens (ten groups; phase 1 moves 5.9 MB, phase 2 with
 * the epilogue 4.6 MB: two parts of 2 MiB), in each op's last determinism
 * variation: accumulated, phase 1's source gradients in fp32, phase 2's
 * with the epilogue. */
static void level_runs(const char *variant)
{
    for (int op = P1; op <= P2; op++) {
        const pb_shape sh = runs_shape((attnres_op)op, 1024, 300, 2);
        runs_case(&sh, variant, bo_cpu_plan_builtin, 1, 77 + (uint64_t)op);
    }
}

void bo_cpu_phase_backward_builtins(attnres_device *on, const char *variant)
{
    dev = on;
    level_cases(variant);
    level_runs(variant);
    dev = NULL;
}
