/*
 * oom_runtime.c - out-of-memory injection for the runtime's public API, in
 * the manner of SQLite's malloc tests.
 *
 * Usage: test_oom_runtime [--list] [--case POINT]... DB
 *
 * One scenario is what an engine does at model load and on the hot path:
 * open the CPU device, open the tuning database DB, plan a tuned problem
 * and an untuned one, run each (checked against the fp64 reference),
 * explain, and close everything. It first runs once without failures (a
 * warm-up: once-only process state such as SQLite's initialisation is made
 * there and is not part of what is counted) and once more to count its
 * allocations. Then, for every k from 1 up, it runs again with the k-th
 * allocation failing, first only that one ("transient") and then every one
 * from the k-th on ("persistent"), until a run never reaches its k-th
 * allocation. Every call must then either succeed or return a documented
 * status with a message (ATTNRES_ENOMEM or another clean error); a plan
 * that was made must run and compute the right result even while
 * allocations keep failing (a run never allocates); and once everything is
 * closed no allocation of the scenario may remain (the live set below, and
 * LeakSanitizer at exit in the sanitizer build).
 *
 * The allocation hook is test-only: the test links the runtime's static
 * library with -Wl,--wrap for malloc, calloc, realloc, free, strdup,
 * strndup and posix_memalign, which reroutes the library's own calls here,
 * and installs the same counting allocator into SQLite through
 * sqlite3_config(SQLITE_CONFIG_MALLOC). The library itself is unchanged.
 * Allocations made inside libc (fopen's buffer, dlopen) are not counted.
 *
 * Each failure point is a case of tests/lib/check.h's harness, named
 * "transient/K" or "persistent/K": --case transient/37 runs the warm-up,
 * the count and that one point; --case persistent runs every persistent
 * point; --list prints the points up to the count's total (so it needs
 * DB). A point with a defect is followed by the command that reruns it.
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <math.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../lib/check.h"
#include "attnres.h"

/* ---- the hook -------------------------------------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
int __real_posix_memalign(void **p, size_t align, size_t n);

static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static long alloc_count;  /* allocations seen since the scenario began */
static long fail_at;      /* 0: none fails */
static int persistent;    /* every allocation from fail_at on fails */
static int injected;      /* a failure was injected in this scenario */
static int tracking;      /* the live set is kept */

/* The live set: every pointer the scenario allocated and has not freed.
 * Open addressing with linear probing; deletion shifts entries back, so
 * that no tombstones accumulate over thousands of scenarios. */
enum { LIVE_SLOTS = 1 << 18 };
static uintptr_t live[LIVE_SLOTS];
static long live_count;

static size_t slot_of(uintptr_t p)
{
    return (size_t)((p >> 4) * 11400714819323198485ull >> 46) & (LIVE_SLOTS - 1);
}

static void live_add(void *ptr)
{
    if (!ptr || !tracking)
        return;
    size_t i = slot_of((uintptr_t)ptr);
    while (live[i])
        i = (i + 1) & (LIVE_SLOTS - 1);
    live[i] = (uintptr_t)ptr;
    live_count++;
}

static void live_remove(void *ptr)
{
    if (!ptr)
        return;
    size_t i = slot_of((uintptr_t)ptr);
    while (live[i] && live[i] != (uintptr_t)ptr)
        i = (i + 1) & (LIVE_SLOTS - 1);
    if (!live[i])
        return; /* allocated before tracking began, or inside libc */
    live[i] = 0;
    live_count--;
    for (size_t j = (i + 1) & (LIVE_SLOTS - 1); live[j]; j = (j + 1) & (LIVE_SLOTS - 1)) {
        size_t home = slot_of(live[j]);
        /* Move j back to the hole at i when its home is not in (i, j]. */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            live[i] = live[j];
            live[j] = 0;
            i = j;
        }
    }
}

/* Counts one allocation; 1 when it must fail. */
static int should_fail(void)
{
    alloc_count++;
    if (fail_at && (alloc_count == fail_at || (persistent && alloc_count > fail_at))) {
        injected = 1;
        return 1;
    }
    return 0;
}

