/* The per-rank report's one model (issue 19, item 6), shared by the MPI
 * plugin that writes the report (mpi/report.c) and by rankmem-report that
 * reads it (tools/): the record, its field table (JSON keys and CSV
 * columns, so that writer and reader cannot drift apart), the aggregation
 * over ranks (min/max(rank)/mean/std/imbalance and per node) and the
 * writing of a record as JSON and CSV. docs/report.md describes the layout.
 *
 * Plain C11 on libc and libm: no MPI, no CUDA. Not installed. In the
 * plugin every symbol is hidden (-fvisibility=hidden). */
#ifndef RANKMEM_REPORT_MODEL_H
#define RANKMEM_REPORT_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* Bump when a field is added; the JSON report carries it as "record_version". */
#define RM_RECORD_VERSION 3
/* The JSON document's layout; schema 2 added "observed", "leaks",
 * "timeline" and "phases" (issue 19); schema 3 the records' "failure"
 * and the per-rank documents of a job that fails ("live_sites", issue 29);
 * schema 4 the headline (issue 29, "one story"): "leaked_ranks" and
 * "top_by_peak" follow the rank's memory as rm_headline() gives it (they
 * followed the chain's counters), records and nodes gain "memory". */
#define RM_REPORT_SCHEMA 4

/* flags */
#define RM_HOST_FALLBACK 0x1u   /* no GPU: host memory */
#define RM_SHARED_GPU 0x2u      /* more ranks than GPUs on this node */
#define RM_BIND_MISMATCH 0x4u   /* launcher's local rank != communicator's */
#define RM_BIND_NONE 0x8u       /* RANKMEM_BIND=none: the application chose */

/* Observed memory (mpi/observe/recorder.h), by kind as rk_obs_kind_t. */
enum { RM_OBS_DEVICE, RM_OBS_MANAGED, RM_OBS_PINNED, RM_OBS_VMM, RM_OBS_NKINDS };
/* As rk_obs_state_t. */
enum { RM_OBS_OFF = 0, RM_OBS_ON = 1, RM_OBS_UNAVAILABLE = 2 };

#define RM_TIMELINE_BUCKETS 64 /* per rank, over [0, the job's longest run] */
#define RM_LEAK_TOP 8          /* call sites each rank sends */
#define RM_LEAK_SITES 20       /* sites the report names */
#define RM_SITE_TEXT 256       /* a site in words, at most */
#define RM_WHY 120

typedef struct rm_counts {
    uint64_t current, peak, total, count, live, peak_ns;
} rm_counts_t;

typedef struct rm_observed {
    int32_t state;            /* RM_OBS_* */
    int32_t pad_;
    char why[RM_WHY];         /* why not on ("" when on) */
    rm_counts_t kind[RM_OBS_NKINDS]; /* the program's (program + served) by kind */
    rm_counts_t gpu;          /* the program's device + managed + vmm */
    rm_counts_t served;       /* the program's device memory that rankmem served */
    uint64_t rankmem_current, rankmem_peak; /* rankmem's own device bytes from CUDA */
    uint64_t events, unmatched_frees, untracked;
} rm_observed_t;

/* A live call site of a rank, as gathered: its identity across ranks is
 * a hash of its text (the same text on every rank whatever ASLR did). */
typedef struct rm_leak {
    uint64_t hash, bytes, count;
    int32_t api, kind;
} rm_leak_t;

/* How a rank failed (record_version 3, issue 29): the event its record
 * was written for, and the first allocation it could not get (a rank
 * may recover from that one: the finalize report still names it). */
