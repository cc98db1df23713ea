/*
 * cmd_run.c - `attnres run`: the mix operation on .npy inputs.
 *
 * Everything is read and checked before the device is touched, and outputs
 * are written atomically at the end, so bad input never leaves a file.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnres.h"
#include "cli.h"
#include "convert.h"
#include "npy.h"

static const char run_usage[] =
    "usage: attnres run [--device cpu|cuda:N] [--db FILE] --sources S.npy --query W.npy\n"
    "                   [--gain G.npy] [--heads H] [--eps E] [--scale C]\n"
    "                   [--partial P.npy --alpha A]\n"
    "                   [--out-gain GO.npy --out-eps EO --normed NORMED.npy]\n"
    "                   [--dtype f32|bf16|f16] [--require-exact] --out OUT.npy\n"
    "\n"
    "  S is float32 (N, T, d) in C order; W, G, GO are float32 (d,); P is float32 (T, d).\n"
    "  OUT and NORMED are written as float32 (T, d). --dtype is the storage type the\n"
    "  kernel runs in: inputs are rounded to it and results widened back.\n"
    "  Defaults: gain 1, heads 1, eps 1e-6, scale 1, alpha 1, out-eps 1e-6, dtype f32,\n"
    "  the best device present, no database (the built-in generic kernel).\n";

typedef struct run_opts {
    const char *device, *db, *sources, *query, *gain, *partial, *out_gain, *normed, *out;
    double eps, scale, alpha, out_eps;
    int64_t heads;
    attnres_dtype dtype;
    int have_alpha, have_out_eps, require_exact;
} run_opts;

static int parse(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->eps = 1e-6;
    o->scale = 1.0;
    o->alpha = 1.0;
    o->out_eps = 1e-6;
    o->heads = 1;
    o->dtype = ATTNRES_DTYPE_F32;
    struct { const char *flag; const char **dst; } paths[] = {
        {"--device", &o->device}, {"--db", &o->db}, {"--sources", &o->sources}, {"--query", &o->query},
        {"--gain", &o->gain}, {"--partial", &o->partial}, {"--out-gain", &o->out_gain},
        {"--normed", &o->normed}, {"--out", &o->out}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(run_usage, stdout);
            return 1;
        }
        int matched = 0;
        for (size_t k = 0; k < sizeof paths / sizeof paths[0]; k++)
            if (strcmp(a, paths[k].flag) == 0) {
                if (!(*paths[k].dst = cli_value("run", argc, argv, &i)))
                    return -1;
                matched = 1;
            }
        if (matched)
            continue;
        const char *v;
        if (strcmp(a, "--require-exact") == 0) {
            o->require_exact = 1;
        } else if (strcmp(a, "--heads") == 0) {
            if (!(v = cli_value("run", argc, argv, &i)) || cli_parse_int("run", a, v, &o->heads))
                return -1;
        } else if (strcmp(a, "--eps") == 0 || strcmp(a, "--scale") == 0 || strcmp(a, "--alpha") == 0 ||
                   strcmp(a, "--out-eps") == 0) {
            double *dst = strcmp(a, "--eps") == 0     ? &o->eps
                          : strcmp(a, "--scale") == 0 ? &o->scale
                          : strcmp(a, "--alpha") == 0 ? &o->alpha
                                                      : &o->out_eps;
            if (!(v = cli_value("run", argc, argv, &i)) || cli_parse_double("run", a, v, dst))
                return -1;
            o->have_alpha |= dst == &o->alpha;
            o->have_out_eps |= dst == &o->out_eps;
        } else if (strcmp(a, "--dtype") == 0) {
            if (!(v = cli_value("run", argc, argv, &i)))
                return -1;
            if (attnres_dtype_parse(v, &o->dtype) != ATTNRES_OK) {
                cli_error("run", "--dtype must be f32, bf16 or f16 (got '%s')", v);
                return -1;
            }
        } else {
            cli_error("run", "unknown option '%s' (see attnres run --help)", a);
            return -1;
        }
    }
    if (!o->sources || !o->query || !o->out) {
        cli_error("run", "--sources, --query and --out are required (see attnres run --help)");
        return -1;
    }
    if (!(o->eps > 0) || !isfinite(o->eps)) {
        cli_error("run", "--eps must be a positive finite number (got %g)", o->eps);
        return -1;
    }
    if (!(o->out_eps > 0) || !isfinite(o->out_eps)) {
        cli_error("run", "--out-eps must be a positive finite number (got %g)", o->out_eps);
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
    if (!o->out_gain != !o->normed || (o->have_out_eps && !o->normed)) {
        cli_error("run", "the output-norm epilogue needs both --out-gain and --normed");
        return -1;
    }
    if (o->heads < 1 || o->heads > 1 << 20) {
        cli_error("run", "--heads must be at least 1 (got %lld)", (long long)o->heads);
        return -1;
    }
    return 0;
}

/* Inputs as read from disk, with their shapes checked against each other. */
typedef struct run_inputs {
    npy_array sources, query, gain, partial, out_gain;
    int64_t n, t, d;
} run_inputs;

