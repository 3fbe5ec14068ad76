/* Staging, collectives: each device buffer is staged whole through host
 * memory (a run of the pinned pool, a cached pinned buffer when larger
 * than the pool, pageable memory when both are busy), then MPI's own
 * collective runs on the host copies. No pipelining: a collective's
 * traffic pattern is MPI's business, and a rank cannot split it into
 * pieces without every rank agreeing. Each rank decides for its own
 * buffers only, so device and host buffers may be mixed across ranks.
 *
 * Regions are whole true extents ([true lb, true ub) of the elements
 * concerned). A receive region with holes (a non-contiguous datatype, or
 * v-displacements that leave gaps) is first filled from the device so that
 * the copy back leaves the holes as they were.
 *
 * While staged receives wait for their first message (rk_stg_pending), the
 * nonblocking form of the collective is used and polled, so that this rank
 * keeps posting the segments other ranks may be waiting for. */
#define _GNU_SOURCE
#include "staging_coll_ipc.h"
#include "staging_internal.h"

#include <stdlib.h>
#include <string.h>

#define EXPORT RK_MPI_EXPORT

static int pending_now(void)
{
    return atomic_load_explicit(&rk_stg_pending, memory_order_relaxed) != 0;
}

static int nb_wait(int rc, MPI_Request *req)
{
    return rc == MPI_SUCCESS ? rk_stg_wait(req, MPI_STATUS_IGNORE) : rc;
}

/* The blocking call, or its nonblocking twin polled (creq in scope). */
#define CALL(blocking, nonblocking) (pending_now() ? nb_wait((nonblocking), &creq) : (blocking))

static int is_dev(const void *p) { return p != MPI_IN_PLACE && p != NULL && rk_stg_is_device(p); }

typedef struct {
    void *u;   /* the user's buffer */
    char *h;   /* what MPI gets: u itself, or u's equivalent in hb */
    int dev;
    rk_stg_layout_t L;
    rk_stg_buf_t hb;
} side_t;

typedef struct {
    uint64_t t0;
    size_t copied;
    int staged, rc;
} ctx_t;

/* Stage elements [first, first + n) of dt at u (if u is device memory).
 * input: MPI reads them. dense: MPI writes every byte of the region it
 * writes (else the region is filled from the device first). */
static void side_prep(ctx_t *c, side_t *s, const void *u, MPI_Datatype dt, ptrdiff_t first,
                      ptrdiff_t n, int input, int dense)
{
    memset(s, 0, sizeof *s);
    s->u = (void *)u;
    s->h = (char *)u;
    if (c->rc != MPI_SUCCESS || !is_dev(u))
        return;
    int rc = rk_stg_layout(dt, first, n, &s->L);
    if (rc != MPI_SUCCESS) {
        c->rc = rc;
        return;
    }
    if (rk_stg_buf_get(s->L.span, 1, &s->hb) != 0) {
        c->rc = MPI_ERR_NO_MEM;
        return;
    }
    s->dev = 1;
    c->staged = 1;
    s->h = s->hb.ptr - s->L.lo;
    if ((input || !dense || !s->L.contig) && s->L.span) {
        if (rk_stg_copy_sync(s->hb.ptr, (char *)u + s->L.lo, s->L.span, RK_STG_D2H) != 0)
            c->rc = MPI_ERR_OTHER;
        c->copied += s->L.span;
    }
}

/* Copy elements [first, first + n) of the staged side back to the device. */
static void side_out(ctx_t *c, side_t *s, MPI_Datatype dt, ptrdiff_t first, ptrdiff_t n)
{
    if (!s->dev || c->rc != MPI_SUCCESS)
        return;
    rk_stg_layout_t o;
    if (rk_stg_layout(dt, first, n, &o) != MPI_SUCCESS || !o.span)
        return;
    if (rk_stg_copy_sync((char *)s->u + o.lo, s->hb.ptr + (o.lo - s->L.lo), o.span,
                         RK_STG_H2D) != 0)
        c->rc = MPI_ERR_OTHER;
    c->copied += o.span;
}

static void side_put(side_t *s)
{
    if (s->dev)
        rk_stg_buf_put(&s->hb);
}

/* Elements covered by v-arguments: [*first, *first + *n); dense when the
 * blocks leave no gap. */
