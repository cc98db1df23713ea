/*
 * cmd_run.c - `attnres run`: one operation (mix, phase1, phase2,
 * mix_backward, phase1_backward or phase2_backward) on .npy inputs. This
 * file parses and checks the options and hands them to the op's run
 * (cmd_run_mix.c, cmd_run_phase.c, cmd_run_backward.c,
 * cmd_run_phase_backward.c).
 *
 * Everything is read and checked before the device is touched, and outputs
 * are written atomically at the end, all of them or none, so bad input never
 * leaves a file.
 */
#include <math.h>
#include <string.h>

#include "attnres.h"
#include "cli.h"
#include "cmd_run.h"
#include "problems.h"

static const char run_usage[] =
    "usage: attnres run [--op mix|phase1|phase2|mix_backward|phase1_backward|phase2_backward]\n"
    "                   [--device cpu|cuda:N] [--db FILE] [--dtype f32|bf16|f16]\n"
    "                   [--heads H] [--eps E] [--scale C] [--require-exact] OP-SPECIFIC FLAGS\n"
    "\n"
    "--op mix (the default): the AttnRes depth mix of N sources\n"
    "    --sources S.npy --query W.npy [--gain G.npy] [--partial P.npy --alpha A]\n"
    "    [--out-gain GO.npy --out-eps EO --normed NORMED.npy]\n"
    "  S is (N, T, d); W, G, GO are (d,); P is (T, d). OUT and NORMED are (T, d).\n"
    "\n"
    "--op phase1: Block AttnRes phase 1, the S sites of a block against its n sources\n"
    "    --sources SRC.npy --queries Q.npy [--gains G.npy] --lse LSE.npy\n"
    "  SRC is (n, T, d); Q and G are (S, d), row j the pseudo-query and RMSNorm gain of\n"
    "  site j. OUT gets o1, (S, T, d); LSE gets the per-head log-sum-exp, (S, T, H).\n"
    "\n"
    "--op phase2: Block AttnRes phase 2, one site's merge with the partial sum b\n"
    "    --o1 O1.npy --lse LSE.npy --partial B.npy --query W.npy [--gain G.npy]\n"
    "    [--sublayer F.npy --partial-out B2.npy]\n"
    "    [--out-gain GO.npy --out-eps EO --normed NORMED.npy]\n"
    "  O1, B, F are (T, d); LSE is (T, H) (H may be left to LSE's shape); W, G, GO\n"
    "  are (d,). With --sublayer, b + F is added first and written to B2 (T, d).\n"
    "  OUT and NORMED are (T, d).\n"
    "\n"
    "--op mix_backward: the gradients of the mix (DESIGN 1b) from those of its output\n"
    "    --sources S.npy --query W.npy [--gain G.npy] [--partial P.npy --alpha A]\n"
    "    --dout DO.npy [--dsources DS.npy] [--dquery DW.npy] [--dgain DG.npy]\n"
    "    [--dpartial DP.npy] [--dalpha DA.npy] [--dsources-f32]\n"
    "    [--out-gain GO.npy --out OUT.npy --dnormed DN.npy [--out-eps EO]\n"
    "     [--dout-gain DGO.npy]]\n"
    "  The forward's inputs as for --op mix (P selects the additive form; its values\n"
    "  do not enter the gradients), and DO, the gradient of OUT, (T, d). Writes each\n"
    "  gradient that has a path, at least one: DS of the sources (N, T, d), DW of W\n"
    "  and DG of G (d,), summed over tokens, and in the additive form DP of P (T, d)\n"
    "  and DA of alpha, a scalar (). Sums over tokens are bit-identical on every run.\n"
    "  --dsources-f32: the kernel writes DS in float32 (ATTNRES_GRAD_DSOURCES_F32)\n"
    "  instead of the storage type, so a bf16 or f16 run's DS is not rounded to it.\n"
    "  The output-norm epilogue's backward, selected by --out-gain: GO and EO as\n"
    "  the forward used them, OUT the forward's out (T, d), an input here, and\n"
    "  DN the gradient of NORMED (T, d). The gradient of OUT is then DO (if given;\n"
    "  --dout may be left out when the loss reads NORMED alone) plus the RMSNorm\n"
    "  backward of DN; DGO gets the gradient of GO (d,), summed over tokens.\n"
    "\n"
    "--op phase1_backward: the gradients of phase 1 from those of its outputs\n"
    "    --sources SRC.npy --queries Q.npy [--gains G.npy] --do1 DO1.npy [--dlse DLSE.npy]\n"
    "    [--dsources DS.npy] [--dqueries DQ.npy] [--dgains DG.npy] [--dsources-f32]\n"
    "  The forward's inputs as for --op phase1; DO1, the gradient of every site's o1,\n"
    "  (S, T, d), and DLSE, that of its lse, (S, T, H) (what phase2_backward writes;\n"
    "  left out: zero, as for a block whose sites have no phase 2). Writes each\n"
    "  gradient that has a path, at least one: DS of the sources (n, T, d), summed\n"
    "  over the sites, and DQ and DG of Q and G (S, d), summed over tokens.\n"
    "  --dsources-f32 as for mix_backward.\n"
    "\n"
    "--op phase2_backward: the gradients of phase 2 from those of its outputs\n"
    "    --o1 O1.npy --lse LSE.npy --partial B.npy --query W.npy [--gain G.npy]\n"
    "    [--fuse-add] --dout DO.npy [--do1 DO1.npy] [--dlse DLSE.npy]\n"
    "    [--dpartial DB.npy] [--dsublayer DF.npy] [--dquery DW.npy] [--dgain DG.npy]\n"
    "    [--out-gain GO.npy --dnormed DN.npy [--out-eps EO] [--dout-gain DGO.npy]]\n"
    "  The forward's inputs as for --op phase2, with B the partial sum as the forward\n"
    "  used it: after a fused add (--fuse-add; --sublayer F made it b + F), phase2's\n"
    "  B2. DO is the gradient of OUT (T, d). Writes each gradient that has a path, at\n"
    "  least one: DO1 of o1 (T, d) and DLSE of lse (T, H), which phase1_backward\n"
    "  takes, DB of B (with --fuse-add also of the partial before the add) and, with\n"
    "  --fuse-add, DF of the sublayer's F (the same values), both (T, d), and DW and\n"
    "  DG of W and G (d,), summed over tokens. --out-gain selects the output-norm\n"
    "  epilogue's backward: GO and EO as the forward used them, and DN the gradient\n"
    "  of NORMED (T, d); OUT is recomputed, so --out is not read, and --dout may be\n"
    "  left out when the loss reads NORMED alone; DGO gets the gradient of GO (d,).\n"
    "\n"
    "  Every array is float32 in C order. --dtype is the storage type the kernel runs\n"
    "  in: inputs are rounded to it and results widened back (lse stays float32).\n"
    "  Defaults: gain 1, heads 1, eps 1e-6, scale 1, alpha 1, out-eps 1e-6, dtype f32,\n"
    "  the best device present, no database (the built-in generic kernel).\n"
    "  Outputs are written all or none, and never on bad input.\n";

