/* pool: a coalescing, stream-ordered best-fit suballocator over any upstream.
 *
 * Device memory has no room for headers, so every block is described by a
 * host-side descriptor: its address range, its physical neighbours (address
 * order, for coalescing) and, while free, the free list it sits in. A
 * pointer-keyed hash map finds the descriptor of a live block on deallocate;
 * a pointer it does not know (double free, foreign or interior pointer) is
 * refused before anything is touched.
 *
 * Free blocks live in one list per stream: a block freed on stream S may be
 * reused by S at once, in stream order. Each list is segregated by size class
 * (TLSF-style: 8 linear sub-classes per power of two, bitmaps to find the
 * next non-empty class), so a best fit within the request's class, or the
 * first block of the next non-empty class, is found in constant time.
 *
 * Threads scale through shards: each thread works in one of NSHARDS shards
 * (its own while there are no more threads than shards), each with its own
 * lock, stream lists, live map and descriptors. A block's neighbours are
 * always in the same shard, so coalescing never takes two locks. Memory
 * moves between shards as whole regions cut out of a free block.
 *
 * When nothing in S's list fits, in order of cost:
 *  1. a block of another stream's list in the same shard: S waits for that
 *     stream's work so far (one event record and one stream wait), and keeps
 *     a grant of the block so that it pays this once, not per request;
 *  2. a region cut from a free block of another shard (same event rule);
 *  3. synchronise the shard's other streams and merge their blocks into S's
 *     list, where neighbours coalesce (last resort before growing);
 *  4. a new chunk from the upstream;
 *  5. if the upstream refuses: synchronise everything, merge the free blocks
 *     of all shards, coalescing across them, and look again.
 * No CUDA call happens on the path served from S's own list. Over a host
 * upstream streams are only labels: the same moves cost no CUDA call. */
#define _GNU_SOURCE
#include "internal.h"
#include "config_internal.h"
#include "blocks.h"
#include "pool_backed.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define UNIT RANKMEM_DEFAULT_ALIGNMENT /* block sizes are multiples of this */
#define NCLASS 448
#define NWORDS (NCLASS / 64)
#define BEST_FIT_SCAN 16 /* blocks examined in the request's own class */
#define NSHARDS RK_NSHARDS
#define MIN_GROWTH ((size_t)2 << 20)
#define MAX_GEOMETRIC_GROWTH ((size_t)1 << 30)
#define GROWTH_SHIFT 4 /* grow by a sixteenth of what is held: reserved stays within ~1.06x of need */
#define MAX_GRANT ((size_t)64 << 20) /* what a stream or shard keeps when it takes memory */
#define LOW_FILED_MIN ((size_t)64 << 20) /* list_resize: blocks this large may sit a class low */

typedef struct blk blk_t;
typedef struct slist slist_t;

struct blk {
    char *ptr;
    size_t size;
    blk_t *prev, *next;   /* physical neighbours; NULL at a chunk's or region's ends */
    blk_t *fprev, *fnext; /* free-list links (also the spare-descriptor chain) */
    slist_t *owner;       /* the free list holding it; NULL while allocated */
    size_t req;           /* bytes the user asked for, while allocated */
    unsigned cls;         /* size class, while free */
};

struct slist {
    rk_slist_t h;   /* stream, and its event */
    unsigned takes; /* times this stream took memory from elsewhere: grants grow with it */
    size_t free_bytes, nfree;
    uint64_t bitmap[NWORDS];
    blk_t *heads[NCLASS];
};

typedef struct {
    char *ptr;
    size_t size;
} chunk_t;

typedef rk_shard_t shard_t; /* blocks.h: lock, stream lists, live map, descriptors */

typedef struct {
    rankmem_resource_t base;
    size_t initial, maximum, growth;
    int use_events; /* upstream memory is used by kernels: order streams with events */
    pthread_mutex_t grow_lock; /* chunks, held, held_high */
    chunk_t *chunks;
    size_t nchunks, cap_chunks;
    size_t held, held_high;
    shard_t *shards; /* NSHARDS, RK_SHARD_APART bytes apart */
    /* Backed pools (pool_backed.h): no upstream, no chunks; under grow_lock. */
    const rk_pool_backing_t *backing;
    void *bctx;
    size_t live_high;           /* peak live bytes seen when growing */
    size_t give_backs, given;   /* times memory was given back, bytes */
    int at_peak;                /* the growth under way follows a new peak of live bytes */
} pool_t;

/* ---- size classes ---- */

static inline unsigned class_of(size_t units)
{
    if (units < 16)
        return (unsigned)units;
    unsigned fl = 63u - (unsigned)__builtin_clzll((unsigned long long)units);
    unsigned sl = (unsigned)(units >> (fl - 3)) & 7u;
    return 16u + (fl - 4u) * 8u + sl;
}

/* First non-empty class at or after c, or NCLASS. */
static inline unsigned next_class(const slist_t *l, unsigned c)
{
    unsigned w = c / 64;
    if (w >= NWORDS)
        return NCLASS;
    uint64_t bits = l->bitmap[w] & (~0ull << (c % 64));
    while (!bits) {
        if (++w == NWORDS)
            return NCLASS;
        bits = l->bitmap[w];
    }
    return w * 64 + (unsigned)__builtin_ctzll(bits);
}

static inline void list_insert(slist_t *l, blk_t *b)
{
    unsigned c = class_of(b->size / UNIT);
    b->cls = c;
    b->owner = l;
    b->fprev = NULL;
    b->fnext = l->heads[c];
    if (b->fnext)
        b->fnext->fprev = b;
    l->heads[c] = b;
    l->bitmap[c / 64] |= 1ull << (c % 64);
    l->free_bytes += b->size;
    l->nfree++;
}

static inline void list_remove(slist_t *l, blk_t *b)
{
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else {
        l->heads[b->cls] = b->fnext;
        if (!b->fnext)
            l->bitmap[b->cls / 64] &= ~(1ull << (b->cls % 64));
    }
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    b->owner = NULL;
    l->free_bytes -= b->size;
    l->nfree--;
}

/* b, free in l, now has new_size bytes. It keeps its place when its class
 * did not change; a large block (LOW_FILED_MIN) also when it grew into the
 * next class: it then sits one class low, where list_find looks for it
 * when the request is that large. So the large free block that pairs are
 * cut from and merged back into, across a class boundary, moves once and
 * not twice a pair. Every block of class k still has at least class k's
 * smallest size, which is what list_find relies on. Only large blocks: for
 * the others, placement (and the footprint of bench/traces) is unchanged. */
static inline void list_resize(slist_t *l, blk_t *b, size_t new_size)
{
    l->free_bytes += new_size - b->size; /* modulo arithmetic: shrinking too */
    b->size = new_size;
    unsigned c = class_of(new_size / UNIT);
    if (RK_LIKELY(c == b->cls))
        return;
    if (c == b->cls + 1 && new_size >= LOW_FILED_MIN)
        return;
    list_remove(l, b);
    list_insert(l, b);
}

/* Bytes of b usable for `bytes` at `alignment` after skipping to the alignment. */
static inline int block_fits(const blk_t *b, size_t bytes, size_t alignment)
{
    size_t pad = (size_t)(-(uintptr_t)b->ptr & (alignment - 1));
    return b->size >= pad && b->size - pad >= bytes;
}

