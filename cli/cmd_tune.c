/*
 * cmd_tune.c - `attnres tune`: options, the run record, the problem loop
 * and the winners table. Each problem's search is the tuner library's
 * (tuner/src/search.c), candidates and compilation too (candidates.c);
 * docs/tuning.md describes the whole.
 */
#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ceiling_check.h"
#include "cli.h"
#include "disturbance.h"
#include "revalidate.h"
#include "tune_session.h"

static const char tune_usage[] =
    "usage: attnres tune [--device cpu|cuda:N] [--db FILE]\n"
    "                    [--preset NAME | --problems FILE | --from-misses FILE]\n"
    "                    [--strategy halving|exhaustive|random] [--budget N | --budget SECONDSs]\n"
    "                    [--seed S] [--shard I/N] [--jobs N] [--time-limit SECONDS]\n"
    "                    [--retries N] [--no-isolate] [--no-prune] [--explain-pruning] [--quiet]\n"
    "                    [--ceilings-from FILE]\n"
    "       attnres tune --revalidate [--device cpu|cuda:N] [--db FILE] [--retries N] [--quiet]\n"
    "\n"
    "  Strategies: halving (default) times every candidate cheaply (one launch\n"
    "  where launches take 1 ms or more and it is 1.5x slower than the fastest so\n"
    "  far; cut short at 4x), then the best quarter (at least 3, at most\n"
    "  --budget N) again; exhaustive times all fully;\n"
    "  random times a sample of --budget N (default 8) chosen with --seed. Those\n"
    "  within 10% of the best are then re-timed interleaved; candidates within the\n"
    "  noise of the best (3-5%) form an equivalent set, and the one with the fewest\n"
    "  resources wins, so the same machine picks the same winner twice (or one of\n"
    "  the same equivalent set). --budget 30s stops measuring new\n"
    "  candidates of a problem after 30 seconds. --shard I/N takes every N-th\n"
    "  candidate starting at I (0-based), for tuning in parallel and merging\n"
    "  databases with `attnres db merge`. On the CPU each candidate runs in its own\n"
    "  process, so one that crashes or hangs (past --time-limit, default 60 s) is\n"
    "  recorded as launch_failed or timeout and the run goes on.\n"
    "  Templates may prune variants that run a problem right but cannot win there\n"
    "  (a cost model: bursts on short head slices, prefetches from the mix in\n"
    "  cache): they are not compiled or measured. --explain-pruning lists each with\n"
    "  its reason; --no-prune tunes them too.\n"
    "  A final round that other work on the machine disturbed (its threads waited\n"
    "  for a CPU 20% of the round, the hypervisor stole 5% of it, or a streaming\n"
    "  probe of the device read 1.25x slower than its median of the run) is timed\n"
    "  again after a 2 s pause, up to --retries times (default 2, or\n"
    "  ATTNRES_TUNE_RETRIES; 0: never); if every try is disturbed the winner is\n"
    "  marked provisional in the output, with the run (db runs --long) and in the\n"
    "  database (db show, plan --explain).\n"
    "  --revalidate re-measures only the stored winners of the device (fast) and\n"
    "  records them as a run that `attnres db regress` can compare; a provisional\n"
    "  winner is decided again: the finalists of its round are timed interleaved\n"
    "  (with --retries) and the one that wins is recorded, provisional only if\n"
    "  this round was disturbed on every try too.\n"
    "\n"
    "  Tunes every problem of a preset (ci, default, k3, mhar-8b, delta-small; default:\n"
    "  default) or a problems file (see docs/problems.md) on the device (default: the\n"
    "  best present), recording every candidate and the winners in FILE (default\n"
    "  attnres.db, created if missing). A second run over the same problems reuses\n"
    "  every measurement whose candidate source, compiler and device are unchanged.\n"
    "  --from-misses FILE tunes the problems and T buckets that plans fell back on,\n"
    "  as the runtime recorded them in FILE (ATTNRES_MISS_FILE=FILE or\n"
    "  attnres_miss_file_set; see attnres.h).\n"
    "  --ceilings-from FILE (or ATTNRES_TUNE_CEILINGS_FROM) takes the device's\n"
    "  ceilings (copy, read and FMA rates, cache size, launch time) from the\n"
    "  latest run in database FILE that measured them on this same device (same\n"
    "  fingerprint) in the last 24 hours, instead of measuring them again (about\n"
    "  8 s on a CPU); where FILE holds none, they are measured, saying why.\n";

