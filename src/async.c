/* The CUDA stream-ordered allocator (cudaMallocFromPoolAsync/cudaFreeAsync)
 * as two resources:
 *   "async"      over the device's default pool, or over a pool it creates
 *                (and then owns and destroys);
 *   "async_view" over a pool the caller created and keeps alive.
 * Both share one struct and every op except their names. Allocation is one
 * runtime call (~1.6 us): no checks that cost a call are added on that path. */
#include "internal.h"
#include "config_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define KNOWN_HANDLES (RANKMEM_HANDLE_POSIX_FD | RANKMEM_HANDLE_FABRIC)

rankmem_status_t rankmem_async_params_default(rankmem_async_params_t *params_p)
{
    if (!params_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_params_default: NULL params_p");
    *params_p = (rankmem_async_params_t){
        .size = sizeof(rankmem_async_params_t),
        .use_default_pool = 0,
        .initial_pool_size = 0,
        .release_threshold = SIZE_MAX,
        .handle_type = RANKMEM_HANDLE_NONE,
        .reuse_follow_event_dependencies = -1,
        .reuse_allow_opportunistic = -1,
        .reuse_allow_internal_dependencies = -1,
    };
    return RANKMEM_SUCCESS;
}

/* Argument checks shared by both builds, so that bad input gets the same
 * answer with or without CUDA. */
static rankmem_status_t check_params(const rankmem_async_params_t *params)
{
    if (!params)
        return RANKMEM_SUCCESS;
    /* A struct from an older header would be read past its end. */
    if (params->size < sizeof(rankmem_async_params_t))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_create: params->size is %zu, want %zu (call "
                        "rankmem_async_params_default first)",
                        params->size, sizeof(rankmem_async_params_t));
    if (!params->use_default_pool && (params->handle_type & ~KNOWN_HANDLES))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_create: unknown handle_type 0x%x", params->handle_type);
    const int reuse[3] = {params->reuse_follow_event_dependencies,
                          params->reuse_allow_opportunistic,
                          params->reuse_allow_internal_dependencies};
    static const char *const reuse_name[3] = {"reuse_follow_event_dependencies",
                                              "reuse_allow_opportunistic",
                                              "reuse_allow_internal_dependencies"};
    for (int i = 0; i < 3; i++)
        if (reuse[i] < -1 || reuse[i] > 1)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_async_create: %s is %d; -1 (runtime default), 0 or 1",
                            reuse_name[i], reuse[i]);
    return RANKMEM_SUCCESS;
}

#if HAVE_GPU
#include "gpu_api.h"

/* What pool allocations are guaranteed (as cudaMalloc). */
#define ASYNC_ALIGNMENT ((size_t)256)

typedef struct rk_async {
    rankmem_resource_t base;
    cudaMemPool_t pool;
    int owned; /* we created the pool, so we destroy it; never the default pool */
    rankmem_async_params_t params; /* as created, for describe (owned pools) */
} rk_async_t;

static const rankmem_resource_ops_t async_ops, async_view_ops;

static inline int is_async(const rankmem_resource_t *mr)
{
    return mr->ops == &async_ops || mr->ops == &async_view_ops;
}

