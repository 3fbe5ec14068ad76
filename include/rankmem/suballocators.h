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

/* ---- vmm: a pool over the GPU's virtual memory API (docs/vmm.md) ----
 * A leaf resource: it reserves one large virtual range on the device
 * current at creation, maps physical granules into it on demand
 * (cuMemCreate/cuMemMap, hipMemCreate/hipMemMap), places blocks by the
 * pool's coalescing best fit over that range, and gives wholly free
 * granules back before growing past its budget (the peak of live bytes
 * plus a sixty-fourth, or plus `release`) and at trim. Growing never costs a
 * cudaMalloc nor a synchronisation; giving back may synchronise the streams
 * whose free lists hold the granules. Thread-safe and stream-ordered like
 * the pool. RESERVED_* queries answer mapped bytes. */

#define RANKMEM_VMM_BACKEND_DEVICE 0 /* the GPU runtime's (CUDA driver or HIP) */
/* Host memory through mmap of a memfd, granule by granule: the same
 * mapping logic without a GPU, for tests and benchmarks. */
#define RANKMEM_VMM_BACKEND_HOST 1

typedef struct rankmem_vmm_params {
    size_t size;    /* sizeof(rankmem_vmm_params_t) */
    size_t reserve; /* virtual bytes reserved; 0 = twice the device's memory (host: 64 GiB) */
    size_t maximum; /* mapped bytes at most; SIZE_MAX = none (the device's memory bounds it) */
    size_t release; /* free mapped bytes kept when giving back at growth (default 0) */
    size_t granule; /* 0 = the device's recommended granularity (host: 2 MiB); else a
                       multiple of it (host: a power of two, at least 4 KiB) */
    int backend;    /* RANKMEM_VMM_BACKEND_* */
    size_t handle;  /* largest physical allocation. 0: on a GPU, a 64th of what is mapped
                       (a power of two of granules, at most 256 MiB), so the driver calls
                       stay few as the pool grows; host backend: one granule. A multiple
                       of the granule: growths are mapped in handles of up to that size.
                       Handles go back only whole; export describes whole handles */
} rankmem_vmm_params_t;

/* Default params: reserve 0 (automatic), maximum SIZE_MAX, release 0,
 * granule 0 (the device's), backend DEVICE, handle 0 (automatic). */
RANKMEM_API rankmem_status_t rankmem_vmm_params_default(rankmem_vmm_params_t *params_p);

/* params NULL = defaults. Backend DEVICE without a GPU: RANKMEM_ERR_NO_DEVICE
 * (as the cuda resource); where the runtime or device lacks the virtual
 * memory API: RANKMEM_ERR_NOT_SUPPORTED. */
RANKMEM_API rankmem_status_t rankmem_vmm_create(const rankmem_vmm_params_t *params,
                                                rankmem_resource_t **mr_p);

typedef struct rankmem_vmm_stats {
    size_t size;        /* sizeof(rankmem_vmm_stats_t), set by the caller */
    size_t granule;     /* bytes of one granule */
    size_t reserved;    /* virtual bytes reserved */
    size_t mapped;      /* bytes mapped now */
    size_t mapped_high; /* high-water mark of the above */
    size_t live_high;   /* the peak of live bytes the budget follows */
    size_t granules_mapped;   /* granules mapped so far (each a create + map) */
    size_t granules_released; /* granules unmapped and released so far */
    size_t give_backs;        /* times free granules were given back */
    size_t handles_created;   /* physical allocations made (cuMemCreate calls) */
} rankmem_vmm_stats_t;

/* The counters of the vmm resource of mr's chain (mr may be e.g. stats>vmm). */
RANKMEM_API rankmem_status_t rankmem_vmm_get_stats(rankmem_resource_t *mr,
                                                   rankmem_vmm_stats_t *stats_p);

/* Host backend only, for tests of the failure paths: the nth map call from
 * now (1 = the next) and the count - 1 after it fail as a device out of
 * memory would; nth 0 disarms. RANKMEM_ERR_NOT_SUPPORTED on other backends. */
RANKMEM_API rankmem_status_t rankmem_vmm_inject_map_failure(rankmem_resource_t *mr, size_t nth,
                                                            size_t count);

