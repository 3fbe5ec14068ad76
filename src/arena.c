/* arena: a global arena, per-thread and per-stream arenas (RMM's
 * arena_memory_resource, in C). See docs/arena.md for the user's view.
 *
 * The global arena is one upstream allocation of arena_size bytes, taken at
 * creation and given back at release. It is cut into slots of
 * superblock_size bytes (a power of two); slot k starts at base + k * size.
 * Its free space is a bitmap of 256-byte units (so returns coalesce by
 * construction) with a bit per slot saying it is wholly free; it hands out
 *  - superblocks: one whole slot, the lowest free one (address-ordered first
 *    fit), to an arena that has run out of room;
 *  - large blocks: requests above one superblock, straight from the global
 *    arena at their own size (address-ordered first fit of units).
 *
 * Arenas: each thread that allocates on the default stream (NULL) has its
 * own arena, found through a thread-local slot (tslot.h); each other stream
 * has one arena, shared by the threads that use it, found through a small
 * per-thread cache of (stream, arena) pairs. Each arena has its own lock, so
 * threads on their own streams never wait for each other on the hot path,
 * write no shared cache line there (see "bytes in use" for the one shared
 * total), and nothing there calls the system or CUDA.
 *
 * Inside a superblock, free memory is a bitmap of 256-byte units (1 = free):
 * allocation is address-ordered first fit (the lowest run of free units that
 * holds the request at its alignment, found a word at a time), and freeing
 * sets the bits back, so neighbours coalesce by construction. Within an
 * arena the superblocks are tried in address order too: per size class (a
 * power of two of units) a bitmap over slots says which superblocks may hold
 * a run that long, so the first candidate is found in a few word operations.
 * Each superblock keeps an upper bound of its longest free run (lowered when
 * a search fails, raised when a free merges) so full superblocks are
 * skipped. A block is found on free from its address alone: the slot gives
 * the superblock and its owning arena (no global lookup), and a table with
 * one entry per unit holds the size asked for by the live block starting
 * there (0: none), so double frees, foreign or interior pointers and wrong
 * sizes are refused before anything changes.
 *
 * Superblocks go back to the global arena when they become wholly free; each
 * arena keeps one empty superblock so that a thread allocating and freeing
 * around a superblock boundary does not move one back and forth. When the
 * global arena has no room, every arena gives back all its empty superblocks
 * (defragment: they coalesce in the global arena) and the request is tried
 * again; if it still fails, the arena says out of memory (and, with
 * dump_on_failure, writes its state to stderr).
 *
 * Stream order. Memory handed out on stream S is valid on S; freed on S it
 * may be reused on S at once. A block freed on another stream T than its
 * arena's is kept apart (the arena's "pending" frees) until the arena needs
 * memory: then the arena's stream waits for T (one event) and the block
 * becomes free. Memory given back to the global arena remembers the streams
 * that freed it (up to four per slot; a fifth is synchronised instead);
 * whoever takes memory in that slot waits for each of them. Per-thread arenas all
 * use the legacy default stream, which orders itself: no waits between them.
 * Waits happen only when the upstream is device-accessible and a GPU is
 * present (as in the pool); over host memory streams are labels. */
#define _GNU_SOURCE
#include "internal.h"
#include "config_internal.h"
#include "ptrmap.h"
#include "tslot.h"
#include "bias.h"

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#if HAVE_GPU
#include "gpu_api.h"
#endif

#define UNIT RANKMEM_DEFAULT_ALIGNMENT /* 256 */
#define UNIT_SHIFT 8
#define DEFAULT_SUPERBLOCK ((size_t)4 << 20)
#define MIN_SUPERBLOCK ((size_t)64 << 10)
#define MAX_SUPERBLOCK ((size_t)1 << 30)
#define NTAGS 4        /* streams remembered per slot of the global arena */
#define TCACHE 4       /* (stream, arena) pairs a thread remembers */
#define PENDING_MAX 1024 /* cross-stream frees an arena holds before it drains them */
#define PENDING_STREAMS 8 /* distinct streams among them */
#define USED_BATCH ((long long)256 << 10) /* most an arena's use runs above its part */
/* What one thread writes on every pair (its superblock's fields and
 * bitmap, its arena) sits this far from what another thread writes: x86
 * cores fetch lines in aligned pairs (the adjacent-line prefetcher), so two
 * threads writing the two halves of a 128-byte pair take the lines from
 * each other much as if they shared one. Threads' superblocks are mostly
 * neighbouring slots (each takes the lowest free one), so with 64-byte
 * entries threads 2k and 2k+1 were coupled on every pair (issue 21: the
 * arena's ns per pair per thread jumped from ~67 to ~118 at the thread
 * count where two busy superblocks first became neighbours, and stayed). */
#define APART 128

typedef struct arena arena_t;

/* ---- the arenas' lock ----
 * A lock biased to the thread that made the arena (bias.h): while that
 * thread is the only one to come, it enters and leaves with plain loads and
 * stores; other threads (a free from elsewhere, a defragmentation, a query)
 * take the bias away and use the real lock. */
/* One per slot, APART bytes each: arenas on different threads write their
 * own superblocks' fields without sharing (or pairing) lines. */
typedef struct sb {
    arena_t *owner;      /* atomic: the arena holding it; NULL while in the global arena */
    uint64_t *bits;      /* free units (1 = free); meaningful while owned */
    uint64_t *nz;        /* which words of bits are non-zero: allocated regions are skipped */
    uint64_t *full;      /* which words are all ones: long free runs are crossed at once */
    uint32_t nfree;      /* free units */
    uint32_t first_word; /* no free unit in the words below */
    uint32_t max_run;    /* upper bound on the longest free run, in units */
} __attribute__((aligned(APART))) sb_t;

/* The streams that freed memory in a slot of the global arena since the slot
 * was last handed out whole: who takes memory there waits for them. */
typedef struct {
    unsigned n;
    rankmem_stream_t s[NTAGS];
} gtag_t;

/* A large block, handed out by the global arena. */
typedef struct {
    size_t req;     /* bytes asked for */
    size_t off, len; /* units */
    arena_t *acct;  /* the arena whose counters include it */
} large_t;

typedef struct {
    size_t slot, unit, units;
    rankmem_stream_t stream;
} pending_t;

struct arena {
    rk_block_t lock;
    rankmem_stream_t stream;
    int per_thread;   /* a thread's arena on the default stream */
    int forgotten;    /* its stream was forgotten (until it is used again) */
    unsigned id;
    arena_t *next;    /* every arena of the resource; pushed under tlock, never removed */
    void *event;      /* for this arena's stream to wait on others (under lock) */
    uint64_t *bucket; /* per size class c, a bitmap over slots: max_run >= class_min(c) */
    uint64_t *summary; /* per bucket: which words of its bitmap are non-zero */
    uint64_t *owned;  /* slots owned */
    size_t nsb, nempty;
    pending_t *pending;
    size_t npending, cap_pending;
    rankmem_stream_t pstreams[PENDING_STREAMS];
    unsigned npstreams;
    size_t used, used_high, live_count;
    long long delta;  /* used less this arena's part of the resource's total */
    long long floor;  /* minus a superblock's bytes: delta below it is added to the total */
    size_t waits;     /* stream orderings made for pending frees */
    size_t hint;      /* the slot that served the last small request */
} __attribute__((aligned(APART)));

typedef struct {
    arena_t *own;
    unsigned next;
    rankmem_stream_t s[TCACHE];
    arena_t *a[TCACHE];
} tcache_t;

typedef struct {
    rankmem_resource_t base;
    /* read-only after creation */
    char *mem;              /* the global arena */
    size_t arena_bytes, arena_units;
    size_t sb_bytes, units; /* units per superblock (a power of two) */
    unsigned sb_shift, nbuckets;
    size_t nslots, nwords, nsum, sb_words;
    size_t size_param;      /* arena_size as given (0: default) */
    int dump_on_failure;
    int use_events;
    sb_t *sbs;
    uint64_t *bitsmem;
    uint32_t *reqs;         /* per unit of each slot: bytes asked by the live block there */
    void *reqs_mem;         /* reqs, before aligning to a cache line */
    rk_tslot_set_t slots;
    /* What follows is written now and then: away from the fields above, which
     * every call reads (the struct is only 16-byte aligned: 2 lines apart). */
    char pad0[128];
    /* global arena (glock) */
    pthread_mutex_t glock;
    sb_t *g;                /* its free units: bitmap and summaries over the whole arena */
    size_t gwords;
    uint64_t *gslot;        /* slots wholly free */
    uint64_t *gslot_sum;    /* which words of gslot are non-zero */
    gtag_t *gtags;          /* per slot, and one for the units past the last whole slot */
    uint64_t *gmem;         /* holds g's bitmaps, gslot and gslot_sum */
    rk_ptrmap_t large;      /* ptr -> large_t */
    size_t reserved, reserved_high, nsb_out, nlarge, large_bytes;
    size_t handoffs;        /* waits for other streams when taking global memory */
    size_t tag_syncs;       /* streams synchronised because a slot had too many */
    void *gevent;
    /* arenas (tlock: creation and the stream table) */
    pthread_mutex_t tlock;
    arena_t *arenas;        /* atomic head */
    unsigned narenas;
    rk_ptrmap_t streams;    /* stream -> arena */
    arena_t *shared;        /* the default-stream arena of threads without a slot */
    pthread_mutex_t dlock;  /* one defragmentation at a time */
    char pad1[128];
    long long gused, gused_high; /* atomic: the arenas' use, added in batches */
    char pad2[128];
} ar_t;

static const rankmem_resource_ops_t arena_ops;

_Static_assert(sizeof(sb_t) == APART && sizeof(arena_t) % APART == 0,
               "superblocks' fields and arenas APART bytes apart");