static void vrange(int nproc, const int *counts, const int *displs, ptrdiff_t *first,
                   ptrdiff_t *n, int *dense)
{
    ptrdiff_t lo = 0, hi = 0, sum = 0;
    int any = 0;
    for (int i = 0; i < nproc; i++) {
        if (counts[i] <= 0)
            continue;
        ptrdiff_t a = displs[i], b = (ptrdiff_t)displs[i] + counts[i];
        lo = any && lo < a ? lo : a;
        hi = any && hi > b ? hi : b;
        any = 1;
        sum += counts[i];
    }
    *first = any ? lo : 0;
    *n = any ? hi - lo : 0;
    *dense = sum == *n;
}

static int begin(ctx_t *c, MPI_Comm comm)
{
    memset(c, 0, sizeof *c);
    c->t0 = rk_stg_now();
    int inter = 0;
    if (PMPI_Comm_test_inter(comm, &inter) == MPI_SUCCESS && inter) {
        rk_mpi_warn("staging: collectives on an intercommunicator are not staged "
                    "(docs/staging.md): a device buffer cannot go to this MPI");
        PMPI_Comm_call_errhandler(comm, MPI_ERR_BUFFER);
        return MPI_ERR_BUFFER;
    }
    return MPI_SUCCESS;
}

static int end(ctx_t *c, MPI_Comm comm, int rc)
{
    if (c->staged)
        rk_stg_count(c->copied, rk_stg_now() - c->t0);
    if (rc == MPI_SUCCESS && c->rc != MPI_SUCCESS) {
        rk_mpi_warn("staging: a collective's copies failed");
        PMPI_Comm_call_errhandler(comm, c->rc);
        rc = c->rc;
    }
    return rc;
}

static int comm_rank(MPI_Comm comm)
{
    int r = 0;
    PMPI_Comm_rank(comm, &r);
    return r;
}

static int comm_size(MPI_Comm comm)
{
    int n = 1;
    PMPI_Comm_size(comm, &n);
    return n;
}

EXPORT int MPI_Bcast(void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_bcast(buf, count, dt, root, comm, &irc))
        return irc;
    MPI_Request creq;
    if (RK_STG_LIKELY(!rk_stg_active) || (!is_dev(buf) && !pending_now()))
        return PMPI_Bcast(buf, count, dt, root, comm);
    if (!is_dev(buf))
        return CALL(PMPI_Bcast(buf, count, dt, root, comm),
                    PMPI_Ibcast(buf, count, dt, root, comm, &creq));
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int me = comm_rank(comm);
    side_t s;
    side_prep(&c, &s, buf, dt, 0, count, me == root, 1);
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Bcast(s.h, count, dt, root, comm),
                  PMPI_Ibcast(s.h, count, dt, root, comm, &creq));
    if (rc == MPI_SUCCESS && me != root)
        side_out(&c, &s, dt, 0, count);
    side_put(&s);
    return end(&c, comm, rc);
}

/* Reduce, Allreduce, Scan, Exscan: count elements in, count out. */
enum { R_REDUCE, R_ALLREDUCE, R_SCAN, R_EXSCAN };

static int reduce_like(int kind, const void *sbuf, void *rbuf, int count, MPI_Datatype dt,
                       MPI_Op op, int root, MPI_Comm comm)
{
    MPI_Request creq;
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int me = comm_rank(comm);
    int rsig = kind != R_REDUCE || me == root; /* rbuf significant here */
    side_t s, r;
    side_prep(&c, &s, sbuf, dt, 0, count, 1, 1);
    if (rsig)
        side_prep(&c, &r, rbuf, dt, 0, count,
                  sbuf == MPI_IN_PLACE || (kind == R_EXSCAN && me == 0), 1);
    else
        memset(&r, 0, sizeof r), r.h = rbuf;
    const void *sh = sbuf == MPI_IN_PLACE ? MPI_IN_PLACE : s.h;
    if (c.rc == MPI_SUCCESS) {
        switch (kind) {
        case R_REDUCE:
            rc = CALL(PMPI_Reduce(sh, r.h, count, dt, op, root, comm),
                      PMPI_Ireduce(sh, r.h, count, dt, op, root, comm, &creq));
            break;
        case R_ALLREDUCE:
            rc = CALL(PMPI_Allreduce(sh, r.h, count, dt, op, comm),
                      PMPI_Iallreduce(sh, r.h, count, dt, op, comm, &creq));
            break;
        case R_SCAN:
            rc = CALL(PMPI_Scan(sh, r.h, count, dt, op, comm),
                      PMPI_Iscan(sh, r.h, count, dt, op, comm, &creq));
            break;
        default:
            rc = CALL(PMPI_Exscan(sh, r.h, count, dt, op, comm),
                      PMPI_Iexscan(sh, r.h, count, dt, op, comm, &creq));
            break;
        }
    }
    if (rc == MPI_SUCCESS && rsig)
        side_out(&c, &r, dt, 0, count);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

#define FAST2(sb, rb) \
    (RK_STG_LIKELY(!rk_stg_active) || (!is_dev(sb) && !is_dev(rb) && !pending_now()))

EXPORT int MPI_Reduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                      int root, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_reduce(sbuf, rbuf, count, dt, op, root, comm, &irc))
        return irc;
    if (FAST2(sbuf, rbuf))
        return PMPI_Reduce(sbuf, rbuf, count, dt, op, root, comm);
    return reduce_like(R_REDUCE, sbuf, rbuf, count, dt, op, root, comm);
}

