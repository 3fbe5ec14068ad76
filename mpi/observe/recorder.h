/* Observation's recorder (issue 19): every device, managed, pinned-host and
 * VMM-mapped allocation and free of the process, whoever made it, in bounded
 * memory. Sources feed it (mpi/observe/observe.c: CUPTI callbacks; mpi/observe/intercept.c:
 * the cudaMalloc interposer; tests: the same calls by hand); the report
 * (mpi/report.c) reads it. Plain C: no MPI, no CUDA, so that it is tested on
 * the CPU. Thread-safe: any thread may feed it at any time after
 * rk_obs_init, and threads feeding at once seldom wait on each other (a
 * lock per part of the block table, counters per thread: see recorder.c).
 * rk_obs_init and rk_obs_fini must not run while another thread feeds.
 *
 * Not installed; every symbol hidden (the recorder lives in the MPI plugin). */
#ifndef RANKMEM_MPI_RECORDER_H
#define RANKMEM_MPI_RECORDER_H

#include <stddef.h>
#include <stdint.h>

#ifndef RK_MPI_HIDDEN
#define RK_MPI_HIDDEN __attribute__((visibility("hidden")))
#endif

/* What kind of memory an event is about. */
typedef enum {
    RK_OBS_DEVICE = 0, /* cudaMalloc, cudaMallocAsync, cuMemAlloc, ... */
    RK_OBS_MANAGED,    /* cudaMallocManaged, cuMemAllocManaged */
    RK_OBS_PINNED,     /* cudaMallocHost, cudaHostAlloc, cudaHostRegister */
    RK_OBS_VMM,        /* cuMemMap'd ranges (cuMemCreate'd granules mapped) */
    RK_OBS_NKINDS
} rk_obs_kind_t;

/* Who asked and who served. The program's use is PROGRAM + SERVED (the same
 * with or without serving); RANKMEM is rankmem's own upstream memory (pool
 * chunks, staging buffers), counted apart so that nothing counts twice. */
typedef enum {
    RK_OBS_PROGRAM = 0, /* the program or a library it calls, served by CUDA */
    RK_OBS_SERVED,      /* the program's cudaMalloc/cudaMallocAsync served by rankmem */
    RK_OBS_RANKMEM,     /* rankmem's own allocation from CUDA */
    RK_OBS_NSOURCES
} rk_obs_source_t;

/* The API an allocation came through (its name opens the call site). */
typedef enum {
    RK_OBS_API_OTHER = 0,
    RK_OBS_API_CUDA_MALLOC,
    RK_OBS_API_CUDA_MALLOC_ASYNC,
    RK_OBS_API_CUDA_MALLOC_FROM_POOL_ASYNC,
    RK_OBS_API_CUDA_MALLOC_MANAGED,
    RK_OBS_API_CUDA_MALLOC_HOST,
    RK_OBS_API_CUDA_HOST_ALLOC,
    RK_OBS_API_CUDA_HOST_REGISTER,
    RK_OBS_API_CUDA_MALLOC_PITCH,
    RK_OBS_API_CUDA_MALLOC_3D,
    RK_OBS_API_CU_MEM_ALLOC,
    RK_OBS_API_CU_MEM_ALLOC_ASYNC,
    RK_OBS_API_CU_MEM_ALLOC_MANAGED,
    RK_OBS_API_CU_MEM_ALLOC_PITCH,
    RK_OBS_API_CU_MEM_HOST_ALLOC,
    RK_OBS_API_CU_MEM_MAP,
    RK_OBS_API_RANKMEM,     /* rankmem_allocate through the rank's chain */
    RK_OBS_API_TEST,        /* the synthetic source of the tests */
    RK_OBS_NAPIS
} rk_obs_api_t;

/* "cudaMalloc", "cuMemMap", ... ("?" out of range). */
RK_MPI_HIDDEN const char *rk_obs_api_name(int api);
/* "device", "managed", "pinned", "vmm" ("?" out of range). */
RK_MPI_HIDDEN const char *rk_obs_kind_name(int kind);

/* ---- set-up ---- */

typedef struct rk_obs_config {
    size_t max_blocks;       /* live blocks tracked; more are counted, not kept (0: 1Mi) */
    size_t max_sites;        /* distinct call sites (0: 4096); more go to one "other" site */
    int backtrace_depth;     /* frames kept per site (0: no call sites), at most RK_OBS_MAX_FRAMES */
    size_t timeline_samples; /* samples kept (0: 512); when full, pairs merge (max kept) */
    uint64_t sample_ns;      /* first sampling interval (0: 10 ms); doubles at each merge */
    uint64_t (*clock_ns)(void); /* NULL: CLOCK_MONOTONIC; tests pass their own */
} rk_obs_config_t;

#define RK_OBS_MAX_FRAMES 32
#define RK_OBS_MAX_PHASES 64
#define RK_OBS_PHASE_NAME 48

