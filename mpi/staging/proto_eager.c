/* Staging, point to point: the whole-message protocol. A host message, or a
 * device message of at most RK_STG_BIG bytes or of a non-contiguous
 * datatype, is one ordinary MPI message on the user's communicator and tag;
 * device data goes through pinned memory (staging/p2p.c has the small
 * blocking paths, which need no request). */
#define _GNU_SOURCE
#include "p2p.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copy the device data of (buf, count, dt) into host memory (r->hb).
 * 0 or -1. */
int rk_stg_stage_in_all(req_t *r, const void *buf, int wait_ok)
{
    if (rk_stg_buf_get(r->L.span, wait_ok, &r->hb) != 0)
        return -1;
    if (r->L.span && rk_stg_copy_sync(r->hb.ptr, (const char *)buf + r->L.lo, r->L.span,
                                      RK_STG_D2H) != 0)
        return -1;
    r->copied += r->L.span;
    return 0;
}

/* Data of an ordinary message the receive took into tmp (bytes, in the
 * sender's order) delivered to (buf, count, dt). */
int rk_stg_deliver(void *buf, int count, MPI_Datatype dt, int dev, const void *tmp, size_t bytes,
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
    if (rc == MPI_SUCCESS && rk_stg_put_elems_sync(buf, hb.ptr - L.lo, dt, 0,
                                                   rk_stg_elems_in(&L, bytes), &L, copied) != 0)
        rc = MPI_ERR_OTHER;
    rk_stg_buf_put(&hb);
    return rc;
}

/* A whole-message send (send_post's choice when neither CUDA IPC nor the
 * pipeline applies): the device data staged into r->hb, then one ordinary
 * message of the user's datatype. */
int rk_stg_eager_post(req_t *r, const void *buf, int dest, int tag, int mode, int wait_ok)
{
    int rc;
    if (rk_stg_stage_in_all(r, buf, wait_ok) != 0)
        return rk_stg_staging_error(r->comm, "cannot stage a send");
    rc = rk_stg_isend_mode(r->hb.ptr - r->L.lo, r->count, r->dt, dest, tag, r->comm, mode,
                           &r->first);
    r->nseg = 0;
    r->state = S_SEGS;
    return rc;
}

/* ---- deferred sends ----
 * A nonblocking whole-message send from device memory does not wait for its
 * copy out (ring mode only: MPI's progress engine calls us, so nothing can
 * stall waiting for it). The copy is queued on the device-to-host stream
 * with an event after it, the request joins the queue dq, and MPI_Isend
 * returns; the message goes to MPI once its copy ended: in MPI's progress
 * engine, in any staged call, in Wait/Test. A window of small sends thus
 * costs one queued copy each and the copies overlap, where a copy and a
 * synchronisation each made them one after another.
 * MPI's order between two ranks holds: the queue hands messages to MPI in
 * the order of the sends and stops at the first still copying, and every
 * other send (host, blocking, a header) first drains the queue
 * (rk_stg_sends_flush). */

atomic_long rk_stg_ndeferred;
long rk_stg_deferred_msgs; /* sends that took this path (verbose); under rk_stg_eng */
static req_t *dq, *dq_tail; /* under rk_stg_eng, oldest first */

int rk_stg_eager_defer(req_t *r, const void *buf, int dest, int tag, int mode, int *rc)
{
    if (!rk_stg_hooked || mode == M_BSEND || r->L.span == 0)
        return 0;
    if (rk_stg_buf_get(r->L.span, 0, &r->hb) != 0)
        return 0; /* the plain path says it */
    r->evs = calloc(1, sizeof *r->evs);
    if (!r->evs) {
        rk_stg_buf_put(&r->hb);
        return 0;
    }
    r->nevs = 1;
    if (rk_stg_copy(r->hb.ptr, (const char *)buf + r->L.lo, r->L.span, RK_STG_D2H, &r->evs[0]) !=
        0) {
        *rc = rk_stg_staging_error(r->comm, "cannot stage a send");
        return 1;
    }
    r->copied += r->L.span;
    r->dest = dest;
    r->tag = tag;
    r->mode = mode;
    r->nseg = 0;
    r->state = S_DEFER;
    r->dnext = NULL;
    pthread_mutex_lock(&rk_stg_eng);
    if (dq_tail)
        dq_tail->dnext = r;
    else
        dq = r;
    dq_tail = r;
    rk_stg_deferred_msgs++;
    atomic_fetch_add(&rk_stg_ndeferred, 1);
    atomic_fetch_add(&rk_stg_rings, 1); /* MPI's progress engine calls us */
    pthread_mutex_unlock(&rk_stg_eng);
    *rc = MPI_SUCCESS;
    return 1;
}

static void dq_unlink(req_t *r, req_t *prev)
{
    if (prev)
        prev->dnext = r->dnext;
    else
        dq = r->dnext;
    if (dq_tail == r)
        dq_tail = prev;
    r->dnext = NULL;
    atomic_fetch_sub(&rk_stg_ndeferred, 1);
    atomic_fetch_sub(&rk_stg_rings, 1);
}

void rk_stg_sends_post_locked(int wait)
{
    while (dq) {
        req_t *r = dq;
        int t = wait ? (rk_stg_event_wait(r->evs[0]) == 0 ? 1 : -1) : rk_stg_event_test(r->evs[0]);
        if (t == 0)
            return; /* the later ones wait behind it */
        dq_unlink(r, NULL);
        int rc = t < 0 ? MPI_ERR_OTHER
                       : rk_stg_isend_mode(r->hb.ptr - r->L.lo, r->count, r->dt, r->dest, r->tag,
                                           r->comm, r->mode, &r->first);
        if (rc != MPI_SUCCESS) {
            /* Nothing went out: the request ends with the error. */
            r->err = rc;
            r->state = S_DONE;
            continue;
        }
        r->state = S_SEGS;
    }
}

void rk_stg_sends_flush(void)
{
    if (!rk_stg_deferred_now())
        return;
    pthread_mutex_lock(&rk_stg_eng);
    rk_stg_sends_post_locked(1);
    pthread_mutex_unlock(&rk_stg_eng);
}

int rk_stg_defer_cancel_locked(req_t *r)
{
    req_t *prev = NULL;
    for (req_t *q = dq; q; prev = q, q = q->dnext)
        if (q == r) {
            dq_unlink(r, prev);
            /* Its copy still writes into r->hb: let it end before the buffer goes. */
            rk_stg_event_wait(r->evs[0]);
            PMPI_Status_set_cancelled(&r->st, 1);
            r->state = S_DONE;
            return 1;
        }
    return 0;
}
