/*
 * revalidate.c - re-measures the stored winners of a device as a new run.
 *
 * Fast by design: one kernel per problem, the one the runtime would load,
 * built for the device's current compiler and driver. A winner that no
 * longer verifies is recorded with its status and no winner, which
 * `attnres db regress` reports as lost. A provisional winner (its final
 * round was disturbed on every try) is decided again instead: the
 * finalists of that round are timed interleaved as the tuner's final round
 * times them (final_round.h), and the run records the one that wins.
 */
#include "revalidate.h"

#include <inttypes.h>
#include <math.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "ceiling_check.h"
#include "final_round.h"
#include "isolate.h"
#include "paired_stream.h"
#include "tuner_base.h"
#include "attnres-impl.h"
#include "measure.h"
#include "problems.h"
#include "device_ceilings.h"
#include "tune_session.h"

/* The rounds of a winner and its streaming pass, as a tuning run's final
 * round on the CPU. */
enum { PAIR_ROUNDS = 11 };

/* A finalist that hangs is stopped as tune stops one by default
 * (--time-limit). */
#define REDECIDE_TIME_LIMIT_S 60.0

typedef struct revalidation {
    attnres_device *dev;
    ardb *db;
    int64_t device_id, run_id;
    device_ceilings roof;
    device_probe *probe; /* read after each re-decision's round (NULL: none) */
    measure_policy policy;
    int quiet;
    int retries;       /* a disturbed re-decision is timed again (final_round.h) */
    size_t unrecorded; /* results a database write lost: the run fails */
} revalidation;

/* The outcome for one stored winner, for the table. */
typedef struct outcome {
    ardb_status status;
    double median_us;
    int measured; /* a measurement was recorded */
    double fraction;        /* of the matching ceiling */
    double gbps, read_bytes, write_bytes, spread_us; /* for the ceiling check */
    double paired, paired_spread; /* of a streaming pass in the same rounds (NaN: none) */
    char message[512];
    /* A provisional winner decided again: its finalists were timed
     * interleaved and the run recorded the one that won (decided, at
     * decided_us in that round, of `finalists`); still_provisional when
     * that round was disturbed on every try too, with its evidence. The
     * figures above are then the stored winner's in that round. */
    int redecided, still_provisional;
    size_t finalists;
    char decided[128], evidence[224];
    double decided_us;
} outcome;

static void note(const revalidation *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const revalidation *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    artuner_vlog(r->quiet, fmt, ap);
    va_end(ap);
}

/* The run record: who, where, what versions, which policy. */
static int begin_run(revalidation *r, const char *spec, const char *db_path, const ardb_stored_winner *w, size_t n)
{
    char cmdline[1024], policy[512], host[256] = "unknown", hash[65], note_text[512];
    ar_sha256 s;
    snprintf(cmdline, sizeof cmdline, "attnres tune --revalidate --device %s --db %s", spec, db_path);
    measure_policy_json(&r->policy, policy, sizeof policy);
    gethostname(host, sizeof host - 1);
    struct passwd *pw = getpwuid(getuid());
    const char *user = getenv("USER") ? getenv("USER") : pw ? pw->pw_name : "unknown";
    /* No template is read: the hash is over the sources re-measured. */
    ar_sha256_init(&s);
    for (size_t i = 0; i < n; i++)
        if (w[i].source_hash)
            ar_sha256_update(&s, w[i].source_hash, strlen(w[i].source_hash));
    ar_sha256_hex(&s, hash);
    ardb_run run = {.device_id = r->device_id, .user = user, .host = host, .command = cmdline,
                    .project_version = attnres_version(), .templates_hash = hash, .compiler = r->dev->compiler,
                    .driver = r->dev->driver, .policy_json = policy, .strategy = "revalidate",
                    .copy_gbps = r->roof.copy_gbps, .read_gbps = r->roof.read_gbps,
                    .launch_us = r->roof.launch_us};
    if (ardb_run_begin(r->db, &run, &r->run_id) != ARDB_DONE) {
        artuner_error("tune", "recording the run: %s", ardb_errmsg(r->db));
        return -1;
    }
    char ceilings[CEILING_CHECK_JSON_SIZE];
    ceiling_check_json(&r->roof, NULL, ceilings, sizeof ceilings);
    if (ardb_run_set_ceilings(r->db, r->run_id, ceilings) != ARDB_DONE)
        artuner_error("tune", "recording the ceilings: %s", ardb_errmsg(r->db));
    /* Which runs' winners this run re-measured, as its note. */
    size_t len = (size_t)snprintf(note_text, sizeof note_text, "re-validates the winners of run");
    int64_t seen[32];
    size_t nseen = 0;
    for (size_t i = 0; i < n && nseen < 32; i++) {
        int dup = 0;
        for (size_t k = 0; k < nseen; k++)
            dup |= seen[k] == w[i].run_id;
        if (dup)
            continue;
        seen[nseen++] = w[i].run_id;
        if (len < sizeof note_text)
            len += (size_t)snprintf(note_text + len, sizeof note_text - len, "%s %" PRId64,
                                    nseen == 1 ? "" : ",", w[i].run_id);
    }
    if (ardb_run_set_note(r->db, r->run_id, note_text) != ARDB_DONE)
        artuner_error("tune", "recording the run's note: %s", ardb_errmsg(r->db));
    return 0;
}

