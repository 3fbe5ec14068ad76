/* librankmem_omp internals, shared between the files of omp/. Never installed.
 *
 * The library is runtime-agnostic: it is built once with $(CC) and serves
 * programs linked with libgomp (GCC) or LLVM's libomp. It therefore never
 * includes <omp.h>; the OpenMP ABI it needs (handles are uintptr_t-sized,
 * trait keys and values are the numbers fixed by the OpenMP specification)
 * is spelled out here. Everything declared here is hidden. */
#ifndef RANKMEM_OMP_INTERNAL_H
#define RANKMEM_OMP_INTERNAL_H

#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <rankmem.h>
#include "../src/internal.h" /* rk_deallocate_checked (inline) */

#define RKOMP_HIDDEN __attribute__((visibility("hidden")))
#define RKOMP_EXPORT __attribute__((visibility("default")))
#define RKOMP_LIKELY(x) __builtin_expect(!!(x), 1)
#define RKOMP_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- the OpenMP ABI (identical in libgomp's and libomp's omp.h) ---- */

typedef uintptr_t rkomp_handle_t; /* omp_allocator_handle_t, omp_memspace_handle_t */

typedef struct rkomp_trait {
    int key; /* omp_alloctrait_key_t: an enum, int-sized in both runtimes */
    uintptr_t value;
} rkomp_trait_t;

#define RKOMP_NULL_ALLOCATOR ((rkomp_handle_t)0)
#define RKOMP_DEFAULT_MEM_ALLOC ((rkomp_handle_t)1)

enum {
    RKOMP_ATK_SYNC_HINT = 1,
    RKOMP_ATK_ALIGNMENT = 2,
    RKOMP_ATK_ACCESS = 3,
    RKOMP_ATK_POOL_SIZE = 4,
    RKOMP_ATK_FALLBACK = 5,
    RKOMP_ATK_FB_DATA = 6,
    RKOMP_ATK_PINNED = 7,
    RKOMP_ATK_PARTITION = 8
};

#define RKOMP_ATV_DEFAULT ((uintptr_t)-1)
enum {
    RKOMP_ATV_FALSE = 0,
    RKOMP_ATV_TRUE = 1,
    RKOMP_ATV_CONTENDED = 3,
    RKOMP_ATV_UNCONTENDED = 4,
    RKOMP_ATV_SERIALIZED = 5,
    RKOMP_ATV_PRIVATE = 6,
    RKOMP_ATV_ALL = 7,
    RKOMP_ATV_THREAD = 8,
    RKOMP_ATV_PTEAM = 9,
    RKOMP_ATV_CGROUP = 10,
    RKOMP_ATV_DEFAULT_MEM_FB = 11,
    RKOMP_ATV_NULL_FB = 12,
    RKOMP_ATV_ABORT_FB = 13,
    RKOMP_ATV_ALLOCATOR_FB = 14,
    RKOMP_ATV_ENVIRONMENT = 15,
    RKOMP_ATV_NEAREST = 16,
    RKOMP_ATV_BLOCKED = 17,
    RKOMP_ATV_INTERLEAVED = 18
};

/* ---- memory spaces and allocator objects (memspace.c) ----
 *
 * Handle encoding. Every handle of ours is the address of an object inside
 * this library's own static storage, plus tag bits:
 *   memory space:  &rkomp_spaces[i] | 1
 *   allocator:     &rkomp_slots[i] | (generation mod 64) << 1 | 1
 * The objects are 128-byte aligned, so bits 0..6 are free for the tag.
 * No runtime handle can look like one: libgomp's and libomp's predefined
 * handles are small integers, their user allocators are pointers to their
 * own heap structs (even), and heap pointers never point into our .bss.
 * Deciding "ours" is a bit test and one range compare, with no dereference
 * of a foreign value. The generation catches a stale handle (used after
 * omp_destroy_allocator) unless the slot was reused 64 times since. */

enum rkomp_space_kind {
    RKOMP_SPACE_DEVICE = 0,
    RKOMP_SPACE_MANAGED = 1,
    RKOMP_SPACE_PINNED = 2,
    RKOMP_SPACE_COUNT = 3,
    RKOMP_SPACE_FOREIGN = 3 /* a runtime allocator wrapped for an allocator_fb of ours */
};

