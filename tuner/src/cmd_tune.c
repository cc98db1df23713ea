/*
 * cmd_tune.c - `attnres tune`: options, the run record, the problem loop
 * and the winners table. Each problem's search is in search.c, candidates
 * and compilation in candidates.c; docs/tuning.md describes the whole.
 */
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "revalidate.h"
#include "tune_session.h"

static const char tune_usage[] =
    "usage: attnres tune [--device cpu|cuda:N] [--db FILE] [--preset NAME | --problems FILE]\n"
    "                    [--strategy halving|exhaustive|random] [--budget N | --budget SECONDSs]\n"
    "                    [--seed S] [--shard I/N] [--jobs N] [--time-limit SECONDS]\n"
    "                    [--no-isolate] [--quiet]\n"
    "       attnres tune --revalidate [--device cpu|cuda:N] [--db FILE] [--quiet]\n"
    "\n"
    "  Strategies: halving (default) times every candidate cheaply, then the best\n"
    "  quarter (at least 3, at most --budget N) fully; exhaustive times all fully;\n"
    "  random times a sample of --budget N (default 8) chosen with --seed. Those\n"
    "  within 10% of the best are then re-timed interleaved; candidates within the\n"
    "  noise of the best form an equivalent set, and the one with the fewest\n"
    "  resources wins, so the same machine picks the same winner twice (or one of\n"
    "  the same equivalent set). --budget 30s stops measuring new\n"
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

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void log_line(const tuner *t, const char *fmt, ...)
{
    if (t->opt.quiet)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
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
            if (!(v = cli_value("tune", argc, argv, &i)) || cli_parse_int_range("tune", a, v, 1, 256, &n))
                return -1;
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
                if (cli_parse_positive("tune", "--budget (seconds)", num, &sec))
                    return -1;
                o->budget_seconds = sec;
            } else {
                /* A count of candidates; a million is more than any
                 * template space holds. */
                if (cli_parse_int_range("tune", "--budget (candidates)", v, 1, 1000000, &n))
                    return -1;
                o->budget_candidates = n;
            }
        } else if (strcmp(a, "--seed") == 0) {
            /* Negative seeds used to wrap to huge unsigned ones silently. */
            if (!(v = cli_value("tune", argc, argv, &i)) || cli_parse_int_range("tune", a, v, 0, INT64_MAX, &n))
                return -1;
            o->seed = (uint64_t)n;
        } else if (strcmp(a, "--time-limit") == 0) {
            double sec;
            if (!(v = cli_value("tune", argc, argv, &i)) || cli_parse_positive("tune", a, v, &sec))
                return -1;
            o->time_limit_s = sec;
        } else if (strcmp(a, "--shard") == 0) {
            if (!(v = cli_value("tune", argc, argv, &i)))
                return -1;
            /* sscanf's %d has undefined behaviour on overflow: each half is
             * parsed and range-checked on its own, the count first so that
             * the index's range can name it. */
            const char *slash = strchr(v, '/');
            char index[32];
            int64_t si, sn;
            if (!slash || (size_t)(slash - v) >= sizeof index) {
                cli_error("tune", "--shard expects I/N with 0 <= I < N (got '%s')", v);
                return -1;
            }
            snprintf(index, sizeof index, "%.*s", (int)(slash - v), v);
            if (cli_parse_int_range("tune", "--shard count N", slash + 1, 1, 4096, &sn) ||
                cli_parse_int_range("tune", "--shard index I", index, 0, sn - 1, &si))
                return -1;
            o->shard_index = (int)si;
            o->shard_count = (int)sn;
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

/* ---- the command ------------------------------------------------------ */

static void print_table(const tuner *t, const winner_row *rows, size_t n)
{
    char roof[160];
    rooflines_format(&t->roof, roof, sizeof roof);
    printf("\nwinners on %s (%s)\n%s\n\n", t->dev->name, t->dev->backend, roof);
    /* "% roofline" is of the copy bandwidth (DESIGN §2); "% read" of the
     * read-only rate, the ceiling of a kernel that mostly reads. */
    printf("%-44s %-34s %12s %9s %10s %7s\n", "problem", "variant", "time (us)", "GB/s", "% roofline", "% read");
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].found) {
            printf("%-44s %-34s %12s %9s %10s %7s\n", rows[i].problem, "(none verified)", "-", "-", "-", "-");
            continue;
        }
        char read[16];
        rooflines_percent(rows[i].gbps, t->roof.read_gbps, read, sizeof read);
        printf("%-44s %-34s %12.2f %9.2f %9.1f%% %7s\n", rows[i].problem, rows[i].variant, rows[i].median_us,
               rows[i].gbps, 100.0 * rows[i].roofline, read);
    }
}

static int begin_run(tuner *t, int argc, char **argv)
{
    ardb_device d = {.backend = t->dev->backend, .name = t->dev->name, .arch = t->dev->arch,
                     .driver = t->dev->driver, .fingerprint = t->dev->fingerprint, .units = t->dev->units,
                     .memory = t->dev->memory, .simulated = t->dev->simulated};
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
                  .copy_gbps = t->roof.copy_gbps, .read_gbps = t->roof.read_gbps,
                  .launch_us = t->roof.launch_us};
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
    measure_policy_default(&t.policy, t.dev);
    if (load_templates(&t))
        goto done;
    if (rooflines_measure(t.dev, &t.roof) != ATTNRES_OK) {
        cli_error("tune", "measuring the device: %s", attnres_device_errmsg(t.dev));
        goto done;
    }
    char roof[160];
    rooflines_format(&t.roof, roof, sizeof roof);
    log_line(&t, "device %s: %s, %s", spec, t.dev->name, roof);
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
