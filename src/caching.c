/* caching: CUB's CachingDeviceAllocator scheme over any upstream,
 * stream-ordered and sharded by thread.
 *
 * Bins grow geometrically: a request is rounded up to growth^k bytes for the
 * smallest k >= min_bin, and the upstream is asked for exactly that; a
 * request above growth^max_bin is not cached: it goes to the upstream as it
 * is and straight back on free. A freed block of a bin is kept in the cache
 * of that bin, tagged with the stream that freed it, unless the cache would
 * then hold more than max_cached_bytes (it goes back upstream). A block is
 * only ever reused for a request of its own bin, as in CUB.
 *
 * Streams. CUB records an event on every free and queries it on reuse from
 * another stream. Here nothing happens on free: a block freed on S is reused
 * by S at once (stream order), and when a request on T finds only blocks
 * freed on other streams it takes one of S's after making T wait for S's
 * work so far (rk_gpu_stream_wait: one event record and one stream wait, no
 * host synchronisation). That is stream-ordered, costs no CUDA call on the
 * same-stream path nor on any free, and a block never waits for the host.
 * Events are used only over an upstream whose memory kernels use, on a
 * machine with a GPU; over host memory streams are labels, and a block
 * freed on S is reused by T at once.
 *
 * Threads. Each thread works in one of NSHARDS shards (its own lock, stream
 * lists, live map and descriptors); the same-stream path takes one
 * uncontended lock and makes no system or CUDA call. A miss looks in the
 * other shards (per-shard bitmaps of non-empty bins are read without locks
 * to skip empty ones) before asking the upstream. A block may be freed by
 * any thread: it goes back to the cache of the shard that handed it out.
 *
 * The cap is exact without a shared counter on the hot path: each shard
 * holds a budget of cap bytes it may cache; the rest is a spare pool taken
 * with compare-and-swap. A free that does not fit its shard's budget takes
 * from the spare, then steals the unused budget of other shards; only when
 * all of them together have no room does the block go upstream. So the
 * cached bytes of all shards never exceed the cap, and a free goes upstream
 * only when the cap would be exceeded.
 *
 * On out-of-memory (or a limit) from the upstream, every cached block is
 * given back and the request is tried once more. */
#define _GNU_SOURCE
#include "internal.h"
#include "config_internal.h"
#include "blocks.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NSHARDS RK_NSHARDS
#define MAX_BINS 64 /* growth >= 2 and growth^max_bin < 2^64: at most 64 bins */
#define NOT_CACHED UINT_MAX
#define ALIGN_SCAN 8 /* cached blocks examined for a request of a larger alignment */

#define DEFAULT_GROWTH 8u
#define DEFAULT_MIN_BIN 3u
#define DEFAULT_MAX_BIN 7u
#define DEFAULT_CAP (((size_t)6 << 20) - 1) /* CUB: (8^7 * 3) - 1 bytes */

typedef struct blk blk_t;

struct blk {
    char *ptr;
    size_t size;             /* bytes held from the upstream */
    size_t align;            /* alignment the upstream was given */
    size_t req;              /* bytes the user asked for, while live */
    rankmem_stream_t stream; /* the stream that freed it, while cached */
    blk_t *next;             /* cache list, spare chain, or a chain being given back */
    unsigned bin;            /* bin index, or NOT_CACHED */
};

typedef struct slist {
    rk_slist_t h;    /* stream, and its event */
    uint64_t bitmap; /* bins with a block */
    blk_t *heads[];  /* one LIFO list per bin (nbins) */
} slist_t;

typedef struct shard {
    rk_shard_t g;           /* blocks.h: lock, stream lists, live map, descriptors */
    size_t cached, ncached; /* bytes and blocks in this shard's cache */
    size_t budget;          /* cap bytes this shard may cache (>= cached) */
    unsigned bincount[MAX_BINS];
    /* Written under the lock with relaxed atomic stores, read by other
     * threads without it as hints: bins with a block, and budget - cached. */
    uint64_t avail;
    size_t slack;
} __attribute__((aligned(64))) shard_t; /* one cache line apart: no false sharing */

