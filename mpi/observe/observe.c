/* Observation's CUPTI source (issue 19): every device, managed, pinned-host
 * and VMM-mapped allocation and free of the process, from the runtime and
 * driver API callbacks of CUPTI, fed to the recorder (recorder.h).
 *
 * - CUPTI is dlopened (mpi/observe/cupti_find.h) and every cupti* function resolved
 *   with dlsym: the plugin has no link-time dependency on it, and a build
 *   without cupti.h compiles this file to "unavailable".
 * - Callbacks are enabled per callback id, not per domain: a domain would
 *   call us at every kernel launch and copy.
 * - A runtime call runs driver calls underneath (cudaMalloc: cuMemAlloc_v2):
 *   a thread-local depth, raised at a runtime callback's ENTER and lowered
 *   at its EXIT, makes the driver callbacks under it count for nothing, so
 *   that a call seen at both levels counts once. A program (or library) that
 *   calls the driver itself is seen at the driver level.
 * - Allocations are recorded at EXIT, when the call returned success (the
 *   pointer exists only then). Frees are recorded at ENTER: once CUDA has the
 *   address back, another thread's allocation may get it and record it
 *   before this free's EXIT would run, and the late free would drop the new
 *   block.
 * - The source is RK_OBS_RANKMEM while rk_obs_internal_depth > 0 (rankmem's
 *   own upstream calls: the timing layer raises it), else RK_OBS_PROGRAM;
 *   blocks served by the interposer are recorded there, as RK_OBS_SERVED.
 *
 * Cost: a callback is a switch and a few loads; the recorder does the rest.
 * Nothing here allocates or takes a lock. */
#define _GNU_SOURCE
#include "plugin.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cupti_find.h"

#if HAVE_CUDA && HAVE_CUPTI_H
#define RK_HAVE_CUPTI 1
#include <cupti.h>
#else
#define RK_HAVE_CUPTI 0
#endif

/* ---- state (written at start and stop, by the thread in MPI_Init/Finalize) ---- */

static int started;         /* rk_observe_start ran */
static int recorder_on;     /* rk_obs_init succeeded: rk_obs_fini at stop */
static int wanted;          /* observation was asked for on this rank (on, or auto with a GPU) */
static int subscribed;      /* CUPTI callbacks are on (until rk_observe_stop) */
static int observed;        /* they were turned on at start */
static char unavailable_why[200];

int rk_observe_parse_mode(const char *text)
{
    if (!text)
        return -1;
    if (strcmp(text, "auto") == 0)
        return RK_OBSERVE_AUTO;
    if (strcmp(text, "on") == 0)
        return RK_OBSERVE_ON;
    if (strcmp(text, "off") == 0)
        return RK_OBSERVE_OFF;
    return -1;
}

int rk_observe_unavailable(char *why, size_t cap)
{
    if (!wanted || observed)
        return 0;
    if (why && cap)
        snprintf(why, cap, "%s", unavailable_why);
    return 1;
}

/* ---- the static-runtime note (serving cannot reach a static runtime) ---- */

/* Set by the callback when a runtime cudaMalloc/cudaMallocAsync of the
 * program itself did not pass through the interposer. */
static int static_main_seen;  /* atomic */
static int static_note_done;  /* atomic: printed (or not to be printed) */

static void static_note_print(void)
{
    if (rk_mpi_world_rank() != 0)
        return;
    if (__atomic_exchange_n(&static_note_done, 1, __ATOMIC_ACQ_REL))
        return;
    rk_mpi_warn("RANKMEM_INTERCEPT=cuda: this program's CUDA runtime is linked statically; its "
                "cudaMalloc cannot be served (build with -cudart shared); observation goes on");
}

void rk_observe_after_init(void)
{
    if (__atomic_load_n(&static_main_seen, __ATOMIC_ACQUIRE))
        static_note_print();
}

#if RK_HAVE_CUPTI

static int static_checks;     /* atomic: backtraces taken so far (bounded) */
#define STATIC_CHECKS_MAX 32

/* The main program's code: a static CUDA runtime in it is the program's. */
typedef struct {
    uintptr_t lo, hi;
} range_t;

