/* fixed: blocks of one size, carved from batches, stream-ordered like the pool.
 *
 * Memory comes from the upstream a batch at a time (blocks_per_batch blocks
 * in one upstream allocation, at creation and whenever the resource runs
 * dry) and goes back only by trim (wholly free batches) or at finalize.
 *
 * Device memory has no room for headers or links, so everything lives on the
 * host:
 *  - each batch has a state byte per block (FREE, LIVE; GONE while trim gives
 *    it back). A byte, not a bit: allocate marks its block live with a plain
 *    store, where a bit would need a locked read-modify-write because
 *    neighbouring bits change on other threads. Free flips LIVE to FREE with
 *    one compare-and-swap, so a double free is refused even when two threads
 *    race to free the same block;
 *  - free blocks sit in LIFO stacks of (pointer, state byte) entries, one
 *    stack per stream: a block freed on stream S is reused by S at once;
 *  - the batches are found on free through a table sorted by address,
 *    searched by bisection without a lock (a sequence lock tells a reader
 *    that a growing or trimming thread changed it meanwhile; it then looks
 *    again). The offset in the batch gives the block's index by a multiply
 *    (Lemire's fast division), and an offset that is not a multiple of the
 *    block size is an interior pointer. So validating a free costs no hash
 *    lookup and no lock.
 *
 * Threads scale through shards as in the pool: a thread works in the shard
 * of its thread slot (its own while there are at most NSHARDS threads), with
 * its own lock (biased to the first thread that allocates there, bias.h:
 * that thread enters with plain loads and stores; the lock is uncontended
 * unless another thread comes to take memory or free a block) and its own
 * stream stacks. A block freed by any thread goes to that thread's
 * shard, so frees never touch another thread's cache lines.
 *
 * When the stream's stack in the shard is empty, in order of cost:
 *  1. half of another stream's stack in the same shard: the stream first
 *     waits for that stream's work so far (an event and a stream wait, only
 *     when the upstream's memory is device-accessible and there is a GPU,
 *     as in the pool), then keeps the blocks as its own;
 *  2. half of a stack of another shard (the same stream's, which needs no
 *     event, else the fullest one);
 *  3. a new batch from the upstream, allocated on the stream.
 * No CUDA call and no system call happen on the path served from the
 * stream's own stack. Over a host upstream streams are only labels.
 *
 * Alignment: batches are asked of the upstream at the largest power of two
 * that divides the block size, at most 4 KiB (so every block has it too).
 * When the upstream refuses that alignment, what it said decides:
 *  - RANKMEM_ERR_NOT_SUPPORTED means it cannot give it at all (the cuda
 *    resource: cudaMalloc guarantees 256 only): batches are asked at 256 from
 *    then on, and larger alignments are RANKMEM_ERR_NOT_SUPPORTED;
 *  - anything else (out of memory, a limit, a pool too fragmented for the
 *    alignment) may pass: the request that needs only 256 is served from a
 *    batch asked at 256 this once, and the next batch is asked at the full
 *    alignment again. Such a batch's blocks may lack the larger alignment;
 *    an aligned request passes over them (alloc_aligned), and trim gives the
 *    batch back once it is free.
 * Over a host upstream (posix_memalign) no failure lowers the alignment for
 * good, and over cudaMalloc the first refusal does. */
#define _GNU_SOURCE
#include "internal.h"
#include "fixed.h"
#include "bias.h"
#include "blocks.h"
#include "config_internal.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define UNIT RANKMEM_DEFAULT_ALIGNMENT
#define NSHARDS 32                              /* a power of two */
#define DEFAULT_BATCH_BYTES ((size_t)2 << 20)   /* blocks_per_batch 0: enough for this */
#define MAX_BATCH_BYTES ((size_t)1 << 40)       /* block index = (offset/256) / (size/256) in 32 bits */
#define MAX_BATCH_ALIGN ((size_t)4096)          /* alignment asked of the upstream at most */
#define MAX_GRANT 4096                          /* entries moved at once between stacks */

enum { FREE = 0, LIVE = 1, GONE = 2 };

static rankmem_status_t fixed_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream);

/* ---- shard locks: biased to the thread that uses the shard (bias.h) ---- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* ---- data ---- */

typedef struct {
    char *ptr;
    unsigned char *state; /* the block's state byte in its batch */
} ent_t;

typedef struct slist {
    rankmem_stream_t stream;
    void *event; /* recorded on stream when another stream takes its blocks */
    ent_t *e;    /* LIFO: e[n - 1] is the block freed last */
    size_t n, cap;
} __attribute__((aligned(64))) slist_t; /* stacks of different threads share no cache line */

typedef struct shard {
    rk_block_t lock;
    int mode; /* how the holder entered: rk_block_unlock's argument */
    slist_t *hint; /* the stack used last: consecutive calls mostly use one stream */
    slist_t **lists;
    size_t nlists, cap_lists;
    /* Written under the lock with atomic stores, read by queries without it. */
    size_t nfree; /* entries in this shard's stacks */
    size_t live;  /* allocations made here minus frees made here (wraps; the sum is right) */
} __attribute__((aligned(64))) shard_t;

typedef struct batch {
    char *base;
    size_t align;       /* alignment it was allocated with (given back with it) */
    struct batch *next; /* spare chain */
    unsigned char state[]; /* nblocks bytes */
} batch_t;

