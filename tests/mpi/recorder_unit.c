/* The observation recorder (mpi/observe/recorder.c) fed by a synthetic source: the
 * calls the CUPTI callbacks and the interposer make, by hand, with a clock
 * of the test's own. Counts by kind and source, leaks by call site,
 * timeline merging, phases, the bounds, 10 million events in bounded
 * memory, 8 threads at once, and the public feeding calls' bad inputs. */
#define _GNU_SOURCE
#include "recorder.h"

#include <pthread.h>
#include <rankmem_mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../tap.h"

void rankmem_mpi_phase_(const char *name, size_t len);

static uint64_t fake_t;
static uint64_t fake_clock(void) { return fake_t; }

#define MiB (1024u * 1024u)

static rk_obs_config_t cfg_clock(int depth)
{
    rk_obs_config_t c = {0};
    c.backtrace_depth = depth;
    c.clock_ns = fake_clock;
    return c;
}

static void test_counts(void)
{
    fake_t = 1000;
    rk_obs_config_t c = cfg_clock(0);
    ok(rk_obs_init(&c) == 0 && rk_obs_enabled(), "init");
    fake_t += 10;
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_CUDA_MALLOC, 0x1000, 3 * MiB);
    fake_t += 10;
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_CUDA_MALLOC, 0x2000, 5 * MiB);
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_SERVED, RK_OBS_API_CUDA_MALLOC, 0x3000, 7 * MiB);
    rk_obs_alloc(RK_OBS_MANAGED, RK_OBS_PROGRAM, RK_OBS_API_CUDA_MALLOC_MANAGED, 0x4000, MiB);
    rk_obs_alloc(RK_OBS_PINNED, RK_OBS_PROGRAM, RK_OBS_API_CUDA_MALLOC_HOST, 0x5000, 2 * MiB);
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_RANKMEM, RK_OBS_API_CUDA_MALLOC, 0x6000, 64 * MiB);
    fake_t += 10;
    ok(rk_obs_free(0x2000) == 5 * MiB, "free returns the recorded size");
    ok(rk_obs_free(0x2000) == 0, "a second free of it is unmatched");
    ok(rk_obs_free(0x9999) == 0, "a free of a pointer never seen is unmatched");
    /* a block seen again while live: its free was missed */
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_CUDA_MALLOC, 0x1000, MiB);

    rk_obs_summary_t s;
    rk_obs_summary(&s);
    ok(s.program[RK_OBS_DEVICE].peak == 15 * MiB, "device peak of the program: %llu",
       (unsigned long long)s.program[RK_OBS_DEVICE].peak);
    ok(s.program[RK_OBS_DEVICE].current == 8 * MiB, "device current: %llu (1 + 7 MiB)",
       (unsigned long long)s.program[RK_OBS_DEVICE].current);
    ok(s.program[RK_OBS_DEVICE].peak_ns == 20, "the peak's time");
    ok(s.program[RK_OBS_DEVICE].count == 4 && s.program[RK_OBS_DEVICE].live == 2,
       "device count 4, live 2");
    ok(s.by[RK_OBS_SERVED][RK_OBS_DEVICE].current == 7 * MiB, "served apart");
    ok(s.by[RK_OBS_RANKMEM][RK_OBS_DEVICE].peak == 64 * MiB &&
           s.program[RK_OBS_DEVICE].total == 16 * MiB,
       "rankmem's own memory is not the program's");
    ok(s.program[RK_OBS_MANAGED].current == MiB && s.program[RK_OBS_PINNED].current == 2 * MiB,
       "managed and pinned");
    ok(s.program_gpu.peak == 16 * MiB, "program GPU peak (device + managed): %llu",
       (unsigned long long)s.program_gpu.peak);
    ok(s.unmatched_frees == 2 && s.events == 10, "unmatched %llu, events %llu",
       (unsigned long long)s.unmatched_frees, (unsigned long long)s.events);

    /* bad inputs: ignored, nothing counted */
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0, 10);
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0x7000, 0);
    rk_obs_alloc((rk_obs_kind_t)9, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0x7000, 10);
    rk_obs_alloc(RK_OBS_DEVICE, (rk_obs_source_t)7, RK_OBS_API_TEST, 0x7000, 10);
    ok(rk_obs_free(0) == 0, "free(0) ignored");
    rk_obs_summary_t s2;
    rk_obs_summary(&s2);
    ok(s2.events == s.events, "bad events are not counted");
    rk_obs_summary(NULL);
    ok(rk_obs_live_sites(NULL, 0) == 3, "three live program sites (device, managed, pinned)");
    ok(!strcmp(rk_obs_api_name(RK_OBS_API_CU_MEM_MAP), "cuMemMap") &&
           !strcmp(rk_obs_api_name(-1), "?") && !strcmp(rk_obs_kind_name(RK_OBS_VMM), "vmm") &&
           !strcmp(rk_obs_kind_name(99), "?"),
       "names");
    rk_obs_fini();
    ok(!rk_obs_enabled(), "fini");
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0x1000, 10);
    rk_obs_summary(&s);
    ok(s.events == 0 && rk_obs_timeline(NULL, 0) == 0 && rk_obs_phases(NULL, 0) == 0,
       "feeds after fini are no-ops");
}

