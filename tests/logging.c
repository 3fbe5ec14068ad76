/* The logging adaptor over a host upstream and over a pool: every line read
 * back and checked (header, columns, actions, pointers, sizes, streams,
 * times), failures logged, release flushes, 4 threads (exact line count,
 * per-thread order), RANKMEM_LOG_FILE, and every bad input. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

#define HEADER "Thread,Time,Action,Pointer,Size,Stream"
#define S(x) ((rankmem_stream_t)(uintptr_t)(x))

typedef struct {
    unsigned long thread;
    double time;
    char action[24];
    uintptr_t ptr;
    size_t size;
    uintptr_t stream;
} row_t;

static const char *digits(const char *p, int hex, unsigned long long *v)
{
    const char *s = p;
    unsigned long long x = 0;
    for (;; p++) {
        int d = *p >= '0' && *p <= '9' ? *p - '0'
                : hex && *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
                                                : -1;
        if (d < 0)
            break;
        x = x * (hex ? 16 : 10) + (unsigned)d;
    }
    if (p == s || (p - s > 1 && *s == '0')) /* no digits, or a leading zero */
        return NULL;
    *v = x;
    return p;
}

/* One line, strictly: exactly the six columns in the documented forms. */
static int parse_row(const char *line, row_t *r)
{
    unsigned long long v, us, frac;
    const char *p = digits(line, 0, &v);
    if (!p || *p++ != ',')
        return 0;
    r->thread = (unsigned long)v;
    if (!(p = digits(p, 0, &us)) || *p++ != '.')
        return 0;
    if (!(p[0] >= '0' && p[0] <= '9' && p[1] >= '0' && p[1] <= '9' && p[2] >= '0' && p[2] <= '9'))
        return 0;
    frac = (unsigned)(p[0] - '0') * 100u + (unsigned)(p[1] - '0') * 10u + (unsigned)(p[2] - '0');
    p += 3;
    r->time = (double)us + (double)frac / 1000.0;
    if (*p++ != ',')
        return 0;
    const char *comma = strchr(p, ',');
    if (!comma || (size_t)(comma - p) >= sizeof r->action)
        return 0;
    memcpy(r->action, p, (size_t)(comma - p));
    r->action[comma - p] = '\0';
    if (strcmp(r->action, "allocate") && strcmp(r->action, "allocate failure") &&
        strcmp(r->action, "free"))
        return 0;
    p = comma + 1;
    if (p[0] != '0' || p[1] != 'x' || !(p = digits(p + 2, 1, &v)) || *p++ != ',')
        return 0;
    r->ptr = (uintptr_t)v;
    if (!(p = digits(p, 0, &v)) || *p++ != ',')
        return 0;
    r->size = (size_t)v;
    if (p[0] != '0' || p[1] != 'x' || !(p = digits(p + 2, 1, &v)) || *p++ != '\n' || *p)
        return 0;
    r->stream = (uintptr_t)v;
    return 1;
}

/* Reads a log: checks the header, parses every row. Returns the row count,
 * or -1 (with a diagnostic) at the first malformed line. */
static long read_log(const char *path, row_t *rows, long cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char line[512];
    long n = 0;
    if (!fgets(line, sizeof line, f) || strcmp(line, HEADER "\n") != 0) {
        diag("bad header: %s", line);
        n = -1;
    }
    while (n >= 0 && fgets(line, sizeof line, f)) {
        row_t r;
        if (!parse_row(line, &r)) {
            diag("malformed line %ld: %s", n + 2, line);
            n = -1;
        } else if (n < cap) {
            rows[n++] = r;
        } else {
            n++;
        }
    }
    fclose(f);
    return n;
}

static char *temp_path(void)
{
    static char paths[8][64];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 64, "/tmp/rankmem-logging-XXXXXX");
    int fd = mkstemp(p);
    if (fd < 0)
        BAIL_OUT("mkstemp");
    close(fd);
    return p;
}

typedef struct {
    const char *action;
    void *ptr;
    size_t size;
    uintptr_t stream;
} event_t;

