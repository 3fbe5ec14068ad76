/* rankmem MPI plugin: staging of device buffers through pinned host memory
 * for an MPI that is not CUDA-aware (issue 6). What staging/base.c,
 * staging/p2p.c and staging/coll.c share; not installed, every symbol hidden.
 *
 *   staging/base.c       the decision at init, options, device/host detection and
 *                   its cache, the copy engine (CUDA runtime or the test
 *                   backend), the pinned chunk pool, counters
 *   staging/p2p.c   point-to-point calls and the choice of a protocol
 *   staging/request.c  the request table, progress, Wait/Test
 *   staging/proto_eager.c, proto_pipe.c, proto_ipc.c  the protocols
 *   staging/coll.c  collectives
 *
 * docs/staging.md describes the protocol; the comments here say why. */
#ifndef RANKMEM_MPI_STAGING_INTERNAL_H
#define RANKMEM_MPI_STAGING_INTERNAL_H

#include "../plugin.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* MPICH annotates its array arguments with their sizes, and GCC then takes
 * MPI_STATUSES_IGNORE for an array of no element ("accessing 20 bytes in a
 * region of size 0"): a false alarm on every Testall/Testsome we make. */
#if defined(__GNUC__) && !defined(__clang__) && defined(MPICH_NUMVERSION)
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#endif

#define RK_STG_LIKELY(x) __builtin_expect(!!(x), 1)
#define RK_STG_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* A device message of more than RK_STG_BIG bytes (contiguous datatype) goes
 * as a 32-byte header on the user's communicator and tag followed by
 * segments on the plugin's own communicator (pipelined); smaller ones, and
 * every host message, go as one ordinary message. A constant, the same on
 * every rank whatever the chunk size, because the receiver decides from it
 * which host receives may meet a header. */
#define RK_STG_BIG ((size_t)256 << 10)
/* A contiguous device message of at least RK_STG_IPC_MIN bytes to a rank of
 * the node goes through CUDA IPC when the node has it (staging/ipc_map.h): a
 * header, then the receiver copies. Below it, a message and its two copies
 * cost less than the header, descriptor and answer. */
#define RK_STG_IPC_MIN ((size_t)64 << 10)
/* Host receives of at least this many bytes may meet a header: more than
 * RK_STG_BIG, or RK_STG_IPC_MIN when some rank of the job uses CUDA IPC.
 * Written once, in MPI_Init (the same on every rank). */
RK_MPI_HIDDEN extern size_t rk_stg_hdr_min;
#define RK_STG_HDR_BYTES 32
/* Segments in flight per blocking pipelined call (each one pinned slot). */
#define RK_STG_DEPTH 4

/* ---- state read on the fast path (written once, in MPI_Init) ---- */

/* Wrappers do anything at all: this rank stages, or some rank does (then
 * large host receives must recognise headers). 0: straight to PMPI. */
RK_MPI_HIDDEN extern int rk_stg_active;
/* This rank stages its own device buffers. */
RK_MPI_HIDDEN extern int rk_stg_on;
/* Staged receives whose first message has not been seen yet: another rank
 * may be waiting for us to post the receives of its segments, so blocking
 * calls poll (and advance them) instead of blocking inside MPI. */
RK_MPI_HIDDEN extern atomic_long rk_stg_pending;
/* Live staged requests (user handles in the table). */
RK_MPI_HIDDEN extern atomic_long rk_stg_nreq;
/* Ring requests with work left (staging/request.c), and whether MPI's progress
 * engine calls rk_stg_ring_poll (then nonblocking device messages use the
 * ring: they advance inside any MPI call, ours or not). */
RK_MPI_HIDDEN extern atomic_long rk_stg_rings;
RK_MPI_HIDDEN extern int rk_stg_hooked;
/* Nonblocking device sends whose copy out is still running, not yet handed
 * to MPI (staging/proto_eager.c). Any other send must wait for them first
 * (rk_stg_sends_flush), or it would overtake them. */
RK_MPI_HIDDEN extern atomic_long rk_stg_ndeferred;
RK_MPI_HIDDEN void rk_stg_sends_flush(void);
static inline int rk_stg_deferred_now(void)
{
    return atomic_load_explicit(&rk_stg_ndeferred, memory_order_relaxed) != 0;
}
RK_MPI_HIDDEN int rk_stg_ring_poll(void);
/* Without a progress hook (MPICH): wake, or start, the helper thread that
 * advances requests waiting for their peer (staging/base.c); a no-op where
 * MPI is not MPI_THREAD_MULTIPLE or has a hook. */
RK_MPI_HIDDEN void rk_stg_helper_kick(void);
RK_MPI_HIDDEN extern int rk_stg_helper_allowed; /* that helper may run */

/* ---- device or host (staging/base.c) ---- */

/* The cache: 2 MiB granules of address space, each cached as host or
 * device, in a table of atomic words read without a lock. */
#define RK_STG_GRANULE_SHIFT 21
#define RK_STG_TABLE_BITS 14
#define RK_STG_KIND_HOST 1u
#define RK_STG_KIND_DEVICE 2u
RK_MPI_HIDDEN extern _Atomic uint64_t rk_stg_table[1u << RK_STG_TABLE_BITS];
RK_MPI_HIDDEN extern _Atomic uint64_t rk_stg_gen; /* 16 bits used */

/* The driver's cuPointerGetAttributes (opened at init when this rank
 * stages, CUDA builds): its result, or -1 when there is none. */
RK_MPI_HIDDEN int rk_stg_cu_pointer_attrs(unsigned n, int *attrs, void **data, const void *p);

/* Ask (driver or test backend) and cache. 1 device, 0 host. */
RK_MPI_HIDDEN int rk_stg_classify_slow(const void *p);

static inline size_t rk_stg_slot(uint64_t key)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - RK_STG_TABLE_BITS)) & ~(size_t)1;
}

