/* rankmem-report: reads the MPI plugin's per-rank memory report (the JSON
 * or the CSV) and prints what a person wants from it in a terminal, draws
 * it as SVG or a standalone HTML page, or compares two runs.
 *
 *   rankmem-report [options] REPORT
 *   rankmem-report --compare OLD NEW
 *
 * docs/report-tool.md is the manual; docs/report.md the files it reads.
 * Exit status: 0 done, 1 a report could not be read or an output written,
 * 2 a usage error. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

#define PROG "rankmem-report"
#define MAX_FILES 4096 /* per-rank files on the command line; more: their directory */

typedef struct {
    size_t top;          /* top ranks by peak, and ranks shown in a comparison */
    size_t leaked;       /* ranks that leaked, listed */
    size_t nodes;        /* nodes listed */
    int hist_bins;
    int hist_width;
    int all;             /* list everything */
    const char *svg, *html;
    int quiet;           /* no terminal report (with --svg/--html) */
    rr_svg_opts_t svgo;
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [options] REPORT      summary of a report (JSON or CSV; - is stdin)\n"
            "       " PROG " [options] DIR|FILE... a failed job: its per-rank records\n"
            "       " PROG " --compare OLD NEW     what changed between two runs\n"
            "\n"
            "options:\n"
            "  --svg FILE          draw per-rank peak and leaked bytes as SVG (- is stdout)\n"
            "  --html FILE         a standalone HTML page with the summary and the picture\n"
            "  --order rank|peak   bars in rank order (default) or largest peak first\n"
            "  --max-bars N        beyond N ranks, bars are bins of ranks (default 200)\n"
            "  --capacity SIZE     the capacity line at SIZE (80GiB, 512MiB, bytes), or\n"
            "                      'none'; default: the device's, when peaks are visible on it\n"
            "  --top N             ranks listed by peak / by change (default 10)\n"
            "  --bins N            rows of the peak histogram (default 10)\n"
            "  --all               list every node, leaked rank and top rank\n"
            "  -q, --quiet         with --svg/--html: no terminal summary\n"
            "  --version, --help\n"
            "exit status: 0 done, 1 a report could not be read or a file written, 2 usage\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, PROG ": ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n(" PROG " --help says how to use it)\n");
    return 2;
}

/* A count option: 1 to 1,000,000. */
static int parse_count(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < 1 || v > 1000000)
        return -1;
    *out = (size_t)v;
    return 0;
}

/* "80GiB", "80G" (binary too), "1.5 TiB", "85899345920". */
static int parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0))
        return -1;
    while (*end == ' ')
        end++;
    static const struct {
        const char *u;
        double m;
    } units[] = {{"", 1},    {"B", 1},          {"K", 1024.0}, {"KiB", 1024.0},
                 {"M", 1048576.0}, {"MiB", 1048576.0}, {"G", 1073741824.0},
                 {"GiB", 1073741824.0}, {"T", 1099511627776.0}, {"TiB", 1099511627776.0}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcmp(end, units[i].u) == 0) {
            double b = v * units[i].m;
            if (b >= 1.8e19)
                return -1;
            *out = (uint64_t)(b + 0.5);
            return *out ? 0 : -1;
        }
    return -1;
}

