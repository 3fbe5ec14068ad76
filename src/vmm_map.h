/* The vmm resource's mapping layer: a reserved virtual range, cut into
 * granules, each backed on demand by a physical allocation of its own.
 * Never installed; every symbol is hidden.
 *
 * One physical handle per granule: cuMemUnmap/hipMemUnmap cannot unmap part
 * of a mapping, and single granules must go back one by one when they fall
 * free. The map keeps the virtual bookkeeping (which granules are mapped,
 * the holes left by unmapping, the frontier of the range); backends only
 * create, map, unmap and release.
 *
 * Backends: "cuda" (the driver's virtual memory API found at run time, no
 * libcuda at link time), "hip" (hipMemCreate/hipMemMap), and "host", a
 * simulation over mmap and a memfd for tests and benchmarks on machines
 * without a GPU, with call counters and a fault-injection knob.
 *
 * Not thread-safe: the caller (vmm.c, under the pool's growth lock)
 * serialises every call on one map. */
#ifndef RANKMEM_VMM_MAP_H
#define RANKMEM_VMM_MAP_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

typedef enum { RK_VMM_HOST = 0, RK_VMM_CUDA = 1, RK_VMM_HIP = 2 } rk_vmm_backend_t;

/* Counters (host backend and every backend: what the map asked for). */
typedef struct {
    size_t reserves, maps, unmaps, creates, releases, set_access, exports, imports;
} rk_vmm_counters_t;

typedef struct rk_vmm_map rk_vmm_map_t;

/* A new map: backend, device (ignored by host), bytes of virtual range to
 * reserve (rounded up to granules), granule (0: the device's recommended
 * granularity; host: 2 MiB), the largest physical handle (0 or granule: one
 * per granule; a multiple of granule: growths map handles of up to that
 * size, fewer calls, and only whole handles go back), maximum mapped bytes
 * (SIZE_MAX: none). */
RK_HIDDEN rankmem_status_t rk_vmm_map_create(rk_vmm_backend_t backend, int device, size_t reserve,
                                             size_t granule, size_t handle, size_t maximum,
                                             rk_vmm_map_t **map_p);
/* Unmaps and releases everything, frees the reservation. */
RK_HIDDEN void rk_vmm_map_destroy(rk_vmm_map_t *map);

RK_HIDDEN size_t rk_vmm_map_granule(const rk_vmm_map_t *map);
RK_HIDDEN size_t rk_vmm_map_mapped(const rk_vmm_map_t *map);
RK_HIDDEN size_t rk_vmm_map_mapped_high(const rk_vmm_map_t *map);
RK_HIDDEN size_t rk_vmm_map_reserved(const rk_vmm_map_t *map);
RK_HIDDEN size_t rk_vmm_map_maximum(const rk_vmm_map_t *map);
RK_HIDDEN char *rk_vmm_map_base(const rk_vmm_map_t *map);
RK_HIDDEN rk_vmm_backend_t rk_vmm_map_backend(const rk_vmm_map_t *map);
/* Whether granules can be exported as POSIX file descriptors. */
RK_HIDDEN int rk_vmm_map_exportable(const rk_vmm_map_t *map);
RK_HIDDEN void rk_vmm_map_counters(const rk_vmm_map_t *map, rk_vmm_counters_t *c_p);

/* Host backend only: the n-th map call from now (1 = the next) and the
 * count - 1 after it fail with RANKMEM_ERR_OUT_OF_MEMORY, as a device out
 * of memory would; nth 0 disarms. */
RK_HIDDEN void rk_vmm_map_fail_at(rk_vmm_map_t *map, size_t nth, size_t count);

/* Map at least `bytes` (rounded up to granules) somewhere in the range: the
 * lowest hole that fits, else at the frontier. All or nothing: on failure
 * nothing stays mapped. One access call covers the whole new range. */
RK_HIDDEN rankmem_status_t rk_vmm_map_grow(rk_vmm_map_t *map, size_t bytes, char **ptr_p,
                                           size_t *size_p);
/* Unmap and release the granules of [ptr, ptr + bytes): granule-aligned,
 * mapped, whole handles; the span becomes a hole. */
RK_HIDDEN rankmem_status_t rk_vmm_map_shrink(rk_vmm_map_t *map, char *ptr, size_t bytes);

/* Whether physical handles may cover several granules (handle= larger
 * than granule=, or not given on a GPU backend: then they grow with the map). */
RK_HIDDEN int rk_vmm_map_multi(const rk_vmm_map_t *map);
/* Narrow [*ptr_p, + *bytes_p) (granule-aligned, mapped) to the whole
 * handles inside it, which shrink can give back, and of those to the first
 * ones that make at least want bytes; 0 when there is none. */
RK_HIDDEN int rk_vmm_map_fit(const rk_vmm_map_t *map, char **ptr_p, size_t *bytes_p,
                             size_t want);

/* Describe the physical handles covering [ptr, ptr + bytes) (every granule
 * mapped, else RANKMEM_ERR_INVALID_POINTER): *handles_p (count_p of them,
 * allocated here) in address order, each with its export id (given at its
 * first export, unique in the process, never reused: a handle unmapped
 * and another mapped at the same place get different ids), and
 * *offset_p, where ptr lies in the first. want_fds: each gets a new
 * descriptor (the caller's to close); else fd -1. */
RK_HIDDEN rankmem_status_t rk_vmm_map_export(rk_vmm_map_t *map, char *ptr, size_t bytes,
                                             int want_fds, rankmem_vmm_handle_t **handles_p,
                                             size_t *count_p, size_t *offset_p);

/* Importer side (no map needed): reserve the handles' total, map each whole
 * from its fd (at fd_offset in the host backend), one after another, make
 * the range accessible from device. */
RK_HIDDEN rankmem_status_t rk_vmm_import(rk_vmm_backend_t backend, int device, size_t granule,
                                         size_t count, const rankmem_vmm_handle_t *handles,
                                         char **base_p);
RK_HIDDEN rankmem_status_t rk_vmm_unimport(rk_vmm_backend_t backend, char *base,
                                           const size_t *sizes, size_t count);

/* Whether a GPU backend can work here (driver found, VMM supported on the
 * device); on 0, *why_p says why. */
RK_HIDDEN int rk_vmm_backend_available(rk_vmm_backend_t backend, int device, const char **why_p);

/* Total memory of the device (cuda/hip), 0 if unknown. */
RK_HIDDEN size_t rk_vmm_device_memory(rk_vmm_backend_t backend, int device);

#endif