typedef struct {
    uintptr_t base;
    batch_t *b;
} tent_t;

/* The address-sorted batch table; old arrays are kept until finalize, since
 * a reader may still be looking at one (capacity doubles: they add up to
 * less than the current one). */
typedef struct table {
    struct table *retired;
    size_t cap;
    tent_t e[];
} table_t;

typedef struct {
    rankmem_resource_t base;
    size_t bs;          /* block size, a multiple of 256 */
    size_t nblocks;     /* blocks per batch */
    size_t batch_bytes; /* bs * nblocks */
    size_t batch_arg;   /* blocks_per_batch as given (0 = default), for describe */
    unsigned shift;     /* log2(bs) when bs is a power of two, else 0 */
    uint64_t magic;     /* Lemire's constant for dividing by bs / 256 otherwise */
    size_t max_align;   /* largest alignment a block can have */
    size_t batch_align; /* alignment asked of the upstream (atomic: lowered once, on NOT_SUPPORTED) */
    int use_events;     /* upstream memory is used by kernels: order streams with events */
    shard_t *shards;
    /* The table, read without a lock. */
    struct {
        unsigned seq; /* odd while a writer changes it */
        table_t *tab; /* atomic */
        size_t n;     /* atomic */
    } t;
    char pad[64]; /* what follows changes on growth: not in the lines read on every free */
    /* Under grow_lock: growth, trim, the spare descriptors. */
    pthread_mutex_t grow_lock;
    batch_t *spare;
    size_t held, held_high; /* held: atomic stores (queries read it) */
} fixed_t;

static const rankmem_resource_ops_t fixed_ops;

/* ---- threads and shards ---- */

/* The thread slots of blocks.h: recycled, so live threads keep distinct shards. */
static inline shard_t *my_shard(fixed_t *f)
{
    unsigned s = rk_thread_slot;
    if (RK_UNLIKELY(s == 0))
        s = rk_thread_slot_assign();
    return &f->shards[(s - 1) & (NSHARDS - 1)];
}

static inline void shard_lock(shard_t *sh)
{
    int mode = rk_block_lock(&sh->lock);
    sh->mode = mode;
}

static inline void shard_unlock(shard_t *sh) { rk_block_unlock(&sh->lock, sh->mode); }

/* The calling thread's own shard: the first thread through the real lock of
 * a shard nobody claimed takes the bias. */
static inline void lock_own(shard_t *sh)
{
    shard_lock(sh);
    if (RK_UNLIKELY(!sh->mode) &&
        RK_UNLIKELY(__atomic_load_n(&sh->lock.owner, __ATOMIC_RELAXED) == NULL))
        rk_block_rebind(&sh->lock, 1);
}

static void lock_all(fixed_t *f)
{
    for (int i = 0; i < NSHARDS; i++)
        shard_lock(&f->shards[i]);
}

static void unlock_all(fixed_t *f)
{
    for (int i = NSHARDS - 1; i >= 0; i--)
        shard_unlock(&f->shards[i]);
}

/* Shard locks are taken in address order when two are held. */
static void lock_two(shard_t *a, shard_t *b)
{
    if (a < b) {
        shard_lock(a);
        shard_lock(b);
    } else {
        shard_lock(b);
        shard_lock(a);
    }
}

static inline void add_nfree(shard_t *sh, size_t d) /* d may be "negative" (wraps) */
{
    __atomic_store_n(&sh->nfree, sh->nfree + d, __ATOMIC_RELAXED);
}

static slist_t *list_for(shard_t *sh, rankmem_stream_t stream, int create)
{
    if (RK_LIKELY(sh->hint != NULL && sh->hint->stream == stream))
        return sh->hint;
    for (size_t i = 0; i < sh->nlists; i++)
        if (sh->lists[i]->stream == stream)
            return sh->hint = sh->lists[i];
    if (!create)
        return NULL;
    if (sh->nlists == sh->cap_lists) {
        size_t cap = sh->cap_lists ? sh->cap_lists * 2 : 8;
        slist_t **l = realloc(sh->lists, cap * sizeof *l);
        if (!l)
            return NULL;
        sh->lists = l;
        sh->cap_lists = cap;
    }
    slist_t *l = aligned_alloc(64, sizeof *l);
    if (!l)
        return NULL;
    memset(l, 0, sizeof *l);
    l->stream = stream;
    sh->lists[sh->nlists++] = l;
    return sh->hint = l;
}

/* Room for `extra` more entries in l. */
static int reserve(slist_t *l, size_t extra)
{
    if (l->cap - l->n >= extra)
        return 1;
    size_t cap = l->cap ? l->cap * 2 : 64;
    if (cap < l->n + extra)
        cap = l->n + extra;
    ent_t *e = realloc(l->e, cap * sizeof *e);
    if (!e)
        return 0;
    l->e = e;
    l->cap = cap;
    return 1;
}

/* The stack other than `except` with the most entries, or NULL. */
static slist_t *fullest(shard_t *sh, const slist_t *except)
{
    slist_t *best = NULL;
    for (size_t i = 0; i < sh->nlists; i++) {
        slist_t *t = sh->lists[i];
        if (t != except && t->n && (!best || t->n > best->n))
            best = t;
    }
    return best;
}

static inline size_t grant(size_t n)
{
    size_t k = (n + 1) / 2;
    return k > MAX_GRANT ? MAX_GRANT : k;
}

