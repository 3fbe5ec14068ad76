/* stats: current, peak and total of what passes through, for bytes (as
 * requested) and for allocation count, plus failures; nested scopes.
 *
 * Cost on the hot path is the point: the adaptor is meant to stay on in
 * production. A lock-prefixed instruction costs ~5 ns; a mutex costs two.
 * So:
 *  - current bytes and current count share one 16-byte word updated by a
 *    single cmpxchg16b per call (x86-64; elsewhere two fetch-adds). Each
 *    update returns the exact value after it, so the peaks (raised by a
 *    CAS only when exceeded) are exact under any interleaving;
 *  - totals are per-thread sums (tslot.h), written only by their thread
 *    with plain relaxed stores and added up when read;
 *  - failures are a shared counter: a failure is not a hot path;
 *  - biased to one thread: most ranks drive their GPU from one host thread,
 *    and even one lock-prefixed instruction per call is most of the budget.
 *    The thread that created the adaptor (its owner) updates current and
 *    peak with plain loads and stores while it is the only user. The first
 *    other thread that allocates, frees or changes scopes switches the
 *    adaptor to the shared (atomic) mode for good: it sets `shared`, runs
 *    membarrier() so that the owner's next check sees it, and waits until
 *    the owner is out of its plain section (an asymmetric Dekker handshake:
 *    the owner's side costs two plain stores and a load). Where membarrier
 *    is not available the adaptor starts shared.
 *
 * Scopes: the live peak counters always hold the peak since the innermost
 * scope was pushed (push saves them and resets them to the current value;
 * pop raises them back to the saved value, which folds the scope's peak into
 * its parent). Totals and currents of a scope are differences from what
 * push saw. The scope stack sits under a mutex that the hot path never
 * takes. The counters since creation are the maximum of the live peak and
 * every saved one. */
#include "internal.h"
#include "tslot.h"
#include "bias.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__SIZEOF_INT128__) && defined(__GNUC__)
/* cmpxchg16b exists on every x86-64 CPU since 2006 (x86-64-v2 baseline). */
#define STATS_CX16 1
#define HOT_TARGET __attribute__((target("cx16")))
__extension__ typedef unsigned __int128 u128_t;
#else
#define STATS_CX16 0
#define HOT_TARGET
#endif

/* Current bytes (h[0]) and count (h[1]); aligned for cmpxchg16b. */
typedef union {
#if STATS_CX16
    u128_t w;
#endif
    size_t h[2];
} __attribute__((aligned(16))) current_t;

typedef struct {
    size_t bytes_total, count_total; /* written by the owning thread only */
} thread_totals_t;

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
    current_t current;
    pair_t peak;      /* atomic: peak since the innermost push (or creation) */
    size_t failures;  /* atomic */
    pair_t spill;     /* atomic: totals of calls made by a thread that got no slot */
    rk_tslot_set_t totals;
    const void *owner; /* thread_tag() of the creating thread */
    int shared;        /* atomic; 1: every thread uses the atomic path */
    int owner_busy;    /* atomic; the owner is inside a plain update */
    pthread_mutex_t lock; /* the scope stack; the switch to shared */
    int lock_ok;
    scope_t *scopes;
    size_t depth, cap;
} stats_t;

static const rankmem_resource_ops_t stats_ops;

/* ---- the owner's fast path ---- */

/* rk_thread_tag() and membarrier come from bias.h: the arenas use the same
 * handshake for their locks. */
static inline const void *thread_tag(void) { return rk_thread_tag(); }

/* Called by any thread but the owner before it touches the counters. */
static void make_shared(stats_t *s)
{
    if (RK_LIKELY(__atomic_load_n(&s->shared, __ATOMIC_ACQUIRE)))
        return;
    pthread_mutex_lock(&s->lock);
    if (!__atomic_load_n(&s->shared, __ATOMIC_RELAXED)) {
        __atomic_store_n(&s->shared, 1, __ATOMIC_SEQ_CST);
        /* A full barrier on every thread: the owner either sees shared from
         * now on, or its busy flag is visible to the loop below. */
        rk_membarrier();
        while (__atomic_load_n(&s->owner_busy, __ATOMIC_ACQUIRE))
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#else
            ;
#endif
    }
    pthread_mutex_unlock(&s->lock);
}

/* Single writer: a relaxed load and store, no lock prefix. */
static inline void bump(size_t *x, size_t d)
{
    __atomic_store_n(x, __atomic_load_n(x, __ATOMIC_RELAXED) + d, __ATOMIC_RELAXED);
}

