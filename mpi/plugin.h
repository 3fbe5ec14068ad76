/* rankmem MPI plugin: what init.c, bind.c, gpu.c, timing.c, alloc_mem.c,
 * fortran.c, observe.c and intercept.c share (not installed; every symbol
 * hidden). The record and the report's entry points are in mpi_internal.h. */
#ifndef RANKMEM_MPI_PLUGIN_H
#define RANKMEM_MPI_PLUGIN_H

#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <rankmem.h>
#include <rankmem_mpi.h>

#include "mpi_internal.h"
#include "recorder.h"
#include "intercept_map.h"
#include "timing.h"

/* The recorder's per-thread depth (recorder.h), read and raised on hot
 * paths (the timing layer, the interposer): the plugin is loaded with the
 * program (LD_PRELOAD or linked), so the initial-exec model is safe and
 * spares a __tls_get_addr call per access. */
extern __thread int rk_obs_internal_depth
    __attribute__((tls_model("initial-exec"), visibility("hidden")));
extern __thread const void *rk_obs_caller
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

/* The interposed MPI entry points are the only non-rankmem_* symbols the
 * library exports. */
#define RK_MPI_EXPORT __attribute__((visibility("default")))
#define RK_MPI_PRINTF(a, b) __attribute__((format(printf, a, b)))

/* ---- messages (init.c) ---- */

/* "rankmem-mpi[rank N]: ..." on stderr, one write so that ranks' lines do
 * not interleave. Rank is MPI_COMM_WORLD's once known, else the launcher's. */
RK_MPI_HIDDEN void rk_mpi_warn(const char *fmt, ...) RK_MPI_PRINTF(1, 2);
/* The same, only when RANKMEM_MPI_VERBOSE is on. */
RK_MPI_HIDDEN void rk_mpi_verbose(const char *fmt, ...) RK_MPI_PRINTF(1, 2);

/* ---- binding (bind.c): pure logic, no MPI and no CUDA, unit-tested ---- */

typedef enum { RK_BIND_AUTO = 0, RK_BIND_NONE, RK_BIND_NEAREST, RK_BIND_LIST } rk_bind_mode_t;

#define RK_BIND_LIST_MAX 256

typedef struct rk_bind_spec {
    rk_bind_mode_t mode;
    int nlist;
    int list[RK_BIND_LIST_MAX]; /* RK_BIND_LIST: device indices, in order */
} rk_bind_spec_t;

/* Parse a RANKMEM_BIND value: auto | none | nearest | list:I,J,... (indices
 * >= 0, at most RK_BIND_LIST_MAX). 0 on success; -1 with a reason in why
 * (len bytes) otherwise. Leading and trailing blanks are not allowed: the
 * option table's own check is as strict. */
RK_MPI_HIDDEN int rk_bind_parse(const char *text, rk_bind_spec_t *spec, char *why, size_t len);

/* The node-local rank from the launcher's environment, before MPI_Init:
 * the first of OMPI_COMM_WORLD_LOCAL_RANK, MV2_COMM_WORLD_LOCAL_RANK,
 * MPI_LOCALRANKID, SLURM_LOCALID, PMI_LOCAL_RANK, PALS_LOCAL_RANKID,
 * FLUX_TASK_LOCAL_ID that holds a non-negative integer. -1 if none; *var_p
 * (may be NULL) names the variable used. */
RK_MPI_HIDDEN int rk_bind_env_local_rank(const char **var_p);

/* Parse a Linux cpumask ("ff,00000000,0000ffff", as in sysfs local_cpus)
 * into bits (nbits wide, bit i = CPU i). 0, or -1 if malformed. */
RK_MPI_HIDDEN int rk_bind_parse_cpumask(const char *text, unsigned char *bits, size_t nbits);

