/* The run-time GPU-awareness queries (mpi/mpix.c) under mpirun, checked
 * against what the MPI library itself answers (its own function, looked up
 * in the library that holds PMPI_Init). Run by tests/mpi_staging/mpix.mpish.
 *
 *   mpix_fake on     the plugin's sources built in (-DRKT_FAKE) and a host
 *                    region taken for device memory: this rank stages, so
 *                    the query for staging's GPU kind answers 1
 *   mpix_fake off    the same with RANKMEM_STAGING=off: the MPI's answers
 *   mpix_plain absent     no rankmem at all: the MPI's answers
 *   mpix_plain preloaded  LD_PRELOAD=librankmem_mpi.so on a CPU: no rank
 *                    can stage, so the MPI's answers again
 *   mpix_plain staging    the same on a GPU machine with RANKMEM_STAGING=on:
 *                    every rank stages, 1 as for mpix_fake on
 *
 * Before MPI_Init and after MPI_Finalize the plugin answers 0 without
 * asking the MPI (MPICH aborts when its query is called then); the MPI's
 * own functions are not called then either. Where the plugin is there and
 * the MPI is MPICH,
 * MPIX_GPU_query_support(type, NULL) must return an error. */
#define _GNU_SOURCE
#include "config.h"

#include <dlfcn.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mtap.h"

#ifdef RKT_FAKE
#include "staging/staging.h"
/* The plugin's definitions are in this program: call them directly. */
int MPIX_Query_cuda_support(void);
int MPIX_Query_rocm_support(void);
int MPIX_Query_hip_support(void);
#endif

typedef int (*query_fn)(void);

/* The MPI library's own query of that name, NULL when it has none. */
static void *mpi_own(const char *name)
{
    Dl_info di;
    if (!dladdr((void *)(uintptr_t)PMPI_Init, &di) || !di.dli_fname)
        return NULL;
    void *h = dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        return NULL;
    void *f = dlsym(h, name);
    dlclose(h);
    return f;
}

/* The query a program calls (the plugin's when it is there). */
static void *called(const char *name)
{
#ifdef RKT_FAKE
    if (!strcmp(name, "MPIX_Query_cuda_support"))
        return (void *)(uintptr_t)MPIX_Query_cuda_support;
    if (!strcmp(name, "MPIX_Query_rocm_support"))
        return (void *)(uintptr_t)MPIX_Query_rocm_support;
    if (!strcmp(name, "MPIX_Query_hip_support"))
        return (void *)(uintptr_t)MPIX_Query_hip_support;
#endif
    return dlsym(RTLD_DEFAULT, name);
}

static int ask(void *f) { return f ? ((query_fn)(uintptr_t)f)() : 0; }

static const char *const names[3] = {"MPIX_Query_cuda_support", "MPIX_Query_rocm_support",
                                     "MPIX_Query_hip_support"};

/* What each of names[] must answer after MPI_Init: -1 the MPI's answer. */
static int expected[3] = {-1, -1, -1};

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int plugin = 1; /* the plugin's queries are there (not for mpix_plain absent) */
    int stages = 0;
#ifdef RKT_FAKE
    if (!strcmp(mode, "on")) {
        size_t bytes = (size_t)4 << 20;
        char *region = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (region == MAP_FAILED)
            return 1;
        rk_stg_fake_device(region, bytes);
        stages = 1;
    } else if (strcmp(mode, "off") != 0) {
        fprintf(stderr, "usage: mpix_fake on|off\n");
        return 2;
    }
#else
    if (!strcmp(mode, "absent"))
        plugin = 0;
    else if (!strcmp(mode, "staging"))
        stages = 1;
    else if (strcmp(mode, "preloaded") != 0) {
        fprintf(stderr, "usage: mpix_plain absent|preloaded|staging\n");
        return 2;
    }
