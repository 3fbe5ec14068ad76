/* An MPI program that knows nothing of rankmem (built without its headers
 * or libraries). Under LD_PRELOAD=librankmem_mpi.so the plugin hooks its
 * MPI_Init; the program finds the plugin's getters with dlsym and checks
 * them against MPI. Run by tests/mpi/preload.mpish.
 *   plain preloaded   the plugin must be there
 *   plain absent      it must not */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "mtap.h"

int main(int argc, char **argv)
{
    int want = argc > 1 && strcmp(argv[1], "preloaded") == 0;
    MPI_Init(&argc, &argv);
    MPI_Comm node;
    int lrank = -2;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &lrank);
    MPI_Comm_free(&node);
    int (*local_rank)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "rankmem_mpi_local_rank");
    void *(*resource)(void) = (void *(*)(void))dlsym(RTLD_DEFAULT, "rankmem_mpi_resource");
    if (want) {
        mok(local_rank && resource, "the preloaded plugin's getters are in the process");
        mok(local_rank && local_rank() == lrank, "its local rank is the communicator's (%d)",
            local_rank ? local_rank() : -2);
        mok(resource && resource() != NULL, "it installed the rank's resource");
    } else {
        mok(!local_rank && !resource, "without LD_PRELOAD the plugin is not there");
    }
    MPI_Finalize();
    return 0;
}
