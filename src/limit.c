/* limit: refuses allocations that would take the bytes handed out through it
 * past a fixed limit (RMM's limiting_resource_adaptor).
 *
 * Lock-free: the count is reserved with a compare-and-swap that checks the
 * limit before it commits, so the count never goes past the limit even for a
 * moment. (An add-then-roll-back scheme would let one thread's overshoot
 * refuse another thread's request that fits.) A reservation the upstream then
 * refuses is given back. Counts the bytes requested, not what the upstream
 * rounds them up to: the limit is on what the user asked for. */
#include "internal.h"
#include "config_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    rankmem_resource_t base;
    size_t limit;
    size_t used; /* atomic: bytes handed out and not yet freed (<= limit) */
    size_t high; /* atomic: high-water mark of used */
} limit_t;

static rankmem_status_t limit_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    limit_t *l = (limit_t *)mr;
    size_t cur = __atomic_load_n(&l->used, __ATOMIC_RELAXED);
    do {
        /* cur <= limit always holds, so this cannot underflow. */
        if (RK_UNLIKELY(bytes > l->limit - cur))
            return rk_error(RANKMEM_ERR_LIMIT,
                            "limit: allocate of %zu bytes refused: %zu of the limit of %zu bytes "
                            "in use, %zu available",
                            bytes, cur, l->limit, l->limit - cur);
    } while (!__atomic_compare_exchange_n(&l->used, &cur, cur + bytes, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS)) {
        __atomic_sub_fetch(&l->used, bytes, __ATOMIC_RELAXED);
        return st;
    }
    /* Raised only for allocations that succeeded. */
    size_t now = cur + bytes, h = __atomic_load_n(&l->high, __ATOMIC_RELAXED);
    while (h < now &&
           !__atomic_compare_exchange_n(&l->high, &h, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t limit_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    limit_t *l = (limit_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        return st; /* not freed: still counted */
    /* Saturating: a wrong size passed to an upstream that cannot check it
     * must not wrap the count around and refuse everything afterwards. */
    size_t cur = __atomic_load_n(&l->used, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&l->used, &cur, cur > bytes ? cur - bytes : 0, 1,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t limit_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    limit_t *l = (limit_t *)mr;
    switch (what) {
    case RANKMEM_QUERY_LIMIT: *value_p = l->limit; return RANKMEM_SUCCESS;
    case RANKMEM_QUERY_USED_CURRENT:
        *value_p = __atomic_load_n(&l->used, __ATOMIC_RELAXED);
        return RANKMEM_SUCCESS;
    case RANKMEM_QUERY_USED_HIGH:
        *value_p = __atomic_load_n(&l->high, __ATOMIC_RELAXED);
        return RANKMEM_SUCCESS;
    default: return rankmem_resource_query(mr->upstream, what, value_p);
    }
}

static rankmem_status_t limit_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static rankmem_status_t limit_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static int limit_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const limit_t *l = (const limit_t *)mr;
    char size[32];
    rk_format_size(size, sizeof size, l->limit);
    return snprintf(buf, len, "limit(bytes=%s)", size);
}

static const rankmem_resource_ops_t limit_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "limit",
    .allocate = limit_allocate,
    .deallocate = limit_deallocate,
    .query = limit_query,
    .trim = limit_trim,
    .finalize = limit_finalize,
    .describe = limit_describe,
};

rankmem_status_t rankmem_limit_create(rankmem_resource_t *upstream, size_t limit_bytes,
                                      rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_limit_create: NULL %s",
                        upstream ? "mr_p" : "upstream");
    if (limit_bytes == 0)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_limit_create: a limit of 0 bytes would refuse everything");
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(limit_t), &limit_ops, upstream->props, upstream,
                                          &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    mr->device = upstream->device;
    ((limit_t *)mr)->limit = limit_bytes;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
