/*
 * test_ceilings.c - the ceilings a timing is held to (tuner/src/device_ceilings.c,
 * docs/design.md §2), on synthetic figures: the time-based blend puts pure
 * reads at the read ceiling and equal reads and writes at the copy ceiling,
 * the out-of-cache check flags a winner above its ceiling beyond the noise
 * and no other, holding medians to the fastest streaming runs, and tallies
 * and records what it found (tuner/src/ceiling_check.c); a problem's traffic
 * splits its bytes exactly; and on the CPU device itself, that every
 * streaming kernel was measured on 1 and on all threads, and that its
 * largest cache is found by a read sweep where sysfs says far too much
 * (the figures themselves are timed in bench/ceilings.c, not here).
 */
#define _GNU_SOURCE /* nftw (test_scratch.h), mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attnres.h"
#include "ceiling_check.h"
#include "check.h"
#include "cpu_ceilings.h"
#include "problems.h"
#include "device_ceilings.h"
#include "test_scratch.h"

static int near(double a, double b) { return fabs(a - b) <= 1e-9 * fabs(b); }

static device_ceilings figures(double copy, double read)
{
    device_ceilings r = {.copy_gbps = copy, .read_gbps = read};
    r.ceil.fma_gflops = NAN;
    return r;
}

/* The AMD host of the report: reads alone faster than a copy. */
static void test_blend_read_above_copy(void)
{
    device_ceilings r = figures(46.5, 53.7);
    CHECK(near(device_ceilings_ceiling(&r, 1.0, 0.0), 53.7));
    CHECK(near(device_ceilings_ceiling(&r, 1.0, 1.0), 46.5));
    CHECK(near(device_ceilings_ceiling(&r, 5e8, 5e8), 46.5));
    /* 1 / w = 2 / copy - 1 / read */
    CHECK(near(device_ceilings_write_gbps(&r), 1.0 / (2.0 / 46.5 - 1.0 / 53.7)));
    /* Nine rows in, one out: between the two, nearer the read ceiling. */
    double mix = device_ceilings_ceiling(&r, 9.0, 1.0);
    CHECK(mix > 46.5 && mix < 53.7);
    CHECK(near(mix, 10.0 / (9.0 / 53.7 + 1.0 / device_ceilings_write_gbps(&r))));
    /* More reads, higher ceiling: the blend is monotonic in the mix. */
    CHECK(device_ceilings_ceiling(&r, 25.0, 1.0) > mix && device_ceilings_ceiling(&r, 2.0, 1.0) < mix);
}

/* An Intel host: reads at 60% of the copy (its stores cost no load
 * concurrency), so writes are cheap and a mostly-reading kernel is held to
 * about the read figure. */
static void test_blend_read_below_copy(void)
{
    device_ceilings r = figures(43.2, 26.1);
    CHECK(near(device_ceilings_ceiling(&r, 1.0, 0.0), 26.1));
    CHECK(near(device_ceilings_ceiling(&r, 1.0, 1.0), 43.2));
    double mix = device_ceilings_ceiling(&r, 9.0, 1.0);
    CHECK(mix > 26.1 && mix < 43.2);
}

/* A read figure below half the copy left bandwidth unused (a copy reads half
 * its bytes): the blend reads at copy / 2 and writes for free, so the copy
 * stays at its own ceiling. Without a read figure everything is held to the
 * copy; without a copy there is no ceiling. */
static void test_blend_edges(void)
{
    device_ceilings r = figures(40.0, 10.0);
    CHECK(isinf(device_ceilings_write_gbps(&r)));
    CHECK(near(device_ceilings_ceiling(&r, 1.0, 1.0), 40.0));
    CHECK(near(device_ceilings_ceiling(&r, 1.0, 0.0), 20.0));
    r = figures(40.0, NAN);
    CHECK(isnan(device_ceilings_write_gbps(&r)));
    CHECK(near(device_ceilings_ceiling(&r, 9.0, 1.0), 40.0) && near(device_ceilings_ceiling(&r, 1.0, 0.0), 40.0));
    r = figures(0.0, 20.0);
    CHECK(isnan(device_ceilings_ceiling(&r, 1.0, 1.0)));
}

/* Out of cache: four times the device's largest cache, 64 MiB by default.
 * Noise: twice the relative spread, at least 5%. */
