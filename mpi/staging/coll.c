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
#include "coll_ipc.h"
#include "staging.h"

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
    int kind; /* which reduction (R_*, RS_*), or which neighbourhood call */
    const void *sbuf;
    void *rbuf;
    int scount, rcount;
    const int *scounts, *sdispls, *rcounts, *rdispls;
    const MPI_Aint *sadispls, *radispls;  /* Neighbor_alltoallw's byte displacements */
    const MPI_Datatype *stypes, *rtypes; /* the w-forms: a datatype per block */
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
    const MPI_Datatype *wtypes;    /* w-arguments: a type per block, displacements in bytes */
    const MPI_Aint *wadispls;      /* (int ones in vdispls, or MPI_Aint ones here) */
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

/* Byte displacement of block i of a w-side. */
static MPI_Aint wdisp(const spec_t *p, int i)
{
    return p->wadispls ? p->wadispls[i] : (MPI_Aint)p->vdispls[i];
}

/* The region of a w-side: the union of its blocks' regions. */
static int wlayout(const spec_t *p, rk_stg_layout_t *L)
{
    ptrdiff_t lo = 0, hi = 0;
    int any = 0;
    memset(L, 0, sizeof *L);
    for (int i = 0; i < p->np; i++) {
        rk_stg_layout_t b;
        if (p->vcounts[i] <= 0)
            continue;
        int rc = rk_stg_layout(p->wtypes[i], 0, p->vcounts[i], &b);
        if (rc != MPI_SUCCESS)
            return rc;
        if (!b.size)
            continue;
        ptrdiff_t a = (ptrdiff_t)wdisp(p, i) + b.lo, e = a + (ptrdiff_t)b.span;
        lo = any && lo < a ? lo : a;
        hi = any && hi > e ? hi : e;
        any = 1;
        L->size += b.size;
    }
    L->lo = lo;
    L->span = (size_t)(hi - lo);
    return MPI_SUCCESS;
}

/* Stage side p of u (if significant here and u is device memory). A
 * nonblocking call never waits for host memory (wait_ok 0). */
