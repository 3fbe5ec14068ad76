/* Staging of device buffers through pinned host memory, for an MPI that is
 * not CUDA-aware (issue 6): the decision at MPI_Init, device/host detection
 * and its cache, the copy engine, the pinned chunk pool and the counters.
 * The calls themselves are in staging/p2p.c and staging/coll.c; the
 * protocol is described in docs/staging.md.
 *
 * Detection. A buffer is classified with the driver's cuPointerGetAttributes
 * (dlopen'ed libcuda.so.1, so the plugin needs no driver at link time; the
 * call creates no context). Device answers are cached per 2 MiB granule in a
 * table of atomic words that the fast path reads without a lock (CUDA places
 * device memory in ranges reserved in 2 MiB units). A cached device answer
 * that has gone stale (memory freed, the address reused for host memory) is
 * harmless: the copy engine copies with cudaMemcpyDefault, which takes host
 * pointers too. Host answers are not cached: host memory that is unmapped
 * and whose addresses the driver then reuses for device memory would make a
 * cached host answer send a device pointer to MPI (it happened on the H100
 * with 4 ranks reallocating buffers). So a host buffer costs one driver
 * query per call while staging is on; without a GPU, or with staging off,
 * nothing is asked. rankmem's own allocations clear their granules when the
 * plugin's resource hands them out (rk_mpi_staging_forget).
 *
 * A HIP build asks the runtime instead (hipPointerGetAttributes, through
 * rk_gpu_pointer_kind: HIP has no separate driver library to open) and runs
 * its copies through src/gpu_api.h's names; the caching rules are the same. */
#define _GNU_SOURCE
#include "staging.h"
#include "ipc_map.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if HAVE_GPU
#include "../../src/gpu_api.h" /* CUDA, or HIP through the same names */
#endif

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

/* ---- state ---- */

int rk_stg_active;
int rk_stg_on;
atomic_long rk_stg_pending;
atomic_long rk_stg_rings;
int rk_stg_hooked;
atomic_long rk_stg_nreq;
_Atomic uint64_t rk_stg_table[1u << RK_STG_TABLE_BITS];
_Atomic uint64_t rk_stg_gen;

static int init_done;
static int fake;              /* test backend */
static char *fake_base;
static size_t fake_bytes;
static char *fake_alias; /* a second mapping of the region (guarded tests), or NULL */
static int fake_async;   /* its copies are done late (RKT_FAKE_ASYNC; copy_on_stream) */
static uint64_t fake_rng;
static size_t pool_bytes = (size_t)256 << 20; /* the option table's defaults */
static size_t chunk_bytes = (size_t)4 << 20;
static int stg_device = -1;  /* device the streams live on */
static MPI_Comm wcomm = MPI_COMM_NULL;
static int tag_ub = 32767;
static atomic_uint next_id;

/* ---- fault injection (tests: rk_stg_fault_set) ---- */

static atomic_uint fault_first[RK_STG_FAULTS], fault_every[RK_STG_FAULTS];
static atomic_uint fault_calls[RK_STG_FAULTS], fault_hits[RK_STG_FAULTS];
static atomic_long heap_out; /* pageable staging buffers not given back */

/* Host memory set aside at init, one chunk, for taking and dropping a
 * message's segments when no other memory can be had (rk_stg_drain): MPI
 * needs room for what it receives (Open MPI 4.1's shared-memory transport
 * writes a whole segment even into a receive of no bytes). */
static char *reserve;
static size_t reserve_bytes;
static pthread_mutex_t reserve_mu = PTHREAD_MUTEX_INITIALIZER;

char *rk_stg_reserve_take(size_t need)
{
    if (!reserve || need > reserve_bytes)
        return NULL;
    pthread_mutex_lock(&reserve_mu);
    return reserve;
}

void rk_stg_reserve_give(void) { pthread_mutex_unlock(&reserve_mu); }

void rk_stg_fault_set(int what, unsigned first, unsigned every)
{
    if (what < 0 || what >= RK_STG_FAULTS)
        return;
    atomic_store(&fault_first[what], 0); /* off while the counters change */
    atomic_store(&fault_calls[what], 0);
    atomic_store(&fault_hits[what], 0);
    atomic_store(&fault_every[what], every);
    atomic_store(&fault_first[what], first);
}

unsigned rk_stg_fault_hits(int what)
{
    return what >= 0 && what < RK_STG_FAULTS ? atomic_load(&fault_hits[what]) : 0;
}

/* Whether this call of kind what fails: call first, then every every-th. */
static int fault_hit(int what)
{
    unsigned first = atomic_load_explicit(&fault_first[what], memory_order_relaxed);
    if (__builtin_expect(first == 0, 1))
        return 0;
    unsigned c = atomic_fetch_add(&fault_calls[what], 1) + 1, every = atomic_load(&fault_every[what]);
    if (c != first && !(every && c > first && (c - first) % every == 0))
        return 0;
    atomic_fetch_add(&fault_hits[what], 1);
    return 1;
}

static atomic_ullong c_bytes, c_msgs, c_ns;

/* ---- counters ---- */

uint64_t rk_stg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void rk_stg_count(uint64_t bytes, uint64_t ns)
{
    atomic_fetch_add_explicit(&c_bytes, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&c_msgs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c_ns, ns, memory_order_relaxed);
}

void rk_mpi_staging_counters(uint64_t *bytes, uint64_t *messages, uint64_t *ns)
{
    if (bytes)
        *bytes = atomic_load(&c_bytes);
    if (messages)
        *messages = atomic_load(&c_msgs);
    if (ns)
        *ns = atomic_load(&c_ns);
}

MPI_Comm rk_stg_comm(void) { return wcomm; }

int rk_stg_next_id(void)
{
    unsigned v = atomic_fetch_add_explicit(&next_id, 1, memory_order_relaxed);
    return (int)(v % ((unsigned)tag_ub + 1u));
}

size_t rk_stg_chunk(void) { return chunk_bytes; }

void rk_stg_fake_device(void *base, size_t bytes)
{
    fake = 1;
    fake_base = base;
    fake_bytes = bytes;
    const char *a = getenv("RKT_FAKE_ASYNC");
    if (a && *a && strcmp(a, "0") != 0) {
        fake_async = 1;
        fake_rng = strtoull(a, NULL, 10) * 2654435761u + (uint64_t)getpid();
    }
}

void rk_stg_fake_alias(void *alias) { fake_alias = alias; }

/* The test backend's copies go through the alias when the region itself
 * is inaccessible (PROT_NONE, as a device pointer is to the CPU). */
static inline const void *fake_at(const void *p)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)fake_base;
    if (fake_alias && a >= b && a - b < fake_bytes)
        return fake_alias + (a - b);
    return p;
}

int rk_stg_fake_region(char **base, size_t *bytes)
{
    *base = fake_base;
    *bytes = fake_bytes;
    return fake;
}

/* ---- detection ---- */

/* The driver's pointer query, found at run time. */
typedef int (*cu_init_fn)(unsigned);
typedef int (*cu_attrs_fn)(unsigned, int *, void **, unsigned long long);
static cu_attrs_fn cu_attrs;
/* From cuda.h (stable ABI values), so that a build without CUDA headers
 * could still ask. */
