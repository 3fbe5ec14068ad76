/* Staging, collectives among the ranks of one node through CUDA IPC
 * (issue 20): instead of each device buffer going to host memory, through
 * MPI's collective and back, ranks read their peers' device buffers
 * mapped through IPC (staging/ipc_map.h) and copy straight into their own.
 *
 * When: IPC is on, every rank of the communicator is a node peer it
 * reaches (decided once per communicator, kept in an attribute), and the
 * per-rank bytes are at least RK_COLL_IPC_MIN: all of it the same on every
 * rank, so either all ranks exchange or none does. The rest is each rank's
 * own business (its buffers on the device, a predefined datatype without
 * holes, no MPI_IN_PLACE where it cannot be done, its memory exportable):
 * a flag that travels with the descriptors in one allgather. If any flag
 * is 0, every rank goes back to the staged path before touching anything.
 *
 * Mappings are opened before the first copy. One refused (a rare failure:
 * the node's decision at init mapped every peer) makes every rank stage
 * the call after all; the buffers the staged path reads are still as the
 * user left them, since IPC only wrote receive buffers (Allgather in place
 * leaves this rank's own block alone).
 *
 * A rank returns only once every peer is done reading its buffers (the
 * user may overwrite them then): the copies' events, then an allreduce of
 * the ranks' outcomes, which also spreads a failure to all.
 *
 * Reduce and Allreduce have no GPU kernels here (the plugin has none), so
 * the reduction runs on the CPU, split by slices: rank i copies slice i of
 * every rank's input to pinned memory, reduces it (MPI_Reduce_local, as
 * the slices arrive), and writes it to the result (Reduce: the root's
 * buffer, mapped; Allreduce: its own), then, for Allreduce, every rank
 * copies the other slices from their owners' results. Each rank moves its
 * share instead of MPI moving everything through shared memory, and the
 * result goes to the devices by device-to-device copies. */
#define _GNU_SOURCE
#include "coll_ipc.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

/* On a GPU shared with another rank, device-to-device copies wait for the
 * GPU to switch contexts (~145 us on the H100): below this size two copies
 * through pinned memory are faster (as staging/proto_ipc.c's ipc_take). */
#define BOUNCE_MAX ((size_t)4 << 20)

#define MAXR RK_COLL_IPC_MAXRANKS

enum { ST_OK, ST_RETRY, ST_FAIL }; /* ordered: the worst one wins */

/* ---- which communicators ---- */

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static int keyval = MPI_KEYVAL_INVALID;

/* The answer is kept as an integer in the attribute's pointer (nothing to
 * free); a duplicate does not inherit it, it asks again (no
 * communication). */
static void key_make(void)
{
    if (PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, MPI_COMM_NULL_DELETE_FN, &keyval, NULL) !=
        MPI_SUCCESS)
        keyval = MPI_KEYVAL_INVALID;
}

/* Every rank of comm is a node peer reached through IPC. The same answer on
 * every rank: IPC's decision is the node's, and a communicator that spans
 * nodes has, on each rank, members on another node. */
static int comm_check(MPI_Comm comm)
{
    int inter = 0, np = 0, me = 0;
    if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
        return 0;
    if (PMPI_Comm_size(comm, &np) != MPI_SUCCESS || np < 2 || np > MAXR ||
        PMPI_Comm_rank(comm, &me) != MPI_SUCCESS)
        return 0;
    MPI_Group g, wg;
    if (PMPI_Comm_group(comm, &g) != MPI_SUCCESS)
        return 0;
    if (PMPI_Comm_group(MPI_COMM_WORLD, &wg) != MPI_SUCCESS) {
        PMPI_Group_free(&g);
        return 0;
    }
    int in[MAXR], w[MAXR];
    for (int i = 0; i < np; i++)
        in[i] = i;
    int ok = PMPI_Group_translate_ranks(g, np, in, wg, w) == MPI_SUCCESS;
    for (int i = 0; ok && i < np; i++)
        if (i != me && (w[i] == MPI_UNDEFINED || !rk_ipc_reaches(w[i])))
            ok = 0;
    PMPI_Group_free(&g);
    PMPI_Group_free(&wg);
    return ok;
}

static int comm_fits(MPI_Comm comm)
{
    if (comm == MPI_COMM_NULL)
        return 0;
    pthread_once(&key_once, key_make);
    void *v = NULL;
    int flag = 0;
    if (keyval != MPI_KEYVAL_INVALID &&
        PMPI_Comm_get_attr(comm, keyval, &v, &flag) == MPI_SUCCESS && flag)
        return (int)(intptr_t)v - 1;
    int ok = comm_check(comm);
    if (keyval != MPI_KEYVAL_INVALID)
        PMPI_Comm_set_attr(comm, keyval, (void *)(intptr_t)(ok + 1));
    return ok;
}

