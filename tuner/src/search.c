/*
 * search.c - one problem of a tuning run: collect its candidates, reuse
 * what the database knows, compile the rest, screen, measure, re-time the
 * finalists interleaved and record the winner (see docs/tuning.md).
 */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attnres-impl.h"
#include "tuner_base.h"
#include "ardb_tools.h"
#include "tune_session.h"
#include "final_round.h"
#include "isolate.h"
#include "paired_stream.h"

/* On a terminal, one line rewritten in place: counts and an ETA for the
 * problem at hand. Plain logs (files, CI) get only the per-problem lines. */
static void progress(const tuner *t, const char *desc, size_t done, size_t total, double started)
{
    if (t->opt.quiet || !isatty(2))
        return;
    double spent = artuner_now_s() - started;
    double eta = done ? spent / (double)done * (double)(total - done) : 0;
    fprintf(stderr, "\r\033[K  %s: %zu/%zu candidates, %.0f s, about %.0f s left", desc, done, total, spent, eta);
    if (done == total)
        fprintf(stderr, "\r\033[K");
}

/* ---- one problem ------------------------------------------------------ */

const char *artuner_strategy_name(strategy s)
{
    return s == STRATEGY_EXHAUSTIVE ? "exhaustive" : s == STRATEGY_RANDOM ? "random" : "halving";
}

/* bc: the problem timed, NULL where nothing was timed. */
static void record(tuner *t, int64_t problem_id, candidate_ref *c, const job_result *r, const bench_case *bc,
                   const char *stage)
{
    const timing *tm = r->status == ARDB_STATUS_OK ? &r->tm : NULL;
    double rd = 0, wr = 0;
    if (bc)
        bench_case_traffic(bc, &rd, &wr);
    double gbps = tm && tm->median_us > 0 ? (rd + wr) / (tm->median_us * 1e3) : 0;
    /* The fraction of the ceiling that matches the traffic (design §2). */
    double ceiling = device_ceilings_ceiling(&t->roof, rd, wr);
    char message[700];
    snprintf(message, sizeof message, "%s%s%s", stage, r->message[0] ? ": " : "", r->message);
    ardb_measurement m = {.run_id = t->run_id, .candidate_id = c->e->candidate_id, .problem_id = problem_id,
                          .device_id = t->device_id, .build_key = c->e->build_key, .status = r->status,
                          .median_us = tm ? tm->median_us : 0, .min_us = tm ? tm->min_us : 0,
                          .max_us = tm ? tm->max_us : 0, .spread_us = tm ? tm->spread_us : 0,
                          .reps = tm ? tm->reps : 0, .gbps = gbps,
                          .ceiling_fraction = ceiling > 0 ? gbps / ceiling : 0, .rel_err = r->rel_err,
                          .message = message, .final_round = c->final_round};
    if (ardb_measurement_add(t->db, &m, &c->measurement_id) != ARDB_DONE) {
        artuner_error("tune", "recording a measurement: %s", ardb_errmsg(t->db));
        t->unrecorded++;
    }
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
    *k = (job_kernel){.variant = e->id, .kernel_name = e->kernel, .params_json = e->json, .source = e->source,
                      .build_key = e->build_key, .blob = *blob, .blob_size = size};
    return 0;
}

/* Fills k with a candidate's kernel when it can be launched; otherwise
 * records why not (compile failure, pruned, binary missing) and returns -1. */
static int launchable(tuner *t, int64_t problem_id, candidate_ref *c, job_kernel *k, void **blob,
                      const char *stage)
{
    job_result r;
    memset(&r, 0, sizeof r);
    r.rel_err = NAN;
    *blob = NULL;
    if (c->e->compile_failed) {
        r.status = ARDB_STATUS_COMPILE_FAILED;
        snprintf(r.message, sizeof r.message, "%.480s", c->e->compile_log ? c->e->compile_log : "compilation failed");
        record(t, problem_id, c, &r, NULL, "compile");
        return -1;
    }
    if (c->e->pruned) {
        r.status = ARDB_STATUS_SKIPPED;
        snprintf(r.message, sizeof r.message, "pruned by its resource report: %s", c->e->resources);
        record(t, problem_id, c, &r, NULL, "compile");
        return -1;
    }
    if (job_kernel_for(t, c->e, k, blob)) {
        r.status = ARDB_STATUS_LAUNCH_FAILED;
        snprintf(r.message, sizeof r.message, "binary %s is missing from the database", c->e->build_key);
        record(t, problem_id, c, &r, NULL, stage);
        return -1;
    }
    return 0;
}

