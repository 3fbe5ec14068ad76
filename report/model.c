/* The per-rank report's one model: see report/model.h. */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include "model.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OFF(m) offsetof(rm_record_t, m)

/* The order is the CSV's column order (the JSON's too). The first 30 are
 * record_version 1's, as it wrote them. */
const rm_field_t rm_fields[] = {
    {"rank", RM_K_INT, OFF(rank), 0, 1, 1},
    {"size", RM_K_INT, OFF(size), 0, 1, 1},
    {"host", RM_K_STR, OFF(host), sizeof(((rm_record_t *)0)->host), 1, 1},
    {"local_rank", RM_K_INT, OFF(local_rank), 0, 1, 1},
    {"local_size", RM_K_INT, OFF(local_size), 0, 1, 1},
    {"env_local_rank", RM_K_INT, OFF(env_local_rank), 0, 1, 1},
    {"device", RM_K_INT, OFF(device), 0, 1, 1},
    {"node_devices", RM_K_INT, OFF(node_devices), 0, 1, 1},
    {"device_name", RM_K_STR, OFF(device_name), sizeof(((rm_record_t *)0)->device_name), 1, 1},
    {"pci_bus_id", RM_K_STR, OFF(pci_bus_id), sizeof(((rm_record_t *)0)->pci_bus_id), 1, 1},
    {"bind_mode", RM_K_STR, OFF(bind_mode), sizeof(((rm_record_t *)0)->bind_mode), 1, 1},
    {"spec", RM_K_STR, OFF(spec), sizeof(((rm_record_t *)0)->spec), 1, 1},
    {"flags", RM_K_U32, OFF(flags), 0, 1, 1},
    {"host_fallback", RM_K_FLAG, OFF(flags), RM_HOST_FALLBACK, 1, 1},
    {"shared_gpu", RM_K_FLAG, OFF(flags), RM_SHARED_GPU, 1, 1},
    {"bind_mismatch", RM_K_FLAG, OFF(flags), RM_BIND_MISMATCH, 1, 1},
    {"bind_none", RM_K_FLAG, OFF(flags), RM_BIND_NONE, 1, 1},
    {"bytes_peak", RM_K_U64, OFF(bytes_peak), 0, 1, 1},
    {"bytes_current", RM_K_U64, OFF(bytes_current), 0, 1, 1},
    {"bytes_total", RM_K_U64, OFF(bytes_total), 0, 1, 1},
    {"count_total", RM_K_U64, OFF(count_total), 0, 1, 1},
    {"count_peak", RM_K_U64, OFF(count_peak), 0, 1, 1},
    {"count_current", RM_K_U64, OFF(count_current), 0, 1, 1},
    {"reserved_peak", RM_K_U64, OFF(reserved_peak), 0, 1, 1},
    {"alloc_ns", RM_K_U64, OFF(alloc_ns), 0, 1, 1},
    {"staged_bytes", RM_K_U64, OFF(staged_bytes), 0, 1, 1},
    {"staged_messages", RM_K_U64, OFF(staged_messages), 0, 1, 1},
    {"dev_total_init", RM_K_U64, OFF(dev_total_init), 0, 1, 1},
    {"dev_free_init", RM_K_U64, OFF(dev_free_init), 0, 1, 1},
    {"dev_total_final", RM_K_U64, OFF(dev_total_final), 0, 1, 1},
    {"dev_free_final", RM_K_U64, OFF(dev_free_final), 0, 1, 1},
    {"staged_ns", RM_K_U64, OFF(staged_ns), 0, 1, 1},
    {"wall_s", RM_K_DOUBLE, OFF(wall_s), 0, 1, 1},
    {"version", RM_K_U32, OFF(version), 0, 1, 1},
    {"observed.state", RM_K_STATE, OFF(obs.state), 0, 2, 1},
    {"observed.why", RM_K_STR, OFF(obs.why), RM_WHY, 2, 1},
    {"observed.device.current", RM_K_U64, OFF(obs.kind[0].current), 0, 2, 1},
    {"observed.device.peak", RM_K_U64, OFF(obs.kind[0].peak), 0, 2, 1},
    {"observed.device.total", RM_K_U64, OFF(obs.kind[0].total), 0, 2, 1},
    {"observed.device.count", RM_K_U64, OFF(obs.kind[0].count), 0, 2, 1},
    {"observed.device.live", RM_K_U64, OFF(obs.kind[0].live), 0, 2, 1},
    {"observed.device.peak_s", RM_K_NS_AS_S, OFF(obs.kind[0].peak_ns), 0, 2, 1},
    {"observed.managed.current", RM_K_U64, OFF(obs.kind[1].current), 0, 2, 1},
    {"observed.managed.peak", RM_K_U64, OFF(obs.kind[1].peak), 0, 2, 1},
    {"observed.managed.total", RM_K_U64, OFF(obs.kind[1].total), 0, 2, 1},
    {"observed.managed.count", RM_K_U64, OFF(obs.kind[1].count), 0, 2, 1},
    {"observed.managed.live", RM_K_U64, OFF(obs.kind[1].live), 0, 2, 1},
    {"observed.managed.peak_s", RM_K_NS_AS_S, OFF(obs.kind[1].peak_ns), 0, 2, 1},
    {"observed.pinned.current", RM_K_U64, OFF(obs.kind[2].current), 0, 2, 1},
    {"observed.pinned.peak", RM_K_U64, OFF(obs.kind[2].peak), 0, 2, 1},
    {"observed.pinned.total", RM_K_U64, OFF(obs.kind[2].total), 0, 2, 1},
    {"observed.pinned.count", RM_K_U64, OFF(obs.kind[2].count), 0, 2, 1},
    {"observed.pinned.live", RM_K_U64, OFF(obs.kind[2].live), 0, 2, 1},
    {"observed.pinned.peak_s", RM_K_NS_AS_S, OFF(obs.kind[2].peak_ns), 0, 2, 1},
    {"observed.vmm.current", RM_K_U64, OFF(obs.kind[3].current), 0, 2, 1},
    {"observed.vmm.peak", RM_K_U64, OFF(obs.kind[3].peak), 0, 2, 1},
    {"observed.vmm.total", RM_K_U64, OFF(obs.kind[3].total), 0, 2, 1},
    {"observed.vmm.count", RM_K_U64, OFF(obs.kind[3].count), 0, 2, 1},
    {"observed.vmm.live", RM_K_U64, OFF(obs.kind[3].live), 0, 2, 1},
    {"observed.vmm.peak_s", RM_K_NS_AS_S, OFF(obs.kind[3].peak_ns), 0, 2, 1},
    {"observed.gpu.current", RM_K_U64, OFF(obs.gpu.current), 0, 2, 1},
    {"observed.gpu.peak", RM_K_U64, OFF(obs.gpu.peak), 0, 2, 1},
    {"observed.gpu.total", RM_K_U64, OFF(obs.gpu.total), 0, 2, 1},
    {"observed.gpu.count", RM_K_U64, OFF(obs.gpu.count), 0, 2, 1},
    {"observed.gpu.live", RM_K_U64, OFF(obs.gpu.live), 0, 2, 1},
    {"observed.gpu.peak_s", RM_K_NS_AS_S, OFF(obs.gpu.peak_ns), 0, 2, 1},
    {"observed.served.current", RM_K_U64, OFF(obs.served.current), 0, 2, 1},
    {"observed.served.peak", RM_K_U64, OFF(obs.served.peak), 0, 2, 1},
    {"observed.served.total", RM_K_U64, OFF(obs.served.total), 0, 2, 1},
    {"observed.served.count", RM_K_U64, OFF(obs.served.count), 0, 2, 1},
    {"observed.served.live", RM_K_U64, OFF(obs.served.live), 0, 2, 1},
    {"observed.rankmem.current", RM_K_U64, OFF(obs.rankmem_current), 0, 2, 1},
    {"observed.rankmem.peak", RM_K_U64, OFF(obs.rankmem_peak), 0, 2, 1},
    {"observed.events", RM_K_U64, OFF(obs.events), 0, 2, 1},
    {"observed.unmatched_frees", RM_K_U64, OFF(obs.unmatched_frees), 0, 2, 1},
    {"observed.untracked", RM_K_U64, OFF(obs.untracked), 0, 2, 1},
    {"failure.kind", RM_K_STR, OFF(fail.kind), sizeof(((rm_record_t *)0)->fail.kind), 3, 1},
    {"failure.trigger", RM_K_STR, OFF(fail.trigger), RM_FAIL_WORD, 3, 1},
    {"failure.code", RM_K_INT, OFF(fail.code), 0, 3, 1},
    {"failure.t_s", RM_K_NS_AS_S, OFF(fail.t_ns), 0, 3, 1},
    {"failure.diagnosis", RM_K_STR, OFF(fail.diagnosis), RM_FAIL_DIAG, 3, 1},
    {"failure.oom.count", RM_K_U64, OFF(fail.oom_count), 0, 3, 1},
    {"failure.oom.bytes", RM_K_U64, OFF(fail.oom_bytes), 0, 3, 1},
    {"failure.oom.stream", RM_K_U64, OFF(fail.oom_stream), 0, 3, 1},
    {"failure.oom.t_s", RM_K_NS_AS_S, OFF(fail.oom_t_ns), 0, 3, 1},
    {"failure.oom.api", RM_K_STR, OFF(fail.oom_api), sizeof(((rm_record_t *)0)->fail.oom_api), 3, 1},
    {"failure.oom.source", RM_K_STR, OFF(fail.oom_source),
     sizeof(((rm_record_t *)0)->fail.oom_source), 3, 1},
    {"failure.oom.site", RM_K_STR, OFF(fail.oom_site), RM_SITE_TEXT, 3, 1},
    {"failure.oom.live", RM_K_U64, OFF(fail.oom_live), 0, 3, 1},
    {"failure.oom.pool_reserved", RM_K_U64, OFF(fail.pool_reserved), 0, 3, 1},
    {"failure.oom.pool_live", RM_K_U64, OFF(fail.pool_live), 0, 3, 1},
    {"failure.oom.pool_largest_free", RM_K_U64, OFF(fail.pool_largest_free), 0, 3, 1},
    {"failure.oom.dev_free", RM_K_U64, OFF(fail.dev_free), 0, 3, 1},
    {"failure.oom.dev_total", RM_K_U64, OFF(fail.dev_total), 0, 3, 1},
    {"failure.oom.dev_other", RM_K_U64, OFF(fail.dev_other), 0, 3, 1},
};
const size_t rm_nfields = sizeof rm_fields / sizeof rm_fields[0];