#define RK_CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define RK_CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define RK_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE 10
#define RK_CU_MEMORYTYPE_DEVICE 2

#if HAVE_HIP
/* Set once the runtime's pointer query may be used (a GPU is visible). */
static int hip_attrs;
#endif

static const char *driver_open(void)
{
#if HAVE_HIP
    hip_attrs = 1; /* the runtime is linked; the caller saw a GPU */
    return NULL;
#else
    static char why[160];
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why, "no CUDA driver (%s)", dlerror());
        return why;
    }
    cu_init_fn init = (cu_init_fn)(uintptr_t)dlsym(h, "cuInit");
    cu_attrs_fn attrs = (cu_attrs_fn)(uintptr_t)dlsym(h, "cuPointerGetAttributes");
    if (!init || !attrs) {
        snprintf(why, sizeof why, "the CUDA driver lacks cuPointerGetAttributes");
        return why;
    }
    int rc = init(0); /* idempotent; creates no context */
    if (rc != 0) {
        snprintf(why, sizeof why, "cuInit failed (CUresult %d)", rc);
        return why;
    }
    cu_attrs = attrs;
    return NULL;
#endif
}

int rk_stg_cu_pointer_attrs(unsigned n, int *attrs, void **data, const void *p)
{
    return cu_attrs ? cu_attrs(n, attrs, data, (unsigned long long)(uintptr_t)p) : -1;
}

static void table_put(uint64_t key, unsigned kind)
{
    size_t i = rk_stg_slot(key);
    uint64_t g = atomic_load_explicit(&rk_stg_gen, memory_order_relaxed);
    uint64_t e = rk_stg_entry(key, g, kind);
    /* Two ways: take a way that is empty, stale or ours, else evict the
     * second (a cache: any entry written is a fact that was true). */
    for (size_t w = 0; w < 2; w++) {
        uint64_t old = atomic_load_explicit(&rk_stg_table[i + w], memory_order_relaxed);
        if (old == 0 || ((old >> 6) & 0xffffu) != (g & 0xffffu) || (old >> 22) == key) {
            atomic_store_explicit(&rk_stg_table[i + w], e, memory_order_relaxed);
            return;
        }
    }
    atomic_store_explicit(&rk_stg_table[i + 1], atomic_load(&rk_stg_table[i]),
                          memory_order_relaxed);
    atomic_store_explicit(&rk_stg_table[i], e, memory_order_relaxed);
}

/* ---- memory that is host memory for sure ----
 *
 * Host answers are not cached (below), so a host buffer would cost a driver
 * query per call. Two places cannot hold device memory while they exist, and
 * they hold most small messages: the brk heap (malloc's main arena, between
 * its start and the current break: the kernel's mmap, which the driver uses,
 * never places a mapping inside it) and the calling thread's own stack. */
uintptr_t rk_stg_brk_lo = UINTPTR_MAX; /* start of the brk heap; MAX: unknown (an empty range) */
__thread uintptr_t rk_stg_st_lo __attribute__((tls_model("initial-exec")));
__thread uintptr_t rk_stg_st_hi __attribute__((tls_model("initial-exec")));

static void known_host_init(void)
{
    if (fake)
        return;
    /* start_brk is field 47 of /proc/self/stat (Linux 3.5 and later); the
     * break at init as a fallback (the heap below it is missed then). */
    FILE *f = fopen("/proc/self/stat", "r");
    char buf[2048];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = 0;
    char *q = strrchr(buf, ')'); /* the command name may hold spaces */
    unsigned long long v = 0;
    for (int field = 2; q && *q && field < 47; q++)
        if (*q == ' ')
            field++;
    if (q && sscanf(q, "%llu", &v) == 1 && v)
        rk_stg_brk_lo = (uintptr_t)v;
    else
        rk_stg_brk_lo = (uintptr_t)sbrk(0);
}

/* The calling thread's stack bounds, once per thread. */
static void learn_stack(void)
{
    pthread_attr_t at;
    void *lo = NULL;
    size_t sz = 0;
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
        if (pthread_attr_getstack(&at, &lo, &sz) == 0 && lo && sz) {
            rk_stg_st_lo = (uintptr_t)lo;
            rk_stg_st_hi = (uintptr_t)lo + sz;
        }
        pthread_attr_destroy(&at);
    }
    if (!rk_stg_st_hi)
        rk_stg_st_lo = rk_stg_st_hi = 1; /* unknown: an empty range, not asked again */
}

int rk_stg_classify_slow(const void *p)
{
    unsigned kind = RK_STG_KIND_HOST;
    uintptr_t a = (uintptr_t)p;
    if (!fake && RK_STG_UNLIKELY(!rk_stg_st_hi)) {
        learn_stack();
        if (rk_stg_known_host(a))
            return 0;
    }
    if (fake) {
        if (a >= (uintptr_t)fake_base && a < (uintptr_t)fake_base + fake_bytes)
            kind = RK_STG_KIND_DEVICE;
        /* The fake region is not granule-aligned: no caching in its granules. */
        uintptr_t g0 = (uintptr_t)fake_base >> RK_STG_GRANULE_SHIFT;
        uintptr_t g1 = ((uintptr_t)fake_base + fake_bytes - 1) >> RK_STG_GRANULE_SHIFT;
        if ((a >> RK_STG_GRANULE_SHIFT) == g0 || (a >> RK_STG_GRANULE_SHIFT) == g1)
            return kind == RK_STG_KIND_DEVICE;
    } else if (cu_attrs) {
        int attr[2] = {RK_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, RK_CU_POINTER_ATTRIBUTE_IS_MANAGED};
        unsigned int mtype = 0;
        int managed = 0;
        void *data[2] = {&mtype, &managed};
        /* Unlike cuPointerGetAttribute, this one answers "no type" for plain
         * host memory instead of failing. */
        if (cu_attrs(2, attr, data, (unsigned long long)a) == 0 &&
            mtype == RK_CU_MEMORYTYPE_DEVICE && !managed)
            kind = RK_STG_KIND_DEVICE;
        /* Managed memory is host-accessible: MPI reads it as it is. */
        /* Only device answers are cached. A host answer goes stale when the
         * memory is unmapped and the driver later maps device memory at the
         * same addresses (seen on the H100: MPI then wrote into device
         * memory); a stale device answer only costs a staged copy, which
         * cudaMemcpyDefault does for host memory too. */
        if (kind != RK_STG_KIND_DEVICE)
            return 0;
    }
#if HAVE_HIP
    else if (hip_attrs) {
        /* Managed memory is host-accessible, as above; only device answers
         * are cached, as above. */
        if (rk_gpu_pointer_kind(p, NULL) == RK_GPU_PTR_DEVICE)
            kind = RK_STG_KIND_DEVICE;
        else
            return 0;
    }
#endif
    table_put((uint64_t)a >> RK_STG_GRANULE_SHIFT, kind);
    return kind == RK_STG_KIND_DEVICE;
}

/* Forget what is cached about [ptr, ptr + bytes): rankmem just handed that
 * memory out (maybe at an address that was host memory before). */
