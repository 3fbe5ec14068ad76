/* Staging, persistent point-to-point requests (MPI_Send_init and its
 * modes, MPI_Recv_init, MPI_Start, MPI_Startall), persistent collectives
 * (made by staging/coll.c, started here), and the exported completion
 * calls, which see through them.
 *
 * A persistent request MPI must not see the buffer of (a device buffer,
 * or a host receive large enough to meet a header while staging is active)
 * is ours: the application's handle is a real inactive persistent request
 * of MPI's, a receive from MPI_PROC_NULL, which MPI keeps allocated (so its
 * value is never another request's while our table maps it) and which
 * does nothing if something starts it. MPI_Start issues the staged
 * nonblocking operation, as MPI_Isend/MPI_Irecv would (staging/p2p.c), and
 * keeps its request (inner) until a completion call finishes it; the
 * application's handle stays as it is, inactive again. Every completion
 * call puts inner (or MPI_REQUEST_NULL, for an inactive request: MPI treats
 * both alike) in place of the handle before staging/request.c's completion
 * runs, and the handle back after. */
#include "staging.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT RK_MPI_EXPORT

enum { P_SEND = 1, P_RECV, P_FN };

typedef struct pers {
    struct pers *next;
    uint64_t key;
    MPI_Request user;  /* the handle the application holds */
    MPI_Request inner; /* the operation MPI_Start began; MPI_REQUEST_NULL when inactive */
    int kind, mode, active;
    void *buf;
    int count, peer, tag;
    MPI_Datatype dt;
    MPI_Comm comm;
    rk_stg_pstart_fn start; /* P_FN: what MPI_Start does; arg freed with the request */
    void *arg;
} pers_t;

#define NB 64
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pers_t *tab[NB];
static atomic_long npers; /* entries: 0 keeps every call on its fast path */

static int live(void) { return atomic_load_explicit(&npers, memory_order_relaxed) != 0; }

static uint64_t key_of(MPI_Request r)
{
    uint64_t k = 0;
    memcpy(&k, &r, sizeof r < sizeof k ? sizeof r : sizeof k);
    return k;
}

static size_t slot_of(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 58); }

/* Under lock. */
static pers_t *find_locked(MPI_Request h)
{
    if (h == MPI_REQUEST_NULL)
        return NULL;
    uint64_t k = key_of(h);
    for (pers_t *p = tab[slot_of(k)]; p; p = p->next)
        if (p->key == k)
            return p;
    return NULL;
}

static pers_t *find(MPI_Request h)
{
    if (!live())
        return NULL;
    pthread_mutex_lock(&lock);
    pers_t *p = find_locked(h);
    pthread_mutex_unlock(&lock);
    return p;
}

