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
 * insert, `rel` under the same lock when the block leaves the map to go
 * back at once (the free already holds that lock: no atomic add), or, for
 * a block given back later (pending, below), under it once it went back. A
 * block's insert and release touch the same shard, so ins - rel of a stripe
 * is that shard's live count, never negative, and the sum over shards is
 * exact.
 *
 * A release counted before its block went back must not let the resource
 * go while rankmem_deallocate is still inside it: the freeing thread
 * publishes the resource in its hazard slot under the shard lock, and
 * clears it once rankmem_deallocate returned. Whoever drops an entry's
 * reference first waits until no hazard slot names that resource. The
 * harvest (below) takes the shard lock after the free released it, so the
 * hazard is seen by anyone who saw the release counted.
 *
 * An entry is ACTIVE while in service (the current resource of a device as
 * last seen here, or an allocator's own chain) and RETIRED once not (the
 * device's current resource changed, or omp_destroy_allocator). Retiring
 * harvests the stripes: under each shard's lock, `rel` gets the HARVESTED
 * flag and ins - rel is added up. A release that finds the flag came
 * after the harvest counted its block and lowers the entry's `remaining`
 * instead; the one that takes it to zero (or the harvest itself, when
 * nothing was live) drops the layer's reference and frees the entry. An
 * insert racing with the harvest either lands before it (and is counted) or
 * finds the flag under the lock (and the block takes a reference of its own
 * instead); a generation number (odd while the entry is being reset for
 * reuse) catches an entry freed and reused between an allocation picking it
 * and inserting its block.
 *
 * Blocks that cannot use an entry (all RKOMP_NENT in use, or the race above)
 * hold a reference of their own, as every block did before; blocks of the
 * shared managed and pinned resources, which live as long as the process,
 * hold nothing.
 *
 * Deferred release. With RANKMEM_OMP_FREE_SYNC on, device-accessible
 * memory may go back only after a device-wide wait that began after its
 * omp_free. Instead of a cudaDeviceSynchronize per free, the block leaves
 * the map (a second free of it is a foreign pointer's) and waits on the
 * freeing thread's pending list, tagged with its device's sync epoch: `started`
 * counts syncs begun, `done` the highest one finished. A block tagged t
 * (started read at its free) may go back once done > t: that sync began
 * after the free. A free that takes its thread's list over a few dozen
 * blocks or its share of RANKMEM_OMP_DEFER_BYTES gives back what is
 * releasable, or,
 * with nothing releasable, runs one sync (one thread per device at a time;
 * the others keep deferring up to a hard bound, then wait for it). A
 * pending block still counts as live for its entry and in the resource's
 * stats until it went back. The list is the thread's own (in its hazard
 * slot, below): the blocks go back from the thread that freed them, so a
 * pool's per-thread caches get them where they left (giving other threads'
 * blocks back made 16 threads ten times slower). A failed allocation,
 * rankmem_omp_flush,
 * omp_destroy_allocator (its chain's blocks) and exit give back everything
 * pending. */
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

/* Pending blocks per shard: past SOFT (or the shard's byte share) a free
 * gives back what it can, or starts a sync; past HARD (or 4 shares) it
 * waits for one. TAKE: blocks given back per round (a stack array). */
#define PEND_SOFT 64u  /* a thread's list gives back past this */
#define PEND_HARD 128u /* ... and never holds more */
#define PEND_TAKE 128u
#define DEFAULT_DEFER_BYTES ((size_t)256 << 20)

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

typedef struct pend {
    rkomp_block_t b;
    uint64_t tag; /* its device's `started` at the free */
    int dev;
    int after;    /* AFTER_*: what its give-back still owes the block's entry */
} pend_t;
/* A pending block's release is counted when it leaves the map, under the
 * shard lock already held (its resource then stays alive through the
 * pending list: drop_ref gives back that resource's pending blocks first).
 * Left for after the give-back: nothing, the entry's `remaining` (the
 * entry was harvested with the block live), or the block's own reference. */
enum { AFTER_NONE = 0, AFTER_HARVESTED, AFTER_OWN_REF };

typedef struct shard {
    unsigned lock;
    unsigned count; /* written under the lock, atomically: read without it (lookup) */
    size_t mask;    /* capacity - 1; 0 while slots is NULL */
    rkomp_block_t *slots;
    /* Per entry: blocks inserted into this shard, and blocks released
     * (HARVESTED once counted out); both under the lock. Their difference
     * is the entry's live blocks here. */
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

/* Under the lock: take slot i out. Backward shift: move later members of
 * the run into the hole when the hole lies between their home slot and
 * where they sit (no tombstones). */
static inline void remove_at(shard_t *s, size_t i)
{
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

/* ---- hazard slots: a resource a free is still giving a block back to ----
 * One per thread (claimed at its first free, handed back at its exit),
 * never freed: a list that only grows to the most threads ever alive. */

typedef struct hz_slot {
    rankmem_resource_t *mr; /* atomic; NULL when not inside a give-back */
    unsigned used;          /* atomic: claimed by a thread */
    struct hz_slot *next;   /* fixed once published */
    /* The thread's pending blocks (deferred release): its own, but a flush
     * from any thread takes them too, under plock. */
    unsigned plock;
    unsigned npend; /* written under plock, atomically (flush reads it) */
    size_t pbytes;
    pend_t pend[PEND_HARD];
} __attribute__((aligned(64))) hz_slot_t;

static void pend_thread_exit(hz_slot_t *h);

static hz_slot_t *hz_head; /* atomic */
static pthread_key_t hz_key;
static pthread_once_t hz_once = PTHREAD_ONCE_INIT;
static int hz_key_ok;
static __thread hz_slot_t *my_hz __attribute__((tls_model("initial-exec")));

static void hz_thread_exit(void *p)
{
    hz_slot_t *h = p;
    pend_thread_exit(h);
    my_hz = NULL;
    __atomic_store_n(&h->mr, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&h->used, 0u, __ATOMIC_RELEASE);
}

static void hz_setup(void) { hz_key_ok = pthread_key_create(&hz_key, hz_thread_exit) == 0; }

/* The calling thread's slot, or NULL (no memory: its frees then count
 * their release after the give-back, under the shard lock again). */
static __attribute__((noinline)) hz_slot_t *hz_register(void)
{
    pthread_once(&hz_once, hz_setup);
    if (!hz_key_ok)
        return NULL;
    hz_slot_t *h;
    for (h = __atomic_load_n(&hz_head, __ATOMIC_ACQUIRE); h; h = h->next) {
        unsigned z = 0;
        if (__atomic_compare_exchange_n(&h->used, &z, 1u, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
    }
    if (!h) {
        if (!(h = aligned_alloc(_Alignof(hz_slot_t), sizeof *h)))
            return NULL;
        memset(h, 0, sizeof *h);
        h->used = 1;
        h->next = __atomic_load_n(&hz_head, __ATOMIC_RELAXED);
        while (!__atomic_compare_exchange_n(&hz_head, &h->next, h, 1, __ATOMIC_RELEASE,
                                            __ATOMIC_RELAXED)) {
        }
    }
    if (pthread_setspecific(hz_key, h) != 0) {
        __atomic_store_n(&h->used, 0u, __ATOMIC_RELEASE);
        return NULL;
    }
    my_hz = h;
    return h;
}

/* Drop one of the layer's references on mr: first wait until no free is
 * still inside rankmem_deallocate of mr or on its way into a pending list,
 * then give back mr's pending blocks. Never called with a lock held. */
static void drop_ref(rankmem_resource_t *mr)
{
    for (hz_slot_t *h = __atomic_load_n(&hz_head, __ATOMIC_ACQUIRE); h; h = h->next)
        for (unsigned n = 0; __atomic_load_n(&h->mr, __ATOMIC_ACQUIRE) == mr; n++) {
            if (n < 128)
                cpu_relax();
            else
                sched_yield();
        }
    rkomp_map_flush(mr, NULL);
    rankmem_resource_release(mr);
}

/* ---- resource entries ---- */

enum { ENT_FREE = 0, ENT_ACTIVE = 1, ENT_RETIRED = 2 };

typedef struct entry {
    unsigned gen;            /* atomic; odd while being (re)initialised */
    unsigned state;          /* atomic: ENT_* */
    rankmem_resource_t *mr;  /* atomic; the layer's reference while not FREE */
    int device;              /* atomic; the device whose current resource it is, or -1 */
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
    int dev = __atomic_load_n(&en->device, __ATOMIC_RELAXED);
    if (dev >= 0 && dev < RKOMP_MAX_DEVICES &&
        __atomic_load_n(&dev_ent[dev], __ATOMIC_RELAXED) == e + 1)
        __atomic_store_n(&dev_ent[dev], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&en->state, ENT_FREE, __ATOMIC_RELEASE);
    return mr;
}

/* `remaining` went to zero: the entry's last block is gone. */
static void ent_drop(int e)
{
    pthread_mutex_lock(&ent_lock);
    rankmem_resource_t *mr = ent_free_locked(e);
    pthread_mutex_unlock(&ent_lock);
    drop_ref(mr);
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
        uint64_t rel = s->n[e].rel;
        __atomic_store_n(&s->n[e].rel, rel | HARVESTED, __ATOMIC_RELAXED);
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
    __atomic_store_n(&en->device, device, __ATOMIC_RELAXED);
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
        drop_ref(drop);
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
        drop_ref(drop);
    return e >= 0 ? e : RKOMP_ENT_OWN;
}

void rkomp_device_ent_check(int e)
{
    if (e < 0 || e >= (int)RKOMP_NENT)
        return;
    entry_t *en = &ents[e];
    /* Read without the lock (the entry may even have been reused since the
     * caller's block went back): only a hint, checked again under it. */
    int dev = __atomic_load_n(&en->device, __ATOMIC_RELAXED);
    rankmem_resource_t *cur;
    if (dev < 0 || dev >= RKOMP_MAX_DEVICES ||
        __atomic_load_n(&en->state, __ATOMIC_RELAXED) != ENT_ACTIVE ||
        rankmem_get_device_resource(dev, &cur) != RANKMEM_SUCCESS ||
        RKOMP_LIKELY(cur == __atomic_load_n(&en->mr, __ATOMIC_RELAXED)))
        return;
    pthread_mutex_lock(&ent_lock);
    rankmem_resource_t *drop = NULL;
    if (__atomic_load_n(&en->state, __ATOMIC_RELAXED) == ENT_ACTIVE &&
        __atomic_load_n(&en->device, __ATOMIC_RELAXED) == dev &&
        __atomic_load_n(&dev_ent[dev], __ATOMIC_RELAXED) == e + 1 && en->mr != cur) {
        drop = ent_retire_locked(e);
        __atomic_store_n(&dev_ent[dev], 0, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&ent_lock);
    if (drop)
        drop_ref(drop);
}

/* ---- after a give-back ---- */

/* Under s's lock: count the release of a block of entry e. 1 when the
 * entry was harvested meanwhile (the harvest counted the block as live:
 * the caller lowers `remaining` instead, with rel_harvested, after
 * unlocking). */
static inline int count_release_locked(shard_t *s, int e)
{
    uint64_t rel = __atomic_load_n(&s->n[e].rel, __ATOMIC_RELAXED);
    if (RKOMP_UNLIKELY(rel & HARVESTED))
        return 1;
    __atomic_store_n(&s->n[e].rel, rel + 1, __ATOMIC_RELAXED);
    return 0;
}

static void rel_harvested(int e)
{
    if (__atomic_sub_fetch(&ents[e].remaining, 1, __ATOMIC_ACQ_REL) == 0)
        ent_drop(e);
}

/* What a block's give-back still owes its entry or resource (AFTER_*). */
static void settle_after(const rkomp_block_t *b, int after)
{
    if (after == AFTER_HARVESTED)
        rel_harvested(b->ent);
    else if (after == AFTER_OWN_REF)
        rankmem_resource_release(b->mr);
}

/* ---- deferral: per-device sync epochs, pending lists ---- */

static struct epoch {
    uint64_t started; /* atomic: syncs begun */
    char pad[56];
    uint64_t done;    /* atomic: the latest finished (written by the lock holder only) */
    unsigned lock;    /* atomic: a sync of this device is running */
} __attribute__((aligned(64))) epochs[RKOMP_MAX_DEVICES];

static int defer_mode = -1; /* atomic: -1 unknown, 0 off, 1 device-accessible blocks, 2 test */
static size_t thread_bytes; /* a thread's share of RANKMEM_OMP_DEFER_BYTES (set with defer_mode) */

static __attribute__((noinline)) int defer_mode_slow(void)
{
    int m = 0;
    size_t total = rkomp_defer_bytes(); /* resolves the runtime (and reads the environment) */
    if (rkomp_free_sync() && total) {
        if (rkomp_gpu_count() > 0)
            m = 1;
        else if (rkomp_test_defer())
            m = 2; /* host blocks of ours deferred, with a no-op wait: tests only */
    }
    __atomic_store_n(&thread_bytes, total / 16, __ATOMIC_RELAXED);
    __atomic_store_n(&defer_mode, m, __ATOMIC_RELEASE);
    return m;
}

static inline int get_defer_mode(void)
{
    int m = __atomic_load_n(&defer_mode, __ATOMIC_ACQUIRE);
    return RKOMP_LIKELY(m >= 0) ? m : defer_mode_slow();
}

int rkomp_defer_on(void) { return get_defer_mode() != 0; }

/* The device whose sync b must wait for, or -1: give it back now. */
static inline int defer_dev(int mode, const rkomp_block_t *b)
{
    if (mode == 2)
        return 0;
    int d = b->mr->device;
    return (b->mr->props & RANKMEM_PROP_DEVICE_ACCESSIBLE) && d >= 0 && d < RKOMP_MAX_DEVICES
               ? d
               : -1;
}

/* Make done > tag on device dev. Returns 0 once it is; 1 when another
 * thread's sync is running and !wait (nothing done); -1 when it is but a
 * sync this call ran failed. */
static int epoch_advance(int dev, uint64_t tag, int wait)
{
    struct epoch *ep = &epochs[dev];
    for (;;) {
        if (__atomic_load_n(&ep->done, __ATOMIC_ACQUIRE) > tag)
            return 0;
        if (!__atomic_exchange_n(&ep->lock, 1u, __ATOMIC_ACQUIRE)) {
            int rc = 0;
            if (__atomic_load_n(&ep->done, __ATOMIC_ACQUIRE) <= tag) {
                /* Begun after every free that read started < s. */
                uint64_t s = __atomic_add_fetch(&ep->started, 1, __ATOMIC_SEQ_CST);
                rc = rkomp_sync_device(dev);
                if (s > __atomic_load_n(&ep->done, __ATOMIC_RELAXED))
                    __atomic_store_n(&ep->done, s, __ATOMIC_RELEASE);
            }
            __atomic_store_n(&ep->lock, 0u, __ATOMIC_RELEASE);
            return rc;
        }
        if (!wait)
            return 1;
        /* Wait for the running sync; if it began before our tag, run one. */
        for (unsigned n = 0; __atomic_load_n(&ep->lock, __ATOMIC_RELAXED) &&
                             __atomic_load_n(&ep->done, __ATOMIC_ACQUIRE) <= tag;
             n++) {
            if (n < 128)
                cpu_relax();
            else
                sched_yield();
        }
    }
}

/* Under h's plock: move up to max releasable pending blocks (of mr only,
 * unless NULL) to out. For the blocks that stay: *mask_p gets their
 * devices' bits and maxtag[dev] their highest tag (when mask_p). */
static size_t pend_take(hz_slot_t *h, pend_t *out, size_t max,
                        const rankmem_resource_t *mr, uint64_t *mask_p, uint64_t *maxtag)
{
    size_t n = 0;
    unsigned i = 0, keep = 0;
    for (; i < h->npend; i++) {
        pend_t *p = &h->pend[i];
        if (n < max && (!mr || p->b.mr == mr) &&
            __atomic_load_n(&epochs[p->dev].done, __ATOMIC_ACQUIRE) > p->tag) {
            out[n++] = *p;
            h->pbytes -= p->b.base ? p->b.base_bytes : p->b.bytes;
            continue;
        }
        if (mask_p && (!mr || p->b.mr == mr)) {
            uint64_t bit = (uint64_t)1 << p->dev;
            if (!(*mask_p & bit) || maxtag[p->dev] < p->tag)
                maxtag[p->dev] = p->tag;
            *mask_p |= bit;
        }
        if (keep != i)
            h->pend[keep] = *p; /* oldest first: tags stay in order */
        keep++;
    }
    __atomic_store_n(&h->npend, keep, __ATOMIC_RELAXED);
    return n;
}

/* Blocks out of pending lists go back, then what each still owes. */
static void give_back_all(pend_t *out, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        rkomp_give_back(&out[k].b, 0);
        settle_after(&out[k].b, out[k].after);
    }
}

/* Give back h's releasable pending blocks (of mr only, unless NULL). */
static size_t drain(hz_slot_t *h, const rankmem_resource_t *mr)
{
    pend_t out[PEND_TAKE];
    size_t total = 0, n;
    do {
        spin_lock(&h->plock);
        n = pend_take(h, out, PEND_TAKE, mr, NULL, NULL);
        spin_unlock(&h->plock);
        give_back_all(out, n);
        total += n;
    } while (n == PEND_TAKE);
    return total;
}

/* Past the soft bound (or the thread's share of the bytes): give back what
 * may go, or sync. */
static __attribute__((noinline)) void pend_over(hz_slot_t *h)
{
    pend_t out[PEND_TAKE];
    uint64_t mask = 0, maxtag[RKOMP_MAX_DEVICES];
    size_t share = __atomic_load_n(&thread_bytes, __ATOMIC_RELAXED);
    spin_lock(&h->plock);
    size_t n = pend_take(h, out, PEND_TAKE, NULL, &mask, maxtag);
    /* Full (the next free needs room) or far over its bytes: must wait. */
    int must = h->npend >= PEND_HARD - 1 || h->pbytes / 4 > share;
    spin_unlock(&h->plock);
    give_back_all(out, n);
    if (n && !must)
        return;
    /* One sync per device concerned (or, while another thread's runs, keep
     * deferring until the hard bound). */
    int progress = 0;
    for (int d = 0; mask; d++, mask >>= 1)
        if ((mask & 1) && epoch_advance(d, maxtag[d], must) != 1)
            progress = 1;
    if (progress)
        drain(h, NULL);
}

static void flush_at_exit(void) { rkomp_map_flush(NULL, NULL); }

/* b, just out of the map (its release counted, as `after` says), waits in
 * the calling thread's list for a sync of device dev that begins after now.
 * 1 when the list went over its bounds (the caller then calls pend_over,
 * once its hazard is clear). */
static inline int pend_push(hz_slot_t *h, const rkomp_block_t *b, int dev, int after)
{
    static int registered;
    /* The first pending block of all: exit gives back what is still
     * pending. Registered now, after the CUDA runtime's own exit handler
     * (it made the memory), so it runs before that one. */
    if (RKOMP_UNLIKELY(!__atomic_load_n(&registered, __ATOMIC_RELAXED)) &&
        !__atomic_exchange_n(&registered, 1, __ATOMIC_RELAXED))
        atexit(flush_at_exit);
    spin_lock(&h->plock);
    pend_t *p = &h->pend[h->npend];
    /* seq_cst: ordered with the syncer's increment (a sync counted after
     * this load begins after this free). */
    p->tag = __atomic_load_n(&epochs[dev].started, __ATOMIC_SEQ_CST);
    p->b = *b;
    p->dev = dev;
    p->after = after;
    __atomic_store_n(&h->npend, h->npend + 1, __ATOMIC_RELAXED);
    h->pbytes += b->base ? b->base_bytes : b->bytes;
    int over = h->npend > PEND_SOFT || h->pbytes > __atomic_load_n(&thread_bytes, __ATOMIC_RELAXED);
    spin_unlock(&h->plock);
    return over;
}

/* A thread leaves: what it left pending goes back now. */
static void pend_thread_exit(hz_slot_t *h)
{
    if (!__atomic_load_n(&h->npend, __ATOMIC_RELAXED))
        return;
    uint64_t mask = 0, maxtag[RKOMP_MAX_DEVICES];
    pend_t out[PEND_TAKE];
    spin_lock(&h->plock);
    size_t n = pend_take(h, out, PEND_TAKE, NULL, &mask, maxtag);
    spin_unlock(&h->plock);
    give_back_all(out, n);
    for (int d = 0; mask; d++, mask >>= 1)
        if (mask & 1)
            epoch_advance(d, maxtag[d], 1);
    drain(h, NULL);
}

int rkomp_map_free(const void *ptr, int *ent_p)
{
    uint64_t h = mix(ptr);
    shard_t *s = shard_of(h);
    /* An empty shard cannot hold ptr: skip the lock (see lookup). */
    if (!__atomic_load_n(&s->count, __ATOMIC_RELAXED))
        return 0;
    hz_slot_t *hz = my_hz;
    if (RKOMP_UNLIKELY(!hz))
        hz = hz_register();
    int mode = get_defer_mode(), dev; /* the first call may start CUDA: not under the lock */
    spin_lock(&s->lock);
    size_t i = s->count ? probe(s, ptr, h) : 0;
    if (!s->count || !s->slots[i].ptr) {
        spin_unlock(&s->lock);
        return 0;
    }
    rkomp_block_t b = s->slots[i];
    remove_at(s, i);
    *ent_p = b.ent;
    /* The release is counted now, under this lock; the hazard keeps the
     * resource until the block went back, or is in the thread's pending
     * list where drop_ref finds it. Without a hazard slot (no memory), it is
     * counted after the give-back, under the lock again. */
    int after = AFTER_NONE, guard = 0, late = 0;
    if (b.ent >= 0) {
        if (RKOMP_UNLIKELY(!hz))
            late = 1;
        else if (count_release_locked(s, b.ent))
            after = AFTER_HARVESTED;
        else
            __atomic_store_n(&hz->mr, b.mr, __ATOMIC_RELEASE), guard = 1;
    } else if (b.ent == RKOMP_ENT_OWN) {
        after = AFTER_OWN_REF;
    }
    spin_unlock(&s->lock);
    if (RKOMP_UNLIKELY(mode) && hz && (dev = defer_dev(mode, &b)) >= 0) {
        int over = pend_push(hz, &b, dev, after);
        if (guard)
            __atomic_store_n(&hz->mr, NULL, __ATOMIC_RELEASE);
        if (RKOMP_UNLIKELY(over))
            pend_over(hz);
        return 1;
    }
    rkomp_give_back(&b, 1);
    if (RKOMP_LIKELY(guard))
        __atomic_store_n(&hz->mr, NULL, __ATOMIC_RELEASE);
    if (RKOMP_UNLIKELY(late)) {
        spin_lock(&s->lock);
        after = count_release_locked(s, b.ent) ? AFTER_HARVESTED : AFTER_NONE;
        spin_unlock(&s->lock);
    }
    settle_after(&b, after);
    return 1;
}

size_t rkomp_map_flush(const rankmem_resource_t *mr, int *err_p)
{
    uint64_t mask = 0, maxtag[RKOMP_MAX_DEVICES];
    /* Every pending block's device and latest tag (the slots are never
     * freed: the list may be walked without a lock)... */
    for (hz_slot_t *h = __atomic_load_n(&hz_head, __ATOMIC_ACQUIRE); h; h = h->next) {
        if (!__atomic_load_n(&h->npend, __ATOMIC_RELAXED))
            continue;
        spin_lock(&h->plock);
        for (unsigned k = 0; k < h->npend; k++) {
            pend_t *p = &h->pend[k];
            if (mr && p->b.mr != mr)
                continue;
            uint64_t bit = (uint64_t)1 << p->dev;
            if (!(mask & bit) || maxtag[p->dev] < p->tag)
                maxtag[p->dev] = p->tag;
            mask |= bit;
        }
        spin_unlock(&h->plock);
    }
    if (!mask)
        return 0;
    /* ... one sync of each such device (or one that began later)... */
    int err = 0;
    for (int d = 0; mask; d++, mask >>= 1)
        if ((mask & 1) && epoch_advance(d, maxtag[d], 1) < 0)
            err = 1;
    /* ... then all of them go back. */
    size_t n = 0;
    for (hz_slot_t *h = __atomic_load_n(&hz_head, __ATOMIC_ACQUIRE); h; h = h->next)
        if (__atomic_load_n(&h->npend, __ATOMIC_RELAXED))
            n += drain(h, mr);
    if (err_p)
        *err_p = err;
    return n;
}

/* At unload (dlclose) too: nothing pending may outlive the library. */
__attribute__((destructor)) static void flush_at_unload(void) { rkomp_map_flush(NULL, NULL); }

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
    if (RKOMP_UNLIKELY((s->count + 1) * 2 > (s->mask ? s->mask + 1 : 0)) && grow(s) != 0) {
        spin_unlock(&s->lock);
        return -1;
    }
    if (b->ent >= 0) {
        /* Counted in its entry unless that was retired (harvested) or
         * reused since the allocation picked it. */
        if (RKOMP_LIKELY(!(__atomic_load_n(&s->n[b->ent].rel, __ATOMIC_RELAXED) & HARVESTED) &&
                         __atomic_load_n(&ents[b->ent].gen, __ATOMIC_ACQUIRE) == gen)) {
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
    if (remove)
        remove_at(s, i);
    spin_unlock(&s->lock);
    return 1;
}

void rkomp_map_forget(const void *ptr)
{
    rkomp_block_t b;
    lookup(ptr, &b, 1);
}

int rkomp_map_get(const void *ptr, rkomp_block_t *b_p) { return lookup(ptr, b_p, 0); }
int rkomp_map_maybe(const void *ptr)
{
    return (__atomic_load_n(&regions.bits, __ATOMIC_ACQUIRE) & region_bit(ptr)) != 0;
}
