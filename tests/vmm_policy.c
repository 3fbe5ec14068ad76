/* The vmm's policy over its host backend (64 KiB granules): what it maps
 * and gives back, counted with rankmem_vmm_get_stats, not timed.
 *  - at a new peak of live bytes, only the handles that cover what is over
 *    the budget go back (each handle given back may have to be made again:
 *    ~60 us on an H100);
 *  - a thread takes the free memory another thread's shard holds before
 *    mapping more;
 *  - a loop that repeats the same allocations maps nothing after its first
 *    pass;
 *  - eight threads allocating small and large blocks in shards of their own
 *    stay within a bound of their peak of live bytes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"

#include "vmm_host.h"

#define MiB ((size_t)1 << 20)

static rankmem_resource_t *host_vmm(size_t handle, size_t release)
{
    return host_vmm_of(SIZE_MAX, release, handle);
}

static void *get(rankmem_resource_t *mr, size_t n)
{
    void *p = NULL;
    if (rankmem_allocate(mr, n, 0, &p) != RANKMEM_SUCCESS)
        BAIL_OUT("allocate %zu: %s", n, rankmem_last_error());
    return p;
}

static void put(rankmem_resource_t *mr, void *p, size_t n)
{
    if (rankmem_deallocate(mr, p, n, 0) != RANKMEM_SUCCESS)
        BAIL_OUT("deallocate %zu: %s", n, rankmem_last_error());
}

/* Handles of 4 granules, 2 MiB kept free: at a new peak that needs 2 MiB
 * more than the budget allows, 2 MiB of a 4 MiB free block go back, not
 * all of it. */
static void give_back_only_over(void)
{
    rankmem_resource_t *mr = host_vmm(4 * G, 2 * MiB);
    void *a = get(mr, 4 * MiB), *f = get(mr, 4 * MiB);
    put(mr, f, 4 * MiB);
    rankmem_vmm_stats_t s0 = stats(mr);
    void *c = get(mr, 4 * MiB + 256 * 1024); /* live 8.25 MiB: a new peak */
    rankmem_vmm_stats_t s1 = stats(mr);
    size_t released = s1.granules_released - s0.granules_released;
    ok(s1.give_backs == s0.give_backs + 1, "new peak: one give-back (%zu)",
       s1.give_backs - s0.give_backs);
    ok(released >= 2 * MiB / G && released <= 2 * MiB / G + 4,
       "new peak: what is over the budget went back, in whole handles (%zu granules of 32)",
       released);
    ok(s1.mapped <= s1.live_high + 2 * MiB + 4 * G,
       "new peak: mapped %zu within the budget (peak %zu + 2 MiB kept)", s1.mapped, s1.live_high);
    put(mr, a, 4 * MiB);
    put(mr, c, 4 * MiB + 256 * 1024);
    ok(rankmem_resource_release(mr) == RANKMEM_SUCCESS, "released");
}

/* ---- another thread's free memory ---- */

typedef struct {
    rankmem_resource_t *mr;
    int n;
    size_t size;
    int fail;
} job_t;

static void *alloc_then_free(void *arg)
{
    job_t *j = arg;
    void *p[16];
    for (int i = 0; i < j->n; i++)
        if (rankmem_allocate(j->mr, j->size, 0, &p[i]) != RANKMEM_SUCCESS)
            j->fail++, p[i] = NULL;
    for (int i = 0; i < j->n; i++)
        if (p[i])
            rankmem_deallocate(j->mr, p[i], j->size, 0);
    return NULL;
}

static void cross_shard(void)
{
    rankmem_resource_t *mr = host_vmm(0, 0);
    job_t j = {mr, 8, 512 * 1024, 0};
    /* A thread of its own, so its free memory sits in its own shard. */
    pthread_t t;
    pthread_create(&t, NULL, alloc_then_free, &j);
    pthread_join(t, NULL);
    rankmem_vmm_stats_t s0 = stats(mr);
    alloc_then_free(&j); /* this thread: another shard */
    rankmem_vmm_stats_t s1 = stats(mr);
    ok(!j.fail, "cross-shard: every allocation served");
    ok(s1.granules_mapped == s0.granules_mapped && s1.mapped_high == s0.mapped_high,
       "cross-shard: the second thread mapped nothing (%zu granules more), it took the first "
       "thread's free memory",
       s1.granules_mapped - s0.granules_mapped);
    ok(rankmem_resource_release(mr) == RANKMEM_SUCCESS, "released");
}

/* ---- a loop that repeats itself ---- */

static uint64_t lcg(uint64_t *x)
{
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    return *x >> 33;
}

/* One step of a training-like loop: activations of mixed sizes kept to the
 * end of the step, temporaries freed at once, everything freed at the end. */
