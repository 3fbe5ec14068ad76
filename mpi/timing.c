/* timing: a pass-through adaptor that measures the time its upstream
 * spends in allocate and deallocate, for the report's alloc_ns. It sits
 * right below the rank's stats adaptor, so it times the allocator proper.
 *
 * Reading the clock is what costs: clock_gettime(CLOCK_MONOTONIC) through
 * the vDSO is ~30 ns on the H100 host (74 ns on the 2-core CI machine), and
 * timing every call takes two reads a call, four a pair, more than the
 * pool's own bookkeeping (issue 21: ~120 ns a pair). CLOCK_MONOTONIC_COARSE
 * is cheaper (13 ns on the CI machine) but ticks every 4 ms, so a 100 ns
 * call reads as 0 or one tick; rdtsc (28 ns there, less on bare metal)
 * four times a pair still costs more than the 15 ns budget, and its ticks
 * need calibration against the clock.
 * So the layer samples: each thread times one call in `period` on average
 * (intervals drawn at random between 1 and 2 * period - 1, so that no
 * periodic pattern of the program lines up with them; the first call of a
 * thread is always timed) and counts every call. alloc_ns is the estimate
 * sum of sampled times * calls / sampled calls: unbiased, and exact when
 * period is 1 (rk_mpi_timing_set_period). With period 32 the clock costs
 * ~2 ns a call on average; the estimate's relative error for a run of N
 * calls of similar cost is about cv * sqrt(period / N) (cv: the spread of
 * call times over their mean), well under 1% for the millions of calls
 * where the time matters. A run whose time is a few slow calls (cudaMalloc
 * growth among fast pool hits) is estimated with a larger error: those
 * calls are sampled like the others.
 *
 * Every counter is per thread (plain stores to the thread's own slot, no
 * lock-prefixed instruction on a line other threads write) and added up
 * when the report asks; an untimed call costs one decrement.
 *
 * Counted by the stats adaptor above (rk_mpi_timing_count_from, the MPI
 * plugin's chain stats>timing>...): every call to this layer comes from
 * that adaptor, which counts its allocations, frees and failures per
 * thread anyway, so the layer keeps no count of its own (issue 21: the two
 * layers added 16.5 ns to the pool's pair on the H100, 127 instructions on
 * the CPU). Its untimed call is then a decrement of one thread-local
 * countdown (shared by such layers on the thread: the rank has one), the
 * observation mark and the upstream call: no slot, no resource id to
 * compare. calls = allocations + frees + failed allocations of the stats
 * adaptor (a free that the upstream refused, counted back in by stats, is
 * not a call here); exact at every read with no call in flight, like
 * stats' own counters.
 *
 * It also marks, for observation (issue 19), that what the chain below
 * allocates from CUDA is rankmem's own: rk_obs_internal_depth, a plain
 * thread-local increment around the upstream call. */
#define _GNU_SOURCE
#include "timing.h"
#include "plugin.h" /* rk_fail_oom */
#include "recorder.h" /* rk_obs_internal_depth */

/* Raised around every upstream call: initial-exec (the plugin is loaded
 * with the program, plugin.h says why) makes it one %fs-relative add
 * instead of a __tls_get_addr call each way. */
extern __thread int rk_obs_internal_depth __attribute__((tls_model("initial-exec")));

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TIMING_PERIOD 32u /* the default: one call in 32 is timed */

/* One per thread that has used a timing resource; kept (and counted) after
 * the thread exits, freed with the resource. Its own cache line: written
 * by its thread on every call. */
typedef struct slot {
    /* Written by the slot's thread only; the report reads them. Calls are
     * counted by intervals, so that an untimed call costs one decrement:
     * calls = done + (len - countdown). */
    uint64_t ns;            /* sampled time */
    uint64_t sampled;       /* timed calls */
    uint64_t done;          /* calls of the finished intervals */
    uint32_t len;           /* the current interval's length */
    uint32_t countdown;     /* calls until the next timed one */
    uint64_t rng;           /* xorshift state (its thread only) */
    const void *thread;     /* the thread's tag */
    struct slot *next;
} __attribute__((aligned(64))) slot_t;

typedef struct {
    rankmem_resource_t base;
    uint64_t id;            /* unique for the process: thread caches never match a newer one */
    uint32_t period;        /* atomic: mean calls between timed ones; 1: every call */
    slot_t *slots;          /* atomic head */
    rankmem_resource_t *view; /* the stats adaptor above that counts the calls (not retained:
                               * it holds this layer), or NULL: the layer counts them */
} timing_t;