static void side_prep(ctx_t *c, side_t *s, const void *u, const spec_t *p, int wait_ok)
{
    memset(s, 0, sizeof *s);
    s->u = (void *)u;
    s->h = (char *)u;
    if (!p->sig || c->rc != MPI_SUCCESS || !is_dev(u))
        return;
    int rc = p->wtypes ? wlayout(p, &s->L) : rk_stg_layout(p->dt, p->first, p->n, &s->L);
    if (rc != MPI_SUCCESS) {
        c->rc = rc;
        return;
    }
    if (!s->L.span)
        return; /* nothing of it is touched: MPI may have the pointer */
    if (rk_stg_buf_get(s->L.span, wait_ok, &s->hb) != 0) {
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
    if (p->wtypes) {
        for (int i = 0; i < p->np && !bad; i++) {
            rk_stg_layout_t b;
            if (p->vcounts[i] <= 0 || rk_stg_layout(p->wtypes[i], 0, p->vcounts[i], &b) != 0)
                continue;
            MPI_Aint d = wdisp(p, i);
            bad = rk_stg_put_elems_sync((char *)s->u + d, s->h + d, p->wtypes[i], 0,
                                        p->vcounts[i], &b, &c->copied);
        }
    } else if (p->vcounts) {
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
    side_prep(&c, &s, a->sbuf, sp, 1);
    side_prep(&c, &r, a->rbuf, rp, 1);
    if (c.rc == MPI_SUCCESS)
        rc = invoke(call, a, s.h, r.h);
    if (rc == MPI_SUCCESS)
        side_out(&c, &r, rp);
    side_put(&s);
    side_put(&r);
    return end(&c, a->comm, rc);
}

/* A nonblocking collective in flight: what its completion needs. The
 * user's count and displacement arrays stay valid until then (MPI's rule
 * for the nonblocking forms), so the specs may point into them. */
typedef struct {
    coll_t a;
    spec_t sp, rp;
    side_t s, r;
    ctx_t c;
} nbc_t;

static int nb_done(void *arg, MPI_Status *st)
{
    nbc_t *x = arg;
    (void)st; /* a failed collective is the request's error already */
    side_out(&x->c, &x->r, &x->rp);
    side_put(&x->s);
    side_put(&x->r);
    if (x->c.staged)
        rk_stg_count(x->c.copied, rk_stg_now() - x->c.t0);
    int rc = x->c.rc;
    if (rc != MPI_SUCCESS)
        rk_mpi_warn("staging: a nonblocking collective's copies failed");
    free(x);
    return rc;
}

/* The nonblocking form: stage the inputs now, start MPI's collective on
 * the host copies, and give the user a request whose completion copies the
 * results back (rk_stg_wrap). */
static int run_nb(const coll_t *a, call_fn call, const spec_t *sp, const spec_t *rp,
                  MPI_Request *req)
{
    nbc_t *x = calloc(1, sizeof *x);
    if (!x) {
        PMPI_Comm_call_errhandler(a->comm, MPI_ERR_NO_MEM);
        return MPI_ERR_NO_MEM;
    }
    int rc = begin(&x->c, a->comm);
    if (rc != MPI_SUCCESS) {
        free(x);
        return rc;
    }
    x->a = *a;
    x->sp = *sp;
    x->rp = *rp;
    side_prep(&x->c, &x->s, a->sbuf, sp, 0);
    side_prep(&x->c, &x->r, a->rbuf, rp, 0);
    MPI_Request inner = MPI_REQUEST_NULL;
    if (x->c.rc == MPI_SUCCESS)
        rc = call(&x->a, x->s.h, x->r.h, &inner);
    if (rc == MPI_SUCCESS && x->c.rc == MPI_SUCCESS) {
        rc = rk_stg_wrap(inner, a->comm, nb_done, x, req);
        if (rc == MPI_SUCCESS)
            return MPI_SUCCESS;
        /* No handle for the user: finish here rather than lose the call. */
        MPI_Status st;
        PMPI_Wait(&inner, &st);
        nb_done(x, &st);
        PMPI_Comm_call_errhandler(a->comm, rc);
        return rc;
    }
    side_put(&x->s);
    side_put(&x->r);
    rc = end(&x->c, a->comm, rc);
    free(x);
    return rc;
}

/* What a collective's two sides are on this rank (its specs). */
typedef void (*plan_fn)(const coll_t *a, spec_t *s, spec_t *r);

/* Every hook: straight to MPI when no buffer of this rank is on the
 * device (polled while staged receives wait, for the blocking forms);
 * else staged, blocking (req NULL) or not. */
static int coll(const coll_t *a, call_fn call, plan_fn plan, MPI_Request *req)
{
    if (RK_STG_LIKELY(!rk_stg_active) || (!is_dev(a->sbuf) && !is_dev(a->rbuf))) {
        if (req || RK_STG_LIKELY(!rk_stg_active) || !pending_now())
            return call(a, a->sbuf, a->rbuf, req);
        return invoke(call, a, a->sbuf, a->rbuf);
    }
    spec_t s, r;
    plan(a, &s, &r);
    return req ? run_nb(a, call, &s, &r, req) : run(a, call, &s, &r);
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

/* ---- the calls: MPI's blocking and nonblocking forms, what each side of
 * a call is on this rank (its plan), then the hooks ---- */

#define ARGS(...) __VA_ARGS__
/* The blocking hook and its nonblocking twin (same arguments and a
 * request), for the calls without a CUDA IPC path. */
#define HOOK_PAIR(Name, IName, call, plan, params, ...)             \
    EXPORT int Name(ARGS params)                                    \
    {                                                               \
        coll_t a = {__VA_ARGS__};                                   \
        return coll(&a, call, plan, NULL);                          \
    }                                                               \
    EXPORT int IName(ARGS params, MPI_Request *req)                 \
    {                                                               \
        coll_t a = {__VA_ARGS__};                                   \
        return coll(&a, call, plan, req);                           \
    }
/* Only the nonblocking hook (the blocking one tries CUDA IPC first). */
#define HOOK_NB(IName, call, plan, params, ...)                     \
    EXPORT int IName(ARGS params, MPI_Request *req)                 \
    {                                                               \
        coll_t a = {__VA_ARGS__};                                   \
        return coll(&a, call, plan, req);                           \
    }

/* -- Bcast -- */

static int bcast_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    (void)s;
    return q ? PMPI_Ibcast(r, a->rcount, a->rtype, a->root, a->comm, q)
             : PMPI_Bcast(r, a->rcount, a->rtype, a->root, a->comm);
}

static void bcast_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int me = comm_rank(a->comm);
    *s = whole(0, a->rtype, 0, 0);
    *r = whole(1, a->rtype, a->rcount, me == a->root);
    r->out = me != a->root;
}

EXPORT int MPI_Bcast(void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging/coll_ipc.c */
    if (rk_coll_ipc_bcast(buf, count, dt, root, comm, &irc))
        return irc;
    coll_t a = {.rbuf = buf, .rcount = count, .rtype = dt, .root = root, .comm = comm};
    return coll(&a, bcast_call, bcast_plan, NULL);
}

HOOK_NB(MPI_Ibcast, bcast_call, bcast_plan,
        (void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm),
        .rbuf = buf, .rcount = count, .rtype = dt, .root = root, .comm = comm)

/* -- Reduce, Allreduce, Scan, Exscan: count elements in, count out -- */

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

/* A reduction of long doubles stores 10 bytes of each 16 (x87): the other
 * 6 of the result are what the buffer held. Its image on the host must
 * then hold the device's bytes too, or they would come back as whatever
 * the pinned pool held (MPI on host buffers leaves them alone). */
static int padded_result(MPI_Datatype dt)
{
    return dt == MPI_LONG_DOUBLE || dt == MPI_C_LONG_DOUBLE_COMPLEX || dt == MPI_LONG_DOUBLE_INT;
}

static void reduce_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int me = a->kind == R_REDUCE || a->kind == R_EXSCAN ? comm_rank(a->comm) : 0;
    /* rbuf is significant at the root of a Reduce only; MPI reads it in
     * place; Exscan leaves rank 0's as it was. */
    int rsig = a->kind != R_REDUCE || me == a->root;
    *s = whole(1, a->rtype, a->rcount, 1);
    *r = whole(rsig, a->rtype, a->rcount, a->sbuf == MPI_IN_PLACE || padded_result(a->rtype));
    if (a->kind == R_EXSCAN && me == 0)
        r->out = 0;
}

