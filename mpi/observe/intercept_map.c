/* The served-block map and the serving decision of mpi/observe/intercept.c (see
 * intercept_map.h). Pure C: no CUDA, no MPI. */
#define _GNU_SOURCE
#include "intercept_map.h"

#include <sched.h>
#include <stdlib.h>

#define KEY_EMPTY ((uintptr_t)0)
#define KEY_DELETED ((uintptr_t)1)
#define FIRST_CAP 64

/* Served pointers are 256-aligned: their low bits carry nothing. */
static inline uint64_t hash_ptr(uintptr_t p)
{
    uint64_t h = (uint64_t)(p >> 8) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static inline rk_smap_shard_t *shard_of(rk_smap_t *m, uint64_t h)
{
    return &m->shard[h >> 58]; /* the top 6 bits: RK_SMAP_SHARDS == 64 */
}

_Static_assert(RK_SMAP_SHARDS == 64, "shard_of takes the hash's top 6 bits");

static inline void lock(rk_smap_shard_t *s)
{
    /* Held for a few probes: spin, but yield when a holder was preempted. */
    for (unsigned spins = 0;; spins++) {
        if (!__atomic_load_n(&s->lock, __ATOMIC_RELAXED) &&
            !__atomic_exchange_n(&s->lock, 1, __ATOMIC_ACQUIRE))
            return;
        if (spins > 64)
            sched_yield();
#if defined(__x86_64__) || defined(__i386__)
        else
            __builtin_ia32_pause();
#endif
    }
}

static inline void unlock(rk_smap_shard_t *s) { __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE); }

/* The slot holding key, or NULL. Shard locked. */
static rk_smap_entry_t *lookup(rk_smap_shard_t *s, uintptr_t key, uint64_t h)
{
    if (!s->cap)
        return NULL;
    size_t mask = s->cap - 1;
    for (size_t i = (size_t)h & mask, n = 0; n < s->cap; i = (i + 1) & mask, n++) {
        rk_smap_entry_t *e = &s->slots[i];
        if (e->key == key)
            return e;
        if (e->key == KEY_EMPTY)
            return NULL;
    }
    return NULL;
}

/* Rehash into a table of cap slots (drops tombstones). 0 or -1. Shard locked. */
static int rehash(rk_smap_shard_t *s, size_t cap)
{
    rk_smap_entry_t *t = calloc(cap, sizeof *t);
    if (!t)
        return -1;
    size_t mask = cap - 1;
    for (size_t i = 0; i < s->cap; i++) {
        uintptr_t k = s->slots[i].key;
        if (k == KEY_EMPTY || k == KEY_DELETED)
            continue;
        size_t j = (size_t)hash_ptr(k) & mask;
        while (t[j].key != KEY_EMPTY)
            j = (j + 1) & mask;
        t[j] = s->slots[i];
    }
    free(s->slots);
    s->slots = t;
    s->cap = cap;
    s->deleted = 0;
    return 0;
}

int rk_smap_insert(rk_smap_t *m, uintptr_t ptr, size_t bytes)
{
    if (ptr == KEY_EMPTY || ptr == KEY_DELETED)
        return -2;
    uint64_t h = hash_ptr(ptr);
    rk_smap_shard_t *s = shard_of(m, h);
    lock(s);
    if (lookup(s, ptr, h)) {
        unlock(s);
        return -2;
    }
    /* At most 3/4 full, tombstones included, so that probes stay short and
     * always end on an empty slot. */
    if ((s->used + s->deleted + 1) * 4 > s->cap * 3) {
        size_t cap = s->cap ? s->cap : FIRST_CAP;
        while ((s->used + 1) * 2 > cap) /* after the rehash: at most half full */
            cap *= 2;
        if (rehash(s, cap) != 0) {
            unlock(s);
            return -1;
        }
    }
    size_t mask = s->cap - 1;
    size_t i = (size_t)h & mask;
    while (s->slots[i].key != KEY_EMPTY && s->slots[i].key != KEY_DELETED)
        i = (i + 1) & mask;
    if (s->slots[i].key == KEY_DELETED)
        s->deleted--;
    s->slots[i].key = ptr;
    s->slots[i].bytes = bytes;
    s->used++;
    unlock(s);
    __atomic_fetch_add(&m->live, 1, __ATOMIC_RELAXED);
    return 0;
}

