/* rankmem: constructors of the built-in resources. Each returns a resource
 * with one reference; rankmem_resource_release() drops it. Device resources
 * record the device current at creation. In a build without CUDA, or on a
 * machine without a GPU, the device constructors fail with
 * RANKMEM_ERR_NOT_SUPPORTED or RANKMEM_ERR_NO_DEVICE. */
#ifndef RANKMEM_RESOURCES_H
#define RANKMEM_RESOURCES_H

#include <stddef.h>
#include <rankmem/export.h>
#include <rankmem/status.h>
#include <rankmem/resource.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Host memory from malloc; ignores streams. Thread-safe. */
RANKMEM_API rankmem_status_t rankmem_system_create(rankmem_resource_t **mr_p);

/* cudaMalloc/cudaFree on the current device (synchronous; streams ignored). */
RANKMEM_API rankmem_status_t rankmem_cuda_create(rankmem_resource_t **mr_p);

/* cudaMallocManaged (cudaMemAttachGlobal); host- and device-accessible. */
RANKMEM_API rankmem_status_t rankmem_managed_create(rankmem_resource_t **mr_p);

/* cudaHostAlloc (portable, mapped); host- and device-accessible. */
RANKMEM_API rankmem_status_t rankmem_pinned_create(rankmem_resource_t **mr_p);

/* Export handle types for a new stream-ordered pool (cudaMemAllocationHandleType). */
#define RANKMEM_HANDLE_NONE 0x0
#define RANKMEM_HANDLE_POSIX_FD 0x1
#define RANKMEM_HANDLE_FABRIC 0x8

typedef struct rankmem_async_params {
    size_t size;              /* sizeof(rankmem_async_params_t) */
    int use_default_pool;     /* nonzero: the device's default pool; the rest is ignored */
    size_t initial_pool_size; /* bytes reserved at creation (allocated and freed once) */
    size_t release_threshold; /* bytes the pool keeps at synchronisation; SIZE_MAX = all */
    int handle_type;          /* RANKMEM_HANDLE_* */
    /* The pool's reuse policies (cudaMemPoolReuse* / hipMemPoolReuse*): -1 keeps the
     * runtime's default, 0 turns it off, 1 on. New pools only. */
    int reuse_follow_event_dependencies; /* reuse memory freed on a stream another waits on */
    int reuse_allow_opportunistic;       /* reuse memory whose free has completed anywhere */
    int reuse_allow_internal_dependencies; /* reuse by inserting stream waits */
} rankmem_async_params_t;

/* Default params: a new pool, no initial size, release threshold SIZE_MAX,
 * no export handle, the runtime's reuse policies (-1). */
RANKMEM_API rankmem_status_t rankmem_async_params_default(rankmem_async_params_t *params_p);

/* cudaMallocAsync / cudaFreeAsync. params NULL: the device's default pool.
 * Queries: RESERVED_CURRENT/HIGH, USED_CURRENT/HIGH; trim keeps keep_bytes. */
RANKMEM_API rankmem_status_t rankmem_async_create(const rankmem_async_params_t *params,
                                                  rankmem_resource_t **mr_p);

/* Same type as cudaMemPool_t. */
typedef struct CUmemPoolHandle_st *rankmem_mempool_t;

/* Wraps an existing cudaMemPool_t that the caller keeps alive and destroys. */
RANKMEM_API rankmem_status_t rankmem_async_view_create(rankmem_mempool_t pool,
                                                       rankmem_resource_t **mr_p);

/* The cudaMemPool_t behind an async or async_view resource. */
RANKMEM_API rankmem_status_t rankmem_async_pool_handle(rankmem_resource_t *mr,
                                                       rankmem_mempool_t *pool_p);

/* ---- sharing a pool and its allocations between processes of one node
 * (src/pool_export.c; rankmem_mpi_share in rankmem_mpi.h does it over MPI) ----
 * The exporter's async resource must own its pool, created with
 * handle_type RANKMEM_HANDLE_POSIX_FD (rankmem_async_params_t). Importers
 * free what they imported (rankmem_async_free_imported) and release the
 * imported resource before the exporter frees the memory: the
 * stream-ordered allocator requires it. */