/* Two distinct call sites, as a program that leaks from two places. */
static __attribute__((noinline)) void leak_from_a(uintptr_t p)
{
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_CUDA_MALLOC, p, 4096);
    __asm__ volatile("" ::: "memory");
}

static __attribute__((noinline)) void leak_from_b(uintptr_t p)
{
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_CUDA_MALLOC_ASYNC, p, 1000);
    __asm__ volatile("" ::: "memory");
}

static void test_sites(void)
{
    rk_obs_config_t c = cfg_clock(6);
    fake_t = 0;
    ok(rk_obs_init(&c) == 0, "init with backtraces");
    /* volatile bounds: an unrolled loop would make each call a site of its own */
    volatile int na = 10, nb = 3;
    for (int i = 0; i < na; i++)
        leak_from_a(0x10000 + (uintptr_t)i * 64);
    for (int i = 0; i < nb; i++)
        leak_from_b(0x90000 + (uintptr_t)i * 64);
    rk_obs_free(0x10000); /* one of a's is freed */
    rk_obs_site_t sites[4];
    size_t n = rk_obs_live_sites(sites, 4);
    ok(n == 2, "two live sites: %zu", n);
    ok(sites[0].bytes == 9 * 4096 && sites[0].count == 9 && sites[0].api == RK_OBS_API_CUDA_MALLOC,
       "largest first: a's 9 blocks");
    ok(sites[1].bytes == 3000 && sites[1].count == 3, "then b's 3 blocks");
    ok(sites[0].nframes > 0 && sites[0].id != sites[1].id, "frames kept, distinct ids");
    char text[512];
    rk_obs_site_text(&sites[0], text, sizeof text);
    diag("site a: %s", text);
    ok(strncmp(text, "cudaMalloc at ", 14) == 0 && strstr(text, "leak_from_a"),
       "a's site names the API and its function");
    rk_obs_site_text(&sites[1], text, sizeof text);
    diag("site b: %s", text);
    ok(strncmp(text, "cudaMallocAsync at ", 19) == 0 && strstr(text, "leak_from_b"),
       "b's site likewise");
    ok(strstr(text, "recorder_unit.c:") != NULL || strstr(text, "+0x") != NULL,
       "file:line (addr2line) or symbol+offset");
    rk_obs_site_t top;
    ok(rk_obs_live_sites(&top, 1) == 2 && top.bytes == 9 * 4096,
       "a short output keeps the largest");
    rk_obs_site_text(NULL, text, sizeof text);
    ok(text[0] == 0, "NULL site: empty text");
    ok(rk_obs_site_text(&sites[0], NULL, 0) == NULL, "NULL buffer");
    rk_obs_fini();

    /* without backtraces: one site per API and kind */
    c = cfg_clock(0);
    rk_obs_init(&c);
    leak_from_a(0x1000);
    leak_from_b(0x2000);
    leak_from_a(0x3000);
    n = rk_obs_live_sites(sites, 4);
    rk_obs_site_text(&sites[0], text, sizeof text);
    ok(n == 2 && !strcmp(text, "cudaMalloc (no call site)"), "no call site: %s", text);
    rk_obs_fini();

    /* a full site table: the rest go to "other" */
    c = cfg_clock(0);
    c.max_sites = 2;
    rk_obs_init(&c);
    for (int api = RK_OBS_API_CUDA_MALLOC; api <= RK_OBS_API_CUDA_MALLOC_HOST; api++)
        rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, (rk_obs_api_t)api, 0x1000 * (uintptr_t)api, 10);
    rk_obs_summary_t s;
    rk_obs_summary(&s);
    n = rk_obs_live_sites(sites, 4);
    ok(s.sites == 2 && s.sites_dropped == 3 && n == 3, "site bound: %llu sites, %llu dropped",
       (unsigned long long)s.sites, (unsigned long long)s.sites_dropped);
    int other = -1;
    for (size_t i = 0; i < n && i < 4; i++)
        if (sites[i].id == 0)
            other = (int)i;
    ok(other >= 0 && sites[other].bytes == 30, "the other site holds the rest");
    rk_obs_site_text(&sites[other], text, sizeof text);
    ok(strstr(text, "other call sites") != NULL, "and says so: %s", text);
    rk_obs_fini();
}