RK_MPI_HIDDEN void rk_mpi_staging_forget(const void *ptr, size_t bytes);
void rk_mpi_staging_forget(const void *ptr, size_t bytes)
{
    if (!rk_stg_on || !ptr)
        return;
    uint64_t k0 = (uint64_t)(uintptr_t)ptr >> RK_STG_GRANULE_SHIFT;
    uint64_t k1 = ((uint64_t)(uintptr_t)ptr + (bytes ? bytes - 1 : 0)) >> RK_STG_GRANULE_SHIFT;
    if (k1 - k0 > 64) {
        /* A big range: start over (all entries of older generations are misses). */
        uint64_t g = atomic_fetch_add(&rk_stg_gen, 1) + 1;
        if ((g & 0xffffu) == 0) /* wrapped: old entries would look current */
            for (size_t i = 0; i < (1u << RK_STG_TABLE_BITS); i++)
                atomic_store_explicit(&rk_stg_table[i], 0, memory_order_relaxed);
        return;
    }
    for (uint64_t k = k0; k <= k1; k++) {
        size_t i = rk_stg_slot(k);
        for (size_t w = 0; w < 2; w++) {
            uint64_t e = atomic_load_explicit(&rk_stg_table[i + w], memory_order_relaxed);
            if ((e >> 22) == k && (e & 3) == RK_STG_KIND_HOST)
                atomic_compare_exchange_strong(&rk_stg_table[i + w], &e, 0);
        }
    }
}

/* ---- copies ---- */

#if HAVE_GPU
static pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t streams[2];
static int streams_ok; /* 0 not yet, 1 made, -1 failed */
#define EV_CACHE 256
static cudaEvent_t ev_free[EV_CACHE];
static int nev_free;

static int cu_fail(const char *what, cudaError_t err)
{
    rk_mpi_warn("staging: %s: %s", what, cudaGetErrorString(err));
    (void)cudaGetLastError();
    return -1;
}

