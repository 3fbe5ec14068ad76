/* Staging, point to point: the pipelined protocol. A contiguous device
 * message of more than RK_STG_BIG bytes is a 32-byte header on the user's
 * communicator and tag, then its bytes in segments on the plugin's
 * communicator, each copied through pinned memory while others move:
 * blocking calls through a ring of their own (rk_stg_send_ring,
 * rk_stg_recv_segments), nonblocking ones through the shared ring below. */
#define _GNU_SOURCE
#include "p2p.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int ring_inuse[2];         /* slots in use: [0] sends, [1] receives */
static uint64_t ring_moved[2];    /* when a slot last finished */

long rk_stg_ring_msgs; /* messages that went through the ring (verbose) */

static void slot_clear(req_t *r, int i)
{
    r->slot[i].seg = -1;
    r->slot[i].state = R_FREE;
    r->slot[i].empty = 0;
    r->slot[i].ev = NULL;
    r->slot[i].rq = MPI_REQUEST_NULL;
    memset(&r->slot[i].b, 0, sizeof r->slot[i].b);
}

void rk_stg_ring_init(req_t *r, int peer, size_t total, size_t seg)
{
    rk_stg_ring_msgs++;
    r->ring = 1;
    r->peer = peer;
    r->total = total;
    r->seg = seg;
    r->nseg = (int)((total + seg - 1) / seg);
    r->next_start = r->next_post = r->ndone = r->nslots = 0;
    for (int i = 0; i < RK_STG_DEPTH; i++)
        slot_clear(r, i);
}

/* Whether r may put segment r->next_start into its slot now. An error
 * does not stop the ring: the peer waits for every segment (those that
 * fail travel empty, or are taken and dropped). Under rk_stg_eng. */
static int ring_may_start(req_t *r, int dir)
{
    int i = r->next_start % RK_STG_DEPTH;
    if (r->next_start >= r->nseg || r->slot[i].state != R_FREE)
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
 * is done, slots freed as their sends finish. Under rk_stg_eng. */
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
            r->slot[i].empty = 1;
        if (r->slot[i].empty)
            r->err = MPI_ERR_OTHER; /* it goes empty: the receiver waits for it */
        int k = r->next_post++;
        int len = r->slot[i].empty ? 0 : (int)rk_stg_seg_len(r->total, r->seg, k);
        if (PMPI_Isend(r->slot[i].b.ptr, len, MPI_BYTE, r->peer, r->hdr.id, rk_stg_comm(),
                       &r->slot[i].rq) != MPI_SUCCESS) {
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
        size_t off = (size_t)k * r->seg, n = rk_stg_seg_len(r->total, r->seg, k);
        if (rk_stg_copy(r->slot[i].b.ptr, (const char *)r->ubuf + off, n, RK_STG_D2H,
                        &r->slot[i].ev) != 0)
            r->slot[i].empty = 1; /* no event: the segment goes empty */
        r->copied += n;
        r->slot[i].state = R_COPY_IN;
    }
}

/* Receiving: receives posted into free slots in order, each landed segment
 * copied to the device, its slot freed when the copy is done. Under rk_stg_eng. */