#define AGG(name, key, label, unit) {key, label, unit, OFF(name), 0}
#define MEM(which, key, label, unit) {key, label, unit, 0, 1 + (which)}
const rm_agg_field_t rm_agg_fields[RM_NAGG] = {
    /* The headline first: what people read first is the rank's memory. */
    MEM(RM_MEM_PEAK, "memory_peak", "peak bytes", RM_UNIT_BYTES),
    MEM(RM_MEM_CURRENT, "memory_current", "leaked bytes", RM_UNIT_BYTES),
    MEM(RM_MEM_TOTAL, "memory_total", "total bytes", RM_UNIT_BYTES),
    MEM(RM_MEM_COUNT, "memory_count", "allocations", RM_UNIT_COUNT),
    MEM(RM_MEM_LIVE, "memory_live", "live allocations", RM_UNIT_COUNT),
    /* rankmem's chain (the stats adaptor): a column beside the headline */
    AGG(bytes_peak, "bytes_peak", "served peak", RM_UNIT_BYTES),
    AGG(bytes_current, "bytes_current", "served leaked", RM_UNIT_BYTES),
    AGG(bytes_total, "bytes_total", "served total", RM_UNIT_BYTES),
    AGG(count_total, "count_total", "served allocs", RM_UNIT_COUNT),
    AGG(count_peak, "count_peak", "served peak allocs", RM_UNIT_COUNT),
    AGG(count_current, "count_current", "served live allocs", RM_UNIT_COUNT),
    AGG(reserved_peak, "reserved_peak", "reserved peak", RM_UNIT_BYTES),
    AGG(alloc_ns, "alloc_ns", "alloc time", RM_UNIT_NS),
    AGG(staged_bytes, "staged_bytes", "staged bytes", RM_UNIT_BYTES),
    AGG(staged_messages, "staged_messages", "staged messages", RM_UNIT_COUNT),
    AGG(obs.gpu.peak, "observed_gpu_peak", "observed GPU peak", RM_UNIT_BYTES),
    AGG(obs.served.peak, "observed_served_peak", "intercepted peak", RM_UNIT_BYTES),
};