static void inputs_free(run_inputs *in)
{
    npy_free(&in->sources);
    npy_free(&in->query);
    npy_free(&in->gain);
    npy_free(&in->partial);
    npy_free(&in->out_gain);
}

static int read_vector(const char *path, const char *flag, int64_t d, npy_array *a)
{
    char err[512];
    if (npy_read_f32(path, a, err, sizeof err)) {
        cli_error("run", "%s", err);
        return -1;
    }
    if (a->ndim != 1 || a->shape[0] != d) {
        cli_error("run", "%s %s must have shape (%lld,) to match d of the sources", flag, path, (long long)d);
        return -1;
    }
    return 0;
}

static int read_inputs(const run_opts *o, run_inputs *in)
{
    char err[512];
    memset(in, 0, sizeof *in);
    if (npy_read_f32(o->sources, &in->sources, err, sizeof err)) {
        cli_error("run", "%s", err);
        return -1;
    }
    if (in->sources.ndim != 3) {
        cli_error("run", "--sources %s must have shape (N, T, d), got %d dimension(s)", o->sources,
                  in->sources.ndim);
        return -1;
    }
    in->n = in->sources.shape[0];
    in->t = in->sources.shape[1];
    in->d = in->sources.shape[2];
    if (in->n < 1) {
        cli_error("run", "--sources %s has N = 0 sources; at least one is needed", o->sources);
        return -1;
    }
    if (in->d < 1) {
        cli_error("run", "--sources %s has d = 0", o->sources);
        return -1;
    }
    if (in->n > 1 << 20) {
        cli_error("run", "--sources %s has implausibly many sources (%lld)", o->sources, (long long)in->n);
        return -1;
    }
    if (in->d % o->heads != 0) {
        cli_error("run", "--heads %lld does not divide d = %lld", (long long)o->heads, (long long)in->d);
        return -1;
    }
    if (read_vector(o->query, "--query", in->d, &in->query))
        return -1;
    if (o->gain && read_vector(o->gain, "--gain", in->d, &in->gain))
        return -1;
    if (o->out_gain && read_vector(o->out_gain, "--out-gain", in->d, &in->out_gain))
        return -1;
    if (o->partial) {
        if (npy_read_f32(o->partial, &in->partial, err, sizeof err)) {
            cli_error("run", "%s", err);
            return -1;
        }
        if (in->partial.ndim != 2 || in->partial.shape[0] != in->t || in->partial.shape[1] != in->d) {
            cli_error("run", "--partial %s must have shape (%lld, %lld) to match (T, d) of the sources", o->partial,
                      (long long)in->t, (long long)in->d);
            return -1;
        }
    }
    return 0;
}

/* Device buffers of one run, in the storage dtype. */
typedef struct run_buffers {
    attnres_device *dev;
    void *sources, *partial, *out, *normed;
    float *query, *out_gain;
} run_buffers;

