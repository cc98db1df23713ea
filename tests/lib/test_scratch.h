/*
 * test_scratch.h - a test's scratch directory: making it under $TMPDIR,
 * and removing it with all it holds, the one clean-up every C test that
 * writes files ends with. Header-only.
 *
 * nftw and mkdtemp need _GNU_SOURCE (or _XOPEN_SOURCE 500) defined before
 * the first include of the test's source file.
 */
#ifndef ATTNRES_TEST_SCRATCH_H
#define ATTNRES_TEST_SCRATCH_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

/* Makes a fresh directory "$TMPDIR/attnres-test-NAME-XXXXXX" (/tmp where
 * TMPDIR is unset or empty) in dir, len bytes; 0 on success, else -1 with
 * the reason printed. Every test names its directory this way, so that a
 * directory a killed test left behind says which test it was. */
static inline int scratch_make(const char *name, char *dir, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(dir, len, "%s/attnres-test-%s-XXXXXX", base && *base ? base : "/tmp", name);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

static inline int scratch_remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

/* Removes dir and everything under it, depth first, following no links;
 * prints what it could not remove. */
static inline void scratch_remove(const char *dir)
{
    if (nftw(dir, scratch_remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

#endif
