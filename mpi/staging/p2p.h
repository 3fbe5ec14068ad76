/* rankmem MPI plugin, staging of point-to-point messages: what the request
 * engine (staging/request.c), the three protocols (staging/proto_eager.c,
 * staging/proto_pipe.c, staging/proto_ipc.c) and the MPI calls and the
 * choice between protocols (staging/p2p.c) share. Not installed; every
 * symbol hidden. staging/p2p.c's first comment tells how a message travels.
 */
#ifndef RANKMEM_MPI_STAGING_P2P_H
#define RANKMEM_MPI_STAGING_P2P_H

#include "staging.h"
#include "ipc_map.h"

#include <pthread.h>

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

/* ---- staged requests ---- */

enum { K_SEND = 1, K_RECV, K_WRAP };
enum { S_FIRST = 1, S_SEGS, S_COPY, S_DONE, S_IPC, S_IPC_ACK, S_IPC_DATA, S_DEFER };

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
    MPI_Status *sts; /* and its statuses (a short segment is an error) */
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
    /* A deferred send (S_DEFER, staging/proto_eager.c): where its message
     * goes once its copy out ends, and the next in the queue. */
    int dest, tag, mode;
    struct req *dnext;
    struct req *inext, *iprev; /* IPC receives with work left */
    struct {
        int seg;           /* segment in the slot, -1 when free */
        int state;         /* R_* */
        int empty;         /* its copy failed: it travels empty (rk_stg_seg_short) */
        void *ev;          /* its copy's event */
        MPI_Request rq;    /* its send or receive */
        rk_stg_buf_t b;    /* its pinned buffer */
    } slot[RK_STG_DEPTH];
} req_t;
enum { R_FREE = 0, R_COPY_IN, R_SEND, R_RECV, R_COPY_OUT };

/* Send modes. */
enum { M_STD = RK_STG_M_STD, M_SSEND = RK_STG_M_SSEND, M_RSEND = RK_STG_M_RSEND,
       M_BSEND = RK_STG_M_BSEND };

/* ---- the request engine (staging/request.c) ---- */

/* The engine's lock: the table, the lists, the stash (staging/p2p.c). */
RK_MPI_HIDDEN extern pthread_mutex_t rk_stg_eng;
RK_MPI_HIDDEN int rk_stg_wait_all(int n, MPI_Request *reqs);
RK_MPI_HIDDEN int rk_stg_pending_now(void);
RK_MPI_HIDDEN void rk_stg_alist_add(req_t *r);
RK_MPI_HIDDEN void rk_stg_alist_del(req_t *r);
RK_MPI_HIDDEN void rk_stg_ilist_add(req_t *r);
RK_MPI_HIDDEN void rk_stg_ilist_del(req_t *r);
RK_MPI_HIDDEN req_t *rk_stg_req_new(int kind, void *ubuf, int count, MPI_Datatype dt,
                                    MPI_Comm comm);
RK_MPI_HIDDEN int rk_stg_req_publish(req_t *r, MPI_Request *user);
RK_MPI_HIDDEN void rk_stg_req_release(req_t *r);
RK_MPI_HIDDEN int rk_stg_alloc_segs(req_t *r, int nseg, int nevs);
RK_MPI_HIDDEN ptrdiff_t rk_stg_elems_in(const rk_stg_layout_t *L, size_t bytes);
RK_MPI_HIDDEN int rk_stg_advance(req_t *r);

/* ---- the whole-message protocol (staging/proto_eager.c) ---- */

RK_MPI_HIDDEN int rk_stg_stage_in_all(req_t *r, const void *buf, int wait_ok);
RK_MPI_HIDDEN int rk_stg_deliver(void *buf, int count, MPI_Datatype dt, int dev, const void *tmp,
                                 size_t bytes, MPI_Comm comm, size_t *copied);
/* A nonblocking whole-message send whose copy runs on while the program
 * goes on (S_DEFER): 1 when r took that path (*rc its result), 0 when it
 * cannot (then rk_stg_eager_post). */