typedef struct {
    rankmem_resource_t base;
    unsigned growth, min_bin, max_bin, nbins;
    unsigned growth_shift; /* log2(growth) when growth is a power of two, else 0 */
    int use_events;        /* upstream memory is used by kernels: order streams with events */
    int capped;            /* cap != SIZE_MAX */
    size_t cap;
    size_t quantum;        /* budget a shard takes from the spare at a time */
    size_t max_bin_bytes;
    size_t bin_bytes[MAX_BINS];
    /* Written by all threads (rarely), read-only fields above and below: 64
     * bytes of padding each side keep them off those cache lines (the struct
     * comes from calloc, so alignment attributes would not hold). */
    char pad1[64];
    size_t spare;          /* atomic: cap bytes in no shard's budget */
    size_t held, held_high; /* atomic: bytes held from the upstream (live + cached) */
    char pad2[64];
    shard_t *shards;       /* NSHARDS, RK_SHARD_APART bytes apart */
} caching_t;

/* ---- bins ---- */

/* Bin index of a request, or NOT_CACHED above the largest bin. */
static inline unsigned bin_of(const caching_t *c, size_t bytes)
{
    if (RK_UNLIKELY(bytes > c->max_bin_bytes))
        return NOT_CACHED;
    if (RK_LIKELY(c->growth_shift != 0)) {
        /* ceil(log2(bytes)), then ceil of that over log2(growth) */
        unsigned bits = bytes <= 1 ? 0
                                   : (unsigned)(sizeof(unsigned long long) * CHAR_BIT) -
                                         (unsigned)__builtin_clzll((unsigned long long)(bytes - 1));
        unsigned k = (bits + c->growth_shift - 1) / c->growth_shift;
        return k <= c->min_bin ? 0 : k - c->min_bin;
    }
    unsigned i = 0;
    while (c->bin_bytes[i] < bytes)
        i++;
    return i;
}

/* ---- shards ---- */

static inline shard_t *my_shard(caching_t *c)
{
    return &c->shards[rk_shard_index()];
}

static inline void publish_slack(const caching_t *c, shard_t *sh)
{
    if (c->capped)
        __atomic_store_n(&sh->slack, sh->budget - sh->cached, __ATOMIC_RELAXED);
}

/* ---- stream lists ---- */

static inline slist_t *list_for(const caching_t *c, shard_t *sh, rankmem_stream_t stream,
                                int create)
{
    size_t size = create ? sizeof(slist_t) + c->nbins * sizeof(blk_t *) : 0;
    return (slist_t *)rk_list_for(&sh->g, stream, size);
}

static inline void cache_push(const caching_t *c, shard_t *sh, slist_t *l, blk_t *b)
{
    unsigned i = b->bin;
    b->stream = l->h.stream;
    b->next = l->heads[i];
    l->heads[i] = b;
    l->bitmap |= 1ull << i;
    sh->cached += b->size;
    sh->ncached++;
    if (sh->bincount[i]++ == 0)
        __atomic_store_n(&sh->avail, sh->avail | 1ull << i, __ATOMIC_RELAXED);
    publish_slack(c, sh);
}

/* The link to the first block of bin i in l whose address has `alignment`,
 * or NULL. Blocks keep the alignment they were made with, which is at least
 * the default; a larger one is checked. */
static inline blk_t **cache_find(slist_t *l, unsigned i, size_t alignment)
{
    blk_t **pp = &l->heads[i];
    if (RK_LIKELY(*pp != NULL && alignment <= RANKMEM_DEFAULT_ALIGNMENT))
        return pp;
    for (int n = 0; *pp && n < ALIGN_SCAN; pp = &(*pp)->next, n++)
        if (((uintptr_t)(*pp)->ptr & (alignment - 1)) == 0)
            return pp;
    return NULL;
}

