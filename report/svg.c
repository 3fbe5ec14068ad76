/* rankmem-report: the picture. Per-rank peak bytes (top panel, with the
 * device's capacity as a line) and leaked bytes (bottom panel, its own
 * scale: leaks are usually far smaller than peaks) as bars.
 *
 * Up to max_bars ranks get one bar each. Beyond that the ranks, in the
 * chosen order, are cut into max_bars bins of consecutive ranks (sizes
 * differing by at most one), and each bin is three bars from zero drawn
 * over each other: its max (light), its mean, its min (dark). A job of
 * 10,000 ranks stays a picture of 200 readable bars, and no rank's extreme
 * is lost in a bin: the light tops are the worst ranks.
 *
 * The numbers behind each mark are also in data-* attributes, so that a
 * test (tests/report_tool/check.py) can check the picture against the
 * report without measuring pixels. */
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Layout, in SVG user units (pixels at 100%). */
#define W 1000.0
#define ML 96.0  /* left margin: the y labels */
#define MR 24.0
#define PEAK_TOP 104.0
#define PEAK_H 300.0
#define LEAK_TOP (PEAK_TOP + PEAK_H + 86.0)
#define LEAK_H 150.0
#define H (LEAK_TOP + LEAK_H + 70.0)
#define PW (W - ML - MR)
#define LABELLED_BARS 48 /* up to this many bars, each gets its rank below */

/* Writes s with XML's five characters escaped; bytes outside printable
 * ASCII become '?' (the plugin writes ASCII; this keeps any input from
 * making the document ill-formed). */
static void xml_text(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default:
            fputc(c >= 0x20 && c < 0x7f ? (int)c : '?', f);
        }
    }
}

/* A scale from 0 to a round number of a binary unit at or above v, with
 * 4 to 8 steps of 1, 2, 2.5 or 5 times a power of ten of that unit. */
typedef struct {
    double max, step, unit;
    const char *uname;
} scale_t;

static scale_t nice_scale(double v)
{
    static const char *const names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    scale_t s = {1.0, 1.0, 1.0, "B"};
    if (!(v > 0))
        return s;
    int u = 0;
    double unit = 1.0;
    while (v >= 1024.0 * unit && u < 6) {
        unit *= 1024.0;
        u++;
    }
    double x = v / unit, raw = x / 5.0;
    double mag = pow(10.0, floor(log10(raw)));
    static const double mult[] = {1, 2, 2.5, 5, 10};
    double step = 10 * mag;
    for (int i = 0; i < 5; i++)
        if (mult[i] * mag >= raw) {
            step = mult[i] * mag;
            break;
        }
    if (u == 0 && step < 1)
        step = 1; /* no fractions of a byte */
    s.max = ceil(x / step - 1e-9) * step * unit;
    s.step = step * unit;
    s.unit = unit;
    s.uname = names[u];
    return s;
}

/* A label on a light box, so that it reads over bars: the box's width is
 * estimated (about 0.6 em a character), there being no text measuring in
 * SVG. anchor_end: x is the right edge, else the left. */
static void boxed_label(FILE *f, const char *cls, double x, double y, int anchor_end,
                        double font_px, const char *text)
{
    double w = 0.6 * font_px * (double)strlen(text) + 6;
    double x0 = anchor_end ? x - w + 3 : x - 3;
    fprintf(f, "<rect class=\"labelbox\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"/>",
            x0, y - font_px, w, font_px + 4);
    fprintf(f, "<text class=\"%s\" x=\"%.2f\" y=\"%.2f\"%s>", cls, x, y,
            anchor_end ? " text-anchor=\"end\"" : "");
    xml_text(f, text);
    fprintf(f, "</text>\n");
}

static double y_of(double v, double top, double h, double smax)
{
    return top + h - v / smax * h;
}

/* One bar or bin: positions [first, last] of the order. */
typedef struct {
    size_t first, last;
    uint64_t min, max;
    double mean;
    int rmin, rmax;  /* ranks holding them (lowest on ties) */
} bin_t;

static void make_bins(const rr_report_t *rep, const size_t *order, size_t nbars, int field,
                      bin_t *bins)
{
    size_t n = rep->n;
    for (size_t b = 0; b < nbars; b++) {
        bin_t *x = &bins[b];
        /* bin b holds positions [b n / nbars, (b+1) n / nbars) */
        x->first = (size_t)((double)b * (double)n / (double)nbars);
        size_t end = (size_t)((double)(b + 1) * (double)n / (double)nbars);
        if (b + 1 == nbars)
            end = n;
        x->last = end - 1;
        x->min = UINT64_MAX;
        x->max = 0;
        x->rmin = x->rmax = -1;
        long double sum = 0;
        for (size_t p = x->first; p < end; p++) {
            const rr_rank_t *r = &rep->ranks[order[p]];
            uint64_t v = rm_value(r, field);
            if (x->rmin < 0 || v < x->min || (v == x->min && r->rank < x->rmin)) {
                x->min = v;
                x->rmin = r->rank;
            }
            if (x->rmax < 0 || v > x->max || (v == x->max && r->rank < x->rmax)) {
                x->max = v;
                x->rmax = r->rank;
            }
            sum += (long double)v;
        }
        x->mean = (double)(sum / (long double)(end - x->first));
    }
}

