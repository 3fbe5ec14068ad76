/* librankmem_omp's deferred release (docs/openmp.md, "Deferred release"):
 * omp_free of device-accessible memory leaves the block of ours waiting for
 * a device sync that began after the free, and one sync serves many frees.
 *
 * Without a GPU there is nothing to wait for, so the program runs itself
 * again with RKOMP_TEST_DEFER=1 (read when the library starts): host blocks
 * of ours then take the same path with a no-op wait. With a GPU the real
 * path runs (the test writes only host-accessible memory: managed memory
 * stands in for device memory where the host must write).
 *
 * Checked: a pending block is out of the map at once (a second free is a
 * foreign pointer's) but still live in the resource's stats until
 * rankmem_omp_flush; blocks another thread's sync released go back before
 * the list's bound; frees past a shard's bound give blocks back without a
 * flush; a block far over a thread's byte share goes back at once; a pool_size
 * allocator full of pending blocks still serves (flush on failure);
 * omp_destroy_allocator gives its pending blocks back; a replaced current
 * resource goes once its pending blocks went back; 16 threads allocating,
 * writing their own pattern, checking and freeing (no block handed out
 * twice), with flushes and a small pool_size allocator mixed in; an
 * over-aligned block, cut from a larger one, waits and goes back as that
 * larger block. Run under ThreadSanitizer by hand (docs/openmp.md). */
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include "omp_test.h"

#define NTHREADS 16
#define ITERS 3000
#define KEEP 8

static rankmem_stats_t stats_of(rankmem_resource_t *st)
{
    rankmem_stats_t s = {.size = sizeof s};
    if (rankmem_stats_get(st, &s) != RANKMEM_SUCCESS)
        diag("rankmem_stats_get failed: %s", rankmem_last_error());
    return s;
}

static int env_off(const char *name)
{
    const char *v = getenv(name);
    return v && (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no") ||
                 !strcasecmp(v, "false"));
}

/* ---- one thread ---- */

/* A leaf that refuses alignments over 256 bytes (as cudaMalloc promises no
 * more): the layer over-allocates and rounds up, so the block that waits is
 * the base it was cut from. Its free checks that exactly that comes back. */
static void *picky_base;
static size_t picky_bytes, picky_frees, picky_wrong;

