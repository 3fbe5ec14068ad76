/* rankmem-report's parts (not installed): the report in memory, its
 * readers (report-read.c), the analysis over ranks (report-analysis.c),
 * the picture (svg.c). The layout of the files read is in
 * docs/report.md; the tool is described in docs/report-tool.md. */
#ifndef RANKMEM_TOOLS_REPORT_H
#define RANKMEM_TOOLS_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "model.h"

/* The fields aggregated over ranks: the report model's (common/
 * report/model.h), under the names the tool's parts have used. */
#define RR_BYTES_PEAK RM_BYTES_PEAK
#define RR_BYTES_CURRENT RM_BYTES_CURRENT
#define RR_BYTES_TOTAL RM_BYTES_TOTAL
#define RR_COUNT_TOTAL RM_COUNT_TOTAL
#define RR_COUNT_PEAK RM_COUNT_PEAK
#define RR_COUNT_CURRENT RM_COUNT_CURRENT
#define RR_RESERVED_PEAK RM_RESERVED_PEAK
#define RR_ALLOC_NS RM_ALLOC_NS
#define RR_STAGED_BYTES RM_STAGED_BYTES
#define RR_STAGED_MESSAGES RM_STAGED_MESSAGES
#define RR_OBS_GPU_PEAK RM_OBS_GPU_PEAK
#define RR_OBS_SERVED_PEAK RM_OBS_SERVED_PEAK
#define RR_NAGG RM_NAGG

#define RR_UNIT_BYTES RM_UNIT_BYTES
#define RR_UNIT_COUNT RM_UNIT_COUNT
#define RR_UNIT_NS RM_UNIT_NS
typedef rm_agg_field_t rr_field_t;
#define rr_fields rm_agg_fields

#define RR_HOST_FALLBACK RM_HOST_FALLBACK
#define RR_SHARED_GPU RM_SHARED_GPU
#define RR_BIND_MISMATCH RM_BIND_MISMATCH
#define RR_BIND_NONE RM_BIND_NONE

/* One rank's record: the model's (fixed-size strings, never NULL; wall_s
 * NaN when the report says null). Values a report does not carry (an
 * older schema, a CSV) are 0. */
typedef rm_record_t rr_rank_t;

/* Issue 19's job-level sections (JSON schema 2 only). */
typedef struct {
    char *site, *api, *kind;
    int ranks, first_rank;
    uint64_t bytes, count;
} rr_leak_t;

typedef struct {
    char *name;
    double t_start_s, t_end_s;
    uint64_t peak_min, peak_max;
    int peak_max_rank;
    double peak_mean;
} rr_phase_t;

/* A live call site of a failed rank (schema 3's "live_sites"). */
typedef struct {
    char *site, *api, *kind;
    uint64_t bytes, count;
} rr_site_t;

/* Where a rank's record came from when a job is assembled from per-rank
 * files (rr_load_job): its file, the document's phase ("failure" or
 * "interval") and trigger, its live sites. */
typedef struct {
    char *file, *phase, *trigger;
    rr_site_t *live;
    size_t nlive;
} rr_source_t;

/* A report, whatever it was read from. Job fields a CSV cannot carry are
 * NULL (strings), -1 (writer_pid) or 0 (world_size, schema). */
typedef struct {
    char *path;            /* as given ("-" for stdin) */
    const char *format;    /* "JSON" or "CSV" */
    int schema;            /* JSON "schema"; 0 for CSV */
    int record_version;    /* JSON "record_version"; 0 when absent */
    char *generator, *phase, *trigger, *job_id, *job_id_source, *time, *writer_host;
    long writer_pid;
    int world_size;
    size_t n;              /* ranks */
    rr_rank_t *ranks;      /* in the file's order */
    int has_timeline;      /* ranks[].timeline read from "timeline" */
    double t_end_s;        /* the timeline's axis: [0, t_end_s] */
    int has_leaks;         /* "leaks" was there (the finalize report) */
    size_t nleaks;
    rr_leak_t *leaks;
    size_t nphases;
    rr_phase_t *phases;
    /* schema 3, a rank's own document: the sites live at its failure */
    rr_site_t *live;
    size_t nlive;
    /* assembled from per-rank files (rr_load_job): src[i] is ranks[i]'s */
    int assembled;
    rr_source_t *src;
    int *missing;          /* ranks of the world with no readable record */
    size_t nmissing;
    size_t nfiles, nbad;   /* files read, files refused (a message each) */
} rr_report_t;

