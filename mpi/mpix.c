/* Run-time GPU-awareness queries (issue 20): codes that ask the MPI library
 * whether it takes device buffers (Open MPI's MPIX_Query_cuda_support and
 * MPIX_Query_rocm_support, MPICH's MPIX_Query_cuda_support,
 * MPIX_Query_hip_support and MPIX_GPU_query_support) get yes while this rank
 * stages its device buffers, since any device buffer they pass to MPI is
 * then handled. Otherwise, between MPI_Init and MPI_Finalize, the MPI
 * library's own answer (its function, found with dlsym(RTLD_NEXT, ...)), or
 * 0 when it has none: with staging off (an MPI that is CUDA-aware itself
 * answers yes), and for the other vendor's GPUs, which staging does not
 * detect. Before MPI_Init and after MPI_Finalize, 0 without asking: MPICH
 * aborts the process when its query is called then, and Open MPI documents
 * its own as valid only after MPI_Init. docs/staging.md, "Run-time
 * CUDA-awareness queries".
 *
 * The compile-time macro (MPIX_CUDA_AWARE_SUPPORT in Open MPI's mpi-ext.h)
 * belongs to the MPI's headers and cannot be changed from here.
 *
 * staging/base.c's own query at MPI_Init (mpi_cuda_aware) lands here when the
 * plugin's symbol comes first; it gets the library's answer because
 * rk_stg_on is still 0 while staging is being decided. */
#define _GNU_SOURCE
#include "staging/staging.h"

#include <dlfcn.h>
#include <stdint.h>

#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h> /* Open MPI: its prototypes, checked against ours */
#endif
#endif

/* Which vendor's buffers staging detects: the HIP build asks the HIP
 * runtime, every other build (the test backend without CUDA included)
 * speaks for CUDA, as staging/base.c's messages do. */
#if HAVE_HIP
#define RK_MPIX_CUDA 0
#define RK_MPIX_HIP 1
#else
#define RK_MPIX_CUDA 1
#define RK_MPIX_HIP 0
#endif

/* MPICH defines its GPU kinds in mpi.h, as macros; other MPIs have no such
 * constants, and guessing their numbers could answer yes for the wrong GPU,
 * so MPIX_GPU_query_support exists only against MPICH. */
#if defined(MPICH_NUMVERSION) && defined(MPIX_GPU_SUPPORT_CUDA) && defined(MPIX_GPU_SUPPORT_HIP)
#define RK_MPIX_GPU_QUERY 1
#else
#define RK_MPIX_GPU_QUERY 0
#endif

/* Prototypes for the names an MPI's headers may not declare (the same
 * signatures as the libraries that have them). */
RK_MPI_EXPORT int MPIX_Query_cuda_support(void);
RK_MPI_EXPORT int MPIX_Query_rocm_support(void);
RK_MPI_EXPORT int MPIX_Query_hip_support(void);

/* Does this rank hand every device buffer MPI receives to staging? The
 * one place to widen when another path (IPC) takes device buffers on its
 * own. */
static int handles_device(void) { return rk_stg_on != 0; }

/* The MPI library's own function of that name: the next definition after
 * ours, NULL when it has none (or only ours, loaded twice). Looked up once;
 * a race looks it up twice and stores the same answer. */
typedef int (*query_fn)(void);

static void *next_symbol(const char *name, void *self)
{
    void *f = dlsym(RTLD_NEXT, name);
    return f == self ? NULL : f;
}

/* Between MPI_Init and MPI_Finalize (both queries are valid at any time). */
static int mpi_live(void)
{
    int init = 0, fini = 0;
    return PMPI_Initialized(&init) == MPI_SUCCESS && init && PMPI_Finalized(&fini) == MPI_SUCCESS &&
           !fini;
}

static int ask_mpi(const char *name, _Atomic(uintptr_t) *cache, void *self)
{
    if (!mpi_live())
        return 0;
    uintptr_t f = atomic_load_explicit(cache, memory_order_acquire);
    if (f == 0) {
        void *p = next_symbol(name, self);
        f = p ? (uintptr_t)p : 1; /* 1: looked up, absent */
        atomic_store_explicit(cache, f, memory_order_release);
    }
    return f == 1 ? 0 : ((query_fn)f)();
}

static _Atomic(uintptr_t) next_cuda, next_rocm, next_hip;

int MPIX_Query_cuda_support(void)
{
    if (RK_MPIX_CUDA && handles_device())
        return 1;
    return ask_mpi("MPIX_Query_cuda_support", &next_cuda, (void *)(uintptr_t)MPIX_Query_cuda_support);
}

int MPIX_Query_rocm_support(void)
{
    if (RK_MPIX_HIP && handles_device())
        return 1;
    return ask_mpi("MPIX_Query_rocm_support", &next_rocm, (void *)(uintptr_t)MPIX_Query_rocm_support);
}

/* MPICH's name for the same question. */
int MPIX_Query_hip_support(void)
{
    if (RK_MPIX_HIP && handles_device())
        return 1;
    return ask_mpi("MPIX_Query_hip_support", &next_hip, (void *)(uintptr_t)MPIX_Query_hip_support);
}

#if RK_MPIX_GPU_QUERY
RK_MPI_EXPORT int MPIX_GPU_query_support(int gpu_type, int *is_supported);

static _Atomic(uintptr_t) next_gpu;

int MPIX_GPU_query_support(int gpu_type, int *is_supported)
{
    if (!is_supported)
        return MPI_ERR_ARG;
    if (handles_device() && ((RK_MPIX_CUDA && gpu_type == MPIX_GPU_SUPPORT_CUDA) ||
                             (RK_MPIX_HIP && gpu_type == MPIX_GPU_SUPPORT_HIP))) {
        *is_supported = 1;
        return MPI_SUCCESS;
    }
    if (!mpi_live()) {
        *is_supported = 0;
        return MPI_SUCCESS;
    }
    uintptr_t f = atomic_load_explicit(&next_gpu, memory_order_acquire);
    if (f == 0) {
        void *p = next_symbol("MPIX_GPU_query_support", (void *)(uintptr_t)MPIX_GPU_query_support);
        f = p ? (uintptr_t)p : 1;
        atomic_store_explicit(&next_gpu, f, memory_order_release);
    }
    if (f == 1) {
        *is_supported = 0;
        return MPI_SUCCESS;
    }
    return ((int (*)(int, int *))f)(gpu_type, is_supported);
}
#endif
