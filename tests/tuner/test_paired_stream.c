/*
 * test_paired_stream.c - the streaming pass a kernel is timed next to
 * (tuner/src/paired_stream.c, the CPU backend's stream_pass): which kernels
 * and bytes the pass takes from a run's ceilings, that a pass really copies
 * and reads what its steps say and refuses steps it cannot run, that the
 * interleaved rounds report a kernel's fraction of the pass (in process and
 * from a forked child), the paired check's tally (ceiling_check.c), and the
 * device probe that a final round is held to (device_probe.h).
 * Nothing here holds a timing to a figure: timings are benchmarks' work.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "argen.h"
#include "attnres.h"
#include "ceiling_check.h"
#include "check.h"
#include "device_probe.h"
#include "final_round.h"
#include "isolate.h"
#include "measure.h"
#include "paired_stream.h"
#include "device_ceilings.h"
#include "test_device.h"
#include "test_stream_steps.h"

#ifndef TEMPLATE_DIR
#error "TEMPLATE_DIR must name the templates/ folder"
#endif

static attnres_device *cpu;

/* Ceilings as a run records them: copy-nt fastest on all threads, the
 * eight-stream read fastest on all threads; a 1 MiB cache. */
static device_ceilings ceilings(double copy, double read)
{
    device_ceilings r = {.copy_gbps = copy, .read_gbps = read};
    const int all = cpu->units;
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"memcpy", AR_CEILING_COPY, 1, 0.5 * copy, 0};
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"copy-nt", AR_CEILING_COPY, all, copy, 0};
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"read", AR_CEILING_READ, 1, 0.5 * read, 0};
    r.ceil.pt[r.ceil.n++] = (ar_ceiling_point){"read-8streams", AR_CEILING_READ, all, read, 0};
    r.ceil.fma_gflops = NAN;
    r.ceil.cache_bytes = 1048576.0;
    return r;
}

static size_t pages(double bytes, int threads)
{
    return (size_t)floor(bytes / (4096.0 * threads)) * (size_t)(4096 * threads);
}

/* Nine rows read and one written: the writes as a copy by the fastest copy
 * kernel, the remaining reads by the fastest read kernel, each on its
 * thread count, in whole pages per thread. */
static void test_pass_follows_the_ceilings(void)
{
    device_ceilings r = ceilings(30.0, 20.0);
    paired_stream *ps = NULL;
    char err[256];
    REQUIRE(paired_stream_create(cpu, &r, 9e6, 1e6, &ps, err, sizeof err) == 1);
    const int all = cpu->units;
    const ar_stream_step *w = &ps->pass.step[0], *rd = &ps->pass.step[1];
    CHECK(strcmp(w->kernel, "copy-nt") == 0 && w->threads == all && w->offset == 0);
    CHECK(w->bytes == pages(1e6, all));
    CHECK(strcmp(rd->kernel, "read-8streams") == 0 && rd->threads == all && rd->offset == 2 * w->bytes);
    CHECK(rd->bytes == pages(9e6 - (double)w->bytes, all));
    CHECK(ps->bytes == 2.0 * (double)w->bytes + (double)rd->bytes);
    CHECK(ps->buf_bytes == 2 * w->bytes + rd->bytes && fabs(ps->bytes - 1e7) < 2 * 4096.0 * all);
    char text[256];
    paired_stream_describe(ps, text, sizeof text);
    CHECK(strstr(text, "copy-nt on ") && strstr(text, " + read-8streams on "));
    double us = 0;
    CHECK(paired_stream_run(cpu, ps, &us) == ATTNRES_OK && us > 0);
    paired_stream_free(cpu, ps);
}

/* Reading below half the copy figure: the blend reads at half the copy
 * rate (device_ceilings.c), so the pass copies the remaining reads in halves. */
static void test_slow_reads_are_copied(void)
{
    device_ceilings r = ceilings(30.0, 12.0);
    paired_stream *ps = NULL;
    char err[256];
    REQUIRE(paired_stream_create(cpu, &r, 9e6, 1e6, &ps, err, sizeof err) == 1);
    const ar_stream_step *w = &ps->pass.step[0], *rd = &ps->pass.step[1];
    CHECK(strcmp(rd->kernel, "copy-nt") == 0);
    CHECK(rd->bytes == pages(0.5 * (9e6 - (double)w->bytes), rd->threads));
    CHECK(ps->bytes == 2.0 * (double)(w->bytes + rd->bytes));
    CHECK(ps->buf_bytes == 2 * (w->bytes + rd->bytes));
    paired_stream_free(cpu, ps);
}