/* Entry: key (address >> 21) in bits 63..22, generation in 21..6, kind in
 * 1..0. Two ways per set. */
static inline uint64_t rk_stg_entry(uint64_t key, uint64_t gen, unsigned kind)
{
    return (key << 22) | ((gen & 0xffffu) << 6) | kind;
}

/* Memory that is host memory for sure (staging/base.c): the brk heap, from its
 * start to the current break, and the calling thread's stack (its bounds
 * learnt at its first slow lookup). Off (empty ranges) in the test backend. */
RK_MPI_HIDDEN extern uintptr_t rk_stg_brk_lo;
RK_MPI_HIDDEN extern __thread uintptr_t rk_stg_st_lo __attribute__((tls_model("initial-exec")));
RK_MPI_HIDDEN extern __thread uintptr_t rk_stg_st_hi __attribute__((tls_model("initial-exec")));
#if defined(__GLIBC__)
extern void *__curbrk; /* glibc's current break: what sbrk(0) returns, without the call */
#define RK_STG_BREAK() ((uintptr_t)__curbrk)
#else
void *sbrk(intptr_t increment); /* <unistd.h>, whose F_* names the tests use */
#define RK_STG_BREAK() ((uintptr_t)sbrk(0))
#endif

static inline int rk_stg_known_host(uintptr_t a)
{
    return (a >= rk_stg_brk_lo && a < RK_STG_BREAK()) || (a >= rk_stg_st_lo && a < rk_stg_st_hi);
}

/* Is p a device buffer this rank must stage? A few nanoseconds on a hit. */
static inline int rk_stg_is_device(const void *p)
{
    if (!rk_stg_on || rk_stg_known_host((uintptr_t)p))
        return 0;
    uint64_t key = (uint64_t)(uintptr_t)p >> RK_STG_GRANULE_SHIFT;
    size_t i = rk_stg_slot(key);
    uint64_t g = atomic_load_explicit(&rk_stg_gen, memory_order_relaxed);
    uint64_t want = rk_stg_entry(key, g, 0);
    uint64_t e = atomic_load_explicit(&rk_stg_table[i], memory_order_relaxed);
    if ((e & ~(uint64_t)3) == want)
        return (e & 3) == RK_STG_KIND_DEVICE;
    e = atomic_load_explicit(&rk_stg_table[i + 1], memory_order_relaxed);
    if ((e & ~(uint64_t)3) == want)
        return (e & 3) == RK_STG_KIND_DEVICE;
    return rk_stg_classify_slow(p);
}

/* The same for (buf, count, dt): a buffer given as MPI_BOTTOM (NULL) holds
 * absolute addresses in its datatype, and its data starts at the true lower
 * bound (staging/dtype.c asks MPI); any other buffer is asked as it is. */
RK_MPI_HIDDEN int rk_stg_is_device_bottom(int count, MPI_Datatype dt);
static inline int rk_stg_is_device_dt(const void *buf, int count, MPI_Datatype dt)
{
    if (RK_STG_LIKELY(buf != NULL))
        return rk_stg_is_device(buf);
    return rk_stg_on && rk_stg_is_device_bottom(count, dt);
}

