/* Serving's pure parts (mpi/observe/intercept_map.c), on the CPU: the map of served
 * blocks (insert, find, remove, growth, tombstones, 8 threads at once) and
 * the decision whether a cudaMalloc is served or sent to CUDA. */
#define _GNU_SOURCE
#include "intercept_map.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "../tap.h"

static rk_smap_t map; /* zeroed static storage is an empty map */

/* 256-aligned keys, as served pointers are. */
static uintptr_t key(uintptr_t i) { return (uintptr_t)0x7f0000000000ull + i * 256; }

static void test_basic(void)
{
    size_t b = 0;
    ok(rk_smap_count(&map) == 0, "a zeroed map is empty");
    ok(rk_smap_find(&map, key(1), &b) == 0, "find in an empty map: absent");
    ok(rk_smap_remove(&map, key(1), &b) == 0, "remove from an empty map: absent");
    ok(rk_smap_insert(&map, key(1), 1000) == 0, "insert");
    ok(rk_smap_find(&map, key(1), &b) == 1 && b == 1000, "find it with its size");
    ok(rk_smap_find(&map, key(1), NULL) == 1, "find without a size output");
    ok(rk_smap_insert(&map, key(1), 5) == -2, "a key already present is refused");
    ok(rk_smap_find(&map, key(1), &b) == 1 && b == 1000, "  and keeps its size");
    ok(rk_smap_insert(&map, 0, 5) == -2 && rk_smap_insert(&map, 1, 5) == -2,
       "keys 0 and 1 (empty, deleted) are refused");
    ok(rk_smap_find(&map, 0, NULL) == 0 && rk_smap_remove(&map, 1, NULL) == 0,
       "keys 0 and 1 are never found");
    ok(rk_smap_count(&map) == 1, "count 1");
    b = 0;
    ok(rk_smap_remove(&map, key(1), &b) == 1 && b == 1000, "remove gives the size back");
    ok(rk_smap_remove(&map, key(1), &b) == 0, "a second remove: absent (double free)");
    ok(rk_smap_find(&map, key(1), NULL) == 0 && rk_smap_count(&map) == 0, "empty again");
}

/* Many keys: shards grow; every key keeps its size; removals leave
 * tombstones that later probes pass and inserts reuse. */
static void test_many(void)
{
    enum { N = 100000 };
    int bad = 0;
    for (uintptr_t i = 1; i <= N; i++)
        bad += rk_smap_insert(&map, key(i), (size_t)i) != 0;
    ok(bad == 0 && rk_smap_count(&map) == N, "%d inserts (count %zu)", N, rk_smap_count(&map));
    bad = 0;
    for (uintptr_t i = 1; i <= N; i++) {
        size_t b = 0;
        bad += !rk_smap_find(&map, key(i), &b) || b != (size_t)i;
    }
    ok(bad == 0, "every key found with its own size");
    ok(rk_smap_find(&map, key(N + 1), NULL) == 0 && rk_smap_find(&map, key(0) + 128, NULL) == 0,
       "keys never inserted are absent");
    bad = 0;
    for (uintptr_t i = 1; i <= N; i += 2)
        bad += rk_smap_remove(&map, key(i), NULL) != 1;
    ok(bad == 0 && rk_smap_count(&map) == N / 2, "every odd key removed (count %zu)",
       rk_smap_count(&map));
    bad = 0;
    for (uintptr_t i = 1; i <= N; i++)
        bad += rk_smap_find(&map, key(i), NULL) != (int)(i % 2 == 0);
    ok(bad == 0, "even keys still found past the tombstones, odd ones gone");
    /* Churn: insert and remove many times; the tables must not grow without end. */
    size_t cap_before = 0, cap_after = 0;
    for (int s = 0; s < RK_SMAP_SHARDS; s++)
        cap_before += map.shard[s].cap;
    bad = 0;
    for (int round = 0; round < 20; round++)
        for (uintptr_t i = 1; i <= N; i += 2) {
            bad += rk_smap_insert(&map, key(i + (uintptr_t)N * (round + 1)), 7) != 0;
            bad += rk_smap_remove(&map, key(i + (uintptr_t)N * (round + 1)), NULL) != 1;
        }
    for (int s = 0; s < RK_SMAP_SHARDS; s++)
        cap_after += map.shard[s].cap;
    ok(bad == 0 && rk_smap_count(&map) == N / 2, "1M inserts and removes of other keys");
    ok(cap_after <= 2 * cap_before, "churn does not grow the tables (%zu slots, were %zu)",
       cap_after, cap_before);
    rk_smap_clear(&map);
    ok(rk_smap_count(&map) == 0 && rk_smap_find(&map, key(2), NULL) == 0,
       "clear empties the map");
    ok(rk_smap_insert(&map, key(2), 3) == 0 && rk_smap_remove(&map, key(2), NULL) == 1,
       "the map works again after clear");
}

