/* stats: current, peak and total of what passes through, for bytes (as
 * requested) and for allocation count, plus failures; nested scopes.
 *
 * Cost on the hot path is the point: the adaptor is meant to stay on in
 * production, and OpenMP codes allocate from many threads at once. A
 * lock-prefixed instruction costs ~5 ns alone and far more when threads
 * fight over its line, so nothing on the common path writes a shared line:
 *  - every counter is per thread (tslot.h): each thread adds to its own
 *    slot with plain relaxed stores; totals and currents are the sums of
 *    the slots, exact at every query made while no update is in flight;
 *  - the peaks are rk_tpeak_t counters (tslot.h): a thread publishes its
 *    change into a shared sum only when it reaches STATS_SLACK_BYTES (or
 *    STATS_SLACK_COUNT allocations) either way, so a pair of allocate and
 *    free below those sizes touches no shared line. The reported peak is
 *    exact while one thread uses the adaptor, and within n * slack of the
 *    true peak with n threads (n: the threads that have used it, at most
 *    the number alive at once plus those whose slots wait for adoption);
 *  - failures are a shared counter: a failure is not a hot path.
 *
 * Scopes: push records the current values and totals and restarts the
 * peaks at the current values (rk_tpeak_reset); pop reports the
 * differences and raises the live peaks back to what push set aside, which
 * folds the scope's peak into its parent. The scope stack sits under a
 * mutex that the hot path never takes. The peaks since creation are the
 * maximum of the live peak and every saved one. */
#include "internal.h"
#include "tslot.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Sizes below these never touch a shared line in an allocate/free pair;
 * the peak's bound is n times them. 8 MiB: larger than the working sizes
 * of the benchmarks and most halo and scratch buffers, and a small error
 * next to a GPU's tens of GiB. */
#define STATS_SLACK_BYTES ((size_t)8 << 20)
#define STATS_SLACK_COUNT ((size_t)8)

typedef struct {
    rk_tpeak_local_t bytes, count;
    size_t bytes_total, count_total; /* written by the slot's thread only */
} slot_t;

typedef struct {
    size_t bytes, count;
} pair_t;

/* What push saw, and the enclosing peaks it set aside. */
typedef struct {
    pair_t current, total;
    size_t failures;
    pair_t saved_peak;
} scope_t;

typedef struct {
    rankmem_resource_t base;
    rk_tpeak_t bytes, count;
    size_t failures;  /* atomic */
    pair_t spill;     /* atomic: totals of calls made by a thread that got no slot */
    rk_tslot_set_t slots;
    pthread_mutex_t lock; /* the scope stack */
    int lock_ok;
    scope_t *scopes;
    size_t depth, cap;
} stats_t;

static const rankmem_resource_ops_t stats_ops;

#define OFF_BYTES offsetof(slot_t, bytes)
#define OFF_COUNT offsetof(slot_t, count)

/* Single writer: a relaxed load and store, no lock prefix. */
static inline void bump(size_t *x, size_t d)
{
    __atomic_store_n(x, __atomic_load_n(x, __ATOMIC_RELAXED) + d, __ATOMIC_RELAXED);
}

/* ---- hot path ----
 *
 * One thread, a pair below its peak: each call finds its slot in the
 * thread's cache, moves its counters with plain stores and compares them
 * with their bounds (rk_tpeak_add/sub's fast path, written out here for
 * both counters at once). Anything else (no cached slot, a bound crossed,
 * a reset, a failure) goes to a noinline function, so that the fast path
 * makes no call but the upstream's and keeps few registers across it. */

/* The slot of the stats adaptor this thread used last (keyed by its set's
 * id, unique for the process): one %fs-relative compare and load, where
 * rk_tslot_peek indexes a table. The usual program has one stats adaptor
 * (the rank's); another one used in turn falls back to rk_tslot_get. */
#define last (rk_tslot_mru[RK_TSLOT_MRU_STATS])

static inline __attribute__((always_inline)) slot_t *slot_peek(const stats_t *s)
{
    if (RK_LIKELY(last.id == s->slots.id)) {
        slot_t *t = last.payload;
        if (!t) /* never: the entry is filled with a slot */
            __builtin_unreachable();
        return t;
    }
    return NULL;
}

