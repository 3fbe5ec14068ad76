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
#define RK_REPORT_SCHEMA 1

/* How much of the long lists the text report shows; JSON and CSV have all. */
#define RK_TEXT_TOP 10       /* top ranks by peak */
#define RK_TEXT_LEAKED 20    /* ranks that leaked */
#define RK_TEXT_NODES 32     /* per-node lines */
#define RK_TEXT_LIST 8       /* ranks named in a flag line */
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
 * A growable string: the three documents are built in memory, then written
 * to a stream or to files the same way. */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf_t;

static void sb_reserve(sbuf_t *b, size_t more)
{
    if (b->oom || b->len + more + 1 <= b->cap)
        return;
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

static void sb_printf(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || b->oom)
        return;
    sb_reserve(b, (size_t)n);
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

static void sb_putc(sbuf_t *b, char c)
{
    sb_reserve(b, 1);
    if (b->oom)
        return;
    b->p[b->len++] = c;
    b->p[b->len] = '\0';
}

/* JSON string, quotes included. Bytes outside ASCII become '?' so that the
 * document is valid UTF-8 whatever a host name or spec holds. */
static void sb_json_str(sbuf_t *b, const char *s)
{
    sb_putc(b, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            sb_printf(b, "\\%c", c);
        else if (c == '\n')
            sb_printf(b, "\\n");
        else if (c == '\t')
            sb_printf(b, "\\t");
        else if (c < 0x20 || c == 0x7f)
            sb_printf(b, "\\u%04x", c);
        else
            sb_putc(b, c >= 0x80 ? '?' : (char)c);
    }
    sb_putc(b, '"');
}

/* CSV field (RFC 4180): quoted when it holds a comma, quote or line break. */
static void sb_csv_str(sbuf_t *b, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        sb_printf(b, "%s", s);
        return;
    }
    sb_putc(b, '"');
    for (; *s; s++) {
        if (*s == '"')
            sb_putc(b, '"');
        sb_putc(b, *s);
    }
    sb_putc(b, '"');
}

/* JSON number for a double: finite, else null. */
static void sb_json_num(sbuf_t *b, double v)
{
    if (isfinite(v))
        sb_printf(b, "%.12g", v); /* exact to far below what is measured */
    else
        sb_printf(b, "null");
}

/* ------------------------------------------------------------------------
 * Human-readable quantities for the text report (exact values are in the
 * JSON and CSV). */

static const char *fmt_bytes(char *buf, size_t len, double v)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    if (v < 1024.0) {
        snprintf(buf, len, "%.0f B", v);
        return buf;
    }
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

static const char *fmt_count(char *buf, size_t len, double v, int integral)
{
    if (integral)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%.1f", v);
    return buf;
}

static const char *fmt_ns(char *buf, size_t len, double ns)
{
    if (ns < 1e3)
        snprintf(buf, len, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, len, "%.2f us", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, len, "%.2f ms", ns / 1e6);
    else
        snprintf(buf, len, "%.3f s", ns / 1e9);
    return buf;
}

/* ------------------------------------------------------------------------
 * What is summed up over the ranks. */

enum unit { U_BYTES, U_COUNT, U_NS };

typedef struct {
    const char *key;   /* JSON key, CSV column: the record's field name */
    const char *label; /* text report */
    size_t offset;     /* of a uint64_t in rk_mpi_record_t */
    enum unit unit;
} field_t;

#define FIELD(name, label, unit) {#name, label, offsetof(rk_mpi_record_t, name), unit}
static const field_t fields[] = {
    FIELD(bytes_peak, "peak bytes", U_BYTES),
    FIELD(bytes_current, "leaked bytes", U_BYTES),
    FIELD(bytes_total, "total bytes", U_BYTES),
    FIELD(count_total, "allocations", U_COUNT),
    FIELD(count_peak, "peak allocations", U_COUNT),
    FIELD(count_current, "live allocations", U_COUNT),
    FIELD(reserved_peak, "reserved peak", U_BYTES),
    FIELD(alloc_ns, "alloc time", U_NS),
    FIELD(staged_bytes, "staged bytes", U_BYTES),
    FIELD(staged_messages, "staged messages", U_COUNT),
};
#define NFIELDS (sizeof fields / sizeof fields[0])

