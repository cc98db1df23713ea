/*
 * test_scratch.h - a test's scratch directory: making it under $TMPDIR,
 * and removing it with all it holds, the one clean-up every C test that
 * writes files ends with, or one made for the whole program and removed
 * at its exit. Header-only.
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

/* The directory scratch_begin made, and the variable that keeps it. */
static const char *scratch_begun __attribute__((unused));
static const char *scratch_keep_env __attribute__((unused));

static inline void scratch_end(void)
{
    if (!scratch_keep_env || !getenv(scratch_keep_env))
        scratch_remove(scratch_begun);
    else
        printf("kept %s\n", scratch_begun);
}

/* Makes a program's scratch directory as scratch_make does, for the cases
 * main runs, and has it removed at exit, or kept, its path printed, where
 * the variable keep_env (NULL: none) is set, for a look at what a failed
 * case left. Ends the program (status 2, the reason printed) where it
 * cannot be made; makes none when listing, since then no case runs. */
static inline void scratch_begin(const char *name, char *dir, size_t len, int listing, const char *keep_env)
{
    if (listing)
        return;
    if (scratch_make(name, dir, len) != 0)
        exit(2);
    scratch_begun = dir;
    scratch_keep_env = keep_env;
    atexit(scratch_end);
}

#endif