static const rankmem_resource_ops_t timing_ops, timing_view_ops;

static inline int is_timing(const rankmem_resource_t *mr)
{
    return mr && (mr->ops == &timing_ops || mr->ops == &timing_view_ops);
}

static uint64_t next_id = 1; /* atomic */
static __thread char thread_tag __attribute__((tls_model("initial-exec")));
static __thread struct {
    uint64_t id;
    slot_t *slot;
} cache __attribute__((tls_model("initial-exec")));

static __attribute__((noinline)) slot_t *slot_slow(timing_t *t)
{
    slot_t *s;
    for (s = __atomic_load_n(&t->slots, __ATOMIC_ACQUIRE); s; s = s->next)
        if (s->thread == &thread_tag)
            break;
    if (!s) {
        if (posix_memalign((void **)&s, 64, sizeof *s) != 0)
            return NULL;
        memset(s, 0, sizeof *s);
        s->thread = &thread_tag;
        s->len = s->countdown = 1; /* the first call is timed: a short run still has a sample */
        s->rng = ((uint64_t)(uintptr_t)s * 0x9e3779b97f4a7c15ull) | 1;
        s->next = __atomic_load_n(&t->slots, __ATOMIC_RELAXED);
        while (!__atomic_compare_exchange_n(&t->slots, &s->next, s, 1, __ATOMIC_RELEASE,
                                            __ATOMIC_RELAXED))
            ;
    }
    cache.id = t->id;
    cache.slot = s;
    return s;
}

#define RK_MPI_UNLIKELY(x) __builtin_expect(!!(x), 0)

static inline slot_t *get_slot(timing_t *t)
{
    return __builtin_expect(cache.id == t->id, 1) ? cache.slot : slot_slow(t);
}

/* Single writer: a relaxed load and store, no lock prefix. */
static inline void bump(uint64_t *x, uint64_t d)
{
    __atomic_store_n(x, __atomic_load_n(x, __ATOMIC_RELAXED) + d, __ATOMIC_RELAXED);
}

/* Whether this call is one to time; counts it. */
static inline int take_sample(slot_t *s)
{
    uint32_t c = __atomic_load_n(&s->countdown, __ATOMIC_RELAXED) - 1;
    __atomic_store_n(&s->countdown, c, __ATOMIC_RELAXED);
    return __builtin_expect(c == 0, 0);
}

/* After a timed call: its time, and the next interval. */
static void sampled(timing_t *t, slot_t *s, uint64_t ns)
{
    bump(&s->ns, ns);
    bump(&s->sampled, 1);
    bump(&s->done, s->len);
    uint32_t p = __atomic_load_n(&t->period, __ATOMIC_RELAXED), len = 1;
    if (p > 1) {
        uint64_t x = s->rng; /* xorshift64 */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s->rng = x;
        len = 1 + (uint32_t)((x >> 32) % (2 * (uint64_t)p - 1));
    }
    __atomic_store_n(&s->len, len, __ATOMIC_RELAXED);
    __atomic_store_n(&s->countdown, len, __ATOMIC_RELAXED);
}

uint64_t rk_mpi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Staging (mpi/staging/base.c) caches which address ranges are device memory;
 * memory the rank's chain hands out clears its stale entries. Weak: the
 * plugin links without staging. */
__attribute__((weak, visibility("hidden"))) void rk_mpi_staging_forget(const void *ptr,
                                                                       size_t bytes);

static __attribute__((noinline)) rankmem_status_t forget(const void *ptr, size_t bytes)
{
    rk_mpi_staging_forget(ptr, bytes);
    return RANKMEM_SUCCESS;
}

static __attribute__((noinline)) rankmem_status_t timed_allocate(timing_t *t, slot_t *s,
                                                                  size_t bytes, size_t alignment,
                                                                  rankmem_stream_t stream,
                                                                  void **ptr_p)
{
    rankmem_resource_t *up = t->base.upstream;
    uint64_t t0 = rk_mpi_now_ns();
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    sampled(t, s, rk_mpi_now_ns() - t0);
    return st;
}

static __attribute__((noinline)) rankmem_status_t timed_deallocate(timing_t *t, slot_t *s,
                                                                    void *ptr, size_t bytes,
                                                                    size_t alignment,
                                                                    rankmem_stream_t stream)
{
    rankmem_resource_t *up = t->base.upstream;
    uint64_t t0 = rk_mpi_now_ns();
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    sampled(t, s, rk_mpi_now_ns() - t0);
    return st;
}

