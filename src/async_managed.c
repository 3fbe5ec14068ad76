/* async_managed: managed memory from a stream-ordered pool of its own
 * (cudaMemPoolCreate with allocation type managed; cudaMallocFromPoolAsync,
 * cudaFreeAsync). Managed pools came with CUDA 13.0 (toolkit and driver) and
 * need concurrent managed access on every device; elsewhere creation fails
 * with RANKMEM_ERR_NOT_SUPPORTED and says which of these is missing.
 *
 * Same shape as async.c (queries, trim, release threshold, initial size),
 * with its own struct and ops so that async's fast path keeps no branch for
 * it; the pool's preferred location replaces async's export handle type. */
#include "internal.h"
#include "config_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#if HAVE_GPU
#include "gpu_api.h"
#if RK_GPU_MANAGED_POOLS
#define RK_MANAGED_POOLS 1
#endif
#endif

rankmem_status_t rankmem_async_managed_params_default(rankmem_async_managed_params_t *params_p)
{
    if (!params_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_managed_params_default: NULL params_p");
    *params_p = (rankmem_async_managed_params_t){
        .size = sizeof(rankmem_async_managed_params_t),
        .initial_pool_size = 0,
        .release_threshold = SIZE_MAX,
        .preferred_location = RANKMEM_MANAGED_PREFER_DEVICE,
    };
    return RANKMEM_SUCCESS;
}

/* Argument checks shared by every build, so that bad input gets the same
 * answer with or without CUDA. */
static rankmem_status_t check_params(const rankmem_async_managed_params_t *params)
{
    if (!params)
        return RANKMEM_SUCCESS;
    if (params->size < sizeof(rankmem_async_managed_params_t))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_managed_create: params->size is %zu, want %zu (call "
                        "rankmem_async_managed_params_default first)",
                        params->size, sizeof(rankmem_async_managed_params_t));
    if (params->preferred_location < RANKMEM_MANAGED_PREFER_DEVICE ||
        params->preferred_location > RANKMEM_MANAGED_PREFER_NONE)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_managed_create: unknown preferred_location %d",
                        params->preferred_location);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t check_handle_args(rankmem_resource_t *mr, rankmem_mempool_t *pool_p)
{
    if (!mr || !pool_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_managed_pool_handle: NULL %s",
                        mr ? "pool_p" : "resource");
    return RANKMEM_SUCCESS;
}

#if RK_MANAGED_POOLS

/* What pool allocations are guaranteed (as cudaMalloc). */
#define AM_ALIGNMENT ((size_t)256)

typedef struct rk_am {
    rankmem_resource_t base;
    cudaMemPool_t pool; /* ours: destroyed with the resource */
    rankmem_async_managed_params_t params; /* as created, for describe */
} rk_am_t;

static const rankmem_resource_ops_t am_ops;

static rankmem_status_t am_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                    rankmem_stream_t stream, void **ptr_p)
{
    if (RK_UNLIKELY(alignment > AM_ALIGNMENT))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "async_managed: alignment %zu for %zu bytes; the CUDA pool guarantees "
                        "only %zu",
                        alignment, bytes, AM_ALIGNMENT);
    void *p;
    cudaError_t err =
        cudaMallocFromPoolAsync(&p, bytes, ((rk_am_t *)mr)->pool, (cudaStream_t)stream);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "async_managed: cudaMallocFromPoolAsync", bytes);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t am_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                      size_t alignment, rankmem_stream_t stream)
{
    (void)mr;
    (void)alignment;
    cudaError_t err = cudaFreeAsync(ptr, (cudaStream_t)stream);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, "async_managed: cudaFreeAsync", bytes);
    return RANKMEM_SUCCESS;
}

/* Queries and trim are the stream-ordered pool's (async.c). */
static rankmem_status_t am_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    return rk_mempool_query(((rk_am_t *)mr)->pool, "async_managed", what, value_p);
}

static rankmem_status_t am_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rk_mempool_trim(((rk_am_t *)mr)->pool, "async_managed", keep_bytes);
}

