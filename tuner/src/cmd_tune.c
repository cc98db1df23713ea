/*
 * cmd_tune.c - `attnres tune`: exhaustive tuning of a problem set on one
 * device, every candidate verified, timed and recorded.
 *
 * Order of work: measure the device's roofline; for each problem, enumerate
 * the applicable variants of every template of the backend; reuse any
 * measurement the database already holds for the same candidate, problem,
 * device and build key; compile the rest in parallel; verify each against
 * the fp64 reference on poisoned outputs; time it; record every status; and
 * record the winner. One broken variant never ends the run.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "argen.h"
#include "ardb.h"
#include "cli.h"
#include "device.h"
#include "isolate.h"
#include "measure.h"
#include "problems.h"
#include "revalidate.h"
#include "sha256.h"

static const char tune_usage[] =
    "usage: attnres tune [--device cpu|cuda:N] [--db FILE] [--preset NAME | --problems FILE]\n"
    "                    [--strategy halving|exhaustive|random] [--budget N | --budget SECONDSs]\n"
    "                    [--seed S] [--shard I/N] [--jobs N] [--time-limit SECONDS]\n"
    "                    [--no-isolate] [--quiet]\n"
    "       attnres tune --revalidate [--device cpu|cuda:N] [--db FILE] [--quiet]\n"
    "\n"
    "  Strategies: halving (default) times every candidate cheaply, then the best\n"
    "  quarter (at least 3, at most --budget N) fully; exhaustive times all fully;\n"
    "  random times a sample of --budget N (default 8) chosen with --seed. The three\n"
    "  best are then re-timed interleaved; candidates within the noise of the best\n"
    "  form an equivalent set, and the one with the fewest resources wins, so the\n"
    "  same machine picks the same winner twice. --budget 30s stops measuring new\n"
    "  candidates of a problem after 30 seconds. --shard I/N takes every N-th\n"
    "  candidate starting at I (0-based), for tuning in parallel and merging\n"
    "  databases with `attnres db merge`. On the CPU each candidate runs in its own\n"
    "  process, so one that crashes or hangs (past --time-limit, default 60 s) is\n"
    "  recorded as launch_failed or timeout and the run goes on.\n"
    "  --revalidate re-measures only the stored winners of the device (fast) and\n"
    "  records them as a run that `attnres db regress` can compare.\n"
    "\n"
    "  Tunes every problem of a preset (ci, default, k3, mhar-8b, delta-small; default:\n"
    "  default) or a problems file (see docs/problems.md) on the device (default: the\n"
    "  best present), recording every candidate and the winners in FILE (default\n"
    "  attnres.db, created if missing). A second run over the same problems reuses\n"
    "  every measurement whose candidate source, compiler and device are unchanged.\n";

typedef enum strategy {
    STRATEGY_HALVING,    /* screen all cheaply, measure the best fully */
    STRATEGY_EXHAUSTIVE, /* measure every candidate fully */
    STRATEGY_RANDOM      /* measure a deterministic random sample fully */
} strategy;

typedef struct tune_opts {
    const char *device, *db, *preset, *problems;
    int jobs, quiet, isolate, revalidate;
    strategy strategy;
    int64_t budget_candidates; /* 0: no limit */
    double budget_seconds;     /* per problem; 0: no limit */
    double time_limit_s;       /* per candidate */
    uint64_t seed;
    int shard_index, shard_count;
} tune_opts;

/* One variant's source, emitted once per run and shared by its problems. */
typedef struct source_entry {
    char *id, *source, *kernel, *json, *template_name;
    char hash[65], build_key[65];
    int64_t candidate_id;
    int have_binary;    /* in the database */
    int compile_failed;
    char *compile_log;
    void *blob;         /* freshly compiled, to store */
    size_t blob_size;
} source_entry;