#define RM_FAIL_WORD 24
#define RM_FAIL_DIAG 320
typedef struct rm_failure {
    char kind[16];            /* "" none, "oom", "signal", "abort", "exit" */
    char trigger[RM_FAIL_WORD]; /* "SIGTERM", "MPI_Abort", "exit", "out of memory" */
    int32_t code;             /* signal number, MPI_Abort's errorcode, exit status */
    int32_t pad_;
    uint64_t t_ns;            /* when, since MPI_Init */
    uint64_t oom_count;       /* allocations refused so far (0: none) */
    uint64_t oom_bytes, oom_stream, oom_t_ns; /* the first one refused */
    uint64_t oom_live;        /* the rank's live device bytes then */
    uint64_t pool_reserved, pool_live, pool_largest_free; /* rankmem's chain then */
    uint64_t dev_free, dev_total, dev_other; /* cudaMemGetInfo then; other processes */
    char oom_api[32];         /* "rankmem_allocate", "cudaMalloc", ... */
    char oom_source[16];      /* "rankmem" (the rank's chain) or "observed" (CUDA) */
    char oom_site[RM_SITE_TEXT]; /* the failed request's call site */
    char diagnosis[RM_FAIL_DIAG]; /* one sentence */
} rm_failure_t;

/* One rank's record: fixed-size and plain, so that one MPI_Gather of bytes
 * moves it (sizeof: docs/report.md, "Size"). */
typedef struct rm_record {
    uint32_t version;           /* RM_RECORD_VERSION; 0: a stub (no plugin on that rank) */
    uint32_t flags;             /* RM_* above */
    int32_t rank, size;         /* in MPI_COMM_WORLD */
    int32_t local_rank;         /* from the shared-memory communicator */
    int32_t local_size;
    int32_t env_local_rank;     /* from the launcher's environment, -1 if none */
    int32_t device;             /* CUDA device index, -1 on host fallback */
    int32_t node_devices;       /* visible devices on this node */
    char host[64];
    char device_name[96];
    char pci_bus_id[32];        /* "0000:3b:00.0" or "" */
    char bind_mode[32];         /* auto | none | nearest | list:... (truncated) */
    char spec[256];             /* the resource spec, as described back */
    uint64_t bytes_peak;        /* from the stats adaptor on top of the chain */
    uint64_t bytes_current;     /* still allocated at finalize (leak) */
    uint64_t bytes_total;
    uint64_t count_total, count_peak, count_current;
    uint64_t reserved_peak;     /* RANKMEM_QUERY_RESERVED_HIGH below stats; 0 if unknown */
    uint64_t dev_total_init, dev_free_init;    /* cudaMemGetInfo at init */
    uint64_t dev_total_final, dev_free_final;  /* and at finalize (or report) */
    uint64_t alloc_ns;          /* time spent in allocate/deallocate */
    uint64_t staged_bytes, staged_messages, staged_ns; /* staging (issue 6) */
    double wall_s;              /* seconds since MPI_Init (NaN: unknown) */
    /* record_version 2 (issue 19) */
    rm_observed_t obs;
    uint64_t timeline[RM_TIMELINE_BUCKETS]; /* the program's GPU bytes, max per bucket */
    int32_t nleaks, pad2_;
    rm_leak_t leaks[RM_LEAK_TOP];           /* largest live sites (not written per rank) */
    /* record_version 3 (issue 29) */
    rm_failure_t fail;
} rm_record_t;

/* ---- the field table: every value of a record, its JSON key (a dotted
 * path for nested objects: "observed.device.peak") and CSV column ---- */

typedef enum { RM_K_INT, RM_K_U32, RM_K_U64, RM_K_STR, RM_K_DOUBLE, RM_K_FLAG, RM_K_STATE,
               RM_K_NS_AS_S /* kept in ns, written in seconds */ } rm_kind_t;

typedef struct {
    const char *key;  /* JSON path and CSV column */
    rm_kind_t kind;
    size_t off;       /* into rm_record_t */
    size_t cap;       /* RM_K_STR: the array's size; RM_K_FLAG: the flag bit */
    int since;        /* record_version that added it: older reports lack it */
    int csv;          /* also a CSV column (every field is in JSON) */
} rm_field_t;

extern const rm_field_t rm_fields[];
extern const size_t rm_nfields;