EXPORT int MPI_Allreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                         MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_allreduce(sbuf, rbuf, count, dt, op, comm, &irc))
        return irc;
    if (FAST2(sbuf, rbuf))
        return PMPI_Allreduce(sbuf, rbuf, count, dt, op, comm);
    return reduce_like(R_ALLREDUCE, sbuf, rbuf, count, dt, op, 0, comm);
}

EXPORT int MPI_Scan(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                    MPI_Comm comm)
{
    if (FAST2(sbuf, rbuf))
        return PMPI_Scan(sbuf, rbuf, count, dt, op, comm);
    return reduce_like(R_SCAN, sbuf, rbuf, count, dt, op, 0, comm);
}

EXPORT int MPI_Exscan(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                      MPI_Comm comm)
{
    if (FAST2(sbuf, rbuf))
        return PMPI_Exscan(sbuf, rbuf, count, dt, op, comm);
    return reduce_like(R_EXSCAN, sbuf, rbuf, count, dt, op, 0, comm);
}

EXPORT int MPI_Gather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                      MPI_Datatype rtype, int root, MPI_Comm comm)
{
    MPI_Request creq;
    if (FAST2(sbuf, rbuf))
        return PMPI_Gather(sbuf, scount, stype, rbuf, rcount, rtype, root, comm);
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int me = comm_rank(comm), np = comm_size(comm);
    side_t s, r;
    side_prep(&c, &s, sbuf, stype, 0, scount, 1, 1);
    if (me == root)
        side_prep(&c, &r, rbuf, rtype, 0, (ptrdiff_t)rcount * np, sbuf == MPI_IN_PLACE, 1);
    else
        memset(&r, 0, sizeof r), r.h = rbuf;
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Gather(s.h, scount, stype, r.h, rcount, rtype, root, comm),
                  PMPI_Igather(s.h, scount, stype, r.h, rcount, rtype, root, comm, &creq));
    if (rc == MPI_SUCCESS && me == root)
        side_out(&c, &r, rtype, 0, (ptrdiff_t)rcount * np);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

EXPORT int MPI_Gatherv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
                       const int rcounts[], const int displs[], MPI_Datatype rtype, int root,
                       MPI_Comm comm)
{
    MPI_Request creq;
    if (FAST2(sbuf, rbuf))
        return PMPI_Gatherv(sbuf, scount, stype, rbuf, rcounts, displs, rtype, root, comm);
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int me = comm_rank(comm), np = comm_size(comm);
    side_t s, r;
    ptrdiff_t f = 0, n = 0;
    int dense = 1;
    side_prep(&c, &s, sbuf, stype, 0, scount, 1, 1);
    if (me == root) {
        vrange(np, rcounts, displs, &f, &n, &dense);
        side_prep(&c, &r, rbuf, rtype, f, n, sbuf == MPI_IN_PLACE, dense);
    } else {
        memset(&r, 0, sizeof r), r.h = rbuf;
    }
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Gatherv(s.h, scount, stype, r.h, rcounts, displs, rtype, root, comm),
                  PMPI_Igatherv(s.h, scount, stype, r.h, rcounts, displs, rtype, root, comm,
                                &creq));
    if (rc == MPI_SUCCESS && me == root)
        side_out(&c, &r, rtype, f, n);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