typedef struct tuner {
    tune_opts opt;
    attnres_device *dev;
    ardb *db;
    int64_t device_id, run_id;
    double copy_gbps, launch_us;
    measure_policy policy;
    argen **templates;
    size_t ntemplates;
    source_entry **sources; /* stable pointers: candidates keep them */
    size_t nsources;
    size_t reused, measured, failed; /* candidate counts over the run */
} tuner;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void log_line(const tuner *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void log_line(const tuner *t, const char *fmt, ...)
{
    if (t->opt.quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* On a terminal, one line rewritten in place: counts and an ETA for the
 * problem at hand. Plain logs (files, CI) get only the per-problem lines. */
static void progress(const tuner *t, const char *desc, size_t done, size_t total, double started)
{
    if (t->opt.quiet || !isatty(2))
        return;
    double spent = now_s() - started;
    double eta = done ? spent / (double)done * (double)(total - done) : 0;
    fprintf(stderr, "\r\033[K  %s: %zu/%zu candidates, %.0f s, about %.0f s left", desc, done, total, spent, eta);
    if (done == total)
        fprintf(stderr, "\r\033[K");
}

static int parse(int argc, char **argv, tune_opts *o)
{
    memset(o, 0, sizeof *o);
    o->db = "attnres.db";
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o->jobs = cores > 0 ? (int)cores : 1;
    o->isolate = 1;
    o->time_limit_s = 60;
    o->shard_count = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        int64_t n;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(tune_usage, stdout);
            return 1;
        } else if (strcmp(a, "--device") == 0) {
            if (!(o->device = cli_value("tune", argc, argv, &i)))
                return -1;
        } else if (strcmp(a, "--db") == 0) {
            if (!(o->db = cli_value("tune", argc, argv, &i)))
                return -1;
        } else if (strcmp(a, "--preset") == 0) {
            if (!(o->preset = cli_value("tune", argc, argv, &i)))
                return -1;
        } else if (strcmp(a, "--problems") == 0) {
            if (!(o->problems = cli_value("tune", argc, argv, &i)))
                return -1;
        } else if (strcmp(a, "--jobs") == 0) {
            if (!(v = cli_value("tune", argc, argv, &i)) || cli_parse_int("tune", a, v, &n))
                return -1;
            if (n < 1 || n > 256) {
                cli_error("tune", "--jobs must be between 1 and 256");
                return -1;
            }
            o->jobs = (int)n;
        } else if (strcmp(a, "--quiet") == 0) {
            o->quiet = 1;
        } else if (strcmp(a, "--no-isolate") == 0) {
            o->isolate = 0;
        } else if (strcmp(a, "--revalidate") == 0) {
            o->revalidate = 1;
        } else if (strcmp(a, "--strategy") == 0) {
            if (!(v = cli_value("tune", argc, argv, &i)))
                return -1;
            if (strcmp(v, "halving") == 0)
                o->strategy = STRATEGY_HALVING;
            else if (strcmp(v, "exhaustive") == 0)
                o->strategy = STRATEGY_EXHAUSTIVE;
            else if (strcmp(v, "random") == 0)
                o->strategy = STRATEGY_RANDOM;
            else {
                cli_error("tune", "--strategy must be halving, exhaustive or random (got '%s')", v);
                return -1;
            }
        } else if (strcmp(a, "--budget") == 0) {
            if (!(v = cli_value("tune", argc, argv, &i)))
                return -1;
            size_t len = strlen(v);
            if (len > 1 && v[len - 1] == 's') {
                char num[64];
                snprintf(num, sizeof num, "%.*s", (int)(len - 1), v);
                double sec;
                if (cli_parse_double("tune", a, num, &sec))
                    return -1;
                if (!(sec > 0)) {
                    cli_error("tune", "--budget seconds must be positive");
                    return -1;
                }
                o->budget_seconds = sec;
            } else {
                if (cli_parse_int("tune", a, v, &n))
                    return -1;
                if (n < 1) {
                    cli_error("tune", "--budget must be at least 1 candidate");
                    return -1;
                }
                o->budget_candidates = n;
            }
        } else if (strcmp(a, "--seed") == 0) {
            if (!(v = cli_value("tune", argc, argv, &i)) || cli_parse_int("tune", a, v, &n))
                return -1;
            o->seed = (uint64_t)n;
        } else if (strcmp(a, "--time-limit") == 0) {
            double sec;
            if (!(v = cli_value("tune", argc, argv, &i)) || cli_parse_double("tune", a, v, &sec))
                return -1;
            if (!(sec > 0)) {
                cli_error("tune", "--time-limit must be positive");
                return -1;
            }
            o->time_limit_s = sec;
        } else if (strcmp(a, "--shard") == 0) {
            if (!(v = cli_value("tune", argc, argv, &i)))
                return -1;
            int si, sn;
            char extra;
            if (sscanf(v, "%d/%d%c", &si, &sn, &extra) != 2 || sn < 1 || si < 0 || si >= sn) {
                cli_error("tune", "--shard expects I/N with 0 <= I < N (got '%s')", v);
                return -1;
            }
            o->shard_index = si;
            o->shard_count = sn;
        } else {
            cli_error("tune", "unknown option '%s' (see attnres tune --help)", a);
            return -1;
        }
    }
    if (o->preset && o->problems) {
        cli_error("tune", "give --preset or --problems, not both");
        return -1;
    }
    if (!o->preset && !o->problems)
        o->preset = "default";
    return 0;
}

/* ---- templates and candidates ---------------------------------------- */

static int load_templates(tuner *t)
{
    const char *dir = cli_template_dir();
    char **names;
    size_t count;
    if (argen_list_templates(dir, &names, &count) || count == 0) {
        cli_error("tune", "no templates found in %s", dir);
        return -1;
    }
    t->templates = calloc(count, sizeof *t->templates);
    for (size_t i = 0; t->templates && i < count; i++) {
        if (strncmp(names[i], t->dev->backend, strlen(t->dev->backend)) != 0 ||
            names[i][strlen(t->dev->backend)] != '/')
            continue;
        char msg[2048];
        argen *g;
        if (argen_open(dir, names[i], &g, msg, sizeof msg)) {
            cli_error("tune", "%s", msg);
            argen_names_free(names, count);
            return -1;
        }
        t->templates[t->ntemplates++] = g;
    }
    argen_names_free(names, count);
    if (t->ntemplates == 0) {
        cli_error("tune", "no %s templates in %s", t->dev->backend, dir);
        return -1;
    }
    return 0;
}

/* Hash over the text of every template the run uses, for the run record. */
static void templates_hash(tuner *t, char out[65])
{
    ar_sha256 s;
    ar_sha256_init(&s);
    for (size_t i = 0; i < t->ntemplates; i++)
        ar_sha256_update(&s, argen_name(t->templates[i]), strlen(argen_name(t->templates[i])));
    for (size_t i = 0; i < t->nsources; i++)
        ar_sha256_update(&s, t->sources[i]->hash, 64);
    ar_sha256_hex(&s, out);
}

static source_entry *find_source(tuner *t, const char *id)
{
    for (size_t i = 0; i < t->nsources; i++)
        if (strcmp(t->sources[i]->id, id) == 0)
            return t->sources[i];
    return NULL;
}

/* Emits (once) and records the candidate for variant `id` of template g. */
static source_entry *get_source(tuner *t, argen *g, const char *id)
{
    source_entry *e = find_source(t, id);
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
    if (argen_emit(g, id, &e->source, &e->kernel, &e->json)) {
        cli_error("tune", "%s", argen_errmsg(g));
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
        cli_error("tune", "recording candidate %s: %s", id, ardb_errmsg(t->db));
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
    pthread_mutex_t mu;
} compile_pool;

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
        if (rc != ATTNRES_OK)
            e->compile_failed = 1;
    }
}

