/* rankmem-replay: replays allocation logs (the logging adaptor's CSV, and the
 * recorded traces in ../shared/traces and bench/traces) against a resource
 * chain, and reports what each operation cost and how much memory the chain
 * needed for what the trace kept live: its top suballocator's own
 * high-water mark, or what it took from its upstream (reserved_high). The
 * chain is the spec over a stats probe over the spec's leaf (or the
 * simulated upstream), built with rankmem_resource_from_spec_upstream.
 *
 *   rankmem-replay [--spec SPEC] [--repeat N] [--warm] [--simulate]
 *                  [--sim-memory SIZE] [--json] TRACE.csv...
 *
 * Every trace is read and checked whole before anything is replayed; a
 * malformed one is refused with "file:line: what is wrong" and exit status 1.
 * Then each is resolved into an array of operations (allocate/free, size,
 * slot in a table of live blocks, thread, stream) so that the timed replay
 * does no parsing and no lookups. docs/replay.md has the details. */
#define _GNU_SOURCE
#include <config.h>

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/futex.h>

#include <rankmem.h>

#if HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define HEADER "Thread,Time,Action,Pointer,Size,Stream"
#define DEFAULT_SIM_MEMORY ((size_t)80 << 30) /* an H100's 80 GiB */

enum { ACT_ALLOC = 0, ACT_FREE = 1, ACT_FAILURE = 2 };

/* ---- small helpers ------------------------------------------------------- */

static const char *prog = "rankmem-replay";

static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fatal("out of host memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        fatal("out of host memory (%zu x %zu bytes)", n, size);
    return p;
}

static char *xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        fatal("out of host memory");
    return d;
}

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (!p)
        fatal("out of host memory (%zu bytes)", n);
    return p;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *human(char *buf, size_t len, size_t bytes)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4)
        v /= 1024.0, u++;
    if (u == 0)
        snprintf(buf, len, "%zu B", bytes);
    else
        snprintf(buf, len, "%.2f %s", v, units[u]);
    return buf;
}