EXPORT int MPI_Scatter(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                       MPI_Datatype rtype, int root, MPI_Comm comm)
{
    MPI_Request creq;
    if (FAST2(sbuf, rbuf))
        return PMPI_Scatter(sbuf, scount, stype, rbuf, rcount, rtype, root, comm);
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int me = comm_rank(comm), np = comm_size(comm);
    side_t s, r;
    if (me == root)
        side_prep(&c, &s, sbuf, stype, 0, (ptrdiff_t)scount * np, 1, 1);
    else
        memset(&s, 0, sizeof s), s.h = (char *)sbuf;
    side_prep(&c, &r, rbuf, rtype, 0, rcount, 0, 1);
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Scatter(s.h, scount, stype, r.h, rcount, rtype, root, comm),
                  PMPI_Iscatter(s.h, scount, stype, r.h, rcount, rtype, root, comm, &creq));
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, rtype, 0, rcount);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

EXPORT int MPI_Scatterv(const void *sbuf, const int scounts[], const int displs[],
                        MPI_Datatype stype, void *rbuf, int rcount, MPI_Datatype rtype, int root,
                        MPI_Comm comm)
{
    MPI_Request creq;
    if (FAST2(sbuf, rbuf))
        return PMPI_Scatterv(sbuf, scounts, displs, stype, rbuf, rcount, rtype, root, comm);
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int me = comm_rank(comm), np = comm_size(comm);
    side_t s, r;
    if (me == root) {
        ptrdiff_t f, n;
        int dense;
        vrange(np, scounts, displs, &f, &n, &dense);
        side_prep(&c, &s, sbuf, stype, f, n, 1, 1);
    } else {
        memset(&s, 0, sizeof s), s.h = (char *)sbuf;
    }
    side_prep(&c, &r, rbuf, rtype, 0, rcount, 0, 1);
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Scatterv(s.h, scounts, displs, stype, r.h, rcount, rtype, root, comm),
                  PMPI_Iscatterv(s.h, scounts, displs, stype, r.h, rcount, rtype, root, comm,
                                 &creq));
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, rtype, 0, rcount);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

EXPORT int MPI_Allgather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
                         int rcount, MPI_Datatype rtype, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_allgather(sbuf, scount, stype, rbuf, rcount, rtype, comm, &irc))
        return irc;
    MPI_Request creq;
    if (FAST2(sbuf, rbuf))
        return PMPI_Allgather(sbuf, scount, stype, rbuf, rcount, rtype, comm);
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int np = comm_size(comm);
    side_t s, r;
    side_prep(&c, &s, sbuf, stype, 0, scount, 1, 1);
    side_prep(&c, &r, rbuf, rtype, 0, (ptrdiff_t)rcount * np, sbuf == MPI_IN_PLACE, 1);
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Allgather(s.h, scount, stype, r.h, rcount, rtype, comm),
                  PMPI_Iallgather(s.h, scount, stype, r.h, rcount, rtype, comm, &creq));
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, rtype, 0, (ptrdiff_t)rcount * np);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

EXPORT int MPI_Allgatherv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
                          const int rcounts[], const int displs[], MPI_Datatype rtype,
                          MPI_Comm comm)
{
    MPI_Request creq;
    if (FAST2(sbuf, rbuf))
        return PMPI_Allgatherv(sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm);
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int np = comm_size(comm);
    side_t s, r;
    ptrdiff_t f, n;
    int dense;
    vrange(np, rcounts, displs, &f, &n, &dense);
    side_prep(&c, &s, sbuf, stype, 0, scount, 1, 1);
    side_prep(&c, &r, rbuf, rtype, f, n, sbuf == MPI_IN_PLACE, dense);
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Allgatherv(s.h, scount, stype, r.h, rcounts, displs, rtype, comm),
                  PMPI_Iallgatherv(s.h, scount, stype, r.h, rcounts, displs, rtype, comm, &creq));
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, rtype, f, n);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

EXPORT int MPI_Alltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                        MPI_Datatype rtype, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, &irc))
        return irc;
    MPI_Request creq;
    if (FAST2(sbuf, rbuf))
        return PMPI_Alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm);
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int np = comm_size(comm);
    side_t s, r;
    side_prep(&c, &s, sbuf, stype, 0, (ptrdiff_t)scount * np, 1, 1);
    side_prep(&c, &r, rbuf, rtype, 0, (ptrdiff_t)rcount * np, sbuf == MPI_IN_PLACE, 1);
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Alltoall(s.h, scount, stype, r.h, rcount, rtype, comm),
                  PMPI_Ialltoall(s.h, scount, stype, r.h, rcount, rtype, comm, &creq));
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, rtype, 0, (ptrdiff_t)rcount * np);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