/* Records a measured candidate, its time going to stage `st` of the run's
 * breakdown (verification apart). */
static void measured(tuner *t, bench_case *bc, int64_t problem_id, candidate_ref *c, job_result *r,
                     const char *stage, tune_stage st, int verify)
{
    tune_stages_add(&t->stages, STAGE_VERIFY, r->verify_s, verify);
    tune_stages_add(&t->stages, st, r->time_s, 1);
    char stopped[200];
    if (r->cut) {
        t->stages.cut++;
        c->cut = 1;
    } else if (r->status == ARDB_STATUS_OK && r->tm.stopped) {
        snprintf(stopped, sizeof stopped, "%s (stopped after one timed launch, %.1fx slower than the fastest so far)",
                 stage, SEARCH_STOP_FACTOR);
        stage = stopped;
        t->stages.stopped++;
    }
    record(t, problem_id, c, r, bc, stage);
}

/* Candidates one measuring process takes in turn (isolate.h): enough that
 * its start and its first touch of the buffers are paid rarely (the
 * default preset's 2473 candidates in 80 processes, isolation 12.0 s,
 * against 206 and 15.6 s at 16 on the Zen 4 guest), few enough that a
 * time budget is checked every second or two. */
#define MEASURE_BATCH 48

/* How a list of candidates is measured: verified or not, by which policy,
 * with the screening's stop and cut rules or not, recorded under which
 * stage name and counted in which stage. */
typedef struct batch_plan {
    const measure_policy *pol;
    int verify, screening;
    const char *stage;
    tune_stage st;
} batch_plan;

/* Measures list[0..n) in batches and records them: each candidate not
 * reused, until the time budget runs out (counted from t0; 0: no budget).
 * fastest: the fastest median known before them (INFINITY: none). Returns
 * how many were left unmeasured when the time budget ran out. */
static size_t measure_list(tuner *t, bench_case *bc, int64_t problem_id, candidate_ref **list, size_t n,
                           const batch_plan *plan, double fastest, const char *desc, double t0)
{
    size_t fresh = 0, done = 0, skipped = 0;
    for (size_t i = 0; i < n; i++)
        fresh += !list[i]->reused;
    job_options opt = {.verify = plan->verify, .policy = *plan->pol, .time_limit_s = t->opt.time_limit_s,
                       .isolate = t->opt.isolate};
    double started = artuner_now_s();
    for (size_t i = 0; i < n;) {
        candidate_ref *batch[MEASURE_BATCH];
        job_kernel ks[MEASURE_BATCH];
        void *blobs[MEASURE_BATCH];
        job_result res[MEASURE_BATCH];
        size_t nb = 0;
        for (; i < n && nb < MEASURE_BATCH; i++) {
            if (list[i]->reused)
                continue;
            if (t0 > 0 && t->opt.budget_seconds > 0 && artuner_now_s() - t0 > t->opt.budget_seconds) {
                skipped++;
                continue;
            }
            if (launchable(t, problem_id, list[i], &ks[nb], &blobs[nb], plan->stage) == 0)
                batch[nb++] = list[i];
            else
                done++;
        }
        if (nb == 0)
            continue;
        if (desc)
            progress(t, desc, done, fresh, started);
        /* Launches long enough skip the warm-up after a process's first
         * candidate; only screening stops or cuts a candidate. */
        job_batch b = {.ks = ks, .k = nb, .opt = &opt, .fastest_us = fastest,
                       .stop_above = plan->screening ? search_stop_above : NULL,
                       .warm_once_above_us = SEARCH_WARM_ONCE_ABOVE_US,
                       .cut_after = plan->screening ? search_cut_after : NULL};
        double b0 = artuner_now_s();
        job_measure_batch(t->dev, bc, &b, res);
        double inside = 0;
        for (size_t j = 0; j < nb; j++) {
            inside += res[j].verify_s + res[j].time_s;
            measured(t, bc, problem_id, batch[j], &res[j], plan->stage, plan->st, plan->verify);
            if (batch[j]->status == ARDB_STATUS_OK && batch[j]->median_us < fastest)
                fastest = batch[j]->median_us;
            free(blobs[j]);
        }
        tune_stages_add(&t->stages, STAGE_ISOLATION, artuner_now_s() - b0 - inside, 1);
        done += nb;
    }
    if (desc)
        progress(t, desc, fresh, fresh, started);
    return skipped;
}