static inline blk_t *cache_unlink(const caching_t *c, shard_t *sh, slist_t *l, unsigned i,
                                  blk_t **pp)
{
    blk_t *b = *pp;
    *pp = b->next;
    if (!l->heads[i])
        l->bitmap &= ~(1ull << i);
    sh->cached -= b->size;
    sh->ncached--;
    if (--sh->bincount[i] == 0)
        __atomic_store_n(&sh->avail, sh->avail & ~(1ull << i), __ATOMIC_RELAXED);
    publish_slack(c, sh);
    return b;
}

/* A cached block of bin i for `stream` from sh (locked): first one freed on
 * stream, else one freed on another stream, after ordering stream behind it. */
static blk_t *take_in_shard(const caching_t *c, shard_t *sh, rankmem_stream_t stream, unsigned i,
                            size_t alignment)
{
    uint64_t bit = 1ull << i;
    blk_t **pp;
    slist_t *s = list_for(c, sh, stream, 0);
    if (RK_LIKELY(s != NULL && (s->bitmap & bit)) && (pp = cache_find(s, i, alignment)) != NULL)
        return cache_unlink(c, sh, s, i, pp);
    for (size_t k = 0; k < sh->g.nlists; k++) {
        slist_t *t = (slist_t *)sh->g.lists[k];
        if (t == s || !(t->bitmap & bit) || !(pp = cache_find(t, i, alignment)))
            continue;
        /* A stream that cannot be waited for (destroyed behind our back) keeps its blocks. */
        if (c->use_events && rk_gpu_stream_wait(stream, t->h.stream, &t->h.event) != RANKMEM_SUCCESS)
            continue;
        return cache_unlink(c, sh, t, i, pp);
    }
    return NULL;
}

/* A cached block of bin i from another shard than mine (not locked). */
static blk_t *take_elsewhere(const caching_t *c, shard_t *mine, rankmem_stream_t stream,
                             unsigned i, size_t alignment)
{
    uint64_t bit = 1ull << i;
    unsigned start = (unsigned)(mine - c->shards);
    for (unsigned n = 1; n < NSHARDS; n++) {
        shard_t *d = &c->shards[(start + n) & (NSHARDS - 1)];
        if (!(__atomic_load_n(&d->avail, __ATOMIC_RELAXED) & bit))
            continue;
        rk_shard_lock(&d->g);
        blk_t *b = take_in_shard(c, d, stream, i, alignment);
        rk_shard_unlock(&d->g);
        if (b)
            return b;
    }
    return NULL;
}

/* ---- the cap ---- */

/* Take room for `bytes` more in sh's budget from the spare (sh locked). */
static int budget_from_spare(caching_t *c, shard_t *sh, size_t bytes)
{
    size_t need = sh->cached + bytes - sh->budget;
    size_t want = need > c->quantum ? need : c->quantum;
    size_t spare = __atomic_load_n(&c->spare, __ATOMIC_RELAXED);
    size_t take;
    do {
        if (spare < need)
            return 0;
        take = spare < want ? spare : want;
    } while (!__atomic_compare_exchange_n(&c->spare, &spare, spare - take, 1, __ATOMIC_RELAXED,
                                          __ATOMIC_RELAXED));
    sh->budget += take;
    publish_slack(c, sh);
    return 1;
}

/* Unused budget of the other shards and whatever is spare, until `need`
 * bytes are found (no lock held). Returns what it took. */
static size_t budget_steal(caching_t *c, shard_t *mine, size_t need)
{
    size_t got = __atomic_exchange_n(&c->spare, 0, __ATOMIC_RELAXED);
    for (int k = 0; k < NSHARDS && got < need; k++) {
        shard_t *q = &c->shards[k];
        if (q == mine || !__atomic_load_n(&q->slack, __ATOMIC_RELAXED))
            continue;
        rk_shard_lock(&q->g);
        got += q->budget - q->cached;
        q->budget = q->cached;
        publish_slack(c, q);
        rk_shard_unlock(&q->g);
    }
    return got;
}

/* ---- the upstream ---- */