/* No pass where none matches: data that fits the cache, more writes than
 * reads, no read ceiling. */
static void test_no_pass_where_none_matches(void)
{
    device_ceilings r = ceilings(30.0, 20.0);
    paired_stream *ps = NULL;
    char err[256];
    CHECK(paired_stream_create(cpu, &r, 5e5, 1e5, &ps, err, sizeof err) == 0 && ps == NULL);
    CHECK(paired_stream_create(cpu, &r, 1e6, 2e6, &ps, err, sizeof err) == 0 && ps == NULL);
    r.ceil.n = 2; /* the copy points alone */
    CHECK(paired_stream_create(cpu, &r, 9e6, 1e6, &ps, err, sizeof err) == 0 && ps == NULL);
}

/* A copy step writes its bytes right after the ones it reads; a read step
 * writes nothing; with and without software prefetch. */
static void test_pass_copies_and_reads(void)
{
    const int all = cpu->units;
    const size_t n = (size_t)4096 * all * 4;
    void *mem = NULL;
    REQUIRE(cpu->ops->mem_alloc(cpu, 3 * n, &mem) == ATTNRES_OK);
    unsigned char *buf = mem;
    for (size_t i = 0; i < 3 * n; i++)
        buf[i] = i < n ? (unsigned char)(i * 7 + 3) : i < 2 * n ? 0 : (unsigned char)(i * 5);
    static const char *const kernels[][2] = {{"memcpy", "read-8streams"},
                                             {"copy-nt", "read-prefetch"},
                                             {"copy-nt-prefetch", "read-8streams-prefetch"}};
    for (int k = 0; k < 3; k++) {
        ar_stream_pass pass = {{{kernels[k][0], all, 0, n}, {kernels[k][1], all, 2 * n, n}}};
        double us = 0;
        memset(buf + n, 0, n);
        CHECK(cpu->ops->stream_pass(cpu, buf, &pass, &us) == ATTNRES_OK && us > 0);
        CHECK(memcmp(buf, buf + n, n) == 0);
        int intact = 1;
        for (size_t i = 2 * n; i < 3 * n; i++)
            intact &= buf[i] == (unsigned char)(i * 5);
        CHECK(intact);
    }
    cpu->ops->mem_free(cpu, mem);
}

/* Steps the pass cannot run are refused with a message that names them. */
static void test_bad_steps_are_refused(void)
{
    const int all = cpu->units;
    char buf[8192 * 4] __attribute__((aligned(64)));
    const test_bad_step bad[] = {
        {{"copy-fast", 1, 0, 4096}, "no streaming kernel 'copy-fast'"},
        {{"read", 0, 0, 4096}, "0 threads"},
        {{"read", all + 1, 0, 4096 * (size_t)(all + 1)}, "threads, this device has 1 to"},
        {{"read", 1, 0, 1000}, "1000 bytes at offset 0"},
        {{"read", 1, 32, 4096}, "4096 bytes at offset 32"},
        {{"read", 1, 0, 0}, "positive multiple"},
    };
    test_bad_steps_refused(cpu, buf, NULL, bad, sizeof bad / sizeof bad[0]);
    /* The streaming kernels load aligned vectors: a misaligned buffer is
     * refused, not faulted on. */
    ar_stream_pass pass = {{{"read", 1, 0, 4096}}};
    double us = 0;
    CHECK(cpu->ops->stream_pass(cpu, buf + 8, &pass, &us) == ATTNRES_EINVAL);
    CHECK(strstr(attnres_device_errmsg(cpu), "not 64-byte aligned") != NULL);
}

/* The generic f32 mix kernel of cpu/mix, compiled, as a job runs it, with
 * a bench case of d = 256, N = 5 at T tokens. */
typedef struct generic_job {
    argen *g;
    char *id, *src, *name, *json, *log;
    void *blob;
    job_kernel jk;
    measure_policy pol;
    bench_case *bc;
} generic_job;

