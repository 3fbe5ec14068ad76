/* Staging, point to point: the MPI calls (MPI_Send ... MPI_Sendrecv_replace,
 * the probes and their stash) and the choice of a protocol for each message.
 *
 * How a message travels (docs/staging.md has the whole story). The calls
 * here classify the buffer (memory kind, datatype layout: rk_stg_layout) and
 * pick one of three protocols:
 *   - staging/proto_ipc.c: a contiguous device message of at least
 *     RK_STG_IPC_MIN bytes to a rank that CUDA IPC reaches is a 32-byte
 *     header on the user's communicator and tag, then a descriptor of the
 *     sender's memory; the receiver copies the data itself and answers;
 *   - staging/proto_pipe.c: a larger contiguous device message (more than
 *     RK_STG_BIG bytes) is a header on the user's communicator and tag,
 *     then its bytes in segments on the plugin's duplicate of
 *     MPI_COMM_WORLD, tagged with an id the header carries, through a ring
 *     of pinned slots. The header keeps MPI's matching (any source, any
 *     tag, order between a pair) exactly as the user's message would have;
 *     the segments cannot meet anything of the user's;
 *   - staging/proto_eager.c: anything else (a host buffer, a device buffer
 *     of at most RK_STG_BIG bytes or of a non-contiguous datatype) is one
 *     ordinary MPI message on the user's communicator and tag, device data
 *     copied to pinned memory first.
 * So a receiver must recognise a header: every device receive, and every
 * host receive of more than RK_STG_BIG bytes (smaller ones cannot meet
 * one), goes through here. Nonblocking calls make requests of the engine
 * in staging/request.c, which advances them and holds the Wait/Test
 * family. staging/p2p.h has what these files share. */
#define _GNU_SOURCE
#include "p2p.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RK_STG_EXPORT RK_MPI_EXPORT

int rk_stg_is_header(const void *p, hdr_t *h)
{
    memcpy(h, p, sizeof *h);
    return h->magic0 == MAGIC0 && h->magic1 == MAGIC1 && h->seg > 0 && h->id >= 0 &&
           h->total > 0;
}

/* World rank of rank r of comm (the remote group for an intercommunicator);
 * -1 if it is not in MPI_COMM_WORLD (spawned processes). */
int rk_stg_to_world(MPI_Comm comm, int r)
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
size_t rk_stg_status_bytes(const MPI_Status *st)
{
    MPI_Count n = 0;
    if (PMPI_Get_elements_x(st, MPI_BYTE, &n) != MPI_SUCCESS || n < 0)
        return 0;
    return (size_t)n;
}

void rk_stg_status_set_bytes(MPI_Status *st, size_t bytes)
{
    PMPI_Status_set_elements_x(st, MPI_BYTE, (MPI_Count)bytes);
}

int rk_stg_staging_error(MPI_Comm comm, const char *what)
{
    rk_mpi_warn("staging: %s", what);
    PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
    return MPI_ERR_OTHER;
}

/* ---- send side ---- */

