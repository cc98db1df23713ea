/*
 * winners.c - the winners lookup with device fallback, and the data
 * version a caller that keeps what it looked up watches.
 */
#include "ardb_internal.h"
#include "schema.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

void ardb_winners_free(ardb_winner *w, size_t count)
{
    size_t i;
    if (!w)
        return;
    for (i = 0; i < count; i++) {
        free(w[i].variant);
        free(w[i].kernel_name);
        free(w[i].source);
        free(w[i].source_hash);
        free(w[i].params_json);
        free(w[i].device_fingerprint);
        free(w[i].device_arch);
        free(w[i].disturbance);
    }
    free(w);
}

/* Orders a lookup's rows by T bucket: an insertion sort, as a problem has
 * a handful of buckets. */
static void sort_by_t_bucket(ardb_winner *w, size_t n)
{
    size_t i, j;
    for (i = 1; i < n; i++) {
        ardb_winner x = w[i];
        for (j = i; j > 0 && w[j - 1].t_bucket > x.t_bucket; j--)
            w[j] = w[j - 1];
        w[j] = x;
    }
}

int ardb_winners_lookup(ardb *db, const ardb_problem *p, const ardb_device *dev,
                        ardb_level level, ardb_winner **out, size_t *count)
{
    /* Per T bucket: the newest run's winner (by the time the run started, so
     * that runs merged in from another file keep their place in history);
     * within one run, prefer this very device, then the fastest. The ranking
     * carries only the candidate's id: its text columns (the source is tens
     * of kilobytes) are read once, for the rows that won, instead of being
     * copied through the window's sorter for every row ranked. The inner
     * join on candidates stays, so that a winner whose candidate is missing
     * is never ranked, as before. The rows are put in T bucket order here
     * (sort_by_t_bucket), not by an ORDER BY, which would copy the sources
     * through a sorter once more. */
#define WINNERS_LOOKUP_SQL(simulated, provisional, disturbance, fraction)   \
    "SELECT x.t_bucket, c.variant, c.kernel_name, c.source, c.source_hash,"   \
    " c.params_json, x.fingerprint, x.arch, x.run_id, x.median_us, x.gbps,"   \
    " x.fraction, x.provisional, x.disturbance"                               \
    " FROM ("                                                                 \
    "  SELECT p.t_bucket, w.candidate_id, d.fingerprint, d.arch, w.run_id,"   \
    "   m.median_us, m.gbps, m." fraction " AS fraction,"                     \
    "   " provisional " AS provisional,"                                      \
    "   " disturbance " AS disturbance,"                                      \
    "   row_number() OVER (PARTITION BY p.t_bucket"                           \
    "    ORDER BY r.started_at DESC, w.run_id DESC, d.fingerprint IS ?9 DESC,"  \
    "    m.median_us ASC, d.id ASC) AS rn"                                      \
    "  FROM problems p"                                                       \
    "  JOIN winners w ON w.problem_id = p.id"                                 \
    "  JOIN runs r ON r.id = w.run_id"                                        \
    "  JOIN devices d ON d.id = w.device_id"                                  \
    "  JOIN candidates cw ON cw.id = w.candidate_id"                          \
    "  JOIN measurements m ON m.id = w.measurement_id"                        \
    "  WHERE p.op = ?1 AND p.dtype = ?2 AND p.form = ?3 AND p.d = ?4"         \
    "   AND p.n = ?5 AND p.heads = ?6 AND p.epilogue = ?7 AND p.s = ?8"       \
    "   AND " simulated " = ?13"                                              \
    "   AND CASE ?12 WHEN 0 THEN d.fingerprint = ?9"                          \
    "                WHEN 1 THEN d.backend = ?10 AND d.arch = ?11"            \
    "                ELSE d.backend = ?10 END"                                \
    " ) x JOIN candidates c ON c.id = x.candidate_id"                         \
    " WHERE x.rn = 1"
    /* The kind of device (simulated or real) must match at every level:
     * the filter sits outside the level's CASE so that no level can cross
     * it. A file older than v4, opened read-only, has no simulated column
     * and only real devices; one older than v9 has no provisional winner
     * (nothing watched its final rounds); one older than v11 names the
     * fraction of the ceiling by its older name. */
    static const char sql[] = WINNERS_LOOKUP_SQL("d.simulated", "w.provisional", "w.disturbance", "ceiling_fraction");
    static const char sql_pre_v11[] =
        WINNERS_LOOKUP_SQL("d.simulated", "w.provisional", "w.disturbance", ARDB_CEILING_FRACTION_PRE_V11);
    static const char sql_pre_v9[] = WINNERS_LOOKUP_SQL("d.simulated", "0", "NULL", ARDB_CEILING_FRACTION_PRE_V11);
    static const char sql_pre_v4[] = WINNERS_LOOKUP_SQL("0", "0", "NULL", ARDB_CEILING_FRACTION_PRE_V11);
#undef WINNERS_LOOKUP_SQL
    sqlite3_stmt *st;
    ardb_binder b;
    ardb_winner *arr = NULL;
    size_t n = 0, cap = 0;
    int code = ARDB_DONE, rc;

    if (!db)
        return ARDB_EINVAL;
    if (!out || !count)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_winners_lookup: invalid argument");
    *out = NULL;
    *count = 0;
    if (!p || !dev || !p->op || !p->dtype || !p->form)
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_winners_lookup: problem op, dtype and form "
                          "and a device are required");
    /* What each level matches on, and whether the device lacks it. */
    const struct {
        const char *needs;
        int missing;
    } levels[] = {
        [ARDB_LEVEL_EXACT] = {"EXACT needs the device fingerprint", !dev->fingerprint},
        [ARDB_LEVEL_ARCHITECTURE] = {"ARCHITECTURE needs the device backend and arch", !dev->backend || !dev->arch},
        [ARDB_LEVEL_BACKEND] = {"BACKEND needs the device backend", !dev->backend},
    };
    if ((unsigned)level >= sizeof levels / sizeof levels[0])
        return ardb__fail(db, ARDB_EINVAL,
                          "ardb_winners_lookup: unknown level %d", (int)level);
    if (levels[level].missing)
        return ardb__fail(db, ARDB_EINVAL, "ardb_winners_lookup: %s", levels[level].needs);
    const ardb_stmt_form forms[] = {{11, ST_WINNERS_LOOKUP, sql},
                                    {9, ST_WINNERS_LOOKUP_PRE_V11, sql_pre_v11},
                                    {4, ST_WINNERS_LOOKUP_PRE_V9, sql_pre_v9},
                                    {0, ST_WINNERS_LOOKUP_PRE_V4, sql_pre_v4}};
    if ((code = ardb__stmt_for_schema(db, forms, 4, &st)))
        return code;
    b = (ardb_binder){st, SQLITE_OK, 0};
    ardb__bind_text(&b, p->op);      /* ?1 */
    ardb__bind_text(&b, p->dtype);   /* ?2 */
    ardb__bind_text(&b, p->form);    /* ?3 */
    ardb__bind_int64(&b, p->d);      /* ?4 */
    ardb__bind_int64(&b, p->n);      /* ?5 */
    ardb__bind_int64(&b, p->heads);  /* ?6 */
    ardb__bind_int64(&b, p->epilogue); /* ?7 */
    ardb__bind_int64(&b, p->s);      /* ?8 */
    ardb__bind_text(&b, dev->fingerprint); /* ?9 */
    ardb__bind_text(&b, dev->backend);     /* ?10 */
    ardb__bind_text(&b, dev->arch);        /* ?11 */
    ardb__bind_int64(&b, (int64_t)level);  /* ?12 */
    ardb__bind_int64(&b, dev->simulated ? 1 : 0); /* ?13 */
    if (b.rc != SQLITE_OK)
        return ardb__stmt_fail(db, st, b.rc, "winners lookup");
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        ardb_winner *w;
        int oom = 0;
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            ardb_winner *na = realloc(arr, ncap * sizeof *na);
            if (!na) {
                code = ardb__fail(db, ARDB_ENOMEM,
                                  "winners lookup: out of memory");
                break;
            }
            arr = na;
            cap = ncap;
        }
        w = &arr[n++];
        memset(w, 0, sizeof *w);
        w->t_bucket = sqlite3_column_int64(st, 0);
        w->variant = ardb__col_dup(st, 1, &oom);
        w->kernel_name = ardb__col_dup(st, 2, &oom);
        w->source = ardb__col_dup(st, 3, &oom);
        w->source_hash = ardb__col_dup(st, 4, &oom);
        w->params_json = ardb__col_dup(st, 5, &oom);
        w->device_fingerprint = ardb__col_dup(st, 6, &oom);
        w->device_arch = ardb__col_dup(st, 7, &oom);
        w->run_id = sqlite3_column_int64(st, 8);
        w->median_us = ardb__col_double(st, 9);
        w->gbps = ardb__col_double(st, 10);
        w->ceiling_fraction = ardb__col_double(st, 11);
        w->provisional = sqlite3_column_int(st, 12) != 0;
        /* The evidence belongs to a provisional winner only. */
        w->disturbance = w->provisional ? ardb__col_dup(st, 13, &oom) : NULL;
        if (oom) {
            code = ardb__fail(db, ARDB_ENOMEM, "winners lookup: out of memory");
            break;
        }
    }
    if (code == ARDB_DONE && rc != SQLITE_DONE)
        code = ardb__sql_fail(db, rc, "winners lookup");
    ardb__release(st);
    if (code != ARDB_DONE) {
        ardb_winners_free(arr, n);
        return code;
    }
    sort_by_t_bucket(arr, n);
    *out = arr;
    *count = n;
    return ARDB_DONE;
}

int ardb_data_version(ardb *db, int64_t *version)
{
    sqlite3_stmt *st = NULL;
    int rc, code;

    if (!db)
        return ARDB_EINVAL;
    if (!version)
        return ardb__fail(db, ARDB_EINVAL, "ardb_data_version: invalid argument");
    /* Held by the handle: a model load asks once per plan. */
    if ((code = ardb__stmt(db, ST_DATA_VERSION, "PRAGMA main.data_version", &st)))
        return code;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        *version = sqlite3_column_int64(st, 0);
        rc = SQLITE_OK;
    }
    ardb__release(st);
    if (rc != SQLITE_OK)
        return ardb__sql_fail(db, rc, "cannot read the data version");
    return ARDB_DONE;
}
