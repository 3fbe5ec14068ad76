/* The record of a rank whose job fails (issue 29, docs/report.md "Reading
 * a failed job").
 *
 * A job that fails cannot be trusted to reach a collective, so each rank
 * writes its own record, the report model's (one rank's JSON document,
 * schema 3), to a file of its own:
 *
 *   - the first allocation the rank cannot get: rankmem's chain returning
 *     RANKMEM_ERR_OUT_OF_MEMORY (mpi/timing.c) or an observed CUDA
 *     allocation returning out of memory (mpi/observe/observe.c). The rank may
 *     recover: the record is written, one sentence of diagnosis goes to
 *     stderr, and the finalize report names the event;
 *   - MPI_Abort, exit() without MPI_Finalize: written in the caller's
 *     context, then the call goes on;
 *   - SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGXCPU, SIGSEGV, SIGBUS, SIGFPE,
 *     SIGILL, SIGABRT: written from the handler, then the handler that was
 *     there before ours runs, or the signal is raised again with its
 *     default action, so that the process ends as it would have;
 *   - RANKMEM_REPORT_INTERVAL: a helper thread rewrites the record at that
 *     period, so that a SIGKILL leaves the last one.
 *
 * The signal path is async-signal-safe: no malloc, no stdio, no lock that
 * the interrupted thread may hold (the recorder's lock is tried, never
 * waited for; the counters are atomic loads). Its buffers are static. It
 * starts from the last record made in a normal context (at MPI_Init, by the
 * interval thread, at an out-of-memory) and refreshes what can be read
 * safely: the chain's counters, the observed counters, the timeline, the
 * clock. A file is written under a temporary name and renamed: it appears
 * whole or not at all, and a later record replaces an earlier one. */
#define _GNU_SOURCE
#include "plugin.h"

#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "unknown"
#endif

/* ---- settings (rk_fail_options, before PMPI_Init) ---- */

static int on_failure = 1;        /* RANKMEM_ON_FAILURE=report */
static uint64_t interval_ns;      /* RANKMEM_REPORT_INTERVAL; 0 off */

/* ---- state (rk_fail_start, after MPI_Init) ---- */

static int started;
static char path[PATH_MAX];       /* the rank's file */
static char tmp_sig[PATH_MAX], tmp_norm[PATH_MAX], tmp_int[PATH_MAX];
static char dir_of_path[PATH_MAX]; /* "." or the record's folder */
static char job_id[128];
static const char *job_src;       /* the variable it came from, NULL: none */
static uint64_t t0_ns;            /* MPI_Init, the records' time 0 */
static int my_rank = -1;

/* The last record made in a normal context, in two copies: the writer
 * fills the one the signal path is not told to read, then flips. */
static rm_record_t base[2];
static atomic_int base_cur;

/* The first out-of-memory, written under fail_lock, read anywhere. */
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;
static rm_failure_t oom;
static atomic_ullong oom_count;

/* Live sites as of the last normal record with sites (OOM, abort, exit). */
#define NSITES RM_LEAK_TOP
static rm_leak_t sites[NSITES];
static char site_text[NSITES][RM_SITE_TEXT];
static int nsites;
static uint64_t sites_t_ns;

static atomic_int terminal;       /* a record of an event that ends the rank is out */
static atomic_int finishing;      /* MPI_Finalize started: exit() is not a failure */
static atomic_int publishing;     /* the interval thread is renaming its file */
static atomic_int written;        /* the file exists (ours) */
static atomic_int sig_busy;       /* a handler is writing */
static atomic_int sig_done;
static atomic_long sig_tid;
static __thread int in_fill;      /* this thread is reading the chain's stats */
static __thread int in_oom;

/* Set while the signal path runs (the tests' malloc checks it). */
RK_MPI_HIDDEN volatile sig_atomic_t rk_fail_in_handler;

/* ---- the signal path's memory, set aside before any signal ---- */

static rm_record_t srec;
static char sdoc[96 * 1024];
static rk_obs_sample_t ssamples[2048];
static uint64_t st[2048], sv[2048];

static const int sigs[] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2, SIGXCPU,
                           SIGSEGV, SIGBUS, SIGFPE,  SIGILL,  SIGABRT};
static const char *const signames[] = {"SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGXCPU",
                                       "SIGSEGV", "SIGBUS", "SIGFPE",  "SIGILL",  "SIGABRT"};
#define NSIGS ((int)(sizeof sigs / sizeof sigs[0]))
static struct sigaction old_act[NSIGS];
static int installed[NSIGS];

/* ---- options ---- */

/* "off", "0", or a number with s, ms, m, h (no unit: seconds). 0 and the
 * nanoseconds, or -1. The option table checks the same words. */
static int parse_duration(const char *s, uint64_t *ns)
{
    if (!s || !*s || strcmp(s, "off") == 0) {
        *ns = 0;
        return 0;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || v > 1e7)
        return -1;
    double mul = 1e9;
    if (strcmp(end, "ms") == 0)
        mul = 1e6;
    else if (strcmp(end, "m") == 0 || strcmp(end, "min") == 0)
        mul = 60e9;
    else if (strcmp(end, "h") == 0)
        mul = 3600e9;
    else if (*end && strcmp(end, "s") != 0)
        return -1;
    *ns = (uint64_t)(v * mul);
    if (*ns > 0 && *ns < 10000000) /* below 10 ms the rank would do little else */
        return -1;
    return 0;
}

