/* Staging, point to point: the request engine. The table of staged
 * nonblocking requests, the lists of those with work left (plist, alist,
 * ilist), advancing them (rk_stg_progress), and the Wait/Test family.
 * staging/p2p.c's first comment tells how a message travels.
 *
 * Staged nonblocking requests: the user gets a generalized request
 * (MPI_Grequest_start) as handle, which stays allocated until the user
 * completes it, so its value cannot be reused by MPI for another request
 * while the table maps it; the MPI requests underneath are ours to test
 * and free. Such a request is advanced by any Wait/Test call and, while
 * its first message has not arrived, by every staged call (rk_stg_progress):
 * the sender of a header waits for us to post the segments' receives. */
#define _GNU_SOURCE
#include "p2p.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
int rk_stg_wait_all(int n, MPI_Request *reqs)
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

int rk_stg_pending_now(void)
{
    return atomic_load_explicit(&rk_stg_pending, memory_order_relaxed) != 0;
}

/* ---- the request table ---- */

#define NBUCKETS 256
pthread_mutex_t rk_stg_eng = PTHREAD_MUTEX_INITIALIZER;
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

/* Under rk_stg_eng. */
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
    pthread_mutex_lock(&rk_stg_eng);
    req_t *r = lookup_locked(h);
    pthread_mutex_unlock(&rk_stg_eng);
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

static req_t *alist, *alist_tail; /* under rk_stg_eng, oldest first */

void rk_stg_alist_add(req_t *r)
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

void rk_stg_alist_del(req_t *r)
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

static int advance_locked(req_t *r);

/* Nonblocking IPC receives between their header and their answer: the
 * sender waits for the answer, so they advance wherever rings do (counted
 * in rk_stg_rings, so that MPI's progress engine calls us); and IPC sends
 * until done, since the answer may ask them for the data. Under rk_stg_eng. */
static req_t *ilist;

void rk_stg_ilist_add(req_t *r)
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
    if (!rk_stg_hooked)
        rk_stg_helper_kick();
}

void rk_stg_ilist_del(req_t *r)
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
 * Under rk_stg_eng. */
