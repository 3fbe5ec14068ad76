/* rankmem MPI plugin: what the plugin's parts share (not installed).
 *
 * init.c (binding, the rank's resource, PMPI hooks) fills one record per
 * rank; report.c gathers the records on rank 0 and writes the report. The
 * record is fixed-size and plain so that one MPI_Gather of bytes moves it. */
#ifndef RANKMEM_MPI_INTERNAL_H
#define RANKMEM_MPI_INTERNAL_H

#include <stdint.h>
#include <mpi.h>

#define RK_MPI_HIDDEN __attribute__((visibility("hidden")))

/* The record is the report model's (report/model.h): one
 * definition for the plugin that writes it and rankmem-report that reads
 * it. The names below are the plugin's for the same things. */
#include "model.h"

#define RK_MPI_RECORD_VERSION RM_RECORD_VERSION

/* flags */
#define RK_MPI_HOST_FALLBACK RM_HOST_FALLBACK  /* no GPU: host memory */
#define RK_MPI_SHARED_GPU RM_SHARED_GPU        /* more ranks than GPUs on this node */
#define RK_MPI_BIND_MISMATCH RM_BIND_MISMATCH  /* launcher's local rank != communicator's */
#define RK_MPI_BIND_NONE RM_BIND_NONE          /* RANKMEM_BIND=none: the application chose */

typedef rm_record_t rk_mpi_record_t;

/* init.c: fill *rec with this rank's state now (any thread, after init). */
RK_MPI_HIDDEN void rk_mpi_fill_record(rk_mpi_record_t *rec);

/* report.c: the record now with what the report adds (observed memory,
 * the timeline over [0, now]) and, when texts is not NULL, the rank's
 * largest live sites (rec->leaks, their words in texts[RM_LEAK_TOP]).
 * Not collective; a normal context (it allocates, locks, resolves). */
RK_MPI_HIDDEN void rk_mpi_fill_now(rk_mpi_record_t *rec, char (*texts)[RM_SITE_TEXT]);

/* report.c: gather every rank's record over comm (collective) and write the
 * report at rank 0. path == NULL: follow RANKMEM_REPORT / RANKMEM_REPORT_FORMAT;
 * otherwise a path template (as RANKMEM_REPORT). Returns MPI_SUCCESS, or an
 * MPI error code of the gather; a failed write is a warning, not an error. */
RK_MPI_HIDDEN int rk_mpi_report_write(MPI_Comm comm, const char *path);

/* Whether the plugin is active (MPI_Init went through it and RANKMEM_BIND
 * etc. parsed); the report is skipped when 0. */
RK_MPI_HIDDEN int rk_mpi_active(void);

/* staging/base.c (issue 6): device buffers through an MPI that is not CUDA-aware.
 * init.c calls rk_mpi_staging_init() right after PMPI_Init (it decides
 * RANKMEM_STAGING once) and rk_mpi_staging_finalize() before the report;
 * rk_mpi_fill_record() asks rk_mpi_staging_counters() for the report. Weak
 * in init.c, so the plugin links without staging/base.c. */
RK_MPI_HIDDEN void rk_mpi_staging_init(void);
/* The ranks of comm on this rank's node (MPI_COMM_TYPE_SHARED, ordered by
 * key), split further into pretend nodes under the test-only setting
 * RANKMEM_TEST_NODE_RANKS (mpi/init.c); rk_mpi_pretend_node: this rank's
 * pretend node, -1 when the setting is off. */
RK_MPI_HIDDEN int rk_mpi_node_comm(MPI_Comm comm, int key, MPI_Comm *node);
RK_MPI_HIDDEN int rk_mpi_pretend_node(void);
/* 1 when MPI_Init should ask for MPI_THREAD_MULTIPLE, for staging's helper
 * thread: an MPI without a progress hook (MPICH), staging not off, and a
 * GPU (or RANKMEM_STAGING=on). Before PMPI_Init (mpi/staging/base.c). */
RK_MPI_HIDDEN int rk_stg_want_multiple(int have_gpu);
RK_MPI_HIDDEN void rk_mpi_staging_finalize(void);
RK_MPI_HIDDEN void rk_mpi_staging_counters(uint64_t *bytes, uint64_t *messages, uint64_t *ns);

#endif
