/* The arena on a real GPU, used from two non-blocking streams A and B. Every
 * way memory can pass from one stream to the other is raced: a stream's
 * kernels fill memory and check it after a spin kernel (~1 ms), while the
 * other stream gets the same memory from the arena and overwrites it at
 * once. Had the arena not made the second stream wait, its writes would land
 * during the spin and the check would count them.
 *  - superblocks: given back by A's arena, taken by B's (and back);
 *  - a block freed on B (pending in A's arena), reused by A;
 *  - large blocks through the global arena.
 * Also: over cudaMalloc and over cudaMallocAsync, rankmem_arena_forget_stream
 * before cudaStreamDestroy, and the default size (half of the free memory).
 * Skips where there is no GPU. */
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
#define SPIN_CYCLES 2000000ull /* ~1 ms: ample time for the other stream to overtake */

static size_t query(rankmem_resource_t *mr, rankmem_query_t what)
{
    size_t v = 0;
    rankmem_status_t st = rankmem_resource_query(mr, what, &v);
    if (st != RANKMEM_SUCCESS)
        diag("query %d: %s: %s", (int)what, rankmem_status_string(st), rankmem_last_error());
    return v;
}

static int same_memory(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

static rankmem_resource_t *make_arena(rankmem_resource_t *up, const char *name, size_t size,
                                      size_t superblock)
{
    rankmem_arena_params_t prm;
    rankmem_arena_params_default(&prm);
    prm.arena_size = size;
    prm.superblock_size = superblock;
    rankmem_resource_t *mr = NULL;
    rankmem_status_t st = rankmem_arena_create(up, &prm, &mr);
    is_status(st, RANKMEM_SUCCESS, "%s: arena_create", name);
    if (st != RANKMEM_SUCCESS) {
        diag("  %s", rankmem_last_error());
        return NULL;
    }
    return mr;
}

static void make_streams(cudaStream_t *sa, cudaStream_t *sb)
{
    if (cudaStreamCreateWithFlags(sa, cudaStreamNonBlocking) != cudaSuccess ||
        cudaStreamCreateWithFlags(sb, cudaStreamNonBlocking) != cudaSuccess)
        BAIL_OUT("cudaStreamCreateWithFlags failed");
}

static unsigned long long *make_counters(size_t n)
{
    unsigned long long *c = NULL;
    if (cudaMalloc((void **)&c, n * sizeof *c) != cudaSuccess ||
        cudaMemset(c, 0, n * sizeof *c) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
        BAIL_OUT("cannot set up %zu counters", n);
    return c;
}

/* Sum of the device counters [0, n), after both streams are done. */
static unsigned long long read_counters(const unsigned long long *c, size_t n, cudaStream_t sa,
                                        cudaStream_t sb, int *failed)
{
    if (cudaStreamSynchronize(sa) != cudaSuccess || cudaStreamSynchronize(sb) != cudaSuccess)
        (*failed)++;
    unsigned long long *host = calloc(n, sizeof *host), sum = 0;
    if (!host || cudaMemcpy(host, c, n * sizeof *host, cudaMemcpyDeviceToHost) != cudaSuccess)
        BAIL_OUT("cannot read the counters back");
    for (size_t i = 0; i < n; i++)
        sum += host[i];
    free(host);
    return sum;
}

#define CALL(failed, expr)                                                                  \
    do {                                                                                    \
        if ((expr) != 0 && !(failed)++)                                                     \
            diag("%s:%d: %s failed: %s", __FILE__, __LINE__, #expr, rankmem_last_error());  \
    } while (0)

/* Two superblocks: each round A fills two blocks (one per superblock),
 * spins, checks and frees them; one superblock goes back to the global
 * arena and B takes it for its block at once. Next round A needs its second
 * superblock back: the arena defragments and A takes B's. */
static void test_superblocks(rankmem_resource_t *up, const char *name, int rounds)
{
    const size_t sbsz = 4 * MiB, blk = 3 * MiB, words = blk / 4;
    rankmem_resource_t *mr = make_arena(up, name, 2 * sbsz, sbsz);
    if (!mr)
        return;
    cudaStream_t sa, sb;
    make_streams(&sa, &sb);
    unsigned long long *cnt_a = make_counters(1), *cnt_b = make_counters(1);
    int failed = 0, handed = 0;
    for (int r = 0; r < rounds; r++) {
        void *pa[2] = {NULL, NULL}, *pb = NULL;
        unsigned pat_a = 0xa0000000u + (unsigned)r, pat_b = 0xb0000000u + (unsigned)r;
        for (int i = 0; i < 2; i++) {
            CALL(failed, rankmem_allocate_async(mr, blk, 0, sa, &pa[i]));
            if (pa[i])
                CALL(failed, rk_test_fill(pa[i], words, pat_a, sa));
        }
        CALL(failed, rk_test_spin(sa, SPIN_CYCLES));
        for (int i = 0; i < 2; i++)
            if (pa[i]) {
                CALL(failed, rk_test_check_async(pa[i], words, pat_a, cnt_a, sa));
                CALL(failed, rankmem_deallocate_async(mr, pa[i], blk, 0, sa));
            }
        CALL(failed, rankmem_allocate_async(mr, blk, 0, sb, &pb));
        if (pb) {
            handed += (pa[0] && same_memory(pa[0], blk, pb, blk)) ||
                      (pa[1] && same_memory(pa[1], blk, pb, blk));
            CALL(failed, rk_test_fill(pb, words, pat_b, sb));
            CALL(failed, rk_test_spin(sb, SPIN_CYCLES / 4));
            CALL(failed, rk_test_check_async(pb, words, pat_b, cnt_b, sb));
            CALL(failed, rankmem_deallocate_async(mr, pb, blk, 0, sb));
        }
    }
    unsigned long long bad_a = read_counters(cnt_a, 1, sa, sb, &failed);
    unsigned long long bad_b = read_counters(cnt_b, 1, sa, sb, &failed);
    ok(failed == 0, "%s: superblocks: %d rounds without a failed call (%d)", name, rounds, failed);
    ok(handed == rounds, "%s: B got A's superblock in every round (%d of %d)", name, handed,
       rounds);
    ok(bad_a == 0, "%s: A's checks saw none of B's writes (%llu bad words)", name, bad_a);
    ok(bad_b == 0, "%s: B's checks saw none of A's writes (%llu bad words)", name, bad_b);
    ok(query(mr, RANKMEM_QUERY_RESERVED_HIGH) <= 2 * sbsz, "%s: reserved within the arena", name);
    is_status(rankmem_arena_forget_stream(mr, sa), RANKMEM_SUCCESS, "%s: forget A", name);
    is_status(rankmem_arena_forget_stream(mr, sb), RANKMEM_SUCCESS, "%s: forget B", name);
    ok(cudaStreamDestroy(sa) == cudaSuccess && cudaStreamDestroy(sb) == cudaSuccess,
       "%s: streams destroyed", name);
    /* Nothing may wait for the destroyed streams any more. */
    void *p = NULL;
    is_status(rankmem_allocate(mr, 2 * sbsz, 0, &p), RANKMEM_SUCCESS,
              "%s: after forgetting: the whole arena on the default stream", name);
    if (p)
        is_status(rankmem_deallocate(mr, p, 2 * sbsz, 0), RANKMEM_SUCCESS, "%s: and back", name);
    cudaFree(cnt_a);
    cudaFree(cnt_b);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s: release", name);
}

/* A's superblock holds four blocks; B uses the first (ordered after A by an
 * event, as a program must), checks it after a spin and frees it on B: a
 * pending free in A's arena. A's next allocation finds no room but that
 * block, so it must wait for B before reusing it, and writes it at once. */
static void test_pending(rankmem_resource_t *up, const char *name, int rounds)
{
    const size_t sbsz = 4 * MiB, blk = 1 * MiB, words = blk / 4;
    rankmem_resource_t *mr = make_arena(up, name, 2 * sbsz, sbsz);
    if (!mr)
        return;
    cudaStream_t sa, sb;
    make_streams(&sa, &sb);
    cudaEvent_t ev;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess)
        BAIL_OUT("cudaEventCreate failed");
    unsigned long long *cnt_b = make_counters(1);
    int failed = 0, reused = 0;
    for (int r = 0; r < rounds; r++) {
        void *p[4] = {NULL, NULL, NULL, NULL}, *again = NULL;
        unsigned pat_a = 0xc0000000u + (unsigned)r, pat_a2 = 0xd0000000u + (unsigned)r;
        for (int i = 0; i < 4; i++)
            CALL(failed, rankmem_allocate_async(mr, blk, 0, sa, &p[i]));
        if (!p[0])
            continue;
        CALL(failed, rk_test_fill(p[0], words, pat_a, sa));
        CALL(failed, cudaEventRecord(ev, sa));
        CALL(failed, cudaStreamWaitEvent(sb, ev, 0));
        CALL(failed, rk_test_spin(sb, SPIN_CYCLES));
        CALL(failed, rk_test_check_async(p[0], words, pat_a, cnt_b, sb));
        CALL(failed, rankmem_deallocate_async(mr, p[0], blk, 0, sb));
        CALL(failed, rankmem_allocate_async(mr, blk, 0, sa, &again));
        if (again) {
            reused += again == p[0];
            CALL(failed, rk_test_fill(again, words, pat_a2, sa));
            CALL(failed, rankmem_deallocate_async(mr, again, blk, 0, sa));
        }
        for (int i = 1; i < 4; i++)
            if (p[i])
                CALL(failed, rankmem_deallocate_async(mr, p[i], blk, 0, sa));
    }
    unsigned long long bad_b = read_counters(cnt_b, 1, sa, sb, &failed);
    ok(failed == 0, "%s: pending frees: %d rounds without a failed call (%d)", name, rounds,
       failed);
    ok(reused == rounds, "%s: A reused the block B freed in every round (%d of %d)", name, reused,
       rounds);
    ok(bad_b == 0, "%s: B's checks saw none of A's later writes (%llu bad words)", name, bad_b);
    is_status(rankmem_arena_forget_stream(mr, sa), RANKMEM_SUCCESS, "%s: forget A", name);
    is_status(rankmem_arena_forget_stream(mr, sb), RANKMEM_SUCCESS, "%s: forget B", name);
    ok(cudaStreamDestroy(sa) == cudaSuccess && cudaStreamDestroy(sb) == cudaSuccess,
       "%s: streams destroyed", name);
    cudaEventDestroy(ev);
    cudaFree(cnt_b);
    is_status(rankmem_resource_trim(mr, 0), RANKMEM_SUCCESS, "%s: trim", name);
    ok(query(mr, RANKMEM_QUERY_RESERVED_CURRENT) == 0, "%s: every superblock back", name);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s: release", name);
}

/* 40 MiB blocks in a 64 MiB arena: large blocks, straight from the global
 * arena; A's and B's are the same memory every round. */
static void test_large(rankmem_resource_t *up, const char *name, int rounds)
{
    const size_t blk = 40 * MiB, words = blk / 4;
    rankmem_resource_t *mr = make_arena(up, name, 64 * MiB, 0);
    if (!mr)
        return;
    cudaStream_t sa, sb;
    make_streams(&sa, &sb);
    unsigned long long *cnt = make_counters(2);
    int failed = 0, same = 0;
    for (int r = 0; r < rounds; r++) {
        void *pa = NULL, *pb = NULL;
        unsigned pat_a = 0xe0000000u + (unsigned)r, pat_b = 0xf0000000u + (unsigned)r;
        CALL(failed, rankmem_allocate_async(mr, blk, 0, sa, &pa));
        if (!pa)
            continue;
        CALL(failed, rk_test_fill(pa, words, pat_a, sa));
        CALL(failed, rk_test_spin(sa, SPIN_CYCLES));
        CALL(failed, rk_test_check_async(pa, words, pat_a, &cnt[0], sa));
        CALL(failed, rankmem_deallocate_async(mr, pa, blk, 0, sa));
        CALL(failed, rankmem_allocate_async(mr, blk, 0, sb, &pb));
        if (!pb)
            continue;
        same += pb == pa;
        CALL(failed, rk_test_fill(pb, words, pat_b, sb));
        CALL(failed, rk_test_spin(sb, SPIN_CYCLES / 4));
        CALL(failed, rk_test_check_async(pb, words, pat_b, &cnt[1], sb));
        CALL(failed, rankmem_deallocate_async(mr, pb, blk, 0, sb));
    }
    unsigned long long bad = read_counters(cnt, 2, sa, sb, &failed);
    ok(failed == 0, "%s: large blocks: %d rounds without a failed call (%d)", name, rounds, failed);
    ok(same == rounds, "%s: B got A's large block in every round (%d of %d)", name, same, rounds);
    ok(bad == 0, "%s: no stream saw the other's writes (%llu bad words)", name, bad);
    is_status(rankmem_arena_forget_stream(mr, sa), RANKMEM_SUCCESS, "%s: forget A", name);
    is_status(rankmem_arena_forget_stream(mr, sb), RANKMEM_SUCCESS, "%s: forget B", name);
    ok(cudaStreamDestroy(sa) == cudaSuccess && cudaStreamDestroy(sb) == cudaSuccess,
       "%s: streams destroyed", name);
    cudaFree(cnt);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "%s: release", name);
}

/* arena_size 0: half of the device's free memory. */
static void test_default_size(rankmem_resource_t *cuda)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
        BAIL_OUT("cudaMemGetInfo failed");
    rankmem_resource_t *mr = make_arena(cuda, "arena(cuda, default size)", 0, 0);
    if (!mr)
        return;
    size_t got = query(mr, RANKMEM_QUERY_POOL_MAX), want = free_b / 2;
    ok(got <= want && want - got <= 64 * MiB,
       "default size: %zu bytes, half of the %zu bytes free", got, free_b);
    char buf[64];
    size_t need = 0;
    rankmem_resource_describe(mr, buf, sizeof buf, &need);
    ok(strcmp(buf, "arena>cuda") == 0, "described as %s", buf);
    void *p = NULL;
    is_status(rankmem_allocate(mr, 1000, 0, &p), RANKMEM_SUCCESS, "default size: allocate");
    unsigned long long bad = ~0ull;
    int err = p ? rk_test_fill(p, 250, 0x600d, NULL) : -1;
    if (!err)
        err = rk_test_check(p, 250, 0x600d, NULL, &bad);
    ok(err == 0 && bad == 0, "default size: a kernel wrote and read it back (%d, %llu bad)", err,
       bad);
    if (p)
        rankmem_deallocate(mr, p, 1000, 0);
    is_status(rankmem_resource_release(mr), RANKMEM_SUCCESS, "default size: release");
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

    test_superblocks(cuda, "arena(cuda)", 50);
    test_pending(cuda, "arena(cuda)", 50);
    test_large(cuda, "arena(cuda)", 50);
    test_default_size(cuda);

    st = rankmem_async_create(NULL, &async);
    if (st == RANKMEM_ERR_NOT_SUPPORTED) {
        tap_skip(1, "no stream-ordered allocator on this device");
    } else {
        is_status(st, RANKMEM_SUCCESS, "async_create(default pool)");
        if (st == RANKMEM_SUCCESS) {
            test_superblocks(async, "arena(async)", 25);
            test_pending(async, "arena(async)", 25);
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
