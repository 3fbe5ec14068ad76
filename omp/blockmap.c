/* Live blocks of ours: pointer -> block, and which resources they keep alive.
 *
 * The map. omp_free has no size and device memory has no room for a
 * header, so every block is recorded here, in the map of the thread that
 * allocated it: an open-addressing table of 32-byte records (linear
 * probing, backward-shift deletion, so no tombstones) under a lock biased
 * to that thread (src/bias.h). The thread's latest allocation waits beside
 * the table as the map's front block, looked at first: a block freed
 * before the next allocation never enters the table. A thread that frees
 * what it allocated, the usual case in OpenMP codes, finds the block in its own map and takes no lock-prefixed instruction and
 * touches no line another core writes; 256 shared shards, the previous
 * design, cost two locked operations and, under 16 threads, two cache-line
 * transfers per pair. A block freed by another thread is found by looking
 * through the other maps under their real locks (the first such visit
 * revokes the owner's bias, which the owner takes back after a while), past
 * maps that are empty or never held a block in the pointer's region.
 *
 * Resource entries. A block must keep the resource it came from alive until
 * it is freed (the application may replace the current resource, or destroy
 * the allocator, with blocks live). A reference per block would be a
 * read-modify-write of the resource's one shared counter at every omp_alloc
 * and omp_free. Instead the layer holds ONE reference per resource it serves
 * from (an entry), and each block records its entry: the maps are the
 * count, and nothing is counted per allocation or per free.
 *
 * An entry is ACTIVE while in service (the current resource of a device as
 * last seen here, or an allocator's own chain) and RETIRED once not (the
 * device's current resource changed, or omp_destroy_allocator). Retiring
 * harvests the maps with all of them locked at once (one membarrier for
 * all the biases): each of the entry's blocks is marked HARVESTED and
 * counted into the entry's `remaining`. The free of a marked block lowers
 * `remaining`; the one that takes it to zero (or the harvest itself, when
 * nothing was live) drops the layer's reference and frees the entry. An
 * insert checks, under its map's lock, that the entry is still ACTIVE for
 * the block's resource (it may have been retired, or freed and reused,
 * since the allocation picked it); otherwise the block takes a reference
 * of its own. A map made after a harvest began is not harvested, but its
 * inserts see the entry RETIRED (both orders are sequentially consistent:
 * the harvest stores the state, then reads the list of maps; a new map is
 * pushed on the list, then reads the state).
 *
 * A block given back at its free goes back under its map's lock: a
 * harvest, which takes every map's lock, either counted it (its free then
 * lowers `remaining` once it is back) or finds it gone, with
 * rankmem_deallocate over. A block that leaves its map for a pending list
 * (below) is no longer counted: its resource stays alive through the list
 * (drop_ref gives back that resource's pending blocks first, and pending
 * blocks go back under their list's lock), and on the way through a
 * hazard: a thread moving another thread's block to its own list names
 * the resource in its hazard field, and whoever drops an entry's
 * reference first waits until no hazard names that resource, then gives
 * back its pending blocks.
 *
 * Blocks that cannot use an entry (all RKOMP_NENT in use, or the races
 * above) hold a reference of their own; blocks of the shared managed and
 * pinned resources, which live as long as the process, hold nothing.
 *
 * Deferred release. With RANKMEM_OMP_FREE_SYNC on, device-accessible
 * memory may go back only after a device-wide wait that began after its
 * omp_free. Instead of a cudaDeviceSynchronize per free, the block leaves
 * the map (a second free of it is a foreign pointer's) and waits in the
 * freeing thread's pending list (under that thread's map lock), oldest
 * first, tagged with its device's sync epoch: `started` counts syncs begun,
 * `done` the highest one finished. A block tagged t (started read at its
 * free) may go back once done > t: that sync began after the free, and so
 * did it for every block before it in the list. A free that takes the list
 * over PEND_SOFT blocks or its share of RANKMEM_OMP_DEFER_BYTES gives back
 * the releasable head of the list or, with nothing releasable, runs one sync
 * (one thread per device at a time; the others keep deferring up to
 * PEND_CAP, then wait for it). Below PEND_SOFT, every 32nd push past
 * PEND_LOW gives back the head if another thread's sync released it. A
 * pending block still counts in its resource's stats until it went back.
 * The blocks go back
 * from the thread that freed them, so a pool's per-thread shards get them
 * where they left. A failed allocation, rankmem_omp_flush,
 * omp_destroy_allocator (its chain's blocks), a thread's exit and the
 * process's exit give back everything pending. */
#include "omp_internal.h"
#include "../src/bias.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#define INITIAL_CAPACITY 16u

/* A thread's pending blocks: past SOFT (or its byte share) a free gives
 * back what it can, or starts a sync; at CAP - 1 (or 4 shares) it waits for
 * one. One sync per SOFT frees at worst: a cudaDeviceSynchronize costs
 * about 1.5 us on an idle H100, 6 ns a free. TAKE: blocks given back per
 * round (a stack array). */
#define PEND_SOFT 256u
#define PEND_CAP 384u
#define PEND_TAKE 128u
#define PEND_LOW 64u

/* ---- waiting ---- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The thread waited for may have been preempted (more threads than cores):
 * after a short spin let it run rather than burn its time slice. */
static inline void backoff(unsigned n)
{
    if (n < 128)
        cpu_relax();
    else
        sched_yield();
}

/* ---- per-thread maps ---- */

/* A map's record of a block, 32 bytes, two to a cache line: what
 * rkomp_block_t says, packed. meta: */
#define M_ENT 0xffu                 /* the entry + 2: 0 own reference, 1 none, 2.. entries */
#define M_HARVESTED (1u << 8)       /* counted into its entry's `remaining` */
#define M_ALIGN_SHIFT 9             /* log2 of the alignment, 6 bits */
#define M_AIDX_SHIFT 15             /* the allocator's slot, 13 bits */
#define M_AGEN_SHIFT 28             /* and its generation, 6 bits */
#define M_BOFF_SHIFT 34             /* over-allocated: (ptr - base) / 256 + 1, else 0 */
#define M_BOFF_MAX ((uint64_t)1 << 30)
typedef struct slot {
    void *ptr; /* NULL: empty */
    size_t bytes;
    rankmem_resource_t *mr;
    uint64_t meta;
} slot_t;
_Static_assert(RKOMP_MAX_ALLOCATORS <= 1u << 13 && RKOMP_GEN_MASK == 63u && RKOMP_NENT + 2 <= 0xff,
               "a slot's meta has no room for these");
/* The device allocator's blocks of entry e, with the default alignment. */
#define M_DEV(e) ((uint64_t)((e) + 2) | (uint64_t)8u << M_ALIGN_SHIFT)