static int tune_problem_of(const ardb_stored_winner *w, tune_problem *tp, char *why, size_t len)
{
    attnres_dtype dt;
    attnres_op op;
    memset(tp, 0, sizeof *tp);
    if (problem_op_parse(w->op, &op)) {
        snprintf(why, len, "unknown op '%s'", w->op ? w->op : "?");
        return -1;
    }
    if (!w->dtype || attnres_dtype_parse(w->dtype, &dt) != ATTNRES_OK) {
        snprintf(why, len, "unknown dtype '%s'", w->dtype ? w->dtype : "?");
        return -1;
    }
    attnres_problem_init(&tp->p, dt, w->d, w->n);
    tp->p.op = op;
    tp->p.heads = w->heads;
    tp->p.form = w->form && strcmp(w->form, "additive") == 0 ? ATTNRES_FORM_ADDITIVE : ATTNRES_FORM_REPLACE;
    tp->p.epilogue = w->epilogue;
    /* The database keeps phase 2's fused add as the form "fused" (plan.c);
     * a backward's fields are its forward's. */
    if (ar_op_forward(op) == ATTNRES_OP_PHASE2)
        tp->p.fuse_add = w->form && strcmp(w->form, "fused") == 0;
    if (ar_op_forward(op) == ATTNRES_OP_PHASE1)
        tp->p.s = w->s;
    tp->t = w->t_bucket;
    char msg[256];
    if (attnres_problem_check(&tp->p, msg, sizeof msg) != ATTNRES_OK) {
        snprintf(why, len, "the stored problem is not valid: %.200s", msg);
        return -1;
    }
    return 0;
}

/* Records a timing of candidate_id for the problem on this run's device
 * (bc: the problem timed, NULL where nothing was timed) and fills o's
 * figures from it. Returns the measurement's id, 0 when the write failed
 * (counted: the run fails). */
static int64_t record_timing(revalidation *r, int64_t problem_id, int64_t candidate_id, const char *build_key,
                             ardb_status status, const timing *tm, const bench_case *bc, double rel_err,
                             const char *message, int final_round, outcome *o)
{
    double rd = 0, wr = 0;
    if (bc)
        bench_case_traffic(bc, &rd, &wr);
    double gbps = tm && tm->median_us > 0 ? (rd + wr) / (tm->median_us * 1e3) : 0;
    double ceiling = device_ceilings_ceiling(&r->roof, rd, wr); /* the one matching the traffic */
    ardb_measurement m = {.run_id = r->run_id, .candidate_id = candidate_id, .problem_id = problem_id,
                          .device_id = r->device_id, .build_key = build_key, .status = status,
                          .median_us = tm ? tm->median_us : 0, .min_us = tm ? tm->min_us : 0,
                          .max_us = tm ? tm->max_us : 0, .spread_us = tm ? tm->spread_us : 0,
                          .reps = tm ? tm->reps : 0, .gbps = gbps,
                          .ceiling_fraction = ceiling > 0 ? gbps / ceiling : 0, .rel_err = rel_err,
                          .message = message, .final_round = final_round};
    int64_t mid = 0;
    o->status = status;
    o->median_us = m.median_us;
    o->fraction = m.ceiling_fraction;
    o->gbps = status == ARDB_STATUS_OK ? gbps : 0; /* only verified timings are checked */
    o->read_bytes = rd;
    o->write_bytes = wr;
    o->spread_us = m.spread_us;
    snprintf(o->message, sizeof o->message, "%s", message ? message : "");
    if (ardb_measurement_add(r->db, &m, &mid) != ARDB_DONE) {
        artuner_error("tune", "recording a measurement: %s", ardb_errmsg(r->db));
        r->unrecorded++;
        return 0;
    }
    o->measured = 1;
    return mid;
}