/* Best fit among the first blocks of the request's class, else the first
 * block of the next non-empty class (all of which fit). */
static blk_t *list_find_rest(const slist_t *l, unsigned c, size_t bytes, size_t alignment);

/* The smallest block of class c that fits, or best if smaller. */
static blk_t *best_of_class(const slist_t *l, unsigned c, size_t bytes, size_t alignment,
                            blk_t *best)
{
    if (l->bitmap[c / 64] & (1ull << (c % 64)))
        for (blk_t *b = l->heads[c]; b; b = b->fnext)
            if (block_fits(b, bytes, alignment) && (!best || b->size < best->size))
                best = b;
    return best;
}

static blk_t *list_find(const slist_t *l, size_t bytes, size_t alignment)
{
    size_t need = bytes + alignment - UNIT; /* worst-case padding included */
    unsigned c = class_of(need / UNIT);
    blk_t *best = NULL;
    if (l->bitmap[c / 64] & (1ull << (c % 64))) {
        int n = 0;
        for (blk_t *b = l->heads[c]; b && n < BEST_FIT_SCAN; b = b->fnext, n++)
            if (block_fits(b, bytes, alignment) && (!best || b->size < best->size)) {
                best = b;
                if (b->size == bytes)
                    break;
            }
    }
    /* Blocks this large that grew into class c may sit in c - 1 (list_resize). */
    if (RK_UNLIKELY(need >= LOW_FILED_MIN))
        best = best_of_class(l, c - 1, bytes, alignment, best);
    if (best)
        return best;
    unsigned c2 = next_class(l, c + 1);
    if (RK_LIKELY(c2 < NCLASS))
        return l->heads[c2];
    return list_find_rest(l, c, bytes, alignment);
}

/* Nothing in a larger class: the rest of class c before the caller grows. */
static blk_t *list_find_rest(const slist_t *l, unsigned c, size_t bytes, size_t alignment)
{
    blk_t *b = l->heads[c];
    for (int n = 0; b && n < BEST_FIT_SCAN; n++)
        b = b->fnext;
    blk_t *best = NULL;
    for (; b; b = b->fnext)
        if (block_fits(b, bytes, alignment) && (!best || b->size < best->size))
            best = b;
    return best;
}

/* ---- descriptors and stream lists (blocks.h) ---- */

/* A descriptor with no neighbours (the rest is set by whoever uses it). */
static inline blk_t *desc_new(shard_t *sh)
{
    blk_t *b = rk_desc_new(sh, sizeof(blk_t));
    if (RK_LIKELY(b != NULL))
        b->prev = b->next = NULL;
    return b;
}

#define desc_free rk_desc_free

static inline slist_t *list_for(shard_t *sh, rankmem_stream_t stream, int create)
{
    return (slist_t *)rk_list_for(sh, stream, create ? sizeof(slist_t) : 0);
}

static inline slist_t *list_at(const shard_t *sh, size_t k)
{
    return (slist_t *)sh->lists[k];
}

/* Put b (not in any list) into l, merging with free neighbours of the same
 * list. A free neighbour absorbs b and keeps its place in the list (and its
 * class, mostly): a pair that frees next to the block it was cut from costs
 * no list work. */
static void free_into(shard_t *p, slist_t *l, blk_t *b)
{
    blk_t *n = b->next, *v = b->prev;
    if (v && v->owner == l) {
        size_t size = v->size + b->size;
        v->next = n;
        if (n)
            n->prev = v;
        desc_free(p, b);
        if (n && n->owner == l) {
            list_remove(l, n);
            size += n->size;
            v->next = n->next;
            if (v->next)
                v->next->prev = v;
            desc_free(p, n);
        }
        list_resize(l, v, size);
    } else if (n && n->owner == l) {
        n->ptr = b->ptr;
        n->prev = v;
        if (v)
            v->next = n;
        list_resize(l, n, n->size + b->size);
        desc_free(p, b);
    } else {
        list_insert(l, b);
    }
}

/* Cut [b->ptr + off, + len) out of b as a free block of list l placed before
 * (front) or after b. Returns 0 when out of descriptors (b is unchanged). */
static int split_front(shard_t *p, slist_t *l, blk_t *b, size_t len)
{
    blk_t *f = desc_new(p);
    if (!f)
        return 0;
    f->ptr = b->ptr;
    f->size = len;
    f->prev = b->prev;
    f->next = b;
    if (f->prev)
        f->prev->next = f;
    b->prev = f;
    b->ptr += len;
    b->size -= len;
    list_insert(l, f);
    return 1;
}

static int split_back(shard_t *p, slist_t *l, blk_t *b, size_t keep)
{
    blk_t *t = desc_new(p);
    if (!t)
        return 0;
    t->ptr = b->ptr + keep;
    t->size = b->size - keep;
    t->next = b->next;
    t->prev = b;
    if (t->next)
        t->next->prev = t;
    b->next = t;
    b->size = keep;
    list_insert(l, t);
    return 1;
}

/* Move every free block of `from` into `to`, coalescing on the way. */
static void merge_lists(shard_t *p, slist_t *to, slist_t *from)
{
    for (unsigned c = next_class(from, 0); c < NCLASS; c = next_class(from, c)) {
        blk_t *b = from->heads[c];
        list_remove(from, b);
        free_into(p, to, b);
    }
}

/* ---- shards ---- */

static inline shard_t *my_shard(pool_t *p)
{
    return &p->shards[rk_shard_index()];
}

#define shard_ready rk_shard_ready

static void lock_all(pool_t *p)
{
    rk_shards_lock_all(p->shards, sizeof(shard_t));
}

static void unlock_all(pool_t *p)
{
    rk_shards_unlock_all(p->shards, sizeof(shard_t));
}

/* Unlink b from its physical neighbours: it becomes a region of its own. */
static void cut_links(blk_t *b)
{
    if (b->prev)
        b->prev->next = NULL;
    if (b->next)
        b->next->prev = NULL;
    b->prev = b->next = NULL;
}

/* Bytes a stream or shard keeps when it takes memory from another: enough
 * that it does not come back for every request, small next to the pool.
 * A stream that keeps coming back (a growing working set) gets twice as
 * much each time, up to a quarter of the pool, so the events it costs stay
 * logarithmic in what it uses. */
static size_t grant_size(pool_t *p, size_t need, unsigned takes)
{
    size_t held = __atomic_load_n(&p->held, __ATOMIC_RELAXED);
    size_t g = held / (2 * NSHARDS);
    if (g > MAX_GRANT)
        g = MAX_GRANT;
    if (g < MIN_GROWTH)
        g = MIN_GROWTH;
    for (unsigned k = 0; k < takes && k < 8 && g < held / 4; k++)
        g *= 2;
    return g > need ? g : need;
}

/* Add [ptr, ptr+size) to l as a block of its own. */
static int add_region(shard_t *sh, slist_t *l, char *ptr, size_t size)
{
    blk_t *b = desc_new(sh);
    if (!b)
        return 0;
    b->ptr = ptr;
    b->size = size;
    list_insert(l, b);
    return 1;
}

/* The list of the other stream in sh with the most free memory that has a
 * block for the request, or NULL. */
