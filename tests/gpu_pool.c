/* The pool on a real GPU, used from two non-blocking streams: a block freed
 * on stream A may be handed to stream B only once B is ordered after A's
 * work on it. Each round, A fills its blocks, dawdles (spin kernel), then
 * checks them; B then allocates (often A's blocks) and overwrites them. If
 * the pool let B in early, B's writes land during A's spin and A's check
 * counts them. Also: blocks are recycled (reserved stays bounded), a pool
 * over the async resource, and rankmem_pool_forget_stream before
 * cudaStreamDestroy. Skips where there is no GPU. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rankmem.h>

#include "tap.h"

#if HAVE_CUDA
#include <cuda_runtime_api.h>

#include "gpu_kernels.h"

#define MiB ((size_t)1 << 20)
#define SPIN_CYCLES 2000000ull /* ~1 ms: ample time for stream B to overtake A */
#define MAX_BLOCKS 8

typedef struct {
    const char *name;
    int rounds;
    int nblocks;
    size_t sizes[MAX_BLOCKS];
} workload_t;

typedef struct {
    int failed_calls;       /* allocate/deallocate/kernel launches that failed */
    unsigned long long bad_a, bad_b; /* words A's and B's checks found wrong */
    int overlap_rounds;     /* rounds where B got memory A had just freed */
    size_t reserved_quarter; /* RESERVED_CURRENT after a quarter of the rounds */
} outcome_t;

static size_t query(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = 0;
    rankmem_status_t st = rankmem_resource_query(mr, what, &v);
    if (st != RANKMEM_SUCCESS)
        diag("query %d: %s: %s", (int)what, rankmem_status_string(st), rankmem_last_error());
    return v;
}

static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

/* Runs w on pool from streams sa and sb; counters are read after both finish. */
static outcome_t run_rounds(rankmem_resource_t *pool, const workload_t *w, cudaStream_t sa,
                            cudaStream_t sb)
{
    outcome_t out = {0, 0, 0, 0, 0};
    size_t ncounters = (size_t)w->rounds * (size_t)w->nblocks * 2;
    unsigned long long *counters = NULL; /* device: [round][block][A, B] */
    if (cudaMalloc((void **)&counters, ncounters * sizeof *counters) != cudaSuccess ||
        cudaMemset(counters, 0, ncounters * sizeof *counters) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess)
        BAIL_OUT("%s: cannot set up %zu counters", w->name, ncounters);

    for (int r = 0; r < w->rounds; r++) {
        void *pa[MAX_BLOCKS] = {0}, *pb[MAX_BLOCKS] = {0};
        unsigned pat_a = 0xa0000000u + (unsigned)r, pat_b = 0xb0000000u + (unsigned)r;
        unsigned long long *cnt = counters + (size_t)r * (size_t)w->nblocks * 2;

        for (int i = 0; i < w->nblocks; i++) {
            if (rankmem_allocate_async(pool, w->sizes[i], 0, sa, &pa[i]) != RANKMEM_SUCCESS) {
                if (!out.failed_calls++)
                    diag("%s: round %d: A: allocate %zu: %s", w->name, r, w->sizes[i],
                         rankmem_last_error());
                pa[i] = NULL;
                continue;
            }
            out.failed_calls += rk_test_fill(pa[i], w->sizes[i] / 4, pat_a, sa) != 0;
        }
        out.failed_calls += rk_test_spin(sa, SPIN_CYCLES) != 0;
        for (int i = 0; i < w->nblocks; i++) {
            if (!pa[i])
                continue;
            out.failed_calls +=
                rk_test_check_async(pa[i], w->sizes[i] / 4, pat_a, &cnt[2 * i], sa) != 0;
            out.failed_calls +=
                rankmem_deallocate_async(pool, pa[i], w->sizes[i], 0, sa) != RANKMEM_SUCCESS;
        }

        int overlap = 0;
        for (int i = 0; i < w->nblocks; i++) {
            if (rankmem_allocate_async(pool, w->sizes[i], 0, sb, &pb[i]) != RANKMEM_SUCCESS) {
                if (!out.failed_calls++)
                    diag("%s: round %d: B: allocate %zu: %s", w->name, r, w->sizes[i],
                         rankmem_last_error());
                pb[i] = NULL;
                continue;
            }
            for (int j = 0; j < w->nblocks; j++)
                overlap |= pa[j] && overlaps(pa[j], w->sizes[j], pb[i], w->sizes[i]);
            out.failed_calls += rk_test_fill(pb[i], w->sizes[i] / 4, pat_b, sb) != 0;
            out.failed_calls +=
                rk_test_check_async(pb[i], w->sizes[i] / 4, pat_b, &cnt[2 * i + 1], sb) != 0;
        }
        for (int i = 0; i < w->nblocks; i++)
            if (pb[i])
                out.failed_calls +=
                    rankmem_deallocate_async(pool, pb[i], w->sizes[i], 0, sb) != RANKMEM_SUCCESS;
        out.overlap_rounds += overlap;
        if (r == w->rounds / 4)
            out.reserved_quarter = query(pool, RANKMEM_QUERY_RESERVED_CURRENT);
    }

    if (cudaStreamSynchronize(sa) != cudaSuccess || cudaStreamSynchronize(sb) != cudaSuccess)
        out.failed_calls++;
    unsigned long long *host = calloc(ncounters, sizeof *host);
    if (!host || cudaMemcpy(host, counters, ncounters * sizeof *host, cudaMemcpyDeviceToHost) !=
                     cudaSuccess)
        BAIL_OUT("%s: cannot read the counters back", w->name);
    for (size_t k = 0; k < ncounters; k++) {
        if (host[k] && (out.bad_a + out.bad_b) == 0)
            diag("%s: round %zu block %zu: stream %c saw %llu bad words", w->name,
                 k / 2 / (size_t)w->nblocks, k / 2 % (size_t)w->nblocks, k % 2 ? 'B' : 'A',
                 host[k]);
        *(k % 2 ? &out.bad_b : &out.bad_a) += host[k];
    }
    free(host);
    cudaFree(counters);
    return out;
}