/* What went wrong: the thread's last error (which names the status), else the status. */
static const char *errmsg(rankmem_status_t st)
{
    static _Thread_local char buf[256];
    const char *e = rankmem_last_error();
    if (!*e)
        return rankmem_status_string(st);
    size_t n = strlen(e);
    while (n && (e[n - 1] == ' ' || e[n - 1] == ':')) /* "out of memory: " with no detail */
        n--;
    snprintf(buf, sizeof buf, "%.*s", (int)n, e);
    return buf;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ---- u64 -> u32 open-addressing map (threads, streams, pointers) -------- */

typedef struct {
    uint64_t *keys;
    uint32_t *vals; /* UINT32_MAX: empty */
    size_t cap, n;
} u64map_t;

static uint64_t hash64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static void map_init(u64map_t *m, size_t expect)
{
    size_t cap = 16;
    while (cap < 2 * expect)
        cap *= 2;
    m->cap = cap;
    m->n = 0;
    m->keys = xmalloc(cap * sizeof *m->keys);
    m->vals = xmalloc(cap * sizeof *m->vals);
    memset(m->vals, 0xff, cap * sizeof *m->vals);
}

static void map_free(u64map_t *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

/* The value slot of key; a new key gets UINT32_MAX (the caller sets it). */
static uint32_t *map_slot(u64map_t *m, uint64_t key)
{
    if (2 * (m->n + 1) > m->cap) {
        u64map_t g;
        map_init(&g, m->cap);
        for (size_t i = 0; i < m->cap; i++)
            if (m->vals[i] != UINT32_MAX)
                *map_slot(&g, m->keys[i]) = m->vals[i];
        map_free(m);
        *m = g;
    }
    size_t mask = m->cap - 1, i = hash64(key) & mask;
    while (m->vals[i] != UINT32_MAX && m->keys[i] != key)
        i = (i + 1) & mask;
    if (m->vals[i] == UINT32_MAX) {
        m->keys[i] = key;
        m->n++;
    }
    return &m->vals[i];
}

/* Get the index of key, adding it as the next index when new. */
static uint32_t map_index(u64map_t *m, uint64_t key, uint32_t next)
{
    uint32_t *v = map_slot(m, key);
    if (*v == UINT32_MAX)
        *v = next;
    return *v;
}

/* ---- traces -------------------------------------------------------------- */

/* One operation of the replay: 24 bytes, in the order they execute. */
typedef struct {
    size_t size;
    uint32_t slot;   /* index into the table of live blocks */
    uint32_t line;   /* in the file, for messages */
    uint32_t thread; /* index into the trace's threads */
    uint16_t stream; /* index into the trace's streams */
    uint8_t kind;    /* ACT_ALLOC or ACT_FREE */
} op_t;

typedef struct {
    const char *path;
    const char *name; /* basename */
    op_t *ops;
    size_t nops, nevents, nalloc, nfree, nfailure_lines;
    size_t nslots;
    uint32_t nthreads, nstreams;
    uint64_t *stream_vals; /* trace value of each stream index */
    size_t peak_live, peak_live_count, end_live, end_live_count;
    double duration_us;
    int sorted; /* the file was in time order */
} trace_t;

/* A line as read: pass 1 keeps these, pass 2 (in time order) resolves them. */
typedef struct {
    double time;
    uint64_t ptr, size, stream;
    uint32_t line, thread;
    uint8_t action;
} rec_t;

static char *read_whole(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fatal("%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (len + 1 >= cap)
            buf = xrealloc(buf, cap *= 2);
        size_t n = fread(buf + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0)
            break;
    }
    if (ferror(f))
        fatal("%s: read error: %s", path, strerror(errno));
    fclose(f);
    buf[len] = '\0';
    *len_p = len;
    return buf;
}

static int parse_dec(const char *s, size_t n, uint64_t *v)
{
    if (n == 0 || n > 20)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

static int parse_hex(const char *s, size_t n, uint64_t *v)
{
    if (n < 3 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X'))
        return -1;
    s += 2, n -= 2;
    while (n > 1 && *s == '0') /* leading zeros do not count towards 16 digits */
        s++, n--;
    if (n > 16)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return -1;
        x = x << 4 | d;
    }
    *v = x;
    return 0;
}

/* Integer or decimal microseconds: digits, optionally '.' and digits. */
static int parse_time(const char *s, size_t n, double *v)
{
    size_t i = 0, int_digits = 0, frac_digits = 0;
    double x = 0, scale = 1;
    while (i < n && s[i] >= '0' && s[i] <= '9')
        x = x * 10 + (s[i++] - '0'), int_digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            scale /= 10, x += (s[i++] - '0') * scale, frac_digits++;
        if (!frac_digits)
            return -1;
    }
    if (i != n || !int_digits || int_digits > 18)
        return -1;
    *v = x;
    return 0;
}

static const char *quote_field(char *buf, size_t len, const char *s, size_t n)
{
    if (n > 40)
        snprintf(buf, len, "'%.40s...'", s);
    else
        snprintf(buf, len, "'%.*s'", (int)n, s);
    return buf;
}

static void bad(const char *path, size_t line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));
static void bad(const char *path, size_t line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%zu: ", path, line);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static int cmp_rec_time(const void *a, const void *b)
{
    const rec_t *x = a, *y = b;
    if (x->time != y->time)
        return x->time < y->time ? -1 : 1;
    return (x->line > y->line) - (x->line < y->line);
}

/* What the pointer map keeps per address. */
typedef struct {
    uint64_t size;
    uint32_t slot, line; /* line: of the allocate while live, of the free after */
    int live;
} ptrinfo_t;

static void load_trace(const char *path, trace_t *t)
{
    memset(t, 0, sizeof *t);
    t->path = path;
    const char *slash = strrchr(path, '/');
    t->name = slash ? slash + 1 : path;

    size_t len;
    char *buf = read_whole(path, &len);
    char *p = buf, *end = buf + len;
    char q[64];

    /* Header. */
    char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t hl = nl ? (size_t)(nl - p) : (size_t)(end - p);
    if (hl && p[hl - 1] == '\r')
        hl--;
    if (hl >= 3 && (unsigned char)p[0] == 0xef && (unsigned char)p[1] == 0xbb &&
        (unsigned char)p[2] == 0xbf)
        p += 3, hl -= 3; /* a UTF-8 byte order mark */
    if (len == 0)
        bad(path, 1, "empty file: expected the header %s", HEADER);
    if (hl != strlen(HEADER) || memcmp(p, HEADER, hl) != 0)
        bad(path, 1, "expected the header %s, found %s", HEADER, quote_field(q, sizeof q, p, hl));
    p = nl ? nl + 1 : end;

    /* Pass 1: every line to a record, in file order. */
    size_t cap = 1024, n = 0;
    rec_t *recs = xmalloc(cap * sizeof *recs);
    u64map_t threads;
    map_init(&threads, 64);
    double *thread_last = xmalloc(64 * sizeof *thread_last);
    uint32_t *thread_last_line = xmalloc(64 * sizeof *thread_last_line);
    size_t thread_cap = 64;
    uint32_t nthreads = 0;
    size_t line = 1;
    int sorted = 1;
    double last_time = 0;
    while (p < end) {
        line++;
        if (line > UINT32_MAX)
            bad(path, line, "too many lines");
        nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        if (le > p && le[-1] == '\r')
            le--;
        if (le == p)
            bad(path, line, "empty line: expected 6 columns (%s)", HEADER);
        const char *f[6];
        size_t fl[6];
        int nf = 0;
        const char *s = p;
        for (const char *c = p;; c++) {
            if (c == le || *c == ',') {
                if (nf < 6)
                    f[nf] = s, fl[nf] = (size_t)(c - s);
                nf++;
                s = c + 1;
                if (c == le)
                    break;
            }
        }
        if (nf != 6)
            bad(path, line, "expected 6 columns (%s), found %d", HEADER, nf);
        rec_t r;
        memset(&r, 0, sizeof r);
        r.line = (uint32_t)line;
        uint64_t th;
        if (parse_dec(f[0], fl[0], &th))
            bad(path, line, "bad Thread %s: expected a decimal integer",
                quote_field(q, sizeof q, f[0], fl[0]));
        if (parse_time(f[1], fl[1], &r.time))
            bad(path, line, "bad Time %s: expected microseconds, an integer or a decimal",
                quote_field(q, sizeof q, f[1], fl[1]));
        if (fl[2] == 8 && !memcmp(f[2], "allocate", 8))
            r.action = ACT_ALLOC;
        else if (fl[2] == 4 && !memcmp(f[2], "free", 4))
            r.action = ACT_FREE;
        else if (fl[2] == 16 && !memcmp(f[2], "allocate failure", 16))
            r.action = ACT_FAILURE;
        else
            bad(path, line, "bad Action %s: expected allocate, allocate failure or free",
                quote_field(q, sizeof q, f[2], fl[2]));
        if (parse_hex(f[3], fl[3], &r.ptr))
            bad(path, line, "bad Pointer %s: expected 0x and hexadecimal digits",
                quote_field(q, sizeof q, f[3], fl[3]));
        if (parse_dec(f[4], fl[4], &r.size))
            bad(path, line, "bad Size %s: expected bytes, a decimal integer",
                quote_field(q, sizeof q, f[4], fl[4]));
        if (parse_hex(f[5], fl[5], &r.stream))
            bad(path, line, "bad Stream %s: expected 0x and hexadecimal digits",
                quote_field(q, sizeof q, f[5], fl[5]));
        if (r.action != ACT_FAILURE && r.ptr == 0)
            bad(path, line, "%s of a null pointer", r.action == ACT_ALLOC ? "allocate" : "free");
        if (r.action != ACT_FAILURE && r.size == 0)
            bad(path, line, "%s of 0 bytes", r.action == ACT_ALLOC ? "allocate" : "free");
        if (r.size > SIZE_MAX / 2)
            bad(path, line, "Size %" PRIu64 " is larger than this machine can address", r.size);

        r.thread = map_index(&threads, th, nthreads);
        if (r.thread == nthreads) {
            if (nthreads == UINT16_MAX)
                bad(path, line, "more than %u threads", (unsigned)UINT16_MAX);
            if (nthreads == thread_cap) {
                thread_cap *= 2;
                thread_last = xrealloc(thread_last, thread_cap * sizeof *thread_last);
                thread_last_line =
                    xrealloc(thread_last_line, thread_cap * sizeof *thread_last_line);
            }
            thread_last[nthreads] = r.time;
            thread_last_line[nthreads] = r.line;
            nthreads++;
        }
        /* One thread's lines are in its order: its time never goes back. */
        if (r.time < thread_last[r.thread])
            bad(path, line, "Time %.*s is earlier than line %" PRIu32 " of the same thread (%" PRIu64
                "): a thread's lines must be in its order", (int)fl[1], f[1],
                thread_last_line[r.thread], th);
        thread_last[r.thread] = r.time;
        thread_last_line[r.thread] = r.line;
        if (n && r.time < last_time)
            sorted = 0;
        last_time = r.time;
        if (n == cap)
            recs = xrealloc(recs, (cap *= 2) * sizeof *recs);
        recs[n++] = r;
        p = nl ? nl + 1 : end;
    }
    free(buf);
    free(thread_last);
    free(thread_last_line);
    map_free(&threads);

    /* Threads' lines interleave by buffer in a logging adaptor's file: the
     * global order is time order, stable. */
    t->sorted = sorted;
    if (!sorted)
        qsort(recs, n, sizeof *recs, cmp_rec_time);

    /* Pass 2, in time order: pointers, slots, streams, live bytes. */
    t->nevents = n;
    t->nthreads = nthreads;
    t->ops = xmalloc((n ? n : 1) * sizeof *t->ops);
    u64map_t ptrs, streams;
    map_init(&ptrs, n / 2 + 16);
    map_init(&streams, 16);
    size_t info_cap = 1024, ninfo = 0;
    ptrinfo_t *info = xmalloc(info_cap * sizeof *info);
    size_t stream_cap = 16;
    t->stream_vals = xmalloc(stream_cap * sizeof *t->stream_vals);
    t->nstreams = 0;
    uint32_t *free_slots = xmalloc((n ? n : 1) * sizeof *free_slots);
    size_t nfree_slots = 0, nslots = 0, live = 0, live_count = 0;
    for (size_t i = 0; i < n; i++) {
        const rec_t *r = &recs[i];
        if (r->action == ACT_FAILURE) {
            t->nfailure_lines++;
            continue;
        }
        uint32_t sidx = map_index(&streams, r->stream, t->nstreams);
        if (sidx == t->nstreams) {
            if (t->nstreams == UINT16_MAX)
                bad(path, r->line, "more than %u streams", (unsigned)UINT16_MAX);
            if (t->nstreams == stream_cap)
                t->stream_vals =
                    xrealloc(t->stream_vals, (stream_cap *= 2) * sizeof *t->stream_vals);
            t->stream_vals[t->nstreams++] = r->stream;
        }
        uint32_t *pv = map_slot(&ptrs, r->ptr);
        op_t *op = &t->ops[t->nops];
        op->line = r->line;
        op->thread = r->thread;
        op->stream = (uint16_t)sidx;
        op->size = (size_t)r->size;
        if (r->action == ACT_ALLOC) {
            ptrinfo_t *pi;
            if (*pv == UINT32_MAX) {
                if (ninfo == info_cap)
                    info = xrealloc(info, (info_cap *= 2) * sizeof *info);
                *pv = (uint32_t)ninfo;
                pi = &info[ninfo++];
            } else {
                pi = &info[*pv];
                if (pi->live)
                    bad(path, r->line,
                        "allocate of 0x%" PRIx64 ", which is still live (allocated at line %" PRIu32
                        ", %" PRIu64 " bytes)", r->ptr, pi->line, pi->size);
            }
            pi->live = 1;
            pi->size = r->size;
            pi->line = r->line;
            pi->slot = nfree_slots ? free_slots[--nfree_slots] : (uint32_t)nslots++;
            op->kind = ACT_ALLOC;
            op->slot = pi->slot;
            live += (size_t)r->size;
            live_count++;
            if (live > t->peak_live)
                t->peak_live = live;
            if (live_count > t->peak_live_count)
                t->peak_live_count = live_count;
            t->nalloc++;
        } else {
            if (*pv == UINT32_MAX)
                bad(path, r->line, "free of 0x%" PRIx64 ", which was never allocated", r->ptr);
            ptrinfo_t *pi = &info[*pv];
            if (!pi->live)
                bad(path, r->line, "free of 0x%" PRIx64 ", which was already freed at line %" PRIu32,
                    r->ptr, pi->line);
            if (pi->size != r->size)
                bad(path, r->line,
                    "free of 0x%" PRIx64 " with size %" PRIu64 ", but it was allocated with size %"
                    PRIu64 " at line %" PRIu32, r->ptr, r->size, pi->size, pi->line);
            pi->live = 0;
            pi->line = r->line;
            free_slots[nfree_slots++] = pi->slot;
            op->kind = ACT_FREE;
            op->slot = pi->slot;
            live -= (size_t)r->size;
            live_count--;
            t->nfree++;
        }
        t->nops++;
    }
    t->nslots = nslots;
    t->end_live = live;
    t->end_live_count = live_count;
    t->duration_us = n ? recs[n - 1].time - recs[0].time : 0;
    free(free_slots);
    free(info);
    free(recs);
    map_free(&ptrs);
    map_free(&streams);
}

/* ---- the simulated upstream: address space, never touched --------------- */

/* A range of virtual address space reserved with PROT_NONE and
 * MAP_NORESERVE: it costs no memory, and neither do the addresses it hands
 * out, as long as nobody touches them. Suballocators keep their bookkeeping
 * on the host and never write to their blocks, so a trace that needs 18 GiB
 * replays on a machine with less. First fit over an address-ordered list of
 * free ranges, coalescing, then the bump pointer. */
typedef struct {
    char *base;
    size_t cap, top, outstanding, outstanding_blocks;
    pthread_mutex_t lock;
    struct range {
        size_t off, len;
    } *free;
    size_t nfree, free_cap;
} sim_t;

#define SIM_UNIT ((size_t)4096)

static rankmem_status_t sim_alloc(void *arg, size_t bytes, size_t alignment,
                                  rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    sim_t *s = arg;
    if (alignment < SIM_UNIT)
        alignment = SIM_UNIT;
    if (bytes > s->cap)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    size_t len = (bytes + SIM_UNIT - 1) & ~(SIM_UNIT - 1);
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->nfree; i++) {
        struct range *r = &s->free[i];
        size_t a = (r->off + alignment - 1) & ~(alignment - 1);
        if (a + len > r->off + r->len)
            continue;
        size_t head = a - r->off, tail = r->off + r->len - (a + len);
        if (head && tail) { /* split in two */
            if (s->nfree == s->free_cap)
                s->free = xrealloc(s->free, (s->free_cap = s->free_cap * 2 + 8) * sizeof *s->free);
            r = &s->free[i];
            memmove(&s->free[i + 2], &s->free[i + 1], (s->nfree - i - 1) * sizeof *s->free);
            s->free[i + 1].off = a + len;
            s->free[i + 1].len = tail;
            r->len = head;
            s->nfree++;
        } else if (head) {
            r->len = head;
        } else if (tail) {
            r->off = a + len;
            r->len = tail;
        } else {
            memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof *s->free);
            s->nfree--;
        }
        s->outstanding += len;
        s->outstanding_blocks++;
        pthread_mutex_unlock(&s->lock);
        *ptr_p = s->base + a;
        return RANKMEM_SUCCESS;
    }
    size_t a = (s->top + alignment - 1) & ~(alignment - 1);
    if (a > s->cap || len > s->cap - a) {
        pthread_mutex_unlock(&s->lock);
        return RANKMEM_ERR_OUT_OF_MEMORY;
    }
    if (a > s->top) { /* the alignment gap becomes a free range at the end */
        if (s->nfree == s->free_cap)
            s->free = xrealloc(s->free, (s->free_cap = s->free_cap * 2 + 8) * sizeof *s->free);
        if (s->nfree && s->free[s->nfree - 1].off + s->free[s->nfree - 1].len == s->top)
            s->free[s->nfree - 1].len += a - s->top;
        else
            s->free[s->nfree].off = s->top, s->free[s->nfree++].len = a - s->top;
    }
    s->top = a + len;
    s->outstanding += len;
    s->outstanding_blocks++;
    pthread_mutex_unlock(&s->lock);
    *ptr_p = s->base + a;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t sim_free(void *arg, void *ptr, size_t bytes, size_t alignment,
                                 rankmem_stream_t stream)
{
    (void)alignment;
    (void)stream;
    sim_t *s = arg;
    size_t off = (size_t)((char *)ptr - s->base);
    size_t len = (bytes + SIM_UNIT - 1) & ~(SIM_UNIT - 1);
    pthread_mutex_lock(&s->lock);
    if ((char *)ptr < s->base || off + len > s->top) {
        pthread_mutex_unlock(&s->lock);
        return RANKMEM_ERR_INVALID_POINTER;
    }
    /* Insert in address order, merging with the neighbours. */
    size_t i = 0;
    while (i < s->nfree && s->free[i].off < off)
        i++;
    if ((i > 0 && s->free[i - 1].off + s->free[i - 1].len > off) ||
        (i < s->nfree && off + len > s->free[i].off)) {
        pthread_mutex_unlock(&s->lock);
        return RANKMEM_ERR_INVALID_POINTER; /* overlaps a free range: double free */
    }
    int merge_prev = i > 0 && s->free[i - 1].off + s->free[i - 1].len == off;
    int merge_next = i < s->nfree && off + len == s->free[i].off;
    if (merge_prev && merge_next) {
        s->free[i - 1].len += len + s->free[i].len;
        memmove(&s->free[i], &s->free[i + 1], (s->nfree - i - 1) * sizeof *s->free);
        s->nfree--;
    } else if (merge_prev) {
        s->free[i - 1].len += len;
    } else if (merge_next) {
        s->free[i].off = off;
        s->free[i].len += len;
    } else {
        if (s->nfree == s->free_cap)
            s->free = xrealloc(s->free, (s->free_cap = s->free_cap * 2 + 8) * sizeof *s->free);
        memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof *s->free);
        s->free[i].off = off;
        s->free[i].len = len;
        s->nfree++;
    }
    /* A free range that reaches the bump pointer goes back to it. */
    if (s->nfree && s->free[s->nfree - 1].off + s->free[s->nfree - 1].len == s->top) {
        s->top = s->free[s->nfree - 1].off;
        s->nfree--;
    }
    s->outstanding -= len;
    s->outstanding_blocks--;
    pthread_mutex_unlock(&s->lock);
    return RANKMEM_SUCCESS;
}