static rankmem_status_t async_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    if (RK_UNLIKELY(alignment > ASYNC_ALIGNMENT))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "%s: alignment %zu for %zu bytes; the " RK_GPU_RUNTIME
                        " pool guarantees only %zu",
                        mr->ops->name, alignment, bytes, ASYNC_ALIGNMENT);
    void *p;
    cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, ((rk_async_t *)mr)->pool,
                                              (cudaStream_t)stream);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, mr->ops == &async_ops ? "async: cudaMallocFromPoolAsync"
                                                        : "async_view: cudaMallocFromPoolAsync",
                             bytes);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t async_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    cudaError_t err = cudaFreeAsync(ptr, (cudaStream_t)stream);
    if (RK_UNLIKELY(err != cudaSuccess))
        return rk_cuda_error(err, mr->ops == &async_ops ? "async: cudaFreeAsync"
                                                        : "async_view: cudaFreeAsync",
                             bytes);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_mempool_query(void *pool, const char *name, rankmem_query_t what,
                                  size_t *value_p)
{
    enum cudaMemPoolAttr attr;
    switch (what) {
    case RANKMEM_QUERY_RESERVED_CURRENT:
        attr = cudaMemPoolAttrReservedMemCurrent;
        break;
    case RANKMEM_QUERY_RESERVED_HIGH:
        attr = cudaMemPoolAttrReservedMemHigh;
        break;
    case RANKMEM_QUERY_USED_CURRENT:
        attr = cudaMemPoolAttrUsedMemCurrent;
        break;
    case RANKMEM_QUERY_USED_HIGH:
        attr = cudaMemPoolAttrUsedMemHigh;
        break;
    default:
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "%s: query %d is not supported", name,
                        (int)what);
    }
    uint64_t v; /* these attributes are cuuint64_t */
    cudaError_t err = cudaMemPoolGetAttribute((cudaMemPool_t)pool, attr, &v);
    if (err != cudaSuccess) {
        char what_s[96];
        snprintf(what_s, sizeof what_s, "%s: cudaMemPoolGetAttribute", name);
        return rk_cuda_error(err, what_s, 0);
    }
    *value_p = v > SIZE_MAX ? SIZE_MAX : (size_t)v;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_mempool_trim(void *pool, const char *name, size_t keep_bytes)
{
    cudaError_t err = cudaMemPoolTrimTo((cudaMemPool_t)pool, keep_bytes);
    if (err != cudaSuccess) {
        char what_s[96];
        snprintf(what_s, sizeof what_s, "%s: cudaMemPoolTrimTo", name);
        return rk_cuda_error(err, what_s, keep_bytes);
    }
    return RANKMEM_SUCCESS;
}

static rankmem_status_t async_query(rankmem_resource_t *mr, rankmem_query_t what,
                                    size_t *value_p)
{
    return rk_mempool_query(((rk_async_t *)mr)->pool, mr->ops->name, what, value_p);
}

static rankmem_status_t async_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rk_mempool_trim(((rk_async_t *)mr)->pool, mr->ops->name, keep_bytes);
}

/* Memory from one pool may be freed through any resource over that pool. */
static int async_is_equal(const rankmem_resource_t *a, const rankmem_resource_t *b)
{
    return is_async(a) && is_async(b) &&
           ((const rk_async_t *)a)->pool == ((const rk_async_t *)b)->pool;
}

static rankmem_status_t async_finalize(rankmem_resource_t *mr)
{
    rk_async_t *am = (rk_async_t *)mr;
    cudaError_t err = am->owned ? cudaMemPoolDestroy(am->pool) : cudaSuccess;
    free(am);
    /* At process exit the runtime may already be gone: nothing left to free then. */
    if (err == cudaErrorCudartUnloading) {
        (void)cudaGetLastError();
        err = cudaSuccess;
    }
    if (err != cudaSuccess)
        return rk_cuda_error(err, "async: cudaMemPoolDestroy", 0);
    return RANKMEM_SUCCESS;
}

/* Spec syntax: the default pool, or the options of our own pool that differ
 * from rankmem_async_params_default(). */
static int async_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const rk_async_t *am = (const rk_async_t *)mr;
    if (!am->owned)
        return snprintf(buf, len, "async(default=1)");
    char opts[128] = "", sz[40];
    size_t o = 0;
    if (am->params.initial_pool_size) {
        rk_format_size(sz, sizeof sz, am->params.initial_pool_size);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",initial=%s", sz);
    }
    if (am->params.release_threshold != SIZE_MAX) {
        rk_format_size(sz, sizeof sz, am->params.release_threshold);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",release=%s", sz);
    }
    int h = am->params.handle_type;
    if (h != RANKMEM_HANDLE_NONE)
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",export=%s",
                              h == RANKMEM_HANDLE_POSIX_FD ? "posix_fd"
                              : h == RANKMEM_HANDLE_FABRIC ? "fabric"
                                                           : "posix_fd+fabric");
    return o ? snprintf(buf, len, "async(%s)", opts + 1) : snprintf(buf, len, "async");
}

static const rankmem_resource_ops_t async_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "async",
    .allocate = async_allocate,
    .deallocate = async_deallocate,
    .query = async_query,
    .is_equal = async_is_equal,
    .trim = async_trim,
    .finalize = async_finalize,
    .describe = async_describe,
};

