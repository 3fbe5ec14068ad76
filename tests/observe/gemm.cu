/* A cuBLAS call in an unmodified MPI program: three N x N float matrices of
 * its own (cudaMalloc) and one cublasSgemm. cuBLAS allocates device memory
 * of its own (its workspace), which observation must see: the report's
 * device peak is more than the program's matrices. Knows nothing of
 * rankmem.
 *
 *   gemm [N]    (default 512) */
#include <math.h>

#include <cublas_v2.h>

#include "app.h"

int main(int argc, char **argv)
{
    MK(MPI_Init(&argc, &argv));
    int rank = 0;
    MK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    int n = argc > 1 ? atoi(argv[1]) : 512;
    if (n < 2 || n > 8192) {
        MPI_Finalize();
        return 2;
    }
    if (!app_have_gpu()) {
        MPI_Finalize();
        return 0;
    }
    size_t nn = (size_t)n * n, bytes = nn * sizeof(float);
    if (rank == 0)
        printf("EXPECT all observed.device.peak > %zu\n", 3 * bytes);

    /* A: i + 1 on its diagonal; B: all ones (column-major). C = A B has
     * row i full of i + 1. */
    float *ha = (float *)calloc(nn, sizeof(float)), *hb = (float *)malloc(bytes),
          *hc = (float *)malloc(bytes);
    if (!ha || !hb || !hc)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (int i = 0; i < n; i++)
        ha[(size_t)i * n + i] = (float)(i + 1);
    for (size_t k = 0; k < nn; k++)
        hb[k] = 1.0f;
    float *a = NULL, *b = NULL, *c = NULL;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMalloc(&c, bytes));
    CK(cudaMemcpy(a, ha, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b, hb, bytes, cudaMemcpyHostToDevice));

    cublasHandle_t handle;
    cublasStatus_t st = cublasCreate(&handle);
    const float one = 1.0f, zero = 0.0f;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "gemm: cuBLAS status %d\n", (int)st);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hc, c, bytes, cudaMemcpyDeviceToHost));
    cublasDestroy(handle);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaFree(c));

    int bad = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < n; i++)
            bad += hc[(size_t)j * n + i] != (float)(i + 1);
    int all = 0;
    MK(MPI_Allreduce(&bad, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
    if (rank == 0)
        printf("%s - gemm: cublasSgemm of %d x %d is right on every rank (%d wrong entries)\n",
               all == 0 ? "ok" : "not ok", n, n, all);
    free(ha);
    free(hb);
    free(hc);
    MPI_Finalize();
    return 0;
}
