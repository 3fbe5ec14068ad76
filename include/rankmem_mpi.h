/* rankmem MPI plugin (librankmem_mpi): each rank bound to a GPU, its
 * resource installed at MPI_Init, a per-rank memory report at MPI_Finalize.
 * Link -lrankmem_mpi before the MPI library, or LD_PRELOAD it. */
#ifndef RANKMEM_MPI_H
#define RANKMEM_MPI_H

#include <rankmem.h>
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Node-local rank (from the shared-memory communicator); -1 before MPI_Init. */
RANKMEM_API int rankmem_mpi_local_rank(void);
/* The device this rank was bound to; -1 with no GPU or before MPI_Init. */
RANKMEM_API int rankmem_mpi_device(void);
/* The rank's resource (stats on top); NULL before MPI_Init. Not retained. */
RANKMEM_API rankmem_resource_t *rankmem_mpi_resource(void);
/* Writes a report now (collective over comm). path NULL: RANKMEM_REPORT. */
RANKMEM_API rankmem_status_t rankmem_mpi_report(MPI_Comm comm, const char *path);

/* ---- observation (mpi/observe/observe_api.c; docs/observe.md) ----
 * The recorder behind the report's observed memory sees the program's CUDA
 * allocations by itself (RANKMEM_OBSERVE). These calls tell it of memory it
 * cannot see (an allocator of one's own over the driver, a test's synthetic
 * events) and mark phases of the run for the report's timeline. Each returns
 * RANKMEM_ERR_NOT_SUPPORTED while observation is off, INVALID_ARGUMENT for a
 * NULL pointer, zero bytes, an unknown kind or an empty name, and
 * observe_free INVALID_POINTER for a block it was never told of. */
typedef enum {
    RANKMEM_MPI_MEM_DEVICE = 0,
    RANKMEM_MPI_MEM_MANAGED = 1,
    RANKMEM_MPI_MEM_PINNED = 2,
    RANKMEM_MPI_MEM_VMM = 3
} rankmem_mpi_mem_kind_t;

RANKMEM_API rankmem_status_t rankmem_mpi_observe_alloc(const void *ptr, size_t bytes,
                                                       rankmem_mpi_mem_kind_t kind);
RANKMEM_API rankmem_status_t rankmem_mpi_observe_free(const void *ptr);
/* Closes the current phase and opens `name` (truncated to 47 bytes); the
 * report gives each phase's peak. MPI_Pcontrol(2) and (3, label) mark too. */
RANKMEM_API rankmem_status_t rankmem_mpi_phase(const char *name);

/* ---- sharing device memory between the ranks of one node (mpi/node_share.c;
 * docs/mpi.md, "Sharing device memory between ranks") ----
 * Collective over comm, whose ranks must all be on the root's node. The
 * root calls rankmem_mpi_share with an async resource created with
 * handle_type RANKMEM_HANDLE_POSIX_FD; every other rank calls
 * rankmem_mpi_import and gets an async_import resource over that pool.
 * All ranks return an error when any rank failed (nothing is left imported
 * then). RANKMEM_ERR_NOT_SUPPORTED for a rank on another node. */
RANKMEM_API rankmem_status_t rankmem_mpi_share(rankmem_resource_t *mr, int root, MPI_Comm comm);
RANKMEM_API rankmem_status_t rankmem_mpi_import(int root, MPI_Comm comm,
                                                rankmem_resource_t **imported_p);
/* Collective over comm: count allocations of the shared pool. The root
 * passes its async resource and its pointers (allocations its streams have
 * reached); every other rank passes its async_import resource and gets the
 * same memory in ptrs[0..count). Importers free with
 * rankmem_async_free_imported, and the root frees only after all of them
 * have (an MPI_Barrier after their frees). */
RANKMEM_API rankmem_status_t rankmem_mpi_share_pointers(rankmem_resource_t *mr, void **ptrs,
                                                        int count, int root, MPI_Comm comm);

#ifdef __cplusplus
}
#endif
#endif
