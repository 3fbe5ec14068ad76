/* A pool (src/pool.c) whose memory comes from a backing that maps address
 * ranges in granules, instead of from an upstream resource: the vmm
 * resource's engine. Never installed; hidden symbols.
 *
 * The pool keeps its whole suballocation engine (shards, stream lists, size
 * classes, coalescing best fit); only growth, trim and the bookkeeping of
 * what it holds change:
 *  - growing asks the backing for `need` bytes (it rounds up to granules)
 *    and never synchronises;
 *  - before growing past a budget of the peak live bytes, and at trim, the
 *    pool gives back the granule-aligned interiors of its free blocks
 *    (locks every shard, waits for the streams that hold free memory):
 *    virtual space is plentiful, physical granules are what counts;
 *  - "held" (RESERVED_* queries) is the mapped bytes.
 * Every backing call happens under the pool's growth lock, so the backing
 * need not be thread-safe. */
#ifndef RANKMEM_POOL_BACKED_H
#define RANKMEM_POOL_BACKED_H

#include "internal.h"

typedef struct rk_pool_backing {
    /* Map at least bytes; *size_p: what was mapped (a multiple of granule). */
    rankmem_status_t (*grow)(void *ctx, size_t bytes, char **ptr_p, size_t *size_p);
    /* Give back [ptr, ptr + bytes): granule-aligned, mapped, wholly free. */
    rankmem_status_t (*shrink)(void *ctx, char *ptr, size_t bytes);
    /* Optional: narrow [*ptr_p, + *bytes_p) (granule-aligned) to what
     * shrink can take (whole physical handles), and of those to the first
     * ones that make at least `want` bytes (all if fewer); 0 when nothing. */
    int (*fit)(void *ctx, char **ptr_p, size_t *bytes_p, size_t want);
    size_t granule; /* a power of two, at least 256 */
    /* Free mapped bytes kept when giving back at growth. */
    size_t release;
} rk_pool_backing_t;

/* A backed pool; *ops and ctx must outlive it (they belong to the caller,
 * which releases the pool before tearing the backing down). props: the
 * memory's properties (RANKMEM_PROP_*); device: where it lives. */
RK_HIDDEN rankmem_status_t rk_pool_create_backed(const rk_pool_backing_t *ops, void *ctx,
                                                 unsigned props, int device,
                                                 rankmem_resource_t **mr_p);

/* The pool's allocate and deallocate, called directly (the vmm's zones):
 * one indirect call fewer on the pair. */
RK_HIDDEN rankmem_status_t rk_pool_allocate(rankmem_resource_t *pool, size_t bytes,
                                            size_t alignment, rankmem_stream_t stream,
                                            void **ptr_p);
RK_HIDDEN rankmem_status_t rk_pool_deallocate(rankmem_resource_t *pool, void *ptr, size_t bytes,
                                              size_t alignment, rankmem_stream_t stream);

/* Whether ptr is a live block of the pool allocated with `bytes` bytes. */
RK_HIDDEN int rk_pool_is_live(rankmem_resource_t *pool, const void *ptr, size_t bytes);

/* The live block of the pool that holds ptr (its start or any byte
 * inside): 1 with its start and the bytes asked for, else 0. Walks every
 * live block: for export, not for hot paths. */
RK_HIDDEN int rk_pool_live_block(rankmem_resource_t *pool, const void *ptr, char **start_p,
                                 size_t *req_p);

/* Counters of a backed pool: times it gave memory back, bytes given back. */
RK_HIDDEN void rk_pool_backed_counters(rankmem_resource_t *pool, size_t *give_backs_p,
                                       size_t *given_bytes_p, size_t *live_high_p);

#endif
