/* counters-probe: what the statistics adaptors add to a pool's pair, on
 * the CPU (issue 21): the chains pool, stats>pool, timing>pool,
 * stats>timing>pool (the MPI plugin's default chain, timing built in from
 * mpi/timing.c) and tracking>pool over host memory, from 1 to N threads,
 * each thread allocating and freeing its own sizes on its own stream.
 *
 *   bench/counters-probe [--pairs N] [--threads T] [--only CHAIN]...
 *
 * Prints ns per pair per thread and million pairs per second in all. For
 * instruction counts (what one thread adds, whatever the machine), run one
 * chain on one thread under callgrind and read the Ir of probe_pairs:
 *
 *   valgrind --tool=callgrind --toggle-collect=probe_pairs \
 *       bench/counters-probe --threads 1 --pairs 100000 --only stats>timing>pool
 *
 * and divide by the pairs plus the 4096 of the warm-up (probe_pairs runs
 * both). Add --dump-instr=yes and read callgrind_annotate's per-function
 * counts (or objdump the fast paths) to see where they go. The probe links
 * no staging (mpi/staging/base.c): the plugin's timing layer also calls its
 * rk_mpi_staging_forget after every allocate, which this does not count.
 *
 * The arena (row arena: over host memory it never touches, 4 MiB
 * superblocks) runs the same pairs: its 16-thread speed over one thread's
 * is issue 21's target, and the host CPU of the GPU machine shows it
 * without a GPU.
 *
 * The MPI plugin's recorder of observed allocations (mpi/observe/recorder.c, built
 * in) has two rows of its own, without and with call sites (8 frames, the
 * plugin's default): each thread records an allocation of its sizes at one
 * of 8 addresses of its own, as a pool hands them out, and forgets it (the
 * feeds of a served cudaMalloc+cudaFree pair, without the chain):
 *
 *   bench/counters-probe --threads 16 --only recorder --only recorder+sites
 *
 * On a box of few cores this shows how the counters scale up to its core
 * count; the 16-thread numbers come from bench/rankmem-bench (and this
 * probe, for the recorder) on the GPU machine. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rankmem.h>
#include "timing.h"
#include "recorder.h"

#define MAX_T 64
#define NSIZES 4096

static size_t sizes[MAX_T][NSIZES];

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, rankmem_status_t st)
{
    fprintf(stderr, "counters-probe: %s: %s (%s)\n", what, rankmem_status_string(st),
            rankmem_last_error());
    exit(1);
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        rankmem_status_t st_ = (call);                                                             \
        if (st_ != RANKMEM_SUCCESS)                                                                \
            die(#call, st_);                                                                       \
    } while (0)

/* The chain over a host pool big enough never to grow while timed. */
static rankmem_resource_t *make_chain(const char *name)
{
    rankmem_resource_t *sys, *pool, *top, *mid;
    rankmem_pool_params_t p;
    CK(rankmem_system_create(&sys));
    CK(rankmem_pool_params_default(&p));
    p.initial_size = (size_t)1 << 30;
    CK(rankmem_pool_create(sys, &p, &pool));
    rankmem_resource_release(sys);
    if (!strcmp(name, "pool"))
        return pool;
    if (!strcmp(name, "arena")) {
        /* The arena over host memory it never touches: its bookkeeping
         * alone, as rankmem-bench's arena row (each thread on its own
         * stream, so its own arena). */
        rankmem_resource_release(pool);
        rankmem_arena_params_t ap;
        CK(rankmem_system_create(&sys));
        CK(rankmem_arena_params_default(&ap));
        ap.arena_size = (size_t)16 << 30;
        CK(rankmem_arena_create(sys, &ap, &top));
        rankmem_resource_release(sys);
        return top;
    }
    if (!strcmp(name, "stats>pool")) {
        CK(rankmem_stats_create(pool, &top));
    } else if (!strcmp(name, "timing>pool")) {
        CK(rk_mpi_timing_create(pool, &top));
    } else if (!strcmp(name, "stats>timing>pool")) {
        /* As the MPI plugin builds it: the timing layer counted by stats. */
        CK(rk_mpi_timing_create(pool, &mid));
        CK(rankmem_stats_create(mid, &top));
        CK(rk_mpi_timing_count_from(mid, top));
        rankmem_resource_release(mid);
    } else if (!strcmp(name, "tracking>pool")) {
        CK(rankmem_tracking_create(pool, 0, &top));
    } else {
        fprintf(stderr, "counters-probe: unknown chain '%s'\n", name);
        exit(2);
    }
    rankmem_resource_release(pool);
    return top;
}

/* 0: a chain; 1: the recorder without call sites; 2: with 8 frames. */
static int recorder_mode;

typedef struct {
    rankmem_resource_t *mr;
    int id;
    size_t pairs;
    pthread_barrier_t *bar;
    uint64_t t0, t1;
} job_t;