static inline void raise_plain(size_t *peak, size_t v)
{
    if (v > __atomic_load_n(peak, __ATOMIC_RELAXED))
        __atomic_store_n(peak, v, __ATOMIC_RELAXED);
}

/* The owner's update while the adaptor is not shared; returns 0 (nothing
 * done) when it is, or when the caller is not the owner. */
static inline int owner_add(stats_t *s, size_t db, size_t dc, int raise)
{
    if (s->owner != thread_tag())
        return 0;
    __atomic_store_n(&s->owner_busy, 1, __ATOMIC_RELAXED);
    __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the other side's membarrier orders it */
    if (RK_UNLIKELY(__atomic_load_n(&s->shared, __ATOMIC_RELAXED))) {
        __atomic_store_n(&s->owner_busy, 0, __ATOMIC_RELEASE);
        return 0;
    }
    size_t b = __atomic_load_n(&s->current.h[0], __ATOMIC_RELAXED) + db;
    size_t c = __atomic_load_n(&s->current.h[1], __ATOMIC_RELAXED) + dc;
    __atomic_store_n(&s->current.h[0], b, __ATOMIC_RELAXED);
    __atomic_store_n(&s->current.h[1], c, __ATOMIC_RELAXED);
    if (raise) {
        raise_plain(&s->peak.bytes, b);
        raise_plain(&s->peak.count, c);
    }
    __atomic_store_n(&s->owner_busy, 0, __ATOMIC_RELEASE);
    return 1;
}

/* ---- hot path ---- */

/* Adds (db, dc) (two's complement for a decrease) and returns the new value. */
HOT_TARGET static inline pair_t current_add(stats_t *s, size_t db, size_t dc)
{
#if STATS_CX16
    /* A torn first guess is fine: the CAS checks it and returns the truth. */
    u128_t old = ((u128_t)__atomic_load_n(&s->current.h[1], __ATOMIC_RELAXED) << 64) |
                 __atomic_load_n(&s->current.h[0], __ATOMIC_RELAXED);
    for (;;) {
        pair_t n = {(size_t)old + db, (size_t)(old >> 64) + dc};
        u128_t want = ((u128_t)n.count << 64) | n.bytes;
        u128_t got = __sync_val_compare_and_swap(&s->current.w, old, want);
        if (RK_LIKELY(got == old))
            return n;
        old = got;
    }
#else
    pair_t n;
    n.bytes = __atomic_add_fetch(&s->current.h[0], db, __ATOMIC_RELAXED);
    n.count = __atomic_add_fetch(&s->current.h[1], dc, __ATOMIC_RELAXED);
    return n;
#endif
}

/* An atomic snapshot of both currents (not on the hot path). */
HOT_TARGET static pair_t current_read(stats_t *s)
{
#if STATS_CX16
    u128_t v = __sync_val_compare_and_swap(&s->current.w, (u128_t)0, (u128_t)0);
    return (pair_t){(size_t)v, (size_t)(v >> 64)};
#else
    return (pair_t){__atomic_load_n(&s->current.h[0], __ATOMIC_RELAXED),
                    __atomic_load_n(&s->current.h[1], __ATOMIC_RELAXED)};
#endif
}