static void test_out_of_cache_check(void)
{
    device_ceilings r = figures(46.5, 53.7);
    r.ceil.cache_bytes = 32.0 * 1048576;
    CHECK(!device_ceilings_out_of_cache(&r, 127.0 * 1048576));
    CHECK(device_ceilings_out_of_cache(&r, 128.0 * 1048576));
    r.ceil.cache_bytes = 0;
    CHECK(!device_ceilings_out_of_cache(&r, 255.0 * 1048576) && device_ceilings_out_of_cache(&r, 256.0 * 1048576));
    CHECK(near(device_ceilings_noise(100.0, 1.0), 0.05));
    CHECK(near(device_ceilings_noise(100.0, 10.0), 0.20));
    CHECK(near(device_ceilings_noise(0.0, 0.0), 0.05));
    /* The report's K3 f32 winner: 68.7 GB/s against the read ceiling. */
    CHECK(device_ceilings_above(68.7 / 53.7, device_ceilings_noise(17000.0, 300.0)));
    CHECK(!device_ceilings_above(1.04, 0.05) && device_ceilings_above(1.06, 0.05));
    CHECK(!device_ceilings_above(1.15, device_ceilings_noise(100.0, 10.0)));
}

/* The check holds a kernel's median to the fastest streaming runs, the
 * table to their medians: a kernel 10% above the median read ceiling (the
 * ceilings measured in a slow moment) is not flagged while it stays below
 * the fastest run, and is flagged above it. Without fastest runs (a backend
 * with two figures only) both are the same ceiling. */
static void test_check_uses_the_fastest_runs(void)
{
    device_ceilings r = figures(40.0, 30.0);
    CHECK(near(device_ceilings_fastest_ceiling(&r, 1.0, 0.0), 30.0));
    CHECK(near(device_ceilings_fastest_ceiling(&r, 9.0, 1.0), device_ceilings_ceiling(&r, 9.0, 1.0)));
    r.copy_best_gbps = 50.0;
    r.read_best_gbps = 40.0;
    CHECK(near(device_ceilings_ceiling(&r, 1.0, 0.0), 30.0));
    CHECK(near(device_ceilings_fastest_ceiling(&r, 1.0, 0.0), 40.0));
    CHECK(near(device_ceilings_fastest_ceiling(&r, 1.0, 1.0), 50.0));
    const double noise = device_ceilings_noise(100.0, 1.0);
    CHECK(device_ceilings_above(33.0 / device_ceilings_ceiling(&r, 1.0, 0.0), noise));
    CHECK(!device_ceilings_above(33.0 / device_ceilings_fastest_ceiling(&r, 1.0, 0.0), noise));
    CHECK(device_ceilings_above(43.0 / device_ceilings_fastest_ceiling(&r, 1.0, 0.0), noise));
    /* A fastest figure below the median one (not measured so) is ignored. */
    r.read_best_gbps = 20.0;
    CHECK(near(device_ceilings_fastest_ceiling(&r, 1.0, 0.0), 30.0));
}

