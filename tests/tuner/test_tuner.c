/*
 * test_tuner.c - the tuner library's decisions on given timings, with no
 * kernel run and no clock read: the timing statistics (timing_summarize),
 * the halving keep count, who reaches the interleaved final round, the
 * resources a variant holds, the choice of the winner among candidates
 * whose timings are equivalent (tuner/src/search.c, docs/tuning.md) and
 * the final round's retries while other work disturbs it (final_round.h).
 *
 * Every expected value is worked out by hand in the comment of its case,
 * from the rule tune_session.h states, so that a change of a rule fails
 * here and not only as a different winner in a tuning run.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "disturbance.h"
#include "final_round.h"
#include "isolate.h"
#include "measure.h"
#include "revalidate.h"
#include "tune_session.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(a) + fabs(b) + 1); }

/* ---- timing statistics ------------------------------------------------ */

/* Whether timing_summarize of the n samples t gives the median, extremes
 * and spread given (and n repetitions); prints what it gave where not. A
 * spread of 0 must be exactly 0. */
static int summarizes_to(double *t, int n, double median, double min, double max, double spread)
{
    timing tm;
    timing_summarize(t, n, &tm);
    if (tm.reps == n && near(tm.median_us, median) && near(tm.min_us, min) && near(tm.max_us, max) &&
        (spread == 0 ? tm.spread_us == 0 : near(tm.spread_us, spread)))
        return 1;
    fprintf(stderr, "%d samples: reps %d, median %g, min %g, max %g, spread %g\n", n, tm.reps, tm.median_us,
            tm.min_us, tm.max_us, tm.spread_us);
    return 0;
}

static void timing_odd_count(void)
{
    /* Sorted: 1 2 3 4 100; median 3. Deviations |t - 3|: 2 1 0 1 97,
     * sorted 0 1 1 2 97; their median (the spread) is 1. The outlier moves
     * neither. */
    double t[] = {4, 100, 1, 3, 2};
    CHECK(summarizes_to(t, 5, 3, 1, 100, 1));
}

static void timing_even_count(void)
{
    /* Sorted: 10 12 14 20; median (12 + 14) / 2 = 13. Deviations 3 1 1 7,
     * sorted 1 1 3 7; spread (1 + 3) / 2 = 2. */
    double t[] = {20, 10, 14, 12};
    CHECK(summarizes_to(t, 4, 13, 10, 20, 2));
}

static void timing_one_sample(void)
{
    /* One sample is its own median and extremes, with no spread. */
    double t[] = {7.5};
    CHECK(summarizes_to(t, 1, 7.5, 7.5, 7.5, 0));
}

static void timing_constant_samples(void)
{
    /* Identical samples: no spread, whatever their number. */
    double t[8];
    for (int i = 0; i < 8; i++)
        t[i] = 2.25;
    timing tm;
    timing_summarize(t, 8, &tm);
    CHECK(near(tm.median_us, 2.25));
    CHECK(tm.spread_us == 0);
}

/* ---- candidates on given timings -------------------------------------- */

#define MAXC 16
static source_entry entries[MAXC];
static candidate_ref refs[MAXC];
static candidate_ref *ptrs[MAXC];

/* Whether search_choose over the first n candidates chooses `winner`,
 * with `equivalent` as the list of those equivalent to the fastest;
 * prints what it chose where not. */
static int chooses(size_t n, const char *winner, const char *equivalent)
{
    char eq[256];
    const candidate_ref *w = search_choose(ptrs, n, eq, sizeof eq);
    if (w && strcmp(w->e->id, winner) == 0 && strcmp(eq, equivalent) == 0)
        return 1;
    fprintf(stderr, "of %zu chose %s (equivalent: %s), not %s (equivalent: %s)\n", n, w ? w->e->id : "none",
            w ? eq : "-", winner, equivalent);
    return 0;
}
static char ids[MAXC][32], params[MAXC][128];

/* Candidate i: variant id, its parameters as JSON, status, median and
 * spread. */
static void set_candidate(int i, const char *id, const char *json, ardb_status status, double median,
                          double spread)
{
    memset(&entries[i], 0, sizeof entries[i]);
    memset(&refs[i], 0, sizeof refs[i]);
    snprintf(ids[i], sizeof ids[i], "%s", id);
    snprintf(params[i], sizeof params[i], "%s", json);
    entries[i].id = ids[i];
    entries[i].json = params[i];
    refs[i].e = &entries[i];
    refs[i].status = status;
    refs[i].median_us = median;
    refs[i].spread_us = spread;
    ptrs[i] = &refs[i];
}

