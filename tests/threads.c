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
#include "stress_harness.h"

#define NTHREADS 8
#define STEPS 20000

static size_t size_upto(void *arg, unsigned r, unsigned long long *s)
{
    (void)r;
    return 1 + sh_rng(s) % *(const size_t *)arg;
}

static rankmem_resource_t *pool, *bounded;

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
    /* Threads on their own streams hand blocks to each other to free. */
    size_t max = 32 << 10;
    sh_config_t cfg = {.mr = pool, .threads = NTHREADS, .steps = STEPS, .live = 32,
                       .seed = 12345, .handoff_mod = 7, .take_mod = 11, .size = size_upto,
                       .arg = &max};
    sh_result_t res;
    sh_run(&cfg, &res);
    sh_report(&res, "8 threads over a pool", NTHREADS * STEPS / 3);
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
    /* Phase 2: a bounded pool, so threads run out, take memory from each
     * other's shards and defragment; out of memory is allowed, corruption is not. */
    size_t bmax = 256 << 10;
    sh_config_t bcfg = {.mr = bounded, .threads = NTHREADS, .steps = STEPS / 2, .live = 16,
                        .seed = 999, .alloc_mod = 2, .stream_base = 0x10000,
                        .refusal = RANKMEM_ERR_OUT_OF_MEMORY, .size = size_upto, .arg = &bmax};
    sh_run(&bcfg, &res);
    sh_report(&res, "bounded pool", 0); /* refused: out of memory */
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
    pthread_t t[4];
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
