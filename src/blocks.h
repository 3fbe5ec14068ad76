/* blocks: the machinery that the sharded, stream-ordered suballocators
 * (pool, caching, vmm) share (internal).
 *
 *  - shards: RK_NSHARDS per resource, each 128-byte aligned with its own
 *    lock, stream lists, live map and descriptors (x86 cores fetch lines in
 *    aligned pairs, so shards one line apart still coupled the threads of
 *    neighbouring slots). A thread works in the
 *    shard of its thread slot (its own while there are no more threads than
 *    shards). A resource's shard type begins with rk_shard_t; the array is
 *    walked with the resource's stride.
 *  - the shard lock is biased to the thread that first allocates in the
 *    shard (bias.h): that thread, usually the only one, enters with plain
 *    loads and stores; any other thread still gets a correct lock.
 *  - descriptors: host-side records of device blocks (device memory has no
 *    room for headers), from slabs; a spare descriptor is linked through its
 *    first word.
 *  - stream lists: one per stream that freed memory in the shard; the
 *    resource's list type begins with rk_slist_t. The list used last is a
 *    hint: consecutive calls mostly name one stream.
 *  - the live map: pointer -> descriptor of every block handed out by the
 *    shard, with the used/live counters. */
#ifndef RANKMEM_BLOCKS_H
#define RANKMEM_BLOCKS_H

#include "internal.h"
#include "bias.h"
#include "ptrmap.h"

#include <stdint.h>

#define RK_NSHARDS 32 /* a power of two */
/* Shards' alignment: an aligned pair of cache lines (the adjacent-line
 * prefetcher moves both), so no two threads' shards share one. */
#define RK_SHARD_APART 128

/* The head of every stream's free list. */
typedef struct rk_slist {
    rankmem_stream_t stream;
    void *event; /* recorded on stream when another stream takes its memory */
} rk_slist_t;

typedef struct rk_slab {
    struct rk_slab *next;
} rk_slab_t;

typedef struct rk_shard {
    rk_block_t lock;
    int mode; /* how the holder entered: rk_block_unlock's argument */
    rk_slist_t **lists;
    size_t nlists, cap_lists;
    rk_slist_t *hint; /* the list used last */
    rk_ptrmap_t live_map;
    void *spare; /* spare descriptors, linked through their first word */
    rk_slab_t *slabs;
    size_t used, used_high, live;
} __attribute__((aligned(RK_SHARD_APART))) rk_shard_t;

/* ---- shards ---- */

/* RK_NSHARDS zeroed shards of `stride` bytes (the size of a type that
 * begins with rk_shard_t, so a multiple of RK_SHARD_APART), locks ready. */
RK_HIDDEN rankmem_status_t rk_shards_new(size_t stride, void **shards_p);
/* Frees their lists (and events), descriptors and live maps, then the array
 * (NULL is fine). Device memory is the caller's business. */
RK_HIDDEN void rk_shards_free(void *shards, size_t stride);

static inline rk_shard_t *rk_shard_at(void *shards, size_t stride, unsigned i)
{
    return (rk_shard_t *)((char *)shards + (size_t)i * stride);
}

/* The calling thread's slot + 1 (0: none yet). initial-exec: a plain
 * %fs-relative load, not a __tls_get_addr call per request. */
extern __thread unsigned rk_thread_slot __attribute__((tls_model("initial-exec"))) RK_HIDDEN;
RK_HIDDEN unsigned rk_thread_slot_assign(void);

/* Index of the calling thread's shard. */
static inline unsigned rk_shard_index(void)
{
    unsigned s = rk_thread_slot;
    if (RK_UNLIKELY(s == 0))
        s = rk_thread_slot_assign();
    return (s - 1) & (RK_NSHARDS - 1);
}

static inline void rk_shard_lock(rk_shard_t *sh)
{
    int mode = rk_block_lock(&sh->lock);
    sh->mode = mode; /* read back by the holder only */
}

static inline void rk_shard_unlock(rk_shard_t *sh)
{
    rk_block_unlock(&sh->lock, sh->mode);
}

/* The calling thread's own shard, locked: the first thread that comes
 * through the real lock of a shard nobody claimed takes the bias. */
static inline void rk_shard_lock_own(rk_shard_t *sh)
{
    rk_shard_lock(sh);
    if (RK_UNLIKELY(!sh->mode) &&
        RK_UNLIKELY(__atomic_load_n(&sh->lock.owner, __ATOMIC_RELAXED) == NULL))
        rk_block_rebind(&sh->lock, 1); /* we hold v */
}