static const rankmem_resource_ops_t async_view_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "async_view",
    .allocate = async_allocate,
    .deallocate = async_deallocate,
    .query = async_query,
    .is_equal = async_is_equal,
    .trim = async_trim,
    .finalize = async_finalize,
};

#define ASYNC_PROPS (RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_STREAM_ORDERED)

static rankmem_status_t wrap_pool(const rankmem_resource_ops_t *ops, cudaMemPool_t pool,
                                  int owned, rankmem_resource_t **mr_p)
{
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(rk_async_t), ops, ASYNC_PROPS, NULL, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    ((rk_async_t *)mr)->pool = pool;
    ((rk_async_t *)mr)->owned = owned;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_mempool_setup(void *pool_v, const char *fn, size_t release_threshold,
                                  size_t initial_size)
{
    cudaMemPool_t pool = (cudaMemPool_t)pool_v;
    const char *step = "cudaMemPoolSetAttribute(ReleaseThreshold)";
    size_t step_bytes = release_threshold;
    /* The pool gives memory back to the OS above this at every synchronisation. */
    uint64_t threshold = release_threshold == SIZE_MAX ? UINT64_MAX : (uint64_t)release_threshold;
    cudaError_t err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    if (err == cudaSuccess && initial_size) {
        /* Reserve the initial size by allocating and freeing it once: the pool
         * keeps it as long as the release threshold allows. */
        void *p;
        step = "initial pool size: cudaMallocFromPoolAsync";
        step_bytes = initial_size;
        err = cudaMallocFromPoolAsync(&p, initial_size, pool, 0);
        if (err == cudaSuccess) {
            step = "initial pool size: cudaFreeAsync";
            err = cudaFreeAsync(p, 0);
            if (err == cudaSuccess) {
                step = "initial pool size: cudaStreamSynchronize";
                err = cudaStreamSynchronize(0);
            }
        }
    }
    if (err != cudaSuccess) {
        char what[160];
        snprintf(what, sizeof what, "%s: %s", fn, step);
        rankmem_status_t st = rk_cuda_error(err, what, step_bytes);
        (void)cudaMemPoolDestroy(pool);
        (void)cudaGetLastError();
        return st;
    }
    return RANKMEM_SUCCESS;
}

/* A new pool on device dev, set up as params say; destroyed again on failure. */
static rankmem_status_t create_pool(int dev, const rankmem_async_params_t *params,
                                    cudaMemPool_t *pool_p)
{
    cudaError_t err;
    if (params->handle_type != RANKMEM_HANDLE_NONE) {
        int supported = 0;
#if RK_GPU_POOL_HANDLE_TYPES_ATTR
        err = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolSupportedHandleTypes, dev);
        if (err != cudaSuccess)
            return rk_cuda_error(err, "rankmem_async_create: cudaDeviceGetAttribute", 0);
#else
        /* The runtime cannot say (HIP 5.x); file descriptors are all it has. */
        supported = RANKMEM_HANDLE_POSIX_FD;
#endif
        if (params->handle_type & ~supported)
            return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                            "rankmem_async_create: device %d cannot export pool memory as handle "
                            "type 0x%x (supported: 0x%x)",
                            dev, params->handle_type, supported);
    }
    struct cudaMemPoolProps props = {0};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = (enum cudaMemAllocationHandleType)params->handle_type;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool = NULL;
    err = cudaMemPoolCreate(&pool, &props);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_create: cudaMemPoolCreate", 0);

    const struct {
        int value;
        enum cudaMemPoolAttr attr;
        const char *what;
    } reuse[3] = {
        {params->reuse_follow_event_dependencies, cudaMemPoolReuseFollowEventDependencies,
         "rankmem_async_create: cudaMemPoolSetAttribute(ReuseFollowEventDependencies)"},
        {params->reuse_allow_opportunistic, cudaMemPoolReuseAllowOpportunistic,
         "rankmem_async_create: cudaMemPoolSetAttribute(ReuseAllowOpportunistic)"},
        {params->reuse_allow_internal_dependencies, cudaMemPoolReuseAllowInternalDependencies,
         "rankmem_async_create: cudaMemPoolSetAttribute(ReuseAllowInternalDependencies)"},
    };
    for (int i = 0; i < 3; i++)
        if (reuse[i].value >= 0) {
            int v = reuse[i].value;
            err = cudaMemPoolSetAttribute(pool, reuse[i].attr, &v);
            if (err != cudaSuccess) {
                rankmem_status_t st = rk_cuda_error(err, reuse[i].what, 0);
                (void)cudaMemPoolDestroy(pool);
                (void)cudaGetLastError();
                return st;
            }
        }
    rankmem_status_t st = rk_mempool_setup(pool, "rankmem_async_create",
                                           params->release_threshold, params->initial_pool_size);
    if (st != RANKMEM_SUCCESS)
        return st;
    *pool_p = pool;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_async_create(const rankmem_async_params_t *params,
                                      rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_create: NULL mr_p");
    rankmem_status_t st = check_params(params);
    if (st != RANKMEM_SUCCESS)
        return st;
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_async_create: no GPU (%s)",
                        rk_gpu_absent_reason());
    int dev, supported = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_create: cudaDeviceGetAttribute", 0);
    if (!supported)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_async_create: device %d has no stream-ordered allocator "
                        "(cudaDevAttrMemoryPoolsSupported is 0)",
                        dev);

    if (!params || params->use_default_pool) {
        cudaMemPool_t pool = NULL;
        err = cudaDeviceGetDefaultMemPool(&pool, dev);
        if (err != cudaSuccess)
            return rk_cuda_error(err, "rankmem_async_create: cudaDeviceGetDefaultMemPool", 0);
        /* Shared with every cudaMallocAsync user of the device: never ours to destroy. */
        return wrap_pool(&async_ops, pool, 0, mr_p);
    }

    cudaMemPool_t pool = NULL;
    st = create_pool(dev, params, &pool);
    if (st != RANKMEM_SUCCESS)
        return st;
    st = wrap_pool(&async_ops, pool, 1, mr_p);
    if (st != RANKMEM_SUCCESS) {
        (void)cudaMemPoolDestroy(pool);
        (void)cudaGetLastError();
    } else {
        ((rk_async_t *)*mr_p)->params = *params;
    }
    return st;
}

