/* Serving (issue 19, RANKMEM_INTERCEPT=cuda): the program's cudaMalloc,
 * cudaFree, cudaMallocAsync and cudaFreeAsync, answered by the rank's
 * resource (rankmem_mpi_resource(): stats>timing>pool>...), so that an
 * unmodified code that allocates in its time loop pays the pool's
 * bookkeeping instead of cudaMalloc's ~90 us.
 *
 * How calls get here: the plugin exports those names; loaded with
 * LD_PRELOAD (or linked before libcudart), it is found before the shared
 * CUDA runtime. A program linked with the static runtime (nvcc's default)
 * never calls these: observe.c notices and says so once.
 *
 * What goes to CUDA unchanged (the real function, found once with
 * dlsym(RTLD_NEXT)): everything while serving is off or the plugin is not
 * between MPI_Init and MPI_Finalize; rankmem's own allocations
 * (rk_obs_internal_depth > 0, or a caller inside librankmem*.so: its cuda
 * resource calls cudaMalloc, and that call lands here too); allocations on
 * a device that is not the rank's; NULL devPtr or size 0; any allocation
 * the resource refuses (then CUDA's own answer, and its error state, is the
 * program's). Frees: a pointer this file served goes back to the resource
 * (whenever it comes, after MPI_Finalize too: the rank's resource is never
 * released); any other, cudaFree(NULL) included, goes to CUDA, except the
 * address of one of the pool's chunks freed by the program (a served block
 * freed twice): refused, since CUDA would free the chunk under the pool.
 *
 * cudaStreamDestroy is wrapped too: the pool must forget a stream before
 * CUDA destroys it (blocks freed on it wait in a list of that stream).
 *
 * cudaIpcGetMemHandle of a served pointer is refused (cudaErrorInvalidValue
 * and a one-time message): the handle would describe the pool's chunk, so
 * the importer would map the chunk's base, not the block. docs/observe.md
 * says what else differs (a served cudaFree does not synchronise). */
#define _GNU_SOURCE
#include "plugin.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>


static int mode_cuda;        /* RANKMEM_INTERCEPT=cuda (set before PMPI_Init) */
static int active;           /* atomic: between MPI_Init's end and MPI_Finalize's start */
static rk_smap_t served_map; /* served pointer -> bytes */
/* While serving: what rankmem itself got from cudaMalloc/cudaMallocAsync
 * through here (the pool's chunks). The program's second cudaFree of a
 * served block would otherwise reach CUDA with the address of a chunk
 * (the first block of a chunk starts where the chunk does) and free the
 * chunk under the pool. */
static rk_smap_t own_map __attribute__((unused)); /* used by the CUDA build only */
static uint64_t n_served;    /* atomic */
static uint64_t n_forwarded[RK_ICPT_NREASONS]; /* atomic; [RK_ICPT_SERVE]: the resource refused */

int rk_icpt_parse_mode(const char *text)
{
    if (!text)
        return -1;
    if (strcmp(text, "none") == 0)
        return 0;
    if (strcmp(text, "cuda") == 0)
        return 1;
    return -1;
}

int rk_icpt_mode(void) { return mode_cuda; }

static void note_rank_context(void);

void rk_icpt_set_active(int on)
{
    if (on && mode_cuda)
        note_rank_context();
    __atomic_store_n(&active, on, __ATOMIC_RELEASE);
}

void rk_icpt_counters(uint64_t *live, uint64_t *served, uint64_t forwarded[RK_ICPT_NREASONS])
{
    if (live)
        *live = rk_smap_count(&served_map);
    if (served)
        *served = __atomic_load_n(&n_served, __ATOMIC_RELAXED);
    if (forwarded)
        for (int i = 0; i < RK_ICPT_NREASONS; i++)
            forwarded[i] = __atomic_load_n(&n_forwarded[i], __ATOMIC_RELAXED);
}

/* ---- rankmem's own code: calls from there are never served ---- */

#define MAX_RANGES 16
static rk_code_range_t ranges[MAX_RANGES];
static int nranges;