/* ---- what is aggregated over ranks ---- */

enum {
    /* the headline (rm_headline below): the rank's memory, observed or served */
    RM_MEM_PEAK,
    RM_MEM_CURRENT,
    RM_MEM_TOTAL,
    RM_MEM_COUNT,
    RM_MEM_LIVE,
    RM_BYTES_PEAK,
    RM_BYTES_CURRENT,
    RM_BYTES_TOTAL,
    RM_COUNT_TOTAL,
    RM_COUNT_PEAK,
    RM_COUNT_CURRENT,
    RM_RESERVED_PEAK,
    RM_ALLOC_NS,
    RM_STAGED_BYTES,
    RM_STAGED_MESSAGES,
    RM_OBS_GPU_PEAK,     /* observed: the program's GPU peak */
    RM_OBS_SERVED_PEAK,  /* observed: served by rankmem, peak */
    RM_NAGG
};

typedef enum { RM_UNIT_BYTES, RM_UNIT_COUNT, RM_UNIT_NS } rm_unit_t;

typedef struct {
    const char *key;   /* "aggregates" key in JSON */
    const char *label; /* for people */
    rm_unit_t unit;
    size_t off;        /* of a uint64_t in rm_record_t */
    int mem;           /* 1 + which headline value (RM_MEM_*), computed; 0: read at off */
} rm_agg_field_t;

extern const rm_agg_field_t rm_agg_fields[RM_NAGG];

/* ---- the headline: one story (issue 29) ----
 *
 * Everywhere the report names a rank's memory it names this: the
 * program's device memory as CUDA saw it (observed.gpu) when observation
 * was on for that rank, else what rankmem's chain served (bytes_*).
 * Served bytes and rankmem's own stay beside it as columns. The plugin
 * and rankmem-report both ask here, so their stories cannot diverge. */
enum { RM_SRC_SERVED = 0, RM_SRC_OBSERVED = 1, RM_SRC_MIXED = 2 };

typedef struct {
    int source;        /* RM_SRC_OBSERVED or RM_SRC_SERVED */
    uint64_t peak;     /* most bytes live at once */
    uint64_t current;  /* live at the report: at finalize, leaked */
    uint64_t total;    /* bytes of every allocation */
    uint64_t count;    /* allocations ever */
    uint64_t live;     /* allocations live at the report */
} rm_headline_t;

/* Whether a record's headline is its observed memory: observation on. */
int rm_headline_observed(const rm_record_t *r);
void rm_headline(const rm_record_t *r, rm_headline_t *h);
uint64_t rm_headline_value(const rm_record_t *r, int f); /* f: RM_MEM_* */
/* The job's: RM_SRC_OBSERVED when every active rank is observed,
 * RM_SRC_SERVED when none is, else RM_SRC_MIXED; *nobs_p (may be NULL):
 * the ranks observed. */
int rm_headline_source(const rm_record_t *rec, size_t n, size_t *nobs_p);
/* For a table's header: "device memory as the program saw it (observed)",
 * "memory rankmem served", or for a mixed job both, saying where. */
const char *rm_headline_label(int source);
/* "observed", "served" (the records' and CSV's "memory.source"), "mixed". */
const char *rm_source_name(int source);
/* An aggregate's label in a job whose headline comes from source, final:
 * the finalize report (live bytes are leaks then). */
const char *rm_agg_label(int f, int source, int final);
/* Whether the text shows aggregate f: where nothing is observed the
 * chain's bytes are the headline, and the same row twice says nothing. */
int rm_agg_shown(int f, int source);

static inline uint64_t rm_value(const rm_record_t *r, int f)
{
    if (rm_agg_fields[f].mem)
        return rm_headline_value(r, rm_agg_fields[f].mem - 1);
    return *(const uint64_t *)(const void *)((const char *)r + rm_agg_fields[f].off);
}

