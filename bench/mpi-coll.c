/* Collectives on device buffers among the ranks of one node: through CUDA
 * IPC (cudaMalloc memory) against staged through pinned memory
 * (cudaMallocAsync memory, which CUDA IPC cannot export, so the plugin
 * stages it), in one run. Prints a markdown table of the average time per
 * call (the slowest rank's) and the ratio. No check of the data: the
 * tests (tests/mpi_staging) do that.
 *
 *   mpirun -np N env RANKMEM_REPORT=off bench/mpi-coll [--max BYTES] [--quick]
 *
 * Bytes are per rank: the message of Bcast, Reduce and Allreduce (ints,
 * MPI_SUM), one block of Allgather and Alltoall. */
#define _GNU_SOURCE
#include "config.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "mpi-coll: %s: %s\n", #call, cudaGetErrorString(e_));                 \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                         \
        }                                                                                         \
    } while (0)

enum { C_BCAST, C_ALLGATHER, C_ALLTOALL, C_REDUCE, C_ALLREDUCE, NC };
static const char *names[NC] = {"Bcast", "Allgather", "Alltoall", "Reduce", "Allreduce"};

static void one(int c, char *s, char *r, size_t n)
{
    int k = (int)(n / sizeof(int));
    switch (c) {
    case C_BCAST:
        MPI_Bcast(s, k, MPI_INT, 0, MPI_COMM_WORLD);
        break;
    case C_ALLGATHER:
        MPI_Allgather(s, k, MPI_INT, r, k, MPI_INT, MPI_COMM_WORLD);
        break;
    case C_ALLTOALL:
        MPI_Alltoall(s, k, MPI_INT, r, k, MPI_INT, MPI_COMM_WORLD);
        break;
    case C_REDUCE:
        MPI_Reduce(s, r, k, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
        break;
    default:
        MPI_Allreduce(s, r, k, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        break;
    }
}

/* Microseconds per call, the slowest rank's. */
static double timed(int c, char *s, char *r, size_t n, int iters)
{
    for (int i = 0; i < 2; i++)
        one(c, s, r, n);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; i++)
        one(c, s, r, n);
    double t = (MPI_Wtime() - t0) / iters * 1e6, worst = 0;
    MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

int main(int argc, char **argv)
{
    size_t max = (size_t)64 << 20;
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max") && i + 1 < argc)
            max = (size_t)strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--quick"))
            quick = 1;
    }
    MPI_Init(&argc, &argv);
    int me = 0, np = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    size_t big = max * (size_t)np;
    char *dev[2], *sd[2]; /* [0] cudaMalloc (IPC), [1] cudaMallocAsync (staged) */
    CK(cudaMalloc((void **)&dev[0], big));
    CK(cudaMalloc((void **)&sd[0], big));
    CK(cudaMallocAsync((void **)&dev[1], big, 0));
    CK(cudaMallocAsync((void **)&sd[1], big, 0));
    CK(cudaStreamSynchronize(0));
    for (int m = 0; m < 2; m++) {
        CK(cudaMemset(dev[m], 1, big));
        CK(cudaMemset(sd[m], 1, big));
    }
    CK(cudaDeviceSynchronize());
    if (me == 0)
        printf("%d ranks; microseconds per call (slowest rank); IPC: cudaMalloc buffers, staged: "
               "cudaMallocAsync buffers\n\n"
               "| call | bytes per rank | IPC | staged | staged / IPC |\n"
               "| --- | ---: | ---: | ---: | ---: |\n",
               np);
    for (int c = 0; c < NC; c++)
        for (size_t n = (size_t)64 << 10; n <= max; n *= quick ? 16 : 4) {
            /* About 256 MiB moved per measurement, 5 to 200 calls. */
            size_t it = ((size_t)256 << 20) / (n * (size_t)np);
            int iters = it < 5 ? 5 : it > 200 ? 200 : (int)it;
            double t[2];
            for (int m = 0; m < 2; m++)
                t[m] = timed(c, sd[m], dev[m], n, iters);
            if (me == 0)
                printf("| %s | %zu | %.1f | %.1f | %.2f |\n", names[c], n, t[0], t[1],
                       t[1] / t[0]);
        }
    cudaFree(dev[0]);
    cudaFree(sd[0]);
    cudaFreeAsync(dev[1], 0);
    cudaFreeAsync(sd[1], 0);
    cudaStreamSynchronize(0);
    MPI_Finalize();
    return 0;
}
