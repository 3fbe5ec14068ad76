/* The pure parts of serving (mpi/observe/intercept.c, RANKMEM_INTERCEPT=cuda): the
 * map of the blocks served to the program (pointer -> size) and the decision
 * whether one cudaMalloc is served or goes to CUDA. No CUDA and no MPI here,
 * so that both are unit-tested on the CPU (tests/observe_unit/).
 *
 * Not installed; every symbol hidden. */
#ifndef RANKMEM_MPI_INTERCEPT_MAP_H
#define RANKMEM_MPI_INTERCEPT_MAP_H

#include <stddef.h>
#include <stdint.h>

#ifndef RK_MPI_HIDDEN
#define RK_MPI_HIDDEN __attribute__((visibility("hidden")))
#endif

/* ---- the map of served blocks ----
 *
 * The plugin cannot use librankmem's pointer map (hidden in librankmem.so),
 * and the program's cudaFree of a pointer we did not serve must cost next to
 * nothing: a map of its own, sharded by the pointer's hash, each shard an
 * open-addressed table under a spinlock held for a few probes (no call
 * inside it but a rare malloc when a shard grows). Keys are the served
 * pointers (at least 256-aligned): 0 is an empty slot, 1 a deleted one.
 * Zero-initialised static storage is a valid empty map. */

#define RK_SMAP_SHARDS 64

typedef struct rk_smap_entry {
    uintptr_t key;
    size_t bytes;
} rk_smap_entry_t;

typedef struct rk_smap_shard {
    _Alignas(64) int lock;   /* 0 free, 1 held (atomic); one cache line per shard */
    size_t cap;              /* slots, a power of two (0: no table yet) */
    size_t used, deleted;    /* live keys, tombstones */
    rk_smap_entry_t *slots;
} rk_smap_shard_t;

typedef struct rk_smap {
    rk_smap_shard_t shard[RK_SMAP_SHARDS];
    size_t live;             /* atomic: all shards' keys, for the fast "nothing served" test */
} rk_smap_t;

/* ptr -> bytes. 0; -1 when a shard cannot grow (out of host memory: the
 * caller gives the block back); -2 for a key that is 0, 1 or present. */
RK_MPI_HIDDEN int rk_smap_insert(rk_smap_t *m, uintptr_t ptr, size_t bytes);
/* Removes ptr: 1 with its size in *bytes_p (may be NULL), 0 when absent. */
RK_MPI_HIDDEN int rk_smap_remove(rk_smap_t *m, uintptr_t ptr, size_t *bytes_p);
/* 1 with the size in *bytes_p (may be NULL) when ptr is present, else 0. */
RK_MPI_HIDDEN int rk_smap_find(rk_smap_t *m, uintptr_t ptr, size_t *bytes_p);
/* Live keys (a relaxed read: exact when no thread is changing the map). */
RK_MPI_HIDDEN size_t rk_smap_count(const rk_smap_t *m);
/* Frees the tables; the map is empty (and usable) again. */
RK_MPI_HIDDEN void rk_smap_clear(rk_smap_t *m);

/* ---- the decision ---- */

/* Why a cudaMalloc/cudaMallocAsync goes to CUDA, or RK_ICPT_SERVE. In the
 * order they are tested: the cheap ones first, the current device (a CUDA
 * call) last. */
typedef enum {
    RK_ICPT_SERVE = 0,
    RK_ICPT_FWD_OFF,          /* RANKMEM_INTERCEPT=none */
    RK_ICPT_FWD_INACTIVE,     /* before MPI_Init's end or after MPI_Finalize's start */
    RK_ICPT_FWD_INTERNAL,     /* rankmem's own allocation (rk_obs_internal_depth > 0) */
    RK_ICPT_FWD_OURS,         /* called from librankmem*.so (its cuda resource) */
    RK_ICPT_FWD_BAD_ARGS,     /* devPtr NULL or size 0: CUDA's own answer */
    RK_ICPT_FWD_NO_RESOURCE,  /* the rank has no device resource (no GPU) */
    RK_ICPT_FWD_OTHER_DEVICE, /* the current device is not the rank's */
    RK_ICPT_NREASONS
} rk_icpt_route_t;

typedef struct rk_icpt_ctx {
    int mode_cuda;            /* RANKMEM_INTERCEPT=cuda */
    int active;               /* the plugin is between init and finalize */
    int internal_depth;       /* rk_obs_internal_depth of the calling thread */
    int caller_is_rankmem;    /* the return address is in librankmem*.so */
    int args_ok;              /* devPtr != NULL and size > 0 */
    int rank_device;          /* rankmem_mpi_device(), -1 none */
    int have_resource;        /* rankmem_mpi_resource() != NULL */
    /* The current device, asked only when everything else says serve
     * (-1: unknown, which forwards). */
    int (*current_device)(void *arg);
    void *arg;
} rk_icpt_ctx_t;

RK_MPI_HIDDEN rk_icpt_route_t rk_icpt_route(const rk_icpt_ctx_t *c);
/* "RANKMEM_INTERCEPT=none", ... for messages and tests ("?" out of range). */
RK_MPI_HIDDEN const char *rk_icpt_route_name(int route);

#endif