/* A string for a terminal: control bytes and non-ASCII become '?'. */
static const char *safe(const char *s, char *buf, size_t cap)
{
    size_t i = 0;
    for (; s && *s && i + 1 < cap; s++)
        buf[i++] = (unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f ? *s : '?';
    buf[i] = '\0';
    return buf;
}

/* ------------------------------------------------------------------------
 * The terminal report. */

static void print_job(FILE *o, const rr_analysis_t *a)
{
    const rr_report_t *rep = a->rep;
    char s1[300], s2[300];
    fprintf(o, "rankmem memory report: %s (%s", safe(rep->path, s1, sizeof s1), rep->format);
    if (rep->schema)
        fprintf(o, ", schema %d", rep->schema);
    if (rep->generator)
        fprintf(o, ", %s", safe(rep->generator, s1, sizeof s1));
    fprintf(o, ")\n\njob\n");
    if (rep->job_id)
        fprintf(o, "  %-15s %s%s%s%s\n", "job id", safe(rep->job_id, s1, sizeof s1),
                rep->job_id_source ? " (" : " (no launcher job id)",
                rep->job_id_source ? safe(rep->job_id_source, s2, sizeof s2) : "",
                rep->job_id_source ? ")" : "");
    fprintf(o, "  %-15s %zu on %zu node%s (at most %zu per node)\n", "ranks", rep->n, a->nnodes,
            a->nnodes == 1 ? "" : "s", a->per_node_max);
    if (rep->world_size && (size_t)rep->world_size != rep->n)
        fprintf(o, "  %-15s %d (this report covers a communicator of %zu)\n", "world size",
                rep->world_size, rep->n);
    if (rep->phase)
        fprintf(o, "  %-15s %s (%s)\n", "phase", safe(rep->phase, s1, sizeof s1),
                rep->trigger ? safe(rep->trigger, s2, sizeof s2) : "?");
    else
        fprintf(o, "  %-15s not in a CSV (leaked bytes are live bytes if it was written "
                   "mid-run)\n", "phase");
    fprintf(o, "  %-15s %.3f s (longest rank, since MPI_Init)\n", "wall time", a->wall_max);
    if (rep->time) {
        fprintf(o, "  %-15s %s", "written", safe(rep->time, s1, sizeof s1));
        if (rep->writer_pid >= 0)
            fprintf(o, " by pid %ld", rep->writer_pid);
        if (rep->writer_host)
            fprintf(o, " on %s", safe(rep->writer_host, s1, sizeof s1));
        fprintf(o, "\n");
    }
    /* Distinct specs and bind modes, counted (few in practice; 16 shown). */
    for (int which = 0; which < 2; which++) {
        const char *shown[16];
        size_t counts[16], ns = 0, other = 0;
        for (size_t i = 0; i < rep->n; i++) {
            const char *s = which ? rep->ranks[i].bind_mode : rep->ranks[i].spec;
            size_t k = 0;
            while (k < ns && strcmp(shown[k], s) != 0)
                k++;
            if (k < ns)
                counts[k]++;
            else if (ns < 16) {
                shown[ns] = s;
                counts[ns++] = 1;
            } else
                other++;
        }
        for (size_t k = 0; k < ns; k++) {
            const char *lab = k ? "" : which ? "binding" : ns + (other > 0) > 1 ? "specs" : "spec";
            fprintf(o, "  %-15s %s", lab, shown[k][0] ? safe(shown[k], s1, sizeof s1) : "(none)");
            if (ns > 1)
                fprintf(o, "  (%zu rank%s)", counts[k], counts[k] == 1 ? "" : "s");
            fprintf(o, "\n");
        }
        if (other)
            fprintf(o, "  %-15s and %zu ranks with others\n", "", other);
    }
    char b1[32], b2[32];
    if (a->cap_min)
        fprintf(o, "  %-15s %s%s%s\n", "device memory", rr_fmt_bytes(b1, sizeof b1,
                (double)a->cap_min), a->cap_max != a->cap_min ? " to " : "",
                a->cap_max != a->cap_min ? rr_fmt_bytes(b2, sizeof b2, (double)a->cap_max) : "");
    if (!a->n_fallback && !a->n_shared && !a->n_mismatch && !a->n_bind_none && !a->n_inactive) {
        fprintf(o, "  %-15s none\n", "flags");
        return;
    }
    const char *lead = "flags";
    struct {
        int count;
        unsigned flag;
        const char *what;
    } fl[] = {
        {a->n_fallback, RR_HOST_FALLBACK, "host fallback (no GPU, host memory)"},
        {a->n_shared, RR_SHARED_GPU, "shared GPU (more ranks than GPUs on the node)"},
        {a->n_mismatch, RR_BIND_MISMATCH, "bind mismatch (the launcher's local rank differs)"},
        {a->n_bind_none, RR_BIND_NONE, "binding left to the application (RANKMEM_BIND=none)"},
    };
    for (size_t k = 0; k < sizeof fl / sizeof fl[0]; k++) {
        if (!fl[k].count)
            continue;
        fprintf(o, "  %-15s %s on %d of %zu ranks:", lead, fl[k].what, fl[k].count, rep->n);
        int shown = 0;
        for (size_t i = 0; i < rep->n && shown < 8; i++)
            if (rep->ranks[i].flags & fl[k].flag)
                fprintf(o, "%s %d", shown++ ? "," : "", rep->ranks[i].rank);
        if (fl[k].count > shown)
            fprintf(o, " and %d more", fl[k].count - shown);
        fprintf(o, "\n");
        lead = "";
    }
    if (a->n_inactive)
        fprintf(o, "  %-15s no rankmem plugin on %d ranks (their numbers are zeros)\n", lead,
                a->n_inactive);
}

static void print_nodes(FILE *o, const rr_analysis_t *a, const opts_t *op)
{
    char b1[32], b2[32], b3[32], b4[32], b5[32], s1[80];
    size_t limit = op->all ? a->nnodes : op->nodes;
    /* Each table's header says which memory it counts (rm_headline). */
    int obs = a->source != RM_SRC_SERVED; /* served becomes a column beside */
    fprintf(o, "\nnodes (%zu): %s\n", a->nnodes, rm_headline_label(a->source));
    fprintf(o, "  %-20s %5s  %-10s %11s %11s %6s %11s %11s", "host", "ranks", "devices",
            "peak sum", "peak max", "rank", "leaked", "reserved");
    if (obs)
        fprintf(o, " %11s", "served peak");
    fprintf(o, "  %s\n", "device free init -> final");
    /* Beyond the limit, the nodes with the largest peaks. */
    size_t *show = malloc((a->nnodes ? a->nnodes : 1) * sizeof *show);
    size_t nshow = 0;
    if (!show)
        return;
    for (size_t k = 0; k < a->nnodes; k++) {
        size_t pos = nshow;
        while (pos > 0 && a->nodes[k].mem_peak_max > a->nodes[show[pos - 1]].mem_peak_max)
            pos--;
        if (pos >= limit)
            continue;
        size_t last = nshow < limit ? nshow : limit - 1;
        for (size_t j = last; j > pos; j--)
            show[j] = show[j - 1];
        show[pos] = k;
        if (nshow < limit)
            nshow++;
    }
    /* in host order when all fit (insertion above kept them by peak) */
    if (nshow == a->nnodes)
        for (size_t k = 0; k < nshow; k++)
            show[k] = k;
    for (size_t s = 0; s < nshow; s++) {
        const rr_node_t *nd = &a->nodes[show[s]];
        char devs[64] = "host";
        size_t w = 0;
        for (int d = 0; d < nd->ndevices && w < sizeof devs; d++)
            w += (size_t)snprintf(devs + w, sizeof devs - w, "%s%d", d ? "," : "", nd->devices[d]);
        if (nd->more_devices && w < sizeof devs)
            snprintf(devs + w, sizeof devs - w, ",...");
        char dev[128] = "-";
        if (nd->ndevices)
            snprintf(dev, sizeof dev, "%s -> %s of %s%s",
                     rr_fmt_bytes(b1, sizeof b1, (double)nd->dev_free_init_min),
                     rr_fmt_bytes(b2, sizeof b2, (double)nd->dev_free_final_min),
                     rr_fmt_bytes(b3, sizeof b3, (double)nd->dev_total),
                     nd->shared ? " (shared)" : "");
        fprintf(o, "  %-20s %5zu  %-10s %11s %11s %6d %11s %11s",
                safe(nd->host, s1, sizeof s1), nd->count, devs,
                rr_fmt_bytes(b4, sizeof b4, (double)nd->mem_peak_sum),
                rr_fmt_bytes(b5, sizeof b5, (double)nd->mem_peak_max), nd->mem_peak_max_rank,
                rr_fmt_bytes(b1, sizeof b1, (double)nd->mem_leaked_sum),
                rr_fmt_bytes(b2, sizeof b2, (double)nd->reserved_sum));
        if (obs)
            fprintf(o, " %11s", rr_fmt_bytes(b1, sizeof b1, (double)nd->peak_sum));
        fprintf(o, "  %s\n", dev);
    }
    if (nshow < a->nnodes)
        fprintf(o, "  ... %zu more nodes (the %zu with the largest peaks are shown; --all lists "
                   "all)\n", a->nnodes - nshow, nshow);
    free(show);
}

static void print_aggregates(FILE *o, const rr_analysis_t *a)
{
    char b1[32], b2[32], b3[32], b4[32], imb[24];
    fprintf(o, "\naggregates over %zu ranks: %s\n", a->rep->n, rm_headline_label(a->source));
    fprintf(o, "  %-17s %12s %12s %6s %12s %12s %9s\n", "", "min", "max", "rank", "mean",
            "std dev", "max/mean");
    for (int f = 0; f < RR_NAGG; f++) {
        const rr_agg_t *g = &a->agg[f];
        if (!rm_agg_shown(f, a->source))
            continue;
        if (isfinite(g->imbalance))
            snprintf(imb, sizeof imb, "%.2f", g->imbalance);
        else
            snprintf(imb, sizeof imb, "-");
        fprintf(o, "  %-17s %12s %12s %6d %12s %12s %9s\n", rr_field_label(a, f),
                rr_fmt_field(b1, sizeof b1, f, (double)g->min, 1),
                rr_fmt_field(b2, sizeof b2, f, (double)g->max, 1), g->max_rank,
                rr_fmt_field(b3, sizeof b3, f, g->mean, 0), rr_fmt_field(b4, sizeof b4, f, g->std, 0),
                imb);
    }
}

static void print_leaked(FILE *o, const rr_analysis_t *a, const opts_t *op)
{
    char b1[32], b2[32], s1[80];
    const rr_report_t *rep = a->rep;
    size_t limit = op->all ? a->nleaked : op->leaked;
    int obs = a->source != RM_SRC_SERVED;
    /* Observed, these are the blocks "leaks by call site" names: both
     * come from the recorder. */
    fprintf(o, "\n%s (%zu of %zu): %s\n", a->final ? "ranks that leaked" : "ranks with live "
            "allocations", a->nleaked, rep->n, rm_headline_label(a->source));
    if (!a->nleaked) {
        fprintf(o, "  none\n");
        return;
    }
    fprintf(o, "  %6s  %-20s %12s %12s%s\n", "rank", "host", a->final ? "leaked" : "live",
            "allocations", obs ? (a->final ? "  served leaked" : "    served live") : "");
    for (size_t k = 0; k < a->nleaked && k < limit; k++) {
        const rr_rank_t *r = &rep->ranks[a->leaked[k]];
        rm_headline_t h;
        rm_headline(r, &h);
        fprintf(o, "  %6d  %-20s %12s %12llu", r->rank, safe(r->host, s1, sizeof s1),
                rr_fmt_bytes(b1, sizeof b1, (double)h.current), (unsigned long long)h.live);
        if (obs)
            fprintf(o, " %14s%s", rr_fmt_bytes(b2, sizeof b2, (double)r->bytes_current),
                    h.source == RM_SRC_OBSERVED ? "" : " (not observed)");
        fprintf(o, "\n");
    }
    if (a->nleaked > limit)
        fprintf(o, "  ... %zu more (--all lists them)\n", a->nleaked - limit);
}

static void print_top(FILE *o, const rr_analysis_t *a, const opts_t *op)
{
    char b1[32], b2[32], b3[32], b4[32], b5[32], s1[80], dv[16];
    const rr_report_t *rep = a->rep;
    size_t limit = op->all ? rep->n : op->top < rep->n ? op->top : rep->n;
    int obs = a->source != RM_SRC_SERVED;
    fprintf(o, "\ntop ranks by peak: %s\n", rm_headline_label(a->source));
    fprintf(o, "  %6s  %-20s %5s %6s %12s %12s %12s %12s", "rank", "host", "local", "device",
            "peak", "reserved", "total", "allocations");
    if (obs)
        fprintf(o, " %12s %12s", "served peak", "rankmem's");
    fprintf(o, "\n");
    for (size_t k = 0; k < limit; k++) {
        const rr_rank_t *r = &rep->ranks[a->by_peak[k]];
        rm_headline_t h;
        rm_headline(r, &h);
        if (r->device >= 0)
            snprintf(dv, sizeof dv, "%d", r->device);
        else
            snprintf(dv, sizeof dv, "host");
        fprintf(o, "  %6d  %-20s %5d %6s %12s %12s %12s %12llu", r->rank,
                safe(r->host, s1, sizeof s1), r->local_rank, dv,
                rr_fmt_bytes(b1, sizeof b1, (double)h.peak),
                rr_fmt_bytes(b2, sizeof b2, (double)rm_value(r, RR_RESERVED_PEAK)),
                rr_fmt_bytes(b3, sizeof b3, (double)h.total), (unsigned long long)h.count);
        if (obs)
            fprintf(o, " %12s %12s%s", rr_fmt_bytes(b4, sizeof b4, (double)r->bytes_peak),
                    rr_fmt_bytes(b5, sizeof b5, (double)r->obs.rankmem_peak),
                    h.source == RM_SRC_OBSERVED ? "" : " (not observed)");
        fprintf(o, "\n");
    }
    if (limit < rep->n)
        fprintf(o, "  ... %zu more (--top N, --all)\n", rep->n - limit);
}

/* The bucket of v among k equal buckets over [lo, hi] (hi in the last). */
static int bucket_of(uint64_t v, uint64_t lo, uint64_t hi, int k)
{
    if (hi == lo)
        return 0;
    long double q = (long double)(v - lo) * (long double)k / (long double)(hi - lo);
    int b = (int)floorl(q);
    return b >= k ? k - 1 : b < 0 ? 0 : b;
}

static void print_histogram(FILE *o, const rr_analysis_t *a, const opts_t *op)
{
    const rr_report_t *rep = a->rep;
    const rr_agg_t *g = &a->agg[RM_MEM_PEAK];
    char b1[32], b2[32];
    if (!rep->n)
        return;
    int k = op->hist_bins;
    if ((size_t)k > rep->n)
        k = (int)rep->n; /* no more buckets than ranks */
    if (g->max == g->min)
        k = 1;
    else if ((uint64_t)k > g->max - g->min)
        k = (int)(g->max - g->min); /* no bucket narrower than a byte */
    size_t *count = calloc((size_t)k, sizeof *count);
    if (!count)
        return;
    for (size_t i = 0; i < rep->n; i++)
        count[bucket_of(rm_value(&rep->ranks[i], RM_MEM_PEAK), g->min, g->max, k)]++;
    size_t cmax = 0;
    for (int b = 0; b < k; b++)
        if (count[b] > cmax)
            cmax = count[b];
    fprintf(o, "\npeak bytes histogram (%zu rank%s, %d bucket%s): %s\n", rep->n,
            rep->n == 1 ? "" : "s", k, k == 1 ? "" : "s", rm_headline_label(a->source));
    for (int b = 0; b < k; b++) {
        long double lo = (long double)g->min + (long double)(g->max - g->min) * b / k;
        long double hi = (long double)g->min + (long double)(g->max - g->min) * (b + 1) / k;
        int len = cmax ? (int)((double)count[b] * op->hist_width / (double)cmax + 0.5) : 0;
        if (count[b] && len == 0)
            len = 1; /* a nonempty bucket always shows */
        if (k == 1)
            fprintf(o, "  %11s %-13s |", rr_fmt_bytes(b1, sizeof b1, (double)g->min), "(all)");
        else
            fprintf(o, "  %11s - %-11s |", rr_fmt_bytes(b1, sizeof b1, (double)lo),
                    rr_fmt_bytes(b2, sizeof b2, (double)hi));
        for (int c = 0; c < len; c++)
            fputc('#', o);
        fprintf(o, "%*s %zu\n", op->hist_width - len + 1, "", count[b]);
    }
    free(count);
}

/* Observed memory (schema 2): the program's GPU memory per rank as CUDA
 * saw it, beside what rankmem served; why it was not observed. */
static int cmp_obs_idx(const void *x, const void *y);
static const rr_rank_t *obs_ranks;
static int cmp_obs_idx(const void *x, const void *y)
{
    const rr_rank_t *a = &obs_ranks[*(const size_t *)x], *b = &obs_ranks[*(const size_t *)y];
    if (a->obs.gpu.peak != b->obs.gpu.peak)
        return a->obs.gpu.peak < b->obs.gpu.peak ? 1 : -1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

static int has_observed(const rr_report_t *rep)
{
    for (size_t i = 0; i < rep->n; i++)
        if (rep->ranks[i].version >= 2)
            return 1;
    return rep->schema >= 2;
}

static void print_observed(FILE *o, const rr_analysis_t *a, const opts_t *op)
{
    const rr_report_t *rep = a->rep;
    char b1[32], b2[32], b3[32], b4[32], b5[32], s1[200];
    if (!has_observed(rep))
        return;
    fprintf(o, "\nobserved device memory (the program's, as CUDA saw it; served: by rankmem)\n");
    /* one line per distinct reason, with how many ranks */
    enum { NWHY = 8 };
    const char *why[NWHY];
    size_t nwhy = 0, cnt[NWHY], other = 0;
    for (size_t i = 0; i < rep->n; i++) {
        const rr_rank_t *r = &rep->ranks[i];
        if (r->version == 0 || r->obs.state == RM_OBS_ON)
            continue;
        const char *w = r->obs.why[0] ? r->obs.why : rm_state_name(r->obs.state);
        size_t k = 0;
        while (k < nwhy && strcmp(why[k], w) != 0)
            k++;
        if (k < nwhy)
            cnt[k]++;
        else if (nwhy < NWHY) {
            why[nwhy] = w;
            cnt[nwhy++] = 1;
        } else
            other++;
    }
    for (size_t k = 0; k < nwhy; k++)
        fprintf(o, "  device allocations not observed: %s (%zu of %zu ranks)\n",
                safe(why[k], s1, sizeof s1), cnt[k], rep->n);
    if (other)
        fprintf(o, "  device allocations not observed on %zu more ranks, for other reasons\n",
                other);
    size_t *idx = malloc((rep->n ? rep->n : 1) * sizeof *idx);
    if (!idx)
        return;
    for (size_t i = 0; i < rep->n; i++)
        idx[i] = i;
    obs_ranks = rep->ranks;
    qsort(idx, rep->n, sizeof *idx, cmp_obs_idx);
    size_t limit = op->all ? rep->n : op->top < rep->n ? op->top : rep->n;
    fprintf(o, "  %6s %12s %12s %12s %12s %12s %10s\n", "rank", "observed", "peak", "served",
            "served peak", "rankmem's", "live");
    for (size_t k = 0; k < limit; k++) {
        const rr_rank_t *r = &rep->ranks[idx[k]];
        fprintf(o, "  %6d %12s %12s %12s %12s %12s %10llu%s\n", r->rank,
                rr_fmt_bytes(b1, sizeof b1, (double)r->obs.gpu.current),
                rr_fmt_bytes(b2, sizeof b2, (double)r->obs.gpu.peak),
                rr_fmt_bytes(b3, sizeof b3, (double)r->obs.served.current),
                rr_fmt_bytes(b4, sizeof b4, (double)r->obs.served.peak),
                rr_fmt_bytes(b5, sizeof b5, (double)r->obs.rankmem_peak),
                (unsigned long long)r->obs.gpu.live,
                r->obs.state == RM_OBS_ON ? "" : " (not observed)");
    }
    if (limit < rep->n)
        fprintf(o, "  ... %zu more (largest observed peaks first; --top N, --all)\n",
                rep->n - limit);
    free(idx);
}

static void print_leak_sites(FILE *o, const rr_analysis_t *a)
{
    const rr_report_t *rep = a->rep;
    char b1[32], s1[300];
    if (!rep->has_leaks)
        return;
    fprintf(o, "\nleaks by call site (%zu)\n", rep->nleaks);
    if (!rep->nleaks)
        fprintf(o, "  none observed\n");
    for (size_t i = 0; i < rep->nleaks; i++) {
        const rr_leak_t *l = &rep->leaks[i];
        fprintf(o, "  %s: %d of %zu ranks, %s in %llu block%s (first rank %d)\n",
                safe(l->site, s1, sizeof s1), l->ranks, rep->n,
                rr_fmt_bytes(b1, sizeof b1, (double)l->bytes), (unsigned long long)l->count,
                l->count == 1 ? "" : "s", l->first_rank);
    }
}

static void print_phases(FILE *o, const rr_analysis_t *a)
{
    const rr_report_t *rep = a->rep;
    char b1[32], b2[32], b3[32], s1[80];
    if (!rep->nphases)
        return;
    fprintf(o, "\nphases (observed GPU peak per phase over ranks)\n");
    fprintf(o, "  %-24s %10s %10s %12s %12s %6s %12s\n", "phase", "start", "end", "min", "max",
            "rank", "mean");
    for (size_t i = 0; i < rep->nphases; i++) {
        const rr_phase_t *p = &rep->phases[i];
        fprintf(o, "  %-24s %9.3fs %9.3fs %12s %12s %6d %12s\n", safe(p->name, s1, sizeof s1),
                p->t_start_s, p->t_end_s, rr_fmt_bytes(b1, sizeof b1, (double)p->peak_min),
                rr_fmt_bytes(b2, sizeof b2, (double)p->peak_max), p->peak_max_rank,
                rr_fmt_bytes(b3, sizeof b3, p->peak_mean));
    }
}

/* A failed job first (issue 29): which ranks failed and how, the
 * diagnosis, the sites live at the failure, the ranks that wrote nothing;
 * and, in any report, the out-of-memory events ranks lived through.
 *
 * The ranks that started it come first, in detail, earliest first: an
 * allocation refused, MPI_Abort, exit(), a fault (SIGSEGV, SIGBUS, SIGFPE,
 * SIGILL, SIGABRT). Ranks ended from outside (the launcher's SIGTERM after
 * an abort, the batch system's time limit) follow as one line per signal,
 * so that a job of 100,000 ranks still reads in a screen. */
static int started_it(const rr_rank_t *r)
{
    if (r->fail.oom_count || strcmp(r->fail.kind, "abort") == 0 ||
        strcmp(r->fail.kind, "exit") == 0 || strcmp(r->fail.kind, "oom") == 0)
        return 1;
    static const char *const faults[] = {"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT"};
    if (strcmp(r->fail.kind, "signal") == 0)
        for (size_t k = 0; k < sizeof faults / sizeof faults[0]; k++)
            if (strcmp(r->fail.trigger, faults[k]) == 0)
                return 1;
    return 0;
}

static const rr_analysis_t *cmp_rep; /* for by_time (qsort has no context) */
static int by_time(const void *x, const void *y)
{
    const rr_rank_t *a = &cmp_rep->rep->ranks[*(const size_t *)x];
    const rr_rank_t *b = &cmp_rep->rep->ranks[*(const size_t *)y];
    uint64_t ta = a->fail.kind[0] ? a->fail.t_ns : a->fail.oom_t_ns;
    uint64_t tb = b->fail.kind[0] ? b->fail.t_ns : b->fail.oom_t_ns;
    if (ta != tb)
        return ta < tb ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

/* What ended a rank that did not start the failure ("recovered": it lived
 * through a refused allocation and went on). */
static const char *trigger_of(const rr_rank_t *r)
{
    return r->fail.kind[0] ? r->fail.trigger : "recovered";
}

static int by_trigger(const void *x, const void *y)
{
    const rr_rank_t *a = &cmp_rep->rep->ranks[*(const size_t *)x];
    const rr_rank_t *b = &cmp_rep->rep->ranks[*(const size_t *)y];
    int c = strcmp(trigger_of(a), trigger_of(b));
    if (c)
        return c;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

static void print_failed_rank(FILE *o, const rr_report_t *rep, size_t i)
{
    char b1[48], b2[48];
    const rr_rank_t *r = &rep->ranks[i];
    const rr_source_t *sc = rep->src ? &rep->src[i] : NULL;
    fprintf(o, "  rank %d (%s):", r->rank, r->host);
    if (strcmp(r->fail.kind, "signal") == 0)
        fprintf(o, " %s (signal %d)", r->fail.trigger, r->fail.code);
    else if (strcmp(r->fail.kind, "abort") == 0)
        fprintf(o, " MPI_Abort (errorcode %d)", r->fail.code);
    else if (strcmp(r->fail.kind, "exit") == 0)
        fprintf(o, " exit(%d) before MPI_Finalize", r->fail.code);
    else if (strcmp(r->fail.kind, "oom") == 0)
        fprintf(o, " out of memory");
    else
        fprintf(o, " recovered");
    if (r->fail.kind[0])
        fprintf(o, " at %.3f s", (double)r->fail.t_ns / 1e9);
    fprintf(o, ", %s live\n", rr_fmt_bytes(b1, sizeof b1, (double)(
                r->obs.gpu.current > r->bytes_current ? r->obs.gpu.current
                                                      : r->bytes_current)));
    if (r->fail.oom_count)
        fprintf(o, "    %llu allocation%s refused; the first: %s of %s (%s, %s) at %.3f s\n",
                (unsigned long long)r->fail.oom_count, r->fail.oom_count == 1 ? "" : "s",
                r->fail.oom_api, rr_fmt_bytes(b2, sizeof b2, (double)r->fail.oom_bytes),
                r->fail.oom_source, r->fail.oom_site[0] ? r->fail.oom_site : "no call site",
                (double)r->fail.oom_t_ns / 1e9);
    if (r->fail.diagnosis[0])
        fprintf(o, "    %s\n", r->fail.diagnosis);
    for (size_t k = 0; sc && k < sc->nlive && k < 4; k++)
        fprintf(o, "    live: %s: %s in %llu block%s\n", sc->live[k].site,
                rr_fmt_bytes(b1, sizeof b1, (double)sc->live[k].bytes),
                (unsigned long long)sc->live[k].count, sc->live[k].count == 1 ? "" : "s");
}

static void print_failure(FILE *o, const rr_analysis_t *a, const opts_t *op)
{
    const rr_report_t *rep = a->rep;
    size_t nfail = 0, noom = 0;
    for (size_t i = 0; i < rep->n; i++) {
        nfail += rep->ranks[i].fail.kind[0] != 0;
        noom += rep->ranks[i].fail.oom_count > 0;
    }
    if (!rep->assembled && !noom)
        return;
    if (rep->assembled) {
        fprintf(o, "failure: %zu of %d ranks failed; %zu wrote no record", nfail,
                rep->world_size, rep->nmissing);
        if (rep->nbad)
            fprintf(o, "; %zu file%s could not be read (see above)", rep->nbad,
                    rep->nbad == 1 ? "" : "s");
        fprintf(o, "\n");
    } else {
        fprintf(o, "allocations refused (%zu rank%s lived through them)\n", noom,
                noom == 1 ? "" : "s");
    }
    /* Those that started it, earliest first, in detail (--top of them, or
     * --all); the ranks ended from outside, one line per signal. */
    size_t *first = malloc((rep->n ? rep->n : 1) * sizeof *first);
    size_t nfirst = 0, nrest = 0;
    for (size_t i = 0; first && i < rep->n; i++) {
        const rr_rank_t *r = &rep->ranks[i];
        if (!r->fail.kind[0] && !r->fail.oom_count)
            continue;
        if (started_it(r))
            first[nfirst++] = i;
        else
            nrest++;
    }
    if (!first) {
        fprintf(o, "  (no memory to order the %zu failed ranks)\n\n", nfail);
        return;
    }
    cmp_rep = a;
    qsort(first, nfirst, sizeof *first, by_time);
    size_t limit = op->all ? nfirst : op->top < nfirst ? op->top : nfirst;
    for (size_t k = 0; k < limit; k++)
        print_failed_rank(o, rep, first[k]);
    if (nfirst > limit)
        fprintf(o, "  ... and %zu more rank%s that failed first (--all lists them)\n",
                nfirst - limit, nfirst - limit == 1 ? "" : "s");
    /* The others, one line per trigger. */
    size_t *rest = malloc((nrest ? nrest : 1) * sizeof *rest), m = 0;
    for (size_t i = 0; rest && i < rep->n; i++) {
        const rr_rank_t *r = &rep->ranks[i];
        if ((r->fail.kind[0] || r->fail.oom_count) && !started_it(r))
            rest[m++] = i;
    }
    if (rest)
        qsort(rest, m, sizeof *rest, by_trigger);
    for (size_t k = 0; k < m;) {
        const char *trig = trigger_of(&rep->ranks[rest[k]]);
        size_t e = k;
        uint64_t t0 = UINT64_MAX, t1 = 0;
        fprintf(o, "  ranks ended by %s:", trig);
        for (; e < m && strcmp(trigger_of(&rep->ranks[rest[e]]), trig) == 0; e++) {
            const rr_rank_t *r = &rep->ranks[rest[e]];
            if (op->all || e - k < 16)
                fprintf(o, "%s %d", e > k ? "," : "", r->rank);
            t0 = r->fail.t_ns < t0 ? r->fail.t_ns : t0;
            t1 = r->fail.t_ns > t1 ? r->fail.t_ns : t1;
        }
        fprintf(o, "%s (%zu rank%s, from %.3f s to %.3f s)\n",
                !op->all && e - k > 16 ? ", ..." : "", e - k, e - k == 1 ? "" : "s",
                (double)t0 / 1e9, (double)t1 / 1e9);
        k = e;
    }
    free(rest);
    free(first);
    if (rep->assembled) {
        size_t last = 0;
        for (size_t i = 0; i < rep->n; i++)
            last += !rep->ranks[i].fail.kind[0];
        if (last) {
            fprintf(o, "  %zu rank%s left only a periodic record (killed without a signal it "
                       "could catch, or still running):", last, last == 1 ? "" : "s");
            size_t shown = 0;
            for (size_t i = 0; i < rep->n && shown < 16; i++)
                if (!rep->ranks[i].fail.kind[0])
                    fprintf(o, "%s %d (%.3f s)", shown++ ? "," : "", rep->ranks[i].rank,
                            isfinite(rep->ranks[i].wall_s) ? rep->ranks[i].wall_s : 0.0);
            fprintf(o, "%s\n", last > shown ? ", ..." : "");
        }
        if (rep->nmissing) {
            fprintf(o, "  no record from %zu rank%s (killed before they could write, or no "
                       "file):", rep->nmissing, rep->nmissing == 1 ? "" : "s");
            for (size_t k = 0; k < rep->nmissing && k < 32; k++)
                fprintf(o, "%s %d", k ? "," : "", rep->missing[k]);
            fprintf(o, "%s\n", rep->nmissing > 32 ? ", ..." : "");
        }
    }
    fprintf(o, "\n");
}

static void print_report(FILE *o, const rr_analysis_t *a, const opts_t *op)
{
    print_failure(o, a, op);
    print_job(o, a);
    print_nodes(o, a, op);
    print_aggregates(o, a);
    print_leaked(o, a, op);
    print_top(o, a, op);
    print_histogram(o, a, op);
    print_observed(o, a, op);
    print_leak_sites(o, a);
    print_phases(o, a);
}

/* ------------------------------------------------------------------------
 * Comparing two runs. */

/* "+20.0%", "-3.1%", "=", "new" (from zero), "-100.0%" */
static const char *pct(char *buf, size_t cap, double old, double now)
{
    if (old == now)
        snprintf(buf, cap, "=");
    else if (old == 0)
        snprintf(buf, cap, "new");
    else {
        double p = 100.0 * (now - old) / old;
        /* a small change still shows as one, not as +0.0% */
        snprintf(buf, cap, fabs(p) < 0.05 ? "%+.1g%%" : "%+.1f%%", p);
    }
    return buf;
}

/* A signed difference of a field, for people. */
static const char *delta(char *buf, size_t cap, int field, double d)
{
    char t[24];
    rr_fmt_field(t, sizeof t, field, fabs(d), rr_fields[field].unit == RR_UNIT_COUNT);
    snprintf(buf, cap, "%s%s", d > 0 ? "+" : d < 0 ? "-" : "", t);
    return buf;
}

static const rr_rank_t *cmp_ranks;
static int cmp_rank_idx(const void *x, const void *y)
{
    int a = cmp_ranks[*(const size_t *)x].rank, b = cmp_ranks[*(const size_t *)y].rank;
    return (a > b) - (a < b);
}

typedef struct {
    size_t oi, ni; /* indices in old and new */
    double d;      /* new - old */
} moved_t;

static int cmp_moved(const void *x, const void *y)
{
    const moved_t *a = x, *b = y;
    double p = fabs(a->d), q = fabs(b->d);
    if (p != q)
        return p < q ? 1 : -1;
    return (a->oi > b->oi) - (a->oi < b->oi);
}

static void print_moved(FILE *o, const rr_report_t *old, const rr_report_t *now, moved_t *m,
                        size_t nm, int field, size_t limit, const char *title)
{
    char b1[32], b2[32], b3[32], b4[32], s1[80];
    for (size_t i = 0; i < nm; i++)
        m[i].d = (double)rm_value(&now->ranks[m[i].ni], field) -
                 (double)rm_value(&old->ranks[m[i].oi], field);
    qsort(m, nm, sizeof *m, cmp_moved);
    size_t changed = 0;
    for (size_t i = 0; i < nm; i++)
        changed += m[i].d != 0;
    fprintf(o, "\n%s (%zu of %zu ranks in both changed)\n", title, changed, nm);
    if (!changed) {
        fprintf(o, "  none\n");
        return;
    }
    fprintf(o, "  %6s  %-20s %12s %12s %13s %9s\n", "rank", "host (new)", "old", "new", "change",
            "%");
    for (size_t i = 0; i < nm && i < limit && m[i].d != 0; i++) {
        const rr_rank_t *a = &old->ranks[m[i].oi], *b = &now->ranks[m[i].ni];
        fprintf(o, "  %6d  %-20s %12s %12s %13s %9s\n", b->rank, safe(b->host, s1, sizeof s1),
                rr_fmt_bytes(b1, sizeof b1, (double)rm_value(a, field)),
                rr_fmt_bytes(b2, sizeof b2, (double)rm_value(b, field)),
                delta(b3, sizeof b3, field, m[i].d),
                pct(b4, sizeof b4, (double)rm_value(a, field), (double)rm_value(b, field)));
    }
    if (changed > limit)
        fprintf(o, "  ... %zu more changed (--top N)\n", changed - limit);
}

static void describe_run(FILE *o, const char *which, const rr_analysis_t *a)
{
    char s1[300], s2[80];
    const rr_report_t *r = a->rep;
    fprintf(o, "  %-4s %s: %s", which, safe(r->path, s1, sizeof s1), r->format);
    if (r->schema)
        fprintf(o, " schema %d", r->schema);
    fprintf(o, ", %zu ranks on %zu node%s", r->n, a->nnodes, a->nnodes == 1 ? "" : "s");
    if (r->phase)
        fprintf(o, ", %s", safe(r->phase, s2, sizeof s2));
    if (r->time)
        fprintf(o, ", %s", safe(r->time, s1, sizeof s1));
    fprintf(o, "; %s\n", rm_headline_label(a->source));
}

/* Peaks per phase, matched by name (the n-th phase of a name with the
 * n-th of the same name in the other run). */
static void compare_phases(FILE *o, const rr_report_t *old, const rr_report_t *now)
{
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], s1[80];
    if (!old->nphases && !now->nphases)
        return;
    fprintf(o, "\n%-26s %12s %12s %8s %12s %12s %8s\n", "peaks per phase", "old max", "new max",
            "change", "old mean", "new mean", "change");
    char *used = calloc(old->nphases ? old->nphases : 1, 1);
    if (!used)
        return;
    for (size_t i = 0; i < now->nphases; i++) {
        const rr_phase_t *y = &now->phases[i], *x = NULL;
        for (size_t j = 0; j < old->nphases && !x; j++)
            if (!used[j] && strcmp(old->phases[j].name, y->name) == 0) {
                used[j] = 1;
                x = &old->phases[j];
            }
        if (x)
            fprintf(o, "  %-24s %12s %12s %8s %12s %12s %8s\n", safe(y->name, s1, sizeof s1),
                    rr_fmt_bytes(b1, sizeof b1, (double)x->peak_max),
                    rr_fmt_bytes(b2, sizeof b2, (double)y->peak_max),
                    pct(b3, sizeof b3, (double)x->peak_max, (double)y->peak_max),
                    rr_fmt_bytes(b4, sizeof b4, x->peak_mean),
                    rr_fmt_bytes(b5, sizeof b5, y->peak_mean),
                    pct(b6, sizeof b6, x->peak_mean, y->peak_mean));
        else
            fprintf(o, "  %-24s %12s %12s %8s %12s %12s %8s\n", safe(y->name, s1, sizeof s1),
                    "-", rr_fmt_bytes(b2, sizeof b2, (double)y->peak_max), "new", "-",
                    rr_fmt_bytes(b5, sizeof b5, y->peak_mean), "new");
    }
    for (size_t j = 0; j < old->nphases; j++)
        if (!used[j])
            fprintf(o, "  %-24s %12s %12s %8s %12s %12s %8s\n",
                    safe(old->phases[j].name, s1, sizeof s1),
                    rr_fmt_bytes(b1, sizeof b1, (double)old->phases[j].peak_max), "-", "gone",
                    rr_fmt_bytes(b4, sizeof b4, old->phases[j].peak_mean), "-", "gone");
    free(used);
}

static int compare(FILE *o, const rr_analysis_t *ao, const rr_analysis_t *an, const opts_t *op)
{
    const rr_report_t *old = ao->rep, *now = an->rep;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], i1[16], i2[16];
    fprintf(o, "rankmem memory report: comparison\n");
    describe_run(o, "old", ao);
    describe_run(o, "new", an);
    /* Peaks of two different memories would compare as a change. */
    int src = ao->source == an->source ? an->source : RM_SRC_MIXED;
    if (ao->source != an->source)
        fprintf(o, "  note: the runs count different memories (old %s, new %s): peaks, leaks "
                   "and totals below compare these\n", rm_source_name(ao->source),
                rm_source_name(an->source));

    fprintf(o, "\n%-19s %12s %12s %8s %12s %12s %8s  %s\n", "aggregates", "old max", "new max",
            "change", "old mean", "new mean", "change", "max/mean old -> new");
    for (int f = 0; f < RR_NAGG; f++) {
        const rr_agg_t *x = &ao->agg[f], *y = &an->agg[f];
        if (!rm_agg_shown(f, src))
            continue;
        if (isfinite(x->imbalance))
            snprintf(i1, sizeof i1, "%.2f", x->imbalance);
        else
            snprintf(i1, sizeof i1, "-");
        if (isfinite(y->imbalance))
            snprintf(i2, sizeof i2, "%.2f", y->imbalance);
        else
            snprintf(i2, sizeof i2, "-");
        int exact = rr_fields[f].unit == RR_UNIT_COUNT;
        fprintf(o, "  %-17s %12s %12s %8s %12s %12s %8s  %s -> %s\n", rr_field_label(an, f),
                rr_fmt_field(b1, sizeof b1, f, (double)x->max, exact),
                rr_fmt_field(b2, sizeof b2, f, (double)y->max, exact),
                pct(b3, sizeof b3, (double)x->max, (double)y->max),
                rr_fmt_field(b4, sizeof b4, f, x->mean, 0),
                rr_fmt_field(b5, sizeof b5, f, y->mean, 0), pct(b6, sizeof b6, x->mean, y->mean),
                i1, i2);
    }
    fprintf(o, "  %-17s %12s %12s %8s\n", "leaking ranks", (snprintf(b1, sizeof b1, "%zu",
            ao->nleaked), b1), (snprintf(b2, sizeof b2, "%zu", an->nleaked), b2),
            pct(b3, sizeof b3, (double)ao->nleaked, (double)an->nleaked));

    /* Match ranks by number: sort the new run's indices by rank. */
    size_t *idx = malloc((now->n ? now->n : 1) * sizeof *idx);
    moved_t *m = malloc((old->n ? old->n : 1) * sizeof *m);
    if (!idx || !m) {
        free(idx);
        free(m);
        fprintf(stderr, PROG ": out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < now->n; i++)
        idx[i] = i;
    cmp_ranks = now->ranks;
    qsort(idx, now->n, sizeof *idx, cmp_rank_idx);
    size_t nm = 0, only_old = 0;
    int only_old_list[8], nool = 0;
    for (size_t i = 0; i < old->n; i++) {
        int want = old->ranks[i].rank;
        size_t lo = 0, hi = now->n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (now->ranks[idx[mid]].rank < want)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < now->n && now->ranks[idx[lo]].rank == want) {
            m[nm].oi = i;
            m[nm].ni = idx[lo];
            nm++;
        } else {
            only_old++;
            if (nool < 8)
                only_old_list[nool++] = want;
        }
    }
    size_t only_new = now->n - nm;
    if (only_old || only_new) {
        fprintf(o, "\nranks: %zu in both, %zu only in old", nm, only_old);
        for (int k = 0; k < nool; k++)
            fprintf(o, "%s%d", k ? ", " : " (", only_old_list[k]);
        if (nool)
            fprintf(o, "%s)", only_old > (size_t)nool ? ", ..." : "");
        fprintf(o, ", %zu only in new\n", only_new);
    }
    size_t limit = op->all ? nm : op->top;
    /* The headline, as in each run's own report (rm_headline). */
    print_moved(o, old, now, m, nm, RM_MEM_PEAK, limit, "ranks whose peak moved most");
    print_moved(o, old, now, m, nm, RM_MEM_CURRENT, limit,
                an->final ? "ranks whose leaked bytes moved most"
                          : "ranks whose live bytes moved most");
    if (has_observed(old) || has_observed(now))
        print_moved(o, old, now, m, nm, RR_OBS_GPU_PEAK, limit,
                    "ranks whose observed GPU peak moved most");
    compare_phases(o, old, now);
    free(idx);
    free(m);
    return 0;
}

/* ------------------------------------------------------------------------ */

static int write_picture(const char *path, int html, const rr_analysis_t *a, const opts_t *op)
{
    int to_stdout = strcmp(path, "-") == 0;
    FILE *f = to_stdout ? stdout : fopen(path, "w");
    if (!f) {
        fprintf(stderr, PROG ": cannot write '%s': %s\n", path, strerror(errno));
        return 1;
    }
    int rc = html ? rr_write_html(f, a, &op->svgo) : rr_write_svg(f, a, &op->svgo);
    int e = errno;
    if (to_stdout) {
        if (fflush(f) != 0)
            rc = -1, e = errno;
    } else if (fclose(f) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        fprintf(stderr, PROG ": writing '%s' failed: %s\n", path, strerror(e));
        return 1;
    }
    return 0;
}

static int load(const char *path, rr_report_t *rep, rr_analysis_t *a)
{
    char err[1024];
    if (rr_load(path, rep, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    if (rr_analyse(rep, a) != 0) {
        fprintf(stderr, PROG ": %s: out of memory\n", path);
        rr_report_free(rep);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    opts_t op = {10, 20, 32, 10, 50, 0, NULL, NULL, 0, {0, 200, RR_CAP_AUTO, 0}};
    static const char *files[MAX_FILES];
    int nfiles = 0, cmp = 0;

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *val = NULL;
        char name[32];
        /* --opt=value or --opt value */
        if (strncmp(arg, "--", 2) == 0 && strchr(arg, '=')) {
            size_t n = (size_t)(strchr(arg, '=') - arg);
            if (n >= sizeof name)
                return usage_error("unknown option '%s'", arg);
            memcpy(name, arg, n);
            name[n] = '\0';
            val = arg + n + 1;
            arg = name;
        }
#define NEEDS_VALUE()                                                                      \
    do {                                                                                   \
        if (!val) {                                                                        \
            if (i + 1 >= argc)                                                             \
                return usage_error("%s needs a value", arg);                               \
            val = argv[++i];                                                               \
        }                                                                                  \
    } while (0)
        /* the options without a value refuse one */
        if (val && (strcmp(arg, "--help") == 0 || strcmp(arg, "--version") == 0 ||
                    strcmp(arg, "--compare") == 0 || strcmp(arg, "--all") == 0 ||
                    strcmp(arg, "--quiet") == 0))
            return usage_error("%s takes no value", arg);
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(arg, "--version") == 0) {
            printf(PROG " (rankmem) %s; reads report schemas 1 to %d and the CSV\n",
                   PACKAGE_VERSION, rr_schema_newest());
            return 0;
        } else if (strcmp(arg, "--compare") == 0) {
            cmp = 1;
        } else if (strcmp(arg, "--svg") == 0) {
            NEEDS_VALUE();
            op.svg = val;
        } else if (strcmp(arg, "--html") == 0) {
            NEEDS_VALUE();
            op.html = val;
        } else if (strcmp(arg, "--order") == 0) {
            NEEDS_VALUE();
            if (strcmp(val, "rank") == 0)
                op.svgo.order_by_peak = 0;
            else if (strcmp(val, "peak") == 0)
                op.svgo.order_by_peak = 1;
            else
                return usage_error("--order: '%s' is neither 'rank' nor 'peak'", val);
        } else if (strcmp(arg, "--max-bars") == 0) {
            NEEDS_VALUE();
            if (parse_count(val, &op.svgo.max_bars) != 0 || op.svgo.max_bars > 5000)
                return usage_error("--max-bars: '%s' is not a number from 1 to 5000", val);
        } else if (strcmp(arg, "--capacity") == 0) {
            NEEDS_VALUE();
            if (strcmp(val, "none") == 0) {
                op.svgo.capacity_mode = RR_CAP_HIDE;
            } else if (strcmp(val, "auto") == 0) {
                op.svgo.capacity_mode = RR_CAP_AUTO;
                op.svgo.capacity = 0;
            } else if (parse_size(val, &op.svgo.capacity) == 0) {
                op.svgo.capacity_mode = RR_CAP_SHOW;
            } else {
                return usage_error("--capacity: '%s' is not a size (80GiB, 512MiB, bytes), "
                                   "'auto' or 'none'", val);
            }
        } else if (strcmp(arg, "--top") == 0) {
            NEEDS_VALUE();
            if (parse_count(val, &op.top) != 0)
                return usage_error("--top: '%s' is not a positive number", val);
        } else if (strcmp(arg, "--bins") == 0) {
            size_t b;
            NEEDS_VALUE();
            if (parse_count(val, &b) != 0 || b > 100)
                return usage_error("--bins: '%s' is not a number from 1 to 100", val);
            op.hist_bins = (int)b;
        } else if (strcmp(arg, "--all") == 0) {
            op.all = 1;
        } else if (strcmp(arg, "-q") == 0 || strcmp(arg, "--quiet") == 0) {
            op.quiet = 1;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            return usage_error("unknown option '%s'", argv[i]);
        } else {
            if (val)
                return usage_error("unknown option '%s'", argv[i]);
            if (nfiles == MAX_FILES)
                return usage_error("too many files ('%s'); give their directory", arg);
            files[nfiles++] = arg;
        }
#undef NEEDS_VALUE
    }

    if (cmp) {
        if (nfiles != 2)
            return usage_error("--compare needs two reports, OLD and NEW");
        if (op.svg || op.html)
            return usage_error("--svg and --html draw one report, not a comparison");
        if (strcmp(files[0], "-") == 0 && strcmp(files[1], "-") == 0)
            return usage_error("only one of OLD and NEW can be stdin");
        rr_report_t r1, r2;
        rr_analysis_t a1, a2;
        if (load(files[0], &r1, &a1) != 0)
            return 1;
        if (load(files[1], &r2, &a2) != 0) {
            rr_analysis_free(&a1);
            rr_report_free(&r1);
            return 1;
        }
        int rc = compare(stdout, &a1, &a2, &op);
        rr_analysis_free(&a1);
        rr_analysis_free(&a2);
        rr_report_free(&r1);
        rr_report_free(&r2);
        if (fflush(stdout) != 0)
            rc = 1;
        return rc;
    }
    struct stat dst;
    int job = nfiles > 1 || (nfiles == 1 && stat(files[0], &dst) == 0 && S_ISDIR(dst.st_mode));
    if (nfiles < 1)
        return usage_error("which report? (a .json or .csv file, -, or a failed job's "
                           "directory or per-rank files)");
    if (op.svg && op.html && strcmp(op.svg, "-") == 0 && strcmp(op.html, "-") == 0)
        return usage_error("--svg and --html cannot both go to stdout");
    if ((op.svg && strcmp(op.svg, files[0]) == 0) || (op.html && strcmp(op.html, files[0]) == 0))
        return usage_error("the picture would overwrite the report '%s'", files[0]);

    rr_report_t rep;
    rr_analysis_t a;
    int rc = 0;
    if (job) {
        /* A failed job: every rank's own file; what cannot be read is
         * named and the rest reported (exit status 1 then). */
        if (rr_load_job(files, (size_t)nfiles, &rep, stderr) != 0)
            return 1;
        if (rr_analyse(&rep, &a) != 0) {
            fprintf(stderr, PROG ": out of memory\n");
            rr_report_free(&rep);
            return 1;
        }
        rc = rep.nbad ? 1 : 0;
    } else if (load(files[0], &rep, &a) != 0) {
        return 1;
    }
    int picture_to_stdout = (op.svg && strcmp(op.svg, "-") == 0) ||
                            (op.html && strcmp(op.html, "-") == 0);
    if (!op.quiet && !picture_to_stdout)
        print_report(stdout, &a, &op);
    if (op.svg && write_picture(op.svg, 0, &a, &op) != 0)
        rc = 1;
    if (op.html && write_picture(op.html, 1, &a, &op) != 0)
        rc = 1;
    if (!op.quiet && !picture_to_stdout) {
        if (op.svg && !rc && strcmp(op.svg, "-") != 0)
            printf("\nSVG written to %s\n", op.svg);
        if (op.html && !rc && strcmp(op.html, "-") != 0)
            printf("%sHTML written to %s\n", op.svg ? "" : "\n", op.html);
    }
    rr_analysis_free(&a);
    rr_report_free(&rep);
    if (fflush(stdout) != 0) {
        fprintf(stderr, PROG ": writing the output failed: %s\n", strerror(errno));
        rc = 1;
    }
    return rc;
}