/* ---- copies (staging/base.c): CUDA runtime, or memcpy in the test backend ---- */

#define RK_STG_D2H 0
#define RK_STG_H2D 1
#define RK_STG_D2D 2 /* a peer's memory mapped through CUDA IPC to ours */

/* Queue a copy of n bytes on the direction's stream and, when ev_p is not
 * NULL, an event after it (*ev_p). 0, or -1 (message printed). */
RK_MPI_HIDDEN int rk_stg_copy(void *dst, const void *src, size_t n, int dir, void **ev_p);
/* 1 when the event's work is done, 0 not yet, -1 error. */
RK_MPI_HIDDEN int rk_stg_event_test(void *ev);
/* Wait for it (the host blocks: only ever for a local copy). 0 or -1. */
RK_MPI_HIDDEN int rk_stg_event_wait(void *ev);
/* Give an event back (NULL is fine). */
RK_MPI_HIDDEN void rk_stg_event_put(void *ev);
/* Copy and wait. 0 or -1. */
RK_MPI_HIDDEN int rk_stg_copy_sync(void *dst, const void *src, size_t n, int dir);
/* A strided copy: height rows of width bytes, pitch bytes apart on both
 * sides (one 2D copy on the GPU), queued like rk_stg_copy. 0 or -1. */
RK_MPI_HIDDEN int rk_stg_copy2d(void *dst, const void *src, size_t pitch, size_t width,
                                size_t height, int dir, void **ev_p);
/* Another rank of this node uses this rank's GPU (set at init by
 * staging/ipc_map.c). Then small host-to-device copies avoid the path on which
 * the GPU switches between the two processes' contexts (staging/base.c). */
RK_MPI_HIDDEN extern int rk_stg_shared_gpu;

/* ---- host memory for staging (staging/base.c) ---- */

#define RK_STG_BUF_NONE 0
#define RK_STG_BUF_POOL 1  /* a run of chunks of the pinned pool */
#define RK_STG_BUF_CACHE 2 /* a cached pinned buffer (larger than the pool) */
#define RK_STG_BUF_HEAP 3  /* pageable fallback (pool busy, or no pinned memory) */
#define RK_STG_BUF_MINI 4  /* a 64 KiB slice of a pool chunk (small messages) */

typedef struct rk_stg_buf {
    char *ptr;
    size_t bytes;
    int kind;
    int first, nchunks; /* POOL; MINI: first is the chunk */
    int slot;           /* CACHE; MINI: the slice */
} rk_stg_buf_t;

/* Host memory of at least bytes (> 0). wait_ok: a blocking call, which may
 * wait a while for chunks other threads hold (advancing staged requests
 * meanwhile); nonblocking calls never wait. Never fails unless malloc does
 * (then -1). */
RK_MPI_HIDDEN int rk_stg_buf_get(size_t bytes, int wait_ok, rk_stg_buf_t *b);
RK_MPI_HIDDEN void rk_stg_buf_put(rk_stg_buf_t *b);
/* Staging buffers held now (pool chunks, cached buffers, pageable ones):
 * 0 when no call is in flight (tests). */
RK_MPI_HIDDEN long rk_stg_buf_inuse(void);

/* Fault injection for tests: calls of a kind are numbered from 1 after
 * rk_stg_fault_set; call first fails, then every every-th after it (0:
 * only first). first 0 turns the kind off. PINNED: pinned memory cannot be
 * had (the staging falls back to pageable memory); HOST: no staging buffer
 * at all (rk_stg_buf_get fails); COPY: a copy to or from the device fails. */
#define RK_STG_FAULT_PINNED 0
#define RK_STG_FAULT_HOST 1
#define RK_STG_FAULT_COPY 2
#define RK_STG_FAULTS 3
RK_MPI_HIDDEN void rk_stg_fault_set(int what, unsigned first, unsigned every);
RK_MPI_HIDDEN unsigned rk_stg_fault_hits(int what);

/* The reserve (one chunk set aside at init) for need bytes, held until
 * rk_stg_reserve_give; NULL when need is larger or there is none. */
RK_MPI_HIDDEN char *rk_stg_reserve_take(size_t need);
RK_MPI_HIDDEN void rk_stg_reserve_give(void);

/* The chunk size (RANKMEM_STAGING_CHUNK). */
RK_MPI_HIDDEN size_t rk_stg_chunk(void);

/* ---- engine helpers ---- */