void *__wrap_malloc(size_t n)
{
    pthread_mutex_lock(&hook_lock);
    void *p = should_fail() ? NULL : __real_malloc(n);
    live_add(p);
    pthread_mutex_unlock(&hook_lock);
    return p;
}

void *__wrap_calloc(size_t n, size_t m)
{
    pthread_mutex_lock(&hook_lock);
    void *p = should_fail() ? NULL : __real_calloc(n, m);
    live_add(p);
    pthread_mutex_unlock(&hook_lock);
    return p;
}

void *__wrap_realloc(void *old, size_t n)
{
    pthread_mutex_lock(&hook_lock);
    void *p = NULL;
    if (!should_fail()) {
        p = __real_realloc(old, n);
        if (p) {
            live_remove(old);
            live_add(p);
        }
    }
    pthread_mutex_unlock(&hook_lock);
    return p;
}

void __wrap_free(void *p)
{
    pthread_mutex_lock(&hook_lock);
    live_remove(p);
    __real_free(p);
    pthread_mutex_unlock(&hook_lock);
}

char *__wrap_strdup(const char *s)
{
    pthread_mutex_lock(&hook_lock);
    char *p = should_fail() ? NULL : __real_strdup(s);
    live_add(p);
    pthread_mutex_unlock(&hook_lock);
    return p;
}

char *__wrap_strndup(const char *s, size_t n)
{
    pthread_mutex_lock(&hook_lock);
    char *p = should_fail() ? NULL : __real_strndup(s, n);
    live_add(p);
    pthread_mutex_unlock(&hook_lock);
    return p;
}

int __wrap_posix_memalign(void **out, size_t align, size_t n)
{
    pthread_mutex_lock(&hook_lock);
    int rc = should_fail() ? 12 /* ENOMEM */ : __real_posix_memalign(out, align, n);
    if (!rc)
        live_add(*out);
    pthread_mutex_unlock(&hook_lock);
    return rc;
}

/* SQLite's allocator: the default one, counted and failed like the rest. */
static sqlite3_mem_methods sqlite_default;

static void *sq_malloc(int n)
{
    pthread_mutex_lock(&hook_lock);
    void *p = should_fail() ? NULL : sqlite_default.xMalloc(n);
    live_add(p);
    pthread_mutex_unlock(&hook_lock);
    return p;
}

static void sq_free(void *p)
{
    pthread_mutex_lock(&hook_lock);
    live_remove(p);
    sqlite_default.xFree(p);
    pthread_mutex_unlock(&hook_lock);
}

static void *sq_realloc(void *old, int n)
{
    pthread_mutex_lock(&hook_lock);
    void *p = NULL;
    if (!should_fail()) {
        p = sqlite_default.xRealloc(old, n);
        if (p) {
            live_remove(old);
            live_add(p);
        }
    }
    pthread_mutex_unlock(&hook_lock);
    return p;
}

static int sq_size(void *p) { return sqlite_default.xSize(p); }
static int sq_roundup(int n) { return sqlite_default.xRoundup(n); }
static int sq_init(void *app) { return sqlite_default.xInit(app); }
static void sq_shutdown(void *app) { sqlite_default.xShutdown(app); }

static void set_injection(long at, int persist)
{
    pthread_mutex_lock(&hook_lock);
    alloc_count = 0;
    fail_at = at;
    persistent = persist;
    injected = 0;
    pthread_mutex_unlock(&hook_lock);
}

/* ---- the scenario ---------------------------------------------------- */

enum { D = 256, T = 4 };
static int defects;
static const char *db_path;
static char cache_root[512];

static void defect(long k, int persist, const char *what, const char *detail)
{
    printf("DEFECT (k=%ld %s): %s%s%s\n", k, persist ? "persistent" : "transient", what, detail ? ": " : "",
           detail ? detail : "");
    defects++;
}

/* A failing call must return a documented status with a message. */
static long refusals[ATTNRES_EMISMATCH + 1];