/* --budget N (candidates) or --budget SECONDSs (seconds a problem). */
static int parse_budget(const char *cmd, const char *flag, const char *v, void *dst)
{
    (void)flag;
    tune_opts *o = dst;
    size_t len = strlen(v);
    if (len > 1 && v[len - 1] == 's') {
        char num[64];
        snprintf(num, sizeof num, "%.*s", (int)(len - 1), v);
        return cli_parse_positive(cmd, "--budget (seconds)", num, &o->budget_seconds);
    }
    /* A count of candidates; a million is more than any template space
     * holds. */
    return cli_parse_int_range(cmd, "--budget (candidates)", v, 1, 1000000, &o->budget_candidates);
}

/* --shard I/N. sscanf's %d has undefined behaviour on overflow: each half
 * is parsed and range-checked on its own, the count first so that the
 * index's range can name it. */
static int parse_shard(const char *cmd, const char *flag, const char *v, void *dst)
{
    tune_opts *o = dst;
    const char *slash = strchr(v, '/');
    char index[32];
    int64_t si, sn;
    if (!slash || (size_t)(slash - v) >= sizeof index) {
        cli_error(cmd, "%s expects I/N with 0 <= I < N (got '%s')", flag, v);
        return -1;
    }
    snprintf(index, sizeof index, "%.*s", (int)(slash - v), v);
    if (cli_parse_int_range(cmd, "--shard count N", slash + 1, 1, 4096, &sn) ||
        cli_parse_int_range(cmd, "--shard index I", index, 0, sn - 1, &si))
        return -1;
    o->shard_index = (int)si;
    o->shard_count = (int)sn;
    return 0;
}

int tune_retries_default(int *retries)
{
    const char *text = getenv("ATTNRES_TUNE_RETRIES");
    int64_t value = 2;
    if (text && *text && cli_parse_int_range("tune", "ATTNRES_TUNE_RETRIES", text, 0, 10, &value))
        return -1;
    *retries = (int)value;
    return 0;
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
    if (tune_retries_default(&o->retries))
        return -1;
    const char *ceilings_from = getenv("ATTNRES_TUNE_CEILINGS_FROM");
    o->ceilings_from = ceilings_from && *ceilings_from ? ceilings_from : NULL;
    /* The order of strategy's names is the order of the enum. */
    static const char *const strategies[] = {"halving", "exhaustive", "random", NULL};
    int strat = STRATEGY_HALVING, no_isolate = 0;
    /* Negative seeds used to wrap to huge unsigned ones silently. */
    int64_t seed = 0;
    const cli_opt opts[] = {
        CLI_OPT_STRING("--device", &o->device),
        CLI_OPT_STRING("--db", &o->db),
        CLI_OPT_STRING("--preset", &o->preset),
        CLI_OPT_STRING("--problems", &o->problems),
        CLI_OPT_STRING("--from-misses", &o->misses),
        CLI_OPT_INT("--jobs", &o->jobs, 1, 256),
        CLI_OPT_INT("--retries", &o->retries, 0, 10),
        CLI_OPT_FLAG("--quiet", &o->quiet),
        CLI_OPT_FLAG("--no-isolate", &no_isolate),
        CLI_OPT_FLAG("--revalidate", &o->revalidate),
        CLI_OPT_FLAG("--no-prune", &o->no_prune),
        CLI_OPT_FLAG("--explain-pruning", &o->explain_pruning),
        CLI_OPT_CHOICE("--strategy", &strat, strategies),
        CLI_OPT_CUSTOM("--budget", o, parse_budget),
        CLI_OPT_INT64("--seed", &seed, 0, INT64_MAX),
        CLI_OPT_POSITIVE("--time-limit", &o->time_limit_s),
        CLI_OPT_CUSTOM("--shard", o, parse_shard),
        CLI_OPT_STRING("--ceilings-from", &o->ceilings_from),
        CLI_OPT_END};
    const cli_spec spec = {.cmd = "tune", .usage = tune_usage, .opts = opts};
    int rc = cli_parse(&spec, argc, argv);
    if (rc != CLI_PARSED)
        return rc;
    o->strategy = (strategy)strat;
    o->seed = (uint64_t)seed;
    if (no_isolate)
        o->isolate = 0;
    if (!!o->preset + !!o->problems + !!o->misses > 1) {
        cli_error("tune", "give one of --preset, --problems and --from-misses");
        return -1;
    }
    if (!o->preset && !o->problems && !o->misses)
        o->preset = "default";
    return 0;
}

