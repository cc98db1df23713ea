/* svg_plot.c - see svg_plot.h. */
#include "svg_plot.h"

#include <float.h>
#include <math.h>
#include <string.h>

/* Tableau 10: distinguishable, and readable on white. */
static const char *const palette[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"};
#define NPALETTE (sizeof palette / sizeof palette[0])

#define FONT "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\""

/* Writes text with the XML special characters escaped. */
static void put_text(FILE *out, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*s, out);
        }
    }
}

/* Like put_text, at most max characters, with "..." when cut. */
static void put_text_cut(FILE *out, const char *s, size_t max)
{
    char buf[256];
    size_t n = s ? strlen(s) : 0;
    if (n <= max || max < 4 || max >= sizeof buf) {
        put_text(out, s);
        return;
    }
    memcpy(buf, s, max - 3);
    strcpy(buf + max - 3, "...");
    put_text(out, buf);
}

static void header(FILE *out, double w, double h, const char *title, const char *subtitle)
{
    fprintf(out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
            "viewBox=\"0 0 %.0f %.0f\" " FONT ">\n"
            "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n",
            w, h, w, h, w, h);
    fputs("<title>", out);
    put_text(out, title);
    fputs("</title>\n", out);
    fprintf(out, "<text x=\"%.1f\" y=\"26\" font-size=\"17\" font-weight=\"bold\" fill=\"#222\">", 20.0);
    put_text(out, title);
    fputs("</text>\n", out);
    if (subtitle && *subtitle) {
        fputs("<text x=\"20\" y=\"46\" font-size=\"12\" fill=\"#555\">", out);
        put_text(out, subtitle);
        fputs("</text>\n", out);
    }
}

/* A "nice" step of about range/target: 1, 2 or 5 times a power of ten. */
static double nice_step(double range, int target)
{
    double raw = range / (target > 0 ? target : 5), p, f;
    if (!(raw > 0))
        return 1;
    p = pow(10, floor(log10(raw)));
    f = raw / p;
    return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p;
}

/* Tick labels without noise digits: 0.001 ... 1e+06 as %g does. */
static void fmt_tick(char *buf, size_t len, double v)
{
    if (fabs(v) < 1e-12)
        v = 0;
    snprintf(buf, len, "%g", v);
}

typedef struct axis {
    double lo, hi;     /* data range shown */
    int log;
    double px0, px1;   /* pixels of lo and hi */
} axis;

static double to_px(const axis *a, double v)
{
    double t;
    if (a->log)
        t = (log10(v) - log10(a->lo)) / (log10(a->hi) - log10(a->lo));
    else
        t = (v - a->lo) / (a->hi - a->lo);
    return a->px0 + t * (a->px1 - a->px0);
}

/* The most ticks an axis draws. Tick loops count up to it instead of
 * testing a double against the axis end, which never ends when a step is
 * below the spacing of doubles at a huge value. */
#define MAX_TICKS 1000

/* Chooses a linear range with nice ends that holds [mn, mx]; zero is
 * included when the data are not far from it. Ends are kept finite: data
 * near DBL_MAX round up to infinity otherwise. */
static void linear_range(double mn, double mx, int from_zero, double *lo, double *hi, double *step)
{
    if (from_zero || (mn >= 0 && mn < 0.3 * mx))
        mn = mn < 0 ? mn : 0;
    if (mx <= mn) {
        double pad = fabs(mx) > 0 ? fabs(mx) * 0.1 : 1;
        mn -= pad;
        mx += pad;
    }
    *step = nice_step(isfinite(mx - mn) ? mx - mn : DBL_MAX, 5);
    *lo = floor(mn / *step) * *step;
    *hi = ceil(mx / *step) * *step;
    if (*hi <= *lo)
        *hi = *lo + *step;
    if (!isfinite(*lo))
        *lo = -DBL_MAX;
    if (!isfinite(*hi))
        *hi = DBL_MAX;
}