/* A pool's shareable handle: a file descriptor of the exporting process.
 * It means nothing in another process until passed over a Unix socket
 * (SCM_RIGHTS) or pidfd_getfd; the caller closes it when done. */
typedef struct rankmem_pool_share {
    int handle_type; /* RANKMEM_HANDLE_POSIX_FD */
    int fd;
} rankmem_pool_share_t;

/* One allocation's export data (cudaMemPoolPtrExportData): plain bytes,
 * valid in any process that imported the pool, so it may travel by MPI. */
#define RANKMEM_PTR_EXPORT_BYTES 64
typedef struct rankmem_ptr_export {
    unsigned char bytes[RANKMEM_PTR_EXPORT_BYTES];
} rankmem_ptr_export_t;

/* The pool of an async resource as a file descriptor
 * (cudaMemPoolExportToShareableHandle). RANKMEM_ERR_NOT_SUPPORTED for a
 * pool made without handle_type RANKMEM_HANDLE_POSIX_FD (the default pool
 * included); RANKMEM_ERR_INVALID_ARGUMENT for a resource that is not async. */
RANKMEM_API rankmem_status_t rankmem_async_export_pool(rankmem_resource_t *mr,
                                                       rankmem_pool_share_t *share_p);

/* Export data of ptr, an allocation of mr (cudaMemPoolExportPointer). The
 * importer may touch the memory only once the allocating stream has
 * reached the allocation (synchronise it before passing the data on). */
RANKMEM_API rankmem_status_t rankmem_async_export_pointer(rankmem_resource_t *mr, void *ptr,
                                                          rankmem_ptr_export_t *data_p);

/* An "async_import" resource over the pool another process exported
 * (cudaMemPoolImportFromShareableHandle), made accessible from the current
 * device. share->fd stays the caller's (close it after). It cannot
 * allocate (RANKMEM_ERR_NOT_SUPPORTED); deallocate frees an imported
 * pointer on a stream (cudaFreeAsync); releasing it closes the import. */
RANKMEM_API rankmem_status_t rankmem_async_import_pool(const rankmem_pool_share_t *share,
                                                       rankmem_resource_t **mr_p);

/* The exporter's allocation in this process (cudaMemPoolImportPointer). */
RANKMEM_API rankmem_status_t rankmem_async_import_pointer(rankmem_resource_t *imported,
                                                          const rankmem_ptr_export_t *data,
                                                          void **ptr_p);

/* Frees an imported pointer and waits until that is done (cudaFree), so
 * that the exporter may free the memory once told. */
RANKMEM_API rankmem_status_t rankmem_async_free_imported(rankmem_resource_t *imported,
                                                         void *ptr);

/* User functions. alloc must return memory aligned to alignment (or fail with
 * a status); props says where the memory lives. arg is passed to both. */
typedef rankmem_status_t (*rankmem_alloc_fn)(void *arg, size_t bytes, size_t alignment,
                                             rankmem_stream_t stream, void **ptr_p);
typedef rankmem_status_t (*rankmem_free_fn)(void *arg, void *ptr, size_t bytes, size_t alignment,
                                            rankmem_stream_t stream);
RANKMEM_API rankmem_status_t rankmem_callback_create(rankmem_alloc_fn alloc_fn,
                                                     rankmem_free_fn free_fn, void *arg,
                                                     unsigned props, rankmem_resource_t **mr_p);

/* Coalescing best-fit pool over any upstream. */
typedef struct rankmem_pool_params {
    size_t size;          /* sizeof(rankmem_pool_params_t) */
    size_t initial_size;  /* first chunk taken from upstream; 0 = none until needed */
    size_t maximum_size;  /* total bytes the pool may hold; SIZE_MAX = unbounded */
    size_t growth_size;   /* minimum chunk when growing; 0 = a sixteenth of what is held
                             (2 MiB to 1 GiB), so reserved stays close to peak use */
} rankmem_pool_params_t;

/* Default params: initial 0, maximum SIZE_MAX, growth 0 (geometric). */
RANKMEM_API rankmem_status_t rankmem_pool_params_default(rankmem_pool_params_t *params_p);