static int main_range_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    range_t *r = (range_t *)data;
    /* The first object is the main program. */
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X))
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (!r->lo || lo < r->lo)
            r->lo = lo;
        if (hi > r->hi)
            r->hi = hi;
    }
    return 1;
}

static int skipped_object(const char *path)
{
    static const char *const skip[] = {"libcupti", "libcuda.so", "libcudart", "librankmem",
                                       "libc.so", "libgcc_s"};
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
        if (strstr(path, skip[i]))
            return 1;
    return 0;
}

/* A runtime cudaMalloc/cudaMallocAsync that did not pass through the
 * interposer while serving is on: whose runtime made it? The first frame
 * outside CUPTI, the driver, the shared runtime and rankmem is code of the
 * object that holds the static runtime. The program's: the note (once,
 * rank 0). A library's (cuBLAS links the runtime statically): observed,
 * never served, and said only with RANKMEM_MPI_VERBOSE. Bounded: a few
 * backtraces at most, then nothing. */
static void static_runtime_check(void)
{
    if (__atomic_load_n(&static_main_seen, __ATOMIC_RELAXED) ||
        __atomic_fetch_add(&static_checks, 1, __ATOMIC_RELAXED) >= STATIC_CHECKS_MAX)
        return;
    void *frames[24];
    int n = backtrace(frames, 24);
    range_t main_code = {0, 0};
    dl_iterate_phdr(main_range_cb, &main_code);
    for (int i = 1; i < n; i++) {
        uintptr_t pc = (uintptr_t)frames[i];
        if (pc >= main_code.lo && pc < main_code.hi) {
            __atomic_store_n(&static_main_seen, 1, __ATOMIC_RELEASE);
            if (rk_mpi_world_rank() >= 0)
                static_note_print();
            return;
        }
        Dl_info di;
        if (!dladdr(frames[i], &di) || !di.dli_fname)
            continue;
        if (skipped_object(di.dli_fname))
            continue;
        rk_mpi_verbose("RANKMEM_INTERCEPT=cuda: %s calls a CUDA runtime of its own (linked "
                       "statically): its cudaMalloc is observed, not served", di.dli_fname);
        return;
    }
}

/* ---- CUPTI, resolved at run time ---- */

typedef CUptiResult (*subscribe_fn)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *);
typedef CUptiResult (*subscribe_v2_fn)(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *,
                                       CUpti_SubscriberParams *);
typedef CUptiResult (*unsubscribe_fn)(CUpti_SubscriberHandle);
typedef CUptiResult (*enable_fn)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain,
                                 CUpti_CallbackId);
typedef CUptiResult (*result_string_fn)(CUptiResult, const char **);

static struct {
    void *lib;
    subscribe_fn subscribe;
    subscribe_v2_fn subscribe_v2; /* CUDA 12.? and later: names the tool already subscribed */
    unsubscribe_fn unsubscribe;
    enable_fn enable;
    result_string_fn result_string;
    CUpti_SubscriberHandle sub;
} cupti;

static const char *result_text(CUptiResult r)
{
    const char *s = NULL;
    if (cupti.result_string && cupti.result_string(r, &s) == CUPTI_SUCCESS && s)
        return s;
    return "unknown CUPTI error";
}

/* ---- the callback ---- */

/* Runtime alloc/free calls under way on this thread (the dedup depth). */
static __thread int rt_depth __attribute__((tls_model("initial-exec")));

static inline rk_obs_source_t source_now(void)
{
    return rk_obs_internal_depth > 0 ? RK_OBS_RANKMEM : RK_OBS_PROGRAM;
}

static inline void record(rk_obs_kind_t kind, rk_obs_api_t api, const void *ptr, uint64_t bytes)
{
    if (ptr && bytes)
        rk_obs_alloc(kind, source_now(), api, (uintptr_t)ptr, bytes);
}

/* A stream-ordered allocation costs ~1.5 us: a backtrace (2 to 5 us on the
 * H100 machine, through CUPTI's and the driver's frames) would cost more
 * than the call. Its call site is the program's calling instruction when
 * rankmem's interposed entry point passed the call on (a shared runtime),
 * with the API the program named; none otherwise. */
