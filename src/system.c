/* system: host memory from the C library. Streams are meaningless for it. */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>

static rankmem_status_t system_allocate(rankmem_resource_t *mr, size_t bytes, size_t alignment,
                                        rankmem_stream_t stream, void **ptr_p)
{
    (void)mr;
    (void)stream;
    void *p = NULL;
    int rc = posix_memalign(&p, alignment, bytes);
    if (rc != 0)
        return rk_error(rc == ENOMEM ? RANKMEM_ERR_OUT_OF_MEMORY : RANKMEM_ERR_INVALID_ARGUMENT,
                        "system: posix_memalign(%zu bytes, alignment %zu) failed", bytes,
                        alignment);
    *ptr_p = p;
    return RANKMEM_SUCCESS;
}

static rankmem_status_t system_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                          size_t alignment, rankmem_stream_t stream)
{
    (void)mr;
    (void)bytes;
    (void)alignment;
    (void)stream;
    free(ptr);
    return RANKMEM_SUCCESS;
}

static int system_is_equal(const rankmem_resource_t *a, const rankmem_resource_t *b)
{
    (void)a;
    (void)b;
    return 1; /* every system resource frees what any other allocated */
}

static rankmem_status_t system_finalize(rankmem_resource_t *mr)
{
    free(mr);
    return RANKMEM_SUCCESS;
}

static const rankmem_resource_ops_t system_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "system",
    .allocate = system_allocate,
    .deallocate = system_deallocate,
    .is_equal = system_is_equal,
    .finalize = system_finalize,
};

rankmem_status_t rankmem_system_create(rankmem_resource_t **mr_p)
{
    if (!mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_system_create: NULL output");
    return rk_resource_new(sizeof(rankmem_resource_t), &system_ops,
                           RANKMEM_PROP_HOST_ACCESSIBLE, NULL, mr_p);
}

/* The process-wide host resource has no finalize: it is static and outlives
 * every user, even one that releases it once too often. Same ops otherwise,
 * so it compares equal to any system resource. */
static const rankmem_resource_ops_t host_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "system",
    .allocate = system_allocate,
    .deallocate = system_deallocate,
    .is_equal = system_is_equal,
};

static rankmem_resource_t host_resource = {
    .ops = &host_ops,
    .refcount = 1,
    .device = RANKMEM_DEVICE_HOST,
    .props = RANKMEM_PROP_HOST_ACCESSIBLE,
};

rankmem_resource_t *rk_host_resource(void) { return &host_resource; }