static void find_ours(void) { rk_code_ranges("/librankmem", ranges, &nranges, MAX_RANGES); }

static inline int caller_is_rankmem(const void *ra)
{
    return rk_in_ranges(ranges, nranges, (uintptr_t)ra);
}

#if HAVE_CUDA
#include <cuda_runtime_api.h>

/* Not declared by cuda_runtime_api.h unless the program asks for the
 * per-thread default stream; the runtime exports them. */
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream);

/* ---- the real functions ---- */

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);
typedef cudaError_t (*malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);
typedef cudaError_t (*ipc_fn)(cudaIpcMemHandle_t *, void *);
typedef cudaError_t (*get_device_fn)(int *);
typedef cudaError_t (*stream_destroy_fn)(cudaStream_t);
typedef cudaError_t (*set_device_fn)(int);

static struct {
    malloc_fn malloc;
    free_fn free;
    malloc_async_fn malloc_async, malloc_async_ptsz;
    free_async_fn free_async, free_async_ptsz;
    ipc_fn ipc_get;
    get_device_fn get_device;
    stream_destroy_fn stream_destroy;
    set_device_fn set_device;
} real;
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
    /* RTLD_NEXT: the first definition after this library in the lookup
     * order, the shared CUDA runtime the program (or this plugin) loaded. */
    real.malloc = (malloc_fn)dlsym(RTLD_NEXT, "cudaMalloc");
    real.free = (free_fn)dlsym(RTLD_NEXT, "cudaFree");
    real.malloc_async = (malloc_async_fn)dlsym(RTLD_NEXT, "cudaMallocAsync");
    real.malloc_async_ptsz = (malloc_async_fn)dlsym(RTLD_NEXT, "cudaMallocAsync_ptsz");
    real.free_async = (free_async_fn)dlsym(RTLD_NEXT, "cudaFreeAsync");
    real.free_async_ptsz = (free_async_fn)dlsym(RTLD_NEXT, "cudaFreeAsync_ptsz");
    real.ipc_get = (ipc_fn)dlsym(RTLD_NEXT, "cudaIpcGetMemHandle");
    real.get_device = (get_device_fn)dlsym(RTLD_NEXT, "cudaGetDevice");
    real.stream_destroy = (stream_destroy_fn)dlsym(RTLD_NEXT, "cudaStreamDestroy");
    real.set_device = (set_device_fn)dlsym(RTLD_NEXT, "cudaSetDevice");
    if (!nranges)
        find_ours();
}

static inline void need_real(void) { pthread_once(&real_once, resolve); }

void rk_icpt_configure(int on)
{
    mode_cuda = on;
    need_real();
}

/* ---- the decision ---- */

/* Whether the rank's device is current, asked of the driver: the calling
 * thread's current context is one read of the driver's (no lock, unlike
 * cudaGetDevice), and the rank's device is current exactly when that is its
 * primary context. Taken when serving starts (the context exists by then:
 * MPI_Init made the device current and the rank's resource used it). */
typedef int (*ctx_get_fn)(void **);
static ctx_get_fn ctx_get;
static void *rank_ctx;

static void note_rank_context(void)
{
    need_real();
    if (rankmem_mpi_device() < 0 || !real.free)
        return;
    /* the runtime loads the driver privately: not in the global scope */
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    ctx_get = driver ? (ctx_get_fn)dlsym(driver, "cuCtxGetCurrent") : NULL;
    void *c = NULL;
    int d = -1;
    /* cudaFree(NULL) makes sure the runtime's context is the current one */
    if (ctx_get && real.free(NULL) == cudaSuccess && real.get_device &&
        real.get_device(&d) == cudaSuccess && d == rankmem_mpi_device() && ctx_get(&c) == 0)
        rank_ctx = c;
}

static int current_device(void *arg)
{
    (void)arg;
    void *c = NULL;
    if (rank_ctx && ctx_get(&c) == 0 && c == rank_ctx)
        return rankmem_mpi_device();
    int d = -1;
    if (!real.get_device || real.get_device(&d) != cudaSuccess)
        return -1;
    return d;
}

