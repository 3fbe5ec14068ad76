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

static int is_dev(const void *p) { return p != MPI_IN_PLACE && p != NULL && rk_stg_is_device(p); }

/* One collective's arguments as the user gave them (each call reads the
 * ones it has; a Bcast's buffer is rbuf). */
typedef struct {
    int kind; /* which reduction (R_*, RS_*) */
    const void *sbuf;
    void *rbuf;
    int scount, rcount;
    const int *scounts, *sdispls, *rcounts, *rdispls;
    MPI_Datatype stype, rtype;
    MPI_Op op;
    int root;
    MPI_Comm comm;
} coll_t;

/* MPI's collective on the buffers s and r (the user's, or their staged
 * copies): the blocking form when req is NULL, else the nonblocking one. */
typedef int (*call_fn)(const coll_t *a, const void *s, void *r, MPI_Request *req);

/* The blocking call, or its nonblocking twin polled while staged receives
 * wait. */
static int invoke(call_fn call, const coll_t *a, const void *s, void *r)
{
    if (!pending_now())
        return call(a, s, r, NULL);
    MPI_Request creq;
    int rc = call(a, s, r, &creq);
    return rc == MPI_SUCCESS ? rk_stg_wait(&creq, MPI_STATUS_IGNORE) : rc;
}

/* What one side of a collective is on this rank: significant here (sig),
 * elements [first, first + n) of dt; input: MPI reads them; dense: MPI
 * writes every byte of the region it writes (else the region is filled
 * from the device first); out: elements [first, first + nout) come back. */
typedef struct {
    int sig;
    MPI_Datatype dt;
    ptrdiff_t first, n;
    int input, dense, out;
    ptrdiff_t nout;
    int np;                        /* v-arguments: np blocks, counts and displs (else NULL) */
    const int *vcounts, *vdispls;
} spec_t;

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

/* Stage side p of u (if significant here and u is device memory). */
static void side_prep(ctx_t *c, side_t *s, const void *u, const spec_t *p)
{
    memset(s, 0, sizeof *s);
    s->u = (void *)u;
    s->h = (char *)u;
    if (!p->sig || c->rc != MPI_SUCCESS || !is_dev(u))
        return;
    int rc = rk_stg_layout(p->dt, p->first, p->n, &s->L);
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
    /* Only what MPI reads comes from the device: what goes back is the
     * described bytes alone (side_out), so the holes need no copy. */
    if (p->input && s->L.span) {
        if (rk_stg_copy_sync(s->hb.ptr, (char *)u + s->L.lo, s->L.span, RK_STG_D2H) != 0)
            c->rc = MPI_ERR_OTHER;
        c->copied += s->L.span;
    }
}

