/* sam_headroom: system-allocated memory (posix_memalign) that the GPU uses
 * directly where it can reach pageable host memory (HMM, ATS), with a
 * headroom of device memory left free for other CUDA work.
 *
 * Every allocation covers whole pages, so that the preferred-location advice
 * given to one (cudaMemAdvise rounds ranges out to pages) never touches a
 * neighbour. It is advised to prefer the device while
 *
 *     placed + this allocation <= free device memory - headroom
 *
 * where `placed` is the bytes of our live allocations already preferring
 * the device, and to prefer the host otherwise (so that GPU accesses do not
 * pull it into device memory). The rule counts placed memory as not yet
 * resident: advice migrates nothing, pages move only when touched, and until
 * then cudaMemGetInfo does not see them. Once they are resident they are
 * counted twice (in `placed` and in what is no longer free): the rule errs
 * on the side of keeping the headroom, at the cost of placing less on the
 * device than might fit. Each allocation costs a cudaMemGetInfo and a
 * cudaMemAdvise (microseconds): this resource is for large arrays, not for
 * hot small allocations (put a pool over it for those). */
#include "internal.h"
#include "config_internal.h"
#include "ptrmap.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#if HAVE_GPU
#include "gpu_api.h"

#define ON_DEVICE ((uintptr_t)1) /* low bit of a live entry: preferred on the device */

typedef struct rk_sam {
    rankmem_resource_t base;
    size_t headroom;
    size_t page;          /* host page size: the unit of advice */
    pthread_mutex_t lock; /* guards everything below */
    rk_ptrmap_t live;     /* pointer -> page-rounded bytes | ON_DEVICE */
    size_t placed;        /* bytes of live allocations preferred on the device */
    size_t used, used_high, count;
} rk_sam_t;

/* Preferred location: device dev, or the host when dev < 0. */
static cudaError_t set_preferred(void *p, size_t bytes, int dev)
{
#if RK_GPU_MEMLOCATION_ADVISE
    struct cudaMemLocation loc;
    loc.type = dev >= 0 ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost;
    loc.id = dev >= 0 ? dev : 0;
    return cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, loc);
#else
    return cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation,
                         dev >= 0 ? dev : cudaCpuDeviceId);
#endif
}

/* The range goes back to malloc, which may hand it to code that expects no
 * advice on it: take ours off. */
static void unset_preferred(void *p, size_t bytes)
{
#if RK_GPU_MEMLOCATION_ADVISE
    struct cudaMemLocation loc = {cudaMemLocationTypeHost, 0}; /* ignored for unset */
    cudaError_t err = cudaMemAdvise(p, bytes, cudaMemAdviseUnsetPreferredLocation, loc);
#else
    cudaError_t err = cudaMemAdvise(p, bytes, cudaMemAdviseUnsetPreferredLocation, 0);
#endif
    /* Fails only while the runtime unloads at exit: the memory is freed anyway. */
    if (err != cudaSuccess)
        (void)cudaGetLastError();
}

/* Free memory of device dev, whichever device is current. */
static cudaError_t device_free(int dev, size_t *free_p)
{
    int cur = dev;
    size_t total = 0;
    cudaError_t err = cudaGetDevice(&cur);
    if (err == cudaSuccess && cur != dev)
        err = cudaSetDevice(dev);
    if (err != cudaSuccess)
        return err;
    err = cudaMemGetInfo(free_p, &total);
    if (cur != dev) {
        cudaError_t e2 = cudaSetDevice(cur);
        if (err == cudaSuccess)
            err = e2;
    }
    return err;
}