/* Records the stored winner's timing and, when it verified, makes it the
 * run's winner. */
static void record(revalidation *r, const ardb_stored_winner *w, const char *build_key, ardb_status status,
                   const timing *tm, const bench_case *bc, double rel_err, const char *message, outcome *o)
{
    int64_t mid = record_timing(r, w->problem_id, w->candidate_id, build_key, status, tm, bc, rel_err, message, 0, o);
    if (mid && status == ARDB_STATUS_OK &&
        ardb_winner_set(r->db, r->run_id, w->problem_id, r->device_id, w->candidate_id, mid) != ARDB_DONE) {
        artuner_error("tune", "recording the winner: %s", ardb_errmsg(r->db));
        r->unrecorded++;
    }
}

/* The stored winner as one of its final round's finalists: the fields
 * they share, borrowed from w. */
static ardb_stored_finalist as_finalist(const ardb_stored_winner *w)
{
    ardb_stored_finalist f = {.candidate_id = w->candidate_id, .measurement_id = w->measurement_id,
                              .variant = w->variant, .template_name = w->template_name,
                              .kernel_name = w->kernel_name, .params_json = w->params_json, .source = w->source,
                              .source_hash = w->source_hash, .median_us = w->median_us,
                              .spread_us = w->spread_us};
    return f;
}

/* The binary of a stored candidate for this device's build key: from the
 * database, else compiled from the stored source and stored. */
static int binary_for(revalidation *r, const ardb_stored_finalist *w, const char *build_key, void **blob, size_t *size,
                      char *why, size_t len)
{
    if (ardb_binary_get(r->db, build_key, blob, size) == ARDB_DONE)
        return 0;
    char *log = NULL;
    int st = r->dev->ops->compile(r->dev, w->source, w->kernel_name, blob, size, &log);
    if (st != ATTNRES_OK) {
        snprintf(why, len, "%.480s", log ? log : "compilation failed");
        free(log);
        return -1;
    }
    free(log);
    ardb_binary b = {.build_key = build_key, .candidate_id = w->candidate_id, .compiler = r->dev->compiler,
                     .options = r->dev->options, .target = r->dev->target, .blob = *blob, .size = *size};
    if (ardb_binary_put(r->db, &b) != ARDB_DONE) {
        artuner_error("tune", "storing the binary of %s: %s", w->variant, ardb_errmsg(r->db));
        r->unrecorded++;
    }
    return 0;
}

/* Beyond the largest cache: the winner interleaved with a streaming pass
 * that moves the same bytes (paired_stream.h), its fraction of the pass
 * into o and a note of it into message. The timing on record stays the
 * policy's. */
static void pair_round(revalidation *r, bench_case *bc, const job_kernel *jk, outcome *o, char *message,
                       size_t size)
{
    paired_stream *ps = NULL;
    char err[512];
    int got = paired_stream_for_case(r->dev, &r->roof, bc, &ps, err, sizeof err);
    if (got < 0)
        note(r, "  no streaming pass to pair with: %s", err);
    if (got <= 0)
        return;
    job_options opt = {.policy = r->policy, .pair = ps};
    job_result res;
    job_interleave(r->dev, bc, jk, 1, PAIR_ROUNDS, &opt, &res);
    if (res.status == ARDB_STATUS_OK && !isnan(res.paired)) {
        o->paired = res.paired;
        o->paired_spread = res.paired_spread;
        snprintf(message, size, "%.1f%% of a streaming pass at %.2f GB/s, interleaved for %d rounds",
                 100.0 * res.paired, res.pair_gbps, PAIR_ROUNDS);
    }
    paired_stream_free(r->dev, ps);
}

/* ---- deciding a provisional winner again -------------------------------- */

/* One finalist of a re-decision. */
typedef struct finalist {
    ardb_stored_finalist c; /* borrowed from the stored rows */
    char build_key[65];
    void *blob;
    size_t size;
    job_result check;       /* its verification */
    source_entry e;         /* what search_choose's tie-break reads */
    candidate_ref ref;
} finalist;

/* The notes of the retry policy go with the run's progress. */
static void redecide_note(void *ctx, const char *line)
{
    note(ctx, "  %s", line);
}

