/* pool: a coalescing, stream-ordered best-fit suballocator over any upstream.
 *
 * Device memory has no room for headers, so every block is described by a
 * host-side descriptor: its address range, its physical neighbours inside the
 * chunk it was cut from (address order, for coalescing) and, while free, the
 * free list it sits in. A pointer-keyed hash map finds the descriptor of a
 * live block on deallocate; a pointer it does not know (double free, foreign
 * or interior pointer) is refused before anything is touched.
 *
 * Free blocks live in one list per stream: a block freed on stream S may be
 * reused by S at once, in stream order. Each list is segregated by size class
 * (TLSF-style: 8 linear sub-classes per power of two, bitmaps to find the
 * next non-empty class), so a best fit within the request's class, or the
 * first block of the next non-empty class, is found in constant time.
 *
 * When S's list has nothing that fits, the pool takes a block from the
 * stream T with the most free memory and makes S wait for T's work so far
 * (one event record and one stream wait: no CUDA call happens on the path
 * served from S's own list). S keeps a grant of up to STEAL_GRANT bytes of
 * that block, so a new stream pays this once, not on every request. If no single list has a fit but the lists together hold enough, it
 * synchronises those streams and merges their blocks into S's list, where
 * neighbours coalesce; only then does it grow by asking the upstream for a
 * new chunk. Host-only upstreams have no streams to order: there the same
 * moves are free.
 *
 * One lock per pool guards everything; it is an adaptive mutex (spins briefly
 * before sleeping), held for a few dozen nanoseconds per call. */
#define _GNU_SOURCE
#include "internal.h"
#include "ptrmap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define UNIT RANKMEM_DEFAULT_ALIGNMENT /* block sizes are multiples of this */
#define NCLASS 448
#define NWORDS (NCLASS / 64)
#define BEST_FIT_SCAN 16   /* blocks examined in the request's own class */
#define DESC_SLAB 256      /* descriptors allocated together */
#define MIN_GROWTH ((size_t)2 << 20)
#define STEAL_GRANT ((size_t)64 << 20) /* what a stream keeps when it takes from another */
#define MAX_GEOMETRIC_GROWTH ((size_t)4 << 30)

typedef struct blk blk_t;
typedef struct slist slist_t;

struct blk {
    char *ptr;
    size_t size;
    blk_t *prev, *next;   /* physical neighbours in the chunk; NULL at its ends */
    blk_t *fprev, *fnext; /* free-list links (also the spare-descriptor chain) */
    slist_t *owner;       /* the free list holding it; NULL while allocated */
    size_t req;           /* bytes the user asked for, while allocated */
    unsigned cls;         /* size class, while free */
};

struct slist {
    rankmem_stream_t stream;
    void *event; /* recorded on stream when another stream takes its memory */
    size_t free_bytes, nfree;
    uint64_t bitmap[NWORDS];
    blk_t *heads[NCLASS];
};

typedef struct {
    char *ptr;
    size_t size;
} chunk_t;

typedef struct desc_slab {
    struct desc_slab *next;
    blk_t d[DESC_SLAB];
} desc_slab_t;

typedef struct {
    rankmem_resource_t base;
    pthread_mutex_t lock;
    size_t initial, maximum, growth;
    int use_events; /* upstream memory is used by kernels: order streams with events */
    size_t held, held_high, used, used_high, live;
    slist_t **lists; /* lists[0] is the default stream's */
    size_t nlists, cap_lists;
    slist_t *hint; /* the list used last: consecutive calls mostly use one stream */
    chunk_t *chunks;
    size_t nchunks, cap_chunks;
    rk_ptrmap_t live_map;
    blk_t *spare;
    desc_slab_t *slabs;
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

/* Bytes of b usable for `bytes` at `alignment` after skipping to the alignment. */
static inline int block_fits(const blk_t *b, size_t bytes, size_t alignment)
{
    size_t pad = (size_t)(-(uintptr_t)b->ptr & (alignment - 1));
    return b->size >= pad && b->size - pad >= bytes;
}

/* Best fit among the first blocks of the request's class, else the first
 * block of the next non-empty class (all of which fit). */
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
        if (best)
            return best;
    }
    unsigned c2 = next_class(l, c + 1);
    return c2 < NCLASS ? l->heads[c2] : NULL;
}

/* ---- descriptors ---- */

