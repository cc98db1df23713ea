/*
 * cpu_compiler.h - running the host C compiler for the CPU backend, and the
 * precompiled header that spares each kernel compile the parsing of the
 * system headers every generated kernel includes.
 *
 * About a sixth of a fused mix kernel's compile (gcc -O3, 2026-12-05) was
 * parsing <immintrin.h> and friends; a tune compiles hundreds of kernels.
 * The precompiled header lives in the kernel cache under a name made from
 * the compiler's identity, the options and the header's text, so a
 * different compiler or option never meets it. It changes no generated
 * code: a compiler that cannot use it (another compiler, a damaged file)
 * reads the header as text, and a compile that fails with it is retried
 * without it.
 */
#ifndef AR_CPU_COMPILER_H
#define AR_CPU_COMPILER_H

#include <stddef.h>

/* The options every kernel and the precompiled header are compiled with
 * (the header's must match the kernels' for the compiler to use it).
 * -O2, not -O3: on the Zen 4 guest (GCC 12.2, 2026-12-06) the default
 * preset's winners compiled at -O2 ran 0.97-1.03x those at -O3, problem by
 * problem in interleaved rounds, and a cold default tune took 207 s against
 * 235 s (compiling 76 s against 105 s); bench/results/tune-time-2026-12-06.md.
 * The kernels' loops are unrolled and vectorised by their templates, so
 * -O3's own unrolling and vectorising only adds code. cpu_backend.c's
 * CPU_COMPILE_OPTIONS, part of every build key, says the same. */
#define AR_CPU_CC_OPTIONS "-O2", "-march=native", "-std=gnu11", "-fPIC", "-Wno-psabi"

/* Runs argv (argv[0] found on PATH) with stdout and stderr to log_path and
 * waits. Returns the wait status, or -1 with errno's code in *spawn_error
 * when it could not be started. */
int ar_cc_run(char *const argv[], const char *log_path, int *spawn_error);

/* Writes to path the header to pass with -include: present in the kernel
 * cache, with its precompiled form made now (in work_dir, a directory of
 * the caller's) when missing. Returns 0, or -1 when no cache directory is
 * usable or the compiler made no precompiled header (compile without). */
int ar_cpu_pch(const char *cc, const char *identity, const char *work_dir, char *path, size_t len);

/* Forgets the precompiled form of the header at path, after a compile
 * that used it failed; the next compile makes it again. */
void ar_cpu_pch_drop(const char *path);

#endif