/* 8 threads, each inserting, finding and removing its own keys while the
 * others do the same in the same shards. */
enum { NTHREADS = 8, PER_THREAD = 50000 };
static int thread_bad[NTHREADS];

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg, bad = 0;
    for (int round = 0; round < 4; round++) {
        for (uintptr_t i = 0; i < PER_THREAD; i++)
            bad += rk_smap_insert(&map, key(1 + i * NTHREADS + (uintptr_t)t), (size_t)t + 1) != 0;
        for (uintptr_t i = 0; i < PER_THREAD; i++) {
            size_t b = 0;
            bad += !rk_smap_find(&map, key(1 + i * NTHREADS + (uintptr_t)t), &b) ||
                   b != (size_t)t + 1;
        }
        for (uintptr_t i = 0; i < PER_THREAD; i++)
            bad += rk_smap_remove(&map, key(1 + i * NTHREADS + (uintptr_t)t), NULL) != 1;
    }
    thread_bad[t] = bad;
    return NULL;
}

static void test_threads(void)
{
    pthread_t th[NTHREADS];
    int started = 0;
    for (int t = 0; t < NTHREADS; t++)
        started += pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0;
    if (started != NTHREADS)
        BAIL_OUT("cannot start %d threads", NTHREADS);
    int bad = 0;
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(th[t], NULL);
        bad += thread_bad[t];
    }
    ok(bad == 0, "%d threads x 4 rounds of %d inserts, finds and removes: no lost or wrong key",
       NTHREADS, PER_THREAD);
    ok(rk_smap_count(&map) == 0, "count back to 0 after the threads (%zu)", rk_smap_count(&map));
}

/* ---- the decision ---- */

static int device_calls;
static int fake_device(void *arg)
{
    device_calls++;
    return *(int *)arg;
}

static void test_route(void)
{
    int cur = 0;
    rk_icpt_ctx_t base = {
        .mode_cuda = 1,
        .active = 1,
        .internal_depth = 0,
        .caller_is_rankmem = 0,
        .args_ok = 1,
        .rank_device = 0,
        .have_resource = 1,
        .current_device = fake_device,
        .arg = &cur,
    };
    rk_icpt_ctx_t c = base;
    device_calls = 0;
    ok(rk_icpt_route(&c) == RK_ICPT_SERVE && device_calls == 1,
       "all set, on the rank's device: served (the device asked once)");

    c = base;
    c.mode_cuda = 0;
    device_calls = 0;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_OFF && device_calls == 0,
       "RANKMEM_INTERCEPT=none: to CUDA, without asking the device");
    c = base;
    c.active = 0;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_INACTIVE, "before MPI_Init or after MPI_Finalize: to CUDA");
    c = base;
    c.internal_depth = 1;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_INTERNAL, "rankmem's own allocation (depth 1): to CUDA");
    c = base;
    c.caller_is_rankmem = 1;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_OURS, "called from librankmem: to CUDA");
    c = base;
    c.args_ok = 0;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_BAD_ARGS, "NULL devPtr or size 0: CUDA answers");
    c = base;
    c.have_resource = 0;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_NO_RESOURCE, "no rank resource: to CUDA");
    c = base;
    c.rank_device = -1;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_NO_RESOURCE, "no rank device (no GPU): to CUDA");
    c = base;
    cur = 1;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_OTHER_DEVICE, "another device current: to CUDA");
    cur = -1;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_OTHER_DEVICE, "current device unknown: to CUDA");
    c.current_device = NULL;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_OTHER_DEVICE, "no way to ask the device: to CUDA");
    cur = 0;

    /* Order: the cheap tests first; the device only when all else says serve. */
    c = base;
    c.active = 0;
    c.internal_depth = 2;
    device_calls = 0;
    ok(rk_icpt_route(&c) == RK_ICPT_FWD_INACTIVE && device_calls == 0,
       "the first reason wins, and the device is not asked when something else forwards");

    int names_ok = 1;
    for (int r = 0; r < RK_ICPT_NREASONS; r++)
        names_ok &= strcmp(rk_icpt_route_name(r), "?") != 0;
    ok(names_ok && strcmp(rk_icpt_route_name(-1), "?") == 0 &&
           strcmp(rk_icpt_route_name(RK_ICPT_NREASONS), "?") == 0,
       "every route has a name; out of range is \"?\"");
}

int main(void)
{
    test_basic();
    test_many();
    test_threads();
    test_route();
    return tap_done();
}