void rk_fail_options(void)
{
    const char *v = rk_mpi_table_option("RANKMEM_ON_FAILURE");
    if (v)
        on_failure = strcmp(v, "off") != 0;
    v = rk_mpi_table_option("RANKMEM_REPORT_INTERVAL");
    if (v && parse_duration(v, &interval_ns) != 0) {
        rk_mpi_bad_setting("RANKMEM_REPORT_INTERVAL='%.48s': expected off or a duration of 10ms "
                           "or more (10s, 500ms, 2m, 1h)", v);
        interval_ns = 0;
    }
}

/* ---- where ---- */

static const char *const jobid_vars[] = {"SLURM_JOB_ID",  "PBS_JOBID",
                                         "LSB_JOBID",     "FLUX_JOB_ID",
                                         "COBALT_JOBID",  "OMPI_MCA_ess_base_jobid",
                                         "PMIX_NAMESPACE"};

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

/* The job id: the batch system's, else the launcher's (Open MPI, PMIx),
 * else (MPICH's Hydra names none) world rank 0's host and process id; the
 * ranks take world rank 0's, so that one job's files share one name even
 * where the variables differ between ranks. Collective over
 * MPI_COMM_WORLD: every rank comes here from MPI_Init. */
static void find_job_id(int world_rank)
{
    struct {
        char id[sizeof job_id];
        int src; /* index in jobid_vars, -1: rank 0's host and pid, -2: none */
    } m;
    memset(&m, 0, sizeof m);
    m.src = -2;
    for (size_t i = 0; i < sizeof jobid_vars / sizeof jobid_vars[0]; i++) {
        const char *v = getenv(jobid_vars[i]);
        if (v && *v) {
            sanitize(m.id, sizeof m.id, v);
            m.src = (int)i;
            break;
        }
    }
    if (m.src == -2 && world_rank == 0) {
        char host[64] = "";
        if (gethostname(host, sizeof host - 1) != 0)
            host[0] = '\0';
        char raw[sizeof m.id];
        snprintf(raw, sizeof raw, "%s-%ld", host[0] ? host : "host", (long)getpid());
        sanitize(m.id, sizeof m.id, raw);
        m.src = -1;
    }
    if (PMPI_Bcast(&m, (int)sizeof m, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS || !m.id[0]) {
        snprintf(job_id, sizeof job_id, "nojob");
        job_src = NULL;
        return;
    }
    memcpy(job_id, m.id, sizeof job_id);
    job_id[sizeof job_id - 1] = '\0';
    job_src = m.src >= 0 ? jobid_vars[m.src] : m.src == -1 ? "rank 0's host and process id" : NULL;
}

/* RANKMEM_REPORT's template for this rank: %j %p (this process) %t (its
 * MPI_Init) %n (world size) %%; a known extension dropped. 0, or -1 when
 * no file is wanted or the template is bad (the finalize report says
 * why). */
static int make_path(int world_size)
{
    const char *r = NULL;
    if (rankmem_option_get("RANKMEM_REPORT", &r) != RANKMEM_SUCCESS) {
        rankmem_clear_error();
        r = getenv("RANKMEM_REPORT");
    }
    if (r && (!*r || strcmp(r, "off") == 0))
        return -1;
    const char *tmpl = !r || strcmp(r, "stderr") == 0 || strcmp(r, "stdout") == 0
                           ? "rankmem-failure-%j"
                           : r;
    char stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    char out[PATH_MAX];
    size_t o = 0;
    for (const char *p = tmpl; *p; p++) {
        char tmp[160];
        if (*p != '%') {
            tmp[0] = *p;
            tmp[1] = '\0';
        } else {
            switch (*++p) {
            case 'j': snprintf(tmp, sizeof tmp, "%s", job_id); break;
            case 'p': snprintf(tmp, sizeof tmp, "%ld", (long)getpid()); break;
            case 't': snprintf(tmp, sizeof tmp, "%s", stamp); break;
            case 'n': snprintf(tmp, sizeof tmp, "%d", world_size); break;
            case '%': snprintf(tmp, sizeof tmp, "%%"); break;
            default: return -1;
            }
        }
        size_t n = strlen(tmp);
        if (o + n + 1 >= sizeof out)
            return -1;
        memcpy(out + o, tmp, n + 1);
        o += n;
    }
    static const char *const exts[] = {".txt", ".json", ".csv"};
    for (int k = 0; k < 3; k++) {
        size_t e = strlen(exts[k]);
        if (o > e && strcmp(out + o - e, exts[k]) == 0) {
            out[o - e] = '\0';
            break;
        }
    }
    if (!out[0] || (size_t)snprintf(path, sizeof path, "%s.rank-%d.json", out, my_rank) >=
                       sizeof path)
        return -1;
    const char *slash = strrchr(path, '/');
    int dl = slash ? (int)(slash - path + 1) : 0;
    const char *basename = path + dl;
    if ((size_t)snprintf(dir_of_path, sizeof dir_of_path, "%.*s", dl ? dl : 1,
                         dl ? path : ".") >= sizeof dir_of_path)
        return -1;
    if ((size_t)snprintf(tmp_sig, sizeof tmp_sig, "%.*s.%s.tmp-s", dl, path, basename) >=
            sizeof tmp_sig ||
        (size_t)snprintf(tmp_norm, sizeof tmp_norm, "%.*s.%s.tmp-n", dl, path, basename) >=
            sizeof tmp_norm ||
        (size_t)snprintf(tmp_int, sizeof tmp_int, "%.*s.%s.tmp-i", dl, path, basename) >=
            sizeof tmp_int)
        return -1;
    return 0;
}

/* ---- writing (either context) ---- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void put_str_or_null(rm_buf_t *b, const char *s)
{
    if (s)
        rm_json_str(b, s);
    else
        rm_puts(b, "null");
}

/* One rank's document: the report's layout with one record, the sites
 * live at the failure and the rank's timeline. printf-free, so that the
 * signal path writes it into a fixed buffer. */
static void build_doc(rm_buf_t *b, const rm_record_t *r, const char *phase, const char *trigger,
                      int with_sites)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    char when[32];
    rm_utc_text((int64_t)rt.tv_sec, when, sizeof when);
    rm_puts(b, "{\n  \"schema\": ");
    rm_put_u64(b, RM_REPORT_SCHEMA);
    rm_puts(b, ",\n  \"record_version\": ");
    rm_put_u64(b, RM_RECORD_VERSION);
    rm_puts(b, ",\n  \"generator\": \"rankmem " PACKAGE_VERSION "\",\n  \"phase\": ");
    rm_json_str(b, phase);
    rm_puts(b, ",\n  \"trigger\": ");
    rm_json_str(b, trigger);
    rm_puts(b, ",\n  \"job\": {\"id\": ");
    rm_json_str(b, job_id);
    rm_puts(b, ", \"id_source\": ");
    put_str_or_null(b, job_src);
    rm_puts(b, ", \"ranks\": 1, \"world_size\": ");
    rm_put_i64(b, r->size);
    rm_puts(b, ", \"nodes\": 1, \"wall_s\": ");
    rm_json_num(b, r->wall_s);
    rm_puts(b, ", \"time\": ");
    rm_json_str(b, when);
    rm_puts(b, ", \"writer_pid\": ");
    rm_put_i64(b, (int64_t)getpid());
    rm_puts(b, ", \"writer_host\": ");
    rm_json_str(b, r->host);
    rm_puts(b, "},\n  \"live_sites\": [");
    int n = with_sites ? nsites : 0;
    for (int i = 0; i < n; i++) {
        rm_puts(b, i ? ",\n    {\"site\": " : "\n    {\"site\": ");
        rm_json_str(b, site_text[i]);
        rm_puts(b, ", \"api\": ");
        rm_json_str(b, rk_obs_api_name(sites[i].api));
        rm_puts(b, ", \"kind\": ");
        rm_json_str(b, rk_obs_kind_name(sites[i].kind));
        rm_puts(b, ", \"bytes\": ");
        rm_put_u64(b, sites[i].bytes);
        rm_puts(b, ", \"count\": ");
        rm_put_u64(b, sites[i].count);
        rm_putc(b, '}');
    }
    rm_puts(b, n ? "\n  ],\n  \"live_sites_t_s\": " : "],\n  \"live_sites_t_s\": ");
    rm_json_num(b, n ? (double)sites_t_ns / 1e9 : 0.0);
    rm_puts(b, ",\n  \"timeline\": {\"t_end_s\": ");
    rm_json_num(b, isfinite(r->wall_s) ? r->wall_s : 0.0);
    rm_puts(b, ", \"buckets\": ");
    rm_put_u64(b, RM_TIMELINE_BUCKETS);
    rm_puts(b, ", \"bytes\": [\n    [");
    for (int k = 0; k < RM_TIMELINE_BUCKETS; k++) {
        if (k)
            rm_puts(b, ", ");
        rm_put_u64(b, r->timeline[k]);
    }
    rm_puts(b, "]\n  ]},\n  \"phases\": [],\n  \"ranks\": [\n    ");
    rm_json_record(b, r);
    rm_puts(b, "\n  ]\n}\n");
}

