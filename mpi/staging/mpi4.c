/* Staging, MPI_Buffer_attach (a device buffer refused: MPI writes it) and
 * the MPI 4 calls that take a buffer and that the plugin does not stage
 * itself (MPICH 4; Open MPI 4 has none of them):
 *
 *   - the large-count forms (MPI_Send_c ... MPI_File_write_c): while every
 *     count fits an int (and a Pack position, a window's disp_unit), the
 *     call is the plugin's int form, staged as that one is; a device buffer
 *     with a larger count is refused (MPI_ERR_COUNT);
 *   - the large-count forms with count or displacement arrays (the v- and
 *     w-collectives), MPI_Isendrecv(_replace)(_c), partitioned
 *     communication (MPI_Psend_init, MPI_Precv_init) and MPI_Buffer_attach:
 *     a device buffer is refused (MPI_ERR_BUFFER).
 *
 * Each refusal goes through the communicator's (window's, file's) error
 * handler, with one line per rank and call. Host buffers go to MPI as they
 * are. The hooks come in families of one parameter list each (a call, its
 * nonblocking form, its persistent form). */
#include "staging.h"

#include <limits.h>
#include <stdatomic.h>

#define EXPORT RK_MPI_EXPORT

#define FITS(x) ((x) >= INT_MIN && (x) <= INT_MAX)
#define DEV(p) ((p) != NULL && (const void *)(p) != MPI_IN_PLACE && rk_stg_is_device(p))
#define I(x) ((int)(x))

enum { TOO_BIG, NOT_COVERED };

/* Where a refusal goes: the call's communicator, window or file. */
typedef struct {
    int kind;
    MPI_Comm comm;
    MPI_Win win;
    MPI_File fh;
} eh_t;
#define ON_COMM(c) ((eh_t){.kind = 0, .comm = (c)})
#define ON_WIN(w) ((eh_t){.kind = 1, .win = (w)})
#define ON_FILE(f) ((eh_t){.kind = 2, .fh = (f)})

static int refuse(const char *call, atomic_int *once, int why, eh_t eh)
{
    int err = why == TOO_BIG ? MPI_ERR_COUNT : MPI_ERR_BUFFER;
    if (!atomic_exchange(once, 1)) {
        if (why == TOO_BIG)
            rk_mpi_warn("staging: %s: a device buffer with a count above INT_MAX is not "
                        "staged; refused (MPI_ERR_COUNT)",
                        call);
        else
            rk_mpi_warn("staging: %s with a device buffer is not staged by the plugin "
                        "(docs/staging.md, \"Not covered\"); refused (MPI_ERR_BUFFER)",
                        call);
    }
    if (eh.kind == 0)
        PMPI_Comm_call_errhandler(eh.comm, err);
    else if (eh.kind == 1)
        PMPI_Win_call_errhandler(eh.win, err);
    else
        PMPI_File_call_errhandler(eh.fh, err);
    return err;
}

#define ARGS(...) __VA_ARGS__

/* One hook: MPI's own call while staging is off; the plugin's int form
 * (call) while fits; MPI's own for host buffers; else refused, why being
 * TOO_BIG or NOT_COVERED (no int form: fits and call 0). out: what a
 * refusal sets (a request, a window). */