static uint64_t field_of(const rk_mpi_record_t *r, size_t f)
{
    uint64_t v;
    memcpy(&v, (const char *)r + fields[f].offset, sizeof v);
    return v;
}

typedef struct {
    uint64_t min, max, sum_lo; /* sum_lo: wraps only past 2^64 bytes in all */
    int min_rank, max_rank;
    double mean, std, imbalance; /* imbalance: max/mean, NaN when mean is 0 */
} agg_t;

static void aggregate(const rk_mpi_record_t *rec, int n, size_t f, agg_t *a)
{
    a->min = UINT64_MAX;
    a->max = 0;
    a->sum_lo = 0;
    a->min_rank = a->max_rank = -1;
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        uint64_t v = field_of(&rec[i], f);
        /* Ties: the lowest rank, so the answer does not depend on order. */
        if (v < a->min || (v == a->min && rec[i].rank < a->min_rank)) {
            a->min = v;
            a->min_rank = rec[i].rank;
        }
        if (v > a->max || (v == a->max && (a->max_rank < 0 || rec[i].rank < a->max_rank))) {
            a->max = v;
            a->max_rank = rec[i].rank;
        }
        a->sum_lo += v;
        sum += (double)v;
    }
    if (n == 0)
        a->min = 0;
    a->mean = n ? sum / n : 0.0;
    /* Two passes: the textbook formula cancels badly at these magnitudes. */
    double ss = 0.0;
    for (int i = 0; i < n; i++) {
        double d = (double)field_of(&rec[i], f) - a->mean;
        ss += d * d;
    }
    a->std = n ? sqrt(ss / n) : 0.0; /* population: these are all the ranks */
    a->imbalance = a->mean > 0.0 ? (double)a->max / a->mean : NAN;
}

/* ------------------------------------------------------------------------
 * The settings (rank 0 only). */

