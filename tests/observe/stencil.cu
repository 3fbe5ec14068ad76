/* A Jacobi solver of the heat equation written for a CUDA-aware MPI: the
 * device buffers go straight to MPI_Sendrecv (even steps) and to
 * MPI_Isend/MPI_Irecv (odd steps). On an MPI that is not CUDA-aware it runs
 * only because rankmem stages them. Knows nothing of rankmem.
 *
 *   stencil ROWS COLS STEPS
 *
 * Each rank owns ROWS rows of COLS doubles, with one halo row above and
 * below: two fields (u, v) of (ROWS + 2) * COLS doubles, its only device
 * allocations, so the report's device peak on every rank is exactly
 * 2 * (ROWS + 2) * COLS * 8 bytes (printed as an EXPECT line for
 * tests/observe/check.py). At the end rank 0 gathers the field and compares
 * it with the same iteration done on the CPU.
 *
 * Phases are marked as any MPI code may, with MPI_Pcontrol(3, label) (a
 * no-op without a tool): "solve" while both fields are live, "check" once
 * they are freed. */
#include <math.h>
#include <string.h>

#include "app.h"

/* The fixed top boundary (the other boundaries are 0): varies along the
 * row, so that a row sent to the wrong place or reversed shows. */
static double top_value(int j) { return 1.0 + 0.125 * (j % 7); }

__global__ void jacobi(const double *u, double *v, int rows, int cols)
{
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y + 1;
    if (i > rows || j < 1 || j >= cols - 1)
        return;
    size_t c = (size_t)i * cols + j;
    v[c] = (u[c - cols] + u[c + cols] + u[c - 1] + u[c + 1]) * 0.25;
}

static void cpu_step(const double *u, double *v, int rows, int cols)
{
    for (int i = 1; i <= rows; i++)
        for (int j = 1; j < cols - 1; j++) {
            size_t c = (size_t)i * cols + j;
            v[c] = (u[c - cols] + u[c + cols] + u[c - 1] + u[c + 1]) * 0.25;
        }
}

int main(int argc, char **argv)
{
    MK(MPI_Init(&argc, &argv));
    int rank = 0, size = 1;
    MK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MK(MPI_Comm_size(MPI_COMM_WORLD, &size));
    int rows = argc > 1 ? atoi(argv[1]) : 64;
    int cols = argc > 2 ? atoi(argv[2]) : 256;
    int steps = argc > 3 ? atoi(argv[3]) : 50;
    if (rows < 1 || cols < 3 || steps < 1) {
        if (rank == 0)
            fprintf(stderr, "usage: stencil ROWS COLS STEPS\n");
        MPI_Finalize();
        return 2;
    }
    if (!app_have_gpu()) {
        MPI_Finalize();
        return 0;
    }
    size_t n = (size_t)(rows + 2) * cols, bytes = n * sizeof(double);
    if (rank == 0)
        printf("EXPECT all observed.device.peak == %zu\n", 2 * bytes);

    /* Initial field on the host: 0, with the top boundary in rank 0's
     * upper halo row (fixed: no rank writes it). */
    double *h = (double *)calloc(n, sizeof(double));
    if (!h)
        MPI_Abort(MPI_COMM_WORLD, 1);
    if (rank == 0)
        for (int j = 0; j < cols; j++)
            h[j] = top_value(j);
    double *u = NULL, *v = NULL;
    CK(cudaMalloc(&u, bytes));
    CK(cudaMalloc(&v, bytes));
    CK(cudaMemcpy(u, h, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(v, h, bytes, cudaMemcpyHostToDevice));

    int up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    int down = rank < size - 1 ? rank + 1 : MPI_PROC_NULL;
    dim3 block(128), grid((cols + 127) / 128, rows);
    MPI_Pcontrol(3, "solve");
    for (int s = 0; s < steps; s++) {
        /* Halo exchange on device pointers: first row up, last row down. */
        if (s % 2 == 0) {
            MK(MPI_Sendrecv(u + cols, cols, MPI_DOUBLE, up, 1, u + (size_t)(rows + 1) * cols, cols,
                            MPI_DOUBLE, down, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
            MK(MPI_Sendrecv(u + (size_t)rows * cols, cols, MPI_DOUBLE, down, 2, u, cols,
                            MPI_DOUBLE, up, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        } else {
            MPI_Request rq[4];
            MK(MPI_Irecv(u, cols, MPI_DOUBLE, up, 3, MPI_COMM_WORLD, &rq[0]));
            MK(MPI_Irecv(u + (size_t)(rows + 1) * cols, cols, MPI_DOUBLE, down, 4, MPI_COMM_WORLD,
                         &rq[1]));
            MK(MPI_Isend(u + (size_t)rows * cols, cols, MPI_DOUBLE, down, 3, MPI_COMM_WORLD,
                         &rq[2]));
            MK(MPI_Isend(u + cols, cols, MPI_DOUBLE, up, 4, MPI_COMM_WORLD, &rq[3]));
            MK(MPI_Waitall(4, rq, MPI_STATUSES_IGNORE));
        }
        jacobi<<<grid, block>>>(u, v, rows, cols);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        double *t = u;
        u = v;
        v = t;
    }

    /* Rank 0 gathers the interior rows and redoes it all on the CPU. */
    CK(cudaMemcpy(h, u, bytes, cudaMemcpyDeviceToHost));
    CK(cudaFree(u));
    CK(cudaFree(v));
    MPI_Pcontrol(3, "check");
    int grows = rows * size;
    double *all = NULL;
    if (rank == 0) {
        all = (double *)calloc((size_t)(grows + 2) * cols, sizeof(double));
        if (!all)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MK(MPI_Gather(h + cols, rows * cols, MPI_DOUBLE, all ? all + cols : NULL, rows * cols,
                  MPI_DOUBLE, 0, MPI_COMM_WORLD));
    if (rank == 0) {
        size_t gn = (size_t)(grows + 2) * cols;
        double *a = (double *)calloc(gn, sizeof(double)), *b = (double *)calloc(gn, sizeof(double));
        if (!a || !b)
            MPI_Abort(MPI_COMM_WORLD, 1);
        for (int j = 0; j < cols; j++)
            a[j] = b[j] = top_value(j);
        for (int s = 0; s < steps; s++) {
            cpu_step(a, b, grows, cols);
            double *t = a;
            a = b;
            b = t;
        }
        double worst = 0, sum = 0;
        for (size_t c = cols; c < (size_t)(grows + 1) * cols; c++) {
            worst = fmax(worst, fabs(a[c] - all[c]));
            sum += a[c];
        }
        printf("%s - stencil: %d ranks x %d rows x %d columns, %d steps: the field matches the "
               "CPU's (largest difference %g, sum %.6f)\n",
               worst <= 1e-12 && sum > 0 ? "ok" : "not ok", size, rows, cols, steps, worst, sum);
        free(a);
        free(b);
        free(all);
    }
    free(h);
    MPI_Finalize();
    return 0;
}
