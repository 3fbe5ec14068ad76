/* TAP: the report model (report/model.c), which the MPI plugin
 * writes with and rankmem-report reads with: every field of a record
 * written as JSON and as CSV reads back the same through the tool's reader
 * (one field table for both), the aggregation's ties and imbalance, the
 * per-node summary, the timeline's resampling, the call sites' hash. */
#include "model.h"
#include "../../report/report.h"
#include "../tap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A record whose every value differs from its neighbours'. */
static void fill(rm_record_t *r, int rank)
{
    memset(r, 0, sizeof *r);
    r->version = RM_RECORD_VERSION;
    r->flags = RM_SHARED_GPU | RM_BIND_NONE;
    r->rank = rank;
    r->size = 2;
    r->local_rank = rank;
    r->local_size = 2;
    r->env_local_rank = -1;
    r->device = rank;
    r->node_devices = 4;
    snprintf(r->host, sizeof r->host, "node-%d", rank / 2);
    snprintf(r->device_name, sizeof r->device_name, "NVIDIA H100, \"80GB\"");
    snprintf(r->pci_bus_id, sizeof r->pci_bus_id, "0000:%02x:00.0", rank + 0x1b);
    snprintf(r->bind_mode, sizeof r->bind_mode, "auto");
    snprintf(r->spec, sizeof r->spec, "stats>pool(initial=2GiB,max=90%%)>cuda");
    uint64_t *u = &r->bytes_peak;
    for (int k = 0; k < 7; k++) /* bytes_peak .. reserved_peak */
        u[k] = (uint64_t)(rank + 1) * 1000003u + (uint64_t)k;
    r->dev_total_init = 85899345920ull;
    r->dev_free_init = 85000000000ull + (uint64_t)rank;
    r->dev_total_final = 85899345920ull;
    r->dev_free_final = 84000000000ull + (uint64_t)rank;
    r->alloc_ns = 12345 + (uint64_t)rank;
    r->staged_bytes = 1u << 20;
    r->staged_messages = 7;
    r->staged_ns = 99;
    r->wall_s = 1.5 + rank;
    r->obs.state = RM_OBS_UNAVAILABLE;
    snprintf(r->obs.why, sizeof r->obs.why, "CUPTI is in use by another tool: Nsight, \"x\"");
    for (int k = 0; k < RM_OBS_NKINDS; k++) {
        rm_counts_t *c = &r->obs.kind[k];
        c->current = 100u * (uint64_t)k + (uint64_t)rank;
        c->peak = (1ull << 40) + (uint64_t)k; /* beyond 2^32 */
        c->total = (1ull << 53) + 1;          /* beyond a double's exact integers */
        c->count = 3;
        c->live = 2;
        c->peak_ns = 1500000000ull + (uint64_t)k * 1000u; /* written as seconds */
    }
    r->obs.gpu = r->obs.kind[0];
    r->obs.gpu.peak = 777777777ull * (uint64_t)(rank + 1);
    r->obs.served = r->obs.kind[1];
    r->obs.served.peak_ns = 0; /* not written */
    r->obs.rankmem_current = 5;
    r->obs.rankmem_peak = 6;
    r->obs.events = 1000;
    r->obs.unmatched_frees = 1;
    r->obs.untracked = 2;
}

/* Every field of the table equal in a and b (what the formats carry). */
static int same(const rm_record_t *a, const rm_record_t *b, char *what, size_t cap)
{
    for (size_t k = 0; k < rm_nfields; k++) {
        const rm_field_t *f = &rm_fields[k];
        const char *x = (const char *)a + f->off, *y = (const char *)b + f->off;
        size_t n = f->kind == RM_K_STR ? f->cap : f->kind == RM_K_DOUBLE ||
                   f->kind == RM_K_U64 || f->kind == RM_K_NS_AS_S ? 8 : 4;
        int eq = f->kind == RM_K_STR ? strcmp(x, y) == 0 : memcmp(x, y, n) == 0;
        if (f->kind == RM_K_DOUBLE) {
            double p, q;
            memcpy(&p, x, 8);
            memcpy(&q, y, 8);
            eq = fabs(p - q) < 1e-6;
        }
        if (!eq) {
            snprintf(what, cap, "%s", f->key);
            return 0;
        }
    }
    return 1;
}