enum dest { DEST_OFF, DEST_STDOUT, DEST_STDERR, DEST_FILES };
enum { FMT_TEXT = 1, FMT_JSON = 2, FMT_CSV = 4 };
static const char *const fmt_names[] = {"text", "json", "csv"};
static const char *const fmt_exts[] = {".txt", ".json", ".csv"};

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
        for (int k = 0; k < 3; k++) {
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
            warn("RANKMEM_REPORT_FORMAT: no known format in '%.64s' (known: text, json, csv); "
                 "writing text", s);
        f = FMT_TEXT;
    } else if (bad && !atomic_exchange(&warned_format, 1)) {
        warn("RANKMEM_REPORT_FORMAT: unknown format '%.*s' ignored (known: text, json, csv)",
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

typedef struct {
    int first; /* index into the by-host order */
    int count;
    int devices[RK_DISTINCT];
    int ndevices, more_devices;
    int node_devices;
    int host_fallback, shared;
    uint64_t peak_sum, peak_max, leaked_sum, reserved_sum, total_sum;
    int peak_max_rank;
    uint64_t dev_total, dev_free_init_min, dev_free_final_min;
} node_t;

typedef struct {
    const char *s;
    int count;
} distinct_t;

typedef struct {
    const rk_mpi_record_t *rec;
    int n;                 /* ranks in the report */
    const char *phase;     /* "finalize", "phase1", ... */
    const char *trigger;   /* what asked for it */
    agg_t agg[NFIELDS];
    int *by_host;          /* indices sorted by (host, rank) */
    node_t *nodes;
    int nnodes;
    int *top;              /* the RK_TEXT_TOP largest peaks */
    int ntop;
    int *leaked;           /* indices with bytes_current > 0, largest first */
    int nleaked;
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

static int cmp_host(const void *a, const void *b)
{
    const rk_mpi_record_t *x = &sort_rec[*(const int *)a], *y = &sort_rec[*(const int *)b];
    int c = strcmp(x->host, y->host);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_leak(const void *a, const void *b)
{
    const rk_mpi_record_t *x = &sort_rec[*(const int *)a], *y = &sort_rec[*(const int *)b];
    if (x->bytes_current != y->bytes_current)
        return x->bytes_current < y->bytes_current ? 1 : -1;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* Does record i come before record j by peak (largest first, then rank)? */
static int peak_before(const rk_mpi_record_t *rec, int i, int j)
{
    if (rec[i].bytes_peak != rec[j].bytes_peak)
        return rec[i].bytes_peak > rec[j].bytes_peak;
    return rec[i].rank < rec[j].rank;
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
        aggregate(rec, n, f, &a->agg[f]);

    a->by_host = malloc(sizeof(int) * (size_t)(n ? n : 1));
    a->nodes = malloc(sizeof(node_t) * (size_t)(n ? n : 1));
    a->leaked = malloc(sizeof(int) * (size_t)(n ? n : 1));
    a->top = malloc(sizeof(int) * RK_TEXT_TOP);
    if (!a->by_host || !a->nodes || !a->leaked || !a->top)
        return -1;

    for (int i = 0; i < n; i++)
        a->by_host[i] = i;
    sort_rec = rec; /* rank 0 only, one report at a time (see report_lock) */
    qsort(a->by_host, (size_t)n, sizeof(int), cmp_host);

    a->nnodes = 0;
    for (int k = 0; k < n; k++) {
        const rk_mpi_record_t *r = &rec[a->by_host[k]];
        node_t *nd = a->nnodes ? &a->nodes[a->nnodes - 1] : NULL;
        if (!nd || strcmp(rec[a->by_host[nd->first]].host, r->host) != 0) {
            nd = &a->nodes[a->nnodes++];
            memset(nd, 0, sizeof *nd);
            nd->first = k;
            nd->peak_max_rank = -1;
            nd->dev_free_init_min = UINT64_MAX;
            nd->dev_free_final_min = UINT64_MAX;
        }
        nd->count++;
        if (r->node_devices > nd->node_devices)
            nd->node_devices = r->node_devices;
        nd->host_fallback += (r->flags & RK_MPI_HOST_FALLBACK) != 0;
        nd->shared += (r->flags & RK_MPI_SHARED_GPU) != 0;
        nd->peak_sum += r->bytes_peak;
        nd->leaked_sum += r->bytes_current;
        nd->reserved_sum += r->reserved_peak;
        nd->total_sum += r->bytes_total;
        if (nd->peak_max_rank < 0 || r->bytes_peak > nd->peak_max) {
            nd->peak_max = r->bytes_peak;
            nd->peak_max_rank = r->rank;
        }
        if (r->device >= 0) {
            int seen = 0;
            for (int d = 0; d < nd->ndevices; d++)
                seen |= nd->devices[d] == r->device;
            if (!seen && nd->ndevices < RK_DISTINCT)
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
    for (int k = 0; k < a->nnodes; k++) { /* devices in order, for reading */
        node_t *nd = &a->nodes[k];
        for (int i = 1; i < nd->ndevices; i++)
            for (int j = i; j > 0 && nd->devices[j - 1] > nd->devices[j]; j--) {
                int t = nd->devices[j];
                nd->devices[j] = nd->devices[j - 1];
                nd->devices[j - 1] = t;
            }
    }

    /* Top peaks: a short insertion list, O(P * RK_TEXT_TOP). */
    a->ntop = 0;
    for (int i = 0; i < n; i++) {
        int pos = a->ntop;
        while (pos > 0 && peak_before(rec, i, a->top[pos - 1]))
            pos--;
        if (pos >= RK_TEXT_TOP)
            continue;
        int last = a->ntop < RK_TEXT_TOP ? a->ntop : RK_TEXT_TOP - 1;
        for (int j = last; j > pos; j--)
            a->top[j] = a->top[j - 1];
        a->top[pos] = i;
        if (a->ntop < RK_TEXT_TOP)
            a->ntop++;
    }

    a->nleaked = 0;
    for (int i = 0; i < n; i++)
        if (rec[i].bytes_current > 0)
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

static const char *field_label(const analysis_t *a, size_t f)
{
    /* Before finalize, what is still allocated is not a leak. */
    if (strcmp(fields[f].key, "bytes_current") == 0 && strcmp(a->phase, "finalize") != 0)
        return "live bytes";
    return fields[f].label;
}

static const char *fmt_field(char *buf, size_t len, size_t f, double v, int exact)
{
    switch (fields[f].unit) {
    case U_BYTES:
        return fmt_bytes(buf, len, v);
    case U_NS:
        return fmt_ns(buf, len, v);
    case U_COUNT:
        break;
    }
    return fmt_count(buf, len, v, exact);
}

/* "1, 3, 5 and 4 more" */
static void rank_list(sbuf_t *b, const rk_mpi_record_t *rec, int n, uint32_t flag, int total)
{
    int shown = 0;
    for (int i = 0; i < n && shown < RK_TEXT_LIST; i++)
        if (rec[i].flags & flag)
            sb_printf(b, "%s%d", shown++ ? ", " : "", rec[i].rank);
    if (total > shown)
        sb_printf(b, " and %d more", total - shown);
}

/* ------------------------------------------------------------------------
 * The text report. */

static void text_report(sbuf_t *b, const analysis_t *a)
{
    const rk_mpi_record_t *rec = a->rec;
    char b1[48], b2[48], b3[48], b4[48], b5[48];

    sb_printf(b, "==== rankmem memory report (%s) ====\n\n", a->phase);

    sb_printf(b, "job\n");
    sb_printf(b, "  job id          %s%s%s%s\n", a->jobid, a->jobid_src ? " (" : "",
              a->jobid_src ? a->jobid_src : "", a->jobid_src ? ")" : " (no launcher job id)");
    int per_node_max = 0;
    for (int k = 0; k < a->nnodes; k++)
        if (a->nodes[k].count > per_node_max)
            per_node_max = a->nodes[k].count;
    sb_printf(b, "  ranks           %d on %d node%s (at most %d per node)\n", a->n, a->nnodes,
              a->nnodes == 1 ? "" : "s", per_node_max);
    if (a->n > 0 && rec[0].size != a->n)
        sb_printf(b, "  world size      %d (this report covers a communicator of %d)\n",
                  rec[0].size, a->n);
    sb_printf(b, "  phase           %s (%s)\n", a->phase, a->trigger);
    sb_printf(b, "  wall time       %.3f s (longest rank, since MPI_Init)\n", a->wall_max);
    sb_printf(b, "  written         %s by pid %ld on %s\n", a->when, a->pid, a->host);
    for (int i = 0; i < a->nspecs; i++)
        sb_printf(b, "  %-15s %s%s\n", i ? "" : a->nspecs + a->more_specs > 1 ? "specs" : "spec",
                  a->specs[i].s[0] ? a->specs[i].s : "(none)",
                  a->nspecs > 1 ? (snprintf(b1, sizeof b1, "  (%d ranks)", a->specs[i].count), b1)
                                : "");
    if (a->more_specs)
        sb_printf(b, "  %-15s and %d ranks with other specs (JSON: ranks[].spec)\n", "",
                  a->more_specs);
    for (int i = 0; i < a->nbinds; i++)
        sb_printf(b, "  %-15s %s%s\n", i ? "" : "binding", a->binds[i].s[0] ? a->binds[i].s : "?",
                  a->nbinds > 1 ? (snprintf(b1, sizeof b1, "  (%d ranks)", a->binds[i].count), b1)
                                : "");
    if (a->more_binds)
        sb_printf(b, "  %-15s and %d ranks with other modes\n", "", a->more_binds);
    if (!a->n_fallback && !a->n_shared && !a->n_mismatch && !a->n_bind_none && !a->n_inactive) {
        sb_printf(b, "  flags           none\n");
    } else {
        const char *lead = "flags";
        if (a->n_fallback) {
            sb_printf(b, "  %-15s host fallback (no GPU, host memory) on %d of %d ranks: ", lead,
                      a->n_fallback, a->n);
            rank_list(b, rec, a->n, RK_MPI_HOST_FALLBACK, a->n_fallback);
            sb_printf(b, "\n");
            lead = "";
        }
        if (a->n_shared) {
            sb_printf(b, "  %-15s shared GPU (more ranks than GPUs on the node) on %d ranks: ",
                      lead, a->n_shared);
            rank_list(b, rec, a->n, RK_MPI_SHARED_GPU, a->n_shared);
            sb_printf(b, "\n");
            lead = "";
        }
        if (a->n_mismatch) {
            sb_printf(b, "  %-15s bind mismatch (launcher's local rank differs; the communicator's "
                         "was used) on %d ranks: ", lead, a->n_mismatch);
            rank_list(b, rec, a->n, RK_MPI_BIND_MISMATCH, a->n_mismatch);
            sb_printf(b, "\n");
            lead = "";
        }
        if (a->n_bind_none) {
            sb_printf(b, "  %-15s binding left to the application (RANKMEM_BIND=none) on %d ranks\n",
                      lead, a->n_bind_none);
            lead = "";
        }
        if (a->n_inactive) {
            sb_printf(b, "  %-15s no rankmem plugin (MPI_Init did not go through it; zeros) on %d "
                         "ranks:", lead, a->n_inactive);
            int shown = 0;
            for (int i = 0; i < a->n && shown < RK_TEXT_LIST; i++)
                if (rec[i].version == 0)
                    sb_printf(b, "%s %d", shown++ ? "," : "", rec[i].rank);
            if (a->n_inactive > shown)
                sb_printf(b, " and %d more", a->n_inactive - shown);
            sb_printf(b, "\n");
        }
    }

    /* Per node. */
    sb_printf(b, "\nnodes (%d)\n", a->nnodes);
    sb_printf(b, "  %-20s %5s  %-10s %11s %11s %6s %11s %11s  %s\n", "host", "ranks", "devices",
              "peak sum", "peak max", "rank", "leaked", "reserved", "device free init -> final");
    int *show = NULL, nshow = a->nnodes;
    if (a->nnodes > RK_TEXT_NODES) {
        /* Too many to list: the nodes with the largest peaks. */
        show = malloc(sizeof(int) * RK_TEXT_NODES);
        nshow = 0;
        if (show) {
            for (int k = 0; k < a->nnodes; k++) {
                int pos = nshow;
                while (pos > 0 && a->nodes[k].peak_max > a->nodes[show[pos - 1]].peak_max)
                    pos--;
                if (pos >= RK_TEXT_NODES)
                    continue;
                int last = nshow < RK_TEXT_NODES ? nshow : RK_TEXT_NODES - 1;
                for (int j = last; j > pos; j--)
                    show[j] = show[j - 1];
                show[pos] = k;
                if (nshow < RK_TEXT_NODES)
                    nshow++;
            }
        }
    }
    for (int s = 0; s < nshow; s++) {
        const node_t *nd = &a->nodes[show ? show[s] : s];
        char devs[64];
        size_t o = 0;
        devs[0] = '\0';
        if (nd->ndevices == 0)
            snprintf(devs, sizeof devs, "host");
        for (int d = 0; d < nd->ndevices && o < sizeof devs; d++)
            o += (size_t)snprintf(devs + o, sizeof devs - o, "%s%d", d ? "," : "", nd->devices[d]);
        if (nd->more_devices && o < sizeof devs)
            snprintf(devs + o, sizeof devs - o, ",...");
        char dev[96];
        if (nd->ndevices)
            snprintf(dev, sizeof dev, "%s -> %s of %s%s", fmt_bytes(b3, sizeof b3,
                     (double)nd->dev_free_init_min), fmt_bytes(b4, sizeof b4,
                     (double)nd->dev_free_final_min), fmt_bytes(b5, sizeof b5,
                     (double)nd->dev_total), nd->shared ? " (shared)" : "");
        else
            snprintf(dev, sizeof dev, "-");
        sb_printf(b, "  %-20s %5d  %-10s %11s %11s %6d %11s %11s  %s\n",
                  rec[a->by_host[nd->first]].host, nd->count, devs,
                  fmt_bytes(b1, sizeof b1, (double)nd->peak_sum),
                  fmt_bytes(b2, sizeof b2, (double)nd->peak_max), nd->peak_max_rank,
                  fmt_bytes(b3, sizeof b3, (double)nd->leaked_sum),
                  fmt_bytes(b4, sizeof b4, (double)nd->reserved_sum), dev);
    }
    if (nshow < a->nnodes)
        sb_printf(b, "  ... %d more nodes (the %d with the largest peaks are shown; all are in "
                     "the JSON report)\n", a->nnodes - nshow, nshow);
    free(show);

    /* Aggregates. */
    sb_printf(b, "\naggregates over %d ranks\n", a->n);
    sb_printf(b, "  %-17s %12s %12s %6s %12s %12s %9s\n", "", "min", "max", "rank", "mean",
              "std dev", "max/mean");
    for (size_t f = 0; f < NFIELDS; f++) {
        const agg_t *g = &a->agg[f];
        char imb[24];
        if (isfinite(g->imbalance))
            snprintf(imb, sizeof imb, "%.2f", g->imbalance);
        else
            snprintf(imb, sizeof imb, "-");
        sb_printf(b, "  %-17s %12s %12s %6d %12s %12s %9s\n", field_label(a, f),
                  fmt_field(b1, sizeof b1, f, (double)g->min, 1),
                  fmt_field(b2, sizeof b2, f, (double)g->max, 1), g->max_rank,
                  fmt_field(b3, sizeof b3, f, g->mean, 0), fmt_field(b4, sizeof b4, f, g->std, 0),
                  imb);
    }

    /* Leaks. */
    int fin = strcmp(a->phase, "finalize") == 0;
    sb_printf(b, "\n%s (%d of %d)\n", fin ? "ranks that leaked" : "ranks with live allocations",
              a->nleaked, a->n);
    if (a->nleaked == 0)
        sb_printf(b, "  none\n");
    else
        sb_printf(b, "  %6s  %-20s %12s %12s\n", "rank", "host", fin ? "leaked" : "live",
                  "allocations");
    for (int k = 0; k < a->nleaked && k < RK_TEXT_LEAKED; k++) {
        const rk_mpi_record_t *r = &rec[a->leaked[k]];
        sb_printf(b, "  %6d  %-20s %12s %12llu\n", r->rank, r->host,
                  fmt_bytes(b1, sizeof b1, (double)r->bytes_current),
                  (unsigned long long)r->count_current);
    }
    if (a->nleaked > RK_TEXT_LEAKED)
        sb_printf(b, "  ... %d more (JSON: leaked_ranks)\n", a->nleaked - RK_TEXT_LEAKED);

    /* Top ranks. */
    sb_printf(b, "\ntop ranks by peak\n");
    sb_printf(b, "  %6s  %-20s %5s %6s %12s %12s %12s %12s\n", "rank", "host", "local", "device",
              "peak", "reserved", "total", "allocations");
    for (int k = 0; k < a->ntop; k++) {
        const rk_mpi_record_t *r = &rec[a->top[k]];
        char dv[16];
        if (r->device >= 0)
            snprintf(dv, sizeof dv, "%d", r->device);
        else
            snprintf(dv, sizeof dv, "host");
        sb_printf(b, "  %6d  %-20s %5d %6s %12s %12s %12s %12llu\n", r->rank, r->host,
                  r->local_rank, dv, fmt_bytes(b1, sizeof b1, (double)r->bytes_peak),
                  fmt_bytes(b2, sizeof b2, (double)r->reserved_peak),
                  fmt_bytes(b3, sizeof b3, (double)r->bytes_total),
                  (unsigned long long)r->count_total);
    }
    sb_printf(b, "\n");
}

/* ------------------------------------------------------------------------
 * JSON: every number exact, every rank's record. */

static void json_record(sbuf_t *b, const rk_mpi_record_t *r)
{
    sb_printf(b, "{\"rank\": %d, \"size\": %d, \"host\": ", r->rank, r->size);
    sb_json_str(b, r->host);
    sb_printf(b, ", \"local_rank\": %d, \"local_size\": %d, \"env_local_rank\": %d, "
                 "\"device\": %d, \"node_devices\": %d, \"device_name\": ",
              r->local_rank, r->local_size, r->env_local_rank, r->device, r->node_devices);
    sb_json_str(b, r->device_name);
    sb_printf(b, ", \"pci_bus_id\": ");
    sb_json_str(b, r->pci_bus_id);
    sb_printf(b, ", \"bind_mode\": ");
    sb_json_str(b, r->bind_mode);
    sb_printf(b, ", \"spec\": ");
    sb_json_str(b, r->spec);
    sb_printf(b, ", \"version\": %u, \"flags\": %u, \"host_fallback\": %s, \"shared_gpu\": %s, "
                 "\"bind_mismatch\": %s, \"bind_none\": %s",
              r->version, r->flags, (r->flags & RK_MPI_HOST_FALLBACK) ? "true" : "false",
              (r->flags & RK_MPI_SHARED_GPU) ? "true" : "false",
              (r->flags & RK_MPI_BIND_MISMATCH) ? "true" : "false",
              (r->flags & RK_MPI_BIND_NONE) ? "true" : "false");
    for (size_t f = 0; f < NFIELDS; f++)
        sb_printf(b, ", \"%s\": %llu", fields[f].key, (unsigned long long)field_of(r, f));
    sb_printf(b, ", \"dev_total_init\": %llu, \"dev_free_init\": %llu, \"dev_total_final\": %llu, "
                 "\"dev_free_final\": %llu, \"staged_ns\": %llu, \"wall_s\": ",
              (unsigned long long)r->dev_total_init, (unsigned long long)r->dev_free_init,
              (unsigned long long)r->dev_total_final, (unsigned long long)r->dev_free_final,
              (unsigned long long)r->staged_ns);
    sb_json_num(b, r->wall_s);
    sb_printf(b, "}");
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
                 "\"bind_mismatch_ranks\": %d, \"bind_none_ranks\": %d, \"inactive_ranks\": %d}},\n",
              a->n_fallback, a->n_shared, a->n_mismatch, a->n_bind_none, a->n_inactive);

    sb_printf(b, "  \"nodes\": [");
    for (int k = 0; k < a->nnodes; k++) {
        const node_t *nd = &a->nodes[k];
        sb_printf(b, "%s\n    {\"host\": ", k ? "," : "");
        sb_json_str(b, rec[a->by_host[nd->first]].host);
        sb_printf(b, ", \"ranks\": [");
        for (int i = 0; i < nd->count; i++)
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
        sb_printf(b, "%s{\"rank\": %d, \"bytes\": %llu, \"allocations\": %llu}", k ? ", " : "",
                  r->rank, (unsigned long long)r->bytes_current,
                  (unsigned long long)r->count_current);
    }
    sb_printf(b, "],\n  \"top_by_peak\": [");
    for (int k = 0; k < a->ntop; k++)
        sb_printf(b, "%s%d", k ? ", " : "", rec[a->top[k]].rank);
    sb_printf(b, "],\n  \"ranks\": [");
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
    sb_printf(b, "rank,size,host,local_rank,local_size,env_local_rank,device,node_devices,"
                 "device_name,pci_bus_id,bind_mode,spec,flags,host_fallback,shared_gpu,"
                 "bind_mismatch,bind_none");
    for (size_t f = 0; f < NFIELDS; f++)
        sb_printf(b, ",%s", fields[f].key);
    sb_printf(b, ",dev_total_init,dev_free_init,dev_total_final,dev_free_final,staged_ns,wall_s,version\n");
    for (int i = 0; i < a->n; i++) {
        const rk_mpi_record_t *r = &a->rec[i];
        sb_printf(b, "%d,%d,", r->rank, r->size);
        sb_csv_str(b, r->host);
        sb_printf(b, ",%d,%d,%d,%d,%d,", r->local_rank, r->local_size, r->env_local_rank,
                  r->device, r->node_devices);
        sb_csv_str(b, r->device_name);
        sb_putc(b, ',');
        sb_csv_str(b, r->pci_bus_id);
        sb_putc(b, ',');
        sb_csv_str(b, r->bind_mode);
        sb_putc(b, ',');
        sb_csv_str(b, r->spec);
        sb_printf(b, ",%u,%d,%d,%d,%d", r->flags, (r->flags & RK_MPI_HOST_FALLBACK) != 0,
                  (r->flags & RK_MPI_SHARED_GPU) != 0, (r->flags & RK_MPI_BIND_MISMATCH) != 0,
                  (r->flags & RK_MPI_BIND_NONE) != 0);
        for (size_t f = 0; f < NFIELDS; f++)
            sb_printf(b, ",%llu", (unsigned long long)field_of(r, f));
        sb_printf(b, ",%llu,%llu,%llu,%llu,%llu,%.6f,%u\n", (unsigned long long)r->dev_total_init,
                  (unsigned long long)r->dev_free_init, (unsigned long long)r->dev_total_final,
                  (unsigned long long)r->dev_free_final, (unsigned long long)r->staged_ns,
                  r->wall_s, r->version);
    }
}

/* ------------------------------------------------------------------------
 * Writing (rank 0). */

static void write_stream(FILE *f, const sbuf_t *docs, unsigned formats)
{
    for (int k = 0; k < 3; k++)
        if (formats & (1u << k))
            fwrite(docs[k].p, 1, docs[k].len, f);
    fflush(f);
}

/* suffix: "" or "-phase2" etc, put before the number and the extension. */
static void write_files(const settings_t *s, const analysis_t *a, const sbuf_t *docs,
                        const char *suffix)
{
    char path[PATH_MAX], base[PATH_MAX], names[3][PATH_MAX], tmp[PATH_MAX];
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
        for (int k = 0; k < 3; k++) {
            if (!(s->formats & (1u << k)))
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
    char done[3 * PATH_MAX + 16];
    size_t dlen = 0;
    int failed = 0;
    done[0] = '\0';
    for (int k = 0; k < 3; k++) {
        if (!(s->formats & (1u << k)))
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

static int write_report(const settings_t *s, const rk_mpi_record_t *rec, int n, const char *phase,
                        const char *trigger, const char *suffix)
{
    analysis_t a;
    memset(&a, 0, sizeof a);
    a.rec = rec;
    a.n = n;
    a.phase = phase;
    a.trigger = trigger;
    sbuf_t docs[3];
    memset(docs, 0, sizeof docs);
    if (analyse(&a) != 0) {
        warn("out of memory analysing %d records; no report", n);
        analysis_free(&a);
        return -1;
    }
    unsigned need = s->formats | (s->dest == DEST_FILES ? FMT_TEXT : 0); /* text: the fallback */
    if (need & FMT_TEXT)
        text_report(&docs[0], &a);
    if (need & FMT_JSON)
        json_report(&docs[1], &a);
    if (need & FMT_CSV)
        csv_report(&docs[2], &a);
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
    for (int k = 0; k < 3; k++)
        free(docs[k].p);
    analysis_free(&a);
    return 0;
}

/* ------------------------------------------------------------------------
 * The collective. */

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

/* Collective over comm. path: NULL for RANKMEM_REPORT. suffix: what a file
 * name gets for this phase. Returns an MPI error code (MPI_SUCCESS when the
 * report was skipped or a write failed: those are warnings). */
static int report_collective(MPI_Comm comm, const char *path, const char *phase,
                             const char *trigger, const char *suffix)
{
    int rank, size, rc;
    if ((rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS)
        return rc;
    if ((rc = MPI_Comm_size(comm, &size)) != MPI_SUCCESS)
        return rc;
    int active = rk_mpi_active();

    settings_t s;
    memset(&s, 0, sizeof s);
    int want = 0;
    rk_mpi_record_t *all = NULL;
    if (rank == 0) {
        read_settings(path, &s);
        /* Without the plugin on rank 0 there is no report to write. */
        want = active && s.dest != DEST_OFF;
        /* Rank 0's buffer before anything else: without it there is no
         * gather at all, and the others learn so below. */
        if (want && !(all = malloc(sizeof(rk_mpi_record_t) * (size_t)size))) {
            warn("out of memory for %d records; no report", size);
            want = 0;
        }
    }
    /* Rank 0 decides for all, so that the gather happens on every rank or
     * on none whatever the other ranks' settings. A broadcast: the root
     * does not wait in it, and the others would wait in the gather anyway. */
    if ((rc = MPI_Bcast(&want, 1, MPI_INT, 0, comm)) != MPI_SUCCESS || !want) {
        free(all);
        return rc;
    }

    rk_mpi_record_t mine;
    my_record(&mine, active);
    rc = MPI_Gather(&mine, (int)sizeof mine, MPI_BYTE, all, (int)sizeof mine, MPI_BYTE, 0, comm);
    if (rc != MPI_SUCCESS || rank != 0) {
        free(all);
        return rc;
    }
    for (int i = 0; i < size; i++) { /* defensively terminated */
        all[i].host[sizeof all[i].host - 1] = '\0';
        all[i].device_name[sizeof all[i].device_name - 1] = '\0';
        all[i].pci_bus_id[sizeof all[i].pci_bus_id - 1] = '\0';
        all[i].bind_mode[sizeof all[i].bind_mode - 1] = '\0';
        all[i].spec[sizeof all[i].spec - 1] = '\0';
    }
    pthread_mutex_lock(&report_lock);
    write_report(&s, all, size, phase, trigger, suffix);
    pthread_mutex_unlock(&report_lock);
    free(all);
    return MPI_SUCCESS;
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
