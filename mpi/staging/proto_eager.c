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
