/*
 * fuzz.h - what every fuzz target in tests/fuzz shares with the two drivers
 * that run it: libFuzzer (ATTNRES_FUZZ=ON, clang) and replay.c, the plain
 * corpus replayer that ctest runs on every build.
 *
 * A target is one LLVMFuzzerTestOneInput. It hands the input to one loader
 * of the project exactly as a user's file would reach it, checks what must
 * hold whatever the input (a refusal carries a message, an accepted input
 * is self-consistent) and calls fuzz_fail() when it does not, so that
 * libFuzzer records a crash. It also says whether the loader accepted the
 * input, so that the replayer can check the expectation a corpus file's
 * name states (see replay.c).
 */
#ifndef ATTNRES_FUZZ_H
#define ATTNRES_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Set by a target for each input: the loader's verdict. */
enum fuzz_verdict { FUZZ_REFUSED = 0, FUZZ_ACCEPTED = 1 };
extern int fuzz_verdict;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reports a broken invariant on stderr and aborts: a finding. */
void fuzz_fail(const char *what, const char *detail);

/* A private scratch directory, made once per process (under TMPDIR, else
 * /tmp) and removed at exit. Returns its path. */
const char *fuzz_scratch_dir(void);

/* Writes the input to the file name of the scratch directory (replacing
 * it) and puts its path in path. Aborts through fuzz_fail when the write
 * fails: without the file there is nothing to test. */
void fuzz_write_file(const char *name, const uint8_t *data, size_t size,
                     char *path, size_t path_len);

/* The path of name in the scratch directory, without creating anything. */
void fuzz_path(const char *name, char *path, size_t path_len);

/* Removes name and its SQLite companions (-wal, -shm, -journal) from the
 * scratch directory. */
void fuzz_remove_db(const char *name);

#endif