static void sort_by_median(void)
{
    set_candidate(0, "c", "{}", ARDB_STATUS_OK, 30, 0);
    set_candidate(1, "a", "{}", ARDB_STATUS_OK, 10, 0);
    set_candidate(2, "d", "{}", ARDB_STATUS_OK, 40, 0);
    set_candidate(3, "b", "{}", ARDB_STATUS_OK, 20, 0);
    qsort(ptrs, 4, sizeof ptrs[0], search_by_median);
    CHECK(strcmp(ptrs[0]->e->id, "a") == 0);
    CHECK(strcmp(ptrs[1]->e->id, "b") == 0);
    CHECK(strcmp(ptrs[2]->e->id, "c") == 0);
    CHECK(strcmp(ptrs[3]->e->id, "d") == 0);
    /* Equal medians compare equal, in either order. */
    CHECK(search_by_median(&ptrs[0], &ptrs[0]) == 0);
    CHECK(search_by_median(&ptrs[0], &ptrs[1]) < 0);
    CHECK(search_by_median(&ptrs[1], &ptrs[0]) > 0);
}

static void halving_keep_count(void)
{
    /* A quarter, rounded up, at least three, never more than there are. */
    CHECK(search_halving_keep(0, 0) == 0);
    CHECK(search_halving_keep(1, 0) == 1);
    CHECK(search_halving_keep(2, 0) == 2);
    CHECK(search_halving_keep(3, 0) == 3);
    CHECK(search_halving_keep(10, 0) == 3);  /* (10 + 3) / 4 = 3 */
    CHECK(search_halving_keep(13, 0) == 4);  /* (13 + 3) / 4 = 4 */
    CHECK(search_halving_keep(40, 0) == 10);
    CHECK(search_halving_keep(41, 0) == 11);
    /* A candidate budget caps it, below the floor of three too; 0 is no
     * budget. */
    CHECK(search_halving_keep(40, 5) == 5);
    CHECK(search_halving_keep(40, 2) == 2);
    CHECK(search_halving_keep(40, 100) == 10);
    CHECK(search_halving_keep(2, 5) == 2);
}

static void screening_stops_far_behind_the_fastest(void)
{
    /* No fastest yet (the first candidate, or none timed right): never
     * stop. Else stop beyond one and a half times it, from 1 ms up. */
    CHECK(search_stop_above(INFINITY) == 0);
    CHECK(search_stop_above(NAN) == 0);
    CHECK(search_stop_above(0) == 0);
    CHECK(search_stop_above(-5) == 0);
    CHECK(search_stop_above(1000) == 1500);
    CHECK(search_stop_above(12500) == 18750);
    /* Below 1 ms one launch is too noisy to judge by: never stop. */
    CHECK(search_stop_above(999) == 0);
    CHECK(search_stop_above(2.0) == 0);
    /* A candidate within the finalists' margin of the fastest is never
     * stopped: the threshold lies beyond it. */
    CHECK(search_stop_above(2000) > 2000 * 1.10);
}

static void screening_cuts_launches_far_past_the_fastest(void)
{
    /* No fastest yet, or no launch: never cut. Else 4x the fastest per
     * launch before the stop decision (warm-up and first timed launch),
     * never sooner than 20 ms. */
    CHECK(search_cut_after(INFINITY, 2) == 0);
    CHECK(search_cut_after(NAN, 2) == 0);
    CHECK(search_cut_after(0, 2) == 0);
    CHECK(search_cut_after(1000, 0) == 0);
    CHECK(search_cut_after(12500, 1) == 50000);  /* 4 x 12.5 ms */
    CHECK(search_cut_after(12500, 2) == 100000); /* with a warm-up */
    CHECK(search_cut_after(2000, 2) == 20000);   /* 16 ms, raised to the floor */
    CHECK(search_cut_after(4, 2) == 20000);
    /* A launch the stop rule would still time again is never cut. */
    CHECK(search_cut_after(30000, 1) > search_stop_above(30000));
}