/* Says in o->message what the re-decision of w found and did, for the
 * table: the stored winner's failure if it had one, the disturbance it was
 * stored under, its time now, the winner recorded, and whether this round
 * was disturbed on every try too. */
static void describe_redecision(const ardb_stored_winner *w, outcome *o)
{
    char before[520] = "", now[64] = "", decided[320], again[280] = "";
    if (o->status != ARDB_STATUS_OK && o->message[0])
        snprintf(before, sizeof before, "%s; ", o->message);
    if (o->status == ARDB_STATUS_OK)
        snprintf(now, sizeof now, "; now %.2f us", o->median_us);
    if (!o->redecided)
        snprintf(decided, sizeof decided, "; no finalist verified, so no winner was recorded");
    else if (strcmp(o->decided, w->variant) == 0)
        snprintf(decided, sizeof decided, "; re-decided: %s (kept), of %zu finalist(s) timed interleaved", o->decided,
                 o->finalists);
    else
        snprintf(decided, sizeof decided, "; re-decided: %s at %.2f us, of %zu finalist(s) timed interleaved",
                 o->decided, o->decided_us, o->finalists);
    if (o->still_provisional)
        snprintf(again, sizeof again, "; disturbed again (%s): still provisional", o->evidence);
    snprintf(o->message, sizeof o->message, "%sstored under disturbance (%s)%s%s%s", before,
             w->disturbance ? w->disturbance : "no evidence recorded", now, decided, again);
}

/* Decides a provisional winner again, as the tuner's final round decided
 * it: the finalists that its round timed (ardb_stored_finalists; the
 * stored winner always among them) are verified, then timed interleaved
 * (final_interleave, with its retries), each timing recorded as one of a
 * final round, and the winner of that round (search_choose) recorded as
 * the run's: provisional again only if this round was disturbed on every
 * try too. o describes the stored winner, as for any other. */