static void held_add(caching_t *c, size_t size)
{
    size_t now = __atomic_add_fetch(&c->held, size, __ATOMIC_RELAXED);
    size_t h = __atomic_load_n(&c->held_high, __ATOMIC_RELAXED);
    while (h < now &&
           !__atomic_compare_exchange_n(&c->held_high, &h, now, 1, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
        ;
}

static rankmem_status_t give_back(caching_t *c, char *ptr, size_t size, size_t align,
                                  rankmem_stream_t stream)
{
    rankmem_resource_t *up = c->base.upstream;
    rankmem_status_t st = up->ops->deallocate(up, ptr, size, align, stream);
    if (st == RANKMEM_SUCCESS)
        __atomic_sub_fetch(&c->held, size, __ATOMIC_RELAXED);
    return st;
}

/* Give a chain of detached blocks back upstream (no lock held), then their
 * descriptors to sh. Returns the first failure. */
static rankmem_status_t give_back_chain(caching_t *c, shard_t *sh, blk_t *chain)
{
    rankmem_status_t result = RANKMEM_SUCCESS;
    if (!chain)
        return result;
    for (blk_t *b = chain; b; b = b->next) {
        rankmem_status_t st = give_back(c, b->ptr, b->size, b->align, b->stream);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
    }
    rk_shard_lock(&sh->g);
    for (blk_t *b = chain, *nx; b; b = nx) {
        nx = b->next;
        rk_desc_free(&sh->g, b);
    }
    rk_shard_unlock(&sh->g);
    return result;
}

/* Every cached block of every shard back upstream; the budgets go back to the
 * spare and the stream lists (and their events) are dropped. *count_p: the
 * blocks given back. */
static rankmem_status_t free_all_cached(caching_t *c, size_t *count_p)
{
    rankmem_status_t result = RANKMEM_SUCCESS;
    size_t count = 0;
    for (int k = 0; k < NSHARDS; k++) {
        shard_t *sh = &c->shards[k];
        blk_t *chain = NULL;
        rk_shard_lock(&sh->g);
        for (size_t j = 0; j < sh->g.nlists; j++) {
            slist_t *l = (slist_t *)sh->g.lists[j];
            for (unsigned i = 0; i < c->nbins; i++)
                while (l->heads[i]) {
                    blk_t *b = l->heads[i];
                    l->heads[i] = b->next;
                    b->next = chain;
                    chain = b;
                }
        }
        count += sh->ncached;
        rk_lists_clear(&sh->g);
        sh->cached = sh->ncached = 0;
        memset(sh->bincount, 0, sizeof sh->bincount);
        __atomic_store_n(&sh->avail, 0, __ATOMIC_RELAXED);
        if (c->capped) {
            __atomic_add_fetch(&c->spare, sh->budget, __ATOMIC_RELAXED);
            sh->budget = 0;
            publish_slack(c, sh);
        }
        rk_shard_unlock(&sh->g);
        rankmem_status_t st = give_back_chain(c, sh, chain);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
    }
    if (count_p)
        *count_p = count;
    return result;
}

/* Fresh memory from the upstream; on out-of-memory (or a limit), give the
 * whole cache back and try once more. */
static rankmem_status_t from_upstream(caching_t *c, size_t size, size_t alignment,
                                      rankmem_stream_t stream, void **mem_p)
{
    rankmem_resource_t *up = c->base.upstream;
    rankmem_status_t st = up->ops->allocate(up, size, alignment, stream, mem_p);
    if (RK_UNLIKELY(st == RANKMEM_ERR_OUT_OF_MEMORY || st == RANKMEM_ERR_LIMIT)) {
        size_t n = 0;
        free_all_cached(c, &n);
        rankmem_clear_error(); /* what the retry says, not older news */
        st = up->ops->allocate(up, size, alignment, stream, mem_p);
        if (st != RANKMEM_SUCCESS) {
            /* The upstream's own words, without the status it starts with. */
            const char *why = rankmem_last_error(), *pre = rankmem_status_string(st);
            size_t pl = strlen(pre);
            if (strncmp(why, pre, pl) == 0 && why[pl] == ':' && why[pl + 1] == ' ')
                why += pl + 2;
            char detail[256];
            snprintf(detail, sizeof detail, "%s", why);
            return rk_error(st,
                            "caching: %zu bytes: the upstream '%s' refused them, also after "
                            "%zu cached block%s went back%s%s%s",
                            size, up->ops->name ? up->ops->name : "unnamed", n,
                            n == 1 ? "" : "s", *detail ? " (" : "", detail,
                            *detail ? ")" : "");
        }
    }
    if (st == RANKMEM_SUCCESS)
        held_add(c, size);
    return st;
}

/* ---- allocate / deallocate ---- */

/* Record b (not in any list) as live in sh (locked). */
static inline rankmem_status_t make_live(shard_t *sh, blk_t *b, size_t bytes)
{
    b->req = bytes;
    return rk_live_add(&sh->g, b->ptr, b, bytes);
}

/* Out of host memory for the live map or a descriptor: b goes back upstream
 * on the stream it was meant for (which is ordered after its last use). */
static rankmem_status_t drop_block(caching_t *c, shard_t *sh, blk_t *b, rankmem_stream_t stream,
                                   rankmem_status_t st)
{
    char *mem = b->ptr;
    size_t size = b->size, align = b->align;
    rk_desc_free(&sh->g, b);
    rk_shard_unlock(&sh->g);
    give_back(c, mem, size, align, stream);
    return st;
}

static rankmem_status_t caching_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                         rankmem_stream_t stream, void **ptr_p)
{
    caching_t *c = (caching_t *)mr;
    shard_t *sh = my_shard(c);
    unsigned i = bin_of(c, bytes);
    rankmem_status_t st;
    blk_t *b = NULL;
    if (RK_LIKELY(i != NOT_CACHED)) {
        rk_shard_lock_own(&sh->g);
        b = take_in_shard(c, sh, stream, i, alignment);
        if (RK_LIKELY(b != NULL)) {
            /* A block in the cache means the live map is ready. */
            st = make_live(sh, b, bytes);
            if (RK_UNLIKELY(st != RANKMEM_SUCCESS))
                return drop_block(c, sh, b, stream, st);
            rk_shard_unlock(&sh->g);
            *ptr_p = b->ptr;
            return RANKMEM_SUCCESS;
        }
        rk_shard_unlock(&sh->g);
        b = take_elsewhere(c, sh, stream, i, alignment);
    }
    void *mem = NULL;
    size_t size = i == NOT_CACHED ? bytes : c->bin_bytes[i];
    if (!b && (st = from_upstream(c, size, alignment, stream, &mem)) != RANKMEM_SUCCESS)
        return st;
    rk_shard_lock(&sh->g);
    st = rk_shard_ready(&sh->g);
    if (st == RANKMEM_SUCCESS && !b) {
        if ((b = rk_desc_new(&sh->g, sizeof(blk_t))) == NULL) {
            rk_shard_unlock(&sh->g);
            give_back(c, mem, size, alignment, stream);
            return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                            "caching: no host memory for a block descriptor");
        }
        b->ptr = mem;
        b->size = size;
        b->align = alignment;
        b->bin = i;
        b->stream = stream;
    }
    if (st == RANKMEM_SUCCESS)
        st = make_live(sh, b, bytes);
    if (RK_UNLIKELY(st != RANKMEM_SUCCESS)) {
        if (b)
            return drop_block(c, sh, b, stream, st);
        rk_shard_unlock(&sh->g);
        give_back(c, mem, size, alignment, stream);
        return st;
    }
    rk_shard_unlock(&sh->g);
    *ptr_p = b->ptr;
    return RANKMEM_SUCCESS;
}