#define RED(k) \
    .kind = k, .sbuf = sbuf, .rbuf = rbuf, .rcount = count, .rtype = dt, .op = op, .comm = comm

EXPORT int MPI_Reduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                      int root, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging/coll_ipc.c */
    if (rk_coll_ipc_reduce(sbuf, rbuf, count, dt, op, root, comm, &irc))
        return irc;
    coll_t a = {RED(R_REDUCE), .root = root};
    return coll(&a, reduce_call, reduce_plan, NULL);
}

HOOK_NB(MPI_Ireduce, reduce_call, reduce_plan,
        (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, int root,
         MPI_Comm comm),
        RED(R_REDUCE), .root = root)

EXPORT int MPI_Allreduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                         MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging/coll_ipc.c */
    if (rk_coll_ipc_allreduce(sbuf, rbuf, count, dt, op, comm, &irc))
        return irc;
    coll_t a = {RED(R_ALLREDUCE)};
    return coll(&a, reduce_call, reduce_plan, NULL);
}

HOOK_NB(MPI_Iallreduce, reduce_call, reduce_plan,
        (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
        RED(R_ALLREDUCE))
HOOK_PAIR(MPI_Scan, MPI_Iscan, reduce_call, reduce_plan,
          (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
          RED(R_SCAN))
HOOK_PAIR(MPI_Exscan, MPI_Iexscan, reduce_call, reduce_plan,
          (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
          RED(R_EXSCAN))

/* -- Gather, Scatter and their v-forms -- */

static int gather_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Igather(s, a->scount, a->stype, r, a->rcount, a->rtype, a->root, a->comm, q)
             : PMPI_Gather(s, a->scount, a->stype, r, a->rcount, a->rtype, a->root, a->comm);
}

static void gather_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int here = comm_rank(a->comm) == a->root;
    *s = whole(1, a->stype, a->scount, 1);
    *r = whole(here, a->rtype, (ptrdiff_t)a->rcount * comm_size(a->comm), a->sbuf == MPI_IN_PLACE);
}

#define SR_ARGS                                                                               \
    (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,               \
     MPI_Datatype rtype, int root, MPI_Comm comm)
#define SR_INIT                                                                                \
    .sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf, .rcount = rcount,           \
    .rtype = rtype, .root = root, .comm = comm

HOOK_PAIR(MPI_Gather, MPI_Igather, gather_call, gather_plan, SR_ARGS, SR_INIT)

static int gatherv_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Igatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls, a->rtype,
                             a->root, a->comm, q)
             : PMPI_Gatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls, a->rtype,
                            a->root, a->comm);
}

static void gatherv_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int here = comm_rank(a->comm) == a->root;
    *s = whole(1, a->stype, a->scount, 1);
    *r = vside(here, a->rtype, comm_size(a->comm), a->rcounts, a->rdispls, a->sbuf == MPI_IN_PLACE);
}

HOOK_PAIR(MPI_Gatherv, MPI_Igatherv, gatherv_call, gatherv_plan,
          (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
           const int displs[], MPI_Datatype rtype, int root, MPI_Comm comm),
          .sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf, .rcounts = rcounts,
          .rdispls = displs, .rtype = rtype, .root = root, .comm = comm)

static int scatter_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Iscatter(s, a->scount, a->stype, r, a->rcount, a->rtype, a->root, a->comm,
                             q)
             : PMPI_Scatter(s, a->scount, a->stype, r, a->rcount, a->rtype, a->root, a->comm);
}

static void scatter_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int here = comm_rank(a->comm) == a->root;
    *s = whole(here, a->stype, (ptrdiff_t)a->scount * comm_size(a->comm), 1);
    *r = whole(a->rbuf != MPI_IN_PLACE, a->rtype, a->rcount, 0);
}

HOOK_PAIR(MPI_Scatter, MPI_Iscatter, scatter_call, scatter_plan, SR_ARGS, SR_INIT)