static void redecide(revalidation *r, const ardb_stored_winner *w, const tune_problem *tp, size_t index,
                     outcome *o)
{
    ardb_stored_finalist *stored = NULL;
    size_t nstored = 0;
    if (ardb_stored_finalists(r->db, w->measurement_id, &stored, &nstored) != ARDB_DONE) {
        artuner_error("tune", "reading the finalists of %s: %s; its stored winner is timed alone", w->problem_key,
                  ardb_errmsg(r->db));
        stored = NULL;
        nstored = 0;
    }
    finalist *f = calloc(nstored + 1, sizeof *f);
    job_kernel *ks = calloc(nstored + 1, sizeof *ks);
    job_result *res = calloc(nstored + 1, sizeof *res);
    candidate_ref **refs = calloc(nstored + 1, sizeof *refs);
    size_t *slot = calloc(nstored + 1, sizeof *slot);
    bench_case *bc = NULL;
    paired_stream *pair = NULL;
    size_t n = 0;
    if (!f || !ks || !res || !refs || !slot) {
        record(r, w, NULL, ARDB_STATUS_LAUNCH_FAILED, NULL, NULL, NAN, "out of memory", o);
        goto done;
    }
    /* The stored winner first: its round may have left no final timing of
     * it (a file from elsewhere), and the table describes it. */
    f[n++].c = as_finalist(w);
    for (size_t i = 0; i < nstored; i++)
        if (stored[i].candidate_id != w->candidate_id)
            f[n++].c = stored[i];
    char err[512];
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(index + 1) * 0x9e3779b97f4a7c15ull;
    bc = bench_case_create(r->dev, tp, &r->policy, seed, err, sizeof err);
    if (!bc) {
        record(r, w, NULL, ARDB_STATUS_LAUNCH_FAILED, NULL, NULL, NAN, err, o);
        goto done;
    }
    /* Each finalist's binary for this device, as for a stored winner; the
     * others' figures go to scratch, since the table shows the stored one. */
    outcome scratch;
    size_t nk = 0;
    for (size_t i = 0; i < n; i++) {
        finalist *x = &f[i];
        outcome *to = i == 0 ? o : &scratch;
        char hash[65], why[512];
        ar_sha256_string(x->c.source ? x->c.source : "", hash);
        ar_build_key(r->dev, hash, x->build_key);
        if (!x->c.source || !x->c.source_hash || strcmp(hash, x->c.source_hash) != 0) {
            record_timing(r, w->problem_id, x->c.candidate_id, NULL, ARDB_STATUS_LAUNCH_FAILED, NULL, NULL, NAN,
                          x->c.source ? "the stored source does not match its hash"
                                      : "the database holds no source for it",
                          0, to);
            continue;
        }
        if (binary_for(r, &x->c, x->build_key, &x->blob, &x->size, why, sizeof why)) {
            record_timing(r, w->problem_id, x->c.candidate_id, NULL, ARDB_STATUS_COMPILE_FAILED, NULL, NULL, NAN, why,
                          0, to);
            continue;
        }
        ks[nk] = (job_kernel){.variant = x->c.variant, .kernel_name = x->c.kernel_name,
                              .params_json = x->c.params_json, .source = x->c.source, .build_key = x->build_key,
                              .blob = x->blob, .blob_size = x->size};
        slot[nk++] = i;
    }
    /* Verified first, on this build and fresh inputs, each in its own
     * measuring process: a finalist that no longer computes the problem
     * right is recorded so and left out of the round. */
    job_options check = {.verify = 1, .policy = r->policy, .time_limit_s = REDECIDE_TIME_LIMIT_S, .isolate = 1};
    check.policy.max_reps = 0;
    job_batch b = {.ks = ks, .k = nk, .opt = &check, .fastest_us = INFINITY};
    if (nk)
        job_measure_batch(r->dev, bc, &b, res);
    size_t nv = 0;
    for (size_t j = 0; j < nk; j++) {
        finalist *x = &f[slot[j]];
        x->check = res[j];
        if (res[j].status != ARDB_STATUS_OK) {
            record_timing(r, w->problem_id, x->c.candidate_id, x->build_key, res[j].status, NULL, NULL,
                          res[j].rel_err, res[j].message, 0, slot[j] == 0 ? o : &scratch);
            continue;
        }
        ks[nv] = ks[j];
        slot[nv++] = slot[j];
    }
    if (nv == 0) {
        describe_redecision(w, o);
        goto done;
    }
    /* The round, as the tuner's final round: interleaved, closed by a
     * streaming pass beyond the largest cache, timed again while other
     * work disturbs it. */
    if (paired_stream_for_case(r->dev, &r->roof, bc, &pair, err, sizeof err) < 0)
        note(r, "  no streaming pass to pair with: %s", err);
    job_options opt = {.verify = 0, .policy = r->policy, .time_limit_s = REDECIDE_TIME_LIMIT_S, .isolate = 1,
                       .pair = pair};
    final_verdict v;
    note(r, "  re-deciding the provisional winner: %zu finalist(s) timed interleaved", nv);
    final_interleave(r->dev, bc, ks, nv, &opt, r->probe, r->retries, redecide_note, r, res, &v);
    size_t nref = 0;
    for (size_t j = 0; j < nv; j++) {
        finalist *x = &f[slot[j]];
        outcome *to = slot[j] == 0 ? o : &scratch;
        char message[700];
        final_message(&res[j], nv, final_rounds(r->dev), message, sizeof message);
        if (res[j].message[0]) {
            size_t used = strlen(message);
            snprintf(message + used, sizeof message - used, ": %s", res[j].message);
        }
        const int ok = res[j].status == ARDB_STATUS_OK;
        int64_t mid = record_timing(r, w->problem_id, x->c.candidate_id, x->build_key, res[j].status,
                                    ok ? &res[j].tm : NULL, bc, x->check.rel_err, message, 1, to);
        to->paired = res[j].paired;
        to->paired_spread = res[j].paired_spread;
        if (!ok || !mid)
            continue;
        x->e.id = (char *)x->c.variant;
        x->e.json = (char *)x->c.params_json;
        x->e.candidate_id = x->c.candidate_id;
        x->ref = (candidate_ref){.e = &x->e, .measurement_id = mid, .status = ARDB_STATUS_OK,
                                 .median_us = res[j].tm.median_us, .spread_us = res[j].tm.spread_us,
                                 .final_round = 1};
        refs[nref++] = &x->ref;
    }
    char equivalent[1024];
    candidate_ref *best = nref ? search_choose(refs, nref, equivalent, sizeof equivalent) : NULL;
    if (best) {
        if (ardb_winner_set_ex(r->db, r->run_id, w->problem_id, r->device_id, best->e->candidate_id,
                               best->measurement_id, v.provisional ? v.disturbance : NULL) != ARDB_DONE) {
            artuner_error("tune", "recording the winner: %s", ardb_errmsg(r->db));
            r->unrecorded++;
        }
        o->redecided = 1;
        o->finalists = nv;
        snprintf(o->decided, sizeof o->decided, "%s", best->e->id);
        o->decided_us = best->median_us;
        o->still_provisional = v.provisional;
        snprintf(o->evidence, sizeof o->evidence, "%s", v.disturbance);
    }
    describe_redecision(w, o);
done:
    paired_stream_free(r->dev, pair);
    bench_case_free(bc);
    for (size_t i = 0; f && i < n; i++)
        free(f[i].blob);
    free(f);
    free(ks);
    free(res);
    free(refs);
    free(slot);
    ardb_stored_finalists_free(stored, nstored);
}

