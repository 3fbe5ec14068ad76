/* ptrmap: an open-addressing hash map from pointer to pointer, for looking up
 * the block behind a pointer on free (device memory has no room for headers).
 * Linear probing with backward-shift deletion: no tombstones, so lookups stay
 * short however many inserts and removes have run. Not thread-safe: callers
 * hold their own lock. Lookups, inserts and removals are inline: they are
 * on every suballocator's hot path. */
#ifndef RANKMEM_PTRMAP_H
#define RANKMEM_PTRMAP_H

#include "internal.h"

#include <stdint.h>

typedef struct rk_ptrmap_entry {
    const void *key; /* NULL = empty slot */
    void *value;
} rk_ptrmap_entry_t;

typedef struct rk_ptrmap {
    rk_ptrmap_entry_t *slots;
    size_t mask;  /* capacity - 1 (capacity a power of two) */
    size_t count;
} rk_ptrmap_t;

RK_HIDDEN rankmem_status_t rk_ptrmap_init(rk_ptrmap_t *m, size_t capacity_hint);
RK_HIDDEN void rk_ptrmap_fini(rk_ptrmap_t *m);
/* Twice the slots (rk_ptrmap_insert calls it at 1/2 load). */
RK_HIDDEN rankmem_status_t rk_ptrmap_grow(rk_ptrmap_t *m);
/* Calls fn for every entry (the map must not change meanwhile). */
RK_HIDDEN void rk_ptrmap_each(const rk_ptrmap_t *m, void (*fn)(const void *key, void *value,
                                                                void *arg),
                              void *arg);

static inline size_t rk_ptrmap_home(const rk_ptrmap_t *m, const void *key)
{
    /* Allocations are at least 256-byte aligned: drop the zero bits, then a
     * Fibonacci multiply spreads neighbouring blocks over the table. */
    uint64_t k = (uint64_t)(uintptr_t)key >> 8;
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17) & m->mask;
}

/* key must not be NULL nor already present. */
static inline void rk_ptrmap_put(rk_ptrmap_t *m, const void *key, void *value)
{
    size_t i = rk_ptrmap_home(m, key);
    while (m->slots[i].key)
        i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].value = value;
}

/* key must not be NULL nor already present. Grows at 1/2 load. */
static inline rankmem_status_t rk_ptrmap_insert(rk_ptrmap_t *m, const void *key, void *value)
{
    if (RK_UNLIKELY((m->count + 1) * 2 > m->mask + 1)) {
        rankmem_status_t st = rk_ptrmap_grow(m);
        if (st != RANKMEM_SUCCESS)
            return st;
    }
    rk_ptrmap_put(m, key, value);
    m->count++;
    return RANKMEM_SUCCESS;
}

/* Slot of key, or SIZE_MAX if absent; rk_ptrmap_remove_at then removes it
 * without probing again (deallocate looks up, checks, then removes). */
static inline size_t rk_ptrmap_find(const rk_ptrmap_t *m, const void *key)
{
    for (size_t i = rk_ptrmap_home(m, key);; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key)
            return i;
        if (!m->slots[i].key)
            return SIZE_MAX;
    }
}

static inline void rk_ptrmap_remove_at(rk_ptrmap_t *m, size_t i)
{
    /* Backward shift: pull later entries of the probe run into the hole when
     * their home slot is not between the hole and their position. */
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        size_t home = rk_ptrmap_home(m, m->slots[j].key);
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = NULL;
    m->slots[hole].value = NULL;
    m->count--;
}

/* Removes key and returns its value, or NULL if absent. */
static inline void *rk_ptrmap_remove(rk_ptrmap_t *m, const void *key)
{
    size_t i = rk_ptrmap_find(m, key);
    if (i == SIZE_MAX)
        return NULL;
    void *value = m->slots[i].value;
    rk_ptrmap_remove_at(m, i);
    return value;
}

/* Value of key, or NULL if absent. */
static inline void *rk_ptrmap_get(const rk_ptrmap_t *m, const void *key)
{
    size_t i = rk_ptrmap_find(m, key);
    return i == SIZE_MAX ? NULL : m->slots[i].value;
}

#endif
