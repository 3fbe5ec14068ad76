/* tracking: every live allocation with its size, stream and, when asked,
 * the call stack that made it; a leak report.
 *
 * Pointer-keyed maps (ptrmap.h) hold a small record per live allocation.
 * So that threads scale, the maps are the parts of blocks.h's shard
 * machinery: a thread records what it allocates in the part of its thread
 * slot (its own while there are no more threads than parts), under a lock
 * biased to it (bias.h: plain loads and stores while no other thread
 * comes), and a free looks in the freeing thread's part first, then in the
 * others. Parts were picked by a hash of the pointer before (issue 21):
 * each thread of a benchmark reuses a few addresses, and with 16 threads
 * over 64 parts two threads' addresses often shared a part, whose lock
 * and map lines then moved between their cores on every call (59 M pairs/s
 * at 8 threads, 34 M at 16). Records are allocated and backtraces
 * taken before the lock, and the upstream is called outside it. A free
 * the maps do not know (double free, foreign pointer) or with another size
 * than the allocation is refused before the upstream sees it: put
 * tracking over a resource that would corrupt itself on such a call.
 *
 * Live bytes and count are the sums of the parts' (every part locked):
 * exact whenever no call is in flight. The high-water mark is an
 * rk_tpeak_t (tslot.h): exact with one thread, within n * TRACKING_SLACK
 * bytes of the true peak with n threads. */
#define _GNU_SOURCE
#include "internal.h"
#include "blocks.h"
#include "ptrmap.h"
#include "tslot.h"

#include <execinfo.h>
#include <inttypes.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FRAMES 16
#define SKIP_MAX 16 /* rankmem's own frames above the caller (adaptors over adaptors) */

typedef struct {
    size_t bytes;
    rankmem_stream_t stream;
    int nframes;
    void *frames[]; /* MAX_FRAMES when backtraces are on */
} record_t;

#define TRACKING_SLACK ((size_t)8 << 20) /* the peak's bound per thread: see stats.c */

/* A part is a shard (lock, live map, used = live bytes, live = count),
 * RK_SHARD_APART bytes from the next. */
#define PART sizeof(rk_shard_t)

typedef struct {
    rankmem_resource_t base;
    int backtraces;
    rk_tpeak_t high; /* live bytes, for the high-water mark */
    rk_tslot_set_t slots; /* of rk_tpeak_local_t */
    void *parts;     /* RK_NSHARDS parts of PART bytes */
} tracking_t;

static inline rk_shard_t *part_at(tracking_t *t, unsigned i)
{
    return rk_shard_at(t->parts, PART, i);
}

/* The high-water mark follows the maps: d is two's complement. */
static inline void high_move(tracking_t *t, size_t d, int up)
{
    rk_tpeak_local_t *l = rk_tslot_get(&t->slots);
    if (RK_UNLIKELY(!l))
        rk_tpeak_add_shared(&t->high, d);
    else if (up)
        rk_tpeak_add(&t->high, l, d, TRACKING_SLACK);
    else
        rk_tpeak_sub(&t->high, l, (size_t)0 - d, TRACKING_SLACK);
}

static const rankmem_resource_ops_t tracking_ops;

/* ---- call stacks ---- */

/* The executable segment holding this file's code: frames inside it are
 * rankmem's own and are dropped, so a call site is the user's code. */
static uintptr_t self_lo, self_hi;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static int find_self(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    uintptr_t a = (uintptr_t)arg;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t lo = (uintptr_t)info->dlpi_addr + ph->p_vaddr;
        if (a >= lo && a < lo + ph->p_memsz) {
            self_lo = lo;
            self_hi = lo + ph->p_memsz;
            return 1;
        }
    }
    return 0;
}

static void init_self(void)
{
    dl_iterate_phdr(find_self, (void *)(uintptr_t)&find_self);
    /* Warm up: glibc's first backtrace() loads libgcc_s. */
    void *f[2];
    (void)backtrace(f, 2);
}