static void report(const workload_t *w, const outcome_t *o)
{
    ok(o->failed_calls == 0, "%s: %d rounds ran without a failed call (%d failed)", w->name,
       w->rounds, o->failed_calls);
    ok(o->bad_a == 0, "%s: A's checks saw no corruption (%llu bad words)", w->name, o->bad_a);
    ok(o->bad_b == 0, "%s: B's checks saw no corruption (%llu bad words)", w->name, o->bad_b);
}

static void make_streams(cudaStream_t *sa, cudaStream_t *sb)
{
    if (cudaStreamCreateWithFlags(sa, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(sb, cudaStreamNonBlocking) != cudaSuccess)
        BAIL_OUT("cudaStreamCreateWithFlags failed");
}

/* The pool must let go of a stream before it is destroyed. */
static void forget_streams(rankmem_resource_t *pool, const char *name, cudaStream_t sa,
                           cudaStream_t sb)
{
    is_status(rankmem_pool_forget_stream(pool, sa), RANKMEM_SUCCESS, "%s: forget stream A", name);
    is_status(rankmem_pool_forget_stream(pool, sb), RANKMEM_SUCCESS, "%s: forget stream B", name);
    ok(cudaStreamDestroy(sa) == cudaSuccess && cudaStreamDestroy(sb) == cudaSuccess,
       "%s: streams destroyed", name);
}

static rankmem_resource_t *make_pool(rankmem_resource_t *upstream, const char *name,
                                     size_t initial, size_t maximum)
{
    rankmem_pool_params_t params;
    rankmem_resource_t *pool = NULL;
    is_status(rankmem_pool_params_default(&params), RANKMEM_SUCCESS, "pool params default");
    params.initial_size = initial;
    params.maximum_size = maximum;
    rankmem_status_t st = rankmem_pool_create(upstream, &params, &pool);
    is_status(st, RANKMEM_SUCCESS, "%s: pool_create", name);
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        return NULL;
    }
    return pool;
}

/* Two 40 MiB blocks cannot both live in a 64 MiB pool: every round, B must
 * get memory A has just freed, so cross-stream reuse is exercised each time. */
static void test_forced_reuse(rankmem_resource_t *upstream, const char *name, int rounds)
{
    rankmem_resource_t *pool = make_pool(upstream, name, 64 * MiB, 64 * MiB);
    if (!pool)
        return;
    workload_t w = {name, rounds, 1, {40 * MiB}};
    cudaStream_t sa, sb;
    make_streams(&sa, &sb);
    outcome_t o = run_rounds(pool, &w, sa, sb);
    report(&w, &o);
    ok(o.overlap_rounds == rounds, "%s: B reused A's memory in every round (%d of %d)", name,
       o.overlap_rounds, rounds);
    size_t reserved = query(pool, RANKMEM_QUERY_RESERVED_CURRENT);
    ok(reserved <= 64 * MiB, "%s: reserved %zu <= the 64 MiB maximum", name, reserved);
    forget_streams(pool, name, sa, sb);
    is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "%s: release", name);
}

