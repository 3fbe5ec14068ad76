/* Live blocks of ours: pointer -> block, and which resources they keep alive.
 *
 * The map. omp_free has no size and device memory has no room for a
 * header, so every block is recorded here: 256 shards, each an
 * open-addressing table (linear probing, backward-shift deletion, so no
 * tombstones) under its own spinlock, one cache line apart. The shard and
 * the slot come from different bits of one mixed hash, so the blocks of any
 * one thread spread over all shards and threads rarely meet on a lock; a
 * critical section is a probe and a 64-byte copy, too short to be worth a
 * futex sleep.
 *
 * Resource entries. A block must keep the resource it came from alive until
 * it is freed (the application may replace the current resource, or destroy
 * the allocator, with blocks live). A reference per block would be a
 * read-modify-write of the resource's one shared counter at every omp_alloc
 * and omp_free: under 16 threads that line bounces between cores and drags
 * the resource's read-mostly fields (ops, props) with it. Instead the layer
 * holds ONE reference per resource it serves from (an entry) and counts
 * that resource's live blocks in per-shard stripes, in the shard the
 * block's pointer hashes to: `ins` is raised under the shard's lock at
 * insert, `rel` by an atomic add (on the same cache line, which the freeing
 * thread just had) after the block went back to its resource. A block's
 * insert and release touch the same shard, so ins - rel of a stripe is that
 * shard's live count, never negative, and the sum over shards is exact.
 *
 * An entry is ACTIVE while in service (the current resource of a device as
 * last seen here, or an allocator's own chain) and RETIRED once not (the
 * device's current resource changed, or omp_destroy_allocator). Retiring
 * harvests the stripes: under each shard's lock, `rel` gets the HARVESTED
 * flag and ins - rel is added up. A release whose add finds the flag came
 * after the harvest counted its block and lowers the entry's `remaining`
 * instead; the one that takes it to zero (or the harvest itself, when
 * nothing was live) drops the layer's reference and frees the entry. An
 * insert racing with the harvest either lands before it (and is counted) or
 * finds the flag under the lock (and the block takes a reference of its own
 * instead); a generation number (odd while the entry is being reset for
 * reuse) catches an entry freed and reused between an allocation picking it
 * and inserting its block. The release is counted only after the block went
 * back, so a retirement never lets the resource go while a free of one of
 * its blocks is still inside it.
 *
 * Blocks that cannot use an entry (all RKOMP_NENT in use, or the race above)
 * hold a reference of their own, as every block did before; blocks of the
 * shared managed and pinned resources, which live as long as the process,
 * hold nothing. */
#include "omp_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define NSHARDS 256u
#define SHARD_BITS 8
#define INITIAL_CAPACITY 16u
#define HARVESTED ((uint64_t)1 << 63) /* flag in a shard's released count */
#define REMAINING_BIAS ((long)1 << 40) /* keeps `remaining` above 0 during a harvest */

/* ---- spinlock: test-and-test-and-set, pause, yield when it lasts ---- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void spin_wait(unsigned *l)
{
    /* The holder may have been preempted (more threads than cores): after
     * a short spin let it run rather than burn its time slice. */
    for (unsigned n = 0;; n++) {
        while (__atomic_load_n(l, __ATOMIC_RELAXED)) {
            if (++n < 128)
                cpu_relax();
            else
                sched_yield();
        }
        if (!__atomic_exchange_n(l, 1u, __ATOMIC_ACQUIRE))
            return;
    }
}

static inline void spin_lock(unsigned *l)
{
    if (RKOMP_UNLIKELY(__atomic_exchange_n(l, 1u, __ATOMIC_ACQUIRE)))
        spin_wait(l);
}

static inline void spin_unlock(unsigned *l) { __atomic_store_n(l, 0u, __ATOMIC_RELEASE); }

/* ---- shards ---- */

typedef struct shard {
    unsigned lock;
    unsigned count; /* written under the lock, atomically: read without it (lookup) */
    size_t mask;    /* capacity - 1; 0 while slots is NULL */
    rkomp_block_t *slots;
    /* Per entry: blocks inserted into this shard (under the lock), and
     * blocks released (atomic, lock-free; HARVESTED once counted out).
     * Their difference is the entry's live blocks here. */
    struct {
        uint64_t ins, rel;
    } n[RKOMP_NENT]; /* the first entries share the lock's cache line */
} __attribute__((aligned(64))) shard_t;

