/* rankmem MPI plugin: the per-rank memory report.
 *
 * Every rank fills one fixed-size record (init.c: rk_mpi_fill_record); one
 * MPI_Gather of bytes brings them to rank 0 of the communicator, which
 * writes a text report, a JSON document and a CSV table (docs/report.md).
 * Nothing but rank 0 holds more than its own record, and nothing is P^2:
 * rank 0 keeps the P records and a few index arrays of P entries.
 *
 * Only rank 0's RANKMEM_REPORT / RANKMEM_REPORT_FORMAT (or path argument)
 * count; rank 0 decides whether there is a report at all and tells the
 * others with a one-int broadcast before the gather, so the ranks always
 * agree on whether the gather happens. A failed write is a
 * warning on stderr (and the text report goes to stderr instead), never an
 * error of the collective. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#ifdef HAVE_CONFIG_H
#include <config.h>
#endif

#include "mpi_internal.h"
#include "recorder.h"
#include "report.h" /* report/: the reader and the text renderer */

#include <rankmem_mpi.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

/* The JSON document's own version (its layout), apart from the record's. */
#define RK_REPORT_SCHEMA RM_REPORT_SCHEMA

#define RK_TEXT_TOP 10       /* the JSON's top_by_peak */
#define RK_DISTINCT 16       /* distinct specs / bind modes kept */

#define RK_EXPORT __attribute__((visibility("default")))

/* "rankmem-mpi[rank N]: " and the message on stderr, as init.c says
 * things; N is MPI_COMM_WORLD's rank (a report over another communicator
 * is written by its own rank 0). */
static void vsay(const char *what, const char *fmt, va_list ap)
{
    char line[3 * PATH_MAX + 256];
    vsnprintf(line, sizeof line, fmt, ap);
    int init = 0, fin = 0, rank = -1;
    if (MPI_Initialized(&init) == MPI_SUCCESS && init && MPI_Finalized(&fin) == MPI_SUCCESS &&
        !fin)
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    /* One write: lines from several processes do not interleave mid-line. */
    fprintf(stderr, "rankmem-mpi[rank %d]: %s%s\n", rank, what, line);
    fflush(stderr);
}

/* A problem with the report's settings or files: "report: ..." */
static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay("report: ", fmt, ap);
    va_end(ap);
}

