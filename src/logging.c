/* logging: one CSV line per allocate, failed allocate and free, in the
 * format of the recorded traces (../shared/traces) so that one replay tool
 * reads both:
 *
 *     Thread,Time,Action,Pointer,Size,Stream
 *     0,12.345,allocate,0x7f3a00000,4096,0x0
 *
 * Thread is a small id per thread in the order threads first log through
 * this adaptor; Time is microseconds since the adaptor was created
 * (CLOCK_MONOTONIC) with three decimals, i.e. nanoseconds; Action is
 * allocate, "allocate failure" (pointer 0x0) or free.
 *
 * Meant to stay on in production runs: each thread formats its lines by
 * hand (no stdio) into its own 64 KiB buffer (tslot.h), and a buffer goes
 * to the file in one write() when full, at rankmem_logging_flush() and when
 * the adaptor is released. Lines of one thread are in order; lines of
 * different threads interleave by buffer, whole. A free is stamped before
 * the upstream gets the memory back, an allocate after it returns, so
 * sorting by Time (stably) never puts the reuse of an address before its
 * free. */
#define _GNU_SOURCE
#include "internal.h"
#include "config_internal.h"
#include "tslot.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define LOG_BUF ((size_t)64 << 10)
#define LINE_MAX_LEN 160 /* 20 + 25 + 16 + 18 + 20 + 18 digits and separators, rounded up */
#define HEADER "Thread,Time,Action,Pointer,Size,Stream\n"

typedef struct {
    pthread_mutex_t lock; /* the owner appends, a flush from any thread drains */
    unsigned long thread; /* id written in the lines */
    size_t len;
    char buf[LOG_BUF];
} logbuf_t;

typedef struct {
    rankmem_resource_t base;
    int fd;
    int explicit_path; /* describe() names the file only when the caller chose it */
    char *path;
    uint64_t t0;       /* ns, CLOCK_MONOTONIC */
    unsigned long next_thread; /* atomic */
    pthread_mutex_t file_lock; /* one write() at a time; the error fields */
    int file_lock_ok;
    int err_errno;      /* first write error since the last flush */
    size_t err_bytes;   /* bytes lost since the last flush */
    size_t lost_bytes;  /* bytes lost in all */
    rk_tslot_set_t bufs;
} logging_t;

static const rankmem_resource_ops_t logging_ops;

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- writing to the file ---- */

