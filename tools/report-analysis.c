/* rankmem-report: what is computed over the ranks of a report. The same
 * definitions as the plugin's own analysis (docs/report.md, "The
 * analysis"), computed again here so that a CSV, which has only the
 * records, gets them too. */
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void aggregate(const rr_report_t *rep, int f, rr_agg_t *g)
{
    g->min = UINT64_MAX;
    g->max = 0;
    g->min_rank = g->max_rank = -1;
    g->sum = 0;
    for (size_t i = 0; i < rep->n; i++) {
        const rr_rank_t *r = &rep->ranks[i];
        uint64_t v = r->v[f];
        /* Ties go to the lowest rank: the answer does not depend on order. */
        if (g->min_rank < 0 || v < g->min || (v == g->min && r->rank < g->min_rank)) {
            g->min = v;
            g->min_rank = r->rank;
        }
        if (g->max_rank < 0 || v > g->max || (v == g->max && r->rank < g->max_rank)) {
            g->max = v;
            g->max_rank = r->rank;
        }
        g->sum += (long double)v;
    }
    if (rep->n == 0)
        g->min = 0;
    g->mean = rep->n ? (double)(g->sum / (long double)rep->n) : 0.0;
    /* Two passes: sum of squares minus square of sums cancels at these sizes. */
    long double ss = 0;
    for (size_t i = 0; i < rep->n; i++) {
        long double d = (long double)rep->ranks[i].v[f] - (long double)g->mean;
        ss += d * d;
    }
    g->std = rep->n ? (double)sqrtl(ss / (long double)rep->n) : 0.0;
    g->imbalance = g->mean > 0.0 ? (double)g->max / g->mean : NAN;
}

/* qsort has no context argument in C11; the analysis runs once, in one thread. */
static const rr_rank_t *sort_ranks;

