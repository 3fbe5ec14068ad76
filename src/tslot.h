/* tslot: one slot per (thread, owner) pair, for adaptors that keep
 * per-thread state (stats totals, logging buffers) so that their hot path
 * needs no lock and no shared cache line.
 *
 * An owner (an adaptor) embeds an rk_tslot_set_t. rk_tslot_get() returns the
 * calling thread's slot payload for that set: a compare against a small
 * per-thread cache keyed by the set's id, else a slow path under a global
 * lock that finds or creates the slot. Ids are unique for the life of the
 * process, so a set freed and another allocated at the same address never
 * hits a stale cache entry.
 *
 * A slot belongs to one thread at a time. When a thread exits, its slots are
 * orphaned (a pthread key destructor) and the next thread that registers
 * with the set adopts one instead of allocating: memory stays bounded by the
 * number of threads alive at once, and what the slot accumulated is kept.
 * Slots are freed only with their set, so the set's list can be walked
 * without a lock. */
#ifndef RANKMEM_TSLOT_H
#define RANKMEM_TSLOT_H

#include "internal.h"

#include <stddef.h>
#include <stdint.h>

typedef struct rk_tslot rk_tslot_t;
typedef struct rk_tslot_set rk_tslot_set_t;
typedef struct rk_tslot_thread rk_tslot_thread_t;

struct rk_tslot {
    rk_tslot_t *next;          /* the set's list: set before publication, then immutable */
    rk_tslot_set_t *set;
    rk_tslot_thread_t *thread; /* owner, NULL when orphaned (global lock) */
    rk_tslot_t *tprev, *tnext; /* the owner thread's list (global lock) */
};

/* Payloads start on their own pair of cache lines and end on one: no false
 * sharing between threads, nor the coupling of neighbouring lines that x86
 * cores fetch in aligned pairs (see APART in arena.c). */
#define RK_TSLOT_ALIGN 128
#define RK_TSLOT_HEADER rk_align_up(sizeof(rk_tslot_t), RK_TSLOT_ALIGN)

/* Called under the global lock when a thread takes a slot: fresh is 1 for a
 * new (zeroed) payload, 0 when an orphan is adopted. */
typedef void (*rk_tslot_attach_fn)(rk_tslot_set_t *set, void *payload, int fresh);

struct rk_tslot_set {
    uint64_t id;         /* 0 for a set not initialised */
    size_t way0;         /* byte offset of the set's primary cache entry: no arithmetic per call */
    size_t payload_size;
    rk_tslot_attach_fn attach;
    rk_tslot_t *head;    /* atomic: pushed under the global lock, read with acquire */
};

typedef struct rk_tslot_cache {
    uint64_t id;
    void *payload;
} rk_tslot_cache_t;

/* A thread alternating between a few adaptors stays on the fast path. Each
 * set has a primary entry (id % RK_TSLOT_CACHE) and a second one (the
 * primary ^ RK_TSLOT_CACHE / 2), where the slow path moves the entry it
 * displaces: two sets of a chain whose ids collide (stats over tracking)
 * both stay cached instead of taking turns through the global lock. */
#define RK_TSLOT_CACHE 8

/* initial-exec: a plain %fs-relative access, no __tls_get_addr call. */
extern __thread rk_tslot_cache_t rk_tslot_cache[RK_TSLOT_CACHE]
    __attribute__((tls_model("initial-exec"))) RK_HIDDEN;

/* One more entry per hot user, for the set it used last: a fixed
 * %fs-relative address, so a hit is one compare and one load. Cleared with
 * the cache when the thread exits (its slots are orphaned then). The user
 * keeps it (see stats.c); a miss falls back to rk_tslot_get. */
enum { RK_TSLOT_MRU_STATS, RK_TSLOT_MRU_N };
extern __thread rk_tslot_cache_t rk_tslot_mru[RK_TSLOT_MRU_N]
    __attribute__((tls_model("initial-exec"))) RK_HIDDEN;

RK_HIDDEN void rk_tslot_set_init(rk_tslot_set_t *set, size_t payload_size,
                                 rk_tslot_attach_fn attach);