static int scatterv_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Iscatterv(s, a->scounts, a->sdispls, a->stype, r, a->rcount, a->rtype,
                              a->root, a->comm, q)
             : PMPI_Scatterv(s, a->scounts, a->sdispls, a->stype, r, a->rcount, a->rtype,
                             a->root, a->comm);
}

static void scatterv_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int here = comm_rank(a->comm) == a->root;
    *s = vside(here, a->stype, comm_size(a->comm), a->scounts, a->sdispls, 1);
    *r = whole(a->rbuf != MPI_IN_PLACE, a->rtype, a->rcount, 0);
}

HOOK_PAIR(MPI_Scatterv, MPI_Iscatterv, scatterv_call, scatterv_plan,
          (const void *sbuf, const int scounts[], const int displs[], MPI_Datatype stype,
           void *rbuf, int rcount, MPI_Datatype rtype, int root, MPI_Comm comm),
          .sbuf = sbuf, .scounts = scounts, .sdispls = displs, .stype = stype, .rbuf = rbuf,
          .rcount = rcount, .rtype = rtype, .root = root, .comm = comm)

/* -- Allgather(v), Alltoall(v, w) -- */

static int allgather_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Iallgather(s, a->scount, a->stype, r, a->rcount, a->rtype, a->comm, q)
             : PMPI_Allgather(s, a->scount, a->stype, r, a->rcount, a->rtype, a->comm);
}

static void allgather_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    *s = whole(1, a->stype, a->scount, 1);
    *r = whole(1, a->rtype, (ptrdiff_t)a->rcount * comm_size(a->comm), a->sbuf == MPI_IN_PLACE);
}

#define A_ARGS                                                                                 \
    (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,                \
     MPI_Datatype rtype, MPI_Comm comm)
#define A_INIT                                                                                 \
    .sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf, .rcount = rcount,           \
    .rtype = rtype, .comm = comm

EXPORT int MPI_Allgather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf,
                         int rcount, MPI_Datatype rtype, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging/coll_ipc.c */
    if (rk_coll_ipc_allgather(sbuf, scount, stype, rbuf, rcount, rtype, comm, &irc))
        return irc;
    coll_t a = {A_INIT};
    return coll(&a, allgather_call, allgather_plan, NULL);
}

HOOK_NB(MPI_Iallgather, allgather_call, allgather_plan, A_ARGS, A_INIT)

static int allgatherv_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Iallgatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls, a->rtype,
                                a->comm, q)
             : PMPI_Allgatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls, a->rtype,
                               a->comm);
}

static void allgatherv_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    *s = whole(1, a->stype, a->scount, 1);
    *r = vside(1, a->rtype, comm_size(a->comm), a->rcounts, a->rdispls, a->sbuf == MPI_IN_PLACE);
}

HOOK_PAIR(MPI_Allgatherv, MPI_Iallgatherv, allgatherv_call, allgatherv_plan,
          (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
           const int displs[], MPI_Datatype rtype, MPI_Comm comm),
          .sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf, .rcounts = rcounts,
          .rdispls = displs, .rtype = rtype, .comm = comm)

static int alltoall_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Ialltoall(s, a->scount, a->stype, r, a->rcount, a->rtype, a->comm, q)
             : PMPI_Alltoall(s, a->scount, a->stype, r, a->rcount, a->rtype, a->comm);
}

static void alltoall_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int np = comm_size(a->comm);
    *s = whole(1, a->stype, (ptrdiff_t)a->scount * np, 1);
    *r = whole(1, a->rtype, (ptrdiff_t)a->rcount * np, a->sbuf == MPI_IN_PLACE);
}

EXPORT int MPI_Alltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                        MPI_Datatype rtype, MPI_Comm comm)
{
    int irc; /* CUDA IPC among this node's ranks: staging/coll_ipc.c */
    if (rk_coll_ipc_alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, &irc))
        return irc;
    coll_t a = {A_INIT};
    return coll(&a, alltoall_call, alltoall_plan, NULL);
}

HOOK_NB(MPI_Ialltoall, alltoall_call, alltoall_plan, A_ARGS, A_INIT)

static int alltoallv_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Ialltoallv(s, a->scounts, a->sdispls, a->stype, r, a->rcounts, a->rdispls,
                               a->rtype, a->comm, q)
             : PMPI_Alltoallv(s, a->scounts, a->sdispls, a->stype, r, a->rcounts, a->rdispls,
                              a->rtype, a->comm);
}

static void alltoallv_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int np = comm_size(a->comm), in = a->sbuf == MPI_IN_PLACE;
    *s = vside(!in, a->stype, np, a->scounts, a->sdispls, 1);
    *r = vside(1, a->rtype, np, a->rcounts, a->rdispls, in);
}