static void alist_advance(void)
{
    if (rk_stg_deferred_now())
        rk_stg_sends_post_locked(0);
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
    if (inside || pthread_mutex_trylock(&rk_stg_eng) != 0)
        return 0;
    inside = 1;
    alist_advance();
    inside = 0;
    pthread_mutex_unlock(&rk_stg_eng);
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

req_t *rk_stg_req_new(int kind, void *ubuf, int count, MPI_Datatype dt, MPI_Comm comm)
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
int rk_stg_req_publish(req_t *r, MPI_Request *user)
{
    int rc = PMPI_Grequest_start(gq_query, gq_free, gq_cancel, NULL, &r->user);
    if (rc != MPI_SUCCESS)
        return rc;
    r->key = req_key(r->user);
    pthread_mutex_lock(&rk_stg_eng);
    size_t b = bucket_of(r->key);
    r->hnext = buckets[b];
    buckets[b] = r;
    if (r->kind == K_RECV && r->state == S_FIRST)
        plist_add(r);
    pthread_mutex_unlock(&rk_stg_eng);
    atomic_fetch_add(&rk_stg_nreq, 1);
    *user = r->user;
    return MPI_SUCCESS;
}

int rk_stg_wrap(MPI_Request inner, MPI_Comm comm, rk_stg_done_fn done, void *arg,
                MPI_Request *user)
{
    req_t *r = rk_stg_req_new(K_WRAP, NULL, 0, MPI_DATATYPE_NULL, comm);
    if (!r)
        return MPI_ERR_NO_MEM;
    r->first = inner;
    r->done = done;
    r->done_arg = arg;
    r->state = S_SEGS;
    int rc = rk_stg_req_publish(r, user);
    if (rc != MPI_SUCCESS)
        free(r);
    return rc;
}

void rk_stg_req_release(req_t *r)
{
    for (int i = 0; i < r->nevs; i++)
        rk_stg_event_put(r->evs ? r->evs[i] : NULL);
    free(r->evs);
    free(r->segs);
    free(r->idx);
    free(r->sts);
    if (!r->leak) {
        if (r->hb.kind)
            rk_stg_buf_put(&r->hb);
        if (r->pk.kind)
            rk_stg_buf_put(&r->pk);
    }
    free(r);
}

/* ---- receive side: after the first message ---- */

int rk_stg_alloc_segs(req_t *r, int nseg, int nevs)
{
    r->nseg = nseg;
    r->segs = malloc((size_t)nseg * sizeof *r->segs);
    r->idx = malloc((size_t)nseg * sizeof *r->idx);
    r->sts = malloc((size_t)nseg * sizeof *r->sts);
    r->evs = calloc((size_t)(nevs > 0 ? nevs : 1), sizeof *r->evs);
    r->nevs = nevs;
    if (!r->segs || !r->idx || !r->sts || !r->evs)
        return -1;
    for (int i = 0; i < nseg; i++)
        r->segs[i] = MPI_REQUEST_NULL;
    return 0;
}

/* The first 32 bytes a receive got, in the order they came (a receive
 * through a non-contiguous datatype scatters them). */
static int first_bytes(void *base, int count, MPI_Datatype dt, const rk_stg_layout_t *L,
                       MPI_Comm comm, hdr_t *h)
{
    if (L->contig)
        return rk_stg_is_header(base, h);
    int n = (int)((RK_STG_HDR_BYTES + L->tsize - 1) / L->tsize), psz = 0, pos = 0;
    if (n > count)
        n = count;
    if (PMPI_Pack_size(n, dt, comm, &psz) != MPI_SUCCESS || psz < RK_STG_HDR_BYTES)
        return 0;
    char *tmp = malloc((size_t)psz);
    int yes = 0;
    if (tmp && PMPI_Pack(base, n, dt, tmp, psz, &pos, comm) == MPI_SUCCESS &&
        pos >= RK_STG_HDR_BYTES)
        yes = rk_stg_is_header(tmp, h);
    free(tmp);
    return yes;
}

/* Elements of a receive that bytes of data fill (a last partial element
 * counts: its received bytes must reach the device). Contiguous: the bytes
 * themselves go back, as one run. */
ptrdiff_t rk_stg_elems_in(const rk_stg_layout_t *L, size_t bytes)
{
    if (!L->tsize)
        return 0;
    return (ptrdiff_t)((bytes + L->tsize - 1) / L->tsize);
}

/* The first message of a staged nonblocking receive has come (status *st).
 * Under rk_stg_eng. */
static void on_first(req_t *r, const MPI_Status *st)
{
    r->st = *st;
    int cancelled = 0;
    PMPI_Test_cancelled(st, &cancelled);
    if (cancelled) {
        r->state = S_DONE;
        return;
    }
    size_t bytes = rk_stg_status_bytes(st);
    char *img = r->dev ? r->hb.ptr - r->L.lo : (char *)r->ubuf; /* ubuf's equivalent */
    hdr_t h;
    if (bytes == RK_STG_HDR_BYTES && first_bytes(img, r->count, r->dt, &r->L, r->comm, &h)) {
        r->hdr = h;
        r->total = h.total;
        r->seg = h.seg;
        int src = rk_stg_to_world(r->comm, st->MPI_SOURCE);
        if (h.seg == SEG_IPC) {
            rk_stg_ipc_recv_start(r, src);
            return;
        }
        int nseg = (int)((h.total + h.seg - 1) / h.seg);
        char *dst;
        if (h.total > r->L.size || src < 0) {
            /* Truncated: take the segments into one scratch buffer and drop them. */
            r->err = src < 0 ? MPI_ERR_OTHER : MPI_ERR_TRUNCATE;
            if (rk_stg_alloc_segs(r, nseg, 0) != 0 || rk_stg_buf_get(h.seg, 0, &r->pk) != 0) {
                rk_stg_drain(src, h.id, h.total, h.seg, 0);
                r->nseg = 0;
                r->state = S_DONE;
                return;
            }
            for (int k = 0; k < nseg && src >= 0; k++)
                PMPI_Irecv(r->pk.ptr, (int)rk_stg_seg_len(h.total, h.seg, k), MPI_BYTE, src, h.id,
                           rk_stg_comm(), &r->segs[k]);
            r->total = 0;
            r->state = S_SEGS;
            return;
        }
        if (r->L.contig && r->dev && rk_stg_hooked) {
            /* Through the ring: the image is not needed any more. */
            rk_stg_buf_put(&r->hb);
            rk_stg_ring_init(r, src, h.total, h.seg);
            r->state = S_SEGS;
            rk_stg_alist_add(r);
            rk_stg_ring_advance(r);
            return;
        }
        if (r->L.contig) {
            dst = r->dev ? r->hb.ptr : (char *)r->ubuf;
            if (rk_stg_alloc_segs(r, nseg, r->dev ? nseg : 0) != 0)
                goto oom;
        } else {
            if (rk_stg_alloc_segs(r, nseg, 1) != 0 || rk_stg_buf_get(h.total, 0, &r->pk) != 0)
                goto oom;
            dst = r->pk.ptr;
        }
        for (int k = 0; k < nseg; k++)
            PMPI_Irecv(dst + (size_t)k * h.seg, (int)rk_stg_seg_len(h.total, h.seg, k), MPI_BYTE,
                       src, h.id, rk_stg_comm(), &r->segs[k]);
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
    if (!r->evs || rk_stg_put_elems(r->ubuf, r->hb.ptr - r->L.lo, r->dt, 0,
                                    rk_stg_elems_in(&r->L, bytes), &r->L, &r->evs[0], &r->copied))
        r->err = MPI_ERR_OTHER;
    r->state = S_COPY;
    return;
oom:
    /* The sender waits for every segment: take them, drop them. */
    rk_mpi_warn("staging: out of memory for a receive of %zu bytes", (size_t)h.total);
    rk_stg_drain(rk_stg_to_world(r->comm, st->MPI_SOURCE), h.id, h.total, h.seg, 0);
    r->nseg = 0;
    r->err = MPI_ERR_NO_MEM;
    r->state = S_DONE;
}

/* Advance r as far as it goes now; 1 when done. Under rk_stg_eng. */
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
    if (r->state == S_DEFER) {
        /* In order: the older deferred sends go first. */
        rk_stg_sends_post_locked(0);
        if (r->state == S_DEFER)
            return 0;
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
                        rk_stg_ring_send_cancel(r);
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
                if (rk_stg_ring_advance(r) && r->first == MPI_REQUEST_NULL)
                    r->state = S_DONE;
            } else if (r->first == MPI_REQUEST_NULL) {
                flag = 1;
                if (r->nseg)
                    PMPI_Testall(r->nseg, r->segs, &flag, MPI_STATUSES_IGNORE);
                if (flag && r->ipc && r->ack == ACK_SEND_DATA && !r->leak)
                    flag = rk_stg_ipc_send_data(r);
                if (flag)
                    r->state = S_DONE;
            }
        } else {
            rk_stg_advance_segs(r);
        }
    }
    if (r->state >= S_IPC && r->state <= S_IPC_DATA)
        rk_stg_ipc_recv_advance(r);
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
        rk_stg_ilist_del(r); /* an IPC send (ipc_send_post) */
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
            rk_stg_status_set_bytes(status, r->total);
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
    pthread_mutex_lock(&rk_stg_eng);
    size_t b = bucket_of(r->key);
    for (req_t **pp = &buckets[b]; *pp; pp = &(*pp)->hnext)
        if (*pp == r) {
            *pp = r->hnext;
            break;
        }
    plist_del(r);
    if (r->detached)
        ndetached--;
    pthread_mutex_unlock(&rk_stg_eng);
    atomic_fetch_sub(&rk_stg_nreq, 1);
    fill_status(r, status);
    int err = r->err;
    if (r->user != MPI_REQUEST_NULL) {
        PMPI_Grequest_complete(r->user);
        PMPI_Wait(&r->user, MPI_STATUS_IGNORE);
    }
    rk_stg_count(r->copied, rk_stg_now() - r->t0);
    MPI_Comm comm = r->comm;
    rk_stg_req_release(r);
    if (err != MPI_SUCCESS) {
        /* As MPI would at completion: the communicator's handler. */
        rk_mpi_verbose("staging: a staged request ended with error class %d", err);
        PMPI_Comm_call_errhandler(comm, err);
    }
    return err;
}