/* Move the k most recently freed entries of d onto s (room reserved). */
static void move_entries(slist_t *s, slist_t *d, size_t k)
{
    memcpy(s->e + s->n, d->e + d->n - k, k * sizeof(ent_t));
    s->n += k;
    d->n -= k;
}

/* ---- the batch table ---- */

/* The batch holding address a (and its base), or NULL. No lock.
 *
 * A sequence lock without fences: writers make seq odd, then store every
 * datum with release order, then make seq even again. A reader loads the
 * data with acquire order; if it saw any datum of a write, it must then see
 * seq changed, and looks again. (On x86 all of these are plain moves.) */
static inline batch_t *lookup(fixed_t *f, uintptr_t a, uintptr_t *base_p)
{
    for (;;) {
        unsigned s1 = __atomic_load_n(&f->t.seq, __ATOMIC_ACQUIRE);
        if (RK_UNLIKELY(s1 & 1)) {
            cpu_relax();
            continue;
        }
        const table_t *t = __atomic_load_n(&f->t.tab, __ATOMIC_ACQUIRE);
        size_t lo = 0, hi = __atomic_load_n(&f->t.n, __ATOMIC_ACQUIRE);
        /* A torn read (a writer came by) is thrown away below, but must not
         * lead outside the array meanwhile. */
        if (RK_UNLIKELY(!t))
            hi = 0;
        else if (RK_UNLIKELY(hi > t->cap))
            hi = t->cap;
        while (lo < hi) { /* the first entry above a */
            size_t mid = (lo + hi) / 2;
            if (__atomic_load_n(&t->e[mid].base, __ATOMIC_ACQUIRE) <= a)
                lo = mid + 1;
            else
                hi = mid;
        }
        batch_t *b = NULL;
        uintptr_t base = 0;
        if (lo) {
            base = __atomic_load_n(&t->e[lo - 1].base, __ATOMIC_ACQUIRE);
            if (a - base < f->batch_bytes)
                b = __atomic_load_n(&t->e[lo - 1].b, __ATOMIC_ACQUIRE);
        }
        if (RK_LIKELY(__atomic_load_n(&f->t.seq, __ATOMIC_RELAXED) == s1)) {
            *base_p = base;
            return b;
        }
    }
}

/* Writers hold grow_lock. */
static void write_begin(fixed_t *f) { __atomic_store_n(&f->t.seq, f->t.seq + 1, __ATOMIC_RELAXED); }

static void write_end(fixed_t *f) { __atomic_store_n(&f->t.seq, f->t.seq + 1, __ATOMIC_RELEASE); }

static inline void tent_store(tent_t *dst, uintptr_t base, batch_t *b)
{
    __atomic_store_n(&dst->base, base, __ATOMIC_RELEASE);
    __atomic_store_n(&dst->b, b, __ATOMIC_RELEASE);
}

/* Room for one more batch (grow_lock held). */
static int table_reserve(fixed_t *f)
{
    table_t *old = f->t.tab;
    if (old && f->t.n < old->cap)
        return 1;
    size_t cap = old ? old->cap * 2 : 8;
    table_t *t = malloc(sizeof *t + cap * sizeof(tent_t));
    if (!t)
        return 0;
    t->cap = cap;
    t->retired = old;
    if (old)
        memcpy(t->e, old->e, f->t.n * sizeof(tent_t));
    write_begin(f);
    __atomic_store_n(&f->t.tab, t, __ATOMIC_RELEASE);
    write_end(f);
    return 1;
}

