/* The biased lock (src/bias.h): mutual exclusion holds through the owner's
 * plain sections, revocations by other threads and the owner taking the
 * bias back. Built with src/bias.c (the lock is internal). */
#include "../src/bias.h"
#include "tap.h"

#include <pthread.h>

#define OWNER_OPS 2000000
#define OTHER_OPS 20000
#define OTHERS 3

static rk_block_t lock;
static volatile unsigned long counter; /* plain: only the lock protects it */
static volatile unsigned long pair_a, pair_b; /* always equal outside the lock */
static int broken;
static int inited; /* the owner made the lock (release/acquire: others see it whole) */

static void critical(void)
{
    unsigned long a = pair_a;
    pair_a = a + 1;
    counter = counter + 1;
    if (pair_b != a)
        broken = 1;
    pair_b = a + 1;
}

static void *owner_thread(void *arg)
{
    int *biased_entries = arg;
    rk_block_init(&lock, 1);
    __atomic_store_n(&inited, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < OWNER_OPS; i++) {
        int m = rk_block_lock(&lock);
        *biased_entries += m;
        critical();
        rk_block_unlock(&lock, m);
    }
    return NULL;
}

static void *other_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < OTHER_OPS; i++) {
        int m = rk_block_lock(&lock);
        if (m)
            broken = 1; /* only the owner may enter biased */
        critical();
        rk_block_unlock(&lock, m);
        if (i % 64 == 0)
            sched_yield(); /* let the owner take the bias back now and then */
    }
    return NULL;
}

int main(void)
{
    tap_plan(5);
    int ready = rk_membarrier_ready();
    diag("membarrier %s", ready ? "available: biased" : "missing: plain lock");

    /* Alone: every entry of the owner is biased (when membarrier works). */
    int alone = 0;
    owner_thread(&alone);
    ok(ready ? alone == OWNER_OPS : alone == 0, "owner alone: %d of %d entries biased", alone,
       OWNER_OPS);

    counter = pair_a = pair_b = 0;
    __atomic_store_n(&inited, 0, __ATOMIC_RELAXED);
    int biased = 0;
    pthread_t o, t[OTHERS];
    /* The owner initialises the lock in its thread: start it first. */
    pthread_create(&o, NULL, owner_thread, &biased);
    while (!__atomic_load_n(&inited, __ATOMIC_ACQUIRE))
        sched_yield();
    for (int i = 0; i < OTHERS; i++)
        pthread_create(&t[i], NULL, other_thread, NULL);
    pthread_join(o, NULL);
    for (int i = 0; i < OTHERS; i++)
        pthread_join(t[i], NULL);
    unsigned long want = (unsigned long)OWNER_OPS + (unsigned long)OTHERS * OTHER_OPS;
    ok(counter == want, "no update lost: %lu of %lu", counter, want);
    ok(!broken, "no two threads inside at once");
    ok(lock.v == 0 && lock.inside == 0, "lock free and owner outside at the end");
    diag("owner entries biased under contention: %d of %d", biased, OWNER_OPS);
    ok(!ready || biased > 0, "the owner got the bias back after revocations");
    return tap_done();
}