/* ---- the command ------------------------------------------------------ */

/* Appends line and a newline to report, cutting at its size. */
static void report_add(char *report, size_t size, size_t *len, const char *line)
{
    int k = snprintf(report + *len, size - *len, "%s\n", line);
    if (k > 0)
        *len = *len + (size_t)k < size ? *len + (size_t)k : size - 1;
}

/* The out-of-cache and paired checks (ceiling_check.h) over the winners
 * found, with a warning line for each one above its ceiling or its pass
 * into report. */
static void check_winners(const tuner *t, const winner_row *rows, size_t n, ceiling_check *c, char *report,
                          size_t size)
{
    size_t len = 0;
    *c = (ceiling_check){0};
    report[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const winner_row *w = &rows[i];
        char warning[512];
        if (!w->found)
            continue;
        if (ceiling_check_winner(&t->roof, c, w->problem, w->gbps, w->read_bytes, w->write_bytes, w->median_us,
                                 w->spread_us, w->paired, w->paired_spread, warning, sizeof warning))
            report_add(report, size, &len, warning);
        if (ceiling_check_paired(c, w->problem, w->paired, w->paired_spread, warning, sizeof warning))
            report_add(report, size, &len, warning);
    }
}

/* The winners table, then the check's warnings (report) and summary. */
static void print_table(const tuner *t, const winner_row *rows, size_t n, const ceiling_check *c,
                        const char *report)
{
    char roof[320];
    device_ceilings_format(&t->roof, roof, sizeof roof);
    printf("\nwinners on %s (%s)\n%s\n", t->dev->name, t->dev->backend, roof);
    if (t->roof_carried_from)
        printf("(ceilings as run %" PRId64 " measured them: this run measured nothing new)\n", t->roof_carried_from);
    else if (t->roof_from_uid[0])
        printf("(ceilings as run %s of %s measured them)\n", t->roof_from_uid, t->opt.ceilings_from);
    else if (t->roof.ceil.n > 0) {
        char detail[4096];
        device_ceilings_detail(&t->roof, detail, sizeof detail);
        printf("ceilings (best of each streaming kernel by threads):\n%s\n", detail);
    }
    /* "% ceiling" is of the ceiling that matches the kernel's traffic, the
     * time-based blend of the read and copy ceilings (docs/design.md §2);
     * "% copy" and "% read" of those two alone. Phase 1 is bound by
     * arithmetic: "% FMA" is its flop rate over the measured FMA peak.
     * Beyond the largest cache, "% paired" is of a streaming pass moving
     * the same bytes timed in the final rounds themselves (paired_stream.h). */
    printf("\n%-44s %-34s %12s %9s %9s %8s %7s %7s %7s\n", "problem", "variant", "time (us)", "GB/s", "% ceiling",
           "% paired", "% copy", "% read", "% FMA");
    for (size_t i = 0; i < n; i++) {
        if (!rows[i].found) {
            printf("%-44s %-34s %12s %9s %9s %8s %7s %7s %7s\n", rows[i].problem, "(none verified)", "-", "-", "-",
                   "-", "-", "-", "-");
            continue;
        }
        char copy[16], read[16], fma[16] = "-", paired[16] = "-";
        if (rows[i].paired > 0)
            device_ceilings_percent(rows[i].paired, 1.0, paired, sizeof paired);
        device_ceilings_percent(rows[i].gbps, t->roof.copy_gbps, copy, sizeof copy);
        device_ceilings_percent(rows[i].gbps, t->roof.read_gbps, read, sizeof read);
        if (rows[i].flops > 0 && rows[i].median_us > 0)
            device_ceilings_percent(rows[i].flops / (rows[i].median_us * 1e3), t->roof.ceil.fma_gflops, fma, sizeof fma);
        printf("%-44s %-34s %12.2f %9.2f %8.1f%% %8s %7s %7s %7s\n", rows[i].problem, rows[i].variant,
               rows[i].median_us, rows[i].gbps, 100.0 * rows[i].ceiling_fraction, paired, copy, read, fma);
    }
    char summary[640];
    ceiling_check_summary(c, summary, sizeof summary);
    printf("\n%s%s\n", report, summary);
    if (t->probe && t->probe->readings > 1) {
        char probe[200];
        device_probe_describe(t->probe, probe, sizeof probe);
        const int drifted = t->probe->min_gbps * DISTURBANCE_DRIFT <= t->probe->usual_gbps;
        printf("device: %s%s\n", probe,
               drifted ? "; its slowest reading was 1.25 times slower than its median or more: a final round "
                         "after which it read so was timed again, or its winner is provisional"
                       : "");
    }
    /* Winners whose final rounds other work on the machine disturbed, in
     * this run or in the run whose final round this one decided from. */
    for (size_t i = 0; i < n; i++) {
        if (rows[i].disturbed)
            printf("disturbed: %s: %d final round(s) (%s)%s\n", rows[i].problem, rows[i].disturbed,
                   rows[i].disturbance,
                   rows[i].provisional ? "; every retry was disturbed too: the winner is provisional"
                                       : "; timed again, undisturbed");
        else if (rows[i].provisional)
            printf("disturbed: %s: decided from a final round on record that was disturbed (%s): the winner is "
                   "provisional\n",
                   rows[i].problem, rows[i].disturbance);
    }
    /* Screenings far noisier than the problem's earlier ones on this
     * device: the choice stands, but it was made among finalists that a
     * quiet screening might have chosen differently. */
    for (size_t i = 0; i < n; i++)
        if (rows[i].screen_disturbed)
            printf("screening disturbed: %s: its launches spread %.1f%% about their medians, %.1fx the usual "
                   "%.1f%% of launches as long on this device; a candidate may have been left out of its final "
                   "round (a tune into a fresh database screens it again)\n",
                   rows[i].problem, 100.0 * rows[i].screen_spread, rows[i].screen_spread / rows[i].screen_usual,
                   100.0 * rows[i].screen_usual);
}