/* Position of the batch holding a (grow_lock held; a is in some batch). */
static size_t table_pos(const fixed_t *f, uintptr_t a)
{
    size_t lo = 0, hi = f->t.n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (f->t.tab->e[mid].base <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo - 1;
}

static void table_insert(fixed_t *f, batch_t *b)
{
    table_t *t = f->t.tab;
    uintptr_t base = (uintptr_t)b->base;
    size_t n = f->t.n, pos = n;
    while (pos && t->e[pos - 1].base > base)
        pos--;
    write_begin(f);
    for (size_t i = n; i > pos; i--)
        tent_store(&t->e[i], t->e[i - 1].base, t->e[i - 1].b);
    tent_store(&t->e[pos], base, b);
    __atomic_store_n(&f->t.n, n + 1, __ATOMIC_RELEASE);
    write_end(f);
}

/* Drop the batches whose first state byte is GONE. */
static void table_remove_gone(fixed_t *f)
{
    table_t *t = f->t.tab;
    size_t n = f->t.n, k = 0;
    write_begin(f);
    for (size_t i = 0; i < n; i++)
        if (__atomic_load_n(&t->e[i].b->state[0], __ATOMIC_RELAXED) != GONE) {
            if (k != i)
                tent_store(&t->e[k], t->e[i].base, t->e[i].b);
            k++;
        }
    __atomic_store_n(&f->t.n, k, __ATOMIC_RELEASE);
    write_end(f);
}

/* Index of the block at offset off of its batch, or SIZE_MAX for an interior pointer. */
static inline size_t block_index(const fixed_t *f, size_t off)
{
    if (f->shift)
        return RK_LIKELY(!(off & (f->bs - 1))) ? off >> f->shift : SIZE_MAX;
    if (RK_UNLIKELY(off & (UNIT - 1)))
        return SIZE_MAX;
    /* n / d and n % d == 0 for 32-bit n and d by multiplication (Lemire et
     * al., "Faster remainder by direct computation", 2019). */
    uint64_t n = (uint64_t)(off / UNIT);
    if (RK_UNLIKELY(n * f->magic > f->magic - 1))
        return SIZE_MAX;
#ifdef __SIZEOF_INT128__
    return (size_t)(((unsigned __int128)f->magic * n) >> 64);
#else
    return (size_t)(off / f->bs);
#endif
}

/* ---- growth ---- */

/* Give a batch that is in the table but in no stack back (grow_lock not held). */
static void drop_batch(fixed_t *f, batch_t *b)
{
    rankmem_resource_t *up = f->base.upstream;
    pthread_mutex_lock(&f->grow_lock);
    memset(b->state, GONE, f->nblocks);
    table_remove_gone(f);
    up->ops->deallocate(up, b->base, f->batch_bytes, b->align, NULL);
    __atomic_store_n(&f->held, f->held - f->batch_bytes, __ATOMIC_RELAXED);
    b->next = f->spare;
    f->spare = b;
    pthread_mutex_unlock(&f->grow_lock);
}

/* A new batch from the upstream, in the table, every block FREE (no shard
 * lock held). need: the alignment the caller's request needs (UNIT, or more
 * for alloc_aligned, which a batch asked at 256 would not serve). */
static rankmem_status_t grow(fixed_t *f, rankmem_stream_t stream, size_t need, batch_t **b_p)
{
    rankmem_resource_t *up = f->base.upstream;
    rankmem_status_t st = RANKMEM_SUCCESS;
    pthread_mutex_lock(&f->grow_lock);
    batch_t *b = f->spare;
    if (b)
        f->spare = b->next;
    else
        b = malloc(sizeof *b + f->nblocks);
    if (!b || !table_reserve(f)) {
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory to describe a new batch");
        goto out;
    }
    void *mem = NULL;
    size_t align = __atomic_load_n(&f->batch_align, __ATOMIC_RELAXED);
    if (need > align) { /* lowered by another thread since the caller looked */
        st = rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                      "fixed: alignment %zu; the upstream gives batches aligned to %zu only", need,
                      align);
        goto out;
    }
    st = up->ops->allocate(up, f->batch_bytes, align, stream, &mem);
    if (st != RANKMEM_SUCCESS && align > UNIT) {
        /* The rule of the header: only NOT_SUPPORTED lowers the alignment for
         * good; any other failure may pass, and lowers it for this batch only. */
        if (st == RANKMEM_ERR_NOT_SUPPORTED)
            __atomic_store_n(&f->batch_align, UNIT, __ATOMIC_RELAXED);
        if (need <= UNIT) {
            align = UNIT;
            st = up->ops->allocate(up, f->batch_bytes, align, stream, &mem);
        }
    }
    if (st != RANKMEM_SUCCESS)
        goto out; /* the upstream's error stands */
    b->base = mem;
    b->align = align;
    memset(b->state, FREE, f->nblocks);
    table_insert(f, b);
    __atomic_store_n(&f->held, f->held + f->batch_bytes, __ATOMIC_RELAXED);
    if (f->held > f->held_high)
        f->held_high = f->held;
    *b_p = b;
    b = NULL;
out:
    if (b) {
        b->next = f->spare;
        f->spare = b;
    }
    pthread_mutex_unlock(&f->grow_lock);
    return st;
}

/* ---- allocate / deallocate ---- */

/* Hand out the top of s and unlock sh. */
static inline void pop(shard_t *sh, slist_t *s, void **ptr_p)
{
    ent_t e = s->e[--s->n];
    add_nfree(sh, (size_t)-1);
    __atomic_store_n(&sh->live, sh->live + 1, __ATOMIC_RELAXED);
    shard_unlock(sh);
    __atomic_store_n(e.state, LIVE, __ATOMIC_RELAXED);
    *ptr_p = e.ptr;
}

/* Take blocks from another shard for `stream` into sh's stack for it. Called
 * and returns with sh locked (drops it meanwhile). 1: got some; 0: none. */
static int steal(fixed_t *f, shard_t *sh, rankmem_stream_t stream, rankmem_status_t *st_p)
{
    unsigned start = (unsigned)(sh - f->shards);
    for (unsigned i = 1; i < NSHARDS; i++) {
        shard_t *o = &f->shards[(start + i) & (NSHARDS - 1)];
        if (!__atomic_load_n(&o->nfree, __ATOMIC_RELAXED))
            continue;
        shard_unlock(sh);
        lock_two(sh, o);
        slist_t *d = list_for(o, stream, 0);
        if (!d || !d->n)
            d = fullest(o, NULL);
        if (!d) {
            shard_unlock(o);
            continue;
        }
        if (f->use_events && d->stream != stream) {
            rankmem_status_t st = rk_gpu_stream_wait(stream, d->stream, &d->event);
            if (st != RANKMEM_SUCCESS) {
                shard_unlock(o);
                *st_p = st;
                return 0;
            }
        }
        slist_t *s = list_for(sh, stream, 1);
        size_t k = grant(d->n);
        if (!s || !reserve(s, k)) {
            shard_unlock(o);
            *st_p = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for a free list");
            return 0;
        }
        move_entries(s, d, k);
        add_nfree(o, (size_t)0 - k);
        add_nfree(sh, k);
        shard_unlock(o);
        return 1;
    }
    return 0;
}