_Static_assert(MIN_SUPERBLOCK / UNIT * sizeof(uint32_t) % APART == 0,
               "each slot's part of reqs a multiple of APART bytes");

/* ---- bits ---- */

static inline unsigned log2_floor(size_t n) { return 63u - (unsigned)__builtin_clzll(n); }

/* Size classes of free runs, in units: 1, then two per power of two (2, 3,
 * 4, 6, 8, 12, 16, 24, ...). class_of(v): the class whose smallest run is
 * the largest at most v (v >= 1). */
static inline unsigned class_of(size_t v)
{
    if (v < 2)
        return 0;
    unsigned fl = log2_floor(v);
    return 1u + (fl - 1u) * 2u + (unsigned)((v >> (fl - 1u)) & 1u);
}

static inline size_t class_min(unsigned c)
{
    if (c == 0)
        return 1;
    unsigned fl = (c - 1u) / 2u + 1u, sl = (c - 1u) % 2u;
    return ((size_t)2 + sl) << (fl - 1u);
}
static inline uint64_t low_mask(size_t n) { return n >= 64 ? ~0ull : (1ull << n) - 1; }
static inline int bit_get(const uint64_t *b, size_t i)
{
    return (int)((b[i / 64] >> (i % 64)) & 1);
}

static inline void sum_put(uint64_t *sum, size_t w, int on)
{
    if (on)
        sum[w / 64] |= 1ull << (w % 64);
    else
        sum[w / 64] &= ~(1ull << (w % 64));
}

/* Bits [i, j) of a bitmap on (1) or off (0). */
static void bit_range(uint64_t *m, size_t i, size_t j, int on)
{
    while (i < j) {
        size_t w = i / 64, o = i % 64, k = j - i < 64 - o ? j - i : 64 - o;
        uint64_t mask = low_mask(k) << o;
        if (on)
            m[w] |= mask;
        else
            m[w] &= ~mask;
        i += k;
        if (i % 64 == 0 && j - i >= 64) { /* whole words in between */
            size_t nw = (j - i) / 64;
            memset(&m[i / 64], on ? 0xff : 0, nw * sizeof *m);
            i += nw * 64;
        }
    }
}

static void bits_set_long(sb_t *sb, size_t u, size_t n);
static void bits_clear_long(sb_t *sb, size_t u, size_t n);

/* Units [u, u+n) of sb become free. */
static inline void bits_set(sb_t *sb, size_t u, size_t n)
{
    uint64_t *b = sb->bits;
    size_t w = u / 64, o = u % 64;
    if (RK_LIKELY(o + n <= 64)) { /* the common case: one word */
        if ((b[w] |= low_mask(n) << o) == ~0ull)
            sum_put(sb->full, w, 1);
        sum_put(sb->nz, w, 1);
        return;
    }
    bits_set_long(sb, u, n);
}

static void bits_set_long(sb_t *sb, size_t u, size_t n)
{
    uint64_t *b = sb->bits;
    size_t w = u / 64, o = u % 64;
    size_t last = (u + n - 1) / 64;
    if (last - w < 8) { /* a few words: one by one */
        b[w] |= ~0ull << o;
        for (size_t k = w + 1; k < last; k++)
            b[k] = ~0ull;
        b[last] |= low_mask((u + n - 1) % 64 + 1);
        for (size_t k = w; k <= last; k++) {
            sum_put(sb->nz, k, 1);
            if (b[k] == ~0ull)
                sum_put(sb->full, k, 1);
        }
        return;
    }
    bit_range(b, u, u + n, 1);
    bit_range(sb->nz, w, last + 1, 1);
    /* Words wholly inside are full now; the end words may be. */
    if (w + 1 < last)
        bit_range(sb->full, w + 1, last, 1);
    if (b[w] == ~0ull)
        sum_put(sb->full, w, 1);
    if (b[last] == ~0ull)
        sum_put(sb->full, last, 1);
}

/* Units [u, u+n) of sb (free) are handed out. */
static inline void bits_clear(sb_t *sb, size_t u, size_t n)
{
    uint64_t *b = sb->bits;
    size_t w = u / 64, o = u % 64;
    if (RK_LIKELY(o + n <= 64)) {
        if (!(b[w] &= ~(low_mask(n) << o)))
            sum_put(sb->nz, w, 0);
        sum_put(sb->full, w, 0);
        return;
    }
    bits_clear_long(sb, u, n);
}

static void bits_clear_long(sb_t *sb, size_t u, size_t n)
{
    uint64_t *b = sb->bits;
    size_t w = u / 64, o = u % 64;
    size_t last = (u + n - 1) / 64;
    if (last - w < 8) {
        b[w] &= ~(~0ull << o);
        for (size_t k = w + 1; k < last; k++)
            b[k] = 0;
        b[last] &= ~low_mask((u + n - 1) % 64 + 1);
        for (size_t k = w; k <= last; k++) {
            sum_put(sb->full, k, 0);
            if (!b[k])
                sum_put(sb->nz, k, 0);
        }
        return;
    }
    bit_range(b, u, u + n, 0);
    bit_range(sb->full, w, last + 1, 0);
    if (w + 1 < last)
        bit_range(sb->nz, w + 1, last, 0);
    if (!b[w])
        sum_put(sb->nz, w, 0);
    if (!b[last])
        sum_put(sb->nz, last, 0);
}

/* The first word of sb at or after wi whose bit in sum is set (want 1) or
 * clear (want 0), or nwords. */
static inline size_t sum_next(const uint64_t *sum, size_t wi, size_t nwords, int want)
{
    if (wi >= nwords)
        return nwords;
    size_t k = wi / 64;
    uint64_t flip = want ? 0 : ~0ull;
    uint64_t m = (sum[k] ^ flip) & (~0ull << (wi % 64));
    while (!m) {
        if (++k * 64 >= nwords)
            return nwords;
        m = sum[k] ^ flip;
    }
    size_t r = k * 64 + (size_t)__builtin_ctzll(m);
    return r < nwords ? r : nwords;
}

/* Bit i set iff bits i .. i+n-1 of m are all set (1 <= n <= 64). */
static inline uint64_t runs_of(uint64_t m, size_t n)
{
    size_t s = 1;
    while (2 * s <= n) {
        m &= m >> s;
        s *= 2;
    }
    if (s < n)
        m &= m >> (n - s);
    return m;
}

/* Positions p of a word with p = rem (mod au), au <= 64 a power of two. */
static inline uint64_t align_pattern(size_t au, size_t rem)
{
    uint64_t p = au == 1 ? ~0ull : au == 64 ? 1ull : ~0ull / ((1ull << au) - 1);
    return p << rem;
}

/* The lowest unit u of sb with u = rem (mod au) and units [u, u+n) free, or
 * SIZE_MAX. Visits the words with free units from the first one, a word at a
 * time, and crosses words wholly free at once. */
static size_t sb_find(sb_t *sb, size_t nwords, size_t n, size_t au, size_t rem, size_t *bound_p)
{
    const uint64_t *bits = sb->bits;
    const uint64_t pat = au <= 64 ? align_pattern(au, rem) : 0;
    size_t rs = 0; /* start of the free run reaching the current word's base */
    int run = 0;
    size_t wi = sum_next(sb->nz, sb->first_word, nwords, 1);
    sb->first_word = (uint32_t)wi; /* every word below is zero */
    if (n >= 128) {
        /* A run this long holds a wholly free word: visit only those runs.
         * Runs without one are at most 126 units. */
        size_t longest = 126;
        for (wi = sum_next(sb->full, wi, nwords, 1); wi < nwords;
             wi = sum_next(sb->full, wi + 1, nwords, 1)) {
            rs = wi * 64;
            if (wi > 0) /* the word before is not full: its top free units */
                rs -= (size_t)__builtin_clzll(~bits[wi - 1]);
            size_t c = rs + ((rem - rs) & (au - 1)), need = c + n, re;
            if (need > nwords * 64) { /* nor can later runs, which start later */
                if (nwords * 64 - rs > longest)
                    longest = nwords * 64 - rs;
                break;
            }
            /* Words [wi, lim) must be full, and word lim free below need. The
             * run's end is looked for no further than that (runs of the
             * global arena can be millions of words long). */
            size_t lim = need / 64, end = sum_next(sb->full, wi, lim, 0);
            if (end == lim) {
                if (need % 64 == 0 || !(~bits[lim] & low_mask(need % 64)))
                    return c;
                re = lim * 64 + (size_t)__builtin_ctzll(~bits[lim]);
            } else
                re = end * 64 + (size_t)__builtin_ctzll(~bits[end]);
            if (re - rs > longest)
                longest = re - rs;
            wi = end;
        }
        *bound_p = longest;
        return SIZE_MAX;
    }
    /* Shorter: every word with a free unit, in order (bits of nz, one at a time). */
    size_t k = wi / 64, prev = SIZE_MAX - 1;
    uint64_t m = wi < nwords ? sb->nz[k] & (~0ull << (wi % 64)) : 0;
    for (;;) {
        while (!m) {
            if (++k * 64 >= nwords)
                goto last;
            m = sb->nz[k];
        }
        wi = k * 64 + (size_t)__builtin_ctzll(m);
        m &= m - 1;
        uint64_t w = bits[wi];
        size_t base = wi * 64;
        if (wi != prev + 1)
            run = 0; /* zero words between: the run ended */
        prev = wi;
        if (w == ~0ull) {
            if (!run) {
                rs = base;
                run = 1;
            }
            size_t c = rs + ((rem - rs) & (au - 1));
            if (c + n <= base + 64)
                return c;
            /* Words [wi, end) are wholly free: one step. */
            size_t end = sum_next(sb->full, wi, nwords, 0);
            if (c + n <= end * 64)
                return c;
            /* Go on at word end, which continues the run if it has free units. */
            prev = end - 1;
            k = end / 64;
            m = end < nwords ? sb->nz[k] & (~0ull << (end % 64)) : 0;
            continue;
        }
        if (run) {
            unsigned tz = (unsigned)__builtin_ctzll(~w);
            size_t c = rs + ((rem - rs) & (au - 1));
            if (c + n <= base + tz)
                return c;
        }
        if (n <= 64) {
            uint64_t mm = runs_of(w, n);
            if (au <= 64)
                mm &= pat;
            else {
                size_t c = base + ((rem - base) & (au - 1));
                mm &= c < base + 64 ? 1ull << (c - base) : 0;
            }
            if (mm)
                return base + (size_t)__builtin_ctzll(mm);
        }
        if (w >> 63) {
            rs = base + 64 - (unsigned)__builtin_clzll(~w);
            run = 1;
        } else
            run = 0;
    }
last:
    if (run && prev == nwords - 1) {
        size_t c = rs + ((rem - rs) & (au - 1));
        if (c + n <= nwords * 64)
            return c;
    }
    if (au == 1) /* every run is shorter than n */
        *bound_p = n - 1;
    return SIZE_MAX;
}