static void screening_order_puts_wide_variants_and_the_neighbour_first(void)
{
    /* Candidates 1-5 in template order with lanes (vec x unroll) and
     * threads: 1 (1x1, t1), 2 (16x1, t1), 3 (8x2, t2), 4 (1x1, t2),
     * 5 (16x1, t2). By lanes, then threads, most first, equals in template
     * order: 3 (16 lanes, t2) and 5 (16, t2) tie, template order keeps 3
     * before 5; then 2 (16, t1), 4 (1, t2), 1 (1, t1). */
    static source_entry e[5] = {
        {.candidate_id = 1, .json = "{\"vec\":1,\"unroll\":1,\"threads\":1}"},
        {.candidate_id = 2, .json = "{\"vec\":16,\"unroll\":1,\"threads\":1}"},
        {.candidate_id = 3, .json = "{\"vec\":8,\"unroll\":2,\"threads\":2}"},
        {.candidate_id = 4, .json = "{\"vec\":1,\"unroll\":1,\"threads\":2}"},
        {.candidate_id = 5, .json = "{\"vec\":16,\"unroll\":1,\"threads\":2}"},
    };
    candidate_ref c[5];
    memset(c, 0, sizeof c);
    for (int i = 0; i < 5; i++)
        c[i].e = &e[i];
    search_order(c, 5, 0);
    int64_t want[5] = {3, 5, 2, 4, 1};
    for (int i = 0; i < 5; i++)
        CHECK(c[i].e->candidate_id == want[i]);
    /* The nearest bucket's winner, 1 (the slowest by the prior), goes
     * first; the rest keep their order. */
    search_order(c, 5, 1);
    int64_t want_first[5] = {1, 3, 5, 2, 4};
    for (int i = 0; i < 5; i++)
        CHECK(c[i].e->candidate_id == want_first[i]);
    /* An id that is not among them changes nothing. */
    search_order(c, 5, 99);
    int64_t want_same[5] = {3, 5, 2, 4, 1};
    for (int i = 0; i < 5; i++)
        CHECK(c[i].e->candidate_id == want_same[i]);
}

static void round_policies_shorten_long_launches_on_the_cpu(void)
{
    /* The CPU's full policy: 2 warm-ups, 5-50 launches filling 150 ms. */
    measure_policy full = {.warmup = 2, .min_reps = 5, .max_reps = 50, .target_ms = 150};
    measure_policy scr, sec;
    search_round_policies(&full, "cpu", 0, &scr, &sec);
    /* Screening: one warm-up, as many launches as fill 20 ms, 3 to 50 (a
     * 13 ms launch gets 3, a 130 us one 50). */
    CHECK(scr.warmup == 1 && scr.min_reps == 3 && scr.max_reps == 50 && scr.target_ms == 20);
    /* Second round: 100 ms, 5 to 200 (13 ms launches: 7 instead of 11;
     * 100 us ones: 200 instead of 50). */
    CHECK(sec.warmup == 2 && sec.min_reps == 5 && sec.max_reps == 200 && sec.target_ms == 100);
    /* GPUs keep 10 screening launches and the full policy. */
    measure_policy gpu = {.warmup = 10, .min_reps = 20, .max_reps = 200, .target_ms = 50};
    search_round_policies(&gpu, "cuda", 0, &scr, &sec);
    CHECK(scr.min_reps == 10 && scr.max_reps == 10 && scr.target_ms == 0 && scr.warmup == 1);
    CHECK(sec.target_ms == 50 && sec.min_reps == 20);
    /* A simulated device: the full policy's three launches. */
    measure_policy sim = {.warmup = 1, .min_reps = 3, .max_reps = 3};
    search_round_policies(&sim, "cuda", 1, &scr, &sec);
    CHECK(scr.min_reps == 3 && scr.max_reps == 3);
}