static slist_t *richest_donor(shard_t *sh, slist_t *except, size_t bytes, size_t alignment,
                              blk_t **b_p)
{
    slist_t *donor = NULL;
    for (size_t i = 0; i < sh->nlists; i++) {
        slist_t *t = list_at(sh, i);
        if (t == except || !t->nfree || (donor && t->free_bytes <= donor->free_bytes))
            continue;
        blk_t *b = list_find(t, bytes, alignment);
        if (b) {
            donor = t;
            *b_p = b;
        }
    }
    return donor;
}

/* Cut a region for `stream` out of another shard (sh is not locked). */
static int take_region(pool_t *p, shard_t *sh, rankmem_stream_t stream, size_t bytes,
                       size_t alignment, unsigned takes, char **ptr_p, size_t *size_p,
                       rankmem_status_t *st_p)
{
    size_t need = bytes + alignment - UNIT;
    for (int i = 0; i < NSHARDS; i++) {
        shard_t *d = &p->shards[i];
        if (d == sh)
            continue;
        rk_shard_lock(d);
        blk_t *b = NULL;
        slist_t *t = richest_donor(d, NULL, bytes, alignment, &b);
        if (t) {
            if (p->use_events && t->h.stream != stream) {
                rankmem_status_t st = rk_gpu_stream_wait(stream, t->h.stream, &t->h.event);
                if (st != RANKMEM_SUCCESS) {
                    rk_shard_unlock(d);
                    *st_p = st;
                    return 0;
                }
            }
            size_t g = grant_size(p, need, takes);
            list_remove(t, b);
            if (b->size > g && !split_back(d, t, b, g)) {
                list_insert(t, b); /* no descriptor for the rest: leave it be */
                rk_shard_unlock(d);
                continue;
            }
            cut_links(b);
            *ptr_p = b->ptr;
            *size_p = b->size;
            desc_free(d, b);
            rk_shard_unlock(d);
            return 1;
        }
        rk_shard_unlock(d);
    }
    return 0;
}

static int cmp_chunk(const void *a, const void *b)
{
    const char *x = ((const chunk_t *)a)->ptr, *y = ((const chunk_t *)b)->ptr;
    return x < y ? -1 : x > y;
}

/* Index of the chunk holding ptr (chunks sorted), or nchunks. */
static size_t chunk_of(const pool_t *p, const char *ptr)
{
    size_t lo = 0, hi = p->nchunks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (ptr < p->chunks[mid].ptr)
            hi = mid;
        else if (ptr >= p->chunks[mid].ptr + p->chunks[mid].size)
            lo = mid + 1;
        else
            return mid;
    }
    return p->nchunks;
}

/* Kernels may still use blocks freed on their streams: wait for every stream
 * that holds free memory. Caller holds every shard lock. */
static rankmem_status_t sync_free_streams(pool_t *p)
{
    if (!p->use_events)
        return RANKMEM_SUCCESS;
    for (int i = 0; i < NSHARDS; i++)
        for (size_t k = 0; k < p->shards[i].nlists; k++)
            if (list_at(&p->shards[i], k)->nfree) {
                rankmem_status_t st = rk_gpu_stream_sync(p->shards[i].lists[k]->stream);
                if (st != RANKMEM_SUCCESS)
                    return st;
            }
    return RANKMEM_SUCCESS;
}

typedef struct {
    char *ptr;
    size_t size;
} span_t;

static int cmp_span(const void *a, const void *b)
{
    const char *x = ((const span_t *)a)->ptr, *y = ((const span_t *)b)->ptr;
    return x < y ? -1 : x > y;
}

/* Last resort when the upstream refuses: every free block of every shard,
 * coalesced across shards and streams, into dst's list for stream. Caller
 * holds every shard lock and grow_lock. */
static void defragment_locked(pool_t *p, shard_t *dst, rankmem_stream_t stream)
{
    size_t n = 0;
    for (int i = 0; i < NSHARDS; i++)
        for (size_t k = 0; k < p->shards[i].nlists; k++)
            n += list_at(&p->shards[i], k)->nfree;
    span_t *sp = malloc((n ? n : 1) * sizeof *sp);
    slist_t *l = list_for(dst, stream, 1);
    if (!sp || !l || sync_free_streams(p) != RANKMEM_SUCCESS)
        goto out;
    if (p->nchunks > 1)
        qsort(p->chunks, p->nchunks, sizeof *p->chunks, cmp_chunk);
    /* dst's own streams merge through their links, so later frees of their
     * neighbours still coalesce; other shards' blocks move as regions. */
    for (size_t k = 0; k < dst->nlists; k++)
        if (list_at(dst, k) != l)
            merge_lists(dst, l, list_at(dst, k));
    n = 0;
    for (int i = 0; i < NSHARDS; i++) {
        shard_t *sh = &p->shards[i];
        if (sh == dst)
            continue;
        for (size_t k = 0; k < sh->nlists; k++) {
            slist_t *t = list_at(sh, k);
            for (unsigned c = next_class(t, 0); c < NCLASS; c = next_class(t, c)) {
                blk_t *b = t->heads[c];
                list_remove(t, b);
                cut_links(b);
                sp[n].ptr = b->ptr;
                sp[n++].size = b->size;
                desc_free(sh, b);
            }
        }
    }
    if (n > 1)
        qsort(sp, n, sizeof *sp, cmp_span);
    for (size_t i = 0; i < n;) {
        span_t m = sp[i++];
        size_t c = chunk_of(p, m.ptr);
        /* Never across chunks: each goes back upstream on its own. */
        while (i < n && m.ptr + m.size == sp[i].ptr && chunk_of(p, sp[i].ptr) == c)
            m.size += sp[i++].size;
        if (!add_region(dst, l, m.ptr, m.size))
            break; /* out of host memory: the rest waits for finalize */
    }
out:
    free(sp);
}

static void defragment(pool_t *p, shard_t *dst, rankmem_stream_t stream)
{
    lock_all(p);
    pthread_mutex_lock(&p->grow_lock);
    defragment_locked(p, dst, stream);
    pthread_mutex_unlock(&p->grow_lock);
    unlock_all(p);
}

/* ---- backed pools (pool_backed.h): giving granules back ---- */

typedef struct {
    shard_t *sh;
    slist_t *t;
    blk_t *b;
} cut_t;

/* Mapped bytes a backed pool may hold: the peak live plus a sixty-fourth,
 * or plus the release threshold when that is larger. */
static size_t backed_budget(const pool_t *p)
{
    size_t slack = p->live_high >> 6;
    if (slack < p->backing->release)
        slack = p->backing->release;
    return p->live_high > SIZE_MAX - slack ? SIZE_MAX : p->live_high + slack;
}

/* Give back the granule-aligned interiors of free blocks while more than
 * keep bytes are mapped; the pieces around each interior stay free, cut off
 * from it (the unmapped span is a hole between them). Caller holds every
 * shard lock and grow_lock. */
