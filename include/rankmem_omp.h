/* rankmem_omp: OpenMP memory spaces and allocators served by rankmem.
 *
 * Link -lrankmem_omp before the OpenMP runtime (`cc -fopenmp prog.c
 * -lrankmem_omp -lrankmem` puts the runtime last), or LD_PRELOAD
 * librankmem_omp.so. Then the standard calls accept the handles below:
 *
 *   double *x = omp_alloc(n * sizeof *x, rankmem_omp_device_mem_alloc);
 *   ...
 *   omp_free(x, rankmem_omp_device_mem_alloc);
 *
 *   omp_alloctrait_t t[] = {{omp_atk_pool_size, 1 << 30}, {omp_atk_fallback, omp_atv_null_fb}};
 *   omp_allocator_handle_t a = omp_init_allocator(rankmem_omp_device_mem_space, 2, t);
 *
 *   #pragma omp parallel private(buf) allocate(rankmem_omp_device_mem_alloc: buf)
 *
 * Works with libgomp (GCC) and LLVM's libomp. Handles and pointers that are
 * not rankmem's go to the runtime unchanged. docs/openmp.md describes the
 * traits, the handle encoding and the stream rule. The handles are
 * variables, not constants: their values are addresses inside the library. */
#ifndef RANKMEM_OMP_H
#define RANKMEM_OMP_H

#include <stddef.h>
#include <omp.h>
#include <rankmem.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Memory spaces: the current device's rankmem resource (the rank's pool and
 * stats: rankmem_get_current_resource), one shared managed resource, one
 * shared pinned host resource. Without a GPU all three are host memory. */
RANKMEM_API extern const omp_memspace_handle_t rankmem_omp_device_mem_space;
RANKMEM_API extern const omp_memspace_handle_t rankmem_omp_managed_mem_space;
RANKMEM_API extern const omp_memspace_handle_t rankmem_omp_pinned_mem_space;

/* Predefined allocators on those spaces: default traits, except fallback
 * null_fb (a failed allocation returns NULL rather than host memory). They
 * cannot be destroyed. */
RANKMEM_API extern const omp_allocator_handle_t rankmem_omp_device_mem_alloc;
RANKMEM_API extern const omp_allocator_handle_t rankmem_omp_managed_mem_alloc;
RANKMEM_API extern const omp_allocator_handle_t rankmem_omp_pinned_mem_alloc;

/* *ours_p = 1 when allocator is a live allocator of rankmem's (predefined,
 * or made by omp_init_allocator on one of the spaces above), else 0. */
RANKMEM_API rankmem_status_t rankmem_omp_is_rankmem_allocator(omp_allocator_handle_t allocator,
                                                              int *ours_p);

/* The resource an allocator of ours allocates from now (borrowed): its own
 * chain (pool_size, sync_hint private), else its space's resource. Not
 * ours or destroyed: RANKMEM_ERR_INVALID_ARGUMENT. */
RANKMEM_API rankmem_status_t rankmem_omp_allocator_resource(omp_allocator_handle_t allocator,
                                                            rankmem_resource_t **mr_p);

/* Size and resource (borrowed) of a live block rankmem served; either output
 * may be NULL. Not ours: RANKMEM_ERR_INVALID_POINTER; NULL ptr:
 * RANKMEM_ERR_INVALID_ARGUMENT. */
RANKMEM_API rankmem_status_t rankmem_omp_block_info(const void *ptr, size_t *bytes_p,
                                                    rankmem_resource_t **mr_p);

/* Give back now every block that omp_free left waiting for a device sync
 * (with RANKMEM_OMP_FREE_SYNC on, device-accessible memory goes back only
 * after a cudaDeviceSynchronize that began after its omp_free; one sync
 * serves many frees, and until it runs the blocks still count as live in
 * the resource's stats and pool_size limits). One sync of each device
 * concerned, then the blocks go back. Allocation failures, the MPI report,
 * omp_destroy_allocator (for its blocks) and exit do this by themselves.
 * RANKMEM_SUCCESS, or RANKMEM_ERR_DEVICE when a sync failed (the blocks
 * went back anyway). Nothing pending: RANKMEM_SUCCESS, no CUDA call. */
RANKMEM_API rankmem_status_t rankmem_omp_flush(void);

/* *active_p = 1 when the program's omp_alloc is rankmem's (the library is
 * linked before the OpenMP runtime, or preloaded); 0 means the runtime's
 * own functions come first and rankmem's handles must not be used (a
 * warning on stderr said so at start-up). */
RANKMEM_API rankmem_status_t rankmem_omp_active(int *active_p);

#ifdef __cplusplus
}
#endif
#endif
