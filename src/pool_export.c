/* Sharing a stream-ordered pool and single allocations between processes
 * of one node: export the pool as a file descriptor and allocations as 64
 * bytes of export data; import both on the other side as an
 * "async_import" resource. Passing the descriptor between processes is the
 * caller's (mpi/node_share.c does it for MPI ranks). */
#include "internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Answers shared by both builds, so that bad input reads the same with or
 * without a GPU. */
static rankmem_status_t check_share(const rankmem_pool_share_t *share, const char *fn)
{
    if (share->handle_type != RANKMEM_HANDLE_POSIX_FD)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "%s: handle type 0x%x; only RANKMEM_HANDLE_POSIX_FD (0x%x) is supported",
                        fn, share->handle_type, RANKMEM_HANDLE_POSIX_FD);
    if (share->fd < 0)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: file descriptor %d", fn, share->fd);
    return RANKMEM_SUCCESS;
}

#if HAVE_GPU
#include "gpu_api.h"

typedef struct rk_import {
    rankmem_resource_t base;
    cudaMemPool_t pool;
} rk_import_t;

static const rankmem_resource_ops_t import_ops;

static rankmem_status_t import_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                        rankmem_stream_t stream, void **ptr_p)
{
    (void)mr, (void)alignment, (void)stream, (void)ptr_p;
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                    "async_import: an imported pool cannot allocate (%zu bytes asked); allocate "
                    "in the exporting process and import the pointer",
                    bytes);
}

static rankmem_status_t import_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                          size_t alignment, rankmem_stream_t stream)
{
    (void)mr, (void)alignment;
    cudaError_t err = cudaFreeAsync(ptr, (cudaStream_t)stream);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "async_import: cudaFreeAsync", bytes);
    return RANKMEM_SUCCESS;
}

static int import_is_equal(const rankmem_resource_t *a, const rankmem_resource_t *b)
{
    return a->ops == &import_ops && b->ops == &import_ops &&
           ((const rk_import_t *)a)->pool == ((const rk_import_t *)b)->pool;
}

static rankmem_status_t import_finalize(rankmem_resource_t *mr)
{
    cudaError_t err = cudaMemPoolDestroy(((rk_import_t *)mr)->pool);
    free(mr);
    /* At process exit the runtime may already be gone: nothing left to close. */
    if (err == cudaErrorCudartUnloading) {
        (void)cudaGetLastError();
        err = cudaSuccess;
    }
    if (err != cudaSuccess)
        return rk_cuda_error(err, "async_import: cudaMemPoolDestroy", 0);
    return RANKMEM_SUCCESS;
}

static int import_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    (void)mr;
    return snprintf(buf, len, "async_import");
}

static const rankmem_resource_ops_t import_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "async_import",
    .allocate = import_allocate,
    .deallocate = import_deallocate,
    .is_equal = import_is_equal,
    .finalize = import_finalize,
    .describe = import_describe,
};