int rk_stg_isend_mode(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
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

/* Start a staged send and post everything: the user's buffer may be
 * reused when this returns, and the transfer needs nothing more from this
 * process (MPI moves it). r->first is the user-visible message; segments
 * in r->segs. The blocking calls wait with wait_send(). */
static int send_post(req_t *r, const void *buf, int dest, int tag, int mode, int wait_ok)
{
    int rc;
    int wdest = -1;
    if (r->L.contig && r->L.size >= RK_STG_IPC_MIN && mode != M_BSEND && rk_ipc_on &&
        (wdest = rk_stg_to_world(r->comm, dest)) >= 0) {
        rk_stg_sends_flush(); /* the header must not overtake deferred sends */
        if (rk_stg_ipc_send_post(r, buf, dest, wdest, tag, mode, &rc))
            return rc;
    }
    int pipelined = r->L.contig && r->L.size > RK_STG_BIG && mode != M_BSEND &&
                    (wdest = rk_stg_to_world(r->comm, dest)) >= 0;
    if (!pipelined) {
        /* Nonblocking: the copy runs on while the program goes on. */
        if (!wait_ok && rk_stg_eager_defer(r, buf, dest, tag, mode, &rc))
            return rc;
        rk_stg_sends_flush();
        return rk_stg_eager_post(r, buf, dest, tag, mode, wait_ok);
    }
    rk_stg_sends_flush();
    return rk_stg_pipe_post(r, buf, dest, wdest, tag, mode, wait_ok);
}

/* Wait for a send r posted by send_post (not published), free it. */
static int wait_send(req_t *r)
{
    int rc = MPI_SUCCESS;
    if (r->ipc) {
        /* The answer may ask for the data: advance until done. */
        unsigned spins = 0;
        while (!rk_stg_advance(r))
            rk_stg_idle(&spins);
        rc = r->err;
        rk_stg_count(r->copied, rk_stg_now() - r->t0);
        rk_stg_req_release(r);
        return rc;
    }
    if (r->first != MPI_REQUEST_NULL)
        rc = rk_stg_wait(&r->first, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && r->nseg)
        rc = rk_stg_wait_all(r->nseg, r->segs);
    if (rc == MPI_SUCCESS && r->err != MPI_SUCCESS) {
        rc = r->err; /* a segment went empty (rk_stg_pipe_post) */
        PMPI_Comm_call_errhandler(r->comm, rc);
    }
    rk_stg_count(r->copied, rk_stg_now() - r->t0);
    rk_stg_req_release(r);
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
        (wdest = rk_stg_to_world(comm, dest)) >= 0 && rk_ipc_reaches(wdest)) {
        req_t *r = rk_stg_req_new(K_SEND, (void *)buf, count, dt, comm);
        if (!r)
            return rk_stg_staging_error(comm, "out of memory");
        r->L = L;
        if (rk_stg_ipc_send_post(r, buf, dest, wdest, tag, mode, &rc)) {
            if (rc != MPI_SUCCESS) {
                /* What was posted must finish before r goes. */
                unsigned spins = 0;
                while (r->nseg && !rk_stg_advance(r))
                    rk_stg_idle(&spins);
                rk_stg_req_release(r);
                return rc;
            }
            return wait_send(r);
        }
        rk_stg_req_release(r);
    }
    if (L.contig && L.size <= RK_STG_BIG && mode != M_BSEND && !rk_stg_pending_now()) {
        /* Small and contiguous: one copy, then MPI's own blocking send (no
         * request to make, poll and free: latency is what counts here). */
        rk_stg_buf_t hb;
        if (rk_stg_buf_get(L.size, 1, &hb) != 0)
            return rk_stg_staging_error(comm, "out of memory for a send");
        if (L.size && rk_stg_copy_sync(hb.ptr, (const char *)buf + L.lo, L.size, RK_STG_D2H)) {
            rk_stg_buf_put(&hb);
            return rk_stg_staging_error(comm, "cannot stage a send");
        }
        rc = mode == M_SSEND ? PMPI_Ssend(hb.ptr - L.lo, count, dt, dest, tag, comm)
                             : PMPI_Send(hb.ptr - L.lo, count, dt, dest, tag, comm);
        rk_stg_buf_put(&hb);
        rk_stg_count(L.size, rk_stg_now() - t0);
        return rc;
    }
    if (L.contig && L.size > RK_STG_BIG && mode != M_BSEND &&
        (wdest = rk_stg_to_world(comm, dest)) >= 0) {
        rc = rk_stg_send_ring(buf, L.size, dest, wdest, tag, comm, mode);
        rk_stg_count(L.size, rk_stg_now() - t0);
        return rc;
    }
    req_t *r = rk_stg_req_new(K_SEND, (void *)buf, count, dt, comm);
    if (!r)
        return rk_stg_staging_error(comm, "out of memory");
    r->L = L;
    if (mode == M_BSEND) {
        /* Buffered: MPI copies out of our image before returning. */
        if (rk_stg_stage_in_all(r, buf, 1) != 0) {
            rk_stg_req_release(r);
            return rk_stg_staging_error(comm, "cannot stage a send");
        }
        rc = PMPI_Bsend(r->hb.ptr - r->L.lo, count, dt, dest, tag, comm);
        rk_stg_count(r->copied, rk_stg_now() - t0);
        rk_stg_req_release(r);
        return rc;
    }
    rc = send_post(r, buf, dest, tag, mode, 1);
    if (rc != MPI_SUCCESS) {
        rk_stg_req_release(r);
        return rc;
    }
    return wait_send(r);
}

