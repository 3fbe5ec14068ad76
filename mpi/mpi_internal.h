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

/* Bump when a field is added; the JSON report carries it as "schema". */
#define RK_MPI_RECORD_VERSION 1

/* flags */
#define RK_MPI_HOST_FALLBACK 0x1u   /* no GPU: host memory */
#define RK_MPI_SHARED_GPU 0x2u      /* more ranks than GPUs on this node */
#define RK_MPI_BIND_MISMATCH 0x4u   /* launcher's local rank != communicator's */
#define RK_MPI_BIND_NONE 0x8u       /* RANKMEM_BIND=none: the application chose */

typedef struct rk_mpi_record {
    uint32_t version;           /* RK_MPI_RECORD_VERSION */
    uint32_t flags;             /* RK_MPI_* above */
    int32_t rank, size;         /* in MPI_COMM_WORLD */
    int32_t local_rank;         /* from the shared-memory communicator */
    int32_t local_size;
    int32_t env_local_rank;     /* from the launcher's environment, -1 if none */
    int32_t device;             /* CUDA device index, -1 on host fallback */
    int32_t node_devices;       /* visible devices on this node */
    char host[64];
    char device_name[96];
    char pci_bus_id[32];        /* "0000:3b:00.0" or "" */
    char bind_mode[32];         /* auto | none | nearest | list:... (truncated) */
    char spec[256];             /* the resource spec, as described back */
    uint64_t bytes_peak;        /* from the stats adaptor on top of the chain */
    uint64_t bytes_current;     /* still allocated at finalize (leak) */
    uint64_t bytes_total;
    uint64_t count_total, count_peak, count_current;
    uint64_t reserved_peak;     /* RANKMEM_QUERY_RESERVED_HIGH below stats; 0 if unknown */
    uint64_t dev_total_init, dev_free_init;    /* cudaMemGetInfo at init */
    uint64_t dev_total_final, dev_free_final;  /* and at finalize (or report) */
    uint64_t alloc_ns;          /* time spent in allocate/deallocate */
    uint64_t staged_bytes, staged_messages, staged_ns; /* staging (issue 6); 0 until then */
    double wall_s;              /* seconds since MPI_Init */
} rk_mpi_record_t;

/* init.c: fill *rec with this rank's state now (any thread, after init). */
RK_MPI_HIDDEN void rk_mpi_fill_record(rk_mpi_record_t *rec);

/* report.c: gather every rank's record over comm (collective) and write the
 * report at rank 0. path == NULL: follow RANKMEM_REPORT / RANKMEM_REPORT_FORMAT;
 * otherwise a path template (as RANKMEM_REPORT). Returns MPI_SUCCESS, or an
 * MPI error code of the gather; a failed write is a warning, not an error. */
RK_MPI_HIDDEN int rk_mpi_report_write(MPI_Comm comm, const char *path);

/* Whether the plugin is active (MPI_Init went through it and RANKMEM_BIND
 * etc. parsed); the report is skipped when 0. */
RK_MPI_HIDDEN int rk_mpi_active(void);

/* staging.c (issue 6): device buffers through an MPI that is not CUDA-aware.
 * init.c calls rk_mpi_staging_init() right after PMPI_Init (it decides
 * RANKMEM_STAGING once) and rk_mpi_staging_finalize() before the report;
 * rk_mpi_fill_record() asks rk_mpi_staging_counters() for the report. Weak
 * in init.c, so the plugin links without staging.c. */
RK_MPI_HIDDEN void rk_mpi_staging_init(void);
RK_MPI_HIDDEN void rk_mpi_staging_finalize(void);
RK_MPI_HIDDEN void rk_mpi_staging_counters(uint64_t *bytes, uint64_t *messages, uint64_t *ns);

#endif