static void interleaved_rounds_lose_their_common_disturbance(void)
{
    /* Three candidates, 100 110 120 us, five rounds; round 1 runs 1.5x
     * slow for all, in round 3 only candidate B is 1.2x slow (132). Round
     * levels (the median candidate): 110 165 110 120 110, typical 110.
     * Scaled, round 1 is 100 110 120 again; round 3 becomes 100 x 110/120
     * = 91.67, 132 x 110/120 = 121 and 120 x 110/120 = 110 (B's own
     * slowness stays B's). Medians 100, 110, 120; B's deviations 0 0 0 11
     * 0, spread 0. */
    double t[3 * 5] = {100, 150, 100, 100, 100, /* A */
                       110, 165, 110, 132, 110, /* B */
                       120, 180, 120, 120, 120}; /* C */
    int ok[3] = {1, 1, 1};
    interleave_normalize(t, ok, 3, 5);
    CHECK(near(t[1], 100) && near(t[6], 110) && near(t[11], 120));
    CHECK(near(t[3], 100.0 * 110 / 120) && near(t[8], 121) && near(t[13], 110));
    timing a, b, c;
    timing_summarize(t, 5, &a);
    timing_summarize(t + 5, 5, &b);
    timing_summarize(t + 10, 5, &c);
    CHECK(near(a.median_us, 100) && near(b.median_us, 110) && near(c.median_us, 120));
    CHECK(near(b.spread_us, 0));
    /* Two candidates: the geometric mean is the level. 100/121 in a round
     * at typical level 110 reads 100 x 110/110 = 100; 200/242 (twice as
     * slow, level 220) reads 100 and 121 too. */
    double two[2 * 2] = {100, 200, 121, 242};
    int ok2[2] = {1, 1};
    interleave_normalize(two, ok2, 2, 2);
    CHECK(near(two[0], two[1]) && near(two[2], two[3]) && near(two[2] / two[0], 1.21));
    /* One candidate (or one that failed beside it): nothing to scale by. */
    double one[2 * 3] = {100, 150, 130, 5, 5, 5};
    int ok1[2] = {1, 0};
    interleave_normalize(one, ok1, 2, 3);
    CHECK(near(one[0], 100) && near(one[1], 150) && near(one[2], 130) && near(one[3], 5));
}

static void finalists_within_margin(void)
{
    /* Sorted medians 100 105 109 110 111 200: 100, 105, 109 and 110 are
     * within 10% of 100 (110 <= 100 * 1.1); 111 is not, and the loop stops
     * there. */
    double med[] = {100, 105, 109, 110, 111, 200};
    for (int i = 0; i < 6; i++)
        set_candidate(i, "v", "{}", ARDB_STATUS_OK, med[i], 1);
    CHECK(search_finalists(ptrs, 6) == 4);
    CHECK(search_finalists(ptrs, 3) == 3);
    CHECK(search_finalists(ptrs, 0) == 0);
    CHECK(search_finalists(ptrs, 1) == 1);
}

static void finalists_at_least_two_at_most_six(void)
{
    /* Far apart, two still go (the fastest needs a rival to be timed
     * interleaved with). */
    set_candidate(0, "a", "{}", ARDB_STATUS_OK, 10, 0);
    set_candidate(1, "b", "{}", ARDB_STATUS_OK, 50, 0);
    set_candidate(2, "c", "{}", ARDB_STATUS_OK, 90, 0);
    CHECK(search_finalists(ptrs, 3) == 2);
    /* Ten all within the margin: six at most. */
    for (int i = 0; i < 10; i++)
        set_candidate(i, "v", "{}", ARDB_STATUS_OK, 100 + i * 0.1, 0);
    CHECK(search_finalists(ptrs, 10) == 6);
}

static void resources_from_parameters(void)
{
    source_entry e = {0};
    /* threads count before everything, block before the vector lanes. */
    e.json = "{\"threads\":2,\"vec\":4,\"unroll\":2}";
    CHECK(search_resources(&e) == 2 * 1000000000LL + 8);
    e.json = "{\"block\":256,\"vec\":2}";
    CHECK(search_resources(&e) == 256 * 1000LL + 2);
    e.json = "{}";
    CHECK(search_resources(&e) == 1); /* vec and unroll default to 1 */
    source_entry one_thread = {.json = "{\"threads\":1,\"vec\":16,\"unroll\":8}"};
    source_entry two_threads = {.json = "{\"threads\":2,\"vec\":1,\"unroll\":1}"};
    CHECK(search_resources(&one_thread) < search_resources(&two_threads));
}

static void choose_fewest_resources_among_equivalent(void)
{
    /* Fastest 100 us, spreads 0.5: noise 2 * (0.5 + 0.5) = 2, below the
     * floor of 3% of 100 = 3, so the window is 3 us. b (102) and c (102.9)
     * are equivalent to a; d (103.5) is not. Of a, b, c, b holds the
     * fewest resources. */
    set_candidate(0, "a", "{\"threads\":4}", ARDB_STATUS_OK, 100, 0.5);
    set_candidate(1, "b", "{\"threads\":1}", ARDB_STATUS_OK, 102, 0.5);
    set_candidate(2, "c", "{\"threads\":2}", ARDB_STATUS_OK, 102.9, 0.5);
    set_candidate(3, "d", "{}", ARDB_STATUS_OK, 103.5, 0.5); /* fewest resources, too slow */
    CHECK(chooses(4, "b", "a, b, c"));
}