static inline rk_icpt_route_t route(const void *ra, void **devPtr, size_t size,
                                    rankmem_resource_t **mr_p)
{
    if (!mode_cuda) /* the common case: one load */
        return RK_ICPT_FWD_OFF;
    *mr_p = rankmem_mpi_resource();
    rk_icpt_ctx_t c = {
        .mode_cuda = mode_cuda,
        .active = __atomic_load_n(&active, __ATOMIC_ACQUIRE),
        .internal_depth = rk_obs_internal_depth,
        .caller_is_rankmem = caller_is_rankmem(ra),
        .args_ok = devPtr != NULL && size > 0,
        .rank_device = rankmem_mpi_device(),
        .have_resource = *mr_p != NULL,
        .current_device = current_device,
    };
    return rk_icpt_route(&c);
}

/* Served alignment: what cudaMalloc guarantees. */
#define SERVED_ALIGNMENT ((size_t)256)

/* 0 with *devPtr set, or -1 (the resource refused: CUDA decides). */
static int serve(rankmem_resource_t *mr, void **devPtr, size_t size, cudaStream_t stream,
                 rk_obs_api_t api, const void *ra)
{
    void *p = NULL;
    rk_fail_defer++; /* a refusal here is not the rank's: CUDA is asked next */
    rankmem_status_t st =
        rankmem_allocate_async(mr, size, SERVED_ALIGNMENT, (rankmem_stream_t)stream, &p);
    rk_fail_defer--;
    if (st != RANKMEM_SUCCESS) {
        rankmem_clear_error();
        return -1;
    }
    if (rk_smap_insert(&served_map, (uintptr_t)p, size) != 0) {
        /* No host memory for the map (or, impossibly, a pointer served
         * twice): give the block back rather than lose track of it. */
        (void)rankmem_deallocate_async(mr, p, size, SERVED_ALIGNMENT, (rankmem_stream_t)stream);
        rankmem_clear_error();
        return -1;
    }
    /* The call site is the program's calling instruction, had for free: a
     * backtrace would cost ten times the served pair. */
    void *site = (void *)ra;
    rk_obs_alloc_at(RK_OBS_DEVICE, RK_OBS_SERVED, api, (uintptr_t)p, size, &site, 1);
    __atomic_fetch_add(&n_served, 1, __ATOMIC_RELAXED);
    *devPtr = p;
    return 0;
}

/* 1 when ptr was ours and went back to the resource. */
static int unserve(void *ptr, cudaStream_t stream)
{
    size_t bytes;
    /* Nothing served (serving off, or before the first): one load. */
    if (!ptr || rk_smap_count(&served_map) == 0)
        return 0;
    /* Out of the map first: once the resource has it back another thread
     * may be served the same address, and must find it free in the map. */
    if (!rk_smap_remove(&served_map, (uintptr_t)ptr, &bytes))
        return 0;
    rk_obs_free((uintptr_t)ptr);
    rankmem_resource_t *mr = rankmem_mpi_resource();
    /* The pool orders reuse with events of the rank's device: give the
     * block back with that device current (CUDA's cudaFree takes a pointer
     * of any device; a program may free while another one is current). */
    int dev = rankmem_mpi_device(), cur = current_device(NULL);
    int switched = dev >= 0 && cur >= 0 && cur != dev && real.set_device &&
                   real.set_device(dev) == cudaSuccess;
    if (mr &&
        rankmem_deallocate_async(mr, ptr, bytes, SERVED_ALIGNMENT, (rankmem_stream_t)stream) !=
            RANKMEM_SUCCESS) {
        rk_mpi_warn("served block %p (%zu bytes) could not go back to the rank's resource: %s",
                    ptr, bytes, rankmem_last_error());
        rankmem_clear_error();
    }
    if (switched)
        (void)real.set_device(cur);
    return 1;
}

/* A call from librankmem*.so is rankmem's own allocation, wherever it
 * comes from (the rank chain raises the depth itself; staging, sharing and
 * the OpenMP layer need not): observation records it as RK_OBS_RANKMEM. */