static void scale_ticks(FILE *f, const scale_t *s, double top, double h)
{
    fprintf(f, "<g class=\"yaxis\">\n");
    for (double v = 0; v <= s->max * (1 + 1e-9); v += s->step) {
        double y = y_of(v, top, h, s->max);
        fprintf(f, "<line class=\"grid\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>", ML, y,
                ML + PW, y);
        if (v == 0)
            fprintf(f, "<text class=\"tick\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">0</text>\n",
                    ML - 6, y + 4);
        else
            fprintf(f, "<text class=\"tick\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">%g %s"
                       "</text>\n", ML - 6, y + 4, v / s->unit, s->uname);
    }
    fprintf(f, "<line class=\"axis\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>", ML,
            top + h, ML + PW, top + h);
    fprintf(f, "<line class=\"axis\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n</g>\n", ML,
            top, ML, top + h);
}

/* Labels under the bars: every rank when they are few, else about ten. */
static void x_labels(FILE *f, const rr_report_t *rep, const size_t *order, const bin_t *bins,
                     size_t nbars, int binned, int by_peak, double top, double h)
{
    double slot = PW / (double)nbars;
    size_t every = nbars <= LABELLED_BARS ? 1 : (nbars + 9) / 10;
    fprintf(f, "<g class=\"xaxis\">\n");
    for (size_t b = 0; b < nbars; b += every) {
        double x = ML + ((double)b + 0.5) * slot;
        char lab[48];
        if (!binned || bins[b].first == bins[b].last) {
            size_t p = binned ? bins[b].first : b;
            if (by_peak && nbars > LABELLED_BARS)
                snprintf(lab, sizeof lab, "%zu", p + 1);
            else
                snprintf(lab, sizeof lab, "%d", rep->ranks[order[p]].rank);
        } else if (by_peak) {
            snprintf(lab, sizeof lab, "%zu", bins[b].first + 1);
        } else {
            snprintf(lab, sizeof lab, "%d", rep->ranks[order[bins[b].first]].rank);
        }
        fprintf(f, "<line class=\"axis\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>", x,
                top + h, x, top + h + 4);
        fprintf(f, "<text class=\"tick\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
                x, top + h + 17, lab);
    }
    const char *cap;
    if (by_peak)
        cap = nbars > LABELLED_BARS ? "position, largest peak first" : "rank, largest peak first";
    else
        cap = binned ? "rank (first of each bin)" : "rank";
    fprintf(f, "<text class=\"caption\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%s</text>\n",
            ML + PW / 2, top + h + 36, cap);
    fprintf(f, "</g>\n");
}

/* One panel: bars (or bins) of one field. */
static void panel(FILE *f, const rr_analysis_t *a, const size_t *order, const bin_t *bins,
                  size_t nbars, int binned, int field, const char *cls, const char *id,
                  double top, double h, const scale_t *s)
{
    const rr_report_t *rep = a->rep;
    char b1[32], b2[32], b3[32];
    double slot = PW / (double)nbars;
    double bw = slot >= 3 ? slot * 0.8 : slot;
    fprintf(f, "<g id=\"%s\" class=\"panel\" data-field=\"%s\" data-top=\"%.2f\" "
               "data-height=\"%.2f\" data-left=\"%.2f\" data-width=\"%.2f\" "
               "data-scale-max=\"%.0f\" data-bars=\"%zu\">\n",
            id, rr_fields[field].key, top, h, ML, PW, s->max, nbars);
    scale_ticks(f, s, top, h);
    for (size_t b = 0; b < nbars; b++) {
        double x = ML + (double)b * slot + (slot - bw) / 2;
        if (!binned) {
            const rr_rank_t *r = &rep->ranks[order[b]];
            double v = (double)rm_value(r, field);
            double y = y_of(v, top, h, s->max);
            fprintf(f, "<rect class=\"%s\" data-rank=\"%d\" data-bytes=\"%llu\" x=\"%.2f\" "
                       "y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"><title>rank %d on ",
                    cls, r->rank, (unsigned long long)rm_value(r, field), x, y, bw, top + h - y,
                    r->rank);
            xml_text(f, r->host);
            fprintf(f, ": %s %s</title></rect>\n", rr_field_label(a, field),
                    rr_fmt_bytes(b1, sizeof b1, v));
            continue;
        }
        const bin_t *x0 = &bins[b];
        fprintf(f, "<g class=\"bin\" data-first=\"%zu\" data-last=\"%zu\" data-ranks=\"%zu\" "
                   "data-min=\"%llu\" data-mean=\"%.17g\" data-max=\"%llu\" "
                   "data-min-rank=\"%d\" data-max-rank=\"%d\">",
                x0->first, x0->last, x0->last - x0->first + 1, (unsigned long long)x0->min,
                x0->mean, (unsigned long long)x0->max, x0->rmin, x0->rmax);
        fprintf(f, "<title>positions %zu to %zu (%zu ranks): %s min %s (rank %d), mean %s, "
                   "max %s (rank %d)</title>",
                x0->first + 1, x0->last + 1, x0->last - x0->first + 1, rr_field_label(a, field),
                rr_fmt_bytes(b1, sizeof b1, (double)x0->min), x0->rmin,
                rr_fmt_bytes(b2, sizeof b2, x0->mean), rr_fmt_bytes(b3, sizeof b3, (double)x0->max),
                x0->rmax);
        /* max, then mean, then min over it: each shorter one stays visible */
        const double v3[3] = {(double)x0->max, x0->mean, (double)x0->min};
        static const char *const part[3] = {"max", "mean", "min"};
        for (int k = 0; k < 3; k++) {
            double y = y_of(v3[k], top, h, s->max);
            fprintf(f, "<rect class=\"%s %s-%s\" data-part=\"%s\" x=\"%.2f\" y=\"%.2f\" "
                       "width=\"%.2f\" height=\"%.2f\"/>",
                    cls, cls, part[k], part[k], x, y, bw, top + h - y);
        }
        fprintf(f, "</g>\n");
    }
    /* the mean over all ranks, dotted */
    double mean = a->agg[field].mean;
    double ym = y_of(mean, top, h, s->max);
    fprintf(f, "<line id=\"%s-mean\" class=\"mean\" data-bytes=\"%.17g\" x1=\"%.2f\" y1=\"%.2f\" "
               "x2=\"%.2f\" y2=\"%.2f\"/>",
            id, mean, ML, ym, ML + PW, ym);
    char lab[48];
    snprintf(lab, sizeof lab, "mean %s", rr_fmt_bytes(b1, sizeof b1, mean));
    boxed_label(f, "note", ML + PW - 4, ym - 4, 1, 11, lab);
    x_labels(f, rep, order, bins, nbars, binned, order == a->by_peak, top, h);
    fprintf(f, "</g>\n");
}

