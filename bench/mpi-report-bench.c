/* How much the per-rank report adds to MPI_Finalize (bench/mpi-report-bench.sh
 * runs it at 64 ranks with RANKMEM_REPORT=off and with files in three
 * formats, and takes medians; docs/benchmarks.md has the figures).
 *
 *   mpi-report-bench finalize     each rank allocates a few buffers of its
 *                                 own sizes (so the report has something to
 *                                 say), the ranks meet in a barrier, and
 *                                 each times its MPI_Finalize; one line per
 *                                 rank: "finalize_us <rank> <microseconds>"
 *   mpi-report-bench direct N DIR N times, each after a barrier, as rank 0
 *                                 sees it: rankmem_mpi_report(MPI_COMM_WORLD,
 *                                 DIR/r) (what MPI_Finalize runs: broadcast,
 *                                 gather, analysis, the files of
 *                                 RANKMEM_REPORT_FORMAT), the same with
 *                                 "off", and a bare MPI_Bcast + MPI_Gather of
 *                                 the same sizes; one line per round:
 *                                 "direct_us <i> <report> <off> <bare MPI>" */
#include <rankmem.h>
#include <rankmem_mpi.h>

#include <mpi.h>
#include <stdio.h>
#include "mpi_internal.h" /* the record's size, for the MPI-only timing */
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const char *mode = argc > 1 ? argv[1] : "finalize";

    rankmem_resource_t *mr = rankmem_mpi_resource();
    void *p[4] = {NULL, NULL, NULL, NULL};
    size_t n[4];
    for (int i = 0; i < 4 && mr; i++) {
        n[i] = ((size_t)rank + 1) * ((size_t)4096 << i);
        if (rankmem_allocate(mr, n[i], 0, &p[i]) != RANKMEM_SUCCESS)
            p[i] = NULL;
    }
    /* Half of it back; the rest "leaks" on odd ranks, so the report has a
     * leak section to write. */
    for (int i = 0; i < 4 && mr; i++)
        if (p[i] && (i % 2 == 0 || rank % 2 == 0))
            rankmem_deallocate(mr, p[i], n[i], 0);

    if (strcmp(mode, "direct") == 0 && argc > 3) {
        int iters = atoi(argv[2]);
        char path[4096];
        snprintf(path, sizeof path, "%s/r", argv[3]);
        /* The report to files, then with "off" (the broadcast alone), then
         * the same collectives with nothing of rankmem's around them: what
         * MPI itself costs here (a one-int broadcast, a gather of one
         * record per rank). Each after a barrier, timed at rank 0. */
        int size;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        char rec[sizeof(rk_mpi_record_t)], *all = rank == 0 ? malloc((size_t)size * sizeof rec) : NULL;
        memset(rec, 0, sizeof rec);
        for (int i = 0; i < iters; i++) {
            double t[4];
            int want = 1;
            MPI_Barrier(MPI_COMM_WORLD);
            t[0] = now_us();
            rankmem_status_t st = rankmem_mpi_report(MPI_COMM_WORLD, path);
            t[1] = now_us();
            MPI_Barrier(MPI_COMM_WORLD);
            t[2] = now_us();
            rankmem_mpi_report(MPI_COMM_WORLD, "off");
            t[3] = now_us();
            MPI_Barrier(MPI_COMM_WORLD);
            double t4 = now_us();
            MPI_Bcast(&want, 1, MPI_INT, 0, MPI_COMM_WORLD);
            MPI_Gather(rec, (int)sizeof rec, MPI_BYTE, all, (int)sizeof rec, MPI_BYTE, 0,
                       MPI_COMM_WORLD);
            double t5 = now_us();
            if (rank == 0)
                printf("direct_us %d %.1f %.1f %.1f %s\n", i, t[1] - t[0], t[3] - t[2], t5 - t4,
                       rankmem_status_string(st));
        }
        free(all);
        fflush(stdout);
        MPI_Finalize();
        return 0;
    }

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now_us();
    MPI_Finalize();
    double t1 = now_us();
    printf("finalize_us %d %.1f\n", rank, t1 - t0);
    return 0;
}
