/* sim_memory.c - see sim_memory.h. */
#include "sim_memory.h"

#include <stdlib.h>
#include <string.h>

/* The index of the first region whose base is above addr. */
static size_t upper(const sim_memory *m, uint64_t addr)
{
    size_t lo = 0, hi = m->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (m->r[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int sim_memory_add(sim_memory *m, uint64_t base, uint64_t size, int owned)
{
    if (m->n == m->cap) {
        size_t nc = m->cap ? 2 * m->cap : 64;
        sim_region *nr = realloc(m->r, nc * sizeof *nr);
        if (!nr)
            return -1;
        m->r = nr;
        m->cap = nc;
    }
    size_t at = upper(m, base);
    memmove(m->r + at + 1, m->r + at, (m->n - at) * sizeof *m->r);
    m->r[at] = (sim_region){base, size, owned};
    m->n++;
    if (owned)
        m->bytes += size;
    return 0;
}

int sim_memory_remove(sim_memory *m, uint64_t base, int *owned)
{
    size_t at = upper(m, base);
    if (at == 0 || m->r[at - 1].base != base)
        return -1;
    at--;
    if (owned)
        *owned = m->r[at].owned;
    if (m->r[at].owned)
        m->bytes -= m->r[at].size;
    memmove(m->r + at, m->r + at + 1, (m->n - at - 1) * sizeof *m->r);
    m->n--;
    return 0;
}

const sim_region *sim_memory_find(const sim_memory *m, uint64_t addr, uint64_t len)
{
    size_t at = upper(m, addr);
    if (at == 0)
        return NULL;
    const sim_region *r = &m->r[at - 1];
    if (addr - r->base >= r->size || len > r->size - (addr - r->base))
        return NULL;
    return r;
}

void sim_memory_free(sim_memory *m)
{
    free(m->r);
    memset(m, 0, sizeof *m);
}
