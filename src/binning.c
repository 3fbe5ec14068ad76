/* binning: requests sorted by size into bins, each served by its own
 * resource; requests above the largest bin go to the upstream.
 *
 * A request of `bytes` at `alignment` (256 or more, as the dispatcher
 * passes it) goes to the smallest bin whose size is at least
 * max(bytes, alignment) and that gives that alignment (a fixed bin gives the
 * largest power of two dividing its block size, at most 4 KiB; a user's bin
 * is trusted with any); with no such bin, to the upstream. Deallocate
 * routes by the same rule, so it should be given the bytes and alignment
 * that allocate got (as for every resource); when the fixed bin (or the
 * upstream's record) it picks does not know the pointer, the other fixed bins
 * and the record are asked (by address: safe), so that a block allocated
 * with an alignment and freed with 0 is found. A fixed bin found that way
 * frees the block only when its bytes route to that bin at some alignment
 * (the alignment may differ, the size may not: 0 bytes, or the size of
 * another bin, is refused and changes nothing). A user's bin is never asked
 * about a pointer that is not routed to it.
 *
 * The constructor makes fixed-size bins of 2^min_exp .. 2^max_exp bytes
 * over the upstream; each takes its first batch when first used, so a wide
 * range costs nothing until it is used. rankmem_binning_add_bin() adds or
 * replaces the bin of a size with a resource of the user's or a fixed one.
 *
 * The bins are an immutable table, replaced whole by add_bin and read with
 * one atomic load, so allocate and deallocate take no lock of binning's own.
 * The bin for a size is found by a table indexed by the request's power of
 * two (then at most a step or two when bins are not powers of two). Tables
 * and bins that were replaced are kept until finalize, since another thread
 * may still be using them.
 *
 * Requests above the largest bin are recorded (pointer -> bytes, in one of
 * NLARGE maps chosen by the pointer, each with its own lock): freeing a
 * pointer that did not come from there, or with another size, is refused
 * instead of handing a bin's block (or anything else) to the upstream. */
#define _GNU_SOURCE
#include "internal.h"
#include "fixed.h"
#include "config_internal.h"
#include "ptrmap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define UNIT RANKMEM_DEFAULT_ALIGNMENT
#define NLARGE 16 /* a power of two */
#define MIN_EXP 8
#define MAX_EXP 40

static rankmem_status_t binning_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream);

typedef struct {
    size_t size;  /* serves requests up to this many bytes */
    size_t align; /* and alignments up to this (a fixed bin's; SIZE_MAX for the user's) */
    rankmem_resource_t *mr;
} bin_t;

typedef struct bintab {
    struct bintab *retired; /* the table this one replaced */
    size_t n;
    size_t largest; /* bins[n - 1].size, 0 without bins */
    /* first[e]: the first bin that can serve a request in (2^(e-1), 2^e]. */
    unsigned char first[65];
    /* whole[e]: the bin first[e] when it serves every request of the class
     * (size at least 2^e), else mr NULL: pick's answer in one step. */
    struct {
        rankmem_resource_t *mr;
        size_t align;
    } whole[65];
    bin_t bins[];
} bintab_t;

/* What the map keeps of an allocation: its bytes, and log2 of its alignment
 * in the top bits (the upstream gets both back). */
#define LARGE_ALIGN_SHIFT 58
#define LARGE_BYTES_MASK (((uint64_t)1 << LARGE_ALIGN_SHIFT) - 1)

typedef struct {
    pthread_mutex_t lock;
    rk_ptrmap_t map; /* pointer -> bytes | log2(alignment) << LARGE_ALIGN_SHIFT */
    size_t bytes, bytes_high, count;
} __attribute__((aligned(64))) large_t;

typedef struct {
    rankmem_resource_t base;
    bintab_t *tab; /* atomic */
    int min_exp, max_exp;
    pthread_mutex_t cfg_lock; /* add_bin */
    rankmem_resource_t **old_bins; /* replaced bins, released at finalize */
    size_t nold, cap_old;
    large_t *large; /* NLARGE */
} binning_t;

