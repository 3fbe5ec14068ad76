/* rankmem: suballocators for particular workloads. Each is a resource over
 * any upstream (which it retains), thread-safe and stream-ordered like the
 * pool: memory freed on a stream is reused on that stream at once, and on
 * other streams only after their order is established (an event, or a
 * synchronisation). Constructors return a resource with one reference. */
#ifndef RANKMEM_SUBALLOCATORS_H
#define RANKMEM_SUBALLOCATORS_H

#include <stddef.h>
#include <stdio.h>
#include <rankmem/export.h>
#include <rankmem/status.h>
#include <rankmem/resource.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- fixed: blocks of one size, preallocated in batches ---- */

/* block_size: rounded up to 256; blocks_per_batch: blocks taken from the
 * upstream at once (and at creation), 0 = enough for 2 MiB. Requests larger
 * than block_size: RANKMEM_ERR_INVALID_ARGUMENT with a clear message. */
RANKMEM_API rankmem_status_t rankmem_fixed_create(rankmem_resource_t *upstream, size_t block_size,
                                                  size_t blocks_per_batch,
                                                  rankmem_resource_t **mr_p);

/* ---- binning: size ranges, each served by its own resource ---- */

/* Fixed-size bins of 2^min_exp .. 2^max_exp bytes (min_exp >= 8); requests
 * above the largest bin go to the upstream. */
RANKMEM_API rankmem_status_t rankmem_binning_create(rankmem_resource_t *upstream, int min_exp,
                                                    int max_exp, rankmem_resource_t **mr_p);
/* Add (or replace) the bin that serves requests up to max_bytes with bin_mr
 * (retained); bin_mr NULL: a fixed resource of max_bytes over the upstream. */
RANKMEM_API rankmem_status_t rankmem_binning_add_bin(rankmem_resource_t *mr, size_t max_bytes,
                                                     rankmem_resource_t *bin_mr);

/* ---- caching: CUB's CachingDeviceAllocator scheme ---- */

typedef struct rankmem_caching_params {
    size_t size;             /* sizeof(rankmem_caching_params_t) */
    unsigned growth;         /* bin growth factor (default 8) */
    unsigned min_bin;        /* smallest bin: growth^min_bin bytes (default 3) */
    unsigned max_bin;        /* largest bin: growth^max_bin bytes (default 7); larger: not cached */
    size_t max_cached_bytes; /* cap on cached (free) bytes; SIZE_MAX = none (default 6 MiB as CUB) */
} rankmem_caching_params_t;

RANKMEM_API rankmem_status_t rankmem_caching_params_default(rankmem_caching_params_t *params_p);
RANKMEM_API rankmem_status_t rankmem_caching_create(rankmem_resource_t *upstream,
                                                    const rankmem_caching_params_t *params,
                                                    rankmem_resource_t **mr_p);
/* Give every cached block back to the upstream. */
RANKMEM_API rankmem_status_t rankmem_caching_free_all(rankmem_resource_t *mr);

/* ---- arena: a global arena, per-thread and per-stream arenas ---- */

typedef struct rankmem_arena_params {
    size_t size;            /* sizeof(rankmem_arena_params_t) */
    size_t arena_size;      /* bytes of the global arena; 0 = half of the device's free memory
                               (of physical host memory over a host upstream) */
    size_t superblock_size; /* what moves from the global arena at a time; 0 = 4 MiB */
    int dump_on_failure;    /* nonzero: write the arena's state to stderr when allocate fails */
} rankmem_arena_params_t;

RANKMEM_API rankmem_status_t rankmem_arena_params_default(rankmem_arena_params_t *params_p);
RANKMEM_API rankmem_status_t rankmem_arena_create(rankmem_resource_t *upstream,
                                                  const rankmem_arena_params_t *params,
                                                  rankmem_resource_t **mr_p);
/* The arena's state (global arena, each arena's superblocks and free blocks). */
RANKMEM_API rankmem_status_t rankmem_arena_dump(rankmem_resource_t *mr, FILE *out);
/* Before destroying a stream the arenas in mr's chain have seen: waits for
 * the stream, then no arena waits for it again. */
RANKMEM_API rankmem_status_t rankmem_arena_forget_stream(rankmem_resource_t *mr,
                                                         rankmem_stream_t stream);

#ifdef __cplusplus
}
#endif
#endif
