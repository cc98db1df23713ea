/*
 * fallback.c - the built-in CPU kernels (the last fallback level) against
 * the tuned winners, at the shapes of the `default` preset.
 *
 *   build/bin/fallback --db DB [--rounds R] [--gap BYTES] [--scalar] [--only SUBSTRING]
 *                      [--against LEVEL] [--versus DB2]
 *
 * DB must hold winners tuned on this machine for the `default` preset
 * (attnres tune --preset default --db DB). For each problem and T bucket
 * it plans the tuned kernel (exact level required), the built-in kernel
 * at the widest ISA level the CPU has, at avx2 (or --against LEVEL, say
 * avx512 next to avx512bf16), and with --scalar the
 * scalar generic kernel (what serves shapes no vectorised built-in fits), each on a
 * device opened with ATTNRES_CPU_BUILTIN_ISA naming that level. Rounds
 * interleave the configurations; each times a batch of launches of at
 * least 5 ms (one launch when a launch is longer); the medians over the
 * rounds are printed as a markdown table with each built-in's ratio to the
 * tuned kernel: the median over rounds of the ratio of the two times of
 * the same round (the scalar column: the ratio of medians, since it skips
 * rounds). The N sources of a launch lie back to back in one buffer, as in
 * an engine's bank of block representations, or --gap BYTES (a multiple
 * of 64) apart.
 *
 * --versus DB2 puts DB2's tuned winner (exact level too) in the built-in's
 * place, so that two tunes of the preset (say the default strategy and an
 * exhaustive one, bench/tune_quality.sh) are compared kernel against
 * kernel in the same interleaved rounds: the ratio column is DB2's time
 * over DB's, and the row is the same kernel where both chose one.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "attnres.h"
#include "problems.h"
#include "storage_convert.h"

enum { CONFIGS = 4, MAX_ROUNDS = 64 };


static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median over n rounds of a[r] / b[r]. */
static double paired_ratio(const double *a, const double *b, int n)
{
    double r[MAX_ROUNDS];
    for (int i = 0; i < n; i++)
        r[i] = a[i] / b[i];
    qsort(r, (size_t)n, sizeof *r, cmp_double);
    return n % 2 ? r[n / 2] : 0.5 * (r[n / 2 - 1] + r[n / 2]);
}

/* Random values of magnitude about 1 in any storage type. */
static void fill(void *buf, attnres_dtype dt, size_t count, uint64_t *s)
{
    for (size_t i = 0; i < count; i++) {
        *s = *s * 6364136223846793005ull + 1442695040888963407ull;
        float f = (float)((int)(*s >> 40) % 2001 - 1000) / 700.0f;
        ar_storage_store(dt, buf, (int64_t)i, f);
    }
}

/* Bytes between one source's [T, d] rows and the next one's (--gap): 0
 * puts the sources back to back, as a bank [N, T, d] holds them. */
static size_t source_gap;
#define SOURCE_GAP source_gap

/* Everything one launch of a problem at T reads and writes. */
typedef struct buffers {
    void *src, *o1, *b, *f, *out, *normed, *partial;
    float *query, *gain, *lse;
    const void *views[64];
    void *o1_views[64];
    float *lse_views[64];
    attnres_mix_args mix;
    attnres_phase1_args p1;
    attnres_phase2_args p2;
} buffers;

/* Buffers aligned to 64 bytes, as an engine's allocator gives them
 * (PyTorch's CPU allocator aligns to 64): a large malloc returns an mmap
 * 16 bytes into its first page, so every 64-byte load of its rows would
 * straddle two cache lines, and kernels would be ranked on a layout the
 * tuner never times (its bench_case allocates through the device). */
static void *aligned(size_t bytes)
{
    void *p = NULL;
    return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : NULL;
}