/* A logarithmic range with ends at 1, 2 or 5 times a power of ten. */
static void log_range(double mn, double mx, double *lo, double *hi)
{
    static const double mult[] = {1, 2, 5, 10};
    double d = floor(log10(mn)), e = floor(log10(mx));
    *lo = pow(10, d);
    for (int i = 2; i >= 0; i--)
        if (mult[i] * pow(10, d) <= mn * (1 + 1e-12)) {
            *lo = mult[i] * pow(10, d);
            break;
        }
    *hi = 10 * pow(10, e);
    for (int i = 0; i < 4; i++)
        if (mult[i] * pow(10, e) >= mx * (1 - 1e-12)) {
            *hi = mult[i] * pow(10, e);
            break;
        }
    if (*hi <= *lo)
        *hi = *lo * 2;
    /* Powers of ten beyond the range of doubles: 10^309 is infinity and
     * 10^-324 is zero, and log10 of either is not a number of decades. */
    if (!(*lo > 0))
        *lo = mn;
    if (!isfinite(*hi))
        *hi = DBL_MAX;
}

/* Draws the horizontal grid and the y tick labels of axis a between x0
 * and x1. */
static void y_ticks(FILE *out, const axis *a, double x0, double x1, double step)
{
    char lab[32];
    if (a->log) {
        double l0 = floor(log10(a->lo) + 1e-9), l1 = ceil(log10(a->hi) - 1e-9);
        /* Converted to int only when finite: the ends of a log axis are
         * positive and finite (log_range), so the decades lie within
         * -324 .. 309, but a caller's axis is checked all the same. */
        if (!isfinite(l0) || !isfinite(l1) || l1 - l0 > MAX_TICKS)
            return;
        int d0 = (int)l0, d1 = (int)l1;
        int decades = d1 - d0;
        for (int d = d0; d <= d1; d++) {
            static const double mult[] = {1, 2, 5};
            for (int m = 0; m < 3; m++) {
                double v = mult[m] * pow(10, d);
                if (!isfinite(v) || v < a->lo * (1 - 1e-9) || v > a->hi * (1 + 1e-9))
                    continue;
                double y = to_px(a, v);
                int major = m == 0;
                fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1\"/>\n",
                        x0, y, x1, y, major ? "#d0d0d0" : "#ececec");
                if (major || decades <= 2) {
                    fmt_tick(lab, sizeof lab, v);
                    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#333\" text-anchor=\"end\">%s</text>\n",
                            x0 - 6, y + 4, lab);
                }
            }
        }
        return;
    }
    if (!(step > 0) || !isfinite(a->lo) || !isfinite(a->hi))
        return;
    for (int k = 0; k <= MAX_TICKS; k++) {
        double v = a->lo + step * k;
        if (!isfinite(v) || !(v <= a->hi + step * 1e-6))
            break;
        double y = to_px(a, v);
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\" stroke-width=\"1\"/>\n", x0,
                y, x1, y);
        fmt_tick(lab, sizeof lab, v);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#333\" text-anchor=\"end\">%s</text>\n", x0 - 6,
                y + 4, lab);
    }
}

static void axis_labels(FILE *out, double x0, double y0, double x1, double y1, const char *x_label,
                        const char *y_label)
{
    /* The frame's left and bottom edges. */
    fprintf(out,
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" stroke-width=\"1.2\"/>\n"
            "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\" stroke-width=\"1.2\"/>\n",
            x0, y0, x0, y1, x0, y1, x1, y1);
    if (y_label) {
        fprintf(out, "<text transform=\"translate(%.1f,%.1f) rotate(-90)\" font-size=\"12\" fill=\"#222\" "
                     "text-anchor=\"middle\">",
                18.0, (y0 + y1) / 2);
        put_text(out, y_label);
        fputs("</text>\n", out);
    }
    if (x_label) {
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#222\" text-anchor=\"middle\">", (x0 + x1) / 2,
                y1 + 40);
        put_text(out, x_label);
        fputs("</text>\n", out);
    }
}

static void legend(FILE *out, double x, double y, const char *const *names, size_t n, int lines)
{
    for (size_t i = 0; i < n; i++) {
        double yy = y + 20.0 * (double)i;
        const char *c = palette[i % NPALETTE];
        if (lines)
            fprintf(out,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"/>"
                    "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
                    x, yy, x + 22, yy, c, x + 11, yy, c);
        else
            fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"12\" fill=\"%s\"/>\n", x + 4, yy - 6, c);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#222\">", x + 28, yy + 4);
        put_text_cut(out, names[i], 40);
        fputs("</text>\n", out);
    }
}

