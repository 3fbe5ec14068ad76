/* Staging, point to point: the send and receive protocols, the request
 * table of staged nonblocking requests, and the Wait/Test family.
 *
 * On the wire (docs/staging.md has the whole story):
 *   - a message from a host buffer, or from a device buffer of at most
 *     RK_STG_BIG bytes or of a non-contiguous datatype, is one ordinary MPI
 *     message on the user's communicator and tag (device data copied to
 *     pinned memory first);
 *   - a larger contiguous device message is a 32-byte header on the user's
 *     communicator and tag, then its bytes in segments on the plugin's
 *     duplicate of MPI_COMM_WORLD, tagged with an id the header carries.
 *     The header keeps MPI's matching (any source, any tag, order between
 *     a pair) exactly as the user's message would have; the segments
 *     cannot meet anything of the user's.
 * So a receiver must recognise a header: every device receive, and every
 * host receive of more than RK_STG_BIG bytes (smaller ones cannot meet
 * one), goes through here.
 *
 * Staged nonblocking requests: the user gets a generalized request
 * (MPI_Grequest_start) as handle, which stays allocated until the user
 * completes it, so its value cannot be reused by MPI for another request
 * while the table maps it; the MPI requests underneath are ours to test
 * and free. Such a request is advanced by any Wait/Test call and, while
 * its first message has not arrived, by every staged call (rk_stg_progress):
 * the sender of a header waits for us to post the segments' receives. */
#define _GNU_SOURCE
#include "staging.h"
#include "ipc_map.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RK_STG_EXPORT RK_MPI_EXPORT

/* ---- header ---- */

#define MAGIC0 0x726b6d656d737467ull /* "rkmemstg" */
#define MAGIC1 0x9d3a5c1e77b2f4a1ull

typedef struct {
    uint64_t magic0, magic1;
    uint64_t total; /* bytes of the message */
    uint32_t seg;   /* bytes per segment (the last one may be shorter) */
    int32_t id;     /* tag of the segments on the plugin's communicator */
} hdr_t;
_Static_assert(sizeof(hdr_t) == RK_STG_HDR_BYTES, "header size");

/* hdr.seg of a message whose data the receiver copies itself through CUDA
 * IPC (staging/ipc_map.h): after the header, the sender's descriptor comes on
 * the plugin's communicator (tag id); the receiver answers there with one
 * int, ACK_*, once it has the data (or cannot). */
#define SEG_IPC 0xFFFFFFFFu
enum { ACK_DONE = 0, ACK_SEND_DATA = 1, ACK_NONE = 2 };

static int is_header(const void *p, hdr_t *h)
{
    memcpy(h, p, sizeof *h);
    return h->magic0 == MAGIC0 && h->magic1 == MAGIC1 && h->seg > 0 && h->id >= 0 &&
           h->total > 0;
}

/* Segment size for a pipelined message: about 4 segments, at least 1 MiB
 * and at most a chunk. Below 1 MiB a segment's fixed costs (a rendezvous in
 * MPI, a copy launch) show: on the H100 machine a ring of 256 KiB segments
 * moved 4.8 GB/s where 1 to 4 MiB segments moved 7.4 to 8 (docs/staging.md). */
static size_t seg_size(size_t total)
{
    size_t s = (total / 4 + 65535) & ~(size_t)65535;
    if (s < ((size_t)1 << 20))
        s = (size_t)1 << 20;
    if (s > rk_stg_chunk())
        s = rk_stg_chunk();
    if (s > total)
        s = total;
    return s;
}

/* World rank of rank r of comm (the remote group for an intercommunicator);
 * -1 if it is not in MPI_COMM_WORLD (spawned processes). */
static int to_world(MPI_Comm comm, int r)
{
    if (comm == MPI_COMM_WORLD)
        return r;
    int inter = 0, w = MPI_UNDEFINED;
    MPI_Group g = MPI_GROUP_NULL, wg = MPI_GROUP_NULL;
    if (PMPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS)
        return -1;
    if ((inter ? PMPI_Comm_remote_group(comm, &g) : PMPI_Comm_group(comm, &g)) != MPI_SUCCESS)
        return -1;
    if (PMPI_Comm_group(MPI_COMM_WORLD, &wg) == MPI_SUCCESS)
        PMPI_Group_translate_ranks(g, 1, &r, wg, &w);
    PMPI_Group_free(&g);
    if (wg != MPI_GROUP_NULL)
        PMPI_Group_free(&wg);
    return w == MPI_UNDEFINED ? -1 : w;
}

/* Byte count of a status. */
static size_t status_bytes(const MPI_Status *st)
{
    MPI_Count n = 0;
    if (PMPI_Get_elements_x(st, MPI_BYTE, &n) != MPI_SUCCESS || n < 0)
        return 0;
    return (size_t)n;
}

static void status_set_bytes(MPI_Status *st, size_t bytes)
{
    PMPI_Status_set_elements_x(st, MPI_BYTE, (MPI_Count)bytes);
}

static int staging_error(MPI_Comm comm, const char *what)
{
    rk_mpi_warn("staging: %s", what);
    PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
}

/* ---- polling ---- */

void rk_stg_idle(unsigned *spins)
{
    rk_stg_progress();
    if (++*spins % 64 == 0)
        sched_yield();
}

int rk_stg_wait(MPI_Request *req, MPI_Status *st)
{
    unsigned spins = 0;
    for (;;) {
        int flag = 0;
        int rc = PMPI_Test(req, &flag, st);
        if (rc != MPI_SUCCESS || flag)
            return rc;
        rk_stg_idle(&spins);
    }
}

/* Wait for n requests (MPI_REQUEST_NULL allowed), polling. */
static int wait_all(int n, MPI_Request *reqs)
{
    unsigned spins = 0;
    for (;;) {
        int flag = 0;
        int rc = PMPI_Testall(n, reqs, &flag, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS || flag)
            return rc;
        rk_stg_idle(&spins);
    }
}

static int pending_now(void) { return atomic_load_explicit(&rk_stg_pending, memory_order_relaxed) != 0; }

/* ---- the request table ---- */

enum { K_SEND = 1, K_RECV, K_WRAP };
enum { S_FIRST = 1, S_SEGS, S_COPY, S_DONE, S_IPC, S_IPC_ACK, S_IPC_DATA };

typedef struct req {
    struct req *hnext;         /* table chain */
    struct req *pnext, *pprev; /* waiting-for-first-message list */
    uint64_t key;
    MPI_Request user; /* the generalized request the user holds */
    int kind, state;
    int dev;          /* the user's buffer is device memory */
    int detached;     /* MPI_Request_free'd by the user */
    int leak;         /* MPI may still read hb after a cancelled header: keep it */
    int err;          /* MPI error class to report, MPI_SUCCESS */
    MPI_Status st;    /* status of the first message; count set at the end */
    void *ubuf;
    int count;
    MPI_Datatype dt;
    MPI_Comm comm;
    rk_stg_layout_t L;
    rk_stg_buf_t hb;   /* host image (device recv), data (send) */
    rk_stg_buf_t pk;   /* packed bytes of a pipelined message, non-contiguous receiver */
    MPI_Request first; /* the plain message or the header */
    hdr_t hdr;         /* sent, or received */
    int nseg, nrecvd;
    size_t total, seg;
    MPI_Request *segs;
    int *idx;       /* for Testsome over segs */
    void **evs;     /* per segment (contiguous device receive), else evs[0] */
    int nevs;
    uint64_t t0, ns;
    size_t copied; /* bytes through the copy engine */
    /* Ring mode (nonblocking pipelined device messages): segment k goes
     * through slot k % RK_STG_DEPTH, a pinned buffer taken from the pool for
     * that segment only; the request is in alist while it has work left. */
    int ring, peer;               /* peer: world rank of the other side */
    int next_start, next_post;    /* next segment to start (copy / receive), to send */
    int ndone;                    /* segments finished */
    int nslots;                   /* slots in use */
    struct req *anext, *aprev;    /* active ring list */
    /* CUDA IPC: the descriptor (sent, or received), the answer (sent, or
     * received; -1 once a sender has posted the data after ACK_SEND_DATA),
     * and the peer's buffer while the receiver's copy runs. */
    int ipc, ack;
    rk_ipc_desc_t desc;
    void *mapped;
    int inl;                   /* in ilist */
    rk_stg_done_fn done;       /* K_WRAP: runs once MPI's request (first) completed */
    void *done_arg;
    int no_ipc;                /* a send whose data must be copied out at once */
    struct req *inext, *iprev; /* IPC receives with work left */
    struct {
        int seg;           /* segment in the slot, -1 when free */
        int state;         /* R_* */
        void *ev;          /* its copy's event */
        MPI_Request rq;    /* its send or receive */
        rk_stg_buf_t b;    /* its pinned buffer */
    } slot[RK_STG_DEPTH];
} req_t;
enum { R_FREE = 0, R_COPY_IN, R_SEND, R_RECV, R_COPY_OUT };

#define NBUCKETS 256
static pthread_mutex_t eng = PTHREAD_MUTEX_INITIALIZER;
static req_t *buckets[NBUCKETS];
static req_t *plist; /* receives in S_FIRST */
static int ndetached;

static uint64_t req_key(MPI_Request r)
{
    uint64_t k = 0;
    memcpy(&k, &r, sizeof r < sizeof k ? sizeof r : sizeof k);
    return k;
}

static size_t bucket_of(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 56); }

/* Under eng. */
static req_t *lookup_locked(MPI_Request h)
{
    if (h == MPI_REQUEST_NULL)
        return NULL;
    uint64_t k = req_key(h);
    for (req_t *r = buckets[bucket_of(k)]; r; r = r->hnext)
        if (r->key == k)
            return r;
    return NULL;
}

static req_t *lookup(MPI_Request h)
{
    if (atomic_load_explicit(&rk_stg_nreq, memory_order_relaxed) == 0)
        return NULL;
    pthread_mutex_lock(&eng);
    req_t *r = lookup_locked(h);
    pthread_mutex_unlock(&eng);
    return r;
}

static void plist_add(req_t *r)
{
    r->pprev = NULL;
    r->pnext = plist;
    if (plist)
        plist->pprev = r;
    plist = r;
    atomic_fetch_add(&rk_stg_pending, 1);
}

static void plist_del(req_t *r)
{
    if (r->pprev)
        r->pprev->pnext = r->pnext;
    else if (plist == r)
        plist = r->pnext;
    else
        return; /* not in the list */
    if (r->pnext)
        r->pnext->pprev = r->pprev;
    r->pnext = r->pprev = NULL;
    atomic_fetch_sub(&rk_stg_pending, 1);
}

/* ---- ring mode: nonblocking pipelined device messages ----
 *
 * A staged MPI_Isend or MPI_Irecv of a large contiguous device buffer moves
 * its segments through a few pinned slots taken from the pool one segment at
 * a time, driven by rk_stg_progress (every staged call, and every blocking
 * call while such a request is active, polls) and by Wait/Test. Few slots in
 * use at once keep the host memory that MPI copies hot in the CPU's caches:
 * the same bytes through distinct buffers per message moved 6 GB/s on the
 * H100 machine, through a reused ring 8. Requests take slots oldest first,
 * at most RING_BUDGET per direction, except a request holding none when no
 * slot finished for RING_STALL_NS: its peer may be waiting for it before it
 * receives the messages that hold the slots. */

#define RING_BUDGET RK_STG_DEPTH
#define RING_STALL_NS 200000u

static req_t *alist, *alist_tail; /* under eng, oldest first */
static int ring_inuse[2];         /* slots in use: [0] sends, [1] receives */
static uint64_t ring_moved[2];    /* when a slot last finished */

static void alist_add(req_t *r)
{
    r->anext = NULL;
    r->aprev = alist_tail;
    if (alist_tail)
        alist_tail->anext = r;
    else
        alist = r;
    alist_tail = r;
    r->ring = 2; /* in the list */
    atomic_fetch_add(&rk_stg_rings, 1);
}

static void alist_del(req_t *r)
{
    if (r->ring != 2)
        return;
    if (r->aprev)
        r->aprev->anext = r->anext;
    else
        alist = r->anext;
    if (r->anext)
        r->anext->aprev = r->aprev;
    else
        alist_tail = r->aprev;
    r->anext = r->aprev = NULL;
    r->ring = 1;
    atomic_fetch_sub(&rk_stg_rings, 1);
}

static long ring_msgs; /* messages that went through the ring (verbose) */

static void slot_clear(req_t *r, int i)
{
    r->slot[i].seg = -1;
    r->slot[i].state = R_FREE;
    r->slot[i].ev = NULL;
    r->slot[i].rq = MPI_REQUEST_NULL;
    memset(&r->slot[i].b, 0, sizeof r->slot[i].b);
}

static void ring_init(req_t *r, int peer, size_t total, size_t seg)
{
    ring_msgs++;
    r->ring = 1;
    r->peer = peer;
    r->total = total;
    r->seg = seg;
    r->nseg = (int)((total + seg - 1) / seg);
    r->next_start = r->next_post = r->ndone = r->nslots = 0;
    for (int i = 0; i < RK_STG_DEPTH; i++)
        slot_clear(r, i);
}

static size_t seg_len(size_t total, size_t seg, int k);

/* Whether r may put segment r->next_start into its slot now. Under eng. */
static int ring_may_start(req_t *r, int dir)
{
    int i = r->next_start % RK_STG_DEPTH;
    if (r->next_start >= r->nseg || r->slot[i].state != R_FREE || r->err)
        return 0;
    if (ring_inuse[dir] < RING_BUDGET)
        return 1;
    return r->nslots == 0 && rk_stg_now() - ring_moved[dir] > RING_STALL_NS;
}