/* The first round: every candidate not on record, verified and timed by
 * pol (screening's stop and cut rules when `screening`), in batches.
 * Returns how many were left unmeasured when the time budget ran out. */
static size_t screen(tuner *t, bench_case *bc, int64_t problem_id, candidate_ref *cands, size_t n,
                     const measure_policy *pol, int screening, const char *stage, const char *desc, double t0)
{
    double fastest = INFINITY;
    candidate_ref **list = malloc((n ? n : 1) * sizeof *list);
    if (!list)
        return n;
    for (size_t i = 0; i < n; i++) {
        list[i] = &cands[i];
        if (cands[i].reused && cands[i].status == ARDB_STATUS_OK && cands[i].median_us < fastest)
            fastest = cands[i].median_us;
    }
    batch_plan plan = {pol, 1, screening, stage, screening ? STAGE_SCREENING : STAGE_FULL};
    size_t skipped = measure_list(t, bc, problem_id, list, n, &plan, fastest, desc, t0);
    free(list);
    return skipped;
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
        const argen_variant *v = t->variants[g];
        size_t nv = t->nvariants[g];
        for (size_t i = 0; i < nv; i++) {
            char why[512];
            int ok = argen_applies(t->templates[g], v[i].id, &ap, &ad, why, sizeof why);
            if (ok < 0) {
                artuner_error("tune", "%s", why);
                return -1;
            }
            if (!ok || seen++ % (size_t)t->opt.shard_count != (size_t)t->opt.shard_index)
                continue;
            if (!t->opt.no_prune) {
                int pruned = argen_prune(t->templates[g], v[i].id, &ap, &ad, why, sizeof why);
                if (pruned < 0) {
                    artuner_error("tune", "%s", why);
                    return -1;
                }
                if (pruned) {
                    t->stages.pruned++;
                    if (t->opt.explain_pruning)
                        artuner_log(t, "  pruned %s: %s", v[i].id, why);
                    continue;
                }
            }
            char spec[256];
            if (argen_specialize(t->templates[g], v[i].id, &ap, &ad, spec, sizeof spec) < 0) {
                artuner_error("tune", "%s", spec);
                return -1;
            }
            source_entry *e = artuner_source(t, t->templates[g], v[i].id, spec);
            candidate_ref *grown = e ? realloc(*out, (*count + 1) * sizeof *grown) : NULL;
            if (!grown)
                return -1;
            *out = grown;
            memset(&(*out)[*count], 0, sizeof **out);
            (*out)[*count].paired = (*out)[*count].paired_spread = (*out)[*count].pair_gbps = NAN;
            (*out)[(*count)++].e = e;
        }
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

int search_by_median(const void *a, const void *b)
{
    const candidate_ref *x = *(candidate_ref *const *)a, *y = *(candidate_ref *const *)b;
    return (x->median_us > y->median_us) - (x->median_us < y->median_us);
}

/* The interleaved final round re-times every candidate within a margin of
 * the best (at least two, at most six); differences below a fraction of the
 * fastest median are noise. Wide nets make two runs on one machine agree:
 * their equivalent sets share members, and the tie-break below is a fixed
 * order, so both pick the same one. */
#define FINALISTS_MAX 6
#define FINALIST_MARGIN 0.10 /* within 10% of the best full timing */
/* Equivalence: within the final round's noise of the fastest, never less
 * than 3% and never more than 5% of its median. The cap is the default
 * path's promise (the winner within 5% of the best it timed): a noisy
 * round once widened the window to 61% and a kernel 45% slower was chosen
 * (bench/results/cpu-small-t-2026-12-01.md), and a 10% cap let one 6%
 * slower win on 1.6% spreads. Final rounds are batched and scaled by round
 * (isolate.h), so their spreads are a few tenths of a percent where the
 * machine is quiet, and the floor decides. */
#define EQUIVALENT_FRACTION 0.03
#define EQUIVALENT_CAP 0.05

size_t search_halving_keep(size_t nok, int64_t budget_candidates)
{
    size_t keep = (nok + 3) / 4;
    if (keep < 3)
        keep = 3;
    if (budget_candidates > 0 && keep > (size_t)budget_candidates)
        keep = (size_t)budget_candidates;
    if (keep > nok)
        keep = nok;
    return keep;
}

int search_screening_disturbed(double *now, size_t nnow, double *before, size_t nbefore, double *now_median,
                               double *usual_median)
{
    *now_median = *usual_median = NAN;
    if (nnow < SCREEN_SPREAD_MIN_NOW || nbefore < SCREEN_SPREAD_MIN_BEFORE || nnow > INT_MAX || nbefore > INT_MAX)
        return 0;
    timing a, b;
    timing_summarize(now, (int)nnow, &a);
    timing_summarize(before, (int)nbefore, &b);
    *now_median = a.median_us;
    *usual_median = b.median_us;
    return a.median_us >= SCREEN_SPREAD_FLOOR && a.median_us >= SCREEN_SPREAD_FACTOR * b.median_us;
}

/* Judges the problem's screening just taken against the device's other
 * screenings of launches about as long (search_screening_disturbed) into
 * w, and logs a disturbed one. A database that cannot say is noted and
 * judged not. */
static void judge_screening(tuner *t, int64_t problem_id, const candidate_ref *cands, size_t n, winner_row *w)
{
    double *now = NULL, *before = NULL;
    size_t nnow = 0, nbefore = 0;
    w->screen_spread = w->screen_usual = NAN;
    double *medians = malloc((n ? n : 1) * sizeof *medians);
    int nm = 0;
    for (size_t i = 0; medians && i < n && i < INT_MAX; i++)
        if (!cands[i].reused && cands[i].status == ARDB_STATUS_OK && cands[i].median_us > 0)
            medians[nm++] = cands[i].median_us;
    timing typical = {0};
    if (nm)
        timing_summarize(medians, nm, &typical);
    free(medians);
    if (!(typical.median_us > 0))
        return;
    if (ardb_screening_spreads(t->db, problem_id, t->device_id, t->run_id, 0.5 * typical.median_us,
                               2.0 * typical.median_us, 4000, &now, &nnow, &before, &nbefore) != ARDB_DONE) {
        artuner_log(t, "  the screening's spread against earlier runs is not judged: %s", ardb_errmsg(t->db));
        return;
    }
    w->screen_disturbed =
        search_screening_disturbed(now, nnow, before, nbefore, &w->screen_spread, &w->screen_usual);
    if (w->screen_disturbed)
        artuner_log(t,
                 "  screening disturbed: its launches spread %.1f%% about their medians, %.1fx the usual %.1f%% "
                 "of launches as long on this device",
                 100.0 * w->screen_spread, w->screen_spread / w->screen_usual, 100.0 * w->screen_usual);
    free(now);
    free(before);
}

double search_stop_above(double fastest_us)
{
    return isfinite(fastest_us) && fastest_us >= SEARCH_STOP_MIN_US ? SEARCH_STOP_FACTOR * fastest_us : 0;
}

void search_round_policies(const measure_policy *full, const char *backend, int simulated,
                           measure_policy *screening, measure_policy *second)
{
    *screening = *second = *full;
    screening->warmup = 1;
    screening->target_ms = 0;
    screening->min_reps = screening->max_reps = simulated ? full->min_reps : 10;
    if (!simulated && strcmp(backend, "cpu") == 0) {
        screening->min_reps = SEARCH_SCREEN_MIN_REPS;
        screening->max_reps = full->max_reps;
        screening->target_ms = SEARCH_SCREEN_MS;
        if (second->target_ms > SEARCH_SECOND_MS)
            second->target_ms = SEARCH_SECOND_MS;
        if (second->max_reps < SEARCH_SECOND_MAX_REPS)
            second->max_reps = SEARCH_SECOND_MAX_REPS;
    }
}

double search_cut_after(double fastest_us, int launches)
{
    if (!(isfinite(fastest_us) && fastest_us > 0) || launches < 1)
        return 0;
    double us = SEARCH_CUT_FACTOR * fastest_us * launches;
    return us > SEARCH_CUT_FLOOR_US ? us : SEARCH_CUT_FLOOR_US;
}

/* Vector lanes, then threads: the screening order's prior. */
static int64_t lanes_first(const source_entry *e)
{
    int64_t lanes = ar_json_int(e->json, "vec", 1) * ar_json_int(e->json, "unroll", 1);
    int64_t threads = ar_json_int(e->json, "threads", 1);
    return lanes * 1000000 + (threads < 1000000 ? threads : 999999);
}

void search_order(candidate_ref *cands, size_t n, int64_t first_candidate_id)
{
    /* An insertion sort: stable, and n is a few hundred at most. */
    for (size_t i = 1; i < n; i++) {
        candidate_ref c = cands[i];
        int64_t key = lanes_first(c.e);
        int first = first_candidate_id && c.e->candidate_id == first_candidate_id;
        size_t j = i;
        while (j > 0) {
            const candidate_ref *p = &cands[j - 1];
            int p_first = first_candidate_id && p->e->candidate_id == first_candidate_id;
            if (p_first || (!first && lanes_first(p->e) >= key))
                break;
            cands[j] = cands[j - 1];
            j--;
        }
        cands[j] = c;
    }
}

size_t search_finalists(candidate_ref *const *ok, size_t nok)
{
    size_t k = 0;
    while (k < nok && k < FINALISTS_MAX &&
           (k < 2 || ok[k]->median_us <= ok[0]->median_us * (1.0 + FINALIST_MARGIN)))
        k++;
    return k;
}

/* Resources a variant holds, for breaking ties between equivalent
 * candidates: threads (CPU) or threads per block (GPU) first, then the
 * registers its vectors and accumulators take (vec x unroll). */
int64_t search_resources(const source_entry *e)
{
    int64_t threads = ar_json_int(e->json, "threads", 0);
    int64_t block = ar_json_int(e->json, "block", 0);
    int64_t lanes = ar_json_int(e->json, "vec", 1) * ar_json_int(e->json, "unroll", 1);
    return threads * 1000000000 + block * 1000 + lanes;
}

/* The winner among the final round: the candidates within the noise of the
 * fastest (between 3% and 5% of its median) are equivalent; of those, the
 * fewest resources, then the id. */
candidate_ref *search_choose(candidate_ref *const *fin, size_t k, char *equivalent, size_t len)
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
        if (!(noise >= EQUIVALENT_FRACTION * fastest->median_us)) /* also when a spread is unknown (NaN) */
            noise = EQUIVALENT_FRACTION * fastest->median_us;
        if (noise > EQUIVALENT_CAP * fastest->median_us)
            noise = EQUIVALENT_CAP * fastest->median_us;
        if (c->median_us - fastest->median_us > noise)
            continue;
        size_t used = strlen(equivalent);
        snprintf(equivalent + used, len - used, "%s%s", used ? ", " : "", c->e->id);
        if (!best || search_resources(c->e) < search_resources(best->e) ||
            (search_resources(c->e) == search_resources(best->e) && strcmp(c->e->id, best->e->id) < 0))
            best = c;
    }
    return best;
}