/* s as the inside of a JSON string: quotes and backslashes escaped,
 * control characters left out. The evidence of a final round on record
 * comes from a database, which can hold any text. */
static void json_inner(const char *s, char *buf, size_t len)
{
    size_t o = 0;
    for (; *s && o + 2 < len; s++) {
        if ((unsigned char)*s < 0x20)
            continue;
        if (*s == '"' || *s == '\\')
            buf[o++] = '\\';
        buf[o++] = *s;
    }
    buf[o] = 0;
}

/* Appends text to buf (of size len) whole, or not at all: 0 when it fit. */
static int append_whole(char *buf, size_t len, const char *text)
{
    size_t used = strlen(buf), add = strlen(text);
    if (used + add >= len)
        return -1;
    memcpy(buf + used, text, add + 1);
    return 0;
}

/* Appends `, "name": [items]` to more, whole or not at all: a list too
 * long for the record is left out (the log has every line). */
static void append_list(char *more, size_t len, const char *name, const char *items)
{
    char list[4096];
    if (items[0] && snprintf(list, sizeof list, ", \"%s\": [%s]", name, items) < (int)sizeof list)
        append_whole(more, len, list);
}

/* Records where the run's time went (tune_stages.h) with the run, the
 * problems whose final rounds or screenings were disturbed, and the
 * device probe's readings (disturbance.h, device_probe.h). */