static void ring_recv_advance(req_t *r)
{
    for (int i = 0; i < RK_STG_DEPTH; i++) {
        if (r->slot[i].state == R_RECV) {
            int f = 0;
            MPI_Status st;
            if (PMPI_Test(&r->slot[i].rq, &f, &st) != MPI_SUCCESS)
                r->err = MPI_ERR_OTHER, f = 1, r->slot[i].empty = 1;
            if (!f)
                continue;
            int k = r->slot[i].seg;
            size_t off = (size_t)k * r->seg, n = rk_stg_seg_len(r->total, r->seg, k);
            if (!r->slot[i].empty && rk_stg_seg_short(&st, n))
                r->err = MPI_ERR_OTHER, r->slot[i].empty = 1;
            if (!r->slot[i].empty && rk_stg_copy((char *)r->ubuf + off, r->slot[i].b.ptr, n,
                                                 RK_STG_H2D, &r->slot[i].ev) != 0)
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
        if (PMPI_Irecv(r->slot[i].b.ptr, (int)rk_stg_seg_len(r->total, r->seg, k), MPI_BYTE,
                       r->peer, r->hdr.id, rk_stg_comm(), &r->slot[i].rq) != MPI_SUCCESS) {
            r->err = MPI_ERR_OTHER;
            ring_free(r, i, 1, 0);
            continue;
        }
        r->slot[i].state = R_RECV;
    }
}

/* A ring send whose header was cancelled: its segments will never be
 * received. Sends posted are cancelled and their buffers left to MPI; the
 * others end here. Under rk_stg_eng. */
void rk_stg_ring_send_cancel(req_t *r)
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

/* Advance a ring request; 1 when all its segments are done. Under rk_stg_eng. */
int rk_stg_ring_advance(req_t *r)
{
    if (r->kind == K_SEND)
        ring_send_advance(r);
    else
        ring_recv_advance(r);
    if (r->ndone < r->nseg)
        return 0;
    rk_stg_alist_del(r);
    return 1;
}

size_t rk_stg_seg_len(size_t total, size_t seg, int k)
{
    size_t off = (size_t)k * seg;
    return total - off < seg ? total - off : seg;
}

/* Segments of a pipelined receive: copy each to the device as it lands.
 * Under rk_stg_eng. */
void rk_stg_advance_segs(req_t *r)
{
    if (r->ring) {
        if (rk_stg_ring_advance(r))
            r->state = S_DONE;
        return;
    }
    int out = 0;
    if (r->nrecvd < r->nseg &&
        PMPI_Testsome(r->nseg, r->segs, &out, r->idx, r->sts) == MPI_SUCCESS &&
        out != MPI_UNDEFINED) {
        for (int j = 0; j < out; j++) {
            int k = r->idx[j];
            if (r->total && rk_stg_seg_short(&r->sts[j], rk_stg_seg_len(r->total, r->seg, k))) {
                r->err = MPI_ERR_OTHER; /* the sender could not stage it */
                continue;
            }
            if (r->dev && r->L.contig && r->total) {
                size_t off = (size_t)k * r->seg, n = rk_stg_seg_len(r->total, r->seg, k);
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
    if (!r->L.contig && r->total && r->err == MPI_SUCCESS) {
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

/* A pipelined send to world rank wdest (send_post's choice for a large
 * contiguous message): the header, then the segments, through the ring when
 * nonblocking, else all posted as their copies finish. */
int rk_stg_pipe_post(req_t *r, const void *buf, int dest, int wdest, int tag, int mode,
                     int wait_ok)
{
    int rc;
    size_t total = r->L.size, seg = seg_size(total);
    int nseg = (int)((total + seg - 1) / seg);
    if (!wait_ok && rk_stg_hooked) {
        /* Nonblocking: the header now, the segments through the ring as
         * their copies finish; later calls drive it (rk_stg_progress). */
        rk_stg_ring_init(r, wdest, total, seg);
        r->hdr = (hdr_t){MAGIC0, MAGIC1, total, (uint32_t)seg, rk_stg_next_id()};
        rc = rk_stg_isend_mode(&r->hdr, RK_STG_HDR_BYTES, MPI_BYTE, dest, tag, r->comm, mode,
                               &r->first);
        if (rc != MPI_SUCCESS) {
            r->ring = 0;
            r->nseg = 0;
            return rc;
        }
        r->state = S_SEGS;
        pthread_mutex_lock(&rk_stg_eng);
        rk_stg_alist_add(r);
        rk_stg_ring_advance(r);
        pthread_mutex_unlock(&rk_stg_eng);
        return MPI_SUCCESS;
    }
    if (rk_stg_buf_get(total, wait_ok, &r->hb) != 0 || rk_stg_alloc_segs(r, nseg, nseg) != 0)
        return rk_stg_staging_error(r->comm, "out of memory for a send");
    for (int k = 0; k < nseg; k++)
        if (rk_stg_copy(r->hb.ptr + (size_t)k * seg, (const char *)buf + (size_t)k * seg,
                        rk_stg_seg_len(total, seg, k), RK_STG_D2H, &r->evs[k]) != 0)
            return rk_stg_staging_error(r->comm, "device-to-host copy failed");
    r->copied += total;
    r->hdr = (hdr_t){MAGIC0, MAGIC1, total, (uint32_t)seg, rk_stg_next_id()};
    rc =
        rk_stg_isend_mode(&r->hdr, RK_STG_HDR_BYTES, MPI_BYTE, dest, tag, r->comm, mode, &r->first);
    if (rc != MPI_SUCCESS)
        return rc;
    /* Each segment goes as soon as its copy is done; the later copies run
     * on the GPU meanwhile. The header went: a segment whose copy failed
     * goes empty (the receiver waits for each), and the send fails. */
    for (int k = 0; k < nseg; k++) {
        int empty = r->err != MPI_SUCCESS || rk_stg_event_wait(r->evs[k]) != 0;
        if (empty && r->err == MPI_SUCCESS) {
            rk_mpi_warn("staging: device-to-host copy failed");
            r->err = MPI_ERR_OTHER;
        }
        rc = PMPI_Isend(r->hb.ptr + (size_t)k * seg,
                        empty ? 0 : (int)rk_stg_seg_len(total, seg, k), MPI_BYTE, wdest,
                        r->hdr.id, rk_stg_comm(), &r->segs[k]);
        if (rc != MPI_SUCCESS)
            return rc;
    }
    r->state = S_SEGS;
    return MPI_SUCCESS;
}

/* A blocking pipelined send: a ring of RK_STG_DEPTH segments of pinned
 * memory, the copy of segment k+1.. overlapping the send of segment k. */
int rk_stg_send_ring(const void *buf, size_t total, int dest, int wdest, int tag, MPI_Comm comm,
                     int mode)
{
    size_t seg = seg_size(total);
    int nseg = (int)((total + seg - 1) / seg), depth = nseg < RK_STG_DEPTH ? nseg : RK_STG_DEPTH;
    rk_stg_buf_t ring;
    if (rk_stg_buf_get((size_t)depth * seg, 1, &ring) != 0)
        return rk_stg_staging_error(comm, "out of memory for a send");
    void *ev[RK_STG_DEPTH] = {0};
    MPI_Request sreq[RK_STG_DEPTH], hreq = MPI_REQUEST_NULL;
    for (int i = 0; i < RK_STG_DEPTH; i++)
        sreq[i] = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS, bad = 0;
    for (int k = 0; k < depth && !bad; k++)
        bad = rk_stg_copy(ring.ptr + (size_t)k * seg, (const char *)buf + (size_t)k * seg,
                          rk_stg_seg_len(total, seg, k), RK_STG_D2H, &ev[k]);
    hdr_t h = {MAGIC0, MAGIC1, total, (uint32_t)seg, rk_stg_next_id()};
    if (!bad)
        rc = rk_stg_isend_mode(&h, RK_STG_HDR_BYTES, MPI_BYTE, dest, tag, comm, mode, &hreq);
    int sent = 0; /* segments posted */
    for (int k = 0; k < nseg && !bad && rc == MPI_SUCCESS; k++) {
        int s = k % depth;
        bad = rk_stg_event_wait(ev[s]);
        rk_stg_event_put(ev[s]);
        ev[s] = NULL;
        if (bad)
            break;
        rc = PMPI_Isend(ring.ptr + (size_t)s * seg, (int)rk_stg_seg_len(total, seg, k), MPI_BYTE,
                        wdest, h.id, rk_stg_comm(), &sreq[s]);
        sent += rc == MPI_SUCCESS;
        /* The previous segment's slot takes segment k - 1 + depth once sent. */
        int p = k - 1, next = p + depth;
        if (rc == MPI_SUCCESS && p >= 0 && next < nseg) {
            int ps = p % depth;
            rc = rk_stg_wait(&sreq[ps], MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS)
                bad = rk_stg_copy(ring.ptr + (size_t)ps * seg,
                                  (const char *)buf + (size_t)next * seg,
                                  rk_stg_seg_len(total, seg, next), RK_STG_D2H, &ev[ps]);
        }
    }
    if (bad && hreq != MPI_REQUEST_NULL) {
        /* The header went: the receiver waits for every segment. Those not
         * sent go empty, so that its receive ends, with an error. */
        char dummy = 0;
        for (int k = sent; k < nseg; k++)
            PMPI_Send(&dummy, 0, MPI_BYTE, wdest, h.id, rk_stg_comm());
    }
    if (bad && rc == MPI_SUCCESS)
        rc = rk_stg_staging_error(comm, "device-to-host copy failed");
    /* Everything posted must finish before the ring goes back. */
    int rc2 = rk_stg_wait_all(depth, sreq);
    int rc3 = hreq != MPI_REQUEST_NULL ? rk_stg_wait(&hreq, MPI_STATUS_IGNORE) : MPI_SUCCESS;
    for (int i = 0; i < RK_STG_DEPTH; i++) {
        if (ev[i])
            rk_stg_event_wait(ev[i]);
        rk_stg_event_put(ev[i]);
    }
    rk_stg_buf_put(&ring);
    return rc != MPI_SUCCESS ? rc : rc2 != MPI_SUCCESS ? rc2 : rc3;
}

/* A segment that came shorter than announced: its sender could not stage
 * it and sent it empty (a copy from its device failed). The receive fails
 * rather than hand on bytes it never got. */
int rk_stg_seg_short(const MPI_Status *st, size_t want)
{
    int got = 0;
    return PMPI_Get_count(st, MPI_BYTE, &got) != MPI_SUCCESS || got < 0 || (size_t)got != want;
}

/* Take segments from.. of message id from src and drop them, so that the
 * sender's calls end although this side has no memory of its own for
 * them: into the reserve set aside at init, else a buffer of the moment;
 * without either, receives of no bytes (MPI_ERR_TRUNCATE, returned on the
 * plugin's communicator), the last resort. */
void rk_stg_drain(int src, int id, size_t total, size_t seg, int from)
{
    if (src < 0 || !seg)
        return;
    int nseg = (int)((total + seg - 1) / seg);
    char dummy, *own = NULL, *room = rk_stg_reserve_take(seg);
    if (!room)
        room = own = malloc(seg);
    for (int k = from; k < nseg; k++)
        PMPI_Recv(room ? room : &dummy, room ? (int)rk_stg_seg_len(total, seg, k) : 0, MPI_BYTE,
                  src, id, rk_stg_comm(), MPI_STATUS_IGNORE);
    if (own)
        free(own);
    else if (room)
        rk_stg_reserve_give();
}

/* Wait for the n segment receives rq of a message (total, seg): MPI's
 * error, else MPI_ERR_OTHER when one came short. */
static int wait_segs(int n, MPI_Request *rq, size_t total, size_t seg)
{
    int rc = MPI_SUCCESS;
    for (int k = 0; k < n; k++) {
        MPI_Status st;
        int e = rk_stg_wait(&rq[k], &st);
        if (e == MPI_SUCCESS && rk_stg_seg_short(&st, rk_stg_seg_len(total, seg, k)))
            e = MPI_ERR_OTHER;
        if (rc == MPI_SUCCESS)
            rc = e;
    }
    return rc;
}

/* The segments of a pipelined message announced by h, from world rank
 * src, into (buf, count, dt). Whatever fails here, every segment is taken:
 * the sender's call must end. */
int rk_stg_recv_segments(void *buf, int count, MPI_Datatype dt, int dev, const hdr_t *h, int src,
                         MPI_Comm comm, size_t *copied)
{
    if (h->seg == SEG_IPC)
        return rk_stg_recv_ipc(buf, count, dt, dev, h, src, comm, copied);
    rk_stg_layout_t L;
    size_t total = h->total, seg = h->seg;
    int nseg = (int)((total + seg - 1) / seg);
    int rc = rk_stg_layout(dt, 0, count, &L);
    if (rc != MPI_SUCCESS) {
        rk_stg_drain(src, h->id, total, seg, 0);
        return rc;
    }
    MPI_Comm wc = rk_stg_comm();
    if (total > L.size) {
        /* Truncated: take and drop the segments, then say so. */
        rk_stg_drain(src, h->id, total, seg, 0);
        return MPI_ERR_TRUNCATE;
    }
    if (L.contig && !dev) {
        /* Host memory: straight into place. */
        MPI_Request *rq = malloc((size_t)nseg * sizeof *rq);
        if (!rq) {
            rk_stg_drain(src, h->id, total, seg, 0);
            return MPI_ERR_NO_MEM;
        }
        for (int k = 0; k < nseg; k++)
            PMPI_Irecv((char *)buf + (size_t)k * seg, (int)rk_stg_seg_len(total, seg, k), MPI_BYTE,
                       src, h->id, wc, &rq[k]);
        rc = wait_segs(nseg, rq, total, seg);
        free(rq);
        return rc;
    }
    if (!L.contig) {
        rk_stg_buf_t pk;
        MPI_Request *rq = NULL;
        if (rk_stg_buf_get(total, 1, &pk) != 0 || !(rq = malloc((size_t)nseg * sizeof *rq))) {
            if (pk.kind)
                rk_stg_buf_put(&pk);
            rk_stg_drain(src, h->id, total, seg, 0);
            return MPI_ERR_NO_MEM;
        }
        for (int k = 0; k < nseg; k++)
            PMPI_Irecv(pk.ptr + (size_t)k * seg, (int)rk_stg_seg_len(total, seg, k), MPI_BYTE, src,
                       h->id, wc, &rq[k]);
        rc = wait_segs(nseg, rq, total, seg);
        free(rq);
        if (rc == MPI_SUCCESS)
            rc = rk_stg_deliver(buf, count, dt, dev, pk.ptr, total, comm, copied);
        rk_stg_buf_put(&pk);
        return rc;
    }
    /* Device, contiguous: a ring of segments, the host-to-device copy of
     * segment k overlapping the receive of segment k+1.. */
    int depth = nseg < RK_STG_DEPTH ? nseg : RK_STG_DEPTH;
    rk_stg_buf_t ring;
    if (rk_stg_buf_get((size_t)depth * seg, 1, &ring) != 0) {
        rk_stg_drain(src, h->id, total, seg, 0);
        return MPI_ERR_NO_MEM;
    }
    MPI_Request rq[RK_STG_DEPTH];
    void *ev[RK_STG_DEPTH] = {0};
    for (int i = 0; i < RK_STG_DEPTH; i++)
        rq[i] = MPI_REQUEST_NULL;
    for (int k = 0; k < depth; k++)
        PMPI_Irecv(ring.ptr + (size_t)k * seg, (int)rk_stg_seg_len(total, seg, k), MPI_BYTE, src,
                   h->id, wc, &rq[k]);
    /* bad: a copy failed or a segment came short; the rest are still
     * received (into the ring, not copied on). */
    int bad = 0;
    for (int k = 0; k < nseg && rc == MPI_SUCCESS; k++) {
        int s = k % depth;
        MPI_Status st;
        rc = rk_stg_wait(&rq[s], &st);
        if (rc != MPI_SUCCESS)
            break;
        size_t n = rk_stg_seg_len(total, seg, k);
        if (!bad)
            bad = rk_stg_seg_short(&st, n);
        if (!bad)
            bad = rk_stg_copy((char *)buf + (size_t)k * seg, ring.ptr + (size_t)s * seg, n,
                              RK_STG_H2D, &ev[s]);
        int p = k - 1, next = p + depth;
        if (p >= 0) {
            int ps = p % depth;
            if (ev[ps] && rk_stg_event_wait(ev[ps]) != 0)
                bad = 1;
            rk_stg_event_put(ev[ps]);
            ev[ps] = NULL;
            if (next < nseg)
                PMPI_Irecv(ring.ptr + (size_t)ps * seg, (int)rk_stg_seg_len(total, seg, next),
                           MPI_BYTE, src, h->id, wc, &rq[ps]);
        }
    }
    *copied += total;
    for (int i = 0; i < RK_STG_DEPTH; i++) {
        if (ev[i] && rk_stg_event_wait(ev[i]) != 0)
            bad = 1;
        rk_stg_event_put(ev[i]);
    }
    if (rc != MPI_SUCCESS) {
        /* MPI failed: nothing of ours may still write into the ring. */
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
