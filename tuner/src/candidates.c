/*
 * candidates.c - the candidates of a tuning run: templates of the device's
 * backend, each variant's source emitted and recorded once, and the compile
 * pool that turns sources into binaries stored by build key.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tuner_base.h"
#include "attnres-impl.h" /* sha256; NVRTC's resource report where CUDA is built */
#include "tune_session.h"

/* ---- templates and candidates ---------------------------------------- */

int artuner_load_templates(tuner *t)
{
    const char *dir = artuner_template_dir();
    char **names;
    size_t count;
    if (argen_list_templates(dir, &names, &count) || count == 0) {
        artuner_error("tune", "no templates found in %s", dir);
        return -1;
    }
    t->templates = calloc(count, sizeof *t->templates);
    t->variants = calloc(count, sizeof *t->variants);
    t->nvariants = calloc(count, sizeof *t->nvariants);
    if (!t->templates || !t->variants || !t->nvariants) {
        artuner_error("tune", "out of memory");
        argen_names_free(names, count);
        return -1;
    }
    for (size_t i = 0; i < count; i++) {
        if (strncmp(names[i], t->dev->backend, strlen(t->dev->backend)) != 0 ||
            names[i][strlen(t->dev->backend)] != '/')
            continue;
        char msg[2048];
        argen *g;
        if (argen_open(dir, names[i], &g, msg, sizeof msg)) {
            artuner_error("tune", "%s", msg);
            argen_names_free(names, count);
            return -1;
        }
        t->templates[t->ntemplates] = g;
        /* Every problem of the run asks which variants apply: the
         * enumeration itself is the same for all. */
        if (argen_enumerate(g, &t->variants[t->ntemplates], &t->nvariants[t->ntemplates])) {
            artuner_error("tune", "%s", argen_errmsg(g));
            argen_close(g);
            t->templates[t->ntemplates] = NULL;
            argen_names_free(names, count);
            return -1;
        }
        t->ntemplates++;
    }
    argen_names_free(names, count);
    if (t->ntemplates == 0) {
        artuner_error("tune", "no %s templates in %s", t->dev->backend, dir);
        return -1;
    }
    return 0;
}

/* Hash over the text of every template the run uses, for the run record. */
void artuner_templates_hash(tuner *t, char out[65])
{
    ar_sha256 s;
    ar_sha256_init(&s);
    for (size_t i = 0; i < t->ntemplates; i++)
        ar_sha256_update(&s, argen_name(t->templates[i]), strlen(argen_name(t->templates[i])));
    for (size_t i = 0; i < t->nsources; i++)
        ar_sha256_update(&s, t->sources[i]->hash, 64);
    ar_sha256_hex(&s, out);
}

static source_entry *find_source(tuner *t, const char *id, const char *spec)
{
    for (size_t i = 0; i < t->nsources; i++)
        if (strcmp(t->sources[i]->id, id) == 0 && strcmp(t->sources[i]->spec, spec) == 0)
            return t->sources[i];
    return NULL;
}

/* Emits (once per specialization, argen_specialize) and records the
 * candidate for variant `id` of template g. */
source_entry *artuner_source(tuner *t, argen *g, const char *id, const char *spec)
{
    source_entry *e = find_source(t, id, spec);
    if (e)
        return e;
    source_entry **grown = realloc(t->sources, (t->nsources + 1) * sizeof *grown);
    if (!grown)
        return NULL;
    t->sources = grown;
    e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    t->sources[t->nsources++] = e; /* owned by the tuner from here on */
    e->spec = strdup(spec);
    if (!e->spec || argen_emit_for(g, id, spec, &e->source, &e->kernel, &e->json)) {
        artuner_error("tune", "%s", e->spec ? argen_errmsg(g) : "out of memory");
        return NULL;
    }
    e->id = strdup(id);
    e->template_name = strdup(argen_name(g));
    ar_sha256_string(e->source, e->hash);
    ar_build_key(t->dev, e->hash, e->build_key);
    ardb_candidate c = {.template_name = e->template_name, .variant = id, .params_json = e->json,
                        .source_hash = e->hash, .source = e->source, .kernel_name = e->kernel,
                        .backend = t->dev->backend};
    if (ardb_candidate_upsert(t->db, &c, &e->candidate_id) != ARDB_DONE) {
        artuner_error("tune", "recording candidate %s: %s", id, ardb_errmsg(t->db));
        return NULL;
    }
    void *blob;
    size_t size;
    if (ardb_binary_get(t->db, e->build_key, &blob, &size) == ARDB_DONE) {
        e->have_binary = 1;
        free(blob);
    }
    return e;
}