static void choose_tie_break_by_id(void)
{
    /* Equal resources and equivalent timings: the smallest id wins, in
     * whatever order the candidates come, so two runs that time them
     * differently within the noise still agree. */
    char eq[256];
    const char *order[][3] = {{"v2", "v1", "v3"}, {"v3", "v2", "v1"}, {"v1", "v3", "v2"}};
    const double med[] = {50, 50.5, 51}; /* all within 3% of 50 */
    for (int o = 0; o < 3; o++) {
        for (int i = 0; i < 3; i++)
            set_candidate(i, order[o][i], "{\"threads\":1}", ARDB_STATUS_OK, med[i], 0.1);
        candidate_ref *w = search_choose(ptrs, 3, eq, sizeof eq);
        REQUIRE(w);
        CHECK(strcmp(w->e->id, "v1") == 0);
    }
}

static void choose_wide_spread_widens_equivalence(void)
{
    /* Spreads 1 and 1: noise 2 * (1 + 1) = 4 us, above the 3 us floor, so
     * b at 103.5 is equivalent to a at 100 and, holding fewer resources,
     * wins. With small spreads it is not equivalent and a wins. */
    set_candidate(0, "a", "{\"threads\":8}", ARDB_STATUS_OK, 100, 1);
    set_candidate(1, "b", "{\"threads\":1}", ARDB_STATUS_OK, 103.5, 1);
    CHECK(chooses(2, "b", "a, b"));
    refs[0].spread_us = refs[1].spread_us = 0.5;
    CHECK(chooses(2, "a", "a"));
}

static void choose_noisy_round_caps_equivalence(void)
{
    /* A noisy final round on the Zen 4 guest: the fastest at 16809 us
     * (spread 1977), the fewest-resources finalist at 24422 us (spread
     * 3177). Twice their spreads, 10308 us, would make the two equivalent
     * and choose the one 45% slower; the window stops at 5% of the
     * fastest, so the fastest wins. Just inside 5% still ties. */
    set_candidate(0, "v16_g8", "{\"threads\":2,\"vec\":16}", ARDB_STATUS_OK, 16809, 1977);
    set_candidate(1, "v8_g4", "{\"threads\":2,\"vec\":8}", ARDB_STATUS_OK, 24422, 3177);
    CHECK(chooses(2, "v16_g8", "v16_g8"));
    refs[1].median_us = 16809 * 1.049;
    CHECK(chooses(2, "v8_g4", "v16_g8, v8_g4"));
}

static void choose_unknown_spread_uses_the_floor(void)
{
    /* A spread that is not known (NaN, as for an imported timing) gives
     * the 3% floor, never an infinite or empty window: 102.5 is within 3 us
     * of 100, 103.5 is not. */
    set_candidate(0, "a", "{\"threads\":4}", ARDB_STATUS_OK, 100, NAN);
    set_candidate(1, "b", "{\"threads\":1}", ARDB_STATUS_OK, 102.5, NAN);
    set_candidate(2, "c", "{}", ARDB_STATUS_OK, 103.5, NAN);
    CHECK(chooses(3, "b", "a, b"));
}

static void choose_ignores_candidates_not_ok(void)
{
    /* A faster candidate that failed verification or timed out is neither
     * the fastest nor equivalent; with none ok there is no winner. */
    char eq[256];
    set_candidate(0, "fast_wrong", "{}", ARDB_STATUS_WRONG_RESULT, 1, 0);
    set_candidate(1, "ok_slow", "{\"threads\":4}", ARDB_STATUS_OK, 100, 0);
    set_candidate(2, "hung", "{}", ARDB_STATUS_TIMEOUT, 0, 0);
    CHECK(chooses(3, "ok_slow", "ok_slow"));
    refs[1].status = ARDB_STATUS_LAUNCH_FAILED;
    CHECK(search_choose(ptrs, 3, eq, sizeof eq) == NULL);
    CHECK(search_choose(ptrs, 0, eq, sizeof eq) == NULL);
}

