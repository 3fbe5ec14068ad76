/* librankmem_omp under 16 threads: each allocates, writes, checks and frees
 * through the predefined allocators, a shared pool_size allocator (null_fb),
 * a sync_hint private allocator, the runtime's own allocator, reallocs that
 * cross between them, and allocate clauses. At the end nothing is live in
 * the rank's resource. Blocks are also freed, resized and looked up by
 * threads other than the one that allocated them, and left behind by
 * threads that exit. Run under ThreadSanitizer by hand (docs/openmp.md). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "omp_test.h"

#define NTHREADS 16
#define ITERS 1500

/* One thread keeps replacing the current resource (two stats adaptors, in
 * turn) while the others allocate and free through the device allocator:
 * every block goes back to the adaptor it came from, and once all are freed
 * (and the swaps are noticed) the library holds no reference on either. */
/* Shared with the region through atomics on static storage: libgomp hands
 * its argument block (and what was written before the region) to its pooled
 * threads without ThreadSanitizer seeing it, a false report. */
static rankmem_resource_t *pair[2];
static int t_bad, t_done;

static void swaps_under_load(rankmem_resource_t *cur, rankmem_resource_t *st)
{
    rankmem_resource_t *st2 = NULL;
    if (rankmem_resource_retain(cur) != RANKMEM_SUCCESS ||
        rankmem_stats_create(cur, &st2) != RANKMEM_SUCCESS)
        BAIL_OUT("cannot make a second stats adaptor");
    __atomic_store_n(&pair[0], st, __ATOMIC_RELEASE);
    __atomic_store_n(&pair[1], st2, __ATOMIC_RELEASE);
#pragma omp parallel num_threads(8)
    {
        int me = omp_get_thread_num(), bad = 0;
        void *keep[4] = {0};
        rankmem_resource_t *two[2] = {__atomic_load_n(&pair[0], __ATOMIC_ACQUIRE),
                                      __atomic_load_n(&pair[1], __ATOMIC_ACQUIRE)};
        /* Thread 0 swaps until the others are done. */
        for (unsigned i = 0; me == 0 && __atomic_load_n(&t_done, __ATOMIC_ACQUIRE) < 7; i++)
            rankmem_set_current_resource(two[i % 2]);
        for (int i = 0; me != 0 && i < 4000; i++) {
            int k = i % 4;
            if (keep[k])
                omp_free(keep[k], rankmem_omp_device_mem_alloc);
            keep[k] = omp_alloc(64 + (size_t)(i % 512), rankmem_omp_device_mem_alloc);
            rankmem_resource_t *mr = NULL;
            bad += !keep[k] || rankmem_omp_block_info(keep[k], NULL, &mr) != RANKMEM_SUCCESS ||
                   (mr != two[0] && mr != two[1]);
        }
        for (int k = 0; k < 4; k++)
            if (keep[k])
                omp_free(keep[k], rankmem_omp_device_mem_alloc);
        __atomic_fetch_add(&t_bad, bad, __ATOMIC_RELEASE);
        if (me != 0)
            __atomic_fetch_add(&t_done, 1, __ATOMIC_RELEASE);
    }
    /* Notice the last swap, then the other adaptor's entry: the layer then
     * holds a reference on the current one only while it has blocks. */
    rankmem_set_current_resource(cur);
    omp_free(omp_alloc(64, rankmem_omp_device_mem_alloc), rankmem_omp_device_mem_alloc);
    rankmem_omp_flush(); /* with a GPU, freed device memory may wait for a sync */
    rankmem_stats_t s1 = {.size = sizeof s1}, s2 = {.size = sizeof s2};
    rankmem_stats_get(st, &s1);
    rankmem_stats_get(st2, &s2);
    ok(__atomic_load_n(&t_bad, __ATOMIC_ACQUIRE) == 0 && s1.count_current == 0 &&
           s2.count_current == 0,
       "swaps under load: every block from and back to one of the two (%zu + %zu served)",
       s1.count_total, s2.count_total);
    ok(st2->refcount == 1, "swaps under load: no reference left on the swapped-out resource (%lu)",
       st2->refcount);
    rankmem_set_current_resource(st);
    rankmem_resource_release(st2);
}

/* Each thread's blocks are recorded in its own map: a block freed, resized
 * or looked up by another thread is found through the other maps (whose
 * owners lose their bias for a while), and the blocks of a thread that
 * exited stay findable while its map waits for, or serves, a new thread. */
#define CROSS 64
static void *cross_blk[NTHREADS][CROSS];
static int cross_bad;

static size_t cross_size(int t, int i) { return 64 + (size_t)(t * CROSS + i); }

static size_t live_of(rankmem_resource_t *st)
{
    rankmem_stats_t s = {.size = sizeof s};
    rankmem_stats_get(st, &s);
    return s.count_current;
}

static void *exit_worker(void *arg)
{
    void **out = arg;
    for (int i = 0; i < CROSS; i++)
        out[i] = omp_alloc(cross_size(0, i), rankmem_omp_device_mem_alloc);
    return NULL; /* exits with its blocks live */
}