#define RKOMP_SLOT_ALIGN 128u
#define RKOMP_GEN_MASK 63u
#define RKOMP_MAX_ALLOCATORS 8192u /* live at once, predefined included */
#define RKOMP_NPREDEFINED 3u       /* slots 0..2: device, managed, pinned */

enum { RKOMP_STATE_FREE = 0, RKOMP_STATE_LIVE = 1, RKOMP_STATE_DYING = 2 };

typedef struct rkomp_allocator {
    unsigned state; /* atomic: RKOMP_STATE_* */
    unsigned gen;   /* bumped at each destroy */
    int space;      /* enum rkomp_space_kind */
    int fallback;   /* RKOMP_ATV_*_FB */
    rkomp_handle_t fb_data;
    /* Which allocator fb_data was when this one was made: an allocator of
     * ours, its slot's full generation; a runtime allocator made through us,
     * its registry serial; a runtime predefined one, 0. A target destroyed
     * since (its handle reused or not) no longer matches. */
    uint64_t fb_tag;
    size_t alignment;          /* alignment trait (1 = none) */
    size_t pool_size;          /* 0 = none */
    rankmem_resource_t *chain; /* own chain (one reference), or NULL: the space's resource */
    int ent;                   /* the chain's resource entry (blockmap.c), or -1 */
    rkomp_handle_t foreign;    /* RKOMP_SPACE_FOREIGN: the runtime's allocator */
    unsigned sync_hint, access, pinned, partition; /* as given (for the record) */
    unsigned next_free; /* free-slot queue link (index), under the slot lock */
} rkomp_allocator_t;

typedef union rkomp_slot {
    rkomp_allocator_t a;
    char pad[RKOMP_SLOT_ALIGN];
} __attribute__((aligned(RKOMP_SLOT_ALIGN))) rkomp_slot_t;
_Static_assert(sizeof(rkomp_allocator_t) <= RKOMP_SLOT_ALIGN, "an allocator fills one slot");

typedef union rkomp_space_obj {
    int kind;
    char pad[RKOMP_SLOT_ALIGN];
} __attribute__((aligned(RKOMP_SLOT_ALIGN))) rkomp_space_obj_t;

RKOMP_HIDDEN extern rkomp_slot_t rkomp_slots[RKOMP_MAX_ALLOCATORS];
RKOMP_HIDDEN extern rkomp_space_obj_t rkomp_spaces[RKOMP_SPACE_COUNT];

/* Whether h is in our allocator range (live or not). */
static inline int rkomp_in_range(rkomp_handle_t h)
{
    return (h & 1u) && (h & ~(uintptr_t)(RKOMP_SLOT_ALIGN - 1)) - (uintptr_t)rkomp_slots <
                           sizeof rkomp_slots;
}

/* The live allocator behind h, or NULL (foreign, stale or never created). */
static inline rkomp_allocator_t *rkomp_lookup(rkomp_handle_t h)
{
    if (!rkomp_in_range(h))
        return NULL;
    rkomp_allocator_t *a =
        &((rkomp_slot_t *)(h & ~(uintptr_t)(RKOMP_SLOT_ALIGN - 1)))->a;
    if (__atomic_load_n(&a->state, __ATOMIC_ACQUIRE) != RKOMP_STATE_LIVE ||
        (a->gen & RKOMP_GEN_MASK) != ((h >> 1) & RKOMP_GEN_MASK))
        return NULL;
    return a;
}

/* The predefined device allocator's handle (slot 0, generation 0 for ever). */
#define RKOMP_DEVICE_HANDLE ((uintptr_t)&rkomp_slots[0] + 1u)

static inline rkomp_handle_t rkomp_handle_of(const rkomp_allocator_t *a)
{
    return (uintptr_t)a | ((uintptr_t)(a->gen & RKOMP_GEN_MASK) << 1) | 1u;
}

/* Kind of one of our memory spaces, or -1 when h is not one. */
static inline int rkomp_space_of(rkomp_handle_t h)
{
    for (int i = 0; i < RKOMP_SPACE_COUNT; i++)
        if (h == ((uintptr_t)&rkomp_spaces[i] | 1u))
            return i;
    return -1;
}

/* A free slot, state still FREE, or NULL when all are in use. */
RKOMP_HIDDEN rkomp_allocator_t *rkomp_slot_get(void);
/* Give a slot back (after its state left LIVE): generation bumped, queued. */
RKOMP_HIDDEN void rkomp_slot_put(rkomp_allocator_t *a);

