/* limit: refuses allocations that would take the bytes handed out through it
 * past a fixed limit (RMM's limiting_resource_adaptor).
 *
 * Lock-free: the count is reserved with a compare-and-swap that checks the
 * limit before it commits, so an ordinary allocation never takes the count
 * past the limit even for a moment. (An add-then-roll-back scheme would let
 * one thread's overshoot refuse another thread's request that fits.) A
 * reservation the upstream then refuses is given back. Counts the bytes
 * requested, not what the upstream rounds them up to: the limit is on what
 * the user asked for.
 *
 * A reallocation (rankmem_limit_allocate_replacing) is checked as if its old
 * block were already freed: its new block is counted in full at once, so
 * until the caller frees the old one the count may exceed the limit by at
 * most the old block's bytes; other requests meanwhile see less room, never
 * more. */
#include "internal.h"
#include "config_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    rankmem_resource_t base;
    size_t limit;
    size_t used; /* atomic: bytes handed out and not yet freed (<= limit + a reallocation's old block) */
    size_t high; /* atomic: high-water mark of used, old blocks of reallocations not counted */
} limit_t;

/* Reserve bytes, counting `credit` bytes of the count as already released. */
static rankmem_status_t limit_allocate_credit(rankmem_resource_t *mr, size_t bytes,
                                              size_t alignment, rankmem_stream_t stream,
                                              size_t credit, void **ptr_p)
{
    limit_t *l = (limit_t *)mr;
    size_t cur = __atomic_load_n(&l->used, __ATOMIC_RELAXED), base, next;
    do {
        /* What the count would be without the old block: the credit cannot
         * release more than is counted. cur may exceed the limit while
         * another reallocation's old block is still counted. */
        base = cur > credit ? cur - credit : 0;
        if (RK_UNLIKELY(base > l->limit || bytes > l->limit - base ||
                        __builtin_add_overflow(cur, bytes, &next)))
            return rk_error(RANKMEM_ERR_LIMIT,
                            "limit: allocate of %zu bytes refused: %zu of the limit of %zu bytes "
                            "in use, %zu available",
                            bytes, base, l->limit, base > l->limit ? 0 : l->limit - base);
    } while (!__atomic_compare_exchange_n(&l->used, &cur, next, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    rankmem_resource_t *up = mr->upstream;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS)) {
        __atomic_sub_fetch(&l->used, bytes, __ATOMIC_RELAXED);
        return st;
    }
    /* Raised only for allocations that succeeded, and never by an old block
     * about to go: the mark stays within the limit. */
    size_t now = base + bytes, h = __atomic_load_n(&l->high, __ATOMIC_RELAXED);
    while (h < now &&
           !__atomic_compare_exchange_n(&l->high, &h, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t limit_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    return limit_allocate_credit(mr, bytes, alignment, stream, 0, ptr_p);
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

rankmem_status_t rankmem_limit_allocate_replacing(rankmem_resource_t *mr, size_t bytes,
                                                  size_t alignment, size_t replaced_bytes,
                                                  void **ptr_p)
{
    /* The dispatcher's checks (rankmem_allocate), for a call that bypasses it. */
    if (!mr || !ptr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_limit_allocate_replacing: NULL %s",
                        mr ? "ptr_p" : "resource");
    if (mr->ops != &limit_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_limit_allocate_replacing: '%s' is not a limit adaptor",
                        mr->ops->name);
    if (bytes == 0)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "limit: allocate of 0 bytes");
    if ((alignment && !rk_is_pow2(alignment)) || alignment > RANKMEM_MAX_ALIGNMENT)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "limit: alignment %zu is not a power of two of at most %zu (1 GiB)",
                        alignment, RANKMEM_MAX_ALIGNMENT);
    if (alignment < RANKMEM_DEFAULT_ALIGNMENT)
        alignment = RANKMEM_DEFAULT_ALIGNMENT;
    if (bytes > SIZE_MAX / 2 - alignment)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "limit: allocate of %zu bytes at alignment %zu is too large", bytes,
                        alignment);
    return limit_allocate_credit(mr, bytes, alignment, NULL, replaced_bytes, ptr_p);
}