static blk_t *desc_new(pool_t *p)
{
    if (RK_UNLIKELY(!p->spare)) {
        desc_slab_t *s = malloc(sizeof *s);
        if (!s)
            return NULL;
        s->next = p->slabs;
        p->slabs = s;
        for (int i = 0; i < DESC_SLAB; i++) {
            s->d[i].fnext = p->spare;
            p->spare = &s->d[i];
        }
    }
    blk_t *b = p->spare;
    p->spare = b->fnext;
    memset(b, 0, sizeof *b);
    return b;
}

static inline void desc_free(pool_t *p, blk_t *b)
{
    b->fnext = p->spare;
    p->spare = b;
}

/* ---- stream lists ---- */

static slist_t *list_for(pool_t *p, rankmem_stream_t stream, int create)
{
    if (RK_LIKELY(p->hint != NULL && p->hint->stream == stream))
        return p->hint;
    for (size_t i = 0; i < p->nlists; i++)
        if (p->lists[i]->stream == stream)
            return p->hint = p->lists[i];
    if (!create)
        return NULL;
    if (p->nlists == p->cap_lists) {
        size_t cap = p->cap_lists ? p->cap_lists * 2 : 8;
        slist_t **l = realloc(p->lists, cap * sizeof *l);
        if (!l)
            return NULL;
        p->lists = l;
        p->cap_lists = cap;
    }
    slist_t *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->stream = stream;
    p->lists[p->nlists++] = l;
    return p->hint = l;
}

/* Put b (not in any list) into l, merging with free neighbours of the same list. */
static void free_into(pool_t *p, slist_t *l, blk_t *b)
{
    blk_t *n = b->next;
    if (n && n->owner == l) {
        list_remove(l, n);
        b->size += n->size;
        b->next = n->next;
        if (b->next)
            b->next->prev = b;
        desc_free(p, n);
    }
    blk_t *v = b->prev;
    if (v && v->owner == l) {
        list_remove(l, v);
        v->size += b->size;
        v->next = b->next;
        if (v->next)
            v->next->prev = v;
        desc_free(p, b);
        b = v;
    }
    list_insert(l, b);
}

/* Cut [b->ptr + off, + len) out of b as a free block of list l placed before
 * (front) or after b. Returns 0 when out of descriptors (b is unchanged). */
static int split_front(pool_t *p, slist_t *l, blk_t *b, size_t len)
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

static int split_back(pool_t *p, slist_t *l, blk_t *b, size_t keep)
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
static void merge_lists(pool_t *p, slist_t *to, slist_t *from)
{
    for (unsigned c = next_class(from, 0); c < NCLASS; c = next_class(from, c)) {
        blk_t *b = from->heads[c];
        list_remove(from, b);
        free_into(p, to, b);
    }
}

/* ---- growth ---- */

static rankmem_status_t grow(pool_t *p, slist_t *l, size_t need, int exact)
{
    size_t size = need;
    if (exact)
        ;
    else if (p->growth)
        size = need > p->growth ? need : p->growth;
    else {
        size_t g = p->held < MAX_GEOMETRIC_GROWTH ? p->held : MAX_GEOMETRIC_GROWTH;
        if (g < MIN_GROWTH)
            g = MIN_GROWTH;
        if (size < g)
            size = g;
    }
    if (p->maximum - p->held < size)
        size = p->maximum - p->held;
    if (size < need)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "pool: %zu bytes do not fit: %zu of at most %zu bytes held, %zu in use",
                        need, p->held, p->maximum, p->used);
    if (p->nchunks == p->cap_chunks) {
        size_t cap = p->cap_chunks ? p->cap_chunks * 2 : 16;
        chunk_t *c = realloc(p->chunks, cap * sizeof *c);
        if (!c)
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for its chunk table");
        p->chunks = c;
        p->cap_chunks = cap;
    }
    blk_t *b = desc_new(p);
    if (!b)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for block descriptors");
    void *mem = NULL;
    rankmem_resource_t *up = p->base.upstream;
    rankmem_status_t st = up->ops->allocate(up, size, UNIT, l->stream, &mem);
    if (st != RANKMEM_SUCCESS && size > need) { /* the geometric step was too greedy */
        size = need;
        st = up->ops->allocate(up, size, UNIT, l->stream, &mem);
    }
    if (st != RANKMEM_SUCCESS) {
        desc_free(p, b);
        return st;
    }
    p->chunks[p->nchunks].ptr = mem;
    p->chunks[p->nchunks].size = size;
    p->nchunks++;
    p->held += size;
    if (p->held > p->held_high)
        p->held_high = p->held;
    b->ptr = mem;
    b->size = size;
    list_insert(l, b);
    return RANKMEM_SUCCESS;
}

