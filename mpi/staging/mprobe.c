/* Staging, matched probes: MPI_Mprobe, MPI_Improbe, MPI_Mrecv, MPI_Imrecv.
 *
 * A staged peer's pipelined or IPC message starts with a 32-byte header
 * (docs/staging.md); a probe can only tell it from 32 bytes of data by
 * receiving it. So a matched probe that finds a 32-byte message receives
 * it into an entry of the probe stash (staging/p2p.c) and hands the
 * application a message handle of its own (own_message). The status
 * carries the whole message's size, as MPI_Probe's does. MPI_Mrecv /
 * MPI_Imrecv of such a handle receive the entry (the header's segments or
 * IPC copy, or the 32 bytes) into the buffer. Other messages stay MPI's: received into pinned memory
 * when the buffer is device memory, and only the bytes the datatype
 * describes copied back. A matched probe also looks first at the messages
 * MPI_Probe stashed (they came before anything MPI still holds from their
 * source). */
#include "staging.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT RK_MPI_EXPORT

/* What a matched probe of ours handed out, by message handle: the
 * communicator (for errors, and the request of MPI_Imrecv), the size, and
 * the stash entry when the message is ours. */
typedef struct mrec {
    struct mrec *next;
    uint64_t key;
    MPI_Comm comm;
    size_t bytes;
    rk_stg_stash_t *e;
} mrec_t;

#define NB 64
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static mrec_t *tab[NB];
static atomic_long nrec;

static uint64_t key_of(MPI_Message m)
{
    uint64_t k = 0;
    memcpy(&k, &m, sizeof m < sizeof k ? sizeof m : sizeof k);
    return k;
}

static size_t slot_of(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 58); }

/* Remember m. Without memory nothing is remembered: an ordinary message is
 * then received with the world's error handler and its full capacity. */
static int rec_add(MPI_Message m, MPI_Comm comm, size_t bytes, rk_stg_stash_t *e)
{
    mrec_t *r = malloc(sizeof *r);
    if (!r)
        return -1;
    r->key = key_of(m);
    r->comm = comm;
    r->bytes = bytes;
    r->e = e;
    pthread_mutex_lock(&lock);
    size_t s = slot_of(r->key);
    r->next = tab[s];
    tab[s] = r;
    pthread_mutex_unlock(&lock);
    atomic_fetch_add(&nrec, 1);
    return 0;
}

/* The record of m, taken out of the table (the caller frees it), or NULL. */
static mrec_t *rec_take(MPI_Message m)
{
    if (atomic_load_explicit(&nrec, memory_order_relaxed) == 0)
        return NULL;
    uint64_t k = key_of(m);
    mrec_t *r = NULL;
    pthread_mutex_lock(&lock);
    for (mrec_t **pp = &tab[slot_of(k)]; *pp; pp = &(*pp)->next)
        if ((*pp)->key == k) {
            r = *pp;
            *pp = r->next;
            break;
        }
    pthread_mutex_unlock(&lock);
    if (r)
        atomic_fetch_sub(&nrec, 1);
    return r;
}

static size_t status_bytes(const MPI_Status *st)
{
    MPI_Count n = 0;
    if (PMPI_Get_elements_x(st, MPI_BYTE, &n) != MPI_SUCCESS || n < 0)
        return 0;
    return (size_t)n;
}

static int fail(MPI_Comm comm, int err, const char *what)
{
    rk_mpi_warn("staging: %s", what);
    PMPI_Comm_call_errhandler(comm, err);
    return err;
}

#if defined(MPICH_NUMVERSION)
/* A message handle of ours, unique while it lives. MPICH's handles are
 * ints whose bits 31..30 say what they are: 00 names no object (and is
 * refused by MPICH if it gets one), and only its null handles have it, all
 * with bits 29..26 set; 1 to 2^24 - 1 is none of them. (A zero-byte message
 * to this rank, as below, would be a real handle, but MPICH over UCX fails
 * an assertion receiving a matched message a rank sent itself.) */
_Static_assert(sizeof(MPI_Message) == sizeof(int), "MPICH's MPI_Message is an int");
static atomic_uint own_next;

static int own_message(MPI_Message *m)
{
    unsigned v = atomic_fetch_add(&own_next, 1) % 0xffffffu + 1u;
    *m = (MPI_Message)v;
    return MPI_SUCCESS;
}

