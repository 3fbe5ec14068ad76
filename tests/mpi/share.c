/* rankmem_mpi_share / rankmem_mpi_import / rankmem_mpi_share_pointers
 * between 2 ranks (tests/mpi/share.mpish). Everywhere: bad inputs give
 * clear statuses on every rank and nobody hangs. With a GPU: rank 0 makes
 * an exportable async pool, writes a pattern and shares; rank 1 imports,
 * reads it, writes another and frees its import; then rank 0 reads rank
 * 1's pattern and frees. */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <rankmem_mpi.h>

#include "mtap.h"

#if HAVE_GPU
#include "../../src/gpu_api.h" /* CUDA, or HIP through the same names */
#endif

#define N (1u << 20) /* 4 MiB of uint32_t */

#if HAVE_GPU /* the patterns are only needed where device memory is shared */
static int all_equal(const uint32_t *h, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        if (h[i] != base + (uint32_t)i)
            return 0;
    return 1;
}

static void fill(uint32_t *h, size_t n, uint32_t base)
{
    for (size_t i = 0; i < n; i++)
        h[i] = base + (uint32_t)i;
}
#endif

static void bad_inputs(int rank)
{
    rankmem_resource_t *sys = NULL, *imp = NULL;
    rankmem_system_create(&sys);
    rankmem_status_t st;
    /* Root with a resource that is not async: every rank fails, nobody hangs. */
    if (rank == 0)
        st = rankmem_mpi_share(sys, 0, MPI_COMM_WORLD);
    else
        st = rankmem_mpi_import(0, MPI_COMM_WORLD, &imp);
    mok(st != RANKMEM_SUCCESS && imp == NULL, "share of a system resource fails on every rank (%s)",
        rankmem_status_string(st));
    /* Both ranks in the wrong role. */
    if (rank == 0)
        st = rankmem_mpi_import(0, MPI_COMM_WORLD, &imp);
    else
        st = rankmem_mpi_share(sys, 0, MPI_COMM_WORLD);
    mok(st == RANKMEM_ERR_INVALID_ARGUMENT && imp == NULL, "wrong roles: invalid argument (%s)",
        rankmem_status_string(st));
    /* A root that is no rank: answered at once, the same on every rank. */
    st = rank == 0 ? rankmem_mpi_share(sys, 5, MPI_COMM_WORLD)
                   : rankmem_mpi_import(5, MPI_COMM_WORLD, &imp);
    mok(st == RANKMEM_ERR_INVALID_ARGUMENT, "root 5 of 2 ranks: invalid argument");
    st = rank == 0 ? rankmem_mpi_share(sys, 0, MPI_COMM_NULL)
                   : rankmem_mpi_import(0, MPI_COMM_NULL, &imp);
    mok(st == RANKMEM_ERR_INVALID_ARGUMENT, "MPI_COMM_NULL: invalid argument");
    /* NULL output on the importer. */
    st = rank == 0 ? rankmem_mpi_share(sys, 0, MPI_COMM_WORLD)
                   : rankmem_mpi_import(0, MPI_COMM_WORLD, NULL);
    mok(st != RANKMEM_SUCCESS, "NULL output on the importer: every rank fails");
    /* Pointers of a resource that is not async. */
    int x = 0;
    void *ptrs[1] = {&x};
    st = rankmem_mpi_share_pointers(sys, ptrs, 1, 0, MPI_COMM_WORLD);
    mok(st == RANKMEM_ERR_INVALID_ARGUMENT, "share_pointers with system resources: invalid argument (%s)",
        rankmem_status_string(st));
    st = rankmem_mpi_share_pointers(NULL, ptrs, 1, 0, MPI_COMM_WORLD);
    mok(st == RANKMEM_ERR_INVALID_ARGUMENT, "share_pointers with NULL resources: invalid argument");
    st = rankmem_mpi_share_pointers(sys, ptrs, 0, 0, MPI_COMM_WORLD);
    mok(st == RANKMEM_SUCCESS, "share_pointers of 0 pointers: nothing to do");
    rankmem_resource_release(sys);
}

#if HAVE_GPU
static int check_rt(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "# %s: %s\n", what, cudaGetErrorString(err));
        return 0;
    }
    return 1;
}