/* A known sequence on one thread, then the log compared line by line. */
static void sequence(const char *name, rankmem_resource_t *up, size_t big)
{
    char *path = temp_path();
    rankmem_resource_t *lg;
    is_status(rankmem_logging_create(up, path, &lg), RANKMEM_SUCCESS, "%s: logging_create", name);
    event_t ev[16];
    int n = 0;
    void *a, *b, *c, *x = (void *)0x1;
    rankmem_allocate(lg, 1000, 0, &a);
    ev[n++] = (event_t){"allocate", a, 1000, 0};
    rankmem_allocate_async(lg, 4096, 0, S(0x7f00ab), &b);
    ev[n++] = (event_t){"allocate", b, 4096, 0x7f00ab};
    is_status(rankmem_allocate(lg, big, 0, &x), RANKMEM_ERR_OUT_OF_MEMORY, "%s: a refused allocate", name);
    ok(x == (void *)0x1, "%s: output untouched on failure", name);
    ev[n++] = (event_t){"allocate failure", NULL, big, 0};
    rankmem_deallocate(lg, a, 1000, 0);
    ev[n++] = (event_t){"free", a, 1000, 0};
    rankmem_allocate(lg, 1, 0, &c);
    ev[n++] = (event_t){"allocate", c, 1, 0};
    rankmem_deallocate_async(lg, b, 4096, 0, S(0x7f00ab));
    ev[n++] = (event_t){"free", b, 4096, 0x7f00ab};
    is_status(rankmem_logging_flush(lg), RANKMEM_SUCCESS, "%s: flush", name);
    row_t rows[32];
    long got = read_log(path, rows, 32);
    ok(got == n, "%s: %d lines after the header (%ld)", name, n, got);
    int good = got == n;
    double last = -1;
    for (int i = 0; good && i < n; i++) {
        good = rows[i].thread == 0 && strcmp(rows[i].action, ev[i].action) == 0 &&
               rows[i].ptr == (uintptr_t)ev[i].ptr && rows[i].size == ev[i].size &&
               rows[i].stream == ev[i].stream && rows[i].time >= last;
        last = rows[i].time;
        if (!good)
            diag("line %d: %lu %.3f %s 0x%lx %zu 0x%lx", i + 2, rows[i].thread, rows[i].time,
                 rows[i].action, (unsigned long)rows[i].ptr, rows[i].size,
                 (unsigned long)rows[i].stream);
    }
    ok(good, "%s: every line: thread 0, action, pointer, size, stream, time in order", name);
    ok(got > 0 && rows[0].time < 10e6, "%s: times count from creation (first %.3f us)", name,
       got > 0 ? rows[0].time : -1.0);

    rankmem_deallocate(lg, c, 1, 0); /* stays in the buffer until release */
    char buf[128];
    int len = lg->ops->describe(lg, buf, sizeof buf);
    char want[128];
    snprintf(want, sizeof want, "logging(file=%s)", path);
    ok(len == (int)strlen(want) && strcmp(buf, want) == 0, "%s: describe: %s", name, buf);
    /* Release writes what is buffered. */
    is_status(rankmem_resource_release(lg), RANKMEM_SUCCESS, "%s: released", name);
    got = read_log(path, rows, 32);
    ok(got == n + 1 && strcmp(rows[n].action, "free") == 0 && rows[n].ptr == (uintptr_t)c,
       "%s: release flushed the last line", name);
    unlink(path);
}

static void refused_free_not_logged(void)
{
    char *path = temp_path();
    rankmem_resource_t *sys, *tr, *lg;
    rankmem_system_create(&sys);
    rankmem_tracking_create(sys, 0, &tr); /* refuses frees it does not know */
    rankmem_logging_create(tr, path, &lg);
    static _Alignas(256) char foreign[256];
    is_status(rankmem_deallocate(lg, foreign, 256, 0), RANKMEM_ERR_INVALID_POINTER,
              "a free the upstream refuses fails through logging");
    rankmem_logging_flush(lg);
    row_t rows[4];
    ok(read_log(path, rows, 4) == 0, "and leaves no line");
    rankmem_resource_release(lg);
    rankmem_resource_release(tr);
    rankmem_resource_release(sys);
    unlink(path);
}

/* ---- threads ---- */

#define NT 4
#define PAIRS 3000 /* ~150 KiB of lines per thread: each buffer fills twice */

typedef struct {
    rankmem_resource_t *mr;
    int id, errors;
} lw_t;