static shard_t shards[NSHARDS];
/* Bit (1 GiB region of a block's address, hashed) set once a block of ours
 * was inserted there. Atomic, sticky; read by every omp_free: a line of its
 * own, written once per region, so it stays shared in every core's cache and
 * a pointer of the runtime's (host heap, while ours are usually device
 * memory) is told apart with this one load. */
static struct {
    uint64_t bits;
} __attribute__((aligned(64))) regions;

static inline uint64_t region_bit(const void *p)
{
    return (uint64_t)1 << ((((uint64_t)(uintptr_t)p >> 30) * 0x9e3779b97f4a7c15ull) >> 58);
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

static inline shard_t *shard_of(uint64_t h) { return &shards[h >> (64 - SHARD_BITS)]; }

/* Slot holding ptr, or the empty slot where it would go. */
static inline size_t probe(const shard_t *s, const void *ptr, uint64_t h)
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
            s->slots[probe(s, old[i].ptr, old[i].hash)] = old[i];
    free(old);
    return 0;
}

/* ---- resource entries ---- */

enum { ENT_FREE = 0, ENT_ACTIVE = 1, ENT_RETIRED = 2 };

typedef struct entry {
    unsigned gen;            /* atomic; odd while being (re)initialised */
    unsigned state;          /* atomic: ENT_* */
    rankmem_resource_t *mr;  /* atomic; the layer's reference while not FREE */
    int device;              /* the device whose current resource it is, or -1 */
    long remaining;          /* atomic; after the harvest: blocks still live (+ bias) */
} __attribute__((aligned(64))) entry_t;

static entry_t ents[RKOMP_NENT];
static pthread_mutex_t ent_lock = PTHREAD_MUTEX_INITIALIZER; /* creation, retirement */
static int dev_ent[RKOMP_MAX_DEVICES];                         /* atomic; entry + 1, 0 = none */

/* Under ent_lock, with the entry's last block gone: back to FREE. Returns
 * the reference to drop (outside the lock: it may finalize a pool). */
static rankmem_resource_t *ent_free_locked(int e)
{
    entry_t *en = &ents[e];
    rankmem_resource_t *mr = en->mr;
    if (en->device >= 0 && en->device < RKOMP_MAX_DEVICES &&
        __atomic_load_n(&dev_ent[en->device], __ATOMIC_RELAXED) == e + 1)
        __atomic_store_n(&dev_ent[en->device], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&en->state, ENT_FREE, __ATOMIC_RELEASE);
    return mr;
}

/* `remaining` went to zero (by n): the entry's last block is gone. */
static void ent_drop(int e)
{
    pthread_mutex_lock(&ent_lock);
    rankmem_resource_t *mr = ent_free_locked(e);
    pthread_mutex_unlock(&ent_lock);
    rankmem_resource_release(mr);
}

/* Under ent_lock. Returns the reference to drop when nothing was live. */
static rankmem_resource_t *ent_retire_locked(int e)
{
    entry_t *en = &ents[e];
    if (__atomic_load_n(&en->state, __ATOMIC_RELAXED) != ENT_ACTIVE)
        return NULL;
    __atomic_store_n(&en->remaining, REMAINING_BIAS, __ATOMIC_RELAXED);
    __atomic_store_n(&en->state, ENT_RETIRED, __ATOMIC_RELEASE);
    long sum = 0;
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard_t *s = &shards[i];
        spin_lock(&s->lock);
        uint64_t rel = __atomic_fetch_or(&s->n[e].rel, HARVESTED, __ATOMIC_ACQ_REL);
        sum += (long)(s->n[e].ins - rel);
        spin_unlock(&s->lock);
    }
    long sub = REMAINING_BIAS - sum;
    if (__atomic_sub_fetch(&en->remaining, sub, __ATOMIC_ACQ_REL) == 0)
        return ent_free_locked(e);
    return NULL;
}

/* Entries that allocators' chains leave to devices' current resources:
 * without an entry, every allocation on the device space would take the
 * slow path. */
#define DEVICE_RESERVE 8