static void test_traffic_splits_the_bytes(void)
{
    tune_problem tp = {.t = 4096};
    tp.p.op = ATTNRES_OP_MIX;
    tp.p.dtype = ATTNRES_DTYPE_F32;
    tp.p.d = 7168;
    tp.p.n = 9;
    tp.p.heads = 1;
    double rd, wr, td = 4096.0 * 7168, lse = 4096.0 * 4;
    problem_traffic(&tp, &rd, &wr);
    CHECK(near(rd, 9 * td * 4) && near(wr, td * 4) && near(rd + wr, problem_bytes(&tp)));
    CHECK(problem_flops(&tp) == 0);
    tp.p.form = ATTNRES_FORM_ADDITIVE;
    tp.p.epilogue = 1;
    problem_traffic(&tp, &rd, &wr);
    CHECK(near(rd, 10 * td * 4) && near(wr, 2 * td * 4));
    /* The backward recomputes the mix from the sources: it reads them and
     * dout, and writes their gradients and, additive, dpartial. */
    tp.p.op = ATTNRES_OP_MIX_BACKWARD;
    tp.p.epilogue = 0;
    problem_traffic(&tp, &rd, &wr);
    CHECK(near(rd, 10 * td * 4) && near(wr, 10 * td * 4) && near(problem_bytes(&tp), 20 * td * 4));
    tp.p.form = ATTNRES_FORM_REPLACE;
    problem_traffic(&tp, &rd, &wr);
    CHECK(near(rd, 10 * td * 4) && near(wr, 9 * td * 4));
    tp.p.op = ATTNRES_OP_PHASE2;
    tp.p.dtype = ATTNRES_DTYPE_BF16;
    tp.p.epilogue = 1;
    tp.p.fuse_add = 1;
    problem_traffic(&tp, &rd, &wr);
    CHECK(near(rd, 3 * td * 2 + lse) && near(wr, 3 * td * 2));
    tp.p.op = ATTNRES_OP_PHASE1;
    tp.p.epilogue = 0;
    tp.p.fuse_add = 0;
    tp.p.n = 8;
    tp.p.s = 24;
    tp.t = 64;
    problem_traffic(&tp, &rd, &wr);
    CHECK(near(rd, 8 * 64.0 * 7168 * 2) && near(wr, 24 * (64.0 * 7168 * 2 + 64.0 * 4)));
    CHECK(near(problem_flops(&tp), 8 * 64.0 * 7168 * (2 + 4 * 24)));
    /* Phase 1's backward reads the sources, the S sites' do1 and dlse rows
     * and writes the sources' gradients; per element and site two dots
     * and three multiply-adds. */
    tp.p.op = ATTNRES_OP_PHASE1_BACKWARD;
    problem_traffic(&tp, &rd, &wr);
    const double td64 = 64.0 * 7168, lse64 = 64.0 * 4;
    CHECK(near(rd, (8 + 24) * td64 * 2 + 24 * lse64) && near(wr, 8 * td64 * 2));
    CHECK(near(problem_flops(&tp), 8 * td64 * (3 + 10 * 24)));
    /* Phase 2's backward: o1, b, dout (and dnormed) and lse in; do1, db
     * (and dsublayer) and dlse out. */
    tp.p.op = ATTNRES_OP_PHASE2_BACKWARD;
    tp.p.n = 1;
    tp.p.s = 0;
    problem_traffic(&tp, &rd, &wr);
    CHECK(near(rd, 3 * td64 * 2 + lse64) && near(wr, 2 * td64 * 2 + lse64) && problem_flops(&tp) == 0);
    tp.p.epilogue = 1;
    tp.p.fuse_add = 1;
    problem_traffic(&tp, &rd, &wr);
    CHECK(near(rd, 4 * td64 * 2 + lse64) && near(wr, 3 * td64 * 2 + lse64));
}

/* The knee of a read sweep on synthetic rates: memory reads 50 GB/s (the
 * largest size); 2-32 MiB read 150-120 GB/s, 64 MiB 60 (a cache it half
 * fits: below 1.5 x 50 = 75), so the cache is 32 MiB. A sweep with no size
 * 1.5 times as fast as memory, or too short to have a memory rate, finds
 * none (0: the hint stands). */
static void test_cache_knee_of_a_read_sweep(void)
{
    const double mib = 1048576.0;
    double bytes[] = {2 * mib, 4 * mib, 8 * mib, 16 * mib, 32 * mib, 64 * mib, 128 * mib, 512 * mib};
    double gbps[] = {150, 150, 140, 130, 120, 60, 52, 50};
    CHECK(cpu_cache_knee(bytes, gbps, 8) == 32 * mib);
    /* The knee's lower side is the largest fast size, whatever lies below. */
    double dip[] = {40, 150, 140, 130, 120, 60, 52, 50};
    CHECK(cpu_cache_knee(bytes, dip, 8) == 32 * mib);
    double flat[] = {74, 70, 65, 60, 55, 52, 51, 50};
    CHECK(cpu_cache_knee(bytes, flat, 8) == 0);
    CHECK(cpu_cache_knee(bytes, gbps, 1) == 0);
    double unmeasured[] = {150, 150, 140, 130, 120, 60, 52, 0};
    CHECK(cpu_cache_knee(bytes, unmeasured, 8) == 0);
}

