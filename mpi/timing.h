/* The timing adaptor (timing.c), in a header of its own without MPI: the
 * benchmark (bench/bench.cu) builds timing.c into itself to time the MPI
 * plugin's default chain outside MPI. Not installed. */
#ifndef RANKMEM_MPI_TIMING_H
#define RANKMEM_MPI_TIMING_H

#include <stdint.h>
#include <rankmem.h>

#ifndef RK_MPI_HIDDEN
#define RK_MPI_HIDDEN __attribute__((visibility("hidden")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A pass-through resource that measures the time spent in its upstream's
 * allocate and deallocate (CLOCK_MONOTONIC: a vDSO read, no system call),
 * one call in `period` (32 unless set). Retains upstream. */
RK_MPI_HIDDEN rankmem_status_t rk_mpi_timing_create(rankmem_resource_t *upstream,
                                                    rankmem_resource_t **mr_p);
/* stats is a stats adaptor right above mr (its upstream), made before any
 * call went through mr: from now on the layer takes its call count from
 * stats' counters (allocations + frees + failures) and keeps none of its
 * own, which makes its untimed call cheaper. stats is not retained (it
 * holds mr): read mr (rk_mpi_timing_read) only while stats lives.
 * RANKMEM_ERR_INVALID_ARGUMENT (nothing changed) otherwise. */
RK_MPI_HIDDEN rankmem_status_t rk_mpi_timing_count_from(rankmem_resource_t *mr,
                                                        rankmem_resource_t *stats);
/* Mean calls between timed ones, per thread: 1 times every call (exact
 * sums, four clock reads a pair), up to 2^20. */
RK_MPI_HIDDEN rankmem_status_t rk_mpi_timing_set_period(rankmem_resource_t *mr,
                                                        unsigned period);

typedef struct rk_mpi_timing {
    uint64_t ns;         /* the estimate: sampled_ns * calls / sampled (0 before any sample) */
    uint64_t sampled_ns; /* the time of the timed calls */
    uint64_t calls;      /* allocate and deallocate calls, all of them */
    uint64_t sampled;    /* timed calls */
} rk_mpi_timing_t;

RK_MPI_HIDDEN rankmem_status_t rk_mpi_timing_read(const rankmem_resource_t *mr,
                                                  rk_mpi_timing_t *out_p);
/* The estimate so far (0 for anything that is not a timing resource). */
RK_MPI_HIDDEN uint64_t rk_mpi_timing_ns(const rankmem_resource_t *mr);
RK_MPI_HIDDEN uint64_t rk_mpi_now_ns(void);

#ifdef __cplusplus
}
#endif

#endif