/* Frees every slot, calling fn (may be NULL) on each payload first. No thread
 * may use the set any more. */
RK_HIDDEN void rk_tslot_set_fini(rk_tslot_set_t *set, void (*fn)(void *payload, void *arg),
                                 void *arg);
/* NULL when a new slot cannot be allocated. */
RK_HIDDEN void *rk_tslot_get_slow(rk_tslot_set_t *set) __attribute__((cold));

static inline size_t rk_tslot_way(uint64_t id, int second)
{
    return (size_t)(id % RK_TSLOT_CACHE) ^ (second ? RK_TSLOT_CACHE / 2 : 0);
}

/* The cached payload, or NULL on a miss (then rk_tslot_get_slow). No call:
 * a caller whose fast path makes none keeps its registers free. */
static inline __attribute__((always_inline)) void *rk_tslot_peek(const rk_tslot_set_t *set)
{
    uint64_t id = set->id;
    rk_tslot_cache_t *c = (rk_tslot_cache_t *)((char *)rk_tslot_cache + set->way0);
    if (RK_LIKELY(c->id == id)) {
        void *p = c->payload;
        if (!p) /* never: an entry with a set's id has its payload */
            __builtin_unreachable();
        return p;
    }
    c = &rk_tslot_cache[rk_tslot_way(id, 1)];
    return RK_LIKELY(c->id == id) ? c->payload : NULL;
}

static inline __attribute__((always_inline)) void *rk_tslot_get(rk_tslot_set_t *set)
{
    void *p = rk_tslot_peek(set);
    return RK_LIKELY(p != NULL) ? p : rk_tslot_get_slow(set);
}

/* Walk every slot of a set (those of exited threads included):
 * for (rk_tslot_t *t = rk_tslot_first(set); t; t = t->next) ... rk_tslot_payload(t) */
static inline rk_tslot_t *rk_tslot_first(const rk_tslot_set_t *set)
{
    return __atomic_load_n(&set->head, __ATOMIC_ACQUIRE);
}

static inline void *rk_tslot_payload(rk_tslot_t *t) { return (char *)t + RK_TSLOT_HEADER; }

/* ---- per-thread counters with a current value and a peak ----
 *
 * A counter (bytes live, allocations live) that many threads move without
 * a shared atomic on the common path. Each thread keeps, in its slot, its
 * own net change `cur` (written by it only, read by queries): the current
 * value is the sum of every slot's cur, exact whenever no thread is inside
 * an update. The peak needs a shared view, which the threads keep cheap by
 * flushing: a thread adds its change since its last flush (cur - base) to
 * the shared `flushed` with one atomic add only when that change reaches
 * `slack` either way, and raises the shared peak with the sum the add
 * returns. Between flushes it raises its own slot's peak with its estimate
 * of the current value: `seen` (flushed, as its last add returned it) plus
 * its change since.
 *
 * The bound, with n slots: the true value is flushed plus every slot's
 * unflushed change, each within (-slack, slack); a thread's estimate is a
 * flushed value it saw (since the last reset) plus its own unflushed part.
 * So the reported peak (the largest of the shared peak, the slots' peaks
 * of this epoch and the current value) is within n * slack of the true
 * peak, either way. With one thread the estimate is exact at every update,
 * and so is the peak.
 *
 * A reset (a scope push) bumps the epoch: slots' peaks of an older epoch
 * are ignored. It also lowers every slot's bound `hi`, so that each
 * thread, at its next increase, takes the slow path, which sees the new
 * epoch, flushes (so that its `seen` is a value from after the reset) and
 * restarts its own peak: the fast path never reads the epoch. */
typedef struct rk_tpeak {
    /* Read by slow paths and queries, written only by resets. */
    unsigned epoch;  /* atomic: bumped by each reset */
    /* Written by flushes: a line of their own. */
    size_t flushed __attribute__((aligned(64))); /* atomic: every flush, summed */
    size_t peak;     /* atomic: the largest flushed since the last reset */
    size_t spill;    /* atomic: the changes of threads that got no slot */
} rk_tpeak_t;

