/*
 * sim_exec.h - runs one kernel launch: every block of the grid, every warp
 * of a block with its own SIMT stack, lanes with their own registers.
 *
 * Blocks run one after another (their order is not observable to a
 * correct kernel: nothing here orders memory between blocks). Within a
 * block, warps run until they reach a barrier or exit; a barrier releases
 * when every warp that has not exited waits at it. The first fault stops
 * the launch and is described in the result.
 */
#ifndef CUDASIM_SIM_EXEC_H
#define CUDASIM_SIM_EXEC_H

#include <stdint.h>

#include "cudasim.h"
#include "ptx.h"
#include "sim_memory.h"

typedef struct sim_launch {
    const ptx_function *f;
    unsigned grid[3], block[3];
    const uint8_t *params; /* f->param_bytes */
    int64_t dynamic_shared;
    const sim_memory *mem;
    int checks; /* race and uninitialised shared-memory checks */
} sim_launch;

typedef struct sim_result {
    int code; /* 0, or the CUresult a GPU would give */
    char message[1536];
    cudasim_traffic traffic;
} sim_result;

/* Runs the launch; returns r->code. */
int sim_run(const sim_launch *l, sim_result *r);

/* The modelled time of a launch with these counters, in microseconds. */
double sim_model_us(const cudasim_traffic *t);

/* The model's constants, for the docs and the driver's properties. */
#define SIM_SMS 132
#define SIM_CLOCK_KHZ 1980000
#define SIM_DRAM_GBPS 4300.0
#define SIM_LAUNCH_US 2.0

#endif