static void sim_init(sim_t *s, size_t cap)
{
    memset(s, 0, sizeof *s);
    cap = (cap + SIM_UNIT - 1) & ~(SIM_UNIT - 1);
    void *p = mmap(NULL, cap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        fatal("--simulate: cannot reserve %zu bytes of address space: %s", cap, strerror(errno));
    s->base = p;
    s->cap = cap;
    pthread_mutex_init(&s->lock, NULL);
}

static void sim_destroy(sim_t *s)
{
    munmap(s->base, s->cap);
    pthread_mutex_destroy(&s->lock);
    free(s->free);
}

/* ---- building the chain --------------------------------------------------- */

/* The simulated upstream as a resource of our own: it answers
 * RANKMEM_QUERY_POOL_MAX with its size, so that N% in the spec is of the
 * simulated memory (rankmem_resource_from_spec_upstream). */
typedef struct {
    rankmem_resource_t base;
    sim_t *sim;
} sim_mr_t;

static rankmem_status_t sim_mr_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                        rankmem_stream_t stream, void **ptr_p)
{
    return sim_alloc(((sim_mr_t *)mr)->sim, bytes, alignment, stream, ptr_p);
}

static rankmem_status_t sim_mr_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                          size_t alignment, rankmem_stream_t stream)
{
    return sim_free(((sim_mr_t *)mr)->sim, ptr, bytes, alignment, stream);
}

static rankmem_status_t sim_mr_query(rankmem_resource_t *mr, rankmem_query_t what,
                                     size_t *value_p)
{
    if (what != RANKMEM_QUERY_POOL_MAX)
        return RANKMEM_ERR_NOT_SUPPORTED;
    *value_p = ((sim_mr_t *)mr)->sim->cap;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t sim_mr_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t sim_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "simulated",
    .allocate = sim_mr_allocate,
    .deallocate = sim_mr_deallocate,
    .query = sim_mr_query,
    .finalize = sim_mr_finalize,
};

