/* Observation's state and serving's decisions as the plugin makes them at
 * MPI_Init, read through the hidden functions: the plugin's sources are
 * built into this program (as tests/mpi/record does), so cudaMalloc and
 * friends below are the interposer's. Run by tests/observe_unit/observe.mpish
 * under mpirun with 2 ranks, with RANKMEM_OBSERVE and RANKMEM_INTERCEPT set
 * by the script.
 *
 * Without a GPU: the state the settings call for, and every cudaMalloc,
 * cudaFree and cudaIpcGetMemHandle sent to CUDA with CUDA's own answer.
 * With one (the GPU machine): served blocks are device memory of the rank's
 * device, 256-aligned, freed back to the pool, refused by
 * cudaIpcGetMemHandle; blocks CUDA gave go through; the recorder counts
 * what the program allocated. */
#define _GNU_SOURCE
#include "plugin.h"

#include <dlfcn.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "../mpi/mtap.h"

#if HAVE_CUDA
#include <cuda_runtime_api.h>

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);
typedef cudaError_t (*ipc_fn)(cudaIpcMemHandle_t *, void *);

static void no_gpu_checks(int icpt)
{
    /* CUDA's own functions, after this program's (the interposer's). */
    malloc_fn real_malloc = (malloc_fn)dlsym(RTLD_NEXT, "cudaMalloc");
    free_fn real_free = (free_fn)dlsym(RTLD_NEXT, "cudaFree");
    mok(real_malloc && real_free, "the CUDA runtime's cudaMalloc and cudaFree are found");
    if (!real_malloc || !real_free)
        return;
    uint64_t fwd0[RK_ICPT_NREASONS], fwd1[RK_ICPT_NREASONS], served = 0, live = 0;
    rk_icpt_counters(NULL, NULL, fwd0);
    void *p = NULL, *q = NULL;
    cudaError_t mine = cudaMalloc(&p, 1 << 20), theirs = real_malloc(&q, 1 << 20);
    (void)cudaGetLastError();
    mok(mine == theirs && mine != cudaSuccess,
        "no GPU: cudaMalloc gives CUDA's own error (%d, CUDA: %d)", (int)mine, (int)theirs);
    rk_icpt_counters(&live, &served, fwd1);
    /* With serving off, forwards are not counted (nothing on the way). */
    int reason = icpt ? RK_ICPT_FWD_NO_RESOURCE : RK_ICPT_FWD_OFF;
    mok(fwd1[reason] == fwd0[reason] + (icpt ? 1 : 0) && served == 0 && live == 0,
        "  sent to CUDA because: %s", rk_icpt_route_name(reason));
    mine = cudaMalloc(NULL, 16);
    theirs = real_malloc(NULL, 16);
    (void)cudaGetLastError();
    mok(mine == theirs, "cudaMalloc(NULL, 16) gives CUDA's answer (%d)", (int)mine);
    mine = cudaFree(NULL);
    theirs = real_free(NULL);
    (void)cudaGetLastError();
    mok(mine == theirs, "cudaFree(NULL) gives CUDA's answer (%d)", (int)mine);
    int dummy;
    mine = cudaFree(&dummy); /* not served: CUDA's error, not ours */
    theirs = real_free(&dummy);
    (void)cudaGetLastError();
    mok(mine == theirs, "cudaFree of a pointer never served gives CUDA's answer (%d)", (int)mine);
    cudaIpcMemHandle_t h;
    ipc_fn real_ipc = (ipc_fn)dlsym(RTLD_NEXT, "cudaIpcGetMemHandle");
    mine = cudaIpcGetMemHandle(&h, &dummy);
    theirs = real_ipc ? real_ipc(&h, &dummy) : cudaErrorUnknown;
    (void)cudaGetLastError();
    mok(mine == theirs, "cudaIpcGetMemHandle of a pointer never served gives CUDA's answer (%d)",
        (int)mine);
}

