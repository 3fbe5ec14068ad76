/* Whether CUDA's MPS runs for this process: its control pipe is there
 * (CUDA_MPS_PIPE_DIRECTORY, by default /tmp/nvidia-mps). Shared by the
 * plugin (mpi/staging/ipc_map.c: how to copy on a shared GPU, and the line
 * at MPI_Init) and rankmem-info, so both look in the same place. */
#ifndef RANKMEM_MPS_H
#define RANKMEM_MPS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* 1 when the pipe is there; its path in path (cap bytes). */
static inline int rk_mps_running(char *path, size_t cap)
{
    const char *dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    snprintf(path, cap, "%s/control", dir && *dir ? dir : "/tmp/nvidia-mps");
    return access(path, F_OK) == 0;
}

#endif