/* Starts (or restarts, dropping everything) the recorder. Time 0 is now.
 * 0, or -1 when memory for its tables cannot be had (then every feed is a
 * no-op). */
RK_MPI_HIDDEN int rk_obs_init(const rk_obs_config_t *cfg);
/* Frees the recorder's memory; feeds after it are no-ops. */
RK_MPI_HIDDEN void rk_obs_fini(void);
/* Whether rk_obs_init succeeded and rk_obs_fini has not run. */
RK_MPI_HIDDEN int rk_obs_enabled(void);

/* Observation's state for the report: RK_OBS_ON, or off/unavailable with a
 * reason ("CUPTI not found (libcupti.so.13: cannot open ...)", "CUPTI is in
 * use by another tool: Nsight Systems", "RANKMEM_OBSERVE=off"). Set by the
 * source; the recorder keeps a copy (truncated to 200 bytes). */
typedef enum { RK_OBS_OFF = 0, RK_OBS_ON, RK_OBS_UNAVAILABLE } rk_obs_state_t;
RK_MPI_HIDDEN void rk_obs_set_state(rk_obs_state_t state, const char *why);
RK_MPI_HIDDEN rk_obs_state_t rk_obs_get_state(const char **why_p);

/* Code of shared objects whose frames never make a call site (libcupti,
 * libcuda, libcudart, rankmem's own libraries): frames inside an object
 * whose path contains `substring` are skipped at capture. Call before
 * feeding; the objects are looked up when called (dl_iterate_phdr). */
RK_MPI_HIDDEN void rk_obs_skip_objects(const char *substring);
/* 1 when pc lies in an object rk_obs_skip_objects named (CUPTI, the CUDA
 * driver and runtime, rankmem): not the program's own frame. */
RK_MPI_HIDDEN int rk_obs_skipped(const void *pc);

/* The executable ranges [lo, hi) of the loaded objects whose path contains
 * `substring`, appended to out[*n..max); *n grows. For the recorder's
 * skipped frames and the interposer's "is the caller rankmem" test. */
typedef struct rk_code_range {
    uintptr_t lo, hi;
} rk_code_range_t;
RK_MPI_HIDDEN void rk_code_ranges(const char *substring, rk_code_range_t *out, int *n, int max);
/* Whether pc lies in one of ranges[0..n). */
static inline int rk_in_ranges(const rk_code_range_t *ranges, int n, uintptr_t pc)
{
    for (int i = 0; i < n; i++)
        if (pc >= ranges[i].lo && pc < ranges[i].hi)
            return 1;
    return 0;
}

/* ---- feeding ---- */

/* Set while rankmem's own code allocates from CUDA (the rank chain's timing
 * layer, staging): a source that sees an allocation with this > 0 records
 * it as RK_OBS_RANKMEM. Per thread. */
RK_MPI_HIDDEN extern __thread int rk_obs_internal_depth;

/* Set by rankmem's interposed runtime entry points (mpi/observe/intercept.c) while
 * they pass a call on to CUDA: the program's calling instruction and the
 * API it called. A source that records the call without unwinding (the
 * stream-ordered allocations, whose cost is too small to pay for a
 * backtrace) takes its call site from here; a runtime cudaMalloc seen
 * while it is NULL and serving is on did not pass through the interposer
 * (a statically linked runtime). NULL: no such caller. */
RK_MPI_HIDDEN extern __thread const void *rk_obs_caller;
RK_MPI_HIDDEN extern __thread int rk_obs_caller_api;

/* An allocation of `bytes` at `ptr`. The call site is captured here
 * (backtrace, skipping the recorder's own frames and the objects named to
 * rk_obs_skip_objects) when backtrace_depth > 0 and src != RK_OBS_RANKMEM.
 * A ptr already live is first freed (a missed free). ptr 0 or bytes 0: ignored. */
RK_MPI_HIDDEN void rk_obs_alloc(rk_obs_kind_t kind, rk_obs_source_t src, rk_obs_api_t api,
                                uintptr_t ptr, uint64_t bytes);
/* rk_obs_alloc for a caller that is itself an entry point (the public
 * rankmem_mpi_observe_alloc): the call site starts at `from`, its caller's
 * return address, not at its own frame. */
RK_MPI_HIDDEN void rk_obs_alloc_from(rk_obs_kind_t kind, rk_obs_source_t src, rk_obs_api_t api,
                                     uintptr_t ptr, uint64_t bytes, void *from);
/* The same with the call site given (tests, sources that have frames). */
RK_MPI_HIDDEN void rk_obs_alloc_at(rk_obs_kind_t kind, rk_obs_source_t src, rk_obs_api_t api,
                                   uintptr_t ptr, uint64_t bytes, void *const *frames,
                                   int nframes);
/* The free of a block recorded by rk_obs_alloc; its size, kind and source
 * come from the record. Returns the bytes freed, 0 when ptr is unknown (a
 * block the recorder never saw or could not keep: counted as unmatched). */