static rankmem_status_t sam_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                     rankmem_stream_t stream, void **ptr_p)
{
    (void)stream;
    rk_sam_t *sm = (rk_sam_t *)mr;
    if (bytes > SIZE_MAX - sm->page)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "sam_headroom: %zu bytes is too large", bytes);
    size_t rounded = rk_align_up(bytes, sm->page);
    void *p = NULL;
    int rc = posix_memalign(&p, alignment > sm->page ? alignment : sm->page, rounded);
    if (rc != 0)
        return rk_error(rc == ENOMEM ? RANKMEM_ERR_OUT_OF_MEMORY : RANKMEM_ERR_INVALID_ARGUMENT,
                        "sam_headroom: posix_memalign(%zu bytes, alignment %zu) failed", rounded,
                        alignment > sm->page ? alignment : sm->page);
    size_t free_bytes = 0;
    cudaError_t err = device_free(mr->device, &free_bytes);
    if (err != cudaSuccess) {
        free(p);
        return rk_cuda_error(err, "sam_headroom: cudaMemGetInfo", 0);
    }

    pthread_mutex_lock(&sm->lock);
    size_t limit = free_bytes > sm->headroom ? free_bytes - sm->headroom : 0;
    int on_device = sm->placed <= limit && rounded <= limit - sm->placed;
    rankmem_status_t st =
        rk_ptrmap_insert(&sm->live, p, (void *)((uintptr_t)rounded | (on_device ? ON_DEVICE : 0)));
    if (st == RANKMEM_SUCCESS) {
        if (on_device)
            sm->placed += rounded;
        sm->used += rounded;
        if (sm->used > sm->used_high)
            sm->used_high = sm->used;
        sm->count++;
    }
    pthread_mutex_unlock(&sm->lock);
    if (st != RANKMEM_SUCCESS) {
        free(p);
        return st;
    }

    err = set_preferred(p, rounded, on_device ? mr->device : -1);
    if (err != cudaSuccess) {
        /* Undo: the allocation never happened. */
        pthread_mutex_lock(&sm->lock);
        rk_ptrmap_remove(&sm->live, p);
        if (on_device)
            sm->placed -= rounded;
        sm->used -= rounded;
        sm->count--;
        pthread_mutex_unlock(&sm->lock);
        free(p);
        char what[96];
        snprintf(what, sizeof what, "sam_headroom: cudaMemAdvise(SetPreferredLocation, %s)",
                 on_device ? "device" : "host");
        return rk_cuda_error(err, what, rounded);
    }
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t sam_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                       size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    (void)stream;
    rk_sam_t *sm = (rk_sam_t *)mr;
    pthread_mutex_lock(&sm->lock);
    size_t slot = rk_ptrmap_find(&sm->live, ptr);
    if (slot == SIZE_MAX) {
        pthread_mutex_unlock(&sm->lock);
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "sam_headroom: %p (%zu bytes) was not allocated here or is already freed",
                        ptr, bytes);
    }
    uintptr_t v = (uintptr_t)sm->live.slots[slot].value;
    size_t rounded = (size_t)(v & ~ON_DEVICE);
    if (bytes > SIZE_MAX - sm->page || rk_align_up(bytes, sm->page) != rounded) {
        pthread_mutex_unlock(&sm->lock);
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "sam_headroom: %p freed with %zu bytes, but it was allocated with %zu "
                        "(page-rounded)",
                        ptr, bytes, rounded);
    }
    rk_ptrmap_remove_at(&sm->live, slot);
    if (v & ON_DEVICE)
        sm->placed -= rounded;
    sm->used -= rounded;
    sm->count--;
    pthread_mutex_unlock(&sm->lock);
    unset_preferred(ptr, rounded);
    free(ptr);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t sam_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    rk_sam_t *sm = (rk_sam_t *)mr;
    size_t v;
    pthread_mutex_lock(&sm->lock);
    switch (what) {
    case RANKMEM_QUERY_USED_CURRENT:
        v = sm->used;
        break;
    case RANKMEM_QUERY_USED_HIGH:
        v = sm->used_high;
        break;
    case RANKMEM_QUERY_LIVE_COUNT:
        v = sm->count;
        break;
    default:
        pthread_mutex_unlock(&sm->lock);
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "sam_headroom: query %d is not supported",
                        (int)what);
    }
    pthread_mutex_unlock(&sm->lock);
    *value_p = v;
    return RANKMEM_SUCCESS;
}

static void reclaim_one(const void *key, void *value, void *arg)
{
    (void)arg;
    size_t rounded = (size_t)((uintptr_t)value & ~ON_DEVICE);
    unset_preferred((void *)key, rounded);
    free((void *)key);
}

