/*
 * test_identity.h - the three problems of the Block AttnRes identity that
 * test_phase_api (forward) and test_reference_backward (gradients) check:
 * phase 1 over n sources and `sites` queries, phase 2 of one site, and the
 * mix over the n sources and the site's partial sum, n + 1 in all, which
 * the two phases together must equal. Header-only.
 */
#ifndef ATTNRES_TEST_IDENTITY_H
#define ATTNRES_TEST_IDENTITY_H

#include "attnres.h"

/* The f32 problems of width d: phase 1 (*p1), phase 2 (*p2, with the
 * fused add and the epilogue as given) and the mix over n + 1 (*pm). */
static inline void identity_problems(int64_t d, int32_t n, int32_t sites, int32_t heads, int fuse, int epilogue,
                                     attnres_problem *p1, attnres_problem *p2, attnres_problem *pm)
{
    attnres_problem_init(p1, ATTNRES_DTYPE_F32, d, n);
    p1->op = ATTNRES_OP_PHASE1;
    p1->heads = heads;
    p1->s = sites;
    attnres_problem_init(p2, ATTNRES_DTYPE_F32, d, 1);
    p2->op = ATTNRES_OP_PHASE2;
    p2->heads = heads;
    p2->fuse_add = fuse;
    p2->epilogue = epilogue;
    attnres_problem_init(pm, ATTNRES_DTYPE_F32, d, n + 1);
    pm->heads = heads;
    pm->epilogue = epilogue;
}

#endif