/* ---- allocate / deallocate ---- */

/* A block that fits, from s's list, another stream's list, a merge of all
 * lists or a new chunk, in that order of cost. Sets *from to its list. */
static rankmem_status_t find_block(pool_t *p, slist_t *s, size_t bytes, size_t alignment,
                                   blk_t **b_p, slist_t **from)
{
    blk_t *b = list_find(s, bytes, alignment);
    if (RK_LIKELY(b != NULL)) {
        *b_p = b;
        *from = s;
        return RANKMEM_SUCCESS;
    }
    /* Take from the stream with the most free memory: it is the least likely
     * to need the block back, and the grant (below) then leaves s stocked. */
    size_t others = 0;
    slist_t *donor = NULL;
    blk_t *found = NULL;
    for (size_t i = 0; i < p->nlists; i++) {
        slist_t *t = p->lists[i];
        if (t == s || !t->nfree)
            continue;
        others += t->free_bytes;
        if (donor && t->free_bytes <= donor->free_bytes)
            continue;
        b = list_find(t, bytes, alignment);
        if (b) {
            donor = t;
            found = b;
        }
    }
    if (found) {
        if (p->use_events) {
            rankmem_status_t st = rk_gpu_stream_wait(s->stream, donor->stream, &donor->event);
            if (st != RANKMEM_SUCCESS)
                return st;
        }
        *b_p = found;
        *from = donor;
        return RANKMEM_SUCCESS;
    }
    /* Last resort before growing: blocks of several streams may coalesce. */
    if (others && others + s->free_bytes >= bytes) {
        for (size_t i = 0; i < p->nlists; i++) {
            slist_t *t = p->lists[i];
            if (t == s || !t->nfree)
                continue;
            if (p->use_events) {
                rankmem_status_t st = rk_gpu_stream_sync(t->stream);
                if (st != RANKMEM_SUCCESS)
                    return st;
            }
            merge_lists(p, s, t);
        }
        b = list_find(s, bytes, alignment);
        if (b) {
            *b_p = b;
            *from = s;
            return RANKMEM_SUCCESS;
        }
    }
    rankmem_status_t st = grow(p, s, bytes + alignment - UNIT, 0);
    if (st != RANKMEM_SUCCESS)
        return st;
    b = list_find(s, bytes, alignment);
    if (!b)
        return rk_error(RANKMEM_ERR_INTERNAL, "pool: a new chunk does not fit %zu bytes", bytes);
    *b_p = b;
    *from = s;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t pool_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                      rankmem_stream_t stream, void **ptr_p)
{
    pool_t *p = (pool_t *)mr;
    size_t rounded = rk_align_up(bytes, UNIT);
    rankmem_status_t st;
    pthread_mutex_lock(&p->lock);
    slist_t *s = list_for(p, stream, 1);
    if (RK_UNLIKELY(!s)) {
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for a stream's free list");
        goto out;
    }
    blk_t *b = NULL;
    slist_t *from = NULL;
    st = find_block(p, s, rounded, alignment, &b, &from);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
        goto out;
    list_remove(from, b);
    if (from != s) {
        /* Taken from another stream after waiting for it: s keeps a grant of
         * up to STEAL_GRANT (its next requests are then served from its own
         * list, with no more events); the rest stays with the donor. */
        size_t grant = rounded + alignment - UNIT;
        if (grant < STEAL_GRANT)
            grant = STEAL_GRANT;
        if (b->size > grant && !split_back(p, from, b, grant)) {
            free_into(p, from, b);
            st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for block descriptors");
            goto out;
        }
        from = s;
    }
    size_t pad = (size_t)(-(uintptr_t)b->ptr & (alignment - 1));
    /* Leftovers stay in the list they came from: ordered on that stream. */
    if ((pad && !split_front(p, from, b, pad)) ||
        (b->size > rounded && !split_back(p, from, b, rounded))) {
        free_into(p, from, b);
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for block descriptors");
        goto out;
    }
    st = rk_ptrmap_insert(&p->live_map, b->ptr, b);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS)) {
        free_into(p, from, b);
        goto out;
    }
    b->req = bytes;
    p->live++;
    p->used += bytes;
    if (p->used > p->used_high)
        p->used_high = p->used;
    *ptr_p = b->ptr;
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

