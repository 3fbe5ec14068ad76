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

#ifdef __cplusplus
}
#endif
#endif
