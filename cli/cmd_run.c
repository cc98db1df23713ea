/*
 * cmd_run.c - `attnres run`: one operation (mix, phase1 or phase2) on .npy
 * inputs.
 *
 * Everything is read and checked before the device is touched, and outputs
 * are written atomically at the end, all of them or none, so bad input never
 * leaves a file.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "atomic_file.h"
#include "attnres.h"
#include "cli.h"
#include "convert.h"
#include "attnres-impl.h"
#include "npy.h"
#include "problems.h"

static const char run_usage[] =
    "usage: attnres run [--op mix|phase1|phase2] [--device cpu|cuda:N] [--db FILE]\n"
    "                   [--dtype f32|bf16|f16] [--heads H] [--eps E] [--scale C]\n"
    "                   [--require-exact] OP-SPECIFIC FLAGS --out OUT.npy\n"
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
    "  Every array is float32 in C order. --dtype is the storage type the kernel runs\n"
    "  in: inputs are rounded to it and results widened back (lse stays float32).\n"
    "  Defaults: gain 1, heads 1, eps 1e-6, scale 1, alpha 1, out-eps 1e-6, dtype f32,\n"
    "  the best device present, no database (the built-in generic kernel).\n"
    "  Outputs are written all or none, and never on bad input.\n";

typedef struct run_opts {
    attnres_op op;
    const char *op_name;
    const char *device, *db, *sources, *query, *gain, *partial, *out_gain, *normed, *out;
    const char *queries, *gains, *lse, *o1, *sublayer, *partial_out;
    double eps, scale, alpha, out_eps;
    int64_t heads;
    attnres_dtype dtype;
    int have_alpha, have_out_eps, have_heads, require_exact;
} run_opts;

/* Which ops use a flag. */
enum { USE_MIX = 1, USE_PHASE1 = 2, USE_PHASE2 = 4, USE_ALL = 7 };

static int op_bit(attnres_op op)
{
    return op == ATTNRES_OP_MIX ? USE_MIX : op == ATTNRES_OP_PHASE1 ? USE_PHASE1 : USE_PHASE2;
}