static void test_bounds(void)
{
    rk_obs_config_t c = cfg_clock(0);
    c.max_blocks = 100;
    rk_obs_init(&c);
    for (int i = 1; i <= 150; i++)
        rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, (uintptr_t)i * 256, 10);
    rk_obs_summary_t s;
    rk_obs_summary(&s);
    ok(s.untracked == 50 && s.program[RK_OBS_DEVICE].current == 1000,
       "block bound: 50 untracked, current counts the kept 100");
    for (int i = 1; i <= 150; i++)
        rk_obs_free((uintptr_t)i * 256);
    rk_obs_summary(&s);
    ok(s.program[RK_OBS_DEVICE].current == 0 && s.unmatched_frees == 50,
       "their frees are unmatched; nothing goes negative");
    rk_obs_fini();
}

static void test_timeline(void)
{
    fake_t = 0;
    rk_obs_config_t c = cfg_clock(0);
    c.timeline_samples = 8;
    c.sample_ns = 10;
    rk_obs_init(&c);
    /* up by 1 KiB every 10 ns to 16 KiB at t = 150, one spike to +1 MiB at
     * t = 45, down to 0 at t = 300 */
    for (int i = 0; i < 16; i++) {
        fake_t = (uint64_t)i * 10;
        rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0x1000 + (uintptr_t)i * 16,
                     1024);
        if (i == 4) {
            fake_t = 45;
            rk_obs_alloc(RK_OBS_MANAGED, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0xF0000, MiB);
            fake_t = 46;
            rk_obs_free(0xF0000);
        }
    }
    fake_t = 300;
    for (int i = 0; i < 16; i++)
        rk_obs_free(0x1000 + (uintptr_t)i * 16);
    rk_obs_sample_t t[16];
    size_t n = rk_obs_timeline(t, 16);
    ok(n <= 8 && n >= 4, "timeline bounded: %zu samples", n);
    uint64_t maxb = 0;
    int ordered = 1;
    for (size_t i = 0; i < n; i++) {
        if (t[i].bytes > maxb)
            maxb = t[i].bytes;
        if (i && t[i].t_ns <= t[i - 1].t_ns)
            ordered = 0;
    }
    ok(maxb == 5 * 1024 + MiB, "the spike survived merging: %llu", (unsigned long long)maxb);
    ok(ordered && t[0].t_ns == 0 && t[n - 1].t_ns <= 300 && t[n - 1].t_ns + (t[1].t_ns - t[0].t_ns) > 300,
       "samples cover 0..300 in order");
    ok(t[n - 1].bytes == 16 * 1024, "the last interval holds the level before the frees");
    rk_obs_sample_t one;
    ok(rk_obs_timeline(&one, 1) == n, "a short output still counts all");
    rk_obs_fini();
}