static rankmem_status_t give_back_locked(pool_t *p, size_t keep, int all)
{
    if (p->held <= keep)
        return RANKMEM_SUCCESS;
    /* Kernels may still use what was freed on a stream: giving back may
     * synchronise (growing never does). */
    rankmem_status_t st = sync_free_streams(p);
    if (st != RANKMEM_SUCCESS)
        return st;
    const uintptr_t gmask = (uintptr_t)p->backing->granule - 1;
    size_t n = 0, cap = 0;
    cut_t *cuts = NULL;
    for (int i = 0; i < NSHARDS; i++)
        for (size_t k = 0; k < p->shards[i].nlists; k++) {
            slist_t *t = list_at(&p->shards[i], k);
            for (unsigned c = next_class(t, 0); c < NCLASS; c = next_class(t, c + 1))
                for (blk_t *b = t->heads[c]; b; b = b->fnext) {
                    uintptr_t a0 = ((uintptr_t)b->ptr + gmask) & ~gmask;
                    uintptr_t a1 = ((uintptr_t)b->ptr + b->size) & ~gmask;
                    if (a1 <= a0)
                        continue;
                    if (n == cap) {
                        size_t nc = cap ? cap * 2 : 64;
                        cut_t *x = realloc(cuts, nc * sizeof *x);
                        if (!x) {
                            free(cuts);
                            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                                            "pool: no host memory to give memory back");
                        }
                        cuts = x;
                        cap = nc;
                    }
                    cuts[n].sh = &p->shards[i];
                    cuts[n].t = t;
                    cuts[n++].b = b;
                }
        }
    /* Handles given back may be made again at once (~60 us each on an
     * H100): when the live bytes reach a new peak, only what is over goes
     * back (a program that grows step by step would otherwise give back and
     * remake its free memory at every step: 1,065 handles made for a peak
     * of 568 granules on the inference trace, 361 this way). When it grows
     * below its peak (fragmentation), every whole free handle goes back:
     * the growth then maps handles of the need's size in the holes, which
     * live blocks pin less (powerlaw.csv: 1.053 this way, 1.072 otherwise). */
    size_t want = all ? SIZE_MAX : 0;
    size_t given = 0;
    for (size_t i = 0; i < n && p->held > keep; i++) {
        shard_t *sh = cuts[i].sh;
        slist_t *t = cuts[i].t;
        blk_t *b = cuts[i].b;
        char *a0 = (char *)(((uintptr_t)b->ptr + gmask) & ~gmask);
        char *a1 = (char *)(((uintptr_t)b->ptr + b->size) & ~gmask);
        size_t over = p->held - keep;
        if (p->backing->fit) { /* whole handles only, as few as cover what is over */
            size_t len = (size_t)(a1 - a0);
            if (!p->backing->fit(p->bctx, &a0, &len, want ? want : over))
                continue;
            a1 = a0 + len;
        } else if ((size_t)(a1 - a0) > over) { /* give back only what is over */
            a1 = a0 + ((over + gmask) & ~gmask);
        }
        list_remove(t, b);
        if ((a1 < b->ptr + b->size && !split_back(sh, t, b, (size_t)(a1 - b->ptr))) ||
            (a0 > b->ptr && !split_front(sh, t, b, (size_t)(a0 - b->ptr)))) {
            free_into(sh, t, b); /* no descriptor: leave it mapped */
            continue;
        }
        st = p->backing->shrink(p->bctx, b->ptr, b->size);
        if (st != RANKMEM_SUCCESS) {
            free_into(sh, t, b);
            break;
        }
        __atomic_store_n(&p->held, p->held - b->size, __ATOMIC_RELAXED);
        given += b->size;
        cut_links(b);
        desc_free(sh, b);
    }
    free(cuts);
    if (given) {
        p->give_backs++;
        p->given += given;
    }
    return st;
}

/* Whether growing a backed pool by need bytes (no shard lock held) would
 * put its mapped bytes past the budget. The budget follows the peak of the
 * live bytes, the request included; summing the shards' live bytes needs
 * every lock, so that is done only when the last known peak does not
 * already allow the growth. */
static int backed_over_budget(pool_t *p, size_t need)
{
    size_t add = rk_align_up(need, p->backing->granule);
    pthread_mutex_lock(&p->grow_lock);
    int fits = p->held + add <= backed_budget(p);
    pthread_mutex_unlock(&p->grow_lock);
    if (fits)
        return 0;
    lock_all(p);
    pthread_mutex_lock(&p->grow_lock);
    size_t live = 0;
    for (int i = 0; i < NSHARDS; i++)
        live += p->shards[i].used;
    p->at_peak = live + need > p->live_high;
    if (p->at_peak)
        p->live_high = live + need;
    fits = p->held + add <= backed_budget(p);
    pthread_mutex_unlock(&p->grow_lock);
    unlock_all(p);
    return !fits;
}

/* Give back wholly free granules until growing by need bytes stays within
 * the budget (or nothing wholly free is left). No shard lock held. */
static void backed_make_room(pool_t *p, size_t need)
{
    size_t add = rk_align_up(need, p->backing->granule);
    lock_all(p);
    pthread_mutex_lock(&p->grow_lock);
    size_t budget = backed_budget(p);
    if (p->held + add > budget) /* a failure only costs room */
        (void)give_back_locked(p, budget > add ? budget - add : 0, !p->at_peak);
    pthread_mutex_unlock(&p->grow_lock);
    unlock_all(p);
}

/* Everything wholly free back to the backing (growth failed: the device may
 * be out of memory, or the maximum reached). */
static void backed_give_back_all(pool_t *p)
{
    lock_all(p);
    pthread_mutex_lock(&p->grow_lock);
    /* Free blocks of different streams (or shards) that share a granule
     * hold no whole granule each: coalesced first, or that granule never
     * goes back (issue 31). */
    defragment_locked(p, &p->shards[0], NULL);
    (void)give_back_locked(p, 0, 1);
    pthread_mutex_unlock(&p->grow_lock);
    unlock_all(p);
}

/* ---- growth ---- */

/* A new chunk of at least need bytes from the upstream (no shard lock held). */
static rankmem_status_t grow(pool_t *p, rankmem_stream_t stream, size_t need, int exact,
                             char **ptr_p, size_t *size_p)
{
    pthread_mutex_lock(&p->grow_lock);
    if (p->backing) {
        /* The backing rounds up to whole granules: no geometric step, the
         * mapped bytes follow the need (a new granule costs no cudaMalloc
         * and no synchronisation). */
        char *mem;
        size_t size;
        rankmem_status_t st = p->backing->grow(p->bctx, need, &mem, &size);
        if (st == RANKMEM_SUCCESS) {
            __atomic_store_n(&p->held, p->held + size, __ATOMIC_RELAXED);
            if (p->held > p->held_high)
                p->held_high = p->held;
            *ptr_p = mem;
            *size_p = size;
        }
        pthread_mutex_unlock(&p->grow_lock);
        return st;
    }
    size_t size = need;
    if (exact)
        ;
    else if (p->growth)
        size = need > p->growth ? need : p->growth;
    else {
        size_t g = p->held >> GROWTH_SHIFT;
        if (g > MAX_GEOMETRIC_GROWTH)
            g = MAX_GEOMETRIC_GROWTH;
        if (g < MIN_GROWTH)
            g = MIN_GROWTH;
        if (size < g)
            size = g;
    }
    if (p->maximum - p->held < size)
        size = p->maximum - p->held;
    rankmem_status_t st = RANKMEM_SUCCESS;
    if (size < need)
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                      "pool: %zu bytes do not fit: %zu of at most %zu bytes held", need, p->held,
                      p->maximum);
    else if (p->nchunks == p->cap_chunks) {
        size_t cap = p->cap_chunks ? p->cap_chunks * 2 : 16;
        chunk_t *c = realloc(p->chunks, cap * sizeof *c);
        if (!c)
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for its chunk table");
        else {
            p->chunks = c;
            p->cap_chunks = cap;
        }
    }
    void *mem = NULL;
    rankmem_resource_t *up = p->base.upstream;
    if (st == RANKMEM_SUCCESS) {
        st = up->ops->allocate(up, size, UNIT, stream, &mem);
        if (st != RANKMEM_SUCCESS && size > need) { /* the geometric step was too greedy */
            size = need;
            st = up->ops->allocate(up, size, UNIT, stream, &mem);
        }
    }
    if (st == RANKMEM_SUCCESS) {
        p->chunks[p->nchunks].ptr = mem;
        p->chunks[p->nchunks].size = size;
        p->nchunks++;
        __atomic_store_n(&p->held, p->held + size, __ATOMIC_RELAXED);
        if (p->held > p->held_high)
            p->held_high = p->held;
        *ptr_p = mem;
        *size_p = size;
    }
    pthread_mutex_unlock(&p->grow_lock);
    return st;
}

