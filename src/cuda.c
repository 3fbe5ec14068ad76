/* cudaMalloc/cudaFree on the device current at creation. cudaMalloc is
 * synchronous and slow (~91 us on an H100): this is the upstream that pools
 * draw from, never the hot path itself. Streams are ignored.
 *
 * Also the skeleton that managed.c and pinned.c share (direct.h). */
#include "internal.h"
#include "direct.h"

#include <stdio.h>
#include <stdlib.h>

#if HAVE_GPU
#include "gpu_api.h"
#endif

static const rk_direct_kind_t *kind_of(const rankmem_resource_t *mr)
{
    return (const rk_direct_kind_t *)((const char *)mr->ops - offsetof(rk_direct_kind_t, ops));
}

rankmem_status_t rk_direct_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                    rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    const rk_direct_kind_t *k = kind_of(mr);
    char what[64];
    if (RK_UNLIKELY(alignment > k->alignment))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "%s: alignment %zu for %zu bytes; %s guarantees only %zu "
                        "(put a pool above it for larger alignments)",
                        k->ops.name, alignment, bytes, k->alloc_call, k->alignment);
#if HAVE_GPU
    if (k->same_device) {
        /* The call allocates on whatever device is current: catch a resource
         * used on the wrong device instead of handing out foreign memory.
         * The check is cheap next to the allocation itself. */
        int dev;
        cudaError_t err = cudaGetDevice(&dev);
        if (RK_UNLIKELY(err != cudaSuccess)) {
            snprintf(what, sizeof what, "%s: cudaGetDevice", k->ops.name);
            return rk_cuda_error(err, what, 0);
        }
        if (RK_UNLIKELY(dev != mr->device))
            return rk_error(RANKMEM_ERR_WRONG_DEVICE,
                            "%s: resource of device %d used to allocate %zu bytes while device "
                            "%d is current (call cudaSetDevice(%d) first, or use device %d's "
                            "resource)",
                            k->ops.name, mr->device, bytes, dev, mr->device, dev);
    }
#endif
    void *p;
    int err = k->alloc(&p, bytes);
    if (RK_UNLIKELY(err != 0)) {
        snprintf(what, sizeof what, "%s: %s", k->ops.name, k->alloc_call);
        return rk_cuda_error(err, what, bytes);
    }
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_direct_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                      size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    (void)stream;
    const rk_direct_kind_t *k = kind_of(mr);
    /* The frees work whatever device is current (unified addressing). */
    int err = k->release(ptr);
    if (RK_UNLIKELY(err != 0)) {
        char what[64];
        snprintf(what, sizeof what, "%s: %s", k->ops.name, k->free_call);
        return rk_cuda_error(err, what, bytes);
    }
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_direct_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_direct_create(const rk_direct_kind_t *k, rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_%s_create: NULL mr_p",
                        k->ops.name);
    if (!k->alloc)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_%s_create: rankmem was built without CUDA", k->ops.name);
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_%s_create: no GPU (%s)", k->ops.name,
                        rk_gpu_absent_reason());
    if (k->check) {
        char fn[64];
        snprintf(fn, sizeof fn, "rankmem_%s_create", k->ops.name);
        rankmem_status_t st = k->check(fn);
        if (st != RANKMEM_SUCCESS)
            return st; /* checked once here, so that allocate never fails for it */
    }
    /* The header alone: the device is recorded there by rk_resource_new. */
    return rk_resource_new(sizeof(rankmem_resource_t), &k->ops, k->props, NULL, mr_p);
}

#if HAVE_GPU
static int cuda_alloc(void **p, size_t bytes) { return (int)cudaMalloc(p, bytes); }
static int cuda_release(void *p) { return (int)cudaFree(p); }
#define CUDA_CALLS cuda_alloc, cuda_release
#else
#define CUDA_CALLS NULL, NULL
#endif

/* 256: what cudaMalloc guarantees; larger alignments would need
 * over-allocation and a way back to the base pointer, which pools above do
 * better. */
static const rk_direct_kind_t cuda_kind = {
    RK_DIRECT_OPS("cuda"), "cudaMalloc", "cudaFree", 256, RANKMEM_PROP_DEVICE_ACCESSIBLE, 1,
    CUDA_CALLS, NULL,
};

rankmem_status_t rankmem_cuda_create(rankmem_resource_t **mr_p)
{
    return rk_direct_create(&cuda_kind, mr_p);
}