static int setup(buffers *bf, const attnres_problem *p, int64_t T)
{
    memset(bf, 0, sizeof *bf);
    const size_t es = attnres_dtype_size(p->dtype), td = (size_t)(T * p->d);
    const int rows = p->op == ATTNRES_OP_PHASE2 ? 1 : p->n;
    const int sites = p->op == ATTNRES_OP_PHASE1 ? p->s : 1;
    uint64_t seed = 42;
    bf->src = aligned((es * td + SOURCE_GAP) * (size_t)rows);
    bf->o1 = aligned(es * td * (size_t)sites);
    bf->b = aligned(es * td);
    bf->f = aligned(es * td);
    bf->out = aligned(es * td);
    bf->normed = aligned(es * td);
    bf->partial = aligned(es * td);
    bf->query = aligned(sizeof(float) * (size_t)(p->d * sites));
    bf->gain = aligned(sizeof(float) * (size_t)p->d);
    bf->lse = aligned(sizeof(float) * (size_t)(T * p->heads * sites));
    if (!bf->src || !bf->o1 || !bf->b || !bf->f || !bf->out || !bf->normed || !bf->partial || !bf->query ||
        !bf->gain || !bf->lse || rows > 64 || sites > 64)
        return -1;
    fill(bf->src, p->dtype, (td + SOURCE_GAP / es) * (size_t)rows, &seed);
    fill(bf->o1, p->dtype, td * (size_t)sites, &seed);
    fill(bf->b, p->dtype, td, &seed);
    fill(bf->f, p->dtype, td, &seed);
    fill(bf->partial, p->dtype, td, &seed);
    fill(bf->query, ATTNRES_DTYPE_F32, (size_t)(p->d * sites), &seed);
    fill(bf->lse, ATTNRES_DTYPE_F32, (size_t)(T * p->heads * sites), &seed);
    /* Queries of unit norm, as a trained pseudo-query folded with its gain
     * is: scores of order one, so the softmax weights stay far from the
     * denormal range. */
    for (int64_t k = 0; k < p->d * sites; k++)
        bf->query[k] /= sqrtf((float)p->d);
    for (int64_t k = 0; k < p->d; k++)
        bf->gain[k] = 1.0f;
    for (int i = 0; i < rows; i++)
        bf->views[i] = (const char *)bf->src + (es * td + SOURCE_GAP) * (size_t)i;
    for (int j = 0; j < sites; j++) {
        bf->o1_views[j] = (char *)bf->o1 + es * td * (size_t)j;
        bf->lse_views[j] = bf->lse + (size_t)(T * p->heads * j);
    }
    attnres_mix_args_init(&bf->mix);
    bf->mix.sources = bf->views;
    bf->mix.query = bf->query;
    bf->mix.partial = p->form == ATTNRES_FORM_ADDITIVE ? bf->partial : NULL;
    bf->mix.out = bf->out;
    bf->mix.out_gain = p->epilogue ? bf->gain : NULL;
    bf->mix.normed = p->epilogue ? bf->normed : NULL;
    attnres_phase1_args_init(&bf->p1);
    bf->p1.sources = bf->views;
    bf->p1.queries = bf->query;
    bf->p1.o1 = bf->o1_views;
    bf->p1.lse = bf->lse_views;
    attnres_phase2_args_init(&bf->p2);
    bf->p2.o1 = bf->o1;
    bf->p2.lse = bf->lse;
    bf->p2.partial = bf->b;
    bf->p2.sublayer = p->fuse_add ? bf->f : NULL;
    bf->p2.query = bf->query;
    bf->p2.out = bf->out;
    bf->p2.out_gain = p->epilogue ? bf->gain : NULL;
    bf->p2.normed = p->epilogue ? bf->normed : NULL;
    return 0;
}

static void teardown(buffers *bf)
{
    free(bf->src), free(bf->o1), free(bf->b), free(bf->f), free(bf->out), free(bf->normed), free(bf->partial);
    free(bf->query), free(bf->gain), free(bf->lse);
}

static int launch(attnres_plan *plan, const attnres_problem *p, int64_t T, buffers *bf)
{
    switch (p->op) {
    case ATTNRES_OP_MIX: return attnres_run_mix(plan, T, &bf->mix, NULL);
    case ATTNRES_OP_PHASE1: return attnres_run_phase1(plan, T, &bf->p1, NULL);
    case ATTNRES_OP_PHASE2: return attnres_run_phase2(plan, T, &bf->p2, NULL);
    case ATTNRES_OP_MIX_BACKWARD: /* the default preset, which this times, holds no backward problem */
    case ATTNRES_OP_PHASE1_BACKWARD:
    case ATTNRES_OP_PHASE2_BACKWARD:
        break;
    }
    return -1;
}