static rankmem_status_t sam_finalize(rankmem_resource_t *mr)
{
    rk_sam_t *sm = (rk_sam_t *)mr;
    size_t count = sm->count, used = sm->used;
    if (count)
        rk_ptrmap_each(&sm->live, reclaim_one, NULL);
    rk_ptrmap_fini(&sm->live);
    pthread_mutex_destroy(&sm->lock);
    free(sm);
    if (count)
        return rk_error(RANKMEM_ERR_BUSY,
                        "sam_headroom: released with %zu live allocations (%zu bytes); freed them",
                        count, used);
    return RANKMEM_SUCCESS;
}

static int sam_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    char sz[40];
    rk_format_size(sz, sizeof sz, ((const rk_sam_t *)mr)->headroom);
    return snprintf(buf, len, "sam_headroom(headroom=%s)", sz);
}

static const rankmem_resource_ops_t sam_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "sam_headroom",
    .allocate = sam_allocate,
    .deallocate = sam_deallocate,
    .query = sam_query,
    .finalize = sam_finalize,
    .describe = sam_describe,
};

rankmem_status_t rankmem_sam_headroom_create(size_t headroom, rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_sam_headroom_create: NULL mr_p");
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_sam_headroom_create: no GPU to give system memory to (%s)",
                        rk_gpu_absent_reason());
    int dev = 0, pageable = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err == cudaSuccess)
        err = cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_sam_headroom_create: cudaDeviceGetAttribute", 0);
    if (!pageable)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_sam_headroom_create: device %d cannot access pageable system "
                        "memory (cudaDevAttrPageableMemoryAccess is 0; it needs HMM with the open "
                        "GPU kernel modules, or ATS as on Grace Hopper)",
                        dev);
    long page = sysconf(_SC_PAGESIZE);
    rankmem_resource_t *mr;
    rankmem_status_t st =
        rk_resource_new(sizeof(rk_sam_t), &sam_ops,
                        RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE, NULL, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    rk_sam_t *sm = (rk_sam_t *)mr;
    sm->headroom = headroom;
    sm->page = page > 0 && rk_is_pow2((size_t)page) ? (size_t)page : 4096;
    int rc = pthread_mutex_init(&sm->lock, NULL);
    if (rc != 0) {
        free(sm);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "rankmem_sam_headroom_create: "
                        "pthread_mutex_init failed (error %d)", rc);
    }
    st = rk_ptrmap_init(&sm->live, 64);
    if (st != RANKMEM_SUCCESS) {
        pthread_mutex_destroy(&sm->lock);
        free(sm);
        return st;
    }
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_sam_headroom_device_bytes(rankmem_resource_t *mr, size_t *bytes_p)
{
    if (!mr || !bytes_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_sam_headroom_device_bytes: NULL %s",
                        mr ? "bytes_p" : "resource");
    if (mr->ops != &sam_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_sam_headroom_device_bytes: resource '%s' is not sam_headroom",
                        mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
    rk_sam_t *sm = (rk_sam_t *)mr;
    pthread_mutex_lock(&sm->lock);
    *bytes_p = sm->placed;
    pthread_mutex_unlock(&sm->lock);
    return RANKMEM_SUCCESS;
}

#else /* !HAVE_GPU */

rankmem_status_t rankmem_sam_headroom_create(size_t headroom, rankmem_resource_t **mr_p)
{
    (void)headroom;
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_sam_headroom_create: NULL mr_p");
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                    "rankmem_sam_headroom_create: rankmem was built without CUDA");
}

rankmem_status_t rankmem_sam_headroom_device_bytes(rankmem_resource_t *mr, size_t *bytes_p)
{
    if (!mr || !bytes_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_sam_headroom_device_bytes: NULL %s",
                        mr ? "bytes_p" : "resource");
    /* No sam_headroom resource can exist in this build. */
    return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                    "rankmem_sam_headroom_device_bytes: resource '%s' is not sam_headroom",
                    mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
}

#endif
