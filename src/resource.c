/* The resource interface: reference counting and the public dispatchers.
 * Dispatchers validate arguments once, so resources can trust them. */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

rankmem_status_t rankmem_resource_init(rankmem_resource_t *mr, const rankmem_resource_ops_t *ops,
                                       unsigned props, rankmem_resource_t *upstream)
{
    if (!mr || !ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_resource_init: NULL %s",
                        mr ? "ops" : "resource");
    /* A table from an older header is shorter; it must still hold the two required calls. */
    if (ops->size < offsetof(rankmem_resource_ops_t, query) || !ops->allocate || !ops->deallocate)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_resource_init: ops table '%s' lacks allocate/deallocate",
                        ops->name ? ops->name : "?");
    if (upstream && upstream->refcount == 0)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_resource_init: upstream was already released");
    mr->ops = ops;
    mr->upstream = upstream;
    mr->props = props;
    mr->device = (props & RANKMEM_PROP_DEVICE_ACCESSIBLE) ? rk_gpu_current() : RANKMEM_DEVICE_HOST;
    for (int i = 0; i < 4; i++)
        mr->reserved[i] = NULL;
    __atomic_store_n(&mr->refcount, 1, __ATOMIC_RELAXED);
    if (upstream)
        __atomic_add_fetch(&upstream->refcount, 1, __ATOMIC_RELAXED);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_resource_new(size_t struct_size, const rankmem_resource_ops_t *ops,
                                 unsigned props, rankmem_resource_t *upstream,
                                 rankmem_resource_t **mr_p)
{
    /* A line of its own: the header is read on every call by every thread,
     * and a neighbour written by one thread would make each of those reads
     * a cache miss (freed with free() by the resources' finalizers). */
    size_t padded = (struct_size + 63) & ~(size_t)63;
    rankmem_resource_t *mr = padded >= struct_size ? aligned_alloc(64, padded) : NULL;
    if (mr)
        memset(mr, 0, padded);
    if (!mr)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of host memory",
                        ops->name, struct_size);
    rankmem_status_t st = rankmem_resource_init(mr, ops, props, upstream);
    if (st != RANKMEM_SUCCESS) {
        free(mr);
        return st;
    }
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_resource_retain(rankmem_resource_t *mr)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_resource_retain: NULL resource");
    /* Refuse to resurrect a released resource (use after release). */
    unsigned long n = __atomic_load_n(&mr->refcount, __ATOMIC_RELAXED);
    do {
        if (n == 0)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_resource_retain: resource already released");
    } while (!__atomic_compare_exchange_n(&mr->refcount, &n, n + 1, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_resource_release(rankmem_resource_t *mr)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_resource_release: NULL resource");
    rankmem_status_t result = RANKMEM_SUCCESS;
    /* Walk down the chain iteratively: each finalized resource drops its upstream. */
    while (mr) {
        unsigned long n = __atomic_load_n(&mr->refcount, __ATOMIC_RELAXED);
        do {
            if (n == 0)
                return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                                "rankmem_resource_release: resource already released");
        } while (!__atomic_compare_exchange_n(&mr->refcount, &n, n - 1, 1, __ATOMIC_ACQ_REL,
                                              __ATOMIC_RELAXED));
        if (n != 1)
            break;
        rankmem_resource_t *up = mr->upstream;
        if (mr->ops->size > offsetof(rankmem_resource_ops_t, finalize) && mr->ops->finalize) {
            rankmem_status_t st = mr->ops->finalize(mr);
            if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
                result = st;
        }
        mr = up;
    }
    return result;
}

#define HAS_OP RK_HAS_OP

static inline rankmem_status_t check_alloc_args(rankmem_resource_t *mr, size_t bytes,
                                                size_t *alignment, void **ptr_p)
{
    if (RK_UNLIKELY(!mr || !ptr_p))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "allocate: NULL %s",
                        mr ? "output pointer" : "resource");
    if (RK_UNLIKELY(bytes == 0))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: allocate of 0 bytes", mr->ops->name);
    size_t a = *alignment;
    if (a == 0)
        a = RANKMEM_DEFAULT_ALIGNMENT;
    else if (RK_UNLIKELY(!rk_is_pow2(a)))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: alignment %zu is not a power of two", mr->ops->name, a);
    else if (RK_UNLIKELY(a > RANKMEM_MAX_ALIGNMENT))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: alignment %zu is above the largest supported, %zu (1 GiB)",
                        mr->ops->name, a, RANKMEM_MAX_ALIGNMENT);
    else if (a < RANKMEM_DEFAULT_ALIGNMENT)
        a = RANKMEM_DEFAULT_ALIGNMENT;
    /* Leaves room for rounding up by the alignment (and adding it again, as
     * padding adaptors do) without overflow: a <= 2^30 here, so the
     * subtraction cannot wrap. */
    if (RK_UNLIKELY(bytes > SIZE_MAX / 2 - a))
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "%s: allocate of %zu bytes at alignment %zu is too large",
                        mr->ops->name, bytes, a);
    *alignment = a;
    return RANKMEM_SUCCESS;
}