static void revalidate_one(revalidation *r, const ardb_stored_winner *w, size_t index, outcome *o)
{
    char hash[65], build_key[65], why[512];
    tune_problem tp;
    memset(o, 0, sizeof *o);
    o->median_us = NAN;
    o->paired = o->paired_spread = NAN;
    if (tune_problem_of(w, &tp, why, sizeof why)) {
        o->status = ARDB_STATUS_SKIPPED;
        snprintf(o->message, sizeof o->message, "%s", why);
        return;
    }
    if (w->provisional) {
        redecide(r, w, &tp, index, o);
        return;
    }
    ar_sha256_string(w->source ? w->source : "", hash);
    ar_build_key(r->dev, hash, build_key);
    if (!w->source || !w->source_hash || strcmp(hash, w->source_hash) != 0) {
        record(r, w, NULL, ARDB_STATUS_LAUNCH_FAILED, NULL, NULL, NAN,
               w->source ? "the stored source does not match its hash" : "the database holds no source for it", o);
        return;
    }
    void *blob = NULL;
    size_t size = 0;
    const ardb_stored_finalist self = as_finalist(w);
    if (binary_for(r, &self, build_key, &blob, &size, why, sizeof why)) {
        record(r, w, NULL, ARDB_STATUS_COMPILE_FAILED, NULL, NULL, NAN, why, o);
        return;
    }
    ar_kernel k;
    memset(&k, 0, sizeof k);
    memcpy(k.build_key, build_key, sizeof k.build_key);
    snprintf(k.variant, sizeof k.variant, "%s", w->variant);
    int st = r->dev->ops->load(r->dev, blob, size, w->source, w->kernel_name, w->params_json, &k);
    if (st != ATTNRES_OK) {
        free(blob);
        record(r, w, build_key, ARDB_STATUS_LAUNCH_FAILED, NULL, NULL, NAN, attnres_device_errmsg(r->dev), o);
        return;
    }
    char err[512];
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(index + 1) * 0x9e3779b97f4a7c15ull;
    bench_case *bc = bench_case_create(r->dev, &tp, &r->policy, seed, err, sizeof err);
    if (!bc) {
        record(r, w, build_key, ARDB_STATUS_LAUNCH_FAILED, NULL, NULL, NAN, err, o);
    } else {
        double rel_err = NAN;
        timing tm;
        ardb_status verdict = ARDB_STATUS_OK;
        if (bench_case_verify(bc, &k, &rel_err) != ATTNRES_OK) {
            record(r, w, build_key, ARDB_STATUS_LAUNCH_FAILED, NULL, NULL, NAN, attnres_device_errmsg(r->dev), o);
        } else if ((verdict = bench_case_judge(bc, rel_err, why, sizeof why)) != ARDB_STATUS_OK) {
            /* As in a tuning run. */
            record(r, w, build_key, verdict, NULL, NULL, rel_err, why, o);
        } else if (bench_case_time(bc, &k, &r->policy, &tm) != ATTNRES_OK) {
            record(r, w, build_key, ARDB_STATUS_LAUNCH_FAILED, NULL, NULL, rel_err, attnres_device_errmsg(r->dev), o);
        } else {
            job_kernel jk = {.variant = w->variant, .kernel_name = w->kernel_name, .params_json = w->params_json,
                             .source = w->source, .build_key = build_key, .blob = blob, .blob_size = size};
            char message[200] = "";
            pair_round(r, bc, &jk, o, message, sizeof message);
            record(r, w, build_key, ARDB_STATUS_OK, &tm, bc, rel_err, message[0] ? message : NULL, o);
        }
        bench_case_free(bc);
    }
    free(blob);
    if (r->dev->ops->unload)
        r->dev->ops->unload(r->dev, &k);
}