/* Each resource owns its pool, so only resources over the same pool (that
 * is, the same resource) are equal; written out for symmetry with async. */
static int am_is_equal(const rankmem_resource_t *a, const rankmem_resource_t *b)
{
    return a->ops == &am_ops && b->ops == &am_ops &&
           ((const rk_am_t *)a)->pool == ((const rk_am_t *)b)->pool;
}

static rankmem_status_t am_finalize(rankmem_resource_t *mr)
{
    rk_am_t *am = (rk_am_t *)mr;
    cudaError_t err = cudaMemPoolDestroy(am->pool);
    free(am);
    /* At process exit the runtime may already be gone: nothing left to free then. */
    if (err == cudaErrorCudartUnloading) {
        (void)cudaGetLastError();
        err = cudaSuccess;
    }
    if (err != cudaSuccess)
        return rk_cuda_error(err, "async_managed: cudaMemPoolDestroy", 0);
    return RANKMEM_SUCCESS;
}

static const char *const prefer_names[] = {"device", "host", "none"};

/* Spec syntax: the options that differ from the defaults. */
static int am_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const rankmem_async_managed_params_t *prm = &((const rk_am_t *)mr)->params;
    char opts[128] = "", sz[40];
    size_t o = 0;
    if (prm->initial_pool_size) {
        rk_format_size(sz, sizeof sz, prm->initial_pool_size);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",initial=%s", sz);
    }
    if (prm->release_threshold != SIZE_MAX) {
        rk_format_size(sz, sizeof sz, prm->release_threshold);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",release=%s", sz);
    }
    if (prm->preferred_location != RANKMEM_MANAGED_PREFER_DEVICE)
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",prefer=%s",
                              prefer_names[prm->preferred_location]);
    return o ? snprintf(buf, len, "async_managed(%s)", opts + 1)
             : snprintf(buf, len, "async_managed");
}

static const rankmem_resource_ops_t am_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "async_managed",
    .allocate = am_allocate,
    .deallocate = am_deallocate,
    .query = am_query,
    .is_equal = am_is_equal,
    .trim = am_trim,
    .finalize = am_finalize,
    .describe = am_describe,
};

/* What stands between this device and a managed pool, checked up front so
 * that the error names it rather than cudaMemPoolCreate's bare "invalid
 * argument" from an older driver. */
static rankmem_status_t check_support(int dev)
{
    int driver = 0, pools = 0, concurrent = 0;
    cudaError_t err = cudaDriverGetVersion(&driver);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_managed_create: cudaDriverGetVersion", 0);
    if (driver < 13000)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_async_managed_create: the driver supports CUDA %d.%d; managed "
                        "memory pools need 13.0 or later",
                        driver / 1000, driver % 1000 / 10);
    err = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_managed_create: cudaDeviceGetAttribute", 0);
    if (!pools)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_async_managed_create: device %d has no stream-ordered allocator "
                        "(cudaDevAttrMemoryPoolsSupported is 0)",
                        dev);
    if (!concurrent)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_async_managed_create: device %d has no concurrent managed "
                        "access (cudaDevAttrConcurrentManagedAccess is 0), which managed pools "
                        "need",
                        dev);
    return RANKMEM_SUCCESS;
}