static void drop(pers_t *p)
{
    pthread_mutex_lock(&lock);
    for (pers_t **pp = &tab[slot_of(p->key)]; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    pthread_mutex_unlock(&lock);
    atomic_fetch_sub(&npers, 1);
    free(p->arg);
    free(p);
}

/* MPI's empty status: what a completion call reports for an inactive request. */
static void empty_status(MPI_Status *st)
{
    if (st == MPI_STATUS_IGNORE)
        return;
    st->MPI_SOURCE = MPI_ANY_SOURCE;
    st->MPI_TAG = MPI_ANY_TAG;
    st->MPI_ERROR = MPI_SUCCESS;
    PMPI_Status_set_elements(st, MPI_BYTE, 0);
    PMPI_Status_set_cancelled(st, 0);
}

/* ---- creation ---- */

/* A new entry from tmpl (every field but key and user) and its handle. */
static int pers_add(const pers_t *tmpl, MPI_Request *req)
{
    static char dummy;
    pers_t *p = malloc(sizeof *p);
    if (!p) {
        rk_mpi_warn("staging: out of memory for a persistent request");
        PMPI_Comm_call_errhandler(tmpl->comm, MPI_ERR_NO_MEM);
        return MPI_ERR_NO_MEM;
    }
    *p = *tmpl;
    int rc = PMPI_Recv_init(&dummy, 0, MPI_BYTE, MPI_PROC_NULL, 0, p->comm, &p->user);
    if (rc != MPI_SUCCESS) {
        free(p);
        return rc;
    }
    p->key = key_of(p->user);
    p->inner = MPI_REQUEST_NULL;
    pthread_mutex_lock(&lock);
    size_t s = slot_of(p->key);
    p->next = tab[s];
    tab[s] = p;
    pthread_mutex_unlock(&lock);
    atomic_fetch_add(&npers, 1);
    *req = p->user;
    return MPI_SUCCESS;
}

/* A persistent send or receive of ours. The arguments are checked first by
 * MPI itself, on a zero-count request of the same kind made and freed at
 * once, so that a bad rank, tag, datatype or communicator is reported here
 * as MPI would. */
static int pers_new(int kind, int mode, const void *buf, int count, MPI_Datatype dt, int peer,
                    int tag, MPI_Comm comm, MPI_Request *req)
{
    MPI_Request chk = MPI_REQUEST_NULL;
    int rc = kind == P_SEND ? PMPI_Send_init(buf, 0, dt, peer, tag, comm, &chk)
                            : PMPI_Recv_init((void *)buf, 0, dt, peer, tag, comm, &chk);
    if (rc != MPI_SUCCESS)
        return rc;
    PMPI_Request_free(&chk);
    pers_t t = {.kind = kind, .mode = mode, .buf = (void *)buf, .count = count, .dt = dt,
                .peer = peer, .tag = tag, .comm = comm};
    return pers_add(&t, req);
}

int rk_stg_pers_fn(rk_stg_pstart_fn start, void *arg, MPI_Comm comm, MPI_Request *req)
{
    pers_t t = {.kind = P_FN, .comm = comm, .start = start, .arg = arg};
    int rc = pers_add(&t, req);
    if (rc != MPI_SUCCESS)
        free(arg);
    return rc;
}

/* A send whose buffer is device memory is ours; MPI_PROC_NULL never moves
 * data. */
static int send_init(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                     MPI_Comm comm, MPI_Request *req, int mode)
{
    if (RK_STG_LIKELY(!rk_stg_active) || dest == MPI_PROC_NULL ||
        !rk_stg_is_device_dt(buf, count, dt)) {
        switch (mode) {
        case RK_STG_M_SSEND:
            return PMPI_Ssend_init(buf, count, dt, dest, tag, comm, req);
        case RK_STG_M_RSEND:
            return PMPI_Rsend_init(buf, count, dt, dest, tag, comm, req);
        case RK_STG_M_BSEND:
            return PMPI_Bsend_init(buf, count, dt, dest, tag, comm, req);
        default:
            return PMPI_Send_init(buf, count, dt, dest, tag, comm, req);
        }
    }
    return pers_new(P_SEND, mode, buf, count, dt, dest, tag, comm, req);
}

EXPORT int MPI_Send_init(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                         MPI_Comm comm, MPI_Request *req)
{
    return send_init(buf, count, dt, dest, tag, comm, req, RK_STG_M_STD);
}

EXPORT int MPI_Ssend_init(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                          MPI_Comm comm, MPI_Request *req)
{
    return send_init(buf, count, dt, dest, tag, comm, req, RK_STG_M_SSEND);
}

EXPORT int MPI_Rsend_init(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                          MPI_Comm comm, MPI_Request *req)
{
    return send_init(buf, count, dt, dest, tag, comm, req, RK_STG_M_RSEND);
}

EXPORT int MPI_Bsend_init(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                          MPI_Comm comm, MPI_Request *req)
{
    return send_init(buf, count, dt, dest, tag, comm, req, RK_STG_M_BSEND);
}

/* A receive into device memory, or into host memory large enough that a
 * header may come, is ours. (A smaller host receive stays MPI's; unlike
 * MPI_Irecv it does not look at the messages MPI_Probe took.) */
EXPORT int MPI_Recv_init(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,
                         MPI_Request *req)
{
    if (RK_STG_LIKELY(!rk_stg_active) || src == MPI_PROC_NULL ||
        (!rk_stg_is_device_dt(buf, count, dt) && !rk_stg_big_recv(count, dt)))
        return PMPI_Recv_init(buf, count, dt, src, tag, comm, req);
    return pers_new(P_RECV, 0, buf, count, dt, src, tag, comm, req);
}

/* ---- start ---- */

static int pers_start(pers_t *p)
{
    if (p->active) {
        /* Erroneous in MPI: the operation in flight stays. */
        rk_mpi_warn("staging: MPI_Start on an active persistent request");
        PMPI_Comm_call_errhandler(p->comm, MPI_ERR_REQUEST);
        return MPI_ERR_REQUEST;
    }
    MPI_Request in = MPI_REQUEST_NULL;
    int rc = p->kind == P_FN     ? p->start(p->arg, &in)
             : p->kind == P_SEND ? rk_stg_isend_any(p->buf, p->count, p->dt, p->peer, p->tag,
                                                    p->comm, &in, p->mode)
                                 : rk_stg_irecv(p->buf, p->count, p->dt, p->peer, p->tag,
                                                p->comm, &in);
    if (rc != MPI_SUCCESS)
        return rc;
    p->inner = in;
    p->active = 1;
    return MPI_SUCCESS;
}

EXPORT int MPI_Start(MPI_Request *req)
{
    pers_t *p = find(*req);
    if (p)
        return pers_start(p);
    rk_stg_sends_flush(); /* MPI's own persistent send: after the deferred ones */
    return PMPI_Start(req);
}

EXPORT int MPI_Startall(int n, MPI_Request reqs[])
{
    rk_stg_sends_flush();
    if (!live())
        return PMPI_Startall(n, reqs);
    /* One at a time, in order: ours staged, MPI's started by MPI. */
    for (int i = 0; i < n; i++) {
        pers_t *p = find(reqs[i]);
        if (!p)
            rk_stg_sends_flush(); /* what the staged ones before it deferred */
        int rc = p ? pers_start(p) : PMPI_Start(&reqs[i]);
        if (rc != MPI_SUCCESS)
            return rc;
    }
    return MPI_SUCCESS;
}

/* ---- completion ---- */

/* inner has been through a completion call: finished when MPI_REQUEST_NULL. */
static void settle(pers_t *p)
{
    if (p->inner == MPI_REQUEST_NULL)
        p->active = 0;
}

EXPORT int MPI_Wait(MPI_Request *req, MPI_Status *status)
{
    pers_t *p = find(*req);
    if (RK_STG_LIKELY(!p))
        return rk_stg_Wait(req, status);
    if (!p->active) {
        empty_status(status);
        return MPI_SUCCESS;
    }
    int rc = rk_stg_Wait(&p->inner, status);
    settle(p);
    return rc;
}

EXPORT int MPI_Test(MPI_Request *req, int *flag, MPI_Status *status)
{
    pers_t *p = find(*req);
    if (RK_STG_LIKELY(!p))
        return rk_stg_Test(req, flag, status);
    if (!p->active) {
        *flag = 1;
        empty_status(status);
        return MPI_SUCCESS;
    }
    int rc = rk_stg_Test(&p->inner, flag, status);
    settle(p);
    return rc;
}

EXPORT int MPI_Request_get_status(MPI_Request req, int *flag, MPI_Status *status)
{
    pers_t *p = find(req);
    if (RK_STG_LIKELY(!p))
        return rk_stg_Request_get_status(req, flag, status);
    if (!p->active) {
        *flag = 1;
        empty_status(status);
        return MPI_SUCCESS;
    }
    return rk_stg_Request_get_status(p->inner, flag, status);
}

EXPORT int MPI_Request_free(MPI_Request *req)
{
    pers_t *p = find(*req);
    if (RK_STG_LIKELY(!p))
        return rk_stg_Request_free(req);
    /* An active operation goes on to its end without its handle, as MPI's
     * own would. */
    int rc = MPI_SUCCESS;
    if (p->active && p->inner != MPI_REQUEST_NULL)
        rc = rk_stg_Request_free(&p->inner);
    MPI_Request user = p->user;
    drop(p);
    int rc2 = PMPI_Request_free(&user);
    *req = MPI_REQUEST_NULL;
    return rc != MPI_SUCCESS ? rc : rc2;
}

EXPORT int MPI_Cancel(MPI_Request *req)
{
    pers_t *p = find(*req);
    if (RK_STG_LIKELY(!p))
        return rk_stg_Cancel(req);
    /* Nothing to cancel in an inactive request. */
    return p->active && p->inner != MPI_REQUEST_NULL ? rk_stg_Cancel(&p->inner) : MPI_SUCCESS;
}

/* Arrays: a copy where each persistent request of ours is its active
 * operation (MPI_REQUEST_NULL when inactive), handed to staging/request.c's
 * call; then the handles go back in place. */
typedef struct {
    int n;
    pers_t **p;
    MPI_Request *sub;
    pers_t *p_small[16];
    MPI_Request sub_small[16];
} sub_t;

/* 1 when reqs holds a request of ours (then a->sub is the array to use),
 * 0 when not (nothing to undo), -1 without memory. */
static int sub_init(sub_t *a, int n, MPI_Request *reqs)
{
    if (!live() || n <= 0)
        return 0;
    a->n = n;
    if (n <= 16) {
        a->p = a->p_small;
        a->sub = a->sub_small;
    } else {
        a->p = malloc((size_t)n * sizeof *a->p);
        a->sub = malloc((size_t)n * sizeof *a->sub);
        if (!a->p || !a->sub) {
            free(a->p), free(a->sub);
            return -1;
        }
    }
    int ours = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < n; i++) {
        pers_t *p = a->p[i] = find_locked(reqs[i]);
        a->sub[i] = !p ? reqs[i] : p->active ? p->inner : MPI_REQUEST_NULL;
        ours += p != NULL;
    }
    pthread_mutex_unlock(&lock);
    if (!ours && a->p != a->p_small) {
        free(a->p);
        free(a->sub);
    }
    return ours != 0;
}

