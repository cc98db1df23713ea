/*
 * cmd_run.h - what the files of `attnres run` (cmd_run*.c) share: the parsed
 * options, and the helpers each op's run calls.
 */
#ifndef CLI_CMD_RUN_H
#define CLI_CMD_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "attnres.h"
#include "npy.h"

/* The options of `attnres run`, parsed and checked (cmd_run.c). */
typedef struct run_opts {
    attnres_op op;
    const char *op_name;
    const char *device, *db, *sources, *query, *gain, *partial, *out_gain, *normed, *out;
    const char *queries, *gains, *lse, *o1, *sublayer, *partial_out;
    const char *dout, *dsources, *dquery, *dgain, *dpartial, *dalpha; /* mix_backward */
    const char *dnormed, *dout_gain; /* mix_backward with the epilogue (--out is then an input) */
    /* phase1_backward and phase2_backward: --do1 and --dlse are phase 2's
     * outputs and phase 1's inputs. */
    const char *do1, *dlse, *dsublayer, *dqueries, *dgains;
    double eps, scale, alpha, out_eps;
    int64_t heads;
    attnres_dtype dtype;
    int have_alpha, have_out_eps, have_heads, require_exact;
    int dsources_f32; /* mix_backward, phase1_backward: ATTNRES_GRAD_DSOURCES_F32 */
    int fuse_add;     /* phase2_backward: the forward fused the add (b = partial + f) */
} run_opts;

/* The most device buffers one run stages: phase2_backward's o1, lse,
 * partial, query, dout, do1, dlse, dpartial, dsublayer, dquery and
 * workspace, and with the epilogue out_gain, dnormed and dout_gain (14;
 * mix_backward stages 12). */
#define RUN_MAX_STAGED 16

/* Device copies of a run's buffers; freed together. */
typedef struct staged {
    attnres_device *dev;
    void *ptr[RUN_MAX_STAGED];
    int count, failed;
} staged;

/* One output file: its path, float32 data and shape. */
typedef struct out_file {
    const char *path;
    const float *data;
    int ndim;
    int64_t shape[3];
} out_file;

/* One output of a run on its way to its file: the device buffer the op
 * wrote (NULL: the run has no such output), the host buffer it is copied
 * back to, `count` elements in the storage dtype, and the float32 copy
 * the file gets (NULL when the output is float32 already, as lse is; the
 * file's data is then the host buffer). */
typedef struct run_output {
    const void *device;
    void *host;
    size_t count;
    float *f;
    out_file file;
} run_output;

/* Each op's run (cmd_run_mix.c, cmd_run_phase.c, cmd_run_backward.c,
 * cmd_run_phase_backward.c): reads its inputs, runs the op on the device
 * and writes its outputs; a CLI_EXIT_* code. */
int run_mix(const run_opts *o);
int run_phase1(const run_opts *o);
int run_phase2(const run_opts *o);
int run_mix_backward(const run_opts *o);
int run_phase1_backward(const run_opts *o);
int run_phase2_backward(const run_opts *o);

/* ---- cmd_run_io.c ---------------------------------------------------- */

/* "(2, 3)", "(4,)": the shape of a for a message. */
void run_shape_text(const npy_array *a, char *buf, size_t len);

/* Reads a float32 array and checks its shape against want[0..ndim), where
 * names says what each axis is ("T, d") and why says what fixes them. */
int run_read_shaped(const char *flag, const char *path, int ndim, const int64_t *want, const char *names,
                    const char *why, npy_array *a);

/* Reads a float32 vector of d elements (flag names it in messages). */
int run_read_vector(const char *path, const char *flag, int64_t d, npy_array *a);

/* Reads --sources: (N, T, d) with N >= 1 and d >= 1. */
int run_read_sources(const run_opts *o, npy_array *s);

/* The inputs of the depth mix and of its backward (cmd_run_mix.c,
 * cmd_run_backward.c) as read from disk, each shape checked against the
 * sources'; an array whose flag was not given stays empty. */
typedef struct mix_inputs {
    npy_array sources, query, gain, partial, out_gain, dout;
    int64_t n, t, d; /* the sources' shape (N, T, d) */
} mix_inputs;

/* Reads --sources and --query, and whichever of --gain, --partial,
 * --out-gain and --dout were given (each op's options admit only its own):
 * vectors of d elements, partial and dout (T, d). 0, else -1 with the
 * reason printed and in emptied. */
int run_read_mix_inputs(const run_opts *o, mix_inputs *in);

/* Frees the arrays of in; harmless on an emptied one. */
void run_mix_inputs_free(mix_inputs *in);

/* The most outputs one op writes: phase2_backward's do1, dlse, dpartial,
 * dsublayer, dquery, dgain and dout_gain (mix_backward writes 6). */
#define RUN_MAX_OUTPUTS 7

/* Writes every output that has a path (RUN_MAX_OUTPUTS at most) or none; 0
 * on success, else -1 with the reason printed. */
int run_write_outputs(const out_file *files, int count);

/* ---- cmd_run_device.c ------------------------------------------------ */

/* Allocates bytes on the device and copies host data there (if any); a
 * failure sets st->failed, which the caller checks once after staging. */
void *run_stage(staged *st, const void *host, size_t bytes);
void run_unstage(staged *st);

/* Opens the device, the database if any, and plans p. On failure the
 * caller closes whatever was opened (run_close_plan). */
int run_open_plan(const run_opts *o, const attnres_problem *p, attnres_device **dev, attnres_db **db,
                  attnres_plan **plan);
void run_close_plan(attnres_device *dev, attnres_db *db, attnres_plan *plan);

/* After a launch that returned rc: prints the failure, or copies every
 * output back and converts it to float32; the staged buffers are released
 * either way. 0, else -1 with the reason printed. */
int run_fetch(const run_opts *o, attnres_plan *plan, int rc, staged *st, run_output *outs, int count);

/* The end of a run (at most RUN_MAX_OUTPUTS outputs): run_fetch, then the
 * files written, all or none. CLI_EXIT_OK, else CLI_EXIT_FAIL with the
 * reason printed. */
int run_deliver(const run_opts *o, attnres_plan *plan, int rc, staged *st, run_output *outs, int count);

/* Checks p before anything large is allocated for it. */
int run_check_problem(const attnres_problem *p);

#endif