static void roundtrip(void)
{
    rm_record_t rec[2];
    fill(&rec[0], 0);
    fill(&rec[1], 1);
    rm_buf_t b = {0};
    rm_printf(&b, "{\"schema\": %d, \"record_version\": %d, \"phase\": \"finalize\", "
                  "\"trigger\": \"MPI_Finalize\", \"job\": {\"id\": \"x\", \"ranks\": 2}, "
                  "\"ranks\": [", RM_REPORT_SCHEMA, RM_RECORD_VERSION);
    rm_json_record(&b, &rec[0]);
    rm_printf(&b, ", ");
    rm_json_record(&b, &rec[1]);
    rm_printf(&b, "]}\n");
    rr_report_t rep;
    char err[512], what[128] = "";
    int rc = rr_load_buffer("model.json", b.p, b.len, &rep, err, sizeof err);
    ok(rc == 0 && rep.n == 2, "a JSON of two records written by the model reads back");
    if (rc)
        diag("%s", err);
    ok(rc == 0 && same(&rec[0], &rep.ranks[0], what, sizeof what) &&
           same(&rec[1], &rep.ranks[1], what, sizeof what),
       "JSON: every field of the table reads back as written %s", what);
    if (rc == 0)
        rr_report_free(&rep);
    free(b.p);

    rm_buf_t c = {0};
    rm_csv_header(&c);
    rm_csv_row(&c, &rec[0]);
    rm_csv_row(&c, &rec[1]);
    what[0] = '\0';
    rc = rr_load_buffer("model.csv", c.p, c.len, &rep, err, sizeof err);
    ok(rc == 0 && rep.n == 2, "a CSV of two records written by the model reads back");
    if (rc)
        diag("%s", err);
    ok(rc == 0 && same(&rec[0], &rep.ranks[0], what, sizeof what) &&
           same(&rec[1], &rep.ranks[1], what, sizeof what),
       "CSV: every field of the table reads back as written %s", what);
    if (rc == 0)
        rr_report_free(&rep);
    free(c.p);

    /* Keys are distinct, and none is a prefix object of a value. */
    int distinct = 1;
    for (size_t i = 0; i < rm_nfields; i++)
        for (size_t j = i + 1; j < rm_nfields; j++)
            distinct &= strcmp(rm_fields[i].key, rm_fields[j].key) != 0;
    ok(distinct, "the field table's %zu keys are distinct", rm_nfields);
}

