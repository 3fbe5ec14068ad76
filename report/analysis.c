/* rankmem-report: what is computed over the ranks of a report: the report
 * model's aggregation (report/model.c), the plugin's own, run
 * again here so that a CSV, which has only the records, gets it too. */
#include "report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* qsort has no context argument in C11; the analysis runs once, in one thread. */
static const rr_rank_t *sort_ranks;

static int cmp_peak(const void *a, const void *b)
{
    const rr_rank_t *x = &sort_ranks[*(const size_t *)a], *y = &sort_ranks[*(const size_t *)b];
    uint64_t p = rm_value(x, RM_MEM_PEAK), q = rm_value(y, RM_MEM_PEAK);
    if (p != q)
        return p < q ? 1 : -1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_leak(const void *a, const void *b)
{
    const rr_rank_t *x = &sort_ranks[*(const size_t *)a], *y = &sort_ranks[*(const size_t *)b];
    uint64_t p = rm_value(x, RM_MEM_CURRENT), q = rm_value(y, RM_MEM_CURRENT);
    if (p != q)
        return p < q ? 1 : -1;
    return (x->rank > y->rank) - (x->rank < y->rank);
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
        rm_aggregate(rep->ranks, n, f, &a->agg[f]);
    a->final = !rep->phase || strcmp(rep->phase, "finalize") == 0;
    /* One story (issue 29): the plugin's choice, from the same helper. */
    a->source = rm_headline_source(rep->ranks, n, &a->nobs);

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
        a->by_peak[i] = i;
    qsort(a->by_peak, n, sizeof(size_t), cmp_peak);
    a->nleaked = 0;
    for (size_t i = 0; i < n; i++)
        if (rm_value(&rep->ranks[i], RM_MEM_CURRENT) > 0)
            a->leaked[a->nleaked++] = i;
    qsort(a->leaked, a->nleaked, sizeof(size_t), cmp_leak);

    a->nnodes = rm_nodes(rep->ranks, n, a->by_host, a->nodes);
    for (size_t k = 0; k < a->nnodes; k++)
        if (a->nodes[k].count > a->per_node_max)
            a->per_node_max = a->nodes[k].count;

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
    return rm_agg_label(field, a->source, a->final);
}