RK_MPI_HIDDEN uint64_t rk_obs_free(uintptr_t ptr);

/* A phase mark (MPI_Pcontrol, rankmem_mpi_phase): closes the current phase
 * and opens `name` (truncated to RK_OBS_PHASE_NAME - 1 bytes). The time
 * before the first mark is the phase "start". At most RK_OBS_MAX_PHASES
 * phases are kept; later marks merge into the last. */
RK_MPI_HIDDEN void rk_obs_phase(const char *name);
/* Takes a timeline sample now (the report does, at finalize). */
RK_MPI_HIDDEN void rk_obs_sample_now(void);

/* ---- queries (any time) ----
 * Counts, totals and live values are exact when no feed is in flight (after
 * the threads join, at MPI_Finalize); a query racing with feeds sees each
 * thread's counters as of some moment during it. Peaks (and the timeline's
 * and phases' maxima) are exact while one thread feeds, and within
 * n x 8 MiB of the true ones with n threads feeding (docs/observe.md). */

typedef struct rk_obs_counts {
    uint64_t current, peak, total; /* bytes: live now, most live at once, all ever */
    uint64_t count, live;          /* allocations: ever, live now */
    uint64_t peak_ns;              /* when the peak was first reached (since init) */
} rk_obs_counts_t;

typedef struct rk_obs_summary {
    /* by source and kind */
    rk_obs_counts_t by[RK_OBS_NSOURCES][RK_OBS_NKINDS];
    /* the program's use: PROGRAM + SERVED, by kind, with its own peaks */
    rk_obs_counts_t program[RK_OBS_NKINDS];
    /* the program's device-side use (device + managed + vmm) at its peak */
    rk_obs_counts_t program_gpu;
    uint64_t events;            /* allocations and frees fed */
    uint64_t unmatched_frees;   /* frees of pointers not tracked */
    uint64_t untracked;         /* allocations counted but not kept (table full) */
    uint64_t sites, sites_dropped; /* distinct sites; allocations put in "other" */
    uint64_t now_ns;            /* the snapshot's time since init */
    size_t bytes_used;          /* the recorder's own memory */
} rk_obs_summary_t;

RK_MPI_HIDDEN void rk_obs_summary(rk_obs_summary_t *s);

/* Live blocks of the program (PROGRAM and SERVED), grouped by call site,
 * largest bytes first. */
typedef struct rk_obs_site {
    uint32_t id;                /* 0: "other" (the site table was full) */
    int api, kind, source;      /* of the site's first block */
    uint64_t bytes, count;      /* live */
    int nframes;
    void *frames[RK_OBS_MAX_FRAMES];
} rk_obs_site_t;

/* Up to max sites into out; returns how many there are in all. */
RK_MPI_HIDDEN size_t rk_obs_live_sites(rk_obs_site_t *out, size_t max);

/* A site in words, the same on every rank of a job whatever the load
 * addresses: "cudaMalloc at solver.c:212 (main < run_step)" when addr2line
 * finds lines, "cudaMalloc at run_step+0x4c (main)" with symbols only,
 * "cudaMalloc at ./app+0x1234" without them; "cudaMalloc (no call site)" when
 * backtraces are off. Frames: innermost first; the first is the site, the
 * next up to 3 callers in parentheses, outermost first. Returns buf. */
RK_MPI_HIDDEN const char *rk_obs_site_text(const rk_obs_site_t *site, char *buf, size_t cap);

/* The timeline: samples of the program's device-side bytes (program_gpu),
 * oldest first; each sample holds the most live in its interval, so a
 * peak survives merging. */
typedef struct rk_obs_sample {
    uint64_t t_ns;   /* start of the sample's interval, since init */
    uint64_t bytes;  /* most live in the interval */
} rk_obs_sample_t;

RK_MPI_HIDDEN size_t rk_obs_timeline(rk_obs_sample_t *out, size_t max);

typedef struct rk_obs_phase {
    char name[RK_OBS_PHASE_NAME];
    uint64_t t_start_ns, t_end_ns; /* t_end_ns: the snapshot's time for the open phase */
    uint64_t peak;                 /* most program_gpu bytes live during the phase */
    uint64_t start_bytes;          /* live when it began */
} rk_obs_phase_t;

RK_MPI_HIDDEN size_t rk_obs_phases(rk_obs_phase_t *out, size_t max);

/* Async-signal-safe (mpi/failure.c): the summary's counters (sites and
 * bytes_used left 0) and, when the timeline's lock is free, up to max of
 * its samples (*ntl: how many; 0 when the lock was busy). No lock is
 * waited for, nothing allocated. -1 when the recorder is not running. */
RK_MPI_HIDDEN int rk_obs_snapshot_try(rk_obs_summary_t *s, rk_obs_sample_t *tl, size_t max,
                                      size_t *ntl);

#endif