/* Slot i of r has a segment: its buffer. -1 without memory at all. */
static int ring_take(req_t *r, int i, int dir)
{
    if (rk_stg_buf_get(r->seg, 0, &r->slot[i].b) != 0)
        return -1;
    r->slot[i].seg = r->next_start++;
    r->nslots++;
    ring_inuse[dir]++;
    return 0;
}

/* Slot i of r is done with its segment. keep: MPI may still read the
 * buffer (a cancelled send): do not give it back. */
static void ring_free(req_t *r, int i, int dir, int keep)
{
    rk_stg_event_put(r->slot[i].ev);
    if (!keep)
        rk_stg_buf_put(&r->slot[i].b);
    slot_clear(r, i);
    r->nslots--;
    r->ndone++;
    ring_inuse[dir]--;
    ring_moved[dir] = rk_stg_now();
}

/* Sending: copies into free slots, each segment sent in order once its copy
 * is done, slots freed as their sends finish. Under eng. */
static void ring_send_advance(req_t *r)
{
    for (int i = 0; i < RK_STG_DEPTH; i++)
        if (r->slot[i].state == R_SEND) {
            int f = 0;
            if (PMPI_Test(&r->slot[i].rq, &f, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                r->err = MPI_ERR_OTHER, f = 1;
            if (f)
                ring_free(r, i, 0, 0);
        }
    while (r->next_post < r->next_start) {
        int i = r->next_post % RK_STG_DEPTH;
        int t = rk_stg_event_test(r->slot[i].ev);
        if (t == 0)
            break;
        if (t < 0)
            r->err = MPI_ERR_OTHER; /* sent anyway: the receiver waits for it */
        int k = r->next_post++;
        if (PMPI_Isend(r->slot[i].b.ptr, (int)seg_len(r->total, r->seg, k), MPI_BYTE, r->peer,
                       r->hdr.id, rk_stg_comm(), &r->slot[i].rq) != MPI_SUCCESS) {
            r->err = MPI_ERR_OTHER;
            ring_free(r, i, 0, 0);
            continue;
        }
        r->slot[i].state = R_SEND;
    }
    while (ring_may_start(r, 0)) {
        int i = r->next_start % RK_STG_DEPTH, k = r->next_start;
        if (ring_take(r, i, 0) != 0)
            break;
        size_t off = (size_t)k * r->seg, n = seg_len(r->total, r->seg, k);
        if (rk_stg_copy(r->slot[i].b.ptr, (const char *)r->ubuf + off, n, RK_STG_D2H,
                        &r->slot[i].ev) != 0)
            r->err = MPI_ERR_OTHER; /* no event: the segment goes as it is */
        r->copied += n;
        r->slot[i].state = R_COPY_IN;
    }
}

/* Receiving: receives posted into free slots in order, each landed segment
 * copied to the device, its slot freed when the copy is done. Under eng. */
static void ring_recv_advance(req_t *r)
{
    for (int i = 0; i < RK_STG_DEPTH; i++) {
        if (r->slot[i].state == R_RECV) {
            int f = 0;
            if (PMPI_Test(&r->slot[i].rq, &f, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                r->err = MPI_ERR_OTHER, f = 1;
            if (!f)
                continue;
            int k = r->slot[i].seg;
            size_t off = (size_t)k * r->seg, n = seg_len(r->total, r->seg, k);
            if (rk_stg_copy((char *)r->ubuf + off, r->slot[i].b.ptr, n, RK_STG_H2D,
                            &r->slot[i].ev) != 0)
                r->err = MPI_ERR_OTHER;
            r->copied += n;
            r->slot[i].state = R_COPY_OUT;
        }
        if (r->slot[i].state == R_COPY_OUT) {
            int t = rk_stg_event_test(r->slot[i].ev);
            if (t < 0)
                r->err = MPI_ERR_OTHER;
            if (t != 0)
                ring_free(r, i, 1, 0);
        }
    }
    while (ring_may_start(r, 1)) {
        int i = r->next_start % RK_STG_DEPTH, k = r->next_start;
        if (ring_take(r, i, 1) != 0)
            break;
        if (PMPI_Irecv(r->slot[i].b.ptr, (int)seg_len(r->total, r->seg, k), MPI_BYTE, r->peer,
                       r->hdr.id, rk_stg_comm(), &r->slot[i].rq) != MPI_SUCCESS) {
            r->err = MPI_ERR_OTHER;
            ring_free(r, i, 1, 0);
            continue;
        }
        r->slot[i].state = R_RECV;
    }
}

/* A ring send whose header was cancelled: its segments will never be
 * received. Sends posted are cancelled and their buffers left to MPI; the
 * others end here. Under eng. */
static void ring_send_cancel(req_t *r)
{
    for (int i = 0; i < RK_STG_DEPTH; i++) {
        if (r->slot[i].state == R_SEND) {
            PMPI_Cancel(&r->slot[i].rq);
            PMPI_Request_free(&r->slot[i].rq);
            ring_free(r, i, 0, 1);
        } else if (r->slot[i].state == R_COPY_IN) {
            rk_stg_event_wait(r->slot[i].ev);
            ring_free(r, i, 0, 0);
        }
    }
    /* Nothing more goes: the request is done with what it finished. */
    r->nseg = r->next_start = r->next_post = r->ndone;
}

/* Advance a ring request; 1 when all its segments are done. Under eng. */
static int ring_advance(req_t *r)
{
    if (r->kind == K_SEND)
        ring_send_advance(r);
    else
        ring_recv_advance(r);
    if (r->ndone < r->nseg)
        return 0;
    alist_del(r);
    return 1;
}

static int advance_locked(req_t *r);

/* Nonblocking IPC receives between their header and their answer: the
 * sender waits for the answer, so they advance wherever rings do (counted
 * in rk_stg_rings, so that MPI's progress engine calls us); and IPC sends
 * until done, since the answer may ask them for the data. Under eng. */
static req_t *ilist;

static void ilist_add(req_t *r)
{
    if (r->inl)
        return;
    r->iprev = NULL;
    r->inext = ilist;
    if (ilist)
        ilist->iprev = r;
    ilist = r;
    r->inl = 1;
    atomic_fetch_add(&rk_stg_rings, 1);
}

static void ilist_del(req_t *r)
{
    if (!r->inl)
        return;
    if (r->iprev)
        r->iprev->inext = r->inext;
    else
        ilist = r->inext;
    if (r->inext)
        r->inext->iprev = r->iprev;
    r->inl = 0;
    atomic_fetch_sub(&rk_stg_rings, 1);
}

/* Advance every ring request and IPC receive (each may leave its list).
 * Under eng. */
static void alist_advance(void)
{
    for (req_t *r = alist, *next; r; r = next) {
        next = r->anext;
        advance_locked(r);
    }
    for (req_t *r = ilist, *next; r; r = next) {
        next = r->inext;
        advance_locked(r);
    }
}

/* From MPI's progress engine (staging/base.c): advance the ring requests, unless
 * another thread is at it or this one is already inside the engine lock
 * (our own MPI calls under it progress too). */
int rk_stg_ring_poll(void)
{
    static __thread int inside;
    if (inside || pthread_mutex_trylock(&eng) != 0)
        return 0;
    inside = 1;
    alist_advance();
    inside = 0;
    pthread_mutex_unlock(&eng);
    return 0;
}

/* Generalized requests: we complete them ourselves; MPI only frees them. */
static int gq_query(void *extra, MPI_Status *st)
{
    (void)extra;
    PMPI_Status_set_elements(st, MPI_BYTE, 0);
    PMPI_Status_set_cancelled(st, 0);
    st->MPI_SOURCE = MPI_UNDEFINED;
    st->MPI_TAG = MPI_UNDEFINED;
    return MPI_SUCCESS;
}
static int gq_free(void *extra)
{
    (void)extra;
    return MPI_SUCCESS;
}
static int gq_cancel(void *extra, int complete)
{
    (void)extra, (void)complete;
    return MPI_SUCCESS;
}

static req_t *req_new(int kind, void *ubuf, int count, MPI_Datatype dt, MPI_Comm comm)
{
    req_t *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->kind = kind;
    r->ubuf = ubuf;
    r->count = count;
    r->dt = dt;
    r->comm = comm;
    r->first = MPI_REQUEST_NULL;
    r->user = MPI_REQUEST_NULL;
    r->t0 = rk_stg_now();
    return r;
}

/* Give the user a handle for r and enter it in the table. */
static int req_publish(req_t *r, MPI_Request *user)
{
    int rc = PMPI_Grequest_start(gq_query, gq_free, gq_cancel, NULL, &r->user);
    if (rc != MPI_SUCCESS)
        return rc;
    r->key = req_key(r->user);
    pthread_mutex_lock(&eng);
    size_t b = bucket_of(r->key);
    r->hnext = buckets[b];
    buckets[b] = r;
    if (r->kind == K_RECV && r->state == S_FIRST)
        plist_add(r);
    pthread_mutex_unlock(&eng);
    atomic_fetch_add(&rk_stg_nreq, 1);
    *user = r->user;
    return MPI_SUCCESS;
}

int rk_stg_wrap(MPI_Request inner, MPI_Comm comm, rk_stg_done_fn done, void *arg,
                MPI_Request *user)
{
    req_t *r = req_new(K_WRAP, NULL, 0, MPI_DATATYPE_NULL, comm);
    if (!r)
        return MPI_ERR_NO_MEM;
    r->first = inner;
    r->done = done;
    r->done_arg = arg;
    r->state = S_SEGS;
    int rc = req_publish(r, user);
    if (rc != MPI_SUCCESS)
        free(r);
    return rc;
}

static void req_release(req_t *r)
{
    for (int i = 0; i < r->nevs; i++)
        rk_stg_event_put(r->evs ? r->evs[i] : NULL);
    free(r->evs);
    free(r->segs);
    free(r->idx);
    if (!r->leak) {
        if (r->hb.kind)
            rk_stg_buf_put(&r->hb);
        if (r->pk.kind)
            rk_stg_buf_put(&r->pk);
    }
    free(r);
}

/* ---- receive side: after the first message ---- */

static int alloc_segs(req_t *r, int nseg, int nevs)
{
    r->nseg = nseg;
    r->segs = malloc((size_t)nseg * sizeof *r->segs);
    r->idx = malloc((size_t)nseg * sizeof *r->idx);
    r->evs = calloc((size_t)(nevs > 0 ? nevs : 1), sizeof *r->evs);
    r->nevs = nevs;
    if (!r->segs || !r->idx || !r->evs)
        return -1;
    for (int i = 0; i < nseg; i++)
        r->segs[i] = MPI_REQUEST_NULL;
    return 0;
}

static size_t seg_len(size_t total, size_t seg, int k)
{
    size_t off = (size_t)k * seg;
    return total - off < seg ? total - off : seg;
}

/* The first 32 bytes a receive got, in the order they came (a receive
 * through a non-contiguous datatype scatters them). */
static int first_bytes(void *base, int count, MPI_Datatype dt, const rk_stg_layout_t *L,
                       MPI_Comm comm, hdr_t *h)
{
    if (L->contig)
        return is_header(base, h);
    int n = (int)((RK_STG_HDR_BYTES + L->tsize - 1) / L->tsize), psz = 0, pos = 0;
    if (n > count)
        n = count;
    if (PMPI_Pack_size(n, dt, comm, &psz) != MPI_SUCCESS || psz < RK_STG_HDR_BYTES)
        return 0;
    char *tmp = malloc((size_t)psz);
    int yes = 0;
    if (tmp && PMPI_Pack(base, n, dt, tmp, psz, &pos, comm) == MPI_SUCCESS &&
        pos >= RK_STG_HDR_BYTES)
        yes = is_header(tmp, h);
    free(tmp);
    return yes;
}

static void ipc_recv_start(req_t *r, int src);
static void ipc_recv_advance(req_t *r);

/* Elements of a receive that bytes of data fill (a last partial element
 * counts: its received bytes must reach the device). Contiguous: the bytes
 * themselves go back, as one run. */
static ptrdiff_t elems_in(const rk_stg_layout_t *L, size_t bytes)
{
    if (!L->tsize)
        return 0;
    return (ptrdiff_t)((bytes + L->tsize - 1) / L->tsize);
}

/* The first message of a staged nonblocking receive has come (status *st).
 * Under eng. */
static void on_first(req_t *r, const MPI_Status *st)
{
    r->st = *st;
    int cancelled = 0;
    PMPI_Test_cancelled(st, &cancelled);
    if (cancelled) {
        r->state = S_DONE;
        return;
    }
    size_t bytes = status_bytes(st);
    char *img = r->dev ? r->hb.ptr - r->L.lo : (char *)r->ubuf; /* ubuf's equivalent */
    hdr_t h;
    if (bytes == RK_STG_HDR_BYTES && first_bytes(img, r->count, r->dt, &r->L, r->comm, &h)) {
        r->hdr = h;
        r->total = h.total;
        r->seg = h.seg;
        int src = to_world(r->comm, st->MPI_SOURCE);
        if (h.seg == SEG_IPC) {
            ipc_recv_start(r, src);
            return;
        }
        int nseg = (int)((h.total + h.seg - 1) / h.seg);
        char *dst;
        if (h.total > r->L.size || src < 0) {
            /* Truncated: take the segments into one scratch buffer and drop them. */
            r->err = src < 0 ? MPI_ERR_OTHER : MPI_ERR_TRUNCATE;
            if (alloc_segs(r, nseg, 0) != 0 || rk_stg_buf_get(h.seg, 0, &r->pk) != 0) {
                r->state = S_DONE;
                return;
            }
            for (int k = 0; k < nseg && src >= 0; k++)
                PMPI_Irecv(r->pk.ptr, (int)seg_len(h.total, h.seg, k), MPI_BYTE, src, h.id,
                           rk_stg_comm(), &r->segs[k]);
            r->total = 0;
            r->state = S_SEGS;
            return;
        }
        if (r->L.contig && r->dev && rk_stg_hooked) {
            /* Through the ring: the image is not needed any more. */
            rk_stg_buf_put(&r->hb);
            ring_init(r, src, h.total, h.seg);
            r->state = S_SEGS;
            alist_add(r);
            ring_advance(r);
            return;
        }
        if (r->L.contig) {
            dst = r->dev ? r->hb.ptr : (char *)r->ubuf;
            if (alloc_segs(r, nseg, r->dev ? nseg : 0) != 0)
                goto oom;
        } else {
            if (alloc_segs(r, nseg, 1) != 0 || rk_stg_buf_get(h.total, 0, &r->pk) != 0)
                goto oom;
            dst = r->pk.ptr;
        }
        for (int k = 0; k < nseg; k++)
            PMPI_Irecv(dst + (size_t)k * h.seg, (int)seg_len(h.total, h.seg, k), MPI_BYTE, src,
                       h.id, rk_stg_comm(), &r->segs[k]);
        r->state = S_SEGS;
        return;
    }
    /* An ordinary message. */
    r->total = bytes;
    if (!r->dev) {
        r->state = S_DONE;
        return;
    }
    r->evs = calloc(1, sizeof *r->evs);
    r->nevs = 1;
    if (!r->evs || rk_stg_put_elems(r->ubuf, r->hb.ptr - r->L.lo, r->dt, 0, elems_in(&r->L, bytes),
                                    &r->L, &r->evs[0], &r->copied))
        r->err = MPI_ERR_OTHER;
    r->state = S_COPY;
    return;
oom:
    rk_mpi_warn("staging: out of memory for a receive of %zu bytes", (size_t)h.total);
    r->err = MPI_ERR_NO_MEM;
    r->state = S_DONE;
}

/* Segments of a pipelined receive: copy each to the device as it lands.
 * Under eng. */
static void advance_segs(req_t *r)
{
    if (r->ring) {
        if (ring_advance(r))
            r->state = S_DONE;
        return;
    }
    int out = 0;
    if (r->nrecvd < r->nseg &&
        PMPI_Testsome(r->nseg, r->segs, &out, r->idx, MPI_STATUSES_IGNORE) == MPI_SUCCESS &&
        out != MPI_UNDEFINED) {
        for (int j = 0; j < out; j++) {
            int k = r->idx[j];
            if (r->dev && r->L.contig && r->total) {
                size_t off = (size_t)k * r->seg, n = seg_len(r->total, r->seg, k);
                if (rk_stg_copy((char *)r->ubuf + off, r->hb.ptr + off, n, RK_STG_H2D,
                                &r->evs[k]) != 0)
                    r->err = MPI_ERR_OTHER;
                r->copied += n;
            }
        }
        r->nrecvd += out;
    }
    if (r->nrecvd < r->nseg)
        return;
    if (!r->L.contig && r->total) {
        /* Packed bytes: into the user's layout (host) or the image (device). */
        int pos = 0;
        char *img = r->dev ? r->hb.ptr - r->L.lo : (char *)r->ubuf;
        int n = (int)(r->total / r->L.tsize);
        if (PMPI_Unpack(r->pk.ptr, (int)r->total, &pos, img, n, r->dt, r->comm) != MPI_SUCCESS)
            r->err = MPI_ERR_OTHER;
        if (r->dev && rk_stg_put_elems(r->ubuf, img, r->dt, 0, n, &r->L, &r->evs[0],
                                       &r->copied) != 0)
            r->err = MPI_ERR_OTHER;
    }
    r->state = S_COPY;
}

/* ---- CUDA IPC (staging/ipc_map.h): one copy by the receiver ---- */

static int deliver(void *buf, int count, MPI_Datatype dt, int dev, const void *tmp, size_t bytes,
                   MPI_Comm comm, size_t *copied);

/* Start taking the data of an IPC message (descriptor d, total bytes) into
 * (buf, count, dt). ACK_DONE: the copy is queued (*ev, NULL when already
 * done; release *mapped after it) or failed (*err). ACK_SEND_DATA: the
 * peer's memory cannot be mapped here, the sender must send the bytes.
 * ACK_NONE: nothing to take (*err: truncation, a bad descriptor). */
/* On a GPU shared with another rank, a device-to-device copy waits for
 * the GPU to switch between the processes' contexts (~145 us on the H100
 * machine, docs/staging.md); two copies through pinned memory take the copy
 * engines instead. Below this size that is the faster way. */
#define IPC_BOUNCE_MAX ((size_t)4 << 20)

static int ipc_take(void *buf, int count, MPI_Datatype dt, int dev, const rk_stg_layout_t *L,
                    const rk_ipc_desc_t *d, size_t total, MPI_Comm comm, int wait_ok, void **ev,
                    void **mapped, rk_stg_buf_t *bounce, size_t *copied, int *err)
{
    *ev = NULL;
    *mapped = NULL;
    if (total > L->size) {
        *err = MPI_ERR_TRUNCATE;
        return ACK_NONE;
    }
    if (d->bytes != total) {
        *err = MPI_ERR_OTHER;
        return ACK_NONE;
    }
    if (total == 0)
        return ACK_DONE;
    char *p = rk_ipc_map(d);
    if (!p)
        return ACK_SEND_DATA;
    *copied += total;
    if (L->contig) {
        /* Device to device (or to the user's host buffer), on the stream
         * of the direction the destination takes. */
        *mapped = p;
        if (dev && rk_stg_shared_gpu && total < IPC_BOUNCE_MAX &&
            rk_stg_buf_get(total, wait_ok, bounce) == 0) {
            /* Both on one stream: in order, no event between them. */
            if (rk_stg_copy(bounce->ptr, p, total, RK_STG_D2D, NULL) != 0 ||
                rk_stg_copy(buf, bounce->ptr, total, RK_STG_D2D, ev) != 0)
                *err = MPI_ERR_OTHER;
            *copied += total;
            return ACK_DONE;
        }
        if (rk_stg_copy(buf, p, total, dev ? RK_STG_D2D : RK_STG_D2H, ev) != 0)
            *err = MPI_ERR_OTHER;
        return ACK_DONE;
    }
    /* A datatype with holes: the bytes to host memory, then unpacked as a
     * staged message would be. */
    rk_stg_buf_t t;
    int rc = MPI_ERR_NO_MEM;
    if (rk_stg_buf_get(total, wait_ok, &t) == 0) {
        rc = rk_stg_copy_sync(t.ptr, p, total, RK_STG_D2H) ? MPI_ERR_OTHER : MPI_SUCCESS;
        if (rc == MPI_SUCCESS)
            rc = deliver(buf, count, dt, dev, t.ptr, total, comm, copied);
        rk_stg_buf_put(&t);
    }
    rk_ipc_release(p);
    if (rc != MPI_SUCCESS)
        *err = rc;
    return ACK_DONE;
}

/* Nonblocking receive: the header said IPC; the descriptor comes next. */
static void ipc_recv_start(req_t *r, int src)
{
    r->ipc = 1;
    r->peer = src;
    /* The host image of a device receive is not needed: data comes by a
     * copy from the peer's memory. */
    if (r->hb.kind)
        rk_stg_buf_put(&r->hb);
    if (src < 0 || alloc_segs(r, 2, 1) != 0) {
        r->err = src < 0 ? MPI_ERR_OTHER : MPI_ERR_NO_MEM;
        r->state = S_DONE;
        return;
    }
    PMPI_Irecv(&r->desc, (int)sizeof r->desc, MPI_BYTE, src, r->hdr.id, rk_stg_comm(),
               &r->segs[0]);
    r->state = S_IPC;
    ilist_add(r);
}

/* S_IPC: descriptor -> copy. S_IPC_ACK: copy done -> answer (and, after
 * ACK_SEND_DATA, the data's receive). S_IPC_DATA: both done -> S_DONE.
 * Under eng. */
static void ipc_recv_advance(req_t *r)
{
    int flag = 0;
    if (r->state == S_IPC) {
        if (PMPI_Test(&r->segs[0], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            r->err = MPI_ERR_OTHER;
            r->state = S_DONE;
            ilist_del(r);
            return;
        }
        if (!flag)
            return;
        int err = MPI_SUCCESS;
        r->ack = ipc_take(r->ubuf, r->count, r->dt, r->dev, &r->L, &r->desc, r->total, r->comm, 0,
                          &r->evs[0], &r->mapped, &r->pk, &r->copied, &err);
        if (err != MPI_SUCCESS)
            r->err = err;
        r->state = S_IPC_ACK;
    }
    if (r->state == S_IPC_ACK) {
        int t = rk_stg_event_test(r->evs[0]);
        if (t == 0)
            return;
        if (t < 0)
            r->err = MPI_ERR_OTHER;
        rk_stg_event_put(r->evs[0]);
        r->evs[0] = NULL;
        rk_ipc_release(r->mapped);
        r->mapped = NULL;
        if (r->pk.kind)
            rk_stg_buf_put(&r->pk); /* the bounce buffer */
        MPI_Comm wc = rk_stg_comm();
        if (r->ack == ACK_SEND_DATA) {
            if (rk_stg_buf_get(r->total, 0, &r->pk) != 0) {
                r->err = MPI_ERR_NO_MEM;
                r->ack = ACK_NONE;
            } else {
                PMPI_Irecv(r->pk.ptr, (int)r->total, MPI_BYTE, r->peer, r->hdr.id, wc,
                           &r->segs[1]);
            }
        }
        PMPI_Isend(&r->ack, 1, MPI_INT, r->peer, r->hdr.id, rk_ipc_ack_comm(), &r->segs[0]);
        r->state = S_IPC_DATA;
    }
    if (r->state == S_IPC_DATA) {
        if (PMPI_Testall(2, r->segs, &flag, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
            r->err = MPI_ERR_OTHER, flag = 1;
        if (!flag)
            return;
        if (r->ack == ACK_SEND_DATA && r->err == MPI_SUCCESS) {
            int rc = deliver(r->ubuf, r->count, r->dt, r->dev, r->pk.ptr, r->total, r->comm,
                             &r->copied);
            if (rc != MPI_SUCCESS)
                r->err = rc;
        }
        r->state = S_DONE;
        ilist_del(r);
    }
}

/* A sender told ACK_SEND_DATA: the receiver could not map our memory, so
 * the bytes go as one staged message on the plugin's communicator. 1 when
 * nothing is left to do (an error), 0 when the send is posted. Under eng. */
static int ipc_send_data(req_t *r)
{
    r->ack = -1;
    if (rk_stg_buf_get(r->L.size, 0, &r->hb) != 0 ||
        rk_stg_copy_sync(r->hb.ptr, r->ubuf, r->L.size, RK_STG_D2H) != 0) {
        /* The receiver waits for these bytes: send what we have rather than
         * leave it hanging, and report the error here. */
        r->err = MPI_ERR_OTHER;
        if (!r->hb.kind)
            return 1;
    }
    r->copied += r->L.size;
    PMPI_Isend(r->hb.ptr, (int)r->L.size, MPI_BYTE, r->peer, r->hdr.id, rk_stg_comm(),
               &r->segs[0]);
    return 0;
}

/* Advance r as far as it goes now; 1 when done. Under eng. */
static int advance_locked(req_t *r)
{
    if (r->kind == K_WRAP) {
        if (r->state != S_DONE) {
            int flag = 0;
            if (PMPI_Test(&r->first, &flag, &r->st) != MPI_SUCCESS) {
                r->err = MPI_ERR_OTHER;
                flag = 1;
            }
            if (flag) {
                int e = r->done ? r->done(r->done_arg, &r->st) : MPI_SUCCESS;
                r->done = NULL;
                if (r->err == MPI_SUCCESS)
                    r->err = e;
                r->state = S_DONE;
            }
        }
        return r->state == S_DONE;
    }
    if (r->state == S_FIRST) {
        int flag = 0;
        MPI_Status st;
        if (PMPI_Test(&r->first, &flag, &st) != MPI_SUCCESS) {
            r->err = MPI_ERR_OTHER;
            plist_del(r);
            r->state = S_DONE;
        } else if (flag) {
            plist_del(r);
            on_first(r, &st);
        }
    }
    if (r->state == S_SEGS) {
        if (r->kind == K_SEND) {
            int flag = 0;
            MPI_Status st;
            if (r->first != MPI_REQUEST_NULL) {
                PMPI_Test(&r->first, &flag, &st);
                if (flag) {
                    int c = 0;
                    PMPI_Test_cancelled(&st, &c);
                    if (c && r->ring) {
                        ring_send_cancel(r);
                        PMPI_Status_set_cancelled(&r->st, 1);
                    } else if (c) {
                        /* The header was cancelled: its segments will never be
                         * received. Let MPI have them; keep their memory. */
                        for (int k = 0; k < r->nseg; k++)
                            if (r->segs[k] != MPI_REQUEST_NULL) {
                                PMPI_Cancel(&r->segs[k]);
                                PMPI_Request_free(&r->segs[k]);
                            }
                        r->leak = 1;
                        PMPI_Status_set_cancelled(&r->st, 1);
                    }
                }
            }
            if (r->ring) {
                if (ring_advance(r) && r->first == MPI_REQUEST_NULL)
                    r->state = S_DONE;
            } else if (r->first == MPI_REQUEST_NULL) {
                flag = 1;
                if (r->nseg)
                    PMPI_Testall(r->nseg, r->segs, &flag, MPI_STATUSES_IGNORE);
                if (flag && r->ipc && r->ack == ACK_SEND_DATA && !r->leak)
                    flag = ipc_send_data(r);
                if (flag)
                    r->state = S_DONE;
            }
        } else {
            advance_segs(r);
        }
    }
    if (r->state >= S_IPC)
        ipc_recv_advance(r);
    if (r->state == S_COPY) {
        int done = 1;
        for (int i = 0; i < r->nevs && done; i++) {
            int t = rk_stg_event_test(r->evs[i]);
            if (t < 0)
                r->err = MPI_ERR_OTHER;
            done = t != 0;
        }
        if (done)
            r->state = S_DONE;
    }
    if (r->state == S_DONE && r->kind == K_SEND)
        ilist_del(r); /* an IPC send (ipc_send_post) */
    return r->state == S_DONE;
}

/* The user's status for a finished r. */
static void fill_status(req_t *r, MPI_Status *status)
{
    if (status == MPI_STATUS_IGNORE)
        return;
    if (r->kind == K_WRAP) {
        int err = status->MPI_ERROR;
        *status = r->st;
        status->MPI_ERROR = r->err != MPI_SUCCESS ? r->err : err;
        return;
    }
    if (r->kind == K_RECV) {
        *status = r->st;
        int c = 0;
        PMPI_Test_cancelled(&r->st, &c);
        if (!c)
            status_set_bytes(status, r->total);
    } else {
        int c = 0;
        PMPI_Test_cancelled(&r->st, &c);
        PMPI_Status_set_elements(status, MPI_BYTE, 0);
        PMPI_Status_set_cancelled(status, c);
    }
    status->MPI_ERROR = r->err;
}

/* Take r out of the table, give the user its status, free it. Returns the
 * operation's error (MPI_SUCCESS). */
static int finish(req_t *r, MPI_Status *status)
{
    pthread_mutex_lock(&eng);
    size_t b = bucket_of(r->key);
    for (req_t **pp = &buckets[b]; *pp; pp = &(*pp)->hnext)
        if (*pp == r) {
            *pp = r->hnext;
            break;
        }
    plist_del(r);
    if (r->detached)
        ndetached--;
    pthread_mutex_unlock(&eng);
    atomic_fetch_sub(&rk_stg_nreq, 1);
    fill_status(r, status);
    int err = r->err;
    if (r->user != MPI_REQUEST_NULL) {
        PMPI_Grequest_complete(r->user);
        PMPI_Wait(&r->user, MPI_STATUS_IGNORE);
    }
    rk_stg_count(r->copied, rk_stg_now() - r->t0);
    MPI_Comm comm = r->comm;
    req_release(r);
    if (err != MPI_SUCCESS) {
        /* As MPI would at completion: the communicator's handler. */
        rk_mpi_verbose("staging: a staged request ended with error class %d", err);
        PMPI_Comm_call_errhandler(comm, err);
    }
    return err;
}

static int advance(req_t *r)
{
    pthread_mutex_lock(&eng);
    int d = advance_locked(r);
    pthread_mutex_unlock(&eng);
    return d;
}

void rk_stg_progress(void)
{
    if (!pending_now() && !ndetached &&
        !atomic_load_explicit(&rk_stg_rings, memory_order_relaxed))
        return;
    /* One thread at a time; the others have their own loops to return to. */
    if (pthread_mutex_trylock(&eng) != 0)
        return;
    static MPI_Request *arr;
    static req_t **who;
    static int cap;
    static int *idx;
    static MPI_Status *sts;
    int n = 0;
    for (req_t *r = plist; r; r = r->pnext)
        n++;
    if (n > cap) {
        int c = n * 2;
        MPI_Request *a = realloc(arr, (size_t)c * sizeof *a);
        if (a)
            arr = a;
        req_t **w = realloc(who, (size_t)c * sizeof *w);
        if (w)
            who = w;
        int *ix = realloc(idx, (size_t)c * sizeof *ix);
        if (ix)
            idx = ix;
        MPI_Status *s = realloc(sts, (size_t)c * sizeof *s);
        if (s)
            sts = s;
        if (a && w && ix && s)
            cap = c;
    }
    if (n > 0 && n <= cap) {
        int i = 0;
        for (req_t *r = plist; r; r = r->pnext, i++) {
            arr[i] = r->first;
            who[i] = r;
        }
        int out = 0;
        if (PMPI_Testsome(n, arr, &out, idx, sts) == MPI_SUCCESS && out != MPI_UNDEFINED)
            for (int j = 0; j < out; j++) {
                req_t *r = who[idx[j]];
                r->first = MPI_REQUEST_NULL;
                plist_del(r);
                on_first(r, &sts[j]);
            }
    }
    alist_advance();
    req_t *done[16];
    int nd = 0;
    if (ndetached)
        for (int b = 0; b < NBUCKETS && nd < 16; b++)
            for (req_t *r = buckets[b]; r && nd < 16; r = r->hnext)
                if (r->detached && advance_locked(r))
                    done[nd++] = r;
    pthread_mutex_unlock(&eng);
    for (int i = 0; i < nd; i++)
        finish(done[i], MPI_STATUS_IGNORE);
}

/* ---- send side ---- */

enum { M_STD = RK_STG_M_STD, M_SSEND = RK_STG_M_SSEND, M_RSEND = RK_STG_M_RSEND,
       M_BSEND = RK_STG_M_BSEND };

static int isend_mode(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                      MPI_Comm comm, int mode, MPI_Request *req)
{
    switch (mode) {
    case M_SSEND:
        return PMPI_Issend(buf, count, dt, dest, tag, comm, req);
    case M_BSEND:
        return PMPI_Ibsend(buf, count, dt, dest, tag, comm, req);
    default:
        /* A ready send may always be a standard one; ours must be: the
         * receiver may match through MPI_Mprobe, not a posted receive. */
        return PMPI_Isend(buf, count, dt, dest, tag, comm, req);
    }
}

/* Copy the device data of (buf, count, dt) into host memory (r->hb).
 * 0 or -1. */
static int stage_in_all(req_t *r, const void *buf, int wait_ok)
{
    if (rk_stg_buf_get(r->L.span, wait_ok, &r->hb) != 0)
        return -1;
    if (r->L.span && rk_stg_copy_sync(r->hb.ptr, (const char *)buf + r->L.lo, r->L.span,
                                      RK_STG_D2H) != 0)
        return -1;
    r->copied += r->L.span;
    return 0;
}

/* Post a device send of r->L.size contiguous bytes at buf to world rank
 * wdest through CUDA IPC: the header, the descriptor, and the receive of
 * the answer. 0 when IPC does not apply (the caller stages), 1 when posted
 * (*rcp: MPI's answer). */
static int ipc_send_post(req_t *r, const void *buf, int dest, int wdest, int tag, int mode,
                         int *rcp)
{
    if (r->no_ipc || !rk_ipc_reaches(wdest) || rk_ipc_export(buf, r->L.size, &r->desc) != 0)
        return 0;
    r->ipc = 1;
    r->peer = wdest;
    r->ack = ACK_DONE;
    r->hdr = (hdr_t){MAGIC0, MAGIC1, r->L.size, SEG_IPC, rk_stg_next_id()};
    r->state = S_SEGS;
    if (alloc_segs(r, 2, 0) != 0) {
        *rcp = staging_error(r->comm, "out of memory for a send");
        return 1;
    }
    MPI_Comm wc = rk_stg_comm();
    int rc = PMPI_Irecv(&r->ack, 1, MPI_INT, wdest, r->hdr.id, rk_ipc_ack_comm(), &r->segs[1]);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Isend(&r->desc, (int)sizeof r->desc, MPI_BYTE, wdest, r->hdr.id, wc,
                        &r->segs[0]);
    if (rc == MPI_SUCCESS)
        rc = isend_mode(&r->hdr, RK_STG_HDR_BYTES, MPI_BYTE, dest, tag, r->comm, mode, &r->first);
    if (rc == MPI_SUCCESS) {
        /* The answer may ask for the data (the receiver could not map our
         * memory): the send must advance wherever rings do, not only when
         * its owner waits for it. Else two ranks each in a blocking
         * receive (MPI_Sendrecv in a ring, Isend then Recv) wait forever
         * for data their peers post only in their own wait. */
        pthread_mutex_lock(&eng);
        ilist_add(r);
        pthread_mutex_unlock(&eng);
    }
    *rcp = rc;
    return 1;
}

/* Start a staged send and post everything: the user's buffer may be
 * reused when this returns, and the transfer needs nothing more from this
 * process (MPI moves it). r->first is the user-visible message; segments
 * in r->segs. The blocking calls wait with wait_send(). */
static int send_post(req_t *r, const void *buf, int dest, int tag, int mode, int wait_ok)
{
    int rc;
    int wdest = -1;
    if (r->L.contig && r->L.size >= RK_STG_IPC_MIN && mode != M_BSEND && rk_ipc_on &&
        (wdest = to_world(r->comm, dest)) >= 0 && ipc_send_post(r, buf, dest, wdest, tag, mode, &rc))
        return rc;
    int pipelined = r->L.contig && r->L.size > RK_STG_BIG && mode != M_BSEND &&
                    (wdest = to_world(r->comm, dest)) >= 0;
    if (!pipelined) {
        if (stage_in_all(r, buf, wait_ok) != 0)
            return staging_error(r->comm, "cannot stage a send");
        rc = isend_mode(r->hb.ptr - r->L.lo, r->count, r->dt, dest, tag, r->comm, mode,
                        &r->first);
        r->nseg = 0;
        r->state = S_SEGS;
        return rc;
    }
    size_t total = r->L.size, seg = seg_size(total);
    int nseg = (int)((total + seg - 1) / seg);
    if (!wait_ok && rk_stg_hooked) {
        /* Nonblocking: the header now, the segments through the ring as
         * their copies finish; later calls drive it (rk_stg_progress). */
        ring_init(r, wdest, total, seg);
        r->hdr = (hdr_t){MAGIC0, MAGIC1, total, (uint32_t)seg, rk_stg_next_id()};
        rc = isend_mode(&r->hdr, RK_STG_HDR_BYTES, MPI_BYTE, dest, tag, r->comm, mode, &r->first);
        if (rc != MPI_SUCCESS) {
            r->ring = 0;
            r->nseg = 0;
            return rc;
        }
        r->state = S_SEGS;
        pthread_mutex_lock(&eng);
        alist_add(r);
        ring_advance(r);
        pthread_mutex_unlock(&eng);
        return MPI_SUCCESS;
    }
    if (rk_stg_buf_get(total, wait_ok, &r->hb) != 0 || alloc_segs(r, nseg, nseg) != 0)
        return staging_error(r->comm, "out of memory for a send");
    for (int k = 0; k < nseg; k++)
        if (rk_stg_copy(r->hb.ptr + (size_t)k * seg, (const char *)buf + (size_t)k * seg,
                        seg_len(total, seg, k), RK_STG_D2H, &r->evs[k]) != 0)
            return staging_error(r->comm, "device-to-host copy failed");
    r->copied += total;
    r->hdr = (hdr_t){MAGIC0, MAGIC1, total, (uint32_t)seg, rk_stg_next_id()};
    rc = isend_mode(&r->hdr, RK_STG_HDR_BYTES, MPI_BYTE, dest, tag, r->comm, mode, &r->first);
    if (rc != MPI_SUCCESS)
        return rc;
    /* Each segment goes as soon as its copy is done; the later copies run
     * on the GPU meanwhile. */
    for (int k = 0; k < nseg; k++) {
        if (rk_stg_event_wait(r->evs[k]) != 0)
            return staging_error(r->comm, "device-to-host copy failed");
        rc = PMPI_Isend(r->hb.ptr + (size_t)k * seg, (int)seg_len(total, seg, k), MPI_BYTE, wdest,
                        r->hdr.id, rk_stg_comm(), &r->segs[k]);
        if (rc != MPI_SUCCESS)
            return rc;
    }
    r->state = S_SEGS;
    return MPI_SUCCESS;
}

/* A blocking pipelined send: a ring of RK_STG_DEPTH segments of pinned
 * memory, the copy of segment k+1.. overlapping the send of segment k. */
static int send_ring(const void *buf, size_t total, int dest, int wdest, int tag, MPI_Comm comm,
                     int mode)
{
    size_t seg = seg_size(total);
    int nseg = (int)((total + seg - 1) / seg), depth = nseg < RK_STG_DEPTH ? nseg : RK_STG_DEPTH;
    rk_stg_buf_t ring;
    if (rk_stg_buf_get((size_t)depth * seg, 1, &ring) != 0)
        return staging_error(comm, "out of memory for a send");
    void *ev[RK_STG_DEPTH] = {0};
    MPI_Request sreq[RK_STG_DEPTH], hreq = MPI_REQUEST_NULL;
    for (int i = 0; i < RK_STG_DEPTH; i++)
        sreq[i] = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS, bad = 0;
    for (int k = 0; k < depth && !bad; k++)
        bad = rk_stg_copy(ring.ptr + (size_t)k * seg, (const char *)buf + (size_t)k * seg,
                          seg_len(total, seg, k), RK_STG_D2H, &ev[k]);
    hdr_t h = {MAGIC0, MAGIC1, total, (uint32_t)seg, rk_stg_next_id()};
    if (!bad)
        rc = isend_mode(&h, RK_STG_HDR_BYTES, MPI_BYTE, dest, tag, comm, mode, &hreq);
    for (int k = 0; k < nseg && !bad && rc == MPI_SUCCESS; k++) {
        int s = k % depth;
        bad = rk_stg_event_wait(ev[s]);
        rk_stg_event_put(ev[s]);
        ev[s] = NULL;
        if (bad)
            break;
        rc = PMPI_Isend(ring.ptr + (size_t)s * seg, (int)seg_len(total, seg, k), MPI_BYTE, wdest,
                        h.id, rk_stg_comm(), &sreq[s]);
        /* The previous segment's slot takes segment k - 1 + depth once sent. */
        int p = k - 1, next = p + depth;
        if (rc == MPI_SUCCESS && p >= 0 && next < nseg) {
            int ps = p % depth;
            rc = rk_stg_wait(&sreq[ps], MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS)
                bad = rk_stg_copy(ring.ptr + (size_t)ps * seg,
                                  (const char *)buf + (size_t)next * seg,
                                  seg_len(total, seg, next), RK_STG_D2H, &ev[ps]);
        }
    }
    if (bad && rc == MPI_SUCCESS)
        rc = staging_error(comm, "device-to-host copy failed");
    /* Everything posted must finish before the ring goes back. */
    int rc2 = wait_all(depth, sreq);
    int rc3 = hreq != MPI_REQUEST_NULL ? rk_stg_wait(&hreq, MPI_STATUS_IGNORE) : MPI_SUCCESS;
    for (int i = 0; i < RK_STG_DEPTH; i++) {
        if (ev[i])
            rk_stg_event_wait(ev[i]);
        rk_stg_event_put(ev[i]);
    }
    rk_stg_buf_put(&ring);
    return rc != MPI_SUCCESS ? rc : rc2 != MPI_SUCCESS ? rc2 : rc3;
}

/* Wait for a send r posted by send_post (not published), free it. */
static int wait_send(req_t *r)
{
    int rc = MPI_SUCCESS;
    if (r->ipc) {
        /* The answer may ask for the data: advance until done. */
        unsigned spins = 0;
        while (!advance(r))
            rk_stg_idle(&spins);
        rc = r->err;
        rk_stg_count(r->copied, rk_stg_now() - r->t0);
        req_release(r);
        return rc;
    }
    if (r->first != MPI_REQUEST_NULL)
        rc = rk_stg_wait(&r->first, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && r->nseg)
        rc = wait_all(r->nseg, r->segs);
    rk_stg_count(r->copied, rk_stg_now() - r->t0);
    req_release(r);
    return rc;
}

/* A blocking send of a device buffer. */
static int send_dev(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                    MPI_Comm comm, int mode)
{
    uint64_t t0 = rk_stg_now();
    rk_stg_layout_t L;
    int rc = rk_stg_layout(dt, 0, count, &L);
    if (rc != MPI_SUCCESS)
        return rc;
    int wdest;
    if (L.contig && L.size >= RK_STG_IPC_MIN && mode != M_BSEND && rk_ipc_on &&
        (wdest = to_world(comm, dest)) >= 0 && rk_ipc_reaches(wdest)) {
        req_t *r = req_new(K_SEND, (void *)buf, count, dt, comm);
        if (!r)
            return staging_error(comm, "out of memory");
        r->L = L;
        if (ipc_send_post(r, buf, dest, wdest, tag, mode, &rc)) {
            if (rc != MPI_SUCCESS) {
                /* What was posted must finish before r goes. */
                unsigned spins = 0;
                while (r->nseg && !advance(r))
                    rk_stg_idle(&spins);
                req_release(r);
                return rc;
            }
            return wait_send(r);
        }
        req_release(r);
    }
    if (L.contig && L.size <= RK_STG_BIG && mode != M_BSEND && !pending_now()) {
        /* Small and contiguous: one copy, then MPI's own blocking send (no
         * request to make, poll and free: latency is what counts here). */
        rk_stg_buf_t hb;
        if (rk_stg_buf_get(L.size, 1, &hb) != 0)
            return staging_error(comm, "out of memory for a send");
        if (L.size && rk_stg_copy_sync(hb.ptr, (const char *)buf + L.lo, L.size, RK_STG_D2H)) {
            rk_stg_buf_put(&hb);
            return staging_error(comm, "cannot stage a send");
        }
        rc = mode == M_SSEND ? PMPI_Ssend(hb.ptr - L.lo, count, dt, dest, tag, comm)
                             : PMPI_Send(hb.ptr - L.lo, count, dt, dest, tag, comm);
        rk_stg_buf_put(&hb);
        rk_stg_count(L.size, rk_stg_now() - t0);
        return rc;
    }
    if (L.contig && L.size > RK_STG_BIG && mode != M_BSEND &&
        (wdest = to_world(comm, dest)) >= 0) {
        rc = send_ring(buf, L.size, dest, wdest, tag, comm, mode);
        rk_stg_count(L.size, rk_stg_now() - t0);
        return rc;
    }
    req_t *r = req_new(K_SEND, (void *)buf, count, dt, comm);
    if (!r)
        return staging_error(comm, "out of memory");
    r->L = L;
    if (mode == M_BSEND) {
        /* Buffered: MPI copies out of our image before returning. */
        if (stage_in_all(r, buf, 1) != 0) {
            req_release(r);
            return staging_error(comm, "cannot stage a send");
        }
        rc = PMPI_Bsend(r->hb.ptr - r->L.lo, count, dt, dest, tag, comm);
        rk_stg_count(r->copied, rk_stg_now() - t0);
        req_release(r);
        return rc;
    }
    rc = send_post(r, buf, dest, tag, mode, 1);
    if (rc != MPI_SUCCESS) {
        req_release(r);
        return rc;
    }
    return wait_send(r);
}

/* A nonblocking send of a device buffer: *request is the user's. */
static int isend_dev(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                     MPI_Comm comm, int mode, MPI_Request *request)
{
    req_t *r = req_new(K_SEND, (void *)buf, count, dt, comm);
    if (!r)
        return staging_error(comm, "out of memory");
    int rc = rk_stg_layout(dt, 0, count, &r->L);
    if (rc == MPI_SUCCESS)
        rc = send_post(r, buf, dest, tag, mode, 0);
    if (rc == MPI_SUCCESS)
        rc = req_publish(r, request);
    if (rc != MPI_SUCCESS) {
        /* What was posted must finish before its memory goes. */
        if (r->first != MPI_REQUEST_NULL)
            rk_stg_wait(&r->first, MPI_STATUS_IGNORE);
        if (r->ring) {
            unsigned spins = 0;
            while (!advance(r))
                rk_stg_idle(&spins);
        } else if (r->nseg) {
            wait_all(r->nseg, r->segs);
        }
        req_release(r);
    }
    return rc;
}

/* ---- receive side, blocking ---- */

/* Data of an ordinary message the receive took into tmp (bytes, in the
 * sender's order) delivered to (buf, count, dt). */
static int deliver(void *buf, int count, MPI_Datatype dt, int dev, const void *tmp, size_t bytes,
                   MPI_Comm comm, size_t *copied)
{
    rk_stg_layout_t L;
    int rc = rk_stg_layout(dt, 0, count, &L);
    if (rc != MPI_SUCCESS)
        return rc;
    if (bytes > L.size)
        return MPI_ERR_TRUNCATE;
    if (L.contig) {
        if (!dev) {
            memcpy(buf, tmp, bytes);
            return MPI_SUCCESS;
        }
        *copied += bytes;
        return rk_stg_copy_sync(buf, tmp, bytes, RK_STG_H2D) ? MPI_ERR_OTHER : MPI_SUCCESS;
    }
    int pos = 0, n = (int)(bytes / L.tsize);
    if (!dev)
        return PMPI_Unpack(tmp, (int)bytes, &pos, buf, n, dt, comm);
    /* Unpacked into a host image, then only the described bytes go back. */
    rk_stg_buf_t hb;
    if (rk_stg_buf_get(L.span, 1, &hb) != 0)
        return MPI_ERR_NO_MEM;
    rc = PMPI_Unpack(tmp, (int)bytes, &pos, hb.ptr - L.lo, n, dt, comm);
    if (rc == MPI_SUCCESS &&
        rk_stg_put_elems_sync(buf, hb.ptr - L.lo, dt, 0, elems_in(&L, bytes), &L, copied) != 0)
        rc = MPI_ERR_OTHER;
    rk_stg_buf_put(&hb);
    return rc;
}

/* The data of an IPC message announced by h, from world rank src, into
 * (buf, count, dt): descriptor, copy, answer. */
static int recv_ipc(void *buf, int count, MPI_Datatype dt, int dev, const hdr_t *h, int src,
                    MPI_Comm comm, size_t *copied)
{
    rk_stg_layout_t L;
    int rc = rk_stg_layout(dt, 0, count, &L);
    if (rc != MPI_SUCCESS)
        L.size = 0, L.contig = 1; /* still answer, or the sender waits forever */
    MPI_Comm wc = rk_stg_comm();
    rk_ipc_desc_t d;
    MPI_Request rq;
    int mrc = PMPI_Irecv(&d, (int)sizeof d, MPI_BYTE, src, h->id, wc, &rq);
    if (mrc == MPI_SUCCESS)
        mrc = rk_stg_wait(&rq, MPI_STATUS_IGNORE);
    if (mrc != MPI_SUCCESS)
        return mrc;
    int err = MPI_SUCCESS;
    void *ev = NULL, *mapped = NULL;
    rk_stg_buf_t bounce = {0};
    int ack = ipc_take(buf, count, dt, dev, &L, &d, h->total, comm, 1, &ev, &mapped, &bounce,
                       copied, &err);
    if (ev && rk_stg_event_wait(ev) != 0)
        err = MPI_ERR_OTHER;
    rk_stg_event_put(ev);
    rk_ipc_release(mapped);
    if (bounce.kind)
        rk_stg_buf_put(&bounce);
    mrc = PMPI_Send(&ack, 1, MPI_INT, src, h->id, rk_ipc_ack_comm());
    if (ack == ACK_SEND_DATA && mrc == MPI_SUCCESS) {
        rk_stg_buf_t t;
        if (rk_stg_buf_get(h->total, 1, &t) != 0)
            return MPI_ERR_NO_MEM;
        mrc = PMPI_Irecv(t.ptr, (int)h->total, MPI_BYTE, src, h->id, wc, &rq);
        if (mrc == MPI_SUCCESS)
            mrc = rk_stg_wait(&rq, MPI_STATUS_IGNORE);
        if (mrc == MPI_SUCCESS)
            err = deliver(buf, count, dt, dev, t.ptr, h->total, comm, copied);
        rk_stg_buf_put(&t);
    }
    if (rc != MPI_SUCCESS)
        return rc;
    return err != MPI_SUCCESS ? err : mrc;
}

/* The segments of a pipelined message announced by h, from world rank
 * src, into (buf, count, dt). */
static int recv_segments(void *buf, int count, MPI_Datatype dt, int dev, const hdr_t *h, int src,
                         MPI_Comm comm, size_t *copied)
{
    if (h->seg == SEG_IPC)
        return recv_ipc(buf, count, dt, dev, h, src, comm, copied);
    rk_stg_layout_t L;
    int rc = rk_stg_layout(dt, 0, count, &L);
    if (rc != MPI_SUCCESS)
        return rc;
    size_t total = h->total, seg = h->seg;
    int nseg = (int)((total + seg - 1) / seg);
    MPI_Comm wc = rk_stg_comm();
    if (total > L.size) {
        /* Truncated: take and drop the segments, then say so. */
        rk_stg_buf_t s;
        if (rk_stg_buf_get(seg, 1, &s) == 0) {
            for (int k = 0; k < nseg; k++)
                PMPI_Recv(s.ptr, (int)seg_len(total, seg, k), MPI_BYTE, src, h->id, wc,
                          MPI_STATUS_IGNORE);
            rk_stg_buf_put(&s);
        }
        return MPI_ERR_TRUNCATE;
    }
    if (L.contig && !dev) {
        /* Host memory: straight into place. */
        MPI_Request *rq = malloc((size_t)nseg * sizeof *rq);
        if (!rq)
            return MPI_ERR_NO_MEM;
        for (int k = 0; k < nseg; k++)
            PMPI_Irecv((char *)buf + (size_t)k * seg, (int)seg_len(total, seg, k), MPI_BYTE, src,
                       h->id, wc, &rq[k]);
        rc = wait_all(nseg, rq);
        free(rq);
        return rc;
    }
    if (!L.contig) {
        rk_stg_buf_t pk;
        if (rk_stg_buf_get(total, 1, &pk) != 0)
            return MPI_ERR_NO_MEM;
        MPI_Request *rq = malloc((size_t)nseg * sizeof *rq);
        rc = rq ? MPI_SUCCESS : MPI_ERR_NO_MEM;
        for (int k = 0; k < nseg && rq; k++)
            PMPI_Irecv(pk.ptr + (size_t)k * seg, (int)seg_len(total, seg, k), MPI_BYTE, src,
                       h->id, wc, &rq[k]);
        if (rq)
            rc = wait_all(nseg, rq);
        free(rq);
        if (rc == MPI_SUCCESS)
            rc = deliver(buf, count, dt, dev, pk.ptr, total, comm, copied);
        rk_stg_buf_put(&pk);
        return rc;
    }
    /* Device, contiguous: a ring of segments, the host-to-device copy of
     * segment k overlapping the receive of segment k+1.. */
    int depth = nseg < RK_STG_DEPTH ? nseg : RK_STG_DEPTH;
    rk_stg_buf_t ring;
    if (rk_stg_buf_get((size_t)depth * seg, 1, &ring) != 0)
        return MPI_ERR_NO_MEM;
    MPI_Request rq[RK_STG_DEPTH];
    void *ev[RK_STG_DEPTH] = {0};
    for (int i = 0; i < RK_STG_DEPTH; i++)
        rq[i] = MPI_REQUEST_NULL;
    for (int k = 0; k < depth; k++)
        PMPI_Irecv(ring.ptr + (size_t)k * seg, (int)seg_len(total, seg, k), MPI_BYTE, src, h->id,
                   wc, &rq[k]);
    int bad = 0;
    for (int k = 0; k < nseg && rc == MPI_SUCCESS && !bad; k++) {
        int s = k % depth;
        rc = rk_stg_wait(&rq[s], MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            break;
        bad = rk_stg_copy((char *)buf + (size_t)k * seg, ring.ptr + (size_t)s * seg,
                          seg_len(total, seg, k), RK_STG_H2D, &ev[s]);
        int p = k - 1, next = p + depth;
        if (!bad && p >= 0) {
            int ps = p % depth;
            bad = rk_stg_event_wait(ev[ps]);
            rk_stg_event_put(ev[ps]);
            ev[ps] = NULL;
            if (!bad && next < nseg)
                PMPI_Irecv(ring.ptr + (size_t)ps * seg, (int)seg_len(total, seg, next), MPI_BYTE,
                           src, h->id, wc, &rq[ps]);
        }
    }
    *copied += total;
    for (int i = 0; i < RK_STG_DEPTH; i++) {
        if (ev[i] && rk_stg_event_wait(ev[i]) != 0)
            bad = 1;
        rk_stg_event_put(ev[i]);
    }
    if (bad || rc != MPI_SUCCESS) {
        /* Nothing of ours may still write into the ring. */
        for (int i = 0; i < RK_STG_DEPTH; i++)
            if (rq[i] != MPI_REQUEST_NULL) {
                PMPI_Cancel(&rq[i]);
                PMPI_Wait(&rq[i], MPI_STATUS_IGNORE);
            }
    }
    rk_stg_buf_put(&ring);
    if (bad && rc == MPI_SUCCESS)
        rc = MPI_ERR_OTHER;
    return rc;
}

/* A blocking receive that may meet a header (device buffer, or a host
 * buffer of more than RK_STG_BIG bytes). */
/* If the 32 bytes at img are a header (the first message's status st):
 * receive its segments into (buf, count, dt); *bytes becomes the message's
 * size. -1 when they are data. */
static int header_segments(const void *img, const MPI_Status *st, void *buf, int count,
                           MPI_Datatype dt, int dev, MPI_Comm comm, size_t *bytes, size_t *copied)
{
    hdr_t h;
    if (!is_header(img, &h))
        return -1;
    *bytes = h.total;
    int w = to_world(comm, st->MPI_SOURCE);
    return w < 0 ? MPI_ERR_OTHER : recv_segments(buf, count, dt, dev, &h, w, comm, copied);
}

/* The end of a blocking staged receive: the user's status, the count, and
 * the communicator's handler for an error of ours (mpi_rc: an MPI call's own
 * error, for which MPI called the handler already). */
static int recv_done(MPI_Comm comm, MPI_Status *status, const MPI_Status *st, size_t bytes,
                     int rc, int mpi_rc, int dev, size_t copied, uint64_t t0)
{
    if (status != MPI_STATUS_IGNORE) {
        *status = *st;
        status_set_bytes(status, bytes);
        status->MPI_ERROR = rc;
    }
    if (dev || copied)
        rk_stg_count(copied, rk_stg_now() - t0);
    if (rc != MPI_SUCCESS && mpi_rc == MPI_SUCCESS)
        PMPI_Comm_call_errhandler(comm, rc);
    return rc;
}

/* A blocking receive that may meet a header (device buffer, or a host
 * buffer of more than RK_STG_BIG bytes). */
static int recv_staged(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,
                       MPI_Status *status, int dev)
{
    uint64_t t0 = rk_stg_now();
    size_t copied = 0, bytes = 0;
    MPI_Message msg;
    MPI_Status st;
    int rc, mpi_rc;
    rk_stg_layout_t L;
    if ((rc = rk_stg_layout(dt, 0, count, &L)) != MPI_SUCCESS)
        return rc;
    if (dev && !pending_now() && L.contig && L.size <= RK_STG_BIG) {
        /* Small contiguous device receive: MPI's own receive into pinned
         * memory, then one copy. A message that fits cannot be a header
         * unless the sender pipelined more than the receive holds: then the
         * 32 bytes are a header (a truncation, told as below). */
        rk_stg_buf_t hb;
        if (rk_stg_buf_get(L.size, 1, &hb) != 0)
            return staging_error(comm, "out of memory for a receive");
        rc = mpi_rc = PMPI_Recv(hb.ptr - L.lo, count, dt, src, tag, comm, &st);
        bytes = rc == MPI_SUCCESS ? status_bytes(&st) : 0;
        if (rc == MPI_SUCCESS && bytes == RK_STG_HDR_BYTES)
            rc = header_segments(hb.ptr, &st, buf, count, dt, dev, comm, &bytes, &copied);
        if (rc == -1 || (rc == MPI_SUCCESS && bytes && !copied)) {
            rc = rk_stg_copy_sync((char *)buf + L.lo, hb.ptr, bytes, RK_STG_H2D) != 0
                     ? MPI_ERR_OTHER
                     : MPI_SUCCESS;
            copied += bytes;
        }
        rk_stg_buf_put(&hb);
        return recv_done(comm, status, &st, bytes, rc, mpi_rc, dev, copied, t0);
    }
    /* Match first (as the receive would), learn the size, then receive. */
    if (!pending_now()) {
        rc = PMPI_Mprobe(src, tag, comm, &msg, &st);
    } else {
        unsigned spins = 0;
        int flag = 0;
        while ((rc = PMPI_Improbe(src, tag, comm, &flag, &msg, &st)) == MPI_SUCCESS && !flag)
            rk_stg_idle(&spins);
    }
    if (rc != MPI_SUCCESS)
        return rc;
    bytes = status_bytes(&st);
    MPI_Status st2;
    if (bytes == RK_STG_HDR_BYTES) {
        char tmp[RK_STG_HDR_BYTES];
        rc = PMPI_Mrecv(tmp, RK_STG_HDR_BYTES, MPI_BYTE, &msg, &st2);
        if (rc != MPI_SUCCESS)
            return rc;
        rc = header_segments(tmp, &st, buf, count, dt, dev, comm, &bytes, &copied);
        if (rc == -1)
            rc = deliver(buf, count, dt, dev, tmp, bytes, comm, &copied);
        mpi_rc = MPI_SUCCESS;
    } else if (!dev) {
        rc = mpi_rc = PMPI_Mrecv(buf, count, dt, &msg, &st2);
        bytes = status_bytes(&st2);
    } else if (bytes == 0) {
        char dummy[8];
        rc = mpi_rc = PMPI_Mrecv(dummy, 0, MPI_BYTE, &msg, &st2);
    } else {
        rk_stg_buf_t hb;
        /* Contiguous: room for what came (MPI reports truncation itself);
         * otherwise the whole region, of which only the bytes the datatype
         * describes go back (the holes are never written). */
        size_t room = L.contig ? (bytes < L.size ? bytes : L.size) : L.span;
        if (rk_stg_buf_get(room, 1, &hb) != 0)
            return staging_error(comm, "out of memory for a receive");
        rc = mpi_rc = PMPI_Mrecv(hb.ptr - L.lo, count, dt, &msg, &st2);
        if (rc == MPI_SUCCESS) {
            bytes = status_bytes(&st2);
            if (rk_stg_put_elems_sync(buf, hb.ptr - L.lo, dt, 0, elems_in(&L, bytes), &L,
                                      &copied) != 0)
                rc = MPI_ERR_OTHER;
        }
        rk_stg_buf_put(&hb);
    }
    return recv_done(comm, status, &st, bytes, rc, mpi_rc, dev, copied, t0);
}

/* A nonblocking receive that may meet a header. */
static int irecv_staged(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,
                        MPI_Request *request, int dev)
{
    req_t *r = req_new(K_RECV, buf, count, dt, comm);
    if (!r)
        return staging_error(comm, "out of memory");
    r->dev = dev;
    int rc = rk_stg_layout(dt, 0, count, &r->L);
    if (rc != MPI_SUCCESS) {
        req_release(r);
        return rc;
    }
    void *target = buf;
    if (dev) {
        /* The whole capacity: the message's size is not known yet. */
        size_t room = r->L.contig ? r->L.size : r->L.span;
        if (rk_stg_buf_get(room, 0, &r->hb) != 0) {
            req_release(r);
            return staging_error(comm, "out of memory for a receive");
        }
        target = r->hb.ptr - r->L.lo;
    }
    rc = PMPI_Irecv(target, count, dt, src, tag, comm, &r->first);
    r->state = S_FIRST;
    if (rc == MPI_SUCCESS)
        rc = req_publish(r, request);
    if (rc != MPI_SUCCESS) {
        if (r->first != MPI_REQUEST_NULL) {
            PMPI_Cancel(&r->first);
            PMPI_Wait(&r->first, MPI_STATUS_IGNORE);
        }
        req_release(r);
    }
    return rc;
}

/* ---- probes: messages a probe had to take to tell a header ---- */

/* A 32-byte message may be a header; a probe can only tell by receiving it.
 * Such messages wait here, oldest first, for the receive that matches them
 * (every receive looks here first while the list is not empty: they came
 * before anything MPI still holds from the same source). */
typedef struct rk_stg_stash {
    struct rk_stg_stash *next;
    MPI_Comm comm;
    int header;
    MPI_Status st;
    char data[RK_STG_HDR_BYTES];
} stash_t;
static stash_t *stash_head;
static atomic_long nstash;

static int stash_any(void) { return atomic_load_explicit(&nstash, memory_order_relaxed) != 0; }

/* The oldest message that (src, tag, comm) matches; removed when take. */
static stash_t *stash_find(MPI_Comm comm, int src, int tag, int take)
{
    if (!stash_any())
        return NULL;
    pthread_mutex_lock(&eng);
    stash_t **pp = &stash_head, *e = NULL;
    for (; *pp; pp = &(*pp)->next) {
        stash_t *c = *pp;
        if (c->comm == comm && (src == MPI_ANY_SOURCE || src == c->st.MPI_SOURCE) &&
            (tag == MPI_ANY_TAG || tag == c->st.MPI_TAG)) {
            e = c;
            if (take) {
                *pp = c->next;
                atomic_fetch_sub(&nstash, 1);
            }
            break;
        }
    }
    pthread_mutex_unlock(&eng);
    return e;
}

static size_t stash_bytes(const stash_t *e)
{
    hdr_t h;
    return e->header && is_header(e->data, &h) ? (size_t)h.total : RK_STG_HDR_BYTES;
}

/* Receive a stashed message into (buf, count, dt); frees e. report: an
 * error goes to the communicator's handler now (a blocking receive). */
static int stash_recv(stash_t *e, void *buf, int count, MPI_Datatype dt, int dev, MPI_Comm comm,
                      MPI_Status *status, size_t *bytes_p, int report)
{
    uint64_t t0 = rk_stg_now();
    size_t copied = 0, bytes = stash_bytes(e);
    int rc;
    hdr_t h;
    if (e->header && is_header(e->data, &h)) {
        int w = to_world(comm, e->st.MPI_SOURCE);
        rc = w < 0 ? MPI_ERR_OTHER : recv_segments(buf, count, dt, dev, &h, w, comm, &copied);
    } else {
        rc = deliver(buf, count, dt, dev, e->data, bytes, comm, &copied);
    }
    if (status != MPI_STATUS_IGNORE) {
        *status = e->st;
        status_set_bytes(status, bytes);
        status->MPI_ERROR = rc;
    }
    if (bytes_p)
        *bytes_p = bytes;
    free(e);
    if (dev || copied)
        rk_stg_count(copied, rk_stg_now() - t0);
    if (rc != MPI_SUCCESS && report)
        PMPI_Comm_call_errhandler(comm, rc);
    return rc;
}

/* Take the 32-byte message msg (of comm) into a new entry, not in the
 * list. NULL without memory (the message is then lost). */
static stash_t *stash_take_msg(MPI_Comm comm, MPI_Message *msg)
{
    stash_t *e = calloc(1, sizeof *e);
    if (!e) {
        char drop[RK_STG_HDR_BYTES];
        PMPI_Mrecv(drop, RK_STG_HDR_BYTES, MPI_BYTE, msg, MPI_STATUS_IGNORE);
        rk_mpi_warn("staging: out of memory in a probe: a message was lost");
        return NULL;
    }
    PMPI_Mrecv(e->data, RK_STG_HDR_BYTES, MPI_BYTE, msg, &e->st);
    hdr_t h;
    e->comm = comm;
    e->header = is_header(e->data, &h);
    return e;
}

/* A probe saw st: if it is 32 bytes, take it (if still there) and stash it.
 * 1 when *st now describes the message (count fixed), 0 when another
 * thread took it first. */
static int probe_seen(MPI_Comm comm, MPI_Status *st)
{
    if (status_bytes(st) != RK_STG_HDR_BYTES)
        return 1;
    MPI_Message msg;
    MPI_Status st2;
    int flag = 0;
    if (PMPI_Improbe(st->MPI_SOURCE, st->MPI_TAG, comm, &flag, &msg, &st2) != MPI_SUCCESS ||
        !flag)
        return 0;
    /* Without memory the caller sees a probe that found nothing. */
    stash_t *e = stash_take_msg(comm, &msg);
    if (!e)
        return 0;
    st2 = e->st;
    pthread_mutex_lock(&eng);
    stash_t **pp = &stash_head;
    while (*pp)
        pp = &(*pp)->next;
    *pp = e;
    atomic_fetch_add(&nstash, 1);
    pthread_mutex_unlock(&eng);
    *st = st2;
    status_set_bytes(st, stash_bytes(e));
    return 1;
}

static void stash_status(const stash_t *e, MPI_Status *status)
{
    if (status == MPI_STATUS_IGNORE)
        return;
    *status = e->st;
    status_set_bytes(status, stash_bytes(e));
}

/* For the matched probes (staging/mprobe.c). */
int rk_stg_stash_any(void) { return stash_any(); }
rk_stg_stash_t *rk_stg_stash_take(MPI_Comm comm, int src, int tag)
{
    return stash_find(comm, src, tag, 1);
}
rk_stg_stash_t *rk_stg_stash_mrecv(MPI_Comm comm, MPI_Message *msg)
{
    return stash_take_msg(comm, msg);
}
void rk_stg_stash_status(const rk_stg_stash_t *e, MPI_Status *status) { stash_status(e, status); }
MPI_Comm rk_stg_stash_comm(const rk_stg_stash_t *e) { return e->comm; }
int rk_stg_stash_recv(rk_stg_stash_t *e, void *buf, int count, MPI_Datatype dt, int dev,
                      MPI_Status *status, int report)
{
    return stash_recv(e, buf, count, dt, dev, e->comm, status, NULL, report);
}

RK_STG_EXPORT int MPI_Iprobe(int src, int tag, MPI_Comm comm, int *flag, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active) || src == MPI_PROC_NULL)
        return PMPI_Iprobe(src, tag, comm, flag, status);
    rk_stg_progress();
    stash_t *e = stash_find(comm, src, tag, 0);
    if (e) {
        *flag = 1;
        stash_status(e, status);
        return MPI_SUCCESS;
    }
    MPI_Status st;
    int rc = PMPI_Iprobe(src, tag, comm, flag, &st);
    if (rc != MPI_SUCCESS || !*flag)
        return rc;
    *flag = probe_seen(comm, &st);
    if (*flag && status != MPI_STATUS_IGNORE)
        *status = st;
    return MPI_SUCCESS;
}

RK_STG_EXPORT int MPI_Probe(int src, int tag, MPI_Comm comm, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active) || src == MPI_PROC_NULL)
        return PMPI_Probe(src, tag, comm, status);
    unsigned spins = 0;
    for (;;) {
        stash_t *e = stash_find(comm, src, tag, 0);
        if (e) {
            stash_status(e, status);
            return MPI_SUCCESS;
        }
        MPI_Status st;
        int flag = 0, rc;
        if (!pending_now()) {
            rc = PMPI_Probe(src, tag, comm, &st);
            flag = 1;
        } else {
            rc = PMPI_Iprobe(src, tag, comm, &flag, &st);
        }
        if (rc != MPI_SUCCESS)
            return rc;
        if (flag && probe_seen(comm, &st)) {
            if (status != MPI_STATUS_IGNORE)
                *status = st;
            return MPI_SUCCESS;
        }
        rk_stg_idle(&spins);
    }
}

/* ---- the hooks: sends and receives ---- */

/* MPI's blocking send of that mode. */
static int psend(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm,
                 int mode)
{
    switch (mode) {
    case M_SSEND:
        return PMPI_Ssend(buf, count, dt, dest, tag, comm);
    case M_RSEND:
        return PMPI_Rsend(buf, count, dt, dest, tag, comm);
    case M_BSEND:
        return PMPI_Bsend(buf, count, dt, dest, tag, comm);
    default:
        return PMPI_Send(buf, count, dt, dest, tag, comm);
    }
}

/* Every blocking send (mode a constant: inlined, the switches fold). */
static inline int send_hook(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                            MPI_Comm comm, int mode)
{
    if (RK_STG_LIKELY(!rk_stg_active) || (!rk_stg_is_device_dt(buf, count, dt) && !pending_now()))
        return psend(buf, count, dt, dest, tag, comm, mode);
    if (dest != MPI_PROC_NULL && rk_stg_is_device_dt(buf, count, dt))
        return send_dev(buf, count, dt, dest, tag, comm, mode);
    if (mode == M_BSEND || !pending_now())
        return psend(buf, count, dt, dest, tag, comm, mode);
    /* A host send while staged receives wait for headers: poll. */
    MPI_Request r;
    int rc = isend_mode(buf, count, dt, dest, tag, comm, mode, &r);
    return rc == MPI_SUCCESS ? rk_stg_wait(&r, MPI_STATUS_IGNORE) : rc;
}

RK_STG_EXPORT int MPI_Send(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                           MPI_Comm comm)
{
    return send_hook(buf, count, dt, dest, tag, comm, M_STD);
}

RK_STG_EXPORT int MPI_Ssend(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                            MPI_Comm comm)
{
    return send_hook(buf, count, dt, dest, tag, comm, M_SSEND);
}

RK_STG_EXPORT int MPI_Rsend(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                            MPI_Comm comm)
{
    return send_hook(buf, count, dt, dest, tag, comm, M_RSEND);
}

RK_STG_EXPORT int MPI_Bsend(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                            MPI_Comm comm)
{
    return send_hook(buf, count, dt, dest, tag, comm, M_BSEND);
}

/* A blocking receive once the fast path is ruled out: from the stash (its
 * first message came through a probe), staged (dev: a device buffer; big: a
 * host one a header may arrive for), or polled (staged receives may wait). */
static int recv_hook(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,
                     MPI_Status *status, int dev, int big)
{
    if (src == MPI_PROC_NULL)
        return PMPI_Recv(buf, count, dt, src, tag, comm, status);
    stash_t *e = stash_find(comm, src, tag, 1);
    if (e)
        return stash_recv(e, buf, count, dt, dev, comm, status, NULL, 1);
    if (dev || big)
        return recv_staged(buf, count, dt, src, tag, comm, status, dev);
    MPI_Request r;
    int rc = PMPI_Irecv(buf, count, dt, src, tag, comm, &r);
    return rc == MPI_SUCCESS ? rk_stg_wait(&r, status) : rc;
}

RK_STG_EXPORT int MPI_Recv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,
                           MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Recv(buf, count, dt, src, tag, comm, status);
    int dev = rk_stg_is_device_dt(buf, count, dt);
    if (!dev && !pending_now() && !stash_any() && !rk_stg_big_recv(count, dt))
        return PMPI_Recv(buf, count, dt, src, tag, comm, status);
    return recv_hook(buf, count, dt, src, tag, comm, status, dev,
                     !dev && rk_stg_big_recv(count, dt));
}

int rk_stg_isend_any(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                     MPI_Comm comm, MPI_Request *req, int mode)
{
    if (RK_STG_LIKELY(!rk_stg_active) || dest == MPI_PROC_NULL || !rk_stg_is_device_dt(buf, count, dt)) {
        switch (mode) {
        case M_SSEND:
            return PMPI_Issend(buf, count, dt, dest, tag, comm, req);
        case M_RSEND:
            return PMPI_Irsend(buf, count, dt, dest, tag, comm, req);
        case M_BSEND:
            return PMPI_Ibsend(buf, count, dt, dest, tag, comm, req);
        default:
            return PMPI_Isend(buf, count, dt, dest, tag, comm, req);
        }
    }
    rk_stg_progress();
    return isend_dev(buf, count, dt, dest, tag, comm, mode, req);
}

RK_STG_EXPORT int MPI_Isend(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                            MPI_Comm comm, MPI_Request *req)
{
    return rk_stg_isend_any(buf, count, dt, dest, tag, comm, req, M_STD);
}

RK_STG_EXPORT int MPI_Issend(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                             MPI_Comm comm, MPI_Request *req)
{
    return rk_stg_isend_any(buf, count, dt, dest, tag, comm, req, M_SSEND);
}

RK_STG_EXPORT int MPI_Irsend(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                             MPI_Comm comm, MPI_Request *req)
{
    return rk_stg_isend_any(buf, count, dt, dest, tag, comm, req, M_RSEND);
}

RK_STG_EXPORT int MPI_Ibsend(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                             MPI_Comm comm, MPI_Request *req)
{
    return rk_stg_isend_any(buf, count, dt, dest, tag, comm, req, M_BSEND);
}

RK_STG_EXPORT int MPI_Irecv(void *buf, int count, MPI_Datatype dt, int src, int tag,
                            MPI_Comm comm, MPI_Request *req)
{
    return rk_stg_irecv(buf, count, dt, src, tag, comm, req);
}

int rk_stg_irecv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,
                 MPI_Request *req)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Irecv(buf, count, dt, src, tag, comm, req);
    int dev = rk_stg_is_device_dt(buf, count, dt);
    if (src == MPI_PROC_NULL || (!dev && !stash_any() && !rk_stg_big_recv(count, dt)))
        return PMPI_Irecv(buf, count, dt, src, tag, comm, req);
    stash_t *e = stash_find(comm, src, tag, 1);
    if (e) {
        /* Its first message came through a probe: receive it now, hand
         * back a request that is complete. */
        req_t *r = req_new(K_RECV, buf, count, dt, comm);
        if (!r)
            return staging_error(comm, "out of memory");
        r->err = stash_recv(e, buf, count, dt, dev, comm, &r->st, &r->total, 0);
        r->state = S_DONE;
        int rc = req_publish(r, req);
        if (rc != MPI_SUCCESS)
            req_release(r);
        return rc;
    }
    if (!dev && !rk_stg_big_recv(count, dt))
        return PMPI_Irecv(buf, count, dt, src, tag, comm, req);
    rk_stg_progress();
    return irecv_staged(buf, count, dt, src, tag, comm, req, dev);
}

RK_STG_EXPORT int MPI_Sendrecv(const void *sbuf, int scount, MPI_Datatype stype, int dest,
                               int stag, void *rbuf, int rcount, MPI_Datatype rtype, int src,
                               int rtag, MPI_Comm comm, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag,
                             comm, status);
    int sdev = dest != MPI_PROC_NULL && rk_stg_is_device_dt(sbuf, scount, stype);
    int rdev = src != MPI_PROC_NULL && rk_stg_is_device_dt(rbuf, rcount, rtype);
    int big = src != MPI_PROC_NULL && rk_stg_big_recv(rcount, rtype);
    if (!sdev && !rdev && !big && !pending_now() && !stash_any())
        return PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag,
                             comm, status);
    /* The send goes first and needs nothing more from us; then the receive. */
    req_t *s = NULL;
    MPI_Request hreq = MPI_REQUEST_NULL;
    int rc;
    if (sdev) {
        s = req_new(K_SEND, (void *)sbuf, scount, stype, comm);
        if (!s)
            return staging_error(comm, "out of memory");
        rc = rk_stg_layout(stype, 0, scount, &s->L);
        if (rc == MPI_SUCCESS)
            rc = send_post(s, sbuf, dest, stag, M_STD, 1);
    } else {
        rc = PMPI_Isend(sbuf, scount, stype, dest, stag, comm, &hreq);
    }
    if (rc != MPI_SUCCESS) {
        if (s)
            wait_send(s);
        return rc;
    }
    int rrc = recv_hook(rbuf, rcount, rtype, src, rtag, comm, status, rdev, big);
    rc = s ? wait_send(s) : rk_stg_wait(&hreq, MPI_STATUS_IGNORE);
    return rrc != MPI_SUCCESS ? rrc : rc;
}