/* Put a new batch's blocks on s, reversed, so that it is handed out in address order. */
static void push_batch(fixed_t *f, shard_t *sh, slist_t *s, batch_t *b)
{
    for (size_t i = f->nblocks; i-- > 0;) {
        s->e[s->n].ptr = b->base + i * f->bs;
        s->e[s->n].state = &b->state[i];
        s->n++;
    }
    add_nfree(sh, f->nblocks);
}

/* sh is locked and the stream's stack is empty: find or make a block (a new
 * batch for a request that needs alignment `need`). Unlocks sh. */
static rankmem_status_t alloc_slow(fixed_t *f, shard_t *sh, rankmem_stream_t stream, size_t need,
                                   void **ptr_p)
{
    rankmem_status_t st = RANKMEM_SUCCESS;
    for (int round = 0; round < 8; round++) {
        slist_t *s = list_for(sh, stream, 1);
        if (!s) {
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for a free list");
            break;
        }
        if (s->n) {
            pop(sh, s, ptr_p);
            return RANKMEM_SUCCESS;
        }
        /* 1. Another stream of this shard. */
        slist_t *d = fullest(sh, s);
        if (d) {
            if (f->use_events &&
                (st = rk_gpu_stream_wait(stream, d->stream, &d->event)) != RANKMEM_SUCCESS)
                break;
            size_t k = grant(d->n);
            if (reserve(s, k)) {
                move_entries(s, d, k);
                pop(sh, s, ptr_p);
            } else {
                pop(sh, d, ptr_p); /* no room to keep more: just this one */
            }
            return RANKMEM_SUCCESS;
        }
        /* 2. Another shard. */
        if (steal(f, sh, stream, &st))
            continue;
        if (st != RANKMEM_SUCCESS)
            break;
        /* 3. A new batch, with room for it made first. */
        if (!reserve(s, f->nblocks)) {
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for a free list");
            break;
        }
        shard_unlock(sh);
        batch_t *b;
        st = grow(f, stream, need, &b);
        shard_lock(sh);
        if (st != RANKMEM_SUCCESS)
            break;
        s = list_for(sh, stream, 1);
        if (!s || !reserve(s, f->nblocks)) {
            shard_unlock(sh);
            drop_batch(f, b);
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for a free list");
        }
        push_batch(f, sh, s, b);
    }
    shard_unlock(sh);
    if (st == RANKMEM_SUCCESS) /* other threads kept taking what we found */
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                      "fixed: other threads kept taking the new blocks of %zu bytes", f->bs);
    return st;
}

static rankmem_status_t fixed_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream);

static rankmem_status_t alloc_aligned(fixed_t *f, size_t bytes, size_t alignment,
                                      rankmem_stream_t stream, void **ptr_p);

/* A block for a request that needs alignment `need` (a new batch is asked at
 * that much at least). */
static inline rankmem_status_t alloc_block(fixed_t *f, size_t need, rankmem_stream_t stream,
                                           void **ptr_p)
{
    shard_t *sh = my_shard(f);
    lock_own(sh);
    slist_t *s = sh->hint;
    if (RK_LIKELY(s != NULL && s->stream == stream && s->n)) {
        pop(sh, s, ptr_p);
        return RANKMEM_SUCCESS;
    }
    return alloc_slow(f, sh, stream, need, ptr_p);
}

static rankmem_status_t fixed_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    fixed_t *f = (fixed_t *)mr;
    if (RK_UNLIKELY(bytes > f->bs))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "fixed: a request of %zu bytes is larger than the block size of %zu bytes",
                        bytes, f->bs);
    if (RK_UNLIKELY(alignment > UNIT))
        return alloc_aligned(f, bytes, alignment, stream, ptr_p);
    return alloc_block(f, UNIT, stream, ptr_p);
}

/* The calling thread's stack for the stream held a block without the
 * alignment (from a batch asked at 256 while the upstream failed at more,
 * see grow): swap an aligned free block of that stack to its top and take
 * it, else take a block of a new batch asked at the full alignment. */
static rankmem_status_t take_aligned(fixed_t *f, size_t alignment, rankmem_stream_t stream,
                                     void **ptr_p)
{
    shard_t *sh = my_shard(f);
    lock_own(sh);
    slist_t *s = list_for(sh, stream, 1);
    if (!s) {
        shard_unlock(sh);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for a free list");
    }
    for (size_t j = s->n; j-- > 0;)
        if (!((uintptr_t)s->e[j].ptr & (alignment - 1))) {
            ent_t t = s->e[j];
            s->e[j] = s->e[s->n - 1];
            s->e[s->n - 1] = t;
            pop(sh, s, ptr_p);
            return RANKMEM_SUCCESS;
        }
    if (!reserve(s, f->nblocks)) {
        shard_unlock(sh);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for a free list");
    }
    shard_unlock(sh);
    batch_t *b;
    rankmem_status_t st = grow(f, stream, alignment, &b);
    if (st != RANKMEM_SUCCESS)
        return st;
    shard_lock(sh);
    s = list_for(sh, stream, 1);
    if (!s || !reserve(s, f->nblocks)) {
        shard_unlock(sh);
        drop_batch(f, b);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for a free list");
    }
    push_batch(f, sh, s, b); /* its first block, on top, has the alignment: b->align >= it */
    pop(sh, s, ptr_p);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t alloc_aligned(fixed_t *f, size_t bytes, size_t alignment,
                                      rankmem_stream_t stream, void **ptr_p)
{
    size_t have = __atomic_load_n(&f->batch_align, __ATOMIC_RELAXED);
    if (have > f->max_align)
        have = f->max_align;
    if (alignment > have)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "fixed: alignment %zu; blocks of %zu bytes are aligned to %zu only "
                        "(put the aligned adaptor above, or use a pool)",
                        alignment, f->bs, have);
    void *p;
    rankmem_status_t st = alloc_block(f, alignment, stream, &p);
    if (st != RANKMEM_SUCCESS)
        return st;
    if (RK_LIKELY(!((uintptr_t)p & (alignment - 1)))) {
        *ptr_p = p;
        return RANKMEM_SUCCESS;
    }
    /* p (kept live meanwhile: no other thread takes it only to meet the same
     * problem) goes back once the search is over. */
    st = take_aligned(f, alignment, stream, ptr_p);
    fixed_deallocate(&f->base, p, bytes, UNIT, stream);
    return st;
}

