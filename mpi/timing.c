/* timing: a pass-through adaptor that sums the time its upstream spends in
 * allocate and deallocate, for the report's alloc_ns. It sits right below
 * the rank's stats adaptor, so it times the allocator proper.
 *
 * clock_gettime(CLOCK_MONOTONIC) is read through the vDSO on Linux: about
 * 20 ns and no system call, so two reads per call stay small next to even
 * the pool's bookkeeping. The sum is one relaxed atomic add. */
#define _GNU_SOURCE
#include "plugin.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    rankmem_resource_t base;
    uint64_t ns; /* atomic */
} timing_t;

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
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    __atomic_fetch_add(&((timing_t *)mr)->ns, rk_mpi_now_ns() - t0, __ATOMIC_RELAXED);
    if (st == RANKMEM_SUCCESS && rk_mpi_staging_forget)
        rk_mpi_staging_forget(*ptr_p, bytes);
    return st;
}

static rankmem_status_t timing_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                          size_t alignment, rankmem_stream_t stream)
{
    rankmem_resource_t *up = mr->upstream;
    uint64_t t0 = rk_mpi_now_ns();
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    __atomic_fetch_add(&((timing_t *)mr)->ns, rk_mpi_now_ns() - t0, __ATOMIC_RELAXED);
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
    return __atomic_load_n(&((const timing_t *)mr)->ns, __ATOMIC_RELAXED);
}