/* Per-rank bytes of count x dt when the call may go through IPC on comm,
 * else 0. Only what is the same on every rank of comm decides. */
static size_t gate(int count, MPI_Datatype dt, MPI_Comm comm)
{
    int sz = 0;
    if (count <= 0 || PMPI_Type_size(dt, &sz) != MPI_SUCCESS || sz <= 0)
        return 0;
    size_t n = (size_t)count * (size_t)sz;
    if (n < RK_COLL_IPC_MIN || !comm_fits(comm))
        return 0;
    return n;
}

/* ---- this rank's facts ---- */

static int is_dev(const void *p) { return p != MPI_IN_PLACE && p != NULL && rk_stg_is_device(p); }

static size_t tsize(MPI_Datatype dt)
{
    int sz = 0;
    return PMPI_Type_size(dt, &sz) == MPI_SUCCESS && sz > 0 ? (size_t)sz : 0;
}

/* A predefined datatype without holes or padding: element k of a buffer
 * lies k * size bytes on, so blocks are plain byte ranges. */
static int plain(MPI_Datatype dt)
{
    int ni, na, nd, comb;
    MPI_Aint lb, ext, tlb, text;
    size_t sz = tsize(dt);
    return sz && PMPI_Type_get_envelope(dt, &ni, &na, &nd, &comb) == MPI_SUCCESS &&
           comb == MPI_COMBINER_NAMED && PMPI_Type_get_extent(dt, &lb, &ext) == MPI_SUCCESS &&
           PMPI_Type_get_true_extent(dt, &tlb, &text) == MPI_SUCCESS && lb == 0 && tlb == 0 &&
           (size_t)ext == sz && (size_t)text == sz;
}

/* Operations and types MPI_Reduce_local takes for sure (no pair types,
 * no complex MIN/MAX), commutative: the order of the ranks does not
 * matter. */
static int red_ok(MPI_Datatype dt, MPI_Op op)
{
    const MPI_Op ops[] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
    const MPI_Datatype types[] = {MPI_INT,           MPI_UNSIGNED,       MPI_LONG,
                                  MPI_UNSIGNED_LONG, MPI_LONG_LONG,      MPI_UNSIGNED_LONG_LONG,
                                  MPI_SHORT,         MPI_UNSIGNED_SHORT, MPI_SIGNED_CHAR,
                                  MPI_UNSIGNED_CHAR, MPI_FLOAT,          MPI_DOUBLE,
                                  MPI_INT8_T,        MPI_INT16_T,        MPI_INT32_T,
                                  MPI_INT64_T,       MPI_UINT8_T,        MPI_UINT16_T,
                                  MPI_UINT32_T,      MPI_UINT64_T};
    int o = 0, t = 0;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        o |= op == ops[i];
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        t |= dt == types[i];
    return o && t && plain(dt);
}

/* ---- one call ---- */

/* What each rank tells the others: whether it can take the IPC path, and
 * its buffers (in: what peers read; out: a result buffer peers read or
 * write). */
typedef struct {
    int32_t ok, spare;
    rk_ipc_desc_t in, out;
} info_t;

typedef struct {
    MPI_Comm comm;
    int me, np;
    int st; /* ST_*: this rank's, then the agreed worst */
    uint64_t t0;
    size_t copied;
    void *ev; /* the last copy's event: copies of one direction run in
               * order on one stream, so it covers the earlier ones */
    rk_stg_buf_t bounce, host;
    int no_bounce;
    void *held[2][MAXR]; /* mappings to release: in, out */
    info_t all[MAXR];
} op_t;

static void op_init(op_t *o, info_t *mine, MPI_Comm comm)
{
    o->comm = comm;
    o->me = 0;
    o->np = 1;
    PMPI_Comm_rank(comm, &o->me);
    PMPI_Comm_size(comm, &o->np);
    o->st = ST_OK;
    o->t0 = rk_stg_now();
    o->copied = 0;
    o->ev = NULL;
    memset(&o->bounce, 0, sizeof o->bounce);
    memset(&o->host, 0, sizeof o->host);
    o->no_bounce = 0;
    memset(o->held, 0, sizeof o->held);
    memset(mine, 0, sizeof *mine);
}