static rankmem_status_t fixed_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    fixed_t *f = (fixed_t *)mr;
    /* Blocks are handed out whole and their request sizes are not kept: any
     * size a block can serve (1 .. bs) frees it; 0 or more cannot be right. */
    if (RK_UNLIKELY(bytes == 0 || bytes > f->bs))
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "fixed: %p freed with %zu bytes; blocks of %zu bytes serve 1 to %zu; "
                        "not freed",
                        ptr, bytes, f->bs, f->bs);
    uintptr_t base;
    batch_t *b = lookup(f, (uintptr_t)ptr, &base);
    if (RK_UNLIKELY(!b))
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "fixed: %p is not in any batch of this resource (memory from elsewhere)",
                        ptr);
    size_t i = block_index(f, (uintptr_t)ptr - base);
    if (RK_UNLIKELY(i == SIZE_MAX))
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "fixed: %p points inside a block of %zu bytes, not at its start; not freed",
                        ptr, f->bs);
    unsigned char expect = LIVE;
    if (RK_UNLIKELY(!__atomic_compare_exchange_n(&b->state[i], &expect, FREE, 0,
                                                 __ATOMIC_RELAXED, __ATOMIC_RELAXED)))
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "fixed: %p is not a live block (double free?); not freed", ptr);
    shard_t *sh = my_shard(f);
    lock_own(sh);
    slist_t *s = sh->hint;
    if (RK_UNLIKELY(s == NULL || s->stream != stream))
        s = list_for(sh, stream, 1);
    if (RK_UNLIKELY(!s || (s->n == s->cap && !reserve(s, 1)))) {
        shard_unlock(sh);
        __atomic_store_n(&b->state[i], LIVE, __ATOMIC_RELAXED); /* nothing changed */
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory to free %p", ptr);
    }
    s->e[s->n].ptr = ptr;
    s->e[s->n].state = &b->state[i];
    s->n++;
    add_nfree(sh, 1);
    __atomic_store_n(&sh->live, sh->live - 1, __ATOMIC_RELAXED);
    shard_unlock(sh);
    return RANKMEM_SUCCESS;
}

/* ---- queries, trim, forget, finalize ---- */

static rankmem_status_t fixed_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    fixed_t *f = (fixed_t *)mr;
    size_t v = 0;
    switch (what) {
    case RANKMEM_QUERY_RESERVED_CURRENT: v = __atomic_load_n(&f->held, __ATOMIC_RELAXED); break;
    case RANKMEM_QUERY_RESERVED_HIGH:
        pthread_mutex_lock(&f->grow_lock);
        v = f->held_high;
        pthread_mutex_unlock(&f->grow_lock);
        break;
    case RANKMEM_QUERY_USED_CURRENT: /* blocks are handed out whole */
    case RANKMEM_QUERY_LIVE_COUNT:
        for (int i = 0; i < NSHARDS; i++)
            v += __atomic_load_n(&f->shards[i].live, __ATOMIC_RELAXED);
        if (v > SIZE_MAX / 2) /* shards disagreeing for a moment while threads race */
            v = 0;
        if (what == RANKMEM_QUERY_USED_CURRENT)
            v *= f->bs;
        break;
    case RANKMEM_QUERY_FREE_BLOCKS:
        for (int i = 0; i < NSHARDS; i++)
            v += __atomic_load_n(&f->shards[i].nfree, __ATOMIC_RELAXED);
        break;
    default:
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "fixed: query %d is not answered", (int)what);
    }
    *value_p = v;
    return RANKMEM_SUCCESS;
}

/* Kernels may still use blocks freed on their streams: wait for every stream
 * that holds free blocks. Caller holds every shard lock. */
static rankmem_status_t sync_free_streams(fixed_t *f)
{
    if (!f->use_events)
        return RANKMEM_SUCCESS;
    for (int i = 0; i < NSHARDS; i++)
        for (size_t k = 0; k < f->shards[i].nlists; k++)
            if (f->shards[i].lists[k]->n) {
                rankmem_status_t st = rk_gpu_stream_sync(f->shards[i].lists[k]->stream);
                if (st != RANKMEM_SUCCESS)
                    return st;
            }
    return RANKMEM_SUCCESS;
}