static rankmem_status_t pool_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                        size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    pool_t *p = (pool_t *)mr;
    rankmem_status_t st = RANKMEM_SUCCESS;
    pthread_mutex_lock(&p->lock);
    blk_t *b = rk_ptrmap_get(&p->live_map, ptr);
    if (RK_UNLIKELY(!b)) {
        st = rk_error(RANKMEM_ERR_INVALID_POINTER,
                      "pool: %p (%zu bytes) is not a live allocation of this pool "
                      "(double free, or memory from elsewhere)",
                      ptr, bytes);
        goto out;
    }
    if (RK_UNLIKELY(b->req != bytes)) {
        st = rk_error(RANKMEM_ERR_INVALID_POINTER,
                      "pool: %p freed with size %zu but allocated with %zu; not freed", ptr, bytes,
                      b->req);
        goto out;
    }
    slist_t *s = list_for(p, stream, 1);
    if (RK_UNLIKELY(!s)) {
        /* No host memory for a new list: wait for the stream, then any list is safe. */
        if (p->use_events && (st = rk_gpu_stream_sync(stream)) != RANKMEM_SUCCESS)
            goto out;
        s = p->lists[0];
    }
    rk_ptrmap_remove(&p->live_map, ptr);
    p->live--;
    p->used -= bytes;
    free_into(p, s, b);
out:
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* ---- queries, trim, forget, finalize ---- */

static rankmem_status_t pool_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    pool_t *p = (pool_t *)mr;
    size_t v = 0;
    rankmem_status_t st = RANKMEM_SUCCESS;
    pthread_mutex_lock(&p->lock);
    switch (what) {
    case RANKMEM_QUERY_RESERVED_CURRENT: v = p->held; break;
    case RANKMEM_QUERY_RESERVED_HIGH: v = p->held_high; break;
    case RANKMEM_QUERY_USED_CURRENT: v = p->used; break;
    case RANKMEM_QUERY_USED_HIGH: v = p->used_high; break;
    case RANKMEM_QUERY_POOL_MAX: v = p->maximum; break;
    case RANKMEM_QUERY_LIVE_COUNT: v = p->live; break;
    case RANKMEM_QUERY_FREE_BLOCKS:
        for (size_t i = 0; i < p->nlists; i++)
            v += p->lists[i]->nfree;
        break;
    default:
        st = rk_error(RANKMEM_ERR_NOT_SUPPORTED, "pool: unknown query %d", (int)what);
    }
    pthread_mutex_unlock(&p->lock);
    if (st == RANKMEM_SUCCESS)
        *value_p = v;
    return st;
}

/* Give every wholly free chunk back upstream while more than keep_bytes are held. */
static rankmem_status_t pool_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    pool_t *p = (pool_t *)mr;
    rankmem_resource_t *up = p->base.upstream;
    rankmem_status_t result = RANKMEM_SUCCESS;
    pthread_mutex_lock(&p->lock);
    for (size_t i = 0; i < p->nchunks && p->held > keep_bytes;) {
        chunk_t c = p->chunks[i];
        blk_t *b = rk_ptrmap_get(&p->live_map, c.ptr);
        slist_t *l = NULL;
        if (!b) { /* not live: find the free block starting the chunk */
            for (size_t k = 0; k < p->nlists && !l; k++)
                for (unsigned cl = next_class(p->lists[k], 0); cl < NCLASS && !l;
                     cl = next_class(p->lists[k], cl + 1))
                    for (blk_t *f = p->lists[k]->heads[cl]; f; f = f->fnext)
                        if (f->ptr == c.ptr) {
                            b = f;
                            l = p->lists[k];
                            break;
                        }
        }
        if (!l || b->size != c.size || p->held - c.size < keep_bytes) {
            i++;
            continue;
        }
        /* Freed on l's stream: returning it there keeps stream order upstream. */
        rankmem_status_t st = up->ops->deallocate(up, c.ptr, c.size, UNIT, l->stream);
        if (st != RANKMEM_SUCCESS) {
            result = st;
            break;
        }
        list_remove(l, b);
        desc_free(p, b);
        p->held -= c.size;
        p->chunks[i] = p->chunks[--p->nchunks];
    }
    pthread_mutex_unlock(&p->lock);
    return result;
}