#define V_ARGS                                                                                 \
    (const void *sbuf, const int scounts[], const int sdispls[], MPI_Datatype stype,          \
     void *rbuf, const int rcounts[], const int rdispls[], MPI_Datatype rtype, MPI_Comm comm)
#define V_INIT                                                                                 \
    .sbuf = sbuf, .scounts = scounts, .sdispls = sdispls, .stype = stype, .rbuf = rbuf,       \
    .rcounts = rcounts, .rdispls = rdispls, .rtype = rtype, .comm = comm

HOOK_PAIR(MPI_Alltoallv, MPI_Ialltoallv, alltoallv_call, alltoallv_plan, V_ARGS, V_INIT)

/* A side of a w-call: np blocks, each its own count, type and byte
 * displacement (int ones, or MPI_Aint ones for the neighbourhood form). */
static spec_t wside(int sig, int np, const int *counts, const int *idispls,
                    const MPI_Aint *adispls, const MPI_Datatype *types, int input)
{
    spec_t p = whole(sig, MPI_BYTE, 0, input);
    if (sig) {
        p.np = np;
        p.vcounts = counts;
        p.vdispls = idispls;
        p.wadispls = adispls;
        p.wtypes = types;
    }
    return p;
}

static int alltoallw_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    return q ? PMPI_Ialltoallw(s, a->scounts, a->sdispls, a->stypes, r, a->rcounts, a->rdispls,
                               a->rtypes, a->comm, q)
             : PMPI_Alltoallw(s, a->scounts, a->sdispls, a->stypes, r, a->rcounts, a->rdispls,
                              a->rtypes, a->comm);
}

static void alltoallw_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int np = comm_size(a->comm), in = a->sbuf == MPI_IN_PLACE;
    *s = wside(!in, np, a->scounts, a->sdispls, NULL, a->stypes, 1);
    *r = wside(1, np, a->rcounts, a->rdispls, NULL, a->rtypes, in);
}

HOOK_PAIR(MPI_Alltoallw, MPI_Ialltoallw, alltoallw_call, alltoallw_plan,
          (const void *sbuf, const int scounts[], const int sdispls[],
           const MPI_Datatype stypes[], void *rbuf, const int rcounts[], const int rdispls[],
           const MPI_Datatype rtypes[], MPI_Comm comm),
          .sbuf = sbuf, .scounts = scounts, .sdispls = sdispls, .stypes = stypes, .rbuf = rbuf,
          .rcounts = rcounts, .rdispls = rdispls, .rtypes = rtypes, .comm = comm)

/* -- Reduce_scatter (rcounts) and Reduce_scatter_block (rcount): total
 * elements in, mine out (in place: rbuf holds the total, in and out) -- */

enum { RS_COUNTS, RS_BLOCK };

static int reduce_scatter_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    if (a->kind == RS_COUNTS)
        return q ? PMPI_Ireduce_scatter(s, r, a->rcounts, a->rtype, a->op, a->comm, q)
                 : PMPI_Reduce_scatter(s, r, a->rcounts, a->rtype, a->op, a->comm);
    return q ? PMPI_Ireduce_scatter_block(s, r, a->rcount, a->rtype, a->op, a->comm, q)
             : PMPI_Reduce_scatter_block(s, r, a->rcount, a->rtype, a->op, a->comm);
}

static void reduce_scatter_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int me = comm_rank(a->comm), np = comm_size(a->comm);
    ptrdiff_t total = 0, mine = a->rcounts ? a->rcounts[me] : a->rcount;
    if (a->rcounts)
        for (int i = 0; i < np; i++)
            total += a->rcounts[i];
    else
        total = (ptrdiff_t)a->rcount * np;
    int inplace = a->sbuf == MPI_IN_PLACE;
    *s = whole(1, a->rtype, total, 1);
    *r = whole(1, a->rtype, inplace ? total : mine, inplace || padded_result(a->rtype));
    r->nout = mine;
}

HOOK_PAIR(MPI_Reduce_scatter, MPI_Ireduce_scatter, reduce_scatter_call, reduce_scatter_plan,
          (const void *sbuf, void *rbuf, const int rcounts[], MPI_Datatype dt, MPI_Op op,
           MPI_Comm comm),
          .kind = RS_COUNTS, .sbuf = sbuf, .rbuf = rbuf, .rcounts = rcounts, .rtype = dt,
          .op = op, .comm = comm)