static void gpu_share(int rank)
{
    uint32_t *h = malloc(N * sizeof *h);
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = RANKMEM_SUCCESS;
    void *p = NULL;
    int good = h != NULL;
    if (rank == 0) {
        rankmem_async_params_t prm;
        rankmem_async_params_default(&prm);
        prm.handle_type = RANKMEM_HANDLE_POSIX_FD;
        st = rankmem_async_create(&prm, &mr);
        if (st != RANKMEM_SUCCESS)
            fprintf(stderr, "# async_create: %s\n", rankmem_last_error());
        if (st == RANKMEM_SUCCESS)
            st = rankmem_allocate_async(mr, N * sizeof *h, 0, 0, &p);
        if (st == RANKMEM_SUCCESS && good) {
            fill(h, N, 0x10000000u);
            /* Synchronous on the allocating (legacy default) stream: the
             * allocation and the pattern are done before anyone imports. */
            good = check_rt(cudaMemcpy(p, h, N * sizeof *h, cudaMemcpyDefault), "cudaMemcpy to device");
        }
    }
    mok(st == RANKMEM_SUCCESS && good, "rank 0: exportable pool, 4 MiB written");
    if (st != RANKMEM_SUCCESS || !good) {
        free(h);
        return;
    }
    if (rank == 0)
        st = rankmem_mpi_share(mr, 0, MPI_COMM_WORLD);
    else
        st = rankmem_mpi_import(0, MPI_COMM_WORLD, &mr);
    mok(st == RANKMEM_SUCCESS, "pool shared by rank 0, imported by the others (%s)",
        rankmem_status_string(st));
    if (st != RANKMEM_SUCCESS) {
        if (rank == 0) {
            rankmem_deallocate_async(mr, p, N * sizeof *h, 0, 0);
            rankmem_resource_release(mr);
        }
        free(h);
        return;
    }
    st = rankmem_mpi_share_pointers(mr, &p, 1, 0, MPI_COMM_WORLD);
    mok(st == RANKMEM_SUCCESS, "pointer shared (%s)", rankmem_status_string(st));
    int read_ok = 1, wrote = 1;
    if (st == RANKMEM_SUCCESS && rank != 0) {
        memset(h, 0, N * sizeof *h);
        read_ok = check_rt(cudaMemcpy(h, p, N * sizeof *h, cudaMemcpyDefault), "cudaMemcpy from import") &&
                  all_equal(h, N, 0x10000000u);
        if (rank == 1) {
            fill(h, N, 0x20000000u);
            wrote = check_rt(cudaMemcpy(p, h, N * sizeof *h, cudaMemcpyDefault), "cudaMemcpy to import");
        }
    }
    mok(read_ok, "importers read rank 0's pattern from the same device memory");
    mok(wrote, "rank 1 wrote its own pattern");
    int freed = 1;
    if (st == RANKMEM_SUCCESS && rank != 0)
        freed = rankmem_async_free_imported(mr, p) == RANKMEM_SUCCESS;
    mok(freed, "importers freed their import");
    if (rank != 0)
        freed = rankmem_resource_release(mr) == RANKMEM_SUCCESS;
    mok(freed, "importers released the imported pool");
    /* The importers' frees are complete before the exporter's. */
    MPI_Barrier(MPI_COMM_WORLD);
    int seen = 1, done = 1;
    if (rank == 0) {
        memset(h, 0, N * sizeof *h);
        seen = check_rt(cudaMemcpy(h, p, N * sizeof *h, cudaMemcpyDefault), "cudaMemcpy from device") &&
               all_equal(h, N, 0x20000000u);
        done = rankmem_deallocate_async(mr, p, N * sizeof *h, 0, 0) == RANKMEM_SUCCESS &&
               check_rt(cudaStreamSynchronize(0), "cudaStreamSynchronize") &&
               rankmem_resource_release(mr) == RANKMEM_SUCCESS;
    }
    mok(seen, "rank 0 reads rank 1's pattern");
    mok(done, "rank 0 freed after the importers, pool destroyed");
    free(h);
}
#endif

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, ndev = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    rankmem_device_count(&ndev);
    int min_dev = ndev;
    MPI_Allreduce(&ndev, &min_dev, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    mdiag("share: %d ranks, %d device(s) seen by every rank", size, min_dev);
    bad_inputs(rank);
#if HAVE_GPU
    if (min_dev > 0)
        gpu_share(rank);
    else
        mskip("no GPU: sharing device memory not run");
#else
    mskip("built without CUDA or HIP: sharing device memory not run");
#endif
    MPI_Finalize();
    return mtap_failed_ ? 1 : 0;
}