static void aggregation(void)
{
    rm_record_t rec[4];
    uint64_t peaks[4] = {5, 9, 9, 1};
    for (int i = 0; i < 4; i++) {
        fill(&rec[i], 3 - i); /* ranks 3, 2, 1, 0: order must not matter */
        rec[i].bytes_peak = peaks[i];
    }
    rm_agg_t g;
    rm_aggregate(rec, 4, RM_BYTES_PEAK, &g);
    ok(g.max == 9 && g.max_rank == 1 && g.min == 1 && g.min_rank == 0,
       "ties go to the lowest rank (max 9 on ranks 2 and 1: rank %d)", g.max_rank);
    ok(g.sum_lo == 24 && fabs(g.mean - 6.0) < 1e-12 && fabs(g.imbalance - 1.5) < 1e-12 &&
           fabs(g.std - sqrt((1 + 9 + 9 + 25) / 4.0)) < 1e-9,
       "sum, mean, population std, max/mean");
    for (int i = 0; i < 4; i++)
        rec[i].staged_messages = 0;
    rm_aggregate(rec, 4, RM_STAGED_MESSAGES, &g);
    ok(isnan(g.imbalance) && g.max_rank == 0, "all zero: imbalance NaN, max on the lowest rank");
    rm_aggregate(rec, 0, RM_BYTES_PEAK, &g);
    ok(g.min == 0 && g.max_rank == -1 && g.mean == 0, "no ranks: zeros, rank -1");
    rm_aggregate(rec, 4, RM_OBS_GPU_PEAK, &g);
    ok(g.max == 777777777ull * 4 && g.max_rank == 3, "the observed GPU peak is aggregated too");

    size_t by_host[4];
    rm_node_t nodes[4];
    size_t nn = rm_nodes(rec, 4, by_host, nodes);
    ok(nn == 2 && nodes[0].count == 2 && strcmp(nodes[0].host, "node-0") == 0 &&
           nodes[0].peak_sum == 1 + 9 && nodes[0].peak_max == 9 && nodes[0].peak_max_rank == 1 &&
           nodes[1].obs_peak_max_rank == 3 && nodes[0].ndevices == 2 && nodes[0].devices[0] == 0,
       "per node: ranks, peak sum and max (rank), observed max rank, devices in order");
}

static void timeline(void)
{
    uint64_t t[] = {0, 10, 11, 20, 90}, v[] = {5, 7, 8, 3, 9}, out[RM_TIMELINE_BUCKETS];
    rm_timeline_resample(t, v, 5, 100, out);
    /* bucket of t: t * 64 / 100 -> 0, 6, 7, 12, 57; a bucket also holds the
     * sample running into it (12: 8 from before, then 3) */
    int good = out[0] == 5 && out[5] == 5 && out[6] == 7 && out[7] == 8 && out[11] == 8 &&
               out[12] == 8 && out[13] == 3 && out[56] == 3 && out[57] == 9 && out[63] == 9;
    ok(good, "timeline: samples in their buckets, the one running in, carried forward");
    if (!good)
        for (int k = 0; k < RM_TIMELINE_BUCKETS; k++)
            diag("bucket %d: %llu", k, (unsigned long long)out[k]);
    uint64_t t2[] = {0, 1, 2}, v2[] = {4, 10, 2};
    rm_timeline_resample(t2, v2, 3, 1000, out);
    ok(out[0] == 10 && out[1] == 2 && out[63] == 2,
       "timeline: the max of the samples within a bucket, then the last sample's value");
    rm_timeline_resample(t2, v2, 3, 0, out);
    ok(out[0] == 10 && out[63] == 2, "timeline: an axis of 0 puts every sample in the first bucket");
    uint64_t t3[] = {50, 5000}, v3[] = {1, 6};
    rm_timeline_resample(t3, v3, 2, 100, out);
    ok(out[31] == 0 && out[32] == 1 && out[63] == 6, "timeline: a sample past the axis counts "
       "in the last bucket");
    rm_timeline_resample(t2, v2, 0, 1000, out);
    ok(out[0] == 0 && out[63] == 0, "timeline: no samples, zeros");
}

static void hashes(void)
{
    uint64_t a = rm_site_hash("cudaMalloc at solver.c:212 (main < run_step)");
    uint64_t b = rm_site_hash("cudaMalloc at solver.c:213 (main < run_step)");
    ok(a && b && a != b && a == rm_site_hash("cudaMalloc at solver.c:212 (main < run_step)") &&
           rm_site_hash("") != 0,
       "site hash: the same text the same hash, another text another, never 0");
    ok(rm_state_parse("on") == RM_OBS_ON && rm_state_parse("unavailable") == RM_OBS_UNAVAILABLE &&
           rm_state_parse("bogus") == -1 && strcmp(rm_state_name(7), "off") == 0,
       "states: names and words");
}

int main(void)
{
    roundtrip();
    aggregation();
    timeline();
    hashes();
    return tap_done();
}