RK_STG_EXPORT int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype dt, int dest, int stag,
                                       int src, int rtag, MPI_Comm comm, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active))
        return PMPI_Sendrecv_replace(buf, count, dt, dest, stag, src, rtag, comm, status);
    int dev = rk_stg_is_device_dt(buf, count, dt);
    int big = src != MPI_PROC_NULL && rk_stg_big_recv(count, dt);
    if (!dev && !big && !pending_now() && !stash_any())
        return PMPI_Sendrecv_replace(buf, count, dt, dest, stag, src, rtag, comm, status);
    /* Send from a copy (ours: the receive overwrites buf), then receive. */
    req_t *s = req_new(K_SEND, buf, count, dt, comm);
    if (!s)
        return staging_error(comm, "out of memory");
    int rc = rk_stg_layout(dt, 0, count, &s->L);
    if (rc != MPI_SUCCESS) {
        req_release(s);
        return rc;
    }
    if (dest == MPI_PROC_NULL) {
        s->nseg = 0;
    } else if (dev) {
        s->no_ipc = 1; /* the receive below overwrites buf while a peer could still read it */
        rc = send_post(s, buf, dest, stag, M_STD, 1);
    } else {
        if (rk_stg_buf_get(s->L.span, 1, &s->hb) != 0) {
            req_release(s);
            return staging_error(comm, "out of memory");
        }
        memcpy(s->hb.ptr, (char *)buf + s->L.lo, s->L.span);
        rc = PMPI_Isend(s->hb.ptr - s->L.lo, count, dt, dest, stag, comm, &s->first);
    }
    if (rc != MPI_SUCCESS) {
        wait_send(s);
        return rc;
    }
    int rrc = recv_hook(buf, count, dt, src, rtag, comm, status, dev, big);
    rc = wait_send(s);
    return rrc != MPI_SUCCESS ? rrc : rc;
}