/* Compiles every source that has no binary yet, jobs at a time, and stores
 * the binaries (one short transaction each). */
static void compile_missing(tuner *t, source_entry **todo, size_t count)
{
    if (count == 0)
        return;
    double t0 = now_s();
    compile_pool cp = {t, todo, count, 0, PTHREAD_MUTEX_INITIALIZER};
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
    size_t failed = 0;
    for (size_t i = 0; i < count; i++) {
        source_entry *e = todo[i];
        if (e->compile_failed) {
            failed++;
            continue;
        }
        ardb_binary b = {.build_key = e->build_key, .candidate_id = e->candidate_id, .compiler = t->dev->compiler,
                         .options = t->dev->options, .target = t->dev->target, .blob = e->blob,
                         .size = e->blob_size, .resources_json = NULL};
        if (ardb_binary_put(t->db, &b) == ARDB_DONE)
            e->have_binary = 1;
        free(e->blob);
        e->blob = NULL;
    }
    log_line(t, "compiled %zu variant(s) in %.1f s with %d job(s)%s", count, now_s() - t0, jobs,
             failed ? " (some failed, recorded as compile_failed)" : "");
}

/* ---- one problem ------------------------------------------------------ */

typedef struct candidate_ref {
    source_entry *e;
    int reused;            /* measured by an earlier run */
    int64_t measurement_id;
    ardb_status status;
    double median_us, spread_us;
    int final_round;       /* took part in the interleaved round */
} candidate_ref;

static const char *strategy_name(strategy s)
{
    return s == STRATEGY_EXHAUSTIVE ? "exhaustive" : s == STRATEGY_RANDOM ? "random" : "halving";
}

