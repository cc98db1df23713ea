/*
 * cmd_db_plot.c - `attnres db plot`: the history as pictures. One line
 * chart per problem (the winner's latency across runs, one line per
 * device, error bars from the spread), one grouped bar chart of the % of
 * ceiling each of the last runs achieved by problem, and an index.html
 * that shows them all.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ardb.h"
#include "ardb_tools.h"
#include "atomic_file.h"
#include "cli.h"
#include "cmd_db.h"
#include "svg_plot.h"

#define DEFAULT_RUNS 8

/* Every file of a plot is written to a temporary first (atomic_file.h) and
 * the temporaries are renamed into place only when all of them were
 * written, so a failure leaves each file in DIR as it was. */
typedef struct plot_ctx {
    const char *dir;
    atomic_file index;
    int has_index;
    atomic_file *outs; /* the charts written, closed, not yet renamed */
    size_t nouts, cap;
    size_t files;
    const ardb_run_info *runs;
    size_t nruns;
} plot_ctx;

static const ardb_run_info *find_run(const plot_ctx *c, int64_t id)
{
    for (size_t i = 0; i < c->nruns; i++)
        if (c->runs[i].id == id)
            return &c->runs[i];
    return NULL;
}

/* A step of atomic_file.h as the plot takes it: its failure printed. */
static char step_msg[1024];
static int step(int rc)
{
    if (rc)
        cli_error("db", "%s", step_msg);
    return rc;
}
#define out_open(o, path) step(atomic_file_open(o, path, step_msg, sizeof step_msg))
#define out_close(o) step(atomic_file_close(o, step_msg, sizeof step_msg))
#define out_commit(o) step(atomic_file_commit(o, step_msg, sizeof step_msg))

/* Opens a temporary for DIR/name and notes the chart in the index; the
 * chart is c->outs[c->nouts - 1] until close_output. */
static FILE *open_output(plot_ctx *c, const char *name, const char *caption)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", c->dir, name);
    if (c->nouts == c->cap) {
        size_t ncap = c->cap ? 2 * c->cap : 16;
        atomic_file *n = realloc(c->outs, ncap * sizeof *n);
        if (!n) {
            cli_error("db", "out of memory");
            return NULL;
        }
        c->outs = n;
        c->cap = ncap;
    }
    if (out_open(&c->outs[c->nouts], path))
        return NULL;
    c->nouts++;
    if (c->has_index)
        fprintf(c->index.f, "<figure><img src=\"%s\" alt=\"%s\"><figcaption>%s</figcaption></figure>\n", name,
                caption, caption);
    return c->outs[c->nouts - 1].f;
}

/* Closes the chart open_output opened; -1 when it could not be written. */
static int close_output(plot_ctx *c)
{
    return out_close(&c->outs[c->nouts - 1]);
}

static void slug(const char *key, char *out, size_t len)
{
    size_t j = 0;
    for (size_t i = 0; key[i] && j + 1 < len; i++)
        out[j++] = isalnum((unsigned char)key[i]) ? key[i] : '_';
    out[j] = '\0';
}

