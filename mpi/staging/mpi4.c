/* Staging, the MPI 4 calls that take a buffer and that the plugin does not
 * stage itself (MPICH 4; Open MPI 4 has none of them):
 *
 *   - the large-count forms (MPI_Send_c ... MPI_File_write_c): while every
 *     count fits an int (and a Pack position, a window's disp_unit), the
 *     call is the plugin's int form, staged as that one is; a device buffer
 *     with a larger count is refused (MPI_ERR_COUNT);
 *   - the large-count forms with count or displacement arrays (the v- and
 *     w-collectives), MPI_Isendrecv(_replace)(_c), partitioned
 *     communication (MPI_Psend_init, MPI_Precv_init) and MPI_Buffer_attach:
 *     a device buffer is refused (MPI_ERR_BUFFER);
 *
 * each refusal through the communicator's (window's, file's) error handler,
 * with one line per rank and call. Host buffers go to MPI as they are. The
 * hooks below were generated from MPICH 4.0's prototypes (one per call,
 * the same three steps) and checked by hand. */
#include "staging.h"

#include <limits.h>
#include <stdatomic.h>

#if MPI_VERSION >= 4

#define EXPORT RK_MPI_EXPORT

#define FITS(x) ((x) >= INT_MIN && (x) <= INT_MAX)
#define DEV(p) ((p) != NULL && (const void *)(p) != MPI_IN_PLACE && rk_stg_is_device(p))

enum { TOO_BIG, NOT_COVERED };

/* Where a refusal goes: the call's communicator, window or file. */
typedef struct {
    int kind;
    MPI_Comm comm;
    MPI_Win win;
    MPI_File fh;
} eh_t;
#define ERR_COMM(c) ((eh_t){.kind = 0, .comm = (c)})
#define ERR_WIN(w) ((eh_t){.kind = 1, .win = (w)})
#define ERR_FILE(f) ((eh_t){.kind = 2, .fh = (f)})

static int refuse(const char *call, atomic_int *once, int why, eh_t eh)
{
    int err = why == TOO_BIG ? MPI_ERR_COUNT : MPI_ERR_BUFFER;
    if (!atomic_exchange(once, 1)) {
        if (why == TOO_BIG)
            rk_mpi_warn("staging: %s: a device buffer with a count above INT_MAX is not "
                        "staged; refused (MPI_ERR_COUNT)", call);
        else
            rk_mpi_warn("staging: %s with a device buffer is not staged by the plugin "
                        "(docs/staging.md, \"Not covered\"); refused (MPI_ERR_BUFFER)", call);
    }
    if (eh.kind == 0)
        PMPI_Comm_call_errhandler(eh.comm, err);
    else if (eh.kind == 1)
        PMPI_Win_call_errhandler(eh.win, err);
    else
        PMPI_File_call_errhandler(eh.fh, err);
    return err;
}

EXPORT int MPI_Accumulate_c(const void *origin_addr, MPI_Count origin_count,
                            MPI_Datatype origin_datatype, int target_rank, MPI_Aint target_disp,
                            MPI_Count target_count, MPI_Datatype target_datatype, MPI_Op op,
                            MPI_Win win)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Accumulate_c(origin_addr, origin_count, origin_datatype, target_rank,
                                 target_disp, target_count, target_datatype, op, win);
    if (FITS(origin_count) && FITS(target_count))
        return MPI_Accumulate(origin_addr, (int)origin_count, origin_datatype, target_rank,
                              target_disp, (int)target_count, target_datatype, op, win);
    if (!(DEV(origin_addr)))
        return PMPI_Accumulate_c(origin_addr, origin_count, origin_datatype, target_rank,
                                 target_disp, target_count, target_datatype, op, win);
    static atomic_int once;
    return refuse("MPI_Accumulate_c", &once, TOO_BIG, ERR_WIN(win));
}

