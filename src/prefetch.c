/* prefetch: after each allocation, migrate managed memory to the current
 * device on the allocation's stream (RMM's prefetch_resource_adaptor), so the
 * first kernel that touches it does not fault its pages in one by one.
 *
 * Only for upstreams whose memory is host- and device-accessible (managed,
 * or a pool over it): any other is refused at creation with
 * RANKMEM_ERR_NOT_SUPPORTED. So is a device without concurrent managed
 * access (cudaDevAttrConcurrentManagedAccess 0), where the runtime refuses
 * every prefetch to a GPU: better one clear error at creation than a failure
 * on every allocation.
 *
 * A prefetch that still fails (memory that is not managed after all, such as
 * pinned host memory behind a callback) fails the allocation: the block goes
 * back upstream and the CUDA error is returned. Silently skipping would hide
 * a chain that does not do what it says. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

#define BOTH_SIDES (RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE)

#if HAVE_GPU
#include "gpu_api.h"

static cudaError_t prefetch_to_device(const void *p, size_t bytes, int dev, cudaStream_t stream)
{
#if RK_GPU_MEMLOCATION_ADVISE
    struct cudaMemLocation loc;
    loc.type = cudaMemLocationTypeDevice;
    loc.id = dev;
    return cudaMemPrefetchAsync(p, bytes, loc, 0, stream);
#else
    return cudaMemPrefetchAsync(p, bytes, dev, stream);
#endif
}

static rankmem_status_t prefetch_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                          rankmem_stream_t stream, void **ptr_p)
{
    rankmem_resource_t *up = mr->upstream;
    void *p = NULL;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, &p);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        return st;
    /* The device current now, not at creation: that is where the caller's
     * kernels will run. */
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (RK_LIKELY(err == cudaSuccess))
        err = prefetch_to_device(p, bytes, dev, (cudaStream_t)stream);
    if (RK_UNLIKELY(err != cudaSuccess)) {
        up->ops->deallocate(up, p, bytes, alignment, stream);
        char what[160];
        snprintf(what, sizeof what, "prefetch: cudaMemPrefetchAsync to device %d%s", dev,
                 err == cudaErrorInvalidValue ? " (is the upstream's memory managed?)" : "");
        return rk_cuda_error(err, what, bytes);
    }
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t prefetch_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                            size_t alignment, rankmem_stream_t stream)
{
    rankmem_resource_t *up = mr->upstream;
    return up->ops->deallocate(up, ptr, bytes, alignment, stream);
}

static rankmem_status_t prefetch_query(rankmem_resource_t *mr, rankmem_query_t what,
                                       size_t *value_p)
{
    return rankmem_resource_query(mr->upstream, what, value_p);
}

static rankmem_status_t prefetch_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static rankmem_status_t prefetch_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static int prefetch_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    (void)mr;
    return snprintf(buf, len, "prefetch");
}

static const rankmem_resource_ops_t prefetch_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "prefetch",
    .allocate = prefetch_allocate,
    .deallocate = prefetch_deallocate,
    .query = prefetch_query,
    .trim = prefetch_trim,
    .finalize = prefetch_finalize,
    .describe = prefetch_describe,
};
#endif /* HAVE_GPU */

rankmem_status_t rankmem_prefetch_create(rankmem_resource_t *upstream, rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_prefetch_create: NULL %s",
                        upstream ? "mr_p" : "upstream");
    if ((upstream->props & BOTH_SIDES) != BOTH_SIDES)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_prefetch_create: the memory of upstream '%s' is not managed "
                        "(it is not both host- and device-accessible)",
                        upstream->ops->name ? upstream->ops->name : "?");
#if HAVE_GPU
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_prefetch_create: no GPU (%s)",
                        rk_gpu_absent_reason());
    int dev, concurrent = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_prefetch_create: cudaDeviceGetAttribute", 0);
    if (!concurrent)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_prefetch_create: device %d has no concurrent managed access, "
                        "so managed memory cannot be prefetched to it",
                        dev);
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(rankmem_resource_t), &prefetch_ops,
                                          upstream->props, upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    mr->device = upstream->device;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
#else
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                    "rankmem_prefetch_create: rankmem was built without CUDA");
#endif
}