/* What rankmem_deallocate_async checks, for each block of deallocate_many too. */
static rankmem_status_t check_dealloc_args(rankmem_resource_t *mr, const void *ptr, size_t bytes,
                                           size_t alignment)
{
    if (RK_UNLIKELY(!ptr))
        return rk_error(RANKMEM_ERR_INVALID_POINTER, "%s: deallocate of NULL", mr->ops->name);
    if (RK_UNLIKELY(alignment && !rk_is_pow2(alignment)))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: alignment %zu is not a power of two", mr->ops->name, alignment);
    if (RK_UNLIKELY(alignment > RANKMEM_MAX_ALIGNMENT))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: alignment %zu is above the largest supported, %zu (1 GiB)",
                        mr->ops->name, alignment, RANKMEM_MAX_ALIGNMENT);
    /* allocate never hands out such a block; resources that add the
     * alignment to the size on free must not see it either. */
    size_t a = alignment < RANKMEM_DEFAULT_ALIGNMENT ? RANKMEM_DEFAULT_ALIGNMENT : alignment;
    if (RK_UNLIKELY(bytes > SIZE_MAX / 2 - a))
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "%s: deallocate of %p with %zu bytes: no allocation is that large; not "
                        "freed",
                        mr->ops->name, ptr, bytes);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_allocate_async(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                        rankmem_stream_t stream, void **ptr_p)
{
    rankmem_status_t st = check_alloc_args(mr, bytes, &alignment, ptr_p);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        return st;
    return mr->ops->allocate(mr, bytes, alignment, stream, ptr_p);
}

rankmem_status_t rankmem_deallocate_async(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                          size_t alignment, rankmem_stream_t stream)
{
    if (RK_UNLIKELY(!mr))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "deallocate: NULL resource");
    rankmem_status_t st = check_dealloc_args(mr, ptr, bytes, alignment);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        return st;
    return rk_deallocate_checked(mr, ptr, bytes, alignment, stream);
}

rankmem_status_t rankmem_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                  void **ptr_p)
{
    return rankmem_allocate_async(mr, bytes, alignment, NULL, ptr_p);
}

rankmem_status_t rankmem_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                    size_t alignment)
{
    return rankmem_deallocate_async(mr, ptr, bytes, alignment, NULL);
}

rankmem_status_t rankmem_deallocate_many(rankmem_resource_t *mr, const rankmem_block_t *blocks,
                                         size_t n, size_t *failed_p)
{
    size_t failed = 0;
    rankmem_status_t first = RANKMEM_SUCCESS;
    if (failed_p)
        *failed_p = n;
    if (RK_UNLIKELY(!mr))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "deallocate_many: NULL resource");
    if (RK_UNLIKELY(!blocks && n))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "deallocate_many: NULL blocks (%zu)", n);
    for (size_t base = 0; base < n; base += RK_BATCH) {
        const rankmem_block_t *c = blocks + base;
        size_t m = n - base < RK_BATCH ? n - base : RK_BATCH;
        int checked = 1;
        for (size_t i = 0; i < m && checked; i++)
            checked = c[i].ptr && (!c[i].alignment || rk_is_pow2(c[i].alignment)) &&
                      c[i].alignment <= RANKMEM_MAX_ALIGNMENT &&
                      c[i].bytes <= SIZE_MAX / 2 - RANKMEM_MAX_ALIGNMENT;
        rankmem_status_t st[RK_BATCH];
        if (checked) {
            rk_deallocate_many(mr, c, m, NULL, st);
        } else {
            /* One at a time: the dispatcher's checks and errors for each. */
            for (size_t i = 0; i < m; i++)
                st[i] = rankmem_deallocate_async(mr, c[i].ptr, c[i].bytes, c[i].alignment, NULL);
        }
        for (size_t i = 0; i < m; i++)
            if (st[i] != RANKMEM_SUCCESS && !failed++)
                first = st[i];
    }
    if (failed_p)
        *failed_p = failed;
    return first;
}

rankmem_status_t rankmem_resource_query(rankmem_resource_t *mr, rankmem_query_t what,
                                        size_t *value_p)
{
    if (!mr || !value_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "query: NULL %s",
                        mr ? "output" : "resource");
    if (!HAS_OP(mr, query))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "%s: no queries", mr->ops->name);
    return mr->ops->query(mr, what, value_p);
}

rankmem_status_t rankmem_resource_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_resource_forget_stream: NULL resource");
    for (; mr; mr = mr->upstream)
        if (HAS_OP(mr, forget_stream)) {
            rankmem_status_t st = mr->ops->forget_stream(mr, stream);
            if (st != RANKMEM_SUCCESS)
                return st;
        }
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_resource_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "trim: NULL resource");
    if (!HAS_OP(mr, trim))
        return RANKMEM_SUCCESS; /* nothing cached, nothing to give back */
    return mr->ops->trim(mr, keep_bytes);
}

rankmem_status_t rankmem_resource_is_equal(const rankmem_resource_t *a,
                                           const rankmem_resource_t *b, int *equal_p)
{
    if (!a || !b || !equal_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "is_equal: NULL argument");
    int eq = a == b;
    /* Resources of different types may share a backing store (async and
     * async_view over one pool): ask when both use the same comparison. */
    if (!eq && HAS_OP(a, is_equal) && HAS_OP(b, is_equal) && a->ops->is_equal == b->ops->is_equal)
        eq = a->ops->is_equal(a, b) != 0;
    *equal_p = eq;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_resource_name(const rankmem_resource_t *mr, const char **name_p)
{
    if (!mr || !name_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "name: NULL argument");
    *name_p = mr->ops->name ? mr->ops->name : "unnamed";
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_resource_device(const rankmem_resource_t *mr, int *device_p)
{
    if (!mr || !device_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "device: NULL argument");
    *device_p = mr->device;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_resource_properties(const rankmem_resource_t *mr, unsigned *props_p)
{
    if (!mr || !props_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "properties: NULL argument");
    *props_p = mr->props;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_resource_upstream(const rankmem_resource_t *mr,
                                           rankmem_resource_t **upstream_p)
{
    if (!mr || !upstream_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "upstream: NULL argument");
    *upstream_p = mr->upstream;
    return RANKMEM_SUCCESS;
}