static void check_refusal(long k, int persist, const char *what, int rc, const char *msg)
{
    if (rc > ATTNRES_OK && rc <= ATTNRES_EMISMATCH)
        refusals[rc]++;
    if (rc <= ATTNRES_OK || rc > ATTNRES_EMISMATCH)
        defect(k, persist, what, "returned an unknown status");
    else if (!msg || !*msg)
        defect(k, persist, what, "failed without a message");
    else if (!injected)
        defect(k, persist, what, msg); /* a failure with no allocation failed */
}

static float src[8][T * D], query[D], out[T * D];
static double dsrc[8][T * D], dq[D], ref[T * D];

static void run_checked(long k, int persist, attnres_plan *plan, const attnres_problem *p)
{
    const void *s[8];
    const double *ds[8];
    for (int j = 0; j < p->n; j++) {
        s[j] = src[j];
        ds[j] = dsrc[j];
    }
    for (int i = 0; i < T * D; i++)
        out[i] = NAN;
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = s;
    a.query = query;
    a.out = out;
    /* A run never allocates, so it must succeed even when every allocation
     * fails from here on. */
    int rc = attnres_run_mix(plan, T, &a, NULL);
    if (rc != ATTNRES_OK) {
        defect(k, persist, "run_mix on a valid plan failed", attnres_plan_errmsg(plan));
        return;
    }
    /* The reference is checked with injection off: it is the oracle here,
     * not what is under test (its own failures are tested in the runs). */
    pthread_mutex_lock(&hook_lock);
    const long saved = fail_at;
    fail_at = 0;
    pthread_mutex_unlock(&hook_lock);
    rc = attnres_reference_mix(p, T, ds, dq, 1.0, 1e-6, NULL, 1.0, NULL, 1e-6, ref, NULL);
    pthread_mutex_lock(&hook_lock);
    fail_at = saved;
    pthread_mutex_unlock(&hook_lock);
    if (rc != ATTNRES_OK) {
        defect(k, persist, "the reference failed", attnres_errstr(rc));
        return;
    }
    double num = 0, den = 0;
    for (int i = 0; i < T * D; i++) {
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    if (!(sqrt(num / den) <= 1e-5))
        defect(k, persist, "a plan computes a wrong result", NULL);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* One scenario with the k-th allocation failing (k = 0: none). */
static void scenario(long k, int persist)
{
    char msg[512];
    /* A fresh binary cache each time: every scenario takes the same path
     * (kernels come from the database's sealed binaries and are written to
     * the cache), so that the count of allocations is the same in each. */
    char cache[600];
    snprintf(cache, sizeof cache, "%s/cache", cache_root);
    nftw(cache, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    setenv("ATTNRES_CACHE_DIR", cache, 1);

    set_injection(k, persist);
    attnres_device *dev = NULL;
    msg[0] = '\0';
    int rc = attnres_device_open("cpu", &dev, msg, sizeof msg);
    if (rc != ATTNRES_OK) {
        check_refusal(k, persist, "device_open", rc, msg);
        if (dev)
            defect(k, persist, "device_open failed but returned a handle", NULL);
        dev = NULL;
    }
    attnres_db *db = NULL;
    msg[0] = '\0';
    rc = attnres_db_open(db_path, &db, msg, sizeof msg);
    if (rc != ATTNRES_OK) {
        check_refusal(k, persist, "db_open", rc, msg);
        if (db)
            defect(k, persist, "db_open failed but returned a handle", NULL);
        db = NULL;
    }
    if (dev) {
        /* The tuned shape of the ci preset, and an untuned one. */
        const int ns[2] = {5, 7};
        for (int i = 0; i < 2; i++) {
            attnres_problem p;
            attnres_problem_init(&p, ATTNRES_DTYPE_F32, D, ns[i]);
            attnres_plan *plan = NULL;
            msg[0] = '\0';
            rc = attnres_plan_create(dev, db, &p, 0, &plan, msg, sizeof msg);
            if (rc != ATTNRES_OK) {
                check_refusal(k, persist, "plan_create", rc, msg);
                if (plan)
                    defect(k, persist, "plan_create failed but returned a plan", NULL);
                continue;
            }
            char explain[4096];
            attnres_plan_explain(plan, explain, sizeof explain);
            run_checked(k, persist, plan, &p);
            attnres_plan_destroy(plan);
        }
    }
    attnres_db_close(db);
    attnres_device_close(dev);
    /* Injection off, keeping the count and whether a failure was injected
     * for the caller. */
    pthread_mutex_lock(&hook_lock);
    fail_at = 0;
    persistent = 0;
    pthread_mutex_unlock(&hook_lock);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (argc != 2) {
        fprintf(stderr, "usage: %s [--list] [--case transient/K|persistent/K]... DB\n", argv[0]);
        return 2;
    }
    db_path = argv[1];
    if (access(db_path, R_OK)) {
        printf("no database at %s\n", db_path);
        return 1;
    }
    if (sqlite3_config(SQLITE_CONFIG_GETMALLOC, &sqlite_default) != SQLITE_OK)
        return 1;
    static sqlite3_mem_methods counted;
    counted = sqlite_default;
    counted.xMalloc = sq_malloc;
    counted.xFree = sq_free;
    counted.xRealloc = sq_realloc;
    counted.xSize = sq_size;
    counted.xRoundup = sq_roundup;
    counted.xInit = sq_init;
    counted.xShutdown = sq_shutdown;
    if (sqlite3_config(SQLITE_CONFIG_MALLOC, &counted) != SQLITE_OK || sqlite3_initialize() != SQLITE_OK) {
        fprintf(stderr, "cannot install the counting allocator into SQLite\n");
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(cache_root, sizeof cache_root, "%s/attnres-oom-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(cache_root))
        return 1;
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < T * D; j++) {
            src[i][j] = (float)sin(0.37 * (i * T * D + j) + 0.1);
            dsrc[i][j] = src[i][j];
        }
    for (int j = 0; j < D; j++) {
        query[j] = (float)(0.25 * cos(0.11 * j));
        dq[j] = query[j];
    }

    scenario(0, 0); /* warm-up: once-only state */
    tracking = 1;
    scenario(0, 0);
    const long total = alloc_count;
    if (live_count) {
        printf("DEFECT: the scenario leaks %ld allocations without any failure\n", live_count);
        defects++;
    }
    long points = 0;
    for (int persist = 0; persist < 2; persist++) {
        for (long k = 1;; k++) {
            char name[64];
            snprintf(name, sizeof name, "%s/%ld", persist ? "persistent" : "transient", k);
            /* Selected points go up to the count's total, past which no
             * failure is injected. A run may allocate less than the count
             * (the full sweep ends at the first point a run no longer
             * reaches), and a point run alone starts from the state the
             * count left, not the one the points before it left: its rerun
             * is close to, not always the same as, the sweep's run. */
            if (check_listing || check_nselected) {
                if (k > total)
                    break;
                if (!check_name_selected(name))
                    continue;
                if (check_listing) {
                    printf("%s\n", name);
                    continue;
                }
            }
            const long before = live_count;
            const int defects_before = defects;
            scenario(k, persist);
            if (!injected)
                break; /* the scenario no longer reaches its k-th allocation */
            points++;
            if (live_count != before) {
                char d[64];
                snprintf(d, sizeof d, "%ld allocations left after closing everything", live_count - before);
                defect(k, persist, "leak", d);
                live_count = before; /* report each leaking k once */
                memset(live, 0, sizeof live);
            }
            if (defects != defects_before)
                check_print_rerun(name);
            if (defects > 50) {
                printf("too many defects, stopping\n");
                goto done;
            }
        }
    }
done:
    nftw(cache_root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (check_listing)
        return check_exit_status(0);
    for (int i = 1; i <= ATTNRES_EMISMATCH; i++)
        if (refusals[i])
            printf("oom: %ld calls returned %s\n", refusals[i], attnres_errstr(i));
    printf("oom: %ld allocations per scenario, %ld failure points injected (transient and persistent), %d defects\n",
           total, points, defects);
    return check_exit_status(defects);
}