#define HOOK(Name, params, args, fits, call, dev, eh, out, why)                                  \
    EXPORT int Name(ARGS params)                                                                 \
    {                                                                                            \
        if (RK_STG_LIKELY(!rk_stg_active))                                                       \
            return P##Name(ARGS args);                                                           \
        if (fits)                                                                                \
            return call;                                                                         \
        if (!(dev))                                                                              \
            return P##Name(ARGS args);                                                           \
        static atomic_int once;                                                                  \
        out;                                                                                     \
        return refuse(#Name, &once, why, eh);                                                    \
    }

/* The trailing parameters of the forms of a family: none, a request (the
 * nonblocking forms), info and a request (the persistent ones). */
#define PLAIN_P
#define PLAIN_A
#define PLAIN_OUT (void)0
#define NB_P , MPI_Request *req
#define NB_A , req
#define NB_OUT *req = MPI_REQUEST_NULL
#define PERS_P , MPI_Info info, MPI_Request *req
#define PERS_A , info, req
#define PERS_OUT *req = MPI_REQUEST_NULL

/* MPI's buffer for buffered sends (any MPI version): MPI writes it itself. */
HOOK(MPI_Buffer_attach, (void *buffer, int size), (buffer, size), 0, 0, DEV(buffer),
     ON_COMM(MPI_COMM_WORLD), (void)0, NOT_COVERED)

#if MPI_VERSION >= 4

/* ---- point to point ---- */

#define SEND(Name, Int, T)                                                                       \
    HOOK(Name, (const void *buf, MPI_Count count, MPI_Datatype dt, int dest, int tag,            \
                MPI_Comm comm T##_P),                                                           \
         (buf, count, dt, dest, tag, comm T##_A), FITS(count),                                   \
         Int(buf, I(count), dt, dest, tag, comm T##_A), DEV(buf), ON_COMM(comm), T##_OUT, TOO_BIG)
SEND(MPI_Send_c, MPI_Send, PLAIN)
SEND(MPI_Ssend_c, MPI_Ssend, PLAIN)
SEND(MPI_Rsend_c, MPI_Rsend, PLAIN)
SEND(MPI_Bsend_c, MPI_Bsend, PLAIN)
SEND(MPI_Isend_c, MPI_Isend, NB)
SEND(MPI_Issend_c, MPI_Issend, NB)
SEND(MPI_Irsend_c, MPI_Irsend, NB)
SEND(MPI_Ibsend_c, MPI_Ibsend, NB)
SEND(MPI_Send_init_c, MPI_Send_init, NB)
SEND(MPI_Ssend_init_c, MPI_Ssend_init, NB)
SEND(MPI_Rsend_init_c, MPI_Rsend_init, NB)
SEND(MPI_Bsend_init_c, MPI_Bsend_init, NB)

#define STATUS_P , MPI_Status *st
#define STATUS_A , st
#define STATUS_OUT (void)0
#define RECV(Name, Int, T)                                                                       \
    HOOK(Name, (void *buf, MPI_Count count, MPI_Datatype dt, int src, int tag,                  \
                MPI_Comm comm T##_P),                                                           \
         (buf, count, dt, src, tag, comm T##_A), FITS(count),                                    \
         Int(buf, I(count), dt, src, tag, comm T##_A), DEV(buf), ON_COMM(comm), T##_OUT, TOO_BIG)
RECV(MPI_Recv_c, MPI_Recv, STATUS)
RECV(MPI_Irecv_c, MPI_Irecv, NB)
RECV(MPI_Recv_init_c, MPI_Recv_init, NB)

/* Matched receives: no communicator (the world's handler). */
#define MRECV(Name, Int, T)                                                                      \
    HOOK(Name, (void *buf, MPI_Count count, MPI_Datatype dt, MPI_Message *msg T##_P),            \
         (buf, count, dt, msg T##_A), FITS(count), Int(buf, I(count), dt, msg T##_A), DEV(buf),  \
         ON_COMM(MPI_COMM_WORLD), T##_OUT, TOO_BIG)
MRECV(MPI_Mrecv_c, MPI_Mrecv, STATUS)
MRECV(MPI_Imrecv_c, MPI_Imrecv, NB)

#define SENDRECV(Name, Int, T)                                                                   \
    HOOK(Name, (const void *sbuf, MPI_Count scount, MPI_Datatype stype, int dest, int stag,      \
                void *rbuf, MPI_Count rcount, MPI_Datatype rtype, int src, int rtag,             \
                MPI_Comm comm T##_P),                                                           \
         (sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm T##_A),          \
         FITS(scount) && FITS(rcount),                                               \
         Int(sbuf, I(scount), stype, dest, stag, rbuf, I(rcount), rtype, src, rtag, comm T##_A), \
         DEV(sbuf) || DEV(rbuf), ON_COMM(comm), T##_OUT, TOO_BIG)
#define SENDRECV_REPLACE(Name, Int, T)                                                           \
    HOOK(Name, (void *buf, MPI_Count count, MPI_Datatype dt, int dest, int stag, int src,        \
                int rtag, MPI_Comm comm T##_P),                                                  \
         (buf, count, dt, dest, stag, src, rtag, comm T##_A), FITS(count),           \
         Int(buf, I(count), dt, dest, stag, src, rtag, comm T##_A), DEV(buf), ON_COMM(comm),     \
         T##_OUT, TOO_BIG)
SENDRECV(MPI_Sendrecv_c, MPI_Sendrecv, STATUS)
SENDRECV_REPLACE(MPI_Sendrecv_replace_c, MPI_Sendrecv_replace, STATUS)

/* ---- calls without an int form of the plugin's: device buffers refused ---- */

/* (MPI_Isendrecv and MPI_Isendrecv_replace have int counts already.) */
#define ISENDRECV(Name, CountT)                                                                  \
    HOOK(Name, (const void *sbuf, CountT scount, MPI_Datatype stype, int dest, int stag,         \
                void *rbuf, CountT rcount, MPI_Datatype rtype, int src, int rtag, MPI_Comm comm, \
                MPI_Request *req),                                                              \
         (sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm, req), 0,        \
         0, DEV(sbuf) || DEV(rbuf), ON_COMM(comm), *req = MPI_REQUEST_NULL, NOT_COVERED)
#define ISENDRECV_REPLACE(Name, CountT)                                                          \
    HOOK(Name, (void *buf, CountT count, MPI_Datatype dt, int dest, int stag, int src, int rtag, \
                MPI_Comm comm, MPI_Request *req),                                                \
         (buf, count, dt, dest, stag, src, rtag, comm, req), 0, 0, DEV(buf), ON_COMM(comm),      \
         *req = MPI_REQUEST_NULL, NOT_COVERED)
ISENDRECV(MPI_Isendrecv, int)
ISENDRECV(MPI_Isendrecv_c, MPI_Count)
ISENDRECV_REPLACE(MPI_Isendrecv_replace, int)
ISENDRECV_REPLACE(MPI_Isendrecv_replace_c, MPI_Count)

/* Partitioned communication. */
HOOK(MPI_Psend_init,
     (const void *buf, int partitions, MPI_Count count, MPI_Datatype dt, int dest, int tag,
      MPI_Comm comm, MPI_Info info, MPI_Request *req),
     (buf, partitions, count, dt, dest, tag, comm, info, req), 0, 0, DEV(buf), ON_COMM(comm),
     *req = MPI_REQUEST_NULL, NOT_COVERED)
HOOK(MPI_Precv_init,
     (void *buf, int partitions, MPI_Count count, MPI_Datatype dt, int src, int tag,
      MPI_Comm comm, MPI_Info info, MPI_Request *req),
     (buf, partitions, count, dt, src, tag, comm, info, req), 0, 0, DEV(buf), ON_COMM(comm),
     *req = MPI_REQUEST_NULL, NOT_COVERED)

HOOK(MPI_Buffer_attach_c, (void *buffer, MPI_Count size), (buffer, size), 0, 0, DEV(buffer),
     ON_COMM(MPI_COMM_WORLD), (void)0, NOT_COVERED)

/* ---- collectives: the int forms are the hooks of staging/coll.c ---- */

/* Each family's three forms: blocking, nonblocking (I...), persistent (..._init). */
#define FAMILY(F, Base, base)                                                                    \
    F(MPI_##Base##_c, MPI_##Base, PLAIN)                                                         \
    F(MPI_I##base##_c, MPI_I##base, NB)                                                          \
    F(MPI_##Base##_init_c, MPI_##Base##_init, PERS)

#define BCAST(Name, Int, T)                                                                      \
    HOOK(Name, (void *buf, MPI_Count count, MPI_Datatype dt, int root, MPI_Comm comm T##_P),     \
         (buf, count, dt, root, comm T##_A), FITS(count),                                        \
         Int(buf, I(count), dt, root, comm T##_A), DEV(buf), ON_COMM(comm), T##_OUT, TOO_BIG)
FAMILY(BCAST, Bcast, bcast)

#define REDUCE(Name, Int, T)                                                                     \
    HOOK(Name, (const void *sbuf, void *rbuf, MPI_Count count, MPI_Datatype dt, MPI_Op op,       \
                int root, MPI_Comm comm T##_P),                                                  \
         (sbuf, rbuf, count, dt, op, root, comm T##_A), FITS(count),                             \
         Int(sbuf, rbuf, I(count), dt, op, root, comm T##_A), DEV(sbuf) || DEV(rbuf),            \
         ON_COMM(comm), T##_OUT, TOO_BIG)
FAMILY(REDUCE, Reduce, reduce)

/* Allreduce, Scan, Exscan and Reduce_scatter_block: one count, no root. */
#define ALLREDUCE(Name, Int, T)                                                                  \
    HOOK(Name, (const void *sbuf, void *rbuf, MPI_Count count, MPI_Datatype dt, MPI_Op op,       \
                MPI_Comm comm T##_P),                                                           \
         (sbuf, rbuf, count, dt, op, comm T##_A), FITS(count),                                   \
         Int(sbuf, rbuf, I(count), dt, op, comm T##_A), DEV(sbuf) || DEV(rbuf), ON_COMM(comm),   \
         T##_OUT, TOO_BIG)
FAMILY(ALLREDUCE, Allreduce, allreduce)
FAMILY(ALLREDUCE, Scan, scan)
FAMILY(ALLREDUCE, Exscan, exscan)
FAMILY(ALLREDUCE, Reduce_scatter_block, reduce_scatter_block)

/* Gather and Scatter: counts each side and a root. */
#define ROOTED(Name, Int, T)                                                                     \
    HOOK(Name, (const void *sbuf, MPI_Count scount, MPI_Datatype stype, void *rbuf,              \
                MPI_Count rcount, MPI_Datatype rtype, int root, MPI_Comm comm T##_P),            \
         (sbuf, scount, stype, rbuf, rcount, rtype, root, comm T##_A),                           \
         FITS(scount) && FITS(rcount),                                                           \
         Int(sbuf, I(scount), stype, rbuf, I(rcount), rtype, root, comm T##_A),                  \
         DEV(sbuf) || DEV(rbuf), ON_COMM(comm), T##_OUT, TOO_BIG)
FAMILY(ROOTED, Gather, gather)
FAMILY(ROOTED, Scatter, scatter)

/* Allgather, Alltoall and their neighbourhood forms: counts each side. */
#define ALL(Name, Int, T)                                                                        \
    HOOK(Name, (const void *sbuf, MPI_Count scount, MPI_Datatype stype, void *rbuf,              \
                MPI_Count rcount, MPI_Datatype rtype, MPI_Comm comm T##_P),                      \
         (sbuf, scount, stype, rbuf, rcount, rtype, comm T##_A), FITS(scount) && FITS(rcount),   \
         Int(sbuf, I(scount), stype, rbuf, I(rcount), rtype, comm T##_A),                        \
         DEV(sbuf) || DEV(rbuf), ON_COMM(comm), T##_OUT, TOO_BIG)
FAMILY(ALL, Allgather, allgather)
FAMILY(ALL, Alltoall, alltoall)
FAMILY(ALL, Neighbor_allgather, neighbor_allgather)
FAMILY(ALL, Neighbor_alltoall, neighbor_alltoall)

/* The v- and w-forms: their count and displacement arrays would need int
 * copies that live as long as a nonblocking call; refused. */
#define GATHERV(Name, Int, T)                                                                    \
    HOOK(Name, (const void *sbuf, MPI_Count scount, MPI_Datatype stype, void *rbuf,              \
                const MPI_Count rcounts[], const MPI_Aint displs[], MPI_Datatype rtype,          \
                int root, MPI_Comm comm T##_P),                                                  \
         (sbuf, scount, stype, rbuf, rcounts, displs, rtype, root, comm T##_A), 0, 0,            \
         DEV(sbuf) || DEV(rbuf), ON_COMM(comm), T##_OUT, NOT_COVERED)
#define SCATTERV(Name, Int, T)                                                                   \
    HOOK(Name, (const void *sbuf, const MPI_Count scounts[], const MPI_Aint displs[],            \
                MPI_Datatype stype, void *rbuf, MPI_Count rcount, MPI_Datatype rtype, int root,  \
                MPI_Comm comm T##_P),                                                           \
         (sbuf, scounts, displs, stype, rbuf, rcount, rtype, root, comm T##_A), 0, 0,            \
         DEV(sbuf) || DEV(rbuf), ON_COMM(comm), T##_OUT, NOT_COVERED)
#define ALLGATHERV(Name, Int, T)                                                                 \
    HOOK(Name, (const void *sbuf, MPI_Count scount, MPI_Datatype stype, void *rbuf,              \
                const MPI_Count rcounts[], const MPI_Aint displs[], MPI_Datatype rtype,          \
                MPI_Comm comm T##_P),                                                           \
         (sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm T##_A), 0, 0,                  \
         DEV(sbuf) || DEV(rbuf), ON_COMM(comm), T##_OUT, NOT_COVERED)
#define ALLTOALLV(Name, Int, T)                                                                  \
    HOOK(Name, (const void *sbuf, const MPI_Count scounts[], const MPI_Aint sdispls[],           \
                MPI_Datatype stype, void *rbuf, const MPI_Count rcounts[],                       \
                const MPI_Aint rdispls[], MPI_Datatype rtype, MPI_Comm comm T##_P),              \
         (sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm T##_A), 0, 0,       \
         DEV(sbuf) || DEV(rbuf), ON_COMM(comm), T##_OUT, NOT_COVERED)
#define ALLTOALLW(Name, Int, T)                                                                  \
    HOOK(Name, (const void *sbuf, const MPI_Count scounts[], const MPI_Aint sdispls[],           \
                const MPI_Datatype stypes[], void *rbuf, const MPI_Count rcounts[],              \
                const MPI_Aint rdispls[], const MPI_Datatype rtypes[], MPI_Comm comm T##_P),     \
         (sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm T##_A), 0, 0,     \
         DEV(sbuf) || DEV(rbuf), ON_COMM(comm), T##_OUT, NOT_COVERED)
#define REDUCE_SCATTER(Name, Int, T)                                                             \
    HOOK(Name, (const void *sbuf, void *rbuf, const MPI_Count rcounts[], MPI_Datatype dt,        \
                MPI_Op op, MPI_Comm comm T##_P),                                                 \
         (sbuf, rbuf, rcounts, dt, op, comm T##_A), 0, 0, DEV(sbuf) || DEV(rbuf),                \
         ON_COMM(comm), T##_OUT, NOT_COVERED)
FAMILY(GATHERV, Gatherv, gatherv)
FAMILY(SCATTERV, Scatterv, scatterv)
FAMILY(ALLGATHERV, Allgatherv, allgatherv)
FAMILY(ALLTOALLV, Alltoallv, alltoallv)
FAMILY(ALLTOALLW, Alltoallw, alltoallw)
FAMILY(REDUCE_SCATTER, Reduce_scatter, reduce_scatter)
FAMILY(ALLGATHERV, Neighbor_allgatherv, neighbor_allgatherv)
FAMILY(ALLTOALLV, Neighbor_alltoallv, neighbor_alltoallv)
FAMILY(ALLTOALLW, Neighbor_alltoallw, neighbor_alltoallw)

/* ---- one-sided origin buffers ---- */

#define PUT(Name, Int, T)                                                                        \
    HOOK(Name, (const void *obuf, MPI_Count ocount, MPI_Datatype otype, int trank,               \
                MPI_Aint tdisp, MPI_Count tcount, MPI_Datatype ttype, MPI_Win win T##_P),        \
         (obuf, ocount, otype, trank, tdisp, tcount, ttype, win T##_A),                          \
         FITS(ocount) && FITS(tcount),                                                           \
         Int(obuf, I(ocount), otype, trank, tdisp, I(tcount), ttype, win T##_A), DEV(obuf),      \
         ON_WIN(win), T##_OUT, TOO_BIG)
#define GET(Name, Int, T)                                                                        \
    HOOK(Name, (void *obuf, MPI_Count ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp,     \
                MPI_Count tcount, MPI_Datatype ttype, MPI_Win win T##_P),                        \
         (obuf, ocount, otype, trank, tdisp, tcount, ttype, win T##_A),                          \
         FITS(ocount) && FITS(tcount),                                                           \
         Int(obuf, I(ocount), otype, trank, tdisp, I(tcount), ttype, win T##_A), DEV(obuf),      \
         ON_WIN(win), T##_OUT, TOO_BIG)
#define ACC(Name, Int, T)                                                                        \
    HOOK(Name, (const void *obuf, MPI_Count ocount, MPI_Datatype otype, int trank,               \
                MPI_Aint tdisp, MPI_Count tcount, MPI_Datatype ttype, MPI_Op op,                 \
                MPI_Win win T##_P),                                                              \
         (obuf, ocount, otype, trank, tdisp, tcount, ttype, op, win T##_A),                      \
         FITS(ocount) && FITS(tcount),                                                           \
         Int(obuf, I(ocount), otype, trank, tdisp, I(tcount), ttype, op, win T##_A), DEV(obuf),  \
         ON_WIN(win), T##_OUT, TOO_BIG)
#define GET_ACC(Name, Int, T)                                                                    \
    HOOK(Name, (const void *obuf, MPI_Count ocount, MPI_Datatype otype, void *rbuf,              \
                MPI_Count rcount, MPI_Datatype rtype, int trank, MPI_Aint tdisp,                 \
                MPI_Count tcount, MPI_Datatype ttype, MPI_Op op, MPI_Win win T##_P),             \
         (obuf, ocount, otype, rbuf, rcount, rtype, trank, tdisp, tcount, ttype, op, win T##_A), \
         FITS(ocount) && FITS(rcount) && FITS(tcount),                                           \
         Int(obuf, I(ocount), otype, rbuf, I(rcount), rtype, trank, tdisp, I(tcount), ttype, op, \
             win T##_A),                                                                         \
         DEV(obuf) || DEV(rbuf), ON_WIN(win), T##_OUT, TOO_BIG)
PUT(MPI_Put_c, MPI_Put, PLAIN)
PUT(MPI_Rput_c, MPI_Rput, NB)
GET(MPI_Get_c, MPI_Get, PLAIN)
GET(MPI_Rget_c, MPI_Rget, NB)
ACC(MPI_Accumulate_c, MPI_Accumulate, PLAIN)
ACC(MPI_Raccumulate_c, MPI_Raccumulate, NB)
GET_ACC(MPI_Get_accumulate_c, MPI_Get_accumulate, PLAIN)
GET_ACC(MPI_Rget_accumulate_c, MPI_Rget_accumulate, NB)

/* A window of device memory: MPI_Win_create refuses it (staging/misc.c). */
HOOK(MPI_Win_create_c,
     (void *base, MPI_Aint size, MPI_Aint disp_unit, MPI_Info info, MPI_Comm comm, MPI_Win *win),
     (base, size, disp_unit, info, comm, win), FITS(disp_unit),
     MPI_Win_create(base, size, I(disp_unit), info, comm, win), DEV(base), ON_COMM(comm),
     *win = MPI_WIN_NULL, TOO_BIG)

/* ---- local calls: MPI_Reduce_local, MPI_Pack and MPI_Unpack ---- */

HOOK(MPI_Reduce_local_c,
     (const void *inbuf, void *inoutbuf, MPI_Count count, MPI_Datatype dt, MPI_Op op),
     (inbuf, inoutbuf, count, dt, op), FITS(count),
     MPI_Reduce_local(inbuf, inoutbuf, I(count), dt, op), DEV(inbuf) || DEV(inoutbuf),
     ON_COMM(MPI_COMM_WORLD), (void)0, TOO_BIG)

/* The int forms take an int position (MPI_Aint for external32): a copy
 * in and out. */
static int pack_i(const void *in, MPI_Count n, MPI_Datatype dt, void *out, MPI_Count size,
                  MPI_Count *pos, MPI_Comm comm)
{
    int p = I(*pos);
    int rc = MPI_Pack(in, I(n), dt, out, I(size), &p, comm);
    *pos = p;
    return rc;
}
static int unpack_i(const void *in, MPI_Count size, MPI_Count *pos, void *out, MPI_Count n,
                    MPI_Datatype dt, MPI_Comm comm)
{
    int p = I(*pos);
    int rc = MPI_Unpack(in, I(size), &p, out, I(n), dt, comm);
    *pos = p;
    return rc;
}
static int pack_ext_i(const char *rep, const void *in, MPI_Count n, MPI_Datatype dt, void *out,
                      MPI_Count size, MPI_Count *pos)
{
    MPI_Aint p = (MPI_Aint)*pos;
    int rc = MPI_Pack_external(rep, in, I(n), dt, out, (MPI_Aint)size, &p);
    *pos = p;
    return rc;
}
static int unpack_ext_i(const char *rep, const void *in, MPI_Count size, MPI_Count *pos, void *out,
                        MPI_Count n, MPI_Datatype dt)
{
    MPI_Aint p = (MPI_Aint)*pos;
    int rc = MPI_Unpack_external(rep, in, (MPI_Aint)size, &p, out, I(n), dt);
    *pos = p;
    return rc;
}
HOOK(MPI_Pack_c,
     (const void *in, MPI_Count n, MPI_Datatype dt, void *out, MPI_Count size, MPI_Count *pos,
      MPI_Comm comm),
     (in, n, dt, out, size, pos, comm), FITS(n) && FITS(size) && FITS(*pos),
     pack_i(in, n, dt, out, size, pos, comm), DEV(in) || DEV(out), ON_COMM(comm), (void)0,
     TOO_BIG)
HOOK(MPI_Unpack_c,
     (const void *in, MPI_Count size, MPI_Count *pos, void *out, MPI_Count n, MPI_Datatype dt,
      MPI_Comm comm),
     (in, size, pos, out, n, dt, comm), FITS(n) && FITS(size) && FITS(*pos),
     unpack_i(in, size, pos, out, n, dt, comm), DEV(in) || DEV(out), ON_COMM(comm), (void)0,
     TOO_BIG)
HOOK(MPI_Pack_external_c,
     (const char rep[], const void *in, MPI_Count n, MPI_Datatype dt, void *out, MPI_Count size,
      MPI_Count *pos),
     (rep, in, n, dt, out, size, pos), FITS(n), pack_ext_i(rep, in, n, dt, out, size, pos),
     DEV(in) || DEV(out), ON_COMM(MPI_COMM_WORLD), (void)0, TOO_BIG)
HOOK(MPI_Unpack_external_c,
     (const char rep[], const void *in, MPI_Count size, MPI_Count *pos, void *out, MPI_Count n,
      MPI_Datatype dt),
     (rep, in, size, pos, out, n, dt), FITS(n), unpack_ext_i(rep, in, size, pos, out, n, dt),
     DEV(in) || DEV(out), ON_COMM(MPI_COMM_WORLD), (void)0, TOO_BIG)

/* ---- MPI-IO ---- */

#define FILE_RW(Name, Int, T, Buf)                                                               \
    HOOK(Name, (MPI_File fh, Buf buf, MPI_Count count, MPI_Datatype dt T##_P),                   \
         (fh, buf, count, dt T##_A), FITS(count), Int(fh, buf, I(count), dt T##_A), DEV(buf),    \
         ON_FILE(fh), T##_OUT, TOO_BIG)
#define FILE_AT(Name, Int, T, Buf)                                                               \
    HOOK(Name, (MPI_File fh, MPI_Offset off, Buf buf, MPI_Count count, MPI_Datatype dt T##_P),   \
         (fh, off, buf, count, dt T##_A), FITS(count), Int(fh, off, buf, I(count), dt T##_A),    \
         DEV(buf), ON_FILE(fh), T##_OUT, TOO_BIG)
#define RD void *
#define WR const void *
FILE_RW(MPI_File_read_c, MPI_File_read, STATUS, RD)
FILE_RW(MPI_File_read_all_c, MPI_File_read_all, STATUS, RD)
FILE_RW(MPI_File_read_shared_c, MPI_File_read_shared, STATUS, RD)
FILE_RW(MPI_File_read_ordered_c, MPI_File_read_ordered, STATUS, RD)
FILE_RW(MPI_File_write_c, MPI_File_write, STATUS, WR)
FILE_RW(MPI_File_write_all_c, MPI_File_write_all, STATUS, WR)
FILE_RW(MPI_File_write_shared_c, MPI_File_write_shared, STATUS, WR)
FILE_RW(MPI_File_write_ordered_c, MPI_File_write_ordered, STATUS, WR)
FILE_RW(MPI_File_iread_c, MPI_File_iread, NB, RD)
FILE_RW(MPI_File_iread_all_c, MPI_File_iread_all, NB, RD)
FILE_RW(MPI_File_iread_shared_c, MPI_File_iread_shared, NB, RD)
FILE_RW(MPI_File_iwrite_c, MPI_File_iwrite, NB, WR)
FILE_RW(MPI_File_iwrite_all_c, MPI_File_iwrite_all, NB, WR)
FILE_RW(MPI_File_iwrite_shared_c, MPI_File_iwrite_shared, NB, WR)
FILE_RW(MPI_File_read_all_begin_c, MPI_File_read_all_begin, PLAIN, RD)
FILE_RW(MPI_File_read_ordered_begin_c, MPI_File_read_ordered_begin, PLAIN, RD)
FILE_RW(MPI_File_write_all_begin_c, MPI_File_write_all_begin, PLAIN, WR)
FILE_RW(MPI_File_write_ordered_begin_c, MPI_File_write_ordered_begin, PLAIN, WR)
FILE_AT(MPI_File_read_at_c, MPI_File_read_at, STATUS, RD)
FILE_AT(MPI_File_read_at_all_c, MPI_File_read_at_all, STATUS, RD)
FILE_AT(MPI_File_write_at_c, MPI_File_write_at, STATUS, WR)
FILE_AT(MPI_File_write_at_all_c, MPI_File_write_at_all, STATUS, WR)
FILE_AT(MPI_File_iread_at_c, MPI_File_iread_at, NB, RD)
FILE_AT(MPI_File_iread_at_all_c, MPI_File_iread_at_all, NB, RD)
FILE_AT(MPI_File_iwrite_at_c, MPI_File_iwrite_at, NB, WR)
FILE_AT(MPI_File_iwrite_at_all_c, MPI_File_iwrite_at_all, NB, WR)
FILE_AT(MPI_File_read_at_all_begin_c, MPI_File_read_at_all_begin, PLAIN, RD)
FILE_AT(MPI_File_write_at_all_begin_c, MPI_File_write_at_all_begin, PLAIN, WR)

#endif /* MPI_VERSION >= 4 */