static inline int slot_ent(const slot_t *s) { return (int)(s->meta & M_ENT) - 2; }
static inline size_t slot_align(const slot_t *s)
{
    return (size_t)1 << ((s->meta >> M_ALIGN_SHIFT) & 63u);
}

/* 0, or -1 when b cannot be recorded (an offset past M_BOFF_MAX). */
static int slot_pack(const rkomp_block_t *b, slot_t *s)
{
    uintptr_t h = b->allocator & ~(uintptr_t)(RKOMP_SLOT_ALIGN - 1);
    uint64_t aidx = (h - (uintptr_t)rkomp_slots) / RKOMP_SLOT_ALIGN;
    uint64_t agen = (b->allocator >> 1) & RKOMP_GEN_MASK;
    uint64_t boff = 0;
    if (b->base) {
        boff = ((uintptr_t)b->ptr - (uintptr_t)b->base) / RANKMEM_DEFAULT_ALIGNMENT + 1;
        if (boff >= M_BOFF_MAX)
            return -1;
    }
    *s = (slot_t){b->ptr, b->bytes, b->mr,
                  (uint64_t)(b->ent + 2) | (uint64_t)__builtin_ctzll(b->alignment) << M_ALIGN_SHIFT |
                      aidx << M_AIDX_SHIFT | agen << M_AGEN_SHIFT | boff << M_BOFF_SHIFT};
    return 0;
}

static void slot_unpack(const slot_t *s, rkomp_block_t *b)
{
    uint64_t aidx = (s->meta >> M_AIDX_SHIFT) & (RKOMP_MAX_ALLOCATORS - 1);
    uint64_t agen = (s->meta >> M_AGEN_SHIFT) & RKOMP_GEN_MASK;
    uint64_t boff = s->meta >> M_BOFF_SHIFT;
    size_t al = slot_align(s);
    *b = (rkomp_block_t){s->ptr, s->mr, s->bytes, al,
                         (uintptr_t)&rkomp_slots[aidx] | (uintptr_t)agen << 1 | 1u, NULL, 0,
                         slot_ent(s)};
    if (boff) {
        b->base = (char *)s->ptr - (boff - 1) * RANKMEM_DEFAULT_ALIGNMENT;
        b->base_bytes = s->bytes + al - RANKMEM_DEFAULT_ALIGNMENT;
    }
}

/* What goes back to s's resource (rkomp_returned). */
static inline rankmem_block_t slot_returned(const slot_t *s)
{
    uint64_t boff = s->meta >> M_BOFF_SHIFT;
    size_t al = slot_align(s);
    if (RKOMP_UNLIKELY(boff))
        return (rankmem_block_t){(char *)s->ptr - (boff - 1) * RANKMEM_DEFAULT_ALIGNMENT,
                                 s->bytes + al - RANKMEM_DEFAULT_ALIGNMENT,
                                 RANKMEM_DEFAULT_ALIGNMENT};
    return (rankmem_block_t){s->ptr, s->bytes, al};
}

/* A pending block is what goes back (pblk: the block, or the base it was
 * cut from) and what for (pinf), kept side by side so that a run of one
 * resource's blocks goes back in one call straight from the list: 40
 * bytes a block, and no copy. */
typedef struct pinfo {
    rankmem_resource_t *mr;
    uint64_t x; /* tag << PX_TAG | device << 8 | (entry + 2) << 2 | after */
} pinfo_t;
#define PX_TAG 14 /* a tag (its device's `started` at the free) has 50 bits */
_Static_assert(RKOMP_MAX_DEVICES <= 64 && RKOMP_NENT + 2 <= 64, "a pending record's x");
static inline uint64_t px_tag(uint64_t x) { return x >> PX_TAG; }
static inline int px_dev(uint64_t x) { return (int)(x >> 8) & 63; }
static inline int px_ent(uint64_t x) { return (int)((x >> 2) & 63u) - 2; }
static inline int px_after(uint64_t x) { return (int)(x & 3u); }
/* What a block's give-back still owes: nothing, its entry's `remaining`
 * (the entry was harvested with the block live), or the block's own
 * reference. */
enum { AFTER_NONE = 0, AFTER_HARVESTED, AFTER_OWN_REF };

typedef struct tmap {
    rk_block_t lock; /* biased to the thread that claimed the map; guards all below */
    unsigned count;  /* live blocks, front included; written under the lock, atomically
                      * (read without it) */
    size_t mask;     /* capacity - 1; 0 while slots is NULL */
    unsigned shift;  /* 32 - log2(capacity): a hash's top bits are its home slot */
    unsigned limit;  /* capacity / 2: an insert grows the table at this count */
    slot_t front;    /* the latest insert, unless freed or moved to slots (ptr NULL) */
    slot_t *slots;
    unsigned idx;               /* its filter: filt[idx] */
    rankmem_resource_t *hz;     /* atomic: the resource of a block this thread moves, or NULL */
    unsigned used;              /* atomic: claimed by a live thread */
    struct tmap *next;          /* fixed once published */
    /* The thread's pending blocks, oldest first: [pfirst .. plast). */
    unsigned pfirst, plast;
    unsigned npend; /* plast - pfirst, stored atomically (read without the lock) */
    uint64_t pmask; /* devices with blocks pushed since the list was last empty */
    uint64_t ptag[RKOMP_MAX_DEVICES]; /* and each one's newest tag (tags only grow) */
    size_t pbytes;
    rankmem_block_t pblk[PEND_CAP];
    pinfo_t pinf[PEND_CAP];
} __attribute__((aligned(64))) tmap_t;

static tmap_t *maps; /* atomic; a list that only grows (maps are reused, never freed) */

/* What a free of another thread's block (or of a pointer not ours) looks
 * through, without touching the maps themselves: per map, the hashed 1 GiB
 * regions and 2 MiB grains of every block ever inserted there (sticky,
 * written by the owner when a bit is new), side by side so that a scan of
 * 16 maps reads 4 lines; on the CPU-only machine, where our blocks and the
 * runtime's share the heap's regions, the grains tell a pool's chunks from
 * the runtime's arenas. */
#define MAX_MAPS 4096u
static struct {
    uint64_t regions, grains; /* atomic */
} filt[MAX_MAPS];
static tmap_t *map_at[MAX_MAPS]; /* atomic; set before the map's first block */
static unsigned nfilt;           /* atomic: filter slots handed out */
static pthread_key_t map_key;
static pthread_once_t map_once = PTHREAD_ONCE_INIT;
static int map_key_ok;
static __thread tmap_t *my_map __attribute__((tls_model("initial-exec")));

static void pend_thread_exit(tmap_t *m);