/* Free the block in slot of sh's live map (sh locked; unlocked on return). */
static rankmem_status_t free_in(caching_t *c, shard_t *sh, size_t slot, void *ptr, size_t bytes,
                                rankmem_stream_t stream)
{
    blk_t *b = sh->g.live_map.slots[slot].value;
    if (RK_UNLIKELY(b->req != bytes)) {
        size_t req = b->req;
        rk_shard_unlock(&sh->g);
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "caching: %p freed with size %zu but allocated with %zu; not freed", ptr,
                        bytes, req);
    }
    rk_live_drop(&sh->g, slot, bytes);
    if (RK_LIKELY(b->bin != NOT_CACHED)) {
        if (RK_LIKELY(!c->capped || sh->cached + b->size <= sh->budget) ||
            budget_from_spare(c, sh, b->size)) {
            slist_t *l = list_for(c, sh, stream, 1);
            if (RK_LIKELY(l != NULL)) {
                cache_push(c, sh, l, b);
                rk_shard_unlock(&sh->g);
                return RANKMEM_SUCCESS;
            }
        } else if (b->size <= c->cap) {
            /* The cap may still have room in other shards' budgets. The block
             * is ours alone meanwhile (in no map, no list). */
            size_t need = sh->cached + b->size - sh->budget;
            rk_shard_unlock(&sh->g);
            size_t got = budget_steal(c, sh, need);
            rk_shard_lock(&sh->g);
            sh->budget += got;
            publish_slack(c, sh);
            slist_t *l;
            if (sh->cached + b->size <= sh->budget && (l = list_for(c, sh, stream, 1)) != NULL) {
                cache_push(c, sh, l, b);
                rk_shard_unlock(&sh->g);
                return RANKMEM_SUCCESS;
            }
        }
    }
    /* Not cached: straight back upstream, on the stream it was freed on. */
    char *mem = b->ptr;
    size_t size = b->size, align = b->align;
    rk_desc_free(&sh->g, b);
    rk_shard_unlock(&sh->g);
    return give_back(c, mem, size, align, stream);
}

