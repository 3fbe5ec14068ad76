/* rankmem MPI plugin: device memory of ranks of one node mapped into each
 * other through CUDA IPC (issue 20), so that a device message between them
 * is one device-to-device copy made by the receiver instead of two copies
 * through pinned host memory and MPI. Not installed, every symbol hidden.
 *
 * The exporter (a sender, or a collective's contributor) describes the
 * allocation that holds its buffer (rk_ipc_export: an IPC handle, cached by
 * allocation); the importer maps it once (rk_ipc_map: cached by the
 * exporter's rank and the allocation's buffer id, which the driver never
 * reuses within a process, so a buffer freed and reallocated at the same
 * address is mapped afresh, never read through the old mapping). MPI
 * carries the descriptor; completion travels back as a small message
 * (staging/proto_ipc.c, staging/coll.c). docs/staging.md, "CUDA IPC", tells the
 * protocol. */
#ifndef RANKMEM_MPI_STAGING_IPC_H
#define RANKMEM_MPI_STAGING_IPC_H

#include "../plugin.h"

#include <stddef.h>
#include <stdint.h>

#define RK_IPC_HANDLE_BYTES 64
#define RK_IPC_VMM_SEGS 16     /* runs of vmm handles one descriptor names */
#define RK_IPC_VMM_HANDLES 256 /* vmm handles one descriptor names (more: staged) */

#define RK_IPC_KIND_CUDA 0 /* a cudaIpcMemHandle_t of the allocation */
#define RK_IPC_KIND_VMM 1  /* physical handles of the rank's vmm pool (fd service) */

/* What travels from exporter to importer: 328 bytes. The cudaIpc kind
 * describes the allocation [base, base + size) with id buffer_id; the vmm
 * kind the physical handles that cover the buffer, one after another from
 * base (the first handle's address), as nh segments: segment i is count[i]
 * handles of granules[i] granules each, with export ids id0[i],
 * id0[i] + 1, ... (ids given at one export are consecutive, so a buffer
 * takes one or a few segments); size is their sum and buffer_id the first
 * id. offset: the buffer's first byte - base. */
typedef struct rk_ipc_desc {
    union {
        unsigned char handle[RK_IPC_HANDLE_BYTES]; /* cudaIpcMemHandle_t (fake: pid, fd) */
        struct {
            uint64_t id0[RK_IPC_VMM_SEGS];
            uint32_t count[RK_IPC_VMM_SEGS];
            uint32_t granules[RK_IPC_VMM_SEGS];
        } vmm;
    } u;
    uint64_t buffer_id; /* the allocation's id in the exporter (vmm: the first handle's) */
    uint64_t base;      /* the allocation's first byte, in the exporter */
    uint64_t size;      /* the allocation's bytes */
    uint64_t offset;    /* the buffer's first byte - base */
    uint64_t bytes;     /* the message's bytes */
    int32_t owner;      /* the exporter's rank in MPI_COMM_WORLD */
    int32_t spare;
    int32_t kind;       /* RK_IPC_KIND_* */
    int32_t nh;         /* vmm: segments */
    uint64_t granule;   /* vmm: the exporter's granule */
    int32_t backend;    /* vmm: RANKMEM_VMM_BACKEND_* */
    int32_t spare2;
} rk_ipc_desc_t;

/* IPC serves device messages between ranks of this node (the same answer
 * on every rank of the node). Written once, in MPI_Init. */
RK_MPI_HIDDEN extern int rk_ipc_on;

/* The node's decision, collective over MPI_COMM_WORLD (staging/base.c calls it
 * from rk_mpi_staging_init once staging is active somewhere). mode: 0
 * auto, 1 on, 2 off (RANKMEM_STAGING_IPC); cache: RANKMEM_STAGING_IPC_CACHE
 * (0: the default); stg_on: this rank stages. Prints at most one line for
 * the job. */
RK_MPI_HIDDEN void rk_ipc_init(int mode, int cache, int stg_on);
/* Close every mapping (no communication: a peer that has gone is no
 * concern). */
RK_MPI_HIDDEN void rk_ipc_finalize(void);

/* The communicator where importers answer exporters (a duplicate of
 * MPI_COMM_WORLD; MPI_COMM_NULL when IPC never started). */
RK_MPI_HIDDEN MPI_Comm rk_ipc_ack_comm(void);

/* 1 when IPC serves messages between this rank and world rank w. */
RK_MPI_HIDDEN int rk_ipc_reaches(int w);

/* Describe [buf, buf + n) for node peers: 0, or -1 when its memory cannot
 * be exported (stream-ordered pools, managed memory, VMM memory other than
 * the rank's vmm pool: the caller stages). Memory of the rank's vmm pool
 * (rankmem_mpi_resource()) is described by its physical handles, which
 * peers fetch from this rank's fd service (staging/ipc_fd.h); other memory
 * by a CUDA IPC handle, cached per allocation (the answer "cannot" too). */
RK_MPI_HIDDEN int rk_ipc_export(const void *buf, size_t n, rk_ipc_desc_t *d);

/* The exporter's buffer, mapped here: the address of its first byte, or
 * NULL when the mapping was refused (message printed once). Each non-NULL
 * answer holds the mapping until rk_ipc_release. */
RK_MPI_HIDDEN void *rk_ipc_map(const rk_ipc_desc_t *d);
RK_MPI_HIDDEN void rk_ipc_release(const void *mapped);

/* Counters for the verbose line and the tests: mappings opened, closed
 * because their allocation was replaced, evicted, and cache hits. */
typedef struct rk_ipc_stats {
    uint64_t opened, stale, evicted, hits, exports, refused, refused_maps;
    uint64_t vmm_exports, vmm_opened; /* of the above, vmm descriptors */
    int cached, busy; /* mappings kept; of them, in use (between map and release) */
} rk_ipc_stats_t;
RK_MPI_HIDDEN void rk_ipc_stats(rk_ipc_stats_t *s);

/* Test backend (stg_fake): the fake device region lives in the memory
 * file fd (memfd), which peers map through /proc/PID/fd/FD. Before
 * MPI_Init. rk_stg_fake_ipc_renew: the region counts as a new allocation
 * from now on (as if freed and allocated again at the same address). */
RK_MPI_HIDDEN void rk_stg_fake_ipc(int fd);
RK_MPI_HIDDEN void rk_stg_fake_ipc_renew(void);
/* Test backend: refuse every nth mapping from now on (0: none). */
RK_MPI_HIDDEN void rk_stg_fake_ipc_fail(int every);

#endif