/* A fake sysfs under dir whose largest cache (level 3) is 480 MiB. */
static int fake_sysfs(const char *dir)
{
    const char *files[][2] = {{"index0/level", "1\n"}, {"index0/size", "48K\n"},
                              {"index3/level", "3\n"}, {"index3/size", "491520K\n"}};
    char path[512];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/index%d", dir, i * 3);
        if (mkdir(path, 0700))
            return -1;
    }
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i][0]);
        FILE *f = fopen(path, "w");
        if (!f || fputs(files[i][1], f) < 0 || fclose(f))
            return -1;
    }
    return 0;
}

/* The CPU device measures every kernel on one thread and on all of them,
 * and its ceilings are the best of each kind. Its sysfs here says 480 MiB
 * of cache (as one guest's did): the device records that as the hint and
 * takes the read sweep's size where the sweep finds one. Run alone
 * (ATTNRES_TEST_ALONE=1, tuner_cache_from_read_sweep in the full tier) the
 * sweep must find the cache that is there, far smaller, so that K3's
 * 587 MB problem counts as out of cache; beside other tests a busy minute
 * may hide the knee, and the hint then stands, as it should. */
static void test_cpu_device_measures_every_kernel(void)
{
    char dir[] = "/tmp/attnres-sysfs-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    REQUIRE(fake_sysfs(dir) == 0);
    setenv("ATTNRES_CPU_CACHE_SYSFS", dir, 1);
    attnres_device *dev = NULL;
    char msg[256];
    REQUIRE(attnres_device_open("cpu", &dev, msg, sizeof msg) == ATTNRES_OK);
    device_ceilings r;
    CHECK(device_ceilings_measure(dev, &r) == ATTNRES_OK);
    unsetenv("ATTNRES_CPU_CACHE_SYSFS");
    scratch_remove(dir);
    const double mib = 1048576.0;
    CHECK(r.ceil.cache_hint_bytes == 480 * mib);
    printf("  cache: sysfs %.0f MiB, read sweep %.0f MiB\n", r.ceil.cache_hint_bytes / mib,
           r.ceil.cache_measured / mib);
    CHECK(r.ceil.cache_bytes == (r.ceil.cache_measured > 0 ? r.ceil.cache_measured : r.ceil.cache_hint_bytes));
    const char *alone = getenv("ATTNRES_TEST_ALONE");
    if (alone && strcmp(alone, "1") == 0) {
        CHECK(r.ceil.cache_measured >= 2 * mib && r.ceil.cache_measured < 480 * mib);
        CHECK(device_ceilings_out_of_cache(&r, 587e6));
    }
    int read1 = 0, memcpy1 = 0, prefetch1 = 0, best_copy = 0, best_read = 0;
    for (int i = 0; i < r.ceil.n; i++) {
        const ar_ceiling_point *p = &r.ceil.pt[i];
        CHECK(p->gbps > 0 && p->threads >= 1 && p->threads <= dev->units);
        CHECK(p->best_gbps >= p->gbps); /* the fastest run is at least the median */
        read1 += p->kind == AR_CEILING_READ && p->threads == 1;
        memcpy1 += strcmp(p->kernel, "memcpy") == 0 && p->threads == 1;
        prefetch1 += strstr(p->kernel, "-prefetch") != NULL && p->threads == 1;
        best_copy += p->kind == AR_CEILING_COPY && p->gbps == r.copy_gbps;
        best_read += p->kind == AR_CEILING_READ && p->gbps == r.read_gbps;
    }
    /* One and eight streams, each with and without software prefetch; the
     * copy with non-temporal stores prefetches too where it exists. */
    CHECK(read1 == 4 && memcpy1 == 1 && best_copy >= 1 && best_read >= 1);
#if defined(__x86_64__)
    CHECK(prefetch1 == 3);
#else
    CHECK(prefetch1 == 2);
#endif
    CHECK(r.copy_best_gbps >= r.copy_gbps && r.read_best_gbps >= r.read_gbps);
    CHECK(r.ceil.fma_gflops > 0 && r.ceil.fma_threads >= 1);
    char json[DEVICE_CEILINGS_JSON_SIZE];
    device_ceilings_json(&r, json, sizeof json);
    CHECK(json[0] == '{' && json[strlen(json) - 1] == '}' && strstr(json, "\"kernel\": \"read-8streams\""));
    CHECK(strstr(json, "\"read_best_gbps\": ") && strstr(json, "\"best_gbps\": "));
    /* Both cache figures are recorded (to six digits), and read back. */
    device_ceilings back;
    CHECK(device_ceilings_from_record(json, r.copy_gbps, r.read_gbps, r.launch_us, &back) == 0);
    CHECK(fabs(back.ceil.cache_hint_bytes - 480 * mib) <= 1e-5 * 480 * mib);
    CHECK(fabs(back.ceil.cache_bytes - r.ceil.cache_bytes) <= 1e-5 * r.ceil.cache_bytes);
    CHECK(fabs(back.ceil.cache_measured - r.ceil.cache_measured) <= 1e-5 * r.ceil.cache_measured + 1e-9);
    attnres_device_close(dev);
}