static void record(tuner *t, int64_t problem_id, candidate_ref *c, const job_result *r, double bytes,
                   const char *stage)
{
    const timing *tm = r->status == ARDB_STATUS_OK ? &r->tm : NULL;
    double gbps = tm && tm->median_us > 0 ? bytes / (tm->median_us * 1e3) : 0;
    char message[700];
    snprintf(message, sizeof message, "%s%s%s", stage, r->message[0] ? ": " : "", r->message);
    ardb_measurement m = {.run_id = t->run_id, .candidate_id = c->e->candidate_id, .problem_id = problem_id,
                          .device_id = t->device_id, .build_key = c->e->build_key, .status = r->status,
                          .median_us = tm ? tm->median_us : 0, .min_us = tm ? tm->min_us : 0,
                          .max_us = tm ? tm->max_us : 0, .spread_us = tm ? tm->spread_us : 0,
                          .reps = tm ? tm->reps : 0, .gbps = gbps,
                          .roofline = t->copy_gbps > 0 ? gbps / t->copy_gbps : 0, .rel_err = r->rel_err,
                          .message = message};
    if (ardb_measurement_add(t->db, &m, &c->measurement_id) != ARDB_DONE)
        cli_error("tune", "recording a measurement: %s", ardb_errmsg(t->db));
    c->status = r->status;
    c->median_us = m.median_us;
    c->spread_us = m.spread_us;
}

/* Fills a job_kernel for e, fetching its binary from the database. */
static int job_kernel_for(tuner *t, source_entry *e, job_kernel *k, void **blob)
{
    size_t size = 0;
    *blob = NULL;
    if (e->compile_failed || ardb_binary_get(t->db, e->build_key, blob, &size) != ARDB_DONE)
        return -1;
    *k = (job_kernel){.variant = e->id, .kernel_name = e->kernel, .params_json = e->json,
                      .build_key = e->build_key, .blob = *blob, .blob_size = size};
    return 0;
}

/* Measures one candidate (verifying it when `verify`) and records it. */
static void measure_one(tuner *t, bench_case *bc, int64_t problem_id, candidate_ref *c, const measure_policy *pol,
                        int verify, const char *stage)
{
    job_result r;
    memset(&r, 0, sizeof r);
    r.rel_err = NAN;
    if (c->e->compile_failed) {
        r.status = ARDB_STATUS_COMPILE_FAILED;
        snprintf(r.message, sizeof r.message, "%.480s", c->e->compile_log ? c->e->compile_log : "compilation failed");
        record(t, problem_id, c, &r, 0, "compile");
        return;
    }
    job_kernel k;
    void *blob;
    if (job_kernel_for(t, c->e, &k, &blob)) {
        r.status = ARDB_STATUS_LAUNCH_FAILED;
        snprintf(r.message, sizeof r.message, "binary %s is missing from the database", c->e->build_key);
        record(t, problem_id, c, &r, 0, stage);
        return;
    }
    job_options opt = {.verify = verify, .policy = *pol, .time_limit_s = t->opt.time_limit_s,
                       .isolate = t->opt.isolate};
    job_measure(t->dev, bc, &k, &opt, &r);
    free(blob);
    record(t, problem_id, c, &r, bench_case_bytes(bc), stage);
}

static void to_ardb_problem(const tune_problem *tp, ardb_problem *q)
{
    memset(q, 0, sizeof *q);
    q->op = problem_op_name(tp->p.op);
    q->dtype = attnres_dtype_name(tp->p.dtype);
    q->form = problem_form_name(&tp->p);
    q->d = tp->p.d;
    q->n = tp->p.n;
    q->heads = tp->p.heads;
    q->epilogue = tp->p.epilogue;
    q->s = tp->p.s;
    q->t_bucket = tp->t;
}

/* Collects the applicable candidates of a problem: this shard's share, and
 * for the random strategy a sample chosen by the seed. */