static void *churn_worker(void *arg)
{
    int *bad = arg;
    for (int i = 0; i < 200; i++) {
        void *p = omp_alloc(cross_size(1, i % CROSS), rankmem_omp_device_mem_alloc);
        *bad += !is_ours(p);
        omp_free(p, rankmem_omp_device_mem_alloc);
    }
    return NULL;
}

static void cross_threads(rankmem_resource_t *st)
{
    /* Blocks handed over through atomics (libgomp's barrier is invisible
     * to ThreadSanitizer), and the allocator named inside the region. */
    rankmem_omp_flush();
    size_t live0 = live_of(st);
#pragma omp parallel num_threads(NTHREADS)
    {
        int me = omp_get_thread_num(), bad = 0;
        for (int i = 0; i < CROSS; i++)
            __atomic_store_n(&cross_blk[me][i],
                             omp_alloc(cross_size(me, i), rankmem_omp_device_mem_alloc),
                             __ATOMIC_RELEASE);
#pragma omp barrier
        int other = (me + 1) % NTHREADS;
        for (int i = 0; i < CROSS; i++) {
            void *p = __atomic_load_n(&cross_blk[other][i], __ATOMIC_ACQUIRE);
            size_t n = 0;
            if (!p || rankmem_omp_block_info(p, &n, NULL) != RANKMEM_SUCCESS ||
                n != cross_size(other, i)) {
                bad++;
                continue;
            }
            if (i % 4 == 0) {
                void *q = omp_realloc(p, 2 * n, omp_null_allocator, omp_null_allocator);
                if (!q || !is_ours(q)) {
                    bad++;
                    continue;
                }
                p = q;
            }
            omp_free(p, omp_null_allocator);
        }
        __atomic_fetch_add(&cross_bad, bad, __ATOMIC_RELEASE);
    }
    int cbad = __atomic_load_n(&cross_bad, __ATOMIC_ACQUIRE);
    ok(cbad == 0, "16 threads free and resize each other's blocks: all found (%d not)", cbad);
    rankmem_omp_flush();
    ok(live_of(st) == live0, "... and all went back (%zu live, %zu before)", live_of(st), live0);

    static void *left[4][CROSS];
    int bad = 0, made = 1;
    for (int t = 0; t < 4; t++) {
        pthread_t th;
        if (pthread_create(&th, NULL, exit_worker, left[t]) != 0 || pthread_join(th, NULL) != 0)
            made = 0;
    }
    for (int t = 0; t < 4 && made; t++)
        for (int i = 0; i < CROSS; i++)
            bad += !is_ours(left[t][i]);
    /* New threads take the exited ones' maps over, blocks and all. */
    for (int t = 0; t < 4 && made; t++) {
        pthread_t th;
        if (pthread_create(&th, NULL, churn_worker, &bad) != 0 || pthread_join(th, NULL) != 0)
            made = 0;
    }
    for (int t = 0; t < 4 && made; t++)
        for (int i = 0; i < CROSS; i++) {
            uintptr_t a = addr_of(left[t][i]);
            omp_free(left[t][i], rankmem_omp_device_mem_alloc);
            bad += !was_freed(a);
        }
    rankmem_omp_flush();
    ok(made && bad == 0 && live_of(st) == live0,
       "blocks of 4 threads that exited: found and freed by another thread after new threads "
       "reused their maps (%d bad, %zu live, %zu before)",
       bad, live_of(st), live0);
}