/* Copy the elements p brings out of the staged side back to the device. */
static void side_out(ctx_t *c, side_t *s, const spec_t *p)
{
    if (!p->out || !s->dev || c->rc != MPI_SUCCESS)
        return;
    int bad = 0;
    if (p->vcounts) {
        /* Each rank's block: what lies between them is not the call's. */
        for (int i = 0; i < p->np && !bad; i++)
            if (p->vcounts[i] > 0)
                bad = rk_stg_put_elems_sync(s->u, s->h, p->dt, p->vdispls[i], p->vcounts[i],
                                            &s->L, &c->copied);
    } else {
        bad = rk_stg_put_elems_sync(s->u, s->h, p->dt, p->first, p->nout, &s->L, &c->copied);
    }
    if (bad)
        c->rc = MPI_ERR_OTHER;
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

/* A side of n elements of dt from the start, all of it out. */
static spec_t whole(int sig, MPI_Datatype dt, ptrdiff_t n, int input)
{
    return (spec_t){.sig = sig, .dt = dt, .n = n, .input = input, .dense = 1, .out = sig,
                    .nout = n};
}

/* A side given by v-arguments. */
static spec_t vside(int sig, MPI_Datatype dt, int np, const int *counts, const int *displs,
                    int input)
{
    spec_t p = whole(sig, dt, 0, input);
    if (sig) {
        vrange(np, counts, displs, &p.first, &p.n, &p.dense);
        p.nout = p.n;
        p.np = np;
        p.vcounts = counts;
        p.vdispls = displs;
    }
    return p;
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

/* Every staged collective: stage both sides, call MPI on the host copies,
 * copy the receive side back, count. */
static int run(const coll_t *a, call_fn call, const spec_t *sp, const spec_t *rp)
{
    ctx_t c;
    int rc = begin(&c, a->comm);
    if (rc != MPI_SUCCESS)
        return rc;
    side_t s, r;
    side_prep(&c, &s, a->sbuf, sp);
    side_prep(&c, &r, a->rbuf, rp);
    if (c.rc == MPI_SUCCESS)
        rc = invoke(call, a, s.h, r.h);
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, rp);
    side_put(&s);
    side_put(&r);
    return end(&c, a->comm, rc);
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

#define FAST2(sb, rb) \
    (RK_STG_LIKELY(!rk_stg_active) || (!is_dev(sb) && !is_dev(rb) && !pending_now()))

/* ---- the calls: MPI's blocking and nonblocking forms, then the hook ---- */

static int bcast_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    (void)s;
    return q ? PMPI_Ibcast(r, a->rcount, a->rtype, a->root, a->comm, q)
             : PMPI_Bcast(r, a->rcount, a->rtype, a->root, a->comm);
}

EXPORT int MPI_Bcast(void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_bcast(buf, count, dt, root, comm, &irc))
        return irc;
    coll_t a = {.rbuf = buf, .rcount = count, .rtype = dt, .root = root, .comm = comm};
    if (RK_STG_LIKELY(!rk_stg_active) || (!is_dev(buf) && !pending_now()))
        return bcast_call(&a, NULL, buf, NULL);
    if (!is_dev(buf)) /* a host buffer while receives wait: polled, not staged */
        return invoke(bcast_call, &a, NULL, buf);
    int me = comm_rank(comm);
    spec_t s = whole(0, dt, 0, 0), r = whole(1, dt, count, me == root);
    r.out = me != root;
    return run(&a, bcast_call, &s, &r);
}

/* Reduce, Allreduce, Scan, Exscan: count elements in, count out. */
enum { R_REDUCE, R_ALLREDUCE, R_SCAN, R_EXSCAN };

static int reduce_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    int n = a->rcount, root = a->root;
    MPI_Datatype dt = a->rtype;
    MPI_Op op = a->op;
    MPI_Comm comm = a->comm;
    switch (a->kind) {
    case R_REDUCE:
        return q ? PMPI_Ireduce(s, r, n, dt, op, root, comm, q)
                 : PMPI_Reduce(s, r, n, dt, op, root, comm);
    case R_ALLREDUCE:
        return q ? PMPI_Iallreduce(s, r, n, dt, op, comm, q)
                 : PMPI_Allreduce(s, r, n, dt, op, comm);
    case R_SCAN:
        return q ? PMPI_Iscan(s, r, n, dt, op, comm, q) : PMPI_Scan(s, r, n, dt, op, comm);
    default:
        return q ? PMPI_Iexscan(s, r, n, dt, op, comm, q) : PMPI_Exscan(s, r, n, dt, op, comm);
    }
}