HOOK_PAIR(MPI_Reduce_scatter_block, MPI_Ireduce_scatter_block, reduce_scatter_call,
          reduce_scatter_plan,
          (const void *sbuf, void *rbuf, int rcount, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
          .kind = RS_BLOCK, .sbuf = sbuf, .rbuf = rbuf, .rcount = rcount, .rtype = dt, .op = op,
          .comm = comm)

/* -- Neighbourhood collectives: blocks per neighbour, in the order of the
 * communicator's topology (sources receive, destinations send) -- */

static void degrees(MPI_Comm comm, int *indeg, int *outdeg)
{
    int topo = MPI_UNDEFINED, nd = 0, w = 0;
    *indeg = *outdeg = 0;
    PMPI_Topo_test(comm, &topo);
    if (topo == MPI_CART && PMPI_Cartdim_get(comm, &nd) == MPI_SUCCESS) {
        *indeg = *outdeg = 2 * nd;
    } else if (topo == MPI_GRAPH) {
        int n = 0;
        PMPI_Graph_neighbors_count(comm, comm_rank(comm), &n);
        *indeg = *outdeg = n;
    } else if (topo == MPI_DIST_GRAPH) {
        PMPI_Dist_graph_neighbors_count(comm, indeg, outdeg, &w);
    }
}

enum { N_ALLGATHER, N_ALLGATHERV, N_ALLTOALL, N_ALLTOALLV, N_ALLTOALLW };

static int neighbor_call(const coll_t *a, const void *s, void *r, MPI_Request *q)
{
    MPI_Comm c = a->comm;
    switch (a->kind) {
    case N_ALLGATHER:
        return q ? PMPI_Ineighbor_allgather(s, a->scount, a->stype, r, a->rcount, a->rtype, c, q)
                 : PMPI_Neighbor_allgather(s, a->scount, a->stype, r, a->rcount, a->rtype, c);
    case N_ALLGATHERV:
        return q ? PMPI_Ineighbor_allgatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls,
                                             a->rtype, c, q)
                 : PMPI_Neighbor_allgatherv(s, a->scount, a->stype, r, a->rcounts, a->rdispls,
                                            a->rtype, c);
    case N_ALLTOALL:
        return q ? PMPI_Ineighbor_alltoall(s, a->scount, a->stype, r, a->rcount, a->rtype, c, q)
                 : PMPI_Neighbor_alltoall(s, a->scount, a->stype, r, a->rcount, a->rtype, c);
    case N_ALLTOALLV:
        return q ? PMPI_Ineighbor_alltoallv(s, a->scounts, a->sdispls, a->stype, r, a->rcounts,
                                            a->rdispls, a->rtype, c, q)
                 : PMPI_Neighbor_alltoallv(s, a->scounts, a->sdispls, a->stype, r, a->rcounts,
                                           a->rdispls, a->rtype, c);
    default:
        return q ? PMPI_Ineighbor_alltoallw(s, a->scounts, a->sadispls, a->stypes, r,
                                            a->rcounts, a->radispls, a->rtypes, c, q)
                 : PMPI_Neighbor_alltoallw(s, a->scounts, a->sadispls, a->stypes, r, a->rcounts,
                                           a->radispls, a->rtypes, c);
    }
}

static void neighbor_plan(const coll_t *a, spec_t *s, spec_t *r)
{
    int in, out;
    degrees(a->comm, &in, &out);
    switch (a->kind) {
    case N_ALLGATHER:
        *s = whole(1, a->stype, a->scount, 1);
        *r = whole(1, a->rtype, (ptrdiff_t)a->rcount * in, 0);
        break;
    case N_ALLGATHERV:
        *s = whole(1, a->stype, a->scount, 1);
        *r = vside(1, a->rtype, in, a->rcounts, a->rdispls, 0);
        break;
    case N_ALLTOALL:
        *s = whole(1, a->stype, (ptrdiff_t)a->scount * out, 1);
        *r = whole(1, a->rtype, (ptrdiff_t)a->rcount * in, 0);
        break;
    case N_ALLTOALLV:
        *s = vside(1, a->stype, out, a->scounts, a->sdispls, 1);
        *r = vside(1, a->rtype, in, a->rcounts, a->rdispls, 0);
        break;
    default:
        *s = wside(1, out, a->scounts, NULL, a->sadispls, a->stypes, 1);
        *r = wside(1, in, a->rcounts, NULL, a->radispls, a->rtypes, 0);
    }
}

HOOK_PAIR(MPI_Neighbor_allgather, MPI_Ineighbor_allgather, neighbor_call, neighbor_plan,
          A_ARGS, .kind = N_ALLGATHER, A_INIT)
HOOK_PAIR(MPI_Neighbor_allgatherv, MPI_Ineighbor_allgatherv, neighbor_call, neighbor_plan,
          (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
           const int displs[], MPI_Datatype rtype, MPI_Comm comm),
          .kind = N_ALLGATHERV, .sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf,
          .rcounts = rcounts, .rdispls = displs, .rtype = rtype, .comm = comm)
HOOK_PAIR(MPI_Neighbor_alltoall, MPI_Ineighbor_alltoall, neighbor_call, neighbor_plan, A_ARGS,
          .kind = N_ALLTOALL, A_INIT)