int revalidate_far(double stored_us, double now_us)
{
    if (!(stored_us > 0) || !(now_us > 0))
        return 0;
    double q = now_us / stored_us;
    return q > REVALIDATE_FAR || q < 1.0 / REVALIDATE_FAR;
}

/* Says how far a verified re-measure lies from its record where
 * revalidate_far holds: a winner recorded 3.6x slow in a disturbed minute
 * once re-measured as a bare "ok". 1 then, else 0 and "". */
static int far_from_record(const ardb_stored_winner *w, const outcome *o, char *buf, size_t len)
{
    buf[0] = 0;
    /* A provisional winner decided again says what was found and done
     * instead (describe_redecision). */
    if (o->redecided || o->status != ARDB_STATUS_OK || !revalidate_far(w->median_us, o->median_us))
        return 0;
    double q = o->median_us / w->median_us;
    snprintf(buf, len, "far from the record: now %.2fx %s (run %" PRId64 " or this one was disturbed, or the "
             "machine changed); tune the problem again",
             q > 1 ? q : 1.0 / q, q > 1 ? "slower" : "faster", w->run_id);
    return 1;
}

static void print_table(const revalidation *r, const ardb_stored_winner *w, const outcome *o, size_t n)
{
    char roof[320];
    device_ceilings_format(&r->roof, roof, sizeof roof);
    printf("\nre-validated winners on %s (%s)\n%s\n\n", r->dev->name, r->dev->backend, roof);
    printf("%-44s %-34s %6s %12s %12s %7s %9s %8s  %s\n", "problem", "variant", "from", "stored (us)", "now (us)",
           "ratio", "% ceiling", "% paired", "status");
    for (size_t i = 0; i < n; i++) {
        char now[32] = "-", ratio[32] = "-", frac[32] = "-", paired[32] = "-";
        if (o[i].status == ARDB_STATUS_OK) {
            snprintf(now, sizeof now, "%.2f", o[i].median_us);
            if (w[i].median_us > 0)
                snprintf(ratio, sizeof ratio, "%.3f", o[i].median_us / w[i].median_us);
            snprintf(frac, sizeof frac, "%.1f%%", 100.0 * o[i].fraction);
            if (o[i].paired > 0)
                snprintf(paired, sizeof paired, "%.1f%%", 100.0 * o[i].paired);
        }
        char far[256];
        far_from_record(&w[i], &o[i], far, sizeof far);
        printf("%-44s %-34s %6" PRId64 " %12.2f %12s %7s %9s %8s  %s%s%s%s%s\n", w[i].problem_key, w[i].variant,
               w[i].run_id, w[i].median_us, now, ratio, frac, paired, ardb_status_name(o[i].status),
               o[i].message[0] ? ": " : "", o[i].message, far[0] ? "; " : "", far);
    }
}

/* The out-of-cache check of tune's winners table (ceiling_check.h), over
 * the re-measured winners: a warning for each one above its ceiling, the
 * summary line, and the outcome recorded with the run. */
static void check_ceilings(revalidation *r, const ardb_stored_winner *w, const outcome *o, size_t n)
{
    ceiling_check c = {0};
    char line[768];
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        if (ceiling_check_winner(&r->roof, &c, w[i].problem_key, o[i].gbps, o[i].read_bytes, o[i].write_bytes,
                                 o[i].median_us, o[i].spread_us, o[i].paired, o[i].paired_spread, line,
                                 sizeof line))
            printf("%s\n", line);
        if (ceiling_check_paired(&c, w[i].problem_key, o[i].paired, o[i].paired_spread, line, sizeof line))
            printf("%s\n", line);
    }
    ceiling_check_summary(&c, line, sizeof line);
    printf("%s\n", line);
    char json[CEILING_CHECK_JSON_SIZE];
    ceiling_check_json(&r->roof, &c, json, sizeof json);
    if (ardb_run_set_ceilings(r->db, r->run_id, json) != ARDB_DONE) {
        artuner_error("tune", "recording the ceilings: %s", ardb_errmsg(r->db));
        r->unrecorded++;
    }
}

