/* heat: the 2-D heat equation on an NX x NY grid, split in rows over the
 * MPI ranks, with rankmem doing the memory.
 *
 *   mpirun -np 4 examples/heat [NX [NY [STEPS]]]      (default 512 512 500)
 *
 * What it shows:
 *  - the field lives in memory from the rank's resource (rankmem_mpi_resource():
 *    the chain librankmem_mpi built from RANKMEM_RESOURCE at MPI_Init, on the
 *    GPU it bound the rank to), and a new field is allocated every time step,
 *    as codes with temporaries do: the pool makes that cost nanoseconds;
 *  - device buffers are handed straight to MPI (MPI_Sendrecv for the halo
 *    rows, MPI_Gatherv for the result): a CUDA-aware MPI moves them itself,
 *    otherwise the plugin stages them through pinned host memory;
 *  - a host-side buffer (the gathered field, and the initial field on its
 *    way to the GPU) comes from an OpenMP allocator of librankmem_omp,
 *    rankmem_omp_pinned_mem_alloc, through the standard omp_alloc/omp_free;
 *  - at MPI_Finalize the plugin prints the job's memory report.
 *
 * On a machine without a GPU the rank's resource is host memory and the
 * step is a host loop (OpenMP threads). The step computes the same bits on
 * either side (see step_host), and the result does not depend on how the
 * rows are split, so the printed checksum is the same for any number of
 * ranks, on the CPU and on the GPU.
 *
 * Build (the project's Makefile does this as examples/heat):
 *   nvcc -c heat-kernels.cu                                     (GPU builds)
 *   mpicc -fopenmp -DHEAT_CUDA -DHEAT_OMP heat.c heat-kernels.o \
 *         -lrankmem_mpi -lrankmem_omp -lrankmem -lcudart -lstdc++
 * The rankmem libraries come before the MPI and OpenMP runtimes, which the
 * wrapper and -fopenmp add at the end. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>
#include <rankmem.h>
#include <rankmem_mpi.h>
#ifdef HEAT_OMP
#include <omp.h>
#include <rankmem_omp.h>
#endif
#ifdef HEAT_CUDA
#include "heat-kernels.h"
#endif

static int rank, nranks;

/* A failed rankmem call ends the job: print what failed on this rank. */
#define CHECK(call)                                                                              \
    do {                                                                                         \
        rankmem_status_t st_ = (call);                                                           \
        if (st_ != RANKMEM_SUCCESS) {                                                            \
            fprintf(stderr, "heat[rank %d]: %s: %s (%s)\n", rank, #call,                         \
                    rankmem_status_string(st_), rankmem_last_error());                           \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                        \
        }                                                                                        \
    } while (0)

#ifdef HEAT_CUDA
#define CHECK_CUDA(call)                                                                         \
    do {                                                                                         \
        int e_ = (call);                                                                         \
        if (e_ != 0) {                                                                           \
            fprintf(stderr, "heat[rank %d]: %s: %s\n", rank, #call, heat_dev_error(e_));         \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                        \
        }                                                                                        \
    } while (0)
#endif

/* ---- host buffers: an OpenMP allocator of rankmem's ---------------------- */

/* Pinned host memory through the standard OpenMP call, when librankmem_omp
 * serves it (it is linked before the OpenMP runtime); plain malloc in a
 * build without it. Without a GPU the pinned space is host memory. */
static int omp_ours;

static void *host_alloc(size_t bytes)
{
#ifdef HEAT_OMP
    if (omp_ours)
        return omp_alloc(bytes, rankmem_omp_pinned_mem_alloc);
#endif
    return malloc(bytes);
}

static void host_free(void *p)
{
#ifdef HEAT_OMP
    if (omp_ours) {
        omp_free(p, rankmem_omp_pinned_mem_alloc);
        return;
    }
#endif
    free(p);
}

/* ---- the problem ---------------------------------------------------------- */

/* Initial temperature of global row g, column c: the top edge held at 100,
 * the other edges at 0, and a square of 50 in the middle. */
static double initial(int g, int c, int nx, int ny)
{
    if (g == 0)
        return 100.0;
    if (g == ny - 1 || c == 0 || c == nx - 1)
        return 0.0;
    if (abs(2 * g - ny) < ny / 4 && abs(2 * c - nx) < nx / 4)
        return 50.0;
    return 0.0;
}

/* One explicit step with the largest stable time step (dt = h^2 / 4), where
 * the update is the mean of the four neighbours. Written as a sum of two
 * sums times 0.25 (exact), with no multiply feeding an add, so that no
 * compiler can fuse it into an FMA: heat-kernels.cu does the same, and both
 * give the same bits. Global boundary rows and columns keep their value. */
static void step_host(const double *u, double *v, int nloc, int nx, int row0, int ny)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int r = 1; r <= nloc; r++) {
        int g = row0 + r - 1;
        const double *a = u + (size_t)r * nx;
        double *b = v + (size_t)r * nx;
        if (g == 0 || g == ny - 1) {
            memcpy(b, a, (size_t)nx * sizeof *b);
            continue;
        }
        b[0] = a[0];
        for (int c = 1; c < nx - 1; c++)
            b[c] = ((a[c - nx] + a[c + nx]) + (a[c - 1] + a[c + 1])) * 0.25;
        b[nx - 1] = a[nx - 1];
    }
}