static int reduce_like(int kind, const void *sbuf, void *rbuf, int count, MPI_Datatype dt,
                       MPI_Op op, int root, MPI_Comm comm)
{
    coll_t a = {.kind = kind, .sbuf = sbuf, .rbuf = rbuf, .rcount = count, .rtype = dt,
                .op = op, .root = root, .comm = comm};
    if (FAST2(sbuf, rbuf))
        return reduce_call(&a, sbuf, rbuf, NULL);
    int me = kind == R_REDUCE || kind == R_EXSCAN ? comm_rank(comm) : 0;
    /* rbuf is significant at the root of a Reduce only; MPI reads it in
     * place, and Exscan's rank 0 leaves it as it was. */
    int rsig = kind != R_REDUCE || me == root;
    int rin = sbuf == MPI_IN_PLACE || (kind == R_EXSCAN && me == 0);
    spec_t s = whole(1, dt, count, 1), r = whole(rsig, dt, count, rin);
    return run(&a, reduce_call, &s, &r);
}

EXPORT int MPI_Reduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                      int root, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_reduce(sbuf, rbuf, count, dt, op, root, comm, &irc))
        return irc;
    return reduce_like(R_REDUCE, sbuf, rbuf, count, dt, op, root, comm);
}

EXPORT int MPI_Allreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                         MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_allreduce(sbuf, rbuf, count, dt, op, comm, &irc))
        return irc;
    return reduce_like(R_ALLREDUCE, sbuf, rbuf, count, dt, op, 0, comm);
}

EXPORT int MPI_Scan(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                    MPI_Comm comm)
{
    return reduce_like(R_SCAN, sbuf, rbuf, count, dt, op, 0, comm);
}

EXPORT int MPI_Exscan(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                      MPI_Comm comm)
{
    return reduce_like(R_EXSCAN, sbuf, rbuf, count, dt, op, 0, comm);
}

static int gather_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Igather(s, a->scount, a->stype, r, a->rcount, a->rtype, a->root, a->comm, q)
             : PMPI_Gather(s, a->scount, a->stype, r, a->rcount, a->rtype, a->root, a->comm);
}

EXPORT int MPI_Gather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                      MPI_Datatype rtype, int root, MPI_Comm comm)
{
    coll_t a = {.sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf,
                .rcount = rcount, .rtype = rtype, .root = root, .comm = comm};
    if (FAST2(sbuf, rbuf))
        return gather_call(&a, sbuf, rbuf, NULL);
    int here = comm_rank(comm) == root;
    spec_t s = whole(1, stype, scount, 1);
    spec_t r = whole(here, rtype, (ptrdiff_t)rcount * comm_size(comm), sbuf == MPI_IN_PLACE);
    return run(&a, gather_call, &s, &r);
}

static int gatherv_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Igatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls, a->rtype,
                             a->root, a->comm, q)
             : PMPI_Gatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls, a->rtype,
                            a->root, a->comm);
}

EXPORT int MPI_Gatherv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
                       const int rcounts[], const int displs[], MPI_Datatype rtype, int root,
                       MPI_Comm comm)
{
    coll_t a = {.sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf,
                .rcounts = rcounts, .rdispls = displs, .rtype = rtype, .root = root,
                .comm = comm};
    if (FAST2(sbuf, rbuf))
        return gatherv_call(&a, sbuf, rbuf, NULL);
    int here = comm_rank(comm) == root;
    spec_t s = whole(1, stype, scount, 1);
    spec_t r = vside(here, rtype, comm_size(comm), rcounts, displs, sbuf == MPI_IN_PLACE);
    return run(&a, gatherv_call, &s, &r);
}

static int scatter_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Iscatter(s, a->scount, a->stype, r, a->rcount, a->rtype, a->root, a->comm,
                             q)
             : PMPI_Scatter(s, a->scount, a->stype, r, a->rcount, a->rtype, a->root, a->comm);
}

EXPORT int MPI_Scatter(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                       MPI_Datatype rtype, int root, MPI_Comm comm)
{
    coll_t a = {.sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf,
                .rcount = rcount, .rtype = rtype, .root = root, .comm = comm};
    if (FAST2(sbuf, rbuf))
        return scatter_call(&a, sbuf, rbuf, NULL);
    int here = comm_rank(comm) == root;
    spec_t s = whole(here, stype, (ptrdiff_t)scount * comm_size(comm), 1);
    spec_t r = whole(1, rtype, rcount, 0);
    return run(&a, scatter_call, &s, &r);
}

