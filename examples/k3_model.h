/*
 * k3_model.h - the routing sites of a K3-shaped Block AttnRes model.
 *
 * 93 layers of two sublayers each (attention, MLP) give 186 routing sites.
 * Layers are grouped in blocks of 12, so 8 blocks: seven of 24 sites and a
 * last one of 18. The block representations are b_0 (the embedding) and
 * b_1..b_8 (the sum of each completed block's sublayer outputs).
 *
 * A site of block k (0-based) mixes the k + 1 completed representations
 * b_0..b_k and, except for the block's first site, the block's running
 * partial sum: N <= 9 sources. In the two-phase form a block is one phase-1
 * problem (n = k + 1, S = its sites), whose output serves the block's first
 * site as is, plus one phase-2 problem per further site: 8 + 178 = 186 plans.
 *
 * Shared by examples/k3_engine.c and the benchmarks in bench/.
 */
#ifndef K3_MODEL_H
#define K3_MODEL_H

#include <attnres.h>

#define K3_LAYERS 93
#define K3_LAYERS_PER_BLOCK 12
#define K3_SITES (2 * K3_LAYERS)                                        /* 186 */
#define K3_SITES_PER_BLOCK (2 * K3_LAYERS_PER_BLOCK)                    /* 24 */
#define K3_BLOCKS ((K3_SITES + K3_SITES_PER_BLOCK - 1) / K3_SITES_PER_BLOCK) /* 8 */
#define K3_MAX_SOURCES (K3_BLOCKS + 1)                                  /* 9 */
#define K3_EPS 1e-5f                                                    /* K3's RMS epsilon */

/* How the sites are planned and run. */
typedef enum k3_form {
    K3_FORM_PHASE = 0, /* Block AttnRes two-phase form: phase1 per block, phase2 per site */
    K3_FORM_MIX = 1    /* one mix per site over all its sources */
} k3_form;

/* The block of a site, the first site of a block and a block's site count. */
static inline int k3_block_of(int site) { return site / K3_SITES_PER_BLOCK; }
static inline int k3_block_first(int block) { return block * K3_SITES_PER_BLOCK; }
static inline int k3_block_sites(int block)
{
    int left = K3_SITES - k3_block_first(block);
    return left < K3_SITES_PER_BLOCK ? left : K3_SITES_PER_BLOCK;
}

/* The problem that site `site` is planned with. In the two-phase form a
 * block's first site stands for the block's phase-1 plan; a second site
 * merges with the first sublayer's output as the partial sum (no fused add),
 * every later site first adds the previous sublayer's output into it. */
static inline attnres_problem k3_site_problem(k3_form form, attnres_dtype dtype, int64_t d, int site)
{
    const int block = k3_block_of(site), j = site - k3_block_first(block);
    attnres_problem p;
    if (form == K3_FORM_MIX) {
        attnres_problem_init(&p, dtype, d, block + 1 + (j > 0));
    } else if (j == 0) {
        attnres_problem_init(&p, dtype, d, block + 1);
        p.op = ATTNRES_OP_PHASE1;
        p.s = k3_block_sites(block);
    } else {
        attnres_problem_init(&p, dtype, d, 1);
        p.op = ATTNRES_OP_PHASE2;
        p.fuse_add = j >= 2;
    }
    return p;
}

#endif