static void choose_equivalent_list_is_bounded(void)
{
    /* The list of equivalent ids is cut to the buffer, never overrun; the
     * winner is the same as with room for all. */
    char small[8], big[256];
    for (int i = 0; i < 6; i++) {
        char id[16];
        snprintf(id, sizeof id, "variant%d", 5 - i);
        set_candidate(i, id, "{}", ARDB_STATUS_OK, 10, 0);
    }
    memset(small, 'x', sizeof small);
    candidate_ref *a = search_choose(ptrs, 6, small, sizeof small);
    candidate_ref *b = search_choose(ptrs, 6, big, sizeof big);
    REQUIRE(a && b);
    CHECK(a == b);
    CHECK(strcmp(a->e->id, "variant0") == 0);
    CHECK(memchr(small, 0, sizeof small) != NULL);
    CHECK(strncmp(big, small, strlen(small)) == 0);
}

/* ---- disturbance ------------------------------------------------------ */

static double clock_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *spin_300ms(void *arg)
{
    (void)arg;
    volatile unsigned long x = 0;
    for (double end = clock_s() + 0.3; clock_s() < end;)
        x++;
    return NULL;
}

static void disturbance_rule_on_given_figures(void)
{
    /* Waits of 20% of the window, or steal of 5%, are a disturbance;
     * unknown (NaN) figures are none; preemptions only inform. */
    disturbance d = {0.199, 0.049, 5000, NAN, NAN};
    CHECK(!disturbance_found(&d));
    d.wait_frac = 0.20;
    CHECK(disturbance_found(&d));
    d = (disturbance){NAN, 0.05, NAN, NAN, NAN};
    CHECK(disturbance_found(&d));
    d = (disturbance){NAN, NAN, NAN, NAN, NAN};
    CHECK(!disturbance_found(&d));
    char text[160];
    d = (disturbance){0.25, NAN, NAN, NAN, NAN};
    disturbance_describe(&d, text, sizeof text);
    CHECK(strcmp(text, "threads waited 25% of the window for a CPU, steal unknown") == 0);
    d = (disturbance){0.5, 0.0, 699.4, NAN, NAN};
    disturbance_describe(&d, text, sizeof text);
    CHECK(strcmp(text, "threads waited 50% of the window for a CPU, 0% stolen, 699 preemptions/s") == 0);
    /* The device's streaming pass 1.25 times slower than the run's usual
     * or more is one too, with quiet threads; 0 or NaN is no reading. */
    d = (disturbance){0.01, 0.0, 10, 42.3, 67.1};
    CHECK(disturbance_found(&d));
    disturbance_describe(&d, text, sizeof text);
    CHECK(strcmp(text, "threads waited 1% of the window for a CPU, 0% stolen, 10 preemptions/s, copy pass at "
                       "42.3 GB/s against the run's usual 67.1") == 0);
    d.stream_gbps = 54.0; /* 0.80 of the first */
    CHECK(!disturbance_found(&d));
    d.stream_gbps = 53.6; /* 1.252 times slower */
    CHECK(disturbance_found(&d));
    d.stream_gbps = 0;
    CHECK(!disturbance_found(&d));
    d = (disturbance){0.01, 0.0, 10, 10.0, NAN};
    CHECK(!disturbance_found(&d));
    disturbance_describe(&d, text, sizeof text);
    CHECK(strstr(text, "copy pass") == NULL);
}

static void more_busy_threads_than_cpus_are_a_disturbance(void)
{
    /* One more spinning thread than there are CPUs: at every moment one of
     * them waits for a CPU, so the window's waits add up to at least most
     * of a CPU-second per second, whatever else the machine runs. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    REQUIRE(cpus >= 1 && cpus < 256);
    pthread_t th[256];
    disturbance_mark m;
    disturbance_begin(&m);
    REQUIRE(m.readable);
    for (long i = 0; i <= cpus; i++)
        REQUIRE(pthread_create(&th[i], NULL, spin_300ms, NULL) == 0);
    /* Read while they spin: a thread that has ended takes its waits with it. */
    usleep(200000);
    disturbance d = disturbance_end(&m);
    for (long i = 0; i <= cpus; i++)
        pthread_join(th[i], NULL);
    printf("  %ld CPUs, %ld spinning threads: waits %.2f CPU-s/s, steal %.3f\n", cpus, cpus + 1, d.wait_frac,
           d.steal_frac);
    CHECK(d.wait_frac >= 0.5 && disturbance_found(&d));
    /* A window in which this process sleeps waits for nothing. */
    disturbance_begin(&m);
    usleep(200000);
    d = disturbance_end(&m);
    CHECK(d.wait_frac >= 0 && d.wait_frac < DISTURBANCE_WAIT);
}