static const size_t *rank_order(const rr_report_t *rep);

static const rr_rank_t *cmp_ranks_;
static int cmp_by_rank(const void *a, const void *b)
{
    int x = cmp_ranks_[*(const size_t *)a].rank, y = cmp_ranks_[*(const size_t *)b].rank;
    return (x > y) - (x < y);
}

/* The indices of the ranks by rank number (the file's order is the
 * communicator's, which need not be sorted). Caller frees. */
static const size_t *rank_order(const rr_report_t *rep)
{
    size_t *o = malloc((rep->n ? rep->n : 1) * sizeof *o);
    if (!o)
        return NULL;
    for (size_t i = 0; i < rep->n; i++)
        o[i] = i;
    cmp_ranks_ = rep->ranks;
    qsort(o, rep->n, sizeof *o, cmp_by_rank);
    return o;
}

/* ------------------------------------------------------------------------
 * The timeline (schema 2): a rank x time heat map of the program's GPU
 * bytes, and curves per rank (or, for many ranks, the max, mean and min
 * over ranks and the curve of the rank with the largest peak), with the
 * phase marks on both. */

#define TL_GAP 80.0
#define HEAT_H 240.0
#define CURVE_GAP 80.0
#define CURVE_H 220.0
#define TL_H (TL_GAP + HEAT_H + CURVE_GAP + CURVE_H + 50.0)
#define HEAT_ROWS 128  /* more ranks than this: a row is a bin of ranks (its max) */
#define CURVES_MAX 16  /* more ranks than this: envelopes, not one curve each */

static double x_of_t(double t, double t_end)
{
    return ML + (t_end > 0 ? t / t_end : 0) * PW;
}

static void time_axis(FILE *f, double t_end, double y)
{
    fprintf(f, "<g class=\"xaxis\">");
    for (int k = 0; k <= 4; k++) {
        double t = t_end * k / 4, x = x_of_t(t, t_end);
        fprintf(f, "<line class=\"axis\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>"
                   "<text class=\"tick\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"middle\">%.3g s</text>",
                x, y, x, y + 4, x, y + 16, t);
    }
    fprintf(f, "</g>\n");
}

static void phase_marks(FILE *f, const rr_report_t *rep, double top, double h, int labels)
{
    double t_end = rep->t_end_s;
    for (size_t i = 0; i < rep->nphases; i++) {
        const rr_phase_t *p = &rep->phases[i];
        double x = x_of_t(p->t_start_s, t_end);
        fprintf(f, "<line class=\"phase\" data-phase=\"%zu\" x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" "
                   "y2=\"%.2f\"/>", i, x, top, x, top + h);
        if (labels) {
            fprintf(f, "<text class=\"phaselabel\" x=\"%.2f\" y=\"%.2f\">", x + 3,
                    top + 12 + 12.0 * (double)(i % 3));
            xml_text(f, p->name);
            fprintf(f, "</text>");
        }
        fprintf(f, "\n");
    }
}

/* White to dark blue. */
static void heat_colour(double q, int *r, int *g, int *b)
{
    if (q < 0)
        q = 0;
    if (q > 1)
        q = 1;
    *r = (int)(247 + (8 - 247) * q);
    *g = (int)(251 + (48 - 251) * q);
    *b = (int)(255 + (107 - 255) * q);
}

