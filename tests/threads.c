/* Concurrency: threads on their own streams allocate, check and free through
 * one pool, and hand blocks to each other to free on another stream; other
 * threads swap the registry's current resource meanwhile. Run it under
 * ThreadSanitizer (see README). */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <rankmem.h>
#include "tap.h"
#include "counting.h"

#define NTHREADS 8
#define STEPS 20000
#define HANDOFF 64

static rankmem_resource_t *pool;
static pthread_mutex_t handoff_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    unsigned char *p;
    size_t n;
    unsigned char fill;
} handoff[HANDOFF];
static int nhandoff;
static int errors[NTHREADS], corrupt[NTHREADS], served[NTHREADS];

static unsigned long long rng(unsigned long long *s)
{
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static int check(const unsigned char *p, size_t n, unsigned char fill)
{
    for (size_t i = 0; i < n; i += 61)
        if (p[i] != fill)
            return 0;
    return p[n - 1] == fill;
}

static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    rankmem_stream_t stream = (rankmem_stream_t)(uintptr_t)(0x100 * (id + 1));
    unsigned long long s = 12345 + (unsigned long long)id;
    struct { unsigned char *p; size_t n; unsigned char fill; } mine[32];
    int n = 0;
    for (int step = 0; step < STEPS; step++) {
        unsigned r = (unsigned)rng(&s);
        if (n < 32 && (n == 0 || r % 3)) {
            size_t bytes = 1 + rng(&s) % (32 << 10);
            void *p;
            rankmem_status_t st = rankmem_allocate_async(pool, bytes, 0, stream, &p);
            if (st != RANKMEM_SUCCESS) {
                errors[id]++;
                continue;
            }
            served[id]++;
            unsigned char fill = (unsigned char)(id * 31 + step);
            memset(p, fill, bytes);
            mine[n].p = p, mine[n].n = bytes, mine[n].fill = fill;
            n++;
        } else {
            int i = (int)(rng(&s) % (unsigned)n);
            if (!check(mine[i].p, mine[i].n, mine[i].fill))
                corrupt[id]++;
            /* Every so often pass the block on, to be freed by another thread. */
            int passed = 0;
            if (r % 7 == 0) {
                pthread_mutex_lock(&handoff_lock);
                if (nhandoff < HANDOFF) {
                    handoff[nhandoff].p = mine[i].p, handoff[nhandoff].n = mine[i].n;
                    handoff[nhandoff].fill = mine[i].fill;
                    nhandoff++;
                    passed = 1;
                }
                pthread_mutex_unlock(&handoff_lock);
            }
            if (!passed && rankmem_deallocate_async(pool, mine[i].p, mine[i].n, 0, stream))
                errors[id]++;
            mine[i] = mine[--n];
        }
        if (r % 11 == 0) { /* free one block somebody else allocated, on our stream */
            unsigned char *p = NULL;
            size_t bytes = 0;
            unsigned char fill = 0;
            pthread_mutex_lock(&handoff_lock);
            if (nhandoff) {
                nhandoff--;
                p = handoff[nhandoff].p, bytes = handoff[nhandoff].n, fill = handoff[nhandoff].fill;
            }
            pthread_mutex_unlock(&handoff_lock);
            if (p) {
                if (!check(p, bytes, fill))
                    corrupt[id]++;
                if (rankmem_deallocate_async(pool, p, bytes, 0, stream))
                    errors[id]++;
            }
        }
    }
    for (int i = 0; i < n; i++) {
        if (!check(mine[i].p, mine[i].n, mine[i].fill))
            corrupt[id]++;
        if (rankmem_deallocate_async(pool, mine[i].p, mine[i].n, 0, stream))
            errors[id]++;
    }
    return NULL;
}

/* Phase 2: a bounded pool, so threads run out, take memory from each other's
 * shards and defragment; out of memory is allowed, corruption is not. */
static rankmem_resource_t *bounded;
static int b_errors[NTHREADS], b_corrupt[NTHREADS], b_oom[NTHREADS];

static void *bounded_worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    rankmem_stream_t stream = (rankmem_stream_t)(uintptr_t)(0x10000 * (id + 1));
    unsigned long long s = 999 + (unsigned long long)id;
    struct { unsigned char *p; size_t n; unsigned char fill; } mine[16];
    int n = 0;
    for (int step = 0; step < STEPS / 2; step++) {
        if (n < 16 && (n == 0 || rng(&s) % 2)) {
            size_t bytes = 1 + rng(&s) % (256 << 10);
            void *p;
            rankmem_status_t st = rankmem_allocate_async(bounded, bytes, 0, stream, &p);
            if (st == RANKMEM_ERR_OUT_OF_MEMORY) {
                b_oom[id]++;
                continue;
            }
            if (st != RANKMEM_SUCCESS) {
                b_errors[id]++;
                continue;
            }
            unsigned char fill = (unsigned char)(id * 17 + step);
            memset(p, fill, bytes);
            mine[n].p = p, mine[n].n = bytes, mine[n].fill = fill;
            n++;
        } else {
            int i = (int)(rng(&s) % (unsigned)n);
            if (!check(mine[i].p, mine[i].n, mine[i].fill))
                b_corrupt[id]++;
            if (rankmem_deallocate_async(bounded, mine[i].p, mine[i].n, 0, stream))
                b_errors[id]++;
            mine[i] = mine[--n];
        }
    }
    for (int i = 0; i < n; i++) {
        if (!check(mine[i].p, mine[i].n, mine[i].fill))
            b_corrupt[id]++;
        if (rankmem_deallocate_async(bounded, mine[i].p, mine[i].n, 0, stream))
            b_errors[id]++;
    }
    return NULL;
}