/* Give every wholly free batch back while more than keep_bytes are held. */
static rankmem_status_t fixed_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    fixed_t *f = (fixed_t *)mr;
    rankmem_resource_t *up = f->base.upstream;
    pthread_mutex_lock(&f->grow_lock);
    lock_all(f);
    size_t n = f->t.n;
    size_t *count = NULL;
    batch_t **gone = NULL;
    size_t ngone = 0;
    rankmem_status_t result = sync_free_streams(f);
    if (result == RANKMEM_SUCCESS && n) {
        count = calloc(n, sizeof *count);
        gone = malloc(n * sizeof *gone);
        if (!count || !gone)
            result = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory to trim");
    }
    if (result == RANKMEM_SUCCESS && n) {
        for (int i = 0; i < NSHARDS; i++)
            for (size_t k = 0; k < f->shards[i].nlists; k++) {
                slist_t *l = f->shards[i].lists[k];
                for (size_t j = 0; j < l->n; j++)
                    count[table_pos(f, (uintptr_t)l->e[j].ptr)]++;
            }
        size_t held = f->held;
        for (size_t p = 0; p < n && held >= f->batch_bytes && held - f->batch_bytes >= keep_bytes;
             p++)
            if (count[p] == f->nblocks) {
                batch_t *b = f->t.tab->e[p].b;
                memset(b->state, GONE, f->nblocks);
                gone[ngone++] = b;
                held -= f->batch_bytes;
            }
        if (ngone) {
            for (int i = 0; i < NSHARDS; i++) {
                shard_t *sh = &f->shards[i];
                size_t dropped = 0;
                for (size_t k = 0; k < sh->nlists; k++) {
                    slist_t *l = sh->lists[k];
                    size_t m = 0;
                    for (size_t j = 0; j < l->n; j++)
                        if (__atomic_load_n(l->e[j].state, __ATOMIC_RELAXED) != GONE)
                            l->e[m++] = l->e[j];
                    dropped += l->n - m;
                    l->n = m;
                }
                add_nfree(sh, (size_t)0 - dropped);
            }
            table_remove_gone(f);
        }
    }
    unlock_all(f);
    /* Back upstream with no shard locked: threads go on meanwhile. */
    for (size_t i = 0; i < ngone; i++) {
        batch_t *b = gone[i];
        rankmem_status_t st = up->ops->deallocate(up, b->base, f->batch_bytes, b->align, NULL);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
        __atomic_store_n(&f->held, f->held - f->batch_bytes, __ATOMIC_RELAXED);
        b->next = f->spare;
        f->spare = b;
    }
    pthread_mutex_unlock(&f->grow_lock);
    free(count);
    free(gone);
    return result;
}

/* Before a stream is destroyed (its handle may come back for a new stream):
 * wait for it and hand its free blocks to the default stream. */
static rankmem_status_t fixed_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    fixed_t *f = (fixed_t *)mr;
    if (!stream) /* the default stream is never destroyed */
        return RANKMEM_SUCCESS;
    int synced = 0;
    for (int i = 0; i < NSHARDS; i++) {
        shard_t *sh = &f->shards[i];
        shard_lock(sh);
        slist_t *l = list_for(sh, stream, 0);
        if (l) {
            if (f->use_events && !synced) {
                rankmem_status_t st = rk_gpu_stream_sync(stream);
                if (st != RANKMEM_SUCCESS) {
                    shard_unlock(sh);
                    return st;
                }
                synced = 1;
            }
            slist_t *d = list_for(sh, NULL, 0);
            if (d && reserve(d, l->n)) {
                move_entries(d, l, l->n);
                size_t k = 0;
                while (sh->lists[k] != l)
                    k++;
                sh->lists[k] = sh->lists[--sh->nlists];
                rk_gpu_event_destroy(l->event);
                free(l->e);
                free(l);
            } else {
                /* It becomes a stack of the default stream (a second one, if
                 * there was no room to merge: other streams still reach it). */
                l->stream = NULL;
            }
            sh->hint = NULL;
        }
        shard_unlock(sh);
    }
    return RANKMEM_SUCCESS;
}

static void free_host_state(fixed_t *f)
{
    for (int i = 0; f->shards && i < NSHARDS; i++) {
        shard_t *sh = &f->shards[i];
        for (size_t k = 0; k < sh->nlists; k++) {
            rk_gpu_event_destroy(sh->lists[k]->event);
            free(sh->lists[k]->e);
            free(sh->lists[k]);
        }
        free(sh->lists);
    }
    free(f->shards);
    if (f->t.tab)
        for (size_t i = 0; i < f->t.n; i++)
            free(f->t.tab->e[i].b);
    for (table_t *t = f->t.tab, *nx; t; t = nx) {
        nx = t->retired;
        free(t);
    }
    while (f->spare) {
        batch_t *b = f->spare;
        f->spare = b->next;
        free(b);
    }
    pthread_mutex_destroy(&f->grow_lock);
    free(f);
}

static rankmem_status_t fixed_finalize(rankmem_resource_t *mr)
{
    fixed_t *f = (fixed_t *)mr;
    rankmem_resource_t *up = f->base.upstream;
    rankmem_status_t result = RANKMEM_SUCCESS;
    size_t live = 0;
    for (int i = 0; f->shards && i < NSHARDS; i++)
        live += f->shards[i].live;
    if (live)
        result = rk_error(RANKMEM_ERR_BUSY,
                          "fixed: released with %zu live blocks of %zu bytes; their memory went "
                          "back to the upstream",
                          live, f->bs);
    if (f->shards)
        sync_free_streams(f);
    for (size_t i = 0; f->t.tab && i < f->t.n; i++) {
        batch_t *b = f->t.tab->e[i].b;
        rankmem_status_t st = up->ops->deallocate(up, b->base, f->batch_bytes, b->align, NULL);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
    }
    free_host_state(f);
    return result;
}