/* Every shard, in index order (and back in reverse). */
RK_HIDDEN void rk_shards_lock_all(void *shards, size_t stride);
RK_HIDDEN void rk_shards_unlock_all(void *shards, size_t stride);

/* ---- descriptors ---- */

RK_HIDDEN void *rk_desc_refill(rk_shard_t *sh, size_t size);

/* A descriptor of `size` bytes (its contents undefined), or NULL without
 * host memory. Descriptors may move between shards: every slab is freed
 * with the shards, whichever spare chain holds it. */
static inline void *rk_desc_new(rk_shard_t *sh, size_t size)
{
    void *d = sh->spare;
    if (RK_UNLIKELY(d == NULL))
        return rk_desc_refill(sh, size);
    sh->spare = *(void **)d;
    return d;
}

static inline void rk_desc_free(rk_shard_t *sh, void *d)
{
    *(void **)d = sh->spare;
    sh->spare = d;
}

/* ---- stream lists ---- */

/* The list of stream in sh: created zeroed with `create_size` bytes (the
 * resource's list type) when missing, or NULL when create_size is 0 or
 * there is no host memory. */
RK_HIDDEN rk_slist_t *rk_list_find(rk_shard_t *sh, rankmem_stream_t stream, size_t create_size);

static inline rk_slist_t *rk_list_for(rk_shard_t *sh, rankmem_stream_t stream,
                                      size_t create_size)
{
    rk_slist_t *h = sh->hint;
    if (RK_LIKELY(h != NULL && h->stream == stream))
        return h;
    return rk_list_find(sh, stream, create_size);
}

/* Drop list l of sh (its event destroyed, its blocks the caller's business). */
RK_HIDDEN void rk_list_drop(rk_shard_t *sh, rk_slist_t *l);
/* Drop every list of sh. */
RK_HIDDEN void rk_lists_clear(rk_shard_t *sh);

/* ---- the live map ---- */

static inline rankmem_status_t rk_shard_ready(rk_shard_t *sh)
{
    if (RK_LIKELY(sh->live_map.slots != NULL))
        return RANKMEM_SUCCESS;
    return rk_ptrmap_init(&sh->live_map, 256);
}

/* Slot of ptr in sh's live map, or SIZE_MAX. */
static inline size_t rk_live_find(const rk_shard_t *sh, const void *ptr)
{
    return sh->live_map.slots ? rk_ptrmap_find(&sh->live_map, ptr) : SIZE_MAX;
}

/* Record desc (for ptr, of bytes the user asked for) as live in sh (ready). */
static inline rankmem_status_t rk_live_add(rk_shard_t *sh, const void *ptr, void *desc,
                                           size_t bytes)
{
    rankmem_status_t st = rk_ptrmap_insert(&sh->live_map, ptr, desc);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        return st;
    sh->live++;
    sh->used += bytes;
    if (sh->used > sh->used_high)
        sh->used_high = sh->used;
    return RANKMEM_SUCCESS;
}

static inline void rk_live_drop(rk_shard_t *sh, size_t slot, size_t bytes)
{
    rk_ptrmap_remove_at(&sh->live_map, slot);
    sh->live--;
    sh->used -= bytes;
}

/* The shard other than `skip` whose live map has ptr, locked, with *slot_p
 * its slot; NULL when none has it. */
RK_HIDDEN rk_shard_t *rk_shards_find_live(void *shards, size_t stride, const rk_shard_t *skip,
                                          const void *ptr, size_t *slot_p);

/* The same, the calling thread's shard `mine` first (mostly the thread that
 * allocated frees), unless mine_seen: the caller looked there already. */
static inline rk_shard_t *rk_shard_find_live(void *shards, size_t stride, rk_shard_t *mine,
                                             int mine_seen, const void *ptr, size_t *slot_p)
{
    if (!mine_seen) {
        rk_shard_lock(mine);
        size_t slot = rk_live_find(mine, ptr);
        if (RK_LIKELY(slot != SIZE_MAX)) {
            *slot_p = slot;
            return mine;
        }
        rk_shard_unlock(mine);
    }
    return rk_shards_find_live(shards, stride, mine, ptr, slot_p);
}

/* Sums over the shards (each locked in turn); for RANKMEM_QUERY_USED_HIGH,
 * with several threads, the sum of their peaks: an upper bound. */
RK_HIDDEN size_t rk_shards_sum(void *shards, size_t stride, rankmem_query_t what);
/* Live blocks and their bytes over every shard (no lock: finalize). */
RK_HIDDEN size_t rk_shards_live(void *shards, size_t stride, size_t *bytes_p);

#endif