static void map_thread_exit(void *p)
{
    tmap_t *m = p;
    pend_thread_exit(m);
    my_map = NULL;
    /* Nobody owns it until a new thread claims it: no bias to revoke. */
    rk_block_take(&m->lock);
    rk_block_rebind(&m->lock, 0);
    rk_block_unlock(&m->lock, 0);
    __atomic_store_n(&m->hz, NULL, __ATOMIC_RELEASE);
    __atomic_store_n(&m->used, 0u, __ATOMIC_RELEASE);
}

/* What the registry tells (on_resource), so that rkomp_dev_alloc need not
 * call into librankmem: device 0's resource when at most one device is
 * visible (device 0 is then the current one), else NULL (borrowed, as
 * from rankmem_get_device_resource; NULL also until told: ask the
 * registry). */
static int dev_mr_on; /* the listener is added */
static unsigned dev_changed; /* atomic: see retire_replaced */
static rankmem_resource_t *dev0_fast; /* atomic */
static int one_device;

static void on_resource(int device, rankmem_resource_t *mr, void *arg)
{
    (void)arg;
    /* Maybe a replacement (a first resource too: then the check finds
     * nothing to retire). */
    __atomic_store_n(&dev_changed, 1u, __ATOMIC_RELEASE);
    if (device == 0 && one_device)
        __atomic_store_n(&dev0_fast, mr, __ATOMIC_RELEASE);
}

static void map_setup(void)
{
    map_key_ok = pthread_key_create(&map_key, map_thread_exit) == 0;
    one_device = rkomp_gpu_count() <= 1;
    /* Without it (never, but for a full table) every allocation asks. */
    dev_mr_on = rankmem_add_resource_listener(on_resource, NULL) == RANKMEM_SUCCESS;
}

/* The calling thread's map (a released one, with whatever blocks its last
 * thread left in it, or a new one), or NULL when none can be had. */