static int collect(tuner *t, const tune_problem *tp, candidate_ref **out, size_t *count)
{
    *out = NULL;
    *count = 0;
    argen_problem ap = {.op = problem_op_name(tp->p.op), .dtype = attnres_dtype_name(tp->p.dtype),
                        .form = problem_form_name(&tp->p), .d = tp->p.d, .t = tp->t, .n = tp->p.n,
                        .heads = tp->p.heads, .epilogue = tp->p.epilogue, .s = tp->p.s};
    argen_device ad = {.backend = t->dev->backend, .arch = t->dev->arch, .units = t->dev->units};
    size_t seen = 0;
    for (size_t g = 0; g < t->ntemplates; g++) {
        argen_variant *v;
        size_t nv;
        if (argen_enumerate(t->templates[g], &v, &nv)) {
            cli_error("tune", "%s", argen_errmsg(t->templates[g]));
            return -1;
        }
        for (size_t i = 0; i < nv; i++) {
            char why[512];
            int ok = argen_applies(t->templates[g], v[i].id, &ap, &ad, why, sizeof why);
            if (ok < 0) {
                cli_error("tune", "%s", why);
                argen_variants_free(v, nv);
                return -1;
            }
            if (!ok || seen++ % (size_t)t->opt.shard_count != (size_t)t->opt.shard_index)
                continue;
            source_entry *e = get_source(t, t->templates[g], v[i].id);
            candidate_ref *grown = e ? realloc(*out, (*count + 1) * sizeof *grown) : NULL;
            if (!grown) {
                argen_variants_free(v, nv);
                return -1;
            }
            *out = grown;
            memset(&(*out)[*count], 0, sizeof **out);
            (*out)[(*count)++].e = e;
        }
        argen_variants_free(v, nv);
    }
    if (t->opt.strategy == STRATEGY_RANDOM) {
        /* A seeded Fisher-Yates shuffle, then keep the first `budget`. */
        size_t keep = t->opt.budget_candidates ? (size_t)t->opt.budget_candidates : 8;
        uint64_t s = t->opt.seed * 0x9e3779b97f4a7c15ull + 1;
        for (size_t i = *count; i > 1; i--) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            size_t j = (size_t)(s % i);
            candidate_ref tmp = (*out)[i - 1];
            (*out)[i - 1] = (*out)[j];
            (*out)[j] = tmp;
        }
        if (*count > keep)
            *count = keep;
    }
    return 0;
}

static int by_median(const void *a, const void *b)
{
    const candidate_ref *x = *(candidate_ref *const *)a, *y = *(candidate_ref *const *)b;
    return (x->median_us > y->median_us) - (x->median_us < y->median_us);
}

/* Resources a variant holds, for breaking ties between equivalent
 * candidates: threads on the CPU, threads per block on GPUs. */
static int64_t resources(const source_entry *e)
{
    int64_t threads = ar_json_int(e->json, "threads", 0);
    int64_t block = ar_json_int(e->json, "block", 0);
    return threads * 1000000 + block;
}

/* The winner among the final round: the candidates within the noise of the
 * fastest are equivalent; of those, the fewest resources, then the id. */
static candidate_ref *choose(candidate_ref **fin, size_t k, char *equivalent, size_t len)
{
    candidate_ref *fastest = NULL;
    for (size_t i = 0; i < k; i++)
        if (fin[i]->status == ARDB_STATUS_OK && (!fastest || fin[i]->median_us < fastest->median_us))
            fastest = fin[i];
    if (!fastest)
        return NULL;
    candidate_ref *best = NULL;
    equivalent[0] = 0;
    for (size_t i = 0; i < k; i++) {
        candidate_ref *c = fin[i];
        if (c->status != ARDB_STATUS_OK)
            continue;
        double noise = 2.0 * (c->spread_us + fastest->spread_us);
        if (noise < 0.02 * fastest->median_us)
            noise = 0.02 * fastest->median_us;
        if (c->median_us - fastest->median_us > noise)
            continue;
        size_t used = strlen(equivalent);
        snprintf(equivalent + used, len - used, "%s%s", used ? ", " : "", c->e->id);
        if (!best || resources(c->e) < resources(best->e) ||
            (resources(c->e) == resources(best->e) && strcmp(c->e->id, best->e->id) < 0))
            best = c;
    }
    return best;
}

typedef struct winner_row {
    char problem[160], variant[128];
    double median_us, gbps, roofline;
    int found;
} winner_row;

/* Re-times the best few candidates interleaved and records the results. */
static void final_round(tuner *t, bench_case *bc, int64_t problem_id, candidate_ref **fin, size_t k)
{
    job_kernel *ks = calloc(k, sizeof *ks);
    void **blobs = calloc(k, sizeof *blobs);
    candidate_ref **loaded = calloc(k, sizeof *loaded);
    size_t nk = 0;
    for (size_t i = 0; ks && blobs && loaded && i < k; i++)
        if (job_kernel_for(t, fin[i]->e, &ks[nk], &blobs[nk]) == 0)
            loaded[nk++] = fin[i];
    job_result *res = calloc(nk ? nk : 1, sizeof *res);
    if (res && nk) {
        int rounds = strcmp(t->dev->backend, "cpu") == 0 ? 11 : 31;
        job_options opt = {.verify = 0, .policy = t->policy, .time_limit_s = t->opt.time_limit_s,
                           .isolate = t->opt.isolate};
        job_interleave(t->dev, bc, ks, nk, rounds, &opt, res);
        char stage[64];
        snprintf(stage, sizeof stage, "final (interleaved with %zu, %d rounds)", nk, rounds);
        for (size_t i = 0; i < nk; i++) {
            loaded[i]->final_round = 1;
            record(t, problem_id, loaded[i], &res[i], bench_case_bytes(bc), stage);
        }
    }
    for (size_t i = 0; blobs && i < nk; i++)
        free(blobs[i]);
    free(res);
    free(ks);
    free(blobs);
    free(loaded);
}

