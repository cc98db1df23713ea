/*
 * fuzz_util.c - the scratch files and checks the fuzz targets share.
 */
#define _GNU_SOURCE /* mkdtemp */
#include "fuzz.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fuzz_verdict;

void fuzz_fail(const char *what, const char *detail)
{
    fprintf(stderr, "FUZZ FINDING: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

static char scratch[512];
static pid_t scratch_owner;

/* Removes the scratch directory's files and the directory: the loaders
 * under test leave nothing behind on success, and what a failure leaves
 * must not pile up over millions of inputs. */
static void remove_scratch(void)
{
    /* A forked child (replay.c runs known defects in one) shares the
     * directory with its parent and must leave it in place. */
    if (getpid() != scratch_owner)
        return;
    DIR *d = opendir(scratch);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            snprintf(p, sizeof p, "%s/%s", scratch, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(scratch);
}

const char *fuzz_scratch_dir(void)
{
    if (!scratch[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(scratch, sizeof scratch, "%s/attnres-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(scratch))
            fuzz_fail("cannot make a scratch directory", scratch);
        scratch_owner = getpid();
        atexit(remove_scratch);
    }
    return scratch;
}

void fuzz_path(const char *name, char *path, size_t path_len)
{
    snprintf(path, path_len, "%s/%s", fuzz_scratch_dir(), name);
}

void fuzz_write_file(const char *name, const uint8_t *data, size_t size, char *path,
                     size_t path_len)
{
    fuzz_path(name, path, path_len);
    FILE *f = fopen(path, "wb");
    if (!f || (size && fwrite(data, 1, size, f) != size) || fclose(f))
        fuzz_fail("cannot write the input file", path);
}

void fuzz_remove_db(const char *name)
{
    static const char *const suffix[] = {"", "-wal", "-shm", "-journal"};
    char p[1024], q[1100];
    fuzz_path(name, p, sizeof p);
    for (size_t i = 0; i < sizeof suffix / sizeof *suffix; i++) {
        snprintf(q, sizeof q, "%s%s", p, suffix[i]);
        unlink(q);
    }
}