static const rankmem_resource_ops_t binning_ops;

static inline unsigned ceil_log2(size_t x) /* x >= 2 */
{
    return 64u - (unsigned)__builtin_clzll((unsigned long long)(x - 1));
}

/* The bin for need = max(bytes, alignment) <= t->largest, or NULL (then
 * the upstream) when no bin that large gives the alignment. */
static inline rankmem_resource_t *pick(const bintab_t *t, size_t need, size_t alignment)
{
    unsigned e = ceil_log2(need);
    if (RK_LIKELY(t->whole[e].mr != NULL) && RK_LIKELY(alignment <= t->whole[e].align))
        return t->whole[e].mr;
    size_t i = t->first[e];
    while (i < t->n && (t->bins[i].size < need || t->bins[i].align < alignment))
        i++;
    return RK_LIKELY(i < t->n) ? t->bins[i].mr : NULL;
}

static inline large_t *large_of(binning_t *b, const void *ptr)
{
    uint64_t h = (uint64_t)(uintptr_t)ptr * 0x9e3779b97f4a7c15ull;
    return &b->large[(h >> 32) & (NLARGE - 1)];
}

/* ---- allocate / deallocate ---- */

/* Off the bins' path (noinline): the bins' callers stay lean. */
static __attribute__((noinline)) rankmem_status_t large_allocate(binning_t *b, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    rankmem_resource_t *up = b->base.upstream;
    if (bytes > LARGE_BYTES_MASK)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "binning: allocate of %zu bytes is too large",
                        bytes);
    void *p;
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, &p);
    if (st != RANKMEM_SUCCESS)
        return st;
    uint64_t rec = (uint64_t)bytes |
                   (uint64_t)__builtin_ctzll((unsigned long long)alignment) << LARGE_ALIGN_SHIFT;
    large_t *l = large_of(b, p);
    pthread_mutex_lock(&l->lock);
    st = rk_ptrmap_insert(&l->map, p, (void *)(uintptr_t)rec);
    if (st == RANKMEM_SUCCESS) {
        l->count++;
        l->bytes += bytes;
        if (l->bytes > l->bytes_high)
            l->bytes_high = l->bytes;
    }
    pthread_mutex_unlock(&l->lock);
    if (st != RANKMEM_SUCCESS) {
        up->ops->deallocate(up, p, bytes, alignment, stream);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "binning: no host memory to record an allocation of %zu bytes", bytes);
    }
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

/* Free ptr if it is recorded as an allocation from the upstream. *found_p:
 * whether it was (else nothing is done and no error is recorded). */
static __attribute__((noinline)) rankmem_status_t large_deallocate(binning_t *b, void *ptr, size_t bytes,
                                         rankmem_stream_t stream, int *found_p)
{
    large_t *l = large_of(b, ptr);
    pthread_mutex_lock(&l->lock);
    size_t slot = rk_ptrmap_find(&l->map, ptr);
    *found_p = slot != SIZE_MAX;
    if (slot == SIZE_MAX) {
        pthread_mutex_unlock(&l->lock);
        return RANKMEM_ERR_INVALID_POINTER;
    }
    uint64_t rec = (uint64_t)(uintptr_t)l->map.slots[slot].value;
    size_t had = (size_t)(rec & LARGE_BYTES_MASK);
    size_t alignment = (size_t)1 << (rec >> LARGE_ALIGN_SHIFT);
    if (had != bytes) {
        pthread_mutex_unlock(&l->lock);
        return rk_error(RANKMEM_ERR_INVALID_POINTER,
                        "binning: %p freed with size %zu but allocated with %zu; not freed", ptr,
                        bytes, had);
    }
    rk_ptrmap_remove_at(&l->map, slot);
    l->count--;
    l->bytes -= bytes;
    pthread_mutex_unlock(&l->lock);
    rankmem_resource_t *up = b->base.upstream;
    return up->ops->deallocate(up, ptr, bytes, alignment, stream);
}

