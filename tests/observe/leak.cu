/* Leaks on purpose, the same block on every rank, from one known line
 * (built with -g -O0): the finalize report must list the leak with its call
 * site (this file and line, or leak_some) on every rank. The line is
 * printed for tests/observe/gpu.obsh ("LEAK_SITE leak.cu:LINE"). Knows
 * nothing of rankmem.
 *
 *   leak BYTES */
#include "app.h"

static int leak_line;

__attribute__((noinline)) static void *leak_some(size_t bytes)
{
    void *p = NULL;
    leak_line = __LINE__ + 1;
    CK(cudaMalloc(&p, bytes));
    CK(cudaMemset(p, 0, bytes));
    return p;
}

int main(int argc, char **argv)
{
    MK(MPI_Init(&argc, &argv));
    int rank = 0;
    MK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    size_t bytes = argc > 1 ? (size_t)strtoull(argv[1], NULL, 0) : MiB + 512;
    if (!app_have_gpu()) {
        MPI_Finalize();
        return 0;
    }
    /* A block freed in time, from another line: not a leak. */
    void *q = NULL;
    CK(cudaMalloc(&q, 2 * bytes));
    void *p = leak_some(bytes);
    CK(cudaFree(q));
    if (rank == 0)
        printf("LEAK_SITE leak.cu:%d\n", leak_line);
    printf("# leak: rank %d keeps %zu bytes at %p\n", rank, bytes, p);
    MPI_Finalize();
    return 0;
}