RK_MPI_HIDDEN int rk_stg_eager_defer(req_t *r, const void *buf, int dest, int tag, int mode,
                                     int *rc);
/* Post the deferred sends whose copies ended, oldest first, stopping at the
 * first still copying (wait: wait for each). Under rk_stg_eng. */
RK_MPI_HIDDEN void rk_stg_sends_post_locked(int wait);
/* Take a deferred send out of the queue (MPI_Cancel before it was posted).
 * Under rk_stg_eng; 1 if it was there. */
RK_MPI_HIDDEN int rk_stg_defer_cancel_locked(req_t *r);
RK_MPI_HIDDEN int rk_stg_eager_post(req_t *r, const void *buf, int dest, int tag, int mode,
                                    int wait_ok);

/* ---- the pipelined protocol and the ring (staging/proto_pipe.c) ---- */

/* Messages that went through the ring (verbose). */
RK_MPI_HIDDEN extern long rk_stg_ring_msgs;
RK_MPI_HIDDEN extern long rk_stg_deferred_msgs;
RK_MPI_HIDDEN void rk_stg_ring_init(req_t *r, int peer, size_t total, size_t seg);
RK_MPI_HIDDEN void rk_stg_ring_send_cancel(req_t *r);
RK_MPI_HIDDEN int rk_stg_ring_advance(req_t *r);
RK_MPI_HIDDEN size_t rk_stg_seg_len(size_t total, size_t seg, int k);
/* A segment whose status holds other than want bytes: its sender could
 * not stage it (it travels empty). */
RK_MPI_HIDDEN int rk_stg_seg_short(const MPI_Status *st, size_t want);
/* Receive and drop segments from.. of message id from world rank src. */
RK_MPI_HIDDEN void rk_stg_drain(int src, int id, size_t total, size_t seg, int from);
RK_MPI_HIDDEN void rk_stg_advance_segs(req_t *r);
RK_MPI_HIDDEN int rk_stg_pipe_post(req_t *r, const void *buf, int dest, int wdest, int tag,
                                   int mode, int wait_ok);
RK_MPI_HIDDEN int rk_stg_send_ring(const void *buf, size_t total, int dest, int wdest, int tag,
                                   MPI_Comm comm, int mode);
RK_MPI_HIDDEN int rk_stg_recv_segments(void *buf, int count, MPI_Datatype dt, int dev,
                                       const hdr_t *h, int src, MPI_Comm comm, size_t *copied);

/* ---- CUDA IPC point to point (staging/proto_ipc.c) ---- */

RK_MPI_HIDDEN void rk_stg_ipc_recv_start(req_t *r, int src);
RK_MPI_HIDDEN void rk_stg_ipc_recv_advance(req_t *r);
RK_MPI_HIDDEN int rk_stg_ipc_send_data(req_t *r);
RK_MPI_HIDDEN int rk_stg_ipc_send_post(req_t *r, const void *buf, int dest, int wdest, int tag,
                                       int mode, int *rcp);
RK_MPI_HIDDEN int rk_stg_recv_ipc(void *buf, int count, MPI_Datatype dt, int dev, const hdr_t *h,
                                  int src, MPI_Comm comm, size_t *copied);

/* ---- helpers of the calls (staging/p2p.c) ---- */

RK_MPI_HIDDEN int rk_stg_is_header(const void *p, hdr_t *h);
RK_MPI_HIDDEN int rk_stg_to_world(MPI_Comm comm, int r);
RK_MPI_HIDDEN size_t rk_stg_status_bytes(const MPI_Status *st);
RK_MPI_HIDDEN void rk_stg_status_set_bytes(MPI_Status *st, size_t bytes);
RK_MPI_HIDDEN int rk_stg_staging_error(MPI_Comm comm, const char *what);
RK_MPI_HIDDEN int rk_stg_isend_mode(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                                    MPI_Comm comm, int mode, MPI_Request *req);

#endif