static int tune_problem_one(tuner *t, const tune_problem *tp, size_t index, size_t total, winner_row *w)
{
    char desc[160];
    problem_describe(tp, desc, sizeof desc);
    snprintf(w->problem, sizeof w->problem, "%s", desc);
    if (tp->p.op != ATTNRES_OP_MIX &&
        (!t->dev->ops->launch_phase1 || !t->dev->ops->launch_phase2 || strcmp(t->dev->backend, "cpu") != 0)) {
        log_line(t, "[%zu/%zu] %s: skipped, the %s backend has no phase kernels yet", index + 1, total, desc,
                 t->dev->backend);
        return 0;
    }
    ardb_problem q;
    to_ardb_problem(tp, &q);
    int64_t problem_id;
    if (ardb_problem_upsert(t->db, &q, &problem_id) != ARDB_DONE) {
        cli_error("tune", "recording problem: %s", ardb_errmsg(t->db));
        return -1;
    }
    candidate_ref *cands;
    size_t n;
    if (collect(t, tp, &cands, &n))
        return -1;
    double t0 = now_s();
    /* Resume: the database is the cache. A candidate measured before with
     * the same build key (source, compiler, options, target) is reused. */
    size_t reused = 0;
    source_entry **todo = malloc((n ? n : 1) * sizeof *todo);
    size_t ntodo = 0;
    for (size_t i = 0; i < n; i++) {
        ardb_measurement m;
        int64_t mid;
        if (ardb_measurement_find_ex(t->db, cands[i].e->candidate_id, problem_id, t->device_id,
                                     cands[i].e->build_key, &m, &mid) == ARDB_DONE) {
            cands[i].reused = 1;
            cands[i].status = m.status;
            cands[i].median_us = m.median_us;
            cands[i].spread_us = m.spread_us;
            cands[i].measurement_id = mid;
            cands[i].final_round = m.message && strncmp(m.message, "final", 5) == 0;
            ardb_measurement_clear(&m);
            reused++;
        } else if (!cands[i].e->have_binary && !cands[i].e->compile_failed && todo) {
            int dup = 0;
            for (size_t k = 0; k < ntodo; k++)
                dup |= todo[k] == cands[i].e;
            if (!dup)
                todo[ntodo++] = cands[i].e;
        }
    }
    t->reused += reused;
    candidate_ref *best = NULL;
    char equivalent[1024] = "";
    if (reused == n && n > 0) {
        /* Nothing new to measure: decide from the final (interleaved)
         * rounds on record, by the same rule as a fresh run, so the same
         * data always gives the same winner. */
        candidate_ref **fin = malloc(n * sizeof *fin);
        size_t nf = 0;
        for (size_t i = 0; fin && i < n; i++) {
            double median, spread;
            int64_t mid;
            if (cands[i].status == ARDB_STATUS_OK &&
                ardb_measurement_find_final(t->db, cands[i].e->candidate_id, problem_id, t->device_id,
                                            cands[i].e->build_key, &median, &spread, &mid) == ARDB_DONE) {
                cands[i].median_us = median;
                cands[i].spread_us = spread;
                cands[i].measurement_id = mid;
                fin[nf++] = &cands[i];
            }
        }
        if (nf)
            best = choose(fin, nf, equivalent, sizeof equivalent);
        free(fin);
    }
    if (!best && n > 0) {
        if (todo)
            compile_missing(t, todo, ntodo);
        bench_case *bc = NULL;
        char err[512];
        uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)index * 0x9e3779b97f4a7c15ull;
        bc = bench_case_create(t->dev, tp, &t->policy, seed, err, sizeof err);
        if (!bc) {
            cli_error("tune", "%s: %s", desc, err);
            free(todo);
            free(cands);
            return -1;
        }
        /* Round 1: every new candidate, verified; cheaply timed when
         * halving, fully otherwise. */
        measure_policy quick = t->policy;
        quick.warmup = 1;
        quick.min_reps = quick.max_reps = strcmp(t->dev->backend, "cpu") == 0 ? 3 : 10;
        quick.target_ms = 0;
        int halving = t->opt.strategy == STRATEGY_HALVING;
        size_t skipped = 0, fresh = n - reused, done = 0;
        double round_start = now_s();
        for (size_t i = 0; i < n; i++) {
            if (cands[i].reused)
                continue;
            progress(t, desc, done++, fresh, round_start);
            if (t->opt.budget_seconds > 0 && now_s() - t0 > t->opt.budget_seconds) {
                skipped++;
                continue;
            }
            measure_one(t, bc, problem_id, &cands[i], halving ? &quick : &t->policy, 1,
                        halving ? "screening" : "full");
        }
        progress(t, desc, fresh, fresh, round_start);
        if (skipped)
            log_line(t, "  time budget spent: %zu candidate(s) left unmeasured", skipped);
        candidate_ref **ok = malloc(n * sizeof *ok);
        size_t nok = 0;
        for (size_t i = 0; ok && i < n; i++)
            if (cands[i].status == ARDB_STATUS_OK && (cands[i].reused || cands[i].measurement_id))
                ok[nok++] = &cands[i];
        if (ok)
            qsort(ok, nok, sizeof *ok, by_median);
        /* Round 2 (halving): the best quarter, fully timed. */
        if (halving && ok) {
            size_t keep = (nok + 3) / 4;
            if (keep < 3)
                keep = 3;
            if (t->opt.budget_candidates && keep > (size_t)t->opt.budget_candidates)
                keep = (size_t)t->opt.budget_candidates;
            if (keep > nok)
                keep = nok;
            for (size_t i = 0; i < keep; i++)
                if (!ok[i]->reused)
                    measure_one(t, bc, problem_id, ok[i], &t->policy, 0, "full");
            nok = keep;
            qsort(ok, nok, sizeof *ok, by_median);
        }
        /* Round 3: the best three, interleaved, decide. */
        size_t k = nok < 3 ? nok : 3;
        if (ok && k > 0) {
            final_round(t, bc, problem_id, ok, k);
            best = choose(ok, k, equivalent, sizeof equivalent);
        }
        free(ok);
        bench_case_free(bc);
    }
    free(todo);
    if (best) {
        if (ardb_winner_set(t->db, t->run_id, problem_id, t->device_id, best->e->candidate_id,
                            best->measurement_id) != ARDB_DONE)
            cli_error("tune", "recording the winner: %s", ardb_errmsg(t->db));
        double bytes = problem_bytes(tp);
        w->found = 1;
        snprintf(w->variant, sizeof w->variant, "%s", best->e->id);
        w->median_us = best->median_us;
        w->gbps = bytes / (best->median_us * 1e3);
        w->roofline = t->copy_gbps > 0 ? w->gbps / t->copy_gbps : 0;
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += cands[i].status != ARDB_STATUS_OK;
    t->failed += bad;
    t->measured += n - reused;
    char tie[1100] = "";
    if (strchr(equivalent, ','))
        snprintf(tie, sizeof tie, " (equivalent: %s)", equivalent);
    log_line(t, "[%zu/%zu] %s: %zu candidate(s), %zu reused, %zu not ok, %.1f s; %s%s%s", index + 1, total, desc, n,
             reused, bad, now_s() - t0, best ? "winner " : "no winner", best ? best->e->id : "", tie);
    free(cands);
    return 0;
}