static void screening_spread_against_the_problems_usual(void)
{
    /* Ten screenings spreading 12% against forty earlier ones of 3%: 4x,
     * and above the 5% floor, so disturbed; the medians come back. */
    double now[10], before[40], a = 0, b = 0;
    for (int i = 0; i < 10; i++)
        now[i] = 0.12;
    for (int i = 0; i < 40; i++)
        before[i] = 0.03;
    CHECK(search_screening_disturbed(now, 10, before, 40, &a, &b) && fabs(a - 0.12) < 1e-12 &&
          fabs(b - 0.03) < 1e-12);
    /* 2.9x is not; nor is 4x below the floor (a quiet problem of long
     * launches that spreads 1.2% against 0.3%). */
    for (int i = 0; i < 10; i++)
        now[i] = 0.087;
    for (int i = 0; i < 40; i++)
        before[i] = 0.03;
    CHECK(!search_screening_disturbed(now, 10, before, 40, &a, &b));
    for (int i = 0; i < 10; i++)
        now[i] = 0.012;
    for (int i = 0; i < 40; i++)
        before[i] = 0.003;
    CHECK(!search_screening_disturbed(now, 10, before, 40, &a, &b));
    /* Too few of either to judge: not disturbed, medians NaN. */
    for (int i = 0; i < 10; i++)
        now[i] = 0.5;
    for (int i = 0; i < 40; i++)
        before[i] = 0.01;
    CHECK(!search_screening_disturbed(now, 9, before, 40, &a, &b) && isnan(a) && isnan(b));
    CHECK(!search_screening_disturbed(now, 10, before, 29, &a, &b) && isnan(a));
    CHECK(search_screening_disturbed(now, 10, before, 30, &a, &b));
}

/* ---- the final round's retries (final_round.h) ------------------------ */

/* A round whose tries show the given figures in turn (the last repeats). */
typedef struct scripted_round {
    const disturbance *figures;
    int count, tries;
} scripted_round;

static disturbance scripted_try(void *ctx)
{
    scripted_round *s = ctx;
    disturbance d = s->figures[s->tries < s->count ? s->tries : s->count - 1];
    s->tries++;
    return d;
}

typedef struct noted {
    char text[2048];
    int lines;
} noted;

static void take_note(void *ctx, const char *line)
{
    noted *n = ctx;
    size_t used = strlen(n->text);
    snprintf(n->text + used, sizeof n->text - used, "%s\n", line);
    n->lines++;
}

static void final_round_is_timed_again_while_disturbed(void)
{
    /* Waits of 55% of the window are a disturbance, 3% are not; steal of
     * 8% is one (disturbance_found). */
    const disturbance quiet = {0.03, 0.0, 50, NAN, NAN}, busy = {0.55, 0.0, 900, NAN, NAN},
                      stolen = {0.02, 0.08, 20, NAN, NAN};
    final_verdict v;
    noted n;

    /* Quiet at once: one try, nothing said. */
    memset(&n, 0, sizeof n);
    scripted_round s = {(const disturbance[]){quiet}, 1, 0};
    final_retry(scripted_try, &s, 2, 0, 1, take_note, &n, &v);
    CHECK(s.tries == 1 && v.tries == 1 && v.disturbed == 0 && !v.provisional && v.disturbance[0] == 0 &&
          n.lines == 0);

    /* Disturbed, then quiet: timed again once; the winner is not
     * provisional, and the evidence of the disturbed try is kept for the
     * run's `disturbed:` line. */
    memset(&n, 0, sizeof n);
    s = (scripted_round){(const disturbance[]){busy, quiet}, 2, 0};
    final_retry(scripted_try, &s, 2, 0, 1, take_note, &n, &v);
    CHECK(v.tries == 2 && v.disturbed == 1 && !v.provisional);
    CHECK(strcmp(v.disturbance, "threads waited 55% of the window for a CPU, 0% stolen, 900 preemptions/s") == 0);
    CHECK(strcmp(n.text, "final round disturbed (threads waited 55% of the window for a CPU, 0% stolen, 900 "
                         "preemptions/s): timed again in 0 s\n") == 0);

    /* Disturbed on every try: two retries, then the last try is recorded
     * and its winner is provisional, with that try's evidence. */
    memset(&n, 0, sizeof n);
    s = (scripted_round){(const disturbance[]){busy, stolen, busy}, 3, 0};
    final_retry(scripted_try, &s, 2, 0, 1, take_note, &n, &v);
    CHECK(s.tries == 3 && v.tries == 3 && v.disturbed == 3 && v.provisional);
    CHECK(strncmp(v.disturbance, "threads waited 55%", 18) == 0);
    CHECK(n.lines == 3 && strstr(n.text, "(threads waited 2% of the window for a CPU, 8% stolen, 20 preemptions/s): "
                                         "timed again in 0 s\n") &&
          strstr(n.text, "900 preemptions/s); its winner is provisional\n"));

    /* No retries (--retries 0, as the test suite tunes): the first
     * disturbed try decides, provisional. */
    s = (scripted_round){(const disturbance[]){stolen}, 1, 0};
    final_retry(scripted_try, &s, 0, 0, 1, NULL, NULL, &v);
    CHECK(s.tries == 1 && v.disturbed == 1 && v.provisional && strstr(v.disturbance, "8% stolen"));

    /* A device not watched (a simulated one, whose times are a model):
     * one try, never disturbed. */
    memset(&n, 0, sizeof n);
    s = (scripted_round){(const disturbance[]){busy}, 1, 0};
    final_retry(scripted_try, &s, 2, 0, 0, take_note, &n, &v);
    CHECK(s.tries == 1 && v.disturbed == 0 && !v.provisional && n.lines == 0);
}

