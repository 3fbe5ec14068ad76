/* The report as text: one renderer for the MPI plugin's report at
 * MPI_Finalize (mpi/report.c, through the JSON it writes) and for
 * rankmem-report, so that both print the same tables from the same
 * model. docs/report.md shows it. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A string for a terminal: control bytes and non-ASCII become '?'. */
const char *rr_safe(const char *s, char *buf, size_t cap)
{
    size_t i = 0;
    for (; s && *s && i + 1 < cap; s++)
        buf[i++] = (unsigned char)*s >= 0x20 && (unsigned char)*s < 0x7f ? *s : '?';
    buf[i] = '\0';
    return buf;
}

/* ------------------------------------------------------------------------
 * The terminal report. */

static void print_job(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op)
{
    const rr_report_t *rep = a->rep;
    char s1[300], s2[300];
    if (op->title)
        fprintf(o, "%s\n\njob\n", op->title);
    else {
        fprintf(o, "rankmem memory report: %s (%s", rr_safe(rep->path, s1, sizeof s1), rep->format);
        if (rep->schema)
            fprintf(o, ", schema %d", rep->schema);
        if (rep->generator)
            fprintf(o, ", %s", rr_safe(rep->generator, s1, sizeof s1));
        fprintf(o, ")\n\njob\n");
    }
    if (rep->job_id)
        fprintf(o, "  %-15s %s%s%s%s\n", "job id", rr_safe(rep->job_id, s1, sizeof s1),
                rep->job_id_source ? " (" : " (no launcher job id)",
                rep->job_id_source ? rr_safe(rep->job_id_source, s2, sizeof s2) : "",
                rep->job_id_source ? ")" : "");
    fprintf(o, "  %-15s %zu on %zu node%s (at most %zu per node)\n", "ranks", rep->n, a->nnodes,
            a->nnodes == 1 ? "" : "s", a->per_node_max);
    if (rep->world_size && (size_t)rep->world_size != rep->n)
        fprintf(o, "  %-15s %d (this report covers a communicator of %zu)\n", "world size",
                rep->world_size, rep->n);
    if (rep->phase)
        fprintf(o, "  %-15s %s (%s)\n", "phase", rr_safe(rep->phase, s1, sizeof s1),
                rep->trigger ? rr_safe(rep->trigger, s2, sizeof s2) : "?");
    else
        fprintf(o, "  %-15s not in a CSV (leaked bytes are live bytes if it was written "
                   "mid-run)\n", "phase");
    fprintf(o, "  %-15s %.3f s (longest rank, since MPI_Init)\n", "wall time", a->wall_max);
    if (rep->time) {
        fprintf(o, "  %-15s %s", "written", rr_safe(rep->time, s1, sizeof s1));
        if (rep->writer_pid >= 0)
            fprintf(o, " by pid %ld", rep->writer_pid);
        if (rep->writer_host)
            fprintf(o, " on %s", rr_safe(rep->writer_host, s1, sizeof s1));
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
            fprintf(o, "  %-15s %s", lab, shown[k][0] ? rr_safe(shown[k], s1, sizeof s1) : "(none)");
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

static void print_nodes(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op)
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
                rr_safe(nd->host, s1, sizeof s1), nd->count, devs,
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

static void print_leaked(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op)
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
        fprintf(o, "  %6d  %-20s %12s %12llu", r->rank, rr_safe(r->host, s1, sizeof s1),
                rr_fmt_bytes(b1, sizeof b1, (double)h.current), (unsigned long long)h.live);
        if (obs)
            fprintf(o, " %14s%s", rr_fmt_bytes(b2, sizeof b2, (double)r->bytes_current),
                    h.source == RM_SRC_OBSERVED ? "" : " (not observed)");
        fprintf(o, "\n");
    }
    if (a->nleaked > limit)
        fprintf(o, "  ... %zu more (--all lists them)\n", a->nleaked - limit);
}

static void print_top(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op)
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
                rr_safe(r->host, s1, sizeof s1), r->local_rank, dv,
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

static void print_histogram(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op)
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

int rr_has_observed(const rr_report_t *rep)
{
    for (size_t i = 0; i < rep->n; i++)
        if (rep->ranks[i].version >= 2)
            return 1;
    return rep->schema >= 2;
}

static void print_observed(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op)
{
    const rr_report_t *rep = a->rep;
    char b1[32], b2[32], b3[32], b4[32], b5[32], s1[200];
    if (!rr_has_observed(rep))
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
                rr_safe(why[k], s1, sizeof s1), cnt[k], rep->n);
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
                rr_safe(l->site, s1, sizeof s1), l->ranks, rep->n,
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
        fprintf(o, "  %-24s %9.3fs %9.3fs %12s %12s %6d %12s\n", rr_safe(p->name, s1, sizeof s1),
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

static void print_failure(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op)
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

void rr_write_text(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op)
{
    print_failure(o, a, op);
    print_job(o, a, op);
    print_nodes(o, a, op);
    print_aggregates(o, a);
    print_leaked(o, a, op);
    print_top(o, a, op);
    print_histogram(o, a, op);
    print_observed(o, a, op);
    print_leak_sites(o, a);
    print_phases(o, a);
}