/* params NULL = defaults. The pool retains upstream. Thread-safe and
 * stream-ordered: per-stream free lists, events to reuse blocks across
 * streams (device-accessible upstreams only), and a synchronise-and-merge
 * before it grows. */
RANKMEM_API rankmem_status_t rankmem_pool_create(rankmem_resource_t *upstream,
                                                 const rankmem_pool_params_t *params,
                                                 rankmem_resource_t **mr_p);

/* Call before destroying a stream the pool has seen: waits for the stream's
 * work and moves its free blocks to the default stream's list. pool may be
 * any chain: every pool in it forgets the stream. */
RANKMEM_API rankmem_status_t rankmem_pool_forget_stream(rankmem_resource_t *pool,
                                                        rankmem_stream_t stream);

/* ==== issue 10: system memory with GPU headroom, stream-ordered managed pools ====
 * (src/sam_headroom.c, src/async_managed.c; docs/resources-sam-managed.md) */

/* sam_headroom: host memory from the C library (posix_memalign) used by the
 * GPU directly, on systems where cudaDevAttrPageableMemoryAccess is 1 (HMM
 * with the open kernel driver on x86, ATS on Grace Hopper). Each allocation
 * covers whole pages and gets a preferred location: the device recorded at
 * creation while the device bytes this resource has placed there, plus this
 * allocation, stay within the device's free memory minus `headroom`; the
 * host otherwise. Host- and device-accessible; streams are ignored;
 * thread-safe. Creation fails with RANKMEM_ERR_NOT_SUPPORTED where the GPU
 * cannot access pageable memory, where there is no GPU, and in a build
 * without CUDA. Queries: USED_CURRENT/HIGH, LIVE_COUNT. */
RANKMEM_API rankmem_status_t rankmem_sam_headroom_create(size_t headroom,
                                                         rankmem_resource_t **mr_p);

/* Bytes of live allocations of a sam_headroom resource whose preferred
 * location is the device (page-rounded). */
RANKMEM_API rankmem_status_t rankmem_sam_headroom_device_bytes(rankmem_resource_t *mr,
                                                               size_t *bytes_p);

/* Preferred location of a managed pool's memory. */
#define RANKMEM_MANAGED_PREFER_DEVICE 0 /* the device current at creation */
#define RANKMEM_MANAGED_PREFER_HOST 1
#define RANKMEM_MANAGED_PREFER_NONE 2 /* no preference: pages follow their users */

typedef struct rankmem_async_managed_params {
    size_t size;              /* sizeof(rankmem_async_managed_params_t) */
    size_t initial_pool_size; /* bytes reserved at creation (allocated and freed once) */
    size_t release_threshold; /* bytes the pool keeps at synchronisation; SIZE_MAX = all */
    int preferred_location;   /* RANKMEM_MANAGED_PREFER_* */
} rankmem_async_managed_params_t;

/* Default params: no initial size, release threshold SIZE_MAX, preferred
 * location the device. */
RANKMEM_API rankmem_status_t
rankmem_async_managed_params_default(rankmem_async_managed_params_t *params_p);

/* async_managed: managed memory (host- and device-accessible) from a new
 * stream-ordered pool of allocation type managed (cudaMemPoolCreate,
 * cudaMallocFromPoolAsync, cudaFreeAsync); needs CUDA 13 (toolkit and
 * driver) and a device with concurrent managed access, else
 * RANKMEM_ERR_NOT_SUPPORTED. params NULL = defaults. Like any stream-ordered
 * memory, the host may touch it once the allocating stream has reached the
 * allocation. Queries as async: RESERVED_CURRENT/HIGH, USED_CURRENT/HIGH;
 * trim keeps keep_bytes. rankmem_async_pool_handle() does not apply: use
 * rankmem_async_managed_pool_handle(). */
RANKMEM_API rankmem_status_t
rankmem_async_managed_create(const rankmem_async_managed_params_t *params,
                             rankmem_resource_t **mr_p);

/* The cudaMemPool_t behind an async_managed resource (owned by it). */
RANKMEM_API rankmem_status_t rankmem_async_managed_pool_handle(rankmem_resource_t *mr,
                                                               rankmem_mempool_t *pool_p);

#ifdef __cplusplus
}
#endif
#endif
