/*
 * cpu_builtin.h - the CPU backend's built-in kernels, per ISA level.
 *
 * The build generates each op's and dtype's built-in variant (the one its
 * template names in T.builtin) once per ISA level the target has (x86-64:
 * avx512bf16 where the compiler has it, avx512, avx2, sse2; aarch64: neon)
 * and compiles each with that level's compiler flags. The device picks the
 * widest level the CPU supports once, when it opens (ATTNRES_CPU_BUILTIN_ISA
 * can lower it); a plan that falls back takes the widest level at most that
 * one whose loop step divides the head width, else the scalar generic
 * kernel, which fits every shape.
 */
#ifndef ATTNRES_CPU_BUILTIN_H
#define ATTNRES_CPU_BUILTIN_H

#include <stddef.h>
#include <stdint.h>

/* Chooses the device's level: the widest the CPU supports, at most the one
 * ATTNRES_CPU_BUILTIN_ISA names ("avx512", "avx2", "sse2", "neon", or "scalar" for
 * the scalar generic kernels only). Returns the level's index (>= 0), -1
 * for scalar, or -2 with a message in msg when ATTNRES_CPU_BUILTIN_ISA names no
 * level this build knows. */
int ar_cpu_builtin_level(char *msg, size_t msg_len);

/* The name of a level index from ar_cpu_builtin_level ("scalar" for -1). */
const char *ar_cpu_builtin_level_name(int level);

/* The built-in kernel for op (attnres_op) and dtype (attnres_dtype) with
 * head width hd at the widest level at most `level` whose step divides hd.
 * Returns 0 and sets *entry, *variant and *level_name, or -1 when none
 * applies (the caller takes the scalar generic kernel). */
int ar_cpu_builtin_find(int level, int op, int dtype, int64_t hd, void **entry, const char **variant,
                        const char **level_name);

/* How many parts a built-in kernel's launch of `bytes` (read + written)
 * takes, at most max: one per AR_CPU_BUILTIN_PART_BYTES, at least one.
 * A tuned kernel's thread count is measured; a built-in's is this guess.
 * Waking a worker costs microseconds on an idle machine, and 2 MiB a part
 * keeps every built-in within 1.25x of the tuned winner at the preset
 * shapes there (bench/results/fallback-2026-12-01.md: at 16 MiB, launches
 * of 4-8 MB stayed on one thread and ran 1.9-2.3x the tuned time). On an
 * oversubscribed machine a launch that waits for a descheduled worker can
 * be far slower than one thread; that machine's remedy is tuning, which
 * measures the thread count. */
#define AR_CPU_BUILTIN_PART_BYTES ((int64_t)2 << 20)
int ar_cpu_builtin_parts(int64_t bytes, int max);

#endif