static rankmem_status_t pool_trim(rankmem_resource_t *mr, size_t keep_bytes);

/* ---- allocate / deallocate ---- */

/* Called with sh locked when the stream's own list has nothing that fits;
 * returns with sh locked and *b_p in *from_p, or an error. May unlock sh
 * meanwhile, so lists are looked up again after each step. */
static rankmem_status_t find_slow(pool_t *p, shard_t *sh, rankmem_stream_t stream, size_t bytes,
                                  size_t alignment, blk_t **b_p, slist_t **from_p)
{
    slist_t *s = list_for(sh, stream, 0);
    blk_t *b = NULL;
    /* 1. Another stream of this shard. */
    slist_t *donor = richest_donor(sh, s, bytes, alignment, &b);
    if (donor) {
        if (p->use_events) {
            rankmem_status_t st = rk_gpu_stream_wait(stream, donor->h.stream, &donor->h.event);
            if (st != RANKMEM_SUCCESS)
                return st;
        }
        *b_p = b;
        *from_p = donor;
        return RANKMEM_SUCCESS;
    }
    /* 2. A region from another shard. */
    char *ptr;
    size_t size;
    rankmem_status_t st = RANKMEM_SUCCESS;
    unsigned takes = s ? s->takes : 0;
    rk_shard_unlock(sh);
    int got = take_region(p, sh, stream, bytes, alignment, takes, &ptr, &size, &st);
    rk_shard_lock(sh);
    if (st != RANKMEM_SUCCESS)
        return st;
    /* Other threads of this shard may take the new memory before we relock:
     * a few rounds, then give up rather than grow without end. */
    for (int round = 0;; round++) {
        s = list_for(sh, stream, 1);
        if (!s)
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for a stream's list");
        if (got) {
            if (!add_region(sh, s, ptr, size))
                return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for descriptors");
            got = 0;
            s->takes++;
        }
        if ((b = list_find(s, bytes, alignment)) != NULL)
            break;
        if (round == 4)
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                            "pool: %zu bytes: other threads kept taking the new memory", bytes);
        /* 3. Merge this shard's streams: their blocks may coalesce. */
        size_t others = 0;
        for (size_t i = 0; i < sh->nlists; i++)
            if (list_at(sh, i) != s)
                others += list_at(sh, i)->free_bytes;
        if (others && others + s->free_bytes >= bytes) {
            for (size_t i = 0; i < sh->nlists; i++) {
                slist_t *t = list_at(sh, i);
                if (t == s || !t->nfree)
                    continue;
                if (p->use_events && (st = rk_gpu_stream_sync(t->h.stream)) != RANKMEM_SUCCESS)
                    return st;
                merge_lists(sh, s, t);
            }
            if ((b = list_find(s, bytes, alignment)) != NULL)
                break;
        }
        /* 4. A new chunk. Chunks wholly free go back upstream first: they
         * had no room for this request, and held beside the new chunk they
         * would only raise the peak reserved (traces in docs/replay.md). */
        rk_shard_unlock(sh);
        if (p->backing) {
            if (backed_over_budget(p, bytes + alignment - UNIT)) {
                /* Over budget: first every free block coalesced, across
                 * shards and growths (the request may fit then, mapping
                 * nothing), then wholly free granules given back before
                 * mapping new ones. */
                defragment(p, sh, stream);
                rk_shard_lock(sh);
                s = list_for(sh, stream, 1);
                if (s && (b = list_find(s, bytes, alignment)) != NULL)
                    break;
                rk_shard_unlock(sh);
                backed_make_room(p, bytes + alignment - UNIT);
            }
        } else if (bytes + alignment - UNIT <= p->maximum) /* else growing cannot help */
            (void)pool_trim(&p->base, p->initial);
        st = grow(p, stream, bytes + alignment - UNIT, 0, &ptr, &size);
        if (st != RANKMEM_SUCCESS && p->backing) {
            /* Out of device memory or at the maximum: the wholly free
             * granules go back, then once more. */
            backed_give_back_all(p);
            st = grow(p, stream, bytes + alignment - UNIT, 0, &ptr, &size);
        }
        if (st != RANKMEM_SUCCESS) {
            /* 5. Everything, coalesced; the growth error stands if that fails too. */
            char detail[256];
            snprintf(detail, sizeof detail, "%s", rankmem_last_error());
            defragment(p, sh, stream);
            rk_shard_lock(sh);
            s = list_for(sh, stream, 1);
            if (s && (b = list_find(s, bytes, alignment)) != NULL)
                break;
            size_t skip = strlen(rankmem_status_string(st)) + 2; /* rk_error adds "status: " */
            return rk_error(st, "%s", strlen(detail) > skip ? detail + skip : detail);
        }
        got = 1;
        rk_shard_lock(sh);
    }
    *b_p = b;
    *from_p = s;
    return RANKMEM_SUCCESS;
}

/* The first `rounded` bytes of b (free in s, aligned) as an allocated
 * block; the rest keeps b's descriptor and its place in s. NULL when out of
 * descriptors (b unchanged). */
static inline blk_t *carve_front(shard_t *sh, slist_t *s, blk_t *b, size_t rounded)
{
    if (b->size == rounded) {
        list_remove(s, b);
        return b;
    }
    blk_t *f = rk_desc_new(sh, sizeof *f);
    if (RK_UNLIKELY(!f))
        return NULL;
    f->ptr = b->ptr;
    f->size = rounded;
    f->prev = b->prev;
    f->next = b;
    f->owner = NULL;
    if (f->prev)
        f->prev->next = f;
    b->prev = f;
    b->ptr += rounded;
    list_resize(s, b, b->size - rounded);
    return f;
}

/* The other cases: b is from another stream's list `from`, or needs
 * padding for its alignment. *b_p: the allocated block. */
