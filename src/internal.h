/* rankmem internals shared between the library's files. Never installed.
 * Everything declared here has hidden visibility (the library is built with
 * -fvisibility=hidden; only RANKMEM_API symbols are exported). */
#ifndef RANKMEM_INTERNAL_H
#define RANKMEM_INTERNAL_H

#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <rankmem.h>

#define RK_HIDDEN __attribute__((visibility("hidden")))
#define RK_LIKELY(x) __builtin_expect(!!(x), 1)
#define RK_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define RK_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* Record the calling thread's detailed error and return status, so that a
 * failure path reads: return rk_error(RANKMEM_ERR_..., "pool: %zu bytes ...", n); */
RK_HIDDEN rankmem_status_t rk_error(rankmem_status_t status, const char *fmt, ...) RK_PRINTF(2, 3);

/* Round up to a multiple of a power of two. Caller guarantees no overflow. */
static inline size_t rk_align_up(size_t n, size_t a) { return (n + a - 1) & ~(a - 1); }
static inline int rk_is_pow2(size_t n) { return n && !(n & (n - 1)); }

/* Optional ops may be missing from a table written against an older header. */
#define RK_HAS_OP(mr, field)                                                                    \
    ((mr)->ops->size >= offsetof(rankmem_resource_ops_t, field) + sizeof((mr)->ops->field) &&   \
     (mr)->ops->field)

/* Blocks per deallocate_many call (the operation's bound; the public call
 * cuts longer arrays). */
#define RK_BATCH 256u
/* rankmem_allocate / rankmem_deallocate_async for a caller that already
 * checked what the public calls check (mr and ptr not NULL, bytes > 0,
 * alignment a power of two, at least RANKMEM_DEFAULT_ALIGNMENT to
 * allocate): straight to the resource, without the exported calls on the
 * way (the OpenMP layer's hot path; the dispatcher's own tail). */
static inline rankmem_status_t rk_allocate_checked(rankmem_resource_t *mr, size_t bytes,
                                                   size_t alignment, void **ptr_p)
{
    if (RK_UNLIKELY(alignment > RANKMEM_MAX_ALIGNMENT || bytes > SIZE_MAX / 2 - alignment))
        return rankmem_allocate(mr, bytes, alignment, ptr_p); /* which reports it */
    return mr->ops->allocate(mr, bytes, alignment, NULL, ptr_p);
}

static inline rankmem_status_t rk_deallocate_checked(rankmem_resource_t *mr, void *ptr,
                                                     size_t bytes, size_t alignment,
                                                     rankmem_stream_t stream)
{
    if (alignment < RANKMEM_DEFAULT_ALIGNMENT)
        alignment = RANKMEM_DEFAULT_ALIGNMENT;
    return mr->ops->deallocate(mr, ptr, bytes, alignment, stream);
}
/* n <= RK_BATCH checked blocks back to mr: its deallocate_many, or its
 * deallocate for each; status[i] is block i's result, the return value the
 * first failure's. For adaptors passing a batch upstream, and the OpenMP
 * layer's pending lists. */
static inline rankmem_status_t rk_deallocate_many(rankmem_resource_t *mr,
                                                  const rankmem_block_t *blocks, size_t n,
                                                  rankmem_stream_t stream,
                                                  rankmem_status_t *status)
{
    if (RK_HAS_OP(mr, deallocate_many))
        return mr->ops->deallocate_many(mr, blocks, n, stream, status);
    rankmem_status_t first = RANKMEM_SUCCESS;
    for (size_t i = 0; i < n; i++) {
        status[i] = rk_deallocate_checked(mr, blocks[i].ptr, blocks[i].bytes, blocks[i].alignment,
                                          stream);
        if (status[i] != RANKMEM_SUCCESS && first == RANKMEM_SUCCESS)
            first = status[i];
    }
    return first;
}
/* Allocate and fill the header of a built-in resource of struct size
 * struct_size (zeroed). On failure nothing is left allocated. */
RK_HIDDEN rankmem_status_t rk_resource_new(size_t struct_size, const rankmem_resource_ops_t *ops,
                                           unsigned props, rankmem_resource_t *upstream,
                                           rankmem_resource_t **mr_p);

/* ---- GPU runtime (gpu_runtime.c). All of these work, as "no GPU", in a build
 * without CUDA or HIP and on a machine where the runtime fails to initialise. ---- */

/* Number of usable devices, detected once; 0 when there is no GPU (any
 * cudaGetDeviceCount failure counts as none). */
RK_HIDDEN int rk_gpu_count(void);
/* Current device, or RANKMEM_DEVICE_HOST when there is no GPU. */
RK_HIDDEN int rk_gpu_current(void);
/* Why there is no GPU ("" when there is one). */
RK_HIDDEN const char *rk_gpu_absent_reason(void);

/* Make `waiter` wait for all work submitted to `from` so far: records *event_p
 * (created on first use, timing disabled) on `from`, then cudaStreamWaitEvent.
 * No-op without a GPU. */
RK_HIDDEN rankmem_status_t rk_gpu_stream_wait(rankmem_stream_t waiter, rankmem_stream_t from,
                                              void **event_p);
/* Block the host until `stream`'s work is done. No-op without a GPU. */
RK_HIDDEN rankmem_status_t rk_gpu_stream_sync(rankmem_stream_t stream);
/* Destroy an event made by rk_gpu_stream_wait (NULL is fine). */
RK_HIDDEN void rk_gpu_event_destroy(void *event);

/* Create the device resources (cuda.c, async.c, managed.c, pinned.c) report
 * errors through these. cuda_err is a cudaError_t. */
RK_HIDDEN rankmem_status_t rk_cuda_error(int cuda_err, const char *what, size_t bytes);

/* For share.c (async.c, GPU builds): 1 and the pool (a cudaMemPool_t) and
 * its export handle types (RANKMEM_HANDLE_*; -1 when unknown, for an
 * async_view) when mr is an async or async_view resource; 0 otherwise. */
RK_HIDDEN int rk_async_pool_of(const rankmem_resource_t *mr, void **pool_p, int *handle_types_p);

/* Stream-ordered pools (async.c, GPU builds), shared with async_managed.c;
 * pool is a cudaMemPool_t, name prefixes error messages. */
RK_HIDDEN rankmem_status_t rk_mempool_query(void *pool, const char *name, rankmem_query_t what,
                                            size_t *value_p);
RK_HIDDEN rankmem_status_t rk_mempool_trim(void *pool, const char *name, size_t keep_bytes);
/* A new pool's release threshold (SIZE_MAX: keep all) and initial
 * reservation (0: none); on failure the pool is destroyed. */
RK_HIDDEN rankmem_status_t rk_mempool_setup(void *pool, const char *fn, size_t release_threshold,
                                            size_t initial_size);

/* The process-wide host resource (system), created once; borrowed pointer. */
RK_HIDDEN rankmem_resource_t *rk_host_resource(void);

#endif