HOOK_PAIR(MPI_Neighbor_alltoallv, MPI_Ineighbor_alltoallv, neighbor_call, neighbor_plan, V_ARGS,
          .kind = N_ALLTOALLV, V_INIT)
HOOK_PAIR(MPI_Neighbor_alltoallw, MPI_Ineighbor_alltoallw, neighbor_call, neighbor_plan,
          (const void *sbuf, const int scounts[], const MPI_Aint sdispls[],
           const MPI_Datatype stypes[], void *rbuf, const int rcounts[], const MPI_Aint rdispls[],
           const MPI_Datatype rtypes[], MPI_Comm comm),
          .kind = N_ALLTOALLW, .sbuf = sbuf, .scounts = scounts, .sadispls = sdispls,
          .stypes = stypes, .rbuf = rbuf, .rcounts = rcounts, .radispls = rdispls,
          .rtypes = rtypes, .comm = comm)

/* ---- persistent collectives (MPI 4's MPI_*_init; Open MPI 4's MPIX_*_init) ----
 *
 * While staging is active every rank takes them over, whatever its buffers:
 * each MPI_Start issues the nonblocking collective through the hooks above
 * (staged where a buffer is on the device), so that no rank's persistent
 * collective of MPI's meets another rank's nonblocking one. The request is a
 * persistent request of ours (staging/persist.c). MPI checks the arguments
 * at each start, not at init; the info argument is not used. Without
 * staging they are MPI's own. */

#if MPI_VERSION >= 4
#define RK_PCOLL 1
#define PINIT(x) MPI_##x##_init
#define PPINIT(x) PMPI_##x##_init
#else
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#if defined(OMPI_HAVE_MPI_EXT_PCOLLREQ) && OMPI_HAVE_MPI_EXT_PCOLLREQ
#define RK_PCOLL 1
#define PINIT(x) MPIX_##x##_init
#define PPINIT(x) PMPIX_##x##_init
#endif
#endif

#ifdef RK_PCOLL
typedef struct {
    coll_t a;
    call_fn call;
    plan_fn plan;
} pcoll_t;

static int pcoll_start(void *arg, MPI_Request *inner)
{
    pcoll_t *x = arg;
    return coll(&x->a, x->call, x->plan, inner);
}

static int pcoll_new(const coll_t *a, call_fn call, plan_fn plan, MPI_Request *req)
{
    pcoll_t *x = malloc(sizeof *x);
    if (!x) {
        rk_mpi_warn("staging: out of memory for a persistent collective");
        PMPI_Comm_call_errhandler(a->comm, MPI_ERR_NO_MEM);
        return MPI_ERR_NO_MEM;
    }
    x->a = *a;
    x->call = call;
    x->plan = plan;
    return rk_stg_pers_fn(pcoll_start, x, a->comm, req);
}

#define HOOK_PERS(Base, call, plan, params, names, ...)                                       \
    EXPORT int PINIT(Base)(ARGS params, MPI_Info info, MPI_Request *req)                     \
    {                                                                                         \
        if (RK_STG_LIKELY(!rk_stg_active))                                                   \
            return PPINIT(Base)(ARGS names, info, req);                                      \
        coll_t a = {__VA_ARGS__};                                                             \
        return pcoll_new(&a, call, plan, req);                                                \
    }

#define RED_ARGS \
    (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, MPI_Comm comm)
#define RED_NAMES (sbuf, rbuf, count, dt, op, comm)
#define SR_NAMES (sbuf, scount, stype, rbuf, rcount, rtype, root, comm)
#define A_NAMES (sbuf, scount, stype, rbuf, rcount, rtype, comm)
#define V_NAMES (sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm)
#define W_NAMES (sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm)

HOOK_PERS(Bcast, bcast_call, bcast_plan,
          (void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm),
          (buf, count, dt, root, comm),
          .rbuf = buf, .rcount = count, .rtype = dt, .root = root, .comm = comm)
HOOK_PERS(Reduce, reduce_call, reduce_plan,
          (const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, int root,
           MPI_Comm comm),
          (sbuf, rbuf, count, dt, op, root, comm), RED(R_REDUCE), .root = root)
HOOK_PERS(Allreduce, reduce_call, reduce_plan, RED_ARGS, RED_NAMES, RED(R_ALLREDUCE))
HOOK_PERS(Scan, reduce_call, reduce_plan, RED_ARGS, RED_NAMES, RED(R_SCAN))
HOOK_PERS(Exscan, reduce_call, reduce_plan, RED_ARGS, RED_NAMES, RED(R_EXSCAN))
HOOK_PERS(Gather, gather_call, gather_plan, SR_ARGS, SR_NAMES, SR_INIT)
HOOK_PERS(Gatherv, gatherv_call, gatherv_plan,
          (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
           const int displs[], MPI_Datatype rtype, int root, MPI_Comm comm),
          (sbuf, scount, stype, rbuf, rcounts, displs, rtype, root, comm),
          .sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf, .rcounts = rcounts,
          .rdispls = displs, .rtype = rtype, .root = root, .comm = comm)