static rankmem_status_t carve_slow(pool_t *p, shard_t *sh, slist_t *s, slist_t *from, blk_t *b,
                                   size_t rounded, size_t alignment, blk_t **b_p)
{
    list_remove(from, b);
    if (from != s) {
        /* Taken from another stream after waiting for it: s keeps a grant of
         * the block; the rest stays with the donor. */
        size_t g = grant_size(p, rounded + alignment - UNIT, s->takes++);
        if (b->size > g && !split_back(sh, from, b, g)) {
            free_into(sh, from, b);
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for block descriptors");
        }
    }
    size_t pad = (size_t)(-(uintptr_t)b->ptr & (alignment - 1));
    /* Leftovers stay in the stream's list: ordered on that stream. */
    if ((pad && !split_front(sh, s, b, pad)) ||
        (b->size > rounded && !split_back(sh, s, b, rounded))) {
        free_into(sh, s, b);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for block descriptors");
    }
    *b_p = b;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t pool_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                      rankmem_stream_t stream, void **ptr_p)
{
    pool_t *p = (pool_t *)mr;
    shard_t *sh = my_shard(p);
    size_t rounded = rk_align_up(bytes, UNIT);
    rankmem_status_t st;
    rk_shard_lock_own(sh);
    if (RK_UNLIKELY((st = shard_ready(sh)) != RANKMEM_SUCCESS))
        goto out;
    slist_t *s = list_for(sh, stream, 1);
    if (RK_UNLIKELY(!s)) {
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for a stream's free list");
        goto out;
    }
    blk_t *b = list_find(s, rounded, alignment);
    slist_t *from = s;
    if (RK_UNLIKELY(!b)) {
        st = find_slow(p, sh, stream, rounded, alignment, &b, &from);
        if (st != RANKMEM_SUCCESS)
            goto out;
        s = list_for(sh, stream, 1); /* find_slow made sure it exists */
    }
    if (RK_LIKELY(from == s) && RK_LIKELY(((uintptr_t)b->ptr & (alignment - 1)) == 0)) {
        b = carve_front(sh, s, b, rounded);
        if (RK_UNLIKELY(!b)) {
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for block descriptors");
            goto out;
        }
    } else if ((st = carve_slow(p, sh, s, from, b, rounded, alignment, &b)) != RANKMEM_SUCCESS)
        goto out;
    st = rk_live_add(sh, b->ptr, b, bytes);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS)) {
        free_into(sh, s, b);
        goto out;
    }
    b->req = bytes;
    *ptr_p = b->ptr;
out:
    rk_shard_unlock(sh);
    return st;
}

/* Free b (live in sh, which is locked) on stream. */
/* Inline in both callers: pool_deallocate is the hot path. */
static inline __attribute__((always_inline)) rankmem_status_t
free_in(pool_t *p, shard_t *sh, size_t slot, void *ptr, size_t bytes, rankmem_stream_t stream)
{
    blk_t *b = sh->live_map.slots[slot].value;
    if (RK_UNLIKELY(b->req != bytes))
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "pool: %p freed with size %zu but allocated with %zu; not freed", ptr,
                        bytes, b->req);
    slist_t *s = list_for(sh, stream, 1);
    if (RK_UNLIKELY(!s)) {
        /* No host memory for a new list: wait for the stream, then any list is safe. */
        rankmem_status_t st;
        if (p->use_events && (st = rk_gpu_stream_sync(stream)) != RANKMEM_SUCCESS)
            return st;
        if (!sh->nlists)
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory to free %p", ptr);
        s = list_at(sh, 0);
    }
    rk_live_drop(sh, slot, bytes);
    free_into(sh, s, b);
    return RANKMEM_SUCCESS;
}

/* Free ptr from the shard that holds it: mine first (unless the caller just
 * looked there), then the others; an error when none does. */
static inline __attribute__((always_inline)) rankmem_status_t
free_anywhere(pool_t *p, shard_t *mine, int mine_seen, void *ptr, size_t bytes,
              rankmem_stream_t stream)
{
    size_t slot;
    shard_t *sh = rk_shard_find_live(p->shards, sizeof(shard_t), mine, mine_seen, ptr, &slot);
    if (RK_LIKELY(sh != NULL)) {
        rankmem_status_t st = free_in(p, sh, slot, ptr, bytes, stream);
        rk_shard_unlock(sh);
        return st;
    }
    return rk_error(RANKMEM_ERR_INVALID_POINTER,
                    "pool: %p (%zu bytes) is not a live allocation of this pool "
                    "(double free, or memory from elsewhere)",
                    ptr, bytes);
}

static rankmem_status_t pool_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                        size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    pool_t *p = (pool_t *)mr;
    /* Mostly the thread that allocated frees: its shard first. */
    return free_anywhere(p, my_shard(p), 0, ptr, bytes, stream);
}

/* The calling thread's shard locked once for every block it holds (the
 * usual case: a thread gives back what it allocated); the others then one
 * by one in the other shards, which also reports those that are nobody's. */
static rankmem_status_t pool_deallocate_many(rankmem_resource_t *mr, const rankmem_block_t *blocks,
                                             size_t n, rankmem_stream_t stream,
                                             rankmem_status_t *status)
{
    pool_t *p = (pool_t *)mr;
    shard_t *mine = my_shard(p);
    rankmem_status_t first = RANKMEM_SUCCESS;
    uint64_t away[RK_BATCH / 64] = {0}; /* not in this shard */
    rk_shard_lock(mine);
    for (size_t i = 0; i < n; i++) {
        const rankmem_block_t *bl = &blocks[i];
        size_t slot = rk_live_find(mine, bl->ptr);
        if (slot == SIZE_MAX)
            away[i / 64] |= (uint64_t)1 << (i % 64);
        else
            status[i] = free_in(p, mine, slot, bl->ptr, bl->bytes, stream);
    }
    rk_shard_unlock(mine);
    for (size_t i = 0; i < n; i++) {
        if (away[i / 64] >> (i % 64) & 1)
            status[i] = free_anywhere(p, mine, 1, blocks[i].ptr, blocks[i].bytes, stream);
        if (status[i] != RANKMEM_SUCCESS && first == RANKMEM_SUCCESS)
            first = status[i];
    }
    return first;
}

/* ---- queries, trim, forget, finalize ---- */

/* The largest free block of a list: its highest non-empty class holds it
 * (classes order sizes), found among that class's blocks. */
static size_t largest_in(const slist_t *l)
{
    for (int w = NWORDS - 1; w >= 0; w--) {
        if (!l->bitmap[w])
            continue;
        unsigned c = (unsigned)w * 64 + 63u - (unsigned)__builtin_clzll(l->bitmap[w]);
        size_t best = 0;
        for (const blk_t *b = l->heads[c]; b; b = b->fnext)
            if (b->size > best)
                best = b->size;
        return best;
    }
    return 0;
}

static rankmem_status_t pool_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    pool_t *p = (pool_t *)mr;
    size_t v = 0;
    switch (what) {
    case RANKMEM_QUERY_RESERVED_CURRENT:
    case RANKMEM_QUERY_RESERVED_HIGH:
        pthread_mutex_lock(&p->grow_lock);
        v = what == RANKMEM_QUERY_RESERVED_CURRENT ? p->held : p->held_high;
        pthread_mutex_unlock(&p->grow_lock);
        break;
    case RANKMEM_QUERY_POOL_MAX: v = p->maximum; break;
    case RANKMEM_QUERY_USED_CURRENT:
    case RANKMEM_QUERY_USED_HIGH:
    case RANKMEM_QUERY_LIVE_COUNT: v = rk_shards_sum(p->shards, sizeof(shard_t), what); break;
    case RANKMEM_QUERY_FREE_BLOCKS:
    case RANKMEM_QUERY_LARGEST_FREE:
        for (int i = 0; i < NSHARDS; i++) {
            shard_t *sh = &p->shards[i];
            rk_shard_lock(sh);
            for (size_t k = 0; k < sh->nlists; k++) {
                if (what == RANKMEM_QUERY_FREE_BLOCKS) {
                    v += list_at(sh, k)->nfree;
                } else {
                    size_t m = largest_in(list_at(sh, k));
                    v = m > v ? m : v;
                }
            }
            rk_shard_unlock(sh);
        }
        break;
    default:
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "pool: unknown query %d", (int)what);
    }
    *value_p = v;
    return RANKMEM_SUCCESS;
}