static void own_message_free(MPI_Message *m) { *m = MPI_MESSAGE_NULL; }
#else
/* A message handle of ours: a zero-byte message this rank sent itself on
 * a duplicate of MPI_COMM_SELF, matched. MPI keeps it until it is received
 * (its value is no other message's meanwhile), and a plain MPI_Mrecv would
 * harmlessly take it. The send is eager (no data) and left to MPI. */
static MPI_Comm selfc = MPI_COMM_NULL;

static int own_message(MPI_Message *m)
{
    static pthread_mutex_t once = PTHREAD_MUTEX_INITIALIZER;
    static char none;
    pthread_mutex_lock(&once);
    if (selfc == MPI_COMM_NULL && PMPI_Comm_dup(MPI_COMM_SELF, &selfc) == MPI_SUCCESS)
        PMPI_Comm_set_errhandler(selfc, MPI_ERRORS_RETURN);
    pthread_mutex_unlock(&once);
    if (selfc == MPI_COMM_NULL)
        return MPI_ERR_OTHER;
    MPI_Request r;
    int rc = PMPI_Isend(&none, 0, MPI_BYTE, 0, 0, selfc, &r);
    if (rc != MPI_SUCCESS)
        return rc;
    PMPI_Request_free(&r);
    return PMPI_Mprobe(0, 0, selfc, m, MPI_STATUS_IGNORE);
}

/* Receive (and so free) a handle of ours. */
static void own_message_free(MPI_Message *m)
{
    static char none;
    PMPI_Mrecv(&none, 0, MPI_BYTE, m, MPI_STATUS_IGNORE);
}
#endif

/* Hand the application the stash entry e (comm's) as a message. */
static int give_entry(rk_stg_stash_t *e, MPI_Comm comm, MPI_Message *msg, MPI_Status *status)
{
    MPI_Message m = MPI_MESSAGE_NULL;
    MPI_Status st;
    rk_stg_stash_status(e, &st);
    if (own_message(&m) != MPI_SUCCESS || rec_add(m, comm, status_bytes(&st), e) != 0) {
        /* The entry cannot be handed out: its message is lost. */
        if (m != MPI_MESSAGE_NULL)
            own_message_free(&m);
        rk_stg_stash_recv(e, NULL, 0, MPI_BYTE, 0, MPI_STATUS_IGNORE, 0);
        return fail(comm, MPI_ERR_NO_MEM, "cannot make a message handle in a matched probe");
    }
    *msg = m;
    if (status != MPI_STATUS_IGNORE)
        *status = st;
    return MPI_SUCCESS;
}

/* MPI matched m (status *st): take a 32-byte one into an entry of ours,
 * remember any other. */
static int give(MPI_Comm comm, MPI_Message *m, MPI_Status *st, MPI_Message *msg,
                MPI_Status *status)
{
    size_t bytes = status_bytes(st);
    if (bytes == RK_STG_HDR_BYTES) {
        rk_stg_stash_t *e = rk_stg_stash_mrecv(comm, m);
        if (!e)
            return fail(comm, MPI_ERR_NO_MEM, "out of memory in a matched probe");
        return give_entry(e, comm, msg, status);
    }
    rec_add(*m, comm, bytes, NULL);
    *msg = *m;
    if (status != MPI_STATUS_IGNORE)
        *status = *st;
    return MPI_SUCCESS;
}

EXPORT int MPI_Improbe(int src, int tag, MPI_Comm comm, int *flag, MPI_Message *msg,
                       MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active) || src == MPI_PROC_NULL)
        return PMPI_Improbe(src, tag, comm, flag, msg, status);
    rk_stg_progress();
    rk_stg_stash_t *e = rk_stg_stash_any() ? rk_stg_stash_take(comm, src, tag) : NULL;
    if (e) {
        *flag = 1;
        return give_entry(e, comm, msg, status);
    }
    MPI_Message m;
    MPI_Status st;
    int rc = PMPI_Improbe(src, tag, comm, flag, &m, &st);
    if (rc != MPI_SUCCESS || !*flag)
        return rc;
    return give(comm, &m, &st, msg, status);
}

