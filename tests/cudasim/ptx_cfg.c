/*
 * ptx_cfg.c - where the lanes of a diverged warp meet again.
 *
 * The interpreter runs a warp's lanes together and, at a branch the lanes
 * disagree on, runs one side and then the other until both reach the
 * branch's immediate post-dominator: the first instruction every path from
 * the branch must pass. This file builds the function's basic blocks and
 * computes post-dominator sets by the classic iterative data-flow method
 * (a virtual exit node after every ret/exit).
 */
#include "ptx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cfg_block {
    int32_t first, last; /* instruction range, inclusive */
    int32_t succ[2];
    int nsucc; /* successors; -1 is the virtual exit */
} cfg_block;

static int ends_block(const ptx_instr *in)
{
    return in->op == OP_BRA || in->op == OP_RET || in->op == OP_EXIT;
}

int ptx_reconvergence(ptx_function *f, char *err, size_t errlen)
{
    const int n = f->ncode;
    int rc = -1;
    char *leader = calloc((size_t)n + 1, 1);
    int32_t *block_of = malloc(((size_t)n + 1) * sizeof *block_of);
    cfg_block *b = NULL;
    uint64_t *pdom = NULL;
    if (!leader || !block_of)
        goto oom;
    leader[0] = 1;
    for (int i = 0; i < n; i++) {
        const ptx_instr *in = &f->code[i];
        if (in->op == OP_BRA)
            leader[in->o[0].imm] = 1;
        if (ends_block(in) && i + 1 < n)
            leader[i + 1] = 1;
    }
    int nb = 0;
    for (int i = 0; i < n; i++)
        nb += leader[i];
    b = calloc((size_t)nb, sizeof *b);
    if (!b)
        goto oom;
    int k = -1;
    for (int i = 0; i < n; i++) {
        if (leader[i])
            b[++k].first = i;
        b[k].last = i;
        block_of[i] = k;
    }
    for (int j = 0; j < nb; j++) {
        const ptx_instr *in = &f->code[b[j].last];
        const int next = b[j].last + 1 < n ? block_of[b[j].last + 1] : -1;
        if (in->op == OP_BRA) {
            b[j].succ[b[j].nsucc++] = block_of[in->o[0].imm];
            if (in->guard >= 0)
                b[j].succ[b[j].nsucc++] = next;
        } else if (in->op == OP_RET || in->op == OP_EXIT) {
            b[j].succ[b[j].nsucc++] = -1;
            if (in->guard >= 0)
                b[j].succ[b[j].nsucc++] = next;
        } else {
            b[j].succ[b[j].nsucc++] = next;
        }
    }
    /* pdom[j] as a bitset over blocks plus the exit (bit nb). */
    const int words = (nb + 1 + 63) / 64;
    pdom = malloc((size_t)nb * (size_t)words * sizeof *pdom);
    if (!pdom)
        goto oom;
    for (int j = 0; j < nb; j++)
        memset(pdom + (size_t)j * words, 0xff, (size_t)words * sizeof *pdom);
    uint64_t *tmp = malloc((size_t)words * sizeof *tmp);
    if (!tmp)
        goto oom;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int j = nb - 1; j >= 0; j--) {
            memset(tmp, 0xff, (size_t)words * sizeof *tmp);
            for (int s = 0; s < b[j].nsucc; s++) {
                if (b[j].succ[s] < 0) { /* the exit post-dominates only itself */
                    for (int w = 0; w < words; w++)
                        tmp[w] &= w == nb / 64 ? 1ull << (nb % 64) : 0;
                } else {
                    const uint64_t *ps = pdom + (size_t)b[j].succ[s] * words;
                    for (int w = 0; w < words; w++)
                        tmp[w] &= ps[w];
                }
            }
            tmp[j / 64] |= 1ull << (j % 64);
            uint64_t *pj = pdom + (size_t)j * words;
            if (memcmp(pj, tmp, (size_t)words * sizeof *tmp)) {
                memcpy(pj, tmp, (size_t)words * sizeof *tmp);
                changed = 1;
            }
        }
    }
    free(tmp);
    /* The immediate post-dominator: the strict post-dominator whose own set
     * is one smaller (post-dominators of a block form a chain). */
    for (int j = 0; j < nb; j++) {
        ptx_instr *in = &f->code[b[j].last];
        if (in->op != OP_BRA)
            continue;
        const uint64_t *pj = pdom + (size_t)j * words;
        int size = 0;
        for (int w = 0; w < words; w++)
            size += __builtin_popcountll(pj[w]);
        in->reconv = -1;
        for (int q = 0; q < nb; q++) {
            if (q == j || !(pj[q / 64] >> (q % 64) & 1))
                continue;
            const uint64_t *pq = pdom + (size_t)q * words;
            int sq = 0;
            for (int w = 0; w < words; w++)
                sq += __builtin_popcountll(pq[w]);
            if (sq == size - 1) {
                in->reconv = b[q].first;
                break;
            }
        }
    }
    rc = 0;
    goto done;
oom:
    snprintf(err, errlen, "out of memory computing reconvergence points of %s", f->name);
done:
    free(leader);
    free(block_of);
    free(b);
    free(pdom);
    return rc;
}