/* Advance staged receives waiting for their first message (staging/request.c). */
RK_MPI_HIDDEN void rk_stg_progress(void);
/* PMPI_Test until done, advancing staged requests and yielding the CPU now
 * and then (staging/request.c). Returns PMPI_Test's code. */
RK_MPI_HIDDEN int rk_stg_wait(MPI_Request *req, MPI_Status *st);
/* Between polls: progress, and a sched_yield every so often (ranks may
 * share cores). */
RK_MPI_HIDDEN void rk_stg_idle(unsigned *spins);
/* The plugin's duplicate of MPI_COMM_WORLD, where segments travel. */
RK_MPI_HIDDEN MPI_Comm rk_stg_comm(void);
/* A fresh tag for one pipelined message's segments. */
RK_MPI_HIDDEN int rk_stg_next_id(void);
/* Finish every staged request (finalize). */
RK_MPI_HIDDEN void rk_stg_p2p_finalize(void);

/* A user request over one of MPI's (a nonblocking collective, file or
 * RMA call on host copies): the user gets a handle of ours; when inner
 * completes, done(arg, st) runs once (copies results back to the device,
 * gives the host copies back) and its return (MPI_SUCCESS or an error
 * class) becomes the request's error. The status is inner's. Wait, Test,
 * their array forms, Request_get_status, Request_free and Cancel all take
 * it (staging/request.c). On failure inner is left to the caller and done is
 * not called. */
typedef int (*rk_stg_done_fn)(void *arg, MPI_Status *st);
RK_MPI_HIDDEN int rk_stg_wrap(MPI_Request inner, MPI_Comm comm, rk_stg_done_fn done, void *arg,
                              MPI_Request *user);

/* ---- point to point for staging/persist.c and staging/mprobe.c ---- */

/* Send modes of rk_stg_isend_any. */
#define RK_STG_M_STD 0
#define RK_STG_M_SSEND 1
#define RK_STG_M_RSEND 2
#define RK_STG_M_BSEND 3
/* MPI_Isend (of that mode) and MPI_Irecv as the hooks make them: a staged
 * request for a device buffer or a receive that may meet a header, MPI's
 * own request otherwise (staging/p2p.c). */
RK_MPI_HIDDEN int rk_stg_isend_any(const void *buf, int count, MPI_Datatype dt, int dest, int tag,
                                   MPI_Comm comm, MPI_Request *req, int mode);
RK_MPI_HIDDEN int rk_stg_irecv(void *buf, int count, MPI_Datatype dt, int src, int tag,
                               MPI_Comm comm, MPI_Request *req);
/* A persistent request of ours whose MPI_Start calls start(arg, &inner) for
 * the operation of this round (the persistent collectives of staging/coll.c);
 * arg (malloc'd) is freed with the request, or here when none is made. */
typedef int (*rk_stg_pstart_fn)(void *arg, MPI_Request *inner);
RK_MPI_HIDDEN int rk_stg_pers_fn(rk_stg_pstart_fn start, void *arg, MPI_Comm comm,
                                 MPI_Request *req);
/* The completion calls over staged and ordinary requests (staging/request.c);
 * staging/persist.c exports MPI_Wait ... over them, with each persistent
 * request of ours replaced by its active operation. */
RK_MPI_HIDDEN int rk_stg_Wait(MPI_Request *req, MPI_Status *status);
RK_MPI_HIDDEN int rk_stg_Test(MPI_Request *req, int *flag, MPI_Status *status);
RK_MPI_HIDDEN int rk_stg_Request_get_status(MPI_Request req, int *flag, MPI_Status *status);
RK_MPI_HIDDEN int rk_stg_Request_free(MPI_Request *req);
RK_MPI_HIDDEN int rk_stg_Cancel(MPI_Request *req);
RK_MPI_HIDDEN int rk_stg_Waitall(int n, MPI_Request reqs[], MPI_Status sts[]);
RK_MPI_HIDDEN int rk_stg_Testall(int n, MPI_Request reqs[], int *flag, MPI_Status sts[]);
RK_MPI_HIDDEN int rk_stg_Waitany(int n, MPI_Request reqs[], int *index, MPI_Status *status);
RK_MPI_HIDDEN int rk_stg_Testany(int n, MPI_Request reqs[], int *index, int *flag,
                                 MPI_Status *status);
RK_MPI_HIDDEN int rk_stg_Waitsome(int n, MPI_Request reqs[], int *outcount, int indices[],
                                  MPI_Status sts[]);
RK_MPI_HIDDEN int rk_stg_Testsome(int n, MPI_Request reqs[], int *outcount, int indices[],
                                  MPI_Status sts[]);