int main(int argc, char **argv)
{
    const char *db_path = NULL, *only = NULL, *versus = NULL;
    const char *against = "avx2";
    int rounds = 7, scalar = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--db") == 0 && i + 1 < argc)
            db_path = argv[++i];
        else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc)
            only = argv[++i];
        else if (strcmp(argv[i], "--gap") == 0 && i + 1 < argc)
            source_gap = (size_t)strtoul(argv[++i], NULL, 10) / 64 * 64;
        else if (strcmp(argv[i], "--scalar") == 0)
            scalar = 1;
        else if (strcmp(argv[i], "--against") == 0 && i + 1 < argc)
            against = argv[++i];
        else if (strcmp(argv[i], "--versus") == 0 && i + 1 < argc)
            versus = argv[++i];
        else {
            fprintf(stderr, "usage: fallback --db DB [--rounds R] [--gap BYTES] [--scalar] [--only SUBSTRING] "
                            "[--against LEVEL] [--versus DB2]\n");
            return 2;
        }
    }
    if (!db_path || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "fallback: --db is required and --rounds must be 1..%d\n", MAX_ROUNDS);
        return 2;
    }
    char msg[1024];
    attnres_device *dev[CONFIGS] = {0};
    const char *const isa[CONFIGS] = {"", "", against, "scalar"};
    char against_name[80];
    snprintf(against_name, sizeof against_name, "built-in %s", against);
    const char *const config_names[CONFIGS] = {"tuned", versus ? "versus" : "built-in", against_name, "scalar"};
    for (int c = 0; c < CONFIGS; c++) {
        if (c == 1)
            continue; /* the tuned plan's device: the widest level */
        if (isa[c][0])
            setenv("ATTNRES_CPU_BUILTIN_ISA", isa[c], 1);
        else
            unsetenv("ATTNRES_CPU_BUILTIN_ISA");
        if (attnres_device_open("cpu", &dev[c], msg, sizeof msg) != ATTNRES_OK) {
            fprintf(stderr, "fallback: cannot open cpu with ATTNRES_CPU_BUILTIN_ISA=%s: %s\n", isa[c], msg);
            return 1;
        }
    }
    dev[1] = dev[0];
    attnres_db *db = NULL, *db2 = NULL;
    if (attnres_db_open(db_path, &db, msg, sizeof msg) != ATTNRES_OK ||
        (versus && attnres_db_open(versus, &db2, msg, sizeof msg) != ATTNRES_OK)) {
        fprintf(stderr, "fallback: %s\n", msg);
        return 1;
    }
    if (versus)
        printf("| problem | T | winner of %s | µs | winner of %s | µs | ratio | %s µs | ratio %s |%s\n", db_path,
               versus, against, against, scalar ? " scalar µs | ratio scalar |" : "");
    else
        printf("| problem | T | tuned winner | tuned µs | built-in (level) | built-in µs | ratio | %s µs | ratio %s |%s\n",
               against, against, scalar ? " scalar µs | ratio scalar |" : "");
    printf("|---|---|---|---|---|---|---|---|---|%s\n", scalar ? "---|---|" : "");
    /* The default preset's problems with their CPU T buckets, as the tuner
     * expands them (tuner/src/problems.c): one row per problem and bucket. */
    problem_set set;
    if (problems_preset("default", "cpu", &set, msg, sizeof msg) != 0) {
        fprintf(stderr, "fallback: %s\n", msg);
        return 1;
    }
    for (size_t pi = 0; pi < set.count; pi++) {
        const attnres_problem p = set.items[pi].p;
        const int64_t T = set.items[pi].t;
        char name[160];
        char sites[32] = "";
        if (p.op == ATTNRES_OP_PHASE1)
            snprintf(sites, sizeof sites, " S=%d", p.s);
        snprintf(name, sizeof name, "%s %s d=%" PRId64 " N=%d%s H=%d %s%s%s",
                 p.op == ATTNRES_OP_MIX ? "mix" : p.op == ATTNRES_OP_PHASE1 ? "phase1" : "phase2",
                 attnres_dtype_name(p.dtype), p.d, p.n, sites, p.heads,
                 p.form == ATTNRES_FORM_ADDITIVE ? "additive" : "replace", p.epilogue ? "+norm" : "",
                 p.fuse_add ? " fused" : "");
        if (only && !strstr(name, only))
            continue;
        attnres_plan *plan[CONFIGS] = {0};
        int ok = 1;
        for (int c = 0; c < CONFIGS && ok; c++) {
            if (c == 3 && !scalar)
                continue;
            attnres_db *from = c == 0 ? db : c == 1 ? db2 : NULL;
            if (attnres_plan_create(dev[c], from, &p, from ? ATTNRES_PLAN_REQUIRE_EXACT : 0, &plan[c], msg,
                                    sizeof msg) != ATTNRES_OK) {
                printf("| %s | - | %s: %s |\n", name, config_names[c], msg);
                ok = 0;
            }
        }
        buffers bf;
        if (ok && setup(&bf, &p, T) != 0) {
            printf("| %s | %" PRId64 " | out of memory |\n", name, T);
            teardown(&bf);
            ok = 0;
        }
        if (ok) {
            double times[CONFIGS][MAX_ROUNDS];
            int batch[CONFIGS] = {0}, done[CONFIGS] = {0};
            for (int c = 0; c < CONFIGS; c++) { /* warm-up; a batch of >= 5 ms */
                if (!plan[c])
                    continue;
                double t0 = now_us();
                if (launch(plan[c], &p, T, &bf) != ATTNRES_OK) {
                    fprintf(stderr, "fallback: %s %s: %s\n", name, config_names[c], attnres_plan_errmsg(plan[c]));
                    return 1;
                }
                double one = now_us() - t0;
                batch[c] = one >= 5000 ? 1 : (int)(5000 / (one > 1 ? one : 1)) + 1;
            }
            for (int r = 0; r < rounds; r++)
                for (int c = 0; c < CONFIGS; c++) {
                    if (!plan[c])
                        continue;
                    if (batch[c] == 1 && done[c] >= 3 && c == 3)
                        continue; /* the scalar kernel at large T: three rounds are enough */
                    usleep(1000); /* the other devices' workers stop spinning */
                    double t0 = now_us();
                    for (int k = 0; k < batch[c]; k++)
                        launch(plan[c], &p, T, &bf);
                    times[c][done[c]++] = (now_us() - t0) / batch[c];
                }
            /* Ratios round by round (the same round's launches of each), so
             * that a disturbance that slows a whole round cancels out. */
            double ratio[CONFIGS] = {0};
            for (int c = 1; c < 3; c++)
                if (done[c] && done[c] == done[0])
                    ratio[c] = paired_ratio(times[c], times[0], done[0]);
            double med[CONFIGS] = {0};
            for (int c = 0; c < CONFIGS; c++)
                if (done[c]) {
                    qsort(times[c], (size_t)done[c], sizeof(double), cmp_double);
                    med[c] = times[c][done[c] / 2];
                }
            char tuned[256] = "?", level[64] = "?", text[8192];
            attnres_plan_explain(plan[0], text, sizeof text);
            char key[64];
            snprintf(key, sizeof key, "T bucket %" PRId64 ": ", T);
            const char *at = strstr(text, key);
            if (at)
                sscanf(at + strlen(key), "%255s", tuned);
            attnres_plan_explain(plan[1], text, sizeof text);
            at = versus ? strstr(text, key) : strstr(text, "(built in, ");
            if (at && versus)
                sscanf(at + strlen(key), "%63s", level);
            else if (at)
                sscanf(at + strlen("(built in, "), "%63[^)]", level);
            printf("| %s | %" PRId64 " | %s | %.2f | %s | %.2f | **%.2f** | %.2f | %.2f |", name, T, tuned, med[0],
                   level, med[1], ratio[1], med[2], ratio[2]);
            if (scalar)
                printf(" %.1f | %.1f |", med[3], med[3] / med[0]);
            printf("\n");
            fflush(stdout);
            teardown(&bf);
        }
        for (int c = 0; c < CONFIGS; c++)
            attnres_plan_destroy(plan[c]);
    }
    problems_free(&set);
    attnres_db_close(db);
    attnres_db_close(db2);
    attnres_device_close(dev[0]);
    attnres_device_close(dev[2]);
    attnres_device_close(dev[3]);
    return 0;
}