static void *lworker(void *arg)
{
    lw_t *w = arg;
    for (int i = 0; i < PAIRS; i++) {
        void *p;
        size_t n = 256 + (size_t)w->id * 1000 + (size_t)(i % 100);
        if (rankmem_allocate_async(w->mr, n, 0, S(w->id + 1), &p) != RANKMEM_SUCCESS) {
            w->errors++;
            continue;
        }
        if (rankmem_deallocate_async(w->mr, p, n, 0, S(w->id + 1)) != RANKMEM_SUCCESS)
            w->errors++;
    }
    return NULL;
}

static void threads(void)
{
    char *path = temp_path();
    rankmem_resource_t *sys, *lg;
    rankmem_system_create(&sys);
    rankmem_logging_create(sys, path, &lg);
    rankmem_resource_release(sys);
    pthread_t t[NT];
    lw_t w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (lw_t){lg, i, 0};
        pthread_create(&t[i], NULL, lworker, &w[i]);
    }
    int errors = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    ok(errors == 0, "%d threads: every call succeeded", NT);
    is_status(rankmem_logging_flush(lg), RANKMEM_SUCCESS, "%d threads: flush (their buffers outlive them)", NT);
    long cap = NT * PAIRS * 2 + 16;
    row_t *rows = malloc((size_t)cap * sizeof *rows);
    long got = read_log(path, rows, cap);
    ok(got == NT * PAIRS * 2, "%d threads: exactly %d well-formed lines (%ld)", NT, NT * PAIRS * 2, got);
    /* Per thread id: its stream, sizes in its own range, allocate/free
     * alternating on the same pointer, times in order. */
    long per[NT] = {0};
    int bad = got < 0, ids = 0;
    uintptr_t stream_of[NT] = {0}, pending[NT] = {0};
    double last[NT];
    for (int i = 0; i < NT; i++)
        last[i] = -1;
    for (long i = 0; !bad && i < got; i++) {
        row_t *r = &rows[i];
        if (r->thread >= NT) {
            bad = 1;
            break;
        }
        unsigned k = (unsigned)r->thread;
        if (!stream_of[k]) {
            stream_of[k] = r->stream;
            ids++;
        }
        int is_alloc = strcmp(r->action, "allocate") == 0;
        size_t lo = 256 + (r->stream - 1) * 1000;
        bad = r->stream != stream_of[k] || r->size < lo || r->size >= lo + 100 || r->time < last[k] ||
              (is_alloc ? pending[k] != 0 : pending[k] != r->ptr);
        pending[k] = is_alloc ? r->ptr : 0;
        last[k] = r->time;
        per[k]++;
    }
    ok(!bad && ids == NT, "%d threads: ids 0..%d, each thread's rows in order and consistent", NT, NT - 1);
    int even = 1;
    for (int i = 0; i < NT; i++)
        even &= per[i] == 2 * PAIRS;
    ok(even, "%d threads: %d lines for each", NT, 2 * PAIRS);
    free(rows);
    rankmem_resource_release(lg);
    unlink(path);
}

/* ---- RANKMEM_LOG_FILE and bad inputs ---- */

/* RANKMEM_* options are read once per process, so each value of
 * RANKMEM_LOG_FILE is tried in a fresh process: this program re-executed
 * with "env-case N", answering through its exit status. */
static int env_case(int k, const char *path)
{
    rankmem_resource_t *sys, *lg = (rankmem_resource_t *)0x1;
    rankmem_system_create(&sys);
    rankmem_status_t st = rankmem_logging_create(sys, NULL, &lg);
    const char *err = rankmem_last_error();
    int good = 0;
    switch (k) {
    case 0: /* unset */
    case 1: /* empty */
        good = st == RANKMEM_ERR_CONFIG && strstr(err, "RANKMEM_LOG_FILE") &&
               lg == (rankmem_resource_t *)0x1;
        break;
    case 2: { /* a path */
        if (st != RANKMEM_SUCCESS)
            break;
        void *p;
        rankmem_allocate(lg, 512, 0, &p);
        rankmem_deallocate(lg, p, 512, 0);
        rankmem_logging_flush(lg);
        row_t rows[4];
        char buf[64] = "";
        lg->ops->describe(lg, buf, sizeof buf);
        good = read_log(path, rows, 4) == 2 && rows[0].size == 512 &&
               strcmp(rows[1].action, "free") == 0 && strcmp(buf, "logging") == 0;
        rankmem_resource_release(lg);
        break;
    }
    case 3: /* not writable */
        good = st == RANKMEM_ERR_CONFIG && strstr(err, "/nonexistent-dir/log.csv") &&
               strstr(err, "RANKMEM_LOG_FILE");
        break;
    }
    rankmem_resource_release(sys);
    return good ? 0 : 1;
}