/* The complete call: the slot looked up (or made), the call timed if its
 * turn has come. The fast paths below come here for anything but an
 * untimed call from a thread whose slot is cached. */
/* The rank's chain could not serve a request (out of memory, or a limit
 * reached): the rank's failure record (failure.c), unless rankmem's
 * cudaMalloc interposer asked, which asks CUDA next. The error is kept
 * for the caller. */
#pragma weak rk_fail_oom /* failure.c: the unit test links timing.c alone */
__thread int rk_fail_defer;

static __attribute__((noinline, cold)) void refused(size_t bytes, rankmem_stream_t stream)
{
    if (rk_fail_defer || !rk_fail_oom)
        return;
    /* The chain's detail is the caller's to read, and the record's
     * queries may replace it: kept and put back into the thread's buffer
     * (librankmem's own, src/status.c: rankmem_last_error returns it). */
    const char *e = rankmem_last_error();
    char keep[512];
    size_t n = strnlen(e, sizeof keep - 1);
    memcpy(keep, e, n);
    keep[n] = '\0';
    rk_fail_oom(RK_OBS_API_RANKMEM, "rankmem", bytes, (uint64_t)(uintptr_t)stream, NULL, 0);
    e = rankmem_last_error();
    memcpy((char *)e, keep, n + 1);
}

static __attribute__((noinline)) rankmem_status_t allocate_slow(timing_t *t, size_t bytes,
                                                                size_t alignment,
                                                                rankmem_stream_t stream,
                                                                void **ptr_p)
{
    rankmem_resource_t *up = t->base.upstream;
    slot_t *s = get_slot(t);
    rankmem_status_t st;
    rk_obs_internal_depth++; /* what CUDA gives the chain is rankmem's own (observation) */
    if (s != NULL && take_sample(s))
        st = timed_allocate(t, s, bytes, alignment, stream, ptr_p);
    else
        st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    rk_obs_internal_depth--;
    if (st == RANKMEM_SUCCESS && rk_mpi_staging_forget)
        rk_mpi_staging_forget(*ptr_p, bytes);
    else if (RK_MPI_UNLIKELY(st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT))
        refused(bytes, stream);
    return st;
}

static __attribute__((noinline)) rankmem_status_t deallocate_slow(timing_t *t, void *ptr,
                                                                  size_t bytes, size_t alignment,
                                                                  rankmem_stream_t stream)
{
    rankmem_resource_t *up = t->base.upstream;
    slot_t *s = get_slot(t);
    rankmem_status_t st;
    rk_obs_internal_depth++;
    if (s != NULL && take_sample(s))
        st = timed_deallocate(t, s, ptr, bytes, alignment, stream);
    else
        st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    rk_obs_internal_depth--;
    return st;
}

/* Whether this is an untimed call of a thread whose slot is cached; if
 * so, counts it. No call: the fast path's only call is the upstream's. */
static inline __attribute__((always_inline)) int untimed(timing_t *t)
{
    if (RK_MPI_UNLIKELY(cache.id != t->id))
        return 0;
    slot_t *s = cache.slot;
    uint32_t c = __atomic_load_n(&s->countdown, __ATOMIC_RELAXED) - 1;
    if (RK_MPI_UNLIKELY(c == 0))
        return 0; /* the slow path counts it down and times it */
    __atomic_store_n(&s->countdown, c, __ATOMIC_RELAXED);
    return 1;
}

static rankmem_status_t timing_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                        rankmem_stream_t stream, void **ptr_p)
{
    timing_t *t = (timing_t *)mr;
    if (RK_MPI_UNLIKELY(!untimed(t)))
        return allocate_slow(t, bytes, alignment, stream, ptr_p);
    rankmem_resource_t *up = mr->upstream;
    rk_obs_internal_depth++;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    rk_obs_internal_depth--;
    if (st == RANKMEM_SUCCESS && rk_mpi_staging_forget)
        return forget(*ptr_p, bytes); /* a tail call: st need not live across it */
    if (RK_MPI_UNLIKELY(st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT))
        refused(bytes, stream);
    return st;
}

static rankmem_status_t timing_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                          size_t alignment, rankmem_stream_t stream)
{
    timing_t *t = (timing_t *)mr;
    if (RK_MPI_UNLIKELY(!untimed(t)))
        return deallocate_slow(t, ptr, bytes, alignment, stream);
    rankmem_resource_t *up = mr->upstream;
    rk_obs_internal_depth++;
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    rk_obs_internal_depth--;
    return st;
}