/* The probe right above the leaf: what the chain holds from its upstream,
 * its peak exact under any interleaving of threads (one atomic add per call
 * and a compare-and-swap when the peak rises). The stats adaptor's peak is
 * only within a bound when several threads use it (docs/adaptors-stats.md),
 * which would blur the footprint of the multi-thread traces. */
typedef struct {
    rankmem_resource_t base;
    size_t current, peak, count_total; /* atomic */
} probe_mr_t;

static rankmem_status_t probe_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    probe_mr_t *p = (probe_mr_t *)mr;
    rankmem_status_t st = rankmem_allocate_async(mr->upstream, bytes, alignment, stream, ptr_p);
    if (st != RANKMEM_SUCCESS)
        return st;
    size_t now = __atomic_add_fetch(&p->current, bytes, __ATOMIC_RELAXED);
    size_t high = __atomic_load_n(&p->peak, __ATOMIC_RELAXED);
    while (now > high && !__atomic_compare_exchange_n(&p->peak, &high, now, 1, __ATOMIC_RELAXED,
                                                      __ATOMIC_RELAXED))
        ;
    __atomic_add_fetch(&p->count_total, 1, __ATOMIC_RELAXED);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t probe_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    rankmem_status_t st = rankmem_deallocate_async(mr->upstream, ptr, bytes, alignment, stream);
    if (st == RANKMEM_SUCCESS)
        __atomic_sub_fetch(&((probe_mr_t *)mr)->current, bytes, __ATOMIC_RELAXED);
    return st;
}

/* Queries are the upstream's (N% in a spec is of the leaf's memory). */
static rankmem_status_t probe_query(rankmem_resource_t *mr, rankmem_query_t what,
                                    size_t *value_p)
{
    return rankmem_resource_query(mr->upstream, what, value_p);
}

static rankmem_status_t probe_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t probe_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "stats", /* a statistics probe: the chain reads as before */
    .allocate = probe_allocate,
    .deallocate = probe_deallocate,
    .query = probe_query,
    .finalize = probe_finalize,
};

typedef struct {
    const char *spec;      /* as given */
    int simulate;
    size_t sim_memory;
    sim_t sim;
    char *leaf_spec;       /* not --simulate: the spec's leaf alone, as described */
    char *replaced;        /* --simulate: the spec's leaf that the simulated upstream replaces */
} chain_cfg_t;

/* Where the last component of a spec begins (after its last '>' outside
 * parentheses and quotes), and how many components it has. */
static const char *last_component(const char *spec, size_t *count_p)
{
    const char *last = spec;
    int depth = 0, inq = 0;
    size_t count = 1;
    for (const char *p = spec; *p; p++) {
        if (*p == '"')
            inq = !inq;
        else if (!inq && *p == '(')
            depth++;
        else if (!inq && *p == ')')
            depth--;
        else if (!inq && depth <= 0 && *p == '>')
            last = p + 1, count++;
    }
    while (*last == ' ' || *last == '\t')
        last++;
    *count_p = count;
    return last;
}

/* Fatal error for a spec that did not build: the parser's message, with
 * its position in the spec as given. */
static void spec_failed(const chain_cfg_t *c, rankmem_status_t st) __attribute__((noreturn));
static void spec_failed(const chain_cfg_t *c, rankmem_status_t st)
{
    fatal("%sspec '%s': %s", c->simulate ? "--simulate: " : "", c->spec, errmsg(st));
}

static void chain_cfg_init(chain_cfg_t *c)
{
    rankmem_status_t st;
    if (c->simulate) {
        sim_init(&c->sim, c->sim_memory);
        return;
    }
    /* The stats probe goes right above the leaf: build the spec once to
     * find its leaf, and keep the leaf's own description, which builds the
     * same leaf alone (chain_build). */
    rankmem_resource_t *chain, *leaf, *up;
    if ((st = rankmem_resource_from_spec(c->spec, &chain)) != RANKMEM_SUCCESS)
        spec_failed(c, st);
    for (leaf = chain; rankmem_resource_upstream(leaf, &up) == RANKMEM_SUCCESS && up; leaf = up)
        ;
    size_t need = 0;
    rankmem_resource_describe(leaf, NULL, 0, &need);
    c->leaf_spec = xmalloc(need + 1);
    if ((st = rankmem_resource_describe(leaf, c->leaf_spec, need + 1, NULL)) != RANKMEM_SUCCESS)
        fatal("spec '%s': describing its leaf: %s", c->spec, errmsg(st));
    rankmem_resource_release(chain);
}

static void chain_cfg_destroy(chain_cfg_t *c)
{
    if (c->simulate)
        sim_destroy(&c->sim);
    free(c->leaf_spec);
    free(c->replaced);
}

/* A fresh chain: the spec over a stats probe (*probe_p, borrowed) over the
 * spec's leaf, or, under --simulate, over the simulated upstream in place of
 * the spec's leaf (rankmem_resource_from_spec_upstream replaces it). */
static void chain_build(chain_cfg_t *c, rankmem_resource_t **chain_p,
                        rankmem_resource_t **probe_p)
{
    rankmem_status_t st;
    rankmem_resource_t *leaf, *probe, *chain;
    if (c->simulate) {
        sim_mr_t *s = xcalloc(1, sizeof *s);
        s->sim = &c->sim;
        if ((st = rankmem_resource_init(&s->base, &sim_ops, 0, NULL)) != RANKMEM_SUCCESS)
            fatal("--simulate: simulated upstream: %s", errmsg(st));
        leaf = &s->base;
    } else if ((st = rankmem_resource_from_spec(c->leaf_spec, &leaf)) != RANKMEM_SUCCESS) {
        fatal("spec '%s': building its leaf '%s': %s", c->spec, c->leaf_spec, errmsg(st));
    }
    probe_mr_t *pm = xcalloc(1, sizeof *pm);
    unsigned props = 0;
    (void)rankmem_resource_properties(leaf, &props);
    st = rankmem_resource_init(&pm->base, &probe_ops, props, leaf);
    rankmem_resource_release(leaf); /* the probe holds it */
    if (st != RANKMEM_SUCCESS)
        fatal("stats probe: %s", errmsg(st));
    probe = &pm->base;
    st = rankmem_resource_from_spec_upstream(c->spec, probe, &chain);
    rankmem_resource_release(probe); /* the chain holds it */
    if (st != RANKMEM_SUCCESS)
        spec_failed(c, st);
    if (c->simulate && !c->replaced) {
        /* One resource fewer above the probe than the spec names: its leaf
         * was replaced. Say which, once. */
        size_t parts, built = 0;
        const char *last = last_component(c->spec, &parts);
        for (rankmem_resource_t *r = chain; r != probe; r = r->upstream)
            built++;
        c->replaced = built < parts ? xstrdup(last) : xstrdup("");
    }
    *chain_p = chain;
    *probe_p = probe;
}

/* The RANKMEM_QUERY_RESERVED_HIGH of the first resource from the top that
 * answers it (the top suballocator's own high-water mark: an arena's
 * superblocks and large blocks rather than the global arena it took whole,
 * what the driver reserved for an async pool), its name, and whether it is
 * the leaf (asked too, for async; the probe is not); NULL if none answers. */
static const char *reserved_high(rankmem_resource_t *chain, rankmem_resource_t *probe,
                                 size_t *bytes_p, int *at_leaf_p)
{
    rankmem_resource_t *nodes[128];
    size_t n = 0;
    for (rankmem_resource_t *r = chain; r && n < 128; r = r->upstream)
        if (r != probe)
            nodes[n++] = r;
    const char *name = NULL;
    for (size_t i = 0; i < n && !name; i++) {
        size_t v, w;
        if (rankmem_resource_query(nodes[i], RANKMEM_QUERY_RESERVED_HIGH, &v) != RANKMEM_SUCCESS)
            continue;
        /* An adaptor that passes queries on (stats) answers with the value
         * of the resource below it: name the one the value is from. */
        while (i + 1 < n &&
               rankmem_resource_query(nodes[i + 1], RANKMEM_QUERY_RESERVED_HIGH, &w) ==
                   RANKMEM_SUCCESS &&
               w == v)
            i++;
        rankmem_resource_name(nodes[i], &name);
        *bytes_p = v;
        *at_leaf_p = i + 1 == n && probe->upstream == nodes[i];
    }
    rankmem_clear_error(); /* the queries some resources do not answer */
    return name;
}

/* ---- replay --------------------------------------------------------------- */

