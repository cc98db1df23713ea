/*
 * plan_load.c - model load of the K3-shaped model (examples/k3_model.h):
 * the time to plan all 186 routing sites from a warm database.
 *
 * "Warm": the database holds the winners, and the binary cache holds their
 * compiled kernels, so that planning compiles nothing. The first load of the
 * process (which also loads each kernel's shared object for the first time)
 * is reported apart from the median of the following ones. Opening the
 * device and the database is timed separately: an engine does that once.
 *
 * The database handle remembers its lookups, so a later load on the same
 * handle does no SQL at all. --reopen opens the database again before each
 * load (timed apart), so that every load starts with nothing remembered,
 * as an engine's one model load does.
 *
 * Usage: plan_load [--db FILE] [--form phase|mix] [--dtype f32|bf16]
 *                  [--d D] [--loads R] [--require-exact] [--reopen]
 * Links libattnres.so, as an engine would.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <attnres.h>

#include "k3_model.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int usage(void)
{
    fprintf(stderr, "usage: plan_load [--db FILE] [--form phase|mix] [--dtype f32|bf16] [--d D] [--loads R] "
                    "[--require-exact] [--reopen]\n");
    return 2;
}

int main(int argc, char **argv)
{
    const char *dbpath = NULL;
    k3_form form = K3_FORM_PHASE;
    attnres_dtype dtype = ATTNRES_DTYPE_F32;
    int64_t d = 256;
    int loads = 21;
    unsigned flags = 0;
    int reopen = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--require-exact")) {
            flags |= ATTNRES_PLAN_REQUIRE_EXACT;
            continue;
        }
        if (!strcmp(a, "--reopen")) {
            reopen = 1;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--db"))
            dbpath = v;
        else if (!strcmp(a, "--form") && (!strcmp(v, "phase") || !strcmp(v, "mix")))
            form = strcmp(v, "mix") ? K3_FORM_PHASE : K3_FORM_MIX;
        else if (!strcmp(a, "--dtype") && !attnres_dtype_parse(v, &dtype))
            ;
        else if (!strcmp(a, "--d"))
            d = strtoll(v, NULL, 10);
        else if (!strcmp(a, "--loads"))
            loads = atoi(v);
        else
            return usage();
    }
    if (d < 1 || loads < 2)
        return usage();
    char msg[512];
    attnres_device *dev = NULL;
    attnres_db *db = NULL;
    static attnres_plan *plans[K3_SITES];
    double *times = malloc(sizeof(double) * (size_t)loads);
    int code = 1, levels[4] = {0};
    double t0 = now_ms();
    if (!times || attnres_device_open("cpu", &dev, msg, sizeof msg)) {
        fprintf(stderr, "plan_load: cannot open the CPU: %s\n", msg);
        goto done;
    }
    const double dev_ms = now_ms() - t0;
    t0 = now_ms();
    if (dbpath && attnres_db_open(dbpath, &db, msg, sizeof msg)) {
        fprintf(stderr, "plan_load: %s\n", msg);
        goto done;
    }
    const double db_ms = now_ms() - t0;
    double reopen_ms = 0;
    for (int r = 0; r < loads; r++) {
        if (reopen && db && r > 0) {
            t0 = now_ms();
            attnres_db_close(db);
            db = NULL;
            if (attnres_db_open(dbpath, &db, msg, sizeof msg)) {
                fprintf(stderr, "plan_load: %s\n", msg);
                goto done;
            }
            reopen_ms += now_ms() - t0;
        }
        t0 = now_ms();
        for (int s = 0; s < K3_SITES; s++) {
            attnres_problem p = k3_site_problem(form, dtype, d, s);
            int st = attnres_plan_create(dev, db, &p, flags, &plans[s], msg, sizeof msg);
            if (st) {
                fprintf(stderr, "plan_load: site %d: %s: %s\n", s, attnres_errstr(st), msg);
                for (int k = 0; k < s; k++)
                    attnres_plan_destroy(plans[k]);
                goto done;
            }
        }
        times[r] = now_ms() - t0;
        for (int s = 0; s < K3_SITES; s++) {
            if (r == 0)
                levels[attnres_plan_level_get(plans[s])]++;
            attnres_plan_destroy(plans[s]);
        }
    }
    const double first = times[0];
    qsort(times + 1, (size_t)loads - 1, sizeof *times, cmp_double);
    const double med = times[1 + (loads - 1) / 2];
    printf("model load, K3-shaped (%d sites, %s form), %s d = %lld, %s%s\n", K3_SITES,
           form == K3_FORM_PHASE ? "two-phase" : "mix", attnres_dtype_name(dtype), (long long)d,
           dbpath ? dbpath : "no database", reopen && db ? ", database opened again for each load" : "");
    printf("plan levels: %d exact, %d same architecture, %d same backend, %d built-in generic\n", levels[0],
           levels[1], levels[2], levels[3]);
    printf("%-34s %10s %12s\n", "step", "ms", "us per site");
    printf("%-34s %10.3f %12s\n", "open device (once)", dev_ms, "");
    printf("%-34s %10.3f %12s\n", "open database (once)", db_ms, "");
    if (reopen && db)
        printf("%-34s %10.3f %12s\n", "close and open again (mean)", reopen_ms / (loads - 1), "");
    printf("%-34s %10.3f %12.1f\n", "plan all sites, first load", first, 1e3 * first / K3_SITES);
    printf("%-34s %10.3f %12.1f\n", "plan all sites, median of later", med, 1e3 * med / K3_SITES);
    printf("%-34s %10.3f %12.1f\n", "plan all sites, fastest later", times[1], 1e3 * times[1] / K3_SITES);
    code = 0;
done:
    free(times);
    attnres_db_close(db);
    attnres_device_close(dev);
    return code;
}