rankmem_status_t rankmem_async_view_create(rankmem_mempool_t pool, rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_view_create: NULL mr_p");
    if (!pool)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_view_create: NULL pool");
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_async_view_create: no GPU (%s)",
                        rk_gpu_absent_reason());
    return wrap_pool(&async_view_ops, (cudaMemPool_t)pool, 0, mr_p);
}

rankmem_status_t rankmem_async_pool_handle(rankmem_resource_t *mr, rankmem_mempool_t *pool_p)
{
    if (!mr || !pool_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_pool_handle: NULL %s",
                        mr ? "pool_p" : "resource");
    if (!is_async(mr))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_pool_handle: resource '%s' is not async or async_view",
                        mr->ops->name ? mr->ops->name : "unnamed");
    *pool_p = (rankmem_mempool_t)((rk_async_t *)mr)->pool;
    return RANKMEM_SUCCESS;
}

int rk_async_pool_of(const rankmem_resource_t *mr, void **pool_p, int *handle_types_p)
{
    if (!is_async(mr))
        return 0;
    const rk_async_t *am = (const rk_async_t *)mr;
    *pool_p = (void *)am->pool;
    /* A view's pool was made by the caller: what it can export is unknown here. */
    *handle_types_p = mr->ops == &async_view_ops ? -1
                      : am->owned                ? am->params.handle_type
                                                 : RANKMEM_HANDLE_NONE;
    return 1;
}

#else /* !HAVE_GPU */

rankmem_status_t rankmem_async_create(const rankmem_async_params_t *params,
                                      rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_create: NULL mr_p");
    rankmem_status_t st = check_params(params);
    if (st != RANKMEM_SUCCESS)
        return st;
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                    "rankmem_async_create: rankmem was built without CUDA");
}

rankmem_status_t rankmem_async_view_create(rankmem_mempool_t pool, rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_view_create: NULL mr_p");
    if (!pool)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_view_create: NULL pool");
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                    "rankmem_async_view_create: rankmem was built without CUDA");
}

rankmem_status_t rankmem_async_pool_handle(rankmem_resource_t *mr, rankmem_mempool_t *pool_p)
{
    if (!mr || !pool_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_pool_handle: NULL %s",
                        mr ? "pool_p" : "resource");
    /* No async resource can exist in this build. */
    return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                    "rankmem_async_pool_handle: resource '%s' is not async or async_view",
                    mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
}

#endif
