/* Live blocks of ours: pointer -> block. omp_free has no size and device
 * memory has no room for a header, so every block is recorded here.
 *
 * A sharded hash map: 64 shards, each an open-addressing table (linear
 * probing, backward-shift deletion, so no tombstones) under its own mutex.
 * Threads freeing different pointers rarely meet on a lock. The shard and
 * the slot come from different bits of one mixed hash. */
#include "omp_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NSHARDS 64u
#define INITIAL_CAPACITY 64u

typedef struct shard {
    pthread_mutex_t lock;
    rkomp_block_t *slots;
    size_t mask;  /* capacity - 1; 0 while slots is NULL */
    size_t count; /* written under the lock, atomically: read without it (lookup) */
} __attribute__((aligned(64))) shard_t;

static shard_t shards[NSHARDS];
static pthread_once_t shards_once = PTHREAD_ONCE_INIT;
static int ever_used; /* atomic, sticky */

static void shards_init(void)
{
    for (unsigned i = 0; i < NSHARDS; i++)
        pthread_mutex_init(&shards[i].lock, NULL);
}

/* splitmix64's finaliser: every input bit reaches every output bit, which
 * matters because our pointers share their low (alignment) bits. */
static inline uint64_t mix(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static inline shard_t *shard_of(uint64_t h) { return &shards[h >> 58]; }

/* Slot holding ptr, or the empty slot where it would go. */
static size_t probe(const shard_t *s, const void *ptr, uint64_t h)
{
    size_t i = (size_t)h & s->mask;
    while (s->slots[i].ptr && s->slots[i].ptr != ptr)
        i = (i + 1) & s->mask;
    return i;
}

static int grow(shard_t *s)
{
    size_t cap = s->mask ? (s->mask + 1) * 2 : INITIAL_CAPACITY;
    rkomp_block_t *n = calloc(cap, sizeof *n);
    if (!n)
        return -1;
    rkomp_block_t *old = s->slots;
    size_t old_cap = s->mask ? s->mask + 1 : 0;
    s->slots = n;
    s->mask = cap - 1;
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].ptr)
            s->slots[probe(s, old[i].ptr, mix(old[i].ptr))] = old[i];
    free(old);
    return 0;
}

rankmem_status_t rkomp_map_insert(const rkomp_block_t *b)
{
    pthread_once(&shards_once, shards_init);
    uint64_t h = mix(b->ptr);
    shard_t *s = shard_of(h);
    pthread_mutex_lock(&s->lock);
    /* Grow at half load: probes stay short. */
    if ((s->count + 1) * 2 > (s->mask ? s->mask + 1 : 0) && grow(s) != 0) {
        pthread_mutex_unlock(&s->lock);
        return RANKMEM_ERR_OUT_OF_MEMORY;
    }
    size_t i = probe(s, b->ptr, h);
    if (!s->slots[i].ptr)
        __atomic_store_n(&s->count, s->count + 1, __ATOMIC_RELAXED);
    s->slots[i] = *b;
    pthread_mutex_unlock(&s->lock);
    if (RKOMP_UNLIKELY(!__atomic_load_n(&ever_used, __ATOMIC_RELAXED)))
        __atomic_store_n(&ever_used, 1, __ATOMIC_RELEASE);
    return RANKMEM_SUCCESS;
}

static int lookup(const void *ptr, rkomp_block_t *b_p, int remove)
{
    if (!ptr)
        return 0;
    uint64_t h = mix(ptr);
    shard_t *s = shard_of(h);
    /* An empty shard cannot hold ptr: skip the lock. This is what keeps
     * omp_free of the runtime's blocks cheap once rankmem has served some
     * (few live blocks of ours leave most shards empty). Safe without the
     * lock: if ptr is ours, its insertion happened before this free (the
     * program got ptr from that allocation), so the count it raised is
     * seen, and only freeing ptr itself could bring it back down. */
    if (!__atomic_load_n(&s->count, __ATOMIC_RELAXED))
        return 0;
    pthread_once(&shards_once, shards_init);
    pthread_mutex_lock(&s->lock);
    if (!s->count) {
        pthread_mutex_unlock(&s->lock);
        return 0;
    }
    size_t i = probe(s, ptr, h);
    if (!s->slots[i].ptr) {
        pthread_mutex_unlock(&s->lock);
        return 0;
    }
    *b_p = s->slots[i];
    if (remove) {
        /* Backward shift: move later members of the run into the hole when
         * the hole lies between their home slot and where they sit. */
        size_t hole = i, j = i;
        for (;;) {
            j = (j + 1) & s->mask;
            if (!s->slots[j].ptr)
                break;
            size_t home = (size_t)mix(s->slots[j].ptr) & s->mask;
            if (((j - home) & s->mask) >= ((j - hole) & s->mask)) {
                s->slots[hole] = s->slots[j];
                hole = j;
            }
        }
        memset(&s->slots[hole], 0, sizeof s->slots[hole]);
        __atomic_store_n(&s->count, s->count - 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&s->lock);
    return 1;
}

int rkomp_map_remove(const void *ptr, rkomp_block_t *b_p) { return lookup(ptr, b_p, 1); }
int rkomp_map_get(const void *ptr, rkomp_block_t *b_p) { return lookup(ptr, b_p, 0); }
int rkomp_map_used(void) { return __atomic_load_n(&ever_used, __ATOMIC_ACQUIRE); }
