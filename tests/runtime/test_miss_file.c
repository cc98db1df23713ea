/*
 * test_miss_file.c - the runtime's record of untuned problems
 * (attnres_miss_file_set, ATTNRES_MISS_FILE; runtime/src/miss_file.h).
 *
 * Runs of plans that fall back append one line per T bucket (T rounded up
 * to a power of two), once: a second plan of the same problem, another
 * process (a forked child) and the lines already in the file are not
 * written again. Tuned-level plans record nothing. A file that cannot be
 * written never fails a run; a file at the size bound gets nothing more; a
 * last line cut short is closed and marked, and the reader skips it while
 * keeping every whole line. Every line the writer wrote parses. A FIFO as
 * the miss file blocks neither a run nor the reader.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attnres.h"
#include "check.h"
#include "miss_file.h"
#include "test_device.h"
#include "test_scratch.h"

static attnres_device *cpu;
static char dir[512];

static attnres_plan *plan_mix(int64_t d, int32_t n)
{
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, d, n);
    attnres_plan *plan = NULL;
    char msg[512];
    if (attnres_plan_create(cpu, NULL, &p, 0, &plan, msg, sizeof msg) != ATTNRES_OK)
        fprintf(stderr, "  plan: %s\n", msg);
    return plan;
}

static int run_mix(attnres_plan *plan, int64_t d, int32_t n, int64_t T)
{
    float *buf = calloc((size_t)(T * d * (n + 1) + d), sizeof(float));
    const void *views[8];
    for (int i = 0; i < n; i++)
        views[i] = buf + (size_t)(i * T * d);
    for (int64_t i = 0; i < T * d * n; i++)
        buf[i] = (float)(i % 7) - 3.0f;
    attnres_mix_args a;
    attnres_mix_args_init(&a);
    a.sources = views;
    a.query = buf + (size_t)(T * d * (n + 1));
    a.out = buf + (size_t)(T * d * n);
    int st = attnres_run_mix(plan, T, &a, NULL);
    free(buf);
    return st;
}

/* Points the miss file at path (NULL: none), plans the mix of d and n and
 * runs it once on T tokens; the plan, or NULL when a step failed (each
 * step is a check). */
static attnres_plan *plan_and_run(const char *path, int64_t d, int32_t n, int64_t T)
{
    const int set = attnres_miss_file_set(path);
    CHECK(set == ATTNRES_OK);
    attnres_plan *plan = set == ATTNRES_OK ? plan_mix(d, n) : NULL;
    CHECK(plan != NULL);
    if (plan)
        CHECK(run_mix(plan, d, n, T) == ATTNRES_OK);
    return plan;
}

/* The path of `name` in the test's scratch directory. */
typedef struct {
    char s[600];
} scratch_path;

static scratch_path in_dir(const char *name)
{
    scratch_path p;
    snprintf(p.s, sizeof p.s, "%s/%s", dir, name);
    return p;
}

/* The file's size, or -1 when there is none. */
static long long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

static size_t count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[2048];
    size_t n = 0;
    while (fgets(line, sizeof line, f))
        n += !needle || strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static void read_back(const char *path, size_t want, int want_torn)
{
    ar_miss *m = NULL;
    size_t n = 0;
    int torn = 0;
    char err[512];
    int rc = ar_miss_read_file(path, &m, &n, &torn, err, sizeof err);
    CHECK(rc == 0);
    if (rc)
        fprintf(stderr, "  %s\n", err);
    CHECK(n == want);
    CHECK(torn == want_torn);
    free(m);
}

static void test_runs_record_each_bucket_once(void)
{
    const scratch_path file = in_dir("a.txt");
    const char *path = file.s;
    REQUIRE(attnres_miss_file_set(path) == ATTNRES_OK);
    attnres_plan *plan = plan_mix(40, 3);
    REQUIRE(plan);
    char text[4096];
    attnres_plan_explain(plan, text, sizeof text);
    CHECK(strstr(text, "recorded in the miss file") != NULL && strstr(text, path) != NULL);
    const int64_t Ts[] = {1, 3, 4, 3, 5, 8, 1};
    for (size_t i = 0; i < sizeof Ts / sizeof Ts[0]; i++)
        CHECK(run_mix(plan, 40, 3, Ts[i]) == ATTNRES_OK);
    CHECK(count_lines(path, NULL) == 3); /* buckets 1, 4, 8 */
    CHECK(count_lines(path, " t=1 ") == 1 && count_lines(path, " t=4 ") == 1 && count_lines(path, " t=8 ") == 1);
    CHECK(count_lines(path, "op=mix dtype=f32 d=40 n=3 heads=1 s=0 form=replace epilogue=0 fuse=0 t=") == 3);
    /* Another plan of the problem, and another process: nothing new. */
    attnres_plan *again = plan_mix(40, 3);
    REQUIRE(again);
    CHECK(run_mix(again, 40, 3, 2) == ATTNRES_OK);
    CHECK(run_mix(again, 40, 3, 8) == ATTNRES_OK);
    CHECK(count_lines(path, NULL) == 4); /* only bucket 2 is new */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* A fresh process: it learns the file's lines before appending. */
        attnres_device *dev = NULL;
        attnres_miss_file_set(path);
        if (attnres_device_open("cpu", &dev, NULL, 0) != ATTNRES_OK)
            _exit(3);
        attnres_device *keep = cpu;
        cpu = dev;
        attnres_plan *child = plan_mix(40, 3);
        int st = child ? run_mix(child, 40, 3, 8) : -1;
        attnres_plan_destroy(child);
        cpu = keep;
        attnres_device_close(dev);
        _exit(st == ATTNRES_OK ? 0 : 4);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    CHECK(count_lines(path, NULL) == 4);
    read_back(path, 4, 0);
    attnres_plan_destroy(plan);
    attnres_plan_destroy(again);
}