static void timeline_panels(FILE *f, const rr_analysis_t *a, const size_t *by_rank, double top)
{
    const rr_report_t *rep = a->rep;
    size_t n = rep->n;
    enum { B = RM_TIMELINE_BUCKETS };
    char b1[32];
    uint64_t vmax = 0;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < B; k++)
            if (rep->ranks[i].timeline[k] > vmax)
                vmax = rep->ranks[i].timeline[k];
    double t_end = rep->t_end_s;

    /* the heat map */
    size_t rows = n > HEAT_ROWS ? HEAT_ROWS : n;
    double htop = top + TL_GAP, rh = rows ? HEAT_H / (double)rows : HEAT_H, cw = PW / B;
    fprintf(f, "<text class=\"ptitle\" x=\"%.2f\" y=\"%.2f\">observed GPU bytes over time, rank "
               "by rank%s (darkest: %s)</text>\n", ML, htop - 8,
            rows < n ? " (each row the max of a bin of ranks)" : "",
            rr_fmt_bytes(b1, sizeof b1, (double)vmax));
    fprintf(f, "<g id=\"heatmap\" data-rows=\"%zu\" data-cols=\"%d\" data-max=\"%llu\" "
               "data-top=\"%.2f\" data-height=\"%.2f\">\n", rows, B, (unsigned long long)vmax,
            htop, HEAT_H);
    for (size_t row = 0; row < rows; row++) {
        size_t first = (size_t)((double)row * (double)n / (double)rows);
        size_t end = row + 1 == rows ? n : (size_t)((double)(row + 1) * (double)n / (double)rows);
        for (int k = 0; k < B; k++) {
            uint64_t v = 0;
            for (size_t p = first; p < end; p++)
                if (rep->ranks[by_rank[p]].timeline[k] > v)
                    v = rep->ranks[by_rank[p]].timeline[k];
            if (!v)
                continue; /* the background is the colour of 0 */
            int r, g, b;
            heat_colour(vmax ? (double)v / (double)vmax : 0, &r, &g, &b);
            fprintf(f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                       "fill=\"rgb(%d,%d,%d)\"/>", ML + cw * k, htop + rh * (double)row, cw + 0.3,
                    rh + 0.3, r, g, b);
        }
        fputc('\n', f);
    }
    fprintf(f, "</g>\n<rect class=\"frame\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\"/>\n",
            ML, htop, PW, HEAT_H);
    if (n) {
        fprintf(f, "<text class=\"tick\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">rank %d</text>"
                   "<text class=\"tick\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">rank %d</text>\n",
                ML - 6, htop + 10, rep->ranks[by_rank[0]].rank, ML - 6, htop + HEAT_H,
                rep->ranks[by_rank[n - 1]].rank);
    }
    phase_marks(f, rep, htop, HEAT_H, 1);
    time_axis(f, t_end, htop + HEAT_H);

    /* the curves */
    double ctop = htop + HEAT_H + CURVE_GAP;
    scale_t sc = nice_scale(1.03 * (double)vmax);
    int each = n <= CURVES_MAX;
    fprintf(f, "<text class=\"ptitle\" x=\"%.2f\" y=\"%.2f\">%s</text>\n", ML, ctop - 8,
            each ? "observed GPU bytes per rank"
                 : "observed GPU bytes: max, mean and min over ranks, and the rank of the "
                   "largest peak");
    scale_ticks(f, &sc, ctop, CURVE_H);
    phase_marks(f, rep, ctop, CURVE_H, 0);
    fprintf(f, "<g id=\"curves\" data-curves=\"%s\" data-top=\"%.2f\" data-height=\"%.2f\" "
               "data-scale-max=\"%.6g\">\n", each ? "ranks" : "envelope", ctop, CURVE_H, sc.max);
    static const char *const palette[] = {"#4477aa", "#66ccee", "#228833", "#ccbb44",
                                          "#ee6677", "#aa3377", "#bbbbbb", "#000000"};
    size_t ncurves = each ? n : 4;
    for (size_t c = 0; c < ncurves; c++) {
        double v[B];
        const char *cls = "curve", *colour = palette[c % 8];
        int rank = -1;
        if (each) {
            const rr_rank_t *r = &rep->ranks[by_rank[c]];
            rank = r->rank;
            for (int k = 0; k < B; k++)
                v[k] = (double)r->timeline[k];
        } else if (c == 3) {
            const rr_rank_t *r = &rep->ranks[0];
            /* the rank holding the largest observed peak */
            for (size_t i = 0; i < n; i++)
                if (rep->ranks[i].rank == a->agg[RR_OBS_GPU_PEAK].max_rank)
                    r = &rep->ranks[i];
            rank = r->rank;
            cls = "curve maxrank";
            colour = "#ee6677";
            for (int k = 0; k < B; k++)
                v[k] = (double)r->timeline[k];
        } else {
            static const char *const names[3] = {"curve max", "curve mean", "curve min"};
            static const char *const colours[3] = {"#213f66", "#4477aa", "#a9c6e3"};
            cls = names[c];
            colour = colours[c];
            for (int k = 0; k < B; k++) {
                double mx = 0, mn = n ? (double)UINT64_MAX : 0;
                long double sum = 0;
                for (size_t i = 0; i < n; i++) {
                    double x = (double)rep->ranks[i].timeline[k];
                    mx = x > mx ? x : mx;
                    mn = x < mn ? x : mn;
                    sum += x;
                }
                v[k] = c == 0 ? mx : c == 2 ? mn : n ? (double)(sum / n) : 0;
            }
        }
        fprintf(f, "<polyline class=\"%s\" data-rank=\"%d\" fill=\"none\" stroke=\"%s\" "
                   "stroke-width=\"1.5\" points=\"", cls, rank, colour);
        for (int k = 0; k < B; k++)
            fprintf(f, "%s%.2f,%.2f", k ? " " : "", ML + cw * (k + 0.5),
                    y_of(v[k], ctop, CURVE_H, sc.max));
        fprintf(f, "\"/>\n");
    }
    fprintf(f, "</g>\n");
    time_axis(f, t_end, ctop + CURVE_H);
}

static void svg_style(FILE *f)
{
    fputs("<style>\n"
          "text { font-family: 'DejaVu Sans', Verdana, Arial, sans-serif; fill: #222; }\n"
          ".title { font-size: 18px; font-weight: bold; }\n"
          ".subtitle { font-size: 12px; fill: #555; }\n"
          ".ptitle { font-size: 14px; font-weight: bold; }\n"
          ".tick { font-size: 11px; fill: #444; }\n"
          ".caption, .note { font-size: 11px; fill: #555; }\n"
          ".labelbox { fill: #fff; fill-opacity: 0.85; }\n"
          ".grid { stroke: #e4e4e4; stroke-width: 1; }\n"
          ".axis { stroke: #444; stroke-width: 1; }\n"
          ".peak { fill: #4477aa; }\n"
          ".peak-max { fill: #a9c6e3; } .peak-min { fill: #213f66; }\n"
          ".leaked { fill: #cc6677; }\n"
          ".leaked-max { fill: #f0bcc6; } .leaked-min { fill: #7a2c3b; }\n"
          ".mean { stroke: #222; stroke-width: 1; stroke-dasharray: 2 3; }\n"
          ".capacity { stroke: #d62728; stroke-width: 2; stroke-dasharray: 8 4; }\n"
          ".caplabel { font-size: 12px; fill: #d62728; font-weight: bold; }\n"
          ".phase { stroke: #555; stroke-width: 1; stroke-dasharray: 4 3; }\n"
          ".phaselabel { font-size: 10px; fill: #333; }\n"
          ".frame { fill: none; stroke: #444; stroke-width: 1; }\n"
          "</style>\n",
          f);
}