static rankmem_status_t binning_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                         rankmem_stream_t stream, void **ptr_p)
{
    binning_t *b = (binning_t *)mr;
    const bintab_t *t = __atomic_load_n(&b->tab, __ATOMIC_ACQUIRE);
    size_t need = bytes > alignment ? bytes : alignment;
    rankmem_resource_t *bin;
    if (RK_LIKELY(need <= t->largest) && RK_LIKELY((bin = pick(t, need, alignment)) != NULL))
        return bin->ops->allocate(bin, bytes, alignment, stream, ptr_p);
    return large_allocate(b, bytes, alignment, stream, ptr_p);
}

/* Whether a request of bytes, at some alignment the fixed bin can give,
 * routes to bin in table t or in a table it replaced (the block may have
 * been allocated before a bin was added). */
static int routes_to(const bintab_t *t, const rankmem_resource_t *bin, size_t bytes)
{
    if (bytes == 0)
        return 0;
    size_t most = rk_fixed_max_align(bin);
    for (; t; t = t->retired)
        for (size_t a = UNIT; a <= most; a <<= 1) {
            size_t need = bytes > a ? bytes : a;
            if (need <= t->largest && pick(t, need, a) == bin)
                return 1;
        }
    return 0;
}

/* The route of (bytes, alignment) did not know ptr (tried: `tried`, a fixed
 * bin, or NULL for the upstream's record). The block may have been allocated
 * with another alignment than it is freed with: look for it where that is
 * safe to ask, the fixed bins (by address) and the record; never in a user's
 * bin. A fixed bin that holds ptr frees it only when bytes could have been
 * its request: a wrong size would otherwise free a block by its address
 * alone. Returns the status of the free, or INVALID_POINTER (no error
 * recorded) when nobody has it. */
static rankmem_status_t find_elsewhere(binning_t *b, const bintab_t *t,
                                       const rankmem_resource_t *tried, void *ptr, size_t bytes,
                                       rankmem_stream_t stream, int *found_p)
{
    for (size_t i = 0; i < t->n; i++) {
        rankmem_resource_t *bin = t->bins[i].mr;
        if (bin != tried && rk_fixed_is(bin) && rk_fixed_owns(bin, ptr)) {
            *found_p = 1;
            if (!routes_to(t, bin, bytes))
                return rk_error(RANKMEM_ERR_INVALID_POINTER,
                                "binning: %p is a block of the bin of %zu bytes, freed with %zu "
                                "bytes, which that bin never serves (wrong size); not freed",
                                ptr, rk_fixed_block_size(bin), bytes);
            return bin->ops->deallocate(bin, ptr, bytes, UNIT, stream);
        }
    }
    if (tried)
        return large_deallocate(b, ptr, bytes, stream, found_p);
    *found_p = 0;
    return RANKMEM_ERR_INVALID_POINTER;
}

static rankmem_status_t binning_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                           size_t alignment, rankmem_stream_t stream)
{
    binning_t *b = (binning_t *)mr;
    const bintab_t *t = __atomic_load_n(&b->tab, __ATOMIC_ACQUIRE);
    size_t need = bytes > alignment ? bytes : alignment;
    rankmem_resource_t *bin = NULL;
    rankmem_status_t st;
    int found = 1;
    if (RK_LIKELY(need <= t->largest) && RK_LIKELY((bin = pick(t, need, alignment)) != NULL)) {
        st = bin->ops->deallocate(bin, ptr, bytes, alignment, stream);
        if (RK_LIKELY(st != RANKMEM_ERR_INVALID_POINTER) || !rk_fixed_is(bin) ||
            rk_fixed_owns(bin, ptr))
            return st;
    } else {
        st = large_deallocate(b, ptr, bytes, stream, &found);
        if (RK_LIKELY(found))
            return st;
    }
    st = find_elsewhere(b, t, bin, ptr, bytes, stream, &found);
    if (found)
        return st;
    return rk_error(RANKMEM_ERR_INVALID_POINTER,
                    "binning: %p (%zu bytes) is not a live allocation of this resource (double "
                    "free, wrong size, or memory from elsewhere)",
                    ptr, bytes);
}