int rk_stg_advance(req_t *r)
{
    pthread_mutex_lock(&rk_stg_eng);
    int d = advance_locked(r);
    pthread_mutex_unlock(&rk_stg_eng);
    return d;
}

void rk_stg_progress(void)
{
    if (!rk_stg_pending_now() && !ndetached &&
        !atomic_load_explicit(&rk_stg_rings, memory_order_relaxed))
        return;
    /* One thread at a time; the others have their own loops to return to. */
    if (pthread_mutex_trylock(&rk_stg_eng) != 0)
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
    pthread_mutex_unlock(&rk_stg_eng);
    for (int i = 0; i < nd; i++)
        finish(done[i], MPI_STATUS_IGNORE);
}

/* ---- completion ----
 * The bodies of MPI_Wait ... MPI_Testsome, MPI_Request_get_status,
 * MPI_Request_free and MPI_Cancel; staging/persist.c exports the calls,
 * putting a persistent request's active operation in its place first. */

/* Straight to MPI when nothing is staged; polling while receives wait. */
#define NO_STAGED()                                                                                \
    (RK_STG_LIKELY(!rk_stg_active) || atomic_load_explicit(&rk_stg_nreq, memory_order_relaxed) == 0)

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
        if (RK_STG_LIKELY(!rk_stg_active) || !rk_stg_pending_now())
            return PMPI_Wait(req, status);
        return rk_stg_wait(req, status);
    }
    req_t *r = lookup(*req);
    if (!r)
        return rk_stg_pending_now() ? rk_stg_wait(req, status) : PMPI_Wait(req, status);
    unsigned spins = 0;
    while (!rk_stg_advance(r))
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
    if (!rk_stg_advance(r)) {
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
    *flag = rk_stg_advance(r);
    if (*flag)
        fill_status(r, status);
    return MPI_SUCCESS;
}