/* One problem's chart from points[lo, hi) (sorted by device, then run). */
static int latency_chart(plot_ctx *c, const ardb_winner_point *p, size_t lo, size_t hi, size_t index)
{
    size_t n = hi - lo, nseries = 0;
    double *x = calloc(n, sizeof *x), *y = calloc(n, sizeof *y), *err = calloc(n, sizeof *err);
    char **labels = calloc(n, sizeof *labels);
    svg_series *series = calloc(n, sizeof *series);
    int rc = -1;
    if (!x || !y || !err || !labels || !series) {
        cli_error("db", "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const ardb_winner_point *q = &p[lo + i];
        const ardb_run_info *r = find_run(c, q->run_id);
        char label[512], run_label[128] = "";
        if (r)
            db_run_label(r, run_label, sizeof run_label);
        else
            snprintf(run_label, sizeof run_label, "run %" PRId64, q->run_id);
        snprintf(label, sizeof label, "%s: %.3f us +- %.3f, %s, %.1f%% of its ceiling%s%s", run_label, q->median_us,
                 q->spread_us, q->variant ? q->variant : "?", 100.0 * q->ceiling_fraction, r && r->note ? "; " : "",
                 r && r->note ? r->note : "");
        x[i] = (double)q->run_id;
        y[i] = q->median_us;
        err[i] = q->spread_us;
        labels[i] = strdup(label);
        if (i == 0 || q->device_id != p[lo + i - 1].device_id) {
            series[nseries].name = q->device ? q->device : "?";
            series[nseries].x = &x[i];
            series[nseries].y = &y[i];
            series[nseries].err = &err[i];
            series[nseries].label = (const char *const *)&labels[i];
            nseries++;
        }
        series[nseries - 1].count++;
    }
    char name[400], key_slug[300], title[400], subtitle[300];
    slug(p[lo].problem ? p[lo].problem : "problem", key_slug, sizeof key_slug);
    snprintf(name, sizeof name, "latency-%03zu-%s.svg", index + 1, key_slug);
    snprintf(title, sizeof title, "Winner latency: %s", p[lo].problem ? p[lo].problem : "?");
    snprintf(subtitle, sizeof subtitle,
             "median time of each run's winner; error bars: median absolute deviation; %zu point(s)", n);
    FILE *f = open_output(c, name, title);
    if (!f)
        goto done;
    svg_line_opts o = {.title = title, .subtitle = subtitle, .x_label = "run id", .y_label = "latency (us)",
                       .log_y = -1, .integer_x = 1};
    rc = svg_line_chart(f, &o, series, nseries);
    if (close_output(c) != 0)
        rc = -1;
    else if (rc)
        cli_error("db", "writing %s/%s failed: no point to draw", c->dir, name);
done:
    for (size_t i = 0; labels && i < n; i++)
        free(labels[i]);
    free(labels);
    free(series);
    free(x);
    free(y);
    free(err);
    return rc;
}

/* The grouped bars: problems of the last `last` runs with winners. */
static int ceiling_chart(plot_ctx *c, const ardb_winner_point *p, size_t n, int64_t last)
{
    const ardb_run_info *chosen[64];
    size_t ns = 0;
    if (last > 64)
        last = 64;
    for (size_t i = c->nruns; i-- > 0 && (int64_t)ns < last;)
        if (c->runs[i].winners > 0)
            chosen[ns++] = &c->runs[i];
    if (ns == 0)
        return 0;
    /* Oldest first, left to right in each group. */
    for (size_t i = 0; i < ns / 2; i++) {
        const ardb_run_info *t = chosen[i];
        chosen[i] = chosen[ns - 1 - i];
        chosen[ns - 1 - i] = t;
    }
    const char **groups = calloc(n ? n : 1, sizeof *groups);
    double *values = malloc((n ? n : 1) * ns * sizeof *values);
    char(*names)[160] = calloc(ns, sizeof *names);
    const char *series[64];
    int rc = -1;
    if (!groups || !values || !names) {
        cli_error("db", "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n * ns; i++)
        values[i] = NAN;
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) {
        size_t s;
        for (s = 0; s < ns && chosen[s]->id != p[i].run_id; s++)
            ;
        if (s == ns)
            continue;
        if (ng == 0 || strcmp(groups[ng - 1], p[i].problem) != 0) {
            groups[ng] = p[i].problem;
            for (size_t k = 0; k < ns; k++)
                values[ng * ns + k] = NAN;
            ng++;
        }
        double v = 100.0 * p[i].ceiling_fraction, *slot = &values[(ng - 1) * ns + s];
        if (isfinite(v) && (!isfinite(*slot) || v > *slot))
            *slot = v; /* several devices in one run: the best */
    }
    for (size_t s = 0; s < ns; s++) {
        /* "run 3 revalidate 11-29 12:44: note" fits the legend. */
        const char *t = chosen[s]->started_at ? chosen[s]->started_at : "";
        snprintf(names[s], sizeof names[s], "run %" PRId64 " %s %.5s %.5s%s%s", chosen[s]->id,
                 chosen[s]->strategy ? chosen[s]->strategy : "?", strlen(t) >= 10 ? t + 5 : "",
                 strlen(t) >= 16 ? t + 11 : "", chosen[s]->note ? ": " : "", chosen[s]->note ? chosen[s]->note : "");
        series[s] = names[s];
    }
    char subtitle[300];
    snprintf(subtitle, sizeof subtitle,
             "winner's bandwidth / the run's ceiling for its traffic (copy bandwidth in runs that measured no "
             "ceilings); the last %zu run(s) with winners, one bar each",
             ns);
    FILE *f = open_output(c, "ceiling.svg", "Achieved % of ceiling by problem, per run");
    if (!f)
        goto done;
    svg_bar_opts o = {.title = "Achieved % of ceiling by problem, per run", .subtitle = subtitle,
                      .y_label = "% of ceiling", .reference = 100.0,
                      .reference_name = "measured ceiling (100%)"};
    rc = svg_bar_chart(f, &o, groups, ng, series, ns, values);
    if (close_output(c) != 0)
        rc = -1;
    else if (rc)
        cli_error("db", "writing %s/ceiling.svg failed: no bar to draw", c->dir);
done:
    free(groups);
    free(values);
    free(names);
    return rc;
}

int db_cmd_plot(int argc, char **argv)
{
    const char *path = "attnres.db", *dir = NULL;
    int64_t last = DEFAULT_RUNS;
    const cli_opt opts[] = {CLI_OPT_STRING("--db", &path),
                            CLI_OPT_STRING("--out", &dir, .required = "plot needs --out DIR"),
                            CLI_OPT_INT64("--runs", &last, 1, 64), CLI_OPT_END};
    const cli_spec spec = {.cmd = "db", .opts = opts};
    if (cli_parse(&spec, argc, argv) != CLI_PARSED)
        return CLI_EXIT_USAGE;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        cli_error("db", "cannot create %s: %s", dir, strerror(errno));
        return CLI_EXIT_FAIL;
    }
    ardb *db;
    if (db_open(path, ARDB_READONLY, &db))
        return CLI_EXIT_FAIL;
    ardb_winner_point *p = NULL;
    ardb_run_info *runs = NULL;
    size_t n = 0, nruns = 0;
    int code = CLI_EXIT_FAIL;
    plot_ctx c = {.dir = dir};
    if (ardb_winner_history(db, &p, &n) != ARDB_DONE || ardb_run_list(db, &runs, &nruns) != ARDB_DONE) {
        cli_error("db", "%s", ardb_errmsg(db));
        goto done;
    }
    if (n == 0) {
        cli_error("db", "%s holds no winners to plot", path);
        goto done;
    }
    c.runs = runs;
    c.nruns = nruns;
    char index_path[4200];
    snprintf(index_path, sizeof index_path, "%s/index.html", dir);
    /* The index is part of the plot: without it the plot fails. */
    if (out_open(&c.index, index_path))
        goto done;
    c.has_index = 1;
    fprintf(c.index.f, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>attnres: %s</title>"
                         "<style>body{font-family:sans-serif} img{max-width:100%%;border:1px solid #ddd}"
                         "</style></head><body>\n<h1>attnres tuning history</h1>\n",
                path);
    int ok = ceiling_chart(&c, p, n, last) == 0;
    size_t charts = 0;
    for (size_t lo = 0; lo < n && ok;) {
        size_t hi = lo + 1;
        while (hi < n && p[hi].problem_id == p[lo].problem_id)
            hi++;
        ok = latency_chart(&c, p, lo, hi, charts++) == 0;
        lo = hi;
    }
    fputs("</body></html>\n", c.index.f);
    if (out_close(&c.index))
        ok = 0;
    /* Only now, with every file written, do they replace the old ones. */
    for (size_t i = 0; i < c.nouts && ok; i++) {
        ok = out_commit(&c.outs[i]) == 0;
        if (ok) {
            printf("%s\n", c.outs[i].path);
            c.files++;
        }
    }
    if (ok && out_commit(&c.index) == 0) {
        printf("%s\n", index_path);
        c.files++;
    } else {
        ok = 0;
    }
    if (ok)
        fprintf(stderr, "attnres db: wrote %zu file(s) to %s (%zu problem(s), %zu run(s))\n", c.files, dir, charts,
                nruns);
    code = ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
done:
    for (size_t i = 0; i < c.nouts; i++)
        atomic_file_discard(&c.outs[i]);
    free(c.outs);
    if (c.has_index)
        atomic_file_discard(&c.index);
    ardb_winner_points_free(p, n);
    ardb_run_infos_free(runs, nruns);
    ardb_close(db);
    return code;
}