/* A miss of `last`: the set's slot (NULL if none could be made), cached. */
static slot_t *slot_get(stats_t *s)
{
    slot_t *t = rk_tslot_get(&s->slots);
    if (t)
        last = (rk_tslot_cache_t){s->slots.id, t};
    return t;
}

/* A thread that got no slot: straight to the shared sums. */
static __attribute__((noinline, cold)) void count_shared(stats_t *s, size_t db, size_t dc,
                                                          int alloc)
{
    rk_tpeak_add_shared(&s->bytes, db);
    rk_tpeak_add_shared(&s->count, dc);
    if (alloc) {
        __atomic_add_fetch(&s->spill.bytes, db, __ATOMIC_RELAXED);
        __atomic_add_fetch(&s->spill.count, dc, __ATOMIC_RELAXED);
    }
}

/* An allocation of `bytes` counted in, the slow way. */
static __attribute__((noinline, cold)) rankmem_status_t count_in_slow(stats_t *s, size_t bytes)
{
    slot_t *t = slot_get(s);
    if (!t) {
        count_shared(s, bytes, 1, 1);
        return RANKMEM_SUCCESS;
    }
    rk_tpeak_add(&s->bytes, &t->bytes, bytes, STATS_SLACK_BYTES);
    rk_tpeak_add(&s->count, &t->count, 1, STATS_SLACK_COUNT);
    bump(&t->bytes_total, bytes);
    bump(&t->count_total, 1);
    return RANKMEM_SUCCESS;
}

/* After the fast path's stores: a bound crossed, or a reset. */
static __attribute__((noinline, cold)) rankmem_status_t counted_in_slow(stats_t *s, slot_t *t)
{
    rk_tpeak_slow(&s->bytes, &t->bytes, STATS_SLACK_BYTES);
    rk_tpeak_slow(&s->count, &t->count, STATS_SLACK_COUNT);
    return RANKMEM_SUCCESS;
}

static __attribute__((noinline, cold)) rankmem_status_t failed(stats_t *s, rankmem_status_t st)
{
    __atomic_add_fetch(&s->failures, 1, __ATOMIC_RELAXED);
    return st;
}

static rankmem_status_t stats_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    stats_t *s = (stats_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        return failed(s, st);
    slot_t *t = slot_peek(s);
    if (RK_UNLIKELY(!t))
        return count_in_slow(s, bytes);
    size_t cb = t->bytes.cur + bytes, cc = t->count.cur + 1;
    __atomic_store_n(&t->bytes.cur, cb, __ATOMIC_RELAXED);
    __atomic_store_n(&t->count.cur, cc, __ATOMIC_RELAXED);
    bump(&t->bytes_total, bytes);
    bump(&t->count_total, 1);
    /* A reset lowers hi: no epoch to compare here. */
    if (RK_UNLIKELY((ptrdiff_t)cb > __atomic_load_n(&t->bytes.hi, __ATOMIC_RELAXED) ||
                    (ptrdiff_t)cc > __atomic_load_n(&t->count.hi, __ATOMIC_RELAXED)))
        return counted_in_slow(s, t);
    return RANKMEM_SUCCESS;
}

/* Moves the currents by db bytes and dc blocks, two's complement: out
 * (negative) for a free, back in for what the upstream refused to take,
 * with no peak to raise (it was live before). Counted out before the
 * upstream has the memory: once it does, another thread may be handed it,
 * and counting it twice would inflate the peak. */
static __attribute__((noinline, cold)) void count_move(stats_t *s, size_t db, size_t dc)
{
    slot_t *t = slot_get(s);
    if (RK_LIKELY(t != NULL)) {
        rk_tpeak_sub(&s->bytes, &t->bytes, (size_t)0 - db, STATS_SLACK_BYTES);
        rk_tpeak_sub(&s->count, &t->count, (size_t)0 - dc, STATS_SLACK_COUNT);
    } else {
        count_shared(s, db, dc, 0);
    }
}