/* A free that is not of a served block: rankmem's own chunk freed by
 * rankmem leaves own_map and goes to CUDA; freed by the program (a double
 * free of a served block, or a stray pointer) it is refused. 1 when
 * refused. */
static int foreign_free_of_ours(const void *ra, void *ptr)
{
    if (!ptr || rk_smap_count(&own_map) == 0 || !rk_smap_find(&own_map, (uintptr_t)ptr, NULL))
        return 0;
    if (caller_is_rankmem(ra) || rk_obs_internal_depth > 0) {
        (void)rk_smap_remove(&own_map, (uintptr_t)ptr, NULL);
        return 0;
    }
    static int said; /* atomic */
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        rk_mpi_warn("cudaFree(%p): refused (cudaErrorInvalidValue): that address is memory of "
                    "rankmem's pool (RANKMEM_INTERCEPT=cuda), not a live block of the program "
                    "(a block freed twice?); further such frees are refused silently", ptr);
    return 1;
}

static cudaError_t forward_malloc(rk_icpt_route_t why, const void *ra, void **devPtr, size_t size)
{
    if (why != RK_ICPT_FWD_OFF) /* serving off: not even a shared counter on the way */
        __atomic_fetch_add(&n_forwarded[why], 1, __ATOMIC_RELAXED);
    if (!real.malloc)
        return cudaErrorInitializationError; /* no CUDA runtime in the process */
    int ours = caller_is_rankmem(ra);
    rk_obs_internal_depth += ours;
    rk_obs_caller = ra;
    rk_obs_caller_api = RK_OBS_API_CUDA_MALLOC;
    cudaError_t e = real.malloc(devPtr, size);
    rk_obs_caller = NULL;
    rk_obs_internal_depth -= ours;
    if (e == cudaSuccess && mode_cuda && (ours || rk_obs_internal_depth > 0))
        (void)rk_smap_insert(&own_map, (uintptr_t)*devPtr, size); /* best effort */
    return e;
}

static cudaError_t forward_malloc_async(rk_icpt_route_t why, const void *ra, malloc_async_fn fn,
                                        void **devPtr, size_t size, cudaStream_t stream)
{
    if (why != RK_ICPT_FWD_OFF)
        __atomic_fetch_add(&n_forwarded[why], 1, __ATOMIC_RELAXED);
    if (!fn)
        return cudaErrorInitializationError;
    int ours = caller_is_rankmem(ra);
    rk_obs_internal_depth += ours;
    rk_obs_caller = ra;
    rk_obs_caller_api = RK_OBS_API_CUDA_MALLOC_ASYNC;
    cudaError_t e = fn(devPtr, size, stream);
    rk_obs_caller = NULL;
    rk_obs_internal_depth -= ours;
    if (e == cudaSuccess && mode_cuda && (ours || rk_obs_internal_depth > 0))
        (void)rk_smap_insert(&own_map, (uintptr_t)*devPtr, size);
    return e;
}

/* ---- the exported entry points ---- */

RK_MPI_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    const void *ra = __builtin_return_address(0);
    need_real();
    rankmem_resource_t *mr = NULL;
    rk_icpt_route_t r = route(ra, devPtr, size, &mr);
    if (r == RK_ICPT_SERVE && serve(mr, devPtr, size, NULL, RK_OBS_API_CUDA_MALLOC, ra) == 0)
        return cudaSuccess;
    return forward_malloc(r, ra, devPtr, size);
}

RK_MPI_EXPORT cudaError_t cudaFree(void *devPtr)
{
    need_real();
    /* Served blocks are ordered on the legacy default stream, as cudaMalloc's
     * memory would be after cudaFree's device-wide synchronisation. */
    if (unserve(devPtr, NULL))
        return cudaSuccess;
    if (foreign_free_of_ours(__builtin_return_address(0), devPtr))
        return cudaErrorInvalidValue;
    if (!real.free)
        return cudaErrorInitializationError;
    return real.free(devPtr);
}