/* Where the report went. */
static void notice(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void notice(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsay("", fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------
 * The documents are built in memory (the model's growable string), then
 * written to a stream or to files the same way. */

typedef rm_buf_t sbuf_t;
#define sb_printf rm_printf
#define sb_putc rm_putc
#define sb_json_str rm_json_str
#define sb_json_num rm_json_num

/* ------------------------------------------------------------------------
 * What is summed up over the ranks: the model's table and aggregation
 * (report/model.c), the same that rankmem-report computes. */

#define NFIELDS ((size_t)RM_NAGG)
#define fields rm_agg_fields
typedef rm_agg_t agg_t;


/* ------------------------------------------------------------------------
 * The settings (rank 0 only). */

enum dest { DEST_OFF, DEST_STDOUT, DEST_STDERR, DEST_FILES };
enum { FMT_TEXT = 1, FMT_JSON = 2, FMT_CSV = 4, FMT_TIMELINE = 8 };
#define NDOCS 4 /* text, JSON, CSV, and the timeline's CSV ("timeline") */
static const char *const fmt_names[] = {"text", "json", "csv", "timeline"};
static const char *const fmt_exts[] = {".txt", ".json", ".csv", "-timeline.csv"};

typedef struct {
    enum dest dest;
    unsigned formats;
    const char *tmpl; /* DEST_FILES */
    const char *origin; /* "RANKMEM_REPORT" or "rankmem_mpi_report()" */
} settings_t;

#define RK_DEFAULT_REPORT "stderr"
#define RK_DEFAULT_FORMAT "text"

static const char *option(const char *name, int *set_p)
{
    /* The library's option table reads the environment once, so every use
     * in the run sees the same value; getenv is the fallback should the
     * table not know the name. */
    size_t n = 0;
    *set_p = 0;
    if (rankmem_option_count(&n) == RANKMEM_SUCCESS) {
        for (size_t i = 0; i < n; i++) {
            rankmem_option_info_t o;
            if (rankmem_option_info(i, &o) == RANKMEM_SUCCESS && o.name &&
                strcmp(o.name, name) == 0) {
                *set_p = o.from_environment;
                return o.from_environment ? o.value : NULL;
            }
        }
    }
    const char *v = getenv(name);
    *set_p = v != NULL;
    return v;
}

/* Each kind of bad value is warned about once per process, not at every
 * mid-run report. */
static atomic_int warned_format, warned_template;

static unsigned parse_formats(const char *s)
{
    unsigned f = 0;
    const char *p = s, *bad = NULL;
    size_t bad_len = 0;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        if (!*p)
            break;
        const char *w = p;
        while (*p && *p != ',')
            p++;
        const char *e = p;
        while (e > w && (e[-1] == ' ' || e[-1] == '\t'))
            e--;
        size_t len = (size_t)(e - w);
        int known = 0;
        for (int k = 0; k < NDOCS; k++) {
            if (strlen(fmt_names[k]) == len && strncasecmp(w, fmt_names[k], len) == 0) {
                f |= 1u << k;
                known = 1;
            }
        }
        if (!known && !bad) {
            bad = w;
            bad_len = len > 64 ? 64 : len;
        }
    }
    if (!f) {
        if (!atomic_exchange(&warned_format, 1))
            warn("RANKMEM_REPORT_FORMAT: no known format in '%.64s' (known: text, json, csv, timeline); "
                 "writing text", s);
        f = FMT_TEXT;
    } else if (bad && !atomic_exchange(&warned_format, 1)) {
        warn("RANKMEM_REPORT_FORMAT: unknown format '%.*s' ignored (known: text, json, csv, timeline)",
             (int)bad_len, bad);
    }
    return f;
}

/* Index of the known extension s ends with, or -1. */
static int known_ext(const char *s)
{
    size_t n = strlen(s);
    for (int k = 0; k < 3; k++) {
        size_t e = strlen(fmt_exts[k]);
        if (n > e && strcmp(s + n - e, fmt_exts[k]) == 0 && s[n - e - 1] != '/')
            return k;
    }
    return -1;
}

static void read_settings(const char *path, settings_t *s)
{
    int set_r, set_f;
    const char *r = path;
    s->origin = path ? "rankmem_mpi_report()" : "RANKMEM_REPORT";
    if (!r) {
        r = option("RANKMEM_REPORT", &set_r);
        if (!set_r)
            r = RK_DEFAULT_REPORT;
    }
    const char *f = option("RANKMEM_REPORT_FORMAT", &set_f);
    if (!set_f || !*f) {
        set_f = 0;
        f = RK_DEFAULT_FORMAT;
    }
    s->formats = parse_formats(f);
    s->tmpl = NULL;
    if (!*r || strcmp(r, "off") == 0)
        s->dest = DEST_OFF;
    else if (strcmp(r, "stdout") == 0)
        s->dest = DEST_STDOUT;
    else if (strcmp(r, "stderr") == 0)
        s->dest = DEST_STDERR;
    else {
        s->dest = DEST_FILES;
        s->tmpl = r;
        /* "report.json" with no RANKMEM_REPORT_FORMAT: the extension says it. */
        int k = known_ext(r);
        if (k >= 0 && !set_f)
            s->formats = 1u << k;
    }
}

/* ------------------------------------------------------------------------
 * Path templates. */

static const char *const jobid_vars[] = {"SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID",
                                         "COBALT_JOBID"};

static const char *job_id(const char **source_p)
{
    for (size_t i = 0; i < sizeof jobid_vars / sizeof jobid_vars[0]; i++) {
        const char *v = getenv(jobid_vars[i]);
        if (v && *v) {
            *source_p = jobid_vars[i];
            return v;
        }
    }
    *source_p = NULL;
    return "nojob";
}

/* Text fit for a file name: [A-Za-z0-9._-], anything else '_'. */
static void sanitize(char *dst, size_t cap, const char *src)
{
    size_t o = 0;
    for (; *src && o + 1 < cap; src++) {
        char c = *src;
        int good = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '.' || c == '_' || c == '-';
        dst[o++] = good ? c : '_';
    }
    dst[o] = '\0';
}

/* Expands tmpl into out; 0 on success, else -1 with *why_p. */
static int expand(const char *tmpl, int nranks, const char *stamp, char *out, size_t cap,
                  const char **why_p, char *bad_p)
{
    size_t o = 0;
    char tmp[256];
    const char *src;
    for (const char *p = tmpl; *p; p++) {
        if (*p != '%') {
            if (o + 1 >= cap)
                goto too_long;
            out[o++] = *p;
            continue;
        }
        p++;
        switch (*p) {
        case 'j':
            sanitize(tmp, sizeof tmp, job_id(&src));
            break;
        case 'p':
            snprintf(tmp, sizeof tmp, "%ld", (long)getpid());
            break;
        case 't':
            snprintf(tmp, sizeof tmp, "%s", stamp);
            break;
        case 'n':
            snprintf(tmp, sizeof tmp, "%d", nranks);
            break;
        case '%':
            snprintf(tmp, sizeof tmp, "%%");
            break;
        case '\0':
            *why_p = "a lone '%' at the end";
            *bad_p = '%';
            return -1;
        default:
            *why_p = "unknown escape";
            *bad_p = *p;
            return -1;
        }
        size_t n = strlen(tmp);
        if (o + n >= cap)
            goto too_long;
        memcpy(out + o, tmp, n);
        o += n;
    }
    out[o] = '\0';
    if (o == 0) {
        *why_p = "empty path";
        *bad_p = 0;
        return -1;
    }
    return 0;
too_long:
    *why_p = "path too long";
    *bad_p = 0;
    return -1;
}

/* ------------------------------------------------------------------------
 * Files: written under a temporary name in the same directory, then linked
 * to the final name, which fails if that name exists: no file is ever
 * overwritten, even by a concurrent writer. */

static void dir_of(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

/* Writes data to a new temporary file next to final; its name in tmp. */
static int write_temp(const char *final, const char *data, size_t len, char *tmp, size_t cap)
{
    char dir[PATH_MAX];
    dir_of(final, dir, sizeof dir);
    const char *base = strrchr(final, '/');
    base = base ? base + 1 : final;
    if ((size_t)snprintf(tmp, cap, "%s/.%s.XXXXXX", dir, base) >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = mkstemp(tmp);
    if (fd < 0)
        return -1;
    /* mkstemp makes it 0600; a report is as readable as any file the job writes. */
    mode_t um = umask(0);
    umask(um);
    (void)fchmod(fd, 0666 & ~um);
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = w < 0 ? errno : EIO;
            close(fd);
            unlink(tmp);
            errno = e;
            return -1;
        }
        off += (size_t)w;
    }
    if (close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

/* Gives tmp the name final unless final exists: 0 done, 1 exists, -1 error. */
static int publish(const char *tmp, const char *final)
{
    if (link(tmp, final) == 0) {
        unlink(tmp);
        return 0;
    }
    if (errno == EEXIST)
        return 1;
    /* File systems without hard links: reserve the name with O_EXCL, then
     * rename over our own placeholder. */
    if (errno == EPERM || errno == ENOTSUP || errno == EOPNOTSUPP || errno == ENOSYS ||
        errno == EMLINK) {
        int fd = open(final, O_WRONLY | O_CREAT | O_EXCL, 0666);
        if (fd < 0)
            return errno == EEXIST ? 1 : -1;
        close(fd);
        if (rename(tmp, final) == 0)
            return 0;
        int e = errno;
        unlink(final);
        errno = e;
    }
    return -1;
}

static int exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* base + (n ? ".n" : "") + ext */
static int name_of(char *out, size_t cap, const char *base, unsigned n, const char *ext)
{
    int w = n ? snprintf(out, cap, "%s.%u%s", base, n, ext) : snprintf(out, cap, "%s%s", base, ext);
    return w >= 0 && (size_t)w < cap ? 0 : -1;
}

#define RK_MAX_SUFFIX 9999

/* ------------------------------------------------------------------------
 * The analysis: what rank 0 computes once from the gathered records. */

typedef rm_node_t node_t; /* the model's per-node aggregation */

typedef struct {
    const char *s;
    int count;
} distinct_t;

/* What the report says over ranks beyond the records: the phases (one
 * set of reductions), the leaks by call site (finalize only) and the
 * timeline's axis. Rank 0 only. */
typedef struct {
    char name[RK_OBS_PHASE_NAME];
    double t_start_s, t_end_s;     /* earliest start, latest end over ranks */
    uint64_t peak_min, peak_max;
    int peak_max_rank, ranks;      /* ranks that had the phase */
    double peak_mean;
} phase_agg_t;

typedef struct {
    uint64_t hash, bytes, count;
    int api, kind, ranks, first_rank;
    char text[RM_SITE_TEXT];
} site_agg_t;

typedef struct {
    uint64_t t_end_ns;             /* the timeline's axis: [0, t_end_ns] */
    int nphases;
    phase_agg_t phases[RK_OBS_MAX_PHASES];
    int leaks;                     /* 1: the finalize report, sites below */
    int nsites;
    site_agg_t sites[RM_LEAK_SITES];
    uint64_t sites_bytes, sites_ranks_any; /* over every site named by a rank */
} extras_t;

typedef struct {
    const rk_mpi_record_t *rec;
    const extras_t *x;
    int n;                 /* ranks in the report */
    const char *phase;     /* "finalize", "phase1", ... */
    const char *trigger;   /* what asked for it */
    agg_t agg[NFIELDS];
    size_t *by_host;       /* indices sorted by (host, rank) */
    node_t *nodes;
    int nnodes;
    int *top;              /* the RK_TEXT_TOP largest peaks */
    int ntop;
    int *leaked;           /* indices with headline bytes live, largest first */
    int nleaked;
    int source;            /* the headline's: RM_SRC_* (rm_headline_source) */
    size_t nobs;           /* ranks whose headline is observed */
    distinct_t specs[RK_DISTINCT], binds[RK_DISTINCT];
    int nspecs, nbinds, more_specs, more_binds;
    int n_fallback, n_shared, n_mismatch, n_bind_none, n_inactive;
    double wall_max;
    const char *jobid, *jobid_src;
    char stamp[32];        /* YYYYmmdd-HHMMSS */
    char when[32];         /* YYYY-mm-ddTHH:MM:SS+zone */
    long pid;
    char host[64];
} analysis_t;

/* The qsort comparators read the records through sort_rec; report_lock
 * keeps two threads' reports (MPI_THREAD_MULTIPLE) from sharing it. */
static pthread_mutex_t report_lock = PTHREAD_MUTEX_INITIALIZER;
static const rk_mpi_record_t *sort_rec;

static int cmp_leak(const void *a, const void *b)
{
    const rk_mpi_record_t *x = &sort_rec[*(const int *)a], *y = &sort_rec[*(const int *)b];
    uint64_t p = rm_value(x, RM_MEM_CURRENT), q = rm_value(y, RM_MEM_CURRENT);
    if (p != q)
        return p < q ? 1 : -1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Does record i come before record j by peak (largest first, then rank)? */
static int peak_before(const rk_mpi_record_t *rec, int f, int i, int j)
{
    uint64_t x = rm_value(&rec[i], f), y = rm_value(&rec[j], f);
    if (x != y)
        return x > y;
    return rec[i].rank < rec[j].rank;
}

/* The RK_TEXT_TOP largest values of field f: a short insertion list,
 * O(P * RK_TEXT_TOP). */
static int top_by(const rk_mpi_record_t *rec, int n, int f, int *top)
{
    int ntop = 0;
    for (int i = 0; i < n; i++) {
        int pos = ntop;
        while (pos > 0 && peak_before(rec, f, i, top[pos - 1]))
            pos--;
        if (pos >= RK_TEXT_TOP)
            continue;
        int last = ntop < RK_TEXT_TOP ? ntop : RK_TEXT_TOP - 1;
        for (int j = last; j > pos; j--)
            top[j] = top[j - 1];
        top[pos] = i;
        if (ntop < RK_TEXT_TOP)
            ntop++;
    }
    return ntop;
}

static void note_distinct(distinct_t *d, int *n, int *more, const char *s)
{
    for (int i = 0; i < *n; i++)
        if (strcmp(d[i].s, s) == 0) {
            d[i].count++;
            return;
        }
    if (*n < RK_DISTINCT) {
        d[*n].s = s;
        d[*n].count = 1;
        (*n)++;
    } else {
        (*more)++;
    }
}

static int analyse(analysis_t *a)
{
    const rk_mpi_record_t *rec = a->rec;
    int n = a->n;
    for (size_t f = 0; f < NFIELDS; f++)
        rm_aggregate(rec, (size_t)n, (int)f, &a->agg[f]);

    a->by_host = malloc(sizeof(size_t) * (size_t)(n ? n : 1));
    a->nodes = malloc(sizeof(node_t) * (size_t)(n ? n : 1));
    a->leaked = malloc(sizeof(int) * (size_t)(n ? n : 1));
    a->top = malloc(sizeof(int) * RK_TEXT_TOP);
    if (!a->by_host || !a->nodes || !a->leaked || !a->top)
        return -1;
    sort_rec = rec; /* rank 0 only, one report at a time (see report_lock) */
    a->nnodes = (int)rm_nodes(rec, (size_t)n, a->by_host, a->nodes);

    /* One story: the headline (observed, or served) orders and lists. */
    a->source = rm_headline_source(rec, (size_t)n, &a->nobs);
    a->ntop = top_by(rec, n, RM_MEM_PEAK, a->top);

    a->nleaked = 0;
    for (int i = 0; i < n; i++)
        if (rm_value(&rec[i], RM_MEM_CURRENT) > 0)
            a->leaked[a->nleaked++] = i;
    qsort(a->leaked, (size_t)a->nleaked, sizeof(int), cmp_leak);

    a->nspecs = a->nbinds = a->more_specs = a->more_binds = 0;
    a->n_fallback = a->n_shared = a->n_mismatch = a->n_bind_none = a->n_inactive = 0;
    a->wall_max = 0.0;
    for (int i = 0; i < n; i++) {
        note_distinct(a->specs, &a->nspecs, &a->more_specs, rec[i].spec);
        note_distinct(a->binds, &a->nbinds, &a->more_binds, rec[i].bind_mode);
        a->n_fallback += (rec[i].flags & RK_MPI_HOST_FALLBACK) != 0;
        a->n_shared += (rec[i].flags & RK_MPI_SHARED_GPU) != 0;
        a->n_mismatch += (rec[i].flags & RK_MPI_BIND_MISMATCH) != 0;
        a->n_bind_none += (rec[i].flags & RK_MPI_BIND_NONE) != 0;
        a->n_inactive += rec[i].version == 0; /* a stub: no plugin on that rank */
        if (rec[i].wall_s > a->wall_max)
            a->wall_max = rec[i].wall_s;
    }

    a->jobid = job_id(&a->jobid_src);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(a->stamp, sizeof a->stamp, "%Y%m%d-%H%M%S", &tm);
    strftime(a->when, sizeof a->when, "%Y-%m-%dT%H:%M:%S%z", &tm);
    a->pid = (long)getpid();
    if (gethostname(a->host, sizeof a->host) != 0)
        snprintf(a->host, sizeof a->host, "?");
    a->host[sizeof a->host - 1] = '\0';
    return 0;
}

static void analysis_free(analysis_t *a)
{
    free(a->by_host);
    free(a->nodes);
    free(a->leaked);
    free(a->top);
}

/* The text is rankmem-report's (report/text.c) over the JSON document j of
 * this report, read back by the tool's reader: one renderer, so that the
 * plugin's text and the tool's are the same tables. */
static void text_report(sbuf_t *b, const analysis_t *a, const sbuf_t *j)
{
    char title[128], err[256] = "";
    snprintf(title, sizeof title, "==== rankmem memory report (%s) ====", a->phase);
    rr_report_t rep;
    rr_analysis_t ra;
    memset(&rep, 0, sizeof rep);
    memset(&ra, 0, sizeof ra);
    int loaded = 0, analysed = 0;
    char *mem = NULL;
    size_t len = 0;
    FILE *f = NULL;
    if (j->oom || !j->p)
        snprintf(err, sizeof err, "out of memory");
    else if (rr_load_buffer("report", j->p, j->len, &rep, err, sizeof err) == 0) {
        loaded = 1;
        if (rr_analyse(&rep, &ra) != 0)
            snprintf(err, sizeof err, "out of memory");
        else {
            analysed = 1;
            if ((f = open_memstream(&mem, &len)) == NULL)
                snprintf(err, sizeof err, "open_memstream: %s", strerror(errno));
        }
    }
    if (f) {
        rr_text_opts_t op = RR_TEXT_OPTS_DEFAULT;
        op.title = title;
        rr_write_text(f, &ra, &op);
        if (fclose(f) == 0 && mem)
            rm_puts(b, mem);
        else
            snprintf(err, sizeof err, "writing the text failed");
    }
    if (err[0]) /* the JSON and CSV are unaffected */
        sb_printf(b, "%s\n\nno text report: %s\n", title, err);
    free(mem);
    if (analysed)
        rr_analysis_free(&ra);
    if (loaded)
        rr_report_free(&rep);
}

/* ------------------------------------------------------------------------
 * JSON: every number exact, every rank's record. */

/* A record: the model's codec, driven by its field table (the same table
 * rankmem-report reads with). */
static void json_record(sbuf_t *b, const rk_mpi_record_t *r)
{
    rm_json_record(b, r);
}

/* Issue 19's job-level sections: leaks by call site (finalize only), the
 * timeline (every rank's B buckets, in rank order), the phases. */
static void json_observed(sbuf_t *b, const analysis_t *a)
{
    const extras_t *x = a->x;
    if (!x)
        return;
    if (x->leaks) {
        sb_printf(b, "  \"leaks\": [");
        for (int i = 0; i < x->nsites; i++) {
            const site_agg_t *st = &x->sites[i];
            sb_printf(b, "%s\n    {\"site\": ", i ? "," : "");
            sb_json_str(b, st->text);
            sb_printf(b, ", \"api\": ");
            sb_json_str(b, rk_obs_api_name(st->api));
            sb_printf(b, ", \"kind\": ");
            sb_json_str(b, rk_obs_kind_name(st->kind));
            sb_printf(b, ", \"ranks\": %d, \"bytes\": %llu, \"count\": %llu, \"first_rank\": %d}",
                      st->ranks, (unsigned long long)st->bytes, (unsigned long long)st->count,
                      st->first_rank);
        }
        sb_printf(b, "%s],\n", x->nsites ? "\n  " : "");
    }
    sb_printf(b, "  \"timeline\": {\"t_end_s\": ");
    sb_json_num(b, (double)x->t_end_ns / 1e9);
    sb_printf(b, ", \"buckets\": %d, \"bytes\": [", RM_TIMELINE_BUCKETS);
    for (int i = 0; i < a->n; i++) {
        sb_printf(b, "%s\n    [", i ? "," : "");
        for (int k = 0; k < RM_TIMELINE_BUCKETS; k++)
            sb_printf(b, "%s%llu", k ? ", " : "", (unsigned long long)a->rec[i].timeline[k]);
        sb_putc(b, ']');
    }
    sb_printf(b, "%s]},\n", a->n ? "\n  " : "");
    sb_printf(b, "  \"phases\": [");
    for (int i = 0; i < x->nphases; i++) {
        const phase_agg_t *p = &x->phases[i];
        sb_printf(b, "%s\n    {\"name\": ", i ? "," : "");
        sb_json_str(b, p->name);
        sb_printf(b, ", \"t_start_s\": ");
        sb_json_num(b, p->t_start_s);
        sb_printf(b, ", \"t_end_s\": ");
        sb_json_num(b, p->t_end_s);
        sb_printf(b, ", \"peak_min\": %llu, \"peak_max\": %llu, \"peak_max_rank\": %d, "
                     "\"peak_mean\": ", (unsigned long long)p->peak_min,
                  (unsigned long long)p->peak_max, p->peak_max_rank);
        sb_json_num(b, p->peak_mean);
        sb_printf(b, ", \"ranks\": %d}", p->ranks);
    }
    sb_printf(b, "%s],\n", x->nphases ? "\n  " : "");
}

/* The timeline as CSV (<report>-timeline.csv): rank,bucket,t_s,bytes,
 * t_s the bucket's start. */
static void csv_timeline(sbuf_t *b, const analysis_t *a)
{
    double dt = a->x ? (double)a->x->t_end_ns / 1e9 / RM_TIMELINE_BUCKETS : 0.0;
    sb_printf(b, "rank,bucket,t_s,bytes\n");
    for (int i = 0; i < a->n; i++)
        for (int k = 0; k < RM_TIMELINE_BUCKETS; k++)
            sb_printf(b, "%d,%d,%.6f,%llu\n", a->rec[i].rank, k, dt * k,
                      (unsigned long long)a->rec[i].timeline[k]);
}

static void json_report(sbuf_t *b, const analysis_t *a)
{
    const rk_mpi_record_t *rec = a->rec;
    sb_printf(b, "{\n  \"schema\": %d,\n  \"record_version\": %d,\n  \"generator\": \"rankmem %s\",\n",
              RK_REPORT_SCHEMA, RK_MPI_RECORD_VERSION, PACKAGE_VERSION);
    sb_printf(b, "  \"phase\": ");
    sb_json_str(b, a->phase);
    sb_printf(b, ",\n  \"trigger\": ");
    sb_json_str(b, a->trigger);
    sb_printf(b, ",\n  \"job\": {\"id\": ");
    sb_json_str(b, a->jobid);
    sb_printf(b, ", \"id_source\": ");
    if (a->jobid_src)
        sb_json_str(b, a->jobid_src);
    else
        sb_printf(b, "null");
    sb_printf(b, ", \"ranks\": %d, \"world_size\": %d, \"nodes\": %d, \"wall_s\": ", a->n,
              a->n ? rec[0].size : 0, a->nnodes);
    sb_json_num(b, a->wall_max);
    sb_printf(b, ", \"time\": ");
    sb_json_str(b, a->when);
    sb_printf(b, ", \"writer_pid\": %ld, \"writer_host\": ", a->pid);
    sb_json_str(b, a->host);
    sb_printf(b, ",\n          \"specs\": [");
    for (int i = 0; i < a->nspecs; i++) {
        sb_printf(b, "%s{\"spec\": ", i ? ", " : "");
        sb_json_str(b, a->specs[i].s);
        sb_printf(b, ", \"ranks\": %d}", a->specs[i].count);
    }
    sb_printf(b, "], \"other_spec_ranks\": %d,\n          \"bind_modes\": [", a->more_specs);
    for (int i = 0; i < a->nbinds; i++) {
        sb_printf(b, "%s{\"mode\": ", i ? ", " : "");
        sb_json_str(b, a->binds[i].s);
        sb_printf(b, ", \"ranks\": %d}", a->binds[i].count);
    }
    sb_printf(b, "], \"other_bind_ranks\": %d,\n", a->more_binds);
    sb_printf(b, "          \"flags\": {\"host_fallback_ranks\": %d, \"shared_gpu_ranks\": %d, "
                 "\"bind_mismatch_ranks\": %d, \"bind_none_ranks\": %d, \"inactive_ranks\": %d},\n",
              a->n_fallback, a->n_shared, a->n_mismatch, a->n_bind_none, a->n_inactive);
    /* schema 4: which memory the headline (leaked_ranks, top_by_peak,
     * memory_*) counts */
    sb_printf(b, "          \"memory\": {\"source\": \"%s\", \"observed_ranks\": %zu, "
                 "\"label\": ", rm_source_name(a->source), a->nobs);
    sb_json_str(b, rm_headline_label(a->source));
    sb_printf(b, "}},\n");

    sb_printf(b, "  \"nodes\": [");
    for (int k = 0; k < a->nnodes; k++) {
        const node_t *nd = &a->nodes[k];
        sb_printf(b, "%s\n    {\"host\": ", k ? "," : "");
        sb_json_str(b, rec[a->by_host[nd->first]].host);
        sb_printf(b, ", \"ranks\": [");
        for (size_t i = 0; i < nd->count; i++)
            sb_printf(b, "%s%d", i ? ", " : "", rec[a->by_host[nd->first + i]].rank);
        sb_printf(b, "], \"node_devices\": %d, \"devices\": [", nd->node_devices);
        for (int d = 0; d < nd->ndevices; d++)
            sb_printf(b, "%s%d", d ? ", " : "", nd->devices[d]);
        sb_printf(b, "], \"host_fallback_ranks\": %d, \"shared_gpu_ranks\": %d, "
                     "\"bytes_peak_sum\": %llu, \"bytes_peak_max\": %llu, \"bytes_peak_max_rank\": "
                     "%d, \"bytes_current_sum\": %llu, \"bytes_total_sum\": %llu, "
                     "\"reserved_peak_sum\": %llu",
                  nd->host_fallback, nd->shared, (unsigned long long)nd->peak_sum,
                  (unsigned long long)nd->peak_max, nd->peak_max_rank,
                  (unsigned long long)nd->leaked_sum, (unsigned long long)nd->total_sum,
                  (unsigned long long)nd->reserved_sum);
        sb_printf(b, ", \"observed_gpu_peak_sum\": %llu, \"observed_gpu_peak_max\": %llu, "
                     "\"observed_gpu_peak_max_rank\": %d",
                  (unsigned long long)nd->obs_peak_sum, (unsigned long long)nd->obs_peak_max,
                  nd->obs_peak_max_rank);
        sb_printf(b, ", \"memory_peak_sum\": %llu, \"memory_peak_max\": %llu, "
                     "\"memory_peak_max_rank\": %d, \"memory_current_sum\": %llu, "
                     "\"memory_total_sum\": %llu",
                  (unsigned long long)nd->mem_peak_sum, (unsigned long long)nd->mem_peak_max,
                  nd->mem_peak_max_rank, (unsigned long long)nd->mem_leaked_sum,
                  (unsigned long long)nd->mem_total_sum);
        if (nd->ndevices)
            sb_printf(b, ", \"dev_total\": %llu, \"dev_free_init_min\": %llu, "
                         "\"dev_free_final_min\": %llu}",
                      (unsigned long long)nd->dev_total, (unsigned long long)nd->dev_free_init_min,
                      (unsigned long long)nd->dev_free_final_min);
        else
            sb_printf(b, ", \"dev_total\": null, \"dev_free_init_min\": null, "
                         "\"dev_free_final_min\": null}");
    }
    sb_printf(b, "\n  ],\n  \"aggregates\": {");
    for (size_t f = 0; f < NFIELDS; f++) {
        const agg_t *g = &a->agg[f];
        sb_printf(b, "%s\n    \"%s\": {\"min\": %llu, \"min_rank\": %d, \"max\": %llu, "
                     "\"max_rank\": %d, \"sum\": %llu, \"mean\": ",
                  f ? "," : "", fields[f].key, (unsigned long long)g->min, g->min_rank,
                  (unsigned long long)g->max, g->max_rank, (unsigned long long)g->sum_lo);
        sb_json_num(b, g->mean);
        sb_printf(b, ", \"std\": ");
        sb_json_num(b, g->std);
        sb_printf(b, ", \"imbalance\": ");
        sb_json_num(b, g->imbalance);
        sb_printf(b, "}");
    }
    sb_printf(b, "\n  },\n  \"leaked_ranks\": [");
    for (int k = 0; k < a->nleaked; k++) {
        const rk_mpi_record_t *r = &rec[a->leaked[k]];
        rm_headline_t h;
        rm_headline(r, &h);
        sb_printf(b, "%s{\"rank\": %d, \"bytes\": %llu, \"allocations\": %llu, \"source\": "
                     "\"%s\", \"served_bytes\": %llu}", k ? ", " : "", r->rank,
                  (unsigned long long)h.current, (unsigned long long)h.live,
                  rm_source_name(h.source), (unsigned long long)r->bytes_current);
    }
    sb_printf(b, "],\n  \"top_by_peak\": [");
    for (int k = 0; k < a->ntop; k++)
        sb_printf(b, "%s%d", k ? ", " : "", rec[a->top[k]].rank);
    sb_printf(b, "],\n");
    json_observed(b, a);
    /* issue 29: the ranks whose allocations were refused (all of them;
     * the details are in ranks[].failure) */
    sb_printf(b, "  \"refused_ranks\": [");
    for (int i = 0, k = 0; i < a->n; i++)
        if (rec[i].fail.oom_count)
            sb_printf(b, "%s{\"rank\": %d, \"count\": %llu, \"bytes\": %llu}", k++ ? ", " : "",
                      rec[i].rank, (unsigned long long)rec[i].fail.oom_count,
                      (unsigned long long)rec[i].fail.oom_bytes);
    sb_printf(b, "],\n");
    sb_printf(b, "  \"ranks\": [");
    for (int i = 0; i < a->n; i++) {
        sb_printf(b, "%s\n    ", i ? "," : "");
        json_record(b, &rec[i]);
    }
    sb_printf(b, "\n  ]\n}\n");
}

/* ------------------------------------------------------------------------
 * CSV: one row per rank, the record's fields as columns. */

static void csv_report(sbuf_t *b, const analysis_t *a)
{
    rm_csv_header(b);
    for (int i = 0; i < a->n; i++)
        rm_csv_row(b, &a->rec[i]);
}

/* ------------------------------------------------------------------------
 * Writing (rank 0). */

static void write_stream(FILE *f, const sbuf_t *docs, unsigned formats)
{
    for (int k = 0; k < NDOCS; k++)
        if (formats & (1u << k))
            fwrite(docs[k].p, 1, docs[k].len, f);
    fflush(f);
}

/* suffix: "" or "-phase2" etc, put before the number and the extension. */
static void write_files(const settings_t *s, const analysis_t *a, const sbuf_t *docs,
                        const char *suffix)
{
    char path[PATH_MAX], base[PATH_MAX], names[NDOCS][PATH_MAX], tmp[PATH_MAX];
    unsigned formats = s->formats;
    const char *why = "";
    char bad = 0;
    if (expand(s->tmpl, a->n, a->stamp, path, sizeof path, &why, &bad) != 0) {
        if (!atomic_exchange(&warned_template, 1)) {
            if (bad)
                warn("%s: %s '%%%c' in '%.200s' (known: %%j %%p %%t %%n %%%%); writing the text "
                     "report to stderr", s->origin, why, bad, s->tmpl);
            else
                warn("%s: %s in '%.200s'; writing the text report to stderr", s->origin, why,
                     s->tmpl);
        }
        write_stream(stderr, docs, FMT_TEXT);
        return;
    }
    int k0 = known_ext(path);
    if (k0 >= 0)
        path[strlen(path) - strlen(fmt_exts[k0])] = '\0';
    if ((size_t)snprintf(base, sizeof base, "%s%s", path, suffix) >= sizeof base) {
        warn("%s: path too long; writing the text report to stderr", s->origin);
        write_stream(stderr, docs, FMT_TEXT);
        return;
    }

    /* One number for the whole set, so report.2.txt goes with report.2.json. */
    unsigned n = 0;
    for (; n <= RK_MAX_SUFFIX; n++) {
        int taken = 0, bad_name = 0;
        for (int k = 0; k < NDOCS; k++) {
            if (!(formats & (1u << k)))
                continue;
            if (name_of(names[k], sizeof names[k], base, n, fmt_exts[k]) != 0)
                bad_name = 1;
            else
                taken |= exists(names[k]);
        }
        if (bad_name) {
            n = RK_MAX_SUFFIX + 1;
            break;
        }
        if (!taken)
            break;
    }
    char done[NDOCS * PATH_MAX + 16];
    size_t dlen = 0;
    int failed = 0;
    done[0] = '\0';
    for (int k = 0; k < NDOCS; k++) {
        if (!(formats & (1u << k)))
            continue;
        if (n > RK_MAX_SUFFIX) {
            warn("cannot find a free name for '%s%s' (tried up to .%d)", base, fmt_exts[k],
                 RK_MAX_SUFFIX);
            failed = 1;
            continue;
        }
        if (docs[k].oom) {
            warn("out of memory while building the %s report", fmt_names[k]);
            failed = 1;
            continue;
        }
        if (write_temp(names[k], docs[k].p, docs[k].len, tmp, sizeof tmp) != 0) {
            char dir[PATH_MAX];
            dir_of(names[k], dir, sizeof dir);
            warn("cannot write '%s' (a temporary file in '%s': %s)", names[k], dir,
                 strerror(errno));
            failed = 1;
            continue;
        }
        /* Another writer may take the name between the check and now: the
         * next free number for this file, then. */
        int r;
        unsigned m = n;
        while ((r = publish(tmp, names[k])) == 1 && m < RK_MAX_SUFFIX)
            if (name_of(names[k], sizeof names[k], base, ++m, fmt_exts[k]) != 0)
                break;
        if (r != 0) {
            warn("cannot create '%s': %s", names[k], r > 0 ? "name taken" : strerror(errno));
            unlink(tmp);
            failed = 1;
            continue;
        }
        dlen += (size_t)snprintf(done + dlen, dlen < sizeof done ? sizeof done - dlen : 0, "%s%s",
                                 dlen ? ", " : "", names[k]);
        if (dlen >= sizeof done)
            dlen = sizeof done - 1;
    }
    if (dlen)
        notice("report (%s) written to %s", a->phase, done);
    if (failed) {
        /* The numbers are not lost: the text report goes to stderr. */
        warn("the text report follows on stderr");
        write_stream(stderr, docs, FMT_TEXT);
    }
    fflush(stderr);
}

static int write_report(const settings_t *s, const rk_mpi_record_t *rec, int n, const extras_t *x,
                        const char *phase, const char *trigger, const char *suffix)
{
    analysis_t a;
    memset(&a, 0, sizeof a);
    a.rec = rec;
    a.x = x;
    a.n = n;
    a.phase = phase;
    a.trigger = trigger;
    sbuf_t docs[NDOCS];
    memset(docs, 0, sizeof docs);
    if (analyse(&a) != 0) {
        warn("out of memory analysing %d records; no report", n);
        analysis_free(&a);
        return -1;
    }
    unsigned need = s->formats | (s->dest == DEST_FILES ? FMT_TEXT : 0); /* text: the fallback */
    if (need & (FMT_JSON | FMT_TEXT)) /* the text is rendered from the JSON */
        json_report(&docs[1], &a);
    if (need & FMT_TEXT)
        text_report(&docs[0], &a, &docs[1]);
    if (need & FMT_CSV)
        csv_report(&docs[2], &a);
    if (need & FMT_TIMELINE)
        csv_timeline(&docs[3], &a);
    switch (s->dest) {
    case DEST_STDOUT:
        write_stream(stdout, docs, s->formats);
        break;
    case DEST_STDERR:
        write_stream(stderr, docs, s->formats);
        break;
    case DEST_FILES:
        write_files(s, &a, docs, suffix);
        break;
    case DEST_OFF:
        break;
    }
    for (int k = 0; k < NDOCS; k++)
        free(docs[k].p);
    analysis_free(&a);
    return 0;
}

/* ------------------------------------------------------------------------
 * The collective. */

/* ---- observed memory (the recorder, mpi/observe/recorder.h) ---- */

static void copy_counts(rm_counts_t *d, const rk_obs_counts_t *c)
{
    d->current = c->current;
    d->peak = c->peak;
    d->total = c->total;
    d->count = c->count;
    d->live = c->live;
    d->peak_ns = c->peak_ns;
}

/* This rank's call sites' words, as they were sent (hashes travel; the
 * text of the chosen ones only, at the end). One per report call. */
typedef char site_text_t[RM_LEAK_TOP][RM_SITE_TEXT];

/* The observed part of the record (state, counts); returns the snapshot's
 * time (0 when the recorder is not enabled). */
static uint64_t fill_observed(rk_mpi_record_t *rec)
{
    const char *why = NULL;
    rk_obs_state_t st = rk_obs_get_state(&why);
    rec->obs.state = (int32_t)st;
    snprintf(rec->obs.why, sizeof rec->obs.why, "%s", st == RK_OBS_ON || !why ? "" : why);
    if (!rk_obs_enabled())
        return 0;
    rk_obs_sample_now(); /* the last interval is in the timeline too */
    rk_obs_summary_t sm;
    memset(&sm, 0, sizeof sm);
    rk_obs_summary(&sm);
    for (int k = 0; k < RM_OBS_NKINDS && k < RK_OBS_NKINDS; k++)
        copy_counts(&rec->obs.kind[k], &sm.program[k]);
    copy_counts(&rec->obs.gpu, &sm.program_gpu);
    copy_counts(&rec->obs.served, &sm.by[RK_OBS_SERVED][RK_OBS_DEVICE]);
    rec->obs.served.peak_ns = 0;
    rec->obs.rankmem_current = sm.by[RK_OBS_RANKMEM][RK_OBS_DEVICE].current;
    rec->obs.rankmem_peak = sm.by[RK_OBS_RANKMEM][RK_OBS_DEVICE].peak;
    rec->obs.events = sm.events;
    rec->obs.unmatched_frees = sm.unmatched_frees;
    rec->obs.untracked = sm.untracked;
    return sm.now_ns;
}

#define RK_TIMELINE_READ 4096 /* samples read back (the recorder keeps 512 by default) */

/* The timeline resampled over the job's axis, and (finalize) the largest
 * live sites. */
static void fill_timeline_and_sites(rk_mpi_record_t *rec, uint64_t t_end_ns, int final,
                                    site_text_t *my_site_text)
{
    rec->nleaks = 0;
    memset(*my_site_text, 0, sizeof *my_site_text);
    if (!rk_obs_enabled())
        return;
    rk_obs_sample_t *smp = malloc(sizeof *smp * RK_TIMELINE_READ);
    uint64_t *t = malloc(sizeof *t * RK_TIMELINE_READ), *v = malloc(sizeof *v * RK_TIMELINE_READ);
    if (smp && t && v) {
        size_t n = rk_obs_timeline(smp, RK_TIMELINE_READ);
        if (n > RK_TIMELINE_READ)
            n = RK_TIMELINE_READ;
        for (size_t i = 0; i < n; i++) {
            t[i] = smp[i].t_ns;
            v[i] = smp[i].bytes;
        }
        rm_timeline_resample(t, v, n, t_end_ns, rec->timeline);
    }
    free(smp);
    free(t);
    free(v);
    if (!final)
        return;
    rk_obs_site_t *sites = malloc(sizeof *sites * RM_LEAK_TOP);
    if (!sites)
        return;
    size_t n = rk_obs_live_sites(sites, RM_LEAK_TOP);
    if (n > RM_LEAK_TOP)
        n = RM_LEAK_TOP;
    for (size_t i = 0; i < n; i++) {
        rk_obs_site_text(&sites[i], (*my_site_text)[i], RM_SITE_TEXT);
        (*my_site_text)[i][RM_SITE_TEXT - 1] = '\0';
        rm_leak_t *l = &rec->leaks[rec->nleaks++];
        l->hash = rm_site_hash((*my_site_text)[i]);
        l->bytes = sites[i].bytes;
        l->count = sites[i].count;
        l->api = sites[i].api;
        l->kind = sites[i].kind;
    }
    free(sites);
}

/* This rank's record; a stub (version 0) where the plugin is not active
 * here, so that the gather still has every rank's bytes. */
static void my_record(rk_mpi_record_t *rec, int active)
{
    memset(rec, 0, sizeof *rec);
    if (active) {
        /* librankmem_omp (when the program has it; never linked here) may
         * hold freed device blocks until a device sync: give them back
         * first, so that they are not reported as live or leaked. */
        rankmem_status_t (*omp_flush)(void);
        *(void **)&omp_flush = dlsym(RTLD_DEFAULT, "rankmem_omp_flush");
        if (omp_flush)
            omp_flush();
        rk_mpi_fill_record(rec);
        return;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rec->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &rec->size);
    rec->local_rank = rec->env_local_rank = rec->device = -1;
    if (gethostname(rec->host, sizeof rec->host - 1) != 0)
        rec->host[0] = '\0';
}

void rk_mpi_fill_now(rk_mpi_record_t *rec, char (*texts)[RM_SITE_TEXT])
{
    rk_mpi_fill_record(rec);
    uint64_t now = fill_observed(rec);
    if (texts) {
        fill_timeline_and_sites(rec, now, 1, (site_text_t *)texts);
    } else {
        site_text_t *none = calloc(1, sizeof *none);
        if (none)
            fill_timeline_and_sites(rec, now, 0, none);
        free(none);
    }
}

/* Phases, matched by index across ranks (names from rank 0): four
 * reductions of fixed size, whatever the number of ranks. */
static int reduce_phases(MPI_Comm comm, int rank, extras_t *x)
{
    enum { NP = RK_OBS_MAX_PHASES };
    rk_obs_phase_t *ph = calloc(NP, sizeof *ph);
    uint64_t mins[2 * NP], maxs[NP], sums[2 * NP], rmins[2 * NP], rmaxs[NP], rsums[2 * NP];
    struct {
        double v;
        int rank;
    } loc[NP], rloc[NP];
    size_t n = ph && rk_obs_enabled() ? rk_obs_phases(ph, NP) : 0;
    if (n > NP)
        n = NP;
    for (int i = 0; i < NP; i++) {
        int have = (size_t)i < n;
        mins[i] = have ? ph[i].peak : UINT64_MAX;
        mins[NP + i] = have ? ph[i].t_start_ns : UINT64_MAX;
        maxs[i] = have ? ph[i].t_end_ns : 0;
        sums[i] = have ? ph[i].peak : 0;
        sums[NP + i] = (uint64_t)have;
        loc[i].v = have ? (double)ph[i].peak : -1.0;
        loc[i].rank = rank;
    }
    int rc;
    if ((rc = MPI_Reduce(mins, rmins, 2 * NP, MPI_UINT64_T, MPI_MIN, 0, comm)) != MPI_SUCCESS ||
        (rc = MPI_Reduce(maxs, rmaxs, NP, MPI_UINT64_T, MPI_MAX, 0, comm)) != MPI_SUCCESS ||
        (rc = MPI_Reduce(sums, rsums, 2 * NP, MPI_UINT64_T, MPI_SUM, 0, comm)) != MPI_SUCCESS ||
        (rc = MPI_Reduce(loc, rloc, NP, MPI_DOUBLE_INT, MPI_MAXLOC, 0, comm)) != MPI_SUCCESS) {
        free(ph);
        return rc;
    }
    if (rank == 0) {
        /* Rank 0's phases name them; a later phase only other ranks had
         * is left out (the phases are the program's, the same everywhere). */
        x->nphases = (int)n;
        for (int i = 0; i < (int)n; i++) {
            phase_agg_t *p = &x->phases[i];
            snprintf(p->name, sizeof p->name, "%s", ph[i].name);
            p->t_start_s = (double)rmins[NP + i] / 1e9;
            p->t_end_s = (double)rmaxs[i] / 1e9;
            p->peak_min = rmins[i];
            p->peak_max = (uint64_t)rloc[i].v; /* exact below 2^53 bytes */
            p->peak_max_rank = rloc[i].rank;
            p->ranks = (int)rsums[NP + i];
            p->peak_mean = p->ranks ? (double)rsums[i] / p->ranks : 0.0;
        }
    }
    free(ph);
    return MPI_SUCCESS;
}

/* ---- leaks by call site, across ranks ---- */

typedef struct {
    uint64_t hash, bytes, count;
    int rank, api, kind;
} entry_t;

static int cmp_entry(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_site(const void *a, const void *b)
{
    const site_agg_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes < y->bytes ? 1 : -1;
    return (x->hash > y->hash) - (x->hash < y->hash);
}

/* Rank 0: the gathered entries merged by site, the largest RM_LEAK_SITES
 * kept in x->sites (text still empty). */
static void merge_sites(const rk_mpi_record_t *all, int n, extras_t *x)
{
    size_t ne = 0;
    for (int i = 0; i < n; i++)
        ne += all[i].nleaks > 0 && all[i].nleaks <= RM_LEAK_TOP ? (size_t)all[i].nleaks : 0;
    x->nsites = 0;
    if (!ne)
        return;
    entry_t *e = malloc(sizeof *e * ne);
    site_agg_t *m = malloc(sizeof *m * ne);
    if (!e || !m) {
        free(e);
        free(m);
        warn("out of memory merging %zu call sites; the report names none", ne);
        return;
    }
    size_t k = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < all[i].nleaks && j < RM_LEAK_TOP; j++) {
            const rm_leak_t *l = &all[i].leaks[j];
            e[k++] = (entry_t){l->hash, l->bytes, l->count, all[i].rank, l->api, l->kind};
        }
    qsort(e, ne, sizeof *e, cmp_entry);
    size_t nm = 0;
    for (size_t i = 0; i < ne; i++) {
        site_agg_t *s = nm ? &m[nm - 1] : NULL;
        if (!s || s->hash != e[i].hash) {
            s = &m[nm++];
            memset(s, 0, sizeof *s - sizeof s->text);
            s->hash = e[i].hash;
            s->api = e[i].api;
            s->kind = e[i].kind;
            s->first_rank = e[i].rank;
            s->text[0] = '\0';
        } else if (e[i].rank == e[i - 1].rank) {
            s->ranks--; /* two sites of one rank with one text: one rank */
        }
        s->ranks++;
        s->bytes += e[i].bytes;
        s->count += e[i].count;
        x->sites_bytes += e[i].bytes;
    }
    qsort(m, nm, sizeof *m, cmp_site);
    x->nsites = nm < RM_LEAK_SITES ? (int)nm : RM_LEAK_SITES;
    for (int i = 0; i < x->nsites; i++) {
        memcpy(&x->sites[i], &m[i], sizeof m[i] - sizeof m[i].text);
        x->sites[i].text[0] = '\0';
    }
    free(e);
    free(m);
}

/* Collective: the chosen sites' words. Rank 0 broadcasts their hashes;
 * each rank that has one puts its text in (the same text on every rank
 * that has it, so a bytewise MAX leaves it whole) and its rank (MIN: the
 * lowest rank that has it). Fixed size: RM_LEAK_SITES texts. */
static int site_texts(MPI_Comm comm, int rank, extras_t *x, const rk_mpi_record_t *mine,
                      const site_text_t *my_site_text)
{
    uint64_t hashes[RM_LEAK_SITES + 1];
    memset(hashes, 0, sizeof hashes);
    if (rank == 0) {
        hashes[0] = (uint64_t)x->nsites;
        for (int i = 0; i < x->nsites; i++)
            hashes[i + 1] = x->sites[i].hash;
    }
    int rc = MPI_Bcast(hashes, RM_LEAK_SITES + 1, MPI_UINT64_T, 0, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int ns = hashes[0] <= RM_LEAK_SITES ? (int)hashes[0] : RM_LEAK_SITES;
    if (ns == 0)
        return MPI_SUCCESS;
    /* 10 KiB on the stack: no allocation that could fail on one rank only */
    unsigned char text[RM_LEAK_SITES][RM_SITE_TEXT], rtext[RM_LEAK_SITES][RM_SITE_TEXT];
    memset(text, 0, sizeof text);
    int owner[RM_LEAK_SITES], rowner[RM_LEAK_SITES];
    for (int i = 0; i < ns; i++) {
        owner[i] = INT_MAX;
        for (int j = 0; j < mine->nleaks && j < RM_LEAK_TOP; j++)
            if (mine->leaks[j].hash == hashes[i + 1]) {
                owner[i] = rank;
                memcpy(text[i], (*my_site_text)[j], RM_SITE_TEXT);
                break;
            }
    }
    if ((rc = MPI_Reduce(owner, rowner, ns, MPI_INT, MPI_MIN, 0, comm)) != MPI_SUCCESS ||
        (rc = MPI_Reduce(text, rtext, ns * RM_SITE_TEXT, MPI_UNSIGNED_CHAR, MPI_MAX, 0, comm)) !=
            MPI_SUCCESS)
        return rc;
    if (rank == 0)
        for (int i = 0; i < ns && i < x->nsites; i++) {
            x->sites[i].first_rank = rowner[i] == INT_MAX ? x->sites[i].first_rank : rowner[i];
            memcpy(x->sites[i].text, rtext[i], RM_SITE_TEXT);
            x->sites[i].text[RM_SITE_TEXT - 1] = '\0';
            if (!x->sites[i].text[0])
                snprintf(x->sites[i].text, RM_SITE_TEXT, "%s (site %016llx)",
                         rk_obs_api_name(x->sites[i].api), (unsigned long long)x->sites[i].hash);
        }
    return MPI_SUCCESS;
}

/* Set on the thread that builds a report, while it does (the tests' malloc
 * fails ours there: tests/mpi_report/failure_prog.c). */
RK_MPI_HIDDEN _Thread_local int rk_report_busy;

static int report_body(MPI_Comm comm, const char *path, const char *phase, const char *trigger,
                       const char *suffix);

/* Collective over comm. path: NULL for RANKMEM_REPORT. suffix: what a file
 * name gets for this phase. Returns an MPI error code (MPI_SUCCESS when the
 * report was skipped or a write failed: those are warnings). */
static int report_collective(MPI_Comm comm, const char *path, const char *phase,
                             const char *trigger, const char *suffix)
{
    rk_report_busy = 1;
    int rc = report_body(comm, path, phase, trigger, suffix);
    rk_report_busy = 0;
    return rc;
}

static int report_body(MPI_Comm comm, const char *path, const char *phase, const char *trigger,
                       const char *suffix)
{
    int rank, size, rc;
    if ((rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS)
        return rc;
    if ((rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
        return rc;
    int active = rk_mpi_active();
    int final = strcmp(phase, "finalize") == 0;

    settings_t s;
    memset(&s, 0, sizeof s);
    int want = 0;
    rk_mpi_record_t *all = NULL;
    extras_t *x = NULL;
    if (rank == 0) {
        read_settings(path, &s);
        /* Without the plugin on rank 0 there is no report to write. */
        want = active && s.dest != DEST_OFF;
        /* Rank 0's buffers before anything else: without them there is no
         * gather at all, and the others learn so below. */
        if (want && (!(all = malloc(sizeof(rk_mpi_record_t) * (size_t)size)) ||
                     !(x = calloc(1, sizeof *x)))) {
            warn("out of memory for %d records; no report", size);
            want = 0;
        }
    }
    /* Rank 0 decides for all, so that the gather happens on every rank or
     * on none whatever the other ranks' settings. A broadcast: the root
     * does not wait in it, and the others would wait in the gather anyway. */
    if ((rc = MPI_Bcast(&want, 1, MPI_INT, 0, comm)) != MPI_SUCCESS || !want) {
        free(all);
        free(x);
        return rc;
    }

    rk_mpi_record_t *mine = calloc(1, sizeof *mine);
    site_text_t *texts = calloc(1, sizeof *texts);
    rk_mpi_record_t stub;
    static site_text_t no_texts; /* never written: nleaks stays 0 without texts */
    if (!mine) /* still take part: a record of zeros */
        mine = &stub;
    my_record(mine, active);
    uint64_t now = active ? fill_observed(mine) : 0, t_end = 0;
    /* The timeline's common axis: [0, the longest run]. */
    rc = MPI_Allreduce(&now, &t_end, 1, MPI_UINT64_T, MPI_MAX, comm);
    if (rc == MPI_SUCCESS) {
        if (active && texts)
            fill_timeline_and_sites(mine, t_end, final, texts);
        rc = MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE, 0,
                        comm);
    }
    if (rc == MPI_SUCCESS)
        rc = reduce_phases(comm, rank, rank == 0 ? x : NULL);
    if (rc == MPI_SUCCESS && final) {
        if (rank == 0) {
            x->leaks = 1;
            merge_sites(all, size, x);
        }
        rc = site_texts(comm, rank, x, mine, texts ? (const site_text_t *)texts : &no_texts);
    }
    if (rc == MPI_SUCCESS && rank == 0) {
        x->t_end_ns = t_end;
        for (int i = 0; i < size; i++) { /* defensively terminated */
            all[i].host[sizeof all[i].host - 1] = '\0';
            all[i].device_name[sizeof all[i].device_name - 1] = '\0';
            all[i].pci_bus_id[sizeof all[i].pci_bus_id - 1] = '\0';
            all[i].bind_mode[sizeof all[i].bind_mode - 1] = '\0';
            all[i].spec[sizeof all[i].spec - 1] = '\0';
            all[i].obs.why[sizeof all[i].obs.why - 1] = '\0';
            all[i].fail.kind[sizeof all[i].fail.kind - 1] = '\0';
            all[i].fail.trigger[sizeof all[i].fail.trigger - 1] = '\0';
            all[i].fail.oom_api[sizeof all[i].fail.oom_api - 1] = '\0';
            all[i].fail.oom_source[sizeof all[i].fail.oom_source - 1] = '\0';
            all[i].fail.oom_site[sizeof all[i].fail.oom_site - 1] = '\0';
            all[i].fail.diagnosis[sizeof all[i].fail.diagnosis - 1] = '\0';
        }
        /* One analysis at a time in this process (MPI_THREAD_MULTIPLE):
         * the sorts' records are the process's. Not held across the
         * collectives above: two threads' reports over two communicators
         * must not wait on each other. */
        pthread_mutex_lock(&report_lock);
        write_report(&s, all, size, x, phase, trigger, suffix);
        pthread_mutex_unlock(&report_lock);
    }
    if (mine != &stub)
        free(mine);
    free(texts);
    free(all);
    free(x);
    return rc;
}

int rk_mpi_report_write(MPI_Comm comm, const char *path)
{
    return report_collective(comm, path, "finalize", "MPI_Finalize", "");
}

static atomic_int report_count, phase_count;

rankmem_status_t rankmem_mpi_report(MPI_Comm comm, const char *path)
{
    int init = 0, fin = 0, inter = 0;
    if (comm == MPI_COMM_NULL)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init || MPI_Finalized(&fin) != MPI_SUCCESS ||
        fin)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    int k = atomic_fetch_add(&report_count, 1) + 1;
    char phase[32], suffix[32];
    snprintf(phase, sizeof phase, "report%d", k);
    /* An explicit path is the user's name for it: no suffix. */
    snprintf(suffix, sizeof suffix, "-report%d", k);
    int rc = report_collective(comm, path, phase, "rankmem_mpi_report", path ? "" : suffix);
    if (rc != MPI_SUCCESS)
        return RANKMEM_ERR_INTERNAL;
    /* The collective is done either way; a rank without the plugin had
     * nothing of its own to report. */
    return rk_mpi_active() ? RANKMEM_SUCCESS : RANKMEM_ERR_NOT_SUPPORTED;
}

/* ------------------------------------------------------------------------
 * MPI_Pcontrol: level 2 writes a report now (collective over
 * MPI_COMM_WORLD), named "-phase<N>"; level 3 takes a label,
 * MPI_Pcontrol(3, "after-setup"), and names the report "-after-setup".
 * Every other level goes to the MPI library (and other tools) unchanged. */

#define RK_PCONTROL_REPORT 2
#define RK_PCONTROL_LABEL 3

static int pcontrol_report(const char *label)
{
    int init = 0, fin = 0;
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init || MPI_Finalized(&fin) != MPI_SUCCESS ||
        fin)
        return MPI_SUCCESS;
    char phase[80], suffix[84];
    if (label && *label) {
        sanitize(phase, 65, label);
    } else {
        int k = atomic_fetch_add(&phase_count, 1) + 1;
        snprintf(phase, sizeof phase, "phase%d", k);
    }
    snprintf(suffix, sizeof suffix, "-%s", phase);
    /* The report's phase is also a phase of the timeline (rank 0's name). */
    rk_obs_phase(label && *label ? label : phase);
    return report_collective(MPI_COMM_WORLD, NULL, phase, "MPI_Pcontrol", suffix);
}

RK_EXPORT int MPI_Pcontrol(const int level, ...)
{
    if (level == RK_PCONTROL_REPORT)
        return pcontrol_report(NULL);
    if (level == RK_PCONTROL_LABEL) {
        va_list ap;
        va_start(ap, level);
        const char *label = va_arg(ap, const char *);
        va_end(ap);
        return pcontrol_report(label);
    }
    /* The extra arguments cannot be passed on through a va_list; the
     * standard gives them no meaning, and MPI libraries ignore them. */
    return PMPI_Pcontrol(level);
}

/* Fortran: CALL MPI_PCONTROL(2) (the Fortran binding has no IERROR).
 * Level 3 needs a C string: not offered there. */
static void pcontrol_f(const MPI_Fint *level)
{
    if (*level == RK_PCONTROL_REPORT)
        (void)pcontrol_report(NULL);
    else
        (void)PMPI_Pcontrol((int)*level);
}

RK_EXPORT void mpi_pcontrol_(const MPI_Fint *level);
RK_EXPORT void mpi_pcontrol__(const MPI_Fint *level);
RK_EXPORT void MPI_PCONTROL(const MPI_Fint *level);
RK_EXPORT void mpi_pcontrol(const MPI_Fint *level);
void mpi_pcontrol_(const MPI_Fint *level) { pcontrol_f(level); }
void mpi_pcontrol__(const MPI_Fint *level) { pcontrol_f(level); }
void MPI_PCONTROL(const MPI_Fint *level) { pcontrol_f(level); }
void mpi_pcontrol(const MPI_Fint *level) { pcontrol_f(level); }