/* ------------------------------------------------------------------------
 * The headline (one story, issue 29). */

int rm_headline_observed(const rm_record_t *r)
{
    /* Only "on" means CUDA's allocations were all seen: "unavailable" may
     * still hold what a program fed by hand, which is not the whole story. */
    return r->version >= 2 && r->obs.state == RM_OBS_ON;
}

static uint64_t sub0(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/* 1 when the rank's chain serves device (or managed) memory: its leaf is
 * not host memory (system, pinned, vmm over host) and the rank has a GPU. */
static int chain_is_device(const rm_record_t *r)
{
    if (r->flags & RM_HOST_FALLBACK)
        return 0;
    const char *leaf = strrchr(r->spec, '>');
    leaf = leaf ? leaf + 1 : r->spec;
    static const char *const host[] = {"system", "pinned"};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) {
        size_t n = strlen(host[i]);
        if (strncmp(leaf, host[i], n) == 0 && (leaf[n] == '\0' || leaf[n] == '('))
            return 0;
    }
    /* the vmm resource over host memory (its tests' backend) */
    return !(strncmp(leaf, "vmm(", 4) == 0 && strstr(leaf, "backend=host") != NULL);
}

void rm_headline(const rm_record_t *r, rm_headline_t *h)
{
    if (rm_headline_observed(r)) {
        h->source = RM_SRC_OBSERVED;
        h->peak = r->obs.gpu.peak;
        h->current = r->obs.gpu.current;
        h->total = r->obs.gpu.total;
        h->count = r->obs.gpu.count;
        h->live = r->obs.gpu.live;
        if (chain_is_device(r)) {
            /* What the chain served through rankmem's API is the program's
             * device memory too; CUDA saw only the chain's own upstream
             * calls (rankmem's, not counted). Served by interception, it
             * is in both counts already: added once. Sums are exact; the
             * peak of the sum is at least the larger peak, exact when the
             * program used one way only. */
            h->current += sub0(r->bytes_current, r->obs.served.current);
            h->total += sub0(r->bytes_total, r->obs.served.total);
            h->count += sub0(r->count_total, r->obs.served.count);
            h->live += sub0(r->count_current, r->obs.served.live);
            if (r->bytes_peak > h->peak)
                h->peak = r->bytes_peak;
        }
    } else {
        h->source = RM_SRC_SERVED;
        h->peak = r->bytes_peak;
        h->current = r->bytes_current;
        h->total = r->bytes_total;
        h->count = r->count_total;
        h->live = r->count_current;
    }
}