/* 32-byte messages a probe had to receive to tell a header from data
 * (staging/p2p.c), for the matched probes: whether any waits; the oldest
 * that (comm, src, tag) matches, taken out; a new entry holding the 32-byte
 * message msg (NULL without memory: the message is lost); its status (the
 * count is the whole message's); its communicator; its receive into (buf,
 * count, dt), which frees it (report: an error goes to the communicator's
 * handler now). */
typedef struct rk_stg_stash rk_stg_stash_t;
RK_MPI_HIDDEN int rk_stg_stash_any(void);
RK_MPI_HIDDEN rk_stg_stash_t *rk_stg_stash_take(MPI_Comm comm, int src, int tag);
RK_MPI_HIDDEN rk_stg_stash_t *rk_stg_stash_mrecv(MPI_Comm comm, MPI_Message *msg);
RK_MPI_HIDDEN void rk_stg_stash_status(const rk_stg_stash_t *e, MPI_Status *status);
RK_MPI_HIDDEN MPI_Comm rk_stg_stash_comm(const rk_stg_stash_t *e);
RK_MPI_HIDDEN int rk_stg_stash_recv(rk_stg_stash_t *e, void *buf, int count, MPI_Datatype dt,
                                    int dev, MPI_Status *status, int report);

/* ---- counters (staging/base.c) ---- */

RK_MPI_HIDDEN void rk_stg_count(uint64_t bytes, uint64_t ns);
RK_MPI_HIDDEN uint64_t rk_stg_now(void);

/* ---- datatypes (staging/dtype.c) ---- */

/* What staging needs to know of (count, datatype): bytes of data (size),
 * the region the data lies in relative to buf ([lo, lo + span): true
 * extent), and whether it is one contiguous run of size bytes starting at
 * element first's origin, in the order MPI packs it (then span == size,
 * and lo == 0 when first is 0). */
typedef struct rk_stg_layout {
    size_t tsize;  /* MPI_Type_size */
    size_t size;   /* count * tsize */
    ptrdiff_t lo;  /* region start relative to buf */
    size_t span;   /* region length */
    int contig;
} rk_stg_layout_t;
/* For elements [first, first + n) of a datatype (v-collectives use first).
 * 0, or an MPI error code. */
RK_MPI_HIDDEN int rk_stg_layout(MPI_Datatype dt, ptrdiff_t first, ptrdiff_t n,
                                rk_stg_layout_t *l);

/* Copy elements [first, first + n) of dt from img, the host image of the
 * device buffer dev (img + o stands for dev + o), back to dev: the bytes
 * the datatype describes and nothing else (gaps are never written). L: the
 * layout of the whole receive (its contig says one run). Queued on the
 * host-to-device stream, *ev_p an event after it (NULL: none needed); the
 * _sync form waits. Adds the bytes to *copied. 0 or -1 (message printed). */
RK_MPI_HIDDEN int rk_stg_put_elems(void *dev, const void *img, MPI_Datatype dt, ptrdiff_t first,
                                   ptrdiff_t n, const rk_stg_layout_t *L, void **ev_p,
                                   size_t *copied);
RK_MPI_HIDDEN int rk_stg_put_elems_sync(void *dev, const void *img, MPI_Datatype dt,
                                        ptrdiff_t first, ptrdiff_t n, const rk_stg_layout_t *L,
                                        size_t *copied);

/* Is a host receive of count x dt large enough that a header may arrive? */
static inline int rk_stg_big_recv(int count, MPI_Datatype dt)
{
    if (count <= 0)
        return 0;
    int sz = 0;
    if (PMPI_Type_size(dt, &sz) != MPI_SUCCESS || sz <= 0)
        return 0;
    return (size_t)count * (size_t)sz >= rk_stg_hdr_min;
}

/* The test backend (tests/mpi_staging): a host region that detection calls
 * device, and memcpy for copies. Before MPI_Init. */
RK_MPI_HIDDEN void rk_stg_fake_device(void *base, size_t bytes);
/* A read/write second mapping of that region (the same memory file): the
 * test backend's copies go through it, so that the region's own addresses
 * may be PROT_NONE and any direct access by MPI or the plugin faults.
 * NULL (the default): copies use the region's addresses. */
RK_MPI_HIDDEN void rk_stg_fake_alias(void *alias);
/* 1 and the region when the test backend runs, else 0. */
RK_MPI_HIDDEN int rk_stg_fake_region(char **base, size_t *bytes);

#endif