/* The pass that pairs with a problem's final round; NULL where none
 * matches or it cannot be prepared (then said in the log). */
static paired_stream *final_pair(tuner *t, const bench_case *bc)
{
    paired_stream *ps = NULL;
    char err[512];
    int got = paired_stream_for_case(t->dev, &t->roof, bc, &ps, err, sizeof err);
    if (got < 0)
        artuner_log(t, "  no streaming pass to pair with: %s", err);
    if (got > 0) {
        char pass[256];
        paired_stream_describe(ps, pass, sizeof pass);
        artuner_log(t, "  final round paired with a streaming pass: %s", pass);
    }
    return ps;
}

/* Where the notes of the final round's retry policy go: the run's log. */
static void final_note(void *ctx, const char *line)
{
    artuner_log(ctx, "  %s", line);
}

/* Re-times the best few candidates interleaved and records the results;
 * beyond the largest cache, a streaming pass that moves the same bytes
 * closes each round (paired_stream.h). A round the machine's other work
 * disturbed is timed again (tune_opts.retries, final_round.h); w says how
 * it went. */
static void final_round(tuner *t, bench_case *bc, int64_t problem_id, candidate_ref **fin, size_t k,
                        winner_row *w)
{
    job_kernel *ks = calloc(k, sizeof *ks);
    void **blobs = calloc(k, sizeof *blobs);
    candidate_ref **loaded = calloc(k, sizeof *loaded);
    size_t nk = 0;
    for (size_t i = 0; ks && blobs && loaded && i < k; i++)
        if (job_kernel_for(t, fin[i]->e, &ks[nk], &blobs[nk]) == 0)
            loaded[nk++] = fin[i];
    job_result *res = calloc(nk ? nk : 1, sizeof *res);
    paired_stream *pair = res && nk ? final_pair(t, bc) : NULL;
    if (res && nk) {
        job_options opt = {.verify = 0, .policy = t->policy, .time_limit_s = t->opt.time_limit_s,
                           .isolate = t->opt.isolate, .pair = pair};
        final_verdict v;
        final_interleave(t->dev, bc, ks, nk, &opt, t->probe, t->opt.retries, final_note, t, res, &v);
        w->disturbed = v.disturbed;
        w->provisional = v.provisional;
        snprintf(w->disturbance, sizeof w->disturbance, "%s", v.disturbance);
        for (size_t i = 0; i < nk; i++) {
            char stage[160];
            final_message(&res[i], nk, final_rounds(t->dev), stage, sizeof stage);
            loaded[i]->final_round = 1;
            loaded[i]->paired = res[i].paired;
            loaded[i]->paired_spread = res[i].paired_spread;
            loaded[i]->pair_gbps = res[i].pair_gbps;
            record(t, problem_id, loaded[i], &res[i], bc, stage);
        }
    }
    paired_stream_free(t->dev, pair);
    for (size_t i = 0; blobs && i < nk; i++)
        free(blobs[i]);
    free(res);
    free(ks);
    free(blobs);
    free(loaded);
}

