/* cudaMalloc/cudaFree on the device current at creation. cudaMalloc is
 * synchronous and slow (~91 us on an H100): this is the upstream that pools
 * draw from, never the hot path itself. Streams are ignored. */
#include "internal.h"

#include <stdlib.h>

#if HAVE_GPU
#include "gpu_api.h"

/* What cudaMalloc guarantees; larger alignments would need over-allocation
 * and a way back to the base pointer, which pools above do better. */
#define CUDA_MALLOC_ALIGNMENT ((size_t)256)

static rankmem_status_t cuda_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                      rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    if (RK_UNLIKELY(alignment > CUDA_MALLOC_ALIGNMENT))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "cuda: alignment %zu for %zu bytes; cudaMalloc guarantees only %zu "
                        "(put a pool above it for larger alignments)",
                        alignment, bytes, CUDA_MALLOC_ALIGNMENT);
    /* cudaMalloc allocates on whatever device is current: catch a resource
     * used on the wrong device instead of handing out foreign memory. The
     * check is cheap next to cudaMalloc itself. */
    int dev;
    cudaError_t err = cudaGetDevice(&dev);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "cuda: cudaGetDevice", 0);
    if (RK_UNLIKELY(dev != mr->device))
        return rk_error(RANKMEM_ERR_WRONG_DEVICE,
                        "cuda: resource of device %d used to allocate %zu bytes while device %d "
                        "is current (call cudaSetDevice(%d) first, or use device %d's resource)",
                        mr->device, bytes, dev, mr->device, dev);
    void *p;
    err = cudaMalloc(&p, bytes);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "cuda: cudaMalloc", bytes);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t cuda_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                        size_t alignment, rankmem_stream_t stream)
{
    (void)mr;
    (void)alignment;
    (void)stream;
    /* cudaFree works whatever device is current (unified addressing). */
    cudaError_t err = cudaFree(ptr);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "cuda: cudaFree", bytes);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t cuda_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t cuda_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "cuda",
    .allocate = cuda_allocate,
    .deallocate = cuda_deallocate,
    .finalize = cuda_finalize,
};

rankmem_status_t rankmem_cuda_create(rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_cuda_create: NULL mr_p");
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_cuda_create: no GPU (%s)",
                        rk_gpu_absent_reason());
    /* The header alone: the device is recorded there by rk_resource_new. */
    return rk_resource_new(sizeof(rankmem_resource_t), &cuda_ops,
                           RANKMEM_PROP_DEVICE_ACCESSIBLE, NULL, mr_p);
}

#else /* !HAVE_GPU */

rankmem_status_t rankmem_cuda_create(rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_cuda_create: NULL mr_p");
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "rankmem_cuda_create: rankmem was built without CUDA");
}

#endif
