/* cudaHostAlloc (portable, mapped): page-locked host memory that every
 * device may read and write through unified addressing, and that copies
 * reach at full speed. Allocation is very slow (~40 ms per 64 MiB): pool it.
 * Streams are ignored. */
#include "internal.h"

#include <stdlib.h>

#if HAVE_GPU
#include "gpu_api.h"

/* cudaHostAlloc hands out whole pages. */
#define PINNED_ALIGNMENT ((size_t)4096)

static rankmem_status_t pinned_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                        rankmem_stream_t stream, void **ptr_p)
{
    (void)mr;
    (void)stream;
    if (RK_UNLIKELY(alignment > PINNED_ALIGNMENT))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "pinned: alignment %zu for %zu bytes; cudaHostAlloc guarantees only %zu",
                        alignment, bytes, PINNED_ALIGNMENT);
    void *p;
    /* Portable: usable from every device's context; mapped: kernels can
     * touch it directly (device-accessible, as props say). */
    cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "pinned: cudaHostAlloc", bytes);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t pinned_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                          size_t alignment, rankmem_stream_t stream)
{
    (void)mr;
    (void)alignment;
    (void)stream;
    cudaError_t err = cudaFreeHost(ptr);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "pinned: cudaFreeHost", bytes);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t pinned_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t pinned_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "pinned",
    .allocate = pinned_allocate,
    .deallocate = pinned_deallocate,
    .finalize = pinned_finalize,
};

rankmem_status_t rankmem_pinned_create(rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_pinned_create: NULL mr_p");
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_pinned_create: no GPU (%s)",
                        rk_gpu_absent_reason());
    return rk_resource_new(sizeof(rankmem_resource_t), &pinned_ops,
                           RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE, NULL,
                           mr_p);
}

#else /* !HAVE_GPU */

rankmem_status_t rankmem_pinned_create(rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_pinned_create: NULL mr_p");
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                    "rankmem_pinned_create: rankmem was built without CUDA");
}

#endif