HOOK_PERS(Scatter, scatter_call, scatter_plan, SR_ARGS, SR_NAMES, SR_INIT)
HOOK_PERS(Scatterv, scatterv_call, scatterv_plan,
          (const void *sbuf, const int scounts[], const int displs[], MPI_Datatype stype,
           void *rbuf, int rcount, MPI_Datatype rtype, int root, MPI_Comm comm),
          (sbuf, scounts, displs, stype, rbuf, rcount, rtype, root, comm),
          .sbuf = sbuf, .scounts = scounts, .sdispls = displs, .stype = stype, .rbuf = rbuf,
          .rcount = rcount, .rtype = rtype, .root = root, .comm = comm)
HOOK_PERS(Allgather, allgather_call, allgather_plan, A_ARGS, A_NAMES, A_INIT)
HOOK_PERS(Allgatherv, allgatherv_call, allgatherv_plan,
          (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
           const int displs[], MPI_Datatype rtype, MPI_Comm comm),
          (sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm),
          .sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf, .rcounts = rcounts,
          .rdispls = displs, .rtype = rtype, .comm = comm)
HOOK_PERS(Alltoall, alltoall_call, alltoall_plan, A_ARGS, A_NAMES, A_INIT)
HOOK_PERS(Alltoallv, alltoallv_call, alltoallv_plan, V_ARGS, V_NAMES, V_INIT)
HOOK_PERS(Alltoallw, alltoallw_call, alltoallw_plan,
          (const void *sbuf, const int scounts[], const int sdispls[],
           const MPI_Datatype stypes[], void *rbuf, const int rcounts[], const int rdispls[],
           const MPI_Datatype rtypes[], MPI_Comm comm),
          W_NAMES,
          .sbuf = sbuf, .scounts = scounts, .sdispls = sdispls, .stypes = stypes, .rbuf = rbuf,
          .rcounts = rcounts, .rdispls = rdispls, .rtypes = rtypes, .comm = comm)
HOOK_PERS(Reduce_scatter, reduce_scatter_call, reduce_scatter_plan,
          (const void *sbuf, void *rbuf, const int rcounts[], MPI_Datatype dt, MPI_Op op,
           MPI_Comm comm),
          (sbuf, rbuf, rcounts, dt, op, comm),
          .kind = RS_COUNTS, .sbuf = sbuf, .rbuf = rbuf, .rcounts = rcounts, .rtype = dt,
          .op = op, .comm = comm)
HOOK_PERS(Reduce_scatter_block, reduce_scatter_call, reduce_scatter_plan,
          (const void *sbuf, void *rbuf, int rcount, MPI_Datatype dt, MPI_Op op, MPI_Comm comm),
          (sbuf, rbuf, rcount, dt, op, comm),
          .kind = RS_BLOCK, .sbuf = sbuf, .rbuf = rbuf, .rcount = rcount, .rtype = dt, .op = op,
          .comm = comm)
HOOK_PERS(Neighbor_allgather, neighbor_call, neighbor_plan, A_ARGS, A_NAMES,
          .kind = N_ALLGATHER, A_INIT)
HOOK_PERS(Neighbor_allgatherv, neighbor_call, neighbor_plan,
          (const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
           const int displs[], MPI_Datatype rtype, MPI_Comm comm),
          (sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm),
          .kind = N_ALLGATHERV, .sbuf = sbuf, .scount = scount, .stype = stype, .rbuf = rbuf,
          .rcounts = rcounts, .rdispls = displs, .rtype = rtype, .comm = comm)
HOOK_PERS(Neighbor_alltoall, neighbor_call, neighbor_plan, A_ARGS, A_NAMES,
          .kind = N_ALLTOALL, A_INIT)
HOOK_PERS(Neighbor_alltoallv, neighbor_call, neighbor_plan, V_ARGS, V_NAMES,
          .kind = N_ALLTOALLV, V_INIT)
HOOK_PERS(Neighbor_alltoallw, neighbor_call, neighbor_plan,
          (const void *sbuf, const int scounts[], const MPI_Aint sdispls[],
           const MPI_Datatype stypes[], void *rbuf, const int rcounts[], const MPI_Aint rdispls[],
           const MPI_Datatype rtypes[], MPI_Comm comm),
          W_NAMES,
          .kind = N_ALLTOALLW, .sbuf = sbuf, .scounts = scounts, .sadispls = sdispls,
          .stypes = stypes, .rbuf = rbuf, .rcounts = rcounts, .radispls = rdispls,
          .rtypes = rtypes, .comm = comm)
#endif /* RK_PCOLL */