static const rankmem_resource_ops_t pool_ops;

rankmem_status_t rankmem_pool_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    if (!mr || mr->ops != &pool_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_pool_forget_stream: %s",
                        mr ? "not a pool" : "NULL resource");
    pool_t *p = (pool_t *)mr;
    rankmem_status_t st = RANKMEM_SUCCESS;
    pthread_mutex_lock(&p->lock);
    slist_t *l = stream ? list_for(p, stream, 0) : NULL;
    if (l) {
        if (p->use_events)
            st = rk_gpu_stream_sync(stream);
        if (st == RANKMEM_SUCCESS) {
            merge_lists(p, p->lists[0], l);
            size_t i = 0;
            while (p->lists[i] != l)
                i++;
            p->lists[i] = p->lists[--p->nlists];
            p->hint = p->lists[0];
            rk_gpu_event_destroy(l->event);
            free(l);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return st;
}

static void pool_free_host_state(pool_t *p)
{
    for (size_t i = 0; i < p->nlists; i++) {
        rk_gpu_event_destroy(p->lists[i]->event);
        free(p->lists[i]);
    }
    free(p->lists);
    free(p->chunks);
    while (p->slabs) {
        desc_slab_t *s = p->slabs;
        p->slabs = s->next;
        free(s);
    }
    rk_ptrmap_fini(&p->live_map);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

static rankmem_status_t pool_finalize(rankmem_resource_t *mr)
{
    pool_t *p = (pool_t *)mr;
    rankmem_resource_t *up = p->base.upstream;
    rankmem_status_t result = RANKMEM_SUCCESS;
    if (p->live)
        result = rk_error(RANKMEM_ERR_BUSY,
                          "pool: released with %zu live allocations (%zu bytes); their memory "
                          "went back to the upstream",
                          p->live, p->used);
    /* Kernels may still use blocks freed on their streams: wait before giving chunks back. */
    if (p->use_events)
        for (size_t i = 0; i < p->nlists; i++)
            rk_gpu_stream_sync(p->lists[i]->stream);
    for (size_t i = 0; i < p->nchunks; i++) {
        rankmem_status_t st = up->ops->deallocate(up, p->chunks[i].ptr, p->chunks[i].size, UNIT,
                                                  NULL);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
    }
    pool_free_host_state(p);
    return result;
}

static const rankmem_resource_ops_t pool_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "pool",
    .allocate = pool_allocate,
    .deallocate = pool_deallocate,
    .query = pool_query,
    .trim = pool_trim,
    .finalize = pool_finalize,
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
    prm.initial_size = rk_align_up(prm.initial_size, UNIT);
    prm.growth_size = rk_align_up(prm.growth_size, UNIT);

    unsigned props = upstream->props & (RANKMEM_PROP_DEVICE_ACCESSIBLE |
                                         RANKMEM_PROP_HOST_ACCESSIBLE);
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(pool_t), &pool_ops,
                                          props | RANKMEM_PROP_STREAM_ORDERED, upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    pool_t *p = (pool_t *)mr;
    p->base.device = upstream->device; /* the pool's memory lives where the upstream's does */
    p->initial = prm.initial_size;
    p->maximum = prm.maximum_size;
    p->growth = prm.growth_size;
    p->use_events = (upstream->props & RANKMEM_PROP_DEVICE_ACCESSIBLE) && rk_gpu_count() > 0;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
#ifdef PTHREAD_MUTEX_ADAPTIVE_NP
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(&p->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    st = rk_ptrmap_init(&p->live_map, 1024);
    if (st == RANKMEM_SUCCESS && !list_for(p, NULL, 1)) /* lists[0]: the default stream */
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "pool: no host memory for its free lists");
    if (st == RANKMEM_SUCCESS && p->initial)
        st = grow(p, p->lists[0], p->initial, 1);
    if (st != RANKMEM_SUCCESS) {
        /* Nothing was handed out: undo by hand, the upstream reference too. */
        pool_finalize(mr);
        rankmem_resource_release(upstream);
        return st;
    }
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