int svg_line_chart(FILE *out, const svg_line_opts *o, const svg_series *s, size_t nseries)
{
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    size_t points = 0;
    for (size_t k = 0; k < nseries; k++)
        for (size_t i = 0; i < s[k].count; i++) {
            double x = s[k].x[i], y = s[k].y[i], e = s[k].err ? s[k].err[i] : 0;
            if (!isfinite(x) || !isfinite(y) || y <= 0)
                continue;
            /* An error bar that reaches beyond the largest double is not
             * drawn, since no axis can hold it. */
            if (!isfinite(e) || e < 0 || !isfinite(y + e))
                e = 0;
            points++;
            xmin = fmin(xmin, x);
            xmax = fmax(xmax, x);
            ymin = fmin(ymin, y - e > 0 ? y - e : y);
            ymax = fmax(ymax, y + e);
        }
    if (points == 0)
        return -1;
    const double W = 940, H = 460, left = 80, right = 290, top = 64, bottom = 64;
    const double x0 = left, x1 = W - right, y0 = top, y1 = H - bottom;
    int log_y = o->log_y < 0 ? ymax / ymin > 10 : o->log_y;
    axis ax = {xmin, xmax, 0, x0 + 20, x1 - 20}, ay = {0, 0, log_y, y1, y0};
    double ystep = 1;
    if (ax.hi <= ax.lo) {
        ax.lo -= 1;
        ax.hi += 1;
    }
    if (log_y) {
        log_range(ymin, ymax, &ay.lo, &ay.hi);
    } else {
        linear_range(ymin, ymax, 0, &ay.lo, &ay.hi, &ystep);
    }

    header(out, W, H, o->title, o->subtitle);
    y_ticks(out, &ay, x0, x1, ystep);
    /* x ticks: integers for run ids, thinned to about 12. */
    {
        double step = nice_step(ax.hi - ax.lo, 8);
        if (o->integer_x && step < 1)
            step = 1;
        double first = ceil(ax.lo / step) * step;
        for (int t = 0; t <= MAX_TICKS; t++) {
            double v = first + step * t;
            if (!isfinite(v) || !(v <= ax.hi + step * 1e-6))
                break;
            char lab[32];
            double x = to_px(&ax, v);
            fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, y1, x, y1 + 5);
            fmt_tick(lab, sizeof lab, v);
            fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#333\" text-anchor=\"middle\">%s</text>\n",
                    x, y1 + 18, lab);
        }
    }
    axis_labels(out, x0, y0, x1, y1, o->x_label, o->y_label);
    if (log_y)
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#777\" text-anchor=\"end\">log scale</text>\n",
                x1, y0 - 6);

    for (size_t k = 0; k < nseries; k++) {
        const char *c = palette[k % NPALETTE];
        int open = 0;
        /* The line, broken at gaps. */
        for (size_t i = 0; i < s[k].count; i++) {
            double x = s[k].x[i], y = s[k].y[i];
            if (!isfinite(x) || !isfinite(y) || y <= 0) {
                if (open)
                    fputs("\"/>\n", out);
                open = 0;
                continue;
            }
            if (!open)
                fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", c);
            fprintf(out, "%s%.1f,%.1f", open ? " " : "", to_px(&ax, x), to_px(&ay, y));
            open = 1;
        }
        if (open)
            fputs("\"/>\n", out);
        /* Error bars and points, each with its tooltip. */
        for (size_t i = 0; i < s[k].count; i++) {
            double x = s[k].x[i], y = s[k].y[i], e = s[k].err ? s[k].err[i] : 0;
            if (!isfinite(x) || !isfinite(y) || y <= 0)
                continue;
            double px = to_px(&ax, x), py = to_px(&ay, y);
            if (isfinite(e) && e > 0 && isfinite(y + e)) {
                double lo = y - e > ay.lo ? y - e : ay.lo, hi = y + e < ay.hi ? y + e : ay.hi;
                double plo = to_px(&ay, lo), phi = to_px(&ay, hi);
                fprintf(out,
                        "<path d=\"M%.1f %.1fV%.1fM%.1f %.1fH%.1fM%.1f %.1fH%.1f\" stroke=\"%s\" stroke-width=\"1.2\"/>\n",
                        px, plo, phi, px - 4, plo, px + 4, px - 4, phi, px + 4, c);
            }
            fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" stroke=\"#fff\" stroke-width=\"1\">", px, py,
                    c);
            if (s[k].label && s[k].label[i]) {
                fputs("<title>", out);
                put_text(out, s[k].label[i]);
                fputs("</title>", out);
            }
            fputs("</circle>\n", out);
        }
    }
    {
        const char *names[64];
        size_t n = nseries < 64 ? nseries : 64;
        for (size_t k = 0; k < n; k++)
            names[k] = s[k].name ? s[k].name : "";
        legend(out, x1 + 20, y0 + 8, names, n, 1);
    }
    fputs("</svg>\n", out);
    return ferror(out) ? -1 : 0;
}