/* Spec syntax: fixed(block=64KiB,batch=32); batch only when it was given. */
static int fixed_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const fixed_t *f = (const fixed_t *)mr;
    char sz[40];
    rk_format_size(sz, sizeof sz, f->bs);
    if (f->batch_arg)
        return snprintf(buf, len, "fixed(block=%s,batch=%zu)", sz, f->batch_arg);
    return snprintf(buf, len, "fixed(block=%s)", sz);
}

static const rankmem_resource_ops_t fixed_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "fixed",
    .allocate = fixed_allocate,
    .deallocate = fixed_deallocate,
    .query = fixed_query,
    .trim = fixed_trim,
    .finalize = fixed_finalize,
    .describe = fixed_describe,
    .forget_stream = fixed_forget_stream,
};

int rk_fixed_is(const rankmem_resource_t *mr) { return mr && mr->ops == &fixed_ops; }

/* The alignment its blocks have when the upstream gives it (binning routes by it). */
size_t rk_fixed_max_align(const rankmem_resource_t *mr) { return ((const fixed_t *)mr)->max_align; }

size_t rk_fixed_block_size(const rankmem_resource_t *mr) { return ((const fixed_t *)mr)->bs; }

/* Whether ptr lies in one of its batches (live or not). */
int rk_fixed_owns(rankmem_resource_t *mr, const void *ptr)
{
    uintptr_t base;
    return lookup((fixed_t *)mr, (uintptr_t)ptr, &base) != NULL;
}

/* prealloc: take the first batch now (rankmem_fixed_create); binning's bins
 * take theirs on first use, so that a wide range of bins costs nothing until
 * it is used. who names the caller in messages. */
rankmem_status_t rk_fixed_new(rankmem_resource_t *upstream, size_t block_size,
                              size_t blocks_per_batch, int prealloc, const char *who,
                              rankmem_resource_t **mr_p)
{
    if (block_size == 0)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "%s: block size 0", who);
    if (block_size > MAX_BATCH_BYTES)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: block size %zu is larger than the largest batch (%zu bytes)", who,
                        block_size, MAX_BATCH_BYTES);
    size_t bs = rk_align_up(block_size, UNIT);
    size_t nb = blocks_per_batch;
    if (!nb)
        nb = bs < DEFAULT_BATCH_BYTES ? DEFAULT_BATCH_BYTES / bs : 1;
    if (nb > MAX_BATCH_BYTES / bs)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "%s: a batch of %zu blocks of %zu bytes is larger than %zu bytes", who, nb,
                        bs, MAX_BATCH_BYTES);
    unsigned props = upstream->props & (RANKMEM_PROP_DEVICE_ACCESSIBLE |
                                         RANKMEM_PROP_HOST_ACCESSIBLE);
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(fixed_t), &fixed_ops,
                                          props | RANKMEM_PROP_STREAM_ORDERED, upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    fixed_t *f = (fixed_t *)mr;
    f->base.device = upstream->device;
    f->bs = bs;
    f->nblocks = nb;
    f->batch_bytes = bs * nb;
    f->batch_arg = blocks_per_batch;
    if (rk_is_pow2(bs))
        f->shift = (unsigned)__builtin_ctzll((unsigned long long)bs);
    else
        f->magic = UINT64_MAX / (uint64_t)(bs / UNIT) + 1;
    f->max_align = bs & -bs;
    if (f->max_align > MAX_BATCH_ALIGN)
        f->max_align = MAX_BATCH_ALIGN;
    f->batch_align = f->max_align;
    f->use_events = (upstream->props & RANKMEM_PROP_DEVICE_ACCESSIBLE) && rk_gpu_count() > 0;
    pthread_mutex_init(&f->grow_lock, NULL);
    void *shards = NULL;
    if (posix_memalign(&shards, 64, NSHARDS * sizeof(shard_t)) != 0) {
        free_host_state(f);
        rankmem_resource_release(upstream);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for its shards");
    }
    memset(shards, 0, NSHARDS * sizeof(shard_t));
    f->shards = shards;
    if (prealloc) {
        shard_t *sh = my_shard(f);
        slist_t *l = list_for(sh, NULL, 1);
        batch_t *b;
        if (!l || !reserve(l, nb))
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "fixed: no host memory for its free lists");
        else if ((st = grow(f, NULL, UNIT, &b)) == RANKMEM_SUCCESS)
            push_batch(f, sh, l, b);
    }
    if (st != RANKMEM_SUCCESS) {
        /* Nothing was handed out: undo by hand, the upstream reference too. */
        fixed_finalize(mr);
        rankmem_resource_release(upstream);
        return st;
    }
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_fixed_create(rankmem_resource_t *upstream, size_t block_size,
                                      size_t blocks_per_batch, rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_fixed_create: NULL %s",
                        upstream ? "output" : "upstream");
    return rk_fixed_new(upstream, block_size, blocks_per_batch, 1, "rankmem_fixed_create", mr_p);
}