/* Which ops use a flag. */
enum {
    USE_MIX = 1,
    USE_PHASE1 = 2,
    USE_PHASE2 = 4,
    USE_MIXBW = 8,
    USE_P1BW = 16,
    USE_P2BW = 32,
    USE_BACKWARD = USE_MIXBW | USE_P1BW | USE_P2BW,
    USE_ALL = 63
};

/* The op's bit, 0 for an op that `run` does not run. */
static int op_bit(attnres_op op)
{
    switch (op) {
    case ATTNRES_OP_MIX: return USE_MIX;
    case ATTNRES_OP_PHASE1: return USE_PHASE1;
    case ATTNRES_OP_PHASE2: return USE_PHASE2;
    case ATTNRES_OP_MIX_BACKWARD: return USE_MIXBW;
    case ATTNRES_OP_PHASE1_BACKWARD: return USE_P1BW;
    case ATTNRES_OP_PHASE2_BACKWARD: return USE_P2BW;
    }
    return 0;
}

/* The checks of --op phase1_backward's and --op phase2_backward's flags
 * among themselves (which flags the op takes at all is checked before). */
static int check_phase_backward(const run_opts *o)
{
    if (o->op == ATTNRES_OP_PHASE1_BACKWARD) {
        if (!o->sources || !o->queries || !o->do1) {
            cli_error("run", "--op phase1_backward requires --sources, --queries and --do1 (see attnres run --help)");
            return -1;
        }
        if (!o->dsources && !o->dqueries && !o->dgains) {
            cli_error("run", "--op phase1_backward needs at least one gradient to write: --dsources, --dqueries "
                             "or --dgains");
            return -1;
        }
        if (o->dgains && !o->gains) {
            cli_error("run", "--dgains is the gradient of --gains, which was not given");
            return -1;
        }
        return 0;
    }
    if (!o->o1 || !o->lse || !o->partial || !o->query || (!o->dout && !o->out_gain)) {
        cli_error("run", "--op phase2_backward requires --o1, --lse, --partial, --query and --dout (which the "
                         "epilogue's --dnormed may replace; see attnres run --help)");
        return -1;
    }
    if (o->out_gain && !o->dnormed) {
        cli_error("run", "the output-norm epilogue's backward (--out-gain) also needs --dnormed (the gradient of "
                         "normed)");
        return -1;
    }
    if (!o->out_gain && (o->dnormed || o->dout_gain || o->have_out_eps)) {
        cli_error("run", "--dnormed, --dout-gain and --out-eps belong to the output-norm epilogue's backward: give "
                         "--out-gain (the forward's gain)");
        return -1;
    }
    if (o->dsublayer && !o->fuse_add) {
        cli_error("run", "--dsublayer is the gradient of the fused add's sublayer output: give --fuse-add (the "
                         "forward ran with --sublayer)");
        return -1;
    }
    if (o->dgain && !o->gain) {
        cli_error("run", "--dgain is the gradient of --gain, which was not given");
        return -1;
    }
    if (!o->do1 && !o->dlse && !o->dpartial && !o->dsublayer && !o->dquery && !o->dgain && !o->dout_gain) {
        cli_error("run", "--op phase2_backward needs at least one gradient to write: --do1, --dlse, --dpartial, "
                         "--dsublayer, --dquery, --dgain or --dout-gain");
        return -1;
    }
    return 0;
}