rankmem_status_t rankmem_async_export_pool(rankmem_resource_t *mr, rankmem_pool_share_t *share_p)
{
    if (!mr || !share_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_export_pool: NULL %s",
                        mr ? "share_p" : "resource");
    void *pool;
    int types;
    if (!rk_async_pool_of(mr, &pool, &types))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_export_pool: resource '%s' is not async or async_view",
                        mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
    if (types >= 0 && !(types & RANKMEM_HANDLE_POSIX_FD))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_async_export_pool: the pool was made without an export handle "
                        "type; create the async resource with params.handle_type = "
                        "RANKMEM_HANDLE_POSIX_FD (spec: async(export=posix_fd))");
    int fd = -1;
    cudaError_t err = cudaMemPoolExportToShareableHandle(
        &fd, (cudaMemPool_t)pool, cudaMemHandleTypePosixFileDescriptor, 0);
    if (err == cudaErrorInvalidValue && types < 0) {
        /* An async_view over a pool made without the handle type. */
        (void)cudaGetLastError();
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_async_export_pool: the viewed pool cannot be exported as a file "
                        "descriptor (create it with cudaMemHandleTypePosixFileDescriptor)");
    }
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_export_pool: cudaMemPoolExportToShareableHandle",
                             0);
    share_p->handle_type = RANKMEM_HANDLE_POSIX_FD;
    share_p->fd = fd;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_async_export_pointer(rankmem_resource_t *mr, void *ptr,
                                              rankmem_ptr_export_t *data_p)
{
    if (!mr || !ptr || !data_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_export_pointer: NULL %s",
                        !mr ? "resource" : !ptr ? "ptr" : "data_p");
    void *pool;
    int types;
    if (!rk_async_pool_of(mr, &pool, &types))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_async_export_pointer: resource '%s' is not async or async_view",
                        mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
    if (types >= 0 && !(types & RANKMEM_HANDLE_POSIX_FD))
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "rankmem_async_export_pointer: the pool was made without an export handle "
                        "type; create the async resource with params.handle_type = "
                        "RANKMEM_HANDLE_POSIX_FD");
    struct cudaMemPoolPtrExportData d;
    _Static_assert(sizeof d == RANKMEM_PTR_EXPORT_BYTES, "export data is 64 bytes");
    cudaError_t err = cudaMemPoolExportPointer(&d, ptr);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_export_pointer: cudaMemPoolExportPointer", 0);
    memcpy(data_p->bytes, &d, sizeof d);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_async_import_pool(const rankmem_pool_share_t *share,
                                           rankmem_resource_t **mr_p)
{
    if (!share || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_import_pool: NULL %s",
                        share ? "mr_p" : "share");
    rankmem_status_t st = check_share(share, "rankmem_async_import_pool");
    if (st != RANKMEM_SUCCESS)
        return st;
    if (rk_gpu_count() == 0)
        return rk_error(RANKMEM_ERR_NO_DEVICE, "rankmem_async_import_pool: no GPU (%s)",
                        rk_gpu_absent_reason());
    cudaMemPool_t pool = NULL;
    cudaError_t err = cudaMemPoolImportFromShareableHandle(
        &pool, (void *)(uintptr_t)share->fd, cudaMemHandleTypePosixFileDescriptor, 0);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_import_pool: cudaMemPoolImportFromShareableHandle",
                             0);
    /* An imported pool is accessible from its own device only: open it to
     * the current one too (another GPU of the node, with peer access). */
    int dev = 0;
    err = cudaGetDevice(&dev);
    const char *what = "rankmem_async_import_pool: cudaGetDevice";
    if (err == cudaSuccess) {
        struct cudaMemLocation loc = {0};
        loc.type = cudaMemLocationTypeDevice;
        loc.id = dev;
        enum cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
        what = "rankmem_async_import_pool: cudaMemPoolGetAccess";
        err = cudaMemPoolGetAccess(&flags, pool, &loc);
        if (err == cudaSuccess && flags != cudaMemAccessFlagsProtReadWrite) {
            struct cudaMemAccessDesc desc = {0};
            desc.location = loc;
            desc.flags = cudaMemAccessFlagsProtReadWrite;
            what = "rankmem_async_import_pool: cudaMemPoolSetAccess (the pool is on another "
                   "device; peer access needed)";
            err = cudaMemPoolSetAccess(pool, &desc, 1);
        }
    }
    rankmem_resource_t *mr = NULL;
    if (err == cudaSuccess) {
        st = rk_resource_new(sizeof(rk_import_t), &import_ops,
                             RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_STREAM_ORDERED, NULL,
                             &mr);
    } else {
        st = rk_cuda_error(err, what, 0);
    }
    if (st != RANKMEM_SUCCESS) {
        (void)cudaMemPoolDestroy(pool);
        (void)cudaGetLastError();
        return st;
    }
    ((rk_import_t *)mr)->pool = pool;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t check_imported(rankmem_resource_t *imported, const char *fn)
{
    if (imported->ops != &import_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: resource '%s' is not async_import (rankmem_async_import_pool makes one)",
                        fn, imported->ops && imported->ops->name ? imported->ops->name : "unnamed");
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_async_import_pointer(rankmem_resource_t *imported,
                                              const rankmem_ptr_export_t *data, void **ptr_p)
{
    if (!imported || !data || !ptr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_import_pointer: NULL %s",
                        !imported ? "resource" : !data ? "data" : "ptr_p");
    rankmem_status_t st = check_imported(imported, "rankmem_async_import_pointer");
    if (st != RANKMEM_SUCCESS)
        return st;
    struct cudaMemPoolPtrExportData d;
    memcpy(&d, data->bytes, sizeof d);
    void *p = NULL;
    cudaError_t err = cudaMemPoolImportPointer(&p, ((rk_import_t *)imported)->pool, &d);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_import_pointer: cudaMemPoolImportPointer", 0);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_async_free_imported(rankmem_resource_t *imported, void *ptr)
{
    if (!imported || !ptr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_free_imported: NULL %s",
                        imported ? "ptr" : "resource");
    rankmem_status_t st = check_imported(imported, "rankmem_async_free_imported");
    if (st != RANKMEM_SUCCESS)
        return st;
    /* cudaFree waits for the device: the free is complete on return, which
     * is what the exporter's later free needs. */
    cudaError_t err = cudaFree(ptr);
    if (err != cudaSuccess)
        return rk_cuda_error(err, "rankmem_async_free_imported: cudaFree", 0);
    return RANKMEM_SUCCESS;
}

#else /* !HAVE_GPU */

/* No async resource and no pool can exist in this build: the same argument
 * checks, then "not supported". */

static rankmem_status_t no_gpu(const char *fn)
{
    return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "%s: rankmem was built without CUDA or HIP", fn);
}

rankmem_status_t rankmem_async_export_pool(rankmem_resource_t *mr, rankmem_pool_share_t *share_p)
{
    if (!mr || !share_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_export_pool: NULL %s",
                        mr ? "share_p" : "resource");
    return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                    "rankmem_async_export_pool: resource '%s' is not async or async_view",
                    mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
}

rankmem_status_t rankmem_async_export_pointer(rankmem_resource_t *mr, void *ptr,
                                              rankmem_ptr_export_t *data_p)
{
    if (!mr || !ptr || !data_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_export_pointer: NULL %s",
                        !mr ? "resource" : !ptr ? "ptr" : "data_p");
    return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                    "rankmem_async_export_pointer: resource '%s' is not async or async_view",
                    mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
}

rankmem_status_t rankmem_async_import_pool(const rankmem_pool_share_t *share,
                                           rankmem_resource_t **mr_p)
{
    if (!share || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_import_pool: NULL %s",
                        share ? "mr_p" : "share");
    rankmem_status_t st = check_share(share, "rankmem_async_import_pool");
    if (st != RANKMEM_SUCCESS)
        return st;
    return no_gpu("rankmem_async_import_pool");
}

static rankmem_status_t not_imported(rankmem_resource_t *mr, const char *fn)
{
    return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                    "%s: resource '%s' is not async_import (rankmem_async_import_pool makes one)",
                    fn, mr->ops && mr->ops->name ? mr->ops->name : "unnamed");
}

rankmem_status_t rankmem_async_import_pointer(rankmem_resource_t *imported,
                                              const rankmem_ptr_export_t *data, void **ptr_p)
{
    if (!imported || !data || !ptr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_import_pointer: NULL %s",
                        !imported ? "resource" : !data ? "data" : "ptr_p");
    return not_imported(imported, "rankmem_async_import_pointer");
}

rankmem_status_t rankmem_async_free_imported(rankmem_resource_t *imported, void *ptr)
{
    if (!imported || !ptr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_async_free_imported: NULL %s",
                        imported ? "ptr" : "resource");
    return not_imported(imported, "rankmem_async_free_imported");
}

#endif