EXPORT int MPI_Allgather_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                           void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Allgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Allgather(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                             comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Allgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    static atomic_int once;
    return refuse("MPI_Allgather_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Allgather_init_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                                void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype,
                                MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Allgather_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                     comm, info, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Allgather_init(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount,
                                  recvtype, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Allgather_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                     comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Allgather_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Allgatherv_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                            void *recvbuf, const MPI_Count recvcounts[], const MPI_Aint displs[],
                            MPI_Datatype recvtype, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Allgatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                 recvtype, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Allgatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                 recvtype, comm);
    static atomic_int once;
    return refuse("MPI_Allgatherv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Allgatherv_init_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                                 void *recvbuf, const MPI_Count recvcounts[],
                                 const MPI_Aint displs[], MPI_Datatype recvtype, MPI_Comm comm,
                                 MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Allgatherv_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                      recvtype, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Allgatherv_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                      recvtype, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Allgatherv_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Allreduce_c(const void *sendbuf, void *recvbuf, MPI_Count count,
                           MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Allreduce_c(sendbuf, recvbuf, count, datatype, op, comm);
    if (FITS(count))
        return MPI_Allreduce(sendbuf, recvbuf, (int)count, datatype, op, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Allreduce_c(sendbuf, recvbuf, count, datatype, op, comm);
    static atomic_int once;
    return refuse("MPI_Allreduce_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Allreduce_init_c(const void *sendbuf, void *recvbuf, MPI_Count count,
                                MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Info info,
                                MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Allreduce_init_c(sendbuf, recvbuf, count, datatype, op, comm, info, request);
    if (FITS(count))
        return MPI_Allreduce_init(sendbuf, recvbuf, (int)count, datatype, op, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Allreduce_init_c(sendbuf, recvbuf, count, datatype, op, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Allreduce_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Alltoall_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                          void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Alltoall_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Alltoall(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                            comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Alltoall_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm);
    static atomic_int once;
    return refuse("MPI_Alltoall_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Alltoall_init_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                               void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype,
                               MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Alltoall_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                    comm, info, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Alltoall_init(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount,
                                 recvtype, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Alltoall_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                    comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Alltoall_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Alltoallv_c(const void *sendbuf, const MPI_Count sendcounts[],
                           const MPI_Aint sdispls[], MPI_Datatype sendtype, void *recvbuf,
                           const MPI_Count recvcounts[], const MPI_Aint rdispls[],
                           MPI_Datatype recvtype, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Alltoallv_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                                rdispls, recvtype, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Alltoallv_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                                rdispls, recvtype, comm);
    static atomic_int once;
    return refuse("MPI_Alltoallv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Alltoallv_init_c(const void *sendbuf, const MPI_Count sendcounts[],
                                const MPI_Aint sdispls[], MPI_Datatype sendtype, void *recvbuf,
                                const MPI_Count recvcounts[], const MPI_Aint rdispls[],
                                MPI_Datatype recvtype, MPI_Comm comm, MPI_Info info,
                                MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Alltoallv_init_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                                     rdispls, recvtype, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Alltoallv_init_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                                     rdispls, recvtype, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Alltoallv_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Alltoallw_c(const void *sendbuf, const MPI_Count sendcounts[],
                           const MPI_Aint sdispls[], const MPI_Datatype sendtypes[], void *recvbuf,
                           const MPI_Count recvcounts[], const MPI_Aint rdispls[],
                           const MPI_Datatype recvtypes[], MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Alltoallw_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts,
                                rdispls, recvtypes, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Alltoallw_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts,
                                rdispls, recvtypes, comm);
    static atomic_int once;
    return refuse("MPI_Alltoallw_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Alltoallw_init_c(const void *sendbuf, const MPI_Count sendcounts[],
                                const MPI_Aint sdispls[], const MPI_Datatype sendtypes[],
                                void *recvbuf, const MPI_Count recvcounts[],
                                const MPI_Aint rdispls[], const MPI_Datatype recvtypes[],
                                MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Alltoallw_init_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts,
                                     rdispls, recvtypes, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Alltoallw_init_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts,
                                     rdispls, recvtypes, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Alltoallw_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Bcast_c(void *buffer, MPI_Count count, MPI_Datatype datatype, int root,
                       MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Bcast_c(buffer, count, datatype, root, comm);
    if (FITS(count))
        return MPI_Bcast(buffer, (int)count, datatype, root, comm);
    if (!(DEV(buffer)))
        return PMPI_Bcast_c(buffer, count, datatype, root, comm);
    static atomic_int once;
    return refuse("MPI_Bcast_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Bcast_init_c(void *buffer, MPI_Count count, MPI_Datatype datatype, int root,
                            MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Bcast_init_c(buffer, count, datatype, root, comm, info, request);
    if (FITS(count))
        return MPI_Bcast_init(buffer, (int)count, datatype, root, comm, info, request);
    if (!(DEV(buffer)))
        return PMPI_Bcast_init_c(buffer, count, datatype, root, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Bcast_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Bsend_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                       MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Bsend_c(buf, count, datatype, dest, tag, comm);
    if (FITS(count))
        return MPI_Bsend(buf, (int)count, datatype, dest, tag, comm);
    if (!(DEV(buf)))
        return PMPI_Bsend_c(buf, count, datatype, dest, tag, comm);
    static atomic_int once;
    return refuse("MPI_Bsend_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Bsend_init_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest,
                            int tag, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Bsend_init_c(buf, count, datatype, dest, tag, comm, request);
    if (FITS(count))
        return MPI_Bsend_init(buf, (int)count, datatype, dest, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Bsend_init_c(buf, count, datatype, dest, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Bsend_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Buffer_attach_c(void *buffer, MPI_Count size)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Buffer_attach_c(buffer, size);
    if (!(DEV(buffer)))
        return PMPI_Buffer_attach_c(buffer, size);
    static atomic_int once;
    return refuse("MPI_Buffer_attach_c", &once, NOT_COVERED, ERR_COMM(MPI_COMM_WORLD));
}

EXPORT int MPI_Exscan_c(const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
                        MPI_Op op, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Exscan_c(sendbuf, recvbuf, count, datatype, op, comm);
    if (FITS(count))
        return MPI_Exscan(sendbuf, recvbuf, (int)count, datatype, op, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Exscan_c(sendbuf, recvbuf, count, datatype, op, comm);
    static atomic_int once;
    return refuse("MPI_Exscan_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Exscan_init_c(const void *sendbuf, void *recvbuf, MPI_Count count,
                             MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Info info,
                             MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Exscan_init_c(sendbuf, recvbuf, count, datatype, op, comm, info, request);
    if (FITS(count))
        return MPI_Exscan_init(sendbuf, recvbuf, (int)count, datatype, op, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Exscan_init_c(sendbuf, recvbuf, count, datatype, op, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Exscan_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_File_iread_all_c(MPI_File fh, void *buf, MPI_Count count, MPI_Datatype datatype,
                                MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iread_all_c(fh, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iread_all(fh, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iread_all_c(fh, buf, count, datatype, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_File_iread_all_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iread_at_all_c(MPI_File fh, MPI_Offset offset, void *buf, MPI_Count count,
                                   MPI_Datatype datatype, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iread_at_all_c(fh, offset, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iread_at_all(fh, offset, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iread_at_all_c(fh, offset, buf, count, datatype, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_File_iread_at_all_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iread_at_c(MPI_File fh, MPI_Offset offset, void *buf, MPI_Count count,
                               MPI_Datatype datatype, MPIO_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iread_at_c(fh, offset, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iread_at(fh, offset, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iread_at_c(fh, offset, buf, count, datatype, request);
    static atomic_int once;
    return refuse("MPI_File_iread_at_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iread_c(MPI_File fh, void *buf, MPI_Count count, MPI_Datatype datatype,
                            MPIO_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iread_c(fh, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iread(fh, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iread_c(fh, buf, count, datatype, request);
    static atomic_int once;
    return refuse("MPI_File_iread_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iread_shared_c(MPI_File fh, void *buf, MPI_Count count, MPI_Datatype datatype,
                                   MPIO_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iread_shared_c(fh, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iread_shared(fh, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iread_shared_c(fh, buf, count, datatype, request);
    static atomic_int once;
    return refuse("MPI_File_iread_shared_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iwrite_all_c(MPI_File fh, const void *buf, MPI_Count count,
                                 MPI_Datatype datatype, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iwrite_all_c(fh, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iwrite_all(fh, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iwrite_all_c(fh, buf, count, datatype, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_File_iwrite_all_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iwrite_at_all_c(MPI_File fh, MPI_Offset offset, const void *buf,
                                    MPI_Count count, MPI_Datatype datatype, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iwrite_at_all_c(fh, offset, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iwrite_at_all(fh, offset, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iwrite_at_all_c(fh, offset, buf, count, datatype, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_File_iwrite_at_all_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iwrite_at_c(MPI_File fh, MPI_Offset offset, const void *buf, MPI_Count count,
                                MPI_Datatype datatype, MPIO_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iwrite_at_c(fh, offset, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iwrite_at(fh, offset, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iwrite_at_c(fh, offset, buf, count, datatype, request);
    static atomic_int once;
    return refuse("MPI_File_iwrite_at_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iwrite_c(MPI_File fh, const void *buf, MPI_Count count, MPI_Datatype datatype,
                             MPIO_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iwrite_c(fh, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iwrite(fh, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iwrite_c(fh, buf, count, datatype, request);
    static atomic_int once;
    return refuse("MPI_File_iwrite_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_iwrite_shared_c(MPI_File fh, const void *buf, MPI_Count count,
                                    MPI_Datatype datatype, MPIO_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_iwrite_shared_c(fh, buf, count, datatype, request);
    if (FITS(count))
        return MPI_File_iwrite_shared(fh, buf, (int)count, datatype, request);
    if (!(DEV(buf)))
        return PMPI_File_iwrite_shared_c(fh, buf, count, datatype, request);
    static atomic_int once;
    return refuse("MPI_File_iwrite_shared_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_all_begin_c(MPI_File fh, void *buf, MPI_Count count, MPI_Datatype datatype)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_all_begin_c(fh, buf, count, datatype);
    if (FITS(count))
        return MPI_File_read_all_begin(fh, buf, (int)count, datatype);
    if (!(DEV(buf)))
        return PMPI_File_read_all_begin_c(fh, buf, count, datatype);
    static atomic_int once;
    return refuse("MPI_File_read_all_begin_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_all_c(MPI_File fh, void *buf, MPI_Count count, MPI_Datatype datatype,
                               MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_all_c(fh, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_read_all(fh, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_read_all_c(fh, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_read_all_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_at_all_begin_c(MPI_File fh, MPI_Offset offset, void *buf, MPI_Count count,
                                        MPI_Datatype datatype)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_at_all_begin_c(fh, offset, buf, count, datatype);
    if (FITS(count))
        return MPI_File_read_at_all_begin(fh, offset, buf, (int)count, datatype);
    if (!(DEV(buf)))
        return PMPI_File_read_at_all_begin_c(fh, offset, buf, count, datatype);
    static atomic_int once;
    return refuse("MPI_File_read_at_all_begin_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_at_all_c(MPI_File fh, MPI_Offset offset, void *buf, MPI_Count count,
                                  MPI_Datatype datatype, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_at_all_c(fh, offset, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_read_at_all(fh, offset, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_read_at_all_c(fh, offset, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_read_at_all_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_at_c(MPI_File fh, MPI_Offset offset, void *buf, MPI_Count count,
                              MPI_Datatype datatype, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_at_c(fh, offset, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_read_at(fh, offset, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_read_at_c(fh, offset, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_read_at_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_c(MPI_File fh, void *buf, MPI_Count count, MPI_Datatype datatype,
                           MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_c(fh, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_read(fh, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_read_c(fh, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_read_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_ordered_begin_c(MPI_File fh, void *buf, MPI_Count count,
                                         MPI_Datatype datatype)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_ordered_begin_c(fh, buf, count, datatype);
    if (FITS(count))
        return MPI_File_read_ordered_begin(fh, buf, (int)count, datatype);
    if (!(DEV(buf)))
        return PMPI_File_read_ordered_begin_c(fh, buf, count, datatype);
    static atomic_int once;
    return refuse("MPI_File_read_ordered_begin_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_ordered_c(MPI_File fh, void *buf, MPI_Count count, MPI_Datatype datatype,
                                   MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_ordered_c(fh, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_read_ordered(fh, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_read_ordered_c(fh, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_read_ordered_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_read_shared_c(MPI_File fh, void *buf, MPI_Count count, MPI_Datatype datatype,
                                  MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_read_shared_c(fh, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_read_shared(fh, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_read_shared_c(fh, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_read_shared_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_all_begin_c(MPI_File fh, const void *buf, MPI_Count count,
                                      MPI_Datatype datatype)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_all_begin_c(fh, buf, count, datatype);
    if (FITS(count))
        return MPI_File_write_all_begin(fh, buf, (int)count, datatype);
    if (!(DEV(buf)))
        return PMPI_File_write_all_begin_c(fh, buf, count, datatype);
    static atomic_int once;
    return refuse("MPI_File_write_all_begin_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_all_c(MPI_File fh, const void *buf, MPI_Count count,
                                MPI_Datatype datatype, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_all_c(fh, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_write_all(fh, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_write_all_c(fh, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_write_all_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_at_all_begin_c(MPI_File fh, MPI_Offset offset, const void *buf,
                                         MPI_Count count, MPI_Datatype datatype)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_at_all_begin_c(fh, offset, buf, count, datatype);
    if (FITS(count))
        return MPI_File_write_at_all_begin(fh, offset, buf, (int)count, datatype);
    if (!(DEV(buf)))
        return PMPI_File_write_at_all_begin_c(fh, offset, buf, count, datatype);
    static atomic_int once;
    return refuse("MPI_File_write_at_all_begin_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_at_all_c(MPI_File fh, MPI_Offset offset, const void *buf, MPI_Count count,
                                   MPI_Datatype datatype, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_at_all_c(fh, offset, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_write_at_all(fh, offset, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_write_at_all_c(fh, offset, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_write_at_all_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_at_c(MPI_File fh, MPI_Offset offset, const void *buf, MPI_Count count,
                               MPI_Datatype datatype, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_at_c(fh, offset, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_write_at(fh, offset, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_write_at_c(fh, offset, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_write_at_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_c(MPI_File fh, const void *buf, MPI_Count count, MPI_Datatype datatype,
                            MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_c(fh, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_write(fh, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_write_c(fh, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_write_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_ordered_begin_c(MPI_File fh, const void *buf, MPI_Count count,
                                          MPI_Datatype datatype)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_ordered_begin_c(fh, buf, count, datatype);
    if (FITS(count))
        return MPI_File_write_ordered_begin(fh, buf, (int)count, datatype);
    if (!(DEV(buf)))
        return PMPI_File_write_ordered_begin_c(fh, buf, count, datatype);
    static atomic_int once;
    return refuse("MPI_File_write_ordered_begin_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_ordered_c(MPI_File fh, const void *buf, MPI_Count count,
                                    MPI_Datatype datatype, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_ordered_c(fh, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_write_ordered(fh, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_write_ordered_c(fh, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_write_ordered_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_File_write_shared_c(MPI_File fh, const void *buf, MPI_Count count,
                                   MPI_Datatype datatype, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_File_write_shared_c(fh, buf, count, datatype, status);
    if (FITS(count))
        return MPI_File_write_shared(fh, buf, (int)count, datatype, status);
    if (!(DEV(buf)))
        return PMPI_File_write_shared_c(fh, buf, count, datatype, status);
    static atomic_int once;
    return refuse("MPI_File_write_shared_c", &once, TOO_BIG, ERR_FILE(fh));
}

EXPORT int MPI_Gather_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                        void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int root,
                        MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Gather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                             comm);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Gather(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                          root, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Gather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                             comm);
    static atomic_int once;
    return refuse("MPI_Gather_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Gather_init_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                             void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int root,
                             MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Gather_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                                  comm, info, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Gather_init(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                               root, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Gather_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                                  comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Gather_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Gatherv_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                         void *recvbuf, const MPI_Count recvcounts[], const MPI_Aint displs[],
                         MPI_Datatype recvtype, int root, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Gatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype,
                              root, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Gatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype,
                              root, comm);
    static atomic_int once;
    return refuse("MPI_Gatherv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Gatherv_init_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                              void *recvbuf, const MPI_Count recvcounts[], const MPI_Aint displs[],
                              MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Info info,
                              MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Gatherv_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                   recvtype, root, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Gatherv_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                   recvtype, root, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Gatherv_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Get_accumulate_c(const void *origin_addr, MPI_Count origin_count,
                                MPI_Datatype origin_datatype, void *result_addr,
                                MPI_Count result_count, MPI_Datatype result_datatype,
                                int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                                MPI_Datatype target_datatype, MPI_Op op, MPI_Win win)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Get_accumulate_c(origin_addr, origin_count, origin_datatype, result_addr,
                                     result_count, result_datatype, target_rank, target_disp,
                                     target_count, target_datatype, op, win);
    if (FITS(origin_count) && FITS(result_count) && FITS(target_count))
        return MPI_Get_accumulate(origin_addr, (int)origin_count, origin_datatype, result_addr,
                                  (int)result_count, result_datatype, target_rank, target_disp,
                                  (int)target_count, target_datatype, op, win);
    if (!(DEV(origin_addr) || DEV(result_addr)))
        return PMPI_Get_accumulate_c(origin_addr, origin_count, origin_datatype, result_addr,
                                     result_count, result_datatype, target_rank, target_disp,
                                     target_count, target_datatype, op, win);
    static atomic_int once;
    return refuse("MPI_Get_accumulate_c", &once, TOO_BIG, ERR_WIN(win));
}

EXPORT int MPI_Get_c(void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                     int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                     MPI_Datatype target_datatype, MPI_Win win)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Get_c(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                          target_count, target_datatype, win);
    if (FITS(origin_count) && FITS(target_count))
        return MPI_Get(origin_addr, (int)origin_count, origin_datatype, target_rank, target_disp,
                       (int)target_count, target_datatype, win);
    if (!(DEV(origin_addr)))
        return PMPI_Get_c(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                          target_count, target_datatype, win);
    static atomic_int once;
    return refuse("MPI_Get_c", &once, TOO_BIG, ERR_WIN(win));
}

EXPORT int MPI_Iallgather_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                            void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype,
                            MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Iallgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
                                 request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Iallgather(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                              comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Iallgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
                                 request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Iallgather_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Iallgatherv_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                             void *recvbuf, const MPI_Count recvcounts[], const MPI_Aint displs[],
                             MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Iallgatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                  recvtype, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Iallgatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                  recvtype, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Iallgatherv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Iallreduce_c(const void *sendbuf, void *recvbuf, MPI_Count count,
                            MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Iallreduce_c(sendbuf, recvbuf, count, datatype, op, comm, request);
    if (FITS(count))
        return MPI_Iallreduce(sendbuf, recvbuf, (int)count, datatype, op, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Iallreduce_c(sendbuf, recvbuf, count, datatype, op, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Iallreduce_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ialltoall_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                           void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, MPI_Comm comm,
                           MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ialltoall_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
                                request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Ialltoall(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                             comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ialltoall_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
                                request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ialltoall_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ialltoallv_c(const void *sendbuf, const MPI_Count sendcounts[],
                            const MPI_Aint sdispls[], MPI_Datatype sendtype, void *recvbuf,
                            const MPI_Count recvcounts[], const MPI_Aint rdispls[],
                            MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ialltoallv_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                                 rdispls, recvtype, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ialltoallv_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                                 rdispls, recvtype, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ialltoallv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Ialltoallw_c(const void *sendbuf, const MPI_Count sendcounts[],
                            const MPI_Aint sdispls[], const MPI_Datatype sendtypes[], void *recvbuf,
                            const MPI_Count recvcounts[], const MPI_Aint rdispls[],
                            const MPI_Datatype recvtypes[], MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ialltoallw_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts,
                                 rdispls, recvtypes, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ialltoallw_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts,
                                 rdispls, recvtypes, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ialltoallw_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Ibcast_c(void *buffer, MPI_Count count, MPI_Datatype datatype, int root,
                        MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ibcast_c(buffer, count, datatype, root, comm, request);
    if (FITS(count))
        return MPI_Ibcast(buffer, (int)count, datatype, root, comm, request);
    if (!(DEV(buffer)))
        return PMPI_Ibcast_c(buffer, count, datatype, root, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ibcast_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ibsend_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                        MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ibsend_c(buf, count, datatype, dest, tag, comm, request);
    if (FITS(count))
        return MPI_Ibsend(buf, (int)count, datatype, dest, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Ibsend_c(buf, count, datatype, dest, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ibsend_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Iexscan_c(const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
                         MPI_Op op, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Iexscan_c(sendbuf, recvbuf, count, datatype, op, comm, request);
    if (FITS(count))
        return MPI_Iexscan(sendbuf, recvbuf, (int)count, datatype, op, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Iexscan_c(sendbuf, recvbuf, count, datatype, op, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Iexscan_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Igather_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                         void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int root,
                         MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Igather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                              comm, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Igather(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                           root, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Igather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                              comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Igather_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Igatherv_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                          void *recvbuf, const MPI_Count recvcounts[], const MPI_Aint displs[],
                          MPI_Datatype recvtype, int root, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Igatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype,
                               root, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Igatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype,
                               root, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Igatherv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Imrecv_c(void *buf, MPI_Count count, MPI_Datatype datatype, MPI_Message *message,
                        MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Imrecv_c(buf, count, datatype, message, request);
    if (FITS(count))
        return MPI_Imrecv(buf, (int)count, datatype, message, request);
    if (!(DEV(buf)))
        return PMPI_Imrecv_c(buf, count, datatype, message, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Imrecv_c", &once, TOO_BIG, ERR_COMM(MPI_COMM_WORLD));
}

EXPORT int MPI_Ineighbor_allgather_c(const void *sendbuf, MPI_Count sendcount,
                                     MPI_Datatype sendtype, void *recvbuf, MPI_Count recvcount,
                                     MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ineighbor_allgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount,
                                          recvtype, comm, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Ineighbor_allgather(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount,
                                       recvtype, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ineighbor_allgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount,
                                          recvtype, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ineighbor_allgather_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ineighbor_allgatherv_c(const void *sendbuf, MPI_Count sendcount,
                                      MPI_Datatype sendtype, void *recvbuf,
                                      const MPI_Count recvcounts[], const MPI_Aint displs[],
                                      MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ineighbor_allgatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts,
                                           displs, recvtype, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ineighbor_allgatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts,
                                           displs, recvtype, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ineighbor_allgatherv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Ineighbor_alltoall_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                                    void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype,
                                    MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ineighbor_alltoall_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                         comm, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Ineighbor_alltoall(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount,
                                      recvtype, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ineighbor_alltoall_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                         comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ineighbor_alltoall_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ineighbor_alltoallv_c(const void *sendbuf, const MPI_Count sendcounts[],
                                     const MPI_Aint sdispls[], MPI_Datatype sendtype, void *recvbuf,
                                     const MPI_Count recvcounts[], const MPI_Aint rdispls[],
                                     MPI_Datatype recvtype, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ineighbor_alltoallv_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf,
                                          recvcounts, rdispls, recvtype, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ineighbor_alltoallv_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf,
                                          recvcounts, rdispls, recvtype, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ineighbor_alltoallv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Ineighbor_alltoallw_c(const void *sendbuf, const MPI_Count sendcounts[],
                                     const MPI_Aint sdispls[], const MPI_Datatype sendtypes[],
                                     void *recvbuf, const MPI_Count recvcounts[],
                                     const MPI_Aint rdispls[], const MPI_Datatype recvtypes[],
                                     MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ineighbor_alltoallw_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf,
                                          recvcounts, rdispls, recvtypes, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ineighbor_alltoallw_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf,
                                          recvcounts, rdispls, recvtypes, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ineighbor_alltoallw_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Irecv_c(void *buf, MPI_Count count, MPI_Datatype datatype, int source, int tag,
                       MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Irecv_c(buf, count, datatype, source, tag, comm, request);
    if (FITS(count))
        return MPI_Irecv(buf, (int)count, datatype, source, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Irecv_c(buf, count, datatype, source, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Irecv_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ireduce_c(const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
                         MPI_Op op, int root, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ireduce_c(sendbuf, recvbuf, count, datatype, op, root, comm, request);
    if (FITS(count))
        return MPI_Ireduce(sendbuf, recvbuf, (int)count, datatype, op, root, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ireduce_c(sendbuf, recvbuf, count, datatype, op, root, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ireduce_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ireduce_scatter_block_c(const void *sendbuf, void *recvbuf, MPI_Count recvcount,
                                       MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                       MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ireduce_scatter_block_c(sendbuf, recvbuf, recvcount, datatype, op, comm,
                                            request);
    if (FITS(recvcount))
        return MPI_Ireduce_scatter_block(sendbuf, recvbuf, (int)recvcount, datatype, op, comm,
                                         request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ireduce_scatter_block_c(sendbuf, recvbuf, recvcount, datatype, op, comm,
                                            request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ireduce_scatter_block_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ireduce_scatter_c(const void *sendbuf, void *recvbuf, const MPI_Count recvcounts[],
                                 MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                 MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ireduce_scatter_c(sendbuf, recvbuf, recvcounts, datatype, op, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Ireduce_scatter_c(sendbuf, recvbuf, recvcounts, datatype, op, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ireduce_scatter_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Irsend_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                        MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Irsend_c(buf, count, datatype, dest, tag, comm, request);
    if (FITS(count))
        return MPI_Irsend(buf, (int)count, datatype, dest, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Irsend_c(buf, count, datatype, dest, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Irsend_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Iscan_c(const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
                       MPI_Op op, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Iscan_c(sendbuf, recvbuf, count, datatype, op, comm, request);
    if (FITS(count))
        return MPI_Iscan(sendbuf, recvbuf, (int)count, datatype, op, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Iscan_c(sendbuf, recvbuf, count, datatype, op, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Iscan_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Iscatter_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                          void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int root,
                          MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Iscatter_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                               comm, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Iscatter(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                            root, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Iscatter_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                               comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Iscatter_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Iscatterv_c(const void *sendbuf, const MPI_Count sendcounts[],
                           const MPI_Aint displs[], MPI_Datatype sendtype, void *recvbuf,
                           MPI_Count recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm,
                           MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Iscatterv_c(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype,
                                root, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Iscatterv_c(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype,
                                root, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Iscatterv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Isend_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                       MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Isend_c(buf, count, datatype, dest, tag, comm, request);
    if (FITS(count))
        return MPI_Isend(buf, (int)count, datatype, dest, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Isend_c(buf, count, datatype, dest, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Isend_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Isendrecv_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                           int dest, int sendtag, void *recvbuf, MPI_Count recvcount,
                           MPI_Datatype recvtype, int source, int recvtag, MPI_Comm comm,
                           MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Isendrecv_c(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                                recvtype, source, recvtag, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Isendrecv_c(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                                recvtype, source, recvtag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Isendrecv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Isendrecv_replace_c(void *buf, MPI_Count count, MPI_Datatype datatype, int dest,
                                   int sendtag, int source, int recvtag, MPI_Comm comm,
                                   MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Isendrecv_replace_c(buf, count, datatype, dest, sendtag, source, recvtag, comm,
                                        request);
    if (!(DEV(buf)))
        return PMPI_Isendrecv_replace_c(buf, count, datatype, dest, sendtag, source, recvtag, comm,
                                        request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Isendrecv_replace_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Issend_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                        MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Issend_c(buf, count, datatype, dest, tag, comm, request);
    if (FITS(count))
        return MPI_Issend(buf, (int)count, datatype, dest, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Issend_c(buf, count, datatype, dest, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Issend_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Mrecv_c(void *buf, MPI_Count count, MPI_Datatype datatype, MPI_Message *message,
                       MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Mrecv_c(buf, count, datatype, message, status);
    if (FITS(count))
        return MPI_Mrecv(buf, (int)count, datatype, message, status);
    if (!(DEV(buf)))
        return PMPI_Mrecv_c(buf, count, datatype, message, status);
    static atomic_int once;
    return refuse("MPI_Mrecv_c", &once, TOO_BIG, ERR_COMM(MPI_COMM_WORLD));
}

EXPORT int MPI_Neighbor_allgather_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                                    void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype,
                                    MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_allgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                         comm);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Neighbor_allgather(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount,
                                      recvtype, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_allgather_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                         comm);
    static atomic_int once;
    return refuse("MPI_Neighbor_allgather_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_allgather_init_c(const void *sendbuf, MPI_Count sendcount,
                                         MPI_Datatype sendtype, void *recvbuf, MPI_Count recvcount,
                                         MPI_Datatype recvtype, MPI_Comm comm, MPI_Info info,
                                         MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_allgather_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount,
                                              recvtype, comm, info, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Neighbor_allgather_init(sendbuf, (int)sendcount, sendtype, recvbuf,
                                           (int)recvcount, recvtype, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_allgather_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount,
                                              recvtype, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Neighbor_allgather_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_allgatherv_c(const void *sendbuf, MPI_Count sendcount,
                                     MPI_Datatype sendtype, void *recvbuf,
                                     const MPI_Count recvcounts[], const MPI_Aint displs[],
                                     MPI_Datatype recvtype, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_allgatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                          recvtype, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_allgatherv_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                                          recvtype, comm);
    static atomic_int once;
    return refuse("MPI_Neighbor_allgatherv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_allgatherv_init_c(const void *sendbuf, MPI_Count sendcount,
                                          MPI_Datatype sendtype, void *recvbuf,
                                          const MPI_Count recvcounts[], const MPI_Aint displs[],
                                          MPI_Datatype recvtype, MPI_Comm comm, MPI_Info info,
                                          MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_allgatherv_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts,
                                               displs, recvtype, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_allgatherv_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcounts,
                                               displs, recvtype, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Neighbor_allgatherv_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_alltoall_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                                   void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype,
                                   MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_alltoall_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                        comm);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Neighbor_alltoall(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount,
                                     recvtype, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_alltoall_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                                        comm);
    static atomic_int once;
    return refuse("MPI_Neighbor_alltoall_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_alltoall_init_c(const void *sendbuf, MPI_Count sendcount,
                                        MPI_Datatype sendtype, void *recvbuf, MPI_Count recvcount,
                                        MPI_Datatype recvtype, MPI_Comm comm, MPI_Info info,
                                        MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_alltoall_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount,
                                             recvtype, comm, info, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Neighbor_alltoall_init(sendbuf, (int)sendcount, sendtype, recvbuf,
                                          (int)recvcount, recvtype, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_alltoall_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount,
                                             recvtype, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Neighbor_alltoall_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_alltoallv_c(const void *sendbuf, const MPI_Count sendcounts[],
                                    const MPI_Aint sdispls[], MPI_Datatype sendtype, void *recvbuf,
                                    const MPI_Count recvcounts[], const MPI_Aint rdispls[],
                                    MPI_Datatype recvtype, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_alltoallv_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf,
                                         recvcounts, rdispls, recvtype, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_alltoallv_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf,
                                         recvcounts, rdispls, recvtype, comm);
    static atomic_int once;
    return refuse("MPI_Neighbor_alltoallv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_alltoallv_init_c(const void *sendbuf, const MPI_Count sendcounts[],
                                         const MPI_Aint sdispls[], MPI_Datatype sendtype,
                                         void *recvbuf, const MPI_Count recvcounts[],
                                         const MPI_Aint rdispls[], MPI_Datatype recvtype,
                                         MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_alltoallv_init_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf,
                                              recvcounts, rdispls, recvtype, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_alltoallv_init_c(sendbuf, sendcounts, sdispls, sendtype, recvbuf,
                                              recvcounts, rdispls, recvtype, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Neighbor_alltoallv_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_alltoallw_c(const void *sendbuf, const MPI_Count sendcounts[],
                                    const MPI_Aint sdispls[], const MPI_Datatype sendtypes[],
                                    void *recvbuf, const MPI_Count recvcounts[],
                                    const MPI_Aint rdispls[], const MPI_Datatype recvtypes[],
                                    MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_alltoallw_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf,
                                         recvcounts, rdispls, recvtypes, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_alltoallw_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf,
                                         recvcounts, rdispls, recvtypes, comm);
    static atomic_int once;
    return refuse("MPI_Neighbor_alltoallw_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Neighbor_alltoallw_init_c(const void *sendbuf, const MPI_Count sendcounts[],
                                         const MPI_Aint sdispls[], const MPI_Datatype sendtypes[],
                                         void *recvbuf, const MPI_Count recvcounts[],
                                         const MPI_Aint rdispls[], const MPI_Datatype recvtypes[],
                                         MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Neighbor_alltoallw_init_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf,
                                              recvcounts, rdispls, recvtypes, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Neighbor_alltoallw_init_c(sendbuf, sendcounts, sdispls, sendtypes, recvbuf,
                                              recvcounts, rdispls, recvtypes, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Neighbor_alltoallw_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Pack_c(const void *inbuf, MPI_Count incount, MPI_Datatype datatype, void *outbuf,
                      MPI_Count outsize, MPI_Count *position, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Pack_c(inbuf, incount, datatype, outbuf, outsize, position, comm);
    if (FITS(incount) && FITS(outsize) && FITS(*position)) {
        int i_position = (int)*position;
        int rc = MPI_Pack(inbuf, (int)incount, datatype, outbuf, (int)outsize, &i_position, comm);
        *position = i_position;
        return rc;
    }
    if (!(DEV(inbuf) || DEV(outbuf)))
        return PMPI_Pack_c(inbuf, incount, datatype, outbuf, outsize, position, comm);
    static atomic_int once;
    return refuse("MPI_Pack_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Pack_external_c(const char *datarep, const void *inbuf, MPI_Count incount,
                               MPI_Datatype datatype, void *outbuf, MPI_Count outsize,
                               MPI_Count *position)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Pack_external_c(datarep, inbuf, incount, datatype, outbuf, outsize, position);
    if (FITS(incount) && FITS(outsize) && FITS(*position)) {
        MPI_Aint i_position = (MPI_Aint)*position;
        int rc =
            MPI_Pack_external(datarep, inbuf, (int)incount, datatype, outbuf, outsize, &i_position);
        *position = i_position;
        return rc;
    }
    if (!(DEV(inbuf) || DEV(outbuf)))
        return PMPI_Pack_external_c(datarep, inbuf, incount, datatype, outbuf, outsize, position);
    static atomic_int once;
    return refuse("MPI_Pack_external_c", &once, TOO_BIG, ERR_COMM(MPI_COMM_WORLD));
}

EXPORT int MPI_Put_c(const void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                     int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                     MPI_Datatype target_datatype, MPI_Win win)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Put_c(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                          target_count, target_datatype, win);
    if (FITS(origin_count) && FITS(target_count))
        return MPI_Put(origin_addr, (int)origin_count, origin_datatype, target_rank, target_disp,
                       (int)target_count, target_datatype, win);
    if (!(DEV(origin_addr)))
        return PMPI_Put_c(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                          target_count, target_datatype, win);
    static atomic_int once;
    return refuse("MPI_Put_c", &once, TOO_BIG, ERR_WIN(win));
}

EXPORT int MPI_Raccumulate_c(const void *origin_addr, MPI_Count origin_count,
                             MPI_Datatype origin_datatype, int target_rank, MPI_Aint target_disp,
                             MPI_Count target_count, MPI_Datatype target_datatype, MPI_Op op,
                             MPI_Win win, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Raccumulate_c(origin_addr, origin_count, origin_datatype, target_rank,
                                  target_disp, target_count, target_datatype, op, win, request);
    if (FITS(origin_count) && FITS(target_count))
        return MPI_Raccumulate(origin_addr, (int)origin_count, origin_datatype, target_rank,
                               target_disp, (int)target_count, target_datatype, op, win, request);
    if (!(DEV(origin_addr)))
        return PMPI_Raccumulate_c(origin_addr, origin_count, origin_datatype, target_rank,
                                  target_disp, target_count, target_datatype, op, win, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Raccumulate_c", &once, TOO_BIG, ERR_WIN(win));
}

EXPORT int MPI_Recv_c(void *buf, MPI_Count count, MPI_Datatype datatype, int source, int tag,
                      MPI_Comm comm, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Recv_c(buf, count, datatype, source, tag, comm, status);
    if (FITS(count))
        return MPI_Recv(buf, (int)count, datatype, source, tag, comm, status);
    if (!(DEV(buf)))
        return PMPI_Recv_c(buf, count, datatype, source, tag, comm, status);
    static atomic_int once;
    return refuse("MPI_Recv_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Recv_init_c(void *buf, MPI_Count count, MPI_Datatype datatype, int source, int tag,
                           MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Recv_init_c(buf, count, datatype, source, tag, comm, request);
    if (FITS(count))
        return MPI_Recv_init(buf, (int)count, datatype, source, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Recv_init_c(buf, count, datatype, source, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Recv_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Reduce_c(const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
                        MPI_Op op, int root, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Reduce_c(sendbuf, recvbuf, count, datatype, op, root, comm);
    if (FITS(count))
        return MPI_Reduce(sendbuf, recvbuf, (int)count, datatype, op, root, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Reduce_c(sendbuf, recvbuf, count, datatype, op, root, comm);
    static atomic_int once;
    return refuse("MPI_Reduce_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Reduce_init_c(const void *sendbuf, void *recvbuf, MPI_Count count,
                             MPI_Datatype datatype, MPI_Op op, int root, MPI_Comm comm,
                             MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Reduce_init_c(sendbuf, recvbuf, count, datatype, op, root, comm, info, request);
    if (FITS(count))
        return MPI_Reduce_init(sendbuf, recvbuf, (int)count, datatype, op, root, comm, info,
                               request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Reduce_init_c(sendbuf, recvbuf, count, datatype, op, root, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Reduce_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Reduce_local_c(const void *inbuf, void *inoutbuf, MPI_Count count,
                              MPI_Datatype datatype, MPI_Op op)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Reduce_local_c(inbuf, inoutbuf, count, datatype, op);
    if (FITS(count))
        return MPI_Reduce_local(inbuf, inoutbuf, (int)count, datatype, op);
    if (!(DEV(inbuf) || DEV(inoutbuf)))
        return PMPI_Reduce_local_c(inbuf, inoutbuf, count, datatype, op);
    static atomic_int once;
    return refuse("MPI_Reduce_local_c", &once, TOO_BIG, ERR_COMM(MPI_COMM_WORLD));
}

EXPORT int MPI_Reduce_scatter_block_c(const void *sendbuf, void *recvbuf, MPI_Count recvcount,
                                      MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Reduce_scatter_block_c(sendbuf, recvbuf, recvcount, datatype, op, comm);
    if (FITS(recvcount))
        return MPI_Reduce_scatter_block(sendbuf, recvbuf, (int)recvcount, datatype, op, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Reduce_scatter_block_c(sendbuf, recvbuf, recvcount, datatype, op, comm);
    static atomic_int once;
    return refuse("MPI_Reduce_scatter_block_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Reduce_scatter_block_init_c(const void *sendbuf, void *recvbuf, MPI_Count recvcount,
                                           MPI_Datatype datatype, MPI_Op op, MPI_Comm comm,
                                           MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Reduce_scatter_block_init_c(sendbuf, recvbuf, recvcount, datatype, op, comm,
                                                info, request);
    if (FITS(recvcount))
        return MPI_Reduce_scatter_block_init(sendbuf, recvbuf, (int)recvcount, datatype, op, comm,
                                             info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Reduce_scatter_block_init_c(sendbuf, recvbuf, recvcount, datatype, op, comm,
                                                info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Reduce_scatter_block_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Reduce_scatter_c(const void *sendbuf, void *recvbuf, const MPI_Count recvcounts[],
                                MPI_Datatype datatype, MPI_Op op, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Reduce_scatter_c(sendbuf, recvbuf, recvcounts, datatype, op, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Reduce_scatter_c(sendbuf, recvbuf, recvcounts, datatype, op, comm);
    static atomic_int once;
    return refuse("MPI_Reduce_scatter_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Reduce_scatter_init_c(const void *sendbuf, void *recvbuf,
                                     const MPI_Count recvcounts[], MPI_Datatype datatype, MPI_Op op,
                                     MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Reduce_scatter_init_c(sendbuf, recvbuf, recvcounts, datatype, op, comm, info,
                                          request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Reduce_scatter_init_c(sendbuf, recvbuf, recvcounts, datatype, op, comm, info,
                                          request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Reduce_scatter_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Rget_accumulate_c(const void *origin_addr, MPI_Count origin_count,
                                 MPI_Datatype origin_datatype, void *result_addr,
                                 MPI_Count result_count, MPI_Datatype result_datatype,
                                 int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                                 MPI_Datatype target_datatype, MPI_Op op, MPI_Win win,
                                 MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Rget_accumulate_c(origin_addr, origin_count, origin_datatype, result_addr,
                                      result_count, result_datatype, target_rank, target_disp,
                                      target_count, target_datatype, op, win, request);
    if (FITS(origin_count) && FITS(result_count) && FITS(target_count))
        return MPI_Rget_accumulate(origin_addr, (int)origin_count, origin_datatype, result_addr,
                                   (int)result_count, result_datatype, target_rank, target_disp,
                                   (int)target_count, target_datatype, op, win, request);
    if (!(DEV(origin_addr) || DEV(result_addr)))
        return PMPI_Rget_accumulate_c(origin_addr, origin_count, origin_datatype, result_addr,
                                      result_count, result_datatype, target_rank, target_disp,
                                      target_count, target_datatype, op, win, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Rget_accumulate_c", &once, TOO_BIG, ERR_WIN(win));
}

EXPORT int MPI_Rget_c(void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                      int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                      MPI_Datatype target_datatype, MPI_Win win, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Rget_c(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                           target_count, target_datatype, win, request);
    if (FITS(origin_count) && FITS(target_count))
        return MPI_Rget(origin_addr, (int)origin_count, origin_datatype, target_rank, target_disp,
                        (int)target_count, target_datatype, win, request);
    if (!(DEV(origin_addr)))
        return PMPI_Rget_c(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                           target_count, target_datatype, win, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Rget_c", &once, TOO_BIG, ERR_WIN(win));
}

EXPORT int MPI_Rput_c(const void *origin_addr, MPI_Count origin_count, MPI_Datatype origin_datatype,
                      int target_rank, MPI_Aint target_disp, MPI_Count target_count,
                      MPI_Datatype target_datatype, MPI_Win win, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Rput_c(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                           target_count, target_datatype, win, request);
    if (FITS(origin_count) && FITS(target_count))
        return MPI_Rput(origin_addr, (int)origin_count, origin_datatype, target_rank, target_disp,
                        (int)target_count, target_datatype, win, request);
    if (!(DEV(origin_addr)))
        return PMPI_Rput_c(origin_addr, origin_count, origin_datatype, target_rank, target_disp,
                           target_count, target_datatype, win, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Rput_c", &once, TOO_BIG, ERR_WIN(win));
}

EXPORT int MPI_Rsend_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                       MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Rsend_c(buf, count, datatype, dest, tag, comm);
    if (FITS(count))
        return MPI_Rsend(buf, (int)count, datatype, dest, tag, comm);
    if (!(DEV(buf)))
        return PMPI_Rsend_c(buf, count, datatype, dest, tag, comm);
    static atomic_int once;
    return refuse("MPI_Rsend_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Rsend_init_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest,
                            int tag, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Rsend_init_c(buf, count, datatype, dest, tag, comm, request);
    if (FITS(count))
        return MPI_Rsend_init(buf, (int)count, datatype, dest, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Rsend_init_c(buf, count, datatype, dest, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Rsend_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Scan_c(const void *sendbuf, void *recvbuf, MPI_Count count, MPI_Datatype datatype,
                      MPI_Op op, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Scan_c(sendbuf, recvbuf, count, datatype, op, comm);
    if (FITS(count))
        return MPI_Scan(sendbuf, recvbuf, (int)count, datatype, op, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Scan_c(sendbuf, recvbuf, count, datatype, op, comm);
    static atomic_int once;
    return refuse("MPI_Scan_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Scan_init_c(const void *sendbuf, void *recvbuf, MPI_Count count,
                           MPI_Datatype datatype, MPI_Op op, MPI_Comm comm, MPI_Info info,
                           MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Scan_init_c(sendbuf, recvbuf, count, datatype, op, comm, info, request);
    if (FITS(count))
        return MPI_Scan_init(sendbuf, recvbuf, (int)count, datatype, op, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Scan_init_c(sendbuf, recvbuf, count, datatype, op, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Scan_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Scatter_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                         void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int root,
                         MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Scatter_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                              comm);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Scatter(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount, recvtype,
                           root, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Scatter_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                              comm);
    static atomic_int once;
    return refuse("MPI_Scatter_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Scatter_init_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype,
                              void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype, int root,
                              MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Scatter_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                                   comm, info, request);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Scatter_init(sendbuf, (int)sendcount, sendtype, recvbuf, (int)recvcount,
                                recvtype, root, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Scatter_init_c(sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                                   comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Scatter_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Scatterv_c(const void *sendbuf, const MPI_Count sendcounts[],
                          const MPI_Aint displs[], MPI_Datatype sendtype, void *recvbuf,
                          MPI_Count recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Scatterv_c(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype,
                               root, comm);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Scatterv_c(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount, recvtype,
                               root, comm);
    static atomic_int once;
    return refuse("MPI_Scatterv_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Scatterv_init_c(const void *sendbuf, const MPI_Count sendcounts[],
                               const MPI_Aint displs[], MPI_Datatype sendtype, void *recvbuf,
                               MPI_Count recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm,
                               MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Scatterv_init_c(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount,
                                    recvtype, root, comm, info, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Scatterv_init_c(sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount,
                                    recvtype, root, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Scatterv_init_c", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Send_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                      MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Send_c(buf, count, datatype, dest, tag, comm);
    if (FITS(count))
        return MPI_Send(buf, (int)count, datatype, dest, tag, comm);
    if (!(DEV(buf)))
        return PMPI_Send_c(buf, count, datatype, dest, tag, comm);
    static atomic_int once;
    return refuse("MPI_Send_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Send_init_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest,
                           int tag, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Send_init_c(buf, count, datatype, dest, tag, comm, request);
    if (FITS(count))
        return MPI_Send_init(buf, (int)count, datatype, dest, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Send_init_c(buf, count, datatype, dest, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Send_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Sendrecv_c(const void *sendbuf, MPI_Count sendcount, MPI_Datatype sendtype, int dest,
                          int sendtag, void *recvbuf, MPI_Count recvcount, MPI_Datatype recvtype,
                          int source, int recvtag, MPI_Comm comm, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Sendrecv_c(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                               recvtype, source, recvtag, comm, status);
    if (FITS(sendcount) && FITS(recvcount))
        return MPI_Sendrecv(sendbuf, (int)sendcount, sendtype, dest, sendtag, recvbuf,
                            (int)recvcount, recvtype, source, recvtag, comm, status);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Sendrecv_c(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                               recvtype, source, recvtag, comm, status);
    static atomic_int once;
    return refuse("MPI_Sendrecv_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Sendrecv_replace_c(void *buf, MPI_Count count, MPI_Datatype datatype, int dest,
                                  int sendtag, int source, int recvtag, MPI_Comm comm,
                                  MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Sendrecv_replace_c(buf, count, datatype, dest, sendtag, source, recvtag, comm,
                                       status);
    if (FITS(count))
        return MPI_Sendrecv_replace(buf, (int)count, datatype, dest, sendtag, source, recvtag, comm,
                                    status);
    if (!(DEV(buf)))
        return PMPI_Sendrecv_replace_c(buf, count, datatype, dest, sendtag, source, recvtag, comm,
                                       status);
    static atomic_int once;
    return refuse("MPI_Sendrecv_replace_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ssend_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest, int tag,
                       MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ssend_c(buf, count, datatype, dest, tag, comm);
    if (FITS(count))
        return MPI_Ssend(buf, (int)count, datatype, dest, tag, comm);
    if (!(DEV(buf)))
        return PMPI_Ssend_c(buf, count, datatype, dest, tag, comm);
    static atomic_int once;
    return refuse("MPI_Ssend_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Ssend_init_c(const void *buf, MPI_Count count, MPI_Datatype datatype, int dest,
                            int tag, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Ssend_init_c(buf, count, datatype, dest, tag, comm, request);
    if (FITS(count))
        return MPI_Ssend_init(buf, (int)count, datatype, dest, tag, comm, request);
    if (!(DEV(buf)))
        return PMPI_Ssend_init_c(buf, count, datatype, dest, tag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Ssend_init_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Unpack_c(const void *inbuf, MPI_Count insize, MPI_Count *position, void *outbuf,
                        MPI_Count outcount, MPI_Datatype datatype, MPI_Comm comm)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Unpack_c(inbuf, insize, position, outbuf, outcount, datatype, comm);
    if (FITS(insize) && FITS(outcount) && FITS(*position)) {
        int i_position = (int)*position;
        int rc = MPI_Unpack(inbuf, (int)insize, &i_position, outbuf, (int)outcount, datatype, comm);
        *position = i_position;
        return rc;
    }
    if (!(DEV(inbuf) || DEV(outbuf)))
        return PMPI_Unpack_c(inbuf, insize, position, outbuf, outcount, datatype, comm);
    static atomic_int once;
    return refuse("MPI_Unpack_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Unpack_external_c(const char datarep[], const void *inbuf, MPI_Count insize,
                                 MPI_Count *position, void *outbuf, MPI_Count outcount,
                                 MPI_Datatype datatype)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Unpack_external_c(datarep, inbuf, insize, position, outbuf, outcount, datatype);
    if (FITS(insize) && FITS(outcount) && FITS(*position)) {
        MPI_Aint i_position = (MPI_Aint)*position;
        int rc = MPI_Unpack_external(datarep, inbuf, insize, &i_position, outbuf, (int)outcount,
                                     datatype);
        *position = i_position;
        return rc;
    }
    if (!(DEV(inbuf) || DEV(outbuf)))
        return PMPI_Unpack_external_c(datarep, inbuf, insize, position, outbuf, outcount, datatype);
    static atomic_int once;
    return refuse("MPI_Unpack_external_c", &once, TOO_BIG, ERR_COMM(MPI_COMM_WORLD));
}

EXPORT int MPI_Win_create_c(void *base, MPI_Aint size, MPI_Aint disp_unit, MPI_Info info,
                            MPI_Comm comm, MPI_Win *win)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Win_create_c(base, size, disp_unit, info, comm, win);
    if (FITS(disp_unit))
        return MPI_Win_create(base, size, (int)disp_unit, info, comm, win);
    if (!(DEV(base)))
        return PMPI_Win_create_c(base, size, disp_unit, info, comm, win);
    static atomic_int once;
    *win = MPI_WIN_NULL;
    return refuse("MPI_Win_create_c", &once, TOO_BIG, ERR_COMM(comm));
}

EXPORT int MPI_Isendrecv(const void *sendbuf, int sendcount, MPI_Datatype sendtype, int dest,
                         int sendtag, void *recvbuf, int recvcount, MPI_Datatype recvtype,
                         int source, int recvtag, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Isendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                              recvtype, source, recvtag, comm, request);
    if (!(DEV(sendbuf) || DEV(recvbuf)))
        return PMPI_Isendrecv(sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount,
                              recvtype, source, recvtag, comm, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Isendrecv", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Isendrecv_replace(void *buf, int count, MPI_Datatype datatype, int dest, int sendtag,
                                 int source, int recvtag, MPI_Comm comm, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Isendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm,
                                      request);
    if (!(DEV(buf)))
        return PMPI_Isendrecv_replace(buf, count, datatype, dest, sendtag, source, recvtag, comm,
                                      request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Isendrecv_replace", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Psend_init(const void *buf, int partitions, MPI_Count count, MPI_Datatype datatype,
                          int dest, int tag, MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Psend_init(buf, partitions, count, datatype, dest, tag, comm, info, request);
    if (!(DEV(buf)))
        return PMPI_Psend_init(buf, partitions, count, datatype, dest, tag, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Psend_init", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Precv_init(void *buf, int partitions, MPI_Count count, MPI_Datatype datatype,
                          int dest, int tag, MPI_Comm comm, MPI_Info info, MPI_Request *request)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Precv_init(buf, partitions, count, datatype, dest, tag, comm, info, request);
    if (!(DEV(buf)))
        return PMPI_Precv_init(buf, partitions, count, datatype, dest, tag, comm, info, request);
    static atomic_int once;
    *request = MPI_REQUEST_NULL;
    return refuse("MPI_Precv_init", &once, NOT_COVERED, ERR_COMM(comm));
}

EXPORT int MPI_Buffer_attach(void *buffer, int size)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Buffer_attach(buffer, size);
    if (!(DEV(buffer)))
        return PMPI_Buffer_attach(buffer, size);
    static atomic_int once;
    return refuse("MPI_Buffer_attach", &once, NOT_COVERED, ERR_COMM(MPI_COMM_WORLD));
}

#endif /* MPI_VERSION >= 4 */
