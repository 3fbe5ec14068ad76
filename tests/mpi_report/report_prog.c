/* The MPI report's test program (run by tests/mpi_report/report.mpish
 * under $MPIRUN with 4 ranks; check.py reads what it leaves).
 *
 * Each rank allocates sizes of its own through the plugin's resource, so
 * that every field of the report has one right value per rank and the
 * rank of each maximum is known (check.py computes the same sizes):
 *   a = (r + 1) MiB + 1000 r,  b = 256 KiB (r + 1)   both live: the peak
 *   b freed; odd ranks then leak c = 8 KiB (r + 1)   (c < b: peak unchanged)
 *   a freed.
 * With the argument "midrun" it also writes reports mid-run: at the peak
 * (rankmem_mpi_report), after the frees (MPI_Pcontrol(2) and
 * MPI_Pcontrol(3, "after setup")), and over the even ranks only
 * (rankmem_mpi_report on a split communicator, path in $RKT_SUB_REPORT).
 * What each rank did goes to stderr as one "RESULT ..." line. */
#include <rankmem.h>
#include <rankmem_mpi.h>

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *take(rankmem_resource_t *mr, size_t n)
{
    void *p = NULL;
    rankmem_status_t st = rankmem_allocate(mr, n, 256, &p);
    if (st != RANKMEM_SUCCESS) {
        fprintf(stderr, "report_prog: allocating %zu bytes: %s (%s)\n", n,
                rankmem_status_string(st), rankmem_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return p;
}

static void give(rankmem_resource_t *mr, void *p, size_t n)
{
    rankmem_status_t st = rankmem_deallocate(mr, p, n, 256);
    if (st != RANKMEM_SUCCESS) {
        fprintf(stderr, "report_prog: freeing %zu bytes: %s\n", n, rankmem_status_string(st));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int midrun = argc > 1 && strcmp(argv[1], "midrun") == 0;

    rankmem_resource_t *mr = rankmem_mpi_resource();
    if (!mr) {
        fprintf(stderr, "report_prog: rank %d: no resource from the plugin\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t a = ((size_t)rank + 1) * (1u << 20) + 1000u * (size_t)rank;
    size_t b = ((size_t)rank + 1) * (256u << 10);
    size_t c = ((size_t)rank + 1) * (8u << 10);
    void *pa = take(mr, a), *pb = take(mr, b), *pc = NULL;

    int bad_comm = -1, at_peak = -1, sub = -1;
    if (midrun) {
        bad_comm = (int)rankmem_mpi_report(MPI_COMM_NULL, NULL);
        at_peak = (int)rankmem_mpi_report(MPI_COMM_WORLD, NULL);
    }
    give(mr, pb, b);
    if (rank % 2)
        pc = take(mr, c); /* leaked on purpose */
    (void)pc;
    give(mr, pa, a);
    if (midrun) {
        MPI_Pcontrol(2);
        MPI_Pcontrol(3, "after setup");
        MPI_Pcontrol(1); /* not ours: to the MPI library */
        MPI_Comm even;
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &even);
        if (rank % 2 == 0)
            sub = (int)rankmem_mpi_report(even, getenv("RKT_SUB_REPORT"));
        MPI_Comm_free(&even);
    }

    char host[256] = "";
    gethostname(host, sizeof host - 1);
    char line[512];
    snprintf(line, sizeof line,
             "RESULT rank=%d size=%d pid=%ld host=%s device=%d local_rank=%d bad_comm=%d "
             "at_peak=%d sub=%d\n",
             rank, size, (long)getpid(), host, rankmem_mpi_device(), rankmem_mpi_local_rank(),
             bad_comm, at_peak, sub);
    fputs(line, stderr);
    fflush(stderr);
    MPI_Finalize();
    return 0;
}