static int scatterv_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Iscatterv(s, a->scounts, a->sdispls, a->stype, r, a->rcount, a->rtype,
                              a->root, a->comm, q)
             : PMPI_Scatterv(s, a->scounts, a->sdispls, a->stype, r, a->rcount, a->rtype,
                             a->root, a->comm);
}

EXPORT int MPI_Scatterv(const void *sbuf, const int scounts[], const int displs[],
                        MPI_Datatype stype, void *rbuf, int rcount, MPI_Datatype rtype, int root,
                        MPI_Comm comm)
{
    coll_t a = {.sbuf = sbuf, .scounts = scounts, .sdispls = displs, .stype = stype,
                .rbuf = rbuf, .rcount = rcount, .rtype = rtype, .root = root, .comm = comm};
    if (FAST2(sbuf, rbuf))
        return scatterv_call(&a, sbuf, rbuf, NULL);
    int here = comm_rank(comm) == root;
    spec_t s = vside(here, stype, comm_size(comm), scounts, displs, 1);
    spec_t r = whole(1, rtype, rcount, 0);
    return run(&a, scatterv_call, &s, &r);
}

static int allgather_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Iallgather(s, a->scount, a->stype, r, a->rcount, a->rtype, a->comm, q)
             : PMPI_Allgather(s, a->scount, a->stype, r, a->rcount, a->rtype, a->comm);
}

EXPORT int MPI_Allgather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
                         int rcount, MPI_Datatype rtype, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_allgather(sbuf, scount, stype, rbuf, rcount, rtype, comm, &irc))
        return irc;
    coll_t a = {.sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf,
                .rcount = rcount, .rtype = rtype, .comm = comm};
    if (FAST2(sbuf, rbuf))
        return allgather_call(&a, sbuf, rbuf, NULL);
    spec_t s = whole(1, stype, scount, 1);
    spec_t r = whole(1, rtype, (ptrdiff_t)rcount * comm_size(comm), sbuf == MPI_IN_PLACE);
    return run(&a, allgather_call, &s, &r);
}

static int allgatherv_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Iallgatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls, a->rtype,
                                a->comm, q)
             : PMPI_Allgatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls, a->rtype,
                               a->comm);
}

EXPORT int MPI_Allgatherv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
                          const int rcounts[], const int displs[], MPI_Datatype rtype,
                          MPI_Comm comm)
{
    coll_t a = {.sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf,
                .rcounts = rcounts, .rdispls = displs, .rtype = rtype, .comm = comm};
    if (FAST2(sbuf, rbuf))
        return allgatherv_call(&a, sbuf, rbuf, NULL);
    spec_t s = whole(1, stype, scount, 1);
    spec_t r = vside(1, rtype, comm_size(comm), rcounts, displs, sbuf == MPI_IN_PLACE);
    return run(&a, allgatherv_call, &s, &r);
}

static int alltoall_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Ialltoall(s, a->scount, a->stype, r, a->rcount, a->rtype, a->comm, q)
             : PMPI_Alltoall(s, a->scount, a->stype, r, a->rcount, a->rtype, a->comm);
}

EXPORT int MPI_Alltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                        MPI_Datatype rtype, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging_coll_ipc.c */
    if (rk_coll_ipc_alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, &irc))
        return irc;
    coll_t a = {.sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf,
                .rcount = rcount, .rtype = rtype, .comm = comm};
    if (FAST2(sbuf, rbuf))
        return alltoall_call(&a, sbuf, rbuf, NULL);
    int np = comm_size(comm);
    spec_t s = whole(1, stype, (ptrdiff_t)scount * np, 1);
    spec_t r = whole(1, rtype, (ptrdiff_t)rcount * np, sbuf == MPI_IN_PLACE);
    return run(&a, alltoall_call, &s, &r);
}

