/* threadsafe: one lock around an upstream that is not thread-safe, such as a
 * user's callback resource (RMM's thread_safe_resource_adaptor).
 *
 * Everything that reaches the upstream through this adaptor (allocate,
 * deallocate, query, trim) runs under the lock. An ordinary mutex, not a
 * spinning one: the upstream may take long (a cudaMalloc behind a user
 * function), and waiters should sleep meanwhile. */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    rankmem_resource_t base;
    pthread_mutex_t lock;
} threadsafe_t;

static rankmem_status_t threadsafe_allocate(rankmem_resource_t *mr, size_t bytes,
                                            size_t alignment, rankmem_stream_t stream,
                                            void **ptr_p)
{
    threadsafe_t *t = (threadsafe_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    pthread_mutex_lock(&t->lock);
    rankmem_status_t st = up->ops->allocate(up, bytes, alignment, stream, ptr_p);
    pthread_mutex_unlock(&t->lock);
    return st;
}

static rankmem_status_t threadsafe_deallocate(rankmem_resource_t *mr, void *ptr, size_t bytes,
                                              size_t alignment, rankmem_stream_t stream)
{
    threadsafe_t *t = (threadsafe_t *)mr;
    rankmem_resource_t *up = mr->upstream;
    pthread_mutex_lock(&t->lock);
    rankmem_status_t st = up->ops->deallocate(up, ptr, bytes, alignment, stream);
    pthread_mutex_unlock(&t->lock);
    return st;
}

static rankmem_status_t threadsafe_query(rankmem_resource_t *mr, rankmem_query_t what,
                                         size_t *value_p)
{
    threadsafe_t *t = (threadsafe_t *)mr;
    pthread_mutex_lock(&t->lock);
    rankmem_status_t st = rankmem_resource_query(mr->upstream, what, value_p);
    pthread_mutex_unlock(&t->lock);
    return st;
}

static rankmem_status_t threadsafe_trim(rankmem_resource_t *mr, size_t keep_bytes)
{
    threadsafe_t *t = (threadsafe_t *)mr;
    pthread_mutex_lock(&t->lock);
    rankmem_status_t st = rankmem_resource_trim(mr->upstream, keep_bytes);
    pthread_mutex_unlock(&t->lock);
    return st;
}

static rankmem_status_t threadsafe_finalize(rankmem_resource_t *mr)
{
    threadsafe_t *t = (threadsafe_t *)mr;
    pthread_mutex_destroy(&t->lock);
    free(t);
    return RANKMEM_SUCCESS;
}

static int threadsafe_describe(const rankmem_resource_t *mr, char *buf, size_t len)
{
    (void)mr;
    return snprintf(buf, len, "threadsafe");
}

static const rankmem_resource_ops_t threadsafe_ops = {
    .size = sizeof(rankmem_resource_ops_t),
    .name = "threadsafe",
    .allocate = threadsafe_allocate,
    .deallocate = threadsafe_deallocate,
    .query = threadsafe_query,
    .trim = threadsafe_trim,
    .finalize = threadsafe_finalize,
    .describe = threadsafe_describe,
};

rankmem_status_t rankmem_threadsafe_create(rankmem_resource_t *upstream,
                                           rankmem_resource_t **mr_p)
{
    if (!upstream || !mr_p)
        return rk_error(RANKMEM_ERR_INVALID_ARGUMENT, "rankmem_threadsafe_create: NULL %s",
                        upstream ? "mr_p" : "upstream");
    rankmem_resource_t *mr;
    rankmem_status_t st = rk_resource_new(sizeof(threadsafe_t), &threadsafe_ops, upstream->props,
                                          upstream, &mr);
    if (st != RANKMEM_SUCCESS)
        return st;
    if (pthread_mutex_init(&((threadsafe_t *)mr)->lock, NULL) != 0) {
        /* Undo by hand, the upstream reference too. */
        free(mr);
        rankmem_resource_release(upstream);
        return rk_error(RANKMEM_ERR_OUT_OF_MEMORY,
                        "rankmem_threadsafe_create: cannot create a lock");
    }
    mr->device = upstream->device;
    *mr_p = mr;
    return RANKMEM_SUCCESS;
}