/* Rows of rank r: an even split, the first ny % nranks ranks one more. */
static void rows_of(int r, int ny, int *nloc_p, int *row0_p)
{
    int base = ny / nranks, extra = ny % nranks;
    *nloc_p = base + (r < extra);
    *row0_p = r * base + (r < extra ? r : extra);
}

static int parse_arg(const char *s, long lo, long hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    int nx = 512, ny = 512, steps = 500;
    /* Every rank parses the same arguments and takes the same decision. */
    if (argc > 4 || (argc > 1 && parse_arg(argv[1], 3, 1L << 20, &nx)) ||
        (argc > 2 && parse_arg(argv[2], 3, 1L << 20, &ny)) ||
        (argc > 3 && parse_arg(argv[3], 0, INT_MAX, &steps)) || ny < nranks ||
        (long long)nx * ny > INT_MAX) {
        if (rank == 0)
            fprintf(stderr,
                    "usage: heat [NX [NY [STEPS]]]: 3 <= NX, NY <= 2^20, NX * NY < 2^31, "
                    "at least one row per rank (NY >= %d), STEPS >= 0\n",
                    nranks);
        MPI_Finalize();
        return 2;
    }

    /* The rank's resource, installed by librankmem_mpi at MPI_Init (stats on
     * top); the same as rankmem_get_current_resource() from here on. */
    rankmem_resource_t *mr = rankmem_mpi_resource();
    if (!mr)
        CHECK(rankmem_get_current_resource(&mr));
    unsigned props = 0;
    CHECK(rankmem_resource_properties(mr, &props));
    int use_gpu = 0;
#ifdef HEAT_CUDA
    use_gpu = rankmem_mpi_device() >= 0 && (props & RANKMEM_PROP_DEVICE_ACCESSIBLE);
#endif
#ifdef HEAT_OMP
    CHECK(rankmem_omp_active(&omp_ours));
#endif

    int nloc, row0;
    rows_of(rank, ny, &nloc, &row0);
    size_t field_bytes = (size_t)(nloc + 2) * nx * sizeof(double);
    rankmem_stream_t stream = NULL;
#ifdef HEAT_CUDA
    if (use_gpu)
        CHECK_CUDA(heat_dev_stream_create(&stream));
#endif

    /* The initial field, halo rows included, built on the host (in pinned
     * memory, which the GPU copies from fastest) and copied into the field. */
    double *init = host_alloc(field_bytes);
    if (!init) {
        fprintf(stderr, "heat[rank %d]: no host memory for %zu bytes\n", rank, field_bytes);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (int r = 0; r < nloc + 2; r++) {
        int g = row0 + r - 1;
        for (int c = 0; c < nx; c++)
            init[(size_t)r * nx + c] = g >= 0 && g < ny ? initial(g, c, nx, ny) : 0.0;
    }
    double *cur;
    CHECK(rankmem_allocate_async(mr, field_bytes, 0, stream, (void **)&cur));
#ifdef HEAT_CUDA
    if (use_gpu)
        CHECK_CUDA(heat_dev_copy(cur, init, field_bytes, stream));
    else
#endif
        memcpy(cur, init, field_bytes);
    host_free(init);

    int up = rank > 0 ? rank - 1 : MPI_PROC_NULL;
    int down = rank < nranks - 1 ? rank + 1 : MPI_PROC_NULL;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int s = 0; s < steps; s++) {
        /* A fresh field each step, the old one given back on the same stream:
         * the pool hands the same memory back, in tens of nanoseconds. */
        double *next;
        CHECK(rankmem_allocate_async(mr, field_bytes, 0, stream, (void **)&next));
#ifdef HEAT_CUDA
        if (use_gpu) {
            CHECK_CUDA(heat_dev_step(cur, next, nloc, nx, row0, ny, stream));
            CHECK(rankmem_deallocate_async(mr, cur, field_bytes, 0, stream));
            /* MPI reads the new rows: the kernel must be done. */
            CHECK_CUDA(heat_dev_sync(stream));
        } else
#endif
        {
            step_host(cur, next, nloc, nx, row0, ny);
            CHECK(rankmem_deallocate_async(mr, cur, field_bytes, 0, stream));
        }
        cur = next;
        /* Halo rows, device buffers straight to MPI: the first row up and the
         * bottom halo from below, then the last row down and the top halo
         * from above. */
        MPI_Sendrecv(cur + nx, nx, MPI_DOUBLE, up, 0, cur + (size_t)(nloc + 1) * nx, nx,
                     MPI_DOUBLE, down, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(cur + (size_t)nloc * nx, nx, MPI_DOUBLE, down, 1, cur, nx, MPI_DOUBLE, up, 1,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    double t = MPI_Wtime() - t0, tmax = 0;
    MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);

    /* The whole field on rank 0, gathered from the ranks' (device) rows into
     * a pinned host buffer. */
    double *field = NULL;
    int *counts = NULL, *displs = NULL;
    if (rank == 0) {
        field = host_alloc((size_t)nx * ny * sizeof *field);
        counts = malloc((size_t)nranks * sizeof *counts);
        displs = malloc((size_t)nranks * sizeof *displs);
        if (!field || !counts || !displs) {
            fprintf(stderr, "heat[rank 0]: no host memory for the gathered field\n");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        for (int r = 0; r < nranks; r++) {
            int n, r0;
            rows_of(r, ny, &n, &r0);
            counts[r] = n * nx;
            displs[r] = r0 * nx;
        }
    }
    MPI_Gatherv(cur + nx, nloc * nx, MPI_DOUBLE, field, counts, displs, MPI_DOUBLE, 0,
                MPI_COMM_WORLD);
    CHECK(rankmem_deallocate_async(mr, cur, field_bytes, 0, stream));

    int gpus = 0;
    MPI_Reduce(&use_gpu, &gpus, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    /* The rank's own counters, from the stats adaptor on top of its chain. */
    rankmem_stats_t st;
    memset(&st, 0, sizeof st);
    st.size = sizeof st;
    if (rankmem_stats_get(mr, &st) != RANKMEM_SUCCESS)
        st.bytes_peak = st.count_total = 0;
    unsigned long long peak = st.bytes_peak, peak_max = 0;
    unsigned long long count = st.count_total, count_sum = 0;
    MPI_Reduce(&peak, &peak_max, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&count, &count_sum, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

    if (rank == 0) {
        /* Sum in a fixed order, and a hash of the bits: both identical for
         * any number of ranks. */
        double sum = 0;
        uint64_t hash = 14695981039346656037ull; /* FNV-1a, 64 bits */
        for (size_t i = 0; i < (size_t)nx * ny; i++) {
            sum += field[i];
            uint64_t bits;
            memcpy(&bits, &field[i], sizeof bits);
            for (int k = 0; k < 8; k++) {
                hash ^= (bits >> (8 * k)) & 0xff;
                hash *= 1099511628211ull;
            }
        }
        char spec[256] = "";
        if (rankmem_resource_describe(mr, spec, sizeof spec, NULL) != RANKMEM_SUCCESS)
            snprintf(spec, sizeof spec, "(not described)");
        printf("heat: %d x %d grid, %d steps on %d rank%s: %s\n", nx, ny, steps, nranks,
               nranks > 1 ? "s" : "",
               gpus == nranks ? "CUDA kernels on GPU memory"
               : gpus == 0    ? "host loops on host memory (no GPU)"
                              : "mixed GPU and host ranks");
        printf("heat: rank resource %s; host buffers from %s\n", spec,
               omp_ours ? "omp_alloc(rankmem_omp_pinned_mem_alloc)" : "malloc");
        printf("heat: %.3f s, %.1f ns per point and step\n", tmax,
               steps ? tmax * 1e9 / ((double)nx * ny * steps) : 0.0);
        printf("heat: %llu allocations over all ranks, largest rank peak %.2f MiB\n", count_sum,
               (double)peak_max / (1 << 20));
        printf("heat: centre %.6f\n", field[(size_t)(ny / 2) * nx + nx / 2]);
        printf("heat: checksum %.15e fnv1a %016llx\n", sum, (unsigned long long)hash);
        host_free(field);
        free(counts);
        free(displs);
    }

#ifdef HEAT_CUDA
    if (use_gpu) {
        /* The chain's pools keep memory per stream: tell them it goes away. */
        CHECK(rankmem_resource_forget_stream(mr, stream));
        CHECK_CUDA(heat_dev_stream_destroy(stream));
    }
#endif
    /* The plugin's report (RANKMEM_REPORT: rank 0's stderr by default). */
    MPI_Finalize();
    return 0;
}