/* While staged receives wait for their first message, block in the
 * nonblocking form, polled (as staging/coll.c does): a peer may be waiting
 * for this rank to post its segments' receives. */
static int pending_now(void)
{
    return atomic_load_explicit(&rk_stg_pending, memory_order_relaxed) != 0;
}

/* The flags and descriptors of every rank: 1 all can go, 0 every rank
 * falls back (nothing done), -1 MPI failed (*rc). */
static int start(op_t *o, info_t *mine, int *rc)
{
    int b = (int)sizeof *mine, r;
    MPI_Request rq;
    if (!pending_now()) {
        r = PMPI_Allgather(mine, b, MPI_BYTE, o->all, b, MPI_BYTE, o->comm);
    } else {
        r = PMPI_Iallgather(mine, b, MPI_BYTE, o->all, b, MPI_BYTE, o->comm, &rq);
        if (r == MPI_SUCCESS)
            r = rk_stg_wait(&rq, MPI_STATUS_IGNORE);
    }
    if (r != MPI_SUCCESS) {
        *rc = r;
        return -1;
    }
    for (int j = 0; j < o->np; j++)
        if (!o->all[j].ok)
            return 0;
    return 1;
}

/* Wait for this rank's copies, then the worst outcome of all ranks into
 * o->st. After it, no peer reads or writes this rank's buffers any more.
 * MPI's code. */
static int settle(op_t *o)
{
    if (o->ev && rk_stg_event_wait(o->ev) != 0)
        o->st = ST_FAIL;
    rk_stg_event_put(o->ev);
    o->ev = NULL;
    int worst = ST_FAIL, r;
    MPI_Request rq;
    if (!pending_now()) {
        r = PMPI_Allreduce(&o->st, &worst, 1, MPI_INT, MPI_MAX, o->comm);
    } else {
        r = PMPI_Iallreduce(&o->st, &worst, 1, MPI_INT, MPI_MAX, o->comm, &rq);
        if (r == MPI_SUCCESS)
            r = rk_stg_wait(&rq, MPI_STATUS_IGNORE);
    }
    o->st = worst;
    return r;
}

/* Give everything back; 1 (done, *rc) or 0 (every rank stages the call). */
static int done(op_t *o, int mrc, int *rc)
{
    if (o->ev) {
        rk_stg_event_wait(o->ev);
        rk_stg_event_put(o->ev);
        o->ev = NULL;
    }
    for (int w = 0; w < 2; w++)
        for (int j = 0; j < o->np; j++)
            rk_ipc_release(o->held[w][j]);
    if (o->bounce.kind)
        rk_stg_buf_put(&o->bounce);
    if (o->host.kind)
        rk_stg_buf_put(&o->host);
    if (o->copied)
        rk_stg_count(o->copied, rk_stg_now() - o->t0);
    if (mrc != MPI_SUCCESS) {
        *rc = mrc;
        return 1;
    }
    if (o->st == ST_RETRY)
        return 0;
    if (o->st == ST_FAIL) {
        rk_mpi_warn("staging: a collective's copies through CUDA IPC failed");
        PMPI_Comm_call_errhandler(o->comm, MPI_ERR_OTHER);
        *rc = MPI_ERR_OTHER;
        return 1;
    }
    *rc = MPI_SUCCESS;
    return 1;
}

/* Rank j's buffer (which: 0 in, 1 out), mapped here, of at least need
 * bytes; NULL (and o->st) when refused. */
static char *peer(op_t *o, int j, int which, size_t need)
{
    const rk_ipc_desc_t *d = which ? &o->all[j].out : &o->all[j].in;
    if (d->bytes < need) { /* ranks disagree on the sizes: an erroneous call */
        o->st = ST_FAIL;
        return NULL;
    }
    char *p = rk_ipc_map(d);
    if (!p) {
        if (o->st < ST_RETRY)
            o->st = ST_RETRY;
        return NULL;
    }
    o->held[which][j] = p;
    return p;
}

/* Queue a copy of n bytes from src (a peer's memory mapped here, or ours)
 * to dst on this rank's device. bmax: the largest copy of the call (the
 * bounce buffer's size). */
