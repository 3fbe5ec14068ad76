/* Known allocations of every kind, made between MPI_Init and MPI_Finalize by
 * a program that knows nothing of rankmem (tests/observe/gpu.obsh builds it
 * with nvcc's default static runtime and with -cudart shared). What the
 * report must show on every rank, exactly (the sizes of the calls):
 *   device:  3 + 5 + 7 MiB by cudaMalloc, held together, and 4 MiB by
 *            cudaMallocAsync while they are held: peak 19 MiB, total 19 MiB,
 *            4 allocations, none live at the end;
 *   managed: 1 MiB by cudaMallocManaged (after the async block is freed, so
 *            that the device-side peak stays 19 MiB);
 *   pinned:  2 MiB by cudaMallocHost.
 * Everything is freed before MPI_Finalize. */
#include <string.h>

#include "app.h"

int main(int argc, char **argv)
{
    MK(MPI_Init(&argc, &argv));
    int rank = 0;
    MK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    if (!app_have_gpu()) {
        MPI_Finalize();
        return 0;
    }

    void *d3 = NULL, *d5 = NULL, *d7 = NULL, *a4 = NULL, *m1 = NULL, *h2 = NULL;
    CK(cudaMalloc(&d3, 3 * MiB));
    CK(cudaMalloc(&d5, 5 * MiB));
    CK(cudaMalloc(&d7, 7 * MiB));
    CK(cudaMemset(d3, 1, 3 * MiB));
    CK(cudaMemset(d5, 2, 5 * MiB));
    CK(cudaMemset(d7, 3, 7 * MiB));

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CK(cudaMallocAsync(&a4, 4 * MiB, s));
    CK(cudaMemsetAsync(a4, 4, 4 * MiB, s));
    CK(cudaFreeAsync(a4, s));
    CK(cudaStreamSynchronize(s));

    CK(cudaMallocManaged(&m1, 1 * MiB, cudaMemAttachGlobal));
    CK(cudaDeviceSynchronize());
    memset(m1, 5, 1 * MiB);
    CK(cudaFree(m1));

    CK(cudaMallocHost(&h2, 2 * MiB));
    memset(h2, 6, 2 * MiB);
    CK(cudaMemcpy(h2, d7, 2 * MiB, cudaMemcpyDeviceToHost));
    int good = ((unsigned char *)h2)[0] == 3 && ((unsigned char *)h2)[2 * MiB - 1] == 3;
    CK(cudaFreeHost(h2));

    CK(cudaFree(d3));
    CK(cudaFree(d5));
    CK(cudaFree(d7));
    CK(cudaStreamDestroy(s));

    int all = 0;
    MK(MPI_Allreduce(&good, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (rank == 0)
        printf("%s - alloc: every rank read back what it wrote\n", all ? "ok" : "not ok");
    MPI_Finalize();
    return 0;
}