static rankmem_status_t caching_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                           size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    caching_t *c = (caching_t *)mr;
    size_t slot;
    shard_t *sh = (shard_t *)rk_shard_find_live(c->shards, sizeof(shard_t), &my_shard(c)->g, 0,
                                                ptr, &slot);
    if (RK_LIKELY(sh != NULL))
        return free_in(c, sh, slot, ptr, bytes, stream); /* unlocks */
    return rk_error(RANKMEM_ERR_INVALID_POINTER,
                    "caching: %p (%zu bytes) is not a live allocation of this resource "
                    "(double free, or memory from elsewhere)",
                    ptr, bytes);
}

/* ---- queries, trim, free all, finalize ---- */

static rankmem_status_t caching_query(rankmem_resource_t *mr, rankmem_query_t what,
                                      size_t *value_p)
{
    caching_t *c = (caching_t *)mr;
    size_t v = 0;
    switch (what) {
    case RANKMEM_QUERY_RESERVED_CURRENT: v = __atomic_load_n(&c->held, __ATOMIC_RELAXED); break;
    case RANKMEM_QUERY_RESERVED_HIGH: v = __atomic_load_n(&c->held_high, __ATOMIC_RELAXED); break;
    case RANKMEM_QUERY_USED_CURRENT:
    case RANKMEM_QUERY_USED_HIGH:
    case RANKMEM_QUERY_LIVE_COUNT: v = rk_shards_sum(c->shards, sizeof(shard_t), what); break;
    case RANKMEM_QUERY_FREE_BLOCKS:
        for (int k = 0; k < NSHARDS; k++) {
            rk_shard_lock(&c->shards[k].g);
            v += c->shards[k].ncached;
            rk_shard_unlock(&c->shards[k].g);
        }
        break;
    default:
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "caching: query %d is not answered",
                        (int)what);
    }
    *value_p = v;
    return RANKMEM_SUCCESS;
}

/* Give cached blocks back, largest bins first, while more than keep_bytes
 * are held from the upstream (live blocks count: they stay). */