/* ---- the bin table ---- */

/* A table of n bins (sorted, sizes distinct) with its index filled in. */
static bintab_t *tab_new(const bin_t *bins, size_t n)
{
    bintab_t *t = malloc(sizeof *t + n * sizeof(bin_t));
    if (!t)
        return NULL;
    t->retired = NULL;
    t->n = n;
    if (n)
        memcpy(t->bins, bins, n * sizeof(bin_t));
    t->largest = n ? bins[n - 1].size : 0;
    size_t i = 0;
    for (unsigned e = 0; e <= 64; e++) {
        /* Requests of this class are above 2^(e-1) bytes. */
        size_t above = e == 0 ? 0 : (size_t)1 << (e - 1);
        while (i < n && bins[i].size <= above)
            i++;
        t->first[e] = (unsigned char)(i < n ? i : (n ? n - 1 : 0));
        int whole = i < n && e < 64 && bins[i].size >= (size_t)1 << e;
        t->whole[e].mr = whole ? bins[i].mr : NULL;
        t->whole[e].align = whole ? bins[i].align : 0;
    }
    return t;
}

/* ---- queries, trim, finalize, describe ---- */

/* Every distinct bin (current and replaced), for fn. */
static void each_bin(binning_t *b, void (*fn)(rankmem_resource_t *bin, void *arg), void *arg)
{
    const bintab_t *t = b->tab;
    for (size_t i = 0; i < t->n; i++) {
        int seen = 0;
        for (size_t j = 0; j < i && !seen; j++)
            seen = t->bins[j].mr == t->bins[i].mr;
        if (!seen)
            fn(t->bins[i].mr, arg);
    }
    for (size_t i = 0; i < b->nold; i++) {
        int seen = 0;
        for (size_t j = 0; j < t->n && !seen; j++)
            seen = t->bins[j].mr == b->old_bins[i];
        for (size_t j = 0; j < i && !seen; j++)
            seen = b->old_bins[j] == b->old_bins[i];
        if (!seen)
            fn(b->old_bins[i], arg);
    }
}

typedef struct {
    rankmem_query_t what;
    size_t sum;
} query_acc_t;

static void query_one(rankmem_resource_t *bin, void *arg)
{
    query_acc_t *q = arg;
    size_t v;
    if (rankmem_resource_query(bin, q->what, &v) == RANKMEM_SUCCESS) /* bins that know */
        q->sum += v;
}

static rankmem_status_t binning_query(rankmem_resource_t *mr, rankmem_query_t what,
                                      size_t *value_p)
{
    binning_t *b = (binning_t *)mr;
    size_t large = 0;
    switch (what) {
    case RANKMEM_QUERY_RESERVED_CURRENT:
    case RANKMEM_QUERY_RESERVED_HIGH: /* the sum of the peaks: an upper bound */
    case RANKMEM_QUERY_USED_CURRENT:
    case RANKMEM_QUERY_LIVE_COUNT:
    case RANKMEM_QUERY_FREE_BLOCKS:
        break;
    default:
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "binning: query %d is not answered", (int)what);
    }
    for (int i = 0; i < NLARGE; i++) {
        large_t *l = &b->large[i];
        pthread_mutex_lock(&l->lock);
        if (what == RANKMEM_QUERY_RESERVED_HIGH)
            large += l->bytes_high;
        else if (what == RANKMEM_QUERY_LIVE_COUNT)
            large += l->count;
        else if (what != RANKMEM_QUERY_FREE_BLOCKS)
            large += l->bytes;
        pthread_mutex_unlock(&l->lock);
    }
    query_acc_t q = {what, large};
    pthread_mutex_lock(&b->cfg_lock);
    each_bin(b, query_one, &q);
    pthread_mutex_unlock(&b->cfg_lock);
    *value_p = q.sum;
    return RANKMEM_SUCCESS;
}

static size_t reserved_of(rankmem_resource_t *bin)
{
    size_t v = 0;
    if (rankmem_resource_query(bin, RANKMEM_QUERY_RESERVED_CURRENT, &v) != RANKMEM_SUCCESS)
        v = 0;
    return v;
}

