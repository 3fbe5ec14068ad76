/* rankmem MPI plugin: collectives among the ranks of one node through CUDA
 * IPC (issue 20; staging/coll_ipc.c). Not installed, every symbol hidden.
 *
 * Each rk_coll_ipc_* takes the arguments of its MPI call plus rc: 1 when it
 * did the call (*rc: MPI's result), 0 when the caller must go on as
 * before (staged or straight to MPI). The decision is the same on every
 * rank of comm, so a wrapper calls it first, before its own fast exits:
 * ranks with host buffers take part too (then all fall back). While IPC is
 * off, the cost is one load and a branch. */
#ifndef RANKMEM_MPI_STAGING_COLL_IPC_H
#define RANKMEM_MPI_STAGING_COLL_IPC_H

#include "staging.h"
#include "ipc_map.h"

/* Per-rank bytes (one block of Allgather/Alltoall, the whole message of
 * Bcast/Reduce/Allreduce) from which a collective goes through IPC. Below
 * it, the descriptor exchange and the agreements cost more than staging
 * saves. A constant: MPI makes the byte count the same on every rank. */
#define RK_COLL_IPC_MIN ((size_t)256 << 10)
/* Communicators of more ranks stage (fixed arrays, no allocation that
 * could fail on one rank only). */
#define RK_COLL_IPC_MAXRANKS 64

RK_MPI_HIDDEN int rk_coll_ipc_bcast_(void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm,
                                     int *rc);
RK_MPI_HIDDEN int rk_coll_ipc_allgather_(const void *sbuf, int scount, MPI_Datatype stype,
                                         void *rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm,
                                         int *rc);
RK_MPI_HIDDEN int rk_coll_ipc_alltoall_(const void *sbuf, int scount, MPI_Datatype stype,
                                        void *rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm,
                                        int *rc);
RK_MPI_HIDDEN int rk_coll_ipc_reduce_(const void *sbuf, void *rbuf, int count, MPI_Datatype dt,
                                      MPI_Op op, int root, MPI_Comm comm, int *rc);
RK_MPI_HIDDEN int rk_coll_ipc_allreduce_(const void *sbuf, void *rbuf, int count, MPI_Datatype dt,
                                         MPI_Op op, MPI_Comm comm, int *rc);

static inline int rk_coll_ipc_bcast(void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm,
                                    int *rc)
{
    return RK_STG_UNLIKELY(rk_ipc_on) && rk_coll_ipc_bcast_(buf, count, dt, root, comm, rc);
}

static inline int rk_coll_ipc_allgather(const void *sbuf, int scount, MPI_Datatype stype,
                                        void *rbuf, int rcount, MPI_Datatype rtype, MPI_Comm comm,
                                        int *rc)
{
    return RK_STG_UNLIKELY(rk_ipc_on) &&
           rk_coll_ipc_allgather_(sbuf, scount, stype, rbuf, rcount, rtype, comm, rc);
}

static inline int rk_coll_ipc_alltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
                                       int rcount, MPI_Datatype rtype, MPI_Comm comm, int *rc)
{
    return RK_STG_UNLIKELY(rk_ipc_on) &&
           rk_coll_ipc_alltoall_(sbuf, scount, stype, rbuf, rcount, rtype, comm, rc);
}

static inline int rk_coll_ipc_reduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt,
                                     MPI_Op op, int root, MPI_Comm comm, int *rc)
{
    return RK_STG_UNLIKELY(rk_ipc_on) &&
           rk_coll_ipc_reduce_(sbuf, rbuf, count, dt, op, root, comm, rc);
}

static inline int rk_coll_ipc_allreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt,
                                        MPI_Op op, MPI_Comm comm, int *rc)
{
    return RK_STG_UNLIKELY(rk_ipc_on) &&
           rk_coll_ipc_allreduce_(sbuf, rbuf, count, dt, op, comm, rc);
}

#endif
