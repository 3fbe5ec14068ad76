/* aligned: a larger alignment for allocations of threshold bytes or more
 * (RMM's aligned_resource_adaptor).
 *
 * Requests at or above the threshold ask the upstream for
 * max(requested alignment, adaptor alignment); smaller ones go through as
 * they are. Deallocate recomputes the same alignment from bytes and the
 * threshold, so the upstream always sees on free what it saw on allocate.
 *
 * Some upstreams (cuda, managed, async) guarantee only 256 bytes and refuse
 * more with RANKMEM_ERR_NOT_SUPPORTED. Then, like RMM, the adaptor asks for
 * bytes + alignment - 256 and hands out the aligned address inside; a map
 * (under a lock) remembers the start of such padded blocks. The common path
 * (upstream honours the alignment) takes no lock: a count of padded blocks
 * tells deallocate whether the map can hold anything. */
#include "internal.h"
#include "config_internal.h"
#include "ptrmap.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    rankmem_resource_t base;
    size_t alignment, threshold;
    pthread_mutex_t lock; /* guards padded */
    rk_ptrmap_t padded;   /* aligned pointer -> start of the upstream block */
    size_t npadded;       /* atomic: entries in padded */
} aligned_t;

/* The alignment the upstream gets for this request (alignment already >= 256). */
static inline size_t upstream_alignment(const aligned_t *al, size_t bytes, size_t alignment)
{
    return bytes >= al->threshold && al->alignment > alignment ? al->alignment : alignment;
}

/* Over-allocate at the default alignment and align inside. */
static rankmem_status_t allocate_padded(aligned_t *al, size_t bytes, size_t a,
                                        rankmem_stream_t stream, void **ptr_p)
{
    rankmem_resource_t *up = al->base.upstream;
    size_t total = bytes + a - RANKMEM_DEFAULT_ALIGNMENT;
    void *base = NULL;
    rankmem_status_t st =
        up->ops->allocate(up, total, RANKMEM_DEFAULT_ALIGNMENT, stream, &base);
    if (st != RANKMEM_SUCCESS)
        return st;
    void *p = (char *)base + (-(uintptr_t)base & (a - 1));
    pthread_mutex_lock(&al->lock);
    /* The map is made on first use: most chains never need it. */
    st = al->padded.slots ? RANKMEM_SUCCESS : rk_ptrmap_init(&al->padded, 0);
    if (st == RANKMEM_SUCCESS)
        st = rk_ptrmap_insert(&al->padded, p, base);
    if (st == RANKMEM_SUCCESS)
        __atomic_add_fetch(&al->npadded, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&al->lock);
    if (st != RANKMEM_SUCCESS) {
        up->ops->deallocate(up, base, total, RANKMEM_DEFAULT_ALIGNMENT, stream);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "aligned: no host memory to record a padded block of %zu bytes", bytes);
    }
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t aligned_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                         rankmem_stream_t stream, void **ptr_p)
{
    aligned_t *al = (aligned_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    size_t a = upstream_alignment(al, bytes, alignment);
    if (a == alignment) /* below the threshold, or asked for at least as much */
        return up->ops->allocate(up, bytes, a, stream, ptr_p);
    /* Upstreams may round up by the alignment: keep that from overflowing. */
    if (RK_UNLIKELY(a >= SIZE_MAX / 2 || bytes > SIZE_MAX / 2 - a))
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "aligned: allocate of %zu bytes at alignment %zu is too large", bytes, a);
    rankmem_status_t st = up->ops->allocate(up, bytes, a, stream, ptr_p);
    if (st == RANKMEM_ERR_NOT_SUPPORTED)
        st = allocate_padded(al, bytes, a, stream, ptr_p);
    return st;
}

static rankmem_status_t aligned_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                           size_t alignment, rankmem_stream_t stream)
{
    aligned_t *al = (aligned_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    size_t a = upstream_alignment(al, bytes, alignment);
    if (a != alignment && __atomic_load_n(&al->npadded, __ATOMIC_RELAXED)) {
        pthread_mutex_lock(&al->lock);
        void *base = rk_ptrmap_remove(&al->padded, ptr);
        if (base)
            __atomic_sub_fetch(&al->npadded, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(&al->lock);
        if (base) {
            rankmem_status_t st = up->ops->deallocate(up, base, bytes + a - RANKMEM_DEFAULT_ALIGNMENT,
                                                      RANKMEM_DEFAULT_ALIGNMENT, stream);
            if (st != RANKMEM_SUCCESS) { /* not freed: keep it known */
                pthread_mutex_lock(&al->lock);
                if (rk_ptrmap_insert(&al->padded, ptr, base) == RANKMEM_SUCCESS)
                    __atomic_add_fetch(&al->npadded, 1, __ATOMIC_RELAXED);
                pthread_mutex_unlock(&al->lock);
            }
            return st;
        }
    }
    return up->ops->deallocate(up, ptr, bytes, a, stream);
}

static rankmem_status_t aligned_query(rankmem_resource_t *mr, rankmem_query_t what,
                                      size_t *value_p)
{
    return rankmem_resource_query(mr->upstream, what, value_p);
}

static rankmem_status_t aligned_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    return rankmem_resource_trim(mr->upstream, keep_bytes);
}

static rankmem_status_t aligned_finalize(rankmem_resource_t *mr)
{
    aligned_t *al = (aligned_t *)mr;
    /* Padded blocks still live are the caller's leak; the upstream reports
     * it (a pool) or the memory stays with the process (cuda), as without
     * this adaptor. */
    rk_ptrmap_fini(&al->padded);
    pthread_mutex_destroy(&al->lock);
    free(al);
    return RANKMEM_SUCCESS;
}

static int aligned_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    const aligned_t *al = (const aligned_t *)mr;
    char threshold[32];
    rk_format_size(threshold, sizeof threshold, al->threshold);
    /* The alignment in plain bytes: it is read as a number, not a size. */
    return snprintf(buf, len, "aligned(alignment=%zu,threshold=%s)", al->alignment, threshold);
}

static const rankmem_resource_ops_t aligned_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "aligned",
    .allocate = aligned_allocate,
    .deallocate = aligned_deallocate,
    .query = aligned_query,
    .trim = aligned_trim,
    .finalize = aligned_finalize,
    .describe = aligned_describe,
};

rankmem_status_t rankmem_aligned_create(rankmem_resource_t *upstream, size_t alignment,
                                        size_t threshold, rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_aligned_create: NULL %s",
                        upstream ? "mr_p" : "upstream");
    /* Above RANKMEM_MAX_ALIGNMENT every allocation would be refused: say so now. */
    if (!rk_is_pow2(alignment) || alignment < RANKMEM_DEFAULT_ALIGNMENT ||
        alignment > RANKMEM_MAX_ALIGNMENT)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_aligned_create: alignment %zu is not a power of two from %zu "
                        "to %zu (RANKMEM_MAX_ALIGNMENT, 1 GiB)",
                        alignment, RANKMEM_DEFAULT_ALIGNMENT, RANKMEM_MAX_ALIGNMENT);
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(aligned_t), &aligned_ops, upstream->props,
                                          upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    aligned_t *al = (aligned_t *)mr;
    if (pthread_mutex_init(&al->lock, NULL) != 0) {
        /* Undo by hand, the upstream reference too. */
        free(mr);
        rankmem_resource_release(upstream);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY, "rankmem_aligned_create: cannot create a lock");
    }
    mr->device = upstream->device;
    al->alignment = alignment;
    al->threshold = threshold;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