typedef struct {
    uint64_t min, max;
    int min_rank, max_rank;  /* lowest rank on ties; -1 with no ranks */
    uint64_t sum_lo;         /* wraps only past 2^64 */
    long double sum;
    double mean, std;        /* std: population (all ranks are there) */
    double imbalance;        /* max / mean; NaN when the mean is 0 */
} rm_agg_t;

void rm_aggregate(const rm_record_t *rec, size_t n, int f, rm_agg_t *g);
/* The same over any values: v[i] of rank ranks[i]. */
void rm_aggregate_values(const uint64_t *v, const int *ranks, size_t n, rm_agg_t *g);

#define RM_NODE_DEVICES 16
typedef struct {
    const char *host;
    size_t first, count;     /* into the by-host order */
    int devices[RM_NODE_DEVICES], ndevices, more_devices;
    int node_devices;
    int host_fallback, shared;
    uint64_t peak_sum, peak_max, leaked_sum, reserved_sum, total_sum;
    uint64_t obs_peak_sum, obs_peak_max; /* observed GPU peak of the program */
    int peak_max_rank, obs_peak_max_rank;
    /* the headline's (rm_headline): peak sum and max (its rank), leaked, total */
    uint64_t mem_peak_sum, mem_peak_max, mem_leaked_sum, mem_total_sum;
    int mem_peak_max_rank;
    uint64_t dev_total, dev_free_init_min, dev_free_final_min; /* with devices only */
} rm_node_t;

/* by_host (n entries): indices sorted by (host, rank); nodes (n entries
 * room): one per host. Returns the number of nodes. Not thread-safe
 * (qsort has no context in C11): one analysis at a time. */
size_t rm_nodes(const rm_record_t *rec, size_t n, size_t *by_host, rm_node_t *nodes);

/* ---- writing: a growable string ---- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
    int fixed; /* p is the caller's, cap bytes: never grown (signal context) */
} rm_buf_t;

/* A buffer over the caller's memory: the writers below then neither
 * allocate nor call stdio, and are async-signal-safe (a record written
 * from a signal handler, mpi/failure.c). Past cap, oom is set. */
void rm_buf_fixed(rm_buf_t *b, char *mem, size_t cap);
void rm_puts(rm_buf_t *b, const char *s);
void rm_put_u64(rm_buf_t *b, uint64_t v);
void rm_put_i64(rm_buf_t *b, int64_t v);

void rm_printf(rm_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void rm_putc(rm_buf_t *b, char c);
void rm_json_str(rm_buf_t *b, const char *s);
void rm_csv_str(rm_buf_t *b, const char *s);
void rm_json_num(rm_buf_t *b, double v);

/* One record as a JSON object (every field of the table). */
void rm_json_record(rm_buf_t *b, const rm_record_t *r);
/* The CSV header line and a record's row (the table's csv fields). */
void rm_csv_header(rm_buf_t *b);
void rm_csv_row(rm_buf_t *b, const rm_record_t *r);

/* A UTC time as "YYYY-mm-ddTHH:MM:SS+0000", from integers only
 * (async-signal-safe; cap >= 25). */
void rm_utc_text(int64_t epoch_s, char *out, size_t cap);

/* "on", "off", "unavailable"; -1 for another word. */
const char *rm_state_name(int state);
int rm_state_parse(const char *s);

/* FNV-1a 64 of a site's text: its identity across ranks. */
uint64_t rm_site_hash(const char *text);

/* Resamples samples (t_ns ascending, each the most bytes from its time to
 * the next sample's) to RM_TIMELINE_BUCKETS buckets over [0, t_end_ns]:
 * a bucket holds the max of the samples within it and of the sample
 * running into it; an empty bucket, the last sample's value. Samples past
 * t_end_ns count in the last bucket. */
void rm_timeline_resample(const uint64_t *t_ns, const uint64_t *bytes, size_t n,
                          uint64_t t_end_ns, uint64_t out[RM_TIMELINE_BUCKETS]);

#endif
