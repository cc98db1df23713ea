/*
 * sim_memory.h - the simulated device's global memory: a table of the
 * allocations (cuMemAlloc buffers and modules' .global variables), sorted by
 * address, so every access of a kernel can be checked to lie inside one.
 * Device pointers are host addresses; the table is what makes them device
 * memory. Callers serialise access (the driver's lock).
 */
#ifndef CUDASIM_SIM_MEMORY_H
#define CUDASIM_SIM_MEMORY_H

#include <stddef.h>
#include <stdint.h>

typedef struct sim_region {
    uint64_t base, size;
    int owned; /* 1: cuMemAlloc memory, freed by cuMemFree */
} sim_region;

typedef struct sim_memory {
    sim_region *r;
    size_t n, cap;
    uint64_t bytes; /* allocated by cuMemAlloc */
} sim_memory;

int sim_memory_add(sim_memory *m, uint64_t base, uint64_t size, int owned);
/* Removes the region starting at base; 0, or -1 when there is none. */
int sim_memory_remove(sim_memory *m, uint64_t base, int *owned);
/* The region holding [addr, addr + len), or NULL. */
const sim_region *sim_memory_find(const sim_memory *m, uint64_t addr, uint64_t len);
void sim_memory_free(sim_memory *m);

#endif