static rankmem_resource_t *registry_pools[2];
static int registry_errors;

static void *registry_worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < 2000; i++) {
        if (rankmem_set_current_resource(registry_pools[i & 1]) != RANKMEM_SUCCESS)
            __atomic_add_fetch(&registry_errors, 1, __ATOMIC_RELAXED);
        rankmem_resource_t *cur = NULL;
        if (rankmem_get_current_resource(&cur) != RANKMEM_SUCCESS ||
            (cur != registry_pools[0] && cur != registry_pools[1]))
            __atomic_add_fetch(&registry_errors, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(void)
{
    int finalized;
    counting_t *up = counting_new(&finalized);
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    prm.initial_size = 4 << 20;
    if (rankmem_pool_create(&up->base, &prm, &pool) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < nhandoff; i++)
        rankmem_deallocate(pool, handoff[i].p, handoff[i].n, 0);
    int err = 0, bad = 0, total = 0;
    for (int i = 0; i < NTHREADS; i++)
        err += errors[i], bad += corrupt[i], total += served[i];
    ok(err == 0, "%d threads: every call succeeded (%d errors)", NTHREADS, err);
    ok(bad == 0, "no block was overwritten by another thread (%d)", bad);
    ok(total > NTHREADS * STEPS / 3, "%d allocations served", total);
    size_t live = 1, used = 1;
    rankmem_resource_query(pool, RANKMEM_QUERY_LIVE_COUNT, &live);
    rankmem_resource_query(pool, RANKMEM_QUERY_USED_CURRENT, &used);
    ok(live == 0 && used == 0, "nothing live at the end");

    int bfinal;
    counting_t *bup = counting_new(&bfinal);
    rankmem_pool_params_t bprm;
    rankmem_pool_params_default(&bprm);
    bprm.initial_size = 2 << 20;
    bprm.maximum_size = 8 << 20;
    if (rankmem_pool_create(&bup->base, &bprm, &bounded) != RANKMEM_SUCCESS)
        BAIL_OUT("pool_create: %s", rankmem_last_error());
    for (int i = 0; i < NTHREADS; i++)
        pthread_create(&t[i], NULL, bounded_worker, (void *)(intptr_t)i);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(t[i], NULL);
    int berr = 0, bbad = 0, boom = 0;
    for (int i = 0; i < NTHREADS; i++)
        berr += b_errors[i], bbad += b_corrupt[i], boom += b_oom[i];
    ok(berr == 0, "bounded pool: every call succeeded or said out of memory (%d errors, %d OOM)", berr, boom);
    ok(bbad == 0, "bounded pool: no block overwritten (%d)", bbad);
    size_t held = 0;
    rankmem_resource_query(bounded, RANKMEM_QUERY_RESERVED_HIGH, &held);
    ok(held <= (8 << 20), "bounded pool never held more than its maximum (%zu)", held);
    is_status(rankmem_resource_trim(bounded, 0), RANKMEM_SUCCESS, "bounded pool: trim to 0");
    rankmem_resource_query(bounded, RANKMEM_QUERY_RESERVED_CURRENT, &held);
    ok(held == 0 && bup->outstanding_blocks == 0,
       "after every free, blocks spread over threads' shards add up to whole chunks again (%zu held)", held);
    rankmem_resource_release(&bup->base);
    is_status(rankmem_resource_release(bounded), RANKMEM_SUCCESS, "bounded pool released");
    ok(bfinal, "bounded chain gone");

    rankmem_resource_t *orig;
    rankmem_get_current_resource(&orig);
    rankmem_resource_retain(orig);
    registry_pools[0] = pool;
    rankmem_pool_create(orig, NULL, &registry_pools[1]);
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, registry_worker, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ok(registry_errors == 0, "the registry is consistent under concurrent get/set");
    rankmem_set_current_resource(orig);
    ok(pool->refcount == 1 && registry_pools[1]->refcount == 1, "and holds no stray references");
    rankmem_resource_release(registry_pools[1]);
    rankmem_resource_release(orig);
    rankmem_resource_release(&up->base);
    is_status(rankmem_resource_release(pool), RANKMEM_SUCCESS, "released");
    ok(finalized, "chain gone");
    return tap_done();
}