#endif
    /* Staging speaks for CUDA, or for HIP in a HIP build. */
    if (stages) {
#if HAVE_HIP
        expected[1] = expected[2] = 1;
#else
        expected[0] = 1;
#endif
    }

    int before[3];
    for (int i = 0; i < 3; i++)
        before[i] = plugin ? ask(called(names[i])) : 0;

    MPI_Init(&argc, &argv);
#ifdef RKT_FAKE
    rk_mpi_staging_init(); /* as init.c calls it (a no-op when it did) */
#endif

#ifndef RKT_FAKE
    int present = dlsym(RTLD_DEFAULT, "rankmem_mpi_local_rank") != NULL;
    mok(present == plugin, "the plugin is %s", plugin ? "preloaded" : "absent");
#endif
    for (int i = 0; i < 3 && plugin; i++)
        mok(before[i] == 0, "before MPI_Init, %s answers 0 (%d)", names[i], before[i]);
    if (!plugin)
        mskip("before MPI_Init: without the plugin the MPI's queries may abort");
    for (int i = 0; i < 3; i++) {
        int got = ask(called(names[i])), mpi = ask(mpi_own(names[i]));
        int want = expected[i] >= 0 ? expected[i] : mpi;
        mok(got == want, "%s answers %d (%d; the MPI alone: %d%s)", names[i], want, got, mpi,
            mpi_own(names[i]) ? "" : ", it has no such function");
    }

#if defined(MPICH_NUMVERSION) && defined(MPIX_GPU_SUPPORT_CUDA) && defined(MPIX_GPU_SUPPORT_HIP)
    {
        typedef int (*gpu_fn)(int, int *);
        const int types[2] = {MPIX_GPU_SUPPORT_CUDA, MPIX_GPU_SUPPORT_HIP};
        const int *want = expected[0] == 1 ? (const int[]){1, -1} :
                          expected[1] == 1 ? (const int[]){-1, 1} : (const int[]){-1, -1};
        gpu_fn ours = (gpu_fn)(uintptr_t)MPIX_GPU_query_support;
        gpu_fn own = (gpu_fn)(uintptr_t)mpi_own("MPIX_GPU_query_support");
        for (int i = 0; i < 2; i++) {
            int got = -7, mpi = 0, rc = ours(types[i], &got);
            if (own)
                own(types[i], &mpi);
            int w = want[i] >= 0 ? want[i] : mpi;
            mok(rc == MPI_SUCCESS && got == w, "MPIX_GPU_query_support(%s) gives %d (rc %d, %d)",
                i ? "HIP" : "CUDA", w, rc, got);
        }
        if (plugin)
            mok(ours(MPIX_GPU_SUPPORT_CUDA, NULL) != MPI_SUCCESS,
                "MPIX_GPU_query_support(CUDA, NULL) returns an error");
    }
#else
    mskip("MPIX_GPU_query_support: MPICH only");
#endif

    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Finalize();

    /* Each rank alone now: a failure is a line on stderr and the exit
     * status; rank 0 prints the result. */
    int bad = 0;
    for (int i = 0; i < 3 && plugin; i++) {
        int got = ask(called(names[i]));
        if (got != 0) {
            fprintf(stderr, "# rank %d: FAILED: after MPI_Finalize %s answers %d\n", rank,
                    names[i], got);
            bad = 1;
        }
    }
#if defined(MPICH_NUMVERSION) && defined(MPIX_GPU_SUPPORT_CUDA) && defined(MPIX_GPU_SUPPORT_HIP)
    if (plugin) {
        int yes = -7, rc = MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &yes);
        if (rc != MPI_SUCCESS || yes != 0) {
            fprintf(stderr, "# rank %d: FAILED: after MPI_Finalize MPIX_GPU_query_support "
                    "gives rc %d, %d\n", rank, rc, yes);
            bad = 1;
        }
    }
#endif
    if (rank == 0 && plugin)
        printf("%sok - after MPI_Finalize the queries answer 0\n", bad ? "not " : "");
    else if (rank == 0)
        printf("ok - # SKIP after MPI_Finalize: without the plugin the MPI's queries may abort\n");
    return bad;
}