/* Free runs and the longest one (exact, for queries and the dump). */
static void sb_runs(const sb_t *sb, size_t nwords, size_t *runs_p, size_t *longest_p)
{
    size_t runs = 0, longest = 0, cur = 0;
    uint64_t prev_top = 0;
    for (size_t wi = 0; wi < nwords; wi++) {
        uint64_t w = sb->bits[wi];
        runs += (size_t)__builtin_popcountll(w & ~((w << 1) | prev_top));
        prev_top = w >> 63;
        if (w == ~0ull) {
            cur += 64;
            continue;
        }
        if (!w) {
            if (cur > longest)
                longest = cur;
            cur = 0;
            continue;
        }
        for (int i = 0; i < 64; i++) {
            if ((w >> i) & 1)
                cur++;
            else {
                if (cur > longest)
                    longest = cur;
                cur = 0;
            }
        }
    }
    if (cur > longest)
        longest = cur;
    *runs_p = runs;
    *longest_p = longest;
}

/* ---- per-arena bucket bitmaps ---- */

static inline uint64_t *bucket_words(const ar_t *r, const arena_t *a, unsigned b)
{
    return a->bucket + (size_t)b * r->nwords;
}

static inline uint64_t *bucket_sum(const ar_t *r, const arena_t *a, unsigned b)
{
    return a->summary + (size_t)b * r->nsum;
}

/* The lowest slot >= from in bucket b, or SIZE_MAX. */
static inline size_t bucket_next(const ar_t *r, const arena_t *a, unsigned b, size_t from)
{
    const uint64_t *w = bucket_words(r, a, b);
    size_t wi = from / 64;
    if (wi >= r->nwords)
        return SIZE_MAX;
    uint64_t bits = w[wi] & (~0ull << (from % 64));
    if (bits)
        return wi * 64 + (size_t)__builtin_ctzll(bits);
    const uint64_t *s = bucket_sum(r, a, b);
    size_t k = wi + 1, si = k / 64;
    if (si >= r->nsum)
        return SIZE_MAX;
    uint64_t sw = s[si] & (~0ull << (k % 64));
    while (!sw) {
        if (++si >= r->nsum)
            return SIZE_MAX;
        sw = s[si];
    }
    wi = si * 64 + (size_t)__builtin_ctzll(sw);
    return wi * 64 + (size_t)__builtin_ctzll(w[wi]);
}

static void bucket_put(const ar_t *r, arena_t *a, unsigned b, size_t slot, int on)
{
    uint64_t *w = bucket_words(r, a, b), *s = bucket_sum(r, a, b);
    size_t wi = slot / 64;
    if (on) {
        w[wi] |= 1ull << (slot % 64);
        s[wi / 64] |= 1ull << (wi % 64);
    } else {
        w[wi] &= ~(1ull << (slot % 64));
        if (!w[wi])
            s[wi / 64] &= ~(1ull << (wi % 64));
    }
}

/* Change a superblock's bound on its longest run, keeping the buckets (a
 * superblock is in the buckets of classes 0 .. class_of(max_run)). */
static void set_max_run(const ar_t *r, arena_t *a, size_t slot, size_t v)
{
    sb_t *sb = &r->sbs[slot];
    unsigned ob = sb->max_run ? class_of(sb->max_run) + 1 : 0;
    unsigned nb = v ? class_of(v) + 1 : 0;
    for (unsigned b = nb; b < ob; b++)
        bucket_put(r, a, b, slot, 0);
    for (unsigned b = ob; b < nb; b++)
        bucket_put(r, a, b, slot, 1);
    sb->max_run = (uint32_t)v;
}

/* ---- the global arena (glock held) ----
 * Its free units are a bitmap with the superblocks' summaries, searched with
 * sb_find; a second bitmap says which slots are wholly free (superblocks are
 * the lowest of them). */

static inline void gslot_put(ar_t *r, size_t s, int on)
{
    if (on) {
        r->gslot[s / 64] |= 1ull << (s % 64);
        r->gslot_sum[s / 4096] |= 1ull << (s / 64 % 64);
    } else if (!(r->gslot[s / 64] &= ~(1ull << (s % 64))))
        r->gslot_sum[s / 4096] &= ~(1ull << (s / 64 % 64));
}

/* The lowest wholly free slot, or SIZE_MAX. */
static size_t gslot_first(const ar_t *r)
{
    for (size_t k = 0; k < r->nsum; k++)
        if (r->gslot_sum[k]) {
            size_t wi = k * 64 + (size_t)__builtin_ctzll(r->gslot_sum[k]);
            return wi * 64 + (size_t)__builtin_ctzll(r->gslot[wi]);
        }
    return SIZE_MAX;
}

/* Every unit of slot s is free in the global arena. */
static int slot_free(const ar_t *r, size_t s)
{
    size_t w0 = s * r->sb_words, nw = r->sb_words; /* a power of two, at least 4 */
    const uint64_t *full = r->g->full;
    if (nw < 64) {
        uint64_t m = low_mask(nw) << (w0 % 64);
        return (full[w0 / 64] & m) == m;
    }
    for (size_t k = w0 / 64; k < (w0 + nw) / 64; k++)
        if (full[k] != ~0ull)
            return 0;
    return 1;
}

static void tags_add(ar_t *r, gtag_t *g, rankmem_stream_t s)
{
    for (unsigned i = 0; i < g->n; i++)
        if (g->s[i] == s)
            return;
    if (g->n < NTAGS) {
        g->s[g->n++] = s;
        return;
    }
    /* No room to remember s: make its work so far finished instead. */
    if (r->use_events)
        (void)rk_gpu_stream_sync(s);
    r->tag_syncs++;
}

/* stream waits, once each, for the streams that freed memory in slots s0..s1. */
static rankmem_status_t wait_tags(ar_t *r, size_t s0, size_t s1, rankmem_stream_t stream)
{
    rankmem_stream_t done[2 * NTAGS];
    unsigned nd = 0;
    for (size_t s = s0; s <= s1; s++)
        for (unsigned t = 0; t < r->gtags[s].n; t++) {
            rankmem_stream_t from = r->gtags[s].s[t];
            unsigned k = 0;
            while (k < nd && done[k] != from)
                k++;
            if (from == stream || k < nd)
                continue;
            if (r->use_events) {
                rankmem_status_t st = rk_gpu_stream_wait(stream, from, &r->gevent);
                if (st != RANKMEM_SUCCESS)
                    return st;
            }
            r->handoffs++;
            if (nd < 2 * NTAGS)
                done[nd++] = from;
        }
    return RANKMEM_SUCCESS;
}

/* n units at the lowest u = rem (mod au), for stream (after its waits), in
 * *u_p; RANKMEM_ERR_OUT_OF_MEMORY (no error recorded) when none is free. */
static rankmem_status_t global_take(ar_t *r, size_t n, size_t au, size_t rem,
                                    rankmem_stream_t stream, size_t *u_p)
{
    size_t bound, u = sb_find(r->g, r->gwords, n, au, rem, &bound);
    if (u == SIZE_MAX)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    size_t s0 = u / r->units, s1 = (u + n - 1) / r->units;
    rankmem_status_t st = wait_tags(r, s0, s1, stream);
    if (st != RANKMEM_SUCCESS)
        return st;
    bits_clear(r->g, u, n);
    for (size_t s = s0; s <= s1 && s < r->nslots; s++) {
        gslot_put(r, s, 0);
        if (u <= s * r->units && (s + 1) * r->units <= u + n)
            r->gtags[s].n = 0; /* handed out whole: nothing left there to order */
    }
    *u_p = u;
    return RANKMEM_SUCCESS;
}

/* The lowest wholly free slot, for stream (after its waits). */
static rankmem_status_t global_take_slot(ar_t *r, rankmem_stream_t stream, size_t *slot_p)
{
    size_t s = gslot_first(r);
    if (s == SIZE_MAX)
        return RANKMEM_ERR_OUT_OF_MEMORY;
    rankmem_status_t st = wait_tags(r, s, s, stream);
    if (st != RANKMEM_SUCCESS)
        return st;
    bits_clear(r->g, s * r->units, r->units);
    gslot_put(r, s, 0);
    r->gtags[s].n = 0;
    *slot_p = s;
    return RANKMEM_SUCCESS;
}