static rankmem_status_t caching_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    caching_t *c = (caching_t *)mr;
    if (keep_bytes == 0)
        return free_all_cached(c, NULL);
    rankmem_status_t result = RANKMEM_SUCCESS;
    size_t held = __atomic_load_n(&c->held, __ATOMIC_RELAXED);
    size_t excess = held > keep_bytes ? held - keep_bytes : 0;
    for (int k = 0; k < NSHARDS && excess; k++) {
        shard_t *sh = &c->shards[k];
        blk_t *chain = NULL;
        rk_shard_lock(&sh->g);
        for (unsigned i = c->nbins; i-- > 0 && excess && sh->ncached;) {
            if (c->bin_bytes[i] > excess || !sh->bincount[i])
                continue;
            for (size_t j = 0; j < sh->g.nlists && c->bin_bytes[i] <= excess; j++) {
                slist_t *l = (slist_t *)sh->g.lists[j];
                while (l->heads[i] && c->bin_bytes[i] <= excess) {
                    blk_t *b = cache_unlink(c, sh, l, i, &l->heads[i]);
                    excess -= b->size;
                    b->next = chain;
                    chain = b;
                }
            }
        }
        rk_shard_unlock(&sh->g);
        rankmem_status_t st = give_back_chain(c, sh, chain);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
    }
    return result;
}

static const rankmem_resource_ops_t caching_ops;

/* Every caching resource of the chain gives its cache back, so users can
 * call it on the chain they hold (stats>caching>cuda). */
rankmem_status_t rankmem_caching_free_all(rankmem_resource_t *mr)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_caching_free_all: NULL resource");
    int found = 0;
    rankmem_status_t result = RANKMEM_SUCCESS;
    for (rankmem_resource_t *r = mr; r; r = r->upstream)
        if (r->ops == &caching_ops) {
            found++;
            rankmem_status_t st = free_all_cached((caching_t *)r, NULL);
            if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
                result = st;
        }
    if (!found)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_caching_free_all: no caching resource in the chain of '%s'",
                        mr->ops->name ? mr->ops->name : "unnamed");
    return result;
}

typedef struct {
    caching_t *c;
    rankmem_status_t result;
} reclaim_t;

static void reclaim_live(const void *key, void *value, void *arg)
{
    (void)key;
    reclaim_t *r = arg;
    blk_t *b = value;
    rankmem_status_t st = give_back(r->c, b->ptr, b->size, b->align, NULL);
    if (st != RANKMEM_SUCCESS && r->result == RANKMEM_SUCCESS)
        r->result = st;
}

static void caching_free_host_state(caching_t *c)
{
    rk_shards_free(c->shards, sizeof(shard_t));
    free(c);
}

static rankmem_status_t caching_finalize(rankmem_resource_t *mr)
{
    caching_t *c = (caching_t *)mr;
    rankmem_status_t result = RANKMEM_SUCCESS;
    size_t used, live = rk_shards_live(c->shards, sizeof(shard_t), &used);
    if (live)
        result = rk_error(RANKMEM_ERR_BUSY,
                          "caching: released with %zu live allocations (%zu bytes); their memory "
                          "went back to the upstream",
                          live, used);
    rankmem_status_t st = free_all_cached(c, NULL);
    if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
        result = st;
    reclaim_t r = {c, RANKMEM_SUCCESS};
    for (int k = 0; live && k < NSHARDS; k++)
        if (c->shards[k].g.live_map.slots)
            rk_ptrmap_each(&c->shards[k].g.live_map, reclaim_live, &r);
    if (r.result != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
        result = r.result;
    caching_free_host_state(c);
    return result;
}

/* Spec syntax; only what differs from the defaults, so "caching" reads as it was written. */
static int caching_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const caching_t *c = (const caching_t *)mr;
    char opts[160] = "", sz[48];
    size_t o = 0;
    if (c->growth != DEFAULT_GROWTH)
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",growth=%u", c->growth);
    if (c->min_bin != DEFAULT_MIN_BIN)
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",min=%u", c->min_bin);
    if (c->max_bin != DEFAULT_MAX_BIN)
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",max=%u", c->max_bin);
    if (c->cap != DEFAULT_CAP) {
        rk_format_size(sz, sizeof sz, c->cap);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",cap=%s", sz);
    }
    return o ? snprintf(buf, len, "caching(%s)", opts + 1) : snprintf(buf, len, "caching");
}