/* ---- parallel compilation -------------------------------------------- */

typedef struct compile_pool {
    tuner *t;
    source_entry **todo;
    size_t count, next;
    pthread_mutex_t mu;    /* guards next */
    pthread_mutex_t store; /* one worker at a time uses the database */
} compile_pool;

/* The kernel cache (binary_cache.h) holds what the runtime loaded or the
 * tuner compiled, by build key, for every database of the machine. Only
 * sealed binaries (the CPU's) are taken from it: the seal proves the bytes
 * are what a compiler wrote, and a CPU build has no resource report to
 * lose. A GPU build's report (registers, spills) exists only when it is
 * compiled, so GPU variants are always compiled. */
static int kernel_cache_usable(const tuner *t) { return strcmp(t->dev->backend, "cpu") == 0; }

/* Stores e's fresh binary (one short transaction) and frees it. A variant
 * that the GPU compiler reports as spilling is pruned, and its binary still
 * stored, so that a resumed run does not compile it again. */
static void store_binary(tuner *t, source_entry *e)
{
    /* GPU compilers report registers, spills and shared memory, for each
     * entry of the module (the backwards' _epi and _sum too): the most of
     * them is recorded. A variant that spills or needs a stack frame in any
     * entry is pruned before any timing: local memory traffic defeats a
     * memory-bound kernel. Only a build with the
     * CUDA backend has such a compiler. */
#ifdef ATTNRES_HAVE_CUDA
    ar_resources res;
    if (strcmp(t->dev->backend, "cuda") == 0 && e->compile_log &&
        ar_nvrtc_parse_module_resources(e->compile_log, &res) == 0) {
        snprintf(e->resources, sizeof e->resources, "%s", res.json);
        e->pruned = res.spill_stores > 0 || res.spill_loads > 0 || res.stack > 0;
    }
#endif
    ardb_binary b = {.build_key = e->build_key, .candidate_id = e->candidate_id, .compiler = t->dev->compiler,
                     .options = t->dev->options, .target = t->dev->target, .blob = e->blob,
                     .size = e->blob_size, .resources_json = e->resources[0] ? e->resources : NULL};
    if (ardb_binary_put(t->db, &b) == ARDB_DONE)
        e->have_binary = 1;
    else {
        artuner_error("tune", "storing the binary of %s: %s", e->id, ardb_errmsg(t->db));
        t->unrecorded++;
    }
    /* Into the kernel cache too, where another database's run (or this
     * one's, killed before it measured) finds it (from_kernel_cache). */
    char path[4200];
    if (kernel_cache_usable(t) && ar_cache_path(e->build_key, "", path, sizeof path) == 0)
        ar_cache_store(path, e->blob, e->blob_size); /* best effort: a miss costs a compile */
    free(e->blob);
    e->blob = NULL;
}

/* Takes e's binary from the kernel cache and stores it in the database;
 * 0 when it was there, intact. */
static int from_kernel_cache(tuner *t, source_entry *e)
{
    char path[4200];
    if (!kernel_cache_usable(t) || ar_cache_path(e->build_key, "", path, sizeof path) != 0 ||
        ar_read_file(path, &e->blob, &e->blob_size) != 0)
        return -1;
    if (ar_blob_check(e->blob, e->blob_size) != 0) {
        free(e->blob);
        e->blob = NULL;
        return -1;
    }
    store_binary(t, e);
    return e->have_binary ? 0 : -1;
}