static __attribute__((noinline, cold)) rankmem_status_t
dealloc_slow(stats_t *s, void *ptr, size_t bytes, size_t alignment, rankmem_stream_t stream)
{
    rankmem_resource_t *up = s->base.upstream;
    count_move(s, (size_t)0 - bytes, (size_t)0 - 1);
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    if (st != RANKMEM_SUCCESS)
        count_move(s, bytes, 1);
    return st;
}

static __attribute__((noinline, cold)) rankmem_status_t refused(stats_t *s, size_t bytes,
                                                               rankmem_status_t st)
{
    count_move(s, bytes, 1);
    return st;
}

static rankmem_status_t stats_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    stats_t *s = (stats_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    slot_t *t = slot_peek(s);
    if (RK_UNLIKELY(!t))
        return dealloc_slow(s, ptr, bytes, alignment, stream);
    size_t cb = t->bytes.cur - bytes, cc = t->count.cur - 1;
    /* A bound crossed (a flush due): the slow way, before any store. */
    if (RK_UNLIKELY((ptrdiff_t)cb < t->bytes.lo || (ptrdiff_t)cc < t->count.lo))
        return dealloc_slow(s, ptr, bytes, alignment, stream);
    __atomic_store_n(&t->bytes.cur, cb, __ATOMIC_RELAXED);
    __atomic_store_n(&t->count.cur, cc, __ATOMIC_RELAXED);
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        return refused(s, bytes, st);
    return st;
}

/* A batch counted out at once, passed upstream as a batch (a pool under
 * the adaptor then takes its lock once); the blocks it refused counted
 * back in. */
static rankmem_status_t stats_deallocate_many(rankmem_resource_t *mr, const rankmem_block_t *blocks,
                                              size_t n, rankmem_stream_t stream,
                                              rankmem_status_t *status)
{
    stats_t *s = (stats_t *)mr;
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += blocks[i].bytes;
    count_move(s, (size_t)0 - bytes, (size_t)0 - n);
    rankmem_status_t first = rk_deallocate_many(mr->upstream, blocks, n, stream, status);
    if (RK_UNLIKELY(first != RANKMEM_SUCCESS)) {
        size_t back = 0, count = 0;
        for (size_t i = 0; i < n; i++)
            if (status[i] != RANKMEM_SUCCESS) {
                back += blocks[i].bytes;
                count++;
            }
        count_move(s, back, count);
    }
    return first;
}

/* ---- reading ---- */

static pair_t current_read(stats_t *s)
{
    return (pair_t){rk_tpeak_current(&s->bytes, &s->slots, OFF_BYTES),
                    rk_tpeak_current(&s->count, &s->slots, OFF_COUNT)};
}

/* The live peaks: since the innermost push, or creation. */
static pair_t peak_read(stats_t *s)
{
    return (pair_t){rk_tpeak_peak(&s->bytes, &s->slots, OFF_BYTES),
                    rk_tpeak_peak(&s->count, &s->slots, OFF_COUNT)};
}

static pair_t totals_sum(stats_t *s)
{
    pair_t sum = {__atomic_load_n(&s->spill.bytes, __ATOMIC_RELAXED),
                  __atomic_load_n(&s->spill.count, __ATOMIC_RELAXED)};
    for (rk_tslot_t *t = rk_tslot_first(&s->slots); t; t = t->next) {
        slot_t *tt = rk_tslot_payload(t);
        sum.bytes += __atomic_load_n(&tt->bytes_total, __ATOMIC_RELAXED);
        sum.count += __atomic_load_n(&tt->count_total, __ATOMIC_RELAXED);
    }
    return sum;
}

static inline size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

/* Counters since creation. Caller holds s->lock (the saved peaks). */
static void snapshot(stats_t *s, rankmem_stats_t *out)
{
    pair_t cur = current_read(s);
    pair_t tot = totals_sum(s);
    pair_t peak = peak_read(s);
    for (size_t i = 0; i < s->depth; i++) {
        peak.bytes = max_size(peak.bytes, s->scopes[i].saved_peak.bytes);
        peak.count = max_size(peak.count, s->scopes[i].saved_peak.count);
    }
    memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    out->version = RANKMEM_STATS_VERSION;
    out->bytes_current = cur.bytes;
    /* Read after the current: an update in between may have raised it. */
    out->bytes_peak = max_size(peak.bytes, cur.bytes);
    out->bytes_total = tot.bytes;
    out->count_current = cur.count;
    out->count_peak = max_size(peak.count, cur.count);
    out->count_total = tot.count;
    out->failures = __atomic_load_n(&s->failures, __ATOMIC_RELAXED);
}