static void test_unwritable_file_never_fails_a_run(void)
{
    const scratch_path file = in_dir("no-such-dir/m.txt");
    const char *path = file.s;
    attnres_plan *plan = plan_and_run(path, 24, 2, 3);
    REQUIRE(plan);
    CHECK(file_size(path) < 0);
    attnres_plan_destroy(plan);
    /* A directory is not written either. */
    attnres_plan_destroy(plan_and_run(dir, 24, 2, 3));
}

static void test_full_file_gets_nothing_more(void)
{
    const scratch_path file = in_dir("full.txt");
    const char *path = file.s;
    FILE *f = fopen(path, "w");
    REQUIRE(f);
    for (int64_t i = 0; i < AR_MISS_FILE_MAX - 100; i += 100)
        fprintf(f, "%099d\n", 0); /* not miss lines: only their size counts */
    fclose(f);
    const long long before = file_size(path);
    REQUIRE(before >= 0);
    attnres_plan *plan = plan_and_run(path, 32, 5, 1);
    REQUIRE(plan);
    CHECK(file_size(path) == before);
    attnres_plan_destroy(plan);
}

static void test_cut_last_line_is_closed_and_skipped(void)
{
    const scratch_path file = in_dir("cut.txt");
    const char *path = file.s;
    attnres_plan *plan = plan_and_run(path, 48, 2, 1);
    REQUIRE(plan);
    /* A writer that died half-way through its line. */
    FILE *f = fopen(path, "a");
    REQUIRE(f);
    fputs("attnres-miss 1 sum=0123abcd op=mix dtype=f32 d=4", f);
    fclose(f);
    read_back(path, 1, 1);
    CHECK(run_mix(plan, 48, 2, 2) == ATTNRES_OK);
    CHECK(count_lines(path, "attnres-miss cut") == 1);
    read_back(path, 2, 1); /* both whole lines, the cut one skipped */
    attnres_plan_destroy(plan);
}

/* A FIFO as the miss file (nobody reads it) must not block a run: the
 * child gets 10 seconds, then SIGALRM ends it and the case fails. The plan
 * says once that the file is not a regular file, and nothing is written. */
static void test_fifo_never_blocks_a_run(void)
{
    const scratch_path file = in_dir("fifo");
    const char *path = file.s;
    REQUIRE(mkfifo(path, 0600) == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        if (attnres_miss_file_set(path) != ATTNRES_OK)
            _exit(3);
        attnres_plan *plan = plan_mix(40, 2);
        if (!plan)
            _exit(4);
        char text[4096];
        attnres_plan_explain(plan, text, sizeof text);
        const char *said = strstr(text, "not a regular file");
        if (!said || strstr(said + 1, "not a regular file"))
            _exit(5);
        for (int64_t T = 1; T <= 8; T++)
            if (run_mix(plan, 40, 2, T) != ATTNRES_OK)
                _exit(6);
        attnres_plan_destroy(plan);
        /* The reader refuses it at once too, rather than wait for a writer. */
        ar_miss *m = NULL;
        size_t n = 0;
        int torn = 0;
        char err[512] = "";
        if (ar_miss_read_file(path, &m, &n, &torn, err, sizeof err) != -1 || !strstr(err, "not a regular file"))
            _exit(7);
        _exit(0);
    }
    int ws = 0;
    REQUIRE(waitpid(pid, &ws, 0) == pid);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    if (WIFSIGNALED(ws))
        fprintf(stderr, "  the child ended by signal %d (14: SIGALRM, it blocked)\n", WTERMSIG(ws));
    else if (WIFEXITED(ws) && WEXITSTATUS(ws) != 0)
        fprintf(stderr, "  the child exited %d\n", WEXITSTATUS(ws));
    unlink(path);
}

static void test_off_records_nothing_and_long_path_is_refused(void)
{
    const scratch_path file = in_dir("off.txt");
    const char *path = file.s;
    attnres_plan *plan = plan_and_run(NULL, 56, 2, 1);
    REQUIRE(plan);
    char text[4096];
    attnres_plan_explain(plan, text, sizeof text);
    CHECK(strstr(text, "fallback: no tuned kernel") != NULL);
    CHECK(strstr(text, "recorded in the miss file") == NULL);
    attnres_plan_destroy(plan);
    CHECK(file_size(path) < 0);
    char *huge = malloc(5000);
    REQUIRE(huge);
    memset(huge, 'a', 4999);
    huge[4999] = 0;
    CHECK(attnres_miss_file_set(huge) == ATTNRES_EINVAL);
    free(huge);
}

int main(int argc, char **argv)
{
    CHECK_ARGS(argc, argv);
    if (scratch_make("miss", dir, sizeof dir) != 0 || test_cpu_open(&cpu) != 0)
        return 1;
    RUN_CASE(test_runs_record_each_bucket_once);
    RUN_CASE(test_unwritable_file_never_fails_a_run);
    RUN_CASE(test_full_file_gets_nothing_more);
    RUN_CASE(test_cut_last_line_is_closed_and_skipped);
    RUN_CASE(test_fifo_never_blocks_a_run);
    RUN_CASE(test_off_records_nothing_and_long_path_is_refused);
    attnres_device_close(cpu);
    scratch_remove(dir);
    CHECK_EXIT();
}