static void pull(op_t *o, void *dst, const void *src, size_t n, size_t bmax)
{
    if (!n || o->st != ST_OK)
        return;
    void *ev = NULL;
    int e;
    if (rk_stg_shared_gpu && n < BOUNCE_MAX && !o->bounce.kind && !o->no_bounce &&
        rk_stg_buf_get(bmax, 1, &o->bounce) != 0)
        o->no_bounce = 1;
    if (rk_stg_shared_gpu && n < BOUNCE_MAX && o->bounce.kind && o->bounce.bytes >= n) {
        /* Both on one stream, in order: the next pull may reuse the bounce
         * buffer without waiting. */
        e = rk_stg_copy(o->bounce.ptr, src, n, RK_STG_D2D, NULL) != 0 ||
            rk_stg_copy(dst, o->bounce.ptr, n, RK_STG_D2D, &ev) != 0;
        o->copied += 2 * n;
    } else {
        e = rk_stg_copy(dst, src, n, RK_STG_D2D, &ev) != 0;
        o->copied += n;
    }
    if (e)
        o->st = ST_FAIL;
    rk_stg_event_put(o->ev);
    o->ev = ev;
}

/* ---- the collectives ---- */

int rk_coll_ipc_bcast_(void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm, int *rc)
{
    size_t n = gate(count, dt, comm);
    if (!n)
        return 0;
    op_t o;
    info_t mine;
    op_init(&o, &mine, comm);
    mine.ok = root >= 0 && root < o.np && plain(dt) && is_dev(buf) &&
              (o.me != root || rk_ipc_export(buf, n, &mine.in) == 0);
    int g = start(&o, &mine, rc);
    if (g <= 0)
        return g < 0;
    if (o.me != root) {
        char *p = peer(&o, root, 0, n);
        if (p)
            pull(&o, buf, p, n, n);
    }
    return done(&o, settle(&o), rc);
}

int rk_coll_ipc_allgather_(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                           MPI_Datatype rtype, MPI_Comm comm, int *rc)
{
    size_t n = gate(rcount, rtype, comm);
    if (!n)
        return 0;
    op_t o;
    info_t mine;
    op_init(&o, &mine, comm);
    int inplace = sbuf == MPI_IN_PLACE;
    char *r = rbuf;
    /* In place, this rank's block of rbuf is what peers read. */
    const char *src = inplace ? r + (size_t)o.me * n : sbuf;
    mine.ok = plain(rtype) && is_dev(rbuf) &&
              (inplace || (plain(stype) && scount > 0 && (size_t)scount * tsize(stype) == n &&
                           is_dev(sbuf))) &&
              rk_ipc_export(src, n, &mine.in) == 0;
    int g = start(&o, &mine, rc);
    if (g <= 0)
        return g < 0;
    char *p[MAXR];
    for (int k = 1; k < o.np; k++) {
        int j = (o.me + k) % o.np;
        p[j] = peer(&o, j, 0, n);
    }
    /* Peers in turn from the next one on, so that ranks do not all read
     * rank 0 first. */
    for (int k = 1; k < o.np; k++) {
        int j = (o.me + k) % o.np;
        pull(&o, r + (size_t)j * n, p[j], n, n);
    }
    if (!inplace)
        pull(&o, r + (size_t)o.me * n, sbuf, n, n);
    return done(&o, settle(&o), rc);
}

int rk_coll_ipc_alltoall_(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                          MPI_Datatype rtype, MPI_Comm comm, int *rc)
{
    size_t n = gate(rcount, rtype, comm);
    if (!n)
        return 0;
    op_t o;
    info_t mine;
    op_init(&o, &mine, comm);
    char *r = rbuf;
    const char *s = sbuf;
    /* In place, a rank would overwrite blocks its peers are reading: staged. */
    mine.ok = sbuf != MPI_IN_PLACE && plain(rtype) && plain(stype) && scount > 0 &&
              (size_t)scount * tsize(stype) == n && is_dev(sbuf) && is_dev(rbuf) &&
              rk_ipc_export(sbuf, n * (size_t)o.np, &mine.in) == 0;
    int g = start(&o, &mine, rc);
    if (g <= 0)
        return g < 0;
    char *p[MAXR];
    size_t me_off = (size_t)o.me * n;
    for (int k = 1; k < o.np; k++) {
        int j = (o.me + k) % o.np;
        p[j] = peer(&o, j, 0, n * (size_t)o.np);
    }
    /* Block me of rank j's send buffer is block j of ours. */
    for (int k = 1; k < o.np; k++) {
        int j = (o.me + k) % o.np;
        if (o.st == ST_OK)
            pull(&o, r + (size_t)j * n, p[j] + me_off, n, n);
    }
    pull(&o, r + me_off, s + me_off, n, n);
    return done(&o, settle(&o), rc);
}