int tune_problem_one(tuner *t, const tune_problem *tp, size_t index, size_t total, winner_row *w)
{
    char desc[160];
    problem_describe(tp, desc, sizeof desc);
    snprintf(w->problem, sizeof w->problem, "%s", desc);
    ardb_problem q;
    to_ardb_problem(tp, &q);
    int64_t problem_id;
    if (ardb_problem_upsert(t->db, &q, &problem_id) != ARDB_DONE) {
        artuner_error("tune", "recording problem: %s", ardb_errmsg(t->db));
        return -1;
    }
    candidate_ref *cands;
    size_t n;
    double g0 = artuner_now_s();
    size_t emitted = t->nsources;
    if (collect(t, tp, &cands, &n))
        return -1;
    tune_stages_add(&t->stages, STAGE_GENERATION, artuner_now_s() - g0, t->nsources - emitted);
    double t0 = artuner_now_s();
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
            cands[i].final_round = m.final_round;
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
            best = search_choose(fin, nf, equivalent, sizeof equivalent);
        /* A choice among timings that a disturbed final round took is no
         * surer now than when it was made: the winner stays provisional,
         * with that round's evidence, until a quiet round decides. */
        for (size_t i = 0; best && i < nf && !w->provisional; i++) {
            char *why = NULL;
            if (ardb_measurement_disturbance(t->db, fin[i]->measurement_id, &why) != ARDB_DONE) {
                artuner_error("tune", "reading whether a final round was disturbed: %s", ardb_errmsg(t->db));
                t->unrecorded++;
            } else if (why) {
                w->provisional = 1;
                snprintf(w->disturbance, sizeof w->disturbance, "%s", why);
            }
            free(why);
        }
        free(fin);
    }
    if (!best && n > 0) {
        if (tuner_ceilings_measure(t)) {
            free(todo);
            free(cands);
            return -1;
        }
        if (todo)
            artuner_compile_missing(t, todo, ntodo);
        bench_case *bc = NULL;
        char err[512];
        uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)index * 0x9e3779b97f4a7c15ull;
        bc = bench_case_create(t->dev, tp, &t->policy, seed, err, sizeof err);
        if (!bc) {
            artuner_error("tune", "%s: %s", desc, err);
            free(todo);
            free(cands);
            return -1;
        }
        /* Round 1: every new candidate, verified; cheaply timed when
         * halving, fully otherwise. */
        measure_policy quick, second;
        search_round_policies(&t->policy, t->dev->backend, t->dev->simulated, &quick, &second);
        int halving = t->opt.strategy == STRATEGY_HALVING;
        if (halving) {
            int64_t first = 0;
            if (ardb_winner_nearest_bucket(t->db, problem_id, t->device_id, &first) != ARDB_DONE)
                first = 0;
            search_order(cands, n, first);
        }
        size_t skipped = screen(t, bc, problem_id, cands, n, halving ? &quick : &t->policy, halving,
                                halving ? "screening" : "full", desc, t0);
        if (skipped)
            artuner_log(t, "  time budget spent: %zu candidate(s) left unmeasured", skipped);
        if (halving)
            judge_screening(t, problem_id, cands, n, w);
        candidate_ref **ok = malloc(n * sizeof *ok);
        size_t nok = 0;
        for (size_t i = 0; ok && i < n; i++)
            if (cands[i].status == ARDB_STATUS_OK && (cands[i].reused || cands[i].measurement_id))
                ok[nok++] = &cands[i];
        if (ok)
            qsort(ok, nok, sizeof *ok, search_by_median);
        /* Round 2 (halving): the best quarter, timed again by the second
         * round's policy. Candidates cut short were screened too, as the
         * slowest: they count. */
        if (halving && ok) {
            size_t screened = nok;
            for (size_t i = 0; i < n; i++)
                screened += cands[i].cut;
            size_t keep = search_halving_keep(screened, t->opt.budget_candidates);
            if (keep > nok)
                keep = nok;
            batch_plan full = {&second, 0, 0, "full", STAGE_FULL};
            measure_list(t, bc, problem_id, ok, keep, &full, nok ? ok[0]->median_us : INFINITY, NULL, 0);
            nok = keep;
            qsort(ok, nok, sizeof *ok, search_by_median);
        }
        /* Round 3: the best three, interleaved, decide. */
        size_t k = ok ? search_finalists(ok, nok) : 0;
        if (k > 0) {
            double f0 = artuner_now_s();
            final_round(t, bc, problem_id, ok, k, w);
            tune_stages_add(&t->stages, STAGE_FINAL, artuner_now_s() - f0, 1);
            best = search_choose(ok, k, equivalent, sizeof equivalent);
        }
        free(ok);
        bench_case_free(bc);
    }
    free(todo);
    if (best) {
        if (ardb_winner_set_ex(t->db, t->run_id, problem_id, t->device_id, best->e->candidate_id,
                               best->measurement_id, w->provisional ? w->disturbance : NULL) != ARDB_DONE) {
            artuner_error("tune", "recording the winner: %s", ardb_errmsg(t->db));
            t->unrecorded++;
        }
        double rd, wr;
        problem_traffic(tp, &rd, &wr);
        w->found = 1;
        snprintf(w->variant, sizeof w->variant, "%s", best->e->id);
        w->median_us = best->median_us;
        w->spread_us = best->spread_us;
        w->gbps = (rd + wr) / (best->median_us * 1e3);
        w->read_bytes = rd;
        w->write_bytes = wr;
        w->flops = problem_flops(tp);
        double ceiling = device_ceilings_ceiling(&t->roof, rd, wr);
        w->ceiling_fraction = ceiling > 0 ? w->gbps / ceiling : 0;
        w->paired = best->paired;
        w->paired_spread = best->paired_spread;
        w->pair_gbps = best->pair_gbps;
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += cands[i].status != ARDB_STATUS_OK && cands[i].status != ARDB_STATUS_SKIPPED;
    t->failed += bad;
    t->measured += n - reused;
    char tie[1100] = "";
    if (strchr(equivalent, ','))
        snprintf(tie, sizeof tie, " (equivalent: %s)", equivalent);
    artuner_log(t, "[%zu/%zu] %s: %zu candidate(s), %zu reused, %zu not ok, %.1f s; %s%s%s", index + 1, total, desc, n,
             reused, bad, artuner_now_s() - t0, best ? "winner " : "no winner", best ? best->e->id : "", tie);
    free(cands);
    return 0;
}