static inline int in_self(const void *pc)
{
    return (uintptr_t)pc >= self_lo && (uintptr_t)pc < self_hi;
}

static int capture(void **frames)
{
    void *all[MAX_FRAMES + SKIP_MAX];
    int n = backtrace(all, MAX_FRAMES + SKIP_MAX);
    /* Above our frames may sit backtrace's own (a sanitizer intercepts it);
     * below them is the caller. */
    int first = 0;
    while (first < n && !in_self(all[first]))
        first++;
    if (first == n) /* none of ours seen: keep everything */
        first = 0;
    while (first < n && in_self(all[first]))
        first++;
    if (first == n) /* linked statically into one image: cannot tell, keep all but ours */
        first = n > 1 ? 1 : 0;
    int k = n - first < MAX_FRAMES ? n - first : MAX_FRAMES;
    memcpy(frames, all + first, (size_t)k * sizeof *frames);
    return k;
}

/* ---- allocate / deallocate ---- */

static size_t record_size(const tracking_t *t)
{
    return sizeof(record_t) + (t->backtraces ? MAX_FRAMES * sizeof(void *) : 0);
}

static rankmem_status_t tracking_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                          rankmem_stream_t stream, void **ptr_p)
{
    tracking_t *t = (tracking_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    record_t *r = malloc(record_size(t));
    if (!r)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "tracking: no host memory for the record of a %zu-byte allocation", bytes);
    r->bytes = bytes;
    r->stream = stream;
    r->nframes = t->backtraces ? capture(r->frames) : 0;
    void *p;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, &p);
    if (st != RANKMEM_SUCCESS) {
        free(r);
        return st;
    }
    rk_shard_t *sh = part_at(t, rk_shard_index());
    record_t *stale = NULL;
    rk_shard_lock_own(sh);
    st = rk_shard_ready(sh);
    if (st == RANKMEM_SUCCESS) {
        /* Present already: it was freed behind our back (straight to the
         * upstream) and handed out again to this thread. The new allocation
         * replaces it. (Handed out to another thread, the stale record
         * stays in this part until this thread is handed the address again
         * or the address is freed with the stale record's size.) */
        size_t at = rk_live_find(sh, p);
        if (RK_UNLIKELY(at != SIZE_MAX)) {
            stale = sh->live_map.slots[at].value;
            rk_live_drop(sh, at, stale->bytes);
        }
        st = rk_live_add(sh, p, r, bytes);
    }
    rk_shard_unlock(sh);
    if (stale) {
        high_move(t, (size_t)0 - stale->bytes, 0);
        free(stale);
    }
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS)) {
        up->ops->deallocate(up, p, bytes, alignment, stream);
        free(r);
        return rk_error(st, "tracking: cannot record a %zu-byte allocation", bytes);
    }
    high_move(t, bytes, 1);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t tracking_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                            size_t alignment, rankmem_stream_t stream)
{
    tracking_t *t = (tracking_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    size_t at;
    /* The freeing thread's part first: mostly the thread that allocated. */
    rk_shard_t *sh = rk_shard_find_live(t->parts, PART, part_at(t, rk_shard_index()), 0, ptr,
                                        &at);
    if (!sh)
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "tracking: deallocate of %p (%zu bytes), which is not live here "
                        "(double free or foreign pointer)",
                        ptr, bytes);
    record_t *r = sh->live_map.slots[at].value;
    if (r->bytes != bytes) {
        size_t had = r->bytes;
        rk_shard_unlock(sh);
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "tracking: deallocate of %p with %zu bytes, but it was allocated with "
                        "%zu bytes",
                        ptr, bytes, had);
    }
    rk_live_drop(sh, at, bytes);
    rk_shard_unlock(sh);
    /* Out before the upstream has it: another thread may be handed the
     * same memory at once, and counting it twice would inflate the peak. */
    high_move(t, (size_t)0 - bytes, 0);
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    if (st != RANKMEM_SUCCESS) {
        /* The upstream kept it: it is still live, in the part it was in.
         * Removing one entry left room for it, so this insert cannot need
         * to grow the map. */
        rk_shard_lock(sh);
        int back = rk_live_add(sh, ptr, r, bytes) == RANKMEM_SUCCESS;
        rk_shard_unlock(sh);
        if (back)
            high_move(t, bytes, 0); /* live before: no new peak */
        else
            free(r);
        return st;
    }
    free(r);
    return RANKMEM_SUCCESS;
}