int rr_write_svg(FILE *f, const rr_analysis_t *a, const rr_svg_opts_t *o)
{
    const rr_report_t *rep = a->rep;
    size_t n = rep->n;
    char b1[32], b2[32];
    const size_t *by_rank = rank_order(rep);
    if (!by_rank)
        return -1;
    const size_t *order = o->order_by_peak ? a->by_peak : by_rank;
    size_t max_bars = o->max_bars ? o->max_bars : 1;
    int binned = n > max_bars;
    size_t nbars = binned ? max_bars : n;
    bin_t *bins = NULL, *lbins = NULL;
    if (binned) {
        bins = malloc(nbars * sizeof *bins);
        lbins = malloc(nbars * sizeof *lbins);
        if (!bins || !lbins) {
            free(bins);
            free(lbins);
            free((void *)by_rank);
            return -1;
        }
        make_bins(rep, order, nbars, RM_MEM_PEAK, bins);
        make_bins(rep, order, nbars, RM_MEM_CURRENT, lbins);
    }

    /* The capacity: given, or the smallest device of the job. */
    uint64_t cap = o->capacity ? o->capacity : a->cap_min;
    double pmax = (double)a->agg[RM_MEM_PEAK].max;
    int cap_on_scale = 0, cap_off_scale = 0;
    if (cap && o->capacity_mode == RR_CAP_SHOW)
        cap_on_scale = 1;
    else if (cap && o->capacity_mode == RR_CAP_AUTO) {
        /* Peaks far below the capacity would be invisible on its scale. */
        if (pmax * 10 >= (double)cap)
            cap_on_scale = 1;
        else
            cap_off_scale = 1;
    }
    /* 3% headroom: the tallest bar and the capacity line stay off the frame */
    scale_t ps = nice_scale(1.03 * (cap_on_scale && (double)cap > pmax ? (double)cap : pmax));
    scale_t ls = nice_scale(1.03 * (double)a->agg[RM_MEM_CURRENT].max);
    /* the timeline's panels below the bars, when the report has one */
    double HT = H + (rep->has_timeline && n ? TL_H : 0);

    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" "
               "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" data-ranks=\"%zu\" data-order=\"%s\" "
               "data-bars=\"%zu\" data-binned=\"%d\">\n",
            W, HT, W, HT, n, o->order_by_peak ? "peak" : "rank", nbars, binned);
    fprintf(f, "<title>rankmem memory report: ");
    xml_text(f, rep->job_id ? rep->job_id : rep->path);
    fprintf(f, ", %zu ranks</title>\n", n);
    svg_style(f);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W, HT);
    fprintf(f, "<text class=\"title\" x=\"%.2f\" y=\"28\">rankmem memory report", ML);
    if (rep->job_id) {
        fprintf(f, ": job ");
        xml_text(f, rep->job_id);
    }
    fprintf(f, "</text>\n<text class=\"subtitle\" x=\"%.2f\" y=\"48\">", ML);
    fprintf(f, "%zu rank%s on %zu node%s", n, n == 1 ? "" : "s", a->nnodes,
            a->nnodes == 1 ? "" : "s");
    if (rep->phase) {
        fprintf(f, ", phase ");
        xml_text(f, rep->phase);
    }
    if (rep->time) {
        fprintf(f, ", written ");
        xml_text(f, rep->time);
    }
    fprintf(f, ", from ");
    xml_text(f, rep->path);
    fprintf(f, "</text>\n");
    if (binned) {
        char per[48];
        if (n % nbars)
            snprintf(per, sizeof per, "%zu or %zu", n / nbars, n / nbars + 1);
        else
            snprintf(per, sizeof per, "%zu", n / nbars);
        fprintf(f, "<text class=\"subtitle\" x=\"%.2f\" y=\"66\">%zu ranks in %zu bins of "
                   "%s consecutive %s; each bin shows</text>\n",
                ML, n, nbars, per, o->order_by_peak ? "positions (largest peak first)" : "ranks");
        /* the legend: swatches of the three bars, right-aligned */
        static const char *const part[3] = {"max", "mean", "min"};
        static const char *const what[3] = {"its max", "its mean", "its min"};
        for (int k = 0; k < 3; k++) {
            double x = ML + PW - (3 - k) * 92.0;
            fprintf(f, "<rect class=\"peak peak-%s\" x=\"%.2f\" y=\"56\" width=\"12\" "
                       "height=\"12\"/><text class=\"subtitle\" x=\"%.2f\" y=\"66\">%s</text>\n",
                    part[k], x, x + 16, what[k]);
        }
    }

    /* peak panel */
    /* The title says which memory (rm_headline): one story with the text. */
    fprintf(f, "<text id=\"peak-title\" class=\"ptitle\" x=\"%.2f\" y=\"%.2f\">peak bytes per "
               "rank: %s</text>\n", ML, PEAK_TOP - 8, rm_headline_label(a->source));
    if (n)
        panel(f, a, order, bins, nbars, binned, RM_MEM_PEAK, "peak", "peak-panel", PEAK_TOP,
              PEAK_H, &ps);
    if (cap_on_scale) {
        double y = y_of((double)cap, PEAK_TOP, PEAK_H, ps.max);
        fprintf(f, "<line id=\"capacity\" class=\"capacity\" data-bytes=\"%llu\" x1=\"%.2f\" "
                   "y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\"/>\n",
                (unsigned long long)cap, ML, y, ML + PW, y);
        char lab[192];
        int w = snprintf(lab, sizeof lab, "%s %s", o->capacity ? "capacity" : "device capacity",
                         rr_fmt_bytes(b1, sizeof b1, (double)cap));
        if (!o->capacity && a->cap_max != a->cap_min && w > 0 && (size_t)w < sizeof lab)
            w += snprintf(lab + w, sizeof lab - (size_t)w, " (the smallest device; the largest "
                          "has %s)", rr_fmt_bytes(b2, sizeof b2, (double)a->cap_max));
        if (!o->capacity && a->n_shared && w > 0 && (size_t)w < sizeof lab)
            snprintf(lab + w, sizeof lab - (size_t)w, " (a GPU shared by several ranks: %d "
                     "ranks)", a->n_shared);
        /* above the line, or below it when the line is at the top */
        boxed_label(f, "caplabel", ML + 6, y - PEAK_TOP > 18 ? y - 5 : y + 15, 0, 12, lab);
    } else if (cap_off_scale) {
        fprintf(f, "<text id=\"capacity-note\" class=\"caplabel\" data-bytes=\"%llu\" x=\"%.2f\" "
                   "y=\"%.2f\" text-anchor=\"end\">device capacity %s, off the scale: the "
                   "largest peak is %.2g%% of it</text>\n",
                (unsigned long long)cap, ML + PW, PEAK_TOP - 8,
                rr_fmt_bytes(b1, sizeof b1, (double)cap), 100.0 * pmax / (double)cap);
    } else if (!cap && a->n_fallback) {
        fprintf(f, "<text class=\"note\" x=\"%.2f\" y=\"%.2f\" text-anchor=\"end\">no device "
                   "capacity: %d of %zu ranks ran on host memory</text>\n",
                ML + PW, PEAK_TOP - 8, a->n_fallback, n);
    }

    /* leaked panel */
    fprintf(f, "<text id=\"leaked-title\" class=\"ptitle\" x=\"%.2f\" y=\"%.2f\">%s per rank: "
               "%s</text>\n", ML, LEAK_TOP - 8, rr_field_label(a, RM_MEM_CURRENT),
            rm_headline_label(a->source));
    if (a->nleaked && n)
        panel(f, a, order, lbins, nbars, binned, RM_MEM_CURRENT, "leaked", "leaked-panel",
              LEAK_TOP, LEAK_H, &ls);
    else
        fprintf(f, "<text id=\"no-leaks\" class=\"note\" x=\"%.2f\" y=\"%.2f\">%s</text>\n",
                ML, LEAK_TOP + 20,
                a->final ? "no rank leaked: every allocation was freed"
                         : "no rank holds live allocations");
    if (rep->has_timeline && n)
        timeline_panels(f, a, by_rank, H - 40.0);
    fprintf(f, "</svg>\n");
    free(bins);
    free(lbins);
    free((void *)by_rank);
    return ferror(f) ? -1 : 0;
}

