/* A lock biased to one thread (internal).
 *
 * Most ranks drive each stream from one host thread, and an uncontended
 * lock still costs two lock-prefixed instructions, most of a suballocator's
 * budget. A biased lock lets its owner thread in with plain loads and
 * stores while nobody else comes; the first other thread revokes the bias
 * (an asymmetric Dekker handshake: it clears `biased`, runs membarrier() so
 * that every running thread passes a full barrier, then waits until the
 * owner is out of its plain section) and from then on everyone takes the
 * real lock. The owner takes the bias back after REBIAS entries of its own,
 * so a thread that frees now and then on another thread's arena costs one
 * membarrier per REBIAS owner operations, not one per call. Where membarrier
 * is missing the bias is never granted: a plain spin-then-futex lock. */
#ifndef RANKMEM_BIAS_H
#define RANKMEM_BIAS_H

#include "internal.h"

typedef struct {
    int v;             /* the real lock: 0 free, 1 taken, 2 taken and maybe waited for */
    int biased;        /* atomic: the owner may enter without v */
    int inside;        /* the owner is in a biased section (written by the owner only) */
    unsigned streak;   /* owner's entries through v since the bias was revoked (under v) */
    const void *owner; /* atomic: rk_thread_tag() of the owner; NULL: never biased */
} rk_block_t;

#define RK_BLOCK_REBIAS 1024u

/* A tag unique among live threads (a dead thread's tag may be reused by a
 * new thread: harmless, the dead one no longer runs). */
extern __thread char rk_thread_tag_byte __attribute__((tls_model("initial-exec"))) RK_HIDDEN;
static inline const void *rk_thread_tag(void) { return &rk_thread_tag_byte; }

/* Whether membarrier(PRIVATE_EXPEDITED) works (registered on first call). */
RK_HIDDEN int rk_membarrier_ready(void);
/* A full barrier on every running thread of the process. */
RK_HIDDEN void rk_membarrier(void);

RK_HIDDEN void rk_block_wait(rk_block_t *l);
RK_HIDDEN void rk_block_wake(rk_block_t *l);
RK_HIDDEN void rk_block_revoke(rk_block_t *l);
/* The revocation in two halves, so that one membarrier serves many locks:
 * under each lock's v, rk_block_unbias (1 when it was biased); then one
 * rk_membarrier(); then rk_block_wait_out on each that was. */
RK_HIDDEN int rk_block_unbias(rk_block_t *l);
RK_HIDDEN void rk_block_wait_out(rk_block_t *l);
/* Under v: the calling thread becomes the owner (biased at once when
 * membarrier works), or, with take == 0, nobody is (a lock whose owner
 * leaves for good: others then never pay a revocation). */
RK_HIDDEN void rk_block_rebind(rk_block_t *l, int take);

/* owner: the calling thread becomes the owner (biased at once) when
 * membarrier works; NULL owner: a plain lock. */
static inline void rk_block_init(rk_block_t *l, int biased_to_caller)
{
    l->v = 0;
    l->inside = 0;
    l->streak = 0;
    const void *o = biased_to_caller && rk_membarrier_ready() ? rk_thread_tag() : NULL;
    __atomic_store_n(&l->owner, o, __ATOMIC_RELAXED);
    l->biased = o != NULL;
}

static inline void rk_block_take(rk_block_t *l)
{
    int z = 0;
    if (RK_UNLIKELY(!__atomic_compare_exchange_n(&l->v, &z, 1, 0, __ATOMIC_ACQUIRE,
                                                 __ATOMIC_RELAXED)))
        rk_block_wait(l);
}

/* Returns the mode to hand to rk_block_unlock. */
static inline int rk_block_lock(rk_block_t *l)
{
    /* Relaxed: the owner may change (rk_block_rebind), and only a thread
     * comparing equal to its own tag acts on it. */
    if (__atomic_load_n(&l->owner, __ATOMIC_RELAXED) == rk_thread_tag()) {
        if (RK_LIKELY(__atomic_load_n(&l->biased, __ATOMIC_RELAXED))) {
            __atomic_store_n(&l->inside, 1, __ATOMIC_RELAXED);
            __atomic_signal_fence(__ATOMIC_SEQ_CST); /* the revoker's membarrier orders it */
            if (RK_LIKELY(__atomic_load_n(&l->biased, __ATOMIC_RELAXED)))
                return 1;
            __atomic_store_n(&l->inside, 0, __ATOMIC_RELEASE);
        }
        rk_block_take(l);
        if (RK_UNLIKELY(++l->streak >= RK_BLOCK_REBIAS)) {
            l->streak = 0; /* nobody else came for a while: the bias comes back */
            __atomic_store_n(&l->biased, 1, __ATOMIC_RELAXED);
        }
        return 0;
    }
    rk_block_take(l);
    if (RK_UNLIKELY(__atomic_load_n(&l->biased, __ATOMIC_RELAXED)))
        rk_block_revoke(l);
    return 0;
}

/* rk_block_lock for a caller that is the owner whenever the lock is biased
 * (it claimed the lock with rk_block_rebind(l, 1) and has not let go): no
 * owner comparison. */
static inline int rk_block_lock_mine(rk_block_t *l)
{
    if (RK_LIKELY(__atomic_load_n(&l->biased, __ATOMIC_RELAXED))) {
        __atomic_store_n(&l->inside, 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        if (RK_LIKELY(__atomic_load_n(&l->biased, __ATOMIC_RELAXED)))
            return 1;
        __atomic_store_n(&l->inside, 0, __ATOMIC_RELEASE);
    }
    return rk_block_lock(l);
}

static inline void rk_block_unlock(rk_block_t *l, int mode)
{
    if (mode) {
        __atomic_store_n(&l->inside, 0, __ATOMIC_RELEASE);
        return;
    }
    if (RK_UNLIKELY(__atomic_exchange_n(&l->v, 0, __ATOMIC_RELEASE) == 2))
        rk_block_wake(l);
}

#endif