/* ---- completion ----
 * The bodies of MPI_Wait ... MPI_Testsome, MPI_Request_get_status,
 * MPI_Request_free and MPI_Cancel; staging/persist.c exports the calls,
 * putting a persistent request's active operation in its place first. */

/* Straight to MPI when nothing is staged; polling while receives wait. */
#define NO_STAGED() (RK_STG_LIKELY(!rk_stg_active) || atomic_load_explicit(&rk_stg_nreq, memory_order_relaxed) == 0)

/* The Test calls' fast path: nothing staged, so MPI tests, after a round of
 * progress for the receives that may wait. */
static int test_plain(void)
{
    if (!NO_STAGED())
        return 0;
    if (rk_stg_active)
        rk_stg_progress();
    return 1;
}

int rk_stg_Wait(MPI_Request *req, MPI_Status *status)
{
    if (NO_STAGED()) {
        if (RK_STG_LIKELY(!rk_stg_active) || !pending_now())
            return PMPI_Wait(req, status);
        return rk_stg_wait(req, status);
    }
    req_t *r = lookup(*req);
    if (!r)
        return pending_now() ? rk_stg_wait(req, status) : PMPI_Wait(req, status);
    unsigned spins = 0;
    while (!advance(r))
        rk_stg_idle(&spins);
    *req = MPI_REQUEST_NULL;
    return finish(r, status);
}