static int parse_op(const char *cmd, const char *flag, const char *v, void *dst)
{
    run_opts *o = dst;
    if (cli_parse_op(cmd, flag, v, &o->op))
        return -1;
    o->op_name = v; /* a word of argv, which lives as long as the run */
    return 0;
}

/* An epsilon the kernels take: positive and finite once rounded to the
 * float32 they get (the runtime refuses one of 1e30 or more). */
static int eps_in_range(double eps)
{
    return eps >= 1e-38 && eps < 1e30 && isfinite(eps);
}

static int parse(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->op = ATTNRES_OP_MIX;
    o->op_name = "mix";
    o->eps = 1e-6;
    o->scale = 1.0;
    o->alpha = 1.0;
    o->out_eps = 1e-6;
    o->heads = 1;
    o->dtype = ATTNRES_DTYPE_F32;
    struct { const char *flag; const char **dst; int use; } paths[] = {
        {"--device", &o->device, USE_ALL}, {"--db", &o->db, USE_ALL},
        {"--sources", &o->sources, USE_MIX | USE_PHASE1 | USE_MIXBW | USE_P1BW},
        {"--query", &o->query, USE_MIX | USE_PHASE2 | USE_MIXBW | USE_P2BW},
        {"--gain", &o->gain, USE_MIX | USE_PHASE2 | USE_MIXBW | USE_P2BW},
        {"--partial", &o->partial, USE_MIX | USE_PHASE2 | USE_MIXBW | USE_P2BW},
        {"--out-gain", &o->out_gain, USE_MIX | USE_PHASE2 | USE_MIXBW | USE_P2BW},
        {"--normed", &o->normed, USE_MIX | USE_PHASE2},
        /* mix_backward reads the forward's out (the epilogue's input);
         * phase2_backward recomputes it. */
        {"--out", &o->out, USE_MIX | USE_PHASE1 | USE_PHASE2 | USE_MIXBW},
        {"--queries", &o->queries, USE_PHASE1 | USE_P1BW}, {"--gains", &o->gains, USE_PHASE1 | USE_P1BW},
        {"--lse", &o->lse, USE_PHASE1 | USE_PHASE2 | USE_P2BW}, {"--o1", &o->o1, USE_PHASE2 | USE_P2BW},
        {"--sublayer", &o->sublayer, USE_PHASE2}, {"--partial-out", &o->partial_out, USE_PHASE2},
        {"--dout", &o->dout, USE_MIXBW | USE_P2BW}, {"--dsources", &o->dsources, USE_MIXBW | USE_P1BW},
        {"--dquery", &o->dquery, USE_MIXBW | USE_P2BW}, {"--dgain", &o->dgain, USE_MIXBW | USE_P2BW},
        {"--dpartial", &o->dpartial, USE_MIXBW | USE_P2BW}, {"--dalpha", &o->dalpha, USE_MIXBW},
        {"--dnormed", &o->dnormed, USE_MIXBW | USE_P2BW}, {"--dout-gain", &o->dout_gain, USE_MIXBW | USE_P2BW},
        /* Phase 2's backward writes --do1 and --dlse, phase 1's reads them. */
        {"--do1", &o->do1, USE_P1BW | USE_P2BW}, {"--dlse", &o->dlse, USE_P1BW | USE_P2BW},
        {"--dsublayer", &o->dsublayer, USE_P2BW}, {"--dqueries", &o->dqueries, USE_P1BW},
        {"--dgains", &o->dgains, USE_P1BW}};
    enum { NPATHS = sizeof paths / sizeof paths[0] };
    /* The file flags above, then the others. */
    cli_opt opts[NPATHS + 11] = {CLI_OPT_END};
    for (size_t k = 0; k < NPATHS; k++)
        opts[k] = (cli_opt)CLI_OPT_STRING(paths[k].flag, paths[k].dst);
    const cli_opt more[] = {CLI_OPT_FLAG("--require-exact", &o->require_exact),
                            CLI_OPT_FLAG("--dsources-f32", &o->dsources_f32),
                            CLI_OPT_FLAG("--fuse-add", &o->fuse_add),
                            CLI_OPT_CUSTOM("--op", o, parse_op),
                            CLI_OPT_INT64("--heads", &o->heads, 1, PROBLEM_MAX_HEADS, .seen = &o->have_heads),
                            CLI_OPT_DOUBLE("--eps", &o->eps),
                            CLI_OPT_DOUBLE("--scale", &o->scale),
                            CLI_OPT_DOUBLE("--alpha", &o->alpha, .seen = &o->have_alpha),
                            CLI_OPT_DOUBLE("--out-eps", &o->out_eps, .seen = &o->have_out_eps),
                            CLI_OPT_CUSTOM("--dtype", &o->dtype, cli_parse_dtype)};
    _Static_assert(sizeof more / sizeof more[0] + 1 == 11, "opts holds the paths, more and the end");
    memcpy(opts + NPATHS, more, sizeof more);
    const cli_spec spec = {.cmd = "run", .usage = run_usage, .opts = opts};
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED)
        return rc == CLI_HELP ? 1 : -1;
    if (!op_bit(o->op)) {
        cli_error("run", "--op %s is not an operation that run runs (see attnres run --help)", o->op_name);
        return -1;
    }
    /* Flags of another op are refused rather than silently ignored. */
    if (o->normed && o->op == ATTNRES_OP_MIX_BACKWARD) {
        cli_error("run", "--normed is not used by --op mix_backward: the epilogue's backward reads the forward's "
                         "--out, with --out-gain and --dnormed (the gradient of normed)");
        return -1;
    }
    if ((o->normed || o->out) && o->op == ATTNRES_OP_PHASE2_BACKWARD) {
        cli_error("run", "%s is not used by --op phase2_backward: its backward recomputes out from --o1 and "
                         "--partial, and the epilogue's reads --out-gain and --dnormed (the gradient of normed)",
                  o->normed ? "--normed" : "--out");
        return -1;
    }
    for (size_t k = 0; k < NPATHS; k++)
        if (*paths[k].dst && !(paths[k].use & op_bit(o->op))) {
            cli_error("run", "%s is not used by --op %s (see attnres run --help)", paths[k].flag, o->op_name);
            return -1;
        }
    if (o->have_alpha && o->op != ATTNRES_OP_MIX && o->op != ATTNRES_OP_MIX_BACKWARD) {
        cli_error("run", "--alpha is not used by --op %s (it has no additive form)", o->op_name);
        return -1;
    }
    if (o->fuse_add && o->op != ATTNRES_OP_PHASE2_BACKWARD) {
        cli_error("run", "--fuse-add is not used by --op %s (phase2's forward fuses the add with --sublayer)",
                  o->op_name);
        return -1;
    }
    if (o->have_out_eps && (o->op == ATTNRES_OP_PHASE1 || o->op == ATTNRES_OP_PHASE1_BACKWARD)) {
        cli_error("run", "--out-eps is not used by --op %s (it has no epilogue)", o->op_name);
        return -1;
    }
    if (o->op == ATTNRES_OP_MIX && (!o->sources || !o->query || !o->out)) {
        cli_error("run", "--sources, --query and --out are required (see attnres run --help)");
        return -1;
    }
    if (o->op == ATTNRES_OP_PHASE1 && (!o->sources || !o->queries || !o->out || !o->lse)) {
        cli_error("run", "--op phase1 requires --sources, --queries, --out and --lse (see attnres run --help)");
        return -1;
    }
    if (o->op == ATTNRES_OP_PHASE2 && (!o->o1 || !o->lse || !o->partial || !o->query || !o->out)) {
        cli_error("run", "--op phase2 requires --o1, --lse, --partial, --query and --out (see attnres run --help)");
        return -1;
    }
    if (o->dsources_f32 && o->op != ATTNRES_OP_MIX_BACKWARD && o->op != ATTNRES_OP_PHASE1_BACKWARD) {
        cli_error("run", "--dsources-f32 is not used by --op %s (it has no source gradients)", o->op_name);
        return -1;
    }
    if (o->op == ATTNRES_OP_MIX_BACKWARD) {
        if (!o->sources || !o->query || (!o->dout && !o->out_gain)) {
            cli_error("run", "--op mix_backward requires --sources, --query and --dout (which the epilogue's "
                             "--dnormed may replace; see attnres run --help)");
            return -1;
        }
        /* The epilogue: --out-gain selects it, and its backward reads the
         * forward's out and the gradient of normed. */
        if (o->out_gain && (!o->out || !o->dnormed)) {
            cli_error("run", "the output-norm epilogue's backward (--out-gain) also needs --out (the forward's "
                             "out) and --dnormed (the gradient of normed)");
            return -1;
        }
        if (!o->out_gain && (o->out || o->dnormed || o->dout_gain || o->have_out_eps)) {
            cli_error("run", "--out, --dnormed, --dout-gain and --out-eps belong to the output-norm epilogue's "
                             "backward: give --out-gain (the forward's gain)");
            return -1;
        }
        if (!o->dsources && !o->dquery && !o->dgain && !o->dpartial && !o->dalpha && !o->dout_gain) {
            cli_error("run", "--op mix_backward needs at least one gradient to write: --dsources, --dquery, "
                             "--dgain, --dpartial, --dalpha or --dout-gain");
            return -1;
        }
        if (o->dgain && !o->gain) {
            cli_error("run", "--dgain is the gradient of --gain, which was not given");
            return -1;
        }
        if ((o->dpartial || o->dalpha) && !o->partial) {
            cli_error("run", "--dpartial and --dalpha belong to the additive form: give --partial (and --alpha)");
            return -1;
        }
    }
    if ((o->op == ATTNRES_OP_PHASE1_BACKWARD || o->op == ATTNRES_OP_PHASE2_BACKWARD) && check_phase_backward(o))
        return -1;
    if (!o->sublayer != !o->partial_out) {
        cli_error("run", "the fused add needs both --sublayer (its input) and --partial-out (the updated partial)");
        return -1;
    }
    if (!eps_in_range(o->eps)) {
        cli_error("run", "--eps must be a positive finite number, from 1e-38 to 1e30 as float32 holds it (got %g)",
                  o->eps);
        return -1;
    }
    if (!eps_in_range(o->out_eps)) {
        cli_error("run",
                  "--out-eps must be a positive finite number, from 1e-38 to 1e30 as float32 holds it (got %g)",
                  o->out_eps);
        return -1;
    }
    if (!isfinite(o->scale) || !isfinite(o->alpha)) {
        cli_error("run", "--scale and --alpha must be finite");
        return -1;
    }
    if (o->have_alpha && !o->partial) {
        cli_error("run", "--alpha is only meaningful with --partial");
        return -1;
    }
    if ((o->op == ATTNRES_OP_MIX || o->op == ATTNRES_OP_PHASE2) &&
        (!o->out_gain != !o->normed || (o->have_out_eps && !o->normed))) {
        cli_error("run", "the output-norm epilogue needs both --out-gain and --normed");
        return -1;
    }
    /* Two outputs at one path would leave only one of them (mix_backward's
     * --out is an input, and so are phase1_backward's --do1 and --dlse). */
    const int p2bw = o->op == ATTNRES_OP_PHASE2_BACKWARD;
    const char *outs[][2] = {{"--out", o->op == ATTNRES_OP_MIX_BACKWARD ? NULL : o->out},
                             {"--normed", o->normed},
                             {"--partial-out", o->partial_out},
                             {"--lse", o->op == ATTNRES_OP_PHASE1 ? o->lse : NULL},
                             {"--dsources", o->dsources}, {"--dquery", o->dquery},
                             {"--dgain", o->dgain},       {"--dpartial", o->dpartial},
                             {"--dalpha", o->dalpha},     {"--dout-gain", o->dout_gain},
                             {"--do1", p2bw ? o->do1 : NULL}, {"--dlse", p2bw ? o->dlse : NULL},
                             {"--dsublayer", o->dsublayer}, {"--dqueries", o->dqueries},
                             {"--dgains", o->dgains}};
    const size_t nouts = sizeof outs / sizeof outs[0];
    for (size_t x = 0; x < nouts; x++)
        for (size_t y = x + 1; y < nouts; y++)
            if (outs[x][1] && outs[y][1] && strcmp(outs[x][1], outs[y][1]) == 0) {
                cli_error("run", "%s and %s name the same file %s", outs[x][0], outs[y][0], outs[x][1]);
                return -1;
            }
    /* A backward's inputs are read, never written (mix_backward's --out is
     * the forward's out): an output at an input's path would replace that
     * input. */
    if (op_bit(o->op) & USE_BACKWARD) {
        const int p1bw = o->op == ATTNRES_OP_PHASE1_BACKWARD;
        const char *ins[][2] = {{"--sources", o->sources}, {"--query", o->query},   {"--gain", o->gain},
                                {"--partial", o->partial}, {"--dout", o->dout},     {"--out", o->out},
                                {"--out-gain", o->out_gain}, {"--dnormed", o->dnormed}, {"--queries", o->queries},
                                {"--gains", o->gains},     {"--o1", o->o1},         {"--lse", o->lse},
                                {"--do1", p1bw ? o->do1 : NULL}, {"--dlse", p1bw ? o->dlse : NULL}};
        for (size_t x = 0; x < nouts; x++)
            for (size_t y = 0; y < sizeof ins / sizeof ins[0]; y++)
                if (outs[x][1] && ins[y][1] && strcmp(outs[x][1], ins[y][1]) == 0) {
                    cli_error("run", "%s names the file of the input %s, %s: it would be replaced", outs[x][0],
                              ins[y][0], ins[y][1]);
                    return -1;
                }
    }
    return 0;
}

int cmd_run(int argc, char **argv)
{
    run_opts o;
    int prc = parse(argc, argv, &o);
    if (prc)
        return prc > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    switch (o.op) {
    case ATTNRES_OP_PHASE1: return run_phase1(&o);
    case ATTNRES_OP_PHASE2: return run_phase2(&o);
    case ATTNRES_OP_MIX_BACKWARD: return run_mix_backward(&o);
    case ATTNRES_OP_PHASE1_BACKWARD: return run_phase1_backward(&o);
    case ATTNRES_OP_PHASE2_BACKWARD: return run_phase2_backward(&o);
    default: return run_mix(&o);
    }
}
