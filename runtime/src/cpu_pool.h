/*
 * cpu_pool.h - the CPU device's worker threads.
 *
 * A launch splits a range of tokens into `parts` contiguous chunks; the
 * calling thread runs chunk 0 and sleeping workers run the rest. Launches
 * from several threads are serialised, so a plan may be run concurrently.
 */
#ifndef AR_CPU_POOL_H
#define AR_CPU_POOL_H

#include <stdint.h>

typedef struct cpu_pool cpu_pool;

/* Runs tokens [t0, t1) of one launch. */
typedef void (*cpu_pool_fn)(void *ctx, int64_t t0, int64_t t1);

/* Starts nworkers threads (0 is allowed: everything runs inline). */
int cpu_pool_create(int nworkers, cpu_pool **out);
void cpu_pool_destroy(cpu_pool *pool);

/* Runs fn over [0, total) in `parts` chunks and waits for all of them. */
void cpu_pool_run(cpu_pool *pool, cpu_pool_fn fn, void *ctx, int64_t total,
                  int parts);

int cpu_pool_workers(const cpu_pool *pool);

#endif