static inline void raise_to(size_t *peak, size_t v)
{
    size_t p = __atomic_load_n(peak, __ATOMIC_RELAXED);
    while (RK_UNLIKELY(v > p) &&
           !__atomic_compare_exchange_n(peak, &p, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

HOT_TARGET static rankmem_status_t stats_allocate(rankmem_resource_t *mr, size_t bytes,
                                                  size_t alignment, rankmem_stream_t stream,
                                                  void **ptr_p)
{
    stats_t *s = (stats_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS)) {
        __atomic_add_fetch(&s->failures, 1, __ATOMIC_RELAXED);
        return st;
    }
    if (!owner_add(s, bytes, 1, 1)) {
        make_shared(s);
        pair_t now = current_add(s, bytes, 1);
        raise_to(&s->peak.bytes, now.bytes);
        raise_to(&s->peak.count, now.count);
    }
    thread_totals_t *t = rk_tslot_get(&s->totals);
    if (RK_LIKELY(t != NULL)) {
        bump(&t->bytes_total, bytes);
        bump(&t->count_total, 1);
    } else {
        __atomic_add_fetch(&s->spill.bytes, bytes, __ATOMIC_RELAXED);
        __atomic_add_fetch(&s->spill.count, 1, __ATOMIC_RELAXED);
    }
    return RANKMEM_SUCCESS;
}

/* n blocks of `bytes` in all counted out, before the upstream has them:
 * once it does, another thread may be handed the same memory, and counting
 * it twice would inflate the peak. */
HOT_TARGET static inline void count_out(stats_t *s, size_t bytes, size_t n)
{
    if (!owner_add(s, (size_t)0 - bytes, (size_t)0 - n, 0)) {
        make_shared(s);
        current_add(s, (size_t)0 - bytes, (size_t)0 - n);
    }
}

/* What the upstream refused to take back: still live. */
static inline void count_back(stats_t *s, size_t bytes, size_t n)
{
    if (!owner_add(s, bytes, n, 0))
        current_add(s, bytes, n);
}

HOT_TARGET static rankmem_status_t stats_deallocate(rankmem_resource_t *mr, void *ptr,
                                                    size_t bytes, size_t alignment,
                                                    rankmem_stream_t stream)
{
    stats_t *s = (stats_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    count_out(s, bytes, 1);
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        count_back(s, bytes, 1);
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
    count_out(s, bytes, n);
    rankmem_status_t first = rk_deallocate_many(mr->upstream, blocks, n, stream, status);
    if (RK_UNLIKELY(first != RANKMEM_SUCCESS)) {
        size_t back = 0, count = 0;
        for (size_t i = 0; i < n; i++)
            if (status[i] != RANKMEM_SUCCESS) {
                back += blocks[i].bytes;
                count++;
            }
        count_back(s, back, count);
    }
    return first;
}

/* ---- reading ---- */

static pair_t totals_sum(stats_t *s)
{
    pair_t sum = {__atomic_load_n(&s->spill.bytes, __ATOMIC_RELAXED),
                  __atomic_load_n(&s->spill.count, __ATOMIC_RELAXED)};
    for (rk_tslot_t *t = rk_tslot_first(&s->totals); t; t = t->next) {
        thread_totals_t *tt = rk_tslot_payload(t);
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
    pair_t peak = {__atomic_load_n(&s->peak.bytes, __ATOMIC_RELAXED),
                   __atomic_load_n(&s->peak.count, __ATOMIC_RELAXED)};
    for (size_t i = 0; i < s->depth; i++) {
        peak.bytes = max_size(peak.bytes, s->scopes[i].saved_peak.bytes);
        peak.count = max_size(peak.count, s->scopes[i].saved_peak.count);
    }
    memset(out, 0, sizeof *out);
    out->size = sizeof *out;
    out->version = RANKMEM_STATS_VERSION;
    out->bytes_current = cur.bytes;
    /* A peak is raised just after the current it follows: never report less. */
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
    if (s->owner != thread_tag())
        make_shared(s); /* scopes rewrite the peaks the owner updates plainly */
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
    sc->current = current_read(s);
    sc->total = totals_sum(s);
    sc->failures = __atomic_load_n(&s->failures, __ATOMIC_RELAXED);
    sc->saved_peak.bytes = __atomic_exchange_n(&s->peak.bytes, sc->current.bytes, __ATOMIC_RELAXED);
    sc->saved_peak.count = __atomic_exchange_n(&s->peak.count, sc->current.count, __ATOMIC_RELAXED);
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
    if (s->owner != thread_tag())
        make_shared(s);
    pthread_mutex_lock(&s->lock);
    if (s->depth == 0) {
        pthread_mutex_unlock(&s->lock);
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_stats_pop: no scope to pop (pop without push)");
    }
    scope_t *sc = &s->scopes[s->depth - 1];
    pair_t cur = current_read(s);
    pair_t tot = totals_sum(s);
    pair_t peak = {max_size(__atomic_load_n(&s->peak.bytes, __ATOMIC_RELAXED), cur.bytes),
                   max_size(__atomic_load_n(&s->peak.count, __ATOMIC_RELAXED), cur.count)};
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
    raise_to(&s->peak.bytes, sc->saved_peak.bytes);
    raise_to(&s->peak.count, sc->saved_peak.count);
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
    rk_tslot_set_fini(&s->totals, NULL, NULL);
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
    s->owner = thread_tag();
    s->shared = !rk_membarrier_ready();
    rk_tslot_set_init(&s->totals, sizeof(thread_totals_t), NULL);
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