static void *compile_worker(void *arg)
{
    compile_pool *cp = arg;
    for (;;) {
        pthread_mutex_lock(&cp->mu);
        size_t i = cp->next++;
        pthread_mutex_unlock(&cp->mu);
        if (i >= cp->count)
            return NULL;
        source_entry *e = cp->todo[i];
        int rc = cp->t->dev->ops->compile(cp->t->dev, e->source, e->kernel, &e->blob, &e->blob_size,
                                          &e->compile_log);
        if (rc != ATTNRES_OK) {
            e->compile_failed = 1;
            continue;
        }
        /* Each binary is stored as soon as it is built: a run killed in
         * the middle of a batch keeps what it compiled, so that a job killed
         * more often than one batch takes still makes progress. The
         * database connection is shared, so workers take turns. */
        pthread_mutex_lock(&cp->store);
        store_binary(cp->t, e);
        pthread_mutex_unlock(&cp->store);
    }
}

/* Runs the compile pool over todo[0..count). */
static void compile_pool_run(tuner *t, source_entry **todo, size_t count)
{
    compile_pool cp = {t, todo, count, 0, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
    int jobs = t->opt.jobs < (int)count ? t->opt.jobs : (int)count;
    pthread_t th[256];
    int started = 0;
    for (int i = 0; i < jobs; i++)
        if (pthread_create(&th[i], NULL, compile_worker, &cp) == 0)
            started++;
    if (started == 0)
        compile_worker(&cp);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
}

/* e has the build key of a variant artuner_compile_missing just handled: it takes
 * that variant's outcome (the binary is stored by build key already). */
static void share_outcome(tuner *t, source_entry *e)
{
    for (size_t i = 0; i < t->nsources; i++) {
        source_entry *o = t->sources[i];
        if (o == e || strcmp(o->build_key, e->build_key) != 0 || (!o->have_binary && !o->compile_failed))
            continue;
        e->have_binary = o->have_binary;
        e->compile_failed = o->compile_failed;
        e->pruned = o->pruned;
        snprintf(e->resources, sizeof e->resources, "%s", o->resources);
        if (o->compile_log && !e->compile_log)
            e->compile_log = strdup(o->compile_log);
        return;
    }
}

/* Compiles every source that has no binary yet and is not in the kernel
 * cache, jobs at a time, storing each binary as it is built. */
void artuner_compile_missing(tuner *t, source_entry **todo, size_t count)
{
    if (count == 0)
        return;
    double t0 = artuner_now_s();
    /* Variants with one source (CPU variants that differ only in their
     * thread count) share one build key: the first is compiled, the others
     * take its outcome afterwards. What the kernel cache holds is not
     * compiled again. The rest keeps its order. */
    source_entry **same = malloc(count * sizeof *same);
    char *dup = calloc(count, 1);
    size_t cached = 0, left = 0, nsame = 0;
    for (size_t i = 0; same && dup && i < count; i++)
        for (size_t j = 0; j < i && !dup[i]; j++)
            dup[i] = strcmp(todo[j]->build_key, todo[i]->build_key) == 0;
    for (size_t i = 0; i < count; i++) {
        if (same && dup && dup[i])
            same[nsame++] = todo[i];
        else if (from_kernel_cache(t, todo[i]) == 0)
            cached++;
        else
            todo[left++] = todo[i];
    }
    free(dup);
    if (left)
        compile_pool_run(t, todo, left);
    for (size_t i = 0; i < nsame; i++)
        share_outcome(t, same[i]);
    free(same);
    size_t failed = 0;
    for (size_t i = 0; i < left; i++)
        failed += todo[i]->compile_failed;
    tune_stages_add(&t->stages, STAGE_COMPILE, artuner_now_s() - t0, left);
    if (cached)
        artuner_log(t, "%zu variant(s) found in the kernel cache", cached);
    if (left)
        artuner_log(t, "compiled %zu variant(s) in %.1f s with %d job(s)%s", left, artuner_now_s() - t0,
                 t->opt.jobs < (int)left ? t->opt.jobs : (int)left,
                 failed ? " (some failed, recorded as compile_failed)" : "");
    if (nsame)
        artuner_log(t, "%zu variant(s) share the source of one compiled or found above", nsame);
}