static int alltoallv_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Ialltoallv(s, a->scounts, a->sdispls, a->stype, r, a->rcounts, a->rdispls,
                               a->rtype, a->comm, q)
             : PMPI_Alltoallv(s, a->scounts, a->sdispls, a->stype, r, a->rcounts, a->rdispls,
                              a->rtype, a->comm);
}

EXPORT int MPI_Alltoallv(const void *sbuf, const int scounts[], const int sdispls[],
                         MPI_Datatype stype, void *rbuf, const int rcounts[], const int rdispls[],
                         MPI_Datatype rtype, MPI_Comm comm)
{
    coll_t a = {.sbuf = sbuf, .scounts = scounts, .sdispls = sdispls, .stype = stype,
                .rbuf = rbuf, .rcounts = rcounts, .rdispls = rdispls, .rtype = rtype,
                .comm = comm};
    if (FAST2(sbuf, rbuf))
        return alltoallv_call(&a, sbuf, rbuf, NULL);
    int np = comm_size(comm);
    spec_t s = vside(sbuf != MPI_IN_PLACE, stype, np, scounts, sdispls, 1);
    spec_t r = vside(1, rtype, np, rcounts, rdispls, sbuf == MPI_IN_PLACE);
    return run(&a, alltoallv_call, &s, &r);
}

/* Reduce_scatter (rcounts) and Reduce_scatter_block (rcount): total
 * elements in, mine out (in place: rbuf holds the total, in and out). */
enum { RS_COUNTS, RS_BLOCK };

static int reduce_scatter_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    if (a->kind == RS_COUNTS)
        return q ? PMPI_Ireduce_scatter(s, r, a->rcounts, a->rtype, a->op, a->comm, q)
                 : PMPI_Reduce_scatter(s, r, a->rcounts, a->rtype, a->op, a->comm);
    return q ? PMPI_Ireduce_scatter_block(s, r, a->rcount, a->rtype, a->op, a->comm, q)
             : PMPI_Reduce_scatter_block(s, r, a->rcount, a->rtype, a->op, a->comm);
}

static int reduce_scatter_like(const void *sbuf, void *rbuf, const int *rcounts, int rcount,
                               MPI_Datatype dt, MPI_Op op, MPI_Comm comm)
{
    coll_t a = {.kind = rcounts ? RS_COUNTS : RS_BLOCK, .sbuf = sbuf, .rbuf = rbuf,
                .rcounts = rcounts, .rcount = rcount, .rtype = dt, .op = op, .comm = comm};
    if (FAST2(sbuf, rbuf))
        return reduce_scatter_call(&a, sbuf, rbuf, NULL);
    int me = comm_rank(comm), np = comm_size(comm);
    ptrdiff_t total = 0, mine = rcounts ? rcounts[me] : rcount;
    if (rcounts)
        for (int i = 0; i < np; i++)
            total += rcounts[i];
    else
        total = (ptrdiff_t)rcount * np;
    int inplace = sbuf == MPI_IN_PLACE;
    spec_t s = whole(1, dt, total, 1), r = whole(1, dt, inplace ? total : mine, inplace);
    r.nout = mine;
    return run(&a, reduce_scatter_call, &s, &r);
}

EXPORT int MPI_Reduce_scatter(const void *sbuf, void *rbuf, const int rcounts[], MPI_Datatype dt,
                              MPI_Op op, MPI_Comm comm)
{
    return reduce_scatter_like(sbuf, rbuf, rcounts, 0, dt, op, comm);
}

EXPORT int MPI_Reduce_scatter_block(const void *sbuf, void *rbuf, int rcount, MPI_Datatype dt,
                                    MPI_Op op, MPI_Comm comm)
{
    return reduce_scatter_like(sbuf, rbuf, NULL, rcount, dt, op, comm);
}