static void final_round_message_names_the_round(void)
{
    /* The first word is "final": readers of files before schema v8 tell a
     * final timing by it. */
    job_result r;
    memset(&r, 0, sizeof r);
    r.paired = NAN;
    char text[160];
    final_message(&r, 3, 15, text, sizeof text);
    CHECK(strcmp(text, "final (interleaved with 3, 15 rounds)") == 0);
    r.paired = 0.5;
    r.pair_gbps = 40;
    final_message(&r, 2, 31, text, sizeof text);
    CHECK(strcmp(text, "final (interleaved with 2, 31 rounds; 50.0% of a streaming pass at 40.00 GB/s in the same "
                       "rounds)") == 0);
}

static void revalidation_flags_a_record_far_from_now(void)
{
    /* Beyond 1.5x either way: 690 us on record, 193 now (3.6x faster) is
     * far, as is twice as slow; 1.4x and 1/1.4x are not. Times that are not
     * positive (an unverified re-measure) never are. */
    CHECK(revalidate_far(690, 193));
    CHECK(revalidate_far(100, 200));
    CHECK(!revalidate_far(100, 140) && !revalidate_far(140, 100));
    CHECK(!revalidate_far(100, 0) && !revalidate_far(0, 100) && !revalidate_far(NAN, 100));
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN_CASE(timing_odd_count);
    RUN_CASE(timing_even_count);
    RUN_CASE(timing_one_sample);
    RUN_CASE(timing_constant_samples);
    RUN_CASE(sort_by_median);
    RUN_CASE(halving_keep_count);
    RUN_CASE(screening_stops_far_behind_the_fastest);
    RUN_CASE(screening_cuts_launches_far_past_the_fastest);
    RUN_CASE(screening_order_puts_wide_variants_and_the_neighbour_first);
    RUN_CASE(round_policies_shorten_long_launches_on_the_cpu);
    RUN_CASE(interleaved_rounds_lose_their_common_disturbance);
    RUN_CASE(finalists_within_margin);
    RUN_CASE(finalists_at_least_two_at_most_six);
    RUN_CASE(resources_from_parameters);
    RUN_CASE(choose_fewest_resources_among_equivalent);
    RUN_CASE(choose_tie_break_by_id);
    RUN_CASE(choose_wide_spread_widens_equivalence);
    RUN_CASE(choose_noisy_round_caps_equivalence);
    RUN_CASE(choose_unknown_spread_uses_the_floor);
    RUN_CASE(choose_ignores_candidates_not_ok);
    RUN_CASE(choose_equivalent_list_is_bounded);
    RUN_CASE(disturbance_rule_on_given_figures);
    RUN_CASE(more_busy_threads_than_cpus_are_a_disturbance);
    RUN_CASE(screening_spread_against_the_problems_usual);
    RUN_CASE(final_round_is_timed_again_while_disturbed);
    RUN_CASE(final_round_message_names_the_round);
    RUN_CASE(revalidation_flags_a_record_far_from_now);
    CHECK_EXIT();
}