static void test_phases(void)
{
    fake_t = 0;
    rk_obs_config_t c = cfg_clock(0);
    rk_obs_init(&c);
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0x1000, 100);
    fake_t = 10;
    rk_obs_phase("setup");
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0x2000, 500);
    rk_obs_free(0x2000);
    fake_t = 20;
    rk_obs_phase("solve");
    rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, 0x3000, 50);
    fake_t = 30;
    rk_obs_phase_t p[4];
    size_t n = rk_obs_phases(p, 4);
    ok(n == 3 && !strcmp(p[0].name, "start") && !strcmp(p[1].name, "setup") &&
           !strcmp(p[2].name, "solve"),
       "three phases");
    ok(p[0].peak == 100 && p[1].peak == 600 && p[2].peak == 150, "peaks per phase: %llu %llu %llu",
       (unsigned long long)p[0].peak, (unsigned long long)p[1].peak,
       (unsigned long long)p[2].peak);
    ok(p[1].t_start_ns == 10 && p[1].t_end_ns == 20 && p[2].t_end_ns == 30 &&
           p[2].start_bytes == 100,
       "times and the level at each start");
    for (int i = 0; i < 100; i++)
        rk_obs_phase("many");
    ok(rk_obs_phases(NULL, 0) == RK_OBS_MAX_PHASES, "phases bounded at %d", RK_OBS_MAX_PHASES);
    char longname[200];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    rk_obs_fini();
    rk_obs_init(&c);
    rk_obs_phase(longname);
    rk_obs_phase(NULL);
    n = rk_obs_phases(p, 4);
    ok(n == 3 && strlen(p[1].name) == RK_OBS_PHASE_NAME - 1 && !strcmp(p[2].name, "phase"),
       "a long name is cut, a NULL one named");
    rk_obs_fini();
}

/* 10 million events over a churning set of up to 65536 live blocks: the
 * recorder's memory stays what its bounds say, the counts stay exact. */
static void test_ten_million(void)
{
    rk_obs_config_t c = {0};
    c.backtrace_depth = 0;
    c.max_blocks = 100000;
    rk_obs_init(&c);
    enum { LIVE = 65536 };
    static uint64_t size_of[LIVE];
    uint64_t x = 88172645463325252ULL, live = 0, expect = 0;
    size_t high = 0;
    for (long ev = 0; ev < 10000000L; ev++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t slot = (size_t)(x % LIVE);
        uintptr_t p = 0x100000 + (uintptr_t)slot * 512;
        if (size_of[slot]) {
            rk_obs_free(p);
            expect -= size_of[slot];
            size_of[slot] = 0;
            live--;
        } else {
            size_of[slot] = 256 + (x >> 40) % 100000;
            rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, p, size_of[slot]);
            expect += size_of[slot];
            live++;
        }
        if ((ev & 0xfffff) == 0) {
            rk_obs_summary_t s;
            rk_obs_summary(&s);
            if (s.bytes_used > high)
                high = s.bytes_used;
        }
    }
    rk_obs_summary_t s;
    rk_obs_summary(&s);
    ok(s.events == 10000000u, "10 million events");
    ok(s.program[RK_OBS_DEVICE].current == expect && s.program[RK_OBS_DEVICE].live == live &&
           s.unmatched_frees == 0 && s.untracked == 0,
       "exact counts after them");
    /* 100000 blocks -> at most 2^18 slots of 24 bytes, plus fixed tables */
    ok(high <= (size_t)(262144 * 24 + 4097 * 40 + 16384 * 4 + 512 * 16 + 4096),
       "memory bounded: %zu bytes", high);
    ok(rk_obs_timeline(NULL, 0) <= 512, "timeline bounded");
    rk_obs_fini();
}

#define THREADS 8
#define PER_THREAD 20000

static void *churn(void *arg)
{
    uintptr_t base = 0x10000000u * (1 + (uintptr_t)arg);
    for (int i = 0; i < PER_THREAD; i++) {
        rk_obs_alloc(RK_OBS_DEVICE, RK_OBS_PROGRAM, RK_OBS_API_TEST, base + (uintptr_t)i * 64, 64);
        if (i % 4 != 3)
            rk_obs_free(base + (uintptr_t)i * 64);
    }
    return NULL;
}

static void test_threads(void)
{
    rk_obs_config_t c = {0};
    c.backtrace_depth = 2;
    rk_obs_init(&c);
    pthread_t t[THREADS];
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, churn, (void *)i);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    rk_obs_summary_t s;
    rk_obs_summary(&s);
    ok(s.program[RK_OBS_DEVICE].count == THREADS * PER_THREAD &&
           s.program[RK_OBS_DEVICE].live == THREADS * PER_THREAD / 4 &&
           s.program[RK_OBS_DEVICE].current == (uint64_t)THREADS * PER_THREAD / 4 * 64,
       "8 threads: exact counts");
    rk_obs_fini();
}

