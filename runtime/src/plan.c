/*
 * plan.c - planning at model load, and the hot path.
 *
 * attnres_plan_create does all the slow work once: database lookup along
 * the fallback chain (exact device, same architecture, same backend, built-in
 * generic kernel), fetching or compiling each T bucket's binary, loading it.
 * attnres_run_mix then only checks arguments, picks a bucket and launches.
 *
 * A model plans many sites of few shapes. The database handle remembers its
 * lookups (db_handle.h), and plans of one device share each tuned kernel
 * they load (the registry below), so the second plan of a shape reads no
 * file and loads nothing.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ardb.h"
#include "binary_cache.h"
#include "db_handle.h"
#include "device.h"
#include "errmsg.h"
#include "miss_file.h"
#include "sha256.h"
#include "views.h"

#define AR_MAX_BUCKETS 32

typedef struct ar_shared_kernel ar_shared_kernel;

typedef struct plan_bucket {
    int64_t t_bucket; /* T the kernel was tuned at (0 for generic) */
    int64_t t_max;    /* this bucket serves T <= t_max */
    ar_kernel kernel;
    ar_shared_kernel *shared; /* the registry's record that owns kernel's module; NULL: the plan owns it */
} plan_bucket;

struct attnres_plan {
    attnres_device *dev;
    attnres_problem problem;
    attnres_plan_level level;
    int nbuckets;
    plan_bucket buckets[AR_MAX_BUCKETS];
    char explain[8192];
    size_t explain_len;
    uint64_t err_id; /* run failures, per thread (errmsg.h) */
    int db_failed; /* a lookup failed: the database is damaged, not silent */
    ar_miss_site miss; /* armed when the plan fell back (miss_file.h) */
};

static const char *level_name(attnres_plan_level level)
{
    switch (level) {
    case ATTNRES_LEVEL_EXACT: return "exact device";
    case ATTNRES_LEVEL_ARCHITECTURE: return "same architecture";
    case ATTNRES_LEVEL_BACKEND: return "same backend";
    case ATTNRES_LEVEL_GENERIC: return "built-in generic kernel";
    }
    return "unknown";
}

