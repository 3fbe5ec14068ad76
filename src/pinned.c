/* cudaHostAlloc (portable, mapped): page-locked host memory that every
 * device may read and write through unified addressing, and that copies
 * reach at full speed. Allocation is very slow (~40 ms per 64 MiB): pool it.
 * Streams are ignored. The skeleton is direct.h's. */
#include "internal.h"
#include "direct.h"

#if HAVE_GPU
#include "gpu_api.h"

/* Portable: usable from every device's context; mapped: kernels can touch
 * it directly (device-accessible, as props say). */
static int pinned_alloc(void **p, size_t bytes)
{
    return (int)cudaHostAlloc(p, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
}

static int pinned_release(void *p) { return (int)cudaFreeHost(p); }
#define PINNED_CALLS pinned_alloc, pinned_release
#else
#define PINNED_CALLS NULL, NULL
#endif

/* cudaHostAlloc hands out whole pages: 4096-byte alignment. */
static const rk_direct_kind_t pinned_kind = {
    RK_DIRECT_OPS("pinned"), "cudaHostAlloc", "cudaFreeHost", 4096,
    RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE, 0, PINNED_CALLS, NULL,
};

rankmem_status_t rankmem_pinned_create(rankmem_resource_t **mr_p)
{
    return rk_direct_create(&pinned_kind, mr_p);
}