int rk_stg_Request_free(MPI_Request *req)
{
    req_t *r = NO_STAGED() ? NULL : lookup(*req);
    if (!r)
        return PMPI_Request_free(req);
    pthread_mutex_lock(&rk_stg_eng);
    int done = advance_locked(r);
    if (!done) {
        r->detached = 1;
        ndetached++;
    }
    pthread_mutex_unlock(&rk_stg_eng);
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
    pthread_mutex_lock(&rk_stg_eng);
    /* Only the first message can be cancelled: a receive whose message has
     * not come, a send whose header (or message) nobody took yet, or a
     * deferred send not handed to MPI yet. */
    if (r->state == S_DEFER)
        rk_stg_defer_cancel_locked(r);
    else if (r->first != MPI_REQUEST_NULL)
        PMPI_Cancel(&r->first);
    pthread_mutex_unlock(&rk_stg_eng);
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
    pthread_mutex_lock(&rk_stg_eng);
    for (int i = 0; i < n; i++) {
        a->r[i] = lookup_locked(reqs[i]);
        a->sub[i] = a->r[i] ? MPI_REQUEST_NULL : reqs[i];
        a->nst += a->r[i] != NULL;
    }
    pthread_mutex_unlock(&rk_stg_eng);
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
        if (RK_STG_LIKELY(!rk_stg_active) || !rk_stg_pending_now())
            return PMPI_Waitall(n, reqs, sts);
        return poll_waitall(n, reqs, sts);
    }
    arr_t a;
    if (arr_init(&a, n, reqs) != 0)
        return PMPI_Waitall(n, reqs, sts);
    if (a.nst == 0) {
        arr_free(&a);
        return rk_stg_pending_now() ? poll_waitall(n, reqs, sts) : PMPI_Waitall(n, reqs, sts);
    }
    unsigned spins = 0;
    int subdone = 0, rc = MPI_SUCCESS, left;
    MPI_Status *subst = arr_subst(&a, sts);
    for (;;) {
        left = 0;
        for (int i = 0; i < n; i++)
            if (a.r[i] && !rk_stg_advance(a.r[i]))
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
        if (a.r[i] && !rk_stg_advance(a.r[i]))
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
        if (a->r[i] && rk_stg_advance(a->r[i])) {
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
    if (NO_STAGED() && (RK_STG_LIKELY(!rk_stg_active) || !rk_stg_pending_now()))
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
        if (rk_stg_advance(a->r[i])) {
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
    if (NO_STAGED() && (RK_STG_LIKELY(!rk_stg_active) || !rk_stg_pending_now()))
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
        rk_mpi_verbose("staging: %ld nonblocking messages went through the ring, %ld were "
                       "handed to MPI once their copy ended (deferred)",
                       rk_stg_ring_msgs, rk_stg_deferred_msgs);
    rk_stg_sends_flush();
    /* Detached requests still running: finish what is done; the rest is
     * left to MPI_Finalize (their memory is not given back). */
    for (int round = 0; round < 1000 && ndetached; round++) {
        rk_stg_progress();
        sched_yield();
    }
}
