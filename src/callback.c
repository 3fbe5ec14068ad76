/* callback: a resource made of two user functions and their argument. */
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

typedef struct {
    rankmem_resource_t base;
    rankmem_alloc_fn alloc_fn;
    rankmem_free_fn free_fn;
    void *arg;
} callback_resource_t;

static rankmem_status_t callback_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                          rankmem_stream_t stream, void **ptr_p)
{
    callback_resource_t *cb = (callback_resource_t *)mr;
    void *p = NULL;
    rankmem_status_t st = cb->alloc_fn(cb->arg, bytes, alignment, stream, &p);
    if (st != RANKMEM_SUCCESS)
        return st;
    /* A user function that claims success must still hand back usable memory. */
    if (!p || ((uintptr_t)p & (alignment - 1))) {
        if (p)
            cb->free_fn(cb->arg, p, bytes, alignment, stream);
        return rk_error(RANKMEM_ERR_INTERNAL,
                        "callback: allocate function returned %p for %zu bytes (alignment %zu)",
                        p, bytes, alignment);
    }
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t callback_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                            size_t alignment, rankmem_stream_t stream)
{
    callback_resource_t *cb = (callback_resource_t *)mr;
    return cb->free_fn(cb->arg, ptr, bytes, alignment, stream);
}

static int callback_is_equal(const rankmem_resource_t *a, const rankmem_resource_t *b)
{
    const callback_resource_t *x = (const callback_resource_t *)a;
    const callback_resource_t *y = (const callback_resource_t *)b;
    return x->alloc_fn == y->alloc_fn && x->free_fn == y->free_fn && x->arg == y->arg;
}

static rankmem_status_t callback_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t callback_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "callback",
    .allocate = callback_allocate,
    .deallocate = callback_deallocate,
    .is_equal = callback_is_equal,
    .finalize = callback_finalize,
};

rankmem_status_t rankmem_callback_create(rankmem_alloc_fn alloc_fn, rankmem_free_fn free_fn,
                                         void *arg, unsigned props, rankmem_resource_t **mr_p)
{
    if (!alloc_fn || !free_fn || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_callback_create: NULL %s",
                        !alloc_fn ? "allocate function" : !free_fn ? "free function" : "output");
    const unsigned known = RANKMEM_PROP_DEVICE_ACCESSIBLE | RANKMEM_PROP_HOST_ACCESSIBLE |
                           RANKMEM_PROP_STREAM_ORDERED;
    if (props & ~known)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT,
                        "rankmem_callback_create: unknown property bits 0x%x", props & ~known);
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(callback_resource_t), &callback_ops, props,
                                          NULL, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    callback_resource_t *cb = (callback_resource_t *)mr;
    cb->alloc_fn = alloc_fn;
    cb->free_fn = free_fn;
    cb->arg = arg;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