static void step(rankmem_resource_t *mr, uint64_t seed)
{
    enum { N = 200 };
    void *keep[N];
    size_t ks[N];
    uint64_t x = seed;
    for (int i = 0; i < N; i++) {
        ks[i] = 256 + (size_t)(lcg(&x) % (i % 10 == 0 ? 2 * MiB : 64 * 1024));
        keep[i] = get(mr, ks[i]);
        size_t ts = 256 + (size_t)(lcg(&x) % (512 * 1024));
        put(mr, get(mr, ts), ts);
    }
    for (int i = N - 1; i >= 0; i--)
        put(mr, keep[i], ks[i]);
}

/* exact: no handle made after the first step; else at most a sixteenth of
 * the first step's handles per step (one handle per granule: the later
 * steps place blocks where the first step's frees left room, and the
 * fragmentation below the peak costs a few granules: 15 to 27 a step of
 * 766 here, docs/vmm.md). */
static void repeated_loop(size_t handle, int exact, const char *what)
{
    rankmem_resource_t *mr = host_vmm(handle, 0);
    step(mr, 42);
    rankmem_vmm_stats_t s0 = stats(mr);
    for (int k = 0; k < 3; k++)
        step(mr, 42);
    rankmem_vmm_stats_t s1 = stats(mr);
    size_t made = s1.handles_created - s0.handles_created;
    size_t bound = exact ? 0 : 3 * (s0.handles_created / 16);
    ok(made <= bound && (!exact || s1.give_backs == s0.give_backs),
       "%s: the same step three more times makes %zu handles (at most %zu) and gives back "
       "%zu times; first step: %zu handles",
       what, made, bound, s1.give_backs - s0.give_backs, s0.handles_created);
    ok(s1.mapped_high == s0.mapped_high, "%s: the later steps map no more than the first (%zu)",
       what, s1.mapped_high);
    ok(rankmem_resource_release(mr) == RANKMEM_SUCCESS, "%s: released", what);
}

/* ---- eight threads, each in its own shard ---- */

typedef struct {
    rankmem_resource_t *mr;
    pthread_barrier_t *bar;
    uint64_t seed;
    int fail;
} tjob_t;

/* Each thread: rounds of 64 live blocks (3 in 4 small, below a quarter of
 * a granule; the others up to 256 KiB), half freed and replaced per round,
 * all threads in step. */
static void *threads_like(void *arg)
{
    tjob_t *j = arg;
    enum { N = 64 };
    void *p[N] = {0};
    size_t s[N] = {0};
    uint64_t x = j->seed;
    for (int round = 0; round < 20; round++) {
        for (int i = round ? (round % 2) : 0; i < N; i += round ? 2 : 1) {
            if (p[i])
                rankmem_deallocate(j->mr, p[i], s[i], 0);
            s[i] = lcg(&x) % 4 ? 256 + lcg(&x) % (8 * 1024) : 16 * 1024 + lcg(&x) % (240 * 1024);
            if (rankmem_allocate(j->mr, s[i], 0, &p[i]) != RANKMEM_SUCCESS)
                j->fail++, p[i] = NULL;
        }
        pthread_barrier_wait(j->bar);
    }
    for (int i = 0; i < N; i++)
        if (p[i])
            rankmem_deallocate(j->mr, p[i], s[i], 0);
    return NULL;
}

static void threads_footprint(void)
{
    enum { T = 8 };
    rankmem_resource_t *mr = host_vmm(0, 0);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, T);
    pthread_t t[T];
    tjob_t j[T];
    for (int i = 0; i < T; i++) {
        j[i] = (tjob_t){mr, &bar, 1000u + (uint64_t)i, 0};
        pthread_create(&t[i], NULL, threads_like, &j[i]);
    }
    int fail = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(t[i], NULL);
        fail += j[i].fail;
    }
    pthread_barrier_destroy(&bar);
    rankmem_vmm_stats_t s = stats(mr);
    size_t live = 0;
    rankmem_resource_query(mr, RANKMEM_QUERY_USED_HIGH, &live);
    ok(!fail, "8 threads: every allocation served");
    /* Each thread's shard keeps free pieces of its granules that other
     * shards do not use until they grow: 1.18 to 1.22 measured here, as
     * threads.csv with 2 MiB granules (docs/vmm.md, limits). The bound
     * 1.35 catches a regression (a pool over malloc: 2.3 on threads.csv). */
    size_t bound = s.live_high + s.live_high / 100 * 35;
    ok(s.mapped_high <= bound,
       "8 threads: peak mapped %zu within %zu (peak live %zu: %.3f)", s.mapped_high, bound,
       s.live_high, (double)s.mapped_high / (double)(s.live_high ? s.live_high : 1));
    ok(rankmem_resource_release(mr) == RANKMEM_SUCCESS, "8 threads: released");
}

int main(void)
{
    tap_plan(16);
    give_back_only_over();
    cross_shard();
    repeated_loop(0, 0, "one handle per granule");
    repeated_loop(4 * G, 1, "handles of 4 granules");
    threads_footprint();
    return tap_done();
}