/* ---- the command ------------------------------------------------------ */

static void print_table(const tuner *t, const winner_row *rows, size_t n)
{
    printf("\nwinners on %s (%s)\ncopy bandwidth %.1f GB/s, empty launch %.2f us\n\n", t->dev->name,
           t->dev->backend, t->copy_gbps, t->launch_us);
    printf("%-44s %-34s %12s %9s %10s\n", "problem", "variant", "time (us)", "GB/s", "% roofline");
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].found) {
            printf("%-44s %-34s %12s %9s %10s\n", rows[i].problem, "(none verified)", "-", "-", "-");
            continue;
        }
        printf("%-44s %-34s %12.2f %9.2f %9.1f%%\n", rows[i].problem, rows[i].variant, rows[i].median_us,
               rows[i].gbps, 100.0 * rows[i].roofline);
    }
}

static int begin_run(tuner *t, int argc, char **argv)
{
    ardb_device d = {.backend = t->dev->backend, .name = t->dev->name, .arch = t->dev->arch,
                     .driver = t->dev->driver, .fingerprint = t->dev->fingerprint, .units = t->dev->units,
                     .memory = t->dev->memory};
    if (ardb_device_upsert(t->db, &d, &t->device_id) != ARDB_DONE) {
        cli_error("tune", "recording the device: %s", ardb_errmsg(t->db));
        return -1;
    }
    char cmdline[1024] = "attnres";
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(cmdline);
        snprintf(cmdline + len, sizeof cmdline - len, " %s", argv[i]);
    }
    char policy[512], host[256] = "unknown", hash[65];
    measure_policy_json(&t->policy, policy, sizeof policy);
    gethostname(host, sizeof host - 1);
    struct passwd *pw = getpwuid(getuid());
    const char *user = getenv("USER") ? getenv("USER") : pw ? pw->pw_name : "unknown";
    templates_hash(t, hash);
    ardb_run r = {.device_id = t->device_id, .user = user, .host = host, .command = cmdline,
                  .project_version = attnres_version(), .templates_hash = hash, .compiler = t->dev->compiler,
                  .driver = t->dev->driver, .policy_json = policy, .strategy = strategy_name(t->opt.strategy),
                  .copy_gbps = t->copy_gbps, .launch_us = t->launch_us};
    if (ardb_run_begin(t->db, &r, &t->run_id) != ARDB_DONE) {
        cli_error("tune", "recording the run: %s", ardb_errmsg(t->db));
        return -1;
    }
    return 0;
}