/* Mixed sizes, unbounded pool: freed blocks come back instead of new memory. */
static void test_recycling(rankmem_resource_t *cuda)
{
    const char *name = "pool(cuda, unbounded)";
    rankmem_resource_t *pool = make_pool(cuda, name, 64 * MiB, SIZE_MAX);
    if (!pool)
        return;
    /* ~31 MiB per stream per round; 200 rounds ask for ~12 GiB in all. */
    workload_t w = {name, 200, 6, {256, 4096 + 4, MiB, 3 * MiB + 12, 8 * MiB, 19 * MiB}};
    cudaStream_t sa, sb;
    make_streams(&sa, &sb);
    outcome_t o = run_rounds(pool, &w, sa, sb);
    report(&w, &o);
    size_t reserved = query(pool, RANKMEM_QUERY_RESERVED_CURRENT);
    size_t high = query(pool, RANKMEM_QUERY_RESERVED_HIGH);
    diag("%s: reserved %zu after a quarter of the rounds, %zu at the end, high-water %zu", name,
         o.reserved_quarter, reserved, high);
    ok(high <= 256 * MiB, "%s: reserved high-water %zu stays bounded (<= 256 MiB)", name, high);
    ok(reserved <= o.reserved_quarter,
       "%s: reserved does not grow with rounds (%zu after a quarter, %zu at the end)", name,
       o.reserved_quarter, reserved);
    ok(query(pool, RANKMEM_QUERY_USED_CURRENT) == 0, "%s: nothing in use after the rounds", name);

    /* Bad inputs to forget_stream. */
    is_status(rankmem_pool_forget_stream(NULL, sa), RANKMEM_ERR_INVALID_ARGUMENT,
              "pool_forget_stream(NULL pool)");
    is_status(rankmem_pool_forget_stream(cuda, sa), RANKMEM_ERR_INVALID_ARGUMENT,
              "pool_forget_stream on a resource that is not a pool");

    /* After forgetting A, its blocks serve the default stream: no growth. */
    is_status(rankmem_pool_forget_stream(pool, sa), RANKMEM_SUCCESS, "%s: forget stream A", name);
    ok(cudaStreamDestroy(sa) == cudaSuccess, "%s: stream A destroyed", name);
    size_t before = query(pool, RANKMEM_QUERY_RESERVED_CURRENT);
    void *p = NULL;
    rankmem_status_t st = rankmem_allocate(pool, 16 * MiB, 0, &p);
    is_status(st, RANKMEM_SUCCESS, "%s: allocate 16 MiB on the default stream", name);
    if (st == RANKMEM_SUCCESS) {
        unsigned long long bad = ~0ull;
        int err = rk_test_fill(p, 4 * MiB, 0x600d, NULL);
        if (!err)
            err = rk_test_check(p, 4 * MiB, 0x600d, NULL, &bad);
        ok(err == 0 && bad == 0, "%s: default stream: pattern read back (CUDA error %d, %llu bad)",
           name, err, bad);
        ok(query(pool, RANKMEM_QUERY_RESERVED_CURRENT) == before,
           "%s: served from freed blocks, not from new memory", name);
        is_status(rankmem_deallocate(pool, p, 16 * MiB, 0), RANKMEM_SUCCESS,
                  "%s: deallocate on the default stream", name);
    }
    is_status(rankmem_pool_forget_stream(pool, sb), RANKMEM_SUCCESS, "%s: forget stream B", name);
    ok(cudaStreamDestroy(sb) == cudaSuccess, "%s: stream B destroyed", name);
    is_status(rankmem_resource_trim(pool, 0), RANKMEM_SUCCESS, "%s: trim", name);
    is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "%s: release", name);
}

int main(void)
{
    int ndev = 0;
    rankmem_status_t st = rankmem_device_count(&ndev);
    if (st != RANKMEM_SUCCESS || ndev == 0) {
        char reason[600];
        rankmem_resource_t *mr = NULL;
        if (rankmem_cuda_create(&mr) == RANKMEM_SUCCESS) {
            rankmem_resource_release(mr);
            snprintf(reason, sizeof reason, "no GPU: rankmem_device_count gives %d", ndev);
        } else {
            snprintf(reason, sizeof reason, "no GPU: %s", rankmem_last_error());
        }
        return tap_skip_all(reason);
    }

    rankmem_resource_t *cuda = NULL, *async = NULL;
    st = rankmem_cuda_create(&cuda);
    is_status(st, RANKMEM_SUCCESS, "cuda_create");
    if (st != RANKMEM_SUCCESS)
        BAIL_OUT("rankmem_cuda_create: %s", rankmem_last_error());

    test_forced_reuse(cuda, "pool(cuda, max 64 MiB)", 100);
    test_recycling(cuda);

    st = rankmem_async_create(NULL, &async);
    if (st == RANKMEM_ERR_NOT_SUPPORTED) {
        tap_skip(1, "no stream-ordered allocator on this device");
    } else {
        is_status(st, RANKMEM_SUCCESS, "async_create(default pool)");
        if (st == RANKMEM_SUCCESS) {
            test_forced_reuse(async, "pool(async, max 64 MiB)", 50);
            is_status(rankmem_resource_release(async), RANKMEM_SUCCESS, "async: release");
        }
    }

    is_status(rankmem_resource_release(cuda), RANKMEM_SUCCESS, "cuda: release");
    ok(cudaDeviceSynchronize() == cudaSuccess && cudaGetLastError() == cudaSuccess,
       "no CUDA error left at the end");
    return tap_done();
}

#else /* !HAVE_CUDA */

int main(void)
{
    return tap_skip_all("no GPU: rankmem was built without CUDA");
}

#endif