/* The streams, made once on the rank's device (the one current at init). */
static int make_streams(void)
{
    if (__atomic_load_n(&streams_ok, __ATOMIC_ACQUIRE) != 0)
        return streams_ok > 0 ? 0 : -1;
    pthread_mutex_lock(&cu_lock);
    if (streams_ok == 0) {
        int prev = -1;
        cudaGetDevice(&prev);
        if (stg_device >= 0 && prev != stg_device)
            cudaSetDevice(stg_device);
        /* Blocking streams: our copies wait for the work the application
         * queued on the legacy default stream (a cudaMemset or kernel that
         * fills a send buffer, or clears a receive buffer, is asynchronous),
         * and later legacy-stream work waits for them. Work on the
         * application's non-blocking streams must be synchronised before the
         * MPI call, as with any CUDA-aware MPI (docs/staging.md). */
        cudaError_t e1 = cudaStreamCreateWithFlags(&streams[0], cudaStreamDefault);
        cudaError_t e2 = e1 == cudaSuccess
                             ? cudaStreamCreateWithFlags(&streams[1], cudaStreamDefault)
                             : e1;
        if (stg_device >= 0 && prev >= 0 && prev != stg_device)
            cudaSetDevice(prev);
        if (e2 != cudaSuccess) {
            cu_fail("cudaStreamCreate", e2);
            __atomic_store_n(&streams_ok, -1, __ATOMIC_RELEASE);
        } else {
            __atomic_store_n(&streams_ok, 1, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&cu_lock);
    return streams_ok > 0 ? 0 : -1;
}

static cudaEvent_t ev_get(void)
{
    cudaEvent_t ev = NULL;
    pthread_mutex_lock(&cu_lock);
    if (nev_free > 0)
        ev = ev_free[--nev_free];
    pthread_mutex_unlock(&cu_lock);
    if (!ev) {
        cudaError_t err = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        if (err != cudaSuccess) {
            cu_fail("cudaEventCreate", err);
            return NULL;
        }
    }
    return ev;
}
#endif

/* ---- small host-to-device copies on a shared GPU ----
 *
 * Two ranks on one GPU without MPS (the H100 machine here, 2026-11-25): a
 * host-to-device copy under 32 KiB from pinned memory, and any
 * device-to-device copy, runs where the GPU switches between the two
 * processes' contexts, about 145 us a switch, while device-to-host copies
 * and host-to-device copies from 32 KiB take the copy engines and switch in
 * microseconds. A device message under 32 KiB paid one such switch per
 * hop: 152 us. Two ways around it, measured there: up to 1 KiB in words
 * of 4 or 8 bytes, the stream writes the values itself
 * (cuStreamBatchMemOp: 7 us for 8 B, 11 us for 64 B, 0.7 us a word); from
 * 4 KiB, a 32 KiB copy into scratch memory queued first takes the copy
 * engine's path for the copy behind it (12 us at 4 KiB). Only when another
 * rank of the node uses this GPU (rk_stg_shared_gpu); with a GPU of its
 * own a rank copies as before. */
int rk_stg_shared_gpu;
size_t rk_stg_hdr_min = RK_STG_BIG + 1;
#if HAVE_GPU && !HAVE_HIP
#include <cuda.h>
#define SMALL_WRITES_MAX 1024
#define BATCH_MAX 128 /* operations per cuStreamBatchMemOp call (the driver takes up to 255) */
#define WARM_BYTES 32768
typedef CUresult (*cu_batch_fn)(CUstream, unsigned, CUstreamBatchMemOpParams *, unsigned);
static cu_batch_fn cu_batch;
static int small_state; /* 0 not yet, 1 ready, -1 unavailable */
static void *warm_dev, *warm_host;

static int small_ready(void)
{
    int st = __atomic_load_n(&small_state, __ATOMIC_ACQUIRE);
    if (st != 0)
        return st > 0;
    pthread_mutex_lock(&cu_lock);
    if (small_state == 0) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        cu_batch = h ? (cu_batch_fn)(uintptr_t)dlsym(h, "cuStreamBatchMemOp_v2") : NULL;
        rk_obs_internal_depth++; /* rankmem's own memory, not the program's */
        int ok = cudaMalloc(&warm_dev, WARM_BYTES) == cudaSuccess;
        ok = ok && cudaMallocHost(&warm_host, WARM_BYTES) == cudaSuccess;
        rk_obs_internal_depth--;
        if (!ok)
            (void)cudaGetLastError();
        __atomic_store_n(&small_state, ok ? 1 : -1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&cu_lock);
    return small_state > 0;
}

/* The stream writes values only into cudaMalloc memory: the driver
 * refuses them (invalid value) for stream-ordered pools and the VMM API,
 * which the copy then takes anyway; asking first keeps compute-sanitizer's
 * API check quiet (seen on the H100 with cudaMallocAsync and pool buffers). */
static int batch_target(const void *dst)
{
    int attr[1] = {RK_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    int legacy = 0;
    void *data[1] = {&legacy};
    return cu_attrs && cu_attrs(1, attr, data, (unsigned long long)(uintptr_t)dst) == 0 && legacy;
}

/* Queue the small copy (the caller made the device current). 0 done, 1
 * not taken (copy as usual), or a CUDA error. */
static cudaError_t small_h2d(void *dst, const void *src, size_t n, cudaStream_t s, int *taken)
{
    *taken = 0;
    if (n >= WARM_BYTES || !small_ready())
        return cudaSuccess;
    uintptr_t d = (uintptr_t)dst;
    if (cu_batch && n <= SMALL_WRITES_MAX && d % 4 == 0 && n % 4 == 0 && batch_target(dst)) {
        CUstreamBatchMemOpParams ops[SMALL_WRITES_MAX / 4];
        unsigned k = 0;
        for (size_t off = 0; off < n; k++) {
            memset(&ops[k], 0, sizeof ops[k]);
            ops[k].writeValue.address = (CUdeviceptr)(d + off);
            if ((d + off) % 8 == 0 && n - off >= 8) {
                ops[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
                memcpy(&ops[k].writeValue.value64, (const char *)src + off, 8);
                off += 8;
            } else {
                ops[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
                memcpy(&ops[k].writeValue.value, (const char *)src + off, 4);
                off += 4;
            }
        }
        CUresult r = CUDA_SUCCESS;
        unsigned done = 0;
        while (done < k && r == CUDA_SUCCESS) {
            unsigned c = k - done < BATCH_MAX ? k - done : BATCH_MAX;
            if ((r = cu_batch((CUstream)s, c, ops + done, 0)) == CUDA_SUCCESS)
                done += c;
        }
        if (done > 0) {
            /* Once a batch went in, the rest must too: a refusal after the
             * first is an error like a failed copy's. */
            *taken = 1;
            return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorUnknown;
        }
        /* Refused at once (a driver without these operations): copy as usual. */
        return cudaSuccess;
    }
    if (n >= 4096) {
        cudaError_t e = cudaMemcpyAsync(warm_dev, warm_host, WARM_BYTES, cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}
#endif

/* The test backend's copies are done on return, and its events are this,
 * unless the test asks for late copies (RKT_FAKE_ASYNC=seed, read by
 * rk_stg_fake_device): then each copy is queued on its direction's stream
 * and done later, in stream order, as a GPU's may be: when an event after it
 * is waited for, when a test of that event happens to find it done (at
 * random, from the seed), when its stream is synchronised, or at random on a
 * later copy. A path that reads a staging buffer before its copy's event,
 * or completes a receive before the copy into the user's buffer, then
 * delivers stale bytes, which the tests' byte comparisons see. */
static char fake_event;
typedef struct fcopy {
    struct fcopy *next;
    char *dst;
    const char *src;
    size_t n, pitch, rows;
    uint64_t seq;
} fcopy_t;
typedef struct {
    char tag[4]; /* "fev": an event of the late-copy queue */
    int stream;
    uint64_t seq;
} fevent_t;
static pthread_mutex_t fq_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    fcopy_t *head, *tail;
    uint64_t seq_in, seq_done;
} fq[2];

static unsigned fake_coin(unsigned sides)
{
    fake_rng = fake_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (unsigned)(fake_rng >> 33) % sides;
}

static void fake_do(const fcopy_t *c)
{
    for (size_t i = 0; c->n && i < c->rows; i++)
        memcpy((void *)fake_at(c->dst + i * c->pitch), fake_at(c->src + i * c->pitch), c->n);
}

/* Do stream s's queued copies up to seq (all: UINT64_MAX). Under fq_lock. */
static void fake_run(int s, uint64_t seq)
{
    while (fq[s].head && fq[s].head->seq <= seq) {
        fcopy_t *c = fq[s].head;
        fq[s].head = c->next;
        if (!fq[s].head)
            fq[s].tail = NULL;
        fake_do(c);
        fq[s].seq_done = c->seq;
        free(c);
    }
}

/* Queue a copy on stream s; wait: done with the stream before return; ev_p:
 * an event after it. 0 or -1. */
static int fake_queue(int s, void *dst, const void *src, size_t n, size_t pitch, size_t rows,
                      void **ev_p, int wait)
{
    fcopy_t *c = malloc(sizeof *c);
    fevent_t *e = ev_p ? malloc(sizeof *e) : NULL;
    if (!c || (ev_p && !e)) {
        free(c);
        free(e);
        return -1;
    }
    pthread_mutex_lock(&fq_lock);
    *c = (fcopy_t){NULL, dst, src, n, pitch, rows, ++fq[s].seq_in};
    if (fq[s].tail)
        fq[s].tail->next = c;
    else
        fq[s].head = c;
    fq[s].tail = c;
    if (e) {
        *e = (fevent_t){"fev", s, c->seq};
        *ev_p = e;
    }
    if (wait)
        fake_run(s, UINT64_MAX);
    else if (fake_coin(4) == 0) /* the other stream moves on meanwhile */
        fake_run(1 - s, fq[1 - s].seq_done + 1 + fake_coin(3));
    pthread_mutex_unlock(&fq_lock);
    return 0;
}

static int fake_event_test(void *ev, int wait)
{
    fevent_t *e = ev;
    pthread_mutex_lock(&fq_lock);
    int done = fq[e->stream].seq_done >= e->seq;
    if (!done && (wait || fake_coin(3) != 0)) {
        fake_run(e->stream, e->seq);
        done = 1;
    }
    pthread_mutex_unlock(&fq_lock);
    return done;
}

/* Every queued copy done (finalize; a test's end). */
static void fake_drain(void)
{
    pthread_mutex_lock(&fq_lock);
    fake_run(0, UINT64_MAX);
    fake_run(1, UINT64_MAX);
    pthread_mutex_unlock(&fq_lock);
}

/* A copy on dir's stream of rows rows of n bytes, pitch bytes apart on
 * both sides (one row: a plain copy), followed by an event (*ev_p) or, when
 * wait, by waiting on the stream itself (no event to take, record and give
 * back: a small message's latency is two such copies). */
static int copy_on_stream(void *dst, const void *src, size_t n, size_t pitch, size_t rows,
                          int dir, void **ev_p, int wait)
{
    if (ev_p)
        *ev_p = NULL;
    if (fault_hit(RK_STG_FAULT_COPY)) {
        rk_mpi_warn("staging: %s copy failed (injected)",
                    dir == RK_STG_D2H ? "device-to-host" : "host-to-device");
        return -1;
    }
    if (fake && fake_async)
        return fake_queue(dir == RK_STG_D2H ? 0 : 1, dst, src, n, pitch, rows, ev_p, wait);
    if (fake) {
        for (size_t i = 0; n && i < rows; i++)
            memcpy((void *)fake_at((char *)dst + i * pitch), fake_at((const char *)src + i * pitch),
                   n);
        if (ev_p)
            *ev_p = &fake_event;
        return 0;
    }
#if HAVE_GPU
    if (make_streams() != 0)
        return -1;
    /* Streams belong to stg_device: copy with it current (threads other
     * than the one that called MPI_Init start on device 0). */
    int prev = -1;
    if (stg_device >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != stg_device)
        cudaSetDevice(stg_device);
    else
        prev = -1;
    cudaStream_t st = streams[dir == RK_STG_D2H ? 0 : 1]; /* device-to-device: the H2D stream */
    int rc = 0, taken = 0;
    cudaError_t err = cudaSuccess;
#if !HAVE_HIP
    if (dir == RK_STG_H2D && rk_stg_shared_gpu && n && rows == 1)
        err = small_h2d(dst, src, n, st, &taken);
#endif
    if (err == cudaSuccess && n && !taken)
        err = rows == 1 ? cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, st)
                        : cudaMemcpy2DAsync(dst, pitch, src, pitch, n, rows, cudaMemcpyDefault, st);
    if (err == cudaSuccess && wait)
        err = cudaStreamSynchronize(st);
    if (err != cudaSuccess) {
        rc = cu_fail(dir == RK_STG_D2H ? "device-to-host copy" : "host-to-device copy", err);
    } else if (ev_p) {
        cudaEvent_t ev = ev_get();
        if (!ev)
            rc = -1;
        else if ((err = cudaEventRecord(ev, st)) != cudaSuccess)
            rc = cu_fail("cudaEventRecord", err), rk_stg_event_put(ev);
        else
            *ev_p = ev;
    }
    if (prev >= 0)
        cudaSetDevice(prev);
    return rc;
#else
    (void)dst, (void)src, (void)n, (void)pitch, (void)rows, (void)dir, (void)wait;
    rk_mpi_warn("staging: a device copy in a build without a GPU runtime");
    return -1;
#endif
}

int rk_stg_copy(void *dst, const void *src, size_t n, int dir, void **ev_p)
{
    return copy_on_stream(dst, src, n, n, 1, dir, ev_p, 0);
}

int rk_stg_event_test(void *ev)
{
    if (!ev || ev == &fake_event)
        return 1;
    if (fake)
        return fake_event_test(ev, 0);
#if HAVE_GPU
    cudaError_t err = cudaEventQuery((cudaEvent_t)ev);
    if (err == cudaSuccess)
        return 1;
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return 0;
    }
    return cu_fail("cudaEventQuery", err);
#else
    return 1;
#endif
}

int rk_stg_event_wait(void *ev)
{
    if (!ev || ev == &fake_event)
        return 0;
    if (fake)
        return fake_event_test(ev, 1), 0;
#if HAVE_GPU
    cudaError_t err = cudaEventSynchronize((cudaEvent_t)ev);
    return err == cudaSuccess ? 0 : cu_fail("cudaEventSynchronize", err);
#else
    return 0;
#endif
}

void rk_stg_event_put(void *ev)
{
    if (!ev || ev == &fake_event)
        return;
    if (fake) {
        free(ev); /* its copy, if not done yet, stays queued, as on a GPU */
        return;
    }
#if HAVE_GPU
    pthread_mutex_lock(&cu_lock);
    if (nev_free < EV_CACHE) {
        ev_free[nev_free++] = (cudaEvent_t)ev;
        ev = NULL;
    }
    pthread_mutex_unlock(&cu_lock);
    if (ev)
        cudaEventDestroy((cudaEvent_t)ev);
#endif
}

int rk_stg_copy_sync(void *dst, const void *src, size_t n, int dir)
{
    return copy_on_stream(dst, src, n, n, 1, dir, NULL, 1);
}

/* Rows of a strided copy above this pitch go one by one (the 2D copy's
 * pitch has a device limit; a few rows cost little). */
#define PITCH_MAX ((size_t)1 << 30)

int rk_stg_copy2d(void *dst, const void *src, size_t pitch, size_t width, size_t height, int dir,
                  void **ev_p)
{
    if (height > 1 && pitch <= PITCH_MAX && width <= pitch)
        return copy_on_stream(dst, src, width, pitch, height, dir, ev_p, 0);
    /* Row by row; the last row's event covers the others (same stream). */
    if (ev_p)
        *ev_p = NULL;
    for (size_t i = 0; i < height; i++)
        if (copy_on_stream((char *)dst + i * pitch, (const char *)src + i * pitch, width, width, 1,
                           dir, i + 1 == height ? ev_p : NULL, 0) != 0)
            return -1;
    return 0;
}

/* ---- host memory: the pinned pool, a few cached big buffers, malloc ---- */

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static char *slab;
static int pool_state; /* 0 not made yet, 1 ready, -1 could not be made */
static int nchunks;
static unsigned char *chunk_used; /* 0 free, 1 nonblocking owner, 2 blocking owner,
                                    3 cut into slices (minis[]) */
static int held_blocking;         /* chunks held by blocking calls */

/* Buffers above the pool's size (collectives of large counts, messages
 * larger than the pool): pinned, kept for the next call of that size. */
#define CACHE_SLOTS 4
static struct {
    char *ptr;
    size_t bytes;
    int busy;
} cache[CACHE_SLOTS];

static void *pinned_alloc(size_t bytes)
{
    if (fault_hit(RK_STG_FAULT_PINNED))
        return NULL;
    if (fake)
        return aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
#if HAVE_GPU
    void *p = NULL;
    int prev = -1;
    if (stg_device >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != stg_device)
        cudaSetDevice(stg_device);
    else
        prev = -1;
    /* rankmem's own memory: observation must not count it as the program's */
    rk_obs_internal_depth++;
    cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    rk_obs_internal_depth--;
    if (prev >= 0)
        cudaSetDevice(prev);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
#else
    (void)bytes;
    return NULL;
#endif
}

static void pinned_free(void *p)
{
    if (!p)
        return;
    if (fake) {
        free(p);
        return;
    }
#if HAVE_GPU
    cudaFreeHost(p);
    (void)cudaGetLastError();
#endif
}

/* Buffers of up to MINI_BYTES are slices of a chunk (at most 64 to a
 * chunk), so that a window of small messages in flight holds a few chunks
 * instead of one each (a 4 MiB chunk for a 4 KiB message: 64 of them were
 * the whole default pool). A chunk of slices goes back to the pool when its
 * last slice does. Under pool_lock. */
#define MINI_BYTES ((size_t)64 << 10)
#define MINI_CHUNKS 64
static struct {
    int chunk;
    uint64_t used; /* a bit per slice */
} minis[MINI_CHUNKS];
static int nminis;

static int mini_per_chunk(void)
{
    size_t k = chunk_bytes / MINI_BYTES;
    return k > 64 ? 64 : (int)k;
}

static int find_run(int k);

static int mini_get(rk_stg_buf_t *b)
{
    int per = mini_per_chunk();
    if (per < 2)
        return 0; /* chunks of 64 KiB: a chunk is a slice */
    uint64_t full = per == 64 ? ~0ull : (1ull << per) - 1;
    int i = 0;
    while (i < nminis && minis[i].used == full)
        i++;
    if (i == nminis) {
        int c = nminis < MINI_CHUNKS ? find_run(1) : -1;
        if (c < 0)
            return 0;
        chunk_used[c] = 3; /* slices */
        minis[nminis].chunk = c;
        minis[nminis].used = 0;
        nminis++;
    }
    int bit = __builtin_ctzll(~minis[i].used);
    minis[i].used |= 1ull << bit;
    b->kind = RK_STG_BUF_MINI;
    b->first = minis[i].chunk;
    b->slot = bit;
    b->ptr = slab + (size_t)minis[i].chunk * chunk_bytes + (size_t)bit * MINI_BYTES;
    return 1;
}

static void mini_put(const rk_stg_buf_t *b)
{
    for (int i = 0; i < nminis; i++)
        if (minis[i].chunk == b->first) {
            minis[i].used &= ~(1ull << b->slot);
            if (!minis[i].used) {
                chunk_used[minis[i].chunk] = 0;
                minis[i] = minis[--nminis];
            }
            return;
        }
}

/* First fit of k free chunks; -1 if none. Under pool_lock. */
static int find_run(int k)
{
    int run = 0;
    for (int i = 0; i < nchunks; i++) {
        run = chunk_used[i] ? 0 : run + 1;
        if (run == k)
            return i - k + 1;
    }
    return -1;
}

static int pool_ready(void)
{
    /* A pool that could not be made is tried again later (1 s, doubling up
     * to a minute): pinned memory short for a moment must not leave the
     * rest of the job on pageable memory. */
    static uint64_t retry_at, backoff;
    if (pool_state < 0 && rk_stg_now() >= retry_at)
        pool_state = 0;
    if (pool_state == 0) {
        nchunks = (int)(pool_bytes / chunk_bytes);
        chunk_used = calloc((size_t)nchunks, 1);
        slab = chunk_used ? pinned_alloc((size_t)nchunks * chunk_bytes) : NULL;
        if (!slab) {
            if (!backoff)
                rk_mpi_warn("staging: cannot allocate %zu MiB of pinned memory for "
                            "RANKMEM_STAGING_POOL: staging through pageable memory (slower) "
                            "until it can",
                            pool_bytes >> 20);
            free(chunk_used);
            chunk_used = NULL;
            pool_state = -1;
            backoff = backoff ? (backoff < 60000000000u / 2 ? 2 * backoff : 60000000000u)
                              : 1000000000u;
            retry_at = rk_stg_now() + backoff;
        } else {
            pool_state = 1;
            if (backoff)
                rk_mpi_warn("staging: the pinned pool could be made now");
            backoff = 0;
            rk_mpi_verbose("staging: pinned pool of %d chunks of %zu KiB", nchunks,
                           chunk_bytes >> 10);
        }
    }
    return pool_state > 0;
}

int rk_stg_buf_get(size_t bytes, int wait_ok, rk_stg_buf_t *b)
{
    memset(b, 0, sizeof *b);
    if (fault_hit(RK_STG_FAULT_HOST))
        return -1;
    if (bytes == 0)
        bytes = 1;
    b->bytes = bytes;
    uint64_t t0 = 0;
    unsigned spins = 0;
    pthread_mutex_lock(&pool_lock);
    if (bytes <= MINI_BYTES && pool_ready() && mini_get(b)) {
        pthread_mutex_unlock(&pool_lock);
        return 0;
    }
    if (pool_ready() && bytes <= (size_t)nchunks * chunk_bytes) {
        int k = (int)((bytes + chunk_bytes - 1) / chunk_bytes);
        for (;;) {
            int first = find_run(k);
            if (first >= 0) {
                memset(chunk_used + first, wait_ok ? 2 : 1, (size_t)k);
                if (wait_ok)
                    held_blocking += k;
                pthread_mutex_unlock(&pool_lock);
                b->kind = RK_STG_BUF_POOL;
                b->ptr = slab + (size_t)first * chunk_bytes;
                b->first = first;
                b->nchunks = k;
                return 0;
            }
            /* Wait only for chunks that blocking calls hold: they give them
             * back before returning. Those of nonblocking requests come
             * back at the application's Wait, which cannot come while this
             * thread waits here. A deadline breaks cycles across ranks. */
            if (!wait_ok || held_blocking == 0)
                break;
            uint64_t now = rk_stg_now();
            if (!t0)
                t0 = now;
            else if (now - t0 > 50000000u)
                break;
            pthread_mutex_unlock(&pool_lock);
            rk_stg_idle(&spins);
            pthread_mutex_lock(&pool_lock);
        }
    }
    if (pool_state >= 0 && bytes > (size_t)nchunks * chunk_bytes) {
        /* Larger than the whole pool: a cached pinned buffer. */
        int pick = -1;
        for (int i = 0; i < CACHE_SLOTS; i++)
            if (!cache[i].busy && cache[i].ptr && cache[i].bytes >= bytes &&
                (pick < 0 || cache[i].bytes < cache[pick].bytes))
                pick = i;
        if (pick < 0) {
            /* Replace the smallest idle one (or fill an empty slot). */
            for (int i = 0; i < CACHE_SLOTS; i++)
                if (!cache[i].busy && (pick < 0 || cache[i].bytes < cache[pick].bytes))
                    pick = i;
            if (pick >= 0) {
                pinned_free(cache[pick].ptr);
                cache[pick].bytes = 0;
                size_t want = (bytes + chunk_bytes - 1) / chunk_bytes * chunk_bytes;
                cache[pick].ptr = pinned_alloc(want);
                if (cache[pick].ptr)
                    cache[pick].bytes = want;
                else
                    pick = -1;
            }
        }
        if (pick >= 0) {
            cache[pick].busy = 1;
            pthread_mutex_unlock(&pool_lock);
            b->kind = RK_STG_BUF_CACHE;
            b->ptr = cache[pick].ptr;
            b->slot = pick;
            return 0;
        }
    }
    pthread_mutex_unlock(&pool_lock);
    /* The pool is busy (or there is no pinned memory): pageable memory;
     * cudaMemcpyAsync takes it too, only slower. */
    b->ptr = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!b->ptr)
        return -1;
    b->kind = RK_STG_BUF_HEAP;
    atomic_fetch_add(&heap_out, 1);
    return 0;
}

void rk_stg_buf_put(rk_stg_buf_t *b)
{
    switch (b->kind) {
    case RK_STG_BUF_POOL:
        pthread_mutex_lock(&pool_lock);
        if (chunk_used[b->first] == 2)
            held_blocking -= b->nchunks;
        memset(chunk_used + b->first, 0, (size_t)b->nchunks);
        pthread_mutex_unlock(&pool_lock);
        break;
    case RK_STG_BUF_CACHE:
        pthread_mutex_lock(&pool_lock);
        cache[b->slot].busy = 0;
        pthread_mutex_unlock(&pool_lock);
        break;
    case RK_STG_BUF_MINI:
        pthread_mutex_lock(&pool_lock);
        mini_put(b);
        pthread_mutex_unlock(&pool_lock);
        break;
    case RK_STG_BUF_HEAP:
        free(b->ptr);
        atomic_fetch_sub(&heap_out, 1);
        break;
    default:
        break;
    }
    memset(b, 0, sizeof *b);
}

long rk_stg_buf_inuse(void)
{
    long n = atomic_load(&heap_out);
    pthread_mutex_lock(&pool_lock);
    for (int i = 0; chunk_used && i < nchunks; i++)
        n += chunk_used[i] != 0;
    for (int i = 0; i < CACHE_SLOTS; i++)
        n += cache[i].busy != 0;
    pthread_mutex_unlock(&pool_lock);
    return n;
}

/* ---- init ---- */

/* An option's value: librankmem's table when it knows it, else the environment. */
static void progress_hook(int on);
static int ring_wanted = 1; /* RANKMEM_STAGING_RING */

static const char *option(const char *name)
{
    const char *v = NULL;
    if (rankmem_option_get(name, &v) != RANKMEM_SUCCESS) {
        rankmem_clear_error();
        v = getenv(name);
    }
    return v;
}

static int size_option(const char *name, size_t lo, size_t hi, size_t *out, char *why, size_t len)
{
    const char *v = option(name);
    if (!v)
        return 0;
    size_t n = 0;
    if (rankmem_parse_size(v, 0, &n) != RANKMEM_SUCCESS) {
        rankmem_clear_error();
        snprintf(why, len, "%s='%.40s': not a size (expected bytes with K/M/G[iB], e.g. 4MiB)",
                 name, v);
        return -1;
    }
    if (n < lo || n > hi) {
        snprintf(why, len, "%s='%.40s': out of range (%zu KiB to %zu MiB)", name, v, lo >> 10,
                 hi >> 20);
        return -1;
    }
    *out = n;
    return 0;
}

/* Does the MPI library take device pointers itself? Open MPI's extension
 * query, else MPICH's, for the GPU kind of this build. */
#if HAVE_HIP
#define RK_STG_AWARE "ROCm-aware"
#if defined(OMPI_HAVE_MPI_EXT_ROCM) && OMPI_HAVE_MPI_EXT_ROCM
#define RK_STG_OMPI_QUERY MPIX_Query_rocm_support
#define RK_STG_OMPI_NAME "MPIX_Query_rocm_support"
#endif
#if defined(MPIX_GPU_SUPPORT_HIP)
#define RK_STG_MPICH_KIND MPIX_GPU_SUPPORT_HIP
#endif
#else
#define RK_STG_AWARE "CUDA-aware"
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
#define RK_STG_OMPI_QUERY MPIX_Query_cuda_support
#define RK_STG_OMPI_NAME "MPIX_Query_cuda_support"
#endif
#if defined(MPIX_GPU_SUPPORT_CUDA)
#define RK_STG_MPICH_KIND MPIX_GPU_SUPPORT_CUDA
#endif
#endif

static int mpi_cuda_aware(const char **how)
{
#if defined(RK_STG_OMPI_QUERY)
    *how = RK_STG_OMPI_NAME;
    return RK_STG_OMPI_QUERY() == 1;
#elif defined(MPICH_NUMVERSION) && defined(RK_STG_MPICH_KIND)
    int yes = 0;
    *how = "MPIX_GPU_query_support";
    if (MPIX_GPU_query_support(RK_STG_MPICH_KIND, &yes) != MPI_SUCCESS)
        return 0;
    return yes != 0;
#else
    *how = "no query in this MPI: assumed not " RK_STG_AWARE;
    return 0;
#endif
}

void rk_mpi_staging_init(void)
{
    if (init_done)
        return;
    init_done = 1;
    known_host_init();

    char why[256] = "";
    int mode = 0; /* 0 auto, 1 on, 2 off */
    const char *m = option("RANKMEM_STAGING");
    if (m && strcmp(m, "auto") != 0) {
        if (strcmp(m, "on") == 0)
            mode = 1;
        else if (strcmp(m, "off") == 0)
            mode = 2;
        else
            snprintf(why, sizeof why, "RANKMEM_STAGING='%.40s': expected auto, on or off", m);
    }
    if (!why[0])
        (void)size_option("RANKMEM_STAGING_CHUNK", (size_t)64 << 10, (size_t)1 << 30, &chunk_bytes,
                          why, sizeof why);
    if (!why[0])
        (void)size_option("RANKMEM_STAGING_POOL", (size_t)64 << 10, (size_t)64 << 30, &pool_bytes,
                          why, sizeof why);
    if (!why[0] && pool_bytes < chunk_bytes)
        snprintf(why, sizeof why,
                 "RANKMEM_STAGING_POOL (%zu KiB) is smaller than RANKMEM_STAGING_CHUNK (%zu KiB)",
                 pool_bytes >> 10, chunk_bytes >> 10);
    if (!why[0] && pool_bytes / chunk_bytes > 65536)
        snprintf(why, sizeof why,
                 "RANKMEM_STAGING_POOL / RANKMEM_STAGING_CHUNK is over 65536 chunks");
    int ipc_mode = 0, ipc_cache = 0; /* RANKMEM_STAGING_IPC: 0 auto, 1 on, 2 off */
    const char *iv = option("RANKMEM_STAGING_IPC");
    if (!why[0] && iv && strcmp(iv, "auto") != 0) {
        if (strcmp(iv, "on") == 0)
            ipc_mode = 1;
        else if (strcmp(iv, "off") == 0)
            ipc_mode = 2;
        else
            snprintf(why, sizeof why, "RANKMEM_STAGING_IPC='%.40s': expected auto, on or off", iv);
    }
    const char *cv = option("RANKMEM_STAGING_IPC_CACHE");
    if (!why[0] && cv && *cv) {
        char *end = NULL;
        long n = strtol(cv, &end, 10);
        if (!end || *end || end == cv || n < 1 || n > 65536)
            snprintf(why, sizeof why,
                     "RANKMEM_STAGING_IPC_CACHE='%.40s': expected a count of mappings, 1 to 65536",
                     cv);
        else
            ipc_cache = (int)n;
    }
    const char *rv = option("RANKMEM_STAGING_RING");
    if (!why[0] && rv && rankmem_parse_bool(rv, &ring_wanted) != RANKMEM_SUCCESS) {
        rankmem_clear_error();
        snprintf(why, sizeof why,
                 "RANKMEM_STAGING_RING='%.40s': expected 1/0, on/off, yes/no or true/false", rv);
    }

    const char *how = "";
    int aware = mpi_cuda_aware(&how);
    int want = mode == 1 || (mode == 0 && !aware);
    const char *absent = NULL;
    int ngpu = fake ? 1 : rk_mpi_gpu_count();
    if (want && !fake) {
        if (ngpu == 0)
            absent = "no GPU";
        else
            absent = driver_open();
    }
    int on = want && !why[0] && !absent;
    if (on && !fake) {
        stg_device = rk_mpi_gpu_current();
#if !HAVE_GPU
        on = 0;
        absent = "a build without CUDA or HIP";
#endif
    }

    /* Every rank learns whether any rank stages (then large host receives
     * must recognise headers) and whether any rank has a bad setting. */
    int mine[3] = {on, why[0] != 0, mode == 1 && !on && !why[0]}, all[3] = {0, 0, 0};
    if (PMPI_Allreduce(mine, all, 3, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
        memcpy(all, mine, sizeof all);
    int rank = 0;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (all[1]) {
        if (why[0])
            rk_mpi_warn("%s", why);
        else
            rk_mpi_warn("stopping: %d rank%s found a bad staging setting", all[1],
                        all[1] == 1 ? "" : "s");
        if (rank == 0)
            rk_mpi_warn("fix the setting, or unset it for the default; every rank exits with "
                        "status 1 (docs/staging.md)");
        fflush(stdout);
        fflush(stderr);
        PMPI_Finalize();
        exit(1);
    }
    if (mode == 1 && !on)
        rk_mpi_warn("RANKMEM_STAGING=on, but this rank cannot stage (%s): device buffers "
                    "cannot occur here, so MPI calls go straight to MPI",
                    absent ? absent : "unknown reason");
    rk_stg_on = on;
    rk_stg_active = all[0] > 0;
    if (rk_stg_active) {
        if (PMPI_Comm_dup(MPI_COMM_WORLD, &wcomm) != MPI_SUCCESS) {
            rk_mpi_warn("staging: MPI_Comm_dup failed: staging is off");
            rk_stg_on = rk_stg_active = 0;
            return;
        }
        PMPI_Comm_set_name(wcomm, "rankmem-staging");
        reserve = aligned_alloc(64, (chunk_bytes + 63) & ~(size_t)63);
        reserve_bytes = reserve ? chunk_bytes : 0;
        /* Errors come back to the calls: a segment dropped on purpose
         * (rk_stg_drain) ends in MPI_ERR_TRUNCATE, not in an abort. */
        PMPI_Comm_set_errhandler(wcomm, MPI_ERRORS_RETURN);
        progress_hook(1);
        int *ub = NULL, flag = 0;
        if (PMPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag &&
            ub && *ub > 0)
            tag_ub = *ub;
        rk_ipc_init(ipc_mode, ipc_cache, rk_stg_on);
    }
    rk_mpi_verbose("staging: %s (RANKMEM_STAGING=%s; MPI %s" RK_STG_AWARE " by %s%s%s); %d of the "
                   "job's ranks stage; pool %zu MiB in chunks of %zu KiB",
                   on ? "on" : "off", mode == 0 ? "auto" : mode == 1 ? "on" : "off",
                   aware ? "" : "not ", how, absent ? "; " : "", absent ? absent : "", all[0],
                   pool_bytes >> 20, chunk_bytes >> 10);
}

/* ---- MPI libraries without a progress hook (MPICH) ----
 * An IPC send whose receiver cannot map its memory sends the bytes when the
 * answer asks for them (proto_ipc.c). Its rank may by then sit in a blocking
 * call that the plugin passes straight to MPI (a host MPI_Allreduce, an
 * MPI_Barrier, the wait of a freed request's peer): with no hook in MPI's
 * progress engine, nothing of ours runs there, and the receiver waits for
 * ever. A helper thread advances such requests while any is pending (woken
 * when one is posted, asleep otherwise). It calls MPI, so it runs only where
 * MPI gives MPI_THREAD_MULTIPLE, which the plugin asks for under MPICH
 * (rk_stg_want_multiple). */
static pthread_t helper;
static int helper_state; /* 0 none, 1 running, -1 could not start; under helper_lock */
static int helper_stop;
int rk_stg_helper_allowed;
static pthread_mutex_t helper_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t helper_cond = PTHREAD_COND_INITIALIZER;

static void *helper_main(void *arg)
{
    (void)arg;
    /* Signals go to the program's threads. */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    pthread_mutex_lock(&helper_lock);
    while (!helper_stop) {
        if (atomic_load_explicit(&rk_stg_rings, memory_order_relaxed) == 0) {
            /* Timed: a post between the load and the wait is seen within 10 ms. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 10000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&helper_cond, &helper_lock, &ts);
            continue;
        }
        pthread_mutex_unlock(&helper_lock);
        rk_stg_ring_poll();
        struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&helper_lock);
    }
    pthread_mutex_unlock(&helper_lock);
    return NULL;
}

void rk_stg_helper_kick(void)
{
    if (!rk_stg_helper_allowed)
        return;
    pthread_mutex_lock(&helper_lock);
    if (helper_state == 0 && !helper_stop)
        helper_state = pthread_create(&helper, NULL, helper_main, NULL) == 0 ? 1 : -1;
    pthread_cond_signal(&helper_cond);
    pthread_mutex_unlock(&helper_lock);
}

static void helper_end(void)
{
    pthread_mutex_lock(&helper_lock);
    helper_stop = 1;
    int running = helper_state == 1;
    pthread_cond_signal(&helper_cond);
    pthread_mutex_unlock(&helper_lock);
    if (running)
        pthread_join(helper, NULL);
    rk_stg_helper_allowed = 0;
}

int rk_stg_want_multiple(int have_gpu)
{
#ifdef MPICH_VERSION
    const char *m = option("RANKMEM_STAGING");
    if (m && strcmp(m, "off") == 0)
        return 0;
    return have_gpu || fake || (m && strcmp(m, "on") == 0); /* fake: the tests' device */
#else
    (void)have_gpu; /* Open MPI's progress engine takes our hook */
    return 0;
#endif
}

/* Open MPI's progress engine takes callbacks (opal_progress_register, in
 * libopen-pal, found at run time: nothing to link): with ours there, ring
 * requests advance inside every MPI call that progresses, including blocking
 * calls the plugin does not cover. Other MPI libraries: no ring. */
typedef int (*opal_cb_t)(void);
static int opal_cb(void)
{
    if (atomic_load_explicit(&rk_stg_rings, memory_order_relaxed) == 0)
        return 0;
    return rk_stg_ring_poll();
}

static void progress_hook(int on)
{
    typedef int (*reg_fn)(opal_cb_t);
    if (on) {
        reg_fn reg = ring_wanted ? (reg_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "opal_progress_register")
                                 : NULL;
        if (reg && reg(opal_cb) == 0)
            rk_stg_hooked = 1;
        rk_mpi_verbose("staging: %s", rk_stg_hooked ? "ring mode (in Open MPI's progress engine)"
                                                    : "no ring mode (no progress hook)");
        if (!rk_stg_hooked) {
            int level = MPI_THREAD_SINGLE;
            rk_stg_helper_allowed = PMPI_Query_thread(&level) == MPI_SUCCESS &&
                             level == MPI_THREAD_MULTIPLE;
            rk_mpi_verbose("staging: %s", rk_stg_helper_allowed
                                              ? "a helper thread advances IPC sends that wait for "
                                                "their peer (MPI_THREAD_MULTIPLE)"
                                              : "no helper thread (MPI is not MPI_THREAD_MULTIPLE): "
                                                "a device send whose receiver cannot map its "
                                                "memory advances only in the sender's MPI calls "
                                                "on staged buffers");
        }
    } else if (!rk_stg_hooked) {
        helper_end();
    } else {
        reg_fn unreg = (reg_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "opal_progress_unregister");
        if (unreg)
            unreg(opal_cb);
        rk_stg_hooked = 0;
    }
}

void rk_mpi_staging_finalize(void)
{
    if (!rk_stg_active)
        return;
    rk_stg_p2p_finalize();
    rk_ipc_finalize();
    progress_hook(0);
    if (fake_async)
        fake_drain();
    pthread_mutex_lock(&pool_lock);
    int busy = 0;
    for (int i = 0; i < nchunks && chunk_used; i++)
        busy |= chunk_used[i];
    if (pool_state > 0 && !busy) {
        pinned_free(slab);
        slab = NULL;
        free(chunk_used);
        chunk_used = NULL;
        nchunks = 0;
        pool_state = 0;
    }
    for (int i = 0; i < CACHE_SLOTS; i++)
        if (!cache[i].busy) {
            pinned_free(cache[i].ptr);
            cache[i].ptr = NULL;
            cache[i].bytes = 0;
        }
    pthread_mutex_unlock(&pool_lock);
    pthread_mutex_lock(&reserve_mu);
    free(reserve);
    reserve = NULL;
    reserve_bytes = 0;
    pthread_mutex_unlock(&reserve_mu);
    if (wcomm != MPI_COMM_NULL)
        PMPI_Comm_free(&wcomm);
    /* Calls after this (between MPI_Finalize's report and PMPI_Finalize, or
     * none) go straight to MPI. */
    rk_stg_active = rk_stg_on = 0;
}
