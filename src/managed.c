/* cudaMallocManaged (cudaMemAttachGlobal): memory both the host and every
 * device may touch; pages migrate on demand. Streams are ignored. */
#include "internal.h"

#include <stdlib.h>

#if HAVE_GPU
#include "gpu_api.h"

/* What cudaMallocManaged is documented to guarantee (like cudaMalloc). */
#define MANAGED_ALIGNMENT ((size_t)256)

static rankmem_status_t managed_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                         rankmem_stream_t stream, void **ptr_p)
{
    (void)mr;
    (void)stream;
    if (RK_UNLIKELY(alignment > MANAGED_ALIGNMENT))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "managed: alignment %zu for %zu bytes; cudaMallocManaged guarantees "
                        "only %zu",
                        alignment, bytes, MANAGED_ALIGNMENT);
    void *p;
    cudaError_t err = cudaMallocManaged(&p, bytes, cudaMemAttachGlobal);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "managed: cudaMallocManaged", bytes);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t managed_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                           size_t alignment, rankmem_stream_t stream)
{
    (void)mr;
    (void)alignment;
    (void)stream;
    cudaError_t err = cudaFree(ptr);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "managed: cudaFree", bytes);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t managed_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t managed_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "managed",
    .allocate = managed_allocate,
    .deallocate = managed_deallocate,
    .finalize = managed_finalize,
};

rankmem_status_t rankmem_managed_create(rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_managed_create: NULL mr_p");
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_managed_create: no GPU (%s)",
                        rk_gpu_absent_reason());
    /* Checked once here, so that allocate never fails for a reason fixed at creation. */
    int dev, managed = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_managed_create: cudaDeviceGetAttribute", 0);
    if (!managed)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_managed_create: device %d does not support managed memory", dev);
    return rk_resource_new(sizeof(rankmem_resource_t), &managed_ops,
                           RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE, NULL,
                           mr_p);
}

#else /* !HAVE_GPU */

rankmem_status_t rankmem_managed_create(rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_managed_create: NULL mr_p");
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                    "rankmem_managed_create: rankmem was built without CUDA");
}

#endif