static int parse_op(const char *cmd, const char *flag, const char *v, void *dst)
{
    run_opts *o = dst;
    static const struct { const char *name; attnres_op op; } ops[] = {
        {"mix", ATTNRES_OP_MIX}, {"phase1", ATTNRES_OP_PHASE1}, {"phase2", ATTNRES_OP_PHASE2}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++)
        if (strcmp(v, ops[k].name) == 0) {
            o->op = ops[k].op;
            o->op_name = ops[k].name;
            return 0;
        }
    cli_error(cmd, "%s must be mix, phase1 or phase2 (got '%s')", flag, v);
    return -1;
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
        {"--sources", &o->sources, USE_MIX | USE_PHASE1}, {"--query", &o->query, USE_MIX | USE_PHASE2},
        {"--gain", &o->gain, USE_MIX | USE_PHASE2}, {"--partial", &o->partial, USE_MIX | USE_PHASE2},
        {"--out-gain", &o->out_gain, USE_MIX | USE_PHASE2}, {"--normed", &o->normed, USE_MIX | USE_PHASE2},
        {"--out", &o->out, USE_ALL}, {"--queries", &o->queries, USE_PHASE1}, {"--gains", &o->gains, USE_PHASE1},
        {"--lse", &o->lse, USE_PHASE1 | USE_PHASE2}, {"--o1", &o->o1, USE_PHASE2},
        {"--sublayer", &o->sublayer, USE_PHASE2}, {"--partial-out", &o->partial_out, USE_PHASE2}};
    enum { NPATHS = sizeof paths / sizeof paths[0] };
    /* The file flags above, then the others. */
    cli_opt opts[NPATHS + 9] = {CLI_OPT_END};
    for (size_t k = 0; k < NPATHS; k++)
        opts[k] = (cli_opt)CLI_OPT_STRING(paths[k].flag, paths[k].dst);
    const cli_opt more[] = {CLI_OPT_FLAG("--require-exact", &o->require_exact),
                            CLI_OPT_CUSTOM("--op", o, parse_op),
                            CLI_OPT_INT64("--heads", &o->heads, 1, PROBLEM_MAX_HEADS, .seen = &o->have_heads),
                            CLI_OPT_DOUBLE("--eps", &o->eps),
                            CLI_OPT_DOUBLE("--scale", &o->scale),
                            CLI_OPT_DOUBLE("--alpha", &o->alpha, .seen = &o->have_alpha),
                            CLI_OPT_DOUBLE("--out-eps", &o->out_eps, .seen = &o->have_out_eps),
                            CLI_OPT_CUSTOM("--dtype", &o->dtype, cli_parse_dtype)};
    _Static_assert(sizeof more / sizeof more[0] + 1 == 9, "opts holds the paths, more and the end");
    memcpy(opts + NPATHS, more, sizeof more);
    const cli_spec spec = {.cmd = "run", .usage = run_usage, .opts = opts};
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED)
        return rc == CLI_HELP ? 1 : -1;
    /* Flags of another op are refused rather than silently ignored. */
    for (size_t k = 0; k < NPATHS; k++)
        if (*paths[k].dst && !(paths[k].use & op_bit(o->op))) {
            cli_error("run", "%s is not used by --op %s (see attnres run --help)", paths[k].flag, o->op_name);
            return -1;
        }
    if (o->have_alpha && o->op != ATTNRES_OP_MIX) {
        cli_error("run", "--alpha is not used by --op %s (it has no additive form)", o->op_name);
        return -1;
    }
    if (o->have_out_eps && o->op == ATTNRES_OP_PHASE1) {
        cli_error("run", "--out-eps is not used by --op phase1 (it has no epilogue)");
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
    if (!o->sublayer != !o->partial_out) {
        cli_error("run", "the fused add needs both --sublayer (its input) and --partial-out (the updated partial)");
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
    /* Two outputs at one path would leave only one of them. */
    const char *outs[][2] = {{"--out", o->out}, {"--normed", o->normed}, {"--partial-out", o->partial_out},
                             {"--lse", o->op == ATTNRES_OP_PHASE1 ? o->lse : NULL}};
    for (size_t x = 0; x < 4; x++)
        for (size_t y = x + 1; y < 4; y++)
            if (outs[x][1] && outs[y][1] && strcmp(outs[x][1], outs[y][1]) == 0) {
                cli_error("run", "%s and %s name the same file %s", outs[x][0], outs[y][0], outs[x][1]);
                return -1;
            }
    return 0;
}

/* ---- reading inputs -------------------------------------------------- */

static void shape_text(const npy_array *a, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < a->ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, a->ndim == 1 ? ",)" : ")");
}

/* Reads a float32 array and checks its shape against want[0..ndim), where
 * names says what each axis is ("T, d") and why says what fixes them. */
