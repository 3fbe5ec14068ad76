/* ptrmap: see ptrmap.h. */
#include "ptrmap.h"

#include <stdlib.h>

static inline size_t slot_of(const rk_ptrmap_t *m, const void *key)
{
    /* Allocations are at least 256-byte aligned: drop the zero bits, then a
     * Fibonacci multiply spreads neighbouring blocks over the table. */
    uint64_t k = (uint64_t)(uintptr_t)key >> 8;
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17) & m->mask;
}

rankmem_status_t rk_ptrmap_init(rk_ptrmap_t *m, size_t capacity_hint)
{
    size_t cap = 64;
    while (cap < capacity_hint * 2)
        cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "ptrmap: cannot allocate %zu slots", cap);
    m->mask = cap - 1;
    m->count = 0;
    return RANKMEM_SUCCESS;
}

void rk_ptrmap_fini(rk_ptrmap_t *m)
{
    free(m->slots);
    m->slots = NULL;
    m->mask = 0;
    m->count = 0;
}

static void put(rk_ptrmap_t *m, const void *key, void *value)
{
    size_t i = slot_of(m, key);
    while (m->slots[i].key)
        i = (i + 1) & m->mask;
    m->slots[i].key = key;
    m->slots[i].value = value;
}

static rankmem_status_t grow(rk_ptrmap_t *m)
{
    rk_ptrmap_t bigger = {0};
    size_t cap = (m->mask + 1) * 2;
    bigger.slots = calloc(cap, sizeof *bigger.slots);
    if (!bigger.slots)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "ptrmap: cannot grow to %zu slots", cap);
    bigger.mask = cap - 1;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key)
            put(&bigger, m->slots[i].key, m->slots[i].value);
    bigger.count = m->count;
    free(m->slots);
    *m = bigger;
    return RANKMEM_SUCCESS;
}

rankmem_status_t rk_ptrmap_insert(rk_ptrmap_t *m, const void *key, void *value)
{
    if (RK_UNLIKELY((m->count + 1) * 2 > m->mask + 1)) {
        rankmem_status_t st = grow(m);
        if (st != RANKMEM_SUCCESS)
            return st;
    }
    put(m, key, value);
    m->count++;
    return RANKMEM_SUCCESS;
}

size_t rk_ptrmap_find(const rk_ptrmap_t *m, const void *key)
{
    for (size_t i = slot_of(m, key);; i = (i + 1) & m->mask) {
        if (m->slots[i].key == key)
            return i;
        if (!m->slots[i].key)
            return SIZE_MAX;
    }
}

void rk_ptrmap_remove_at(rk_ptrmap_t *m, size_t i)
{
    /* Backward shift: pull later entries of the probe run into the hole when
     * their home slot is not between the hole and their position. */
    size_t hole = i;
    for (size_t j = (i + 1) & m->mask; m->slots[j].key; j = (j + 1) & m->mask) {
        size_t home = slot_of(m, m->slots[j].key);
        if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].key = NULL;
    m->slots[hole].value = NULL;
    m->count--;
}

void *rk_ptrmap_remove(rk_ptrmap_t *m, const void *key)
{
    size_t i = rk_ptrmap_find(m, key);
    if (i == SIZE_MAX)
        return NULL;
    void *value = m->slots[i].value;
    rk_ptrmap_remove_at(m, i);
    return value;
}

void *rk_ptrmap_get(const rk_ptrmap_t *m, const void *key)
{
    size_t i = rk_ptrmap_find(m, key);
    return i == SIZE_MAX ? NULL : m->slots[i].value;
}

void rk_ptrmap_each(const rk_ptrmap_t *m, void (*fn)(const void *key, void *value, void *arg),
                    void *arg)
{
    for (size_t i = 0; m->slots && i <= m->mask; i++)
        if (m->slots[i].key)
            fn(m->slots[i].key, m->slots[i].value, arg);
}