static const rankmem_resource_ops_t caching_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "caching",
    .allocate = caching_allocate,
    .deallocate = caching_deallocate,
    .query = caching_query,
    .trim = caching_trim,
    .finalize = caching_finalize,
    .describe = caching_describe,
};

rankmem_status_t rankmem_caching_params_default(rankmem_caching_params_t *params_p)
{
    if (!params_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_caching_params_default: NULL output");
    params_p->size = sizeof *params_p;
    params_p->growth = DEFAULT_GROWTH;
    params_p->min_bin = DEFAULT_MIN_BIN;
    params_p->max_bin = DEFAULT_MAX_BIN;
    params_p->max_cached_bytes = DEFAULT_CAP;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_caching_create(rankmem_resource_t *upstream,
                                        const rankmem_caching_params_t *params,
                                        rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_caching_create: NULL %s",
                        upstream ? "output" : "upstream");
    rankmem_caching_params_t prm;
    rankmem_caching_params_default(&prm);
    if (params) {
        if (params->size != sizeof prm)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_caching_create: params.size %zu is not that of "
                            "rankmem_caching_params_t (%zu); set it with "
                            "rankmem_caching_params_default()",
                            params->size, sizeof prm);
        prm = *params;
    }
    if (prm.growth < 2)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_caching_create: growth %u: bins must grow by a factor of at "
                        "least 2",
                        prm.growth);
    if (prm.min_bin > prm.max_bin)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_caching_create: min_bin %u is above max_bin %u", prm.min_bin,
                        prm.max_bin);
    /* growth^max_bin must fit in a size_t. */
    size_t bytes = 1;
    for (unsigned k = 0; k < prm.max_bin; k++) {
        if (bytes > SIZE_MAX / prm.growth)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_caching_create: the largest bin, %u^%u bytes, is too large",
                            prm.growth, prm.max_bin);
        bytes *= prm.growth;
    }

    unsigned props = upstream->props & (RANKMEM_PROP_DEVICE_ACCESSIBLE |
                                         RANKMEM_PROP_HOST_ACCESSIBLE);
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(caching_t), &caching_ops,
                                          props | RANKMEM_PROP_STREAM_ORDERED, upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    caching_t *c = (caching_t *)mr;
    c->base.device = upstream->device; /* the memory lives where the upstream's does */
    c->growth = prm.growth;
    c->min_bin = prm.min_bin;
    c->max_bin = prm.max_bin;
    c->nbins = prm.max_bin - prm.min_bin + 1;
    c->growth_shift = rk_is_pow2(prm.growth) ? (unsigned)__builtin_ctz(prm.growth) : 0;
    bytes = 1;
    for (unsigned k = 0; k <= prm.max_bin; k++) {
        if (k >= prm.min_bin)
            c->bin_bytes[k - prm.min_bin] = bytes;
        if (k < prm.max_bin)
            bytes *= prm.growth;
    }
    c->max_bin_bytes = c->bin_bytes[c->nbins - 1];
    c->cap = prm.max_cached_bytes;
    c->capped = prm.max_cached_bytes != SIZE_MAX;
    c->spare = c->capped ? c->cap : 0;
    c->quantum = c->cap / NSHARDS;
    c->use_events = (upstream->props & RANKMEM_PROP_DEVICE_ACCESSIBLE) && rk_gpu_count() > 0;
    void *shards = NULL;
    if (rk_shards_new(sizeof(shard_t), &shards) != RANKMEM_SUCCESS) {
        free(c);
        rankmem_resource_release(upstream);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "caching: no host memory for its shards");
    }
    c->shards = shards;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