/* The check's tally as tune and revalidate print and record it: winners in
 * cache and unverified ones (0 GB/s) are not counted, one above the fastest
 * run is, with a warning that names it, and the record carries the counts. */
static void test_check_tally_and_record(void)
{
    device_ceilings r = figures(40.0, 30.0);
    r.read_best_gbps = 32.0;
    r.ceil.cache_bytes = 1e6; /* out of cache from 4 MB */
    ceiling_check c = {0};
    char warning[512], line[640], json[CEILING_CHECK_JSON_SIZE];
    ceiling_check_summary(&c, line, sizeof line);
    CHECK(strcmp(line, "ceiling check: no out-of-cache winner") == 0);
    CHECK(!ceiling_check_winner(&r, &c, "in cache", 60.0, 1e6, 0, 100.0, 1.0, NAN, NAN, warning, sizeof warning));
    CHECK(!ceiling_check_winner(&r, &c, "unverified", 0.0, 1e8, 0, 100.0, 1.0, NAN, NAN, warning, sizeof warning));
    CHECK(c.checked == 0 && warning[0] == 0);
    CHECK(!ceiling_check_winner(&r, &c, "below", 27.0, 1e8, 0, 100.0, 1.0, NAN, NAN, warning, sizeof warning));
    CHECK(!ceiling_check_winner(&r, &c, "within the noise", 33.0, 1e8, 0, 100.0, 1.0, NAN, NAN, warning, sizeof warning));
    CHECK(ceiling_check_winner(&r, &c, "mix K3", 36.0, 1e8, 0, 100.0, 1.0, NAN, NAN, warning, sizeof warning));
    CHECK(strstr(warning, "mix K3 ran at 112% of the fastest streaming run") != NULL);
    CHECK(c.checked == 3 && c.over == 1 && near(c.max_fraction, 36.0 / 30.0) && near(c.max_fastest, 36.0 / 32.0));
    ceiling_check_summary(&c, line, sizeof line);
    CHECK(strstr(line, "3 out-of-cache winner(s), 1 above") && strstr(line, "highest 120% of the ceiling, 112%"));
    ceiling_check_json(&r, &c, json, sizeof json);
    CHECK(strstr(json, "\"check\": {\"out_of_cache\": 3, \"over\": 1, \"late\": 0, \"max_fraction\": 1.2000, "
                       "\"max_fraction_of_fastest\": 1.1250, \"paired\": 0, \"paired_over\": 0, "
                       "\"paired_median\": 0.0000}}") != NULL);
    ceiling_check_json(&r, NULL, json, sizeof json);
    CHECK(json[strlen(json) - 1] == '}' && !strstr(json, "\"check\""));
}

/* A winner above the fastest run of the run's start is over its ceiling
 * unless the streaming pass timed in its own rounds, the ceilings' kernels
 * again, moved its bytes as fast: then the start was a slow moment, and it
 * is counted apart with a note. A winner above its pass as well, or with no
 * pass, is over. */
