/* Out of device memory, the way unmodified programs meet it (issue 29). Knows
 * nothing of rankmem: tests/observe/gpu.obsh runs it under the plugin and
 * reads the failing rank's record.
 *
 *   oom full      the last rank takes all but 2 GiB of the device with one
 *                 cudaMalloc ("HOG_SITE"), then asks for 4 GiB more, which
 *                 fails: MPI_Abort(MPI_COMM_WORLD, 3). The other ranks wait
 *                 in MPI_Barrier until the abort ends them.
 *   oom frag N ASK  the last rank allocates N blocks of 1 GiB, frees every
 *                 other one (N/2 GiB free in 1 GiB holes), then asks for ASK
 *                 GiB; run with a pool that holds most of the device serving
 *                 cudaMalloc (RANKMEM_INTERCEPT=cuda), with ASK more than
 *                 the device has left, it is refused although the pool has
 *                 more than ASK free: MPI_Abort(MPI_COMM_WORLD, 3).
 *   oom ask GIB   the last rank asks for GIB GiB at once (with another
 *                 process holding most of the device, it fails):
 *                 MPI_Abort(MPI_COMM_WORLD, 3).
 *   oom hold GIB  no MPI: holds GIB GiB of the device and prints "HOLDING",
 *                 then sleeps until its standard input closes or 300 s.
 *
 * Every failing call prints "OOM_SITE oom.cu:LINE" first, so that the
 * script can look for that line in the record. */
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "app.h"

#define GiB ((size_t)1 << 30)

static void fail_job(cudaError_t e, int line)
{
    printf("OOM_SITE oom.cu:%d\n", line);
    printf("cuda error: %s\n", cudaGetErrorString(e));
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 3);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "full";
    if (strcmp(mode, "hold") == 0) {
        size_t gib = argc > 2 ? (size_t)atol(argv[2]) : 1;
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, gib * GiB);
        if (e != cudaSuccess) {
            printf("hold: %s\n", cudaGetErrorString(e));
            return 1;
        }
        cudaMemset(p, 0, gib * GiB);
        cudaDeviceSynchronize();
        printf("HOLDING %zu GiB\n", gib);
        fflush(stdout);
        char c;
        for (int i = 0; i < 300 && read(0, &c, 1) > 0; i++)
            ;
        cudaFree(p);
        return 0;
    }

    MK(MPI_Init(&argc, &argv));
    int rank = 0, size = 1;
    MK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    if (!app_have_gpu()) {
        MPI_Finalize();
        return 0;
    }
    CK(cudaFree(0));
    MK(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == size - 1) {
        cudaError_t e;
        if (strcmp(mode, "full") == 0) {
            size_t fr = 0, tot = 0;
            CK(cudaMemGetInfo(&fr, &tot));
            void *hog = NULL, *more = NULL;
            size_t want = fr > 3 * GiB ? fr - 2 * GiB : fr / 2;
            printf("HOG_SITE oom.cu:%d\n", __LINE__ + 1);
            CK(cudaMalloc(&hog, want));
            printf("HOG_BYTES %zu\n", want);
            struct timespec ts; /* for bench/failure-bench.sh: the call's start */
            clock_gettime(CLOCK_REALTIME, &ts);
            printf("T_FAIL %lld.%09ld\n", (long long)ts.tv_sec, ts.tv_nsec);
            fflush(stdout);
            e = cudaMalloc(&more, 4 * GiB);
            if (e != cudaSuccess)
                fail_job(e, __LINE__ - 2);
            printf("unexpected: 4 GiB more was granted\n");
        } else if (strcmp(mode, "frag") == 0) {
            int n = argc > 2 ? atoi(argv[2]) : 32;
            size_t ask = (argc > 3 ? (size_t)atol(argv[3]) : 2) * GiB;
            void *b[1024], *big = NULL;
            if (n < 2 || n > 1024)
                n = 32;
            for (int i = 0; i < n; i++)
                CK(cudaMalloc(&b[i], GiB));
            for (int i = 0; i < n; i += 2)
                CK(cudaFree(b[i]));
            e = cudaMalloc(&big, ask);
            if (e != cudaSuccess)
                fail_job(e, __LINE__ - 2);
            printf("unexpected: %zu bytes were granted\n", ask);
        } else if (strcmp(mode, "ask") == 0) {
            size_t gib = argc > 2 ? (size_t)atol(argv[2]) : 1;
            void *p = NULL;
            e = cudaMalloc(&p, gib * GiB);
            if (e != cudaSuccess)
                fail_job(e, __LINE__ - 2);
            printf("unexpected: %zu GiB was granted\n", gib);
        }
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 4);
    }
    MK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_Finalize();
    return 0;
}
