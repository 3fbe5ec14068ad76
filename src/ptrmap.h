/* ptrmap: an open-addressing hash map from pointer to pointer, for looking up
 * the block behind a pointer on free (device memory has no room for headers).
 * Linear probing with backward-shift deletion: no tombstones, so lookups stay
 * short however many inserts and removes have run. Not thread-safe: callers
 * hold their own lock. */
#ifndef RANKMEM_PTRMAP_H
#define RANKMEM_PTRMAP_H

#include "internal.h"

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
/* key must not be NULL nor already present. Grows at 1/2 load. */
RK_HIDDEN rankmem_status_t rk_ptrmap_insert(rk_ptrmap_t *m, const void *key, void *value);
/* Removes key and returns its value, or NULL if absent. */
RK_HIDDEN void *rk_ptrmap_remove(rk_ptrmap_t *m, const void *key);
/* Value of key, or NULL if absent. */
RK_HIDDEN void *rk_ptrmap_get(const rk_ptrmap_t *m, const void *key);
/* Slot of key, or SIZE_MAX if absent; rk_ptrmap_remove_at then removes it
 * without probing again (deallocate looks up, checks, then removes). */
RK_HIDDEN size_t rk_ptrmap_find(const rk_ptrmap_t *m, const void *key);
RK_HIDDEN void rk_ptrmap_remove_at(rk_ptrmap_t *m, size_t slot);
/* Calls fn for every entry (the map must not change meanwhile). */
RK_HIDDEN void rk_ptrmap_each(const rk_ptrmap_t *m, void (*fn)(const void *key, void *value,
                                                                void *arg),
                              void *arg);

#endif