__attribute__((noinline)) void probe_pairs(rankmem_resource_t *mr, const size_t *sz, size_t n,
                                           rankmem_stream_t stream)
{
    for (size_t i = 0; i < n; i++) {
        void *p;
        size_t b = sz[i % NSIZES];
        if (rankmem_allocate_async(mr, b, 0, stream, &p) != RANKMEM_SUCCESS ||
            rankmem_deallocate_async(mr, p, b, 0, stream) != RANKMEM_SUCCESS)
            die("pair", RANKMEM_ERR_OUT_OF_MEMORY);
    }
}

/* The recorder's feeds of n pairs: 8 addresses of thread id's own. */
__attribute__((noinline)) void probe_records(int id, const size_t *sz, size_t n)
{
    uintptr_t base = (uintptr_t)(id + 1) << 36;
    for (size_t i = 0; i < n; i++) {
        uintptr_t p = base + ((uintptr_t)(i & 7) << 22);
        rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_SERVED, RK_OBS_API_CUDA_MALLOC, p, sz[i % NSIZES]);
        if (rk_obs_free(p) == 0)
            die("recorder: a free of a recorded block was not matched",
                RANKMEM_ERR_INVALID_POINTER);
    }
}

static void *run(void *arg)
{
    job_t *j = arg;
    if (recorder_mode) {
        probe_records(j->id, sizes[j->id], NSIZES); /* warm */
        pthread_barrier_wait(j->bar);
        j->t0 = now_ns();
        probe_records(j->id, sizes[j->id], j->pairs);
        j->t1 = now_ns();
        return NULL;
    }
    /* Each thread on its own "stream" (a host pool ignores nothing: it
     * keeps per-stream lists, so distinct values keep threads apart). */
    rankmem_stream_t stream = (rankmem_stream_t)(uintptr_t)(0x1000 * (j->id + 1));
    probe_pairs(j->mr, sizes[j->id], NSIZES, stream); /* warm */
    pthread_barrier_wait(j->bar);
    j->t0 = now_ns();
    probe_pairs(j->mr, sizes[j->id], j->pairs, stream);
    j->t1 = now_ns();
    return NULL;
}

static void measure(const char *chain, int nt, size_t pairs)
{
    recorder_mode = !strcmp(chain, "recorder") ? 1 : !strcmp(chain, "recorder+sites") ? 2 : 0;
    rankmem_resource_t *mr = NULL;
    if (recorder_mode) {
        rk_obs_config_t c = {0};
        c.backtrace_depth = recorder_mode == 2 ? 8 : 0;
        if (rk_obs_init(&c) != 0)
            die("rk_obs_init", RANKMEM_ERR_OUT_OF_MEMORY);
    } else {
        mr = make_chain(chain);
    }
    pthread_t th[MAX_T];
    job_t jobs[MAX_T];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nt);
    for (int t = 0; t < nt; t++)
        jobs[t] = (job_t){mr, t, pairs, &bar, 0, 0};
    /* One thread: the main thread itself (profiles read more easily). */
    for (int t = 0; nt > 1 && t < nt; t++)
        pthread_create(&th[t], NULL, run, &jobs[t]);
    if (nt == 1)
        run(&jobs[0]);
    uint64_t lo = UINT64_MAX, hi = 0;
    for (int t = 0; t < nt; t++) {
        if (nt > 1)
            pthread_join(th[t], NULL);
        lo = jobs[t].t0 < lo ? jobs[t].t0 : lo;
        hi = jobs[t].t1 > hi ? jobs[t].t1 : hi;
    }
    double wall = (double)(hi - lo);
    printf("%-20s %2d threads: %8.1f ns/pair/thread  %8.2f M pairs/s\n", chain, nt,
           wall / (double)pairs, (double)nt * (double)pairs / wall * 1e3);
    pthread_barrier_destroy(&bar);
    if (recorder_mode)
        rk_obs_fini();
    else
        rankmem_resource_release(mr);
}

int main(int argc, char **argv)
{
    size_t pairs = 2000000;
    int threads = 2;
    const char *only[8];
    int nonly = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
            pairs = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && nonly < 8)
            only[nonly++] = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--pairs N] [--threads T] [--only CHAIN]...\n", argv[0]);
            return 2;
        }
    }
    if (threads < 1 || threads > MAX_T || pairs == 0) {
        fprintf(stderr, "counters-probe: threads 1..%d, pairs > 0\n", MAX_T);
        return 2;
    }
    /* Log-uniform sizes from 256 B to 4 MiB, as bench/rankmem-bench. */
    uint64_t x = 20240601;
    for (int t = 0; t < MAX_T; t++)
        for (int i = 0; i < NSIZES; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            double u = (double)(x >> 11) * 0x1.0p-53;
            sizes[t][i] = (size_t)(256.0 * __builtin_exp(u * __builtin_log(16384.0)));
        }
    static const char *const chains[] = {"pool",          "stats>pool", "timing>pool",
                                         "stats>timing>pool", "tracking>pool", "arena",
                                         "recorder",      "recorder+sites"};
    for (size_t c = 0; c < sizeof chains / sizeof *chains; c++) {
        int keep = nonly == 0;
        for (int k = 0; k < nonly; k++)
            keep |= !strcmp(only[k], chains[c]);
        if (!keep)
            continue;
        for (int nt = 1; nt <= threads; nt *= 2)
            measure(chains[c], nt, pairs);
    }
    return 0;
}