EXPORT int MPI_Mprobe(int src, int tag, MPI_Comm comm, MPI_Message *msg, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active) || src == MPI_PROC_NULL)
        return PMPI_Mprobe(src, tag, comm, msg, status);
    unsigned spins = 0;
    for (;;) {
        rk_stg_stash_t *e = rk_stg_stash_any() ? rk_stg_stash_take(comm, src, tag) : NULL;
        if (e)
            return give_entry(e, comm, msg, status);
        MPI_Message m;
        MPI_Status st;
        int flag = 0, rc;
        /* Staged receives waiting for their first message: poll, so that
         * they post what arrives (a peer may wait for it). */
        if (atomic_load_explicit(&rk_stg_pending, memory_order_relaxed) == 0) {
            rc = PMPI_Mprobe(src, tag, comm, &m, &st);
            flag = 1;
        } else {
            rc = PMPI_Improbe(src, tag, comm, &flag, &m, &st);
        }
        if (rc != MPI_SUCCESS)
            return rc;
        if (flag)
            return give(comm, &m, &st, msg, status);
        rk_stg_idle(&spins);
    }
}

/* Elements of a receive that bytes fill (a partial last one counts). */
static ptrdiff_t elems_in(const rk_stg_layout_t *L, size_t bytes)
{
    return L->tsize ? (ptrdiff_t)((bytes + L->tsize - 1) / L->tsize) : 0;
}

/* Host memory for an ordinary message of bytes (SIZE_MAX: unknown) into
 * (count, dt) of layout L: room for what came when contiguous (MPI reports
 * truncation itself), else the whole region (only the described bytes go
 * back). */
static size_t room_for(const rk_stg_layout_t *L, size_t bytes)
{
    if (!L->contig)
        return L->span;
    return bytes < L->size ? bytes : L->size;
}

/* An ordinary message into a device buffer, blocking. */
static int mrecv_dev(void *buf, int count, MPI_Datatype dt, MPI_Message *msg, MPI_Status *status,
                     MPI_Comm comm, size_t bytes)
{
    static char none;
    uint64_t t0 = rk_stg_now();
    rk_stg_layout_t L;
    int rc = rk_stg_layout(dt, 0, count, &L);
    if (rc != MPI_SUCCESS)
        return fail(comm, rc, "a matched receive's datatype");
    size_t room = room_for(&L, bytes);
    if (room == 0) /* nothing can land: MPI tells an empty message from a truncation */
        return PMPI_Mrecv(&none, 0, MPI_BYTE, msg, status);
    rk_stg_buf_t hb;
    if (rk_stg_buf_get(room, 1, &hb) != 0)
        return fail(comm, MPI_ERR_NO_MEM, "out of memory for a matched receive");
    char *img = hb.ptr - L.lo;
    MPI_Status st;
    size_t copied = 0;
    rc = PMPI_Mrecv(img, count, dt, msg, &st);
    int mine = MPI_SUCCESS;
    if (rc == MPI_SUCCESS &&
        rk_stg_put_elems_sync(buf, img, dt, 0, elems_in(&L, status_bytes(&st)), &L, &copied) != 0)
        mine = MPI_ERR_OTHER;
    rk_stg_buf_put(&hb);
    rk_stg_count(copied, rk_stg_now() - t0);
    if (status != MPI_STATUS_IGNORE) {
        *status = st;
        if (mine != MPI_SUCCESS)
            status->MPI_ERROR = mine;
    }
    if (mine != MPI_SUCCESS)
        return fail(comm, mine, "host-to-device copy of a matched receive failed");
    return rc;
}

EXPORT int MPI_Mrecv(void *buf, int count, MPI_Datatype dt, MPI_Message *msg, MPI_Status *status)
{
    if (RK_STG_LIKELY(!rk_stg_active) || *msg == MPI_MESSAGE_NO_PROC ||
        *msg == MPI_MESSAGE_NULL)
        return PMPI_Mrecv(buf, count, dt, msg, status);
    mrec_t *r = rec_take(*msg);
    int dev = rk_stg_is_device_dt(buf, count, dt);
    if (r && r->e) {
        rk_stg_stash_t *e = r->e;
        free(r);
        own_message_free(msg);
        return rk_stg_stash_recv(e, buf, count, dt, dev, status, 1);
    }
    MPI_Comm comm = r ? r->comm : MPI_COMM_WORLD;
    size_t bytes = r ? r->bytes : SIZE_MAX;
    free(r);
    if (!dev)
        return PMPI_Mrecv(buf, count, dt, msg, status);
    return mrecv_dev(buf, count, dt, msg, status, comm, bytes);
}

/* MPI_Imrecv of an entry of ours: received at once (as MPI_Irecv of a
 * message a probe took); the request completes with this status. */
typedef struct {
    MPI_Status st;
    int err;
} done_t;

static int done_saved(void *arg, MPI_Status *st)
{
    done_t *d = arg;
    int err = d->err;
    *st = d->st;
    free(d);
    return err;
}

