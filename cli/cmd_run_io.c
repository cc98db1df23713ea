/*
 * cmd_run_io.c - the files of `attnres run`: .npy inputs read with their
 * shapes checked, and the outputs written all or none.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "atomic_file.h"
#include "cli.h"
#include "cmd_run.h"
#include "npy.h"
#include "problems.h"

/* ---- reading inputs -------------------------------------------------- */

void run_shape_text(const npy_array *a, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < a->ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, a->ndim == 1 ? ",)" : ")");
}

/* Reads a float32 array and checks its shape against want[0..ndim), where
 * names says what each axis is ("T, d") and why says what fixes them. */
int run_read_shaped(const char *flag, const char *path, int ndim, const int64_t *want, const char *names,
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
        run_shape_text(a, got, sizeof got);
        cli_error("run", "%s %s must have shape (%s%s) = %s %s, got %s", flag, path, names, ndim == 1 ? "," : "",
                  want_text, why, got);
        return -1;
    }
    return 0;
}

int run_read_vector(const char *path, const char *flag, int64_t d, npy_array *a)
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
int run_read_sources(const run_opts *o, npy_array *s)
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

/* Reads one input after another, stopping at the first that fails. */
static int read_mix_inputs(const run_opts *o, mix_inputs *in)
{
    if (run_read_sources(o, &in->sources))
        return -1;
    in->n = in->sources.shape[0];
    in->t = in->sources.shape[1];
    in->d = in->sources.shape[2];
    const int64_t td[2] = {in->t, in->d};
    if (run_read_vector(o->query, "--query", in->d, &in->query))
        return -1;
    if (o->gain && run_read_vector(o->gain, "--gain", in->d, &in->gain))
        return -1;
    if (o->partial &&
        run_read_shaped("--partial", o->partial, 2, td, "T, d", "to match the sources", &in->partial))
        return -1;
    if (o->out_gain && run_read_vector(o->out_gain, "--out-gain", in->d, &in->out_gain))
        return -1;
    if (o->dout && run_read_shaped("--dout", o->dout, 2, td, "T, d", "to match the sources", &in->dout))
        return -1;
    return 0;
}

int run_read_mix_inputs(const run_opts *o, mix_inputs *in)
{
    memset(in, 0, sizeof *in);
    if (read_mix_inputs(o, in)) {
        run_mix_inputs_free(in);
        return -1;
    }
    return 0;
}

void run_mix_inputs_free(mix_inputs *in)
{
    npy_free(&in->sources);
    npy_free(&in->query);
    npy_free(&in->gain);
    npy_free(&in->partial);
    npy_free(&in->out_gain);
    npy_free(&in->dout);
    memset(in, 0, sizeof *in);
}

/* ---- writing outputs ------------------------------------------------- */

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
int run_write_outputs(const out_file *files, int count)
{
    char msg[1024];
    out_commit c[RUN_MAX_OUTPUTS];
    int rc = -1, restored = 1, n = count < RUN_MAX_OUTPUTS ? count : RUN_MAX_OUTPUTS;
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