/* Units [u, u+n) come back, freed on *stream (NULL: nothing to wait for). */
static void global_put(ar_t *r, size_t u, size_t n, const rankmem_stream_t *stream)
{
    bits_set(r->g, u, n);
    if (u / 64 < r->g->first_word)
        r->g->first_word = (uint32_t)(u / 64);
    size_t s0 = u / r->units, s1 = (u + n - 1) / r->units;
    for (size_t s = s0; s <= s1; s++) {
        int whole = s < r->nslots && u <= s * r->units && (s + 1) * r->units <= u + n;
        if (whole)
            r->gtags[s].n = 0; /* all of it came back: only this stream to wait for */
        if (stream)
            tags_add(r, &r->gtags[s], *stream);
        if (s < r->nslots && (whole || slot_free(r, s)))
            gslot_put(r, s, 1);
    }
}

/* Free units of the global arena, its runs and the longest one. */
static void global_free_units(const ar_t *r, size_t *free_p, size_t *runs_p, size_t *longest_p)
{
    size_t f = 0;
    for (size_t k = 0; k < r->gwords; k++)
        f += (size_t)__builtin_popcountll(r->g->bits[k]);
    sb_runs(r->g, r->gwords, runs_p, longest_p);
    *free_p = f;
}

/* ---- superblocks moving between an arena (locked) and the global arena ---- */

/* A superblock for a (locked). *exhausted_p is set when the global arena has
 * no whole superblock free (no error recorded then). */
static rankmem_status_t acquire_sb(ar_t *r, arena_t *a, size_t *slot_p, int *exhausted_p)
{
    size_t slot = 0;
    pthread_mutex_lock(&r->glock);
    rankmem_status_t st = global_take_slot(r, a->stream, &slot);
    if (st == RANKMEM_ERR_OUT_OF_MEMORY)
        *exhausted_p = 1;
    if (st == RANKMEM_SUCCESS) {
        r->reserved += r->sb_bytes;
        if (r->reserved > r->reserved_high)
            r->reserved_high = r->reserved;
        r->nsb_out++;
        sb_t *sb = &r->sbs[slot];
        memset(sb->bits, 0xff, r->units / 8);
        for (size_t k = 0, left = r->sb_words; k * 64 < r->sb_words; k++, left -= 64)
            sb->nz[k] = sb->full[k] = low_mask(left);
        sb->nfree = (uint32_t)r->units;
        sb->first_word = 0;
        sb->max_run = 0;
        __atomic_store_n(&sb->owner, a, __ATOMIC_RELEASE);
        *slot_p = slot;
    }
    pthread_mutex_unlock(&r->glock);
    if (st == RANKMEM_SUCCESS) {
        set_max_run(r, a, *slot_p, r->units);
        a->owned[*slot_p / 64] |= 1ull << (*slot_p % 64);
        a->nsb++;
        a->nempty++;
    }
    return st;
}

/* Give an empty superblock back to the global arena. */
static void release_sb(ar_t *r, arena_t *a, size_t slot)
{
    pthread_mutex_lock(&r->glock);
    /* Out of a's buckets before another arena can take it. */
    set_max_run(r, a, slot, 0);
    global_put(r, slot * r->units, r->units, a->forgotten ? NULL : &a->stream);
    __atomic_store_n(&r->sbs[slot].owner, NULL, __ATOMIC_RELEASE);
    r->reserved -= r->sb_bytes;
    r->nsb_out--;
    pthread_mutex_unlock(&r->glock);
    a->owned[slot / 64] &= ~(1ull << (slot % 64));
    a->nsb--;
    a->nempty--;
}

/* Units [u, u+n) of slot become free in a (locked). */
static void sb_free_units(ar_t *r, arena_t *a, size_t slot, size_t u, size_t n)
{
    sb_t *sb = &r->sbs[slot];
    uint64_t *bits = sb->bits;
    int left = 0, right = 0;
    if (sb->max_run < r->units) { /* free neighbours: the merged run may be longer */
        left = u > 0 && bit_get(bits, u - 1);
        right = u + n < r->units && bit_get(bits, u + n);
    }
    bits_set(sb, u, n);
    sb->nfree += (uint32_t)n;
    if (u / 64 < sb->first_word)
        sb->first_word = (uint32_t)(u / 64);
    if (sb->nfree == r->units) {
        if (sb->max_run != r->units)
            set_max_run(r, a, slot, r->units);
        /* Keep one empty superblock; give back the others. */
        if (++a->nempty > 1)
            release_sb(r, a, slot);
    } else if (sb->max_run < r->units) {
        size_t bound = n + (left ? sb->max_run : 0) + (right ? sb->max_run : 0);
        if (bound > r->units)
            bound = r->units;
        if (bound > sb->max_run)
            set_max_run(r, a, slot, bound);
    }
}

/* The frees made on other streams become usable: a's stream waits for each
 * of those streams once. */
static rankmem_status_t drain_pending(ar_t *r, arena_t *a)
{
    for (unsigned i = 0; i < a->npstreams; i++) {
        if (r->use_events) {
            /* A forgotten stream cannot wait: the host waits instead. */
            rankmem_status_t st =
                a->forgotten ? rk_gpu_stream_sync(a->pstreams[i])
                             : rk_gpu_stream_wait(a->stream, a->pstreams[i], &a->event);
            if (st != RANKMEM_SUCCESS)
                return st;
        }
        a->waits++;
    }
    a->npstreams = 0;
    size_t n = a->npending;
    a->npending = 0;
    for (size_t i = 0; i < n; i++) {
        pending_t *p = &a->pending[i];
        sb_free_units(r, a, p->slot, p->unit, p->units);
    }
    return RANKMEM_SUCCESS;
}

/* Every empty superblock of a (locked) back to the global arena, while more
 * than keep bytes are reserved. */
static rankmem_status_t give_back(ar_t *r, arena_t *a, size_t keep)
{
    rankmem_status_t st = a->npending ? drain_pending(r, a) : RANKMEM_SUCCESS;
    for (size_t wi = 0; wi < r->nwords && a->nempty; wi++)
        for (uint64_t w = a->owned[wi]; w; w &= w - 1) {
            size_t slot = wi * 64 + (size_t)__builtin_ctzll(w);
            if (r->sbs[slot].nfree != r->units)
                continue;
            pthread_mutex_lock(&r->glock);
            size_t reserved = r->reserved;
            pthread_mutex_unlock(&r->glock);
            if (reserved <= keep)
                return st;
            release_sb(r, a, slot);
        }
    return st;
}

static inline arena_t *arena_first(const ar_t *r)
{
    return __atomic_load_n(&r->arenas, __ATOMIC_ACQUIRE);
}

/* Every arena gives back its empty superblocks (they coalesce in the global
 * arena). No arena lock may be held by the caller. */
static rankmem_status_t defragment(ar_t *r, size_t keep)
{
    rankmem_status_t result = RANKMEM_SUCCESS;
    pthread_mutex_lock(&r->dlock);
    for (arena_t *a = arena_first(r); a; a = a->next) {
        int am = rk_block_lock(&a->lock);
        rankmem_status_t st = give_back(r, a, keep);
        rk_block_unlock(&a->lock, am);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
    }
    pthread_mutex_unlock(&r->dlock);
    return result;
}

/* ---- arenas ---- */

static void arena_free(arena_t *a)
{
    if (!a)
        return;
    rk_gpu_event_destroy(a->event);
    free(a->bucket);
    free(a->pending);
    free(a);
}

/* A new arena for stream, on the list (tlock held). */
static arena_t *arena_new(ar_t *r, rankmem_stream_t stream, int per_thread)
{
    arena_t *a = NULL;
    if (posix_memalign((void **)&a, APART, sizeof *a) != 0)
        return NULL;
    memset(a, 0, sizeof *a);
    rk_block_init(&a->lock, 1); /* biased to the thread that made it */
    /* Its own cache lines: arenas of other threads never share one with it. */
    size_t bytes = rk_align_up((r->nbuckets * (r->nwords + r->nsum) + r->nwords) * 8, APART);
    if (posix_memalign((void **)&a->bucket, APART, bytes) == 0)
        memset(a->bucket, 0, bytes);
    else
        a->bucket = NULL;
    if (!a->bucket) {
        free(a);
        return NULL;
    }
    a->summary = a->bucket + r->nbuckets * r->nwords;
    a->owned = a->summary + r->nbuckets * r->nsum;
    a->stream = stream;
    a->floor = -(long long)r->sb_bytes;
    a->per_thread = per_thread;
    a->id = ++r->narenas;
    a->next = r->arenas;
    __atomic_store_n(&r->arenas, a, __ATOMIC_RELEASE);
    return a;
}

static arena_t *my_arena_slow(ar_t *r, rankmem_stream_t stream, tcache_t *t)
{
    arena_t *a = NULL;
    pthread_mutex_lock(&r->tlock);
    if (!stream) {
        if (t && t->own)
            a = t->own;
        else if (t)
            a = t->own = arena_new(r, NULL, 1);
        else /* no thread slot: one arena shared by such threads */
            a = r->shared ? r->shared : (r->shared = arena_new(r, NULL, 1));
    } else {
        a = rk_ptrmap_get(&r->streams, stream);
        if (!a && (a = arena_new(r, stream, 0)) != NULL &&
            rk_ptrmap_insert(&r->streams, stream, a) != RANKMEM_SUCCESS)
            a = NULL; /* stays on the list, unused; freed with the resource */
        if (a && t) {
            t->s[t->next] = stream;
            t->a[t->next] = a;
            t->next = (t->next + 1) % TCACHE;
        }
    }
    pthread_mutex_unlock(&r->tlock);
    return a;
}

/* The calling thread's arena for stream: a thread-local compare, no lock. */
static inline arena_t *my_arena(ar_t *r, rankmem_stream_t stream)
{
    tcache_t *t = rk_tslot_get(&r->slots);
    if (RK_LIKELY(t != NULL)) {
        if (!stream) {
            if (RK_LIKELY(t->own != NULL))
                return t->own;
        } else
            for (int i = 0; i < TCACHE; i++)
                if (t->s[i] == stream)
                    return t->a[i];
    }
    return my_arena_slow(r, stream, t);
}