/* ptr's entry with its shard locked, or NULL with nothing locked. */
static rk_smap_entry_t *lock_entry(rk_smap_t *m, uintptr_t ptr, rk_smap_shard_t **s_p)
{
    if (ptr == KEY_EMPTY || ptr == KEY_DELETED)
        return NULL;
    uint64_t h = hash_ptr(ptr);
    rk_smap_shard_t *s = shard_of(m, h);
    lock(s);
    rk_smap_entry_t *e = lookup(s, ptr, h);
    if (!e)
        unlock(s);
    *s_p = s;
    return e;
}

int rk_smap_remove(rk_smap_t *m, uintptr_t ptr, size_t *bytes_p)
{
    rk_smap_shard_t *s;
    rk_smap_entry_t *e = lock_entry(m, ptr, &s);
    if (!e)
        return 0;
    if (bytes_p)
        *bytes_p = e->bytes;
    /* A tombstone, unless the next slot is empty: then no probe runs past
     * this one and it may be empty too. */
    size_t i = (size_t)(e - s->slots);
    if (s->slots[(i + 1) & (s->cap - 1)].key == KEY_EMPTY) {
        e->key = KEY_EMPTY;
    } else {
        e->key = KEY_DELETED;
        s->deleted++;
    }
    s->used--;
    unlock(s);
    __atomic_fetch_sub(&m->live, 1, __ATOMIC_RELAXED);
    return 1;
}

int rk_smap_find(rk_smap_t *m, uintptr_t ptr, size_t *bytes_p)
{
    rk_smap_shard_t *s;
    rk_smap_entry_t *e = lock_entry(m, ptr, &s);
    if (!e)
        return 0;
    if (bytes_p)
        *bytes_p = e->bytes;
    unlock(s);
    return 1;
}

size_t rk_smap_count(const rk_smap_t *m) { return __atomic_load_n(&m->live, __ATOMIC_RELAXED); }

void rk_smap_clear(rk_smap_t *m)
{
    for (int k = 0; k < RK_SMAP_SHARDS; k++) {
        rk_smap_shard_t *s = &m->shard[k];
        lock(s);
        size_t n = s->used;
        free(s->slots);
        s->slots = NULL;
        s->cap = s->used = s->deleted = 0;
        unlock(s);
        __atomic_fetch_sub(&m->live, n, __ATOMIC_RELAXED);
    }
}

/* ---- the decision ---- */

rk_icpt_route_t rk_icpt_route(const rk_icpt_ctx_t *c)
{
    if (!c->mode_cuda)
        return RK_ICPT_FWD_OFF;
    if (!c->active)
        return RK_ICPT_FWD_INACTIVE;
    if (c->internal_depth > 0)
        return RK_ICPT_FWD_INTERNAL;
    if (c->caller_is_rankmem)
        return RK_ICPT_FWD_OURS;
    if (!c->args_ok)
        return RK_ICPT_FWD_BAD_ARGS;
    if (!c->have_resource || c->rank_device < 0)
        return RK_ICPT_FWD_NO_RESOURCE;
    int cur = c->current_device ? c->current_device(c->arg) : -1;
    if (cur < 0 || cur != c->rank_device)
        return RK_ICPT_FWD_OTHER_DEVICE;
    return RK_ICPT_SERVE;
}

const char *rk_icpt_route_name(int route)
{
    static const char *const names[RK_ICPT_NREASONS] = {
        [RK_ICPT_SERVE] = "served",
        [RK_ICPT_FWD_OFF] = "RANKMEM_INTERCEPT=none",
        [RK_ICPT_FWD_INACTIVE] = "outside MPI_Init..MPI_Finalize",
        [RK_ICPT_FWD_INTERNAL] = "rankmem's own allocation",
        [RK_ICPT_FWD_OURS] = "called from librankmem",
        [RK_ICPT_FWD_BAD_ARGS] = "NULL pointer or size 0",
        [RK_ICPT_FWD_NO_RESOURCE] = "no device resource",
        [RK_ICPT_FWD_OTHER_DEVICE] = "another device is current",
    };
    return route >= 0 && route < RK_ICPT_NREASONS ? names[route] : "?";
}
