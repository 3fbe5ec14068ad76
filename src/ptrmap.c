/* ptrmap: see ptrmap.h (the hot operations are inline there). */
#include "ptrmap.h"

#include <stdlib.h>

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

rankmem_status_t rk_ptrmap_grow(rk_ptrmap_t *m)
{
    rk_ptrmap_t bigger = {0};
    size_t cap = (m->mask + 1) * 2;
    bigger.slots = calloc(cap, sizeof *bigger.slots);
    if (!bigger.slots)
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "ptrmap: cannot grow to %zu slots", cap);
    bigger.mask = cap - 1;
    for (size_t i = 0; i <= m->mask; i++)
        if (m->slots[i].key)
            rk_ptrmap_put(&bigger, m->slots[i].key, m->slots[i].value);
    bigger.count = m->count;
    free(m->slots);
    *m = bigger;
    return RANKMEM_SUCCESS;
}

void rk_ptrmap_each(const rk_ptrmap_t *m, void (*fn)(const void *key, void *value, void *arg),
                    void *arg)
{
    for (size_t i = 0; m->slots && i <= m->mask; i++)
        if (m->slots[i].key)
            fn(m->slots[i].key, m->slots[i].value, arg);
}