static void test_check_holds_late_winners_to_their_pass(void)
{
    device_ceilings r = figures(40.0, 30.0);
    r.read_best_gbps = 32.0;
    r.ceil.cache_bytes = 1e6;
    ceiling_check c = {0};
    char note[512], line[640], json[CEILING_CHECK_JSON_SIZE];
    /* 36 GB/s is 112% of the fastest start run; 81% of its own pass. */
    CHECK(ceiling_check_winner(&r, &c, "mix K3", 36.0, 1e8, 0, 100.0, 1.0, 0.81, 0.01, note, sizeof note));
    CHECK(strstr(note, "note: mix K3 ran at 112% of the fastest streaming run of the run's start but at 81% "
                       "of the streaming pass") != NULL);
    CHECK(c.checked == 1 && c.over == 0 && c.late == 1);
    /* Within the pass's noise (2 x 4% spread): still late. */
    CHECK(ceiling_check_winner(&r, &c, "noisy pass", 36.0, 1e8, 0, 100.0, 1.0, 1.06, 0.04, note, sizeof note));
    CHECK(c.over == 0 && c.late == 2);
    /* Above its pass beyond the noise: over, with the warning. */
    CHECK(ceiling_check_winner(&r, &c, "phase2", 36.0, 1e8, 0, 100.0, 1.0, 1.20, 0.01, note, sizeof note));
    CHECK(strstr(note, "warning: phase2 ran at 112% of the fastest streaming run") != NULL);
    CHECK(c.checked == 3 && c.over == 1 && c.late == 2);
    /* Below the start's fastest run: neither, whatever its pass says. */
    CHECK(!ceiling_check_winner(&r, &c, "below", 27.0, 1e8, 0, 100.0, 1.0, 1.50, 0.01, note, sizeof note));
    CHECK(note[0] == 0 && c.checked == 4 && c.over == 1 && c.late == 2);
    ceiling_check_summary(&c, line, sizeof line);
    CHECK(strstr(line, "4 out-of-cache winner(s), 1 above the fastest streaming run beyond the noise, 2 above "
                       "that of the run's start but within their own streaming pass") != NULL);
    ceiling_check_json(&r, &c, json, sizeof json);
    CHECK(strstr(json, "\"out_of_cache\": 4, \"over\": 1, \"late\": 2,") != NULL);
}

/* A run's record holds every point a device can measure: the most points,
 * with the longest name and the widest figures, still make whole JSON with
 * the check's outcome (a cut record would lose the check and break its
 * readers), in the size the tuner gives it. */
static void test_record_of_every_point_is_whole(void)
{
    device_ceilings r = figures(99999.99, 99999.99);
    r.copy_best_gbps = r.read_best_gbps = 99999.99;
    r.ceil.fma_gflops = 999999.0;
    r.ceil.fma_threads = 4096;
    r.ceil.cache_bytes = r.ceil.cache_hint_bytes = r.ceil.cache_measured = 1e12;
    r.ceil.n = AR_CEILING_POINTS;
    for (int i = 0; i < AR_CEILING_POINTS; i++)
        r.ceil.pt[i] = (ar_ceiling_point){"read-8streams-prefetch", AR_CEILING_READ, 4096, 99999.99, 99999.99};
    ceiling_check c = {.checked = 999, .over = 999, .max_fraction = 99.9999, .max_fastest = 99.9999,
                       .paired = 64, .paired_over = 64};
    for (int i = 0; i < 64; i++)
        c.paired_fraction[i] = 99.9999;
    static char json[CEILING_CHECK_JSON_SIZE];
    ceiling_check_json(&r, &c, json, sizeof json);
    const size_t len = strlen(json);
    CHECK(len + 1 < sizeof json);
    CHECK(len > 2 && strcmp(json + len - 2, "}}") == 0 && strstr(json, "]")); /* the check closes it */
    int points = 0;
    for (const char *p = json; (p = strstr(p, "\"kernel\": ")) != NULL; p++)
        points++;
    CHECK(points == AR_CEILING_POINTS);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    RUN_CASE(test_blend_read_above_copy);
    RUN_CASE(test_blend_read_below_copy);
    RUN_CASE(test_blend_edges);
    RUN_CASE(test_out_of_cache_check);
    RUN_CASE(test_check_uses_the_fastest_runs);
    RUN_CASE(test_check_tally_and_record);
    RUN_CASE(test_check_holds_late_winners_to_their_pass);
    RUN_CASE(test_record_of_every_point_is_whole);
    RUN_CASE(test_traffic_splits_the_bytes);
    RUN_CASE(test_cache_knee_of_a_read_sweep);
    RUN_CASE(test_cpu_device_measures_every_kernel);
    CHECK_EXIT();
}