EXPORT int MPI_Alltoallv(const void *sbuf, const int scounts[], const int sdispls[],
                         MPI_Datatype stype, void *rbuf, const int rcounts[], const int rdispls[],
                         MPI_Datatype rtype, MPI_Comm comm)
{
    MPI_Request creq;
    if (FAST2(sbuf, rbuf))
        return PMPI_Alltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype,
                              comm);
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int np = comm_size(comm);
    side_t s, r;
    ptrdiff_t sf = 0, sn = 0, rf, rn;
    int sdense, rdense;
    if (sbuf != MPI_IN_PLACE)
        vrange(np, scounts, sdispls, &sf, &sn, &sdense);
    vrange(np, rcounts, rdispls, &rf, &rn, &rdense);
    side_prep(&c, &s, sbuf, stype, sf, sn, 1, 1);
    side_prep(&c, &r, rbuf, rtype, rf, rn, sbuf == MPI_IN_PLACE, rdense);
    if (c.rc == MPI_SUCCESS)
        rc = CALL(PMPI_Alltoallv(s.h, scounts, sdispls, stype, r.h, rcounts, rdispls, rtype, comm),
                  PMPI_Ialltoallv(s.h, scounts, sdispls, stype, r.h, rcounts, rdispls, rtype,
                                  comm, &creq));
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, rtype, rf, rn);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

/* Reduce_scatter and Reduce_scatter_block: total elements in, mine out. */
static int reduce_scatter_like(const void *sbuf, void *rbuf, const int *rcounts, int rcount,
                               MPI_Datatype dt, MPI_Op op, MPI_Comm comm)
{
    MPI_Request creq;
    ctx_t c;
    int rc = begin(&c, comm);
    if (rc != MPI_SUCCESS)
        return rc;
    int me = comm_rank(comm), np = comm_size(comm);
    ptrdiff_t total = 0, mine = rcounts ? rcounts[me] : rcount;
    if (rcounts)
        for (int i = 0; i < np; i++)
            total += rcounts[i];
    else
        total = (ptrdiff_t)rcount * np;
    side_t s, r;
    side_prep(&c, &s, sbuf, dt, 0, total, 1, 1);
    if (sbuf == MPI_IN_PLACE)
        side_prep(&c, &r, rbuf, dt, 0, total, 1, 1);
    else
        side_prep(&c, &r, rbuf, dt, 0, mine, 0, 1);
    const void *sh = sbuf == MPI_IN_PLACE ? MPI_IN_PLACE : s.h;
    if (c.rc == MPI_SUCCESS) {
        if (rcounts)
            rc = CALL(PMPI_Reduce_scatter(sh, r.h, rcounts, dt, op, comm),
                      PMPI_Ireduce_scatter(sh, r.h, rcounts, dt, op, comm, &creq));
        else
            rc = CALL(PMPI_Reduce_scatter_block(sh, r.h, rcount, dt, op, comm),
                      PMPI_Ireduce_scatter_block(sh, r.h, rcount, dt, op, comm, &creq));
    }
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, dt, 0, mine);
    side_put(&s);
    side_put(&r);
    return end(&c, comm, rc);
}

EXPORT int MPI_Reduce_scatter(const void *sbuf, void *rbuf, const int rcounts[], MPI_Datatype dt,
                              MPI_Op op, MPI_Comm comm)
{
    if (FAST2(sbuf, rbuf))
        return PMPI_Reduce_scatter(sbuf, rbuf, rcounts, dt, op, comm);
    return reduce_scatter_like(sbuf, rbuf, rcounts, 0, dt, op, comm);
}

EXPORT int MPI_Reduce_scatter_block(const void *sbuf, void *rbuf, int rcount, MPI_Datatype dt,
                                    MPI_Op op, MPI_Comm comm)
{
    if (FAST2(sbuf, rbuf))
        return PMPI_Reduce_scatter_block(sbuf, rbuf, rcount, dt, op, comm);
    return reduce_scatter_like(sbuf, rbuf, NULL, rcount, dt, op, comm);
}
