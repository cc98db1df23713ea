/* tune_stages.c - see tune_stages.h. */
#include "tune_stages.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const names[STAGE_COUNT] = {"ceilings",  "generation", "compile", "verification",
                                               "screening", "full",       "final",   "isolation"};

/* What each stage counts, for the table. */
static const char *const units[STAGE_COUNT] = {"",           "variants emitted", "variants compiled",
                                               "candidates", "candidates",       "candidates",
                                               "problems",   "measuring processes"};

const char *tune_stage_name(tune_stage s) { return s < STAGE_COUNT ? names[s] : "?"; }

void tune_stages_add(tune_stages *st, tune_stage s, double seconds, size_t items)
{
    if (s >= STAGE_COUNT)
        return;
    st->seconds[s] += seconds > 0 ? seconds : 0;
    st->items[s] += items;
}

/* The run's time that no stage accounts for (never negative). */
static double other_s(const tune_stages *st)
{
    double sum = 0;
    for (int s = 0; s < STAGE_COUNT; s++)
        sum += st->seconds[s];
    return st->total_s > sum ? st->total_s - sum : 0;
}

/* Appends to buf at *used, never past len. */
__attribute__((format(printf, 4, 5))) static void put(char *buf, size_t len, size_t *used, const char *fmt, ...)
{
    if (*used + 1 >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *used, len - *used, fmt, ap);
    va_end(ap);
    if (k > 0)
        *used = *used + (size_t)k < len ? *used + (size_t)k : len - 1;
}

void tune_stages_format(const tune_stages *st, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return;
    buf[0] = 0;
    double total = st->total_s > 0 ? st->total_s : 1e-9;
    put(buf, len, &used, "where the time went (%.1f s):\n", st->total_s);
    for (int s = 0; s < STAGE_COUNT; s++) {
        put(buf, len, &used, "  %-13s %8.1f s %5.1f%%", names[s], st->seconds[s], 100.0 * st->seconds[s] / total);
        if (units[s][0])
            put(buf, len, &used, "  %zu %s", st->items[s], units[s]);
        put(buf, len, &used, "\n");
    }
    double other = other_s(st);
    put(buf, len, &used, "  %-13s %8.1f s %5.1f%%  (database, resume, reference data)\n", "other", other,
        100.0 * other / total);
    if (st->stopped)
        put(buf, len, &used, "  %zu screening(s) stopped after one timed launch, far behind the fastest so far\n",
            st->stopped);
    if (st->cut)
        put(buf, len, &used, "  %zu screening(s) cut short during a launch still running at its deadline\n",
            st->cut);
    if (st->pruned)
        put(buf, len, &used, "  %zu candidate(s) pruned before compiling (--explain-pruning lists them, --no-prune "
                             "tunes them)\n", st->pruned);
}

void tune_stages_json(const tune_stages *st, const char *more, char *buf, size_t len)
{
    size_t used = 0;
    if (len == 0)
        return;
    buf[0] = 0;
    put(buf, len, &used, "{\"total_s\": %.3f", st->total_s);
    for (int s = 0; s < STAGE_COUNT; s++)
        put(buf, len, &used, ", \"%s\": {\"s\": %.3f, \"n\": %zu}", names[s], st->seconds[s], st->items[s]);
    put(buf, len, &used, ", \"other_s\": %.3f, \"pruned\": %zu, \"stopped\": %zu, \"cut\": %zu%s}", other_s(st),
        st->pruned, st->stopped, st->cut, more ? more : "");
}