/* ---- counted by the stats adaptor above (rk_mpi_timing_count_from) ---- */

/* Calls of this thread until its next timed one, over every layer counted
 * by a stats adaptor (in practice the rank's one). Its own thread only: a
 * plain decrement. 0 at thread start, so the first call is timed. */
static __thread int32_t view_countdown __attribute__((tls_model("initial-exec")));
static __thread uint64_t view_rng __attribute__((tls_model("initial-exec")));

/* After a timed call: its time into the slot, the next interval. */
static __attribute__((noinline)) void view_sampled(timing_t *t, slot_t *s, uint64_t ns)
{
    if (s != NULL) {
        bump(&s->ns, ns);
        bump(&s->sampled, 1);
    }
    uint32_t p = __atomic_load_n(&t->period, __ATOMIC_RELAXED), len = 1;
    if (p > 1) {
        uint64_t x = view_rng;
        if (RK_MPI_UNLIKELY(x == 0))
            x = ((uint64_t)(uintptr_t)&view_rng * 0x9e3779b97f4a7c15ull) | 1;
        x ^= x << 13; /* xorshift64 */
        x ^= x >> 7;
        x ^= x << 17;
        view_rng = x;
        /* 1 .. 2p - 1 by a multiply and a shift: no division. */
        len = 1 + (uint32_t)(((x >> 32) * (2 * (uint64_t)p - 1)) >> 32);
    }
    view_countdown = (int32_t)len;
}

static __attribute__((noinline)) rankmem_status_t view_timed_allocate(timing_t *t, size_t bytes,
                                                                       size_t alignment,
                                                                       rankmem_stream_t stream,
                                                                       void **ptr_p)
{
    rankmem_resource_t *up = t->base.upstream;
    slot_t *s = get_slot(t);
    rk_obs_internal_depth++;
    uint64_t t0 = rk_mpi_now_ns();
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    view_sampled(t, s, rk_mpi_now_ns() - t0);
    rk_obs_internal_depth--;
    if (st == RANKMEM_SUCCESS && rk_mpi_staging_forget)
        rk_mpi_staging_forget(*ptr_p, bytes);
    else if (RK_MPI_UNLIKELY(st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT))
        refused(bytes, stream);
    return st;
}

static __attribute__((noinline)) rankmem_status_t view_timed_deallocate(timing_t *t, void *ptr,
                                                                         size_t bytes,
                                                                         size_t alignment,
                                                                         rankmem_stream_t stream)
{
    rankmem_resource_t *up = t->base.upstream;
    slot_t *s = get_slot(t);
    rk_obs_internal_depth++;
    uint64_t t0 = rk_mpi_now_ns();
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    view_sampled(t, s, rk_mpi_now_ns() - t0);
    rk_obs_internal_depth--;
    return st;
}

static rankmem_status_t view_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                      rankmem_stream_t stream, void **ptr_p)
{
    if (RK_MPI_UNLIKELY(view_countdown-- <= 1))
        return view_timed_allocate((timing_t *)mr, bytes, alignment, stream, ptr_p);
    rankmem_resource_t *up = mr->upstream;
    rk_obs_internal_depth++;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    rk_obs_internal_depth--;
    if (st == RANKMEM_SUCCESS && rk_mpi_staging_forget)
        return forget(*ptr_p, bytes);
    if (RK_MPI_UNLIKELY(st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT))
        refused(bytes, stream);
    return st;
}

static rankmem_status_t view_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                        size_t alignment, rankmem_stream_t stream)
{
    if (RK_MPI_UNLIKELY(view_countdown-- <= 1))
        return view_timed_deallocate((timing_t *)mr, ptr, bytes, alignment, stream);
    rankmem_resource_t *up = mr->upstream;
    rk_obs_internal_depth++;
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    rk_obs_internal_depth--;
    return st;
}

/* Queries and trims are about the memory below: ask it. */
static rankmem_status_t timing_query(rankmem_resource_t *mr, rankmem_query_t what,
                                     size_t *value_p)
{
    return rankmem_resource_query(mr->upstream, what, value_p);
}

static rankmem_status_t timing_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static int timing_is_equal(const rankmem_resource_t *a, const rankmem_resource_t *b)
{
    /* Memory from one timing layer may go back through another over the same upstream. */
    int eq = 0;
    if (rankmem_resource_is_equal(a->upstream, b->upstream, &eq) != RANKMEM_SUCCESS)
        return 0;
    return eq;
}