/* The part of the v1 struct every caller must have: size and version. */
#define STATS_MIN_SIZE (offsetof(rankmem_stats_t, version) + sizeof(unsigned))

static rankmem_status_t check_stats(rankmem_resource_t *mr, const char *fn)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: NULL resource", fn);
    if (mr->ops != &stats_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: resource '%s' is not a stats adaptor",
                        fn, mr->ops->name ? mr->ops->name : "unnamed");
    return RANKMEM_SUCCESS;
}

static rankmem_status_t check_out(const rankmem_stats_t *p, const char *fn)
{
    if (p->size < STATS_MIN_SIZE)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: stats size %zu is smaller than its size and version fields (%zu); "
                        "set size = sizeof(rankmem_stats_t)",
                        fn, p->size, (size_t)STATS_MIN_SIZE);
    return RANKMEM_SUCCESS;
}

/* Fill what the caller's (maybe older, shorter) struct has room for. */
static void copy_out(rankmem_stats_t *dst, rankmem_stats_t *src)
{
    size_t n = dst->size < sizeof *src ? dst->size : sizeof *src;
    src->size = dst->size;
    memcpy(dst, src, n);
}

rankmem_status_t rankmem_stats_get(rankmem_resource_t *mr, rankmem_stats_t *stats_p)
{
    rankmem_status_t st = check_stats(mr, "rankmem_stats_get");
    if (st != RANKMEM_SUCCESS)
        return st;
    if (!stats_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_stats_get: NULL output");
    if ((st = check_out(stats_p, "rankmem_stats_get")) != RANKMEM_SUCCESS)
        return st;
    stats_t *s = (stats_t *)mr;
    rankmem_stats_t all;
    pthread_mutex_lock(&s->lock);
    snapshot(s, &all);
    pthread_mutex_unlock(&s->lock);
    copy_out(stats_p, &all);
    return RANKMEM_SUCCESS;
}

/* ---- scopes ---- */

rankmem_status_t rankmem_stats_push(rankmem_resource_t *mr)
{
    rankmem_status_t st = check_stats(mr, "rankmem_stats_push");
    if (st != RANKMEM_SUCCESS)
        return st;
    stats_t *s = (stats_t *)mr;
    pthread_mutex_lock(&s->lock);
    if (s->depth == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        scope_t *n = realloc(s->scopes, cap * sizeof *n);
        if (!n) {
            pthread_mutex_unlock(&s->lock);
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                            "rankmem_stats_push: cannot grow the scope stack to %zu", cap);
        }
        s->scopes = n;
        s->cap = cap;
    }
    scope_t *sc = &s->scopes[s->depth++];
    sc->saved_peak = peak_read(s);
    /* The caller's own slot is flushed first: a scope pushed by the thread
     * that allocates keeps its peak exact. */
    slot_t *self = rk_tslot_get(&s->slots);
    sc->current.bytes = rk_tpeak_reset(&s->bytes, &s->slots, OFF_BYTES,
                                       self ? &self->bytes : NULL);
    sc->current.count = rk_tpeak_reset(&s->count, &s->slots, OFF_COUNT,
                                       self ? &self->count : NULL);
    sc->total = totals_sum(s);
    sc->failures = __atomic_load_n(&s->failures, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&s->lock);
    return RANKMEM_SUCCESS;
}

static inline size_t minus(size_t a, size_t b) { return a > b ? a - b : 0; }