/* ------------------------------------------------------------------------
 * The HTML page: one file, no outside resources, the SVG inline. Written
 * as XHTML-compatible markup (every element closed) so that an XML parser
 * can check it too. */

static void td_text(FILE *f, const char *s)
{
    fputs("<td>", f);
    xml_text(f, s);
    fputs("</td>", f);
}

static void td_num(FILE *f, const char *s)
{
    fputs("<td class=\"num\">", f);
    xml_text(f, s);
    fputs("</td>", f);
}

int rr_write_html(FILE *f, const rr_analysis_t *a, const rr_svg_opts_t *o)
{
    const rr_report_t *rep = a->rep;
    char b1[48], b2[48], b3[48], b4[48], b5[48];
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n<title>rankmem "
          "memory report: ",
          f);
    xml_text(f, rep->job_id ? rep->job_id : rep->path);
    fputs("</title>\n<style>\n"
          "body { font-family: 'DejaVu Sans', Verdana, Arial, sans-serif; margin: 24px; "
          "color: #222; background: #fff; }\n"
          "h1 { font-size: 22px; } h2 { font-size: 16px; margin-top: 28px; }\n"
          "table { border-collapse: collapse; font-size: 13px; }\n"
          "th, td { padding: 3px 10px; border-bottom: 1px solid #e4e4e4; text-align: left; }\n"
          "td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }\n"
          "dl { display: grid; grid-template-columns: max-content auto; gap: 2px 16px; "
          "font-size: 13px; }\n"
          "dt { color: #555; } dd { margin: 0; }\n"
          ".fig { max-width: 1000px; } .fig svg { width: 100%; height: auto; }\n"
          "</style>\n</head>\n<body>\n<h1>rankmem memory report</h1>\n<dl>\n",
          f);
    fputs("<dt>source</dt><dd>", f);
    xml_text(f, rep->path);
    fprintf(f, " (%s%s", rep->format, rep->schema ? ", schema " : "");
    if (rep->schema)
        fprintf(f, "%d", rep->schema);
    if (rep->generator) {
        fputs(", ", f);
        xml_text(f, rep->generator);
    }
    fputs(")</dd>\n", f);
    if (rep->job_id) {
        fputs("<dt>job id</dt><dd>", f);
        xml_text(f, rep->job_id);
        if (rep->job_id_source) {
            fputs(" (", f);
            xml_text(f, rep->job_id_source);
            fputs(")", f);
        }
        fputs("</dd>\n", f);
    }
    fprintf(f, "<dt>ranks</dt><dd>%zu on %zu node%s (at most %zu per node)</dd>\n", rep->n,
            a->nnodes, a->nnodes == 1 ? "" : "s", a->per_node_max);
    if (rep->phase) {
        fputs("<dt>phase</dt><dd>", f);
        xml_text(f, rep->phase);
        if (rep->trigger) {
            fputs(" (", f);
            xml_text(f, rep->trigger);
            fputs(")", f);
        }
        fputs("</dd>\n", f);
    }
    fprintf(f, "<dt>wall time</dt><dd>%.3f s (longest rank)</dd>\n", a->wall_max);
    if (rep->time) {
        fputs("<dt>written</dt><dd>", f);
        xml_text(f, rep->time);
        if (rep->writer_host) {
            fputs(" on ", f);
            xml_text(f, rep->writer_host);
        }
        fputs("</dd>\n", f);
    }
    if (a->cap_min)
        fprintf(f, "<dt>device capacity</dt><dd>%s%s%s</dd>\n",
                rr_fmt_bytes(b1, sizeof b1, (double)a->cap_min),
                a->cap_max != a->cap_min ? " to " : "",
                a->cap_max != a->cap_min ? rr_fmt_bytes(b2, sizeof b2, (double)a->cap_max) : "");
    if (a->n_fallback)
        fprintf(f, "<dt>host fallback</dt><dd>%d of %zu ranks (no GPU: host memory)</dd>\n",
                a->n_fallback, rep->n);
    if (a->n_shared)
        fprintf(f, "<dt>shared GPU</dt><dd>%d ranks</dd>\n", a->n_shared);
    fputs("</dl>\n<div class=\"fig\">\n", f);
    if (rr_write_svg(f, a, o) != 0)
        return -1;
    fputs("</div>\n", f);

    fprintf(f, "<h2>aggregates over %zu ranks: %s</h2>\n<table>\n<tr><th></th><th class=\"num\">min"
               "</th><th class=\"num\">max</th><th class=\"num\">rank of max</th><th "
               "class=\"num\">mean</th><th class=\"num\">std dev</th><th class=\"num\">max/mean"
               "</th></tr>\n",
            rep->n, rm_headline_label(a->source));
    for (int k = 0; k < RR_NAGG; k++) {
        const rr_agg_t *g = &a->agg[k];
        if (!rm_agg_shown(k, a->source))
            continue;
        fputs("<tr>", f);
        td_text(f, rr_field_label(a, k));
        td_num(f, rr_fmt_field(b1, sizeof b1, k, (double)g->min, 1));
        td_num(f, rr_fmt_field(b2, sizeof b2, k, (double)g->max, 1));
        snprintf(b3, sizeof b3, "%d", g->max_rank);
        td_num(f, b3);
        td_num(f, rr_fmt_field(b4, sizeof b4, k, g->mean, 0));
        td_num(f, rr_fmt_field(b5, sizeof b5, k, g->std, 0));
        if (isfinite(g->imbalance))
            snprintf(b1, sizeof b1, "%.2f", g->imbalance);
        else
            snprintf(b1, sizeof b1, "-");
        td_num(f, b1);
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);

    size_t ntop = rep->n < 10 ? rep->n : 10;
    fprintf(f, "<h2>top ranks by peak: %s</h2>\n<table>\n<tr><th class=\"num\">rank</th>"
               "<th>host</th><th class=\"num\">device</th><th class=\"num\">peak</th><th "
               "class=\"num\">reserved</th><th class=\"num\">leaked</th><th class=\"num\">served "
               "peak</th></tr>\n", rm_headline_label(a->source));
    for (size_t k = 0; k < ntop; k++) {
        const rr_rank_t *r = &rep->ranks[a->by_peak[k]];
        fputs("<tr>", f);
        snprintf(b1, sizeof b1, "%d", r->rank);
        td_num(f, b1);
        td_text(f, r->host);
        if (r->device >= 0)
            snprintf(b1, sizeof b1, "%d", r->device);
        else
            snprintf(b1, sizeof b1, "host");
        td_num(f, b1);
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)rm_value(r, RM_MEM_PEAK)));
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)rm_value(r, RR_RESERVED_PEAK)));
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)rm_value(r, RM_MEM_CURRENT)));
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)r->bytes_peak));
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);

    fprintf(f, "<h2>%s (%zu of %zu): %s</h2>\n",
            a->final ? "ranks that leaked" : "ranks with live allocations", a->nleaked, rep->n,
            rm_headline_label(a->source));
    if (a->nleaked) {
        size_t show = a->nleaked < 50 ? a->nleaked : 50;
        fputs("<table>\n<tr><th class=\"num\">rank</th><th>host</th><th class=\"num\">bytes</th>"
              "<th class=\"num\">allocations</th></tr>\n",
              f);
        for (size_t k = 0; k < show; k++) {
            const rr_rank_t *r = &rep->ranks[a->leaked[k]];
            fputs("<tr>", f);
            snprintf(b1, sizeof b1, "%d", r->rank);
            td_num(f, b1);
            td_text(f, r->host);
            td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)rm_value(r, RM_MEM_CURRENT)));
            snprintf(b1, sizeof b1, "%llu", (unsigned long long)rm_value(r, RM_MEM_LIVE));
            td_num(f, b1);
            fputs("</tr>\n", f);
        }
        fputs("</table>\n", f);
        if (a->nleaked > show)
            fprintf(f, "<p>... and %zu more.</p>\n", a->nleaked - show);
    } else {
        fputs("<p>none</p>\n", f);
    }

    size_t nshow = a->nnodes < 100 ? a->nnodes : 100;
    fprintf(f, "<h2>nodes (%zu): %s</h2>\n<table>\n<tr><th>host</th><th class=\"num\">ranks"
               "</th><th class=\"num\">peak sum</th><th class=\"num\">peak max</th><th class=\"num"
               "\">rank</th><th class=\"num\">leaked</th><th class=\"num\">reserved</th><th "
               "class=\"num\">served peak sum</th></tr>\n",
            a->nnodes, rm_headline_label(a->source));
    for (size_t k = 0; k < nshow; k++) {
        const rr_node_t *nd = &a->nodes[k];
        fputs("<tr>", f);
        td_text(f, nd->host);
        snprintf(b1, sizeof b1, "%zu", nd->count);
        td_num(f, b1);
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)nd->mem_peak_sum));
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)nd->mem_peak_max));
        snprintf(b1, sizeof b1, "%d", nd->mem_peak_max_rank);
        td_num(f, b1);
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)nd->mem_leaked_sum));
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)nd->reserved_sum));
        td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)nd->peak_sum));
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
    if (a->nnodes > nshow)
        fprintf(f, "<p>... and %zu more nodes (rankmem-report prints them all with --all).</p>\n",
                a->nnodes - nshow);
    if (a->agg[RR_OBS_GPU_PEAK].max > 0 || rep->schema >= 2) {
        /* observed vs served, the ranks of the largest observed peaks */
        size_t lim = rep->n < 10 ? rep->n : 10, shown[10];
        size_t ns = 0;
        for (size_t k = 0; k < lim; k++) {
            size_t best = rep->n;
            for (size_t i = 0; i < rep->n; i++) {
                int taken = 0;
                for (size_t j = 0; j < ns; j++)
                    taken |= shown[j] == i;
                if (taken)
                    continue;
                if (best == rep->n || rep->ranks[i].obs.gpu.peak > rep->ranks[best].obs.gpu.peak)
                    best = i;
            }
            if (best == rep->n)
                break;
            shown[ns++] = best;
        }
        fputs("<h2 id=\"observed\">observed device memory (largest observed peaks)</h2>\n<table>\n"
              "<tr><th class=\"num\">rank</th><th>state</th><th class=\"num\">observed</th>"
              "<th class=\"num\">peak</th><th class=\"num\">served</th><th class=\"num\">"
              "served peak</th><th class=\"num\">rankmem's peak</th></tr>\n", f);
        for (size_t k = 0; k < ns; k++) {
            const rr_rank_t *r = &rep->ranks[shown[k]];
            fputs("<tr>", f);
            snprintf(b1, sizeof b1, "%d", r->rank);
            td_num(f, b1);
            td_text(f, r->obs.state == RM_OBS_ON ? "on" : r->obs.why[0] ? r->obs.why
                                                                       : rm_state_name(r->obs.state));
            td_num(f, rr_fmt_bytes(b2, sizeof b2, (double)r->obs.gpu.current));
            td_num(f, rr_fmt_bytes(b3, sizeof b3, (double)r->obs.gpu.peak));
            td_num(f, rr_fmt_bytes(b4, sizeof b4, (double)r->obs.served.current));
            td_num(f, rr_fmt_bytes(b5, sizeof b5, (double)r->obs.served.peak));
            td_num(f, rr_fmt_bytes(b1, sizeof b1, (double)r->obs.rankmem_peak));
            fputs("</tr>\n", f);
        }
        fputs("</table>\n", f);
    }
    if (rep->has_leaks) {
        fprintf(f, "<h2 id=\"leak-sites\">leaks by call site (%zu)</h2>\n", rep->nleaks);
        if (!rep->nleaks)
            fputs("<p>none observed</p>\n", f);
        else {
            fputs("<table>\n<tr><th>call site</th><th class=\"num\">ranks</th><th class=\"num\">"
                  "bytes</th><th class=\"num\">blocks</th><th class=\"num\">first rank</th></tr>\n",
                  f);
            for (size_t i = 0; i < rep->nleaks; i++) {
                const rr_leak_t *l = &rep->leaks[i];
                fputs("<tr>", f);
                td_text(f, l->site);
                snprintf(b1, sizeof b1, "%d of %zu", l->ranks, rep->n);
                td_num(f, b1);
                td_num(f, rr_fmt_bytes(b2, sizeof b2, (double)l->bytes));
                snprintf(b3, sizeof b3, "%llu", (unsigned long long)l->count);
                td_num(f, b3);
                snprintf(b4, sizeof b4, "%d", l->first_rank);
                td_num(f, b4);
                fputs("</tr>\n", f);
            }
            fputs("</table>\n", f);
        }
    }
    if (rep->nphases) {
        fprintf(f, "<h2 id=\"phases\">phases (%zu)</h2>\n<table>\n<tr><th>phase</th>"
                   "<th class=\"num\">start</th><th class=\"num\">end</th><th class=\"num\">"
                   "min peak</th><th class=\"num\">max peak</th><th class=\"num\">rank</th>"
                   "<th class=\"num\">mean peak</th></tr>\n", rep->nphases);
        for (size_t i = 0; i < rep->nphases; i++) {
            const rr_phase_t *p = &rep->phases[i];
            fputs("<tr>", f);
            td_text(f, p->name);
            snprintf(b1, sizeof b1, "%.3f s", p->t_start_s);
            td_num(f, b1);
            snprintf(b1, sizeof b1, "%.3f s", p->t_end_s);
            td_num(f, b1);
            td_num(f, rr_fmt_bytes(b2, sizeof b2, (double)p->peak_min));
            td_num(f, rr_fmt_bytes(b3, sizeof b3, (double)p->peak_max));
            snprintf(b4, sizeof b4, "%d", p->peak_max_rank);
            td_num(f, b4);
            td_num(f, rr_fmt_bytes(b5, sizeof b5, p->peak_mean));
            fputs("</tr>\n", f);
        }
        fputs("</table>\n", f);
    }
    fputs("</body>\n</html>\n", f);
    return ferror(f) ? -1 : 0;
}