static __attribute__((noinline)) void my_allocator(void *p)
{
    rankmem_mpi_observe_alloc(p, 512, RANKMEM_MPI_MEM_DEVICE);
    __asm__ volatile("" ::: "memory");
}

static void test_public(void)
{
    {
        rk_obs_config_t c = {0};
        c.backtrace_depth = 4;
        rk_obs_init(&c);
        my_allocator((void *)0x4000);
        rk_obs_site_t site;
        char text[256];
        ok(rk_obs_live_sites(&site, 1) == 1, "the public call records a site");
        rk_obs_site_text(&site, text, sizeof text);
        diag("%s", text);
        ok(strstr(text, "my_allocator") && !strstr(text, "observe_api") &&
               !strncmp(text, "allocation at ", 14),
           "its site is the caller, not the entry point");
        rk_obs_fini();
    }
    ok(rankmem_mpi_observe_alloc((void *)0x10, 8, RANKMEM_MPI_MEM_DEVICE) ==
           RANKMEM_ERR_NOT_SUPPORTED,
       "observe_alloc while off: not supported");
    ok(rankmem_mpi_phase("x") == RANKMEM_ERR_NOT_SUPPORTED, "phase while off");
    rk_obs_config_t c = {0};
    rk_obs_init(&c);
    ok(rankmem_mpi_observe_alloc(NULL, 8, RANKMEM_MPI_MEM_DEVICE) == RANKMEM_ERR_INVALID_ARGUMENT,
       "NULL pointer");
    ok(rankmem_mpi_observe_alloc((void *)0x10, 0, RANKMEM_MPI_MEM_DEVICE) ==
           RANKMEM_ERR_INVALID_ARGUMENT,
       "zero bytes");
    ok(rankmem_mpi_observe_alloc((void *)0x10, 8, (rankmem_mpi_mem_kind_t)4) ==
           RANKMEM_ERR_INVALID_ARGUMENT,
       "bad kind");
    ok(rankmem_mpi_observe_alloc((void *)0x10, 8, RANKMEM_MPI_MEM_VMM) == RANKMEM_SUCCESS,
       "a VMM range");
    ok(rankmem_mpi_observe_free((void *)0x20) == RANKMEM_ERR_INVALID_POINTER, "unknown free");
    ok(rankmem_mpi_observe_free(NULL) == RANKMEM_ERR_INVALID_ARGUMENT, "NULL free");
    ok(rankmem_mpi_phase(NULL) == RANKMEM_ERR_INVALID_ARGUMENT &&
           rankmem_mpi_phase("") == RANKMEM_ERR_INVALID_ARGUMENT,
       "phase without a name");
    ok(rankmem_mpi_phase("p") == RANKMEM_SUCCESS, "phase");
    rankmem_mpi_phase_("solve   ", 8); /* as gfortran passes 'solve   ' */
    rk_obs_phase_t ph[4];
    ok(rk_obs_phases(ph, 4) == 3 && !strcmp(ph[2].name, "solve"), "the Fortran entry trims blanks");
    rk_obs_summary_t s;
    rk_obs_summary(&s);
    ok(s.program[RK_OBS_VMM].current == 8 && s.program_gpu.current == 8, "counted as vmm");
    ok(rankmem_mpi_observe_free((void *)0x10) == RANKMEM_SUCCESS, "free");
    rk_obs_summary(&s);
    ok(s.program[RK_OBS_VMM].current == 0 && s.unmatched_frees == 1, "and gone");
    rk_obs_fini();

    rk_obs_set_state(RK_OBS_UNAVAILABLE, "CUPTI is in use by another tool");
    const char *why = NULL;
    ok(rk_obs_get_state(&why) == RK_OBS_UNAVAILABLE && !strcmp(why, "CUPTI is in use by another tool"),
       "state and reason");
    rk_obs_set_state(RK_OBS_ON, NULL);
    ok(rk_obs_get_state(NULL) == RK_OBS_ON && rk_obs_get_state(&why) == RK_OBS_ON && !*why,
       "state without reason");
}

int main(void)
{
    tap_plan(69);
    test_counts();
    test_sites();
    test_bounds();
    test_timeline();
    test_phases();
    test_ten_million();
    test_threads();
    test_public();
    return tap_done();
}