typedef struct {
    size_t keep, total;
    rankmem_status_t st;
} trim_acc_t;

static void reserved_one(rankmem_resource_t *bin, void *arg)
{
    ((trim_acc_t *)arg)->total += reserved_of(bin);
}

/* Trim each bin so that, with what the others hold, keep bytes stay. */
static void trim_one(rankmem_resource_t *bin, void *arg)
{
    trim_acc_t *a = arg;
    size_t mine = reserved_of(bin), others = a->total - mine;
    rankmem_status_t st = rankmem_resource_trim(bin, a->keep > others ? a->keep - others : 0);
    if (st != RANKMEM_SUCCESS && a->st == RANKMEM_SUCCESS)
        a->st = st;
    a->total = others + reserved_of(bin);
}

static rankmem_status_t binning_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    binning_t *b = (binning_t *)mr;
    trim_acc_t a = {keep_bytes, 0, RANKMEM_SUCCESS};
    pthread_mutex_lock(&b->cfg_lock);
    each_bin(b, reserved_one, &a);
    each_bin(b, trim_one, &a);
    pthread_mutex_unlock(&b->cfg_lock);
    return a.st;
}

/* Every bin forgets the stream, whatever resource it is: a bin's chain is
 * walked as any chain (forgetting a shared upstream twice is harmless). */
static rankmem_status_t binning_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    binning_t *b = (binning_t *)mr;
    struct {
        rankmem_status_t st;
        rankmem_stream_t stream;
    } a = {RANKMEM_SUCCESS, stream};
    pthread_mutex_lock(&b->cfg_lock);
    const bintab_t *t = b->tab;
    for (size_t i = 0; i < t->n; i++) {
        rankmem_status_t s = rankmem_resource_forget_stream(t->bins[i].mr, a.stream);
        if (s != RANKMEM_SUCCESS && a.st == RANKMEM_SUCCESS)
            a.st = s;
    }
    pthread_mutex_unlock(&b->cfg_lock);
    return a.st;
}

static void free_host_state(binning_t *b)
{
    for (bintab_t *t = b->tab, *nx; t; t = nx) {
        nx = t->retired;
        free(t);
    }
    free(b->old_bins);
    for (int i = 0; b->large && i < NLARGE; i++) {
        rk_ptrmap_fini(&b->large[i].map);
        pthread_mutex_destroy(&b->large[i].lock);
    }
    free(b->large);
    pthread_mutex_destroy(&b->cfg_lock);
    free(b);
}

typedef struct {
    binning_t *b;
    rankmem_status_t st;
    size_t live, bytes;
} fin_acc_t;

static void give_back_large(const void *key, void *value, void *arg)
{
    fin_acc_t *a = arg;
    rankmem_resource_t *up = a->b->base.upstream;
    uint64_t rec = (uint64_t)(uintptr_t)value;
    size_t bytes = (size_t)(rec & LARGE_BYTES_MASK);
    a->live++;
    a->bytes += bytes;
    up->ops->deallocate(up, (void *)key, bytes, (size_t)1 << (rec >> LARGE_ALIGN_SHIFT), NULL);
}

static void release_one(rankmem_resource_t *bin, void *arg)
{
    fin_acc_t *a = arg;
    rankmem_status_t st = rankmem_resource_release(bin);
    if (st != RANKMEM_SUCCESS && a->st == RANKMEM_SUCCESS)
        a->st = st;
}

