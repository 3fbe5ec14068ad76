/* direct: the resources that call one runtime allocation and its free,
 * nothing in between (cuda, managed, pinned), share one skeleton
 * (internal). A resource of a kind is the bare header: its ops table lives
 * in the kind, which the shared functions find from mr->ops. */
#ifndef RANKMEM_DIRECT_H
#define RANKMEM_DIRECT_H

#include "internal.h"

#include <stddef.h>

typedef struct rk_direct_kind {
    rankmem_resource_ops_t ops; /* RK_DIRECT_OPS(name) */
    const char *alloc_call;     /* "cudaMalloc": for messages */
    const char *free_call;
    size_t alignment; /* what alloc_call guarantees; larger ones are refused */
    unsigned props;
    int same_device; /* alloc_call allocates on the current device: refuse another one */
    /* cudaError_t of the calls (int: this header needs no runtime header);
     * NULL in a build without CUDA. */
    int (*alloc)(void **ptr_p, size_t bytes);
    int (*release)(void *ptr);
    /* Optional, at creation: what the current device cannot do. */
    rankmem_status_t (*check)(const char *fn);
} rk_direct_kind_t;

RK_HIDDEN rankmem_status_t rk_direct_allocate(rankmem_resource_t *mr, size_t bytes,
                                              size_t alignment, rankmem_stream_t stream,
                                              void **ptr_p);
RK_HIDDEN rankmem_status_t rk_direct_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                                size_t alignment, rankmem_stream_t stream);
RK_HIDDEN rankmem_status_t rk_direct_finalize(rankmem_resource_t *mr);

#define RK_DIRECT_OPS(nm)                                                                       \
    {                                                                                           \
        .size = sizeof(rankmem_resource_ops_t), .name = (nm), .allocate = rk_direct_allocate,   \
        .deallocate = rk_direct_deallocate, .finalize = rk_direct_finalize,                     \
    }

/* rankmem_<name>_create: checks mr_p, that there is a GPU (and k->check),
 * then makes the resource; NOT_SUPPORTED in a build without CUDA. */
RK_HIDDEN rankmem_status_t rk_direct_create(const rk_direct_kind_t *k,
                                            rankmem_resource_t **mr_p);

#endif