static int read_shaped(const char *flag, const char *path, int ndim, const int64_t *want, const char *names,
                       const char *why, npy_array *a)
{
    char err[512];
    if (npy_read_f32(path, a, err, sizeof err)) {
        cli_error("run", "%s", err);
        return -1;
    }
    int ok = a->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = a->shape[i] == want[i];
    if (!ok) {
        char want_text[128] = "(", got[128];
        size_t used = 1;
        for (int i = 0; i < ndim; i++)
            used += (size_t)snprintf(want_text + used, sizeof want_text - used, "%s%lld", i ? ", " : "",
                                     (long long)want[i]);
        snprintf(want_text + used, sizeof want_text - used, ndim == 1 ? ",)" : ")");
        shape_text(a, got, sizeof got);
        cli_error("run", "%s %s must have shape (%s%s) = %s %s, got %s", flag, path, names, ndim == 1 ? "," : "",
                  want_text, why, got);
        return -1;
    }
    return 0;
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

/* Reads --sources: (N, T, d) with N >= 1 and d >= 1. */
static int read_sources(const run_opts *o, npy_array *s)
{
    char err[512];
    if (npy_read_f32(o->sources, s, err, sizeof err)) {
        cli_error("run", "%s", err);
        return -1;
    }
    if (s->ndim != 3) {
        cli_error("run", "--sources %s must have shape (N, T, d), got %d dimension(s)", o->sources, s->ndim);
        return -1;
    }
    if (s->shape[0] < 1) {
        cli_error("run", "--sources %s has N = 0 sources; at least one is needed", o->sources);
        return -1;
    }
    if (s->shape[2] < 1) {
        cli_error("run", "--sources %s has d = 0", o->sources);
        return -1;
    }
    if (s->shape[0] > PROBLEM_MAX_N) {
        cli_error("run", "--sources %s has N = %lld sources; at most %d are supported", o->sources,
                  (long long)s->shape[0], PROBLEM_MAX_N);
        return -1;
    }
    if (s->shape[2] % o->heads != 0) {
        cli_error("run", "--heads %lld does not divide d = %lld", (long long)o->heads, (long long)s->shape[2]);
        return -1;
    }
    return 0;
}

/* ---- device, plan and outputs ----------------------------------------- */

/* Device copies of a run's buffers; freed together. */
typedef struct staged {
    attnres_device *dev;
    void *ptr[8];
    int count, failed;
} staged;

/* Allocates bytes on the device and copies host data there (if any). */
static void *stage(staged *st, const void *host, size_t bytes)
{
    void *d = NULL;
    if (st->failed || st->count == 8 || st->dev->ops->mem_alloc(st->dev, bytes ? bytes : 4, &d) != ATTNRES_OK) {
        st->failed = 1;
        return NULL;
    }
    st->ptr[st->count++] = d;
    if (host && st->dev->ops->copy_to_device(st->dev, d, host, bytes) != ATTNRES_OK)
        st->failed = 1;
    return d;
}

static void unstage(staged *st)
{
    for (int i = 0; i < st->count; i++)
        st->dev->ops->mem_free(st->dev, st->ptr[i]);
    st->count = 0;
}

/* Opens the device, the database if any, and plans p. On failure the
 * caller closes whatever was opened. */
static int open_plan(const run_opts *o, const attnres_problem *p, attnres_device **dev, attnres_db **db,
                     attnres_plan **plan)
{
    char msg[1024];
    *dev = NULL;
    *db = NULL;
    *plan = NULL;
    const char *spec = o->device ? o->device : cli_best_device();
    if (attnres_device_open(spec, dev, msg, sizeof msg)) {
        cli_error("run", "cannot open device %s: %s", spec, msg);
        return -1;
    }
    if (o->db && attnres_db_open(o->db, db, msg, sizeof msg)) {
        cli_error("run", "%s", msg);
        return -1;
    }
    if (attnres_plan_create(*dev, *db, p, o->require_exact ? ATTNRES_PLAN_REQUIRE_EXACT : 0, plan, msg,
                            sizeof msg)) {
        cli_error("run", "cannot plan the problem: %s", msg);
        return -1;
    }
    return 0;
}

static void close_plan(attnres_device *dev, attnres_db *db, attnres_plan *plan)
{
    attnres_plan_destroy(plan);
    attnres_db_close(db);
    attnres_device_close(dev);
}

/* One output file: its path, float32 data and shape. */
typedef struct out_file {
    const char *path;
    const float *data;
    int ndim;
    int64_t shape[3];
} out_file;

/* One output's way into place: the new content waits in a temporary beside
 * the path (atomic_file.h), and an earlier file at the path is kept as a
 * backup until every output is in place, so that a failure can put it back. */
typedef struct out_commit {
    atomic_file file; /* the new content, until it is renamed onto the path */
    char backup[4200];
    int have_backup; /* backup holds the earlier file (a hard link, or moved aside) */
    int moved_aside; /* the earlier file was renamed to backup, not linked */
} out_commit;

/* Puts back what path held before: the backup when there was an earlier
 * file, else nothing. Returns 0 when the path is as it was. */
static int restore_one(const char *path, out_commit *c)
{
    /* A path not yet replaced still holds its earlier file (a hard-linked
     * backup is only a second name for it): nothing to do. */
    if (!c->file.renamed && !c->moved_aside)
        return 0;
    if (c->have_backup) {
        if (rename(c->backup, path) != 0)
            return -1;
        c->have_backup = 0;
        return 0;
    }
    if (c->file.renamed && unlink(path) != 0 && errno != ENOENT)
        return -1;
    return 0;
}

/* Writes every output or none. "None" means each path holds what it held
 * before: all the new files are first written as temporaries, then each
 * earlier file gets a backup (a hard link, so the path never disappears;
 * renamed aside where the file system has no hard links), and only then are
 * the temporaries renamed into place. When a step fails, the outputs already
 * renamed are put back from their backups before the error is reported. */
static int write_outputs(const out_file *files, int count)
{
    char msg[1024];
    out_commit c[4];
    int rc = -1, restored = 1, n = count < 4 ? count : 4;
    memset(c, 0, sizeof c);
    for (int i = 0; i < n; i++) {
        if (!files[i].path)
            continue;
        int b = snprintf(c[i].backup, sizeof c[i].backup, "%s.attnres-old-%ld", files[i].path, (long)getpid());
        if (b < 0 || (size_t)b >= sizeof c[i].backup) {
            cli_error("run", "%s: path too long", files[i].path);
            goto cleanup;
        }
        if (atomic_file_open(&c[i].file, files[i].path, msg, sizeof msg)) {
            cli_error("run", "%s", msg);
            goto cleanup;
        }
        errno = 0;
        if (npy_write_f32_stream(c[i].file.f, files[i].data, files[i].ndim, files[i].shape) != 0) {
            cli_error("run", "cannot write %s: %s", files[i].path, errno ? strerror(errno) : "write error");
            goto cleanup;
        }
        if (atomic_file_close(&c[i].file, msg, sizeof msg)) {
            cli_error("run", "%s", msg);
            goto cleanup;
        }
    }
    for (int i = 0; i < n; i++) {
        if (!files[i].path)
            continue;
        if (link(files[i].path, c[i].backup) == 0) {
            c[i].have_backup = 1;
        } else if (errno == ENOENT) {
            /* Nothing there before: a failure later removes the new file. */
        } else if (errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP || errno == EMLINK) {
            /* No hard links here: the earlier file is moved aside just
             * before the new one takes its place. */
            c[i].moved_aside = 1;
        } else {
            cli_error("run", "%s: cannot keep a backup of the earlier file while replacing it: %s", files[i].path,
                      strerror(errno));
            goto cleanup;
        }
    }
    for (int i = 0; i < n; i++) {
        if (!files[i].path)
            continue;
        if (c[i].moved_aside) {
            if (rename(files[i].path, c[i].backup) == 0)
                c[i].have_backup = 1;
            else if (errno != ENOENT) {
                cli_error("run", "%s: cannot move the earlier file aside: %s", files[i].path, strerror(errno));
                goto restore;
            }
        }
        if (atomic_file_commit(&c[i].file, msg, sizeof msg)) {
            cli_error("run", "%s", msg);
            goto restore;
        }
    }
    rc = 0;
    goto cleanup;
restore:
    restored = 1;
    for (int i = n; i-- > 0;) {
        if (!files[i].path || restore_one(files[i].path, &c[i]) == 0)
            continue;
        /* The backup stays where it is, so the earlier content is not lost;
         * the user is told where to find it. */
        cli_error("run", "%s: could not put the earlier file back (%s); it is kept at %s", files[i].path,
                  strerror(errno), c[i].backup);
        c[i].have_backup = 0;
        restored = 0;
    }
cleanup:
    if (rc != 0 && restored)
        cli_error("run", "no output was written: every output path holds what it held before");
    for (int i = 0; i < n; i++) {
        atomic_file_discard(&c[i].file);
        if (c[i].have_backup)
            unlink(c[i].backup);
    }
    return rc;
}

/* Checks p before anything large is allocated for it. */
static int check_problem(const attnres_problem *p)
{
    char msg[512];
    if (attnres_problem_check(p, msg, sizeof msg) != ATTNRES_OK) {
        cli_error("run", "%s", msg);
        return -1;
    }
    return 0;
}

/* ---- --op mix --------------------------------------------------------- */

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

static int read_inputs(const run_opts *o, run_inputs *in)
{
    char err[512];
    memset(in, 0, sizeof *in);
    if (read_sources(o, &in->sources))
        return -1;
    in->n = in->sources.shape[0];
    in->t = in->sources.shape[1];
    in->d = in->sources.shape[2];
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

static int run_mix(const run_opts *o)
{
    run_inputs in;
    if (read_inputs(o, &in)) {
        inputs_free(&in);
        return CLI_EXIT_FAIL;
    }
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, in.d, (int32_t)in.n);
    p.heads = (int32_t)o->heads;
    p.form = o->partial ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    p.epilogue = o->normed ? 1 : 0;

    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    const size_t es = attnres_dtype_size(o->dtype);
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
    convert_to_storage(o->dtype, in.sources.data, src_store, row * (size_t)in.n);
    for (int64_t i = 0; i < in.n; i++)
        srcs[i] = (const char *)src_store + (size_t)i * row * es;
    attnres_fold_query(in.query.data, o->gain ? in.gain.data : NULL, query, in.d);
    if (o->partial) {
        if (!(part_store = malloc(row * es + 1))) {
            cli_error("run", "out of memory");
            goto done;
        }
        convert_to_storage(o->dtype, in.partial.data, part_store, row);
    }
    if (open_plan(o, &p, &dev, &db, &plan))
        goto done;
    /* Inputs and outputs live in the device's memory (host memory on the
     * CPU); the kernel only ever sees device pointers. */
    staged st = {.dev = dev};
    const void **dsrcs = malloc(sizeof(void *) * (size_t)in.n);
    void *d_src = stage(&st, src_store, row * (size_t)in.n * es);
    float *d_query = stage(&st, query, (size_t)in.d * 4);
    void *d_part = part_store ? stage(&st, part_store, row * es) : NULL;
    float *d_gain = o->out_gain ? stage(&st, in.out_gain.data, (size_t)in.d * 4) : NULL;
    void *d_out = stage(&st, NULL, row * es);
    void *d_normed = p.epilogue ? stage(&st, NULL, row * es) : NULL;
    if (!dsrcs || st.failed) {
        cli_error("run", "device buffers: %s", st.failed ? attnres_device_errmsg(dev) : "out of memory");
        free(dsrcs);
        unstage(&st);
        goto done;
    }
    for (int64_t i = 0; i < in.n; i++)
        dsrcs[i] = (const char *)d_src + (size_t)i * row * es;
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = dsrcs;
    a.query = d_query;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.partial = d_part;
    a.alpha = (float)o->alpha;
    a.out = d_out;
    a.out_gain = d_gain;
    a.out_eps = (float)o->out_eps;
    a.normed = d_normed;
    int rc = attnres_run_mix(plan, in.t, &a, NULL);
    if (rc)
        cli_error("run", "%s: %s", attnres_errstr(rc), attnres_plan_errmsg(plan));
    if (!rc)
        rc = dev->ops->copy_to_host(dev, out_store, d_out, row * es);
    if (!rc && p.epilogue)
        rc = dev->ops->copy_to_host(dev, normed_store, d_normed, row * es);
    free(dsrcs);
    unstage(&st);
    if (rc)
        goto done;
    convert_from_storage(o->dtype, out_store, out_f, row);
    if (p.epilogue)
        convert_from_storage(o->dtype, normed_store, normed_f, row);
    out_file files[] = {{o->out, out_f, 2, {in.t, in.d, 0}}, {o->normed, normed_f, 2, {in.t, in.d, 0}}};
    if (write_outputs(files, 2))
        goto done;
    exit_code = CLI_EXIT_OK;
done:
    close_plan(dev, db, plan);
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

/* ---- --op phase1 ------------------------------------------------------ */

static int run_phase1(const run_opts *o)
{
    npy_array sources = {0}, queries = {0}, gains = {0};
    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    void *src_store = NULL, *o1_store = NULL;
    float *u = NULL, *o1_f = NULL, *lse = NULL;
    const void **srcs = NULL;
    void **o1s = NULL;
    float **lses = NULL;
    if (read_sources(o, &sources))
        goto done;
    const int64_t n = sources.shape[0], t = sources.shape[1], d = sources.shape[2], h = o->heads;
    char err[512];
    if (npy_read_f32(o->queries, &queries, err, sizeof err)) {
        cli_error("run", "%s", err);
        goto done;
    }
    if (queries.ndim != 2 || queries.shape[1] != d) {
        char got[128];
        shape_text(&queries, got, sizeof got);
        cli_error("run", "--queries %s must have shape (S, d) with d = %lld to match the sources, got %s",
                  o->queries, (long long)d, got);
        goto done;
    }
    const int64_t s = queries.shape[0];
    if (s < 1 || s > PROBLEM_MAX_S) {
        cli_error("run", "--queries %s has S = %lld sites; phase1 needs 1 to %d", o->queries, (long long)s,
                  PROBLEM_MAX_S);
        goto done;
    }
    const int64_t want_g[2] = {s, d};
    if (o->gains && read_shaped("--gains", o->gains, 2, want_g, "S, d", "to match --queries", &gains))
        goto done;
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, d, (int32_t)n);
    p.op = ATTNRES_OP_PHASE1;
    p.heads = (int32_t)h;
    p.s = (int32_t)s;
    if (check_problem(&p))
        goto done;

    const size_t es = attnres_dtype_size(o->dtype);
    const size_t row = (size_t)t * (size_t)d;
    src_store = malloc(row * (size_t)n * es + 1);
    o1_store = malloc(row * (size_t)s * es + 1);
    o1_f = malloc(row * (size_t)s * 4 + 4);
    lse = malloc((size_t)s * (size_t)t * (size_t)h * 4 + 4);
    u = malloc((size_t)s * (size_t)d * 4);
    srcs = malloc(sizeof *srcs * (size_t)n);
    o1s = malloc(sizeof *o1s * (size_t)s);
    lses = malloc(sizeof *lses * (size_t)s);
    if (!src_store || !o1_store || !o1_f || !lse || !u || !srcs || !o1s || !lses) {
        cli_error("run", "out of memory for S = %lld, T = %lld, d = %lld, n = %lld", (long long)s, (long long)t,
                  (long long)d, (long long)n);
        goto done;
    }
    convert_to_storage(o->dtype, sources.data, src_store, row * (size_t)n);
    for (int64_t j = 0; j < s; j++)
        attnres_fold_query(queries.data + j * d, o->gains ? gains.data + j * d : NULL, u + j * d, d);
    if (open_plan(o, &p, &dev, &db, &plan))
        goto done;
    /* As for mix: the kernel sees device copies only (host memory on the
     * CPU), and the outputs come back after the launch. */
    const size_t lse_bytes = (size_t)s * (size_t)t * (size_t)h * 4;
    staged st = {.dev = dev};
    void *d_src = stage(&st, src_store, row * (size_t)n * es);
    float *d_u = stage(&st, u, (size_t)s * (size_t)d * 4);
    void *d_o1 = stage(&st, NULL, row * (size_t)s * es);
    float *d_lse = stage(&st, NULL, lse_bytes);
    if (st.failed) {
        cli_error("run", "device buffers: %s", attnres_device_errmsg(dev));
        unstage(&st);
        goto done;
    }
    for (int64_t i = 0; i < n; i++)
        srcs[i] = (const char *)d_src + (size_t)i * row * es;
    for (int64_t j = 0; j < s; j++) {
        o1s[j] = (char *)d_o1 + (size_t)j * row * es;
        lses[j] = d_lse + (size_t)j * (size_t)t * (size_t)h;
    }
    attnres_phase1_args a;
    attnres_phase1_args_init(&a);
    a.sources = srcs;
    a.queries = d_u;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.o1 = o1s;
    a.lse = lses;
    int rc = attnres_run_phase1(plan, t, &a, NULL);
    if (rc)
        cli_error("run", "%s: %s", attnres_errstr(rc), attnres_plan_errmsg(plan));
    if (!rc && (dev->ops->copy_to_host(dev, o1_store, d_o1, row * (size_t)s * es) != ATTNRES_OK ||
                dev->ops->copy_to_host(dev, lse, d_lse, lse_bytes) != ATTNRES_OK)) {
        cli_error("run", "copying the outputs back: %s", attnres_device_errmsg(dev));
        rc = -1;
    }
    unstage(&st);
    if (rc)
        goto done;
    convert_from_storage(o->dtype, o1_store, o1_f, row * (size_t)s);
    out_file files[] = {{o->out, o1_f, 3, {s, t, d}}, {o->lse, lse, 3, {s, t, h}}};
    if (write_outputs(files, 2))
        goto done;
    exit_code = CLI_EXIT_OK;
done:
    close_plan(dev, db, plan);
    free(src_store);
    free(o1_store);
    free(o1_f);
    free(lse);
    free(u);
    free(srcs);
    free(o1s);
    free(lses);
    npy_free(&sources);
    npy_free(&queries);
    npy_free(&gains);
    return exit_code;
}

/* ---- --op phase2 ------------------------------------------------------ */

static int run_phase2(const run_opts *o)
{
    npy_array o1 = {0}, lse = {0}, partial = {0}, query = {0}, gain = {0}, sublayer = {0}, out_gain = {0};
    int exit_code = CLI_EXIT_FAIL;
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *plan = NULL;
    void *o1_store = NULL, *b_store = NULL, *f_store = NULL, *out_store = NULL, *normed_store = NULL;
    float *u = NULL, *out_f = NULL, *normed_f = NULL, *b_f = NULL;
    char err[512];
    if (npy_read_f32(o->o1, &o1, err, sizeof err)) {
        cli_error("run", "%s", err);
        goto done;
    }
    if (o1.ndim != 2 || o1.shape[1] < 1) {
        char got[128];
        shape_text(&o1, got, sizeof got);
        cli_error("run", "--o1 %s must have shape (T, d) with d >= 1, got %s", o->o1, got);
        goto done;
    }
    const int64_t t = o1.shape[0], d = o1.shape[1];
    if (npy_read_f32(o->lse, &lse, err, sizeof err)) {
        cli_error("run", "%s", err);
        goto done;
    }
    if (lse.ndim != 2 || lse.shape[0] != t || lse.shape[1] < 1) {
        char got[128];
        shape_text(&lse, got, sizeof got);
        cli_error("run", "--lse %s must have shape (T, H) with T = %lld to match --o1, got %s", o->lse,
                  (long long)t, got);
        goto done;
    }
    const int64_t h = lse.shape[1];
    /* H goes into a 32-bit field: it is checked before it is narrowed. */
    if (h > PROBLEM_MAX_HEADS) {
        cli_error("run", "--lse %s has H = %lld columns; at most %d heads are supported", o->lse, (long long)h,
                  PROBLEM_MAX_HEADS);
        goto done;
    }
    if (o->have_heads && o->heads != h) {
        cli_error("run", "--heads %lld does not match --lse %s, which has H = %lld columns", (long long)o->heads,
                  o->lse, (long long)h);
        goto done;
    }
    if (d % h != 0) {
        cli_error("run", "H = %lld heads (from --lse) does not divide d = %lld", (long long)h, (long long)d);
        goto done;
    }
    const int64_t want_td[2] = {t, d};
    if (read_shaped("--partial", o->partial, 2, want_td, "T, d", "to match --o1", &partial))
        goto done;
    if (o->sublayer && read_shaped("--sublayer", o->sublayer, 2, want_td, "T, d", "to match --o1", &sublayer))
        goto done;
    if (read_shaped("--query", o->query, 1, &d, "d", "to match --o1", &query))
        goto done;
    if (o->gain && read_shaped("--gain", o->gain, 1, &d, "d", "to match --o1", &gain))
        goto done;
    if (o->out_gain && read_shaped("--out-gain", o->out_gain, 1, &d, "d", "to match --o1", &out_gain))
        goto done;
    attnres_problem p;
    attnres_problem_init(&p, o->dtype, d, 1);
    p.op = ATTNRES_OP_PHASE2;
    p.heads = (int32_t)h;
    p.epilogue = o->normed ? 1 : 0;
    p.fuse_add = o->sublayer ? 1 : 0;
    if (check_problem(&p))
        goto done;

    const size_t es = attnres_dtype_size(o->dtype);
    const size_t row = (size_t)t * (size_t)d;
    o1_store = malloc(row * es + 1);
    b_store = malloc(row * es + 1);
    out_store = malloc(row * es + 1);
    out_f = malloc(row * 4 + 4);
    u = malloc((size_t)d * 4);
    if (p.fuse_add) {
        f_store = malloc(row * es + 1);
        b_f = malloc(row * 4 + 4);
    }
    if (p.epilogue) {
        normed_store = malloc(row * es + 1);
        normed_f = malloc(row * 4 + 4);
    }
    if (!o1_store || !b_store || !out_store || !out_f || !u || (p.fuse_add && (!f_store || !b_f)) ||
        (p.epilogue && (!normed_store || !normed_f))) {
        cli_error("run", "out of memory for T = %lld, d = %lld", (long long)t, (long long)d);
        goto done;
    }
    convert_to_storage(o->dtype, o1.data, o1_store, row);
    convert_to_storage(o->dtype, partial.data, b_store, row);
    if (p.fuse_add)
        convert_to_storage(o->dtype, sublayer.data, f_store, row);
    attnres_fold_query(query.data, o->gain ? gain.data : NULL, u, d);
    if (open_plan(o, &p, &dev, &db, &plan))
        goto done;
    /* Device copies of every buffer (eight at most, what staged holds). */
    staged st = {.dev = dev};
    void *d_o1 = stage(&st, o1_store, row * es);
    float *d_lse = stage(&st, lse.data, (size_t)t * (size_t)h * 4);
    void *d_b = stage(&st, b_store, row * es);
    void *d_f = p.fuse_add ? stage(&st, f_store, row * es) : NULL;
    float *d_u = stage(&st, u, (size_t)d * 4);
    float *d_gain = o->out_gain ? stage(&st, out_gain.data, (size_t)d * 4) : NULL;
    void *d_out = stage(&st, NULL, row * es);
    void *d_normed = p.epilogue ? stage(&st, NULL, row * es) : NULL;
    if (st.failed) {
        cli_error("run", "device buffers: %s", attnres_device_errmsg(dev));
        unstage(&st);
        goto done;
    }
    attnres_phase2_args a;
    attnres_phase2_args_init(&a);
    a.o1 = d_o1;
    a.lse = d_lse;
    a.partial = d_b;
    a.sublayer = d_f;
    a.query = d_u;
    a.scale = (float)o->scale;
    a.eps = (float)o->eps;
    a.out = d_out;
    a.out_gain = d_gain;
    a.out_eps = (float)o->out_eps;
    a.normed = d_normed;
    int rc = attnres_run_phase2(plan, t, &a, NULL);
    if (rc)
        cli_error("run", "%s: %s", attnres_errstr(rc), attnres_plan_errmsg(plan));
    if (!rc && (dev->ops->copy_to_host(dev, out_store, d_out, row * es) != ATTNRES_OK ||
                (p.epilogue && dev->ops->copy_to_host(dev, normed_store, d_normed, row * es) != ATTNRES_OK) ||
                (p.fuse_add && dev->ops->copy_to_host(dev, b_store, d_b, row * es) != ATTNRES_OK))) {
        cli_error("run", "copying the outputs back: %s", attnres_device_errmsg(dev));
        rc = -1;
    }
    unstage(&st);
    if (rc)
        goto done;
    convert_from_storage(o->dtype, out_store, out_f, row);
    if (p.epilogue)
        convert_from_storage(o->dtype, normed_store, normed_f, row);
    if (p.fuse_add)
        convert_from_storage(o->dtype, b_store, b_f, row);
    out_file files[] = {{o->out, out_f, 2, {t, d, 0}},
                        {o->normed, normed_f, 2, {t, d, 0}},
                        {o->partial_out, b_f, 2, {t, d, 0}}};
    if (write_outputs(files, 3))
        goto done;
    exit_code = CLI_EXIT_OK;
done:
    close_plan(dev, db, plan);
    free(o1_store);
    free(b_store);
    free(f_store);
    free(out_store);
    free(normed_store);
    free(u);
    free(out_f);
    free(normed_f);
    free(b_f);
    npy_free(&o1);
    npy_free(&lse);
    npy_free(&partial);
    npy_free(&query);
    npy_free(&gain);
    npy_free(&sublayer);
    npy_free(&out_gain);
    return exit_code;
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
    default: return run_mix(&o);
    }
}