/* The resource a space serves from, borrowed: the current device's resource,
 * or the shared managed / pinned instance (host memory without a GPU). */
RKOMP_HIDDEN rankmem_status_t rkomp_space_resource(int space, rankmem_resource_t **mr_p);
/* The device space's resource and the device it belongs to (0 with no GPU).
 * With at most one visible device, no CUDA call (below, after rkomp_gpu_count). */
/* The shared managed / pinned resource (made on first use, kept for the
 * life of the process), or NULL when it cannot be made. */
RKOMP_HIDDEN rankmem_resource_t *rkomp_shared_resource(int space);
/* Visible GPUs (rankmem_device_count), cached: read on every call. */
RKOMP_HIDDEN extern int rkomp_ngpu; /* -1 until known */
RKOMP_HIDDEN int rkomp_gpu_count_slow(void);
static inline int rkomp_gpu_count(void)
{
    int v = __atomic_load_n(&rkomp_ngpu, __ATOMIC_RELAXED);
    return RKOMP_LIKELY(v >= 0) ? v : rkomp_gpu_count_slow();
}

static inline rankmem_status_t rkomp_device_resource(rankmem_resource_t **mr_p, int *device_p)
{
    int d = 0;
    /* With one visible device (or none: the host slot) it is device 0 and
     * current: skip cudaGetDevice, which is on every omp_alloc otherwise. */
    if (RKOMP_UNLIKELY(rkomp_gpu_count() > 1))
        rankmem_current_device(&d);
    *device_p = d;
    return rankmem_get_device_resource(d, mr_p);
}

/* ---- the runtime's own functions (runtime.c) ---- */

typedef struct rkomp_runtime {
    void *(*alloc)(size_t, rkomp_handle_t);
    void *(*aligned_alloc)(size_t, size_t, rkomp_handle_t);
    void *(*calloc)(size_t, size_t, rkomp_handle_t);
    void *(*aligned_calloc)(size_t, size_t, size_t, rkomp_handle_t);
    void *(*realloc)(void *, size_t, rkomp_handle_t, rkomp_handle_t);
    void (*free)(void *, rkomp_handle_t);
    rkomp_handle_t (*init_allocator)(rkomp_handle_t, int, const rkomp_trait_t *);
    void (*destroy_allocator)(rkomp_handle_t);
    void (*set_default_allocator)(rkomp_handle_t);
    rkomp_handle_t (*get_default_allocator)(void);
    void *(*gomp_alloc)(size_t, size_t, rkomp_handle_t);
    void (*gomp_free)(void *, rkomp_handle_t);
    void *(*kmpc_alloc)(int, size_t, rkomp_handle_t);
    void *(*kmpc_aligned_alloc)(int, size_t, size_t, rkomp_handle_t);
    void *(*kmpc_calloc)(int, size_t, size_t, rkomp_handle_t);
    void *(*kmpc_realloc)(int, void *, size_t, rkomp_handle_t, rkomp_handle_t);
    void (*kmpc_free)(int, void *, rkomp_handle_t);
} rkomp_runtime_t;

/* Resolved once (thread-safe), on first use or at load. Members the runtime
 * lacks are NULL. Inline: every call the runtime keeps goes through it. */
RKOMP_HIDDEN extern rkomp_runtime_t rkomp_rt_table;
RKOMP_HIDDEN extern int rkomp_rt_ready; /* atomic: rkomp_rt_table is filled in */
RKOMP_HIDDEN const rkomp_runtime_t *rkomp_rt_slow(void);
static inline const rkomp_runtime_t *rkomp_rt(void)
{
    if (RKOMP_UNLIKELY(!__atomic_load_n(&rkomp_rt_ready, __ATOMIC_ACQUIRE)))
        return rkomp_rt_slow();
    return &rkomp_rt_table;
}

/* The calling thread's default allocator (def-allocator-var): the runtime's
 * ICV, which holds our handles too; without a runtime, a thread-local. */
RKOMP_HIDDEN rkomp_handle_t rkomp_get_default(void);
RKOMP_HIDDEN void rkomp_set_default(rkomp_handle_t h);

/* ---- fallback targets (traits.c) ---- */

/* Whether h is one of the runtime's predefined allocators that this runtime
 * defines (omp_default_mem_alloc ... omp_thread_mem_alloc; libomp's
 * llvm_omp_target_*_mem_alloc). */