int rk_stg_Test(MPI_Request *req, int *flag, MPI_Status *status)
{
    if (test_plain())
        return PMPI_Test(req, flag, status);
    req_t *r = lookup(*req);
    rk_stg_progress();
    if (!r)
        return PMPI_Test(req, flag, status);
    if (!advance(r)) {
        *flag = 0;
        return MPI_SUCCESS;
    }
    *flag = 1;
    *req = MPI_REQUEST_NULL;
    return finish(r, status);
}

int rk_stg_Request_get_status(MPI_Request req, int *flag, MPI_Status *status)
{
    req_t *r = NO_STAGED() ? NULL : lookup(req);
    if (rk_stg_active)
        rk_stg_progress();
    if (!r)
        return PMPI_Request_get_status(req, flag, status);
    *flag = advance(r);
    if (*flag)
        fill_status(r, status);
    return MPI_SUCCESS;
}

int rk_stg_Request_free(MPI_Request *req)
{
    req_t *r = NO_STAGED() ? NULL : lookup(*req);
    if (!r)
        return PMPI_Request_free(req);
    pthread_mutex_lock(&eng);
    int done = advance_locked(r);
    if (!done) {
        r->detached = 1;
        ndetached++;
    }
    pthread_mutex_unlock(&eng);
    *req = MPI_REQUEST_NULL;
    if (done)
        finish(r, MPI_STATUS_IGNORE);
    return MPI_SUCCESS;
}