static rankmem_status_t binning_finalize(rankmem_resource_t *mr)
{
    binning_t *b = (binning_t *)mr;
    fin_acc_t a = {b, RANKMEM_SUCCESS, 0, 0};
    for (int i = 0; b->large && i < NLARGE; i++)
        if (b->large[i].map.slots)
            rk_ptrmap_each(&b->large[i].map, give_back_large, &a);
    /* A bin used twice in the table holds one reference per entry. */
    if (b->tab)
        for (size_t i = 0; i < b->tab->n; i++)
            release_one(b->tab->bins[i].mr, &a);
    for (size_t i = 0; i < b->nold; i++)
        release_one(b->old_bins[i], &a);
    if (a.live) {
        rankmem_status_t busy = rk_error(RANKMEM_ERR_BUSY,
                                         "binning: released with %zu live allocations above the "
                                         "largest bin (%zu bytes); they went back to the upstream",
                                         a.live, a.bytes);
        if (a.st == RANKMEM_SUCCESS)
            a.st = busy;
    }
    free_host_state(b);
    return a.st;
}

/* Spec syntax: binning(min=2^10,max=2^22). Bins added by
 * rankmem_binning_add_bin() have no spec syntax and are not described. */
static int binning_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const binning_t *b = (const binning_t *)mr;
    return snprintf(buf, len, "binning(min=2^%d,max=2^%d)", b->min_exp, b->max_exp);
}

static const rankmem_resource_ops_t binning_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "binning",
    .allocate = binning_allocate,
    .deallocate = binning_deallocate,
    .query = binning_query,
    .trim = binning_trim,
    .finalize = binning_finalize,
    .describe = binning_describe,
    .forget_stream = binning_forget_stream,
};

/* ---- construction ---- */

/* Put bin (one reference, now ours) in the table for max_bytes (cfg_lock held). */
static rankmem_status_t install(binning_t *b, size_t max_bytes, rankmem_resource_t *bin)
{
    const bintab_t *t = b->tab;
    size_t n = t ? t->n : 0, pos = 0;
    while (pos < n && t->bins[pos].size < max_bytes)
        pos++;
    int replace = pos < n && t->bins[pos].size == max_bytes;
    rankmem_resource_t *old = replace ? t->bins[pos].mr : NULL;
    if (old) {
        size_t live = 0;
        if (rankmem_resource_query(old, RANKMEM_QUERY_LIVE_COUNT, &live) == RANKMEM_SUCCESS &&
            live)
            return rk_error(RANKMEM_ERR_BUSY,
                            "rankmem_binning_add_bin: the bin of %zu bytes has %zu live "
                            "allocations; it can be replaced only when they are freed",
                            max_bytes, live);
        if (b->nold == b->cap_old) {
            size_t cap = b->cap_old ? b->cap_old * 2 : 8;
            rankmem_resource_t **o = realloc(b->old_bins, cap * sizeof *o);
            if (!o)
                return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "binning: no host memory for its bins");
            b->old_bins = o;
            b->cap_old = cap;
        }
    }
    if (n + !replace > 255)
        return rk_error(RANKMEM_ERR_LIMIT, "rankmem_binning_add_bin: at most 255 bins");
    bin_t *bins = malloc((n + 1) * sizeof *bins);
    if (!bins)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "binning: no host memory for its bins");
    if (n)
        memcpy(bins, t->bins, n * sizeof *bins);
    if (!replace) {
        memmove(bins + pos + 1, bins + pos, (n - pos) * sizeof *bins);
        n++;
    }
    bins[pos].size = max_bytes;
    bins[pos].align = rk_fixed_is(bin) ? rk_fixed_max_align(bin) : SIZE_MAX;
    bins[pos].mr = bin;
    bintab_t *nt = tab_new(bins, n);
    free(bins);
    if (!nt)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "binning: no host memory for its bins");
    nt->retired = b->tab;
    if (old)
        b->old_bins[b->nold++] = old; /* other threads may be in it right now */
    __atomic_store_n(&b->tab, nt, __ATOMIC_RELEASE);
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_binning_add_bin(rankmem_resource_t *mr, size_t max_bytes,
                                         rankmem_resource_t *bin_mr)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_binning_add_bin: NULL resource");
    if (mr->ops != &binning_ops)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_binning_add_bin: '%s' is not a binning resource",
                        mr->ops->name ? mr->ops->name : "unnamed");
    if (max_bytes == 0 || max_bytes > ((size_t)1 << MAX_EXP))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_binning_add_bin: bin size %zu is not in 1 .. 2^%d", max_bytes,
                        MAX_EXP);
    binning_t *b = (binning_t *)mr;
    rankmem_resource_t *bin;
    rankmem_status_t st;
    if (bin_mr) {
        /* A bin that leads back to this resource would keep it alive forever. */
        for (rankmem_resource_t *r = bin_mr; r; r = r->upstream)
            if (r == mr)
                return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                                "rankmem_binning_add_bin: the bin's chain leads back to this "
                                "binning resource");
        if (rk_fixed_is(bin_mr) && rk_fixed_block_size(bin_mr) < max_bytes)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_binning_add_bin: a bin for %zu bytes cannot be a fixed "
                            "resource of %zu-byte blocks",
                            max_bytes, rk_fixed_block_size(bin_mr));
        if ((st = rankmem_resource_retain(bin_mr)) != RANKMEM_SUCCESS)
            return st;
        bin = bin_mr;
    } else if ((st = rk_fixed_new(b->base.upstream, max_bytes, 0, 0, "rankmem_binning_add_bin",
                                  &bin)) != RANKMEM_SUCCESS) {
        return st;
    }
    pthread_mutex_lock(&b->cfg_lock);
    st = install(b, max_bytes, bin);
    pthread_mutex_unlock(&b->cfg_lock);
    if (st != RANKMEM_SUCCESS)
        rankmem_resource_release(bin);
    return st;
}