/* A nonblocking send of a device buffer: *request is the user's. */
static int isend_dev(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                     MPI_Comm comm, int mode, MPI_Request *request)
{
    req_t *r = rk_stg_req_new(K_SEND, (void *)buf, count, dt, comm);
    if (!r)
        return rk_stg_staging_error(comm, "out of memory");
    int rc = rk_stg_layout(dt, 0, count, &r->L);
    if (rc == MPI_SUCCESS)
        rc = send_post(r, buf, dest, tag, mode, 0);
    if (rc == MPI_SUCCESS)
        rc = rk_stg_req_publish(r, request);
    if (rc != MPI_SUCCESS) {
        /* What was posted must finish before its memory goes. */
        if (r->state == S_DEFER)
            rk_stg_sends_flush(); /* hands it to MPI, with the older ones */
        if (r->first != MPI_REQUEST_NULL)
            rk_stg_wait(&r->first, MPI_STATUS_IGNORE);
        if (r->ring) {
            unsigned spins = 0;
            while (!rk_stg_advance(r))
                rk_stg_idle(&spins);
        } else if (r->nseg) {
            rk_stg_wait_all(r->nseg, r->segs);
        }
        rk_stg_req_release(r);
    }
    return rc;
}

/* ---- receive side, blocking ---- */

/* A blocking receive that may meet a header (device buffer, or a host
 * buffer of more than RK_STG_BIG bytes). */
/* If the 32 bytes at img are a header (the first message's status st):
 * receive its segments into (buf, count, dt); *bytes becomes the message's
 * size. -1 when they are data. */
static int header_segments(const void *img, const MPI_Status *st, void *buf, int count,
                           MPI_Datatype dt, int dev, MPI_Comm comm, size_t *bytes, size_t *copied)
{
    hdr_t h;
    if (!rk_stg_is_header(img, &h))
        return -1;
    *bytes = h.total;
    int w = rk_stg_to_world(comm, st->MPI_SOURCE);
    return w < 0 ? MPI_ERR_OTHER : rk_stg_recv_segments(buf, count, dt, dev, &h, w, comm, copied);
}

/* The end of a blocking staged receive: the user's status, the count, and
 * the communicator's handler for an error of ours (mpi_rc: an MPI call's own
 * error, for which MPI called the handler already). */