static rankmem_status_t picky_alloc(void *arg, size_t bytes, size_t alignment,
                                    rankmem_stream_t stream, void **ptr_p)
{
    (void)arg;
    (void)stream;
    if (alignment > 256)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (!(*ptr_p = aligned_alloc(256, (bytes + 255) & ~(size_t)255)))
        return RANKMEM_ERR_OUT_OF_MEMORY;
    picky_base = *ptr_p;
    picky_bytes = bytes;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t picky_free(void *arg, void *ptr, size_t bytes, size_t alignment,
                                   rankmem_stream_t stream)
{
    (void)arg;
    (void)stream;
    if (ptr != picky_base || bytes != picky_bytes || alignment != 256)
        picky_wrong++;
    picky_frees++;
    free(ptr);
    return RANKMEM_SUCCESS;
}

static void over_aligned(rankmem_resource_t *st)
{
    rankmem_resource_t *picky = NULL, *ps = NULL;
    if (rankmem_callback_create(picky_alloc, picky_free, NULL,
                                RANKMEM_PROP_HOST_ACCESSIBLE | RANKMEM_PROP_DEVICE_ACCESSIBLE,
                                &picky) != RANKMEM_SUCCESS ||
        rankmem_stats_create(picky, &ps) != RANKMEM_SUCCESS ||
        rankmem_set_current_resource(ps) != RANKMEM_SUCCESS)
        BAIL_OUT("cannot install the picky leaf: %s", rankmem_last_error());
    const omp_allocator_handle_t dev = rankmem_omp_device_mem_alloc;
    void *p = omp_aligned_alloc(4096, 1000, dev);
    ok(p && aligned_to(p, 4096) && picky_base &&
           picky_bytes == 1000 + 4096 - 256,
       "omp_aligned_alloc(4096) over a leaf promising 256: over-allocated (%zu bytes)",
       picky_bytes);
    omp_free(p, dev);
    /* The test switch defers every block of ours; with a GPU only those of
     * a device (this leaf's memory is the host's). */
    if (getenv("RKOMP_TEST_DEFER"))
        ok(picky_frees == 0 && stats_of(ps).count_current == 1, "freed, it waits");
    else
        tap_skip(1, "a host leaf's blocks do not wait with a GPU");
    rankmem_omp_flush();
    ok(picky_frees == 1 && picky_wrong == 0 && stats_of(ps).count_current == 0,
       "after its wait the base goes back with its own size and 256-byte alignment");
    rankmem_set_current_resource(st);
    omp_free(omp_alloc(64, dev), dev); /* notices the swap: retires the entry */
    rankmem_omp_flush();
    rankmem_resource_release(ps);
    rankmem_resource_release(picky);
}

static void single_thread(rankmem_resource_t *st)
{
    const omp_allocator_handle_t dev = rankmem_omp_device_mem_alloc;
    ok(rankmem_omp_flush() == RANKMEM_SUCCESS, "rankmem_omp_flush with nothing pending");
    size_t live0 = stats_of(st).count_current;

    void *p = omp_alloc(1000, dev);
    uintptr_t pa = addr_of(p);
    omp_free(p, dev);
    ok(p && was_freed(pa), "a freed block leaves the map at once (a second free is not ours)");
    rankmem_stats_t s = stats_of(st);
    ok(s.count_current == live0 + 1 && s.bytes_current >= 1000,
       "... but still counts as live while it waits (%zu live)", s.count_current);
    ok(rankmem_omp_flush() == RANKMEM_SUCCESS && stats_of(st).count_current == live0,
       "rankmem_omp_flush gives it back");

    /* Many frees: the thread's list gives back what may go once it holds
     * more than a few dozen, so most go back without a flush. */
    enum { N = 4096 };
    static void *many[N];
    int got = 0;
    for (int i = 0; i < N; i++)
        got += (many[i] = omp_alloc(256 + (size_t)(i % 7) * 64, dev)) != NULL;
    for (int i = 0; i < N; i++)
        omp_free(many[i], dev);
    size_t waiting = stats_of(st).count_current - live0;
    ok(got == N && waiting > 0 && waiting <= 256,
       "%d frees: %zu still waiting, the rest went back without a flush", N, waiting);
    rankmem_omp_flush();
    ok(stats_of(st).count_current == live0, "... and a flush gives the rest back");

    /* A block over four times a thread's share of RANKMEM_OMP_DEFER_BYTES
     * (16 MiB by default) goes back at once, after one wait. */
    const char *db = getenv("RANKMEM_OMP_DEFER_BYTES");
    if (db && *db) {
        tap_skip(1, "RANKMEM_OMP_DEFER_BYTES is set");
    } else {
        void *big = omp_alloc((size_t)80 << 20, dev);
        omp_free(big, dev);
        ok(big && stats_of(st).count_current == live0,
           "an 80 MiB block (over 4 times a thread's 16 MiB share) goes back at once");
    }

    /* A pool_size allocator full of waiting blocks still serves: the failed
     * attempt gives them back and tries again. */
    omp_alloctrait_t t[2] = {{omp_atk_pool_size, 64 << 10}, {omp_atk_fallback, omp_atv_null_fb}};
    omp_allocator_handle_t lim = omp_init_allocator(rankmem_omp_device_mem_space, 2, t);
    void *q[4];
    int served = 0;
    for (int i = 0; i < 4; i++)
        served += (q[i] = omp_alloc(16 << 10, lim)) != NULL;
    void *over = omp_alloc(16 << 10, lim);
    ok(lim != omp_null_allocator && served == 4 && !over,
       "pool_size 64 KiB, null_fb: four 16 KiB blocks fill it");
    for (int i = 0; i < 4; i++)
        omp_free(q[i], lim);
    ok(stats_of(st).count_current == live0 + 4, "freed, the four wait (still counted)");
    void *again = omp_alloc(16 << 10, lim);
    ok(is_ours(again) && stats_of(st).count_current == live0 + 1,
       "the full pool_size still serves: the waiting blocks went back first");
    omp_free(again, lim);

    /* omp_destroy_allocator gives back its chain's waiting blocks. */
    ok(stats_of(st).count_current == live0 + 1, "one block of the allocator waits");
    omp_destroy_allocator(lim);
    ok(stats_of(st).count_current == live0, "omp_destroy_allocator gave it back");

    /* Blocks freed after their allocator was destroyed still go back, and
     * take the chain with them. */
    lim = omp_init_allocator(rankmem_omp_device_mem_space, 2, t);
    void *late = omp_alloc(1000, lim);
    omp_destroy_allocator(lim);
    omp_free(late, omp_null_allocator);
    rankmem_omp_flush();
    ok(late && stats_of(st).count_current == live0,
       "a block outliving its allocator goes back through its chain");

    /* A replaced current resource goes once its waiting blocks went back. */
    rankmem_resource_t *st2 = NULL;
    if (rankmem_stats_create(st, &st2) != RANKMEM_SUCCESS ||
        rankmem_set_current_resource(st2) != RANKMEM_SUCCESS)
        BAIL_OUT("cannot install a second stats adaptor");
    void *r = omp_alloc(1000, dev);
    rankmem_set_current_resource(st);
    ok(st2->refcount == 2, "the replaced resource is held for its live block (%lu)",
       st2->refcount);
    /* The first free after the swap retires the entry: the block, now
     * waiting, goes back through its resource before the reference does. */
    omp_free(r, dev);
    ok(stats_of(st2).count_current == 0 && st2->refcount == 1,
       "freed after the swap: the block went back, then the layer's reference (%lu)",
       st2->refcount);
    omp_free(omp_alloc(64, dev), dev);

    /* More blocks owing their retired entry wait than one round of
     * give-backs settles (32): all go back, then the reference. */
    enum { NH = 40 };
    void *hv[NH];
    rankmem_set_current_resource(st2);
    for (int i = 0; i < NH; i++)
        hv[i] = omp_alloc(500 + (size_t)i, dev);
    rankmem_set_current_resource(st);
    omp_free(omp_alloc(64, dev), dev); /* retires st2's entry with the 40 live */
    for (int i = 0; i < NH; i++)
        omp_free(hv[i], dev);
    ok(st2->refcount == 2 && stats_of(st2).count_current == NH,
       "%d blocks of a retired entry wait and hold it (%lu, %zu)", NH, st2->refcount,
       stats_of(st2).count_current);
    rankmem_omp_flush();
    ok(st2->refcount == 1 && stats_of(st2).count_current == 0,
       "flushed: all went back, then the layer's reference (%lu, %zu)", st2->refcount,
       stats_of(st2).count_current);
    rankmem_resource_release(st2);
    rankmem_omp_flush();
    over_aligned(st);
}

/* Blocks that another thread's sync made releasable go back before the
 * list reaches its bound: thread 0 frees 100 blocks, thread 1 frees 300
 * (past 256 it syncs, which covers thread 0's too), then thread 0 frees 28
 * more; at its 128th push it finds the head of its list releasable. */
static void *eg_blocks[2][300];
static int eg_got; /* atomic (the runtime's barriers are invisible to ThreadSanitizer) */
static size_t eg_after;
static rankmem_resource_t *eg_st; /* static: the region captures nothing of main's stack */

static void early_give_back(rankmem_resource_t *st)
{
    rankmem_omp_flush();
    size_t live0 = stats_of(st).count_current;
    eg_st = st;
#pragma omp parallel num_threads(2)
    {
        int me = omp_get_thread_num();
        for (int i = 0; i < (me ? 300 : 128); i++)
            if ((eg_blocks[me][i] = omp_alloc(1000, rankmem_omp_device_mem_alloc)) != NULL)
                __atomic_fetch_add(&eg_got, 1, __ATOMIC_RELAXED);
#pragma omp barrier
        if (me == 0)
            for (int i = 0; i < 100; i++)
                omp_free(eg_blocks[0][i], rankmem_omp_device_mem_alloc);
#pragma omp barrier
        if (me == 1)
            for (int i = 0; i < 300; i++)
                omp_free(eg_blocks[1][i], rankmem_omp_device_mem_alloc);
#pragma omp barrier
        if (me == 0) {
            for (int i = 100; i < 128; i++)
                omp_free(eg_blocks[0][i], rankmem_omp_device_mem_alloc);
            eg_after = stats_of(eg_st).count_current;
        }
    }
    ok(__atomic_load_n(&eg_got, __ATOMIC_RELAXED) == 428 && eg_after - live0 < 128,
       "2 threads: a thread gives back what another's sync released, below its bound "
       "(%zu still waiting; 171 if it kept them)",
       eg_after - live0);
    rankmem_omp_flush();
    ok(stats_of(st).count_current == live0, "... and a flush gives the rest back");
}

/* ---- 16 threads ----
 * Shared through atomics on static storage (see tests/omp/threads.c: the
 * runtime's own synchronisation is invisible to ThreadSanitizer). */
static int t_bad, t_served, t_refused, t_flush_bad;

static void many_threads(rankmem_resource_t *st, omp_allocator_handle_t rw, int rw_counted)
{
    omp_alloctrait_t t[2] = {{omp_atk_pool_size, 256 << 10}, {omp_atk_fallback, omp_atv_null_fb}};
    omp_allocator_handle_t lim = omp_init_allocator(rankmem_omp_managed_mem_space, 2, t);
    if (lim == omp_null_allocator)
        BAIL_OUT("cannot create the pool_size allocator");
#pragma omp parallel num_threads(NTHREADS)
    {
        int me = omp_get_thread_num(), bad = 0, served = 0, refused = 0, flush_bad = 0;
        unsigned seed = 777u + 131u * (unsigned)me;
        unsigned char tag = (unsigned char)(me + 1);
        unsigned char *keep[KEEP] = {0};
        size_t keep_n[KEEP] = {0};
        for (int i = 0; i < ITERS; i++) {
            seed = seed * 1103515245u + 12345u;
            int slot = (int)((seed >> 8) % KEEP);
            if (keep[slot]) {
                bad += !all_bytes(keep[slot], tag, keep_n[slot]);
                omp_free(keep[slot], omp_null_allocator);
                keep[slot] = NULL;
            }
            /* Mostly the device (or managed) allocator, sometimes the small
             * pool_size one, whose failures flush. */
            int small = (seed >> 16) % 8 == 0;
            size_t n = 64 + (seed >> 12) % (small ? 32768 : 4000);
            unsigned char *p = omp_alloc(n, small ? lim : rw);
            if (!p) {
                refused++;
                bad += !small;
                continue;
            }
            served++;
            memset(p, tag, n);
            keep[slot] = p;
            keep_n[slot] = n;
            if (me == 0 && i % 500 == 0)
                flush_bad += rankmem_omp_flush() != RANKMEM_SUCCESS;
        }
        for (int k = 0; k < KEEP; k++)
            if (keep[k]) {
                bad += !all_bytes(keep[k], tag, keep_n[k]);
                omp_free(keep[k], omp_null_allocator);
            }
        __atomic_fetch_add(&t_bad, bad, __ATOMIC_RELEASE);
        __atomic_fetch_add(&t_served, served, __ATOMIC_RELEASE);
        __atomic_fetch_add(&t_refused, refused, __ATOMIC_RELEASE);
        __atomic_fetch_add(&t_flush_bad, flush_bad, __ATOMIC_RELEASE);
    }
    int bad = __atomic_load_n(&t_bad, __ATOMIC_ACQUIRE);
    ok(bad == 0, "%d threads: every block kept its owner's pattern, none handed out twice (%d)",
       NTHREADS, bad);
    ok(__atomic_load_n(&t_served, __ATOMIC_ACQUIRE) > NTHREADS * ITERS / 2,
       "most requests were served (%d, %d refused by the small pool)",
       __atomic_load_n(&t_served, __ATOMIC_ACQUIRE), __atomic_load_n(&t_refused, __ATOMIC_ACQUIRE));
    ok(__atomic_load_n(&t_flush_bad, __ATOMIC_ACQUIRE) == 0,
       "rankmem_omp_flush under load succeeds");
    omp_destroy_allocator(lim);
    ok(rankmem_omp_flush() == RANKMEM_SUCCESS, "final flush");
    if (rw_counted) {
        rankmem_stats_t s = stats_of(st);
        ok(s.count_current == 0 && s.bytes_current == 0 && s.count_total > 0,
           "the rank's resource: nothing live at the end (%zu of %zu)", s.count_current,
           s.count_total);
    } else {
        tap_skip(1, "device memory: the threads wrote managed memory");
    }
}

int main(int argc, char **argv)
{
    (void)argc;
    int ngpu = 0;
    rankmem_device_count(&ngpu);
    if (env_off("RANKMEM_OMP_FREE_SYNC") || env_off("RANKMEM_OMP_DEFER_BYTES"))
        return tap_skip_all("deferred release is off (RANKMEM_OMP_FREE_SYNC or _DEFER_BYTES)");
    if (ngpu == 0 && !getenv("RKOMP_TEST_DEFER")) {
        /* The switch is read when the library starts: run again with it. */
        setenv("RKOMP_TEST_DEFER", "1", 1);
        fflush(stdout);
        execv("/proc/self/exe", argv);
        perror("execv /proc/self/exe");
        return 99;
    }
    int active = 0;
    rankmem_omp_active(&active);
    if (!active)
        BAIL_OUT("librankmem_omp is not interposed (link order)");
    diag("runtime: %s, %s", RT_NAME,
         ngpu ? "GPU: the real deferral" : "no GPU: RKOMP_TEST_DEFER=1 (no-op waits)");

    rankmem_resource_t *cur, *st = install_stats(&cur);

    single_thread(st);

    /* The threads write their blocks: device memory where the host may,
     * else managed memory. */
    void *probe = omp_alloc(64, rankmem_omp_device_mem_alloc);
    int dev_rw = host_ok(probe);
    omp_free(probe, rankmem_omp_device_mem_alloc);
    many_threads(st, dev_rw ? rankmem_omp_device_mem_alloc : rankmem_omp_managed_mem_alloc,
                 dev_rw);
    /* After the 16 threads: their region made the runtime's threads (its
     * later regions' hand-offs are invisible to ThreadSanitizer). */
    early_give_back(st);

    rankmem_set_current_resource(cur);
    omp_free(omp_alloc(64, rankmem_omp_device_mem_alloc), rankmem_omp_device_mem_alloc);
    rankmem_omp_flush();
    ok(st->refcount == 1, "nothing of the layer's is left on the resource (%lu)", st->refcount);
    rankmem_resource_release(st);
    rankmem_resource_release(cur);
    return tap_done();
}