/* ---- bytes in use ----
 * Each arena counts its own bytes (exact, under its lock) and keeps a part of
 * the resource's shared total, which it moves to its use only when the use
 * runs USED_BATCH above it or a superblock below it. The band is lopsided
 * because a thread allocating and freeing at once blocks of up to a
 * superblock would otherwise write the shared line twice a pair (blocks of
 * 256 KiB and more), and 16 threads doing so serialize on that line: here its
 * part rises to the largest block it holds and then stays. So the total is
 * within (arenas x USED_BATCH) below the true one and (arenas x a superblock)
 * above it; its peak likewise (the query also caps it by the peak reserved).
 * While one arena is in use its own exact peak is answered. */

static void used_flush(ar_t *r, arena_t *a)
{
    long long now = __atomic_add_fetch(&r->gused, a->delta, __ATOMIC_RELAXED);
    a->delta = 0;
    long long h = __atomic_load_n(&r->gused_high, __ATOMIC_RELAXED);
    while (now > h && !__atomic_compare_exchange_n(&r->gused_high, &h, now, 1, __ATOMIC_RELAXED,
                                                   __ATOMIC_RELAXED))
        ;
}

static inline void used_add(ar_t *r, arena_t *a, size_t bytes)
{
    a->live_count++;
    a->used += bytes;
    if (a->used > a->used_high)
        a->used_high = a->used;
    if (RK_UNLIKELY((a->delta += (long long)bytes) >= USED_BATCH))
        used_flush(r, a);
}

static inline void used_sub(ar_t *r, arena_t *a, size_t bytes)
{
    a->live_count--;
    a->used -= bytes;
    if (RK_UNLIKELY((a->delta -= (long long)bytes) < a->floor))
        used_flush(r, a);
}

/* ---- dump ---- */

/* The next run of free units of the global arena at or after *u: its start
 * in *u and its length (0: none). */
static size_t global_next_run(const ar_t *r, size_t *u)
{
    const uint64_t *b = r->g->bits;
    size_t total = r->gwords * 64, i = *u, j;
    for (;; i = (i / 64 + 1) * 64) {
        if (i >= total)
            return 0;
        uint64_t m = b[i / 64] & (~0ull << (i % 64));
        if (m) {
            i = i / 64 * 64 + (size_t)__builtin_ctzll(m);
            break;
        }
    }
    for (j = i;; j = (j / 64 + 1) * 64) {
        if (j >= total) {
            j = total;
            break;
        }
        uint64_t m = ~b[j / 64] & (~0ull << (j % 64));
        if (m) {
            j = j / 64 * 64 + (size_t)__builtin_ctzll(m);
            break;
        }
    }
    *u = i;
    return j - i;
}

/* The streams that freed memory in the slots of [u, u+n). */
static void dump_streams(FILE *out, const ar_t *r, size_t u, size_t n)
{
    rankmem_stream_t seen[16];
    unsigned ns = 0;
    for (size_t s = u / r->units; s <= (u + n - 1) / r->units; s++)
        for (unsigned t = 0; t < r->gtags[s].n; t++) {
            unsigned k = 0;
            while (k < ns && seen[k] != r->gtags[s].s[t])
                k++;
            if (k == ns && ns < 16)
                seen[ns++] = r->gtags[s].s[t];
        }
    if (!ns) {
        fprintf(out, " (fresh)");
        return;
    }
    fprintf(out, " freed on");
    for (unsigned i = 0; i < ns; i++)
        fprintf(out, " %p", (void *)seen[i]);
}

static void dump_large(const void *key, void *value, void *arg)
{
    const large_t *l = value;
    fprintf(arg, "    large block %p: %zu bytes asked, %zu held\n", key, l->req,
            l->len << UNIT_SHIFT);
}

static void arena_dump_state(ar_t *r, FILE *out)
{
    pthread_mutex_lock(&r->glock);
    size_t free_units, runs, largest;
    global_free_units(r, &free_units, &runs, &largest);
    fprintf(out,
            "arena %p: global arena of %zu bytes at %p, %zu superblocks of %zu bytes; "
            "larger requests straight from the global arena\n",
            (void *)r, r->arena_bytes, (void *)r->mem, r->nslots, r->sb_bytes);
    fprintf(out,
            "  reserved %zu bytes (high %zu): %zu superblocks in arenas, %zu large blocks "
            "(%zu bytes)\n",
            r->reserved, r->reserved_high, r->nsb_out, r->nlarge, r->large_bytes);
    fprintf(out,
            "  global arena: %zu free bytes in %zu ranges, largest %zu; %zu stream waits for "
            "memory taken, %zu streams synchronised\n",
            free_units << UNIT_SHIFT, runs, largest << UNIT_SHIFT, r->handoffs, r->tag_syncs);
    size_t u = 0, len, shown = 0;
    for (; (len = global_next_run(r, &u)) != 0; u += len) {
        if (shown++ == 64) {
            fprintf(out, "    ... %zu more free ranges\n", runs - 64);
            break;
        }
        fprintf(out, "    free %p, %zu bytes:", (void *)(r->mem + (u << UNIT_SHIFT)),
                len << UNIT_SHIFT);
        dump_streams(out, r, u, len);
        fputc('\n', out);
    }
    rk_ptrmap_each(&r->large, dump_large, out);
    pthread_mutex_unlock(&r->glock);
    for (arena_t *a = arena_first(r); a; a = a->next) {
        int am = rk_block_lock(&a->lock);
        if (a->per_thread)
            fprintf(out, "  arena %u (a thread's, default stream):", a->id);
        else
            fprintf(out, "  arena %u (stream %p%s):", a->id, (void *)a->stream,
                    a->forgotten ? ", forgotten" : "");
        fprintf(out,
                " %zu superblocks (%zu empty), %zu live blocks, %zu bytes used (high %zu), "
                "%zu pending frees from other streams, %zu stream waits for them\n",
                a->nsb, a->nempty, a->live_count, a->used, a->used_high, a->npending, a->waits);
        for (size_t wi = 0; wi < r->nwords; wi++)
            for (uint64_t w = a->owned[wi]; w; w &= w - 1) {
                size_t slot = wi * 64 + (size_t)__builtin_ctzll(w), sruns, slongest;
                const sb_t *sb = &r->sbs[slot];
                sb_runs(sb, r->units / 64, &sruns, &slongest);
                fprintf(out,
                        "    superblock %p: %zu of %zu bytes free in %zu runs, largest %zu\n",
                        (void *)(r->mem + slot * r->sb_bytes), (size_t)sb->nfree << UNIT_SHIFT,
                        r->sb_bytes, sruns, slongest << UNIT_SHIFT);
            }
        rk_block_unlock(&a->lock, am);
    }
    fflush(out);
}

/* The arena in mr's chain (mr itself, or one of its upstreams), or NULL. */
static ar_t *find_arena(rankmem_resource_t *mr)
{
    for (rankmem_resource_t *x = mr; x; x = x->upstream)
        if (x->ops == &arena_ops)
            return (ar_t *)x;
    return NULL;
}

rankmem_status_t rankmem_arena_dump(rankmem_resource_t *mr, FILE *out)
{
    if (!mr || !out)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_arena_dump: NULL %s",
                        mr ? "FILE" : "resource");
    ar_t *r = find_arena(mr);
    if (!r)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_arena_dump: no arena in the chain of '%s'",
                        mr->ops->name ? mr->ops->name : "unnamed");
    arena_dump_state(r, out);
    if (ferror(out))
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_arena_dump: write error");
    return RANKMEM_SUCCESS;
}

/* ---- allocate / deallocate ---- */

static rankmem_status_t out_of_memory(ar_t *r, size_t bytes, size_t alignment, int large)
{
    size_t reserved, free_units, runs, largest;
    pthread_mutex_lock(&r->glock);
    reserved = r->reserved;
    global_free_units(r, &free_units, &runs, &largest);
    pthread_mutex_unlock(&r->glock);
    if (r->dump_on_failure) {
        fprintf(stderr, "rankmem arena: allocate of %zu bytes (alignment %zu) failed; state:\n",
                bytes, alignment);
        arena_dump_state(r, stderr);
    }
    return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                    "arena: %zu bytes (alignment %zu) do not fit: %s; %zu of %zu bytes handed "
                    "out, the global arena has %zu free bytes, largest %zu, after defragmenting",
                    bytes, alignment,
                    large ? "no free range of the global arena is large enough"
                          : "no arena has room and the global arena has no whole superblock "
                            "free",
                    reserved, r->arena_bytes, free_units << UNIT_SHIFT, largest << UNIT_SHIFT);
}

static rankmem_status_t allocate_large(ar_t *r, arena_t *a, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    size_t n = (bytes + UNIT - 1) >> UNIT_SHIFT;
    size_t au = alignment >> UNIT_SHIFT;
    size_t rem = (size_t)((alignment - (uintptr_t)r->mem % alignment) % alignment) >> UNIT_SHIFT;
    large_t *l = malloc(sizeof *l);
    if (!l)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "arena: no host memory for a block record");
    for (int attempt = 0;; attempt++) {
        size_t off = 0;
        int exhausted = 0;
        pthread_mutex_lock(&r->glock);
        rankmem_status_t st = global_take(r, n, au, rem, stream, &off);
        if (st == RANKMEM_ERR_OUT_OF_MEMORY)
            exhausted = 1;
        if (st == RANKMEM_SUCCESS) {
            char *p = r->mem + (off << UNIT_SHIFT);
            *l = (large_t){.req = bytes, .off = off, .len = n, .acct = a};
            st = rk_ptrmap_insert(&r->large, p, l);
            if (st != RANKMEM_SUCCESS) {
                global_put(r, off, n, &stream);
            } else {
                r->reserved += n << UNIT_SHIFT;
                if (r->reserved > r->reserved_high)
                    r->reserved_high = r->reserved;
                r->nlarge++;
                r->large_bytes += n << UNIT_SHIFT;
                *ptr_p = p;
            }
        }
        pthread_mutex_unlock(&r->glock);
        if (st == RANKMEM_SUCCESS)
            break;
        if (!exhausted || attempt == 1) {
            free(l);
            return exhausted ? out_of_memory(r, bytes, alignment, 1) : st;
        }
        if ((st = defragment(r, 0)) != RANKMEM_SUCCESS) {
            free(l);
            return st;
        }
    }
    int am = rk_block_lock(&a->lock);
    used_add(r, a, bytes);
    rk_block_unlock(&a->lock, am);
    return RANKMEM_SUCCESS;
}

