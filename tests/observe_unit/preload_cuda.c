/* An MPI+CUDA program that knows nothing of rankmem, linked with the shared
 * CUDA runtime: with librankmem_mpi.so preloaded and RANKMEM_INTERCEPT=cuda
 * its cudaMalloc and cudaFree must be the plugin's, and answer as CUDA's
 * would (no GPU: CUDA's error; a GPU: device memory of the current device).
 * argv[1]: "preloaded" or "absent" (whose cudaMalloc to expect). Run by
 * tests/observe_unit/observe.mpish. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <mpi.h>
#include <string.h>

#include "../mpi/mtap.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int preloaded = argc > 1 && strcmp(argv[1], "preloaded") == 0;
    Dl_info di;
    memset(&di, 0, sizeof di);
    /* What the program's calls bind to: the first definition in lookup order. */
    void *mine = dlsym(RTLD_DEFAULT, "cudaMalloc");
    int found = mine && dladdr(mine, &di) && di.dli_fname;
    mok(found && (strstr(di.dli_fname, "librankmem_mpi") != NULL) == preloaded,
        "the program's cudaMalloc is %s (%s)", preloaded ? "the plugin's" : "CUDA's",
        found ? di.dli_fname : "?");

    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess)
        ndev = 0;
    (void)cudaGetLastError();
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 1 << 20);
    (void)cudaGetLastError();
    if (ndev == 0) {
        mok(e != cudaSuccess && p == NULL, "no GPU: cudaMalloc fails as CUDA's does (%d)", (int)e);
    } else {
        mok(e == cudaSuccess && p, "cudaMalloc(1 MiB) succeeds");
        struct cudaPointerAttributes a;
        memset(&a, 0, sizeof a);
        int cur = -1;
        cudaGetDevice(&cur);
        e = cudaPointerGetAttributes(&a, p);
        mok(e == cudaSuccess && a.type == cudaMemoryTypeDevice && a.device == cur,
            "  device memory of the current device");
        mok(cudaMemset(p, 0, 1 << 20) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess,
            "  writable");
        mok(cudaFree(p) == cudaSuccess, "  cudaFree");
    }
    e = cudaFree(NULL);
    (void)cudaGetLastError();
    mok(ndev == 0 ? e != cudaSuccess : e == cudaSuccess, "cudaFree(NULL) answers as CUDA's (%d)",
        (int)e);
    MPI_Finalize();
    return mtap_failed_ ? 1 : 0;
}
