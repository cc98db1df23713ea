/*
 * test_scratch.h - removing a test's scratch directory with all it holds,
 * the one clean-up every C test that writes files ends with. Header-only.
 *
 * nftw needs _GNU_SOURCE (or _XOPEN_SOURCE 500) defined before the first
 * include of the test's source file.
 */
#ifndef ATTNRES_TEST_SCRATCH_H
#define ATTNRES_TEST_SCRATCH_H

#include <ftw.h>
#include <stdio.h>

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