/* MPI_Imrecv of an ordinary message into a device buffer: MPI receives
 * into host memory; at completion the described bytes go back. */
typedef struct {
    void *buf;
    int count;
    MPI_Datatype dt;
    rk_stg_layout_t L;
    rk_stg_buf_t hb;
    uint64_t t0;
} imr_t;

static int imr_done(void *arg, MPI_Status *st)
{
    imr_t *a = arg;
    int cancelled = 0, rc = MPI_SUCCESS;
    size_t copied = 0;
    PMPI_Test_cancelled(st, &cancelled);
    if (!cancelled &&
        rk_stg_put_elems_sync(a->buf, a->hb.ptr - a->L.lo, a->dt, 0,
                              elems_in(&a->L, status_bytes(st)), &a->L, &copied) != 0)
        rc = MPI_ERR_OTHER;
    rk_stg_buf_put(&a->hb);
    rk_stg_count(copied, rk_stg_now() - a->t0);
    free(a);
    return rc;
}

EXPORT int MPI_Imrecv(void *buf, int count, MPI_Datatype dt, MPI_Message *msg,
                      MPI_Request *req)
{
    static char none;
    if (RK_STG_LIKELY(!rk_stg_active) || *msg == MPI_MESSAGE_NO_PROC ||
        *msg == MPI_MESSAGE_NULL)
        return PMPI_Imrecv(buf, count, dt, msg, req);
    mrec_t *r = rec_take(*msg);
    int dev = rk_stg_is_device_dt(buf, count, dt);
    MPI_Comm comm = r ? r->comm : MPI_COMM_WORLD;
    size_t bytes = r ? r->bytes : SIZE_MAX;
    MPI_Request inner = MPI_REQUEST_NULL;
    int rc;
    if (r && r->e) {
        rk_stg_stash_t *e = r->e;
        free(r);
        done_t *d = malloc(sizeof *d);
        if (!d) {
            own_message_free(msg);
            rk_stg_stash_recv(e, NULL, 0, MPI_BYTE, 0, MPI_STATUS_IGNORE, 0);
            return fail(comm, MPI_ERR_NO_MEM, "out of memory in MPI_Imrecv: a message was lost");
        }
        /* Errors are the request's, told at its completion. */
        d->err = rk_stg_stash_recv(e, buf, count, dt, dev, &d->st, 0);
        own_message_free(msg);
        /* A request that is complete at once, for the status above. */
        rc = PMPI_Irecv(&none, 0, MPI_BYTE, MPI_PROC_NULL, 0, MPI_COMM_SELF, &inner);
        if (rc == MPI_SUCCESS)
            rc = rk_stg_wrap(inner, comm, done_saved, d, req);
        if (rc != MPI_SUCCESS) {
            if (inner != MPI_REQUEST_NULL)
                PMPI_Wait(&inner, MPI_STATUS_IGNORE);
            free(d);
            return fail(comm, rc, "cannot make the request of MPI_Imrecv");
        }
        return MPI_SUCCESS;
    }
    free(r);
    if (!dev)
        return PMPI_Imrecv(buf, count, dt, msg, req);
    imr_t *a = calloc(1, sizeof *a);
    if (!a)
        return fail(comm, MPI_ERR_NO_MEM, "out of memory in MPI_Imrecv");
    a->t0 = rk_stg_now();
    a->buf = buf;
    a->count = count;
    a->dt = dt;
    rc = rk_stg_layout(dt, 0, count, &a->L);
    if (rc != MPI_SUCCESS) {
        free(a);
        return fail(comm, rc, "a matched receive's datatype");
    }
    size_t room = room_for(&a->L, bytes);
    if (room == 0) {
        free(a);
        return PMPI_Imrecv(&none, 0, MPI_BYTE, msg, req);
    }
    if (rk_stg_buf_get(room, 0, &a->hb) != 0) {
        free(a);
        return fail(comm, MPI_ERR_NO_MEM, "out of memory for a matched receive");
    }
    rc = PMPI_Imrecv(a->hb.ptr - a->L.lo, count, dt, msg, &inner);
    if (rc == MPI_SUCCESS)
        rc = rk_stg_wrap(inner, comm, imr_done, a, req);
    if (rc != MPI_SUCCESS) {
        if (inner != MPI_REQUEST_NULL)
            PMPI_Wait(&inner, MPI_STATUS_IGNORE);
        rk_stg_buf_put(&a->hb);
        free(a);
        return fail(comm, rc, "cannot make the request of MPI_Imrecv");
    }
    return MPI_SUCCESS;
}