static void sub_done(sub_t *a, MPI_Request *reqs)
{
    for (int i = 0; i < a->n; i++) {
        pers_t *p = a->p[i];
        if (!p) {
            reqs[i] = a->sub[i];
        } else if (p->active) {
            p->inner = a->sub[i];
            settle(p);
        }
    }
    if (a->p != a->p_small) {
        free(a->p);
        free(a->sub);
    }
}

/* The array's communicator is unknown: out of memory goes to the world's. */
static int no_mem(void)
{
    rk_mpi_warn("staging: out of memory in a completion call");
    PMPI_Comm_call_errhandler(MPI_COMM_WORLD, MPI_ERR_NO_MEM);
    return MPI_ERR_NO_MEM;
}

EXPORT int MPI_Waitall(int n, MPI_Request reqs[], MPI_Status sts[])
{
    sub_t a;
    int k = sub_init(&a, n, reqs);
    if (RK_STG_LIKELY(k == 0))
        return rk_stg_Waitall(n, reqs, sts);
    if (k < 0)
        return no_mem();
    int rc = rk_stg_Waitall(n, a.sub, sts);
    sub_done(&a, reqs);
    return rc;
}

EXPORT int MPI_Testall(int n, MPI_Request reqs[], int *flag, MPI_Status sts[])
{
    sub_t a;
    int k = sub_init(&a, n, reqs);
    if (RK_STG_LIKELY(k == 0))
        return rk_stg_Testall(n, reqs, flag, sts);
    if (k < 0)
        return no_mem();
    int rc = rk_stg_Testall(n, a.sub, flag, sts);
    sub_done(&a, reqs);
    return rc;
}