static void tuner_free(tuner *t)
{
    for (size_t i = 0; i < t->nsources; i++) {
        source_entry *e = t->sources[i];
        free(e->id);
        free(e->source);
        free(e->kernel);
        free(e->json);
        free(e->template_name);
        free(e->compile_log);
        free(e->blob);
        free(e);
    }
    free(t->sources);
    for (size_t i = 0; i < t->ntemplates; i++)
        argen_close(t->templates[i]);
    free(t->templates);
    ardb_close(t->db);
    attnres_device_close(t->dev);
}

int cmd_tune(int argc, char **argv)
{
    tuner t;
    memset(&t, 0, sizeof t);
    int prc = parse(argc, argv, &t.opt);
    if (prc)
        return prc > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if (t.opt.revalidate)
        return tune_revalidate(t.opt.device, t.opt.db, t.opt.quiet);
    double start = now_s();
    char msg[1024];
    const char *spec = t.opt.device ? t.opt.device : cli_best_device();
    problem_set set = {0};
    winner_row *rows = NULL;
    int exit_code = CLI_EXIT_FAIL;
    if (attnres_device_open(spec, &t.dev, msg, sizeof msg) != ATTNRES_OK) {
        cli_error("tune", "cannot open device %s: %s", spec, msg);
        return CLI_EXIT_FAIL;
    }
    if (t.opt.problems ? problems_read_file(t.opt.problems, &set, msg, sizeof msg)
                       : problems_preset(t.opt.preset, t.dev->backend, &set, msg, sizeof msg)) {
        cli_error("tune", "%s", msg);
        exit_code = CLI_EXIT_USAGE;
        goto done;
    }
    if (ardb_open(t.opt.db, ARDB_CREATE, &t.db, msg, sizeof msg) != ARDB_DONE) {
        cli_error("tune", "%s", msg);
        goto done;
    }
    measure_policy_default(&t.policy, t.dev->backend);
    if (load_templates(&t))
        goto done;
    if (t.dev->ops->copy_bandwidth(t.dev, &t.copy_gbps) != ATTNRES_OK ||
        t.dev->ops->empty_launch(t.dev, &t.launch_us) != ATTNRES_OK) {
        cli_error("tune", "measuring the device: %s", t.dev->errmsg);
        goto done;
    }
    log_line(&t, "device %s: %s, copy bandwidth %.1f GB/s, empty launch %.2f us", spec, t.dev->name, t.copy_gbps,
             t.launch_us);
    if (begin_run(&t, argc, argv))
        goto done;
    rows = calloc(set.count, sizeof *rows);
    if (!rows)
        goto done;
    int ok = 1;
    for (size_t i = 0; i < set.count && ok; i++)
        ok = tune_problem_one(&t, &set.items[i], i, set.count, &rows[i]) == 0;
    ardb_run_finish(t.db, t.run_id, ok ? "complete" : "failed");
    print_table(&t, rows, set.count);
    printf("\nrun %" PRId64 ": %zu measured, %zu reused, %zu not ok, %.1f s; database %s\n", t.run_id, t.measured,
           t.reused, t.failed, now_s() - start, t.opt.db);
    exit_code = ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
done:
    free(rows);
    problems_free(&set);
    tuner_free(&t);
    return exit_code;
}
