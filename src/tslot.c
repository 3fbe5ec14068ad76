/* tslot: see tslot.h. */
#include "tslot.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct rk_tslot_thread {
    rk_tslot_t *slots; /* this thread's slots, all sets (global lock) */
    int registered;    /* the key's destructor will run at exit */
};

__thread rk_tslot_cache_t rk_tslot_cache[RK_TSLOT_CACHE] __attribute__((tls_model("initial-exec")));
__thread rk_tslot_cache_t rk_tslot_mru[RK_TSLOT_MRU_N] __attribute__((tls_model("initial-exec")));
static __thread rk_tslot_thread_t self;

/* Guards slot ownership and the per-thread lists; taken only on slow paths. */
static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;
static int key_ok;
static uint64_t next_id = 1; /* atomic; 0 marks an empty cache entry */

static void unlink_thread(rk_tslot_t *t)
{
    if (t->tprev)
        t->tprev->tnext = t->tnext;
    else
        t->thread->slots = t->tnext;
    if (t->tnext)
        t->tnext->tprev = t->tprev;
    t->tprev = t->tnext = NULL;
    t->thread = NULL;
}

/* Thread exit: orphan the thread's slots so the next thread adopts them. */
static void thread_exit(void *arg)
{
    rk_tslot_thread_t *th = arg;
    pthread_mutex_lock(&global_lock);
    while (th->slots)
        unlink_thread(th->slots);
    th->registered = 0;
    pthread_mutex_unlock(&global_lock);
    /* A later call from another destructor of this thread must take the slow path again. */
    memset(rk_tslot_cache, 0, sizeof rk_tslot_cache);
    memset(rk_tslot_mru, 0, sizeof rk_tslot_mru);
}

static void make_key(void) { key_ok = pthread_key_create(&exit_key, thread_exit) == 0; }

/* If the library is unloaded, exiting threads must not call into unmapped code. */
__attribute__((destructor)) static void tslot_unload(void)
{
    if (key_ok)
        pthread_key_delete(exit_key);
    key_ok = 0;
}

void rk_tslot_set_init(rk_tslot_set_t *set, size_t payload_size, rk_tslot_attach_fn attach)
{
    set->id = __atomic_fetch_add(&next_id, 1, __ATOMIC_RELAXED);
    set->way0 = rk_tslot_way(set->id, 0) * sizeof(rk_tslot_cache_t);
    set->payload_size = payload_size;
    set->attach = attach;
    set->head = NULL;
}