typedef struct rk_tpeak_local {
    size_t cur;      /* atomic (single writer): this thread's net change, two's complement */
    /* The fast path's bounds, signed: an increase that takes cur above hi
     * (a flush due, or an estimate above lpeak) or a decrease that takes it
     * below lo (a flush due) goes to rk_tpeak_slow. So an update is a store
     * and a compare; with one thread and a pair below its peak, nothing
     * else. hi is atomic: a reset lowers every slot's to PTRDIFF_MIN, so
     * that the next increase restarts the slot's peak (no epoch to compare
     * on the fast path); lo is the owner's only. */
    ptrdiff_t hi, lo;
    unsigned epoch;  /* atomic (single writer) */
    size_t lpeak;    /* atomic (single writer): the largest estimate in epoch `epoch`, signed */
    size_t base;     /* cur at the last flush (the slot's thread only) */
    size_t seen;     /* flushed just after the last flush (the slot's thread only) */
    size_t off;      /* seen - base: the estimate is cur + off (the slot's thread only) */
} rk_tpeak_local_t;

/* The slack is the caller's compile-time constant, the same on every
 * update of a counter. Values and estimates are compared signed: a thread
 * that frees what others allocated has a negative change, and the flushed
 * sum itself may be below zero for a while (others hold the allocations
 * unflushed); a negative estimate must not read as a huge peak. */
static inline void rk_tpeak_init(rk_tpeak_t *g)
{
    g->epoch = 1; /* slots start at 0: their first increase takes the slow path */
    g->flushed = g->peak = g->spill = 0;
}

/* The rare part of an update (noinline, cold): the first increase after a
 * reset restarts the slot's peak; a change of slack either way since the
 * last flush is published; the slot's peak is raised; the bounds are set
 * again. Harmless when nothing is due. */
RK_HIDDEN void rk_tpeak_slow(rk_tpeak_t *g, rk_tpeak_local_t *l, size_t slack)
    __attribute__((noinline, cold));

/* An increase by d, from the thread that owns slot l. */
static inline __attribute__((always_inline)) void rk_tpeak_add(rk_tpeak_t *g,
                                                                rk_tpeak_local_t *l, size_t d,
                                                                size_t slack)
{
    size_t cur = l->cur + d;
    __atomic_store_n(&l->cur, cur, __ATOMIC_RELAXED);
    if (RK_UNLIKELY((ptrdiff_t)cur > __atomic_load_n(&l->hi, __ATOMIC_RELAXED)))
        rk_tpeak_slow(g, l, slack);
}

/* A decrease by d (no peak to raise). */
static inline __attribute__((always_inline)) void rk_tpeak_sub(rk_tpeak_t *g,
                                                                rk_tpeak_local_t *l, size_t d,
                                                                size_t slack)
{
    size_t cur = l->cur - d;
    __atomic_store_n(&l->cur, cur, __ATOMIC_RELAXED);
    if (RK_UNLIKELY((ptrdiff_t)cur < l->lo))
        rk_tpeak_slow(g, l, slack);
}

/* For a thread without a slot (none could be allocated): straight to the
 * shared sums, exact; d is two's complement for a decrease. */
RK_HIDDEN void rk_tpeak_add_shared(rk_tpeak_t *g, size_t d);

/* Queries. The rk_tpeak_local_t sits at byte `off` of each payload of set.
 * The current value: spill plus every slot's cur. */
RK_HIDDEN size_t rk_tpeak_current(const rk_tpeak_t *g, const rk_tslot_set_t *set, size_t off);
/* The peak since the last reset (never less than the current value). */
RK_HIDDEN size_t rk_tpeak_peak(rk_tpeak_t *g, const rk_tslot_set_t *set, size_t off);
/* Restarts the peak at the current value, which it returns. The caller
 * serialises resets; self is the caller's own slot (NULL if it has none):
 * flushing it first keeps a one-thread scope exact. */
RK_HIDDEN size_t rk_tpeak_reset(rk_tpeak_t *g, const rk_tslot_set_t *set, size_t off,
                                rk_tpeak_local_t *self);
/* Raises the peak to at least v (a scope pop folds its parent's peak back). */
RK_HIDDEN void rk_tpeak_raise(rk_tpeak_t *g, size_t v);

#endif