/* Writes data under the name tmp, which rename() then moves over the
 * rank's file. The bytes go first into an unnamed file (O_TMPFILE) that is
 * given the name only once complete: a rank killed meanwhile (SIGKILL, the
 * batch system) leaves no partial temporary behind, only at worst one whole
 * one in the two system calls before the rename. Where the file system has
 * no O_TMPFILE, a named one is written. Async-signal-safe. */
static int write_all(int fd, const char *data, size_t len)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        off += (size_t)w;
    }
    return 0;
}

static int write_file(const char *tmp, const char *data, size_t len)
{
#ifdef O_TMPFILE
    int fd = open(dir_of_path, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
    if (fd >= 0) {
        /* "/proc/self/fd/N" by hand: no snprintf in a signal handler. */
        char proc[40] = "/proc/self/fd/";
        char digits[16];
        int nd = 0;
        for (unsigned v = (unsigned)fd; nd == 0 || v; v /= 10)
            digits[nd++] = (char)('0' + v % 10);
        size_t o = strlen(proc);
        while (nd)
            proc[o++] = digits[--nd];
        proc[o] = '\0';
        int rc = write_all(fd, data, len);
        if (rc == 0) {
            unlink(tmp); /* a whole one left by an earlier kill */
            rc = linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW);
        }
        if (close(fd) != 0 && rc == 0) {
            unlink(tmp);
            rc = -1;
        }
        if (rc == 0)
            return 0;
        /* no /proc, linkat refused, or a full disk: the named way below
         * (which then fails as well, and says so) */
    }
#endif
    int nfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (nfd < 0)
        return -1;
    if (write_all(nfd, data, len) != 0) {
        close(nfd);
        unlink(tmp);
        return -1;
    }
    if (close(nfd) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Waits (a bounded while) for the interval thread to be done renaming, so
 * that its older record cannot land on top of this one. */
static void wait_publishing(void)
{
    for (int i = 0; i < 200 && atomic_load(&publishing); i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

static int publish(const char *tmp, int is_terminal)
{
    if (is_terminal)
        wait_publishing();
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    atomic_store(&written, 1);
    return 0;
}

/* One line on stderr by one write(2), without stdio. Only the handler
 * that writes calls it (sig_busy): the line is static, off a small
 * alternate signal stack. */
static void say_safe(const char *a, const char *b2, const char *c)
{
    static char line[PATH_MAX + 256];
    rm_buf_t b;
    rm_buf_fixed(&b, line, sizeof line);
    rm_puts(&b, "rankmem-mpi[rank ");
    rm_put_i64(&b, my_rank);
    rm_puts(&b, "]: ");
    rm_puts(&b, a);
    rm_puts(&b, b2);
    rm_puts(&b, c);
    rm_putc(&b, '\n');
    ssize_t w = write(STDERR_FILENO, b.p, b.len);
    (void)w;
}

static const char *fmt_b(char *buf, size_t cap, uint64_t v)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double x = (double)v;
    int k = 0;
    while (x >= 1024.0 && k < 4) {
        x /= 1024.0;
        k++;
    }
    if (k == 0)
        snprintf(buf, cap, "%llu B", (unsigned long long)v);
    else
        snprintf(buf, cap, "%.2f %s", x, u[k]);
    return buf;
}

/* ---- records in a normal context ---- */

void rk_fail_fill(rm_failure_t *f)
{
    memset(f, 0, sizeof *f);
    if (!atomic_load(&oom_count))
        return;
    pthread_mutex_lock(&fail_lock);
    *f = oom;
    pthread_mutex_unlock(&fail_lock);
    f->oom_count = atomic_load(&oom_count);
    /* The event the record is written for is the writer's to say. */
    f->kind[0] = f->trigger[0] = '\0';
    f->code = 0;
    f->t_ns = 0;
}

/* The rank's record now, kept as the signal path's starting point;
 * with_sites: its live sites in words (addr2line: not for the interval). */
static void fill_normal(rm_record_t *r, int with_sites)
{
    in_fill++;
    char (*texts)[RM_SITE_TEXT] = calloc(NSITES, RM_SITE_TEXT);
    rk_mpi_fill_now(r, with_sites ? texts : NULL);
    in_fill--;
    if (with_sites && texts) {
        pthread_mutex_lock(&fail_lock);
        nsites = r->nleaks < NSITES ? r->nleaks : NSITES;
        for (int i = 0; i < nsites; i++) {
            sites[i] = r->leaks[i];
            memcpy(site_text[i], texts[i], RM_SITE_TEXT);
            site_text[i][RM_SITE_TEXT - 1] = '\0';
        }
        sites_t_ns = now_ns() - t0_ns;
        pthread_mutex_unlock(&fail_lock);
    }
    free(texts);
    int next = !atomic_load(&base_cur);
    base[next] = *r;
    atomic_store(&base_cur, next);
}

/* A record for an event, written from a normal context (OOM, MPI_Abort,
 * exit, the interval). 0 written, -1 not. */
static int write_normal(const char *phase, const char *kind, const char *trigger, int code,
                        int is_terminal, const char *tmp)
{
    rm_record_t *r = calloc(1, sizeof *r);
    if (!r)
        return -1;
    fill_normal(r, strcmp(phase, "interval") != 0);
    snprintf(r->fail.kind, sizeof r->fail.kind, "%s", kind);
    snprintf(r->fail.trigger, sizeof r->fail.trigger, "%s", trigger);
    r->fail.code = code;
    r->fail.t_ns = now_ns() - t0_ns;
    if (!kind[0])
        r->fail.t_ns = 0;
    if (kind[0] && !r->fail.diagnosis[0]) {
        /* Without an out-of-memory (whose sentence stays): what ended it. */
        char a[32];
        uint64_t live = r->obs.gpu.current > r->bytes_current ? r->obs.gpu.current
                                                              : r->bytes_current;
        snprintf(r->fail.diagnosis, sizeof r->fail.diagnosis, "%s %d after %.1f s with %s live",
                 trigger, code, isfinite(r->wall_s) ? r->wall_s : 0.0, fmt_b(a, sizeof a, live));
    }
    rm_buf_t b;
    memset(&b, 0, sizeof b);
    build_doc(&b, r, phase, trigger, strcmp(phase, "interval") != 0);
    free(r);
    int rc = -1;
    if (!b.oom && write_file(tmp, b.p, b.len) == 0) {
        if (is_terminal) {
            rc = publish(tmp, 1);
        } else if (strcmp(phase, "interval") == 0) {
            /* Never on top of a failure record written meanwhile. */
            atomic_store(&publishing, 1);
            if (!atomic_load(&terminal) && !atomic_load(&sig_busy))
                rc = publish(tmp, 0);
            else
                unlink(tmp);
            atomic_store(&publishing, 0);
        } else {
            rc = atomic_load(&terminal) ? (unlink(tmp), -1) : publish(tmp, 1);
        }
    }
    free(b.p);
    return rc;
}

/* ---- the out-of-memory trigger ---- */

static void query(rankmem_resource_t *mr, rankmem_query_t q, uint64_t *out)
{
    size_t v = 0;
    if (mr && rankmem_resource_query(mr, q, &v) == RANKMEM_SUCCESS)
        *out = v;
    else
        rankmem_clear_error();
}

/* One sentence from what was seen at the failure (normal context). */
static void diagnose(rm_failure_t *f, const rm_record_t *r, uint64_t free_blocks,
                     uint64_t limit)
{
    char a[32], b[32], c[32], d[32];
    uint64_t pool_free = f->pool_reserved > f->pool_live ? f->pool_reserved - f->pool_live : 0;
    if (f->dev_total) {
        uint64_t used = f->dev_total - f->dev_free;
        if (f->dev_other > f->dev_total / 4) {
            snprintf(f->diagnosis, sizeof f->diagnosis,
                     "another process holds %s of this GPU (%s of %s in use; this rank holds %s)",
                     fmt_b(a, sizeof a, f->dev_other), fmt_b(b, sizeof b, used),
                     fmt_b(c, sizeof c, f->dev_total), fmt_b(d, sizeof d, used - f->dev_other));
            return;
        }
        if (pool_free >= f->oom_bytes && f->dev_free < f->oom_bytes) {
            snprintf(f->diagnosis, sizeof f->diagnosis,
                     "fragmentation: %s free in the pool (%llu free blocks, the largest %s) but "
                     "no free block of %s, and %s free on the device",
                     fmt_b(a, sizeof a, pool_free), (unsigned long long)free_blocks,
                     fmt_b(d, sizeof d, f->pool_largest_free), fmt_b(b, sizeof b, f->oom_bytes),
                     fmt_b(c, sizeof c, f->dev_free));
            return;
        }
        if (f->oom_bytes > f->dev_total) {
            /* PyTorch's "tried to allocate" a size no device state serves */
            snprintf(f->diagnosis, sizeof f->diagnosis,
                     "request larger than the GPU: %s asked for, the device has %s in all "
                     "(%s in use, %s of it live in this rank)",
                     fmt_b(a, sizeof a, f->oom_bytes), fmt_b(b, sizeof b, f->dev_total),
                     fmt_b(c, sizeof c, used), fmt_b(d, sizeof d, f->oom_live));
            return;
        }
        if (f->dev_free < f->oom_bytes) {
            int o = snprintf(f->diagnosis, sizeof f->diagnosis,
                             "device full: %s of %s in use, %s of it live in this rank",
                             fmt_b(a, sizeof a, used), fmt_b(b, sizeof b, f->dev_total),
                             fmt_b(c, sizeof c, f->oom_live));
            if (nsites > 0 && o > 0 && (size_t)o < sizeof f->diagnosis)
                snprintf(f->diagnosis + o, sizeof f->diagnosis - (size_t)o, " (%.120s holds %s)",
                         site_text[0], fmt_b(d, sizeof d, sites[0].bytes));
            return;
        }
    }
    if (pool_free >= f->oom_bytes) {
        snprintf(f->diagnosis, sizeof f->diagnosis,
                 "fragmentation: %s free in the pool (%llu free blocks, the largest %s) but no "
                 "free block of %s",
                 fmt_b(a, sizeof a, pool_free), (unsigned long long)free_blocks,
                 fmt_b(d, sizeof d, f->pool_largest_free), fmt_b(b, sizeof b, f->oom_bytes));
        return;
    }
    if (limit) {
        snprintf(f->diagnosis, sizeof f->diagnosis,
                 "limit reached: %s asked for with %s live in this rank, the chain's limit "
                 "is %s (%.80s)",
                 fmt_b(a, sizeof a, f->oom_bytes), fmt_b(b, sizeof b, f->pool_live ? f->pool_live
                                                                   : f->oom_live),
                 fmt_b(c, sizeof c, limit), r->spec);
        return;
    }
    snprintf(f->diagnosis, sizeof f->diagnosis,
             "%s refused: %s live in this rank, %s reserved by its chain (%.80s)%s",
             fmt_b(a, sizeof a, f->oom_bytes), fmt_b(b, sizeof b, f->oom_live),
             fmt_b(c, sizeof c, f->pool_reserved), r->spec,
             f->dev_total ? "" : "; no GPU: host memory");
}

void rk_fail_oom(int api, const char *source, uint64_t bytes, uint64_t stream,
                 void *const *frames, int nframes)
{
    if (!started || in_oom || atomic_load(&terminal) || atomic_load(&finishing))
        return;
    if (atomic_fetch_add(&oom_count, 1) != 0)
        return; /* only the first is described; the count goes on */
    in_oom = 1;
    rm_failure_t f;
    memset(&f, 0, sizeof f);
    f.oom_bytes = bytes;
    f.oom_stream = stream;
    f.oom_t_ns = now_ns() - t0_ns;
    snprintf(f.oom_api, sizeof f.oom_api, "%s", rk_obs_api_name(api));
    snprintf(f.oom_source, sizeof f.oom_source, "%s", source);
    void *raw[40];
    rk_obs_site_t site;
    memset(&site, 0, sizeof site);
    site.api = api;
    if (frames && nframes > 0) {
        site.nframes = nframes < RK_OBS_MAX_FRAMES ? nframes : RK_OBS_MAX_FRAMES;
        memcpy(site.frames, frames, (size_t)site.nframes * sizeof *frames);
    } else {
        /* The program's frames: rankmem's own (the plugin, librankmem)
         * are skipped. */
        rk_code_range_t ours[16];
        int nours = 0;
        rk_code_ranges("librankmem", ours, &nours, 16);
        int n = backtrace(raw, 40);
        /* The program's frames start after rankmem's entry point (in
         * librankmem); the plugin's own may sit in the program when it is
         * linked in, so they are passed by position, not by object. */
        int i = 2;
        while (i < n && !rk_in_ranges(ours, nours, (uintptr_t)raw[i]))
            i++;
        if (i == n)
            i = 2;
        /* CUDA's failure is seen from CUPTI's callback: CUPTI's, the
         * driver's and the shared runtime's frames are not the program's
         * either (the objects observation skips). */
        for (; i < n && site.nframes < 8; i++)
            if (!rk_in_ranges(ours, nours, (uintptr_t)raw[i]) && !rk_obs_skipped(raw[i]))
                site.frames[site.nframes++] = raw[i];
    }
    rk_obs_site_text(&site, f.oom_site, sizeof f.oom_site);

    rm_record_t *r = calloc(1, sizeof *r);
    if (r) {
        fill_normal(r, 1);
        f.oom_live = r->obs.gpu.current > r->bytes_current ? r->obs.gpu.current
                                                           : r->bytes_current;
        f.dev_total = r->dev_total_final;
        f.dev_free = r->dev_free_final;
    }
    rankmem_resource_t *mr = rankmem_mpi_resource();
    rankmem_resource_t *below = NULL;
    if (mr && rankmem_resource_upstream(mr, &below) != RANKMEM_SUCCESS) {
        rankmem_clear_error();
        below = NULL;
    }
    uint64_t free_blocks = 0, limit = 0;
    query(below, RANKMEM_QUERY_RESERVED_CURRENT, &f.pool_reserved);
    query(below, RANKMEM_QUERY_USED_CURRENT, &f.pool_live);
    query(below, RANKMEM_QUERY_FREE_BLOCKS, &free_blocks);
    query(below, RANKMEM_QUERY_LARGEST_FREE, &f.pool_largest_free);
    query(below, RANKMEM_QUERY_LIMIT, &limit);
    if (r) {
        /* This process's device memory: the program's own CUDA calls, and
         * what rankmem holds from CUDA (its chain's reservation, which the
         * served blocks sit in; reserved before observation started, CUDA's
         * count of it may be short). The rest in use is other processes'. */
        uint64_t own = r->obs.gpu.current > r->obs.served.current
                           ? r->obs.gpu.current - r->obs.served.current
                           : 0;
        uint64_t held = r->obs.rankmem_current;
        if (f.pool_reserved > held)
            held = f.pool_reserved;
        if (r->obs.served.current > held)
            held = r->obs.served.current;
        uint64_t used = f.dev_total > f.dev_free ? f.dev_total - f.dev_free : 0;
        f.dev_other = used > own + held && r->obs.state == RM_OBS_ON ? used - own - held : 0;
        diagnose(&f, r, free_blocks, limit);
    }
    free(r);
    pthread_mutex_lock(&fail_lock);
    oom = f;
    pthread_mutex_unlock(&fail_lock);

    int ok = on_failure && path[0] &&
             write_normal("failure", "oom", "out of memory", 0, 0, tmp_norm) == 0;
    rk_mpi_warn("out of memory: %s (%s, %llu bytes); %s%s", f.diagnosis, f.oom_site,
                (unsigned long long)bytes, ok ? "record written to " : "no record written",
                ok ? path : "");
    in_oom = 0;
}

/* ---- MPI_Abort and exit() ---- */

static void terminal_normal(const char *kind, const char *trigger, int code, const char *what)
{
    if (!started || !on_failure || !path[0] || atomic_load(&finishing) ||
        atomic_exchange(&terminal, 1))
        return;
    if (write_normal("failure", kind, trigger, code, 1, tmp_norm) == 0)
        rk_mpi_warn("%s: record written to %s", what, path);
    else
        rk_mpi_warn("%s: the failure record could not be written to %s", what, path);
}

static void on_exit_hook(int status, void *arg)
{
    (void)arg;
    char what[64];
    snprintf(what, sizeof what, "exit(%d) before MPI_Finalize", status);
    terminal_normal("exit", "exit", status, what);
}

RK_MPI_EXPORT int MPI_Abort(MPI_Comm comm, int errorcode)
{
    char what[64];
    snprintf(what, sizeof what, "MPI_Abort(errorcode %d)", errorcode);
    terminal_normal("abort", "MPI_Abort", errorcode, what);
    return PMPI_Abort(comm, errorcode);
}

/* ---- signals ---- */

static void copy_counts(rm_counts_t *d, const rk_obs_counts_t *c)
{
    d->current = c->current;
    d->peak = c->peak;
    d->total = c->total;
    d->count = c->count;
    d->live = c->live;
    d->peak_ns = c->peak_ns;
}

/* srec from the last normal record and what can be read safely now. */
static void fill_signal(int sig_index, int code)
{
    srec = base[atomic_load(&base_cur)];
    rankmem_resource_t *mr = rankmem_mpi_resource();
    if (mr && !in_fill) {
        /* Its lock guards the scope stack only; this thread does not hold
         * it (in_fill), and another one lets it go. */
        rankmem_stats_t s;
        memset(&s, 0, sizeof s);
        s.size = sizeof s;
        if (rankmem_stats_get(mr, &s) == RANKMEM_SUCCESS) {
            srec.bytes_peak = s.bytes_peak;
            srec.bytes_current = s.bytes_current;
            srec.bytes_total = s.bytes_total;
            srec.count_total = s.count_total;
            srec.count_peak = s.count_peak;
            srec.count_current = s.count_current;
        }
    }
    uint64_t now = now_ns();
    srec.wall_s = (double)(now - t0_ns) * 1e-9;
    rk_obs_summary_t sm;
    size_t ntl = 0;
    if (rk_obs_snapshot_try(&sm, ssamples, sizeof ssamples / sizeof ssamples[0], &ntl) == 0) {
        for (int k = 0; k < RM_OBS_NKINDS && k < RK_OBS_NKINDS; k++)
            copy_counts(&srec.obs.kind[k], &sm.program[k]);
        copy_counts(&srec.obs.gpu, &sm.program_gpu);
        copy_counts(&srec.obs.served, &sm.by[RK_OBS_SERVED][RK_OBS_DEVICE]);
        srec.obs.served.peak_ns = 0;
        srec.obs.rankmem_current = sm.by[RK_OBS_RANKMEM][RK_OBS_DEVICE].current;
        srec.obs.rankmem_peak = sm.by[RK_OBS_RANKMEM][RK_OBS_DEVICE].peak;
        srec.obs.events = sm.events;
        srec.obs.unmatched_frees = sm.unmatched_frees;
        srec.obs.untracked = sm.untracked;
        if (ntl) {
            for (size_t i = 0; i < ntl; i++) {
                st[i] = ssamples[i].t_ns;
                sv[i] = ssamples[i].bytes;
            }
            rm_timeline_resample(st, sv, ntl, sm.now_ns, srec.timeline);
        }
    }
    /* The first out-of-memory as it was written (no lock: a torn read of
     * a record being written costs a wrong number, never a hang). */
    if (atomic_load(&oom_count)) {
        srec.fail = oom;
        srec.fail.oom_count = atomic_load(&oom_count);
    } else {
        memset(&srec.fail, 0, sizeof srec.fail);
    }
    memcpy(srec.fail.kind, "signal", 7);
    memset(srec.fail.trigger, 0, sizeof srec.fail.trigger);
    memcpy(srec.fail.trigger, signames[sig_index], strlen(signames[sig_index]));
    srec.fail.code = code;
    srec.fail.t_ns = now - t0_ns;
    if (!srec.fail.oom_count) {
        /* A short sentence, without printf. */
        rm_buf_t d;
        rm_buf_fixed(&d, srec.fail.diagnosis, sizeof srec.fail.diagnosis);
        rm_puts(&d, "ended by ");
        rm_puts(&d, signames[sig_index]);
        rm_puts(&d, " after ");
        rm_put_u64(&d, (now - t0_ns) / 1000000000u);
        rm_puts(&d, " s with ");
        uint64_t live = srec.obs.gpu.current > srec.bytes_current ? srec.obs.gpu.current
                                                                   : srec.bytes_current;
        rm_put_u64(&d, live);
        rm_puts(&d, " bytes live");
    }
}

static int is_fault(int sig)
{
    return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL;
}

/* What would have happened without us. */
static void chain(int k, int sig, siginfo_t *si, void *uc)
{
    struct sigaction *o = &old_act[k];
    if (o->sa_flags & SA_SIGINFO) {
        void (*h)(int, siginfo_t *, void *) = o->sa_sigaction;
        if (o->sa_flags & SA_RESETHAND)
            o->sa_handler = SIG_DFL, o->sa_flags &= ~SA_SIGINFO;
        if (h)
            h(sig, si, uc);
        return;
    }
    if (o->sa_handler == SIG_IGN)
        return;
    if (o->sa_handler != SIG_DFL) {
        void (*h)(int) = o->sa_handler;
        if (o->sa_flags & SA_RESETHAND)
            o->sa_handler = SIG_DFL;
        h(sig);
        return;
    }
    /* The default action: a fault the kernel raised comes back when we
     * return, now with the default action; a sent signal is raised again. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    if (is_fault(sig) && si && si->si_code > 0)
        return;
    raise(sig);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
}

static void on_signal(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    int k = 0;
    while (k < NSIGS && sigs[k] != sig)
        k++;
    if (k == NSIGS) {
        errno = saved;
        return;
    }
    long tid = (long)syscall(SYS_gettid);
    if (on_failure && path[0] && !atomic_load(&terminal) && !atomic_exchange(&sig_busy, 1)) {
        atomic_store(&sig_tid, tid);
        atomic_store(&terminal, 1);
        rk_fail_in_handler = 1;
        fill_signal(k, sig);
        rm_buf_t b;
        rm_buf_fixed(&b, sdoc, sizeof sdoc);
        build_doc(&b, &srec, "failure", signames[k], 1);
        int ok = !b.oom && write_file(tmp_sig, b.p, b.len) == 0 && publish(tmp_sig, 1) == 0;
        rk_fail_in_handler = 0;
        say_safe(signames[k], ok ? ": record written to " : ": no record written ",
                 ok ? path : "(the file could not be written)");
        atomic_store(&sig_done, 1);
    } else if (atomic_load(&sig_busy) && !atomic_load(&sig_done) && atomic_load(&sig_tid) != tid) {
        /* Another thread is writing: let it finish (a bounded while). */
        for (int i = 0; i < 2000 && !atomic_load(&sig_done); i++) {
            struct timespec ms = {0, 1000000};
            nanosleep(&ms, NULL);
        }
    }
    int wrote = atomic_load(&sig_done) && atomic_load(&sig_tid) == tid;
    chain(k, sig, si, uc);
    /* Back here: a handler before ours (the program's, or the MPI
     * library's: MPICH's for SIGUSR1) dealt with the signal and the rank
     * goes on. Not a failure then: later events are recorded again, and
     * a finalize that comes removes the file as for any finished rank. */
    if (wrote) {
        atomic_store(&sig_done, 0);
        atomic_store(&terminal, 0);
        atomic_store(&sig_busy, 0);
    }
    errno = saved;
}

/* ---- the interval thread ---- */

static pthread_t interval_thread;
static int interval_running;
static pthread_mutex_t iv_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t iv_cond;
static int iv_stop;

static void *interval_main(void *arg)
{
    (void)arg;
    /* Signals go to the program's threads: this one holds locks (the
     * chain's stats) that a handler running here would wait for. */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    /* The rank's device current here once: a new thread's is device 0, and
     * switching back to it after each query (rk_mpi_gpu_meminfo) would
     * create a context on device 0 for a rank bound to another GPU (slow,
     * and memory of a GPU the rank must not touch). */
    int dev = rankmem_mpi_device();
    if (dev >= 0 && rk_mpi_gpu_count() > 0)
        (void)rk_mpi_gpu_set(dev);
    pthread_mutex_lock(&iv_lock);
    while (!iv_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + interval_ns % 1000000000u;
        ts.tv_sec += (time_t)(interval_ns / 1000000000u + ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        int rc = 0;
        while (!iv_stop && rc != ETIMEDOUT)
            rc = pthread_cond_timedwait(&iv_cond, &iv_lock, &ts);
        if (iv_stop)
            break;
        pthread_mutex_unlock(&iv_lock);
        if (!atomic_load(&terminal))
            (void)write_normal("interval", "", "RANKMEM_REPORT_INTERVAL", 0, 0, tmp_int);
        pthread_mutex_lock(&iv_lock);
    }
    pthread_mutex_unlock(&iv_lock);
    return NULL;
}

/* ---- start and stop ---- */

void rk_fail_start(int world_rank, int world_size)
{
    if (started)
        return;
    my_rank = world_rank;
    t0_ns = now_ns();
    find_job_id(world_rank);
    if (!on_failure || make_path(world_size) != 0) {
        path[0] = '\0';
        return;
    }
    started = 1;
    rm_record_t *r = calloc(1, sizeof *r);
    if (r) {
        fill_normal(r, 0);
        free(r);
    }
    /* Ours after the MPI library's (installed in PMPI_Init), which we then
     * call: its own handlers and whatever they chain to still run. */
    for (int k = 0; k < NSIGS; k++) {
        struct sigaction sa;
        if (sigaction(sigs[k], NULL, &old_act[k]) != 0 || old_act[k].sa_handler == SIG_IGN)
            continue; /* ignored (nohup, a launcher): not a failure */
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_signal;
        /* Interrupted calls restart as they did with the handler before. */
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | (old_act[k].sa_flags & SA_RESTART);
        sigemptyset(&sa.sa_mask);
        for (int j = 0; j < NSIGS; j++)
            sigaddset(&sa.sa_mask, sigs[j]);
        installed[k] = sigaction(sigs[k], &sa, NULL) == 0;
    }
    on_exit(on_exit_hook, NULL);
    if (interval_ns) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&iv_cond, &ca);
        pthread_condattr_destroy(&ca);
        interval_running = pthread_create(&interval_thread, NULL, interval_main, NULL) == 0;
        if (!interval_running)
            rk_mpi_warn("RANKMEM_REPORT_INTERVAL: cannot start its thread; no periodic record");
    }
}

void rk_fail_finishing(void)
{
    atomic_store(&finishing, 1);
    if (interval_running) {
        pthread_mutex_lock(&iv_lock);
        iv_stop = 1;
        pthread_cond_signal(&iv_cond);
        pthread_mutex_unlock(&iv_lock);
        pthread_join(interval_thread, NULL);
        interval_running = 0;
    }
}

void rk_fail_finished(void)
{
    /* The finalize report holds what the rank's file held (its
     * out-of-memory is in its record): the file goes, so that a
     * directory of a finished job holds no failure. */
    if (started && atomic_load(&written) && !atomic_load(&terminal))
        unlink(path);
}

const char *rk_fail_path(void) { return started ? path : NULL; }