static int recv_done(MPI_Comm comm, MPI_Status *status, const MPI_Status *st, size_t bytes,
                     int rc, int mpi_rc, int dev, size_t copied, uint64_t t0)
{
    if (status != MPI_STATUS_IGNORE) {
        *status = *st;
        rk_stg_status_set_bytes(status, bytes);
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
    if (dev && !rk_stg_pending_now() && L.contig && L.size <= RK_STG_BIG) {
        /* Small contiguous device receive: MPI's own receive into pinned
         * memory, then one copy. A message that fits cannot be a header
         * unless the sender pipelined more than the receive holds: then the
         * 32 bytes are a header (a truncation, told as below). */
        rk_stg_buf_t hb;
        if (rk_stg_buf_get(L.size, 1, &hb) != 0)
            return rk_stg_staging_error(comm, "out of memory for a receive");
        rc = mpi_rc = PMPI_Recv(hb.ptr - L.lo, count, dt, src, tag, comm, &st);
        bytes = rc == MPI_SUCCESS ? rk_stg_status_bytes(&st) : 0;
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
    if (!rk_stg_pending_now()) {
        rc = PMPI_Mprobe(src, tag, comm, &msg, &st);
    } else {
        unsigned spins = 0;
        int flag = 0;
        while ((rc = PMPI_Improbe(src, tag, comm, &flag, &msg, &st)) == MPI_SUCCESS && !flag)
            rk_stg_idle(&spins);
    }
    if (rc != MPI_SUCCESS)
        return rc;
    bytes = rk_stg_status_bytes(&st);
    MPI_Status st2;
    if (bytes == RK_STG_HDR_BYTES) {
        char tmp[RK_STG_HDR_BYTES];
        rc = PMPI_Mrecv(tmp, RK_STG_HDR_BYTES, MPI_BYTE, &msg, &st2);
        if (rc != MPI_SUCCESS)
            return rc;
        rc = header_segments(tmp, &st, buf, count, dt, dev, comm, &bytes, &copied);
        if (rc == -1)
            rc = rk_stg_deliver(buf, count, dt, dev, tmp, bytes, comm, &copied);
        mpi_rc = MPI_SUCCESS;
    } else if (!dev) {
        rc = mpi_rc = PMPI_Mrecv(buf, count, dt, &msg, &st2);
        bytes = rk_stg_status_bytes(&st2);
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
            return rk_stg_staging_error(comm, "out of memory for a receive");
        rc = mpi_rc = PMPI_Mrecv(hb.ptr - L.lo, count, dt, &msg, &st2);
        if (rc == MPI_SUCCESS) {
            bytes = rk_stg_status_bytes(&st2);
            if (rk_stg_put_elems_sync(buf, hb.ptr - L.lo, dt, 0, rk_stg_elems_in(&L, bytes), &L,
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
    req_t *r = rk_stg_req_new(K_RECV, buf, count, dt, comm);
    if (!r)
        return rk_stg_staging_error(comm, "out of memory");
    r->dev = dev;
    int rc = rk_stg_layout(dt, 0, count, &r->L);
    if (rc != MPI_SUCCESS) {
        rk_stg_req_release(r);
        return rc;
    }
    void *target = buf;
    if (dev) {
        /* The whole capacity: the message's size is not known yet. */
        size_t room = r->L.contig ? r->L.size : r->L.span;
        if (rk_stg_buf_get(room, 0, &r->hb) != 0) {
            rk_stg_req_release(r);
            return rk_stg_staging_error(comm, "out of memory for a receive");
        }
        target = r->hb.ptr - r->L.lo;
    }
    rc = PMPI_Irecv(target, count, dt, src, tag, comm, &r->first);
    r->state = S_FIRST;
    if (rc == MPI_SUCCESS)
        rc = rk_stg_req_publish(r, request);
    if (rc != MPI_SUCCESS) {
        if (r->first != MPI_REQUEST_NULL) {
            PMPI_Cancel(&r->first);
            PMPI_Wait(&r->first, MPI_STATUS_IGNORE);
        }
        rk_stg_req_release(r);
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
    pthread_mutex_lock(&rk_stg_eng);
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
    pthread_mutex_unlock(&rk_stg_eng);
    return e;
}

static size_t stash_bytes(const stash_t *e)
{
    hdr_t h;
    return e->header && rk_stg_is_header(e->data, &h) ? (size_t)h.total : RK_STG_HDR_BYTES;
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
    if (e->header && rk_stg_is_header(e->data, &h)) {
        int w = rk_stg_to_world(comm, e->st.MPI_SOURCE);
        rc =
            w < 0 ? MPI_ERR_OTHER : rk_stg_recv_segments(buf, count, dt, dev, &h, w, comm, &copied);
    } else {
        rc = rk_stg_deliver(buf, count, dt, dev, e->data, bytes, comm, &copied);
    }
    if (status != MPI_STATUS_IGNORE) {
        *status = e->st;
        rk_stg_status_set_bytes(status, bytes);
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
    e->header = rk_stg_is_header(e->data, &h);
    return e;
}

/* A probe saw st: if it is 32 bytes, take it (if still there) and stash it.
 * 1 when *st now describes the message (count fixed), 0 when another
 * thread took it first. */
static int probe_seen(MPI_Comm comm, MPI_Status *st)
{
    if (rk_stg_status_bytes(st) != RK_STG_HDR_BYTES)
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
    pthread_mutex_lock(&rk_stg_eng);
    stash_t **pp = &stash_head;
    while (*pp)
        pp = &(*pp)->next;
    *pp = e;
    atomic_fetch_add(&nstash, 1);
    pthread_mutex_unlock(&rk_stg_eng);
    *st = st2;
    rk_stg_status_set_bytes(st, stash_bytes(e));
    return 1;
}

static void stash_status(const stash_t *e, MPI_Status *status)
{
    if (status == MPI_STATUS_IGNORE)
        return;
    *status = e->st;
    rk_stg_status_set_bytes(status, stash_bytes(e));
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
        if (!rk_stg_pending_now()) {
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
    if (RK_STG_LIKELY(!rk_stg_active) ||
        (!rk_stg_is_device_dt(buf, count, dt) && !rk_stg_pending_now() && !rk_stg_deferred_now()))
        return psend(buf, count, dt, dest, tag, comm, mode);
    rk_stg_sends_flush(); /* sends go to MPI in the program's order */
    if (dest != MPI_PROC_NULL && rk_stg_is_device_dt(buf, count, dt))
        return send_dev(buf, count, dt, dest, tag, comm, mode);
    if (mode == M_BSEND || !rk_stg_pending_now())
        return psend(buf, count, dt, dest, tag, comm, mode);
    /* A host send while staged receives wait for headers: poll. */
    MPI_Request r;
    int rc = rk_stg_isend_mode(buf, count, dt, dest, tag, comm, mode, &r);
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
    if (!dev && !rk_stg_pending_now() && !stash_any() && !rk_stg_big_recv(count, dt))
        return PMPI_Recv(buf, count, dt, src, tag, comm, status);
    return recv_hook(buf, count, dt, src, tag, comm, status, dev,
                     !dev && rk_stg_big_recv(count, dt));
}

int rk_stg_isend_any(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                     MPI_Comm comm, MPI_Request *req, int mode)
{
    if (RK_STG_LIKELY(!rk_stg_active) || dest == MPI_PROC_NULL ||
        !rk_stg_is_device_dt(buf, count, dt)) {
        rk_stg_sends_flush(); /* not before the deferred sends (none: one load) */
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
        req_t *r = rk_stg_req_new(K_RECV, buf, count, dt, comm);
        if (!r)
            return rk_stg_staging_error(comm, "out of memory");
        r->err = stash_recv(e, buf, count, dt, dev, comm, &r->st, &r->total, 0);
        r->state = S_DONE;
        int rc = rk_stg_req_publish(r, req);
        if (rc != MPI_SUCCESS)
            rk_stg_req_release(r);
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
    if (!sdev && !rdev && !big && !rk_stg_pending_now() && !stash_any() &&
        !rk_stg_deferred_now())
        return PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag,
                             comm, status);
    rk_stg_sends_flush();
    /* The send goes first and needs nothing more from us; then the receive. */
    req_t *s = NULL;
    MPI_Request hreq = MPI_REQUEST_NULL;
    int rc;
    if (sdev) {
        s = rk_stg_req_new(K_SEND, (void *)sbuf, scount, stype, comm);
        if (!s)
            return rk_stg_staging_error(comm, "out of memory");
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
    if (!dev && !big && !rk_stg_pending_now() && !stash_any() && !rk_stg_deferred_now())
        return PMPI_Sendrecv_replace(buf, count, dt, dest, stag, src, rtag, comm, status);
    rk_stg_sends_flush();
    /* Send from a copy (ours: the receive overwrites buf), then receive. */
    req_t *s = rk_stg_req_new(K_SEND, buf, count, dt, comm);
    if (!s)
        return rk_stg_staging_error(comm, "out of memory");
    int rc = rk_stg_layout(dt, 0, count, &s->L);
    if (rc != MPI_SUCCESS) {
        rk_stg_req_release(s);
        return rc;
    }
    if (dest == MPI_PROC_NULL) {
        s->nseg = 0;
    } else if (dev) {
        s->no_ipc = 1; /* the receive below overwrites buf while a peer could still read it */
        rc = send_post(s, buf, dest, stag, M_STD, 1);
    } else {
        if (rk_stg_buf_get(s->L.span, 1, &s->hb) != 0) {
            rk_stg_req_release(s);
            return rk_stg_staging_error(comm, "out of memory");
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