static inline void record_light(rk_obs_kind_t kind, rk_obs_api_t api, const void *ptr,
                                uint64_t bytes)
{
    if (!ptr || !bytes)
        return;
    void *ra = (void *)rk_obs_caller;
    if (ra && rk_obs_caller_api)
        api = (rk_obs_api_t)rk_obs_caller_api;
    rk_obs_alloc_at(kind, source_now(), api, (uintptr_t)ptr, bytes, &ra, ra ? 1 : 0);
}

static inline void forget(const void *ptr)
{
    if (ptr)
        (void)rk_obs_free((uintptr_t)ptr);
}

/* cuMemUnmap(ptr, size) may cover several ranges mapped one by one
 * (expandable segments map granule by granule): free them in turn. */
static void forget_range(uintptr_t ptr, size_t size)
{
    uintptr_t end = ptr + size;
    while (ptr && ptr < end) {
        uint64_t n = rk_obs_free(ptr);
        if (!n)
            break; /* counted as unmatched once; nothing known beyond */
        ptr += n;
    }
}

static void runtime_enter(CUpti_CallbackId cbid, const void *params)
{
    switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020:
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020:
        if (!rk_obs_caller && rk_obs_internal_depth == 0 && rk_icpt_mode())
            static_runtime_check();
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020:
        forget(((const cudaFree_v3020_params *)params)->devPtr);
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020:
        forget(((const cudaFreeAsync_v11020_params *)params)->devPtr);
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_ptsz_v11020:
        forget(((const cudaFreeAsync_ptsz_v11020_params *)params)->devPtr);
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020:
        forget(((const cudaFreeHost_v3020_params *)params)->ptr);
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaHostUnregister_v4000:
        forget(((const cudaHostUnregister_v4000_params *)params)->ptr);
        break;
    default:
        break;
    }
}