int svg_bar_chart(FILE *out, const svg_bar_opts *o, const char *const *groups, size_t ngroups,
                  const char *const *series, size_t nseries, const double *values)
{
    double vmax = 0;
    size_t bars = 0, longest = 0;
    for (size_t i = 0; i < ngroups * nseries; i++)
        if (isfinite(values[i]) && values[i] >= 0) {
            vmax = fmax(vmax, values[i]);
            bars++;
        }
    if (bars == 0 || nseries == 0)
        return -1;
    for (size_t g = 0; g < ngroups; g++) {
        size_t n = groups[g] ? strlen(groups[g]) : 0;
        longest = n > longest ? n : longest;
    }
    if (longest > 48)
        longest = 48;
    const double bar = nseries > 6 ? 9 : 14, gap = 18;
    /* Labels run down-left at -40 degrees: about 4.8 px across a character,
     * so the first group's label needs room on the left. */
    const double label_w = 4.8 * (double)longest + 10;
    const double natural_w = bar * (double)nseries + gap;
    const double plot_w = fmax(560, natural_w * (double)ngroups);
    const double group_w = plot_w / (double)(ngroups ? ngroups : 1);
    const double left = fmax(80, label_w - group_w / 2 + 20), right = 290, top = 64;
    const double bottom = 50 + 6.2 * (double)longest * 0.64;
    const double W = left + plot_w + right, H = top + 340 + bottom;
    const double x0 = left, x1 = left + plot_w, y0 = top, y1 = top + 340;
    double lo, hi, step;
    double shown_max = o->reference > 0 && o->reference <= vmax * 1.25 ? fmax(vmax, o->reference) : vmax;
    linear_range(0, shown_max, 1, &lo, &hi, &step);
    axis ay = {lo, hi, 0, y1, y0};

    header(out, W, H, o->title, o->subtitle);
    y_ticks(out, &ay, x0, x1, step);
    for (size_t g = 0; g < ngroups; g++) {
        double gx = x0 + group_w * (double)g + (group_w - bar * (double)nseries) / 2;
        for (size_t k = 0; k < nseries; k++) {
            double v = values[g * nseries + k];
            if (!isfinite(v) || v < 0)
                continue;
            double top_px = to_px(&ay, v > hi ? hi : v);
            fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">", gx + bar * (double)k,
                    top_px, bar - 1, y1 - top_px, palette[k % NPALETTE]);
            fputs("<title>", out);
            put_text(out, groups[g]);
            fputs(", ", out);
            put_text(out, series[k]);
            fprintf(out, ": %.1f</title></rect>\n", v);
        }
        double cx = gx + bar * (double)nseries / 2;
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", cx, y1, cx, y1 + 4);
        fprintf(out,
                "<text transform=\"translate(%.1f,%.1f) rotate(-40)\" font-size=\"10.5\" fill=\"#333\" "
                "text-anchor=\"end\">",
                cx + 3, y1 + 14);
        put_text_cut(out, groups[g], 48);
        fputs("</text>\n", out);
    }
    if (o->reference > 0 && o->reference <= hi) {
        double y = to_px(&ay, o->reference);
        fprintf(out,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#c0392b\" stroke-width=\"1.5\" "
                "stroke-dasharray=\"6 4\"/>\n",
                x0, y, x1, y);
        if (o->reference_name) {
            fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#c0392b\" text-anchor=\"end\">", x1 - 4,
                    y - 5);
            put_text(out, o->reference_name);
            fputs("</text>\n", out);
        }
    }
    axis_labels(out, x0, y0, x1, y1, NULL, o->y_label);
    legend(out, x1 + 20, y0 + 8, series, nseries < 64 ? nseries : 64, 0);
    fputs("</svg>\n", out);
    return ferror(out) ? -1 : 0;
}