static rankmem_status_t timing_finalize(rankmem_resource_t *mr)
{
    for (slot_t *s = ((timing_t *)mr)->slots, *n; s; s = n) {
        n = s->next;
        free(s);
    }
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t timing_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    /* Not a spec name: the plugin inserts it itself, and the report shows
     * the user's chain without it. */
    .name = "timing",
    .allocate = timing_allocate,
    .deallocate = timing_deallocate,
    .query = timing_query,
    .is_equal = timing_is_equal,
    .trim = timing_trim,
    .finalize = timing_finalize,
};

/* The same layer once a stats adaptor above counts its calls. */
static const rankmem_resource_ops_t timing_view_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "timing",
    .allocate = view_allocate,
    .deallocate = view_deallocate,
    .query = timing_query,
    .is_equal = timing_is_equal,
    .trim = timing_trim,
    .finalize = timing_finalize,
};

rankmem_status_t rk_mpi_timing_create(rankmem_resource_t *upstream, rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    timing_t *t = calloc(1, sizeof *t);
    if (!t)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    t->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    t->period = TIMING_PERIOD;
    rankmem_status_t st = rankmem_resource_init(&t->base, &timing_ops, upstream->props, upstream);
    if (st != RANKMEM_SUCCESS) {
        free(t);
        return st;
    }
    *mr_p = &t->base;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_mpi_timing_count_from(rankmem_resource_t *mr, rankmem_resource_t *stats)
{
    const char *name = NULL;
    rankmem_resource_t *below = NULL;
    if (!is_timing(mr) || !stats || rankmem_resource_name(stats, &name) != RANKMEM_SUCCESS ||
        !name || strcmp(name, "stats") != 0 ||
        rankmem_resource_upstream(stats, &below) != RANKMEM_SUCCESS || below != mr)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    timing_t *t = (timing_t *)mr;
    /* Calls already counted here would be lost (and a thread may be inside one). */
    if (__atomic_load_n(&t->slots, __ATOMIC_ACQUIRE) != NULL)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    t->view = stats;
    /* Before the chain is shared (make_resource): no thread reads ops yet. */
    t->base.ops = &timing_view_ops;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_mpi_timing_set_period(rankmem_resource_t *mr, unsigned period)
{
    if (!is_timing(mr) || period == 0 || period > (1u << 20))
        return RANKMEM_ERR_INVALID_ARGUMENT;
    /* Threads pick it up at their next timed call. */
    __atomic_store_n(&((timing_t *)mr)->period, (uint32_t)period, __ATOMIC_RELAXED);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_mpi_timing_read(const rankmem_resource_t *mr, rk_mpi_timing_t *out_p)
{
    if (!is_timing(mr) || !out_p)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    rk_mpi_timing_t r = {0, 0, 0, 0};
    const timing_t *t = (const timing_t *)mr;
    for (const slot_t *s = __atomic_load_n(&((const timing_t *)mr)->slots, __ATOMIC_ACQUIRE); s;
         s = s->next) {
        r.sampled_ns += __atomic_load_n(&s->ns, __ATOMIC_RELAXED);
        r.calls += __atomic_load_n(&s->done, __ATOMIC_RELAXED) +
                   __atomic_load_n(&s->len, __ATOMIC_RELAXED) -
                   __atomic_load_n(&s->countdown, __ATOMIC_RELAXED);
        r.sampled += __atomic_load_n(&s->sampled, __ATOMIC_RELAXED);
    }
    if (t->view) { /* the intervals' counts were not kept: stats has the calls */
        rankmem_stats_t st = {.size = sizeof st};
        if (rankmem_stats_get(t->view, &st) != RANKMEM_SUCCESS)
            return RANKMEM_ERR_INVALID_ARGUMENT;
        r.calls = 2 * (uint64_t)st.count_total - st.count_current + st.failures;
    }
    /* In floating point: ns * calls overflows 64 bits after ~5 hours in
     * the allocator over a billion calls. */
    r.ns = r.sampled ? (uint64_t)((double)r.sampled_ns * (double)r.calls / (double)r.sampled +
                                  0.5)
                     : 0;
    *out_p = r;
    return RANKMEM_SUCCESS;
}

uint64_t rk_mpi_timing_ns(const rankmem_resource_t *mr)
{
    rk_mpi_timing_t r;
    return rk_mpi_timing_read(mr, &r) == RANKMEM_SUCCESS ? r.ns : 0;
}
