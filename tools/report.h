/* rankmem-report's parts (not installed): the report in memory, its
 * readers (report-read.c), the analysis over ranks (report-analysis.c),
 * the picture (report-svg.c). The layout of the files read is in
 * docs/report.md; the tool is described in docs/report-tool.md. */
#ifndef RANKMEM_TOOLS_REPORT_H
#define RANKMEM_TOOLS_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The fields aggregated over ranks, in the plugin's order (mpi/report.c). */
enum {
    RR_BYTES_PEAK,
    RR_BYTES_CURRENT,
    RR_BYTES_TOTAL,
    RR_COUNT_TOTAL,
    RR_COUNT_PEAK,
    RR_COUNT_CURRENT,
    RR_RESERVED_PEAK,
    RR_ALLOC_NS,
    RR_STAGED_BYTES,
    RR_STAGED_MESSAGES,
    RR_NAGG
};

typedef enum { RR_UNIT_BYTES, RR_UNIT_COUNT, RR_UNIT_NS } rr_unit_t;

typedef struct {
    const char *key;   /* JSON key and CSV column */
    const char *label; /* for people */
    rr_unit_t unit;
} rr_field_t;

extern const rr_field_t rr_fields[RR_NAGG];

/* flags of a record (mpi/mpi_internal.h) */
#define RR_HOST_FALLBACK 0x1u
#define RR_SHARED_GPU 0x2u
#define RR_BIND_MISMATCH 0x4u
#define RR_BIND_NONE 0x8u

/* One rank's record. Strings are never NULL. */
typedef struct {
    int rank, size, local_rank, local_size, env_local_rank, device, node_devices;
    char *host, *device_name, *pci_bus_id, *bind_mode, *spec;
    unsigned flags, version;
    uint64_t v[RR_NAGG];
    uint64_t dev_total_init, dev_free_init, dev_total_final, dev_free_final, staged_ns;
    double wall_s; /* NaN when the report says null */
} rr_rank_t;

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
} rr_report_t;

/* Reads a report file ("-": stdin), JSON or CSV by its content. Returns 0,
 * or -1 with a message in err ("PATH:LINE:COLUMN: what") and rep empty. */
int rr_load(const char *path, rr_report_t *rep, char *err, size_t cap);
/* The same from memory; name is used in messages. */
int rr_load_buffer(const char *name, const char *text, size_t len, rr_report_t *rep, char *err,
                   size_t cap);
void rr_report_free(rr_report_t *rep);

/* The newest JSON schema this tool reads. */
int rr_schema_newest(void);

/* ---- the analysis (report-analysis.c) ---- */

typedef struct {
    uint64_t min, max;
    int min_rank, max_rank;  /* lowest rank on ties; -1 with no ranks */
    long double sum;         /* exact far past 2^64 bytes in all */
    double mean, std;        /* std: population (all ranks are there) */
    double imbalance;        /* max / mean; NaN when the mean is 0 */
} rr_agg_t;

#define RR_NODE_DEVICES 16
typedef struct {
    const char *host;
    size_t first, count;     /* into rr_analysis_t.by_host */
    int devices[RR_NODE_DEVICES], ndevices, more_devices;
    int host_fallback, shared;
    uint64_t peak_sum, peak_max, leaked_sum, reserved_sum;
    int peak_max_rank;
    uint64_t dev_total, dev_free_init_min, dev_free_final_min; /* with devices only */
} rr_node_t;

typedef struct {
    const rr_report_t *rep;
    rr_agg_t agg[RR_NAGG];
    size_t *by_host;         /* indices, by (host, rank) */
    rr_node_t *nodes;
    size_t nnodes, per_node_max;
    size_t *by_peak;         /* indices, largest peak first, ties by rank */
    size_t *leaked;          /* indices with bytes_current > 0, largest first */
    size_t nleaked;
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
/* "leaked bytes", or "live bytes" when the report is not the final one */
const char *rr_field_label(const rr_analysis_t *a, int field);

/* ---- the picture (report-svg.c) ---- */

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