RKOMP_HIDDEN int rkomp_runtime_predefined(rkomp_handle_t h);
/* A fallback through the runtime's allocator h (not predefined): served
 * only while h is the registered allocator with that serial, and never
 * while it is being destroyed; else NULL. */
RKOMP_HIDDEN void *rkomp_foreign_fb_alloc(rkomp_handle_t h, uint64_t serial, size_t alignment,
                                          size_t size, int zero);
/* omp_aligned_alloc / omp_aligned_calloc(1 element) of the runtime. */
RKOMP_HIDDEN void *rkomp_runtime_alloc(rkomp_handle_t h, size_t alignment, size_t size, int zero);

/* Our own omp_alloc under a hidden name (alloc.c): &omp_alloc inside this
 * library goes through the GOT and may name the runtime's. */
RKOMP_HIDDEN void *rkomp_self_omp_alloc(size_t size, rkomp_handle_t allocator);

/* Nonzero when the program's omp_alloc is ours (link order or LD_PRELOAD). */
RKOMP_HIDDEN int rkomp_interposed(void);

/* RANKMEM_OMP_FREE_SYNC (default on): wait for the device before device
 * memory freed by omp_free goes back to its resource. */
RKOMP_HIDDEN extern int rkomp_free_sync_v;
static inline int rkomp_free_sync(void)
{
    if (RKOMP_UNLIKELY(!__atomic_load_n(&rkomp_rt_ready, __ATOMIC_ACQUIRE)))
        rkomp_rt();
    return rkomp_free_sync_v;
}
/* RANKMEM_OMP_DEFER_BYTES (default 256 MiB; 0: no deferral), and the test
 * switch (see runtime.c): read with the rest at start-up. */
RKOMP_HIDDEN size_t rkomp_defer_bytes(void);
RKOMP_HIDDEN int rkomp_test_defer(void);

/* ---- live blocks: pointer -> block, and the resources they keep (blockmap.c) ---- */

#define RKOMP_NENT 32        /* resources counted by entry at once; more: a reference per block */
#define RKOMP_MAX_DEVICES 64 /* devices whose current resource gets an entry */
#define RKOMP_ENT_NONE (-1)  /* the block's resource lives as long as the process: nothing held */
#define RKOMP_ENT_OWN (-2)   /* the block holds a reference of its own */

/* A block of ours, as the map's callers see it (the map keeps it packed in
 * 32 bytes: blockmap.c). */
typedef struct rkomp_block {
    void *ptr;                /* NULL = empty slot */
    rankmem_resource_t *mr;   /* kept alive for the block's life (see ent) */
    size_t bytes;
    size_t alignment;         /* what rankmem_allocate got (a power of two, at least RANKMEM_DEFAULT_ALIGNMENT) */
    rkomp_handle_t allocator; /* the handle it was allocated through (one of our allocators) */
    void *base;               /* over-allocated for its alignment: what rankmem gave, else NULL */
    size_t base_bytes;        /* and its size (its alignment is RANKMEM_DEFAULT_ALIGNMENT) */
    int ent;                  /* resource entry counting it, or RKOMP_ENT_NONE / _OWN */
} rkomp_block_t;

/* Record b. An entry-counted block (b->ent >= 0, from rkomp_ent_pin or
 * rkomp_device_ent) is counted in its entry when the entry is still ACTIVE
 * for b->mr (checked under the map's lock); otherwise b->ent becomes
 * RKOMP_ENT_OWN and 1 is returned (the caller must take the block's own
 * reference). 0: recorded; -1: not (no memory for the map, or an offset
 * from an over-allocated base too large to record). */
RKOMP_HIDDEN int rkomp_map_insert(rkomp_block_t *b);
/* 1 and *b_p filled when ptr is ours; else 0. */
RKOMP_HIDDEN int rkomp_map_get(const void *ptr, rkomp_block_t *b_p);
RKOMP_HIDDEN void rkomp_map_forget(const void *ptr);
/* omp_free of ptr (not NULL, past rkomp_map_maybe or rkomp_own_grain): 0
 * when it is not ours. Else its block is out of the map and either given
 * back now (rkomp_give_back) or, for device-accessible memory with
 * deferral on, put on the freeing thread's pending list, to be given back
 * after a device sync that began after this call (docs/openmp.md,
 * "Deferred release"). */