/* Words [w, w+k) of sb are all free (k >= 1). */
static inline int full_words(const sb_t *sb, size_t w, size_t k, size_t nwords)
{
    if (w + k > nwords)
        return 0;
    while (k) {
        size_t o = w % 64, take = k < 64 - o ? k : 64 - o;
        uint64_t m = low_mask(take) << o;
        if ((sb->full[w / 64] & m) != m)
            return 0;
        w += take;
        k -= take;
    }
    return 1;
}

/* Most often the first word of sb with free units has room for n units
 * (no alignment): no word below has any, so its lowest fit is sb's. */
static inline int first_word_fit(const ar_t *r, const sb_t *sb, size_t n, size_t *unit_p)
{
    size_t fw = sb->first_word;
    if (fw >= r->sb_words)
        return 0;
    uint64_t w = sb->bits[fw];
    if (w == ~0ull && full_words(sb, fw, (n + 63) / 64, r->sb_words)) {
        *unit_p = fw * 64;
        return 1;
    }
    uint64_t m = n <= 64 ? runs_of(w, n) : 0;
    if (m) {
        *unit_p = fw * 64 + (size_t)__builtin_ctzll(m);
        return 1;
    }
    return 0;
}

/* Try the superblocks of bucket c in address order; 1 when one has room. */
static int find_in_bucket(ar_t *r, arena_t *a, unsigned c, size_t n, size_t au, size_t rem,
                          size_t *slot_p, size_t *unit_p)
{
    for (size_t slot = bucket_next(r, a, c, 0); slot != SIZE_MAX;
         slot = bucket_next(r, a, c, slot + 1)) {
        sb_t *sb = &r->sbs[slot];
        if (sb->max_run < n)
            continue;
        if (au == 1 && first_word_fit(r, sb, n, unit_p)) {
            *slot_p = slot;
            return 1;
        }
        size_t bound = sb->max_run;
        size_t u = sb_find(sb, r->sb_words, n, au, rem, &bound);
        if (RK_LIKELY(u != SIZE_MAX)) {
            *slot_p = slot;
            *unit_p = u;
            return 1;
        }
        if (bound < sb->max_run) /* what the search learnt about its longest run */
            set_max_run(r, a, slot, bound);
    }
    return 0;
}

/* A superblock of a (locked) with room. First the class at or above n: every
 * superblock there may hold n units, and the lowest that does wins; then the
 * class below, whose superblocks may hold runs between its smallest and n. */
static int arena_find(ar_t *r, arena_t *a, size_t n, size_t au, size_t rem, size_t *slot_p,
                      size_t *unit_p)
{
    unsigned lo = class_of(n), up = class_min(lo) == n ? lo : lo + 1;
    if (up < r->nbuckets && find_in_bucket(r, a, up, n, au, rem, slot_p, unit_p))
        return 1;
    return up != lo && find_in_bucket(r, a, lo, n, au, rem, slot_p, unit_p);
}

static rankmem_status_t arena_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                       rankmem_stream_t stream, void **ptr_p)
{
    ar_t *r = (ar_t *)mr;
    arena_t *a = my_arena(r, stream);
    if (RK_UNLIKELY(!a))
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "arena: no host memory for an arena");
    size_t n = (bytes + UNIT - 1) >> UNIT_SHIFT;
    size_t au = alignment >> UNIT_SHIFT, rem = 0;
    if (RK_UNLIKELY(au > 1)) {
        if (alignment > r->sb_bytes)
            return allocate_large(r, a, bytes, alignment, stream, ptr_p);
        /* Slots are multiples of the alignment apart: the same offset in each. */
        rem = (size_t)((alignment - (uintptr_t)r->mem % alignment) % alignment) >> UNIT_SHIFT;
    }
    if (RK_UNLIKELY(n > r->units - rem))
        return allocate_large(r, a, bytes, alignment, stream, ptr_p);
    size_t slot = 0, u = 0;
    int exhausted = 0;
    rankmem_status_t st = RANKMEM_SUCCESS;
    int am = rk_block_lock(&a->lock);
    a->forgotten = 0; /* a stream used again is alive */
    /* The superblock that served the last request first: a thread's
     * requests stay together, and the bucket search is skipped. */
    sb_t *hs = &r->sbs[a->hint];
    if (RK_LIKELY(au == 1 && __atomic_load_n(&hs->owner, __ATOMIC_RELAXED) == a &&
                  hs->max_run >= n && first_word_fit(r, hs, n, &u)))
        slot = a->hint;
    else if (RK_UNLIKELY(!arena_find(r, a, n, au, rem, &slot, &u))) {
        for (int attempt = 0;; attempt++) {
            if (a->npending) {
                if ((st = drain_pending(r, a)) != RANKMEM_SUCCESS)
                    goto out;
                if (arena_find(r, a, n, au, rem, &slot, &u))
                    break;
            }
            exhausted = 0;
            st = acquire_sb(r, a, &slot, &exhausted);
            if (st == RANKMEM_SUCCESS) {
                size_t bound;
                u = sb_find(&r->sbs[slot], r->sb_words, n, au, rem, &bound);
                break; /* a whole superblock holds n units at offset rem */
            }
            if (!exhausted || attempt == 1)
                goto out;
            /* Exhausted: every arena gives back its empty superblocks. */
            rk_block_unlock(&a->lock, am);
            st = defragment(r, 0);
            am = rk_block_lock(&a->lock);
            if (st != RANKMEM_SUCCESS) {
                exhausted = 0;
                goto out;
            }
            if (arena_find(r, a, n, au, rem, &slot, &u))
                break;
        }
    }
    exhausted = 0; /* found room, perhaps after defragmenting */
    a->hint = slot;
    sb_t *sb = &r->sbs[slot];
    char *p = r->mem + slot * r->sb_bytes + (u << UNIT_SHIFT);
    r->reqs[slot * r->units + u] = (uint32_t)bytes;
    if (sb->nfree == r->units)
        a->nempty--;
    bits_clear(sb, u, n);
    sb->nfree -= (uint32_t)n;
    used_add(r, a, bytes);
    *ptr_p = p;
out:
    rk_block_unlock(&a->lock, am);
    if (RK_UNLIKELY(exhausted))
        return out_of_memory(r, bytes, alignment, 0);
    return st;
}

static rankmem_status_t invalid_pointer(void *ptr, size_t bytes)
{
    return rk_error(RANKMEM_ERR_INVALID_POINTER,
                    "arena: %p (%zu bytes) is not a live allocation of this arena (double free, "
                    "or memory from elsewhere); not freed",
                    ptr, bytes);
}

static rankmem_status_t wrong_size(void *ptr, size_t bytes, size_t req)
{
    return rk_error(RANKMEM_ERR_INVALID_POINTER,
                    "arena: %p freed with size %zu but allocated with %zu; not freed", ptr, bytes,
                    req);
}