/* Give every wholly free chunk back upstream while more than keep_bytes are held. */
static rankmem_status_t pool_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    pool_t *p = (pool_t *)mr;
    rankmem_resource_t *up = p->base.upstream;
    lock_all(p);
    pthread_mutex_lock(&p->grow_lock);
    if (p->backing) { /* granules, not chunks */
        /* Coalesced across streams and shards first, as backed_give_back_all:
         * else trim(0) with nothing live left granules mapped. */
        if (p->held > keep_bytes)
            defragment_locked(p, &p->shards[0], NULL);
        rankmem_status_t st = give_back_locked(p, keep_bytes, 0);
        pthread_mutex_unlock(&p->grow_lock);
        unlock_all(p);
        return st;
    }
    rankmem_status_t result = sync_free_streams(p);
    size_t *free_in_chunk = calloc(p->nchunks + 1, sizeof *free_in_chunk);
    if (!free_in_chunk && result == RANKMEM_SUCCESS)
        result = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory to trim");
    if (result != RANKMEM_SUCCESS)
        goto out;
    if (p->nchunks > 1)
        qsort(p->chunks, p->nchunks, sizeof *p->chunks, cmp_chunk);
    for (int i = 0; i < NSHARDS; i++)
        for (size_t k = 0; k < p->shards[i].nlists; k++) {
            slist_t *t = list_at(&p->shards[i], k);
            for (unsigned c = next_class(t, 0); c < NCLASS; c = next_class(t, c + 1))
                for (blk_t *b = t->heads[c]; b; b = b->fnext)
                    free_in_chunk[chunk_of(p, b->ptr)] += b->size;
        }
    /* Give back the chunks wholly free; mark them SIZE_MAX. */
    for (size_t c = 0; c < p->nchunks && p->held > keep_bytes; c++) {
        size_t size = p->chunks[c].size;
        if (free_in_chunk[c] != size || p->held - size < keep_bytes)
            continue;
        rankmem_status_t st = up->ops->deallocate(up, p->chunks[c].ptr, size, UNIT, NULL);
        if (st != RANKMEM_SUCCESS) {
            result = st;
            break;
        }
        free_in_chunk[c] = SIZE_MAX; /* gone: its blocks are dropped below */
        __atomic_store_n(&p->held, p->held - size, __ATOMIC_RELAXED);
    }
    for (int i = 0; i < NSHARDS; i++)
        for (size_t k = 0; k < p->shards[i].nlists; k++) {
            slist_t *t = list_at(&p->shards[i], k);
            for (unsigned c = next_class(t, 0); c < NCLASS; c = next_class(t, c + 1))
                for (blk_t *b = t->heads[c], *nx; b; b = nx) {
                    nx = b->fnext;
                    if (free_in_chunk[chunk_of(p, b->ptr)] == SIZE_MAX) {
                        list_remove(t, b);
                        cut_links(b);
                        desc_free(&p->shards[i], b);
                    }
                }
        }
    size_t n = 0;
    for (size_t c = 0; c < p->nchunks; c++)
        if (free_in_chunk[c] != SIZE_MAX)
            p->chunks[n++] = p->chunks[c];
    p->nchunks = n;
out:
    free(free_in_chunk);
    pthread_mutex_unlock(&p->grow_lock);
    unlock_all(p);
    return result;
}

static const rankmem_resource_ops_t pool_ops;

static rankmem_status_t forget_stream(pool_t *p, rankmem_stream_t stream)
{
    int synced = 0;
    for (int i = 0; i < NSHARDS; i++) {
        shard_t *sh = &p->shards[i];
        rk_shard_lock(sh);
        slist_t *l = list_for(sh, stream, 0);
        if (l) {
            if (p->use_events && !synced) {
                rankmem_status_t st = rk_gpu_stream_sync(stream);
                if (st != RANKMEM_SUCCESS) {
                    rk_shard_unlock(sh);
                    return st;
                }
                synced = 1;
            }
            /* Its work is done: its blocks now belong to the default stream. */
            slist_t *d = list_for(sh, NULL, 0);
            if (!d) {
                l->h.stream = NULL;
            } else {
                merge_lists(sh, d, l);
                rk_list_drop(sh, &l->h);
            }
            sh->hint = NULL;
        }
        rk_shard_unlock(sh);
    }
    return RANKMEM_SUCCESS;
}

/* Every pool of the chain forgets the stream, so users can call it on the
 * chain they hold (stats>pool>cuda) rather than dig out the pool. */
rankmem_status_t rankmem_pool_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_pool_forget_stream: NULL resource");
    int pools = 0;
    for (rankmem_resource_t *r = mr; r; r = r->upstream)
        if (r->ops == &pool_ops) {
            pools++;
            if (stream) { /* the default stream is never destroyed */
                rankmem_status_t st = forget_stream((pool_t *)r, stream);
                if (st != RANKMEM_SUCCESS)
                    return st;
            }
        }
    if (!pools)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_pool_forget_stream: no pool in the chain of '%s'", mr->ops->name);
    return RANKMEM_SUCCESS;
}

static void pool_free_host_state(pool_t *p)
{
    rk_shards_free(p->shards, sizeof(shard_t));
    free(p->chunks);
    pthread_mutex_destroy(&p->grow_lock);
    free(p);
}

static rankmem_status_t pool_finalize(rankmem_resource_t *mr)
{
    pool_t *p = (pool_t *)mr;
    rankmem_resource_t *up = p->base.upstream;
    rankmem_status_t result = RANKMEM_SUCCESS;
    size_t used, live = rk_shards_live(p->shards, sizeof(shard_t), &used);
    if (live)
        result = rk_error(RANKMEM_ERR_BUSY,
                          "pool: released with %zu live allocations (%zu bytes); their memory "
                          "went back to the upstream",
                          live, used);
    if (p->shards)
        sync_free_streams(p);
    for (size_t i = 0; i < p->nchunks; i++) {
        rankmem_status_t st = up->ops->deallocate(up, p->chunks[i].ptr, p->chunks[i].size, UNIT,
                                                  NULL);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
    }
    pool_free_host_state(p);
    return result;
}

/* Spec syntax; only what differs from the defaults, so "pool" reads as it was written. */
static int pool_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const pool_t *p = (const pool_t *)mr;
    char opts[128] = "", sz[40];
    size_t o = 0;
    if (p->initial) {
        rk_format_size(sz, sizeof sz, p->initial);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",initial=%s", sz);
    }
    if (p->maximum != SIZE_MAX) {
        rk_format_size(sz, sizeof sz, p->maximum);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",max=%s", sz);
    }
    if (p->growth) {
        rk_format_size(sz, sizeof sz, p->growth);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",growth=%s", sz);
    }
    return o ? snprintf(buf, len, "pool(%s)", opts + 1) : snprintf(buf, len, "pool");
}