RKOMP_HIDDEN int rkomp_map_free(const void *ptr);
/* rkomp_map_free, then, for a pointer that is not ours after all,
 * rkomp_free_forward: what omp_free and GOMP_free jump to. */
RKOMP_HIDDEN void rkomp_map_free_or_pass(void *ptr, rkomp_handle_t allocator, int gomp);
/* Pass a free on to the runtime's omp_free (gomp: its GOMP_free, when it
 * has one), with our handles turned into omp_null_allocator (alloc.c). */
RKOMP_HIDDEN void rkomp_free_forward(void *ptr, rkomp_handle_t allocator, int gomp);
/* Give back every pending block (of resource mr only, unless NULL) after
 * one sync of each device concerned. Returns how many went back; *err_p
 * (may be NULL) is set to 1 when a device sync failed (they went back
 * anyway). */
RKOMP_HIDDEN size_t rkomp_map_flush(const rankmem_resource_t *mr, int *err_p);
/* Whether omp_free may defer (decided at the first call: needs the GPU count). */
RKOMP_HIDDEN int rkomp_defer_on(void);
/* Zero when ptr cannot be ours: no block of ours was ever inserted in its
 * 1 GiB region or in its 2 MiB grain (each hashed to one bit of a sticky,
 * read-mostly filter, written by rkomp_map_insert). Lets omp_free of the
 * runtime's blocks skip the maps with two loads, inline. */
#define RKOMP_GRAIN_WORDS 64u /* 4096 bits: a pool's worth of grains leaves most clear */
typedef struct rkomp_filter {
    uint64_t regions;                                          /* atomic */
    uint64_t grains[RKOMP_GRAIN_WORDS] __attribute__((aligned(64))); /* atomic */
} __attribute__((aligned(64))) rkomp_filter_t;
RKOMP_HIDDEN extern rkomp_filter_t rkomp_filter;

static inline uint64_t rkomp_region_bit(const void *p)
{
    return (uint64_t)1 << ((((uint64_t)(uintptr_t)p >> 30) * 0x9e3779b97f4a7c15ull) >> 58);
}

/* The global filter's grain word and bit: 12 bits of the 2 MiB grain's hash. */
static inline uint64_t *rkomp_grain_word(const void *p, uint64_t *bit_p)
{
    uint64_t h = ((uint64_t)(uintptr_t)p >> 21) * 0x9e3779b97f4a7c15ull;
    *bit_p = (uint64_t)1 << ((h >> 52) & 63);
    return &rkomp_filter.grains[h >> 58];
}

/* The 2 MiB grain of the calling thread's latest insert into its map, or 0
 * (no block lies below 2 MiB): its filter bits are set, never cleared. */
RKOMP_HIDDEN extern __thread uintptr_t rkomp_last_grain __attribute__((tls_model("initial-exec")));
static inline int rkomp_own_grain(const void *ptr)
{
    return ((uintptr_t)ptr >> 21) == rkomp_last_grain;
}

static inline int rkomp_map_maybe(const void *ptr)
{
    uint64_t gbit, *gw = rkomp_grain_word(ptr, &gbit);
    return (__atomic_load_n(&rkomp_filter.regions, __ATOMIC_ACQUIRE) & rkomp_region_bit(ptr)) &&
           (__atomic_load_n(gw, __ATOMIC_ACQUIRE) & gbit);
}

/* A new ACTIVE entry for mr (an allocator's own chain), holding one
 * reference of its own, or -1 when all RKOMP_NENT are in use. */
RKOMP_HIDDEN int rkomp_ent_create(rankmem_resource_t *mr);
/* No longer in service: the reference goes once the entry's blocks are gone. */
RKOMP_HIDDEN void rkomp_ent_retire(int ent);

enum { RKOMP_ENT_FREE = 0, RKOMP_ENT_ACTIVE = 1, RKOMP_ENT_RETIRED = 2 };

typedef struct rkomp_entry {
    unsigned state;          /* atomic: RKOMP_ENT_* */
    rankmem_resource_t *mr;  /* atomic; the layer's reference while not FREE */
    int device;              /* atomic; the device whose current resource it is, or -1 */
    long remaining;          /* atomic; after the harvest: its blocks still live */
} __attribute__((aligned(64))) rkomp_entry_t;