/* First element of slice i of count elements cut in np. */
static size_t slice(int count, int np, int i) { return (size_t)count * (size_t)i / (size_t)np; }

static int reduce_ipc(int all, const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                      int root, MPI_Comm comm, int *rc)
{
    size_t n = gate(count, dt, comm);
    if (!n)
        return 0;
    op_t o;
    info_t mine;
    op_init(&o, &mine, comm);
    int me = o.me, np = o.np;
    if (all)
        root = me;
    int rsig = all || me == root; /* rbuf significant here */
    const char *in = sbuf == MPI_IN_PLACE ? rbuf : sbuf;
    mine.ok = root >= 0 && root < np && (sbuf != MPI_IN_PLACE || rsig) && red_ok(dt, op) &&
              is_dev(in) && (!rsig || is_dev(rbuf)) && rk_ipc_export(in, n, &mine.in) == 0 &&
              (!rsig || rk_ipc_export(rbuf, n, &mine.out) == 0);
    int g = start(&o, &mine, rc);
    if (g <= 0)
        return g < 0;
    size_t sz = n / (size_t)count, lo = slice(count, np, me),
           nb = (slice(count, np, me + 1) - lo) * sz;
    /* Every mapping first: a refusal then leaves every buffer as it was. */
    char *pin[MAXR], *pout[MAXR];
    for (int j = 0; j < np; j++) {
        pin[j] = j == me ? (char *)in : peer(&o, j, 0, n);
        pout[j] = j == me ? rbuf : all || j == root ? peer(&o, j, 1, n) : NULL;
    }
    char *dst = pout[root]; /* where this rank's slice of the result goes */
    /* Phase 1: slice me of every input to pinned memory, reduced as it
     * arrives. Peers in turn from the next one, ourselves last. */
    int j0 = (me + 1) % np, cnt = (int)(nb / sz);
    void *evs[MAXR] = {0};
    if (o.st == ST_OK && nb) {
        if (rk_stg_buf_get(nb * (size_t)np, 1, &o.host) != 0)
            o.st = ST_FAIL;
        for (int k = 0; k < np && o.st == ST_OK; k++) {
            int j = (j0 + k) % np;
            if (rk_stg_copy(o.host.ptr + (size_t)j * nb, pin[j] + lo * sz, nb, RK_STG_D2H,
                            &evs[j]) != 0)
                o.st = ST_FAIL;
            o.copied += nb;
        }
        for (int k = 0; k < np; k++) {
            int j = (j0 + k) % np;
            if (evs[j] && rk_stg_event_wait(evs[j]) != 0)
                o.st = ST_FAIL;
            if (k > 0 && o.st == ST_OK &&
                PMPI_Reduce_local(o.host.ptr + (size_t)j * nb, o.host.ptr + (size_t)j0 * nb, cnt,
                                  dt, op) != MPI_SUCCESS)
                o.st = ST_FAIL;
            rk_stg_event_put(evs[j]);
        }
    }
    /* Every input read (peers read ours in their phase 1): results may be
     * written now, in place included. */
    int mrc = settle(&o);
    if (mrc != MPI_SUCCESS || o.st != ST_OK)
        return done(&o, mrc, rc);
    if (nb) {
        void *ev = NULL;
        if (rk_stg_copy(dst + lo * sz, o.host.ptr + (size_t)j0 * nb, nb, RK_STG_H2D, &ev) != 0 ||
            rk_stg_event_wait(ev) != 0)
            o.st = ST_FAIL;
        rk_stg_event_put(ev);
        o.copied += nb;
    }
    if (all) {
        /* Phase 2: every slice written; take the others from their owners. */
        mrc = settle(&o);
        if (mrc != MPI_SUCCESS || o.st != ST_OK)
            return done(&o, mrc, rc);
        size_t bmax = ((size_t)count / (size_t)np + 1) * sz;
        for (int k = 1; k < np; k++) {
            int j = (me + k) % np;
            size_t a = slice(count, np, j), b = slice(count, np, j + 1);
            pull(&o, (char *)rbuf + a * sz, pout[j] + a * sz, (b - a) * sz, bmax);
        }
    }
    return done(&o, settle(&o), rc);
}

int rk_coll_ipc_reduce_(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                        int root, MPI_Comm comm, int *rc)
{
    return reduce_ipc(0, sbuf, rbuf, count, dt, op, root, comm, rc);
}

int rk_coll_ipc_allreduce_(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,
                           MPI_Comm comm, int *rc)
{
    return reduce_ipc(1, sbuf, rbuf, count, dt, op, 0, comm, rc);
}