/* Free a small block of sb (owned by a, locked) on stream. */
static rankmem_status_t free_small(ar_t *r, arena_t *a, size_t slot, size_t off, void *ptr,
                                   size_t bytes, rankmem_stream_t stream)
{
    size_t u = (off & (r->sb_bytes - 1)) >> UNIT_SHIFT, n = (bytes + UNIT - 1) >> UNIT_SHIFT;
    uint32_t *req = &r->reqs[slot * r->units + u];
    if (RK_UNLIKELY(!*req || (off & (UNIT - 1))))
        return invalid_pointer(ptr, bytes); /* no live block starts here */
    if (RK_UNLIKELY(*req != bytes))
        return wrong_size(ptr, bytes, *req);
    if (RK_LIKELY(stream == a->stream))
        a->forgotten = 0; /* a stream used again is alive */
    else {
        /* Ordered on another stream: held until a's stream waits for it. */
        unsigned i = 0;
        while (i < a->npstreams && a->pstreams[i] != stream)
            i++;
        if (i == PENDING_STREAMS || a->npending == PENDING_MAX) {
            rankmem_status_t st = drain_pending(r, a);
            if (st != RANKMEM_SUCCESS)
                return st;
            i = 0;
        }
        if (a->npending == a->cap_pending) {
            size_t cap = a->cap_pending ? a->cap_pending * 2 : 16;
            pending_t *pp = realloc(a->pending, cap * sizeof *pp);
            if (!pp) {
                /* No room to record it: wait for the stream here, then free at once. */
                rankmem_status_t st =
                    r->use_events ? rk_gpu_stream_sync(stream) : RANKMEM_SUCCESS;
                if (st != RANKMEM_SUCCESS)
                    return st;
                goto now;
            }
            a->pending = pp;
            a->cap_pending = cap;
        }
        if (i == a->npstreams)
            a->pstreams[a->npstreams++] = stream;
        a->pending[a->npending++] =
            (pending_t){.slot = slot, .unit = u, .units = n, .stream = stream};
        *req = 0;
        used_sub(r, a, bytes);
        return RANKMEM_SUCCESS;
    }
now:
    *req = 0;
    used_sub(r, a, bytes);
    sb_free_units(r, a, slot, u, n);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t free_large(ar_t *r, void *ptr, size_t bytes, rankmem_stream_t stream)
{
    pthread_mutex_lock(&r->glock);
    size_t k = r->large.slots ? rk_ptrmap_find(&r->large, ptr) : SIZE_MAX;
    if (k == SIZE_MAX) {
        pthread_mutex_unlock(&r->glock);
        return invalid_pointer(ptr, bytes);
    }
    large_t *l = r->large.slots[k].value;
    if (l->req != bytes) {
        size_t req = l->req;
        pthread_mutex_unlock(&r->glock);
        return wrong_size(ptr, bytes, req);
    }
    rk_ptrmap_remove_at(&r->large, k);
    global_put(r, l->off, l->len, &stream);
    r->reserved -= l->len << UNIT_SHIFT;
    r->nlarge--;
    r->large_bytes -= l->len << UNIT_SHIFT;
    pthread_mutex_unlock(&r->glock);
    arena_t *a = l->acct;
    int am = rk_block_lock(&a->lock);
    used_sub(r, a, bytes);
    rk_block_unlock(&a->lock, am);
    free(l);
    return RANKMEM_SUCCESS;
}

static rankmem_status_t arena_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                         size_t alignment, rankmem_stream_t stream)
{
    (void)alignment;
    ar_t *r = (ar_t *)mr;
    size_t off = (size_t)((uintptr_t)ptr - (uintptr_t)r->mem);
    if (RK_UNLIKELY(off >= r->arena_bytes))
        return invalid_pointer(ptr, bytes);
    size_t slot = off >> r->sb_shift;
    if (RK_LIKELY(slot < r->nslots)) {
        sb_t *sb = &r->sbs[slot];
        for (;;) {
            arena_t *a = __atomic_load_n(&sb->owner, __ATOMIC_ACQUIRE);
            if (!a)
                break; /* not in a superblock: a large block, or not ours */
            int am = rk_block_lock(&a->lock);
            if (RK_UNLIKELY(__atomic_load_n(&sb->owner, __ATOMIC_RELAXED) != a)) {
                rk_block_unlock(&a->lock, am); /* moved meanwhile: look again */
                continue;
            }
            rankmem_status_t st = free_small(r, a, slot, off, ptr, bytes, stream);
            rk_block_unlock(&a->lock, am);
            return st;
        }
    }
    return free_large(r, ptr, bytes, stream);
}

/* ---- forgetting a stream ---- */

static rankmem_status_t forget_stream(ar_t *r, rankmem_stream_t stream)
{
    if (r->use_events) {
        rankmem_status_t st = rk_gpu_stream_sync(stream);
        if (st != RANKMEM_SUCCESS)
            return st;
    }
    /* Its work is done: nothing needs to wait for it any more. */
    pthread_mutex_lock(&r->glock);
    for (size_t i = 0; i <= r->nslots; i++) {
        gtag_t *g = &r->gtags[i];
        for (unsigned t = 0; t < g->n;)
            if (g->s[t] == stream)
                g->s[t] = g->s[--g->n];
            else
                t++;
    }
    pthread_mutex_unlock(&r->glock);
    for (arena_t *a = arena_first(r); a; a = a->next) {
        int am = rk_block_lock(&a->lock);
        unsigned k = 0;
        while (k < a->npstreams && a->pstreams[k] != stream)
            k++;
        if (k < a->npstreams) { /* its pending frees become free now */
            a->pstreams[k] = a->pstreams[--a->npstreams];
            size_t j = 0;
            for (size_t i = 0; i < a->npending; i++) {
                pending_t p = a->pending[i];
                if (p.stream == stream)
                    sb_free_units(r, a, p.slot, p.unit, p.units);
                else
                    a->pending[j++] = p;
            }
            a->npending = j;
        }
        if (a->stream == stream && !a->per_thread)
            a->forgotten = 1;
        rk_block_unlock(&a->lock, am);
    }
    return RANKMEM_SUCCESS;
}

/* Every arena of the chain forgets the stream (as rankmem_pool_forget_stream). */
rankmem_status_t rankmem_arena_forget_stream(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    if (!mr)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_arena_forget_stream: NULL resource");
    int arenas = 0;
    for (rankmem_resource_t *x = mr; x; x = x->upstream)
        if (x->ops == &arena_ops) {
            arenas++;
            if (stream) { /* the default stream is never destroyed */
                rankmem_status_t st = forget_stream((ar_t *)x, stream);
                if (st != RANKMEM_SUCCESS)
                    return st;
            }
        }
    if (!arenas)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_arena_forget_stream: no arena in the chain of '%s'",
                        mr->ops->name ? mr->ops->name : "unnamed");
    return RANKMEM_SUCCESS;
}

/* ---- queries, trim, finalize, describe ---- */

static rankmem_status_t arena_query(rankmem_resource_t *mr, rankmem_query_t what, size_t *value_p)
{
    ar_t *r = (ar_t *)mr;
    size_t v = 0;
    switch (what) {
    case RANKMEM_QUERY_RESERVED_CURRENT:
    case RANKMEM_QUERY_RESERVED_HIGH:
        pthread_mutex_lock(&r->glock);
        v = what == RANKMEM_QUERY_RESERVED_CURRENT ? r->reserved : r->reserved_high;
        pthread_mutex_unlock(&r->glock);
        break;
    case RANKMEM_QUERY_POOL_MAX: v = r->arena_bytes; break;
    case RANKMEM_QUERY_USED_HIGH: {
        /* One arena in use: its exact peak. Several: the shared total's
         * peak (see "bytes in use"), at least the largest arena's and
         * at most the peak reserved (live blocks always lie in reserved memory). */
        size_t in_use = 0, best = 0;
        for (arena_t *a = arena_first(r); a; a = a->next) {
            int am = rk_block_lock(&a->lock);
            if (a->used_high) {
                in_use++;
                if (a->used_high > best)
                    best = a->used_high;
            }
            rk_block_unlock(&a->lock, am);
        }
        long long h = __atomic_load_n(&r->gused_high, __ATOMIC_RELAXED);
        v = in_use > 1 && h > 0 && (size_t)h > best ? (size_t)h : best;
        if (v > best) {
            pthread_mutex_lock(&r->glock);
            if (v > r->reserved_high)
                v = r->reserved_high > best ? r->reserved_high : best;
            pthread_mutex_unlock(&r->glock);
        }
        break;
    }
    case RANKMEM_QUERY_FREE_BLOCKS: /* the global arena's free ranges, the arenas' runs */
    case RANKMEM_QUERY_USED_CURRENT:
    case RANKMEM_QUERY_LIVE_COUNT:
        if (what == RANKMEM_QUERY_FREE_BLOCKS) {
            size_t free_units, longest;
            pthread_mutex_lock(&r->glock);
            global_free_units(r, &free_units, &v, &longest);
            pthread_mutex_unlock(&r->glock);
        }
        for (arena_t *a = arena_first(r); a; a = a->next) {
            int am = rk_block_lock(&a->lock);
            if (what == RANKMEM_QUERY_USED_CURRENT)
                v += a->used;
            else if (what == RANKMEM_QUERY_LIVE_COUNT)
                v += a->live_count;
            else {
                v += a->npending;
                for (size_t wi = 0; wi < r->nwords; wi++)
                    for (uint64_t w = a->owned[wi]; w; w &= w - 1) {
                        size_t runs, longest;
                        sb_runs(&r->sbs[wi * 64 + (size_t)__builtin_ctzll(w)], r->units / 64,
                                &runs, &longest);
                        v += runs;
                    }
            }
            rk_block_unlock(&a->lock, am);
        }
        break;
    default:
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED, "arena: unknown query %d", (int)what);
    }
    *value_p = v;
    return RANKMEM_SUCCESS;
}

/* Empty superblocks back to the global arena while more than keep_bytes are
 * reserved (the global arena itself stays until release). */
static rankmem_status_t arena_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return defragment((ar_t *)mr, keep_bytes);
}

static void free_large_record(const void *key, void *value, void *arg)
{
    (void)key;
    (void)arg;
    free(value);
}

static void sync_all_streams(ar_t *r)
{
    for (arena_t *a = arena_first(r); a; a = a->next) {
        if (!a->forgotten) /* a forgotten stream may be destroyed already */
            (void)rk_gpu_stream_sync(a->stream);
        for (unsigned i = 0; i < a->npstreams; i++)
            (void)rk_gpu_stream_sync(a->pstreams[i]);
    }
    for (size_t i = 0; i <= r->nslots; i++)
        for (unsigned t = 0; t < r->gtags[i].n; t++)
            (void)rk_gpu_stream_sync(r->gtags[i].s[t]);
}

static void arena_free_state(ar_t *r)
{
    rk_tslot_set_fini(&r->slots, NULL, NULL);
    for (arena_t *a = r->arenas, *nx; a; a = nx) {
        nx = a->next;
        arena_free(a);
    }
    if (r->large.slots)
        rk_ptrmap_each(&r->large, free_large_record, NULL);
    rk_ptrmap_fini(&r->large);
    rk_ptrmap_fini(&r->streams);
    rk_gpu_event_destroy(r->gevent);
    free(r->gmem);
    free(r->g);
    free(r->gtags);
    free(r->sbs);
    free(r->bitsmem);
    free(r->reqs_mem);
    pthread_mutex_destroy(&r->glock);
    pthread_mutex_destroy(&r->tlock);
    pthread_mutex_destroy(&r->dlock);
    free(r);
}

