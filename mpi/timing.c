/* timing: a pass-through adaptor that sums the time its upstream spends in
 * allocate and deallocate, for the report's alloc_ns. It sits right below
 * the rank's stats adaptor, so it times the allocator proper.
 *
 * clock_gettime(CLOCK_MONOTONIC) is read through the vDSO on Linux: about
 * 20 ns and no system call, so two reads per call stay small next to even
 * the pool's bookkeeping. The sum is kept per thread (a plain add to the
 * thread's own slot, no lock-prefixed instruction on a line other threads
 * write) and added up when the report asks.
 *
 * It also marks, for observation (issue 19), that what the chain below
 * allocates from CUDA is rankmem's own: rk_obs_internal_depth, a plain
 * thread-local increment around the upstream call. */
#define _GNU_SOURCE
#include "plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* One per thread that has used a timing resource; kept (and counted) after
 * the thread exits, freed with the resource. */
typedef struct slot {
    uint64_t ns;            /* written by its thread only, read by the report */
    const void *thread;     /* the thread's tag */
    struct slot *next;
} slot_t;

typedef struct {
    rankmem_resource_t base;
    uint64_t id;            /* unique for the process: thread caches never match a newer one */
    slot_t *slots;          /* atomic head */
} timing_t;

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
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        s->thread = &thread_tag;
        s->next = __atomic_load_n(&t->slots, __ATOMIC_RELAXED);
        while (!__atomic_compare_exchange_n(&t->slots, &s->next, s, 1, __ATOMIC_RELEASE,
                                            __ATOMIC_RELAXED))
            ;
    }
    cache.id = t->id;
    cache.slot = s;
    return s;
}

static inline void add_ns(rankmem_resource_t *mr, uint64_t d)
{
    timing_t *t = (timing_t *)mr;
    slot_t *s = __builtin_expect(cache.id == t->id, 1) ? cache.slot : slot_slow(t);
    if (__builtin_expect(s != NULL, 1))
        __atomic_store_n(&s->ns, __atomic_load_n(&s->ns, __ATOMIC_RELAXED) + d, __ATOMIC_RELAXED);
}

uint64_t rk_mpi_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Staging (mpi/staging.c) caches which address ranges are device memory;
 * memory the rank's chain hands out clears its stale entries. Weak: the
 * plugin links without staging. */
__attribute__((weak, visibility("hidden"))) void rk_mpi_staging_forget(const void *ptr,
                                                                       size_t bytes);

static rankmem_status_t timing_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                        rankmem_stream_t stream, void **ptr_p)
{
    rankmem_resource_t *up = mr->upstream;
    uint64_t t0 = rk_mpi_now_ns();
    rk_obs_internal_depth++; /* what CUDA gives the chain is rankmem's own (observation) */
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    rk_obs_internal_depth--;
    add_ns(mr, rk_mpi_now_ns() - t0);
    if (st == RANKMEM_SUCCESS && rk_mpi_staging_forget)
        rk_mpi_staging_forget(*ptr_p, bytes);
    return st;
}

static rankmem_status_t timing_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                          size_t alignment, rankmem_stream_t stream)
{
    rankmem_resource_t *up = mr->upstream;
    uint64_t t0 = rk_mpi_now_ns();
    rk_obs_internal_depth++;
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    rk_obs_internal_depth--;
    add_ns(mr, rk_mpi_now_ns() - t0);
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

rankmem_status_t rk_mpi_timing_create(rankmem_resource_t *upstream, rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    timing_t *t = calloc(1, sizeof *t);
    if (!t)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    t->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    rankmem_status_t st = rankmem_resource_init(&t->base, &timing_ops, upstream->props, upstream);
    if (st != RANKMEM_SUCCESS) {
        free(t);
        return st;
    }
    *mr_p = &t->base;
    return RANKMEM_SUCCESS;
}

uint64_t rk_mpi_timing_ns(const rankmem_resource_t *mr)
{
    if (!mr || mr->ops != &timing_ops)
        return 0;
    uint64_t sum = 0;
    for (const slot_t *s = __atomic_load_n(&((const timing_t *)mr)->slots, __ATOMIC_ACQUIRE); s;
         s = s->next)
        sum += __atomic_load_n(&s->ns, __ATOMIC_RELAXED);
    return sum;
}
