/* Memory spaces, the predefined allocators, and the table of allocator
 * objects behind every handle of ours (the encoding is described in
 * omp_internal.h and docs/openmp.md). */
#include "omp_internal.h"

#include <pthread.h>
#include <stdio.h>

rkomp_space_obj_t rkomp_spaces[RKOMP_SPACE_COUNT] = {
    {.kind = RKOMP_SPACE_DEVICE}, {.kind = RKOMP_SPACE_MANAGED}, {.kind = RKOMP_SPACE_PINNED}};

/* Slots 0..2 are the predefined allocators: live from the start, never
 * destroyed. Their fallback is null_fb: a device allocator that silently
 * returned host memory would turn an out-of-memory into a crash in a
 * kernel. The rest of the table is .bss: untouched pages cost nothing. */
#define RKOMP_PREDEFINED(space_)                                                           \
    {                                                                                      \
        .a = {.state = RKOMP_STATE_LIVE, .space = (space_), .fallback = RKOMP_ATV_NULL_FB, \
              .alignment = 1, .sync_hint = RKOMP_ATV_CONTENDED, .access = RKOMP_ATV_ALL,   \
              .pinned = RKOMP_ATV_FALSE, .partition = RKOMP_ATV_ENVIRONMENT, .ent = -1 }   \
    }
rkomp_slot_t rkomp_slots[RKOMP_MAX_ALLOCATORS] = {RKOMP_PREDEFINED(RKOMP_SPACE_DEVICE),
                                                  RKOMP_PREDEFINED(RKOMP_SPACE_MANAGED),
                                                  RKOMP_PREDEFINED(RKOMP_SPACE_PINNED)};

/* The public handles (declared in rankmem_omp.h with omp.h's types, which
 * are uintptr_t-sized in every runtime). Address constants: no start-up code. */
RKOMP_EXPORT const uintptr_t rankmem_omp_device_mem_space = (uintptr_t)&rkomp_spaces[0] + 1;
RKOMP_EXPORT const uintptr_t rankmem_omp_managed_mem_space = (uintptr_t)&rkomp_spaces[1] + 1;
RKOMP_EXPORT const uintptr_t rankmem_omp_pinned_mem_space = (uintptr_t)&rkomp_spaces[2] + 1;
RKOMP_EXPORT const uintptr_t rankmem_omp_device_mem_alloc = (uintptr_t)&rkomp_slots[0] + 1;
RKOMP_EXPORT const uintptr_t rankmem_omp_managed_mem_alloc = (uintptr_t)&rkomp_slots[1] + 1;
RKOMP_EXPORT const uintptr_t rankmem_omp_pinned_mem_alloc = (uintptr_t)&rkomp_slots[2] + 1;

/* Slot table. Never-used slots are handed out first (bump), then freed ones
 * in FIFO order, so a destroyed handle's slot is reused as late as possible
 * and its generation check keeps catching stale handles. */
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned slot_bump = RKOMP_NPREDEFINED;
#define RKOMP_NO_SLOT 0xffffffffu
static unsigned free_head = RKOMP_NO_SLOT, free_tail = RKOMP_NO_SLOT;

rkomp_allocator_t *rkomp_slot_get(void)
{
    rkomp_allocator_t *a = NULL;
    pthread_mutex_lock(&slot_lock);
    if (slot_bump < RKOMP_MAX_ALLOCATORS) {
        a = &rkomp_slots[slot_bump++].a;
    } else if (free_head != RKOMP_NO_SLOT) {
        a = &rkomp_slots[free_head].a;
        free_head = a->next_free;
        if (free_head == RKOMP_NO_SLOT)
            free_tail = RKOMP_NO_SLOT;
    }
    pthread_mutex_unlock(&slot_lock);
    return a;
}

void rkomp_slot_put(rkomp_allocator_t *a)
{
    unsigned idx = (unsigned)((rkomp_slot_t *)a - rkomp_slots);
    if (idx < RKOMP_NPREDEFINED || idx >= RKOMP_MAX_ALLOCATORS)
        return;
    pthread_mutex_lock(&slot_lock);
    a->gen++;
    a->chain = NULL;
    a->ent = -1;
    a->foreign = 0;
    a->next_free = RKOMP_NO_SLOT;
    __atomic_store_n(&a->state, RKOMP_STATE_FREE, __ATOMIC_RELEASE);
    if (free_tail == RKOMP_NO_SLOT)
        free_head = idx;
    else
        rkomp_slots[free_tail].a.next_free = idx;
    free_tail = idx;
    pthread_mutex_unlock(&slot_lock);
}

/* One shared managed and one shared pinned resource, made on first use and
 * kept for the life of the process (blocks may be freed from other
 * libraries' destructors; static pointers keep leak checkers quiet). With no
 * GPU (or no CUDA) each is a host resource, so that programs and tests run
 * unchanged on a machine without one. */
static pthread_once_t shared_once[RKOMP_SPACE_COUNT] = {PTHREAD_ONCE_INIT, PTHREAD_ONCE_INIT,
                                                        PTHREAD_ONCE_INIT};
static rankmem_resource_t *shared_mr[RKOMP_SPACE_COUNT];
static rankmem_status_t shared_status[RKOMP_SPACE_COUNT];

static void make_shared(int space)
{
    rankmem_resource_t *mr = NULL;
    int ngpu = 0;
    rankmem_status_t st = rankmem_device_count(&ngpu);
    if (st == RANKMEM_SUCCESS && ngpu > 0)
        st = space == RKOMP_SPACE_MANAGED ? rankmem_managed_create(&mr)
                                          : rankmem_pinned_create(&mr);
    else
        st = rankmem_system_create(&mr);
    shared_status[space] = st;
    if (st == RANKMEM_SUCCESS)
        shared_mr[space] = mr;
}
static void make_managed(void) { make_shared(RKOMP_SPACE_MANAGED); }
static void make_pinned(void) { make_shared(RKOMP_SPACE_PINNED); }

int rkomp_ngpu = -1;

int rkomp_gpu_count_slow(void)
{
    int v; /* racy but idempotent: every thread computes the same */
    if (rankmem_device_count(&v) != RANKMEM_SUCCESS)
        v = 0;
    __atomic_store_n(&rkomp_ngpu, v, __ATOMIC_RELAXED);
    return v;
}

rankmem_resource_t *rkomp_shared_resource(int space)
{
    if (space == RKOMP_SPACE_MANAGED)
        pthread_once(&shared_once[space], make_managed);
    else if (space == RKOMP_SPACE_PINNED)
        pthread_once(&shared_once[space], make_pinned);
    else
        return NULL;
    return shared_status[space] == RANKMEM_SUCCESS ? shared_mr[space] : NULL;
}

rankmem_status_t rkomp_space_resource(int space, rankmem_resource_t **mr_p)
{
    if (space == RKOMP_SPACE_DEVICE) {
        int d;
        return rkomp_device_resource(mr_p, &d);
    }
    if (space != RKOMP_SPACE_MANAGED && space != RKOMP_SPACE_PINNED)
        return RANKMEM_ERR_INVALID_ARGUMENT;
    if (!rkomp_shared_resource(space))
        return shared_status[space];
    *mr_p = shared_mr[space];
    return RANKMEM_SUCCESS;
}