int main(void)
{
    diag("runtime: %s, %d threads", RT_NAME, NTHREADS);
    rankmem_resource_t *cur = NULL, *st = NULL;
    if (rankmem_get_current_resource(&cur) != RANKMEM_SUCCESS ||
        rankmem_resource_retain(cur) != RANKMEM_SUCCESS ||
        rankmem_stats_create(cur, &st) != RANKMEM_SUCCESS ||
        rankmem_set_current_resource(st) != RANKMEM_SUCCESS)
        BAIL_OUT("cannot install a stats adaptor as the current resource");

    omp_alloctrait_t tp[2] = {{omp_atk_pool_size, 1 << 20}, {omp_atk_fallback, omp_atv_null_fb}};
    omp_allocator_handle_t pool = omp_init_allocator(rankmem_omp_device_mem_space, 2, tp);
    omp_alloctrait_t tv[1] = {{omp_atk_sync_hint, omp_atv_private}};
    omp_allocator_handle_t priv = omp_init_allocator(rankmem_omp_device_mem_space, 1, tv);
    if (pool == omp_null_allocator || priv == omp_null_allocator)
        BAIL_OUT("cannot create the test allocators");
    omp_allocator_handle_t all[6] = {rankmem_omp_device_mem_alloc, rankmem_omp_managed_mem_alloc,
                                     rankmem_omp_pinned_mem_alloc, pool, priv,
                                     omp_default_mem_alloc};
    /* With a GPU the device space is device memory: allocated and freed
     * here, never touched by the host. */
    int ngpu = 0;
    rankmem_device_count(&ngpu);
    const int host_ok[6] = {ngpu == 0, 1, 1, ngpu == 0, ngpu == 0, 1};

    /* Totals through atomics rather than a reduction: libgomp's reduction
     * synchronises inside the (uninstrumented) runtime, which
     * ThreadSanitizer would report as races. */
    int t_bad = 0, t_served = 0, t_refused = 0, t_clause = 0;
#pragma omp parallel num_threads(NTHREADS)
    {
        int bad = 0, served = 0, refused = 0, clause = 0;
        unsigned seed = 12345u + 977u * (unsigned)omp_get_thread_num();
        unsigned char tag = (unsigned char)(omp_get_thread_num() + 1);
        void *keep[8] = {0};
        size_t keep_n[8] = {0};
        int keep_t[8] = {0}; /* its contents are the thread's tag (host-accessible) */
        for (int i = 0; i < ITERS; i++) {
            if (i % 100 == 0) {
                double x[32];
#pragma omp parallel num_threads(1) private(x) allocate(rankmem_omp_device_mem_alloc : x)
                {
                    clause += is_ours(x);
                    if (ngpu == 0)
                        x[0] = 1;
                }
                (void)x;
            }
            seed = seed * 1103515245u + 12345u;
            int ai = (int)((seed >> 8) % 6);
            omp_allocator_handle_t a = all[ai];
            size_t n = 1 + (seed >> 12) % 5000;
            int slot = (int)((seed >> 4) % 8);
            if (keep[slot]) {
                if (keep_t[slot])
                    bad += !all_bytes(keep[slot], tag, keep_n[slot]);
                if ((seed >> 20) % 3 == 0) {
                    /* realloc into another allocator: contents must follow */
                    int bi = (int)((seed >> 24) % 6);
                    omp_allocator_handle_t b = all[bi];
                    size_t m = 1 + (seed >> 16) % 3000;
                    unsigned char *q = omp_realloc(keep[slot], m, b, omp_null_allocator);
                    if (q) {
                        size_t common = m < keep_n[slot] ? m : keep_n[slot];
                        if (keep_t[slot] && host_ok[bi])
                            bad += !all_bytes(q, tag, common);
                        if (host_ok[bi])
                            memset(q, tag, m);
                        keep[slot] = q;
                        keep_n[slot] = m;
                        keep_t[slot] = host_ok[bi];
                        continue;
                    }
                    refused++;
                }
                omp_free(keep[slot], omp_null_allocator);
                keep[slot] = NULL;
            }
            unsigned char *p = (seed >> 28) & 1 ? omp_calloc(1, n, a) : omp_alloc(n, a);
            if (!p) {
                refused++; /* only the 1 MiB pool may refuse */
                bad += a != pool;
                continue;
            }
            served++;
            if (host_ok[ai])
                memset(p, tag, n);
            keep[slot] = p;
            keep_n[slot] = n;
            keep_t[slot] = host_ok[ai];
        }
        for (int s = 0; s < 8; s++)
            if (keep[s]) {
                if (keep_t[s])
                    bad += !all_bytes(keep[s], tag, keep_n[s]);
                omp_free(keep[s], omp_null_allocator);
            }
        __atomic_fetch_add(&t_bad, bad, __ATOMIC_RELEASE);
        __atomic_fetch_add(&t_served, served, __ATOMIC_RELEASE);
        __atomic_fetch_add(&t_refused, refused, __ATOMIC_RELEASE);
        __atomic_fetch_add(&t_clause, clause, __ATOMIC_RELEASE);
    }
    int bad = __atomic_load_n(&t_bad, __ATOMIC_ACQUIRE);
    int served = __atomic_load_n(&t_served, __ATOMIC_ACQUIRE);
    int refused = __atomic_load_n(&t_refused, __ATOMIC_ACQUIRE);
    int clause = __atomic_load_n(&t_clause, __ATOMIC_ACQUIRE);
    ok(bad == 0, "16 threads: no block lost its contents or came from the wrong place (%d)", bad);
    ok(served > NTHREADS * ITERS / 2, "most requests were served (%d, %d refused)", served, refused);
    ok(clause == NTHREADS * (ITERS / 100), "allocate clauses inside: %d from rankmem", clause);
    omp_destroy_allocator(pool);
    omp_destroy_allocator(priv);
    rankmem_omp_flush();
    rankmem_stats_t s = {.size = sizeof s};
    rankmem_stats_get(st, &s);
    ok(s.count_current == 0 && s.bytes_current == 0 && s.count_total > 0,
       "the rank's resource: nothing live at the end (%zu blocks of %zu total)", s.count_current,
       s.count_total);
    cross_threads(st);
    swaps_under_load(cur, st);
    rankmem_set_current_resource(cur);
    rankmem_resource_release(st);
    rankmem_resource_release(cur);
    return tap_done();
}
