/*
 * plan_probe.c - plans through the public API from a database that may be
 * damaged, and checks that whatever the library answers is one of the two
 * allowed outcomes: a documented status with a message, or plans (at any
 * fallback level) whose results match the fp64 reference.
 *
 * Usage: plan_probe DB [--require-exact] [--d D] [--n N] [--damage-with FILE]
 *   Plans the tuned shape (mix f32 d=D, N sources), an untuned one (N + 2
 *   sources) and a phase-2 problem, and runs each at T = 1 and T = 16.
 *   --damage-with FILE: first plans from DB while it is intact, then
 *   overwrites DB in place (same inode) with the bytes of FILE, and checks
 *   that the plans made before still run correctly, that the database
 *   handle opened before still answers (a status or plans), and that a
 *   fresh open answers too.
 *
 * Exit status: 0 everything planned and correct; 3 a clean refusal (a known
 * status with a message); 1 a defect (wrong result, empty message, unknown
 * status, a valid plan broken by the damage); 2 usage.
 */
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attnres.h"
#include "test_plain_mix.h"

enum { EXIT_CORRECT = 0, EXIT_DEFECT = 1, EXIT_USAGE = 2, EXIT_REFUSED = 3 };
enum { NPROBLEMS = 3, TMAX = 16 };

static int64_t D = 64;
static int N = 3;
static int defects = 0, refusals = 0;

static void defect(const char *fmt, const char *a, const char *b)
{
    printf("DEFECT: ");
    printf(fmt, a, b);
    printf("\n");
    defects++;
}

/* A status must be a known code with a non-empty message. */
static void refused(const char *what, int st, const char *msg)
{
    char code[32];
    snprintf(code, sizeof code, "%d", st);
    if (st <= ATTNRES_OK || st > ATTNRES_EMISMATCH || !strncmp(attnres_errstr(st), "unknown", 7))
        defect("%s returned unknown status %s", what, code);
    else if (!msg || !*msg)
        defect("%s returned %s with an empty message", what, attnres_errstr(st));
    else
        printf("refused: %s: %s (%s): %s\n", what, attnres_errstr(st), code, msg);
    refusals++;
}

static attnres_problem problem(int i)
{
    attnres_problem p;
    attnres_problem_init(&p, ATTNRES_DTYPE_F32, D, i == 1 ? N + 2 : N);
    if (i == 2) {
        p.op = ATTNRES_OP_PHASE2;
        p.n = 1;
    }
    return p;
}

/* Deterministic inputs: sources, query, phase-2 o1/lse/partial. */
static float src[16][TMAX * 4096], query[4096], o1[TMAX * 4096], lse[TMAX], partial[TMAX * 4096];
static float out[TMAX * 4096];

