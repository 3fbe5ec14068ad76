/* rankmem MPI plugin: the node-local service that hands a vmm pool's
 * physical handles to other ranks of the node as POSIX file descriptors
 * (staging/ipc_map.c's second kind of descriptor). File descriptors cannot
 * travel through MPI: each rank listens on an abstract Unix socket named
 * after a job-wide nonce and its world rank, and a thread of its own (no
 * MPI call in it) answers "the descriptors of handles (address, id), ..."
 * with SCM_RIGHTS. Not installed, every symbol hidden. docs/staging.md,
 * "vmm memory through CUDA IPC", tells the protocol. */
#ifndef RANKMEM_MPI_STAGING_IPC_FD_H
#define RANKMEM_MPI_STAGING_IPC_FD_H

#include "../plugin.h"

#include <stddef.h>
#include <stdint.h>

/* Handles one request may name (more: several requests). */
#define RK_IPC_FD_MAX 64

/* Listen as world rank `rank` of the job `nonce` and serve the handles of
 * the vmm of mr's chain (retained until rk_ipc_fd_stop). 0, or -1 with
 * why filled. */
RK_MPI_HIDDEN int rk_ipc_fd_start(uint64_t nonce, int rank, int world_size,
                                  rankmem_resource_t *mr, char *why, size_t len);
/* Stop the thread, close every socket (no communication: a peer that has
 * gone is no concern). */
RK_MPI_HIDDEN void rk_ipc_fd_stop(void);

/* From world rank owner: the descriptors of its n handles (addr[i],
 * ids[i]), each handle's bytes and offset in its object. 0 (fds[] the
 * caller's to close), or -1 with why filled (the owner refused: the handle
 * is gone, or no socket). Thread-safe. */
RK_MPI_HIDDEN int rk_ipc_fd_fetch(int owner, size_t n, const uint64_t *addr, const uint64_t *ids,
                                  int *fds, uint64_t *bytes, uint64_t *fd_offsets, char *why,
                                  size_t len);

/* Test backend: refuse every request from now on (1) or serve again (0). */
RK_MPI_HIDDEN void rk_ipc_fd_refuse(int on);

#endif
