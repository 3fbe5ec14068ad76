/* What the unmodified test programs of tests/observe share: error checks
 * that stop the job with the failing call named. Nothing of rankmem: these
 * programs are built without its headers and libraries, and reach it only
 * through LD_PRELOAD, as a user's code would. */
#ifndef RANKMEM_TESTS_OBSERVE_APP_H
#define RANKMEM_TESTS_OBSERVE_APP_H

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

#define MiB ((size_t)1 << 20)

/* A failed CUDA or MPI call fails the job at once: the script sees the exit
 * status and the message in stderr. */
#define CK(call)                                                                          \
    do {                                                                                  \
        cudaError_t ck_e_ = (call);                                                       \
        if (ck_e_ != cudaSuccess) {                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(ck_e_));                                           \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                 \
        }                                                                                 \
    } while (0)
#define MK(call)                                                                          \
    do {                                                                                  \
        int mk_e_ = (call);                                                               \
        if (mk_e_ != MPI_SUCCESS) {                                                       \
            fprintf(stderr, "%s:%d: %s: MPI error %d\n", __FILE__, __LINE__, #call, mk_e_); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                 \
        }                                                                                 \
    } while (0)

/* 1 with a usable GPU; 0 (and a TAP comment) without: any failure of
 * cudaGetDeviceCount means none. */
static inline int app_have_gpu(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("# no GPU (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return 0;
    }
    return 1;
}

#endif