int rk_stg_Cancel(MPI_Request *req)
{
    req_t *r = NO_STAGED() ? NULL : lookup(*req);
    if (!r)
        return PMPI_Cancel(req);
    pthread_mutex_lock(&eng);
    /* Only the first message can be cancelled: a receive whose message has
     * not come, a send whose header (or message) nobody took yet. */
    if (r->first != MPI_REQUEST_NULL)
        PMPI_Cancel(&r->first);
    pthread_mutex_unlock(&eng);
    return MPI_SUCCESS;
}

/* Arrays: the staged entries (found in the table) are advanced here, the
 * others handed to MPI in a copy of the array where the staged ones are
 * MPI_REQUEST_NULL, so that MPI's own rules (null and inactive requests,
 * all-or-nothing Testall) stay MPI's. */
typedef struct {
    int n, nst;
    req_t **r;         /* per index: the entry or NULL */
    MPI_Request *sub;  /* the array for MPI */
    MPI_Status *subst; /* statuses for MPI */
    req_t *r_small[16];
    MPI_Request sub_small[16];
    MPI_Status st_small[16];
} arr_t;

static int arr_init(arr_t *a, int n, MPI_Request *reqs)
{
    a->n = n;
    a->nst = 0;
    if (n <= 16) {
        a->r = a->r_small;
        a->sub = a->sub_small;
        a->subst = a->st_small;
    } else {
        a->r = malloc((size_t)n * sizeof *a->r);
        a->sub = malloc((size_t)n * sizeof *a->sub);
        a->subst = malloc((size_t)n * sizeof *a->subst);
        if (!a->r || !a->sub || !a->subst) {
            free(a->r), free(a->sub), free(a->subst);
            return -1;
        }
    }
    pthread_mutex_lock(&eng);
    for (int i = 0; i < n; i++) {
        a->r[i] = lookup_locked(reqs[i]);
        a->sub[i] = a->r[i] ? MPI_REQUEST_NULL : reqs[i];
        a->nst += a->r[i] != NULL;
    }
    pthread_mutex_unlock(&eng);
    return 0;
}

