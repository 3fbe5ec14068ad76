/* Rank 1 calls MPI_Abort while the others go into MPI_Finalize, where the
 * plugin gathers the report: the launcher must end every rank (nobody waits
 * in rankmem for the rank that left). tests/mpi/settings.mpish runs it under
 * a timeout and expects a non-zero exit. */
#include <mpi.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 1) {
        usleep(200000); /* let the others reach MPI_Finalize first */
        fprintf(stderr, "abort test: rank 1 calls MPI_Abort\n");
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    MPI_Finalize();
    return 0;
}