/* ---- snapshots, list and report ---- */

typedef struct {
    void *ptr;
    size_t bytes;
    rankmem_stream_t stream;
    int nframes;
    void *frames[MAX_FRAMES];
} entry_t;

typedef struct {
    entry_t *e;
    size_t n;
} snap_t;

static void snap_one(const void *key, void *value, void *arg)
{
    snap_t *s = arg;
    const record_t *r = value;
    entry_t *e = &s->e[s->n++];
    e->ptr = (void *)key;
    e->bytes = r->bytes;
    e->stream = r->stream;
    e->nframes = r->nframes;
    memcpy(e->frames, r->frames, (size_t)r->nframes * sizeof(void *));
}

/* Every part locked, in order: a snapshot consistent across parts. */
static void lock_all(tracking_t *t) { rk_shards_lock_all(t->parts, PART); }
static void unlock_all(tracking_t *t) { rk_shards_unlock_all(t->parts, PART); }

/* Live bytes and count. Caller holds every lock (or, at finalize, no
 * other thread runs). */
static void sum_shards(tracking_t *t, size_t *bytes_p, size_t *count_p)
{
    size_t b = 0, n = 0;
    for (unsigned i = 0; i < RK_NSHARDS; i++) {
        b += part_at(t, i)->used;
        n += part_at(t, i)->live;
    }
    *bytes_p = b;
    *count_p = n;
}

/* A copy of every live record, so that formatting runs without the locks. */
static rankmem_status_t snapshot(tracking_t *t, snap_t *s, size_t *bytes_p)
{
    lock_all(t);
    size_t n, bytes;
    sum_shards(t, &bytes, &n);
    s->n = 0;
    s->e = malloc((n ? n : 1) * sizeof *s->e);
    if (!s->e) {
        unlock_all(t);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "tracking: no host memory to copy %zu live allocations", n);
    }
    for (unsigned i = 0; i < RK_NSHARDS; i++)
        if (part_at(t, i)->live_map.slots)
            rk_ptrmap_each(&part_at(t, i)->live_map, snap_one, s);
    if (bytes_p)
        *bytes_p = bytes;
    unlock_all(t);
    return RANKMEM_SUCCESS;
}

/* Largest first; equal sizes by address, so that output repeats. */
static int by_size(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return (uintptr_t)x->ptr < (uintptr_t)y->ptr ? -1 : (uintptr_t)x->ptr > (uintptr_t)y->ptr;
}

static int by_stack(const void *a, const void *b)
{
    const entry_t *x = a, *y = b;
    if (x->nframes != y->nframes)
        return x->nframes < y->nframes ? -1 : 1;
    int c = memcmp(x->frames, y->frames, (size_t)x->nframes * sizeof(void *));
    return c ? c : by_size(a, b);
}

static int same_stack(const entry_t *x, const entry_t *y)
{
    return x->nframes == y->nframes &&
           memcmp(x->frames, y->frames, (size_t)x->nframes * sizeof(void *)) == 0;
}