static rankmem_status_t pool_forget_op(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    return stream ? forget_stream((pool_t *)mr, stream) : RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t pool_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "pool",
    .allocate = pool_allocate,
    .deallocate = pool_deallocate,
    .query = pool_query,
    .trim = pool_trim,
    .finalize = pool_finalize,
    .describe = pool_describe,
    .forget_stream = pool_forget_op,
    .deallocate_many = pool_deallocate_many,
};

rankmem_status_t rankmem_pool_params_default(rankmem_pool_params_t *params_p)
{
    if (!params_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_pool_params_default: NULL output");
    params_p->size = sizeof *params_p;
    params_p->initial_size = 0;
    params_p->maximum_size = SIZE_MAX;
    params_p->growth_size = 0;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t pool_new(rankmem_resource_t *upstream, const rankmem_pool_params_t *prm,
                                 unsigned props, int device, const rk_pool_backing_t *backing,
                                 void *bctx, rankmem_resource_t **mr_p);

rankmem_status_t rankmem_pool_create(rankmem_resource_t *upstream,
                                     const rankmem_pool_params_t *params,
                                     rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_pool_create: NULL %s",
                        upstream ? "output" : "upstream");
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    if (params) {
        if (params->size < sizeof(size_t) * 3 || params->size > sizeof prm)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_pool_create: params.size %zu is not that of "
                            "rankmem_pool_params_t (%zu); set it with "
                            "rankmem_pool_params_default()",
                            params->size, sizeof prm);
        memcpy(&prm, params, params->size);
    }
    if (prm.maximum_size == 0)
        prm.maximum_size = SIZE_MAX;
    if (prm.initial_size > prm.maximum_size)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_pool_create: initial size %zu exceeds maximum size %zu",
                        prm.initial_size, prm.maximum_size);
    if (prm.initial_size > SIZE_MAX / 2 || prm.growth_size > SIZE_MAX / 2)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_pool_create: sizes too large");
    /* Sizes are kept in whole units: a maximum rounds down, the rest round up. */
    if (prm.maximum_size != SIZE_MAX)
        prm.maximum_size &= ~(UNIT - 1);
    if (prm.maximum_size == 0)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_pool_create: maximum size %zu is below one block (%zu bytes)",
                        params->maximum_size, (size_t)UNIT);
    prm.initial_size = rk_align_up(prm.initial_size, UNIT);
    prm.growth_size = rk_align_up(prm.growth_size, UNIT);

    unsigned props = upstream->props & (RANKMEM_PROP_DEVICE_ACCESSIBLE |
                                         RANKMEM_PROP_HOST_ACCESSIBLE);
    return pool_new(upstream, &prm, props, upstream->device, NULL, NULL, mr_p);
}

/* A new pool over upstream, or (upstream NULL) over a backing. */
static rankmem_status_t pool_new(rankmem_resource_t *upstream, const rankmem_pool_params_t *prm,
                                 unsigned props, int device, const rk_pool_backing_t *backing,
                                 void *bctx, rankmem_resource_t **mr_p)
{
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(pool_t), &pool_ops,
                                          props | RANKMEM_PROP_STREAM_ORDERED, upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    pool_t *p = (pool_t *)mr;
    p->base.device = device; /* the pool's memory lives where the upstream's does */
    p->initial = prm->initial_size;
    p->maximum = prm->maximum_size;
    p->growth = prm->growth_size;
    p->backing = backing;
    p->bctx = bctx;
    p->use_events = (props & RANKMEM_PROP_DEVICE_ACCESSIBLE) && rk_gpu_count() > 0;
    pthread_mutex_init(&p->grow_lock, NULL);
    void *shards = NULL;
    if (rk_shards_new(sizeof(shard_t), &shards) != RANKMEM_SUCCESS) {
        pool_free_host_state(p);
        if (upstream)
            rankmem_resource_release(upstream);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for its shards");
    }
    p->shards = shards;
    if (p->initial) {
        shard_t *sh = my_shard(p);
        char *ptr;
        size_t size;
        slist_t *l = NULL;
        st = shard_ready(sh);
        if (st == RANKMEM_SUCCESS && !(l = list_for(sh, NULL, 1)))
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for its free lists");
        if (st == RANKMEM_SUCCESS)
            st = grow(p, NULL, p->initial, 1, &ptr, &size);
        if (st == RANKMEM_SUCCESS && !add_region(sh, l, ptr, size))
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for descriptors");
    }
    if (st != RANKMEM_SUCCESS) {
        /* Nothing was handed out: undo by hand, the upstream reference too. */
        pool_finalize(mr);
        if (upstream)
            rankmem_resource_release(upstream);
        return st;
    }
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_pool_create_backed(const rk_pool_backing_t *ops, void *ctx, unsigned props,
                                       int device, rankmem_resource_t **mr_p)
{
    if (!ops || !ops->grow || !ops->shrink || !mr_p || !rk_is_pow2(ops->granule) ||
        ops->granule < UNIT)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "pool: bad backing");
    rankmem_pool_params_t prm;
    rankmem_pool_params_default(&prm);
    return pool_new(NULL, &prm, props, device, ops, ctx, mr_p);
}

rankmem_status_t rk_pool_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                  rankmem_stream_t stream, void **ptr_p)
{
    return pool_allocate(mr, bytes, alignment, stream, ptr_p);
}

rankmem_status_t rk_pool_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                    size_t alignment, rankmem_stream_t stream)
{
    return pool_deallocate(mr, ptr, bytes, alignment, stream);
}

int rk_pool_is_live(rankmem_resource_t *mr, const void *ptr, size_t bytes)
{
    pool_t *p = (pool_t *)mr;
    int live = 0;
    for (int i = 0; i < NSHARDS && !live; i++) {
        shard_t *sh = &p->shards[i];
        rk_shard_lock(sh);
        size_t slot = rk_live_find(sh, ptr);
        if (slot != SIZE_MAX)
            live = ((blk_t *)sh->live_map.slots[slot].value)->req == bytes;
        rk_shard_unlock(sh);
    }
    return live;
}

/* The live block holding ptr (an interior pointer too): a walk over every
 * shard's live map, for export (not a hot path). 1 and its start and
 * requested bytes, or 0. */
int rk_pool_live_block(rankmem_resource_t *mr, const void *ptr, char **start_p, size_t *req_p)
{
    pool_t *p = (pool_t *)mr;
    const char *q = ptr;
    int found = 0;
    for (int i = 0; i < NSHARDS && !found; i++) {
        shard_t *sh = &p->shards[i];
        rk_shard_lock(sh);
        const rk_ptrmap_t *m = &sh->live_map;
        for (size_t s = 0; m->slots && s <= m->mask && !found; s++) {
            const blk_t *b = m->slots[s].value;
            if (m->slots[s].key && q >= b->ptr && q < b->ptr + (b->req ? b->req : 1)) {
                *start_p = b->ptr;
                *req_p = b->req;
                found = 1;
            }
        }
        rk_shard_unlock(sh);
    }
    return found;
}

void rk_pool_backed_counters(rankmem_resource_t *mr, size_t *give_backs_p, size_t *given_bytes_p,
                             size_t *live_high_p)
{
    pool_t *p = (pool_t *)mr;
    pthread_mutex_lock(&p->grow_lock);
    *give_backs_p = p->give_backs;
    *given_bytes_p = p->given;
    *live_high_p = p->live_high;
    pthread_mutex_unlock(&p->grow_lock);
}
