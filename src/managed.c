/* cudaMallocManaged (cudaMemAttachGlobal): memory both the host and every
 * device may touch; pages migrate on demand. Streams are ignored. The
 * skeleton is direct.h's. */
#include "internal.h"
#include "direct.h"

#include <stdio.h>

#if HAVE_GPU
#include "gpu_api.h"

static int managed_alloc(void **p, size_t bytes)
{
    return (int)cudaMallocManaged(p, bytes, cudaMemAttachGlobal);
}

static int managed_release(void *p) { return (int)cudaFree(p); }

static rankmem_status_t managed_check(const char *fn)
{
    int dev, managed = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev);
    if (err != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "%s: cudaDeviceGetAttribute", fn);
        return rk_cuda_error(err, what, 0);
    }
    if (!managed)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "%s: device %d does not support managed memory",
                        fn, dev);
    return RANKMEM_SUCCESS;
}
#define MANAGED_CALLS managed_alloc, managed_release, managed_check
#else
#define MANAGED_CALLS NULL, NULL, NULL
#endif

/* 256: what cudaMallocManaged is documented to guarantee (like cudaMalloc). */
static const rk_direct_kind_t managed_kind = {
    RK_DIRECT_OPS("managed"), "cudaMallocManaged", "cudaFree", 256,
    RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE, 0, MANAGED_CALLS,
};

rankmem_status_t rankmem_managed_create(rankmem_resource_t **mr_p)
{
    return rk_direct_create(&managed_kind, mr_p);
}