static int generic_job_open(generic_job *j, int64_t T)
{
    char msg[512];
    size_t size = 0;
    memset(j, 0, sizeof *j);
    if (argen_open(TEMPLATE_DIR, "cpu/mix", &j->g, msg, sizeof msg) || argen_generic(j->g, "f32", &j->id) ||
        argen_emit(j->g, j->id, &j->src, &j->name, &j->json) ||
        cpu->ops->compile(cpu, j->src, j->name, &j->blob, &size, &j->log) != ATTNRES_OK)
        return -1;
    j->jk = (job_kernel){.variant = j->id, .kernel_name = j->name, .params_json = j->json, .source = j->src,
                         .build_key = "test", .blob = j->blob, .blob_size = size};
    tune_problem tp;
    memset(&tp, 0, sizeof tp);
    attnres_problem_init(&tp.p, ATTNRES_DTYPE_F32, 256, 5);
    tp.t = T;
    measure_policy_default(&j->pol, cpu);
    j->bc = bench_case_create(cpu, &tp, &j->pol, 7, msg, sizeof msg);
    return j->bc ? 0 : -1;
}

static void generic_job_close(generic_job *j)
{
    bench_case_free(j->bc);
    void *const owned[] = {j->blob, j->log, j->src, j->name, j->json, j->id};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
        free(owned[i]);
    argen_close(j->g);
}

/* The interleaved rounds of the tuner's final round, with the pass closing
 * each: a kernel's fraction of the pass comes back (also from a forked
 * child, through its pipe), and none without a pass. */
static void test_interleave_reports_the_fraction(void)
{
    generic_job j;
    /* 1.5 MB moved: beyond the 1 MiB cache of these ceilings. */
    REQUIRE(generic_job_open(&j, 256) == 0);
    bench_case *bc = j.bc;
    const measure_policy pol = j.pol;
    const job_kernel jk = j.jk;
    char err[512];
    device_ceilings r = ceilings(30.0, 20.0);
    paired_stream *ps = NULL;
    REQUIRE(paired_stream_for_case(cpu, &r, bc, &ps, err, sizeof err) == 1);
    for (int isolate = 0; isolate < 2; isolate++) {
        job_options opt = {.policy = pol, .time_limit_s = 60, .isolate = isolate, .pair = ps};
        job_result res;
        job_interleave(cpu, bc, &jk, 1, 5, &opt, &res);
        CHECK(res.status == ARDB_STATUS_OK && res.tm.reps == 5);
        CHECK(res.paired > 0 && isfinite(res.paired) && res.paired_spread >= 0 && res.pair_gbps > 0);
        opt.pair = NULL;
        job_interleave(cpu, bc, &jk, 1, 3, &opt, &res);
        CHECK(res.status == ARDB_STATUS_OK && isnan(res.paired) && isnan(res.pair_gbps));
    }
    paired_stream_free(cpu, ps);
    generic_job_close(&j);
}

/* The probe copies four times the largest cache (here 1 MiB) by the
 * fastest copy kernel, and keeps its first, last, least and most reading;
 * a simulated device has none. */
static void test_probe_reads_the_device(void)
{
    device_ceilings r = ceilings(30.0, 20.0);
    device_probe *p = NULL;
    char err[256], text[256];
    REQUIRE(device_probe_create(cpu, &r, &p, err, sizeof err) == 1 && p != NULL);
    CHECK(strcmp(p->pass->pass.step[0].kernel, "copy-nt") == 0 && p->pass->pass.step[1].kernel == NULL);
    CHECK(p->pass->bytes >= 4.0 * 1048576.0 - 2 * 4096.0 * cpu->units && p->pass->bytes <= 8.0 * 1048576.0);
    device_probe_describe(p, text, sizeof text);
    CHECK(text[0] == 0 && p->readings == 0);
    const double a = device_probe_read(cpu, p), b = device_probe_read(cpu, p);
    CHECK(a > 0 && isfinite(a) && b > 0 && isfinite(b) && p->readings == 2);
    CHECK(p->first_gbps == a && p->last_gbps == b && p->min_gbps == fmin(a, b) && p->max_gbps == fmax(a, b));
    CHECK(p->usual_gbps == 0.5 * (a + b));
    device_probe_describe(p, text, sizeof text);
    CHECK(strncmp(text, "copy pass ", 10) == 0 && strstr(text, " over 2 readings") != NULL);
    device_probe_json(p, text, sizeof text);
    CHECK(strstr(text, "\"readings\": 2}") != NULL);
    device_probe_free(cpu, p);
    const int simulated = cpu->simulated;
    cpu->simulated = 1;
    p = NULL;
    CHECK(device_probe_create(cpu, &r, &p, err, sizeof err) == 0 && p == NULL);
    cpu->simulated = simulated;
    CHECK(device_probe_read(cpu, NULL) != device_probe_read(cpu, NULL)); /* NaN */
}