static void gpu_checks(int icpt, int observing)
{
    malloc_fn real_malloc = (malloc_fn)dlsym(RTLD_NEXT, "cudaMalloc");
    free_fn real_free = (free_fn)dlsym(RTLD_NEXT, "cudaFree");
    uint64_t served0 = 0, served1 = 0, live = 0, fwd[RK_ICPT_NREASONS];
    rk_icpt_counters(NULL, &served0, fwd);
    rk_obs_summary_t s0, s1;
    rk_obs_summary(&s0);

    size_t size = (1 << 20) + 3;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    mok(e == cudaSuccess && p, "cudaMalloc(1 MiB + 3) succeeds (%d)", (int)e);
    rk_icpt_counters(&live, &served1, fwd);
    mok(icpt ? served1 == served0 + 1 && live >= 1 : served1 == served0,
        icpt ? "  served by the rank's resource" : "  not served (RANKMEM_INTERCEPT=none)");
    mok(((uintptr_t)p & 255) == 0, "  256-aligned, as cudaMalloc's");
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    e = cudaPointerGetAttributes(&a, p);
    mok(e == cudaSuccess && a.type == cudaMemoryTypeDevice && a.device == rankmem_mpi_device(),
        "  cudaPointerGetAttributes: device memory of the rank's device (type %d, device %d)",
        (int)a.type, a.device);
    e = cudaMemset(p, 0x5a, size);
    cudaError_t e2 = cudaDeviceSynchronize();
    mok(e == cudaSuccess && e2 == cudaSuccess, "  the whole block can be written (cudaMemset)");
    cudaIpcMemHandle_t h;
    e = cudaIpcGetMemHandle(&h, p);
    (void)cudaGetLastError();
    mok(icpt ? e == cudaErrorInvalidValue : e == cudaSuccess,
        icpt ? "  cudaIpcGetMemHandle of a served block is refused (cudaErrorInvalidValue)"
             : "  cudaIpcGetMemHandle works (not served)");
    void *q = NULL;
    e = real_malloc ? real_malloc(&q, 4096) : cudaErrorUnknown;
    mok(e == cudaSuccess, "CUDA's own cudaMalloc still works beside serving");
    e = cudaIpcGetMemHandle(&h, q);
    mok(e == cudaSuccess, "  cudaIpcGetMemHandle of CUDA's block goes through");
    e = cudaFree(q);
    mok(e == cudaSuccess, "  cudaFree of a block CUDA gave goes to CUDA");
    (void)real_free;

    if (observing) {
        rk_obs_summary(&s1);
        uint64_t prog = s1.program[RK_OBS_DEVICE].total - s0.program[RK_OBS_DEVICE].total;
        mok(prog >= size + 4096, "the recorder saw both (program device bytes +%llu)",
            (unsigned long long)prog);
        mok(!icpt || s1.by[RK_OBS_SERVED][RK_OBS_DEVICE].count > s0.by[RK_OBS_SERVED][RK_OBS_DEVICE].count,
            "  the served one as served");
    }
    e = cudaFree(p);
    rk_icpt_counters(&live, NULL, NULL);
    mok(e == cudaSuccess, "cudaFree of the first block");
    if (icpt) {
        e = cudaFree(p); /* twice: no longer ours, so CUDA's error */
        (void)cudaGetLastError();
        mok(e != cudaSuccess, "  a second cudaFree of it is CUDA's error (%d), not a crash", (int)e);
    }

    cudaStream_t st;
    if (cudaStreamCreate(&st) == cudaSuccess) {
        void *r = NULL;
        rk_icpt_counters(NULL, &served0, NULL);
        e = cudaMallocAsync(&r, 12345, st);
        rk_icpt_counters(NULL, &served1, NULL);
        mok(e == cudaSuccess && (!icpt || served1 == served0 + 1), "cudaMallocAsync on a stream%s",
            icpt ? " (served)" : "");
        e = cudaMemsetAsync(r, 1, 12345, st);
        e2 = cudaFreeAsync(r, st);
        cudaError_t e3 = cudaStreamSynchronize(st);
        mok(e == cudaSuccess && e2 == cudaSuccess && e3 == cudaSuccess,
            "  used and freed on that stream");
        /* The interposer makes the pool forget the stream first. */
        mok(cudaStreamDestroy(st) == cudaSuccess, "the stream can be destroyed");
    }
}
#endif

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int ndev = 0;
    rankmem_device_count(&ndev);
    rankmem_clear_error();
    const char *o = getenv("RANKMEM_OBSERVE");
    const char *ic = getenv("RANKMEM_INTERCEPT");
    int mode = rk_observe_parse_mode(o ? o : "auto");
    int icpt = ic && strcmp(ic, "cuda") == 0;

    const char *why = NULL;
    rk_obs_state_t st = rk_obs_get_state(&why);
    static const char *const names[] = {"off", "on", "unavailable"};
    mdiag("state: %s (%s), %d GPU(s)", (unsigned)st < 3 ? names[st] : "?", why ? why : "", ndev);
    if (mode == RK_OBSERVE_OFF) {
        mok(st == RK_OBS_OFF && why && strcmp(why, "RANKMEM_OBSERVE=off") == 0,
            "RANKMEM_OBSERVE=off: state off, why RANKMEM_OBSERVE=off");
        mok(!rk_obs_enabled(), "  the recorder is not started");
    } else if (ndev == 0 && mode == RK_OBSERVE_AUTO) {
        mok(st == RK_OBS_OFF && why && strstr(why, "no GPU"), "auto without a GPU: state off, no GPU");
        mok(!rk_obs_enabled(), "  the recorder is not started");
    } else if (ndev == 0) {
        mok(st == RK_OBS_UNAVAILABLE && why && strcmp(why, "no GPU") == 0,
            "on without a GPU: state unavailable, why \"no GPU\"");
        mok(rk_obs_enabled(), "  the recorder runs (for explicit events)");
    } else {
        mok(st == RK_OBS_ON || (st == RK_OBS_UNAVAILABLE && why && why[0]),
            "with a GPU: state on, or unavailable with a reason");
        mok(rk_obs_enabled(), "  the recorder runs");
    }
    /* Phase marks (rankmem_mpi_phase): bad input, then one that the
     * recorder keeps when it runs. */
    mok(rankmem_mpi_phase(NULL) == RANKMEM_ERR_INVALID_ARGUMENT &&
            rankmem_mpi_phase("") == RANKMEM_ERR_INVALID_ARGUMENT,
        "rankmem_mpi_phase(NULL or \"\"): RANKMEM_ERR_INVALID_ARGUMENT");
    mok(rankmem_mpi_phase("solve") ==
            (rk_obs_enabled() ? RANKMEM_SUCCESS : RANKMEM_ERR_NOT_SUPPORTED),
        "rankmem_mpi_phase(\"solve\"): %s",
        rk_obs_enabled() ? "success" : "not supported while observation is off");
    if (rk_obs_enabled()) {
        rk_obs_phase_t ph[RK_OBS_MAX_PHASES];
        size_t n = rk_obs_phases(ph, RK_OBS_MAX_PHASES), found = 0;
        for (size_t i = 0; i < n && i < RK_OBS_MAX_PHASES; i++)
            found += strcmp(ph[i].name, "solve") == 0;
        mok(found == 1, "  the recorder has the phase \"solve\"");
    }
#if HAVE_CUDA
    mok(rk_icpt_mode() == icpt, "RANKMEM_INTERCEPT=%s: serving %s", icpt ? "cuda" : "none",
        icpt ? "configured" : "off");
#else
    /* Nothing to serve without CUDA: the plugin says so and stays off. */
    mok(rk_icpt_mode() == 0, "RANKMEM_INTERCEPT=%s without CUDA: serving off",
        icpt ? "cuda" : "none");
#endif
#if HAVE_CUDA
    if (ndev == 0)
        no_gpu_checks(icpt);
    else
        gpu_checks(icpt, st == RK_OBS_ON);
#else
    mdiag("built without CUDA: no cudaMalloc to check");
#endif
    MPI_Finalize();
    return mtap_failed_ ? 1 : 0;
}