static rankmem_status_t arena_finalize(rankmem_resource_t *mr)
{
    ar_t *r = (ar_t *)mr;
    rankmem_status_t result = RANKMEM_SUCCESS;
    size_t live = 0, used = 0;
    for (arena_t *a = r->arenas; a; a = a->next) {
        live += a->live_count;
        used += a->used;
    }
    if (live)
        result = rk_error(RANKMEM_ERR_BUSY,
                          "arena: released with %zu live allocations (%zu bytes); their memory "
                          "went back to the upstream",
                          live, used);
    if (r->mem) {
        if (r->use_events)
            sync_all_streams(r); /* kernels may still use memory freed on them */
        rankmem_resource_t *up = r->base.upstream;
        rankmem_status_t st = up->ops->deallocate(up, r->mem, r->arena_bytes, UNIT, NULL);
        if (st != RANKMEM_SUCCESS && result == RANKMEM_SUCCESS)
            result = st;
    }
    arena_free_state(r);
    return result;
}

/* Spec syntax, only what differs from the defaults. */
static int arena_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const ar_t *r = (const ar_t *)mr;
    char opts[160] = "", sz[40];
    size_t o = 0;
    if (r->size_param) {
        rk_format_size(sz, sizeof sz, r->arena_bytes);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",size=%s", sz);
    }
    if (r->sb_bytes != DEFAULT_SUPERBLOCK) {
        rk_format_size(sz, sizeof sz, r->sb_bytes);
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",superblock=%s", sz);
    }
    if (r->dump_on_failure)
        o += (size_t)snprintf(opts + o, sizeof opts - o, ",dump=1");
    return o ? snprintf(buf, len, "arena(%s)", opts + 1) : snprintf(buf, len, "arena");
}

static rankmem_status_t arena_forget_op(rankmem_resource_t *mr, rankmem_stream_t stream)
{
    return forget_stream((ar_t *)mr, stream);
}

static const rankmem_resource_ops_t arena_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "arena",
    .allocate = arena_allocate,
    .deallocate = arena_deallocate,
    .query = arena_query,
    .trim = arena_trim,
    .finalize = arena_finalize,
    .describe = arena_describe,
    .forget_stream = arena_forget_op,
};

/* ---- creation ---- */

rankmem_status_t rankmem_arena_params_default(rankmem_arena_params_t *params_p)
{
    if (!params_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_arena_params_default: NULL output");
    params_p->size = sizeof *params_p;
    params_p->arena_size = 0;
    params_p->superblock_size = 0;
    params_p->dump_on_failure = 0;
    return RANKMEM_SUCCESS;
}

/* Half of the device's free memory (device upstream with a GPU), else half
 * of physical host memory. */
static rankmem_status_t default_size(const rankmem_resource_t *upstream, size_t *size_p)
{
    if ((upstream->props & RANKMEM_PROP_DEVICE_ACCESSIBLE) && rk_gpu_count() > 0) {
#if HAVE_GPU
        size_t free_b = 0, total_b = 0;
        cudaError_t err = cudaMemGetInfo(&free_b, &total_b);
        if (err != cudaSuccess)
            return rk_cuda_error((int)err, "arena: cudaMemGetInfo for the default arena size", 0);
        *size_p = free_b / 2;
        return RANKMEM_SUCCESS;
#endif
    }
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || page <= 0)
        return rk_error(RANKMEM_ERR_NOT_SUPPORTED,
                        "arena: cannot find the size of physical memory for the default arena "
                        "size; give arena_size");
    *size_p = (size_t)pages / 2 * (size_t)page;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rankmem_arena_create(rankmem_resource_t *upstream,
                                      const rankmem_arena_params_t *params,
                                      rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_arena_create: NULL %s",
                        upstream ? "output" : "upstream");
    rankmem_arena_params_t prm;
    rankmem_arena_params_default(&prm);
    if (params) {
        if (params->size < offsetof(rankmem_arena_params_t, dump_on_failure) ||
            params->size > sizeof prm)
            return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                            "rankmem_arena_create: params.size %zu is not that of "
                            "rankmem_arena_params_t (%zu); set it with "
                            "rankmem_arena_params_default()",
                            params->size, sizeof prm);
        memcpy(&prm, params, params->size);
        prm.size = sizeof prm;
    }
    size_t sb = prm.superblock_size ? prm.superblock_size : DEFAULT_SUPERBLOCK;
    if (!rk_is_pow2(sb) || sb < MIN_SUPERBLOCK || sb > MAX_SUPERBLOCK)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_arena_create: superblock size %zu must be a power of two "
                        "between %zu and %zu",
                        sb, MIN_SUPERBLOCK, MAX_SUPERBLOCK);
    size_t size = prm.arena_size;
    if (!size) {
        rankmem_status_t st = default_size(upstream, &size);
        if (st != RANKMEM_SUCCESS)
            return st;
    }
    if (size > SIZE_MAX / 2)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_arena_create: arena size %zu is too large", size);
    size &= ~(UNIT - 1);
    if (size < sb)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_arena_create: arena size %zu is smaller than one superblock "
                        "(%zu bytes)",
                        size, sb);

    unsigned props = upstream->props & (RANKMEM_PROP_DEVICE_ACCESSIBLE |
                                         RANKMEM_PROP_HOST_ACCESSIBLE);
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(ar_t), &arena_ops,
                                          props | RANKMEM_PROP_STREAM_ORDERED, upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    ar_t *r = (ar_t *)mr;
    r->base.device = upstream->device;
    r->arena_bytes = size;
    r->arena_units = size >> UNIT_SHIFT;
    r->sb_bytes = sb;
    r->units = sb >> UNIT_SHIFT;
    r->sb_shift = log2_floor(sb);
    r->nbuckets = class_of(r->units) + 1;
    r->nslots = size / sb;
    r->nwords = (r->nslots + 63) / 64;
    r->nsum = (r->nwords + 63) / 64;
    r->sb_words = r->units / 64;
    r->size_param = prm.arena_size;
    r->dump_on_failure = prm.dump_on_failure != 0;
    r->use_events = (upstream->props & RANKMEM_PROP_DEVICE_ACCESSIBLE) && rk_gpu_count() > 0;
    pthread_mutex_init(&r->glock, NULL);
    pthread_mutex_init(&r->tlock, NULL);
    pthread_mutex_init(&r->dlock, NULL);
    rk_tslot_set_init(&r->slots, sizeof(tcache_t), NULL);

    /* Per superblock its bitmap and their summary, APART bytes from the next. */
    size_t words_per_sb = rk_align_up(r->sb_words + 2 * ((r->sb_words + 63) / 64), APART / 8);
    void *sbs = NULL;
    if (posix_memalign(&sbs, APART, r->nslots * sizeof(sb_t)) == 0) {
        memset(sbs, 0, r->nslots * sizeof(sb_t));
        r->sbs = sbs;
    }
    void *bits = NULL;
    if (posix_memalign(&bits, APART, r->nslots * words_per_sb * sizeof(uint64_t)) == 0)
        r->bitsmem = bits; /* written when a superblock is handed out */
    /* Zeroed pages of their own, touched only where blocks start. */
    r->reqs_mem = calloc(r->nslots * r->units * sizeof *r->reqs + 64, 1);
    if (r->reqs_mem) /* each slot's part on cache lines of its own */
        r->reqs = (uint32_t *)rk_align_up((uintptr_t)r->reqs_mem, 64);
    /* The global arena: its units' bitmap and summaries, and the slots'. */
    r->gwords = (r->arena_units + 63) / 64;
    size_t gsum = (r->gwords + 63) / 64;
    void *g = NULL;
    if (posix_memalign(&g, APART, sizeof(sb_t)) == 0) {
        memset(g, 0, sizeof(sb_t));
        r->g = g;
    }
    r->gmem = calloc(r->gwords + 2 * gsum + r->nwords + r->nsum, sizeof(uint64_t));
    r->gtags = calloc(r->nslots + 1, sizeof *r->gtags);
    if (!r->sbs || !r->bitsmem || !r->reqs || !r->g || !r->gmem || !r->gtags ||
        rk_ptrmap_init(&r->large, 16) != RANKMEM_SUCCESS ||
        rk_ptrmap_init(&r->streams, 16) != RANKMEM_SUCCESS) {
        st = rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                      "arena: no host memory for the state of %zu superblocks", r->nslots);
        goto fail;
    }
    for (size_t i = 0; i < r->nslots; i++) {
        r->sbs[i].bits = r->bitsmem + i * words_per_sb;
        r->sbs[i].nz = r->sbs[i].bits + r->sb_words;
        r->sbs[i].full = r->sbs[i].nz + (r->sb_words + 63) / 64;
    }

    void *mem = NULL;
    rankmem_clear_error(); /* what the upstream says, if anything */
    st = upstream->ops->allocate(upstream, size, UNIT, NULL, &mem);
    if (st != RANKMEM_SUCCESS) {
        char detail[256];
        snprintf(detail, sizeof detail, "%s", rankmem_last_error());
        st = rk_error(st, "arena: the upstream '%s' refused %zu bytes for the global arena%s%s%s",
                      upstream->ops->name ? upstream->ops->name : "unnamed", size,
                      detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
        goto fail;
    }
    r->mem = mem;
    r->g->bits = r->gmem;
    r->g->nz = r->g->bits + r->gwords;
    r->g->full = r->g->nz + gsum;
    r->gslot = r->g->full + gsum;
    r->gslot_sum = r->gslot + r->nwords;
    bits_set(r->g, 0, r->arena_units); /* all free; units past the end stay 0 */
    for (size_t i = 0; i < r->nslots; i++)
        gslot_put(r, i, 1);
    /* The upstream allocated on the default stream: done before any stream uses it. */
    if (r->use_events && (st = rk_gpu_stream_sync(NULL)) != RANKMEM_SUCCESS)
        goto fail;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
fail:
    arena_finalize(mr); /* gives the global arena back if it was taken */
    rankmem_resource_release(upstream);
    return st;
}