uint64_t rm_headline_value(const rm_record_t *r, int f)
{
    rm_headline_t h;
    rm_headline(r, &h);
    switch (f) {
    case RM_MEM_PEAK:
        return h.peak;
    case RM_MEM_CURRENT:
        return h.current;
    case RM_MEM_TOTAL:
        return h.total;
    case RM_MEM_COUNT:
        return h.count;
    case RM_MEM_LIVE:
        return h.live;
    }
    return 0;
}

int rm_headline_source(const rm_record_t *rec, size_t n, size_t *nobs_p)
{
    size_t nobs = 0, nact = 0;
    for (size_t i = 0; i < n; i++) {
        nact += rec[i].version != 0; /* a stub's zeros say nothing */
        nobs += (size_t)rm_headline_observed(&rec[i]);
    }
    if (nobs_p)
        *nobs_p = nobs;
    return nobs == 0 ? RM_SRC_SERVED : nobs >= nact ? RM_SRC_OBSERVED : RM_SRC_MIXED;
}

const char *rm_headline_label(int source)
{
    switch (source) {
    case RM_SRC_OBSERVED:
        return "device memory as the program saw it (observed)";
    case RM_SRC_MIXED:
        return "device memory as the program saw it (observed) where observed, else memory "
               "rankmem served";
    }
    return "memory rankmem served";
}

const char *rm_source_name(int source)
{
    return source == RM_SRC_OBSERVED ? "observed" : source == RM_SRC_MIXED ? "mixed" : "served";
}

const char *rm_agg_label(int f, int source, int final)
{
    if (f == RM_MEM_CURRENT && !final)
        return "live bytes"; /* before finalize, what is allocated is not a leak */
    if (f == RM_BYTES_CURRENT && !final)
        return "served live";
    if (f == RM_COUNT_PEAK && source == RM_SRC_SERVED)
        return "peak allocations"; /* the chain's counts are the headline's there */
    return f >= 0 && f < RM_NAGG ? rm_agg_fields[f].label : "?";
}

int rm_agg_shown(int f, int source)
{
    if (source != RM_SRC_SERVED)
        return 1;
    return f != RM_BYTES_PEAK && f != RM_BYTES_CURRENT && f != RM_BYTES_TOTAL &&
           f != RM_COUNT_TOTAL && f != RM_COUNT_CURRENT;
}

/* ------------------------------------------------------------------------
 * Aggregation. */

static void agg_finish(rm_agg_t *g, size_t n)
{
    if (n == 0)
        g->min = 0;
    g->mean = n ? (double)(g->sum / (long double)n) : 0.0;
}

/* Ties go to the lowest rank: the answer does not depend on order. */
static void agg_add(rm_agg_t *g, uint64_t v, int rank)
{
    if (g->min_rank < 0 || v < g->min || (v == g->min && rank < g->min_rank)) {
        g->min = v;
        g->min_rank = rank;
    }
    if (g->max_rank < 0 || v > g->max || (v == g->max && rank < g->max_rank)) {
        g->max = v;
        g->max_rank = rank;
    }
    g->sum_lo += v;
    g->sum += (long double)v;
}