rankmem_status_t rankmem_stats_pop(rankmem_resource_t *mr, rankmem_stats_t *scope_p)
{
    rankmem_status_t st = check_stats(mr, "rankmem_stats_pop");
    if (st != RANKMEM_SUCCESS)
        return st;
    if (scope_p && (st = check_out(scope_p, "rankmem_stats_pop")) != RANKMEM_SUCCESS)
        return st;
    stats_t *s = (stats_t *)mr;
    pthread_mutex_lock(&s->lock);
    if (s->depth == 0) {
        pthread_mutex_unlock(&s->lock);
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_stats_pop: no scope to pop (pop without push)");
    }
    scope_t *sc = &s->scopes[s->depth - 1];
    pair_t cur = current_read(s);
    pair_t tot = totals_sum(s);
    pair_t peak = peak_read(s);
    rankmem_stats_t r;
    memset(&r, 0, sizeof r);
    r.version = RANKMEM_STATS_VERSION;
    /* A scope that frees more than it allocates has a current of 0, not a wrapped size_t. */
    r.bytes_current = minus(cur.bytes, sc->current.bytes);
    r.count_current = minus(cur.count, sc->current.count);
    r.bytes_peak = minus(peak.bytes, sc->current.bytes);
    r.count_peak = minus(peak.count, sc->current.count);
    r.bytes_total = tot.bytes - sc->total.bytes;
    r.count_total = tot.count - sc->total.count;
    r.failures = __atomic_load_n(&s->failures, __ATOMIC_RELAXED) - sc->failures;
    /* Fold: the parent's peak is the larger of its own before the push and
     * the highest point reached inside this scope. */
    rk_tpeak_raise(&s->bytes, sc->saved_peak.bytes);
    rk_tpeak_raise(&s->count, sc->saved_peak.count);
    s->depth--;
    pthread_mutex_unlock(&s->lock);
    if (scope_p)
        copy_out(scope_p, &r);
    return RANKMEM_SUCCESS;
}

/* ---- the rest of the interface ---- */

static rankmem_status_t stats_query(rankmem_resource_t *mr, rankmem_query_t what,
                                    size_t *value_p)
{
    stats_t *s = (stats_t *)mr;
    rankmem_stats_t all;
    switch (what) {
    case RANKMEM_QUERY_USED_CURRENT:
        *value_p = current_read(s).bytes;
        return RANKMEM_SUCCESS;
    case RANKMEM_QUERY_LIVE_COUNT:
        *value_p = current_read(s).count;
        return RANKMEM_SUCCESS;
    case RANKMEM_QUERY_USED_HIGH:
        pthread_mutex_lock(&s->lock);
        snapshot(s, &all);
        pthread_mutex_unlock(&s->lock);
        *value_p = all.bytes_peak;
        return RANKMEM_SUCCESS;
    default:
        return rankmem_resource_query(mr->upstream, what, value_p);
    }
}

static rankmem_status_t stats_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static rankmem_status_t stats_finalize(rankmem_resource_t *mr)
{
    stats_t *s = (stats_t *)mr;
    rk_tslot_set_fini(&s->slots, NULL, NULL);
    if (s->lock_ok)
        pthread_mutex_destroy(&s->lock);
    free(s->scopes);
    free(s);
    return RANKMEM_SUCCESS;
}

static int stats_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    (void)mr;
    return snprintf(buf, len, "stats");
}

static const rankmem_resource_ops_t stats_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "stats",
    .allocate = stats_allocate,
    .deallocate = stats_deallocate,
    .query = stats_query,
    .trim = stats_trim,
    .finalize = stats_finalize,
    .describe = stats_describe,
    .deallocate_many = stats_deallocate_many,
};

rankmem_status_t rankmem_stats_create(rankmem_resource_t *upstream, rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_stats_create: NULL %s",
                        upstream ? "output pointer" : "upstream");
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(stats_t), &stats_ops, upstream->props, upstream,
                                          &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    mr->device = upstream->device;
    stats_t *s = (stats_t *)mr;
    if (pthread_mutex_init(&s->lock, NULL) != 0) {
        rankmem_resource_release(mr); /* finalize frees it and drops the upstream */
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "rankmem_stats_create: cannot create a mutex");
    }
    s->lock_ok = 1;
    rk_tpeak_init(&s->bytes);
    rk_tpeak_init(&s->count);
    rk_tslot_set_init(&s->slots, sizeof(slot_t), NULL);
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