RKOMP_HIDDEN extern rkomp_entry_t rkomp_ents[RKOMP_NENT];
RKOMP_HIDDEN extern int rkomp_dev_ent[RKOMP_MAX_DEVICES]; /* atomic; entry + 1, 0 = none */

/* Whether entry e is ACTIVE for mr: a hint, which rkomp_map_insert checks
 * again under the map's lock. */
static inline int rkomp_ent_pin(int e, const rankmem_resource_t *mr)
{
    if (e < 0)
        return 0;
    const rkomp_entry_t *en = &rkomp_ents[e];
    return __atomic_load_n(&en->state, __ATOMIC_ACQUIRE) == RKOMP_ENT_ACTIVE &&
           __atomic_load_n(&en->mr, __ATOMIC_RELAXED) == mr;
}

/* The entry of device's current resource mr (made, and the previous one
 * retired, when mr changed), or RKOMP_ENT_OWN. */
RKOMP_HIDDEN int rkomp_device_ent_slow(int device, rankmem_resource_t *mr);
static inline int rkomp_device_ent(int device, rankmem_resource_t *mr)
{
    if (RKOMP_LIKELY(device >= 0 && device < RKOMP_MAX_DEVICES)) {
        int e = __atomic_load_n(&rkomp_dev_ent[device], __ATOMIC_ACQUIRE) - 1;
        if (RKOMP_LIKELY(rkomp_ent_pin(e, mr)))
            return e;
    }
    return rkomp_device_ent_slow(device, mr);
}
/* Retire entry ent when it is a device's entry and that device's current
 * resource is no longer ent's. Safe at any time (rechecked under the entry
 * lock), so the first free after a replacement calls it (retire_replaced). */
RKOMP_HIDDEN void rkomp_device_ent_check(int ent);

/* ---- giving back (alloc.c, called by blockmap.c) ---- */

/* rankmem_deallocate of b, on b's device. immediate: an omp_free that was
 * not deferred, which first waits for the device when RANKMEM_OMP_FREE_SYNC
 * says so; 0: a pending block whose wait was a sync epoch. Touches nothing
 * of b's resource after rankmem_deallocate returns. */
RKOMP_HIDDEN void rkomp_give_back(const rkomp_block_t *b, int immediate);
/* Reports a failed rankmem_deallocate of b (st) on stderr. */
RKOMP_HIDDEN void rkomp_give_back_failed(const rkomp_block_t *b, rankmem_status_t st);
/* What goes back to b's resource: what rankmem handed out (the base an
 * over-aligned block was cut from, with the default alignment). */
static inline rankmem_block_t rkomp_returned(const rkomp_block_t *b)
{
    return b->base ? (rankmem_block_t){b->base, b->base_bytes, RANKMEM_DEFAULT_ALIGNMENT}
                   : (rankmem_block_t){b->ptr, b->bytes, b->alignment};
}
/* Reports that failed of n blocks could not go back to mr (st) on stderr. */
RKOMP_HIDDEN void rkomp_give_back_many_failed(const rankmem_resource_t *mr, size_t n,
                                              size_t failed, rankmem_status_t st);
/* cudaDeviceSynchronize on device dev (made current for it): 0, or -1 when
 * it failed. Without a GPU (the test switch) a no-op. */
RKOMP_HIDDEN int rkomp_sync_device(int dev);

/* ---- serving (alloc.c) ---- */

/* Allocate through one of our live allocators, fallback included. */
RKOMP_HIDDEN void *rkomp_alloc_ours(rkomp_allocator_t *a, size_t alignment, size_t size,
                                    int zero, int depth);
/* What rkomp_alloc_ours does once a first attempt failed: give back what
 * waits for a device sync, try again, then the allocator's fallback. */
RKOMP_HIDDEN void *rkomp_alloc_failed(rkomp_allocator_t *a, size_t alignment, size_t size,
                                      int zero, int depth);
/* b was allocated but rkomp_map_insert returned ins (1 or -1): b->ptr when
 * the block could still be kept, else NULL with the block given back. */
RKOMP_HIDDEN void *rkomp_serve_tail(rkomp_block_t *b, int ins);
/* omp_alloc(size > 0) through the predefined device allocator, alignment at
 * most RANKMEM_DEFAULT_ALIGNMENT, not zeroed (blockmap.c). */
RKOMP_HIDDEN void *rkomp_dev_alloc(size_t size);

#endif