/* A final round after which the probe reads far below its usual is
 * disturbed, whatever the threads' waits say: here the run's earlier
 * readings are made a hundred times the device's, as if memory had slowed
 * that much since. With no retries the winner is provisional, and the
 * evidence names the two readings. */
static void test_final_round_holds_the_probe(void)
{
    generic_job j;
    REQUIRE(generic_job_open(&j, 64) == 0);
    device_ceilings r = ceilings(30.0, 20.0);
    device_probe *p = NULL;
    char err[512];
    REQUIRE(device_probe_create(cpu, &r, &p, err, sizeof err) == 1);
    for (int i = 0; i < 3; i++)
        REQUIRE(device_probe_read(cpu, p) > 0);
    for (int i = 0; i < p->readings; i++)
        p->all[i] *= 100.0;
    job_options opt = {.policy = j.pol, .time_limit_s = 60};
    job_result res;
    final_verdict v;
    final_interleave(cpu, j.bc, &j.jk, 1, &opt, p, 0, NULL, NULL, &res, &v);
    CHECK(res.status == ARDB_STATUS_OK && v.tries == 1 && v.disturbed == 1 && v.provisional);
    CHECK(strstr(v.disturbance, ", copy pass at ") && strstr(v.disturbance, " against the run's usual "));
    CHECK(p->readings == 4);
    device_probe_free(cpu, p);
    generic_job_close(&j);
}

/* The paired check: winners without a pass are not counted; one above it
 * beyond the noise is, with a warning that names it; the summary and the
 * record carry the counts and the median. */
static void test_paired_check(void)
{
    device_ceilings r = ceilings(30.0, 20.0);
    ceiling_check c = {0};
    char warning[512], line[640], json[4096 + 256];
    CHECK(!ceiling_check_paired(&c, "unpaired", NAN, NAN, warning, sizeof warning) && c.paired == 0);
    CHECK(!ceiling_check_paired(&c, "K3", 0.80, 0.01, warning, sizeof warning) && warning[0] == 0);
    CHECK(!ceiling_check_paired(&c, "MHAR", 1.04, 0.01, warning, sizeof warning));
    CHECK(!ceiling_check_paired(&c, "noisy", 1.15, 0.10, warning, sizeof warning));
    CHECK(ceiling_check_paired(&c, "phase2", 1.20, 0.01, warning, sizeof warning));
    CHECK(strstr(warning, "phase2 ran at 120% of a streaming pass") != NULL);
    CHECK(c.paired == 4 && c.paired_over == 1 && fabs(ceiling_check_paired_median(&c) - 1.095) < 1e-9);
    ceiling_check_summary(&c, line, sizeof line);
    CHECK(strstr(line, "\npaired check: 4 winner(s)") && strstr(line, "1 above it") &&
          strstr(line, "median 110% of it, lowest 80%, highest 120%"));
    ceiling_check_json(&r, &c, json, sizeof json);
    CHECK(strstr(json, "\"paired\": 4, \"paired_over\": 1, \"paired_median\": 1.0950}}") != NULL);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (test_cpu_open(&cpu) != 0)
        return 1;
    RUN_CASE(test_pass_follows_the_ceilings);
    RUN_CASE(test_slow_reads_are_copied);
    RUN_CASE(test_no_pass_where_none_matches);
    RUN_CASE(test_pass_copies_and_reads);
    RUN_CASE(test_bad_steps_are_refused);
    RUN_CASE(test_interleave_reports_the_fraction);
    RUN_CASE(test_paired_check);
    RUN_CASE(test_probe_reads_the_device);
    RUN_CASE(test_final_round_holds_the_probe);
    attnres_device_close(cpu);
    CHECK_EXIT();
}