/* The virtual range reserved by the vmm of mr's chain: every block it
 * serves lies in [*base_p, *base_p + *bytes_p). A cheap test of "is this
 * pointer from that vmm" (the MPI plugin's IPC path uses it). */
RANKMEM_API rankmem_status_t rankmem_vmm_range(rankmem_resource_t *mr, void **base_p,
                                               size_t *bytes_p);

/* One physical handle of an export. An importer maps handles whole (the
 * driver maps a handle only from its start), so an export describes every
 * handle that the range touches, whatever their sizes. */
typedef struct rankmem_vmm_handle {
    unsigned long long id;        /* unique in the exporting process and never reused: a
                                     handle released and another mapped at the same
                                     address have different ids (importers key caches on it) */
    unsigned long long address;   /* where the handle is mapped in the exporter */
    size_t bytes;                 /* its size (a multiple of the granule) */
    unsigned long long fd_offset; /* where it starts in its descriptor's object (host
                                     backend: in the pool's memfd; GPU: 0) */
    int fd;                       /* the exporter's descriptor; -1 with
                                     RANKMEM_VMM_EXPORT_NO_FDS */
} rankmem_vmm_handle_t;

/* Memory of a vmm exported to another process of the node: the physical
 * handles that cover a range, one POSIX file descriptor each, and where
 * the range starts in the first. The descriptors mean nothing in another
 * process until passed over a Unix socket (SCM_RIGHTS) or pidfd_getfd; the
 * other fields are plain values. */
typedef struct rankmem_vmm_export {
    int backend;                   /* RANKMEM_VMM_BACKEND_* of the exporter */
    int device;                    /* the exporter's device */
    size_t granule;                /* the exporter's granule */
    size_t count;                  /* handles */
    size_t offset;                 /* the range's start in the first handle */
    size_t bytes;                  /* the range's size */
    rankmem_vmm_handle_t *handles; /* count, in address order */
} rankmem_vmm_export_t;

/* Export flags. */
#define RANKMEM_VMM_EXPORT_NO_FDS 1u /* describe the handles, make no descriptor (fd -1) */
/* The range need only be mapped memory of the vmm, not inside one live
 * block: for a caller that knows the memory stays mapped meanwhile (a
 * buffer it is using, a handle it was told of). Skips the walk over live
 * blocks that the default check costs. */
#define RANKMEM_VMM_EXPORT_MAPPED 2u

/* Export [ptr, ptr + bytes), which must lie inside one live allocation of
 * the vmm of mr's chain (its start or any interior pointer). Fills
 * *export_p (arrays allocated here); release it with
 * rankmem_vmm_export_close. The importer may read what the allocating
 * stream has written once that stream has reached the point of export.
 * Finding an interior pointer's block walks the live blocks: not for hot
 * paths (RANKMEM_VMM_EXPORT_MAPPED skips it). */
RANKMEM_API rankmem_status_t rankmem_vmm_export(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                                rankmem_vmm_export_t *export_p);
/* The same with RANKMEM_VMM_EXPORT_* flags (0: as rankmem_vmm_export). */
RANKMEM_API rankmem_status_t rankmem_vmm_export_ex(rankmem_resource_t *mr, void *ptr,
                                                   size_t bytes, unsigned flags,
                                                   rankmem_vmm_export_t *export_p);
/* Closes the descriptors of an export made here and frees its arrays. */
RANKMEM_API rankmem_status_t rankmem_vmm_export_close(rankmem_vmm_export_t *export_p);

typedef struct rankmem_vmm_import rankmem_vmm_import_t;
/* Map an export received from another process (its fds replaced by this
 * process's descriptors, which stay the caller's: close them once this
 * returns) on the device current now (the host backend: host memory):
 * its handles whole, one after another. *ptr_p: the range's first byte. */
RANKMEM_API rankmem_status_t rankmem_vmm_import(const rankmem_vmm_export_t *export_data,
                                                void **ptr_p, rankmem_vmm_import_t **import_p);
/* Unmap an import. The exporter may free the block only after every
 * importer closed its mapping. */
RANKMEM_API rankmem_status_t rankmem_vmm_import_close(rankmem_vmm_import_t *import);

#ifdef __cplusplus
}
#endif
#endif