EXPORT int MPI_Waitany(int n, MPI_Request reqs[], int *index, MPI_Status *status)
{
    sub_t a;
    int k = sub_init(&a, n, reqs);
    if (RK_STG_LIKELY(k == 0))
        return rk_stg_Waitany(n, reqs, index, status);
    if (k < 0)
        return no_mem();
    int rc = rk_stg_Waitany(n, a.sub, index, status);
    sub_done(&a, reqs);
    return rc;
}

EXPORT int MPI_Testany(int n, MPI_Request reqs[], int *index, int *flag, MPI_Status *status)
{
    sub_t a;
    int k = sub_init(&a, n, reqs);
    if (RK_STG_LIKELY(k == 0))
        return rk_stg_Testany(n, reqs, index, flag, status);
    if (k < 0)
        return no_mem();
    int rc = rk_stg_Testany(n, a.sub, index, flag, status);
    sub_done(&a, reqs);
    return rc;
}

EXPORT int MPI_Waitsome(int n, MPI_Request reqs[], int *outcount, int indices[],
                        MPI_Status sts[])
{
    sub_t a;
    int k = sub_init(&a, n, reqs);
    if (RK_STG_LIKELY(k == 0))
        return rk_stg_Waitsome(n, reqs, outcount, indices, sts);
    if (k < 0)
        return no_mem();
    int rc = rk_stg_Waitsome(n, a.sub, outcount, indices, sts);
    sub_done(&a, reqs);
    return rc;
}

EXPORT int MPI_Testsome(int n, MPI_Request reqs[], int *outcount, int indices[],
                        MPI_Status sts[])
{
    sub_t a;
    int k = sub_init(&a, n, reqs);
    if (RK_STG_LIKELY(k == 0))
        return rk_stg_Testsome(n, reqs, outcount, indices, sts);
    if (k < 0)
        return no_mem();
    int rc = rk_stg_Testsome(n, a.sub, outcount, indices, sts);
    sub_done(&a, reqs);
    return rc;
}
