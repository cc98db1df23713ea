/*
 * svg_plot.h - two kinds of chart as hand-written SVG (no libraries): a
 * line chart with error bars (latency across runs) and a grouped bar chart
 * (% of ceiling by problem, one bar per run). Axes, ticks, labels, a
 * title and a legend; a logarithmic y axis when asked or when the data
 * span more than a factor of ten.
 */
#ifndef TUNER_SVG_PLOT_H
#define TUNER_SVG_PLOT_H

#include <stddef.h>
#include <stdio.h>

/* One line: count points (x[i], y[i]); y NaN leaves a gap. err (may be
 * NULL) draws y +- err[i]; label (may be NULL) is each point's tooltip. */
typedef struct svg_series {
    const char *name;
    size_t count;
    const double *x, *y, *err;
    const char *const *label;
} svg_series;

typedef struct svg_line_opts {
    const char *title, *subtitle, *x_label, *y_label;
    int log_y;     /* 1 log, 0 linear, -1 log when max/min > 10 */
    int integer_x; /* x ticks at integers only (run ids) */
} svg_line_opts;

/* Writes a whole SVG document to out. Returns 0, or -1 when there is no
 * finite point to draw or writing failed. */
int svg_line_chart(FILE *out, const svg_line_opts *o, const svg_series *s,
                   size_t nseries);

typedef struct svg_bar_opts {
    const char *title, *subtitle, *y_label;
    double reference;           /* a dashed line at this y, 0: none */
    const char *reference_name; /* its label */
} svg_bar_opts;

/* Grouped bars: groups along x, one bar per series in each group, value
 * values[g * nseries + s] (NaN: no bar). Returns 0 or -1 as above. */
int svg_bar_chart(FILE *out, const svg_bar_opts *o, const char *const *groups,
                  size_t ngroups, const char *const *series, size_t nseries,
                  const double *values);

#endif