static void agg_start(rm_agg_t *g)
{
    memset(g, 0, sizeof *g);
    g->min = UINT64_MAX;
    g->min_rank = g->max_rank = -1;
}

void rm_aggregate(const rm_record_t *rec, size_t n, int f, rm_agg_t *g)
{
    agg_start(g);
    for (size_t i = 0; i < n; i++)
        agg_add(g, rm_value(&rec[i], f), rec[i].rank);
    agg_finish(g, n);
    /* Two passes: sum of squares minus square of sums cancels at these sizes. */
    long double ss = 0;
    for (size_t i = 0; i < n; i++) {
        long double d = (long double)rm_value(&rec[i], f) - (long double)g->mean;
        ss += d * d;
    }
    g->std = n ? (double)sqrtl(ss / (long double)n) : 0.0;
    g->imbalance = g->mean > 0.0 ? (double)g->max / g->mean : NAN;
}

void rm_aggregate_values(const uint64_t *v, const int *ranks, size_t n, rm_agg_t *g)
{
    agg_start(g);
    for (size_t i = 0; i < n; i++)
        agg_add(g, v[i], ranks ? ranks[i] : (int)i);
    agg_finish(g, n);
    long double ss = 0;
    for (size_t i = 0; i < n; i++) {
        long double d = (long double)v[i] - (long double)g->mean;
        ss += d * d;
    }
    g->std = n ? (double)sqrtl(ss / (long double)n) : 0.0;
    g->imbalance = g->mean > 0.0 ? (double)g->max / g->mean : NAN;
}

static const rm_record_t *sort_rec; /* qsort has no context argument in C11 */