static void arr_free(arr_t *a)
{
    if (a->r != a->r_small) {
        free(a->r);
        free(a->sub);
        free(a->subst);
    }
}

static MPI_Status *st_at(MPI_Status *sts, int i)
{
    return sts == MPI_STATUSES_IGNORE ? MPI_STATUS_IGNORE : &sts[i];
}

/* The statuses array for MPI's part (the user's may be IGNORE). */
static MPI_Status *arr_subst(arr_t *a, MPI_Status *sts)
{
    return sts == MPI_STATUSES_IGNORE ? MPI_STATUSES_IGNORE : a->subst;
}

/* Hand back every entry of a completed array: ours finished, MPI's as MPI
 * left them. 1 when one of ours failed. */
static int arr_finish(arr_t *a, MPI_Request *reqs, MPI_Status *sts)
{
    int err = 0;
    for (int i = 0; i < a->n; i++) {
        if (a->r[i]) {
            err |= finish(a->r[i], st_at(sts, i)) != MPI_SUCCESS;
            reqs[i] = MPI_REQUEST_NULL;
        } else {
            reqs[i] = a->sub[i];
            if (sts != MPI_STATUSES_IGNORE)
                sts[i] = a->subst[i];
        }
    }
    return err;
}

/* Polling forms of MPI's own calls, for when staged receives wait. */
static int poll_waitall(int n, MPI_Request *reqs, MPI_Status *sts)
{
    unsigned spins = 0;
    for (;;) {
        int flag = 0, rc = PMPI_Testall(n, reqs, &flag, sts);
        if (rc != MPI_SUCCESS || flag)
            return rc;
        rk_stg_idle(&spins);
    }
}

