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

/* Payloads start on their own cache line: no false sharing between threads. */
#define RK_TSLOT_ALIGN 64
#define RK_TSLOT_HEADER rk_align_up(sizeof(rk_tslot_t), RK_TSLOT_ALIGN)

/* Called under the global lock when a thread takes a slot: fresh is 1 for a
 * new (zeroed) payload, 0 when an orphan is adopted. */
typedef void (*rk_tslot_attach_fn)(rk_tslot_set_t *set, void *payload, int fresh);

struct rk_tslot_set {
    uint64_t id;         /* 0 for a set not initialised */
    size_t payload_size;
    rk_tslot_attach_fn attach;
    rk_tslot_t *head;    /* atomic: pushed under the global lock, read with acquire */
};

typedef struct rk_tslot_cache {
    uint64_t id;
    void *payload;
} rk_tslot_cache_t;

#define RK_TSLOT_CACHE 4 /* a thread alternating between a few adaptors stays on the fast path */

/* initial-exec: a plain %fs-relative access, no __tls_get_addr call. */
extern __thread rk_tslot_cache_t rk_tslot_cache[RK_TSLOT_CACHE]
    __attribute__((tls_model("initial-exec"))) RK_HIDDEN;

RK_HIDDEN void rk_tslot_set_init(rk_tslot_set_t *set, size_t payload_size,
                                 rk_tslot_attach_fn attach);
/* Frees every slot, calling fn (may be NULL) on each payload first. No thread
 * may use the set any more. */
RK_HIDDEN void rk_tslot_set_fini(rk_tslot_set_t *set, void (*fn)(void *payload, void *arg),
                                 void *arg);
/* NULL when a new slot cannot be allocated. */
RK_HIDDEN void *rk_tslot_get_slow(rk_tslot_set_t *set);

static inline void *rk_tslot_get(rk_tslot_set_t *set)
{
    rk_tslot_cache_t *c = &rk_tslot_cache[set->id % RK_TSLOT_CACHE];
    if (RK_LIKELY(c->id == set->id))
        return c->payload;
    return rk_tslot_get_slow(set);
}

/* Walk every slot of a set (those of exited threads included):
 * for (rk_tslot_t *t = rk_tslot_first(set); t; t = t->next) ... rk_tslot_payload(t) */
static inline rk_tslot_t *rk_tslot_first(const rk_tslot_set_t *set)
{
    return __atomic_load_n(&set->head, __ATOMIC_ACQUIRE);
}

static inline void *rk_tslot_payload(rk_tslot_t *t) { return (char *)t + RK_TSLOT_HEADER; }

#endif