static int cmp_host(const void *a, const void *b)
{
    const rm_record_t *x = &sort_rec[*(const size_t *)a], *y = &sort_rec[*(const size_t *)b];
    int c = strcmp(x->host, y->host);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

size_t rm_nodes(const rm_record_t *rec, size_t n, size_t *by_host, rm_node_t *nodes)
{
    for (size_t i = 0; i < n; i++)
        by_host[i] = i;
    sort_rec = rec;
    qsort(by_host, n, sizeof *by_host, cmp_host);
    size_t nn = 0;
    for (size_t k = 0; k < n; k++) {
        const rm_record_t *r = &rec[by_host[k]];
        rm_node_t *nd = nn ? &nodes[nn - 1] : NULL;
        if (!nd || strcmp(nd->host, r->host) != 0) {
            nd = &nodes[nn++];
            memset(nd, 0, sizeof *nd);
            nd->host = r->host;
            nd->first = k;
            nd->peak_max_rank = nd->obs_peak_max_rank = nd->mem_peak_max_rank = -1;
            nd->dev_free_init_min = nd->dev_free_final_min = UINT64_MAX;
        }
        nd->count++;
        if (r->node_devices > nd->node_devices)
            nd->node_devices = r->node_devices;
        nd->host_fallback += (r->flags & RM_HOST_FALLBACK) != 0;
        nd->shared += (r->flags & RM_SHARED_GPU) != 0;
        nd->peak_sum += r->bytes_peak;
        nd->leaked_sum += r->bytes_current;
        nd->reserved_sum += r->reserved_peak;
        nd->total_sum += r->bytes_total;
        nd->obs_peak_sum += r->obs.gpu.peak;
        /* by_host is in rank order within a host: the first max is the lowest rank */
        if (nd->peak_max_rank < 0 || r->bytes_peak > nd->peak_max) {
            nd->peak_max = r->bytes_peak;
            nd->peak_max_rank = r->rank;
        }
        rm_headline_t h;
        rm_headline(r, &h);
        nd->mem_peak_sum += h.peak;
        nd->mem_leaked_sum += h.current;
        nd->mem_total_sum += h.total;
        if (nd->mem_peak_max_rank < 0 || h.peak > nd->mem_peak_max) {
            nd->mem_peak_max = h.peak;
            nd->mem_peak_max_rank = r->rank;
        }
        if (nd->obs_peak_max_rank < 0 || r->obs.gpu.peak > nd->obs_peak_max) {
            nd->obs_peak_max = r->obs.gpu.peak;
            nd->obs_peak_max_rank = r->rank;
        }
        if (r->device >= 0) {
            int seen = 0;
            for (int d = 0; d < nd->ndevices; d++)
                seen |= nd->devices[d] == r->device;
            if (!seen && nd->ndevices < RM_NODE_DEVICES)
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
    for (size_t k = 0; k < nn; k++) { /* devices in order, for reading */
        rm_node_t *nd = &nodes[k];
        for (int i = 1; i < nd->ndevices; i++)
            for (int j = i; j > 0 && nd->devices[j - 1] > nd->devices[j]; j--) {
                int t = nd->devices[j];
                nd->devices[j] = nd->devices[j - 1];
                nd->devices[j - 1] = t;
            }
    }
    return nn;
}

/* ------------------------------------------------------------------------
 * Writing. */

static void reserve(rm_buf_t *b, size_t more)
{
    if (b->oom || b->len + more + 1 <= b->cap)
        return;
    if (b->fixed) { /* the caller's memory: never realloc (signal context) */
        b->oom = 1;
        return;
    }
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}

void rm_printf(rm_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || b->oom)
        return;
    reserve(b, (size_t)n);
    if (b->oom)
        return;
    if ((size_t)n < sizeof tmp) {
        memcpy(b->p + b->len, tmp, (size_t)n + 1);
    } else {
        va_start(ap, fmt);
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    b->len += (size_t)n;
}

void rm_putc(rm_buf_t *b, char c)
{
    reserve(b, 1);
    if (b->oom)
        return;
    b->p[b->len++] = c;
    b->p[b->len] = '\0';
}

void rm_buf_fixed(rm_buf_t *b, char *mem, size_t cap)
{
    b->p = mem;
    b->cap = cap;
    b->len = 0;
    b->oom = cap == 0;
    b->fixed = 1;
    if (cap)
        mem[0] = '\0';
}

void rm_puts(rm_buf_t *b, const char *s)
{
    size_t n = strlen(s);
    reserve(b, n);
    if (b->oom)
        return;
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

/* Integers by hand: vsnprintf is not async-signal-safe. */
void rm_put_u64(rm_buf_t *b, uint64_t v)
{
    char d[24];
    size_t i = sizeof d;
    d[--i] = '\0';
    do {
        d[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    rm_puts(b, d + i);
}

void rm_put_i64(rm_buf_t *b, int64_t v)
{
    if (v < 0) {
        rm_putc(b, '-');
        rm_put_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        rm_put_u64(b, (uint64_t)v);
    }
}

/* Days since 1970-01-01 to a civil date (the proleptic Gregorian
 * calendar), integers only. */
void rm_utc_text(int64_t t, char *out, size_t cap)
{
    int64_t days = t >= 0 ? t / 86400 : (t - 86399) / 86400;
    int64_t sec = t - days * 86400;
    int64_t z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097;
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t y = yoe + era * 400, doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153, d = doy - (153 * mp + 2) / 5 + 1;
    int64_t m = mp < 10 ? mp + 3 : mp - 9;
    y += m <= 2;
    int64_t v[6] = {y, m, d, sec / 3600, sec / 60 % 60, sec % 60};
    static const char sep[6] = {'-', '-', 'T', ':', ':', '+'};
    static const int width[6] = {4, 2, 2, 2, 2, 2};
    char tmp[32];
    size_t o = 0;
    for (int k = 0; k < 6; k++) {
        int64_t x = v[k] < 0 ? 0 : v[k];
        for (int w = width[k] - 1; w >= 0; w--) {
            tmp[o + (size_t)w] = (char)('0' + x % 10);
            x /= 10;
        }
        o += (size_t)width[k];
        tmp[o++] = sep[k];
    }
    memcpy(tmp + o, "0000", 5);
    if (cap) {
        size_t n = o + 4 < cap - 1 ? o + 4 : cap - 1;
        memcpy(out, tmp, n);
        out[n] = '\0';
    }
}

/* Bytes outside ASCII become '?' so that the document is valid UTF-8
 * whatever a host name or spec holds. */
void rm_json_str(rm_buf_t *b, const char *s)
{
    rm_putc(b, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        static const char hex[] = "0123456789abcdef";
        if (c == '"' || c == '\\') {
            rm_putc(b, '\\');
            rm_putc(b, (char)c);
        } else if (c == '\n') {
            rm_puts(b, "\\n");
        } else if (c == '\t') {
            rm_puts(b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            rm_puts(b, "\\u00");
            rm_putc(b, hex[c >> 4]);
            rm_putc(b, hex[c & 15]);
        } else
            rm_putc(b, c >= 0x80 ? '?' : (char)c);
    }
    rm_putc(b, '"');
}

/* RFC 4180: quoted when it holds a comma, quote or line break. */
void rm_csv_str(rm_buf_t *b, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        rm_printf(b, "%s", s);
        return;
    }
    rm_putc(b, '"');
    for (; *s; s++) {
        if (*s == '"')
            rm_putc(b, '"');
        rm_putc(b, *s);
    }
    rm_putc(b, '"');
}

void rm_json_num(rm_buf_t *b, double v)
{
    if (!isfinite(v)) {
        rm_puts(b, "null");
    } else if (!b->fixed) {
        rm_printf(b, "%.12g", v); /* exact to far below what is measured */
    } else if (fabs(v) < 9e15) {
        /* Signal context: fixed point to the nanosecond, by hand. */
        double a = fabs(v);
        uint64_t whole = (uint64_t)a, frac = (uint64_t)((a - (double)whole) * 1e9 + 0.5);
        if (frac >= 1000000000u) {
            whole++;
            frac -= 1000000000u;
        }
        if (v < 0)
            rm_putc(b, '-');
        rm_put_u64(b, whole);
        if (frac) {
            char d[10];
            for (int k = 8; k >= 0; k--) {
                d[k] = (char)('0' + frac % 10);
                frac /= 10;
            }
            int n = 9;
            while (n > 1 && d[n - 1] == '0')
                n--;
            d[n] = '\0';
            rm_putc(b, '.');
            rm_puts(b, d);
        }
    } else {
        rm_put_u64(b, (uint64_t)fabs(v)); /* beyond what a record holds */
    }
}

static const char *const state_names[] = {"off", "on", "unavailable"};

const char *rm_state_name(int state)
{
    return state >= 0 && state < 3 ? state_names[state] : "off";
}

int rm_state_parse(const char *s)
{
    for (int i = 0; i < 3; i++)
        if (strcmp(s, state_names[i]) == 0)
            return i;
    return -1;
}

/* A value of field f as text; JSON and CSV differ only in strings and
 * booleans. */
static void put_value(rm_buf_t *b, const rm_record_t *r, const rm_field_t *f, int json)
{
    const char *p = (const char *)r + f->off;
    int32_t i32;
    uint32_t u32;
    uint64_t u64;
    double d;
    switch (f->kind) {
    case RM_K_INT:
        memcpy(&i32, p, sizeof i32);
        rm_put_i64(b, i32);
        break;
    case RM_K_U32:
        memcpy(&u32, p, sizeof u32);
        rm_put_u64(b, u32);
        break;
    case RM_K_U64:
        memcpy(&u64, p, sizeof u64);
        rm_put_u64(b, u64);
        break;
    case RM_K_NS_AS_S:
        memcpy(&u64, p, sizeof u64);
        rm_json_num(b, (double)u64 / 1e9);
        break;
    case RM_K_DOUBLE:
        memcpy(&d, p, sizeof d);
        if (json)
            rm_json_num(b, d);
        else if (isfinite(d))
            rm_printf(b, "%.6f", d);
        break;
    case RM_K_STR: {
        char tmp[512];
        size_t n = f->cap < sizeof tmp ? f->cap : sizeof tmp;
        memcpy(tmp, p, n);
        tmp[n - 1] = '\0'; /* gathered bytes: terminate defensively */
        if (json)
            rm_json_str(b, tmp);
        else
            rm_csv_str(b, tmp);
        break;
    }
    case RM_K_FLAG:
        memcpy(&u32, p, sizeof u32);
        if (json)
            rm_puts(b, (u32 & f->cap) ? "true" : "false");
        else
            rm_puts(b, (u32 & f->cap) ? "1" : "0");
        break;
    case RM_K_STATE:
        memcpy(&i32, p, sizeof i32);
        if (json)
            rm_json_str(b, rm_state_name(i32));
        else
            rm_puts(b, rm_state_name(i32));
        break;
    }
}

/* Length of the object path of a key: "observed.device.peak" -> the
 * components before the last. */
static size_t ncomp(const char *key)
{
    size_t n = 0;
    for (; *key; key++)
        n += *key == '.';
    return n;
}

static size_t comp(const char *key, size_t i, const char **start)
{
    const char *p = key;
    for (size_t k = 0; k < i; k++)
        p = strchr(p, '.') + 1;
    const char *e = strchr(p, '.');
    *start = p;
    return e ? (size_t)(e - p) : strlen(p);
}

/* ', "key": ' without printf (signal context). */
static void put_key(rm_buf_t *b, int first, const char *k, size_t len)
{
    if (!first)
        rm_puts(b, ", ");
    rm_putc(b, '"');
    for (size_t i = 0; i < len; i++)
        rm_putc(b, k[i]);
    rm_puts(b, "\": ");
}

/* The headline's keys in a record ("memory.peak", ...), in RM_MEM_* order. */
static const char *const mem_keys[5] = {"peak", "current", "total", "count", "live"};

/* Async-signal-safe over a fixed buffer (rm_buf_fixed): no printf. */
void rm_json_record(rm_buf_t *b, const rm_record_t *r)
{
    /* Nested objects open and close as the dotted keys go (the table
     * keeps each object's keys together). */
    const char *open[4];
    size_t open_len[4], depth = 0;
    int first[5] = {1, 1, 1, 1, 1};
    rm_putc(b, '{');
    for (size_t k = 0; k < rm_nfields; k++) {
        const rm_field_t *f = &rm_fields[k];
        size_t nc = ncomp(f->key);
        if (nc > 3)
            nc = 3;
        size_t same = 0;
        while (same < depth && same < nc) {
            const char *s;
            size_t l = comp(f->key, same, &s);
            if (l != open_len[same] || strncmp(s, open[same], l) != 0)
                break;
            same++;
        }
        while (depth > same) {
            rm_putc(b, '}');
            depth--;
        }
        while (depth < nc) {
            const char *s;
            size_t l = comp(f->key, depth, &s);
            put_key(b, first[depth], s, l);
            rm_putc(b, '{');
            first[depth] = 0;
            open[depth] = s;
            open_len[depth] = l;
            depth++;
            first[depth] = 1;
        }
        const char *leaf;
        size_t l = comp(f->key, nc, &leaf);
        put_key(b, first[depth], leaf, l);
        first[depth] = 0;
        put_value(b, r, f, 1);
    }
    while (depth > 0) {
        rm_putc(b, '}');
        depth--;
    }
    /* The headline, computed (not stored, not read back): scripts get the
     * same choice as the text (schema 4). */
    rm_headline_t h;
    rm_headline(r, &h);
    rm_puts(b, ", \"memory\": {\"source\": \"");
    rm_puts(b, rm_source_name(h.source));
    const uint64_t v[5] = {h.peak, h.current, h.total, h.count, h.live};
    for (int k = 0; k < 5; k++) {
        rm_puts(b, k ? ", \"" : "\", \"");
        rm_puts(b, mem_keys[k]);
        rm_puts(b, "\": ");
        rm_put_u64(b, v[k]);
    }
    rm_puts(b, "}}");
}

void rm_csv_header(rm_buf_t *b)
{
    int n = 0;
    for (size_t k = 0; k < rm_nfields; k++)
        if (rm_fields[k].csv)
            rm_printf(b, "%s%s", n++ ? "," : "", rm_fields[k].key);
    rm_puts(b, ",memory.source");
    for (int k = 0; k < 5; k++)
        rm_printf(b, ",memory.%s", mem_keys[k]);
    rm_putc(b, '\n');
}

void rm_csv_row(rm_buf_t *b, const rm_record_t *r)
{
    int n = 0;
    for (size_t k = 0; k < rm_nfields; k++)
        if (rm_fields[k].csv) {
            if (n++)
                rm_putc(b, ',');
            put_value(b, r, &rm_fields[k], 0);
        }
    rm_headline_t h;
    rm_headline(r, &h);
    rm_putc(b, ',');
    rm_puts(b, rm_source_name(h.source));
    const uint64_t v[5] = {h.peak, h.current, h.total, h.count, h.live};
    for (int k = 0; k < 5; k++) {
        rm_putc(b, ',');
        rm_put_u64(b, v[k]);
    }
    rm_putc(b, '\n');
}

uint64_t rm_site_hash(const char *text)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        h ^= *p;
        h *= 0x100000001b3ull;
    }
    return h ? h : 1; /* 0 means "no site" in the gathered entries */
}

void rm_timeline_resample(const uint64_t *t_ns, const uint64_t *bytes, size_t n,
                          uint64_t t_end_ns, uint64_t out[RM_TIMELINE_BUCKETS])
{
    /* A sample holds the most bytes from its time to the next sample's: a
     * bucket gets the most of the samples in it and of the one running
     * into it from before; a bucket without a sample, that one's. */
    uint64_t prev = 0;
    size_t i = 0;
    for (size_t k = 0; k < RM_TIMELINE_BUCKETS; k++) {
        uint64_t v = prev;
        while (i < n) {
            size_t b = t_end_ns ? (size_t)((long double)t_ns[i] * RM_TIMELINE_BUCKETS / t_end_ns)
                                : 0;
            if (b > k && k + 1 < RM_TIMELINE_BUCKETS)
                break;
            if (bytes[i] > v)
                v = bytes[i];
            prev = bytes[i];
            i++;
        }
        out[k] = v;
    }
}