/* Caller holds file_lock. */
static void write_all(logging_t *lg, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(lg->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (!lg->err_errno)
                lg->err_errno = w < 0 ? errno : EIO;
            lg->err_bytes += n;
            lg->lost_bytes += n;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Caller holds b->lock (buffer lock before file lock, always). */
static void drain(logging_t *lg, logbuf_t *b)
{
    if (!b->len)
        return;
    pthread_mutex_lock(&lg->file_lock);
    write_all(lg, b->buf, b->len);
    pthread_mutex_unlock(&lg->file_lock);
    b->len = 0;
}

/* ---- formatting, by hand: snprintf would cost more than the rest ---- */

static inline char *put_dec(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

static inline char *put_hex(char *p, uint64_t v)
{
    char tmp[16];
    int n = 0;
    *p++ = '0';
    *p++ = 'x';
    do {
        tmp[n++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v);
    while (n)
        *p++ = tmp[--n];
    return p;
}

typedef struct {
    const char *word;
    size_t len;
} action_t;

#define ACTION(w) ((action_t){w, sizeof(w) - 1})

/* Writes one line (at most LINE_MAX_LEN bytes) at p; returns its length. */
static size_t format_line(char *p, unsigned long thread, uint64_t ns, action_t action,
                          const void *ptr, size_t size, rankmem_stream_t stream)
{
    char *s = p;
    p = put_dec(p, thread);
    *p++ = ',';
    p = put_dec(p, ns / 1000);
    *p++ = '.';
    unsigned frac = (unsigned)(ns % 1000);
    *p++ = (char)('0' + frac / 100);
    *p++ = (char)('0' + frac / 10 % 10);
    *p++ = (char)('0' + frac % 10);
    *p++ = ',';
    memcpy(p, action.word, action.len);
    p += action.len;
    *p++ = ',';
    p = put_hex(p, (uintptr_t)ptr);
    *p++ = ',';
    p = put_dec(p, size);
    *p++ = ',';
    p = put_hex(p, (uintptr_t)stream);
    *p++ = '\n';
    return (size_t)(p - s);
}

static void log_event(logging_t *lg, uint64_t t, action_t action, const void *ptr, size_t size,
                      rankmem_stream_t stream)
{
    uint64_t ns = t - lg->t0;
    logbuf_t *b = rk_tslot_get(&lg->bufs);
    if (RK_UNLIKELY(!b)) {
        /* No buffer for this thread (out of host memory): write the line
         * straight through, with the OS thread id. */
        char line[LINE_MAX_LEN];
        size_t n = format_line(line, (unsigned long)syscall(SYS_gettid), ns, action, ptr, size,
                               stream);
        pthread_mutex_lock(&lg->file_lock);
        write_all(lg, line, n);
        pthread_mutex_unlock(&lg->file_lock);
        return;
    }
    pthread_mutex_lock(&b->lock);
    if (RK_UNLIKELY(b->len > LOG_BUF - LINE_MAX_LEN))
        drain(lg, b);
    b->len += format_line(b->buf + b->len, b->thread, ns, action, ptr, size, stream);
    pthread_mutex_unlock(&b->lock);
}

/* ---- the resource ---- */

static rankmem_status_t logging_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                         rankmem_stream_t stream, void **ptr_p)
{
    logging_t *lg = (logging_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    if (RK_LIKELY(st == RANKMEM_SUCCESS))
        log_event(lg, now_ns(), ACTION("allocate"), *ptr_p, bytes, stream);
    else
        log_event(lg, now_ns(), ACTION("allocate failure"), NULL, bytes, stream);
    return st;
}

static rankmem_status_t logging_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                           size_t alignment, rankmem_stream_t stream)
{
    logging_t *lg = (logging_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    uint64_t t = now_ns(); /* before anyone can be handed this memory again */
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    if (RK_LIKELY(st == RANKMEM_SUCCESS)) /* a refused free freed nothing: no line */
        log_event(lg, t, ACTION("free"), ptr, bytes, stream);
    return st;
}

static void drain_all(logging_t *lg)
{
    for (rk_tslot_t *t = rk_tslot_first(&lg->bufs); t; t = t->next) {
        logbuf_t *b = rk_tslot_payload(t);
        pthread_mutex_lock(&b->lock);
        drain(lg, b);
        pthread_mutex_unlock(&b->lock);
    }
}

rankmem_status_t rankmem_logging_flush(rankmem_resource_t *mr)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_logging_flush: NULL resource");
    if (mr->ops != &logging_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_logging_flush: resource '%s' is not a logging adaptor",
                        mr->ops->name ? mr->ops->name : "unnamed");
    logging_t *lg = (logging_t *)mr;
    drain_all(lg);
    pthread_mutex_lock(&lg->file_lock);
    int err = lg->err_errno;
    size_t lost = lg->err_bytes;
    lg->err_errno = 0;
    lg->err_bytes = 0;
    pthread_mutex_unlock(&lg->file_lock);
    if (err)
        return rk_error(RANKMEM_ERR_CONFIG,
                        "logging: writing to %s failed (%s); %zu bytes of log lost", lg->path,
                        strerror(err), lost);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t logging_query(rankmem_resource_t *mr, rankmem_query_t what,
                                      size_t *value_p)
{
    return rankmem_resource_query(mr->upstream, what, value_p);
}

static rankmem_status_t logging_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static void destroy_buf(void *payload, void *arg)
{
    (void)arg;
    pthread_mutex_destroy(&((logbuf_t *)payload)->lock);
}

static rankmem_status_t logging_finalize(rankmem_resource_t *mr)
{
    logging_t *lg = (logging_t *)mr;
    if (lg->fd >= 0) {
        drain_all(lg);
        if (lg->lost_bytes)
            fprintf(stderr, "rankmem: logging: %zu bytes of log could not be written to %s\n",
                    lg->lost_bytes, lg->path);
        close(lg->fd);
    }
    rk_tslot_set_fini(&lg->bufs, destroy_buf, NULL);
    if (lg->file_lock_ok)
        pthread_mutex_destroy(&lg->file_lock);
    free(lg->path);
    free(lg);
    return RANKMEM_SUCCESS;
}

static int logging_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const logging_t *lg = (const logging_t *)mr;
    /* Quoted when the path holds what the spec grammar uses as punctuation. */
    if (lg->explicit_path && strpbrk(lg->path, ",()>= \t"))
        return snprintf(buf, len, "logging(file=\"%s\")", lg->path);
    if (lg->explicit_path)
        return snprintf(buf, len, "logging(file=%s)", lg->path);
    return snprintf(buf, len, "logging");
}

static const rankmem_resource_ops_t logging_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "logging",
    .allocate = logging_allocate,
    .deallocate = logging_deallocate,
    .query = logging_query,
    .trim = logging_trim,
    .finalize = logging_finalize,
    .describe = logging_describe,
};

/* A thread takes a buffer: a fresh one needs its lock; either way the
 * thread gets the next id (an adopted buffer keeps the dead thread's lines
 * under its id). Runs under tslot's global lock. */
static void attach_buf(rk_tslot_set_t *set, void *payload, int fresh)
{
    logging_t *lg = (logging_t *)((char *)set - offsetof(logging_t, bufs));
    logbuf_t *b = payload;
    if (fresh)
        pthread_mutex_init(&b->lock, NULL);
    pthread_mutex_lock(&b->lock);
    b->thread = __atomic_fetch_add(&lg->next_thread, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&b->lock);
}

rankmem_status_t rankmem_logging_create(rankmem_resource_t *upstream, const char *path,
                                        rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_logging_create: NULL %s",
                        upstream ? "output pointer" : "upstream");
    int explicit_path = path != NULL;
    if (!path) {
        if (rk_option_string("RANKMEM_LOG_FILE", &path) != RANKMEM_SUCCESS)
            path = NULL;
        if (!path || !*path)
            return rk_error(RANKMEM_ERR_CONFIG,
                            "logging: no log file: pass a path or set RANKMEM_LOG_FILE");
    } else if (!*path) {
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_logging_create: empty path");
    }
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(logging_t), &logging_ops, upstream->props,
                                          upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    mr->device = upstream->device;
    logging_t *lg = (logging_t *)mr;
    lg->fd = -1;
    lg->explicit_path = explicit_path;
    rk_tslot_set_init(&lg->bufs, sizeof(logbuf_t), attach_buf);
    if (!(lg->path = strdup(path))) {
        rankmem_resource_release(mr);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "logging: no host memory for the path");
    }
    if (pthread_mutex_init(&lg->file_lock, NULL) != 0) {
        rankmem_resource_release(mr);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "logging: cannot create a mutex");
    }
    lg->file_lock_ok = 1;
    /* O_APPEND: whole buffers land at the end even if another writer shares the file. */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        rankmem_resource_release(mr);
        return rk_error(RANKMEM_ERR_CONFIG, "logging: cannot open %s%s: %s", path,
                        explicit_path ? "" : " (RANKMEM_LOG_FILE)", strerror(e));
    }
    lg->fd = fd;
    write_all(lg, HEADER, sizeof HEADER - 1);
    if (lg->err_errno) {
        int e = lg->err_errno;
        lg->lost_bytes = 0; /* said here; finalize need not repeat it */
        rankmem_resource_release(mr);
        return rk_error(RANKMEM_ERR_CONFIG, "logging: cannot write to %s%s: %s", path,
                        explicit_path ? "" : " (RANKMEM_LOG_FILE)", strerror(e));
    }
    lg->t0 = now_ns();
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