/* The device for this rank. ndev > 0. local_rank >= 0. overlap (may be
 * NULL unless mode is nearest): for each device, how many of the rank's
 * CPUs are local to it (-1: unknown). Returns a device index, or -1 with
 * a reason in why for a list naming a device >= ndev. auto: local_rank
 * round-robin; list: list[local_rank % nlist]; nearest: round-robin over
 * the devices with the largest overlap (all of them when it is unknown). */
RK_MPI_HIDDEN int rk_bind_choose(const rk_bind_spec_t *spec, int local_rank, int ndev,
                                 const int *overlap, char *why, size_t len);

/* ---- GPU (rank_gpu.c): all "no GPU" in a build without CUDA ---- */

/* Visible devices (rankmem_device_count: 0 when there is none). */
RK_MPI_HIDDEN int rk_mpi_gpu_count(void);
/* cudaSetDevice; 0 or -1 (message printed). */
RK_MPI_HIDDEN int rk_mpi_gpu_set(int device);
/* The current device, or -1. */
RK_MPI_HIDDEN int rk_mpi_gpu_current(void);
/* Name and PCI bus id ("0000:3b:00.0", lower case) of a device; "" when unknown. */
RK_MPI_HIDDEN void rk_mpi_gpu_describe(int device, char *name, size_t name_len, char *busid,
                                       size_t busid_len);
/* cudaMemGetInfo of device (made current for the call, from any thread);
 * zeros without a GPU or for device < 0. */
RK_MPI_HIDDEN void rk_mpi_gpu_meminfo(int device, uint64_t *total_p, uint64_t *free_p);
/* For RANKMEM_BIND=nearest: overlap[d] = how many CPUs of this process's
 * affinity mask are local to device d (hwloc, else sysfs), -1 unknown. */
RK_MPI_HIDDEN void rk_mpi_gpu_overlap(int ndev, int *overlap);

/* ---- timing adaptor: timing.h ---- */

/* ---- the hooks (init.c, used by fortran.c) ---- */

/* Before the MPI library's init: read the options, bind. Idempotent. */
RK_MPI_HIDDEN void rk_mpi_pre_init(void);
/* After it (rc: what init returned): confirm the binding, install the
 * resource; exits the job cleanly (every rank) on a bad configuration.
 * Idempotent: the Fortran hooks and the C hooks may both run it. */
RK_MPI_HIDDEN void rk_mpi_post_init(int rc);
/* Before the MPI library's finalize: the report. Idempotent. */
RK_MPI_HIDDEN void rk_mpi_pre_finalize(void);

/* An option of librankmem's table, checked (NULL with the reason kept as
 * the bad setting when it does not pass); a bad setting of the plugin's own
 * (every rank then stops after MPI_Init, init.c). */
RK_MPI_HIDDEN const char *rk_mpi_table_option(const char *name);
RK_MPI_HIDDEN void rk_mpi_bad_setting(const char *fmt, ...) RK_MPI_PRINTF(1, 2);

/* ---- the record of a failed rank (failure.c, issue 29) ---- */

/* Before PMPI_Init: RANKMEM_ON_FAILURE and RANKMEM_REPORT_INTERVAL. */
RK_MPI_HIDDEN void rk_fail_options(void);
/* After MPI_Init: the rank's file, the signal handlers, exit's hook, the
 * interval thread. */
RK_MPI_HIDDEN void rk_fail_start(int world_rank, int world_size);
/* At MPI_Finalize: before the report (exit is no longer a failure, the
 * interval thread stops) and after it (the rank's file is removed). */
RK_MPI_HIDDEN void rk_fail_finishing(void);
RK_MPI_HIDDEN void rk_fail_finished(void);
/* An allocation the rank could not get: api (rk_obs_api_t), source
 * "rankmem" or "observed", the request; frames: its call site, or NULL to
 * take the caller's. The first is described and written; later ones
 * counted. Normal context only. */
RK_MPI_HIDDEN void rk_fail_oom(int api, const char *source, uint64_t bytes, uint64_t stream,
                               void *const *frames, int nframes);
