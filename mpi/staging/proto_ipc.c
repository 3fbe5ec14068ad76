/* Staging, point to point: CUDA IPC. A contiguous device message of at
 * least RK_STG_IPC_MIN bytes to a rank of the node is a 32-byte header, then
 * a descriptor of the sender's memory (staging/ipc_map.h); the receiver
 * copies the data itself and answers ACK_DONE, or ACK_SEND_DATA when it
 * cannot map the memory (then the bytes come as one staged message). */
#define _GNU_SOURCE
#include "p2p.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- CUDA IPC (staging/ipc_map.h): one copy by the receiver ---- */

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
            rc = rk_stg_deliver(buf, count, dt, dev, t.ptr, total, comm, copied);
        rk_stg_buf_put(&t);
    }
    rk_ipc_release(p);
    if (rc != MPI_SUCCESS)
        *err = rc;
    return ACK_DONE;
}

/* Nonblocking receive: the header said IPC; the descriptor comes next. */
void rk_stg_ipc_recv_start(req_t *r, int src)
{
    r->ipc = 1;
    r->peer = src;
    /* The host image of a device receive is not needed: data comes by a
     * copy from the peer's memory. */
    if (r->hb.kind)
        rk_stg_buf_put(&r->hb);
    if (src < 0 || rk_stg_alloc_segs(r, 2, 1) != 0) {
        r->err = src < 0 ? MPI_ERR_OTHER : MPI_ERR_NO_MEM;
        r->state = S_DONE;
        return;
    }
    PMPI_Irecv(&r->desc, (int)sizeof r->desc, MPI_BYTE, src, r->hdr.id, rk_stg_comm(),
               &r->segs[0]);
    r->state = S_IPC;
    rk_stg_ilist_add(r);
}

/* S_IPC: descriptor -> copy. S_IPC_ACK: copy done -> answer (and, after
 * ACK_SEND_DATA, the data's receive). S_IPC_DATA: both done -> S_DONE.
 * Under rk_stg_eng. */
void rk_stg_ipc_recv_advance(req_t *r)
{
    int flag = 0;
    if (r->state == S_IPC) {
        if (PMPI_Test(&r->segs[0], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            r->err = MPI_ERR_OTHER;
            r->state = S_DONE;
            rk_stg_ilist_del(r);
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
            int rc = rk_stg_deliver(r->ubuf, r->count, r->dt, r->dev, r->pk.ptr, r->total, r->comm,
                                    &r->copied);
            if (rc != MPI_SUCCESS)
                r->err = rc;
        }
        r->state = S_DONE;
        rk_stg_ilist_del(r);
    }
}

/* A sender told ACK_SEND_DATA: the receiver could not map our memory, so
 * the bytes go as one staged message on the plugin's communicator. 1 when
 * nothing is left to do (an error), 0 when the send is posted. Under rk_stg_eng. */
int rk_stg_ipc_send_data(req_t *r)
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

/* Post a device send of r->L.size contiguous bytes at buf to world rank
 * wdest through CUDA IPC: the header, the descriptor, and the receive of
 * the answer. 0 when IPC does not apply (the caller stages), 1 when posted
 * (*rcp: MPI's answer). */
int rk_stg_ipc_send_post(req_t *r, const void *buf, int dest, int wdest, int tag, int mode,
                         int *rcp)
{
    if (r->no_ipc || !rk_ipc_reaches(wdest) || rk_ipc_export(buf, r->L.size, &r->desc) != 0)
        return 0;
    r->ipc = 1;
    r->peer = wdest;
    r->ack = ACK_DONE;
    r->hdr = (hdr_t){MAGIC0, MAGIC1, r->L.size, SEG_IPC, rk_stg_next_id()};
    r->state = S_SEGS;
    if (rk_stg_alloc_segs(r, 2, 0) != 0) {
        *rcp = rk_stg_staging_error(r->comm, "out of memory for a send");
        return 1;
    }
    MPI_Comm wc = rk_stg_comm();
    int rc = PMPI_Irecv(&r->ack, 1, MPI_INT, wdest, r->hdr.id, rk_ipc_ack_comm(), &r->segs[1]);
    if (rc == MPI_SUCCESS)
        rc = PMPI_Isend(&r->desc, (int)sizeof r->desc, MPI_BYTE, wdest, r->hdr.id, wc,
                        &r->segs[0]);
    if (rc == MPI_SUCCESS)
        rc = rk_stg_isend_mode(&r->hdr, RK_STG_HDR_BYTES, MPI_BYTE, dest, tag, r->comm, mode,
                               &r->first);
    if (rc == MPI_SUCCESS) {
        /* The answer may ask for the data (the receiver could not map our
         * memory): the send must advance wherever rings do, not only when
         * its owner waits for it. Else two ranks each in a blocking
         * receive (MPI_Sendrecv in a ring, Isend then Recv) wait forever
         * for data their peers post only in their own wait. */
        pthread_mutex_lock(&rk_stg_eng);
        rk_stg_ilist_add(r);
        pthread_mutex_unlock(&rk_stg_eng);
    }
    *rcp = rc;
    return 1;
}

/* The data of an IPC message announced by h, from world rank src, into
 * (buf, count, dt): descriptor, copy, answer. */
int rk_stg_recv_ipc(void *buf, int count, MPI_Datatype dt, int dev, const hdr_t *h, int src,
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
            err = rk_stg_deliver(buf, count, dt, dev, t.ptr, h->total, comm, copied);
        rk_stg_buf_put(&t);
    }
    if (rc != MPI_SUCCESS)
        return rc;
    return err != MPI_SUCCESS ? err : mrc;
}
