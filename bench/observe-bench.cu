/* observe-bench: what observation and serving (issue 19) add to an
 * unmodified MPI+CUDA program's allocations. The program knows nothing of
 * rankmem (built with -cudart shared, linked with MPI only); the driver,
 * bench/observe-bench.sh, runs it without rankmem and with the plugin in
 * LD_PRELOAD under several settings, and prints the table.
 *
 * Measured on the host, after a warm-up, as the median of REPEATS runs:
 *   malloc  cudaMalloc + cudaFree of BYTES, PAIRS pairs
 *   async   cudaMallocAsync + cudaFreeAsync of BYTES on one stream (the
 *           device's default pool, release threshold raised so that the
 *           pool keeps its memory, as a time loop's would), ASYNC_PAIRS pairs
 *
 *   observe-bench [--pairs N] [--async-pairs N] [--bytes B] [--repeats R]
 *
 * Prints, on rank 0, "malloc_pair_ns X" and "async_pair_ns Y" (the median
 * over repeats of rank 0, and the largest median over the ranks). Exit
 * status 0; 1 on a CUDA or MPI error; 2 bad usage; 77 without a GPU. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>

#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "observe-bench: %s: %s\n", #call, cudaGetErrorString(e_));    \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                 \
        }                                                                                 \
    } while (0)

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double malloc_pairs(long pairs, size_t bytes)
{
    void *p = NULL;
    double t0 = now_ns();
    for (long i = 0; i < pairs; i++) {
        CK(cudaMalloc(&p, bytes));
        CK(cudaFree(p));
    }
    return (now_ns() - t0) / (double)pairs;
}

static double async_pairs(long pairs, size_t bytes, cudaStream_t s)
{
    void *p = NULL;
    double t0 = now_ns();
    for (long i = 0; i < pairs; i++) {
        CK(cudaMallocAsync(&p, bytes, s));
        CK(cudaFreeAsync(p, s));
    }
    double ns = (now_ns() - t0) / (double)pairs;
    CK(cudaStreamSynchronize(s)); /* outside the timing: the host-side cost is measured */
    return ns;
}

int main(int argc, char **argv)
{
    long pairs = 2000, apairs = 100000;
    size_t bytes = (size_t)1 << 20;
    int repeats = 5;
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v && strcmp(a, "--pairs") == 0)
            pairs = atol(v);
        else if (v && strcmp(a, "--async-pairs") == 0)
            apairs = atol(v);
        else if (v && strcmp(a, "--bytes") == 0)
            bytes = (size_t)strtoull(v, NULL, 0);
        else if (v && strcmp(a, "--repeats") == 0)
            repeats = atoi(v);
        else {
            if (rank == 0)
                fprintf(stderr, "usage: observe-bench [--pairs N] [--async-pairs N] "
                                "[--bytes B] [--repeats R]\n");
            MPI_Finalize();
            return 2;
        }
        i++;
    }
    if (pairs < 1 || apairs < 1 || bytes < 1 || repeats < 1 || repeats > 99) {
        if (rank == 0)
            fprintf(stderr, "observe-bench: every count must be positive (repeats <= 99)\n");
        MPI_Finalize();
        return 2;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        if (rank == 0)
            fprintf(stderr, "observe-bench: no GPU\n");
        MPI_Finalize();
        return 77;
    }

    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int dev = 0;
    CK(cudaGetDevice(&dev));
    cudaMemPool_t pool;
    CK(cudaDeviceGetDefaultMemPool(&pool, dev));
    uint64_t keep = UINT64_MAX;
    CK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));

    /* Warm-up: contexts, the pool's first chunk, rankmem's pool when serving. */
    (void)malloc_pairs(pairs / 10 + 1, bytes);
    (void)async_pairs(apairs / 10 + 1, bytes, s);
    double m[100], a[100];
    for (int r = 0; r < repeats; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        m[r] = malloc_pairs(pairs, bytes);
        MPI_Barrier(MPI_COMM_WORLD);
        a[r] = async_pairs(apairs, bytes, s);
    }
    double mine[2] = {median(m, repeats), median(a, repeats)}, worst[2] = {0, 0};
    MPI_Reduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("malloc_pair_ns %.1f\nasync_pair_ns %.1f\n", mine[0], mine[1]);
        printf("malloc_pair_ns_max_rank %.1f\nasync_pair_ns_max_rank %.1f\n", worst[0], worst[1]);
        printf("# %d rank(s), %zu bytes, %ld + %ld pairs, median of %d\n", size, bytes, pairs,
               apairs, repeats);
    }
    CK(cudaStreamDestroy(s));
    MPI_Finalize();
    return 0;
}
