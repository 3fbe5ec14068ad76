/* Observation's CUPTI callback (mpi/observe/observe.c) fed by hand, as CUPTI calls
 * it, into the real recorder: what is recorded, of which kind and source,
 * with which size; a call seen at both levels counted once; failures not
 * recorded; frees taken at the call's start. No GPU, no CUPTI library, no
 * MPI run: the plugin's few other functions are stubbed below. */
#define _GNU_SOURCE
#include "plugin.h"

#include <string.h>

#include "../tap.h"

/* ---- what observe.c needs from the rest of the plugin (in every build:
 * without CUPTI it still says the static-runtime note) ---- */
static int fake_icpt_mode;
int rk_icpt_mode(void) { return fake_icpt_mode; }
int rk_mpi_world_rank(void) { return 0; }
void rk_mpi_warn(const char *fmt, ...) { (void)fmt; }
void rk_mpi_verbose(const char *fmt, ...) { (void)fmt; }

#if HAVE_CUDA && HAVE_CUPTI_H
#include <cupti.h>


#define RT CUPTI_CB_DOMAIN_RUNTIME_API
#define DRV CUPTI_CB_DOMAIN_DRIVER_API

static const cudaError_t rt_ok = cudaSuccess, rt_oom = cudaErrorMemoryAllocation;
static const CUresult drv_ok = CUDA_SUCCESS, drv_oom = CUDA_ERROR_OUT_OF_MEMORY;

static rk_obs_counts_t by(rk_obs_source_t src, rk_obs_kind_t kind)
{
    rk_obs_summary_t s;
    rk_obs_summary(&s);
    return s.by[src][kind];
}

/* cudaMalloc as CUPTI shows it: runtime ENTER, the driver's cuMemAlloc_v2
 * inside it (ENTER and EXIT), runtime EXIT. */
static void cuda_malloc(uintptr_t addr, size_t size, int fail)
{
    void *p = (void *)addr;
    CUdeviceptr d = (CUdeviceptr)addr;
    cudaMalloc_v3020_params rp = {&p, size};
    cuMemAlloc_v2_params dp = {&d, size};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, 1, &rp, &rt_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 1, &dp, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 0, &dp,
                             fail ? &drv_oom : &drv_ok);
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, 0, &rp,
                             fail ? &rt_oom : &rt_ok);
}

static void cuda_free(uintptr_t addr)
{
    cudaFree_v3020_params rp = {(void *)addr};
    cuMemFree_v2_params dp = {(CUdeviceptr)addr};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, 1, &rp, &rt_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, 1, &dp, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, 0, &dp, &drv_ok);
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaFree_v3020, 0, &rp, &rt_ok);
}