int cmd_run(int argc, char **argv)
{
    run_opts o;
    int prc = parse(argc, argv, &o);
    if (prc)
        return prc > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    run_inputs in;
    if (read_inputs(&o, &in)) {
        inputs_free(&in);
        return CLI_EXIT_FAIL;
    }
    attnres_problem p;
    attnres_problem_init(&p, o.dtype, in.d, (int32_t)in.n);
    p.heads = (int32_t)o.heads;
    p.form = o.partial ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    p.epilogue = o.normed ? 1 : 0;

    int exit_code = CLI_EXIT_FAIL;
    char msg[1024];
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    const size_t es = attnres_dtype_size(o.dtype);
    const size_t row = (size_t)in.t * (size_t)in.d;
    void *src_store = malloc(row * (size_t)in.n * es + 1), *part_store = NULL;
    void *out_store = malloc(row * es + 1), *normed_store = p.epilogue ? malloc(row * es + 1) : NULL;
    float *query = malloc((size_t)in.d * 4), *out_f = malloc(row * 4 + 4);
    float *normed_f = p.epilogue ? malloc(row * 4 + 4) : NULL;
    const void **srcs = malloc(sizeof(void *) * (size_t)in.n);
    if (!src_store || !out_store || !query || !out_f || !srcs || (p.epilogue && (!normed_store || !normed_f))) {
        cli_error("run", "out of memory for T = %lld, d = %lld, N = %lld", (long long)in.t, (long long)in.d,
                  (long long)in.n);
        goto done;
    }
    convert_to_storage(o.dtype, in.sources.data, src_store, row * (size_t)in.n);
    for (int64_t i = 0; i < in.n; i++)
        srcs[i] = (const char *)src_store + (size_t)i * row * es;
    attnres_fold_query(in.query.data, o.gain ? in.gain.data : NULL, query, in.d);
    if (o.partial) {
        if (!(part_store = malloc(row * es + 1))) {
            cli_error("run", "out of memory");
            goto done;
        }
        convert_to_storage(o.dtype, in.partial.data, part_store, row);
    }

    const char *spec = o.device ? o.device : cli_best_device();
    int rc = attnres_device_open(spec, &dev, msg, sizeof msg);
    if (rc) {
        cli_error("run", "cannot open device %s: %s", spec, msg);
        goto done;
    }
    if (strcmp(spec, "cpu") != 0 && strncmp(spec, "cpu:", 4) != 0) {
        cli_error("run", "device %s: attnres run moves data through host memory only on the CPU backend", spec);
        goto done;
    }
    if (o.db && (rc = attnres_db_open(o.db, &db, msg, sizeof msg))) {
        cli_error("run", "%s", msg);
        goto done;
    }
    rc = attnres_plan_create(dev, db, &p, o.require_exact ? ATTNRES_PLAN_REQUIRE_EXACT : 0, &plan, msg, sizeof msg);
    if (rc) {
        cli_error("run", "cannot plan the problem: %s", msg);
        goto done;
    }
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = srcs;
    a.query = query;
    a.scale = (float)o.scale;
    a.eps = (float)o.eps;
    a.partial = part_store;
    a.alpha = (float)o.alpha;
    a.out = out_store;
    a.out_gain = o.out_gain ? in.out_gain.data : NULL;
    a.out_eps = (float)o.out_eps;
    a.normed = normed_store;
    rc = attnres_run_mix(plan, in.t, &a, NULL);
    if (rc) {
        cli_error("run", "%s: %s", attnres_errstr(rc), attnres_plan_errmsg(plan));
        goto done;
    }
    convert_from_storage(o.dtype, out_store, out_f, row);
    int64_t shape[2] = {in.t, in.d};
    if (npy_write_f32(o.out, out_f, 2, shape, msg, sizeof msg)) {
        cli_error("run", "%s", msg);
        goto done;
    }
    if (p.epilogue) {
        convert_from_storage(o.dtype, normed_store, normed_f, row);
        if (npy_write_f32(o.normed, normed_f, 2, shape, msg, sizeof msg)) {
            cli_error("run", "%s", msg);
            remove(o.out); /* both outputs or neither */
            goto done;
        }
    }
    exit_code = CLI_EXIT_OK;
done:
    attnres_plan_destroy(plan);
    attnres_db_close(db);
    attnres_device_close(dev);
    free(src_store);
    free(part_store);
    free(out_store);
    free(normed_store);
    free(query);
    free(out_f);
    free(normed_f);
    free(srcs);
    inputs_free(&in);
    return exit_code;
}