RK_MPI_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
    const void *ra = __builtin_return_address(0);
    need_real();
    rankmem_resource_t *mr = NULL;
    rk_icpt_route_t r = route(ra, devPtr, size, &mr);
    if (r == RK_ICPT_SERVE &&
        serve(mr, devPtr, size, stream, RK_OBS_API_CUDA_MALLOC_ASYNC, ra) == 0)
        return cudaSuccess;
    return forward_malloc_async(r, ra, real.malloc_async, devPtr, size, stream);
}

RK_MPI_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
    need_real();
    if (unserve(devPtr, stream))
        return cudaSuccess;
    if (foreign_free_of_ours(__builtin_return_address(0), devPtr))
        return cudaErrorInvalidValue;
    if (!real.free_async)
        return cudaErrorInitializationError;
    return real.free_async(devPtr, stream);
}

/* The same for programs built with --default-stream per-thread: their
 * stream 0 is the calling thread's default stream. */
static inline cudaStream_t ptsz(cudaStream_t s) { return s ? s : cudaStreamPerThread; }

RK_MPI_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t stream)
{
    const void *ra = __builtin_return_address(0);
    need_real();
    rankmem_resource_t *mr = NULL;
    rk_icpt_route_t r = route(ra, devPtr, size, &mr);
    if (r == RK_ICPT_SERVE &&
        serve(mr, devPtr, size, ptsz(stream), RK_OBS_API_CUDA_MALLOC_ASYNC, ra) == 0)
        return cudaSuccess;
    return forward_malloc_async(r, ra, real.malloc_async_ptsz, devPtr, size, stream);
}

RK_MPI_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t stream)
{
    need_real();
    if (unserve(devPtr, ptsz(stream)))
        return cudaSuccess;
    if (foreign_free_of_ours(__builtin_return_address(0), devPtr))
        return cudaErrorInvalidValue;
    if (!real.free_async_ptsz)
        return cudaErrorInitializationError;
    return real.free_async_ptsz(devPtr, stream);
}

/* The pool keeps blocks freed on a stream in a list of that stream, with
 * an event recorded on it; a destroyed stream (whose handle CUDA may give
 * to the next stream created) must leave the pool first. An unmodified
 * program does not know to call rankmem_resource_forget_stream: done here,
 * once anything was served (the pool waits for the stream's work if it
 * holds blocks of it; otherwise it is a look in each shard). */
RK_MPI_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    need_real();
    rankmem_resource_t *mr;
    if (stream && __atomic_load_n(&n_served, __ATOMIC_RELAXED) && (mr = rankmem_mpi_resource()) &&
        rankmem_resource_forget_stream(mr, (rankmem_stream_t)stream) != RANKMEM_SUCCESS)
        rankmem_clear_error(); /* a chain without per-stream lists: nothing to forget */
    if (!real.stream_destroy)
        return cudaErrorInitializationError;
    return real.stream_destroy(stream);
}

RK_MPI_EXPORT cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    static int said; /* atomic */
    need_real();
    if (devPtr && rk_smap_count(&served_map) && rk_smap_find(&served_map, (uintptr_t)devPtr, NULL)) {
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            rk_mpi_warn("cudaIpcGetMemHandle(%p): refused (cudaErrorInvalidValue): the block was "
                        "served by rankmem's pool (RANKMEM_INTERCEPT=cuda) and a handle would "
                        "give another process the pool's chunk, not the block; allocate blocks "
                        "to share with cuMemAlloc (never served), or run with "
                        "RANKMEM_INTERCEPT=none (docs/observe.md)",
                        devPtr);
        return cudaErrorInvalidValue;
    }
    if (!real.ipc_get)
        return cudaErrorInitializationError;
    return real.ipc_get(handle, devPtr);
}

#else /* !HAVE_CUDA: nothing to serve; nothing exported */

static void note_rank_context(void) {}

void rk_icpt_configure(int on)
{
    mode_cuda = on;
    if (!nranges)
        find_ours();
}

#endif