/* Under ent_lock: an entry for mr holding one new reference, or -1. */
static int ent_create_locked(rankmem_resource_t *mr, int device)
{
    int e = -1, nfree = 0;
    for (int i = 0; i < (int)RKOMP_NENT; i++)
        if (__atomic_load_n(&ents[i].state, __ATOMIC_ACQUIRE) == ENT_FREE) {
            nfree++;
            if (e < 0)
                e = i;
        }
    if (device < 0 && nfree <= DEVICE_RESERVE)
        return -1;
    if (e < 0 || rankmem_resource_retain(mr) != RANKMEM_SUCCESS)
        return -1;
    entry_t *en = &ents[e];
    /* Odd: an allocation that picked this entry in its previous life sees
     * the change at insert and takes a reference of its own. */
    __atomic_add_fetch(&en->gen, 1, __ATOMIC_ACQ_REL);
    for (unsigned i = 0; i < NSHARDS; i++) {
        shard_t *s = &shards[i];
        spin_lock(&s->lock);
        s->n[e].ins = 0;
        __atomic_store_n(&s->n[e].rel, 0, __ATOMIC_RELAXED);
        spin_unlock(&s->lock);
    }
    __atomic_store_n(&en->mr, mr, __ATOMIC_RELAXED);
    en->device = device;
    __atomic_store_n(&en->state, ENT_ACTIVE, __ATOMIC_RELAXED);
    __atomic_add_fetch(&en->gen, 1, __ATOMIC_RELEASE);
    return e;
}

int rkomp_ent_create(rankmem_resource_t *mr)
{
    pthread_mutex_lock(&ent_lock);
    int e = ent_create_locked(mr, -1);
    pthread_mutex_unlock(&ent_lock);
    return e;
}

void rkomp_ent_retire(int e)
{
    if (e < 0 || e >= (int)RKOMP_NENT)
        return;
    pthread_mutex_lock(&ent_lock);
    rankmem_resource_t *drop = ent_retire_locked(e);
    pthread_mutex_unlock(&ent_lock);
    if (drop)
        rankmem_resource_release(drop);
}

int rkomp_ent_pin(int e, const rankmem_resource_t *mr, unsigned *gen_p)
{
    if (e < 0)
        return 0;
    entry_t *en = &ents[e];
    unsigned g = __atomic_load_n(&en->gen, __ATOMIC_ACQUIRE);
    /* Acquire loads: the second read of gen stays after them (a seqlock). */
    int ok = !(g & 1u) && __atomic_load_n(&en->mr, __ATOMIC_ACQUIRE) == mr &&
             __atomic_load_n(&en->state, __ATOMIC_ACQUIRE) == ENT_ACTIVE;
    if (!ok || __atomic_load_n(&en->gen, __ATOMIC_RELAXED) != g)
        return 0;
    *gen_p = g;
    return 1;
}