static void record_stages(tuner *t, const winner_row *rows, size_t n)
{
    char more[8192] = "", items[4000] = "", item[700], json[9216];
    int whole = 1;
    for (size_t i = 0; i < n && whole; i++) {
        if (!rows[i].disturbed && !rows[i].provisional)
            continue;
        char evidence[2 * sizeof rows[i].disturbance];
        json_inner(rows[i].disturbance, evidence, sizeof evidence);
        snprintf(item, sizeof item,
                 "%s{\"problem\": \"%s\", \"disturbed_rounds\": %d, \"provisional\": %s, \"evidence\": \"%s\"}",
                 items[0] ? ", " : "", rows[i].problem, rows[i].disturbed, rows[i].provisional ? "true" : "false",
                 evidence);
        whole = append_whole(items, sizeof items, item) == 0;
    }
    if (whole)
        append_list(more, sizeof more, "disturbed", items);
    items[0] = 0;
    whole = 1;
    for (size_t i = 0; i < n && whole; i++) {
        if (!rows[i].screen_disturbed)
            continue;
        snprintf(item, sizeof item, "%s{\"problem\": \"%s\", \"spread\": %.4f, \"usual\": %.4f}",
                 items[0] ? ", " : "", rows[i].problem, rows[i].screen_spread, rows[i].screen_usual);
        whole = append_whole(items, sizeof items, item) == 0;
    }
    if (whole)
        append_list(more, sizeof more, "screening_disturbed", items);
    if (t->probe && t->probe->readings) {
        char probe[256];
        device_probe_json(t->probe, probe, sizeof probe);
        snprintf(item, sizeof item, ", \"device_probe\": %s", probe);
        append_whole(more, sizeof more, item);
    }
    tune_stages_json(&t->stages, more, json, sizeof json);
    if (ardb_run_set_stages(t->db, t->run_id, json) != ARDB_DONE) {
        cli_error("tune", "recording where the time went: %s", ardb_errmsg(t->db));
        t->unrecorded++;
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
    artuner_templates_hash(t, hash);
    ardb_run r = {.device_id = t->device_id, .user = user, .host = host, .command = cmdline,
                  .project_version = attnres_version(), .templates_hash = hash, .compiler = t->dev->compiler,
                  .driver = t->dev->driver, .policy_json = policy, .strategy = artuner_strategy_name(t->opt.strategy),
                  .copy_gbps = NAN, .read_gbps = NAN, .launch_us = NAN}; /* tuner_ceilings_* */
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
        free(e->spec);
        free(e->source);
        free(e->kernel);
        free(e->json);
        free(e->template_name);
        free(e->compile_log);
        free(e->blob);
        free(e);
    }
    free(t->sources);
    for (size_t i = 0; i < t->ntemplates; i++) {
        argen_variants_free(t->variants[i], t->nvariants[i]);
        argen_close(t->templates[i]);
    }
    free(t->templates);
    free(t->variants);
    free(t->nvariants);
    ardb_close(t->db);
    device_probe_free(t->dev, t->probe);
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
        return tune_revalidate(t.opt.device ? t.opt.device : cli_best_device(), t.opt.db, t.opt.quiet, t.opt.retries);
    double start = artuner_now_s();
    char msg[1024];
    const char *spec = t.opt.device ? t.opt.device : cli_best_device();
    problem_set set = {0};
    winner_row *rows = NULL;
    int exit_code = CLI_EXIT_FAIL;
    if (attnres_device_open(spec, &t.dev, msg, sizeof msg) != ATTNRES_OK) {
        cli_error("tune", "cannot open device %s: %s", spec, msg);
        return CLI_EXIT_FAIL;
    }
    int torn = 0;
    size_t other = 0;
    if (t.opt.misses ? problems_read_misses(t.opt.misses, t.dev->fingerprint, &set, &torn, &other, msg, sizeof msg)
        : t.opt.problems ? problems_read_file(t.opt.problems, &set, msg, sizeof msg)
                         : problems_preset(t.opt.preset, t.dev->backend, &set, msg, sizeof msg)) {
        cli_error("tune", "%s", msg);
        exit_code = CLI_EXIT_USAGE;
        goto done;
    }
    if (t.opt.misses) {
        artuner_log(&t, "%s: %zu problem(s) to tune%s", t.opt.misses, set.count,
                 torn ? "; skipped line(s) cut short" : "");
        if (other)
            artuner_log(&t, "%s: %zu line(s) were recorded on other devices; tuned here for this one", t.opt.misses,
                     other);
    }
    if (ardb_open(t.opt.db, ARDB_CREATE, &t.db, msg, sizeof msg) != ARDB_DONE) {
        cli_error("tune", "%s", msg);
        goto done;
    }
    measure_policy_default(&t.policy, t.dev);
    if (artuner_load_templates(&t))
        goto done;
    if (begin_run(&t, argc, argv))
        goto done;
    rows = calloc(set.count, sizeof *rows);
    if (!rows)
        goto done;
    int ok = 1;
    /* A result the database refused (a full disk, an I/O error) ends the
     * run: what follows would be lost the same way. */
    for (size_t i = 0; i < set.count && ok && !t.unrecorded; i++)
        ok = tune_problem_one(&t, &set.items[i], i, set.count, &rows[i]) == 0;
    /* A run that measured nothing has not measured the ceilings either. */
    if (ok && !t.unrecorded && tuner_ceilings_carry(&t))
        ok = 0;
    for (size_t i = 0; i < set.count; i++) {
        double ceiling = device_ceilings_ceiling(&t.roof, rows[i].read_bytes, rows[i].write_bytes);
        rows[i].ceiling_fraction = rows[i].found && ceiling > 0 ? rows[i].gbps / ceiling : 0;
    }
    /* The device's state at the end, against its first reading: the last
     * problem's final round was read already, so this only tells the
     * run's story (the table's `device:` line and the run's record). */
    if (ok && t.probe && t.probe->readings)
        device_probe_read(t.dev, t.probe);
    ceiling_check check;
    char report[4096];
    check_winners(&t, rows, set.count, &check, report, sizeof report);
    if (t.roof_ready)
        tuner_ceilings_record(&t, &check);
    t.stages.total_s = artuner_now_s() - start;
    record_stages(&t, rows, set.count);
    ok = ok && !t.unrecorded;
    if (ardb_run_finish(t.db, t.run_id, ok ? "complete" : "failed") != ARDB_DONE) {
        cli_error("tune", "recording the end of the run: %s", ardb_errmsg(t.db));
        t.unrecorded++;
        ok = 0;
    }
    print_table(&t, rows, set.count, &check, report);
    char stages[2048];
    tune_stages_format(&t.stages, stages, sizeof stages);
    printf("\n%s", stages);
    printf("\nrun %" PRId64 ": %zu measured, %zu reused, %zu not ok, %.1f s; database %s\n", t.run_id, t.measured,
           t.reused, t.failed, t.stages.total_s, t.opt.db);
    if (t.unrecorded)
        cli_error("tune", "%zu result(s) could not be written to %s (above): the run is not complete", t.unrecorded,
                  t.opt.db);
    exit_code = ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
done:
    free(rows);
    problems_free(&set);
    tuner_free(&t);
    return exit_code;
}