void *rk_tslot_get_slow(rk_tslot_set_t *set)
{
    pthread_once(&key_once, make_key);
    rk_tslot_thread_t *th = &self;
    pthread_mutex_lock(&global_lock);
    rk_tslot_t *t = th->slots;
    while (t && t->set != set) /* evicted from the cache by another set */
        t = t->tnext;
    if (!t) {
        /* Without the exit hook a dead thread's slot would keep pointing into
         * its freed TLS: the caller takes its slot-less fallback instead. */
        if (!th->registered) {
            if (!key_ok || pthread_setspecific(exit_key, th) != 0) {
                pthread_mutex_unlock(&global_lock);
                return NULL;
            }
            th->registered = 1;
        }
        int fresh = 0;
        for (t = set->head; t && t->thread; t = t->next)
            ;
        if (!t) {
            size_t bytes = rk_align_up(RK_TSLOT_HEADER + set->payload_size, RK_TSLOT_ALIGN);
            t = aligned_alloc(RK_TSLOT_ALIGN, bytes);
            if (!t) {
                pthread_mutex_unlock(&global_lock);
                return NULL;
            }
            memset(t, 0, bytes);
            t->set = set;
            fresh = 1;
        }
        t->thread = th;
        t->tprev = NULL;
        t->tnext = th->slots;
        if (t->tnext)
            t->tnext->tprev = t;
        th->slots = t;
        if (set->attach)
            set->attach(set, rk_tslot_payload(t), fresh);
        if (fresh) {
            t->next = set->head;
            __atomic_store_n(&set->head, t, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&global_lock);
    void *payload = rk_tslot_payload(t);
    rk_tslot_cache_t *c = &rk_tslot_cache[rk_tslot_way(set->id, 0)];
    if (c->id != 0 && c->id != set->id) /* the displaced entry moves to its second way */
        rk_tslot_cache[rk_tslot_way(c->id, 1)] = *c;
    *c = (rk_tslot_cache_t){set->id, payload};
    return payload;
}

void rk_tslot_set_fini(rk_tslot_set_t *set, void (*fn)(void *payload, void *arg), void *arg)
{
    pthread_mutex_lock(&global_lock);
    rk_tslot_t *t = set->head;
    set->head = NULL;
    while (t) {
        rk_tslot_t *next = t->next;
        if (t->thread)
            unlink_thread(t);
        if (fn)
            fn(rk_tslot_payload(t), arg);
        free(t);
        t = next;
    }
    pthread_mutex_unlock(&global_lock);
    /* Other threads' cache entries keep this id, which is never handed out again. */
    for (int second = 0; second < 2; second++) {
        rk_tslot_cache_t *c = &rk_tslot_cache[rk_tslot_way(set->id, second)];
        if (c->id == set->id)
            *c = (rk_tslot_cache_t){0, NULL};
    }
}

/* ---- per-thread counters with a peak: see tslot.h ---- */

/* Peaks are compared signed (tslot.h): the shared one starts at 0, so a
 * negative value never enters it. */
static void raise_peak(size_t *peak, size_t v)
{
    size_t p = __atomic_load_n(peak, __ATOMIC_RELAXED);
    while ((ptrdiff_t)v > (ptrdiff_t)p &&
           !__atomic_compare_exchange_n(peak, &p, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

static size_t max_signed(size_t a, size_t b) { return (ptrdiff_t)a > (ptrdiff_t)b ? a : b; }

static void flush(rk_tpeak_t *g, rk_tpeak_local_t *l)
{
    size_t cur = l->cur;
    size_t f = __atomic_add_fetch(&g->flushed, cur - l->base, __ATOMIC_RELAXED);
    l->base = cur;
    l->seen = f;
    l->off = f - cur;
    raise_peak(&g->peak, f);
}

/* Any call with cur outside (lo, hi] reaches here; only then do the
 * bounds move, so a slot that is not flushed keeps its bounds. */
static void set_bounds(rk_tpeak_local_t *l, size_t slack)
{
    ptrdiff_t base = (ptrdiff_t)l->base, s = (ptrdiff_t)slack - 1;
    ptrdiff_t due = base + s, top = (ptrdiff_t)(l->lpeak - l->off);
    l->lo = base - s;
    /* Against a reset's store of PTRDIFF_MIN (rk_tpeak_reset), both sides
     * sequentially consistent: either this store comes first, and the
     * reset's overwrites it, or the epoch loaded next is the new one. */
    __atomic_store_n(&l->hi, top < due ? top : due, __ATOMIC_SEQ_CST);
}

void rk_tpeak_slow(rk_tpeak_t *g, rk_tpeak_local_t *l, size_t slack)
{
    size_t d = l->cur - l->base;
    if (d + (slack - 1) > 2 * (slack - 1)) /* |d| >= slack, two's complement */
        flush(g, l);
    size_t est = l->cur + l->off;
    if ((ptrdiff_t)est > (ptrdiff_t)l->lpeak)
        __atomic_store_n(&l->lpeak, est, __ATOMIC_RELAXED);
    for (;;) {
        set_bounds(l, slack);
        unsigned e = __atomic_load_n(&g->epoch, __ATOMIC_SEQ_CST);
        if (e == l->epoch)
            return;
        /* The first update since a reset. The slot's `seen` may date from
         * before it, when the others held more: flushing refreshes it, so
         * the estimates that follow stay within the bound of the values
         * since the reset. */
        flush(g, l);
        __atomic_store_n(&l->lpeak, l->seen, __ATOMIC_RELAXED);
        /* A query that sees the new epoch sees this peak too. */
        __atomic_store_n(&l->epoch, e, __ATOMIC_RELEASE);
    }
}

void rk_tpeak_add_shared(rk_tpeak_t *g, size_t d)
{
    __atomic_add_fetch(&g->spill, d, __ATOMIC_RELAXED);
    raise_peak(&g->peak, __atomic_add_fetch(&g->flushed, d, __ATOMIC_RELAXED));
}

static inline rk_tpeak_local_t *local_at(rk_tslot_t *t, size_t off)
{
    return (rk_tpeak_local_t *)((char *)rk_tslot_payload(t) + off);
}

size_t rk_tpeak_current(const rk_tpeak_t *g, const rk_tslot_set_t *set, size_t off)
{
    size_t sum = __atomic_load_n(&g->spill, __ATOMIC_RELAXED);
    for (rk_tslot_t *t = rk_tslot_first(set); t; t = t->next)
        sum += __atomic_load_n(&local_at(t, off)->cur, __ATOMIC_RELAXED);
    return sum;
}

size_t rk_tpeak_peak(rk_tpeak_t *g, const rk_tslot_set_t *set, size_t off)
{
    unsigned e = __atomic_load_n(&g->epoch, __ATOMIC_ACQUIRE);
    size_t peak = __atomic_load_n(&g->peak, __ATOMIC_RELAXED);
    size_t sum = __atomic_load_n(&g->spill, __ATOMIC_RELAXED);
    for (rk_tslot_t *t = rk_tslot_first(set); t; t = t->next) {
        rk_tpeak_local_t *l = local_at(t, off);
        sum += __atomic_load_n(&l->cur, __ATOMIC_RELAXED);
        if (__atomic_load_n(&l->epoch, __ATOMIC_ACQUIRE) == e) {
            peak = max_signed(peak, __atomic_load_n(&l->lpeak, __ATOMIC_RELAXED));
        }
    }
    /* Not recorded into the shared peak: read while threads run, the sum
     * may be a value that never was (one slot read before a transfer to
     * another thread, that one after), and would then stay. */
    return max_signed(peak, sum);
}

size_t rk_tpeak_reset(rk_tpeak_t *g, const rk_tslot_set_t *set, size_t off,
                      rk_tpeak_local_t *self)
{
    if (self)
        flush(g, self);
    unsigned e = __atomic_load_n(&g->epoch, __ATOMIC_RELAXED) + 1;
    if (e == 0) /* 0 is where new slots start */
        e = 1;
    __atomic_store_n(&g->epoch, e, __ATOMIC_SEQ_CST);
    if (self) { /* its next increase needs no rebase */
        __atomic_store_n(&self->lpeak, self->seen, __ATOMIC_RELAXED);
        __atomic_store_n(&self->epoch, e, __ATOMIC_RELEASE);
        /* Its base moved: its next decrease sets the bounds again (and its
         * next increase, below). */
        self->lo = (ptrdiff_t)self->cur;
    }
    /* Every slot's next increase takes the slow path, which sees the new
     * epoch (set_bounds says why this is enough). */
    for (rk_tslot_t *t = rk_tslot_first(set); t; t = t->next)
        __atomic_store_n(&local_at(t, off)->hi, PTRDIFF_MIN, __ATOMIC_SEQ_CST);
    size_t cur = rk_tpeak_current(g, set, off);
    /* Flushed may exceed the current by what the others have freed and not
     * flushed (within the bound): keeping it makes every later true value
     * less than the peak plus the bound. */
    size_t f = __atomic_load_n(&g->flushed, __ATOMIC_RELAXED);
    __atomic_store_n(&g->peak, max_signed(max_signed(f, cur), 0), __ATOMIC_RELAXED);
    return cur;
}

void rk_tpeak_raise(rk_tpeak_t *g, size_t v) { raise_peak(&g->peak, v); }