rankmem_status_t rankmem_binning_create(rankmem_resource_t *upstream, int min_exp, int max_exp,
                                        rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_binning_create: NULL %s",
                        upstream ? "output" : "upstream");
    if (min_exp < MIN_EXP || max_exp > MAX_EXP || min_exp > max_exp)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_binning_create: exponents %d .. %d; need %d <= min <= max <= %d",
                        min_exp, max_exp, MIN_EXP, MAX_EXP);
    unsigned props = upstream->props & (RANKMEM_PROP_DEVICE_ACCESSIBLE |
                                         RANKMEM_PROP_HOST_ACCESSIBLE);
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(binning_t), &binning_ops,
                                          props | RANKMEM_PROP_STREAM_ORDERED, upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    binning_t *b = (binning_t *)mr;
    b->base.device = upstream->device;
    b->min_exp = min_exp;
    b->max_exp = max_exp;
    pthread_mutex_init(&b->cfg_lock, NULL);
    void *large = NULL;
    if (posix_memalign(&large, 64, NLARGE * sizeof(large_t)) == 0) {
        memset(large, 0, NLARGE * sizeof(large_t));
        b->large = large;
        for (int i = 0; i < NLARGE; i++)
            pthread_mutex_init(&b->large[i].lock, NULL);
        for (int i = 0; i < NLARGE && st == RANKMEM_SUCCESS; i++)
            st = rk_ptrmap_init(&b->large[i].map, 16);
    } else {
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "binning: no host memory");
    }
    size_t n = (size_t)(max_exp - min_exp + 1);
    bin_t *bins = st == RANKMEM_SUCCESS ? calloc(n, sizeof *bins) : NULL;
    if (st == RANKMEM_SUCCESS && !bins)
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "binning: no host memory for its bins");
    size_t made = 0;
    for (; st == RANKMEM_SUCCESS && made < n; made++) {
        bins[made].size = (size_t)1 << (min_exp + (int)made);
        st = rk_fixed_new(upstream, bins[made].size, 0, 0, "rankmem_binning_create",
                          &bins[made].mr);
        if (st == RANKMEM_SUCCESS)
            bins[made].align = rk_fixed_max_align(bins[made].mr);
    }
    if (st == RANKMEM_SUCCESS && !(b->tab = tab_new(bins, n)))
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "binning: no host memory for its bins");
    if (st != RANKMEM_SUCCESS) {
        for (size_t i = 0; bins && i < made; i++)
            if (bins[i].mr)
                rankmem_resource_release(bins[i].mr);
        free(bins);
        free_host_state(b);
        rankmem_resource_release(upstream);
        return st;
    }
    free(bins);
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