static __attribute__((noinline)) tmap_t *map_register(void)
{
    pthread_once(&map_once, map_setup);
    if (!map_key_ok)
        return NULL;
    tmap_t *m;
    for (m = __atomic_load_n(&maps, __ATOMIC_ACQUIRE); m; m = m->next) {
        unsigned z = 0;
        if (__atomic_compare_exchange_n(&m->used, &z, 1u, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
    }
    if (!m) {
        unsigned idx = __atomic_fetch_add(&nfilt, 1u, __ATOMIC_RELAXED);
        if (idx >= MAX_MAPS || !(m = aligned_alloc(_Alignof(tmap_t), sizeof *m)))
            return NULL; /* (a slot lost to a failed allocation is only never used) */
        memset(m, 0, sizeof *m);
        rk_block_init(&m->lock, 0);
        m->used = 1;
        m->idx = idx;
        __atomic_store_n(&map_at[idx], m, __ATOMIC_RELEASE);
        m->next = __atomic_load_n(&maps, __ATOMIC_RELAXED);
        /* seq_cst: ordered with a harvest's read of the list (see above). */
        while (!__atomic_compare_exchange_n(&maps, &m->next, m, 1, __ATOMIC_SEQ_CST,
                                            __ATOMIC_RELAXED)) {
        }
    }
    if (pthread_setspecific(map_key, m) != 0) {
        __atomic_store_n(&m->used, 0u, __ATOMIC_RELEASE);
        return NULL;
    }
    rk_block_take(&m->lock);
    rk_block_rebind(&m->lock, 1);
    rk_block_unlock(&m->lock, 0);
    my_map = m;
    return m;
}

static inline int map_lock(tmap_t *m) { return rk_block_lock(&m->lock); }
/* The calling thread's own map (my_map): biased, if at all, to the caller. */
static inline int own_lock(tmap_t *me) { return rk_block_lock_mine(&me->lock); }
static inline void map_unlock(tmap_t *m, int md) { rk_block_unlock(&m->lock, md); }

/* Every map locked at once, with one membarrier for all their biases
 * (under ent_lock, the only place that holds more than one map lock).
 * Returns the list's head for unlock_all. */
static tmap_t *lock_all(void)
{
    tmap_t *head = __atomic_load_n(&maps, __ATOMIC_SEQ_CST);
    int any = 0;
    for (tmap_t *m = head; m; m = m->next) {
        rk_block_take(&m->lock);
        any |= rk_block_unbias(&m->lock);
    }
    if (any)
        rk_membarrier();
    for (tmap_t *m = head; m; m = m->next)
        rk_block_wait_out(&m->lock);
    return head;
}

static void unlock_all(tmap_t *head)
{
    for (tmap_t *m = head; m; m = m->next)
        rk_block_unlock(&m->lock, 0);
}

/* The global filter (omp_internal.h): the union of the maps' filters,
 * written once per region or grain, so its lines stay shared in every
 * core's cache and a pointer of the runtime's (host heap, while ours are
 * usually device memory; or, without a GPU, the runtime's arenas beside our
 * pools' chunks) is told apart with two loads. */
rkomp_filter_t rkomp_filter;
__thread uintptr_t rkomp_last_grain __attribute__((tls_model("initial-exec")));
#define region_bit rkomp_region_bit

/* Fibonacci hashing: the multiply carries every bit of the pointer into the
 * high half, whose top bits pick the home slot (our pointers share their
 * low, alignment bits). Four instructions: this is on every alloc and free. */
static inline unsigned hash_of(const void *p)
{
    return (unsigned)(((uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull) >> 32);
}

static inline size_t home_of(const tmap_t *m, unsigned h) { return (size_t)(h >> m->shift); }

/* Under the lock: slot holding ptr, or the empty slot where it would go. */
static inline size_t probe(const tmap_t *m, const void *ptr, unsigned h)
{
    size_t i = home_of(m, h);
    while (m->slots[i].ptr && m->slots[i].ptr != ptr)
        i = (i + 1) & m->mask;
    return i;
}

static int grow(tmap_t *m)
{
    size_t cap = m->mask ? (m->mask + 1) * 2 : INITIAL_CAPACITY;
    /* Aligned: a slot never straddles two lines. */
    slot_t *n = cap <= SIZE_MAX / sizeof *n ? aligned_alloc(64, cap * sizeof *n) : NULL;
    if (!n)
        return -1;
    memset(n, 0, cap * sizeof *n);
    slot_t *old = m->slots;
    size_t old_cap = m->mask ? m->mask + 1 : 0;
    m->slots = n;
    m->mask = cap - 1;
    m->shift = 32u - (unsigned)__builtin_ctzll((unsigned long long)cap);
    m->limit = (unsigned)(cap / 2);
    for (size_t i = 0; i < old_cap; i++)
        if (old[i].ptr)
            m->slots[probe(m, old[i].ptr, hash_of(old[i].ptr))] = old[i];
    free(old);
    return 0;
}

/* Under the lock: take slot i out. Backward shift: move later members of
 * the run into the hole when the hole lies between their home slot and
 * where they sit (no tombstones). */
static inline void remove_at(tmap_t *m, size_t i)
{
    size_t hole = i, j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (!m->slots[j].ptr)
            break;
        size_t home = home_of(m, hash_of(m->slots[j].ptr));
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].ptr = NULL;
    __atomic_store_n(&m->count, m->count - 1, __ATOMIC_RELAXED);
}

/* Under m's lock: where ptr is recorded in m (its slot, or AT_FRONT), or
 * NOT_IN when it is not. */
#define AT_FRONT ((size_t)-1)
#define NOT_IN ((size_t)-2)
static inline size_t where_in(const tmap_t *m, const void *ptr)
{
    if (m->front.ptr == ptr)
        return AT_FRONT;
    size_t i;
    if (m->mask && m->slots[i = probe(m, ptr, hash_of(ptr))].ptr)
        return i;
    return NOT_IN;
}

static inline slot_t *slot_at(tmap_t *m, size_t i)
{
    return i == AT_FRONT ? &m->front : &m->slots[i];
}

/* Under m's lock: the block at i leaves m. */
static inline void take_out(tmap_t *m, size_t i)
{
    if (RKOMP_LIKELY(i == AT_FRONT)) {
        m->front.ptr = NULL;
        __atomic_store_n(&m->count, m->count - 1, __ATOMIC_RELAXED);
    } else {
        remove_at(m, i);
    }
}

/* The map holding ptr, locked (*md_p, where: *i_p), or NULL. The caller's
 * own map first; then the others that may hold it: a block was once
 * inserted there in ptr's region and grain, and it is not empty. The hints
 * are safe without the lock: if ptr is live in a map, its insertion
 * happened before this call (the program got ptr from it) and only freeing
 * ptr could undo it. */
static __attribute__((noinline)) tmap_t *find_other(tmap_t *me, const void *ptr, int *md_p,
                                                    size_t *i_p)
{
    uint64_t rb = region_bit(ptr), gb;
    rkomp_grain_word(ptr, &gb); /* a map's grains use the global filter's bit */
    unsigned n = __atomic_load_n(&nfilt, __ATOMIC_ACQUIRE);
    if (n > MAX_MAPS)
        n = MAX_MAPS;
    for (unsigned k = 0; k < n; k++) {
        if (!(__atomic_load_n(&filt[k].regions, __ATOMIC_RELAXED) & rb) ||
            !(__atomic_load_n(&filt[k].grains, __ATOMIC_RELAXED) & gb))
            continue;
        tmap_t *m = __atomic_load_n(&map_at[k], __ATOMIC_ACQUIRE);
        if (!m || m == me || !__atomic_load_n(&m->count, __ATOMIC_RELAXED))
            continue;
        int md = map_lock(m);
        size_t i = where_in(m, ptr);
        if (i != NOT_IN) {
            *md_p = md;
            *i_p = i;
            return m;
        }
        map_unlock(m, md);
    }
    return NULL;
}

static inline tmap_t *find_locked(tmap_t *me, const void *ptr, int *md_p, size_t *i_p)
{
    if (RKOMP_LIKELY(me != NULL) && __atomic_load_n(&me->count, __ATOMIC_RELAXED)) {
        int md = own_lock(me);
        size_t i = where_in(me, ptr);
        if (RKOMP_LIKELY(i != NOT_IN)) {
            *md_p = md;
            *i_p = i;
            return me;
        }
        map_unlock(me, md);
    }
    return find_other(me, ptr, md_p, i_p);
}

/* ---- hazards ---- */

/* Wait until no thread but the caller is moving a block of mr from another
 * thread's map to its own pending list. */
static void hz_wait(const rankmem_resource_t *mr, const tmap_t *me)
{
    for (tmap_t *m = __atomic_load_n(&maps, __ATOMIC_ACQUIRE); m; m = m->next) {
        if (m == me)
            continue;
        for (unsigned n = 0; __atomic_load_n(&m->hz, __ATOMIC_ACQUIRE) == mr; n++)
            backoff(n);
    }
}

/* Drop one of the layer's references on mr: every block of mr that was
 * counted by its entry (or, when nothing was, that left its map before the
 * harvest) is back, on a pending list, or on its way to one under a
 * hazard naming mr. Wait for those, give back mr's pending blocks, then
 * release. Never called with a lock held. */
static void drop_ref(rankmem_resource_t *mr)
{
    hz_wait(mr, my_map);
    rkomp_map_flush(mr, NULL);
    rankmem_resource_release(mr);
}

/* ---- resource entries ---- */

enum { ENT_FREE = RKOMP_ENT_FREE, ENT_ACTIVE = RKOMP_ENT_ACTIVE, ENT_RETIRED = RKOMP_ENT_RETIRED };
typedef rkomp_entry_t entry_t;
#define ents rkomp_ents
#define dev_ent rkomp_dev_ent

entry_t ents[RKOMP_NENT];
int dev_ent[RKOMP_MAX_DEVICES];
static pthread_mutex_t ent_lock = PTHREAD_MUTEX_INITIALIZER; /* creation, retirement */

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

/* Under its map's lock: 1 when sl is a live block of entry e, now marked. */
static inline long harvest_slot(slot_t *sl, int e)
{
    if (!sl->ptr || (sl->meta & (M_ENT | M_HARVESTED)) != (uint64_t)(e + 2))
        return 0;
    sl->meta |= M_HARVESTED;
    return 1;
}

/* Under ent_lock. Returns the reference to drop when nothing was live. */
static rankmem_resource_t *ent_retire_locked(int e)
{
    entry_t *en = &ents[e];
    if (__atomic_load_n(&en->state, __ATOMIC_RELAXED) != ENT_ACTIVE)
        return NULL;
    __atomic_store_n(&en->state, ENT_RETIRED, __ATOMIC_SEQ_CST);
    long sum = 0;
    tmap_t *head = lock_all();
    /* Rare (a resource replaced, an allocator destroyed): a walk of every
     * live block is the price of counting nothing per allocation. */
    for (tmap_t *m = head; m; m = m->next) {
        if (!m->count)
            continue;
        sum += harvest_slot(&m->front, e);
        for (size_t i = 0; m->mask && i <= m->mask; i++)
            sum += harvest_slot(&m->slots[i], e);
    }
    /* Before the maps are unlocked: no marked block can be freed until then. */
    __atomic_store_n(&en->remaining, sum, __ATOMIC_RELEASE);
    unlock_all(head);
    return sum ? NULL : ent_free_locked(e);
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
    /* An allocation that picked this entry in its previous life compares
     * its resource with mr at insert, under its map's lock. */
    __atomic_store_n(&en->mr, mr, __ATOMIC_RELAXED);
    __atomic_store_n(&en->device, device, __ATOMIC_RELAXED);
    __atomic_store_n(&en->state, ENT_ACTIVE, __ATOMIC_SEQ_CST);
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

int rkomp_device_ent_slow(int device, rankmem_resource_t *mr)
{
    if (device < 0 || device >= RKOMP_MAX_DEVICES)
        return RKOMP_ENT_OWN;
    /* First allocation on this device, or its current resource changed:
     * retire the old entry (its blocks keep it until freed), make one. */
    rankmem_resource_t *drop = NULL;
    int e;
    pthread_mutex_lock(&ent_lock);
    e = __atomic_load_n(&dev_ent[device], __ATOMIC_RELAXED) - 1;
    if (!rkomp_ent_pin(e, mr)) {
        if (e >= 0)
            drop = ent_retire_locked(e);
        e = ent_create_locked(mr, device);
        __atomic_store_n(&dev_ent[device], e + 1, __ATOMIC_RELEASE);
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

static void rel_harvested(int e)
{
    if (__atomic_sub_fetch(&ents[e].remaining, 1, __ATOMIC_ACQ_REL) == 0)
        ent_drop(e);
}

/* What a block's give-back still owes its entry ent or resource mr (AFTER_*). */
static inline void settle_after(int ent, rankmem_resource_t *mr, int after)
{
    if (after == AFTER_HARVESTED)
        rel_harvested(ent);
    else if (after == AFTER_OWN_REF)
        rankmem_resource_release(mr);
}

/* ---- deferral: per-device sync epochs, pending lists ---- */

static struct epoch {
    uint64_t started; /* atomic: syncs begun */
    char pad[56];
    uint64_t done;    /* atomic: the latest finished (written by the lock holder only) */
    unsigned lock;    /* atomic: a sync of this device is running */
} __attribute__((aligned(64))) epochs[RKOMP_MAX_DEVICES];

static int defer_mode = -1; /* atomic: -1 unknown, 0 off, 1 device-accessible blocks, 2 test */
/* Set with defer_mode: a free's give-back owes no wait and enters no
 * device (at most one visible device, and no GPU or no RANKMEM_OMP_FREE_SYNC). */
static int plain_give_back;
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
    int ngpu = rkomp_gpu_count();
    __atomic_store_n(&plain_give_back, ngpu <= 1 && (!ngpu || !rkomp_free_sync()),
                     __ATOMIC_RELAXED);
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
static inline int defer_dev(int mode, const rankmem_resource_t *mr)
{
    if (mode == 2)
        return 0;
    int d = mr->device;
    return (mr->props & RANKMEM_PROP_DEVICE_ACCESSIBLE) && d >= 0 && d < RKOMP_MAX_DEVICES
               ? d
               : -1;
}

/* Whether m's pending record i may go back: a sync of its device that
 * began after its free is over. */
static inline int ready(const tmap_t *m, unsigned i)
{
    uint64_t x = m->pinf[i].x;
    return __atomic_load_n(&epochs[px_dev(x)].done, __ATOMIC_ACQUIRE) > px_tag(x);
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
        /* Look before the exchange: threads over their bound try at every
         * free while a sync runs, and must not bounce the line. */
        if (!wait && __atomic_load_n(&ep->lock, __ATOMIC_RELAXED))
            return 1;
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
             n++)
            backoff(n);
    }
}

/* epoch_advance for each device in mask, up to maxtag[d]: -1 when a sync
 * failed, 1 when nothing moved (!wait and every device's sync was another
 * thread's, still running), else 0. */
static int advance_all(uint64_t mask, const uint64_t *maxtag, int wait)
{
    int rc = 1;
    for (int d = 0; mask; d++, mask >>= 1) {
        if (!(mask & 1))
            continue;
        int r = epoch_advance(d, maxtag[d], wait);
        if (r < 0)
            rc = -1;
        else if (r == 0 && rc == 1)
            rc = 0;
    }
    return rc;
}

/* The block pending record i gives back: what rankmem handed out. */
static inline void pend_block(const tmap_t *m, unsigned i, rkomp_block_t *b)
{
    const rankmem_block_t *r = &m->pblk[i];
    *b = (rkomp_block_t){r->ptr,   m->pinf[i].mr, r->bytes, r->alignment, 0, NULL, 0,
                         px_ent(m->pinf[i].x)};
}

static inline void pend_count(tmap_t *m)
{
    if (m->pfirst == m->plast) {
        m->pfirst = m->plast = 0;
        m->pmask = 0;
    }
    __atomic_store_n(&m->npend, m->plast - m->pfirst, __ATOMIC_RELAXED);
}

/* What blocks given back under a list's lock still owe, settled once it is
 * unlocked (a settlement may drop a resource, which flushes the lists). */
#define OWED_MAX 32u
typedef struct owed {
    unsigned n;
    struct {
        rankmem_resource_t *mr;
        int ent, after;
    } b[OWED_MAX];
} owed_t;

static void settle_owed(const owed_t *ow)
{
    for (unsigned k = 0; k < ow->n; k++)
        settle_after(ow->b[k].ent, ow->b[k].mr, ow->b[k].after);
}

/* Under m's lock: record i leaves the list (its block is back). */
static inline void pend_gone(tmap_t *m, unsigned i, owed_t *ow)
{
    uint64_t x = m->pinf[i].x;
    m->pbytes -= m->pblk[i].bytes;
    if (RKOMP_UNLIKELY(px_after(x)))
        ow->b[ow->n++] = (__typeof__(ow->b[0])){m->pinf[i].mr, px_ent(x), px_after(x)};
}

/* n blocks of mr back in one call (a pool takes its lock once for them). */
static void give_back_run(rankmem_resource_t *mr, const rankmem_block_t *blk, size_t n)
{
    rankmem_status_t st[RK_BATCH];
    for (size_t k = 0; k < n; k += RK_BATCH) {
        size_t c = n - k < RK_BATCH ? n - k : RK_BATCH;
        if (RKOMP_LIKELY(rk_deallocate_many(mr, blk + k, c, NULL, st) == RANKMEM_SUCCESS))
            continue;
        size_t failed = 0;
        rankmem_status_t first = RANKMEM_SUCCESS;
        for (size_t i = 0; i < c; i++)
            if (st[i] != RANKMEM_SUCCESS && !failed++)
                first = st[i];
        rkomp_give_back_many_failed(mr, c, failed, first);
    }
}

/* Under m's lock: how many records at the head of the list may go back,
 * at most max, and no more than ow has room for of those that owe. */
static unsigned ready_head(const tmap_t *m, unsigned max, const owed_t *ow)
{
    unsigned n = 0, room = OWED_MAX - ow->n;
    for (unsigned i = m->pfirst; i < m->plast && n < max && ready(m, i); i++, n++)
        if (px_after(m->pinf[i].x) && !room--)
            break;
    return n;
}

/* Under m's lock: the n records at the head of the list go back, runs of
 * one resource's blocks in one call each, straight from the list. */
static void give_back_head(tmap_t *m, unsigned n, owed_t *ow)
{
    unsigned i = m->pfirst, end = i + n;
    while (i < end) {
        rankmem_resource_t *mr = m->pinf[i].mr;
        unsigned j = i + 1;
        if (RKOMP_UNLIKELY(rkomp_gpu_count() > 1)) {
            rkomp_block_t b;
            pend_block(m, i, &b);
            rkomp_give_back(&b, 0); /* made current: its device */
        } else {
            while (j < end && m->pinf[j].mr == mr)
                j++;
            give_back_run(mr, &m->pblk[i], j - i);
        }
        for (; i < j; i++)
            pend_gone(m, i, ow);
    }
    m->pfirst = end;
    pend_count(m);
}

/* Under m's lock: give back its releasable records of mr, wherever they
 * are in the list (drop_ref's flush: rare), compacting what stays. */
static unsigned give_back_of(tmap_t *m, const rankmem_resource_t *mr, owed_t *ow)
{
    unsigned keep = m->pfirst, n = 0;
    for (unsigned i = m->pfirst; i < m->plast; i++) {
        if (m->pinf[i].mr == mr && ready(m, i) &&
            (!px_after(m->pinf[i].x) || ow->n < OWED_MAX)) {
            rkomp_block_t b;
            pend_block(m, i, &b);
            rkomp_give_back(&b, 0);
            pend_gone(m, i, ow);
            n++;
            continue;
        }
        if (keep != i) { /* oldest first: tags stay in order */
            m->pblk[keep] = m->pblk[i];
            m->pinf[keep] = m->pinf[i];
        }
        keep++;
    }
    m->plast = keep;
    pend_count(m);
    return n;
}

/* Under m's lock: the devices of its pending blocks (of mr only, unless
 * NULL) into *mask_p, and each one's newest tag into maxtag. */
static void pend_devices(const tmap_t *m, const rankmem_resource_t *mr, uint64_t *mask_p,
                         uint64_t *maxtag)
{
    if (!mr) {
        /* Kept up by pend_push: no walk. A device whose blocks all went
         * back may still be named (one sync too many, never one too few). */
        for (uint64_t mk = m->pmask; mk; mk &= mk - 1) {
            int d = __builtin_ctzll(mk);
            if (!(*mask_p >> d & 1) || maxtag[d] < m->ptag[d])
                maxtag[d] = m->ptag[d];
        }
        *mask_p |= m->pmask;
        return;
    }
    for (unsigned i = m->pfirst; i < m->plast; i++) {
        if (m->pinf[i].mr != mr)
            continue;
        uint64_t x = m->pinf[i].x, bit = (uint64_t)1 << px_dev(x);
        if (!(*mask_p & bit) || maxtag[px_dev(x)] < px_tag(x))
            maxtag[px_dev(x)] = px_tag(x);
        *mask_p |= bit;
    }
}

/* pend_devices under m's lock, skipped (no lock) when m holds nothing. */
static void pend_collect(tmap_t *m, const rankmem_resource_t *mr, uint64_t *mask_p,
                         uint64_t *maxtag)
{
    if (!__atomic_load_n(&m->npend, __ATOMIC_RELAXED))
        return;
    int md = map_lock(m);
    pend_devices(m, mr, mask_p, maxtag);
    map_unlock(m, md);
}

/* Give back m's releasable pending blocks (of mr only, unless NULL), from
 * any thread, under m's lock: a drop_ref's flush that takes the lock next
 * finds them back. */
static size_t drain(tmap_t *m, const rankmem_resource_t *mr)
{
    size_t total = 0;
    owed_t ow;
    do {
        ow.n = 0;
        int md = map_lock(m);
        if (mr) {
            total += give_back_of(m, mr, &ow);
        } else {
            /* Everything follows a sync of every device pending: from the
             * head, without compacting what stays. */
            unsigned n = ready_head(m, PEND_CAP, &ow);
            give_back_head(m, n, &ow);
            total += n;
        }
        map_unlock(m, md);
        settle_owed(&ow);
    } while (ow.n == OWED_MAX); /* stopped for room: more may be ready */
    return total;
}

/* Past the soft bound (or the thread's byte share), or past PEND_LOW with
 * a releasable head, m being the caller's own map: give back the
 * releasable head of the list; over the bound with nothing releasable,
 * sync (while another thread's sync of the device runs, keep deferring up
 * to the hard bound, then wait for it). */
static __attribute__((noinline)) void pend_over(tmap_t *m)
{
    owed_t ow = {0};
    uint64_t mask = 0, maxtag[RKOMP_MAX_DEVICES];
    size_t share = __atomic_load_n(&thread_bytes, __ATOMIC_RELAXED);
    int md = own_lock(m);
    unsigned n = ready_head(m, PEND_TAKE, &ow);
    give_back_head(m, n, &ow);
    int left = m->pfirst < m->plast;
    int must = left && (m->plast - m->pfirst >= PEND_CAP - 1 || m->pbytes / 4 > share);
    /* Nothing to do but wait for a sync already running: done in O(1). */
    int busy = left && !must &&
               __atomic_load_n(&epochs[px_dev(m->pinf[m->pfirst].x)].lock, __ATOMIC_RELAXED);
    if (left && !busy && (!n || must))
        pend_devices(m, NULL, &mask, maxtag);
    map_unlock(m, md);
    settle_owed(&ow);
    if (!mask)
        return;
    if (advance_all(mask, maxtag, must) != 1)
        drain(m, NULL);
}

static void flush_at_exit(void) { rkomp_map_flush(NULL, NULL); }

/* Under m's lock (m the caller's map): b, just out of a map (what its
 * give-back owes as `after` says), waits for a sync of device dev that
 * begins after now. 1 when the list went over its bounds (the caller then
 * calls pend_over, once unlocked). */
static inline __attribute__((always_inline)) int pend_push(tmap_t *m, const slot_t *b, int dev,
                                                           int after)
{
    static int registered;
    /* The first pending block of all: exit gives back what is still
     * pending. Registered now, after the CUDA runtime's own exit handler
     * (it made the memory), so it runs before that one. */
    if (RKOMP_UNLIKELY(!__atomic_load_n(&registered, __ATOMIC_RELAXED)) &&
        !__atomic_exchange_n(&registered, 1, __ATOMIC_RELAXED))
        atexit(flush_at_exit);
    if (RKOMP_UNLIKELY(m->plast == PEND_CAP)) { /* room at the front: slide down */
        unsigned len = m->plast - m->pfirst;
        memmove(m->pblk, m->pblk + m->pfirst, len * sizeof *m->pblk);
        memmove(m->pinf, m->pinf + m->pfirst, len * sizeof *m->pinf);
        m->plast = len;
        m->pfirst = 0;
    }
    unsigned i = m->plast++;
    /* seq_cst: ordered with the syncer's increment (a sync counted after
     * this load begins after this free). */
    uint64_t tag = __atomic_load_n(&epochs[dev].started, __ATOMIC_SEQ_CST);
    m->pblk[i] = slot_returned(b);
    m->pinf[i] = (pinfo_t){b->mr, tag << PX_TAG | (uint64_t)dev << 8 |
                                      (uint64_t)(b->meta & M_ENT) << 2 | (uint64_t)after};
    m->pmask |= (uint64_t)1 << dev;
    m->ptag[dev] = tag;
    pend_count(m);
    m->pbytes += m->pblk[i].bytes;
    unsigned len = m->plast - m->pfirst;
    if (len > PEND_SOFT || m->pbytes > __atomic_load_n(&thread_bytes, __ATOMIC_RELAXED))
        return 1;
    /* Below the bound, every 32nd push gives back what other threads' syncs
     * made releasable: blocks held back stay live in their pool, whose maps
     * then outgrow the cache (16 threads). Never a sync from here. */
    return len >= PEND_LOW && !(m->plast & 31u) && ready(m, m->pfirst);
}

/* A thread leaves: what it left pending goes back now. */
static void pend_thread_exit(tmap_t *m)
{
    uint64_t mask = 0, maxtag[RKOMP_MAX_DEVICES];
    pend_collect(m, NULL, &mask, maxtag);
    if (mask) {
        advance_all(mask, maxtag, 1);
        drain(m, NULL);
    }
}

/* s's give-back at its free (rkomp_give_back(b, 1)), its common case
 * inline: one visible device (or none), no wait owed, no over-allocation. */
static inline __attribute__((always_inline)) void slot_give_back(const slot_t *s)
{
    rkomp_block_t b;
    /* After get_defer_mode: plain_give_back is set. */
    if (RKOMP_LIKELY(__atomic_load_n(&plain_give_back, __ATOMIC_RELAXED) &&
                     !(s->meta >> M_BOFF_SHIFT))) {
        rankmem_status_t st = rk_deallocate_checked(s->mr, s->ptr, s->bytes, slot_align(s), NULL);
        if (RKOMP_LIKELY(st == RANKMEM_SUCCESS))
            return;
        slot_unpack(s, &b);
        rkomp_give_back_failed(&b, st);
        return;
    }
    slot_unpack(s, &b);
    rkomp_give_back(&b, 1);
}

/* A device's resource was replaced (on_resource): it goes once its last
 * block does, so the next free retires its entry (allocations notice a
 * replacement themselves). */
static __attribute__((noinline)) void retire_replaced(void)
{
    if (!__atomic_exchange_n(&dev_changed, 0u, __ATOMIC_ACQ_REL))
        return;
    for (int d = 0; d < RKOMP_MAX_DEVICES; d++) {
        int e = __atomic_load_n(&dev_ent[d], __ATOMIC_ACQUIRE) - 1;
        if (e >= 0)
            rkomp_device_ent_check(e);
    }
}

static inline void after_free(void)
{
    if (RKOMP_UNLIKELY(__atomic_load_n(&dev_changed, __ATOMIC_RELAXED)))
        retire_replaced();
}

static inline __attribute__((always_inline)) int map_free_core(const void *ptr)
{
    tmap_t *me = my_map;
    if (RKOMP_UNLIKELY(!me))
        me = map_register(); /* NULL: no memory; then no hazard and no list */
    int mode = get_defer_mode(), md, dev; /* the first call may start CUDA: not under a lock */
    size_t i;
    tmap_t *m = find_locked(me, ptr, &md, &i);
    if (!m)
        return 0;
    slot_t s = *slot_at(m, i);
    take_out(m, i);
    int ent = slot_ent(&s);
    int after = RKOMP_UNLIKELY(s.meta & M_HARVESTED) ? AFTER_HARVESTED
                : ent == RKOMP_ENT_OWN                ? AFTER_OWN_REF
                                                      : AFTER_NONE;
    if (RKOMP_UNLIKELY(mode) && me && (dev = defer_dev(mode, s.mr)) >= 0) {
        int over;
        if (RKOMP_LIKELY(m == me)) {
            over = pend_push(me, &s, dev, after); /* out of the map and on the list at once */
            map_unlock(me, md);
        } else {
            /* Another thread's block: the hazard keeps its resource until
             * the block is on this thread's list. */
            __atomic_store_n(&me->hz, s.mr, __ATOMIC_RELEASE);
            map_unlock(m, md);
            md = own_lock(me);
            over = pend_push(me, &s, dev, after);
            __atomic_store_n(&me->hz, NULL, __ATOMIC_RELEASE);
            map_unlock(me, md);
        }
        if (RKOMP_UNLIKELY(over))
            pend_over(me);
        after_free();
        return 1;
    }
    /* Under the lock: see "A block given back at its free". */
    slot_give_back(&s);
    map_unlock(m, md);
    settle_after(ent, s.mr, after);
    after_free();
    return 1;
}

int rkomp_map_free(const void *ptr) { return map_free_core(ptr); }

void rkomp_map_free_or_pass(void *ptr, rkomp_handle_t allocator, int gomp)
{
    if (!map_free_core(ptr))
        rkomp_free_forward(ptr, allocator, gomp);
}

size_t rkomp_map_flush(const rankmem_resource_t *mr, int *err_p)
{
    uint64_t mask = 0, maxtag[RKOMP_MAX_DEVICES];
    if (err_p)
        *err_p = 0;
    /* Every pending block's device and newest tag (maps are never freed:
     * the list may be walked without a lock)... */
    for (tmap_t *m = __atomic_load_n(&maps, __ATOMIC_ACQUIRE); m; m = m->next)
        pend_collect(m, mr, &mask, maxtag);
    if (!mask)
        return 0;
    /* ... one sync of each such device (or one that began later)... */
    int err = advance_all(mask, maxtag, 1) < 0;
    /* ... then all of them go back. */
    size_t n = 0;
    for (tmap_t *m = __atomic_load_n(&maps, __ATOMIC_ACQUIRE); m; m = m->next)
        if (__atomic_load_n(&m->npend, __ATOMIC_RELAXED))
            n += drain(m, mr);
    if (err_p)
        *err_p = err;
    return n;
}

/* At unload (dlclose) too: nothing pending may outlive the library. */
__attribute__((destructor)) static void flush_at_unload(void)
{
    rkomp_map_flush(NULL, NULL);
    if (dev_mr_on)
        rankmem_remove_resource_listener(on_resource, NULL);
}

/* ---- the map ---- */

/* Under m's lock: the front block moves into the table. 0, or -1 when the
 * table cannot grow (the front stays). */
static int spill_front(tmap_t *m)
{
    /* Grow at half load: probes stay short. */
    if (m->count >= m->limit && grow(m) != 0)
        return -1;
    size_t i = probe(m, m->front.ptr, hash_of(m->front.ptr));
    m->slots[i] = m->front; /* never there already: a live block is recorded once */
    m->front.ptr = NULL;
    return 0;
}

/* Record b in m, the caller's own map (rkomp_map_insert's contract): as
 * its front block, the one a free looks at before the table. A block
 * freed before the thread's next allocation (temporaries, allocate
 * clauses) never enters the table. */
static inline __attribute__((always_inline)) int insert_in(tmap_t *m, slot_t *s)
{
    int own_ref = 0;
    /* Before the block is published (the program gets ptr after this call
     * returns, so whoever frees it sees the bits). Read first: the lines
     * are written once per region, not per block. */
    /* The filters' bits are never cleared: a block in the grain of this
     * map's previous insert finds them set (most do: a pool reuses what
     * was just freed). */
    uintptr_t grain = (uintptr_t)s->ptr >> 21;
    int fresh = grain != rkomp_last_grain; /* m is the thread's own map */
    uint64_t bit = 0, gbit = 0;
    if (RKOMP_UNLIKELY(fresh)) {
        uint64_t *gw = rkomp_grain_word(s->ptr, &gbit);
        bit = region_bit(s->ptr);
        if (!(__atomic_load_n(&rkomp_filter.regions, __ATOMIC_RELAXED) & bit))
            __atomic_fetch_or(&rkomp_filter.regions, bit, __ATOMIC_RELEASE);
        if (!(__atomic_load_n(gw, __ATOMIC_RELAXED) & gbit))
            __atomic_fetch_or(gw, gbit, __ATOMIC_RELEASE);
    }
    int md = own_lock(m);
    if (RKOMP_UNLIKELY(fresh)) {
        uint64_t mr_bits = __atomic_load_n(&filt[m->idx].regions, __ATOMIC_RELAXED);
        uint64_t mg_bits = __atomic_load_n(&filt[m->idx].grains, __ATOMIC_RELAXED);
        if (!(mr_bits & bit))
            __atomic_store_n(&filt[m->idx].regions, mr_bits | bit, __ATOMIC_RELAXED);
        if (!(mg_bits & gbit))
            __atomic_store_n(&filt[m->idx].grains, mg_bits | gbit, __ATOMIC_RELAXED);
        rkomp_last_grain = grain;
    }
    if (RKOMP_UNLIKELY(m->front.ptr != NULL) && spill_front(m) != 0) {
        map_unlock(m, md);
        return -1;
    }
    unsigned code = (unsigned)(s->meta & M_ENT);
    if (code >= 2) {
        /* Counted by its entry unless that was retired, or reused for
         * another resource, since the allocation picked it. seq_cst: see
         * "A map made after a harvest". */
        entry_t *en = &ents[code - 2];
        if (RKOMP_UNLIKELY(__atomic_load_n(&en->state, __ATOMIC_SEQ_CST) != ENT_ACTIVE ||
                           __atomic_load_n(&en->mr, __ATOMIC_RELAXED) != s->mr)) {
            s->meta &= ~(uint64_t)M_ENT; /* RKOMP_ENT_OWN */
            own_ref = 1;
        }
    }
    m->front = *s;
    __atomic_store_n(&m->count, m->count + 1, __ATOMIC_RELAXED);
    map_unlock(m, md);
    return own_ref;
}

int rkomp_map_insert(rkomp_block_t *b)
{
    slot_t s;
    tmap_t *m = my_map;
    if (RKOMP_UNLIKELY(!m) && !(m = map_register()))
        return -1;
    if (slot_pack(b, &s) != 0)
        return -1;
    int ins = insert_in(m, &s);
    b->ent = slot_ent(&s);
    return ins;
}

/* rkomp_dev_alloc's block was served but not recorded as it stands (ins:
 * rkomp_map_insert's result): out of line, to keep that one's frame small. */
static __attribute__((noinline)) void *dev_alloc_tail(const slot_t *s, int ins)
{
    rkomp_block_t b;
    slot_unpack(s, &b);
    void *p = rkomp_serve_tail(&b, ins);
    return p ? p : rkomp_alloc_failed(&rkomp_slots[0].a, 1, s->bytes, 0, 0);
}

/* The predefined device allocator on its common path, in one function (the
 * general one, serve() and rkomp_alloc_ours, calls four levels deep and
 * checks what is known here): one visible device (or none: dev0_fast), an
 * entry made for it, the thread's map made, no over-allocation
 * (al is RANKMEM_DEFAULT_ALIGNMENT). Anything else takes the general path,
 * which gives the same result. */
void *rkomp_dev_alloc(size_t size)
{
    rkomp_allocator_t *a = &rkomp_slots[0].a;
    tmap_t *m = my_map;
    rankmem_resource_t *mr;
    int e;
    /* Device 0's resource as the registry told (on_resource), and its
     * entry (a hint: the insert checks again, under the map's lock, that
     * it is still in service). */
    if (RKOMP_UNLIKELY(!m || !(mr = __atomic_load_n(&dev0_fast, __ATOMIC_ACQUIRE))) ||
        RKOMP_UNLIKELY((e = __atomic_load_n(&dev_ent[0], __ATOMIC_ACQUIRE) - 1) < 0) ||
        RKOMP_UNLIKELY(__atomic_load_n(&ents[e].mr, __ATOMIC_RELAXED) != mr))
        return rkomp_alloc_ours(a, 1, size, 0, 0);
    slot_t s = {NULL, size, mr, M_DEV(e)};
    if (RKOMP_UNLIKELY(rk_allocate_checked(mr, size, RANKMEM_DEFAULT_ALIGNMENT, &s.ptr) !=
                       RANKMEM_SUCCESS))
        return rkomp_alloc_failed(a, 1, size, 0, 0);
    int ins = insert_in(m, &s);
    if (RKOMP_LIKELY(ins == 0))
        return s.ptr;
    return dev_alloc_tail(&s, ins);
}

static int lookup(const void *ptr, rkomp_block_t *b_p, int remove)
{
    if (!ptr)
        return 0;
    int md;
    size_t i;
    tmap_t *m = find_locked(my_map, ptr, &md, &i);
    if (!m)
        return 0;
    slot_unpack(slot_at(m, i), b_p);
    if (remove)
        take_out(m, i);
    map_unlock(m, md);
    return 1;
}

void rkomp_map_forget(const void *ptr)
{
    rkomp_block_t b;
    lookup(ptr, &b, 1);
}

int rkomp_map_get(const void *ptr, rkomp_block_t *b_p) { return lookup(ptr, b_p, 0); }