static void explain(attnres_plan *plan, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void explain(attnres_plan *plan, const char *fmt, ...)
{
    if (plan->explain_len >= sizeof plan->explain - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(plan->explain + plan->explain_len, sizeof plan->explain - plan->explain_len, fmt, ap);
    va_end(ap);
    if (n > 0)
        plan->explain_len += (size_t)n;
    if (plan->explain_len > sizeof plan->explain - 1)
        plan->explain_len = sizeof plan->explain - 1;
}

/* ---- tuned kernels shared by the plans of a device --------------------- */

/* One loaded tuned kernel and the plans that use it. The plans own it
 * together: the last one destroyed unloads it, so that plans stay
 * independent handles, destroyed in any order, and nothing outlives them
 * (a device outlives its plans, and the database may be closed at once). A
 * loaded kernel is never changed, so plans on several threads can launch it
 * at once. It is found by what its binary is built from: the recorded
 * source hash (the build key's part that differs between kernels), the
 * entry point and the launch parameters. */
struct ar_shared_kernel {
    ar_shared_kernel *next;
    const attnres_device *dev;
    int refs;               /* plans using it, under shared_lock */
    char source_hash[65];
    char origin[32];        /* where its binary came from: "binary cache", "database", "compiled now" */
    ar_kernel kernel;
    char *params_json;      /* points into text, NULL for none */
    char text[];            /* kernel name, then the parameters */
};

static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static ar_shared_kernel *shared_kernels;

static int same_text(const char *a, const char *b) { return a == b || (a && b && strcmp(a, b) == 0); }

static int shared_matches(const ar_shared_kernel *s, const attnres_device *dev, const ardb_winner *w)
{
    return s->dev == dev && strcmp(s->source_hash, w->source_hash) == 0 && same_text(s->text, w->kernel_name) &&
           same_text(s->params_json, w->params_json);
}

/* The loaded kernel of winner w on dev, with one more user; NULL when no
 * plan of the device has it loaded. */
static ar_shared_kernel *shared_acquire(const attnres_device *dev, const ardb_winner *w)
{
    pthread_mutex_lock(&shared_lock);
    ar_shared_kernel *s = shared_kernels;
    while (s && !shared_matches(s, dev, w))
        s = s->next;
    if (s)
        s->refs++;
    pthread_mutex_unlock(&shared_lock);
    return s;
}

/* Hands kernel k, just loaded for winner w, to the registry, with the
 * calling plan as its one user. NULL when it stays the plan's own: out of
 * memory (sharing only saves time), or another thread registered the same
 * kernel meanwhile. */
static ar_shared_kernel *shared_add(const attnres_device *dev, const ardb_winner *w, const ar_kernel *k,
                                    const char *origin)
{
    const size_t name_len = strlen(w->kernel_name) + 1, params_len = w->params_json ? strlen(w->params_json) + 1 : 0;
    ar_shared_kernel *s = malloc(sizeof *s + name_len + params_len);
    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    s->dev = dev;
    s->refs = 1;
    snprintf(s->source_hash, sizeof s->source_hash, "%s", w->source_hash);
    snprintf(s->origin, sizeof s->origin, "%s", origin);
    s->kernel = *k;
    memcpy(s->text, w->kernel_name, name_len);
    if (w->params_json) {
        s->params_json = s->text + name_len;
        memcpy(s->params_json, w->params_json, params_len);
    }
    pthread_mutex_lock(&shared_lock);
    ar_shared_kernel *have = shared_kernels;
    while (have && !shared_matches(have, dev, w))
        have = have->next;
    if (!have) {
        s->next = shared_kernels;
        shared_kernels = s;
    }
    pthread_mutex_unlock(&shared_lock);
    if (have) {
        free(s);
        return NULL;
    }
    return s;
}

/* Drops one user; the last one unloads the kernel. */
static void shared_release(attnres_device *dev, ar_shared_kernel *s)
{
    pthread_mutex_lock(&shared_lock);
    const int last = --s->refs == 0;
    if (last) {
        ar_shared_kernel **p = &shared_kernels;
        while (*p != s)
            p = &(*p)->next;
        *p = s->next;
    }
    pthread_mutex_unlock(&shared_lock);
    if (!last)
        return;
    if (dev->ops->unload)
        dev->ops->unload(dev, &s->kernel);
    free(s);
}

static void unload_all(attnres_plan *plan)
{
    for (int i = 0; i < plan->nbuckets; i++) {
        plan_bucket *b = &plan->buckets[i];
        if (b->shared)
            shared_release(plan->dev, b->shared);
        else if (plan->dev->ops->unload)
            plan->dev->ops->unload(plan->dev, &b->kernel);
        b->shared = NULL;
    }
    plan->nbuckets = 0;
}

static const char *op_name(attnres_op op) { return ar_op_name(op); }

static void fill_ardb_problem(const attnres_problem *p, ardb_problem *q)
{
    memset(q, 0, sizeof *q);
    q->op = op_name(p->op);
    q->dtype = attnres_dtype_name(p->dtype);
    /* Phase 2 with the sublayer add fused is its own tuning problem; the
     * database records it under the form "fused". */
    q->form = ar_op_forward(p->op) == ATTNRES_OP_PHASE2 && p->fuse_add ? "fused"
              : p->form == ATTNRES_FORM_ADDITIVE      ? "additive"
                                                      : "replace";
    q->d = p->d;
    q->n = p->n;
    q->heads = p->heads;
    q->epilogue = p->epilogue;
    q->s = ar_op_forward(p->op) == ATTNRES_OP_PHASE1 ? p->s : 0;
}

static void fill_ardb_device(const attnres_device *dev, ardb_device *d)
{
    memset(d, 0, sizeof *d);
    d->backend = dev->backend;
    d->name = dev->name;
    d->arch = dev->arch;
    d->driver = dev->driver;
    d->fingerprint = dev->fingerprint;
    d->units = dev->units;
    d->memory = dev->memory;
    d->simulated = dev->simulated; /* winners never cross between simulated and real */
}

/* A provisional winner (schema v9) is served like any other, since it is
 * still the best the database knows; the explanation says, below its
 * bucket's line, that the choice may be a disturbed minute's and how to
 * settle it. */
static void explain_provisional(attnres_plan *plan, const ardb_winner *w)
{
    if (!w->provisional)
        return;
    explain(plan, "    provisional: the final round that chose it was disturbed by other work on every try (%s); "
                  "`attnres tune --revalidate` on a quiet machine decides it again\n",
            w->disturbance ? w->disturbance : "no evidence recorded");
}

/* Loads one winner's binary into k: from the binary cache, else the
 * database, else compiled from its (hash-checked) source. A copy that does
 * not load (damaged, or sealed by no attnres) is passed over for the next
 * one, and a cache entry that does not load is replaced by the copy that
 * does, so a damaged cache heals instead of costing the tuned kernel. */
static int load_winner(attnres_plan *plan, attnres_db *db, const ardb_winner *w, plan_bucket *b)
{
    attnres_device *dev = plan->dev;
    ar_kernel *k = &b->kernel;
    /* The build key names the binary by the recorded source hash; the
     * source itself is only checked against it when it has to be compiled
     * (binaries carry their own seal). */
    if (!w->source_hash || strlen(w->source_hash) != 64 || strspn(w->source_hash, "0123456789abcdef") != 64)
        return ar_device_fail(dev, ATTNRES_EDB, "the recorded source hash of %s is damaged", w->variant);
    b->shared = shared_acquire(dev, w);
    if (b->shared) {
        *k = b->shared->kernel;
        snprintf(k->variant, sizeof k->variant, "%s", w->variant);
        /* Which plan loaded it: this one, for an earlier T bucket that
         * the same variant won (the buckets filled so far), or another.
         * In brackets: where the loading plan got the binary. */
        char by[64] = "by another plan";
        for (int j = 0; j < plan->nbuckets; j++)
            if (plan->buckets[j].shared == b->shared) {
                snprintf(by, sizeof by, "for T bucket %" PRId64 " of this plan", plan->buckets[j].t_bucket);
                break;
            }
        explain(plan, "  T bucket %" PRId64 ": %s (loaded already %s [%s], tuned on %s, %.2f us, %.0f%% of ceiling)\n",
                w->t_bucket, w->variant, by, b->shared->origin, w->device_fingerprint ? w->device_fingerprint : "?",
                w->median_us, 100.0 * w->ceiling_fraction);
        explain_provisional(plan, w);
        return ATTNRES_OK;
    }
    memset(k, 0, sizeof *k);
    ar_build_key(dev, w->source_hash, k->build_key);
    snprintf(k->variant, sizeof k->variant, "%s", w->variant);
    void *blob = NULL;
    size_t size = 0;
    const char *origin = NULL;
    char why[700] = "", path[4200];
    const int have_path = ar_cache_path(k->build_key, "", path, sizeof path) == 0;
    int st = ATTNRES_ENOTFOUND;
    if (have_path && ar_read_file(path, &blob, &size) == 0) {
        st = dev->ops->load(dev, blob, size, w->source, w->kernel_name, w->params_json, k);
        free(blob);
        if (st == ATTNRES_OK)
            origin = "binary cache";
        else {
            snprintf(why, sizeof why, "; the cached copy did not load (%.300s)", attnres_device_errmsg(dev));
            ar_cache_drop(path);
        }
    }
    if (st != ATTNRES_OK && ardb_binary_get(db->db, k->build_key, &blob, &size) == ARDB_DONE) {
        st = dev->ops->load(dev, blob, size, w->source, w->kernel_name, w->params_json, k);
        if (st == ATTNRES_OK) {
            origin = "database";
            if (have_path)
                ar_cache_store(path, blob, size); /* best effort: a miss only costs time */
        } else {
            size_t used = strlen(why);
            snprintf(why + used, sizeof why - used, "; the stored copy did not load (%.300s)", attnres_device_errmsg(dev));
        }
        free(blob);
    }
    if (st != ATTNRES_OK) {
        char hash[65], *log = NULL;
        ar_sha256_string(w->source ? w->source : "", hash);
        if (strcmp(hash, w->source_hash) != 0)
            st = ar_device_fail(dev, ATTNRES_EDB, "stored source of %s does not match its hash", w->variant);
        else
            st = dev->ops->compile(dev, w->source, w->kernel_name, &blob, &size, &log);
        free(log);
        if (st == ATTNRES_OK) {
            st = dev->ops->load(dev, blob, size, w->source, w->kernel_name, w->params_json, k);
            if (st == ATTNRES_OK) {
                origin = "compiled now";
                if (have_path)
                    ar_cache_store(path, blob, size);
            }
            free(blob);
        }
        if (st != ATTNRES_OK && why[0]) {
            ar_device_fail(dev, st, "%.500s%.500s", attnres_device_errmsg(dev), why);
        }
    }
    if (st != ATTNRES_OK)
        return st;
    if (w->kernel_name)
        b->shared = shared_add(dev, w, k, origin);
    explain(plan, "  T bucket %" PRId64 ": %s (%s%s, tuned on %s, %.2f us, %.0f%% of ceiling)\n", w->t_bucket,
            w->variant, origin, why, w->device_fingerprint ? w->device_fingerprint : "?", w->median_us,
            100.0 * w->ceiling_fraction);
    explain_provisional(plan, w);
    return ATTNRES_OK;
}

/* Tries one level of the fallback chain. Returns OK when every bucket
 * loaded, ENOTFOUND when the level has no winners, or the load error. */
static int try_level(attnres_plan *plan, attnres_db *db, attnres_plan_level level)
{
    ardb_problem q;
    ardb_device d;
    fill_ardb_problem(&plan->problem, &q);
    fill_ardb_device(plan->dev, &d);
    const ardb_winner *w = NULL;
    ardb_winner *owned = NULL;
    size_t count = 0;
    pthread_mutex_lock(&db->lock);
    int rc = ar_db_winners(db, &q, &d, (ardb_level)level, &w, &count, &owned);
    if (rc != ARDB_DONE) {
        int st = ar_device_fail(plan->dev, ar_status_from_ardb(rc), "database lookup failed: %s", ardb_errmsg(db->db));
        pthread_mutex_unlock(&db->lock);
        plan->db_failed = 1;
        return st;
    }
    if (count == 0) {
        pthread_mutex_unlock(&db->lock);
        ardb_winners_free(owned, count);
        explain(plan, "no tuned kernel at level '%s'\n", level_name(level));
        return ATTNRES_ENOTFOUND;
    }
    const size_t used = count > AR_MAX_BUCKETS ? AR_MAX_BUCKETS : count;
    explain(plan, "level '%s': %zu T bucket(s)\n", level_name(level), used);
    int st = ATTNRES_OK;
    for (size_t i = 0; i < used && st == ATTNRES_OK; i++) {
        st = load_winner(plan, db, &w[i], &plan->buckets[i]);
        if (st == ATTNRES_OK) {
            plan->buckets[i].t_bucket = w[i].t_bucket;
            plan->nbuckets = (int)i + 1;
        }
    }
    pthread_mutex_unlock(&db->lock);
    ardb_winners_free(owned, count);
    if (st != ATTNRES_OK) {
        explain(plan, "  level '%s' unusable: %s\n", level_name(level), attnres_device_errmsg(plan->dev));
        unload_all(plan);
        return st;
    }
    /* Each bucket serves T up to the geometric middle of its neighbours. */
    for (int i = 0; i < plan->nbuckets; i++) {
        plan_bucket *b = &plan->buckets[i];
        if (i + 1 < plan->nbuckets) {
            double mid = __builtin_sqrt((double)b->t_bucket * (double)plan->buckets[i + 1].t_bucket);
            b->t_max = (int64_t)mid;
            if (b->t_max < b->t_bucket)
                b->t_max = b->t_bucket;
        } else {
            b->t_max = INT64_MAX;
        }
    }
    plan->level = level;
    return ATTNRES_OK;
}

static int load_generic(attnres_plan *plan)
{
    plan_bucket *b = &plan->buckets[0];
    int st = plan->dev->ops->load_generic(plan->dev, &plan->problem, &b->kernel);
    if (st != ATTNRES_OK)
        return st;
    b->t_bucket = 0;
    b->t_max = INT64_MAX;
    plan->nbuckets = 1;
    plan->level = ATTNRES_LEVEL_GENERIC;
    explain(plan, "using the built-in generic kernel %s for every T: %s\n", b->kernel.variant, b->kernel.kernel_name);
    explain(plan, "fallback: no tuned kernel serves this problem on this device (see above); the built-in "
                  "kernel can be far slower than a tuned one (tune it: attnres tune, or record misses with "
                  "ATTNRES_MISS_FILE and run attnres tune --from-misses)\n");
    ar_miss_site_arm(&plan->miss, &plan->problem, plan->dev->fingerprint);
    char miss_path[4096], why[4200];
    if (ar_miss_file_path(miss_path, sizeof miss_path) != 0)
        return ATTNRES_OK;
    if (ar_miss_file_usable(miss_path, why, sizeof why))
        explain(plan, "untuned runs are recorded in the miss file %s\n", miss_path);
    else
        explain(plan, "the miss file %s\n", why);
    return ATTNRES_OK;
}

int attnres_plan_create(attnres_device *dev, attnres_db *db, const attnres_problem *problem, unsigned flags,
                        attnres_plan **out, char *msg, size_t msg_len)
{
    char scratch[8];
    if (ar_handle_call_start(out, &msg, &msg_len, scratch, sizeof scratch) != ATTNRES_OK)
        return ATTNRES_EINVAL;
    *out = NULL;
    if (!dev) {
        snprintf(msg, msg_len, "device is NULL");
        return ATTNRES_EINVAL;
    }
    int st = attnres_problem_check(problem, msg, msg_len);
    if (st != ATTNRES_OK) {
        ar_device_fail(dev, st, "%s", msg);
        return st;
    }
    attnres_problem own; /* an older caller's struct, completed */
    ar_problem_adopt(problem, &own, msg, msg_len);
    problem = &own;
    if (dev->ops->check_problem && (st = dev->ops->check_problem(dev, problem)) != ATTNRES_OK) {
        snprintf(msg, msg_len, "%s", attnres_device_errmsg(dev));
        return st;
    }
    attnres_plan *plan = calloc(1, sizeof *plan);
    if (!plan) {
        snprintf(msg, msg_len, "out of memory");
        return ar_device_fail(dev, ATTNRES_ENOMEM, "out of memory");
    }
    plan->err_id = ar_errmsg_new_id();
    plan->dev = dev;
    plan->problem = *problem;
    char sites[32] = "";
    if (ar_op_forward(problem->op) == ATTNRES_OP_PHASE1)
        snprintf(sites, sizeof sites, " S=%d", problem->s);
    explain(plan, "problem: %s %s d=%" PRId64 " N=%d%s H=%d %s%s%s on %s\n", op_name(problem->op),
            attnres_dtype_name(problem->dtype), problem->d, problem->n, sites, problem->heads,
            problem->form == ATTNRES_FORM_ADDITIVE ? "additive" : "replace",
            problem->epilogue ? " +epilogue" : "", problem->fuse_add ? " +fused add" : "", dev->fingerprint);
    st = ATTNRES_ENOTFOUND;
    if (!db)
        explain(plan, "no database given\n");
    for (int level = ATTNRES_LEVEL_EXACT; db && level <= ATTNRES_LEVEL_BACKEND; level++) {
        st = try_level(plan, db, (attnres_plan_level)level);
        if (st == ATTNRES_OK || (flags & ATTNRES_PLAN_REQUIRE_EXACT) || plan->db_failed)
            break;
    }
    /* A database that cannot be queried is an error, not a reason to fall
     * back quietly; a level without winners, or whose binaries do not load,
     * is (unless an exact match is required). */
    if (st != ATTNRES_OK && ((flags & ATTNRES_PLAN_REQUIRE_EXACT) || plan->db_failed)) {
        if (st == ATTNRES_ENOTFOUND)
            ar_device_fail(dev, st, "no kernel tuned on this exact device (%s) for this problem, and an exact match "
                                    "was required", dev->fingerprint);
        snprintf(msg, msg_len, "%s", attnres_device_errmsg(dev));
        free(plan);
        return st;
    }
    if (st != ATTNRES_OK)
        st = load_generic(plan);
    if (st != ATTNRES_OK) {
        snprintf(msg, msg_len, "%s", attnres_device_errmsg(dev));
        free(plan);
        return st;
    }
    explain(plan, "plan level: %s\n", level_name(plan->level));
    *out = plan;
    return ATTNRES_OK;
}

void attnres_plan_destroy(attnres_plan *plan)
{
    if (!plan)
        return;
    unload_all(plan);
    ar_errmsg_forget(plan->err_id);
    free(plan);
}

attnres_plan_level attnres_plan_level_get(const attnres_plan *plan)
{
    return plan ? plan->level : ATTNRES_LEVEL_GENERIC;
}

size_t attnres_plan_explain(const attnres_plan *plan, char *buf, size_t buf_len)
{
    if (!plan) {
        if (buf && buf_len)
            buf[0] = 0;
        return 0;
    }
    if (buf && buf_len)
        snprintf(buf, buf_len, "%s", plan->explain);
    return plan->explain_len;
}

const char *attnres_plan_errmsg(const attnres_plan *plan)
{
    return plan ? ar_errmsg_get(plan->err_id) : "no plan";
}

/* Records a run failure on the plan. The hot path formats nothing unless
 * something is wrong. */
static int run_fail(attnres_plan *plan, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run_fail(attnres_plan *plan, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ar_errmsg_vset(plan->err_id, fmt, ap);
    va_end(ap);
    return status;
}

static int misaligned(const void *p, size_t align) { return ((uintptr_t)p % align) != 0; }

/* A run's argument struct from a caller of 0.2.0 or later: its
 * struct_size is read before anything else in it. One of this library's
 * size is returned as it is; an older one is completed in own from the
 * defaults that init writes, and own is returned. NULL with *st set when
 * the size is out of range. */
static const void *adopt_args(attnres_plan *plan, const void *a, void *own, size_t oldest, size_t want,
                              void (*init)(void *), const char *type, const char *init_name, int *st)
{
    char msg[300];
    size_t got = *(const size_t *)a;
    if (got == want)
        return a;
    if (ar_struct_size_check(got, oldest, want, type, init_name, msg, sizeof msg)) {
        *st = run_fail(plan, ATTNRES_EINVAL, "%s", msg);
        return NULL;
    }
    init(own);
    ar_struct_adopt(a, own, want);
    return own;
}

static void mix_args_defaults(void *a) { attnres_mix_args_init(a); }
static void phase1_args_defaults(void *a) { attnres_phase1_args_init(a); }
static void phase2_args_defaults(void *a) { attnres_phase2_args_init(a); }

/* The bucket that serves T tokens. */
static const plan_bucket *pick_bucket(attnres_plan *plan, int64_t T)
{
    if (plan->miss.armed)
        ar_miss_site_note(&plan->miss, T); /* one atomic load once recorded */
    const plan_bucket *b = &plan->buckets[0];
    for (int i = 0; i < plan->nbuckets; i++) {
        b = &plan->buckets[i];
        if (T <= b->t_max)
            break;
    }
    return b;
}

/* ---- the memory a run's arguments span ------------------------------- */

/* One argument's view, with its name for messages: "out", "source 3",
 * "o1[2]". */
typedef struct run_view {
    ar_view v;
    const char *name;
    int index;  /* -1: the name alone */
    int output; /* written by the launch */
} run_view;

static void view_name(const run_view *rv, char *buf, size_t len)
{
    if (rv->index < 0)
        snprintf(buf, len, "%s", rv->name);
    else if (strcmp(rv->name, "source") == 0)
        snprintf(buf, len, "source %d", rv->index);
    else
        snprintf(buf, len, "%s[%d]", rv->name, rv->index);
}

/* Describes one argument; EINVAL naming it and its stride when its extent,
 * (T - 1) * stride + width elements, overflows in elements or bytes or
 * runs past the end of the address space. */
static int add_view(attnres_plan *plan, run_view *rv, const char *name, int index, int output, const void *ptr,
                    int64_t T, int64_t stride, int64_t width, size_t es, const char *stride_name)
{
    rv->name = name;
    rv->index = index;
    rv->output = output;
    if (ar_view_make(&rv->v, ptr, T, stride, width, es) == 0)
        return ATTNRES_OK;
    char what[48];
    view_name(rv, what, sizeof what);
    return run_fail(plan, ATTNRES_EINVAL,
                    "%s %" PRId64 " of %s with T = %" PRId64 ": (T - 1) * stride + %" PRId64
                    " elements of %zu bytes overflow or run past the address space",
                    stride_name, stride, what, T, width, es);
}

/* Adds the views of the epilogue, which mix and phase 2 share: out_gain
 * read and normed written, where the problem has an epilogue. */
static int add_epilogue_views(attnres_plan *plan, run_view *views, int *count, int64_t T, const float *out_gain,
                              const void *normed, int64_t normed_stride)
{
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    int st = ATTNRES_OK;
    if (p->epilogue && !(st = add_view(plan, &views[(*count)++], "out_gain", -1, 0, out_gain, 1, p->d, p->d, 4,
                                       "stride")))
        st = add_view(plan, &views[(*count)++], "normed", -1, 1, normed, T, normed_stride ? normed_stride : p->d,
                      p->d, es, "normed_stride");
    return st;
}

/* Whether a and b may overlap: only mix's in-place form, out exactly
 * partial (each token's partial row is read before its out row is
 * written). */
static int may_alias(const attnres_plan *plan, const run_view *a, const run_view *b)
{
    if (plan->problem.op != ATTNRES_OP_MIX || !ar_views_same(&a->v, &b->v))
        return 0;
    return (strcmp(a->name, "out") == 0 && strcmp(b->name, "partial") == 0) ||
           (strcmp(a->name, "partial") == 0 && strcmp(b->name, "out") == 0);
}

static int overlap_fail(attnres_plan *plan, const run_view *a, const run_view *b)
{
    char an[48], bn[48];
    view_name(a, an, sizeof an);
    view_name(b, bn, sizeof bn);
    return run_fail(plan, ATTNRES_EINVAL, "%s and %s overlap: %s", an, bn,
                    plan->problem.op == ATTNRES_OP_MIX
                        ? "an output may share memory with no other argument but out with partial, exactly"
                        : "an output may share memory with no other argument");
}

/* Refuses every pair of views, one of them an output, that share a byte,
 * but those may_alias allows. */
static int check_overlaps(attnres_plan *plan, const run_view *views, int count)
{
    for (int i = 0; i < count; i++) {
        if (!views[i].output)
            continue;
        for (int j = 0; j < count; j++)
            if (j != i && (!views[j].output || j < i) && ar_views_overlap(&views[i].v, &views[j].v) &&
                !may_alias(plan, &views[i], &views[j]))
                return overlap_fail(plan, &views[i], &views[j]);
    }
    return ATTNRES_OK;
}

/* Refuses a run whose entry point does not match the plan's op. */
/* The checks every run entry starts with: a plan, T >= 0, and the plan's
 * own operation. The caller returns at once unless this is OK and T > 0. */
static int check_call(attnres_plan *plan, int64_t T, attnres_op want, const char *entry)
{
    if (!plan)
        return ATTNRES_EINVAL;
    if (T < 0)
        return run_fail(plan, ATTNRES_EINVAL, "T must be >= 0 (got %" PRId64 ")", T);
    if (plan->problem.op != want)
        return run_fail(plan, ATTNRES_EMISMATCH, "%s called on a plan for op %s (it runs op %s)", entry,
                        op_name(plan->problem.op), op_name(want));
    return ATTNRES_OK;
}

/* The n source views of mix and phase 1: present, aligned, strides >= d. */
static int check_sources(attnres_plan *plan, const void *const *sources, const int64_t *strides)
{
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    for (int i = 0; i < p->n; i++) {
        if (!sources[i])
            return run_fail(plan, ATTNRES_EINVAL, "source %d is NULL", i);
        if (misaligned(sources[i], es))
            return run_fail(plan, ATTNRES_EINVAL, "source %d is not aligned to its %zu-byte elements", i, es);
        if (strides && strides[i] && strides[i] < p->d)
            return run_fail(plan, ATTNRES_EMISMATCH, "source %d stride %" PRId64 " is less than d = %" PRId64, i,
                            strides[i], p->d);
    }
    return ATTNRES_OK;
}

/* The views of a mix: n sources, query, partial, out_gain, out, normed. */
static int check_mix_views(attnres_plan *plan, int64_t T, const attnres_mix_args *a)
{
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    run_view views[p->n + 5];
    int count = 0, st;
    for (int i = 0; i < p->n; i++) {
        const int64_t stride = a->source_strides && a->source_strides[i] ? a->source_strides[i] : p->d;
        if ((st = add_view(plan, &views[count++], "source", i, 0, a->sources[i], T, stride, p->d, es, "stride")))
            return st;
    }
    if ((st = add_view(plan, &views[count++], "query", -1, 0, a->query, 1, p->d, p->d, 4, "stride")))
        return st;
    if ((st = add_view(plan, &views[count++], "out", -1, 1, a->out, T, a->out_stride ? a->out_stride : p->d, p->d,
                       es, "out_stride")))
        return st;
    if (p->form == ATTNRES_FORM_ADDITIVE &&
        (st = add_view(plan, &views[count++], "partial", -1, 0, a->partial, T,
                       a->partial_stride ? a->partial_stride : p->d, p->d, es, "partial_stride")))
        return st;
    if ((st = add_epilogue_views(plan, views, &count, T, a->out_gain, a->normed, a->normed_stride)))
        return st;
    return check_overlaps(plan, views, count);
}

static int check_eps(attnres_plan *plan, const char *name, float eps)
{
    if (!(eps > 0.0f) || !(eps < 1e30f))
        return run_fail(plan, ATTNRES_EINVAL, "%s must be positive and finite (got %g)", name, (double)eps);
    return ATTNRES_OK;
}

/* Checks the epilogue's arguments, which mix and phase 2 share: normed
 * and out_gain given and aligned, out_eps positive and finite. */
static int check_epilogue_args(attnres_plan *plan, const void *normed, const float *out_gain, float out_eps)
{
    if (!plan->problem.epilogue)
        return ATTNRES_OK;
    const size_t es = attnres_dtype_size(plan->problem.dtype);
    if (!normed || !out_gain || misaligned(normed, es) || misaligned(out_gain, 4))
        return run_fail(plan, ATTNRES_EINVAL, "the epilogue needs aligned normed and out_gain");
    return check_eps(plan, "out_eps", out_eps);
}

int attnres_run_mix(attnres_plan *plan, int64_t T, const attnres_mix_args *a, void *stream)
{
    int st = check_call(plan, T, ATTNRES_OP_MIX, "attnres_run_mix");
    if (st != ATTNRES_OK || T == 0)
        return st;
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    attnres_mix_args own;
    if (a && !(a = adopt_args(plan, a, &own, AR_MIX_ARGS_SIZE_0_2, sizeof *a, mix_args_defaults,
                              "attnres_mix_args", "attnres_mix_args_init", &st)))
        return st;
    if (!a || !a->sources || !a->query || !a->out)
        return run_fail(plan, ATTNRES_EINVAL, "args, sources, query and out must not be NULL");
    if ((st = check_sources(plan, a->sources, a->source_strides)) != ATTNRES_OK)
        return st;
    if (misaligned(a->out, es) || misaligned(a->query, 4))
        return run_fail(plan, ATTNRES_EINVAL, "out or query is misaligned");
    if ((a->out_stride && a->out_stride < p->d) || (a->partial_stride && a->partial_stride < p->d) ||
        (a->normed_stride && a->normed_stride < p->d))
        return run_fail(plan, ATTNRES_EMISMATCH, "a row stride is less than d = %" PRId64, p->d);
    if (check_eps(plan, "eps", a->eps))
        return ATTNRES_EINVAL;
    if (p->form == ATTNRES_FORM_ADDITIVE && (!a->partial || misaligned(a->partial, es)))
        return run_fail(plan, ATTNRES_EINVAL, "the additive form needs an aligned partial");
    if ((st = check_epilogue_args(plan, a->normed, a->out_gain, a->out_eps)) != ATTNRES_OK)
        return st;
    if ((st = check_mix_views(plan, T, a)) != ATTNRES_OK)
        return st;
    const plan_bucket *b = pick_bucket(plan, T);
    const ar_op_args args = ar_op_mix(a);
    st = plan->dev->ops->launch(plan->dev, &b->kernel, p, T, &args, stream);
    if (st != ATTNRES_OK)
        return run_fail(plan, st, "launch of %s failed: %s", b->kernel.variant, attnres_device_errmsg(plan->dev));
    return ATTNRES_OK;
}

/* ---- Block AttnRes phases -------------------------------------------- */

/* Sites up to which phase 1's outputs are compared pair by pair; beyond,
 * by sorted address ranges, so that S = 4096 costs no 16 million pairs. */
#define PHASE1_PAIRWISE_SITES 64
_Static_assert(2 * ATTNRES_MAX_S <= 65536, "phase 1's outputs are sorted by uint16_t index");

/* Output v of phase 1 (o1[v] for v < S, else lse[v - S]) as a view, whose
 * extent check_phase1_views has checked already. */
static void phase1_output(const attnres_problem *p, int64_t T, const attnres_phase1_args *a, int v, run_view *rv)
{
    const int site = v < p->s ? v : v - p->s;
    const int64_t o1_stride = a->o1_stride ? a->o1_stride : p->d, lse_stride = a->lse_stride ? a->lse_stride : p->heads;
    rv->index = site;
    rv->output = 1;
    if (v < p->s) {
        rv->name = "o1";
        (void)ar_view_make(&rv->v, a->o1[site], T, o1_stride, p->d, attnres_dtype_size(p->dtype));
    } else {
        rv->name = "lse";
        (void)ar_view_make(&rv->v, a->lse[site], T, lse_stride, p->heads, 4);
    }
}

/* Heapsort's sift-down of order[r] within order[0, n), by start. */
static void sift_down(uint16_t *order, const uintptr_t *start, int r, int n)
{
    for (int c; (c = 2 * r + 1) < n; r = c) {
        if (c + 1 < n && start[order[c + 1]] > start[order[c]])
            c++;
        if (start[order[r]] >= start[order[c]])
            return;
        const uint16_t t = order[r];
        order[r] = order[c];
        order[c] = t;
    }
}

/* Sorts the outputs of phase 1 by first address (heapsort: no allocation)
 * and refuses the first two whose address ranges meet. */
static int phase1_outputs_by_range(attnres_plan *plan, int64_t T, const attnres_phase1_args *a)
{
    const int count = 2 * plan->problem.s; /* at most 2 * ATTNRES_MAX_S, which uint16_t holds */
    uint16_t order[count];
    uintptr_t start[count], end[count];
    for (int v = 0; v < count; v++) {
        run_view rv;
        phase1_output(&plan->problem, T, a, v, &rv);
        order[v] = (uint16_t)v;
        start[v] = rv.v.start;
        end[v] = rv.v.start + rv.v.extent;
    }
    for (int r = count / 2 - 1; r >= 0; r--)
        sift_down(order, start, r, count);
    for (int n = count - 1; n > 0; n--) {
        const uint16_t t = order[0];
        order[0] = order[n];
        order[n] = t;
        sift_down(order, start, 0, n);
    }
    int reach = order[0]; /* of the views so far, the one whose range ends last */
    for (int i = 1; i < count; i++) {
        const int v = order[i];
        if (start[v] < end[reach]) {
            run_view x, y;
            phase1_output(&plan->problem, T, a, reach, &x);
            phase1_output(&plan->problem, T, a, v, &y);
            return overlap_fail(plan, &x, &y);
        }
        if (end[v] > end[reach])
            reach = v;
    }
    return ATTNRES_OK;
}

/* The views of phase 1: n sources and the S queries read; S o1 and S lse
 * views written. */
static int check_phase1_views(attnres_plan *plan, int64_t T, const attnres_phase1_args *a)
{
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    const int pairwise = p->s <= PHASE1_PAIRWISE_SITES;
    run_view views[p->n + 1 + (pairwise ? 2 * p->s : 0)];
    int count = 0, st;
    for (int i = 0; i < p->n; i++) {
        const int64_t stride = a->source_strides && a->source_strides[i] ? a->source_strides[i] : p->d;
        if ((st = add_view(plan, &views[count++], "source", i, 0, a->sources[i], T, stride, p->d, es, "stride")))
            return st;
    }
    int64_t qwidth;
    if (__builtin_mul_overflow((int64_t)p->s, p->d, &qwidth) ||
        (st = add_view(plan, &views[count++], "queries", -1, 0, a->queries, 1, qwidth, qwidth, 4, "stride")))
        return st ? st : run_fail(plan, ATTNRES_EINVAL, "queries: S * d overflows");
    const int inputs = count;
    for (int j = 0; j < p->s; j++) {
        run_view o1, lse;
        if ((st = add_view(plan, &o1, "o1", j, 1, a->o1[j], T, a->o1_stride ? a->o1_stride : p->d, p->d, es,
                           "o1_stride")) ||
            (st = add_view(plan, &lse, "lse", j, 1, a->lse[j], T, a->lse_stride ? a->lse_stride : p->heads,
                           p->heads, 4, "lse_stride")))
            return st;
        for (int k = 0; k < inputs; k++) {
            if (ar_views_overlap(&o1.v, &views[k].v))
                return overlap_fail(plan, &o1, &views[k]);
            if (ar_views_overlap(&lse.v, &views[k].v))
                return overlap_fail(plan, &lse, &views[k]);
        }
        if (pairwise) {
            views[inputs + j] = o1;
            views[inputs + p->s + j] = lse;
        }
    }
    if (!pairwise)
        return phase1_outputs_by_range(plan, T, a);
    /* Inputs against outputs are done: only outputs against each other. */
    return check_overlaps(plan, views + inputs, 2 * p->s);
}

int attnres_run_phase1(attnres_plan *plan, int64_t T, const attnres_phase1_args *a, void *stream)
{
    int st = check_call(plan, T, ATTNRES_OP_PHASE1, "attnres_run_phase1");
    if (st != ATTNRES_OK || T == 0)
        return st;
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    attnres_phase1_args own;
    if (a && !(a = adopt_args(plan, a, &own, AR_PHASE1_ARGS_SIZE_0_2, sizeof *a, phase1_args_defaults,
                              "attnres_phase1_args", "attnres_phase1_args_init", &st)))
        return st;
    if (!a || !a->sources || !a->queries || !a->o1 || !a->lse)
        return run_fail(plan, ATTNRES_EINVAL, "args, sources, queries, o1 and lse must not be NULL");
    if ((st = check_sources(plan, a->sources, a->source_strides)) != ATTNRES_OK)
        return st;
    for (int j = 0; j < p->s; j++) {
        if (!a->o1[j] || !a->lse[j])
            return run_fail(plan, ATTNRES_EINVAL, "o1 or lse of site %d is NULL", j);
        if (misaligned(a->o1[j], es) || misaligned(a->lse[j], 4))
            return run_fail(plan, ATTNRES_EINVAL, "o1 or lse of site %d is misaligned", j);
    }
    if (misaligned(a->queries, 4))
        return run_fail(plan, ATTNRES_EINVAL, "queries is misaligned");
    if (a->o1_stride && a->o1_stride < p->d)
        return run_fail(plan, ATTNRES_EMISMATCH, "o1 stride %" PRId64 " is less than d = %" PRId64, a->o1_stride,
                        p->d);
    if (a->lse_stride && a->lse_stride < p->heads)
        return run_fail(plan, ATTNRES_EMISMATCH, "lse stride %" PRId64 " is less than H = %d", a->lse_stride,
                        p->heads);
    if (check_eps(plan, "eps", a->eps))
        return ATTNRES_EINVAL;
    if ((st = check_phase1_views(plan, T, a)) != ATTNRES_OK)
        return st;
    const plan_bucket *b = pick_bucket(plan, T);
    const ar_op_args args = ar_op_phase1(a);
    st = plan->dev->ops->launch(plan->dev, &b->kernel, p, T, &args, stream);
    if (st != ATTNRES_OK)
        return run_fail(plan, st, "launch of %s failed: %s", b->kernel.variant, attnres_device_errmsg(plan->dev));
    return ATTNRES_OK;
}

/* The views of phase 2: o1, lse, query, sublayer and out_gain read;
 * partial read (and written with the fused add); out and normed written. */
static int check_phase2_views(attnres_plan *plan, int64_t T, const attnres_phase2_args *a)
{
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    run_view views[8];
    int count = 0, st;
    if ((st = add_view(plan, &views[count++], "o1", -1, 0, a->o1, T, a->o1_stride ? a->o1_stride : p->d, p->d, es,
                       "o1_stride")) ||
        (st = add_view(plan, &views[count++], "lse", -1, 0, a->lse, T, a->lse_stride ? a->lse_stride : p->heads,
                       p->heads, 4, "lse_stride")) ||
        (st = add_view(plan, &views[count++], "partial", -1, p->fuse_add, a->partial, T,
                       a->partial_stride ? a->partial_stride : p->d, p->d, es, "partial_stride")) ||
        (st = add_view(plan, &views[count++], "query", -1, 0, a->query, 1, p->d, p->d, 4, "stride")) ||
        (st = add_view(plan, &views[count++], "out", -1, 1, a->out, T, a->out_stride ? a->out_stride : p->d, p->d,
                       es, "out_stride")))
        return st;
    if (p->fuse_add && (st = add_view(plan, &views[count++], "sublayer", -1, 0, a->sublayer, T,
                                      a->sublayer_stride ? a->sublayer_stride : p->d, p->d, es, "sublayer_stride")))
        return st;
    if ((st = add_epilogue_views(plan, views, &count, T, a->out_gain, a->normed, a->normed_stride)))
        return st;
    return check_overlaps(plan, views, count);
}

int attnres_run_phase2(attnres_plan *plan, int64_t T, const attnres_phase2_args *a, void *stream)
{
    int st = check_call(plan, T, ATTNRES_OP_PHASE2, "attnres_run_phase2");
    if (st != ATTNRES_OK || T == 0)
        return st;
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    attnres_phase2_args own;
    if (a && !(a = adopt_args(plan, a, &own, AR_PHASE2_ARGS_SIZE_0_2, sizeof *a, phase2_args_defaults,
                              "attnres_phase2_args", "attnres_phase2_args_init", &st)))
        return st;
    if (!a || !a->o1 || !a->lse || !a->partial || !a->query || !a->out)
        return run_fail(plan, ATTNRES_EINVAL, "args, o1, lse, partial, query and out must not be NULL");
    if (misaligned(a->o1, es) || misaligned(a->partial, es) || misaligned(a->out, es) || misaligned(a->lse, 4) ||
        misaligned(a->query, 4))
        return run_fail(plan, ATTNRES_EINVAL, "o1, lse, partial, query or out is misaligned");
    if ((a->o1_stride && a->o1_stride < p->d) || (a->partial_stride && a->partial_stride < p->d) ||
        (a->out_stride && a->out_stride < p->d) || (a->sublayer_stride && a->sublayer_stride < p->d) ||
        (a->normed_stride && a->normed_stride < p->d))
        return run_fail(plan, ATTNRES_EMISMATCH, "a row stride is less than d = %" PRId64, p->d);
    if (a->lse_stride && a->lse_stride < p->heads)
        return run_fail(plan, ATTNRES_EMISMATCH, "lse stride %" PRId64 " is less than H = %d", a->lse_stride,
                        p->heads);
    if (check_eps(plan, "eps", a->eps))
        return ATTNRES_EINVAL;
    if (p->fuse_add && (!a->sublayer || misaligned(a->sublayer, es)))
        return run_fail(plan, ATTNRES_EINVAL, "the fused add needs an aligned sublayer output");
    if ((st = check_epilogue_args(plan, a->normed, a->out_gain, a->out_eps)) != ATTNRES_OK)
        return st;
    if ((st = check_phase2_views(plan, T, a)) != ATTNRES_OK)
        return st;
    const plan_bucket *b = pick_bucket(plan, T);
    const ar_op_args args = ar_op_phase2(a);
    st = plan->dev->ops->launch(plan->dev, &b->kernel, p, T, &args, stream);
    if (st != ATTNRES_OK)
        return run_fail(plan, st, "launch of %s failed: %s", b->kernel.variant, attnres_device_errmsg(plan->dev));
    return ATTNRES_OK;
}

/* ---- the mix backward ------------------------------------------------ */

static void mix_backward_args_defaults(void *a) { attnres_mix_backward_args_init(a); }

int attnres_mix_backward_workspace_size(const attnres_plan *plan, int64_t T, size_t *bytes)
{
    if (!plan || !bytes)
        return ATTNRES_EINVAL;
    attnres_plan *mut = (attnres_plan *)plan; /* only its per-thread message changes */
    if (plan->problem.op != ATTNRES_OP_MIX_BACKWARD)
        return run_fail(mut, ATTNRES_EMISMATCH, "attnres_mix_backward_workspace_size called on a plan for op %s",
                        op_name(plan->problem.op));
    ar_backward_ws ws;
    if (T < 0 || ar_mix_backward_workspace(plan->problem.d, T, plan->problem.epilogue, &ws) != 0)
        return run_fail(mut, ATTNRES_EINVAL, "no workspace size for T = %" PRId64 " (negative, or beyond size_t)", T);
    *bytes = ws.bytes;
    return ATTNRES_OK;
}

/* Refuses, with the backwards' message, every pair of views, one of them a
 * gradient, that share a byte, but two source gradients that are the
 * very same view when accumulated; and the workspace overlapping any. */
static int check_gradient_overlaps(attnres_plan *plan, const run_view *views, int count, int accumulate,
                                   const void *workspace, size_t workspace_size)
{
    for (int i = 0; i < count; i++) {
        if (!views[i].output)
            continue;
        for (int j = 0; j < count; j++) {
            if (j == i || (views[j].output && j > i) || !ar_views_overlap(&views[i].v, &views[j].v))
                continue;
            /* Two source gradients of one tensor, added into it in turn. */
            if (accumulate && views[j].output && strcmp(views[i].name, "dsources") == 0 &&
                strcmp(views[j].name, "dsources") == 0 && ar_views_same(&views[i].v, &views[j].v))
                continue;
            char an[48], bn[48];
            view_name(&views[i], an, sizeof an);
            view_name(&views[j], bn, sizeof bn);
            return run_fail(plan, ATTNRES_EINVAL,
                            "%s and %s overlap: a gradient may share memory with no other argument but, with "
                            "ATTNRES_GRAD_ACCUMULATE, another source's gradient as the very same view",
                            an, bn);
        }
    }
    /* The workspace is written by the launch: it overlaps nothing either. */
    ar_view ws;
    if (ar_view_make(&ws, workspace, 1, 1, (int64_t)(workspace_size ? workspace_size : 1), 1) != 0)
        return run_fail(plan, ATTNRES_EINVAL, "the workspace of %zu bytes runs past the address space",
                        workspace_size);
    for (int j = 0; j < count; j++)
        if (ar_views_overlap(&ws, &views[j].v)) {
            char bn[48];
            view_name(&views[j], bn, sizeof bn);
            return run_fail(plan, ATTNRES_EINVAL, "the workspace and %s overlap", bn);
        }
    return ATTNRES_OK;
}

/* The views of a mix backward: n sources, query, dout (unless NULL with
 * the epilogue), partial's gradient, n source gradients, dquery, and the
 * epilogue's out, out_gain, dnormed and dout_gain. Outputs overlap nothing
 * but, when gradients are accumulated, each other as the very same view. */
static int check_mix_backward_views(attnres_plan *plan, int64_t T, const attnres_mix_backward_args *a)
{
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    const int additive = p->form == ATTNRES_FORM_ADDITIVE;
    run_view views[2 * p->n + 10];
    int count = 0, st;
    for (int i = 0; i < p->n; i++) {
        const int64_t stride = a->source_strides && a->source_strides[i] ? a->source_strides[i] : p->d;
        if ((st = add_view(plan, &views[count++], "source", i, 0, a->sources[i], T, stride, p->d, es, "stride")))
            return st;
    }
    if ((st = add_view(plan, &views[count++], "query", -1, 0, a->query, 1, p->d, p->d, 4, "stride")) ||
        (a->dout && (st = add_view(plan, &views[count++], "dout", -1, 0, a->dout, T,
                                   a->dout_stride ? a->dout_stride : p->d, p->d, es, "dout_stride"))))
        return st;
    if (p->epilogue &&
        ((st = add_view(plan, &views[count++], "out", -1, 0, a->out, T, a->out_stride ? a->out_stride : p->d, p->d,
                        es, "out_stride")) ||
         (st = add_view(plan, &views[count++], "out_gain", -1, 0, a->out_gain, 1, p->d, p->d, 4, "stride")) ||
         (st = add_view(plan, &views[count++], "dnormed", -1, 0, a->dnormed, T,
                        a->dnormed_stride ? a->dnormed_stride : p->d, p->d, es, "dnormed_stride")) ||
         (a->dout_gain &&
          (st = add_view(plan, &views[count++], "dout_gain", -1, 1, a->dout_gain, 1, p->d, p->d, 4, "stride")))))
        return st;
    const size_t des = (a->flags & ATTNRES_GRAD_DSOURCES_F32) ? 4 : es;
    for (int i = 0; i < p->n; i++) {
        const int64_t stride = a->dsource_strides && a->dsource_strides[i] ? a->dsource_strides[i] : p->d;
        if ((st = add_view(plan, &views[count++], "dsources", i, 1, a->dsources[i], T, stride, p->d, des,
                           "dsource stride")))
            return st;
    }
    if ((st = add_view(plan, &views[count++], "dquery", -1, 1, a->dquery, 1, p->d, p->d, 4, "stride")))
        return st;
    if (additive && (st = add_view(plan, &views[count++], "dpartial", -1, 1, a->dpartial, T,
                                   a->dpartial_stride ? a->dpartial_stride : p->d, p->d, es, "dpartial_stride")))
        return st;
    if (additive && a->dalpha && (st = add_view(plan, &views[count++], "dalpha", -1, 1, a->dalpha, 1, 1, 1, 4, "stride")))
        return st;
    return check_gradient_overlaps(plan, views, count, (a->flags & ATTNRES_GRAD_ACCUMULATE) != 0, a->workspace,
                                   a->workspace_size);
}

int attnres_run_mix_backward(attnres_plan *plan, int64_t T, const attnres_mix_backward_args *a, void *stream)
{
    int st = check_call(plan, T, ATTNRES_OP_MIX_BACKWARD, "attnres_run_mix_backward");
    if (st != ATTNRES_OK)
        return st;
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    const int additive = p->form == ATTNRES_FORM_ADDITIVE;
    attnres_mix_backward_args own;
    /* Callers from before the epilogue's fields end their struct at out. */
    if (a && !(a = adopt_args(plan, a, &own, offsetof(attnres_mix_backward_args, out), sizeof *a,
                              mix_backward_args_defaults,
                              "attnres_mix_backward_args", "attnres_mix_backward_args_init", &st)))
        return st;
    if (!a || !a->dquery || misaligned(a->dquery, 4) || (a->dalpha && misaligned(a->dalpha, 4)) ||
        (p->epilogue && a->dout_gain && misaligned(a->dout_gain, 4)))
        return run_fail(plan, ATTNRES_EINVAL,
                        "args and an aligned dquery must not be NULL (and dalpha and dout_gain aligned)");
    const unsigned known = ATTNRES_GRAD_ACCUMULATE | ATTNRES_GRAD_DSOURCES_F32;
    if (a->flags & ~known)
        return run_fail(plan, ATTNRES_EINVAL,
                        "unknown flags 0x%x (only ATTNRES_GRAD_ACCUMULATE and ATTNRES_GRAD_DSOURCES_F32)",
                        a->flags & ~known);
    /* The source gradients' element size: fp32 with the flag. */
    const size_t des = (a->flags & ATTNRES_GRAD_DSOURCES_F32) ? 4 : es;
    if (T > 0) {
        if (!a->sources || !a->query || (!a->dout && !p->epilogue) || !a->dsources)
            return run_fail(plan, ATTNRES_EINVAL,
                            "sources, query, dout (unless the epilogue's dnormed stands in) and dsources must not "
                            "be NULL");
        if (p->epilogue) {
            if (!a->out || !a->dnormed || !a->out_gain || misaligned(a->out, es) || misaligned(a->dnormed, es) ||
                misaligned(a->out_gain, 4) || (a->dout_gain && misaligned(a->dout_gain, 4)))
                return run_fail(plan, ATTNRES_EINVAL,
                                "the epilogue's backward needs aligned out, dnormed and out_gain (and dout_gain "
                                "aligned when given)");
            if ((a->out_stride && a->out_stride < p->d) || (a->dnormed_stride && a->dnormed_stride < p->d))
                return run_fail(plan, ATTNRES_EMISMATCH, "out_stride or dnormed_stride is less than d = %" PRId64,
                                p->d);
            if (check_eps(plan, "out_eps", a->out_eps))
                return ATTNRES_EINVAL;
        }
        if ((st = check_sources(plan, a->sources, a->source_strides)) != ATTNRES_OK)
            return st;
        for (int i = 0; i < p->n; i++) {
            if (!a->dsources[i] || misaligned(a->dsources[i], des))
                return run_fail(plan, ATTNRES_EINVAL, "dsources[%d] is NULL or not aligned to %zu-byte elements", i,
                                des);
            if (a->dsource_strides && a->dsource_strides[i] && a->dsource_strides[i] < p->d)
                return run_fail(plan, ATTNRES_EMISMATCH,
                                "dsources[%d] stride %" PRId64 " is less than d = %" PRId64, i,
                                a->dsource_strides[i], p->d);
        }
        if ((a->dout && misaligned(a->dout, es)) || misaligned(a->query, 4))
            return run_fail(plan, ATTNRES_EINVAL, "dout or query is misaligned");
        if ((a->dout_stride && a->dout_stride < p->d) || (a->dpartial_stride && a->dpartial_stride < p->d))
            return run_fail(plan, ATTNRES_EMISMATCH, "a row stride is less than d = %" PRId64, p->d);
        if (check_eps(plan, "eps", a->eps))
            return ATTNRES_EINVAL;
        if (additive && (!a->dpartial || misaligned(a->dpartial, es)))
            return run_fail(plan, ATTNRES_EINVAL, "the additive form needs an aligned dpartial");
        ar_backward_ws ws;
        if (ar_mix_backward_workspace(p->d, T, p->epilogue, &ws) != 0)
            return run_fail(plan, ATTNRES_EINVAL, "T = %" PRId64 " needs a workspace beyond size_t", T);
        const size_t need = ws.bytes;
        if (!a->workspace || a->workspace_size < need || misaligned(a->workspace, 64))
            return run_fail(plan, ATTNRES_EINVAL,
                            "the workspace must be 64-byte aligned and hold %zu bytes for T = %" PRId64
                            " (attnres_mix_backward_workspace_size); it %s",
                            need, T, !a->workspace ? "is NULL" : a->workspace_size < need ? "is smaller" : "is not aligned");
        if ((st = check_mix_backward_views(plan, T, a)) != ATTNRES_OK)
            return st;
    }
    const plan_bucket *b = pick_bucket(plan, T > 0 ? T : 1);
    const ar_op_args args = ar_op_mix_backward(a);
    st = plan->dev->ops->launch(plan->dev, &b->kernel, p, T, &args, stream);
    if (st != ATTNRES_OK)
        return run_fail(plan, st, "launch of %s failed: %s", b->kernel.variant, attnres_device_errmsg(plan->dev));
    return ATTNRES_OK;
}

/* ---- the phase backwards --------------------------------------------- */

/* A backward's workspace for T tokens: the rows each token group sums its
 * query gradients into (d per site for phase 1), and the epilogue's. */
static int backward_workspace(const attnres_problem *p, int64_t T, ar_backward_ws *ws)
{
    const int64_t row = p->op == ATTNRES_OP_PHASE1_BACKWARD ? p->d * p->s : p->d;
    return ar_mix_backward_workspace(row, T, p->op != ATTNRES_OP_PHASE1_BACKWARD && p->epilogue, ws);
}

int attnres_plan_workspace_size(const attnres_plan *plan, int64_t T, size_t *bytes)
{
    if (!plan || !bytes)
        return ATTNRES_EINVAL;
    attnres_plan *mut = (attnres_plan *)plan; /* only its per-thread message changes */
    ar_backward_ws ws = {0};
    if (T < 0 || (ar_op_forward(plan->problem.op) != plan->problem.op && backward_workspace(&plan->problem, T, &ws)))
        return run_fail(mut, ATTNRES_EINVAL, "no workspace size for T = %" PRId64 " (negative, or beyond size_t)", T);
    *bytes = ws.bytes;
    return ATTNRES_OK;
}

/* The workspace a backward run was given: aligned, and large enough. */
static int check_workspace(attnres_plan *plan, int64_t T, const void *workspace, size_t size)
{
    ar_backward_ws ws;
    if (backward_workspace(&plan->problem, T, &ws) != 0)
        return run_fail(plan, ATTNRES_EINVAL, "T = %" PRId64 " needs a workspace beyond size_t", T);
    if (!workspace || size < ws.bytes || misaligned(workspace, 64))
        return run_fail(plan, ATTNRES_EINVAL,
                        "the workspace must be 64-byte aligned and hold %zu bytes for T = %" PRId64
                        " (attnres_plan_workspace_size); it %s",
                        ws.bytes, T, !workspace ? "is NULL" : size < ws.bytes ? "is smaller" : "is not aligned");
    return ATTNRES_OK;
}

/* A [T, d] row view of the storage dtype that a run needs: present,
 * aligned, with a stride of 0 (d) or at least d; then described. */
static int row_view(attnres_plan *plan, run_view *rv, const char *name, int index, int output, const void *ptr,
                    int64_t T, int64_t stride, int64_t width, size_t es)
{
    const int bad_ptr = !ptr || misaligned(ptr, es), bad_stride = stride && stride < width;
    if (bad_ptr || bad_stride) { /* the name is formatted only for the message, off the run's path */
        char what[48];
        rv->name = name;
        rv->index = index;
        view_name(rv, what, sizeof what);
        if (bad_ptr)
            return run_fail(plan, ATTNRES_EINVAL, "%s is NULL or not aligned to its %zu-byte elements", what, es);
        return run_fail(plan, ATTNRES_EMISMATCH, "the stride %" PRId64 " of %s is less than its %" PRId64
                        " elements", stride, what, width);
    }
    return add_view(plan, rv, name, index, output, ptr, T, stride ? stride : width, width, es, "stride");
}

static void phase1_backward_args_defaults(void *a) { attnres_phase1_backward_args_init(a); }
static void phase2_backward_args_defaults(void *a) { attnres_phase2_backward_args_init(a); }

/* The flags a backward takes: both for phase 1, accumulation for phase 2. */
static int check_flags(attnres_plan *plan, unsigned flags, unsigned known)
{
    if (flags & ~known)
        return run_fail(plan, ATTNRES_EINVAL, "unknown flags 0x%x (%s takes %s)", flags & ~known,
                        op_name(plan->problem.op),
                        known & ATTNRES_GRAD_DSOURCES_F32 ? "ATTNRES_GRAD_ACCUMULATE and ATTNRES_GRAD_DSOURCES_F32"
                                                          : "ATTNRES_GRAD_ACCUMULATE only");
    return ATTNRES_OK;
}

static int launch_backward(attnres_plan *plan, int64_t T, const ar_op_args *args, void *stream)
{
    const plan_bucket *b = pick_bucket(plan, T > 0 ? T : 1);
    int st = plan->dev->ops->launch(plan->dev, &b->kernel, &plan->problem, T, args, stream);
    if (st != ATTNRES_OK)
        return run_fail(plan, st, "launch of %s failed: %s", b->kernel.variant, attnres_device_errmsg(plan->dev));
    return ATTNRES_OK;
}

int attnres_run_phase1_backward(attnres_plan *plan, int64_t T, const attnres_phase1_backward_args *a, void *stream)
{
    int st = check_call(plan, T, ATTNRES_OP_PHASE1_BACKWARD, "attnres_run_phase1_backward");
    if (st != ATTNRES_OK)
        return st;
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    attnres_phase1_backward_args own;
    if (a && !(a = adopt_args(plan, a, &own, sizeof *a, sizeof *a, phase1_backward_args_defaults,
                              "attnres_phase1_backward_args", "attnres_phase1_backward_args_init", &st)))
        return st;
    if (!a || !a->dqueries || misaligned(a->dqueries, 4))
        return run_fail(plan, ATTNRES_EINVAL, "args and an aligned dqueries must not be NULL");
    if ((st = check_flags(plan, a->flags, ATTNRES_GRAD_ACCUMULATE | ATTNRES_GRAD_DSOURCES_F32)))
        return st;
    if (T > 0) {
        if (!a->sources || !a->queries || !a->do1 || !a->dsources || misaligned(a->queries, 4))
            return run_fail(plan, ATTNRES_EINVAL, "sources, an aligned queries, do1 and dsources must not be NULL");
        if (check_eps(plan, "eps", a->eps))
            return ATTNRES_EINVAL;
        if ((st = check_workspace(plan, T, a->workspace, a->workspace_size)) ||
            (st = check_sources(plan, a->sources, a->source_strides)))
            return st;
        const size_t des = (a->flags & ATTNRES_GRAD_DSOURCES_F32) ? 4 : es;
        run_view views[2 * p->n + 2 * p->s + 2];
        int count = 0;
        for (int i = 0; i < p->n && !st; i++)
            st = add_view(plan, &views[count++], "source", i, 0, a->sources[i], T,
                          a->source_strides && a->source_strides[i] ? a->source_strides[i] : p->d, p->d, es,
                          "stride");
        if (!st)
            st = add_view(plan, &views[count++], "queries", -1, 0, a->queries, p->s, p->d, p->d, 4, "stride");
        for (int j = 0; j < p->s && !st; j++) {
            st = row_view(plan, &views[count++], "do1", j, 0, a->do1[j], T, a->do1_stride, p->d, es);
            if (!st && a->dlse && a->dlse[j])
                st = row_view(plan, &views[count++], "dlse", j, 0, a->dlse[j], T, a->dlse_stride, p->heads, 4);
        }
        for (int i = 0; i < p->n && !st; i++)
            st = row_view(plan, &views[count++], "dsources", i, 1, a->dsources[i], T,
                          a->dsource_strides ? a->dsource_strides[i] : 0, p->d, des);
        if (!st)
            st = add_view(plan, &views[count++], "dqueries", -1, 1, a->dqueries, p->s, p->d, p->d, 4, "stride");
        if (st || (st = check_gradient_overlaps(plan, views, count, (a->flags & ATTNRES_GRAD_ACCUMULATE) != 0,
                                                a->workspace, a->workspace_size)))
            return st;
    }
    const ar_op_args args = ar_op_phase1_backward(a);
    return launch_backward(plan, T, &args, stream);
}

int attnres_run_phase2_backward(attnres_plan *plan, int64_t T, const attnres_phase2_backward_args *a, void *stream)
{
    int st = check_call(plan, T, ATTNRES_OP_PHASE2_BACKWARD, "attnres_run_phase2_backward");
    if (st != ATTNRES_OK)
        return st;
    const attnres_problem *p = &plan->problem;
    const size_t es = attnres_dtype_size(p->dtype);
    const int epi = p->epilogue != 0;
    attnres_phase2_backward_args own;
    if (a && !(a = adopt_args(plan, a, &own, sizeof *a, sizeof *a, phase2_backward_args_defaults,
                              "attnres_phase2_backward_args", "attnres_phase2_backward_args_init", &st)))
        return st;
    if (!a || !a->dquery || misaligned(a->dquery, 4) || (epi && a->dout_gain && misaligned(a->dout_gain, 4)))
        return run_fail(plan, ATTNRES_EINVAL, "args and an aligned dquery must not be NULL (and dout_gain aligned)");
    if ((st = check_flags(plan, a->flags, ATTNRES_GRAD_ACCUMULATE)))
        return st;
    if (T > 0) {
        if (!a->query || misaligned(a->query, 4) || (!a->dout && !epi))
            return run_fail(plan, ATTNRES_EINVAL,
                            "an aligned query and dout (unless the epilogue's dnormed stands in) must not be NULL");
        if (check_eps(plan, "eps", a->eps) || (epi && check_eps(plan, "out_eps", a->out_eps)))
            return ATTNRES_EINVAL;
        if ((st = check_workspace(plan, T, a->workspace, a->workspace_size)))
            return st;
        run_view views[13]; /* every argument of the largest form */
        int count = 0;
        if ((st = row_view(plan, &views[count++], "o1", -1, 0, a->o1, T, a->o1_stride, p->d, es)) ||
            (st = row_view(plan, &views[count++], "lse", -1, 0, a->lse, T, a->lse_stride, p->heads, 4)) ||
            (st = row_view(plan, &views[count++], "partial", -1, 0, a->partial, T, a->partial_stride, p->d, es)) ||
            (st = add_view(plan, &views[count++], "query", -1, 0, a->query, 1, p->d, p->d, 4, "stride")) ||
            (a->dout && (st = row_view(plan, &views[count++], "dout", -1, 0, a->dout, T, a->dout_stride, p->d, es))) ||
            (st = row_view(plan, &views[count++], "do1", -1, 1, a->do1, T, a->do1_stride, p->d, es)) ||
            (st = row_view(plan, &views[count++], "dlse", -1, 1, a->dlse, T, a->dlse_stride, p->heads, 4)) ||
            (st = row_view(plan, &views[count++], "dpartial", -1, 1, a->dpartial, T, a->dpartial_stride, p->d, es)) ||
            (st = add_view(plan, &views[count++], "dquery", -1, 1, a->dquery, 1, p->d, p->d, 4, "stride")))
            return st;
        if (p->fuse_add && a->dsublayer &&
            (st = row_view(plan, &views[count++], "dsublayer", -1, 1, a->dsublayer, T, a->dsublayer_stride, p->d, es)))
            return st;
        if (epi && ((st = row_view(plan, &views[count++], "out_gain", -1, 0, a->out_gain, 1, 0, p->d, 4)) ||
                    (st = row_view(plan, &views[count++], "dnormed", -1, 0, a->dnormed, T, a->dnormed_stride, p->d,
                                   es)) ||
                    (a->dout_gain &&
                     (st = add_view(plan, &views[count++], "dout_gain", -1, 1, a->dout_gain, 1, p->d, p->d, 4,
                                    "stride")))))
            return st;
        if ((st = check_gradient_overlaps(plan, views, count, 0, a->workspace, a->workspace_size)))
            return st;
    }
    const ar_op_args args = ar_op_phase2_backward(a);
    return launch_backward(plan, T, &args, stream);
}