static int run_case(int k, const char *value)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (value)
            setenv("RANKMEM_LOG_FILE", value, 1);
        else
            unsetenv("RANKMEM_LOG_FILE");
        setenv("RANKMEM_QUIET", "1", 1);
        char kbuf[8];
        snprintf(kbuf, sizeof kbuf, "%d", k);
        char *argv[] = {"logging.t", "env-case", kbuf, (char *)(value ? value : ""), NULL};
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void environment(void)
{
    ok(run_case(0, NULL) == 0, "no path, no RANKMEM_LOG_FILE: a config error naming the variable");
    ok(run_case(1, "") == 0, "RANKMEM_LOG_FILE empty: a config error");
    char *path = temp_path();
    ok(run_case(2, path) == 0,
       "path from RANKMEM_LOG_FILE: its lines are in that file; describe leaves it out");
    unlink(path);
    ok(run_case(3, "/nonexistent-dir/log.csv") == 0,
       "RANKMEM_LOG_FILE not writable: the detail names the file and the variable");
}

static void bad_inputs(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_resource_t *lg = (rankmem_resource_t *)0x1;
    is_status(rankmem_logging_create(NULL, "/tmp/x", &lg), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL upstream");
    is_status(rankmem_logging_create(&up->base, "/tmp/x", NULL), RANKMEM_ERR_INVALID_ARGUMENT, "create: NULL output");
    is_status(rankmem_logging_create(&up->base, "", &lg), RANKMEM_ERR_INVALID_ARGUMENT, "create: empty path");
    is_status(rankmem_logging_create(&up->base, "/nonexistent-dir/x.csv", &lg), RANKMEM_ERR_CONFIG,
              "create: a path that cannot be opened");
    ok(strstr(rankmem_last_error(), "/nonexistent-dir/x.csv") != NULL, "the detail names it: %s",
       rankmem_last_error());
    ok(lg == (rankmem_resource_t *)0x1, "create: output untouched on every failure");
    ok(up->base.refcount == 1, "create: failures leave no reference on the upstream");
    is_status(rankmem_logging_flush(NULL), RANKMEM_ERR_INVALID_ARGUMENT, "flush: NULL resource");
    is_status(rankmem_logging_flush(&up->base), RANKMEM_ERR_INVALID_ARGUMENT, "flush: not a logging adaptor");
    ok(strstr(rankmem_last_error(), "counting") != NULL, "flush: the detail names the resource: %s",
       rankmem_last_error());
    char *path = temp_path();
    rankmem_logging_create(&up->base, path, &lg);
    ok(lg->props == up->base.props && lg->device == up->base.device && lg->upstream == &up->base,
       "properties, device and upstream are the upstream's");
    size_t v;
    is_status(rankmem_resource_query(lg, RANKMEM_QUERY_USED_CURRENT, &v), RANKMEM_ERR_NOT_SUPPORTED,
              "queries go to the upstream (which answers none)");
    rankmem_resource_release(lg);
    unlink(path);
    rankmem_resource_release(&up->base);
    ok(finalized, "the chain is gone");
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "env-case") == 0)
        return env_case(atoi(argv[2]), argv[3]);
    int finalized;
    counting_t *up = counting_new(&finalized);
    up->fail_above = 1 << 20;
    sequence("counting", &up->base, 2 << 20);
    ok(up->outstanding_blocks == 0 && up->allocs == 3 && up->frees == 3,
       "counting: every call went through once");
    rankmem_resource_release(&up->base);

    rankmem_resource_t *sys, *pool;
    rankmem_system_create(&sys);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 1 << 20;
    prm.maximum_size = 1 << 20;
    rankmem_pool_create(sys, &prm, &pool);
    rankmem_resource_release(sys);
    sequence("pool", pool, 2 << 20);
    rankmem_resource_release(pool);

    refused_free_not_logged();
    threads();
    environment();
    bad_inputs();
    return tap_done();
}