static void make_inputs(void)
{
    uint64_t s = 12345;
    float *all[] = {query, o1, partial};
    for (int i = 0; i < 16; i++)
        for (int64_t k = 0; k < TMAX * D; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            src[i][k] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
    for (int j = 0; j < 3; j++)
        for (int64_t k = 0; k < TMAX * D; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            if (j > 0 || k < D)
                all[j][k] = (float)((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0) / (j == 0 ? 4.0f : 1.0f);
        }
    for (int t = 0; t < TMAX; t++)
        lse[t] = 0.5f;
}

/* Runs plan i at T tokens and compares with the fp64 reference. */
static int run_checked(attnres_plan *plan, int i, int64_t T)
{
    const attnres_problem p = problem(i);
    static double dsrc[16][TMAX * 4096], dq[4096], dref[TMAX * 4096], do1[TMAX * 4096], dlse[TMAX],
        dpart[TMAX * 4096];
    const int64_t td = T * D;
    for (int64_t k = 0; k < td; k++)
        out[k] = NAN;
    for (int64_t k = 0; k < D; k++)
        dq[k] = query[k];
    int st, rst;
    if (p.op == ATTNRES_OP_MIX) {
        const void *s[16];
        const double *ds[16];
        for (int j = 0; j < p.n; j++) {
            s[j] = src[j];
            ds[j] = dsrc[j];
            for (int64_t k = 0; k < td; k++)
                dsrc[j][k] = src[j][k];
        }
        st = plain_mix_run(plan, T, s, query, out);
        rst = attnres_reference_mix(&p, T, ds, dq, 1.0, 1e-6, NULL, 1.0, NULL, 1e-6, dref, NULL);
    } else {
        for (int64_t k = 0; k < td; k++) {
            do1[k] = o1[k];
            dpart[k] = partial[k];
        }
        for (int64_t t = 0; t < T; t++)
            dlse[t] = lse[t];
        attnres_phase2_args a;
        attnres_phase2_args_init(&a);
        a.o1 = o1;
        a.lse = lse;
        a.partial = partial;
        a.query = query;
        a.out = out;
        st = attnres_run_phase2(plan, T, &a, NULL);
        rst = attnres_reference_phase2(&p, T, do1, dlse, dpart, NULL, dq, 1.0, 1e-6, NULL, 1e-6, dref, NULL);
    }
    char what[64];
    snprintf(what, sizeof what, "run of problem %d at T=%lld", i, (long long)T);
    if (st != ATTNRES_OK || rst != ATTNRES_OK) {
        defect("%s failed on a valid plan: %s", what, attnres_plan_errmsg(plan));
        return -1;
    }
    const double err = plain_rel_err(out, dref, td);
    if (!(err <= 1e-5)) {
        char e[32];
        snprintf(e, sizeof e, "%.3g", err);
        defect("%s: relative error %s against the reference", what, e);
        return -1;
    }
    return 0;
}

static const char *level_name(attnres_plan_level l)
{
    static const char *const names[] = {"exact", "architecture", "backend", "generic"};
    return (unsigned)l < 4 ? names[l] : "?";
}

/* Plans every problem from db; runs and checks what planned. */
static void plan_all(attnres_device *dev, attnres_db *db, unsigned flags, attnres_plan **plans, const char *when)
{
    char msg[1024], what[128];
    for (int i = 0; i < NPROBLEMS; i++) {
        const attnres_problem p = problem(i);
        msg[0] = 0;
        int st = attnres_plan_create(dev, db, &p, flags, &plans[i], msg, sizeof msg);
        snprintf(what, sizeof what, "%s: plan of problem %d", when, i);
        if (st != ATTNRES_OK) {
            refused(what, st, msg);
            if (plans[i])
                defect("%s failed but left a plan%s", what, "");
            plans[i] = NULL;
            continue;
        }
        printf("planned: %s at level %s\n", what, level_name(attnres_plan_level_get(plans[i])));
        run_checked(plans[i], i, 1);
        run_checked(plans[i], i, TMAX);
    }
}

static void destroy_all(attnres_plan **plans)
{
    for (int i = 0; i < NPROBLEMS; i++) {
        attnres_plan_destroy(plans[i]);
        plans[i] = NULL;
    }
}

/* Overwrites path in place (keeping its inode) with the bytes of from. */
static int overwrite_in_place(const char *path, const char *from)
{
    FILE *in = fopen(from, "rb");
    int fd = open(path, O_WRONLY | O_TRUNC);
    if (!in || fd < 0) {
        if (in)
            fclose(in);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char buf[65536];
    size_t got;
    int bad = 0;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0)
        bad |= write(fd, buf, got) != (ssize_t)got;
    fclose(in);
    bad |= close(fd) != 0;
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *damage = NULL;
    unsigned flags = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--require-exact"))
            flags |= ATTNRES_PLAN_REQUIRE_EXACT;
        else if (!strcmp(argv[i], "--d") && i + 1 < argc)
            D = strtoll(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc)
            N = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--damage-with") && i + 1 < argc)
            damage = argv[++i];
        else if (!path && argv[i][0] != '-')
            path = argv[i];
        else
            path = NULL, i = argc;
    }
    if (!path || D < 1 || D > 4096 || N < 1 || N > 14) {
        fprintf(stderr, "usage: plan_probe DB [--require-exact] [--d D] [--n N] [--damage-with FILE]\n");
        return EXIT_USAGE;
    }
    make_inputs();
    char msg[1024] = "";
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    attnres_plan *before[NPROBLEMS] = {0}, *after[NPROBLEMS] = {0};
    if (attnres_device_open("cpu", &dev, msg, sizeof msg)) {
        printf("DEFECT: cannot open the CPU: %s\n", msg);
        return EXIT_DEFECT;
    }
    if (damage) {
        /* The intact database first: these plans must outlive the damage. */
        if (attnres_db_open(path, &db, msg, sizeof msg)) {
            printf("DEFECT: the intact database does not open: %s\n", msg);
            attnres_device_close(dev);
            return EXIT_DEFECT;
        }
        plan_all(dev, db, 0, before, "intact");
        if (refusals || defects) {
            printf("DEFECT: the intact database did not plan everything\n");
            defects++;
        }
        if (overwrite_in_place(path, damage)) {
            printf("DEFECT: cannot damage %s\n", path);
            defects++;
        }
        for (int i = 0; i < NPROBLEMS; i++)
            if (before[i] && (run_checked(before[i], i, 1) || run_checked(before[i], i, TMAX)))
                printf("  (a plan made before the damage broke)\n");
        refusals = 0;
        plan_all(dev, db, flags, after, "damaged, open handle");
        destroy_all(after);
        attnres_db_close(db);
        db = NULL;
    }
    msg[0] = 0;
    int st = attnres_db_open(path, &db, msg, sizeof msg);
    if (st != ATTNRES_OK) {
        refused("db open", st, msg);
        if (db)
            defect("db open failed but returned a handle%s%s", "", "");
        db = NULL;
    } else {
        plan_all(dev, db, flags, after, damage ? "damaged, fresh handle" : "fresh handle");
    }
    /* The plans made before the damage still run after everything else. */
    for (int i = 0; i < NPROBLEMS; i++)
        if (before[i])
            run_checked(before[i], i, 3);
    destroy_all(after);
    destroy_all(before);
    attnres_db_close(db);
    attnres_device_close(dev);
    if (defects)
        return EXIT_DEFECT;
    return refusals ? EXIT_REFUSED : EXIT_CORRECT;
}