int main(void)
{
    rk_obs_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.backtrace_depth = 4;
    if (rk_obs_init(&cfg) != 0)
        BAIL_OUT("rk_obs_init failed");

    /* A runtime call with the driver call inside: once, as the program's. */
    cuda_malloc(0x10000, 1000, 0);
    rk_obs_counts_t c = by(RK_OBS_PROGRAM, RK_OBS_DEVICE);
    ok(c.count == 1 && c.current == 1000, "cudaMalloc (with cuMemAlloc_v2 inside): one block of "
       "1000 bytes (count %llu, current %llu)", (unsigned long long)c.count,
       (unsigned long long)c.current);
    cuda_malloc(0x20000, 500, 1);
    c = by(RK_OBS_PROGRAM, RK_OBS_DEVICE);
    ok(c.count == 1 && c.current == 1000, "a cudaMalloc that failed is not recorded");
    cuda_free(0x10000);
    c = by(RK_OBS_PROGRAM, RK_OBS_DEVICE);
    ok(c.current == 0 && c.live == 0, "cudaFree (with cuMemFree_v2 inside): freed once");
    rk_obs_summary_t s;
    rk_obs_summary(&s);
    ok(s.unmatched_frees == 0, "  and the driver's free under it is not a second (unmatched) one");

    /* The driver called directly: seen at the driver level. */
    CUdeviceptr d = 0x30000;
    cuMemAlloc_v2_params dp = {&d, 4096};
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 1, &dp, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 0, &dp, &drv_ok);
    c = by(RK_OBS_PROGRAM, RK_OBS_DEVICE);
    ok(c.current == 4096, "cuMemAlloc_v2 called directly: recorded");
    cuMemFree_v2_params fp = {d};
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, 1, &fp, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2, 0, &fp, &drv_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_DEVICE).current == 0, "  cuMemFree_v2: freed");

    /* rankmem's own allocation (the timing layer raises the depth). */
    rk_obs_internal_depth++;
    cuda_malloc(0x40000, 1 << 20, 0);
    rk_obs_internal_depth--;
    ok(by(RK_OBS_RANKMEM, RK_OBS_DEVICE).current == 1 << 20 &&
           by(RK_OBS_PROGRAM, RK_OBS_DEVICE).current == 0,
       "with rk_obs_internal_depth > 0: rankmem's own, not the program's");
    cuda_free(0x40000);
    ok(by(RK_OBS_RANKMEM, RK_OBS_DEVICE).current == 0, "  and freed as such");

    /* Other kinds and sizes. */
    void *m = (void *)0x50000;
    cudaMallocManaged_v6000_params mp = {&m, 777, 1};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000, 1, &mp, &rt_ok);
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMallocManaged_v6000, 0, &mp, &rt_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_MANAGED).current == 777, "cudaMallocManaged: managed");
    void *h = (void *)0x60000;
    cudaHostAlloc_v3020_params hp = {&h, 333, 0};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020, 1, &hp, &rt_ok);
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaHostAlloc_v3020, 0, &hp, &rt_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_PINNED).current == 333, "cudaHostAlloc: pinned");
    cudaFreeHost_v3020_params fhp = {h};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020, 1, &fhp, &rt_ok);
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaFreeHost_v3020, 0, &fhp, &rt_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_PINNED).current == 0, "  cudaFreeHost: freed");
    void *pp = (void *)0x70000;
    size_t pitch = 512;
    cudaMallocPitch_v3020_params pip = {&pp, &pitch, 500, 10};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020, 1, &pip, &rt_ok);
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMallocPitch_v3020, 0, &pip, &rt_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_DEVICE).current == 5120, "cudaMallocPitch: pitch x height bytes");
    cuda_free(0x70000);

    /* cudaMallocAsync on a stream, freed by cudaFreeAsync. */
    void *a = (void *)0x80000;
    cudaMallocAsync_v11020_params ap = {&a, 256, NULL};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020, 1, &ap, &rt_ok);
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMallocAsync_v11020, 0, &ap, &rt_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_DEVICE).current == 256, "cudaMallocAsync: device");
    cudaFreeAsync_v11020_params fap = {a, NULL};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020, 1, &fap, &rt_ok);
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaFreeAsync_v11020, 0, &fap, &rt_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_DEVICE).current == 0, "  cudaFreeAsync: freed");

    /* VMM: two ranges mapped one by one, unmapped by one cuMemUnmap. */
    cuMemMap_params mm1 = {0x1000000, 2 << 20, 0, 1, 0}, mm2 = {0x1200000, 2 << 20, 0, 2, 0};
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemMap, 1, &mm1, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemMap, 0, &mm1, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemMap, 1, &mm2, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemMap, 0, &mm2, &drv_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_VMM).current == 4 << 20, "cuMemMap twice: 4 MiB mapped");
    cuMemUnmap_params um = {0x1000000, 4 << 20};
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemUnmap, 1, &um, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemUnmap, 0, &um, &drv_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_VMM).current == 0, "one cuMemUnmap over both: all unmapped");

    /* A runtime EXIT without its ENTER (callbacks turned on mid-call)
     * must not leave the driver level switched off. */
    void *x = (void *)0x90000;
    cudaMalloc_v3020_params xp = {&x, 64};
    rk_observe_test_callback(RT, CUPTI_RUNTIME_TRACE_CBID_cudaMalloc_v3020, 0, &xp, &rt_oom);
    d = 0xa0000;
    cuMemAlloc_v2_params dq = {&d, 128};
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 1, &dq, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 0, &dq, &drv_ok);
    ok(by(RK_OBS_PROGRAM, RK_OBS_DEVICE).current == 128,
       "an EXIT without ENTER leaves the driver level counted");

    /* A failed driver allocation is not recorded. */
    d = 0xb0000;
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 1, &dq, &drv_ok);
    rk_observe_test_callback(DRV, CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2, 0, &dq, &drv_oom);
    ok(by(RK_OBS_PROGRAM, RK_OBS_DEVICE).current == 128, "a failed cuMemAlloc_v2: not recorded");

    rk_obs_fini();
    return tap_done();
}

#else
int main(void) { return tap_skip_all("built without CUDA or cupti.h"); }
#endif