int rk_stg_Waitall(int n, MPI_Request reqs[], MPI_Status sts[])
{
    if (NO_STAGED()) {
        if (RK_STG_LIKELY(!rk_stg_active) || !pending_now())
            return PMPI_Waitall(n, reqs, sts);
        return poll_waitall(n, reqs, sts);
    }
    arr_t a;
    if (arr_init(&a, n, reqs) != 0)
        return PMPI_Waitall(n, reqs, sts);
    if (a.nst == 0) {
        arr_free(&a);
        return pending_now() ? poll_waitall(n, reqs, sts) : PMPI_Waitall(n, reqs, sts);
    }
    unsigned spins = 0;
    int subdone = 0, rc = MPI_SUCCESS, left;
    MPI_Status *subst = arr_subst(&a, sts);
    for (;;) {
        left = 0;
        for (int i = 0; i < n; i++)
            if (a.r[i] && !advance(a.r[i]))
                left++;
        if (!subdone) {
            int flag = 0;
            rc = PMPI_Testall(n, a.sub, &flag, subst);
            subdone = flag || rc != MPI_SUCCESS;
        }
        if (subdone && !left)
            break;
        rk_stg_idle(&spins);
    }
    int err = arr_finish(&a, reqs, sts);
    arr_free(&a);
    if (rc == MPI_SUCCESS && err)
        rc = MPI_ERR_IN_STATUS;
    return rc;
}

int rk_stg_Testall(int n, MPI_Request reqs[], int *flag, MPI_Status sts[])
{
    if (test_plain())
        return PMPI_Testall(n, reqs, flag, sts);
    arr_t a;
    if (arr_init(&a, n, reqs) != 0)
        return PMPI_Testall(n, reqs, flag, sts);
    rk_stg_progress();
    int left = 0;
    for (int i = 0; i < n; i++)
        if (a.r[i] && !advance(a.r[i]))
            left++;
    *flag = 0;
    int rc = MPI_SUCCESS;
    if (!left) {
        /* All or nothing: MPI's part only once ours is complete. */
        rc = PMPI_Testall(n, a.sub, flag, arr_subst(&a, sts));
        if (*flag && arr_finish(&a, reqs, sts) && rc == MPI_SUCCESS)
            rc = MPI_ERR_IN_STATUS;
    }
    arr_free(&a);
    return rc;
}

/* One pass of Waitany/Testany: 1 when *index is set (MPI_UNDEFINED: no
 * active request at all). */
static int any_pass(arr_t *a, MPI_Request *reqs, int *index, MPI_Status *status, int *rc)
{
    for (int i = 0; i < a->n; i++)
        if (a->r[i] && advance(a->r[i])) {
            *rc = finish(a->r[i], status);
            a->r[i] = NULL;
            reqs[i] = MPI_REQUEST_NULL;
            *index = i;
            return 1;
        }
    int idx = MPI_UNDEFINED, flag = 0;
    MPI_Status st;
    *rc = PMPI_Testany(a->n, a->sub, &idx, &flag, &st);
    if (*rc != MPI_SUCCESS)
        return 1;
    if (flag && idx != MPI_UNDEFINED) {
        reqs[idx] = a->sub[idx];
        *index = idx;
        if (status != MPI_STATUS_IGNORE)
            *status = st;
        return 1;
    }
    int live = 0;
    for (int i = 0; i < a->n; i++)
        live += a->r[i] != NULL;
    if (flag && !live) {
        *index = MPI_UNDEFINED;
        if (status != MPI_STATUS_IGNORE)
            *status = st;
        return 1;
    }
    return 0;
}

int rk_stg_Waitany(int n, MPI_Request reqs[], int *index, MPI_Status *status)
{
    if (NO_STAGED() && (RK_STG_LIKELY(!rk_stg_active) || !pending_now()))
        return PMPI_Waitany(n, reqs, index, status);
    arr_t a;
    if (arr_init(&a, n, reqs) != 0)
        return PMPI_Waitany(n, reqs, index, status);
    unsigned spins = 0;
    int rc = MPI_SUCCESS;
    while (!any_pass(&a, reqs, index, status, &rc))
        rk_stg_idle(&spins);
    arr_free(&a);
    return rc;
}

int rk_stg_Testany(int n, MPI_Request reqs[], int *index, int *flag, MPI_Status *status)
{
    if (test_plain())
        return PMPI_Testany(n, reqs, index, flag, status);
    arr_t a;
    if (arr_init(&a, n, reqs) != 0)
        return PMPI_Testany(n, reqs, index, flag, status);
    rk_stg_progress();
    int rc = MPI_SUCCESS;
    *flag = any_pass(&a, reqs, index, status, &rc);
    if (!*flag)
        *index = MPI_UNDEFINED;
    arr_free(&a);
    return rc;
}

/* One pass of Waitsome/Testsome: how many completed (MPI_UNDEFINED: no
 * active request at all). */
static int some_pass(arr_t *a, MPI_Request *reqs, int *indices, MPI_Status *sts, int *rc)
{
    int out = 0, oc = 0;
    MPI_Status *subst = arr_subst(a, sts);
    int *idx = malloc((size_t)(a->n > 0 ? a->n : 1) * sizeof *idx);
    if (!idx) {
        *rc = MPI_ERR_NO_MEM;
        return 0;
    }
    *rc = PMPI_Testsome(a->n, a->sub, &oc, idx, subst);
    int err = 0;
    if (*rc == MPI_SUCCESS && oc != MPI_UNDEFINED)
        for (int j = 0; j < oc; j++) {
            int i = idx[j];
            reqs[i] = a->sub[i];
            indices[out] = i;
            if (sts != MPI_STATUSES_IGNORE)
                sts[out] = a->subst[j];
            out++;
        }
    free(idx);
    int live = 0;
    for (int i = 0; i < a->n; i++) {
        if (!a->r[i])
            continue;
        if (advance(a->r[i])) {
            err |= finish(a->r[i], st_at(sts, out)) != MPI_SUCCESS;
            a->r[i] = NULL;
            reqs[i] = MPI_REQUEST_NULL;
            indices[out++] = i;
        } else {
            live++;
        }
    }
    if (*rc == MPI_SUCCESS && err)
        *rc = MPI_ERR_IN_STATUS;
    if (out == 0 && oc == MPI_UNDEFINED && !live)
        return MPI_UNDEFINED;
    return out;
}

int rk_stg_Waitsome(int n, MPI_Request reqs[], int *outcount, int indices[],
                    MPI_Status sts[])
{
    if (NO_STAGED() && (RK_STG_LIKELY(!rk_stg_active) || !pending_now()))
        return PMPI_Waitsome(n, reqs, outcount, indices, sts);
    arr_t a;
    if (arr_init(&a, n, reqs) != 0)
        return PMPI_Waitsome(n, reqs, outcount, indices, sts);
    unsigned spins = 0;
    int rc = MPI_SUCCESS, out;
    while ((out = some_pass(&a, reqs, indices, sts, &rc)) == 0 && rc == MPI_SUCCESS)
        rk_stg_idle(&spins);
    *outcount = out;
    arr_free(&a);
    return rc;
}

int rk_stg_Testsome(int n, MPI_Request reqs[], int *outcount, int indices[],
                    MPI_Status sts[])
{
    if (test_plain())
        return PMPI_Testsome(n, reqs, outcount, indices, sts);
    arr_t a;
    if (arr_init(&a, n, reqs) != 0)
        return PMPI_Testsome(n, reqs, outcount, indices, sts);
    rk_stg_progress();
    int rc = MPI_SUCCESS;
    *outcount = some_pass(&a, reqs, indices, sts, &rc);
    arr_free(&a);
    return rc;
}

/* ---- finalize ---- */

void rk_stg_p2p_finalize(void)
{
    if (rk_stg_hooked)
        rk_mpi_verbose("staging: %ld nonblocking messages went through the ring", ring_msgs);
    /* Detached requests still running: finish what is done; the rest is
     * left to MPI_Finalize (their memory is not given back). */
    for (int round = 0; round < 1000 && ndetached; round++) {
        rk_stg_progress();
        sched_yield();
    }
}
