/*
 * test_covering.h - a deterministic covering sample of a template's
 * variants, for the fast test tier: a few variants that together take
 * every value of every parameter at least once, so that each value's code
 * path is compiled and checked without running the whole product. The
 * full tier runs every variant (docs/testing.md).
 *
 * The sample is greedy and fixed: each round takes the variant that adds
 * the most (parameter, value) pairs not yet taken, the first in
 * enumeration order on a tie, so a failure reproduces with the same
 * variants on the same host. Header-only.
 */
#ifndef ATTNRES_TEST_COVERING_H
#define ATTNRES_TEST_COVERING_H

#include <stdlib.h>
#include <string.h>

/* The (key, value) pairs of a flat JSON object as "key=value" strings into
 * out (at most max), each at most 127 bytes; returns how many. Strings
 * keep their quotes, numbers their text: only equality matters here. */
static inline size_t covering_pairs(const char *json, char (*out)[128], size_t max)
{
    size_t n = 0;
    const char *p = json ? strchr(json, '{') : NULL;
    while (p && n < max) {
        const char *k = strchr(p, '"');
        if (!k)
            break;
        const char *ke = strchr(k + 1, '"');
        const char *colon = ke ? strchr(ke, ':') : NULL;
        if (!colon)
            break;
        const char *v = colon + 1;
        while (*v == ' ')
            v++;
        const char *ve = v;
        if (*v == '"') {
            ve = strchr(v + 1, '"');
            ve = ve ? ve + 1 : v + strlen(v);
        } else {
            while (*ve && *ve != ',' && *ve != '}')
                ve++;
        }
        snprintf(out[n++], 128, "%.*s=%.*s", (int)(ke - k - 1), k + 1, (int)(ve - v), v);
        p = ve;
    }
    return n;
}

#define COVERING_MAX_PAIRS 64

/* Marks in pick[0..n) a covering sample of the variants whose params_json
 * are json[i] and for which usable[i] is set (NULL: all). Returns the
 * number picked, 0 when out of memory (then nothing is marked). */
static inline size_t covering_sample(const char *const *json, const int *usable, size_t n, int *pick)
{
    char(*pairs)[COVERING_MAX_PAIRS][128] = calloc(n ? n : 1, sizeof *pairs);
    size_t *npairs = calloc(n ? n : 1, sizeof *npairs);
    char(*taken)[128] = calloc(n * COVERING_MAX_PAIRS + 1, sizeof *taken);
    size_t ntaken = 0, picked = 0;
    if (!pairs || !npairs || !taken) {
        free(pairs);
        free(npairs);
        free(taken);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        pick[i] = 0;
        npairs[i] = covering_pairs(json[i], pairs[i], COVERING_MAX_PAIRS);
    }
    for (;;) {
        size_t best = n, best_gain = 0;
        for (size_t i = 0; i < n; i++) {
            if (pick[i] || (usable && !usable[i]))
                continue;
            size_t gain = 0;
            for (size_t a = 0; a < npairs[i]; a++) {
                int seen = 0;
                for (size_t b = 0; b < ntaken && !seen; b++)
                    seen = strcmp(taken[b], pairs[i][a]) == 0;
                gain += !seen;
            }
            if (gain > best_gain) {
                best = i;
                best_gain = gain;
            }
        }
        if (best == n)
            break;
        pick[best] = 1;
        picked++;
        for (size_t a = 0; a < npairs[best]; a++) {
            int seen = 0;
            for (size_t b = 0; b < ntaken && !seen; b++)
                seen = strcmp(taken[b], pairs[best][a]) == 0;
            if (!seen)
                memcpy(taken[ntaken++], pairs[best][a], 128);
        }
    }
    free(pairs);
    free(npairs);
    free(taken);
    return picked;
}

/* Whether the program was asked for the covering sample ("--sample" among
 * its arguments, which it then removes from argv). */
static inline int covering_requested(int *argc, char **argv)
{
    int found = 0, kept = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--sample") == 0)
            found = 1;
        else
            argv[kept++] = argv[i];
    }
    argv[kept] = NULL;
    *argc = kept;
    return found;
}

#endif