static int cmp_host(const void *a, const void *b)
{
    const rr_rank_t *x = &sort_ranks[*(const size_t *)a], *y = &sort_ranks[*(const size_t *)b];
    int c = strcmp(x->host, y->host);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_peak(const void *a, const void *b)
{
    const rr_rank_t *x = &sort_ranks[*(const size_t *)a], *y = &sort_ranks[*(const size_t *)b];
    uint64_t p = x->v[RR_BYTES_PEAK], q = y->v[RR_BYTES_PEAK];
    if (p != q)
        return p < q ? 1 : -1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_leak(const void *a, const void *b)
{
    const rr_rank_t *x = &sort_ranks[*(const size_t *)a], *y = &sort_ranks[*(const size_t *)b];
    uint64_t p = x->v[RR_BYTES_CURRENT], q = y->v[RR_BYTES_CURRENT];
    if (p != q)
        return p < q ? 1 : -1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

void rr_analysis_free(rr_analysis_t *a)
{
    free(a->by_host);
    free(a->nodes);
    free(a->by_peak);
    free(a->leaked);
    memset(a, 0, sizeof *a);
}

int rr_analyse(const rr_report_t *rep, rr_analysis_t *a)
{
    memset(a, 0, sizeof *a);
    a->rep = rep;
    size_t n = rep->n, m = n ? n : 1;
    for (int f = 0; f < RR_NAGG; f++)
        aggregate(rep, f, &a->agg[f]);
    a->final = !rep->phase || strcmp(rep->phase, "finalize") == 0;

    a->by_host = malloc(m * sizeof *a->by_host);
    a->by_peak = malloc(m * sizeof *a->by_peak);
    a->leaked = malloc(m * sizeof *a->leaked);
    a->nodes = malloc(m * sizeof *a->nodes);
    if (!a->by_host || !a->by_peak || !a->leaked || !a->nodes) {
        rr_analysis_free(a);
        return -1;
    }
    sort_ranks = rep->ranks;
    for (size_t i = 0; i < n; i++)
        a->by_host[i] = a->by_peak[i] = i;
    qsort(a->by_host, n, sizeof(size_t), cmp_host);
    qsort(a->by_peak, n, sizeof(size_t), cmp_peak);
    a->nleaked = 0;
    for (size_t i = 0; i < n; i++)
        if (rep->ranks[i].v[RR_BYTES_CURRENT] > 0)
            a->leaked[a->nleaked++] = i;
    qsort(a->leaked, a->nleaked, sizeof(size_t), cmp_leak);

    for (size_t k = 0; k < n; k++) {
        const rr_rank_t *r = &rep->ranks[a->by_host[k]];
        rr_node_t *nd = a->nnodes ? &a->nodes[a->nnodes - 1] : NULL;
        if (!nd || strcmp(nd->host, r->host) != 0) {
            nd = &a->nodes[a->nnodes++];
            memset(nd, 0, sizeof *nd);
            nd->host = r->host;
            nd->first = k;
            nd->peak_max_rank = -1;
            nd->dev_free_init_min = nd->dev_free_final_min = UINT64_MAX;
        }
        nd->count++;
        nd->host_fallback += (r->flags & RR_HOST_FALLBACK) != 0;
        nd->shared += (r->flags & RR_SHARED_GPU) != 0;
        nd->peak_sum += r->v[RR_BYTES_PEAK];
        nd->leaked_sum += r->v[RR_BYTES_CURRENT];
        nd->reserved_sum += r->v[RR_RESERVED_PEAK];
        /* by_host is in rank order within a host: the first max is the lowest rank */
        if (nd->peak_max_rank < 0 || r->v[RR_BYTES_PEAK] > nd->peak_max) {
            nd->peak_max = r->v[RR_BYTES_PEAK];
            nd->peak_max_rank = r->rank;
        }
        if (r->device >= 0) {
            int seen = 0;
            for (int d = 0; d < nd->ndevices; d++)
                seen |= nd->devices[d] == r->device;
            if (!seen && nd->ndevices < RR_NODE_DEVICES)
                nd->devices[nd->ndevices++] = r->device;
            else if (!seen)
                nd->more_devices = 1;
            if (r->dev_total_init > nd->dev_total)
                nd->dev_total = r->dev_total_init;
            if (r->dev_free_init < nd->dev_free_init_min)
                nd->dev_free_init_min = r->dev_free_init;
            if (r->dev_free_final < nd->dev_free_final_min)
                nd->dev_free_final_min = r->dev_free_final;
        }
    }
    for (size_t k = 0; k < a->nnodes; k++) {
        rr_node_t *nd = &a->nodes[k];
        qsort(nd->devices, (size_t)nd->ndevices, sizeof(int), cmp_int);
        if (nd->count > a->per_node_max)
            a->per_node_max = nd->count;
    }

    a->cap_min = 0;
    a->cap_max = 0;
    for (size_t i = 0; i < n; i++) {
        const rr_rank_t *r = &rep->ranks[i];
        a->n_fallback += (r->flags & RR_HOST_FALLBACK) != 0;
        a->n_shared += (r->flags & RR_SHARED_GPU) != 0;
        a->n_mismatch += (r->flags & RR_BIND_MISMATCH) != 0;
        a->n_bind_none += (r->flags & RR_BIND_NONE) != 0;
        a->n_inactive += r->version == 0;
        if (isfinite(r->wall_s) && r->wall_s > a->wall_max)
            a->wall_max = r->wall_s;
        if (r->device >= 0 && r->dev_total_init > 0) {
            if (!a->cap_min || r->dev_total_init < a->cap_min)
                a->cap_min = r->dev_total_init;
            if (r->dev_total_init > a->cap_max)
                a->cap_max = r->dev_total_init;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * Quantities for people (the same rounding as the plugin's text report). */

const char *rr_fmt_bytes(char *buf, size_t cap, double v)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    if (!isfinite(v)) {
        snprintf(buf, cap, "-");
        return buf;
    }
    if (v < 1024.0) {
        snprintf(buf, cap, "%.0f B", v);
        return buf;
    }
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

const char *rr_fmt_ns(char *buf, size_t cap, double ns)
{
    if (!isfinite(ns))
        snprintf(buf, cap, "-");
    else if (ns < 1e3)
        snprintf(buf, cap, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, cap, "%.2f us", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, cap, "%.2f ms", ns / 1e6);
    else
        snprintf(buf, cap, "%.3f s", ns / 1e9);
    return buf;
}

const char *rr_fmt_field(char *buf, size_t cap, int field, double v, int exact)
{
    switch (rr_fields[field].unit) {
    case RR_UNIT_BYTES:
        return rr_fmt_bytes(buf, cap, v);
    case RR_UNIT_NS:
        return rr_fmt_ns(buf, cap, v);
    case RR_UNIT_COUNT:
        break;
    }
    snprintf(buf, cap, exact ? "%.0f" : "%.1f", v);
    return buf;
}

const char *rr_field_label(const rr_analysis_t *a, int field)
{
    if (field == RR_BYTES_CURRENT && !a->final)
        return "live bytes"; /* before finalize, what is allocated is not a leak */
    return rr_fields[field].label;
}