static rankmem_status_t check_tracking(rankmem_resource_t *mr, const char *fn)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: NULL resource", fn);
    if (mr->ops != &tracking_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: resource '%s' is not a tracking adaptor", fn,
                        mr->ops->name ? mr->ops->name : "unnamed");
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_tracking_outstanding(rankmem_resource_t *mr, size_t *bytes_p,
                                              size_t *count_p)
{
    rankmem_status_t st = check_tracking(mr, "rankmem_tracking_outstanding");
    if (st != RANKMEM_SUCCESS)
        return st;
    if (!bytes_p || !count_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_tracking_outstanding: NULL %s",
                        bytes_p ? "count output" : "bytes output");
    tracking_t *t = (tracking_t *)mr;
    size_t b, n;
    lock_all(t);
    sum_shards(t, &b, &n);
    unlock_all(t);
    *bytes_p = b;
    *count_p = n;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_tracking_list(rankmem_resource_t *mr, rankmem_allocation_t *out,
                                       size_t capacity, size_t *count_p)
{
    rankmem_status_t st = check_tracking(mr, "rankmem_tracking_list");
    if (st != RANKMEM_SUCCESS)
        return st;
    if (!count_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_tracking_list: NULL count output");
    if (!out && capacity)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_tracking_list: NULL array with capacity %zu", capacity);
    snap_t s;
    if ((st = snapshot((tracking_t *)mr, &s, NULL)) != RANKMEM_SUCCESS)
        return st;
    qsort(s.e, s.n, sizeof *s.e, by_size);
    for (size_t i = 0; i < s.n && i < capacity; i++)
        out[i] = (rankmem_allocation_t){s.e[i].ptr, s.e[i].bytes, s.e[i].stream};
    *count_p = s.n;
    free(s.e);
    return RANKMEM_SUCCESS;
}

static void print_entry(FILE *out, const entry_t *e)
{
    fprintf(out, "  0x%" PRIxPTR ": %zu bytes, stream 0x%" PRIxPTR "\n", (uintptr_t)e->ptr,
            e->bytes, (uintptr_t)e->stream);
}

typedef struct {
    size_t first, n, bytes;
} group_t;

static int group_by_bytes(const void *a, const void *b)
{
    const group_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return x->first < y->first ? -1 : x->first > y->first;
}

static rankmem_status_t report_sites(FILE *out, snap_t *s, size_t total)
{
    qsort(s->e, s->n, sizeof *s->e, by_stack); /* same stacks side by side */
    group_t *g = malloc((s->n ? s->n : 1) * sizeof *g);
    if (!g)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "tracking: no host memory for the report");
    size_t ng = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (i == 0 || !same_stack(&s->e[i - 1], &s->e[i]))
            g[ng++] = (group_t){i, 0, 0};
        g[ng - 1].n++;
        g[ng - 1].bytes += s->e[i].bytes;
    }
    qsort(g, ng, sizeof *g, group_by_bytes);
    fprintf(out, "rankmem tracking: %zu live allocations, %zu bytes, %zu call sites\n", s->n,
            total, ng);
    for (size_t k = 0; k < ng; k++) {
        entry_t *e = &s->e[g[k].first];
        fprintf(out, "call site %zu of %zu: %zu allocations, %zu bytes\n", k + 1, ng, g[k].n,
                g[k].bytes);
        char **names = e->nframes ? backtrace_symbols(e->frames, e->nframes) : NULL;
        for (int f = 0; f < e->nframes; f++) {
            if (names)
                fprintf(out, "    at %s\n", names[f]);
            else
                fprintf(out, "    at 0x%" PRIxPTR "\n", (uintptr_t)e->frames[f]);
        }
        if (!e->nframes)
            fprintf(out, "    (no stack)\n");
        free(names);
        for (size_t i = 0; i < g[k].n; i++) /* sorted largest first within the stack */
            print_entry(out, &e[i]);
    }
    free(g);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_tracking_report(rankmem_resource_t *mr, FILE *out)
{
    rankmem_status_t st = check_tracking(mr, "rankmem_tracking_report");
    if (st != RANKMEM_SUCCESS)
        return st;
    if (!out)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_tracking_report: NULL FILE");
    tracking_t *t = (tracking_t *)mr;
    snap_t s;
    size_t total;
    if ((st = snapshot(t, &s, &total)) != RANKMEM_SUCCESS)
        return st;
    if (t->backtraces) {
        st = report_sites(out, &s, total);
    } else {
        qsort(s.e, s.n, sizeof *s.e, by_size);
        fprintf(out, "rankmem tracking: %zu live allocations, %zu bytes\n", s.n, total);
        for (size_t i = 0; i < s.n; i++)
            print_entry(out, &s.e[i]);
    }
    free(s.e);
    if (st == RANKMEM_SUCCESS && (fflush(out) != 0 || ferror(out)))
        st = rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_tracking_report: cannot write the report");
    return st;
}

/* ---- the rest of the interface ---- */

static rankmem_status_t tracking_query(rankmem_resource_t *mr, rankmem_query_t what,
                                       size_t *value_p)
{
    tracking_t *t = (tracking_t *)mr;
    size_t b, n;
    switch (what) {
    case RANKMEM_QUERY_USED_CURRENT:
    case RANKMEM_QUERY_LIVE_COUNT:
        lock_all(t);
        sum_shards(t, &b, &n);
        unlock_all(t);
        *value_p = what == RANKMEM_QUERY_USED_CURRENT ? b : n;
        return RANKMEM_SUCCESS;
    case RANKMEM_QUERY_USED_HIGH:
        *value_p = rk_tpeak_peak(&t->high, &t->slots, 0);
        return RANKMEM_SUCCESS;
    default:
        return rankmem_resource_query(mr->upstream, what, value_p);
    }
}

static rankmem_status_t tracking_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static void free_record(const void *key, void *value, void *arg)
{
    (void)key;
    (void)arg;
    free(value);
}

/* Live allocations at the end are the user's leak: say so once and forget
 * them. The memory stays with the upstream, which reclaims it as it sees fit. */
static rankmem_status_t tracking_finalize(rankmem_resource_t *mr)
{
    tracking_t *t = (tracking_t *)mr;
    if (t->parts) {
        size_t b, n;
        sum_shards(t, &b, &n);
        if (n)
            fprintf(stderr,
                    "rankmem: tracking: released with %zu live allocations (%zu bytes) still "
                    "held by its upstream\n",
                    n, b);
        for (unsigned i = 0; i < RK_NSHARDS; i++)
            if (part_at(t, i)->live_map.slots)
                rk_ptrmap_each(&part_at(t, i)->live_map, free_record, NULL);
        rk_shards_free(t->parts, PART);
    }
    if (t->slots.id)
        rk_tslot_set_fini(&t->slots, NULL, NULL);
    free(t);
    return RANKMEM_SUCCESS;
}

static int tracking_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const tracking_t *t = (const tracking_t *)mr;
    return snprintf(buf, len, t->backtraces ? "tracking(backtraces=1)" : "tracking");
}

static const rankmem_resource_ops_t tracking_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "tracking",
    .allocate = tracking_allocate,
    .deallocate = tracking_deallocate,
    .query = tracking_query,
    .trim = tracking_trim,
    .finalize = tracking_finalize,
    .describe = tracking_describe,
};

rankmem_status_t rankmem_tracking_create(rankmem_resource_t *upstream, int backtraces,
                                         rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_tracking_create: NULL %s",
                        upstream ? "output pointer" : "upstream");
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(tracking_t), &tracking_ops, upstream->props,
                                          upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    mr->device = upstream->device;
    tracking_t *t = (tracking_t *)mr;
    t->backtraces = backtraces != 0;
    rk_tpeak_init(&t->high);
    rk_tslot_set_init(&t->slots, sizeof(rk_tpeak_local_t), NULL);
    if ((st = rk_shards_new(PART, &t->parts)) != RANKMEM_SUCCESS) {
        rankmem_resource_release(mr); /* finalize frees it and drops the upstream */
        return rk_error(st, "rankmem_tracking_create: no host memory for its parts");
    }
    if (t->backtraces)
        pthread_once(&self_once, init_self);
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