typedef struct {
    void *p;
    size_t size;
    uint32_t stream;
} live_t;

typedef struct {
    size_t failures, skipped_frees, free_errors;
    uint32_t first_failure_line;
    size_t first_failure_size;
    rankmem_status_t first_failure_status;
    char first_failure_msg[256];
    uint32_t first_free_error_line;
    char first_free_error_msg[256];
} run_errors_t;

typedef struct {
    const trace_t *t;
    rankmem_resource_t *mr;
    rankmem_stream_t *streams;
    live_t *live;
    run_errors_t err;
    /* multi-threaded: the next operation's index, each thread its list */
    _Alignas(64) atomic_size_t seq;
    _Alignas(64) uint32_t **thread_ops;
    size_t *thread_nops;
    uint64_t *thread_busy_ns;
    struct wake {
        _Alignas(64) atomic_uint word; /* bumped to wake the thread (a futex) */
    } *wake;
    uint64_t timer_ns; /* cost of one now_ns() pair, subtracted per op */
} replay_t;

static inline void do_op(replay_t *r, const op_t *op)
{
    live_t *l = &r->live[op->slot];
    if (op->kind == ACT_ALLOC) {
        void *p;
        rankmem_status_t st =
            rankmem_allocate_async(r->mr, op->size, 0, r->streams[op->stream], &p);
        if (__builtin_expect(st != RANKMEM_SUCCESS, 0)) {
            l->p = NULL;
            if (r->err.failures++ == 0) {
                r->err.first_failure_line = op->line;
                r->err.first_failure_size = op->size;
                r->err.first_failure_status = st;
                snprintf(r->err.first_failure_msg, sizeof r->err.first_failure_msg, "%s",
                         errmsg(st));
            }
            return;
        }
        l->p = p;
        l->size = op->size;
        l->stream = op->stream;
    } else {
        if (__builtin_expect(!l->p, 0)) {
            r->err.skipped_frees++; /* its allocate failed */
            return;
        }
        rankmem_status_t st =
            rankmem_deallocate_async(r->mr, l->p, op->size, 0, r->streams[op->stream]);
        if (__builtin_expect(st != RANKMEM_SUCCESS, 0) && r->err.free_errors++ == 0) {
            r->err.first_free_error_line = op->line;
            snprintf(r->err.first_free_error_msg, sizeof r->err.first_free_error_msg, "%s",
                     errmsg(st));
        }
        l->p = NULL;
    }
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct {
    replay_t *r;
    uint32_t thread;
} worker_arg_t;

static void futex_wait(atomic_uint *word, unsigned seen)
{
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void futex_wake(atomic_uint *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* One OS thread per trace thread; operation i runs when seq == i. A thread
 * waiting for its turn spins a little, then sleeps on its own futex word;
 * the thread that runs operation i sets seq to i+1 and, when i+1 is another
 * thread's, wakes that thread alone. So with more log threads than cores the
 * thread whose turn it is does not compete with the others for a core, and
 * the time inside the calls (what is measured) is the allocator's. */
static void *worker(void *arg)
{
    worker_arg_t *wa = arg;
    replay_t *r = wa->r;
    const op_t *ops = r->t->ops;
    size_t nops = r->t->nops;
    const uint32_t *mine = r->thread_ops[wa->thread];
    size_t n = r->thread_nops[wa->thread];
    atomic_uint *word = &r->wake[wa->thread].word;
    uint64_t busy = 0;
    for (size_t k = 0; k < n; k++) {
        size_t idx = mine[k];
        for (unsigned spins = 0; atomic_load_explicit(&r->seq, memory_order_acquire) != idx;
             spins++) {
            if (spins < 200) {
                cpu_relax();
                continue;
            }
            unsigned seen = atomic_load_explicit(word, memory_order_acquire);
            if (atomic_load_explicit(&r->seq, memory_order_acquire) == idx)
                break;
            futex_wait(word, seen); /* returns at once if word moved since */
        }
        uint64_t t0 = now_ns();
        do_op(r, &ops[idx]);
        uint64_t t1 = now_ns();
        busy += t1 - t0;
        atomic_store_explicit(&r->seq, idx + 1, memory_order_release);
        if (idx + 1 < nops && ops[idx + 1].thread != wa->thread) {
            atomic_uint *next = &r->wake[ops[idx + 1].thread].word;
            atomic_fetch_add_explicit(next, 1, memory_order_release);
            futex_wake(next);
        }
    }
    r->thread_busy_ns[wa->thread] = busy;
    return NULL;
}

static uint64_t timer_overhead(void)
{
    uint64_t best = UINT64_MAX;
    for (int i = 0; i < 1000; i++) {
        uint64_t a = now_ns(), b = now_ns();
        if (b - a < best)
            best = b - a;
    }
    return best;
}

/* What a vmm in the chain did (rankmem_vmm_get_stats); present 0: no vmm. */
typedef struct {
    int present;
    size_t handles_created, granules_mapped, granules_released, give_backs;
} vmm_count_t;

typedef struct {
    double ns_per_op;       /* the timed pass (with --warm: the second) */
    double cold_ns_per_op;  /* --warm: the first pass, from an empty chain */
    vmm_count_t vmm;        /* of the timed pass */
    vmm_count_t vmm_cold;   /* --warm: of the first pass */
    size_t peak_reserved;   /* by the measure below */
    const char *measured_by; /* the resource whose RESERVED_HIGH it is; NULL: the probe's */
    size_t peak_upstream;   /* the probe's peak: what the chain took from its upstream */
    const char *query_by;   /* the resource that answered RESERVED_HIGH (NULL: none) */
    size_t query_high;      /* and its answer */
    size_t upstream_allocs;
    run_errors_t err;
    rankmem_status_t release_status;
    char release_msg[256];
    size_t sim_leaked;
} run_result_t;

/* One pass of the trace over r->mr; returns the time inside the calls in
 * ns. What the trace leaves live (model weights, ...) is freed after the
 * clock stops, so the chain is empty for release or for another pass. */
static uint64_t replay_pass(replay_t *r, uint32_t **thread_ops, size_t *thread_nops,
                            uint64_t timer_ns)
{
    const trace_t *t = r->t;
    uint64_t ns;
    if (t->nthreads <= 1) {
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < t->nops; i++)
            do_op(r, &t->ops[i]);
        ns = now_ns() - t0;
    } else {
        atomic_store(&r->seq, 0);
        r->thread_ops = thread_ops;
        r->thread_nops = thread_nops;
        r->thread_busy_ns = xcalloc(t->nthreads, sizeof *r->thread_busy_ns);
        r->wake = aligned_alloc(64, t->nthreads * sizeof *r->wake);
        if (!r->wake)
            fatal("out of host memory");
        for (uint32_t i = 0; i < t->nthreads; i++)
            atomic_init(&r->wake[i].word, 0);
        pthread_t *tids = xmalloc(t->nthreads * sizeof *tids);
        worker_arg_t *args = xmalloc(t->nthreads * sizeof *args);
        for (uint32_t i = 0; i < t->nthreads; i++) {
            args[i].r = r;
            args[i].thread = i;
            int e = pthread_create(&tids[i], NULL, worker, &args[i]);
            if (e)
                fatal("pthread_create: %s", strerror(e));
        }
        for (uint32_t i = 0; i < t->nthreads; i++)
            pthread_join(tids[i], NULL);
        ns = 0;
        for (uint32_t i = 0; i < t->nthreads; i++)
            ns += r->thread_busy_ns[i];
        /* Less the clock's own cost, measured back to back. */
        uint64_t overhead = timer_ns * t->nops;
        ns = ns > overhead ? ns - overhead : 0;
        free(tids);
        free(args);
        free(r->thread_busy_ns);
        free(r->wake);
    }
    for (size_t s = 0; s < t->nslots; s++)
        if (r->live[s].p) {
            rankmem_status_t st = rankmem_deallocate_async(
                r->mr, r->live[s].p, r->live[s].size, 0, r->streams[r->live[s].stream]);
            if (st != RANKMEM_SUCCESS && r->err.free_errors++ == 0)
                snprintf(r->err.first_free_error_msg, sizeof r->err.first_free_error_msg,
                         "at the end: %s", errmsg(st));
            r->live[s].p = NULL;
        }
    return ns;
}

/* The vmm counters of the chain, if it has a vmm (else all zero). */
static void vmm_counters(rankmem_resource_t *mr, vmm_count_t *c)
{
    memset(c, 0, sizeof *c);
    rankmem_vmm_stats_t s;
    memset(&s, 0, sizeof s);
    s.size = sizeof s;
    if (rankmem_vmm_get_stats(mr, &s) != RANKMEM_SUCCESS) {
        rankmem_clear_error();
        return;
    }
    c->present = 1;
    c->handles_created = s.handles_created;
    c->granules_mapped = s.granules_mapped;
    c->granules_released = s.granules_released;
    c->give_backs = s.give_backs;
}

static void vmm_count_sub(vmm_count_t *a, const vmm_count_t *b)
{
    a->handles_created -= b->handles_created;
    a->granules_mapped -= b->granules_mapped;
    a->granules_released -= b->granules_released;
    a->give_backs -= b->give_backs;
}

/* A run: a fresh chain, one timed pass (with warm, an untimed pass first on
 * the same chain: the steady state of a loop that replays the same step). */
static void replay_once(chain_cfg_t *cfg, const trace_t *t, rankmem_stream_t *streams,
                        uint32_t **thread_ops, size_t *thread_nops, uint64_t timer_ns,
                        int warm, run_result_t *res)
{
    memset(res, 0, sizeof *res);
    /* Over-aligned (the sequence number has a cache line of its own). */
    size_t rsize = (sizeof(replay_t) + 63) & ~(size_t)63;
    replay_t *r = aligned_alloc(64, rsize);
    if (!r)
        fatal("out of host memory (%zu bytes)", rsize);
    memset(r, 0, rsize);
    rankmem_resource_t *probe;
    chain_build(cfg, &r->mr, &probe);
    r->t = t;
    r->streams = streams;
    r->live = xcalloc(t->nslots, sizeof *r->live);
    r->timer_ns = timer_ns;
    if (warm) {
        uint64_t cold = replay_pass(r, thread_ops, thread_nops, timer_ns);
        res->cold_ns_per_op = t->nops ? (double)cold / (double)t->nops : 0;
        vmm_counters(r->mr, &res->vmm_cold);
    }
    uint64_t ns = replay_pass(r, thread_ops, thread_nops, timer_ns);
    res->ns_per_op = t->nops ? (double)ns / (double)t->nops : 0;
    res->err = r->err;
    vmm_counters(r->mr, &res->vmm);
    if (warm)
        vmm_count_sub(&res->vmm, &res->vmm_cold); /* the timed pass's own */

    const probe_mr_t *pm = (const probe_mr_t *)probe;
    struct {
        size_t bytes_peak;
    } s = {__atomic_load_n(&pm->peak, __ATOMIC_RELAXED)};
    res->peak_upstream = s.bytes_peak;
    res->upstream_allocs = __atomic_load_n(&pm->count_total, __ATOMIC_RELAXED);
    /* Above the leaf, the top suballocator's own mark and the probe's peak
     * both bound what the chain needed: an arena's is below the global arena
     * it took whole, and a binning's (the sum of its bins' peaks) may be
     * above what the probe saw: the smaller is reported. At the leaf
     * (async), the probe sees only what was asked of it: the leaf's own. */
    int at_leaf = 0;
    res->query_by = reserved_high(r->mr, probe, &res->query_high, &at_leaf);
    if (res->query_by && (at_leaf || res->query_high <= s.bytes_peak)) {
        res->measured_by = res->query_by;
        res->peak_reserved = res->query_high;
    } else {
        res->peak_reserved = s.bytes_peak;
    }
    rankmem_clear_error();
    res->release_status = rankmem_resource_release(r->mr);
    if (res->release_status != RANKMEM_SUCCESS)
        snprintf(res->release_msg, sizeof res->release_msg, "%s", errmsg(res->release_status));
    if (cfg->simulate) {
        res->sim_leaked = cfg->sim.outstanding;
        /* Start the next run on an empty address space either way. */
        cfg->sim.top = 0;
        cfg->sim.nfree = 0;
        cfg->sim.outstanding = 0;
        cfg->sim.outstanding_blocks = 0;
    }
    free(r->live);
    free(r);
}

/* ---- streams -------------------------------------------------------------- */

/* Trace stream values to handles: 0x0 is the default stream (NULL); the
 * others are new non-blocking CUDA streams over a device chain on a GPU,
 * else stand-ins (the value itself: over host memory streams are labels). */
static rankmem_stream_t *make_streams(const trace_t *t, int real)
{
    rankmem_stream_t *s = xcalloc(t->nstreams, sizeof *s);
    for (uint32_t i = 0; i < t->nstreams; i++) {
        if (t->stream_vals[i] == 0)
            continue; /* the default stream */
#if HAVE_CUDA
        if (real) {
            cudaStream_t cs;
            cudaError_t e = cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
            if (e != cudaSuccess)
                fatal("cudaStreamCreateWithFlags: %s", cudaGetErrorString(e));
            s[i] = (rankmem_stream_t)cs;
            continue;
        }
#else
        (void)real;
#endif
        s[i] = (rankmem_stream_t)(uintptr_t)t->stream_vals[i];
    }
    return s;
}

static void destroy_streams(const trace_t *t, rankmem_stream_t *s, int real)
{
#if HAVE_CUDA
    if (real)
        for (uint32_t i = 0; i < t->nstreams; i++)
            if (s[i])
                cudaStreamDestroy((cudaStream_t)s[i]);
#else
    (void)t;
    (void)real;
#endif
    free(s);
}

/* ---- output --------------------------------------------------------------- */

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

typedef struct {
    const trace_t *t;
    double ns_median;
    double *ns_runs;
    double cold_median; /* --warm: the untimed-before pass, timed too */
    int repeat, warm;
    run_result_t worst; /* peak reserved and failures: the largest of the runs */
    const char *timing;
} trace_result_t;

static void print_json(FILE *f, chain_cfg_t *cfg, const char *chain_desc, const char *streams,
                       trace_result_t *tr, int ntr, int repeat)
{
    fprintf(f, "{\n  \"spec\": ");
    json_string(f, cfg->spec);
    fprintf(f, ",\n  \"chain\": ");
    json_string(f, chain_desc);
    fprintf(f, ",\n  \"simulate\": %s", cfg->simulate ? "true" : "false");
    if (cfg->simulate)
        fprintf(f, ",\n  \"simulated_memory_bytes\": %zu", cfg->sim.cap);
    fprintf(f, ",\n  \"streams\": \"%s\",\n  \"repeat\": %d,\n  \"warm\": %s,\n  \"traces\": [",
            streams, repeat, ntr > 0 && tr[0].warm ? "true" : "false");
    for (int i = 0; i < ntr; i++) {
        const trace_t *t = tr[i].t;
        const run_result_t *w = &tr[i].worst;
        fprintf(f, "%s\n    {\"file\": ", i ? "," : "");
        json_string(f, t->path);
        fprintf(f,
                ", \"events\": %zu, \"allocations\": %zu, \"frees\": %zu, "
                "\"failure_lines\": %zu, \"threads\": %" PRIu32 ", \"streams\": %" PRIu32
                ", \"duration_us\": %.3f,\n     \"ops\": %zu, \"ns_per_op\": %.2f, "
                "\"timing\": \"%s\", \"ns_per_op_runs\": [",
                t->nevents, t->nalloc, t->nfree, t->nfailure_lines, t->nthreads, t->nstreams,
                t->duration_us, t->nops, tr[i].ns_median, tr[i].timing);
        for (int k = 0; k < repeat; k++)
            fprintf(f, "%s%.2f", k ? ", " : "", tr[i].ns_runs[k]);
        double ratio = t->peak_live ? (double)w->peak_reserved / (double)t->peak_live : 0;
        fprintf(f, "],\n     ");
        if (tr[i].warm)
            fprintf(f, "\"warm\": true, \"cold_ns_per_op\": %.2f, ", tr[i].cold_median);
        if (w->vmm.present) {
            fprintf(f, "\"vmm\": {\"handles_created\": %zu, \"granules_mapped\": %zu, "
                       "\"granules_released\": %zu, \"give_backs\": %zu",
                    w->vmm.handles_created, w->vmm.granules_mapped, w->vmm.granules_released,
                    w->vmm.give_backs);
            if (tr[i].warm)
                fprintf(f, ", \"cold\": {\"handles_created\": %zu, \"granules_mapped\": %zu, "
                           "\"granules_released\": %zu, \"give_backs\": %zu}",
                        w->vmm_cold.handles_created, w->vmm_cold.granules_mapped,
                        w->vmm_cold.granules_released, w->vmm_cold.give_backs);
            fprintf(f, "},\n     ");
        }
        fprintf(f, "\"reserved_measure\": \"%s\", ", w->measured_by ? "query" : "upstream");
        if (w->measured_by) {
            fprintf(f, "\"reserved_by\": ");
            json_string(f, w->measured_by);
            fprintf(f, ", ");
        }
        fprintf(f, "\"peak_upstream_bytes\": %zu, ", w->peak_upstream);
        if (w->query_by) {
            fprintf(f, "\"query_by\": ");
            json_string(f, w->query_by);
            fprintf(f, ", \"query_reserved_high_bytes\": %zu, ", w->query_high);
        }
        fprintf(f, "\n");
        fprintf(f,
                "     \"peak_live_bytes\": %zu, \"peak_live_count\": %zu, "
                "\"peak_reserved_bytes\": %zu, \"ratio\": %.4f, \"upstream_allocations\": %zu,\n"
                "     \"live_at_end_bytes\": %zu, "
                "\"live_at_end_count\": %zu, \"replay_failures\": %zu, \"skipped_frees\": %zu, "
                "\"free_errors\": %zu",
                t->peak_live, t->peak_live_count, w->peak_reserved, ratio, w->upstream_allocs,
                t->end_live,
                t->end_live_count, w->err.failures, w->err.skipped_frees, w->err.free_errors);
        if (w->err.failures) {
            char msg[400];
            snprintf(msg, sizeof msg, "line %" PRIu32 ": allocate of %zu bytes: %s",
                     w->err.first_failure_line, w->err.first_failure_size,
                     w->err.first_failure_msg);
            fprintf(f, ",\n     \"first_failure\": ");
            json_string(f, msg);
        }
        fprintf(f, ", \"release\": ");
        json_string(f, rankmem_status_string(w->release_status));
        fprintf(f, "}");
    }
    fprintf(f, "\n  ]\n}\n");
}

/* Which measure "peak reserved" is. */
static void reserved_note(FILE *f, const char *lead, const run_result_t *w)
{
    if (w->measured_by)
        fprintf(f, "%s%s's own high-water mark (RANKMEM_QUERY_RESERVED_HIGH); what the chain "
                   "took from its upstream is peak_upstream_bytes in --json\n",
                lead, w->measured_by);
    else if (w->query_by)
        fprintf(f, "%sthe most the chain held from its upstream at once (a stats probe above "
                   "the leaf), less than %s's RANKMEM_QUERY_RESERVED_HIGH (%zu bytes)\n",
                lead, w->query_by, w->query_high);
    else
        fprintf(f, "%sthe most the chain held from its upstream at once (a stats probe above "
                   "the leaf)\n", lead);
}

static void print_table(FILE *f, chain_cfg_t *cfg, const char *chain_desc, const char *streams,
                        trace_result_t *tr, int ntr, int repeat)
{
    int warm = ntr > 0 && tr[0].warm;
    fprintf(f, "spec %s (chain %s)%s, streams: %s, median of %d run%s%s\n", cfg->spec, chain_desc,
            cfg->simulate ? ", simulated upstream" : "", streams, repeat, repeat == 1 ? "" : "s",
            warm ? "; --warm: ns/op of the second pass on the same chain, cold ns/op of the "
                   "first" : "");
    if (cfg->simulate) {
        char b[32];
        const char *rep = cfg->replaced && *cfg->replaced ? cfg->replaced : NULL;
        fprintf(f, "simulated upstream: %s of address space, never touched%s%s%s\n",
                human(b, sizeof b, cfg->sim.cap), rep ? " (in place of '" : "", rep ? rep : "",
                rep ? "')" : "");
    }
    if (ntr > 0)
        reserved_note(f, "peak reserved: ", &tr[0].worst);
    fprintf(f, "%-40s %7s %3s %3s %8s %8s %11s %13s %8s %8s", "trace", "events", "thr", "str",
            "ops", "ns/op", "peak live", "peak reserved", "res/live", "failures");
    if (warm)
        fprintf(f, " %11s", "cold ns/op");
    fputc('\n', f);
    for (int i = 0; i < ntr; i++) {
        const trace_t *t = tr[i].t;
        const run_result_t *w = &tr[i].worst;
        char a[32], b[32];
        double ratio = t->peak_live ? (double)w->peak_reserved / (double)t->peak_live : 0;
        fprintf(f, "%-40s %7zu %3" PRIu32 " %3" PRIu32 " %8zu %8.1f %11s %13s %8.3f %8zu",
                t->name, t->nevents, t->nthreads, t->nstreams, t->nops, tr[i].ns_median,
                human(a, sizeof a, t->peak_live), human(b, sizeof b, w->peak_reserved), ratio,
                w->err.failures);
        if (warm)
            fprintf(f, " %11.1f", tr[i].cold_median);
        fputc('\n', f);
    }
    for (int i = 0; i < ntr; i++) {
        const trace_t *t = tr[i].t;
        const run_result_t *w = &tr[i].worst;
        if (t->nfailure_lines)
            fprintf(f, "  %s: %zu 'allocate failure' lines skipped\n", t->name,
                    t->nfailure_lines);
        if (t->end_live_count) {
            char a[32];
            fprintf(f, "  %s: %zu blocks (%s) live at the end of the trace, freed before release\n",
                    t->name, t->end_live_count, human(a, sizeof a, t->end_live));
        }
        if (w->err.failures)
            fprintf(f,
                    "  %s: %zu allocations failed (first at line %" PRIu32 ", %zu bytes: %s); "
                    "%zu frees skipped\n",
                    t->name, w->err.failures, w->err.first_failure_line,
                    w->err.first_failure_size, w->err.first_failure_msg, w->err.skipped_frees);
        if (i > 0 && (!w->measured_by != !tr[0].worst.measured_by ||
                      (w->measured_by && strcmp(w->measured_by, tr[0].worst.measured_by)))) {
            fprintf(f, "  %s: ", t->name);
            reserved_note(f, "peak reserved here: ", w);
        }
        if (w->vmm.present && warm)
            fprintf(f, "  %s: vmm, first pass: %zu handles created, %zu granules mapped, %zu "
                       "released, %zu give-backs; timed pass: %zu, %zu, %zu, %zu\n",
                    t->name, w->vmm_cold.handles_created, w->vmm_cold.granules_mapped,
                    w->vmm_cold.granules_released, w->vmm_cold.give_backs,
                    w->vmm.handles_created, w->vmm.granules_mapped, w->vmm.granules_released,
                    w->vmm.give_backs);
        else if (w->vmm.present)
            fprintf(f, "  %s: vmm: %zu handles created, %zu granules mapped, %zu released, "
                       "%zu give-backs\n",
                    t->name, w->vmm.handles_created, w->vmm.granules_mapped,
                    w->vmm.granules_released, w->vmm.give_backs);
        if (t->nthreads > 1)
            fprintf(f, "  %s: %" PRIu32 " threads in log order; ns/op is the time inside the "
                       "calls, less the clock's cost\n", t->name, t->nthreads);
    }
}

/* ---- main ----------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: %s [--spec SPEC] [--repeat N] [--warm] [--simulate] [--sim-memory SIZE] "
            "[--json] TRACE.csv...\n"
            "  --spec SPEC        resource chain (default: pool>cuda on a GPU, pool>system "
            "without one)\n"
            "  --repeat N         timed runs per trace, each on a fresh chain; the median is "
            "reported (default 3)\n"
            "  --warm             each run replays the trace once on its fresh chain, then "
            "times a second pass on it (the steady state of a loop); both times reported\n"
            "  --simulate         replace the spec's leaf by a simulated upstream: address "
            "space only, never touched\n"
            "  --sim-memory SIZE  size of the simulated upstream (default 80GiB)\n"
            "  --json             machine-readable output\n"
            "Exit status: 0 replayed (allocation failures are reported, not fatal), 1 malformed "
            "trace or error, 2 usage.\n",
            prog);
}

int main(int argc, char **argv)
{
    const char *spec = NULL;
    int repeat = 3, json = 0, warm = 0;
    chain_cfg_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.sim_memory = DEFAULT_SIM_MEMORY;
    const char **files = xcalloc((size_t)argc, sizeof *files);
    int nfiles = 0, opts_done = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (!opts_done && !strcmp(a, "--")) {
            opts_done = 1;
        } else if (!opts_done && (!strcmp(a, "--spec") || !strncmp(a, "--spec=", 7))) {
            val = a[6] == '=' ? a + 7 : (i + 1 < argc ? argv[++i] : NULL);
            if (!val)
                usage(stderr), exit(2);
            spec = val;
        } else if (!opts_done && (!strcmp(a, "--repeat") || !strncmp(a, "--repeat=", 9))) {
            val = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            char *e;
            long v = val ? strtol(val, &e, 10) : 0;
            if (!val || *e || e == val || v < 1 || v > 1000) {
                fprintf(stderr, "%s: --repeat needs a count from 1 to 1000\n", prog);
                exit(2);
            }
            repeat = (int)v;
        } else if (!opts_done && !strcmp(a, "--simulate")) {
            cfg.simulate = 1;
        } else if (!opts_done &&
                   (!strcmp(a, "--sim-memory") || !strncmp(a, "--sim-memory=", 13))) {
            val = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            if (!val || rankmem_parse_size(val, 0, &cfg.sim_memory) != RANKMEM_SUCCESS ||
                cfg.sim_memory < ((size_t)1 << 20)) {
                fprintf(stderr, "%s: --sim-memory needs a size of at least 1MiB (%s)\n", prog,
                        val ? rankmem_last_error() : "missing");
                exit(2);
            }
        } else if (!opts_done && !strcmp(a, "--warm")) {
            warm = 1;
        } else if (!opts_done && !strcmp(a, "--json")) {
            json = 1;
        } else if (!opts_done && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            usage(stdout);
            return 0;
        } else if (!opts_done && a[0] == '-' && a[1]) {
            fprintf(stderr, "%s: unknown option '%s'\n", prog, a);
            usage(stderr);
            exit(2);
        } else {
            files[nfiles++] = a;
        }
    }
    if (!nfiles) {
        usage(stderr);
        exit(2);
    }
    int ndev = 0;
    if (rankmem_device_count(&ndev) != RANKMEM_SUCCESS)
        ndev = 0;
    cfg.spec = spec ? spec : ndev > 0 ? "pool>cuda" : "pool>system";

    /* Every trace is checked before anything runs. */
    trace_t *traces = xcalloc((size_t)nfiles, sizeof *traces);
    for (int i = 0; i < nfiles; i++)
        load_trace(files[i], &traces[i]);

    chain_cfg_init(&cfg);

    /* Build the chain once: a bad spec fails here, before any replay; its
     * description (the stats probe included) and whether it is device memory. */
    char chain_desc[512] = "";
    int real = 0; /* real CUDA streams */
    {
        rankmem_resource_t *chain, *probe;
        chain_build(&cfg, &chain, &probe);
        if (rankmem_resource_describe(chain, chain_desc, sizeof chain_desc, NULL) !=
            RANKMEM_SUCCESS)
            snprintf(chain_desc, sizeof chain_desc, "%s",
                     cfg.spec);
#if HAVE_CUDA
        unsigned props = 0;
        rankmem_resource_properties(chain, &props);
        real = !cfg.simulate && ndev > 0 && (props & RANKMEM_PROP_DEVICE_ACCESSIBLE);
#endif
        rankmem_resource_release(chain);
        if (cfg.simulate)
            cfg.sim.top = cfg.sim.nfree = cfg.sim.outstanding = cfg.sim.outstanding_blocks = 0;
    }
    const char *stream_kind = real ? "CUDA streams (non-blocking)" : "stand-ins";

    uint64_t timer_ns = timer_overhead();
    trace_result_t *tr = xcalloc((size_t)nfiles, sizeof *tr);
    int status = 0;
    for (int i = 0; i < nfiles; i++) {
        trace_t *t = &traces[i];
        tr[i].t = t;
        tr[i].repeat = repeat;
        tr[i].warm = warm;
        double *cold_runs = xcalloc((size_t)repeat, sizeof *cold_runs);
        tr[i].ns_runs = xcalloc((size_t)repeat, sizeof(double));
        tr[i].timing = t->nthreads > 1 ? "per-call" : "loop";
        /* Each log thread's operations, in order. */
        uint32_t **thread_ops = xcalloc(t->nthreads ? t->nthreads : 1, sizeof *thread_ops);
        size_t *thread_nops = xcalloc(t->nthreads ? t->nthreads : 1, sizeof *thread_nops);
        for (size_t k = 0; k < t->nops; k++)
            thread_nops[t->ops[k].thread]++;
        for (uint32_t k = 0; k < t->nthreads; k++) {
            thread_ops[k] = xmalloc((thread_nops[k] ? thread_nops[k] : 1) * sizeof **thread_ops);
            thread_nops[k] = 0;
        }
        for (size_t k = 0; k < t->nops; k++)
            thread_ops[t->ops[k].thread][thread_nops[t->ops[k].thread]++] = (uint32_t)k;
        rankmem_stream_t *streams = make_streams(t, real);
        for (int k = 0; k < repeat; k++) {
            run_result_t res;
            replay_once(&cfg, t, streams, thread_ops, thread_nops, timer_ns, warm, &res);
            tr[i].ns_runs[k] = res.ns_per_op;
            cold_runs[k] = res.cold_ns_per_op;
            /* Runs replay the same order; should they differ, report the worst. */
            run_result_t *w = &tr[i].worst;
            if (k == 0) {
                *w = res;
            } else {
                if (res.peak_reserved > w->peak_reserved)
                    w->peak_reserved = res.peak_reserved;
                if (res.peak_upstream > w->peak_upstream)
                    w->peak_upstream = res.peak_upstream;
                if (res.query_high > w->query_high)
                    w->query_high = res.query_high;
                if (res.upstream_allocs > w->upstream_allocs)
                    w->upstream_allocs = res.upstream_allocs;
                if (res.err.failures > w->err.failures)
                    w->err = res.err;
                if (res.release_status != RANKMEM_SUCCESS)
                    w->release_status = res.release_status;
            }
            if (res.err.free_errors) {
                fprintf(stderr, "%s: %s: %zu frees failed (first at line %" PRIu32 ": %s)\n",
                        prog, t->path, res.err.free_errors, res.err.first_free_error_line,
                        res.err.first_free_error_msg);
                status = 1;
            }
            if (res.release_status != RANKMEM_SUCCESS) {
                fprintf(stderr, "%s: %s: releasing the chain: %s\n", prog, t->path,
                        res.release_msg);
                status = 1;
            }
            if (res.sim_leaked) {
                fprintf(stderr, "%s: %s: the chain kept %zu bytes of the simulated upstream "
                                "after release\n", prog, t->path, res.sim_leaked);
                status = 1;
            }
        }
        double *sorted = xmalloc((size_t)repeat * sizeof *sorted);
        memcpy(sorted, tr[i].ns_runs, (size_t)repeat * sizeof *sorted);
        qsort(sorted, (size_t)repeat, sizeof *sorted, cmp_double);
        tr[i].ns_median = repeat % 2 ? sorted[repeat / 2]
                                     : (sorted[repeat / 2 - 1] + sorted[repeat / 2]) / 2;
        qsort(cold_runs, (size_t)repeat, sizeof *cold_runs, cmp_double);
        tr[i].cold_median = repeat % 2 ? cold_runs[repeat / 2]
                                       : (cold_runs[repeat / 2 - 1] + cold_runs[repeat / 2]) / 2;
        free(cold_runs);
        free(sorted);
        destroy_streams(t, streams, real);
        for (uint32_t k = 0; k < t->nthreads; k++)
            free(thread_ops[k]);
        free(thread_ops);
        free(thread_nops);
    }

    if (json)
        print_json(stdout, &cfg, chain_desc, stream_kind, tr, nfiles, repeat);
    else
        print_table(stdout, &cfg, chain_desc, stream_kind, tr, nfiles, repeat);

    for (int i = 0; i < nfiles; i++) {
        free(tr[i].ns_runs);
        free(traces[i].ops);
        free(traces[i].stream_vals);
    }
    free(tr);
    free(traces);
    free(files);
    chain_cfg_destroy(&cfg);
    return status;
}