/* Reads a report file ("-": stdin), JSON or CSV by its content. Returns 0,
 * or -1 with a message in err ("PATH:LINE:COLUMN: what") and rep empty. */
int rr_load(const char *path, rr_report_t *rep, char *err, size_t cap);
/* The same from memory; name is used in messages. */
int rr_load_buffer(const char *name, const char *text, size_t len, rr_report_t *rep, char *err,
                   size_t cap);
void rr_report_free(rr_report_t *rep);

/* A job from per-rank files (a failed job, docs/report.md "Reading a failed
 * job"): each path a file, or a directory whose *.rank-N.json files are
 * read. Every file that cannot be read is named on errs with why, and the
 * others still make the report; ranks of the world that no file holds are
 * listed in rep->missing. Returns 0, or -1 when no record could be read
 * (or out of memory). */
int rr_load_job(const char *const *paths, size_t npaths, rr_report_t *rep, FILE *errs);

/* The newest JSON schema this tool reads. */
int rr_schema_newest(void);

/* ---- the analysis (report-analysis.c) ---- */

typedef rm_agg_t rr_agg_t;
#define RR_NODE_DEVICES RM_NODE_DEVICES
typedef rm_node_t rr_node_t;

typedef struct {
    const rr_report_t *rep;
    rr_agg_t agg[RR_NAGG];
    size_t *by_host;         /* indices, by (host, rank) */
    rr_node_t *nodes;
    size_t nnodes, per_node_max;
    size_t *by_peak;         /* indices, largest headline peak first, ties by rank */
    size_t *leaked;          /* indices with headline bytes live, largest first */
    size_t nleaked;
    int source;              /* the headline's (rm_headline_source): RM_SRC_* */
    size_t nobs;             /* ranks whose headline is observed */
    double wall_max;
    int n_fallback, n_shared, n_mismatch, n_bind_none, n_inactive;
    /* device capacity: dev_total_init over the ranks on a device (0: none) */
    uint64_t cap_min, cap_max;
    int final;               /* the phase is "finalize": live bytes are leaks */
} rr_analysis_t;

int rr_analyse(const rr_report_t *rep, rr_analysis_t *a);
void rr_analysis_free(rr_analysis_t *a);

/* Sizes for people: "2.50 MiB", "26.50 us", "3" or "2.5". */
const char *rr_fmt_bytes(char *buf, size_t cap, double v);
const char *rr_fmt_ns(char *buf, size_t cap, double ns);
const char *rr_fmt_field(char *buf, size_t cap, int field, double v, int exact);
/* The model's label (rm_agg_label): "leaked bytes", or "live bytes" when
 * the report is not the final one, ... */
const char *rr_field_label(const rr_analysis_t *a, int field);

/* ---- the text (text.c): the plugin's and the tool's ---- */

typedef struct {
    size_t top;          /* top ranks by peak */
    size_t leaked;       /* ranks that leaked, listed */
    size_t nodes;        /* nodes listed */
    int hist_bins;
    int hist_width;
    int all;             /* list everything */
    const char *title;   /* the first line; NULL: "rankmem memory report: PATH (FORMAT...)" */
} rr_text_opts_t;

/* The lengths both the plugin and rankmem-report use unless told otherwise. */
#define RR_TEXT_OPTS_DEFAULT {10, 20, 32, 10, 50, 0, NULL}

void rr_write_text(FILE *o, const rr_analysis_t *a, const rr_text_opts_t *op);
/* A string for a terminal: control bytes and non-ASCII become '?'. */
const char *rr_safe(const char *s, char *buf, size_t cap);
/* Whether any rank's record has observed (CUDA-level) figures. */
int rr_has_observed(const rr_report_t *rep);

/* ---- the picture (svg.c) ---- */

typedef struct {
    int order_by_peak;       /* 0: rank order; 1: largest peak first */
    size_t max_bars;         /* more ranks than this: binned */
    int capacity_mode;       /* RR_CAP_AUTO, RR_CAP_SHOW, RR_CAP_HIDE */
    uint64_t capacity;       /* given by --capacity (0: from the report) */
} rr_svg_opts_t;

enum { RR_CAP_AUTO, RR_CAP_SHOW, RR_CAP_HIDE };

/* Returns 0, or -1 when writing failed (errno set). */
int rr_write_svg(FILE *f, const rr_analysis_t *a, const rr_svg_opts_t *o);
int rr_write_html(FILE *f, const rr_analysis_t *a, const rr_svg_opts_t *o);

#endif