int rkomp_device_ent(int device, rankmem_resource_t *mr, unsigned *gen_p)
{
    if (device < 0 || device >= RKOMP_MAX_DEVICES)
        return RKOMP_ENT_OWN;
    int e = __atomic_load_n(&dev_ent[device], __ATOMIC_ACQUIRE) - 1;
    if (RKOMP_LIKELY(rkomp_ent_pin(e, mr, gen_p)))
        return e;
    /* First allocation on this device, or its current resource changed:
     * retire the old entry (its blocks keep it until freed), make one. */
    rankmem_resource_t *drop = NULL;
    pthread_mutex_lock(&ent_lock);
    e = __atomic_load_n(&dev_ent[device], __ATOMIC_RELAXED) - 1;
    if (!rkomp_ent_pin(e, mr, gen_p)) {
        if (e >= 0)
            drop = ent_retire_locked(e);
        e = ent_create_locked(mr, device);
        __atomic_store_n(&dev_ent[device], e + 1, __ATOMIC_RELEASE);
        if (e >= 0)
            *gen_p = __atomic_load_n(&ents[e].gen, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&ent_lock);
    if (drop)
        rankmem_resource_release(drop);
    return e >= 0 ? e : RKOMP_ENT_OWN;
}

void rkomp_device_ent_check(int e)
{
    entry_t *en = &ents[e];
    int dev = en->device; /* stable: the caller's block keeps the entry */
    rankmem_resource_t *cur;
    if (dev < 0 || __atomic_load_n(&en->state, __ATOMIC_RELAXED) != ENT_ACTIVE ||
        rankmem_get_device_resource(dev, &cur) != RANKMEM_SUCCESS ||
        RKOMP_LIKELY(cur == __atomic_load_n(&en->mr, __ATOMIC_RELAXED)))
        return;
    pthread_mutex_lock(&ent_lock);
    rankmem_resource_t *drop = NULL;
    if (__atomic_load_n(&en->state, __ATOMIC_RELAXED) == ENT_ACTIVE &&
        __atomic_load_n(&dev_ent[dev], __ATOMIC_RELAXED) == e + 1) {
        drop = ent_retire_locked(e);
        __atomic_store_n(&dev_ent[dev], 0, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ent_lock);
    if (drop) /* cannot happen: the caller's block is still counted */
        rankmem_resource_release(drop);
}

void rkomp_ent_unaccount(const void *ptr, int e)
{
    shard_t *s = shard_of(mix(ptr));
    /* Released after the harvest counted the block: it is the entry's
     * `remaining` that goes down. */
    if (RKOMP_UNLIKELY(__atomic_fetch_add(&s->n[e].rel, 1, __ATOMIC_ACQ_REL) & HARVESTED) &&
        __atomic_sub_fetch(&ents[e].remaining, 1, __ATOMIC_ACQ_REL) == 0)
        ent_drop(e);
}

/* ---- the map ---- */

int rkomp_map_insert(rkomp_block_t *b, unsigned gen)
{
    uint64_t h = mix(b->ptr);
    shard_t *s = shard_of(h);
    int own_ref = 0;
    b->hash = (unsigned)h; /* the slot index uses the low bits only */
    /* Before the block is published (the program gets ptr after this call
     * returns, so whoever frees it sees the bit). Read first: the line is
     * written once per region, not per block. */
    uint64_t bit = region_bit(b->ptr);
    if (RKOMP_UNLIKELY(!(__atomic_load_n(&regions.bits, __ATOMIC_RELAXED) & bit)))
        __atomic_fetch_or(&regions.bits, bit, __ATOMIC_RELEASE);
    spin_lock(&s->lock);
    /* Grow at half load: probes stay short. */
    if ((s->count + 1) * 2 > (s->mask ? s->mask + 1 : 0) && grow(s) != 0) {
        spin_unlock(&s->lock);
        return -1;
    }
    if (b->ent >= 0) {
        /* Counted in its entry unless that was retired (harvested) or
         * reused since the allocation picked it. */
        if (!(__atomic_load_n(&s->n[b->ent].rel, __ATOMIC_RELAXED) & HARVESTED) &&
            __atomic_load_n(&ents[b->ent].gen, __ATOMIC_ACQUIRE) == gen) {
            s->n[b->ent].ins++;
        } else {
            b->ent = RKOMP_ENT_OWN;
            own_ref = 1;
        }
    }
    size_t i = probe(s, b->ptr, h);
    if (!s->slots[i].ptr)
        __atomic_store_n(&s->count, s->count + 1, __ATOMIC_RELAXED);
    s->slots[i] = *b;
    spin_unlock(&s->lock);
    return own_ref;
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
    spin_lock(&s->lock);
    if (!s->count) {
        spin_unlock(&s->lock);
        return 0;
    }
    size_t i = probe(s, ptr, h);
    if (!s->slots[i].ptr) {
        spin_unlock(&s->lock);
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
            size_t home = (size_t)s->slots[j].hash & s->mask;
            if (((j - home) & s->mask) >= ((j - hole) & s->mask)) {
                s->slots[hole] = s->slots[j];
                hole = j;
            }
        }
        s->slots[hole].ptr = NULL;
        __atomic_store_n(&s->count, s->count - 1, __ATOMIC_RELAXED);
    }
    spin_unlock(&s->lock);
    return 1;
}

void rkomp_map_forget(const void *ptr)
{
    rkomp_block_t b;
    lookup(ptr, &b, 1);
}

int rkomp_map_remove(const void *ptr, rkomp_block_t *b_p) { return lookup(ptr, b_p, 1); }
int rkomp_map_get(const void *ptr, rkomp_block_t *b_p) { return lookup(ptr, b_p, 0); }
int rkomp_map_maybe(const void *ptr)
{
    return (__atomic_load_n(&regions.bits, __ATOMIC_ACQUIRE) & region_bit(ptr)) != 0;
}