int tune_revalidate(const char *device_spec, const char *db_path, int quiet, int retries)
{
    revalidation r;
    memset(&r, 0, sizeof r);
    r.quiet = quiet;
    r.retries = retries;
    const char *spec = device_spec;
    char msg[1024];
    ardb_stored_winner *w = NULL;
    outcome *o = NULL;
    size_t n = 0, bad = 0;
    int exit_code = ARTUNER_EXIT_FAIL;

    if (!db_path)
        db_path = "attnres.db";
    if (!spec) {
        artuner_error("tune", "revalidation needs a device");
        return ARTUNER_EXIT_FAIL;
    }
    if (attnres_device_open(spec, &r.dev, msg, sizeof msg) != ATTNRES_OK) {
        artuner_error("tune", "cannot open device %s: %s", spec, msg);
        return ARTUNER_EXIT_FAIL;
    }
    if (ardb_open(db_path, 0, &r.db, msg, sizeof msg) != ARDB_DONE) {
        artuner_error("tune", "%s", msg);
        goto done;
    }
    ardb_device d = {.backend = r.dev->backend, .name = r.dev->name, .arch = r.dev->arch, .driver = r.dev->driver,
                     .fingerprint = r.dev->fingerprint, .units = r.dev->units, .memory = r.dev->memory,
                     .simulated = r.dev->simulated};
    if (ardb_stored_winners(r.db, &d, &w, &n) != ARDB_DONE) {
        artuner_error("tune", "reading the stored winners: %s", ardb_errmsg(r.db));
        goto done;
    }
    if (n == 0) {
        artuner_error("tune", "%s holds no winner for a %s device to re-validate; tune first", db_path,
                  r.dev->backend);
        goto done;
    }
    if (!(o = calloc(n, sizeof *o)))
        goto done;
    measure_policy_default(&r.policy, r.dev);
    if (device_ceilings_measure(r.dev, &r.roof) != ATTNRES_OK) {
        artuner_error("tune", "measuring the device: %s", attnres_device_errmsg(r.dev));
        goto done;
    }
    char probe_err[512];
    if (device_probe_create(r.dev, &r.roof, &r.probe, probe_err, sizeof probe_err) < 0)
        note(&r, "no streaming probe of the device: %s", probe_err);
    device_probe_read(r.dev, r.probe);
    if (ardb_device_upsert(r.db, &d, &r.device_id) != ARDB_DONE) {
        artuner_error("tune", "recording the device: %s", ardb_errmsg(r.db));
        goto done;
    }
    if (begin_run(&r, spec, db_path, w, n))
        goto done;
    note(&r, "re-validating %zu stored winner(s) on %s as run %" PRId64, n, r.dev->name, r.run_id);
    for (size_t i = 0; i < n; i++) {
        revalidate_one(&r, &w[i], i, &o[i]);
        bad += o[i].status != ARDB_STATUS_OK;
        note(&r, "[%zu/%zu] %s: %s %s%s%s", i + 1, n, w[i].problem_key, w[i].variant, ardb_status_name(o[i].status),
             o[i].redecided ? "; re-decided: " : "", o[i].redecided ? o[i].decided : "");
    }
    print_table(&r, w, o, n);
    check_ceilings(&r, w, o, n);
    if (ardb_run_finish(r.db, r.run_id, r.unrecorded ? "failed" : "complete") != ARDB_DONE) {
        artuner_error("tune", "recording the end of the run: %s", ardb_errmsg(r.db));
        r.unrecorded++;
    }
    size_t far = 0, provisional = 0, redecided = 0, still = 0;
    char why[256];
    for (size_t i = 0; i < n; i++) {
        far += (size_t)far_from_record(&w[i], &o[i], why, sizeof why);
        provisional += w[i].provisional != 0;
        redecided += o[i].redecided != 0;
        still += o[i].still_provisional != 0;
    }
    char decided[160] = "";
    if (provisional)
        snprintf(decided, sizeof decided, ", %zu of %zu provisional re-decided (%zu still provisional)", redecided,
                 provisional, still);
    printf("\nrun %" PRId64 ": %zu winner(s) re-validated, %zu not ok, %zu far from the record (beyond %.1fx either "
           "way)%s; database %s\n",
           r.run_id, n - bad, bad, far, REVALIDATE_FAR, decided, db_path);
    if (r.unrecorded)
        artuner_error("tune", "%zu result(s) could not be written to %s (above): the run is not complete", r.unrecorded,
                  db_path);
    exit_code = bad || r.unrecorded ? ARTUNER_EXIT_FAIL : ARTUNER_EXIT_OK;
done:
    free(o);
    ardb_stored_winners_free(w, n);
    ardb_close(r.db);
    device_probe_free(r.dev, r.probe);
    attnres_device_close(r.dev);
    return exit_code;
}