/* A new managed pool, set up as params say; destroyed again on failure. */
static rankmem_status_t create_pool(int dev, const rankmem_async_managed_params_t *params,
                                    cudaMemPool_t *pool_p)
{
    struct cudaMemPoolProps props = {0};
    props.allocType = cudaMemAllocationTypeManaged;
    props.handleTypes = cudaMemHandleTypeNone; /* managed pools cannot be exported */
    switch (params->preferred_location) {
    case RANKMEM_MANAGED_PREFER_HOST:
        props.location.type = cudaMemLocationTypeHost;
        props.location.id = 0;
        break;
    case RANKMEM_MANAGED_PREFER_NONE:
        props.location.type = cudaMemLocationTypeNone;
        props.location.id = 0;
        break;
    default:
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        break;
    }
    props.maxSize = 0; /* must be 0 for managed pools */
    cudaMemPool_t pool = NULL;
    cudaError_t err = cudaMemPoolCreate(&pool, &props);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return rk_error(err == cudaErrorNotSupported || err == cudaErrorInvalidValue
                            ? RANKMEM_ERR_NOT_SUPPORTED
                            : RANKMEM_ERR_DEVICE,
                        "rankmem_async_managed_create: cudaMemPoolCreate(managed, prefer %s) on "
                        "device %d: %s (%s, error %d)",
                        prefer_names[params->preferred_location], dev, cudaGetErrorString(err),
                        cudaGetErrorName(err), (int)err);
    }

    rankmem_status_t st = rk_mempool_setup(pool, "rankmem_async_managed_create",
                                           params->release_threshold, params->initial_pool_size);
    if (st != RANKMEM_SUCCESS)
        return st;
    *pool_p = pool;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_async_managed_create(const rankmem_async_managed_params_t *params,
                                              rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_managed_create: NULL mr_p");
    rankmem_status_t st = check_params(params);
    if (st != RANKMEM_SUCCESS)
        return st;
    rankmem_async_managed_params_t prm;
    if (params)
        prm = *params;
    else
        rankmem_async_managed_params_default(&prm);
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_async_managed_create: no GPU (%s)",
                        rk_gpu_absent_reason());
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_managed_create: cudaGetDevice", 0);
    st = check_support(dev);
    if (st != RANKMEM_SUCCESS)
        return st;
    cudaMemPool_t pool = NULL;
    st = create_pool(dev, &prm, &pool);
    if (st != RANKMEM_SUCCESS)
        return st;
    rankmem_resource_t *mr;
    st = rk_resource_new(sizeof(rk_am_t), &am_ops,
                         RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE |
                             RANKMEM_PROP_STREAM_ORDERED,
                         NULL, &mr);
    if (st != RANKMEM_SUCCESS) {
        (void)cudaMemPoolDestroy(pool);
        (void)cudaGetLastError();
        return st;
    }
    ((rk_am_t *)mr)->pool = pool;
    ((rk_am_t *)mr)->params = prm;
    ((rk_am_t *)mr)->params.size = sizeof prm;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_async_managed_pool_handle(rankmem_resource_t *mr,
                                                   rankmem_mempool_t *pool_p)
{
    rankmem_status_t st = check_handle_args(mr, pool_p);
    if (st != RANKMEM_SUCCESS)
        return st;
    if (mr->ops != &am_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_managed_pool_handle: resource '%s' is not async_managed",
                        mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
    *pool_p = (rankmem_mempool_t)((rk_am_t *)mr)->pool;
    return RANKMEM_SUCCESS;
}

#else /* no managed pools in this build */

#if HAVE_CUDA
#define AM_WHY_NOT "rankmem was built with a CUDA toolkit older than 13.0, which has no managed memory pools"
#elif HAVE_HIP
#define AM_WHY_NOT "rankmem was built with HIP, whose memory pools hold device memory only (no managed memory pools)"
#else
#define AM_WHY_NOT "rankmem was built without CUDA"
#endif

rankmem_status_t rankmem_async_managed_create(const rankmem_async_managed_params_t *params,
                                              rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_managed_create: NULL mr_p");
    rankmem_status_t st = check_params(params);
    if (st != RANKMEM_SUCCESS)
        return st;
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "rankmem_async_managed_create: " AM_WHY_NOT);
}

rankmem_status_t rankmem_async_managed_pool_handle(rankmem_resource_t *mr,
                                                   rankmem_mempool_t *pool_p)
{
    rankmem_status_t st = check_handle_args(mr, pool_p);
    if (st != RANKMEM_SUCCESS)
        return st;
    /* No async_managed resource can exist in this build. */
    return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                    "rankmem_async_managed_pool_handle: resource '%s' is not async_managed",
                    mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
}

#endif