/* The out-of-memory part of a record (zeros when there was none). */
RK_MPI_HIDDEN void rk_fail_fill(rm_failure_t *f);
/* The rank's failure file, NULL when none is written. */
RK_MPI_HIDDEN const char *rk_fail_path(void);
/* Set while rankmem's cudaMalloc interposer asks the chain: a refusal
 * there is not the rank's (CUDA is asked next). Per thread; in timing.c,
 * which reads it. */
extern __thread int rk_fail_defer __attribute__((visibility("hidden")));

/* MPI_COMM_WORLD's rank once MPI_Init returned, else -1. */
RK_MPI_HIDDEN int rk_mpi_world_rank(void);

/* ---- observation (observe.c, issue 19): CUPTI callbacks -> the recorder ---- */

typedef enum { RK_OBSERVE_OFF = 0, RK_OBSERVE_ON, RK_OBSERVE_AUTO } rk_observe_mode_t;

/* RANKMEM_OBSERVE's words (auto, on, off) to a mode; -1 for anything else. */
RK_MPI_HIDDEN int rk_observe_parse_mode(const char *text);
/* Once, before PMPI_Init, right after the rank's device is chosen: starts
 * the recorder (rk_obs_init with backtrace frames and max_blocks) and the
 * CUPTI subscription as mode and have_gpu say, and sets the recorder's
 * state: ON; OFF ("RANKMEM_OBSERVE=off", or auto without a GPU: the
 * recorder is not started); UNAVAILABLE with why (mode on without a GPU,
 * CUPTI absent or taken: the recorder runs, for explicit events). */
RK_MPI_HIDDEN void rk_observe_start(int mode, int have_gpu, int backtrace, size_t max_blocks);
/* 1 with the reason in why (cap bytes) when observation was wanted on
 * this rank and does not run; else 0. */
RK_MPI_HIDDEN int rk_observe_unavailable(char *why, size_t cap);
/* After MPI_Init (the world rank is known): the notes that waited for it. */
RK_MPI_HIDDEN void rk_observe_after_init(void);
/* At MPI_Finalize, after the report read the recorder: unsubscribe from
 * CUPTI, then rk_obs_fini. Idempotent. */
RK_MPI_HIDDEN void rk_observe_stop(void);
/* For the tests (built with cupti.h only): the CUPTI callback, called as
 * CUPTI calls it (domain: CUpti_CallbackDomain; enter: API ENTER or EXIT;
 * params: the call's *_params struct; retval: its cudaError_t/CUresult). */
RK_MPI_HIDDEN void rk_observe_test_callback(int domain, unsigned cbid, int enter,
                                            const void *params, const void *retval);

/* ---- serving (intercept.c, issue 19): RANKMEM_INTERCEPT=cuda ---- */

/* RANKMEM_INTERCEPT's words (none, cuda) to 0/1; -1 for anything else. */
RK_MPI_HIDDEN int rk_icpt_parse_mode(const char *text);
/* Before PMPI_Init: serve (1) or not (0). Finds the real CUDA entry points
 * and rankmem's own code ranges. */
RK_MPI_HIDDEN void rk_icpt_configure(int mode_cuda);
/* Serving runs only while active: set at the end of MPI_Init, cleared at
 * the start of MPI_Finalize. Frees of served blocks are served always. */
RK_MPI_HIDDEN void rk_icpt_set_active(int active);
RK_MPI_HIDDEN int rk_icpt_mode(void);
/* Blocks served and not yet freed; allocations served, and forwarded to
 * CUDA by reason (RK_ICPT_*), for the verbose line at finalize. */
RK_MPI_HIDDEN void rk_icpt_counters(uint64_t *live, uint64_t *served,
                                    uint64_t forwarded[RK_ICPT_NREASONS]);

/* ---- MPI_Alloc_mem (alloc_mem.c) ---- */

/* Blocks MPI_Alloc_mem served through rankmem and not yet freed. */
RK_MPI_HIDDEN size_t rk_mpi_alloc_mem_live(void);

#endif