static void runtime_exit(CUpti_CallbackId cbid, const void *params)
{
    switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020: {
        const cudaMalloc_v3020_params *p = params;
        if (p->devPtr)
            record(RK_OBS_DEVICE, RK_OBS_API_CUDA_MALLOC, *p->devPtr, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020: {
        const cudaMallocAsync_v11020_params *p = params;
        if (p->devPtr)
            record_light(RK_OBS_DEVICE, RK_OBS_API_CUDA_MALLOC_ASYNC, *p->devPtr, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_ptsz_v11020: {
        const cudaMallocAsync_ptsz_v11020_params *p = params;
        if (p->devPtr)
            record_light(RK_OBS_DEVICE, RK_OBS_API_CUDA_MALLOC_ASYNC, *p->devPtr, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_v11020: {
        const cudaMallocFromPoolAsync_v11020_params *p = params;
        if (p->ptr)
            record_light(RK_OBS_DEVICE, RK_OBS_API_CUDA_MALLOC_FROM_POOL_ASYNC, *p->ptr, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocFromPoolAsync_ptsz_v11020: {
        const cudaMallocFromPoolAsync_ptsz_v11020_params *p = params;
        if (p->ptr)
            record_light(RK_OBS_DEVICE, RK_OBS_API_CUDA_MALLOC_FROM_POOL_ASYNC, *p->ptr, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000: {
        const cudaMallocManaged_v6000_params *p = params;
        if (p->devPtr)
            record(RK_OBS_MANAGED, RK_OBS_API_CUDA_MALLOC_MANAGED, *p->devPtr, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020: {
        const cudaMallocHost_v3020_params *p = params;
        if (p->ptr)
            record(RK_OBS_PINNED, RK_OBS_API_CUDA_MALLOC_HOST, *p->ptr, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020: {
        const cudaHostAlloc_v3020_params *p = params;
        if (p->pHost)
            record(RK_OBS_PINNED, RK_OBS_API_CUDA_HOST_ALLOC, *p->pHost, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaHostRegister_v4000: {
        const cudaHostRegister_v4000_params *p = params;
        record(RK_OBS_PINNED, RK_OBS_API_CUDA_HOST_REGISTER, p->ptr, p->size);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020: {
        const cudaMallocPitch_v3020_params *p = params;
        if (p->devPtr && p->pitch)
            record(RK_OBS_DEVICE, RK_OBS_API_CUDA_MALLOC_PITCH, *p->devPtr,
                   (uint64_t)*p->pitch * p->height);
        break;
    }
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020: {
        const cudaMalloc3D_v3020_params *p = params;
        if (p->pitchedDevPtr)
            record(RK_OBS_DEVICE, RK_OBS_API_CUDA_MALLOC_3D, p->pitchedDevPtr->ptr,
                   (uint64_t)p->pitchedDevPtr->pitch * p->extent.height *
                       (p->extent.depth ? p->extent.depth : 1));
        break;
    }
    default:
        break;
    }
}

static void driver_enter(CUpti_CallbackId cbid, const void *params)
{
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
        forget((const void *)(uintptr_t)((const cuMemFree_v2_params *)params)->dptr);
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync:
        forget((const void *)(uintptr_t)((const cuMemFreeAsync_params *)params)->dptr);
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz:
        forget((const void *)(uintptr_t)((const cuMemFreeAsync_ptsz_params *)params)->dptr);
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost:
        forget(((const cuMemFreeHost_params *)params)->p);
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister:
        forget(((const cuMemHostUnregister_params *)params)->p);
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap: {
        const cuMemUnmap_params *p = params;
        forget_range((uintptr_t)p->ptr, p->size);
        break;
    }
    default:
        break;
    }
}

static void driver_exit(CUpti_CallbackId cbid, const void *params)
{
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2: {
        const cuMemAlloc_v2_params *p = params;
        if (p->dptr)
            record(RK_OBS_DEVICE, RK_OBS_API_CU_MEM_ALLOC, (const void *)(uintptr_t)*p->dptr,
                   p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync: {
        const cuMemAllocAsync_params *p = params;
        if (p->dptr)
            record_light(RK_OBS_DEVICE, RK_OBS_API_CU_MEM_ALLOC_ASYNC,
                   (const void *)(uintptr_t)*p->dptr, p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz: {
        const cuMemAllocAsync_ptsz_params *p = params;
        if (p->dptr)
            record_light(RK_OBS_DEVICE, RK_OBS_API_CU_MEM_ALLOC_ASYNC,
                   (const void *)(uintptr_t)*p->dptr, p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync: {
        const cuMemAllocFromPoolAsync_params *p = params;
        if (p->dptr)
            record_light(RK_OBS_DEVICE, RK_OBS_API_CU_MEM_ALLOC_ASYNC,
                   (const void *)(uintptr_t)*p->dptr, p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz: {
        const cuMemAllocFromPoolAsync_ptsz_params *p = params;
        if (p->dptr)
            record_light(RK_OBS_DEVICE, RK_OBS_API_CU_MEM_ALLOC_ASYNC,
                   (const void *)(uintptr_t)*p->dptr, p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged: {
        const cuMemAllocManaged_params *p = params;
        if (p->dptr)
            record(RK_OBS_MANAGED, RK_OBS_API_CU_MEM_ALLOC_MANAGED,
                   (const void *)(uintptr_t)*p->dptr, p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2: {
        const cuMemAllocPitch_v2_params *p = params;
        if (p->dptr && p->pPitch)
            record(RK_OBS_DEVICE, RK_OBS_API_CU_MEM_ALLOC_PITCH,
                   (const void *)(uintptr_t)*p->dptr, (uint64_t)*p->pPitch * p->Height);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2: {
        const cuMemAllocHost_v2_params *p = params;
        if (p->pp)
            record(RK_OBS_PINNED, RK_OBS_API_CU_MEM_HOST_ALLOC, *p->pp, p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc: {
        const cuMemHostAlloc_params *p = params;
        if (p->pp)
            record(RK_OBS_PINNED, RK_OBS_API_CU_MEM_HOST_ALLOC, *p->pp, p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister_v2: {
        const cuMemHostRegister_v2_params *p = params;
        /* No API of its own in the recorder's list: "other". */
        record(RK_OBS_PINNED, RK_OBS_API_OTHER, p->p, p->bytesize);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemMap: {
        /* cuMemCreate makes a physical handle, not addressable memory; the
         * mapping is what a program uses (and what cuMemUnmap ends). */
        const cuMemMap_params *p = params;
        record(RK_OBS_VMM, RK_OBS_API_CU_MEM_MAP, (const void *)(uintptr_t)p->ptr, p->size);
        break;
    }
    default:
        break;
    }
}

/* An allocation CUDA refused for lack of memory: the rank's failure
 * record (failure.c; weak, so that the callback's unit test links this
 * file alone and may catch it). Not when rankmem's own code asked: its
 * chain reports its own refusals. */
#pragma weak rk_fail_oom
static void runtime_oom(CUpti_CallbackId cbid, const void *params)
{
    uint64_t bytes = 0;
    int api;
    switch (cbid) {
    case CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020:
        bytes = ((const cudaMalloc_v3020_params *)params)->size;
        api = RK_OBS_API_CUDA_MALLOC;
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000:
        bytes = ((const cudaMallocManaged_v6000_params *)params)->size;
        api = RK_OBS_API_CUDA_MALLOC_MANAGED;
        break;
    case CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020: {
        const cudaMallocPitch_v3020_params *p = params;
        bytes = (uint64_t)p->width * p->height;
        api = RK_OBS_API_CUDA_MALLOC_PITCH;
        break;
    }
    default:
        return;
    }
    if (rk_fail_oom && rk_obs_internal_depth == 0)
        rk_fail_oom(api, "observed", bytes, 0, NULL, 0);
}

static void driver_oom(CUpti_CallbackId cbid, const void *params)
{
    uint64_t bytes = 0, stream = 0;
    int api = RK_OBS_API_CU_MEM_ALLOC;
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2:
        bytes = ((const cuMemAlloc_v2_params *)params)->bytesize;
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync: {
        const cuMemAllocAsync_params *p = params;
        bytes = p->bytesize;
        stream = (uint64_t)(uintptr_t)p->hStream;
        api = rk_obs_caller_api ? rk_obs_caller_api : RK_OBS_API_CU_MEM_ALLOC_ASYNC;
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz: {
        const cuMemAllocAsync_ptsz_params *p = params;
        bytes = p->bytesize;
        stream = (uint64_t)(uintptr_t)p->hStream;
        api = rk_obs_caller_api ? rk_obs_caller_api : RK_OBS_API_CU_MEM_ALLOC_ASYNC;
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged:
        bytes = ((const cuMemAllocManaged_params *)params)->bytesize;
        api = RK_OBS_API_CU_MEM_ALLOC_MANAGED;
        break;
    default:
        return;
    }
    if (rk_fail_oom && rk_obs_internal_depth == 0)
        rk_fail_oom(api, "observed", bytes, stream, NULL, 0);
}

static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain,
                                 CUpti_CallbackId cbid, const void *cbdata)
{
    (void)userdata;
    const CUpti_CallbackData *d = cbdata;
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        if (d->callbackSite == CUPTI_API_ENTER) {
            rt_depth++;
            runtime_enter(cbid, d->functionParams);
            return;
        }
        /* An EXIT without its ENTER (callbacks enabled mid-call) leaves the
         * depth at 0. */
        if (rt_depth > 0)
            rt_depth--;
        if (d->functionReturnValue && *(const cudaError_t *)d->functionReturnValue == cudaSuccess)
            runtime_exit(cbid, d->functionParams);
        else if (d->functionReturnValue &&
                 *(const cudaError_t *)d->functionReturnValue == cudaErrorMemoryAllocation)
            runtime_oom(cbid, d->functionParams);
        return;
    }
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || rt_depth > 0)
        return; /* under a runtime call: counted there */
    if (d->callbackSite == CUPTI_API_ENTER)
        driver_enter(cbid, d->functionParams);
    else if (d->functionReturnValue && *(const CUresult *)d->functionReturnValue == CUDA_SUCCESS)
        driver_exit(cbid, d->functionParams);
    else if (d->functionReturnValue &&
             *(const CUresult *)d->functionReturnValue == CUDA_ERROR_OUT_OF_MEMORY)
        driver_oom(cbid, d->functionParams);
}

/* tests/observe_unit/callback.t feeds the callback by hand, as CUPTI would. */
void rk_observe_test_callback(int domain, unsigned cbid, int enter, const void *params,
                              const void *retval)
{
    CUpti_CallbackData d;
    memset(&d, 0, sizeof d);
    d.callbackSite = enter ? CUPTI_API_ENTER : CUPTI_API_EXIT;
    d.functionParams = params;
    d.functionReturnValue = (void *)(uintptr_t)retval;
    on_callback(NULL, (CUpti_CallbackDomain)domain, (CUpti_CallbackId)cbid, &d);
}

/* The stream-ordered calls (cudaMallocAsync, cudaMallocFromPoolAsync,
 * cudaFreeAsync) are seen at the driver level only: each CUPTI callback
 * costs ~100 ns, and a runtime call with its nested driver call would fire
 * four per call where two do (measured on the H100 machine: the dispatch
 * alone added 0.7 to 1.1 us to a ~1.5 us pair with both levels on). */
static const CUpti_CallbackId runtime_cbids[] = {
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocHost_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaHostRegister_v4000,
    CUPTI_RUNTIME_TRACE_CBID_cudaHostUnregister_v4000,
    CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020,
    CUPTI_RUNTIME_TRACE_CBID_cudaMalloc3D_v3020,
};

static const CUpti_CallbackId driver_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc,
    CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost,
    CUPTI_DRIVER_TRACE_CBID_cuMemHostRegister_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemHostUnregister,
    CUPTI_DRIVER_TRACE_CBID_cuMemMap,
    CUPTI_DRIVER_TRACE_CBID_cuMemUnmap,
};

/* The first "; "-separated note of cupti_find's reasons, and how many more. */
static void first_reason(const char *all, char *out, size_t cap)
{
    const char *semi = strstr(all, "; ");
    int more = 0;
    for (const char *s = all; (s = strstr(s, "; ")) != NULL; s += 2)
        more++;
    if (!semi)
        snprintf(out, cap, "%.*s", cap ? (int)cap - 1 : 0, all); /* cut to fit, knowingly */
    else
        snprintf(out, cap, "%.*s, and %d other place%s", (int)(semi - all), all, more,
                 more == 1 ? "" : "s");
}

/* 0, or -1 with why. */
static int cupti_start(char *why, size_t cap)
{
    char path[1024], tried[1024];
    cupti.lib = rk_cupti_dlopen(path, sizeof path, tried, sizeof tried);
    if (!cupti.lib) {
        char first[140];
        first_reason(tried, first, sizeof first);
        snprintf(why, cap, "CUPTI not found (%s); set RANKMEM_CUPTI_LIB", first);
        return -1;
    }
    cupti.subscribe = (subscribe_fn)dlsym(cupti.lib, "cuptiSubscribe");
    cupti.subscribe_v2 = (subscribe_v2_fn)dlsym(cupti.lib, "cuptiSubscribe_v2");
    cupti.unsubscribe = (unsubscribe_fn)dlsym(cupti.lib, "cuptiUnsubscribe");
    cupti.enable = (enable_fn)dlsym(cupti.lib, "cuptiEnableCallback");
    cupti.result_string = (result_string_fn)dlsym(cupti.lib, "cuptiGetResultString");
    if (!cupti.subscribe || !cupti.unsubscribe || !cupti.enable) {
        snprintf(why, cap, "CUPTI at %s lacks the callback API", path);
        return -1;
    }
    rk_mpi_verbose("observation: CUPTI from %s", path);

    /* The recorder must not make call sites of these objects' frames. */
    rk_obs_skip_objects("libcupti");
    rk_obs_skip_objects("libcuda.so");
    rk_obs_skip_objects("libcudart");
    rk_obs_skip_objects("librankmem");

    CUptiResult r;
    char other[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN + 64] = "";
    if (cupti.subscribe_v2) {
        CUpti_SubscriberParams p;
        memset(&p, 0, sizeof p);
        p.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
        p.subscriberName = "rankmem";
        p.oldSubscriberName = other;
        p.oldSubscriberSize = sizeof other;
        r = cupti.subscribe_v2(&cupti.sub, on_callback, NULL, &p);
    } else {
        r = cupti.subscribe(&cupti.sub, on_callback, NULL);
    }
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
        other[sizeof other - 1] = '\0';
        snprintf(why, cap, "CUPTI is in use by another tool: %s",
                 other[0] ? other : "another tool");
        return -1;
    }
    if (r != CUPTI_SUCCESS) {
        snprintf(why, cap, "cuptiSubscribe: %s", result_text(r));
        return -1;
    }
    for (size_t i = 0; i < sizeof runtime_cbids / sizeof runtime_cbids[0]; i++)
        if ((r = cupti.enable(1, cupti.sub, CUPTI_CB_DOMAIN_RUNTIME_API, runtime_cbids[i])) !=
            CUPTI_SUCCESS)
            break;
    for (size_t i = 0; r == CUPTI_SUCCESS && i < sizeof driver_cbids / sizeof driver_cbids[0];
         i++)
        r = cupti.enable(1, cupti.sub, CUPTI_CB_DOMAIN_DRIVER_API, driver_cbids[i]);
    if (r != CUPTI_SUCCESS) {
        snprintf(why, cap, "cuptiEnableCallback: %s", result_text(r));
        cupti.unsubscribe(cupti.sub);
        return -1;
    }
    return 0;
}

static void cupti_stop(void)
{
    if (cupti.unsubscribe)
        cupti.unsubscribe(cupti.sub);
    /* The library stays loaded: CUPTI does not support being unloaded. */
}

#else /* !RK_HAVE_CUPTI */

static int cupti_start(char *why, size_t cap)
{
#if HAVE_CUDA
    snprintf(why, cap, "rankmem was built without CUPTI's headers (cupti.h)");
#else
    snprintf(why, cap, "rankmem was built without CUDA");
#endif
    return -1;
}

static void cupti_stop(void) {}

#endif /* RK_HAVE_CUPTI */

/* ---- start and stop ---- */

static void start_recorder(int backtrace, size_t max_blocks)
{
    rk_obs_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.max_blocks = max_blocks;
    cfg.backtrace_depth = backtrace;
    recorder_on = rk_obs_init(&cfg) == 0;
}

void rk_observe_start(int mode, int have_gpu, int backtrace, size_t max_blocks)
{
    if (started)
        return;
    started = 1;
    if (mode == RK_OBSERVE_OFF) {
        rk_obs_set_state(RK_OBS_OFF, "RANKMEM_OBSERVE=off");
        return;
    }
    if (!have_gpu && mode == RK_OBSERVE_AUTO) {
        /* Nothing to observe and nobody asked. */
        rk_obs_set_state(RK_OBS_OFF, "no GPU (RANKMEM_OBSERVE=auto)");
        return;
    }
    wanted = 1;
    start_recorder(backtrace, max_blocks);
    if (!recorder_on) {
        snprintf(unavailable_why, sizeof unavailable_why,
                 "no memory for the recorder's tables (RANKMEM_OBSERVE_MAX_BLOCKS=%zu)",
                 max_blocks);
        rk_obs_set_state(RK_OBS_UNAVAILABLE, unavailable_why);
        return; /* every feed is a no-op */
    }
    if (!have_gpu) {
        snprintf(unavailable_why, sizeof unavailable_why, "no GPU");
    } else if (cupti_start(unavailable_why, sizeof unavailable_why) == 0) {
        subscribed = observed = 1;
        rk_obs_set_state(RK_OBS_ON, "");
        return;
    }
    rk_obs_set_state(RK_OBS_UNAVAILABLE, unavailable_why);
}

void rk_observe_stop(void)
{
    if (subscribed) {
        cupti_stop();
        subscribed = 0;
    }
    if (recorder_on) {
        rk_obs_fini();
        recorder_on = 0;
    }
}
